//! Unit tests of the kernels' contracts: errors, the single std source, KL identities,
//! dtype handling and the replay gradient.

#[path = "support/analytic.rs"]
mod analytic;

use analytic::Normals;
use burn::backend::{Autodiff, Flex, NdArray};
use burn::tensor::{DType, FloatDType, Tensor, backend::Backend};
use sde_math::gaussian::{
    kl_diag_elements, kl_flow_grpo_reference, kl_same_std_elements, mean_over_non_batch,
    sum_over_non_batch,
};
use sde_math::{Cps, FlowSde, Kernel, SdeError, SigmaOnePolicy, Sigmas, StepSigmas, StorageDtype};

type F64 = NdArray<f64>;

fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f64> {
    t.into_data().convert::<f64>().to_vec::<f64>().unwrap()
}

fn at(s: f32, n: f32) -> Sigmas {
    StepSigmas::new(s, n).unwrap().into()
}

fn xvn<B: Backend>(seed: u64, shape: [usize; 3]) -> (Tensor<B, 3>, Tensor<B, 3>, Tensor<B, 3>) {
    let dev = Default::default();
    let mut g = Normals::new(seed);
    (
        g.tensor(shape, &dev),
        g.tensor(shape, &dev),
        g.tensor(shape, &dev),
    )
}

#[test]
fn step_sigmas_are_validated() {
    for (s, n) in [
        (0.5, 0.5),
        (0.4, 0.5),
        (1.2, 0.5),
        (0.5, -0.1),
        (f32::NAN, 0.1),
        (0.5, f32::INFINITY),
    ] {
        let err = StepSigmas::new(s, n).unwrap_err();
        assert!(
            matches!(err, SdeError::InvalidSigmas { .. }),
            "{s} -> {n}: {err}"
        );
    }
    assert!(StepSigmas::new(1.0, 0.0).is_ok());
    let e = StepSigmas::from_schedule(&[1.0, 0.5, 0.0], 2).unwrap_err();
    assert_eq!(
        e,
        SdeError::StepOutOfRange {
            index: 2,
            len: 3,
            last: 1
        }
    );
}

#[test]
fn kernel_parameters_are_validated() {
    assert!(Kernel::flow_sde(0.0).is_err());
    assert!(Kernel::flow_sde(f32::NAN).is_err());
    assert!(Kernel::dance(-0.1).is_err());
    assert!(Kernel::cps(1.5).is_err());
    assert!(Kernel::churn(0.0).is_err());
    let bad = Kernel::FlowSde(FlowSde {
        noise_level: 0.7,
        at_sigma_one: SigmaOnePolicy::Substitute(1.0),
    });
    let msg = bad.validated().unwrap_err().to_string();
    assert!(msg.contains("sigma_max") && msg.contains("(0, 1)"), "{msg}");
}

/// A Flow-SDE step at sigma = 1 is refused by default, with a message that says what to do.
#[test]
fn flow_sde_step_zero_is_an_error_by_default() {
    let k = Kernel::flow_sde(0.7).unwrap();
    let step0 = StepSigmas::new(1.0, 0.9).unwrap();
    let err = k.transition_std(&step0).unwrap_err();
    assert_eq!(err, SdeError::StochasticStepAtSigmaOne { sigma_next: 0.9 });
    assert!(err.to_string().contains("deterministic"));
    let (x, v, n) = xvn::<Flex>(1, [1, 2, 2]);
    assert!(
        k.sample(
            &step0.into(),
            v.clone(),
            x.clone(),
            n.clone(),
            StorageDtype::Native
        )
        .is_err()
    );
    assert!(
        k.replay(&step0.into(), v, x, n, StorageDtype::Native)
            .is_err()
    );
    // Dance has no singularity at sigma = 1
    assert!(Kernel::dance(0.3).unwrap().transition_std(&step0).is_ok());
}

