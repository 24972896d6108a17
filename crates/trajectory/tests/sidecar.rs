//! The sidecar format: bit-exact round trips, rejection of truncated and corrupted files with
//! typed errors, and atomic writes.

mod support;

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use proptest::prelude::*;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use sde_math::{Kernel, StepSigmas, StorageDtype};
use support::{Rng, random_trajectory};
use trajectory::{
    Candidate, Common, Conditions, Digest, StoredTensor, Tracks, Trajectory, TrajectoryError,
    decode, encode, read_sidecar, stage_sidecar, write_sidecar,
};

const STORAGES: [StorageDtype; 3] = [StorageDtype::F32, StorageDtype::Bf16, StorageDtype::F16];

fn small(storage: StorageDtype) -> Trajectory {
    random_trajectory(7, storage)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// write -> read is bit-exact for every storage precision, and so is a second round.
    #[test]
    fn round_trip_is_bit_exact(seed in any::<u64>(), which in 0usize..3) {
        let traj = random_trajectory(seed, STORAGES[which]);
        let bytes = encode(&traj).unwrap();
        let back = decode(&bytes, Path::new("mem")).unwrap();
        prop_assert_eq!(&back, &traj);
        prop_assert_eq!(back.tracks.latents.bytes(), traj.tracks.latents.bytes());
        let again = decode(&encode(&back).unwrap(), Path::new("mem")).unwrap();
        prop_assert_eq!(again, traj);
    }
}

#[test]
fn round_trip_through_files_for_every_dtype() {
    let dir = tempfile::tempdir().unwrap();
    for (i, storage) in STORAGES.into_iter().enumerate() {
        for seed in 0..8 {
            let traj = random_trajectory(seed * 31 + i as u64, storage);
            let path = dir.path().join(format!("group_{i}_{seed}.safetensors"));
            let written = write_sidecar(&path, &traj).unwrap();
            assert_eq!(written.bytes, fs::metadata(&path).unwrap().len());
            let back = read_sidecar(&path).unwrap();
            assert_eq!(back, traj);
            // f32 view of the latents is bit-identical to the values stored
            let a: Vec<u32> = back
                .tracks
                .latents
                .to_f32()
                .iter()
                .map(|v| v.to_bits())
                .collect();
            let b: Vec<u32> = traj
                .tracks
                .latents
                .to_f32()
                .iter()
                .map(|v| v.to_bits())
                .collect();
            assert_eq!(a, b);
        }
    }
}

