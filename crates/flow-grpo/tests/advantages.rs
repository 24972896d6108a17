//! Advantages against hand-computed cases: every std mode, the component combination, the
//! filters, the tracker and every failure path.

use std::collections::BTreeMap;

use flow_grpo::{
    AdvantageConfig, ConfigProblem, FlowGrpoError, GroupOutcome, PromptStatTracker,
    RewardComponent, RewardGroup, StdEstimator, StdMode, compute_advantages,
};

fn cfg(std_mode: StdMode, estimator: StdEstimator, eps: f64) -> AdvantageConfig {
    AdvantageConfig {
        std_mode,
        std_estimator: estimator,
        std_epsilon: eps,
        components: vec![RewardComponent::required("r", 1.0)],
        clip: None,
        filter_zero_std_groups: true,
        degenerate_variance: 1e-6,
    }
}

fn group(key: &str, rewards: &[f64]) -> RewardGroup {
    RewardGroup {
        prompt_key: key.into(),
        samples: rewards
            .iter()
            .map(|&r| BTreeMap::from([("r".to_string(), r)]))
            .collect(),
    }
}

fn multi(key: &str, rows: &[&[(&str, f64)]]) -> RewardGroup {
    RewardGroup {
        prompt_key: key.into(),
        samples: rows
            .iter()
            .map(|row| row.iter().map(|(k, v)| (k.to_string(), *v)).collect())
            .collect(),
    }
}

fn close(a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < 1e-12, "{a:?} vs {b:?}");
    }
}

#[test]
fn group_std_population_with_epsilon() {
    // mean 2.5, population std sqrt(1.25), plus 1e-4
    let adv = compute_advantages(
        &cfg(StdMode::Group, StdEstimator::Population, 1e-4),
        &[group("p", &[1.0, 2.0, 3.0, 4.0])],
        None,
    )
    .unwrap();
    let d = 1.25f64.sqrt() + 1e-4;
    close(&adv.values, &[-1.5 / d, -0.5 / d, 0.5 / d, 1.5 / d]);
    assert_eq!(adv.keep, vec![true; 4]);
    assert_eq!(adv.groups[0].outcome, GroupOutcome::Trained);
    assert!(adv.mean.abs() < 1e-15);
    assert!(!adv.degenerate);
}

#[test]
fn group_std_sample_estimator() {
    // sample std: sqrt(5/3)
    let adv = compute_advantages(
        &cfg(StdMode::Group, StdEstimator::Sample, 1e-8),
        &[group("p", &[1.0, 2.0, 3.0, 4.0])],
        None,
    )
    .unwrap();
    let d = (5.0f64 / 3.0).sqrt() + 1e-8;
    close(&adv.values, &[-1.5 / d, -0.5 / d, 0.5 / d, 1.5 / d]);
}

#[test]
fn batch_std_divides_by_the_batch_raw_reward_std() {
    // raw rewards [1, 3, 10, 14]: mean 7, population variance 110 / 4
    let adv = compute_advantages(
        &cfg(StdMode::Batch, StdEstimator::Population, 0.0),
        &[group("a", &[1.0, 3.0]), group("b", &[10.0, 14.0])],
        None,
    )
    .unwrap();
    let d = 27.5f64.sqrt();
    close(&adv.values, &[-1.0 / d, 1.0 / d, -2.0 / d, 2.0 / d]);
    // sample estimator over the batch: 110 / 3
    let adv = compute_advantages(
        &cfg(StdMode::Batch, StdEstimator::Sample, 0.0),
        &[group("a", &[1.0, 3.0]), group("b", &[10.0, 14.0])],
        None,
    )
    .unwrap();
    let d = (110.0f64 / 3.0).sqrt();
    close(&adv.values, &[-1.0 / d, 1.0 / d, -2.0 / d, 2.0 / d]);
}

#[test]
fn std_mode_none_only_centres() {
    let adv = compute_advantages(
        &cfg(StdMode::None, StdEstimator::Population, 1e-4),
        &[group("a", &[1.0, 3.0]), group("b", &[10.0, 14.0, 12.0])],
        None,
    )
    .unwrap();
    assert_eq!(adv.values, vec![-1.0, 1.0, -2.0, 2.0, 0.0]);
}

