//! The update plan of one rollout batch and the frozen pi_old anchor.
//!
//! `num_updates_per_batch` **splits** the local batch into that many disjoint, equal updates;
//! every sample contributes to exactly one optimizer step (nothing is replayed across
//! mini-epochs). The pi_old anchor — the log-probs the ratio is taken against — is recorded for
//! every micro-batch *before any optimizer step* and then frozen: the first update's ratio is
//! therefore exactly 1, and later updates, which run after the weights moved, see real ratios
//! and real clipping.
//!
//! With `num_updates_per_batch = 1` the only update is the first one: the ratio is always
//! exactly 1, so with group-centred advantages the clipped loss is 0 by construction and
//! clipping never engages ([`PlanWarning::SingleUpdate`]).

use std::fmt;
use std::ops::Range;

use burn::tensor::{Tensor, backend::Backend};

use crate::FlowGrpoError;
use crate::loss::host;
use crate::replay::matrix;

/// How the micro-batch size was applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MicroBatching {
    /// Each update is split into micro-batches of `size` samples.
    Split {
        /// Samples per micro-batch.
        size: usize,
    },
    /// The micro-batch size does not divide the update's chunk, so each update is one
    /// micro-batch (unequal chunks would silently reweight the mean).
    Unsplit {
        /// The micro-batch size asked for.
        requested: usize,
        /// The update's chunk size.
        chunk: usize,
    },
}

/// A plan that is valid but probably not what was meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanWarning {
    /// `num_updates_per_batch = 1`: the ratio is always exactly 1.
    SingleUpdate,
    /// The micro-batch size does not divide the chunk; updates run unsplit (more memory).
    MicroBatchNotSplit {
        /// The micro-batch size asked for.
        requested: usize,
        /// The update's chunk size.
        chunk: usize,
    },
}

impl fmt::Display for PlanWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanWarning::SingleUpdate => write!(
                f,
                "num_updates_per_batch = 1: the only update runs against the pi_old anchor it was frozen from, so the \
                 importance ratio is exactly 1, the clipped loss is 0 by construction with group-centred advantages, \
                 and clipping never engages; use 2 or more"
            ),
            PlanWarning::MicroBatchNotSplit { requested, chunk } => write!(
                f,
                "micro_batch_size = {requested} does not divide the update chunk of {chunk} samples; each update runs \
                 as one micro-batch of {chunk} (unequal chunks would reweight the mean)"
            ),
        }
    }
}

/// One optimizer update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedUpdate {
    /// The update's position (0 is the first: its ratio is exactly 1).
    pub index: usize,
    /// The samples it trains on (indices into the local batch).
    pub samples: Range<usize>,
    /// Its micro-batches, in order; they tile `samples`.
    pub micro_batches: Vec<Range<usize>>,
}

impl PlannedUpdate {
    /// The weight of micro-batch `i`'s mean loss in the update's mean: `len_i / chunk` (equal
    /// for an even split). Accumulating `weight * loss_i` gradients gives the gradient of the
    /// mean over the whole chunk.
    pub fn micro_batch_weight(&self, i: usize) -> f64 {
        self.micro_batches[i].len() as f64 / self.samples.len() as f64
    }
}

/// The plan of one local batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdatePlan {
    /// The local batch size.
    pub num_samples: usize,
    /// The updates, in order; they tile `0..num_samples`.
    pub updates: Vec<PlannedUpdate>,
    /// How the micro-batch size was applied.
    pub micro_batching: MicroBatching,
    /// Things worth logging loudly.
    pub warnings: Vec<PlanWarning>,
}

impl UpdatePlan {
    /// Every micro-batch of every update, in execution order.
    pub fn micro_batches(&self) -> impl Iterator<Item = &Range<usize>> {
        self.updates.iter().flat_map(|u| u.micro_batches.iter())
    }
}

