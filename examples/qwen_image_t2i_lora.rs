//! FlowGRPO LoRA post-training of a Qwen-Image-architecture generator — the main job.
//!
//! With no arguments it runs the embedded default: the `shapes_world_lora` recipe (seed 002's
//! validated recipe shape — 12 denoising steps, 3 trained SDE steps redrawn per rollout from
//! an early pool, group size 8, 2 disjoint updates per rollout, eps_clip 1e-4, LoRA dropout
//! 0, no CFG — scaled to two CPU cores: 200 rollouts, CPS noise at level 0.7 on steps drawn
//! from [0..4], a KL of 0.04 to the reference, the lr decaying along a cosine) on the shapes
//! world: the base generator committed under `fixtures/shapes_world_v3` (made by the
//! `pretrain_shapes` example: taught the scenes on true captions, then misaligned by
//! corrupted ones) and the verifiable composition reward of
//! `reward::shapes`. It reports the held-out reward
//! (fixed prompts and seeds, deterministic sampling) before and after.
//!
//! ```sh
//! cargo run --release --example qwen_image_t2i_lora
//! cargo run --release --example qwen_image_t2i_lora -- --set rollout.prompts_per_rollout=4 --set run.num_rollouts=8
//! cargo run --release --example qwen_image_t2i_lora -- --resume        # continue the last run
//! cargo run --release --example qwen_image_t2i_lora -- --overwrite     # start again, the old run moved aside
//! cargo run --release --example qwen_image_t2i_lora -- --seeds 5       # the default over 5 seeds, a table
//! cargo run --release --example qwen_image_t2i_lora -- --algorithm awm # AWM instead of FlowGRPO
//! cargo run --release --example qwen_image_t2i_lora -- --algorithm nft # DiffusionNFT
//! cargo run --release --example qwen_image_t2i_lora -- --algorithm dpo # online Flow-DPO
//! cargo run --release --example qwen_image_t2i_lora -- --devices cpu:0,cpu:1 # two ranks
//! cargo run --release --features cuda --example qwen_image_t2i_lora -- \
//!     --recipe qwen_image_t2i_lora --model-path models/Qwen-Image --reward-model-path models/PickScore_v1 --backend cuda
//! ```

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "common/mod.rs"]
mod common;
use common::{keep_freed_pages, machine};

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::backend::Autodiff;
use burn::tensor::backend::AutodiffBackend;
use clap::Parser;
use flowrl::backend::{BackendKind, IndexedDevice, parse_devices};
use trainer_fsdp::config::{GeneratorSource, ScorerSpec};
use trainer_fsdp::sweep::{SeedOutcome, SweepTable};
use trainer_fsdp::{Override, Preflight, RecipeName, RunSummary, StopFlag, TrainConfig};

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
    /// `key=value` overrides with dotted keys, applied last (repeatable); `'key*=factor'`
    /// scales the number the key holds (e.g. `'optimizer.lr*=0.5'`).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// The RL objective: `flow_grpo` (the recipes' own `[algorithm]`), `awm` (Advantage
    /// Weighted Matching with its defaults) or `nft` (DiffusionNFT with its defaults, and
    /// `sampling.eta = 0`: its rollouts are deterministic) or `dpo` (online Flow-DPO, also
    /// with `sampling.eta = 0`), `dpok` (DPOK's clamped ratio with its KL, at a quarter of the lr),
    /// `grpo_guard`
    /// (GRPO-Guard's regulated ratio), `mix_grpo` (FlowGRPO on MixGRPO's sliding window),
    /// `dance_grpo` (FlowGRPO on DanceGRPO's Dance kernel at every step but the last, with
    /// per-sample random subsets of 60 % of them), `flow_grpo_fast` (FlowGRPO on one random
    /// window of 2 early steps per rollout, the ODE elsewhere), `fdfo` (paired finite
    /// differences: pairs from one x_T with churn noise) or `raft` (the baseline: supervised
    /// fine-tuning on each group's best deterministic sample); `--set algorithm.<key>=...`
    /// still applies after it.
    #[arg(long, value_name = "NAME")]
    algorithm: Option<String>,
    /// A diffusers Qwen-Image directory (trains the real model instead of the shapes world;
    /// prompts come from `[data] train` and `[data] eval`).
    #[arg(long)]
    model_path: Option<PathBuf>,
    /// The weight files' variant of --model-path (`bf16` reads
    /// `diffusion_pytorch_model.bf16.safetensors`), as diffusers' `variant=`.
    #[arg(long, value_name = "VARIANT", requires = "model_path")]
    variant: Option<String>,
    /// The PickScore model directory: sets the model path of `[reward] scorers`' pickscore
    /// scorer (an error when the config has none).
    #[arg(long)]
    reward_model_path: Option<PathBuf>,
    /// Continue from the last committed checkpoint (an error when none is committed; with
    /// `--set checkpoint.allow_fresh=true` it starts from scratch instead).
    #[arg(long)]
    resume: bool,
    /// Continue from this committed iteration instead of the newest (implies --resume); the
    /// newer checkpoints are moved aside.
    #[arg(long, value_name = "ITER")]
    resume_from: Option<u64>,
    /// With --resume: accept a config that changes results (seed, optimizer, batch, sampling,
    /// reward, ...) relative to the run being continued, recording the differences in the
    /// run directory's `config_changes.log`.
    #[arg(long)]
    allow_config_changes: bool,
    /// A fresh run into a directory that holds a run moves the old one aside (into
    /// `<run dir>/previous-<Unix time>/`) instead of refusing.
    #[arg(long)]
    overwrite: bool,
    /// Where the run writes everything: config, metrics, sample grids, `checkpoints/` and
    /// `artifacts/` (default: `<checkpoint.dir>/..`, `runs/shapes-world-lora` for the
    /// embedded default). With --seeds, each seed's run goes to `seed_<N>/` under it.
    #[arg(long)]
    run_dir: Option<PathBuf>,
    /// Backend: cpu, cuda or wgpu (GPU backends need the matching cargo feature).
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// Train on several ranks of this machine, one per device, sharing each rollout
    /// (`cuda:0,cuda:1`; `cpu:0,cpu:1` runs two ranks on the CPU). The kind must be the
    /// backend's.
    #[arg(long, value_name = "KIND:INDEX,...")]
    devices: Option<String>,
    /// Machines in a run over several (each runs this command with its own --node-rank and
    /// as many --devices; the run directory must be on a filesystem they share).
    #[arg(long, default_value_t = 1, requires = "orchestrator")]
    nodes: usize,
    /// This machine's index among --nodes (0 writes the run's files).
    #[arg(long, default_value_t = 0, requires = "orchestrator")]
    node_rank: usize,
    /// burn's collective orchestrator every machine reaches (`ws://HOST:PORT`).
    #[arg(long, value_name = "ws://HOST:PORT")]
    orchestrator: Option<String>,
    /// This machine's address as the others reach it (`ws://HOST:PORT`; it serves tensors on
    /// that port).
    #[arg(long, value_name = "ws://HOST:PORT", requires = "orchestrator")]
    node_address: Option<String>,
    /// Also serve the orchestrator from this process, on this port (one machine does).
    #[arg(long, value_name = "PORT", requires = "orchestrator")]
    serve_orchestrator: Option<u16>,
    /// Run the job once per seed (`run.seed` = first seed, first seed + 1, ...) and write the
    /// table of held-out rewards and gains with their mean, min and max (on one machine; the
    /// seeds own `run.seed`, `checkpoint.dir` and `artifacts.root`, so `--set` may not set them).
    #[arg(long, value_name = "N")]
    seeds: Option<u64>,
    /// The first seed of --seeds.
    #[arg(long, default_value_t = 0, requires = "seeds")]
    first_seed: u64,
    /// Where --seeds writes its Markdown table (default: `<run dir>/seeds.md`; an existing
    /// table is replaced only with --overwrite). Every seed's evaluations go beside it as a
    /// comparison's curves (`seeds_curves.csv` for `seeds.md`, method = the algorithm's
    /// kind), which `compare_algorithms --from-curves` tables with other methods and the
    /// baselines.
    #[arg(long, requires = "seeds")]
    seeds_table: Option<PathBuf>,
}

