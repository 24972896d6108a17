//! SDE-step plans: seed 002's resolution order and validation, the per-rollout resample's
//! spread over its pool, and MixGRPO's window strategies.

use schedule::{
    EvalFallback, ExplicitSteps, FractionWindow, PerRolloutResample, PlanProblem, PlanQuery,
    PlanWarning, RandomSubset, Route, ScheduleError, SchedulePolicy, SdeStepPlan, SdeSteps,
    SdeType, Sigmas, SlidingWindow, TrainedStepsConfig, WindowEnd, WindowStrategy, validate_plan,
};

fn qwen12() -> Sigmas {
    SchedulePolicy::qwen_image()
        .sample_sigmas(384, 384, 12)
        .unwrap()
        .sigmas
}

fn config(json: &str) -> TrainedStepsConfig {
    serde_json::from_str(json).unwrap()
}

fn problems(err: ScheduleError) -> Vec<PlanProblem> {
    match err {
        ScheduleError::InvalidPlan { problems } => problems,
        other => panic!("expected InvalidPlan, got {other}"),
    }
}

/// The routes on which step 0 was reported as singular.
fn singular_routes(p: &[PlanProblem]) -> Vec<Route> {
    p.iter()
        .filter_map(|p| match p {
            PlanProblem::SingularStep { route, steps } if steps == &[0] => Some(*route),
            _ => None,
        })
        .collect()
}

/// Pearson's chi-square statistic of observed counts against equal expected counts.
fn chi_square(counts: &[u64]) -> f64 {
    let total: u64 = counts.iter().sum();
    let expected = total as f64 / counts.len() as f64;
    counts
        .iter()
        .map(|&c| (c as f64 - expected).powi(2) / expected)
        .sum()
}

/// Draws `ids` rollouts of a 3-of-5 resample and returns the chi-square statistics of the
/// element frequencies (df = 4) and of the 10 possible subsets (df = 9).
fn resample_spread(draw: impl Fn(u64) -> SdeSteps, ids: u64) -> (f64, f64) {
    let pool = [1usize, 2, 3, 4, 5];
    let mut elements = [0u64; 5];
    let mut subsets = std::collections::BTreeMap::<Vec<usize>, u64>::new();
    for id in 0..ids {
        let s = draw(id);
        assert_eq!(s.len(), 3);
        for k in s.iter() {
            elements[pool
                .iter()
                .position(|&p| p == k)
                .expect("drawn from the pool")] += 1;
        }
        *subsets.entry(s.as_slice().to_vec()).or_default() += 1;
    }
    let mut subset_counts: Vec<u64> = subsets.values().copied().collect();
    subset_counts.resize(10, 0);
    (chi_square(&elements), chi_square(&subset_counts))
}

// Critical values at p = 0.001.
const CHI2_DF4: f64 = 18.467;
const CHI2_DF9: f64 = 27.877;

fn shipped_resample() -> PerRolloutResample {
    let fallback = EvalFallback::Explicit(ExplicitSteps::new(12, [3, 4, 5]).unwrap());
    PerRolloutResample::new(12, [1, 2, 3, 4, 5], 3, fallback).unwrap()
}

#[test]
fn per_rollout_resample_spreads_uniformly_over_the_pool() {
    let plan = shipped_resample();
    let (elements, subsets) =
        resample_spread(|id| plan.steps(PlanQuery::rollout(id)).unwrap(), 20_000);
    assert!(elements < CHI2_DF4, "element frequencies chi2 = {elements}");
    assert!(subsets < CHI2_DF9, "subset frequencies chi2 = {subsets}");
}

#[test]
fn the_spread_check_catches_a_generator_reseeded_to_one_value() {
    // The public reference bug: a "random" draw re-seeded with the same constant every call
    // never moves. The same check must reject it (and a draw that ignores the rollout id).
    let plan = shipped_resample();
    let frozen = |_id: u64| plan.steps(PlanQuery::rollout(1234)).unwrap();
    let (elements, subsets) = resample_spread(frozen, 20_000);
    assert!(elements > CHI2_DF4 && subsets > CHI2_DF9);
}

