//! Trains the shapes world's base generator by flow matching on rendered scenes.
//!
//! The embedded default (`qwen_image_t2i_lora`) post-trains this model with FlowGRPO. It is the
//! Qwen-Image transformer at a tiny configuration plus a small text encoder
//! (`trainer_fsdp::shapes_world`), trained here on procedurally drawn scenes of the
//! `reward::shapes` world. It is deliberately imperfect at prompt following: a fixed, modest
//! number of steps, and a share of the training captions corrupted (a colour, count, shape or
//! relation changed) the way web captions disagree with their images — so RL has headroom.
//!
//! ```sh
//! cargo run --release --example pretrain_shapes -- --overwrite   # rewrites fixtures/shapes_world/
//! # a generator's held-out reward, as the trainer's evaluation with run.seed = 0 measures it
//! cargo run --release --example pretrain_shapes -- --init-from fixtures/shapes_world --steps 0 \
//!     --eval-samples 48 --eval-seed 0 --out runs/measured
//! # the supervised reference of docs/ALGORITHMS.md: 1500 more steps on true captions
//! cargo run --release --example pretrain_shapes -- --init-from fixtures/shapes_world --seed 10 \
//!     --steps 1500 --warmup 10 --caption-noise 0 --eval-every 0 --eval-samples 48 --eval-seed 0 \
//!     --out runs/supervised_s0
//! ```
//!
//! The defaults reproduce the committed weights (about 40 minutes on 2 CPU cores). A directory
//! that already holds files (`--out`, or a snapshot's `step_<N>/`) is replaced only with
//! `--overwrite`, and never the one `--init-from` loads; all of it is checked before training.
//!
//! A base that can draw but is misaligned, the way real models are (a long run, resumable):
//!
//! ```sh
//! # captions dropped for classifier-free guidance, most captions wrong, an EMA of the weights;
//! # the state is saved every 250 steps, and the same command goes on where a run stopped
//! cargo run --release --example pretrain_shapes -- --init-from fixtures/shapes_world --seed 100 \
//!     --steps 12000 --batch 64 --warmup 200 --lr-schedule cosine --min-lr 1e-5 \
//!     --caption-noise 0.7 --caption-dropout 0.1 --ema 0.999 \
//!     --eval-every 1000 --eval-guidance 4 --state runs/base/state --resume --out runs/base/final
//! ```
//!
//! The supervised baselines of an RL run at equal CPU (issue 51): continued pretraining on the
//! same corpus, and training on true captions (the answers), each stopped when its training
//! steps have spent the RL run's `perf/train_cpu_seconds`; `--curves` writes the evaluations
//! as a `compare_algorithms` curve (`--from-curves` tables them beside RL runs of the same
//! seed), and `--steps 0 --eval-guidance 8` gives the capability line:
//!
//! ```sh
//! cargo run --release --example pretrain_shapes -- --init-from fixtures/shapes_world_v2 \
//!     --seed 300 --batch 64 --lr 2e-4 --warmup 20 --steps 100000 --cpu-budget 648 \
//!     --caption-noise 0.6 --caption-dropout 0.1 --eval-every 300 --eval-samples 48 --eval-seed 0 \
//!     --curves runs/continued_s0.csv --label continued_pretraining \
//!     --out runs/continued   # --caption-noise 0: the answers
//! ```
//!
//! Every evaluation prints the held-out reward at guidance 1 (as the rollouts sample) and,
//! with `--eval-guidance`, guided toward the empty prompt (the capability the generator has
//! but does not use), each with the second judge's score (`reward::shapes::judge_rerendered`)
//! and the median template margin of the drawn objects (how crisp they are:
//! `reward::shapes::Detection::margin`); the run first prints the same of rendered scenes of
//! the held-out prompts, the data's ceiling. Each evaluation's grid goes to `--samples` (or
//! the state's `samples/`).

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, Module};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use clap::Parser;
use keyed_rng::SplitMix64;
use noise_recipe::{NoiseAlgorithm, NoiseRecipe};
use reward::RgbImage;
use reward::shapes::{self, Category, RenderOptions, SceneSpec};
use schedule::{SchedulePolicy, SdeSteps};
use sde_math::solvers::OdeSolver;
use sde_math::{Kernel, StorageDtype};
use serde::{Deserialize, Serialize};
use trainer_fsdp::compare::{CurvePoint, RunCurve, curves_csv};
use trainer_fsdp::config::EvalGuidance;
use trainer_fsdp::ema::blend;
use trainer_fsdp::monitor::process_cpu_seconds;
use trainer_fsdp::rollout::SamplerSpec;
use trainer_fsdp::run::evaluate_policy;
use trainer_fsdp::shapes_world::{
    ShapesGenerator, ShapesWorld, TOKEN_CHANNELS, TOKEN_GRID, TextEncoderConfig, eval_prompts,
    images_to_tensor, pack, pretrain_loss, transformer_config,
};
use trainer_fsdp::{World, sample_grid, upscale, write_png};

type B = Autodiff<Flex>;

