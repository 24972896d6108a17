//! The family's objectives beside FlowGRPO's: hand-computed values, the errors that name a bad
//! parameter, and one direction test per method — a gradient step on a toy model (a velocity
//! or mean that is the parameter itself) with a positive advantage, a won pair or a better
//! endpoint moves its output toward the rewarded sample, and with a negative one away from it.

use burn::backend::{Autodiff, NdArray};
use burn::tensor::{Tensor, TensorData, backend::Backend};
use flow_grpo::{
    AwmWeighting, ClipRange, FlowGrpoError, awm_advantages, awm_log_likelihood, diffusion_dpo_loss,
    dpok_loss, dpok_loss_per_step, grpo_clip_loss, grpo_guard_loss, guard_log_ratio,
    mean_squared_error, nft_loss, nft_optimality, noised, normalised_difference, spo_loss,
    velocity_target,
};

type F64 = NdArray<f64>;
type AD = Autodiff<F64>;

fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f64> {
    t.into_data().convert::<f64>().to_vec::<f64>().unwrap()
}

fn t2<B: Backend>(v: &[f64], shape: [usize; 2]) -> Tensor<B, 2> {
    Tensor::from_data(TensorData::new(v.to_vec(), shape), &Default::default())
}

fn t1<B: Backend>(v: &[f64]) -> Tensor<B, 1> {
    Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), &Default::default())
}

fn scalar<B: Backend>(t: Tensor<B, 1>) -> f64 {
    values(t)[0]
}

/// One plain gradient step of `loss(theta)` from `theta` (a `[1, e]` parameter), size `lr`.
fn step(theta: &[f64], lr: f64, loss: impl Fn(Tensor<AD, 2>) -> Tensor<AD, 1>) -> Vec<f64> {
    let p = t2::<AD>(theta, [1, theta.len()]).require_grad();
    let grads = loss(p.clone()).backward();
    let g = values(p.grad(&grads).expect("the loss depends on the parameter"));
    theta.iter().zip(g).map(|(t, g)| t - lr * g).collect()
}

fn mse(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>() / a.len() as f64
}

const X0: [f64; 3] = [0.4, -0.2, 0.9];
const NOISE: [f64; 3] = [-1.1, 0.7, 0.3];
const THETA: [f64; 3] = [0.2, 0.1, -0.5];

fn target() -> Vec<f64> {
    NOISE.iter().zip(X0).map(|(n, x)| n - x).collect()
}

#[test]
fn the_forward_process_and_its_errors_by_hand() {
    let xt = noised(
        t2::<F64>(&[1.0, 2.0, 0.0, 4.0], [2, 2]),
        t2(&[3.0, 0.0, 2.0, 0.0], [2, 2]),
        t1(&[0.5, 0.25]),
    )
    .unwrap();
    assert_eq!(values(xt), vec![2.0, 1.0, 0.5, 3.0]);
    let v = velocity_target(t2::<F64>(&[1.0, 2.0], [1, 2]), t2(&[3.0, 0.0], [1, 2])).unwrap();
    assert_eq!(values(v), vec![2.0, -2.0]);
    assert!(matches!(
        mean_squared_error(t2::<F64>(&[1.0, 2.0], [1, 2]), t2(&[1.0, 2.0, 3.0], [1, 3])),
        Err(FlowGrpoError::ShapeMismatch { what: "target", .. })
    ));
    assert!(matches!(
        noised(t2::<F64>(&[], [0, 2]), t2(&[], [0, 2]), t1(&[])),
        Err(FlowGrpoError::Empty { .. })
    ));
}

