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

/// `layer_norm(x) * (1 + scale) + shift` over the last axis of `x: [batch, tokens, dim]`
/// (no affine parameters, biased variance), `shift` and `scale` broadcast to `x`.
pub fn layer_norm_modulated<B: Backend>(
    x: Tensor<B, 3>,
    shift: Tensor<B, 3>,
    scale: Tensor<B, 3>,
    eps: f64,
) -> Tensor<B, 3> {
    let mean = x.clone().mean_dim(2);
    let xc = x - mean;
    let var = xc.clone().square().mean_dim(2);
    xc * var.add_scalar(eps).sqrt().recip() * (scale + 1.0) + shift
}

/// `x + r * gate`, `gate` broadcast to `r`.
pub fn gated_residual<B: Backend>(
    x: Tensor<B, 3>,
    r: Tensor<B, 3>,
    gate: Tensor<B, 3>,
) -> Tensor<B, 3> {
    x + r * gate
}

/// `x / sqrt(mean(x^2) + eps) * weight` over the last axis.
pub fn rms_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    weight: Tensor<B, 1>,
    eps: f64,
) -> Tensor<B, D> {
    let var = x.clone().square().mean_dim(D - 1);
    x * var.add_scalar(eps).sqrt().recip() * weight.unsqueeze::<D>()
}

/// `x W + b + s (x A) B`: burn's `linear`, then the adapter's two products, its scale and an
/// add (what `dit-models`' layer computed before this crate took it over).
pub fn linear<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    lora: Option<crate::LoraTerm<B>>,
) -> Tensor<B, D> {
    use burn::tensor::module::linear;
    let base = linear(x.clone(), weight, bias);
    match lora {
        Some(l) => base + linear(linear(x, l.a, None), l.b, None).mul_scalar(l.scale),
        None => base,
    }
}

/// `t` times one value per sample (`t: [batch, ...]`, `values.len() == batch`): a scalar
/// multiply when every sample has the same value (none at all when that value is 1), else a
/// `[batch, 1, ...]` tensor of `t`'s dtype broadcast over the rest.
pub fn scale_per_sample<B: Backend, const D: usize>(
    t: Tensor<B, D>,
    values: &[f64],
) -> Tensor<B, D> {
    use burn::tensor::TensorData;
    let Some(&first) = values.first() else {
        return t;
    };
    if values.iter().all(|v| v.to_bits() == first.to_bits()) {
        return if first == 1.0 { t } else { t.mul_scalar(first) };
    }
    let mut shape = [1usize; D];
    shape[0] = values.len();
    let data = TensorData::new(values.to_vec(), shape).convert_dtype(t.dtype());
    let c = Tensor::from_data(data, (&t.device(), t.dtype()));
    t.mul(c)
}

/// `a_b x + c_b v` per sample `b`: [`scale_per_sample`] of each, then an add.
pub fn combine<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    a: &[f64],
    v: Tensor<B, D>,
    c: &[f64],
) -> Tensor<B, D> {
    scale_per_sample(x, a).add(scale_per_sample(v, c))
}

/// `mean((p - m)^2)` over every axis but the first: `[batch, ...] -> [batch]`.
pub fn mean_square_residual<B: Backend, const D: usize>(
    p: Tensor<B, D>,
    m: Tensor<B, D>,
) -> Tensor<B, 1> {
    let dims = p.dims();
    let batch = dims[0];
    let rest: usize = dims[1..].iter().product();
    let r = p.sub(m);
    r.clone()
        .mul(r)
        .reshape([batch, rest])
        .mean_dim(1)
        .reshape([batch])
}

/// `t` converted to `storage` and back to its own dtype on the host (`TensorData`'s
/// conversions: round to nearest, ties to even), as a fresh tensor with no autodiff history.
pub fn round_through<B: Backend, const D: usize>(
    t: Tensor<B, D>,
    storage: burn::tensor::DType,
) -> Tensor<B, D> {
    let compute = t.dtype();
    if compute == storage {
        return t;
    }
    let device = t.device();
    let data = t.into_data().convert_dtype(storage).convert_dtype(compute);
    Tensor::from_data(data, (&device, compute))
}