/// Flow-matching pretraining of the shapes world's base generator.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Optimizer steps.
    #[arg(long, default_value_t = 3000)]
    steps: usize,
    /// Scenes per step.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Peak learning rate (AdamW), reached after `--warmup` steps.
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// Linear warmup steps.
    #[arg(long, default_value_t = 150)]
    warmup: usize,
    /// After the warmup: `constant` (the committed weights' schedule, so a snapshot at step N
    /// equals a run of N steps) or `cosine` (down to `--min-lr` at the last step).
    #[arg(long, value_enum, default_value_t = LrShape::Constant)]
    lr_schedule: LrShape,
    /// The learning rate the cosine schedule ends at (default 0; only with `--lr-schedule
    /// cosine`, which needs `--steps` past `--warmup`).
    #[arg(long)]
    min_lr: Option<f64>,
    /// Start from a generator written by this example (`--out` of an earlier run) instead of
    /// a random initialisation. The optimizer state starts afresh (the warmup applies again);
    /// pass another `--seed` to draw scenes and noise the earlier run did not see.
    #[arg(long)]
    init_from: Option<PathBuf>,
    /// Share of training captions corrupted (one attribute changed), within [0, 1].
    #[arg(long, default_value_t = 0.25)]
    caption_noise: f64,
    /// Evaluate every this many steps (0: only at the end).
    #[arg(long, default_value_t = 500)]
    eval_every: usize,
    /// Seeds per held-out prompt of each evaluation: 4 is a quick look (± about 0.03); 48 is
    /// the trainer's evaluation (± about 0.008).
    #[arg(long, default_value_t = 4)]
    eval_samples: usize,
    /// The evaluation's seed (default `--seed`). With `--eval-samples 48`, the trainer's
    /// held-out evaluation of a run with `run.seed` = this value, so that a generator written
    /// here is measured on the same pictures as the RL runs' `held-out eval start`.
    #[arg(long)]
    eval_seed: Option<u64>,
    /// Where to write the generator. The default is the committed base every other example
    /// uses: a directory that already holds files is replaced only with `--overwrite`, and
    /// never the `--init-from` directory.
    #[arg(long, default_value = "fixtures/shapes_world")]
    out: PathBuf,
    /// Replace the generator in an `--out` (or a snapshot's `step_<N>/`) that already holds
    /// files.
    #[arg(long)]
    overwrite: bool,
    /// Also save the generator at every evaluation before the last step under this directory
    /// (`step_<N>/`); needs `--eval-every` between 1 and `--steps` - 1.
    #[arg(long)]
    snapshots: Option<PathBuf>,
    /// Seed of the data, the noise and the initialisation.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Share of training captions replaced by the empty prompt, within [0, 1), so that the
    /// generator also learns the unconditional velocity classifier-free guidance needs
    /// (`eval.guidance` with the empty `negative_prompt`).
    #[arg(long, default_value_t = 0.0)]
    caption_dropout: f64,
    /// Keep an exponential moving average of the weights with this decay, within (0, 1): the
    /// evaluations, the snapshots and the generator written are the average. The decay
    /// warms up as `min(decay, (1 + s) / (10 + s))` after step `s`.
    #[arg(long)]
    ema: Option<f64>,
    /// Also evaluate with classifier-free guidance at this scale (> 1) against the empty
    /// prompt, beside the unguided evaluation: the capability the unguided generator has
    /// but does not use. Repeat the flag for several scales.
    #[arg(long)]
    eval_guidance: Vec<f64>,
    /// Keep the whole training state (weights with their optimizer ids, the optimizer, the
    /// average, the step, the data stream) under this directory every `--state-every`
    /// steps, so that `--resume` continues the run bit for bit where it stopped. The
    /// newest `step_<N>/` is kept, its `generator/` a generator the trainer loads.
    #[arg(long)]
    state: Option<PathBuf>,
    /// Steps between two saves of `--state`.
    #[arg(long, default_value_t = 200)]
    state_every: usize,
    /// Continue from the newest state under `--state` (refused if it was written with other
    /// training flags); without one, start afresh there.
    #[arg(long)]
    resume: bool,
    /// Also train on the held-out prompts' scenes, captioned as every other scene (true, or
    /// corrupted with `--caption-noise`, or dropped): the generator has seen every prompt of
    /// the grammar, as a web-scale base has seen captions like its benchmark's, and RL alone
    /// is kept off the held-out prompts. Without it no held-out prompt is seen in training,
    /// on any scene (the single-object category is then almost all held out).
    #[arg(long)]
    held_out_in_data: bool,
    /// Stop once the training steps have spent this many CPU seconds (user + system, every
    /// thread; evaluations excluded), as the trainer's `run.cpu_budget_seconds` charges an RL
    /// run: the supervised baselines at equal CPU (continued pretraining on the same corpus,
    /// training on true captions). `--steps` is then the most steps; needs `--lr-schedule
    /// constant` (a decay needs its length) and no `--state`.
    #[arg(long)]
    cpu_budget: Option<f64>,
    /// Write every evaluation of this run as a curve of `compare_algorithms` (its
    /// `curves.csv` format: `--from-curves` puts it in one table with RL runs): the reward at
    /// guidance 1 as method `--label`, run `--eval-seed`, at the training CPU seconds spent
    /// (evaluations excluded; the starting evaluation at 0); with `--eval-guidance S` also
    /// `<label>_cfg<S>`, whose first point is the unguided start, so that its gain is what
    /// guidance adds to the start and training after (`--steps 0` writes only these: the
    /// capability line). With `--eval-samples 48` the points are
    /// the trainer's held-out evaluations of `run.seed` = `--eval-seed`, so that the table
    /// pairs them with RL runs of that seed. Refused with `--state` (a curve is one
    /// uninterrupted run), and over an existing file without `--overwrite`.
    #[arg(long, requires = "label")]
    curves: Option<PathBuf>,
    /// The method name of `--curves` (lowercase letters, digits and `_`).
    #[arg(long, requires = "curves")]
    label: Option<String>,
    /// With `--init-from`: append this many transformer blocks whose AdaLN modulations start
    /// at zero (so every gate is closed and the grown model computes exactly what the loaded
    /// one did), to train a deeper generator from a shallower one.
    #[arg(long, default_value_t = 0)]
    grow_layers: usize,
    /// Without `--init-from`: the transformer's attention heads (of 32 dimensions each; the
    /// width is 32 x heads; default the shapes world's 4).
    #[arg(long)]
    heads: Option<usize>,
    /// Without `--init-from`: the transformer's blocks (default the shapes world's 4).
    #[arg(long)]
    layers: Option<usize>,
    /// Stop after this step with the state saved (needs `--state`), to go on later with
    /// `--resume`: a long pretraining split across sessions. The schedule is still the one of
    /// `--steps`.
    #[arg(long)]
    stop_at: Option<usize>,
    /// Sampling steps of the evaluations (12: the trainer's, as the rollouts sample).
    #[arg(long, default_value_t = 12)]
    eval_steps: usize,
    /// Evaluate on the prompts of this file (the unified JSONL schema, prompts of the shapes
    /// grammar) instead of the held-out ones: to see what the generator does with prompts it
    /// was trained on. The data's ceiling stays the held-out prompts'.
    #[arg(long)]
    eval_prompts: Option<PathBuf>,
    /// The training scenes' smallest object side, as a share of the image (default the
    /// shapes world's 0.22): larger objects are easier to draw apart (a circle from a
    /// square). The data's ceiling is measured on scenes drawn the same way.
    #[arg(long)]
    min_object: Option<f64>,
    /// The training scenes' largest object side, as a share of the image (default 0.34, at
    /// most 0.45); scenes too crowded for their objects shrink them, as the renderer does.
    #[arg(long)]
    max_object: Option<f64>,
    /// Write a sample grid of each evaluation here (the first seed of every held-out prompt,
    /// captioned); default `--state`'s `samples/` when there is one.
    #[arg(long)]
    samples: Option<PathBuf>,
}

