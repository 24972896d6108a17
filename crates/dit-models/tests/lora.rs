//! LoRA: PEFT adapter import/export against PEFT's own files and outputs, merge/unmerge,
//! disable, init equality, gradients, contracts and typed errors.

mod support;

use std::collections::BTreeMap;

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use dit_models::lora::{ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, CONTRACT_FILE};
use dit_models::{
    AdapterContract, Adapters, Checkpoint, DitError, ExportDtype, ExportOptions, LoadOptions,
    LoraConfig, QwenImageConditioning, QwenImageTransformer2DModel, VelocityModel,
};
use serde_json::Value;
use support::*;

type B = Flex;

#[test]
fn peft_adapter_reproduces_peft_outputs() {
    let model = adapted::<B>();
    assert_eq!(model.adapted_modules().len(), 16, "8 targets x 2 blocks");
    let cfg = model.lora_config().unwrap();
    assert_eq!((cfg.rank, cfg.alpha, cfg.scale()), (4, 8.0, 2.0));
    let dev = Default::default();
    for c in forward_cases() {
        let name = c["name"].as_str().unwrap();
        check(
            &format!("adapted/{name}"),
            model.forward(input::<B>(&c, &dev)),
            &c["adapted_output"],
        );
        // the adapter matters: the adapted output is far from the base output
        let base_out = model.forward_with(input::<B>(&c, &dev), Adapters::Disabled);
        check(&format!("disabled/{name}"), base_out.clone(), &c["output"]);
        let (shape, data) = values(&c["adapted_output"]);
        assert!(
            max_abs_diff(base_out, (&shape, &data)) > 1e-2,
            "{name}: adapter has no effect"
        );
    }
}

#[test]
fn merge_and_unmerge_round_trip() {
    let dev = Default::default();
    let c = case("nonsquare");
    let model = adapted::<B>();
    let before = model.forward(input::<B>(&c, &dev));
    let w0 = model.transformer_blocks[0].attn.to_q.weight.val();
    let merged = model.merge_adapters();
    // merged: the folded weight alone gives the adapted output; disabled subtracts the adapter
    check(
        "merged",
        merged.forward(input::<B>(&c, &dev)),
        &c["adapted_output"],
    );
    check(
        "merged, disabled",
        merged.forward_with(input::<B>(&c, &dev), Adapters::Disabled),
        &c["output"],
    );
    let w1 = merged.transformer_blocks[0].attn.to_q.weight.val();
    assert!(diff(w1.clone(), w0.clone()) > 1e-3, "merge changed nothing");
    let merged = merged.merge_adapters(); // idempotent
    assert_eq!(
        diff(merged.transformer_blocks[0].attn.to_q.weight.val(), w1),
        0.0
    );
    let back = merged.unmerge_adapters();
    let err = diff(back.transformer_blocks[0].attn.to_q.weight.val(), w0);
    assert!(err < 1e-6, "unmerge(merge(W)) - W = {err}");
    assert!(diff(back.forward(input::<B>(&c, &dev)), before) < 1e-5);
}

#[test]
fn fresh_adapter_equals_base_and_only_adapters_train() {
    type AD = Autodiff<Flex>;
    let dev = Default::default();
    let c = case("square");
    let base = base::<AD>();
    let model = base.clone().attach_lora(&LoraConfig::new(4, 8.0)).unwrap();
    // B = 0: the adapted model is the base, exactly
    let a = model.forward(input::<AD>(&c, &dev));
    assert_eq!(diff(a.clone(), base.forward(input::<AD>(&c, &dev))), 0.0);
    check("fresh adapter", a.clone(), &c["output"]);

    let flags = model.param_requires_grad();
    let (lora, rest): (Vec<_>, Vec<_>) = flags.iter().partition(|(p, _)| p.contains(".lora."));
    assert_eq!(lora.len(), 2 * 16);
    assert!(
        lora.iter().all(|(_, g)| *g),
        "adapter params must require grad"
    );
    assert!(
        rest.iter().all(|(_, g)| !*g),
        "base params must be frozen: {:?}",
        rest.iter().find(|(_, g)| *g)
    );

    let grads = a.powi_scalar(2).mean().backward();
    let q = &model.transformer_blocks[0].attn.to_q;
    let l = q.lora.as_ref().unwrap();
    // at B = 0, dL/dA = 0 but dL/dB != 0
    let gb = l.lora_b.grad(&grads).expect("lora_b has a gradient");
    assert!(gb.abs().max().into_scalar() > 0.0);
    assert!(l.lora_a.grad(&grads).is_some());
    assert!(
        q.weight.grad(&grads).is_none(),
        "frozen base weight got a gradient"
    );
    assert!(model.img_in.weight.grad(&grads).is_none());
}

