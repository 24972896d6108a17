//! An explicit list of trained steps.

use super::{PlanQuery, Route, RouteSteps, SdeStepPlan, SdeSteps, finish};
use crate::error::{PlanProblem, ScheduleError};

/// A fixed list of steps (`sde_indices`), sorted and de-duplicated; the same for every query.
///
/// ```
/// use schedule::{ExplicitSteps, PlanQuery, SdeStepPlan};
/// let p = ExplicitSteps::new(12, [5, 3, 3]).unwrap();
/// assert_eq!(p.steps(PlanQuery::evaluation()).unwrap().as_slice(), &[3, 5]);
/// assert!(ExplicitSteps::new(12, [3, 12]).is_err()); // step 12 does not exist
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExplicitSteps {
    num_steps: usize,
    steps: SdeSteps,
}

impl ExplicitSteps {
    /// Validates the list against `num_steps`.
    ///
    /// # Errors
    /// [`ScheduleError::InvalidPlan`] when the list is empty or holds an index `>= num_steps`.
    pub fn new(
        num_steps: usize,
        steps: impl IntoIterator<Item = usize>,
    ) -> Result<Self, ScheduleError> {
        Self::on_route(num_steps, steps, Route::ExplicitList)
    }

    pub(crate) fn on_route(
        num_steps: usize,
        steps: impl IntoIterator<Item = usize>,
        route: Route,
    ) -> Result<Self, ScheduleError> {
        let steps = SdeSteps::new(steps);
        let mut problems = Vec::new();
        if steps.is_empty() {
            problems.push(PlanProblem::Empty { route });
        }
        let out: Vec<usize> = steps.iter().filter(|&k| k >= num_steps).collect();
        if !out.is_empty() {
            problems.push(PlanProblem::OutOfRange {
                route,
                steps: out,
                num_steps,
            });
        }
        finish(Self { num_steps, steps }, problems)
    }

    /// The steps.
    pub fn as_steps(&self) -> &SdeSteps {
        &self.steps
    }
}

impl SdeStepPlan for ExplicitSteps {
    fn name(&self) -> &'static str {
        "explicit"
    }

    fn num_steps(&self) -> usize {
        self.num_steps
    }

    fn steps(&self, _query: PlanQuery) -> Result<SdeSteps, ScheduleError> {
        Ok(self.steps.clone())
    }

    fn reachable(&self) -> Vec<RouteSteps> {
        vec![RouteSteps {
            route: Route::ExplicitList,
            steps: self.steps.clone(),
        }]
    }
}
