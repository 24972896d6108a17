//! From a config to concrete types: the world its `model.generator` names and the algorithm
//! its objective names, handed to a [`Job`] that is generic over both (the main example's job
//! builds a [`Run`] and runs it).
//!
//! ```no_run
//! use burn::backend::{Autodiff, Flex};
//! use trainer_fsdp::dispatch::{Job, dispatch};
//! use trainer_fsdp::{Algorithm, RecipeName, TrainConfig, TrainerError, World};
//!
//! type B = Autodiff<Flex>;
//! struct Describe;
//! impl Job<B> for Describe {
//!     type Output = String;
//!     fn run<W: World<B>, A: Algorithm<B, W>>(self, world: W, algorithm: A) -> Result<String, TrainerError> {
//!         Ok(format!("{} in the {}", algorithm.name(), world.name()))
//!     }
//! }
//! let cfg = TrainConfig::from_recipe(RecipeName::ShapesWorldLora, &[])?;
//! let pre = cfg.preflight()?;
//! println!("{}", dispatch::<B, _>(&cfg, &pre, &Default::default(), Describe)?);
//! # Ok::<(), TrainerError>(())
//! ```

use std::path::{Path, PathBuf};

use burn::tensor::backend::AutodiffBackend;

use crate::algorithm::{Algorithm, FlowGrpo};
use crate::awm::Awm;
use crate::config::{
    AlgorithmPlan, GeneratorSource, LrSchedulerKind, Preflight, SdeKind, TrainConfig,
    TrainableMode, WindowStrategyKind,
};
use crate::dpo::Dpo;
use crate::error::TrainerError;
use crate::fdfo::Fdfo;
use crate::guard::GrpoGuard;
use crate::nft::Nft;
use crate::qwen_image_world::QwenImageWorld;
use crate::raft::Raft;
use crate::run::{Run, RunSummary};
use crate::shapes_world::ShapesWorld;
use crate::signal::StopFlag;
use crate::workers::LocalWorkers;
use crate::world::World;

/// Work to do with whichever world and algorithm a config names.
pub trait Job<B: AutodiffBackend> {
    /// What the job returns.
    type Output;

    /// Does the work with the configured world and algorithm.
    ///
    /// # Errors
    /// The job's own.
    fn run<W: World<B>, A: Algorithm<B, W>>(
        self,
        world: W,
        algorithm: A,
    ) -> Result<Self::Output, TrainerError>;
}

/// Work to do with whichever world a config names (no algorithm: export, inspection).
pub trait WorldJob<B: AutodiffBackend> {
    /// What the job returns.
    type Output;

    /// Does the work with the configured world.
    ///
    /// # Errors
    /// The job's own.
    fn run<W: World<B>>(self, world: W) -> Result<Self::Output, TrainerError>;
}

/// Loads the world that `cfg.model.generator` names and runs `job` with it.
///
/// # Errors
/// World loading errors, and the job's errors.
pub fn with_world<B: AutodiffBackend, J: WorldJob<B>>(
    cfg: &TrainConfig,
    device: &B::Device,
    job: J,
) -> Result<J::Output, TrainerError> {
    match &cfg.model.generator {
        GeneratorSource::ShapesWorld { dir } => {
            let world = ShapesWorld::<B::InnerBackend>::load(dir, &cfg.all_scorers(), device)?
                .with_prompt_files(&cfg.data)?;
            job.run(world)
        }
        GeneratorSource::QwenImage {
            model_path,
            variant,
        } => {
            let world = QwenImageWorld::<B::InnerBackend>::load_in(
                model_path,
                variant.as_deref(),
                cfg.model.weight_dtype(),
                &cfg.sampling,
                &cfg.data,
                &cfg.all_scorers(),
                device,
            )?;
            job.run(world)
        }
    }
}

