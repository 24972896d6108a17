//! The metric names of seed 002, "Monitoring" (all series share the rollout/step x-axis).

/// The mean over the rollout's updates of each update's loss (FlowGRPO: the clipped loss).
pub const TRAIN_LOSS: &str = "train/loss";
/// Mean importance ratio (pooled over every update's `(sample, step)` elements, as are the
/// other ratio statistics).
pub const TRAIN_RATIO_MEAN: &str = "train/ratio_mean";
/// Std of the importance ratio.
pub const TRAIN_RATIO_STD: &str = "train/ratio_std";
/// Smallest importance ratio.
pub const TRAIN_RATIO_MIN: &str = "train/ratio_min";
/// Largest importance ratio.
pub const TRAIN_RATIO_MAX: &str = "train/ratio_max";
/// Fraction of (sample, step) elements outside the clip band.
pub const TRAIN_CLIP_FRACTION: &str = "train/clip_fraction";
/// Approximate KL between pi_old and the current policy.
pub const TRAIN_APPROX_KL: &str = "train/approx_kl";
/// Global gradient norm before clipping, the mean over the rollout's updates.
pub const TRAIN_GRAD_NORM: &str = "train/grad_norm";
/// Learning rate of the rollout's last optimizer step.
pub const TRAIN_LR: &str = "train/lr";
/// Optimizer steps the rollout took.
pub const TRAIN_OPTIMIZER_STEPS: &str = "train/optimizer_steps";
/// Optimizer steps the rollout skipped (degenerate advantages, non-finite gradients).
pub const TRAIN_OPTIMIZER_SKIPS: &str = "train/optimizer_skips";
/// Micro-batches of the rollout's updates.
pub const TRAIN_NUM_MICROBATCHES: &str = "train/num_microbatches";
/// The policy version after the rollout (optimizer steps that changed the weights, since
/// the start of training).
pub const TRAIN_POLICY_VERSION: &str = "train/policy_version";
/// Checkpoint writes that failed and were retried at the next save
/// (`checkpoint.on_failure = "retry"`), cumulative over the run, resumes included.
pub const TRAIN_CHECKPOINT_FAILURES: &str = "train/checkpoint_failures";
/// Max |pi_old anchor - sampler| log-prob over the rollout (0 when the replay reproduces the
/// sampler bit for bit; float rounding when the sampler's backend fuses what autodiff
/// decomposes).
pub const TRAIN_LOGP_PARITY_MAX_ABS: &str = "train/logp_parity_max_abs";
/// Mean of the combined advantage.
pub const REWARD_ADVANTAGE_MEAN: &str = "reward/advantage_mean";
/// Std of the combined advantage.
pub const REWARD_ADVANTAGE_STD: &str = "reward/advantage_std";
/// Prompt groups scored.
pub const REWARD_NUM_GROUPS: &str = "reward/num_groups";
/// Mean per-group reward std: the key diagnostic.
pub const REWARD_GROUP_STD_MEAN: &str = "reward/group_std_mean";
/// 1 when the advantage variance collapsed below the threshold.
pub const REWARD_DEGENERATE: &str = "reward/degenerate";
/// The share of the (not failed) groups whose rewards are all equal, which teach nothing
/// (seed 004's `zero_std_ratio`).
pub const REWARD_ZERO_STD_RATIO: &str = "reward/zero_std_ratio";
/// How far the rollout's updates moved the trained parameters: `|θ' - θ| / |θ|` over every
/// trainable parameter (L2 norms), the policy before the rollout's first update against the
/// policy after its last.
pub const TRAIN_PARAM_CHANGE: &str = "train/param_change";
/// Groups that failed (a required component missing or non-finite).
pub const REWARD_FAILED_GROUPS: &str = "reward/failed_groups";
/// Seconds spent in the scorer alone.
pub const REWARD_SCORE_TIME: &str = "reward/score_time";
/// Scorer throughput.
pub const REWARD_SCORE_SAMPLES_PER_S: &str = "reward/score_samples_per_s";
/// Samples rolled out per second (sampling, decoding and the sidecars).
pub const PERF_ROLLOUT_SAMPLES_PER_S: &str = "perf/rollout_samples_per_s";
/// Replayed transitions per second of the updates (one transition = one replayed SDE step of
/// one candidate, forward and backward).
pub const PERF_TRAIN_TRANSITIONS_PER_S: &str = "perf/train_transitions_per_s";
/// Trained candidates per second of the updates.
pub const PERF_TRAIN_SAMPLES_PER_S: &str = "perf/train_samples_per_s";

