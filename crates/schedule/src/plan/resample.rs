//! A per-rollout resample of the trained steps from a pool.

use keyed_rng::{PcgStream, fnv1a64};

use super::{
    ExplicitSteps, FractionWindow, PlanQuery, Route, RouteSteps, SdeStepPlan, SdeSteps, finish,
};
use crate::error::{PlanProblem, ScheduleError};
use crate::rng;

/// The domain tag of the per-rollout draw (part of the seed derivation; changing it changes
/// every draw).
const DOMAIN: u64 = fnv1a64(b"flowrl/schedule/per-rollout-resample/v1");

/// What a [`PerRolloutResample`] selects when there is no rollout id (held-out evaluation): a
/// fixed plan, so that the evaluation number stays comparable across training steps.
#[derive(Debug, Clone, PartialEq)]
pub enum EvalFallback {
    /// `sde_indices`.
    Explicit(ExplicitSteps),
    /// The stride-spaced picks of the fraction window.
    Window(FractionWindow),
}

impl EvalFallback {
    fn plan(&self) -> &dyn SdeStepPlan {
        match self {
            EvalFallback::Explicit(p) => p,
            EvalFallback::Window(p) => p,
        }
    }
}

/// `num_sde_steps` steps drawn from a pool, afresh for every rollout id.
///
/// The draw is a pure function of the rollout id: a PCG-XSL-RR 128/64 generator keyed by it
/// (see the crate docs on determinism) picks a uniformly random `num_sde_steps`-subset of the
/// pool (partial Fisher-Yates, unbiased bounded integers). Every rank and engine that knows the
/// rollout id draws the same steps with no communication, and successive rollouts draw
/// independently: the generator is keyed by the id, never re-seeded to one constant. With no
/// rollout id (evaluation) the [`EvalFallback`] is used.
///
/// ```
/// use schedule::{EvalFallback, ExplicitSteps, PerRolloutResample, PlanQuery, SdeStepPlan};
/// let fallback = EvalFallback::Explicit(ExplicitSteps::new(12, [3, 4, 5]).unwrap());
/// let p = PerRolloutResample::new(12, [1, 2, 3, 4, 5], 3, fallback).unwrap();
/// let a = p.steps(PlanQuery::rollout(41)).unwrap();
/// assert_eq!(a, p.steps(PlanQuery::rollout(41)).unwrap()); // deterministic
/// assert_eq!(a.len(), 3);
/// assert!(a.iter().all(|k| (1..=5).contains(&k)));
/// assert_eq!(p.steps(PlanQuery::evaluation()).unwrap().as_slice(), &[3, 4, 5]);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct PerRolloutResample {
    num_steps: usize,
    pool: SdeSteps,
    pool_route: Route,
    num_sde_steps: usize,
    fallback: EvalFallback,
}

impl PerRolloutResample {
    /// A resample from an explicit pool (`sde_pool`).
    ///
    /// # Errors
    /// [`ScheduleError::InvalidPlan`] listing every problem: an empty pool, pool indices
    /// `>= num_steps`, `num_sde_steps` of 0 or above the pool size, a fallback built for another
    /// step count.
    pub fn new(
        num_steps: usize,
        pool: impl IntoIterator<Item = usize>,
        num_sde_steps: usize,
        fallback: EvalFallback,
    ) -> Result<Self, ScheduleError> {
        Self::with_route(
            num_steps,
            SdeSteps::new(pool),
            Route::Pool,
            num_sde_steps,
            fallback,
        )
    }

    pub(crate) fn with_route(
        num_steps: usize,
        pool: SdeSteps,
        pool_route: Route,
        num_sde_steps: usize,
        fallback: EvalFallback,
    ) -> Result<Self, ScheduleError> {
        let mut problems = pool_problems(num_steps, &pool, pool_route, num_sde_steps);
        if fallback.plan().num_steps() != num_steps {
            problems.push(PlanProblem::Parameter {
                route: fallback.plan().reachable()[0].route,
                name: "num_steps",
                value: fallback.plan().num_steps() as f64,
                expected: "the resample's step count",
            });
        }
        finish(
            Self {
                num_steps,
                pool,
                pool_route,
                num_sde_steps,
                fallback,
            },
            problems,
        )
    }

    /// The pool, sorted.
    pub fn pool(&self) -> &SdeSteps {
        &self.pool
    }

    /// The number of steps drawn per rollout.
    pub fn num_sde_steps(&self) -> usize {
        self.num_sde_steps
    }

    /// The draw for rollout `id`, in draw order (before sorting).
    fn draw(&self, id: u64) -> Vec<usize> {
        let mut g = PcgStream::keyed(DOMAIN, &[id]);
        rng::choose(&mut g, self.pool.as_slice(), self.num_sde_steps)
    }
}

/// The problems of a pool and its draw size (empty pool, indices out of range, a draw size of 0
/// or above the pool size).
pub(crate) fn pool_problems(
    num_steps: usize,
    pool: &SdeSteps,
    route: Route,
    num_sde_steps: usize,
) -> Vec<PlanProblem> {
    let mut problems = Vec::new();
    if pool.is_empty() {
        problems.push(PlanProblem::Empty { route });
    }
    let out: Vec<usize> = pool.iter().filter(|&k| k >= num_steps).collect();
    if !out.is_empty() {
        problems.push(PlanProblem::OutOfRange {
            route,
            steps: out,
            num_steps,
        });
    }
    if num_sde_steps == 0 {
        problems.push(PlanProblem::Parameter {
            route,
            name: "num_sde_steps",
            value: 0.0,
            expected: "at least 1 (0 trains nothing)",
        });
    } else if num_sde_steps > pool.len() && !pool.is_empty() {
        problems.push(PlanProblem::TooFew {
            route,
            wanted: num_sde_steps,
            available: pool.len(),
        });
    }
    problems
}

impl SdeStepPlan for PerRolloutResample {
    fn name(&self) -> &'static str {
        "per-rollout resample"
    }

    fn num_steps(&self) -> usize {
        self.num_steps
    }

    fn steps(&self, query: PlanQuery) -> Result<SdeSteps, ScheduleError> {
        match query.rollout_id {
            Some(id) => Ok(SdeSteps::new(self.draw(id))),
            None => self.fallback.plan().steps(query),
        }
    }

    fn reachable(&self) -> Vec<RouteSteps> {
        let mut routes = vec![RouteSteps {
            route: self.pool_route,
            steps: self.pool.clone(),
        }];
        routes.extend(self.fallback.plan().reachable());
        routes
    }
}
