//! Artifact layout, retention, candidate manifests and sampling fingerprints.

mod support;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use sde_math::StorageDtype;
use serde::Serialize;
use support::random_trajectory;
use trajectory::{
    ArtifactLayout, CandidateManifest, Digest, Retention, Split, TrajectoryError,
    sampling_fingerprint, write_atomic, write_sidecar,
};

fn make_rollouts(layout: &ArtifactLayout, split: Split, ids: impl IntoIterator<Item = u64>) {
    for id in ids {
        let dir = layout.rollout_dir(split, id);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("group_00000000.safetensors"), b"x").unwrap();
    }
}

fn ids(layout: &ArtifactLayout, split: Split) -> Vec<u64> {
    layout
        .rollouts(split)
        .unwrap()
        .iter()
        .map(|r| r.id)
        .collect()
}

#[test]
fn paths_follow_the_documented_layout() {
    let l = ArtifactLayout::new("root", "t2i").unwrap();
    assert_eq!(l.task_dir(Split::Train), Path::new("root/t2i"));
    assert_eq!(l.task_dir(Split::Eval), Path::new("root/eval/t2i"));
    assert_eq!(
        l.sidecar_path(Split::Train, 0, 0),
        Path::new("root/t2i/rollout_0000000/group_00000000.safetensors")
    );
    assert_eq!(
        l.sample_image_path(Split::Eval, 12, 3, 7),
        Path::new("root/eval/t2i/rollout_0000012/group_00000003_sample_0007.png")
    );
    // ids wider than the padding keep every digit
    assert_eq!(
        l.rollout_dir(Split::Train, 123_456_789),
        Path::new("root/t2i/rollout_123456789")
    );
}

#[test]
fn task_names_must_be_one_safe_path_component() {
    for bad in ["", ".", "..", "a/b", "eval", "t 2 i", "t2i\0"] {
        let err = ArtifactLayout::new("root", bad).unwrap_err();
        assert!(
            matches!(err, TrajectoryError::InvalidTask { .. }),
            "{bad:?}: {err}"
        );
    }
    for good in ["t2i", "T2I-hq", "edit.v2", "a_b"] {
        assert!(ArtifactLayout::new("root", good).is_ok(), "{good}");
    }
}

#[test]
fn retention_keeps_exactly_the_last_n() {
    for keep in [1i64, 2, 3, 9, 10, 11, 50] {
        let dir = tempfile::tempdir().unwrap();
        let l = ArtifactLayout::new(dir.path(), "t2i").unwrap();
        make_rollouts(&l, Split::Train, 0..10);
        let report = l.prune(Split::Train, Retention::keep_last(keep)).unwrap();
        let expect_kept: Vec<u64> = (10u64.saturating_sub(keep as u64)..10).collect();
        let expect_removed: Vec<u64> = (0..10u64.saturating_sub(keep as u64)).collect();
        assert_eq!(report.kept, expect_kept, "keep {keep}");
        assert_eq!(report.removed, expect_removed, "keep {keep}");
        assert_eq!(ids(&l, Split::Train), expect_kept, "keep {keep}: on disk");
    }
}

#[test]
fn retention_at_or_below_zero_keeps_everything() {
    for keep in [0i64, -1, i64::MIN] {
        let dir = tempfile::tempdir().unwrap();
        let l = ArtifactLayout::new(dir.path(), "t2i").unwrap();
        make_rollouts(&l, Split::Train, [0, 3, 7]);
        let report = l.prune(Split::Train, Retention::keep_last(keep)).unwrap();
        assert!(report.removed.is_empty());
        assert_eq!(ids(&l, Split::Train), vec![0, 3, 7]);
        let begun = l
            .begin_rollout(Split::Train, 8, Retention::keep_last(keep))
            .unwrap();
        assert!(begun.pruned.removed.is_empty());
        assert_eq!(ids(&l, Split::Train), vec![0, 3, 7, 8]);
    }
}

