//! The `qwen_image_t2i_lora` recipe end to end in the Qwen-Image world, on the tiny random
//! diffusers directory of `fixtures/qwen_image/tiny_pipeline` (saved by
//! `QwenImagePipeline.save_pretrained`) scored by the tiny random PickScore of
//! `fixtures/reward/tiny_clip`: rollouts with their sidecars and images, metrics, evaluations,
//! committed checkpoints readable by PEFT, and a resume that continues the run.

use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, Flex};
use trainer_fsdp::config::{GeneratorSource, ScorerSpec};
use trainer_fsdp::dispatch::{Job, dispatch, train};
use trainer_fsdp::export::{ExportForm, ExportRequest, export};
use trainer_fsdp::{
    Algorithm, CheckpointStore, Override, RecipeName, StopFlag, TrainConfig, TrainerError, World,
    names, read_jsonl,
};

type B = Autodiff<Flex>;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|d| d.join("fixtures"))
        .find(|d| d.join("qwen_image").is_dir())
        .expect("fixtures/ above the crate")
}

fn write_prompts(path: &Path, prompts: &[(&str, &str)]) {
    let lines: Vec<String> = prompts
        .iter()
        .enumerate()
        .map(|(i, (p, category))| {
            serde_json::json!({
                "prompt": p,
                "metadata": {"task": "t2i", "sample_id": format!("s{i}"), "category": category},
            })
            .to_string()
        })
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// The recipe at a tiny size in `root`: 32x48 images (a 2x3 token grid), 4 steps, 2 prompts
/// x 4 candidates, LoRA rank 2.
fn tiny_config(root: &Path, rollouts: u64, extra: &[&str]) -> TrainConfig {
    let lora = ["lora.rank=2", "lora.alpha=4.0"];
    let extra: Vec<&str> = lora.iter().chain(extra).copied().collect();
    tiny_config_of(RecipeName::QwenImageT2iLora, root, rollouts, &extra)
}

/// [`tiny_config`]'s sizes on `recipe`, without its LoRA keys.
fn tiny_config_of(recipe: RecipeName, root: &Path, rollouts: u64, extra: &[&str]) -> TrainConfig {
    let train_file = root.join("train.jsonl");
    let eval_file = root.join("eval.jsonl");
    write_prompts(
        &train_file,
        &[
            ("a red circle above a blue square", "position"),
            ("two green triangles", "counting"),
            ("a cat sitting on a wooden table", "object"),
            ("a yellow star on a white background", "colors"),
        ],
    );
    write_prompts(
        &eval_file,
        &[
            ("a photo of a red circle", "single"),
            ("two yellow stars", "counting"),
        ],
    );
    let dir = |name: &str| root.join(name).display().to_string();
    let mut o = vec![
        "run.num_rollouts=".to_string() + &rollouts.to_string(),
        "run.host_threads=2".into(),
        "sampling.height=32".into(),
        "sampling.width=48".into(),
        "sampling.num_inference_steps=4".into(),
        "sampling.sde_pool=[1, 2]".into(),
        "sampling.sde_indices=[1, 2]".into(),
        "sampling.num_sde_steps=2".into(),
        "rollout.prompts_per_rollout=2".into(),
        "rollout.group_size=4".into(),
        "rollout.micro_batch_size=4".into(),
        "eval.interval=1".into(),
        "eval.samples_per_prompt=1".into(),
        "checkpoint.save_interval=1".into(),
        format!("checkpoint.dir={}", dir("ckpt")),
        format!("artifacts.root={}", dir("artifacts")),
        format!("data.train={}", train_file.display()),
        format!("data.eval={}", eval_file.display()),
        "monitor.progress=\"never\"".into(),
    ];
    o.extend(extra.iter().map(|s| s.to_string()));
    let overrides = Override::parse_all(&o).unwrap();
    let mut cfg = TrainConfig::from_recipe(recipe, &overrides).unwrap();
    cfg.model.generator = GeneratorSource::QwenImage {
        model_path: fixtures().join("qwen_image").join("tiny_pipeline"),
        variant: None,
    };
    cfg.reward.scorers = vec![ScorerSpec::Pickscore {
        model_path: fixtures().join("reward").join("tiny_clip"),
    }];
    cfg
}

#[test]
fn the_recipe_runs_end_to_end_on_the_tiny_directory_and_resumes() {
    let root = tempfile::tempdir().unwrap();
    let run_dir = root.path().join("run");
    let device = Default::default();
    let cfg = tiny_config(root.path(), 2, &[]);
    let pre = cfg.preflight().unwrap();
    let summary = train::<B>(&cfg, &pre, &run_dir, &device, &StopFlag::new()).unwrap();
    assert_eq!(summary.last_rollout, Some(1));
    let (initial, last) = (summary.initial_eval.unwrap(), summary.final_eval.unwrap());
    assert!(initial.reward.is_finite() && last.reward.is_finite());

    // metrics: one record per rollout, PickScore's component, real optimizer steps
    let metrics = read_jsonl(&run_dir.join("metrics.jsonl")).unwrap();
    let rollouts: Vec<_> = metrics
        .iter()
        .filter(|r| r.metrics.contains_key(names::TRAIN_OPTIMIZER_STEPS))
        .collect();
    assert_eq!(rollouts.len(), 2, "{metrics:?}");
    for r in &rollouts {
        assert_eq!(r.metrics[names::TRAIN_OPTIMIZER_STEPS], Some(2.0));
        assert!(r.metrics["reward/pickscore_mean"].is_some_and(f64::is_finite));
    }
    assert!(
        metrics.iter().any(|r| r
            .metrics
            .contains_key(&trainer_fsdp::run::eval_category("counting"))),
        "per-category evaluation"
    );
    // sidecars and images of every rollout
    let layout = trajectory::ArtifactLayout::new(root.path().join("artifacts"), "t2i").unwrap();
    let files: Vec<String> = std::fs::read_dir(layout.rollout_dir(trajectory::Split::Train, 1))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        files.iter().filter(|f| f.ends_with(".safetensors")).count(),
        2,
        "{files:?}"
    );
    assert_eq!(
        files.iter().filter(|f| f.ends_with(".png")).count(),
        8,
        "{files:?}"
    );
    assert!(run_dir.join("samples").join("eval_initial.png").is_file());
    // a committed checkpoint, with the adapter as a PEFT directory's files
    let store = CheckpointStore::new(root.path().join("ckpt"), "t2i", None).unwrap();
    let latest = store.latest_committed().unwrap().unwrap();
    assert_eq!(latest.iteration, 1);
    assert!(latest.dir.join("adapter_model.safetensors").is_file());
    assert!(latest.dir.join("adapter_config.json").is_file());
    // the optimizer moved the adapter: its B matrices start at zero
    let adapter =
        model_weights::Checkpoint::open(latest.dir.join("adapter_model.safetensors"), &[]).unwrap();
    let moved = adapter
        .keys()
        .filter(|k| k.contains("lora_B"))
        .any(|k| adapter.read_f32(k).unwrap().iter().any(|v| *v != 0.0));
    assert!(moved, "every lora_B is still zero");

    // resume: one more rollout, continuing from the committed one
    let cfg = tiny_config(root.path(), 3, &["checkpoint.resume=true"]);
    let pre = cfg.preflight().unwrap();
    let summary = train::<B>(&cfg, &pre, &run_dir, &device, &StopFlag::new()).unwrap();
    assert_eq!(summary.last_rollout, Some(2));
    let metrics = read_jsonl(&run_dir.join("metrics.jsonl")).unwrap();
    let steps: Vec<u64> = metrics
        .iter()
        .filter(|r| r.metrics.contains_key(names::TRAIN_OPTIMIZER_STEPS))
        .map(|r| r.step)
        .collect();
    assert_eq!(steps, [0, 1, 2]);
    assert_eq!(store.latest_committed().unwrap().unwrap().iteration, 2);

    // the trained adapter leaves in the ecosystem's forms, each reloaded and checked
    for form in [ExportForm::Peft, ExportForm::Merged] {
        let out = root.path().join("exports").join(form.as_str());
        let report = export::<B>(
            &run_dir,
            None,
            None,
            &out,
            &ExportRequest::new(form),
            false,
            &device,
        )
        .unwrap();
        assert!(
            report.exported.verification.is_some(),
            "{form:?} was not verified"
        );
    }
}

