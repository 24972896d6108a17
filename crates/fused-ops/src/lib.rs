//! Fused tensor operations for the transformer's hot paths and the sampler's steps.
//!
//! Each operation here has two implementations with one meaning:
//!
//! * a **generic composition** of burn tensor ops ([`reference`](mod@reference)), which runs on every burn
//!   backend (CUDA, wgpu, NdArray, …) and is differentiated by burn's autodiff op by op;
//! * a **single-pass kernel** for burn's Flex CPU backend, forward and backward, used when the
//!   tensor is a `f32` Flex tensor or an `f32` `Autodiff<Flex>` tensor.
//!
//! The public functions ([`gelu_tanh`], [`rope`], [`relayout`], [`attention`],
//! [`layer_norm_modulated`], [`gated_residual`], [`rms_norm`], [`linear`], and the step kernels
//! [`combine`], [`mean_square_residual`], [`round_through`], [`gaussian_step`]) pick the kernel
//! when the tensor's primitive is
//! one of those types and the generic composition otherwise; the choice is made from the
//! primitive's concrete type at run time (`core::any::Any`), so callers stay generic over
//! `B: Backend` and no trait bound spreads through the crates above. The parity tests
//! (`tests/parity.rs`) hold the kernels to the compositions, values and gradients.
//!
//! Why: burn-flex runs every elementwise op as its own pass over memory with its own
//! allocation, walks most broadcasts and strided views element by element, and evaluates `exp`
//! one element at a time. GELU-tanh as a composition is six passes and a scalar `exp` per
//! element (and more again under autodiff, which records each); RoPE's pair swap is a strided
//! copy. Here each is one vectorised pass, and its backward one more (see
//! `docs/PERFORMANCE.md`).

mod dense;
mod dispatch;
mod flex;
mod flex_step;
mod kernels;
mod modulation;
pub mod reference;
mod sdpa;
mod step;

#[doc(hidden)]
pub use kernels::with_simd_cap;

use burn::tensor::backend::Backend;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, DType, Tensor};

use dispatch::Route;

/// GELU with the tanh approximation (`approximate="tanh"`, diffusers' `gelu-approximate`):
/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, elementwise, any rank.
///
/// On Flex (`f32`) one vectorised pass forward and one backward, computed as
/// `x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3))` (the same function); elsewhere
/// [`reference::gelu_tanh`]. The two agree to float rounding (a few `f32` ulps).
pub fn gelu_tanh<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    match Route::of(x) {
        Route::Flex(t) => dispatch::from_flex(flex::gelu_tanh(t)),
        Route::AutodiffFlex(t) => dispatch::from_autodiff_flex(flex::gelu_tanh_autodiff(t)),
        Route::Generic(x) => reference::gelu_tanh(x),
    }
}

/// Rotary position embedding of `x: [batch, seq, heads, head_dim]` by the tables
/// `cos`, `sin: [seq, head_dim]`, interleaved pairs (diffusers `apply_rotary_emb_qwen(...,
/// use_real=False)` with the tables in the real form):
/// `out[..., i] = x[..., i] cos[s, i] + x[..., i ^ 1] sin[s, i]`, so for Qwen-Image's tables
/// (`cos[2p] = cos[2p+1] = cos a`, `sin[2p] = -sin a`, `sin[2p+1] = sin a`) each pair rotates
/// by its angle.
///
/// On Flex (`f32`) one pass, whose output is laid out heads-major (`[batch, heads, seq,
/// head_dim]` in memory, the same logical `[batch, seq, heads, head_dim]` tensor), so that
/// attention's `swap_dims(1, 2)` is already contiguous; gradients flow to `x` and, when they
/// are tracked, to the tables. Elsewhere [`reference::rope`].
///
/// # Panics
/// If `head_dim` is odd, or the tables are not `[seq, head_dim]` of `x`.
pub fn rope<B: Backend>(x: Tensor<B, 4>, cos: Tensor<B, 2>, sin: Tensor<B, 2>) -> Tensor<B, 4> {
    let [_, s, _, d] = x.dims();
    assert!(d % 2 == 0, "RoPE needs an even head_dim, got {d}");
    for (name, t) in [("cos", &cos), ("sin", &sin)] {
        assert_eq!(
            t.dims(),
            [s, d],
            "RoPE table {name} must be [seq, head_dim] = [{s}, {d}]"
        );
    }
    match (Route::of(x), Route::of(cos), Route::of(sin)) {
        (Route::Flex(x), Route::Flex(c), Route::Flex(s)) => {
            dispatch::from_flex(flex::rope(x, c, s))
        }
        (Route::AutodiffFlex(x), Route::AutodiffFlex(c), Route::AutodiffFlex(s)) => {
            dispatch::from_autodiff_flex(flex::rope_autodiff(x, c, s))
        }
        (x, c, s) => reference::rope(x.into_tensor(), c.into_tensor(), s.into_tensor()),
    }
}

