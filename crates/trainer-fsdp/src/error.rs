//! The one error type of `trainer-fsdp`.

use std::fmt;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::config::{OverrideProblem, PreflightProblem};

/// Everything that can go wrong in the training loop's infrastructure. Configuration problems
/// are listed all at once ([`TrainerError::Preflight`]); IO problems name the file and the
/// operation; a checkpoint that cannot be trusted says why.
#[derive(Debug, Error)]
pub enum TrainerError {
    /// A filesystem operation failed.
    #[error("cannot {op} {path}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },

    /// A config is not valid TOML, misses a required key, has an unknown key or a wrong type.
    #[error("config {origin} is not a valid training config")]
    ConfigParse {
        /// The file, `<memory>` or `<overrides>`.
        origin: PathBuf,
        /// The parser's error (it names the key).
        #[source]
        source: Box<toml::de::Error>,
    },

    /// A config's keys do not make a training config: every problem found, section by
    /// section (unknown keys, missing keys or sections, wrong types).
    #[error(
        "config {} is not a valid training config ({} problem(s)):{}",
        origin.display(),
        problems.len(),
        Bullets(problems)
    )]
    ConfigInvalid {
        /// The file, `<memory>` or `<overrides>`.
        origin: PathBuf,
        /// One line per problem.
        problems: Vec<String>,
    },

    /// The resolved config could not be written as TOML.
    #[error("cannot serialise the training config as TOML")]
    ConfigSerialize {
        /// The serialiser's error.
        #[source]
        source: toml::ser::Error,
    },

    /// A config uses keys that moved to another section.
    #[error("config {origin} uses keys that moved:{}", Moved(moved))]
    MovedKeys {
        /// The file, `<memory>` or `<overrides>`.
        origin: PathBuf,
        /// `(old key, where it is now)` for every such key.
        moved: Vec<(String, String)>,
    },

    /// A `key=value` override is malformed.
    #[error("override {given:?}: {problem}")]
    Override {
        /// The override as given.
        given: String,
        /// What is wrong.
        problem: OverrideProblem,
    },

    /// A recipe name that does not exist.
    #[error("unknown recipe {given}; known recipes: {}", known.join(", "))]
    UnknownRecipe {
        /// The name given.
        given: String,
        /// The known names.
        known: Vec<&'static str>,
    },

    /// Preflight validation failed; every problem is listed.
    #[error("training config validation failed ({} problem(s)):{}", problems.len(), Bullets(problems))]
    Preflight {
        /// All problems found.
        problems: Vec<PreflightProblem>,
    },

    /// A rollout artifact (a trajectory sidecar, the artifact layout) could not be written or
    /// read. Files the trainer writes itself (checkpoints, PNGs, the resolved config) fail as
    /// [`TrainerError::Io`].
    #[error(transparent)]
    Artifact(#[from] trajectory::TrajectoryError),

    /// A sampling or replay step was refused by the kernel, the solver or the schedule.
    #[error("sampling step: {0}")]
    Sde(Box<sde_math::SdeError>),

    /// A schedule or trained-step plan was refused.
    #[error(transparent)]
    Schedule(Box<schedule::ScheduleError>),

    /// Initial or per-step noise could not be made.
    #[error(transparent)]
    Noise(Box<noise_recipe::NoiseError>),

    /// A model-crate operation failed (loading, export, LoRA, contract).
    #[error(transparent)]
    Model(Box<dit_models::DitError>),

    /// A scorer or image conversion failed.
    #[error(transparent)]
    Reward(Box<reward::RewardError>),

    /// A Qwen-Image component (tokenizer, text encoder, VAE, the directory's index) failed to
    /// load or run.
    #[error(transparent)]
    QwenImage(Box<qwen_image::QwenImageError>),

    /// A setting does not fit the loaded model (an image size the VAE and patch cannot
    /// tile, components of a directory that do not belong together, a missing prompt file).
    #[error("{key} = {given}: expected {expected}")]
    Incompatible {
        /// The setting or component.
        key: &'static str,
        /// What it is.
        given: String,
        /// What would fit.
        expected: String,
    },

    /// The configured generator cannot be trained by this build.
    #[error("generator {generator} cannot be trained yet: missing {missing}")]
    GeneratorUnsupported {
        /// The generator configured.
        generator: String,
        /// What is missing.
        missing: &'static str,
    },

    /// The `lora.init_from` adapter is not what preflight read (it changed on disk since).
    #[error("lora.init_from = {path}: the adapter changed since preflight read it (now: {found})")]
    InitAdapterChanged {
        /// The adapter.
        path: PathBuf,
        /// What is there now.
        found: String,
    },

    /// An export's source is not a run directory or committed checkpoint, or names none.
    #[error("export from {path}: {problem}")]
    ExportSource {
        /// The path given.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },

    /// An export request asks for something its form does not take.
    #[error("export: {problem}")]
    ExportRequest {
        /// What is wrong.
        problem: String,
    },

    /// An export's output directory cannot be used.
    #[error("export to {path}: {problem}")]
    ExportTarget {
        /// The output directory.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },

    /// The world, or the run's trainable mode, has no such export.
    #[error("{world} cannot export the {form} form: {reason}")]
    ExportUnsupported {
        /// The world's name.
        world: String,
        /// The form asked for.
        form: &'static str,
        /// Why.
        reason: String,
    },

    /// A reloaded export's forward differs from the checkpoint's; nothing was published.
    #[error(
        "export verification failed: {reloaded_as} differs from the checkpoint's policy by {max_abs:e} \
         (tolerance {tolerance:e}); nothing was written to the output directory"
    )]
    ExportVerify {
        /// How the export was reloaded.
        reloaded_as: String,
        /// The largest absolute difference (NaN when non-finite).
        max_abs: f64,
        /// The tolerance.
        tolerance: f64,
    },

    /// A model configuration file is missing or invalid.
    #[error("model config {path}: {source}")]
    ModelConfig {
        /// The file.
        path: PathBuf,
        /// burn's error.
        #[source]
        source: burn::config::ConfigError,
    },

    /// A prompt the shapes world's tokenizer cannot encode.
    #[error("prompt {prompt:?}: {problem}")]
    PromptVocabulary {
        /// The prompt.
        prompt: String,
        /// What is wrong with it.
        problem: String,
    },

    /// More distinct training prompts were asked for than the world has outside the held-out
    /// set.
    #[error(
        "prompts_per_rollout = {requested}, but only {available} distinct prompts exist outside the held-out set"
    )]
    PromptPoolExhausted {
        /// Prompts asked for.
        requested: usize,
        /// Distinct prompts available.
        available: usize,
    },

    /// A `[data]` prompt file the world cannot use; every problem listed.
    #[error("prompt file {path}: {}", problems.join("; "))]
    PromptFile {
        /// The file.
        path: PathBuf,
        /// Each problem (with its line where it has one).
        problems: Vec<String>,
    },

    /// `{ world = { components } }` in a world that has no reward of its own, or not one with
    /// these components.
    #[error(
        "reward.scorers asks for the world's own reward with components {components:?}, which this world does not have"
    )]
    NoWorldReward {
        /// The components asked for.
        components: Vec<String>,
    },

    /// The world was asked for the reference velocity of a policy that carries no reference
    /// of its own (a full fine-tune: no adapters to switch off). A run keeps a frozen
    /// pretrained copy for such a policy and asks that instead
    /// ([`crate::run::TrainContext::reference_velocity`]).
    #[error(
        "{keys} asks the {world} for the reference policy of a policy that carries none (the \
         reference is the policy with its LoRA adapters off, and this one has no adapters); keep a \
         frozen copy of the pretrained policy and evaluate that (TrainContext::reference_velocity)"
    )]
    NoReference {
        /// The world.
        world: String,
        /// What asks for the reference (the config keys and their values).
        keys: String,
    },

    /// The algorithm has a term against the EMA copy of the policy, and the run keeps none.
    #[error("{keys} measures the policy against its EMA copy, and the run has no [ema] section")]
    NoEma {
        /// What asks for the EMA (the config keys and their values).
        keys: String,
    },

    /// A trained (stochastic) step was asked of a deterministic sampler.
    #[error(
        "a trained SDE step was asked of a deterministic sampler (sampling.eta = 0 has no kernel: only an \
         objective on ODE rollouts, algorithm.kind = \"nft\", samples without one)"
    )]
    NoKernel,

    /// An algorithm that trains against the run's sampling copy was given none.
    #[error(
        "{algorithm} trains against the run's sampling copy of the policy, and the run keeps none"
    )]
    NoSamplingCopy {
        /// The algorithm.
        algorithm: &'static str,
    },

    /// An update asked for the frozen anchor of a rollout whose advantages were degenerate,
    /// for which none is recorded (nothing is trained then).
    #[error(
        "{algorithm}: an update of rollout {rollout} asked for the frozen anchor, but the rollout's \
         advantages were degenerate and none was recorded"
    )]
    NoAnchor {
        /// The algorithm.
        algorithm: &'static str,
        /// The rollout.
        rollout: u64,
    },

    /// A method, variant or per-entry override of an algorithm comparison
    /// ([`crate::compare::comparison_entries`]) that cannot be run.
    #[error("comparison entry {given:?}: {problem}")]
    ComparisonEntry {
        /// The entry as given.
        given: String,
        /// What is wrong, and what is expected.
        problem: String,
    },

    /// A learned value baseline ([`crate::value`]) given inputs it cannot take.
    #[error("value baseline: {problem}")]
    InvalidValueBaseline {
        /// What is wrong, with the values involved.
        problem: String,
    },

    /// An algorithm name no `[algorithm] kind` has.
    #[error("unknown algorithm {given:?}; the algorithms are {known}")]
    UnknownAlgorithm {
        /// The name given.
        given: String,
        /// The known names.
        known: String,
    },

    /// A comparison's curves file ([`crate::compare::read_curves_csv`]) that cannot be read
    /// back.
    #[error("{path}, line {line}: {problem}")]
    CurvesCsv {
        /// The file.
        path: PathBuf,
        /// The 1-based line.
        line: usize,
        /// What is wrong, and what is expected.
        problem: String,
    },

    /// A metrics log without any evaluation.
    #[error("{path} holds no held-out evaluation (eval/reward): the run was never evaluated")]
    NoEvaluations {
        /// The log.
        path: PathBuf,
    },

    /// A held-out evaluation asked for no samples.
    #[error(
        "a held-out evaluation of 0 seeds per prompt measures nothing: expected at least 1 (eval.samples_per_prompt)"
    )]
    NoEvalSamples,

    /// A component of `eval.judges` was missing from a held-out sample's scores.
    #[error(
        "eval.judges asks for component {component:?}, which the scorers of the {world} did \
         not give every held-out sample; expected a world scoring with reward.scorers and \
         eval.judges together (TrainConfig::all_scorers), or eval.judges = []"
    )]
    EvalJudgeMissing {
        /// The component.
        component: String,
        /// The world, as it names itself.
        world: String,
    },

    /// An evaluation was asked to take SDE transitions under a sampler without a kernel.
    #[error(
        "an evaluation with SDE transitions at steps {steps:?} needs the rollouts' kernel, and this \
         sampler has none (deterministic rollouts): expected eval.sampling = \"ode\""
    )]
    EvalNoiseWithoutKernel {
        /// The steps asked for.
        steps: Vec<usize>,
    },

    /// A world was asked to score with no scorer.
    #[error("reward.scorers is empty: a sample scored by nothing would train on 0")]
    NoScorer,

    /// A world's scorers returned another number of results than samples.
    #[error("the scorers returned {found} results for {expected} samples")]
    ScoreCount {
        /// Samples scored.
        expected: usize,
        /// Results returned.
        found: usize,
    },

    /// The ranks of a run cannot share the prompt groups of a rollout equally.
    #[error(
        "{groups} prompt groups per rollout cannot be shared equally by {world_size} ranks in each of {updates} updates: expected a multiple of updates x ranks = {} (each rank rolls out whole groups of every update)",
        updates * world_size
    )]
    GroupsNotDivisible {
        /// Prompt groups per rollout.
        groups: usize,
        /// Updates per rollout.
        updates: usize,
        /// Ranks.
        world_size: usize,
    },

    /// A collective operation between the ranks failed (a rank that ended, a mismatch of the
    /// operations the ranks issued, the collective runtime itself).
    #[error("rank {rank} of {world_size}: the collective `{operation}` failed: {cause}")]
    Collective {
        /// This rank.
        rank: usize,
        /// Ranks in the run.
        world_size: usize,
        /// What was being exchanged.
        operation: String,
        /// The collective runtime's error, or what did not match.
        cause: String,
    },

    /// Another rank of the run failed, so this one stopped too.
    #[error("rank {rank} of {world_size} failed: {message}")]
    RankFailed {
        /// The rank that failed first.
        rank: usize,
        /// Ranks in the run.
        world_size: usize,
        /// Its error or panic message.
        message: String,
    },

    /// A trained step index is outside the schedule.
    #[error("trained step {step} is outside a {steps}-step schedule")]
    TrainedStepOutOfRange {
        /// The step index.
        step: usize,
        /// The schedule's number of steps.
        steps: usize,
    },

    /// A replay of per-sample step subsets was given positions it cannot take.
    #[error(
        "replay of per-sample steps: sample {sample} was given positions {positions:?} of {stored} stored trained steps; expected {expected}"
    )]
    ReplayColumns {
        /// The sample's offset in the replayed range.
        sample: usize,
        /// Its positions.
        positions: Vec<usize>,
        /// The stored trained steps of the rollout.
        stored: usize,
        /// What was expected.
        expected: String,
    },

    /// Trajectories replayed in one batch disagree on a trained step's noise levels (a
    /// rollout's trajectories share one schedule and one set of trained steps).
    #[error(
        "trajectories replayed together disagree on trained step {trained}: sigmas {first:?} in the first, {other:?} in trajectory {trajectory}"
    )]
    ReplaySigmas {
        /// The trained-step position.
        trained: usize,
        /// `(sigma, sigma_next)` of the first trajectory.
        first: (f32, f32),
        /// `(sigma, sigma_next)` of the disagreeing one.
        other: (f32, f32),
        /// Its index in the rollout batch.
        trajectory: usize,
    },

    /// An objective on the forward process found a trajectory without the clean endpoints it
    /// trains on (the rollout did not record them).
    #[error(
        "rollout {rollout}, group {group}: the trajectory has no clean endpoints (tracks.endpoint), which this objective trains on"
    )]
    MissingEndpoint {
        /// The rollout.
        rollout: u64,
        /// The group in the rollout.
        group: usize,
    },

    /// A trajectory's clean endpoints do not have the world's latent shape.
    #[error(
        "rollout {rollout}, group {group}: clean endpoints of shape {found:?}, expected [candidates, {expected:?}]"
    )]
    EndpointShape {
        /// The rollout.
        rollout: u64,
        /// The group in the rollout.
        group: usize,
        /// The stored shape.
        found: Vec<usize>,
        /// The world's per-candidate latent shape.
        expected: Vec<usize>,
    },

    /// An update asked the frozen anchor for samples it did not record (an anchor keeps the
    /// plan's micro-batches).
    #[error(
        "the frozen anchor has no record of samples {start}..{end}: the updates' micro-batches must be the plan's"
    )]
    AnchorRange {
        /// The first sample asked for.
        start: usize,
        /// One past the last.
        end: usize,
    },

    /// A JSON file could not be written or parsed.
    #[error("{path} is not valid JSON for {what}")]
    Json {
        /// The file.
        path: PathBuf,
        /// What it should hold.
        what: &'static str,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },

    /// burn's recorder could not encode or decode a record.
    #[error("cannot {op} the {what} record {path}")]
    Record {
        /// The file.
        path: PathBuf,
        /// `encode` or `decode`.
        op: &'static str,
        /// `weights` or `optimizer`.
        what: &'static str,
        /// burn's error.
        #[source]
        source: burn::record::RecorderError,
    },

    /// A checkpoint directory cannot be trusted or used.
    #[error("checkpoint {dir}: {problem}")]
    Checkpoint {
        /// The checkpoint (or checkpoint root) directory.
        dir: PathBuf,
        /// What is wrong.
        problem: CheckpointProblem,
    },

    /// The adapter contract recorded in a checkpoint differs from the run's; resuming would
    /// silently train a different policy.
    #[error(
        "checkpoint {dir} was written with a different adapter: {}",
        Mismatches(mismatches)
    )]
    ContractMismatch {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Every field that differs.
        mismatches: Vec<dit_models::ContractMismatch>,
    },

    /// The saved trainable parameters do not match the model's.
    #[error(
        "weights {path} do not fit the model: missing {missing:?}, unexpected {unexpected:?}, mis-shaped {mismatched:?}"
    )]
    WeightsMismatch {
        /// The weights file.
        path: PathBuf,
        /// Trainable parameters of the model absent from the file.
        missing: Vec<String>,
        /// Parameters in the file the model does not have as trainable.
        unexpected: Vec<String>,
        /// `(path, shape and dtype in the file, shape and dtype in the model)`.
        mismatched: Vec<(String, String, String)>,
    },

    /// A module has no trainable parameter, so there is nothing to save or optimise.
    #[error("the module has no trainable parameter (every parameter is frozen)")]
    NoTrainableParameters,

    /// A trainable parameter is not stored in the configured master dtype.
    #[error(
        "trainable parameter {param} is stored as {found}, but model.master_dtype = {expected} (the optimizer's master copy)"
    )]
    MasterDtype {
        /// The parameter's module path.
        param: String,
        /// Its dtype.
        found: String,
        /// The configured master dtype.
        expected: String,
    },

    /// An advantage computation or the clipped objective failed.
    #[error(transparent)]
    FlowGrpo(#[from] flow_grpo::FlowGrpoError),

    /// A PNG could not be encoded.
    #[error("cannot encode PNG {path}")]
    Image {
        /// The file.
        path: PathBuf,
        /// The encoder's error.
        #[source]
        source: image::ImageError,
    },

    /// A plot or an image grid was asked for with unusable input.
    #[error("cannot draw {what}: {problem}")]
    Drawing {
        /// `reward curve` or `sample grid`.
        what: &'static str,
        /// What is wrong with the input.
        problem: DrawingProblem,
    },

    /// A TensorBoard event file is damaged.
    #[error("event file {path} is damaged at byte {offset}: {problem}")]
    EventFile {
        /// The file.
        path: PathBuf,
        /// Where the damaged record starts.
        offset: u64,
        /// What is wrong.
        problem: &'static str,
    },

    /// A metrics JSONL line is not a metrics record.
    #[error("{path}, line {line}: not a metrics record")]
    MetricsLine {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },

    /// A metric file does not hold what a checkpoint's metrics cursor keeps.
    #[error("{path}: {problem}")]
    MetricsCursor {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },

    /// Another run holds the run directory's lock.
    #[error(
        "run directory {dir} is in use by {holder}: one run at a time per directory; wait for \
         it, stop it, or choose another run directory"
    )]
    RunDirLocked {
        /// The run directory.
        dir: PathBuf,
        /// Who holds it ([`LockHolder`](crate::run_dir::LockHolder), as text).
        holder: String,
    },

    /// A fresh run into a directory that holds a run.
    #[error(
        "{dir} holds a run ({}); a fresh run would destroy it, so nothing was written: continue \
         it with --resume (checkpoint.resume = true), move it aside with --overwrite \
         (checkpoint.overwrite = true), or choose another run directory",
        Paths(found)
    )]
    RunDirNotEmpty {
        /// The run directory.
        dir: PathBuf,
        /// The run files found.
        found: Vec<PathBuf>,
    },

    /// A resume found no committed checkpoint.
    #[error(
        "nothing to resume: no committed checkpoint in {dir}{}; start afresh with --overwrite \
         (moves any old files aside), or let a resume start from scratch when nothing is \
         committed with checkpoint.allow_fresh = true",
        Found(found)
    )]
    NothingToResume {
        /// The checkpoint task directory.
        dir: PathBuf,
        /// Run files that exist all the same.
        found: Vec<PathBuf>,
    },

    /// `checkpoint.resume_from` names an iteration that is not committed.
    #[error(
        "checkpoint.resume_from = {iteration}: no committed checkpoint of that iteration in \
         {dir}; committed: {}",
        Iterations(committed)
    )]
    ResumeFromMissing {
        /// The checkpoint task directory.
        dir: PathBuf,
        /// The iteration asked for.
        iteration: u64,
        /// The committed iterations.
        committed: Vec<u64>,
    },

    /// The checkpoint a resume chose cannot be loaded.
    #[error("cannot resume from checkpoint {dir}: {cause}{}", Fallback(older))]
    ResumeFailed {
        /// The checkpoint's directory.
        dir: PathBuf,
        /// The committed iterations older than it.
        older: Vec<u64>,
        /// Why it cannot be loaded.
        cause: Box<TrainerError>,
    },

    /// A resume whose config changed keys that change results.
    #[error(
        "resume refused: the experiment differs from the one {path} records ({} \
         difference(s)):{}\nthese keys change results; allow the change with \
         --allow-config-changes (checkpoint.allow_config_changes = true), which records it in \
         the run directory",
        differences.len(),
        Bullets(differences)
    )]
    ConfigChanged {
        /// The stored resolved config.
        path: PathBuf,
        /// The differences that are refused.
        differences: Vec<crate::run_dir::ConfigDifference>,
    },

    /// A resume cannot check its config against the run it continues.
    #[error(
        "resume refused: {path} is missing, so an unchanged experiment cannot be checked; \
         allow it with --allow-config-changes (checkpoint.allow_config_changes = true)"
    )]
    ResumeConfigMissing {
        /// The missing stored config.
        path: PathBuf,
    },

    /// A stop request (Ctrl-C) interrupted a phase. [`Run::run`](crate::Run::run) handles it
    /// (the interrupted rollout is dropped and the last complete state kept); a caller sees it
    /// only from a phase method it called itself while the run's stop flag was set.
    #[error("stopped on request")]
    Stopped,

    /// The Ctrl-C / SIGTERM handler could not be installed.
    #[error("cannot install the {signal} handler")]
    Signal {
        /// The signal.
        signal: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// A text encoder's shape (the shapes world's `text_encoder.json`) cannot be built, or does
    /// not fit the transformer it conditions.
    #[error("text encoder shape {path}: {field} = {value}, expected {expected}")]
    TextEncoderShape {
        /// The shape file.
        path: PathBuf,
        /// The field (`heads`, `d_model`).
        field: &'static str,
        /// Its value.
        value: usize,
        /// What would fit.
        expected: String,
    },

    /// A bound of the global gradient-norm clip ([`crate::clip_grad_norm`],
    /// [`crate::PolicyOptimizer::new`]) that is not a finite value > 0.
    #[error(
        "{key} = {value}: expected a finite value > 0 (the bound of the global gradient-norm clip)"
    )]
    InvalidClipNorm {
        /// The argument or config key (`max_norm`, `optimizer.clip_grad`).
        key: &'static str,
        /// The value given.
        value: f64,
    },

    /// An evaluation's rewards are not one per held-out prompt and seed
    /// ([`crate::run::eval_statistics`]).
    #[error(
        "{rewards} evaluation rewards for {prompts} prompts of {samples_per_prompt} seeds each: expected one per prompt and seed ({prompts} x {samples_per_prompt})"
    )]
    EvalRewardCount {
        /// Rewards given.
        rewards: usize,
        /// Prompts (categories) given.
        prompts: usize,
        /// Seeds per prompt.
        samples_per_prompt: usize,
    },

    /// An export's output directory is, holds or lies inside the run it exports from, its
    /// checkpoints, or a model or file the export reads ([`crate::export::export`]): writing or
    /// replacing it (`--overwrite` deletes what it held) would destroy them. Refused before
    /// anything is written.
    #[error(
        "export to {out}: the output directory {relation} {what}, {input}; an export must lie apart from \
         the run it exports and everything it reads (with --overwrite the output directory is replaced \
         whole, deleting what it held): choose another --out"
    )]
    ExportOverlap {
        /// The output directory, as given.
        out: PathBuf,
        /// The path it overlaps, as given or configured.
        input: PathBuf,
        /// What that path is (e.g. "the run directory exported", "the base model directory
        /// (model.generator.shapes_world.dir)").
        what: String,
        /// How the output relates to it: `is`, `holds` or `lies inside`.
        relation: &'static str,
    },
}