/// Plans `num_updates_per_batch` disjoint equal updates over `num_samples` samples, each split
/// into micro-batches of `micro_batch_size` when that divides the chunk.
///
/// # Errors
/// [`FlowGrpoError::ZeroPlanParameter`], [`FlowGrpoError::Empty`] for an empty batch,
/// [`FlowGrpoError::UpdatesNotDivisible`].
///
/// ```
/// use flow_grpo::{plan_updates, MicroBatching, PlanWarning};
/// let plan = plan_updates(8, 2, 2).unwrap();
/// assert_eq!(plan.updates[0].samples, 0..4);
/// assert_eq!(plan.updates[1].micro_batches, vec![4..6, 6..8]);
/// assert_eq!(plan.micro_batching, MicroBatching::Split { size: 2 });
/// assert!(plan.warnings.is_empty());
/// // 3 does not divide the chunk of 4: no split, and a warning
/// assert_eq!(plan_updates(8, 2, 3).unwrap().updates[0].micro_batches, vec![0..4]);
/// assert_eq!(plan_updates(8, 1, 8).unwrap().warnings, vec![PlanWarning::SingleUpdate]);
/// assert!(plan_updates(8, 3, 1).is_err());
/// ```
pub fn plan_updates(
    num_samples: usize,
    num_updates_per_batch: usize,
    micro_batch_size: usize,
) -> Result<UpdatePlan, FlowGrpoError> {
    if num_updates_per_batch == 0 {
        return Err(FlowGrpoError::ZeroPlanParameter {
            what: "num_updates_per_batch",
        });
    }
    if micro_batch_size == 0 {
        return Err(FlowGrpoError::ZeroPlanParameter {
            what: "micro_batch_size",
        });
    }
    if num_samples == 0 {
        return Err(FlowGrpoError::Empty {
            what: "local batch",
        });
    }
    if !num_samples.is_multiple_of(num_updates_per_batch) {
        return Err(FlowGrpoError::UpdatesNotDivisible {
            samples: num_samples,
            num_updates: num_updates_per_batch,
        });
    }
    let chunk = num_samples / num_updates_per_batch;
    let mut warnings = Vec::new();
    if num_updates_per_batch == 1 {
        warnings.push(PlanWarning::SingleUpdate);
    }
    let micro_batching = if chunk.is_multiple_of(micro_batch_size) {
        MicroBatching::Split {
            size: micro_batch_size,
        }
    } else {
        warnings.push(PlanWarning::MicroBatchNotSplit {
            requested: micro_batch_size,
            chunk,
        });
        MicroBatching::Unsplit {
            requested: micro_batch_size,
            chunk,
        }
    };
    let mb = match micro_batching {
        MicroBatching::Split { size } => size,
        MicroBatching::Unsplit { .. } => chunk,
    };
    let updates = (0..num_updates_per_batch)
        .map(|index| {
            let start = index * chunk;
            PlannedUpdate {
                index,
                samples: start..start + chunk,
                micro_batches: (start..start + chunk)
                    .step_by(mb)
                    .map(|s| s..s + mb)
                    .collect(),
            }
        })
        .collect();
    Ok(UpdatePlan {
        num_samples,
        updates,
        micro_batching,
        warnings,
    })
}

/// Collects the pi_old log-probs of every sample before any optimizer step.
///
/// Record each micro-batch's replayed log-probs (a full pass over the plan with no optimizer
/// step in between), then [`AnchorRecorder::freeze`]. The frozen [`PolicyAnchor`] cannot be
/// recorded into again, and freezing refuses an incomplete anchor.
#[derive(Debug, Clone)]
pub struct AnchorRecorder {
    num_samples: usize,
    steps: Option<usize>,
    values: Vec<f64>,
    filled: Vec<bool>,
}

/// The frozen pi_old log-probs of a local batch, `[samples, steps]`, held on the host bit for
/// bit (values widened exactly to `f64`).
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyAnchor {
    num_samples: usize,
    steps: usize,
    values: Vec<f64>,
}

impl AnchorRecorder {
    /// A recorder for a plan's local batch.
    pub fn new(plan: &UpdatePlan) -> Self {
        Self {
            num_samples: plan.num_samples,
            steps: None,
            values: Vec::new(),
            filled: vec![false; plan.num_samples],
        }
    }

