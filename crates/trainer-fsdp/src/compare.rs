//! The algorithm comparison: every method's held-out reward against the CPU seconds it spent
//! training (`perf/train_cpu_seconds`: rollouts, scoring, updates and checkpoints; evaluations
//! excluded), over seeds, read back from each run's `metrics.jsonl`. The
//! `compare_algorithms` example runs the methods and writes what this module builds: a
//! Markdown table and a plot.
//!
//! ```
//! use trainer_fsdp::compare::{CurvePoint, RunCurve, comparison_table};
//! let p = |cpu, reward| CurvePoint { cpu_seconds: cpu, reward, stderr: 0.01, second: f64::NAN };
//! let curves = vec![
//!     RunCurve { method: "flow_grpo".into(), seed: 0, points: vec![p(0.0, 0.2), p(100.0, 0.3)] },
//!     RunCurve { method: "nft".into(), seed: 0, points: vec![p(0.0, 0.2), p(10.0, 0.31), p(50.0, 0.4)] },
//! ];
//! let t = comparison_table(&curves, "flow_grpo");
//! // NFT reaches FlowGRPO's final reward (0.3) after 10 CPU seconds, a tenth of its 100
//! assert!(t.contains("| nft | 1 |"), "{t}");
//! assert!(t.contains("| 10 (0.10x) |"), "{t}");
//! ```

use std::path::Path;

use crate::error::TrainerError;
use crate::monitor::{Axes, Series, names, plot_curves, read_jsonl, write_png};
use crate::run::{EVAL_REWARD, EVAL_REWARD_SE};
use crate::sweep::Spread;

/// One entry of a comparison: its label (the table's row, and the runs' directory
/// `<out>/<label>/seed_<N>`), the method it runs (an `--algorithm` name of the main example)
/// and its own `key=value` overrides, applied after the method's preset and the overrides every
/// entry shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComparisonEntry {
    /// The label.
    pub label: String,
    /// The method.
    pub method: String,
    /// The entry's own overrides, in order.
    pub overrides: Vec<String>,
}

/// The entries of a comparison: each of `methods` under its own name, then each of
/// `variants` (`LABEL=METHOD`, e.g. `awm_trust=awm`), with every `set_for`
/// (`LABEL:KEY=VALUE`, e.g. `awm_trust:algorithm.kl_coef=0.001`) appended to its label's
/// overrides. Empty method names are skipped, so that `--methods ''` runs the variants alone.
///
/// # Errors
/// [`TrainerError::ComparisonEntry`] for an unknown method, a label that is empty, repeated or
/// not lowercase letters, digits and `_`, a malformed variant or override, or an override
/// for a label no entry has.
///
/// ```
/// use trainer_fsdp::compare::comparison_entries;
/// let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
/// let e = comparison_entries(
///     &s(&["flow_grpo", "awm"]),
///     &s(&["awm_trust=awm"]),
///     &s(&["awm_trust:algorithm.kl_coef=0.001"]),
/// )
/// .unwrap();
/// assert_eq!(e.len(), 3);
/// assert_eq!((e[2].label.as_str(), e[2].method.as_str()), ("awm_trust", "awm"));
/// assert_eq!(e[2].overrides, ["algorithm.kl_coef=0.001"]);
/// assert!(e[1].overrides.is_empty());
/// // a variant alone, without its method
/// let e = comparison_entries(&s(&[""]), &s(&["awm_trust=awm"]), &[]).unwrap();
/// assert_eq!(e.len(), 1);
/// ```
pub fn comparison_entries(
    methods: &[String],
    variants: &[String],
    set_for: &[String],
) -> Result<Vec<ComparisonEntry>, TrainerError> {
    let bad = |given: &str, problem: String| TrainerError::ComparisonEntry {
        given: given.to_string(),
        problem,
    };
    let known = crate::config::ALGORITHM_NAMES;
    let mut entries: Vec<ComparisonEntry> = Vec::new();
    let pairs = methods
        .iter()
        .filter(|m| !m.trim().is_empty())
        .map(|m| (m.as_str(), m.as_str(), m.as_str()))
        .chain(variants.iter().map(|v| {
            let (label, method) = v.split_once('=').unwrap_or(("", v.as_str()));
            (v.as_str(), label.trim(), method.trim())
        }));
    for (given, label, method) in pairs {
        if !known.contains(&method) {
            return Err(bad(
                given,
                format!(
                    "unknown method {method:?}; a variant is LABEL=METHOD and the methods are {}",
                    known.join(", ")
                ),
            ));
        }
        if label.is_empty()
            || !label
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(bad(
                given,
                format!(
                    "label {label:?}: expected lowercase letters, digits and '_' (LABEL=METHOD)"
                ),
            ));
        }
        if entries.iter().any(|e| e.label == label) {
            return Err(bad(given, format!("label {label:?} appears twice")));
        }
        entries.push(ComparisonEntry {
            label: label.to_string(),
            method: method.to_string(),
            overrides: Vec::new(),
        });
    }
    for given in set_for {
        let Some((label, o)) = given.split_once(':') else {
            return Err(bad(
                given,
                "expected LABEL:KEY=VALUE, e.g. awm_trust:algorithm.kl_coef=0.001".into(),
            ));
        };
        crate::Override::parse(o).map_err(|e| bad(given, e.to_string()))?;
        let Some(i) = entries.iter().position(|e| e.label == label.trim()) else {
            let labels: Vec<&str> = entries.iter().map(|e| e.label.as_str()).collect();
            return Err(bad(
                given,
                format!(
                    "no entry is labelled {label:?}; the labels are {}",
                    labels.join(", ")
                ),
            ));
        };
        entries[i].overrides.push(o.to_string());
    }
    Ok(entries)
}