#[test]
fn awm_surrogate_by_hand() {
    // two samples: mse 2 and 0.25, noise levels 0.5 and 0.8
    let v = t2::<F64>(&[1.0, 1.0, 0.5, 0.0], [2, 2]);
    let target = t2::<F64>(&[3.0, 1.0, 0.0, 0.5], [2, 2]);
    let sigma = t1::<F64>(&[0.5, 0.8]);
    let uniform = awm_log_likelihood(
        v.clone(),
        target.clone(),
        sigma.clone(),
        AwmWeighting::Uniform,
    );
    assert_eq!(values(uniform.unwrap()), vec![-2.0, -0.25]);
    let huber = awm_log_likelihood(v, target, sigma, AwmWeighting::RELEASED).unwrap();
    let want = [
        -(2f64.powf(0.25)) * 0.5 / 0.25,
        -(0.25f64.powf(0.25)) * 0.8 / 0.25,
    ];
    for (g, w) in values(huber).iter().zip(want) {
        assert!((g - w).abs() < 1e-12, "{g} vs {w}");
    }
    for power in [0.0, 1.5, f64::NAN] {
        let err = awm_log_likelihood(
            t2::<F64>(&[1.0], [1, 1]),
            t2(&[0.0], [1, 1]),
            t1(&[0.5]),
            AwmWeighting::GeneralisedHuber { power },
        )
        .unwrap_err();
        assert!(err.to_string().contains("AWM Huber power"), "{err}");
    }
    assert_eq!(
        awm_advantages(&[-7.0, 2.5, 5.0, 0.0], 5.0).unwrap(),
        vec![-1.0, 0.5, 1.0, 0.0]
    );
    assert!(awm_advantages(&[1.0], 0.0).is_err());
}

#[test]
fn awm_moves_toward_a_rewarded_sample_and_away_from_a_penalised_one() {
    let target = target();
    for weighting in [AwmWeighting::Uniform, AwmWeighting::RELEASED] {
        for (adv, closer) in [(1.0, true), (-1.0, false)] {
            let after = step(&THETA, 0.1, |p| {
                let lp = awm_log_likelihood(p, t2(&target, [1, 3]), t1(&[0.6]), weighting).unwrap();
                let anchor = lp.clone().detach();
                grpo_clip_loss(
                    lp.reshape([1, 1]),
                    anchor.reshape([1, 1]),
                    t1(&[adv]),
                    ClipRange::asymmetric(1.0, 1.0).unwrap(),
                )
                .unwrap()
                .loss
            });
            let (before, now) = (mse(&THETA, &target), mse(&after, &target));
            assert_eq!(
                now < before,
                closer,
                "{weighting:?}, advantage {adv}: error {before} -> {now}"
            );
        }
    }
}

#[test]
fn nft_loss_by_hand() {
    // x0 [1, 0], noise [0, 2], sigma 0.5: x_t [0.5, 1]; beta 0.5, v_theta [1, 1], v_old 0:
    // v+ = [0.5, 0.5], err+ = [-0.75, 0.75], e+ = 0.5625 / 0.75 = 0.75;
    // v- = [-0.5, -0.5], err- = [-0.25, 1.25], e- = (0.0625 + 1.5625) / 2 / 0.75 = 13 / 12
    let xt = noised(
        t2::<F64>(&[1.0, 0.0], [1, 2]),
        t2(&[0.0, 2.0], [1, 2]),
        t1(&[0.5]),
    )
    .unwrap();
    assert_eq!(values(xt.clone()), vec![0.5, 1.0]);
    let out = nft_loss(
        t2::<F64>(&[1.0, 1.0], [1, 2]),
        t2(&[0.0, 0.0], [1, 2]),
        xt,
        t2(&[1.0, 0.0], [1, 2]),
        t1(&[0.5]),
        t1(&[0.75]),
        0.5,
        2.0,
    )
    .unwrap();
    let want = 2.0 * (0.75 * 0.75 + 0.25 * 13.0 / 12.0);
    assert!((scalar(out.loss) - want).abs() < 1e-12);
    assert!((out.diagnostics.positive_error - 0.75).abs() < 1e-12);
    assert!((out.diagnostics.negative_error - 13.0 / 12.0).abs() < 1e-12);
    assert_eq!(out.diagnostics.mean_optimality, 0.75);

    assert_eq!(
        nft_optimality(&[-10.0, 0.0, 2.5, 5.0], 5.0).unwrap(),
        vec![0.0, 0.5, 0.75, 1.0]
    );
    let bad = |beta: f64, scale: f64| {
        nft_loss(
            t2::<F64>(&[1.0], [1, 1]),
            t2(&[0.0], [1, 1]),
            t2(&[0.0], [1, 1]),
            t2(&[0.0], [1, 1]),
            t1(&[0.5]),
            t1(&[0.5]),
            beta,
            scale,
        )
        .unwrap_err()
        .to_string()
    };
    assert!(bad(0.0, 1.0).contains("NFT beta"));
    assert!(bad(1.0, f64::INFINITY).contains("NFT loss scale"));
}

