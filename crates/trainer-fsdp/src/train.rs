//! The trainer's phases that do not need a model family or a scorer: `advantages` (flow-grpo's
//! group-relative advantages plus their metrics) and the optimizer-step part of `train_step`.
//!
//! One update of the plan runs as
//!
//! ```text
//! for each micro-batch mb of the update:          (skipped entirely on degenerate advantages)
//!     L_mb = loss_fn(model, mb)                   the algorithm's loss of mb, mean-reduced
//!     grads += d(w_mb * L_mb)/dparams             w_mb = |mb| / |update|: grads of the mean
//! all-reduce grads over the ranks                 (the workers seam; identity on one rank)
//! clip grads by their global norm (clip_grad)     non-finite norm: skip the step
//! AdamW step at lr_at_step(lr_scheduler_steps)    then count the step, bump the policy version
//! ```
//!
//! The loss itself comes from the algorithm ([`crate::algorithm::Algorithm`]); `rollout`,
//! `score` and `evaluate` are phases of the generic run ([`crate::run::Run`]).

use std::marker::PhantomData;
use std::ops::Range;
use std::time::Instant;

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{
    AdamW, AdamWState, GradientsAccumulator, GradientsParams, LearningRate, Optimizer,
    SimpleOptimizer,
};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, ElementConversion, Tensor};
use flow_grpo::{
    AdvantageConfig, Advantages, PlannedUpdate, PromptStatTracker, RewardGroup, compute_advantages,
};
use model_weights::in_dtype;

use crate::checkpoint::TrainerState;
use crate::clip::{ClipReport, clip_grad_norm};
use crate::config::{AdamWSettings, MasterDtype};
use crate::error::TrainerError;
use crate::lr::{LrSchedule, LrScheduler};
use crate::monitor::{Metrics, names};
use crate::rollout::pool_map;
use crate::workers::Workers;

/// Group-relative advantages of one scored rollout (flow-grpo's [`compute_advantages`]).
///
/// A group whose required component is missing or non-finite (a scorer that returned NaN)
/// fails alone: its samples get advantage 0 and do not train, the others go on;
/// [`failure_messages`] says which and why, and [`advantage_metrics`] counts them.
///
/// # Errors
/// [`TrainerError::FlowGrpo`] for an invalid configuration or an empty batch.
pub fn advantages(
    config: &AdvantageConfig,
    groups: &[RewardGroup],
    tracker: Option<&mut PromptStatTracker>,
) -> Result<Advantages, TrainerError> {
    Ok(compute_advantages(config, groups, tracker)?)
}

/// One line per failed group, for the log.
pub fn failure_messages(adv: &Advantages) -> Vec<String> {
    adv.failures()
        .into_iter()
        .map(|e| format!("reward group failed and is not trained: {e}"))
        .collect()
}

/// The `reward/*` metrics of seed 002 for one batch: per component
/// `reward/<c>_{mean,std,min,max,group_std_mean}`, `reward/advantage_{mean,std}`,
/// `reward/num_groups`, `reward/group_std_mean` (the mean over components of the per-group
/// reward std), `reward/degenerate`, `reward/zero_std_ratio` (the share of groups whose
/// rewards are all equal), `reward/failed_groups`.
///
/// ```
/// use std::collections::BTreeMap;
/// use flow_grpo::{AdvantageConfig, RewardComponent, RewardGroup, StdMode};
/// use trainer_fsdp::{advantage_metrics, advantages, names};
/// let cfg = AdvantageConfig::flow_grpo(StdMode::Group, vec![RewardComponent::required("score", 1.0)]).unwrap();
/// let g = |a: f64, b: f64| RewardGroup {
///     prompt_key: "p".into(),
///     samples: vec![BTreeMap::from([("score".into(), a)]), BTreeMap::from([("score".into(), b)])],
/// };
/// let adv = advantages(&cfg, &[g(0.0, 1.0), g(2.0, f64::NAN)], None).unwrap();
/// let m = advantage_metrics(&adv);
/// assert_eq!(m[names::REWARD_NUM_GROUPS], 2.0);
/// assert_eq!(m[names::REWARD_FAILED_GROUPS], 1.0);
/// assert_eq!(m["reward/score_mean"], 0.5); // over the groups that did not fail
/// assert_eq!(m[names::REWARD_GROUP_STD_MEAN], 0.5);
/// assert_eq!(m[names::REWARD_ZERO_STD_RATIO], 0.0);
/// ```
pub fn advantage_metrics(adv: &Advantages) -> Metrics {
    let mut m = Metrics::new();
    for (name, s) in &adv.components {
        m.insert(names::reward_component(name, "mean"), s.mean);
        m.insert(names::reward_component(name, "std"), s.std);
        m.insert(names::reward_component(name, "min"), s.min);
        m.insert(names::reward_component(name, "max"), s.max);
        m.insert(
            names::reward_component(name, "group_std_mean"),
            s.group_std_mean,
        );
    }
    if !adv.components.is_empty() {
        let gsm = adv
            .components
            .values()
            .map(|s| s.group_std_mean)
            .sum::<f64>()
            / adv.components.len() as f64;
        m.insert(names::REWARD_GROUP_STD_MEAN.into(), gsm);
    }
    m.insert(names::REWARD_ADVANTAGE_MEAN.into(), adv.mean);
    m.insert(names::REWARD_ADVANTAGE_STD.into(), adv.std);
    m.insert(names::REWARD_NUM_GROUPS.into(), adv.groups.len() as f64);
    m.insert(
        names::REWARD_DEGENERATE.into(),
        f64::from(u8::from(adv.degenerate)),
    );
    m.insert(names::REWARD_ZERO_STD_RATIO.into(), adv.zero_std_fraction);
    m.insert(
        names::REWARD_FAILED_GROUPS.into(),
        adv.failures().len() as f64,
    );
    m
}

