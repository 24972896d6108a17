//! Online Diffusion / Flow-DPO: each group's best and worst samples form a pair, both noised
//! with one noise level and one noise (the release's `chunk(2)[0].repeat(2)`, which the
//! paper's Eq. 14 does not state), and the policy is asked to improve its flow-matching error
//! on the winner more than the frozen reference does:
//!
//! ```text
//! inside = -β/2 * ((err_w - err_l) - (ref_err_w - ref_err_l))
//! loss   = -mean log σ(inside)
//! ```
//!
//! with the errors per sample ([`crate::mean_squared_error`] of the velocity against
//! `noise - x0`). The release drops the paper's `ω(λ_t)` weighting and uses `β = 5000`.

use burn::tensor::Tensor;
use burn::tensor::activation::log_sigmoid;
use burn::tensor::backend::Backend;

use crate::FlowGrpoError;
use crate::loss::host;
use crate::matching::check_shape;

/// The DPO loss of a batch of pairs and its diagnostics.
#[derive(Debug, Clone)]
pub struct DpoLoss<B: Backend> {
    /// The loss to minimise, `[1]`.
    pub loss: Tensor<B, 1>,
    /// Host diagnostics.
    pub diagnostics: DpoDiagnostics,
}

/// Health of the DPO loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DpoDiagnostics {
    /// The implicit reward model's accuracy: the fraction of pairs with `inside > 0`.
    pub implicit_accuracy: f64,
    /// Mean of the model's margin `err_w - err_l` (negative: the winner is fitted better).
    pub model_margin: f64,
    /// Mean of the reference's margin.
    pub reference_margin: f64,
    /// Pairs.
    pub pairs: usize,
}

/// The Diffusion-DPO loss over `pairs` winner / loser errors, all `[pairs]`: the policy's
/// (`err_w`, `err_l`, differentiable) and the frozen reference's (`ref_err_w`, `ref_err_l`,
/// detached here).
///
/// # Errors
/// [`FlowGrpoError::ShapeMismatch`], [`FlowGrpoError::Empty`],
/// [`FlowGrpoError::InvalidParameter`] for `beta` not finite and `> 0`.
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// let dev = Default::default();
/// let t = |v: [f32; 1]| Tensor::<Flex, 1>::from_floats(v, &dev);
/// // the policy fits the winner 0.01 better than the reference does: inside = 0.5 * 100 * 0.01
/// let out = flow_grpo::diffusion_dpo_loss(t([0.09]), t([0.1]), t([0.1]), t([0.1]), 100.0).unwrap();
/// let want = (1.0 + (-0.5f64).exp()).ln();
/// assert!((f64::from(out.loss.into_scalar()) - want).abs() < 1e-5);
/// assert_eq!(out.diagnostics.implicit_accuracy, 1.0);
/// ```
pub fn diffusion_dpo_loss<B: Backend>(
    err_w: Tensor<B, 1>,
    err_l: Tensor<B, 1>,
    ref_err_w: Tensor<B, 1>,
    ref_err_l: Tensor<B, 1>,
    beta: f64,
) -> Result<DpoLoss<B>, FlowGrpoError> {
    let [n] = err_w.dims();
    if n == 0 {
        return Err(FlowGrpoError::Empty { what: "DPO pairs" });
    }
    check_shape("loser errors", err_l.dims(), [n])?;
    check_shape("reference winner errors", ref_err_w.dims(), [n])?;
    check_shape("reference loser errors", ref_err_l.dims(), [n])?;
    if !(beta.is_finite() && beta > 0.0) {
        return Err(FlowGrpoError::InvalidParameter {
            what: "DPO beta",
            given: beta,
            allowed: "a finite value > 0 (the release uses 5000)",
        });
    }
    let model = err_w - err_l;
    let reference = (ref_err_w - ref_err_l).detach();
    let inside = (model.clone() - reference.clone()).mul_scalar(-0.5 * beta);
    let loss = log_sigmoid(inside.clone()).mean().neg();
    let inside = host(inside.detach());
    let mean = |v: &[f64]| v.iter().sum::<f64>() / n as f64;
    let diagnostics = DpoDiagnostics {
        implicit_accuracy: inside.iter().filter(|x| **x > 0.0).count() as f64 / n as f64,
        model_margin: mean(&host(model.detach())),
        reference_margin: mean(&host(reference)),
        pairs: n,
    };
    Ok(DpoLoss { loss, diagnostics })
}
