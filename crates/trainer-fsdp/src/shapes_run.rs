//! The FlowGRPO loop on the shapes world: the embedded default run.
//!
//! One rollout, as seed 002's "One training step" describes it, each phase a method with its
//! own tests:
//!
//! 1. [`ShapesWorldRun::rollout`]: the rollout's trained SDE steps are resolved once; every
//!    prompt group's candidates get distinct sample ids, hence distinct `x_T` and per-step
//!    noise (`noise-recipe`); Flow-SDE runs on the trained steps and the deterministic solver
//!    elsewhere; one trajectory sidecar per group and one PNG per candidate are written (old
//!    rollouts reaped by retention) and the sidecars are read back, validated, for replay.
//! 2. [`ShapesWorldRun::score`]: the `reward::shapes` composition score of every image,
//!    grouped by prompt; a scorer that returns a missing or non-finite value fails that group.
//! 3. [`advantages`](crate::advantages): group-normalised advantages (flow-grpo).
//! 4. [`ShapesWorldRun::train`]: the pi_old anchor is replayed once under the current weights
//!    before any optimizer step, then `num_updates_per_batch` disjoint updates replay their
//!    samples' trained steps through the live model and step on the clipped objective.
//! 5. [`ShapesWorldRun::evaluate`]: deterministic sampling of the fixed held-out prompts with
//!    fixed seeds, scored; sample grids into the run directory.
//! 6. [`ShapesWorldRun::checkpoint`]: the crash-safe checkpoint of the adapter, optimizer,
//!    RNG and trainer state.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::module::{AutodiffModule, Module};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, Tensor, TensorData};
use dit_models::{AdapterContract, QwenImageConditioning, VelocityModel};
use flow_grpo::{Advantages, ClipLoss, PolicyAnchor, RewardGroup, grpo_clip_loss, log_prob_parity};
use noise_recipe::{DenoiseSeeds, NoiseAlgorithm, NoiseRecipe, PromptMeta, SampleId, SampleIdMode};
use reward::shapes::{self, Category, SceneSpec, ShapesScorer};
use reward::{Batch, RgbImage, Scorer};
use schedule::{PlanQuery, SdeStepPlan, SdeSteps};
use sde_math::solvers::OdeSolver;
use sde_math::{Kernel, StorageDtype};
use trajectory::{
    ArtifactLayout, Candidate, Common, Conditions, Digest, Retention, Split, StoredTensor, Tracks,
    Trajectory, read_sidecar, sampling_fingerprint, write_atomic, write_sidecar,
};

use crate::checkpoint::{CheckpointStore, Resume, TrainerState};
use crate::config::{GeneratorSource, Preflight, TrainConfig, Trainable};
use crate::error::{TrainerError, io_err};
use crate::monitor::{
    Metrics, Monitor, Progress, names, sample_grid, write_png, write_reward_curve,
};
use crate::rng::TrainerRng;
use crate::rollout::{
    BatchRollout, SamplerSpec, chunk_ranges, concat_rollouts, sample_batch, scoped_map,
};
use crate::shapes_world::{
    ShapesGenerator, TOKEN_CHANNELS, TOKEN_GRID, image_shapes, tokens_to_images,
};
use crate::signal::StopFlag;
use crate::train::{
    AdamWOptimizer, PolicyOptimizer, UpdateReport, advantage_metrics, failure_messages,
    train_step_threads,
};

/// The metric of the held-out evaluation's mean reward.
pub const EVAL_REWARD: &str = "eval/reward";

/// The number of held-out prompts per category.
pub const EVAL_PROMPTS_PER_CATEGORY: u64 = 4;

/// The held-out evaluation prompts: 4 per GenEval category, fixed, never used for training
/// (here or in the base generator's pretraining).
pub fn eval_prompts() -> Vec<String> {
    Category::ALL
        .iter()
        .flat_map(|&c| {
            (0..EVAL_PROMPTS_PER_CATEGORY).map(move |i| SceneSpec::sample(c, 10_000 + i).prompt())
        })
        .collect()
}

