//! Every algorithm of the family on the shapes world at the same CPU budget, over seeds: the
//! held-out reward against the CPU seconds each run spent training (rollouts, scoring,
//! updates; evaluations excluded), as a Markdown table and a PNG plot.
//!
//! ```text
//! cargo run --release --example compare_algorithms                      # 10 methods x 5 seeds, 600 CPU s each
//! cargo run --release --example compare_algorithms -- --methods flow_grpo,nft --seeds 1 --budget 120
//! cargo run --release --example compare_algorithms -- --reuse           # the table again from finished runs
//! cargo run --release --example compare_algorithms -- --methods awm --variant awm_trust=awm \
//!     --set-for awm_trust:algorithm.kl_coef=0.001                       # a method beside its variant
//! cargo run --release --example compare_algorithms -- --from-curves a/curves.csv \
//!     --from-curves b/curves.csv --out merged                           # the table of earlier runs
//! ```
//!
//! Each run is the recipe (`--recipe`, the shapes world's by default) with the method's
//! `[algorithm]` (as `qwen_image_t2i_lora --algorithm`), `run.seed`, `run.cpu_budget_seconds`
//! and `eval.interval` set, then every `--set`, then the entry's own `--set-for`. A
//! `--variant LABEL=METHOD` is one more entry running METHOD under its own label (with its own
//! `--set-for LABEL:KEY=VALUE`), so that one table holds a method and its variants. It runs
//! until its budget is spent and ends with an evaluation. Runs go to
//! `<out>/<label>/seed_<N>/` (a method's label is its name); the table to
//! `<out>/comparison.md`, the plot to `<out>/comparison.png`, every evaluation to
//! `<out>/curves.csv`, each rewritten after every run (a stopped comparison leaves the table of
//! the runs it finished). The CPU axis is the process's own CPU time, so a busy machine does not
//! move it much, but another CPU model does.
//!
//! `--from-curves FILE` (repeatable) runs nothing: it rebuilds the table, the plot and one
//! `curves.csv` from the `curves.csv` of earlier comparisons, so that runs made in several
//! invocations (or kept as data after their run directories are gone) make one table. A run
//! (method and seed) that two files both hold is refused.

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "common/mod.rs"]
mod common;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use burn::backend::Autodiff;
use clap::Parser;
use trainer_fsdp::compare::{
    ComparisonEntry, RunCurve, comparison_entries, comparison_table, curves_csv, gains_by_seed,
    read_curves_csv, run_curve, write_plot,
};
use trainer_fsdp::config::algorithm_overrides;
use trainer_fsdp::{Override, RecipeName, StopFlag, TrainConfig, names, read_jsonl};

/// The algorithm comparison on the CPU backend.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The methods, comma-separated (`--algorithm` names of the main example); `''` for none,
    /// to run `--variant` entries alone.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "flow_grpo,awm,nft,dpo,dpok,grpo_guard,mix_grpo,dance_grpo,flow_grpo_fast,fdfo"
    )]
    methods: Vec<String>,
    /// A labelled variant of a method, `LABEL=METHOD` (repeatable): one more entry of the
    /// table, its runs in `<out>/<LABEL>/`.
    #[arg(long = "variant", value_name = "LABEL=METHOD")]
    variants: Vec<String>,
    /// An override for one entry, `LABEL:KEY=VALUE` (repeatable; a method's label is its
    /// name), applied after `--set`.
    #[arg(long = "set-for", value_name = "LABEL:KEY=VALUE")]
    set_for: Vec<String>,
    /// Seeds per method.
    #[arg(long, default_value_t = 5)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    first_seed: u64,
    /// Training CPU seconds each run may spend (`run.cpu_budget_seconds`).
    #[arg(long, default_value_t = 600.0)]
    budget: f64,
    /// Rollouts between evaluations (`eval.interval`).
    #[arg(long, default_value_t = 10)]
    eval_interval: u64,
    /// The recipe every method starts from.
    #[arg(long, default_value = "shapes_world_lora")]
    recipe: String,
    /// `key=value` overrides applied to every run, last (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Where the runs and the results go.
    #[arg(long, default_value = "runs/compare")]
    out: PathBuf,
    /// Keep a run whose directory already holds a finished run (its budget spent) instead of
    /// running it again; any other existing run directory is moved aside and run afresh.
    #[arg(long)]
    reuse: bool,
    /// Run nothing: build the table and the plot from the `curves.csv` of earlier comparisons
    /// (repeatable; every run in them, in order). The run options do not apply.
    #[arg(
        long = "from-curves",
        value_name = "CSV",
        conflicts_with_all = ["methods", "variants", "set_for", "reuse", "overrides", "seeds", "first_seed", "budget", "eval_interval", "recipe"]
    )]
    from_curves: Vec<PathBuf>,
}

