//! Interoperability with the real Python loaders (`fixtures/generate/interop_fixtures.py`,
//! diffusers 0.42.1 / PEFT 0.21.2), both directions:
//!
//! * adapters the Python tools made (`fixtures/dit_models/interop/`) load here and give the
//!   outputs their own loaders gave;
//! * what this crate exports is, byte for byte, what that script loaded with
//!   `PeftModel.from_pretrained`, `QwenImagePipeline.load_lora_weights` and
//!   `QwenImageTransformer2DModel.from_pretrained` and found equal to the adapter's own
//!   outputs (`export_verified.json` records the hashes and the errors).

mod support;

use std::path::Path;

use burn::backend::Flex;
use dit_models::{AlphaSource, DitError, ImportDropout, QwenImageTransformer2DModel};
use serde_json::Value;
use sha2::{Digest, Sha256};
use support::*;

type B = Flex;

fn interop() -> std::path::PathBuf {
    fixtures().join("interop")
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The outputs the Python loader gave for `file`, per forward case.
fn python_outputs(file: &str) -> Vec<(String, Value)> {
    json(&interop().join("imports.json"))["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap().to_string(), c[file].clone()))
        .collect()
}

fn assert_matches_python(model: &QwenImageTransformer2DModel<B>, file: &str) {
    let dev = Default::default();
    let cases = forward_cases();
    for (name, want) in python_outputs(file) {
        let c = cases.iter().find(|c| c["name"] == name.as_str()).unwrap();
        check(
            &format!("{file}/{name}"),
            model.forward(input::<B>(c, &dev)),
            &want,
        );
    }
}

#[test]
fn diffusers_made_loras_load_as_diffusers_loads_them() {
    let (with, import) = base::<B>()
        .load_adapter(
            interop().join("diffusers_with_metadata"),
            ImportDropout::Refuse,
            None,
        )
        .unwrap();
    assert_eq!(import.alpha, AlphaSource::Metadata);
    assert_eq!((import.config.rank, import.config.alpha), (4, 8.0));
    assert_matches_python(&with, "diffusers_with_metadata");

    // without metadata diffusers uses alpha = rank; so do we, and we say so
    let (without, import) = base::<B>()
        .load_adapter(
            interop().join("diffusers_no_metadata"),
            ImportDropout::Refuse,
            None,
        )
        .unwrap();
    assert_eq!(import.alpha, AlphaSource::RankConvention);
    assert_eq!((import.config.rank, import.config.alpha), (4, 4.0));
    assert_matches_python(&without, "diffusers_no_metadata");
}

#[test]
fn a_peft_adapter_with_dropout_loads_for_rl_only_when_asked() {
    let dir = interop().join("peft_dropout");
    let err = base::<B>()
        .load_adapter(&dir, ImportDropout::Refuse, None)
        .unwrap_err();
    assert!(
        matches!(err, DitError::LoraDropout { given } if given == 0.1),
        "{err}"
    );
    let (model, import) = base::<B>()
        .load_adapter(&dir, ImportDropout::Zero, None)
        .unwrap();
    assert_eq!(import.dropout_zeroed, Some(0.1));
    assert_matches_python(&model, "peft_dropout");
}

fn sha256(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn exports_are_the_verified_bytes() {
    let verified = json(&interop().join("export_verified.json"));
    for (form, err) in verified["max_abs_err_vs_the_peft_adapter"]
        .as_object()
        .unwrap()
    {
        let err = err.as_f64().unwrap_or(f64::NAN);
        assert!(err <= 1e-5, "{form}: the Python loader was off by {err}");
    }
    // the same exports as `lora.rs`'s `export_for_python_check`
    let dir = tempfile::tempdir().unwrap();
    export_all(&mut adapted::<B>(), dir.path());
    let files = verified["files"].as_object().unwrap();
    let mut written = Vec::new();
    for form in ["peft", "diffusers_lora", "merged", "merged_sharded_bf16"] {
        for e in std::fs::read_dir(dir.path().join(form)).unwrap() {
            let e = e.unwrap();
            written.push(format!("{form}/{}", e.file_name().to_string_lossy()));
        }
    }
    written.sort();
    let recorded: Vec<&String> = files.keys().collect();
    assert_eq!(
        written.iter().collect::<Vec<_>>(),
        recorded,
        "the export writes other files than the verified ones"
    );
    for (name, want) in files {
        assert_eq!(
            sha256(&dir.path().join(name)),
            want.as_str().unwrap(),
            "{name} differs from the bytes the Python loaders verified: re-run \
             `interop_fixtures.py --verify-export` (see its docstring) if the change is meant"
        );
    }
}
