//! A linear layer with its bias and an optional LoRA adapter, `y = x W + b + s (x A) B`, as
//! matrix products on `f32` slices and one pass that adds the bias and the scaled adapter term
//! (burn's composition: a bias pass, a scale pass and an add pass; its backward as many again,
//! and the base weight's gradient even when it is frozen). The products never accumulate onto
//! their destination: gemm takes another path for a single row when it does, which would give
//! a row other bits alone than in a batch.
//!
//! The forward and the input's gradient multiply one matrix of `x` at a time (`[tokens,
//! d_in]` of a `[batch, tokens, d_in]` input, as burn's batched product does), so a row's
//! result does not depend on how many others share the call: sampling a batch in chunks
//! gives the bits of one call. The weights' gradients are sums over every row, one product
//! each.

use std::mem::MaybeUninit;

use crate::kernels::transpose;
use crate::sdpa::{matmul, row_major, transposed};
use crate::step::filled;

/// Products of at least this many multiply-adds split over rayon's pool (gemm's own
/// splitting); smaller ones run on the calling thread.
const PARALLEL_MIN: usize = 192 * 192 * 192;

fn parallelism(m: usize, n: usize, k: usize) -> gemm::Parallelism {
    if m.saturating_mul(n).saturating_mul(k) >= PARALLEL_MIN {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    }
}

/// The layer's shape: `batch` matrices of `rows` rows of `d_in` in, of `d_out` out, adapter
/// rank `rank` (0 without an adapter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Dims {
    pub(crate) batch: usize,
    pub(crate) rows: usize,
    pub(crate) d_in: usize,
    pub(crate) d_out: usize,
    pub(crate) rank: usize,
}

/// An adapter: `A: [d_in, rank]`, `B: [rank, d_out]`, the scale `s`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lora<'a> {
    pub(crate) a: &'a [f32],
    pub(crate) b: &'a [f32],
    pub(crate) scale: f32,
}

fn check(name: &str, buf: &[f32], want: usize) {
    assert_eq!(
        buf.len(),
        want,
        "linear: {name} has {} elements, expected {want}",
        buf.len()
    );
}

/// `x W + b + s (x A) B` (`[rows, d_out]`); with an adapter, `xa = x A` (`[rows, rank]`,
/// kept for the backward) is written too.
pub(crate) fn forward(
    dims: Dims,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    lora: Option<(Lora, &mut [f32])>,
) -> Vec<f32> {
    let Dims {
        batch,
        rows,
        d_in,
        d_out,
        rank,
    } = dims;
    let all = batch * rows;
    check("x", x, all * d_in);
    check("the weight", w, d_in * d_out);
    if let Some(b) = bias {
        check("the bias", b, d_out);
    }
    if all == 0 || d_out == 0 {
        return Vec::new();
    }
    let lora = lora.map(|(l, xa)| {
        check("A", l.a, d_in * rank);
        check("B", l.b, rank * d_out);
        check("x A", xa, all * rank);
        (l, xa)
    });
    let adapter = lora.as_ref().map(|(l, _)| *l);
    let one = |(i, (out, extra)): MatrixBlock<'_, AdapterOut<'_>>, par| {
        let x = &x[i * rows * d_in..(i + 1) * rows * d_in];
        // SAFETY (every product): the row-major matrices `[rows, d_in]`, `[d_in, d_out]`,
        // `[rows, d_out]`, `[d_in, rank]`, `[rank, d_out]`, `[rows, rank]` checked above; the
        // destinations overlap no operand.
        unsafe {
            matmul(
                [rows, d_out, d_in],
                out.as_mut_ptr().cast(),
                row_major(d_out),
                false,
                x.as_ptr(),
                row_major(d_in),
                w.as_ptr(),
                row_major(d_out),
                1.0,
                par,
            );
            if let (Some(l), Some((xa, delta))) = (adapter, extra) {
                matmul(
                    [rows, rank, d_in],
                    xa.as_mut_ptr(),
                    row_major(rank),
                    false,
                    x.as_ptr(),
                    row_major(d_in),
                    l.a.as_ptr(),
                    row_major(rank),
                    1.0,
                    par,
                );
                matmul(
                    [rows, d_out, rank],
                    delta.as_mut_ptr().cast(),
                    row_major(d_out),
                    false,
                    xa.as_ptr(),
                    row_major(rank),
                    l.b.as_ptr(),
                    row_major(d_out),
                    1.0,
                    par,
                );
            }
        }
    };
    // Each matrix's products write every element of its blocks of `out` and of the adapter's
    // product `(x A) B` (unscaled): gemm writes all of a destination it does not accumulate
    // onto, zeros for `d_in = 0`.
    let products = |out: &mut [MaybeUninit<f32>], delta: Option<&mut [MaybeUninit<f32>]>| {
        let mut extra: Vec<Option<AdapterOut<'_>>> = match (lora, delta) {
            (Some((_, xa)), Some(delta)) => xa
                .chunks_mut(rows * rank.max(1))
                .zip(delta.chunks_mut(rows * d_out))
                .map(Some)
                .collect(),
            _ => (0..batch).map(|_| None).collect(),
        };
        per_matrix(dims, out, d_out, &mut extra, one);
    };
    let mut delta = None;
    let mut out = filled(all * d_out, |out| match adapter {
        Some(_) => delta = Some(filled(all * d_out, |d| products(out, Some(d)))),
        None => products(out, None),
    });
    let scale = adapter.map_or(0.0, |l| l.scale);
    add_bias_and_delta(&mut out, d_out, bias, delta.as_deref(), scale);
    out
}

