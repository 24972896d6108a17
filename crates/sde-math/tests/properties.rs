//! Property tests of the kernels and solvers (proptest), on `Flex` (f32) with `NdArray<f64>` as
//! the f64 reference evaluation.

#[path = "support/analytic.rs"]
mod analytic;

use analytic::Normals;
use burn::backend::{Flex, NdArray};
use burn::tensor::{Tensor, backend::Backend};
use proptest::prelude::*;
use sde_math::analytic::GaussianFlow;
use sde_math::solvers::{OdeSolver, SolverState, UniPc};
use sde_math::{
    Churn, Cps, Dance, FlowSde, Kernel, SigmaOnePolicy, StepSigmas, StorageDtype, euler_step,
};

type F32 = Flex;
type F64 = NdArray<f64>;

const SHAPE: [usize; 3] = [2, 3, 5];

fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f64> {
    t.into_data().convert::<f64>().to_vec::<f64>().unwrap()
}

/// Max abs difference of two equally long slices; NaN when any difference is NaN (a NaN in
/// either input, or `inf - inf`), so that every `err <= tol` / `err < bound` after it fails.
/// (`f64::max` drops a NaN operand, so it must not be the fold.)
fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "max_abs_diff: lengths differ");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, |worst, e| {
            if worst.is_nan() || e.is_nan() {
                f64::NAN
            } else {
                worst.max(e)
            }
        })
}

/// The comparison helper itself: a NaN on either side, at any position, makes `err <= tol` fail.
#[test]
fn max_abs_diff_fails_on_nan_in_either_input() {
    let passes = |err: f64| err <= 1e-5;
    let clean = [0.5, -1.0, 2.0];
    assert!(passes(max_abs_diff(&clean, &clean)));
    for i in 0..clean.len() {
        let mut nan = clean;
        nan[i] = f64::NAN;
        for err in [max_abs_diff(&nan, &clean), max_abs_diff(&clean, &nan)] {
            assert!(err.is_nan(), "NaN at {i} read as error {err}");
            assert!(!passes(err));
        }
    }
    let inf = [f64::INFINITY; 3];
    assert!(!passes(max_abs_diff(&inf, &inf)), "inf - inf must not pass");
}

/// A kernel of each family with noise parameter `p` (already in its valid range).
fn kernel(family: usize, p: f32) -> Kernel {
    match family {
        0 => Kernel::FlowSde(FlowSde {
            noise_level: p,
            at_sigma_one: SigmaOnePolicy::Reject,
        }),
        1 => Kernel::Dance(Dance { eta: p }),
        2 => Kernel::Cps(Cps {
            noise_level: p.min(1.0),
        }),
        _ => Kernel::Churn(Churn { gamma: p }),
    }
}

/// Valid step sigmas: `sigma` in (0.02, 0.999], `sigma_next` in [0.001, sigma) (all four
/// kernels have a density there; the `sigma_next = 0` edge is a unit test).
fn step_strategy() -> impl Strategy<Value = StepSigmas> {
    (0.02f32..0.999, 0.0f32..0.98).prop_map(|(s, frac)| {
        let n = (s * frac).max(0.001).min(s * 0.99);
        StepSigmas::new(s, n).unwrap()
    })
}

