//! The kernels on plain `f32` slices: no tensor types, so each is a loop the compiler
//! vectorises (AVX-512 or AVX2 where the CPU has it, chosen at run time; SSE2 otherwise). Every
//! path gives the same bits: no multiply-add is contracted on any of them, and the sums keep
//! the order their source writes (8 explicit lanes), which no vector width changes.

use rayon::prelude::*;

/// Elementwise work at or above this many elements is split over rayon's pool, in chunks of
/// [`CHUNK`]. Below it one thread is faster, and the trainer already runs its batches side by
/// side. Elementwise results do not depend on the split.
const PARALLEL_MIN: usize = 1 << 21;
const CHUNK: usize = 1 << 16;

/// `2 sqrt(2/pi)`: GELU-tanh is `x sigmoid(x (C0 + C1 x^2))`.
const C0: f32 = (2.0 * core::f64::consts::FRAC_2_SQRT_PI * core::f64::consts::FRAC_1_SQRT_2) as f32;
/// `C0 * 0.044715`.
const C1: f32 =
    (2.0 * core::f64::consts::FRAC_2_SQRT_PI * core::f64::consts::FRAC_1_SQRT_2 * 0.044715) as f32;

/// `exp(x)` for `f32`, branch-free (Cephes' `expf`: `2^n p(r)`, `|r| <= ln2/2`, a degree-7
/// polynomial), within 2 ulp over the clamped range; NaN stays NaN. Arguments are clamped to
/// `[-87, 88]`, where `2^n` is a normal float: `exp` of anything below is about `1.6e-38`
/// instead of a smaller number or zero, of anything above about `1.65e38` instead of infinity.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = core::f32::consts::LOG2_E;
    // ln 2 split in two, the first with few mantissa bits so that n * LN2_HI is exact.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer (|x log2 e| < 2^22).
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.987_569_2e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let e = p * (r * r) + r + 1.0;
    // 2^n from its exponent bits. n is in [-126, 127] after the clamp, and it sits in the low
    // mantissa bits of t (t's bits are ROUND's plus n): integer arithmetic, which vectorises,
    // where a float-to-int cast (saturating in Rust) would not. A NaN stays NaN through e.
    let n_bits = t.to_bits().wrapping_sub(ROUND.to_bits());
    let two_n = f32::from_bits(n_bits.wrapping_add(127) << 23);
    e * two_n
}

/// `1 / (1 + exp(-z))`.
#[inline(always)]
fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + exp(-z))
}

#[inline(always)]
fn gelu_one(x: f32) -> f32 {
    x * sigmoid(x * (C0 + C1 * (x * x)))
}

/// `d gelu / dx * g`: with `s = sigmoid(x (C0 + C1 x^2))`,
/// `d/dx [x s] = s + x s (1 - s) (C0 + 3 C1 x^2)`.
#[inline(always)]
fn gelu_grad_one(x: f32, g: f32) -> f32 {
    let x2 = x * x;
    let s = sigmoid(x * (C0 + C1 * x2));
    g * (s + x * s * (1.0 - s) * (C0 + 3.0 * C1 * x2))
}

/// The widest path [`simd_dispatch`]'s kernels may take on this thread: 0 portable, 1 AVX2,
/// 2 AVX-512F (each where the CPU has it). 2 unless [`with_simd_cap`] lowers it.
#[inline(always)]
pub(crate) fn simd_cap() -> u8 {
    SIMD_CAP.with(|c| c.get())
}

thread_local! {
    static SIMD_CAP: std::cell::Cell<u8> = const { std::cell::Cell::new(2) };
}

