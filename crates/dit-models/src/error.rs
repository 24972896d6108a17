//! The one error type of `dit-models`, and the structured reports it carries.

use std::fmt;
use std::path::PathBuf;

use thiserror::Error;

/// One problem with a configuration value: what was given and what is allowed.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigProblem {
    /// The field (e.g. `axes_dims_rope`).
    pub field: &'static str,
    /// The value given, printed.
    pub given: String,
    /// What is allowed.
    pub allowed: String,
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

/// One problem with a key of a `config.json`: the key, the value found, what is accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyProblem {
    /// The key.
    pub key: String,
    /// The value found, as JSON.
    pub given: String,
    /// What is accepted.
    pub expected: String,
}

impl fmt::Display for KeyProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} = {} (expected {})",
            self.key, self.given, self.expected
        )
    }
}

/// A field where an adapter contract and what is being loaded disagree.
#[derive(Debug, Clone, PartialEq)]
pub struct ContractMismatch {
    /// The contract field (`rank`, `alpha`, `dropout`, `target_modules`, `use_rslora`,
    /// `base_model_hash`).
    pub field: &'static str,
    /// The value the contract records (or the caller expects).
    pub recorded: String,
    /// The value found.
    pub found: String,
}

fn join<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Everything that can go wrong in `dit-models`.
///
/// IO, configuration and data problems are returned; a tensor-shape mistake by the
/// programmer (e.g. `hidden_states` whose token count disagrees with `img_shapes`) panics with
/// a precise message.
#[derive(Debug, Error)]
pub enum DitError {
    /// A model configuration is invalid; every problem is listed.
    #[error("invalid QwenImage configuration: {}", join(problems))]
    InvalidConfig {
        /// The problems, each with the value given and what is allowed.
        problems: Vec<ConfigProblem>,
    },

    /// A LoRA configuration is invalid; every problem is listed.
    #[error("invalid LoRA configuration: {}", join(problems))]
    InvalidLora {
        /// The problems, each with the value given and what is allowed.
        problems: Vec<ConfigProblem>,
    },

