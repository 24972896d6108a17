//! Export of a committed checkpoint of a short shapes-world run, in every form, verified:
//! what `examples/export.rs` runs. Read-only on the run; refusals leave nothing behind.

mod shapes_common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use dit_models::{
    Checkpoint, ExportDtype, ImportDropout, LoadOptions, QwenImageTransformer2DModel, read_adapter,
};
use shapes_common::{B, Brightness, param_bits, start_in, tiny_config, tiny_generator};
use trainer_fsdp::export::{ExportForm, ExportRequest, export};
use trainer_fsdp::{PreflightWarning, StopFlag, Trainable, TrainerError};

/// Every file under `root` with its bytes.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else {
                out.insert(p.clone(), std::fs::read(&p).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, &mut out);
    out
}

/// A finished 2-rollout run (a checkpoint after each) of the tiny shapes world under `root`;
/// returns its run directory.
fn finished_run(root: &Path) -> PathBuf {
    tiny_generator(&root.join("generator"));
    let run_dir = root.join("run");
    let mut run = start_in(
        root,
        &run_dir,
        2,
        &["eval.interval=0"],
        Box::new(Brightness),
    );
    run.run(&StopFlag::new()).unwrap();
    run_dir
}

fn exp(
    source: &Path,
    iteration: Option<u64>,
    out: &Path,
    request: &ExportRequest,
    overwrite: bool,
) -> Result<trainer_fsdp::export::ExportReport, TrainerError> {
    export::<B>(
        source,
        iteration,
        None,
        out,
        request,
        overwrite,
        &Default::default(),
    )
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn every_form_exports_verified_and_the_run_is_untouched() {
    let root = tempfile::tempdir().unwrap();
    let run_dir = finished_run(root.path());
    let before = snapshot(root.path());
    let out = root.path().join("exports");

    let peft = exp(
        &run_dir,
        None,
        &out.join("peft"),
        &ExportRequest::new(ExportForm::Peft),
        false,
    )
    .unwrap();
    assert_eq!(
        peft.checkpoint.iteration, 1,
        "the newest committed checkpoint"
    );
    let v = peft.exported.verification.as_ref().unwrap();
    assert_eq!(v.max_abs, 0.0, "an f32 round trip of the factors is exact");
    assert!(v.values > 0);
    assert_eq!(
        files(&out.join("peft")),
        [
            "adapter_config.json",
            "adapter_contract.json",
            "adapter_model.safetensors"
        ]
    );
    let cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("peft/adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        cfg["base_model_name_or_path"],
        root.path()
            .join("generator/transformer")
            .display()
            .to_string()
    );

    let lora = exp(
        &run_dir,
        None,
        &out.join("lora"),
        &ExportRequest::new(ExportForm::DiffusersLora),
        false,
    )
    .unwrap();
    assert_eq!(lora.exported.verification.as_ref().unwrap().max_abs, 0.0);
    assert_eq!(
        files(&out.join("lora")),
        ["adapter_contract.json", "pytorch_lora_weights.safetensors"]
    );
    // both adapter forms carry the same factors and configuration
    let a = read_adapter(&out.join("peft"), ImportDropout::Refuse).unwrap();
    let b = read_adapter(&out.join("lora"), ImportDropout::Refuse).unwrap();
    assert_eq!(
        (a.config.clone(), a.contract.clone()),
        (b.config.clone(), b.contract.clone())
    );
    assert_eq!((a.config.rank, a.config.alpha), (2, 4.0));
    let (pa, pb) = (
        Checkpoint::open(&a.weights).unwrap(),
        Checkpoint::open(&b.weights).unwrap(),
    );
    for k in pa.keys() {
        let k2 = format!(
            "transformer.{}",
            k.strip_prefix("base_model.model.").unwrap()
        );
        assert_eq!(pa.read_f32(k), pb.read_f32(&k2), "{k}");
    }

    let merged = exp(
        &run_dir,
        None,
        &out.join("merged"),
        &ExportRequest::new(ExportForm::Merged),
        false,
    )
    .unwrap();
    let v = merged.exported.verification.as_ref().unwrap();
    assert!(v.max_abs <= v.tolerance && v.tolerance <= 1e-3, "{v:?}");
    let sharded = ExportRequest {
        dtype: ExportDtype::Bf16,
        max_shard_bytes: Some(20_000),
        ..ExportRequest::new(ExportForm::Merged)
    };
    exp(&run_dir, None, &out.join("bf16"), &sharded, false).unwrap();
    let shards = files(&out.join("bf16"));
    assert!(shards.contains(&"diffusion_pytorch_model.safetensors.index.json".to_string()));
    assert!(
        shards
            .iter()
            .filter(|f| f.ends_with(".safetensors"))
            .count()
            > 1,
        "{shards:?}"
    );
    QwenImageTransformer2DModel::<burn::backend::Flex>::from_pretrained(
        out.join("bf16"),
        &Default::default(),
        LoadOptions::default(),
    )
    .unwrap();

    // every LoRA checkpoint is itself a PEFT adapter directory: the same bytes as the export
    let ckpt = peft.checkpoint.dir.clone();
    for f in ["adapter_model.safetensors", "adapter_config.json"] {
        assert_eq!(
            std::fs::read(ckpt.join(f)).unwrap(),
            std::fs::read(out.join("peft").join(f)).unwrap(),
            "{f}"
        );
    }
    let in_ckpt = read_adapter(&ckpt, ImportDropout::Refuse).unwrap();
    assert_eq!(in_ckpt.config, a.config);
    assert_eq!(
        in_ckpt.contract, a.contract,
        "the checkpoint's own contract"
    );

    // nothing in the run changed, and no staging directory is left
    let mut after = snapshot(root.path());
    after.retain(|p, _| !p.starts_with(&out));
    assert_eq!(before, after, "the export wrote into the run");
    assert_eq!(files(&out), ["bf16", "lora", "merged", "peft"]);
}

#[test]
fn an_iteration_is_picked_refused_when_uncommitted_and_outputs_are_not_clobbered() {
    let root = tempfile::tempdir().unwrap();
    let run_dir = finished_run(root.path());
    let out = root.path().join("out");
    let req = ExportRequest::new(ExportForm::Peft);

    // the checkpoint's own directory, and --iteration, name the same checkpoint; this run
    // keeps its checkpoints outside its directory, so its config is named
    let iter0 = root.path().join("ckpt/t2i/iter_0000000");
    let err = exp(&iter0, None, &out.join("a"), &req, false).unwrap_err();
    assert!(err.to_string().contains("--config"), "{err}");
    let config = run_dir.join("config.resolved.toml");
    let first = export::<B>(
        &iter0,
        None,
        Some(&config),
        &out.join("a"),
        &req,
        false,
        &Default::default(),
    )
    .unwrap();
    assert_eq!(first.checkpoint.iteration, 0);
    exp(&run_dir, Some(0), &out.join("b"), &req, false).unwrap();
    let bytes = |d: &str| std::fs::read(out.join(d).join("adapter_model.safetensors")).unwrap();
    assert_eq!(bytes("a"), bytes("b"));
    exp(&run_dir, Some(1), &out.join("c"), &req, false).unwrap();
    assert_ne!(bytes("a"), bytes("c"), "rollout 1 trained the adapter");

    let err = exp(&run_dir, Some(7), &out.join("d"), &req, false).unwrap_err();
    assert!(matches!(err, TrainerError::ExportSource { .. }), "{err}");
    assert!(err.to_string().contains("committed: [0, 1]"), "{err}");
    let err = export::<B>(
        &iter0,
        Some(1),
        Some(&config),
        &out.join("d"),
        &req,
        false,
        &Default::default(),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("names checkpoint 0 and --iteration 1"),
        "{err}"
    );
    let err = exp(root.path(), None, &out.join("d"), &req, false).unwrap_err();
    assert!(err.to_string().contains("config.resolved.toml"), "{err}");
    assert!(!out.join("d").exists());

    // an existing export is refused, then replaced whole with --overwrite
    let err = exp(&run_dir, Some(1), &out.join("a"), &req, false).unwrap_err();
    assert!(matches!(err, TrainerError::ExportTarget { .. }), "{err}");
    assert_eq!(bytes("a"), bytes("b"), "the refused export changed nothing");
    std::fs::write(out.join("a").join("stale.json"), b"{}").unwrap();
    let r = exp(&run_dir, Some(1), &out.join("a"), &req, true).unwrap();
    assert!(r.replaced);
    assert_eq!(bytes("a"), bytes("c"));
    assert!(
        !out.join("a/stale.json").exists(),
        "the old export's files are gone"
    );
    assert_eq!(
        files(&out),
        ["a", "b", "c"],
        "no staging or replaced directory left"
    );

    // requests a form does not take are refused before anything is read
    let bad = ExportRequest {
        dtype: ExportDtype::Bf16,
        max_shard_bytes: Some(10),
        ..ExportRequest::new(ExportForm::DiffusersLora)
    };
    let err = exp(&run_dir, None, &out.join("e"), &bad, false).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("--dtype bf16") && msg.contains("--max-shard-bytes"),
        "{msg}"
    );
    assert!(
        ExportForm::parse("safetensors")
            .unwrap_err()
            .to_string()
            .contains("peft, diffusers-lora, merged")
    );
}