fn inputs<B: Backend>(seed: u64, dev: &B::Device) -> (Tensor<B, 3>, Tensor<B, 3>, Tensor<B, 3>) {
    let mut g = Normals::new(seed);
    (
        g.tensor(SHAPE, dev),
        g.tensor(SHAPE, dev),
        g.tensor(SHAPE, dev),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// Sampling with a given noise and replaying the produced sample give bitwise-identical
    /// log-probs, log-densities and means, for every kernel and storage precision.
    #[test]
    fn sampling_and_replay_are_bitwise_equal(
        family in 0usize..4, p in 0.05f32..1.0, at in step_strategy(), seed in any::<u64>(), storage in 0usize..4,
    ) {
        let storage = [StorageDtype::Native, StorageDtype::F32, StorageDtype::Bf16, StorageDtype::F16][storage];
        let dev = Default::default();
        let (x, v, noise) = inputs::<F32>(seed, &dev);
        let k = kernel(family, p);
        let at = at.into();
        let rollout = k.sample(&at, v.clone(), x.clone(), noise, storage).unwrap();
        let replay = k.replay(&at, v, x, rollout.prev_sample.clone(), storage).unwrap();
        prop_assert_eq!(rollout.log_prob.into_data(), replay.log_prob.into_data());
        prop_assert_eq!(rollout.log_density.into_data(), replay.log_density.into_data());
        prop_assert_eq!(rollout.mean.into_data(), replay.mean.into_data());
        prop_assert_eq!(rollout.prev_sample.into_data(), replay.prev_sample.into_data());
    }

    /// As the noise parameter goes to 0 every stochastic step tends to the Euler step.
    #[test]
    fn vanishing_noise_tends_to_euler(family in 0usize..4, at in step_strategy(), seed in any::<u64>()) {
        let dev = Default::default();
        let (x, v, noise) = inputs::<F64>(seed, &dev);
        let at = at.into();
        let euler = values(euler_step(&at, v.clone(), x.clone()).unwrap());
        let mut last = f64::INFINITY;
        for p in [1e-1f32, 1e-2, 1e-3, 1e-4] {
            let out = kernel(family, p).sample(&at, v.clone(), x.clone(), noise.clone(), StorageDtype::Native).unwrap();
            let err = max_abs_diff(&values(out.prev_sample), &euler);
            prop_assert!(err <= last * 1.0001 + 1e-12, "error grew: {} -> {} at p = {}", last, err, p);
            last = err;
        }
        // the sample error is O(std) = O(p) (O(sqrt(p)) for churn), so at 1e-4 it is small
        prop_assert!(last < 0.05, "still {} away from Euler at p = 1e-4", last);
    }

    /// The log-prob of a transition is largest at its mean.
    #[test]
    fn log_prob_peaks_at_the_mean(
        family in 0usize..4, p in 0.05f32..1.0, at in step_strategy(), seed in any::<u64>(), scale in 0.01f64..3.0,
    ) {
        let dev = Default::default();
        let (x, v, noise) = inputs::<F64>(seed, &dev);
        let k = kernel(family, p);
        let at = at.into();
        let base = k.sample(&at, v.clone(), x.clone(), noise.clone(), StorageDtype::Native).unwrap();
        let std = base.std[0];
        let at_mean = k.replay(&at, v.clone(), x.clone(), base.mean.clone(), StorageDtype::Native).unwrap();
        let off = base.mean.clone().add(noise.mul_scalar(scale * std));
        let elsewhere = k.replay(&at, v, x, off, StorageDtype::Native).unwrap();
        for (m, o) in values(at_mean.log_prob).iter().zip(values(elsewhere.log_prob)) {
            prop_assert!(*m > o, "log_prob at the mean {} <= {} off the mean", m, o);
        }
    }

    /// f32 results agree with an f64 evaluation of the same inputs: means and samples within
    /// 1e-5 absolute (inputs are O(1)), log-probs within 1e-4 * (1 + |log_prob|).
    #[test]
    fn f32_agrees_with_f64(
        family in 0usize..4, p in 0.05f32..1.0, at in step_strategy(), seed in any::<u64>(),
    ) {
        let k = kernel(family, p);
        let at = at.into();
        let d32 = Default::default();
        let (x, v, n) = inputs::<F32>(seed, &d32);
        let a = k.sample(&at, v, x, n, StorageDtype::Native).unwrap();
        let d64 = Default::default();
        let (x, v, n) = inputs::<F64>(seed, &d64);
        let b = k.sample(&at, v, x, n, StorageDtype::Native).unwrap();
        prop_assert!(max_abs_diff(&values(a.mean), &values(b.mean)) <= 1e-5);
        prop_assert!(max_abs_diff(&values(a.prev_sample), &values(b.prev_sample)) <= 1e-5);
        for (l32, l64) in values(a.log_prob).iter().zip(values(b.log_prob)) {
            prop_assert!((l32 - l64).abs() <= 1e-4 * (1.0 + l64.abs()), "log_prob {} vs {}", l32, l64);
        }
    }
}

/// The empirical mean and variance of many sampled steps match the kernel's mean and std.
#[test]
fn empirical_moments_match_the_kernel() {
    let dev = Default::default();
    let n = 8192usize;
    let cases = [
        (kernel(0, 0.7), StepSigmas::new(0.6, 0.5).unwrap()),
        (kernel(1, 0.3), StepSigmas::new(0.9, 0.7).unwrap()),
        (kernel(2, 0.5), StepSigmas::new(0.4, 0.3).unwrap()),
        (kernel(3, 0.25), StepSigmas::new(0.7, 0.55).unwrap()),
    ];
    for (i, (k, at)) in cases.iter().enumerate() {
        let mut g = Normals::new(40 + i as u64);
        let x1: Tensor<F64, 3> = g.tensor([1, 1, 4], &dev);
        let v1: Tensor<F64, 3> = g.tensor([1, 1, 4], &dev);
        let x = x1.repeat_dim(0, n);
        let v = v1.repeat_dim(0, n);
        let noise = g.tensor([n, 1, 4], &dev);
        let out = k
            .sample(&(*at).into(), v, x, noise, StorageDtype::Native)
            .unwrap();
        let std = out.std[0];
        let mean = values(out.mean.narrow(0, 0, 1));
        let samples = values(out.prev_sample);
        for (e, kernel_mean) in mean.iter().enumerate() {
            let col: Vec<f64> = samples.iter().skip(e).step_by(4).copied().collect();
            let m = col.iter().sum::<f64>() / n as f64;
            let var = col.iter().map(|s| (s - m).powi(2)).sum::<f64>() / (n - 1) as f64;
            let se = std / (n as f64).sqrt();
            assert!(
                (m - kernel_mean).abs() < 5.0 * se,
                "{}: empirical mean {m} vs kernel mean {} (se {se})",
                k.name(),
                kernel_mean
            );
            let rel = (var.sqrt() / std - 1.0).abs();
            assert!(
                rel < 5.0 * (0.5 / n as f64).sqrt(),
                "{}: empirical std {} vs kernel std {std}",
                k.name(),
                var.sqrt()
            );
        }
    }
}

/// A FlowMatch grid `linspace(1, 1/N, N)` time-shifted by 3, with the trailing 0.
fn flow_grid(n: usize) -> Vec<f32> {
    let mut s: Vec<f32> = (0..n)
        .map(|i| {
            let t = 1.0 - i as f64 * (1.0 - 1.0 / n as f64) / (n as f64 - 1.0);
            (3.0 * t / (1.0 + 2.0 * t)) as f32
        })
        .collect();
    s.push(0.0);
    s
}

fn solve_to_end(solver: OdeSolver, sigmas: &[f32], seed: u64) -> f64 {
    let dev = Default::default();
    let mut g = Normals::new(seed);
    let data = GaussianFlow::<F64, 3> {
        mu: g.tensor(SHAPE, &dev).mul_scalar(0.5),
        s: g.tensor(SHAPE, &dev).abs().mul_scalar(0.5).add_scalar(0.2),
    };
    let eps: Tensor<F64, 3> = g.tensor(SHAPE, &dev);
    let mut x = data.solution(eps.clone(), sigmas[0]);
    let mut state = SolverState::new();
    for i in 0..sigmas.len() - 1 {
        let v = data.velocity(x.clone(), sigmas[i]);
        x = solver.step(&mut state, sigmas, i, v, x).unwrap();
    }
    max_abs_diff(&values(x), &values(data.solution(eps, 0.0)))
}

/// UniPC and DPM-Solver++ converge to the exact ODE endpoint as steps grow, and beat Euler at
/// every step count. (The final step into `sigma = 0` returns the posterior mean `E[x0 | x]`,
/// which is `O(sigma_last^2)` from the ODE endpoint, so the error does not follow one clean
/// power law on a FlowMatch grid; monotone convergence is what is asserted.)
#[test]
fn solvers_converge_to_the_exact_endpoint() {
    use sde_math::solvers::DpmSolverPP;
    let steps = [5, 10, 20, 40, 80, 160];
    let run = |solver| -> Vec<f64> {
        steps
            .iter()
            .map(|&n| solve_to_end(solver, &flow_grid(n), 7))
            .collect()
    };
    let euler = run(OdeSolver::Euler);
    println!("euler: endpoint error at {steps:?} steps = {euler:?}");
    for (name, solver) in [
        ("dpm++2m", OdeSolver::DpmSolverPP(DpmSolverPP::two_m())),
        ("unipc-bh2", OdeSolver::UniPc(UniPc::bh2())),
    ] {
        let errs = run(solver);
        println!("{name}: endpoint error at {steps:?} steps = {errs:?}");
        for w in errs.windows(2) {
            assert!(
                w[1] < w[0],
                "{name}: error did not shrink with more steps: {errs:?}"
            );
        }
        for (e, eu) in errs.iter().zip(&euler) {
            assert!(
                e < eu,
                "{name} is not more accurate than Euler: {errs:?} vs {euler:?}"
            );
        }
        assert!(
            errs[5] < 5e-3 && errs[5] < euler[5] / 5.0,
            "{name}: endpoint error {} at 160 steps",
            errs[5]
        );
    }
}

/// A multistep solver's history is used only across consecutive indices: after a jump (an SDE
/// step in between) it restarts at first order, exactly like a fresh state.
#[test]
fn solver_history_resets_after_a_jump() {
    use sde_math::solvers::DpmSolverPP;
    let dev = Default::default();
    let sigmas = flow_grid(8);
    let mut g = Normals::new(3);
    let x: Tensor<F64, 3> = g.tensor(SHAPE, &dev);
    let v: Tensor<F64, 3> = g.tensor(SHAPE, &dev);
    for solver in [
        OdeSolver::UniPc(UniPc::bh2()),
        OdeSolver::DpmSolverPP(DpmSolverPP::two_m()),
    ] {
        let mut state = SolverState::new();
        for i in 0..3 {
            solver
                .step(&mut state, &sigmas, i, v.clone(), x.clone())
                .unwrap();
        }
        assert_eq!(state.history_len(), 2);
        // index 4 after index 2: step 3 was stochastic
        let after_jump = solver
            .step(&mut state, &sigmas, 4, v.clone(), x.clone())
            .unwrap();
        assert_eq!(state.history_len(), 1);
        let fresh = solver
            .step(&mut SolverState::new(), &sigmas, 4, v.clone(), x.clone())
            .unwrap();
        assert_eq!(after_jump.into_data(), fresh.into_data());
        // consecutive: the second step now uses history, so it differs from a fresh start
        let second = solver
            .step(&mut state, &sigmas, 5, v.clone(), x.clone())
            .unwrap();
        let fresh5 = solver
            .step(&mut SolverState::new(), &sigmas, 5, v.clone(), x.clone())
            .unwrap();
        assert_ne!(second.into_data(), fresh5.into_data());
    }
}
