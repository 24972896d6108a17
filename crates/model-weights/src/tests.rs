//! Unit tests on small safetensors files written by the tests.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use half::bf16;
use safetensors::tensor::TensorView;

use super::*;

/// `(key, dtype, shape, bytes)`.
type Owned = (String, Dtype, Vec<usize>, Vec<u8>);

fn f32s(key: &str, shape: &[usize], values: &[f32]) -> Owned {
    let b = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    (key.into(), Dtype::F32, shape.to_vec(), b)
}

fn bf16s(key: &str, shape: &[usize], values: &[f32]) -> Owned {
    let b = values
        .iter()
        .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
        .collect();
    (key.into(), Dtype::BF16, shape.to_vec(), b)
}

fn write(path: &Path, tensors: &[Owned], meta: Option<HashMap<String, String>>) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(k, d, s, b)| (k.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, meta, path).unwrap();
}

/// Three tensors with bf16-representable values.
fn model() -> Vec<(&'static str, Vec<usize>, Vec<f32>)> {
    vec![
        (
            "a.weight",
            vec![2, 3],
            vec![1.0, -2.0, 0.5, 0.25, 3.0, -0.125],
        ),
        ("a.bias", vec![2], vec![0.0, 1.5]),
        ("norm.weight", vec![3], vec![1.0, 1.0, 2.0]),
    ]
}

/// A sharded copy of [`model`] in `dir` under `layout`'s index name: `a.*` in shard 1 (bf16),
/// the rest in shard 2 (f32).
fn sharded(dir: &Path, layout: Layout) -> PathBuf {
    let m = model();
    let (one, two) = (
        "m-00001-of-00002.safetensors",
        "m-00002-of-00002.safetensors",
    );
    let first: Vec<Owned> = m[..2].iter().map(|(k, s, v)| bf16s(k, s, v)).collect();
    let second: Vec<Owned> = m[2..].iter().map(|(k, s, v)| f32s(k, s, v)).collect();
    write(&dir.join(one), &first, None);
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    write(&dir.join(two), &second, Some(meta));
    let index = serde_json::json!({
        "metadata": {"total_size": 36},
        "weight_map": {"a.weight": one, "a.bias": one, "norm.weight": two},
    });
    let path = dir.join(layout.index);
    std::fs::write(&path, index.to_string()).unwrap();
    path
}

fn single(path: &Path) {
    let t: Vec<Owned> = model().iter().map(|(k, s, v)| f32s(k, s, v)).collect();
    write(path, &t, None);
}

#[test]
fn single_files_open_by_path_and_by_directory_for_each_layout() {
    for layout in [DIFFUSERS, TRANSFORMERS] {
        let dir = tempfile::tempdir().unwrap();
        single(&dir.path().join(layout.single));
        let by_dir = Checkpoint::open(dir.path(), &[DIFFUSERS, TRANSFORMERS]).unwrap();
        let by_file = Checkpoint::open(dir.path().join(layout.single), &[]).unwrap();
        for c in [&by_dir, &by_file] {
            assert_eq!(c.num_shards(), 1);
            assert_eq!(c.index_path(), None);
            assert_eq!(
                c.keys().collect::<Vec<_>>(),
                ["a.bias", "a.weight", "norm.weight"]
            );
            assert_eq!((c.len(), c.is_empty()), (3, false));
            assert!(c.contains("a.bias") && !c.contains("b"));
            let m = c.meta("a.weight").unwrap();
            assert_eq!((m.dtype, m.shape, m.numel()), (Dtype::F32, &[2, 3][..], 6));
            assert_eq!(m.dtype_name(), "F32");
            assert_eq!(c.read_f32("a.bias").unwrap(), [0.0, 1.5]);
            assert_eq!(c.read_f64("a.bias").unwrap(), [0.0, 1.5]);
        }
        assert_eq!(by_dir.path(), dir.path());
        assert_eq!(by_file.path(), dir.path().join(layout.single));
        // the other layout's names are not looked for
        let other = if layout == DIFFUSERS {
            TRANSFORMERS
        } else {
            DIFFUSERS
        };
        match Checkpoint::open(dir.path(), &[other]).unwrap_err() {
            WeightsError::NoCheckpoint {
                dir: d,
                expected,
                variants,
            } => {
                assert_eq!(d, dir.path());
                assert_eq!(expected, [other.index, other.single]);
                assert!(variants.is_empty());
            }
            e => panic!("{e}"),
        }
    }
}

