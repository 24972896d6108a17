//! The clipped GRPO objective over a `[samples, trained steps]` log-prob matrix.

use burn::tensor::{Tensor, backend::Backend};

use crate::FlowGrpoError;
use crate::stats::{nan_max, nan_min};

/// The PPO ratio band `[1 - low, 1 + high]`. There is no default: FlowGRPO uses a tiny range
/// (`1e-4` in the shipped recipes, `1e-3` in flow_grpo's), not text RL's `0.2`.
///
/// ```
/// use flow_grpo::ClipRange;
/// let c = ClipRange::symmetric(1e-4).unwrap();
/// assert_eq!((c.lower_bound(), c.upper_bound()), (1.0 - 1e-4, 1.0 + 1e-4));
/// assert!(ClipRange::asymmetric(0.2, 0.28).is_ok());
/// assert!(ClipRange::symmetric(0.0).is_err());
/// assert!(ClipRange::asymmetric(1.0, 1.0).is_ok()); // AWM's released [0, 2]
/// assert!(ClipRange::asymmetric(1.5, 0.1).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClipRange {
    low: f64,
    high: f64,
}

impl ClipRange {
    /// `[1 - eps, 1 + eps]`.
    ///
    /// # Errors
    /// [`FlowGrpoError::InvalidClipRange`] unless `0 < eps < 1`.
    pub fn symmetric(eps: f64) -> Result<Self, FlowGrpoError> {
        Self::asymmetric(eps, eps)
    }

    /// `[1 - low, 1 + high]` (an asymmetric "clip-higher" band).
    ///
    /// # Errors
    /// [`FlowGrpoError::InvalidClipRange`] unless `0 < low <= 1` and `0 < high`, both finite
    /// (`low = 1`, a lower bound of 0, is AWM's released band `[0, 2]`).
    pub fn asymmetric(low: f64, high: f64) -> Result<Self, FlowGrpoError> {
        let ok = low.is_finite() && high.is_finite() && low > 0.0 && low <= 1.0 && high > 0.0;
        if ok {
            Ok(Self { low, high })
        } else {
            Err(FlowGrpoError::InvalidClipRange { low, high })
        }
    }

    /// `low`.
    pub fn low(&self) -> f64 {
        self.low
    }

    /// `high`.
    pub fn high(&self) -> f64 {
        self.high
    }

    /// `1 - low`.
    pub fn lower_bound(&self) -> f64 {
        1.0 - self.low
    }

    /// `1 + high`.
    pub fn upper_bound(&self) -> f64 {
        1.0 + self.high
    }
}

/// Health of the clipped objective (`train/ratio_*`, `train/clip_fraction`,
/// `train/approx_kl`), computed on the host in `f64` over every (sample, step) element.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClipDiagnostics {
    /// Mean ratio.
    pub ratio_mean: f64,
    /// Population std of the ratio.
    pub ratio_std: f64,
    /// Smallest ratio; NaN if any ratio is NaN (a NaN log-prob or anchor).
    pub ratio_min: f64,
    /// Largest ratio; NaN if any ratio is NaN.
    pub ratio_max: f64,
    /// Fraction of elements whose ratio lies outside `[1 - low, 1 + high]` (flow_grpo's
    /// `clipfrac`).
    pub clip_fraction: f64,
    /// Fraction of elements whose gradient the clip removes (`A > 0` and ratio above the band,
    /// or `A < 0` and ratio below it).
    pub clipped_gradient_fraction: f64,
    /// `0.5 * mean((log_prob - anchor)^2)` (flow_grpo's `approx_kl`).
    pub approx_kl: f64,
    /// The number of (sample, step) elements.
    pub elements: usize,
}

/// The clipped objective and its diagnostics.
#[derive(Debug, Clone)]
pub struct ClipLoss<B: Backend> {
    /// The loss to minimise, shape `[1]`: the mean over every (sample, step) element.
    pub loss: Tensor<B, 1>,
    /// The per-element terms, `[samples, steps]`: `max(-A r, -A clip(r))`.
    pub per_element: Tensor<B, 2>,
    /// Detached ratios `exp(log_prob - anchor)`, `[samples, steps]`.
    pub ratio: Tensor<B, 2>,
    /// Host diagnostics.
    pub diagnostics: ClipDiagnostics,
}