/// Runs `f` with the CPU kernels' instruction sets capped for this thread: 0 portable, 1 up
/// to AVX2, 2 up to AVX-512F (the default). Every path gives the same bits; this exists so
/// that a test can hold them to it. A kernel that splits its work over rayon's pool runs the
/// parts on the pool's threads, which keep their own cap: call it inside a one-thread pool's
/// `install`.
#[doc(hidden)]
pub fn with_simd_cap<R>(cap: u8, f: impl FnOnce() -> R) -> R {
    /// Puts the previous cap back, also when `f` panics.
    struct Restore(u8);
    impl Drop for Restore {
        fn drop(&mut self) {
            SIMD_CAP.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(SIMD_CAP.with(|c| c.replace(cap)));
    f()
}

macro_rules! simd_dispatch {
    (
        $(#[$doc:meta])* $name:ident, $avx2:ident, $avx512:ident,
        ($($arg:ident: $ty:ty),*), $body:expr
    ) => {
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                let cap = $crate::kernels::simd_cap();
                if cap >= 2 && std::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU was just checked for AVX-512F, the feature enabled (with
                    // those it implies).
                    return unsafe { $avx512($($arg),*) };
                }
                if cap >= 1 && std::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU was just checked for AVX2, the one feature enabled.
                    return unsafe { $avx2($($arg),*) };
                }
            }
            $body
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2")]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $avx2($($arg: $ty),*) {
            $body
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx512f")]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $avx512($($arg: $ty),*) {
            $body
        }
    };
}
pub(crate) use simd_dispatch;

/// The transpose of a row-major `[rows, cols]` matrix, row-major `[cols, rows]`: 8 x 8 blocks
/// through AVX registers where the CPU has them, the edges (and everything on other CPUs)
/// one element at a time. A copy: every path gives the same bits.
pub(crate) fn transpose(src: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let n = rows * cols;
    assert_eq!(
        src.len(),
        n,
        "transpose: {} elements for [{rows}, {cols}]",
        src.len()
    );
    crate::step::filled(n, |dst| {
        let out = dst.as_mut_ptr().cast::<f32>();
        // The block of rows `..r8` and columns `..c8` done in 8 x 8 blocks.
        #[allow(unused_mut)]
        let (mut r8, mut c8) = (0, 0);
        #[cfg(target_arch = "x86_64")]
        if simd_cap() >= 1 && std::is_x86_feature_detected!("avx") {
            (r8, c8) = (rows / 8 * 8, cols / 8 * 8);
            // SAFETY: the CPU was just checked for AVX; `src` holds `rows x cols` elements
            // and `dst` as many.
            unsafe { transpose_blocks_avx(src.as_ptr(), [rows, cols], [r8, c8], out) };
        }
        // Every element `(r, c)` is written once, at `c * rows + r`: by the blocks for
        // `r < r8` and `c < c8`, by this loop for the rest.
        for (r, row) in src.chunks_exact(cols.max(1)).enumerate().take(rows) {
            let first = if r < r8 { c8 } else { 0 };
            for (c, v) in row.iter().enumerate().skip(first) {
                dst[c * rows + r].write(*v);
            }
        }
    })
}