/// The sampler scores samples rounded to the storage precision; the sidecar stores those bits;
/// replay reads them back and scores them again: bit-identical log-probs, for every precision.
#[test]
fn replay_scores_exactly_what_was_stored() {
    let dev = Default::default();
    let kernel = Kernel::flow_sde(0.7).unwrap();
    let sigmas = vec![1.0f32, 0.8, 0.6, 0.4, 0.2, 0.0];
    let sde_indices = vec![1usize, 2];
    let (g, n) = (3usize, 8usize);
    for storage in STORAGES {
        let mut r = Rng::new(11);
        let normal = |r: &mut Rng| -> Tensor<Flex, 2> {
            let v: Vec<f32> = (0..g * n)
                .map(|_| (r.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0)
                .collect();
            Tensor::from_data(TensorData::new(v, [g, n]), &dev)
        };
        let x1 = storage.round_trip(normal(&mut r));
        let v1 = normal(&mut r);
        let v2 = normal(&mut r);
        let step = |k: usize| StepSigmas::from_schedule(&sigmas, k).unwrap().into();
        let t1 = kernel
            .sample(&step(1), v1.clone(), x1.clone(), normal(&mut r), storage)
            .unwrap();
        let t2 = kernel
            .sample(
                &step(2),
                v2.clone(),
                t1.prev_sample.clone(),
                normal(&mut r),
                storage,
            )
            .unwrap();
        let tracks = Tracks::from_rollout(
            &[x1.clone(), t1.prev_sample.clone(), t2.prev_sample.clone()],
            &[t1.log_prob.clone(), t2.log_prob.clone()],
            storage,
        )
        .unwrap();
        let mut traj = small(storage);
        traj.common.sigmas = sigmas.clone();
        traj.common.sde_indices = sde_indices.clone();
        traj.common.candidates = (0..g)
            .map(|slot| Candidate {
                sample_id: format!("s{slot}"),
                sample_index: slot as u64,
                policy_version: 0,
                seed_hash: 0,
            })
            .collect();
        traj.tracks = tracks;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("group_00000000.safetensors");
        write_sidecar(&path, &traj).unwrap();
        let back = read_sidecar(&path).unwrap();
        for (trained, (v, sampled)) in [(v1.clone(), &t1), (v2.clone(), &t2)]
            .into_iter()
            .enumerate()
        {
            let inputs = back.replay_inputs::<Flex, 2>(trained, 0..g, &dev).unwrap();
            assert_eq!(inputs.step_index, sde_indices[trained]);
            let replayed = kernel
                .replay(
                    &inputs.sigmas.into(),
                    v,
                    inputs.sample,
                    inputs.prev_sample,
                    storage,
                )
                .unwrap();
            let bits = |t: Tensor<Flex, 1>| -> Vec<u32> {
                t.into_data()
                    .to_vec::<f32>()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect()
            };
            assert_eq!(
                bits(replayed.log_prob),
                bits(sampled.log_prob.clone()),
                "{storage:?}"
            );
            assert_eq!(
                bits(inputs.rollout_log_prob),
                bits(sampled.log_prob.clone())
            );
        }
    }
}

#[test]
fn values_the_precision_cannot_hold_are_refused() {
    let err = StoredTensor::from_f32("x", &[0.1], vec![1], StorageDtype::Bf16).unwrap_err();
    assert!(
        matches!(err, TrajectoryError::NotRepresentable { index: 0, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("round_trip"));
    let err =
        StoredTensor::from_f32("x", &[1.0, f32::NAN], vec![2], StorageDtype::F32).unwrap_err();
    assert!(
        matches!(err, TrajectoryError::NonFinite { index: 1, .. }),
        "{err}"
    );
    let err = StoredTensor::from_f32("x", &[1.0], vec![1], StorageDtype::Native).unwrap_err();
    assert!(
        matches!(err, TrajectoryError::NativeStorage { .. }),
        "{err}"
    );
    let err = StoredTensor::from_f32("x", &[1.0], vec![2], StorageDtype::F32).unwrap_err();
    assert!(matches!(err, TrajectoryError::ByteLength { .. }), "{err}");
    // 70000 overflows f16
    let err = StoredTensor::from_f32("x", &[70000.0], vec![1], StorageDtype::F16).unwrap_err();
    assert!(
        matches!(err, TrajectoryError::NotRepresentable { .. }),
        "{err}"
    );
    // raw bytes holding a NaN are refused too
    let err =
        StoredTensor::from_bytes("x", vec![0x00, 0x7E], vec![1], StorageDtype::F16).unwrap_err();
    assert!(matches!(err, TrajectoryError::NonFinite { .. }), "{err}");
}

#[test]
fn invalid_records_are_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("group_00000000.safetensors");
    let base = small(StorageDtype::Bf16);
    type Mutation = Box<dyn Fn(&mut Trajectory)>;
    let cases: Vec<(&str, Mutation)> = vec![
        ("no candidates", Box::new(|t| t.common.candidates.clear())),
        (
            "no trained steps",
            Box::new(|t| t.common.sde_indices.clear()),
        ),
        ("increasing sigmas", Box::new(|t| t.common.sigmas.reverse())),
        (
            "sde index past the end",
            Box::new(|t| {
                let n = t.common.num_steps();
                t.common.sde_indices = vec![n];
            }),
        ),
        ("zero height", Box::new(|t| t.common.height = 0)),
        (
            "native storage",
            Box::new(|t| t.common.storage = StorageDtype::Native),
        ),
        (
            "latent precision",
            Box::new(|t| t.common.storage = StorageDtype::F16),
        ),
        (
            "log-prob count",
            Box::new(|t| {
                t.tracks.log_probs.pop();
            }),
        ),
        (
            "non-finite log-prob",
            Box::new(|t| t.tracks.log_probs[0] = f32::NAN),
        ),
        (
            "mask length",
            Box::new(|t| t.conditions.text_mask.push(true)),
        ),
        (
            "endpoint shape",
            Box::new(|t| {
                let st = t.tracks.latents.storage();
                t.tracks.endpoint =
                    Some(StoredTensor::from_f32("e", &[0.5], vec![1, 1], st).unwrap());
            }),
        ),
        (
            "endpoint precision",
            Box::new(|t| {
                let mut shape = vec![t.num_candidates()];
                shape.extend_from_slice(t.tracks.latent_shape());
                let n = shape.iter().product();
                t.tracks.endpoint = Some(
                    StoredTensor::from_f32("e", &vec![0.5; n], shape, StorageDtype::F32).unwrap(),
                );
            }),
        ),
        ("bad task", Box::new(|t| t.common.task = "../up".into())),
        (
            "empty sample id",
            Box::new(|t| t.common.candidates[0].sample_id.clear()),
        ),
    ];
    for (what, mutate) in cases {
        let mut t = base.clone();
        mutate(&mut t);
        let err = write_sidecar(&path, &t).unwrap_err();
        assert!(!path.exists(), "{what}: nothing may be written");
        assert!(
            matches!(
                err,
                TrajectoryError::InvalidRecord { .. }
                    | TrajectoryError::NativeStorage { .. }
                    | TrajectoryError::InvalidTask { .. }
            ),
            "{what}: {err}"
        );
        if let TrajectoryError::InvalidRecord { path: p, .. } = &err {
            assert_eq!(
                p.as_deref(),
                Some(path.as_path()),
                "{what}: the error names the file"
            );
        }
    }
}

/// A sidecar cut at any byte is rejected as truncated.
#[test]
fn truncated_at_any_byte_is_rejected() {
    for storage in STORAGES {
        truncated_at_any_byte(&encode(&small(storage)).unwrap());
    }
}

fn truncated_at_any_byte(bytes: &[u8]) {
    for cut in 0..bytes.len() {
        match decode(&bytes[..cut], Path::new("g.safetensors")) {
            Err(TrajectoryError::Truncated {
                file_len, needed, ..
            }) => {
                assert_eq!(file_len, cut as u64);
                assert!(needed > file_len);
            }
            other => panic!("cut at {cut} of {}: {other:?}", bytes.len()),
        }
    }
    assert!(decode(bytes, Path::new("g.safetensors")).is_ok());
}

#[test]
fn truncated_file_error_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("group_00000001.safetensors");
    write_sidecar(&path, &small(StorageDtype::F16)).unwrap();
    let full = fs::read(&path).unwrap();
    let len = full.len() as u64;
    for cut in [0, 5, 8, 40, len / 2, len - 1] {
        fs::write(&path, &full).unwrap();
        let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(cut).unwrap();
        drop(f);
        let err = read_sidecar(&path).unwrap_err();
        assert!(matches!(err, TrajectoryError::Truncated { .. }), "{err}");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
    }
    let err = read_sidecar(&dir.path().join("absent.safetensors")).unwrap_err();
    assert!(
        matches!(err, TrajectoryError::Io { op: "read", .. }),
        "{err}"
    );
}

/// Flipping any bit of the length prefix or the JSON header never yields a valid read.
#[test]
fn corrupted_header_is_rejected() {
    let bytes = encode(&small(StorageDtype::Bf16)).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut kinds: HashMap<&'static str, usize> = HashMap::new();
    for i in 0..8 + n {
        for bit in 0..8 {
            let mut b = bytes.clone();
            b[i] ^= 1 << bit;
            let err = match decode(&b, Path::new("g.safetensors")) {
                Ok(_) => panic!("flipping bit {bit} of byte {i} gave a valid sidecar"),
                Err(e) => e,
            };
            let kind = match err {
                TrajectoryError::Truncated { .. } => "truncated",
                TrajectoryError::CorruptHeader { .. } => "corrupt header",
                TrajectoryError::TrailingBytes { .. } => "trailing bytes",
                TrajectoryError::ChecksumMismatch { .. } => "checksum",
                TrajectoryError::MissingKey { .. } | TrajectoryError::UnexpectedKey { .. } => "key",
                TrajectoryError::MissingMetadata { .. }
                | TrajectoryError::UnexpectedMetadata { .. }
                | TrajectoryError::InvalidMetadata { .. } => "metadata",
                TrajectoryError::UnknownVersion { .. } => "version",
                TrajectoryError::DtypeMismatch { .. } | TrajectoryError::ShapeMismatch { .. } => {
                    "dtype/shape"
                }
                TrajectoryError::InvalidRecord { .. } | TrajectoryError::NonFinite { .. } => {
                    "record"
                }
                other => panic!("unexpected error kind for byte {i} bit {bit}: {other}"),
            };
            *kinds.entry(kind).or_default() += 1;
        }
    }
    assert!(
        kinds["corrupt header"] > 0 && kinds["checksum"] > 0,
        "{kinds:?}"
    );
}

#[test]
fn corrupted_data_fails_the_content_hash() {
    let bytes = encode(&small(StorageDtype::F32)).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    for i in (8 + n..bytes.len()).step_by(7) {
        let mut b = bytes.clone();
        b[i] ^= 0x01;
        let err = decode(&b, Path::new("g.safetensors")).unwrap_err();
        assert!(
            matches!(err, TrajectoryError::ChecksumMismatch { .. }),
            "byte {i}: {err}"
        );
    }
}

/// The raw pieces of a sidecar, to build deliberately broken ones.
struct Raw {
    meta: HashMap<String, String>,
    tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)>,
}

