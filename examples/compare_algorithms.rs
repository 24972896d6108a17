//! Every algorithm of the family on the shapes world at the same CPU budget, over seeds: the
//! held-out reward against the CPU seconds each run spent training (rollouts, scoring,
//! updates; evaluations excluded), as a Markdown table and a PNG plot. The table gives the
//! second judgement's gain beside the reward's (`EvalSection::second_judge` of the recipe),
//! so that a gain only the rewarding judge sees shows.
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
//! and `eval.interval` set, and a constant learning rate (a run that ends when its CPU is
//! spent has no known last step for the recipe's decay to reach: `optimizer.lr_scheduler =
//! "constant"` without `lr_decay_iters`, unless a `--set` gives a schedule), then every
//! `--set`, then the entry's own `--set-for`. A
//! `--variant LABEL=METHOD` is one more entry running METHOD under its own label (with its own
//! `--set-for LABEL:KEY=VALUE`), so that one table holds a method and its variants. It runs
//! until its budget is spent and ends with an evaluation. Runs go to
//! `<out>/<label>/seed_<N>/` (a method's label is its name); the table to
//! `<out>/comparison.md`, the plot to `<out>/comparison.png`, every evaluation to
//! `<out>/curves.csv`, each rewritten after every run (a stopped comparison leaves the table of
//! the runs it finished). The CPU axis is the process's own CPU time, so a busy machine does not
//! move it much, but another CPU model does.
//!
//! The keys the comparison sets itself are refused in `--set` and `--set-for`, naming the flag
//! that sets them ([`OWNED_KEYS`]); `eval.interval` is `--eval-interval` for every entry, and
//! one entry may have its own with `--set-for LABEL:eval.interval=N`. Every run's config is
//! built and preflighted before the first run starts, and every problem is reported at once.
//!
//! An `--out` that already holds a comparison (its `comparison.md`, `curves.csv` or
//! `comparison.png`, or a run of one of this invocation's entries and seeds) is refused unless
//! `--reuse` continues it (a finished run is kept when its stored `config.resolved.toml` equals
//! the config this invocation builds for it, bookkeeping keys aside; a run made with other
//! settings is refused, naming the differences; an unfinished one is moved aside and run again)
//! or `--overwrite` starts it again (every run is moved aside into its own
//! `seed_<N>/previous-<Unix time>/` as it runs again, and the earlier outputs into
//! `<out>/previous-<Unix time>/`). Nothing is deleted.
//!
//! `--from-curves FILE` (repeatable) runs nothing: it rebuilds the table, the plot and one
//! `curves.csv` from the `curves.csv` of earlier comparisons, so that runs made in several
//! invocations (or kept as data after their run directories are gone) make one table. A run
//! (method and seed) that two files both hold is refused; so is an `--out` that holds
//! comparison outputs, unless `--overwrite` moves them aside.

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "common/mod.rs"]
mod common;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use burn::backend::Autodiff;
use clap::Parser;
use trainer_fsdp::compare::{
    ComparisonEntry, RunCurve, comparison_entries, comparison_table, curves_csv, gains_by_seed,
    read_curves_csv, run_curve, write_plot,
};
use trainer_fsdp::config::{RESOLVED_CONFIG_FILE, algorithm_overrides};
use trainer_fsdp::run_dir::{
    ADDED_KEYS, ConfigDifference, LOCK_FILE, PREVIOUS_PREFIX, config_differences, free_to_change,
};
use trainer_fsdp::{Override, Preflight, RecipeName, StopFlag, TrainConfig, names, read_jsonl};

