//! The learning rate of every optimizer step (seed 002, "Learning rate").
//!
//! `lr_at_step(s)` gives the rate of optimizer step `s` (0-based):
//!
//! ```text
//! s <  W:            lr * (s + 1) / W                         linear warmup over W steps
//! s >= W, constant:  lr                                       (decay settings ignored)
//! s >= W, linear:    lr - (lr - min_lr) * r                   r = min(1, (s - W) / (D - W))
//! s >= W, cosine:    min_lr + (lr - min_lr) * (1 + cos(pi r)) / 2
//! ```
//!
//! `D` is `lr_decay_iters`, counted from step 0 like `W` (Megatron's convention: the decay ends
//! at step `D`, warmup included), so `D > W` is required for the decaying shapes; from step `D`
//! on the rate stays at `min_lr`. The warmup's first step already moves (`lr / W`, not 0): an RL
//! optimizer step at rate 0 would spend a whole rollout on nothing.
//!
//! Everything is counted in optimizer **steps**, not rollouts (the trainer takes
//! `num_updates_per_batch` steps per rollout; a step skipped as degenerate does not count).
//! [`LrScheduler`] carries the step count, which round-trips through the checkpoint's trainer
//! state as `lr_scheduler_steps`, so warmup does not restart on resume.

use serde::{Deserialize, Serialize};

use crate::config::{LrSchedulerKind, PreflightProblem};
use crate::error::TrainerError;

/// The post-warmup shape of the schedule, with its decay length where it has one.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum LrDecay {
    /// Stay at `lr` after warmup.
    Constant,
    /// Decay linearly to `min_lr`, reaching it at step `decay_iters`.
    Linear {
        /// `D`, the step at which the rate reaches `min_lr`.
        decay_iters: u64,
    },
    /// Half a cosine down to `min_lr`, reaching it at step `decay_iters`.
    Cosine {
        /// `D`, the step at which the rate reaches `min_lr`.
        decay_iters: u64,
    },
}

/// A validated learning-rate schedule: a pure function of the optimizer step.
///
/// ```
/// use trainer_fsdp::{LrSchedule, LrSchedulerKind};
/// // warmup over 4 steps to 1e-3, then cosine down to 1e-4 by step 10
/// let s = LrSchedule::new(1e-3, 4, LrSchedulerKind::Cosine, 1e-4, Some(10)).unwrap();
/// assert_eq!(s.lr_at_step(0), 0.25e-3);
/// assert_eq!(s.lr_at_step(3), 1e-3);
/// assert_eq!(s.lr_at_step(4), 1e-3); // the decay starts where the warmup ends
/// assert!((s.lr_at_step(7) - 0.55e-3).abs() < 1e-12); // half way: (lr + min_lr) / 2
/// assert_eq!(s.lr_at_step(10), 1e-4);
/// assert_eq!(s.lr_at_step(1_000), 1e-4);
/// // the decaying shapes need a decay length past the warmup
/// assert!(LrSchedule::new(1e-3, 4, LrSchedulerKind::Linear, 0.0, Some(4)).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    lr: f64,
    min_lr: f64,
    warmup_iters: u64,
    decay: LrDecay,
}

impl LrSchedule {
    /// Builds a schedule from the seed's flags: `--lr`, `--lr-warmup-iters`,
    /// `--fsdp-lr-scheduler`, `--min-lr`, `--lr-decay-iters`. Under `constant`, `min_lr` and
    /// `decay_iters` are ignored (preflight warns when they are set).
    ///
    /// # Errors
    /// [`TrainerError::Preflight`] listing every problem: `lr` not finite and `> 0`, `min_lr`
    /// not finite in `[0, lr]` (decaying shapes), `decay_iters` missing or `<= warmup_iters`
    /// (decaying shapes).
    pub fn new(
        lr: f64,
        warmup_iters: u64,
        scheduler: LrSchedulerKind,
        min_lr: f64,
        decay_iters: Option<u64>,
    ) -> Result<Self, TrainerError> {
        let mut problems = Vec::new();
        let decay = Self::check(
            lr,
            warmup_iters,
            scheduler,
            min_lr,
            decay_iters,
            &mut problems,
        );
        match decay {
            Some(decay) if problems.is_empty() => Ok(Self {
                lr,
                min_lr: if decay == LrDecay::Constant {
                    lr
                } else {
                    min_lr
                },
                warmup_iters,
                decay,
            }),
            _ => Err(TrainerError::Preflight { problems }),
        }
    }