#[test]
fn default_targets_are_the_eight_attention_projections() {
    let model = base::<B>().attach_lora(&LoraConfig::new(2, 2.0)).unwrap();
    let mut got = model.adapted_modules();
    got.sort();
    let mut want = Vec::new();
    for i in 0..2 {
        for t in [
            "to_q",
            "to_k",
            "to_v",
            "to_out.0",
            "add_q_proj",
            "add_k_proj",
            "add_v_proj",
            "to_add_out",
        ] {
            want.push(format!("transformer_blocks.{i}.attn.{t}"));
        }
    }
    want.sort();
    assert_eq!(got, want);
    // suffix matching: a different target selects other layers
    let m = base::<B>()
        .attach_lora(
            &LoraConfig::new(2, 2.0)
                .with_target_modules(vec!["img_mlp.net.2".into(), "proj_out".into()]),
        )
        .unwrap();
    assert_eq!(
        m.adapted_modules(),
        [
            "transformer_blocks.0.img_mlp.net.2",
            "transformer_blocks.1.img_mlp.net.2",
            "proj_out"
        ]
    );
}

#[test]
fn lora_errors_are_typed() {
    let err = base::<B>()
        .attach_lora(&LoraConfig::new(4, 8.0).with_dropout(0.05))
        .unwrap_err();
    assert!(
        matches!(err, DitError::LoraDropout { given } if given == 0.05),
        "{err}"
    );
    let err = base::<B>()
        .attach_lora(&LoraConfig::new(0, -1.0).with_dropout(0.1))
        .unwrap_err();
    match err {
        DitError::InvalidLora { problems } => {
            let fields: Vec<_> = problems.iter().map(|p| p.field).collect();
            assert_eq!(fields, ["rank", "alpha", "dropout"]);
        }
        other => panic!("{other}"),
    }
    let err = base::<B>()
        .attach_lora(&LoraConfig::new(4, 8.0).with_target_modules(vec![
            "attn.to_q".into(),
            "attn.to_qq".into(),
            "q".into(),
        ]))
        .unwrap_err();
    assert!(
        matches!(&err, DitError::LoraTargetsUnmatched { targets } if targets == &["attn.to_qq", "q"]),
        "{err}"
    );
    let err = adapted::<B>()
        .attach_lora(&LoraConfig::new(4, 8.0))
        .unwrap_err();
    assert!(matches!(err, DitError::AdapterAlreadyAttached));
    let err = base::<B>()
        .save_peft_adapter(tempfile::tempdir().unwrap().path())
        .unwrap_err();
    assert!(matches!(err, DitError::NoAdapter));
}

#[test]
fn peft_dropout_config_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixtures().join("tiny_lora"), dir.path());
    edit_json(&dir.path().join(ADAPTER_CONFIG_FILE), |v| {
        v["lora_dropout"] = 0.1.into()
    });
    let err = base::<B>().load_peft_adapter(dir.path(), None).unwrap_err();
    assert!(matches!(err, DitError::LoraDropout { .. }), "{err}");
    edit_json(&dir.path().join(ADAPTER_CONFIG_FILE), |v| {
        v["lora_dropout"] = 0.0.into();
        v["use_dora"] = true.into();
        v["bias"] = "all".into();
    });
    let err = base::<B>().load_peft_adapter(dir.path(), None).unwrap_err();
    match err {
        DitError::UnsupportedAdapter { problems } => {
            let fields: Vec<_> = problems.iter().map(|p| p.field).collect();
            assert_eq!(fields, ["use_dora", "bias"]);
        }
        other => panic!("{other}"),
    }
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

