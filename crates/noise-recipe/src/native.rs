//! The crate's own normal sampler: PCG-XSL-RR 128/64 keyed by SplitMix64, Box-Muller in `f32`
//! with the platform-independent Cephes functions.

use rand_core::Rng;
use rand_pcg::Pcg64;

use crate::cephes;

/// One SplitMix64 output (the finaliser of `java.util.SplittableRandom`).
pub(crate) fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The generator for `(domain, keys)`: keys absorbed with SplitMix64, then four SplitMix64
/// outputs make the 128-bit PCG state and stream (`Pcg64::new(state, stream)`).
pub(crate) fn generator(domain: u64, keys: &[u64]) -> Pcg64 {
    let mut h = splitmix64(domain);
    for &k in keys {
        h = splitmix64(h ^ k);
    }
    let w: Vec<u64> = (1..=4u64)
        .map(|i| splitmix64(h.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15))))
        .collect();
    let state = u128::from(w[0]) | (u128::from(w[1]) << 64);
    let stream = u128::from(w[2]) | (u128::from(w[3]) << 64);
    Pcg64::new(state, stream)
}

/// FNV-1a 64 of bytes.
pub(crate) const fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h
}

/// Fills `out` with standard normals: each 64-bit output gives two 24-bit uniforms
/// `u1 = (x >> 40) 2^-24`, `u2 = ((x >> 16) & (2^24 - 1)) 2^-24` and two normals
/// `sqrt(-2 log(1 - u1)) (cos, sin)(2 pi u2)`, written in that order (an odd tail drops the
/// sine). Values lie within about 5.8 standard deviations (the 24-bit uniforms' resolution).
pub(crate) fn fill_normals(rng: &mut Pcg64, out: &mut [f32]) {
    const SCALE: f32 = 1.0 / 16_777_216.0;
    for pair in out.chunks_mut(2) {
        let x = rng.next_u64();
        let u1 = (x >> 40) as f32 * SCALE;
        let u2 = ((x >> 16) & 0x00ff_ffff) as f32 * SCALE;
        let radius = (-2.0f32 * cephes::log(1.0 - u1)).sqrt();
        let (s, c) = cephes::sincos(cephes::TWO_PI * u2);
        pair[0] = radius * c;
        if let Some(second) = pair.get_mut(1) {
            *second = radius * s;
        }
    }
}
