//! The per-step kernels of flow samplers on plain `f32` slices: `[batch, n]` buffers (each
//! sample one row of `n` elements) with one scalar per row.
//!
//! * [`combine`]: `out = a_b x + c_b v` (a transition's mean, an Euler step, a draw);
//! * [`scale`]: `out = a_b x` (the gradient of `combine` through one of its terms);
//! * [`mean_square_residual`]: `mean_e (p - m)^2` per row, summed in `f64`;
//! * [`scaled_difference`]: `out = s_b (p - m)` (that reduction's gradient);
//! * [`round_bf16`]: each value rounded to bfloat16 and back (nearest, ties to even).
//!
//! Large buffers run on rayon's pool in chunks of [`CHUNK`] elements within a row. Every
//! element is computed the same way on any split, and a row's sum adds its chunks' partial
//! sums in chunk order, so results do not depend on the number of threads or on the rows
//! beside it.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use crate::kernels::simd_dispatch;

/// Work at or above this many elements is split over rayon's pool.
const PARALLEL_MIN: usize = 1 << 18;
/// The chunk of a row that one task takes, and the unit of a row's partial sums.
const CHUNK: usize = 1 << 14;

/// A `[batch, n]` buffer's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rows {
    pub(crate) batch: usize,
    pub(crate) n: usize,
}

impl Rows {
    fn len(&self) -> usize {
        self.batch * self.n
    }

    fn check<T>(&self, name: &str, buf: &[T]) {
        assert_eq!(
            buf.len(),
            self.len(),
            "step kernel: {name} has {} elements, expected {} for {self:?}",
            buf.len(),
            self.len()
        );
    }

    fn check_coefs(&self, name: &str, coefs: &[f32]) {
        assert_eq!(
            coefs.len(),
            self.batch,
            "step kernel: {name} has {} per-sample values, expected one per row ({})",
            coefs.len(),
            self.batch
        );
    }

    fn parallel(&self) -> bool {
        self.len() >= PARALLEL_MIN
    }
}

simd_dispatch!(
    /// `out = x a + v c`.
    combine_serial, combine_serial_avx2, combine_serial_avx512,
    (x: &[f32], a: f32, v: &[f32], c: f32, out: &mut [MaybeUninit<f32>]),
    for ((o, x), v) in out.iter_mut().zip(x).zip(v) {
        o.write(*x * a + *v * c);
    }
);

simd_dispatch!(
    /// `out = x + v c`: [`combine_serial`] with `a = 1`, the same bits (`x * 1 == x`).
    add_scaled_serial, add_scaled_serial_avx2, add_scaled_serial_avx512,
    (x: &[f32], v: &[f32], c: f32, out: &mut [MaybeUninit<f32>]),
    for ((o, x), v) in out.iter_mut().zip(x).zip(v) {
        o.write(*x + *v * c);
    }
);

simd_dispatch!(
    /// `out = x a`.
    scale_serial, scale_serial_avx2, scale_serial_avx512,
    (x: &[f32], a: f32, out: &mut [MaybeUninit<f32>]),
    for (o, x) in out.iter_mut().zip(x) {
        o.write(*x * a);
    }
);

/// `out = a_b x` for each row `b` (a gradient through a per-sample coefficient).
pub(crate) fn scale(sh: Rows, x: &[f32], a: &[f32], out: &mut [MaybeUninit<f32>]) {
    sh.check("x", x);
    sh.check("out", out);
    sh.check_coefs("a", a);
    if sh.len() == 0 {
        return;
    }
    if sh.parallel() {
        let rows = out.par_chunks_mut(sh.n).zip(x.par_chunks(sh.n)).enumerate();
        rows.for_each(|(b, (o, x))| {
            o.par_chunks_mut(CHUNK)
                .zip(x.par_chunks(CHUNK))
                .for_each(|(o, x)| scale_serial(x, a[b], o))
        });
    } else {
        let rows = out.chunks_mut(sh.n).zip(x.chunks(sh.n));
        rows.enumerate()
            .for_each(|(b, (o, x))| scale_serial(x, a[b], o));
    }
}

