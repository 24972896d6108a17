//! The clipped loss (its hand-computed values and its direction test), the KL terms, the
//! replay gradient, the update plan and the anchor.

use burn::backend::{Autodiff, NdArray};
use burn::tensor::{Tensor, TensorData, backend::Backend};
use flow_grpo::{
    AnchorRecorder, ClipRange, FlowGrpoError, KlForm, MicroBatching, PlanWarning, PolicyAnchor,
    ReplayStep, grpo_clip_loss, kl_to_reference, log_prob_parity, plan_updates, replay_log_probs,
};
use sde_math::{Kernel, StepSigmas, StorageDtype};

type F64 = NdArray<f64>;
type AD = Autodiff<F64>;

fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f64> {
    t.into_data().convert::<f64>().to_vec::<f64>().unwrap()
}

fn t2<B: Backend>(v: Vec<f64>, shape: [usize; 2]) -> Tensor<B, 2> {
    Tensor::from_data(TensorData::new(v, shape), &Default::default())
}

fn t1<B: Backend>(v: Vec<f64>) -> Tensor<B, 1> {
    let n = v.len();
    Tensor::from_data(TensorData::new(v, [n]), &Default::default())
}

/// Deterministic pseudo-normal values.
fn fill(seed: u64, n: usize) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

#[test]
fn clipped_loss_matches_hand_computation() {
    // ratios e^d: 1.5 (above a 0.2 band), 0.5 (below), 1.1 (inside), 1.0
    let d = [1.5f64.ln(), 0.5f64.ln(), 1.1f64.ln(), 0.0];
    let old = vec![-1.0, -2.0, -0.5, -3.0];
    let lp: Vec<f64> = old.iter().zip(d).map(|(o, d)| o + d).collect();
    let adv = vec![1.0, -2.0];
    let out = grpo_clip_loss(
        t2::<F64>(lp, [2, 2]),
        t2::<F64>(old, [2, 2]),
        t1::<F64>(adv),
        ClipRange::symmetric(0.2).unwrap(),
    )
    .unwrap();
    // A =  1: r 1.5 -> max(-1.5, -1.2) = -1.2;  r 0.5 -> max(-0.5, -0.8) = -0.5
    // A = -2: r 1.1 -> max(2.2, 2.2)   =  2.2;  r 1.0 -> 2.0
    let want = [-1.2, -0.5, 2.2, 2.0];
    let got = values(out.per_element.clone());
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-12, "{got:?}");
    }
    assert!((values(out.loss)[0] - want.iter().sum::<f64>() / 4.0).abs() < 1e-12);
    let dg = out.diagnostics;
    assert_eq!(dg.elements, 4);
    assert!((dg.ratio_min - 0.5).abs() < 1e-12 && (dg.ratio_max - 1.5).abs() < 1e-12);
    assert!((dg.ratio_mean - 1.025).abs() < 1e-12);
    let var = [1.5f64, 0.5, 1.1, 1.0]
        .iter()
        .map(|r| (r - 1.025).powi(2))
        .sum::<f64>()
        / 4.0;
    assert!((dg.ratio_std - var.sqrt()).abs() < 1e-12);
    assert_eq!(dg.clip_fraction, 0.5);
    // only (A = 1, r = 1.5) loses its gradient; (A = 1, r = 0.5) keeps it
    assert_eq!(dg.clipped_gradient_fraction, 0.25);
    let kl = 0.5 * d.iter().map(|x| x * x).sum::<f64>() / 4.0;
    assert!((dg.approx_kl - kl).abs() < 1e-12);
}