/// The 8 x 8 blocks of [`transpose`] covering rows `..r8` and columns `..c8` (multiples of 8).
///
/// # Safety
/// The CPU has AVX; `src` addresses `rows x cols` elements, `dst` as many.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn transpose_blocks_avx(
    src: *const f32,
    [rows, cols]: [usize; 2],
    [r8, c8]: [usize; 2],
    dst: *mut f32,
) {
    use std::arch::x86_64::*;
    for r0 in (0..r8).step_by(8) {
        for c0 in (0..c8).step_by(8) {
            // SAFETY: rows `r0..r0 + 8` and columns `c0..c0 + 8` lie inside both matrices.
            unsafe {
                let p = src.add(r0 * cols + c0);
                let a: [__m256; 8] = core::array::from_fn(|i| _mm256_loadu_ps(p.add(i * cols)));
                // pairs of rows interleaved, then quadruples, then the 128-bit halves swapped
                let t = [
                    _mm256_unpacklo_ps(a[0], a[1]),
                    _mm256_unpackhi_ps(a[0], a[1]),
                    _mm256_unpacklo_ps(a[2], a[3]),
                    _mm256_unpackhi_ps(a[2], a[3]),
                    _mm256_unpacklo_ps(a[4], a[5]),
                    _mm256_unpackhi_ps(a[4], a[5]),
                    _mm256_unpacklo_ps(a[6], a[7]),
                    _mm256_unpackhi_ps(a[6], a[7]),
                ];
                let s = [
                    _mm256_shuffle_ps::<0x44>(t[0], t[2]),
                    _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
                    _mm256_shuffle_ps::<0x44>(t[1], t[3]),
                    _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
                    _mm256_shuffle_ps::<0x44>(t[4], t[6]),
                    _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
                    _mm256_shuffle_ps::<0x44>(t[5], t[7]),
                    _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
                ];
                let q = dst.add(c0 * rows + r0);
                for j in 0..4 {
                    _mm256_storeu_ps(
                        q.add(j * rows),
                        _mm256_permute2f128_ps::<0x20>(s[j], s[j + 4]),
                    );
                    _mm256_storeu_ps(
                        q.add((j + 4) * rows),
                        _mm256_permute2f128_ps::<0x31>(s[j], s[j + 4]),
                    );
                }
            }
        }
    }
}

simd_dispatch!(
    /// `y = gelu_tanh(x)`, one thread.
    gelu_serial, gelu_serial_avx2, gelu_serial_avx512, (x: &[f32], y: &mut [f32]),
    for (y, x) in y.iter_mut().zip(x) {
        *y = gelu_one(*x);
    }
);

simd_dispatch!(
    /// `out = g * gelu_tanh'(x)`, one thread.
    gelu_grad_serial, gelu_grad_serial_avx2, gelu_grad_serial_avx512, (x: &[f32], g: &[f32], out: &mut [f32]),
    for ((o, x), g) in out.iter_mut().zip(x).zip(g) {
        *o = gelu_grad_one(*x, *g);
    }
);

/// `y = gelu_tanh(x)`.
pub(crate) fn gelu(x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    if x.len() >= PARALLEL_MIN {
        y.par_chunks_mut(CHUNK)
            .zip(x.par_chunks(CHUNK))
            .for_each(|(y, x)| gelu_serial(x, y));
    } else {
        gelu_serial(x, y);
    }
}

/// `out = g * gelu_tanh'(x)`.
pub(crate) fn gelu_grad(x: &[f32], g: &[f32], out: &mut [f32]) {
    assert_eq!(x.len(), out.len());
    assert_eq!(g.len(), out.len());
    if x.len() >= PARALLEL_MIN {
        out.par_chunks_mut(CHUNK)
            .zip(x.par_chunks(CHUNK).zip(g.par_chunks(CHUNK)))
            .for_each(|(o, (x, g))| gelu_grad_serial(x, g, o));
    } else {
        gelu_grad_serial(x, g, out);
    }
}

/// Where the rows of a `[batch, seq, heads, head_dim]` tensor sit in a buffer: the element
/// `(b, s, h, i)` is at `offset + b * strides[0] + s * strides[1] + h * strides[2] + i`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rows {
    pub(crate) dims: [usize; 4],
    pub(crate) strides: [usize; 3],
    pub(crate) offset: usize,
}

impl Rows {
    /// The token-major contiguous layout of `dims`.
    pub(crate) fn token_major(dims: [usize; 4]) -> Self {
        let [_, s, h, d] = dims;
        Self {
            dims,
            strides: [s * h * d, h * d, d],
            offset: 0,
        }
    }

    /// The heads-major layout (`[batch, heads, seq, head_dim]` in memory) of `dims`.
    pub(crate) fn heads_major(dims: [usize; 4]) -> Self {
        let [_, s, h, d] = dims;
        Self {
            dims,
            strides: [s * h * d, d, s * d],
            offset: 0,
        }
    }