/// One evaluation of a run: the held-out reward after `cpu_seconds` of training.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CurvePoint {
    /// Training CPU seconds so far (0 for the starting policy).
    pub cpu_seconds: f64,
    /// The held-out reward.
    pub reward: f64,
    /// Its standard error.
    pub stderr: f64,
    /// The second judgement of the same pictures (the recipe's
    /// [`crate::config::EvalSection::second_judge`]); NaN where none was logged.
    pub second: f64,
}

/// One run's evaluations, in order, the starting policy's first.
#[derive(Debug, Clone, PartialEq)]
pub struct RunCurve {
    /// The method (its `--algorithm` name).
    pub method: String,
    /// The run's seed.
    pub seed: u64,
    /// The evaluations.
    pub points: Vec<CurvePoint>,
}

impl RunCurve {
    /// The first evaluation (the starting policy).
    pub fn base(&self) -> Option<CurvePoint> {
        self.points.first().copied()
    }

    /// The last evaluation.
    pub fn last(&self) -> Option<CurvePoint> {
        self.points.last().copied()
    }

    /// The training CPU seconds of the first evaluation after the start whose reward reaches
    /// `target`, if any.
    pub fn cpu_to_reach(&self, target: f64) -> Option<f64> {
        self.points
            .iter()
            .skip(1)
            .find(|p| p.reward >= target)
            .map(|p| p.cpu_seconds)
    }
}

/// A run's curve from its `metrics.jsonl`: every record with an evaluation, at the CPU
/// seconds that record logged (the starting evaluation, logged before any rollout, at 0). An
/// evaluation whose reward was not finite (logged as `null`) is a point with a NaN reward.
/// `second_judge` names the `eval.judges` component read as each point's second judgement
/// (`eval/judge/<component>`); NaN where the record lacks it or none is named.
///
/// # Errors
/// Reading or parsing the log; [`TrainerError::NoEvaluations`] when it holds none.
pub fn run_curve(
    method: &str,
    seed: u64,
    jsonl: &Path,
    second_judge: Option<&str>,
) -> Result<RunCurve, TrainerError> {
    let second_key = second_judge.map(names::eval_judge);
    let mut points = Vec::new();
    for r in read_jsonl(jsonl)? {
        let get = |k: &str| r.metrics.get(k).copied().flatten();
        // the log writes a non-finite value as `null`: a record that holds the key evaluated,
        // and a `null` there is an evaluation that diverged, kept as NaN (not skipped, which
        // would make an earlier evaluation the run's last)
        let Some(reward) = r.metrics.get(EVAL_REWARD).copied() else {
            continue;
        };
        points.push(CurvePoint {
            cpu_seconds: get(names::PERF_TRAIN_CPU_SECONDS).unwrap_or(0.0),
            reward: reward.unwrap_or(f64::NAN),
            stderr: get(EVAL_REWARD_SE).unwrap_or(f64::NAN),
            second: second_key.as_deref().and_then(get).unwrap_or(f64::NAN),
        });
    }
    if points.is_empty() {
        return Err(TrainerError::NoEvaluations {
            path: jsonl.to_path_buf(),
        });
    }
    Ok(RunCurve {
        method: method.to_string(),
        seed,
        points,
    })
}

/// The header of a comparison's curves file ([`curves_csv`]).
pub const CURVES_CSV_HEADER: &str = "method,seed,training_cpu_seconds,reward,stderr,second_judge";

/// The header of the curves files written before the second judgement was a column: read as
/// curves whose second judgement is NaN.
pub const CURVES_CSV_HEADER_V1: &str = "method,seed,training_cpu_seconds,reward,stderr";

/// Every evaluation of `curves` as CSV, one row per evaluation under [`CURVES_CSV_HEADER`]:
/// the comparison's data, from which [`read_curves_csv`] rebuilds the curves (CPU seconds to
/// the millisecond, rewards, standard errors and second judgements to 1e-6).
pub fn curves_csv(curves: &[RunCurve]) -> String {
    let mut csv = format!("{CURVES_CSV_HEADER}\n");
    for c in curves {
        for p in &c.points {
            csv.push_str(&format!(
                "{},{},{:.3},{:.6},{:.6},{:.6}\n",
                c.method, c.seed, p.cpu_seconds, p.reward, p.stderr, p.second
            ));
        }
    }
    csv
}

