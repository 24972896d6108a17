//! The Flex and `Autodiff<Flex>` sides of the fused operations: the tensors' buffers handed to
//! the slice kernels, and the backward steps registered with burn's autodiff graph.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::backend::flex::{Flex, FlexTensor};
use burn::tensor::TensorData;

use crate::Order;
use crate::dense;
use crate::dispatch::AutodiffFlexTensor;
use crate::kernels::{self, Rows, Turn};
use crate::modulation;
use crate::sdpa;

/// `t` with a contiguous buffer that starts at its first element.
///
/// An `f32` tensor of at most four axes whose last axis is contiguous (a transposed or permuted
/// view, such as a gradient arriving through `swap_dims`) is copied a last-axis row at a time;
/// burn-flex's own copy walks such a layout element by element.
pub(crate) fn contiguous(t: FlexTensor) -> FlexTensor {
    if t.as_slice::<f32>().is_some() {
        return t;
    }
    match padded_rows(&t) {
        Some(xr) => {
            let dims = t.layout().shape().to_vec();
            let mut out = vec![0f32; xr.dims.iter().product()];
            kernels::copy_rows(
                t.storage::<f32>(),
                &xr,
                &mut out,
                &Rows::token_major(xr.dims),
            );
            from_vec(out, &dims)
        }
        None => t.to_contiguous(),
    }
}

/// Rows shorter than this are left to burn-flex's copy.
const MIN_COPY_ROW: usize = 8;

/// The rows of an `f32` tensor of one to four axes as a 4-d layout (leading axes of one
/// added), when its last axis is contiguous, at least [`MIN_COPY_ROW`] long, and its other
/// strides are not negative.
fn padded_rows(t: &FlexTensor) -> Option<Rows> {
    let l = t.layout();
    let (st, sh) = (l.strides(), l.shape());
    let rank = st.len();
    if t.dtype() != burn::tensor::DType::F32
        || !(1..=4).contains(&rank)
        || st[rank - 1] != 1
        || sh[rank - 1] < MIN_COPY_ROW
        || st.iter().any(|s| *s < 0)
    {
        return None;
    }
    let (mut dims, mut strides) = ([1usize; 4], [0usize; 3]);
    for a in 0..rank {
        dims[4 - rank + a] = sh[a];
        if a + 1 < rank {
            strides[4 - rank + a] = st[a] as usize;
        }
    }
    Some(Rows {
        dims,
        strides,
        offset: l.start_offset(),
    })
}

pub(crate) fn slice(t: &FlexTensor) -> &[f32] {
    t.as_slice::<f32>()
        .expect("fused-ops reads f32 tensors made contiguous first")
}