#[test]
fn retention_touches_only_rollout_directories() {
    let dir = tempfile::tempdir().unwrap();
    let l = ArtifactLayout::new(dir.path(), "t2i").unwrap();
    make_rollouts(&l, Split::Train, [1, 2, 3]);
    let task = l.task_dir(Split::Train);
    fs::write(task.join("rollout_0000000"), b"a file, not a directory").unwrap();
    fs::create_dir_all(task.join("rollout_x")).unwrap();
    fs::create_dir_all(task.join("tensorboard")).unwrap();
    fs::write(task.join("notes.txt"), b"keep me").unwrap();
    let outside = dir.path().join("precious");
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("data"), b"do not delete").unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(&outside, task.join("rollout_0000000.link")).unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(&outside, task.join("rollout_0000099")).unwrap();

    let report = l.prune(Split::Train, Retention::keep_last(1)).unwrap();
    assert_eq!(report.removed, vec![1, 2]);
    assert_eq!(report.kept, vec![3]);
    for kept in ["rollout_0000000", "rollout_x", "tensorboard", "notes.txt"] {
        assert!(task.join(kept).exists(), "{kept}");
    }
    assert_eq!(fs::read(outside.join("data")).unwrap(), b"do not delete");
    // eval is a separate tree with its own retention
    make_rollouts(&l, Split::Eval, [0, 1]);
    l.prune(Split::Train, Retention::keep_last(1)).unwrap();
    assert_eq!(ids(&l, Split::Eval), vec![0, 1]);
    l.prune(Split::Eval, Retention::keep_last(1)).unwrap();
    assert_eq!(ids(&l, Split::Eval), vec![1]);
}

#[test]
fn begin_rollout_reaps_then_creates_an_empty_directory() {
    let dir = tempfile::tempdir().unwrap();
    let l = ArtifactLayout::new(dir.path(), "t2i").unwrap();
    make_rollouts(&l, Split::Train, 0..5);
    // keep 2: the new rollout plus the most recent older one
    let begun = l
        .begin_rollout(Split::Train, 5, Retention::keep_last(2))
        .unwrap();
    assert_eq!(begun.pruned.removed, vec![0, 1, 2, 3]);
    assert_eq!(begun.pruned.kept, vec![4]);
    assert!(!begun.cleared_existing);
    assert_eq!(ids(&l, Split::Train), vec![4, 5]);
    assert_eq!(fs::read_dir(&begun.dir).unwrap().count(), 0);

    // a resumed run restarting at rollout 3: the abandoned timeline (4, 5) goes, and a
    // leftover directory of rollout 3 itself is emptied
    make_rollouts(&l, Split::Train, [1, 2, 3]);
    let begun = l
        .begin_rollout(Split::Train, 3, Retention::keep_last(3))
        .unwrap();
    assert!(begun.cleared_existing);
    assert_eq!(begun.pruned.removed, vec![4, 5]);
    assert_eq!(begun.pruned.kept, vec![1, 2]);
    assert_eq!(ids(&l, Split::Train), vec![1, 2, 3]);
    assert_eq!(fs::read_dir(&begun.dir).unwrap().count(), 0);

    // keep 1: only the new rollout remains
    let begun = l
        .begin_rollout(Split::Train, 4, Retention::keep_last(1))
        .unwrap();
    assert_eq!(begun.pruned.removed, vec![1, 2, 3]);
    assert_eq!(ids(&l, Split::Train), vec![4]);
}

#[test]
fn sidecar_listing_ignores_staged_files() {
    let dir = tempfile::tempdir().unwrap();
    let l = ArtifactLayout::new(dir.path(), "t2i").unwrap();
    l.begin_rollout(Split::Train, 0, Retention::keep_last(2))
        .unwrap();
    for g in [2u64, 0, 1] {
        write_sidecar(
            &l.sidecar_path(Split::Train, 0, g),
            &random_trajectory(g, StorageDtype::Bf16),
        )
        .unwrap();
    }
    let rollout = l.rollout_dir(Split::Train, 0);
    fs::write(rollout.join("group_00000003.safetensors.tmp"), b"partial").unwrap();
    write_atomic(&l.sample_image_path(Split::Train, 0, 0, 0), b"\x89PNG").unwrap();
    let listed: Vec<u64> = l
        .sidecars(Split::Train, 0)
        .unwrap()
        .into_iter()
        .map(|(g, _)| g)
        .collect();
    assert_eq!(listed, vec![0, 1, 2]);
    assert_eq!(
        fs::read(l.sample_image_path(Split::Train, 0, 0, 0)).unwrap(),
        b"\x89PNG"
    );
}

