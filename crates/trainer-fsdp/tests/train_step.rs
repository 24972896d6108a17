//! `train_step` on a tiny FlowGRPO world: the first update is on-policy (ratio exactly 1), the
//! second is not; micro-batch accumulation equals one big batch; degenerate advantages and
//! non-finite gradients skip the step without touching the weights; the learning rate follows
//! the schedule in optimizer steps; the master-dtype check; the global clip engages.

mod common;

use burn::backend::{Autodiff, NdArray};
use burn::module::AutodiffModule;
use burn::tensor::Tensor;
use common::*;
use flow_grpo::{ClipDiagnostics, plan_updates};
use trainer_fsdp::algorithm::clip_metrics;
use trainer_fsdp::{
    AdamWSettings, LocalWorkers, LrSchedule, MasterDtype, MicroBatchLoss, PolicyOptimizer,
    SkipReason, TrainerError, TrainerRng, advantage_metrics, advantages, names, train_step,
    train_step_threads,
};

/// One rank, one host thread.
const ONE: LocalWorkers = LocalWorkers::ONE;

fn setup(seed: u64) -> (Policy<AD>, Rollout, flow_grpo::Advantages) {
    let dev = Default::default();
    let model = Policy::<AD>::init(seed, &dev);
    let mut rng = TrainerRng::seeded(seed);
    let r = rollout(&model.valid(), &mut rng);
    let adv = advantages(&advantage_config(), &r.groups, None).unwrap();
    assert!(!adv.degenerate);
    (model, r, adv)
}

#[test]
fn first_update_is_on_policy_and_the_second_is_not() {
    let (model, r, adv) = setup(1);
    let plan = plan();
    let anchor = anchor(&model, &r, &plan);
    let mut opt = optimizer();
    let before = param_bytes(&model);

    let (model, first) = train_step(model, &mut opt, &ONE, &plan.updates[0], false, |m, mb| {
        loss(m, &r, &anchor, &adv, mb)
    })
    .unwrap();
    let c = clip_metrics(std::slice::from_ref(&first));
    assert_eq!(c[names::TRAIN_RATIO_MIN], 1.0);
    assert_eq!(c[names::TRAIN_RATIO_MAX], 1.0);
    assert_eq!(c[names::TRAIN_CLIP_FRACTION], 0.0);
    assert_eq!(c[names::TRAIN_APPROX_KL], 0.0);
    assert_eq!(first.step.skipped, None);
    assert_eq!(first.num_microbatches, 2);
    assert_eq!((first.samples, first.transitions), (4, 8));
    assert_ne!(param_bytes(&model), before, "the step moved the weights");
    // warmup over 2 steps: the first step runs at lr / 2
    assert_eq!(first.step.lr, 5e-2 / 2.0);
    assert_eq!(opt.lr_scheduler().steps(), 1);
    assert_eq!(opt.policy_version(), 1);

    let (_, second) = train_step(model, &mut opt, &ONE, &plan.updates[1], false, |m, mb| {
        loss(m, &r, &anchor, &adv, mb)
    })
    .unwrap();
    let c = clip_metrics(std::slice::from_ref(&second));
    assert!(
        c[names::TRAIN_RATIO_MIN] < 1.0 || c[names::TRAIN_RATIO_MAX] > 1.0,
        "after a step the ratio leaves 1: {second:?}"
    );
    assert!(c[names::TRAIN_APPROX_KL] > 0.0);
    assert_eq!(second.step.lr, 5e-2);
    assert_eq!(opt.optimizer_steps(), 2);

    let m = second.metrics();
    assert_eq!(m[names::TRAIN_LR], 5e-2);
    assert_eq!(m[names::TRAIN_OPTIMIZER_STEPS], 1.0);
    assert_eq!(m[names::TRAIN_NUM_MICROBATCHES], 2.0);
    assert!(m[names::TRAIN_GRAD_NORM] > 0.0);
    assert!(m[names::PERF_TRAIN_TRANSITIONS_PER_S] > 0.0);
    let a = advantage_metrics(&adv);
    assert_eq!(a[names::REWARD_NUM_GROUPS], 2.0);
    assert!(a[names::REWARD_GROUP_STD_MEAN] > 0.0);
}

