//! MixGRPO's sliding window of trained steps.

use std::ops::Range;

use keyed_rng::{PcgStream, fnv1a64};

use super::{PlanQuery, Route, RouteSteps, SdeStepPlan, SdeSteps, finish};
use crate::error::{PlanProblem, ScheduleError};

const DOMAIN: u64 = fnv1a64(b"flowrl/schedule/sliding-window/v1");

/// How the window moves (MixGRPO's `sample_strategy`). Intervals count rollouts (training
/// iterations) spent on one window position (MixGRPO's `iters_per_group`, the "shift
/// interval").
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WindowStrategy {
    /// Advance by `stride` every `shift_interval` rollouts.
    Progressive {
        /// Rollouts per window position, `>= 1`.
        shift_interval: u64,
    },
    /// A uniformly random full-window start every `shift_interval` rollouts, drawn from a
    /// generator keyed by `(seed, rollout_id / shift_interval)`: it moves from one interval to
    /// the next (it is never re-seeded to one constant).
    Random {
        /// Rollouts per window position, `>= 1`.
        shift_interval: u64,
        /// Seed of the draws.
        seed: u64,
    },
    /// Like `Progressive`, with the interval shrinking linearly from `max_interval` at the
    /// first start to `min_interval` at the last: `max(min, floor(max (1 - p) + min p))`,
    /// `p = (start - first) / (last - first)`.
    Decay {
        /// Interval at the first window.
        max_interval: u64,
        /// Interval at the last window, `1 <= min_interval <= max_interval`.
        min_interval: u64,
    },
    /// Like `Progressive`, with the interval decaying exponentially once the window start
    /// passes `threshold`: `ceil(shift_interval * exp(-k * max(0, start - threshold)))`.
    ExpDecay {
        /// Interval before the threshold, `>= 1`.
        shift_interval: u64,
        /// Decay rate `k >= 0` (MixGRPO: 0.1).
        k: f64,
        /// Window start (a denoising-step index) after which the decay starts (MixGRPO: 13).
        threshold: usize,
    },
}

impl WindowStrategy {
    /// MixGRPO's default decay rate of `exp_decay`.
    pub const EXP_DECAY_K: f64 = 0.1;
    /// MixGRPO's default `exp_decay_thre_timestep`: decay starts once a window start passes 13.
    pub const EXP_DECAY_THRESHOLD: usize = 13;

    /// `ExpDecay` with MixGRPO's defaults (`k = 0.1`, threshold 13). With a window span shorter
    /// than 14 steps it never decays: lower the threshold for short schedules.
    pub fn mixgrpo_exp_decay(shift_interval: u64) -> Self {
        WindowStrategy::ExpDecay {
            shift_interval,
            k: Self::EXP_DECAY_K,
            threshold: Self::EXP_DECAY_THRESHOLD,
        }
    }
}

/// What happens when the window would move past the last full position (MixGRPO's
/// `roll_back`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowEnd {
    /// Clamp to the last full window and stay there.
    Clip,
    /// Start over from the first window.
    RollBack,
}

/// MixGRPO's sliding window over the denoising loop.
///
/// Windows are `window_size` consecutive steps inside `span` (denoising-step indices,
/// `span.end <= num_steps`); only full windows are visited, so starts lie in
/// `span.start ..= span.end - window_size`. The window starts at `span.start` and moves by
/// `stride` (MixGRPO: `window_size`, or `prog_overlap_step` with overlap) according to the
/// strategy. The position for a rollout is a pure function of its id (the training iteration,
/// counted from 0).
///
/// MixGRPO indexes its own sample buffer (`max_timesteps = sampling_steps - 2`), a different
/// coordinate space; here indices are denoising steps, so a span of `1..N - 1` keeps both the
/// singular first step and the final step out.
///
/// ```
/// use schedule::{PlanQuery, SdeStepPlan, SlidingWindow, WindowEnd, WindowStrategy};
/// let w = SlidingWindow::new(12, 1..11, 4, 2, WindowStrategy::Progressive { shift_interval: 3 }, WindowEnd::Clip).unwrap();
/// let at = |r| w.steps(PlanQuery::rollout(r)).unwrap().as_slice().to_vec();
/// assert_eq!(at(0), [1, 2, 3, 4]);
/// assert_eq!(at(2), [1, 2, 3, 4]);
/// assert_eq!(at(3), [3, 4, 5, 6]); // moved by the stride after 3 rollouts
/// assert_eq!(at(1000), [7, 8, 9, 10]); // clipped at the last full window
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct SlidingWindow {
    num_steps: usize,
    span: Range<usize>,
    window_size: usize,
    stride: usize,
    strategy: WindowStrategy,
    at_end: WindowEnd,
}

