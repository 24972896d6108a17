//! Checkpoint loading errors and configuration parsing.

mod support;

use burn::backend::Flex;
use dit_models::{Checkpoint, DitError, LoadOptions, QwenImageConfig, QwenImageTransformer2DModel};
use safetensors::tensor::{Dtype, TensorView};
use support::*;

/// A copy of the fixture checkpoint with two keys missing, two unexpected, two mis-shaped
/// and one stored as int64: every one of them is named in one error.
#[test]
fn weight_report_lists_every_problem_by_name() {
    let src = Checkpoint::open(fixtures().join("tiny_single")).unwrap();
    let mut owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for k in src.keys() {
        let shape = src.stored(k).unwrap().shape;
        let v = src.read_f32(k).unwrap();
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        match k {
            "img_in.bias" | "transformer_blocks.1.attn.norm_k.weight" => {}
            "proj_out.weight" => {
                owned.push((k.into(), Dtype::F32, vec![shape[1], shape[0]], f32s(&v)))
            }
            "txt_norm.weight" => owned.push((
                k.into(),
                Dtype::F32,
                vec![25],
                f32s(&[v.clone(), vec![1.0]].concat()),
            )),
            "img_in.weight" => owned.push((
                k.into(),
                Dtype::I64,
                shape,
                v.iter().flat_map(|x| (*x as i64).to_le_bytes()).collect(),
            )),
            _ => owned.push((k.into(), Dtype::F32, shape, f32s(&v))),
        }
    }
    owned.push(("extra.weight".into(), Dtype::F32, vec![2], vec![0; 8]));
    owned.push((
        "transformer_blocks.2.attn.to_q.weight".into(),
        Dtype::F32,
        vec![1],
        vec![0; 4],
    ));
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixtures().join("tiny_single/config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    let views: Vec<(String, TensorView)> = owned
        .iter()
        .map(|(k, d, s, b)| (k.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(
        views,
        None,
        &dir.path().join("diffusion_pytorch_model.safetensors"),
    )
    .unwrap();

    let err = QwenImageTransformer2DModel::<Flex>::from_pretrained(
        dir.path(),
        &Default::default(),
        LoadOptions::default(),
    )
    .unwrap_err();
    let text = err.to_string();
    let DitError::Weights { report, .. } = err else {
        panic!("{text}")
    };
    assert_eq!(
        report.missing,
        ["img_in.bias", "transformer_blocks.1.attn.norm_k.weight"]
    );
    assert_eq!(
        report.unexpected,
        ["extra.weight", "transformer_blocks.2.attn.to_q.weight"]
    );
    let mis: Vec<_> = report
        .mismatched
        .iter()
        .map(|m| (m.key.as_str(), m.expected.clone(), m.found.clone()))
        .collect();
    assert_eq!(
        mis,
        [
            ("proj_out.weight", vec![16, 32], vec![32, 16]),
            ("txt_norm.weight", vec![24], vec![25])
        ]
    );
    assert_eq!(report.unsupported_dtype.len(), 1);
    assert_eq!(report.unsupported_dtype[0].key, "img_in.weight");
    for name in [
        "img_in.bias",
        "norm_k",
        "extra.weight",
        "blocks.2",
        "proj_out.weight",
        "txt_norm.weight",
        "I64",
    ] {
        assert!(text.contains(name), "{name} not in: {text}");
    }
}

#[test]
fn missing_checkpoint_and_bad_index_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        Checkpoint::open(dir.path()),
        Err(DitError::NoCheckpoint { .. })
    ));
    // an index naming a key its shard lacks
    for e in std::fs::read_dir(fixtures().join("tiny_sharded")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    let index = dir
        .path()
        .join("diffusion_pytorch_model.safetensors.index.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&index).unwrap()).unwrap();
    v["weight_map"]["img_in.bias"] = "diffusion_pytorch_model-00003-of-00003.safetensors".into();
    std::fs::write(&index, v.to_string()).unwrap();
    assert!(
        matches!(Checkpoint::open(dir.path()), Err(DitError::IndexMismatch { ref key, .. }) if key == "img_in.bias")
    );
}

#[test]
fn diffusers_config_json_round_trips() {
    let c =
        QwenImageConfig::from_diffusers_json(fixtures().join("tiny_single/config.json")).unwrap();
    assert_eq!(c, QwenImageConfig::tiny());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    let mut hub = QwenImageConfig::qwen_image().to_diffusers_json();
    hub["pooled_projection_dim"] = 768.into();
    std::fs::write(&path, hub.to_string()).unwrap();
    assert_eq!(
        QwenImageConfig::from_diffusers_json(&path).unwrap(),
        QwenImageConfig::qwen_image()
    );
}

#[test]
fn invalid_config_lists_every_problem() {
    let c = QwenImageConfig::tiny()
        .with_patch_size(0)
        .with_axes_dims_rope([4, 4, 4])
        .with_guidance_embeds(true);
    match c.validate().unwrap_err() {
        DitError::InvalidConfig { problems } => {
            let fields: Vec<_> = problems.iter().map(|p| p.field).collect();
            assert_eq!(fields, ["patch_size", "axes_dims_rope", "guidance_embeds"]);
            assert!(problems[1].given.contains("[4, 4, 4]") && problems[1].allowed.contains("16"));
        }
        other => panic!("{other}"),
    }
}

/// A copy of the tiny transformer whose `config.json` is edited.
fn with_config(edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = fixtures().join("tiny_single");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(dir.path().join("config.json"), v.to_string()).unwrap();
    std::fs::copy(
        src.join("diffusion_pytorch_model.safetensors"),
        dir.path().join("diffusion_pytorch_model.safetensors"),
    )
    .unwrap();
    dir
}

/// diffusers 0.42's variant flags are accepted at `false` and refused by name at `true`, an
/// unknown key is named, and the keys diffusers does not read are accepted.
#[test]
fn every_config_key_is_read_or_refused_by_name() {
    let ok = with_config(|v| {
        v["zero_cond_t"] = false.into();
        v["use_additional_t_cond"] = false.into();
        v["use_layer3d_rope"] = false.into();
        v["pooled_projection_dim"] = 768.into();
        v["_diffusers_version"] = "0.42.1".into();
    });
    QwenImageConfig::from_diffusers_json(ok.path().join("config.json")).unwrap();
    let bad = with_config(|v| {
        v["use_layer3d_rope"] = true.into();
        v["use_additional_t_cond"] = true.into();
        v["zero_cond_t"] = true.into();
        v["some_future_flag"] = 1.into();
    });
    let err = QwenImageConfig::from_diffusers_json(bad.path().join("config.json")).unwrap_err();
    let DitError::ConfigKeys { problems, .. } = &err else {
        panic!("{err}")
    };
    let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
    for key in [
        "use_layer3d_rope",
        "use_additional_t_cond",
        "zero_cond_t",
        "some_future_flag",
    ] {
        assert!(keys.contains(&key), "{key} not named in {err}");
    }
    assert!(err.to_string().contains("Qwen-Image-Layered"), "{err}");
    // The loader stops at the config: nothing is loaded.
    let err = QwenImageTransformer2DModel::<Flex>::from_pretrained(
        bad.path(),
        &Default::default(),
        LoadOptions::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("use_layer3d_rope"), "{err}");
}

/// `diffusion_pytorch_model.bf16.safetensors` loads with `variant: Some("bf16")`, gives the
/// plain file's outputs, and without the variant the error names the variant present.
#[test]
fn variant_files_load_by_their_variant() {
    let dir = with_config(|_| {});
    std::fs::rename(
        dir.path().join("diffusion_pytorch_model.safetensors"),
        dir.path().join("diffusion_pytorch_model.bf16.safetensors"),
    )
    .unwrap();
    let device = Default::default();
    let err = QwenImageTransformer2DModel::<Flex>::from_pretrained(
        dir.path(),
        &device,
        LoadOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(&err, DitError::NoCheckpoint { variants, .. } if variants == &["bf16"]),
        "{err}"
    );
    assert!(err.to_string().contains("bf16"), "{err}");
    let options = LoadOptions {
        variant: Some("bf16".into()),
        ..LoadOptions::default()
    };
    let variant =
        QwenImageTransformer2DModel::<Flex>::from_pretrained(dir.path(), &device, options).unwrap();
    let plain = QwenImageTransformer2DModel::<Flex>::from_pretrained(
        fixtures().join("tiny_single"),
        &device,
        LoadOptions::default(),
    )
    .unwrap();
    assert_eq!(variant.base_model_hash(), plain.base_model_hash());
}
