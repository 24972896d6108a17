//! The Flex and `Autodiff<Flex>` sides of the fused operations: the tensors' buffers handed to
//! the slice kernels, and the backward steps registered with burn's autodiff graph.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::backend::flex::{Flex, FlexTensor};
use burn::tensor::TensorData;
use burn::tensor::ops::{ActivationOps, AttentionModuleOptions, FloatTensorOps, ModuleOps};

use crate::Order;
use crate::dispatch::AutodiffFlexTensor;
use crate::kernels::{self, Rows, Turn};

/// `t` with a contiguous buffer that starts at its first element.
fn contiguous(t: FlexTensor) -> FlexTensor {
    if t.as_slice::<f32>().is_some() {
        t
    } else {
        t.to_contiguous()
    }
}

fn slice(t: &FlexTensor) -> &[f32] {
    t.as_slice::<f32>()
        .expect("fused-ops reads f32 tensors made contiguous first")
}

fn from_vec(v: Vec<f32>, dims: &[usize]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(v, dims.to_vec()))
}

pub(crate) fn gelu_tanh(x: FlexTensor) -> FlexTensor {
    let x = contiguous(x);
    let dims = x.layout().shape().to_vec();
    let xs = slice(&x);
    let mut y = vec![0f32; xs.len()];
    kernels::gelu(xs, &mut y);
    from_vec(y, &dims)
}

fn gelu_tanh_grad(x: &FlexTensor, g: FlexTensor) -> FlexTensor {
    let g = contiguous(g);
    let dims = x.layout().shape().to_vec();
    let mut out = vec![0f32; slice(x).len()];
    kernels::gelu_grad(slice(x), slice(&g), &mut out);
    from_vec(out, &dims)
}

#[derive(Debug)]
struct GeluBackward;

impl Backward<Flex, 1> for GeluBackward {
    /// The input, contiguous.
    type State = FlexTensor;

    fn backward(self, ops: Ops<FlexTensor, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let x = ops.state;
        unary::<Flex, _>(ops.parents, ops.node, grads, |g| gelu_tanh_grad(&x, g));
    }
}

pub(crate) fn gelu_tanh_autodiff(x: AutodiffFlexTensor) -> AutodiffFlexTensor {
    match GeluBackward
        .prepare::<NoCheckpointing>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let input = contiguous(x.primitive);
            let y = gelu_tanh(input.clone());
            prep.finish(input, y)
        }
        OpsKind::UnTracked(prep) => prep.finish(gelu_tanh(x.primitive)),
    }
}

/// The rows of a 4-d Flex tensor, when its last axis is contiguous and its other strides are
/// not negative; `None` otherwise.
fn rows(t: &FlexTensor) -> Option<Rows> {
    let l = t.layout();
    let st = l.strides();
    let sh = l.shape();
    if st.len() != 4 || st[3] != 1 || st[..3].iter().any(|s| *s < 0) {
        return None;
    }
    Some(Rows {
        dims: [sh[0], sh[1], sh[2], sh[3]],
        strides: [st[0] as usize, st[1] as usize, st[2] as usize],
        offset: l.start_offset(),
    })
}

/// `t` and its rows, copied to token-major order when its layout does not fit [`Rows`].
fn with_rows(t: FlexTensor) -> (FlexTensor, Rows) {
    match rows(&t) {
        Some(r) => (t, r),
        None => {
            let t = t.to_contiguous();
            let r = rows(&t).expect("a contiguous 4-d tensor has rows");
            (t, r)
        }
    }
}

/// The rows of a `[batch, seq, heads, head_dim]` buffer laid out in `order`.
fn ordered_rows(dims: [usize; 4], order: Order) -> Rows {
    match order {
        Order::TokenMajor => Rows::token_major(dims),
        Order::HeadsMajor => Rows::heads_major(dims),
    }
}

/// A buffer laid out by [`ordered_rows`] as the logical `[batch, seq, heads, head_dim]`
/// tensor (a transposed view of `[batch, heads, seq, head_dim]` when heads-major).
fn ordered_tensor(out: Vec<f32>, dims: [usize; 4], order: Order) -> FlexTensor {
    let [b, s, h, d] = dims;
    match order {
        Order::TokenMajor => from_vec(out, &dims),
        Order::HeadsMajor => from_vec(out, &[b, h, s, d]).transpose(1, 2),
    }
}

