//! One typed training configuration: a TOML file (optionally starting from a named recipe),
//! `key=value` overrides with dotted paths, the resolved config written into the run directory,
//! and the preflight validation that reports every problem at once.
//!
//! The keys mirror seed 002's flags ("Configuration Reference"), grouped in sections:
//!
//! ```toml
//! recipe = "qwen_image_t2i_lora"   # optional: start from a named recipe, override below
//!
//! [run]        task, seed, num_rollouts, host_threads (optional; changes no result),
//!              cpu_budget_seconds (optional: stop once that much CPU time has trained)
//! [model]      generator ({ shapes_world = { dir } } | { qwen_image = { model_path, variant
//!              (optional) } }), trainable_mode ("full" | "lora"), master_dtype ("fp32" |
//!              "bf16", optional), param_dtype ("fp32" | "bf16", optional: the frozen
//!              weights' dtype)
//! [lora]       rank, alpha, dropout, target_modules (optional), use_rslora, init_from and
//!              init_dropout (optional: start from an adapter file)   (optional section)
//! [sampling]   scheduler, schedule_compat ("current" | "diffusers_0_35", optional), height,
//!              width, num_inference_steps, guidance_scale, eta, sde_type, solver,
//!              storage_dtype, sde_resample_per_rollout, sde_pool, sde_indices, num_sde_steps,
//!              sde_timestep_fraction (pool, indices and fraction optional), sde_window
//!              (optional: MixGRPO's sliding window = { size, stride, shift_interval,
//!              strategy, at_end, span, min_interval, decay_k, decay_threshold })
//! [rollout]    prompts_per_rollout, group_size, num_updates_per_batch, micro_batch_size,
//!              shared_initial_noise
//! [algorithm]  kind = "flow_grpo" | "awm" | "nft" | "dpo" | "dpok" | "grpo_guard" | "fdfo" |
//!              "raft", and the variant's keys — FlowGRPO: eps_clip,
//!              eps_clip_high (optional), advantage_std_mode, kl_coef, anchor ("replay" |
//!              "rollout", optional), timestep_fraction (DanceGRPO's per-sample subsets,
//!              optional); AWM (all optional): eps_clip, eps_clip_high,
//!              advantage_std_mode, advantage_limit, weighting ("uniform" | "huber"),
//!              huber_power, kl_coef, ema_kl_coef; DiffusionNFT (all optional): beta,
//!              advantage_std_mode, advantage_limit, soft_update ("ramp" |
//!              "flat_then_ramp"), kl_coef; online DPO (optional): beta; DPOK (all
//!              optional): eps_clip, reward_weight, kl_coef, kl_warmup_rollouts,
//!              advantage_std_mode, anchor, value_baseline = { hidden, layers, lr,
//!              batch_size, minibatches, buffer_size };
//!              GRPO-Guard (all optional): eps_clip, eps_clip_high, advantage_std_mode,
//!              kl_coef;
//!              FDFO (optional): eps, advantage_std_mode; RAFT (optional): top_k
//! [ema]        decay, warmup ("none" | "flow_grpo" | "linear"), ramp (with "linear"),
//!              update_interval, precision ("fp32" | "param"): the EMA of the trained weights
//!              that evaluations sample with and checkpoints export (optional section)
//! [optimizer]  lr, weight_decay, adam_beta1, adam_beta2, adam_eps, clip_grad,
//!              lr_warmup_iters, lr_scheduler, min_lr, lr_decay_iters (optional)
//! [reward]     scorers, required_components, component_weights
//! [checkpoint] dir, save_interval, max_to_keep (optional: keep all), resume, allow_fresh,
//!              resume_from, allow_config_changes, overwrite, on_failure ("retry" | "fatal")
//!              (all five optional)
//! [artifacts]  root, retention_rollouts
//! [eval]       interval (0: never), samples_per_prompt, num_inference_steps (optional: the
//!              sampling steps), guidance (optional: true CFG of the evaluations =
//!              { scale, negative_prompt }), sampling ("ode" | "sde", optional: "ode"),
//!              judges (optional: scorers reported beside the reward, unweighted; they
//!              change no result), sde_gap (optional, false: the same pictures also sampled
//!              with the rollouts' SDE transitions, their reward reported beside)
//! [monitor]    jsonl, tensorboard, progress      (all optional; they change no result)
//! [data]       train, eval: prompt files in the unified JSONL schema instead of the world's
//!              own prompts                        (optional section, both keys optional)
//! ```
//!
//! Every key that changes results is required: it comes from the recipe or from the file,
//! never from a silent default. An override with nothing after the `=` (`sampling.sde_pool=`)
//! removes an optional key; `key*=factor` scales the number the key holds at that point
//! (`optimizer.lr*=0.5`). Unknown keys are rejected. The keys of the former `[grpo]`
//! section are refused with an error naming where each one moved ([`MOVED_KEYS`]).
//!
//! ```
//! use trainer_fsdp::{Override, TrainConfig};
//!
//! # fn main() -> Result<(), trainer_fsdp::TrainerError> {
//! let cfg = TrainConfig::from_toml_str(
//!     r#"recipe = "qwen_image_t2i_lora"
//!        [rollout]
//!        group_size = 4"#,
//!     None,
//!     &[Override::parse("optimizer.lr=1e-4")?],
//! )?;
//! assert_eq!(cfg.rollout.group_size, 4);
//! assert_eq!(cfg.optimizer.lr, 1e-4);
//! assert_eq!(cfg.sampling.eta, 0.7); // from the recipe
//! let checked = cfg.preflight()?;
//! assert_eq!(checked.batch.global_batch_size, 32 * 4);
//!
//! // a key of the former [grpo] section says where it went
//! let err = TrainConfig::from_toml_str(
//!     "recipe = \"qwen_image_t2i_lora\"\n[grpo]\neps_clip = 2e-4\n",
//!     None,
//!     &[],
//! )
//! .unwrap_err();
//! assert!(err.to_string().contains("grpo.eps_clip is now algorithm.eps_clip"), "{err}");
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use dit_models::LoraConfig;
use flow_grpo::{
    AdvantageConfig, AwmWeighting, ClipRange, PlanWarning as UpdatePlanWarning, RewardComponent,
    StdMode, UpdatePlan, plan_updates,
};
use schedule::{
    ConfiguredPlan, PlanProblem, PlanWarning, Schedule, ScheduleError, SchedulePolicy, SdeType,
    TrainedStepsConfig,
};
use schedule::{
    PlanQuery, RouteSteps, SdeStepPlan, SdeSteps, SlidingWindow, WindowEnd, WindowStrategy,
    validate_plan,
};
use sde_math::StorageDtype;
use sde_math::solvers::{DpmSecondOrder, DpmSolverPP, OdeSolver, UniPc};
use serde::{Deserialize, Serialize};

use crate::algorithm::TimestepSubset;
use crate::ema::{EmaPrecision, EmaSettings, EmaWarmup};
use crate::error::{TrainerError, io_err};
use crate::lr::LrSchedule;
use crate::value::ValueBaselineSettings;

mod overrides;
mod preflight;
mod recipes;
#[cfg(test)]
mod tests;

/// The shapes-world recipe with the `key=value` overrides `o`, for the crate's tests.
#[cfg(test)]
pub(crate) fn shapes_recipe_with(o: &[&str]) -> TrainConfig {
    TrainConfig::from_recipe(
        RecipeName::ShapesWorldLora,
        &Override::parse_all(o).unwrap(),
    )
    .unwrap()
}

pub use overrides::{Override, OverrideProblem};
pub use preflight::{
    AdamWSettings, AlgorithmPlan, BatchGeometry, LoraInit, Preflight, PreflightProblem,
    PreflightWarning, Trainable,
};

/// The generation tasks that have a working rollout and replay path (seed 002's
/// `GENERATION_TASKS`).
pub const GENERATION_TASKS: &[&str] = &["t2i"];

/// The file the resolved config is written to inside the run directory.
pub const RESOLVED_CONFIG_FILE: &str = "config.resolved.toml";

/// The named recipes a config can start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RecipeName {
    /// [`TrainConfig::qwen_image_t2i_lora`]: seed 002's validated LoRA run.
    #[serde(rename = "qwen_image_t2i_lora")]
    QwenImageT2iLora,
    /// [`TrainConfig::qwen_image_t2i_full`]: seed 002's full fine-tune reference.
    #[serde(rename = "qwen_image_t2i_full")]
    QwenImageT2iFull,
    /// [`TrainConfig::shapes_world_lora`]: the validated recipe's shape on the embedded
    /// shapes world, scaled to a CPU.
    #[serde(rename = "shapes_world_lora")]
    ShapesWorldLora,
}

impl RecipeName {
    /// Every recipe, for error messages and listings.
    pub const ALL: [RecipeName; 3] = [
        RecipeName::QwenImageT2iLora,
        RecipeName::QwenImageT2iFull,
        RecipeName::ShapesWorldLora,
    ];

    /// The name used in files and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            RecipeName::QwenImageT2iLora => "qwen_image_t2i_lora",
            RecipeName::QwenImageT2iFull => "qwen_image_t2i_full",
            RecipeName::ShapesWorldLora => "shapes_world_lora",
        }
    }

    /// Parses a recipe name.
    ///
    /// # Errors
    /// [`TrainerError::UnknownRecipe`] naming the known recipes.
    pub fn parse(name: &str) -> Result<Self, TrainerError> {
        Self::ALL
            .into_iter()
            .find(|r| r.as_str() == name)
            .ok_or_else(|| TrainerError::UnknownRecipe {
                given: name.to_string(),
                known: Self::ALL.iter().map(|r| r.as_str()).collect(),
            })
    }

    /// The recipe's configuration.
    pub fn config(self) -> TrainConfig {
        match self {
            RecipeName::QwenImageT2iLora => TrainConfig::qwen_image_t2i_lora(),
            RecipeName::QwenImageT2iFull => TrainConfig::qwen_image_t2i_full(),
            RecipeName::ShapesWorldLora => TrainConfig::shapes_world_lora(),
        }
    }
}

/// Which parameters train (`--fsdp-trainable-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrainableMode {
    /// Every parameter of the transformer.
    Full,
    /// LoRA adapters only; the base is frozen.
    Lora,
}

/// The storage dtype of the trainable parameters, i.e. the optimizer's master copy
/// (`--fsdp-master-dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MasterDtype {
    /// `f32` masters: what LoRA needs (`~1e-4` relative updates round off in bf16).
    Fp32,
    /// `bf16` masters.
    Bf16,
}

/// The SDE of the trained steps (seed 002's `sde_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SdeKind {
    /// `"sde"`: FlowGRPO's coefficient `sqrt(sigma / (1 - sigma)) * eta`.
    #[serde(rename = "sde")]
    FlowSde,
    /// `"dance"`: DanceGRPO's constant `eta`.
    #[serde(rename = "dance")]
    Dance,
    /// `"cps"`: coefficients-preserving sampling.
    #[serde(rename = "cps")]
    Cps,
    /// `"churn"`: on-schedule churn with `gamma = sampling.eta` (paired finite differences;
    /// the paper's 0.0025).
    #[serde(rename = "churn")]
    Churn,
}

