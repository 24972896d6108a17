//! A result over seeds: RL results are distributions (a run is deterministic on one machine,
//! but another seed — or another CPU's float rounding — gives another trajectory), so the
//! main job's figure is reported as the table of several seeds' runs with the mean, min and
//! max of the gain.
//!
//! ```
//! use trainer_fsdp::EvalSummary;
//! use trainer_fsdp::sweep::{SeedOutcome, SweepTable};
//! let e = |reward| EvalSummary { reward, stderr: 0.01, second: None };
//! let t = SweepTable::new(vec![
//!     SeedOutcome { seed: 0, base: e(0.25), last: e(0.5), seconds: 400.0 },
//!     SeedOutcome { seed: 1, base: e(0.25), last: e(0.375), seconds: 410.0 },
//! ]);
//! assert_eq!(t.gain.mean, 0.1875);
//! assert_eq!((t.gain.min, t.gain.max), (0.125, 0.25));
//! assert!(t.markdown("cmd", "machine").contains("| 1 | 0.250 ± 0.010 | 0.375 ± 0.010 | +0.125 |"));
//! ```

use crate::run::EvalSummary;

/// One seed's run: the held-out reward before and after, and the wall time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SeedOutcome {
    /// The run's `run.seed`.
    pub seed: u64,
    /// The evaluation of the starting policy.
    pub base: EvalSummary,
    /// The evaluation at the end.
    pub last: EvalSummary,
    /// Wall-clock seconds of the run (evaluations included, the build not).
    pub seconds: f64,
}

impl SeedOutcome {
    /// `last - base`.
    pub fn gain(&self) -> f64 {
        self.last.reward - self.base.reward
    }

    /// The second judge's `last - base`, when both evaluations have one.
    pub fn second_gain(&self) -> Option<f64> {
        Some(self.last.second?.0 - self.base.second?.0)
    }
}