/// The memory order of a `[batch, seq, heads, head_dim]` tensor ([`relayout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// `[batch, seq, heads, head_dim]` row-major: what a reshape of the projections' output to
    /// heads reads and writes without a copy.
    TokenMajor,
    /// `[batch, heads, seq, head_dim]` row-major: what attention's heads transpose reads
    /// without a copy.
    HeadsMajor,
}

/// `x: [batch, seq, heads, head_dim]` unchanged in value, its memory in `order`.
///
/// On Flex a copy of `head_dim`-long rows when the memory is in another order (burn-flex copies
/// a permuted tensor element by element), nothing when it is in `order` already; the gradient
/// passes through. Elsewhere `x` itself: the GPU backends choose their own layouts.
pub fn relayout<B: Backend>(x: Tensor<B, 4>, order: Order) -> Tensor<B, 4> {
    match Route::of(x) {
        Route::Flex(t) => dispatch::from_flex(flex::relayout(t, order)),
        Route::AutodiffFlex(t) => dispatch::from_autodiff_flex(flex::relayout_autodiff(t, order)),
        Route::Generic(x) => x,
    }
}

/// Scaled dot-product attention `softmax(q kᵀ / sqrt(head_dim)) v` of `[batch, heads, seq,
/// head_dim]` tensors. `key_mask` is `[batch, seq_kv]`, `true` for a key every query of that
/// batch row attends to (the Hugging Face convention), `false` for one masked out; `None`
/// attends to every key. Every query row must keep at least one key (the Flex kernels give
/// such a row zeros, burn's op NaN).
///
/// On Flex (`f32`, forward and under `Autodiff<Flex>`) the kernels of `sdpa.rs`: a block
/// of query rows at a time, the scores in cache, a vectorised softmax, the log-sum-exp kept
/// for a backward that recomputes the probabilities (five products per block, nothing of
/// size `seq × seq` kept); the key mask stays a `[batch, seq_kv]` vector. Elsewhere
/// `burn::tensor::module::attention` with the mask broadcast to `[batch, heads, seq_q,
/// seq_kv]`.
///
/// # Panics
/// If the shapes disagree: q `[b, h, s_q, d]`, k `[b, h, s_kv, d]`, v `[b, h, s_kv, d_v]`,
/// the mask `[b, s_kv]`.
pub fn attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    key_mask: Option<Tensor<B, 2, Bool>>,
) -> Tensor<B, 4> {
    let [b, h, sq, d] = q.dims();
    let [kb, kh, skv, kd] = k.dims();
    let [vb, vh, vs, _] = v.dims();
    assert!(
        [kb, kh, kd] == [b, h, d] && [vb, vh, vs] == [b, h, skv],
        "attention: q {:?}, k {:?} and v {:?} must be [b, h, s_q, d], [b, h, s_kv, d], [b, h, s_kv, d_v]",
        q.dims(),
        k.dims(),
        v.dims()
    );
    if let Some(m) = &key_mask {
        assert_eq!(
            m.dims(),
            [b, skv],
            "attention: the key mask must be [batch, seq_kv] = [{b}, {skv}]"
        );
    }
    let generic = |q: Tensor<B, 4>, k, v, key_mask: Option<Tensor<B, 2, Bool>>| {
        // burn's convention: `true` masks a key out.
        let mask = key_mask.map(|m| m.bool_not().reshape([b, 1, 1, skv]).expand([b, h, sq, skv]));
        burn::tensor::module::attention(q, k, v, mask, None, AttentionModuleOptions::default())
    };
    match (Route::of(q), Route::of(k), Route::of(v)) {
        (Route::Flex(q), Route::Flex(k), Route::Flex(v)) => {
            let keep = key_mask.map(keep_vector);
            dispatch::from_flex(flex::attention(q, k, v, keep.as_deref()))
        }
        (Route::AutodiffFlex(q), Route::AutodiffFlex(k), Route::AutodiffFlex(v)) => {
            let keep = key_mask.map(keep_vector);
            dispatch::from_autodiff_flex(flex::attention_autodiff(q, k, v, keep))
        }
        (q, k, v) => generic(q.into_tensor(), k.into_tensor(), v.into_tensor(), key_mask),
    }
}