impl SdeKind {
    /// The schedule crate's SDE type.
    pub fn sde_type(self) -> SdeType {
        match self {
            SdeKind::FlowSde => SdeType::FlowSde,
            SdeKind::Dance => SdeType::Dance,
            SdeKind::Cps => SdeType::Cps,
            SdeKind::Churn => SdeType::Churn,
        }
    }
}

/// The std divisor after per-prompt centring (`--generative-advantage-std-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdvantageStdMode {
    /// Each group's own std (Relax / text GRPO).
    Group,
    /// The batch std (the reference diffusion recipe's global std).
    Batch,
    /// No division (Dr.GRPO).
    None,
}

impl AdvantageStdMode {
    /// flow-grpo's std mode.
    pub fn std_mode(self) -> StdMode {
        match self {
            AdvantageStdMode::Group => StdMode::Group,
            AdvantageStdMode::Batch => StdMode::Batch,
            AdvantageStdMode::None => StdMode::None,
        }
    }
}

/// The post-warmup learning-rate shape (`--fsdp-lr-scheduler`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LrSchedulerKind {
    /// Stay at `lr` (preflight refuses `min_lr` other than 0 and `lr_decay_iters` beside it).
    Constant,
    /// Linear decay to `min_lr` over `lr_decay_iters`.
    Linear,
    /// Cosine decay to `min_lr` over `lr_decay_iters`.
    Cosine,
}

/// Where the sigma schedule comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SchedulerSource {
    /// `SchedulePolicy::qwen_image()`.
    #[serde(rename = "qwen_image")]
    QwenImage,
    /// `SchedulePolicy::sd3_5()`.
    #[serde(rename = "sd3_5")]
    Sd35,
    /// SD3.5 on diffusers' own `set_timesteps(N)` path (`BaseGrid::FlowMatchSchedulerDefault`:
    /// the static shift applied twice at the low end, diffusers #13243), the schedule of
    /// rollouts sampled through the SD3 pipeline's default; `sd3_5` shifts once.
    #[serde(rename = "sd3_5_diffusers_default")]
    Sd35DiffusersDefault,
    /// `SchedulePolicy::flux_1()`.
    #[serde(rename = "flux_1")]
    Flux1,
    /// `SchedulePolicy::flux_2_klein()`.
    #[serde(rename = "flux_2_klein")]
    Flux2Klein,
    /// A diffusers `scheduler_config.json` (or a directory holding one).
    #[serde(rename = "file")]
    File(PathBuf),
}

impl SchedulerSource {
    /// The schedule policy.
    ///
    /// # Errors
    /// The schedule crate's error for an unreadable or invalid scheduler config.
    pub fn policy(&self) -> Result<SchedulePolicy, ScheduleError> {
        Ok(match self {
            SchedulerSource::QwenImage => SchedulePolicy::qwen_image(),
            SchedulerSource::Sd35 => SchedulePolicy::sd3_5(),
            SchedulerSource::Sd35DiffusersDefault => {
                SchedulePolicy::sd3_5().with_grid(schedule::BaseGrid::FlowMatchSchedulerDefault)?
            }
            SchedulerSource::Flux1 => SchedulePolicy::flux_1(),
            SchedulerSource::Flux2Klein => SchedulePolicy::flux_2_klein(),
            SchedulerSource::File(path) => SchedulePolicy::load(path)?,
        })
    }
}

/// `sampling.schedule_compat` (`schedule::Compat`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScheduleCompat {
    /// The current diffusers release under numpy 2.
    #[default]
    #[serde(rename = "current")]
    Current,
    /// diffusers 0.35 under numpy 1.x (UniPC's grid is also 0.36's).
    #[serde(rename = "diffusers_0_35")]
    Diffusers035,
}

impl ScheduleCompat {
    /// The schedule crate's value.
    pub fn compat(self) -> schedule::Compat {
        match self {
            ScheduleCompat::Current => schedule::Compat::Current,
            ScheduleCompat::Diffusers035 => schedule::Compat::Diffusers035Numpy1,
        }
    }
}

impl SamplingSection {
    /// The schedule policy of `scheduler` with the arithmetic of `schedule_compat`.
    ///
    /// # Errors
    /// The schedule crate's error for an unreadable or invalid scheduler config.
    pub fn schedule_policy(&self) -> Result<SchedulePolicy, ScheduleError> {
        Ok(self
            .scheduler
            .policy()?
            .with_compat(self.schedule_compat.compat()))
    }
}

/// `[run]`: what is trained, and for how long.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSection {
    /// The generation task (`--generation-task`); one of [`GENERATION_TASKS`]. Also names the
    /// checkpoint and artifact subdirectories.
    pub task: String,
    /// Base seed of rollouts and generation (`--rollout-seed`, `--generation-seed`).
    pub seed: u64,
    /// Rollouts to run (each is one prompt batch and `num_updates_per_batch` optimizer steps).
    pub num_rollouts: u64,
    /// Host threads that sample, replay and train chunks of a batch side by side (optional,
    /// default: the machine's cores). It changes no result (the chunked loop gives the same
    /// bits); on a GPU backend 1 keeps each batch whole on the device, and the
    /// `qwen_image_t2i_lora` example uses 1 there unless this is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_threads: Option<usize>,
    /// Stop after the first rollout at which the run has spent this many CPU seconds on
    /// rollouts, scoring and updates (`perf/train_cpu_seconds`, evaluations excluded), with a
    /// final evaluation and checkpoint, whichever of it and `num_rollouts` comes first
    /// (optional: none). The algorithm comparison charges every method the same budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_budget_seconds: Option<f64>,
}

impl RunSection {
    /// `host_threads`, or the machine's cores.
    pub fn threads(&self) -> usize {
        self.host_threads.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        })
    }
}

/// `[model]`: which parameters train and how they are stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// Which generator is trained (`--model-path`).
    pub generator: GeneratorSource,
    /// `full` or `lora`; must agree with `lora.rank`.
    pub trainable_mode: TrainableMode,
    /// The optimizer's master dtype; `None` keeps the loaded dtype.
    #[serde(default)]
    pub master_dtype: Option<MasterDtype>,
    /// The dtype the frozen weights are held and computed in (`--fsdp-param-dtype`): the
    /// transformer's base weights, and the Qwen-Image world's text encoder and VAE. `None` is
    /// `fp32`. `bf16` halves their memory; LoRA adapters stay f32 whatever it is, and the
    /// sampler and the objectives compute in f32 on the model's f32 output. Implemented for
    /// the Qwen-Image world.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param_dtype: Option<ParamDtype>,
}

/// The dtype of the frozen weights (`--fsdp-param-dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamDtype {
    /// `f32` weights.
    Fp32,
    /// `bf16` weights.
    Bf16,
}

impl ParamDtype {
    /// The tensor dtype.
    pub fn dtype(self) -> burn::tensor::DType {
        match self {
            ParamDtype::Fp32 => burn::tensor::DType::F32,
            ParamDtype::Bf16 => burn::tensor::DType::BF16,
        }
    }
}

impl ModelSection {
    /// The dtype of the frozen weights (`param_dtype`, `fp32` when absent).
    pub fn weight_dtype(&self) -> burn::tensor::DType {
        self.param_dtype.unwrap_or(ParamDtype::Fp32).dtype()
    }
}

/// The generator a run trains.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum GeneratorSource {
    /// The shapes world's base generator (`trainer_fsdp::shapes_world`), a directory written by
    /// the `pretrain_shapes` example (`transformer/` + `text_encoder.mpk`); scored by
    /// `reward::shapes`. The embedded default.
    ShapesWorld {
        /// The generator directory.
        dir: PathBuf,
    },
    /// A diffusers Qwen-Image directory (`--model-path`): `model_index.json` with its
    /// `tokenizer/`, `text_encoder/`, `vae/`, `transformer/` and `scheduler/`
    /// (`trainer_fsdp::qwen_image_world`). The scorers are `[reward] scorers` (the recipe's:
    /// PickScore, whose directory `--reward-model-path` sets); prompts come from `[data]`.
    QwenImage {
        /// The diffusers model directory.
        model_path: PathBuf,
        /// The weight files' variant (`bf16` reads `diffusion_pytorch_model.bf16.safetensors`
        /// and `model.bf16.safetensors`), as diffusers' `variant=`; absent reads the plain
        /// files.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        variant: Option<String>,
    },
}

/// `[lora]`: the adapter (`--lora-*`). Absent means rank 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraSection {
    /// `--lora-rank`; `> 0` exactly when `model.trainable_mode = "lora"`.
    pub rank: usize,
    /// `--lora-alpha`; the scale is `alpha / rank`. Not recoverable from the weights.
    pub alpha: f64,
    /// `--lora-dropout`; must be 0 (the pi_old anchor is a replay through the live model).
    pub dropout: f64,
    /// Module-name suffixes; `None` takes the model's own targets
    /// (`dit_models::DEFAULT_TARGET_MODULES` for Qwen-Image).
    #[serde(default)]
    pub target_modules: Option<Vec<String>>,
    /// rsLoRA scaling `alpha / sqrt(rank)`.
    pub use_rslora: bool,
    /// An adapter to start from instead of a fresh one: a PEFT adapter directory, a diffusers
    /// LoRA `.safetensors` file or a directory holding `pytorch_lora_weights.safetensors`. Its
    /// rank, alpha and rsLoRA must equal this section's (and its targets `target_modules`,
    /// when set): preflight lists every difference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<PathBuf>,
    /// What to do when the `init_from` adapter was saved with `lora_dropout != 0` (common for
    /// supervised LoRAs): `"refuse"` (the default; preflight says how to accept it) or
    /// `"zero"` (start from it with dropout 0, with a warning).
    #[serde(default, skip_serializing_if = "InitDropout::is_refuse")]
    pub init_dropout: InitDropout,
}

/// `lora.init_dropout`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InitDropout {
    /// Refuse a starting adapter with a nonzero dropout.
    #[default]
    Refuse,
    /// Start from it with dropout 0.
    Zero,
}

impl InitDropout {
    fn is_refuse(&self) -> bool {
        *self == InitDropout::Refuse
    }

    /// dit-models' import policy.
    pub fn policy(self) -> dit_models::ImportDropout {
        match self {
            InitDropout::Refuse => dit_models::ImportDropout::Refuse,
            InitDropout::Zero => dit_models::ImportDropout::Zero,
        }
    }
}

