//! Combining named components into one reward per sample, group by group, with failures that
//! cannot be ignored.
//!
//! A [`Combination`] holds the *required* components and the *weights*; building one fails if
//! a required component has no weight (or a weight is not finite), listing every problem.
//! [`Combination::apply`] judges each group of samples (the candidates of one prompt) on its
//! own and returns a [`GroupOutcome`] per group:
//!
//! * a required component that is missing or not finite in **any** sample of a group fails the
//!   whole group ([`GroupOutcome::Failed`], which carries the problems and no numbers at all);
//! * a weighted component that is not required and is missing or not finite in some sample of
//!   a group is left out of that group's combination for every sample of the group, and named in
//!   [`ScoredGroup::skipped`];
//! * otherwise `combined[i] = sum over weighted components c of weight[c] * value[c][i]`.
//!
//! Components that are neither required nor weighted are ignored. The raw components of the
//! group are kept in [`ScoredGroup::components`] (normalising them within the group, as
//! GRPO-style advantages do, is the trainer's job).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::error::{ConfigProblem, GroupFailureSummary, RewardError};
use crate::scorer::Components;

/// Required components and weights, validated.
///
/// ```
/// use reward::{Combination, Components, GroupOutcome};
///
/// // a required component without a weight is a configuration error
/// assert!(Combination::new(["pickscore"], [("jpeg", 1.0)]).is_err());
///
/// let c = Combination::new(["pickscore"], [("pickscore", 1.0), ("jpeg", 0.5)]).unwrap();
/// let scores = vec![
///     Components::new().with("pickscore", 20.0).with("jpeg", -2.0),
///     Components::new().with("pickscore", 22.0).with("jpeg", -4.0),
///     Components::new().with("pickscore", f64::NAN), // fails group 1
///     Components::new().with("pickscore", 21.0),
/// ];
/// let out = c.apply(&scores, &[0, 0, 1, 1]).unwrap();
/// match &out.outcomes()[0] {
///     GroupOutcome::Scored(g) => assert_eq!(g.combined, vec![19.0, 20.0]),
///     GroupOutcome::Failed(f) => panic!("{f}"),
/// }
/// assert!(matches!(&out.outcomes()[1], GroupOutcome::Failed(_)));
/// assert!(out.require_all().is_err());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Combination {
    required: BTreeSet<String>,
    weights: BTreeMap<String, f64>,
}

/// Why a sample's component could not be used.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ComponentIssue {
    /// The scorer did not return the component for this sample.
    Missing,
    /// The value is NaN or infinite.
    NonFinite(f64),
}

/// One problem found in a group.
#[derive(Clone, Debug, PartialEq)]
pub struct ComponentProblem {
    /// The sample's index in the scored batch.
    pub sample: usize,
    /// The component.
    pub component: String,
    /// What is wrong.
    pub issue: ComponentIssue,
}

impl fmt::Display for ComponentProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.issue {
            ComponentIssue::Missing => {
                write!(f, "sample {}: {} missing", self.sample, self.component)
            }
            ComponentIssue::NonFinite(v) => {
                write!(
                    f,
                    "sample {}: {} = {v} (not finite)",
                    self.sample, self.component
                )
            }
        }
    }
}

/// A group whose rewards can be trained on.
#[derive(Clone, Debug, PartialEq)]
pub struct ScoredGroup {
    /// The group id.
    pub group: usize,
    /// The samples of the group, as indices into the scored batch, in batch order.
    pub samples: Vec<usize>,
    /// The combined reward of each sample of the group (same order as `samples`).
    pub combined: Vec<f64>,
    /// The raw value of every weighted component that entered the combination, per sample.
    pub components: BTreeMap<String, Vec<f64>>,
    /// Weighted, not required components left out of this group's combination because a
    /// sample lacked them or had a non-finite value.
    pub skipped: Vec<String>,
}

/// A group that must not be trained on.
#[derive(Clone, Debug, PartialEq)]
pub struct FailedGroup {
    /// The group id.
    pub group: usize,
    /// The samples of the group, as indices into the scored batch.
    pub samples: Vec<usize>,
    /// Every missing or non-finite required component, per sample.
    pub problems: Vec<ComponentProblem>,
}

impl fmt::Display for FailedGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p: Vec<String> = self.problems.iter().map(ToString::to_string).collect();
        write!(f, "reward group {} failed: {}", self.group, p.join(", "))
    }
}

/// The outcome of one group. A failed group carries no rewards, so a trainer cannot use one by
/// accident: it has to match on this enum.
#[must_use = "a failed reward group must be handled (dropped and reported), never trained on"]
#[derive(Clone, Debug, PartialEq)]
pub enum GroupOutcome {
    /// Every required component is present and finite in every sample.
    Scored(ScoredGroup),
    /// Some required component is missing or not finite.
    Failed(FailedGroup),
}

/// The outcomes of every group, in order of each group's first sample.
#[must_use = "failed reward groups must be handled"]
#[derive(Clone, Debug, PartialEq)]
pub struct CombinedRewards {
    outcomes: Vec<GroupOutcome>,
}

impl CombinedRewards {
    /// Every group's outcome.
    pub fn outcomes(&self) -> &[GroupOutcome] {
        &self.outcomes
    }

    /// Every group's outcome, owned.
    pub fn into_outcomes(self) -> Vec<GroupOutcome> {
        self.outcomes
    }

