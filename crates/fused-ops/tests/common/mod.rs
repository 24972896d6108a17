//! Comparison helpers of the parity tests: each fails on a NaN and on a shape mismatch.
#![allow(dead_code)]

use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};

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
    Tensor::random(shape, Distribution::Normal(0.0, scale), &Default::default())
}