fn main() -> Result<()> {
    keep_freed_pages();
    let args = Args::parse();
    check_seeds_flags(&args)?;
    let mut overrides = Vec::new();
    if let Some(dir) = &args.run_dir {
        overrides.extend(run_dir_overrides(dir)?);
    }
    if let Some(name) = &args.algorithm {
        overrides.extend(trainer_fsdp::config::algorithm_overrides(name)?);
    }
    overrides.extend(Override::parse_all(&args.overrides)?);
    if args.resume || args.resume_from.is_some() {
        overrides.push(Override::parse("checkpoint.resume=true")?);
    }
    if let Some(it) = args.resume_from {
        overrides.push(Override::parse(&format!("checkpoint.resume_from={it}"))?);
    }
    if args.allow_config_changes {
        overrides.push(Override::parse("checkpoint.allow_config_changes=true")?);
    }
    if args.overwrite {
        overrides.push(Override::parse("checkpoint.overwrite=true")?);
    }
    let mut cfg = match &args.config {
        Some(path) => TrainConfig::from_file(path, &overrides)?,
        None => TrainConfig::from_recipe(RecipeName::parse(&args.recipe)?, &overrides)?,
    };
    if args.algorithm.as_deref() == Some("flow_grpo") && cfg.algorithm.kind() != "flow_grpo" {
        bail!(
            "--algorithm flow_grpo, but the config's [algorithm] is {:?}: FlowGRPO's keys \
             (eps_clip, advantage_std_mode, kl_coef) have no defaults; write them in the config",
            cfg.algorithm.kind()
        );
    }
    if let Some(model_path) = &args.model_path {
        cfg.model.generator = GeneratorSource::QwenImage {
            model_path: model_path.clone(),
            variant: args.variant.clone(),
        };
    }
    if let Some(path) = &args.reward_model_path {
        let mut pickscores = cfg
            .reward
            .scorers
            .iter_mut()
            .filter_map(|s| match s {
                ScorerSpec::Pickscore { model_path } => Some(model_path),
                _ => None,
            })
            .peekable();
        if pickscores.peek().is_none() {
            bail!(
                "--reward-model-path: the config's [reward] scorers have no pickscore scorer to point at it"
            );
        }
        pickscores.for_each(|p| *p = path.clone());
    }
    let kind: BackendKind = args.backend.parse()?;
    kind.ensure_available()?;
    let devices = match &args.devices {
        Some(list) => {
            let (devices_kind, indices) = parse_devices(list)?;
            if devices_kind != kind {
                bail!("--devices {list} are {devices_kind} devices; add --backend {devices_kind}");
            }
            indices
        }
        None => vec![0],
    };
    if let Some(port) = args.serve_orchestrator {
        trainer_fsdp::ranks::start_orchestrator(port)?;
        println!("serving the collective orchestrator on port {port}");
    }
    let node = match &args.orchestrator {
        None => None,
        Some(orchestrator) => {
            let node_address = args
                .node_address
                .clone()
                .context("--orchestrator needs --node-address (this machine's ws://HOST:PORT)")?;
            let data_port = node_address
                .rsplit(':')
                .next()
                .and_then(|p| p.trim_end_matches('/').parse::<u16>().ok())
                .with_context(|| {
                    format!("--node-address {node_address}: expected ws://HOST:PORT")
                })?;
            if args.node_rank >= args.nodes {
                bail!(
                    "--node-rank {} of --nodes {}: expected a rank below the node count",
                    args.node_rank,
                    args.nodes
                );
            }
            Some(trainer_fsdp::NodeSetup {
                nodes: args.nodes,
                node_rank: args.node_rank,
                orchestrator: orchestrator.clone(),
                node_address,
                data_port,
            })
        }
    };
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
    let stop = StopFlag::install()?;
    match args.seeds {
        None => {
            let summary =
                dispatch_backend(kind, &devices, node.as_ref(), &cfg, &pre, &run_dir, &stop)
                    .inspect_err(|e| report_failure(e, &cfg))?;
            report(&summary, &run_dir);
            Ok(())
        }
        Some(n) => {
            if cfg.checkpoint.resume {
                bail!("--seeds starts every seed's run from scratch; it cannot --resume");
            }
            if cfg.eval.interval == 0 {
                bail!("--seeds tables held-out evaluations: eval.interval = 0 evaluates nothing");
            }
            let table_path = args
                .seeds_table
                .clone()
                .unwrap_or_else(|| run_dir.join("seeds.md"));
            if table_path.exists() && !args.overwrite {
                bail!(
                    "--seeds would replace the table {} (another sweep's?): choose another \
                     --seeds-table or --run-dir, or pass --overwrite",
                    table_path.display()
                );
            }
            // the seeds' evaluations as a comparison's curves (`compare_algorithms
            // --from-curves` puts them in one table with other methods and the baselines)
            let curves_path = seeds_curves_path(&table_path);
            if curves_path.exists() && !args.overwrite {
                bail!(
                    "--seeds would replace the curves {} (another sweep's?): choose another \
                     --seeds-table or --run-dir, or pass --overwrite",
                    curves_path.display()
                );
            }
            let mut curves = Vec::new();
            let mut outcomes = Vec::new();
            // the last seed fits: check_seeds_flags
            let last = args.first_seed + (n - 1);
            for seed in args.first_seed..=last {
                let dir = run_dir.join(format!("seed_{seed}"));
                let mut o = run_dir_overrides(&dir)?;
                o.push(Override::parse(&format!("run.seed={seed}"))?);
                let cfg = cfg.clone().with_overrides(&o)?;
                let pre = cfg.preflight()?;
                let start = Instant::now();
                let summary =
                    dispatch_backend(kind, &devices, node.as_ref(), &cfg, &pre, &dir, &stop)
                        .inspect_err(|e| report_failure(e, &cfg))?;
                report(&summary, &dir);
                if summary.stopped {
                    bail!(
                        "stopped during seed {seed}; the table holds the seeds finished before it{}",
                        if outcomes.is_empty() {
                            String::from(" (none)")
                        } else {
                            format!(" ({})", table_path.display())
                        }
                    );
                }
                let (Some(base), Some(last)) = (summary.initial_eval, summary.final_eval) else {
                    bail!("--seeds needs evaluations (eval.interval > 0)");
                };
                outcomes.push(SeedOutcome {
                    seed,
                    base,
                    last,
                    seconds: start.elapsed().as_secs_f64(),
                });
                let table = SweepTable::new(outcomes.clone());
                // the command as a user types it (argv[0] is this machine's binary path)
                let command = std::iter::once(
                    "cargo run --release --example qwen_image_t2i_lora --".to_string(),
                )
                .chain(
                    std::env::args()
                        .skip(1)
                        .map(|a| trainer_fsdp::sweep::shell_word(&a)),
                )
                .collect::<Vec<_>>()
                .join(" ");
                durable::write_atomic(&table_path, table.markdown(&command, &machine()).as_bytes())
                    .with_context(|| format!("writing {}", table_path.display()))?;
                curves.push(trainer_fsdp::compare::run_curve(
                    cfg.algorithm.kind(),
                    seed,
                    &dir.join("metrics.jsonl"),
                    cfg.eval.second_judge().as_deref(),
                )?);
                durable::write_atomic(
                    &curves_path,
                    trainer_fsdp::compare::curves_csv(&curves).as_bytes(),
                )
                .with_context(|| format!("writing {}", curves_path.display()))?;
                let second = table.second_gain.map_or(String::new(), |g| {
                    format!(
                        "; second judge: gain mean {:+.3}, min {:+.3}, max {:+.3}",
                        g.mean, g.min, g.max
                    )
                });
                println!(
                    "seeds so far: gain mean {:+.3}, min {:+.3}, max {:+.3}{second} ({})",
                    table.gain.mean,
                    table.gain.min,
                    table.gain.max,
                    table_path.display()
                );
            }
            Ok(())
        }
    }
}