/// Seed 002's full fine-tune recipe (`qwen_image_t2i_full`: every weight trained, held in
/// bf16 as `model.param_dtype` says, no f32 master copy) at the tiny size: it trains, commits
/// a checkpoint of the whole transformer, resumes from it with AdamW's bf16 moments restored
/// exactly (the resumed rollout's metrics are the uninterrupted run's bits), and exports the
/// merged form, which rebuilds the policy in f32 from the bf16 checkpoint and checks its
/// velocities against the trained policy's. The adapter forms are refused by name.
/// The attention weight the full fine-tune tests compare.
const TO_Q: &str = "transformer_blocks.0.attn.to_q.weight";

/// A merged export of the run in `run_dir` into `out`, its report, and [`TO_Q`] as the export
/// and as the tiny directory's base hold it.
fn merged_to_q_against_base(
    run_dir: &Path,
    out: &Path,
) -> (trainer_fsdp::export::ExportReport, Vec<f32>, Vec<f32>) {
    let report = export::<B>(
        run_dir,
        None,
        None,
        out,
        &ExportRequest::new(ExportForm::Merged),
        false,
        &Default::default(),
    )
    .unwrap();
    let base = fixtures()
        .join("qwen_image")
        .join("tiny_pipeline")
        .join("transformer");
    let [exported, base] = [out, base.as_path()].map(|dir| {
        model_weights::Checkpoint::open_variant(dir, &[model_weights::DIFFUSERS], None)
            .unwrap()
            .read_f32(TO_Q)
            .unwrap()
    });
    (report, exported, base)
}