#[test]
fn micro_batches_accumulate_to_the_gradient_of_the_whole_update() {
    let (model, r, adv) = setup(2);
    let run = |micro: usize| {
        let plan = plan_updates(8, 2, micro).unwrap();
        let anchor = anchor(&model, &r, &plan);
        let mut opt = optimizer();
        let (m, report) = train_step(
            model.clone(),
            &mut opt,
            &ONE,
            &plan.updates[1],
            false,
            |m, mb| loss(m, &r, &anchor, &adv, mb),
        )
        .unwrap();
        (m, report)
    };
    let (a, ra) = run(1);
    let (b, rb) = run(4);
    assert_eq!((ra.num_microbatches, rb.num_microbatches), (4, 1));
    let (ga, gb) = (ra.step.clip.unwrap(), rb.step.clip.unwrap());
    assert!(
        (ga.total_norm - gb.total_norm).abs() <= 1e-5 * gb.total_norm,
        "{} vs {}",
        ga.total_norm,
        gb.total_norm
    );
    // one whole group: the centred advantages make the on-policy loss ~0 up to f32 sums
    assert!(
        (ra.loss - rb.loss).abs() <= 1e-6,
        "{} vs {}",
        ra.loss,
        rb.loss
    );
    let wa: Vec<f32> = a.lin.weight.val().into_data().to_vec().unwrap();
    let wb: Vec<f32> = b.lin.weight.val().into_data().to_vec().unwrap();
    for (x, y) in wa.iter().zip(&wb) {
        assert!((x - y).abs() <= 1e-5 * y.abs().max(1.0), "{x} vs {y}");
    }
}

#[test]
fn threaded_micro_batches_step_exactly_like_sequential_ones() {
    let (model, r, adv) = setup(6);
    let plan = plan_updates(8, 2, 1).unwrap();
    let anchor = anchor(&model, &r, &plan);
    let run = |threads: usize| {
        let mut opt = optimizer();
        let mut m = model.clone();
        let mut reports = Vec::new();
        for update in &plan.updates {
            let (next, report) = train_step_threads(
                m,
                &mut opt,
                &LocalWorkers::new(threads),
                update,
                false,
                |m, mb| loss(m, &r, &anchor, &adv, mb),
            )
            .unwrap();
            m = next;
            reports.push(report);
        }
        (param_bytes(&m), reports)
    };
    let (seq, rs) = run(1);
    for threads in [2, 3, 8] {
        let (par, rp) = run(threads);
        assert_eq!(
            par, seq,
            "{threads} threads: the weights differ from the sequential step"
        );
        for (a, b) in rs.iter().zip(&rp) {
            assert_eq!(a.num_microbatches, 4);
            assert_eq!(a.loss.to_bits(), b.loss.to_bits());
            assert_eq!(
                clip_metrics(std::slice::from_ref(a))[names::TRAIN_RATIO_MAX].to_bits(),
                clip_metrics(std::slice::from_ref(b))[names::TRAIN_RATIO_MAX].to_bits()
            );
            assert_eq!(
                a.step.clip.unwrap().total_norm.to_bits(),
                b.step.clip.unwrap().total_norm.to_bits()
            );
        }
    }
    assert_ne!(seq, param_bytes(&model), "the steps moved the weights");
}

/// burn 0.21's autodiff deadlocks when one thread's backward races another's forward over a
/// shared graph; the threaded step works on replicas with their own graphs. Many threaded
/// updates in a row, under a watchdog.
#[test]
fn threaded_steps_do_not_deadlock() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (model, r, adv) = setup(8);
        let plan = plan_updates(8, 1, 1).unwrap();
        let anchor = anchor(&model, &r, &plan);
        let mut opt = optimizer();
        let mut m = model;
        for _ in 0..200 {
            let (next, _) = train_step_threads(
                m,
                &mut opt,
                &LocalWorkers::new(4),
                &plan.updates[0],
                false,
                |m, mb| loss(m, &r, &anchor, &adv, mb),
            )
            .unwrap();
            m = next;
        }
        tx.send(opt.optimizer_steps()).unwrap();
    });
    let steps = rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("200 threaded updates did not finish in 120 s: deadlock");
    assert_eq!(steps, 200);
}

#[test]
fn a_failing_micro_batch_fails_the_threaded_step() {
    let (model, r, adv) = setup(7);
    let plan = plan_updates(8, 2, 1).unwrap();
    let anchor = anchor(&model, &r, &plan);
    let mut opt = optimizer();
    let err = train_step_threads(
        model,
        &mut opt,
        &LocalWorkers::new(2),
        &plan.updates[0],
        false,
        |m, mb| {
            if mb.start == 1 {
                return Err(TrainerError::TrainedStepOutOfRange { step: 99, steps: 3 });
            }
            loss(m, &r, &anchor, &adv, mb)
        },
    )
    .unwrap_err();
    assert!(
        matches!(err, TrainerError::TrainedStepOutOfRange { step: 99, .. }),
        "{err}"
    );
    assert_eq!(
        opt.optimizer_steps(),
        0,
        "no step after a failed micro-batch"
    );
}