/// Why an optimizer step was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// The advantages' variance collapsed (`reward/degenerate`): nothing to learn from.
    DegenerateAdvantages,
    /// The global gradient norm is NaN or infinite.
    NonFiniteGradNorm,
    /// No trainable parameter received a gradient.
    NoGradient,
}

/// The outcome of one [`PolicyOptimizer::step`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// The learning rate used (or that would have been used, when skipped).
    pub lr: f64,
    /// The clipping (absent when skipped before computing gradients' norm).
    pub clip: Option<ClipReport>,
    /// Why the step was skipped, if it was.
    pub skipped: Option<SkipReason>,
}

/// Checks that every trainable parameter is stored in `master`.
struct MasterCheck {
    stack: Vec<String>,
    expected: DType,
    bad: Option<(String, DType)>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for MasterCheck {
    fn enter_module(&mut self, name: &str, _container: &str) {
        self.stack.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container: &str) {
        self.stack.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if self.bad.is_none() && param.is_require_grad() {
            let dtype = param.val().dtype();
            if dtype != self.expected {
                self.bad = Some((self.stack.join("."), dtype));
            }
        }
    }
}

/// Checks that `model`'s trainable parameters are stored as `master` (the optimizer's master
/// copy; e.g. fp32 adapters under LoRA).
///
/// # Errors
/// [`TrainerError::MasterDtype`] naming the first parameter that is not.
pub fn check_master_dtype<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    master: MasterDtype,
) -> Result<(), TrainerError> {
    let expected = match master {
        MasterDtype::Fp32 => DType::F32,
        MasterDtype::Bf16 => DType::BF16,
    };
    let mut v = MasterCheck {
        stack: Vec::new(),
        expected,
        bad: None,
    };
    model.visit(&mut v);
    match v.bad {
        None => Ok(()),
        Some((param, found)) => Err(TrainerError::MasterDtype {
            param,
            found: format!("{found:?}"),
            expected: format!("{master:?}"),
        }),
    }
}

/// The optimizer of the policy with everything around its step: the learning-rate schedule
/// (counted in optimizer steps), global-norm clipping, the master-dtype check, skips, and the
/// counters that go into the checkpoint.
pub struct PolicyOptimizer<B, M, O>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    optimizer: O,
    scheduler: LrScheduler,
    clip_grad: f64,
    master: Option<MasterDtype>,
    policy_version: u64,
    optimizer_steps: u64,
    optimizer_skips: u64,
    _m: PhantomData<(B, M)>,
}

/// burn's AdamW wrapped for a module `M`, its moments in each parameter's own dtype
/// ([`AdamWInParamDtype`]).
pub type AdamWOptimizer<B, M> = OptimizerAdaptor<AdamWInParamDtype, M, B>;

