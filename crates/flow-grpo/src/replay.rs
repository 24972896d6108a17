//! Replay log-probs of stored transitions, through `sde-math`'s one shared transition.

use burn::tensor::{Tensor, TensorData, backend::Backend};
use sde_math::{Kernel, Sigmas, StorageDtype, Transition};

use crate::FlowGrpoError;
use crate::loss::host;
use crate::stats::nan_max;

/// One stored trained step of a batch of candidates, with the current policy's model output.
///
/// `D` is the rank of a latent batch, `[batch, ...latent]`.
#[derive(Debug, Clone)]
pub struct ReplayStep<B: Backend, const D: usize> {
    /// The step's sigmas (shared or per sample).
    pub sigmas: Sigmas,
    /// `x_k` as stored, `[batch, ...]`.
    pub sample: Tensor<B, D>,
    /// `x_{k+1}` as stored, `[batch, ...]`.
    pub prev_sample: Tensor<B, D>,
    /// The model's velocity at `(x_k, sigma_k)` under the policy being scored, `[batch, ...]`;
    /// the log-prob is differentiable in it.
    pub model_output: Tensor<B, D>,
}

/// The replayed trained steps of a batch.
#[derive(Debug, Clone)]
pub struct ReplayedSteps<B: Backend, const D: usize> {
    /// `[batch, steps]`: column `s` is the log-prob of trained step `s`, the input of
    /// [`grpo_clip_loss`](crate::grpo_clip_loss).
    pub log_probs: Tensor<B, 2>,
    /// Each step's full transition (mean, std, ...), e.g. for [`kl_to_reference`](crate::kl_to_reference).
    pub transitions: Vec<Transition<B, D>>,
}

/// Scores stored transitions under the current model outputs with `kernel.replay` (the same
/// transition function the sampler used) and stacks the per-step log-probs into a
/// `[batch, steps]` matrix.
///
/// `storage` must be the precision the trajectory stored its samples at: replay applies the
/// same round trip as sampling (a no-op on values already at that precision), so a replay of
/// an unchanged policy reproduces the sampler's log-prob bit for bit.
///
/// # Errors
/// [`FlowGrpoError::Empty`] with no steps, [`FlowGrpoError::ShapeMismatch`] when the steps'
/// batch sizes differ, [`FlowGrpoError::Replay`] for any kernel error (bad sigmas, shapes,
/// `sigma == 1` under Flow-SDE).
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// use flow_grpo::{replay_log_probs, ReplayStep};
/// use sde_math::{Kernel, StepSigmas, StorageDtype};
/// let dev = Default::default();
/// let k = Kernel::flow_sde(0.7).unwrap();
/// let at = StepSigmas::new(0.8, 0.7).unwrap().into();
/// let x = Tensor::<Flex, 2>::from_floats([[0.1, -0.4], [0.3, 0.9]], &dev);
/// let v = Tensor::<Flex, 2>::from_floats([[0.5, 0.2], [-0.1, 0.4]], &dev);
/// let noise = Tensor::<Flex, 2>::from_floats([[1.0, -0.5], [0.25, 2.0]], &dev);
/// let rollout = k.sample(&at, v.clone(), x.clone(), noise, StorageDtype::Bf16).unwrap();
/// let step = ReplayStep { sigmas: at, sample: x, prev_sample: rollout.prev_sample, model_output: v };
/// let replay = replay_log_probs(&k, StorageDtype::Bf16, vec![step]).unwrap();
/// assert_eq!(replay.log_probs.dims(), [2, 1]);
/// assert_eq!(
///     replay.log_probs.reshape([2]).into_data().to_vec::<f32>().unwrap(),
///     rollout.log_prob.into_data().to_vec::<f32>().unwrap()
/// );
/// ```
pub fn replay_log_probs<B: Backend, const D: usize>(
    kernel: &Kernel,
    storage: StorageDtype,
    steps: Vec<ReplayStep<B, D>>,
) -> Result<ReplayedSteps<B, D>, FlowGrpoError> {
    let batch = steps
        .first()
        .ok_or(FlowGrpoError::Empty {
            what: "replay steps",
        })?
        .sample
        .dims()[0];
    let mut transitions = Vec::with_capacity(steps.len());
    let mut columns = Vec::with_capacity(steps.len());
    for (i, step) in steps.into_iter().enumerate() {
        if step.sample.dims()[0] != batch {
            return Err(FlowGrpoError::ShapeMismatch {
                what: "replay step sample",
                got: step.sample.dims().to_vec(),
                expected: vec![batch],
            });
        }
        let t = kernel
            .replay(
                &step.sigmas,
                step.model_output,
                step.sample,
                step.prev_sample,
                storage,
            )
            .map_err(|source| FlowGrpoError::Replay { step: i, source })?;
        columns.push(t.log_prob.clone().reshape([batch, 1]));
        transitions.push(t);
    }
    Ok(ReplayedSteps {
        log_probs: Tensor::cat(columns, 1),
        transitions,
    })
}