    /// Records the log-probs `[samples.len(), steps]` of `samples` (detached, copied to the
    /// host).
    ///
    /// # Errors
    /// [`FlowGrpoError::AnchorRange`] for a range outside the batch or already recorded,
    /// [`FlowGrpoError::ShapeMismatch`] for a wrong shape or a step count that differs from an
    /// earlier record, [`FlowGrpoError::NonFiniteLogProb`].
    pub fn record<B: Backend>(
        &mut self,
        samples: Range<usize>,
        log_probs: Tensor<B, 2>,
    ) -> Result<(), FlowGrpoError> {
        let range_err = |problem| FlowGrpoError::AnchorRange {
            start: samples.start,
            end: samples.end,
            samples: self.num_samples,
            problem,
        };
        if samples.start >= samples.end || samples.end > self.num_samples {
            return Err(range_err("is empty or outside the batch"));
        }
        if self.filled[samples.clone()].iter().any(|f| *f) {
            return Err(range_err(
                "were already recorded (the anchor is recorded once)",
            ));
        }
        let [n, s] = log_probs.dims();
        let steps = *self.steps.get_or_insert(s);
        if n != samples.len() || s != steps || s == 0 {
            return Err(FlowGrpoError::ShapeMismatch {
                what: "anchor log-probs",
                got: vec![n, s],
                expected: vec![samples.len(), steps],
            });
        }
        let v = host(log_probs.detach());
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(FlowGrpoError::NonFiniteLogProb {
                sample: samples.start + i / s,
                step: i % s,
                value: v[i],
            });
        }
        if self.values.is_empty() {
            self.values = vec![0.0; self.num_samples * steps];
        }
        self.values[samples.start * steps..samples.end * steps].copy_from_slice(&v);
        self.filled[samples].iter_mut().for_each(|f| *f = true);
        Ok(())
    }

    /// Freezes the anchor.
    ///
    /// # Errors
    /// [`FlowGrpoError::AnchorIncomplete`] when a sample was never recorded.
    pub fn freeze(self) -> Result<PolicyAnchor, FlowGrpoError> {
        let missing = self.filled.iter().filter(|f| !**f).count();
        if missing > 0 {
            return Err(FlowGrpoError::AnchorIncomplete {
                missing,
                samples: self.num_samples,
                first: self.filled.iter().position(|f| !*f).unwrap_or(0),
            });
        }
        Ok(PolicyAnchor {
            num_samples: self.num_samples,
            steps: self.steps.unwrap_or(0),
            values: self.values,
        })
    }
}

impl PolicyAnchor {
    /// An anchor taken directly from the sampler's stored log-probs (`[samples, steps]`
    /// row-major), for when the engine's log-probs are trusted as pi_old.
    ///
    /// # Errors
    /// [`FlowGrpoError::ShapeMismatch`], [`FlowGrpoError::Empty`],
    /// [`FlowGrpoError::NonFiniteLogProb`].
    pub fn from_rollout(
        values: &[f32],
        num_samples: usize,
        steps: usize,
    ) -> Result<Self, FlowGrpoError> {
        if num_samples == 0 || steps == 0 {
            return Err(FlowGrpoError::Empty {
                what: "rollout log-probs",
            });
        }
        if values.len() != num_samples * steps {
            return Err(FlowGrpoError::ShapeMismatch {
                what: "rollout log-probs",
                got: vec![values.len()],
                expected: vec![num_samples * steps],
            });
        }
        if let Some(i) = values.iter().position(|x| !x.is_finite()) {
            return Err(FlowGrpoError::NonFiniteLogProb {
                sample: i / steps,
                step: i % steps,
                value: f64::from(values[i]),
            });
        }
        Ok(Self {
            num_samples,
            steps,
            values: values.iter().map(|&v| f64::from(v)).collect(),
        })
    }

    /// The number of trained steps per sample.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// The anchor of `samples`, `[samples.len(), steps]`, on `device` (no autodiff history).
    ///
    /// # Errors
    /// [`FlowGrpoError::AnchorRange`] for a range outside the batch.
    pub fn log_probs<B: Backend>(
        &self,
        samples: Range<usize>,
        device: &B::Device,
    ) -> Result<Tensor<B, 2>, FlowGrpoError> {
        if samples.start >= samples.end || samples.end > self.num_samples {
            return Err(FlowGrpoError::AnchorRange {
                start: samples.start,
                end: samples.end,
                samples: self.num_samples,
                problem: "is empty or outside the batch",
            });
        }
        let v = self.values[samples.start * self.steps..samples.end * self.steps].to_vec();
        Ok(matrix(v, samples.len(), self.steps, device))
    }
}