/// `out = a_b x + c_b v` for each row `b`; `a = None` is `a_b = 1` (`x` taken as it is).
pub(crate) fn combine(
    sh: Rows,
    x: &[f32],
    a: Option<&[f32]>,
    v: &[f32],
    c: &[f32],
    out: &mut [MaybeUninit<f32>],
) {
    sh.check("x", x);
    sh.check("v", v);
    sh.check("out", out);
    sh.check_coefs("c", c);
    if let Some(a) = a {
        sh.check_coefs("a", a);
    }
    if sh.len() == 0 {
        return;
    }
    let one = |b: usize, x: &[f32], v: &[f32], out: &mut [MaybeUninit<f32>]| match a {
        Some(a) => combine_serial(x, a[b], v, c[b], out),
        None => add_scaled_serial(x, v, c[b], out),
    };
    if sh.parallel() {
        let rows = out
            .par_chunks_mut(sh.n)
            .zip(x.par_chunks(sh.n).zip(v.par_chunks(sh.n)))
            .enumerate();
        rows.for_each(|(b, (o, (x, v)))| {
            o.par_chunks_mut(CHUNK)
                .zip(x.par_chunks(CHUNK).zip(v.par_chunks(CHUNK)))
                .for_each(|(o, (x, v))| one(b, x, v, o))
        });
    } else {
        let rows = out.chunks_mut(sh.n).zip(x.chunks(sh.n).zip(v.chunks(sh.n)));
        rows.enumerate()
            .for_each(|(b, (o, (x, v)))| one(b, x, v, o));
    }
}

simd_dispatch!(
    /// `sum (p - m)^2`, the differences in `f32` (as the composition forms them), their
    /// squares and the sum in `f64`, in 8 lanes added in a fixed order.
    square_residual_sum, square_residual_sum_avx2, square_residual_sum_avx512,
    (p: &[f32], m: &[f32], out: &mut f64),
    {
        let mut acc = [0f64; 8];
        let full = p.len() / 8 * 8;
        let (ph, pt) = p.split_at(full);
        let (mh, mt) = m.split_at(full);
        for (p, m) in ph.chunks_exact(8).zip(mh.chunks_exact(8)) {
            for l in 0..8 {
                let d = f64::from(p[l] - m[l]);
                acc[l] += d * d;
            }
        }
        for (l, (p, m)) in pt.iter().zip(mt).enumerate() {
            let d = f64::from(p - m);
            acc[l] += d * d;
        }
        *out = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    }
);

/// `out_b = mean over the row's elements of (p - m)^2`, summed in `f64` and rounded once.
pub(crate) fn mean_square_residual(sh: Rows, p: &[f32], m: &[f32], out: &mut [f32]) {
    sh.check("p", p);
    sh.check("m", m);
    assert_eq!(out.len(), sh.batch, "step kernel: one mean per row");
    let row = |(p, m): (&[f32], &[f32])| -> f32 {
        let partial = |(p, m): (&[f32], &[f32])| {
            let mut s = 0.0;
            square_residual_sum(p, m, &mut s);
            s
        };
        let parts: Vec<f64> = if sh.parallel() {
            p.par_chunks(CHUNK)
                .zip(m.par_chunks(CHUNK))
                .map(partial)
                .collect()
        } else {
            p.chunks(CHUNK).zip(m.chunks(CHUNK)).map(partial).collect()
        };
        (parts.iter().sum::<f64>() / sh.n as f64) as f32
    };
    if sh.n == 0 {
        // the mean of nothing, as burn's `mean_dim` gives it
        out.fill(f32::NAN);
        return;
    }
    if sh.parallel() {
        let means: Vec<f32> = p
            .par_chunks(sh.n)
            .zip(m.par_chunks(sh.n))
            .map(row)
            .collect();
        out.copy_from_slice(&means);
    } else {
        for (o, r) in out.iter_mut().zip(p.chunks(sh.n).zip(m.chunks(sh.n))) {
            *o = row(r);
        }
    }
}

simd_dispatch!(
    /// `out = (p - m) s`.
    scaled_difference_serial, scaled_difference_serial_avx2, scaled_difference_serial_avx512,
    (p: &[f32], m: &[f32], s: f32, out: &mut [MaybeUninit<f32>]),
    for ((o, p), m) in out.iter_mut().zip(p).zip(m) {
        o.write((*p - *m) * s);
    }
);

