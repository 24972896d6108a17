//! The seeded generator behind every random plan: PCG-XSL-RR 128/64 (`rand_pcg::Pcg64`), its
//! 128-bit state and stream derived from integer keys by SplitMix64.
//!
//! Why not numpy's `default_rng(rollout_id)`: reproducing numpy's `SeedSequence` and its
//! `choice` bit for bit would tie every engine to numpy's internals. Our draws are instead a
//! documented pure function of `(domain, keys)`, identical on every rank, engine and platform
//! (integer arithmetic only), and the golden tests pin their bits. They are not numpy's bits.

use rand_core::Rng;
use rand_pcg::Pcg64;

/// One SplitMix64 output for `x` (Steele, Lea and Flood 2014; the finaliser of `java.util.SplittableRandom`).
pub(crate) fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The generator for `(domain, keys)`: the keys are absorbed with SplitMix64, then four more
/// SplitMix64 outputs give the 128-bit PCG state and stream.
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

/// A uniform integer in `0..n` (`n >= 1`) without modulo bias: draws are rejected below
/// `2^64 mod n`.
pub(crate) fn below(rng: &mut Pcg64, n: u64) -> u64 {
    assert!(n >= 1, "below(0)");
    let reject_under = n.wrapping_neg() % n;
    loop {
        let x = rng.next_u64();
        if x >= reject_under {
            return x % n;
        }
    }
}

/// `k` distinct elements of `pool`, uniformly among all `k`-subsets (a partial Fisher-Yates
/// shuffle), in draw order.
pub(crate) fn choose(rng: &mut Pcg64, pool: &[usize], k: usize) -> Vec<usize> {
    let mut v = pool.to_vec();
    let k = k.min(v.len());
    for i in 0..k {
        let j = i + below(rng, (v.len() - i) as u64) as usize;
        v.swap(i, j);
    }
    v.truncate(k);
    v
}

/// FNV-1a 64 of a tag, for domain constants.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_reference_value() {
        // SplitMix64 seeded with 0: first output of the reference generator.
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn below_stays_in_range() {
        let mut g = generator(1, &[2, 3]);
        for n in 1..50u64 {
            for _ in 0..20 {
                assert!(below(&mut g, n) < n);
            }
        }
    }

    #[test]
    fn choose_returns_distinct_pool_members() {
        let mut g = generator(7, &[]);
        let pool = [4, 8, 15, 16, 23, 42];
        let c = choose(&mut g, &pool, 4);
        assert_eq!(c.len(), 4);
        let mut s = c.clone();
        s.sort_unstable();
        s.dedup();
        assert_eq!(s.len(), 4);
        assert!(c.iter().all(|x| pool.contains(x)));
    }
}