/// Where `--seeds` writes its curves: beside its table, `<table's stem>_curves.csv`.
fn seeds_curves_path(table: &Path) -> PathBuf {
    let stem = table
        .file_stem()
        .map_or_else(|| "seeds".into(), |s| s.to_string_lossy());
    table.with_file_name(format!("{stem}_curves.csv"))
}

/// `--seeds`' flags, before anything runs: at least one seed, a last seed that fits a u64, one
/// machine (the table needs the evaluations, which rank 0 alone runs), and no `--set` of a key
/// the seeds set themselves (it would be replaced without a word).
fn check_seeds_flags(args: &Args) -> Result<()> {
    let Some(n) = args.seeds else {
        return Ok(());
    };
    if n == 0 {
        bail!("--seeds 0: expected at least 1 seed");
    }
    if args.first_seed.checked_add(n - 1).is_none() {
        bail!(
            "--first-seed {} with --seeds {n}: the last seed does not fit a 64-bit seed",
            args.first_seed
        );
    }
    if args.orchestrator.is_some() {
        bail!(
            "--seeds runs on one machine (its table needs the evaluations rank 0 runs); drop --orchestrator"
        );
    }
    for raw in &args.overrides {
        let o = Override::parse(raw)?;
        let key = o.path.join(".");
        let owned = ["run.seed", "checkpoint.dir", "artifacts.root"];
        if owned
            .iter()
            .any(|k| key == *k || k.starts_with(&format!("{key}.")))
        {
            bail!(
                "--set {raw}: --seeds sets {key} for every seed (run.seed from --first-seed, the \
                 directories under --run-dir)"
            );
        }
    }
    Ok(())
}

