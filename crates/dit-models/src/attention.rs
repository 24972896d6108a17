//! Joint scaled-dot-product attention: the one place this crate calls burn's attention op.
//!
//! The op is `fused_ops::attention`, which takes `[batch, heads, seq, head_dim]` and a
//! `[batch, seq]` key mask where `true` means *attend* (diffusers / Hugging Face convention);
//! this wrapper takes the `[batch, seq, heads, head_dim]` layout of the model and returns
//! `[batch, seq, heads * head_dim]`. On the CPU backend the op is a kernel of its own, forward
//! and backward; elsewhere burn's attention with the mask broadcast.

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor};
use fused_ops::Order;

/// `softmax(q·kᵀ / sqrt(head_dim) + mask) · v` over the joint sequence.
///
/// * `q`, `k`, `v`: `[batch, seq, heads, head_dim]`;
/// * `key_mask`: `[batch, seq]`, `true` for a key every query may attend to, `false` for a
///   padding token; `None` attends to everything. Every query row must keep at least one key.
pub fn joint_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    key_mask: Option<Tensor<B, 2, Bool>>,
) -> Tensor<B, 3> {
    let [b, s, h, d] = q.dims();
    // Heads-major memory, so that the transposes below are free on the CPU backend (q and k
    // come heads-major from RoPE already), and the output back to token-major a row at a time.
    let [q, k, v] = [q, k, v].map(|t| fused_ops::relayout(t, Order::HeadsMajor));
    let out = fused_ops::attention(
        q.swap_dims(1, 2),
        k.swap_dims(1, 2),
        v.swap_dims(1, 2),
        key_mask,
    );
    fused_ops::relayout(out.swap_dims(1, 2), Order::TokenMajor).reshape([b, s, h * d])
}