/// `out = s_b (p - m)` for each row `b`.
pub(crate) fn scaled_difference(
    sh: Rows,
    p: &[f32],
    m: &[f32],
    s: &[f32],
    out: &mut [MaybeUninit<f32>],
) {
    sh.check("p", p);
    sh.check("m", m);
    sh.check("out", out);
    sh.check_coefs("s", s);
    if sh.len() == 0 {
        return;
    }
    if sh.parallel() {
        let rows = out
            .par_chunks_mut(sh.n)
            .zip(p.par_chunks(sh.n).zip(m.par_chunks(sh.n)))
            .enumerate();
        rows.for_each(|(b, (o, (p, m)))| {
            o.par_chunks_mut(CHUNK)
                .zip(p.par_chunks(CHUNK).zip(m.par_chunks(CHUNK)))
                .for_each(|(o, (p, m))| scaled_difference_serial(p, m, s[b], o))
        });
    } else {
        let rows = out.chunks_mut(sh.n).zip(p.chunks(sh.n).zip(m.chunks(sh.n)));
        rows.enumerate()
            .for_each(|(b, (o, (p, m)))| scaled_difference_serial(p, m, s[b], o));
    }
}

/// `x` rounded to bfloat16 (nearest, ties to even) and widened back, as the `half` crate's
/// `bf16::from_f32` and `to_f32` do it: a NaN stays a NaN (quieted, its payload truncated),
/// infinities stay, and a value past bf16's largest rounds to infinity. Branch-free, so it
/// vectorises.
#[inline(always)]
fn bf16_round_one(x: f32) -> f32 {
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) & 0xFFFF_0000;
    let nan = (bits | 0x0040_0000) & 0xFFFF_0000;
    f32::from_bits(if x.is_nan() { nan } else { rounded })
}

simd_dispatch!(
    /// `out = bf16_round(x)`, one thread.
    round_bf16_serial, round_bf16_serial_avx2, round_bf16_serial_avx512, (x: &[f32], out: &mut [MaybeUninit<f32>]),
    for (o, x) in out.iter_mut().zip(x) {
        o.write(bf16_round_one(*x));
    }
);

/// `out = x` rounded to bfloat16 and back, elementwise.
pub(crate) fn round_bf16(x: &[f32], out: &mut [MaybeUninit<f32>]) {
    assert_eq!(x.len(), out.len(), "step kernel: round_bf16 lengths");
    if x.len() >= PARALLEL_MIN {
        out.par_chunks_mut(CHUNK)
            .zip(x.par_chunks(CHUNK))
            .for_each(|(o, x)| round_bf16_serial(x, o));
    } else {
        round_bf16_serial(x, out);
    }
}

simd_dispatch!(
    /// `x` rounded to bfloat16 and back, in place, one thread.
    round_bf16_in_place, round_bf16_in_place_avx2, round_bf16_in_place_avx512, (x: &mut [f32]),
    for x in x.iter_mut() {
        *x = bf16_round_one(*x);
    }
);

/// The values a kernel has written to the whole of `out`.
fn written(out: &mut [MaybeUninit<f32>]) -> &mut [f32] {
    // SAFETY: called only on a slice that a kernel above has just written in full; `f32` and
    // `MaybeUninit<f32>` have one layout.
    unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<f32>(), out.len()) }
}

/// Where a step's next sample comes from.
#[derive(Clone, Copy)]
pub(crate) enum Next<'a> {
    /// Drawn: `mean + std_b noise`.
    Draw { noise: &'a [f32], std: &'a [f32] },
    /// Stored by a rollout, replayed.
    Stored(&'a [f32]),
}

/// One row of [`gaussian_step`]'s outputs: the mean and the next sample.
type OutRow<'a> = (&'a mut [MaybeUninit<f32>], &'a mut [MaybeUninit<f32>]);

/// The outputs of [`gaussian_step`].
pub(crate) struct StepOut<'a> {
    pub(crate) mean: &'a mut [MaybeUninit<f32>],
    pub(crate) next: &'a mut [MaybeUninit<f32>],
    pub(crate) mean_sq: &'a mut [f32],
}