/// A `[batch, seq_kv]` key mask as a vector, row-major.
fn keep_vector<B: Backend>(m: Tensor<B, 2, Bool>) -> Vec<bool> {
    m.into_data()
        .into_vec::<bool>()
        .expect("a boolean tensor reads as booleans")
}

/// Whether `m` is one `[batch, 1, dim]` modulation row per batch row of `x: [batch, tokens,
/// dim]`.
fn is_row_of(m: &Tensor<impl Backend, 3>, [b, _, d]: [usize; 3]) -> bool {
    m.dims() == [b, 1, d]
}

/// The adaptive layer norm of diffusion transformers: `layer_norm(x) * (1 + scale) + shift`
/// for `x: [batch, tokens, dim]`, the layer norm without affine parameters over `dim`
/// (`(x - mean) / sqrt(var + eps)`, biased variance), `shift` and `scale` broadcastable to
/// `x` (one `[batch, 1, dim]` row per batch row in the transformer).
///
/// On Flex (`f32`, rows `[batch, 1, dim]`) one pass forward that keeps each token's mean and
/// `1 / sqrt(var + eps)`, and one backward (the gradients of `x`, `shift` and `scale`, as
/// tracked); elsewhere [`reference::layer_norm_modulated`]. The two agree to float rounding.
pub fn layer_norm_modulated<B: Backend>(
    x: Tensor<B, 3>,
    shift: Tensor<B, 3>,
    scale: Tensor<B, 3>,
    eps: f64,
) -> Tensor<B, 3> {
    if !(is_row_of(&shift, x.dims()) && is_row_of(&scale, x.dims())) {
        return reference::layer_norm_modulated(x, shift, scale, eps);
    }
    let eps = eps as f32;
    match (Route::of(x), Route::of(shift), Route::of(scale)) {
        (Route::Flex(x), Route::Flex(sh), Route::Flex(sc)) => {
            dispatch::from_flex(flex::layer_norm_modulated(x, sh, sc, eps))
        }
        (Route::AutodiffFlex(x), Route::AutodiffFlex(sh), Route::AutodiffFlex(sc)) => {
            dispatch::from_autodiff_flex(flex::layer_norm_modulated_autodiff(x, sh, sc, eps))
        }
        (x, sh, sc) => reference::layer_norm_modulated(
            x.into_tensor(),
            sh.into_tensor(),
            sc.into_tensor(),
            eps as f64,
        ),
    }
}