/// `[sampling]`: seed 002's `--sampling-config` keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingSection {
    /// The sigma schedule policy.
    pub scheduler: SchedulerSource,
    /// Whose arithmetic the schedule reproduces where releases differ (`schedule::Compat`):
    /// current diffusers under numpy 2 (the default), or diffusers 0.35 under numpy 1.x. A
    /// config written before the key existed resumes as `"diffusers_0_35"`, the arithmetic it
    /// ran with.
    #[serde(default)]
    pub schedule_compat: ScheduleCompat,
    /// Output height in pixels.
    pub height: u32,
    /// Output width in pixels.
    pub width: u32,
    /// Denoising steps generated (all run; only the resolved subset is trained).
    pub num_inference_steps: usize,
    /// Classifier-free guidance; must be 1 (the replay is a single positive-conditioned
    /// forward).
    pub guidance_scale: f64,
    /// SDE noise level of the trained steps. Set explicitly: seed 002 warns that rollout and
    /// replay defaulted it differently.
    pub eta: f64,
    /// `"sde"`, `"dance"`, `"cps"` or `"churn"`.
    pub sde_type: SdeKind,
    /// The deterministic solver of the other steps.
    pub solver: SolverKind,
    /// The precision of the stored latents.
    pub storage_dtype: StorageKind,
    /// Redraw the trained steps per rollout from `sde_pool` (highest priority in training).
    pub sde_resample_per_rollout: bool,
    /// Candidates of the per-rollout draw; `None`: every step of the fraction window.
    #[serde(default)]
    pub sde_pool: Option<Vec<usize>>,
    /// Explicit trained steps; under `sde_resample_per_rollout` the plan's evaluation fallback
    /// (a query without a rollout): the steps at which `eval.sampling = "sde"` takes the SDE's
    /// transitions. Under `eval.sampling = "ode"` and a resample, no run reads it (it is
    /// validated with the plan).
    #[serde(default)]
    pub sde_indices: Option<Vec<usize>>,
    /// Steps per rollout (resample) or stride-spaced window picks.
    pub num_sde_steps: usize,
    /// `[lo, hi]` normalized window; `None` is the whole schedule `[0, 1]`.
    #[serde(default)]
    pub sde_timestep_fraction: Option<[f64; 2]>,
    /// MixGRPO's sliding window of trained steps instead of the keys above (which must then be
    /// off: no resample, pool, indices or fraction, and `num_sde_steps` the window's size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sde_window: Option<SdeWindowSection>,
}

/// `sampling.sde_window`: MixGRPO's sliding window (`schedule::SlidingWindow`): `size`
/// consecutive trained steps, the window starting at the span's first step and moving by
/// `stride` steps every `shift_interval` rollouts (`"progressive"`), or to a random start
/// every `shift_interval` rollouts (`"random"`, drawn from `run.seed` and the interval), or
/// with an interval that shrinks as the window moves: linearly from `shift_interval` at the
/// first start to `min_interval` at the last (`"decay"`), or as
/// `ceil(shift_interval * exp(-decay_k * max(0, start - decay_threshold)))` (`"exp_decay"`,
/// MixGRPO's `k = 0.1` and threshold 13 by default); past the last full window it stays there
/// (`"clip"`) or starts over (`"roll_back"`). A key its strategy does not use is refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SdeWindowSection {
    /// Trained steps per rollout (MixGRPO: 4).
    pub size: usize,
    /// Steps the window moves by (MixGRPO: the size, or less with overlap).
    pub stride: usize,
    /// Rollouts spent at one window position (MixGRPO's `iters_per_group`).
    pub shift_interval: u64,
    /// `"progressive"` (default), `"random"`, `"decay"` or `"exp_decay"`.
    #[serde(default)]
    pub strategy: WindowStrategyKind,
    /// `"clip"` (default) or `"roll_back"`.
    #[serde(default)]
    pub at_end: WindowEndKind,
    /// The denoising steps the window may cover, `[first, end)` (default: `[1, steps - 1)`,
    /// leaving the singular first step and the last one out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span: Option<[usize; 2]>,
    /// `"decay"` only, and required there: the interval at the last window start
    /// (MixGRPO's `min_iters_per_group`; `shift_interval` is the one at the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_interval: Option<u64>,
    /// `"exp_decay"` only: the decay rate `k >= 0` (default MixGRPO's 0.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decay_k: Option<f64>,
    /// `"exp_decay"` only: the window start (a denoising step) after which the interval
    /// decays (default MixGRPO's 13, which a schedule of 14 steps or fewer never passes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decay_threshold: Option<usize>,
}

/// `sampling.sde_window.strategy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowStrategyKind {
    /// Advance by the stride every `shift_interval` rollouts.
    #[default]
    Progressive,
    /// A random full-window start every `shift_interval` rollouts.
    Random,
    /// Like `progressive`, the interval shrinking linearly to `min_interval`.
    Decay,
    /// Like `progressive`, the interval decaying exponentially past `decay_threshold`.
    ExpDecay,
}

/// `sampling.sde_window.at_end`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowEndKind {
    /// Stay at the last full window.
    #[default]
    Clip,
    /// Start over from the first.
    RollBack,
}

impl SamplingSection {
    /// The trained-step keys for the schedule crate, which resolves and validates them.
    pub fn trained_steps(&self) -> TrainedStepsConfig {
        TrainedStepsConfig {
            num_inference_steps: self.num_inference_steps,
            sde_resample_per_rollout: self.sde_resample_per_rollout,
            sde_pool: self.sde_pool.clone(),
            sde_indices: self.sde_indices.clone(),
            num_sde_steps: self.num_sde_steps,
            sde_timestep_fraction: self.sde_timestep_fraction.unwrap_or([0.0, 1.0]),
        }
    }
}

/// `[rollout]`: the batch of one rollout — prompt groups of candidates — and its split into
/// optimizer updates and micro-batches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutSection {
    /// Prompts per rollout, i.e. groups (`--rollout-batch-size`).
    pub prompts_per_rollout: usize,
    /// Candidates per prompt, the group (`--n-samples-per-prompt`).
    pub group_size: usize,
    /// Disjoint optimizer updates the rollout batch is split into.
    pub num_updates_per_batch: usize,
    /// Candidates forwarded at once; must divide each update's chunk.
    pub micro_batch_size: usize,
    /// Every candidate of a prompt group starts from the same `x_T` (DanceGRPO's shared
    /// initial noise); their trained steps still draw their own noise. The spread within a
    /// group then comes from the trained steps alone, the decisions the log-probs score.
    /// `false` (the default, FlowGRPO's): each candidate its own `x_T`.
    #[serde(default)]
    pub shared_initial_noise: bool,
}

/// `[algorithm]`: the RL objective, by `kind`, with the variant's own keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AlgorithmSection {
    /// `kind = "flow_grpo"`: FlowGRPO's clipped objective over the trained SDE steps'
    /// log-probs against the pi_old anchor ([`crate::FlowGrpo`]).
    FlowGrpo(FlowGrpoSection),
    /// `kind = "awm"`: Advantage Weighted Matching, the clipped objective over the
    /// flow-matching surrogate of `log p(x0 | c)` on the rollout's clean endpoints
    /// ([`crate::Awm`]).
    Awm(AwmSection),
    /// `kind = "nft"`: DiffusionNFT, the contrast of implicit positive and negative policies
    /// on the forward process of deterministic rollouts from a soft-updated sampling copy
    /// ([`crate::Nft`]); needs `sampling.eta = 0`.
    Nft(NftSection),
    /// `kind = "dpo"`: online Diffusion / Flow-DPO on each group's best and worst sample of
    /// deterministic rollouts, against the reference policy ([`crate::Dpo`]); needs
    /// `sampling.eta = 0`.
    Dpo(DpoSection),
    /// `kind = "dpok"`: DPOK's clamped-ratio policy gradient over the trained SDE steps, with
    /// its reward weight and KL to the reference policy (FlowGRPO's replay and anchor).
    Dpok(DpokSection),
    /// `kind = "grpo_guard"`: GRPO-Guard, FlowGRPO's replay with the regulated ratio (the
    /// mean's drift added back to the log-ratio, scaled by the transition std) in PPO's clip
    /// ([`crate::GrpoGuard`]).
    GrpoGuard(GrpoGuardSection),
    /// `kind = "fdfo"`: paired finite differences, each pair's reward difference turned into
    /// targets for its stored velocities under SPO's trust region ([`crate::Fdfo`]); needs
    /// pairs (`rollout.group_size = 2`) from one `x_T` with churn noise.
    Fdfo(FdfoSection),
    /// `kind = "raft"`: best-of-N supervised fine-tuning, flow matching on each group's best
    /// samples of deterministic rollouts ([`crate::Raft`]): the baseline an RL objective has
    /// to beat at equal CPU; needs `sampling.eta = 0`.
    Raft(RaftSection),
}

impl AlgorithmSection {
    /// The `kind` as written in the config.
    pub fn kind(&self) -> &'static str {
        match self {
            AlgorithmSection::FlowGrpo(_) => "flow_grpo",
            AlgorithmSection::Awm(_) => "awm",
            AlgorithmSection::Nft(_) => "nft",
            AlgorithmSection::Dpo(_) => "dpo",
            AlgorithmSection::Dpok(_) => "dpok",
            AlgorithmSection::GrpoGuard(_) => "grpo_guard",
            AlgorithmSection::Fdfo(_) => "fdfo",
            AlgorithmSection::Raft(_) => "raft",
        }
    }

    /// The std divisor of the group-relative advantages, whichever the objective.
    pub fn advantage_std_mode(&self) -> AdvantageStdMode {
        match self {
            AlgorithmSection::FlowGrpo(a) => a.advantage_std_mode,
            AlgorithmSection::Awm(a) => a.advantage_std_mode,
            AlgorithmSection::Nft(a) => a.advantage_std_mode,
            // the advantages only rank a group's samples: any positive divisor ranks alike
            AlgorithmSection::Dpo(_) => AdvantageStdMode::Group,
            AlgorithmSection::Dpok(a) => a.advantage_std_mode,
            AlgorithmSection::GrpoGuard(a) => a.advantage_std_mode,
            AlgorithmSection::Fdfo(a) => a.advantage_std_mode,
            // the advantages only rank a group's samples
            AlgorithmSection::Raft(_) => AdvantageStdMode::Group,
        }
    }
}