#[test]
fn asymmetric_clip_uses_both_bounds() {
    let clip = ClipRange::asymmetric(0.1, 0.3).unwrap();
    let d = [1.25f64.ln(), 1.35f64.ln(), 0.85f64.ln()];
    let old = vec![0.0; 3];
    let out = grpo_clip_loss(
        t2::<F64>(d.to_vec(), [3, 1]),
        t2::<F64>(old, [3, 1]),
        t1::<F64>(vec![1.0, 1.0, -1.0]),
        clip,
    )
    .unwrap();
    // 1.25 inside [0.9, 1.3]: -1.25;  1.35 above: -1.3;  0.85 below with A < 0: max(0.85, 0.9) = 0.9
    let got = values(out.per_element);
    for (g, w) in got.iter().zip([-1.25, -1.3, 0.9]) {
        assert!((g - w).abs() < 1e-12, "{got:?}");
    }
    assert!((out.diagnostics.clip_fraction - 2.0 / 3.0).abs() < 1e-15);
}

/// Each (sample, step) is clipped on its own: a step that leaves the band loses its gradient,
/// the other steps of the same sample keep theirs.
#[test]
fn one_step_out_of_band_does_not_zero_the_others() {
    let old = vec![0.0, 0.0, 0.0];
    let lp = t2::<AD>(vec![0.5, 1e-3 * 0.1, -1e-3 * 0.2], [1, 3]).require_grad();
    let out = grpo_clip_loss(
        lp.clone(),
        t2::<AD>(old, [1, 3]),
        t1::<AD>(vec![2.0]),
        ClipRange::symmetric(1e-3).unwrap(),
    )
    .unwrap();
    let grads = out.loss.backward();
    let g = values(lp.grad(&grads).unwrap());
    assert_eq!(g[0], 0.0, "the step above the band with A > 0 is clipped");
    // d/dlp of -A e^lp / 3
    assert!(
        (g[1] - (-2.0 * (1e-4f64).exp() / 3.0)).abs() < 1e-12,
        "{g:?}"
    );
    assert!(
        (g[2] - (-2.0 * (-2e-4f64).exp() / 3.0)).abs() < 1e-12,
        "{g:?}"
    );
}

#[test]
fn clip_loss_checks_its_inputs() {
    let m = t2::<F64>(vec![0.0; 4], [2, 2]);
    let bad_anchor = grpo_clip_loss(
        m.clone(),
        t2::<F64>(vec![0.0; 2], [1, 2]),
        t1::<F64>(vec![0.0; 2]),
        ClipRange::symmetric(0.1).unwrap(),
    );
    assert!(matches!(
        bad_anchor,
        Err(FlowGrpoError::ShapeMismatch {
            what: "anchor log-probs",
            ..
        })
    ));
    let bad_adv = grpo_clip_loss(
        m.clone(),
        m.clone(),
        t1::<F64>(vec![0.0; 3]),
        ClipRange::symmetric(0.1).unwrap(),
    );
    assert!(matches!(
        bad_adv,
        Err(FlowGrpoError::ShapeMismatch {
            what: "advantages",
            ..
        })
    ));
    for (lo, hi) in [
        (0.0, 0.1),
        (1.5, 0.1),
        (1.0 + 1e-9, 0.1),
        (0.1, 0.0),
        (f64::NAN, 0.1),
        (0.1, f64::INFINITY),
    ] {
        assert!(matches!(
            ClipRange::asymmetric(lo, hi),
            Err(FlowGrpoError::InvalidClipRange { .. })
        ));
    }
}

fn step_inputs<B: Backend>(seed: u64, shape: [usize; 3]) -> [Tensor<B, 3>; 3] {
    let n = shape.iter().product();
    let t = |s| Tensor::<B, 3>::from_data(TensorData::new(fill(s, n), shape), &Default::default());
    [t(seed), t(seed + 1), t(seed + 2)]
}