pub(crate) fn from_vec(v: Vec<f32>, dims: &[usize]) -> FlexTensor {
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

/// The shape of an attention call on `[batch, heads, seq, head_dim]` tensors.
fn attention_shape(q: &FlexTensor, k: &FlexTensor, v: &FlexTensor) -> sdpa::Shape {
    let (qs, ks, vs) = (q.layout().shape(), k.layout().shape(), v.layout().shape());
    sdpa::Shape {
        batch: qs[0],
        heads: qs[1],
        seq_q: qs[2],
        seq_kv: ks[2],
        d: qs[3],
        dv: vs[3],
    }
}

/// Scaled dot-product attention of `[batch, heads, seq, head_dim]` tensors on Flex, with the
/// `[batch, seq_kv]` keys kept; returns the output and each query row's log-sum-exp.
fn attention_with_lse(
    q: &FlexTensor,
    k: &FlexTensor,
    v: &FlexTensor,
    keep: Option<&[bool]>,
) -> (FlexTensor, FlexTensor) {
    let sh = attention_shape(q, k, v);
    let mut out = vec![0f32; sh.batch * sh.heads * sh.seq_q * sh.dv];
    let mut lse = vec![0f32; sh.batch * sh.heads * sh.seq_q];
    sdpa::forward(&sh, slice(q), slice(k), slice(v), keep, &mut out, &mut lse);
    (
        from_vec(out, &[sh.batch, sh.heads, sh.seq_q, sh.dv]),
        from_vec(lse, &[sh.batch, sh.heads, sh.seq_q]),
    )
}

/// [`attention_with_lse`]'s output.
pub(crate) fn attention(
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    keep: Option<&[bool]>,
) -> FlexTensor {
    let [q, k, v] = [q, k, v].map(contiguous);
    attention_with_lse(&q, &k, &v, keep).0
}

#[derive(Debug)]
struct AttentionBackward;

#[derive(Clone, Debug)]
struct AttentionState {
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    keep: Option<Vec<bool>>,
    out: FlexTensor,
    lse: FlexTensor,
}

impl Backward<Flex, 3> for AttentionBackward {
    type State = AttentionState;

    /// `sdpa::backward`: the probabilities recomputed a block of query rows at a time from
    /// the forward's log-sum-exp, five products per block.
    fn backward(self, ops: Ops<AttentionState, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [pq, pk, pv] = ops.parents;
        let st = ops.state;
        let g = contiguous(grads.consume::<Flex>(&ops.node));
        let sh = attention_shape(&st.q, &st.k, &st.v);
        let saved = sdpa::Saved {
            q: slice(&st.q),
            k: slice(&st.k),
            v: slice(&st.v),
            keep: st.keep.as_deref(),
            out: slice(&st.out),
            lse: slice(&st.lse),
        };
        let [dq, dk, dv] = sdpa::backward(&sh, &saved, slice(&g));
        let (b, h) = (sh.batch, sh.heads);
        for (node, grad, dims) in [
            (pq, dq, [b, h, sh.seq_q, sh.d]),
            (pk, dk, [b, h, sh.seq_kv, sh.d]),
            (pv, dv, [b, h, sh.seq_kv, sh.dv]),
        ] {
            if let Some(node) = node {
                grads.register::<Flex>(node.id, from_vec(grad, &dims));
            }
        }
    }
}

pub(crate) fn attention_autodiff(
    q: AutodiffFlexTensor,
    k: AutodiffFlexTensor,
    v: AutodiffFlexTensor,
    keep: Option<Vec<bool>>,
) -> AutodiffFlexTensor {
    match AttentionBackward
        .prepare::<NoCheckpointing>([q.node.clone(), k.node.clone(), v.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let [q, k, v] = [q.primitive, k.primitive, v.primitive].map(contiguous);
            let (out, lse) = attention_with_lse(&q, &k, &v, keep.as_deref());
            let state = AttentionState {
                q,
                k,
                v,
                keep,
                out: out.clone(),
                lse,
            };
            prep.finish(state, out)
        }
        OpsKind::UnTracked(prep) => prep.finish(attention(
            q.primitive,
            k.primitive,
            v.primitive,
            keep.as_deref(),
        )),
    }
}

fn tokens_of(x: &FlexTensor) -> modulation::Tokens {
    let s = x.layout().shape();
    modulation::Tokens {
        batch: s[0],
        tokens: s[1],
        dim: s[2],
    }
}

/// [`modulation::layer_norm_modulated`] of contiguous tensors: the output, the means, the rstds.
fn layer_norm_modulated_parts(
    x: &FlexTensor,
    shift: &FlexTensor,
    scale: &FlexTensor,
    eps: f32,
) -> (FlexTensor, Vec<f32>, Vec<f32>) {
    let sh = tokens_of(x);
    let mut y = vec![0f32; sh.batch * sh.tokens * sh.dim];
    let mut mean = vec![0f32; sh.batch * sh.tokens];
    let mut rstd = vec![0f32; sh.batch * sh.tokens];
    modulation::layer_norm_modulated(
        sh,
        slice(x),
        slice(shift),
        slice(scale),
        eps,
        &mut y,
        &mut mean,
        &mut rstd,
    );
    (from_vec(y, &[sh.batch, sh.tokens, sh.dim]), mean, rstd)
}

pub(crate) fn layer_norm_modulated(
    x: FlexTensor,
    shift: FlexTensor,
    scale: FlexTensor,
    eps: f32,
) -> FlexTensor {
    let [x, shift, scale] = [x, shift, scale].map(contiguous);
    layer_norm_modulated_parts(&x, &shift, &scale, eps).0
}

#[derive(Debug)]
struct LayerNormModulatedBackward;

#[derive(Clone, Debug)]
struct LayerNormModulatedState {
    x: FlexTensor,
    scale: FlexTensor,
    mean: Vec<f32>,
    rstd: Vec<f32>,
}

impl Backward<Flex, 3> for LayerNormModulatedBackward {
    type State = LayerNormModulatedState;

    fn backward(
        self,
        ops: Ops<LayerNormModulatedState, 3>,
        grads: &mut Gradients,
        _: &mut Checkpointer,
    ) {
        let [px, pshift, pscale] = ops.parents;
        let st = ops.state;
        let g = contiguous(grads.consume::<Flex>(&ops.node));
        let sh = tokens_of(&st.x);
        let want = |p: &Option<_>, n: usize| p.as_ref().map(|_| vec![0f32; n]);
        let mut dx = want(&px, sh.batch * sh.tokens * sh.dim);
        let mut dshift = want(&pshift, sh.batch * sh.dim);
        let mut dscale = want(&pscale, sh.batch * sh.dim);
        modulation::layer_norm_modulated_backward(
            sh,
            slice(&st.x),
            slice(&st.scale),
            &st.mean,
            &st.rstd,
            slice(&g),
            modulation::LnModGrads {
                dx: dx.as_deref_mut(),
                dshift: dshift.as_deref_mut(),
                dscale: dscale.as_deref_mut(),
            },
        );
        let row = [sh.batch, 1, sh.dim];
        for (node, grad, dims) in [
            (px, dx, [sh.batch, sh.tokens, sh.dim]),
            (pshift, dshift, row),
            (pscale, dscale, row),
        ] {
            if let (Some(node), Some(grad)) = (node, grad) {
                grads.register::<Flex>(node.id, from_vec(grad, &dims));
            }
        }
    }
}

pub(crate) fn layer_norm_modulated_autodiff(
    x: AutodiffFlexTensor,
    shift: AutodiffFlexTensor,
    scale: AutodiffFlexTensor,
    eps: f32,
) -> AutodiffFlexTensor {
    match LayerNormModulatedBackward
        .prepare::<NoCheckpointing>([x.node.clone(), shift.node.clone(), scale.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let [x, shift, scale] = [x.primitive, shift.primitive, scale.primitive].map(contiguous);
            let (y, mean, rstd) = layer_norm_modulated_parts(&x, &shift, &scale, eps);
            let state = LayerNormModulatedState {
                x,
                scale,
                mean,
                rstd,
            };
            prep.finish(state, y)
        }
        OpsKind::UnTracked(prep) => prep.finish(layer_norm_modulated(
            x.primitive,
            shift.primitive,
            scale.primitive,
            eps,
        )),
    }
}

pub(crate) fn gated_residual(x: FlexTensor, r: FlexTensor, gate: FlexTensor) -> FlexTensor {
    let [x, r, gate] = [x, r, gate].map(contiguous);
    let sh = tokens_of(&x);
    let mut y = vec![0f32; sh.batch * sh.tokens * sh.dim];
    modulation::gated_residual(sh, slice(&x), slice(&r), slice(&gate), &mut y);
    from_vec(y, &[sh.batch, sh.tokens, sh.dim])
}

#[derive(Debug)]
struct GatedResidualBackward;

#[derive(Clone, Debug)]
struct GatedResidualState {
    /// The residual branch: kept only when the gate's gradient is wanted.
    r: Option<FlexTensor>,
    gate: FlexTensor,
    tokens: modulation::Tokens,
}

impl Backward<Flex, 3> for GatedResidualBackward {
    type State = GatedResidualState;

    fn backward(
        self,
        ops: Ops<GatedResidualState, 3>,
        grads: &mut Gradients,
        _: &mut Checkpointer,
    ) {
        let [px, pr, pgate] = ops.parents;
        let st = ops.state;
        let sh = st.tokens;
        let g = contiguous(grads.consume::<Flex>(&ops.node));
        let mut dr = pr
            .as_ref()
            .map(|_| vec![0f32; sh.batch * sh.tokens * sh.dim]);
        let mut dgate = pgate.as_ref().map(|_| vec![0f32; sh.batch * sh.dim]);
        if dr.is_some() || dgate.is_some() {
            let r = st.r.as_ref().map(slice);
            // Without the gate's gradient `r` is not kept and not read: any buffer of its
            // length stands in.
            let r = r.unwrap_or(slice(&g));
            modulation::gated_residual_backward(
                sh,
                r,
                slice(&st.gate),
                slice(&g),
                dr.as_deref_mut(),
                dgate.as_deref_mut(),
            );
        }
        if let (Some(node), Some(dr)) = (pr, dr) {
            grads.register::<Flex>(node.id, from_vec(dr, &[sh.batch, sh.tokens, sh.dim]));
        }
        if let (Some(node), Some(dg)) = (pgate, dgate) {
            grads.register::<Flex>(node.id, from_vec(dg, &[sh.batch, 1, sh.dim]));
        }
        if let Some(node) = px {
            grads.register::<Flex>(node.id, g);
        }
    }
}

pub(crate) fn gated_residual_autodiff(
    x: AutodiffFlexTensor,
    r: AutodiffFlexTensor,
    gate: AutodiffFlexTensor,
) -> AutodiffFlexTensor {
    let gate_tracked = !gate.node.requirement.is_none();
    match GatedResidualBackward
        .prepare::<NoCheckpointing>([x.node.clone(), r.node.clone(), gate.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let [x, r, gate] = [x.primitive, r.primitive, gate.primitive].map(contiguous);
            let tokens = tokens_of(&x);
            let state = GatedResidualState {
                r: gate_tracked.then(|| r.clone()),
                gate: gate.clone(),
                tokens,
            };
            prep.finish(state, gated_residual(x, r, gate))
        }
        OpsKind::UnTracked(prep) => {
            prep.finish(gated_residual(x.primitive, r.primitive, gate.primitive))
        }
    }
}

/// [`modulation::rms_norm`] of contiguous tensors: the output and the rows' rstds.
fn rms_norm_parts(x: &FlexTensor, w: &FlexTensor, eps: f32) -> (FlexTensor, Vec<f32>) {
    let dims = x.layout().shape().to_vec();
    let xs = slice(x);
    let mut y = vec![0f32; xs.len()];
    let mut rstd = vec![0f32; xs.len() / dims[dims.len() - 1].max(1)];
    modulation::rms_norm(xs, slice(w), eps, &mut y, &mut rstd);
    (from_vec(y, &dims), rstd)
}

pub(crate) fn rms_norm(x: FlexTensor, w: FlexTensor, eps: f32) -> FlexTensor {
    let [x, w] = [x, w].map(contiguous);
    rms_norm_parts(&x, &w, eps).0
}

#[derive(Debug)]
struct RmsNormBackward;

#[derive(Clone, Debug)]
struct RmsNormState {
    x: FlexTensor,
    w: FlexTensor,
    rstd: Vec<f32>,
}

impl Backward<Flex, 2> for RmsNormBackward {
    type State = RmsNormState;

    fn backward(self, ops: Ops<RmsNormState, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [px, pw] = ops.parents;
        let st = ops.state;
        let g = contiguous(grads.consume::<Flex>(&ops.node));
        let xs = slice(&st.x);
        let dim = st.w.layout().shape()[0];
        let mut dx = px.as_ref().map(|_| vec![0f32; xs.len()]);
        let mut dw = pw.as_ref().map(|_| vec![0f32; dim]);
        modulation::rms_norm_backward(
            xs,
            slice(&st.w),
            &st.rstd,
            slice(&g),
            dx.as_deref_mut(),
            dw.as_deref_mut(),
        );
        if let (Some(node), Some(dx)) = (px, dx) {
            grads.register::<Flex>(node.id, from_vec(dx, st.x.layout().shape()));
        }
        if let (Some(node), Some(dw)) = (pw, dw) {
            grads.register::<Flex>(node.id, from_vec(dw, &[dim]));
        }
    }
}

pub(crate) fn rms_norm_autodiff(
    x: AutodiffFlexTensor,
    w: AutodiffFlexTensor,
    eps: f32,
) -> AutodiffFlexTensor {
    match RmsNormBackward
        .prepare::<NoCheckpointing>([x.node.clone(), w.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let [x, w] = [x.primitive, w.primitive].map(contiguous);
            let (y, rstd) = rms_norm_parts(&x, &w, eps);
            prep.finish(RmsNormState { x, w, rstd }, y)
        }
        OpsKind::UnTracked(prep) => prep.finish(rms_norm(x.primitive, w.primitive, eps)),
    }
}

/// The shape of a linear layer on `x: [..., rows, d_in]`.
fn linear_dims(x: &FlexTensor, w: &FlexTensor, rank: usize) -> dense::Dims {
    let xs = x.layout().shape();
    let ws = w.layout().shape();
    let n = xs.num_dims();
    let d_in = xs[n - 1];
    // burn's batched product: one matrix per index of the axes before the last two
    let rows = if n >= 2 { xs[n - 2] } else { 1 };
    dense::Dims {
        batch: xs.num_elements() / (rows * d_in).max(1),
        rows,
        d_in,
        d_out: ws[1],
        rank,
    }
}

/// An adapter's tensors and scale.
pub(crate) type LoraParts<T> = (T, T, f32);

/// [`dense::forward`] of contiguous tensors: the output and, with an adapter, `x A`.
fn linear_parts(
    x: &FlexTensor,
    w: &FlexTensor,
    bias: Option<&FlexTensor>,
    lora: Option<&LoraParts<FlexTensor>>,
) -> (FlexTensor, Option<Vec<f32>>) {
    let rank = lora.map_or(0, |(a, _, _)| a.layout().shape()[1]);
    let dims = linear_dims(x, w, rank);
    let mut xa = lora.map(|_| vec![0f32; dims.batch * dims.rows * rank]);
    let out = dense::forward(
        dims,
        slice(x),
        slice(w),
        bias.map(slice),
        lora.zip(xa.as_deref_mut()).map(|((a, b, scale), xa)| {
            (
                dense::Lora {
                    a: slice(a),
                    b: slice(b),
                    scale: *scale,
                },
                xa,
            )
        }),
    );
    let mut shape = x.layout().shape().to_vec();
    *shape.last_mut().expect("x has an axis") = dims.d_out;
    (from_vec(out, &shape), xa)
}

pub(crate) fn linear(
    x: FlexTensor,
    w: FlexTensor,
    bias: Option<FlexTensor>,
    lora: Option<LoraParts<FlexTensor>>,
) -> FlexTensor {
    let [x, w] = [x, w].map(contiguous);
    let bias = bias.map(contiguous);
    let lora = lora.map(|(a, b, s)| (contiguous(a), contiguous(b), s));
    linear_parts(&x, &w, bias.as_ref(), lora.as_ref()).0
}

#[derive(Debug)]
struct LinearBackward;

#[derive(Clone, Debug)]
struct LinearState {
    x: FlexTensor,
    w: FlexTensor,
    has_bias: bool,
    lora: Option<LoraParts<FlexTensor>>,
    xa: Option<Vec<f32>>,
}

impl Backward<Flex, 5> for LinearBackward {
    type State = LinearState;

    /// Parents `[x, weight, bias, A, B]`; an absent bias or adapter holds `x`'s node in its
    /// place and gets no gradient.
    fn backward(self, ops: Ops<LinearState, 5>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [px, pw, pbias, pa, pb] = ops.parents;
        let st = ops.state;
        let g = contiguous(grads.consume::<Flex>(&ops.node));
        let rank = st
            .lora
            .as_ref()
            .map_or(0, |(a, _, _)| a.layout().shape()[1]);
        let dims = linear_dims(&st.x, &st.w, rank);
        let has_lora = st.lora.is_some();
        let want = dense::Want {
            x: px.is_some(),
            w: pw.is_some(),
            bias: st.has_bias && pbias.is_some(),
            a: has_lora && pa.is_some(),
            b: has_lora && pb.is_some(),
        };
        let lora = st
            .lora
            .as_ref()
            .zip(st.xa.as_deref())
            .map(|((a, b, s), xa)| {
                (
                    dense::Lora {
                        a: slice(a),
                        b: slice(b),
                        scale: *s,
                    },
                    xa,
                )
            });
        let got = dense::backward(dims, slice(&st.x), slice(&st.w), lora, slice(&g), want);
        let shape = |t: &FlexTensor| t.layout().shape().to_vec();
        let parts = [
            (px, got.x, shape(&st.x)),
            (pw, got.w, shape(&st.w)),
            (pbias, got.bias, vec![dims.d_out]),
            (pa, got.a, vec![dims.d_in, rank]),
            (pb, got.b, vec![rank, dims.d_out]),
        ];
        for (node, grad, dims) in parts {
            if let (Some(node), Some(grad)) = (node, grad) {
                grads.register::<Flex>(node.id, from_vec(grad, &dims));
            }
        }
    }
}

pub(crate) fn linear_autodiff(
    x: AutodiffFlexTensor,
    w: AutodiffFlexTensor,
    bias: Option<AutodiffFlexTensor>,
    lora: Option<LoraParts<AutodiffFlexTensor>>,
) -> AutodiffFlexTensor {
    let node = |t: Option<&AutodiffFlexTensor>| t.unwrap_or(&x).node.clone();
    let parents = [
        x.node.clone(),
        w.node.clone(),
        node(bias.as_ref()),
        node(lora.as_ref().map(|l| &l.0)),
        node(lora.as_ref().map(|l| &l.1)),
    ];
    match LinearBackward
        .prepare::<NoCheckpointing>(parents)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let [x, w] = [x.primitive, w.primitive].map(contiguous);
            let bias = bias.map(|b| contiguous(b.primitive));
            let lora = lora.map(|(a, b, s)| (contiguous(a.primitive), contiguous(b.primitive), s));
            let (y, xa) = linear_parts(&x, &w, bias.as_ref(), lora.as_ref());
            let state = LinearState {
                x,
                w,
                has_bias: bias.is_some(),
                lora,
                xa,
            };
            prep.finish(state, y)
        }
        OpsKind::UnTracked(prep) => prep.finish(linear(
            x.primitive,
            w.primitive,
            bias.map(|b| b.primitive),
            lora.map(|(a, b, s)| (a.primitive, b.primitive, s)),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counting(dims: &[usize]) -> FlexTensor {
        let n: usize = dims.iter().product();
        from_vec((0..n).map(|i| i as f32 * 0.5 - 3.0).collect(), dims)
    }

    fn bits(t: &FlexTensor) -> (Vec<usize>, Vec<u32>) {
        let c = t.to_contiguous();
        let v = c.as_slice::<f32>().expect("contiguous").to_vec();
        (
            c.layout().shape().to_vec(),
            v.into_iter().map(f32::to_bits).collect(),
        )
    }

    #[test]
    fn a_row_wise_copy_gives_burns_contiguous_tensor() {
        let views = [
            // attention's gradient: [b, h, s, d] over [b, s, h, d] memory
            counting(&[2, 5, 3, 16]).transpose(1, 2),
            counting(&[3, 4, 2, 8]).permute(&[2, 0, 1, 3]),
            counting(&[4, 6, 9, 12]).narrow(2, 3, 5).transpose(0, 1),
            counting(&[7, 5, 10]).transpose(0, 1),
            counting(&[6, 20]).narrow(1, 4, 9),
            // short rows and a transposed last axis: burn-flex's copy
            counting(&[2, 3, 4]).transpose(0, 1),
            counting(&[5, 9, 12]).transpose(1, 2),
        ];
        for (i, v) in views.into_iter().enumerate() {
            assert!(v.as_slice::<f32>().is_none(), "view {i} is strided");
            assert_eq!(padded_rows(&v).is_some(), i < 5, "view {i}: which copy");
            let want = bits(&v);
            let got = contiguous(v);
            assert!(got.as_slice::<f32>().is_some(), "view {i} made contiguous");
            assert_eq!(bits(&got), want, "view {i}");
        }
    }
}