/// AWM's keys of `[algorithm]`; every key has a default, so `algorithm = { kind = "awm" }`
/// is a complete section (the paper's uniform weighting, the release's ratio band, global
/// std and advantage rescaling).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AwmSection {
    /// The lower clip: the ratio band starts at `1 - eps_clip`, in `(0, 1]` (default 1: the
    /// release's band `[0, 2]`, which barely clips).
    #[serde(default = "AwmSection::default_eps_clip")]
    pub eps_clip: f64,
    /// Optional asymmetric upper clip (default: `eps_clip`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eps_clip_high: Option<f64>,
    /// The std divisor of the group-relative advantages (default `batch`: the release's
    /// global std).
    #[serde(default = "AwmSection::default_std_mode")]
    pub advantage_std_mode: AdvantageStdMode,
    /// The advantages are clipped to `±advantage_limit` and divided by it (default 5, the
    /// release's).
    #[serde(default = "AwmSection::default_advantage_limit")]
    pub advantage_limit: f64,
    /// How the flow-matching error becomes the log-likelihood surrogate (default `uniform`,
    /// the paper's; `huber` is the release's generalised Huber).
    #[serde(default)]
    pub weighting: AwmWeightingKind,
    /// The generalised Huber's power, only with `weighting = "huber"` (default there: 0.25).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub huber_power: Option<f64>,
    /// The weight of the velocity KL to the reference policy (the policy with its LoRA
    /// adapters off; for a full fine-tune a frozen copy of the pretrained weights),
    /// `mean((v_θ - v_ref)^2)` (default 0: no term; the release's 0.001).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub kl_coef: f64,
    /// The weight of the velocity KL to the EMA copy of the policy, `mean((v_θ - v_ema)^2)`
    /// (default 0: no term; the release's 1.0, the trust region doing its work). Needs
    /// `[ema]`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ema_kl_coef: f64,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

impl AwmSection {
    fn default_eps_clip() -> f64 {
        1.0
    }

    fn default_std_mode() -> AdvantageStdMode {
        AdvantageStdMode::Batch
    }

    fn default_advantage_limit() -> f64 {
        5.0
    }
}

impl Default for AwmSection {
    fn default() -> Self {
        Self {
            eps_clip: Self::default_eps_clip(),
            eps_clip_high: None,
            advantage_std_mode: Self::default_std_mode(),
            advantage_limit: Self::default_advantage_limit(),
            weighting: AwmWeightingKind::default(),
            huber_power: None,
            kl_coef: 0.0,
            ema_kl_coef: 0.0,
        }
    }
}

/// DiffusionNFT's keys of `[algorithm]`; every key has a default (the release's), so
/// `algorithm = { kind = "nft" }` is a complete section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NftSection {
    /// The guidance strength `β` of the implicit policies `v± = (1 ∓ β) v_old ± β v_θ`
    /// (default 1.0, the release's; 0.1 for its OCR and multi-reward runs).
    #[serde(default = "NftSection::default_beta")]
    pub beta: f64,
    /// The std divisor of the group-relative advantages (default `group`: the release's
    /// per-prompt std).
    #[serde(default = "NftSection::default_std_mode")]
    pub advantage_std_mode: AdvantageStdMode,
    /// The advantages are clipped to `±advantage_limit` and mapped onto the optimality
    /// probability `r = clamp(1/2 + 1/2 · A / limit, 0, 1)` (default 5, the release's).
    #[serde(default = "NftSection::default_advantage_limit")]
    pub advantage_limit: f64,
    /// The sampling copy's soft update `η_i` after rollout `i`: `"ramp"` (default, the
    /// paper's `min(0.001 i, 0.5)`) or `"flat_then_ramp"` (the release's OCR schedule: 0 for
    /// 75 rollouts, then `min(0.0075 (i - 75), 0.999)`).
    #[serde(default)]
    pub soft_update: SoftUpdateKind,
    /// The weight of the velocity anchor on the reference policy (the policy with its LoRA
    /// adapters off; for a full fine-tune a frozen copy of the pretrained weights),
    /// `mean((v_θ - v_ref)^2)` (default 1e-4, the release's; 0 turns it off).
    #[serde(default = "NftSection::default_kl_coef")]
    pub kl_coef: f64,
}

impl NftSection {
    fn default_beta() -> f64 {
        1.0
    }

    fn default_std_mode() -> AdvantageStdMode {
        AdvantageStdMode::Group
    }

    fn default_advantage_limit() -> f64 {
        5.0
    }

    fn default_kl_coef() -> f64 {
        1e-4
    }
}

impl Default for NftSection {
    fn default() -> Self {
        Self {
            beta: Self::default_beta(),
            advantage_std_mode: Self::default_std_mode(),
            advantage_limit: Self::default_advantage_limit(),
            soft_update: SoftUpdateKind::default(),
            kl_coef: Self::default_kl_coef(),
        }
    }
}

/// Online DPO's keys of `[algorithm]`; every key has a default (the release's), so
/// `algorithm = { kind = "dpo" }` is a complete section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DpoSection {
    /// The inverse temperature `β` (default 5000, the release's: the paper folds the number
    /// of timesteps into it).
    #[serde(default = "DpoSection::default_beta")]
    pub beta: f64,
}

impl DpoSection {
    fn default_beta() -> f64 {
        5000.0
    }
}

impl Default for DpoSection {
    fn default() -> Self {
        Self {
            beta: Self::default_beta(),
        }
    }
}

/// DPOK's keys of `[algorithm]`; every key has a default (the release's, except the value
/// baseline), so `algorithm = { kind = "dpok" }` is a complete section. Without
/// `value_baseline` the advantages are group-relative, the group's mean reward the baseline;
/// with it each trained step's advantage is the release's `r - V(x_t, c, t)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DpokSection {
    /// The clamp band's half-width: the ratio is clamped to `[1 - eps_clip, 1 + eps_clip]`
    /// (default 1e-4, the release's).
    #[serde(default = "DpokSection::default_eps_clip")]
    pub eps_clip: f64,
    /// The reward weight `w` of `-w A clamp(r)` (default 100, the release's; its appendix
    /// says 10).
    #[serde(default = "DpokSection::default_reward_weight")]
    pub reward_weight: f64,
    /// The weight of the KL of every trained transition to the reference policy's (default
    /// 0.01, the release's; flow_grpo's closed form, as FlowGRPO's `kl_coef`).
    #[serde(default = "DpokSection::default_kl_coef")]
    pub kl_coef: f64,
    /// The KL warm-up: the KL term is left out of the first this many rollouts (rollout ids
    /// below it), so that the reward term alone moves the policy off the reference first
    /// (default 0: the term from the first rollout on, the release's default). The release's
    /// `--kl_warmup k` (its term from rollout `k + 1` on) is `kl_warmup_rollouts = k + 1`.
    #[serde(default)]
    pub kl_warmup_rollouts: u64,
    /// The std divisor of the group-relative advantages (default `group`).
    #[serde(default = "DpokSection::default_std_mode")]
    pub advantage_std_mode: AdvantageStdMode,
    /// Where pi_old comes from (default `"replay"`).
    #[serde(default)]
    pub anchor: AnchorSource,
    /// The release's learned value baseline (its `--v_flag 1`): each trained step's advantage
    /// is `r - V(x_t, c, t)`, the raw combined reward less a small network's prediction from
    /// the state, the prompt and the step, fitted to the rewards of recent rollouts (default
    /// absent: group-relative advantages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_baseline: Option<ValueBaselineSection>,
}

/// DPOK's `algorithm.value_baseline`: the value network and its fit. Every key has the
/// release's default, so `value_baseline = {}` is a complete section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValueBaselineSection {
    /// The hidden width (default 256).
    #[serde(default = "ValueBaselineSection::default_hidden")]
    pub hidden: usize,
    /// Conditional layers before the head (default 3).
    #[serde(default = "ValueBaselineSection::default_layers")]
    pub layers: usize,
    /// The fit's learning rate (AdamW at PyTorch's defaults; default 1e-4, the release's
    /// `--v_lr`).
    #[serde(default = "ValueBaselineSection::default_lr")]
    pub lr: f64,
    /// Rows per minibatch of the fit (default 256, `--v_batch_size`).
    #[serde(default = "ValueBaselineSection::default_batch_size")]
    pub batch_size: usize,
    /// Minibatches per fit, their gradients summed into one optimizer step per rollout
    /// (default 5, `--v_step`).
    #[serde(default = "ValueBaselineSection::default_minibatches")]
    pub minibatches: usize,
    /// Rows (one per sample and trained step) the replay buffer keeps (default 1000,
    /// `--buffer_size`).
    #[serde(default = "ValueBaselineSection::default_buffer_size")]
    pub buffer_size: usize,
}

impl ValueBaselineSection {
    fn default_hidden() -> usize {
        256
    }

    fn default_layers() -> usize {
        3
    }

    fn default_lr() -> f64 {
        1e-4
    }

    fn default_batch_size() -> usize {
        256
    }

    fn default_minibatches() -> usize {
        5
    }

    fn default_buffer_size() -> usize {
        1000
    }
}

impl Default for ValueBaselineSection {
    fn default() -> Self {
        Self {
            hidden: Self::default_hidden(),
            layers: Self::default_layers(),
            lr: Self::default_lr(),
            batch_size: Self::default_batch_size(),
            minibatches: Self::default_minibatches(),
            buffer_size: Self::default_buffer_size(),
        }
    }
}

impl DpokSection {
    fn default_eps_clip() -> f64 {
        1e-4
    }

    fn default_reward_weight() -> f64 {
        100.0
    }

    fn default_kl_coef() -> f64 {
        0.01
    }

    fn default_std_mode() -> AdvantageStdMode {
        AdvantageStdMode::Group
    }
}

impl Default for DpokSection {
    fn default() -> Self {
        Self {
            eps_clip: Self::default_eps_clip(),
            reward_weight: Self::default_reward_weight(),
            kl_coef: Self::default_kl_coef(),
            kl_warmup_rollouts: 0,
            advantage_std_mode: Self::default_std_mode(),
            anchor: AnchorSource::default(),
            value_baseline: None,
        }
    }
}

/// GRPO-Guard's keys of `[algorithm]`; every key has a default, so
/// `algorithm = { kind = "grpo_guard" }` is a complete section. The pi_old anchor is always
/// the replayed one: the regulated ratio needs pi_old's transition means, which the replay
/// records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpoGuardSection {
    /// PPO clip range of the regulated ratio (default 1e-4, FlowGRPO's). The regulated
    /// log-ratio is the plain one's drift-free part times the transition std (below 1), so the
    /// same band clips less often than FlowGRPO's.
    #[serde(default = "GrpoGuardSection::default_eps_clip")]
    pub eps_clip: f64,
    /// Optional asymmetric upper clip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eps_clip_high: Option<f64>,
    /// The std divisor of the group-relative advantages (default `group`).
    #[serde(default = "GrpoGuardSection::default_std_mode")]
    pub advantage_std_mode: AdvantageStdMode,
    /// The weight of the KL of every trained transition to the reference policy's, as
    /// FlowGRPO's `kl_coef` (default 0).
    #[serde(default)]
    pub kl_coef: f64,
}

impl GrpoGuardSection {
    fn default_eps_clip() -> f64 {
        1e-4
    }

    fn default_std_mode() -> AdvantageStdMode {
        AdvantageStdMode::Group
    }
}

impl Default for GrpoGuardSection {
    fn default() -> Self {
        Self {
            eps_clip: Self::default_eps_clip(),
            eps_clip_high: None,
            advantage_std_mode: Self::default_std_mode(),
            kl_coef: 0.0,
        }
    }
}

