//! The crate's own normal sampler: PCG-XSL-RR 128/64 keyed by SplitMix64
//! ([`keyed_rng::PcgStream::keyed`]), Box-Muller in `f32` with the platform-independent Cephes
//! functions.

use keyed_rng::PcgStream;

use crate::cephes;

/// Fills `out` with standard normals: each 64-bit output gives two 24-bit uniforms
/// `u1 = (x >> 40) 2^-24`, `u2 = ((x >> 16) & (2^24 - 1)) 2^-24` and two normals
/// `sqrt(-2 log(1 - u1)) (cos, sin)(2 pi u2)`, written in that order (an odd tail drops the
/// sine). Values lie within about 5.8 standard deviations (the 24-bit uniforms' resolution).
pub fn fill_normals(rng: &mut PcgStream, out: &mut [f32]) {
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
