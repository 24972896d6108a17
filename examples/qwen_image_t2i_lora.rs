//! FlowGRPO LoRA post-training of a Qwen-Image-architecture generator — the main job.
//!
//! With no arguments it runs the embedded default: the `shapes_world_lora` recipe (seed 002's
//! validated recipe shape — 12 denoising steps, Flow-SDE eta 0.7, 3 trained SDE steps redrawn
//! per rollout from the pool [1..5], group size 8, 2 disjoint updates per rollout, eps_clip
//! 1e-4, LoRA dropout 0, no CFG — scaled to two CPU cores) on the shapes world: the base
//! generator committed under `fixtures/shapes_world` (made by the `pretrain_shapes` example)
//! and the verifiable composition reward of `reward::shapes`. It reports the held-out reward
//! (fixed prompts and seeds, deterministic sampling) before and after.
//!
//! ```sh
//! cargo run --release --example qwen_image_t2i_lora
//! cargo run --release --example qwen_image_t2i_lora -- --set grpo.prompts_per_rollout=4 --set run.num_rollouts=8
//! cargo run --release --example qwen_image_t2i_lora -- --resume        # continue the last run
//! cargo run --release --features cuda --example qwen_image_t2i_lora -- \
//!     --recipe qwen_image_t2i_lora --model-path models/Qwen-Image --reward-model-path models/PickScore_v1 --backend cuda
//! ```

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Keeps the memory mimalloc frees committed, unless `MIMALLOC_PURGE_DELAY` says otherwise.
///
/// By default mimalloc hands freed pages back to the OS after 10 ms; a training step frees
/// and re-allocates its autodiff graph's tensors every few milliseconds, so the kernel zeroed
/// the same pages over and over (a quarter of the CPU backend's training phase on the shapes
/// world). The process then keeps its peak memory until it exits.
fn keep_freed_pages() {
    // `mi_option_purge_delay` in mimalloc.h; options keep their numbers across versions
    // (retired ones stay as `deprecated_` placeholders).
    const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets a process-wide integer option; called first thing in `main`, before
        // any other thread exists (the call is not thread safe).
        #[allow(unsafe_code)]
        unsafe {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1);
        }
    }
}

use std::path::PathBuf;

use anyhow::{Result, bail};
use burn::backend::Autodiff;
use clap::Parser;
use flowrl::backend::BackendKind;
use trainer_fsdp::config::GeneratorSource;
use trainer_fsdp::dispatch::{Job, dispatch};
use trainer_fsdp::{
    Algorithm, LocalWorkers, Override, Preflight, RecipeName, Run, RunSummary, StopFlag,
    TrainConfig, TrainerError, World,
};

/// FlowGRPO LoRA post-training (the embedded default: the shapes world).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// A named recipe to start from (shapes_world_lora, qwen_image_t2i_lora, qwen_image_t2i_full).
    #[arg(long, default_value = "shapes_world_lora")]
    recipe: String,
    /// A TOML config file (it may name its own `recipe`); overrides --recipe.
    #[arg(long)]
    config: Option<PathBuf>,
    /// `key=value` overrides with dotted keys, applied last (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// A diffusers Qwen-Image directory (trains the real model instead of the shapes world).
    #[arg(long)]
    model_path: Option<PathBuf>,
    /// The PickScore model directory (with --model-path).
    #[arg(long)]
    reward_model_path: Option<PathBuf>,
    /// Continue from the last committed checkpoint.
    #[arg(long)]
    resume: bool,
    /// Where the run writes everything: config, metrics, sample grids, `checkpoints/` and
    /// `artifacts/` (default: `<checkpoint.dir>/..`, `runs/shapes-world-lora` for the
    /// embedded default).
    #[arg(long)]
    run_dir: Option<PathBuf>,
    /// Backend: cpu, cuda or wgpu (GPU backends need the matching cargo feature).
    #[arg(long, default_value = "cpu")]
    backend: String,
}

