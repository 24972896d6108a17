//! # trainer-fsdp
//!
//! The RL training loop and its infrastructure, the only crate that composes the lower layers
//! (`schedule`, `trajectory`, `flow-grpo`, `dit-models`, `reward`):
//!
//! * [`config`]: one typed [`TrainConfig`] (TOML file, named recipes such as seed 002's
//!   validated Qwen-Image LoRA run [`TrainConfig::qwen_image_t2i_lora`], `key=value`
//!   [`Override`]s, the resolved config saved into the run directory) and
//!   [`TrainConfig::preflight`], which reports every violation at once.
//! * [`lr`]: the learning rate of every optimizer step (warmup, then constant / linear /
//!   cosine), whose step count round-trips through the checkpoint.
//! * [`clip`]: gradient clipping by the global norm over all trainable parameters
//!   (`torch.nn.utils.clip_grad_norm_`), not burn's per-tensor clip.
//! * [`checkpoint`]: a crash-safe [`CheckpointStore`]: fixed write order ending in `COMMITTED`
//!   and the latest-iteration marker, rotation, resume that skips uncommitted directories and
//!   refuses an adapter-contract mismatch.
//! * [`monitor`]: seed 002's metric [`names`], a JSONL log and TensorBoard event files (the
//!   TFRecord format written by hand), a reward-curve PNG, sample grids, progress bars.
//! * [`signal`]: Ctrl-C / SIGTERM as a [`StopFlag`] the loop checks.
//! * [`train`]: the `advantages` phase and the optimizer-step part of `train_step`
//!   (micro-batch gradient accumulation, all-reduce, global clip, AdamW at the scheduled
//!   rate, skips).
//! * [`run`]: the one generic RL loop ([`Run`]) — rollout, score, advantages, train,
//!   evaluate, checkpoint, resume — over three seams: [`world`] ([`World`]: prompts, encoder,
//!   policy, decoder, scorers), [`algorithm`] ([`Algorithm`]: [`FlowGrpo`] with its DPOK,
//!   MixGRPO, DanceGRPO and Flow-GRPO-Fast settings, [`GrpoGuard`], [`Awm`], [`Nft`], [`Dpo`],
//!   [`Fdfo`], and the best-of-N fine-tuning baseline [`Raft`]) and [`workers`] ([`Workers`]: [`LocalWorkers`], one process, and, with the
//!   `collective` feature (on by default), `CollectiveWorkers` on several ranks through burn's
//!   collective runtime, module `ranks`).
//! * [`rollout`]: the sampler (the kernel on the trained steps, a solver elsewhere) and the
//!   replay of stored steps.
//! * [`shapes_world`]: the embedded default's world ([`shapes_world::ShapesWorld`]);
//!   [`qwen_image_world`]: a diffusers Qwen-Image directory as a world (the reference
//!   recipe's); [`scorers`]: the scorers a config names, run as one.
//! * [`dispatch`]: the world and algorithm a config names, handed to a job generic over both;
//!   [`dispatch::train`], the main job on one process.
//! * [`sweep`]: the main job's result over seeds, as a table with mean, min and max.
//! * [`export`]: a committed checkpoint's policy as a PEFT adapter, a diffusers LoRA file or
//!   merged diffusers weights, each reloaded and checked on request, read-only on the run.
//!
//! ```
//! use trainer_fsdp::{RecipeName, TrainConfig};
//! let cfg = TrainConfig::from_recipe(RecipeName::QwenImageT2iLora, &[]).unwrap();
//! let checked = cfg.preflight().unwrap();
//! assert_eq!(checked.batch.update_size, 128); // 32 x 8 split into 2 updates
//! assert_eq!(checked.lr.lr_at_step(0), 3e-4);
//! ```
#![deny(missing_docs)]

pub mod algorithm;
pub mod awm;
pub mod checkpoint;
pub mod clip;
pub mod compare;
pub mod config;
pub mod dispatch;
pub mod dpo;
pub mod ema;
mod error;
pub mod export;
pub mod fdfo;
mod forward;
pub mod guard;
pub mod lr;
pub mod monitor;
pub mod nft;
pub mod prompt_files;
pub mod qwen_image_world;
pub mod raft;
#[cfg(feature = "collective")]
pub mod ranks;
mod rng;
pub mod rollout;
pub mod run;
pub mod run_dir;
pub mod scorers;
pub mod shapes_world;
pub mod signal;
pub mod sweep;
pub mod train;
pub mod transformer_policy;
pub mod value;
pub mod workers;
pub mod world;

pub use algorithm::{Algorithm, FlowGrpo, RatioObjective, Recording, TimestepSubset};
pub use awm::Awm;
pub use checkpoint::{
    CheckpointStore, CommittedCheckpoint, CommittedFile, Resume, Resumed, SavedCheckpoint,
    SavedDtype, TrainerState, WriteHook, WritePhase,
};
pub use clip::{CLIP_EPSILON, ClipReport, clip_grad_norm, global_grad_norm};
pub use config::{
    AdamWSettings, AdvantageStdMode, AlgorithmPlan, AlgorithmSection, AnchorSource, AwmSection,
    AwmWeightingKind, BatchGeometry, CheckpointFailurePolicy, DataSection, FlowGrpoSection,
    GENERATION_TASKS, LrSchedulerKind, MOVED_KEYS, MasterDtype, Override, OverrideProblem,
    ParamDtype, Preflight, PreflightProblem, PreflightWarning, ProgressMode, RecipeName,
    SchedulerSource, ScorerSpec, SdeKind, SolverKind, StorageKind, TrainConfig, Trainable,
    TrainableMode,
};
pub use dpo::Dpo;
pub use error::{CheckpointProblem, DrawingProblem, TrainerError};
pub use fdfo::Fdfo;
pub use guard::GrpoGuard;
pub use lr::{LrDecay, LrSchedule, LrScheduler};
pub use monitor::{
    Axes, Event, EventWriter, JsonlWriter, Metrics, MetricsCursor, MetricsRecord, Monitor,
    Progress, Rgb, Series, before_after_grid, caption_height, crc32c, grid_tile, masked_crc32c,
    names, plot_curves, read_events, read_jsonl, sample_grid, series, upscale, write_png,
    write_reward_curve,
};
pub use nft::Nft;
pub use raft::Raft;
pub use rng::TrainerRng;
pub use run::{
    EvalReport, EvalSummary, RolloutBatch, Run, RunSummary, TrainContext, TrainReport,
    UnfinishedDecay, combined_rewards,
};
pub use signal::StopFlag;
pub use train::{
    AdamWOptimizer, MicroBatchLoss, PolicyOptimizer, SkipReason, StepReport, UpdateReport,
    advantage_metrics, advantages, autodiff_replicas, check_master_dtype, failure_messages,
    train_step, train_step_threads,
};
#[cfg(feature = "collective")]
pub use workers::{CollectiveWorkers, NodeSetup};
pub use workers::{LocalWorkers, ScalarReduce, Workers};
pub use world::{HeldOutPrompt, LoadedPolicy, World};
