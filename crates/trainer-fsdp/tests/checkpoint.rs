//! The checkpoint store: resumed training is bit-identical to uninterrupted training; a crash
//! at any point of a write never leaves a checkpoint that resume trusts; rotation; damaged
//! files, newer checkpoints, task and mode mismatches are refused; a LoRA checkpoint holds
//! only the adapter and its contract is checked on resume.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use burn::module::{AutodiffModule, Module};
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::{Distribution, Tensor};
use common::*;
use dit_models::{ImageShape, LoraConfig, QwenImageConfig, QwenImageInput};
use trainer_fsdp::{
    CheckpointProblem, CheckpointStore, Resume, TrainerError, TrainerRng, TrainerState, WritePhase,
    checkpoint,
};

fn state_of(opt: &Opt, rollout_id: u64) -> TrainerState {
    let mut s = TrainerState::new("t2i", rollout_id);
    opt.record_into(&mut s);
    s
}

#[test]
fn resumed_training_is_bit_identical_to_uninterrupted_training() {
    let dev = Default::default();
    const ROLLOUTS: u64 = 6;
    const CUT: u64 = 3;

    // uninterrupted
    let mut model = Policy::<AD>::init(11, &dev);
    let mut opt = optimizer();
    let mut rng = TrainerRng::seeded(99);
    for _ in 0..ROLLOUTS {
        (model, _) = run_rollout(model, &mut opt, &mut rng);
    }
    let reference = param_bytes(&model);
    let reference_state = state_of(&opt, ROLLOUTS - 1);
    assert_eq!(reference_state.lr_scheduler_steps, 2 * ROLLOUTS);

    // interrupted after CUT rollouts, resumed into a model with other weights and other ids
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(dir.path(), "t2i", Some(2)).unwrap();
    let mut model = Policy::<AD>::init(11, &dev);
    let mut opt = optimizer();
    let mut rng = TrainerRng::seeded(99);
    for id in 0..CUT {
        (model, _) = run_rollout(model, &mut opt, &mut rng);
        store
            .save(&model, opt.optimizer(), &state_of(&opt, id), &rng, None)
            .unwrap();
    }
    drop((model, opt, rng));

    let fresh = with_fresh_ids(Policy::<AD>::init(12345, &dev));
    assert_ne!(param_bytes(&fresh), reference);
    let mut opt = optimizer();
    let Resume::Resumed(r) = store
        .resume(fresh, opt.optimizer().clone(), None, &dev)
        .unwrap()
    else {
        panic!("a committed checkpoint exists");
    };
    let r = *r;
    assert_eq!(r.checkpoint.iteration, CUT - 1);
    assert_eq!(r.state.next_rollout_id(), CUT);
    assert_eq!(r.state.lr_scheduler_steps, 2 * CUT);
    opt.set_optimizer(r.optimizer);
    opt.restore(&r.state);
    let (mut model, mut rng) = (r.model, r.rng);
    assert_eq!(opt.lr_scheduler().current_lr(), {
        let s = optimizer();
        s.lr_scheduler().schedule().lr_at_step(2 * CUT)
    });
    for _ in CUT..ROLLOUTS {
        (model, _) = run_rollout(model, &mut opt, &mut rng);
    }
    assert_eq!(param_bytes(&model), reference, "bit-identical parameters");
    assert_eq!(state_of(&opt, ROLLOUTS - 1), reference_state);
    // rotation kept the newest two
    let kept: Vec<u64> = store
        .committed()
        .unwrap()
        .iter()
        .map(|c| c.iteration)
        .collect();
    assert_eq!(kept, vec![1, 2]);
}

