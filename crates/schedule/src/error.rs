//! The one error type of `schedule`, and the itemised problems it can carry.

use std::fmt;
use std::path::PathBuf;

use thiserror::Error;

use crate::plan::Route;

/// Everything that can go wrong while loading a scheduler config, building a schedule or a
/// plan of trained SDE steps, or validating them.
///
/// Configuration errors list every problem at once ([`ConfigProblem`], [`PlanProblem`]), each
/// naming the value given and what is allowed.
#[derive(Debug, Error)]
pub enum ScheduleError {
    /// The scheduler config file could not be read.
    #[error("cannot read scheduler config {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },

    /// The scheduler config is not valid JSON, or a key has the wrong JSON type.
    #[error("scheduler config {path} is not a valid diffusers scheduler config")]
    Json {
        /// The file, or `<memory>` for a string.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },

    /// The scheduler config (or a hand-built policy) is invalid; every problem is listed.
    #[error("invalid schedule configuration ({} problem(s)): {}", problems.len(), join(problems))]
    InvalidConfig {
        /// All problems found.
        problems: Vec<ConfigProblem>,
    },

    /// `sample_sigmas` was called with a zero height, width or step count.
    #[error(
        "invalid sampling geometry: height = {height}, width = {width}, steps = {steps}; all three must be >= 1"
    )]
    InvalidGeometry {
        /// Image height in pixels.
        height: u32,
        /// Image width in pixels.
        width: u32,
        /// Number of denoising steps.
        steps: usize,
    },

    /// A sigma sequence is not a valid schedule.
    #[error(
        "invalid sigma schedule: {defect} (sigmas = {sigmas:?}); expected finite f32 values, strictly decreasing, \
         starting at most at 1 and ending at exactly 0, with at least one step"
    )]
    InvalidSigmas {
        /// What is wrong.
        defect: SigmasDefect,
        /// The sequence given.
        sigmas: Vec<f32>,
    },

    /// A plan of trained SDE steps is invalid; every problem is listed.
    #[error("invalid SDE-step plan ({} problem(s)): {}", problems.len(), join(problems))]
    InvalidPlan {
        /// All problems found.
        problems: Vec<PlanProblem>,
    },

    /// A plan that can only be evaluated for a training rollout was asked for steps without a
    /// rollout id (evaluation).
    #[error("the {plan} plan needs a rollout id; it has no evaluation fallback")]
    RolloutIdRequired {
        /// The plan's name.
        plan: &'static str,
    },

    /// A plan built for one step count was used with a schedule of another.
    #[error(
        "the SDE-step plan indexes {plan_steps} denoising steps but the schedule has {schedule_steps}"
    )]
    StepCountMismatch {
        /// Steps the plan indexes.
        plan_steps: usize,
        /// Steps of the schedule (`sigmas.len() - 1`).
        schedule_steps: usize,
    },
}

/// What is wrong with a sigma sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SigmasDefect {
    /// Fewer than two values (no step).
    TooShort,
    /// A value is NaN or infinite.
    NotFinite {
        /// Its index.
        index: usize,
    },
    /// A value is above 1 or below 0.
    OutOfRange {
        /// Its index.
        index: usize,
    },
    /// `sigmas[index] >= sigmas[index - 1]`.
    NotDecreasing {
        /// The index of the value that does not decrease.
        index: usize,
    },
    /// The last value is not exactly 0.
    LastNotZero,
}

impl fmt::Display for SigmasDefect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SigmasDefect::TooShort => write!(f, "fewer than 2 values"),
            SigmasDefect::NotFinite { index } => write!(f, "value {index} is not finite"),
            SigmasDefect::OutOfRange { index } => write!(f, "value {index} is outside [0, 1]"),
            SigmasDefect::NotDecreasing { index } => {
                write!(f, "value {index} is not below value {}", index - 1)
            }
            SigmasDefect::LastNotZero => write!(f, "the last value is not 0"),
        }
    }
}

