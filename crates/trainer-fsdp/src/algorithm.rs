//! The algorithm seam: what the rollout records, what is frozen before the updates, and the
//! per-micro-batch loss with its named metrics, behind one trait. The generic run
//! ([`crate::run::Run`]) calls these hooks and never names an objective.
//!
//! [`FlowGrpo`] is the first implementation: the rollout records SDE transitions with their
//! log-probs, the pi_old anchor is a replay of every trained step under the weights before any
//! optimizer step, and each micro-batch replays its samples through the live policy into
//! flow-grpo's clipped objective.

use std::ops::Range;

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};
use flow_grpo::{
    AnchorRecorder, ClipDiagnostics, ClipRange, PolicyAnchor, SoftUpdate, UpdatePlan, dpok_loss,
    dpok_loss_per_step, grpo_clip_loss, log_prob_parity,
};

use crate::config::AnchorSource;
use crate::error::TrainerError;
use crate::monitor::{Metrics, names};
use crate::rollout::{ReferenceFn, ReplayTerms, StepColumns, pool_map, replay, replay_terms};
use crate::run::TrainContext;
use crate::train::{MicroBatchLoss, UpdateReport, autodiff_replicas};
use crate::value::ValueBaselineSettings;
use crate::world::World;

/// What a rollout records for the updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recording {
    /// The trained SDE steps' transitions (`x_k`, `x_{k+1}`) and the sampler's log-probs, at
    /// the storage precision: what a likelihood-ratio objective replays.
    SdeTransitions,
    /// The same, and every candidate's clean endpoint `x0` (`tracks.endpoint`, at the storage
    /// precision): what an objective on the forward process trains on.
    SdeTransitionsAndEndpoints,
    /// A deterministic rollout (every step runs the solver; `sampling.eta = 0`) and every
    /// candidate's clean endpoint alone: no transition, no log-prob. The configured trained
    /// steps are the objective's training timesteps.
    OdeEndpoints,
}

/// An RL objective the generic run trains with. See the module docs.
pub trait Algorithm<B: AutodiffBackend, W: World<B>>: Sync {
    /// What [`Algorithm::freeze`] keeps for the rollout's updates (e.g. the pi_old anchor).
    type Frozen: Sync;
    /// One micro-batch's diagnostics, combined over the rollout's updates by
    /// [`Algorithm::rollout_metrics`].
    type Diagnostics: Send;

    /// The algorithm's name, for messages and the run banner.
    fn name(&self) -> &'static str;

    /// What the rollout records.
    fn recording(&self) -> Recording;

    /// What in the config asks for the reference policy ([`World::reference_velocity`]),
    /// e.g. `"algorithm.kl_coef = 0.04"`; `None` (the default) when nothing does. A run whose
    /// algorithm asks for it, with a policy that carries no reference of its own (a full
    /// fine-tune), keeps a frozen copy of the pretrained policy for it.
    fn reference_keys(&self) -> Option<String> {
        None
    }

    /// What in the config asks for the run's EMA copy of the policy
    /// ([`TrainContext::ema`]), e.g. `"algorithm.ema_kl_coef = 1"`; `None` (the default) when
    /// nothing does. A run without `[ema]` then refuses to start ([`TrainerError::NoEma`]).
    fn ema_keys(&self) -> Option<String> {
        None
    }

    /// A sampling copy of the policy for the run to keep (DiffusionNFT's `θ_old`): the
    /// rollouts sample with it, [`TrainContext::sampling_copy`] is it as it stood for the
    /// rollout, and after each rollout's updates it moves toward the policy,
    /// `copy <- η_i copy + (1 - η_i) θ` ([`SoftUpdate::decay`] of the rollout id). It is
    /// checkpointed (`sampler.mpk`). `None` (the default): the rollouts sample with the policy.
    fn sampling_copy(&self) -> Option<SoftUpdate> {
        None
    }

    /// A learned value baseline for the run to keep (DPOK's `r - V(x_t, c, t)`): each rollout
    /// the run pushes its rows, fits the network once and hands the algorithm one advantage
    /// per (sample, trained step) in [`TrainContext::value_advantages`]; the network, its
    /// optimizer and its buffer are checkpointed ([`crate::value::VALUE_FILES`]). `None` (the
    /// default): no baseline.
    fn value_baseline(&self) -> Option<ValueBaselineSettings> {
        None
    }

    /// Called once per rollout, after scoring and before any optimizer step: freezes what the
    /// updates compare against, and returns metrics about it.
    ///
    /// # Errors
    /// Replay and record errors.
    fn freeze(
        &self,
        ctx: &TrainContext<'_, B, W>,
        policy: &W::Policy,
    ) -> Result<(Self::Frozen, Metrics), TrainerError>;