/// The metrics of the record at `step` that holds a training phase.
fn train_record(dir: &Path, step: u64) -> std::collections::BTreeMap<String, Option<f64>> {
    read_jsonl(&dir.join("metrics.jsonl"))
        .unwrap()
        .into_iter()
        .rfind(|r| r.step == step && r.metrics.contains_key(names::TRAIN_OPTIMIZER_STEPS))
        .unwrap()
        .metrics
        .into_iter()
        .collect()
}

#[test]
fn the_ema_of_a_bf16_full_fine_tune_averages_in_f32_and_resumes_exactly() {
    let root = tempfile::tempdir().unwrap();
    let run_dir = root.path().join("run");
    let device = Default::default();
    let full = RecipeName::QwenImageT2iFull;
    let sizes = [
        "optimizer.lr_warmup_iters=0",
        "optimizer.lr=1e-3",
        "ema={ decay = 0.9, warmup = \"none\", update_interval = 1, precision = \"fp32\" }",
    ];
    let cfg = tiny_config_of(full, root.path(), 2, &sizes);
    let pre = cfg.preflight().unwrap();
    train::<B>(&cfg, &pre, &run_dir, &device, &StopFlag::new()).unwrap();
    // the checkpoint keeps the f32 average beside the bf16 copy evaluations sample with
    let store = CheckpointStore::new(root.path().join("ckpt"), "t2i", None).unwrap();
    let last = store.latest_committed().unwrap().unwrap();
    for name in [
        trainer_fsdp::checkpoint::EMA_FILE,
        trainer_fsdp::checkpoint::EMA_AVERAGE_FILE,
    ] {
        assert!(store.read_file(&last, name).unwrap().is_some(), "{name}");
    }

    let mut more: Vec<&str> = sizes.to_vec();
    more.push("checkpoint.resume=true");
    let cfg = tiny_config_of(full, root.path(), 3, &more);
    let pre = cfg.preflight().unwrap();
    train::<B>(&cfg, &pre, &run_dir, &device, &StopFlag::new()).unwrap();
    let straight = tempfile::tempdir().unwrap();
    let cfg = tiny_config_of(full, straight.path(), 3, &sizes);
    let pre = cfg.preflight().unwrap();
    let straight_run = straight.path().join("run");
    train::<B>(&cfg, &pre, &straight_run, &device, &StopFlag::new()).unwrap();
    // the evaluation after the resumed rollout samples with the EMA: the same bits as the
    // uninterrupted run's, so the average came back exactly
    let (resumed, uninterrupted) = (train_record(&run_dir, 2), train_record(&straight_run, 2));
    for key in ["train/loss", "eval/reward"] {
        assert!(resumed[key].is_some(), "{key}");
        assert_eq!(resumed[key], uninterrupted[key], "{key}");
    }

    // the export holds the EMA copy, and it moved from the base
    let out = root.path().join("exports").join("merged");
    let (_, a, b) = merged_to_q_against_base(&run_dir, &out);
    let moved = a.iter().zip(&b).filter(|(x, y)| x != y).count();
    assert!(
        moved * 2 > a.len(),
        "{moved} of {} weights of {TO_Q} moved",
        a.len()
    );
}

