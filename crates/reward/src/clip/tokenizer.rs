//! CLIP tokenisation with the Hugging Face `tokenizers` library, from a model directory's
//! `tokenizer.json` (the file `CLIPTokenizerFast` / transformers 5's `CLIPTokenizer` writes).

use std::path::{Path, PathBuf};

use serde_json::Value;
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use crate::error::{ConfigProblem, RewardError};

/// File name of a `tokenizers` tokenizer.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// File name of transformers' tokenizer settings (special tokens, `model_max_length`).
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

/// Keys of a `tokenizer_config.json` accepted with no effect on the ids of a prompt, and why.
pub const TOKENIZER_INERT_KEYS: &[(&str, &str)] = &[
    (
        "model_max_length",
        "the truncation length is the scorer's own (77 for CLIP), as PickScore's reference passes it",
    ),
    (
        "do_lower_case",
        "the slow tokenizer's; tokenizer.json's normaliser lowercases",
    ),
    (
        "add_prefix_space",
        "the slow tokenizer's; tokenizer.json's pre-tokeniser decides",
    ),
    ("errors", "how decoding treats invalid bytes"),
    ("clean_up_tokenization_spaces", "decoding only"),
    (
        "added_tokens_decoder",
        "the added tokens, which tokenizer.json lists itself",
    ),
    (
        "additional_special_tokens",
        "special tokens, which tokenizer.json lists itself",
    ),
    (
        "extra_special_tokens",
        "special tokens, which tokenizer.json lists itself",
    ),
    (
        "model_input_names",
        "the Python keyword names of the outputs",
    ),
    ("name_or_path", "where the file came from"),
    ("special_tokens_map_file", "where the file came from"),
    ("tokenizer_file", "where the file came from"),
    ("processor_class", "names the Python class of the processor"),
    ("backend", "the Python library behind the tokenizer"),
];

/// Checks the keys of a `tokenizer_config.json` (`v`) against the vocabulary of `tokenizer`:
/// the special tokens must be in it, padding and truncation on the right (where CLIP's
/// reference puts them), special tokens not split, the class CLIP's; every other key inert.
fn check_tokenizer_config(v: &Value, tokenizer: &Tokenizer, problems: &mut Vec<ConfigProblem>) {
    let Some(map) = v.as_object() else {
        problems.push(ConfigProblem::new("(file)", v, "a JSON object"));
        return;
    };
    for (key, value) in map {
        let k = key.as_str();
        let problem = match k {
            "pad_token" | "bos_token" | "eos_token" | "unk_token" => {
                if value.is_null() {
                    None
                } else {
                    match token_name(value) {
                        Some(t) if tokenizer.token_to_id(&t).is_some() => None,
                        Some(_) => Some("a token of tokenizer.json's vocabulary"),
                        None => Some("a token string or {\"content\": ...}"),
                    }
                }
            }
            "padding_side" | "truncation_side" => (value.as_str() != Some("right"))
                .then_some("\"right\" (CLIP pads and truncates at the end)"),
            "split_special_tokens" => (value != &Value::Bool(false))
                .then_some("false (special tokens in a prompt stay whole)"),
            "tokenizer_class" => (!value
                .as_str()
                .is_some_and(|c| c.starts_with("CLIPTokenizer")))
            .then_some("a CLIP tokenizer class (\"CLIPTokenizer…\")"),
            _ if TOKENIZER_INERT_KEYS.iter().any(|(i, _)| *i == k) => None,
            _ => Some(
                "no such key: not a CLIP tokenizer key that flowrl implements or knows to have no effect",
            ),
        };
        if let Some(allowed) = problem {
            problems.push(ConfigProblem::new(k, value, allowed));
        }
    }
}

/// How a batch of token sequences is padded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Padding {
    /// To the longest sequence of the batch (`padding=True`, what PickScore's reference code
    /// asks for).
    Longest,
    /// To the maximum length (`padding="max_length"`, 77 for CLIP).
    MaxLength,
}

