//! The generic compositions: what the fused operations compute, as burn tensor ops on any
//! backend. The public functions of this crate fall back to these; the parity tests hold the
//! Flex kernels to them.

use burn::tensor::Tensor;
use burn::tensor::activation;
use burn::tensor::backend::Backend;

/// GELU-tanh as `x * sigmoid(x (c0 + c1 x^2))`, `c0 = 2 sqrt(2/pi)`, `c1 = 0.044715 c0`: the
/// identity `0.5 (1 + tanh(u)) = sigmoid(2u)` with the cube as products, which avoids burn's
/// generic `powf` and `tanh`.
pub fn gelu_tanh<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    const C0: f64 = 2.0 * core::f64::consts::FRAC_2_SQRT_PI * core::f64::consts::FRAC_1_SQRT_2;
    const C1: f64 = C0 * 0.044715;
    let inner = (x.clone() * x.clone()).mul_scalar(C1).add_scalar(C0) * x.clone();
    x * activation::sigmoid(inner)
}

/// RoPE of `x: [batch, seq, heads, head_dim]` by `cos`, `sin: [seq, head_dim]` (broadcast over
/// batch and heads): `x * cos + swap_pairs(x) * sin`.
pub fn rope<B: Backend>(x: Tensor<B, 4>, cos: Tensor<B, 2>, sin: Tensor<B, 2>) -> Tensor<B, 4> {
    let [b, s, h, d] = x.dims();
    let (cos, sin) = (cos.reshape([1, s, 1, d]), sin.reshape([1, s, 1, d]));
    let swapped = x
        .clone()
        .reshape([b, s, h, d / 2, 2])
        .flip([4])
        .reshape([b, s, h, d]);
    x * cos + swapped * sin
}