/// burn's [`AdamW`] with its moments held in the dtype of each parameter's gradient, as
/// torch's AdamW holds them in the parameter's dtype.
///
/// burn's record of the moments stores them in `f32` and reads them back in the backend's
/// default float dtype, whatever they were: a run whose trained weights are bf16 (a full fine-
/// tune at `model.param_dtype = "bf16"` without an `f32` master) resumed with `f32` moments
/// beside `bf16` gradients, and AdamW's first update panicked on the mismatch. A moment of
/// another dtype than its gradient is cast to it before the step; the stored moments were
/// bf16 values widened to `f32`, so the cast restores them exactly. The record is AdamW's own,
/// so checkpoints written before this wrapper load unchanged.
#[derive(Clone)]
pub struct AdamWInParamDtype(AdamW);

impl AdamWInParamDtype {
    /// Wraps an AdamW (`AdamWConfig::build`).
    pub fn new(adamw: AdamW) -> Self {
        Self(adamw)
    }
}

impl<B: burn::tensor::backend::Backend> SimpleOptimizer<B> for AdamWInParamDtype {
    type State<const D: usize> = AdamWState<B, D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<B, D>, Option<Self::State<D>>) {
        let dtype = grad.dtype();
        let state = state.map(|mut s| {
            let m = &mut s.momentum;
            m.moment_1 = in_dtype(m.moment_1.clone(), dtype);
            m.moment_2 = in_dtype(m.moment_2.clone(), dtype);
            m.max_moment_2 = m.max_moment_2.take().map(|t| in_dtype(t, dtype));
            s
        });
        self.0.step(lr, tensor, grad, state)
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &B::Device) -> Self::State<D> {
        <AdamW as SimpleOptimizer<B>>::to_device(state, device)
    }
}

impl<B, M> PolicyOptimizer<B, M, AdamWOptimizer<B, M>>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
{
    /// AdamW (no built-in clipping: the global clip runs before it) with the schedule, at
    /// step 0.
    ///
    /// # Errors
    /// As [`PolicyOptimizer::new`].
    pub fn adamw(
        settings: &AdamWSettings,
        schedule: LrSchedule,
        clip_grad: f64,
        master: Option<MasterDtype>,
    ) -> Result<Self, TrainerError> {
        Self::new(
            OptimizerAdaptor::from(AdamWInParamDtype::new(settings.adamw_config().build())),
            LrScheduler::new(schedule),
            clip_grad,
            master,
        )
    }
}

impl<B, M, O> Clone for PolicyOptimizer<B, M, O>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B> + Clone,
{
    fn clone(&self) -> Self {
        Self {
            optimizer: self.optimizer.clone(),
            scheduler: self.scheduler,
            clip_grad: self.clip_grad,
            master: self.master,
            policy_version: self.policy_version,
            optimizer_steps: self.optimizer_steps,
            optimizer_skips: self.optimizer_skips,
            _m: PhantomData,
        }
    }
}