fn main() -> Result<()> {
    keep_freed_pages();
    let args = Args::parse();
    let mut overrides = Vec::new();
    if let Some(dir) = &args.run_dir {
        // the run directory holds everything of the run; explicit --set keys still win
        let dir = dir.display();
        overrides.push(Override::parse(&format!(
            "checkpoint.dir={dir}/checkpoints"
        ))?);
        overrides.push(Override::parse(&format!("artifacts.root={dir}/artifacts"))?);
    }
    overrides.extend(Override::parse_all(&args.overrides)?);
    if args.resume {
        overrides.push(Override::parse("checkpoint.resume=true")?);
    }
    let mut cfg = match &args.config {
        Some(path) => TrainConfig::from_file(path, &overrides)?,
        None => TrainConfig::from_recipe(RecipeName::parse(&args.recipe)?, &overrides)?,
    };
    if let Some(model_path) = &args.model_path {
        cfg.model.generator = GeneratorSource::QwenImage {
            model_path: model_path.clone(),
            reward_model_path: args.reward_model_path.clone(),
        };
    }
    let kind: BackendKind = args.backend.parse()?;
    kind.ensure_available()?;
    if kind != BackendKind::Cpu && cfg.run.host_threads.is_none() {
        // one host thread keeps each batch whole on the device; `--set run.host_threads=N`
        // still wins
        cfg.run.host_threads = Some(1);
    }
    let pre = cfg.preflight()?;
    for w in &pre.warnings {
        println!("warning: {w}");
    }
    let run_dir = args.run_dir.clone().unwrap_or_else(|| {
        cfg.checkpoint
            .dir
            .parent()
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("runs"))
    });
    match kind {
        BackendKind::Cpu => train::<Autodiff<flowrl::backend::Cpu>>(cfg, pre, run_dir),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => train::<Autodiff<flowrl::backend::Cuda>>(cfg, pre, run_dir),
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => train::<Autodiff<flowrl::backend::Wgpu>>(cfg, pre, run_dir),
        #[allow(unreachable_patterns)]
        other => bail!("backend {other} is not compiled in"),
    }
}

fn train<B: burn::tensor::backend::AutodiffBackend>(
    cfg: TrainConfig,
    pre: Preflight,
    run_dir: PathBuf,
) -> Result<()>
where
    B::Device: Default,
{
    let device = B::Device::default();
    B::seed(&device, cfg.run.seed);
    let job = TrainJob::<B> {
        cfg: cfg.clone(),
        pre: pre.clone(),
        run_dir: run_dir.clone(),
        device: device.clone(),
    };
    let summary = dispatch(&cfg, &pre, &device, job)?;
    println!(
        "done in {:.1} min{}; metrics, reward curve and sample grids in {}",
        summary.seconds / 60.0,
        if summary.stopped {
            " (stopped early)"
        } else {
            ""
        },
        run_dir.display()
    );
    match (summary.initial_eval, summary.final_eval) {
        (Some(a), Some(b)) => println!(
            "held-out reward: {:.3} ± {:.3} -> {:.3} ± {:.3}",
            a.reward, a.stderr, b.reward, b.stderr
        ),
        _ => println!("held-out reward: not evaluated (eval.interval = 0)"),
    }
    Ok(())
}

/// The main job in whichever world and algorithm the config names, on one process.
struct TrainJob<B: burn::tensor::backend::AutodiffBackend> {
    cfg: TrainConfig,
    pre: Preflight,
    run_dir: PathBuf,
    device: B::Device,
}

impl<B: burn::tensor::backend::AutodiffBackend> Job<B> for TrainJob<B> {
    type Output = RunSummary;

    fn run<W: World<B>, A: Algorithm<B, W>>(
        self,
        world: W,
        algorithm: A,
    ) -> Result<RunSummary, TrainerError> {
        let cfg = self.cfg;
        println!(
            "flowrl {} ({}) in the {}: {} rollouts of {} prompts x {} candidates, {} steps (trained {:?}), LoRA rank {}, lr {}; run directory {}",
            algorithm.name(),
            cfg.recipe.map(|r| r.as_str()).unwrap_or("config file"),
            world.name(),
            cfg.run.num_rollouts,
            cfg.grpo.prompts_per_rollout,
            cfg.grpo.group_size,
            cfg.sampling.num_inference_steps,
            cfg.sampling.sde_pool,
            cfg.lora.as_ref().map(|l| l.rank).unwrap_or(0),
            cfg.optimizer.lr,
            self.run_dir.display(),
        );
        let stop = StopFlag::install()?;
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
        run.run(&stop)
    }
}