    /// The loss of the rollout samples `samples` (group-major indices) under `policy`, mean-
    /// reduced over the micro-batch, with its diagnostics.
    ///
    /// # Errors
    /// Replay, shape and objective errors.
    fn micro_batch_loss(
        &self,
        ctx: &TrainContext<'_, B, W>,
        frozen: &Self::Frozen,
        policy: &W::Policy,
        samples: Range<usize>,
    ) -> Result<MicroBatchLoss<B, Self::Diagnostics>, TrainerError>;

    /// The algorithm's own metrics of a rollout's updates (in plan order), from their
    /// micro-batches' diagnostics.
    fn rollout_metrics(&self, updates: &[UpdateReport<Self::Diagnostics>]) -> Metrics;
}

/// FlowGRPO (Liu et al. 2025): the PPO-style clipped objective over the log-probs of the
/// trained SDE steps, against the pi_old anchor, with group-relative advantages. With
/// [`RatioObjective::DpokClamped`] the same replay and anchor feed DPOK's objective instead.
#[derive(Debug, Clone)]
pub struct FlowGrpo {
    /// The ratio band (PPO's clip, or DPOK's clamp).
    pub clip: ClipRange,
    /// What the ratio goes into.
    pub objective: RatioObjective,
    /// Where pi_old comes from.
    pub anchor: AnchorSource,
    /// The weight of the KL of every trained transition to the reference policy's
    /// (flow_grpo's `kl_coef`, its closed form over the transition means; 0: no term, and no
    /// reference forward).
    pub kl_coef: f64,
    /// The KL term is left out of rollouts whose id is below this (DPOK's warm-up; 0: from
    /// the first rollout on).
    pub kl_warmup_rollouts: u64,
    /// DanceGRPO's per-sample random subset of the rollout's trained steps; `None`: every
    /// sample trains every trained step.
    pub timestep_subset: Option<TimestepSubset>,
}

/// DanceGRPO's timestep subset: each sample of a rollout trains its own random
/// `floor(fraction * trained steps)` of the rollout's trained steps (the release's
/// `randperm` per sample, truncated by `--timestep_fraction`), drawn from a stream keyed by
/// `(seed, rollout id, sample index)` (`schedule::RandomSubset` over the positions), so the
/// anchor and every update of the rollout replay the same subsets, and a resumed run draws
/// what an uninterrupted one does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimestepSubset {
    /// The kept fraction, in `(0, 1]` (DanceGRPO: 0.6).
    pub fraction: f64,
    /// The seed of the draws (the run's).
    pub seed: u64,
}

impl TimestepSubset {
    /// Per sample of `samples` (group-major indices of rollout `rollout_id`), the positions
    /// among the rollout's `stored` trained steps it trains, ascending.
    ///
    /// # Errors
    /// [`TrainerError::Schedule`] when the fraction keeps no step of `stored`, or is outside
    /// `(0, 1]`.
    pub fn positions(
        &self,
        stored: usize,
        rollout_id: u64,
        samples: Range<usize>,
    ) -> Result<Vec<Vec<usize>>, TrainerError> {
        use schedule::{PlanQuery, SdeStepPlan};
        let plan = schedule::RandomSubset::new(stored, 0..stored, self.fraction, self.seed)
            .map_err(|e| TrainerError::Schedule(Box::new(e)))?;
        samples
            .map(|i| {
                plan.steps(PlanQuery::rollout(rollout_id).with_sample(i as u64))
                    .map(|s| s.as_slice().to_vec())
                    .map_err(|e| TrainerError::Schedule(Box::new(e)))
            })
            .collect()
    }
}

/// The objective a likelihood ratio of the trained transitions goes into.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RatioObjective {
    /// FlowGRPO's `max(-A r, -A clip(r))` ([`flow_grpo::grpo_clip_loss`]).
    PpoClip,
    /// DPOK's `-w A clamp(r)` ([`flow_grpo::dpok_loss`]): the ratio clamped outright, scaled by
    /// the reward weight `w` (the release's 100).
    DpokClamped {
        /// The reward weight.
        reward_weight: f64,
        /// The learned value baseline, if any: the advantages are then `r - V(x_t, c, t)` per
        /// trained step ([`flow_grpo::dpok_loss_per_step`]).
        value_baseline: Option<ValueBaselineSettings>,
    },
}

impl FlowGrpo {
    /// FlowGRPO with the clip range `clip`, the replayed anchor ([`AnchorSource::Replay`]) and
    /// no KL term.
    pub fn new(clip: ClipRange) -> Self {
        Self {
            clip,
            objective: RatioObjective::PpoClip,
            anchor: AnchorSource::Replay,
            kl_coef: 0.0,
            kl_warmup_rollouts: 0,
            timestep_subset: None,
        }
    }

