//! Group-relative advantages.
//!
//! For each prompt group and each reward component `k`, with the group's rewards `r_k`:
//!
//! ```text
//! centred_k = r_k - mean(r_k)                         (per-prompt centring)
//! norm_k    = centred_k / (std_k + epsilon)           StdMode::Group: std over the group
//!           = centred_k / (std_batch_k + epsilon)     StdMode::Batch: std over the batch's raw rewards
//!           = centred_k                               StdMode::None  (Dr.GRPO)
//! A         = clip(sum_k weight_k * norm_k, -c, c)
//! ```
//!
//! The std is the population std (`ddof = 0`, numpy's default) or the sample std (`ddof = 1`,
//! torch's default) as [`StdEstimator`] says, and the epsilon is added to the std, not to the
//! variance. The computation runs on the host in `f64` (reward vectors are `O(batch)` long), so
//! it is bit-identical on every backend; [`Advantages::tensor`] moves the result to a device.
//!
//! Edge cases, each reported rather than hidden:
//!
//! * a statistics population of fewer than 2 rewards gives advantage 0
//!   ([`GroupOutcome::TooSmall`]);
//! * a group whose rewards are all identical in every component gives advantage 0
//!   ([`GroupOutcome::ZeroStd`]); a single component with no spread (in its statistics
//!   population, or in the batch under [`StdMode::Batch`] with epsilon 0) contributes 0, never
//!   `0 / 0`;
//! * a missing or non-finite *required* component fails the group ([`GroupOutcome::Failed`],
//!   advantage 0, never trained); a missing or non-finite *optional* component is dropped for
//!   that group and listed in [`GroupReport::dropped_components`];
//! * zero-std (and too-small) groups are excluded from training when
//!   [`AdvantageConfig::filter_zero_std_groups`] is set, and their fraction is reported;
//! * when the variance of the trained advantages is below
//!   [`AdvantageConfig::degenerate_variance`], [`Advantages::degenerate`] is set: the optimizer
//!   step should be skipped.

use std::collections::{BTreeMap, BTreeSet};

use burn::tensor::{Tensor, TensorData, backend::Backend};

use crate::error::{ConfigProblem, FlowGrpoError};
use crate::stats::{nan_max, nan_min};

/// The divisor applied after per-prompt centring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StdMode {
    /// Each group's own std (canonical GRPO, Relax's text GRPO).
    Group,
    /// The std of the whole batch's raw rewards (flow_grpo's `global_std`).
    Batch,
    /// No division: centring only (Dr.GRPO).
    None,
}

/// Which standard deviation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StdEstimator {
    /// `sqrt(sum (x - mean)^2 / n)` — numpy's `np.std` (flow_grpo's stat tracker).
    Population,
    /// `sqrt(sum (x - mean)^2 / (n - 1))` — torch's `Tensor.std()` (DanceGRPO).
    Sample,
}

impl StdEstimator {
    fn std(self, values: &[f64]) -> f64 {
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let ss: f64 = values.iter().map(|v| (v - mean) * (v - mean)).sum();
        let denom = match self {
            StdEstimator::Population => n,
            StdEstimator::Sample => n - 1.0,
        };
        (ss / denom).sqrt()
    }
}

/// One reward component: its name (as the scorer reports it), its weight in the combination,
/// and whether it is required.
#[derive(Debug, Clone, PartialEq)]
pub struct RewardComponent {
    /// The component's name, e.g. `pickscore`.
    pub name: String,
    /// Its weight in `A = sum_k weight_k * norm_k`.
    pub weight: f64,
    /// A missing or non-finite required component fails the group; an optional one is dropped
    /// for the group.
    pub required: bool,
}

impl RewardComponent {
    /// A required component.
    pub fn required(name: &str, weight: f64) -> Self {
        Self {
            name: name.to_string(),
            weight,
            required: true,
        }
    }