/// The gated residual of diffusion transformers: `x + r * gate` for `x`, `r: [batch, tokens,
/// dim]` and `gate` broadcastable to them (one `[batch, 1, dim]` row per batch row in the
/// transformer).
///
/// On Flex (`f32`, a `[batch, 1, dim]` gate) one pass forward and one backward; elsewhere the
/// composition [`reference::gated_residual`]. The two give the same bits forward.
pub fn gated_residual<B: Backend>(
    x: Tensor<B, 3>,
    r: Tensor<B, 3>,
    gate: Tensor<B, 3>,
) -> Tensor<B, 3> {
    if !(is_row_of(&gate, x.dims()) && r.dims() == x.dims()) {
        return reference::gated_residual(x, r, gate);
    }
    match (Route::of(x), Route::of(r), Route::of(gate)) {
        (Route::Flex(x), Route::Flex(r), Route::Flex(g)) => {
            dispatch::from_flex(flex::gated_residual(x, r, g))
        }
        (Route::AutodiffFlex(x), Route::AutodiffFlex(r), Route::AutodiffFlex(g)) => {
            dispatch::from_autodiff_flex(flex::gated_residual_autodiff(x, r, g))
        }
        (x, r, g) => reference::gated_residual(x.into_tensor(), r.into_tensor(), g.into_tensor()),
    }
}

/// RMS norm with a learned per-channel weight over the last axis (diffusers `RMSNorm`,
/// `elementwise_affine=True`): `x / sqrt(mean(x^2) + eps) * weight`, `weight: [dim]`.
///
/// On Flex (`f32`) one pass forward that keeps each row's `1 / sqrt(mean(x^2) + eps)`, and one
/// backward (the gradients of `x` and `weight`, as tracked); elsewhere
/// [`reference::rms_norm`]. The two agree to float rounding.
///
/// # Panics
/// If `weight` is not `[dim]` of `x`'s last axis.
pub fn rms_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    weight: Tensor<B, 1>,
    eps: f64,
) -> Tensor<B, D> {
    let dim = x.dims()[D - 1];
    assert_eq!(
        weight.dims(),
        [dim],
        "rms_norm: the weight must be [dim] = [{dim}] of the input's last axis"
    );
    match (Route::of(x), Route::of(weight)) {
        (Route::Flex(x), Route::Flex(w)) => dispatch::from_flex(flex::rms_norm(x, w, eps as f32)),
        (Route::AutodiffFlex(x), Route::AutodiffFlex(w)) => {
            dispatch::from_autodiff_flex(flex::rms_norm_autodiff(x, w, eps as f32))
        }
        (x, w) => reference::rms_norm(x.into_tensor(), w.into_tensor(), eps),
    }
}

/// A LoRA adapter's term `scale · (x A) B` on a [`linear`] layer.
#[derive(Clone, Debug)]
pub struct LoraTerm<B: Backend> {
    /// `A: [d_in, rank]`.
    pub a: Tensor<B, 2>,
    /// `B: [rank, d_out]`.
    pub b: Tensor<B, 2>,
    /// The scale `s` (negative to subtract the term, as a merged adapter switched off does).
    pub scale: f64,
}