/// `checkpoint.dir` and `artifacts.root` under a run directory (explicit --set keys still win,
/// except under --seeds, which refuses them).
fn run_dir_overrides(dir: &Path) -> Result<Vec<Override>> {
    let dir = dir.display();
    Ok(vec![
        Override::parse(&format!("checkpoint.dir={dir}/checkpoints"))?,
        Override::parse(&format!("artifacts.root={dir}/artifacts"))?,
    ])
}

fn dispatch_backend(
    kind: BackendKind,
    devices: &[usize],
    node: Option<&trainer_fsdp::NodeSetup>,
    cfg: &TrainConfig,
    pre: &Preflight,
    run_dir: &Path,
    stop: &StopFlag,
) -> Result<RunSummary> {
    match kind {
        BackendKind::Cpu => {
            train::<Autodiff<flowrl::backend::Cpu>>(devices, node, cfg, pre, run_dir, stop)
        }
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            train::<Autodiff<flowrl::backend::Cuda>>(devices, node, cfg, pre, run_dir, stop)
        }
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => {
            train::<Autodiff<flowrl::backend::Wgpu>>(devices, node, cfg, pre, run_dir, stop)
        }
        #[allow(unreachable_patterns)]
        other => bail!("backend {other} is not compiled in"),
    }
}