/// The flags that change what is trained: a state is resumed only under the same ones.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct TrainingFlags {
    steps: usize,
    batch: usize,
    lr: f64,
    warmup: usize,
    lr_schedule: String,
    min_lr: Option<f64>,
    init_from: Option<PathBuf>,
    caption_noise: f64,
    caption_dropout: f64,
    ema: Option<f64>,
    seed: u64,
    #[serde(default)]
    held_out_in_data: bool,
    #[serde(default)]
    grow_layers: usize,
    #[serde(default)]
    heads: Option<usize>,
    #[serde(default)]
    layers: Option<usize>,
    #[serde(default)]
    min_object: Option<f64>,
    #[serde(default)]
    max_object: Option<f64>,
}

impl TrainingFlags {
    fn of(args: &Args) -> Self {
        Self {
            steps: args.steps,
            batch: args.batch,
            lr: args.lr,
            warmup: args.warmup,
            lr_schedule: format!("{:?}", args.lr_schedule).to_lowercase(),
            min_lr: args.min_lr,
            init_from: args.init_from.clone(),
            caption_noise: args.caption_noise,
            caption_dropout: args.caption_dropout,
            ema: args.ema,
            seed: args.seed,
            held_out_in_data: args.held_out_in_data,
            grow_layers: args.grow_layers,
            heads: args.heads,
            layers: args.layers,
            min_object: args.min_object,
            max_object: args.max_object,
        }
    }
}

/// How the training scenes (and the data's ceiling) are drawn: the shapes world's defaults,
/// with `--min-object` / `--max-object` where given.
fn render_options(args: &Args) -> RenderOptions {
    let default = RenderOptions::default();
    RenderOptions {
        min_object: args.min_object.unwrap_or(default.min_object),
        max_object: args.max_object.unwrap_or(default.max_object),
        ..default
    }
}

/// `state.json` of a saved training state.
#[derive(Debug, Serialize, Deserialize)]
struct StateMeta {
    /// Optimizer steps taken.
    step: usize,
    /// The data stream's state (the next scene's draw).
    rng: u64,
    /// The running loss.
    running: f64,
    /// CPU seconds of training (evaluations included) up to this state, over every process.
    cpu_seconds: f64,
    flags: TrainingFlags,
}

/// The files of one saved state.
const STATE_META: &str = "state.json";
const STATE_MODEL: &str = "model.mpk";
const STATE_AVERAGE: &str = "average.mpk";
const STATE_OPTIMIZER: &str = "optimizer.mpk";
const STATE_GENERATOR: &str = "generator";

/// The learning rate's shape after the warmup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LrShape {
    /// The peak rate to the end.
    Constant,
    /// Half a cosine from the peak rate to `--min-lr` at the last step.
    Cosine,
}

/// The learning rate of 0-based `step`.
fn learning_rate(args: &Args, step: usize) -> f64 {
    let warm = (step + 1) as f64 / args.warmup.max(1) as f64;
    if warm < 1.0 {
        return args.lr * warm;
    }
    match args.lr_schedule {
        LrShape::Constant => args.lr,
        LrShape::Cosine => {
            let span = args.steps.saturating_sub(args.warmup).max(1) as f64;
            let t = ((step + 1).saturating_sub(args.warmup) as f64 / span).min(1.0);
            let min_lr = args.min_lr.unwrap_or(0.0);
            min_lr + 0.5 * (args.lr - min_lr) * (1.0 + (std::f64::consts::PI * t).cos())
        }
    }
}

