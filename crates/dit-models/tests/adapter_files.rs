//! Adapter files: the diffusers LoRA form written and read back, imports of either form with
//! where their alpha came from, dropout set to 0 on request, and the refusals. The
//! interoperability numbers with diffusers' and PEFT's own loaders are in `interop.rs`.

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use burn::backend::Flex;
use dit_models::adapter_files::{DIFFUSERS_LORA_FILE, DIFFUSERS_METADATA_KEY};
use dit_models::lora::{ADAPTER_CONFIG_FILE, CONTRACT_FILE};
use dit_models::weights::write_safetensors;
use dit_models::{
    AdapterFormat, AlphaSource, Checkpoint, DitError, ImportDropout, QwenImageTransformer2DModel,
    read_adapter,
};
use serde_json::Value;
use support::*;

type B = Flex;

fn assert_adapted_outputs(model: &QwenImageTransformer2DModel<B>, what: &str) {
    let dev = Default::default();
    for c in forward_cases() {
        let name = c["name"].as_str().unwrap();
        check(
            &format!("{what}/{name}"),
            model.forward(input::<B>(&c, &dev)),
            &c["adapted_output"],
        );
    }
}

#[test]
fn diffusers_lora_round_trips_at_the_trained_scale() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = adapted::<B>();
    let contract = model.save_diffusers_lora(dir.path()).unwrap();
    let file = dir.path().join(DIFFUSERS_LORA_FILE);
    let ckpt = Checkpoint::open(&file).unwrap();
    // diffusers' layout: the component prefix, PyTorch shapes
    assert_eq!(ckpt.keys().count(), 32, "16 adapted modules x (A, B)");
    assert!(ckpt.keys().all(|k| k.starts_with("transformer.")));
    let a = ckpt
        .stored("transformer.transformer_blocks.0.attn.to_q.lora_A.weight")
        .unwrap();
    assert_eq!((a.dtype.as_str(), a.shape[0]), ("F32", 4));
    // the metadata diffusers reads: the config under the `transformer.` prefix
    let meta = ckpt
        .weights()
        .file_metadata()
        .find_map(|(_, m)| m.and_then(|m| m.get(DIFFUSERS_METADATA_KEY).cloned()))
        .expect("lora_adapter_metadata");
    let meta: Value = serde_json::from_str(&meta).unwrap();
    assert_eq!(meta["transformer.r"], 4);
    assert_eq!(meta["transformer.lora_alpha"], 8.0);
    assert!(
        meta.as_object()
            .unwrap()
            .keys()
            .all(|k| k.starts_with("transformer."))
    );

    // read back by path to the directory and to the file: same import
    for path in [dir.path().to_path_buf(), file.clone()] {
        let import = read_adapter(&path, ImportDropout::Refuse).unwrap();
        assert_eq!(import.format, AdapterFormat::Diffusers);
        assert_eq!(import.alpha, AlphaSource::Metadata);
        assert_eq!(import.contract.as_ref(), Some(&contract));
        assert_eq!(import.config, *model.lora_config().unwrap());
    }
    let (loaded, import) = base::<B>()
        .load_adapter(dir.path(), ImportDropout::Refuse, Some(&contract))
        .unwrap();
    assert_eq!(import.dropout_zeroed, None);
    assert!(
        import
            .describe()
            .contains("alpha 8 (from the file's lora_adapter_metadata)")
    );
    assert_adapted_outputs(&loaded, "diffusers-lora");
}

/// A copy of the diffusers export without its metadata (and without the contract).
fn without_metadata(from: &Path, to: &Path) {
    let ckpt = Checkpoint::open(from.join(DIFFUSERS_LORA_FILE)).unwrap();
    let tensors = ckpt
        .keys()
        .map(|k| {
            (
                k.to_string(),
                ckpt.stored(k).unwrap().shape,
                ckpt.read_f32(k).unwrap(),
            )
        })
        .collect();
    write_safetensors(&to.join(DIFFUSERS_LORA_FILE), tensors, &BTreeMap::new()).unwrap();
}