    /// DPOK: the clamped ratio in the band `clip`, weighted by `reward_weight`.
    pub fn dpok(clip: ClipRange, reward_weight: f64) -> Self {
        Self {
            objective: RatioObjective::DpokClamped {
                reward_weight,
                value_baseline: None,
            },
            ..Self::new(clip)
        }
    }

    /// The same objective with pi_old taken from `anchor`.
    pub fn with_anchor(self, anchor: AnchorSource) -> Self {
        Self { anchor, ..self }
    }

    /// The same objective with the KL to the reference policy weighted by `kl_coef`.
    pub fn with_kl(self, kl_coef: f64) -> Self {
        Self { kl_coef, ..self }
    }

    /// The same objective with the KL term left out of the first `rollouts` rollouts.
    pub fn with_kl_warmup(self, rollouts: u64) -> Self {
        Self {
            kl_warmup_rollouts: rollouts,
            ..self
        }
    }

    /// DPOK with a learned value baseline (`None`: without): each trained step's advantage
    /// is `r - V(x_t, c, t)` ([`Algorithm::value_baseline`]).
    pub fn dpok_with_value_baseline(
        clip: ClipRange,
        reward_weight: f64,
        value_baseline: Option<ValueBaselineSettings>,
    ) -> Self {
        Self {
            objective: RatioObjective::DpokClamped {
                reward_weight,
                value_baseline,
            },
            ..Self::new(clip)
        }
    }

    /// DPOK's learned value baseline, if the objective has one.
    pub fn value_settings(&self) -> Option<ValueBaselineSettings> {
        match self.objective {
            RatioObjective::DpokClamped { value_baseline, .. } => value_baseline,
            RatioObjective::PpoClip => None,
        }
    }

    /// The KL weight of rollout `rollout_id`: `kl_coef` once the warm-up is over, 0 before.
    pub fn kl_coef_at(&self, rollout_id: u64) -> f64 {
        if rollout_id < self.kl_warmup_rollouts {
            0.0
        } else {
            self.kl_coef
        }
    }

    /// The same objective on DanceGRPO's per-sample timestep subsets.
    pub fn with_timestep_subset(self, subset: TimestepSubset) -> Self {
        Self {
            timestep_subset: Some(subset),
            ..self
        }
    }

    /// The positions each sample of `samples` replays, `None` for every trained step.
    fn positions<B: AutodiffBackend, W: World<B>>(
        &self,
        ctx: &TrainContext<'_, B, W>,
        samples: Range<usize>,
    ) -> Result<Option<Vec<Vec<usize>>>, TrainerError> {
        self.timestep_subset
            .map(|t| t.positions(ctx.batch.trained.len(), ctx.batch.rollout_id, samples))
            .transpose()
    }
}

/// The replay's columns of optional per-sample positions.
fn columns(positions: &Option<Vec<Vec<usize>>>) -> StepColumns<'_> {
    positions
        .as_deref()
        .map_or(StepColumns::All, StepColumns::PerSample)
}

/// The sampler's log-probs of every rollout sample (`[samples, trained steps]`, row-major),
/// or with per-sample positions of each sample's positions (`[samples, positions]`).
fn rollout_log_probs<B: AutodiffBackend, W: World<B>>(
    ctx: &TrainContext<'_, B, W>,
    positions: Option<&[Vec<usize>]>,
) -> (Vec<f32>, usize) {
    let steps = ctx.batch.trained.len();
    let mut all = Vec::with_capacity(ctx.plan.num_samples * steps);
    for traj in &ctx.batch.trajectories {
        all.extend_from_slice(&traj.tracks.log_probs);
    }
    match positions {
        None => (all, steps),
        Some(pos) => {
            let k = pos.first().map_or(0, Vec::len);
            let picked = pos
                .iter()
                .enumerate()
                .flat_map(|(i, p)| p.iter().map(move |&s| i * steps + s))
                .map(|at| all.get(at).copied().unwrap_or(f32::NAN))
                .collect();
            (picked, k)
        }
    }
}

/// One micro-batch's diagnostics under a clipped-ratio objective (FlowGRPO, AWM): the ratio
/// statistics, and the mean of each KL term the objective has.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyDiagnostics {
    /// The ratio statistics.
    pub clip: ClipDiagnostics,
    /// The mean KL to the reference policy over the micro-batch's elements (before its
    /// coefficient), when the objective has that term.
    pub kl_ref: Option<f64>,
    /// The mean KL to the EMA copy of the policy, when the objective has that term.
    pub kl_ema: Option<f64>,
}