fn edit_json(path: &std::path::Path, f: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

/// Every export form of the adapted fixture model under `dir` (see [`export_all`]).
fn export(dir: &std::path::Path) -> (QwenImageTransformer2DModel<B>, AdapterContract) {
    let mut model = adapted::<B>();
    let contract = export_all(&mut model, dir);
    (model, contract)
}

#[test]
fn exported_adapter_has_peft_layout_and_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let (model, contract) = export(dir.path());
    // the key layout, shapes and values are PEFT's own
    let ours = Checkpoint::open(dir.path().join("peft").join(ADAPTER_WEIGHTS_FILE)).unwrap();
    let theirs = Checkpoint::open(fixtures().join("tiny_lora").join(ADAPTER_WEIGHTS_FILE)).unwrap();
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>()
    );
    for k in theirs.keys() {
        assert_eq!(
            ours.stored(k).unwrap().shape,
            theirs.stored(k).unwrap().shape,
            "{k}"
        );
        assert_eq!(ours.read_f32(k), theirs.read_f32(k), "{k}");
    }
    // the config carries what PEFT needs, and the contract is recorded
    let cfg: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("peft").join(ADAPTER_CONFIG_FILE)).unwrap(),
    )
    .unwrap();
    let peft: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("tiny_lora").join(ADAPTER_CONFIG_FILE)).unwrap(),
    )
    .unwrap();
    for f in [
        "peft_type",
        "r",
        "lora_alpha",
        "lora_dropout",
        "bias",
        "use_rslora",
        "use_dora",
        "fan_in_fan_out",
    ] {
        assert_eq!(cfg[f].as_f64().or(None), peft[f].as_f64(), "{f}");
        assert_eq!(cfg[f].as_str(), peft[f].as_str(), "{f}");
        assert_eq!(cfg[f].as_bool(), peft[f].as_bool(), "{f}");
    }
    let mut a: Vec<_> = cfg["target_modules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    let mut b: Vec<_> = peft["target_modules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    a.sort();
    b.sort();
    assert_eq!(a, b);
    assert!(dir.path().join("peft").join(CONTRACT_FILE).is_file());
    assert_eq!(contract.base_model_hash, model.base_model_hash().unwrap());
    assert_eq!(
        (contract.rank, contract.alpha, contract.dropout),
        (4, 8.0, 0.0)
    );

    // reload with the contract checked: same outputs
    let again = base::<B>()
        .load_peft_adapter(dir.path().join("peft"), Some(&contract))
        .unwrap();
    let dev = Default::default();
    let c = case("two_frames");
    check(
        "reloaded export",
        again.forward(input::<B>(&c, &dev)),
        &c["adapted_output"],
    );
}

#[test]
fn merged_export_loads_as_a_plain_transformer() {
    let dir = tempfile::tempdir().unwrap();
    let _ = export(dir.path());
    let merged = QwenImageTransformer2DModel::<B>::from_pretrained(
        dir.path().join("merged"),
        &Default::default(),
        LoadOptions::default(),
    )
    .unwrap();
    assert!(merged.lora_config().is_none());
    let dev = Default::default();
    for c in forward_cases() {
        check(
            &format!("merged export/{}", c["name"]),
            merged.forward(input::<B>(&c, &dev)),
            &c["adapted_output"],
        );
    }
}

#[test]
fn contract_mismatches_are_refused_and_listed() {
    let dir = tempfile::tempdir().unwrap();
    let (_, contract) = export(dir.path());
    let peft = dir.path().join("peft");
    // 1. a contract whose alpha disagrees with the adapter config
    edit_json(&peft.join(CONTRACT_FILE), |v| v["alpha"] = 16.0.into());
    match base::<B>().load_peft_adapter(&peft, None).unwrap_err() {
        DitError::ContractMismatch { mismatches } => {
            assert_eq!(
                mismatches.iter().map(|m| m.field).collect::<Vec<_>>(),
                ["alpha"]
            );
        }
        other => panic!("{other}"),
    }
    edit_json(&peft.join(CONTRACT_FILE), |v| v["alpha"] = 8.0.into());
    // 2. a different base model: its hash differs
    let mut other = base::<B>();
    let w = other.proj_out.bias.as_ref().unwrap().val();
    other.proj_out.bias = Some(burn::module::Param::from_tensor(w.add_scalar(1e-3)));
    other.compute_base_model_hash().unwrap();
    match other.load_peft_adapter(&peft, None).unwrap_err() {
        DitError::ContractMismatch { mismatches } => {
            assert_eq!(
                mismatches.iter().map(|m| m.field).collect::<Vec<_>>(),
                ["base_model_hash"]
            );
        }
        other => panic!("{other}"),
    }
    // 3. the caller's expected contract (e.g. the run's recipe) disagrees in rank and targets
    let mut expected = contract.clone();
    expected.rank = 8;
    expected.target_modules.pop();
    match base::<B>()
        .load_peft_adapter(&peft, Some(&expected))
        .unwrap_err()
    {
        DitError::ContractMismatch { mismatches } => {
            assert_eq!(
                mismatches.iter().map(|m| m.field).collect::<Vec<_>>(),
                ["rank", "target_modules"]
            );
        }
        other => panic!("{other}"),
    }
    // 4. an expected contract and none on disk (PEFT's own directory)
    let err = base::<B>()
        .load_peft_adapter(fixtures().join("tiny_lora"), Some(&contract))
        .unwrap_err();
    assert!(matches!(err, DitError::ContractMismatch { .. }), "{err}");
}