crate::kernels::simd_dispatch!(
    /// `out = (out + bias) + scale * delta` per row of `cols`, each term only when present
    /// (burn's order: the bias onto the product, then the scaled adapter term).
    add_bias_and_delta, add_bias_and_delta_avx2, add_bias_and_delta_avx512,
    (out: &mut [f32], cols: usize, bias: Option<&[f32]>, delta: Option<&[f32]>, scale: f32),
    match (bias, delta) {
        (Some(b), Some(d)) => {
            for (o, d) in out.chunks_exact_mut(cols).zip(d.chunks_exact(cols)) {
                for ((o, b), d) in o.iter_mut().zip(b).zip(d) {
                    *o = (*o + b) + d * scale;
                }
            }
        }
        (Some(b), None) => {
            for o in out.chunks_exact_mut(cols) {
                for (o, b) in o.iter_mut().zip(b) {
                    *o += b;
                }
            }
        }
        (None, Some(d)) => {
            for (o, d) in out.iter_mut().zip(d) {
                *o += d * scale;
            }
        }
        (None, None) => {}
    }
);

/// Runs `f((i, (block i of out, block i of extra)), parallelism)` for each of the `batch`
/// matrices: on rayon's pool, one thread per matrix, when there are several and the work is
/// large; in order otherwise, each product split over the pool when it alone is large.
fn per_matrix<'a, E: Send, T: Send>(
    dims: Dims,
    out: &'a mut [E],
    cols: usize,
    extra: &mut Vec<Option<T>>,
    f: impl Fn((usize, (&'a mut [E], Option<T>)), gemm::Parallelism) + Sync + Send,
) {
    use rayon::prelude::*;
    let Dims {
        batch,
        rows,
        d_in,
        d_out,
        ..
    } = dims;
    if rows * cols == 0 {
        return;
    }
    let blocks: Vec<_> = out
        .chunks_mut(rows * cols)
        .zip(extra.drain(..))
        .enumerate()
        .collect();
    let total = (batch * rows).saturating_mul(d_in).saturating_mul(d_out);
    if batch > 1 && total >= PARALLEL_MIN {
        blocks
            .into_par_iter()
            .for_each(|b| f(b, gemm::Parallelism::None));
    } else {
        let par = parallelism(rows, d_out, d_in);
        blocks.into_iter().for_each(|b| f(b, par));
    }
}

/// Matrix `i` of a batch: its block of the destination and what else it writes or reads.
type MatrixBlock<'a, T> = (usize, (&'a mut [MaybeUninit<f32>], Option<T>));

/// One matrix's adapter outputs: `x A` and `(x A) B`.
type AdapterOut<'a> = (&'a mut [f32], &'a mut [MaybeUninit<f32>]);

/// The gradients of [`forward`] that are wanted, each `None` when not.
#[derive(Default)]
pub(crate) struct Grads {
    pub(crate) x: Option<Vec<f32>>,
    pub(crate) w: Option<Vec<f32>>,
    pub(crate) bias: Option<Vec<f32>>,
    pub(crate) a: Option<Vec<f32>>,
    pub(crate) b: Option<Vec<f32>>,
}

/// Which gradients [`backward`] computes.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Want {
    pub(crate) x: bool,
    pub(crate) w: bool,
    pub(crate) bias: bool,
    pub(crate) a: bool,
    pub(crate) b: bool,
}