/// The mean KL of the trained transitions (or velocities) to the reference policy, before its
/// coefficient; logged when the objective has that term.
pub const TRAIN_KL_REF: &str = "train/kl_ref";
/// The mean KL of the policy's velocities to its EMA copy, before its coefficient; logged
/// when the objective has that term.
pub const TRAIN_KL_EMA: &str = "train/kl_ema";

/// DiffusionNFT: the mean adaptive `x0`-space error of the positive branch.
pub const TRAIN_NFT_POSITIVE_ERROR: &str = "train/nft_positive_error";
/// DiffusionNFT: the mean adaptive `x0`-space error of the negative branch.
pub const TRAIN_NFT_NEGATIVE_ERROR: &str = "train/nft_negative_error";
/// DiffusionNFT: the mean optimality probability `r` of the trained samples.
pub const TRAIN_NFT_OPTIMALITY_MEAN: &str = "train/nft_optimality_mean";
/// Online DPO: the fraction of pairs the implicit reward ranks right.
pub const TRAIN_DPO_IMPLICIT_ACCURACY: &str = "train/dpo_implicit_accuracy";
/// Online DPO: the mean margin `e_w - e_l` of the policy (negative: the winner fitted better).
pub const TRAIN_DPO_MODEL_MARGIN: &str = "train/dpo_model_margin";
/// Online DPO: the mean margin of the reference policy.
pub const TRAIN_DPO_REFERENCE_MARGIN: &str = "train/dpo_reference_margin";
/// Online DPO: (pair, timestep) terms per update.
pub const TRAIN_DPO_PAIRS: &str = "train/dpo_pairs";
/// RAFT: samples fine-tuned on per update (each group's best), averaged over the updates.
pub const TRAIN_RAFT_SELECTED: &str = "train/raft_selected";
/// RAFT: the selected samples' flow-matching error over the training timesteps.
pub const TRAIN_RAFT_ERROR: &str = "train/raft_error";
/// Paired finite differences: the mean SPO proxy ratio `ρ`.
pub const TRAIN_SPO_RATIO_MEAN: &str = "train/spo_ratio_mean";
/// Paired finite differences: the largest `|ρ - 1|`.
pub const TRAIN_SPO_RATIO_MAX_DEVIATION: &str = "train/spo_ratio_max_deviation";
/// The soft update's `η` applied to the sampling copy after the rollout.
pub const TRAIN_SAMPLER_DECAY: &str = "train/sampler_decay";

/// DPOK's learned value baseline: the fit's loss (the mean of its minibatches' MSEs, before
/// its optimizer step).
pub const TRAIN_VALUE_LOSS: &str = "train/value_loss";
/// DPOK's learned value baseline: the mean predicted value `V` over the rollout's trained
/// transitions.
pub const TRAIN_VALUE_MEAN: &str = "train/value_mean";
/// DPOK's learned value baseline: the mean advantage `r - V` over the trained transitions.
pub const TRAIN_VALUE_ADVANTAGE_MEAN: &str = "train/value_advantage_mean";
/// DPOK's learned value baseline: the population std of `r - V` over the trained transitions.
pub const TRAIN_VALUE_ADVANTAGE_STD: &str = "train/value_advantage_std";
/// DPOK's learned value baseline: rows its replay buffer holds after the rollout.
pub const TRAIN_VALUE_BUFFER_ROWS: &str = "train/value_buffer_rows";