#[test]
fn adapter_tensor_problems_are_reported_together() {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixtures().join("tiny_lora"), dir.path());
    let src = Checkpoint::open(fixtures().join("tiny_lora").join(ADAPTER_WEIGHTS_FILE)).unwrap();
    let mut tensors = Vec::new();
    for k in src.keys() {
        let shape = src.stored(k).unwrap().shape;
        let v = src.read_f32(k).unwrap();
        if k.contains("blocks.0.attn.to_q.lora_A") {
            continue; // missing
        }
        if k.contains("blocks.1.attn.to_k.lora_B") {
            tensors.push((k.to_string(), vec![shape[0] / 2, shape[1] * 2], v)); // mis-shaped
            continue;
        }
        tensors.push((k.to_string(), shape, v));
    }
    tensors.push((
        "base_model.model.transformer_blocks.0.attn.to_q.lora_C.weight".into(),
        vec![1],
        vec![0.0],
    ));
    dit_models::weights::write_safetensors(
        &dir.path().join(ADAPTER_WEIGHTS_FILE),
        tensors,
        &BTreeMap::new(),
    )
    .unwrap();
    match base::<B>().load_peft_adapter(dir.path(), None).unwrap_err() {
        DitError::Weights { report, .. } => {
            assert_eq!(
                report.missing,
                ["base_model.model.transformer_blocks.0.attn.to_q.lora_A.weight"]
            );
            assert_eq!(
                report.unexpected,
                ["base_model.model.transformer_blocks.0.attn.to_q.lora_C.weight"]
            );
            assert_eq!(report.mismatched.len(), 1);
            assert_eq!(
                report.mismatched[0].key,
                "base_model.model.transformer_blocks.1.attn.to_k.lora_B.weight"
            );
        }
        other => panic!("{other}"),
    }
}

/// Samplers take the trait; the reference policy is the same model with adapters off.
fn velocities<B: Backend, M: VelocityModel<B, Conditioning = QwenImageConditioning<B>>>(
    m: &M,
    c: &Value,
) -> burn::tensor::Tensor<B, 3> {
    let dev = Default::default();
    let i = input::<B>(c, &dev);
    let cond = QwenImageConditioning {
        encoder_hidden_states: i.encoder_hidden_states,
        encoder_hidden_states_mask: i.encoder_hidden_states_mask,
        img_shapes: i.img_shapes,
    };
    m.velocity(i.hidden_states, i.timestep, &cond)
}

#[test]
fn velocity_trait_serves_policy_and_reference() {
    let model = adapted::<B>();
    let c = case("text_mask");
    check(
        "policy",
        velocities::<B, _>(&model, &c),
        &c["adapted_output"],
    );
    check(
        "reference",
        velocities::<B, _>(&model.without_adapters(), &c),
        &c["output"],
    );
}

/// Writes the exports where `fixtures/generate/interop_fixtures.py --verify-export` reads
/// them when `DIT_MODELS_EXPORT_DIR` is set (the cross-check with PEFT's and diffusers' own
/// loaders whose file hashes `interop.rs` compares).
#[test]
fn export_for_python_check() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::env::var_os("DIT_MODELS_EXPORT_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| tmp.path().into());
    export(&dir);
    for f in [
        "peft/adapter_model.safetensors",
        "peft/adapter_config.json",
        "peft/adapter_contract.json",
        "diffusers_lora/pytorch_lora_weights.safetensors",
        "merged/config.json",
        "merged/diffusion_pytorch_model.safetensors",
        "merged_sharded_bf16/diffusion_pytorch_model.safetensors.index.json",
    ] {
        assert!(dir.join(f).is_file(), "{f}");
    }
}