    /// The checks of [`LrSchedule::new`], appending to `problems`; the decay shape when the
    /// decay settings are usable.
    pub(crate) fn check(
        lr: f64,
        warmup_iters: u64,
        scheduler: LrSchedulerKind,
        min_lr: f64,
        decay_iters: Option<u64>,
        problems: &mut Vec<PreflightProblem>,
    ) -> Option<LrDecay> {
        if !(lr.is_finite() && lr > 0.0) {
            problems.push(PreflightProblem::OutOfRange {
                key: "optimizer.lr",
                given: lr.to_string(),
                allowed: "a finite value > 0",
            });
        }
        let decaying = scheduler != LrSchedulerKind::Constant;
        if decaying && !(min_lr.is_finite() && min_lr >= 0.0 && (!lr.is_finite() || min_lr <= lr)) {
            problems.push(PreflightProblem::OutOfRange {
                key: "optimizer.min_lr",
                given: min_lr.to_string(),
                allowed: "a finite value in [0, optimizer.lr]",
            });
        }
        match (scheduler, decay_iters) {
            (LrSchedulerKind::Constant, _) => Some(LrDecay::Constant),
            (_, None) => {
                problems.push(PreflightProblem::DecayItersMissing { scheduler });
                None
            }
            (_, Some(d)) if d <= warmup_iters => {
                problems.push(PreflightProblem::DecayWithinWarmup {
                    scheduler,
                    decay_iters: d,
                    warmup_iters,
                });
                None
            }
            (LrSchedulerKind::Linear, Some(decay_iters)) => Some(LrDecay::Linear { decay_iters }),
            (LrSchedulerKind::Cosine, Some(decay_iters)) => Some(LrDecay::Cosine { decay_iters }),
        }
    }

    /// A constant rate with no warmup.
    ///
    /// # Errors
    /// As [`LrSchedule::new`].
    pub fn constant(lr: f64) -> Result<Self, TrainerError> {
        Self::new(lr, 0, LrSchedulerKind::Constant, 0.0, None)
    }

    /// The peak rate (`--lr`).
    pub fn lr(&self) -> f64 {
        self.lr
    }

    /// The final rate of a decaying schedule (`lr` under `constant`).
    pub fn min_lr(&self) -> f64 {
        self.min_lr
    }

    /// The warmup length in optimizer steps.
    pub fn warmup_iters(&self) -> u64 {
        self.warmup_iters
    }

    /// The post-warmup shape.
    pub fn decay(&self) -> LrDecay {
        self.decay
    }

    /// The rate of optimizer step `step` (0-based); see the module docs for the formula.
    pub fn lr_at_step(&self, step: u64) -> f64 {
        let w = self.warmup_iters;
        if step < w {
            return self.lr * (step + 1) as f64 / w as f64;
        }
        let (d, cosine) = match self.decay {
            LrDecay::Constant => return self.lr,
            LrDecay::Linear { decay_iters } => (decay_iters, false),
            LrDecay::Cosine { decay_iters } => (decay_iters, true),
        };
        if step >= d {
            return self.min_lr;
        }
        let r = (step - w) as f64 / (d - w) as f64;
        let delta = self.lr - self.min_lr;
        if cosine {
            self.min_lr + delta * 0.5 * (1.0 + (std::f64::consts::PI * r).cos())
        } else {
            self.lr - delta * r
        }
    }
}

/// A schedule plus the number of optimizer steps taken: the state that round-trips through the
/// checkpoint (`lr_scheduler_steps`).
///
/// ```
/// use trainer_fsdp::{LrSchedule, LrScheduler, LrSchedulerKind};
/// let schedule = LrSchedule::new(1.0, 2, LrSchedulerKind::Linear, 0.0, Some(4)).unwrap();
/// let mut s = LrScheduler::new(schedule);
/// let rates: Vec<f64> = (0..5).map(|_| { let lr = s.current_lr(); s.advance(); lr }).collect();
/// assert_eq!(rates, vec![0.5, 1.0, 1.0, 0.5, 0.0]);
/// // a scheduler resumed at step 3 continues where the other left off
/// assert_eq!(LrScheduler::resume(schedule, 3).current_lr(), 0.5);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrScheduler {
    schedule: LrSchedule,
    steps: u64,
}

impl LrScheduler {
    /// A scheduler at step 0.
    pub fn new(schedule: LrSchedule) -> Self {
        Self { schedule, steps: 0 }
    }