/// The curves of a curves file written by [`curves_csv`] (a comparison's `curves.csv`), in
/// the file's order: the rows of one method and seed make one run's curve, in row order.
///
/// A run is one block of consecutive rows, so two files of runs (of different methods, or of
/// other seeds) concatenate into one comparison, and a run that appears twice is refused
/// rather than merged. A file under [`CURVES_CSV_HEADER_V1`] (written before the second
/// judgement was a column) reads with NaN second judgements.
///
/// # Errors
/// Reading the file; [`TrainerError::CurvesCsv`] naming the line for a wrong header, a row
/// without the header's fields, a field that is not a number, or a run (method and seed) whose rows
/// are not consecutive or that `seen` already holds. A NaN reward (an evaluation that
/// diverged, as [`run_curve`] reads it) and a NaN standard error are data.
pub fn read_curves_csv(path: &Path, seen: &[RunCurve]) -> Result<Vec<RunCurve>, TrainerError> {
    let text = std::fs::read_to_string(path).map_err(crate::error::io_err(path, "read"))?;
    let bad = |line: usize, problem: String| TrainerError::CurvesCsv {
        path: path.to_path_buf(),
        line,
        problem,
    };
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim_end()));
    let fields = match lines.next() {
        Some((_, h)) if h == CURVES_CSV_HEADER => 6,
        Some((_, h)) if h == CURVES_CSV_HEADER_V1 => 5,
        other => {
            return Err(bad(
                1,
                format!(
                    "header {:?}: expected {CURVES_CSV_HEADER:?} (or the older \
                     {CURVES_CSV_HEADER_V1:?})",
                    other.map_or("", |(_, h)| h)
                ),
            ));
        }
    };
    let mut out: Vec<RunCurve> = Vec::new();
    for (n, line) in lines {
        if line.is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        let (method, seed, cpu, reward, stderr, second) = match f[..] {
            [m, s, c, r, e] if fields == 5 => (m, s, c, r, e, None),
            [m, s, c, r, e, j] if fields == 6 => (m, s, c, r, e, Some(j)),
            _ => {
                return Err(bad(
                    n,
                    format!("{line:?}: expected {fields} fields (the header's)"),
                ));
            }
        };
        let num = |name: &str, v: &str| {
            v.parse::<f64>()
                .map_err(|_| bad(n, format!("{name} {v:?}: expected a number")))
        };
        let seed: u64 = seed
            .parse()
            .map_err(|_| bad(n, format!("seed {seed:?}: expected a whole number")))?;
        let point = CurvePoint {
            cpu_seconds: num("training_cpu_seconds", cpu)?,
            reward: num("reward", reward)?,
            stderr: num("stderr", stderr)?,
            second: second.map_or(Ok(f64::NAN), |j| num("second_judge", j))?,
        };
        match out.last_mut() {
            Some(c) if c.method == method && c.seed == seed => c.points.push(point),
            _ => {
                let earlier = out
                    .iter()
                    .chain(seen)
                    .any(|c| c.method == method && c.seed == seed);
                if earlier {
                    return Err(bad(
                        n,
                        format!(
                            "{method}, seed {seed} appears a second time (a run's rows are one block, \
                             and each run is read once)"
                        ),
                    ));
                }
                out.push(RunCurve {
                    method: method.to_string(),
                    seed,
                    points: vec![point],
                });
            }
        }
    }
    Ok(out)
}

/// The methods of `curves`, in their first appearance's order.
fn methods(curves: &[RunCurve]) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for c in curves {
        if !out.contains(&c.method.as_str()) {
            out.push(&c.method);
        }
    }
    out
}

fn fmt_spread(s: Spread, signed: bool) -> String {
    if signed {
        format!("{:+.3} ({:+.3} to {:+.3})", s.mean, s.min, s.max)
    } else {
        format!("{:.3} ({:.3} to {:.3})", s.mean, s.min, s.max)
    }
}

/// `method`'s best mean evaluation after the start: the runs evaluate at the same rollouts,
/// so their `k`-th evaluations are averaged for every `k` that all of them have, and the
/// highest mean reward is returned with the mean training CPU seconds of those evaluations.
/// `None` when the method has no run or no evaluation after the start; a NaN reward makes
/// the result NaN, not a smaller sample.
pub fn best_mean_evaluation(curves: &[RunCurve], method: &str) -> Option<CurvePoint> {
    let runs: Vec<&RunCurve> = curves.iter().filter(|c| c.method == method).collect();
    let len = runs.iter().map(|c| c.points.len()).min()?;
    let mut best: Option<CurvePoint> = None;
    for k in 1..len {
        let at: Vec<CurvePoint> = runs.iter().map(|c| c.points[k]).collect();
        let mean = |f: fn(&CurvePoint) -> f64| at.iter().map(f).sum::<f64>() / at.len() as f64;
        let point = CurvePoint {
            cpu_seconds: mean(|p| p.cpu_seconds),
            reward: mean(|p| p.reward),
            stderr: mean(|p| p.stderr),
            second: mean(|p| p.second),
        };
        if point.reward.is_nan() {
            return Some(CurvePoint {
                cpu_seconds: f64::NAN,
                reward: f64::NAN,
                stderr: f64::NAN,
                second: f64::NAN,
            });
        }
        if best.is_none_or(|b| point.reward > b.reward) {
            best = Some(point);
        }
    }
    best
}