/// The lowest of the rollout's trained steps as the plan drew them (a per-rollout resample's
/// draw, a sliding window's position; under deterministic rollouts, the training timesteps'
/// steps); NaN when the plan drew none.
pub const ROLLOUT_FIRST_TRAINED_STEP: &str = "rollout/first_trained_step";
/// The highest of the rollout's trained steps (see [`ROLLOUT_FIRST_TRAINED_STEP`]).
pub const ROLLOUT_LAST_TRAINED_STEP: &str = "rollout/last_trained_step";

/// Metric names logged only when a configured term, option or algorithm produces them.
pub const OPTIONAL: &[&str] = &[
    TRAIN_KL_REF,
    TRAIN_KL_EMA,
    TRAIN_NFT_POSITIVE_ERROR,
    TRAIN_NFT_NEGATIVE_ERROR,
    TRAIN_NFT_OPTIMALITY_MEAN,
    TRAIN_SAMPLER_DECAY,
    TRAIN_DPO_IMPLICIT_ACCURACY,
    TRAIN_DPO_MODEL_MARGIN,
    TRAIN_DPO_REFERENCE_MARGIN,
    TRAIN_DPO_PAIRS,
    TRAIN_RAFT_SELECTED,
    TRAIN_RAFT_ERROR,
    TRAIN_SPO_RATIO_MEAN,
    TRAIN_SPO_RATIO_MAX_DEVIATION,
    TRAIN_VALUE_LOSS,
    TRAIN_VALUE_MEAN,
    TRAIN_VALUE_ADVANTAGE_MEAN,
    TRAIN_VALUE_ADVANTAGE_STD,
    TRAIN_VALUE_BUFFER_ROWS,
];

/// CPU seconds (user + system, every thread) this process has spent since [`crate::Run::run`]
/// started on rollouts, scoring, updates and checkpoints, evaluations excluded, at the end of
/// the rollout: the axis the algorithm comparison charges methods on. NaN where the platform
/// cannot say.
pub const PERF_TRAIN_CPU_SECONDS: &str = "perf/train_cpu_seconds";

/// Every fixed metric name the run logs each rollout (the evaluation's, the per-component
/// `reward/<c>_*` and the phase times are formed by the functions below).
pub const ALL: &[&str] = &[
    TRAIN_LOSS,
    TRAIN_RATIO_MEAN,
    TRAIN_RATIO_STD,
    TRAIN_RATIO_MIN,
    TRAIN_RATIO_MAX,
    TRAIN_CLIP_FRACTION,
    TRAIN_APPROX_KL,
    TRAIN_GRAD_NORM,
    TRAIN_LR,
    TRAIN_OPTIMIZER_STEPS,
    TRAIN_OPTIMIZER_SKIPS,
    TRAIN_NUM_MICROBATCHES,
    TRAIN_POLICY_VERSION,
    TRAIN_CHECKPOINT_FAILURES,
    TRAIN_LOGP_PARITY_MAX_ABS,
    REWARD_ADVANTAGE_MEAN,
    REWARD_ADVANTAGE_STD,
    REWARD_NUM_GROUPS,
    REWARD_GROUP_STD_MEAN,
    REWARD_DEGENERATE,
    REWARD_ZERO_STD_RATIO,
    TRAIN_PARAM_CHANGE,
    REWARD_FAILED_GROUPS,
    REWARD_SCORE_TIME,
    REWARD_SCORE_SAMPLES_PER_S,
    PERF_ROLLOUT_SAMPLES_PER_S,
    PERF_TRAIN_TRANSITIONS_PER_S,
    PERF_TRAIN_SAMPLES_PER_S,
    PERF_TRAIN_CPU_SECONDS,
    ROLLOUT_FIRST_TRAINED_STEP,
    ROLLOUT_LAST_TRAINED_STEP,
];

/// `reward/<component>_<stat>`, e.g. `reward/pickscore_mean`.
///
/// ```
/// assert_eq!(trainer_fsdp::names::reward_component("pickscore", "mean"), "reward/pickscore_mean");
/// ```
pub fn reward_component(component: &str, stat: &str) -> String {
    format!("reward/{component}_{stat}")
}