/// RoPE into a heads-major buffer, returned as the logical `[batch, seq, heads, head_dim]`
/// tensor (a transposed view of `[batch, heads, seq, head_dim]`).
pub(crate) fn rope(x: FlexTensor, cos: FlexTensor, sin: FlexTensor) -> FlexTensor {
    let (x, xr) = with_rows(x);
    let (cos, sin) = (contiguous(cos), contiguous(sin));
    let or = ordered_rows(xr.dims, Order::HeadsMajor);
    let mut out = vec![0f32; xr.dims.iter().product()];
    kernels::rope(
        x.storage::<f32>(),
        &xr,
        slice(&cos),
        slice(&sin),
        &mut out,
        &or,
        Turn::Forward,
    );
    ordered_tensor(out, xr.dims, Order::HeadsMajor)
}

#[derive(Debug)]
struct RopeBackward;

#[derive(Clone, Debug)]
struct RopeState {
    /// The input: kept only when a table's gradient is wanted.
    x: Option<FlexTensor>,
    cos: FlexTensor,
    sin: FlexTensor,
}

impl Backward<Flex, 3> for RopeBackward {
    type State = RopeState;

    fn backward(self, ops: Ops<RopeState, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [px, pc, ps] = ops.parents;
        let st = ops.state;
        let (g, gr) = with_rows(grads.consume::<Flex>(&ops.node));
        let [b, s, h, d] = gr.dims;
        if let Some(node) = px {
            let or = ordered_rows(gr.dims, Order::TokenMajor);
            let mut out = vec![0f32; b * s * h * d];
            kernels::rope(
                g.storage::<f32>(),
                &gr,
                slice(&st.cos),
                slice(&st.sin),
                &mut out,
                &or,
                Turn::Transposed,
            );
            grads.register::<Flex>(node.id, ordered_tensor(out, gr.dims, Order::TokenMajor));
        }
        if pc.is_some() || ps.is_some() {
            let (x, xr) = with_rows(st.x.expect("the input is kept when a table is tracked"));
            let (gc, gs) = kernels::rope_table_grads(x.storage::<f32>(), &xr, g.storage(), &gr);
            if let Some(node) = pc {
                grads.register::<Flex>(node.id, from_vec(gc, &[s, d]));
            }
            if let Some(node) = ps {
                grads.register::<Flex>(node.id, from_vec(gs, &[s, d]));
            }
        }
    }
}

pub(crate) fn rope_autodiff(
    x: AutodiffFlexTensor,
    cos: AutodiffFlexTensor,
    sin: AutodiffFlexTensor,
) -> AutodiffFlexTensor {
    let tables_tracked = !cos.node.requirement.is_none() || !sin.node.requirement.is_none();
    match RopeBackward
        .prepare::<NoCheckpointing>([x.node.clone(), cos.node.clone(), sin.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let (c, s) = (contiguous(cos.primitive), contiguous(sin.primitive));
            let state = RopeState {
                x: tables_tracked.then(|| x.primitive.clone()),
                cos: c.clone(),
                sin: s.clone(),
            };
            prep.finish(state, rope(x.primitive, c, s))
        }
        OpsKind::UnTracked(prep) => prep.finish(rope(x.primitive, cos.primitive, sin.primitive)),
    }
}

/// `x` with its memory in `order`: unchanged when it already is, else copied a row at a time.
pub(crate) fn relayout(x: FlexTensor, order: Order) -> FlexTensor {
    let in_order = match order {
        Order::TokenMajor => x.as_slice::<f32>().is_some() && x.layout().start_offset() == 0,
        Order::HeadsMajor => {
            let t = x.clone().transpose(1, 2);
            t.as_slice::<f32>().is_some() && t.layout().start_offset() == 0
        }
    };
    if in_order {
        return x;
    }
    let (x, xr) = with_rows(x);
    let mut out = vec![0f32; xr.dims.iter().product()];
    kernels::copy_rows(
        x.storage::<f32>(),
        &xr,
        &mut out,
        &ordered_rows(xr.dims, order),
    );
    ordered_tensor(out, xr.dims, order)
}