/// Refuses flags that would fail later, or be accepted and then have no effect.
fn check_args(args: &Args) -> Result<()> {
    anyhow::ensure!(
        args.lr.is_finite() && args.lr > 0.0,
        "--lr {}: expected a finite learning rate > 0",
        args.lr
    );
    if let Some(min_lr) = args.min_lr {
        anyhow::ensure!(
            args.lr_schedule == LrShape::Cosine,
            "--min-lr {min_lr} has no effect with --lr-schedule constant (the rate stays at \
             --lr after the warmup); expected --lr-schedule cosine, or no --min-lr"
        );
        anyhow::ensure!(
            min_lr.is_finite() && min_lr >= 0.0 && min_lr <= args.lr,
            "--min-lr {min_lr}: expected a finite learning rate within [0, --lr {}]",
            args.lr
        );
    }
    anyhow::ensure!(
        args.lr_schedule == LrShape::Constant || args.steps > args.warmup,
        "--lr-schedule cosine decays after the warmup, but --warmup {} leaves none of the \
         --steps {}; expected --steps greater than --warmup",
        args.warmup,
        args.steps
    );
    if let Some(budget) = args.cpu_budget {
        anyhow::ensure!(
            budget.is_finite() && budget > 0.0,
            "--cpu-budget {budget}: expected a finite number of CPU seconds above 0"
        );
        anyhow::ensure!(
            args.lr_schedule == LrShape::Constant && args.state.is_none(),
            "--cpu-budget {budget} ends the run at a time no schedule knows in advance; expected \
             --lr-schedule constant and no --state"
        );
    }
    anyhow::ensure!(
        args.grow_layers == 0 || args.init_from.is_some(),
        "--grow-layers {} grows a loaded generator; expected --init-from (a generator trained \
         from scratch takes its depth from its configuration)",
        args.grow_layers
    );
    for (flag, value) in [("--heads", args.heads), ("--layers", args.layers)] {
        if let Some(n) = value {
            anyhow::ensure!(
                args.init_from.is_none(),
                "{flag} {n} shapes a generator trained from scratch; a loaded one (--init-from) \
                 keeps its own (--grow-layers adds blocks to it)"
            );
            anyhow::ensure!(n > 0, "{flag} 0: expected at least 1");
        }
    }
    render_options(args)
        .check()
        .context("--min-object / --max-object: the training scenes' object sides")?;
    anyhow::ensure!(
        args.batch > 0,
        "--batch 0 would train on nothing; expected at least 1 scene per step"
    );
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.caption_noise),
        "--caption-noise {}: expected a share of the captions within [0, 1]",
        args.caption_noise
    );
    anyhow::ensure!(
        (0.0..1.0).contains(&args.caption_dropout),
        "--caption-dropout {}: expected a share of the captions within [0, 1)",
        args.caption_dropout
    );
    if let Some(decay) = args.ema {
        anyhow::ensure!(
            decay > 0.0 && decay < 1.0,
            "--ema {decay}: expected a decay within (0, 1), such as 0.999"
        );
    }
    for &scale in &args.eval_guidance {
        anyhow::ensure!(
            scale.is_finite() && scale > 1.0,
            "--eval-guidance {scale}: expected a finite scale above 1 (at 1 guidance changes \
             nothing)"
        );
        anyhow::ensure!(
            args.caption_dropout > 0.0 || args.init_from.is_some(),
            "--eval-guidance {scale} guides toward the empty prompt, which a generator trained \
             from scratch without --caption-dropout never saw; expected --caption-dropout above 0"
        );
    }
    anyhow::ensure!(
        args.eval_steps > 0,
        "--eval-steps 0 would sample nothing; expected at least 1 step"
    );
    anyhow::ensure!(
        args.state_every > 0,
        "--state-every 0 would never save the state; expected at least 1 step"
    );
    if let Some(stop) = args.stop_at {
        anyhow::ensure!(
            args.state.is_some() && stop > 0 && stop < args.steps,
            "--stop-at {stop} stops with the state saved to go on later: expected --state and \
             a step within [1, --steps {})",
            args.steps
        );
    }
    if let (Some(file), Some(label)) = (&args.curves, &args.label) {
        anyhow::ensure!(
            args.state.is_none(),
            "--curves {} records one uninterrupted run; expected no --state",
            file.display()
        );
        anyhow::ensure!(
            !label.is_empty()
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
            "--label {label:?}: expected lowercase letters, digits and `_` (a method name of \
             the comparison's table)"
        );
        anyhow::ensure!(
            args.overwrite || !file.exists(),
            "--curves {} exists; pass --overwrite to replace it",
            file.display()
        );
    }
    anyhow::ensure!(
        !args.resume || args.state.is_some(),
        "--resume continues from the state under --state, and no --state was given"
    );
    anyhow::ensure!(
        args.eval_samples > 0,
        "--eval-samples 0 would measure nothing; expected at least 1 seed per held-out prompt"
    );
    if let Some(dir) = &args.snapshots {
        anyhow::ensure!(
            args.eval_every > 0 && args.eval_every < args.steps,
            "--snapshots {} saves at the evaluations before the last step, and --eval-every {} \
             with --steps {} has none; expected --eval-every between 1 and {}",
            dir.display(),
            args.eval_every,
            args.steps,
            args.steps.saturating_sub(1)
        );
    }
    Ok(())
}

/// Refuses, before any training, a directory the run would write that holds files already
/// (without `--overwrite`), is not a directory, is the `--init-from` directory, or is written
/// twice (`--out` one of the snapshots).
fn check_destinations(args: &Args) -> Result<()> {
    // (what names it, the flag that chooses it, the directory)
    let mut dests: Vec<(String, &str, PathBuf)> = Vec::new();
    if let (Some(dir), true) = (&args.snapshots, args.eval_every > 0) {
        for n in (args.eval_every..args.steps).step_by(args.eval_every) {
            let what = format!("--snapshots {}'s step_{n}/", dir.display());
            dests.push((what, "--snapshots", dir.join(format!("step_{n}"))));
        }
    }
    let out_what = format!("--out {}", args.out.display());
    dests.push((out_what.clone(), "--out", args.out.clone()));
    let init = match &args.init_from {
        Some(dir) => Some((dir, resolve(dir)?)),
        None => None,
    };
    let out = resolve(&args.out)?;
    for (what, flag, path) in &dests {
        let resolved = resolve(path)?;
        if let Some((init_dir, init_resolved)) = &init {
            anyhow::ensure!(
                &resolved != init_resolved,
                "{what} is the directory --init-from {} loads the generator from, which this run \
                 would replace (refused even with --overwrite); expected another {flag}",
                init_dir.display()
            );
        }
        if *flag != "--out" {
            anyhow::ensure!(
                resolved != out,
                "{out_what} is {what}, whose snapshot the generator at the end would replace; \
                 expected --out outside the snapshots' step_<N>/ directories"
            );
        }
        match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("{what}: reading {}", path.display())),
            Ok(meta) => {
                anyhow::ensure!(
                    meta.is_dir(),
                    "{what} exists and is not a directory; expected a directory to write the \
                     generator into"
                );
                let occupied = std::fs::read_dir(path)
                    .with_context(|| format!("{what}: listing {}", path.display()))?
                    .next()
                    .is_some();
                anyhow::ensure!(
                    !occupied || args.overwrite,
                    "{what} already holds files, which this run would replace; pass --overwrite \
                     to replace them, or another {flag}"
                );
            }
        }
    }
    Ok(())
}