#[test]
fn per_rollout_resample_changes_between_consecutive_rollouts() {
    let plan = shipped_resample();
    let draws: Vec<SdeSteps> = (0..200)
        .map(|id| plan.steps(PlanQuery::rollout(id)).unwrap())
        .collect();
    let changes = draws.windows(2).filter(|w| w[0] != w[1]).count();
    // 10 equally likely subsets: about 90% of consecutive pairs differ
    assert!(
        changes > 150,
        "only {changes} of 199 consecutive draws changed"
    );
    // and it is identical on every "rank": a fresh plan object draws the same steps
    let again = shipped_resample();
    for (id, d) in draws.iter().enumerate() {
        assert_eq!(&again.steps(PlanQuery::rollout(id as u64)).unwrap(), d);
    }
}

#[test]
fn shipped_qwen_recipe_resolves_in_seed_002_order() {
    // scripts' sampling config: 12 steps, 3 trained, redrawn per rollout from [1..5]
    let cfg = config(
        r#"{"height":384,"width":384,"num_inference_steps":12,"guidance_scale":1.0,"eta":0.7,"sde_type":"sde",
            "sde_indices":[3,4,5],"sde_resample_per_rollout":true,"num_sde_steps":3,"sde_pool":[1,2,3,4,5],
            "driver_xt":true,"sample_id_mode":"metadata"}"#,
    );
    let (plan, report) = cfg.build(SdeType::FlowSde, &qwen12()).unwrap();
    assert!(report.warnings.is_empty());
    // 1. resample with a rollout id
    let drawn = plan.steps(PlanQuery::rollout(5)).unwrap();
    assert!(drawn.iter().all(|k| (1..=5).contains(&k)));
    // 2. the explicit list in evaluation
    assert_eq!(
        plan.steps(PlanQuery::evaluation()).unwrap().as_slice(),
        &[3, 4, 5]
    );

    // without the resample flag the explicit list wins, for training too
    let explicit = config(
        r#"{"num_inference_steps":12,"sde_indices":[5,3,3],"num_sde_steps":3,"sde_pool":[1,2]}"#,
    );
    let (plan, _) = explicit.build(SdeType::FlowSde, &qwen12()).unwrap();
    assert_eq!(
        plan.steps(PlanQuery::rollout(5)).unwrap().as_slice(),
        &[3, 5]
    );

    // 3. otherwise the fraction window's stride-spaced picks
    let window = config(
        r#"{"num_inference_steps":12,"num_sde_steps":3,"sde_timestep_fraction":[0.25,0.75]}"#,
    );
    let (plan, _) = window.build(SdeType::FlowSde, &qwen12()).unwrap();
    assert_eq!(
        plan.steps(PlanQuery::rollout(5)).unwrap().as_slice(),
        &[3, 5, 7]
    );

    // a resample without a pool draws from the whole fraction window; evaluation falls back to its picks
    let from_window = config(
        r#"{"num_inference_steps":12,"sde_resample_per_rollout":true,"num_sde_steps":2,"sde_timestep_fraction":[0.25,0.5]}"#,
    );
    let (plan, _) = from_window.build(SdeType::FlowSde, &qwen12()).unwrap();
    for id in 0..50 {
        assert!(
            plan.steps(PlanQuery::rollout(id))
                .unwrap()
                .iter()
                .all(|k| (3..6).contains(&k))
        );
    }
    assert_eq!(
        plan.steps(PlanQuery::evaluation()).unwrap().as_slice(),
        &[3, 4]
    );
}