fn train<B: AutodiffBackend>(
    devices: &[usize],
    node: Option<&trainer_fsdp::NodeSetup>,
    cfg: &TrainConfig,
    pre: &Preflight,
    run_dir: &Path,
    stop: &StopFlag,
) -> Result<RunSummary>
where
    B::Device: Default + IndexedDevice,
{
    if devices.len() > 1 || node.is_some() {
        let devices: Vec<B::Device> = devices.iter().map(|&i| B::Device::at(i)).collect();
        for d in &devices {
            B::seed(d, cfg.run.seed);
        }
        return Ok(trainer_fsdp::dispatch::train_ranks::<B>(
            cfg, pre, run_dir, &devices, node, stop,
        )?);
    }
    let device = match devices.first() {
        Some(&i) if i > 0 => B::Device::at(i),
        _ => B::Device::default(),
    };
    B::seed(&device, cfg.run.seed);
    Ok(trainer_fsdp::dispatch::train::<B>(
        cfg, pre, run_dir, &device, stop,
    )?)
}

fn report(summary: &RunSummary, run_dir: &Path) {
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
        (Some(a), Some(b)) => {
            println!(
                "held-out reward: {:.3} ± {:.3} -> {:.3} ± {:.3}",
                a.reward, a.stderr, b.reward, b.stderr
            );
            if let (Some(x), Some(y)) = (a.second, b.second) {
                println!(
                    "second judge:    {:.3} ± {:.3} -> {:.3} ± {:.3}",
                    x.0, x.1, y.0, y.1
                );
            }
        }
        _ => println!("held-out reward: not evaluated (eval.interval = 0)"),
    }
}

/// The honest ending of a run that failed after it started: what is committed and how to go
/// on (a refusal to start wrote nothing and says so itself).
fn report_failure(e: &anyhow::Error, cfg: &TrainConfig) {
    if e.downcast_ref::<trainer_fsdp::TrainerError>()
        .is_some_and(trainer_fsdp::TrainerError::is_refusal)
    {
        return;
    }
    let last = trainer_fsdp::CheckpointStore::new(&cfg.checkpoint.dir, &cfg.run.task, None)
        .and_then(|s| s.latest_committed());
    match last {
        Ok(Some(c)) => eprintln!(
            "the run stopped with an error; its last committed checkpoint is after rollout {} \
             ({}): fix the cause, then --resume continues from it",
            c.iteration,
            c.dir.display()
        ),
        Ok(None) => eprintln!(
            "the run stopped with an error before any checkpoint was committed: fix the cause, \
             then start again with --overwrite"
        ),
        Err(_) => {}
    }
}
