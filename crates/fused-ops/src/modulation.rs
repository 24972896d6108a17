//! Row kernels of the transformer's per-token modulation, on plain `f32` slices: the adaptive
//! layer norm `layer_norm(x) (1 + scale) + shift` and the gated residual `x + r gate`, where
//! `x`, `r` are `[batch, tokens, dim]` and `shift`, `scale`, `gate` one `[dim]` row per batch
//! row. Each is one pass over the activations forward and one backward (the composition is
//! a dozen passes and, on the CPU backend, a broadcast walked element by element).
//!
//! Batch rows run on rayon's pool when the tensor is large; every row is computed by one
//! thread in a fixed order, so results do not depend on the number of threads.

use rayon::prelude::*;

use crate::kernels::simd_dispatch;

/// `[batch, tokens, dim]` activations with one `[dim]` modulation row per batch row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tokens {
    pub(crate) batch: usize,
    pub(crate) tokens: usize,
    pub(crate) dim: usize,
}

impl Tokens {
    fn len(&self) -> usize {
        self.batch * self.tokens * self.dim
    }

    fn check(&self, name: &str, buf: &[f32], want: usize) {
        assert_eq!(
            buf.len(),
            want,
            "modulation: {name} has {} elements, expected {want} for {self:?}",
            buf.len()
        );
    }
}

/// An optional output block: `None` where that gradient is not wanted.
type Grad<'a> = Option<&'a mut [f32]>;

/// A batch row's outputs of [`layer_norm_modulated`]: `y`, the means, the rstds.
type LnModRow<'a> = (&'a mut [f32], (&'a mut [f32], &'a mut [f32]));

/// Work at or above this many elements splits its batch rows over rayon's pool.
const PARALLEL_MIN: usize = 1 << 18;

/// Sums of 8 lanes, in a fixed order.
#[inline(always)]
fn lanes_sum(l: [f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]))
}

/// `sum over c of f(c)` in 8 lanes.
#[inline(always)]
fn sum8(n: usize, f: impl Fn(usize) -> f32) -> f32 {
    let mut acc = [0f32; 8];
    let full = n / 8 * 8;
    let mut c = 0;
    while c < full {
        for (l, a) in acc.iter_mut().enumerate() {
            *a += f(c + l);
        }
        c += 8;
    }
    for (l, c) in (full..n).enumerate() {
        acc[l] += f(c);
    }
    lanes_sum(acc)
}

/// The mean and `1 / sqrt(var + eps)` of a row (biased variance of the centred row).
#[inline(always)]
fn moments(x: &[f32], eps: f32) -> (f32, f32) {
    let n = x.len() as f32;
    let mean = sum8(x.len(), |c| x[c]) / n;
    let var = sum8(x.len(), |c| {
        let d = x[c] - mean;
        d * d
    }) / n;
    (mean, 1.0 / (var + eps).sqrt())
}

simd_dispatch!(
    /// One batch row of [`layer_norm_modulated`]: `tokens` rows of `x` and `y`, one row of
    /// `shift` and `scale`.
    ln_mod_batch, ln_mod_batch_avx2, ln_mod_batch_avx512,
    (x: &[f32], shift: &[f32], scale: &[f32], eps: f32, y: &mut [f32], mean: &mut [f32], rstd: &mut [f32]),
    {
        let dim = shift.len();
        for (((x, y), m), r) in x
            .chunks_exact(dim)
            .zip(y.chunks_exact_mut(dim))
            .zip(mean.iter_mut())
            .zip(rstd.iter_mut())
        {
            let (mu, rs) = moments(x, eps);
            (*m, *r) = (mu, rs);
            for (((y, x), sh), sc) in y.iter_mut().zip(x).zip(shift).zip(scale) {
                *y = (x - mu) * rs * (1.0 + sc) + sh;
            }
        }
    }
);

/// `y = (x - mean) rstd (1 + scale) + shift` per token row, keeping each row's mean and
/// `rstd = 1 / sqrt(var + eps)` for the backward.
#[allow(clippy::too_many_arguments)]
pub(crate) fn layer_norm_modulated(
    sh: Tokens,
    x: &[f32],
    shift: &[f32],
    scale: &[f32],
    eps: f32,
    y: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
) {
    let Tokens { batch, tokens, dim } = sh;
    sh.check("x", x, sh.len());
    sh.check("y", y, sh.len());
    sh.check("shift", shift, batch * dim);
    sh.check("scale", scale, batch * dim);
    sh.check("the means", mean, batch * tokens);
    sh.check("the rstds", rstd, batch * tokens);
    if sh.len() == 0 {
        return;
    }
    let rows: Vec<_> = y
        .chunks_mut(tokens * dim)
        .zip(mean.chunks_mut(tokens).zip(rstd.chunks_mut(tokens)))
        .enumerate()
        .collect();
    let one = |(b, (y, (m, r))): (usize, LnModRow<'_>)| {
        let row = b * dim..(b + 1) * dim;
        ln_mod_batch(
            &x[b * tokens * dim..(b + 1) * tokens * dim],
            &shift[row.clone()],
            &scale[row],
            eps,
            y,
            m,
            r,
        )
    };
    if sh.len() >= PARALLEL_MIN && batch > 1 {
        rows.into_par_iter().for_each(one);
    } else {
        rows.into_iter().for_each(one);
    }
}