/// `n` distinct training prompts for a rollout: categories in turn, scenes drawn from the
/// rollout's stream, held-out prompts excluded. A category whose scenes are all used (single
/// objects: three shapes, some of them held out) is passed over.
///
/// # Errors
/// [`TrainerError::PromptPoolExhausted`] when fewer than `n` distinct prompts exist outside
/// the held-out set.
pub fn train_prompts(
    rng: &mut TrainerRng,
    n: usize,
    held_out: &[String],
) -> Result<Vec<String>, TrainerError> {
    let pools: Vec<Vec<String>> = Category::ALL
        .iter()
        .map(|&c| {
            SceneSpec::all(c)
                .iter()
                .map(SceneSpec::prompt)
                .filter(|p| !held_out.contains(p))
                .collect()
        })
        .collect();
    let available: usize = pools.iter().map(Vec::len).sum();
    if n > available {
        return Err(TrainerError::PromptPoolExhausted {
            requested: n,
            available,
        });
    }
    let mut out: Vec<String> = Vec::with_capacity(n);
    let mut k = rng.below(Category::ALL.len() as u64) as usize;
    while out.len() < n {
        let c = k % Category::ALL.len();
        if pools[c].iter().all(|p| out.contains(p)) {
            k += 1;
            continue;
        }
        let p = SceneSpec::sample(Category::ALL[c], rng.next_u64()).prompt();
        if !held_out.contains(&p) && !out.contains(&p) {
            out.push(p);
            k += 1;
        }
    }
    Ok(out)
}

/// One rollout, held in memory for scoring and replay.
#[derive(Debug, Clone)]
pub struct RolloutBatch {
    /// The rollout id.
    pub rollout_id: u64,
    /// One prompt per group.
    pub prompts: Vec<String>,
    /// The trained steps of this rollout.
    pub trained: Vec<usize>,
    /// One record per group, read back from its sidecar.
    pub trajectories: Vec<Trajectory>,
    /// The decoded images, group-major (`group * group_size + slot`).
    pub images: Vec<RgbImage>,
}

impl RolloutBatch {
    /// Candidates per group.
    pub fn group_size(&self) -> usize {
        self.images.len() / self.prompts.len()
    }
}

/// What [`ShapesWorldRun::evaluate`] measured.
#[derive(Debug, Clone)]
pub struct EvalReport {
    /// The mean reward over every held-out sample.
    pub reward: f64,
    /// The mean per GenEval category tag.
    pub by_category: BTreeMap<&'static str, f64>,
    /// The images (first sample of each prompt), for the grid.
    pub images: Vec<RgbImage>,
    /// Wall-clock seconds of the evaluation (sampling, scoring, the grid).
    pub seconds: f64,
}

/// What [`ShapesWorldRun::train`] did.
#[derive(Debug, Clone)]
pub struct TrainReport {
    /// One report per update.
    pub updates: Vec<UpdateReport>,
    /// Max |anchor - rollout log-prob| (0 when replay reproduces the sampler bit for bit).
    pub logp_parity_max_abs: f64,
}

/// The whole run's outcome.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// Held-out reward of the starting policy (before any update of this run).
    pub initial_eval: Option<f64>,
    /// Held-out reward at the end.
    pub final_eval: Option<f64>,
    /// The last completed rollout.
    pub last_rollout: Option<u64>,
    /// Whether a stop request ended the run early.
    pub stopped: bool,
    /// Wall-clock seconds.
    pub seconds: f64,
}

type Policy<B> = ShapesGenerator<B>;
type Optim<B> = PolicyOptimizer<B, Policy<B>, AdamWOptimizer<B, Policy<B>>>;

/// The shapes-world FlowGRPO run.
pub struct ShapesWorldRun<B: AutodiffBackend> {
    cfg: TrainConfig,
    pre: Preflight,
    device: B::Device,
    model: Option<Policy<B>>,
    optimizer: Optim<B>,
    contract: Option<AdapterContract>,
    spec: SamplerSpec,
    scorer: Box<dyn Scorer>,
    rng: TrainerRng,
    next_rollout: u64,
    monitor: Monitor,
    store: CheckpointStore,
    layout: ArtifactLayout,
    run_dir: PathBuf,
    held_out: Vec<String>,
    weight_hash: Digest,
    host_threads: usize,
}

