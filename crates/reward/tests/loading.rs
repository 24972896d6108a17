//! Loading CLIP directories: every bad key reported together, buffers ignored, shards and
//! half-precision files read, configuration errors listed, the PickScore directory layout.

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use burn::backend::Flex;
use reward::clip::{ClipConfig, ClipImageProcessor, ClipModel, ClipTokenizer, HiddenAct};
use reward::{ConfigProblem, PickScore, PickScoreOptions, RewardError};
use safetensors::tensor::{Dtype, TensorView};
use support::*;

/// The fixture checkpoint as `(key -> (dtype, shape, bytes))`.
fn tensors() -> BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(tiny_clip().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(k, v)| (k, (v.dtype(), v.shape().to_vec(), v.data().to_vec())))
        .collect()
}

fn write(path: &Path, t: &BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>) {
    let views: Vec<(String, TensorView<'_>)> = t
        .iter()
        .map(|(k, (d, s, b))| (k.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(path, safetensors::tensor::serialize(views, None).unwrap()).unwrap();
}

/// A copy of the fixture directory with the given checkpoint.
fn directory(t: &BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "preprocessor_config.json",
    ] {
        std::fs::copy(tiny_clip().join(f), dir.path().join(f)).unwrap();
    }
    write(&dir.path().join("model.safetensors"), t);
    dir
}

#[test]
fn every_bad_key_is_reported_together() {
    let mut t = tensors();
    t.remove("text_model.final_layer_norm.bias");
    t.remove("visual_projection.weight");
    let q = t
        .remove("vision_model.encoder.layers.1.self_attn.q_proj.weight")
        .unwrap();
    t.insert(
        "vision_model.encoder.layers.1.self_attn.query.weight".into(),
        q,
    );
    let (d, _, b) = t["logit_scale"].clone();
    t.insert("extra.scale".into(), (d, vec![], b));
    let (d, _, b) = t
        .remove("text_model.embeddings.position_embedding.weight")
        .unwrap();
    t.insert(
        "text_model.embeddings.position_embedding.weight".into(),
        (d, vec![32, 77], b),
    );
    let ids: Vec<u8> = (0..77i64).flat_map(|i| i.to_le_bytes()).collect();
    t.insert(
        "text_model.embeddings.position_ids".into(),
        (Dtype::I64, vec![1, 77], ids),
    );
    t.insert(
        "text_model.final_layer_norm.weight".into(),
        (Dtype::I64, vec![32], vec![0; 32 * 8]),
    );
    let dir = directory(&t);
    let err = ClipModel::<Flex>::from_pretrained(dir.path(), &Default::default()).unwrap_err();
    let RewardError::Weights { report, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(
        report.missing,
        [
            "text_model.final_layer_norm.bias",
            "vision_model.encoder.layers.1.self_attn.q_proj.weight",
            "visual_projection.weight",
        ]
    );
    assert_eq!(
        report.unexpected,
        [
            "extra.scale",
            "vision_model.encoder.layers.1.self_attn.query.weight"
        ]
    );
    assert_eq!(report.mismatched.len(), 1);
    assert_eq!(
        report.mismatched[0].key,
        "text_model.embeddings.position_embedding.weight"
    );
    assert_eq!(
        (
            report.mismatched[0].expected.clone(),
            report.mismatched[0].found.clone()
        ),
        (vec![77, 32], vec![32, 77])
    );
    assert_eq!(report.unsupported_dtype.len(), 1);
    let msg = err.to_string();
    assert!(
        msg.contains("3 missing") && msg.contains("2 unexpected") && msg.contains("1 mis-shaped"),
        "{msg}"
    );
}

#[test]
fn position_id_buffers_are_ignored_and_half_precision_is_read() {
    let mut t = tensors();
    let ids: Vec<u8> = (0..77i64).flat_map(|i| i.to_le_bytes()).collect();
    t.insert(
        "text_model.embeddings.position_ids".into(),
        (Dtype::I64, vec![1, 77], ids),
    );
    let ids: Vec<u8> = (0..17i64).flat_map(|i| i.to_le_bytes()).collect();
    t.insert(
        "vision_model.embeddings.position_ids".into(),
        (Dtype::I64, vec![1, 17], ids),
    );
    // bf16 copy of every float tensor
    for (d, _, b) in t.values_mut() {
        if *d == Dtype::F32 {
            *b = b
                .chunks_exact(4)
                .flat_map(|c| {
                    half::bf16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_le_bytes()
                })
                .collect();
            *d = Dtype::BF16;
        }
    }
    let dir = directory(&t);
    let model = ClipModel::<Flex>::from_pretrained(dir.path(), &Default::default()).unwrap();
    let v = clip_json();
    let ids: Vec<Vec<u32>> = v["ids_padded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect();
    // bf16 weights: close to, not equal to, the f32 reference
    let err = check(
        "bf16 text_embeds",
        model.text_embeds(&ids).unwrap(),
        &v["text_embeds"],
        0.1,
    );
    assert!(err > 1e-6, "bf16 rounding must show");
}

#[test]
fn sharded_checkpoints_load_like_single_files() {
    let t = tensors();
    let dir = directory(&t);
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let (text, rest): (BTreeMap<_, _>, BTreeMap<_, _>) = t
        .into_iter()
        .partition(|(k, _)| k.starts_with("text_model."));
    write(&dir.path().join("model-00001-of-00002.safetensors"), &text);
    write(&dir.path().join("model-00002-of-00002.safetensors"), &rest);
    let mut map = serde_json::Map::new();
    for k in text.keys() {
        map.insert(k.clone(), "model-00001-of-00002.safetensors".into());
    }
    for k in rest.keys() {
        map.insert(k.clone(), "model-00002-of-00002.safetensors".into());
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let model = ClipModel::<Flex>::from_pretrained(dir.path(), &Default::default()).unwrap();
    let v = clip_json();
    let padded: Vec<Vec<u32>> = v["ids_padded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect();
    check(
        "sharded text_embeds",
        model.text_embeds(&padded).unwrap(),
        &v["text_embeds"],
        TOL,
    );
}

#[test]
fn the_fixture_config_is_the_tiny_preset() {
    let c = ClipConfig::from_transformers_json(tiny_clip().join("config.json")).unwrap();
    let mut tiny = ClipConfig::tiny();
    tiny.text_config.eos_token_id = c.text_config.eos_token_id;
    tiny.logit_scale_init_value = 2.9;
    assert_eq!(c, tiny);
}

/// The `config.json` of a CLIP-H/14 as transformers 4.21, 4.25 (PickScore_v1's era: every
/// generic attribute written out) and 4.57 save it (`fixtures/generate/clip_config_fixtures.py`)
/// loads strictly to the PickScore preset; the older ones keep the legacy end-of-text id 2.
#[test]
fn every_transformers_layout_of_a_clip_config_loads_strictly() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/reward/clip_configs");
    for (version, eos) in [("4.21.3", 2), ("4.25.1", 2), ("4.57.6", 49407)] {
        let path = dir.join(format!("transformers-{version}.json"));
        let c = ClipConfig::from_transformers_json(&path)
            .unwrap_or_else(|e| panic!("transformers {version}: {e}"));
        let mut want = ClipConfig::pickscore_v1();
        want.text_config.eos_token_id = eos;
        assert_eq!(c, want, "transformers {version}");
    }
}

/// The default CLIP image processor as transformers 4.21 (`CLIPFeatureExtractor`, integer
/// sizes), 4.25 and 4.57 (`CLIPImageProcessor`, and 4.57's `CLIPImageProcessorFast`, every
/// fast key written out) save it reads strictly to the same settings; an unknown key, a
/// foreign class and a fast processor's non-CLIP value are refused by name.
#[test]
fn every_transformers_layout_of_a_clip_processor_loads_strictly() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/reward/clip_configs");
    for version in ["4.21.3", "4.25.1", "4.57.6", "fast 4.57.6"] {
        let file = match version.strip_prefix("fast ") {
            Some(v) => format!("preprocessor_fast-transformers-{v}.json"),
            None => format!("preprocessor-transformers-{version}.json"),
        };
        let path = dir.join(file);
        let p = ClipImageProcessor::from_json(&path)
            .unwrap_or_else(|e| panic!("transformers {version}: {e}"));
        assert_eq!(p, ClipImageProcessor::default(), "transformers {version}");
    }
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("preprocessor_config.json");
    std::fs::write(
        &path,
        r#"{"image_processor_type": "SiglipImageProcessor", "do_convert_rgb": true,
            "default_to_square": true, "data_format": "channels_first", "device": null,
            "crop_pct": 0.9, "size": {"shortest_edge": 224}}"#,
    )
    .unwrap();
    let problems = file_problems(ClipImageProcessor::from_json(&path));
    let mut fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        ["crop_pct", "default_to_square", "image_processor_type"],
        "{problems:?}"
    );
}

/// The `tokenizer_config.json` of a CLIP tokenizer as transformers 4.21, 4.25 and 4.57 save
/// it, beside the tiny model's `tokenizer.json`, loads strictly and pads with
/// `<|endoftext|>`; special tokens missing from the vocabulary, left padding, split special
/// tokens, a foreign class and unknown keys are refused by name, together.
#[test]
fn every_transformers_layout_of_a_clip_tokenizer_config_loads_strictly() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/reward/clip_configs");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        tiny_clip().join("tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    let want = ClipTokenizer::from_dir(tiny_clip(), 77).unwrap().pad_id();
    for version in ["4.21.3", "4.25.1", "4.57.6"] {
        std::fs::copy(
            fixtures.join(format!("tokenizer_config-transformers-{version}.json")),
            dir.path().join("tokenizer_config.json"),
        )
        .unwrap();
        let tok = ClipTokenizer::from_dir(dir.path(), 77)
            .unwrap_or_else(|e| panic!("transformers {version}: {e}"));
        assert_eq!(tok.pad_id(), want, "transformers {version}");
    }
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"tokenizer_class": "SiglipTokenizer", "bos_token": "<s>", "padding_side": "left",
            "split_special_tokens": true, "do_lower_case": true, "errors": "replace",
            "eos_token": {"content": "<|endoftext|>"}, "truncation_side": "right",
            "legacy": false}"#,
    )
    .unwrap();
    let problems = file_problems(ClipTokenizer::from_dir(dir.path(), 77));
    let mut fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "bos_token",
            "legacy",
            "padding_side",
            "split_special_tokens",
            "tokenizer_class",
        ],
        "{problems:?}"
    );
}