impl<B, M, O> PolicyOptimizer<B, M, O>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    /// Wraps any burn optimizer.
    ///
    /// # Errors
    /// [`TrainerError::InvalidClipNorm`] when `clip_grad` is not finite and positive
    /// (preflight rejects that).
    pub fn new(
        optimizer: O,
        scheduler: LrScheduler,
        clip_grad: f64,
        master: Option<MasterDtype>,
    ) -> Result<Self, TrainerError> {
        if !(clip_grad.is_finite() && clip_grad > 0.0) {
            return Err(TrainerError::InvalidClipNorm {
                key: "optimizer.clip_grad",
                value: clip_grad,
            });
        }
        Ok(Self {
            optimizer,
            scheduler,
            clip_grad,
            master,
            policy_version: 0,
            optimizer_steps: 0,
            optimizer_skips: 0,
            _m: PhantomData,
        })
    }

    /// Restores the counters of a checkpoint's trainer state (the optimizer's own record is
    /// loaded by the checkpoint store): lr-scheduler steps, policy version, step and skip
    /// counts.
    pub fn restore(&mut self, state: &TrainerState) {
        self.scheduler = LrScheduler::resume(*self.scheduler.schedule(), state.lr_scheduler_steps);
        self.policy_version = state.policy_version;
        self.optimizer_steps = state.optimizer_steps;
        self.optimizer_skips = state.optimizer_skips;
    }

    /// Writes the counters into a trainer state for a checkpoint.
    pub fn record_into(&self, state: &mut TrainerState) {
        state.lr_scheduler_steps = self.scheduler.steps();
        state.policy_version = self.policy_version;
        state.optimizer_steps = self.optimizer_steps;
        state.optimizer_skips = self.optimizer_skips;
    }

    /// The wrapped optimizer (to save its record).
    pub fn optimizer(&self) -> &O {
        &self.optimizer
    }

    /// Replaces the wrapped optimizer (after loading its record).
    pub fn set_optimizer(&mut self, optimizer: O) {
        self.optimizer = optimizer;
    }

    /// The learning-rate scheduler.
    pub fn lr_scheduler(&self) -> &LrScheduler {
        &self.scheduler
    }

    /// Optimizer steps that changed the weights.
    pub fn policy_version(&self) -> u64 {
        self.policy_version
    }

    /// Optimizer steps taken.
    pub fn optimizer_steps(&self) -> u64 {
        self.optimizer_steps
    }

    /// Optimizer steps skipped.
    pub fn optimizer_skips(&self) -> u64 {
        self.optimizer_skips
    }

    fn skip(&mut self, model: M, reason: SkipReason, clip: Option<ClipReport>) -> (M, StepReport) {
        self.optimizer_skips += 1;
        (
            model,
            StepReport {
                lr: self.scheduler.current_lr(),
                clip,
                skipped: Some(reason),
            },
        )
    }

    /// One optimizer step with `grads` (the gradients of the update's mean loss): master-dtype
    /// check, global-norm clip, step at the scheduled rate, counters. `skip` (degenerate
    /// advantages) skips it without touching the weights; so do a non-finite norm and
    /// gradients that reach no parameter. A skipped step does not advance the schedule.
    ///
    /// # Errors
    /// [`TrainerError::MasterDtype`].
    pub fn step(
        &mut self,
        model: M,
        mut grads: GradientsParams,
        skip: Option<SkipReason>,
    ) -> Result<(M, StepReport), TrainerError> {
        if let Some(master) = self.master {
            check_master_dtype::<B, M>(&model, master)?;
        }
        if let Some(reason) = skip {
            return Ok(self.skip(model, reason, None));
        }
        let clip = clip_grad_norm::<B, M>(&model, &mut grads, self.clip_grad)?;
        if !clip.is_finite() {
            return Ok(self.skip(model, SkipReason::NonFiniteGradNorm, Some(clip)));
        }
        if clip.tensors == 0 {
            return Ok(self.skip(model, SkipReason::NoGradient, Some(clip)));
        }
        let lr = self.scheduler.current_lr();
        let model = self.optimizer.step(lr, model, grads);
        self.scheduler.advance();
        self.optimizer_steps += 1;
        self.policy_version += 1;
        Ok((
            model,
            StepReport {
                lr,
                clip: Some(clip),
                skipped: None,
            },
        ))
    }
}

/// One micro-batch's contribution to an update: its mean-reduced loss (with the autodiff graph
/// to back-propagate), the units of work it replayed, and the algorithm's diagnostics.
#[derive(Debug)]
pub struct MicroBatchLoss<B: AutodiffBackend, D> {
    /// The loss, `[1]`, mean-reduced over the micro-batch.
    pub loss: Tensor<B, 1>,
    /// Replayed transitions (samples x trained steps) that entered the loss.
    pub elements: usize,
    /// The algorithm's diagnostics of the micro-batch.
    pub diagnostics: D,
}

/// What one update of the plan did.
#[derive(Debug, Clone, PartialEq)]
pub struct UpdateReport<D> {
    /// The update's index in the plan (0: the on-policy one).
    pub update_index: usize,
    /// The update's mean loss: the micro-batches' losses weighted by their share of the update
    /// (`NaN` when skipped before any forward).
    pub loss: f64,
    /// The algorithm's diagnostics of every micro-batch, in plan order (empty when skipped
    /// before any forward).
    pub micro_batches: Vec<D>,
    /// The optimizer step.
    pub step: StepReport,
    /// Micro-batches of the update.
    pub num_microbatches: usize,
    /// Samples trained.
    pub samples: usize,
    /// Replayed transitions (samples x trained steps) that entered the loss.
    pub transitions: usize,
    /// Wall-clock seconds of forward, backward and step.
    pub seconds: f64,
}