    #[inline(always)]
    fn at(&self, s: usize, h: usize) -> usize {
        s * self.strides[1] + h * self.strides[2]
    }
}

/// Which way [`rope`] turns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// `out[i] = x[i] cos[i] + x[i^1] sin[i]`.
    Forward,
    /// The transpose, for the gradient: `out[i] = g[i] cos[i] + g[i^1] sin[i^1]`.
    Transposed,
}

#[inline(always)]
fn rope_row(x: &[f32], cos: &[f32], sin: &[f32], out: &mut [f32], turn: Turn) {
    let pairs = out
        .chunks_exact_mut(2)
        .zip(x.chunks_exact(2))
        .zip(cos.chunks_exact(2).zip(sin.chunks_exact(2)));
    match turn {
        Turn::Forward => {
            for ((o, x), (c, s)) in pairs {
                o[0] = x[0] * c[0] + x[1] * s[0];
                o[1] = x[1] * c[1] + x[0] * s[1];
            }
        }
        Turn::Transposed => {
            for ((o, x), (c, s)) in pairs {
                o[0] = x[0] * c[0] + x[1] * s[1];
                o[1] = x[1] * c[1] + x[0] * s[0];
            }
        }
    }
}

/// One batch row of [`rope`]: `x` and `out` start at that row.
fn rope_batch(
    x: &[f32],
    xr: &Rows,
    cos: &[f32],
    sin: &[f32],
    out: &mut [f32],
    or: &Rows,
    turn: Turn,
) {
    let [_, s_len, h_len, d] = xr.dims;
    for s in 0..s_len {
        let (c, sn) = (&cos[s * d..(s + 1) * d], &sin[s * d..(s + 1) * d]);
        for h in 0..h_len {
            let (xi, oi) = (xr.at(s, h), or.at(s, h));
            rope_row(&x[xi..xi + d], c, sn, &mut out[oi..oi + d], turn);
        }
    }
}

simd_dispatch!(
    /// One batch row of [`rope`], vectorised where the CPU allows.
    rope_batch_simd, rope_batch_avx2, rope_batch_avx512,
    (x: &[f32], xr: &Rows, cos: &[f32], sin: &[f32], out: &mut [f32], or: &Rows, turn: Turn),
    rope_batch(x, xr, cos, sin, out, or, turn)
);

/// Runs `f(x, out)` once per batch row, `x` starting at that row of the input (layout `xr`)
/// and `out` being that row's block of the output (layout `or`, which must start at 0 and keep
/// each batch row in its own `strides[0]` block: both layouts above do); split over rayon's pool
/// when the output is large.
fn for_each_batch(
    x: &[f32],
    xr: &Rows,
    out: &mut [f32],
    or: &Rows,
    f: impl Fn(&[f32], &mut [f32]) + Sync,
) {
    let [b, s, h, d] = xr.dims;
    assert_eq!(or.dims, xr.dims);
    assert_eq!(or.offset, 0);
    assert_eq!(or.strides[0], s * h * d);
    assert_eq!(out.len(), b * s * h * d);
    let one = |(bi, out): (usize, &mut [f32])| f(&x[xr.offset + bi * xr.strides[0]..], out);
    if out.len() >= PARALLEL_MIN {
        out.par_chunks_mut(or.strides[0]).enumerate().for_each(one);
    } else {
        out.chunks_mut(or.strides[0]).enumerate().for_each(one);
    }
}

/// RoPE of the rows `x` (layout `xr`) by the `[seq, head_dim]` tables into `out` (layout
/// `or`, as for [`for_each_batch`]), turned [`Turn::Forward`] or [`Turn::Transposed`].
pub(crate) fn rope(
    x: &[f32],
    xr: &Rows,
    cos: &[f32],
    sin: &[f32],
    out: &mut [f32],
    or: &Rows,
    turn: Turn,
) {
    let [_, s, _, d] = xr.dims;
    assert!(cos.len() == s * d && sin.len() == s * d);
    for_each_batch(x, xr, out, or, |x, out| {
        rope_batch_simd(x, xr, cos, sin, out, or, turn)
    });
}