impl PolicyDiagnostics {
    /// Ratio statistics alone (no KL term).
    pub fn clip_only(clip: ClipDiagnostics) -> Self {
        Self {
            clip,
            kl_ref: None,
            kl_ema: None,
        }
    }
}

/// `loss + coef * mean(kl)` when the objective has the KL term `kl` (a mean over its
/// elements, as the clipped term's is over its `(sample, step)` elements), and that mean's
/// value for the diagnostics; `loss` and `None` without it.
pub(crate) fn add_kl_term<Bx: burn::tensor::backend::Backend, const D: usize>(
    loss: Tensor<Bx, 1>,
    kl: Option<Tensor<Bx, D>>,
    coef: f64,
) -> (Tensor<Bx, 1>, Option<f64>) {
    match kl {
        None => (loss, None),
        Some(kl) => {
            let kl = kl.mean();
            let value = scalar(kl.clone());
            (loss + kl.mul_scalar(coef), Some(value))
        }
    }
}

/// The scalar value of a one-element tensor (a detached host read).
pub(crate) fn scalar<Bx: burn::tensor::backend::Backend>(t: Tensor<Bx, 1>) -> f64 {
    t.detach()
        .into_data()
        .convert::<f64>()
        .to_vec::<f64>()
        .map_or(f64::NAN, |v| v.first().copied().unwrap_or(f64::NAN))
}

/// The frozen anchor of a rollout: `log_probs(model, micro-batch)` (`[samples, steps]`) of
/// every micro-batch of the plan under the weights before any optimizer step, through the
/// autodiff model the updates use, up to `ctx.threads` micro-batches side by side (one replica
/// each), detached.
pub(crate) fn record_anchor<B, W, F>(
    ctx: &TrainContext<'_, B, W>,
    policy: &W::Policy,
    log_probs: F,
) -> Result<PolicyAnchor, TrainerError>
where
    B: AutodiffBackend,
    W: World<B>,
    F: Fn(&W::Policy, Range<usize>) -> Result<Tensor<B, 2>, TrainerError> + Sync,
{
    let (anchor, _) = record_anchor_with(ctx, policy, |model, mb| {
        log_probs(model, mb).map(|lp| (lp, ()))
    })?;
    Ok(anchor)
}

/// [`record_anchor`] of `replay(model, micro-batch) = (log-probs, extra)`: the anchor, and
/// each micro-batch's `extra` in plan order (what else an objective keeps of pi_old).
pub(crate) fn record_anchor_with<B, W, X, F>(
    ctx: &TrainContext<'_, B, W>,
    policy: &W::Policy,
    replay: F,
) -> Result<(PolicyAnchor, Vec<X>), TrainerError>
where
    B: AutodiffBackend,
    W: World<B>,
    X: Send,
    F: Fn(&W::Policy, Range<usize>) -> Result<(Tensor<B, 2>, X), TrainerError> + Sync,
{
    let mut recorder = AnchorRecorder::new(ctx.plan);
    let micro: Vec<Range<usize>> = ctx.plan.micro_batches().cloned().collect();
    let threads = ctx.threads.clamp(1, micro.len().max(1));
    let replicas = autodiff_replicas(policy, threads);
    let mut extras = Vec::with_capacity(micro.len());
    for wave in micro.chunks(threads) {
        let jobs: Vec<(&Range<usize>, &W::Policy)> = wave.iter().zip(&replicas).collect();
        let outs = pool_map(&jobs, |(mb, model)| {
            replay(model, (*mb).clone()).map(|(lp, x)| (lp.detach(), x))
        });
        for (mb, out) in wave.iter().zip(outs) {
            let (lp, x) = out?;
            recorder.record(mb.clone(), lp)?;
            extras.push(x);
        }
    }
    Ok((recorder.freeze()?, extras))
}

/// `train/logp_parity_max_abs` of a replayed anchor: the largest difference between the
/// anchor's log-probs and the sampler's own (a forward without autodiff).
/// With per-sample `positions` (of every rollout sample), the sampler's log-probs at them.
pub(crate) fn sampler_parity<B, W>(
    ctx: &TrainContext<'_, B, W>,
    anchor: &PolicyAnchor,
    positions: Option<&[Vec<usize>]>,
) -> Result<Metrics, TrainerError>
where
    B: AutodiffBackend,
    W: World<B>,
{
    let plan: &UpdatePlan = ctx.plan;
    let (rollout_lp, steps) = rollout_log_probs(ctx, positions);
    let rollout_lp: Vec<f64> = rollout_lp.into_iter().map(f64::from).collect();
    let anchor_all = anchor.log_probs::<B::InnerBackend>(0..plan.num_samples, ctx.device)?;
    let parity = log_prob_parity(
        anchor_all,
        Tensor::<B::InnerBackend, 2>::from_data(
            TensorData::new(rollout_lp, [plan.num_samples, steps]),
            ctx.device,
        ),
    )?;
    Ok(Metrics::from([(
        names::TRAIN_LOGP_PARITY_MAX_ABS.to_string(),
        parity.max_abs_diff,
    )]))
}