    /// An optional component.
    pub fn optional(name: &str, weight: f64) -> Self {
        Self {
            name: name.to_string(),
            weight,
            required: false,
        }
    }
}

/// How advantages are computed. Every field changes results, so none has a default; a named
/// preset ([`AdvantageConfig::flow_grpo`]) states where its values come from.
#[derive(Debug, Clone, PartialEq)]
pub struct AdvantageConfig {
    /// The divisor after centring.
    pub std_mode: StdMode,
    /// Population or sample std.
    pub std_estimator: StdEstimator,
    /// Added to the std before dividing (`>= 0`).
    pub std_epsilon: f64,
    /// The reward components and their weights. Components a scorer reports but that are not
    /// listed here are ignored.
    pub components: Vec<RewardComponent>,
    /// Clip the combined advantage to `[-c, c]`; `None` does not clip.
    pub clip: Option<f64>,
    /// Exclude zero-std (and too-small) groups from training.
    pub filter_zero_std_groups: bool,
    /// Below this variance of the trained advantages the batch is degenerate.
    pub degenerate_variance: f64,
}

/// The advantage clip of the reference implementations (flow_grpo's `adv_clip_max`).
pub const REFERENCE_ADVANTAGE_CLIP: f64 = 5.0;
/// The advantage-variance floor below which the optimizer step is skipped.
pub const REFERENCE_DEGENERATE_VARIANCE: f64 = 1e-6;

impl AdvantageConfig {
    /// flow_grpo's conventions (`flow_grpo/stat_tracking.py` `PerPromptStatTracker`,
    /// `scripts/train_sd3.py`): population std (`np.std`) plus `1e-4`, advantages clipped to
    /// `±5`, zero-std groups filtered, variance floor `1e-6`; the std mode is the caller's
    /// (flow_grpo's `global_std` is [`StdMode::Batch`]).
    ///
    /// # Errors
    /// [`FlowGrpoError::InvalidAdvantageConfig`] listing every problem.
    ///
    /// ```
    /// use flow_grpo::{AdvantageConfig, RewardComponent, StdMode};
    /// let cfg = AdvantageConfig::flow_grpo(StdMode::Group, vec![RewardComponent::required("pickscore", 1.0)]).unwrap();
    /// assert_eq!(cfg.clip, Some(5.0));
    /// assert!(AdvantageConfig::flow_grpo(StdMode::Group, vec![]).is_err());
    /// ```
    pub fn flow_grpo(
        std_mode: StdMode,
        components: Vec<RewardComponent>,
    ) -> Result<Self, FlowGrpoError> {
        Self {
            std_mode,
            std_estimator: StdEstimator::Population,
            std_epsilon: 1e-4,
            components,
            clip: Some(REFERENCE_ADVANTAGE_CLIP),
            filter_zero_std_groups: true,
            degenerate_variance: REFERENCE_DEGENERATE_VARIANCE,
        }
        .validated()
    }

    /// Checks the configuration, listing every problem at once.
    ///
    /// # Errors
    /// [`FlowGrpoError::InvalidAdvantageConfig`].
    pub fn validated(self) -> Result<Self, FlowGrpoError> {
        let mut problems = Vec::new();
        if self.components.is_empty() {
            problems.push(ConfigProblem::NoComponents);
        }
        let mut seen = BTreeSet::new();
        for c in &self.components {
            if c.name.is_empty() {
                problems.push(ConfigProblem::EmptyComponentName);
            } else if !seen.insert(c.name.as_str()) {
                problems.push(ConfigProblem::DuplicateComponent {
                    name: c.name.clone(),
                });
            }
            if !c.weight.is_finite() {
                problems.push(ConfigProblem::ComponentWeight {
                    name: c.name.clone(),
                    weight: c.weight,
                });
            }
        }
        if !self.components.is_empty() && !self.components.iter().any(|c| c.required) {
            problems.push(ConfigProblem::NoRequiredComponent);
        }
        if !(self.std_epsilon.is_finite() && self.std_epsilon >= 0.0) {
            problems.push(ConfigProblem::StdEpsilon {
                value: self.std_epsilon,
            });
        }
        if let Some(c) = self.clip
            && !(c.is_finite() && c > 0.0)
        {
            problems.push(ConfigProblem::Clip { value: c });
        }
        if !(self.degenerate_variance.is_finite() && self.degenerate_variance >= 0.0) {
            problems.push(ConfigProblem::DegenerateThreshold {
                value: self.degenerate_variance,
            });
        }
        if problems.is_empty() {
            Ok(self)
        } else {
            Err(FlowGrpoError::InvalidAdvantageConfig { problems })
        }
    }
}