#[test]
fn a_crash_at_any_point_of_a_write_is_never_trusted() {
    let dev = Default::default();
    let dir = tempfile::tempdir().unwrap();
    let model = Policy::<AD>::init(1, &dev);
    let opt = optimizer();
    let rng = TrainerRng::seeded(1);
    let base = CheckpointStore::new(dir.path(), "t2i", None).unwrap();
    base.save(&model, opt.optimizer(), &state_of(&opt, 0), &rng, None)
        .unwrap();

    let phases = [
        WritePhase::Started,
        WritePhase::Weights,
        WritePhase::Optimizer,
        WritePhase::Rng,
        WritePhase::TrainerState,
    ];
    for (i, crash_at) in phases.into_iter().enumerate() {
        let store = base.clone().with_write_hook(Arc::new(move |_, p| {
            if p == crash_at {
                panic!("simulated crash after {p:?}");
            }
        }));
        let iteration = 1 + i as u64;
        let crashed = catch_unwind(AssertUnwindSafe(|| {
            store.save(
                &model,
                opt.optimizer(),
                &state_of(&opt, iteration),
                &rng,
                None,
            )
        }));
        assert!(crashed.is_err(), "{crash_at:?}");
        assert!(store.iteration_dir(iteration).is_dir());
        let latest = store.latest_committed().unwrap().unwrap();
        assert_eq!(
            latest.iteration, 0,
            "crash after {crash_at:?} must not be trusted"
        );
        assert_eq!(store.latest_marker().unwrap(), Some(0));
        let err = store
            .read_state(&trainer_fsdp::CommittedCheckpoint {
                iteration,
                dir: store.iteration_dir(iteration),
            })
            .unwrap_err();
        assert!(
            matches!(
                err,
                TrainerError::Checkpoint {
                    problem: CheckpointProblem::NotCommitted,
                    ..
                }
            ),
            "{err}"
        );
    }
    // a crash after COMMITTED (before the markers) leaves a trusted checkpoint; the marker lags
    let store = base.clone().with_write_hook(Arc::new(|_, p| {
        if p == WritePhase::Committed {
            panic!("simulated crash after COMMITTED");
        }
    }));
    let crashed = catch_unwind(AssertUnwindSafe(|| {
        store.save(&model, opt.optimizer(), &state_of(&opt, 9), &rng, None)
    }));
    assert!(crashed.is_err());
    assert_eq!(base.latest_committed().unwrap().unwrap().iteration, 9);
    assert_eq!(base.latest_marker().unwrap(), Some(0));
    // the next successful save sweeps the partial directories away
    let saved = base
        .save(&model, opt.optimizer(), &state_of(&opt, 10), &rng, None)
        .unwrap();
    assert_eq!(saved.removed_partial, vec![1, 2, 3, 4, 5]);
    let all: Vec<u64> = base
        .committed()
        .unwrap()
        .iter()
        .map(|c| c.iteration)
        .collect();
    assert_eq!(all, vec![0, 9, 10]);
    assert_eq!(base.latest_marker().unwrap(), Some(10));
    let root_marker = std::fs::read_to_string(dir.path().join(checkpoint::LATEST_FILE)).unwrap();
    assert_eq!(root_marker, "10\n");
}

#[test]
fn rotation_damage_and_misuse() {
    let dev = Default::default();
    let dir = tempfile::tempdir().unwrap();
    let model = Policy::<AD>::init(2, &dev);
    let opt = optimizer();
    let rng = TrainerRng::seeded(2);
    let store = CheckpointStore::new(dir.path(), "t2i", Some(3)).unwrap();
    // readable files beside the store's own may not take their names
    for name in [
        checkpoint::WEIGHTS_FILE,
        checkpoint::COMMITTED_FILE,
        "a/b",
        "",
    ] {
        let err = store
            .save_with(
                &model,
                opt.optimizer(),
                &state_of(&opt, 0),
                &rng,
                None,
                &[(name, b"x".to_vec())],
            )
            .unwrap_err();
        assert!(
            matches!(
                &err,
                TrainerError::Checkpoint {
                    problem: CheckpointProblem::ReservedName { .. },
                    ..
                }
            ),
            "{err}"
        );
    }
    assert!(
        store.committed().unwrap().is_empty(),
        "a refused save writes nothing"
    );
    let mut rotated = Vec::new();
    for id in 0..6 {
        let s = store
            .save(&model, opt.optimizer(), &state_of(&opt, id), &rng, None)
            .unwrap();
        rotated.extend(s.rotated);
        assert_eq!(
            s.files.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
            vec![
                checkpoint::WEIGHTS_FILE,
                checkpoint::OPTIMIZER_FILE,
                checkpoint::RNG_FILE,
                checkpoint::TRAINER_STATE_FILE
            ]
        );
    }
    assert_eq!(rotated, vec![0, 1, 2]);
    assert!(!store.iteration_dir(0).exists());
    let kept: Vec<u64> = store
        .committed()
        .unwrap()
        .iter()
        .map(|c| c.iteration)
        .collect();
    assert_eq!(kept, vec![3, 4, 5]);

    // an older iteration cannot be written over newer committed ones
    let err = store
        .save(&model, opt.optimizer(), &state_of(&opt, 4), &rng, None)
        .unwrap_err();
    assert!(
        err.to_string().contains("committed iteration 5 exists"),
        "{err}"
    );
    // a state for another task is refused
    let mut other = state_of(&opt, 6);
    other.task = "t2v".into();
    assert!(
        store
            .save(&model, opt.optimizer(), &other, &rng, None)
            .is_err()
    );

    let load = |ckpt: &trainer_fsdp::CommittedCheckpoint| {
        store
            .load(
                ckpt,
                Policy::<AD>::init(3, &dev),
                optimizer().optimizer().clone(),
                None,
                &dev,
            )
            .map(|_| ())
    };
    let c = store.committed().unwrap();
    load(&c[2]).unwrap();
    // one flipped byte in the optimizer state
    let p = c[2].dir.join(checkpoint::OPTIMIZER_FILE);
    let mut bytes = std::fs::read(&p).unwrap();
    let k = bytes.len() / 2;
    bytes[k] ^= 1;
    std::fs::write(&p, &bytes).unwrap();
    let err = load(&c[2]).unwrap_err();
    assert!(
        err.to_string().contains("optimizer.mpk has content hash"),
        "{err}"
    );
    // a truncated weights file
    let p = c[1].dir.join(checkpoint::WEIGHTS_FILE);
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 1]).unwrap();
    let err = load(&c[1]).unwrap_err();
    assert!(err.to_string().contains("model.mpk has"), "{err}");
    // a missing RNG file
    std::fs::remove_file(c[0].dir.join(checkpoint::RNG_FILE)).unwrap();
    let err = load(&c[0]).unwrap_err();
    assert!(
        err.to_string()
            .contains("rng_rank0.json is listed in COMMITTED but missing"),
        "{err}"
    );
    // a LoRA run cannot resume a full fine-tune checkpoint
    let contract = dit_models::AdapterContract::new(&LoraConfig::new(4, 8.0), "abc");
    let fresh = CheckpointStore::new(dir.path().join("b"), "t2i", None).unwrap();
    fresh
        .save(&model, opt.optimizer(), &state_of(&opt, 0), &rng, None)
        .unwrap();
    let err = fresh
        .resume(
            Policy::<AD>::init(3, &dev),
            optimizer().optimizer().clone(),
            Some(&contract),
            &dev,
        )
        .err()
        .unwrap();
    assert!(err.to_string().contains("has no adapter contract"), "{err}");
    assert!(CheckpointStore::new(dir.path(), "../x", None).is_err());
    assert!(CheckpointStore::new(dir.path(), "t2i", Some(0)).is_err());
}