/// Every key is read, inert or refused by name: an unknown key at any level, a foreign
/// `model_type` and pruned heads are listed together.
#[test]
fn unknown_clip_config_keys_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(
        &path,
        r#"{"model_type": "clip", "use_siglip_loss": true, "architectures": ["CLIPModel"],
            "text_config": {"hidden_size": 64, "num_attention_heads": 4, "rope_theta": 10000.0,
                            "num_beams": 1, "pruned_heads": {"0": [1]}},
            "vision_config": {"model_type": "siglip_vision_model", "use_head": false,
                              "pruned_heads": {}, "eos_token_id": null}}"#,
    )
    .unwrap();
    let problems = file_problems(ClipConfig::from_transformers_json(&path));
    let mut fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "text_config.pruned_heads",
            "text_config.rope_theta",
            "use_siglip_loss",
            "vision_config.model_type",
            "vision_config.use_head",
        ],
        "{problems:?}"
    );
    let p = problems
        .iter()
        .find(|p| p.field == "vision_config.model_type")
        .unwrap();
    assert!(p.allowed.contains("clip_vision_model"), "{p:?}");
}

#[test]
fn config_problems_are_listed_together() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(
        &path,
        r#"{"projection_dim": 0,
            "text_config": {"hidden_size": 30, "num_attention_heads": 4, "hidden_act": "relu"},
            "vision_config": {"image_size": [224, 200], "patch_size": 14, "num_channels": "three"}}"#,
    )
    .unwrap();
    let problems = file_problems(ClipConfig::from_transformers_json(&path));
    let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
    for f in [
        "text_config.hidden_act",
        "vision_config.image_size",
        "vision_config.num_channels",
        "projection_dim",
        "text_config.hidden_size",
    ] {
        assert!(fields.contains(&f), "{f} not in {fields:?}");
    }
    // transformers' defaults fill what a file leaves out; *_config_dict wins (older files)
    std::fs::write(
        &path,
        r#"{"text_config": {"hidden_size": 64}, "text_config_dict": {"hidden_size": 1024, "num_attention_heads": 16, "hidden_act": "gelu"},
            "vision_config": {"patch_size": [14, 14]}}"#,
    )
    .unwrap();
    let c = ClipConfig::from_transformers_json(&path).unwrap();
    assert_eq!(c.text_config.hidden_size, 1024);
    assert_eq!(c.text_config.hidden_act, HiddenAct::Gelu);
    assert_eq!(c.vision_config.patch_size, 14);
    assert_eq!(c.vision_config.hidden_act, HiddenAct::QuickGelu);
    assert_eq!(c.projection_dim, 512);
}

