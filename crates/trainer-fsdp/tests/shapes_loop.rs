//! The shapes-world FlowGRPO loop end to end through the generic run, on a tiny random
//! generator: one full iteration, the on-policy ratio, a NaN reward, resume, dispatch, and
//! every `--algorithm` preset through the same run.

use std::path::Path;

use burn::backend::Flex;
use burn::module::AutodiffModule;
use reward::shapes::ShapesScorer;
use reward::{Batch, Components, Input, RewardError, Scorer};
use trainer_fsdp::dispatch::{Job, dispatch};
use trainer_fsdp::shapes_world::{SharedScorer, eval_prompts, train_prompts};
use trainer_fsdp::{
    Algorithm, CheckpointStore, StopFlag, TrainerError, TrainerRng, World, names, read_jsonl,
};

#[path = "shapes_common/mod.rs"]
mod shapes_common;

use shapes_common::*;

/// burn's CPU RNG is global: runs that initialise an adapter are serialised so each sees
/// the seed its config sets.
static RNG_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn start(root: &Path, rollouts: u64, extra: &[&str], scorer: SharedScorer) -> ShapesRun {
    let _guard = RNG_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    start_in(root, &root.join("run"), rollouts, extra, scorer)
}

#[test]
fn one_full_iteration_end_to_end() {
    let root = tempfile::tempdir().unwrap();
    tiny_generator(&root.path().join("generator"));
    let mut run = start(root.path(), 1, &[], Box::new(Brightness));
    let prompts = train_prompts(&mut TrainerRng::seeded(3), 2, &eval_prompts()).unwrap();

    // rollout: one sidecar per group, one PNG per candidate, read back validated
    let batch = run.rollout(0, &prompts).unwrap();
    assert_eq!(batch.trajectories.len(), 2);
    assert_eq!(batch.samples.len(), 8);
    assert_eq!(batch.trained.len(), 2);
    let layout = trajectory::ArtifactLayout::new(root.path().join("artifacts"), "t2i").unwrap();
    let rollout_dir = layout.rollout_dir(trajectory::Split::Train, 0);
    let files: Vec<String> = std::fs::read_dir(&rollout_dir)
        .unwrap_or_else(|e| panic!("{}: {e}", rollout_dir.display()))
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
    // distinct sample ids -> distinct initial noise and trajectories within a group
    let t = &batch.trajectories[0];
    assert_ne!(
        t.latent(0, batch.trained[0]).unwrap(),
        t.latent(1, batch.trained[0]).unwrap()
    );

    // score, advantages
    let groups = run.score(&batch).unwrap();
    assert_eq!(groups.len(), 2);
    assert!(
        groups
            .iter()
            .all(|g| g.samples.len() == 4 && g.samples[0].contains_key("shapes"))
    );
    // the shapes scorer itself scores the same images (the tiny random model draws nothing)
    let shapes_scores = ShapesScorer::default()
        .score(Batch::new(Some(&batch.samples), None, None).unwrap())
        .map(|_| ());
    assert!(
        shapes_scores.is_err(),
        "the shapes scorer needs the prompts"
    );

    // train: the anchor is replayed before any step, so the first update is on-policy
    let cfg = tiny_config(root.path(), 1, &[]);
    let adv =
        trainer_fsdp::advantages(&cfg.preflight().unwrap().advantages, &groups, None).unwrap();
    let before = run.model().clone().valid();
    let rewards = trainer_fsdp::combined_rewards(&groups, &cfg.reward.component_weights);
    let report = run.train(&batch, &adv, &rewards).unwrap();
    // the sampler ran the plain backend, the anchor the autodiff one: they agree to float
    // rounding (burn's autodiff backend decomposes attention where Flex fuses it)
    let parity = report.frozen[names::TRAIN_LOGP_PARITY_MAX_ABS];
    assert!(parity <= 1e-5, "anchor vs rollout log-probs: {parity}");
    assert!(!adv.degenerate);
    let ratio = |u: usize| {
        let d = &report.updates[u].micro_batches;
        assert!(!d.is_empty());
        // every ratio finite, so the folds below cannot drop a NaN
        assert!(
            d.iter()
                .all(|d| d.clip.ratio_min.is_finite() && d.clip.ratio_max.is_finite()),
            "update {u}: a non-finite ratio"
        );
        (
            d.iter()
                .map(|d| d.clip.ratio_min)
                .fold(f64::INFINITY, f64::min),
            d.iter()
                .map(|d| d.clip.ratio_max)
                .fold(f64::NEG_INFINITY, f64::max),
        )
    };
    assert!(
        report.updates[0]
            .micro_batches
            .iter()
            .all(|d| d.clip.ratio_min == 1.0 && d.clip.ratio_max == 1.0),
        "first update is on-policy"
    );
    let (lo, hi) = ratio(1);
    assert!(
        lo != 1.0 || hi != 1.0,
        "the second update replays moved weights"
    );
    // the algorithm's metrics of the update say the same
    let m = trainer_fsdp::algorithm::policy_metrics(&report.updates[..1]);
    assert_eq!(
        (m[names::TRAIN_RATIO_MIN], m[names::TRAIN_RATIO_MAX]),
        (1.0, 1.0)
    );
    // the adapter moved
    let after = run.model().clone().valid();
    assert!(
        param_bits(&before) != param_bits(&after),
        "an optimizer step changed nothing"
    );

    // evaluate and checkpoint
    let e = run.evaluate("test").unwrap();
    assert!((0.0..=1.0).contains(&e.reward));
    assert!(
        root.path()
            .join("run")
            .join("samples")
            .join("eval_test.png")
            .exists()
    );
    run.checkpoint(0).unwrap();
    let store = CheckpointStore::new(root.path().join("ckpt"), "t2i", None).unwrap();
    assert_eq!(store.latest_committed().unwrap().unwrap().iteration, 0);
}

