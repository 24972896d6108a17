//! Scaled dot-product attention on heads-major `f32` buffers, forward and backward, a block of
//! query rows at a time.
//!
//! For each `(batch, head)` and each block of query rows the scores `S = scale · Q Kᵀ` of the
//! block against every key are one matrix product (`gemm`, the crate burn's CPU backend
//! multiplies with) into a buffer sized to stay in cache, the softmax is one vectorised pass
//! per row (the polynomial `exp` of [`crate::kernels`]), and `P V` is a second product. The
//! forward keeps each row's log-sum-exp; the backward recomputes `P` from it and takes five
//! products per block (FlashAttention-2's backward with the whole key range in one tile), so
//! nothing of size `seq_q × seq_kv` outlives a block. Keys are masked by a `[batch, seq_kv]`
//! vector, never by a `[batch, heads, seq_q, seq_kv]` tensor.
//!
//! `(batch, head)` pairs run on rayon's pool; each is computed by one thread in a fixed order,
//! so the results do not depend on the number of threads.

use rayon::prelude::*;

use crate::kernels::{exp, transpose};

/// The shape of one attention call. Buffers are heads-major and contiguous: `q` is
/// `[batch, heads, seq_q, d]`, `k` `[batch, heads, seq_kv, d]`, `v` `[batch, heads, seq_kv,
/// dv]`, the output `[batch, heads, seq_q, dv]`, the log-sum-exp `[batch, heads, seq_q]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) batch: usize,
    pub(crate) heads: usize,
    pub(crate) seq_q: usize,
    pub(crate) seq_kv: usize,
    pub(crate) d: usize,
    pub(crate) dv: usize,
}

impl Shape {
    fn units(&self) -> usize {
        self.batch * self.heads
    }

    /// `1 / sqrt(d)`.
    pub(crate) fn scale(&self) -> f32 {
        (1.0 / (self.d as f64).sqrt()) as f32
    }

    /// Query rows per block: the block's score matrix at about [`BLOCK_SCORES`] elements,
    /// at least 8 rows (6 when the keys are many), at most all of them. Below all of them, a
    /// multiple of 6: the width of gemm's microkernel for the scores' product (31 rows at
    /// 1056 keys ran 3% slower than 30).
    fn block_rows(&self) -> usize {
        let rows = (BLOCK_SCORES / self.seq_kv.max(1)).clamp(8, 256);
        if rows >= self.seq_q {
            self.seq_q
        } else {
            rows / 6 * 6
        }
    }
}

/// Elements of one block's score matrix (128 KiB of `f32`: within a core's L2 cache).
const BLOCK_SCORES: usize = 1 << 15;

/// `dst = beta · lhs · rhs` (`accumulate = false`) or `dst += beta · lhs · rhs`, for matrices
/// given by their first element and their column and row strides (in elements), on the
/// calling thread or split over rayon's pool as `parallelism` says.
///
/// # Safety
/// Every element `m × k` of `lhs`, `k × n` of `rhs` and `m × n` of `dst` addressed by the
/// strides lies in its allocation, and `dst` overlaps neither input.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul(
    [m, n, k]: [usize; 3],
    dst: *mut f32,
    [dst_cs, dst_rs]: [isize; 2],
    accumulate: bool,
    lhs: *const f32,
    [lhs_cs, lhs_rs]: [isize; 2],
    rhs: *const f32,
    [rhs_cs, rhs_rs]: [isize; 2],
    beta: f32,
    parallelism: gemm::Parallelism,
) {
    // SAFETY: the caller's contract.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            dst_cs,
            dst_rs,
            accumulate,
            lhs,
            lhs_cs,
            lhs_rs,
            rhs,
            rhs_cs,
            rhs_rs,
            1.0,
            beta,
            false,
            false,
            false,
            parallelism,
        )
    }
}

/// Row-major `[rows, cols]` strides `[column, row]`.
pub(crate) fn row_major(cols: usize) -> [isize; 2] {
    [1, cols as isize]
}

/// The transpose of a row-major `[rows, cols]` matrix.
pub(crate) fn transposed(cols: usize) -> [isize; 2] {
    [cols as isize, 1]
}