/// The median over `runs` of the CPU seconds at which each first reached `target`
/// ([`RunCurve::cpu_to_reach`]), over the runs that reached it, and how many did; `None` when
/// none did or `target` is NaN.
fn median_cpu_to_reach(runs: &[&RunCurve], target: f64) -> (Option<f64>, usize) {
    if target.is_nan() {
        return (None, 0);
    }
    let mut reached: Vec<f64> = runs.iter().filter_map(|c| c.cpu_to_reach(target)).collect();
    reached.sort_by(f64::total_cmp);
    (reached.get(reached.len() / 2).copied(), reached.len())
}

/// The comparison as a Markdown table, one row per method: seeds, base and final held-out
/// reward and the gain (mean, min to max over seeds), the second judgement's gain (`-` where
/// a run logged none), the gain's difference to
/// `target_method`'s paired by seed ([`paired_gain`]), the mean standard error of the final
/// evaluations, the training CPU seconds spent, and the CPU seconds at which the method first
/// reached `target_method`'s mean final reward and its best mean evaluation
/// ([`best_mean_evaluation`]; a method whose reward falls back ends below where it stood, so
/// its final reward alone makes every other method look fast): each the median over the
/// seeds that reached it, how many did, and its ratio to `target_method`'s CPU seconds (for
/// the final reward, the mean its runs spent; for the best, the median at which its own seeds
/// first reached it, so that its row reads 1.00x).
pub fn comparison_table(curves: &[RunCurve], target_method: &str) -> String {
    let target = curves
        .iter()
        .filter(|c| c.method == target_method)
        .filter_map(RunCurve::last)
        .collect::<Vec<_>>();
    let target_reward = Spread::of(&target.iter().map(|p| p.reward).collect::<Vec<_>>()).mean;
    let target_cpu = Spread::of(&target.iter().map(|p| p.cpu_seconds).collect::<Vec<_>>()).mean;
    let best = best_mean_evaluation(curves, target_method).map_or(f64::NAN, |p| p.reward);
    let target_runs: Vec<&RunCurve> = curves
        .iter()
        .filter(|c| c.method == target_method)
        .collect();
    let best_cpu = median_cpu_to_reach(&target_runs, best)
        .0
        .unwrap_or(f64::NAN);
    let mut out = format!(
        "| method | seeds | base | final | gain | second judge's gain | gain - {target_method}'s (paired seeds) | final SE (mean) | training CPU s | CPU s to {target_method}'s final {target_reward:.3} | CPU s to {target_method}'s best mean {best:.3} |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for m in methods(curves) {
        let runs: Vec<&RunCurve> = curves.iter().filter(|c| c.method == m).collect();
        let of = |f: &dyn Fn(&RunCurve) -> Option<f64>| {
            Spread::of(&runs.iter().filter_map(|c| f(c)).collect::<Vec<_>>())
        };
        let base = of(&|c| c.base().map(|p| p.reward));
        let last = of(&|c| c.last().map(|p| p.reward));
        let gain = of(&|c| Some(c.last()?.reward - c.base()?.reward));
        let second = of(&|c| Some(c.last()?.second - c.base()?.second));
        let second = if second.mean.is_nan() {
            "-".to_string()
        } else {
            fmt_spread(second, true)
        };
        let se = of(&|c| c.last().map(|p| p.stderr));
        let cpu = of(&|c| c.last().map(|p| p.cpu_seconds));
        let to = |target: f64, target_cpu: f64| match median_cpu_to_reach(&runs, target) {
            (Some(median), reached) => format!(
                "{median:.0} ({:.2}x){}",
                median / target_cpu,
                if reached == runs.len() {
                    String::new()
                } else {
                    format!(", {reached}/{} seeds", runs.len())
                }
            ),
            (None, _) => format!("not reached (0/{})", runs.len()),
        };
        let to_target = to(target_reward, target_cpu);
        let to_best = to(best, best_cpu);
        let paired = if m == target_method {
            "-".to_string()
        } else {
            match paired_gain(curves, m, target_method) {
                None => "no common seed".to_string(),
                Some(p) if p.seeds == 1 => format!("{:+.3} (1 seed)", p.mean),
                Some(p) => format!("{:+.3} ± {:.3} ({} seeds)", p.mean, p.stderr, p.seeds),
            }
        };
        out.push_str(&format!(
            "| {m} | {} | {} | {} | {} | {second} | {paired} | {:.3} | {:.0} | {to_target} | {to_best} |\n",
            runs.len(),
            fmt_spread(base, false),
            fmt_spread(last, false),
            fmt_spread(gain, true),
            se.mean,
            cpu.mean,
        ));
    }
    out
}

/// The difference of two methods' gains over the seeds both ran: each seed's gain of one
/// minus the other's, which takes out what the seed shares between them (its base policy, its
/// prompts, its evaluation seeds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairedGain {
    /// The mean difference.
    pub mean: f64,
    /// Its standard error over the seeds (`sd / sqrt(n)`; NaN with one seed).
    pub stderr: f64,
    /// The seeds both methods ran.
    pub seeds: usize,
}

