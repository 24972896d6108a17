//! SDE-step plans: which denoising steps are stochastic and trained.
//!
//! A plan maps a query (the rollout id, `None` for evaluation, and a per-sample key) to a
//! sorted set of step indices ([`SdeSteps`]). It is a pure function: every rank and engine that
//! asks with the same query gets the same steps, with no communication. Five plans ship:
//!
//! | plan | what it selects |
//! | --- | --- |
//! | [`ExplicitSteps`] | a fixed list, sorted and de-duplicated |
//! | [`FractionWindow`] | `num_sde_steps` stride-spaced steps inside a fraction window |
//! | [`PerRolloutResample`] | `num_sde_steps` drawn from a pool per rollout id; an evaluation fallback |
//! | [`SlidingWindow`] | MixGRPO's sliding window (progressive / random / decay / exp-decay) |
//! | [`RandomSubset`] | DanceGRPO's per-sample random subset (shuffle, keep a fraction) |
//!
//! [`TrainedStepsConfig`] resolves the `--sampling-config` keys of seed 002 to one of the
//! first three, in its resolution order, and [`validate_plan`](crate::validate_plan) checks
//! every route by which a step can become trainable.

mod config;
mod explicit;
mod fraction;
mod resample;
mod subset;
mod window;

use std::fmt;

pub use config::{ConfiguredPlan, TrainedStepsConfig};
pub use explicit::ExplicitSteps;
pub use fraction::FractionWindow;
pub use resample::{EvalFallback, PerRolloutResample};
pub use subset::RandomSubset;
pub use window::{SlidingWindow, WindowEnd, WindowStrategy};

use crate::error::ScheduleError;

/// A sorted, de-duplicated set of denoising-step indices.
///
/// ```
/// use schedule::SdeSteps;
/// let s = SdeSteps::new([5, 3, 5, 1]);
/// assert_eq!(s.as_slice(), &[1, 3, 5]);
/// assert!(s.contains(3));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct SdeSteps(Vec<usize>);

impl SdeSteps {
    /// Sorts and de-duplicates.
    pub fn new(steps: impl IntoIterator<Item = usize>) -> Self {
        let mut v: Vec<usize> = steps.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        Self(v)
    }

    /// The indices, ascending.
    pub fn as_slice(&self) -> &[usize] {
        &self.0
    }

    /// Whether step `k` is in the set.
    pub fn contains(&self, k: usize) -> bool {
        self.0.binary_search(&k).is_ok()
    }

    /// The number of steps.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The indices, ascending.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().copied()
    }
}

/// What a plan is asked: which rollout (training iteration) and which sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanQuery {
    /// The rollout id (training iteration); `None` for held-out evaluation.
    pub rollout_id: Option<u64>,
    /// A per-sample key (e.g. `noise_recipe::SampleId::noise_key`); only per-sample plans
    /// ([`RandomSubset`]) read it.
    pub sample_key: u64,
}

impl PlanQuery {
    /// A training rollout, for plans that select the same steps for every sample.
    pub fn rollout(id: u64) -> Self {
        Self {
            rollout_id: Some(id),
            sample_key: 0,
        }
    }

    /// Held-out evaluation: no rollout id.
    pub fn evaluation() -> Self {
        Self {
            rollout_id: None,
            sample_key: 0,
        }
    }

    /// The same query for one sample.
    pub fn with_sample(self, sample_key: u64) -> Self {
        Self { sample_key, ..self }
    }
}

/// A route by which a step can become trainable; problems and warnings name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// An explicit list (`sde_indices`).
    ExplicitList,
    /// The pool a per-rollout resample draws from (`sde_pool`).
    Pool,
    /// The fraction window (`sde_timestep_fraction`), as stride-spaced picks or as the default
    /// pool.
    FractionWindow,
    /// MixGRPO's sliding window.
    SlidingWindow,
    /// DanceGRPO's random subset.
    RandomSubset,
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Route::ExplicitList => "the explicit list (sde_indices)",
            Route::Pool => "the resample pool (sde_pool)",
            Route::FractionWindow => "the derived fraction window (sde_timestep_fraction)",
            Route::SlidingWindow => "the sliding window",
            Route::RandomSubset => "the random subset",
        })
    }
}

/// Every step a route can ever select, for validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSteps {
    /// The route.
    pub route: Route,
    /// The steps it can select under any query.
    pub steps: SdeSteps,
}

/// A plan of trained SDE steps.
///
/// Implementations are pure: `steps` depends on the query only. `reachable` lists, per route,
/// every step the plan can select under any query, so that validation can reject a singular
/// step before the first rollout rather than when it happens to be drawn.
pub trait SdeStepPlan: fmt::Debug + Send + Sync {
    /// The plan's name, for messages.
    fn name(&self) -> &'static str;

    /// The number of denoising steps the plan indexes (`sigmas.len() - 1`).
    fn num_steps(&self) -> usize;

    /// The trained steps for a query.
    ///
    /// # Errors
    /// [`ScheduleError::RolloutIdRequired`] for a plan without an evaluation fallback asked
    /// with `rollout_id = None`.
    fn steps(&self, query: PlanQuery) -> Result<SdeSteps, ScheduleError>;

    /// Every step each route can select, under any query.
    fn reachable(&self) -> Vec<RouteSteps>;
}

/// Collects the problems of a sub-plan's constructor into `problems`.
pub(crate) fn collect<T>(
    r: Result<T, ScheduleError>,
    problems: &mut Vec<crate::PlanProblem>,
) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(ScheduleError::InvalidPlan { problems: p }) => {
            problems.extend(p);
            None
        }
        Err(other) => unreachable!("plan constructors only return InvalidPlan, got {other}"),
    }
}

/// `Err(InvalidPlan)` when there are problems.
pub(crate) fn finish<T>(value: T, problems: Vec<crate::PlanProblem>) -> Result<T, ScheduleError> {
    if problems.is_empty() {
        Ok(value)
    } else {
        Err(ScheduleError::InvalidPlan { problems })
    }
}
