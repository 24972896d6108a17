//! Seed 002's `--sampling-config` keys for trained SDE steps, and their resolution order.

use serde::Deserialize;

use super::resample::pool_problems;
use super::{
    EvalFallback, ExplicitSteps, FractionWindow, PerRolloutResample, PlanQuery, Route, RouteSteps,
    SdeStepPlan, SdeSteps, collect,
};
use crate::error::{PlanProblem, ScheduleError};
use crate::sigmas::Sigmas;
use crate::validate::{PlanReport, SdeType, check_routes};

/// The trained-SDE-step keys of a sampling config (seed 002, "Trained SDE steps"). Other keys
/// of the same JSON object are ignored, so the whole `--sampling-config` can be parsed.
///
/// Resolution order:
/// 1. `sde_resample_per_rollout` with a rollout id: `num_sde_steps` drawn from `sde_pool`
///    (default: every step of the fraction window), afresh per rollout;
/// 2. otherwise `sde_indices`, sorted and de-duplicated (the evaluation fallback);
/// 3. otherwise `num_sde_steps` stride-spaced picks of the fraction window.
///
/// ```
/// use schedule::{PlanQuery, SchedulePolicy, SdeStepPlan, SdeType, TrainedStepsConfig};
/// let cfg: TrainedStepsConfig = serde_json::from_str(r#"{"num_inference_steps": 12, "eta": 0.7,
///     "sde_indices": [3, 4, 5], "sde_resample_per_rollout": true, "num_sde_steps": 3,
///     "sde_pool": [1, 2, 3, 4, 5]}"#).unwrap();
/// let sigmas = SchedulePolicy::qwen_image().sample_sigmas(384, 384, 12).unwrap().sigmas;
/// let (plan, report) = cfg.build(SdeType::FlowSde, &sigmas).unwrap();
/// assert!(report.warnings.is_empty());
/// assert_eq!(plan.steps(PlanQuery::evaluation()).unwrap().as_slice(), &[3, 4, 5]);
/// assert_eq!(plan.steps(PlanQuery::rollout(9)).unwrap().len(), 3);
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TrainedStepsConfig {
    /// Denoising steps generated (all of them run; only the resolved subset is trained).
    pub num_inference_steps: usize,
    /// Redraw the trained steps per rollout (highest priority when a rollout id exists).
    #[serde(default)]
    pub sde_resample_per_rollout: bool,
    /// Candidates of the per-rollout draw; `None`: every step of the fraction window.
    #[serde(default)]
    pub sde_pool: Option<Vec<usize>>,
    /// Explicit trained steps; also the evaluation fallback of a resample.
    #[serde(default)]
    pub sde_indices: Option<Vec<usize>>,
    /// Steps per rollout (resample) or stride-spaced picks (window). 0 means none.
    #[serde(default)]
    pub num_sde_steps: usize,
    /// `[lo, hi]`, the normalized window of the schedule.
    #[serde(default = "full_window")]
    pub sde_timestep_fraction: [f64; 2],
}

fn full_window() -> [f64; 2] {
    [0.0, 1.0]
}

/// The plan a [`TrainedStepsConfig`] resolves to.
#[derive(Debug, Clone, PartialEq)]
pub enum ConfiguredPlan {
    /// Per-rollout resample with its evaluation fallback.
    Resample(PerRolloutResample),
    /// `sde_indices`.
    Explicit(ExplicitSteps),
    /// Stride-spaced picks of the fraction window.
    Window(FractionWindow),
}

impl ConfiguredPlan {
    fn inner(&self) -> &dyn SdeStepPlan {
        match self {
            ConfiguredPlan::Resample(p) => p,
            ConfiguredPlan::Explicit(p) => p,
            ConfiguredPlan::Window(p) => p,
        }
    }
}

impl SdeStepPlan for ConfiguredPlan {
    fn name(&self) -> &'static str {
        self.inner().name()
    }

    fn num_steps(&self) -> usize {
        self.inner().num_steps()
    }

    fn steps(&self, query: PlanQuery) -> Result<SdeSteps, ScheduleError> {
        self.inner().steps(query)
    }

    fn reachable(&self) -> Vec<RouteSteps> {
        self.inner().reachable()
    }
}

impl TrainedStepsConfig {
    /// Resolves the plan and validates every live route against the schedule and SDE type, all
    /// problems at once: the explicit list, the pool (or the fraction window standing in for
    /// it) and the window picks, wherever each can make a step trainable.
    ///
    /// # Errors
    /// [`ScheduleError::StepCountMismatch`] when `num_inference_steps` differs from the
    /// schedule; [`ScheduleError::InvalidPlan`] listing every problem otherwise (including "no
    /// SDE configuration at all", which would train nothing).
    pub fn build(
        &self,
        sde: SdeType,
        sigmas: &Sigmas,
    ) -> Result<(ConfiguredPlan, PlanReport), ScheduleError> {
        self.resolve(Some(sde), sigmas)
    }