/// The algorithm names the examples' `--algorithm` takes.
pub const ALGORITHM_NAMES: &[&str] = &[
    "flow_grpo",
    "awm",
    "nft",
    "dpo",
    "dpok",
    "grpo_guard",
    "mix_grpo",
    "dance_grpo",
    "flow_grpo_fast",
    "fdfo",
    "raft",
];

/// The overrides that select algorithm `name` on top of a recipe: its `[algorithm]` section
/// with the variant's defaults, and `sampling.eta = 0` for the objectives on deterministic
/// rollouts (DiffusionNFT, DPO, RAFT). `flow_grpo` is the recipes' own section and sampling:
/// no override. Every other preset that does not set its own kernel or trained steps keeps
/// those it was measured with, Flow-SDE (`sampling.sde_type = "sde"`; the deterministic
/// objectives require it, as they take no SDE) on steps drawn from `[1, 2, 3, 4, 5]`, whatever
/// the recipe's (`shapes_world_lora` trains CPS on `[0, 1, 2, 3, 4]` since 2026-12-07); a
/// `--set` after the preset still changes them.
/// The presets without fixed SDE steps to evaluate at (DiffusionNFT, DPO, RAFT, and the sliding
/// windows of `mix_grpo` and `flow_grpo_fast`) evaluate deterministically
/// (`eval.sampling = "ode"`).
/// `dpok` also takes a quarter of the lr it is given (`optimizer.lr*=0.25`; an
/// `optimizer.lr` set after the preset is taken as it is): at the 2e-3 that `shapes_world_lora`
/// held until 2026-12-07 DPOK collapsed on one to three seeds of five on each of two
/// machines, at 5e-4 it gained on every seed (docs/ALGORITHMS.md).
/// `mix_grpo` is FlowGRPO's objective on MixGRPO's sampling: a sliding window of 2 trained
/// steps over the schedule (moving by 1 every 5 rollouts, back to the start past the end;
/// the other trained-step keys off) and DPM-Solver++(2M) on every other step. `fdfo` sets
/// pairs (`group_size = 2`, one `x_T` per pair, micro-batches of one pair: the only size that
/// divides every update of whole pairs; a larger divisor of the update is faster) and churn at
/// the trained steps (`sde_type = "churn"`, `eta = 0.0025`, the paper's γ). `dance_grpo` is
/// FlowGRPO's objective on DanceGRPO's sampling and subsets, as its FLUX script sets them: the
/// Dance kernel at `eta = 0.3` on every step but the last (`--ignore_last`; the indices are
/// the recipes' 12 steps: with another `sampling.num_inference_steps` set
/// `sampling.sde_indices` too), one `x_T` per group (`--init_same_noise`), and each sample
/// training its own random 60 % of those steps (`algorithm.timestep_fraction = 0.6`).
/// `flow_grpo_fast` is Flow-GRPO-Fast as flow_grpo releases it: every rollout draws one
/// window of 2 consecutive trained steps at random in the first half of the schedule (the
/// release's `sde_window_range = (0, steps // 2)`, from step 1 here: Flow-SDE cannot train the
/// step at sigma = 1), the samples run the ODE up to it, branch with the SDE inside it and
/// finish with the ODE; each candidate keeps its own `x_T` (the release's
/// `same_latent = False`; `rollout.shared_initial_noise = true` branches a whole group from
/// one ODE prefix).
///
/// ```
/// let o = trainer_fsdp::config::algorithm_overrides("nft").unwrap();
/// assert_eq!(o.len(), 5);
/// assert!(trainer_fsdp::config::algorithm_overrides("flow_grpo").unwrap().is_empty());
/// let err = trainer_fsdp::config::algorithm_overrides("ppo").unwrap_err().to_string();
/// assert!(err.contains("ppo") && err.contains("dpok"), "{err}");
/// ```
///
/// # Errors
/// [`TrainerError::UnknownAlgorithm`] for a name not in [`ALGORITHM_NAMES`].
pub fn algorithm_overrides(name: &str) -> Result<Vec<Override>, TrainerError> {
    // the sampling the presets were measured with: Flow-SDE, trained steps from [1..5]
    const FLOW_SDE: &str = "sampling.sde_type=\"sde\"";
    const EARLY_POOL: &str = "sampling.sde_pool=[1, 2, 3, 4, 5]";
    let section = |kind: &str| Override::parse(&format!("algorithm={{ kind = \"{kind}\" }}"));
    let flow_sde = || Override::parse(FLOW_SDE);
    let early_pool = || Override::parse(EARLY_POOL);
    match name {
        "flow_grpo" => Ok(Vec::new()),
        "awm" | "grpo_guard" => Ok(vec![section(name)?, flow_sde()?, early_pool()?]),
        "dpok" => Ok(vec![
            section(name)?,
            flow_sde()?,
            early_pool()?,
            Override::parse("optimizer.lr*=0.25")?,
        ]),
        "nft" | "dpo" | "raft" => Ok(vec![
            section(name)?,
            flow_sde()?,
            early_pool()?,
            Override::parse("sampling.eta=0.0")?,
            Override::parse("eval.sampling=\"ode\"")?,
        ]),
        "fdfo" => {
            let mut o = vec![section(name)?];
            o.extend(Override::parse_all(&[
                "rollout.group_size=2",
                "rollout.micro_batch_size=2",
                "rollout.shared_initial_noise=true",
                "sampling.sde_type=\"churn\"",
                "sampling.eta=0.0025",
            ])?);
            Ok(o)
        }
        "mix_grpo" => Override::parse_all(&[
            FLOW_SDE,
            "sampling.sde_window={ size = 2, stride = 1, shift_interval = 5, at_end = \"roll_back\" }",
            "sampling.num_sde_steps=2",
            "sampling.sde_resample_per_rollout=false",
            "sampling.sde_pool=",
            "sampling.sde_indices=",
            "sampling.sde_timestep_fraction=",
            "sampling.solver=\"dpm_solver_pp2m\"",
            "eval.sampling=\"ode\"",
        ]),
        "flow_grpo_fast" => Override::parse_all(&[
            FLOW_SDE,
            "sampling.sde_window={ size = 2, stride = 1, shift_interval = 1, strategy = \"random\", span = [1, 6] }",
            "sampling.num_sde_steps=2",
            "sampling.sde_resample_per_rollout=false",
            "sampling.sde_pool=",
            "sampling.sde_indices=",
            "sampling.sde_timestep_fraction=",
            "eval.sampling=\"ode\"",
        ]),
        "dance_grpo" => Override::parse_all(&[
            "algorithm.timestep_fraction=0.6",
            "sampling.sde_type=\"dance\"",
            "sampling.eta=0.3",
            "sampling.sde_resample_per_rollout=false",
            "sampling.sde_pool=",
            "sampling.sde_timestep_fraction=",
            "sampling.sde_indices=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]",
            "sampling.num_sde_steps=11",
            "rollout.shared_initial_noise=true",
        ]),
        other => Err(TrainerError::UnknownAlgorithm {
            given: other.to_string(),
            known: ALGORITHM_NAMES.join(", "),
        }),
    }
}

/// RAFT's keys of `[algorithm]`; every key has a default, so `algorithm = { kind = "raft" }`
/// is a complete section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RaftSection {
    /// Candidates of each group fine-tuned on, its best by reward (default 1: best-of-N),
    /// at least 1 and below `rollout.group_size`.
    #[serde(default = "RaftSection::default_top_k")]
    pub top_k: usize,
}

impl RaftSection {
    fn default_top_k() -> usize {
        1
    }
}

impl Default for RaftSection {
    fn default() -> Self {
        Self {
            top_k: Self::default_top_k(),
        }
    }
}

/// Paired finite differences' keys of `[algorithm]`; every key has a default, so
/// `algorithm = { kind = "fdfo" }` is a complete section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FdfoSection {
    /// SPO's `ε` (default 0.03, the paper's).
    #[serde(default = "FdfoSection::default_eps")]
    pub eps: f64,
    /// The std divisor of the advantages whose pair difference is `ΔR` (default `none`: the
    /// raw reward difference, the paper's).
    #[serde(default = "FdfoSection::default_std_mode")]
    pub advantage_std_mode: AdvantageStdMode,
}

impl FdfoSection {
    fn default_eps() -> f64 {
        0.03
    }

    fn default_std_mode() -> AdvantageStdMode {
        AdvantageStdMode::None
    }
}

impl Default for FdfoSection {
    fn default() -> Self {
        Self {
            eps: Self::default_eps(),
            advantage_std_mode: Self::default_std_mode(),
        }
    }
}

impl AlgorithmSection {
    /// Whether the objective trains on deterministic rollouts (`sampling.eta = 0`).
    pub fn ode_rollouts(&self) -> bool {
        matches!(
            self,
            AlgorithmSection::Nft(_) | AlgorithmSection::Dpo(_) | AlgorithmSection::Raft(_)
        )
    }
}

/// `[algorithm] soft_update` of DiffusionNFT.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SoftUpdateKind {
    /// `min(0.001 i, 0.5)`.
    #[default]
    Ramp,
    /// 0 for 75 rollouts, then `min(0.0075 (i - 75), 0.999)`.
    FlatThenRamp,
}

impl SoftUpdateKind {
    /// flow-grpo's schedule.
    pub fn schedule(self) -> flow_grpo::SoftUpdate {
        match self {
            SoftUpdateKind::Ramp => flow_grpo::SoftUpdate::RAMP,
            SoftUpdateKind::FlatThenRamp => flow_grpo::SoftUpdate::FLAT_THEN_RAMP,
        }
    }
}

/// `[algorithm] weighting` of AWM.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AwmWeightingKind {
    /// `log p = -mse` (the paper's `w(t) = 1`).
    #[default]
    Uniform,
    /// `log p = -mse^p * sigma / p` (the release's, `p = huber_power`).
    Huber,
}

/// FlowGRPO's keys of `[algorithm]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowGrpoSection {
    /// PPO clip range (FlowGRPO uses `1e-4`).
    pub eps_clip: f64,
    /// Optional asymmetric upper clip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eps_clip_high: Option<f64>,
    /// The std divisor of the group-relative advantages after centring.
    pub advantage_std_mode: AdvantageStdMode,
    /// The weight of the KL of every trained transition to the reference policy's (the
    /// pretrained model: the policy with its LoRA adapters off, or for a full fine-tune a
    /// frozen copy of its weights as loaded), flow_grpo's closed form
    /// `mean((mu - mu_ref)^2) / (2 std_dev_t^2)`; `0` turns the term and its forward off.
    /// flow_grpo's released configs use 0.04 (SD3.5, GenEval) and 0 (PickScore).
    pub kl_coef: f64,
    /// Where the pi_old log-probs come from (`"replay"` when absent).
    #[serde(default)]
    pub anchor: AnchorSource,
    /// DanceGRPO's per-sample timestep subset: each sample trains its own random
    /// `floor(fraction * trained steps)` of the rollout's trained steps, in `(0, 1]`
    /// (DanceGRPO: 0.6); absent: every sample trains every trained step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestep_fraction: Option<f64>,
}