/// An optional output split into `batch` blocks of `n`: `batch` `None`s when absent.
fn split(o: Option<&mut [f32]>, n: usize, batch: usize) -> Vec<Option<&mut [f32]>> {
    match o {
        Some(o) => o.chunks_mut(n).map(Some).collect(),
        None => (0..batch).map(|_| None).collect(),
    }
}

/// What the backward of [`layer_norm_modulated`] writes: `[batch, tokens, dim]` for `x`, one
/// `[dim]` row per batch row for `shift` and `scale`; `None` where no gradient is wanted.
pub(crate) struct LnModGrads<'a> {
    pub(crate) dx: Option<&'a mut [f32]>,
    pub(crate) dshift: Option<&'a mut [f32]>,
    pub(crate) dscale: Option<&'a mut [f32]>,
}

simd_dispatch!(
    /// One batch row of [`layer_norm_modulated_backward`].
    ln_mod_grad_batch, ln_mod_grad_batch_avx2, ln_mod_grad_batch_avx512,
    (x: &[f32], scale: &[f32], mean: &[f32], rstd: &[f32], g: &[f32], dx: Option<&mut [f32]>, dshift: Option<&mut [f32]>, dscale: Option<&mut [f32]>),
    {
        let dim = scale.len();
        let n = dim as f32;
        let mut dx = dx;
        let mut dshift = dshift;
        let mut dscale = dscale;
        for (t, (x, g)) in x.chunks_exact(dim).zip(g.chunks_exact(dim)).enumerate() {
            let (mu, rs) = (mean[t], rstd[t]);
            if let Some(ds) = dshift.as_deref_mut() {
                for (d, g) in ds.iter_mut().zip(g) {
                    *d += g;
                }
            }
            if let Some(ds) = dscale.as_deref_mut() {
                for ((d, g), x) in ds.iter_mut().zip(g).zip(x) {
                    *d += g * ((x - mu) * rs);
                }
            }
            if let Some(dx) = dx.as_deref_mut() {
                let dx = &mut dx[t * dim..(t + 1) * dim];
                // dxhat = g (1 + scale); dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat))
                let a = sum8(dim, |c| g[c] * (1.0 + scale[c])) / n;
                let b = sum8(dim, |c| g[c] * (1.0 + scale[c]) * ((x[c] - mu) * rs)) / n;
                for c in 0..dim {
                    let xhat = (x[c] - mu) * rs;
                    dx[c] = rs * (g[c] * (1.0 + scale[c]) - a - xhat * b);
                }
            }
        }
    }
);

