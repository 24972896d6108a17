//! Single-precision `log` and `sincos` from Cephes' polynomial approximations, evaluated
//! exactly the way PyTorch's AVX2/AVX512 `normal_fill` evaluates them.
//!
//! PyTorch's `ATen/native/cpu/avx_mathfun.h` (after Pommier's `sse_mathfun`) computes these
//! with `f32` multiplies and adds that GCC contracts into fused multiply-adds
//! (`-ffp-contract=fast` is GCC's default). Reproducing its bits needs the same constants, the
//! same operation order and the fusion in the same places, which is what this module does (the
//! fused places were confirmed against `torch.randn` bit for bit). It uses only IEEE-754 basic
//! operations and `mul_add`, all correctly rounded, so the results are identical on every
//! platform: the crate's own initial noise uses these functions for that reason.

// The literals are the reference's, digit for digit.
#![allow(clippy::excessive_precision)]

const MIN_NORM_POS: u32 = 0x0080_0000;
const INV_MANT_MASK: u32 = !0x7f80_0000;

// The constants are C `float`s initialised from `double` literals: written here the same way
// (decimal -> f64 -> f32), which is not always the same as a direct decimal -> f32 rounding.
// cephes_SQRTHF = 0.707106781186547524, which parses to this f64.
const SQRTHF: f32 = std::f64::consts::FRAC_1_SQRT_2 as f32;
const LOG_P: [f32; 9] = [
    7.037_683_629_2E-2_f64 as f32,
    -1.151_461_031_0E-1_f64 as f32,
    1.167_699_874_0E-1_f64 as f32,
    -1.242_014_084_6E-1_f64 as f32,
    1.424_932_278_7E-1_f64 as f32,
    -1.666_805_766_5E-1_f64 as f32,
    2.000_071_476_5E-1_f64 as f32,
    -2.499_999_399_3E-1_f64 as f32,
    3.333_333_117_4E-1_f64 as f32,
];
const LOG_Q1: f32 = -2.121_944_40e-4_f64 as f32;
const LOG_Q2: f32 = 0.693_359_375_f64 as f32;

const DP1: f32 = -0.785_156_25_f64 as f32;
const DP2: f32 = -2.418_756_484_985_351_562_5e-4_f64 as f32;
const DP3: f32 = -3.774_894_977_445_941_08e-8_f64 as f32;
const SINCOF: [f32; 3] = [
    -1.951_529_589_1E-4_f64 as f32,
    8.332_160_873_6E-3_f64 as f32,
    -1.666_665_461_1E-1_f64 as f32,
];
const COSCOF: [f32; 3] = [
    2.443_315_711_809_948E-5_f64 as f32,
    -1.388_731_625_493_765E-3_f64 as f32,
    4.166_664_568_298_827E-2_f64 as f32,
];
const FOPI: f32 = 1.273_239_544_735_16_f64 as f32;

/// `2 * pi` as PyTorch's `_mm256_set1_ps(2.0f * c10::pi<double>)` rounds it.
pub(crate) const TWO_PI: f32 = (2.0 * std::f64::consts::PI) as f32;

/// Natural logarithm of `x > 0` (Cephes `logf` as in `log256_ps`). Not for `x <= 0`.
pub(crate) fn log(x: f32) -> f32 {
    let x = x.max(f32::from_bits(MIN_NORM_POS));
    let bits = x.to_bits();
    let mut e = ((bits >> 23) as i32 - 0x7f) as f32;
    let mut x = f32::from_bits((bits & INV_MANT_MASK) | 0.5f32.to_bits());
    e += 1.0;
    let tmp = if x < SQRTHF {
        e -= 1.0;
        x
    } else {
        0.0
    };
    x -= 1.0;
    x += tmp;
    let z = x * x;
    let mut y = LOG_P[0];
    for p in &LOG_P[1..] {
        y = y.mul_add(x, *p);
    }
    y *= x;
    y = y.mul_add(z, e * LOG_Q1);
    y = (-z).mul_add(0.5, y);
    e.mul_add(LOG_Q2, x + y)
}

/// `(sin x, cos x)` (Cephes `sinf`/`cosf` as in `sincos256_ps`), accurate for `|x| < 8192`.
pub(crate) fn sincos(x: f32) -> (f32, f32) {
    let mut sign_sin = x.to_bits() & 0x8000_0000;
    let mut x = x.abs();
    let j = ((x * FOPI) as i32 + 1) & !1;
    let y = j as f32;
    let swap_sign_sin = ((j & 4) as u32) << 29;
    let use_sine_poly = j & 2 == 0;
    x = y.mul_add(DP1, x);
    x = y.mul_add(DP2, x);
    x = y.mul_add(DP3, x);
    let sign_cos = ((!(j - 2) & 4) as u32) << 29;
    sign_sin ^= swap_sign_sin;

    let z = x * x;
    let mut yc = COSCOF[0].mul_add(z, COSCOF[1]);
    yc = yc.mul_add(z, COSCOF[2]);
    yc *= z;
    yc = yc.mul_add(z, -(z * 0.5));
    yc += 1.0;

    let mut ys = SINCOF[0].mul_add(z, SINCOF[1]);
    ys = ys.mul_add(z, SINCOF[2]);
    ys *= z;
    ys = ys.mul_add(x, x);

    let (s, c) = if use_sine_poly { (ys, yc) } else { (yc, ys) };
    (
        f32::from_bits(s.to_bits() ^ sign_sin),
        f32::from_bits(c.to_bits() ^ sign_cos),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_is_close_to_ln() {
        for i in 1..2000 {
            let x = i as f32 / 1000.0;
            let (a, b) = (log(x), x.ln());
            assert!(
                (a - b).abs() <= 2e-7 * b.abs().max(1.0),
                "log({x}) = {a}, ln = {b}"
            );
        }
        assert_eq!(log(1.0), 0.0);
    }

    #[test]
    fn sincos_is_close_to_libm() {
        for i in 0..2000 {
            let x = i as f32 * (TWO_PI / 2000.0);
            let (s, c) = sincos(x);
            assert!((s - x.sin()).abs() < 3e-7, "sin({x})");
            assert!((c - x.cos()).abs() < 3e-7, "cos({x})");
        }
    }
}
