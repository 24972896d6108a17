//! Fused tensor operations for the transformer's hot paths.
//!
//! Each operation here has two implementations with one meaning:
//!
//! * a **generic composition** of burn tensor ops ([`reference`]), which runs on every burn
//!   backend (CUDA, wgpu, NdArray, …) and is differentiated by burn's autodiff op by op;
//! * a **single-pass kernel** for burn's Flex CPU backend, forward and backward, used when the
//!   tensor is a `f32` Flex tensor or an `f32` `Autodiff<Flex>` tensor.
//!
//! The public functions ([`gelu_tanh`], [`rope`], [`relayout`], [`attention`]) pick the kernel when the tensor's primitive is
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

mod dispatch;
mod flex;
mod kernels;
pub mod reference;

use burn::tensor::backend::Backend;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, Tensor};

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
/// head_dim]` tensors; `mask` (broadcastable to `[batch, heads, seq_q, seq_kv]`) is `true`
/// where a key is masked out, burn's convention. Every query row must keep at least one key.
///
/// On Flex the backend's own fused attention. Under `Autodiff<Flex>` the same forward, and a
/// backward that recomputes the probabilities and takes five matrix products, where burn's
/// autodiff would record its reference decomposition op by op (a scalar `exp` per score, the
/// score matrix kept for backward). Elsewhere `burn::tensor::module::attention`.
pub fn attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: Option<Tensor<B, 4, Bool>>,
) -> Tensor<B, 4> {
    let generic = |q, k, v, mask| {
        burn::tensor::module::attention(q, k, v, mask, None, AttentionModuleOptions::default())
    };
    let mask = match mask.map(dispatch::bool_flex) {
        None => None,
        Some(Ok(m)) => Some(m),
        Some(Err(m)) => return generic(q, k, v, Some(m)),
    };
    let rebuild =
        |m: Option<burn::backend::flex::FlexTensor>| m.map(|m| dispatch::bool_from_flex::<B, 4>(m));
    match (Route::of(q), Route::of(k), Route::of(v)) {
        (Route::Flex(q), Route::Flex(k), Route::Flex(v)) => {
            dispatch::from_flex(flex::attention(q, k, v, mask))
        }
        (Route::AutodiffFlex(q), Route::AutodiffFlex(k), Route::AutodiffFlex(v)) => {
            dispatch::from_autodiff_flex(flex::attention_autodiff(q, k, v, mask))
        }
        (q, k, v) => generic(
            q.into_tensor(),
            k.into_tensor(),
            v.into_tensor(),
            rebuild(mask),
        ),
    }
}
