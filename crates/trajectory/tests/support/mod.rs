//! Test helpers: a seeded generator and random valid trajectories.

#![allow(dead_code)]

use std::collections::BTreeMap;

use half::{bf16, f16};
use keyed_rng::SplitMix64;
use sde_math::StorageDtype;
use trajectory::{Candidate, Common, Conditions, Digest, StoredTensor, Tracks, Trajectory};

/// SplitMix64 ([`keyed_rng::SplitMix64`]) with the draws the tests need.
pub struct Rng(SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(SplitMix64::new(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `lo..hi` (a remainder).
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.0.below_modulo((hi - lo) as u64) as usize
    }

    /// A random finite value of the storage precision, from random bits (covers subnormals,
    /// signed zeros and the extremes).
    pub fn value(&mut self, storage: StorageDtype) -> f32 {
        let bits = self.next_u64();
        match storage {
            StorageDtype::F32 | StorageDtype::Native => {
                let mut b = bits as u32;
                if b & 0x7F80_0000 == 0x7F80_0000 {
                    b &= !0x0080_0000;
                }
                f32::from_bits(b)
            }
            StorageDtype::Bf16 => {
                let mut b = bits as u16;
                if b & 0x7F80 == 0x7F80 {
                    b &= !0x0080;
                }
                bf16::from_bits(b).to_f32()
            }
            StorageDtype::F16 => {
                let mut b = bits as u16;
                if b & 0x7C00 == 0x7C00 {
                    b &= !0x0400;
                }
                f16::from_bits(b).to_f32()
            }
        }
    }

    pub fn values(&mut self, n: usize, storage: StorageDtype) -> Vec<f32> {
        (0..n).map(|_| self.value(storage)).collect()
    }

    pub fn storage(&mut self) -> StorageDtype {
        [StorageDtype::F32, StorageDtype::Bf16, StorageDtype::F16][self.range(0, 3)]
    }
}

/// A random valid trajectory with latents at `storage`.
pub fn random_trajectory(seed: u64, storage: StorageDtype) -> Trajectory {
    let mut r = Rng::new(seed);
    let steps = r.range(2, 9);
    // strictly decreasing sigmas from 1 to 0
    let sigmas: Vec<f32> = (0..=steps).map(|i| 1.0 - i as f32 / steps as f32).collect();
    let mut sde_indices: Vec<usize> = (0..steps)
        .filter(|_| r.next_u64().is_multiple_of(2))
        .collect();
    if sde_indices.is_empty() {
        sde_indices.push(r.range(0, steps));
    }
    let g = r.range(1, 5);
    let latent_rank = r.range(1, 4);
    let latent_shape: Vec<usize> = (0..latent_rank).map(|_| r.range(1, 4)).collect();
    let mut common = Common {
        task: "t2i".into(),
        rollout_id: r.next_u64() >> 1,
        group_index: r.next_u64() % 1000,
        height: r.range(1, 2048) as u32,
        width: r.range(1, 2048) as u32,
        sigmas,
        sde_indices,
        storage,
        sampling_fingerprint: Digest::sha256(&r.next_u64().to_le_bytes()),
        weight_manifest_hash: Digest::sha256(&r.next_u64().to_le_bytes()),
        candidates: (0..g)
            .map(|slot| Candidate {
                sample_id: format!("prompt:{seed}:sample:{slot} \"quoted\" ünïcode"),
                sample_index: r.next_u64(),
                policy_version: r.next_u64(),
                seed_hash: r.next_u64(),
            })
            .collect(),
    };
    let l = common.latent_steps().len();
    let per: usize = latent_shape.iter().product();
    let mut shape = vec![g, l];
    shape.extend_from_slice(&latent_shape);
    let latents = r.values(g * l * per, storage);
    let s = common.sde_indices.len();
    let log_probs: Vec<f32> = r.values(g * s, StorageDtype::F32);
    let tokens = r.range(1, 6);
    let dim = r.range(1, 5);
    let te_storage = r.storage();
    let text = r.values(tokens * dim, te_storage);
    let mut extra = BTreeMap::new();
    for i in 0..r.range(0, 3) {
        let st = r.storage();
        let n = r.range(1, 5);
        extra.insert(
            format!("pooled_{i}"),
            StoredTensor::from_f32("extra", &r.values(n, st), vec![n], st).unwrap(),
        );
    }
    common.task = ["t2i", "t2i-hq", "edit.v2"][r.range(0, 3)].into();
    // half the records carry the candidates' clean endpoints
    let endpoint = r.next_u64().is_multiple_of(2).then(|| {
        let mut shape = vec![g];
        shape.extend_from_slice(&latent_shape);
        StoredTensor::from_f32("endpoint", &r.values(g * per, storage), shape, storage).unwrap()
    });
    Trajectory {
        common,
        conditions: Conditions {
            text_embeddings: StoredTensor::from_f32("text", &text, vec![tokens, dim], te_storage)
                .unwrap(),
            text_mask: (0..tokens)
                .map(|_| r.next_u64().is_multiple_of(2))
                .collect(),
            extra,
        },
        tracks: Tracks {
            latents: StoredTensor::from_f32("latents", &latents, shape, storage).unwrap(),
            log_probs,
            endpoint,
        },
    }
}