#[test]
fn the_full_fine_tune_in_bf16_trains_resumes_and_exports() {
    let root = tempfile::tempdir().unwrap();
    let run_dir = root.path().join("run");
    let device = Default::default();
    let full = RecipeName::QwenImageT2iFull;
    // a rate at which bf16 weights visibly move, from the first step
    let sizes = ["optimizer.lr_warmup_iters=0", "optimizer.lr=1e-3"];
    let cfg = tiny_config_of(full, root.path(), 2, &sizes);
    assert_eq!(
        cfg.model.param_dtype,
        Some(trainer_fsdp::config::ParamDtype::Bf16)
    );
    let pre = cfg.preflight().unwrap();
    let summary = train::<B>(&cfg, &pre, &run_dir, &device, &StopFlag::new()).unwrap();
    assert_eq!(summary.last_rollout, Some(1));
    assert!(summary.final_eval.unwrap().reward.is_finite());
    let metrics = read_jsonl(&run_dir.join("metrics.jsonl")).unwrap();
    let steps: Vec<Option<f64>> = metrics
        .iter()
        .filter_map(|r| r.metrics.get(names::TRAIN_OPTIMIZER_STEPS).copied())
        .collect();
    assert_eq!(steps, [Some(2.0), Some(2.0)], "{metrics:?}");
    let store = CheckpointStore::new(root.path().join("ckpt"), "t2i", None).unwrap();
    assert_eq!(store.latest_committed().unwrap().unwrap().iteration, 1);

    let mut more: Vec<&str> = sizes.to_vec();
    more.push("checkpoint.resume=true");
    let cfg = tiny_config_of(full, root.path(), 3, &more);
    let pre = cfg.preflight().unwrap();
    let summary = train::<B>(&cfg, &pre, &run_dir, &device, &StopFlag::new()).unwrap();
    assert_eq!(summary.last_rollout, Some(2));
    // the resumed rollout is the uninterrupted run's, bit for bit: the bf16 moments came back
    // exactly from the checkpoint's f32 record
    let straight = tempfile::tempdir().unwrap();
    let cfg = tiny_config_of(full, straight.path(), 3, &sizes);
    let pre = cfg.preflight().unwrap();
    let straight_run = straight.path().join("run");
    train::<B>(&cfg, &pre, &straight_run, &device, &StopFlag::new()).unwrap();
    let (resumed, uninterrupted) = (train_record(&run_dir, 2), train_record(&straight_run, 2));
    for key in ["train/loss", "train/grad_norm", "train/approx_kl"] {
        assert_eq!(resumed[key], uninterrupted[key], "{key}");
        assert!(resumed[key].is_some(), "{key}");
    }

    let out = root.path().join("exports").join("merged");
    let (report, t, b) = merged_to_q_against_base(&run_dir, &out);
    assert!(report.exported.verification.is_some(), "not verified");
    // the export differs from the base: the full fine-tune moved the weights
    assert_eq!(t.len(), b.len());
    assert!(t.iter().zip(&b).any(|(x, y)| x != y), "{TO_Q} did not move");

    let refused = export::<B>(
        &run_dir,
        None,
        None,
        &root.path().join("exports").join("peft"),
        &ExportRequest::new(ExportForm::Peft),
        false,
        &device,
    )
    .unwrap_err()
    .to_string();
    assert!(refused.contains("merged"), "{refused}");
}

