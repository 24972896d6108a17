//! Validation of a plan against the schedule and the SDE it trains: the singular Flow-SDE step
//! at `sigma = 1`, CPS's degenerate last step, and the flag on a trained last step.

use std::fmt;

use serde::Deserialize;

use crate::error::{PlanProblem, ScheduleError};
use crate::plan::{Route, RouteSteps, SdeStepPlan};
use crate::sigmas::Sigmas;

/// Sigmas at or above this value count as `sigma = 1` for the Flow-SDE singularity check: a
/// grid that starts at `t = 1` can come out one or two `f32` ulps below 1 after a static shift
/// evaluated in `f32` (e.g. `s / (1 + (s - 1))` for `s = 4.83`), and its step 0 is just as
/// singular (the coefficient `sqrt(sigma / (1 - sigma))` is in the thousands). UniPC's grid, which
/// starts at `shift(1 - 1/T)`, stays below it.
pub const SIGMA_ONE: f32 = 1.0 - 1e-6;

/// The stochastic transition a plan's steps are trained with (seed 002's `sde_type`, plus CPS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum SdeType {
    /// FlowGRPO's SDE, diffusion coefficient `a * sqrt(sigma / (1 - sigma))`: singular at
    /// `sigma = 1`, so no step with `sigma = 1` may be trained.
    #[serde(rename = "sde")]
    FlowSde,
    /// DanceGRPO's constant-`eta` SDE: finite everywhere.
    #[serde(rename = "dance")]
    Dance,
    /// Coefficients-preserving sampling: its std is 0 on the step into `sigma = 0`, which
    /// therefore has no density and cannot be trained.
    #[serde(rename = "cps")]
    Cps,
    /// On-schedule churn (paired finite differences): its std is `sigma_next · ...`, 0 on the
    /// step into `sigma = 0`, which therefore cannot be trained, as under CPS.
    #[serde(rename = "churn")]
    Churn,
}

/// Something legal but suspicious about a plan, reported without failing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanWarning {
    /// The last step (into `sigma = 0`) can be trained: its transition is finite for Flow-SDE and
    /// Dance, but its std is the smallest of the schedule and the step lands on the clean image.
    TrainedLastStep {
        /// The route.
        route: Route,
        /// The last step index.
        step: usize,
    },
}

impl fmt::Display for PlanWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanWarning::TrainedLastStep { route, step } => write!(
                f,
                "{route} can train the last step {step} (sigma_next = 0): check that this is intended"
            ),
        }
    }
}

/// The outcome of a successful validation: the warnings, if any.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PlanReport {
    /// Legal but suspicious findings.
    pub warnings: Vec<PlanWarning>,
}

/// Checks every route of a plan against the schedule and the SDE type.
///
/// Errors (all listed at once): a step with `sigma = 1` (at or above [`SIGMA_ONE`]) reachable under Flow-SDE (for grids
/// starting at 1, step 0), a reachable last step under CPS or churn, a plan for another step
/// count.
/// A reachable last step under Flow-SDE or Dance is a warning.
///
/// ```
/// use schedule::{validate_plan, ExplicitSteps, SchedulePolicy, SdeType};
/// let sigmas = SchedulePolicy::sd3_5().sample_sigmas(512, 512, 10).unwrap().sigmas;
/// let plan = ExplicitSteps::new(10, [0, 3, 9]).unwrap();
/// let err = validate_plan(&plan, SdeType::FlowSde, &sigmas).unwrap_err();
/// assert!(err.to_string().contains("[0]"));
/// let report = validate_plan(&plan, SdeType::Dance, &sigmas).unwrap();
/// assert_eq!(report.warnings.len(), 1); // step 9 lands on sigma = 0
/// ```
///
/// # Errors
/// [`ScheduleError::StepCountMismatch`] or [`ScheduleError::InvalidPlan`].
pub fn validate_plan(
    plan: &dyn SdeStepPlan,
    sde: SdeType,
    sigmas: &Sigmas,
) -> Result<PlanReport, ScheduleError> {
    if plan.num_steps() != sigmas.num_steps() {
        return Err(ScheduleError::StepCountMismatch {
            plan_steps: plan.num_steps(),
            schedule_steps: sigmas.num_steps(),
        });
    }
    let mut problems = Vec::new();
    let mut report = PlanReport::default();
    check_routes(&plan.reachable(), sde, sigmas, &mut problems, &mut report);
    if problems.is_empty() {
        Ok(report)
    } else {
        Err(ScheduleError::InvalidPlan { problems })
    }
}

/// The sigma checks of [`validate_plan`] on raw route sets (indices `>= num_steps` are skipped;
/// they are reported by the plan constructors).
pub(crate) fn check_routes(
    routes: &[RouteSteps],
    sde: SdeType,
    sigmas: &Sigmas,
    problems: &mut Vec<PlanProblem>,
    report: &mut PlanReport,
) {
    let n = sigmas.num_steps();
    // One entry per route: a route listed twice (the fraction window as pool and as picks) is
    // checked on the union of its steps.
    let mut merged: Vec<(Route, Vec<usize>)> = Vec::new();
    for r in routes {
        match merged.iter_mut().find(|(route, _)| *route == r.route) {
            Some((_, steps)) => steps.extend(r.steps.iter()),
            None => merged.push((r.route, r.steps.iter().collect())),
        }
    }
    for (route, steps) in merged {
        let steps = crate::plan::SdeSteps::new(steps);
        if sde == SdeType::FlowSde {
            let singular: Vec<usize> = steps
                .iter()
                .filter(|&k| k < n && sigmas.step(k).0 >= 1.0)
                .collect();
            if !singular.is_empty() {
                problems.push(PlanProblem::SingularStep {
                    route,
                    steps: singular,
                });
            }
        }
        if steps.contains(n - 1) {
            match sde {
                SdeType::Cps | SdeType::Churn => {
                    problems.push(PlanProblem::DegenerateLastStep { route, step: n - 1 })
                }
                SdeType::FlowSde | SdeType::Dance => report
                    .warnings
                    .push(PlanWarning::TrainedLastStep { route, step: n - 1 }),
            }
        }
    }
}