/// `path` as [`durable::resolved`] gives it: two spellings of one directory compare equal
/// whether or not it exists.
fn resolve(path: &Path) -> Result<PathBuf> {
    durable::resolved(path).with_context(|| format!("making {} absolute", path.display()))
}

/// A training caption: the scene's prompt, or with probability `p` a corrupted one (a
/// scene of the same category drawn at random). A corrupted caption is never one of
/// `excluded` (the held-out prompts, unless they are in the data): a prompt seen only on
/// wrong scenes would be taught to draw them, and no guidance could recover it (the
/// committed base of 2026-12-01 was trained so).
fn caption(
    spec: &SceneSpec,
    category: Category,
    rng: &mut SplitMix64,
    p: f64,
    excluded: &[String],
) -> String {
    if rng.unit_f64() < p {
        loop {
            let prompt = SceneSpec::sample(category, rng.next_u64()).prompt();
            if !excluded.contains(&prompt) {
                return prompt;
            }
        }
    } else {
        spec.prompt()
    }
}

type Model = ShapesGenerator<B>;
type Adam = burn::optim::adaptor::OptimizerAdaptor<burn::optim::AdamW, Model, B>;
type Bytes = NamedMpkBytesRecorder<FullPrecisionSettings>;

/// The newest saved state under `dir` (`step_<N>/` with the largest `N`), if any.
fn newest_state(dir: &Path) -> Result<Option<(usize, PathBuf)>> {
    let entries = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        other => other.with_context(|| format!("--state {}: listing it", dir.display()))?,
    };
    let mut best: Option<(usize, PathBuf)> = None;
    for e in entries {
        let e = e.with_context(|| format!("--state {}: listing it", dir.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(n) = name
            .strip_prefix("step_")
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        if e.path().join(STATE_META).is_file() && best.as_ref().is_none_or(|(b, _)| n > *b) {
            best = Some((n, e.path()));
        }
    }
    Ok(best)
}

/// Saves the training state as `dir/step_<meta.step>/` (written under a temporary name, then
/// renamed, so a state directory is whole or absent), then removes the older ones.
fn save_state(
    dir: &Path,
    model: &Model,
    optim: &Adam,
    average: &Model,
    meta: &StateMeta,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let dest = dir.join(format!("step_{}", meta.step));
    let tmp = dir.join(format!("step_{}.tmp", meta.step));
    if tmp.exists() {
        durable::remove_dir_all(&tmp)?;
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let model_bytes = Bytes::default()
        .record(model.clone().into_record(), ())
        .context("encoding the weights")?;
    durable::write_atomic(&tmp.join(STATE_MODEL), &model_bytes)?;
    let average_bytes = Bytes::default()
        .record(average.clone().into_record(), ())
        .context("encoding the average")?;
    durable::write_atomic(&tmp.join(STATE_AVERAGE), &average_bytes)?;
    let optim_bytes = Bytes::default()
        .record(optim.to_record(), ())
        .context("encoding the optimizer")?;
    durable::write_atomic(&tmp.join(STATE_OPTIMIZER), &optim_bytes)?;
    average.valid().save(&tmp.join(STATE_GENERATOR))?;
    durable::write_atomic(&tmp.join(STATE_META), &serde_json::to_vec_pretty(meta)?)?;
    durable::sync_dir(&tmp)?;
    if dest.exists() {
        durable::remove_dir_all(&dest)?;
    }
    std::fs::rename(&tmp, &dest)
        .with_context(|| format!("renaming {} to {}", tmp.display(), dest.display()))?;
    durable::sync_dir(dir)?;
    for e in std::fs::read_dir(dir)? {
        let path = e?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let older = name
            .as_deref()
            .and_then(|n| n.strip_prefix("step_"))
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|n| n < meta.step);
        if older {
            durable::remove_dir_all(&path)?;
        }
    }
    Ok(())
}

/// A saved state: the model and the average (the model itself without `--ema`) with their
/// parameter ids, the optimizer and the metadata.
fn load_state(
    path: &Path,
    args: &Args,
    dev: &burn::tensor::Device<B>,
) -> Result<(Model, Adam, Model, StateMeta)> {
    let meta_path = path.join(STATE_META);
    let meta: StateMeta = serde_json::from_slice(
        &std::fs::read(&meta_path).with_context(|| format!("reading {}", meta_path.display()))?,
    )
    .with_context(|| format!("parsing {}", meta_path.display()))?;
    let flags = TrainingFlags::of(args);
    if meta.flags != flags {
        let (saved, asked) = (
            serde_json::to_value(&meta.flags)?,
            serde_json::to_value(&flags)?,
        );
        let differ: Vec<String> = asked
            .as_object()
            .expect("flags are an object")
            .iter()
            .filter(|(k, v)| saved.get(k.as_str()) != Some(v))
            .map(|(k, v)| {
                let was = saved
                    .get(k.as_str())
                    .map_or("absent".into(), |w| w.to_string());
                format!("--{} {v} (the state's: {was})", k.replace('_', "-"))
            })
            .collect();
        anyhow::bail!(
            "--resume: the state {} was trained with other flags: {}; expected the same \
             training flags (or another --state)",
            path.display(),
            differ.join(", ")
        );
    }
    // the generator directory gives the shapes; the records the values and parameter ids
    let generator_dir = path.join(STATE_GENERATOR);
    let skeleton = Model::load(&generator_dir, dev)
        .with_context(|| format!("loading {}", generator_dir.display()))?;
    let model = skeleton
        .clone()
        .load_record(read_record(&path.join(STATE_MODEL), dev)?);
    let average = skeleton.load_record(read_record(&path.join(STATE_AVERAGE), dev)?);
    let optim = new_optimizer().load_record(read_record(&path.join(STATE_OPTIMIZER), dev)?);
    Ok((model, optim, average, meta))
}

/// A record of a saved state's file.
fn read_record<R: burn::record::Record<B>>(
    path: &Path,
    dev: &burn::tensor::Device<B>,
) -> Result<R> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Bytes::default()
        .load(bytes, dev)
        .with_context(|| format!("decoding {}", path.display()))
}