#[test]
fn variant_files_open_by_their_variant_and_are_named_when_absent() {
    let dir = tempfile::tempdir().unwrap();
    let bf16 = dir.path().join(variant_name(DIFFUSERS.single, "bf16"));
    single(&bf16);
    // The plain files are absent: the error names the variant the directory holds.
    let err = Checkpoint::open(dir.path(), &[DIFFUSERS]).unwrap_err();
    let WeightsError::NoCheckpoint { variants, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(variants, &["bf16"]);
    assert!(err.to_string().contains("variant files of bf16"), "{err}");
    let c = Checkpoint::open_variant(dir.path(), &[DIFFUSERS], Some("bf16")).unwrap();
    assert_eq!(c.path(), dir.path());
    assert!(c.contains("a.bias"));
    // A requested variant that is absent never falls back to other files.
    single(&dir.path().join(DIFFUSERS.single));
    let err = Checkpoint::open_variant(dir.path(), &[DIFFUSERS], Some("fp16")).unwrap_err();
    let WeightsError::NoCheckpoint {
        expected, variants, ..
    } = &err
    else {
        panic!("{err}")
    };
    assert!(
        expected.contains(&"diffusion_pytorch_model.fp16.safetensors".to_string()),
        "{err}"
    );
    assert!(
        expected.contains(&"diffusion_pytorch_model.safetensors.index.fp16.json".to_string()),
        "{err}"
    );
    assert_eq!(variants, &["bf16"]);
    // A sharded variant: its index under the variant's name.
    let dir = tempfile::tempdir().unwrap();
    let index = sharded(dir.path(), TRANSFORMERS);
    std::fs::rename(
        &index,
        dir.path().join(variant_name(TRANSFORMERS.index, "fp16")),
    )
    .unwrap();
    let c = Checkpoint::open_variant(dir.path(), &[TRANSFORMERS], Some("fp16")).unwrap();
    assert_eq!(c.num_shards(), 2);
}

#[test]
fn sharded_checkpoints_read_like_single_files_under_both_index_names() {
    for layout in [DIFFUSERS, TRANSFORMERS] {
        let dir = tempfile::tempdir().unwrap();
        let index = sharded(dir.path(), layout);
        single(&dir.path().join("single.safetensors"));
        let s = Checkpoint::open(dir.path(), &[layout]).unwrap();
        let one = Checkpoint::open_file(dir.path().join("single.safetensors")).unwrap();
        assert_eq!(s.num_shards(), 2);
        assert_eq!(s.index_path(), Some(index.as_path()));
        assert_eq!(s.path(), dir.path());
        assert_eq!(s.index_metadata().unwrap()["total_size"], 36);
        assert_eq!(s.keys().collect::<Vec<_>>(), one.keys().collect::<Vec<_>>());
        assert_eq!(s.meta("a.weight").unwrap().dtype, Dtype::BF16);
        for k in one.keys() {
            assert_eq!(s.read_f32(k).unwrap(), one.read_f32(k).unwrap(), "{k}");
            assert_eq!(s.meta(k).unwrap().shape, one.meta(k).unwrap().shape);
        }
        let files: Vec<_> = s.file_metadata().collect();
        assert_eq!(files.len(), 2);
        assert!(files[0].0.ends_with("m-00001-of-00002.safetensors") && files[0].1.is_none());
        assert_eq!(files[1].1.unwrap()["format"], "pt");
        assert_eq!(
            s.shard_paths().collect::<Vec<_>>(),
            files.iter().map(|f| f.0).collect::<Vec<_>>()
        );
        // the hash ignores the layout and the (bf16-representable) stored dtype
        assert_eq!(s.content_hash().unwrap(), one.content_hash().unwrap());
        let mut h = ContentHasher::new();
        for (k, shape, v) in model() {
            h.add(k, &shape, &v);
        }
        assert_eq!(one.content_hash().unwrap(), h.finish());
    }
}

#[test]
fn inconsistent_indexes_are_errors_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let index = sharded(dir.path(), TRANSFORMERS);
    let edit = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&index).unwrap()).unwrap();
        f(&mut v);
        std::fs::write(&index, v.to_string()).unwrap();
    };
    // a key its shard lacks
    edit(&|v| v["weight_map"]["norm.weight"] = "m-00001-of-00002.safetensors".into());
    match Checkpoint::open(dir.path(), &[TRANSFORMERS]).unwrap_err() {
        WeightsError::IndexMismatch { path, key, shard } => {
            assert_eq!((path, key.as_str()), (index.clone(), "norm.weight"));
            assert_eq!(shard, "m-00001-of-00002.safetensors");
        }
        e => panic!("{e}"),
    }
    // a key in two shards
    edit(&|v| v["weight_map"]["norm.weight"] = "m-00002-of-00002.safetensors".into());
    let t: Vec<Owned> = vec![
        f32s("a.bias", &[1], &[0.0]),
        f32s("norm.weight", &[3], &[0.0; 3]),
    ];
    write(&dir.path().join("m-00002-of-00002.safetensors"), &t, None);
    match Checkpoint::open_index(&index).unwrap_err() {
        WeightsError::DuplicateKey {
            key, first, second, ..
        } => {
            assert_eq!(key, "a.bias");
            assert!(first.ends_with("m-00001-of-00002.safetensors"), "{first:?}");
            assert!(
                second.ends_with("m-00002-of-00002.safetensors"),
                "{second:?}"
            );
        }
        e => panic!("{e}"),
    }
    // no weight_map; not JSON; a shard that is not safetensors
    edit(&|v| v["weight_map"] = serde_json::json!([1]));
    assert!(matches!(
        Checkpoint::open_index(&index),
        Err(WeightsError::JsonField {
            field: "weight_map",
            ..
        })
    ));
    std::fs::write(&index, "{").unwrap();
    assert!(matches!(
        Checkpoint::open_index(&index),
        Err(WeightsError::Json { .. })
    ));
    let bad = dir.path().join("bad.safetensors");
    std::fs::write(&bad, [1u8, 2, 3]).unwrap();
    match Checkpoint::open_file(&bad).unwrap_err() {
        e @ WeightsError::Safetensors { .. } => assert!(e.to_string().contains("bad.safetensors")),
        e => panic!("{e}"),
    }
    let e = Checkpoint::open_file(dir.path().join("absent.safetensors")).unwrap_err();
    assert!(matches!(&e, WeightsError::Io { path, .. } if path.ends_with("absent.safetensors")));
}

