//! The trainer's own random stream (prompt order and any other draw the loop makes), whose
//! state is saved with every checkpoint so a resumed run draws exactly what an uninterrupted
//! one would.
//!
//! Initial noise and trained-step plans do not come from here: they are pure functions of
//! (seed, keys) in `noise-recipe` and `schedule`. Neither does anything drawn with a burn
//! backend's global generator, whose state burn does not expose (LoRA initialisation, for
//! instance, which a resume overwrites with the checkpoint's weights anyway).

use keyed_rng::PcgStream;
use serde::{Deserialize, Serialize};

/// PCG-XSL-RR 128/64 (`rand_pcg::Pcg64`) seeded from a `u64` by SplitMix64
/// ([`keyed_rng::PcgStream::seeded`]), serialisable.
///
/// Its JSON (`rng_rank0.json` in a checkpoint) is `{"pcg": {"state": …, "increment": …}}`, the
/// 128-bit PCG state and increment.
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
    pcg: PcgStream,
}

impl TrainerRng {
    /// The stream of `seed`: state and increment from four SplitMix64 outputs
    /// ([`keyed_rng::seeded_pcg`]).
    pub fn seeded(seed: u64) -> Self {
        Self {
            pcg: PcgStream::seeded(seed),
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
        self.pcg.below(n)
    }

    /// A uniform float in `[0, 1)` with 53 random bits.
    pub fn uniform(&mut self) -> f64 {
        self.pcg.unit_f64()
    }

    /// Shuffles `items` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        self.pcg.shuffle(items);
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

    /// The stream and the checkpoint file's JSON are exactly what they were before the
    /// generator moved to `keyed-rng`: checkpoints written then still resume bit for bit.
    #[test]
    fn the_stream_and_its_json_are_pinned() {
        let mut r = TrainerRng::seeded(42);
        let first: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
        assert_eq!(
            first,
            [
                0x48A7_DEF7_ACA6_222C,
                0x3512_3C9A_DFA7_D932,
                0xD2F8_E5CC_6525_C57D
            ]
        );
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(
            json,
            r#"{"pcg":{"state":87142929329978316729225767155470530714,"increment":304628769623771348683148181047607148331}}"#
        );
        assert_eq!(
            serde_json::to_string(&TrainerRng::seeded(0)).unwrap(),
            r#"{"pcg":{"state":14472112956896867126217529912323868496,"increment":334069522134800731113628967131474498265}}"#
        );
        let back: TrainerRng = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);

        let mut r = TrainerRng::seeded(7);
        let mut v: Vec<u32> = (0..10).collect();
        r.shuffle(&mut v);
        assert_eq!(v, [4, 2, 6, 1, 3, 8, 5, 9, 0, 7]);
        assert_eq!(r.uniform().to_bits(), 0x3FDC_B3DB_E744_D080);
        assert_eq!(r.below(1_000_000_007), 382_939_562);
    }
}