fn new_optimizer() -> Adam {
    AdamWConfig::new()
        .with_weight_decay(0.01)
        .init::<B, ShapesGenerator<B>>()
}

fn main() -> Result<()> {
    let args = Args::parse();
    check_args(&args)?;
    check_destinations(&args)?;
    let drawn = render_options(&args);
    if let (Some(dir), false) = (&args.state, args.resume) {
        anyhow::ensure!(
            newest_state(dir)?.is_none() || args.overwrite,
            "--state {} already holds a training state; pass --resume to continue it, \
             --overwrite to start afresh there, or another --state",
            dir.display()
        );
    }
    let dev = Default::default();
    B::seed(&dev, args.seed);
    let held_out: Vec<String> = eval_prompts();
    // the evaluation's 12-step sampling schedule, as the trainer's
    let eval_sigmas = SchedulePolicy::qwen_image()
        .sample_sigmas(32, 32, args.eval_steps)?
        .sigmas
        .into_vec();
    let resumed = match (&args.state, args.resume) {
        (Some(dir), true) => newest_state(dir)?,
        _ => None,
    };
    // the model, its optimizer, the average, the first step, the data stream, the running
    // loss, CPU seconds before this process
    let (mut model, mut optim, mut average, first, mut rng, mut running, cpu_before) =
        match &resumed {
            Some((_, path)) => {
                let (model, optim, generator, meta) = load_state(path, &args, &dev)?;
                println!(
                    "resuming {} at step {} ({:.0} CPU s so far)",
                    path.display(),
                    meta.step,
                    meta.cpu_seconds
                );
                (
                    model,
                    optim,
                    generator,
                    meta.step,
                    SplitMix64::new(meta.rng),
                    meta.running,
                    meta.cpu_seconds,
                )
            }
            None => {
                let model = match &args.init_from {
                    Some(dir) => ShapesGenerator::<B>::load(dir, &dev).with_context(|| {
                        format!("loading the generator to continue from {}", dir.display())
                    })?,
                    None => {
                        let mut dit = transformer_config();
                        if let Some(heads) = args.heads {
                            dit = dit.with_num_attention_heads(heads);
                        }
                        if let Some(layers) = args.layers {
                            dit = dit.with_num_layers(layers);
                        }
                        ShapesGenerator::<B>::init_with(&TextEncoderConfig::new(), &dit, &dev)
                    }
                };
                let model = if args.grow_layers > 0 {
                    let before = model.dit.config.num_layers;
                    let grown = model.grow(args.grow_layers, &dev)?;
                    println!(
                        "grown from {before} to {} transformer blocks (the new ones' gates closed)",
                        grown.dit.config.num_layers
                    );
                    grown
                } else {
                    model
                };
                // the average shares the model's parameter ids, by which `blend` pairs them
                let average = model.clone();
                // SplitMix64: the data order's generator (deterministic, platform-independent)
                let rng = SplitMix64::new(args.seed ^ 0x5EED);
                (model, new_optimizer(), average, 0, rng, 0.0, 0.0)
            }
        };
    let cpu_start = process_cpu_seconds();
    let noise = NoiseRecipe::new(
        args.seed,
        vec![TOKEN_GRID * TOKEN_GRID, TOKEN_CHANNELS],
        vec![0],
        NoiseAlgorithm::Pcg64BoxMuller,
    )?;
    let start = Instant::now();
    println!(
        "pretraining the shapes world generator{}: {} steps x {} scenes, lr {} ({:?} after {} warmup steps), caption noise {}, caption dropout {}, EMA {}",
        args.init_from
            .as_ref()
            .map_or(String::new(), |d| format!(" from {}", d.display())),
        args.steps,
        args.batch,
        args.lr,
        args.lr_schedule,
        args.warmup,
        args.caption_noise,
        args.caption_dropout,
        args.ema.map_or("off".to_string(), |d| d.to_string()),
    );
    ceiling(&held_out, &args)?;
    let mut curve = Curve::default();
    // the starting point, when there is one to train on (`--steps 0` only measures it)
    if args.init_from.is_some() && args.steps > 0 && resumed.is_none() {
        curve.push(
            0.0,
            evaluate(&average.valid(), &eval_sigmas, &args, "start")?,
        );
    }
    // the training steps' CPU seconds (for --cpu-budget, --curves and the progress): the
    // process's since `cpu_start`, less the evaluations' (the ceiling's and the start's so far)
    let mut eval_cpu = process_cpu_seconds() - cpu_start;
    let train_cpu = |eval_cpu: f64| process_cpu_seconds() - cpu_start - eval_cpu;
    for step in first..args.steps {
        if let Some(budget) = args.cpu_budget
            && train_cpu(eval_cpu) >= budget
        {
            println!(
                "--cpu-budget {budget}: spent after {step} steps ({:.0} training CPU s)",
                train_cpu(eval_cpu)
            );
            break;
        }
        let mut images = Vec::with_capacity(args.batch);
        let mut prompts = Vec::with_capacity(args.batch);
        while images.len() < args.batch {
            let category = Category::ALL[rng.below_modulo(Category::ALL.len() as u64) as usize];
            let spec = SceneSpec::sample(category, rng.next_u64());
            if !args.held_out_in_data && held_out.contains(&spec.prompt()) {
                continue;
            }
            images.push(shapes::render(&spec, rng.next_u64(), &drawn)?.image);
            let excluded: &[String] = if args.held_out_in_data {
                &[]
            } else {
                &held_out
            };
            let text = caption(&spec, category, &mut rng, args.caption_noise, excluded);
            // the draw only with dropout on, so that runs without it keep their data stream
            let dropped = args.caption_dropout > 0.0 && rng.unit_f64() < args.caption_dropout;
            prompts.push(if dropped { String::new() } else { text });
        }
        let x0 = pack(images_to_tensor::<B>(&images, &dev));
        let eps_values: Vec<f32> = (0..args.batch)
            .flat_map(|i| noise.group_noise((step * args.batch + i) as u64))
            .collect();
        let eps = Tensor::<B, 3>::from_data(
            TensorData::new(
                eps_values,
                [args.batch, TOKEN_GRID * TOKEN_GRID, TOKEN_CHANNELS],
            ),
            &dev,
        );
        // sigma: logit-normal(0, 1) (SD3), with a fifth drawn uniformly so both ends are seen
        let sig: Vec<f32> = (0..args.batch)
            .map(|_| {
                if rng.unit_f64() < 0.2 {
                    rng.unit_f64() as f32
                } else {
                    let (u1, u2) = (rng.unit_f64().max(1e-12), rng.unit_f64());
                    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                    (1.0 / (1.0 + (-z).exp())) as f32
                }
            })
            .collect();
        let sigma = Tensor::<B, 1>::from_data(TensorData::new(sig, [args.batch]), &dev);
        let cond = model.conditioning(&prompts, &dev)?;
        let loss = pretrain_loss(&model, &cond, x0, eps, sigma);
        let value: f64 = loss.clone().into_scalar().into();
        running = if step == 0 {
            value
        } else {
            0.98 * running + 0.02 * value
        };
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let lr = learning_rate(&args, step);
        model = optim.step(lr, model, grads);
        average = match args.ema {
            Some(decay) => {
                let s = (step + 1) as f64;
                blend::<B, _>(average, &model, decay.min((1.0 + s) / (10.0 + s)))
            }
            None => model.clone(),
        };
        let cpu = cpu_before + train_cpu(eval_cpu);
        if (step + 1) % 50 == 0 {
            println!(
                "step {:>5}/{}  loss {running:.4}  lr {lr:.2e}  {:.0} s  {cpu:.0} CPU s",
                step + 1,
                args.steps,
                start.elapsed().as_secs_f64()
            );
        }
        if args.eval_every > 0 && (step + 1) % args.eval_every == 0 && step + 1 < args.steps {
            let snapshot = average.valid();
            let at = train_cpu(eval_cpu);
            let before = process_cpu_seconds();
            let measured = evaluate(
                &snapshot,
                &eval_sigmas,
                &args,
                &format!("step_{:05}", step + 1),
            )?;
            eval_cpu += process_cpu_seconds() - before;
            curve.push(at, measured);
            if let (Some(file), Some(label)) = (&args.curves, &args.label) {
                curve.write(file, label, &args)?;
            }
            if let Some(dir) = &args.snapshots {
                snapshot.save(&dir.join(format!("step_{}", step + 1)))?;
            }
        }
        let stop_here = args.stop_at == Some(step + 1);
        if let Some(dir) = &args.state
            && ((step + 1) % args.state_every == 0 || step + 1 == args.steps || stop_here)
        {
            let meta = StateMeta {
                step: step + 1,
                rng: rng.state(),
                running,
                cpu_seconds: cpu_before + train_cpu(eval_cpu),
                flags: TrainingFlags::of(&args),
            };
            save_state(dir, &model, &optim, &average, &meta)?;
        }
        if stop_here {
            println!(
                "stopped at step {} of {} with the state saved under {}; the same command \
                 with --resume (and without --stop-at, or a later one) goes on",
                step + 1,
                args.steps,
                args.state.as_ref().expect("checked").display()
            );
            return Ok(());
        }
    }
    let base = average.valid();
    let at = if args.steps > 0 {
        train_cpu(eval_cpu)
    } else {
        0.0
    };
    let trained = cpu_before + train_cpu(eval_cpu);
    let measured = evaluate(&base, &eval_sigmas, &args, "final")?;
    let reward = measured.0.mean;
    curve.push(at, measured);
    if let (Some(file), Some(label)) = (&args.curves, &args.label) {
        curve.write(file, label, &args)?;
        println!("wrote the curves of {label} to {}", file.display());
    }
    base.save(&args.out)
        .with_context(|| format!("saving to {}", args.out.display()))?;
    println!(
        "wrote {} after {:.1} min ({:.0} training CPU s in all); held-out reward of the base \
         (deterministic sampling, {} steps): {reward:.3}",
        args.out.display(),
        start.elapsed().as_secs_f64() / 60.0,
        trained,
        args.eval_steps
    );
    Ok(())
}

