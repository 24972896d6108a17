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

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use clap::Parser;
use keyed_rng::SplitMix64;
use noise_recipe::{NoiseAlgorithm, NoiseRecipe};
use reward::shapes::{self, Category, RenderOptions, SceneSpec};
use schedule::{SchedulePolicy, SdeSteps};
use sde_math::solvers::OdeSolver;
use sde_math::{Kernel, StorageDtype};
use trainer_fsdp::rollout::SamplerSpec;
use trainer_fsdp::run::evaluate_policy;
use trainer_fsdp::shapes_world::{
    ShapesGenerator, ShapesWorld, TOKEN_CHANNELS, TOKEN_GRID, eval_prompts, images_to_tensor, pack,
    pretrain_loss,
};

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
}

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
/// different scene of the same category that still parses).
fn caption(spec: &SceneSpec, category: Category, rng: &mut SplitMix64, p: f64) -> String {
    if rng.unit_f64() < p {
        SceneSpec::sample(category, rng.next_u64()).prompt()
    } else {
        spec.prompt()
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    check_args(&args)?;
    check_destinations(&args)?;
    let dev = Default::default();
    B::seed(&dev, args.seed);
    let held_out: Vec<String> = eval_prompts();
    let mut model = match &args.init_from {
        Some(dir) => ShapesGenerator::<B>::load(dir, &dev)
            .with_context(|| format!("loading the generator to continue from {}", dir.display()))?,
        None => ShapesGenerator::<B>::init(&dev),
    };
    let mut optim = AdamWConfig::new()
        .with_weight_decay(0.01)
        .init::<B, ShapesGenerator<B>>();
    // the evaluation's 12-step sampling schedule, as the trainer's
    let eval_sigmas = SchedulePolicy::qwen_image()
        .sample_sigmas(32, 32, 12)?
        .sigmas
        .into_vec();
    // SplitMix64: the data order's generator (deterministic, platform-independent)
    let mut rng = SplitMix64::new(args.seed ^ 0x5EED);
    let noise = NoiseRecipe::new(
        args.seed,
        vec![TOKEN_GRID * TOKEN_GRID, TOKEN_CHANNELS],
        vec![0],
        NoiseAlgorithm::Pcg64BoxMuller,
    )?;
    let start = Instant::now();
    println!(
        "pretraining the shapes world generator{}: {} steps x {} scenes, lr {} ({:?} after {} warmup steps), caption noise {}",
        args.init_from
            .as_ref()
            .map_or(String::new(), |d| format!(" from {}", d.display())),
        args.steps,
        args.batch,
        args.lr,
        args.lr_schedule,
        args.warmup,
        args.caption_noise
    );
    // the starting point, when there is one to train on (`--steps 0` only measures it)
    if args.init_from.is_some() && args.steps > 0 {
        evaluate(&model.valid(), &eval_sigmas, &args)?;
    }
    let mut running = 0.0;
    for step in 0..args.steps {
        let mut images = Vec::with_capacity(args.batch);
        let mut prompts = Vec::with_capacity(args.batch);
        while images.len() < args.batch {
            let category = Category::ALL[rng.below_modulo(Category::ALL.len() as u64) as usize];
            let spec = SceneSpec::sample(category, rng.next_u64());
            if held_out.contains(&spec.prompt()) {
                continue;
            }
            images.push(shapes::render(&spec, rng.next_u64(), &RenderOptions::default())?.image);
            prompts.push(caption(&spec, category, &mut rng, args.caption_noise));
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
        if (step + 1) % 50 == 0 {
            println!(
                "step {:>5}/{}  loss {running:.4}  lr {lr:.2e}  {:.0} s",
                step + 1,
                args.steps,
                start.elapsed().as_secs_f64()
            );
        }
        if args.eval_every > 0 && (step + 1) % args.eval_every == 0 && step + 1 < args.steps {
            let snapshot = model.valid();
            evaluate(&snapshot, &eval_sigmas, &args)?;
            if let Some(dir) = &args.snapshots {
                snapshot.save(&dir.join(format!("step_{}", step + 1)))?;
            }
        }
    }
    let base = model.valid();
    let reward = evaluate(&base, &eval_sigmas, &args)?;
    base.save(&args.out)
        .with_context(|| format!("saving to {}", args.out.display()))?;
    println!(
        "wrote {} after {:.1} min; held-out reward of the base (deterministic sampling, 12 steps): {reward:.3}",
        args.out.display(),
        start.elapsed().as_secs_f64() / 60.0
    );
    Ok(())
}

/// Deterministic 12-step sampling of the held-out prompts (`--eval-samples` seeds each), the
/// same evaluation the trainer runs, and its mean reward.
fn evaluate(model: &ShapesGenerator<Flex>, sigmas: &[f32], args: &Args) -> Result<f64> {
    let spec = SamplerSpec {
        sigmas: sigmas.to_vec(),
        kernel: Some(Kernel::flow_sde(0.7)?),
        solver: OdeSolver::Euler,
        storage: StorageDtype::F32,
    };
    let world = ShapesWorld::<Flex>::new(Path::new("."), model.text.clone())?;
    let (_, stats) = evaluate_policy::<B, _>(
        &world,
        &model.dit,
        &spec,
        &SdeSteps::new([]),
        args.eval_samples,
        args.eval_seed.unwrap_or(args.seed),
        &BTreeMap::from([("shapes".to_string(), 1.0)]),
        None,
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        &Default::default(),
    )?;
    let cats: Vec<String> = stats
        .by_category
        .iter()
        .map(|(k, v)| format!("{k} {v:.2}"))
        .collect();
    println!(
        "  held-out reward {:.3} ± {:.3}  ({})",
        stats.mean,
        stats.stderr,
        cats.join(", ")
    );
    Ok(stats.mean)
}