/// A job that only reports which world and algorithm it was handed.
struct Describe;

impl Job<B> for Describe {
    type Output = String;
    fn run<W: World<B>, A: Algorithm<B, W>>(
        self,
        world: W,
        algorithm: A,
    ) -> Result<String, TrainerError> {
        Ok(format!("{} / {}", algorithm.name(), world.name()))
    }
}

#[test]
fn the_qwen_image_world_refuses_what_does_not_fit() {
    let root = tempfile::tempdir().unwrap();
    let device = Default::default();
    let cfg = tiny_config(root.path(), 1, &[]);
    let pre = cfg.preflight().unwrap();
    let described = dispatch::<B, _>(&cfg, &pre, &device, Describe).unwrap();
    assert!(
        described.starts_with("FlowGRPO / Qwen-Image world"),
        "{described}"
    );

    // an image side the VAE and the patch cannot tile
    let cfg = tiny_config(root.path(), 1, &["sampling.height=40"]);
    let pre = cfg.preflight().unwrap();
    let err = dispatch::<B, _>(&cfg, &pre, &device, Describe)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sampling.height = 40") && err.contains("16"),
        "{err}"
    );

    // bf16 frozen weights on a backend without bf16 (NdArray), named before anything loads
    let cfg = tiny_config(root.path(), 1, &[]);
    let err = trainer_fsdp::qwen_image_world::QwenImageWorld::<burn::backend::NdArray>::load_in(
        &fixtures().join("qwen_image").join("tiny_pipeline"),
        None,
        cfg.model.weight_dtype(),
        &cfg.sampling,
        &cfg.data,
        &cfg.reward.scorers,
        &Default::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("model.param_dtype") && err.contains("BF16") && err.contains("fp32"),
        "{err}"
    );

    // a schedule other than the directory's own
    let cfg = tiny_config(root.path(), 1, &["sampling.scheduler=\"sd3_5\""]);
    let pre = cfg.preflight().unwrap();
    let err = dispatch::<B, _>(&cfg, &pre, &device, Describe)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sampling.scheduler") && err.contains("scheduler_config.json"),
        "{err}"
    );

    // no prompt files: both keys named before anything loads
    let mut cfg = tiny_config(root.path(), 1, &[]);
    cfg.data.train = None;
    cfg.data.eval = None;
    let pre = cfg.preflight().unwrap();
    let err = dispatch::<B, _>(&cfg, &pre, &device, Describe)
        .unwrap_err()
        .to_string();
    assert!(err.contains("data.train and data.eval absent"), "{err}");
    // a record that is not text-to-image: preflight names the file and the line
    std::fs::write(
        root.path().join("bad.jsonl"),
        "{\"prompt\": \"a cat\", \"metadata\": {\"task\": \"i2v\", \"sample_id\": \"x\"}}\n",
    )
    .unwrap();
    let extra = format!("data.eval={}", root.path().join("bad.jsonl").display());
    let err = tiny_config(root.path(), 1, &[extra.as_str()])
        .preflight()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("data.eval") && err.contains("line 1") && err.contains("i2v"),
        "{err}"
    );

    // a directory that is not a diffusers pipeline
    let mut cfg = tiny_config(root.path(), 1, &[]);
    cfg.model.generator = GeneratorSource::QwenImage {
        model_path: root.path().join("Qwen-Image"),
        variant: None,
    };
    let pre = cfg.preflight().unwrap();
    let err = dispatch::<B, _>(&cfg, &pre, &device, Describe)
        .unwrap_err()
        .to_string();
    assert!(err.contains("model_index.json"), "{err}");
}