/// A CLIP tokenizer: the `tokenizer.json` pipeline (normaliser, pre-tokeniser, BPE, the
/// `<|startoftext|> ... <|endoftext|>` post-processor), truncation to `max_length` tokens
/// special tokens included (transformers' `truncation=True, max_length=77`), and padding with
/// the pad token of `tokenizer_config.json` (`<|endoftext|>` if it names none).
#[derive(Clone, Debug)]
pub struct ClipTokenizer {
    tokenizer: Tokenizer,
    path: PathBuf,
    max_length: usize,
    pad_id: u32,
}

fn token_name(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(m) => m.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

impl ClipTokenizer {
    /// Loads `dir/tokenizer.json` (and `dir/tokenizer_config.json` if present), truncating to
    /// `max_length` tokens. Every key of `tokenizer_config.json` is read or checked: its
    /// special tokens must be in the vocabulary, padding and truncation on the right, special
    /// tokens whole and the class CLIP's; the rest are [`TOKENIZER_INERT_KEYS`]; any other key
    /// or value is refused by name, with the others.
    pub fn from_dir(dir: impl AsRef<Path>, max_length: usize) -> Result<Self, RewardError> {
        let dir = dir.as_ref();
        let path = dir.join(TOKENIZER_FILE);
        if !path.is_file() {
            return Err(RewardError::io(
                &path,
                std::io::Error::new(std::io::ErrorKind::NotFound, "tokenizer.json not found"),
            ));
        }
        let mut tokenizer =
            Tokenizer::from_file(&path).map_err(|source| RewardError::Tokenizer {
                path: path.clone(),
                source,
            })?;
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
                direction: TruncationDirection::Right,
            }))
            .map_err(|source| RewardError::Tokenizer {
                path: path.clone(),
                source,
            })?;
        tokenizer.with_padding(None);
        let mut pad = "<|endoftext|>".to_string();
        let cfg = dir.join(TOKENIZER_CONFIG_FILE);
        if cfg.is_file() {
            let text = std::fs::read_to_string(&cfg).map_err(|e| RewardError::io(&cfg, e))?;
            let v: Value = serde_json::from_str(&text).map_err(|source| RewardError::Json {
                path: cfg.clone(),
                source,
            })?;
            let mut problems = Vec::new();
            check_tokenizer_config(&v, &tokenizer, &mut problems);
            RewardError::config_file(&cfg, "CLIP tokenizer_config.json", problems)?;
            if let Some(p) = v.get("pad_token").filter(|p| !p.is_null()) {
                pad = token_name(p).ok_or_else(|| RewardError::JsonField {
                    path: cfg.clone(),
                    field: "pad_token".into(),
                    expected: "a token string or {\"content\": ...}",
                })?;
            }
        }
        let pad_id = tokenizer
            .token_to_id(&pad)
            .ok_or_else(|| RewardError::MissingToken {
                path: path.clone(),
                token: pad.clone(),
            })?;
        Ok(Self {
            tokenizer,
            path,
            max_length,
            pad_id,
        })
    }

    /// The id padding uses.
    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }

    /// The truncation length.
    pub fn max_length(&self) -> usize {
        self.max_length
    }

    /// The id of a token, if in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// The ids of one prompt with the special tokens, truncated, not padded.
    pub fn encode(&self, prompt: &str) -> Result<Vec<u32>, RewardError> {
        let enc = self
            .tokenizer
            .encode(prompt, true)
            .map_err(|source| RewardError::Tokenizer {
                path: self.path.clone(),
                source,
            })?;
        Ok(enc.get_ids().to_vec())
    }

    /// The ids of a batch of prompts, padded with [`ClipTokenizer::pad_id`] as `padding`
    /// asks: rows of equal length.
    pub fn encode_batch(
        &self,
        prompts: &[String],
        padding: Padding,
    ) -> Result<Vec<Vec<u32>>, RewardError> {
        let mut rows = prompts
            .iter()
            .map(|p| self.encode(p))
            .collect::<Result<Vec<_>, _>>()?;
        let len = match padding {
            Padding::Longest => rows.iter().map(Vec::len).max().unwrap_or(0),
            Padding::MaxLength => self.max_length,
        };
        for r in &mut rows {
            r.resize(len, self.pad_id);
        }
        Ok(rows)
    }
}