impl<D> UpdateReport<D> {
    /// The algorithm-independent `train/*` and `perf/*` metrics of a rollout's updates, in
    /// plan order (the algorithm adds its own, e.g. the ratio statistics): the mean loss and
    /// gradient norm over the updates, the last step's learning rate, the steps taken and
    /// skipped, the micro-batches, and the updates' throughput. NaN where an update's value is.
    pub fn rollout_metrics(updates: &[Self]) -> Metrics {
        let mut m = Metrics::new();
        let n = updates.len() as f64;
        let mean = |f: fn(&Self) -> f64| {
            if updates.is_empty() {
                f64::NAN
            } else {
                updates.iter().map(f).sum::<f64>() / n
            }
        };
        m.insert(names::TRAIN_LOSS.into(), mean(|u| u.loss));
        m.insert(
            names::TRAIN_GRAD_NORM.into(),
            mean(|u| u.step.clip.map_or(f64::NAN, |c| c.total_norm)),
        );
        m.insert(
            names::TRAIN_LR.into(),
            updates.last().map_or(f64::NAN, |u| u.step.lr),
        );
        let skipped = updates.iter().filter(|u| u.step.skipped.is_some()).count();
        m.insert(
            names::TRAIN_OPTIMIZER_STEPS.into(),
            (updates.len() - skipped) as f64,
        );
        m.insert(names::TRAIN_OPTIMIZER_SKIPS.into(), skipped as f64);
        m.insert(
            names::TRAIN_NUM_MICROBATCHES.into(),
            updates.iter().map(|u| u.num_microbatches).sum::<usize>() as f64,
        );
        let seconds: f64 = updates.iter().map(|u| u.seconds).sum();
        let transitions: usize = updates.iter().map(|u| u.transitions).sum();
        let samples: usize = updates.iter().map(|u| u.samples).sum();
        if seconds > 0.0 && transitions > 0 {
            m.insert(
                names::PERF_TRAIN_TRANSITIONS_PER_S.into(),
                transitions as f64 / seconds,
            );
            m.insert(
                names::PERF_TRAIN_SAMPLES_PER_S.into(),
                samples as f64 / seconds,
            );
        }
        m
    }

    /// The update's algorithm-independent `train/*` and `perf/*` metrics (the algorithm adds
    /// its own, e.g. the ratio statistics).
    pub fn metrics(&self) -> Metrics {
        let mut m = Metrics::new();
        let skipped = self.step.skipped.is_some();
        m.insert(names::TRAIN_LOSS.into(), self.loss);
        m.insert(
            names::TRAIN_GRAD_NORM.into(),
            self.step.clip.map_or(f64::NAN, |c| c.total_norm),
        );
        m.insert(names::TRAIN_LR.into(), self.step.lr);
        m.insert(
            names::TRAIN_OPTIMIZER_STEPS.into(),
            f64::from(u8::from(!skipped)),
        );
        m.insert(
            names::TRAIN_OPTIMIZER_SKIPS.into(),
            f64::from(u8::from(skipped)),
        );
        m.insert(
            names::TRAIN_NUM_MICROBATCHES.into(),
            self.num_microbatches as f64,
        );
        if self.seconds > 0.0 && self.transitions > 0 {
            m.insert(
                names::PERF_TRAIN_TRANSITIONS_PER_S.into(),
                self.transitions as f64 / self.seconds,
            );
            m.insert(
                names::PERF_TRAIN_SAMPLES_PER_S.into(),
                self.samples as f64 / self.seconds,
            );
        }
        m
    }
}

