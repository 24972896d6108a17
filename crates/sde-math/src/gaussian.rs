//! Diagonal-Gaussian log-densities and closed-form KL divergences.
//!
//! All functions take `[batch, ...]` tensors and per-sample standard deviations (`std.len()`
//! equal to the batch size, values computed on the host in `f64`). Per-element results keep the
//! input shape; [`mean_over_non_batch`] reproduces the references' reduction (a mean over every
//! non-batch dimension, which makes the value's scale independent of resolution), and
//! [`sum_over_non_batch`] gives the exact joint log-density or KL of the whole sample.

use burn::tensor::{Tensor, backend::Backend};

use crate::sigmas::Coef;

/// `ln(sqrt(2 pi))`.
pub const LN_SQRT_2PI: f64 = 0.918_938_533_204_672_8;

/// Per-element Gaussian log-density `log N(x; mu, std^2)`:
/// `-(x - mu)^2 / (2 std^2) - ln(std) - ln(sqrt(2 pi))`.
///
/// `std` has one entry per sample (`std.len() == batch`). Differentiable in both tensors.
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// use sde_math::gaussian::{log_density_elements, LN_SQRT_2PI};
/// let dev = Default::default();
/// let x = Tensor::<Flex, 2>::from_floats([[1.0, 0.0]], &dev);
/// let mu = Tensor::<Flex, 2>::from_floats([[0.0, 0.0]], &dev);
/// let lp = log_density_elements(x, mu, &[1.0]).into_data().to_vec::<f32>().unwrap();
/// assert!((lp[0] as f64 - (-0.5 - LN_SQRT_2PI)).abs() < 1e-6);
/// assert!((lp[1] as f64 - (-LN_SQRT_2PI)).abs() < 1e-6);
/// ```
pub fn log_density_elements<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    mean: Tensor<B, D>,
    std: &[f64],
) -> Tensor<B, D> {
    let inv_two_var: Vec<f64> = std.iter().map(|s| 1.0 / (2.0 * s * s)).collect();
    let log_norm: Vec<f64> = std.iter().map(|s| s.ln() + LN_SQRT_2PI).collect();
    let residual = x.sub(mean);
    let quad = Coef::new(&inv_two_var, &residual).mul(residual.clone().mul(residual.clone()));
    Coef::new(&log_norm, &quad).sub_from(quad.neg())
}

/// The mean log-density over a sample's elements from the mean squared residual:
/// `mean_e log N(x_e; mu_e, std^2) = -mean_sq / (2 std^2) - ln(std) - ln(sqrt(2 pi))`, `[batch]`.
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// use sde_math::gaussian::{log_density_from_mean_square, LN_SQRT_2PI};
/// let dev = Default::default();
/// let lp = log_density_from_mean_square(Tensor::<Flex, 1>::from_floats([0.0, 1.0], &dev), &[1.0, 1.0]);
/// let lp = lp.into_data().to_vec::<f32>().unwrap();
/// assert!((lp[0] as f64 + LN_SQRT_2PI).abs() < 1e-6);
/// assert!((lp[1] as f64 + 0.5 + LN_SQRT_2PI).abs() < 1e-6);
/// ```
pub fn log_density_from_mean_square<B: Backend>(
    mean_sq: Tensor<B, 1>,
    std: &[f64],
) -> Tensor<B, 1> {
    let inv_two_var: Vec<f64> = std.iter().map(|s| 1.0 / (2.0 * s * s)).collect();
    let log_norm: Vec<f64> = std.iter().map(|s| s.ln() + LN_SQRT_2PI).collect();
    let quad = Coef::new(&inv_two_var, &mean_sq).mul(mean_sq);
    Coef::new(&log_norm, &quad).sub_from(quad.neg())
}

