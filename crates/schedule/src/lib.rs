//! # schedule
//!
//! The sigma schedule every engine agrees on, and the plan of which denoising steps are
//! stochastic and trained, for RL post-training of flow-matching image generators.
//!
//! Rollout and replay must use the same sigmas and the same trained steps, bit for bit, on every
//! engine and rank, or the policy-gradient ratio is meaningless. This crate is pure data and
//! arithmetic: no tensors, no RNG state, no IO except reading a scheduler config.
//!
//! * [`SchedulePolicy`]: a checkpoint's FlowMatch policy (loaded from its
//!   `scheduler/scheduler_config.json`, or a named preset citing its source), evaluated by
//!   [`SchedulePolicy::sample_sigmas`]`(height, width, steps)` into a [`Schedule`]: validated
//!   `f32` [`Sigmas`] with a trailing 0 and timesteps `T * sigma`. The static shift is applied
//!   exactly once; a dynamic shift derives `mu` through the per-model [`ComputeMu`] override
//!   point ([`LinearMu`], [`Flux2KleinMu`]); [`BaseGrid`] names the grids of the field.
//! * Plans of trained SDE steps, behind the [`SdeStepPlan`] trait: [`ExplicitSteps`],
//!   [`FractionWindow`], [`PerRolloutResample`], MixGRPO's [`SlidingWindow`] and DanceGRPO's
//!   [`RandomSubset`]; [`TrainedStepsConfig`] resolves seed 002's sampling-config keys in their
//!   documented order.
//! * [`validate_plan`] (and [`TrainedStepsConfig::build`]) reject a trainable singular step
//!   (`sigma = 1` under Flow-SDE) on every route, all problems at once, and flag a trained last
//!   step.
//!
//! Determinism of random plans: draws come from PCG-XSL-RR 128/64 (`keyed_rng`) keyed by
//! SplitMix64 over integer keys (rollout id, seed, sample key): integer arithmetic only, so the
//! same on every platform. They are deliberately not numpy's `default_rng` bits.
//!
//! ```
//! use schedule::{PlanQuery, SchedulePolicy, SdeStepPlan, SdeType, TrainedStepsConfig};
//!
//! let policy = SchedulePolicy::qwen_image();
//! let schedule = policy.sample_sigmas(384, 384, 12).unwrap();
//! assert_eq!(schedule.sigmas.as_slice().len(), 13);
//! assert_eq!(*schedule.sigmas.as_slice().last().unwrap(), 0.0);
//!
//! // train 3 of the 12 steps, redrawn per rollout from a pool that excludes step 0
//! let cfg: TrainedStepsConfig = serde_json::from_str(
//!     r#"{"num_inference_steps": 12, "sde_indices": [3, 4, 5], "sde_resample_per_rollout": true,
//!         "num_sde_steps": 3, "sde_pool": [1, 2, 3, 4, 5]}"#,
//! ).unwrap();
//! let (plan, _report) = cfg.build(SdeType::FlowSde, &schedule.sigmas).unwrap();
//! let steps = plan.steps(PlanQuery::rollout(17)).unwrap();
//! assert_eq!(steps.len(), 3);
//! assert!(!steps.contains(0));
//! ```
#![deny(missing_docs)]

mod config;
mod error;
mod grid;
mod plan;
mod policy;
mod rng;
mod shift;
mod sigmas;
mod validate;

pub use config::SchedulerConfig;
pub use error::{ConfigProblem, PlanProblem, ScheduleError, SigmasDefect};
pub use grid::{BaseGrid, Compat};
pub use plan::{
    ConfiguredPlan, EvalFallback, ExplicitSteps, FractionWindow, PerRolloutResample, PlanQuery,
    RandomSubset, Route, RouteSteps, SdeStepPlan, SdeSteps, SlidingWindow, TrainedStepsConfig,
    WindowEnd, WindowStrategy,
};
pub use policy::{SchedulePolicy, UNIPC_INERT_KEYS};
pub use shift::{ComputeMu, Flux2KleinMu, LinearMu, MuInput, Shift, TimeShift};
pub use sigmas::{Schedule, Sigmas};
pub use validate::{PlanReport, PlanWarning, SIGMA_ONE, SdeType, validate_plan};