/// Sums of 8 lanes: a float reduction the compiler vectorises (it keeps a plain fold's order).
#[inline(always)]
fn lanes_sum(lanes: [f32; 8]) -> f32 {
    let [a, b, c, d, e, f, g, h] = lanes;
    ((a + e) + (b + f)) + ((c + g) + (d + h))
}

/// The largest element of a row, `-inf` for an empty or all-`-inf` row (a NaN is not carried:
/// the `exp` pass that follows turns a row with a NaN into NaNs).
#[inline(always)]
fn row_max(row: &[f32]) -> f32 {
    let mut max = [f32::NEG_INFINITY; 8];
    let chunks = row.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..8 {
            max[l] = if c[l] > max[l] { c[l] } else { max[l] };
        }
    }
    for (l, x) in rest.iter().enumerate() {
        max[l] = if *x > max[l] { *x } else { max[l] };
    }
    max.into_iter()
        .fold(f32::NEG_INFINITY, |m, x| if x > m { x } else { m })
}

/// The sum of a row in 8 lanes.
#[inline(always)]
fn row_sum(row: &[f32]) -> f32 {
    let mut sum = [0f32; 8];
    let chunks = row.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..8 {
            sum[l] += c[l];
        }
    }
    for (l, x) in rest.iter().enumerate() {
        sum[l] += x;
    }
    lanes_sum(sum)
}

/// `row[j] = exp(row[j] - shift)`, and 0 where `row[j]` is `-inf` (a masked key). Branch-free:
/// `exp` is evaluated everywhere and the masked lanes selected away.
#[inline(always)]
fn exp_shifted(row: &mut [f32], shift: f32) {
    for x in row.iter_mut() {
        let e = exp(*x - shift);
        *x = if *x == f32::NEG_INFINITY { 0.0 } else { e };
    }
}

/// Masked keys (`keep[j] == false`) to `-inf`.
#[inline(always)]
fn mask_row(row: &mut [f32], keep: Option<&[bool]>) {
    if let Some(keep) = keep {
        for (x, k) in row.iter_mut().zip(keep) {
            *x = if *k { *x } else { f32::NEG_INFINITY };
        }
    }
}

/// One row of scores to probabilities in place; returns the row's log-sum-exp.
///
/// Masked keys (`keep[j] == false`) get probability 0. A row whose keys are all masked becomes
/// zeros with a log-sum-exp of `-inf`. A NaN score makes the row NaN.
#[inline(always)]
fn softmax_row(row: &mut [f32], keep: Option<&[bool]>) -> f32 {
    mask_row(row, keep);
    let max = row_max(row);
    if max == f32::NEG_INFINITY {
        row.fill(0.0);
        return f32::NEG_INFINITY;
    }
    exp_shifted(row, max);
    let sum = row_sum(row);
    let inv = 1.0 / sum;
    for x in row.iter_mut() {
        *x *= inv;
    }
    max + sum.ln()
}

/// Scaled scores to probabilities by the forward's log-sum-exp: `p = exp(s - lse)`, 0 for a
/// masked key or a row with no key.
#[inline(always)]
fn probabilities_row(row: &mut [f32], keep: Option<&[bool]>, lse: f32) {
    if lse == f32::NEG_INFINITY {
        row.fill(0.0);
        return;
    }
    mask_row(row, keep);
    exp_shifted(row, lse);
}

/// `dp = p (dp - delta) scale`: the scores' gradient from the probabilities' (`dp`).
#[inline(always)]
fn scores_grad_row(p: &[f32], dp: &mut [f32], delta: f32, scale: f32) {
    for (d, p) in dp.iter_mut().zip(p) {
        *d = p * (*d - delta) * scale;
    }
}

/// `sum over c of a[c] b[c]`.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    for (l, (x, y)) in ra.iter().zip(rb).enumerate() {
        acc[l] += x * y;
    }
    lanes_sum(acc)
}

crate::kernels::simd_dispatch!(
    /// [`softmax_row`] over the rows of a block, log-sum-exps into `lse`.
    softmax_rows, softmax_rows_avx2, softmax_rows_avx512,
    (s: &mut [f32], cols: usize, keep: Option<&[bool]>, lse: &mut [f32]),
    for (row, l) in s.chunks_exact_mut(cols).zip(lse.iter_mut()) {
        *l = softmax_row(row, keep);
    }
);