#[test]
fn diffusers_lora_without_metadata_loads_at_scale_one_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    adapted::<B>()
        .save_diffusers_lora(dir.path().join("with"))
        .unwrap();
    std::fs::create_dir_all(dir.path().join("without")).unwrap();
    without_metadata(&dir.path().join("with"), &dir.path().join("without"));
    let import = read_adapter(&dir.path().join("without"), ImportDropout::Refuse).unwrap();
    assert_eq!(import.alpha, AlphaSource::RankConvention);
    assert_eq!((import.config.rank, import.config.alpha), (4, 4.0));
    assert_eq!(
        import.config.target_modules.len(),
        16,
        "the modules named in the file"
    );
    assert!(import.describe().contains("no lora_adapter_metadata"));
    let (loaded, _) = base::<B>()
        .load_adapter(dir.path().join("without"), ImportDropout::Refuse, None)
        .unwrap();
    assert_eq!(loaded.lora_config().unwrap().scale(), 1.0);
    assert_eq!(loaded.adapted_modules().len(), 16);
}

#[test]
fn peft_dropout_is_refused_or_set_to_zero_on_request() {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixtures().join("tiny_lora")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    let cfg = dir.path().join(ADAPTER_CONFIG_FILE);
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v["lora_dropout"] = 0.05.into();
    std::fs::write(&cfg, serde_json::to_string(&v).unwrap()).unwrap();

    let err = read_adapter(dir.path(), ImportDropout::Refuse).unwrap_err();
    assert!(
        matches!(err, DitError::LoraDropout { given } if given == 0.05),
        "{err}"
    );
    let (loaded, import) = base::<B>()
        .load_adapter(dir.path(), ImportDropout::Zero, None)
        .unwrap();
    assert_eq!(import.format, AdapterFormat::Peft);
    assert_eq!(import.alpha, AlphaSource::AdapterConfig);
    assert_eq!(import.dropout_zeroed, Some(0.05));
    assert_eq!(import.config.dropout, 0.0);
    assert!(
        import.describe().contains("lora_dropout 0.05 set to 0"),
        "{}",
        import.describe()
    );
    // dropout only acts in training: the outputs are the adapter's own
    assert_adapted_outputs(&loaded, "peft-dropout-zeroed");
}

#[test]
fn paths_that_hold_no_adapter_and_foreign_layouts_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let err = read_adapter(dir.path(), ImportDropout::Refuse).unwrap_err();
    assert!(matches!(err, DitError::NoAdapterFound { .. }), "{err}");
    assert!(
        err.to_string().contains("pytorch_lora_weights.safetensors"),
        "{err}"
    );

    // a kohya-style file (`.alpha` keys) and a text-encoder key: both named
    let file = dir.path().join("kohya.safetensors");
    let tensors = vec![
        (
            "lora_unet_blocks_0_q.lora_down.weight".to_string(),
            vec![4, 8],
            vec![0.0; 32],
        ),
        ("lora_unet_blocks_0_q.alpha".to_string(), vec![1], vec![4.0]),
    ];
    write_safetensors(&file, tensors, &BTreeMap::new()).unwrap();
    match read_adapter(&file, ImportDropout::Refuse).unwrap_err() {
        DitError::UnsupportedAdapter { problems } => {
            assert_eq!(problems[0].field, "key layout");
            assert!(
                problems[0].allowed.contains("converting"),
                "{}",
                problems[0].allowed
            );
        }
        other => panic!("{other}"),
    }
    let file = dir.path().join("te.safetensors");
    let tensors = vec![
        (
            "transformer.transformer_blocks.0.attn.to_q.lora_A.weight".to_string(),
            vec![4, 8],
            vec![0.0; 32],
        ),
        (
            "text_encoder.layers.0.q_proj.lora_A.weight".to_string(),
            vec![4, 8],
            vec![0.0; 32],
        ),
    ];
    write_safetensors(&file, tensors, &BTreeMap::new()).unwrap();
    match read_adapter(&file, ImportDropout::Refuse).unwrap_err() {
        DitError::UnsupportedAdapter { problems } => {
            assert_eq!(problems[0].field, "keys");
            assert!(
                problems[0].given.contains("text_encoder."),
                "{}",
                problems[0].given
            );
        }
        other => panic!("{other}"),
    }
}

#[test]
fn a_contract_beside_a_diffusers_file_is_checked_against_the_base() {
    let dir = tempfile::tempdir().unwrap();
    adapted::<B>().save_diffusers_lora(dir.path()).unwrap();
    let path = dir.path().join(CONTRACT_FILE);
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v["base_model_hash"] = "0000".into();
    std::fs::write(&path, serde_json::to_string(&v).unwrap()).unwrap();
    let err = base::<B>()
        .load_adapter(dir.path(), ImportDropout::Refuse, None)
        .unwrap_err();
    match err {
        DitError::ContractMismatch { mismatches } => {
            assert_eq!(mismatches[0].field, "base_model_hash")
        }
        other => panic!("{other}"),
    }
}