#[test]
fn merged_export_can_be_sharded_bf16() {
    let dir = tempfile::tempdir().unwrap();
    let model = adapted::<B>();
    model
        .save_merged_diffusers(dir.path().join("f32"), ExportOptions::default())
        .unwrap();
    let options = ExportOptions {
        dtype: ExportDtype::Bf16,
        max_shard_bytes: Some(40_000),
    };
    model
        .save_merged_diffusers(dir.path().join("bf16"), options)
        .unwrap();
    let f32s = Checkpoint::open(dir.path().join("f32")).unwrap();
    let bf16 = Checkpoint::open(dir.path().join("bf16")).unwrap();
    assert_eq!(f32s.num_shards(), 1);
    assert!(bf16.num_shards() > 1, "{} shards", bf16.num_shards());
    assert_eq!(
        f32s.keys().collect::<Vec<_>>(),
        bf16.keys().collect::<Vec<_>>()
    );
    for k in f32s.keys() {
        assert_eq!(bf16.stored(k).unwrap().dtype, "BF16");
        let rounded: Vec<f32> = f32s
            .read_f32(k)
            .unwrap()
            .into_iter()
            .map(|v| half::bf16::from_f32(v).to_f32())
            .collect();
        assert_eq!(bf16.read_f32(k).unwrap(), rounded, "{k}");
    }
    let loaded = QwenImageTransformer2DModel::<B>::from_pretrained(
        dir.path().join("bf16"),
        &Default::default(),
        LoadOptions::default(),
    )
    .unwrap();
    let dev = Default::default();
    let c = case("square");
    let (shape, data) = values(&c["adapted_output"]);
    let err = max_abs_diff(loaded.forward(input::<B>(&c, &dev)), (&shape, &data));
    assert!(err < 5e-2, "bf16 merged export drifts by {err}");
}

/// A keyed adapter's `A` is a pure function of the seed and the layer's name: the same
/// whatever the backend's random stream holds, another for another seed, inside PEFT's bound,
/// and a layer's own whichever other layers are adapted.
#[test]
fn a_keyed_adapter_depends_on_its_seed_and_layer_alone() {
    let a_of = |model: &dit_models::QwenImageTransformer2DModel<B>, block: usize| {
        let l = model.transformer_blocks[block]
            .attn
            .to_q
            .lora
            .as_ref()
            .unwrap();
        l.lora_a.val().into_data().to_vec::<f32>().unwrap()
    };
    let dev = burn::tensor::Device::<B>::default();
    let cfg = LoraConfig::new(4, 8.0);
    B::seed(&dev, 1);
    let one = base::<B>().attach_lora_keyed(&cfg, 7).unwrap();
    // other draws from the shared stream in between change nothing
    B::seed(&dev, 2);
    let _ = burn::tensor::Tensor::<B, 1>::random([100], burn::tensor::Distribution::Default, &dev);
    let two = base::<B>().attach_lora_keyed(&cfg, 7).unwrap();
    assert_eq!(a_of(&one, 0), a_of(&two, 0));
    assert_eq!(a_of(&one, 1), a_of(&two, 1));
    // another seed, another adapter; another layer, other values
    let other = base::<B>().attach_lora_keyed(&cfg, 8).unwrap();
    assert_ne!(a_of(&one, 0), a_of(&other, 0));
    assert_ne!(a_of(&one, 0), a_of(&one, 1));
    // PEFT's Kaiming-uniform bound 1/sqrt(d_in), and not all near zero
    let q = &one.transformer_blocks[0].attn.to_q;
    let d_in = q.weight.val().dims()[0];
    let bound = 1.0 / (d_in as f32).sqrt();
    let a = a_of(&one, 0);
    assert_eq!(a.len(), d_in * 4);
    assert!(a.iter().all(|v| v.abs() <= bound), "{a:?}");
    assert!(a.iter().any(|v| v.abs() > bound / 2.0), "{a:?}");
    // a layer's A does not depend on which other layers carry an adapter
    let only_q = base::<B>()
        .attach_lora_keyed(
            &cfg.clone().with_target_modules(vec!["attn.to_q".into()]),
            7,
        )
        .unwrap();
    assert_eq!(a_of(&only_q, 1), a_of(&one, 1));
}