/// One update of the plan: accumulate the gradients of `loss_fn` over the update's
/// micro-batches (each weighted by its share of the update, so the sum is the gradient of the
/// update's mean loss), all-reduce them over the ranks of `workers`, then
/// [`PolicyOptimizer::step`]. With `degenerate` advantages nothing is forwarded and the step
/// is skipped.
///
/// `loss_fn(model, samples)` returns the loss of the samples (indices into the rollout batch),
/// e.g. [`flow_grpo::grpo_clip_loss`] of their replayed log-probs against the frozen anchor.
///
/// # Errors
/// The first error of `loss_fn`, of the all-reduce, and those of [`PolicyOptimizer::step`].
/// The model is consumed then: such an error (a replay or shape problem, a wrong master
/// dtype) ends the run, unlike a failed reward group, which [`advantages`] reports and the
/// run survives.
pub fn train_step<B, M, O, K, D, F>(
    model: M,
    optimizer: &mut PolicyOptimizer<B, M, O>,
    workers: &K,
    update: &PlannedUpdate,
    degenerate: bool,
    mut loss_fn: F,
) -> Result<(M, UpdateReport<D>), TrainerError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
    K: Workers,
    F: FnMut(&M, Range<usize>) -> Result<MicroBatchLoss<B, D>, TrainerError>,
{
    let start = Instant::now();
    if degenerate {
        return skip_update(model, optimizer, update, start);
    }
    let mut tally = UpdateTally::default();
    let mut accumulator = GradientsAccumulator::<M>::new();
    for (i, mb) in update.micro_batches.iter().enumerate() {
        let (d, elements, loss, grads) =
            micro_batch_grads(&model, update, i, mb.clone(), &mut loss_fn)?;
        tally.add(d, elements, loss);
        accumulator.accumulate::<B>(&model, grads);
    }
    finish_update(model, optimizer, workers, update, accumulator, tally, start)
}

/// [`train_step`] with up to `workers.host_threads()` micro-batches forwarded and
/// back-propagated side by side (on a CPU backend one small forward keeps about one core
/// busy). The gradients are summed in micro-batch order whatever the threads' timing, so the
/// step is the sequential one's bit for bit; one thread is [`train_step`].
///
/// # Errors
/// As [`train_step`]; the error of the first failing micro-batch (in plan order).
///
/// # Panics
/// Re-raises a panic of a worker thread.
pub fn train_step_threads<B, M, O, K, D, F>(
    model: M,
    optimizer: &mut PolicyOptimizer<B, M, O>,
    workers: &K,
    update: &PlannedUpdate,
    degenerate: bool,
    loss_fn: F,
) -> Result<(M, UpdateReport<D>), TrainerError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + Sync,
    O: Optimizer<M, B>,
    K: Workers,
    D: Send,
    F: Fn(&M, Range<usize>) -> Result<MicroBatchLoss<B, D>, TrainerError> + Sync,
{
    let threads = workers.host_threads();
    if threads <= 1 || degenerate || update.micro_batches.len() <= 1 {
        return train_step(model, optimizer, workers, update, degenerate, &loss_fn);
    }
    let start = Instant::now();
    let mut tally = UpdateTally::default();
    let mut accumulator = GradientsAccumulator::<M>::new();
    let indexed: Vec<(usize, Range<usize>)> =
        update.micro_batches.iter().cloned().enumerate().collect();
    let replicas = autodiff_replicas(&model, threads.min(indexed.len()));
    for wave in indexed.chunks(threads) {
        let jobs: Vec<(&(usize, Range<usize>), &M)> = wave.iter().zip(&replicas).collect();
        let results = pool_map(&jobs, |((i, mb), model)| {
            micro_batch_grads(*model, update, *i, mb.clone(), &mut |m: &M, s| {
                loss_fn(m, s)
            })
        });
        for r in results {
            let (d, elements, loss, grads) = r?;
            tally.add(d, elements, loss);
            accumulator.accumulate::<B>(&model, grads);
        }
    }
    finish_update(model, optimizer, workers, update, accumulator, tally, start)
}

/// `n` copies of `model` for worker threads: the same values and parameter ids (so their
/// gradients accumulate into `model`'s), but fresh autodiff nodes. burn 0.21's autodiff merges
/// the graphs of tensors that share a node into one, and a backward on such a merged graph
/// racing a forward of another thread deadlocks (the graph lock and the global locator lock
/// are taken in opposite orders); graphs that share no node never meet.
pub fn autodiff_replicas<B: AutodiffBackend, M: AutodiffModule<B>>(model: &M, n: usize) -> Vec<M> {
    (0..n).map(|_| M::from_inner(model.valid())).collect()
}

/// The skipped update of degenerate advantages: nothing forwarded, no weight touched.
fn skip_update<B, M, O, D>(
    model: M,
    optimizer: &mut PolicyOptimizer<B, M, O>,
    update: &PlannedUpdate,
    start: Instant,
) -> Result<(M, UpdateReport<D>), TrainerError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    let (model, step) = optimizer.step(
        model,
        GradientsParams::new(),
        Some(SkipReason::DegenerateAdvantages),
    )?;
    let report = UpdateReport::new(update, step, UpdateTally::<D>::default(), 0, start);
    Ok((
        model,
        UpdateReport {
            loss: f64::NAN,
            ..report
        },
    ))
}

