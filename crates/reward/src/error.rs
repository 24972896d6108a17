//! The one error type of `reward`, and the structured reports it carries.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

use crate::scorer::Input;

/// One problem with a configuration value: what was given and what is allowed.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigProblem {
    /// The field (e.g. `vision_config.patch_size`, `weights.pickscore`).
    pub field: String,
    /// The value given, printed.
    pub given: String,
    /// What is allowed.
    pub allowed: String,
}

impl ConfigProblem {
    pub(crate) fn new(
        field: impl Into<String>,
        given: impl fmt::Display,
        allowed: impl Into<String>,
    ) -> Self {
        Self {
            field: field.into(),
            given: given.to_string(),
            allowed: allowed.into(),
        }
    }
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} = {} (allowed: {})",
            self.field, self.given, self.allowed
        )
    }
}

pub use model_weights::{DtypeProblem, ShapeMismatch, WeightReport};

/// Why one group of a combination failed (see [`crate::combine`]).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupFailureSummary {
    /// The group id.
    pub group: usize,
    /// The problems, printed (`sample 3: pickscore missing`).
    pub problems: Vec<String>,
}

fn join<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Everything that can go wrong in `reward`.
///
/// IO, configuration, data and service problems are returned; a tensor-shape mistake by the
/// programmer (e.g. pixel values whose size disagrees with the model's image size) panics with
/// a precise message.
#[derive(Debug, Error)]
pub enum RewardError {
    /// A configuration is invalid; every problem is listed.
    #[error("invalid {what} configuration: {}", join(problems))]
    InvalidConfig {
        /// What was being configured (`CLIP`, `combination`, `remote scorer`, ...).
        what: &'static str,
        /// The problems, each with the value given and what is allowed.
        problems: Vec<ConfigProblem>,
    },

    /// A configuration file is invalid; every problem is listed.
    #[error("invalid {what} in {}: {}", path.display(), join(problems))]
    InvalidConfigFile {
        /// The file.
        path: PathBuf,
        /// What it configures (`CLIP config.json`, ...).
        what: &'static str,
        /// The problems, each with the value given and what is allowed.
        problems: Vec<ConfigProblem>,
    },

    /// A batch was built with no input at all.
    #[error("a batch needs at least one input (images, prompts or metadata)")]
    EmptyBatchInputs,

    /// The inputs of a batch have different lengths.
    #[error("batch input {input} has {found} entries, the batch has {expected}")]
    BatchLength {
        /// The input whose length disagrees.
        input: Input,
        /// The batch length (that of the first input given).
        expected: usize,
        /// The length of this input.
        found: usize,
    },

    /// A scorer needs an input the batch does not carry.
    #[error("scorer {scorer} needs input {input}, which the batch does not carry")]
    MissingInput {
        /// The scorer.
        scorer: String,
        /// The input it needs.
        input: Input,
    },

    /// A scorer returned a different number of results than samples it was given.
    #[error("scorer {scorer} returned {found} results for {expected} samples")]
    ScorerOutputLength {
        /// The scorer.
        scorer: String,
        /// Samples given.
        expected: usize,
        /// Results returned.
        found: usize,
    },

    /// An image buffer does not hold `width * height * 3` bytes, or has a zero side.
    #[error("image {index}: {width}x{height} RGB needs {expected} bytes, got {found}")]
    ImageSize {
        /// The image's position in its batch (0 for a single image).
        index: usize,
        /// Width in pixels.
        width: usize,
        /// Height in pixels.
        height: usize,
        /// `width * height * 3` (0 when a side is zero).
        expected: usize,
        /// Bytes given.
        found: usize,
    },

    /// A float image holds a NaN or an infinity, which has no 8-bit value.
    #[error("image {index}: non-finite value {value} at element {element}")]
    NonFiniteImage {
        /// The image's position in its batch.
        index: usize,
        /// The flat element index in the image's `[3, H, W]` data.
        element: usize,
        /// The value.
        value: f32,
    },

    /// An image is too large for the format it is encoded to.
    #[error("{format}: image {width}x{height} exceeds the format's limit of {max} per side")]
    ImageTooLarge {
        /// The format (`JPEG`).
        format: &'static str,
        /// Width in pixels.
        width: usize,
        /// Height in pixels.
        height: usize,
        /// The largest side allowed.
        max: usize,
    },

    /// A prompt is not a sentence of the shapes world's grammar.
    #[error("prompt {prompt:?} is outside the shapes grammar at word {word}: found {}, expected {expected}", found.as_deref().map(|w| format!("{w:?}")).unwrap_or_else(|| "the end of the prompt".into()))]
    PromptOutsideGrammar {
        /// The prompt.
        prompt: String,
        /// Index of the offending word (0-based; the word count when the prompt ended early).
        word: usize,
        /// The word found, or `None` at the end of the prompt.
        found: Option<String>,
        /// What the grammar allows there.
        expected: &'static str,
    },