/// The algorithm comparison on the CPU backend.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The methods, comma-separated (`--algorithm` names of the main example); `''` for none,
    /// to run `--variant` entries alone.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "flow_grpo,awm,nft,dpo,dpok,grpo_guard,mix_grpo,dance_grpo,flow_grpo_fast,fdfo,raft"
    )]
    methods: Vec<String>,
    /// A labelled variant of a method, `LABEL=METHOD` (repeatable): one more entry of the
    /// table, its runs in `<out>/<LABEL>/`.
    #[arg(long = "variant", value_name = "LABEL=METHOD")]
    variants: Vec<String>,
    /// An override for one entry, `LABEL:KEY=VALUE` (repeatable; a method's label is its
    /// name), applied after `--set`. Any key `--set` takes, and `eval.interval` (that entry's
    /// own `--eval-interval`).
    #[arg(long = "set-for", value_name = "LABEL:KEY=VALUE")]
    set_for: Vec<String>,
    /// Seeds per entry (at least 1): `--first-seed` and the ones after it.
    #[arg(long, default_value_t = 5)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    first_seed: u64,
    /// Training CPU seconds each run may spend (`run.cpu_budget_seconds`; each run ends when
    /// it is spent).
    #[arg(long, default_value_t = 600.0)]
    budget: f64,
    /// Rollouts between evaluations (`eval.interval`) of every entry; `--set-for
    /// LABEL:eval.interval=N` gives one entry its own.
    #[arg(long, default_value_t = 10)]
    eval_interval: u64,
    /// The recipe every method starts from.
    #[arg(long, default_value = "shapes_world_lora")]
    recipe: String,
    /// `key=value` overrides applied to every run, after the method's preset (repeatable).
    /// Not the keys the comparison sets itself, refused naming the flag that sets each:
    /// recipe (--recipe), run.seed (--seeds, --first-seed), run.cpu_budget_seconds and
    /// run.num_rollouts (--budget), eval.interval (--eval-interval), algorithm.kind (--methods,
    /// --variant), checkpoint.dir and artifacts.root (--out), checkpoint.overwrite, .resume and
    /// .resume_from (--reuse, --overwrite), nor a section holding one of them.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Where the runs and the results go. One that already holds a comparison (its
    /// comparison.md, curves.csv or comparison.png, or a run of these entries and seeds) is
    /// refused unless `--reuse` or `--overwrite` says what to do with it.
    #[arg(long, default_value = "runs/compare")]
    out: PathBuf,
    /// Continue the comparison in `--out`: keep each finished run (its budget spent) whose
    /// stored config.resolved.toml equals the config this invocation builds for it (checkpoint,
    /// artifact and monitor keys, the recipe's name and run.host_threads aside) instead of
    /// running it again; refuse, before anything runs, every run there made with other
    /// settings, naming the differences; move an unfinished run aside and run it again. The
    /// earlier comparison.md, curves.csv and comparison.png are replaced when every run they
    /// hold is kept, and moved into `<out>/previous-<Unix time>/` otherwise.
    #[arg(long, conflicts_with = "overwrite")]
    reuse: bool,
    /// Start the comparison in `--out` again: every run of these entries and seeds already
    /// there is moved aside into its `seed_<N>/previous-<Unix time>/` as it runs again, and
    /// the earlier comparison.md, curves.csv and comparison.png into
    /// `<out>/previous-<Unix time>/` before anything is written (nothing is deleted). With
    /// `--from-curves`, the outputs alone.
    #[arg(long)]
    overwrite: bool,
    /// Run nothing: build the table and the plot from the `curves.csv` of earlier comparisons
    /// (repeatable; every run in them, in order). The run options do not apply.
    #[arg(
        long = "from-curves",
        value_name = "CSV",
        conflicts_with_all = ["methods", "variants", "set_for", "reuse", "overrides", "seeds", "first_seed", "budget", "eval_interval", "recipe"]
    )]
    from_curves: Vec<PathBuf>,
}

/// The keys the comparison sets in every run, each with the flags that set it: refused in
/// `--set` and `--set-for`, as is a section that holds one (`run={ ... }`), so that no flag is
/// accepted and then overridden and no run differs from what the table says it is.
const OWNED_KEYS: &[(&str, &str)] = &[
    ("recipe", "--recipe"),
    ("run.seed", "--seeds and --first-seed"),
    ("run.cpu_budget_seconds", "--budget"),
    (
        "run.num_rollouts",
        "--budget (a run ends when its budget is spent; the comparison sets a rollout count it never reaches)",
    ),
    ("algorithm.kind", "--methods and --variant LABEL=METHOD"),
    ("checkpoint.dir", "--out"),
    ("artifacts.root", "--out"),
    ("checkpoint.overwrite", "--reuse and --overwrite"),
    ("checkpoint.resume", "--reuse and --overwrite"),
    ("checkpoint.resume_from", "--reuse and --overwrite"),
];