crate::kernels::simd_dispatch!(
    /// [`probabilities_row`] over the rows of a block.
    probabilities_rows, probabilities_rows_avx2, probabilities_rows_avx512,
    (s: &mut [f32], cols: usize, keep: Option<&[bool]>, lse: &[f32]),
    for (row, l) in s.chunks_exact_mut(cols).zip(lse) {
        probabilities_row(row, keep, *l);
    }
);

crate::kernels::simd_dispatch!(
    /// [`scores_grad_row`] over the rows of a block.
    scores_grad_rows, scores_grad_rows_avx2, scores_grad_rows_avx512,
    (p: &[f32], dp: &mut [f32], cols: usize, delta: &[f32], scale: f32),
    for ((p, dp), delta) in p.chunks_exact(cols).zip(dp.chunks_exact_mut(cols)).zip(delta) {
        scores_grad_row(p, dp, *delta, scale);
    }
);

crate::kernels::simd_dispatch!(
    /// `delta[i] = sum over c of g[i, c] o[i, c]`, rows of `cols`.
    row_dots, row_dots_avx2, row_dots_avx512,
    (g: &[f32], o: &[f32], cols: usize, delta: &mut [f32]),
    for ((g, o), d) in g.chunks_exact(cols).zip(o.chunks_exact(cols)).zip(delta.iter_mut()) {
        *d = dot(g, o);
    }
);

/// The scaled scores `s = scale · q kᵀ` of a block of query rows `q: [m, d]` against every
/// key, given as `kt = kᵀ: [d, seq_kv]` (written out once per head: gemm would copy a
/// transposed `k` one element at a time for every block), into `s: [m, seq_kv]`.
fn block_scores(q: &[f32], kt: &[f32], [m, seq_kv, d]: [usize; 3], scale: f32, s: &mut [f32]) {
    assert!(
        q.len() == m * d && kt.len() == seq_kv * d && s.len() == m * seq_kv,
        "attention: a score block of {} elements for {m} queries and {seq_kv} keys",
        s.len()
    );
    // SAFETY: the lengths were just checked against the shapes the strides address.
    unsafe {
        matmul(
            [m, seq_kv, d],
            s.as_mut_ptr(),
            row_major(seq_kv),
            false,
            q.as_ptr(),
            row_major(d),
            kt.as_ptr(),
            row_major(seq_kv),
            scale,
            gemm::Parallelism::None,
        );
    }
}

fn check_len(name: &str, buf: &[f32], want: usize) {
    assert_eq!(
        buf.len(),
        want,
        "attention: {name} has {} elements, expected {want}",
        buf.len()
    );
}

/// The keys of batch row `b`.
fn keep_of(keep: Option<&[bool]>, b: usize, seq_kv: usize) -> Option<&[bool]> {
    keep.map(|k| &k[b * seq_kv..(b + 1) * seq_kv])
}

/// Runs `f(unit, ...)` for every `(batch, head)` pair on rayon's pool, when there is more
/// than one and the work is worth a split.
fn for_units<T: Send>(sh: &Shape, items: Vec<T>, f: impl Fn(usize, T) + Sync + Send) {
    let work = sh.units() * sh.seq_q * sh.seq_kv * (sh.d + sh.dv);
    if sh.units() > 1 && work >= 1 << 18 {
        items.into_par_iter().enumerate().for_each(|(u, t)| f(u, t));
    } else {
        items.into_iter().enumerate().for_each(|(u, t)| f(u, t));
    }
}