    /// A scene of the shapes world breaks its rules (counts, object total, ambiguity); every
    /// problem is listed.
    #[error("invalid shapes scene {scene}: {}", join(problems))]
    InvalidScene {
        /// The scene, printed.
        scene: String,
        /// The problems.
        problems: Vec<ConfigProblem>,
    },

    /// Checkpoint tensors do not fit the model; every problem is listed by key.
    #[error("checkpoint {path} does not fit the model: {report}")]
    Weights {
        /// The checkpoint (file or directory).
        path: PathBuf,
        /// Missing, unexpected, mis-shaped and unconvertible keys.
        report: WeightReport,
    },

    /// No checkpoint was found where one was expected.
    #[error(
        "no transformers checkpoint in {dir}: expected model.safetensors or model.safetensors.index.json"
    )]
    NoCheckpoint {
        /// The directory searched.
        dir: PathBuf,
    },

    /// A sharded index names a tensor its shard does not hold, or two shards hold one key.
    #[error("{path}: key {key} is in the index but not in shard {shard}")]
    IndexMismatch {
        /// The index file.
        path: PathBuf,
        /// The key.
        key: String,
        /// The shard file the index names for it.
        shard: String,
    },

    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },

    /// A JSON file could not be parsed.
    #[error("{path}: invalid JSON: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },

    /// A JSON file parsed but a field has the wrong type.
    #[error("{path}: field {field}: expected {expected}")]
    JsonField {
        /// The file.
        path: PathBuf,
        /// The field (dotted path).
        field: String,
        /// What was expected.
        expected: &'static str,
    },

    /// A safetensors file is malformed.
    #[error("{path}: invalid safetensors file: {source}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: safetensors::SafeTensorError,
    },

    /// The `tokenizers` library could not load a `tokenizer.json` or encode a prompt.
    #[error("{path}: tokenizer: {source}")]
    Tokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// A special token the CLIP text model needs is not in the tokenizer's vocabulary.
    #[error("{path}: special token {token:?} is not in the vocabulary")]
    MissingToken {
        /// The tokenizer file.
        path: PathBuf,
        /// The token.
        token: String,
    },

    /// A token id is outside the text model's vocabulary.
    #[error("token id {id} is outside the text model's vocabulary of {vocab_size}")]
    TokenOutOfVocabulary {
        /// The id.
        id: u32,
        /// The text model's `vocab_size`.
        vocab_size: usize,
    },

    /// A batch of token sequences to embed is empty.
    #[error("the text model needs at least one token sequence, got an empty batch")]
    EmptyTokenBatch,

    /// The rows of a token batch have different lengths (a batch is one `[batch, seq]` tensor).
    #[error("token row {row} has {found} ids, row 0 has {expected}: rows must have equal length")]
    RaggedTokenRows {
        /// The first row whose length differs from row 0's.
        row: usize,
        /// Row 0's length.
        expected: usize,
        /// This row's length.
        found: usize,
    },

    /// A token sequence is empty or longer than the text model has positions for.
    #[error(
        "token sequence length {length} is outside 1..={max} (the text model's max_position_embeddings)"
    )]
    TokenSequenceLength {
        /// The sequence length given.
        length: usize,
        /// The text model's `max_position_embeddings`.
        max: usize,
    },

    /// A decoded-image tensor does not have 3 (RGB) channels.
    #[error("decoded images must be [batch, 3, H, W], got {shape:?} ({channels} channels)")]
    ImageChannels {
        /// The channels found.
        channels: usize,
        /// The tensor's shape `[batch, channels, H, W]`.
        shape: [usize; 4],
    },

    /// A PNG could not be encoded.
    #[error("PNG encoding failed: {source}")]
    Png {
        /// The cause.
        #[source]
        source: png::EncodingError,
    },

    /// The scorer service did not answer within the timeout, on every attempt.
    #[error("scorer service {url} timed out after {timeout:?} on each of {attempts} attempts")]
    RemoteTimeout {
        /// The endpoint.
        url: String,
        /// The per-request timeout.
        timeout: Duration,
        /// Attempts made (1 + retries).
        attempts: u32,
    },

    /// The scorer service could not be reached (connection refused, reset, DNS), on every
    /// attempt.
    #[error("scorer service {url} unreachable after {attempts} attempts: {source}")]
    RemoteTransport {
        /// The endpoint.
        url: String,
        /// Attempts made.
        attempts: u32,
        /// The last cause (a `ureq::Transport` or an IO error while reading the body).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// The scorer service answered with a non-success HTTP status (after the retries allowed
    /// for 5xx answers).
    #[error("scorer service {url} answered HTTP {status} (after {attempts} attempts): {body}")]
    RemoteStatus {
        /// The endpoint.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The start of the response body (at most 512 bytes).
        body: String,
        /// Attempts made.
        attempts: u32,
    },

    /// The scorer service's answer is not JSON.
    #[error("scorer service {url} answered malformed JSON ({source}): {body}")]
    RemoteJson {
        /// The endpoint.
        url: String,
        /// The parse error.
        #[source]
        source: serde_json::Error,
        /// The start of the response body (at most 512 bytes).
        body: String,
    },

    /// The scorer service's JSON does not have the agreed layout.
    #[error("scorer service {url}: {problem}")]
    RemoteProtocol {
        /// The endpoint.
        url: String,
        /// What is wrong (e.g. `"components" is not an object`).
        problem: String,
    },

    /// A component the scorer service must return is absent from its answer.
    #[error("scorer service {url} did not return component {component}")]
    RemoteMissingComponent {
        /// The endpoint.
        url: String,
        /// The component.
        component: String,
    },

    /// A component of the scorer service's answer has the wrong number of values.
    #[error(
        "scorer service {url}: component {component} has {found} values for {expected} samples"
    )]
    RemoteBatchLength {
        /// The endpoint.
        url: String,
        /// The component.
        component: String,
        /// Samples sent.
        expected: usize,
        /// Values returned.
        found: usize,
    },

    /// A value of the scorer service's answer is not a finite number.
    #[error(
        "scorer service {url}: component {component}, sample {sample}: {value} is not a finite number"
    )]
    RemoteNonFinite {
        /// The endpoint.
        url: String,
        /// The component.
        component: String,
        /// The sample index within the request.
        sample: usize,
        /// The value as sent (JSON text).
        value: String,
    },

    /// Groups failed a combination and the caller asked for all of them
    /// ([`crate::combine::CombinedRewards::require_all`]).
    #[error("{} reward group(s) failed: {}", failures.len(), failures.iter().map(|f| format!("group {}: {}", f.group, f.problems.join(", "))).collect::<Vec<_>>().join("; "))]
    GroupsFailed {
        /// Each failed group and its problems.
        failures: Vec<GroupFailureSummary>,
    },

    /// A [`crate::shapes::RenderOptions`] field is outside what
    /// [`crate::shapes::render`] can draw with.
    #[error("render option {field} = {value} is outside the allowed range: {allowed}")]
    InvalidRenderOption {
        /// The field (`size`, `min_object`, `max_object`).
        field: &'static str,
        /// The value given, printed.
        value: String,
        /// What is allowed (e.g. `at least 16`).
        allowed: String,
    },
}