#[test]
fn an_exported_adapter_starts_a_new_run_where_the_old_one_ended() {
    let root = tempfile::tempdir().unwrap();
    tiny_generator(&root.path().join("generator"));
    let mut first = start_in(
        root.path(),
        &root.path().join("run"),
        2,
        &["eval.interval=0"],
        Box::new(Brightness),
    );
    first.run(&StopFlag::new()).unwrap();
    let trained = param_bits(first.model());
    drop(first);
    let out = root.path().join("out");
    for (form, dir) in [
        (ExportForm::Peft, "peft"),
        (ExportForm::DiffusersLora, "lora"),
    ] {
        exp(
            &root.path().join("run"),
            None,
            &out.join(dir),
            &ExportRequest::new(form),
            false,
        )
        .unwrap();
        let init = format!("lora.init_from={}", out.join(dir).display());
        let second = root.path().join(format!("second_{dir}"));
        let own = [
            format!("checkpoint.dir={}", second.join("ckpt").display()),
            format!("artifacts.root={}", second.join("artifacts").display()),
        ];
        let extra = ["eval.interval=0", &init, &own[0], &own[1]];
        let run = start_in(root.path(), &second, 2, &extra, Box::new(Brightness));
        assert_eq!(
            param_bits(run.model()),
            trained,
            "{dir}: the run starts from the adapter"
        );
    }

    // a section that disagrees with the adapter: every difference named
    let init = format!("lora.init_from={}", out.join("peft").display());
    let cfg = tiny_config(root.path(), 1, &[&init, "lora.rank=4", "lora.alpha=3.0"]);
    let msg = cfg.preflight().unwrap_err().to_string();
    assert!(msg.contains("lora.rank = 4 but the adapter has 2"), "{msg}");
    assert!(
        msg.contains("lora.alpha = 3 but the adapter has 4"),
        "{msg}"
    );

    // an adapter saved with dropout: refused with the way out, or zeroed with a warning
    let cfg_path = out.join("peft/adapter_config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    v["lora_dropout"] = 0.1.into();
    std::fs::write(&cfg_path, v.to_string()).unwrap();
    let msg = tiny_config(root.path(), 1, &[&init])
        .preflight()
        .unwrap_err()
        .to_string();
    assert!(msg.contains("lora.init_dropout = \"zero\""), "{msg}");
    let pre = tiny_config(root.path(), 1, &[&init, "lora.init_dropout=\"zero\""])
        .preflight()
        .unwrap();
    assert!(pre.warnings.iter().any(
        |w| matches!(w, PreflightWarning::LoraInitDropoutZeroed { given, .. } if *given == 0.1)
    ));
    let Trainable::LoraFrom(from) = &pre.trainable else {
        panic!("{:?}", pre.trainable)
    };
    assert_eq!(from.config.dropout, 0.0);
    let msg = tiny_config(root.path(), 1, &["lora.init_from=/nonexistent"])
        .preflight()
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("lora.init_from = /nonexistent") && msg.contains("no adapter here"),
        "{msg}"
    );
}

