//! The trainer's own random stream (prompt order and any other draw the loop makes), whose
//! state is saved with every checkpoint so a resumed run draws exactly what an uninterrupted
//! one would.
//!
//! Initial noise and trained-step plans do not come from here: they are pure functions of
//! (seed, keys) in `noise-recipe` and `schedule`. Neither does anything drawn with a burn
//! backend's global generator, whose state burn does not expose (LoRA initialisation, for
//! instance, which a resume overwrites with the checkpoint's weights anyway).

use rand_core::Rng;
use rand_pcg::Pcg64;
use serde::{Deserialize, Serialize};

/// PCG-XSL-RR 128/64 (`rand_pcg::Pcg64`) seeded from a `u64` by SplitMix64, serialisable.
///
/// ```
/// use trainer_fsdp::TrainerRng;
/// let mut a = TrainerRng::seeded(42);
/// let first: Vec<u64> = (0..3).map(|_| a.next_u64()).collect();
/// // the state round-trips through JSON: the copy continues the same stream
/// let saved = serde_json::to_string(&a).unwrap();
/// let mut b: TrainerRng = serde_json::from_str(&saved).unwrap();
/// assert_eq!(a.next_u64(), b.next_u64());
/// assert_ne!(first[0], first[1]);
/// assert_eq!(TrainerRng::seeded(42).next_u64(), first[0]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrainerRng {
    pcg: Pcg64,
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl TrainerRng {
    /// The stream of `seed`: state and increment from four SplitMix64 outputs.
    pub fn seeded(seed: u64) -> Self {
        let w: Vec<u64> = (1..=4u64)
            .map(|i| splitmix64(seed ^ i.wrapping_mul(0xD1B5_4A32_D192_ED03)))
            .collect();
        let state = u128::from(w[0]) | (u128::from(w[1]) << 64);
        let stream = u128::from(w[2]) | (u128::from(w[3]) << 64);
        Self {
            pcg: Pcg64::new(state, stream),
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.pcg.next_u64()
    }

    /// A uniform integer in `0..n` without modulo bias.
    ///
    /// # Panics
    /// When `n == 0`.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n >= 1, "TrainerRng::below(0)");
        let reject_under = n.wrapping_neg() % n;
        loop {
            let x = self.next_u64();
            if x >= reject_under {
                return x % n;
            }
        }
    }

    /// A uniform float in `[0, 1)` with 53 random bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Shuffles `items` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_is_in_range_and_covers_it() {
        let mut r = TrainerRng::seeded(7);
        let mut seen = [false; 5];
        for _ in 0..200 {
            let k = r.below(5) as usize;
            seen[k] = true;
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(r.below(1), 0);
    }

    #[test]
    fn uniform_is_in_the_unit_interval() {
        let mut r = TrainerRng::seeded(1);
        let xs: Vec<f64> = (0..1000).map(|_| r.uniform()).collect();
        assert!(xs.iter().all(|&x| (0.0..1.0).contains(&x)));
        let mean = xs.iter().sum::<f64>() / 1000.0;
        assert!((mean - 0.5).abs() < 0.05, "{mean}");
    }

    #[test]
    fn shuffle_is_a_permutation_and_seeds_differ() {
        let mut v: Vec<u32> = (0..20).collect();
        TrainerRng::seeded(3).shuffle(&mut v);
        let mut sorted = v.clone();
        sorted.sort();
        assert_eq!(sorted, (0..20).collect::<Vec<_>>());
        assert_ne!(v, (0..20).collect::<Vec<_>>());
        assert_ne!(TrainerRng::seeded(3), TrainerRng::seeded(4));
    }

    #[test]
    fn json_round_trip_mid_stream() {
        let mut a = TrainerRng::seeded(99);
        for _ in 0..17 {
            a.next_u64();
        }
        let text = serde_json::to_string(&a).unwrap();
        let mut b: TrainerRng = serde_json::from_str(&text).unwrap();
        assert_eq!(a, b);
        let xa: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        let xb: Vec<u64> = (0..5).map(|_| b.next_u64()).collect();
        assert_eq!(xa, xb);
    }
}