/// `eval/judge/<component>`: the held-out mean of a component of `eval.judges` (its standard
/// error is the same name with `_se`).
///
/// ```
/// assert_eq!(trainer_fsdp::names::eval_judge("shapes_rerender"), "eval/judge/shapes_rerender");
/// ```
pub fn eval_judge(component: &str) -> String {
    format!("eval/judge/{component}")
}

/// `perf/<phase>_time`, seconds spent in a phase (`rollout`, `reward`, `train`, `checkpoint`,
/// `eval`).
///
/// ```
/// assert_eq!(trainer_fsdp::names::phase_time("rollout"), "perf/rollout_time");
/// ```
pub fn phase_time(phase: &str) -> String {
    format!("perf/{phase}_time")
}

/// Whether a metric measures time or throughput (`perf/*`, `reward/score_time`,
/// `reward/score_samples_per_s`): the values that differ between two runs that are otherwise
/// bit for bit the same.
///
/// ```
/// use trainer_fsdp::names;
/// assert!(names::is_timing(names::REWARD_SCORE_TIME) && names::is_timing("perf/train_time"));
/// assert!(!names::is_timing(names::TRAIN_LOSS));
/// ```
pub fn is_timing(name: &str) -> bool {
    name.starts_with("perf/") || name == REWARD_SCORE_TIME || name == REWARD_SCORE_SAMPLES_PER_S
}

/// How one rank's value of a metric of a multi-rank run combines with the others' into the
/// logged value ([`rank_reduction`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankReduction {
    /// The mean over ranks: per-sample means over equal shares (losses, fractions, margins).
    Mean,
    /// The sum: counts and throughputs.
    Sum,
    /// The smallest value.
    Min,
    /// The largest: extremes, and times (the slowest rank holds the others up).
    Max,
    /// A standard deviation over equal shares, pooled with its `<prefix>_mean` sibling:
    /// `sqrt(mean_r(std_r^2 + (mean_r - mean)^2))` (the population std of the union; the mean
    /// of the stds where the sibling is missing).
    PooledStd,
    /// Equal on every rank by construction (computed after the all-reduce, or from the shared
    /// schedule): the IO rank's value.
    Same,
}

/// How a rank-local metric combines over ranks.
///
/// ```
/// use trainer_fsdp::names::{self, RankReduction};
/// assert_eq!(names::rank_reduction(names::TRAIN_LOSS), RankReduction::Mean);
/// assert_eq!(names::rank_reduction(names::TRAIN_RATIO_MIN), RankReduction::Min);
/// assert_eq!(names::rank_reduction(names::PERF_TRAIN_SAMPLES_PER_S), RankReduction::Sum);
/// assert_eq!(names::rank_reduction("perf/rollout_time"), RankReduction::Max);
/// assert_eq!(names::rank_reduction(names::TRAIN_GRAD_NORM), RankReduction::Same);
/// assert_eq!(names::rank_reduction(names::TRAIN_RATIO_STD), RankReduction::PooledStd);
/// ```
pub fn rank_reduction(name: &str) -> RankReduction {
    const SAME: &[&str] = &[
        TRAIN_GRAD_NORM,
        TRAIN_LR,
        TRAIN_OPTIMIZER_STEPS,
        TRAIN_OPTIMIZER_SKIPS,
        TRAIN_POLICY_VERSION,
        TRAIN_CHECKPOINT_FAILURES,
        TRAIN_SAMPLER_DECAY,
        PERF_TRAIN_CPU_SECONDS,
        ROLLOUT_FIRST_TRAINED_STEP,
        ROLLOUT_LAST_TRAINED_STEP,
    ];
    const SUM: &[&str] = &[TRAIN_NUM_MICROBATCHES, TRAIN_DPO_PAIRS, TRAIN_RAFT_SELECTED];
    if SAME.contains(&name) {
        RankReduction::Same
    } else if SUM.contains(&name) || name.ends_with("_per_s") {
        RankReduction::Sum
    } else if name.ends_with("_std") {
        RankReduction::PooledStd
    } else if name.ends_with("_min") {
        RankReduction::Min
    } else if name.ends_with("_max") || name.contains("_max_") || name.ends_with("_time") {
        RankReduction::Max
    } else {
        RankReduction::Mean
    }
}