/// The two reference conventions at sigma = 1, opted into explicitly.
#[test]
fn sigma_one_policies_follow_their_references() {
    let step0 = StepSigmas::new(1.0, 0.9).unwrap();
    let next = Kernel::FlowSde(FlowSde {
        noise_level: 0.7,
        at_sigma_one: SigmaOnePolicy::SubstituteNext,
    });
    let m = next.moments(&step0).unwrap();
    assert!(
        (m.std_dev_t - f64::from(0.7f32) * (1.0f64 / (1.0 - f64::from(0.9f32))).sqrt()).abs()
            < 1e-12
    );
    let clamp = Kernel::FlowSde(FlowSde {
        noise_level: 0.7,
        at_sigma_one: SigmaOnePolicy::Substitute(0.99),
    });
    let m = clamp.moments(&step0).unwrap();
    assert!(
        (m.std_dev_t - f64::from(0.7f32) * (1.0f64 / (1.0 - f64::from(0.99f32))).sqrt()).abs()
            < 1e-12
    );
    assert!(
        (m.std_dev_t - 7.0).abs() < 0.01,
        "the seed's 7.0 figure: {}",
        m.std_dev_t
    );
}

/// CPS and churn have no density on the final step into sigma = 0.
#[test]
fn zero_std_steps_are_errors() {
    let last = StepSigmas::new(0.1, 0.0).unwrap();
    for k in [Kernel::cps(0.7).unwrap(), Kernel::churn(0.1).unwrap()] {
        let err = k.transition_std(&last).unwrap_err();
        assert!(
            matches!(err, SdeError::DegenerateStd { std, .. } if std == 0.0),
            "{err}"
        );
    }
    // Flow-SDE and Dance keep a positive std on the last step
    assert!(
        Kernel::flow_sde(0.7)
            .unwrap()
            .transition_std(&last)
            .unwrap()
            > 0.0
    );
    assert!(Kernel::dance(0.3).unwrap().transition_std(&last).unwrap() > 0.0);
}

#[test]
fn shapes_and_batch_sizes_are_checked() {
    let k = Kernel::dance(0.3).unwrap();
    let (x, v, _) = xvn::<Flex>(2, [2, 2, 3]);
    let wrong = Tensor::<Flex, 3>::zeros([2, 3, 2], &Default::default());
    let err = k
        .replay(
            &at(0.5, 0.4),
            v.clone(),
            x.clone(),
            wrong,
            StorageDtype::Native,
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            SdeError::ShapeMismatch {
                what: "prev_sample",
                ..
            }
        ),
        "{err}"
    );
    let three = Sigmas::PerSample(vec![StepSigmas::new(0.5, 0.4).unwrap(); 3]);
    let err = k
        .sample(&three, v, x.clone(), x, StorageDtype::Native)
        .unwrap_err();
    assert_eq!(err, SdeError::BatchMismatch { given: 3, batch: 2 });
}

/// `transition_std` is the std the step samples with and scores against.
#[test]
fn transition_std_is_the_step_std() {
    let (x, v, n) = xvn::<F64>(3, [2, 3, 4]);
    for k in [
        Kernel::flow_sde(0.7).unwrap(),
        Kernel::dance(0.3).unwrap(),
        Kernel::cps(0.6).unwrap(),
        Kernel::churn(0.2).unwrap(),
    ] {
        let step = StepSigmas::new(0.7, 0.55).unwrap();
        let out = k
            .sample(
                &step.into(),
                v.clone(),
                x.clone(),
                n.clone(),
                StorageDtype::Native,
            )
            .unwrap();
        assert_eq!(out.std, vec![k.transition_std(&step).unwrap(); 2]);
        // the drawn residual is exactly std * noise
        let resid = values(out.prev_sample.clone().sub(out.mean.clone()));
        for (r, z) in resid.iter().zip(values(n.clone())) {
            assert!((r - out.std[0] * z).abs() < 1e-12);
        }
        // log_density is the sum of what log_prob averages
        for (lp, ld) in values(out.log_prob.clone())
            .iter()
            .zip(values(out.log_density.clone()))
        {
            assert!((lp * 12.0 - ld).abs() < 1e-9 * ld.abs().max(1.0));
        }
    }
}