impl<B: AutodiffBackend> ShapesWorldRun<B> {
    /// Loads the generator named by the config, attaches the adapter, and resumes from the
    /// last committed checkpoint when `checkpoint.resume` is set. Writes the resolved config
    /// into `run_dir`.
    ///
    /// # Errors
    /// A non-shapes-world generator, a missing generator directory, checkpoint and IO errors.
    pub fn new(
        cfg: TrainConfig,
        pre: Preflight,
        run_dir: &Path,
        device: B::Device,
    ) -> Result<Self, TrainerError> {
        let GeneratorSource::ShapesWorld { dir } = &cfg.model.generator else {
            return Err(TrainerError::GeneratorUnsupported {
                generator: format!("{:?}", cfg.model.generator),
                missing: "the Qwen-Image pipeline around the transformer: the Qwen2.5-VL text encoder and its \
                          tokenizer, and the VAE decoder (dit-models loads and trains the transformer; PickScore \
                          scores images) — this trainer runs the shapes world until they exist",
            });
        };
        std::fs::create_dir_all(run_dir).map_err(io_err(run_dir, "create the run directory"))?;
        cfg.save_resolved(run_dir)?;
        let mut model = Policy::<B>::load(dir, &device)?;
        let weight_hash =
            Digest::sha256(model.dit.base_model_hash().unwrap_or_default().as_bytes());
        model.text = model.text.no_grad();
        let mut contract = None;
        match &pre.trainable {
            Trainable::Lora(lora) => {
                // the adapter's A matrices are drawn from burn's RNG: seed it from the run
                B::seed(&device, cfg.run.seed);
                model.dit = model.dit.attach_lora(lora)?;
                contract = Some(model.dit.adapter_contract()?);
            }
            Trainable::Full => {}
        }
        let mut optimizer = Optim::<B>::adamw(
            &pre.adamw,
            pre.lr,
            cfg.grpo.clip_grad,
            cfg.model.master_dtype,
        );
        let store = CheckpointStore::new(
            &cfg.checkpoint.dir,
            &cfg.run.task,
            cfg.checkpoint.max_to_keep,
        )?;
        let mut rng = TrainerRng::seeded(cfg.run.seed);
        let mut next_rollout = 0;
        let mut cursor = None;
        if cfg.checkpoint.resume {
            match store.resume(
                model,
                optimizer.optimizer().clone(),
                contract.as_ref(),
                &device,
            )? {
                Resume::Fresh { model: m, .. } => model = m,
                Resume::Resumed(r) => {
                    println!(
                        "resuming from committed checkpoint {} (next rollout {})",
                        r.checkpoint.iteration,
                        r.state.next_rollout_id()
                    );
                    optimizer.set_optimizer(r.optimizer);
                    optimizer.restore(&r.state);
                    model = r.model;
                    rng = r.rng;
                    next_rollout = r.state.next_rollout_id();
                    cursor = Some(r.state.metrics_cursor);
                }
            }
        }
        let monitor = Monitor::open(run_dir, cursor, cfg.monitor.jsonl, cfg.monitor.tensorboard)?;
        let layout = ArtifactLayout::new(&cfg.artifacts.root, &cfg.run.task)?;
        let spec = SamplerSpec {
            sigmas: pre.schedule.sigmas.as_slice().to_vec(),
            kernel: match pre.sde {
                schedule::SdeType::FlowSde => Kernel::flow_sde(cfg.sampling.eta as f32)?,
                schedule::SdeType::Dance => Kernel::dance(cfg.sampling.eta as f32)?,
                schedule::SdeType::Cps => Kernel::cps(cfg.sampling.eta as f32)?,
            },
            solver: OdeSolver::Euler,
            storage: StorageDtype::Bf16,
        };
        let host_threads = cfg.run.threads();
        Ok(Self {
            cfg,
            pre,
            device,
            model: Some(model),
            optimizer,
            contract,
            spec,
            scorer: Box::new(ShapesScorer),
            rng,
            next_rollout,
            monitor,
            store,
            layout,
            run_dir: run_dir.to_path_buf(),
            held_out: eval_prompts(),
            weight_hash,
            host_threads,
        })
    }

    /// Calls `hook` after each durable step of every checkpoint write (crash tests slow the
    /// write window down with it).
    pub fn with_checkpoint_hook(mut self, hook: crate::checkpoint::WriteHook) -> Self {
        self.store = self.store.with_write_hook(hook);
        self
    }

    /// Replaces the scorer (tests inject failing scorers).
    pub fn with_scorer(mut self, scorer: Box<dyn Scorer>) -> Self {
        self.scorer = scorer;
        self
    }

    /// The policy.
    pub fn model(&self) -> &Policy<B> {
        self.model
            .as_ref()
            .expect("the model is only taken during an update")
    }

    /// The next rollout id.
    pub fn next_rollout(&self) -> u64 {
        self.next_rollout
    }

