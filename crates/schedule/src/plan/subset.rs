//! DanceGRPO's per-sample random subset of trained steps.

use std::ops::Range;

use keyed_rng::{PcgStream, fnv1a64};

use super::{PlanQuery, Route, RouteSteps, SdeStepPlan, SdeSteps, finish};
use crate::error::{PlanProblem, ScheduleError};
use crate::rng;

const DOMAIN: u64 = fnv1a64(b"flowrl/schedule/random-subset/v1");

/// DanceGRPO's timestep subset: every sample shuffles the candidate steps and trains the first
/// `floor(len * fraction)` of them (DanceGRPO: `torch.randperm` per sample, candidates = all
/// steps, `--timestep_fraction`, e.g. 0.6).
///
/// The shuffle is keyed by `(seed, rollout_id, sample_key)`, so each sample of a rollout trains
/// its own subset, reproducibly. Under Flow-SDE the candidates must leave out step 0 (validation
/// rejects it); under Dance's constant-eta SDE all steps may be candidates.
///
/// ```
/// use schedule::{PlanQuery, RandomSubset, SdeStepPlan};
/// let p = RandomSubset::new(10, 0..10, 0.6, 7).unwrap();
/// let a = p.steps(PlanQuery::rollout(3).with_sample(0)).unwrap();
/// let b = p.steps(PlanQuery::rollout(3).with_sample(1)).unwrap();
/// assert_eq!(a.len(), 6);
/// assert_eq!(b.len(), 6);
/// assert_eq!(a, p.steps(PlanQuery::rollout(3).with_sample(0)).unwrap());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RandomSubset {
    num_steps: usize,
    candidates: Range<usize>,
    keep: usize,
    seed: u64,
}

impl RandomSubset {
    /// Validates the subset.
    ///
    /// # Errors
    /// [`ScheduleError::InvalidPlan`] listing every problem: candidates outside `0..num_steps`
    /// or empty, a fraction outside `(0, 1]`, or a fraction that keeps no step.
    pub fn new(
        num_steps: usize,
        candidates: Range<usize>,
        fraction: f64,
        seed: u64,
    ) -> Result<Self, ScheduleError> {
        let route = Route::RandomSubset;
        let mut problems = Vec::new();
        if candidates.is_empty() || candidates.end > num_steps {
            problems.push(PlanProblem::Parameter {
                route,
                name: "candidates.end",
                value: candidates.end as f64,
                expected: "a non-empty range with end <= num_steps",
            });
        }
        let mut keep = 0;
        if !(fraction.is_finite() && fraction > 0.0 && fraction <= 1.0) {
            problems.push(PlanProblem::Parameter {
                route,
                name: "fraction",
                value: fraction,
                expected: "a value in (0, 1]",
            });
        } else {
            keep = (candidates.len() as f64 * fraction).floor() as usize;
            if keep == 0 && !candidates.is_empty() {
                problems.push(PlanProblem::Empty { route });
            }
        }
        finish(
            Self {
                num_steps,
                candidates,
                keep,
                seed,
            },
            problems,
        )
    }

    /// How many steps each sample trains.
    pub fn keep(&self) -> usize {
        self.keep
    }
}

impl SdeStepPlan for RandomSubset {
    fn name(&self) -> &'static str {
        "random subset"
    }

    fn num_steps(&self) -> usize {
        self.num_steps
    }

    fn steps(&self, query: PlanQuery) -> Result<SdeSteps, ScheduleError> {
        let id = query
            .rollout_id
            .ok_or(ScheduleError::RolloutIdRequired { plan: self.name() })?;
        let mut g = PcgStream::keyed(DOMAIN, &[self.seed, id, query.sample_key]);
        let pool: Vec<usize> = self.candidates.clone().collect();
        Ok(SdeSteps::new(rng::choose(&mut g, &pool, self.keep)))
    }

    fn reachable(&self) -> Vec<RouteSteps> {
        vec![RouteSteps {
            route: Route::RandomSubset,
            steps: SdeSteps::new(self.candidates.clone()),
        }]
    }
}
