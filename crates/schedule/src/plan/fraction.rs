//! `num_sde_steps` stride-spaced steps inside a fraction window.

use std::ops::Range;

use super::{PlanQuery, Route, RouteSteps, SdeStepPlan, SdeSteps, finish};
use crate::error::{PlanProblem, ScheduleError};

/// `num_sde_steps` steps spread over the window `[lo, hi)` of the schedule
/// (`sde_timestep_fraction`).
///
/// The window is the index range `floor(lo * N) .. floor(hi * N)` (products in `f64`), and the
/// `k`-th pick (`k < num_sde_steps`) is `window[floor(k * len / num_sde_steps)]`. Note that
/// `[0.0, 0.5]` over 12 steps with 3 picks is `[0, 2, 4]`, which trains step 0; a window meant
/// to skip step 0 must start above `1 / N`.
///
/// ```
/// use schedule::{FractionWindow, PlanQuery, SdeStepPlan};
/// let w = FractionWindow::new(12, [0.0, 0.5], 3).unwrap();
/// assert_eq!(w.window(), 0..6);
/// assert_eq!(w.steps(PlanQuery::rollout(7)).unwrap().as_slice(), &[0, 2, 4]);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct FractionWindow {
    num_steps: usize,
    window: Range<usize>,
    picks: SdeSteps,
}

impl FractionWindow {
    /// Validates the window and the pick count.
    ///
    /// # Errors
    /// [`ScheduleError::InvalidPlan`] listing every problem: `lo`/`hi` not finite with
    /// `0 <= lo < hi <= 1`, an empty window, `num_sde_steps` of 0 or larger than the window.
    pub fn new(
        num_steps: usize,
        fraction: [f64; 2],
        num_sde_steps: usize,
    ) -> Result<Self, ScheduleError> {
        let route = Route::FractionWindow;
        let mut problems = Vec::new();
        let window = Self::window_of(num_steps, fraction, &mut problems);
        let len = window.len();
        if num_sde_steps == 0 {
            problems.push(PlanProblem::Parameter {
                route,
                name: "num_sde_steps",
                value: 0.0,
                expected: "at least 1 (0 trains nothing)",
            });
        } else if num_sde_steps > len && len > 0 {
            problems.push(PlanProblem::TooFew {
                route,
                wanted: num_sde_steps,
                available: len,
            });
        }
        let picks = if len == 0 || num_sde_steps == 0 {
            SdeSteps::default()
        } else {
            SdeSteps::new((0..num_sde_steps).map(|k| window.start + k * len / num_sde_steps))
        };
        finish(
            Self {
                num_steps,
                window,
                picks,
            },
            problems,
        )
    }

    /// The window's index range, validated (problems are pushed, the range may be empty).
    pub(crate) fn window_of(
        num_steps: usize,
        [lo, hi]: [f64; 2],
        problems: &mut Vec<PlanProblem>,
    ) -> Range<usize> {
        let route = Route::FractionWindow;
        let mut ok = true;
        if !(lo.is_finite() && (0.0..1.0).contains(&lo)) {
            problems.push(PlanProblem::Parameter {
                route,
                name: "lo",
                value: lo,
                expected: "a value in [0, 1)",
            });
            ok = false;
        }
        if !(hi.is_finite() && hi > 0.0 && hi <= 1.0) {
            problems.push(PlanProblem::Parameter {
                route,
                name: "hi",
                value: hi,
                expected: "a value in (0, 1]",
            });
            ok = false;
        }
        if ok && lo >= hi {
            problems.push(PlanProblem::Parameter {
                route,
                name: "hi",
                value: hi,
                expected: "a value above lo",
            });
            ok = false;
        }
        if !ok {
            return 0..0;
        }
        let n = num_steps as f64;
        let window = ((lo * n).floor() as usize)..((hi * n).floor() as usize).min(num_steps);
        if window.is_empty() {
            problems.push(PlanProblem::Empty { route });
        }
        window
    }

    /// The window's index range.
    pub fn window(&self) -> Range<usize> {
        self.window.clone()
    }
}

impl SdeStepPlan for FractionWindow {
    fn name(&self) -> &'static str {
        "fraction window"
    }

    fn num_steps(&self) -> usize {
        self.num_steps
    }

    fn steps(&self, _query: PlanQuery) -> Result<SdeSteps, ScheduleError> {
        Ok(self.picks.clone())
    }

    fn reachable(&self) -> Vec<RouteSteps> {
        vec![RouteSteps {
            route: Route::FractionWindow,
            steps: self.picks.clone(),
        }]
    }
}
