//! The generic RL run: every phase written once, over three seams — the world
//! ([`World`]: prompts, encoder, policy, decoder, scorers), the algorithm ([`Algorithm`]: what
//! is frozen before the updates and the per-micro-batch loss) and the workers ([`Workers`]:
//! ranks, collectives, host threads). No phase names a world, an objective or a device count.
//!
//! One rollout, as seed 002's "One training step" describes it, each phase a method with its
//! own tests:
//!
//! ```text
//! prompts ──encode──> conditioning ──┐
//! (seed, rollout, sample id) ─> x_T ─┴─ rollout: ODE solver, kernel on the trained steps
//!      ──> trajectory sidecars (latents at the storage precision, log-probs, conditioning)
//!      ──> decode ──> samples ──score──> components ──> advantages (per prompt group)
//!      ──> freeze (pi_old anchor: replay under the current weights)
//!      ──> updates: replay through the live policy ──> loss ──> grads ──> all-reduce
//!          ──> global clip ──> AdamW
//!      ──> evaluate (held-out prompts, fixed seeds, no SDE steps) ──> checkpoint
//! ```
//!
//! 1. [`Run::rollout`]: the rollout's trained SDE steps are resolved once; every prompt
//!    group's candidates get distinct sample ids, hence distinct `x_T` and per-step noise
//!    (`noise-recipe`); the kernel runs on the trained steps and the deterministic solver
//!    elsewhere; one trajectory sidecar per group and one PNG per candidate are written (old
//!    rollouts reaped by retention) and the sidecars are read back, validated, for replay.
//! 2. [`Run::score`]: the world's scorers on every sample, grouped by prompt; a missing or
//!    non-finite value fails that group in the next phase, not the run.
//! 3. [`advantages`](crate::advantages): group-relative advantages (flow-grpo).
//! 4. [`Run::train`]: the algorithm freezes what the updates compare against (FlowGRPO: the
//!    pi_old anchor, a replay under the current weights before any optimizer step), then each
//!    of the plan's disjoint updates accumulates the algorithm's micro-batch losses and steps.
//! 5. [`Run::evaluate`]: deterministic sampling of the world's held-out prompts with fixed
//!    seeds, scored by the same scorers; mean, standard error and per-category means; a
//!    sample grid into the run directory.
//! 6. [`Run::checkpoint`]: the crash-safe checkpoint of the trainable weights, optimizer,
//!    RNG and trainer state; [`Run::new`] resumes from the last committed one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::module::{AutodiffModule, Module};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};
use dit_models::AdapterContract;
use flow_grpo::{Advantages, RewardGroup, UpdatePlan};
use noise_recipe::{DenoiseSeeds, NoiseAlgorithm, NoiseRecipe, PromptMeta, SampleId, SampleIdMode};
use reward::RgbImage;
use schedule::{PlanQuery, SdeStepPlan, SdeSteps};
use sde_math::Kernel;
use trajectory::{
    ArtifactLayout, Candidate, Common, Digest, Retention, Split, Tracks, Trajectory, read_sidecar,
    sampling_fingerprint, write_sidecar,
};

use crate::algorithm::{Algorithm, Recording};
use crate::checkpoint::{
    CheckpointStore, CommittedCheckpoint, EMA_AVERAGE_FILE, EMA_FILE, SAMPLER_FILE, SavedDtype,
    TrainerState,
};
use crate::config::{CheckpointFailurePolicy, EvalGuidance, Preflight, TrainConfig};
use crate::ema::{Ema, blend};
use crate::error::{CheckpointProblem, DrawingProblem, TrainerError, io_err};
use crate::monitor::{
    Metrics, Monitor, Progress, before_after_grid, grid_tile, names, sample_grid, upscale,
    write_png, write_reward_curve,
};
use crate::rng::TrainerRng;
use crate::rollout::{SamplerSpec, sample_in_chunks};
use crate::run_dir::{self, RunLock, StartFrom};
use crate::signal::StopFlag;
use crate::train::{
    AdamWOptimizer, PolicyOptimizer, UpdateReport, advantage_metrics, failure_messages,
    train_step_threads,
};
use crate::value::{VALUE_FILES, ValueBaseline, ValueStep, prompt_features, value_rows};
use crate::workers::Workers;
use crate::world::{Inner, World};
use velocity_model::{Conditioning, Guided, TrueCfg, VelocityModel};

/// Columns of the evaluation's sample grids.
const GRID_COLUMNS: u32 = 8;

/// The tag of the evaluation before the first rollout.
const INITIAL_EVAL_TAG: &str = "initial";

/// The sample grid of the evaluation tagged `tag`, in [`run_dir::SAMPLES_DIR`].
fn eval_grid_file(tag: &str) -> String {
    format!("eval_{tag}.png")
}

/// Rows one host thread samples at once in an evaluation.
pub const EVAL_ROWS_PER_THREAD: usize = 32;

/// The metric of the held-out evaluation's mean reward.
pub const EVAL_REWARD: &str = "eval/reward";
/// The narrowest a tile of an evaluation's sample grid is drawn (smaller pictures are
/// enlarged by a whole factor, nearest neighbour), so that its caption fits.
const GRID_TILE_MIN: u32 = 128;

/// The metric of its standard error ([`EvalReport::stderr`]).
pub const EVAL_REWARD_SE: &str = "eval/reward_se";

/// Under `eval.sde_gap`: the mean reward of the same held-out pictures sampled with the
/// rollouts' SDE transitions.
pub const EVAL_SDE_REWARD: &str = "eval/sde_reward";
/// Its standard error.
pub const EVAL_SDE_REWARD_SE: &str = "eval/sde_reward_se";
/// The deterministic pictures' reward minus the SDE pictures'.
pub const EVAL_SDE_GAP: &str = "eval/sde_gap";

/// `eval/category/<category>`, the held-out mean of one category.
pub fn eval_category(category: &str) -> String {
    format!("eval/category/{category}")
}

/// One rollout, held in memory for scoring and replay.
#[derive(Debug, Clone)]
pub struct RolloutBatch<S> {
    /// The rollout id.
    pub rollout_id: u64,
    /// One prompt per group.
    pub prompts: Vec<String>,
    /// The trained steps of this rollout.
    pub trained: Vec<usize>,
    /// One record per group, read back from its sidecar.
    pub trajectories: Vec<Trajectory>,
    /// The decoded samples, group-major (`group * group_size + slot`).
    pub samples: Vec<S>,
}

impl<S> RolloutBatch<S> {
    /// Candidates per group.
    pub fn group_size(&self) -> usize {
        self.samples.len() / self.prompts.len().max(1)
    }
}

/// What [`Run::evaluate`] measured.
#[derive(Debug, Clone)]
pub struct EvalReport {
    /// The mean reward over every held-out sample (the config's weighted combination of the
    /// raw components).
    pub reward: f64,
    /// The standard error of `reward` over the evaluation's seeds: with `k >= 2` seeds per
    /// prompt, `sqrt(sum_p s_p^2 / k) / P` (the prompts are fixed, the seeds random; `s_p^2`
    /// is prompt `p`'s sample variance over its seeds); with one seed, `s / sqrt(n)` over all
    /// samples.
    pub stderr: f64,
    /// The mean per held-out category.
    pub by_category: BTreeMap<String, f64>,
    /// Samples scored.
    pub samples: usize,
    /// The pictures of the first sample of each prompt, for the grid.
    pub images: Vec<RgbImage>,
    /// Wall-clock seconds of the evaluation (sampling, scoring, the grid).
    pub seconds: f64,
    /// The mean and standard error of every component of `eval.judges`' scorers over the
    /// same samples.
    pub judges: BTreeMap<String, (f64, f64)>,
    /// Under `eval.sde_gap`: the mean reward and its standard error of the same prompts and
    /// initial noise sampled with the rollouts' SDE transitions.
    pub sde: Option<(f64, f64)>,
}

impl EvalReport {
    /// The evaluation's metrics: `eval/reward`, `eval/reward_se`, `eval/category/<c>`,
    /// `eval/judge/<component>` and `eval/judge/<component>_se`, `perf/eval_time`, and under
    /// `eval.sde_gap` `eval/sde_reward`, `eval/sde_reward_se` and `eval/sde_gap`.
    pub fn metrics(&self) -> Metrics {
        let mut m = Metrics::from([
            (EVAL_REWARD.to_string(), self.reward),
            (EVAL_REWARD_SE.to_string(), self.stderr),
            (names::phase_time("eval"), self.seconds),
        ]);
        for (c, v) in &self.by_category {
            m.insert(eval_category(c), *v);
        }
        for (c, (mean, se)) in &self.judges {
            m.insert(names::eval_judge(c), *mean);
            m.insert(format!("{}_se", names::eval_judge(c)), *se);
        }
        if let Some((mean, se)) = self.sde {
            m.insert(EVAL_SDE_REWARD.to_string(), mean);
            m.insert(EVAL_SDE_REWARD_SE.to_string(), se);
            m.insert(EVAL_SDE_GAP.to_string(), self.reward - mean);
        }
        m
    }

    /// Its mean and standard error, and the second judge's.
    pub fn summary(&self) -> EvalSummary {
        EvalSummary {
            reward: self.reward,
            stderr: self.stderr,
            second: self.judges.values().next().copied(),
        }
    }
}

/// What [`Run::train`] did.
#[derive(Debug, Clone)]
pub struct TrainReport<D> {
    /// One report per update.
    pub updates: Vec<UpdateReport<D>>,
    /// The algorithm's metrics of what it froze (FlowGRPO: `train/logp_parity_max_abs`), and
    /// the sampling copy's soft update (`train/sampler_decay`).
    pub frozen: Metrics,
}

/// The whole run's outcome.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// Held-out evaluation of the starting policy (before any update of this run).
    pub initial_eval: Option<EvalSummary>,
    /// Held-out evaluation at the end.
    pub final_eval: Option<EvalSummary>,
    /// The last completed rollout.
    pub last_rollout: Option<u64>,
    /// Whether a stop request ended the run early.
    pub stopped: bool,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// A decaying learning rate that the run ended before it reached `min_lr` (a run that
    /// was not stopped early): set `optimizer.lr_decay_iters` to the run's optimizer steps to
    /// decay over the whole run. `None` when the rate is constant or its decay finished.
    pub unfinished_decay: Option<UnfinishedDecay>,
}

/// A decaying learning rate left part-way at the end of a run ([`RunSummary::unfinished_decay`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UnfinishedDecay {
    /// The optimizer steps the run took.
    pub optimizer_steps: u64,
    /// `optimizer.lr_decay_iters`: the step at which the decay reaches `min_lr`.
    pub decay_iters: u64,
    /// The rate the next step would have taken.
    pub lr: f64,
    /// `optimizer.min_lr`.
    pub min_lr: f64,
}

impl std::fmt::Display for UnfinishedDecay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the run ended at optimizer step {} with the rate at {:.3e}, where \
             optimizer.lr_decay_iters = {} decays it to min_lr {} later: set \
             optimizer.lr_decay_iters = {} to decay over the whole run",
            self.optimizer_steps, self.lr, self.decay_iters, self.min_lr, self.optimizer_steps
        )
    }
}

/// The decay `scheduler` has left at its step count, if its rate decays and has not reached
/// `min_lr` yet.
fn unfinished_decay(scheduler: &crate::lr::LrScheduler) -> Option<UnfinishedDecay> {
    let schedule = scheduler.schedule();
    let decay_iters = match schedule.decay() {
        crate::lr::LrDecay::Constant => return None,
        crate::lr::LrDecay::Linear { decay_iters } | crate::lr::LrDecay::Cosine { decay_iters } => {
            decay_iters
        }
    };
    (scheduler.steps() < decay_iters).then(|| UnfinishedDecay {
        optimizer_steps: scheduler.steps(),
        decay_iters,
        lr: scheduler.current_lr(),
        min_lr: schedule.min_lr(),
    })
}

/// An evaluation's mean and standard error.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalSummary {
    /// The mean held-out reward.
    pub reward: f64,
    /// Its standard error ([`EvalReport::stderr`]).
    pub stderr: f64,
    /// The second judgement's mean and standard error: the first component, by name, of
    /// `eval.judges` ([`EvalReport::judges`]); `None` without judges.
    pub second: Option<(f64, f64)>,
}