/// Seed 003: `d log p / d v = ((x' - mu) / std^2) * dmu/dv / N` with
/// `dmu/dv = [1 + g^2 (1 - sigma) / (2 sigma)] dt`, `g = a sqrt(sigma / (1 - sigma))`;
/// autodiff through `replay_log_probs` matches it and central finite differences.
#[test]
fn replay_gradient_matches_the_analytic_derivative_and_finite_differences() {
    let a = f64::from(0.7f32); // the kernel takes its noise level as f32
    let kernel = Kernel::flow_sde(0.7).unwrap();
    let shape = [2, 3, 4];
    let n_el = 12.0;
    let steps = [(0.8f32, 0.65f32), (0.4f32, 0.3f32)];
    let mut inputs = Vec::new();
    for (i, _) in steps.iter().enumerate() {
        inputs.push(step_inputs::<AD>(10 * i as u64 + 1, shape));
    }
    let vs: Vec<Tensor<AD, 3>> = inputs
        .iter()
        .map(|[_, v, _]| v.clone().require_grad())
        .collect();
    let replay_steps = steps
        .iter()
        .zip(&inputs)
        .zip(&vs)
        .map(|(((s, n), [x, _, next]), v)| ReplayStep {
            sigmas: StepSigmas::new(*s, *n).unwrap().into(),
            sample: x.clone(),
            prev_sample: next.clone(),
            model_output: v.clone(),
        })
        .collect();
    let out = replay_log_probs(&kernel, StorageDtype::Native, replay_steps).unwrap();
    assert_eq!(out.log_probs.dims(), [2, 2]);
    let grads = out.log_probs.clone().sum().backward();
    for (si, ((sigma, sigma_next), [_, _, next])) in steps.iter().zip(&inputs).enumerate() {
        let (s, sn) = (f64::from(*sigma), f64::from(*sigma_next));
        let dt = sn - s;
        let g = a * (s / (1.0 - s)).sqrt();
        let dmu_dv = (1.0 + g * g * (1.0 - s) / (2.0 * s)) * dt;
        let std2 = g * g * (-dt);
        let grad = values(vs[si].grad(&grads).unwrap());
        let resid = values(next.clone().sub(out.transitions[si].mean.clone()));
        for (i, (gr, r)) in grad.iter().zip(&resid).enumerate() {
            let analytic = r / std2 * dmu_dv / n_el;
            assert!(
                (gr - analytic).abs() < 1e-9 * analytic.abs().max(1e-6),
                "step {si} element {i}: {gr} vs {analytic}"
            );
        }
        // central finite differences on a few elements
        for elem in [0usize, 7, 23] {
            let h = 1e-6;
            let bump = |delta: f64| {
                let [x, v, nx] = &inputs[si];
                let mut vv = values(v.clone());
                vv[elem] += delta;
                let step = ReplayStep {
                    sigmas: StepSigmas::new(*sigma, *sigma_next).unwrap().into(),
                    sample: Tensor::<F64, 3>::from_data(x.clone().into_data(), &Default::default()),
                    prev_sample: Tensor::<F64, 3>::from_data(
                        nx.clone().into_data(),
                        &Default::default(),
                    ),
                    model_output: Tensor::<F64, 3>::from_data(
                        TensorData::new(vv, shape),
                        &Default::default(),
                    ),
                };
                let lp = replay_log_probs(&kernel, StorageDtype::Native, vec![step]).unwrap();
                values(lp.log_probs).iter().sum::<f64>()
            };
            let fd = (bump(h) - bump(-h)) / (2.0 * h);
            assert!(
                (fd - grad[elem]).abs() < 1e-6 * grad[elem].abs().max(1.0),
                "step {si} element {elem}: fd {fd} vs autodiff {}",
                grad[elem]
            );
        }
    }
}