impl TrainerError {
    /// Whether this is a run directory's refusal to start ([`Run::new`](crate::Run::new)'s
    /// checks: locked, holding another run, nothing or not that to resume, a changed
    /// experiment, damaged files to resume from): nothing was written.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            Self::RunDirLocked { .. }
                | Self::RunDirNotEmpty { .. }
                | Self::NothingToResume { .. }
                | Self::ResumeFromMissing { .. }
                | Self::ResumeFailed { .. }
                | Self::ConfigChanged { .. }
                | Self::ResumeConfigMissing { .. }
                | Self::MetricsCursor { .. }
        )
    }
}

struct Paths<'a>(&'a [PathBuf]);

impl fmt::Display for Paths<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}", p.display())?;
        }
        Ok(())
    }
}

struct Found<'a>(&'a [PathBuf]);

impl fmt::Display for Found<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            Ok(())
        } else {
            write!(f, " (though {} exist)", Paths(self.0))
        }
    }
}

struct Iterations<'a>(&'a [u64]);

impl fmt::Display for Iterations<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        let s: Vec<String> = self.0.iter().map(u64::to_string).collect();
        f.write_str(&s.join(", "))
    }
}

struct Fallback<'a>(&'a [u64]);

impl fmt::Display for Fallback<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.last() {
            None => f.write_str("; no older committed checkpoint to fall back on"),
            Some(last) => write!(
                f,
                "; older committed checkpoints: {}; resume from one with --resume-from {last} \
                 (checkpoint.resume_from = {last}), which moves the newer ones aside",
                Iterations(self.0)
            ),
        }
    }
}

