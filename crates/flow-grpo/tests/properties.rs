//! Invariants of the advantages and of the clipped objective, over random inputs.

use std::collections::BTreeMap;

use burn::backend::NdArray;
use burn::tensor::{Tensor, TensorData};
use flow_grpo::{
    AdvantageConfig, ClipRange, GroupOutcome, RewardComponent, RewardGroup, StdEstimator, StdMode,
    compute_advantages, grpo_clip_loss,
};
use proptest::prelude::*;

type F64 = NdArray<f64>;

fn config(std_mode: StdMode, clip: Option<f64>) -> AdvantageConfig {
    AdvantageConfig {
        std_mode,
        std_estimator: StdEstimator::Population,
        std_epsilon: 0.0,
        components: vec![RewardComponent::required("r", 1.0)],
        clip,
        filter_zero_std_groups: true,
        degenerate_variance: 1e-6,
    }
}

fn groups(rewards: &[Vec<f64>]) -> Vec<RewardGroup> {
    rewards
        .iter()
        .enumerate()
        .map(|(i, g)| RewardGroup {
            prompt_key: format!("p{i}"),
            samples: g
                .iter()
                .map(|&r| BTreeMap::from([("r".to_string(), r)]))
                .collect(),
        })
        .collect()
}

fn batch() -> impl Strategy<Value = Vec<Vec<f64>>> {
    prop::collection::vec(prop::collection::vec(-10.0f64..10.0, 1..7), 1..6)
}

fn mode() -> impl Strategy<Value = StdMode> {
    prop_oneof![
        Just(StdMode::Group),
        Just(StdMode::Batch),
        Just(StdMode::None)
    ]
}

proptest! {
    /// Without a clip, every trained group's advantages sum to zero (per-prompt centring).
    #[test]
    fn trained_groups_are_centred(rewards in batch(), mode in mode()) {
        let adv = compute_advantages(&config(mode, None), &groups(&rewards), None).unwrap();
        let mut at = 0;
        for (g, report) in rewards.iter().zip(&adv.groups) {
            let sum: f64 = adv.values[at..at + g.len()].iter().sum();
            let scale: f64 = adv.values[at..at + g.len()].iter().map(|v| v.abs()).sum::<f64>().max(1.0);
            if report.outcome == GroupOutcome::Trained {
                prop_assert!(sum.abs() < 1e-9 * scale, "{sum}");
            } else {
                prop_assert!(adv.values[at..at + g.len()].iter().all(|v| *v == 0.0));
            }
            at += g.len();
        }
        prop_assert!(adv.values.iter().all(|v| v.is_finite()));
        prop_assert!((0.0..=1.0).contains(&adv.zero_std_fraction));
    }

    /// Group-std advantages do not depend on the reward's offset or (positive) scale.
    #[test]
    fn group_std_advantages_are_affine_invariant(
        rewards in batch(), shift in -100.0f64..100.0, scale in 0.01f64..100.0
    ) {
        let cfg = config(StdMode::Group, None);
        let a = compute_advantages(&cfg, &groups(&rewards), None).unwrap();
        let moved: Vec<Vec<f64>> =
            rewards.iter().map(|g| g.iter().map(|r| r * scale + shift).collect()).collect();
        let b = compute_advantages(&cfg, &groups(&moved), None).unwrap();
        for (x, y) in a.values.iter().zip(&b.values) {
            prop_assert!((x - y).abs() < 1e-6 * x.abs().max(1.0), "{x} vs {y}");
        }
    }

    /// The clip bounds every advantage; the kept mask follows the outcomes.
    #[test]
    fn clip_bounds_and_keep_mask(rewards in batch(), mode in mode(), c in 0.1f64..3.0) {
        let adv = compute_advantages(&config(mode, Some(c)), &groups(&rewards), None).unwrap();
        prop_assert!(adv.values.iter().all(|v| v.abs() <= c));
        let mut at = 0;
        for (g, report) in rewards.iter().zip(&adv.groups) {
            let trains = report.outcome == GroupOutcome::Trained;
            prop_assert!(adv.keep[at..at + g.len()].iter().all(|k| *k == trains));
            at += g.len();
        }
    }

    /// PPO pessimism: each term is at least the unclipped surrogate, and equals it inside the
    /// band; at ratio 1 the loss is -mean(A).
    #[test]
    fn clipped_terms_are_pessimistic(
        deltas in prop::collection::vec(-0.5f64..0.5, 6),
        adv in prop::collection::vec(-3.0f64..3.0, 3),
        eps in 0.01f64..0.3,
    ) {
        let dev = Default::default();
        let lp = Tensor::<F64, 2>::from_data(TensorData::new(deltas.clone(), [3, 2]), &dev);
        let zero = Tensor::<F64, 2>::zeros([3, 2], &dev);
        let a = Tensor::<F64, 1>::from_data(TensorData::new(adv.clone(), [3]), &dev);
        let out = grpo_clip_loss(lp, zero.clone(), a.clone(), ClipRange::symmetric(eps).unwrap()).unwrap();
        let terms = out.per_element.into_data().to_vec::<f64>().unwrap();
        for (i, t) in terms.iter().enumerate() {
            let r = deltas[i].exp();
            let unclipped = -adv[i / 2] * r;
            prop_assert!(*t >= unclipped - 1e-12);
            if (r - 1.0).abs() <= eps {
                prop_assert!((t - unclipped).abs() < 1e-12);
            }
        }
        let at_one = grpo_clip_loss(zero.clone(), zero, a, ClipRange::symmetric(eps).unwrap()).unwrap();
        let want = -adv.iter().sum::<f64>() / 3.0;
        prop_assert!((at_one.loss.into_scalar() - want).abs() < 1e-12);
        prop_assert_eq!(at_one.diagnostics.clip_fraction, 0.0);
    }
}