/// For the output gradient `g: [rows, d_out]`: `dx = g Wᵀ + s (g Bᵀ) Aᵀ`, `dW = xᵀ g`,
/// `db = column sums of g` (in `f64`, rounded once), `dA = s xᵀ (g Bᵀ)`, `dB = s (x A)ᵀ g`.
pub(crate) fn backward(
    dims: Dims,
    x: &[f32],
    w: &[f32],
    lora: Option<(Lora, &[f32])>,
    g: &[f32],
    want: Want,
) -> Grads {
    let Dims {
        batch,
        rows: per,
        d_in,
        d_out,
        rank,
    } = dims;
    // The weights' gradients treat every row alike: one product over all of them.
    let rows = batch * per;
    check("x", x, rows * d_in);
    check("the weight", w, d_in * d_out);
    check("the output gradient", g, rows * d_out);
    let mut out = Grads::default();
    // g Bᵀ, needed by dx and dA
    let gb = match lora {
        Some((l, _)) if want.x || want.a => {
            // SAFETY (every product below): row-major operands of the checked shapes;
            // `transposed` reads a row-major matrix as its transpose; no destination
            // overlaps an operand. Each writes all of its destination.
            Some(filled(rows * rank, |gb| unsafe {
                matmul(
                    [rows, rank, d_out],
                    gb.as_mut_ptr().cast(),
                    row_major(rank),
                    false,
                    g.as_ptr(),
                    row_major(d_out),
                    l.b.as_ptr(),
                    transposed(d_out),
                    1.0,
                    parallelism(rows, rank, d_out),
                );
            }))
        }
        _ => None,
    };
    if want.x {
        // one matrix at a time, as the forward
        let mut gbs: Vec<Option<&[f32]>> = match gb.as_ref() {
            Some(gb) => gb.chunks(per * rank.max(1)).map(Some).collect(),
            None => (0..batch).map(|_| None).collect(),
        };
        let adapter = lora.map(|(l, _)| l);
        // `Wᵀ` and `Aᵀ` written out once for every matrix of the batch: gemm copies a matrix
        // it reads transposed one element at a time, once per product.
        let wt = transpose(w, d_in, d_out);
        let at = adapter.map(|l| (transpose(l.a, d_in, rank), l.scale));
        let one = |(i, (dx, gb)): MatrixBlock<'_, &[f32]>, par| {
            let g = &g[i * per * d_out..(i + 1) * per * d_out];
            // SAFETY: row-major `[per, d_out]`, `[d_out, d_in]`, `[per, d_in]`, `[per, rank]`,
            // `[rank, d_in]`; no overlap.
            unsafe {
                matmul(
                    [per, d_in, d_out],
                    dx.as_mut_ptr().cast(),
                    row_major(d_in),
                    false,
                    g.as_ptr(),
                    row_major(d_out),
                    wt.as_ptr(),
                    row_major(d_in),
                    1.0,
                    par,
                );
                if let (Some((at, scale)), Some(gb)) = (at.as_ref(), gb) {
                    matmul(
                        [per, d_in, rank],
                        dx.as_mut_ptr().cast(),
                        row_major(d_in),
                        true,
                        gb.as_ptr(),
                        row_major(rank),
                        at.as_ptr(),
                        row_major(d_in),
                        *scale,
                        par,
                    );
                }
            }
        };
        // each matrix's first product writes every element of its block (the adapter's
        // accumulates onto what it wrote)
        out.x = Some(filled(rows * d_in, |dx| {
            per_matrix(
                Dims {
                    d_in: d_out,
                    d_out: d_in,
                    ..dims
                },
                dx,
                d_in,
                &mut gbs,
                one,
            )
        }));
    }
    if want.w {
        out.w = Some(filled(d_in * d_out, |dw| unsafe {
            matmul(
                [d_in, d_out, rows],
                dw.as_mut_ptr().cast(),
                row_major(d_out),
                false,
                x.as_ptr(),
                transposed(d_in),
                g.as_ptr(),
                row_major(d_out),
                1.0,
                parallelism(d_in, d_out, rows),
            );
        }));
    }
    if want.bias {
        let mut sum = vec![0f64; d_out];
        for row in g.chunks_exact(d_out) {
            for (s, v) in sum.iter_mut().zip(row) {
                *s += *v as f64;
            }
        }
        out.bias = Some(sum.into_iter().map(|s| s as f32).collect());
    }
    if let Some((l, xa)) = lora {
        if let (true, Some(gb)) = (want.a, gb.as_ref()) {
            out.a = Some(filled(d_in * rank, |da| unsafe {
                matmul(
                    [d_in, rank, rows],
                    da.as_mut_ptr().cast(),
                    row_major(rank),
                    false,
                    x.as_ptr(),
                    transposed(d_in),
                    gb.as_ptr(),
                    row_major(rank),
                    l.scale,
                    parallelism(d_in, rank, rows),
                );
            }));
        }
        if want.b {
            check("x A", xa, rows * rank);
            out.b = Some(filled(rank * d_out, |db| unsafe {
                matmul(
                    [rank, d_out, rows],
                    db.as_mut_ptr().cast(),
                    row_major(d_out),
                    false,
                    xa.as_ptr(),
                    transposed(rank),
                    g.as_ptr(),
                    row_major(d_out),
                    l.scale,
                    parallelism(rank, d_out, rows),
                );
            }));
        }
    }
    out
}
