//! Test helper: a seeded host normal generator.

#![allow(dead_code)]

use burn::tensor::{Tensor, TensorData, backend::Backend};
use keyed_rng::SplitMix64;

/// SplitMix64 ([`keyed_rng::SplitMix64`]) with Box–Muller: deterministic standard normals for
/// tests, generated on the host so every backend sees identical bits.
pub struct Normals(SplitMix64);

impl Normals {
    pub fn new(seed: u64) -> Self {
        Self(SplitMix64::new(seed))
    }

    /// A uniform in `(0, 1]` (never 0, so `ln` is finite).
    fn uniform(&mut self) -> f64 {
        self.0.open_unit_f64()
    }

    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let (u1, u2) = (self.uniform(), self.uniform());
                ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
            })
            .collect()
    }

    pub fn tensor<B: Backend, const D: usize>(
        &mut self,
        shape: [usize; D],
        dev: &B::Device,
    ) -> Tensor<B, D> {
        let n = shape.iter().product();
        Tensor::from_data(TensorData::new(self.vec(n), shape), dev)
    }
}