#[test]
fn manifest_round_trips_and_checks_its_sidecar() {
    let traj = random_trajectory(5, StorageDtype::Bf16);
    let slot = traj.num_candidates() - 1;
    let m = CandidateManifest::for_candidate(&traj, slot).unwrap();
    assert_eq!(m.slot as usize, slot);
    let json = m.to_json();
    let back = CandidateManifest::from_json(&json).unwrap();
    assert_eq!(back, m);
    back.check_against(&traj).unwrap();

    let mut other = m.clone();
    other.policy_version ^= 1;
    let err = other.check_against(&traj).unwrap_err();
    assert!(
        matches!(
            err,
            TrajectoryError::ManifestMismatch {
                field: "policy_version",
                ..
            }
        ),
        "{err}"
    );
    let mut other = m.clone();
    other.sampling_fingerprint = Digest::sha256(b"another config");
    let err = other.check_against(&traj).unwrap_err();
    assert!(
        matches!(
            err,
            TrajectoryError::ManifestMismatch {
                field: "sampling_fingerprint",
                ..
            }
        ),
        "{err}"
    );
    let mut other = m.clone();
    other.weight_manifest_hash = Digest::sha256(b"other weights");
    let err = other.check_against(&traj).unwrap_err();
    assert!(
        matches!(
            err,
            TrajectoryError::ManifestMismatch {
                field: "weight_manifest_hash",
                ..
            }
        ),
        "{err}"
    );
    let mut other = m.clone();
    other.slot = 99;
    assert!(matches!(
        other.check_against(&traj),
        Err(TrajectoryError::OutOfRange { .. })
    ));

    let bumped = json.replace("\"format_version\":1", "\"format_version\":2");
    assert!(matches!(
        CandidateManifest::from_json(&bumped),
        Err(TrajectoryError::ManifestVersion { version: 2, .. })
    ));
    let extra = json.replacen('{', "{\"unknown\":1,", 1);
    assert!(matches!(
        CandidateManifest::from_json(&extra),
        Err(TrajectoryError::ManifestJson { .. })
    ));
    let bad_digest = json.replace("sha256:", "sha1:");
    assert!(matches!(
        CandidateManifest::from_json(&bad_digest),
        Err(TrajectoryError::ManifestJson { .. })
    ));
}

#[derive(Serialize)]
struct SamplingConfig {
    height: u32,
    width: u32,
    num_inference_steps: u32,
    eta: f32,
    sde_type: &'static str,
    sde_pool: Vec<u32>,
}

#[test]
fn sampling_fingerprint_is_canonical_and_sensitive() {
    let cfg = SamplingConfig {
        height: 384,
        width: 384,
        num_inference_steps: 12,
        eta: 0.7,
        sde_type: "sde",
        sde_pool: vec![1, 2, 3, 4, 5],
    };
    let sigmas: Vec<f32> = (0..=12).map(|i| 1.0 - i as f32 / 12.0).collect();
    let a = sampling_fingerprint(&cfg, &sigmas).unwrap();
    // the same content as a map in another insertion order: same fingerprint
    let map: serde_json::Map<String, serde_json::Value> = [
        ("sde_pool", serde_json::json!([1, 2, 3, 4, 5])),
        ("eta", serde_json::json!(0.7f32)),
        ("width", serde_json::json!(384)),
        ("sde_type", serde_json::json!("sde")),
        ("num_inference_steps", serde_json::json!(12)),
        ("height", serde_json::json!(384)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(sampling_fingerprint(&map, &sigmas).unwrap(), a);
    // any change moves it: a config field, one sigma's last bit, the schedule length
    let mut eta = cfg;
    eta.eta = 0.69;
    assert_ne!(sampling_fingerprint(&eta, &sigmas).unwrap(), a);
    let mut s2 = sigmas.clone();
    s2[5] = f32::from_bits(s2[5].to_bits() + 1);
    let cfg_map: BTreeMap<&str, i32> = BTreeMap::new();
    assert_ne!(
        sampling_fingerprint(&cfg_map, &s2).unwrap(),
        sampling_fingerprint(&cfg_map, &sigmas).unwrap()
    );
    assert_ne!(
        sampling_fingerprint(&cfg_map, &sigmas[..12]).unwrap(),
        sampling_fingerprint(&cfg_map, &sigmas).unwrap()
    );
    assert!(matches!(
        sampling_fingerprint(&cfg_map, &[1.0, f32::NAN]),
        Err(TrajectoryError::FingerprintSigma { index: 1, .. })
    ));
}