/// Copies the rows of `x` (layout `xr`) into `out` (layout `or`, as for [`for_each_batch`]), a
/// `head_dim` row at a time.
pub(crate) fn copy_rows(x: &[f32], xr: &Rows, out: &mut [f32], or: &Rows) {
    let [_, s_len, h_len, d] = xr.dims;
    for_each_batch(x, xr, out, or, |x, out| {
        for s in 0..s_len {
            for h in 0..h_len {
                let (xi, oi) = (xr.at(s, h), or.at(s, h));
                out[oi..oi + d].copy_from_slice(&x[xi..xi + d]);
            }
        }
    });
}

/// The gradients of [`rope`]'s tables: `gcos[s, i] = sum over b, h of g[i] x[i]`,
/// `gsin[s, i] = sum over b, h of g[i] x[i^1]`, in `f64` and rounded once.
pub(crate) fn rope_table_grads(x: &[f32], xr: &Rows, g: &[f32], gr: &Rows) -> (Vec<f32>, Vec<f32>) {
    let [b_len, s_len, h_len, d] = xr.dims;
    let mut gc = vec![0f64; s_len * d];
    let mut gs = vec![0f64; s_len * d];
    for b in 0..b_len {
        for s in 0..s_len {
            for h in 0..h_len {
                let xi = xr.offset + b * xr.strides[0] + xr.at(s, h);
                let gi = gr.offset + b * gr.strides[0] + gr.at(s, h);
                for i in 0..d {
                    let gv = g[gi + i] as f64;
                    gc[s * d + i] += gv * x[xi + i] as f64;
                    gs[s * d + i] += gv * x[xi + (i ^ 1)] as f64;
                }
            }
        }
    }
    let round = |v: Vec<f64>| v.into_iter().map(|v| v as f32).collect();
    (round(gc), round(gs))
}

#[cfg(test)]
mod tests {
    use super::{exp, transpose, with_simd_cap};

    /// The transpose puts every element where the definition does, on shapes that are and are
    /// not multiples of the 8 x 8 blocks, on the widest path and on the portable one.
    #[test]
    fn transpose_moves_every_element() {
        let shapes = [
            (0, 3),
            (3, 0),
            (1, 1),
            (3, 5),
            (8, 8),
            (16, 24),
            (17, 40),
            (76, 64),
            (9, 129),
        ];
        for cap in [0, 2] {
            for (rows, cols) in shapes {
                let src: Vec<f32> = (0..rows * cols).map(|i| i as f32 + 0.5).collect();
                let t = with_simd_cap(cap, || transpose(&src, rows, cols));
                assert_eq!(t.len(), rows * cols);
                for r in 0..rows {
                    for c in 0..cols {
                        assert_eq!(
                            t[c * rows + r],
                            src[r * cols + c],
                            "cap {cap}, [{rows}, {cols}] at ({r}, {c})"
                        );
                    }
                }
            }
        }
    }

    /// The polynomial `exp` against the platform's, in ulps, over the range GELU uses and the
    /// clamp's ends.
    #[test]
    fn exp_is_within_two_ulps() {
        let mut worst = 0u32;
        let mut x = -87.0f32;
        while x <= 88.0 {
            let (got, want) = (exp(x), (x as f64).exp() as f32);
            let ulps = (got.to_bits() as i64 - want.to_bits() as i64).unsigned_abs() as u32;
            assert!(ulps <= 2, "exp({x}) = {got}, expected {want} ({ulps} ulps)");
            worst = worst.max(ulps);
            x += 0.00731;
        }
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(-1e4), exp(-87.0));
        assert_eq!(exp(0.0), 1.0);
        println!("exp: worst {worst} ulps");
    }
}