/// The log-probs `[samples, trained steps]` of rollout samples under the training policy, and
/// with `with_kl` also each transition's KL to the reference policy's (`[samples, steps]`).
fn replay_policy<B, W>(
    ctx: &TrainContext<'_, B, W>,
    policy: &W::Policy,
    samples: Range<usize>,
    columns: StepColumns<'_>,
    with_kl: bool,
) -> Result<(Tensor<B, 2>, Option<Tensor<B, 2>>), TrainerError>
where
    B: AutodiffBackend,
    W: World<B>,
{
    let terms = replay_policy_terms(ctx, policy, samples, columns, with_kl, false)?;
    Ok((terms.log_probs, terms.kl))
}

/// [`replay_terms`] of rollout samples under the training policy: the log-probs, with
/// `with_kl` each transition's KL to the reference policy's, with `with_means` the
/// transitions' means and stds.
pub(crate) fn replay_policy_terms<B, W>(
    ctx: &TrainContext<'_, B, W>,
    policy: &W::Policy,
    samples: Range<usize>,
    columns: StepColumns<'_>,
    with_kl: bool,
    with_means: bool,
) -> Result<ReplayTerms<B>, TrainerError>
where
    B: AutodiffBackend,
    W: World<B>,
{
    let reference = |x: Tensor<B, 3>, sigma: Tensor<B, 1>, cond: &W::Cond<B>| {
        ctx.reference_velocity(policy, x, sigma, cond)
    };
    let reference: Option<&ReferenceFn<'_, B, W::Cond<B>>> =
        if with_kl { Some(&reference) } else { None };
    replay_terms(
        policy,
        reference,
        with_means,
        ctx.spec,
        &ctx.batch.trajectories,
        ctx.batch.group_size(),
        samples,
        columns,
        |traj, rows| {
            ctx.world
                .restore_conditioning::<B>(&traj.conditions, rows, ctx.device)
        },
        ctx.device,
    )
}

/// The log-probs `[samples, trained steps]` of rollout samples under a model on any backend.
fn replay_samples<B, W, Bx, M>(
    ctx: &TrainContext<'_, B, W>,
    model: &M,
    samples: Range<usize>,
    columns: StepColumns<'_>,
) -> Result<Tensor<Bx, 2>, TrainerError>
where
    B: AutodiffBackend,
    W: World<B>,
    Bx: burn::tensor::backend::Backend<Device = B::Device>,
    M: velocity_model::VelocityModel<Bx, Conditioning = W::Cond<Bx>>,
{
    replay(
        model,
        ctx.spec,
        &ctx.batch.trajectories,
        ctx.batch.group_size(),
        samples,
        columns,
        |traj, rows| {
            ctx.world
                .restore_conditioning::<Bx>(&traj.conditions, rows, ctx.device)
        },
        ctx.device,
    )
}

impl<B: AutodiffBackend, W: World<B>> Algorithm<B, W> for FlowGrpo {
    type Frozen = PolicyAnchor;
    type Diagnostics = PolicyDiagnostics;