/// The median of `values` (NaN for none).
fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        0.5 * (values[n / 2 - 1] + values[n / 2])
    }
}

/// How crisp drawings are: the median lead of every detected object's best template fit over
/// its second best ([`reward::shapes::Detection::margin`]), and the number of objects.
fn crispness(images: &[RgbImage]) -> (f64, usize) {
    let margins: Vec<f64> = images
        .iter()
        .flat_map(|im| shapes::detect(im).into_iter().map(|d| d.margin()))
        .collect();
    let n = margins.len();
    (median(margins), n)
}

/// The second judge's ([`shapes::judge_rerendered`]) mean over held-out samples, prompt-major
/// with `k` seeds a prompt.
fn second_judge(samples: &[RgbImage], prompts: &[String], k: usize) -> Result<f64> {
    let mut total = 0.0;
    for (i, image) in samples.iter().enumerate() {
        total += shapes::judge_rerendered(&SceneSpec::parse(&prompts[i / k])?, image).score;
    }
    Ok(total / samples.len() as f64)
}

/// The judge on rendered scenes of the held-out prompts (`--eval-samples` renders each):
/// the data's ceiling, and the template margin of clean drawings.
fn ceiling(held_out: &[String], args: &Args) -> Result<()> {
    let (mut scores, mut second, mut images) = (Vec::new(), Vec::new(), Vec::new());
    let drawn = render_options(args);
    for (i, p) in held_out.iter().enumerate() {
        let spec = SceneSpec::parse(p)?;
        for k in 0..args.eval_samples {
            let seed = keyed_rng::absorb(0xCE11_0000, &[i as u64, k as u64]);
            let image = shapes::render(&spec, seed, &drawn)?.image;
            scores.push(shapes::judge(&spec, &image).score);
            second.push(shapes::judge_rerendered(&spec, &image).score);
            images.push(image);
        }
    }
    let mean = scores.iter().sum::<f64>() / scores.len() as f64;
    let second = second.iter().sum::<f64>() / second.len() as f64;
    let (margin, n) = crispness(&images);
    println!(
        "  rendered held-out scenes (the data's ceiling): reward {mean:.3}, second judge \
         {second:.3}, median template margin {margin:.3} over {n} objects"
    );
    Ok(())
}