#[test]
fn pickscore_directory_problems_are_typed() {
    let dev = Default::default();
    let empty = tempfile::tempdir().unwrap();
    let err =
        PickScore::<Flex>::from_dir(empty.path(), &dev, PickScoreOptions::default()).unwrap_err();
    assert!(matches!(err, RewardError::Io { .. }), "{err:?}");
    // no checkpoint
    let dir = directory(&tensors());
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let err =
        PickScore::<Flex>::from_dir(dir.path(), &dev, PickScoreOptions::default()).unwrap_err();
    assert!(matches!(err, RewardError::NoCheckpoint { .. }), "{err:?}");
    // a processor whose crop does not fit the vision tower
    let dir = directory(&tensors());
    std::fs::remove_file(dir.path().join("preprocessor_config.json")).unwrap(); // CLIP's 224 default
    let err =
        PickScore::<Flex>::from_dir(dir.path(), &dev, PickScoreOptions::default()).unwrap_err();
    assert!(matches!(err, RewardError::InvalidConfig { .. }), "{err:?}");
    // processor files from another directory (PickScore's reference takes the LAION processor)
    let dir = directory(&tensors());
    let proc = tempfile::tempdir().unwrap();
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "preprocessor_config.json",
    ] {
        std::fs::rename(dir.path().join(f), proc.path().join(f)).unwrap();
    }
    let options = PickScoreOptions {
        processor_dir: Some(proc.path().to_path_buf()),
        ..PickScoreOptions::default()
    };
    PickScore::<Flex>::from_dir(dir.path(), &dev, options).unwrap();
}

