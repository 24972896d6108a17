//! KL divergence to a reference policy.
//!
//! The reference is whatever produced the reference model output for the same stored step — a
//! frozen copy, or the same LoRA model with its adapter disabled. Both transitions come from
//! `sde_math::Kernel::replay` on the same `(sigmas, sample, prev_sample)`, so they share the
//! std (it depends on the sigmas and the kernel, not on the model) and differ only in the mean.

use burn::tensor::{Tensor, backend::Backend};
use sde_math::Transition;
use sde_math::gaussian::{
    kl_diag_elements, kl_flow_grpo_reference, kl_same_std_elements, mean_over_non_batch,
    sum_over_non_batch,
};

use crate::FlowGrpoError;

/// Which KL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KlForm {
    /// flow_grpo's released term, `mean((mu - mu_ref)^2) / (2 std_dev_t^2)` per sample: the
    /// closed form over the means, divided by the diffusion coefficient `g^2` instead of the
    /// transition variance `g^2 |dt|` — the exact KL scaled by `|dt|` ("KL without dt").
    /// Reproduces the reference's `kl_coef` scale; needs equal stds.
    FlowGrpoReference,
    /// The exact Gaussian KL of the transitions (with `dt`), averaged over the non-batch
    /// elements (the references' reduction of log-probs).
    ExactMean,
    /// The exact Gaussian KL of the whole sample's transition (sum over elements).
    ExactSum,
}

impl KlForm {
    fn name(self) -> &'static str {
        match self {
            KlForm::FlowGrpoReference => "FlowGrpoReference",
            KlForm::ExactMean => "ExactMean",
            KlForm::ExactSum => "ExactSum",
        }
    }
}

/// A per-sample KL of one step.
#[derive(Debug, Clone)]
pub struct KlTerm<B: Backend> {
    /// `KL(policy || reference)` per sample, `[batch]`; differentiable through the policy mean
    /// (the reference is detached).
    pub per_sample: Tensor<B, 1>,
    /// Which KL it is.
    pub form: KlForm,
}

/// `KL(policy || reference)` of one replayed step, per sample.
///
/// # Errors
/// [`FlowGrpoError::ShapeMismatch`] when the means differ in shape,
/// [`FlowGrpoError::StdMismatch`] for [`KlForm::FlowGrpoReference`] when the stds differ.
///
/// ```
/// use burn::backend::NdArray;
/// use burn::tensor::Tensor;
/// use flow_grpo::{kl_to_reference, KlForm};
/// use sde_math::{Kernel, StepSigmas, StorageDtype};
/// let dev = Default::default();
/// let k = Kernel::flow_sde(0.7).unwrap();
/// let at = StepSigmas::new(0.6, 0.5).unwrap().into();
/// let x = Tensor::<NdArray<f64>, 2>::from_floats([[0.1, -0.3]], &dev);
/// let next = Tensor::<NdArray<f64>, 2>::from_floats([[0.2, -0.1]], &dev);
/// let v = Tensor::<NdArray<f64>, 2>::from_floats([[0.5, 0.4]], &dev);
/// let v_ref = Tensor::<NdArray<f64>, 2>::from_floats([[0.4, 0.4]], &dev);
/// let pol = k.replay(&at, v, x.clone(), next.clone(), StorageDtype::Native).unwrap();
/// let refr = k.replay(&at, v_ref, x, next, StorageDtype::Native).unwrap();
/// let exact = kl_to_reference(&pol, &refr, KlForm::ExactMean).unwrap().per_sample.into_scalar();
/// let flow = kl_to_reference(&pol, &refr, KlForm::FlowGrpoReference).unwrap().per_sample.into_scalar();
/// // the reference form is the exact one scaled by |dt| = 0.1
/// assert!((flow - exact * 0.1).abs() < 1e-6 * exact);
/// ```
pub fn kl_to_reference<B: Backend, const D: usize>(
    policy: &Transition<B, D>,
    reference: &Transition<B, D>,
    form: KlForm,
) -> Result<KlTerm<B>, FlowGrpoError> {
    let (pd, rd) = (policy.mean.dims(), reference.mean.dims());
    if pd != rd {
        return Err(FlowGrpoError::ShapeMismatch {
            what: "reference mean",
            got: rd.to_vec(),
            expected: pd.to_vec(),
        });
    }
    let same_std = policy
        .std
        .iter()
        .zip(&reference.std)
        .position(|(a, b)| a.to_bits() != b.to_bits());
    let mu = policy.mean.clone();
    let mu_ref = reference.mean.clone().detach();
    let per_sample = match form {
        KlForm::FlowGrpoReference => {
            if let Some(i) = same_std {
                return Err(FlowGrpoError::StdMismatch {
                    form: form.name(),
                    sample: i,
                    policy: policy.std[i],
                    reference: reference.std[i],
                });
            }
            kl_flow_grpo_reference(mu, mu_ref, &policy.std_dev_t)
        }
        KlForm::ExactMean | KlForm::ExactSum => {
            let elements = match same_std {
                None => kl_same_std_elements(mu, mu_ref, &policy.std),
                Some(_) => kl_diag_elements(mu, &policy.std, mu_ref, &reference.std),
            };
            if form == KlForm::ExactMean {
                mean_over_non_batch(elements)
            } else {
                sum_over_non_batch(elements)
            }
        }
    };
    Ok(KlTerm { per_sample, form })
}
