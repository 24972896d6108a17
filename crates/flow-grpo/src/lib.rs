//! # flow-grpo
//!
//! The FlowGRPO objective as pure functions: model outputs, stored transitions, rewards and
//! log-probs go in; a named record with the value and its diagnostics comes out. No model
//! types (a replay takes model outputs), no IO, generic over the burn backend.
//!
//! * [`compute_advantages`]: per-prompt group centring, std mode `group | batch | none`,
//!   per-component normalisation then weighted combination, required components, clip,
//!   zero-std filtering, the degenerate flag, an optional [`PromptStatTracker`].
//! * [`grpo_clip_loss`]: the clipped objective over a `[samples, trained steps]` log-prob matrix,
//!   per (sample, step), mean-reduced; symmetric or asymmetric [`ClipRange`]; ratio and clip
//!   diagnostics.
//! * [`kl_to_reference`]: flow_grpo's closed form over the means, or the exact Gaussian KL.
//! * [`replay_log_probs`]: stored transitions scored through `sde_math::Kernel::replay`.
//! * [`plan_updates`], [`AnchorRecorder`], [`PolicyAnchor`]: disjoint equal updates,
//!   micro-batches, and the pi_old anchor frozen once before any optimizer step.
//!
//! The rest of the family's objectives, as pure functions beside FlowGRPO's (seed 004 lists
//! where each paper and its released code differ; each module says which it follows):
//!
//! * [`awm_log_likelihood`], [`awm_advantages`] (Advantage Weighted Matching: the
//!   flow-matching loss on clean endpoints as the log-likelihood, into [`grpo_clip_loss`]);
//! * [`nft_loss`], [`nft_optimality`], [`SoftUpdate`] (DiffusionNFT's implicit positive and
//!   negative policies);
//! * [`diffusion_dpo_loss`] (online Diffusion / Flow-DPO on best-worst pairs);
//! * [`dpok_loss`] (DPOK's clamped ratio; [`dpok_loss_per_step`] with per-step advantages);
//! * [`grpo_guard_loss`], [`guard_log_ratio`] (GRPO-Guard's regulated ratio: the drift term
//!   added back and the log-ratio scaled by the transition std);
//! * [`spo_loss`], [`normalised_difference`] (paired finite differences under SPO's trust
//!   region);
//! * [`noised`], [`velocity_target`], [`mean_squared_error`]: the forward process and the
//!   per-sample errors they share.
//!
//! One training round, in order:
//!
//! ```
//! use std::collections::BTreeMap;
//! use burn::backend::Flex;
//! use burn::tensor::Tensor;
//! use flow_grpo::*;
//!
//! # fn main() -> Result<(), FlowGrpoError> {
//! let dev = Default::default();
//! // 2 prompt groups x 2 candidates, scored by one required component
//! let cfg = AdvantageConfig::flow_grpo(StdMode::Group, vec![RewardComponent::required("pickscore", 1.0)])?;
//! let group = |a: f64, b: f64| RewardGroup {
//!     prompt_key: format!("{a}"),
//!     samples: vec![BTreeMap::from([("pickscore".into(), a)]), BTreeMap::from([("pickscore".into(), b)])],
//! };
//! let adv = compute_advantages(&cfg, &[group(0.2, 0.4), group(0.9, 0.5)], None)?;
//! adv.check_no_failures()?;
//!
//! let plan = plan_updates(4, 2, 2)?;
//! // replayed log-probs of the current policy, [samples, trained steps] (here: made up)
//! let replay = Tensor::<Flex, 2>::from_floats([[-1.0, -1.2], [-0.9, -1.1], [-1.3, -1.0], [-1.1, -0.8]], &dev);
//! let mut recorder = AnchorRecorder::new(&plan);
//! for mb in plan.micro_batches() {
//!     recorder.record(mb.clone(), replay.clone().slice([mb.clone(), 0..2]))?;
//! }
//! let anchor = recorder.freeze()?; // before any optimizer step
//! let first = &plan.updates[0];
//! let idx: Vec<usize> = first.samples.clone().collect();
//! let loss = grpo_clip_loss(
//!     replay.slice([first.samples.clone(), 0..2]),
//!     anchor.log_probs::<Flex>(first.samples.clone(), &dev)?,
//!     adv.tensor::<Flex>(&idx, &dev),
//!     ClipRange::symmetric(1e-4)?,
//! )?;
//! assert_eq!(loss.diagnostics.ratio_max, 1.0); // the first update's ratio is exactly 1
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod advantages;
mod awm;
mod dpo;
mod dpok;
mod error;
mod guard;
mod kl;
mod loss;
mod matching;
mod nft;
mod plan;
mod replay;
mod spo;
mod stats;

pub use advantages::{
    AdvantageConfig, Advantages, ComponentStats, GroupOutcome, GroupReport, PromptStatTracker,
    REFERENCE_ADVANTAGE_CLIP, REFERENCE_DEGENERATE_VARIANCE, RewardComponent, RewardGroup,
    StdEstimator, StdMode, compute_advantages,
};
pub use awm::{AwmWeighting, awm_advantages, awm_log_likelihood};
pub use dpo::{DpoDiagnostics, DpoLoss, diffusion_dpo_loss};
pub use dpok::{dpok_loss, dpok_loss_per_step};
pub use error::{ConfigProblem, FlowGrpoError};
pub use guard::{grpo_guard_loss, guard_log_ratio};
pub use kl::{KlForm, KlTerm, kl_to_reference};
pub use loss::{ClipDiagnostics, ClipLoss, ClipRange, grpo_clip_loss};
pub use matching::{mean_squared_error, noised, velocity_target};
pub use nft::{NftDiagnostics, NftLoss, SoftUpdate, nft_loss, nft_optimality};
pub use plan::{
    AnchorRecorder, MicroBatching, PlanWarning, PlannedUpdate, PolicyAnchor, UpdatePlan,
    plan_updates,
};
pub use replay::{LogProbParity, ReplayStep, ReplayedSteps, log_prob_parity, replay_log_probs};
pub use spo::{FDFO_NORMALISATION_EPS, SpoDiagnostics, SpoLoss, normalised_difference, spo_loss};