/// A linear layer `x W + b + s (x A) B` on the last axis of `x: [..., d_in]`, with `weight:
/// [d_in, d_out]` (burn's layout), an optional `bias: [d_out]` and an optional adapter.
///
/// On Flex (`f32`) the products as burn's batched product takes them (one matrix per index
/// of the axes before the last two), then one pass that adds the bias and the scaled adapter
/// term; `x A` is kept for the backward, which computes only the gradients of the tracked
/// inputs (a frozen base weight costs no `xᵀ g`). A row's output does not depend on the rows
/// beside it in the call. Elsewhere [`reference::linear`] (burn's `linear`, the adapter's
/// products, a scale and an add). The two agree to float rounding.
///
/// # Panics
/// If the shapes disagree.
pub fn linear<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    lora: Option<LoraTerm<B>>,
) -> Tensor<B, D> {
    let d_in = x.dims()[D - 1];
    let [w_in, d_out] = weight.dims();
    assert_eq!(
        w_in, d_in,
        "linear: the weight is [{w_in}, {d_out}], the input's last axis {d_in}"
    );
    if let Some(b) = &bias {
        assert_eq!(
            b.dims(),
            [d_out],
            "linear: the bias must be [d_out] = [{d_out}]"
        );
    }
    if let Some(l) = &lora {
        let [a_in, r] = l.a.dims();
        assert!(
            a_in == d_in && l.b.dims() == [r, d_out],
            "linear: the adapter is A {:?}, B {:?}; expected [{d_in}, r], [r, {d_out}]",
            l.a.dims(),
            l.b.dims()
        );
    }
    let (x, w) = (Route::of(x), Route::of(weight));
    let bias = bias.map(Route::of);
    let lora = lora.map(|l| (Route::of(l.a), Route::of(l.b), l.scale));
    let every = |is: fn(&dispatch::Kind) -> bool| {
        is(&x.kind())
            && is(&w.kind())
            && bias.as_ref().is_none_or(|b| is(&b.kind()))
            && lora
                .as_ref()
                .is_none_or(|(a, b, _)| is(&a.kind()) && is(&b.kind()))
    };
    if every(|k| *k == dispatch::Kind::Flex) {
        let lora = lora.map(|(a, b, s)| (a.into_flex(), b.into_flex(), s as f32));
        let y = flex::linear(
            x.into_flex(),
            w.into_flex(),
            bias.map(Route::into_flex),
            lora,
        );
        return dispatch::from_flex(y);
    }
    if every(|k| *k == dispatch::Kind::AutodiffFlex) {
        let lora = lora.map(|(a, b, s)| (a.into_autodiff_flex(), b.into_autodiff_flex(), s as f32));
        let y = flex::linear_autodiff(
            x.into_autodiff_flex(),
            w.into_autodiff_flex(),
            bias.map(Route::into_autodiff_flex),
            lora,
        );
        return dispatch::from_autodiff_flex(y);
    }
    reference::linear(
        x.into_tensor(),
        w.into_tensor(),
        bias.map(Route::into_tensor),
        lora.map(|(a, b, scale)| LoraTerm {
            a: a.into_tensor(),
            b: b.into_tensor(),
            scale,
        }),
    )
}

/// The per-sample coefficients as the kernels take them (`None`: every one is exactly 1),
/// rounded to `f32` as a scalar multiply of an `f32` tensor rounds its scalar.
fn row_scale(values: &[f64]) -> Option<Vec<f32>> {
    (!values.iter().all(|v| *v == 1.0)).then(|| values.iter().map(|v| *v as f32).collect())
}

fn check_per_sample(what: &str, values: &[f64], batch: usize) {
    assert_eq!(
        values.len(),
        batch,
        "{what}: {} per-sample values for a batch of {batch}",
        values.len()
    );
}

/// `a_b x + c_b v` for each sample `b` of `x`, `v: [batch, ...]` (one coefficient per sample
/// in `a` and `c`): a flow sampler's mean (`c_x x + c_v v`), Euler step (`x + dt v`) or draw
/// (`mu + std noise`).
///
/// On Flex (`f32`) one pass, split over rayon's pool for large tensors, with a backward that
/// scales the incoming gradient per sample; elsewhere [`reference::combine`]. The two give the
/// same bits: each element is `x * a + v * c` in the tensor's dtype, and a coefficient of 1
/// on every sample skips its multiply in both.
///
/// # Panics
/// If `x` and `v` differ in shape, or `a` or `c` does not have one value per sample.
pub fn combine<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    a: &[f64],
    v: Tensor<B, D>,
    c: &[f64],
) -> Tensor<B, D> {
    assert_eq!(x.dims(), v.dims(), "combine: x and v must have one shape");
    let batch = x.dims()[0];
    check_per_sample("combine (a)", a, batch);
    check_per_sample("combine (c)", c, batch);
    let c32 = || c.iter().map(|v| *v as f32).collect::<Vec<f32>>();
    match (Route::of(x), Route::of(v)) {
        (Route::Flex(x), Route::Flex(v)) => {
            dispatch::from_flex(flex_step::combine(x, row_scale(a).as_deref(), v, &c32()))
        }
        (Route::AutodiffFlex(x), Route::AutodiffFlex(v)) => {
            dispatch::from_autodiff_flex(flex_step::combine_autodiff(x, row_scale(a), v, c32()))
        }
        (x, v) => reference::combine(x.into_tensor(), a, v.into_tensor(), c),
    }
}