/// One prompt group's rewards: one map `component -> value` per candidate.
#[derive(Debug, Clone, PartialEq)]
pub struct RewardGroup {
    /// The prompt's stable key (used by the [`PromptStatTracker`]).
    pub prompt_key: String,
    /// Per-candidate reward components.
    pub samples: Vec<BTreeMap<String, f64>>,
}

/// Per-prompt reward history across calls (flow_grpo's `PerPromptStatTracker`): with it, a
/// group is centred and scaled by the statistics of every reward its prompt received since the
/// last [`PromptStatTracker::clear`], not only its own.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PromptStatTracker {
    history: BTreeMap<String, BTreeMap<String, Vec<f64>>>,
}

impl PromptStatTracker {
    /// An empty tracker.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets every prompt (flow_grpo clears once per epoch).
    pub fn clear(&mut self) {
        self.history.clear();
    }

    /// The number of prompts tracked.
    pub fn num_prompts(&self) -> usize {
        self.history.len()
    }

    /// The rewards of `component` recorded for `prompt`.
    pub fn history(&self, prompt: &str, component: &str) -> &[f64] {
        self.history
            .get(prompt)
            .and_then(|m| m.get(component))
            .map_or(&[], Vec::as_slice)
    }
}

/// What happened to a group.
#[derive(Debug, Clone, PartialEq)]
pub enum GroupOutcome {
    /// Normal group-relative advantages.
    Trained,
    /// Every component identical across the statistics population: advantage 0.
    ZeroStd,
    /// Fewer than 2 rewards in the statistics population: advantage 0.
    TooSmall,
    /// A required component was missing or non-finite: advantage 0, never trained.
    Failed(FlowGrpoError),
}

/// Per-group details.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupReport {
    /// What happened.
    pub outcome: GroupOutcome,
    /// Optional components dropped for this group (missing or non-finite somewhere in it).
    pub dropped_components: Vec<String>,
    /// Per component, the std of the group's own raw rewards (population), for logging.
    pub reward_std: BTreeMap<String, f64>,
}

/// Raw-reward statistics of one component over the non-failed samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ComponentStats {
    /// Mean.
    pub mean: f64,
    /// Population std.
    pub std: f64,
    /// Minimum (NaN if any value is NaN; a non-finite reward fails its group or drops its
    /// component before the statistics, so in practice it is finite).
    pub min: f64,
    /// Maximum (NaN likewise).
    pub max: f64,
    /// Mean over groups of the group's own population std (`reward/group_std_mean`).
    pub group_std_mean: f64,
}

/// The advantages of a batch and everything worth logging about them.
#[derive(Debug, Clone, PartialEq)]
pub struct Advantages {
    /// One advantage per sample, in input order (group-major); exactly 0 for zero-std,
    /// too-small and failed groups.
    pub values: Vec<f64>,
    /// Whether each sample trains (false for failed groups, and for zero-std / too-small
    /// groups under the filter).
    pub keep: Vec<bool>,
    /// Per-group details.
    pub groups: Vec<GroupReport>,
    /// Zero-std groups (too-small ones included) over non-failed groups (`zero_std_ratio`).
    pub zero_std_fraction: f64,
    /// The number of samples excluded from training.
    pub filtered_samples: usize,
    /// The fraction of trained samples whose combined advantage was clipped.
    pub clip_fraction: f64,
    /// Mean of the trained advantages.
    pub mean: f64,
    /// Population std of the trained advantages.
    pub std: f64,
    /// Population variance of the trained advantages.
    pub variance: f64,
    /// `variance < degenerate_variance` (or nothing trains): skip the optimizer step.
    pub degenerate: bool,
    /// Raw-reward statistics per configured component.
    pub components: BTreeMap<String, ComponentStats>,
}