    fn name(&self) -> &'static str {
        match (self.objective, self.timestep_subset) {
            (RatioObjective::PpoClip, None) => "FlowGRPO",
            (RatioObjective::PpoClip, Some(_)) => "FlowGRPO on per-sample timestep subsets",
            (RatioObjective::DpokClamped { .. }, _) => "DPOK",
        }
    }

    fn recording(&self) -> Recording {
        Recording::SdeTransitions
    }

    fn reference_keys(&self) -> Option<String> {
        (self.kl_coef != 0.0).then(|| format!("algorithm.kl_coef = {}", self.kl_coef))
    }

    fn value_baseline(&self) -> Option<ValueBaselineSettings> {
        self.value_settings()
    }

    /// With [`AnchorSource::Replay`] the anchor is replayed through the same (autodiff) model
    /// and code path the updates use, so the first update's ratio is exactly 1; the sampler's
    /// own log-probs (a forward without autodiff) are compared with it as
    /// `train/logp_parity_max_abs`. With [`AnchorSource::Rollout`] the sampler's log-probs
    /// are the anchor and nothing is replayed here; the parity is then that of the first
    /// update's samples, `max |ln ratio|` of that update (reported by `rollout_metrics`).
    fn freeze(
        &self,
        ctx: &TrainContext<'_, B, W>,
        policy: &W::Policy,
    ) -> Result<(PolicyAnchor, Metrics), TrainerError> {
        let plan: &UpdatePlan = ctx.plan;
        let positions = self.positions(ctx, 0..plan.num_samples)?;
        if self.anchor == AnchorSource::Rollout {
            let (rollout_lp, steps) = rollout_log_probs(ctx, positions.as_deref());
            let anchor = PolicyAnchor::from_rollout(&rollout_lp, plan.num_samples, steps)?;
            return Ok((anchor, Metrics::new()));
        }
        let anchor = record_anchor(ctx, policy, |model, mb| {
            let cols = positions.as_ref().map(|p| p[mb.clone()].to_vec());
            replay_samples::<B, W, B, _>(ctx, model, mb, columns(&cols))
        })?;
        let metrics = sampler_parity(ctx, &anchor, positions.as_deref())?;
        Ok((anchor, metrics))
    }

    fn micro_batch_loss(
        &self,
        ctx: &TrainContext<'_, B, W>,
        anchor: &PolicyAnchor,
        policy: &W::Policy,
        samples: Range<usize>,
    ) -> Result<MicroBatchLoss<B, PolicyDiagnostics>, TrainerError> {
        let positions = self.positions(ctx, samples.clone())?;
        // no reference forward while the KL term is off
        let kl_coef = self.kl_coef_at(ctx.batch.rollout_id);
        let (lp, kl) = replay_policy(
            ctx,
            policy,
            samples.clone(),
            columns(&positions),
            kl_coef != 0.0,
        )?;
        let idx: Vec<usize> = samples.clone().collect();
        let per_step = match ctx.value_advantages {
            Some(all) if self.value_settings().is_some() => {
                let steps = ctx.batch.trained.len();
                let rows = all
                    .get(samples.start * steps..samples.end * steps)
                    .ok_or_else(|| TrainerError::InvalidValueBaseline {
                        problem: format!(
                            "{} value advantages for samples {samples:?} of {steps} trained steps",
                            all.len()
                        ),
                    })?;
                Some(Tensor::<B, 2>::from_data(
                    TensorData::new(rows.to_vec(), [idx.len(), steps]),
                    ctx.device,
                ))
            }
            _ if self.value_settings().is_some() => {
                return Err(TrainerError::InvalidValueBaseline {
                    problem: "the run handed DPOK no value advantages".into(),
                });
            }
            _ => None,
        };
        let anchor = anchor.log_probs::<B>(samples, ctx.device)?;
        let out = match (self.objective, per_step) {
            (RatioObjective::DpokClamped { reward_weight, .. }, Some(adv)) => {
                dpok_loss_per_step(lp, anchor, adv, self.clip, reward_weight)?
            }
            (RatioObjective::PpoClip, _) => grpo_clip_loss(
                lp,
                anchor,
                ctx.advantages.tensor::<B>(&idx, ctx.device),
                self.clip,
            )?,
            (RatioObjective::DpokClamped { reward_weight, .. }, None) => dpok_loss(
                lp,
                anchor,
                ctx.advantages.tensor::<B>(&idx, ctx.device),
                self.clip,
                reward_weight,
            )?,
        };
        let mut diagnostics = PolicyDiagnostics::clip_only(out.diagnostics);
        let (loss, kl_ref) = add_kl_term(out.loss, kl, kl_coef);
        diagnostics.kl_ref = kl_ref;
        Ok(MicroBatchLoss {
            loss,
            elements: out.diagnostics.elements,
            diagnostics,
        })
    }

    fn rollout_metrics(&self, updates: &[UpdateReport<PolicyDiagnostics>]) -> Metrics {
        let mut m = policy_metrics(updates);
        if self.anchor == AnchorSource::Rollout {
            // Before the first optimizer step the replay runs under the sampler's weights, so
            // the first update's ratios measure the parity of its samples.
            m.insert(
                names::TRAIN_LOGP_PARITY_MAX_ABS.into(),
                first_update_parity(updates),
            );
        }
        m
    }
}

/// The largest `|log ratio|` of the first update's micro-batches (`train/logp_parity_max_abs`
/// under the sampler's own log-probs as the anchor); NaN when that update forwarded nothing
/// (skipped on degenerate advantages) or a ratio is NaN: nothing measured is not parity.
fn first_update_parity(updates: &[UpdateReport<PolicyDiagnostics>]) -> f64 {
    updates
        .iter()
        .find(|u| u.update_index == 0 && !u.micro_batches.is_empty())
        .map_or(f64::NAN, |u| {
            u.micro_batches.iter().fold(0.0, |acc, d| {
                let d = &d.clip;
                nan_max(acc, nan_max(d.ratio_min.ln().abs(), d.ratio_max.ln().abs()))
            })
        })
}