/// `mean((p - m)^2)` over every axis but the first, `[batch, ...] -> [batch]`: the mean
/// squared residual of a Gaussian log-density.
///
/// On Flex (`f32`) one pass that forms each difference in `f32` and sums the squares in `f64`
/// (the composition sums in `f32`: the two agree to `f32` rounding of the sum), with a backward
/// of one pass per tracked input; elsewhere [`reference::mean_square_residual`]. A sample's
/// value does not depend on the samples beside it or on the number of threads.
///
/// # Panics
/// If `p` and `m` differ in shape.
pub fn mean_square_residual<B: Backend, const D: usize>(
    p: Tensor<B, D>,
    m: Tensor<B, D>,
) -> Tensor<B, 1> {
    assert_eq!(
        p.dims(),
        m.dims(),
        "mean_square_residual: p and m must have one shape"
    );
    match (Route::of(p), Route::of(m)) {
        (Route::Flex(p), Route::Flex(m)) => {
            dispatch::from_flex(flex_step::mean_square_residual(p, m))
        }
        (Route::AutodiffFlex(p), Route::AutodiffFlex(m)) => {
            dispatch::from_autodiff_flex(flex_step::mean_square_residual_autodiff(p, m))
        }
        (p, m) => reference::mean_square_residual(p.into_tensor(), m.into_tensor()),
    }
}

/// `t` rounded to the precision of `storage` and back to its own dtype (round to nearest,
/// ties to even), as a fresh tensor with no autodiff history: what a value reads back as
/// after a trajectory stores it at `storage`. Identity when `storage` is `t`'s dtype.
///
/// On Flex (`f32` to `bf16`) one vectorised pass; elsewhere [`reference::round_through`], the
/// conversion on the host. The two give the same bits (NaNs included).
pub fn round_through<B: Backend, const D: usize>(t: Tensor<B, D>, storage: DType) -> Tensor<B, D> {
    if storage != DType::BF16 {
        return reference::round_through(t, storage);
    }
    match Route::of(t) {
        Route::Flex(t) => dispatch::from_flex(flex_step::round_bf16(t)),
        Route::AutodiffFlex(t) => dispatch::from_autodiff_flex(flex_step::round_bf16_autodiff(t)),
        Route::Generic(t) => reference::round_through(t, storage),
    }
}

/// Where the next sample of a [`gaussian_step`] comes from.
pub enum NextSample<'a, B: Backend, const D: usize> {
    /// Drawn: `mean + std_b noise`, from standard-normal noise and one std per sample.
    Draw {
        /// `[batch, ...]`, the shape of `x`.
        noise: Tensor<B, D>,
        /// One per sample.
        std: &'a [f64],
    },
    /// Stored by a rollout, replayed (never differentiated).
    Stored(Tensor<B, D>),
}

/// What a [`gaussian_step`] gives.
pub struct GaussianStep<B: Backend, const D: usize> {
    /// `a_b x + c_b v`, differentiable in `x` and `v`.
    pub mean: Tensor<B, D>,
    /// The next sample, rounded through the storage dtype; no autodiff history.
    pub next: Tensor<B, D>,
    /// `mean((next - mean)^2)` over each sample's elements, `[batch]`, differentiable through
    /// `mean`.
    pub mean_sq: Tensor<B, 1>,
}

