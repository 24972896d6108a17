//! Combination of components: configuration errors, failed groups that cannot be trained on,
//! optional components, the end-to-end path from scorers to groups.

use reward::shapes::{RenderOptions, SceneSpec, ShapesScorer, render};
use reward::{
    Batch, Combination, ComponentIssue, Components, GroupOutcome, JpegReward, JpegScorer,
    RewardError, Scorer,
};

#[test]
fn configuration_problems_are_listed_together() {
    match Combination::new(["pickscore", "shapes"], [("jpeg", f64::NAN), ("jpeg", 1.0)]) {
        Err(RewardError::InvalidConfig { problems, .. }) => {
            let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
            assert_eq!(
                fields,
                [
                    "weights.jpeg",
                    "weights.jpeg",
                    "required_components.pickscore",
                    "required_components.shapes"
                ]
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(Combination::new(Vec::<String>::new(), Vec::<(String, f64)>::new()).is_err());
    let c = Combination::new(["a"], [("a", 1.0), ("b", 0.5)]).unwrap();
    assert_eq!(c.required().collect::<Vec<_>>(), ["a"]);
    assert_eq!(c.weights().collect::<Vec<_>>(), [("a", 1.0), ("b", 0.5)]);
}

#[test]
fn a_missing_or_non_finite_required_component_fails_its_group_only() {
    let c = Combination::new(["r"], [("r", 2.0)]).unwrap();
    let s = |v: Option<f64>| match v {
        Some(v) => Components::new().with("r", v),
        None => Components::new().with("other", 1.0),
    };
    let scores = vec![
        s(Some(1.0)),
        s(Some(f64::INFINITY)), // group 7
        s(Some(2.0)),
        s(None), // group 7
        s(Some(3.0)),
        s(Some(4.0)),
    ];
    let out = c.apply(&scores, &[3, 7, 3, 7, 9, 9]).unwrap();
    assert_eq!(out.outcomes().len(), 3);
    let mut failed = 0;
    for o in out.outcomes() {
        match o {
            GroupOutcome::Scored(g) => {
                assert_ne!(g.group, 7);
                let want: Vec<f64> = g
                    .samples
                    .iter()
                    .map(|&i| 2.0 * scores[i].get("r").unwrap())
                    .collect();
                assert_eq!(g.combined, want);
            }
            GroupOutcome::Failed(f) => {
                failed += 1;
                assert_eq!((f.group, f.samples.clone()), (7, vec![1, 3]));
                assert_eq!(f.problems.len(), 2);
                assert_eq!(
                    f.problems[0].issue,
                    ComponentIssue::NonFinite(f64::INFINITY)
                );
                assert_eq!(f.problems[1].issue, ComponentIssue::Missing);
                assert!(f.to_string().contains("sample 3: r missing"), "{f}");
            }
        }
    }
    assert_eq!(failed, 1);
    assert_eq!(out.failures().count(), 1);
    let err = out.require_all().unwrap_err();
    assert!(err.to_string().contains("group 7"), "{err}");
}

#[test]
fn optional_weighted_components_are_skipped_per_group_and_named() {
    let c = Combination::new(["r"], [("r", 1.0), ("o", 10.0)]).unwrap();
    let scores = vec![
        Components::new().with("r", 1.0).with("o", 0.5),
        Components::new().with("r", 2.0).with("o", 0.25),
        Components::new().with("r", 3.0).with("o", f64::NAN),
        Components::new().with("r", 4.0).with("o", 1.0),
    ];
    let groups = c
        .apply(&scores, &[0, 0, 1, 1])
        .unwrap()
        .require_all()
        .unwrap();
    assert_eq!(groups[0].combined, vec![6.0, 4.5]);
    assert!(groups[0].skipped.is_empty());
    assert_eq!(groups[1].combined, vec![3.0, 4.0]);
    assert_eq!(groups[1].skipped, ["o"]);
    assert!(!groups[1].components.contains_key("o"));
}

#[test]
fn mismatched_lengths_are_an_error() {
    let c = Combination::new(["r"], [("r", 1.0)]).unwrap();
    assert!(c.apply(&[Components::new()], &[0, 0]).is_err());
}

#[test]
fn scorers_into_groups_end_to_end() {
    let o = RenderOptions::default();
    let prompts: Vec<String> = [
        "two red circles",
        "two red circles",
        "a blue square",
        "a blue square",
    ]
    .map(String::from)
    .to_vec();
    // the second candidate of each group draws the wrong thing
    let drawn = [
        "two red circles",
        "two blue circles",
        "a blue square",
        "a yellow triangle",
    ];
    let images: Vec<_> = drawn
        .iter()
        .enumerate()
        .map(|(i, p)| {
            render(&SceneSpec::parse(p).unwrap(), i as u64, &o)
                .unwrap()
                .image
        })
        .collect();
    let batch = Batch::images_and_prompts(&images, &prompts).unwrap();
    // scorers are used through the trait object, as a trainer holds them
    let scorers: Vec<Box<dyn Scorer>> = vec![
        Box::new(ShapesScorer::default()),
        Box::new(JpegScorer::ddpo(JpegReward::Compressibility)),
    ];
    let mut scores = vec![Components::new(); batch.len()];
    for scorer in &scorers {
        for (s, part) in scores.iter_mut().zip(scorer.score(batch).unwrap()) {
            for (k, v) in part.iter() {
                s.insert(k, v);
            }
        }
    }
    let c = Combination::new(
        ["shapes"],
        [("shapes", 1.0), ("jpeg_compressibility", 0.01)],
    )
    .unwrap();
    let groups = c
        .apply(&scores, &[0, 0, 1, 1])
        .unwrap()
        .require_all()
        .unwrap();
    for g in &groups {
        assert_eq!(g.components["shapes"][0], 1.0);
        assert!(g.components["shapes"][1] < 1.0);
        assert!(g.combined[0] > g.combined[1], "{g:?}");
    }
}