/// At ratio 1 the clipped loss's gradient is `-A / (n S) * d log p / d v`.
#[test]
fn loss_gradient_at_ratio_one_is_the_policy_gradient() {
    let kernel = Kernel::flow_sde(0.7).unwrap();
    let [x, v, next] = step_inputs::<AD>(5, [2, 2, 2]);
    let v = v.require_grad();
    let step = || ReplayStep {
        sigmas: StepSigmas::new(0.5, 0.4).unwrap().into(),
        sample: x.clone(),
        prev_sample: next.clone(),
        model_output: v.clone(),
    };
    let lp = replay_log_probs(&kernel, StorageDtype::Native, vec![step()]).unwrap();
    let anchor = lp.log_probs.clone().detach();
    let adv = vec![0.75, -0.25];
    let loss = grpo_clip_loss(
        lp.log_probs.clone(),
        anchor,
        t1::<AD>(adv.clone()),
        ClipRange::symmetric(1e-4).unwrap(),
    )
    .unwrap();
    assert_eq!(loss.diagnostics.ratio_min, 1.0);
    assert_eq!(loss.diagnostics.ratio_max, 1.0);
    let g_loss = values(v.grad(&loss.loss.backward()).unwrap());
    let lp2 = replay_log_probs(&kernel, StorageDtype::Native, vec![step()]).unwrap();
    let weights = t2::<AD>(adv.iter().map(|a| -a / 2.0).collect(), [2, 1]);
    let g_pg = values(
        v.grad(&lp2.log_probs.mul(weights).sum().backward())
            .unwrap(),
    );
    for (a, b) in g_loss.iter().zip(&g_pg) {
        assert!((a - b).abs() < 1e-12 * b.abs().max(1e-9), "{a} vs {b}");
    }
}

/// The direction test of FlowGRPO's clipped objective, through the kernels its samplers
/// train with (Flow-SDE: FlowGRPO, MixGRPO, Flow-GRPO-Fast; Dance: DanceGRPO): one gradient
/// step on a toy model whose velocity is the parameter itself, with a positive advantage,
/// moves the step's predicted mean toward the stored (rewarded) next latent; with a negative
/// one, away from it.
#[test]
fn a_rewarded_transition_draws_the_mean_toward_it_and_a_penalised_one_pushes_it_away() {
    let x = [0.3, -0.4, 0.8];
    let stored = [0.1, 0.2, 0.5];
    let theta = [-0.2, 0.6, 0.1];
    let t3 = |v: &[f64]| {
        Tensor::<AD, 3>::from_data(TensorData::new(v.to_vec(), [1, 1, 3]), &Default::default())
    };
    for (name, kernel) in [
        ("flow_sde", Kernel::flow_sde(0.7).unwrap()),
        ("dance", Kernel::dance(0.3).unwrap()),
    ] {
        let step = |v: Tensor<AD, 3>| ReplayStep {
            sigmas: StepSigmas::new(0.6, 0.45).unwrap().into(),
            sample: t3(&x),
            prev_sample: t3(&stored),
            model_output: v,
        };
        // the squared distance of the step's mean from the stored latent under velocity `v`
        let distance = |v: &[f64]| {
            let out = replay_log_probs(&kernel, StorageDtype::Native, vec![step(t3(v))]).unwrap();
            values(out.transitions[0].mean.clone())
                .iter()
                .zip(stored)
                .map(|(m, s)| (m - s) * (m - s))
                .sum::<f64>()
        };
        for (adv, closer) in [(1.0, true), (-1.0, false)] {
            let v = t3(&theta).require_grad();
            let lp =
                replay_log_probs(&kernel, StorageDtype::Native, vec![step(v.clone())]).unwrap();
            let anchor = lp.log_probs.clone().detach();
            let loss = grpo_clip_loss(
                lp.log_probs,
                anchor,
                t1::<AD>(vec![adv]),
                ClipRange::symmetric(1e-4).unwrap(),
            )
            .unwrap();
            let g = values(v.grad(&loss.loss.backward()).unwrap());
            let scale = g.iter().fold(0.0f64, |m, x| {
                assert!(x.is_finite(), "{name}: gradient {g:?}");
                m.max(x.abs())
            });
            assert!(scale > 0.0, "{name}: no gradient");
            // a small plain step against the gradient
            let after: Vec<f64> = theta
                .iter()
                .zip(&g)
                .map(|(t, g)| t - 1e-3 * g / scale)
                .collect();
            let (before, now) = (distance(&theta), distance(&after));
            assert_eq!(
                now < before,
                closer,
                "{name}, advantage {adv}: {before} -> {now}"
            );
        }
    }
}