/// What a rollout's sampling fingerprint covers besides the sigmas: a sidecar sampled with
/// another kernel, solver, storage precision, noise level or group geometry has another
/// fingerprint.
#[derive(Debug, serde::Serialize)]
struct SamplingFingerprint {
    kernel: String,
    solver: &'static str,
    storage: String,
    eta: f64,
    steps: usize,
    group_size: usize,
}

/// What the algorithm hooks see of the run during [`Run::train`].
pub struct TrainContext<'a, B: AutodiffBackend, W: World<B>> {
    /// The world (to restore conditionings from the trajectories).
    pub world: &'a W,
    /// How the rollout was sampled (the replay uses the same kernel).
    pub spec: &'a SamplerSpec,
    /// The rollout's update plan.
    pub plan: &'a UpdatePlan,
    /// The rollout.
    pub batch: &'a RolloutBatch<W::Sample>,
    /// Its advantages.
    pub advantages: &'a Advantages,
    /// The device.
    pub device: &'a B::Device,
    /// Host threads available.
    pub threads: usize,
    /// The EMA copy of the policy, when the run keeps one (`[ema]`), as of the start of the
    /// rollout's updates.
    pub ema: Option<&'a W::Policy>,
    /// The sampling copy of the policy that sampled the rollout, when the algorithm keeps one
    /// ([`Algorithm::sampling_copy`]).
    pub sampling_copy: Option<&'a W::Policy>,
    /// The frozen pretrained copy of the policy, when the policy carries no reference of its
    /// own ([`World::has_reference`] is false) and the algorithm uses one: what
    /// [`TrainContext::reference_velocity`] evaluates instead of the world.
    pub reference: Option<&'a W::Policy>,
    /// With a learned value baseline ([`Algorithm::value_baseline`]): one advantage per
    /// (sample, trained step) of the rollout, `[samples, trained steps]` row-major, `r - V`
    /// for a sample whose reward is finite and 0 for one whose group failed.
    pub value_advantages: Option<&'a [f32]>,
}

impl<B: AutodiffBackend, W: World<B>> TrainContext<'_, B, W> {
    /// The reference policy's velocity at `(x, sigma, cond)`, detached: the frozen pretrained
    /// copy's where the run keeps one, else the world's ([`World::reference_velocity`], e.g.
    /// `policy` with its adapters off).
    ///
    /// # Errors
    /// The world's ([`TrainerError::NoReference`] for a policy without a reference).
    pub fn reference_velocity(
        &self,
        policy: &W::Policy,
        x: Tensor<B, 3>,
        sigma: Tensor<B, 1>,
        cond: &W::Cond<B>,
    ) -> Result<Tensor<B, 3>, TrainerError> {
        match self.reference {
            Some(copy) => Ok(copy.velocity(x, sigma, cond).detach()),
            None => self.world.reference_velocity(policy, x, sigma, cond),
        }
    }
}

type Optim<B, M> = PolicyOptimizer<B, M, AdamWOptimizer<B, M>>;

/// The generic run. See the module docs.
pub struct Run<B, W, A, K>
where
    B: AutodiffBackend,
    W: World<B>,
    A: Algorithm<B, W>,
    K: Workers,
{
    cfg: TrainConfig,
    pre: Preflight,
    device: B::Device,
    world: W,
    algorithm: A,
    workers: K,
    model: Option<W::Policy>,
    /// The EMA copy of the policy (`[ema]`).
    ema: Option<Ema<W::Policy>>,
    /// The sampling copy of the policy ([`Algorithm::sampling_copy`]).
    sampler: Option<W::Policy>,
    /// The frozen pretrained copy of a policy that carries no reference of its own
    /// ([`World::has_reference`]), when the algorithm measures drift from the reference.
    reference: Option<W::Policy>,
    /// The learned value baseline ([`Algorithm::value_baseline`]).
    value: Option<ValueBaseline<B>>,
    optimizer: Optim<B, W::Policy>,
    contract: Option<AdapterContract>,
    spec: SamplerSpec,
    /// The evaluations' sampler: `spec` at `eval.num_inference_steps`.
    eval_spec: SamplerSpec,
    rng: TrainerRng,
    next_rollout: u64,
    monitor: Monitor,
    store: CheckpointStore,
    layout: ArtifactLayout,
    run_dir: PathBuf,
    weight_hash: Digest,
    /// Checkpoint writes that failed and were retried (restored on resume).
    checkpoint_failures: u64,
    /// The stop request of the current [`Run::run`], checked inside sampling and training.
    stop: StopFlag,
    /// The run directory's lock (and those of checkpoint and artifact roots outside it), held
    /// for the run's life by the IO rank (the other ranks of a multi-rank run write no shared
    /// file and hold none).
    _locks: Option<(RunLock, Vec<RunLock>)>,
    /// The committed checkpoint this run resumed from, if any (what [`Run::follow`] hands the
    /// other ranks).
    resumed_from: Option<CommittedCheckpoint>,
}

