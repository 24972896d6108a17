//! A flow whose exact velocity is known: Gaussian data.
//!
//! With data `x0 ~ N(mu, s^2)` element-wise and `x_sigma = (1 - sigma) x0 + sigma eps`, the
//! marginal is `x_sigma ~ N((1 - sigma) mu, (1 - sigma)^2 s^2 + sigma^2)` and the flow-matching
//! velocity `v = E[eps - x0 | x_sigma]` is closed form:
//!
//! ```text
//! var  = (1 - sigma)^2 s^2 + sigma^2,   r = x - (1 - sigma) mu
//! E[x0  | x] = mu + (1 - sigma) s^2 r / var
//! E[eps | x] = sigma r / var
//! ```
//!
//! The probability-flow ODE maps noise `eps` at `sigma = 1` along
//! `x(sigma) = (1 - sigma) mu + sqrt(var(sigma)) eps` to `x(0) = mu + s eps` exactly, so a
//! sampler's endpoint error can be measured. Used by the tests, the parity fixtures (the same
//! model drives diffusers' schedulers) and the `sde_replay` example.

use burn::tensor::{Tensor, backend::Backend};

/// Element-wise Gaussian data `N(mu, s^2)`; `mu` and `s` have the sample's shape, `s > 0`.
#[derive(Debug, Clone)]
pub struct GaussianFlow<B: Backend, const D: usize> {
    /// Data mean, `[batch, ...]`.
    pub mu: Tensor<B, D>,
    /// Data standard deviation, `[batch, ...]`, positive.
    pub s: Tensor<B, D>,
}

impl<B: Backend, const D: usize> GaussianFlow<B, D> {
    fn var(&self, sigma: f64) -> Tensor<B, D> {
        self.s
            .clone()
            .powi_scalar(2)
            .mul_scalar((1.0 - sigma) * (1.0 - sigma))
            .add_scalar(sigma * sigma)
    }

    /// The exact velocity `E[eps - x0 | x_sigma = x]`.
    ///
    /// ```
    /// use burn::backend::NdArray;
    /// use burn::tensor::Tensor;
    /// use sde_math::analytic::GaussianFlow;
    /// let dev = Default::default();
    /// let flow = GaussianFlow::<NdArray<f64>, 1> {
    ///     mu: Tensor::from_floats([0.5], &dev),
    ///     s: Tensor::from_floats([2.0], &dev),
    /// };
    /// // at sigma = 1 the sample is pure noise: E[eps | x] = x, E[x0 | x] = mu
    /// let v = flow.velocity(Tensor::from_floats([1.5], &dev), 1.0);
    /// assert!((v.into_scalar() - 1.0).abs() < 1e-12);
    /// ```
    pub fn velocity(&self, x: Tensor<B, D>, sigma: f32) -> Tensor<B, D> {
        let sg = f64::from(sigma);
        let var = self.var(sg);
        let r = x.sub(self.mu.clone().mul_scalar(1.0 - sg));
        let e_x0 = self.mu.clone().add(
            self.s
                .clone()
                .powi_scalar(2)
                .mul(r.clone())
                .div(var.clone())
                .mul_scalar(1.0 - sg),
        );
        let e_eps = r.div(var).mul_scalar(sg);
        e_eps.sub(e_x0)
    }

    /// The exact ODE solution at `sigma` that starts from noise `eps` at `sigma = 1`
    /// (at `sigma = 0`: the endpoint `mu + s eps`).
    pub fn solution(&self, eps: Tensor<B, D>, sigma: f32) -> Tensor<B, D> {
        let sg = f64::from(sigma);
        self.mu
            .clone()
            .mul_scalar(1.0 - sg)
            .add(self.var(sg).sqrt().mul(eps))
    }
}
