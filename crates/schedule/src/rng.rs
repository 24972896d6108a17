//! The seeded generator behind every random plan: PCG-XSL-RR 128/64, its 128-bit state and
//! stream derived from integer keys by SplitMix64 ([`keyed_rng::PcgStream::keyed`]), and the
//! subset draw the plans make with it.
//!
//! Why not numpy's `default_rng(rollout_id)`: reproducing numpy's `SeedSequence` and its
//! `choice` bit for bit would tie every engine to numpy's internals. Our draws are instead a
//! documented pure function of `(domain, keys)`, identical on every rank, engine and platform
//! (integer arithmetic only), and the golden tests pin their bits. They are not numpy's bits.

use keyed_rng::PcgStream;

/// `k` distinct elements of `pool`, uniformly among all `k`-subsets (a partial Fisher-Yates
/// shuffle), in draw order.
pub(crate) fn choose(rng: &mut PcgStream, pool: &[usize], k: usize) -> Vec<usize> {
    let mut v = pool.to_vec();
    let k = k.min(v.len());
    for i in 0..k {
        let j = i + rng.below((v.len() - i) as u64) as usize;
        v.swap(i, j);
    }
    v.truncate(k);
    v
}

#[cfg(test)]
mod tests {
    use keyed_rng::splitmix64;

    use super::*;

    #[test]
    fn splitmix_reference_value() {
        // SplitMix64 seeded with 0: first output of the reference generator.
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn below_stays_in_range() {
        let mut g = PcgStream::keyed(1, &[2, 3]);
        for n in 1..50u64 {
            for _ in 0..20 {
                assert!(g.below(n) < n);
            }
        }
    }

    #[test]
    fn choose_returns_distinct_pool_members() {
        let mut g = PcgStream::keyed(7, &[]);
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