/// One evaluation's numbers: the held-out reward, its standard error, the second judge's.
#[derive(Debug, Clone, Copy)]
struct Measured {
    mean: f64,
    stderr: f64,
    second: f64,
}

/// Deterministic 12-step sampling of the held-out prompts (`--eval-samples` seeds each), the
/// same evaluation the trainer runs, and its numbers; with `--eval-guidance`, the same guided
/// as well (one per scale, in order). Prints each with its crispness and writes its grid
/// (`tag` names it).
fn evaluate(
    model: &ShapesGenerator<Flex>,
    sigmas: &[f32],
    args: &Args,
    tag: &str,
) -> Result<(Measured, Vec<Measured>)> {
    let unguided = evaluate_with(model, sigmas, args, None, tag)?;
    let mut guided = Vec::with_capacity(args.eval_guidance.len());
    for &scale in &args.eval_guidance {
        let guidance = EvalGuidance {
            scale,
            negative_prompt: String::new(),
        };
        guided.push(evaluate_with(model, sigmas, args, Some(&guidance), tag)?);
    }
    Ok((unguided, guided))
}

/// The evaluations of a run at the training CPU seconds they were made, for `--curves`.
#[derive(Default)]
struct Curve {
    points: Vec<(f64, (Measured, Vec<Measured>))>,
}

impl Curve {
    fn push(&mut self, cpu: f64, measured: (Measured, Vec<Measured>)) {
        self.points.push((cpu, measured));
    }

    /// Writes the curves (see `--curves`) atomically, replacing the file.
    fn write(&self, file: &Path, label: &str, args: &Args) -> Result<()> {
        let point = |cpu: f64, m: &Measured| CurvePoint {
            cpu_seconds: cpu,
            reward: m.mean,
            stderr: m.stderr,
            second: m.second,
        };
        let seed = args.eval_seed.unwrap_or(args.seed);
        let mut curves = Vec::new();
        // a run that trains nothing and is guided is only its guided levels: its unguided
        // curve would be the one point each guided curve starts from
        if args.steps > 0 || args.eval_guidance.is_empty() {
            curves.push(RunCurve {
                method: label.to_string(),
                seed,
                points: self.points.iter().map(|(c, (u, _))| point(*c, u)).collect(),
            });
        }
        for (i, scale) in args.eval_guidance.iter().enumerate() {
            let start = self.points.first().map(|(c, (u, _))| point(*c, u));
            curves.push(RunCurve {
                method: format!("{label}_cfg{scale}"),
                seed,
                points: start
                    .into_iter()
                    .chain(self.points.iter().map(|(c, (_, g))| point(*c, &g[i])))
                    .collect(),
            });
        }
        durable::write_atomic(file, curves_csv(&curves).as_bytes())
            .with_context(|| format!("writing --curves {}", file.display()))?;
        Ok(())
    }
}

fn evaluate_with(
    model: &ShapesGenerator<Flex>,
    sigmas: &[f32],
    args: &Args,
    guidance: Option<&EvalGuidance>,
    tag: &str,
) -> Result<Measured> {
    let spec = SamplerSpec {
        sigmas: sigmas.to_vec(),
        kernel: Some(Kernel::flow_sde(0.7)?),
        solver: OdeSolver::Euler,
        storage: StorageDtype::F32,
    };
    let data = trainer_fsdp::DataSection {
        train: None,
        eval: args.eval_prompts.clone(),
    };
    let world =
        ShapesWorld::<Flex>::new(Path::new("."), model.text.clone())?.with_prompt_files(&data)?;
    let prompts: Vec<String> = World::<B>::held_out(&world)
        .iter()
        .map(|h| h.prompt.clone())
        .collect();
    let (samples, stats) = evaluate_policy::<B, _>(
        &world,
        &model.dit,
        &spec,
        &SdeSteps::new([]),
        args.eval_samples,
        args.eval_seed.unwrap_or(args.seed),
        &BTreeMap::from([("shapes".to_string(), 1.0)]),
        guidance,
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        &Default::default(),
    )?;
    let cats: Vec<String> = stats
        .by_category
        .iter()
        .map(|(k, v)| format!("{k} {v:.2}"))
        .collect();
    let (margin, n) = crispness(&samples);
    let second = second_judge(&samples, &prompts, args.eval_samples)?;
    let how = guidance.map_or("guidance 1".to_string(), |g| {
        format!("guidance {}", g.scale)
    });
    println!(
        "  held-out reward at {how}: {:.3} ± {:.3}  ({}); second judge {second:.3}; median \
         template margin {margin:.3} over {n} objects",
        stats.mean,
        stats.stderr,
        cats.join(", ")
    );
    let dir = args
        .samples
        .clone()
        .or_else(|| args.state.as_ref().map(|s| s.join("samples")));
    if let Some(dir) = dir {
        let k = args.eval_samples;
        let tiles: Vec<image::RgbImage> = samples
            .iter()
            .step_by(k)
            .map(|i| {
                let tile = image::RgbImage::from_raw(
                    i.width() as u32,
                    i.height() as u32,
                    i.as_bytes().to_vec(),
                )
                .expect("an RGB image's bytes");
                upscale(&tile, 4)
            })
            .collect();
        let grid = sample_grid(&tiles, Some(&prompts[..tiles.len()]), 8)?;
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let suffix = guidance.map_or("g1".to_string(), |g| format!("cfg{}", g.scale));
        write_png(&dir.join(format!("eval_{tag}_{suffix}.png")), &grid)?;
    }
    Ok(Measured {
        mean: stats.mean,
        stderr: stats.stderr,
        second,
    })
}