/// A tiny Qwen-Image transformer with a LoRA adapter: the checkpoint holds the adapter only,
/// restores it exactly onto a freshly attached adapter, and refuses a different contract.
#[test]
fn lora_checkpoints_hold_the_adapter_and_check_the_contract() {
    let dev = Default::default();
    // burn initialises parameters lazily and a clone of an uninitialised parameter draws its
    // own values: hash (and so initialise) the base once, then clone it
    let mut base = QwenImageConfig::tiny().init::<AD>(&dev);
    base.compute_base_model_hash().unwrap();
    let lora = LoraConfig::new(2, 4.0);
    let mut model = base.clone().attach_lora(&lora).unwrap();
    let contract = model.adapter_contract().unwrap();
    let input = || QwenImageInput {
        hidden_states: Tensor::<AD, 3>::ones([1, 6, 16], &dev).mul_scalar(0.3),
        encoder_hidden_states: Tensor::<AD, 3>::ones([1, 4, 24], &dev).mul_scalar(-0.2),
        encoder_hidden_states_mask: None,
        timestep: Tensor::from_floats([0.5], &dev),
        img_shapes: vec![ImageShape::new(1, 2, 3)],
    };
    let target = Tensor::<AD, 3>::random([1, 6, 16], Distribution::Default, &dev);
    let mut adam = burn::optim::AdamWConfig::new().init::<AD, _>();
    for _ in 0..2 {
        let loss = (model.forward(input()) - target.clone())
            .powi_scalar(2)
            .mean();
        let grads = GradientsParams::from_grads::<AD, _>(loss.backward(), &model);
        model = adam.step(1e-2, model, grads);
    }
    let out = |m: &dit_models::QwenImageTransformer2DModel<AD>| {
        m.valid()
            .forward(QwenImageInput {
                hidden_states: input().hidden_states.inner(),
                encoder_hidden_states: input().encoder_hidden_states.inner(),
                encoder_hidden_states_mask: None,
                timestep: input().timestep.inner(),
                img_shapes: vec![ImageShape::new(1, 2, 3)],
            })
            .into_data()
    };
    let trained = out(&model);

    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(dir.path(), "t2i", None).unwrap();
    let saved = store
        .save(
            &model,
            &adam,
            &TrainerState::new("t2i", 0),
            &TrainerRng::seeded(0),
            Some(&contract),
        )
        .unwrap();
    let weights = saved
        .files
        .iter()
        .find(|f| f.name == checkpoint::WEIGHTS_FILE)
        .unwrap()
        .bytes;
    let all_bytes = 4 * model.num_params() as u64;
    assert!(
        weights * 4 < all_bytes,
        "adapter only: {weights} of {all_bytes} bytes"
    );
    assert!(
        saved
            .files
            .iter()
            .any(|f| f.name == checkpoint::CONTRACT_FILE)
    );

    // a fresh adapter (new random A, new parameter ids) on the same base
    let mut fresh = base.clone().attach_lora(&lora).unwrap();
    let expected = fresh.adapter_contract().unwrap();
    assert_ne!(out(&fresh), trained);
    let Resume::Resumed(r) = store
        .resume(
            fresh,
            burn::optim::AdamWConfig::new().init::<AD, _>(),
            Some(&expected),
            &dev,
        )
        .unwrap()
    else {
        panic!("committed");
    };
    assert_eq!(r.contract.as_ref(), Some(&contract));
    assert_eq!(
        out(&r.model),
        trained,
        "the adapter is restored bit for bit"
    );

    // another alpha: refused, naming the field
    let mut other = base.clone().attach_lora(&LoraConfig::new(2, 8.0)).unwrap();
    let expected = other.adapter_contract().unwrap();
    let err = store
        .resume(
            other,
            burn::optim::AdamWConfig::new().init::<AD, _>(),
            Some(&expected),
            &dev,
        )
        .err()
        .unwrap();
    let msg = err.to_string();
    assert!(msg.contains("alpha recorded 4 but this run has 8"), "{msg}");
    // a full fine-tune run cannot resume a LoRA checkpoint
    let plain = base.clone().attach_lora(&lora).unwrap();
    let err = store
        .resume(
            plain,
            burn::optim::AdamWConfig::new().init::<AD, _>(),
            None,
            &dev,
        )
        .err()
        .unwrap();
    assert!(err.to_string().contains("trains every parameter"), "{err}");
}