/// What one micro-batch gave an update: its diagnostics, its replayed transitions, its
/// weighted loss and its gradients.
type MicroBatchGrads<D> = (D, usize, f64, GradientsParams);

/// The weighted loss, the diagnostics and the gradients of micro-batch `i` of an update.
fn micro_batch_grads<B, M, D, F>(
    model: &M,
    update: &PlannedUpdate,
    i: usize,
    mb: Range<usize>,
    loss_fn: &mut F,
) -> Result<MicroBatchGrads<D>, TrainerError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    F: FnMut(&M, Range<usize>) -> Result<MicroBatchLoss<B, D>, TrainerError>,
{
    let MicroBatchLoss {
        loss,
        elements,
        diagnostics,
    } = loss_fn(model, mb)?;
    let w = update.micro_batch_weight(i);
    let weighted = w * loss.clone().into_scalar().elem::<f64>();
    let grads = GradientsParams::from_grads(loss.mul_scalar(w).backward(), model);
    Ok((diagnostics, elements, weighted, grads))
}

/// Running sums of an update over its micro-batches.
#[derive(Debug)]
struct UpdateTally<D> {
    loss: f64,
    elements: usize,
    micro_batches: Vec<D>,
}

impl<D> Default for UpdateTally<D> {
    fn default() -> Self {
        Self {
            loss: 0.0,
            elements: 0,
            micro_batches: Vec::new(),
        }
    }
}

impl<D> UpdateTally<D> {
    fn add(&mut self, diagnostics: D, elements: usize, weighted_loss: f64) {
        self.loss += weighted_loss;
        self.elements += elements;
        self.micro_batches.push(diagnostics);
    }
}

/// The all-reduce and the optimizer step on the accumulated gradients, and the update's
/// report.
fn finish_update<B, M, O, K, D>(
    model: M,
    optimizer: &mut PolicyOptimizer<B, M, O>,
    workers: &K,
    update: &PlannedUpdate,
    mut accumulator: GradientsAccumulator<M>,
    t: UpdateTally<D>,
    start: Instant,
) -> Result<(M, UpdateReport<D>), TrainerError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
    K: Workers,
{
    let grads = workers.all_reduce_grads::<B, M>(accumulator.grads(), &model)?;
    let (model, step) = optimizer.step(model, grads, None)?;
    let samples = update.samples.len();
    Ok((model, UpdateReport::new(update, step, t, samples, start)))
}

impl<D> UpdateReport<D> {
    /// The report of `update` from its tally.
    fn new(
        update: &PlannedUpdate,
        step: StepReport,
        t: UpdateTally<D>,
        samples: usize,
        start: Instant,
    ) -> Self {
        Self {
            update_index: update.index,
            loss: t.loss,
            micro_batches: t.micro_batches,
            step,
            num_microbatches: update.micro_batches.len(),
            samples,
            transitions: t.elements,
            seconds: start.elapsed().as_secs_f64(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};

    type AD = Autodiff<Flex>;
    type P = Param<Tensor<AD, 1>>;

    fn adamw(
        clip_grad: f64,
    ) -> Result<PolicyOptimizer<AD, P, AdamWOptimizer<AD, P>>, TrainerError> {
        let settings = AdamWSettings {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        };
        PolicyOptimizer::adamw(
            &settings,
            LrSchedule::constant(1e-3).unwrap(),
            clip_grad,
            None,
        )
    }

    #[test]
    fn an_invalid_clip_grad_is_an_error() {
        for bad in [0.0, -0.5, f64::NAN, f64::INFINITY] {
            let err = adamw(bad).err().expect("an invalid clip_grad is refused");
            match &err {
                TrainerError::InvalidClipNorm { key, value } => {
                    assert_eq!(*key, "optimizer.clip_grad");
                    assert!(value.to_bits() == bad.to_bits(), "{value} vs {bad}");
                }
                other => panic!("clip_grad = {bad}: {other}"),
            }
            let msg = err.to_string();
            assert!(
                msg.contains(&format!("optimizer.clip_grad = {bad}"))
                    && msg.contains("finite value > 0"),
                "{msg}"
            );
        }
        let opt = adamw(1.0).unwrap();
        assert_eq!((opt.policy_version(), opt.optimizer_steps()), (0, 0));
    }
}