/// How closely two log-prob matrices agree (the `[logp parity]` check: the replayed pi_old
/// anchor against the engine's own sampling log-probs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogProbParity {
    /// Largest `|a - b|`; NaN if any difference is NaN (a NaN log-prob on either side, or
    /// `inf - inf`), never a small number.
    pub max_abs_diff: f64,
    /// Mean `|a - b|` (NaN likewise).
    pub mean_abs_diff: f64,
    /// Fraction of elements that are bitwise equal (after widening to `f64`).
    pub bitwise_equal_fraction: f64,
}

/// Compares two `[batch, steps]` log-prob matrices.
///
/// # Errors
/// [`FlowGrpoError::ShapeMismatch`], [`FlowGrpoError::Empty`].
pub fn log_prob_parity<B: Backend>(
    a: Tensor<B, 2>,
    b: Tensor<B, 2>,
) -> Result<LogProbParity, FlowGrpoError> {
    if a.dims() != b.dims() {
        return Err(FlowGrpoError::ShapeMismatch {
            what: "parity log-probs",
            got: b.dims().to_vec(),
            expected: a.dims().to_vec(),
        });
    }
    let (a, b) = (host(a.detach()), host(b.detach()));
    if a.is_empty() {
        return Err(FlowGrpoError::Empty {
            what: "log-prob matrix",
        });
    }
    let diffs: Vec<f64> = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).collect();
    let equal = a
        .iter()
        .zip(&b)
        .filter(|(x, y)| x.to_bits() == y.to_bits())
        .count();
    Ok(LogProbParity {
        // every |a - b| >= 0, so the max of a non-empty matrix is never below 0
        max_abs_diff: nan_max(diffs.iter().copied()),
        mean_abs_diff: diffs.iter().sum::<f64>() / diffs.len() as f64,
        bitwise_equal_fraction: equal as f64 / a.len() as f64,
    })
}

/// A `[rows, cols]` tensor from row-major host values (a helper for anchors and fixtures).
pub(crate) fn matrix<B: Backend>(
    values: Vec<f64>,
    rows: usize,
    cols: usize,
    device: &B::Device,
) -> Tensor<B, 2> {
    Tensor::from_data(TensorData::new(values, [rows, cols]), device)
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::tensor::Tensor;

    use super::log_prob_parity;

    fn m(v: [[f64; 2]; 2]) -> Tensor<Flex, 2> {
        Tensor::from_data(v, &Default::default())
    }

    #[test]
    fn equal_log_probs_have_parity_zero() {
        let a = [[-1.0, -2.5], [-0.5, -3.0]];
        let p = log_prob_parity(m(a), m(a)).unwrap();
        assert_eq!((p.max_abs_diff, p.bitwise_equal_fraction), (0.0, 1.0));
    }

    /// A NaN log-prob on either side is reported as NaN parity, not as the largest finite
    /// difference (the old `fold(0.0, f64::max)` read it as parity 0).
    #[test]
    fn a_nan_log_prob_gives_nan_parity() {
        let a = [[-1.0, -2.5], [-0.5, -3.0]];
        for at in 0..4 {
            let mut b = a;
            b[at / 2][at % 2] = f64::NAN;
            for p in [
                log_prob_parity(m(a), m(b)).unwrap(),
                log_prob_parity(m(b), m(a)).unwrap(),
            ] {
                assert!(p.max_abs_diff.is_nan(), "NaN at {at}: {p:?}");
                assert!(p.mean_abs_diff.is_nan(), "NaN at {at}: {p:?}");
                assert_eq!(p.bitwise_equal_fraction, 0.75);
            }
        }
    }
}
