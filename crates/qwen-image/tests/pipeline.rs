//! A whole Qwen-Image directory from its `model_index.json`: the tiny directory that
//! `fixtures/generate/qwen_image_fixtures.py` saved with `QwenImagePipeline.save_pretrained`
//! loads through the same code a downloaded one takes; a broken index names every problem.

use std::path::{Path, PathBuf};

use burn::backend::flex::Flex;
use qwen_image::{FrozenComponents, PipelineIndex, QwenImageError};
use serde_json::Value;

fn tiny() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|d| d.join("fixtures").join("qwen_image").join("tiny_pipeline"))
        .find(|d| d.is_dir())
        .expect("fixtures/qwen_image/tiny_pipeline above the crate")
}

#[test]
fn the_tiny_directory_loads_whole() {
    let index = PipelineIndex::open(tiny()).unwrap();
    assert_eq!(index.diffusers_version.as_deref(), Some("0.42.1"));
    assert!(index.transformer_dir().join("config.json").is_file());
    assert!(index.scheduler_config().is_file());
    let device = Default::default();
    let c = FrozenComponents::<Flex>::load(index, None, &device).unwrap();
    assert_eq!(c.vae_config.z_dim, 4);
    assert_eq!(c.text_encoder_config.hidden_size, 32);
    let embeds = c
        .prompt_encoder
        .encode(&["a red circle"], 512, &device)
        .unwrap();
    assert_eq!(embeds.embeds.dims()[2], 32);
    // a variant that is absent is an error naming the files looked for
    let index = PipelineIndex::open(tiny()).unwrap();
    let err = FrozenComponents::<Flex>::load(index, Some("bf16"), &device)
        .unwrap_err()
        .to_string();
    assert!(err.contains("model.bf16.safetensors"), "{err}");
}

/// A copy of the tiny directory whose `model_index.json` is edited (components copied as
/// they are).
fn edited(edit: impl FnOnce(&mut Value), drop_folder: Option<&str>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(tiny()).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if entry.path().is_dir() {
            if Some(name.to_str().unwrap()) == drop_folder {
                continue;
            }
            std::fs::create_dir(dir.path().join(&name)).unwrap();
            for f in std::fs::read_dir(entry.path()).unwrap() {
                let f = f.unwrap();
                std::fs::copy(f.path(), dir.path().join(&name).join(f.file_name())).unwrap();
            }
        }
    }
    let mut v: Value =
        serde_json::from_str(&std::fs::read_to_string(tiny().join("model_index.json")).unwrap())
            .unwrap();
    edit(&mut v);
    std::fs::write(dir.path().join("model_index.json"), v.to_string()).unwrap();
    dir
}

#[test]
fn a_broken_index_names_every_problem() {
    let dir = edited(
        |v| {
            v["vae"] = serde_json::json!(["diffusers", "AutoencoderKL"]);
            v["text_encoder"] = Value::Null;
            v["image_encoder"] = serde_json::json!(["transformers", "CLIPVisionModel"]);
            v["_class_name"] = "QwenImageEditPipeline".into();
        },
        Some("scheduler"),
    );
    let err = PipelineIndex::open(dir.path()).unwrap_err();
    let QwenImageError::Config { problems, path } = &err else {
        panic!("{err}")
    };
    assert!(path.ends_with("model_index.json"));
    let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
    for key in [
        "vae",
        "text_encoder",
        "image_encoder",
        "_class_name",
        "scheduler",
    ] {
        assert!(keys.contains(&key), "{key} not named in {err}");
    }
    assert!(
        err.to_string()
            .contains("scheduler/ next to model_index.json"),
        "{err}"
    );
    let empty = tempfile::tempdir().unwrap();
    let err = PipelineIndex::open(empty.path()).unwrap_err().to_string();
    assert!(err.contains("model_index.json"), "{err}");
}