struct Moved<'a>(&'a [(String, String)]);

impl fmt::Display for Moved<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (old, new) in self.0 {
            write!(f, "\n  - {old} is now {new}")?;
        }
        Ok(())
    }
}

/// Why a checkpoint cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointProblem {
    /// A file the caller asked the checkpoint to hold is named like one of the store's own
    /// (or is not a plain file name).
    ReservedName {
        /// The name.
        name: String,
    },
    /// The readable copy of the weights (e.g. `adapter_model.safetensors`) is not what the
    /// weights resume restored would write.
    ReadableCopyDiffers {
        /// The file.
        name: String,
    },
    /// There is no `COMMITTED` marker: the write never finished.
    NotCommitted,
    /// A file listed in `COMMITTED` is missing.
    MissingFile {
        /// The file name.
        name: String,
    },
    /// A file's length differs from the one `COMMITTED` recorded.
    SizeMismatch {
        /// The file name.
        name: String,
        /// Recorded length.
        recorded: u64,
        /// Length found.
        found: u64,
    },
    /// A file's content hash differs from the one `COMMITTED` recorded.
    HashMismatch {
        /// The file name.
        name: String,
        /// Recorded hash.
        recorded: String,
        /// Hash found.
        found: String,
    },
    /// A format tag this version does not read.
    Format {
        /// The file.
        name: String,
        /// The tag found.
        found: String,
        /// The tag expected.
        expected: &'static str,
    },
    /// The trainer state belongs to another iteration or task than its directory.
    StateMismatch {
        /// The field (`iteration`, `task`).
        field: &'static str,
        /// Value recorded in the state.
        recorded: String,
        /// Value implied by the directory.
        expected: String,
    },
    /// The checkpoint has an adapter contract and the run has none, or the other way round.
    TrainableModeMismatch {
        /// Whether the checkpoint records an adapter contract.
        checkpoint_has_adapter: bool,
        /// Whether the run expects one.
        run_has_adapter: bool,
    },
    /// A committed checkpoint newer than the one being written exists.
    NewerCheckpointExists {
        /// The iteration being written.
        writing: u64,
        /// The newer committed iteration.
        newer: u64,
    },
    /// The task name cannot be a directory name.
    InvalidTask {
        /// The task given.
        task: String,
    },
}