fn main() -> Result<()> {
    common::keep_freed_pages();
    let args = Args::parse();
    let curves = if args.from_curves.is_empty() {
        run_all(&args)?
    } else {
        from_curves(&args.from_curves)?
    };
    if curves.is_empty() {
        bail!("no runs: give --methods or --variant, or a --from-curves file with rows");
    }
    let table = write_outputs(&curves, &header(&args), &args.out)?;
    println!("\n{table}");
    println!(
        "wrote {}, {} and {}",
        args.out.join("comparison.md").display(),
        args.out.join("comparison.png").display(),
        args.out.join("curves.csv").display()
    );
    Ok(())
}

/// Writes `comparison.md` (`header`, the machine, the table and the gains per seed),
/// `curves.csv` and `comparison.png` of `curves` into `out`, each replacing the last atomically;
/// gives the table. The comparison calls it after every run, so that a stopped one leaves the
/// table of the runs it finished.
fn write_outputs(curves: &[RunCurve], header: &str, out: &Path) -> Result<String> {
    let Some(first) = curves.first() else {
        bail!("no runs to tabulate");
    };
    let target = if curves.iter().any(|c| c.method == "flow_grpo") {
        "flow_grpo"
    } else {
        first.method.as_str()
    };
    let table = comparison_table(curves, target);
    let mut md = format!("{header}Machine: {}\n\n", common::machine());
    md.push_str(&table);
    md.push_str("\nGains per seed (final minus base held-out reward):\n\n");
    md.push_str(&gains_by_seed(curves));
    std::fs::create_dir_all(out)?;
    durable::write_atomic(&out.join("comparison.md"), md.as_bytes())?;
    durable::write_atomic(&out.join("curves.csv"), curves_csv(curves).as_bytes())?;
    write_plot(curves, &out.join("comparison.png"))?;
    Ok(table)
}

/// The command line for the table's header.
fn header(args: &Args) -> String {
    let mut header = String::from("Command: `cargo run --release --example compare_algorithms --");
    if !args.from_curves.is_empty() {
        for f in &args.from_curves {
            let _ = write!(header, " --from-curves {}", f.display());
        }
        header.push_str("` (the runs' own commands made the files)\n");
        return header;
    }
    let _ = write!(
        header,
        " --methods {} --seeds {} --first-seed {} --budget {} --eval-interval {}",
        args.methods.join(","),
        args.seeds,
        args.first_seed,
        args.budget,
        args.eval_interval,
    );
    for o in &args.overrides {
        let _ = write!(header, " --set {o}");
    }
    for v in &args.variants {
        let _ = write!(header, " --variant {v}");
    }
    for o in &args.set_for {
        let _ = write!(header, " --set-for {o}");
    }
    header.push_str("`\n");
    header
}