/// Mean, min and max of a statistic over seeds (NaN if any seed's value is NaN).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// The mean.
    pub mean: f64,
    /// The smallest value.
    pub min: f64,
    /// The largest value.
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (all NaN when empty).
    pub fn of(values: &[f64]) -> Self {
        if values.is_empty() || values.iter().any(|v| v.is_nan()) {
            return Self {
                mean: f64::NAN,
                min: f64::NAN,
                max: f64::NAN,
            };
        }
        Self {
            mean: values.iter().sum::<f64>() / values.len() as f64,
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

/// The seeds' outcomes and their spreads.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepTable {
    /// One row per seed, in run order.
    pub outcomes: Vec<SeedOutcome>,
    /// The starting policy's held-out reward.
    pub base: Spread,
    /// The final held-out reward.
    pub last: Spread,
    /// The gain.
    pub gain: Spread,
    /// The wall time in seconds.
    pub seconds: Spread,
    /// The second judge's gain, when every seed's evaluations have one.
    pub second_gain: Option<Spread>,
}

impl SweepTable {
    /// The table of `outcomes`.
    pub fn new(outcomes: Vec<SeedOutcome>) -> Self {
        let col =
            |f: fn(&SeedOutcome) -> f64| Spread::of(&outcomes.iter().map(f).collect::<Vec<_>>());
        Self {
            base: col(|o| o.base.reward),
            last: col(|o| o.last.reward),
            gain: col(SeedOutcome::gain),
            seconds: col(|o| o.seconds),
            second_gain: outcomes
                .iter()
                .map(SeedOutcome::second_gain)
                .collect::<Option<Vec<f64>>>()
                .map(|g| Spread::of(&g)),
            outcomes,
        }
    }

    /// The table as Markdown: one row per seed (base and final held-out reward with their
    /// standard errors, the gain, the wall time), then the mean, min and max, with the command
    /// that produced it and the machine it ran on.
    pub fn markdown(&self, command: &str, machine: &str) -> String {
        let second = self.second_gain.is_some();
        let mut s = String::new();
        s.push_str(&format!("Command: `{command}`\n\nMachine: {machine}\n\n"));
        s.push_str("| seed | held-out base | held-out final | gain |");
        if second {
            s.push_str(" second judge base | second judge final | gain |");
        }
        s.push_str(" wall time |\n| ---: | ---: | ---: | ---: |");
        if second {
            s.push_str(" ---: | ---: | ---: |");
        }
        s.push_str(" ---: |\n");
        for o in &self.outcomes {
            s.push_str(&format!(
                "| {} | {:.3} ± {:.3} | {:.3} ± {:.3} | {:+.3} |",
                o.seed,
                o.base.reward,
                o.base.stderr,
                o.last.reward,
                o.last.stderr,
                o.gain(),
            ));
            if let (Some(b), Some(l), Some(g)) = (o.base.second, o.last.second, o.second_gain()) {
                s.push_str(&format!(
                    " {:.3} ± {:.3} | {:.3} ± {:.3} | {g:+.3} |",
                    b.0, b.1, l.0, l.1
                ));
            }
            s.push_str(&format!(" {:.1} min |\n", o.seconds / 60.0));
        }
        let spread = |f: fn(&SeedOutcome) -> Option<(f64, f64)>| {
            Spread::of(
                &self
                    .outcomes
                    .iter()
                    .map(|o| f(o).map_or(f64::NAN, |v| v.0))
                    .collect::<Vec<_>>(),
            )
        };
        let (second_base, second_last) = (spread(|o| o.base.second), spread(|o| o.last.second));
        for (name, pick) in [
            ("mean", (|s: &Spread| s.mean) as fn(&Spread) -> f64),
            ("min", |s: &Spread| s.min),
            ("max", |s: &Spread| s.max),
        ] {
            s.push_str(&format!(
                "| **{name}** | {:.3} | {:.3} | {:+.3} |",
                pick(&self.base),
                pick(&self.last),
                pick(&self.gain),
            ));
            if let Some(g) = &self.second_gain {
                s.push_str(&format!(
                    " {:.3} | {:.3} | {:+.3} |",
                    pick(&second_base),
                    pick(&second_last),
                    pick(g)
                ));
            }
            s.push_str(&format!(" {:.1} min |\n", pick(&self.seconds) / 60.0));
        }
        s.push_str(&format!(
            "\n{} seeds; ± is the standard error of each evaluation over its seeds (the held-out \
             prompts are fixed); min and max are over the seeds, per column.{}\n",
            self.outcomes.len(),
            if second {
                " The second judge (`eval.judges`) scores the same pictures as the reward, \
                 unweighted."
            } else {
                ""
            }
        ));
        s
    }
}

/// One command-line argument as a POSIX shell reads it back: as it is when it holds only
/// characters no shell treats specially, else in single quotes (a single quote inside closed,
/// escaped and reopened), so that a table's `Command:` line runs as it was typed.
///
/// ```
/// use trainer_fsdp::sweep::shell_word;
/// assert_eq!(shell_word("--seeds"), "--seeds");
/// assert_eq!(shell_word("optimizer.lr=5e-4"), "optimizer.lr=5e-4");
/// assert_eq!(
///     shell_word(r#"model.generator={ shapes_world = { dir = "d" } }"#),
///     r#"'model.generator={ shapes_world = { dir = "d" } }'"#
/// );
/// assert_eq!(shell_word("it's"), r#"'it'\''s'"#);
/// assert_eq!(shell_word(""), "''");
/// ```
pub fn shell_word(arg: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c);
    if !arg.is_empty() && arg.chars().all(plain) {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nan_seed_makes_the_spread_nan() {
        let s = Spread::of(&[0.1, f64::NAN, 0.3]);
        assert!(s.mean.is_nan() && s.min.is_nan() && s.max.is_nan());
        let s = Spread::of(&[]);
        assert!(s.mean.is_nan());
        let s = Spread::of(&[0.1, 0.3]);
        assert_eq!((s.min, s.max), (0.1, 0.3));
    }

    #[test]
    fn the_markdown_has_a_row_per_seed_and_the_summary() {
        let e = |reward| EvalSummary {
            reward,
            stderr: 0.008,
            second: None,
        };
        let t = SweepTable::new(
            (0..5)
                .map(|seed| SeedOutcome {
                    seed,
                    base: e(0.3),
                    last: e(0.5 + 0.01 * seed as f64),
                    seconds: 480.0,
                })
                .collect(),
        );
        let md = t.markdown("cargo run", "2 cores");
        assert_eq!(md.matches("\n| ").count(), 2 + 5 + 3, "{md}");
        assert!(
            md.contains("| **mean** | 0.300 | 0.520 | +0.220 | 8.0 min |"),
            "{md}"
        );
        assert!(md.contains("| **min** | 0.300 | 0.500 | +0.200 |"), "{md}");
        assert!(!md.contains("second judge"), "{md}");
    }

    #[test]
    fn the_second_judge_gets_columns_of_its_own() {
        let e = |reward, second| EvalSummary {
            reward,
            stderr: 0.008,
            second: Some((second, 0.005)),
        };
        let t = SweepTable::new(
            (0..2)
                .map(|seed| SeedOutcome {
                    seed,
                    base: e(0.3, 0.25),
                    last: e(0.5, 0.375 + 0.125 * seed as f64),
                    seconds: 480.0,
                })
                .collect(),
        );
        let g = t.second_gain.unwrap();
        assert_eq!((g.mean, g.min, g.max), (0.1875, 0.125, 0.25));
        let md = t.markdown("cargo run", "2 cores");
        assert!(
            md.contains("| 1 | 0.300 ± 0.008 | 0.500 ± 0.008 | +0.200 | 0.250 ± 0.005 | 0.500 ± 0.005 | +0.250 | 8.0 min |"),
            "{md}"
        );
        assert!(
            md.contains("| **mean** | 0.300 | 0.500 | +0.200 | 0.250 | 0.438 | +0.188 | 8.0 min |"),
            "{md}"
        );
        // a seed without the judge drops the columns
        let mut outcomes = t.outcomes.clone();
        outcomes[0].last.second = None;
        assert!(SweepTable::new(outcomes).second_gain.is_none());
    }
}