/// Per-element KL of two diagonal Gaussians with per-sample stds:
/// `KL(N(mu1, s1^2) || N(mu2, s2^2)) = 1/2 [ln(s2^2/s1^2) + (s1^2 + (mu1 - mu2)^2) / s2^2 - 1]`
/// (seed 003, "Closed-form KL").
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// use sde_math::gaussian::kl_diag_elements;
/// let dev = Default::default();
/// let m = Tensor::<Flex, 2>::from_floats([[0.3, -0.2]], &dev);
/// // identical Gaussians: zero KL
/// let kl = kl_diag_elements(m.clone(), &[0.5], m, &[0.5]).into_data().to_vec::<f32>().unwrap();
/// assert!(kl.iter().all(|v| v.abs() < 1e-7));
/// ```
pub fn kl_diag_elements<B: Backend, const D: usize>(
    mean1: Tensor<B, D>,
    std1: &[f64],
    mean2: Tensor<B, D>,
    std2: &[f64],
) -> Tensor<B, D> {
    let inv_two_var2: Vec<f64> = std2.iter().map(|s| 1.0 / (2.0 * s * s)).collect();
    let constant: Vec<f64> = std1
        .iter()
        .zip(std2)
        .map(|(s1, s2)| (s2 / s1).ln() + (s1 * s1) / (2.0 * s2 * s2) - 0.5)
        .collect();
    let diff = mean1.sub(mean2);
    let quad = Coef::new(&inv_two_var2, &diff).mul(diff.clone().mul(diff.clone()));
    let c = Coef::new(&constant, &quad);
    // quad + constant == quad - (-constant)
    match c {
        Coef::Shared(v) => quad.add_scalar(v),
        Coef::PerSample(t) => quad.add(t),
    }
}

/// Per-element KL of two Gaussians of the same std: `(mu1 - mu2)^2 / (2 std^2)`.
///
/// With the transition std (`std_dev_t * sqrt(-dt)` for Flow-SDE) this is the exact KL of the
/// two policies' transitions; seed 004 writes it in velocity space as
/// `dt/2 * (g (1 - sigma) / (2 sigma) + 1/g)^2 * ||v1 - v2||^2`.
pub fn kl_same_std_elements<B: Backend, const D: usize>(
    mean1: Tensor<B, D>,
    mean2: Tensor<B, D>,
    std: &[f64],
) -> Tensor<B, D> {
    let inv_two_var: Vec<f64> = std.iter().map(|s| 1.0 / (2.0 * s * s)).collect();
    let diff = mean1.sub(mean2);
    Coef::new(&inv_two_var, &diff).mul(diff.clone().mul(diff.clone()))
}

/// flow_grpo's released KL term, `mean((mu1 - mu2)^2) / (2 std_dev_t^2)` per sample.
///
/// **Not the KL of the transitions**: it divides by the diffusion coefficient `std_dev_t^2`
/// (`g^2`), not by the transition variance `g^2 * (-dt)`, i.e. it is the exact same-std KL
/// scaled by `-dt` ("KL without dt"). Provided under this name to reproduce the reference's
/// `kl_coef` scale; use [`kl_same_std_elements`] for the real divergence.
pub fn kl_flow_grpo_reference<B: Backend, const D: usize>(
    mean1: Tensor<B, D>,
    mean2: Tensor<B, D>,
    std_dev_t: &[f64],
) -> Tensor<B, 1> {
    let diff = mean1.sub(mean2);
    let msq = mean_over_non_batch(diff.clone().mul(diff.clone()));
    let inv_two_g2: Vec<f64> = std_dev_t.iter().map(|g| 1.0 / (2.0 * g * g)).collect();
    Coef::new(&inv_two_g2, &msq).mul(msq)
}

/// Mean over every non-batch dimension: `[batch, ...] -> [batch]` (the references' reduction).
pub fn mean_over_non_batch<B: Backend, const D: usize>(t: Tensor<B, D>) -> Tensor<B, 1> {
    let (flat, batch) = flatten_batch(t);
    flat.mean_dim(1).reshape([batch])
}

/// Sum over every non-batch dimension: `[batch, ...] -> [batch]`.
pub fn sum_over_non_batch<B: Backend, const D: usize>(t: Tensor<B, D>) -> Tensor<B, 1> {
    let (flat, batch) = flatten_batch(t);
    flat.sum_dim(1).reshape([batch])
}

fn flatten_batch<B: Backend, const D: usize>(t: Tensor<B, D>) -> (Tensor<B, 2>, usize) {
    let dims = t.dims();
    let batch = dims[0];
    let rest: usize = dims[1..].iter().product();
    (t.reshape([batch, rest]), batch)
}