/// `[algorithm] anchor`: the pi_old log-probs the clipped ratio is taken against.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnchorSource {
    /// Seed 002's explicit anchor: every trained step is replayed through the autodiff model
    /// under the weights before the first optimizer step, so the first update's ratio is
    /// exactly 1; the sampler's own log-probs are compared with it
    /// (`train/logp_parity_max_abs`). Costs one forward of every trained transition.
    #[default]
    Replay,
    /// The sampler's own log-probs, stored with the trajectory (flow_grpo's `old_log_prob`):
    /// no replay, so a rollout's training costs only its updates. The first update's ratio
    /// is 1 up to the difference between the sampler's forward and the autodiff one (about
    /// 1e-7 in log-prob on the shapes world); `train/logp_parity_max_abs` is then measured on
    /// the first update's samples, as its largest `|ln ratio|`.
    Rollout,
}

/// Where each key of the former `[grpo]` section went; a config that still uses one is
/// refused with an error naming the new key.
pub const MOVED_KEYS: &[(&str, &str)] = &[
    ("grpo.prompts_per_rollout", "rollout.prompts_per_rollout"),
    ("grpo.group_size", "rollout.group_size"),
    (
        "grpo.num_updates_per_batch",
        "rollout.num_updates_per_batch",
    ),
    ("grpo.micro_batch_size", "rollout.micro_batch_size"),
    (
        "grpo.eps_clip",
        "algorithm.eps_clip (with algorithm.kind = \"flow_grpo\")",
    ),
    (
        "grpo.eps_clip_high",
        "algorithm.eps_clip_high (with algorithm.kind = \"flow_grpo\")",
    ),
    (
        "grpo.advantage_std_mode",
        "algorithm.advantage_std_mode (with algorithm.kind = \"flow_grpo\")",
    ),
    (
        "grpo.kl_coef",
        "algorithm.kl_coef (with algorithm.kind = \"flow_grpo\")",
    ),
    ("grpo.clip_grad", "optimizer.clip_grad"),
];

/// The deterministic solver of the steps that are not trained (and of every evaluation
/// step but those `eval.sampling = "sde"` noises).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SolverKind {
    /// The Euler step `x + v dt`.
    Euler,
    /// DPM-Solver++(2M), midpoint second-order update (diffusers' default; flow_grpo's
    /// `dpm2`).
    DpmSolverPp2m,
    /// UniPC-bh2 of order 2 with the corrector (diffusers' `UniPCMultistepScheduler`
    /// defaults).
    UnipcBh2,
}

impl SolverKind {
    /// The `sde-math` solver.
    pub fn solver(self) -> OdeSolver {
        match self {
            SolverKind::Euler => OdeSolver::Euler,
            SolverKind::DpmSolverPp2m => OdeSolver::DpmSolverPP(
                DpmSolverPP::new(2, DpmSecondOrder::Midpoint).expect("order 2 is valid"),
            ),
            SolverKind::UnipcBh2 => OdeSolver::UniPc(UniPc::bh2()),
        }
    }

    /// The name written in configs and fingerprints.
    pub fn as_str(self) -> &'static str {
        match self {
            SolverKind::Euler => "euler",
            SolverKind::DpmSolverPp2m => "dpm_solver_pp2m",
            SolverKind::UnipcBh2 => "unipc_bh2",
        }
    }
}

/// The precision the trajectory stores latents at (the sampler scores samples rounded to it,
/// so replay reads back exactly what was scored).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StorageKind {
    /// bfloat16 (seed 002's sidecars).
    Bf16,
    /// IEEE half.
    F16,
    /// f32 (exact).
    F32,
}

impl StorageKind {
    /// The `sde-math` storage precision.
    pub fn dtype(self) -> StorageDtype {
        match self {
            StorageKind::Bf16 => StorageDtype::Bf16,
            StorageKind::F16 => StorageDtype::F16,
            StorageKind::F32 => StorageDtype::F32,
        }
    }
}

/// A scorer of `[reward] scorers`, with the components it produces.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ScorerSpec {
    /// `"shapes"`: the shapes world's verifiable composition judge (component `shapes`, plus
    /// per-constraint details); an object is the shape of its best-fitting template, all or
    /// nothing (`reward::shapes::ShapeCredit::BestFit`).
    Shapes,
    /// `"shapes_graded"`: the same judge crediting an object's shape by how far its template
    /// fit leads the other shapes' (`reward::shapes::ShapeCredit::GRADED`: full at a lead of
    /// 0.04, one half at a tie); component `shapes`.
    ShapesGraded,
    /// `"shapes_rerender"`: the shapes world's second, independent judge
    /// (`reward::shapes::judge_rerendered`: another parser and thresholds, GenEval's counting
    /// credit, the picture compared with a clean re-rendering of what was parsed); component
    /// `shapes_rerender`. Logged beside the first judge through `eval.judges`.
    ShapesRerender,
    /// `"jpeg_compressibility"`: DDPO's `-size_kb` at JPEG quality 95.
    JpegCompressibility,
    /// `"jpeg_incompressibility"`: DDPO's `+size_kb`.
    JpegIncompressibility,
    /// `{ pickscore = { model_path = "..." } }`: PickScore (CLIP) from a transformers
    /// directory (component `pickscore`).
    Pickscore {
        /// The model directory (`config.json`, safetensors, tokenizer and processor files).
        model_path: PathBuf,
    },
    /// `{ world = { components = [...] } }`: the world's own verifiable reward, producing
    /// these components (a synthetic world that knows the right answer, e.g. a test's
    /// closed-form reward). A world without such a reward refuses it.
    World {
        /// The components the world's reward produces.
        components: Vec<String>,
    },
}

impl ScorerSpec {
    /// The components every sample gets from this scorer.
    pub fn components(&self) -> Vec<String> {
        match self {
            ScorerSpec::Shapes | ScorerSpec::ShapesGraded => {
                vec![reward::shapes::SHAPES_COMPONENT.into()]
            }
            ScorerSpec::ShapesRerender => vec![reward::shapes::RERENDER_COMPONENT.into()],
            ScorerSpec::JpegCompressibility => vec!["jpeg_compressibility".into()],
            ScorerSpec::JpegIncompressibility => vec!["jpeg_incompressibility".into()],
            ScorerSpec::Pickscore { .. } => vec![reward::PICKSCORE_COMPONENT.into()],
            ScorerSpec::World { components } => components.clone(),
        }
    }
}

/// `[optimizer]`: AdamW and the learning-rate schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerSection {
    /// Peak learning rate (`--lr`).
    pub lr: f64,
    /// Decoupled weight decay (`--weight-decay`).
    pub weight_decay: f64,
    /// `--adam-beta1`.
    pub adam_beta1: f64,
    /// `--adam-beta2`.
    pub adam_beta2: f64,
    /// `--adam-eps` (added to `sqrt(v_hat)`).
    pub adam_eps: f64,
    /// Global gradient-norm clip before each optimizer step (`--clip-grad`).
    pub clip_grad: f64,
    /// Linear warmup length in optimizer steps.
    pub lr_warmup_iters: u64,
    /// The post-warmup shape.
    pub lr_scheduler: LrSchedulerKind,
    /// The final rate of a decaying shape.
    pub min_lr: f64,
    /// The step at which a decaying shape reaches `min_lr`.
    #[serde(default)]
    pub lr_decay_iters: Option<u64>,
}

/// `[reward]`: components and their weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardSection {
    /// The scorers of every sample (training and evaluation); their components are merged,
    /// and two scorers may not produce the same component.
    pub scorers: Vec<ScorerSpec>,
    /// Components that must be present and finite; a miss fails the group.
    pub required_components: Vec<String>,
    /// `{component: weight}` combining the normalised components. Entries not listed as
    /// required are optional components.
    pub component_weights: BTreeMap<String, f64>,
}

/// `[checkpoint]`: where and how often.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointSection {
    /// The checkpoint root (`--save`); checkpoints live under `<dir>/<task>/iter_<n>/`.
    pub dir: PathBuf,
    /// Save every this many rollouts (and at the end, and on Ctrl-C).
    pub save_interval: u64,
    /// Committed checkpoints kept; `None` keeps all.
    #[serde(default)]
    pub max_to_keep: Option<usize>,
    /// Continue from the last committed checkpoint under `dir` (`--resume`); with none
    /// committed that is an error unless `allow_fresh`.
    pub resume: bool,
    /// With `resume` and no committed checkpoint, start from scratch (saying so) instead of
    /// failing: for jobs that are restarted blindly after a crash.
    #[serde(default)]
    pub allow_fresh: bool,
    /// With `resume`, continue from this committed iteration instead of the newest
    /// (`--resume-from`); the newer checkpoints are moved aside once it has loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_from: Option<u64>,
    /// With `resume`, accept a config that changes results (seed, optimizer, algorithm, batch
    /// geometry, sampling, reward, ...) relative to the run being continued, recording the
    /// differences in the run directory (`--allow-config-changes`).
    #[serde(default)]
    pub allow_config_changes: bool,
    /// A fresh run into a directory holding a run moves the old run aside (into
    /// `<run dir>/previous-<Unix time>/`) instead of refusing (`--overwrite`).
    #[serde(default)]
    pub overwrite: bool,
    /// What a failed checkpoint write does (seed 002: logged loudly, counted in
    /// `train/checkpoint_failures`, not fatal).
    #[serde(default)]
    pub on_failure: CheckpointFailurePolicy,
}

/// `checkpoint.on_failure`: what a checkpoint write that fails with an IO error (disk full, a
/// read-only or vanished directory) does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointFailurePolicy {
    /// Warn, count it in `train/checkpoint_failures` and try again at the next save; the last
    /// checkpoint of a run (its end, or a stop request) is fatal all the same, as there is no
    /// next one.
    #[default]
    Retry,
    /// End the run with the error.
    Fatal,
}

/// `[artifacts]`: trajectory sidecars and images.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArtifactSection {
    /// `--artifact-root`.
    pub root: PathBuf,
    /// Rollout directories kept; `<= 0` keeps all (unbounded growth).
    pub retention_rollouts: i64,
}