#[test]
fn no_sde_configuration_is_an_error_not_an_empty_plan() {
    let err = config(r#"{"num_inference_steps":12}"#)
        .build(SdeType::FlowSde, &qwen12())
        .unwrap_err();
    let p = problems(err);
    assert!(
        p.iter().any(|p| matches!(
            p,
            PlanProblem::Parameter {
                name: "num_sde_steps",
                ..
            }
        )),
        "{p:?}"
    );
}

#[test]
fn step_zero_is_rejected_through_each_route() {
    let sigmas = qwen12();
    // the explicit list
    let p = problems(
        config(r#"{"num_inference_steps":12,"sde_indices":[0,3]}"#)
            .build(SdeType::FlowSde, &sigmas)
            .unwrap_err(),
    );
    assert_eq!(singular_routes(&p), [Route::ExplicitList]);
    // the pool of a per-rollout resample (even when the explicit fallback is fine)
    let p = problems(
        config(r#"{"num_inference_steps":12,"sde_resample_per_rollout":true,"num_sde_steps":3,"sde_pool":[0,1,2,3],"sde_indices":[3,4,5]}"#)
            .build(SdeType::FlowSde, &sigmas)
            .unwrap_err(),
    );
    assert_eq!(singular_routes(&p), [Route::Pool]);
    // the derived fraction window: [0.0, 0.5] over 12 steps picks [0, 2, 4]
    let p = problems(
        config(r#"{"num_inference_steps":12,"num_sde_steps":3,"sde_timestep_fraction":[0.0,0.5]}"#)
            .build(SdeType::FlowSde, &sigmas)
            .unwrap_err(),
    );
    assert_eq!(singular_routes(&p), [Route::FractionWindow]);
    // the fraction window standing in for a missing pool
    let p = problems(
        config(r#"{"num_inference_steps":12,"sde_resample_per_rollout":true,"num_sde_steps":3,"sde_indices":[3,4,5]}"#)
            .build(SdeType::FlowSde, &sigmas)
            .unwrap_err(),
    );
    assert_eq!(singular_routes(&p), [Route::FractionWindow]);
    // all routes at once, each with the offending value
    let p = problems(
        config(r#"{"num_inference_steps":12,"sde_resample_per_rollout":true,"num_sde_steps":2,"sde_pool":[0,4],"sde_indices":[0,1]}"#)
            .build(SdeType::FlowSde, &sigmas)
            .unwrap_err(),
    );
    assert_eq!(singular_routes(&p), [Route::ExplicitList, Route::Pool]);
    let msg = ScheduleError::InvalidPlan { problems: p }.to_string();
    assert!(
        msg.contains("2 problem(s)") && msg.contains("sde_indices") && msg.contains("sde_pool"),
        "{msg}"
    );

    // Dance's constant-eta SDE has no singularity: the same configs are fine
    config(r#"{"num_inference_steps":12,"num_sde_steps":3,"sde_timestep_fraction":[0.0,0.5]}"#)
        .build(SdeType::Dance, &sigmas)
        .unwrap();
    // a window starting above 1/N avoids step 0
    config(r#"{"num_inference_steps":12,"num_sde_steps":3,"sde_timestep_fraction":[0.09,0.5]}"#)
        .build(SdeType::FlowSde, &sigmas)
        .unwrap();
}

#[test]
fn validate_plan_checks_the_other_plans_too() {
    let sigmas = qwen12();
    let window = SlidingWindow::new(
        12,
        0..8,
        4,
        4,
        WindowStrategy::Progressive { shift_interval: 5 },
        WindowEnd::RollBack,
    )
    .unwrap();
    let p = problems(validate_plan(&window, SdeType::FlowSde, &sigmas).unwrap_err());
    assert_eq!(singular_routes(&p), [Route::SlidingWindow]);
    let subset = RandomSubset::new(12, 0..12, 0.6, 1).unwrap();
    let p = problems(validate_plan(&subset, SdeType::FlowSde, &sigmas).unwrap_err());
    assert_eq!(singular_routes(&p), [Route::RandomSubset]);
    // UniPC's flow grid starts below sigma = 1: step 0 is not singular there
    let unipc = SchedulePolicy::new(
        schedule::BaseGrid::UniPcFlow,
        schedule::Shift::Static { shift: 3.0 },
        None,
        1000,
    )
    .unwrap()
    .sample_sigmas(512, 512, 12)
    .unwrap()
    .sigmas;
    validate_plan(
        &ExplicitSteps::new(12, [0, 1]).unwrap(),
        SdeType::FlowSde,
        &unipc,
    )
    .unwrap();
    // a plan for another step count
    let err = validate_plan(
        &ExplicitSteps::new(10, [1]).unwrap(),
        SdeType::FlowSde,
        &sigmas,
    )
    .unwrap_err();
    assert!(matches!(
        err,
        ScheduleError::StepCountMismatch {
            plan_steps: 10,
            schedule_steps: 12
        }
    ));
}

#[test]
fn a_trained_last_step_is_flagged_and_refused_under_cps() {
    let sigmas = qwen12();
    let plan = ExplicitSteps::new(12, [5, 11]).unwrap();
    let report = validate_plan(&plan, SdeType::FlowSde, &sigmas).unwrap();
    assert_eq!(
        report.warnings,
        [PlanWarning::TrainedLastStep {
            route: Route::ExplicitList,
            step: 11
        }]
    );
    assert!(report.warnings[0].to_string().contains("sigma_next = 0"));
    let p = problems(validate_plan(&plan, SdeType::Cps, &sigmas).unwrap_err());
    assert_eq!(
        p,
        [PlanProblem::DegenerateLastStep {
            route: Route::ExplicitList,
            step: 11
        }]
    );
    // through the config, too
    let (_, report) = config(r#"{"num_inference_steps":12,"sde_indices":[3,11]}"#)
        .build(SdeType::Dance, &sigmas)
        .unwrap();
    assert_eq!(report.warnings.len(), 1);
}

#[test]
fn invalid_plan_parameters_are_listed_together() {
    let p = problems(FractionWindow::new(12, [0.7, 0.2], 0).unwrap_err());
    assert_eq!(p.len(), 2, "{p:?}"); // hi <= lo, and num_sde_steps = 0
    let p = problems(ExplicitSteps::new(12, [3, 12, 40]).unwrap_err());
    assert_eq!(
        p,
        [PlanProblem::OutOfRange {
            route: Route::ExplicitList,
            steps: vec![12, 40],
            num_steps: 12
        }]
    );
    let fb = EvalFallback::Explicit(ExplicitSteps::new(12, [3]).unwrap());
    let p = problems(PerRolloutResample::new(12, [1, 2, 30], 4, fb).unwrap_err());
    assert_eq!(p.len(), 2, "{p:?}"); // 30 out of range, 4 > pool of 3
    let p = problems(
        SlidingWindow::new(
            12,
            2..20,
            0,
            0,
            WindowStrategy::Decay {
                max_interval: 1,
                min_interval: 3,
            },
            WindowEnd::Clip,
        )
        .unwrap_err(),
    );
    assert_eq!(p.len(), 4, "{p:?}"); // span, window size, stride, min > max
    assert!(RandomSubset::new(12, 1..12, 0.05, 0).is_err()); // keeps no step
    // through the config: a bad explicit fallback does not hide the pool's problems
    let p = problems(
        config(r#"{"num_inference_steps":12,"sde_resample_per_rollout":true,"num_sde_steps":3,"sde_pool":[2,40],"sde_indices":[50]}"#)
            .build(SdeType::FlowSde, &qwen12())
            .unwrap_err(),
    );
    assert!(
        p.contains(&PlanProblem::OutOfRange {
            route: Route::ExplicitList,
            steps: vec![50],
            num_steps: 12
        }),
        "{p:?}"
    );
    assert!(
        p.contains(&PlanProblem::OutOfRange {
            route: Route::Pool,
            steps: vec![40],
            num_steps: 12
        }),
        "{p:?}"
    );
    assert!(
        p.contains(&PlanProblem::TooFew {
            route: Route::Pool,
            wanted: 3,
            available: 2
        }),
        "{p:?}"
    );
}

#[test]
fn sliding_window_strategies_follow_mixgrpo() {
    let n = 25;
    let prog = |end| {
        SlidingWindow::new(
            n,
            1..24,
            4,
            4,
            WindowStrategy::Progressive { shift_interval: 2 },
            end,
        )
        .unwrap()
    };
    let starts =
        |w: &SlidingWindow, r: std::ops::Range<u64>| r.map(|i| w.start_at(i)).collect::<Vec<_>>();
    // starts 1, 5, 9, 13, 17 (last full window: 24 - 4 = 20), two rollouts each
    assert_eq!(
        starts(&prog(WindowEnd::Clip), 0..12),
        [1, 1, 5, 5, 9, 9, 13, 13, 17, 17, 20, 20]
    );
    assert_eq!(prog(WindowEnd::Clip).start_at(10_000), 20); // clipped, stays
    // roll back instead: after 17 the next start (21) overshoots, so back to 1
    assert_eq!(starts(&prog(WindowEnd::RollBack), 8..12), [17, 17, 1, 1]);
    // windows are always full and inside the span
    for id in 0..100 {
        let s = prog(WindowEnd::RollBack)
            .steps(PlanQuery::rollout(id))
            .unwrap();
        assert_eq!(s.len(), 4);
        assert!(s.iter().all(|k| (1..24).contains(&k)));
    }

    // decay: the interval shrinks linearly from max (first window) to min (last window)
    let decay = SlidingWindow::new(
        n,
        1..24,
        4,
        4,
        WindowStrategy::Decay {
            max_interval: 10,
            min_interval: 1,
        },
        WindowEnd::Clip,
    )
    .unwrap();
    let run_lengths = |w: &SlidingWindow| {
        let mut out: Vec<(usize, u64)> = Vec::new();
        for id in 0..200 {
            let s = w.start_at(id);
            match out.last_mut() {
                Some((last, count)) if *last == s => *count += 1,
                _ => out.push((s, 1)),
            }
        }
        out
    };
    // p = (start - 1) / 19: 10, floor(10 - 9 * 4/19) = 8, 6, 4, 2, then clip at 20 forever
    assert_eq!(
        &run_lengths(&decay)[..5],
        &[(1, 10), (5, 8), (9, 6), (13, 4), (17, 2)]
    );

    // exp_decay: flat until a window start passes 13, then ceil(I * exp(-0.1 * (start - 13)))
    let exp = SlidingWindow::new(
        n,
        1..24,
        4,
        4,
        WindowStrategy::mixgrpo_exp_decay(25),
        WindowEnd::Clip,
    )
    .unwrap();
    assert_eq!(
        &run_lengths(&exp)[..5],
        &[(1, 25), (5, 25), (9, 25), (13, 25), (17, 17)]
    );
    // a span too short to pass the default threshold never decays
    let short = SlidingWindow::new(
        12,
        1..11,
        2,
        2,
        WindowStrategy::mixgrpo_exp_decay(7),
        WindowEnd::Clip,
    )
    .unwrap();
    assert!(run_lengths(&short)[..4].iter().all(|&(_, c)| c == 7));
}

#[test]
fn random_window_moves_and_covers_every_full_start() {
    let w = SlidingWindow::new(
        25,
        1..24,
        4,
        1,
        WindowStrategy::Random {
            shift_interval: 1,
            seed: 99,
        },
        WindowEnd::Clip,
    )
    .unwrap();
    let mut counts = [0u64; 20]; // starts 1..=20
    for id in 0..20_000 {
        counts[w.start_at(id) - 1] += 1;
    }
    // df = 19, p = 0.001 critical value 43.82
    assert!(
        chi_square(&counts) < 43.82,
        "chi2 = {}",
        chi_square(&counts)
    );
    // it moves between intervals, and holds within one
    let held = SlidingWindow::new(
        25,
        1..24,
        4,
        1,
        WindowStrategy::Random {
            shift_interval: 5,
            seed: 99,
        },
        WindowEnd::Clip,
    )
    .unwrap();
    let starts: Vec<usize> = (0..500).map(|i| held.start_at(i)).collect();
    assert!(starts.chunks(5).all(|c| c.iter().all(|&s| s == c[0])));
    let moves = starts
        .chunks(5)
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|p| p[0][0] != p[1][0])
        .count();
    assert!(moves > 80, "{moves} of 99 intervals moved");
}

#[test]
fn random_subset_is_per_sample_and_needs_a_rollout() {
    let p = RandomSubset::new(16, 1..16, 0.6, 5).unwrap();
    assert_eq!(p.keep(), 9);
    let a = p.steps(PlanQuery::rollout(2).with_sample(0)).unwrap();
    let differ = (1..20)
        .filter(|s| p.steps(PlanQuery::rollout(2).with_sample(*s)).unwrap() != a)
        .count();
    assert!(
        differ >= 18,
        "samples of one rollout should draw their own subsets"
    );
    assert!(matches!(
        p.steps(PlanQuery::evaluation()),
        Err(ScheduleError::RolloutIdRequired { .. })
    ));
}