#[test]
fn degenerate_advantages_skip_without_a_forward() {
    let (model, _, _) = setup(3);
    let plan = plan();
    let mut opt = optimizer();
    let before = param_bytes(&model);
    let (model, report) = train_step(
        model,
        &mut opt,
        &ONE,
        &plan.updates[0],
        true,
        |_, _| -> Result<MicroBatchLoss<AD, ClipDiagnostics>, TrainerError> {
            panic!("no forward on a degenerate batch")
        },
    )
    .unwrap();
    assert_eq!(report.step.skipped, Some(SkipReason::DegenerateAdvantages));
    assert_eq!(param_bytes(&model), before);
    assert_eq!(
        opt.lr_scheduler().steps(),
        0,
        "a skipped step does not advance the schedule"
    );
    assert_eq!((opt.optimizer_skips(), opt.policy_version()), (1, 0));
    let m = report.metrics();
    assert_eq!(m[names::TRAIN_OPTIMIZER_SKIPS], 1.0);
    assert_eq!(m[names::TRAIN_NUM_MICROBATCHES], 2.0);
}

#[test]
fn a_non_finite_loss_skips_the_step() {
    let (model, r, adv) = setup(4);
    let plan = plan();
    let anchor = anchor(&model, &r, &plan);
    let mut opt = optimizer();
    let before = param_bytes(&model);
    let (model, report) = train_step(model, &mut opt, &ONE, &plan.updates[0], false, |m, mb| {
        let l = loss(m, &r, &anchor, &adv, mb)?;
        Ok(MicroBatchLoss {
            loss: l.loss * Tensor::from_floats([f32::NAN], &Default::default()),
            ..l
        })
    })
    .unwrap();
    assert_eq!(report.step.skipped, Some(SkipReason::NonFiniteGradNorm));
    assert!(report.loss.is_nan());
    assert_eq!(param_bytes(&model), before);
    assert_eq!(opt.policy_version(), 0);
}

#[test]
fn the_loss_closure_error_comes_back() {
    let (model, _, _) = setup(5);
    let plan = plan();
    let mut opt = optimizer();
    let err = train_step(model, &mut opt, &ONE, &plan.updates[0], false, |_, _| {
        Err::<MicroBatchLoss<AD, ClipDiagnostics>, _>(TrainerError::NoTrainableParameters)
    })
    .err()
    .unwrap();
    assert!(matches!(err, TrainerError::NoTrainableParameters));
}

#[test]
fn the_global_clip_engages() {
    let (model, r, adv) = setup(6);
    let plan = plan();
    let anchor = anchor(&model, &r, &plan);
    let settings = AdamWSettings {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    };
    let mut opt =
        PolicyOptimizer::adamw(&settings, LrSchedule::constant(1e-3).unwrap(), 1e-6, None).unwrap();
    let (_, report) = train_step(model, &mut opt, &ONE, &plan.updates[0], false, |m, mb| {
        loss(m, &r, &anchor, &adv, mb)
    })
    .unwrap();
    let clip = report.step.clip.unwrap();
    assert!(clip.clipped);
    assert_eq!(clip.tensors, 2);
    assert_eq!(clip.coef, 1e-6 / (clip.total_norm + 1e-6));
}

#[test]
fn the_master_dtype_is_checked() {
    type AD64 = Autodiff<NdArray<f64>>;
    let dev = Default::default();
    let model = Policy::<AD64>::init(7, &dev);
    let settings = AdamWSettings {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    };
    let mut opt = PolicyOptimizer::adamw(
        &settings,
        LrSchedule::constant(1e-3).unwrap(),
        1.0,
        Some(MasterDtype::Fp32),
    )
    .unwrap();
    let plan = plan_updates(2, 1, 1).unwrap();
    let err = train_step(
        model,
        &mut opt,
        &ONE,
        &plan.updates[0],
        false,
        |m: &Policy<AD64>, _| {
            let w = m.lin.weight.val();
            Ok(MicroBatchLoss {
                loss: w.sum(),
                elements: 1,
                diagnostics: ClipDiagnostics {
                    ratio_mean: 1.0,
                    ratio_std: 0.0,
                    ratio_min: 1.0,
                    ratio_max: 1.0,
                    clip_fraction: 0.0,
                    clipped_gradient_fraction: 0.0,
                    approx_kl: 0.0,
                    elements: 1,
                },
            })
        },
    )
    .err()
    .unwrap();
    let msg = err.to_string();
    assert!(
        msg.contains("lin.weight is stored as F64") && msg.contains("Fp32"),
        "{msg}"
    );
}