#[test]
fn nft_moves_toward_a_rewarded_sample_and_away_from_a_penalised_one() {
    let target = target();
    let sigma = 0.7;
    let xt: Vec<f64> = X0
        .iter()
        .zip(NOISE)
        .map(|(x, n)| (1.0 - sigma) * x + sigma * n)
        .collect();
    for beta in [1.0, 0.1] {
        for (r, closer) in [(1.0, true), (0.0, false)] {
            let after = step(&THETA, 0.02, |p| {
                let old = p.clone().detach(); // on-policy: the sampler is the policy
                nft_loss(
                    p,
                    old,
                    t2(&xt, [1, 3]),
                    t2(&X0, [1, 3]),
                    t1(&[sigma]),
                    t1(&[r]),
                    beta,
                    1.0 / beta,
                )
                .unwrap()
                .loss
            });
            let (before, now) = (mse(&THETA, &target), mse(&after, &target));
            assert_eq!(
                now < before,
                closer,
                "beta {beta}, r {r}: {before} -> {now}"
            );
        }
    }
}

#[test]
fn dpo_loss_by_hand() {
    // pair 0 won (inside +0.5), pair 1 lost (inside -1): loss = mean(log(1 + e^-inside))
    let out = diffusion_dpo_loss(
        t1::<F64>(&[0.09, 0.12]),
        t1(&[0.10, 0.10]),
        t1(&[0.10, 0.10]),
        t1(&[0.10, 0.10]),
        100.0,
    )
    .unwrap();
    let want = ((1.0 + (-0.5f64).exp()).ln() + (1.0 + 1f64.exp()).ln()) / 2.0;
    assert!((scalar(out.loss) - want).abs() < 1e-9);
    assert_eq!(out.diagnostics.implicit_accuracy, 0.5);
    assert!((out.diagnostics.model_margin - 0.005).abs() < 1e-12);
    assert_eq!(out.diagnostics.reference_margin, 0.0);
    let err = diffusion_dpo_loss(t1::<F64>(&[0.1]), t1(&[0.1]), t1(&[0.1]), t1(&[0.1]), -1.0);
    assert!(err.unwrap_err().to_string().contains("DPO beta"));
    let err = diffusion_dpo_loss(
        t1::<F64>(&[0.1]),
        t1(&[0.1, 0.2]),
        t1(&[0.1]),
        t1(&[0.1]),
        1.0,
    );
    assert!(matches!(err, Err(FlowGrpoError::ShapeMismatch { .. })));
}

#[test]
fn dpo_fits_the_winner_better_than_the_loser() {
    let winner = target();
    let loser: Vec<f64> = winner.iter().map(|v| -v).collect();
    for (w, l) in [(&winner, &loser), (&loser, &winner)] {
        let errors = |p: Tensor<AD, 2>| {
            (
                mean_squared_error(p.clone(), t2(w, [1, 3])).unwrap(),
                mean_squared_error(p, t2(l, [1, 3])).unwrap(),
            )
        };
        let after = step(&THETA, 0.1, |p| {
            let (ew, el) = errors(p.clone());
            let (rw, rl) = (ew.clone().detach(), el.clone().detach()); // the reference: the start
            diffusion_dpo_loss(ew, el, rw, rl, 1.0).unwrap().loss
        });
        let margin = |theta: &[f64]| mse(theta, w) - mse(theta, l);
        assert!(
            margin(&after) < margin(&THETA),
            "the winner's margin did not improve: {} -> {}",
            margin(&THETA),
            margin(&after)
        );
    }
}

#[test]
fn dpok_raises_the_log_prob_of_a_rewarded_action() {
    // a Gaussian policy of mean theta; the stored action; log-prob -mean((a - theta)^2) / 2
    let action = target();
    for (adv, closer) in [(1.0, true), (-1.0, false)] {
        let after = step(&THETA, 0.1, |p| {
            let lp = mean_squared_error(p, t2(&action, [1, 3]))
                .unwrap()
                .mul_scalar(-0.5);
            let anchor = lp.clone().detach();
            dpok_loss(
                lp.reshape([1, 1]),
                anchor.reshape([1, 1]),
                t1(&[adv]),
                ClipRange::symmetric(1e-4).unwrap(),
                1.0,
            )
            .unwrap()
            .loss
        });
        let (before, now) = (mse(&THETA, &action), mse(&after, &action));
        assert_eq!(now < before, closer, "advantage {adv}: {before} -> {now}");
    }
    // outside the band the clamp removes the gradient whatever the advantage
    let p = t2::<AD>(&[0.0], [1, 1]).require_grad();
    let lp = p.clone().add_scalar(1.0);
    let out = dpok_loss(
        lp,
        t2(&[0.0], [1, 1]),
        t1(&[1.0]),
        ClipRange::symmetric(0.1).unwrap(),
        1.0,
    )
    .unwrap();
    assert_eq!(out.diagnostics.clipped_gradient_fraction, 1.0);
    let g = values(p.grad(&out.loss.backward()).unwrap());
    assert_eq!(g, vec![0.0]);
    let err = dpok_loss(
        t2::<F64>(&[0.0], [1, 1]),
        t2(&[0.0], [1, 1]),
        t1(&[1.0]),
        ClipRange::symmetric(0.1).unwrap(),
        0.0,
    );
    assert!(err.unwrap_err().to_string().contains("DPOK reward weight"));
}