    /// A scheduler that has already taken `steps` optimizer steps (from a checkpoint's
    /// `lr_scheduler_steps`).
    pub fn resume(schedule: LrSchedule, steps: u64) -> Self {
        Self { schedule, steps }
    }

    /// The schedule.
    pub fn schedule(&self) -> &LrSchedule {
        &self.schedule
    }

    /// Optimizer steps taken so far (`lr_scheduler_steps`).
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The rate of the next optimizer step.
    pub fn current_lr(&self) -> f64 {
        self.schedule.lr_at_step(self.steps)
    }

    /// Counts one optimizer step; returns the new step count.
    pub fn advance(&mut self) -> u64 {
        self.steps += 1;
        self.steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(kind: LrSchedulerKind, w: u64, d: Option<u64>) -> LrSchedule {
        LrSchedule::new(2.0, w, kind, 0.5, d).unwrap()
    }

    #[test]
    fn warmup_is_linear_and_reaches_the_peak_on_its_last_step() {
        let s = sched(LrSchedulerKind::Constant, 4, None);
        let v: Vec<f64> = (0..6).map(|k| s.lr_at_step(k)).collect();
        assert_eq!(v, vec![0.5, 1.0, 1.5, 2.0, 2.0, 2.0]);
        // constant ignores min_lr and decay
        assert_eq!(s.min_lr(), 2.0);
        assert_eq!(s.lr_at_step(u64::MAX), 2.0);
    }

    #[test]
    fn no_warmup_starts_at_the_peak() {
        for kind in [
            LrSchedulerKind::Constant,
            LrSchedulerKind::Linear,
            LrSchedulerKind::Cosine,
        ] {
            let s = sched(kind, 0, Some(10));
            assert_eq!(s.lr_at_step(0), 2.0, "{kind:?}");
        }
    }

    #[test]
    fn linear_decay_hits_every_point_of_the_line() {
        // W = 2, D = 6: steps 2..6 go 2.0 -> 0.5 in 4 equal decrements of 0.375
        let s = sched(LrSchedulerKind::Linear, 2, Some(6));
        let v: Vec<f64> = (0..9).map(|k| s.lr_at_step(k)).collect();
        assert_eq!(v, vec![1.0, 2.0, 2.0, 1.625, 1.25, 0.875, 0.5, 0.5, 0.5]);
    }

    #[test]
    fn cosine_decay_is_monotone_symmetric_and_ends_at_min_lr() {
        let s = sched(LrSchedulerKind::Cosine, 0, Some(100));
        let v: Vec<f64> = (0..=100).map(|k| s.lr_at_step(k)).collect();
        assert!(v.windows(2).all(|w| w[1] <= w[0]));
        assert!((v[50] - 1.25).abs() < 1e-12);
        // symmetric around the midpoint: lr(k) + lr(100 - k) = lr + min_lr
        for k in 0..=100 {
            assert!((v[k] + v[100 - k] - 2.5).abs() < 1e-12, "{k}");
        }
        assert_eq!(v[100], 0.5);
        assert_eq!(s.lr_at_step(5_000), 0.5);
    }

    #[test]
    fn every_problem_is_listed_at_once() {
        let err = LrSchedule::new(-1.0, 5, LrSchedulerKind::Cosine, -0.1, Some(3)).unwrap_err();
        let TrainerError::Preflight { problems } = err else {
            panic!("expected a preflight error");
        };
        assert_eq!(problems.len(), 3, "{problems:?}");
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert!(text[0].contains("optimizer.lr = -1"), "{text:?}");
        assert!(text[1].contains("optimizer.min_lr = -0.1"), "{text:?}");
        assert!(text[2].contains("lr_decay_iters = 3"), "{text:?}");
        let missing = LrSchedule::new(1.0, 0, LrSchedulerKind::Linear, 0.0, None).unwrap_err();
        assert!(missing.to_string().contains("lr_decay_iters"), "{missing}");
    }

    #[test]
    fn scheduler_state_is_the_step_count() {
        let s = sched(LrSchedulerKind::Linear, 2, Some(6));
        let mut a = LrScheduler::new(s);
        let mut seen = Vec::new();
        for _ in 0..4 {
            seen.push(a.current_lr());
            a.advance();
        }
        let b = LrScheduler::resume(s, a.steps());
        assert_eq!(b, a);
        assert_eq!(b.current_lr(), s.lr_at_step(4));
        assert_eq!(seen, (0..4).map(|k| s.lr_at_step(k)).collect::<Vec<_>>());
    }
}
