//! Joint scaled-dot-product attention: the one place this crate calls burn's attention op.
//!
//! burn's `attention` takes `[batch, heads, seq, head_dim]` and a boolean mask where `true`
//! means *masked out*; this wrapper takes the `[batch, seq, heads, head_dim]` layout of the
//! model and a key mask where `true` means *attend* (diffusers / Hugging Face convention), and
//! returns `[batch, seq, heads * head_dim]`. The op is `fused_ops::attention`: burn's own on
//! every backend, with a backward of our own under autodiff on the CPU backend (burn would
//! differentiate its reference decomposition op by op).

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
    let mask = key_mask.map(|m| {
        let [mb, ms] = m.dims();
        assert_eq!(
            [mb, ms],
            [b, s],
            "attention key mask must be [batch, seq] = [{b}, {s}]"
        );
        let m = m.bool_not().reshape([b, 1, 1, s]);
        // Written out when small (`layers::write_out`): burn's CPU backend copies a broadcast
        // mask element by element on every use, forward and backward; rows repeat by `memcpy`.
        if crate::layers::write_out([b, h, s, s]) {
            m.repeat_dim(2, s).repeat_dim(1, h)
        } else {
            m.expand([b, h, s, s])
        }
    });
    // Heads-major memory, so that the transposes below are free on the CPU backend (q and k
    // come heads-major from RoPE already), and the output back to token-major a row at a time.
    let [q, k, v] = [q, k, v].map(|t| fused_ops::relayout(t, Order::HeadsMajor));
    let out = fused_ops::attention(
        q.swap_dims(1, 2),
        k.swap_dims(1, 2),
        v.swap_dims(1, 2),
        mask,
    );
    fused_ops::relayout(out.swap_dims(1, 2), Order::TokenMajor).reshape([b, s, h * d])
}