/// The keys a flag sets for every entry that `--set-for` may set for one entry (refused in
/// `--set`, like [`OWNED_KEYS`]).
const ENTRY_KEYS: &[(&str, &str)] = &[(
    "eval.interval",
    "--eval-interval (or --set-for LABEL:eval.interval=N for one entry)",
)];

/// The bookkeeping keys of [`free_to_change`] that shape a run's curve all the same, so that
/// `--reuse` compares them.
const CURVE_KEYS: &[&str] = &[
    "run.num_rollouts",
    "run.cpu_budget_seconds",
    "eval.interval",
];

/// The outputs of a comparison in its `--out`.
const OUTPUTS: &[&str] = &["comparison.md", "curves.csv", "comparison.png"];

fn main() -> Result<()> {
    common::keep_freed_pages();
    let args = Args::parse();
    let curves = if args.from_curves.is_empty() {
        run_all(&args)?
    } else {
        from_curves(&args)?
    };
    if curves.is_empty() {
        bail!("no runs: the --from-curves files hold no rows");
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
    // each argument quoted as a shell reads it back
    let w = trainer_fsdp::sweep::shell_word;
    let mut header = String::from("Command: `cargo run --release --example compare_algorithms --");
    if !args.from_curves.is_empty() {
        for f in &args.from_curves {
            let _ = write!(header, " --from-curves {}", w(&f.display().to_string()));
        }
        header.push_str("` (the runs' own commands made the files)\n");
        return header;
    }
    let _ = write!(
        header,
        " --methods {} --seeds {} --first-seed {} --budget {} --eval-interval {} --recipe {}",
        w(&args.methods.join(",")),
        args.seeds,
        args.first_seed,
        args.budget,
        args.eval_interval,
        args.recipe,
    );
    for o in &args.overrides {
        let _ = write!(header, " --set {}", w(o));
    }
    for v in &args.variants {
        let _ = write!(header, " --variant {}", w(v));
    }
    for o in &args.set_for {
        let _ = write!(header, " --set-for {}", w(o));
    }
    header.push_str("`\n");
    header
}

/// One run of the comparison, its config built and preflighted before the first run starts.
struct Planned {
    label: String,
    seed: u64,
    dir: PathBuf,
    cfg: TrainConfig,
    pre: Preflight,
    /// A finished run with this config is in `dir`: read it back instead of running it.
    reuse: bool,
}

/// Every entry's runs (or, with `--reuse`, the finished ones read back), writing the outputs
/// of those so far after each. Every run is planned and checked first.
fn run_all(args: &Args) -> Result<Vec<RunCurve>> {
    let plan = plan(args)?;
    let stop = StopFlag::install()?;
    let mut curves: Vec<RunCurve> = Vec::new();
    let total = plan.len();
    for (i, run) in plan.iter().enumerate() {
        let (label, seed, dir) = (&run.label, run.seed, &run.dir);
        let done = i + 1;
        if run.reuse {
            println!(
                "[{done}/{total}] {label}, seed {seed}: reusing {}",
                dir.display()
            );
        } else {
            println!("[{done}/{total}] {label}, seed {seed}: {}", dir.display());
            trainer_fsdp::dispatch::train::<Autodiff<flowrl::backend::Cpu>>(
                &run.cfg,
                &run.pre,
                dir,
                &Default::default(),
                &stop,
            )
            .with_context(|| format!("{label}, seed {seed}"))?;
            if stop.is_set() {
                bail!("stopped: the runs so far are in {}", args.out.display());
            }
        }
        let curve = run_curve(
            label,
            seed,
            &dir.join("metrics.jsonl"),
            run.cfg.eval.second_judge().as_deref(),
        )?;
        if let (Some(a), Some(b)) = (curve.base(), curve.last()) {
            let second = if a.second.is_nan() || b.second.is_nan() {
                String::new()
            } else {
                format!(
                    "; second judge {:.3} -> {:.3} ({:+.3})",
                    a.second,
                    b.second,
                    b.second - a.second
                )
            };
            println!(
                "{label}, seed {seed}: held-out {:.3} ± {:.3} -> {:.3} ± {:.3} ({:+.3}) in {:.0} training CPU s{second}",
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
    Ok(curves)
}

/// Every run of the comparison, built, preflighted and checked against what `--out` already
/// holds, before anything runs; every problem is reported at once. Moves the earlier outputs
/// aside when `--overwrite` or `--reuse` says so.
fn plan(args: &Args) -> Result<Vec<Planned>> {
    let mut problems: Vec<String> = Vec::new();
    let entries = match comparison_entries(&args.methods, &args.variants, &args.set_for) {
        Ok(e) => e,
        Err(e) => {
            problems.push(e.to_string());
            Vec::new()
        }
    };
    if entries.is_empty() && problems.is_empty() {
        problems.push("no entries: --methods '' needs at least one --variant LABEL=METHOD".into());
    }
    let last_seed = if args.seeds == 0 {
        problems.push("--seeds 0: expected at least 1 seed per entry".into());
        None
    } else {
        let last = args.first_seed.checked_add(args.seeds - 1);
        if last.is_none() {
            problems.push(format!(
                "--first-seed {} --seeds {}: the last seed would be past {} (the largest seed)",
                args.first_seed,
                args.seeds,
                u64::MAX
            ));
        }
        last
    };
    if !(args.budget.is_finite() && args.budget > 0.0) {
        problems.push(format!(
            "--budget {}: expected CPU seconds > 0",
            args.budget
        ));
    }
    if args.eval_interval == 0 {
        problems.push(
            "--eval-interval 0: the comparison needs evaluations (expected at least 1)".into(),
        );
    }
    let recipe = RecipeName::parse(&args.recipe)
        .map_err(|e| problems.push(format!("--recipe {}: {e}", args.recipe)))
        .ok();
    if args.out.to_str().is_none() {
        problems.push(format!(
            "--out {}: not valid UTF-8 (the runs' configs hold their directories as text)",
            args.out.display()
        ));
    }
    for o in &args.overrides {
        problems.extend(owned_key(&format!("--set {o}"), o, false));
    }
    for e in &entries {
        for o in &e.overrides {
            problems.extend(owned_key(&format!("--set-for {}:{o}", e.label), o, true));
        }
    }
    let (Some(recipe), Some(last_seed), true) = (recipe, last_seed, problems.is_empty()) else {
        bail!(refusal(&problems, &[]));
    };

    // every run's config, its preflight and what its directory holds
    let mut per_run: Vec<(String, u64, String)> = Vec::new();
    let mut plan: Vec<Planned> = Vec::new();
    let mut held: Vec<String> = Vec::new(); // runs in --out, without --reuse or --overwrite
    let mut moved: Vec<String> = Vec::new(); // runs that will be moved aside and run again
    for entry in &entries {
        for seed in args.first_seed..=last_seed {
            let label = &entry.label;
            let dir = args.out.join(label).join(format!("seed_{seed}"));
            let mut problem = |p: String| per_run.push((label.clone(), seed, p));
            let cfg = match config(recipe, entry, seed, args, &dir) {
                Ok(c) => c,
                Err(e) => {
                    problem(format!("{e:#}"));
                    continue;
                }
            };
            if cfg.eval.interval == 0 {
                problem(
                    "eval.interval = 0 (its --set-for): the comparison needs evaluations \
                     (expected at least 1)"
                        .into(),
                );
            }
            if !cfg.monitor.jsonl {
                problem(
                    "monitor.jsonl = false: the comparison reads each run's metrics.jsonl".into(),
                );
            }
            let pre = match cfg.preflight() {
                Ok(p) => p,
                Err(e) => {
                    problem(e.to_string());
                    continue;
                }
            };
            let found = run_files(&dir)?;
            let mut reuse = false;
            if !found.is_empty() {
                let at = format!("{label}/seed_{seed}");
                if args.overwrite {
                    moved.push(at);
                } else if args.reuse {
                    let done = finished(&dir.join("metrics.jsonl"), args.budget)?;
                    match stored_differences(&dir.join(RESOLVED_CONFIG_FILE), &cfg)? {
                        Some(d) if !d.is_empty() => problem(format!(
                            "--reuse: {}/{label}/seed_<N> holds a run made with other settings \
                             (its {RESOLVED_CONFIG_FILE} -> this invocation's):{}\n\
                             (--overwrite runs it again, moving it aside; or choose another --out)",
                            args.out.display(),
                            d.iter().map(|d| format!("\n  {d}")).collect::<String>()
                        )),
                        None if done => problem(format!(
                            "--reuse: {}/{label}/seed_<N> holds a finished run without its \
                             {RESOLVED_CONFIG_FILE}, so which settings it ran with is unknown \
                             (--overwrite runs it again, moving it aside; or choose another --out)",
                            args.out.display()
                        )),
                        _ if done => reuse = true,
                        _ => moved.push(at),
                    }
                } else {
                    held.push(at);
                }
            }
            plan.push(Planned {
                label: label.clone(),
                seed,
                dir,
                cfg,
                pre,
                reuse,
            });
        }
    }
    let outputs = existing_outputs(&args.out);
    let untouched = held.is_empty() && outputs.is_empty();
    if !args.reuse && !args.overwrite && !untouched {
        let mut what = Vec::new();
        if !outputs.is_empty() {
            what.push(format!(
                "the outputs of an earlier comparison ({})",
                names_of(&outputs)
            ));
        }
        if !held.is_empty() {
            what.push(format!(
                "{} run(s) of these entries and seeds ({})",
                held.len(),
                shorten(&held)
            ));
        }
        problems.push(format!(
            "--out {} already holds {}: give --reuse to keep its finished runs and run the rest, \
             --overwrite to run everything again (moving the earlier runs and outputs aside; \
             nothing is deleted), or another --out",
            args.out.display(),
            what.join(" and ")
        ));
    }
    if !problems.is_empty() || !per_run.is_empty() {
        bail!(refusal(&problems, &per_run));
    }

    // every check passed: say what happens to what --out held
    if !moved.is_empty() {
        println!(
            "{} run(s) in {} will be moved aside into their own {PREVIOUS_PREFIX}<Unix time>/ \
             and run again ({}): {}",
            moved.len(),
            args.out.display(),
            if args.overwrite {
                "--overwrite"
            } else {
                "--reuse, not finished"
            },
            shorten(&moved)
        );
    }
    if !outputs.is_empty() {
        let kept: BTreeSet<(&str, u64)> = plan
            .iter()
            .filter(|r| r.reuse)
            .map(|r| (r.label.as_str(), r.seed))
            .collect();
        let replaceable = args.reuse
            && read_curves_csv(&args.out.join("curves.csv"), &[]).is_ok_and(|old| {
                old.iter()
                    .all(|c| kept.contains(&(c.method.as_str(), c.seed)))
            });
        if replaceable {
            println!(
                "the earlier {} in {} hold only runs this comparison keeps: replaced as it goes",
                names_of(&outputs),
                args.out.display()
            );
        } else {
            let to = move_outputs_aside(&args.out, &outputs)?;
            println!(
                "moved the earlier {} aside into {}{}",
                names_of(&outputs),
                to.display(),
                if args.reuse {
                    " (they hold runs this comparison does not keep)"
                } else {
                    ""
                }
            );
        }
    }
    Ok(plan)
}

/// The problem of a `--set` (`per_entry`: `--set-for`) override `given` (shown as `flag`) of
/// a key the comparison sets itself, if it is one.
fn owned_key(flag: &str, given: &str, per_entry: bool) -> Option<String> {
    let o = match Override::parse(given) {
        Ok(o) => o,
        Err(e) => return Some(format!("{flag}: {e}")),
    };
    let entry_keys: &[(&str, &str)] = if per_entry { &[] } else { ENTRY_KEYS };
    OWNED_KEYS.iter().chain(entry_keys).find_map(|(key, by)| {
        let parts: Vec<&str> = key.split('.').collect();
        let covers = o.path.len() <= parts.len() && o.path.iter().zip(&parts).all(|(a, b)| a == b);
        covers.then(|| {
            let what = if o.path.len() == parts.len() {
                format!("{key} is")
            } else {
                format!("it replaces {key}, which is")
            };
            format!("{flag}: {what} set by the comparison itself, from {by}")
        })
    })
}

/// The refusal of the whole comparison: the `general` problems, then each run's (grouped by
/// entry and message, naming the seeds).
fn refusal(general: &[String], per_run: &[(String, u64, String)]) -> String {
    let mut groups: Vec<(&str, &str, Vec<u64>)> = Vec::new();
    for (label, seed, p) in per_run {
        match groups.iter_mut().find(|(l, m, _)| l == label && m == p) {
            Some(g) => g.2.push(*seed),
            None => groups.push((label, p, vec![*seed])),
        }
    }
    let n = general.len() + groups.len();
    let mut text = format!("the comparison was refused before any run started ({n} problem(s)):");
    let mut item = |head: String, body: &str| {
        let body = body.replace('\n', "\n    ");
        let _ = write!(text, "\n  - {head}{body}");
    };
    for p in general {
        item(String::new(), p);
    }
    for (label, p, seeds) in &groups {
        item(format!("{label}, {}: ", seeds_text(seeds)), p);
    }
    text
}

/// `seed 3`, `seeds 0-4` or `seeds 0, 2`.
fn seeds_text(seeds: &[u64]) -> String {
    match seeds {
        [s] => format!("seed {s}"),
        [a, .., b] if seeds.windows(2).all(|w| w[1] == w[0] + 1) => format!("seeds {a}-{b}"),
        _ => format!(
            "seeds {}",
            seeds
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The first few of `items`, and how many more.
fn shorten(items: &[String]) -> String {
    const SHOWN: usize = 6;
    let mut s = items
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > SHOWN {
        let _ = write!(s, " and {} more", items.len() - SHOWN);
    }
    s
}

/// The file names of `paths`, comma-separated.
fn names_of(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| {
            p.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned()
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The comparison outputs ([`OUTPUTS`]) that `out` holds.
fn existing_outputs(out: &Path) -> Vec<PathBuf> {
    OUTPUTS
        .iter()
        .map(|n| out.join(n))
        .filter(|p| p.symlink_metadata().is_ok())
        .collect()
}

/// Moves `outputs` (in `out`) into a fresh `<out>/previous-<Unix time>/`, which it returns.
fn move_outputs_aside(out: &Path, outputs: &[PathBuf]) -> Result<PathBuf> {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut dest = out.join(format!("{PREVIOUS_PREFIX}{t}"));
    let mut n = 2;
    while dest.symlink_metadata().is_ok() {
        dest = out.join(format!("{PREVIOUS_PREFIX}{t}-{n}"));
        n += 1;
    }
    std::fs::create_dir_all(&dest).with_context(|| format!("create {}", dest.display()))?;
    for p in outputs {
        let to = dest.join(p.file_name().unwrap_or_default());
        std::fs::rename(p, &to)
            .with_context(|| format!("move {} aside into {}", p.display(), to.display()))?;
    }
    durable::sync_dir(&dest)?;
    durable::sync_dir(out)?;
    Ok(dest)
}

/// What a run directory holds besides its lock file and the earlier runs moved aside into
/// it (`previous-*`): what running there again would move aside.
fn run_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let list = match std::fs::read_dir(dir) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("list {}", dir.display())),
    };
    let mut found = Vec::new();
    for e in list {
        let e = e.with_context(|| format!("list {}", dir.display()))?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name != LOCK_FILE && !name.starts_with(PREVIOUS_PREFIX) {
            found.push(e.path());
        }
    }
    Ok(found)
}

/// The differences that matter to the comparison between the resolved config stored at
/// `path` and `cfg` (every key but the bookkeeping ones of [`free_to_change`], of which
/// [`CURVE_KEYS`] are compared all the same), with the keys added since older configs were
/// written read as run_dir does ([`ADDED_KEYS`]); `None` when there is no stored config.
fn stored_differences(path: &Path, cfg: &TrainConfig) -> Result<Option<Vec<ConfigDifference>>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
    };
    // The TOML types are trainer_fsdp's dependency's, not this package's: an empty table
    // value to fill, and the documents parsed into its table by inference.
    let mut stored = Override::parse("v={}")?.value;
    let mut new = stored.clone();
    *stored.as_table_mut().context("an empty TOML table")? = text
        .parse()
        .with_context(|| format!("parse {}", path.display()))?;
    *new.as_table_mut().context("an empty TOML table")? = cfg
        .to_toml_string()?
        .parse()
        .context("parse the resolved config")?;
    for (section, key, value, kind) in ADDED_KEYS {
        if let Some(t) = stored.get_mut(*section).and_then(|v| v.as_table_mut()) {
            let applies = kind.is_none_or(|k| t.get("kind").and_then(|v| v.as_str()) == Some(k));
            if applies {
                t.entry(*key).or_insert_with(|| (*value).to_string().into());
            }
        }
    }
    Ok(Some(
        config_differences(&stored, &new)
            .into_iter()
            .filter(|d| !free_to_change(&d.key) || CURVE_KEYS.contains(&d.key.as_str()))
            .collect(),
    ))
}

/// The runs of earlier comparisons' curves files, after checking that `--out` holds no
/// comparison outputs (or, with `--overwrite`, moving them aside once every file is read).
fn from_curves(args: &Args) -> Result<Vec<RunCurve>> {
    let outputs = existing_outputs(&args.out);
    if !outputs.is_empty() && !args.overwrite {
        bail!(
            "--out {} already holds the outputs of an earlier comparison ({}): give --overwrite \
             to move them aside into {}/{PREVIOUS_PREFIX}<Unix time>/ and write the new ones, or \
             another --out",
            args.out.display(),
            names_of(&outputs),
            args.out.display()
        );
    }
    let mut curves: Vec<RunCurve> = Vec::new();
    for f in &args.from_curves {
        let more = read_curves_csv(f, &curves)?;
        println!("{}: {} runs", f.display(), more.len());
        curves.extend(more);
    }
    if !outputs.is_empty() && !curves.is_empty() {
        let to = move_outputs_aside(&args.out, &outputs)?;
        println!(
            "moved the earlier {} aside into {} (--overwrite)",
            names_of(&outputs),
            to.display()
        );
    }
    Ok(curves)
}

/// The run of `entry` and `seed` in `dir`: the recipe, the comparison's own keys, the method's
/// preset, `--set`, then the entry's `--set-for` (neither of which may set the comparison's
/// own keys, [`OWNED_KEYS`]).
fn config(
    recipe: RecipeName,
    entry: &ComparisonEntry,
    seed: u64,
    args: &Args,
    dir: &Path,
) -> Result<TrainConfig> {
    let text = |key: &str, value: String| Override {
        path: key.split('.').map(str::to_string).collect(),
        value: value.into(),
        unset: false,
        scale: false,
    };
    let d = dir.to_string_lossy();
    let mut o = vec![
        text("checkpoint.dir", format!("{d}/checkpoints")),
        text("artifacts.root", format!("{d}/artifacts")),
        // an earlier run in the directory is moved aside: only where --overwrite, or --reuse
        // for an unfinished one, says so (`plan` refuses the rest)
        Override::parse(&format!(
            "checkpoint.overwrite={}",
            args.overwrite || args.reuse
        ))?,
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
    // a budgeted run has no last step for a decaying rate to reach
    o.extend(Override::parse_all(&[
        "optimizer.lr_scheduler=\"constant\"",
        "optimizer.lr_decay_iters=",
        "optimizer.min_lr=0.0",
    ])?);
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