/// A scorer that returns NaN for the first group's images.
struct NanForFirstGroup(usize);

impl Scorer for NanForFirstGroup {
    fn name(&self) -> String {
        "nan-for-first-group".into()
    }
    fn required_inputs(&self) -> &[Input] {
        &[Input::Image, Input::Prompt]
    }
    fn components(&self) -> Vec<String> {
        ShapesScorer::default().components()
    }
    fn score_chunk(&self, batch: Batch<'_>) -> Result<Vec<Components>, RewardError> {
        assert_eq!(
            self.required_inputs(),
            ShapesScorer::default().required_inputs()
        );
        let mut out = ShapesScorer::default().score_chunk(batch)?;
        for c in out.iter_mut().take(self.0) {
            c.insert("shapes", f64::NAN);
        }
        Ok(out)
    }
    fn chunk_size(&self) -> usize {
        usize::MAX
    }
}

#[test]
fn a_nan_reward_fails_its_group_and_the_run_continues() {
    let root = tempfile::tempdir().unwrap();
    tiny_generator(&root.path().join("generator"));
    let mut run = start(
        root.path(),
        2,
        &["eval.interval=0"],
        Box::new(NanForFirstGroup(4)),
    );
    let summary = run.run(&StopFlag::new()).unwrap();
    assert_eq!(
        summary.last_rollout,
        Some(1),
        "the run went on after the failed group"
    );
    let records = read_jsonl(&root.path().join("run").join("metrics.jsonl")).unwrap();
    assert_eq!(records.len(), 2);
    for r in &records {
        assert_eq!(r.metrics[names::REWARD_FAILED_GROUPS], Some(1.0));
        assert_eq!(r.metrics[names::REWARD_NUM_GROUPS], Some(2.0));
    }
}

/// The policy's transformer parameters (base and adapter), as bits.
fn adapter_bits(run: &ShapesRun) -> Vec<u32> {
    param_bits(&run.model().clone().valid())
}