#[test]
fn resume_checks_the_readable_copy_against_the_weights_it_restores() {
    let root = tempfile::tempdir().unwrap();
    let run_dir = finished_run(root.path());
    let resume = |extra: &[&str]| {
        let cfg = tiny_config(
            root.path(),
            3,
            &[&["eval.interval=0", "checkpoint.resume=true"], extra].concat(),
        );
        let pre = cfg.preflight().unwrap();
        let world = trainer_fsdp::shapes_world::ShapesWorld::<burn::backend::Flex>::load(
            &root.path().join("generator"),
            &cfg.reward.scorers,
            &Default::default(),
        )
        .unwrap()
        .with_scorer(Box::new(Brightness));
        let trainer_fsdp::AlgorithmPlan::FlowGrpo { clip_range, .. } = pre.algorithm.clone() else {
            panic!("a FlowGRPO plan")
        };
        trainer_fsdp::Run::<B, _, _, _>::new(
            cfg,
            pre,
            &run_dir,
            Default::default(),
            world,
            trainer_fsdp::FlowGrpo::new(clip_range),
            trainer_fsdp::LocalWorkers::new(1),
        )
        .map(|_| ())
    };
    let allow = ["run.num_rollouts=3"];
    resume(&allow).unwrap();

    // a readable copy that disagrees with model.mpk (its COMMITTED entry made to match, so
    // that only the comparison can catch it) is refused
    let ckpt = root.path().join("ckpt/t2i/iter_0000001");
    let cfg_path = ckpt.join("adapter_config.json");
    let edited = std::fs::read_to_string(&cfg_path)
        .unwrap()
        .replace("\"r\": 2", "\"r\": 2 ");
    std::fs::write(&cfg_path, &edited).unwrap();
    let manifest_path = ckpt.join("COMMITTED");
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest_path).unwrap()).unwrap();
    for f in manifest["files"].as_array_mut().unwrap() {
        if f["name"] == "adapter_config.json" {
            f["bytes"] = edited.len().into();
            f["xxh3_128"] =
                format!("{:032x}", xxhash_rust::xxh3::xxh3_128(edited.as_bytes())).into();
        }
    }
    std::fs::write(&manifest_path, manifest.to_string()).unwrap();
    let err = resume(&allow).unwrap_err();
    assert!(
        err.to_string()
            .contains("adapter_config.json differs from the weights restored from model.mpk"),
        "{err}"
    );
}