#[test]
fn replay_checks_its_inputs() {
    let kernel = Kernel::flow_sde(0.7).unwrap();
    let empty: Vec<ReplayStep<F64, 3>> = vec![];
    assert!(matches!(
        replay_log_probs(&kernel, StorageDtype::F32, empty),
        Err(FlowGrpoError::Empty { .. })
    ));
    let [x, v, n] = step_inputs::<F64>(1, [2, 1, 2]);
    let [x3, v3, n3] = step_inputs::<F64>(1, [3, 1, 2]);
    let ok = ReplayStep {
        sigmas: StepSigmas::new(0.5, 0.4).unwrap().into(),
        sample: x,
        prev_sample: n,
        model_output: v,
    };
    let other = ReplayStep {
        sigmas: StepSigmas::new(0.4, 0.3).unwrap().into(),
        sample: x3,
        prev_sample: n3,
        model_output: v3,
    };
    assert!(matches!(
        replay_log_probs(&kernel, StorageDtype::F32, vec![ok.clone(), other]),
        Err(FlowGrpoError::ShapeMismatch { .. })
    ));
    // a trained step 0 under Flow-SDE is refused by sde-math, and the error says which step
    let mut at_one = ok.clone();
    at_one.sigmas = StepSigmas::new(1.0, 0.9).unwrap().into();
    let err = replay_log_probs(&kernel, StorageDtype::F32, vec![ok, at_one]).unwrap_err();
    assert!(
        matches!(err, FlowGrpoError::Replay { step: 1, .. }),
        "{err}"
    );
}

#[test]
fn kl_forms_agree_with_their_closed_forms() {
    let a = f64::from(0.7f32); // the kernel takes its noise level as f32
    let kernel = Kernel::flow_sde(0.7).unwrap();
    let (sigma, sigma_next) = (0.6f32, 0.45f32);
    let at = StepSigmas::new(sigma, sigma_next).unwrap().into();
    let [x, v, next] = step_inputs::<F64>(3, [2, 3, 2]);
    let [_, v_ref, _] = step_inputs::<F64>(9, [2, 3, 2]);
    let pol = kernel
        .replay(
            &at,
            v.clone(),
            x.clone(),
            next.clone(),
            StorageDtype::Native,
        )
        .unwrap();
    let refr = kernel
        .replay(
            &at,
            v_ref.clone(),
            x.clone(),
            next.clone(),
            StorageDtype::Native,
        )
        .unwrap();
    let same = kl_to_reference(&pol, &pol, KlForm::ExactSum).unwrap();
    assert!(values(same.per_sample).iter().all(|k| k.abs() < 1e-15));

    let exact_sum = values(
        kl_to_reference(&pol, &refr, KlForm::ExactSum)
            .unwrap()
            .per_sample,
    );
    let exact_mean = values(
        kl_to_reference(&pol, &refr, KlForm::ExactMean)
            .unwrap()
            .per_sample,
    );
    let flow = values(
        kl_to_reference(&pol, &refr, KlForm::FlowGrpoReference)
            .unwrap()
            .per_sample,
    );
    // seed 004, in velocity space: KL = |dt|/2 (g (1 - s) / (2 s) + 1 / g)^2 ||v - v_ref||^2
    let (s, dt) = (f64::from(sigma), f64::from(sigma_next) - f64::from(sigma));
    let g = a * (s / (1.0 - s)).sqrt();
    let coef = -dt / 2.0 * (g * (1.0 - s) / (2.0 * s) + 1.0 / g).powi(2);
    let dv = values(v.sub(v_ref.clone()));
    for b in 0..2 {
        let sq: f64 = dv[b * 6..(b + 1) * 6].iter().map(|d| d * d).sum();
        assert!(
            (exact_sum[b] - coef * sq).abs() < 1e-10 * exact_sum[b],
            "{} vs {}",
            exact_sum[b],
            coef * sq
        );
        assert!((exact_mean[b] * 6.0 - exact_sum[b]).abs() < 1e-12 * exact_sum[b]);
        // flow_grpo's form is the exact per-element mean times |dt| ("KL without dt")
        assert!((flow[b] - exact_mean[b] * -dt).abs() < 1e-12 * flow[b]);
    }

    // a reference with another std (another kernel) has no closed form over the means
    let other = Kernel::dance(0.3)
        .unwrap()
        .replay(&at, v_ref, x, next, StorageDtype::Native)
        .unwrap();
    assert!(matches!(
        kl_to_reference(&pol, &other, KlForm::FlowGrpoReference),
        Err(FlowGrpoError::StdMismatch { .. })
    ));
    // but the exact KL handles it: KL(N(m1, s1) || N(m2, s2)) per element
    let k = values(
        kl_to_reference(&pol, &other, KlForm::ExactMean)
            .unwrap()
            .per_sample,
    );
    let (m1, m2) = (values(pol.mean.clone()), values(other.mean.clone()));
    for b in 0..2 {
        let (s1, s2) = (pol.std[b], other.std[b]);
        let want: f64 = (0..6)
            .map(|i| {
                let d = m1[b * 6 + i] - m2[b * 6 + i];
                (s2 / s1).ln() + (s1 * s1 + d * d) / (2.0 * s2 * s2) - 0.5
            })
            .sum::<f64>()
            / 6.0;
        assert!(
            (k[b] - want).abs() < 1e-12 * want.abs().max(1.0),
            "{} vs {want}",
            k[b]
        );
    }
}