#[test]
fn pickscore_v1_preset_is_clip_h_14() {
    let c = ClipConfig::pickscore_v1();
    c.validate().unwrap();
    let (t, v) = (&c.text_config, &c.vision_config);
    assert_eq!(
        (
            t.hidden_size,
            t.num_hidden_layers,
            t.num_attention_heads,
            t.intermediate_size
        ),
        (1024, 24, 16, 4096)
    );
    assert_eq!(
        (
            v.hidden_size,
            v.num_hidden_layers,
            v.num_attention_heads,
            v.intermediate_size
        ),
        (1280, 32, 16, 5120)
    );
    assert_eq!(
        (v.image_size, v.patch_size, c.projection_dim),
        (224, 14, 1024)
    );
    // parameter count of CLIP-H/14 (986M), from the shapes the loader expects
    let text = t.vocab_size * 1024
        + 77 * 1024
        + 24 * (4 * (1024 * 1024 + 1024) + 2 * 2 * 1024 + 1024 * 4096 + 4096 + 4096 * 1024 + 1024)
        + 2 * 1024;
    let vision = 1280
        + 3 * 14 * 14 * 1280
        + 257 * 1280
        + 2 * 1280
        + 32 * (4 * (1280 * 1280 + 1280) + 2 * 2 * 1280 + 1280 * 5120 + 5120 + 5120 * 1280 + 1280)
        + 2 * 1280;
    let total = text + vision + 1280 * 1024 + 1024 * 1024 + 1;
    assert!((980_000_000..990_000_000).contains(&total), "{total}");
}

/// The problems of a [`RewardError::InvalidConfigFile`], after checking that it names the file
/// it read (an existing path, in its message too); panics on any other result.
fn file_problems<T: std::fmt::Debug>(result: Result<T, RewardError>) -> Vec<ConfigProblem> {
    let e = match result {
        Err(e) => e,
        Ok(v) => panic!("expected an invalid config file, got {v:?}"),
    };
    let message = e.to_string();
    match e {
        RewardError::InvalidConfigFile { path, problems, .. } => {
            assert!(path.is_file(), "{message}");
            assert!(message.contains(&path.display().to_string()), "{message}");
            problems
        }
        other => panic!("{other:?}"),
    }
}