    /// The plan as the training timesteps of deterministic rollouts (DiffusionNFT, online
    /// Flow-DPO): every step of the rollout runs the solver, and a trained step only names a
    /// noise level `sigma_k` of the forward process `x_sigma = (1 - sigma) x0 + sigma eps`. The
    /// plan's own problems are reported as by [`TrainedStepsConfig::build`], but no transition
    /// is taken at its steps, so no SDE's check applies: step 0 (`sigma = 1`) and the last
    /// step are training timesteps like any other (the DiffusionNFT release walks the
    /// sampler's whole grid).
    ///
    /// ```
    /// use schedule::{PlanQuery, SchedulePolicy, SdeStepPlan, SdeType, TrainedStepsConfig};
    /// let cfg: TrainedStepsConfig = serde_json::from_str(r#"{"num_inference_steps": 12,
    ///     "sde_indices": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]}"#).unwrap();
    /// let sigmas = SchedulePolicy::qwen_image().sample_sigmas(384, 384, 12).unwrap().sigmas;
    /// assert!(cfg.build(SdeType::FlowSde, &sigmas).is_err()); // sigma = 1 at step 0
    /// let plan = cfg.build_timesteps(&sigmas).unwrap();
    /// assert_eq!(plan.steps(PlanQuery::evaluation()).unwrap().len(), 12);
    /// ```
    ///
    /// # Errors
    /// As [`TrainedStepsConfig::build`], less the SDE's problems.
    pub fn build_timesteps(&self, sigmas: &Sigmas) -> Result<ConfiguredPlan, ScheduleError> {
        self.resolve(None, sigmas).map(|(plan, _)| plan)
    }

    /// The plan, its routes checked against `sde`'s transitions when there is one.
    fn resolve(
        &self,
        sde: Option<SdeType>,
        sigmas: &Sigmas,
    ) -> Result<(ConfiguredPlan, PlanReport), ScheduleError> {
        let n = self.num_inference_steps;
        if n != sigmas.num_steps() {
            return Err(ScheduleError::StepCountMismatch {
                plan_steps: n,
                schedule_steps: sigmas.num_steps(),
            });
        }
        let mut problems: Vec<PlanProblem> = Vec::new();
        let mut routes: Vec<RouteSteps> = Vec::new();
        let explicit = self.sde_indices.as_ref().map(|ix| {
            routes.push(RouteSteps {
                route: Route::ExplicitList,
                steps: SdeSteps::new(ix.iter().copied()),
            });
            collect(ExplicitSteps::new(n, ix.iter().copied()), &mut problems)
        });
        // The fraction window is live as the default pool of a resample, or as the picks when
        // there is no explicit list.
        let window_is_pool = self.sde_resample_per_rollout && self.sde_pool.is_none();
        let window_picks_live = self.sde_indices.is_none();
        let mut window_range = None;
        if window_is_pool {
            let mut p = Vec::new();
            let range = FractionWindow::window_of(n, self.sde_timestep_fraction, &mut p);
            if !window_picks_live {
                problems.extend(p);
            }
            routes.push(RouteSteps {
                route: Route::FractionWindow,
                steps: SdeSteps::new(range.clone()),
            });
            window_range = Some(range);
        }
        let picks = if window_picks_live {
            let w = collect(
                FractionWindow::new(n, self.sde_timestep_fraction, self.num_sde_steps),
                &mut problems,
            );
            if let Some(w) = &w {
                routes.extend(w.reachable());
            }
            w
        } else {
            None
        };

        let plan = if self.sde_resample_per_rollout {
            let (pool, route) = match (&self.sde_pool, window_range) {
                (Some(pool), _) => {
                    let pool = SdeSteps::new(pool.iter().copied());
                    routes.push(RouteSteps {
                        route: Route::Pool,
                        steps: pool.clone(),
                    });
                    (pool, Route::Pool)
                }
                (None, Some(range)) => (SdeSteps::new(range), Route::FractionWindow),
                (None, None) => unreachable!("the window stands in for a missing pool"),
            };
            let fallback = match (explicit.flatten(), picks) {
                (Some(e), _) => Some(EvalFallback::Explicit(e)),
                (None, Some(w)) => Some(EvalFallback::Window(w)),
                (None, None) => None,
            };
            match fallback {
                Some(fb) => collect(
                    PerRolloutResample::with_route(n, pool, route, self.num_sde_steps, fb),
                    &mut problems,
                )
                .map(ConfiguredPlan::Resample),
                // the fallback's problems are reported; report the pool's too
                None => {
                    problems.extend(pool_problems(n, &pool, route, self.num_sde_steps));
                    None
                }
            }
        } else if self.sde_indices.is_some() {
            explicit.flatten().map(ConfiguredPlan::Explicit)
        } else {
            picks.map(ConfiguredPlan::Window)
        };

        let mut report = PlanReport::default();
        if let Some(sde) = sde {
            check_routes(&routes, sde, sigmas, &mut problems, &mut report);
        }
        match plan {
            Some(plan) if problems.is_empty() => Ok((plan, report)),
            _ => {
                if problems.is_empty() {
                    unreachable!("a plan that failed to build has reported its problems")
                }
                Err(ScheduleError::InvalidPlan { problems })
            }
        }
    }
}