/// Every entry's runs (or, with `--reuse`, the finished ones read back), writing the outputs
/// of those so far after each.
fn run_all(args: &Args) -> Result<Vec<RunCurve>> {
    let entries = comparison_entries(&args.methods, &args.variants, &args.set_for)?;
    if !(args.budget.is_finite() && args.budget > 0.0) {
        bail!("--budget {}: expected CPU seconds > 0", args.budget);
    }
    if args.eval_interval == 0 {
        bail!("--eval-interval 0: the comparison needs evaluations");
    }
    let recipe = RecipeName::parse(&args.recipe)?;
    let stop = StopFlag::install()?;
    let mut curves: Vec<RunCurve> = Vec::new();
    let total = entries.len() as u64 * args.seeds;
    let mut done = 0;
    for entry in &entries {
        let method = &entry.label;
        for seed in args.first_seed..args.first_seed + args.seeds {
            done += 1;
            let dir = args.out.join(method).join(format!("seed_{seed}"));
            let jsonl = dir.join("metrics.jsonl");
            if args.reuse && finished(&jsonl, args.budget)? {
                println!(
                    "[{done}/{total}] {method}, seed {seed}: reusing {}",
                    dir.display()
                );
            } else {
                println!("[{done}/{total}] {method}, seed {seed}: {}", dir.display());
                let cfg = config(recipe, entry, seed, args, &dir)?;
                let pre = cfg.preflight()?;
                trainer_fsdp::dispatch::train::<Autodiff<flowrl::backend::Cpu>>(
                    &cfg,
                    &pre,
                    &dir,
                    &Default::default(),
                    &stop,
                )
                .with_context(|| format!("{method}, seed {seed}"))?;
                if stop.is_set() {
                    bail!("stopped: the runs so far are in {}", args.out.display());
                }
            }
            let curve = run_curve(method, seed, &jsonl)?;
            if let (Some(a), Some(b)) = (curve.base(), curve.last()) {
                println!(
                    "{method}, seed {seed}: held-out {:.3} ± {:.3} -> {:.3} ± {:.3} ({:+.3}) in {:.0} training CPU s",
                    a.reward,
                    a.stderr,
                    b.reward,
                    b.stderr,
                    b.reward - a.reward,
                    b.cpu_seconds
                );
            }
            curves.push(curve);
            write_outputs(&curves, &header(args), &args.out)?;
        }
    }
    Ok(curves)
}

/// The runs of earlier comparisons' curves files.
fn from_curves(files: &[PathBuf]) -> Result<Vec<RunCurve>> {
    let mut curves: Vec<RunCurve> = Vec::new();
    for f in files {
        let more = read_curves_csv(f, &curves)?;
        println!("{}: {} runs", f.display(), more.len());
        curves.extend(more);
    }
    Ok(curves)
}

/// The run of `entry` and `seed` in `dir`.
fn config(
    recipe: RecipeName,
    entry: &ComparisonEntry,
    seed: u64,
    args: &Args,
    dir: &Path,
) -> Result<TrainConfig> {
    let d = dir.display();
    let mut o = vec![
        Override::parse(&format!("checkpoint.dir={d}/checkpoints"))?,
        Override::parse(&format!("artifacts.root={d}/artifacts"))?,
        // an earlier, unfinished run in the directory is moved aside
        Override::parse("checkpoint.overwrite=true")?,
    ];
    o.extend(algorithm_overrides(&entry.method)?);
    o.push(Override::parse(&format!("run.seed={seed}"))?);
    o.push(Override::parse("run.num_rollouts=1000000")?);
    o.push(Override::parse(&format!(
        "run.cpu_budget_seconds={:?}",
        args.budget
    ))?);
    o.push(Override::parse(&format!(
        "eval.interval={}",
        args.eval_interval
    ))?);
    o.extend(Override::parse_all(&args.overrides)?);
    o.extend(Override::parse_all(&entry.overrides)?);
    Ok(TrainConfig::from_recipe(recipe, &o)?)
}

/// Whether `jsonl` is the log of a run that spent `budget` and evaluated at its end.
fn finished(jsonl: &Path, budget: f64) -> Result<bool> {
    if !jsonl.exists() {
        return Ok(false);
    }
    let records = read_jsonl(jsonl)?;
    Ok(records.last().is_some_and(|r| {
        let get = |k: &str| r.metrics.get(k).copied().flatten();
        get(names::PERF_TRAIN_CPU_SECONDS).is_some_and(|c| c >= budget)
            && get(trainer_fsdp::run::EVAL_REWARD).is_some()
    }))
}