/// One problem of a scheduler configuration.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ConfigProblem {
    /// A numeric setting is outside its allowed range.
    #[error("{key} = {value}; expected {expected}")]
    OutOfRange {
        /// The config key.
        key: &'static str,
        /// The value given.
        value: f64,
        /// What is allowed.
        expected: &'static str,
    },
    /// A diffusers option this crate does not implement is switched on.
    #[error("{key} = {value} is not supported; {why}")]
    Unsupported {
        /// The config key.
        key: &'static str,
        /// The value given, as JSON.
        value: String,
        /// Why, and what to do instead.
        why: &'static str,
    },
    /// A key of a `FlowMatchEulerDiscreteScheduler` config that this crate does not implement
    /// (or `stochastic_sampling` switched on).
    #[error("{key} = {value}: {why}")]
    UnknownKey {
        /// The key.
        key: String,
        /// Its value, as JSON.
        value: String,
        /// Why it is refused.
        why: &'static str,
    },
    /// `time_shift_type` is neither `"exponential"` nor `"linear"`.
    #[error("time_shift_type = {value:?}; expected \"exponential\" or \"linear\"")]
    UnknownTimeShift {
        /// The value given.
        value: String,
    },
    /// The scheduler class is not one whose sigma schedule this crate reproduces.
    #[error(
        "_class_name = {value:?}; expected \"FlowMatchEulerDiscreteScheduler\" or \"UniPCMultistepScheduler\" (with use_flow_sigmas)"
    )]
    UnknownScheduler {
        /// The class name given.
        value: String,
    },
    /// A dynamic-shift setting needed to derive `mu` is missing (`null`).
    #[error("{key} is null but use_dynamic_shifting is on and the default compute_mu needs it")]
    Missing {
        /// The config key.
        key: &'static str,
    },
    /// The base grid cannot be combined with a setting (it has no reference behaviour).
    #[error("the {grid} grid cannot be combined with {setting}: {why}")]
    GridConflict {
        /// The grid's name.
        grid: &'static str,
        /// The conflicting setting.
        setting: &'static str,
        /// Why.
        why: &'static str,
    },
}

/// One problem of a plan of trained SDE steps, naming the route it was found on.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum PlanProblem {
    /// A step whose sigma is 1 can become trainable under Flow-SDE, where the diffusion
    /// coefficient `a * sqrt(sigma / (1 - sigma))` is singular.
    #[error(
        "{route} can make step(s) {steps:?} trainable under Flow-SDE, but sigma = 1 there and the coefficient \
         sqrt(sigma / (1 - sigma)) is singular; start the plan at step >= 1 (e.g. sde_indices [1, 3, 5], \
         sde_pool [1, 2, 3, 4, 5], or a sde_timestep_fraction starting above 1/num_inference_steps)"
    )]
    SingularStep {
        /// The route.
        route: Route,
        /// The offending step indices.
        steps: Vec<usize>,
    },
    /// A CPS step into `sigma_next = 0` has transition std 0 and no density.
    #[error(
        "{route} can make the last step {step} trainable under CPS, whose transition std is 0 there (no density)"
    )]
    DegenerateLastStep {
        /// The route.
        route: Route,
        /// The last step index.
        step: usize,
    },
    /// A step index is not below the number of denoising steps.
    #[error(
        "{route} contains step(s) {steps:?}, but there are only {num_steps} steps (0..{num_steps})"
    )]
    OutOfRange {
        /// The route.
        route: Route,
        /// The offending indices.
        steps: Vec<usize>,
        /// The number of denoising steps.
        num_steps: usize,
    },
    /// A route selects nothing.
    #[error("{route} selects no step")]
    Empty {
        /// The route.
        route: Route,
    },
    /// More steps are asked for than the route can provide.
    #[error("{route} is asked for {wanted} distinct steps but offers only {available}")]
    TooFew {
        /// The route.
        route: Route,
        /// Steps asked for.
        wanted: usize,
        /// Steps available.
        available: usize,
    },
    /// A numeric plan parameter is outside its allowed range.
    #[error("{route}: {name} = {value}; expected {expected}")]
    Parameter {
        /// The route.
        route: Route,
        /// The parameter.
        name: &'static str,
        /// The value given.
        value: f64,
        /// What is allowed.
        expected: &'static str,
    },
}

fn join<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}