#[derive(Debug)]
struct RelayoutBackward;

impl Backward<Flex, 1> for RelayoutBackward {
    type State = ();

    fn backward(self, ops: Ops<(), 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        // The values are unchanged, so the gradient passes through as it is.
        unary::<Flex, _>(ops.parents, ops.node, grads, |g| g);
    }
}

pub(crate) fn relayout_autodiff(x: AutodiffFlexTensor, order: Order) -> AutodiffFlexTensor {
    RelayoutBackward
        .prepare::<NoCheckpointing>([x.node.clone()])
        .compute_bound()
        .stateless(relayout(x.primitive, order))
}

/// Scaled dot-product attention of `[batch, heads, seq, head_dim]` tensors on Flex: its own
/// fused kernel (a score tile at a time, or flash tiles for long sequences).
pub(crate) fn attention(
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    mask: Option<FlexTensor>,
) -> FlexTensor {
    Flex::attention(q, k, v, mask, None, AttentionModuleOptions::default())
}

#[derive(Debug)]
struct AttentionBackward;

#[derive(Clone, Debug)]
struct AttentionState {
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    mask: Option<FlexTensor>,
}

impl Backward<Flex, 3> for AttentionBackward {
    type State = AttentionState;

    /// Recomputes the probabilities `P = softmax(q kᵀ / sqrt(d))` (masked keys at `-inf`) and
    /// returns `dv = Pᵀ g`, `dq = dS k / sqrt(d)`, `dk = dSᵀ q / sqrt(d)` with
    /// `dS = P ∘ (g vᵀ − rowsum(P ∘ g vᵀ))`: five products, no score matrix kept from the
    /// forward.
    fn backward(self, ops: Ops<AttentionState, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [pq, pk, pv] = ops.parents;
        let AttentionState { q, k, v, mask } = ops.state;
        let g = grads.consume::<Flex>(&ops.node);
        let d = q.layout().shape()[3];
        let scale = 1.0 / (d as f64).sqrt();
        let scores = Flex::float_mul_scalar(
            Flex::float_matmul(q.clone(), Flex::float_transpose(k.clone())),
            scale.into(),
        );
        let scores = match mask {
            Some(m) => Flex::float_mask_fill(scores, m, f32::NEG_INFINITY.into()),
            None => scores,
        };
        let p = Flex::softmax(scores, 3);
        if let Some(node) = pv {
            let dv = Flex::float_matmul(Flex::float_transpose(p.clone()), g.clone());
            grads.register::<Flex>(node.id, dv);
        }
        if pq.is_none() && pk.is_none() {
            return;
        }
        let dp = Flex::float_matmul(g, Flex::float_transpose(v));
        let row = Flex::float_sum_dim(Flex::float_mul(p.clone(), dp.clone()), 3);
        let ds = Flex::float_mul_scalar(Flex::float_mul(p, Flex::float_sub(dp, row)), scale.into());
        if let Some(node) = pq {
            grads.register::<Flex>(node.id, Flex::float_matmul(ds.clone(), k));
        }
        if let Some(node) = pk {
            grads.register::<Flex>(node.id, Flex::float_matmul(Flex::float_transpose(ds), q));
        }
    }
}

pub(crate) fn attention_autodiff(
    q: AutodiffFlexTensor,
    k: AutodiffFlexTensor,
    v: AutodiffFlexTensor,
    mask: Option<FlexTensor>,
) -> AutodiffFlexTensor {
    match AttentionBackward
        .prepare::<NoCheckpointing>([q.node.clone(), k.node.clone(), v.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let state = AttentionState {
                q: q.primitive.clone(),
                k: k.primitive.clone(),
                v: v.primitive.clone(),
                mask: mask.clone(),
            };
            prep.finish(
                state,
                attention(q.primitive, k.primitive, v.primitive, mask),
            )
        }
        OpsKind::UnTracked(prep) => {
            prep.finish(attention(q.primitive, k.primitive, v.primitive, mask))
        }
    }
}