/// `[eval]`: the held-out evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalSection {
    /// Evaluate every this many rollouts; 0 never.
    pub interval: u64,
    /// Samples per eval prompt (`--n-samples-per-eval-prompt`).
    pub samples_per_prompt: usize,
    /// The evaluation sampler's steps (optional: `sampling.num_inference_steps`). Flow-GRPO's
    /// "denoising reduction": rollouts at few steps (cheap, and they rank samples as well),
    /// evaluations at the steps the model is used at. The schedule is the sampling one
    /// (`[scheduler]`, `sampling.height` / `width`) at this many steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_inference_steps: Option<usize>,
    /// True classifier-free guidance of the evaluation's sampler (diffusers'
    /// `QwenImagePipeline` `true_cfg_scale` and `negative_prompt`); absent: unguided, as the
    /// rollouts sample. Rollouts are never guided (`sampling.guidance_scale` must stay 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guidance: Option<EvalGuidance>,
    /// How the evaluation samples (a config without the key: `"ode"`, what every build
    /// before the key ran).
    #[serde(default)]
    pub sampling: EvalSampling,
    /// Scorers whose components are reported beside the reward at every evaluation, each
    /// with its standard error (`eval/judge/<component>`, `eval/judge/<component>_se`, and
    /// the evaluation's line): a second judgement of the same pictures that the reward does
    /// not weigh, so that a gain only one judge sees shows. They score every sample beside
    /// `reward.scorers` (a judge that is also a reward scorer scores once); none may produce
    /// a component another scorer produces.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub judges: Vec<ScorerSpec>,
    /// Also sample every held-out picture from the same initial noise with the rollouts' SDE
    /// transitions at the plan's evaluation steps (as `eval.sampling = "sde"` does), and
    /// report their reward beside the deterministic one (`eval/sde_reward`, its `_se`, and
    /// `eval/sde_gap`, deterministic minus SDE): how much the rollouts' noise costs the
    /// pictures the reward ranks, which the deterministic evaluation never sees. It doubles
    /// the evaluation's sampling and changes no result. Needs `eval.sampling = "ode"` and SDE
    /// rollouts.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sde_gap: bool,
}

impl EvalSection {
    /// The components the `judges` score, in their order: the held-out evaluation's second
    /// judgements (`eval/judge/<component>`).
    pub fn judge_components(&self) -> Vec<String> {
        self.judges
            .iter()
            .flat_map(ScorerSpec::components)
            .collect()
    }

    /// The judgement a run's summary, the seeds' table and the comparison report as *the
    /// second judge*: the first of [`Self::judge_components`] by name (as
    /// [`crate::EvalSummary::second`] reads it); `None` without judges.
    ///
    /// ```
    /// let cfg = trainer_fsdp::TrainConfig::shapes_world_lora();
    /// assert_eq!(cfg.eval.second_judge().as_deref(), Some("shapes_rerender"));
    /// ```
    pub fn second_judge(&self) -> Option<String> {
        self.judge_components().into_iter().min()
    }
}

/// `eval.sampling`: how the held-out evaluation samples its pictures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum EvalSampling {
    /// The solver on every step: a picture is a pure function of its initial noise.
    #[default]
    Ode,
    /// Seed 002's evaluation: the rollouts' SDE kernel (`sampling.sde_type`, `eta`) at the
    /// plan's evaluation steps — `sampling.sde_indices`, the fallback that a per-rollout
    /// resample uses when there is no rollout id — and the solver elsewhere. The noise of
    /// those steps is a pure function of `run.seed` and the sample, so the number stays
    /// comparable across evaluations. Only for SDE rollouts at the rollouts' own step count.
    Sde,
}

impl EvalSampling {
    /// The key's value as a config writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            EvalSampling::Ode => "ode",
            EvalSampling::Sde => "sde",
        }
    }
}

/// `eval.guidance = { scale, negative_prompt }`: every evaluation step runs the policy on the
/// prompt and on the negative prompt and takes `neg + scale (pos - neg)`, rescaled token by
/// token to the positive prediction's norm (`velocity_model::TrueCfg`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalGuidance {
    /// The guidance scale, `> 1` (Qwen-Image's pipeline default: 4).
    pub scale: f64,
    /// The negative prompt of every held-out prompt (diffusers needs one to guide; `" "`
    /// serves).
    pub negative_prompt: String,
}

/// When progress bars draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ProgressMode {
    /// When stderr is a terminal (never into a log file or CI output).
    #[default]
    Auto,
    /// Never.
    Never,
}

/// `[monitor]`: outputs that change no result, hence with defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MonitorSection {
    /// Write `metrics.jsonl`.
    #[serde(default = "yes")]
    pub jsonl: bool,
    /// Write TensorBoard event files.
    #[serde(default = "yes")]
    pub tensorboard: bool,
    /// Progress bars.
    #[serde(default)]
    pub progress: ProgressMode,
}

fn yes() -> bool {
    true
}

impl Default for MonitorSection {
    fn default() -> Self {
        Self {
            jsonl: true,
            tensorboard: true,
            progress: ProgressMode::Auto,
        }
    }
}

/// The whole training configuration. See the module docs for the file format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// The recipe this config started from (provenance; the values below are what runs).
    #[serde(default)]
    pub recipe: Option<RecipeName>,
    /// `[run]`.
    pub run: RunSection,
    /// `[model]`.
    pub model: ModelSection,
    /// `[lora]`; absent means rank 0.
    #[serde(default)]
    pub lora: Option<LoraSection>,
    /// `[sampling]`.
    pub sampling: SamplingSection,
    /// `[rollout]`.
    pub rollout: RolloutSection,
    /// `[algorithm]`.
    pub algorithm: AlgorithmSection,
    /// `[optimizer]`.
    pub optimizer: OptimizerSection,
    /// `[reward]`.
    pub reward: RewardSection,
    /// `[checkpoint]`.
    pub checkpoint: CheckpointSection,
    /// `[artifacts]`.
    pub artifacts: ArtifactSection,
    /// `[eval]`.
    pub eval: EvalSection,
    /// `[ema]`: an exponential moving average of the trained weights for evaluation,
    /// checkpoints and export (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ema: Option<EmaSection>,
    /// `[monitor]`.
    #[serde(default)]
    pub monitor: MonitorSection,
    /// `[data]`: prompt files instead of the world's own prompts (absent: the world's).
    #[serde(default, skip_serializing_if = "DataSection::is_empty")]
    pub data: DataSection,
}

/// `[ema]`: the exponential moving average of the trained weights ([`crate::ema`]). The
/// rollouts sample with the live weights; evaluations sample with the average, checkpoints'
/// readable adapter files and exports hold it, and `model.mpk` keeps the live weights (with
/// the average beside them in `ema.mpk`) so that a resume is exact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmaSection {
    /// The largest decay, in `[0, 1)` (flow_grpo's SD3 recipe: 0.9; the AWM release: 0.3).
    pub decay: f64,
    /// The decay's warm-up over the first optimizer steps: `"none"`, `"flow_grpo"`
    /// (`min(decay, (1 + s) / (10 + s))`) or `"linear"` (`min(decay, ramp · s)`).
    pub warmup: EmaWarmupKind,
    /// The decay gained per optimizer step, with `warmup = "linear"` only (the AWM release:
    /// 0.001).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ramp: Option<f64>,
    /// The average moves after every `update_interval`-th optimizer step (flow_grpo: 8).
    pub update_interval: u64,
    /// Where trainable weights are held below f32 (a full fine-tune in bf16), the dtype of
    /// their average: `"fp32"` (an f32 average, rounded for the copy evaluations sample
    /// with) or `"param"` (the weights' own dtype, as diffusers' `EMAModel` and flow_grpo
    /// keep it, where moves smaller than half a bf16 step round away). Required when the
    /// trained weights are bf16 (`trainable_mode = "full"`, `param_dtype = "bf16"`, no f32
    /// master); where they are f32 both mean f32, and absent is `"fp32"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<EmaPrecisionKind>,
}

/// `[ema] precision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EmaPrecisionKind {
    /// An f32 average.
    Fp32,
    /// The weights' own dtype.
    Param,
}

/// `[ema] warmup`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EmaWarmupKind {
    /// The decay from the first step.
    None,
    /// flow_grpo's `min(decay, (1 + s) / (10 + s))`.
    FlowGrpo,
    /// `min(decay, ramp · s)`.
    Linear,
}

/// `[data]`: prompt files in the unified JSONL schema (`prompt-data`; the `prompts` example's
/// `curate` writes them), used instead of the world's own prompts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSection {
    /// The training prompts a rollout draws from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train: Option<PathBuf>,
    /// The held-out prompts of every evaluation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval: Option<PathBuf>,
}

impl DataSection {
    /// Neither file set.
    pub fn is_empty(&self) -> bool {
        self.train.is_none() && self.eval.is_none()
    }
}