#[test]
fn reads_convert_and_name_what_they_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.safetensors");
    let ids: Vec<u8> = (0..3i64).flat_map(|i| i.to_le_bytes()).collect();
    let t = vec![
        f32s("w", &[2], &[0.1, 3.0]),
        bf16s("h", &[2], &[0.1, 3.0]),
        ("ids".to_string(), Dtype::I64, vec![3], ids),
    ];
    write(&path, &t, None);
    let c = Checkpoint::open_file(&path).unwrap();
    let want = vec![bf16::from_f32(0.1), bf16::from_f32(3.0)];
    assert_eq!(
        c.read_as("w", FloatDtype::BF16).unwrap(),
        FloatValues::BF16(want.clone())
    );
    assert_eq!(
        c.read_as("h", FloatDtype::BF16).unwrap(),
        FloatValues::BF16(want.clone())
    );
    assert_eq!(
        c.read_as("h", FloatDtype::F32).unwrap(),
        FloatValues::F32(want.iter().map(|v| v.to_f32()).collect())
    );
    assert_eq!(c.read_f64("w").unwrap(), [f64::from(0.1f32), 3.0]);
    let (meta, bytes) = c.bytes("ids").unwrap();
    assert_eq!((meta.dtype, bytes.len()), (Dtype::I64, 24));
    match c.read_f32("ids").unwrap_err() {
        e @ WeightsError::UnsupportedDtype { .. } => {
            let text = e.to_string();
            assert!(text.contains("ids") && text.contains("I64"), "{text}");
        }
        e => panic!("{e}"),
    }
    assert!(matches!(
        c.read_as("nope", FloatDtype::F32),
        Err(WeightsError::MissingTensor { key, .. }) if key == "nope"
    ));
}

