//! The forward process and flow-matching errors shared by the objectives that train on clean
//! endpoints (AWM, DiffusionNFT, Diffusion-DPO) and on stored velocities (paired finite
//! differences). Every tensor is `[samples, elements]`: the caller flattens a sample's latent
//! into one row, and every mean is over that row (the released code means over pixels, never
//! sums).
//!
//! Convention: `sigma = 1` is pure noise, `x_sigma = (1 - sigma) x0 + sigma noise`, and the
//! velocity the model predicts is `noise - x0` (what the sampler integrates from 1 to 0).

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::FlowGrpoError;

/// Checks that `t` has `shape`.
pub(crate) fn check_shape<const D: usize>(
    what: &'static str,
    got: [usize; D],
    expected: [usize; D],
) -> Result<(), FlowGrpoError> {
    if got == expected {
        Ok(())
    } else {
        Err(FlowGrpoError::ShapeMismatch {
            what,
            got: got.to_vec(),
            expected: expected.to_vec(),
        })
    }
}

/// Checks a `[samples, elements]` matrix with at least one of each.
pub(crate) fn check_rows(what: &'static str, dims: [usize; 2]) -> Result<(), FlowGrpoError> {
    if dims[0] == 0 || dims[1] == 0 {
        Err(FlowGrpoError::Empty { what })
    } else {
        Ok(())
    }
}

/// The forward process at noise level `sigma` (`[samples]`, each in `[0, 1]`):
/// `(1 - sigma) x0 + sigma noise`.
///
/// # Errors
/// [`FlowGrpoError::ShapeMismatch`], [`FlowGrpoError::Empty`].
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// let dev = Default::default();
/// let x0 = Tensor::<Flex, 2>::from_floats([[1.0, 2.0]], &dev);
/// let noise = Tensor::<Flex, 2>::from_floats([[3.0, -2.0]], &dev);
/// let xt = flow_grpo::noised(x0, noise, Tensor::from_floats([0.25], &dev)).unwrap();
/// assert_eq!(xt.into_data().to_vec::<f32>().unwrap(), vec![1.5, 1.0]);
/// ```
pub fn noised<B: Backend>(
    x0: Tensor<B, 2>,
    noise: Tensor<B, 2>,
    sigma: Tensor<B, 1>,
) -> Result<Tensor<B, 2>, FlowGrpoError> {
    let [n, e] = x0.dims();
    check_rows("clean samples", [n, e])?;
    check_shape("noise", noise.dims(), [n, e])?;
    check_shape("noise levels", sigma.dims(), [n])?;
    let s = sigma.reshape([n, 1]);
    Ok(x0.clone() + (noise - x0) * s)
}

/// The flow-matching target velocity `noise - x0`.
///
/// # Errors
/// [`FlowGrpoError::ShapeMismatch`], [`FlowGrpoError::Empty`].
pub fn velocity_target<B: Backend>(
    x0: Tensor<B, 2>,
    noise: Tensor<B, 2>,
) -> Result<Tensor<B, 2>, FlowGrpoError> {
    let [n, e] = x0.dims();
    check_rows("clean samples", [n, e])?;
    check_shape("noise", noise.dims(), [n, e])?;
    Ok(noise - x0)
}

/// Per-sample mean squared difference `mean_e (a - b)^2`, `[samples]`.
///
/// # Errors
/// [`FlowGrpoError::ShapeMismatch`], [`FlowGrpoError::Empty`].
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// let dev = Default::default();
/// let a = Tensor::<Flex, 2>::from_floats([[1.0, 3.0], [0.0, 0.0]], &dev);
/// let b = Tensor::<Flex, 2>::from_floats([[0.0, 1.0], [0.0, 2.0]], &dev);
/// let e = flow_grpo::mean_squared_error(a, b).unwrap();
/// assert_eq!(e.into_data().to_vec::<f32>().unwrap(), vec![2.5, 2.0]);
/// ```
pub fn mean_squared_error<B: Backend>(
    a: Tensor<B, 2>,
    b: Tensor<B, 2>,
) -> Result<Tensor<B, 1>, FlowGrpoError> {
    let [n, e] = a.dims();
    check_rows("prediction", [n, e])?;
    check_shape("target", b.dims(), [n, e])?;
    let d = a - b;
    Ok((d.clone() * d).mean_dim(1).reshape([n]))
}