    /// The failed groups.
    pub fn failures(&self) -> impl Iterator<Item = &FailedGroup> {
        self.outcomes.iter().filter_map(|o| match o {
            GroupOutcome::Failed(f) => Some(f),
            GroupOutcome::Scored(_) => None,
        })
    }

    /// The scored groups when no group failed; otherwise [`RewardError::GroupsFailed`] listing
    /// every failed group.
    pub fn require_all(self) -> Result<Vec<ScoredGroup>, RewardError> {
        let failures: Vec<GroupFailureSummary> = self
            .failures()
            .map(|f| GroupFailureSummary {
                group: f.group,
                problems: f.problems.iter().map(ToString::to_string).collect(),
            })
            .collect();
        if !failures.is_empty() {
            return Err(RewardError::GroupsFailed { failures });
        }
        Ok(self
            .outcomes
            .into_iter()
            .map(|o| match o {
                GroupOutcome::Scored(s) => s,
                GroupOutcome::Failed(_) => unreachable!("failures were returned above"),
            })
            .collect())
    }
}

impl Combination {
    /// Required components and `(component, weight)` pairs. Fails, listing every problem, if a
    /// required component has no weight, a weight is not finite, a component is weighted
    /// twice, or nothing is weighted.
    pub fn new<R, W, S>(required: R, weights: W) -> Result<Self, RewardError>
    where
        R: IntoIterator,
        R::Item: Into<String>,
        W: IntoIterator<Item = (S, f64)>,
        S: Into<String>,
    {
        let required: BTreeSet<String> = required.into_iter().map(Into::into).collect();
        let mut problems = Vec::new();
        let mut map = BTreeMap::new();
        for (name, w) in weights {
            let name = name.into();
            if !w.is_finite() {
                problems.push(ConfigProblem::new(
                    format!("weights.{name}"),
                    w,
                    "a finite number",
                ));
            }
            if map.insert(name.clone(), w).is_some() {
                problems.push(ConfigProblem::new(
                    format!("weights.{name}"),
                    "given twice",
                    "one weight per component",
                ));
            }
        }
        if map.is_empty() {
            problems.push(ConfigProblem::new(
                "weights",
                "{}",
                "at least one weighted component",
            ));
        }
        for r in &required {
            if !map.contains_key(r) {
                problems.push(ConfigProblem::new(
                    format!("required_components.{r}"),
                    "no weight",
                    "every required component needs an entry in the component weights",
                ));
            }
        }
        RewardError::config("reward combination", problems)?;
        Ok(Self {
            required,
            weights: map,
        })
    }

    /// The required components.
    pub fn required(&self) -> impl Iterator<Item = &str> {
        self.required.iter().map(String::as_str)
    }

    /// The weights.
    pub fn weights(&self) -> impl Iterator<Item = (&str, f64)> {
        self.weights.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// Judges and combines each group. `group_of[i]` is the group id of sample `i`
    /// (`scores.len() == group_of.len()`, else [`RewardError::ScorerOutputLength`]); groups are
    /// returned in order of their first sample.
    pub fn apply(
        &self,
        scores: &[Components],
        group_of: &[usize],
    ) -> Result<CombinedRewards, RewardError> {
        if scores.len() != group_of.len() {
            return Err(RewardError::ScorerOutputLength {
                scorer: "combination input".into(),
                expected: group_of.len(),
                found: scores.len(),
            });
        }
        let mut order: Vec<usize> = Vec::new();
        let mut members: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, g) in group_of.iter().enumerate() {
            members
                .entry(*g)
                .or_insert_with(|| {
                    order.push(*g);
                    Vec::new()
                })
                .push(i);
        }
        let outcomes = order
            .into_iter()
            .map(|g| {
                self.judge_group(
                    g,
                    std::mem::take(members.get_mut(&g).expect("group")),
                    scores,
                )
            })
            .collect();
        Ok(CombinedRewards { outcomes })
    }

    fn judge_group(
        &self,
        group: usize,
        samples: Vec<usize>,
        scores: &[Components],
    ) -> GroupOutcome {
        let issue = |i: usize, c: &str| match scores[i].get(c) {
            None => Some(ComponentIssue::Missing),
            Some(v) if !v.is_finite() => Some(ComponentIssue::NonFinite(v)),
            Some(_) => None,
        };
        let mut problems = Vec::new();
        for c in &self.required {
            for &i in &samples {
                if let Some(issue) = issue(i, c) {
                    problems.push(ComponentProblem {
                        sample: i,
                        component: c.clone(),
                        issue,
                    });
                }
            }
        }
        if !problems.is_empty() {
            return GroupOutcome::Failed(FailedGroup {
                group,
                samples,
                problems,
            });
        }
        let mut combined = vec![0.0; samples.len()];
        let mut components = BTreeMap::new();
        let mut skipped = Vec::new();
        for (c, w) in &self.weights {
            if samples.iter().any(|&i| issue(i, c).is_some()) {
                skipped.push(c.clone());
                continue;
            }
            let values: Vec<f64> = samples
                .iter()
                .map(|&i| scores[i].get(c).expect("checked"))
                .collect();
            for (acc, v) in combined.iter_mut().zip(&values) {
                *acc += w * v;
            }
            components.insert(c.clone(), values);
        }
        GroupOutcome::Scored(ScoredGroup {
            group,
            samples,
            combined,
            components,
            skipped,
        })
    }
}