/// One Gaussian step in one pass over the samples: `mean = a_b x + c_b v`, the next sample
/// (drawn or stored, rounded to bfloat16 when `round`), and `mean_sq_b`, the mean of
/// `(next - mean)^2` over the row.
///
/// Chunk by chunk, while the chunk is in cache, with the same kernels (and the same chunks of
/// the sum) as [`combine`], [`round_bf16`] and [`mean_square_residual`] one after another:
/// the same bits.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gaussian_step(
    sh: Rows,
    x: &[f32],
    a: Option<&[f32]>,
    v: &[f32],
    c: &[f32],
    next: Next<'_>,
    round: bool,
    out: StepOut<'_>,
) {
    sh.check("x", x);
    sh.check("v", v);
    sh.check("the mean", out.mean);
    sh.check("the next sample", out.next);
    sh.check_coefs("c", c);
    if let Some(a) = a {
        sh.check_coefs("a", a);
    }
    match next {
        Next::Draw { noise, std } => {
            sh.check("noise", noise);
            sh.check_coefs("std", std);
        }
        Next::Stored(p) => sh.check("the stored sample", p),
    }
    assert_eq!(out.mean_sq.len(), sh.batch, "step kernel: one mean per row");
    if sh.len() == 0 {
        out.mean_sq.fill(f32::NAN);
        return;
    }
    let n = sh.n;
    // one chunk of row `b` starting at element `at`: its partial sum of squares
    let chunk =
        |b: usize, at: usize, mean: &mut [MaybeUninit<f32>], nx: &mut [MaybeUninit<f32>]| {
            let len = mean.len();
            let (xs, vs) = (&x[b * n + at..][..len], &v[b * n + at..][..len]);
            match a {
                Some(a) => combine_serial(xs, a[b], vs, c[b], mean),
                None => add_scaled_serial(xs, vs, c[b], mean),
            }
            let mean = written(mean);
            let nx = match next {
                Next::Draw { noise, std } => {
                    add_scaled_serial(mean, &noise[b * n + at..][..len], std[b], nx);
                    let nx = written(nx);
                    if round {
                        round_bf16_in_place(nx);
                    }
                    nx
                }
                Next::Stored(p) => {
                    let p = &p[b * n + at..][..len];
                    if round {
                        round_bf16_serial(p, nx);
                    } else {
                        for (o, p) in nx.iter_mut().zip(p) {
                            o.write(*p);
                        }
                    }
                    written(nx)
                }
            };
            let mut s = 0.0;
            square_residual_sum(nx, mean, &mut s);
            s
        };
    let row = |(b, (mean, nx)): (usize, OutRow<'_>)| {
        let parts: Vec<f64> = if sh.parallel() {
            mean.par_chunks_mut(CHUNK)
                .zip(nx.par_chunks_mut(CHUNK))
                .enumerate()
                .map(|(k, (m, nx))| chunk(b, k * CHUNK, m, nx))
                .collect()
        } else {
            mean.chunks_mut(CHUNK)
                .zip(nx.chunks_mut(CHUNK))
                .enumerate()
                .map(|(k, (m, nx))| chunk(b, k * CHUNK, m, nx))
                .collect()
        };
        (parts.iter().sum::<f64>() / n as f64) as f32
    };
    if sh.parallel() {
        let means: Vec<f32> = out
            .mean
            .par_chunks_mut(n)
            .zip(out.next.par_chunks_mut(n))
            .enumerate()
            .map(row)
            .collect();
        out.mean_sq.copy_from_slice(&means);
    } else {
        let rows = out
            .mean
            .chunks_mut(n)
            .zip(out.next.chunks_mut(n))
            .enumerate();
        for (o, r) in out.mean_sq.iter_mut().zip(rows) {
            *o = row(r);
        }
    }
}

/// A buffer of `n` values, every one written by `fill` (each kernel here writes its whole
/// output, which it checks against its shape; so do gemm's products that do not accumulate,
/// and the transpose): no zeroing pass before the kernel's own.
pub(crate) fn filled(n: usize, fill: impl FnOnce(&mut [MaybeUninit<f32>])) -> Vec<f32> {
    let mut v = Vec::with_capacity(n);
    fill(&mut v.spare_capacity_mut()[..n]);
    // SAFETY: the capacity is at least `n`, and `fill` initialised the first `n` elements (the
    // kernels assert that their output has the length they write in full).
    unsafe { v.set_len(n) };
    v
}