impl Raw {
    fn of(bytes: &[u8]) -> Self {
        let (_, m) = SafeTensors::read_metadata(bytes).unwrap();
        let st = SafeTensors::deserialize(bytes).unwrap();
        let mut tensors: Vec<_> = st
            .tensors()
            .into_iter()
            .map(|(k, v)| (k, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
            .collect();
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        Self {
            meta: m.metadata().clone().unwrap().into_iter().collect(),
            tensors,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let views: Vec<(String, TensorView<'_>)> = self
            .tensors
            .iter()
            .map(|(k, d, s, b)| (k.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize(views, Some(self.meta.clone().into_iter().collect())).unwrap()
    }

    fn tensor(&mut self, key: &str) -> &mut (String, Dtype, Vec<usize>, Vec<u8>) {
        self.tensors.iter_mut().find(|t| t.0 == key).unwrap()
    }
}

#[test]
fn typed_errors_name_the_file_and_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("group_00000002.safetensors");
    let traj = small(StorageDtype::Bf16);
    let good = encode(&traj).unwrap();
    let check = |raw: &Raw, pred: &dyn Fn(&TrajectoryError) -> bool, what: &str| {
        fs::write(&path, raw.bytes()).unwrap();
        let err = read_sidecar(&path).unwrap_err();
        assert!(pred(&err), "{what}: got {err:?}");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{what}: {err}"
        );
    };

    let mut raw = Raw::of(&good);
    raw.meta.insert("format_version".into(), "2".into());
    check(
        &raw,
        &|e| matches!(e, TrajectoryError::UnknownVersion { found, supported: 1, .. } if found == "2"),
        "version 2",
    );

    let mut raw = Raw::of(&good);
    raw.meta.remove("format_version");
    check(
        &raw,
        &|e| {
            matches!(
                e,
                TrajectoryError::MissingMetadata {
                    key: "format_version",
                    ..
                }
            )
        },
        "no version",
    );

    let mut raw = Raw::of(&good);
    raw.meta.insert("comment".into(), "hi".into());
    check(
        &raw,
        &|e| matches!(e, TrajectoryError::UnexpectedMetadata { key, .. } if key == "comment"),
        "extra metadata",
    );

    let mut raw = Raw::of(&good);
    raw.meta.insert("rollout_id".into(), "-1".into());
    check(
        &raw,
        &|e| {
            matches!(
                e,
                TrajectoryError::InvalidMetadata {
                    key: "rollout_id",
                    ..
                }
            )
        },
        "negative rollout id",
    );

    let mut raw = Raw::of(&good);
    raw.meta
        .insert("sample_ids".into(), "[\"only one\"]".into());
    if traj.num_candidates() != 1 {
        check(
            &raw,
            &|e| {
                matches!(
                    e,
                    TrajectoryError::InvalidMetadata {
                        key: "sample_ids",
                        ..
                    }
                )
            },
            "sample id count",
        );
    }

    let mut raw = Raw::of(&good);
    raw.tensors.retain(|t| t.0 != "common.sigmas");
    check(
        &raw,
        &|e| matches!(e, TrajectoryError::MissingKey { key, .. } if key == "common.sigmas"),
        "missing key",
    );

    let mut raw = Raw::of(&good);
    raw.tensors
        .push(("tracks.noise".into(), Dtype::F32, vec![1], vec![0; 4]));
    check(
        &raw,
        &|e| matches!(e, TrajectoryError::UnexpectedKey { key, .. } if key == "tracks.noise"),
        "unexpected key",
    );

    let mut raw = Raw::of(&good);
    {
        let t = raw.tensor("tracks.log_probs");
        t.1 = Dtype::F16;
        let half = t.3.len() / 2;
        t.3.truncate(half);
    }
    check(
        &raw,
        &|e| matches!(e, TrajectoryError::DtypeMismatch { key, .. } if key == "tracks.log_probs"),
        "dtype",
    );

    let mut raw = Raw::of(&good);
    {
        let t = raw.tensor("tracks.latents");
        t.1 = Dtype::F16; // same size as bf16, but not the declared storage precision
    }
    check(
        &raw,
        &|e| matches!(e, TrajectoryError::DtypeMismatch { key, .. } if key == "tracks.latents"),
        "latent dtype",
    );

    let mut raw = Raw::of(&good);
    {
        let t = raw.tensor("tracks.log_probs");
        let n: usize = t.2.iter().product();
        t.2 = vec![n];
    }
    check(
        &raw,
        &|e| matches!(e, TrajectoryError::ShapeMismatch { key, .. } if key == "tracks.log_probs"),
        "shape",
    );

    let mut raw = Raw::of(&good);
    {
        let t = raw.tensor("conditions.text_mask");
        t.3.push(1);
        t.2 = vec![t.3.len()];
    }
    check(
        &raw,
        &|e| matches!(e, TrajectoryError::ShapeMismatch { key, .. } if key == "conditions.text_mask"),
        "mask shape",
    );

    let mut raw = Raw::of(&good);
    raw.tensor("tracks.log_probs").3[0] ^= 0x10;
    check(
        &raw,
        &|e| matches!(e, TrajectoryError::ChecksumMismatch { .. }),
        "checksum",
    );

    let mut bytes = good.clone();
    bytes.extend_from_slice(&[0; 3]);
    fs::write(&path, &bytes).unwrap();
    let err = read_sidecar(&path).unwrap_err();
    assert!(
        matches!(err, TrajectoryError::TrailingBytes { .. }),
        "{err}"
    );
}

/// A crash after the temporary file is written but before the rename leaves the previous
/// sidecar readable and unchanged; the next write goes through.
#[test]
fn crash_between_write_and_rename_keeps_the_previous_state() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("group_00000000.safetensors");
    let v1 = random_trajectory(1, StorageDtype::Bf16);
    let v2 = random_trajectory(2, StorageDtype::Bf16);
    let v3 = random_trajectory(3, StorageDtype::F16);
    write_sidecar(&path, &v1).unwrap();
    let before = fs::read(&path).unwrap();

    let staged = stage_sidecar(&path, &v2).unwrap();
    let tmp = staged.tmp_path().to_path_buf();
    assert!(tmp.exists());
    // simulated crash: the process dies here, nothing runs after the fsync of the tmp file
    std::mem::forget(staged);

    assert_eq!(fs::read(&path).unwrap(), before);
    assert_eq!(read_sidecar(&path).unwrap(), v1);
    assert!(tmp.exists(), "the crash leaves the temporary file behind");

    write_sidecar(&path, &v3).unwrap();
    assert_eq!(read_sidecar(&path).unwrap(), v3);
    assert!(
        !tmp.exists(),
        "the next write replaced and renamed the temporary file"
    );

    // an aborted (dropped) staged write leaves the destination as it was and cleans up
    let staged = stage_sidecar(&path, &v1).unwrap();
    drop(staged);
    assert!(!tmp.exists());
    assert_eq!(read_sidecar(&path).unwrap(), v3);
}

/// A write that cannot happen names the file and the operation ([`TrajectoryError::Io`]), and
/// leaves no temporary file behind.
#[test]
fn a_failed_write_names_the_path_and_the_operation() {
    let dir = tempfile::tempdir().unwrap();
    // a regular file where the sidecar's directory should be
    let blocker = dir.path().join("rollout_00000001");
    fs::write(&blocker, b"not a directory").unwrap();
    let path = blocker.join("group_00000000.safetensors");
    let err = write_sidecar(&path, &random_trajectory(1, StorageDtype::F32)).unwrap_err();
    match &err {
        TrajectoryError::Io { path: p, op, .. } => {
            assert_eq!((p.as_path(), *op), (blocker.as_path(), "create directory"));
        }
        other => panic!("expected TrajectoryError::Io, got {other:?}"),
    }
    assert!(err.to_string().contains("rollout_00000001"), "{err}");

    // renaming over a directory fails after the temporary file was written; it is removed
    let sub = dir.path().join("group_00000001.safetensors");
    fs::create_dir(&sub).unwrap();
    fs::write(sub.join("inner"), b"x").unwrap();
    let err = trajectory::write_atomic(&sub, b"bytes").unwrap_err();
    assert!(
        matches!(&err, TrajectoryError::Io { path, op: "rename into place", .. } if *path == sub),
        "{err:?}"
    );
    assert!(!trajectory::sidecar::tmp_path(&sub).exists());
}

/// The record constructed in memory by hand, with extra conditioning, reads back equal.
#[test]
fn hand_built_record_round_trips() {
    let storage = StorageDtype::F16;
    let traj = Trajectory {
        common: Common {
            task: "t2i".into(),
            rollout_id: 0,
            group_index: 3,
            height: 384,
            width: 256,
            sigmas: vec![1.0, 0.5, 0.0],
            sde_indices: vec![1],
            storage,
            sampling_fingerprint: Digest::sha256(b"cfg"),
            weight_manifest_hash: Digest::sha256(b"w"),
            candidates: vec![Candidate {
                sample_id: "prompt:0:sample:0".into(),
                sample_index: 0,
                policy_version: 0,
                seed_hash: u64::MAX,
            }],
        },
        conditions: Conditions {
            text_embeddings: StoredTensor::from_f32(
                "t",
                &[0.0, -0.0],
                vec![1, 2],
                StorageDtype::F32,
            )
            .unwrap(),
            text_mask: vec![true],
            extra: [(
                "pooled".to_string(),
                StoredTensor::from_f32("p", &[1.5], vec![1, 1], StorageDtype::Bf16).unwrap(),
            )]
            .into(),
        },
        tracks: Tracks {
            latents: StoredTensor::from_f32("l", &[0.25, -65504.0], vec![1, 2, 1], storage)
                .unwrap(),
            log_probs: vec![-3.5],
            endpoint: None,
        },
    };
    let back = decode(&encode(&traj).unwrap(), Path::new("m")).unwrap();
    assert_eq!(back, traj);
    // signed zero survives
    assert_eq!(
        back.conditions.text_embeddings.to_f32()[1].to_bits(),
        (-0.0f32).to_bits()
    );
    assert_eq!(back.latent(0, 2).unwrap(), vec![-65504.0]);
    assert!(back.latent(0, 0).is_err());
    assert!(back.rollout_log_prob(1, 0).is_err());
}

/// A record can carry its candidates' clean endpoints: `with_endpoint` rounds them to the
/// storage precision, the sidecar round-trips them bit for bit, and a record without them
/// reads back without them.
#[test]
fn clean_endpoints_round_trip_rounded_to_the_storage_precision() {
    let traj = small(StorageDtype::Bf16);
    let mut shape = vec![traj.num_candidates()];
    shape.extend_from_slice(traj.tracks.latent_shape());
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n).map(|i| 1.0 + i as f32 / 1024.0).collect();
    let x0 =
        Tensor::<Flex, 1>::from_data(TensorData::new(values.clone(), [n]), &Default::default());
    let x0 = match shape.len() {
        3 => x0.reshape([shape[0], shape[1], shape[2]]),
        _ => panic!("the support records have [tokens, channels] latents: {shape:?}"),
    };
    let mut with = traj.clone();
    with.tracks = with.tracks.with_endpoint(x0, StorageDtype::Bf16).unwrap();
    let stored = with.tracks.endpoint.clone().unwrap().to_f32();
    for (s, v) in stored.iter().zip(&values) {
        assert_eq!(*s, half::bf16::from_f32(*v).to_f32(), "rounded to bf16");
    }
    let back = decode(&encode(&with).unwrap(), Path::new("mem")).unwrap();
    assert_eq!(back, with);
    let without = decode(&encode(&traj).unwrap(), Path::new("mem")).unwrap();
    assert!(without.tracks.endpoint.is_none());
    // a wrong shape is refused when the tracks are built
    let bad = Tensor::<Flex, 3>::zeros([1, 1, 1], &Default::default());
    let err = traj
        .tracks
        .clone()
        .with_endpoint(bad, StorageDtype::Bf16)
        .unwrap_err();
    assert!(err.to_string().contains("tracks.endpoint"), "{err}");
}

/// A deterministic (ODE) rollout's record: no trained SDE step, empty latents and log-probs,
/// and the endpoints, which round-trip; without the endpoints such a record is refused.
#[test]
fn an_ode_rollout_record_holds_its_endpoints_alone() {
    let traj = small(StorageDtype::Bf16);
    let mut shape = vec![traj.num_candidates()];
    shape.extend_from_slice(traj.tracks.latent_shape());
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n).map(|i| 0.5 - i as f32 / 256.0).collect();
    let x0 = Tensor::<Flex, 1>::from_data(TensorData::new(values, [n]), &Default::default())
        .reshape([shape[0], shape[1], shape[2]]);
    let mut ode = traj.clone();
    ode.common.sde_indices = Vec::new();
    ode.tracks = Tracks::endpoint_only(x0, StorageDtype::Bf16).unwrap();
    assert_eq!(
        ode.tracks.latents.shape(),
        &[shape[0], 0, shape[1], shape[2]]
    );
    assert_eq!(ode.tracks.latent_shape(), &shape[1..]);
    ode.validate().unwrap();
    let back = decode(&encode(&ode).unwrap(), Path::new("mem")).unwrap();
    assert_eq!(back, ode);
    let mut without = ode.clone();
    without.tracks.endpoint = None;
    let err = without.validate().unwrap_err().to_string();
    assert!(err.contains("no endpoint"), "{err}");
}