/// Per-sample sigmas give each sample the step of its own pair.
#[test]
fn per_sample_sigmas_match_separate_steps() {
    let (x, v, n) = xvn::<F64>(4, [2, 2, 3]);
    let k = Kernel::flow_sde(0.7).unwrap();
    let (a, b) = (
        StepSigmas::new(0.8, 0.7).unwrap(),
        StepSigmas::new(0.3, 0.2).unwrap(),
    );
    let both = k
        .sample(
            &Sigmas::PerSample(vec![a, b]),
            v.clone(),
            x.clone(),
            n.clone(),
            StorageDtype::Native,
        )
        .unwrap();
    for (i, s) in [a, b].into_iter().enumerate() {
        let one = k
            .sample(
                &s.into(),
                v.clone().narrow(0, i, 1),
                x.clone().narrow(0, i, 1),
                n.clone().narrow(0, i, 1),
                StorageDtype::Native,
            )
            .unwrap();
        assert_eq!(values(one.mean), values(both.mean.clone().narrow(0, i, 1)));
        assert_eq!(values(one.log_prob)[0], values(both.log_prob.clone())[i]);
    }
}

/// bf16 / f16 inputs are computed in f32: outputs are f32 whatever comes in.
#[test]
fn half_precision_inputs_compute_in_f32() {
    let (x, v, n) = xvn::<Flex>(5, [1, 2, 4]);
    let k = Kernel::flow_sde(0.7).unwrap();
    for half in [FloatDType::BF16, FloatDType::F16] {
        let out = k
            .sample(
                &at(0.6, 0.5),
                v.clone().cast(half),
                x.clone().cast(half),
                n.clone().cast(half),
                StorageDtype::Bf16,
            )
            .unwrap();
        assert_eq!(out.mean.dtype(), DType::F32);
        assert_eq!(out.log_prob.dtype(), DType::F32);
        assert_eq!(out.prev_sample.dtype(), DType::F32);
    }
}

/// The storage round trip is skipped below the noise threshold, where rounding would swamp
/// the transition.
#[test]
fn tiny_noise_skips_the_storage_round_trip() {
    let (x, v, n) = xvn::<Flex>(6, [1, 2, 4]);
    let k = Kernel::dance(1e-8).unwrap();
    let out = k
        .sample(&at(0.6, 0.5), v, x, n, StorageDtype::Bf16)
        .unwrap();
    let rounded = values(StorageDtype::Bf16.round_trip(out.prev_sample.clone()));
    assert_ne!(
        values(out.prev_sample),
        rounded,
        "a bf16 round trip happened at eta = 1e-8"
    );
}

/// KL identities: the same-std form equals the general form at equal stds; the Flow-SDE KL in
/// velocity space is `|dt|/2 (g (1 - sigma)/(2 sigma) + 1/g)^2 ||dv||^2` (seed 004); and
/// flow_grpo's released term is that KL scaled by `|dt|` per element, averaged.
#[test]
fn kl_identities() {
    let dev = Default::default();
    let mut g = Normals::new(8);
    let (x, v1, dv): (Tensor<F64, 3>, Tensor<F64, 3>, Tensor<F64, 3>) = (
        g.tensor([1, 2, 5], &dev),
        g.tensor([1, 2, 5], &dev),
        g.tensor([1, 2, 5], &dev),
    );
    let v2 = v1.clone().add(dv.clone().mul_scalar(0.1));
    let k = Kernel::flow_sde(0.7).unwrap();
    let step = StepSigmas::new(0.6, 0.45).unwrap();
    let p = k
        .replay(&step.into(), v1, x.clone(), x.clone(), StorageDtype::Native)
        .unwrap();
    let q = k
        .replay(&step.into(), v2, x.clone(), x, StorageDtype::Native)
        .unwrap();
    let same = values(sum_over_non_batch(kl_same_std_elements(
        p.mean.clone(),
        q.mean.clone(),
        &p.std,
    )))[0];
    let general = values(sum_over_non_batch(kl_diag_elements(
        p.mean.clone(),
        &p.std,
        q.mean.clone(),
        &q.std,
    )))[0];
    assert!((same - general).abs() < 1e-12 * same.max(1.0));
    let (s, dt, gg) = (f64::from(0.6f32), step.dt(), p.std_dev_t[0]);
    let dv2: f64 = values(dv.mul_scalar(0.1).powi_scalar(2)).iter().sum();
    let velocity_form = dt.abs() / 2.0 * (gg * (1.0 - s) / (2.0 * s) + 1.0 / gg).powi(2) * dv2;
    assert!(
        (same - velocity_form).abs() < 1e-9 * same,
        "{same} vs {velocity_form}"
    );
    let reference = values(kl_flow_grpo_reference(
        p.mean.clone(),
        q.mean.clone(),
        &p.std_dev_t,
    ))[0];
    assert!(
        (reference - same / 10.0 * dt.abs()).abs() < 1e-12,
        "{reference} vs {}",
        same / 10.0 * dt.abs()
    );
    // unequal stds: positive, zero only at equality
    let kl = values(mean_over_non_batch(kl_diag_elements(
        p.mean.clone(),
        &[0.3],
        p.mean,
        &[0.5],
    )))[0];
    let want = (0.5f64 / 0.3).ln() + 0.09 / 0.5 - 0.5;
    assert!((kl - want).abs() < 1e-12);
}