/// The KL gradient flows into the policy's model output only; the reference is a constant.
#[test]
fn kl_gradient_flows_through_the_policy_only() {
    let kernel = Kernel::flow_sde(0.7).unwrap();
    let at = StepSigmas::new(0.5, 0.4).unwrap().into();
    let [x, v, next] = step_inputs::<AD>(3, [1, 2, 2]);
    let [_, v_ref, _] = step_inputs::<AD>(8, [1, 2, 2]);
    let (v, v_ref) = (v.require_grad(), v_ref.require_grad());
    let pol = kernel
        .replay(
            &at,
            v.clone(),
            x.clone(),
            next.clone(),
            StorageDtype::Native,
        )
        .unwrap();
    let refr = kernel
        .replay(&at, v_ref.clone(), x, next, StorageDtype::Native)
        .unwrap();
    let grads = kl_to_reference(&pol, &refr, KlForm::ExactSum)
        .unwrap()
        .per_sample
        .sum()
        .backward();
    assert!(values(v.grad(&grads).unwrap()).iter().any(|g| *g != 0.0));
    assert!(v_ref.grad(&grads).is_none());
}

#[test]
fn plans_split_disjointly_and_refuse_uneven_batches() {
    let plan = plan_updates(256, 2, 1).unwrap();
    assert_eq!(plan.updates.len(), 2);
    assert_eq!(plan.updates[0].samples, 0..128);
    assert_eq!(plan.updates[1].samples, 128..256);
    assert_eq!(plan.updates[1].micro_batches.len(), 128);
    let covered: Vec<usize> = plan.micro_batches().flat_map(|r| r.clone()).collect();
    assert_eq!(covered, (0..256).collect::<Vec<_>>());
    assert!(plan.warnings.is_empty());
    assert_eq!(plan.updates[0].micro_batch_weight(3), 1.0 / 128.0);

    let err = plan_updates(10, 4, 1).unwrap_err();
    assert_eq!(
        err,
        FlowGrpoError::UpdatesNotDivisible {
            samples: 10,
            num_updates: 4
        }
    );
    assert!(err.to_string().contains("does not divide"));
    assert!(matches!(
        plan_updates(8, 0, 1),
        Err(FlowGrpoError::ZeroPlanParameter {
            what: "num_updates_per_batch"
        })
    ));
    assert!(matches!(
        plan_updates(8, 2, 0),
        Err(FlowGrpoError::ZeroPlanParameter {
            what: "micro_batch_size"
        })
    ));
    assert!(matches!(
        plan_updates(0, 1, 1),
        Err(FlowGrpoError::Empty { .. })
    ));

    // a micro-batch size that does not divide the chunk: no split, never a straddling batch
    let plan = plan_updates(12, 2, 4).unwrap();
    assert_eq!(
        plan.micro_batching,
        MicroBatching::Unsplit {
            requested: 4,
            chunk: 6
        }
    );
    assert_eq!(plan.updates[1].micro_batches, vec![6..12]);
    assert_eq!(
        plan.warnings,
        vec![PlanWarning::MicroBatchNotSplit {
            requested: 4,
            chunk: 6
        }]
    );

    // one update per batch: valid, with a loud warning
    let plan = plan_updates(8, 1, 2).unwrap();
    assert_eq!(plan.warnings, vec![PlanWarning::SingleUpdate]);
    let msg = PlanWarning::SingleUpdate.to_string();
    assert!(
        msg.contains("exactly 1") && msg.contains("0 by construction"),
        "{msg}"
    );
}