/// `out = softmax(scale · q kᵀ, masked) v` and each query row's log-sum-exp.
///
/// `keep` is `[batch, seq_kv]`, `true` for a key every query of that batch row attends to;
/// `None` keeps every key.
pub(crate) fn forward(
    sh: &Shape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    keep: Option<&[bool]>,
    out: &mut [f32],
    lse: &mut [f32],
) {
    let Shape {
        heads,
        seq_q,
        seq_kv,
        d,
        dv,
        ..
    } = *sh;
    let n = sh.units();
    check_len("q", q, n * seq_q * d);
    check_len("k", k, n * seq_kv * d);
    check_len("v", v, n * seq_kv * dv);
    check_len("the output", out, n * seq_q * dv);
    check_len("the log-sum-exp", lse, n * seq_q);
    if let Some(keep) = keep {
        assert_eq!(keep.len(), sh.batch * seq_kv, "attention: key mask length");
    }
    if n == 0 || seq_q == 0 {
        return;
    }
    let scale = sh.scale();
    let rows = sh.block_rows();
    let units: Vec<_> = out
        .chunks_mut(seq_q * dv)
        .zip(lse.chunks_mut(seq_q))
        .collect();
    for_units(sh, units, |u, (out, lse)| {
        let (q, k, v) = (
            &q[u * seq_q * d..(u + 1) * seq_q * d],
            &k[u * seq_kv * d..(u + 1) * seq_kv * d],
            &v[u * seq_kv * dv..(u + 1) * seq_kv * dv],
        );
        let keep = keep_of(keep, u / heads, seq_kv);
        let kt = transpose(k, seq_kv, d);
        let mut s = vec![0f32; rows * seq_kv];
        for r0 in (0..seq_q).step_by(rows) {
            let m = rows.min(seq_q - r0);
            let s = &mut s[..m * seq_kv];
            block_scores(&q[r0 * d..(r0 + m) * d], &kt, [m, seq_kv, d], scale, s);
            softmax_rows(s, seq_kv, keep, &mut lse[r0..r0 + m]);
            // SAFETY: out's block is [m, dv] from row r0, s is [m, seq_kv], v [seq_kv, dv]:
            // every index is in bounds.
            unsafe {
                matmul(
                    [m, dv, seq_kv],
                    out[r0 * dv..].as_mut_ptr(),
                    row_major(dv),
                    false,
                    s.as_ptr(),
                    row_major(seq_kv),
                    v.as_ptr(),
                    row_major(dv),
                    1.0,
                    gemm::Parallelism::None,
                );
            }
        }
    });
}

/// The inputs of [`backward`]: the forward's inputs, output and log-sum-exp.
pub(crate) struct Saved<'a> {
    pub(crate) q: &'a [f32],
    pub(crate) k: &'a [f32],
    pub(crate) v: &'a [f32],
    pub(crate) keep: Option<&'a [bool]>,
    pub(crate) out: &'a [f32],
    pub(crate) lse: &'a [f32],
}

