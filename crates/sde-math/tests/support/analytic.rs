//! Test helpers: a seeded host normal generator and the analytic Gaussian-data flow model.

#![allow(dead_code)]

use burn::tensor::{Tensor, TensorData, backend::Backend};

/// SplitMix64 with Box–Muller: deterministic standard normals for tests, generated on the host
/// so every backend sees identical bits.
pub struct Normals(u64);

impl Normals {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let (u1, u2) = (self.uniform(), self.uniform());
                ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
            })
            .collect()
    }

    pub fn tensor<B: Backend, const D: usize>(&mut self, shape: [usize; D], dev: &B::Device) -> Tensor<B, D> {
        let n = shape.iter().product();
        Tensor::from_data(TensorData::new(self.vec(n), shape), dev)
    }
}

/// Data `x0 ~ N(mu, s^2)` element-wise. Its flow velocity `E[eps - x0 | x_sigma]` is closed form,
/// and the probability-flow ODE maps `x(1) = eps` to `x(0) = mu + s * eps` exactly.
pub struct GaussianData<B: Backend, const D: usize> {
    pub mu: Tensor<B, D>,
    pub s: Tensor<B, D>,
}

impl<B: Backend, const D: usize> GaussianData<B, D> {
    pub fn velocity(&self, x: Tensor<B, D>, sigma: f32) -> Tensor<B, D> {
        let sg = f64::from(sigma);
        let var = self.s.clone().powi_scalar(2).mul_scalar((1.0 - sg) * (1.0 - sg)).add_scalar(sg * sg);
        let r = x.sub(self.mu.clone().mul_scalar(1.0 - sg));
        let e_x0 = self.mu.clone().add(self.s.clone().powi_scalar(2).mul(r.clone()).div(var.clone()).mul_scalar(1.0 - sg));
        let e_eps = r.div(var).mul_scalar(sg);
        e_eps.sub(e_x0)
    }

    /// The exact ODE solution at `sigma` starting from noise `eps`.
    pub fn at(&self, eps: Tensor<B, D>, sigma: f32) -> Tensor<B, D> {
        let sg = f64::from(sigma);
        let scale = self.s.clone().powi_scalar(2).mul_scalar((1.0 - sg) * (1.0 - sg)).add_scalar(sg * sg).sqrt();
        self.mu.clone().mul_scalar(1.0 - sg).add(scale.mul(eps))
    }
}