/// The gradients of [`layer_norm_modulated`] for the output gradient `g`, from its input, its
/// `scale` and the kept means and rstds. The `shift` and `scale` gradients are sums over a
/// batch row's tokens, in token order.
#[allow(clippy::too_many_arguments)]
pub(crate) fn layer_norm_modulated_backward(
    sh: Tokens,
    x: &[f32],
    scale: &[f32],
    mean: &[f32],
    rstd: &[f32],
    g: &[f32],
    out: LnModGrads,
) {
    let Tokens { batch, tokens, dim } = sh;
    sh.check("x", x, sh.len());
    sh.check("the output gradient", g, sh.len());
    sh.check("scale", scale, batch * dim);
    if sh.len() == 0 {
        return;
    }
    let LnModGrads { dx, dshift, dscale } = out;
    let rows: Vec<_> = split(dx, tokens * dim, batch)
        .into_iter()
        .zip(
            split(dshift, dim, batch)
                .into_iter()
                .zip(split(dscale, dim, batch)),
        )
        .enumerate()
        .collect();
    let one = |(b, (dx, (dshift, dscale))): (usize, (Grad<'_>, (Grad<'_>, Grad<'_>)))| {
        let (act, tok) = (
            b * tokens * dim..(b + 1) * tokens * dim,
            b * tokens..(b + 1) * tokens,
        );
        ln_mod_grad_batch(
            &x[act.clone()],
            &scale[b * dim..(b + 1) * dim],
            &mean[tok.clone()],
            &rstd[tok],
            &g[act],
            dx,
            dshift,
            dscale,
        )
    };
    if sh.len() >= PARALLEL_MIN && batch > 1 {
        rows.into_par_iter().for_each(one);
    } else {
        rows.into_iter().for_each(one);
    }
}

simd_dispatch!(
    /// One batch row of [`gated_residual`].
    gated_batch, gated_batch_avx2, gated_batch_avx512,
    (x: &[f32], r: &[f32], gate: &[f32], y: &mut [f32]),
    {
        let dim = gate.len();
        for ((y, x), r) in y.chunks_exact_mut(dim).zip(x.chunks_exact(dim)).zip(r.chunks_exact(dim)) {
            for (((y, x), r), g) in y.iter_mut().zip(x).zip(r).zip(gate) {
                *y = x + r * g;
            }
        }
    }
);

/// `y = x + r gate` with one `gate` row per batch row.
pub(crate) fn gated_residual(sh: Tokens, x: &[f32], r: &[f32], gate: &[f32], y: &mut [f32]) {
    let Tokens { batch, tokens, dim } = sh;
    sh.check("x", x, sh.len());
    sh.check("r", r, sh.len());
    sh.check("y", y, sh.len());
    sh.check("the gate", gate, batch * dim);
    if sh.len() == 0 {
        return;
    }
    let n = tokens * dim;
    let one = |(b, y): (usize, &mut [f32])| {
        gated_batch(
            &x[b * n..(b + 1) * n],
            &r[b * n..(b + 1) * n],
            &gate[b * dim..(b + 1) * dim],
            y,
        )
    };
    if sh.len() >= PARALLEL_MIN && batch > 1 {
        y.par_chunks_mut(n).enumerate().for_each(one);
    } else {
        y.chunks_mut(n).enumerate().for_each(one);
    }
}

simd_dispatch!(
    /// One batch row of [`gated_residual_backward`].
    gated_grad_batch, gated_grad_batch_avx2, gated_grad_batch_avx512,
    (r: &[f32], gate: &[f32], g: &[f32], dr: Option<&mut [f32]>, dgate: Option<&mut [f32]>),
    {
        let dim = gate.len();
        let mut dr = dr;
        let mut dgate = dgate;
        for (t, (r, g)) in r.chunks_exact(dim).zip(g.chunks_exact(dim)).enumerate() {
            if let Some(dr) = dr.as_deref_mut() {
                for ((d, g), w) in dr[t * dim..(t + 1) * dim].iter_mut().zip(g).zip(gate) {
                    *d = g * w;
                }
            }
            if let Some(dg) = dgate.as_deref_mut() {
                for ((d, g), r) in dg.iter_mut().zip(g).zip(r) {
                    *d += g * r;
                }
            }
        }
    }
);

/// The gradients of [`gated_residual`] for `r` (`g gate`) and the gate (the sum over a batch
/// row's tokens of `g r`, in token order); `x`'s is `g` itself.
pub(crate) fn gated_residual_backward(
    sh: Tokens,
    r: &[f32],
    gate: &[f32],
    g: &[f32],
    dr: Option<&mut [f32]>,
    dgate: Option<&mut [f32]>,
) {
    let Tokens { batch, tokens, dim } = sh;
    sh.check("r", r, sh.len());
    sh.check("the output gradient", g, sh.len());
    sh.check("the gate", gate, batch * dim);
    if sh.len() == 0 {
        return;
    }
    let n = tokens * dim;
    let rows: Vec<_> = split(dr, n, batch)
        .into_iter()
        .zip(split(dgate, dim, batch))
        .enumerate()
        .collect();
    let one = |(b, (dr, dg)): (usize, (Grad<'_>, Grad<'_>))| {
        gated_grad_batch(
            &r[b * n..(b + 1) * n],
            &gate[b * dim..(b + 1) * dim],
            &g[b * n..(b + 1) * n],
            dr,
            dg,
        )
    };
    if sh.len() >= PARALLEL_MIN && batch > 1 {
        rows.into_par_iter().for_each(one);
    } else {
        rows.into_iter().for_each(one);
    }
}

simd_dispatch!(
    /// Rows of [`rms_norm`].
    rms_rows, rms_rows_avx2, rms_rows_avx512,
    (x: &[f32], w: &[f32], eps: f32, y: &mut [f32], rstd: &mut [f32]),
    {
        let dim = w.len();
        let n = dim as f32;
        for ((x, y), r) in x.chunks_exact(dim).zip(y.chunks_exact_mut(dim)).zip(rstd.iter_mut()) {
            let rs = 1.0 / (sum8(dim, |c| x[c] * x[c]) / n + eps).sqrt();
            *r = rs;
            for ((y, x), w) in y.iter_mut().zip(x).zip(w) {
                *y = x * rs * w;
            }
        }
    }
);

/// Rows per task when the row kernels split over rayon's pool.
const ROWS_PER_TASK: usize = 256;

/// `y = x rstd w` per row of `dim` (RMS norm with a learned weight), keeping each row's
/// `rstd = 1 / sqrt(mean(x^2) + eps)`.
pub(crate) fn rms_norm(x: &[f32], w: &[f32], eps: f32, y: &mut [f32], rstd: &mut [f32]) {
    let dim = w.len();
    assert!(dim > 0, "rms_norm: an empty row");
    assert_eq!(
        x.len() % dim,
        0,
        "rms_norm: {} elements in rows of {dim}",
        x.len()
    );
    assert_eq!(y.len(), x.len());
    assert_eq!(rstd.len(), x.len() / dim);
    let block = ROWS_PER_TASK * dim;
    let one = |(i, (y, r)): (usize, (&mut [f32], &mut [f32]))| {
        rms_rows(&x[i * block..i * block + y.len()], w, eps, y, r)
    };
    if x.len() >= PARALLEL_MIN {
        y.par_chunks_mut(block)
            .zip(rstd.par_chunks_mut(ROWS_PER_TASK))
            .enumerate()
            .for_each(one);
    } else {
        y.chunks_mut(block)
            .zip(rstd.chunks_mut(ROWS_PER_TASK))
            .enumerate()
            .for_each(one);
    }
}

simd_dispatch!(
    /// Rows of [`rms_norm_backward`]: `dx` for each row, and the row terms of `dw` added into
    /// `dw` (one partial sum per block of rows).
    rms_grad_rows, rms_grad_rows_avx2, rms_grad_rows_avx512,
    (x: &[f32], w: &[f32], rstd: &[f32], g: &[f32], dx: Option<&mut [f32]>, dw: Option<&mut [f64]>),
    {
        let dim = w.len();
        let n = dim as f32;
        let mut dx = dx;
        let mut dw = dw;
        for (i, ((x, g), rs)) in x.chunks_exact(dim).zip(g.chunks_exact(dim)).zip(rstd).enumerate() {
            let rs = *rs;
            if let Some(dw) = dw.as_deref_mut() {
                for ((d, g), x) in dw.iter_mut().zip(g).zip(x) {
                    *d += (g * (x * rs)) as f64;
                }
            }
            if let Some(dx) = dx.as_deref_mut() {
                // dx = rstd (g w - x rstd^2 mean(g w x))
                let m = sum8(dim, |c| g[c] * w[c] * x[c]) / n;
                let k = rs * rs * m;
                for (c, d) in dx[i * dim..(i + 1) * dim].iter_mut().enumerate() {
                    *d = rs * (g[c] * w[c] - x[c] * k);
                }
            }
        }
    }
);

/// The gradients of [`rms_norm`] for the output gradient `g`: `dx` (per row) and `dw` (the
/// sum over rows in `f64`, as partial sums of [`ROWS_PER_TASK`] rows added in order, rounded
/// once), as wanted.
pub(crate) fn rms_norm_backward(
    x: &[f32],
    w: &[f32],
    rstd: &[f32],
    g: &[f32],
    dx: Option<&mut [f32]>,
    dw: Option<&mut [f32]>,
) {
    let dim = w.len();
    assert_eq!(g.len(), x.len());
    let rows = x.len() / dim;
    let blocks = rows.div_ceil(ROWS_PER_TASK);
    let block = ROWS_PER_TASK * dim;
    let want_dw = dw.is_some();
    let dxs = split(dx, block, blocks);
    let run = |(i, dx): (usize, Option<&mut [f32]>)| -> Option<Vec<f64>> {
        let end = (x.len()).min((i + 1) * block);
        let r = i * ROWS_PER_TASK..(end / dim);
        let mut part = want_dw.then(|| vec![0f64; dim]);
        rms_grad_rows(
            &x[i * block..end],
            w,
            &rstd[r],
            &g[i * block..end],
            dx,
            part.as_deref_mut(),
        );
        part
    };
    let parts: Vec<Option<Vec<f64>>> = if x.len() >= PARALLEL_MIN {
        dxs.into_par_iter().enumerate().map(run).collect()
    } else {
        dxs.into_iter().enumerate().map(run).collect()
    };
    if let Some(dw) = dw {
        let mut sum = vec![0f64; dim];
        for p in parts.into_iter().flatten() {
            for (s, p) in sum.iter_mut().zip(p) {
                *s += p;
            }
        }
        for (d, s) in dw.iter_mut().zip(sum) {
            *d = s as f32;
        }
    }
}
