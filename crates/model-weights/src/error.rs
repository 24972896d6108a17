//! The one error type of `model-weights`.

use std::path::PathBuf;

use thiserror::Error;

use crate::report::WeightReport;

/// Everything that can go wrong opening or reading a checkpoint.
///
/// Every variant names the file (or directory) it is about; problems of the tensors against
/// what a model expects are collected in one [`WeightReport`] ([`WeightsError::Weights`]).
#[derive(Debug, Error)]
pub enum WeightsError {
    /// A file could not be read (opened, memory-mapped).
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },

    /// A sharded checkpoint's index is not JSON.
    #[error("{path}: invalid JSON: {source}")]
    Json {
        /// The index file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },

    /// A sharded checkpoint's index parsed but a field is missing or has the wrong type.
    #[error("{path}: field {field}: expected {expected}")]
    JsonField {
        /// The index file.
        path: PathBuf,
        /// The field (`weight_map`).
        field: &'static str,
        /// What was expected.
        expected: &'static str,
    },

    /// A safetensors file is malformed (header, offsets, a size that does not cover the data).
    #[error("{path}: invalid safetensors file: {source}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: safetensors::SafeTensorError,
    },

    /// A directory holds none of the checkpoint files of the layouts searched.
    #[error("no safetensors checkpoint in {dir}: expected one of {}{}", expected.join(", "), variants_hint(variants))]
    NoCheckpoint {
        /// The directory searched.
        dir: PathBuf,
        /// The file names looked for, in the order tried.
        expected: Vec<String>,
        /// The variants (`bf16`, `fp16`, ...) whose files the directory does hold, if any.
        variants: Vec<String>,
    },

    /// A sharded index names a tensor that its shard does not hold.
    #[error("{path}: key {key} is in the index but not in shard {shard}")]
    IndexMismatch {
        /// The index file.
        path: PathBuf,
        /// The key.
        key: String,
        /// The shard file the index names for it.
        shard: String,
    },

    /// Two files of one checkpoint hold the same key.
    #[error("{path}: key {key} is in {second} and in {first}")]
    DuplicateKey {
        /// The checkpoint's index (or its file, or directory, when it has none).
        path: PathBuf,
        /// The key.
        key: String,
        /// The first file holding it (in sorted shard order).
        first: PathBuf,
        /// The second file holding it.
        second: PathBuf,
    },

    /// A tensor was read that the checkpoint does not hold.
    #[error("{path}: no tensor {key}")]
    MissingTensor {
        /// The checkpoint (file or directory).
        path: PathBuf,
        /// The key.
        key: String,
    },

    /// A tensor was read as a float and is stored in another dtype (integers, bool, fp8).
    #[error("{path}: tensor {key} is stored as {dtype}, not a float dtype (F64, F32, F16, BF16)")]
    UnsupportedDtype {
        /// The checkpoint (file or directory).
        path: PathBuf,
        /// The key.
        key: String,
        /// The stored dtype, as safetensors names it (`I64`, `F8_E4M3`, ...).
        dtype: String,
    },

    /// Checkpoint tensors do not fit what the model expects; every problem is listed by key.
    #[error("checkpoint {path} does not fit the model: {report}")]
    Weights {
        /// The checkpoint (file or directory).
        path: PathBuf,
        /// Missing, unexpected, mis-shaped and unconvertible keys.
        report: WeightReport,
    },
}

impl WeightsError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        WeightsError::Io {
            path: path.into(),
            source,
        }
    }
}

fn variants_hint(variants: &[String]) -> String {
    if variants.is_empty() {
        String::new()
    } else {
        format!(
            " (it holds the variant files of {}: load that variant)",
            variants.join(", ")
        )
    }
}