#[test]
fn dpok_per_step_advantages_by_hand() {
    let clip = ClipRange::symmetric(0.1).unwrap();
    // ratios e^[0.05, 0.5; -0.5, 0] -> clamped [e^0.05, 1.1; 0.9, 1]
    let lp = [0.05, 0.5, -0.5, 0.0];
    let adv = [2.0, -1.0, 0.5, 3.0];
    let out = dpok_loss_per_step(
        t2::<F64>(&lp, [2, 2]),
        t2(&[0.0; 4], [2, 2]),
        t2(&adv, [2, 2]),
        clip,
        10.0,
    )
    .unwrap();
    let expected = -10.0 * (2.0 * 0.05f64.exp() - 1.1 + 0.5 * 0.9 + 3.0) / 4.0;
    assert!((scalar(out.loss) - expected).abs() < 1e-12);
    assert_eq!(out.diagnostics.clip_fraction, 0.5);
    assert_eq!(out.diagnostics.clipped_gradient_fraction, 0.5);

    // one advantage per step, equal across a sample's steps, is dpok_loss's per sample
    let per_sample = dpok_loss(
        t2::<F64>(&lp, [2, 2]),
        t2(&[0.0; 4], [2, 2]),
        t1(&[2.0, -1.0]),
        clip,
        10.0,
    )
    .unwrap();
    let per_step = dpok_loss_per_step(
        t2::<F64>(&lp, [2, 2]),
        t2(&[0.0; 4], [2, 2]),
        t2(&[2.0, 2.0, -1.0, -1.0], [2, 2]),
        clip,
        10.0,
    )
    .unwrap();
    assert_eq!(scalar(per_sample.loss), scalar(per_step.loss));
    assert_eq!(per_sample.diagnostics, per_step.diagnostics);

    // a per-sample vector where per-step advantages belong is refused
    let err = dpok_loss_per_step(
        t2::<F64>(&lp, [2, 2]),
        t2(&[0.0; 4], [2, 2]),
        t2(&[2.0, -1.0], [2, 1]),
        clip,
        10.0,
    );
    assert!(matches!(err, Err(FlowGrpoError::ShapeMismatch { .. })));
}

#[test]
fn grpo_guard_by_hand() {
    // lp - lp_old = [-0.5, 0.2], s = [0.1, 0.4], mean drift^2 = [0.002, 0.0]:
    // g = [-0.05 + 0.01, 0.08 + 0] = [-0.04, 0.08]
    let g = guard_log_ratio(
        t2::<F64>(&[-1.5, -0.8], [1, 2]),
        t2(&[-1.0, -1.0], [1, 2]),
        t2(&[0.002, 0.0], [1, 2]),
        t2(&[0.1, 0.4], [1, 2]),
    )
    .unwrap();
    let g = values(g);
    assert!(
        (g[0] - -0.04).abs() < 1e-12 && (g[1] - 0.08).abs() < 1e-12,
        "{g:?}"
    );
    // into PPO's clip: ratio exp(g), A = 2, band 1 +- 0.05;
    // terms max(-A r, -A clip(r)): -2 e^-0.04 (inside) and -2 * 1.05 (clipped above)
    let out = grpo_guard_loss(
        t2::<F64>(&[-1.5, -0.8], [1, 2]),
        t2(&[-1.0, -1.0], [1, 2]),
        t2(&[0.002, 0.0], [1, 2]),
        t2(&[0.1, 0.4], [1, 2]),
        t1(&[2.0]),
        ClipRange::symmetric(0.05).unwrap(),
    )
    .unwrap();
    let want = (-2.0 * (-0.04f64).exp() + -2.0 * 1.05) / 2.0;
    assert!((scalar(out.loss) - want).abs() < 1e-12);
    assert_eq!(out.diagnostics.clip_fraction, 0.5);
}

