//! The one error type of `qwen-image`.

use std::fmt;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// One problem with a configuration key: the key, what was given, what is accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigProblem {
    /// The key, dotted from the file's root (`text_config.rope_parameters.rope_type`).
    pub key: String,
    /// The value found, printed as JSON (`(absent)` for a required key that is missing).
    pub given: String,
    /// What is accepted.
    pub expected: String,
}

impl ConfigProblem {
    /// A problem with `key`.
    pub fn new(
        key: impl Into<String>,
        given: impl fmt::Display,
        expected: impl Into<String>,
    ) -> Self {
        Self {
            key: key.into(),
            given: given.to_string(),
            expected: expected.into(),
        }
    }
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} = {} (expected {})",
            self.key, self.given, self.expected
        )
    }
}

fn join<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Everything that can go wrong loading or running a Qwen-Image component.
///
/// Every variant names the file or the input it is about. A configuration's problems are all
/// listed at once; so are a checkpoint's (its [`model_weights::WeightReport`]).
#[derive(Debug, Error)]
pub enum QwenImageError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },

    /// A file is not valid JSON.
    #[error("{path}: invalid JSON: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },

    /// A configuration file has keys this crate does not implement, values it does not
    /// support, or values of the wrong type; every problem is listed.
    #[error("{path}: {}", join(problems))]
    Config {
        /// The configuration file.
        path: PathBuf,
        /// Every problem found.
        problems: Vec<ConfigProblem>,
    },

    /// A checkpoint could not be opened or does not match the configuration.
    #[error(transparent)]
    Weights(#[from] model_weights::WeightsError),

    /// A tokenizer's files could not be read or built.
    #[error("{path}: {message}")]
    Tokenizer {
        /// The tokenizer file (or directory).
        path: PathBuf,
        /// What went wrong.
        message: String,
    },

    /// An input does not fit the model (a token id outside the vocabulary, an empty batch, a
    /// mask of the wrong shape).
    #[error("{what}: {message}")]
    Input {
        /// Which input.
        what: &'static str,
        /// What is wrong, with the values.
        message: String,
    },
}

impl QwenImageError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn input(what: &'static str, message: impl Into<String>) -> Self {
        Self::Input {
            what,
            message: message.into(),
        }
    }
}

/// Reads and parses a JSON file.
pub(crate) fn read_json(path: &Path) -> Result<serde_json::Value, QwenImageError> {
    let text = std::fs::read_to_string(path).map_err(|e| QwenImageError::io(path, e))?;
    serde_json::from_str(&text).map_err(|source| QwenImageError::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads a configuration file and parses it with `parse`, its problems reported as one
/// [`QwenImageError::Config`] naming the file.
pub(crate) fn parse_config_file<T>(
    path: &Path,
    parse: impl FnOnce(&serde_json::Value) -> Result<T, Vec<ConfigProblem>>,
) -> Result<T, QwenImageError> {
    parse(&read_json(path)?).map_err(|problems| QwenImageError::Config {
        path: path.to_path_buf(),
        problems,
    })
}

/// The root object of a configuration, or the one problem that it is not an object.
pub(crate) fn root_object(
    root: &serde_json::Value,
) -> Result<&serde_json::Map<String, serde_json::Value>, Vec<ConfigProblem>> {
    root.as_object()
        .ok_or_else(|| vec![ConfigProblem::new("(root)", root, "a JSON object")])
}
