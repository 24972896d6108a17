//! Test helper: a seeded host normal generator.

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

    pub fn tensor<B: Backend, const D: usize>(
        &mut self,
        shape: [usize; D],
        dev: &B::Device,
    ) -> Tensor<B, D> {
        let n = shape.iter().product();
        Tensor::from_data(TensorData::new(self.vec(n), shape), dev)
    }
}
