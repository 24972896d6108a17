//! Comparison helpers of the parity tests: each fails on a NaN and on a shape mismatch.
#![allow(dead_code)]

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

/// The largest `|a - b| / max(1, |b|)`; fails on a NaN in either, or a shape mismatch.
pub fn worst_rel<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> f64 {
    assert_eq!(a.dims(), b.dims());
    let a = a.into_data().into_vec::<f32>().unwrap();
    let b = b.into_data().into_vec::<f32>().unwrap();
    a.iter().zip(&b).fold(0.0, |worst, (&a, &b)| {
        assert!(
            !a.is_nan() && !b.is_nan(),
            "NaN in a comparison: {a} against {b}"
        );
        let e = (a as f64 - b as f64).abs() / (b as f64).abs().max(1.0);
        if e > worst { e } else { worst }
    })
}

/// The largest `|a - b|` over `max(1, largest |b|)`: the error against the tensor's scale;
/// fails on a NaN in either, or a shape mismatch.
pub fn worst_scaled<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> f64 {
    assert_eq!(a.dims(), b.dims());
    let a = a.into_data().into_vec::<f32>().unwrap();
    let b = b.into_data().into_vec::<f32>().unwrap();
    let mut scale = 1.0f64;
    let mut worst = 0.0f64;
    for (&a, &b) in a.iter().zip(&b) {
        assert!(
            !a.is_nan() && !b.is_nan(),
            "NaN in a comparison: {a} against {b}"
        );
        let (a, b) = (a as f64, b as f64);
        if b.abs() > scale {
            scale = b.abs();
        }
        let e = (a - b).abs();
        if e > worst {
            worst = e;
        }
    }
    worst / scale
}

pub fn random<B: Backend, const D: usize>(shape: [usize; D], scale: f64) -> Tensor<B, D> {
    // each test runs on its own thread: its draws are the n-th of that thread, whatever the
    // other tests do, so every run of a test sees the same values
    thread_local!(static DRAWS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) });
    let draw = DRAWS.with(|d| {
        let n = d.get();
        d.set(n + 1);
        n
    });
    random_keyed(draw, shape, scale)
}

/// The `key`-th tensor of [`random`]'s sequence, whatever the thread has drawn before.
pub fn random_keyed<B: Backend, const D: usize>(
    key: u64,
    shape: [usize; D],
    scale: f64,
) -> Tensor<B, D> {
    let len: usize = shape.iter().product();
    let mut rng = keyed_rng::SplitMix64::new(0xF05E_D000 ^ key.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut values = Vec::with_capacity(len + 1);
    while values.len() < len {
        // Box-Muller: two normals per pair of uniforms
        let (u1, u2) = (rng.open_unit_f64(), rng.unit_f64());
        let r = (-2.0 * u1.ln()).sqrt() * scale;
        let t = std::f64::consts::TAU * u2;
        values.push((r * t.cos()) as f32);
        values.push((r * t.sin()) as f32);
    }
    values.truncate(len);
    Tensor::from_data(TensorData::new(values, shape), &Default::default())
}