impl fmt::Display for CheckpointProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckpointProblem::ReservedName { name } => write!(
                f,
                "readable file {name:?} is named like a checkpoint file of the store's own (or is not a plain file name)"
            ),
            CheckpointProblem::ReadableCopyDiffers { name } => write!(
                f,
                "{name} differs from the weights restored from model.mpk (the two copies of the checkpoint disagree)"
            ),
            CheckpointProblem::NotCommitted => write!(
                f,
                "no COMMITTED marker (the write did not finish); resume never trusts it"
            ),
            CheckpointProblem::MissingFile { name } => {
                write!(f, "{name} is listed in COMMITTED but missing")
            }
            CheckpointProblem::SizeMismatch {
                name,
                recorded,
                found,
            } => write!(f, "{name} has {found} bytes, COMMITTED recorded {recorded}"),
            CheckpointProblem::HashMismatch {
                name,
                recorded,
                found,
            } => write!(
                f,
                "{name} has content hash {found}, COMMITTED recorded {recorded}"
            ),
            CheckpointProblem::Format {
                name,
                found,
                expected,
            } => write!(f, "{name} has format {found:?}, expected {expected:?}"),
            CheckpointProblem::StateMismatch {
                field,
                recorded,
                expected,
            } => write!(
                f,
                "trainer state records {field} {recorded}, but the directory is for {expected}"
            ),
            CheckpointProblem::TrainableModeMismatch {
                checkpoint_has_adapter,
                run_has_adapter,
            } => write!(
                f,
                "the checkpoint {} but this run {} (full fine-tune vs LoRA)",
                if *checkpoint_has_adapter {
                    "has an adapter contract"
                } else {
                    "has no adapter contract"
                },
                if *run_has_adapter {
                    "trains a LoRA adapter"
                } else {
                    "trains every parameter"
                }
            ),
            CheckpointProblem::NewerCheckpointExists { writing, newer } => write!(
                f,
                "writing iteration {writing} but committed iteration {newer} exists; resume from it or use a fresh \
                 checkpoint directory (resume would otherwise pick {newer})"
            ),
            CheckpointProblem::InvalidTask { task } => write!(
                f,
                "task {task:?} cannot name a directory (allowed: non-empty, ASCII letters, digits, `_`, `-`, `.`)"
            ),
        }
    }
}

