//! Progress bars on long phases (rollout, scoring, training, evaluation), drawn on stderr only
//! when it is a terminal (or when forced), never into logs or CI output.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::config::ProgressMode;

/// A progress bar over `len` units of one phase.
///
/// ```
/// use trainer_fsdp::{Progress, ProgressMode};
/// let p = Progress::new("rollout", 8, ProgressMode::Never);
/// p.inc(3);
/// assert_eq!(p.position(), 3);
/// assert!(!p.is_drawn());
/// p.finish();
/// ```
#[derive(Debug, Clone)]
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar named `phase` over `len` units; `Auto` draws only when stderr is a terminal.
    pub fn new(phase: &str, len: u64, mode: ProgressMode) -> Self {
        let draw = match mode {
            ProgressMode::Never => false,
            ProgressMode::Auto => std::io::stderr().is_terminal(),
        };
        let target = if draw {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let style = ProgressStyle::with_template(
            "{prefix:>10} [{bar:30}] {pos}/{len} {per_sec} eta {eta} {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> ");
        Self {
            bar: ProgressBar::with_draw_target(Some(len), target)
                .with_style(style)
                .with_prefix(phase.to_string()),
        }
    }

    /// Advances by `n` units.
    pub fn inc(&self, n: u64) {
        self.bar.inc(n);
    }

    /// Sets the trailing message (e.g. the running loss).
    pub fn set_message(&self, msg: String) {
        self.bar.set_message(msg);
    }

    /// Units done.
    pub fn position(&self) -> u64 {
        self.bar.position()
    }

    /// Whether the bar draws anywhere.
    pub fn is_drawn(&self) -> bool {
        !self.bar.is_hidden()
    }

    /// Finishes the bar, leaving its last state on screen.
    pub fn finish(&self) {
        self.bar.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_follows_the_terminal_and_counts() {
        let p = Progress::new("train", 4, ProgressMode::Auto);
        assert_eq!(p.is_drawn(), std::io::stderr().is_terminal());
        for _ in 0..4 {
            p.inc(1);
        }
        assert_eq!(p.position(), 4);
        p.set_message("loss 0.1".into());
        p.finish();
        assert!(!Progress::new("x", 1, ProgressMode::Never).is_drawn());
    }
}