#[test]
fn the_report_lists_every_problem_before_failing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.safetensors");
    let t = vec![
        f32s("z.weight", &[2, 3], &[0.0; 6]),
        f32s("b.weight", &[4], &[0.0; 4]),
        ("a.ids".to_string(), Dtype::I64, vec![1], vec![0; 8]),
        ("c.flag".to_string(), Dtype::BOOL, vec![1], vec![0]),
        f32s("extra", &[1], &[0.0]),
        f32s("buffer", &[1], &[0.0]),
        f32s("ok", &[1], &[0.0]),
    ];
    write(&path, &t, None);
    let c = Checkpoint::open_file(&path).unwrap();
    let expected: Vec<(String, Vec<usize>)> = vec![
        ("z.weight".into(), vec![3, 2]),
        ("missing.b".into(), vec![1]),
        ("b.weight".into(), vec![5]),
        ("c.flag".into(), vec![2]), // wrong dtype and shape: reported once, as the dtype
        ("a.ids".into(), vec![1]),
        ("missing.a".into(), vec![1]),
        ("ok".into(), vec![1]),
    ];
    let r = c.report(
        expected.iter().map(|(k, s)| (k, s)),
        &["buffer", "absent-buffer"],
    );
    assert_eq!(r.missing, ["missing.a", "missing.b"]);
    assert_eq!(r.unexpected, ["extra"]);
    let mis: Vec<_> = r
        .mismatched
        .iter()
        .map(|m| (m.key.as_str(), m.expected.clone(), m.found.clone()))
        .collect();
    assert_eq!(
        mis,
        [
            ("b.weight", vec![5], vec![4]),
            ("z.weight", vec![3, 2], vec![2, 3])
        ]
    );
    let bad: Vec<_> = r
        .unsupported_dtype
        .iter()
        .map(|d| (d.key.as_str(), d.dtype.as_str()))
        .collect();
    assert_eq!(bad, [("a.ids", "I64"), ("c.flag", "BOOL")]);
    assert!(!r.is_clean());
    let text = r.to_string();
    for part in [
        "2 missing",
        "1 unexpected",
        "2 mis-shaped",
        "2 with unsupported dtype",
        "z.weight (expected [3, 2], found [2, 3])",
    ] {
        assert!(text.contains(part), "{part} not in {text}");
    }
    match c
        .check(expected.iter().map(|(k, s)| (k, s)), &["buffer"])
        .unwrap_err()
    {
        WeightsError::Weights { path: p, report } => assert_eq!((p, report), (path.clone(), r)),
        e => panic!("{e}"),
    }
    assert!(
        c.check(
            [("ok", [1])],
            &["z.weight", "b.weight", "a.ids", "c.flag", "extra", "buffer"]
        )
        .is_ok()
    );
    assert_eq!(WeightReport::default().to_string(), "no problems");
}

fn dit_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|d| d.join("fixtures").join("dit_models"))
        .find(|d| d.is_dir())
        .expect("fixtures/dit_models above the crate")
}

/// The base-model hash of the dit-models fixture transformer, as recorded before the loader
/// moved here: an f32 single file and a bf16 three-shard copy of the same weights.
#[test]
fn the_fixture_transformer_hash_is_pinned() {
    const HASH: &str = "sha256:d81cbacb539e22317897e52822d3bb08bc5c13da46252a3de87f58cd85503176";
    for (layout, shards) in [("tiny_single", 1), ("tiny_sharded", 3)] {
        let c = Checkpoint::open(dit_fixtures().join(layout), &[DIFFUSERS]).unwrap();
        assert_eq!(c.num_shards(), shards);
        assert_eq!(c.content_hash().unwrap(), HASH, "{layout}");
    }
}