impl RewardError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        RewardError::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn config(what: &'static str, problems: Vec<ConfigProblem>) -> Result<(), Self> {
        if problems.is_empty() {
            Ok(())
        } else {
            Err(RewardError::InvalidConfig { what, problems })
        }
    }

    pub(crate) fn config_file(
        path: impl Into<PathBuf>,
        what: &'static str,
        problems: Vec<ConfigProblem>,
    ) -> Result<(), Self> {
        if problems.is_empty() {
            Ok(())
        } else {
            Err(RewardError::InvalidConfigFile {
                path: path.into(),
                what,
                problems,
            })
        }
    }
}

/// The shared loader's errors, as the variants this crate has always returned (a tensor read
/// that is absent or not a float is a one-key [`RewardError::Weights`] report).
impl From<model_weights::WeightsError> for RewardError {
    fn from(e: model_weights::WeightsError) -> Self {
        use model_weights::WeightsError as W;
        match e {
            W::Io { path, source } => RewardError::Io { path, source },
            W::Json { path, source } => RewardError::Json { path, source },
            W::JsonField {
                path,
                field,
                expected,
            } => RewardError::JsonField {
                path,
                field: field.into(),
                expected,
            },
            W::Safetensors { path, source } => RewardError::Safetensors { path, source },
            W::NoCheckpoint { dir, .. } => RewardError::NoCheckpoint { dir },
            W::IndexMismatch { path, key, shard } => {
                RewardError::IndexMismatch { path, key, shard }
            }
            W::DuplicateKey {
                path,
                key,
                first,
                second,
            } => RewardError::IndexMismatch {
                path,
                key,
                shard: format!("{} (also in {})", second.display(), first.display()),
            },
            W::MissingTensor { path, key } => RewardError::Weights {
                path,
                report: WeightReport {
                    missing: vec![key],
                    ..WeightReport::default()
                },
            },
            W::UnsupportedDtype { path, key, dtype } => RewardError::Weights {
                path,
                report: WeightReport {
                    unsupported_dtype: vec![DtypeProblem { key, dtype }],
                    ..WeightReport::default()
                },
            },
            W::Weights { path, report } => RewardError::Weights { path, report },
        }
    }
}