/// Loads the world that `cfg.model.generator` names, builds the algorithm of the validated
/// config, and runs `job` with both.
///
/// # Errors
/// As [`with_world`], and the job's errors.
pub fn dispatch<B: AutodiffBackend, J: Job<B>>(
    cfg: &TrainConfig,
    pre: &Preflight,
    device: &B::Device,
    job: J,
) -> Result<J::Output, TrainerError> {
    with_world(cfg, device, WithAlgorithm { pre, job })
}

/// A [`Job`] as a [`WorldJob`]: the algorithm of the validated config added.
struct WithAlgorithm<'a, J> {
    pre: &'a Preflight,
    job: J,
}

impl<B: AutodiffBackend, J: Job<B>> WorldJob<B> for WithAlgorithm<'_, J> {
    type Output = J::Output;

    fn run<W: World<B>>(self, world: W) -> Result<J::Output, TrainerError> {
        with_algorithm(self.pre, world, self.job)
    }
}

/// Runs `job` in `world` with the algorithm of the validated config: [`dispatch`] for a
/// world built by the caller (a world of one's own, or a configured one with another scorer).
///
/// # Errors
/// The job's errors.
pub fn with_algorithm<B: AutodiffBackend, W: World<B>, J: Job<B>>(
    pre: &Preflight,
    world: W,
    job: J,
) -> Result<J::Output, TrainerError> {
    // each arm's plan builds its algorithm: `from_plan` matches the same variants
    let plan = &pre.algorithm;
    match plan {
        AlgorithmPlan::FlowGrpo { .. } | AlgorithmPlan::Dpok { .. } => {
            job.run(world, FlowGrpo::from_plan(plan).expect("its plan"))
        }
        AlgorithmPlan::Awm { .. } => job.run(world, Awm::from_plan(plan).expect("its plan")),
        AlgorithmPlan::Nft { .. } => job.run(world, Nft::from_plan(plan).expect("its plan")),
        AlgorithmPlan::Dpo { .. } => job.run(world, Dpo::from_plan(plan).expect("its plan")),
        AlgorithmPlan::Fdfo { .. } => job.run(world, Fdfo::from_plan(plan).expect("its plan")),
        AlgorithmPlan::Raft { .. } => job.run(world, Raft::from_plan(plan).expect("its plan")),
        AlgorithmPlan::GrpoGuard { .. } => {
            job.run(world, GrpoGuard::from_plan(plan).expect("its plan"))
        }
    }
}

/// An algorithm built from the validated `[algorithm]` of a config: the one place a plan's
/// fields become an algorithm's.
pub trait FromPlan: Sized {
    /// The algorithm of `plan`, `None` when the plan is another algorithm's.
    fn from_plan(plan: &AlgorithmPlan) -> Option<Self>;
}

impl FromPlan for FlowGrpo {
    /// FlowGRPO's and DPOK's plans (DPOK is FlowGRPO's replay with its own objective).
    fn from_plan(plan: &AlgorithmPlan) -> Option<Self> {
        match *plan {
            AlgorithmPlan::FlowGrpo {
                clip_range,
                anchor,
                kl_coef,
                timestep_subset,
            } => {
                let g = FlowGrpo::new(clip_range)
                    .with_anchor(anchor)
                    .with_kl(kl_coef);
                Some(match timestep_subset {
                    Some(t) => g.with_timestep_subset(t),
                    None => g,
                })
            }
            AlgorithmPlan::Dpok {
                clip_range,
                reward_weight,
                kl_coef,
                kl_warmup_rollouts,
                anchor,
                value_baseline,
            } => Some(
                FlowGrpo::dpok_with_value_baseline(clip_range, reward_weight, value_baseline)
                    .with_anchor(anchor)
                    .with_kl(kl_coef)
                    .with_kl_warmup(kl_warmup_rollouts),
            ),
            _ => None,
        }
    }
}

