//! The Flex and `Autodiff<Flex>` sides of the sampler's step kernels ([`crate::step`]).

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::{Flex, FlexTensor};
use burn::tensor::backend::AutodiffBackend;

use crate::dispatch::AutodiffFlexTensor;
use crate::flex::{contiguous, from_vec, slice};
use crate::step::{self, Rows};

fn rows_of(t: &FlexTensor) -> (Rows, Vec<usize>) {
    let dims = t.layout().shape().to_vec();
    let batch = dims.first().copied().unwrap_or(1);
    let n = dims.iter().skip(1).product();
    (Rows { batch, n }, dims)
}

/// Per-row coefficients of a step: `None` for "1 on every row".
pub(crate) type RowScale = Option<Vec<f32>>;

pub(crate) fn combine(x: FlexTensor, a: Option<&[f32]>, v: FlexTensor, c: &[f32]) -> FlexTensor {
    let [x, v] = [x, v].map(contiguous);
    let (sh, dims) = rows_of(&x);
    let out = step::filled(sh.batch * sh.n, |o| {
        step::combine(sh, slice(&x), a, slice(&v), c, o)
    });
    from_vec(out, &dims)
}

#[derive(Debug)]
struct CombineBackward;

#[derive(Clone, Debug)]
struct CombineState {
    a: RowScale,
    c: Vec<f32>,
}

/// `g` scaled by one value per row.
fn scale_rows(g: &FlexTensor, s: &[f32]) -> FlexTensor {
    let (sh, dims) = rows_of(g);
    let out = step::filled(sh.batch * sh.n, |o| step::scale(sh, slice(g), s, o));
    from_vec(out, &dims)
}

impl Backward<Flex, 2> for CombineBackward {
    type State = CombineState;

    fn backward(self, ops: Ops<CombineState, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [px, pv] = ops.parents;
        let st = ops.state;
        let g = contiguous(grads.consume::<Flex>(&ops.node));
        if let Some(node) = pv {
            grads.register::<Flex>(node.id, scale_rows(&g, &st.c));
        }
        if let Some(node) = px {
            let gx = match &st.a {
                Some(a) => scale_rows(&g, a),
                None => g,
            };
            grads.register::<Flex>(node.id, gx);
        }
    }
}

pub(crate) fn combine_autodiff(
    x: AutodiffFlexTensor,
    a: RowScale,
    v: AutodiffFlexTensor,
    c: Vec<f32>,
) -> AutodiffFlexTensor {
    match CombineBackward
        .prepare::<NoCheckpointing>([x.node.clone(), v.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let out = combine(x.primitive, a.as_deref(), v.primitive, &c);
            prep.finish(CombineState { a, c }, out)
        }
        OpsKind::UnTracked(prep) => {
            prep.finish(combine(x.primitive, a.as_deref(), v.primitive, &c))
        }
    }
}

/// `[batch, ...]` -> `[batch]`: the mean of `(p - m)^2` over each sample's elements.
pub(crate) fn mean_square_residual(p: FlexTensor, m: FlexTensor) -> FlexTensor {
    let [p, m] = [p, m].map(contiguous);
    let (sh, _) = rows_of(&p);
    let mut out = vec![0f32; sh.batch];
    step::mean_square_residual(sh, slice(&p), slice(&m), &mut out);
    from_vec(out, &[sh.batch])
}

#[derive(Debug)]
struct MeanSquareResidualBackward;

impl Backward<Flex, 2> for MeanSquareResidualBackward {
    /// `p` and `m`, contiguous.
    type State = (FlexTensor, FlexTensor);

    fn backward(
        self,
        ops: Ops<(FlexTensor, FlexTensor), 2>,
        grads: &mut Gradients,
        _: &mut Checkpointer,
    ) {
        let [pp, pm] = ops.parents;
        let (p, m) = ops.state;
        let (sh, dims) = rows_of(&p);
        let g = contiguous(grads.consume::<Flex>(&ops.node));
        // d/dp mean((p - m)^2) = 2 (p - m) / n, and the negation for m
        let s: Vec<f32> = slice(&g)
            .iter()
            .map(|g| (2.0 * f64::from(*g) / sh.n as f64) as f32)
            .collect();
        let diff = |a: &FlexTensor, b: &FlexTensor| {
            let out = step::filled(sh.batch * sh.n, |o| {
                step::scaled_difference(sh, slice(a), slice(b), &s, o)
            });
            from_vec(out, &dims)
        };
        if let Some(node) = pm {
            grads.register::<Flex>(node.id, diff(&m, &p));
        }
        if let Some(node) = pp {
            grads.register::<Flex>(node.id, diff(&p, &m));
        }
    }
}

pub(crate) fn mean_square_residual_autodiff(
    p: AutodiffFlexTensor,
    m: AutodiffFlexTensor,
) -> AutodiffFlexTensor {
    match MeanSquareResidualBackward
        .prepare::<NoCheckpointing>([p.node.clone(), m.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let [p, m] = [p.primitive, m.primitive].map(contiguous);
            let out = mean_square_residual(p.clone(), m.clone());
            prep.finish((p, m), out)
        }
        OpsKind::UnTracked(prep) => prep.finish(mean_square_residual(p.primitive, m.primitive)),
    }
}

pub(crate) fn round_bf16(t: FlexTensor) -> FlexTensor {
    let t = contiguous(t);
    let dims = t.layout().shape().to_vec();
    let out = step::filled(slice(&t).len(), |o| step::round_bf16(slice(&t), o));
    from_vec(out, &dims)
}

/// The rounded values as a fresh tensor with no autodiff history (a stored sample is never
/// differentiated).
pub(crate) fn round_bf16_autodiff(t: AutodiffFlexTensor) -> AutodiffFlexTensor {
    Autodiff::<Flex>::from_inner(round_bf16(t.primitive))
}

/// The next sample of [`gaussian_step`]: drawn with this noise and per-sample std, or stored.
pub(crate) enum NextSample<'a> {
    Draw(FlexTensor, &'a [f32]),
    Stored(FlexTensor),
}

/// One Gaussian step in one pass: the mean, the next sample (rounded to bfloat16 when
/// `round`) and each sample's mean squared residual.
pub(crate) fn gaussian_step(
    x: FlexTensor,
    a: Option<&[f32]>,
    v: FlexTensor,
    c: &[f32],
    next: NextSample<'_>,
    round: bool,
) -> (FlexTensor, FlexTensor, FlexTensor) {
    let [x, v] = [x, v].map(contiguous);
    let (sh, dims) = rows_of(&x);
    let len = sh.batch * sh.n;
    let (source, std) = match next {
        NextSample::Draw(noise, std) => (contiguous(noise), Some(std)),
        NextSample::Stored(p) => (contiguous(p), None),
    };
    let next = match std {
        Some(std) => step::Next::Draw {
            noise: slice(&source),
            std,
        },
        None => step::Next::Stored(slice(&source)),
    };
    let mut mean_sq = vec![0f32; sh.batch];
    let mut next_out = Vec::new();
    let mean = step::filled(len, |mean| {
        next_out = step::filled(len, |nx| {
            let out = step::StepOut {
                mean,
                next: nx,
                mean_sq: &mut mean_sq,
            };
            step::gaussian_step(sh, slice(&x), a, slice(&v), c, next, round, out)
        })
    });
    (
        from_vec(mean, &dims),
        from_vec(next_out, &dims),
        from_vec(mean_sq, &[sh.batch]),
    )
}
