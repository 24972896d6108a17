//! Sidecar write/read throughput (MB/s) for one Qwen-Image 384x384 prompt group: 8 candidates,
//! 3 consecutive trained steps (4 stored latents of 576 tokens x 64 channels, bf16), and a
//! 512-token x 3584 text conditioning in bf16 — about 6 MB per group.
//!
//! `cargo bench -p trajectory --bench sidecar_io`. `write` is the full atomic path (tmp, fsync,
//! rename, directory fsync), so it measures the disk as much as the code; `encode`/`decode`
//! are the in-memory halves.

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::collections::BTreeMap;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use half::bf16;
use sde_math::StorageDtype;
use trajectory::{
    Candidate, Common, Conditions, Digest, StoredTensor, Tracks, Trajectory, decode, encode,
    read_sidecar, write_sidecar,
};

fn bf16_values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            bf16::from_f32(((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.4).to_f32()
        })
        .collect()
}

fn qwen_image_group() -> Trajectory {
    let (g, l, tokens, channels) = (8usize, 4usize, 576usize, 64usize);
    let (text_tokens, text_dim) = (512usize, 3584usize);
    let sigmas: Vec<f32> = (0..=12).map(|i| 1.0 - i as f32 / 12.0).collect();
    Trajectory {
        common: Common {
            task: "t2i".into(),
            rollout_id: 42,
            group_index: 7,
            height: 384,
            width: 384,
            sigmas,
            sde_indices: vec![3, 4, 5],
            storage: StorageDtype::Bf16,
            sampling_fingerprint: Digest::sha256(b"sampling"),
            weight_manifest_hash: Digest::sha256(b"weights"),
            candidates: (0..g as u64)
                .map(|slot| Candidate {
                    sample_id: format!("prompt:pickapic_0000001:sample:{slot}"),
                    sample_index: 7 * 8 + slot,
                    policy_version: 42,
                    seed_hash: slot,
                })
                .collect(),
        },
        conditions: Conditions {
            text_embeddings: StoredTensor::from_f32(
                "text",
                &bf16_values(1, text_tokens * text_dim),
                vec![text_tokens, text_dim],
                StorageDtype::Bf16,
            )
            .unwrap(),
            text_mask: vec![true; text_tokens],
            extra: BTreeMap::new(),
        },
        tracks: Tracks {
            latents: StoredTensor::from_f32(
                "latents",
                &bf16_values(2, g * l * tokens * channels),
                vec![g, l, tokens, channels],
                StorageDtype::Bf16,
            )
            .unwrap(),
            log_probs: vec![-1.5; g * 3],
            endpoint: None,
        },
    }
}

fn sidecar(c: &mut Criterion) {
    let traj = qwen_image_group();
    let bytes = encode(&traj).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("group_00000007.safetensors");
    write_sidecar(&path, &traj).unwrap();

    let mut group = c.benchmark_group("sidecar/qwen_image_384_group");
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    group.sample_size(20);
    group.bench_function("encode", |b| b.iter(|| encode(&traj).unwrap()));
    group.bench_function("decode", |b| {
        b.iter(|| decode(&bytes, std::path::Path::new("bench")).unwrap())
    });
    group.bench_function("write_atomic_fsync", |b| {
        b.iter(|| write_sidecar(&path, &traj).unwrap())
    });
    group.bench_function("read_validated", |b| {
        b.iter(|| read_sidecar(&path).unwrap())
    });
    group.finish();
}

criterion_group!(benches, sidecar);
criterion_main!(benches);