impl FromPlan for GrpoGuard {
    fn from_plan(plan: &AlgorithmPlan) -> Option<Self> {
        match *plan {
            AlgorithmPlan::GrpoGuard {
                clip_range,
                kl_coef,
            } => Some(GrpoGuard {
                clip: clip_range,
                kl_coef,
            }),
            _ => None,
        }
    }
}

impl FromPlan for Awm {
    fn from_plan(plan: &AlgorithmPlan) -> Option<Self> {
        match *plan {
            AlgorithmPlan::Awm {
                clip_range,
                weighting,
                advantage_limit,
                kl_coef,
                ema_kl_coef,
            } => Some(Awm {
                clip: clip_range,
                weighting,
                advantage_limit,
                kl_coef,
                ema_kl_coef,
            }),
            _ => None,
        }
    }
}

impl FromPlan for Nft {
    fn from_plan(plan: &AlgorithmPlan) -> Option<Self> {
        match *plan {
            AlgorithmPlan::Nft {
                beta,
                advantage_limit,
                soft_update,
                kl_coef,
            } => Some(Nft {
                beta,
                advantage_limit,
                soft_update,
                kl_coef,
            }),
            _ => None,
        }
    }
}

impl FromPlan for Dpo {
    fn from_plan(plan: &AlgorithmPlan) -> Option<Self> {
        match *plan {
            AlgorithmPlan::Dpo { beta } => Some(Dpo { beta }),
            _ => None,
        }
    }
}

impl FromPlan for Raft {
    fn from_plan(plan: &AlgorithmPlan) -> Option<Self> {
        match *plan {
            AlgorithmPlan::Raft { top_k } => Some(Raft { top_k }),
            _ => None,
        }
    }
}

impl FromPlan for Fdfo {
    fn from_plan(plan: &AlgorithmPlan) -> Option<Self> {
        match *plan {
            AlgorithmPlan::Fdfo { eps } => Some(Fdfo { eps }),
            _ => None,
        }
    }
}

/// Trains the configured world with the configured algorithm on one process (the main job):
/// prints a one-line banner, runs [`Run::run`] and returns its summary. `stop` ends the run
/// after a committed checkpoint.
///
/// # Errors
/// As [`dispatch`] and [`Run::new`] / [`Run::run`].
pub fn train<B: AutodiffBackend>(
    cfg: &TrainConfig,
    pre: &Preflight,
    run_dir: &Path,
    device: &B::Device,
    stop: &StopFlag,
) -> Result<RunSummary, TrainerError> {
    let job = TrainJob::<B> {
        cfg: cfg.clone(),
        pre: pre.clone(),
        run_dir: run_dir.to_path_buf(),
        device: device.clone(),
        stop: stop.clone(),
    };
    dispatch(cfg, pre, device, job)
}

/// [`train`] in a world the caller built (a world of one's own, or a configured one with
/// another scorer): the configured algorithm ([`with_algorithm`]), the banner, [`Run::run`].
///
/// # Errors
/// As [`Run::new`] / [`Run::run`].
pub fn train_in<B: AutodiffBackend, W: World<B>>(
    world: W,
    cfg: &TrainConfig,
    pre: &Preflight,
    run_dir: &Path,
    device: &B::Device,
    stop: &StopFlag,
) -> Result<RunSummary, TrainerError> {
    let job = TrainJob::<B> {
        cfg: cfg.clone(),
        pre: pre.clone(),
        run_dir: run_dir.to_path_buf(),
        device: device.clone(),
        stop: stop.clone(),
    };
    with_algorithm(pre, world, job)
}

/// [`train`]'s job.
struct TrainJob<B: AutodiffBackend> {
    cfg: TrainConfig,
    pre: Preflight,
    run_dir: PathBuf,
    device: B::Device,
    stop: StopFlag,
}

impl<B: AutodiffBackend> Job<B> for TrainJob<B> {
    type Output = RunSummary;