#[test]
fn the_anchor_is_recorded_once_and_frozen_complete() {
    let plan = plan_updates(4, 2, 1).unwrap();
    let mut rec = AnchorRecorder::new(&plan);
    let lp = |v: Vec<f64>, n| t2::<F64>(v, [n, 2]);
    rec.record(0..2, lp(vec![-1.0, -2.0, -3.0, -4.0], 2))
        .unwrap();
    assert!(matches!(
        rec.record(1..2, lp(vec![0.0, 0.0], 1)),
        Err(FlowGrpoError::AnchorRange { .. })
    ));
    assert!(matches!(
        rec.record(3..5, lp(vec![0.0; 4], 2)),
        Err(FlowGrpoError::AnchorRange { .. })
    ));
    assert!(matches!(
        rec.record(2..3, t2::<F64>(vec![0.0; 3], [1, 3])),
        Err(FlowGrpoError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        rec.record(2..3, lp(vec![0.0, f64::NAN], 1)),
        Err(FlowGrpoError::NonFiniteLogProb {
            sample: 2,
            step: 1,
            ..
        })
    ));
    let incomplete = rec.clone().freeze().unwrap_err();
    assert_eq!(
        incomplete,
        FlowGrpoError::AnchorIncomplete {
            missing: 2,
            samples: 4,
            first: 2
        }
    );
    rec.record(2..4, lp(vec![-5.0, -6.0, -7.0, -8.0], 2))
        .unwrap();
    let anchor = rec.freeze().unwrap();
    assert_eq!(anchor.steps(), 2);
    assert_eq!(
        values(anchor.log_probs::<F64>(1..3, &Default::default()).unwrap()),
        vec![-3.0, -4.0, -5.0, -6.0]
    );
    assert!(anchor.log_probs::<F64>(3..5, &Default::default()).is_err());

    let from_rollout =
        PolicyAnchor::from_rollout(&[-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, -8.0], 4, 2)
            .unwrap();
    assert_eq!(from_rollout, anchor);
    assert!(PolicyAnchor::from_rollout(&[0.0; 3], 2, 2).is_err());
    assert!(PolicyAnchor::from_rollout(&[0.0, f32::INFINITY], 1, 2).is_err());
}

#[test]
fn parity_reports_bitwise_agreement() {
    let a = t2::<F64>(vec![-1.0, -2.0, -3.0, -4.0], [2, 2]);
    let b = t2::<F64>(vec![-1.0, -2.0, -3.0, -4.5], [2, 2]);
    let p = log_prob_parity(a.clone(), a.clone()).unwrap();
    assert_eq!((p.max_abs_diff, p.bitwise_equal_fraction), (0.0, 1.0));
    let p = log_prob_parity(a.clone(), b).unwrap();
    assert_eq!(
        (p.max_abs_diff, p.mean_abs_diff, p.bitwise_equal_fraction),
        (0.5, 0.125, 0.75)
    );
    assert!(log_prob_parity(a, t2::<F64>(vec![0.0; 2], [1, 2])).is_err());
}