/// One step of a Gaussian transition `x' ~ N(a_b x + c_b v, std_b^2)`: its mean, the next
/// sample (drawn from `noise`, or a stored one) rounded through `storage` (the precision a
/// trajectory keeps it at; `None` keeps it as it is), and each sample's mean squared residual
/// `mean((x' - mean)^2)`, from which the log-density follows.
///
/// It is [`combine`], [`round_through`] and [`mean_square_residual`] one after another, and
/// gives their bits on every backend. On Flex (`f32`, no autodiff, storage `bf16` or none) it
/// is one pass over the samples, chunk by chunk while each is in cache; on `Autodiff<Flex>`
/// the three kernels, whose backward passes reach `x` and `v` through the mean.
///
/// # Panics
/// If the tensors differ in shape, or a coefficient list does not have one value per sample.
pub fn gaussian_step<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    a: &[f64],
    v: Tensor<B, D>,
    c: &[f64],
    next: NextSample<'_, B, D>,
    storage: Option<DType>,
) -> GaussianStep<B, D> {
    let batch = x.dims()[0];
    assert_eq!(
        x.dims(),
        v.dims(),
        "gaussian_step: x and v must have one shape"
    );
    check_per_sample("gaussian_step (a)", a, batch);
    check_per_sample("gaussian_step (c)", c, batch);
    match &next {
        NextSample::Draw { noise, std } => {
            assert_eq!(
                noise.dims(),
                x.dims(),
                "gaussian_step: noise and x must have one shape"
            );
            check_per_sample("gaussian_step (std)", std, batch);
        }
        NextSample::Stored(p) => {
            assert_eq!(
                p.dims(),
                x.dims(),
                "gaussian_step: the stored sample and x must have one shape"
            );
        }
    }
    // rounding through the tensor's own dtype is no rounding
    let storage = storage.filter(|s| *s != x.dtype());
    let fusable = matches!(storage, None | Some(DType::BF16));
    let (x, v) = (Route::of(x), Route::of(v));
    let next = match next {
        NextSample::Draw { noise, std } => (Route::of(noise), Some(std)),
        NextSample::Stored(p) => (Route::of(p), None),
    };
    if fusable
        && x.kind() == dispatch::Kind::Flex
        && v.kind() == dispatch::Kind::Flex
        && next.0.kind() == dispatch::Kind::Flex
    {
        let c32: Vec<f32> = c.iter().map(|v| *v as f32).collect();
        let std32: Option<Vec<f32>> = next.1.map(|s| s.iter().map(|v| *v as f32).collect());
        let source = next.0.into_flex();
        let source = match &std32 {
            Some(std) => flex_step::NextSample::Draw(source, std),
            None => flex_step::NextSample::Stored(source),
        };
        let (mean, nx, mean_sq) = flex_step::gaussian_step(
            x.into_flex(),
            row_scale(a).as_deref(),
            v.into_flex(),
            &c32,
            source,
            storage.is_some(),
        );
        return GaussianStep {
            mean: dispatch::from_flex(mean),
            next: dispatch::from_flex(nx),
            mean_sq: dispatch::from_flex(mean_sq),
        };
    }
    let mean = combine(x.into_tensor(), a, v.into_tensor(), c);
    let nx = match next {
        (noise, Some(std)) => {
            let ones = vec![1.0; batch];
            combine(mean.clone().detach(), &ones, noise.into_tensor(), std)
        }
        (p, None) => p.into_tensor().detach(),
    };
    let nx = match storage {
        Some(s) => round_through(nx, s),
        None => nx,
    };
    let mean_sq = mean_square_residual(nx.clone(), mean.clone());
    GaussianStep {
        mean,
        next: nx,
        mean_sq,
    }
}
