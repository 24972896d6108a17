//! The one error type of `flow-grpo`.

use std::fmt;

use sde_math::SdeError;
use thiserror::Error;

/// Everything that can be wrong with the inputs of an objective, an advantage computation or an
/// update plan. Every variant names the bad value and what was allowed.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum FlowGrpoError {
    /// An advantage configuration is invalid; every problem is listed.
    #[error("invalid advantage configuration: {}", List(problems))]
    InvalidAdvantageConfig {
        /// All problems found.
        problems: Vec<ConfigProblem>,
    },

    /// A required reward component is absent for a sample: the whole group fails.
    #[error("group {group}, sample {sample}: required reward component {component:?} is missing")]
    MissingComponent {
        /// Group index.
        group: usize,
        /// Sample index within the group.
        sample: usize,
        /// The component.
        component: String,
    },

    /// A required reward component is NaN or infinite for a sample: the whole group fails
    /// (never a NaN that trains).
    #[error("group {group}, sample {sample}: required reward component {component:?} is {value}")]
    NonFiniteComponent {
        /// Group index.
        group: usize,
        /// Sample index within the group.
        sample: usize,
        /// The component.
        component: String,
        /// The value.
        value: f64,
    },

    /// Some groups failed (see [`Advantages::check_no_failures`](crate::Advantages::check_no_failures)).
    #[error("{} of {groups} reward groups failed; first: {}", failures.len(), failures.first().map(|f| f.to_string()).unwrap_or_default())]
    GroupsFailed {
        /// The failures, one per failed group.
        failures: Vec<FlowGrpoError>,
        /// The number of groups.
        groups: usize,
    },

    /// There is nothing to compute on.
    #[error("{what} is empty")]
    Empty {
        /// What is empty.
        what: &'static str,
    },

    /// A PPO clip range is invalid.
    #[error(
        "invalid clip range: ratio band [1 - {low}, 1 + {high}]; expected 0 < low <= 1 and 0 < high, both finite"
    )]
    InvalidClipRange {
        /// The lower epsilon.
        low: f64,
        /// The upper epsilon.
        high: f64,
    },

    /// Two tensors that must agree in shape do not.
    #[error("shape mismatch: {what} has shape {got:?}, expected {expected:?}")]
    ShapeMismatch {
        /// Which tensor.
        what: &'static str,
        /// Its shape.
        got: Vec<usize>,
        /// The shape expected.
        expected: Vec<usize>,
    },

    /// A transition could not be replayed.
    #[error("replay of trained step {step} failed: {source}")]
    Replay {
        /// The trained-step position.
        step: usize,
        /// The kernel's error.
        #[source]
        source: SdeError,
    },

    /// The closed-form reference KL needs the two transitions to share their std (same kernel,
    /// same sigmas); these do not.
    #[error(
        "KL form {form} needs equal transition stds; sample {sample} has policy std {policy} and reference std {reference}"
    )]
    StdMismatch {
        /// The KL form asked for.
        form: &'static str,
        /// The first sample that differs.
        sample: usize,
        /// The policy's std.
        policy: f64,
        /// The reference's std.
        reference: f64,
    },

    /// The batch cannot be split into equal updates.
    #[error(
        "num_updates_per_batch = {num_updates} does not divide the local batch of {samples} samples; \
         every sample must contribute to exactly one of {num_updates} equal updates"
    )]
    UpdatesNotDivisible {
        /// The local batch size.
        samples: usize,
        /// The number of updates asked for.
        num_updates: usize,
    },

    /// A plan parameter is zero.
    #[error("{what} must be >= 1, got 0")]
    ZeroPlanParameter {
        /// The parameter.
        what: &'static str,
    },

    /// An anchor was recorded for samples outside the plan, twice, or with the wrong shape.
    #[error("anchor samples {start}..{end} {problem} (batch of {samples} samples)")]
    AnchorRange {
        /// Range start.
        start: usize,
        /// Range end.
        end: usize,
        /// The local batch size.
        samples: usize,
        /// What is wrong.
        problem: &'static str,
    },

    /// An anchor was frozen before every sample was recorded.
    #[error(
        "the pi_old anchor is incomplete: {missing} of {samples} samples were never recorded (first: {first})"
    )]
    AnchorIncomplete {
        /// Samples not recorded.
        missing: usize,
        /// The local batch size.
        samples: usize,
        /// The first sample not recorded.
        first: usize,
    },

    /// A log-prob fed to the anchor is NaN or infinite.
    #[error("anchor log-prob of sample {sample}, trained step {step} is {value}")]
    NonFiniteLogProb {
        /// Sample index in the local batch.
        sample: usize,
        /// Trained-step position.
        step: usize,
        /// The value.
        value: f64,
    },

    /// A scalar parameter of an objective is outside its range.
    #[error("{what} = {given}; expected {allowed}")]
    InvalidParameter {
        /// Which parameter.
        what: &'static str,
        /// The value given.
        given: f64,
        /// What is allowed.
        allowed: &'static str,
    },
}

/// One problem of an [`AdvantageConfig`](crate::AdvantageConfig).
#[derive(Debug, Clone, PartialEq)]
pub enum ConfigProblem {
    /// No reward component is configured.
    NoComponents,
    /// Two components share a name.
    DuplicateComponent {
        /// The name.
        name: String,
    },
    /// A component's name is empty.
    EmptyComponentName,
    /// A component's weight is not finite.
    ComponentWeight {
        /// The component.
        name: String,
        /// The weight.
        weight: f64,
    },
    /// No component is required, so a sample with every component missing would train on 0.
    NoRequiredComponent,
    /// The std epsilon is negative or not finite.
    StdEpsilon {
        /// The value.
        value: f64,
    },
    /// The advantage clip bound is not finite and positive.
    Clip {
        /// The value.
        value: f64,
    },
    /// The degenerate-variance threshold is negative or not finite.
    DegenerateThreshold {
        /// The value.
        value: f64,
    },
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigProblem::NoComponents => write!(f, "no reward component configured"),
            ConfigProblem::DuplicateComponent { name } => {
                write!(f, "reward component {name:?} is configured twice")
            }
            ConfigProblem::EmptyComponentName => write!(f, "a reward component has an empty name"),
            ConfigProblem::ComponentWeight { name, weight } => write!(
                f,
                "reward component {name:?} has weight {weight}; expected a finite value"
            ),
            ConfigProblem::NoRequiredComponent => write!(
                f,
                "no reward component is required; at least one must be, or a sample scored by nothing trains on 0"
            ),
            ConfigProblem::StdEpsilon { value } => {
                write!(f, "std epsilon {value}; expected a finite value >= 0")
            }
            ConfigProblem::Clip { value } => {
                write!(
                    f,
                    "advantage clip {value}; expected a finite value > 0 (or no clip)"
                )
            }
            ConfigProblem::DegenerateThreshold { value } => write!(
                f,
                "degenerate-variance threshold {value}; expected a finite value >= 0"
            ),
        }
    }
}

struct List<'a>(&'a [ConfigProblem]);

impl fmt::Display for List<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, "; ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}