/// Why a plot or grid cannot be drawn.
#[derive(Debug, Clone, PartialEq)]
pub enum DrawingProblem {
    /// No series or no tiles.
    Empty,
    /// A series has no finite point.
    NoFinitePoint {
        /// The series name.
        series: String,
    },
    /// A tile's size differs from the first tile's.
    TileSize {
        /// The tile index.
        index: usize,
        /// `(width, height)` of the first tile.
        expected: (u32, u32),
        /// `(width, height)` of this tile.
        found: (u32, u32),
    },
    /// More captions than tiles, or a zero column count or canvas size.
    Geometry {
        /// What is wrong.
        what: &'static str,
    },
}

impl fmt::Display for DrawingProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DrawingProblem::Empty => write!(f, "nothing to draw"),
            DrawingProblem::NoFinitePoint { series } => {
                write!(f, "series {series:?} has no finite point")
            }
            DrawingProblem::TileSize {
                index,
                expected,
                found,
            } => write!(
                f,
                "tile {index} is {}x{}, the first tile is {}x{}; all tiles must have one size",
                found.0, found.1, expected.0, expected.1
            ),
            DrawingProblem::Geometry { what } => write!(f, "{what}"),
        }
    }
}

struct Bullets<'a, T>(&'a [T]);

impl<T: fmt::Display> fmt::Display for Bullets<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in self.0 {
            write!(f, "\n  - {p}")?;
        }
        Ok(())
    }
}

