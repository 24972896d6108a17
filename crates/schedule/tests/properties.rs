//! Property tests: schedules are strictly decreasing from their start to 0; the per-rollout
//! resample is a deterministic function of the rollout id; every plan honours its window;
//! validation catches step 0 through each route.

use std::sync::Arc;

use proptest::prelude::*;
use schedule::{
    BaseGrid, EvalFallback, ExplicitSteps, Flux2KleinMu, FractionWindow, LinearMu,
    PerRolloutResample, PlanProblem, PlanQuery, RandomSubset, Route, ScheduleError, SchedulePolicy,
    SdeStepPlan, SdeType, Shift, SlidingWindow, TimeShift, TrainedStepsConfig, WindowEnd,
    WindowStrategy, validate_plan,
};

fn policy(which: usize, shift: f64, mu_lo: f64) -> SchedulePolicy {
    match which {
        0 => SchedulePolicy::sd3_5(),
        1 => SchedulePolicy::qwen_image(),
        2 => SchedulePolicy::flux_1(),
        3 => SchedulePolicy::flux_2_klein(),
        4 => SchedulePolicy::dance_grpo(shift).unwrap(),
        5 => SchedulePolicy::new(BaseGrid::UniPcFlow, Shift::Static { shift }, None, 1000).unwrap(),
        9 => SchedulePolicy::new(
            BaseGrid::FlowMatchSchedulerDefault,
            Shift::Static { shift },
            None,
            1000,
        )
        .unwrap(),
        6 => SchedulePolicy::new(
            BaseGrid::FlowMatch,
            Shift::Static { shift },
            Some(0.05),
            1000,
        )
        .unwrap(),
        7 => SchedulePolicy::new(
            BaseGrid::Dance,
            Shift::Dynamic {
                compute_mu: Arc::new(Flux2KleinMu),
                kind: TimeShift::Exponential,
            },
            None,
            1000,
        )
        .unwrap(),
        _ => SchedulePolicy::new(
            BaseGrid::FlowMatch,
            Shift::Dynamic {
                compute_mu: Arc::new(LinearMu {
                    base_shift: mu_lo,
                    max_shift: mu_lo + 1.0,
                    base_seq_len: 256,
                    max_seq_len: 4096,
                    pixels_per_token: 16,
                }),
                kind: TimeShift::Linear,
            },
            None,
            1000,
        )
        .unwrap(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Every policy gives `steps + 1` strictly decreasing sigmas from its start to exactly 0,
    /// with timesteps `1000 * sigma` in f32.
    #[test]
    fn sigmas_decrease_strictly_from_the_start_to_zero(
        which in 0usize..10, shift in 0.5f64..8.0, mu_lo in 0.3f64..1.5,
        h in 16u32..2048, w in 16u32..2048, steps in 2usize..80,
    ) {
        let p = policy(which, shift, mu_lo);
        let s = p.sample_sigmas(h, w, steps).unwrap();
        let v = s.sigmas.as_slice();
        prop_assert_eq!(v.len(), steps + 1);
        prop_assert_eq!(v[steps].to_bits(), 0);
        prop_assert!(v.windows(2).all(|p| p[1] < p[0]));
        match p.grid() {
            // UniPC's documented start: current diffusers lowers shift(1) = 1 by 1e-6; 0.35
            // started at shift(1 - 1/T) < 1
            BaseGrid::UniPcFlow => {
                prop_assert_eq!(v[0], (1.0f64 - 1e-6) as f32);
                let legacy = p.clone().with_compat(schedule::Compat::Diffusers035Numpy1);
                let x = 1.0 - 1.0 / 1000.0;
                let start = (shift * x / (1.0 + (shift - 1.0) * x)) as f32;
                prop_assert_eq!(legacy.sample_sigmas(h, w, steps).unwrap().sigmas.as_slice()[0], start);
            }
            // grids from t = 1: sigma = 1 up to the f32 rounding of a static shift
            _ => prop_assert!(v[0] >= schedule::SIGMA_ONE && v[0] <= 1.0, "start {}", v[0]),
        }
        prop_assert_eq!(s.timesteps.len(), steps);
        for (t, sig) in s.timesteps.iter().zip(v) {
            prop_assert_eq!(*t, sig * 1000.0);
        }
        // the stretch pins the last non-zero sigma
        if let Some(term) = p.shift_terminal() {
            prop_assert!((f64::from(v[steps - 1]) - term).abs() < 1e-6);
        }
    }

    /// A dynamic schedule depends on the size only through mu: two sizes with the same packed
    /// token count give the same schedule.
    #[test]
    fn dynamic_schedules_depend_on_the_token_count(a in 1u32..64, b in 1u32..64, steps in 2usize..60) {
        let p = SchedulePolicy::qwen_image();
        let x = p.sample_sigmas(16 * a, 16 * b, steps).unwrap();
        let y = p.sample_sigmas(16 * b, 16 * a, steps).unwrap();
        prop_assert_eq!(x, y);
    }

    /// The per-rollout resample is a pure function of the rollout id, draws distinct pool
    /// members, and falls back to the explicit list without a rollout id.
    #[test]
    fn per_rollout_resample_is_deterministic_and_inside_the_pool(
        pool in proptest::collection::btree_set(1usize..40, 1..20), k_frac in 0.0f64..1.0, id in any::<u64>(),
    ) {
        let pool: Vec<usize> = pool.into_iter().collect();
        let k = 1 + ((pool.len() - 1) as f64 * k_frac) as usize;
        let fb = EvalFallback::Explicit(ExplicitSteps::new(40, [pool[0]]).unwrap());
        let plan = PerRolloutResample::new(40, pool.clone(), k, fb.clone()).unwrap();
        let a = plan.steps(PlanQuery::rollout(id)).unwrap();
        let again = PerRolloutResample::new(40, pool.clone(), k, fb).unwrap();
        prop_assert_eq!(&a, &again.steps(PlanQuery::rollout(id)).unwrap());
        prop_assert_eq!(a.len(), k);
        prop_assert!(a.iter().all(|s| pool.contains(&s)));
        let eval = plan.steps(PlanQuery::evaluation()).unwrap();
        prop_assert_eq!(eval.as_slice(), &[pool[0]]);
    }

    /// Fraction-window picks lie in the window, are `num_sde_steps` distinct steps, and start at
    /// the window's first step.
    #[test]
    fn fraction_window_picks_stay_in_the_window(
        n in 1usize..100, lo in 0.0f64..1.0, span in 0.01f64..1.0, k_frac in 0.0f64..1.0,
    ) {
        let hi = (lo + span).min(1.0);
        prop_assume!(hi > lo);
        let start = (lo * n as f64).floor() as usize;
        let end = ((hi * n as f64).floor() as usize).min(n);
        prop_assume!(end > start);
        let k = 1 + ((end - start - 1) as f64 * k_frac) as usize;
        let w = FractionWindow::new(n, [lo, hi], k).unwrap();
        prop_assert_eq!(w.window(), start..end);
        let s = w.steps(PlanQuery::rollout(0)).unwrap();
        prop_assert_eq!(s.len(), k);
        prop_assert_eq!(s.as_slice()[0], start);
        prop_assert!(s.iter().all(|x| (start..end).contains(&x)));
    }

    /// Sliding windows are always full, contiguous and inside their span, for every strategy and
    /// end policy; `reachable` covers every window actually visited.
    #[test]
    fn sliding_windows_are_full_and_inside_their_span(
        n in 4usize..40, lo in 0usize..10, len in 1usize..40, size in 1usize..8, stride in 1usize..6,
        strategy in 0usize..4, interval in 1u64..5, roll in any::<bool>(), ids in proptest::collection::vec(0u64..400, 1..20),
    ) {
        let span = lo.min(n - 1)..(lo + len).min(n);
        prop_assume!(size <= span.len());
        let strategy = match strategy {
            0 => WindowStrategy::Progressive { shift_interval: interval },
            1 => WindowStrategy::Random { shift_interval: interval, seed: 3 },
            2 => WindowStrategy::Decay { max_interval: interval + 3, min_interval: interval },
            _ => WindowStrategy::ExpDecay { shift_interval: interval + 2, k: 0.3, threshold: 2 },
        };
        let end = if roll { WindowEnd::RollBack } else { WindowEnd::Clip };
        let w = SlidingWindow::new(n, span.clone(), size, stride, strategy, end).unwrap();
        let reachable = &w.reachable()[0].steps;
        for id in ids {
            let s = w.steps(PlanQuery::rollout(id)).unwrap();
            prop_assert_eq!(s.len(), size);
            let first = s.as_slice()[0];
            let contiguous: Vec<usize> = (first..first + size).collect();
            prop_assert_eq!(s.as_slice(), contiguous.as_slice());
            prop_assert!(span.contains(&first) && first + size <= span.end);
            prop_assert!(s.iter().all(|k| reachable.contains(k)));
        }
    }

    /// A random subset keeps `floor(len * fraction)` distinct candidates.
    #[test]
    fn random_subsets_stay_in_their_candidates(
        n in 2usize..60, lo in 0usize..5, fraction in 0.1f64..1.0, id in any::<u64>(), sample in any::<u64>(),
    ) {
        let cands = lo.min(n - 1)..n;
        let keep = (cands.len() as f64 * fraction).floor() as usize;
        prop_assume!(keep >= 1);
        let p = RandomSubset::new(n, cands.clone(), fraction, 11).unwrap();
        let s = p.steps(PlanQuery::rollout(id).with_sample(sample)).unwrap();
        prop_assert_eq!(s.len(), keep);
        prop_assert!(s.iter().all(|k| cands.contains(&k)));
        prop_assert_eq!(s, p.steps(PlanQuery::rollout(id).with_sample(sample)).unwrap());
    }

    /// Under Flow-SDE, any configuration that can make step 0 trainable is rejected, naming each
    /// route that can, and the same configuration without step 0 is accepted.
    #[test]
    fn validation_catches_step_zero_through_each_route(
        explicit0 in any::<bool>(), pool0 in any::<bool>(), resample in any::<bool>(), use_window in any::<bool>(),
        lo_steps in 0usize..3,
    ) {
        let n = 12;
        let sigmas = SchedulePolicy::qwen_image().sample_sigmas(512, 512, n).unwrap().sigmas;
        let indices = if explicit0 { vec![0, 4] } else { vec![2, 4] };
        let pool = if pool0 { vec![0, 1, 2, 3] } else { vec![1, 2, 3, 5] };
        // lo_steps = 0 puts step 0 in the window
        let lo = lo_steps as f64 / n as f64 + if lo_steps > 0 { 1e-3 } else { 0.0 };
        let cfg = TrainedStepsConfig {
            num_inference_steps: n,
            sde_resample_per_rollout: resample,
            sde_pool: if use_window { None } else { Some(pool) },
            sde_indices: if use_window && !resample { None } else { Some(indices) },
            num_sde_steps: 2,
            sde_timestep_fraction: [lo, 0.75],
        };
        let mut expect = Vec::new();
        if cfg.sde_indices.is_some() && explicit0 { expect.push(Route::ExplicitList); }
        if resample && !use_window && pool0 { expect.push(Route::Pool); }
        let window_live = cfg.sde_indices.is_none() || (resample && cfg.sde_pool.is_none());
        if window_live && lo_steps == 0 { expect.push(Route::FractionWindow); }
        match cfg.build(SdeType::FlowSde, &sigmas) {
            Ok(_) => prop_assert!(expect.is_empty(), "accepted, but {:?} can train step 0", expect),
            Err(ScheduleError::InvalidPlan { problems }) => {
                let mut got: Vec<Route> = problems.iter().filter_map(|p| match p {
                    PlanProblem::SingularStep { route, steps } => { assert_eq!(steps, &[0]); Some(*route) }
                    _ => None,
                }).collect();
                got.sort_by_key(|r| format!("{r:?}"));
                expect.sort_by_key(|r| format!("{r:?}"));
                prop_assert_eq!(got, expect);
            }
            Err(other) => prop_assert!(false, "unexpected error {}", other),
        }
        // every accepted plan's reachable steps are free of step 0 (what validate_plan checks)
        if let Ok((plan, _)) = cfg.build(SdeType::FlowSde, &sigmas) {
            prop_assert!(validate_plan(&plan, SdeType::FlowSde, &sigmas).is_ok());
            prop_assert!(plan.reachable().iter().all(|r| !r.steps.contains(0)));
        }
    }
}