    /// LoRA dropout is not zero. A stochastic forward breaks the `ratio == 1` invariant of
    /// the first policy update (the old-policy anchor is a replay through the live model).
    #[error(
        "LoRA dropout = {given}; must be 0 (a stochastic forward breaks ratio == 1 of the first update)"
    )]
    LoraDropout {
        /// The dropout given.
        given: f64,
    },

    /// Target-module suffixes that match no `Linear` layer of the model.
    #[error("LoRA target modules match no Linear layer: [{}]", targets.join(", "))]
    LoraTargetsUnmatched {
        /// The unmatched suffixes.
        targets: Vec<String>,
    },

    /// An adapter is already attached (attach one adapter at a time).
    #[error("the model already carries a LoRA adapter")]
    AdapterAlreadyAttached,

    /// A path named as an adapter holds none.
    #[error(
        "{path}: no adapter here: expected a PEFT adapter directory (with adapter_config.json), a directory \
         with pytorch_lora_weights.safetensors (a diffusers LoRA) or a diffusers LoRA .safetensors file"
    )]
    NoAdapterFound {
        /// The path.
        path: PathBuf,
    },

    /// The operation needs an adapter and the model has none.
    #[error("the model carries no LoRA adapter")]
    NoAdapter,

    /// A PEFT adapter uses a feature this crate does not implement; every one is listed.
    #[error("unsupported PEFT adapter: {}", join(problems))]
    UnsupportedAdapter {
        /// The unsupported settings.
        problems: Vec<ConfigProblem>,
    },

    /// An adapter contract disagrees with the adapter or the base model; every field listed.
    #[error("adapter contract mismatch: {}", mismatches.iter().map(|m| format!("{} recorded {} found {}", m.field, m.recorded, m.found)).collect::<Vec<_>>().join("; "))]
    ContractMismatch {
        /// The disagreeing fields.
        mismatches: Vec<ContractMismatch>,
    },

    /// The base model's hash is needed (to write or check an adapter contract) and cannot be
    /// computed: the adapter is merged into the base weights and the model was not loaded from
    /// a checkpoint.
    #[error(
        "base-model hash unknown: adapters are merged into the base weights; unmerge first or load the base from a checkpoint"
    )]
    BaseHashUnavailable,

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
        "no diffusers checkpoint in {dir}: expected {}{}",
        expected.join(" or "),
        if variants.is_empty() { String::new() } else { format!(" (it holds the variant files of {}: load that variant)", variants.join(", ")) }
    )]
    NoCheckpoint {
        /// The directory searched.
        dir: PathBuf,
        /// The file names looked for.
        expected: Vec<String>,
        /// The variants (`bf16`, ...) whose files the directory holds instead.
        variants: Vec<String>,
    },

    /// A `config.json` has keys this crate does not implement, or a flag set to a value it
    /// does not implement; every key is named.
    #[error("{path}: {}", join(problems))]
    ConfigKeys {
        /// The configuration file.
        path: PathBuf,
        /// Each key, its value and what is accepted.
        problems: Vec<KeyProblem>,
    },

    /// A sharded index names a key twice or is otherwise inconsistent with its shards.
    #[error("{path}: key {key} is in the index but not in shard {shard}")]
    IndexMismatch {
        /// The index file.
        path: PathBuf,
        /// The key.
        key: String,
        /// The shard file the index names for it.
        shard: String,
    },

    /// A file could not be written durably (staged as `<file>.tmp`, fsynced, renamed into
    /// place): the destination keeps its previous content, or stays absent.
    #[error("cannot write {path}: {source}: {}", source.source)]
    Write {
        /// The destination file.
        path: PathBuf,
        /// The failed step (`create`, `write`, `fsync`, `rename into place`, ...) and the file
        /// or directory it was done to.
        #[source]
        source: durable::DurableError,
    },

    /// A file could not be read (or a directory created).
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },

    /// A JSON file (config, index, adapter config, contract) could not be parsed.
    #[error("{path}: invalid JSON: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },

    /// A JSON file parsed but a field has the wrong type or is missing.
    #[error("{path}: field {field}: expected {expected}")]
    JsonField {
        /// The file.
        path: PathBuf,
        /// The field.
        field: &'static str,
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
}

impl DitError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DitError::Io {
            path: path.into(),
            source,
        }
    }

    /// A durable write of `path` failed.
    pub(crate) fn write(path: impl Into<PathBuf>, source: durable::DurableError) -> Self {
        DitError::Write {
            path: path.into(),
            source,
        }
    }
}

/// The shared loader's errors, as the variants this crate has always returned (a tensor read
/// that is absent or not a float is a one-key [`DitError::Weights`] report).
impl From<model_weights::WeightsError> for DitError {
    fn from(e: model_weights::WeightsError) -> Self {
        use model_weights::WeightsError as W;
        match e {
            W::Io { path, source } => DitError::Io { path, source },
            W::Json { path, source } => DitError::Json { path, source },
            W::JsonField {
                path,
                field,
                expected,
            } => DitError::JsonField {
                path,
                field,
                expected,
            },
            W::Safetensors { path, source } => DitError::Safetensors { path, source },
            W::NoCheckpoint {
                dir,
                expected,
                variants,
            } => DitError::NoCheckpoint {
                dir,
                expected,
                variants,
            },
            W::IndexMismatch { path, key, shard } => DitError::IndexMismatch { path, key, shard },
            W::DuplicateKey {
                path,
                key,
                first,
                second,
            } => DitError::IndexMismatch {
                path,
                key,
                shard: format!("{} (also in {})", second.display(), first.display()),
            },
            W::MissingTensor { path, key } => DitError::Weights {
                path,
                report: WeightReport {
                    missing: vec![key],
                    ..WeightReport::default()
                },
            },
            W::UnsupportedDtype { path, key, dtype } => DitError::Weights {
                path,
                report: WeightReport {
                    unsupported_dtype: vec![DtypeProblem { key, dtype }],
                    ..WeightReport::default()
                },
            },
            W::Weights { path, report } => DitError::Weights { path, report },
        }
    }
}