impl Advantages {
    /// The failed groups' errors.
    pub fn failures(&self) -> Vec<&FlowGrpoError> {
        self.groups
            .iter()
            .filter_map(|g| match &g.outcome {
                GroupOutcome::Failed(e) => Some(e),
                _ => None,
            })
            .collect()
    }

    /// `Ok` when no group failed.
    ///
    /// # Errors
    /// [`FlowGrpoError::GroupsFailed`] listing every failure.
    pub fn check_no_failures(&self) -> Result<(), FlowGrpoError> {
        let failures: Vec<FlowGrpoError> = self.failures().into_iter().cloned().collect();
        if failures.is_empty() {
            Ok(())
        } else {
            Err(FlowGrpoError::GroupsFailed {
                failures,
                groups: self.groups.len(),
            })
        }
    }

    /// Indices of the samples that train.
    pub fn kept_indices(&self) -> Vec<usize> {
        (0..self.keep.len()).filter(|&i| self.keep[i]).collect()
    }

    /// The advantages of `indices` as a `[indices.len()]` tensor in the backend's float type.
    ///
    /// # Panics
    /// On an index out of range (a programming error).
    pub fn tensor<B: Backend>(&self, indices: &[usize], device: &B::Device) -> Tensor<B, 1> {
        let v: Vec<f64> = indices.iter().map(|&i| self.values[i]).collect();
        Tensor::from_data(TensorData::new(v, [indices.len()]), device)
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

fn spread_is_zero(v: &[f64]) -> bool {
    v.windows(2).all(|w| w[0] == w[1])
}

/// Computes group-relative advantages for a batch of prompt groups (see the module docs for the
/// exact definition and every edge case).
///
/// `tracker`, when given, is updated with this batch's rewards and supplies each prompt's
/// statistics (flow_grpo's per-prompt stat tracking).
///
/// # Errors
/// [`FlowGrpoError::InvalidAdvantageConfig`], [`FlowGrpoError::Empty`] for a batch with no
/// group. Component problems do not fail the call: they fail their group
/// ([`GroupOutcome::Failed`]; see [`Advantages::check_no_failures`]).
///
/// ```
/// use std::collections::BTreeMap;
/// use flow_grpo::*;
/// let cfg = AdvantageConfig {
///     std_mode: StdMode::Group,
///     std_estimator: StdEstimator::Population,
///     std_epsilon: 0.0,
///     components: vec![RewardComponent::required("score", 1.0)],
///     clip: None,
///     filter_zero_std_groups: true,
///     degenerate_variance: 1e-6,
/// };
/// let group = |rs: &[f64]| RewardGroup {
///     prompt_key: "p".into(),
///     samples: rs.iter().map(|&r| BTreeMap::from([("score".to_string(), r)])).collect(),
/// };
/// // mean 2, population std 1  ->  [-1, -1, 1, 1]; the second group has no spread
/// let adv = compute_advantages(&cfg, &[group(&[1.0, 1.0, 3.0, 3.0]), group(&[5.0, 5.0])], None).unwrap();
/// assert_eq!(adv.values, vec![-1.0, -1.0, 1.0, 1.0, 0.0, 0.0]);
/// assert_eq!(adv.keep, vec![true, true, true, true, false, false]);
/// assert_eq!(adv.zero_std_fraction, 0.5);
/// assert!(!adv.degenerate);
/// ```
pub fn compute_advantages(
    config: &AdvantageConfig,
    groups: &[RewardGroup],
    mut tracker: Option<&mut PromptStatTracker>,
) -> Result<Advantages, FlowGrpoError> {
    let config = config.clone().validated()?;
    if groups.is_empty() {
        return Err(FlowGrpoError::Empty {
            what: "reward batch",
        });
    }

    // 1. Which components each group can use; failed groups.
    struct Usable {
        failed: Option<FlowGrpoError>,
        active: Vec<usize>,
        dropped: Vec<String>,
    }
    let usable: Vec<Usable> = groups
        .iter()
        .enumerate()
        .map(|(gi, g)| {
            let mut failed = None;
            let mut active = Vec::new();
            let mut dropped = Vec::new();
            'comp: for (ci, c) in config.components.iter().enumerate() {
                for (si, s) in g.samples.iter().enumerate() {
                    let problem = match s.get(&c.name) {
                        None => Some(FlowGrpoError::MissingComponent {
                            group: gi,
                            sample: si,
                            component: c.name.clone(),
                        }),
                        Some(v) if !v.is_finite() => Some(FlowGrpoError::NonFiniteComponent {
                            group: gi,
                            sample: si,
                            component: c.name.clone(),
                            value: *v,
                        }),
                        Some(_) => None,
                    };
                    if let Some(p) = problem {
                        if c.required {
                            if failed.is_none() {
                                failed = Some(p);
                            }
                        } else {
                            dropped.push(c.name.clone());
                        }
                        continue 'comp;
                    }
                }
                active.push(ci);
            }
            Usable {
                failed,
                active,
                dropped,
            }
        })
        .collect();

    let rewards = |gi: usize, ci: usize| -> Vec<f64> {
        let name = &config.components[ci].name;
        groups[gi].samples.iter().map(|s| s[name]).collect()
    };

    // 2. The statistics population of each (group, component).
    if let Some(t) = tracker.as_deref_mut() {
        for (gi, g) in groups.iter().enumerate() {
            if usable[gi].failed.is_some() {
                continue;
            }
            for &ci in &usable[gi].active {
                t.history
                    .entry(g.prompt_key.clone())
                    .or_default()
                    .entry(config.components[ci].name.clone())
                    .or_default()
                    .extend(rewards(gi, ci));
            }
        }
    }
    let population = |gi: usize, ci: usize| -> Vec<f64> {
        match tracker.as_deref() {
            Some(t) => t
                .history(&groups[gi].prompt_key, &config.components[ci].name)
                .to_vec(),
            None => rewards(gi, ci),
        }
    };

    // 3. Raw-reward statistics per component over non-failed groups (the batch std).
    let mut components = BTreeMap::new();
    let mut batch_std = vec![0.0; config.components.len()];
    for (ci, c) in config.components.iter().enumerate() {
        let mut all = Vec::new();
        let mut group_stds = Vec::new();
        for (gi, u) in usable.iter().enumerate() {
            if u.failed.is_none() && u.active.contains(&ci) {
                let r = rewards(gi, ci);
                if !r.is_empty() {
                    group_stds.push(StdEstimator::Population.std(&r));
                }
                all.extend(r);
            }
        }
        if all.is_empty() {
            continue;
        }
        batch_std[ci] = if all.len() >= 2 {
            config.std_estimator.std(&all)
        } else {
            0.0
        };
        components.insert(
            c.name.clone(),
            ComponentStats {
                mean: mean(&all),
                std: StdEstimator::Population.std(&all),
                min: nan_min(all.iter().copied()),
                max: nan_max(all.iter().copied()),
                group_std_mean: mean(&group_stds),
            },
        );
    }

    // 4. Per-group advantages.
    let mut values = Vec::new();
    let mut keep = Vec::new();
    let mut reports = Vec::new();
    let mut clipped = 0usize;
    for (gi, g) in groups.iter().enumerate() {
        let n = g.samples.len();
        let u = &usable[gi];
        let reward_std = u
            .active
            .iter()
            .filter(|_| u.failed.is_none() && n > 0)
            .map(|&ci| {
                (
                    config.components[ci].name.clone(),
                    StdEstimator::Population.std(&rewards(gi, ci)),
                )
            })
            .collect();
        let (outcome, adv) = if let Some(e) = &u.failed {
            (GroupOutcome::Failed(e.clone()), vec![0.0; n])
        } else {
            let pops: Vec<(usize, Vec<f64>)> = u
                .active
                .iter()
                .map(|&ci| (ci, population(gi, ci)))
                .collect();
            let usable_pops: Vec<&(usize, Vec<f64>)> =
                pops.iter().filter(|(_, p)| p.len() >= 2).collect();
            if n == 0 || usable_pops.is_empty() {
                (GroupOutcome::TooSmall, vec![0.0; n])
            } else if usable_pops.iter().all(|(_, p)| spread_is_zero(p)) {
                (GroupOutcome::ZeroStd, vec![0.0; n])
            } else {
                let mut adv = vec![0.0; n];
                for (ci, pop) in usable_pops {
                    if spread_is_zero(pop) {
                        continue; // no spread: contributes exactly 0, never 0 / 0
                    }
                    let m = mean(pop);
                    let divisor = match config.std_mode {
                        StdMode::Group => config.std_estimator.std(pop) + config.std_epsilon,
                        StdMode::Batch => batch_std[*ci] + config.std_epsilon,
                        StdMode::None => 1.0,
                    };
                    if divisor <= 0.0 {
                        continue; // the divisor's population has no spread (batch std 0, epsilon 0)
                    }
                    let w = config.components[*ci].weight;
                    for (a, r) in adv.iter_mut().zip(rewards(gi, *ci)) {
                        *a += w * ((r - m) / divisor);
                    }
                }
                if let Some(c) = config.clip {
                    for a in &mut adv {
                        if a.abs() > c {
                            clipped += 1;
                            *a = a.clamp(-c, c);
                        }
                    }
                }
                (GroupOutcome::Trained, adv)
            }
        };
        let trains = match outcome {
            GroupOutcome::Trained => true,
            GroupOutcome::ZeroStd | GroupOutcome::TooSmall => !config.filter_zero_std_groups,
            GroupOutcome::Failed(_) => false,
        };
        values.extend(adv);
        keep.extend(std::iter::repeat_n(trains, n));
        reports.push(GroupReport {
            outcome,
            dropped_components: u.dropped.clone(),
            reward_std,
        });
    }

    let non_failed = reports
        .iter()
        .filter(|r| !matches!(r.outcome, GroupOutcome::Failed(_)))
        .count();
    let zero_std = reports
        .iter()
        .filter(|r| matches!(r.outcome, GroupOutcome::ZeroStd | GroupOutcome::TooSmall))
        .count();
    let kept: Vec<f64> = values
        .iter()
        .zip(&keep)
        .filter(|(_, k)| **k)
        .map(|(v, _)| *v)
        .collect();
    let (m, var) = if kept.is_empty() {
        (0.0, 0.0)
    } else {
        let m = mean(&kept);
        (
            m,
            kept.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / kept.len() as f64,
        )
    };
    Ok(Advantages {
        filtered_samples: keep.iter().filter(|k| !**k).count(),
        clip_fraction: if kept.is_empty() {
            0.0
        } else {
            // clipped samples all belong to trained groups, which are always kept
            clipped as f64 / kept.len() as f64
        },
        zero_std_fraction: if non_failed == 0 {
            0.0
        } else {
            zero_std as f64 / non_failed as f64
        },
        mean: m,
        std: var.sqrt(),
        variance: var,
        degenerate: kept.is_empty() || var < config.degenerate_variance,
        values,
        keep,
        groups: reports,
        components,
    })
}