/// A checkpoint write that fails is an IO error naming the file and the operation
/// ([`TrainerError::Io`]), not a rollout-artifact error, and leaves nothing resume trusts.
#[test]
fn a_failed_checkpoint_write_names_the_file() {
    let dev = Default::default();
    let model = Policy::<AD>::init(3, &dev);
    let opt = optimizer();
    let rng = TrainerRng::seeded(3);

    // the checkpoint root is a regular file: nothing can be created under it
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("checkpoints");
    std::fs::write(&root, b"not a directory").unwrap();
    let store = CheckpointStore::new(&root, "t2i", None).unwrap();
    let err = store
        .save(&model, opt.optimizer(), &state_of(&opt, 0), &rng, None)
        .unwrap_err();
    let TrainerError::Io { path, op, .. } = &err else {
        panic!("expected TrainerError::Io, got {err:?}");
    };
    assert!(path.starts_with(&root), "{err}: {path:?}");
    assert!(!op.is_empty());
    assert!(err.to_string().contains("checkpoints"), "{err}");

    // a directory squats on the weights file: the atomic write's rename fails after the
    // temporary file was written
    let dir = tempfile::tempdir().unwrap();
    let base = CheckpointStore::new(dir.path(), "t2i", None).unwrap();
    let weights = base.iteration_dir(0).join(checkpoint::WEIGHTS_FILE);
    let squat = weights.clone();
    let store = base.with_write_hook(Arc::new(move |_, p| {
        if p == WritePhase::Started {
            std::fs::create_dir_all(squat.join("inner")).unwrap();
        }
    }));
    let err = store
        .save(&model, opt.optimizer(), &state_of(&opt, 0), &rng, None)
        .unwrap_err();
    match &err {
        TrainerError::Io { path, op, .. } => {
            assert_eq!((path, *op), (&weights, "rename into place"), "{err}");
        }
        other => panic!("expected TrainerError::Io, got {other:?}"),
    }
    assert!(err.to_string().contains(checkpoint::WEIGHTS_FILE), "{err}");
    assert!(!durable::tmp_path(&weights).exists());
    assert!(
        !store
            .iteration_dir(0)
            .join(checkpoint::COMMITTED_FILE)
            .exists()
    );
    assert!(store.latest_committed().unwrap().is_none());

    // the root's latest-iteration marker cannot be replaced: the checkpoint itself is
    // committed, the error names the marker
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join(checkpoint::LATEST_FILE);
    std::fs::create_dir_all(marker.join("inner")).unwrap();
    let store = CheckpointStore::new(dir.path(), "t2i", None).unwrap();
    let err = store
        .save(&model, opt.optimizer(), &state_of(&opt, 0), &rng, None)
        .unwrap_err();
    assert!(
        matches!(&err, TrainerError::Io { path, op: "rename into place", .. } if *path == marker),
        "{err:?}"
    );
    assert_eq!(store.latest_committed().unwrap().unwrap().iteration, 0);
}