/// `method`'s gain minus `other`'s, paired by seed; `None` when they share no seed with a
/// gain. A NaN gain of either makes the result NaN, not a smaller sample.
pub fn paired_gain(curves: &[RunCurve], method: &str, other: &str) -> Option<PairedGain> {
    let gain = |m: &str, seed: u64| {
        curves
            .iter()
            .find(|c| c.method == m && c.seed == seed)
            .and_then(|c| Some(c.last()?.reward - c.base()?.reward))
    };
    let d: Vec<f64> = curves
        .iter()
        .filter(|c| c.method == method)
        .filter_map(|c| Some(gain(method, c.seed)? - gain(other, c.seed)?))
        .collect();
    if d.is_empty() {
        return None;
    }
    let n = d.len() as f64;
    let mean = d.iter().sum::<f64>() / n;
    let stderr = if d.len() < 2 {
        f64::NAN
    } else {
        (d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt() / n.sqrt()
    };
    Some(PairedGain {
        mean,
        stderr,
        seeds: d.len(),
    })
}

/// Every method's gain per seed, one Markdown list item per method, in seed order:
/// `- nft: +0.017 (seed 0), +0.035 (seed 1)`.
pub fn gains_by_seed(curves: &[RunCurve]) -> String {
    let mut out = String::new();
    for m in methods(curves) {
        let mut runs: Vec<&RunCurve> = curves.iter().filter(|c| c.method == m).collect();
        runs.sort_by_key(|c| c.seed);
        let gains: Vec<String> = runs
            .iter()
            .map(|c| match (c.base(), c.last()) {
                (Some(a), Some(b)) => format!("{:+.3} (seed {})", b.reward - a.reward, c.seed),
                _ => format!("no evaluation (seed {})", c.seed),
            })
            .collect();
        out.push_str(&format!("- {m}: {}\n", gains.join(", ")));
    }
    out
}

/// Plots every method's held-out reward against training CPU seconds: per method, the mean
/// over its seeds of the `i`-th evaluation at the mean CPU seconds of those evaluations (up to
/// the fewest evaluations any of its seeds has), with the standard error of that mean over
/// seeds as the bar (with one seed, the evaluation's own standard error); where any run
/// logged a second judgement, the same of it in a second plot under the first (its bars the
/// standard error over seeds, none with one seed). A method that spent no training CPU (every
/// evaluation at 0 s: the base with guidance, say) is a level, drawn at its last mean across
/// the plot. Written as a PNG to `path`.
///
/// # Errors
/// Drawing and file errors.
pub fn write_plot(curves: &[RunCurve], path: &Path) -> Result<(), TrainerError> {
    let (w, h) = (960, 600);
    let reward = plot_curves(
        &mean_series(curves, |p| p.reward, |p| p.stderr),
        &Axes {
            title: "held-out reward against training CPU time (mean over seeds)",
            x_label: "training CPU seconds",
            y_label: "held-out reward",
            integer_x: false,
        },
        w,
        h,
    )?;
    let judged = curves
        .iter()
        .any(|c| c.points.iter().any(|p| p.second.is_finite()));
    if !judged {
        return write_png(path, &reward);
    }
    let second = plot_curves(
        &mean_series(curves, |p| p.second, |_| f64::NAN),
        &Axes {
            title: "the second judge on the same pictures (mean over seeds)",
            x_label: "training CPU seconds",
            y_label: "second judge",
            integer_x: false,
        },
        w,
        h,
    )?;
    let mut both = image::RgbImage::new(w, 2 * h);
    image::imageops::replace(&mut both, &reward, 0, 0);
    image::imageops::replace(&mut both, &second, 0, i64::from(h));
    write_png(path, &both)
}

/// Per method, the `i`-th evaluations' mean of `value` over seeds at their mean CPU seconds,
/// with the standard error over seeds as the bar (one seed: its own `stderr`).
fn mean_series(
    curves: &[RunCurve],
    value: fn(&CurvePoint) -> f64,
    stderr: fn(&CurvePoint) -> f64,
) -> Vec<Series> {
    let right = curves
        .iter()
        .flat_map(|c| &c.points)
        .map(|p| p.cpu_seconds)
        .filter(|x| x.is_finite())
        .fold(0.0, f64::max);
    let mut series = Vec::new();
    for m in methods(curves) {
        let runs: Vec<&RunCurve> = curves.iter().filter(|c| c.method == m).collect();
        let n = runs.iter().map(|c| c.points.len()).min().unwrap_or(0);
        let mut pts = Vec::with_capacity(n);
        let mut bars = Vec::with_capacity(n);
        for i in 0..n {
            let xs: Vec<f64> = runs.iter().map(|c| c.points[i].cpu_seconds).collect();
            let ys: Vec<f64> = runs.iter().map(|c| value(&c.points[i])).collect();
            let k = ys.len() as f64;
            let mean = ys.iter().sum::<f64>() / k;
            pts.push((xs.iter().sum::<f64>() / k, mean));
            if runs.len() == 1 {
                bars.push(stderr(&runs[0].points[i]));
            } else {
                let var = ys.iter().map(|y| (y - mean) * (y - mean)).sum::<f64>() / (k - 1.0);
                bars.push((var / k).sqrt());
            }
        }
        let level = right > 0.0 && !pts.is_empty() && pts.iter().all(|&(x, _)| x == 0.0);
        series.push(match (level, pts.last()) {
            (true, Some(&(_, y))) => {
                let bar = bars.last().copied().unwrap_or(f64::NAN);
                Series::new(&format!("{m} (no training)"), vec![(0.0, y), (right, y)])
                    .with_errors(vec![f64::NAN, bar])
            }
            // no bar at all (one seed without its own error): no `±` in the legend either
            _ if bars.iter().all(|b| b.is_nan()) => Series::new(m, pts),
            _ => Series::new(m, pts).with_errors(bars),
        });
    }
    series
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparison_entries_are_checked() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let entries = |m: &[&str], v: &[&str], o: &[&str]| comparison_entries(&s(m), &s(v), &s(o));
        let e = entries(
            &["nft"],
            &["nft_beta=nft", "awm_trust=awm"],
            &[
                "nft_beta:algorithm.beta=0.1",
                "awm_trust:algorithm.kl_coef=0.001",
                "nft:run.seed=3",
            ],
        )
        .unwrap();
        let labels: Vec<&str> = e.iter().map(|e| e.label.as_str()).collect();
        assert_eq!(labels, ["nft", "nft_beta", "awm_trust"]);
        assert_eq!(e[0].overrides, ["run.seed=3"]);
        assert_eq!(e[1].method, "nft");
        for (m, v, o, want) in [
            (&["ppo"][..], &[][..], &[][..], "unknown method \"ppo\""),
            (&[], &["awm"], &[], "label \"\""),
            (&[], &["Awm=awm"], &[], "label \"Awm\""),
            (&["awm"], &["awm=awm"], &[], "appears twice"),
            (&[], &["x=ppo"], &[], "unknown method"),
            (
                &["awm"],
                &[],
                &["awm=algorithm.kl_coef=1"],
                "LABEL:KEY=VALUE",
            ),
            (
                &["awm"],
                &[],
                &["nft:algorithm.beta=1"],
                "no entry is labelled \"nft\"",
            ),
            (&["awm"], &[], &["awm:algorithm"], "key=value"),
        ] {
            let err = entries(m, v, o).unwrap_err().to_string();
            assert!(err.contains(want), "{m:?} {v:?} {o:?}: {err}");
        }
    }

    fn curve(method: &str, seed: u64, pts: &[(f64, f64)]) -> RunCurve {
        RunCurve {
            method: method.into(),
            seed,
            points: pts
                .iter()
                .map(|&(cpu_seconds, reward)| CurvePoint {
                    cpu_seconds,
                    reward,
                    stderr: 0.01,
                    second: reward - 0.1,
                })
                .collect(),
        }
    }

    #[test]
    fn the_table_reads_gains_and_the_cpu_to_the_target() {
        let curves = vec![
            curve("flow_grpo", 0, &[(0.0, 0.2), (50.0, 0.25), (100.0, 0.3)]),
            curve("flow_grpo", 1, &[(0.0, 0.2), (50.0, 0.22), (100.0, 0.4)]),
            curve("awm", 0, &[(0.0, 0.2), (30.0, 0.36), (60.0, 0.5)]),
            curve("awm", 1, &[(0.0, 0.2), (30.0, 0.3), (60.0, 0.32)]),
        ];
        let t = comparison_table(&curves, "flow_grpo");
        // FlowGRPO's final mean is 0.35 at 100 CPU s; AWM's seed 0 reaches it at 30 s, seed 1 never
        assert!(
            t.contains("| awm | 2 | 0.200 (0.200 to 0.200) | 0.410 (0.320 to 0.500) | +0.210 (+0.120 to +0.300) | +0.210 (+0.120 to +0.300) | +0.060 ± 0.140 (2 seeds) | 0.010 | 60 | 30 (0.30x), 1/2 seeds | 30 (0.30x), 1/2 seeds |"),
            "{t}"
        );
        assert!(t.contains("| flow_grpo | 2 | 0.200 (0.200 to 0.200) | 0.350 (0.300 to 0.400) | +0.150 (+0.100 to +0.200) | +0.150 (+0.100 to +0.200) | - |"), "{t}");
        // paired by seed: awm's gains 0.30 and 0.12 against flow_grpo's 0.10 and 0.20
        let p = paired_gain(&curves, "awm", "flow_grpo").unwrap();
        assert_eq!(p.seeds, 2);
        assert!((p.mean - 0.06).abs() < 1e-12, "{p:?}");
        assert!((p.stderr - 0.14).abs() < 1e-12, "{p:?}");
        assert!(paired_gain(&curves, "awm", "nft").is_none());
        // a seed the other method did not run is left out; one seed has no standard error
        let one = [
            curves[0].clone(),
            curve("awm", 0, &[(0.0, 0.2), (60.0, 0.5)]),
            curve("awm", 7, &[(0.0, 0.2), (60.0, 0.1)]),
        ];
        let p = paired_gain(&one, "awm", "flow_grpo").unwrap();
        assert_eq!(p.seeds, 1);
        assert!((p.mean - 0.2).abs() < 1e-12 && p.stderr.is_nan(), "{p:?}");
        assert!(comparison_table(&one, "flow_grpo").contains("| +0.200 (1 seed) |"));
        // a NaN reward is not dropped from the pairs
        let nan = [
            curves[0].clone(),
            curve("awm", 0, &[(0.0, 0.2), (60.0, f64::NAN)]),
        ];
        assert!(paired_gain(&nan, "awm", "flow_grpo").unwrap().mean.is_nan());
        assert_eq!(
            gains_by_seed(&curves),
            "- flow_grpo: +0.100 (seed 0), +0.200 (seed 1)\n- awm: +0.300 (seed 0), +0.120 (seed 1)\n"
        );
        let none = comparison_table(&[curve("nft", 0, &[(0.0, 0.2), (9.0, 0.1)])], "flow_grpo");
        assert!(
            none.contains("not reached (0/1) | not reached (0/1) |"),
            "{none}"
        );

        // a method that rises and falls back: its best mean evaluation is the k-th evaluations'
        // highest mean (0.30 at 50 s), where its final mean (0.21) is below its start
        let falls = vec![
            curve(
                "flow_grpo",
                0,
                &[(0.0, 0.2), (40.0, 0.32), (80.0, 0.25), (110.0, 0.22)],
            ),
            curve(
                "flow_grpo",
                1,
                &[(0.0, 0.2), (60.0, 0.28), (100.0, 0.26), (130.0, 0.20)],
            ),
            curve("nft", 0, &[(0.0, 0.2), (20.0, 0.25), (45.0, 0.31)]),
            curve("nft", 1, &[(0.0, 0.2), (25.0, 0.29), (50.0, 0.31)]),
        ];
        let best = best_mean_evaluation(&falls, "flow_grpo").unwrap();
        assert!(
            (best.reward - 0.30).abs() < 1e-12 && best.cpu_seconds == 50.0,
            "{best:?}"
        );
        let t = comparison_table(&falls, "flow_grpo");
        // NFT reaches the final 0.21 at its first evaluations (20 and 25 s: median 25, 0.21x
        // of 120 s), and the best 0.30 at 45 s on seed 0 and 50 s on seed 1 (median 50);
        // FlowGRPO's seed 0 reaches its own best at 40 s, its seed 1 never (0.28, 0.26, 0.20)
        assert!(
            t.contains("CPU s to flow_grpo's final 0.210 | CPU s to flow_grpo's best mean 0.300 |"),
            "{t}"
        );
        assert!(t.contains("| 25 (0.21x) | 50 (1.25x) |"), "{t}");
        assert!(t.contains("| 40 (1.00x), 1/2 seeds |"), "{t}");
        assert!(best_mean_evaluation(&falls, "awm").is_none());
        assert!(best_mean_evaluation(&[curve("nft", 0, &[(0.0, 0.2)])], "nft").is_none());
        // a NaN evaluation makes the best NaN, not a smaller sample
        let nan = [
            falls[0].clone(),
            curve(
                "flow_grpo",
                1,
                &[(0.0, 0.2), (60.0, f64::NAN), (100.0, 0.26)],
            ),
        ];
        assert!(
            best_mean_evaluation(&nan, "flow_grpo")
                .unwrap()
                .reward
                .is_nan()
        );
    }

    #[test]
    fn curves_go_through_their_csv_and_bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut curves = vec![
            curve("flow_grpo", 0, &[(0.0, 0.2), (50.0, 0.25), (100.5, 0.3)]),
            curve("nft", 3, &[(0.0, 0.21), (60.25, 0.4)]),
        ];
        // second judgements that the file's six decimals carry exactly
        for (i, p) in curves.iter_mut().flat_map(|c| &mut c.points).enumerate() {
            p.second = 0.125 * i as f64;
        }
        let a = dir.path().join("a.csv");
        std::fs::write(&a, curves_csv(&curves)).unwrap();
        let back = read_curves_csv(&a, &[]).unwrap();
        assert_eq!(back, curves);
        // a second file of other runs adds to the first; the same run again is refused
        let b = dir.path().join("b.csv");
        std::fs::write(&b, curves_csv(&[curve("nft", 4, &[(0.0, 0.2)])])).unwrap();
        assert_eq!(read_curves_csv(&b, &back).unwrap()[0].seed, 4);
        let err = read_curves_csv(&a, &back).unwrap_err().to_string();
        assert!(
            err.contains("line 2: flow_grpo, seed 0 appears a second time"),
            "{err}"
        );
        let h = CURVES_CSV_HEADER;
        for (text, want) in [
            ("method,seed\n", "line 1: header \"method,seed\""),
            ("", "line 1: header \"\""),
            (
                &format!("{h}\nnft,0,1.0,0.2,0.01\n"),
                "line 2: \"nft,0,1.0,0.2,0.01\": expected 6 fields",
            ),
            (
                &format!("{CURVES_CSV_HEADER_V1}\nnft,0,1.0,0.2,0.01,0.1\n"),
                "expected 5 fields",
            ),
            (
                &format!("{h}\nnft,x,1.0,0.2,0.01,0.1\n"),
                "line 2: seed \"x\"",
            ),
            (
                &format!("{h}\nnft,0,1.0,0.2,0.01,0.1\nnft,0,2,abc,0.01,0.1\n"),
                "line 3: reward \"abc\"",
            ),
            (
                &format!("{h}\nnft,0,1.0,0.2,0.01,x\n"),
                "line 2: second_judge \"x\"",
            ),
            (
                &format!("{h}\nnft,0,0,0.2,0.01,0.1\nawm,0,0,0.2,0.01,0.1\nnft,0,5,0.3,0.01,0.1\n"),
                "line 4: nft, seed 0 appears a second time",
            ),
        ] {
            std::fs::write(&a, text).unwrap();
            let err = read_curves_csv(&a, &[]).unwrap_err().to_string();
            assert!(err.contains(want), "{text:?}: {err}");
        }
        // a NaN standard error (one evaluation seed) is data, not an error, and so is a NaN
        // reward (a diverged evaluation): both go through the file
        std::fs::write(&a, format!("{h}\nnft,0,0,0.2,NaN,0.1\n")).unwrap();
        assert!(
            read_curves_csv(&a, &[]).unwrap()[0].points[0]
                .stderr
                .is_nan()
        );
        // a file of before the second judgement's column reads with it NaN
        std::fs::write(&a, format!("{CURVES_CSV_HEADER_V1}\nnft,0,0,0.2,0.01\n")).unwrap();
        let old = read_curves_csv(&a, &[]).unwrap();
        assert!(old[0].points[0].second.is_nan() && old[0].points[0].reward == 0.2);
        let diverged = vec![curve("nft", 0, &[(0.0, 0.2), (60.0, f64::NAN)])];
        std::fs::write(&a, curves_csv(&diverged)).unwrap();
        let back = read_curves_csv(&a, &[]).unwrap();
        assert!(back[0].points[1].reward.is_nan(), "{back:?}");
        assert_eq!(back[0].points[1].cpu_seconds, 60.0);
    }

    #[test]
    fn a_diverged_evaluation_is_a_nan_point_not_a_skipped_one() {
        use crate::monitor::{JsonlWriter, MetricsRecord};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let mut w = JsonlWriter::open(&path, 0).unwrap();
        let rec = |step: u64, m: &[(&str, f64)]| MetricsRecord {
            step,
            wall_time: 0.0,
            metrics: m.iter().map(|(k, v)| (k.to_string(), Some(*v))).collect(),
        };
        let cpu = names::PERF_TRAIN_CPU_SECONDS;
        w.append(&rec(0, &[(EVAL_REWARD, 0.2), (EVAL_REWARD_SE, 0.01)]))
            .unwrap();
        w.append(&rec(1, &[(cpu, 30.0), ("train/loss", 1.0)]))
            .unwrap();
        let judge = names::eval_judge("shapes_rerender");
        w.append(&rec(2, &[(cpu, 60.0), (EVAL_REWARD, 0.25), (&judge, 0.15)]))
            .unwrap();
        // the writer logs the non-finite reward as `null`
        w.append(&rec(3, &[(cpu, 90.0), (EVAL_REWARD, f64::NAN)]))
            .unwrap();
        drop(w);
        let c = run_curve("nft", 0, &path, Some("shapes_rerender")).unwrap();
        assert_eq!(c.points.len(), 3, "{c:?}");
        let last = c.last().unwrap();
        assert!(last.reward.is_nan() && last.cpu_seconds == 90.0, "{last:?}");
        assert_eq!(c.points[1].reward, 0.25);
        assert!(c.points[1].stderr.is_nan());
        assert_eq!(c.points[1].second, 0.15);
        assert!(
            c.points[0].second.is_nan(),
            "the start logged no second judgement"
        );
        assert!(
            run_curve("nft", 0, &path, None).unwrap().points[1]
                .second
                .is_nan()
        );
    }

    #[test]
    fn the_plot_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.png");
        write_plot(
            &[
                curve("a", 0, &[(0.0, 0.2), (10.0, 0.3)]),
                curve("a", 1, &[(0.0, 0.2), (12.0, 0.35)]),
                curve("b", 0, &[(0.0, 0.2), (5.0, 0.25), (9.0, 0.3)]),
            ],
            &path,
        )
        .unwrap();
        // the curves carry second judgements: the second plot goes under the first
        assert_eq!(image::image_dimensions(&path).unwrap(), (960, 1200));
        let mut unjudged = curve("a", 0, &[(0.0, 0.2), (10.0, 0.3)]);
        for p in &mut unjudged.points {
            p.second = f64::NAN;
        }
        write_plot(&[unjudged], &path).unwrap();
        assert_eq!(image::image_dimensions(&path).unwrap(), (960, 600));
        // a method that spent no training CPU is a level across the others' range
        let level = curve("cfg", 0, &[(0.0, 0.2), (0.0, 0.3)]);
        let s = mean_series(
            &[curve("a", 0, &[(0.0, 0.2), (10.0, 0.3)]), level],
            |p| p.reward,
            |p| p.stderr,
        );
        assert_eq!(s[1].name, "cfg (no training)");
        assert_eq!(s[1].points, [(0.0, 0.3), (10.0, 0.3)]);
        assert_eq!(s[0].points, [(0.0, 0.2), (10.0, 0.3)]);
    }
}