struct Mismatches<'a>(&'a [dit_models::ContractMismatch]);

impl fmt::Display for Mismatches<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, m) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, "; ")?;
            }
            write!(
                f,
                "{} recorded {} but this run has {}",
                m.field, m.recorded, m.found
            )?;
        }
        Ok(())
    }
}

/// A failed durable write (checkpoint files, PNGs, the resolved config) names the file and the
/// operation.
impl From<durable::DurableError> for TrainerError {
    fn from(e: durable::DurableError) -> Self {
        TrainerError::Io {
            path: e.path,
            op: e.op,
            source: e.source,
        }
    }
}

/// A `map_err` helper: an IO error on `path` while doing `op`.
pub(crate) fn io_err(path: &Path, op: &'static str) -> impl FnOnce(std::io::Error) -> TrainerError {
    let path = path.to_path_buf();
    move |source| TrainerError::Io { path, op, source }
}

macro_rules! boxed_from {
    ($($variant:ident($ty:ty)),+ $(,)?) => {
        $(impl From<$ty> for TrainerError {
            fn from(e: $ty) -> Self {
                TrainerError::$variant(Box::new(e))
            }
        })+
    };
}

// Large lower-layer errors are boxed so a `Result<_, TrainerError>` stays small.
boxed_from!(
    Sde(sde_math::SdeError),
    Schedule(schedule::ScheduleError),
    Noise(noise_recipe::NoiseError),
    Model(dit_models::DitError),
    Reward(reward::RewardError),
    QwenImage(qwen_image::QwenImageError),
);