/// The gradient of the replayed log-prob with respect to the model output is
/// `((x' - mu) / std^2) * c_model / N` (seed 003: `dmu/dv = [1 + g^2 (1 - sigma)/(2 sigma)] dt`),
/// and matches central finite differences.
#[test]
fn replay_gradient_matches_analytic_and_finite_differences() {
    type AD = Autodiff<F64>;
    let dev = Default::default();
    let mut g = Normals::new(9);
    let shape = [1, 2, 3];
    let x: Tensor<AD, 3> = g.tensor(shape, &dev);
    let v: Tensor<AD, 3> = g.tensor(shape, &dev);
    let stored: Tensor<AD, 3> = g.tensor(shape, &dev);
    for k in [
        Kernel::flow_sde(0.7).unwrap(),
        Kernel::dance(0.4).unwrap(),
        Kernel::Cps(Cps { noise_level: 0.5 }),
        Kernel::churn(0.3).unwrap(),
    ] {
        let step = StepSigmas::new(0.55, 0.4).unwrap();
        let vg = v.clone().require_grad();
        let out = k
            .replay(
                &step.into(),
                vg.clone(),
                x.clone(),
                stored.clone(),
                StorageDtype::Native,
            )
            .unwrap();
        let grads = out.log_prob.clone().sum().backward();
        let grad = values(vg.grad(&grads).unwrap());
        let m = k.moments(&step).unwrap();
        if let Kernel::FlowSde(_) = k {
            let (s, dt) = (f64::from(0.55f32), step.dt());
            let dmu_dv = (1.0 + m.std_dev_t.powi(2) * (1.0 - s) / (2.0 * s)) * dt;
            assert!((dmu_dv - m.c_model).abs() < 1e-12);
        }
        let resid: Vec<f64> = values(stored.clone().sub(out.mean.clone()));
        let n = 6.0;
        for (i, (gr, r)) in grad.iter().zip(&resid).enumerate() {
            let analytic = r / (m.std * m.std) * m.c_model / n;
            assert!(
                (gr - analytic).abs() < 1e-9 * analytic.abs().max(1e-6),
                "{}: element {i}: {gr} vs {analytic}",
                k.name()
            );
        }
        // central finite differences on element 0
        let h = 1e-6;
        let bump = |d: f64| {
            let mut vals = values(v.clone());
            vals[0] += d;
            let vb = Tensor::<F64, 3>::from_data(burn::tensor::TensorData::new(vals, shape), &dev);
            let xb = Tensor::<F64, 3>::from_data(x.clone().into_data(), &dev);
            let sb = Tensor::<F64, 3>::from_data(stored.clone().into_data(), &dev);
            values(
                k.replay(&step.into(), vb, xb, sb, StorageDtype::Native)
                    .unwrap()
                    .log_prob,
            )[0]
        };
        let fd = (bump(h) - bump(-h)) / (2.0 * h);
        assert!(
            (fd - grad[0]).abs() < 1e-6 * grad[0].abs().max(1.0),
            "{}: fd {fd} vs autodiff {}",
            k.name(),
            grad[0]
        );
    }
}