/// The Qwen-Image crate's fixture helpers: tensors and the NaN-proof comparison.
#[path = "../../qwen-image/tests/support/mod.rs"]
mod support;

use support::{max_abs_err, strings, values, worse};

/// `QwenImagePipeline.__call__` on the tiny directory (`fixtures/qwen_image/pipeline.json`:
/// two prompts of different lengths, 32x48 pixels, 3 Euler steps from given latents) through
/// the Qwen-Image world's encoder and decoder, its transformer, the Qwen-Image schedule and
/// `sde-math`'s Euler step: the sigmas, the latents after every step (1e-4) and the final
/// image (within 1/255 of diffusers' float image, after quantisation).
#[test]
fn a_three_step_pipeline_run_matches_diffusers() {
    pipeline_case("pipeline.json", false);
}

/// The same with true CFG (`fixtures/qwen_image/pipeline_cfg.json`: a negative prompt and
/// `true_cfg_scale = 4`): `velocity_model::TrueCfg` over the world's transformer, the negative
/// prompt encoded by the world, against diffusers' guided loop at the same tolerances; the
/// unguided run from the same latents ends far from it, so the guidance is what matches.
#[test]
fn a_guided_pipeline_run_matches_diffusers_true_cfg() {
    pipeline_case("pipeline_cfg.json", true);
}