#[test]
fn resume_continues_from_the_last_commit_with_identical_state() {
    // reference: 2 rollouts in one go
    let a = tempfile::tempdir().unwrap();
    tiny_generator(&a.path().join("generator"));
    let mut straight = start(a.path(), 2, &["eval.interval=0"], Box::new(Brightness));
    straight.run(&StopFlag::new()).unwrap();

    // the same, stopped after rollout 0 and resumed
    let b = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(b.path()).unwrap();
    copy_dir(&a.path().join("generator"), &b.path().join("generator"));
    let mut first = start(b.path(), 1, &["eval.interval=0"], Box::new(Brightness));
    first.run(&StopFlag::new()).unwrap();
    drop(first);
    let mut resumed = start(
        b.path(),
        2,
        &["eval.interval=0", "checkpoint.resume=true"],
        Box::new(Brightness),
    );
    assert_eq!(resumed.next_rollout(), 1);
    resumed.run(&StopFlag::new()).unwrap();

    assert!(
        read_jsonl(&a.path().join("run").join("metrics.jsonl"))
            .unwrap()
            .iter()
            .all(|r| r.metrics[names::REWARD_DEGENERATE] == Some(0.0)),
        "the test needs real optimizer steps"
    );
    assert!(
        adapter_bits(&straight) == adapter_bits(&resumed),
        "resumed run diverged"
    );
    let ma = read_jsonl(&a.path().join("run").join("metrics.jsonl")).unwrap();
    let mb = read_jsonl(&b.path().join("run").join("metrics.jsonl")).unwrap();
    // every fixed metric name is logged every rollout, aggregated over both updates
    for r in &ma {
        for name in names::ALL {
            assert!(
                r.metrics.get(*name).is_some_and(Option::is_some),
                "rollout {}: {name} missing or null",
                r.step
            );
        }
        assert_eq!(r.metrics[names::TRAIN_OPTIMIZER_STEPS], Some(2.0));
        assert_eq!(r.metrics[names::TRAIN_NUM_MICROBATCHES], Some(2.0));
    }
    assert_eq!(ma[1].metrics[names::TRAIN_POLICY_VERSION], Some(4.0));
    assert_eq!(ma.len(), mb.len());
    for (x, y) in ma.iter().zip(&mb) {
        assert_eq!(x.step, y.step);
        assert_eq!(
            x.metrics.get(names::TRAIN_LOSS),
            y.metrics.get(names::TRAIN_LOSS)
        );
        assert_eq!(
            x.metrics.get("reward/shapes_mean"),
            y.metrics.get("reward/shapes_mean")
        );
    }
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
fn the_configured_world_is_dispatched() {
    let root = tempfile::tempdir().unwrap();
    tiny_generator(&root.path().join("generator"));
    let cfg = tiny_config(root.path(), 1, &[]);
    let pre = cfg.preflight().unwrap();
    let described = dispatch::<B, _>(&cfg, &pre, &Default::default(), Describe).unwrap();
    assert!(
        described.starts_with("FlowGRPO / shapes world"),
        "{described}"
    );
}

/// FlowGRPO's KL to the reference in a LoRA world: the reference is the transformer with its
/// adapters off. The first update runs at the reference itself (LoRA's `B` starts at zero), so
/// the rollout's mean KL is that of the second update alone, and positive. Under full
/// fine-tuning there is no reference and the run refuses to start.
/// The KL reference is the pretrained model: for a LoRA policy the same model with its
/// adapters off; for a full fine-tune a frozen copy of the weights as loaded, taken before a
/// checkpoint is restored, so that a resumed run measures drift from the same model.
#[test]
fn the_kl_reference_is_the_pretrained_model() {
    let root = tempfile::tempdir().unwrap();
    tiny_generator(&root.path().join("generator"));
    let mut run = start(
        root.path(),
        1,
        &["algorithm.kl_coef=0.04", "rollout.num_updates_per_batch=2"],
        Box::new(Brightness),
    );
    run.run(&StopFlag::new()).unwrap();
    let records = read_jsonl(&root.path().join("run").join("metrics.jsonl")).unwrap();
    let kl = records
        .iter()
        .find_map(|r| r.metrics.get(names::TRAIN_KL_REF).copied().flatten())
        .expect("train/kl_ref logged");
    assert!(kl.is_finite() && kl > 0.0, "train/kl_ref = {kl}");

    // a full fine-tune: 2 rollouts straight, and the same stopped after rollout 0 and resumed
    const FULL: [&str; 6] = [
        "model.trainable_mode=\"full\"",
        "lora.rank=0",
        "optimizer.lr=1e-3",
        "algorithm.kl_coef=0.04",
        "rollout.num_updates_per_batch=2",
        "eval.interval=0",
    ];
    let kl_of = |dir: &Path| -> Vec<f64> {
        read_jsonl(&dir.join("run").join("metrics.jsonl"))
            .unwrap()
            .iter()
            .map(|r| {
                r.metrics
                    .get(names::TRAIN_KL_REF)
                    .copied()
                    .flatten()
                    .expect("train/kl_ref logged every rollout")
            })
            .collect()
    };
    let a = tempfile::tempdir().unwrap();
    tiny_generator(&a.path().join("generator"));
    let mut straight = start(a.path(), 2, &FULL, Box::new(Brightness));
    straight.run(&StopFlag::new()).unwrap();
    let b = tempfile::tempdir().unwrap();
    copy_dir(&a.path().join("generator"), &b.path().join("generator"));
    let mut first = start(b.path(), 1, &FULL, Box::new(Brightness));
    first.run(&StopFlag::new()).unwrap();
    drop(first);
    let resume = [&FULL[..], &["checkpoint.resume=true"]].concat();
    let mut resumed = start(b.path(), 2, &resume, Box::new(Brightness));
    assert_eq!(resumed.next_rollout(), 1);
    resumed.run(&StopFlag::new()).unwrap();

    let (kl_a, kl_b) = (kl_of(a.path()), kl_of(b.path()));
    assert_eq!(kl_a.len(), 2);
    // every update after the first has moved the policy off its copy; the drift grows
    assert!(
        kl_a.iter().all(|k| k.is_finite() && *k > 0.0) && kl_a[1] > kl_a[0],
        "train/kl_ref = {kl_a:?}"
    );
    // the resumed run's reference is the pretrained copy, not the restored weights (whose
    // first update would measure no drift at all)
    assert_eq!(
        kl_a.iter().map(|k| k.to_bits()).collect::<Vec<_>>(),
        kl_b.iter().map(|k| k.to_bits()).collect::<Vec<_>>(),
        "straight {kl_a:?}, resumed {kl_b:?}"
    );
    assert!(
        adapter_bits(&straight) == adapter_bits(&resumed),
        "resumed run diverged"
    );
}

/// A held-out evaluation of no seeds per prompt is refused with its own error, not run with
/// one seed instead; one seed per prompt measures every held-out prompt once.
/// The tiny generator in `root`, its world, a Flow-SDE sampler over `sigmas` and the shapes
/// component's weight: what the evaluation tests call `evaluate_policy` with.
fn evaluation_fixture(
    root: &Path,
    sigmas: Vec<f32>,
) -> (
    trainer_fsdp::shapes_world::ShapesGenerator<Flex>,
    trainer_fsdp::shapes_world::ShapesWorld<Flex>,
    trainer_fsdp::rollout::SamplerSpec,
    std::collections::BTreeMap<String, f64>,
) {
    let model = load_tiny_generator(root);
    let world =
        trainer_fsdp::shapes_world::ShapesWorld::<Flex>::new(root, model.text.clone()).unwrap();
    let spec = trainer_fsdp::rollout::SamplerSpec {
        sigmas,
        kernel: Some(sde_math::Kernel::flow_sde(0.7).unwrap()),
        solver: sde_math::solvers::OdeSolver::Euler,
        storage: sde_math::StorageDtype::F32,
    };
    let weights = std::collections::BTreeMap::from([("shapes".to_string(), 1.0)]);
    (model, world, spec, weights)
}

#[test]
fn an_evaluation_of_no_seeds_is_refused() {
    use trainer_fsdp::run::evaluate_policy;
    let root = tempfile::tempdir().unwrap();
    let (model, world, spec, weights) = evaluation_fixture(root.path(), vec![1.0, 0.5, 0.0]);
    let dev = Default::default();
    let eval = |k| {
        evaluate_policy::<burn::backend::Autodiff<Flex>, _>(
            &world,
            &model.dit,
            &spec,
            &schedule::SdeSteps::new([]),
            k,
            0,
            &weights,
            None,
            1,
            &dev,
        )
    };
    let err = eval(0).unwrap_err();
    assert!(matches!(err, TrainerError::NoEvalSamples), "{err}");
    assert!(err.to_string().contains("eval.samples_per_prompt"), "{err}");
    let (samples, stats) = eval(1).unwrap();
    assert_eq!(samples.len(), eval_prompts().len());
    assert!(
        stats.mean.is_finite() && stats.by_category.len() == 6,
        "{stats:?}"
    );
}

/// An evaluation with the SDE's transitions at fixed steps (`eval.sampling = "sde"`) is a
/// pure function of its seed, on any number of threads; its pictures differ from the
/// deterministic ones, and from its own at another seed; a sampler without a kernel refuses
/// it by name.
#[test]
fn a_noised_evaluation_is_reproducible_and_needs_a_kernel() {
    use schedule::SdeSteps;
    use trainer_fsdp::rollout::SamplerSpec;
    use trainer_fsdp::run::evaluate_policy;
    let root = tempfile::tempdir().unwrap();
    let (model, world, mut spec, weights) =
        evaluation_fixture(root.path(), vec![1.0, 0.75, 0.5, 0.25, 0.0]);
    let dev = Default::default();
    let pictures = |spec: &SamplerSpec, noised: &[usize], seed: u64, threads: usize| {
        let (samples, _) = evaluate_policy::<burn::backend::Autodiff<Flex>, _>(
            &world,
            &model.dit,
            spec,
            &SdeSteps::new(noised.iter().copied()),
            2,
            seed,
            &weights,
            None,
            threads,
            &dev,
        )?;
        Ok::<_, TrainerError>(
            samples
                .iter()
                .flat_map(|s| s.as_bytes().to_vec())
                .collect::<Vec<u8>>(),
        )
    };
    let noised = pictures(&spec, &[1, 2], 3, 1).unwrap();
    assert_eq!(noised, pictures(&spec, &[1, 2], 3, 2).unwrap());
    assert_ne!(noised, pictures(&spec, &[], 3, 1).unwrap());
    assert_ne!(noised, pictures(&spec, &[1, 2], 4, 1).unwrap());
    spec.kernel = None;
    let err = pictures(&spec, &[1, 2], 3, 1).unwrap_err();
    assert!(
        matches!(err, TrainerError::EvalNoiseWithoutKernel { ref steps } if steps == &[1, 2]),
        "{err}"
    );
    assert!(err.to_string().contains("eval.sampling"), "{err}");
}

/// Sampling a batch in chunks on several threads gives the batch's result bit for bit.
#[test]
fn chunked_sampling_equals_one_batch() {
    use trainer_fsdp::rollout::{SamplerSpec, sample_in_chunks};
    let root = tempfile::tempdir().unwrap();
    let model = load_tiny_generator(root.path());
    let dev = Default::default();
    let prompts: Vec<String> = eval_prompts().into_iter().take(5).collect();
    let cond = model.conditioning(&prompts, &dev).unwrap();
    let model = model.dit;
    let mut g = 1u64;
    let mut normal = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                g = g
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((g >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    };
    let shape = [5, 64, 48];
    let x = burn::tensor::Tensor::<Flex, 3>::from_data(
        burn::tensor::TensorData::new(normal(5 * 64 * 48), shape),
        &dev,
    );
    let step_noise = normal(5 * 64 * 48);
    let spec = SamplerSpec {
        sigmas: vec![1.0, 0.75, 0.5, 0.25, 0.0],
        kernel: Some(sde_math::Kernel::flow_sde(0.7).unwrap()),
        solver: sde_math::solvers::OdeSolver::Euler,
        storage: sde_math::StorageDtype::Bf16,
    };
    let trained = schedule::SdeSteps::new([1, 2]);
    let run = |threads| {
        sample_in_chunks(
            &model,
            &cond,
            x.clone(),
            &spec,
            &trained,
            threads,
            |_, rows| {
                let per = 64 * 48;
                let v = step_noise[rows.start * per..rows.end * per].to_vec();
                Ok(burn::tensor::Tensor::from_data(
                    burn::tensor::TensorData::new(v, [rows.len(), 64, 48]),
                    &dev,
                ))
            },
        )
        .unwrap()
    };
    let (one, two, three) = (run(1), run(2), run(3));
    for other in [&two, &three] {
        assert_eq!(one.final_latents.to_data(), other.final_latents.to_data());
        for (a, b) in one.log_probs.iter().zip(&other.log_probs) {
            assert_eq!(a.to_data(), b.to_data());
        }
    }
}

#[test]
fn training_prompts_are_distinct_held_out_free_and_bounded() {
    let held_out = eval_prompts();
    // more prompts than the single-object category has outside the held-out set (three
    // shapes): that category is passed over instead of looping forever
    for n in [1, 6, 8, 24, 64] {
        let prompts = train_prompts(&mut TrainerRng::seeded(n as u64), n, &held_out).unwrap();
        assert_eq!(prompts.len(), n);
        let distinct: std::collections::BTreeSet<&String> = prompts.iter().collect();
        assert_eq!(distinct.len(), n, "{prompts:?}");
        assert!(prompts.iter().all(|p| !held_out.contains(p)), "{prompts:?}");
    }
    let err = train_prompts(&mut TrainerRng::seeded(0), 100_000, &held_out).unwrap_err();
    assert!(
        matches!(
            err,
            trainer_fsdp::TrainerError::PromptPoolExhausted {
                requested: 100_000,
                ..
            }
        ),
        "{err}"
    );
}

/// Every method runs end to end on the shapes world by its preset, as `--algorithm NAME` of
/// the main example composes it (the recipe, then the preset) and trains it: one rollout,
/// its updates, an evaluation before and after, a committed checkpoint, a finite loss. (The
/// tiny random generator draws nothing the composition judge rewards, so a brightness score
/// stands in for it, as in the other tests here.)
#[test]
fn every_preset_trains_the_shapes_world_end_to_end() {
    use trainer_fsdp::config::{ALGORITHM_NAMES, algorithm_overrides};
    use trainer_fsdp::dispatch::{train_in, with_algorithm};
    use trainer_fsdp::shapes_world::ShapesWorld;
    use trainer_fsdp::{Override, RecipeName, TrainConfig};
    let root = tempfile::tempdir().unwrap();
    let generator = root.path().join("generator");
    tiny_generator(&generator);
    let mut names_run = Vec::new();
    for name in ALGORITHM_NAMES {
        let dir = root.path().join(name);
        let mut o = Override::parse_all(&[
            format!("model.generator.shapes_world.dir={}", generator.display()),
            "run.num_rollouts=1".into(),
            "rollout.prompts_per_rollout=2".into(),
            "rollout.group_size=4".into(),
            "rollout.micro_batch_size=4".into(),
            "lora.rank=2".into(),
            "lora.alpha=4.0".into(),
            "eval.samples_per_prompt=1".into(),
            format!("checkpoint.dir={}", dir.join("ckpt").display()),
            format!("artifacts.root={}", dir.join("artifacts").display()),
            "monitor.progress=\"never\"".into(),
            // the world's scorer is replaced below, which gives no second judgement
            "eval.judges=[]".into(),
        ])
        .unwrap();
        o.extend(algorithm_overrides(name).unwrap());
        if *name == "fdfo" {
            // at the preset's churn (gamma 0.0025, and at 0.1 too) the tiny random generator's
            // two pictures of a pair differ in brightness by 2e-4 to 3e-4, under the
            // advantages' degeneracy floor (std 1e-3): nothing would train; a larger churn
            // takes the same path
            o.push(Override::parse("sampling.eta=1.0").unwrap());
        }
        let cfg = TrainConfig::from_recipe(RecipeName::ShapesWorldLora, &o).unwrap();
        let pre = cfg
            .preflight()
            .unwrap_or_else(|e| panic!("{name}: preflight: {e}"));
        let dev = Default::default();
        let world = || {
            ShapesWorld::<Flex>::load(&generator, &cfg.reward.scorers, &dev)
                .unwrap()
                .with_scorer(Box::new(Brightness))
        };
        let run_dir = dir.join("run");
        let summary = {
            let _guard = RNG_LOCK.lock().unwrap_or_else(|e| e.into_inner());
            train_in::<B, _>(world(), &cfg, &pre, &run_dir, &dev, &StopFlag::new())
                .unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        let described = with_algorithm(&pre, world(), Describe).unwrap();
        names_run.push(described.split(" / ").next().unwrap().to_string());
        assert_eq!(summary.last_rollout, Some(0), "{name}");
        for e in [summary.initial_eval, summary.final_eval] {
            let e = e.unwrap_or_else(|| panic!("{name}: an evaluation is missing"));
            assert!(
                e.reward.is_finite() && e.stderr.is_finite(),
                "{name}: {e:?}"
            );
        }
        let records = read_jsonl(&run_dir.join("metrics.jsonl")).unwrap();
        let loss = records
            .iter()
            .find_map(|r| r.metrics.get(names::TRAIN_LOSS).copied().flatten())
            .unwrap_or_else(|| {
                panic!(
                    "{name}: no {}: {:?}",
                    names::TRAIN_LOSS,
                    records.iter().map(|r| &r.metrics).collect::<Vec<_>>()
                )
            });
        assert!(loss.is_finite(), "{name}: loss {loss}");
        let store = CheckpointStore::new(dir.join("ckpt"), "t2i", None).unwrap();
        assert_eq!(
            store.latest_committed().unwrap().map(|c| c.iteration),
            Some(0),
            "{name}: no committed checkpoint"
        );
    }
    // each preset reached its own objective
    assert_eq!(
        names_run,
        [
            "FlowGRPO",
            "AWM",
            "DiffusionNFT",
            "Flow-DPO",
            "DPOK",
            "GRPO-Guard",
            "FlowGRPO",
            "FlowGRPO on per-sample timestep subsets",
            "FlowGRPO",
            "FDFO",
            "RAFT (best-of-N fine-tuning)",
        ]
    );
}

/// The tiny generator is keyed: written twice, with draws from burn's process-wide random
/// stream before and between, it holds the same weights bit for bit (so the tests' numbers
/// do not depend on which other test drew first).
#[test]
fn the_tiny_generator_is_the_same_in_every_process() {
    use burn::tensor::{Distribution, Tensor};
    let root = tempfile::tempdir().unwrap();
    let dev = Default::default();
    let _ = Tensor::<Flex, 1>::random([17], Distribution::Default, &dev);
    let a = param_bits(&load_tiny_generator(&root.path().join("a")));
    let _ = Tensor::<Flex, 1>::random([5], Distribution::Default, &dev);
    let b = param_bits(&load_tiny_generator(&root.path().join("b")));
    assert!(!a.is_empty());
    assert_eq!(a, b);
}

/// `eval.sampling = "sde"` reaches the run's evaluation: the same tiny generator evaluated by
/// two runs differing in that key alone draws other pictures, and the noised evaluation
/// repeats itself exactly.
#[test]
fn the_run_evaluates_with_the_sde_at_the_plans_steps_when_asked() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    tiny_generator(&a.path().join("generator"));
    tiny_generator(&b.path().join("generator"));
    let ode = start(a.path(), 1, &[], Box::new(Brightness));
    let sde = start(
        b.path(),
        1,
        &["eval.sampling=\"sde\""],
        Box::new(Brightness),
    );
    let bytes = |r: &trainer_fsdp::EvalReport| -> Vec<u8> {
        r.images
            .iter()
            .flat_map(|i| i.as_bytes().to_vec())
            .collect()
    };
    let (plain, noised) = (ode.evaluate("a").unwrap(), sde.evaluate("a").unwrap());
    assert_eq!(plain.samples, noised.samples);
    assert_ne!(bytes(&plain), bytes(&noised));
    assert_eq!(bytes(&noised), bytes(&sde.evaluate("b").unwrap()));
}

/// `eval.judges` scores the held-out pictures beside the reward and reports each component
/// with its standard error; a world whose scorers leave the judge out is refused by name.
/// `eval.sde_gap`: the evaluation also scores the same prompts and initial noise sampled
/// with the rollouts' SDE transitions, exactly what `evaluate_policy` gives at the plan's
/// evaluation steps, and logs the gap.
#[test]
fn the_evaluation_reports_the_sde_pictures_beside() {
    let root = tempfile::tempdir().unwrap();
    tiny_generator(&root.path().join("generator"));
    let cfg = tiny_config(root.path(), 1, &["eval.sde_gap=true"]);
    let run = start(root.path(), 1, &["eval.sde_gap=true"], Box::new(Brightness));
    let e = run.evaluate("gap").unwrap();
    let (mean, se) = e.sde.expect("eval.sde_gap reports the SDE pictures");
    let pre = cfg.preflight().unwrap();
    let steps = pre.eval_gap_steps.clone().unwrap();
    assert!(!steps.is_empty());
    let (_, want) = trainer_fsdp::run::evaluate_policy::<burn::backend::Autodiff<Flex>, _>(
        run.world(),
        &run.model().clone().valid(),
        run.eval_sampler(),
        &steps,
        cfg.eval.samples_per_prompt,
        cfg.run.seed,
        &cfg.reward.component_weights,
        None,
        1,
        &Default::default(),
    )
    .unwrap();
    assert_eq!((mean, se), (want.mean, want.stderr));
    // the transitions change the pictures: another mean than the deterministic one
    assert_ne!(
        mean, e.reward,
        "the SDE pictures are the deterministic ones"
    );
    let m = e.metrics();
    assert_eq!(m["eval/sde_reward"], mean);
    assert_eq!(m["eval/sde_reward_se"], se);
    assert_eq!(m["eval/sde_gap"], e.reward - mean);
    println!(
        "test the_evaluation_reports_the_sde_pictures_beside ... ok (deterministic {:.4}, SDE {mean:.4})",
        e.reward
    );
}

/// A later evaluation draws `samples/before_after.png`: the initial evaluation's pictures (cut
/// back out of its grid) above the later ones, prompt by prompt; without training in between
/// the two rows are the same pictures.
#[test]
fn a_later_evaluation_draws_the_pictures_before_above_after() {
    let root = tempfile::tempdir().unwrap();
    tiny_generator(&root.path().join("generator"));
    let run = start(root.path(), 1, &[], Box::new(Brightness));
    let samples = root.path().join("run").join("samples");
    let before_after = samples.join(trainer_fsdp::run_dir::BEFORE_AFTER_FILE);
    run.evaluate("initial").unwrap();
    assert!(
        !before_after.exists(),
        "the initial evaluation has no before"
    );
    run.evaluate("step_0001").unwrap();
    let open = |p: &Path| image::open(p).unwrap().to_rgb8();
    let (pair, initial, later) = (
        open(&before_after),
        open(&samples.join("eval_initial.png")),
        open(&samples.join("eval_step_0001.png")),
    );
    // the tiles are enlarged to 128 px; the first pair starts under the title, right of the
    // label margin
    let tile = (128, 128);
    let first = |i| trainer_fsdp::grid_tile(&initial, i, tile, true, 8).unwrap();
    assert_eq!(
        first(0),
        trainer_fsdp::grid_tile(&later, 0, tile, true, 8).unwrap()
    );
    let at = |x, y| image::imageops::crop_imm(&pair, x, y, 128, 128).to_image();
    assert_eq!(at(14, 16), first(0), "prompt 0 before");
    assert_eq!(at(14, 16 + 130), first(0), "prompt 0 after, under it");
    assert_eq!(at(14 + 130, 16), first(1), "prompt 1 before, beside");
    println!(
        "test a_later_evaluation_draws_the_pictures_before_above_after ... ok ({} x {})",
        pair.width(),
        pair.height()
    );
}

#[test]
fn the_evaluation_reports_the_second_judge() {
    let root = tempfile::tempdir().unwrap();
    tiny_generator(&root.path().join("generator"));
    let cfg = tiny_config(root.path(), 1, &["eval.judges=[\"shapes_rerender\"]"]);
    assert_eq!(
        cfg.all_scorers(),
        vec![
            trainer_fsdp::ScorerSpec::Shapes,
            trainer_fsdp::ScorerSpec::ShapesRerender
        ]
    );
    let start_with = |scorers: &[trainer_fsdp::ScorerSpec], dir: &str| {
        let _guard = RNG_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let pre = cfg.preflight().unwrap();
        let dev = Default::default();
        let world = trainer_fsdp::shapes_world::ShapesWorld::<Flex>::load(
            &root.path().join("generator"),
            scorers,
            &dev,
        )
        .unwrap();
        let algorithm =
            <trainer_fsdp::FlowGrpo as trainer_fsdp::dispatch::FromPlan>::from_plan(&pre.algorithm)
                .unwrap();
        let workers = trainer_fsdp::LocalWorkers::new(cfg.run.threads());
        trainer_fsdp::Run::<burn::backend::Autodiff<Flex>, _, _, _>::new(
            cfg.clone(),
            pre,
            &root.path().join(dir),
            dev,
            world,
            algorithm,
            workers,
        )
        .unwrap()
    };
    let run = start_with(&cfg.all_scorers(), "judged");
    let e = run.evaluate("judged").unwrap();
    let (mean, se) = e.judges["shapes_rerender"];
    assert!(
        (0.0..=1.0).contains(&mean) && se.is_finite(),
        "{mean} ± {se}"
    );
    assert_eq!(e.judges.len(), 1);
    let m = e.metrics();
    assert_eq!(m["eval/judge/shapes_rerender"], mean);
    assert_eq!(m["eval/judge/shapes_rerender_se"], se);
    drop(run);

    let run = start_with(&cfg.reward.scorers, "unjudged");
    let err = run.evaluate("unjudged").unwrap_err();
    assert!(
        matches!(&err, TrainerError::EvalJudgeMissing { component, .. } if component == "shapes_rerender"),
        "{err}"
    );
}