    fn run<W: World<B>, A: Algorithm<B, W>>(
        self,
        world: W,
        algorithm: A,
    ) -> Result<RunSummary, TrainerError> {
        let cfg = self.cfg;
        println!(
            "{}",
            banner(&cfg, algorithm.name(), &world.name(), &self.run_dir)
        );
        let workers = LocalWorkers::new(cfg.run.threads());
        let mut run = Run::new(
            cfg,
            self.pre,
            &self.run_dir,
            self.device,
            world,
            algorithm,
            workers,
        )?;
        run.run(&self.stop)
    }
}

/// The one-line banner of a training run.
fn banner(cfg: &TrainConfig, algorithm: &str, world: &str, run_dir: &Path) -> String {
    format!(
        "flowrl {} ({}) in the {}: {} rollouts of {} prompts x {} candidates{}, {} steps ({}; {}), {}{}, lr {}{}, seed {}; run directory {}",
        algorithm,
        cfg.recipe.map(|r| r.as_str()).unwrap_or("config file"),
        world,
        cfg.run.num_rollouts,
        cfg.rollout.prompts_per_rollout,
        cfg.rollout.group_size,
        if cfg.rollout.shared_initial_noise {
            " (one x_T per group)"
        } else {
            ""
        },
        cfg.sampling.num_inference_steps,
        trained_steps(cfg),
        rollout_noise(cfg),
        match cfg.model.trainable_mode {
            TrainableMode::Full => "every weight trained (full fine-tune)".to_string(),
            TrainableMode::Lora => format!("LoRA rank {}", cfg.lora_rank()),
        },
        match cfg.lora.as_ref().and_then(|l| l.init_from.as_ref()) {
            Some(p) => format!(" started from {}", p.display()),
            None => String::new(),
        },
        cfg.optimizer.lr,
        lr_shape(cfg),
        cfg.run.seed,
        run_dir.display(),
    )
}

/// The banner's description of how the rate moves after `lr` (nothing for a constant one).
fn lr_shape(cfg: &TrainConfig) -> String {
    let o = &cfg.optimizer;
    let shape = match o.lr_scheduler {
        LrSchedulerKind::Constant => return String::new(),
        LrSchedulerKind::Linear => "linearly",
        LrSchedulerKind::Cosine => "along a cosine",
    };
    match o.lr_decay_iters {
        Some(d) => format!(" decaying {shape} to {} at optimizer step {d}", o.min_lr),
        None => format!(" decaying {shape} to {}", o.min_lr),
    }
}

/// The banner's description of the rollouts' noise at the trained steps.
fn rollout_noise(cfg: &TrainConfig) -> String {
    let eta = cfg.sampling.eta;
    if eta == 0.0 {
        return "deterministic rollouts".to_string();
    }
    match cfg.sampling.sde_type {
        SdeKind::FlowSde => format!("Flow-SDE eta {eta}"),
        SdeKind::Dance => format!("the Dance kernel at eta {eta}"),
        SdeKind::Cps => format!("CPS noise level {eta}"),
        SdeKind::Churn => format!("churn gamma {eta}"),
    }
}

/// The banner's description of the trained steps.
fn trained_steps(cfg: &TrainConfig) -> String {
    let s = &cfg.sampling;
    let fraction = || {
        let [lo, hi] = s.sde_timestep_fraction.unwrap_or([0.0, 1.0]);
        format!("the fraction window [{lo}, {hi}]")
    };
    if let Some(w) = &s.sde_window {
        let strategy = match w.strategy {
            WindowStrategyKind::Progressive => "progressive",
            WindowStrategyKind::Random => "random",
            WindowStrategyKind::Decay => "decay",
            WindowStrategyKind::ExpDecay => "exp_decay",
        };
        return format!(
            "{} trained in a {strategy} sliding window (moved after {} rollouts)",
            w.size, w.shift_interval
        );
    }
    match (&s.sde_pool, &s.sde_indices) {
        (Some(pool), _) if s.sde_resample_per_rollout => format!(
            "{} trained, redrawn per rollout from {pool:?}",
            s.num_sde_steps
        ),
        (None, _) if s.sde_resample_per_rollout => format!(
            "{} trained, redrawn per rollout from {}",
            s.num_sde_steps,
            fraction()
        ),
        (_, Some(fixed)) => format!("trained {fixed:?}"),
        _ => format!("{} trained, picked from {}", s.num_sde_steps, fraction()),
    }
}