/// The ratio metrics of clipped-objective updates, pooled over all their micro-batches:
/// `train/ratio_{mean,std,min,max}`, `train/clip_fraction`, `train/approx_kl` (NaN when
/// nothing was forwarded).
pub fn clip_metrics(updates: &[UpdateReport<ClipDiagnostics>]) -> Metrics {
    let parts: Vec<ClipDiagnostics> = updates
        .iter()
        .flat_map(|u| u.micro_batches.iter().copied())
        .collect();
    ratio_metrics(&parts)
}

/// [`clip_metrics`] of [`PolicyDiagnostics`], and `train/kl_ref` / `train/kl_ema` for the KL
/// terms the objective has (their element-weighted means over every micro-batch).
pub fn policy_metrics(updates: &[UpdateReport<PolicyDiagnostics>]) -> Metrics {
    let all: Vec<PolicyDiagnostics> = updates
        .iter()
        .flat_map(|u| u.micro_batches.iter().copied())
        .collect();
    let parts: Vec<ClipDiagnostics> = all.iter().map(|d| d.clip).collect();
    let mut m = ratio_metrics(&parts);
    type Term = fn(&PolicyDiagnostics) -> Option<f64>;
    let terms: [(&str, Term); 2] = [
        (names::TRAIN_KL_REF, |d| d.kl_ref),
        (names::TRAIN_KL_EMA, |d| d.kl_ema),
    ];
    for (name, term) in terms {
        if all.iter().any(|d| term(d).is_some()) {
            let (mut sum, mut n) = (0.0, 0.0);
            for d in &all {
                let e = d.clip.elements as f64;
                sum += e * term(d).unwrap_or(f64::NAN);
                n += e;
            }
            m.insert(name.into(), if n > 0.0 { sum / n } else { f64::NAN });
        }
    }
    m
}

fn ratio_metrics(parts: &[ClipDiagnostics]) -> Metrics {
    let t = RatioTally::over(parts);
    let mut m = Metrics::new();
    m.insert(names::TRAIN_RATIO_MEAN.into(), t.mean());
    m.insert(names::TRAIN_RATIO_STD.into(), t.std());
    m.insert(names::TRAIN_RATIO_MIN.into(), t.rmin);
    m.insert(names::TRAIN_RATIO_MAX.into(), t.rmax);
    m.insert(names::TRAIN_CLIP_FRACTION.into(), t.clipped / t.n());
    m.insert(names::TRAIN_APPROX_KL.into(), t.kl / t.n());
    m
}

/// Pooled ratio statistics over an update's micro-batches (each micro-batch's statistics are
/// over its own `(sample, step)` elements). NaN when the update forwarded nothing (a skipped
/// update), or when any micro-batch's statistic is NaN.
#[derive(Debug)]
struct RatioTally {
    elements: usize,
    sum_r: f64,
    sum_r2: f64,
    kl: f64,
    clipped: f64,
    rmin: f64,
    rmax: f64,
}

impl RatioTally {
    fn over(parts: &[ClipDiagnostics]) -> Self {
        let mut t = Self {
            elements: 0,
            sum_r: 0.0,
            sum_r2: 0.0,
            kl: 0.0,
            clipped: 0.0,
            rmin: if parts.is_empty() {
                f64::NAN
            } else {
                f64::INFINITY
            },
            rmax: if parts.is_empty() {
                f64::NAN
            } else {
                f64::NEG_INFINITY
            },
        };
        for d in parts {
            let e = d.elements as f64;
            t.elements += d.elements;
            t.sum_r += e * d.ratio_mean;
            t.sum_r2 += e * (d.ratio_std * d.ratio_std + d.ratio_mean * d.ratio_mean);
            t.kl += e * d.approx_kl;
            t.clipped += e * d.clip_fraction;
            t.rmin = nan_min(t.rmin, d.ratio_min);
            t.rmax = nan_max(t.rmax, d.ratio_max);
        }
        t
    }

    fn n(&self) -> f64 {
        if self.elements == 0 {
            f64::NAN
        } else {
            self.elements as f64
        }
    }

    fn mean(&self) -> f64 {
        self.sum_r / self.n()
    }

    fn std(&self) -> f64 {
        let mean = self.mean();
        std_of_variance(self.sum_r2 / self.n() - mean * mean)
    }
}

/// The standard deviation of a variance computed as `E[x^2] - E[x]^2`: rounding can leave it
/// slightly below zero, which reads as 0; NaN stays NaN (`f64::max` would turn it into 0).
pub(crate) fn std_of_variance(var: f64) -> f64 {
    if var.is_nan() {
        f64::NAN
    } else {
        var.max(0.0).sqrt()
    }
}