    fn base_seed(&self, rollout_id: u64) -> u64 {
        self.cfg.run.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ rollout_id.wrapping_mul(0xD1B5_4A32_D192_ED03)
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
    ) -> Result<RolloutBatch, TrainerError> {
        let model = self.model().valid();
        let g = self.cfg.grpo.group_size;
        let dev = &self.device;
        let trained = self.pre.plan.steps(PlanQuery::rollout(rollout_id))?;
        let retention = Retention::keep_last(self.cfg.artifacts.retention_rollouts);
        self.layout
            .begin_rollout(Split::Train, rollout_id, retention)?;
        let ids: Vec<SampleId> = prompts
            .iter()
            .enumerate()
            .flat_map(|(gi, p)| {
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
        let latent_shape = vec![TOKEN_GRID * TOKEN_GRID, TOKEN_CHANNELS];
        let x_t = NoiseRecipe::for_samples(
            base,
            latent_shape.clone(),
            &ids,
            NoiseAlgorithm::Pcg64BoxMuller,
        )?
        .generate()
        .to_tensor::<B::InnerBackend, 3>(dev)?;
        let seeds = DenoiseSeeds::for_samples(base ^ 0x57E9_0000_0000_0000, &ids)?;
        let all_prompts: Vec<&String> = prompts
            .iter()
            .flat_map(|p| std::iter::repeat_n(p, g))
            .collect();
        let cond = model.conditioning(&all_prompts, dev)?;
        let out = sample_in_chunks(
            &model,
            &cond,
            x_t,
            &self.spec,
            &trained,
            self.host_threads,
            |step, rows| {
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
        let images = tokens_to_images(out.final_latents.clone())?;

        // one sidecar per group (text states stored exactly, at f32)
        let fingerprint = sampling_fingerprint(
            &[
                ("eta", self.cfg.sampling.eta),
                ("steps", self.cfg.sampling.num_inference_steps as f64),
                ("group_size", g as f64),
            ],
            &self.spec.sigmas,
        )?;
        let states = cond
            .encoder_hidden_states
            .clone()
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .expect("f32");
        let mask: Vec<bool> = cond
            .encoder_hidden_states_mask
            .clone()
            // through int: GPU backends store bools as u8, the CPU backend natively
            .map(|m| m.int().into_data().iter::<i64>().map(|v| v != 0).collect())
            .unwrap_or_default();
        let [_, t, d] = cond.encoder_hidden_states.dims();
        let mut paths = Vec::with_capacity(prompts.len());
        for (gi, _) in prompts.iter().enumerate() {
            let rows = gi * g..(gi + 1) * g;
            let latents: Vec<Tensor<B::InnerBackend, 3>> = out
                .latents
                .iter()
                .map(|l| l.clone().slice([rows.clone()]))
                .collect();
            let log_probs: Vec<Tensor<B::InnerBackend, 1>> = out
                .log_probs
                .iter()
                .map(|l| l.clone().slice([rows.clone()]))
                .collect();
            let first = gi * g * t * d;
            let traj = Trajectory {
                common: Common {
                    task: self.cfg.run.task.clone(),
                    rollout_id,
                    group_index: gi as u64,
                    height: self.cfg.sampling.height,
                    width: self.cfg.sampling.width,
                    sigmas: self.spec.sigmas.clone(),
                    sde_indices: trained.as_slice().to_vec(),
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
                conditions: Conditions {
                    text_embeddings: StoredTensor::from_f32(
                        "conditions.text",
                        &states[first..first + t * d],
                        vec![t, d],
                        StorageDtype::F32,
                    )?,
                    text_mask: mask[gi * g * t..gi * g * t + t].to_vec(),
                    extra: BTreeMap::new(),
                },
                tracks: Tracks::from_rollout(&latents, &log_probs, self.spec.storage)?,
            };
            let path = self
                .layout
                .sidecar_path(Split::Train, rollout_id, gi as u64);
            write_sidecar(&path, &traj)?;
            for slot in 0..g {
                let png =
                    self.layout
                        .sample_image_path(Split::Train, rollout_id, gi as u64, slot as u32);
                write_atomic(&png, &images[gi * g + slot].to_png()?)?;
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
            images,
        })
    }

    /// Phase 2: scores the images and groups the components by prompt.
    ///
    /// # Errors
    /// Scorer errors that concern the whole batch (a group's missing or non-finite value is
    /// not an error here: the advantages phase fails that group).
    pub fn score(&self, batch: &RolloutBatch) -> Result<Vec<RewardGroup>, TrainerError> {
        let g = batch.group_size();
        let prompts: Vec<String> = batch
            .prompts
            .iter()
            .flat_map(|p| std::iter::repeat_n(p.clone(), g))
            .collect();
        let meta: Vec<serde_json::Value> = vec![serde_json::Value::Null; prompts.len()];
        let scores = self.scorer.score(Batch::new(
            Some(&batch.images),
            Some(&prompts),
            Some(&meta),
        )?)?;
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

    /// Phase 4: freezes the pi_old anchor (a replay of every trained step under the current
    /// weights, before any optimizer step), then runs the planned updates.
    ///
    /// # Errors
    /// Replay, loss and optimizer errors.
    pub fn train(
        &mut self,
        batch: &RolloutBatch,
        adv: &Advantages,
    ) -> Result<TrainReport, TrainerError> {
        let plan = &self.pre.update_plan;
        let dev = self.device.clone();
        // The anchor is replayed through the same (autodiff) model and code path the updates
        // use, so the first update's ratio is exactly 1; the sampler's own log-probs (a
        // forward without autodiff) are compared with it as `logp_parity`.
        let mut recorder = flow_grpo::AnchorRecorder::new(plan);
        let mut rollout_lp = Vec::new();
        let micro: Vec<Range<usize>> = plan.micro_batches().cloned().collect();
        let threads = self.host_threads.clamp(1, micro.len().max(1));
        let replicas = crate::train::autodiff_replicas(self.model(), threads);
        for wave in micro.chunks(threads) {
            let jobs: Vec<(&Range<usize>, &Policy<B>)> = wave.iter().zip(&replicas).collect();
            let lps = scoped_map(&jobs, |(mb, model)| {
                replay(model, &self.spec, batch, (*mb).clone(), &dev).map(|lp| lp.detach())
            });
            for (mb, lp) in wave.iter().zip(lps) {
                recorder.record(mb.clone(), lp?)?;
            }
        }
        for traj in &batch.trajectories {
            rollout_lp.extend(traj.tracks.log_probs.iter().map(|v| f64::from(*v)));
        }
        let anchor: PolicyAnchor = recorder.freeze()?;
        let anchor_all = anchor.log_probs::<B::InnerBackend>(0..plan.num_samples, &dev)?;
        let parity = log_prob_parity(
            anchor_all,
            Tensor::<B::InnerBackend, 2>::from_data(
                TensorData::new(rollout_lp, [plan.num_samples, batch.trained.len()]),
                &dev,
            ),
        )?;
        let degenerate = adv.degenerate;
        let clip = self.pre.clip_range;
        let spec = self.spec.clone();
        let mut reports = Vec::with_capacity(plan.updates.len());
        for update in &plan.updates {
            let model = self.model.take().expect("model present");
            let (model, report) = train_step_threads(
                model,
                &mut self.optimizer,
                update,
                degenerate,
                self.host_threads,
                |m: &Policy<B>, samples: Range<usize>| -> Result<ClipLoss<B>, TrainerError> {
                    let lp = replay(m, &spec, batch, samples.clone(), &dev)?;
                    let idx: Vec<usize> = samples.clone().collect();
                    Ok(grpo_clip_loss(
                        lp,
                        anchor.log_probs::<B>(samples, &dev)?,
                        adv.tensor::<B>(&idx, &dev),
                        clip,
                    )?)
                },
            )?;
            self.model = Some(model);
            reports.push(report);
        }
        Ok(TrainReport {
            updates: reports,
            logp_parity_max_abs: parity.max_abs_diff,
        })
    }

    /// Phase 5: deterministic sampling (the solver on every step) of the held-out prompts,
    /// `eval.samples_per_prompt` fixed seeds each; writes a sample grid.
    ///
    /// # Errors
    /// Sampling, scoring and PNG errors.
    pub fn evaluate(&self, tag: &str) -> Result<EvalReport, TrainerError> {
        let start = Instant::now();
        let model = self.model().valid();
        let k = self.cfg.eval.samples_per_prompt.max(1);
        let (images, report) = evaluate_prompts(
            &model,
            &self.spec,
            &self.held_out,
            k,
            self.cfg.run.seed,
            self.host_threads,
            &self.device,
        )?;
        let firsts: Vec<RgbImage> = images.iter().step_by(k).cloned().collect();
        let tiles: Vec<image::RgbImage> = firsts
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
        let grid = sample_grid(&tiles, None, 8)?;
        let dir = self.run_dir.join("samples");
        std::fs::create_dir_all(&dir).map_err(io_err(&dir, "create the samples directory"))?;
        write_png(&dir.join(format!("eval_{tag}.png")), &grid)?;
        Ok(EvalReport {
            images: firsts,
            seconds: start.elapsed().as_secs_f64(),
            ..report
        })
    }

    /// Phase 6: a committed checkpoint after rollout `rollout_id`.
    ///
    /// # Errors
    /// Checkpoint IO errors.
    pub fn checkpoint(&mut self, rollout_id: u64) -> Result<(), TrainerError> {
        let mut state = TrainerState::new(&self.cfg.run.task, rollout_id);
        self.optimizer.record_into(&mut state);
        state.metrics_cursor = self.monitor.cursor();
        self.store.save(
            self.model(),
            self.optimizer.optimizer(),
            &state,
            &self.rng,
            self.contract.as_ref(),
        )?;
        Ok(())
    }

    /// Runs rollouts until `run.num_rollouts` or a stop request (which ends after a committed
    /// checkpoint), evaluating at the start, every `eval.interval` rollouts and at the end.
    ///
    /// # Errors
    /// Any phase's error (a failed reward group is not an error: it is logged and skipped).
    pub fn run(&mut self, stop: &StopFlag) -> Result<RunSummary, TrainerError> {
        let start = Instant::now();
        let total = self.cfg.run.num_rollouts;
        let mut summary = RunSummary {
            initial_eval: None,
            final_eval: None,
            last_rollout: None,
            stopped: false,
            seconds: 0.0,
        };
        let interval = self.cfg.eval.interval;
        if interval > 0 {
            let e = self.evaluate(&format!("rollout_{:04}", self.next_rollout))?;
            self.print_eval("start", &e);
            summary.initial_eval = Some(e.reward);
            self.monitor.log(
                self.next_rollout,
                &Metrics::from([(EVAL_REWARD.to_string(), e.reward)]),
            )?;
        }
        let progress = Progress::new(
            "rollouts",
            total.saturating_sub(self.next_rollout),
            self.cfg.monitor.progress,
        );
        while self.next_rollout < total {
            let id = self.next_rollout;
            let mut metrics = Metrics::new();
            let t0 = Instant::now();
            let prompts = train_prompts(
                &mut self.rng,
                self.cfg.grpo.prompts_per_rollout,
                &self.held_out,
            )?;
            let batch = self.rollout(id, &prompts)?;
            let t_rollout = t0.elapsed().as_secs_f64();
            let t1 = Instant::now();
            let groups = self.score(&batch)?;
            let t_score = t1.elapsed().as_secs_f64();
            let adv = crate::train::advantages(&self.pre.advantages, &groups, None)?;
            for line in failure_messages(&adv) {
                println!("rollout {id}: {line}");
            }
            metrics.extend(advantage_metrics(&adv));
            let t2 = Instant::now();
            let report = self.train(&batch, &adv)?;
            let t_train = t2.elapsed().as_secs_f64();
            if let Some(last) = report.updates.last() {
                metrics.extend(last.metrics());
            }
            metrics.insert(
                "train/logp_parity_max_abs".into(),
                report.logp_parity_max_abs,
            );
            let n = batch.images.len() as f64;
            metrics.insert(names::phase_time("rollout"), t_rollout);
            metrics.insert(names::phase_time("score"), t_score);
            metrics.insert(names::phase_time("train"), t_train);
            metrics.insert("perf/rollout_samples_per_s".into(), n / t_rollout);
            metrics.insert(
                "perf/train_transitions_per_s".into(),
                n * batch.trained.len() as f64 / t_train,
            );
            let reward_mean = metrics
                .get("reward/shapes_mean")
                .copied()
                .unwrap_or(f64::NAN);
            self.next_rollout = id + 1;
            summary.last_rollout = Some(id);
            let evaluate_now = interval > 0
                && (self.next_rollout.is_multiple_of(interval) || self.next_rollout == total);
            if evaluate_now {
                let e = self.evaluate(&format!("rollout_{:04}", self.next_rollout))?;
                self.print_eval(&format!("after rollout {id}"), &e);
                metrics.insert(EVAL_REWARD.into(), e.reward);
                metrics.insert(names::phase_time("eval"), e.seconds);
                summary.final_eval = Some(e.reward);
            }
            self.monitor.log(id, &metrics)?;
            progress.inc(1);
            println!(
                "rollout {id:>3}: reward {reward_mean:.3}  loss {:.2e}  clip {:.2}  ratio [{:.4}, {:.4}]  {:.1}s rollout / {:.1}s train",
                metrics.get(names::TRAIN_LOSS).copied().unwrap_or(f64::NAN),
                metrics
                    .get(names::TRAIN_CLIP_FRACTION)
                    .copied()
                    .unwrap_or(f64::NAN),
                metrics
                    .get(names::TRAIN_RATIO_MIN)
                    .copied()
                    .unwrap_or(f64::NAN),
                metrics
                    .get(names::TRAIN_RATIO_MAX)
                    .copied()
                    .unwrap_or(f64::NAN),
                t_rollout,
                t_train,
            );
            let save_now = self.cfg.checkpoint.save_interval > 0
                && self
                    .next_rollout
                    .is_multiple_of(self.cfg.checkpoint.save_interval);
            if save_now || self.next_rollout == total || stop.is_set() {
                self.checkpoint(id)?;
            }
            if stop.is_set() {
                println!("stop requested: checkpoint after rollout {id} committed");
                summary.stopped = true;
                break;
            }
        }
        progress.finish();
        if let Some(jsonl) = self.monitor.jsonl_path() {
            write_reward_curve(
                &jsonl,
                &["reward/shapes_mean", EVAL_REWARD],
                &self.run_dir.join("reward_curve.png"),
                "shapes reward",
            )?;
        }
        summary.seconds = start.elapsed().as_secs_f64();
        Ok(summary)
    }

    fn print_eval(&self, when: &str, e: &EvalReport) {
        let cats: Vec<String> = e
            .by_category
            .iter()
            .map(|(k, v)| format!("{k} {v:.2}"))
            .collect();
        println!(
            "held-out eval {when}: {:.3} ({})  {:.1}s",
            e.reward,
            cats.join(", "),
            e.seconds
        );
    }
}

/// Deterministic sampling (the solver on every step) of `prompts`, `samples_per_prompt`
/// fixed seeds each (a pure function of `seed`), scored by `reward::shapes`: the images
/// (prompt-major) and the mean reward overall and per GenEval category. `threads` sample
/// chunks side by side ([`sample_in_chunks`]; the same bits for any value).
///
/// # Errors
/// Sampling, noise and prompt errors.
pub fn evaluate_prompts<Bi: Backend>(
    model: &ShapesGenerator<Bi>,
    spec: &SamplerSpec,
    prompts: &[String],
    samples_per_prompt: usize,
    seed: u64,
    threads: usize,
    device: &Bi::Device,
) -> Result<(Vec<RgbImage>, EvalReport), TrainerError> {
    let start = Instant::now();
    let k = samples_per_prompt.max(1);
    let all: Vec<&String> = prompts
        .iter()
        .flat_map(|p| std::iter::repeat_n(p, k))
        .collect();
    let x_t = NoiseRecipe::new(
        seed ^ 0xE7A1_0000,
        vec![TOKEN_GRID * TOKEN_GRID, TOKEN_CHANNELS],
        (0..all.len() as u64).collect(),
        NoiseAlgorithm::Pcg64BoxMuller,
    )?
    .generate()
    .to_tensor::<Bi, 3>(device)?;
    let cond = model.conditioning(&all, device)?;
    let out = sample_in_chunks(
        model,
        &cond,
        x_t,
        spec,
        &SdeSteps::new([]),
        threads,
        |step, _| Err(TrainerError::TrainedStepOutOfRange { step, steps: 0 }),
    )?;
    let images = tokens_to_images(out.final_latents)?;
    let mut by: BTreeMap<&'static str, (f64, usize)> = BTreeMap::new();
    let mut total = 0.0;
    for (p, img) in all.iter().zip(&images) {
        let scene = SceneSpec::parse(p)?;
        let s = shapes::judge(&scene, img).score;
        total += s;
        let e = by.entry(scene.category().tag()).or_default();
        e.0 += s;
        e.1 += 1;
    }
    let report = EvalReport {
        reward: total / images.len() as f64,
        by_category: by
            .into_iter()
            .map(|(c, (s, n))| (c, s / n as f64))
            .collect(),
        images: Vec::new(),
        seconds: start.elapsed().as_secs_f64(),
    };
    Ok((images, report))
}

/// The log-probs `[samples, trained steps]` of a range of the rollout's samples (group-major
/// indices) under `model`, replayed from the stored trajectories through the kernel.
///
/// Every trained step of every sample in the range goes through the model in one forward of
/// `samples x trained steps` rows (step-major): at these model sizes one wide forward costs
/// far less than one per group and step. The log-probs do not depend on how rows are batched
/// beyond float rounding, and the anchor and the updates replay through this same function.
///
/// # Errors
/// Record and kernel errors; [`TrainerError::ReplaySigmas`] if the trajectories disagree on a
/// trained step's noise levels.
pub fn replay<Bx: Backend>(
    model: &ShapesGenerator<Bx>,
    spec: &SamplerSpec,
    batch: &RolloutBatch,
    samples: Range<usize>,
    device: &Bx::Device,
) -> Result<Tensor<Bx, 2>, TrainerError> {
    let g = batch.group_size();
    let mut chunks = Vec::new();
    let mut i = samples.start;
    while i < samples.end {
        let gi = i / g;
        let end = samples.end.min((gi + 1) * g);
        chunks.push((gi, (i - gi * g)..(end - gi * g)));
        i = end;
    }
    let n = samples.len();
    let steps = batch.trained.len();
    if n == 0 || steps == 0 {
        return Ok(Tensor::zeros([n, steps], device));
    }
    let mut states = Vec::with_capacity(chunks.len());
    let mut masks = Vec::with_capacity(chunks.len());
    for (gi, slots) in &chunks {
        let c = stored_conditioning::<Bx>(&batch.trajectories[*gi], slots.len(), device)?;
        states.push(c.encoder_hidden_states);
        masks.push(
            c.encoder_hidden_states_mask
                .expect("stored conditioning has a mask"),
        );
    }
    let cond = QwenImageConditioning {
        encoder_hidden_states: Tensor::cat(states, 0).repeat_dim(0, steps),
        encoder_hidden_states_mask: Some(Tensor::cat(masks, 0).repeat_dim(0, steps)),
        img_shapes: image_shapes(),
    };
    let mut step_sigmas = Vec::with_capacity(steps);
    let mut xs = Vec::with_capacity(steps * chunks.len());
    let mut prevs = Vec::with_capacity(steps * chunks.len());
    for s in 0..steps {
        let mut first: Option<sde_math::StepSigmas> = None;
        for (gi, slots) in &chunks {
            let inputs =
                batch.trajectories[*gi].replay_inputs::<Bx, 3>(s, slots.clone(), device)?;
            match first {
                None => first = Some(inputs.sigmas),
                Some(f) if f != inputs.sigmas => {
                    return Err(TrainerError::ReplaySigmas {
                        trained: s,
                        first: (f.sigma(), f.sigma_next()),
                        other: (inputs.sigmas.sigma(), inputs.sigmas.sigma_next()),
                        trajectory: *gi,
                    });
                }
                Some(_) => {}
            }
            xs.push(inputs.sample);
            prevs.push(inputs.prev_sample);
        }
        step_sigmas.push(first.expect("at least one chunk"));
    }
    let sigma_rows: Vec<f32> = step_sigmas
        .iter()
        .flat_map(|sg| std::iter::repeat_n(sg.sigma(), n))
        .collect();
    let sigma = Tensor::<Bx, 1>::from_data(TensorData::new(sigma_rows, [n * steps]), device);
    let x = Tensor::cat(xs, 0);
    let prev = Tensor::cat(prevs, 0);
    let v = model.velocity(x.clone(), sigma, &cond);
    let mut cols = Vec::with_capacity(steps);
    for (s, sg) in step_sigmas.into_iter().enumerate() {
        // the stored latents are exact storage-precision values: no second round trip
        let out = spec.kernel.replay(
            &sg.into(),
            v.clone().narrow(0, s * n, n),
            x.clone().narrow(0, s * n, n),
            prev.clone().narrow(0, s * n, n),
            StorageDtype::Native,
        )?;
        cols.push(out.log_prob.unsqueeze_dim(1));
    }
    Ok(Tensor::cat(cols, 1))
}

/// Samples a batch in `threads` chunks side by side (at these sizes the CPU backend runs one
/// forward on about one core). `noise(step, rows)` gives the noise of rows `rows` of the batch
/// at a trained step. Each sample's noise depends on its own rows only and the chunks take
/// slices of the one conditioning, so the result is the batch's whatever the chunking.
///
/// # Errors
/// The first chunk's error.
pub fn sample_in_chunks<Bx, F>(
    model: &ShapesGenerator<Bx>,
    cond: &QwenImageConditioning<Bx>,
    x_t: Tensor<Bx, 3>,
    spec: &SamplerSpec,
    trained: &SdeSteps,
    threads: usize,
    noise: F,
) -> Result<BatchRollout<Bx>, TrainerError>
where
    Bx: Backend,
    F: Fn(usize, Range<usize>) -> Result<Tensor<Bx, 3>, TrainerError> + Sync,
{
    let ranges = chunk_ranges(x_t.dims()[0], threads);
    let parts = scoped_map(&ranges, |r| {
        let x = x_t.clone().slice([r.clone()]);
        let c = slice_conditioning(cond, r.clone());
        sample_batch(model, &c, x, spec, trained, |step| noise(step, r.clone()))
    });
    Ok(concat_rollouts(
        parts.into_iter().collect::<Result<Vec<_>, _>>()?,
    ))
}

/// Rows `range` of a batch's conditioning.
fn slice_conditioning<Bx: Backend>(
    cond: &QwenImageConditioning<Bx>,
    range: Range<usize>,
) -> QwenImageConditioning<Bx> {
    QwenImageConditioning {
        encoder_hidden_states: cond.encoder_hidden_states.clone().slice([range.clone()]),
        encoder_hidden_states_mask: cond
            .encoder_hidden_states_mask
            .clone()
            .map(|m| m.slice([range])),
        img_shapes: cond.img_shapes.clone(),
    }
}

/// The frozen conditioning of a group, repeated for `n` candidates.
fn stored_conditioning<Bx: Backend>(
    traj: &Trajectory,
    n: usize,
    device: &Bx::Device,
) -> Result<QwenImageConditioning<Bx>, TrainerError> {
    let shape = traj.conditions.text_embeddings.shape().to_vec();
    let values = traj.conditions.text_embeddings.to_f32();
    let states =
        Tensor::<Bx, 3>::from_data(TensorData::new(values, [1, shape[0], shape[1]]), device)
            .repeat_dim(0, n);
    let mask = Tensor::<Bx, 2, Bool>::from_data(
        TensorData::new(traj.conditions.text_mask.clone(), [1, shape[0]]),
        device,
    )
    .repeat_dim(0, n);
    Ok(QwenImageConditioning {
        encoder_hidden_states: states,
        encoder_hidden_states_mask: Some(mask),
        img_shapes: image_shapes(),
    })
}