/// Trains the configured world with the configured algorithm on `devices.len()` ranks of this
/// process, one thread and one policy replica per device, on burn's collective runtime
/// ([`launch_ranks`](crate::ranks::launch_ranks)); one device is [`train`].
///
/// Every rank rolls out, scores and trains its share of each rollout's prompt groups
/// ([`Preflight::for_ranks`]), every update's gradients are all-reduced, and the IO rank (0)
/// evaluates, logs and checkpoints. The checkpoint does not depend on the number of ranks: a
/// run resumes on any number that divides its batch. When a rank fails (an error or a panic)
/// every rank ends and the run returns [`TrainerError::RankFailed`] naming the first that
/// failed. A stop request ends the run after the rollout the ranks are in, with a committed
/// checkpoint.
///
/// On several machines (`node`: this machine's place, burn's orchestrator), every machine
/// runs this with the same config and as many devices; the run directory, checkpoints and
/// artifacts must be on a filesystem they share (rank 0 writes the run's files, the others
/// write their groups' sidecars beside them and read the checkpoint rank 0 resumed from).
/// A failure there ends this machine's ranks and, once its process exits, the other
/// machines' ranks at their next collective (the lost peer).
///
/// # Errors
/// As [`train`]; [`TrainerError::Preflight`] when the batch cannot be shared by the ranks;
/// [`TrainerError::RankFailed`].
#[cfg(feature = "collective")]
pub fn train_ranks<B: AutodiffBackend>(
    cfg: &TrainConfig,
    pre: &Preflight,
    run_dir: &Path,
    devices: &[B::Device],
    node: Option<&crate::workers::NodeSetup>,
    stop: &StopFlag,
) -> Result<RunSummary, TrainerError> {
    let n = devices.len();
    let world_size = n * node.map_or(1, |s| s.nodes);
    if world_size <= 1 {
        let device = devices.first().cloned().unwrap_or_default();
        return train::<B>(cfg, pre, run_dir, &device, stop);
    }
    let pre = pre.clone().for_ranks(world_size)?;
    let threads = (cfg.run.threads() / n.max(1)).max(1);
    let summaries =
        crate::ranks::launch_ranks::<B::InnerBackend, _, _>(devices, threads, node, |workers| {
            use crate::workers::Workers;
            // this machine's ranks are node_rank * n .. (node_rank + 1) * n
            let device = devices[workers.rank() % n].clone();
            let job = RankJob::<B> {
                cfg: cfg.clone(),
                pre: pre.clone(),
                run_dir: run_dir.to_path_buf(),
                device: device.clone(),
                stop: stop.clone(),
                workers,
            };
            dispatch(cfg, &pre, &device, job)
        })?;
    // this machine's first rank: rank 0 on node 0, whose summary holds the evaluations
    summaries
        .into_iter()
        .next()
        .ok_or_else(|| TrainerError::RankFailed {
            rank: 0,
            world_size,
            message: "no rank ran on this machine".into(),
        })
}

/// [`train_ranks`]' job on one rank: its run's summary (the IO rank's holds the
/// evaluations).
#[cfg(feature = "collective")]
struct RankJob<'a, B: AutodiffBackend> {
    cfg: TrainConfig,
    pre: Preflight,
    run_dir: PathBuf,
    device: B::Device,
    stop: StopFlag,
    workers: &'a crate::workers::CollectiveWorkers,
}