#[test]
fn grpo_guard_moves_the_mean_toward_a_rewarded_action_and_away_from_a_penalised_one() {
    // a Gaussian policy of mean theta and std s; the stored action; pi_old = the policy now
    let action = target();
    let s = 0.5;
    for (adv, closer) in [(1.0, true), (-1.0, false)] {
        let after = step(&THETA, 0.1, |p| {
            let old = p.clone().detach();
            let log_density = |m: Tensor<AD, 2>| {
                mean_squared_error(m, t2(&action, [1, 3]))
                    .unwrap()
                    .div_scalar(-2.0 * s * s)
                    .reshape([1, 1])
            };
            let lp = log_density(p.clone());
            let lp_old = log_density(old.clone());
            let drift = mean_squared_error(p, old).unwrap().reshape([1, 1]);
            grpo_guard_loss(
                lp,
                lp_old,
                drift,
                t2(&[s], [1, 1]),
                t1(&[adv]),
                ClipRange::symmetric(1e-4).unwrap(),
            )
            .unwrap()
            .loss
        });
        let (before, now) = (mse(&THETA, &action), mse(&after, &action));
        assert_eq!(now < before, closer, "advantage {adv}: {before} -> {now}");
    }
}

#[test]
fn spo_by_hand() {
    // v 1, v_ref 0, target 2, dR 0.5, eps 0.25: rho = exp(4 - 1)
    let out = spo_loss(
        t2::<F64>(&[1.0], [1, 1]),
        t2(&[0.0], [1, 1]),
        t2(&[2.0], [1, 1]),
        t1(&[0.5]),
        0.25,
    )
    .unwrap();
    let rho = 3f64.exp();
    let want = -0.5 * rho + 0.5 / 0.5 * (rho - 1.0) * (rho - 1.0);
    assert!((scalar(out.loss) - want).abs() < 1e-9 * want.abs());
    assert!((out.diagnostics.ratio_mean - rho).abs() < 1e-9);
    let dx = normalised_difference(t2::<F64>(&[2.0, 0.0, 1.0, -1.0], [2, 2])).unwrap();
    let want = [
        2.0 / (2.0 + 1e-6),
        0.0,
        1.0 / (1.0 + 1e-6),
        -1.0 / (1.0 + 1e-6),
    ];
    for (g, w) in values(dx).iter().zip(want) {
        assert!((g - w).abs() < 1e-12);
    }
    let err = spo_loss(
        t2::<F64>(&[1.0], [1, 1]),
        t2(&[0.0], [1, 1]),
        t2(&[2.0], [1, 1]),
        t1(&[0.5]),
        0.0,
    );
    assert!(err.unwrap_err().to_string().contains("SPO epsilon"));
}

#[test]
fn paired_differences_bend_the_velocity_toward_the_better_endpoint() {
    // the rollout's velocity is theta; the better endpoint lies dx away: target v_ref - dx_bar
    let dx = [0.3, -0.2, 0.1];
    let dx_bar = values(normalised_difference(t2::<F64>(&dx, [1, 3])).unwrap());
    let target: Vec<f64> = THETA.iter().zip(&dx_bar).map(|(v, d)| v - d).collect();
    for (dr, closer) in [(0.5, true), (-0.5, false)] {
        let after = step(&THETA, 0.01, |p| {
            let reference = p.clone().detach();
            spo_loss(p, reference, t2(&target, [1, 3]), t1(&[dr]), 0.03)
                .unwrap()
                .loss
        });
        let (before, now) = (mse(&THETA, &target), mse(&after, &target));
        assert_eq!(now < before, closer, "dR {dr}: {before} -> {now}");
        // and the endpoint x0 = x_T - v moves along +dx when dR > 0
        let moved: f64 = THETA
            .iter()
            .zip(&after)
            .zip(&dx)
            .map(|((b, a), d)| (b - a) * d)
            .sum();
        assert_eq!(
            moved > 0.0,
            closer,
            "dR {dr}: endpoint moved {moved} along dx"
        );
    }
}