#[test]
fn components_are_normalised_then_weighted() {
    let mut c = cfg(StdMode::Group, StdEstimator::Population, 0.0);
    c.components = vec![
        RewardComponent::required("a", 1.0),
        RewardComponent::required("b", 0.5),
    ];
    // a: [0, 2] -> mean 1, std 1 -> [-1, 1];  b: [30, 10] -> mean 20, std 10 -> [1, -1]
    let g = multi(
        "p",
        &[&[("a", 0.0), ("b", 30.0)], &[("a", 2.0), ("b", 10.0)]],
    );
    let adv = compute_advantages(&c, std::slice::from_ref(&g), None).unwrap();
    assert_eq!(adv.values, vec![-1.0 + 0.5, 1.0 - 0.5]);
    // a component with no spread in the group contributes exactly 0 (never 0/0)
    let g = multi("p", &[&[("a", 0.0), ("b", 7.0)], &[("a", 2.0), ("b", 7.0)]]);
    let adv = compute_advantages(&c, &[g], None).unwrap();
    assert_eq!(adv.values, vec![-1.0, 1.0]);
    // components a scorer reports but the config does not list are ignored
    let g = multi(
        "p",
        &[
            &[("a", 0.0), ("b", 30.0), ("aesthetic", 1e9)],
            &[("a", 2.0), ("b", 10.0)],
        ],
    );
    let adv = compute_advantages(&c, &[g], None).unwrap();
    assert_eq!(adv.values, vec![-0.5, 0.5]);
    assert_eq!(adv.components["a"].mean, 1.0);
    assert_eq!(adv.components["b"].group_std_mean, 10.0);
}

#[test]
fn optional_components_are_dropped_for_the_group_only() {
    let mut c = cfg(StdMode::None, StdEstimator::Population, 0.0);
    c.components = vec![
        RewardComponent::required("a", 1.0),
        RewardComponent::optional("ocr", 2.0),
    ];
    let g0 = multi("p", &[&[("a", 0.0), ("ocr", 1.0)], &[("a", 2.0)]]);
    let g1 = multi(
        "q",
        &[
            &[("a", 0.0), ("ocr", 1.0)],
            &[("a", 2.0), ("ocr", f64::NAN)],
        ],
    );
    let g2 = multi(
        "r",
        &[&[("a", 0.0), ("ocr", 1.0)], &[("a", 2.0), ("ocr", 0.0)]],
    );
    let adv = compute_advantages(&c, &[g0, g1, g2], None).unwrap();
    assert_eq!(
        adv.values,
        vec![-1.0, 1.0, -1.0, 1.0, -1.0 + 1.0, 1.0 - 1.0]
    );
    assert_eq!(adv.groups[0].dropped_components, vec!["ocr".to_string()]);
    assert_eq!(adv.groups[1].dropped_components, vec!["ocr".to_string()]);
    assert!(adv.groups[2].dropped_components.is_empty());
    adv.check_no_failures().unwrap();
}