/// The smaller of two values, NaN if either is NaN (`f64::min` drops a NaN).
pub(crate) fn nan_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

/// The larger of two values, NaN if either is NaN (`f64::max` drops a NaN).
pub(crate) fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_aware_extremes_keep_the_nan() {
        assert!(nan_max(1.0, f64::NAN).is_nan());
        assert!(nan_max(f64::NAN, 1.0).is_nan());
        assert!(nan_min(f64::NAN, -1.0).is_nan());
        assert_eq!(nan_max(1.0, 2.0), 2.0);
        assert_eq!(nan_min(1.0, 2.0), 1.0);
    }

    /// DanceGRPO's subsets: `floor(5 * 0.6) = 3` distinct ascending positions per sample,
    /// the same for the same (seed, rollout, sample), not one subset for every sample, and a
    /// fraction that keeps nothing refused.
    #[test]
    fn timestep_subsets_are_per_sample_and_keyed() {
        let t = TimestepSubset {
            fraction: 0.6,
            seed: 3,
        };
        let a = t.positions(5, 7, 0..16).unwrap();
        assert_eq!(a.len(), 16);
        for p in &a {
            assert_eq!(p.len(), 3);
            assert!(p.windows(2).all(|w| w[0] < w[1]) && p[2] < 5, "{p:?}");
        }
        assert!(a.iter().any(|p| p != &a[0]), "{a:?}");
        assert_eq!(t.positions(5, 7, 4..6).unwrap(), a[4..6].to_vec());
        assert_ne!(t.positions(5, 8, 0..16).unwrap(), a);
        let none = TimestepSubset {
            fraction: 0.1,
            seed: 3,
        };
        assert!(none.positions(5, 7, 0..2).is_err());
    }

    #[test]
    fn parity_is_measured_only_where_the_first_update_forwarded() {
        let diag = |min: f64, max: f64| PolicyDiagnostics {
            clip: ClipDiagnostics {
                ratio_mean: 1.0,
                ratio_std: 0.0,
                ratio_min: min,
                ratio_max: max,
                clip_fraction: 0.0,
                clipped_gradient_fraction: 0.0,
                approx_kl: 0.0,
                elements: 4,
            },
            kl_ref: None,
            kl_ema: None,
        };
        let update = |index: usize, mbs: Vec<PolicyDiagnostics>| UpdateReport {
            update_index: index,
            loss: 0.0,
            num_microbatches: mbs.len(),
            micro_batches: mbs,
            step: crate::train::StepReport {
                lr: 1e-3,
                clip: None,
                skipped: None,
            },
            samples: 4,
            transitions: 4,
            seconds: 0.0,
        };
        let e = 1e-3_f64.exp();
        let p = first_update_parity(&[
            update(0, vec![diag(1.0, e), diag(1.0 / (2.0 * e), 1.0)]),
            update(1, vec![diag(0.1, 10.0)]),
        ]);
        assert!((p - (1e-3 + 2f64.ln())).abs() < 1e-12, "{p}");
        // a skipped first update measured nothing: NaN, not a perfect 0
        assert!(
            first_update_parity(&[update(0, vec![]), update(1, vec![diag(1.0, 1.0)])]).is_nan()
        );
        assert!(first_update_parity(&[update(0, vec![diag(f64::NAN, 1.0)])]).is_nan());
    }

    #[test]
    fn ratio_tally_pools_micro_batches() {
        let d = |mean: f64, std: f64, min: f64, max: f64, e: usize| ClipDiagnostics {
            ratio_mean: mean,
            ratio_std: std,
            ratio_min: min,
            ratio_max: max,
            clip_fraction: 0.5,
            clipped_gradient_fraction: 0.0,
            approx_kl: 0.0,
            elements: e,
        };
        let t = RatioTally::over(&[d(1.0, 0.0, 1.0, 1.0, 2), d(3.0, 0.0, 3.0, 3.0, 2)]);
        assert_eq!(t.mean(), 2.0);
        assert_eq!(t.std(), 1.0);
        assert_eq!((t.rmin, t.rmax), (1.0, 3.0));
        let t = RatioTally::over(&[d(1.0, 0.0, 1.0, f64::NAN, 2)]);
        assert!(t.rmax.is_nan());
        let t = RatioTally::over(&[]);
        assert!(t.mean().is_nan() && t.std().is_nan() && t.rmin.is_nan());
        let t = RatioTally::over(&[d(1.0, f64::NAN, 1.0, 1.0, 2)]);
        assert!(t.std().is_nan());
        // rounding below zero is a zero spread, not NaN
        assert_eq!(std_of_variance(-1e-18), 0.0);
        assert!(std_of_variance(f64::NAN).is_nan());
    }
}