#[cfg(feature = "collective")]
impl<B: AutodiffBackend> Job<B> for RankJob<'_, B> {
    type Output = RunSummary;

    fn run<W: World<B>, A: Algorithm<B, W>>(
        self,
        world: W,
        algorithm: A,
    ) -> Result<RunSummary, TrainerError> {
        use crate::workers::Workers;
        if self.workers.is_io_rank() {
            println!(
                "{}",
                banner(&self.cfg, algorithm.name(), &world.name(), &self.run_dir)
            );
            println!(
                "{} ranks, one per device; each rolls out and trains {} of the {} samples of a rollout",
                self.workers.world_size(),
                self.pre.update_plan.num_samples,
                self.pre.batch.global_batch_size
            );
        }
        let mut run = crate::ranks::start_rank(
            self.cfg,
            self.pre,
            &self.run_dir,
            self.device,
            world,
            algorithm,
            self.workers,
        )?;
        run.run(&self.stop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::shapes_recipe_with as with;

    /// The banner names what is trained: the LoRA's rank, or every weight under a full
    /// fine-tune (whose config has no `[lora]`, so no rank).
    #[test]
    fn the_banner_names_what_is_trained() {
        let lora = banner(&with(&[]), "FlowGRPO", "shapes world", Path::new("runs/x"));
        assert!(
            lora.contains(
                ", LoRA rank 8, lr 0.001 decaying along a cosine to 0 at optimizer step 400,"
            ),
            "{lora}"
        );
        let constant = banner(
            &with(&[
                "optimizer.lr_scheduler=\"constant\"",
                "optimizer.lr_decay_iters=",
            ]),
            "FlowGRPO",
            "shapes world",
            Path::new("runs/x"),
        );
        assert!(constant.contains(", lr 0.001, seed 0;"), "{constant}");
        let full = banner(
            &with(&["model.trainable_mode=\"full\"", "lora="]),
            "FlowGRPO",
            "shapes world",
            Path::new("runs/x"),
        );
        assert!(
            full.contains(", every weight trained (full fine-tune), lr 0.001 decaying"),
            "{full}"
        );
        assert!(!full.contains("LoRA"), "{full}");
    }

    /// The banner says where the trained steps come from, as the plan draws them.
    #[test]
    fn the_banner_names_where_the_trained_steps_come_from() {
        let steps = |o: &[&str]| trained_steps(&with(o));
        assert_eq!(
            steps(&[]),
            "3 trained, redrawn per rollout from [0, 1, 2, 3, 4]"
        );
        let noise = |o: &[&str]| rollout_noise(&with(o));
        assert_eq!(noise(&[]), "CPS noise level 0.7");
        assert_eq!(
            noise(&["sampling.sde_type=\"sde\"", "sampling.eta=1.2"]),
            "Flow-SDE eta 1.2"
        );
        assert_eq!(noise(&["sampling.eta=0.0"]), "deterministic rollouts");
        assert_eq!(
            steps(&[
                "sampling.sde_pool=",
                "sampling.sde_timestep_fraction=[0.1, 0.5]"
            ]),
            "3 trained, redrawn per rollout from the fraction window [0.1, 0.5]"
        );
        assert_eq!(
            steps(&[
                "sampling.sde_resample_per_rollout=false",
                "sampling.sde_pool="
            ]),
            "trained [3, 4, 5]"
        );
        assert_eq!(
            steps(&[
                "sampling.sde_resample_per_rollout=false",
                "sampling.sde_pool=",
                "sampling.sde_indices=",
            ]),
            "3 trained, picked from the fraction window [0, 1]"
        );
        let mix = trained_steps(
            &TrainConfig::from_recipe(
                crate::config::RecipeName::ShapesWorldLora,
                &crate::config::algorithm_overrides("mix_grpo").unwrap(),
            )
            .unwrap(),
        );
        assert_eq!(
            mix,
            "2 trained in a progressive sliding window (moved after 5 rollouts)"
        );
    }
}