impl<B, W, A, K> Run<B, W, A, K>
where
    B: AutodiffBackend,
    W: World<B>,
    A: Algorithm<B, W>,
    K: Workers,
{
    /// Locks and checks the run directory ([`run_dir::prepare`]: nothing is written into a
    /// locked directory, a directory holding another run, or for a resume that changed the
    /// experiment), loads the world's policy, attaches the adapter, and resumes from the
    /// chosen committed checkpoint when `checkpoint.resume` is set, after checking the metric
    /// files it keeps. Then writes the resolved config into `run_dir`.
    ///
    /// # Errors
    /// The run directory's refusals ([`run_dir::prepare`]), policy loading,
    /// [`TrainerError::ResumeFailed`] for a checkpoint that cannot be loaded (naming the older
    /// committed ones), metric-file, checkpoint and IO errors.
    pub fn new(
        cfg: TrainConfig,
        pre: Preflight,
        run_dir: &Path,
        device: B::Device,
        world: W,
        algorithm: A,
        workers: K,
    ) -> Result<Self, TrainerError> {
        let (store, layout) = stores(&cfg)?;
        if !workers.is_io_rank() {
            return Err(TrainerError::Collective {
                rank: workers.rank(),
                world_size: workers.world_size(),
                operation: "start the run".into(),
                cause: "only the IO rank prepares the run directory; the others start with \
                        Run::follow, from what it chose"
                    .into(),
            });
        }
        let prepared = run_dir::prepare(run_dir, &cfg, &store, &layout)?;
        if let Some(holder) = &prepared.stale {
            println!(
                "note: the lock of {} still named {holder}, which no longer holds it (that run \
                 was killed or its machine stopped); taking it over",
                run_dir.display()
            );
        }
        if let Some(dest) = &prepared.moved_to {
            println!(
                "moved the previous run in {} aside into {}",
                run_dir.display(),
                dest.display()
            );
        }
        for c in &prepared.changes {
            println!("resuming with an allowed config change: {c}");
        }
        Self::assemble(
            cfg,
            pre,
            run_dir,
            device,
            world,
            algorithm,
            workers,
            (store, layout),
            prepared.start,
            Some((prepared.lock, prepared.shared_locks)),
        )
    }

    /// A rank other than the IO rank of a multi-rank run: starts where the IO rank's
    /// [`Run::new`] chose to (`resumed_from`: the iteration of the committed checkpoint that
    /// run resumed from, [`crate::ranks::agree_start`]), reading the checkpoint from its own
    /// `checkpoint.dir` (on several machines, a shared filesystem) and writing nothing shared —
    /// no lock, no metrics, no resolved config, no checkpoint; it rolls out, scores and trains
    /// its share of every rollout.
    ///
    /// # Errors
    /// As [`Run::new`]; [`TrainerError::Collective`] when called on the IO rank, or when the
    /// checkpoint the IO rank resumed from is not in this rank's checkpoint directory.
    #[allow(clippy::too_many_arguments)]
    pub fn follow(
        cfg: TrainConfig,
        pre: Preflight,
        run_dir: &Path,
        device: B::Device,
        world: W,
        algorithm: A,
        workers: K,
        resumed_from: Option<u64>,
    ) -> Result<Self, TrainerError> {
        if workers.is_io_rank() {
            return Err(TrainerError::Collective {
                rank: workers.rank(),
                world_size: workers.world_size(),
                operation: "start the run".into(),
                cause: "the IO rank starts with Run::new".into(),
            });
        }
        let (store, layout) = stores(&cfg)?;
        let start = match resumed_from {
            Some(iteration) => StartFrom::Checkpoint {
                checkpoint: store
                    .committed()?
                    .into_iter()
                    .find(|c| c.iteration == iteration)
                    .ok_or_else(|| TrainerError::Collective {
                        rank: workers.rank(),
                        world_size: workers.world_size(),
                        operation: "start the run".into(),
                        cause: format!(
                            "rank 0 resumed from checkpoint {iteration}, which is not committed \
                             in {} here (ranks on several machines need the checkpoint \
                             directory on a shared filesystem)",
                            store.task_dir().display()
                        ),
                    })?,
                older: Vec::new(),
                newer: Vec::new(),
            },
            None => StartFrom::Scratch,
        };
        Self::assemble(
            cfg,
            pre,
            run_dir,
            device,
            world,
            algorithm,
            workers,
            (store, layout),
            start,
            None,
        )
    }

    /// The committed checkpoint this run resumed from (`None` from scratch).
    pub fn resumed_from(&self) -> Option<&CommittedCheckpoint> {
        self.resumed_from.as_ref()
    }

    /// The run after its directory is prepared (the IO rank) or its start is known (the
    /// others): the policy loaded and adapted, the checkpoint restored.
    #[allow(clippy::too_many_arguments)]
    fn assemble(
        cfg: TrainConfig,
        pre: Preflight,
        run_dir: &Path,
        device: B::Device,
        world: W,
        algorithm: A,
        workers: K,
        (store, layout): (CheckpointStore, ArtifactLayout),
        start: StartFrom,
        locks: Option<(RunLock, Vec<RunLock>)>,
    ) -> Result<Self, TrainerError> {
        let io = workers.is_io_rank();
        if pre.ranks != workers.world_size() {
            return Err(TrainerError::Collective {
                rank: workers.rank(),
                world_size: workers.world_size(),
                operation: "start the run".into(),
                cause: format!(
                    "the preflight plans for {} ranks (Preflight::for_ranks)",
                    pre.ranks
                ),
            });
        }
        let loaded = world.load_policy(&pre.trainable, cfg.run.seed, &device)?;
        // a policy that carries no reference of its own (a full fine-tune: no adapters to
        // switch off) gets a frozen copy of its pretrained weights, taken before any
        // checkpoint is restored, so that a resumed run measures drift from the same model
        let reference = match algorithm.reference_keys() {
            Some(keys) if !world.has_reference(&loaded.model) => {
                if io {
                    println!(
                        "{keys}: the policy has no adapters to switch off, so the run keeps a \
                         frozen copy of the pretrained weights as the reference (one more copy \
                         of the model in memory)"
                    );
                }
                Some(loaded.model.clone().no_grad())
            }
            _ => None,
        };
        if let Some(keys) = algorithm.ema_keys()
            && pre.ema.is_none()
        {
            return Err(TrainerError::NoEma { keys });
        }
        let mut model = loaded.model;
        let contract = loaded.contract;
        let mut optimizer = Optim::<B, W::Policy>::adamw(
            &pre.adamw,
            pre.lr,
            cfg.optimizer.clip_grad,
            cfg.model.master_dtype,
        )?;
        let mut rng = TrainerRng::seeded(cfg.run.seed);
        let mut next_rollout = 0;
        let mut cursor = None;
        let mut checkpoint_failures = 0;
        let mut ema = pre.ema.map(|settings| Ema::new(model.clone(), settings));
        let mut sampler = algorithm.sampling_copy().map(|_| model.clone());
        let mut value = match algorithm.value_baseline() {
            None => None,
            Some(settings) => {
                let features = value_features::<B, W>(&world, &device)?;
                let steps = pre.schedule.sigmas.as_slice().len().saturating_sub(1);
                Some(ValueBaseline::new(
                    settings,
                    features,
                    steps,
                    cfg.run.seed,
                    &device,
                )?)
            }
        };
        let mut resumed_from = None;
        match start {
            StartFrom::Scratch => {
                if cfg.checkpoint.resume {
                    println!(
                        "no committed checkpoint in {}: starting from scratch \
                         (checkpoint.allow_fresh)",
                        store.task_dir().display()
                    );
                }
            }
            StartFrom::Checkpoint {
                checkpoint,
                older,
                newer,
            } => {
                let r = store
                    .load(
                        &checkpoint,
                        model,
                        optimizer.optimizer().clone(),
                        contract.as_ref(),
                        &device,
                    )
                    .and_then(|r| {
                        let restored_ema = match ema.take() {
                            Some(e) => {
                                let model = store.load_copy::<B, _>(
                                    &checkpoint,
                                    EMA_FILE,
                                    r.model.clone(),
                                    SavedDtype::Exact,
                                )?;
                                // the f32 average, where one is kept (a checkpoint from
                                // before averages were kept apart has none)
                                let average = match e.average_skeleton::<B>(r.model.clone()) {
                                    Some(skeleton) => match store.load_copy::<B, _>(
                                        &checkpoint,
                                        EMA_AVERAGE_FILE,
                                        skeleton,
                                        SavedDtype::Exact,
                                    ) {
                                        Ok(average) => Some(average),
                                        Err(TrainerError::Checkpoint {
                                            problem: CheckpointProblem::MissingFile { .. },
                                            ..
                                        }) => None,
                                        Err(err) => return Err(err),
                                    },
                                    None => None,
                                };
                                Some(Ema::restored::<B>(model, average, e.settings))
                            }
                            None => None,
                        };
                        let restored_sampler = match sampler.take() {
                            Some(_) => Some(store.load_copy::<B, _>(
                                &checkpoint,
                                SAMPLER_FILE,
                                r.model.clone(),
                                SavedDtype::Exact,
                            )?),
                            None => None,
                        };
                        let restored_value = match value.take() {
                            Some(v) => {
                                let mut files = BTreeMap::new();
                                for name in VALUE_FILES {
                                    if let Some(bytes) = store.read_file(&checkpoint, name)? {
                                        files.insert(name, bytes);
                                    }
                                }
                                Some(v.restored(|name| files.get(name).cloned(), &device)?)
                            }
                            None => None,
                        };
                        // the readable copy holds what the run hands out: the EMA if any
                        let handed_out = restored_ema.as_ref().map_or(&r.model, |e| &e.model);
                        check_readable_copy(&world, handed_out, &checkpoint.dir)?;
                        Ok((r, restored_ema, restored_sampler, restored_value))
                    })
                    .map_err(|cause| TrainerError::ResumeFailed {
                        dir: checkpoint.dir.clone(),
                        older,
                        cause: Box::new(cause),
                    })?;
                let (r, restored_ema, restored_sampler, restored_value) = r;
                ema = restored_ema;
                sampler = restored_sampler;
                value = restored_value;
                if io {
                    Monitor::check_resume(
                        run_dir,
                        r.state.metrics_cursor,
                        cfg.monitor.jsonl,
                        cfg.monitor.tensorboard,
                    )?;
                    if let Some(dest) = run_dir::set_aside_newer(&store, &newer)? {
                        println!(
                            "moved the checkpoints newer than {} aside into {}",
                            checkpoint.iteration,
                            dest.display()
                        );
                    }
                    println!(
                        "resuming from committed checkpoint {} (next rollout {})",
                        r.checkpoint.iteration,
                        r.state.next_rollout_id()
                    );
                }
                resumed_from = Some(checkpoint.clone());
                optimizer.set_optimizer(r.optimizer);
                optimizer.restore(&r.state);
                model = r.model;
                rng = r.rng;
                next_rollout = r.state.next_rollout_id();
                cursor = Some(r.state.metrics_cursor);
                checkpoint_failures = r.state.checkpoint_failures;
            }
        }
        let monitor = if io {
            cfg.save_resolved(run_dir)?;
            Monitor::open(run_dir, cursor, cfg.monitor.jsonl, cfg.monitor.tensorboard)?
        } else {
            // the other ranks log nothing: a monitor without files
            Monitor::open(run_dir, None, false, false)?
        };
        let spec = SamplerSpec {
            sigmas: pre.schedule.sigmas.as_slice().to_vec(),
            // eta 0 (preflight allows it only for ODE rollouts): every step runs the solver
            kernel: if cfg.sampling.eta == 0.0 {
                None
            } else {
                Some(match pre.sde {
                    schedule::SdeType::FlowSde => Kernel::flow_sde(cfg.sampling.eta as f32)?,
                    schedule::SdeType::Dance => Kernel::dance(cfg.sampling.eta as f32)?,
                    schedule::SdeType::Cps => Kernel::cps(cfg.sampling.eta as f32)?,
                    schedule::SdeType::Churn => Kernel::churn(cfg.sampling.eta as f32)?,
                })
            },
            solver: cfg.sampling.solver.solver(),
            storage: cfg.sampling.storage_dtype.dtype(),
        };
        let eval_spec = SamplerSpec {
            sigmas: pre.eval_schedule.sigmas.as_slice().to_vec(),
            ..spec.clone()
        };
        Ok(Self {
            cfg,
            pre,
            device,
            world,
            algorithm,
            workers,
            model: Some(model),
            ema,
            sampler,
            reference,
            value,
            optimizer,
            contract,
            spec,
            eval_spec,
            rng,
            next_rollout,
            monitor,
            store,
            layout,
            run_dir: run_dir.to_path_buf(),
            weight_hash: loaded.weight_hash,
            checkpoint_failures,
            stop: StopFlag::new(),
            _locks: locks,
            resumed_from,
        })
    }

    /// Calls `hook` after each durable step of every checkpoint write (crash tests slow the
    /// write window down with it).
    pub fn with_checkpoint_hook(mut self, hook: crate::checkpoint::WriteHook) -> Self {
        self.store = self.store.with_write_hook(hook);
        self
    }

    /// The policy.
    pub fn model(&self) -> &W::Policy {
        self.model
            .as_ref()
            .expect("the model is only taken during an update")
    }

    /// The EMA copy of the policy, when the run keeps one (`[ema]`).
    pub fn ema_model(&self) -> Option<&W::Policy> {
        self.ema.as_ref().map(|e| &e.model)
    }

    /// The policy the run hands out: what evaluations sample with, and checkpoints' readable
    /// files and exports hold — the EMA copy under `[ema]`, else the policy.
    pub fn handed_out(&self) -> &W::Policy {
        self.ema_model().unwrap_or_else(|| self.model())
    }

    /// The workers (this rank, the collectives).
    pub fn workers(&self) -> &K {
        &self.workers
    }

    /// The algorithm.
    pub fn algorithm(&self) -> &A {
        &self.algorithm
    }

    /// The world.
    pub fn world(&self) -> &W {
        &self.world
    }

    /// The next rollout id.
    pub fn next_rollout(&self) -> u64 {
        self.next_rollout
    }

    /// The sampler of the rollouts (schedule, kernel, solver, storage precision).
    pub fn sampler(&self) -> &SamplerSpec {
        &self.spec
    }

    /// The sampler of the evaluations: the rollouts', at `eval.num_inference_steps` when set.
    pub fn eval_sampler(&self) -> &SamplerSpec {
        &self.eval_spec
    }

    fn base_seed(&self, rollout_id: u64) -> u64 {
        self.cfg.run.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ rollout_id.wrapping_mul(0xD1B5_4A32_D192_ED03)
    }

    /// The mean-reward metric of the first required component (`reward/<c>_mean`), the one
    /// the progress line and the reward curve show.
    fn reward_metric(&self) -> String {
        let first = self
            .cfg
            .reward
            .required_components
            .first()
            .map_or("reward", String::as_str);
        names::reward_component(first, "mean")
    }

    /// Phase 1: samples every group's candidates, writes the sidecars and PNGs, reads the
    /// sidecars back.
    ///
    /// # Errors
    /// Sampling, noise, artifact IO and record validation errors.
    pub fn rollout(
        &self,
        rollout_id: u64,
        prompts: &[String],
    ) -> Result<RolloutBatch<W::Sample>, TrainerError> {
        let groups: Vec<usize> = (0..prompts.len()).collect();
        self.rollout_groups(rollout_id, prompts, &groups)
    }

    /// [`Run::rollout`] of this rank's share of a rollout: `prompts[i]` is the rollout's
    /// prompt group `groups[i]`, whose index keys its candidates' sample ids (hence their
    /// `x_T` and noise) and names its sidecar and pictures, so that a share sampled on any
    /// rank is what one rank sampling every group would have drawn. The IO rank clears and
    /// reaps the rollout's directory; the others wait for it before writing into it.
    ///
    /// # Errors
    /// As [`Run::rollout`], and a failed barrier.
    pub fn rollout_groups(
        &self,
        rollout_id: u64,
        prompts: &[String],
        groups: &[usize],
    ) -> Result<RolloutBatch<W::Sample>, TrainerError> {
        // the algorithm's sampling copy, else the policy
        let model = self
            .sampler
            .as_ref()
            .unwrap_or_else(|| self.model())
            .valid();
        let g = self.cfg.rollout.group_size;
        let dev = &self.device;
        let recording = self.algorithm.recording();
        let trained = self.pre.plan.steps(PlanQuery::rollout(rollout_id))?;
        // a deterministic rollout trains its steps as timesteps of the forward process
        let stochastic = match recording {
            Recording::OdeEndpoints => SdeSteps::new([]),
            _ => trained.clone(),
        };
        let retention = Retention::keep_last(self.cfg.artifacts.retention_rollouts);
        if self.workers.is_io_rank() {
            self.layout
                .begin_rollout(Split::Train, rollout_id, retention)?;
        }
        // the other ranks write into the rollout's directory once it is begun
        self.workers.barrier()?;
        let ids: Vec<SampleId> = prompts
            .iter()
            .enumerate()
            .flat_map(|(gi, p)| {
                let gi = groups[gi];
                (0..g).map(move |slot| {
                    SampleId::new(
                        SampleIdMode::Metadata,
                        gi,
                        PromptMeta {
                            prompt_id: Some(p),
                            sample_id: None,
                        },
                        slot,
                    )
                })
            })
            .collect();
        let base = self.base_seed(rollout_id);
        let latent_shape = self.world.latent_shape();
        // shared initial noise: every candidate draws the x_T of its group's first one
        let group_firsts: Vec<SampleId>;
        let noise_ids: &[SampleId] = if self.cfg.rollout.shared_initial_noise {
            group_firsts = (0..ids.len()).map(|i| ids[i - i % g].clone()).collect();
            &group_firsts
        } else {
            &ids
        };
        let x_t = NoiseRecipe::for_samples(
            base,
            latent_shape.to_vec(),
            noise_ids,
            NoiseAlgorithm::Pcg64BoxMuller,
        )?
        .generate()
        .to_tensor::<Inner<B>, 3>(dev)?;
        let seeds = DenoiseSeeds::for_samples(base ^ 0x57E9_0000_0000_0000, &ids)?;
        let all_prompts: Vec<&str> = prompts
            .iter()
            .flat_map(|p| std::iter::repeat_n(p.as_str(), g))
            .collect();
        let cond = self.world.encode(&all_prompts, dev)?;
        let stop = &self.stop;
        let out = sample_in_chunks(
            &model,
            &cond,
            x_t,
            &self.spec,
            &stochastic,
            self.workers.host_threads(),
            |step, rows| {
                // a stop request ends the sampling at the next trained step
                if stop.is_set() {
                    return Err(TrainerError::Stopped);
                }
                let n = rows.len();
                let v: Vec<f32> = rows
                    .flat_map(|i| seeds.noise(i, step, &latent_shape))
                    .collect();
                Ok(Tensor::from_data(
                    TensorData::new(v, [n, latent_shape[0], latent_shape[1]]),
                    dev,
                ))
            },
        )?;
        let samples = self.world.decode(out.final_latents.clone())?;

        // one sidecar per group (the conditioning stored as the sampler saw it)
        let fingerprint = sampling_fingerprint(
            &SamplingFingerprint {
                kernel: match &self.spec.kernel {
                    Some(k) => format!("{k:?}"),
                    None => "none (deterministic rollout)".into(),
                },
                solver: self.cfg.sampling.solver.as_str(),
                storage: format!("{:?}", self.spec.storage),
                eta: self.cfg.sampling.eta,
                steps: self.cfg.sampling.num_inference_steps,
                group_size: g,
            },
            &self.spec.sigmas,
        )?;
        let first_rows: Vec<usize> = (0..prompts.len()).map(|gi| gi * g).collect();
        let conditions = self.world.store_conditioning(&cond, &first_rows)?;
        let mut paths = Vec::with_capacity(prompts.len());
        for (gi, conditions) in conditions.into_iter().enumerate() {
            let rows = gi * g..(gi + 1) * g;
            let latents: Vec<Tensor<Inner<B>, 3>> = out
                .latents
                .iter()
                .map(|l| l.clone().slice([rows.clone()]))
                .collect();
            let log_probs: Vec<Tensor<Inner<B>, 1>> = out
                .log_probs
                .iter()
                .map(|l| l.clone().slice([rows.clone()]))
                .collect();
            let traj = Trajectory {
                common: Common {
                    task: self.cfg.run.task.clone(),
                    rollout_id,
                    group_index: groups[gi] as u64,
                    height: self.cfg.sampling.height,
                    width: self.cfg.sampling.width,
                    sigmas: self.spec.sigmas.clone(),
                    sde_indices: stochastic.as_slice().to_vec(),
                    storage: self.spec.storage,
                    sampling_fingerprint: fingerprint.clone(),
                    weight_manifest_hash: self.weight_hash.clone(),
                    candidates: (0..g)
                        .map(|slot| Candidate {
                            sample_id: ids[gi * g + slot].as_str().to_string(),
                            sample_index: slot as u64,
                            policy_version: self.optimizer.policy_version(),
                            seed_hash: seeds.seeds()[gi * g + slot],
                        })
                        .collect(),
                },
                conditions,
                tracks: {
                    let endpoint = || out.final_latents.clone().slice([rows.clone()]);
                    match recording {
                        Recording::SdeTransitions => {
                            Tracks::from_rollout(&latents, &log_probs, self.spec.storage)?
                        }
                        Recording::SdeTransitionsAndEndpoints => {
                            Tracks::from_rollout(&latents, &log_probs, self.spec.storage)?
                                .with_endpoint(endpoint(), self.spec.storage)?
                        }
                        Recording::OdeEndpoints => {
                            Tracks::endpoint_only(endpoint(), self.spec.storage)?
                        }
                    }
                },
            };
            let path = self
                .layout
                .sidecar_path(Split::Train, rollout_id, groups[gi] as u64);
            write_sidecar(&path, &traj)?;
            for slot in 0..g {
                if let Some(img) = self.world.image(&samples[gi * g + slot]) {
                    let png = self.layout.sample_image_path(
                        Split::Train,
                        rollout_id,
                        groups[gi] as u64,
                        slot as u32,
                    );
                    durable::write_atomic(&png, &img.to_png()?)?;
                }
            }
            paths.push(path);
        }
        let trajectories = paths
            .iter()
            .map(|p| read_sidecar(p))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(RolloutBatch {
            rollout_id,
            prompts: prompts.to_vec(),
            trained: trained.as_slice().to_vec(),
            trajectories,
            samples,
        })
    }

    /// Phase 2: scores the samples and groups the components by prompt.
    ///
    /// # Errors
    /// Scorer errors that concern the whole batch (a group's missing or non-finite value is
    /// not an error here: the advantages phase fails that group).
    pub fn score(&self, batch: &RolloutBatch<W::Sample>) -> Result<Vec<RewardGroup>, TrainerError> {
        let g = batch.group_size();
        let prompts: Vec<String> = batch
            .prompts
            .iter()
            .flat_map(|p| std::iter::repeat_n(p.clone(), g))
            .collect();
        let scores = self.world.score(&batch.samples, &prompts)?;
        if scores.len() != prompts.len() {
            return Err(TrainerError::ScoreCount {
                expected: prompts.len(),
                found: scores.len(),
            });
        }
        Ok(batch
            .prompts
            .iter()
            .enumerate()
            .map(|(gi, p)| RewardGroup {
                prompt_key: p.clone(),
                samples: scores[gi * g..(gi + 1) * g]
                    .iter()
                    .map(|c| c.iter().map(|(k, v)| (k.to_string(), v)).collect())
                    .collect(),
            })
            .collect())
    }

    /// With several ranks: checks that every rank holds the same trainable weights (a hash of
    /// their bits in visit order, gathered), since replicas that start apart stay apart —
    /// every rank steps with the same all-reduced gradient. One rank: nothing.
    ///
    /// # Errors
    /// [`TrainerError::Collective`] naming the first rank whose weights differ from rank 0's;
    /// failed collectives.
    pub fn check_replicas(&self) -> Result<(), TrainerError> {
        let w = self.workers.world_size();
        if w == 1 {
            return Ok(());
        }
        let mut hash = TrainableHash::<B> {
            hasher: xxhash_rust::xxh3::Xxh3::new(),
            tensors: 0,
            _b: std::marker::PhantomData,
        };
        burn::module::Module::visit(self.model(), &mut hash);
        let mine = [f64::from_bits(hash.hasher.digest()), hash.tensors as f64];
        let all = self.workers.all_gather(&mine)?;
        if let Some(other) = all
            .iter()
            .position(|v| v[0].to_bits() != all[0][0].to_bits() || v[1] != all[0][1])
        {
            return Err(TrainerError::Collective {
                rank: self.workers.rank(),
                world_size: w,
                operation: "check the replicas".into(),
                cause: format!(
                    "rank {other} starts with other trainable weights than rank 0 ({} against \
                     {} trainable tensors, or their values): replicas must start equal",
                    all[other][1], all[0][1]
                ),
            });
        }
        Ok(())
    }

    /// Every rank's reward groups, in the rollout's group order (`prompts` are the rollout's
    /// prompts, one per group): this rank's `mine` (of its [`Workers::group_shard`]) and the
    /// others', gathered bit for bit. Each sample carries the configured components (present
    /// or not, and the value); a component the advantages do not read is not gathered. One
    /// rank: `mine` unchanged.
    ///
    /// # Errors
    /// A failed collective.
    pub fn gather_groups(
        &self,
        mine: Vec<RewardGroup>,
        prompts: &[String],
    ) -> Result<Vec<RewardGroup>, TrainerError> {
        let w = self.workers.world_size();
        if w == 1 {
            return Ok(mine);
        }
        let names: Vec<&str> = self
            .pre
            .advantages
            .components
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        let encoded: Vec<f64> = mine
            .iter()
            .flat_map(|group| group.samples.iter())
            .flat_map(|sample| {
                names.iter().flat_map(|name| match sample.get(*name) {
                    Some(v) => [1.0, *v],
                    None => [0.0, 0.0],
                })
            })
            .collect();
        let all = self.workers.all_gather(&encoded)?;
        let g = self.cfg.rollout.group_size;
        let updates = self.pre.batch.num_updates_per_batch;
        let mut groups: Vec<Option<RewardGroup>> = vec![None; prompts.len()];
        for (rank, values) in all.iter().enumerate() {
            let shard = crate::workers::shard_of(prompts.len(), updates, w, rank)?;
            let per_sample = 2 * names.len();
            for (local, &gi) in shard.iter().enumerate() {
                let samples = (0..g)
                    .map(|slot| {
                        let at = (local * g + slot) * per_sample;
                        names
                            .iter()
                            .enumerate()
                            .filter(|(k, _)| values[at + 2 * k] != 0.0)
                            .map(|(k, name)| (name.to_string(), values[at + 2 * k + 1]))
                            .collect()
                    })
                    .collect();
                groups[gi] = Some(RewardGroup {
                    prompt_key: prompts[gi].clone(),
                    samples,
                });
            }
        }
        Ok(groups
            .into_iter()
            .map(|g| g.expect("the shards cover every group"))
            .collect())
    }

    /// Phase 4: with a learned value baseline, its fit on the rollout and the rollout's
    /// per-step advantages; then the algorithm freezes what the updates compare against
    /// (before any optimizer step), and the planned updates run.
    ///
    /// `rewards` are the rollout samples' combined raw rewards (group-major, NaN where a group
    /// failed; [`combined_rewards`] of the scored groups): what a value baseline is fitted to.
    ///
    /// # Errors
    /// Replay, loss, value-fit and optimizer errors.
    pub fn train(
        &mut self,
        batch: &RolloutBatch<W::Sample>,
        adv: &Advantages,
        rewards: &[f64],
    ) -> Result<TrainReport<A::Diagnostics>, TrainerError> {
        let Self {
            cfg,
            world,
            spec,
            pre,
            algorithm,
            workers,
            optimizer,
            model,
            ema,
            sampler,
            reference,
            value,
            device,
            stop,
            ..
        } = self;
        if stop.is_set() {
            return Err(TrainerError::Stopped);
        }
        let (value_adv, value_metrics) = match value.as_mut() {
            None => (None, Metrics::new()),
            Some(v) => value_step(
                v,
                batch,
                rewards,
                &*workers,
                (
                    cfg.rollout.prompts_per_rollout,
                    pre.batch.num_updates_per_batch,
                ),
            )?,
        };
        // with a value baseline a rollout trains unless no sample has a reward (its
        // advantages r - V are not group-relative, so a group whose samples score alike still
        // teaches); without one, unless the advantages are degenerate
        let skip = match value {
            Some(_) => value_adv.is_none(),
            None => adv.degenerate,
        };
        // the algorithm compares against the EMA as it stood before this rollout's updates
        let ema_at_start = ema.as_ref().map(|e| e.model.clone());
        let ctx = TrainContext {
            world: &*world,
            spec: &*spec,
            plan: &pre.update_plan,
            batch,
            advantages: adv,
            device: &*device,
            threads: workers.host_threads(),
            ema: ema_at_start.as_ref(),
            sampling_copy: sampler.as_ref(),
            reference: reference.as_ref(),
            value_advantages: value_adv.as_deref(),
        };
        // every rank must step as often: the same updates and micro-batches (the plans are
        // equal by construction; a mismatch would leave a rank waiting in an all-reduce the
        // others never issue, so it is an error here instead)
        if workers.world_size() > 1 {
            let plan = &pre.update_plan;
            let mine = [
                plan.updates.len() as f64,
                plan.micro_batches().count() as f64,
                batch.samples.len() as f64,
            ];
            let all = workers.all_gather(&mine)?;
            if let Some(other) = all.iter().position(|v| v[..] != mine[..]) {
                return Err(TrainerError::Collective {
                    rank: workers.rank(),
                    world_size: workers.world_size(),
                    operation: "plan the updates".into(),
                    cause: format!(
                        "rank {other} has {} updates of {} micro-batches over {} samples, rank \
                         {} has {} of {} over {}",
                        all[other][0],
                        all[other][1],
                        all[other][2],
                        workers.rank(),
                        mine[0],
                        mine[1],
                        mine[2]
                    ),
                });
            }
        }
        // Degenerate advantages train nothing (every update is skipped), so no anchor is
        // recorded: its forwards would never be differentiated, and the autodiff graph they
        // leave behind is only released by a backward pass (a run whose groups all collapsed
        // to one reward grew by about 600 MB per rollout until it was killed).
        let (frozen, frozen_metrics) = if skip {
            (None, Metrics::new())
        } else {
            let (f, m) = algorithm.freeze(&ctx, model.as_ref().expect("model present"))?;
            (Some(f), m)
        };
        let mut reports = Vec::with_capacity(pre.update_plan.updates.len());
        for update in &pre.update_plan.updates {
            let steps_before = optimizer.optimizer_steps();
            let m = model.take().expect("model present");
            let (m, report) = train_step_threads(
                m,
                optimizer,
                &*workers,
                update,
                skip,
                |m: &W::Policy, samples| {
                    // a stop request ends the update at the next micro-batch
                    if stop.is_set() {
                        return Err(TrainerError::Stopped);
                    }
                    // only called with advantages to learn from, which froze the anchor
                    let frozen = frozen.as_ref().ok_or(TrainerError::NoAnchor {
                        algorithm: algorithm.name(),
                        rollout: batch.rollout_id,
                    })?;
                    algorithm.micro_batch_loss(&ctx, frozen, m, samples)
                },
            )?;
            if let Some(ema) = ema.as_mut()
                && optimizer.optimizer_steps() > steps_before
            {
                ema.update::<B>(&m, optimizer.optimizer_steps());
            }
            *model = Some(m);
            reports.push(report);
        }
        let mut frozen_metrics = frozen_metrics;
        frozen_metrics.extend(value_metrics);
        if let (Some(copy), Some(soft)) = (sampler.as_mut(), algorithm.sampling_copy()) {
            let eta = soft.decay(batch.rollout_id);
            *copy = blend::<B, _>(copy.clone(), model.as_ref().expect("model present"), eta);
            frozen_metrics.insert(names::TRAIN_SAMPLER_DECAY.into(), eta);
        }
        Ok(TrainReport {
            updates: reports,
            frozen: frozen_metrics,
        })
    }

    /// Phase 5: sampling of the world's held-out prompts, `eval.samples_per_prompt` fixed
    /// seeds each (a pure function of `run.seed`), deterministic under `eval.sampling =
    /// "ode"` and with the SDE's transitions at the plan's evaluation steps under `"sde"`,
    /// scored by the world's scorers; writes a sample grid. Under `eval.sde_gap` the same
    /// prompts and initial noise are sampled again with the rollouts' SDE transitions at the
    /// plan's evaluation steps and scored ([`EvalReport::sde`]).
    ///
    /// # Errors
    /// Sampling, scoring and PNG errors.
    pub fn evaluate(&self, tag: &str) -> Result<EvalReport, TrainerError> {
        let start = Instant::now();
        let k = self.cfg.eval.samples_per_prompt.max(1);
        // the IO rank evaluates while the others wait: on a CPU it takes the machine's threads
        let threads = if self.workers.world_size() > 1 {
            self.cfg.run.threads().max(self.workers.host_threads())
        } else {
            self.workers.host_threads()
        };
        // the policy once, for the evaluation and (`eval.sde_gap`) its SDE pictures
        let policy = self.handed_out().valid();
        let sample = |noised: &SdeSteps| {
            evaluate_policy::<B, W>(
                &self.world,
                &policy,
                &self.eval_spec,
                noised,
                k,
                self.cfg.run.seed,
                &self.cfg.reward.component_weights,
                self.cfg.eval.guidance.as_ref(),
                threads,
                &self.device,
            )
        };
        let (samples, stats) = sample(&self.pre.eval_sde_steps)?;
        let images: Vec<RgbImage> = samples
            .iter()
            .step_by(k)
            .filter_map(|s| self.world.image(s))
            .collect();
        if self.workers.is_io_rank() && !images.is_empty() {
            let tiles: Vec<image::RgbImage> = images
                .iter()
                .map(|i| {
                    image::RgbImage::from_raw(
                        i.width() as u32,
                        i.height() as u32,
                        i.as_bytes().to_vec(),
                    )
                    .expect("rgb")
                })
                .collect();
            // small pictures are enlarged (nearest neighbour) so that a caption fits under each
            let scale = (GRID_TILE_MIN / tiles[0].width().max(1)).max(1);
            let tiles: Vec<image::RgbImage> = tiles.iter().map(|t| upscale(t, scale)).collect();
            let captions: Vec<String> = self
                .world
                .held_out()
                .iter()
                .map(|h| h.prompt.clone())
                .collect();
            let grid = sample_grid(
                &tiles,
                Some(&captions[..tiles.len().min(captions.len())]),
                GRID_COLUMNS,
            )?;
            let dir = self.run_dir.join(run_dir::SAMPLES_DIR);
            std::fs::create_dir_all(&dir).map_err(io_err(&dir, "create the samples directory"))?;
            write_png(&dir.join(eval_grid_file(tag)), &grid)?;
            if tag != INITIAL_EVAL_TAG {
                self.write_before_after(&tiles, &captions, (stats.mean, stats.stderr))?;
            }
        }
        let judges = self
            .cfg
            .eval
            .judge_components()
            .into_iter()
            .map(|c| match stats.components.get(&c) {
                Some(&s) => Ok((c, s)),
                None => Err(TrainerError::EvalJudgeMissing {
                    component: c,
                    world: self.world.name(),
                }),
            })
            .collect::<Result<_, _>>()?;
        // the same prompts, seeds and initial noise, with the rollouts' SDE transitions
        let sde = match &self.pre.eval_gap_steps {
            Some(steps) => {
                let (_, sde) = sample(steps)?;
                Some((sde.mean, sde.stderr))
            }
            None => None,
        };
        Ok(EvalReport {
            reward: stats.mean,
            stderr: stats.stderr,
            by_category: stats.by_category,
            samples: samples.len(),
            images,
            seconds: start.elapsed().as_secs_f64(),
            judges,
            sde,
        })
    }

    /// `samples/before_after.png`: the held-out pictures of the initial evaluation (cut from
    /// its grid, `samples/eval_initial.png`) above this evaluation's `after` pictures, prompt
    /// by prompt, titled with both rewards. Without an initial grid (no initial evaluation in
    /// this run directory) nothing is drawn; an initial grid of other pictures (the held-out
    /// set or the tile size changed) is reported and skipped: a picture does not end a run.
    fn write_before_after(
        &self,
        after: &[image::RgbImage],
        captions: &[String],
        (reward, stderr): (f64, f64),
    ) -> Result<(), TrainerError> {
        let dir = self.run_dir.join(run_dir::SAMPLES_DIR);
        let initial = dir.join(eval_grid_file(INITIAL_EVAL_TAG));
        let Some(first) = after.first() else {
            return Ok(());
        };
        if !initial.exists() {
            return Ok(());
        }
        let grid = image::open(&initial)
            .map_err(|source| TrainerError::Image {
                path: initial.clone(),
                source,
            })?
            .to_rgb8();
        let before: Option<Vec<image::RgbImage>> = (0..after.len())
            .map(|i| grid_tile(&grid, i, first.dimensions(), true, GRID_COLUMNS))
            .collect();
        let Some(before) = before else {
            println!(
                "{} not drawn: {} holds fewer or smaller pictures than this evaluation",
                run_dir::BEFORE_AFTER_FILE,
                initial.display()
            );
            return Ok(());
        };
        let title = match self.logged_initial_eval()? {
            Some(e) => format!(
                "held-out prompts, same seeds: {:.3} +/- {:.3} before, {reward:.3} +/- {stderr:.3} after",
                e.reward, e.stderr
            ),
            None => format!("held-out prompts, same seeds: {reward:.3} +/- {stderr:.3} after"),
        };
        let img = before_after_grid(
            &before,
            after,
            &captions[..after.len().min(captions.len())],
            GRID_COLUMNS,
            ["before", "after"],
            &title,
        )?;
        write_png(&dir.join(run_dir::BEFORE_AFTER_FILE), &img)
    }

    /// Phase 6: a committed checkpoint after rollout `rollout_id`.
    ///
    /// # Errors
    /// Checkpoint IO errors.
    pub fn checkpoint(&mut self, rollout_id: u64) -> Result<(), TrainerError> {
        let mut state = TrainerState::new(&self.cfg.run.task, rollout_id);
        self.optimizer.record_into(&mut state);
        state.metrics_cursor = self.monitor.cursor();
        state.checkpoint_failures = self.checkpoint_failures;
        let mut readable = self.world.checkpoint_files(self.handed_out())?;
        if let Some(v) = &self.value {
            readable.extend(v.files()?);
        }
        let mut copies: Vec<(&'static str, &W::Policy)> = Vec::new();
        if let Some(e) = &self.ema {
            copies.push((EMA_FILE, &e.model));
            if let Some(average) = e.average() {
                copies.push((EMA_AVERAGE_FILE, average));
            }
        }
        if let Some(s) = &self.sampler {
            copies.push((SAMPLER_FILE, s));
        }
        self.store.save_all(
            self.model(),
            &copies,
            self.optimizer.optimizer(),
            &state,
            &self.rng,
            self.contract.as_ref(),
            &readable,
        )?;
        Ok(())
    }

    /// The first evaluation in this run directory's metrics log (a resumed run's starting
    /// policy), if it is there.
    fn logged_initial_eval(&self) -> Result<Option<EvalSummary>, TrainerError> {
        let Some(path) = self.monitor.jsonl_path() else {
            return Ok(None);
        };
        Ok(crate::monitor::read_jsonl(&path)?
            .into_iter()
            .find_map(|r| {
                // a `null` reward is an evaluation that was not finite, not a missing one
                let reward = r.metrics.get(EVAL_REWARD).copied()?.unwrap_or(f64::NAN);
                let stderr = r
                    .metrics
                    .get(EVAL_REWARD_SE)
                    .copied()
                    .flatten()
                    .unwrap_or(f64::NAN);
                // the first judge by name, as `EvalReport::summary` takes it
                let judge = r
                    .metrics
                    .keys()
                    .filter(|k| k.starts_with(names::eval_judge("").as_str()))
                    .find(|k| !k.ends_with("_se"))
                    .cloned();
                let second = judge.map(|k| {
                    let get = |k: &str| r.metrics.get(k).copied().flatten().unwrap_or(f64::NAN);
                    (get(&k), get(&format!("{k}_se")))
                });
                Some(EvalSummary {
                    reward,
                    stderr,
                    second,
                })
            }))
    }

    fn log(&mut self, step: u64, metrics: &Metrics) -> Result<(), TrainerError> {
        if self.workers.is_io_rank() {
            self.monitor.log(step, metrics)?;
        }
        Ok(())
    }

    /// Runs rollouts until `run.num_rollouts` or a stop request (which ends after a committed
    /// checkpoint), evaluating at the start (of a fresh run: a resumed one reads the starting
    /// evaluation from its log), every `eval.interval` rollouts and at the end.
    ///
    /// # Errors
    /// Any phase's error (a failed reward group is not an error: it is logged and skipped).
    pub fn run(&mut self, stop: &StopFlag) -> Result<RunSummary, TrainerError> {
        self.check_replicas()?;
        let start = Instant::now();
        let cpu_start = crate::monitor::process_cpu_seconds();
        // CPU seconds of this call's evaluations, left out of perf/train_cpu_seconds
        let mut eval_cpu = 0.0;
        let total = self.cfg.run.num_rollouts;
        let mut summary = RunSummary {
            initial_eval: None,
            final_eval: None,
            last_rollout: None,
            stopped: false,
            seconds: 0.0,
            unfinished_decay: None,
        };
        // one rank stops wherever the request finds it; ranks stop together, after the
        // rollout every rank is in when one of them sees the request (agreed below), so their
        // phases never see it
        let ranks = self.workers.world_size();
        self.stop = if ranks == 1 {
            stop.clone()
        } else {
            StopFlag::new()
        };
        let io = self.workers.is_io_rank();
        let reward_metric = self.reward_metric();
        // the IO rank evaluates; the other ranks go on to the next rollout and wait for it
        let interval = if io { self.cfg.eval.interval } else { 0 };
        if interval > 0 && self.next_rollout == 0 {
            let cpu = crate::monitor::process_cpu_seconds();
            let e = self.evaluate(INITIAL_EVAL_TAG)?;
            eval_cpu += crate::monitor::process_cpu_seconds() - cpu;
            print_eval("start", &e);
            summary.initial_eval = Some(e.summary());
            self.log(0, &e.metrics())?;
        } else if interval > 0 {
            // a resumed run: the starting policy was evaluated (and logged) by the run it
            // continues, whose records up to the checkpoint are kept
            summary.initial_eval = self.logged_initial_eval()?;
        }
        let progress = Progress::new(
            "rollouts",
            total.saturating_sub(self.next_rollout),
            if io {
                self.cfg.monitor.progress
            } else {
                crate::config::ProgressMode::Never
            },
        );
        let mut committed = self.store.latest_committed()?.map(|c| c.iteration);
        while self.next_rollout < total {
            let id = self.next_rollout;
            let mut metrics = Metrics::new();
            let t0 = Instant::now();
            // the state after the last complete rollout, restored if a stop request
            // interrupts this one (burn tensors are immutable: the clones share storage)
            let rng_before = self.rng.clone();
            let model_before = self.model().clone();
            let ema_before = self.ema.clone();
            let sampler_before = self.sampler.clone();
            let value_before = self.value.clone();
            let optimizer_before = self.optimizer.clone();
            let attempt = (|| {
                let prompts = self
                    .world
                    .train_prompts(&mut self.rng, self.cfg.rollout.prompts_per_rollout)?;
                let shard = self
                    .workers
                    .group_shard(prompts.len(), self.pre.batch.num_updates_per_batch)?;
                let mine: Vec<String> = shard.iter().map(|&i| prompts[i].clone()).collect();
                let batch = self.rollout_groups(id, &mine, &shard)?;
                let t_rollout = t0.elapsed().as_secs_f64();
                let t1 = Instant::now();
                let groups = self.score(&batch)?;
                let t_score = t1.elapsed().as_secs_f64();
                if self.stop.is_set() {
                    return Err(TrainerError::Stopped);
                }
                // every rank computes the whole batch's advantages (group statistics, the
                // batch std, the degenerate flag: those of one rank sampling every group) and
                // trains on its share of them
                let rewards = combined_rewards(&groups, &self.cfg.reward.component_weights);
                let groups = self.gather_groups(groups, &prompts)?;
                let global = crate::train::advantages(&self.pre.advantages, &groups, None)?;
                let adv = share_of_advantages(&global, &shard, self.cfg.rollout.group_size);
                let t2 = Instant::now();
                let report = self.train(&batch, &adv, &rewards)?;
                let t_train = t2.elapsed().as_secs_f64();
                Ok((batch, global, report, [t_rollout, t_score, t_train]))
            })();
            let (batch, adv, report, [t_rollout, t_score, t_train]) = match attempt {
                Ok(done) => {
                    // the same on every rank (the replicas are)
                    metrics.insert(
                        names::TRAIN_PARAM_CHANGE.into(),
                        crate::ema::relative_change::<B, _>(&model_before, self.model()),
                    );
                    done
                }
                Err(TrainerError::Stopped) => {
                    // rollout `id` is dropped, whichever phase the request interrupted
                    self.rng = rng_before;
                    self.model = Some(model_before);
                    self.ema = ema_before;
                    self.sampler = sampler_before;
                    self.value = value_before;
                    self.optimizer = optimizer_before;
                    summary.stopped = true;
                    match id.checked_sub(1) {
                        Some(prev) if committed != Some(prev) => {
                            self.checkpoint(prev)?;
                            println!(
                                "stop requested during rollout {id}: it is dropped; checkpoint \
                                 after rollout {prev} committed (resume with --resume)"
                            );
                        }
                        Some(prev) => println!(
                            "stop requested during rollout {id}: it is dropped; the checkpoint \
                             after rollout {prev} was already committed (resume with --resume)"
                        ),
                        None => println!(
                            "stop requested during the first rollout: nothing completed, \
                             nothing to checkpoint"
                        ),
                    }
                    break;
                }
                Err(e) => return Err(e),
            };
            if io {
                for line in failure_messages(&adv) {
                    println!("rollout {id}: {line}");
                }
            }
            metrics.extend(advantage_metrics(&adv));
            // this rank's share of the rollout, combined over the ranks
            let mut local = Metrics::new();
            local.extend(UpdateReport::rollout_metrics(&report.updates));
            local.extend(self.algorithm.rollout_metrics(&report.updates));
            local.extend(report.frozen.clone());
            let n = batch.samples.len() as f64;
            local.insert(names::phase_time("rollout"), t_rollout);
            local.insert(names::phase_time("train"), t_train);
            local.insert(names::REWARD_SCORE_TIME.into(), t_score);
            local.insert(names::REWARD_SCORE_SAMPLES_PER_S.into(), n / t_score);
            local.insert(names::PERF_ROLLOUT_SAMPLES_PER_S.into(), n / t_rollout);
            metrics.extend(combine_over_ranks(&self.workers, local)?);
            metrics.insert(
                names::TRAIN_POLICY_VERSION.into(),
                self.optimizer.policy_version() as f64,
            );
            metrics.insert(
                names::TRAIN_CHECKPOINT_FAILURES.into(),
                self.checkpoint_failures as f64,
            );
            // the plan's draw is the same on every rank
            let step = |s: Option<&usize>| s.map_or(f64::NAN, |&s| s as f64);
            metrics.insert(
                names::ROLLOUT_FIRST_TRAINED_STEP.into(),
                step(batch.trained.iter().min()),
            );
            metrics.insert(
                names::ROLLOUT_LAST_TRAINED_STEP.into(),
                step(batch.trained.iter().max()),
            );
            let reward_mean = metrics.get(&reward_metric).copied().unwrap_or(f64::NAN);
            self.next_rollout = id + 1;
            summary.last_rollout = Some(id);
            let cpu = crate::monitor::process_cpu_seconds();
            let train_cpu = cpu - cpu_start - eval_cpu;
            metrics.insert(names::PERF_TRAIN_CPU_SECONDS.into(), train_cpu);
            // the CPU budget ends the run after this rollout, as its last
            let budget_spent = self
                .cfg
                .run
                .cpu_budget_seconds
                .is_some_and(|b| train_cpu >= b);
            // the ranks agree on whether this rollout is the last
            let (budget_spent, agreed_stop) = if ranks == 1 {
                (budget_spent, None)
            } else {
                let mut flags = [
                    f64::from(u8::from(budget_spent)),
                    f64::from(u8::from(stop.is_set())),
                ];
                self.workers
                    .reduce_scalars(&mut flags, crate::workers::ScalarReduce::Max)?;
                (flags[0] > 0.0, Some(flags[1] > 0.0))
            };
            let stop_requested = || agreed_stop.unwrap_or_else(|| stop.is_set());
            if budget_spent && io {
                println!(
                    "rollout {id}: the CPU budget of {:.0} s is spent ({train_cpu:.0} s): this is the last rollout",
                    self.cfg.run.cpu_budget_seconds.unwrap_or(f64::NAN)
                );
            }
            let evaluate_now = interval > 0
                && (self.next_rollout.is_multiple_of(interval)
                    || self.next_rollout == total
                    || budget_spent);
            if evaluate_now {
                let e = self.evaluate(&format!("step_{id:04}"))?;
                eval_cpu += crate::monitor::process_cpu_seconds() - cpu;
                print_eval(&format!("after rollout {id}"), &e);
                metrics.extend(e.metrics());
                summary.final_eval = Some(e.summary());
            }
            self.log(id, &metrics)?;
            if evaluate_now {
                self.write_reward_curve(&reward_metric)?;
            }
            progress.inc(1);
            // the ratio statistics of a clipped objective, when the algorithm has them
            let ratio = match (
                metrics.get(names::TRAIN_CLIP_FRACTION),
                metrics.get(names::TRAIN_RATIO_MIN),
                metrics.get(names::TRAIN_RATIO_MAX),
            ) {
                (Some(clip), Some(lo), Some(hi)) => {
                    format!("  clip {clip:.2}  ratio [{lo:.4}, {hi:.4}]")
                }
                _ => String::new(),
            };
            // why a run does not learn: no spread within groups, groups all equal, a
            // policy that does not move
            let got = |k: &str| metrics.get(k).copied().unwrap_or(f64::NAN);
            let signal = format!(
                "  spread {:.3}  equal {:.2}  moved {:.1e}",
                got(names::REWARD_GROUP_STD_MEAN),
                got(names::REWARD_ZERO_STD_RATIO),
                got(names::TRAIN_PARAM_CHANGE),
            );
            if io {
                println!(
                    "rollout {id:>3}: reward {reward_mean:.3}{signal}  loss {:.2e}{ratio}  {:.1}s rollout / {:.1}s train",
                    metrics.get(names::TRAIN_LOSS).copied().unwrap_or(f64::NAN),
                    metrics
                        .get(&names::phase_time("rollout"))
                        .copied()
                        .unwrap_or(t_rollout),
                    metrics
                        .get(&names::phase_time("train"))
                        .copied()
                        .unwrap_or(t_train),
                );
            }
            let save_now = self.cfg.checkpoint.save_interval > 0
                && self
                    .next_rollout
                    .is_multiple_of(self.cfg.checkpoint.save_interval);
            let last = self.next_rollout == total || stop_requested() || budget_spent;
            // the model, optimizer, EMA and random stream are the same on every rank: the IO
            // rank writes the checkpoint, after every rank logged this rollout (the metrics
            // above are combined over all of them, so a rank that failed before that point
            // left no checkpoint of this rollout)
            if (save_now || last) && io {
                match self.checkpoint(id) {
                    Ok(()) => committed = Some(id),
                    Err(e @ TrainerError::Io { .. })
                        if !last
                            && self.cfg.checkpoint.on_failure == CheckpointFailurePolicy::Retry =>
                    {
                        self.checkpoint_failures += 1;
                        println!(
                            "warning: the checkpoint after rollout {id} failed ({} so far): {}; \
                             the run goes on and tries again at the next save \
                             (checkpoint.on_failure = \"retry\"); the last committed one is {}",
                            self.checkpoint_failures,
                            error_chain(&e),
                            committed.map_or_else(|| "none".into(), |c| c.to_string()),
                        );
                    }
                    Err(e) => return Err(e),
                }
            }
            if stop_requested() {
                if io {
                    println!("stop requested: checkpoint after rollout {id} committed");
                }
                summary.stopped = true;
                break;
            }
            if budget_spent {
                break;
            }
        }
        progress.finish();
        self.write_reward_curve(&reward_metric)?;
        summary.seconds = start.elapsed().as_secs_f64();
        if !summary.stopped {
            summary.unfinished_decay = unfinished_decay(self.optimizer.lr_scheduler());
            if let (Some(u), true) = (summary.unfinished_decay, io) {
                println!("note: {u}");
            }
        }
        Ok(summary)
    }

    /// Redraws `reward_curve.png` from the metrics log: the training reward `reward_metric`
    /// per rollout and the held-out reward with its standard error (after every evaluation
    /// and at the end of the run).
    fn write_reward_curve(&self, reward_metric: &str) -> Result<(), TrainerError> {
        let Some(jsonl) = self.monitor.jsonl_path() else {
            return Ok(());
        };
        if !self.workers.is_io_rank() {
            return Ok(());
        }
        let first = self
            .cfg
            .reward
            .required_components
            .first()
            .cloned()
            .unwrap_or_default();
        // the held-out evaluation's second judgements beside the reward's, so that a gain
        // only one judge sees shows in the picture too
        let judges: Vec<String> = self
            .cfg
            .eval
            .judge_components()
            .iter()
            .map(|c| names::eval_judge(c))
            .collect();
        let curves: Vec<&str> = [reward_metric, EVAL_REWARD]
            .into_iter()
            .chain(judges.iter().map(String::as_str))
            .collect();
        match write_reward_curve(
            &jsonl,
            &curves,
            &self.run_dir.join(run_dir::REWARD_CURVE_FILE),
            &format!("{first} reward: training rollouts and the held-out evaluation"),
            "reward",
        ) {
            // nothing logged yet (a stop during the first rollout): no curve to draw
            Err(TrainerError::Drawing {
                problem: DrawingProblem::Empty,
                ..
            }) => Ok(()),
            other => other,
        }
    }
}

/// Hashes the bits of every trainable (gradient-requiring) float parameter in visit order.
struct TrainableHash<B: AutodiffBackend> {
    hasher: xxhash_rust::xxh3::Xxh3,
    tensors: usize,
    _b: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> burn::module::ModuleVisitor<B> for TrainableHash<B> {
    fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<B, D>>) {
        let v = param.val();
        if !v.is_require_grad() {
            return;
        }
        self.tensors += 1;
        let data = v.inner().into_data();
        self.hasher.update(data.as_bytes());
        for d in data.shape.iter() {
            self.hasher.update(&(*d as u64).to_le_bytes());
        }
    }
}

/// The combined raw reward of every sample of `groups` (group-major): the weighted sum of its
/// components under `weights`, NaN when a weighted component is missing or not finite (its
/// group fails in the advantages phase).
pub fn combined_rewards(groups: &[RewardGroup], weights: &BTreeMap<String, f64>) -> Vec<f64> {
    groups
        .iter()
        .flat_map(|g| &g.samples)
        .map(|c| {
            weights.iter().fold(0.0, |acc, (name, w)| {
                acc + w * c.get(name).copied().unwrap_or(f64::NAN)
            })
        })
        .map(|r| if r.is_finite() { r } else { f64::NAN })
        .collect()
}

/// The width of a value baseline's rows in `world`: the latent's elements and the prompt
/// features of one encoded held-out prompt.
fn value_features<B: AutodiffBackend, W: World<B>>(
    world: &W,
    device: &B::Device,
) -> Result<usize, TrainerError> {
    let latent: usize = world.latent_shape().iter().product();
    let prompt = world
        .held_out()
        .first()
        .ok_or_else(|| TrainerError::InvalidValueBaseline {
            problem: format!(
                "the world {} has no held-out prompt to measure its prompt features on",
                world.name()
            ),
        })?;
    let cond = world.encode(&[prompt.prompt.as_str()], device)?;
    let stored = world.store_conditioning(&cond, &[0])?;
    let text = stored.first().map_or(0, |c| prompt_features(c).len());
    Ok(latent + text)
}

/// One rollout of a value baseline: its rows pushed, one fit, every (sample, trained step)'s
/// advantage `r - V` (0 where the reward is not finite; `None` when no reward of the whole
/// rollout is), and the baseline's metrics over this rank's rows.
///
/// With several ranks every rank gathers every rank's rows (`groups` = (the rollout's groups,
/// its updates) say which rank holds which group) in the rollout's group order, so that each
/// pushes, fits and predicts what one rank running the whole rollout would: the baselines stay
/// equal without an all-reduce, and a checkpoint resumes on any number of ranks.
fn value_step<B: AutodiffBackend, S, K: Workers>(
    value: &mut ValueBaseline<B>,
    batch: &RolloutBatch<S>,
    rewards: &[f64],
    workers: &K,
    groups: (usize, usize),
) -> Result<(Option<Vec<f32>>, Metrics), TrainerError> {
    if rewards.len() != batch.samples.len() {
        return Err(TrainerError::InvalidValueBaseline {
            problem: format!(
                "{} rewards for a rollout of {} samples",
                rewards.len(),
                batch.samples.len()
            ),
        });
    }
    let steps = batch.trained.len();
    let (rows, row_steps) = value_rows(&batch.trajectories, &batch.trained, batch.group_size())?;
    let row_rewards: Vec<f64> = rewards
        .iter()
        .flat_map(|&r| std::iter::repeat_n(r, steps))
        .collect();
    let features = value.shape().features;
    let step = if workers.world_size() == 1 {
        value.observe(&rows, &row_steps, &row_rewards, batch.rollout_id)?
    } else {
        let per_group = batch.group_size() * steps;
        let all = gather_value_rows(
            workers,
            (&rows, &row_steps, &row_rewards),
            features,
            per_group,
            groups,
        )?;
        let step = value.observe(&all.0, &all.1, &all.2, batch.rollout_id)?;
        // this rank's rows of the whole rollout's values
        let shard = workers.group_shard(groups.0, groups.1)?;
        step.map(|mut s| {
            s.values = shard
                .iter()
                .flat_map(|&g| s.values[g * per_group..(g + 1) * per_group].to_vec())
                .collect();
            s
        })
    };
    let Some(step) = step else {
        return Ok((None, Metrics::new()));
    };
    let advantages: Vec<f32> = row_rewards
        .iter()
        .zip(&step.values)
        .map(|(&r, &v)| if r.is_finite() { r as f32 - v } else { 0.0 })
        .collect();
    let m = value_metrics(&step, &row_rewards, &advantages);
    Ok((Some(advantages), m))
}

/// A value step's metrics: its loss and buffer size, and the mean prediction and the mean and
/// spread of `r - V` over the rows whose reward is finite.
fn value_metrics(step: &ValueStep, row_rewards: &[f64], advantages: &[f32]) -> Metrics {
    let (mut n, mut sum_v, mut sum_a, mut sum_a2) = (0.0, 0.0, 0.0, 0.0);
    for ((&r, &v), &a) in row_rewards.iter().zip(&step.values).zip(advantages) {
        if r.is_finite() {
            n += 1.0;
            sum_v += f64::from(v);
            sum_a += f64::from(a);
            sum_a2 += f64::from(a) * f64::from(a);
        }
    }
    let mean_a = sum_a / n;
    let mut m = Metrics::new();
    m.insert(names::TRAIN_VALUE_LOSS.into(), step.loss);
    m.insert(names::TRAIN_VALUE_MEAN.into(), sum_v / n);
    m.insert(names::TRAIN_VALUE_ADVANTAGE_MEAN.into(), mean_a);
    m.insert(
        names::TRAIN_VALUE_ADVANTAGE_STD.into(),
        crate::algorithm::std_of_variance(sum_a2 / n - mean_a * mean_a),
    );
    m.insert(
        names::TRAIN_VALUE_BUFFER_ROWS.into(),
        step.buffer_rows as f64,
    );
    m
}

/// A value baseline's rows: row-major features, each row's step, each row's reward.
type ValueRows = (Vec<f32>, Vec<usize>, Vec<f64>);

/// Every rank's value rows (`mine`: rows, steps, rewards, `per_group` rows per group of this
/// rank's shard), gathered in the rollout's group order: the rows one rank sampling every
/// group would have.
fn gather_value_rows<K: Workers>(
    workers: &K,
    mine: (&[f32], &[usize], &[f64]),
    features: usize,
    per_group: usize,
    (groups, updates): (usize, usize),
) -> Result<ValueRows, TrainerError> {
    let (rows, steps, rewards) = mine;
    // per row: its step, whether its reward is finite, the reward, then its features
    let width = features + 3;
    let mut encoded = Vec::with_capacity(steps.len() * width);
    for (i, (&k, &r)) in steps.iter().zip(rewards).enumerate() {
        encoded.push(k as f64);
        encoded.push(f64::from(u8::from(r.is_finite())));
        encoded.push(if r.is_finite() { r } else { 0.0 });
        encoded.extend(
            rows[i * features..(i + 1) * features]
                .iter()
                .map(|&v| f64::from(v)),
        );
    }
    let all = workers.all_gather(&encoded)?;
    let n = groups * per_group;
    let mut out_rows = vec![0.0f32; n * features];
    let mut out_steps = vec![0usize; n];
    let mut out_rewards = vec![f64::NAN; n];
    for (rank, values) in all.iter().enumerate() {
        let shard = crate::workers::shard_of(groups, updates, workers.world_size(), rank)?;
        if values.len() != shard.len() * per_group * width {
            return Err(TrainerError::Collective {
                rank: workers.rank(),
                world_size: workers.world_size(),
                operation: "gather the value rows".into(),
                cause: format!(
                    "rank {rank} sent {} values for {} groups of {per_group} rows of {width}",
                    values.len(),
                    shard.len()
                ),
            });
        }
        for (local, &g) in shard.iter().enumerate() {
            for j in 0..per_group {
                let src = &values[(local * per_group + j) * width..][..width];
                let at = g * per_group + j;
                out_steps[at] = src[0] as usize;
                if src[1] != 0.0 {
                    out_rewards[at] = src[2];
                }
                for (o, &v) in out_rows[at * features..(at + 1) * features]
                    .iter_mut()
                    .zip(&src[3..])
                {
                    *o = v as f32;
                }
            }
        }
    }
    Ok((out_rows, out_steps, out_rewards))
}

/// The advantages of this rank's share of a rollout (`shard`: its groups, of `group_size`
/// candidates each) cut from the whole batch's `global` ones: the per-sample values and keep
/// flags and the per-group reports of its groups, in its order; the batch statistics (mean,
/// std, the degenerate flag, the component statistics) stay the batch's. Every group: a
/// clone.
///
/// ```
/// use flow_grpo::{AdvantageConfig, RewardComponent, RewardGroup, StdMode};
/// use std::collections::BTreeMap;
/// use trainer_fsdp::run::share_of_advantages;
/// let cfg = AdvantageConfig::flow_grpo(StdMode::Group, vec![RewardComponent::required("s", 1.0)]).unwrap();
/// let g = |a: f64, b: f64| RewardGroup {
///     prompt_key: "p".into(),
///     samples: vec![BTreeMap::from([("s".into(), a)]), BTreeMap::from([("s".into(), b)])],
/// };
/// let all = trainer_fsdp::advantages(&cfg, &[g(0.0, 1.0), g(3.0, 1.0)], None).unwrap();
/// let second = share_of_advantages(&all, &[1], 2);
/// assert_eq!(second.values, all.values[2..4].to_vec());
/// assert_eq!(second.mean, all.mean);
/// ```
pub fn share_of_advantages(global: &Advantages, shard: &[usize], group_size: usize) -> Advantages {
    if shard.len() == global.groups.len() && shard.iter().enumerate().all(|(i, &g)| i == g) {
        return global.clone();
    }
    let samples = |gi: usize| gi * group_size..(gi + 1) * group_size;
    Advantages {
        values: shard
            .iter()
            .flat_map(|&gi| global.values[samples(gi)].iter().copied())
            .collect(),
        keep: shard
            .iter()
            .flat_map(|&gi| global.keep[samples(gi)].iter().copied())
            .collect(),
        groups: shard.iter().map(|&gi| global.groups[gi].clone()).collect(),
        ..global.clone()
    }
}

/// This rank's metrics of its share of a rollout combined over the ranks, each by its
/// [`names::rank_reduction`] (a mean over ranks of means over equal shares is the whole
/// batch's mean). One rank: `local` unchanged.
///
/// # Errors
/// [`TrainerError::Collective`] when the ranks logged different metric names, and failed
/// collectives.
pub fn combine_over_ranks<K: Workers>(
    workers: &K,
    local: Metrics,
) -> Result<Metrics, TrainerError> {
    let w = workers.world_size();
    if w == 1 {
        return Ok(local);
    }
    // the names must agree: their hash travels with the values
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    for name in local.keys() {
        hasher.update(name.as_bytes());
        hasher.update(&[0]);
    }
    let mut values = vec![f64::from_bits(hasher.digest())];
    values.extend(local.values().copied());
    let all = workers.all_gather(&values)?;
    if let Some(other) = all
        .iter()
        .position(|v| v[0].to_bits() != values[0].to_bits())
    {
        return Err(TrainerError::Collective {
            rank: workers.rank(),
            world_size: w,
            operation: "combine the rollout's metrics".into(),
            cause: format!(
                "rank {other} logged other metric names than rank {} ({})",
                workers.rank(),
                local.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        });
    }
    let index: BTreeMap<&str, usize> = local
        .keys()
        .enumerate()
        .map(|(i, k)| (k.as_str(), i + 1))
        .collect();
    Ok(local
        .keys()
        .enumerate()
        .map(|(i, name)| {
            let column = all.iter().map(|v| v[i + 1]);
            let sibling = name
                .strip_suffix("_std")
                .and_then(|p| index.get(format!("{p}_mean").as_str()).copied());
            let value = match names::rank_reduction(name) {
                names::RankReduction::Mean => column.sum::<f64>() / w as f64,
                names::RankReduction::Sum => column.sum(),
                names::RankReduction::Min => column.fold(f64::INFINITY, crate::algorithm::nan_min),
                names::RankReduction::Max => {
                    column.fold(f64::NEG_INFINITY, crate::algorithm::nan_max)
                }
                names::RankReduction::Same => all[0][i + 1],
                names::RankReduction::PooledStd => match sibling {
                    Some(m) => {
                        let mean = all.iter().map(|v| v[m]).sum::<f64>() / w as f64;
                        let var = all
                            .iter()
                            .map(|v| v[i + 1] * v[i + 1] + (v[m] - mean) * (v[m] - mean))
                            .sum::<f64>()
                            / w as f64;
                        var.sqrt()
                    }
                    None => column.sum::<f64>() / w as f64,
                },
            };
            (name.clone(), value)
        })
        .collect())
}

/// The checkpoint store and the artifact layout of `cfg`.
fn stores(cfg: &TrainConfig) -> Result<(CheckpointStore, ArtifactLayout), TrainerError> {
    let store = CheckpointStore::new(
        &cfg.checkpoint.dir,
        &cfg.run.task,
        cfg.checkpoint.max_to_keep,
    )?;
    let layout = ArtifactLayout::new(&cfg.artifacts.root, &cfg.run.task)?;
    Ok((store, layout))
}

/// The readable copy of the trainable weights a checkpoint holds ([`World::checkpoint_files`])
/// against the weights resume restored from `model.mpk`: byte for byte what the restored
/// policy would write. A checkpoint written before the world had readable files has none and
/// passes.
///
/// # Errors
/// [`TrainerError::Checkpoint`] with [`CheckpointProblem::ReadableCopyDiffers`], IO errors.
fn check_readable_copy<B: AutodiffBackend, W: World<B>>(
    world: &W,
    model: &W::Policy,
    dir: &Path,
) -> Result<(), TrainerError> {
    for (name, bytes) in world.checkpoint_files(model)? {
        let path = dir.join(name);
        match std::fs::read(&path) {
            Ok(found) if found == bytes => {}
            Ok(_) => {
                return Err(TrainerError::Checkpoint {
                    dir: dir.to_path_buf(),
                    problem: CheckpointProblem::ReadableCopyDiffers { name: name.into() },
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&path, "read")(e)),
        }
    }
    Ok(())
}

/// Sampling of `world`'s held-out prompts under `model`, `k` fixed seeds each, scored by the
/// world's scorers and combined with `weights` (`sum_c w_c * component_c` of the raw
/// components): the samples (prompt-major) and the statistics. The solver runs every step
/// but those of `noised`, where `spec`'s kernel takes its SDE transition (seed 002's
/// evaluation at the plan's fallback steps; none: deterministic sampling). The initial noise
/// and the noise of those steps are pure functions of `seed` and the sample. With `guidance`
/// every step runs the model under true CFG of its scale and negative prompt
/// (`velocity_model::TrueCfg`). `threads` sample chunks side by side (the same bits for any
/// value).
///
/// # Errors
/// [`TrainerError::NoEvalSamples`] for `k = 0`; [`TrainerError::EvalNoiseWithoutKernel`]
/// for steps in `noised` under a `spec` without a kernel; sampling, noise, prompt and scorer
/// errors (the negative prompt's encoding among them).
#[allow(clippy::too_many_arguments)]
pub fn evaluate_policy<B, W>(
    world: &W,
    model: &<W::Policy as AutodiffModule<B>>::InnerModule,
    spec: &SamplerSpec,
    noised: &SdeSteps,
    k: usize,
    seed: u64,
    weights: &BTreeMap<String, f64>,
    guidance: Option<&EvalGuidance>,
    threads: usize,
    device: &B::Device,
) -> Result<(Vec<W::Sample>, EvalStatistics), TrainerError>
where
    B: AutodiffBackend,
    W: World<B>,
{
    if k == 0 {
        return Err(TrainerError::NoEvalSamples);
    }
    if spec.kernel.is_none() && !noised.is_empty() {
        return Err(TrainerError::EvalNoiseWithoutKernel {
            steps: noised.as_slice().to_vec(),
        });
    }
    let held = world.held_out();
    let all: Vec<&str> = held
        .iter()
        .flat_map(|h| std::iter::repeat_n(h.prompt.as_str(), k))
        .collect();
    let x_t = NoiseRecipe::new(
        seed ^ 0xE7A1_0000,
        world.latent_shape().to_vec(),
        (0..all.len() as u64).collect(),
        NoiseAlgorithm::Pcg64BoxMuller,
    )?
    .generate()
    .to_tensor::<Inner<B>, 3>(device)?;
    let cond = world.encode(&all, device)?;
    // one per-step-noise seed per sample, a pure function of `seed` and the sample's index
    let step_seeds = DenoiseSeeds::new(
        (0..all.len() as u64)
            .map(|i| keyed_rng::absorb(EVAL_STEP_NOISE_DOMAIN, &[seed, i]))
            .collect(),
    )?;
    let eval = EvalSteps {
        noised,
        seeds: &step_seeds,
        latent_shape: &world.latent_shape(),
        device,
    };
    let samples = match guidance {
        None => sample_eval(world, model, &cond, x_t, spec, &eval, threads)?,
        Some(g) => {
            // one encoding of the negative prompt, its row repeated for every sample
            let negative = world
                .encode(&[g.negative_prompt.as_str()], device)?
                .repeat_rows(all.len());
            let guided = Guided {
                positive: cond,
                negative,
            };
            sample_eval(
                world,
                &TrueCfg::new(model, g.scale),
                &guided,
                x_t,
                spec,
                &eval,
                threads,
            )?
        }
    };
    let prompts: Vec<String> = all.iter().map(|p| p.to_string()).collect();
    let scores = world.score(&samples, &prompts)?;
    if scores.len() != samples.len() {
        return Err(TrainerError::ScoreCount {
            expected: samples.len(),
            found: scores.len(),
        });
    }
    let rewards: Vec<f64> = scores
        .iter()
        .map(|c| {
            weights.iter().fold(0.0, |acc, (name, w)| {
                acc + w * c.get(name).unwrap_or(f64::NAN)
            })
        })
        .collect();
    let categories: Vec<&str> = held.iter().map(|h| h.category.as_str()).collect();
    let mut stats = eval_statistics(&rewards, &categories, k)?;
    // every component the scorers gave every sample, with its standard error
    let mut names: Vec<&str> = scores
        .first()
        .map(|c| c.iter().map(|(n, _)| n).collect())
        .unwrap_or_default();
    names.retain(|n| scores.iter().all(|c| c.get(n).is_some()));
    for name in names {
        let values: Vec<f64> = scores
            .iter()
            .map(|c| c.get(name).unwrap_or(f64::NAN))
            .collect();
        let s = eval_statistics(&values, &categories, k)?;
        stats
            .components
            .insert(name.to_string(), (s.mean, s.stderr));
    }
    Ok((samples, stats))
}

/// The domain of the evaluation's per-step-noise seeds (changing it changes every noised
/// evaluation).
const EVAL_STEP_NOISE_DOMAIN: u64 = keyed_rng::fnv1a64(b"flowrl/trainer/eval-step-noise/v1");

/// The stochastic steps of an evaluation and their noise.
struct EvalSteps<'a, D> {
    /// The steps that take the kernel's transition (none: the solver on every step).
    noised: &'a SdeSteps,
    /// One per-step-noise seed per sample of the evaluation.
    seeds: &'a DenoiseSeeds,
    latent_shape: &'a [usize],
    device: &'a D,
}

/// Samples of `x_t`'s rows under `model` (the solver on every step but `eval`'s noised ones),
/// decoded.
fn sample_eval<B, W, M>(
    world: &W,
    model: &M,
    cond: &M::Conditioning,
    x_t: Tensor<Inner<B>, 3>,
    spec: &SamplerSpec,
    eval: &EvalSteps<'_, B::Device>,
    threads: usize,
) -> Result<Vec<W::Sample>, TrainerError>
where
    B: AutodiffBackend,
    W: World<B>,
    M: VelocityModel<Inner<B>> + Sync,
    M::Conditioning: Conditioning,
{
    // blocks of at most EVAL_ROWS_PER_THREAD rows per thread: a wide batch is no faster per
    // sample, and on a CPU backend past a size it loses the written-out broadcasts (the same
    // bits either way: every row is sampled on its own)
    let n = x_t.dims()[0];
    let threads = threads.max(1);
    let block = EVAL_ROWS_PER_THREAD * threads;
    let mut samples = Vec::with_capacity(n);
    let mut start = 0;
    while start < n {
        let rows = start..n.min(start + block);
        let first = rows.start;
        let out = sample_in_chunks(
            model,
            &cond.slice_rows(rows.clone()),
            x_t.clone().slice([rows.clone()]),
            spec,
            eval.noised,
            threads,
            |step, chunk| {
                // `chunk` indexes this block's rows
                let shape = eval.latent_shape;
                let v: Vec<f32> = chunk
                    .clone()
                    .flat_map(|i| eval.seeds.noise(first + i, step, shape))
                    .collect();
                Ok(Tensor::from_data(
                    TensorData::new(v, [chunk.len(), shape[0], shape[1]]),
                    eval.device,
                ))
            },
        )?;
        samples.extend(world.decode(out.final_latents)?);
        start = rows.end;
    }
    Ok(samples)
}

/// An error and its sources on one line (`a: b: c`).
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

fn print_eval(when: &str, e: &EvalReport) {
    let cats: Vec<String> = e
        .by_category
        .iter()
        .map(|(k, v)| format!("{k} {v:.2}"))
        .collect();
    let judges: String = e
        .judges
        .iter()
        .map(|(k, (m, se))| format!("; judge {k} {m:.3} ± {se:.3}"))
        .collect();
    let sde = e.sde.map_or(String::new(), |(m, se)| {
        format!("; SDE pictures {m:.3} ± {se:.3} (gap {:+.3})", e.reward - m)
    });
    println!(
        "held-out eval {when}: {:.3} ± {:.3} ({}){judges}{sde}  {:.1}s",
        e.reward,
        e.stderr,
        cats.join(", "),
        e.seconds
    );
}

/// An evaluation's mean, standard error and per-category means.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalStatistics {
    /// The mean over every sample.
    pub mean: f64,
    /// Its standard error (see [`EvalReport::stderr`]).
    pub stderr: f64,
    /// The mean per category.
    pub by_category: BTreeMap<String, f64>,
    /// The mean and standard error of every component the scorers gave every sample
    /// ([`evaluate_policy`] fills it; empty from [`eval_statistics`]).
    pub components: BTreeMap<String, (f64, f64)>,
}

/// The statistics of an evaluation's rewards, prompt-major (`prompt * k + seed`), with one
/// category per prompt. A NaN reward makes the mean, the standard error and its category's
/// mean NaN.
///
/// ```
/// use trainer_fsdp::TrainerError;
/// use trainer_fsdp::run::eval_statistics;
/// // two prompts, two seeds each
/// let s = eval_statistics(&[0.0, 1.0, 1.0, 1.0], &["a", "b"], 2).unwrap();
/// assert_eq!(s.mean, 0.75);
/// assert_eq!(s.by_category["a"], 0.5);
/// // prompt a's variance over its seeds is 0.5, prompt b's 0: sqrt(0.5 / 2) / 2
/// assert!((s.stderr - 0.25).abs() < 1e-12);
/// assert!(eval_statistics(&[0.0, f64::NAN], &["a"], 2).unwrap().stderr.is_nan());
/// // three rewards are not one per prompt and seed of two prompts of two seeds
/// let err = eval_statistics(&[0.0, 1.0, 1.0], &["a", "b"], 2).unwrap_err();
/// assert!(matches!(
///     err,
///     TrainerError::EvalRewardCount { rewards: 3, prompts: 2, samples_per_prompt: 2 }
/// ));
/// assert!(err.to_string().contains("expected one per prompt and seed (2 x 2)"), "{err}");
/// // a count that overflows `prompts x k` matches no slice
/// assert!(eval_statistics(&[], &["a", "b"], usize::MAX).is_err());
/// ```
///
/// # Errors
/// [`TrainerError::EvalRewardCount`] when `rewards.len() != categories.len() * k`.
pub fn eval_statistics(
    rewards: &[f64],
    categories: &[&str],
    k: usize,
) -> Result<EvalStatistics, TrainerError> {
    if categories.len().checked_mul(k) != Some(rewards.len()) {
        return Err(TrainerError::EvalRewardCount {
            rewards: rewards.len(),
            prompts: categories.len(),
            samples_per_prompt: k,
        });
    }
    let n = rewards.len();
    let mean = rewards.iter().sum::<f64>() / n as f64;
    let mut by: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    for (p, cat) in categories.iter().enumerate() {
        let e = by.entry(cat.to_string()).or_default();
        for r in &rewards[p * k..(p + 1) * k] {
            e.0 += r;
            e.1 += 1;
        }
    }
    let stderr = if k >= 2 {
        let within: f64 = (0..categories.len())
            .map(|p| {
                let xs = &rewards[p * k..(p + 1) * k];
                let m = xs.iter().sum::<f64>() / k as f64;
                xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (k - 1) as f64
            })
            .sum();
        (within / k as f64).sqrt() / categories.len() as f64
    } else if n >= 2 {
        let var = rewards.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64;
        (var / n as f64).sqrt()
    } else {
        f64::NAN
    };
    Ok(EvalStatistics {
        mean,
        stderr,
        by_category: by
            .into_iter()
            .map(|(c, (s, m))| (c, s / m as f64))
            .collect(),
        components: BTreeMap::new(),
    })
}