impl TrainConfig {
    /// Parses a config from TOML text. A top-level `recipe = "<name>"` starts from that
    /// recipe and the text overrides it; the `overrides` apply last (an override of `recipe`
    /// picks the base recipe). `origin` names the text in errors.
    ///
    /// # Errors
    /// [`TrainerError::ConfigParse`] (invalid TOML, a missing required key, an unknown key, a
    /// wrong type), [`TrainerError::UnknownRecipe`], [`TrainerError::Override`].
    pub fn from_toml_str(
        text: &str,
        origin: Option<&Path>,
        overrides: &[Override],
    ) -> Result<Self, TrainerError> {
        let origin = origin
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("<memory>"));
        let mut file: toml::Table =
            toml::from_str(text).map_err(|source| TrainerError::ConfigParse {
                origin: origin.clone(),
                source: Box::new(source),
            })?;
        check_moved_keys(&origin, &file, overrides)?;
        let mut recipe = match file.remove("recipe") {
            None => None,
            Some(toml::Value::String(name)) => Some(RecipeName::parse(&name)?),
            Some(other) => {
                return Err(TrainerError::UnknownRecipe {
                    given: other.to_string(),
                    known: RecipeName::ALL.iter().map(|r| r.as_str()).collect(),
                });
            }
        };
        for o in overrides.iter().filter(|o| o.path == ["recipe"]) {
            match &o.value {
                toml::Value::String(name) => recipe = Some(RecipeName::parse(name)?),
                other => {
                    return Err(TrainerError::UnknownRecipe {
                        given: other.to_string(),
                        known: RecipeName::ALL.iter().map(|r| r.as_str()).collect(),
                    });
                }
            }
        }
        let mut table = match recipe {
            Some(r) => r.config().to_table()?,
            None => toml::Table::new(),
        };
        merge(&mut table, file);
        for o in overrides.iter().filter(|o| o.path != ["recipe"]) {
            apply_override(&mut table, o)?;
        }
        match recipe {
            Some(r) => table.insert("recipe".into(), toml::Value::String(r.as_str().into())),
            None => table.remove("recipe"),
        };
        Self::from_table(table, origin)
    }

    /// Deserialises the merged tree; on failure every problem of every section is collected
    /// ([`TrainerError::ConfigInvalid`]), not only the first.
    fn from_table(table: toml::Table, origin: PathBuf) -> Result<Self, TrainerError> {
        match toml::Value::Table(table.clone()).try_into() {
            Ok(c) => Ok(c),
            Err(whole) => {
                let found = section_problems(&table);
                let mut problems: Vec<String> = found.iter().map(|(_, m)| m.clone()).collect();
                if problems.is_empty() {
                    problems.push(whole.to_string().trim().to_string());
                }
                let broken: Vec<&str> = found.iter().filter_map(|(s, _)| *s).collect();
                problems.extend(preflight_of_the_rest(&table, &broken));
                Err(TrainerError::ConfigInvalid { origin, problems })
            }
        }
    }

    /// Reads a TOML config file (see [`TrainConfig::from_toml_str`]).
    ///
    /// # Errors
    /// [`TrainerError::Io`] and the errors of [`TrainConfig::from_toml_str`].
    pub fn from_file(path: &Path, overrides: &[Override]) -> Result<Self, TrainerError> {
        let text = std::fs::read_to_string(path).map_err(io_err(path, "read config"))?;
        Self::from_toml_str(&text, Some(path), overrides)
    }

    /// A recipe with overrides applied.
    ///
    /// # Errors
    /// As [`TrainConfig::with_overrides`].
    pub fn from_recipe(recipe: RecipeName, overrides: &[Override]) -> Result<Self, TrainerError> {
        recipe.config().with_overrides(overrides)
    }

    /// This config with `overrides` applied (through the same TOML tree a file goes through,
    /// so an override is checked exactly like a file key).
    ///
    /// # Errors
    /// [`TrainerError::Override`], [`TrainerError::ConfigParse`].
    pub fn with_overrides(self, overrides: &[Override]) -> Result<Self, TrainerError> {
        check_moved_keys(Path::new("<overrides>"), &toml::Table::new(), overrides)?;
        let mut table = self.to_table()?;
        for o in overrides {
            apply_override(&mut table, o)?;
        }
        Self::from_table(table, PathBuf::from("<overrides>"))
    }

    fn to_table(&self) -> Result<toml::Table, TrainerError> {
        toml::Table::try_from(self).map_err(|source| TrainerError::ConfigSerialize { source })
    }

    /// The config as TOML text; [`TrainConfig::from_toml_str`] reads it back equal.
    ///
    /// # Errors
    /// [`TrainerError::ConfigSerialize`].
    pub fn to_toml_string(&self) -> Result<String, TrainerError> {
        toml::to_string(self).map_err(|source| TrainerError::ConfigSerialize { source })
    }

    /// Writes the resolved config to `<run_dir>/config.resolved.toml` atomically and returns
    /// the path.
    ///
    /// # Errors
    /// [`TrainerError::ConfigSerialize`], [`TrainerError::Io`] naming the file.
    pub fn save_resolved(&self, run_dir: &Path) -> Result<PathBuf, TrainerError> {
        let path = run_dir.join(RESOLVED_CONFIG_FILE);
        let text = self.to_toml_string()?;
        durable::write_atomic(&path, text.as_bytes())?;
        Ok(path)
    }

    /// The LoRA rank as the seed's flags see it (0 without a `[lora]` section).
    pub fn lora_rank(&self) -> usize {
        self.lora.as_ref().map_or(0, |l| l.rank)
    }

    /// Every scorer a sample is scored by: `reward.scorers`, then the `eval.judges` that are
    /// not among them.
    pub fn all_scorers(&self) -> Vec<ScorerSpec> {
        let mut out = self.reward.scorers.clone();
        for j in &self.eval.judges {
            if !out.contains(j) {
                out.push(j.clone());
            }
        }
        out
    }

    /// The reward components for the advantage computation: the required ones, then the
    /// optional ones (weights not listed as required). A required component without a weight
    /// is left out (preflight reports it).
    pub fn reward_components(&self) -> Vec<RewardComponent> {
        let r = &self.reward;
        let mut out: Vec<RewardComponent> = r
            .required_components
            .iter()
            .filter_map(|name| {
                r.component_weights
                    .get(name)
                    .map(|&w| RewardComponent::required(name, w))
            })
            .collect();
        for (name, &w) in &r.component_weights {
            if !r.required_components.contains(name) {
                out.push(RewardComponent::optional(name, w));
            }
        }
        out
    }
}

/// Refuses every key of a file or an override that moved ([`MOVED_KEYS`]), naming the new
/// key of each.
fn check_moved_keys(
    origin: &Path,
    file: &toml::Table,
    overrides: &[Override],
) -> Result<(), TrainerError> {
    let mut used: Vec<String> = Vec::new();
    if let Some(toml::Value::Table(grpo)) = file.get("grpo") {
        used.extend(grpo.keys().map(|k| format!("grpo.{k}")));
        if grpo.is_empty() {
            used.push("grpo".into());
        }
    } else if file.contains_key("grpo") {
        used.push("grpo".into());
    }
    for o in overrides {
        if o.path.first().map(String::as_str) == Some("grpo") {
            used.push(o.path.join("."));
        }
    }
    if used.is_empty() {
        return Ok(());
    }
    let moved = used
        .into_iter()
        .map(|old| {
            let new = MOVED_KEYS
                .iter()
                .find(|(o, _)| *o == old)
                .map(|(_, n)| n.to_string())
                .unwrap_or_else(|| {
                    "nothing: [grpo] was split into [rollout], [algorithm] and optimizer.clip_grad"
                        .into()
                });
            (old, new)
        })
        .collect();
    Err(TrainerError::MovedKeys {
        origin: origin.to_path_buf(),
        moved,
    })
}

/// Deep-merges `over` into `base`: tables merge key by key, anything else replaces.
fn merge(base: &mut toml::Table, mut over: toml::Table) {
    // a section that names another `kind` (another algorithm) replaces the base's whole
    // section: the base's variant keys are not the new variant's
    for section in TAGGED_SECTIONS {
        if let (Some(toml::Value::Table(b)), Some(toml::Value::Table(o))) =
            (base.get(*section), over.get(*section))
            && o.get("kind").is_some_and(|k| b.get("kind") != Some(k))
        {
            base.insert(
                (*section).to_string(),
                over.remove(*section).expect("present"),
            );
        }
    }
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// Sections whose `kind` picks a variant with its own keys.
const TAGGED_SECTIONS: &[&str] = &["algorithm"];

/// Applies `o` to `table`; an override of a tagged section's `kind` to another variant
/// (`algorithm.kind = "awm"`) starts that section afresh from the variant's defaults, so the
/// overrides after it set the new variant's keys.
fn apply_override(table: &mut toml::Table, o: &Override) -> Result<(), TrainerError> {
    if let [section, key] = o.path.as_slice()
        && key == "kind"
        && TAGGED_SECTIONS.contains(&section.as_str())
        && let Some(toml::Value::Table(t)) = table.get(section.as_str())
        && t.get("kind") != Some(&o.value)
    {
        table.insert(section.clone(), toml::Value::Table(toml::Table::new()));
    }
    o.apply(table)
}

/// The top-level keys of a config.
const SECTIONS: &[&str] = &[
    "recipe",
    "run",
    "model",
    "lora",
    "sampling",
    "rollout",
    "algorithm",
    "optimizer",
    "reward",
    "checkpoint",
    "artifacts",
    "eval",
    "ema",
    "monitor",
    "data",
];

/// Every problem of a config tree, section by section: unknown top-level keys, missing
/// sections, and within a section each unknown key (removed and the section tried again, so
/// that one unknown key does not hide the next) and then its first other problem. Each
/// problem comes with its section (`None` for an unknown top-level key).
fn section_problems(table: &toml::Table) -> Vec<(Option<&'static str>, String)> {
    let mut out = Vec::new();
    for key in table.keys() {
        if !SECTIONS.contains(&key.as_str()) {
            out.push((
                None,
                format!(
                    "unknown top-level key `{key}`; the sections are {}",
                    SECTIONS.join(", ")
                ),
            ));
        }
    }
    let mut check = |name: &'static str, problems: Vec<String>| {
        out.extend(problems.into_iter().map(|m| (Some(name), m)));
    };
    check("run", check_section::<RunSection>(table, "run", true));
    check("model", check_section::<ModelSection>(table, "model", true));
    check("lora", check_section::<LoraSection>(table, "lora", false));
    check(
        "sampling",
        check_section::<SamplingSection>(table, "sampling", true),
    );
    check(
        "rollout",
        check_section::<RolloutSection>(table, "rollout", true),
    );
    check(
        "algorithm",
        check_section::<AlgorithmSection>(table, "algorithm", true),
    );
    check(
        "optimizer",
        check_section::<OptimizerSection>(table, "optimizer", true),
    );
    check(
        "reward",
        check_section::<RewardSection>(table, "reward", true),
    );
    check(
        "checkpoint",
        check_section::<CheckpointSection>(table, "checkpoint", true),
    );
    check(
        "artifacts",
        check_section::<ArtifactSection>(table, "artifacts", true),
    );
    check("eval", check_section::<EvalSection>(table, "eval", true));
    check("ema", check_section::<EmaSection>(table, "ema", false));
    check(
        "monitor",
        check_section::<MonitorSection>(table, "monitor", false),
    );
    check("data", check_section::<DataSection>(table, "data", false));
    out
}

/// Preflight's problems with the rest of a config whose `broken` sections do not parse: those
/// sections are taken from the config's recipe (without one there is nothing to stand in for
/// them, and nothing is reported), and problems of keys in them are left out.
fn preflight_of_the_rest(table: &toml::Table, broken: &[&str]) -> Vec<String> {
    let Some(recipe) = table
        .get("recipe")
        .and_then(toml::Value::as_str)
        .and_then(|r| RecipeName::parse(r).ok())
    else {
        return Vec::new();
    };
    let Ok(base) = recipe.config().to_table() else {
        return Vec::new();
    };
    let mut rest = table.clone();
    rest.retain(|k, _| SECTIONS.contains(&k));
    for name in broken {
        match base.get(*name) {
            Some(v) => rest.insert((*name).to_string(), v.clone()),
            None => rest.remove(*name),
        };
    }
    let Ok(cfg) = toml::Value::Table(rest).try_into::<TrainConfig>() else {
        return Vec::new();
    };
    match cfg.preflight() {
        Err(TrainerError::Preflight { problems }) => problems
            .iter()
            .map(ToString::to_string)
            .filter(|m| !broken.iter().any(|b| m.starts_with(&format!("{b}."))))
            .map(|m| format!("(preflight) {m}"))
            .collect(),
        _ => Vec::new(),
    }
}

fn check_section<T: serde::de::DeserializeOwned>(
    table: &toml::Table,
    name: &str,
    required: bool,
) -> Vec<String> {
    let mut out = Vec::new();
    let Some(value) = table.get(name) else {
        if required {
            out.push(format!("missing section [{name}]"));
        }
        return out;
    };
    let mut value = value.clone();
    // each unknown key is reported and taken out, so the next problem shows too
    for _ in 0..64 {
        let Err(e) = value.clone().try_into::<T>() else {
            return out;
        };
        let msg = e.to_string().trim().replace('\n', " ");
        out.push(format!("[{name}] {msg}"));
        let unknown = msg
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.split('`').next())
            .map(str::to_string);
        let removed = match (unknown, value.as_table_mut()) {
            (Some(key), Some(t)) => t.remove(&key).is_some(),
            _ => false,
        };
        if !removed {
            return out;
        }
    }
    out
}