/// The clipped GRPO objective (PPO-clip with group-relative advantages), per (sample, step),
/// mean-reduced over both axes:
///
/// ```text
/// r[i, s]    = exp(log_probs[i, s] - anchor[i, s])           (anchor detached)
/// term[i, s] = max(-A[i] r[i, s], -A[i] clip(r[i, s], 1 - low, 1 + high))
/// loss       = mean_{i, s} term[i, s]
/// ```
///
/// Evaluating each trained step separately (a column per step, not a sum over steps) means one
/// step drifting out of the clip band does not zero the gradient of the others.
///
/// * `log_probs`: `[samples, steps]`, differentiable (the replay under the current policy).
/// * `anchor`: `[samples, steps]`, the frozen pi_old log-probs; detached here.
/// * `advantages`: `[samples]`, the same advantage at every step.
///
/// With `log_probs` bitwise equal to `anchor` the ratio is exactly 1 and the loss is
/// `-mean(A)`: zero for group-centred advantages.
///
/// # Errors
/// [`FlowGrpoError::ShapeMismatch`], [`FlowGrpoError::Empty`].
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// use flow_grpo::{grpo_clip_loss, ClipRange};
/// let dev = Default::default();
/// let lp = Tensor::<Flex, 2>::from_floats([[-1.0, -2.0], [-1.5, -0.5]], &dev);
/// let adv = Tensor::<Flex, 1>::from_floats([1.0, -1.0], &dev);
/// let out = grpo_clip_loss(lp.clone(), lp, adv, ClipRange::symmetric(1e-4).unwrap()).unwrap();
/// assert_eq!(out.diagnostics.ratio_min, 1.0);
/// assert_eq!(out.diagnostics.ratio_max, 1.0);
/// assert_eq!(out.loss.into_scalar(), 0.0);
/// ```
pub fn grpo_clip_loss<B: Backend>(
    log_probs: Tensor<B, 2>,
    anchor: Tensor<B, 2>,
    advantages: Tensor<B, 1>,
    clip: ClipRange,
) -> Result<ClipLoss<B>, FlowGrpoError> {
    let [n, s] = log_probs.dims();
    if anchor.dims() != [n, s] {
        return Err(FlowGrpoError::ShapeMismatch {
            what: "anchor log-probs",
            got: anchor.dims().to_vec(),
            expected: vec![n, s],
        });
    }
    if advantages.dims() != [n] {
        return Err(FlowGrpoError::ShapeMismatch {
            what: "advantages",
            got: advantages.dims().to_vec(),
            expected: vec![n],
        });
    }
    if n == 0 || s == 0 {
        return Err(FlowGrpoError::Empty {
            what: "log-prob matrix",
        });
    }
    let delta = log_probs.sub(anchor.detach());
    let ratio = delta.clone().exp();
    let adv = advantages.detach().reshape([n, 1]);
    let neg_adv = adv.clone().neg();
    let unclipped = neg_adv.clone().mul(ratio.clone());
    let clipped = neg_adv.mul(ratio.clone().clamp(clip.lower_bound(), clip.upper_bound()));
    let per_element = unclipped.max_pair(clipped);
    let loss = per_element.clone().mean();

    let diagnostics = ratio_diagnostics(
        &host(ratio.clone().detach()),
        &host(delta.detach()),
        &host(adv.detach()),
        s,
        clip,
    );
    Ok(ClipLoss {
        loss,
        per_element,
        ratio: ratio.detach(),
        diagnostics,
    })
}

/// The ratio diagnostics of `[samples, steps]` ratios `r` (row-major) with log-ratios `d` and
/// per-sample advantages `a`, for PPO's clip (a clipped element loses its gradient only on
/// the side its advantage pushes toward).
pub(crate) fn ratio_diagnostics(
    r: &[f64],
    d: &[f64],
    a: &[f64],
    s: usize,
    clip: ClipRange,
) -> ClipDiagnostics {
    let elements = r.len();
    let m = r.iter().sum::<f64>() / elements as f64;
    let var = r.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / elements as f64;
    let (lo, hi) = (clip.lower_bound(), clip.upper_bound());
    let mut outside = 0usize;
    let mut no_grad = 0usize;
    for (i, &x) in r.iter().enumerate() {
        let ai = a[i / s];
        if x < lo || x > hi {
            outside += 1;
        }
        if (ai > 0.0 && x > hi) || (ai < 0.0 && x < lo) {
            no_grad += 1;
        }
    }
    ClipDiagnostics {
        ratio_mean: m,
        ratio_std: var.sqrt(),
        ratio_min: nan_min(r.iter().copied()),
        ratio_max: nan_max(r.iter().copied()),
        clip_fraction: outside as f64 / elements as f64,
        clipped_gradient_fraction: no_grad as f64 / elements as f64,
        approx_kl: 0.5 * d.iter().map(|x| x * x).sum::<f64>() / elements as f64,
        elements,
    }
}

pub(crate) fn host<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f64> {
    t.into_data()
        .convert::<f64>()
        .into_vec::<f64>()
        .expect("converted to f64")
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::tensor::Tensor;

    use super::{ClipRange, grpo_clip_loss};

    /// A NaN log-prob (or anchor) makes the ratio NaN there; the ratio min and max report it
    /// instead of the extremes of the finite ratios.
    #[test]
    fn a_nan_log_prob_gives_nan_ratio_min_and_max() {
        let dev = Default::default();
        let finite = [[-1.0, -2.0], [-1.5, -0.5]];
        let adv = || Tensor::<Flex, 1>::from_floats([1.0, -1.0], &dev);
        let clip = ClipRange::symmetric(1e-4).unwrap();
        for at in 0..4 {
            let mut nan = finite;
            nan[at / 2][at % 2] = f32::NAN;
            let (f, n) = (
                Tensor::<Flex, 2>::from_floats(finite, &dev),
                Tensor::<Flex, 2>::from_floats(nan, &dev),
            );
            for (lp, anchor) in [(n.clone(), f.clone()), (f, n)] {
                let d = grpo_clip_loss(lp, anchor, adv(), clip).unwrap().diagnostics;
                assert!(d.ratio_min.is_nan(), "NaN at {at}: {d:?}");
                assert!(d.ratio_max.is_nan(), "NaN at {at}: {d:?}");
                assert!(d.ratio_mean.is_nan(), "NaN at {at}: {d:?}");
            }
        }
    }
}