/// Runs a pipeline fixture case: with `guided`, under its negative prompt and CFG scale.
fn pipeline_case(file: &str, guided: bool) {
    use burn::module::AutodiffModule;
    use burn::tensor::{Tensor, TensorData};
    use schedule::SchedulePolicy;
    use sde_math::{StepSigmas, euler_step};
    use trainer_fsdp::config::Trainable;
    use trainer_fsdp::qwen_image_world::QwenImageWorld;
    use velocity_model::{Guided, TrueCfg, VelocityModel};

    let text = std::fs::read_to_string(fixtures().join("qwen_image").join(file)).unwrap();
    let f: serde_json::Value = serde_json::from_str(&text).unwrap();
    let tol = f["tolerance"]["f32_max_abs"].as_f64().unwrap();
    let image_tol = f["tolerance"]["image_max_abs"].as_f64().unwrap();
    assert_eq!((tol, image_tol), (1e-4, 1.0 / 255.0));
    let case = &f["cases"][0];
    let steps = case["num_inference_steps"].as_u64().unwrap() as usize;
    let (h, w) = (
        case["height"].as_u64().unwrap() as u32,
        case["width"].as_u64().unwrap() as u32,
    );

    // the schedule: the built-in Qwen-Image policy and the directory's scheduler_config.json
    let want: Vec<f32> = case["sigmas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    let dir = fixtures().join("qwen_image").join("tiny_pipeline");
    let from_file =
        SchedulePolicy::load(dir.join("scheduler").join("scheduler_config.json")).unwrap();
    for policy in [SchedulePolicy::qwen_image(), from_file] {
        let schedule = policy.sample_sigmas(h, w, steps).unwrap();
        let err = max_abs_err(schedule.sigmas.as_slice(), &want);
        assert!(
            err <= 1e-6,
            "sigmas {:?} against diffusers' {want:?}",
            schedule.sigmas.as_slice()
        );
    }
    let sigmas = SchedulePolicy::qwen_image()
        .sample_sigmas(h, w, steps)
        .unwrap()
        .sigmas;
    let sigmas = sigmas.as_slice();

    let root = tempfile::tempdir().unwrap();
    let mut cfg = tiny_config(root.path(), 1, &[]);
    cfg.sampling.height = h;
    cfg.sampling.width = w;
    let device = Default::default();
    let world = QwenImageWorld::<Flex>::load(
        &dir,
        None,
        &cfg.sampling,
        &cfg.data,
        &cfg.reward.scorers,
        &device,
    )
    .unwrap();
    let prompts: Vec<&str> = strings(&case["prompts"]);
    let cond = World::<B>::encode(&world, &prompts, &device).unwrap();
    assert!(
        cond.encoder_hidden_states_mask.is_some(),
        "two prompts of different lengths: the text mask is active"
    );
    let policy = World::<B>::load_policy(&world, &Trainable::Full, 0, &device)
        .unwrap()
        .model
        .valid();
    let guidance = guided.then(|| {
        let negative = case["negative_prompt"].as_str().unwrap();
        let negatives = vec![negative; prompts.len()];
        let scale = case["true_cfg_scale"].as_f64().unwrap();
        let negative = World::<B>::encode(&world, &negatives, &device).unwrap();
        (
            scale,
            Guided {
                positive: cond.clone(),
                negative,
            },
        )
    });
    let (shape, latents) = values(&case["latents"]);
    assert_eq!(
        World::<B>::latent_shape(&world).to_vec(),
        shape[1..].to_vec()
    );
    let start = Tensor::<Flex, 3>::from_data(TensorData::new(latents, shape.clone()), &device);
    let sample = |guide: bool, check: bool| {
        let mut x = start.clone();
        for i in 0..steps {
            let sigma = Tensor::<Flex, 1>::from_data(
                TensorData::new(vec![sigmas[i]; shape[0]], [shape[0]]),
                &device,
            );
            let v = match (&guidance, guide) {
                (Some((scale, guided)), true) => {
                    TrueCfg::new(&policy, *scale).velocity(x.clone(), sigma, guided)
                }
                _ => policy.velocity(x.clone(), sigma, &cond),
            };
            x = euler_step(&StepSigmas::from_schedule(sigmas, i).unwrap().into(), v, x).unwrap();
            if check {
                let (_, want) = values(&case["step_latents"][i]);
                let err = max_abs_err(&x.clone().into_data().to_vec::<f32>().unwrap(), &want);
                eprintln!("latents after step {i}: max abs error {err:.3e}");
                assert!(err <= tol, "step {i}: {err:e}");
            }
        }
        x
    };
    let x = sample(guided, true);
    if guided {
        let (_, want) = values(&case["step_latents"][steps - 1]);
        let unguided = sample(false, false);
        let off = max_abs_err(&unguided.into_data().to_vec::<f32>().unwrap(), &want);
        eprintln!("the unguided run ends {off:.3e} from diffusers' guided latents");
        assert!(off > 100.0 * tol, "guidance changed nothing: {off:e}");
    }
    let images = World::<B>::decode(&world, x).unwrap();
    let (ishape, want) = values(&case["image"]);
    let [_, _, ih, iw] = [ishape[0], ishape[1], ishape[2], ishape[3]];
    let mut worst = 0.0f64;
    for (b, img) in images.iter().enumerate() {
        assert_eq!((img.height(), img.width()), (ih, iw));
        for c in 0..3 {
            for y in 0..ih {
                for xx in 0..iw {
                    let got = f64::from(img.pixel(xx, y)[c]) / 255.0;
                    let w = f64::from(want[((b * 3 + c) * ih + y) * iw + xx]);
                    worst = worse(worst, (got - w).abs());
                }
            }
        }
    }
    eprintln!("final image (8-bit) against diffusers' float image: max abs error {worst:.3e}");
    assert!(worst <= image_tol, "image: {worst:e} > 1/255");
}