impl SlidingWindow {
    /// Validates the window.
    ///
    /// # Errors
    /// [`ScheduleError::InvalidPlan`] listing every problem: a span outside `0..num_steps` or
    /// shorter than the window, a zero window size, stride or interval, `min_interval` above
    /// `max_interval`, a negative or non-finite `k`.
    pub fn new(
        num_steps: usize,
        span: Range<usize>,
        window_size: usize,
        stride: usize,
        strategy: WindowStrategy,
        at_end: WindowEnd,
    ) -> Result<Self, ScheduleError> {
        let route = Route::SlidingWindow;
        let mut problems = Vec::new();
        let mut param = |name: &'static str, value: f64, expected: &'static str| {
            problems.push(PlanProblem::Parameter {
                route,
                name,
                value,
                expected,
            });
        };
        if span.end > num_steps || span.start >= span.end {
            param(
                "span.end",
                span.end as f64,
                "a non-empty span with span.end <= num_steps",
            );
        }
        if window_size == 0 {
            param("window_size", 0.0, "at least 1");
        } else if window_size > span.len() {
            param("window_size", window_size as f64, "at most the span length");
        }
        if stride == 0 {
            param("stride", 0.0, "at least 1");
        }
        match strategy {
            WindowStrategy::Progressive { shift_interval }
            | WindowStrategy::Random { shift_interval, .. } => {
                if shift_interval == 0 {
                    param("shift_interval", 0.0, "at least 1");
                }
            }
            WindowStrategy::Decay {
                max_interval,
                min_interval,
            } => {
                if min_interval == 0 {
                    param("min_interval", 0.0, "at least 1");
                }
                if min_interval > max_interval {
                    param("max_interval", max_interval as f64, "at least min_interval");
                }
            }
            WindowStrategy::ExpDecay {
                shift_interval, k, ..
            } => {
                if shift_interval == 0 {
                    param("shift_interval", 0.0, "at least 1");
                }
                if !(k.is_finite() && k >= 0.0) {
                    param("k", k, "a finite value >= 0");
                }
            }
        }
        finish(
            Self {
                num_steps,
                span,
                window_size,
                stride,
                strategy,
                at_end,
            },
            problems,
        )
    }

    fn first(&self) -> usize {
        self.span.start
    }

    fn last(&self) -> usize {
        self.span.end - self.window_size
    }

    /// Rollouts spent on the window starting at `start`.
    fn interval(&self, start: usize) -> u64 {
        match self.strategy {
            WindowStrategy::Progressive { shift_interval }
            | WindowStrategy::Random { shift_interval, .. } => shift_interval,
            WindowStrategy::Decay {
                max_interval,
                min_interval,
            } => {
                let span = self.last() - self.first();
                let p = if span == 0 {
                    0.0
                } else {
                    (start - self.first()) as f64 / span as f64
                };
                let v = (max_interval as f64 * (1.0 - p) + min_interval as f64 * p).floor() as u64;
                v.max(min_interval)
            }
            WindowStrategy::ExpDecay {
                shift_interval,
                k,
                threshold,
            } => {
                let relu = start.saturating_sub(threshold) as f64;
                ((shift_interval as f64 * (-k * relu).exp()).ceil() as u64).max(1)
            }
        }
    }

    /// The starts visited in order before the walk repeats (RollBack) or settles (Clip).
    fn cycle(&self) -> Vec<usize> {
        let mut starts = vec![self.first()];
        loop {
            let s = *starts.last().expect("non-empty");
            let next = s + self.stride;
            if next <= self.last() {
                starts.push(next);
            } else {
                if self.at_end == WindowEnd::Clip && s != self.last() {
                    starts.push(self.last());
                }
                return starts;
            }
        }
    }

    /// The window start for a rollout.
    pub fn start_at(&self, rollout_id: u64) -> usize {
        if let WindowStrategy::Random {
            shift_interval,
            seed,
        } = self.strategy
        {
            let mut g = PcgStream::keyed(DOMAIN, &[seed, rollout_id / shift_interval]);
            let n = (self.last() - self.first() + 1) as u64;
            return self.first() + g.below(n) as usize;
        }
        let starts = self.cycle();
        let lengths: Vec<u64> = starts.iter().map(|&s| self.interval(s)).collect();
        let mut r = rollout_id;
        if self.at_end == WindowEnd::RollBack {
            let period: u64 = lengths.iter().sum();
            r %= period;
        }
        for (&s, &n) in starts.iter().zip(&lengths) {
            if r < n {
                return s;
            }
            r -= n;
        }
        self.last()
    }
}

impl SdeStepPlan for SlidingWindow {
    fn name(&self) -> &'static str {
        "sliding window"
    }

    fn num_steps(&self) -> usize {
        self.num_steps
    }

    fn steps(&self, query: PlanQuery) -> Result<SdeSteps, ScheduleError> {
        let id = query
            .rollout_id
            .ok_or(ScheduleError::RolloutIdRequired { plan: self.name() })?;
        let s = self.start_at(id);
        Ok(SdeSteps::new(s..s + self.window_size))
    }

    fn reachable(&self) -> Vec<RouteSteps> {
        let starts: Vec<usize> = match self.strategy {
            WindowStrategy::Random { .. } => (self.first()..=self.last()).collect(),
            _ => self.cycle(),
        };
        let steps = SdeSteps::new(starts.into_iter().flat_map(|s| s..s + self.window_size));
        vec![RouteSteps {
            route: Route::SlidingWindow,
            steps,
        }]
    }
}