/// The gradients `(dq, dk, dv)` of [`forward`] for the output gradient `g` (`[batch, heads,
/// seq_q, dv]`), with `D_i = g_i · o_i`, `P` recomputed from the log-sum-exp,
/// `dV = Pᵀ g`, `dS = P ∘ (g Vᵀ - D) · scale`, `dQ = dS K`, `dK = dSᵀ Q`.
pub(crate) fn backward(sh: &Shape, saved: &Saved, g: &[f32]) -> [Vec<f32>; 3] {
    let Shape {
        heads,
        seq_q,
        seq_kv,
        d,
        dv,
        ..
    } = *sh;
    let n = sh.units();
    check_len("q", saved.q, n * seq_q * d);
    check_len("k", saved.k, n * seq_kv * d);
    check_len("v", saved.v, n * seq_kv * dv);
    check_len("the output", saved.out, n * seq_q * dv);
    check_len("the output gradient", g, n * seq_q * dv);
    check_len("the log-sum-exp", saved.lse, n * seq_q);
    let mut dq = vec![0f32; n * seq_q * d];
    let mut dk = vec![0f32; n * seq_kv * d];
    let mut dvv = vec![0f32; n * seq_kv * dv];
    if n == 0 || seq_q == 0 || seq_kv == 0 {
        return [dq, dk, dvv];
    }
    let scale = sh.scale();
    let rows = sh.block_rows();
    let units: Vec<_> = dq
        .chunks_mut(seq_q * d)
        .zip(dk.chunks_mut(seq_kv * d))
        .zip(dvv.chunks_mut(seq_kv * dv))
        .collect();
    for_units(sh, units, |u, ((dq, dk), dvu)| {
        let (q, k, v) = (
            &saved.q[u * seq_q * d..(u + 1) * seq_q * d],
            &saved.k[u * seq_kv * d..(u + 1) * seq_kv * d],
            &saved.v[u * seq_kv * dv..(u + 1) * seq_kv * dv],
        );
        let (o, g) = (
            &saved.out[u * seq_q * dv..(u + 1) * seq_q * dv],
            &g[u * seq_q * dv..(u + 1) * seq_q * dv],
        );
        let lse = &saved.lse[u * seq_q..(u + 1) * seq_q];
        let keep = keep_of(saved.keep, u / heads, seq_kv);
        let (kt, vt) = (transpose(k, seq_kv, d), transpose(v, seq_kv, dv));
        let mut delta = vec![0f32; seq_q];
        row_dots(g, o, dv, &mut delta);
        let mut p = vec![0f32; rows * seq_kv];
        let mut ds = vec![0f32; rows * seq_kv];
        for r0 in (0..seq_q).step_by(rows) {
            let m = rows.min(seq_q - r0);
            let (p, ds) = (&mut p[..m * seq_kv], &mut ds[..m * seq_kv]);
            let first = r0 == 0;
            block_scores(&q[r0 * d..(r0 + m) * d], &kt, [m, seq_kv, d], scale, p);
            probabilities_rows(p, seq_kv, keep, &lse[r0..r0 + m]);
            // SAFETY: the blocks of q, g and dq start at row r0 and hold m rows; k, v, dk
            // and dv hold seq_kv rows; p and ds are [m, seq_kv]. Every index is in bounds.
            unsafe {
                // dV += Pᵀ g
                matmul(
                    [seq_kv, dv, m],
                    dvu.as_mut_ptr(),
                    row_major(dv),
                    !first,
                    p.as_ptr(),
                    transposed(seq_kv),
                    g[r0 * dv..].as_ptr(),
                    row_major(dv),
                    1.0,
                    gemm::Parallelism::None,
                );
                // dP = g Vᵀ
                matmul(
                    [m, seq_kv, dv],
                    ds.as_mut_ptr(),
                    row_major(seq_kv),
                    false,
                    g[r0 * dv..].as_ptr(),
                    row_major(dv),
                    vt.as_ptr(),
                    row_major(seq_kv),
                    1.0,
                    gemm::Parallelism::None,
                );
            }
            scores_grad_rows(p, ds, seq_kv, &delta[r0..r0 + m], scale);
            unsafe {
                // dQ = dS K
                matmul(
                    [m, d, seq_kv],
                    dq[r0 * d..].as_mut_ptr(),
                    row_major(d),
                    false,
                    ds.as_ptr(),
                    row_major(seq_kv),
                    k.as_ptr(),
                    row_major(d),
                    1.0,
                    gemm::Parallelism::None,
                );
                // dK += dSᵀ Q
                matmul(
                    [seq_kv, d, m],
                    dk.as_mut_ptr(),
                    row_major(d),
                    !first,
                    ds.as_ptr(),
                    transposed(seq_kv),
                    q[r0 * d..].as_ptr(),
                    row_major(d),
                    1.0,
                    gemm::Parallelism::None,
                );
            }
        }
    });
    [dq, dk, dvv]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The softmax of a row against `f64`, with masked keys and a NaN.
    #[test]
    fn a_row_softmax_matches_f64() {
        let mut row: Vec<f32> = (0..37).map(|i| ((i * 7) % 11) as f32 * 0.9 - 3.0).collect();
        let keep: Vec<bool> = (0..37).map(|i| i % 5 != 2).collect();
        let want: Vec<f64> = {
            let max = row
                .iter()
                .zip(&keep)
                .filter(|(_, k)| **k)
                .map(|(x, _)| *x as f64)
                .fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = row
                .iter()
                .zip(&keep)
                .map(|(x, k)| if *k { (*x as f64 - max).exp() } else { 0.0 })
                .collect();
            let s: f64 = e.iter().sum();
            e.into_iter().map(|e| e / s).collect()
        };
        let mut lse = [0f32];
        softmax_rows(&mut row, 37, Some(&keep), &mut lse);
        for (j, (got, want)) in row.iter().zip(&want).enumerate() {
            assert!(
                (*got as f64 - want).abs() < 1e-7,
                "p[{j}] = {got}, expected {want}"
            );
            if !keep[j] {
                assert_eq!(*got, 0.0);
            }
        }
        let mut nan = vec![0.5f32; 19];
        nan[11] = f32::NAN;
        softmax_rows(&mut nan, 19, None, &mut lse);
        assert!(nan.iter().all(|x| x.is_nan()), "{nan:?}");
        let mut none = vec![1.0f32; 9];
        softmax_rows(&mut none, 9, Some(&[false; 9]), &mut lse);
        assert_eq!((none, lse[0]), (vec![0.0; 9], f32::NEG_INFINITY));
    }
}