#[test]
fn a_missing_or_non_finite_required_component_fails_its_group() {
    let c = cfg(StdMode::Batch, StdEstimator::Population, 0.0);
    let missing = RewardGroup {
        prompt_key: "m".into(),
        samples: vec![BTreeMap::from([("r".to_string(), 1.0)]), BTreeMap::new()],
    };
    let groups = [
        group("a", &[1.0, 3.0]),
        missing,
        group("n", &[1.0, f64::NAN]),
        group("i", &[f64::INFINITY, 0.0]),
        group("b", &[10.0, 14.0]),
    ];
    let adv = compute_advantages(&c, &groups, None).unwrap();
    assert_eq!(
        adv.groups[1].outcome,
        GroupOutcome::Failed(FlowGrpoError::MissingComponent {
            group: 1,
            sample: 1,
            component: "r".into()
        })
    );
    assert!(matches!(
        &adv.groups[2].outcome,
        GroupOutcome::Failed(FlowGrpoError::NonFiniteComponent { group: 2, sample: 1, value, .. }) if value.is_nan()
    ));
    assert!(matches!(
        &adv.groups[3].outcome,
        GroupOutcome::Failed(FlowGrpoError::NonFiniteComponent {
            group: 3,
            sample: 0,
            ..
        })
    ));
    // failed groups: zero advantage, never trained, no NaN anywhere
    assert!(adv.values.iter().all(|v| v.is_finite()));
    assert_eq!(&adv.values[2..8], &[0.0; 6]);
    assert_eq!(&adv.keep[2..8], &[false; 6]);
    // and they are out of the batch statistics: same as the batch without them
    let d = 27.5f64.sqrt();
    close(&adv.values[..2], &[-1.0 / d, 1.0 / d]);
    close(&adv.values[8..], &[-2.0 / d, 2.0 / d]);
    assert_eq!(adv.filtered_samples, 6);
    let err = adv.check_no_failures().unwrap_err();
    match &err {
        FlowGrpoError::GroupsFailed { failures, groups } => {
            assert_eq!((failures.len(), *groups), (3, 5));
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("missing"), "{err}");
}

#[test]
fn groups_smaller_than_two_get_zero() {
    let adv = compute_advantages(
        &cfg(StdMode::Group, StdEstimator::Sample, 1e-8),
        &[group("a", &[5.0]), group("b", &[1.0, 2.0]), group("c", &[])],
        None,
    )
    .unwrap();
    assert_eq!(adv.groups[0].outcome, GroupOutcome::TooSmall);
    assert_eq!(adv.groups[2].outcome, GroupOutcome::TooSmall);
    assert_eq!(adv.values[0], 0.0);
    assert!(!adv.keep[0]);
    assert!((adv.zero_std_fraction - 2.0 / 3.0).abs() < 1e-15);
}

#[test]
fn zero_std_groups_are_filtered_and_counted() {
    let mut c = cfg(StdMode::Group, StdEstimator::Population, 1e-4);
    let groups = [
        group("a", &[0.5, 0.5, 0.5]),
        group("b", &[0.0, 1.0]),
        group("c", &[2.0, 2.0]),
        group("d", &[3.0, 1.0]),
    ];
    let adv = compute_advantages(&c, &groups, None).unwrap();
    assert_eq!(adv.groups[0].outcome, GroupOutcome::ZeroStd);
    assert_eq!(adv.zero_std_fraction, 0.5);
    assert_eq!(adv.filtered_samples, 5);
    assert_eq!(
        adv.keep,
        vec![false, false, false, true, true, false, false, true, true]
    );
    assert_eq!(adv.kept_indices(), vec![3, 4, 7, 8]);
    // without the filter they train, with advantage exactly 0
    c.filter_zero_std_groups = false;
    let adv = compute_advantages(&c, &groups, None).unwrap();
    assert_eq!(adv.keep, vec![true; 9]);
    assert_eq!(adv.values[0..3], [0.0; 3]);
    assert_eq!(adv.zero_std_fraction, 0.5);
    assert_eq!(adv.filtered_samples, 0);
}

#[test]
fn advantages_are_clipped_and_the_fraction_reported() {
    let mut c = cfg(StdMode::Group, StdEstimator::Population, 0.0);
    c.clip = Some(2.0);
    // mean 10, population std 30: nine at -1/3, one at +3 -> clipped to 2
    let mut r = vec![0.0; 9];
    r.push(100.0);
    let adv = compute_advantages(&c, &[group("p", &r)], None).unwrap();
    let mut want = vec![-1.0 / 3.0; 9];
    want.push(2.0);
    close(&adv.values, &want);
    assert!((adv.clip_fraction - 0.1).abs() < 1e-15);
    // the reference preset clips at 5
    let preset =
        AdvantageConfig::flow_grpo(StdMode::Group, vec![RewardComponent::required("r", 1.0)])
            .unwrap();
    let mut r = vec![0.0; 99];
    r.push(1.0);
    let adv = compute_advantages(&preset, &[group("p", &r)], None).unwrap();
    assert_eq!(adv.values[99], 5.0);
    // mean 0.01, population std sqrt(99) / 100: -0.01 / (std + 1e-4)
    assert!((adv.values[0] + 1.0 / (99f64.sqrt() + 1e-2)).abs() < 1e-12);
}

#[test]
fn degenerate_when_the_advantage_variance_collapses() {
    let c = cfg(StdMode::None, StdEstimator::Population, 0.0);
    // advantages +-5e-5: variance 2.5e-9 < 1e-6
    let adv = compute_advantages(&c, &[group("p", &[0.0, 1e-4])], None).unwrap();
    assert!(adv.degenerate);
    assert!((adv.variance - 2.5e-9).abs() < 1e-20);
    let adv = compute_advantages(&c, &[group("p", &[0.0, 1e-2])], None).unwrap();
    assert!(!adv.degenerate);
    // everything filtered: nothing trains, so the step is degenerate
    let adv = compute_advantages(&c, &[group("p", &[1.0, 1.0])], None).unwrap();
    assert!(adv.degenerate);
    assert!(adv.kept_indices().is_empty());
}

/// flow_grpo's own `stat_tracking.py` example: prompts a b a c b a, rewards 1..6, population
/// std + 1e-4, statistics pooled per prompt across groups.
#[test]
fn prompt_stat_tracker_pools_by_prompt() {
    let c = cfg(StdMode::Group, StdEstimator::Population, 1e-4);
    let groups = [
        group("a", &[1.0, 3.0]),
        group("b", &[2.0, 5.0]),
        group("a", &[6.0]),
        group("c", &[4.0]),
    ];
    let mut tracker = PromptStatTracker::new();
    let adv = compute_advantages(&c, &groups, Some(&mut tracker)).unwrap();
    let a = [1.0, 3.0, 6.0];
    let ma = 10.0 / 3.0;
    let sa = (a.iter().map(|x: &f64| (x - ma).powi(2)).sum::<f64>() / 3.0).sqrt() + 1e-4;
    let sb = 1.5 + 1e-4;
    close(
        &adv.values,
        &[
            (1.0 - ma) / sa,
            (3.0 - ma) / sa,
            (2.0 - 3.5) / sb,
            (5.0 - 3.5) / sb,
            (6.0 - ma) / sa,
            0.0, // "c": one reward, flow_grpo also gives (4 - 4) / 1e-4 = 0
        ],
    );
    assert_eq!(adv.groups[2].outcome, GroupOutcome::Trained);
    assert_eq!(adv.groups[3].outcome, GroupOutcome::TooSmall);
    assert_eq!(tracker.num_prompts(), 3);
    assert_eq!(tracker.history("a", "r"), &[1.0, 3.0, 6.0]);

    // history carries over to the next call until cleared
    let adv = compute_advantages(&c, &[group("c", &[6.0])], Some(&mut tracker)).unwrap();
    close(&adv.values, &[(6.0 - 5.0) / (1.0 + 1e-4)]);
    tracker.clear();
    assert_eq!(tracker.num_prompts(), 0);
    let adv = compute_advantages(&c, &[group("c", &[6.0])], Some(&mut tracker)).unwrap();
    assert_eq!(adv.values, vec![0.0]);
}

#[test]
fn invalid_configs_list_every_problem() {
    let bad = AdvantageConfig {
        std_mode: StdMode::Group,
        std_estimator: StdEstimator::Population,
        std_epsilon: -1.0,
        components: vec![],
        clip: Some(0.0),
        filter_zero_std_groups: true,
        degenerate_variance: f64::NAN,
    };
    let err = bad.clone().validated().unwrap_err();
    let FlowGrpoError::InvalidAdvantageConfig { problems } = &err else {
        panic!("{err}")
    };
    assert_eq!(problems.len(), 4, "{problems:?}");
    assert!(problems.contains(&ConfigProblem::NoComponents));
    assert!(problems.contains(&ConfigProblem::StdEpsilon { value: -1.0 }));
    assert!(problems.contains(&ConfigProblem::Clip { value: 0.0 }));
    let msg = err.to_string();
    assert!(msg.contains("epsilon") && msg.contains("clip"), "{msg}");
    // compute refuses it too
    assert!(compute_advantages(&bad, &[group("p", &[1.0, 2.0])], None).is_err());

    let bad = AdvantageConfig {
        components: vec![
            RewardComponent::optional("a", 1.0),
            RewardComponent::optional("a", f64::INFINITY),
            RewardComponent::optional("", 1.0),
        ],
        ..cfg(StdMode::Group, StdEstimator::Population, 0.0)
    };
    let FlowGrpoError::InvalidAdvantageConfig { problems } = bad.validated().unwrap_err() else {
        panic!()
    };
    assert!(problems.contains(&ConfigProblem::DuplicateComponent { name: "a".into() }));
    assert!(problems.contains(&ConfigProblem::EmptyComponentName));
    assert!(problems.contains(&ConfigProblem::NoRequiredComponent));
    assert!(
        problems
            .iter()
            .any(|p| matches!(p, ConfigProblem::ComponentWeight { .. }))
    );
}

#[test]
fn an_empty_batch_is_an_error() {
    let c = cfg(StdMode::Group, StdEstimator::Population, 0.0);
    assert!(matches!(
        compute_advantages(&c, &[], None),
        Err(FlowGrpoError::Empty { .. })
    ));
}

#[test]
fn advantages_move_to_a_device_in_sample_order() {
    use burn::backend::Flex;
    let adv = compute_advantages(
        &cfg(StdMode::None, StdEstimator::Population, 0.0),
        &[group("p", &[1.0, 3.0, 5.0])],
        None,
    )
    .unwrap();
    let t = adv.tensor::<Flex>(&[2, 0], &Default::default());
    assert_eq!(t.into_data().to_vec::<f32>().unwrap(), vec![2.0, -2.0]);
}
