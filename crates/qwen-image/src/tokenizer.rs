//! The Qwen2 tokenizer with the Hugging Face `tokenizers` library, from a model directory's
//! `tokenizer/`: either its `tokenizer.json`, or `vocab.json` + `merges.txt` with the added
//! tokens of `tokenizer_config.json` (the form of the published Qwen-Image directory), built
//! the way transformers' `Qwen2Tokenizer` builds it.

use std::path::{Path, PathBuf};

use serde_json::Value;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use crate::error::{QwenImageError, read_json};

/// File name of a `tokenizers` tokenizer.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// File name of transformers' tokenizer settings (added tokens, padding token and side).
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
/// File name of a byte-level BPE vocabulary.
pub const VOCAB_FILE: &str = "vocab.json";
/// File name of a byte-level BPE's merges.
pub const MERGES_FILE: &str = "merges.txt";

/// Qwen2's pre-tokenisation pattern (transformers' `PRETOKENIZE_REGEX`).
pub const PRETOKENIZE_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The padding token `Qwen2Tokenizer` uses when `tokenizer_config.json` names none.
pub const DEFAULT_PAD_TOKEN: &str = "<|endoftext|>";

/// Which files a tokenizer was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizerForm {
    /// `tokenizer.json` (what transformers 5 saves).
    TokenizerJson,
    /// `vocab.json` + `merges.txt` + the added tokens of `tokenizer_config.json`.
    VocabMerges,
}

/// Which end of a shorter sequence gets the padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PaddingSide {
    /// After the tokens (transformers' default).
    Right,
    /// Before the tokens.
    Left,
}

/// A padded batch of token ids with its attention mask (1 = a token, 0 = padding).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenBatch {
    /// `[batch][seq]` token ids.
    pub ids: Vec<Vec<u32>>,
    /// `[batch][seq]`, 1 for a token and 0 for padding.
    pub mask: Vec<Vec<u8>>,
}

impl TokenBatch {
    /// The number of real tokens in each row.
    pub fn lengths(&self) -> Vec<usize> {
        self.mask
            .iter()
            .map(|r| r.iter().filter(|&&m| m != 0).count())
            .collect()
    }
}

/// A Qwen2 byte-level BPE tokenizer: no special tokens are added around a text (Qwen2 has no
/// post-processor), truncation keeps the first `max_length` tokens, a batch is padded to its
/// longest row with the padding token on the configured side.
#[derive(Clone, Debug)]
pub struct QwenTokenizer {
    tokenizer: Tokenizer,
    dir: PathBuf,
    form: TokenizerForm,
    pad_id: u32,
    padding_side: PaddingSide,
}

fn token_name(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(m) => m.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

fn tokenizer_error(path: &Path, message: impl ToString) -> QwenImageError {
    QwenImageError::Tokenizer {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

/// The BPE of `vocab.json` + `merges.txt` with Qwen2's normaliser, pre-tokeniser and
/// decoder (transformers' `Qwen2Tokenizer.__init__`), and the added tokens of
/// `added_tokens_decoder`, each checked to land on its recorded id.
fn from_vocab_merges(dir: &Path, config: &Value) -> Result<Tokenizer, QwenImageError> {
    let vocab = dir.join(VOCAB_FILE);
    let merges = dir.join(MERGES_FILE);
    let bpe = BPE::from_file(&vocab.to_string_lossy(), &merges.to_string_lossy())
        .build()
        .map_err(|e| tokenizer_error(&vocab, format!("with {MERGES_FILE}: {e}")))?;
    let mut tok = Tokenizer::new(bpe);
    tok.with_normalizer(Some(NFC));
    let split = Split::new(
        SplitPattern::Regex(PRETOKENIZE_REGEX.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| tokenizer_error(dir, e))?;
    let add_prefix_space = config
        .get("add_prefix_space")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    tok.with_pre_tokenizer(Some(Sequence::new(vec![
        split.into(),
        ByteLevel::new(add_prefix_space, true, false).into(),
    ])));
    tok.with_decoder(Some(ByteLevel::default()));
    let cfg_path = dir.join(TOKENIZER_CONFIG_FILE);
    let mut added: Vec<(u32, AddedToken)> = Vec::new();
    if let Some(Value::Object(decoder)) = config.get("added_tokens_decoder") {
        for (id, spec) in decoder {
            let bad = || {
                tokenizer_error(
                    &cfg_path,
                    format!(
                        "added_tokens_decoder.{id}: expected an integer id and an object with a string \"content\""
                    ),
                )
            };
            let id: u32 = id.parse().map_err(|_| bad())?;
            let content = spec
                .get("content")
                .and_then(Value::as_str)
                .ok_or_else(bad)?;
            let flag =
                |k: &str, default: bool| spec.get(k).and_then(Value::as_bool).unwrap_or(default);
            let special = flag("special", false);
            let token = AddedToken::from(content, special)
                .lstrip(flag("lstrip", false))
                .rstrip(flag("rstrip", false))
                .single_word(flag("single_word", false))
                .normalized(flag("normalized", !special));
            added.push((id, token));
        }
    }
    added.sort_by_key(|(id, _)| *id);
    for (id, token) in &added {
        if token.special {
            tok.add_special_tokens(std::slice::from_ref(token));
        } else {
            tok.add_tokens(std::slice::from_ref(token));
        }
        let got = tok.token_to_id(&token.content);
        if got != Some(*id) {
            return Err(tokenizer_error(
                &cfg_path,
                format!(
                    "added token {:?} is recorded as id {id} but lands on {got:?} after the {} entries of {VOCAB_FILE}",
                    token.content,
                    tok.get_vocab_size(false)
                ),
            ));
        }
    }
    Ok(tok)
}

impl QwenTokenizer {
    /// Loads a tokenizer directory: `tokenizer.json` when present, else `vocab.json` +
    /// `merges.txt` ([`TokenizerForm`]); `tokenizer_config.json` (optional with
    /// `tokenizer.json`) gives the added tokens, `pad_token` (default `<|endoftext|>`) and
    /// `padding_side` (default right).
    ///
    /// # Errors
    /// [`QwenImageError::Tokenizer`] naming the file for missing files, a padding token that
    /// is not in the vocabulary, an unknown padding side or an added token whose id disagrees;
    /// [`QwenImageError::Io`] / [`QwenImageError::Json`] for unreadable files.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self, QwenImageError> {
        let dir = dir.as_ref();
        let cfg_path = dir.join(TOKENIZER_CONFIG_FILE);
        let config = if cfg_path.is_file() {
            read_json(&cfg_path)?
        } else {
            Value::Object(Default::default())
        };
        let json = dir.join(TOKENIZER_FILE);
        let (tokenizer, form) = if json.is_file() {
            let tok = Tokenizer::from_file(&json).map_err(|e| tokenizer_error(&json, e))?;
            (tok, TokenizerForm::TokenizerJson)
        } else if dir.join(VOCAB_FILE).is_file() && dir.join(MERGES_FILE).is_file() {
            if !cfg_path.is_file() {
                return Err(tokenizer_error(
                    &cfg_path,
                    format!(
                        "not found: a {VOCAB_FILE} + {MERGES_FILE} tokenizer needs it for its added tokens"
                    ),
                ));
            }
            (from_vocab_merges(dir, &config)?, TokenizerForm::VocabMerges)
        } else {
            return Err(tokenizer_error(
                dir,
                format!(
                    "no tokenizer: expected {TOKENIZER_FILE}, or {VOCAB_FILE} + {MERGES_FILE} + {TOKENIZER_CONFIG_FILE}"
                ),
            ));
        };
        let pad = config
            .get("pad_token")
            .and_then(token_name)
            .unwrap_or_else(|| DEFAULT_PAD_TOKEN.to_string());
        let pad_id = tokenizer.token_to_id(&pad).ok_or_else(|| {
            tokenizer_error(
                &cfg_path,
                format!("pad_token {pad:?} is not in the vocabulary"),
            )
        })?;
        let padding_side = match config.get("padding_side") {
            None | Some(Value::Null) => PaddingSide::Right,
            Some(v) if v == "right" => PaddingSide::Right,
            Some(v) if v == "left" => PaddingSide::Left,
            Some(v) => {
                return Err(tokenizer_error(
                    &cfg_path,
                    format!("padding_side = {v}: expected \"right\" or \"left\""),
                ));
            }
        };
        Ok(Self {
            tokenizer,
            dir: dir.to_path_buf(),
            form,
            pad_id,
            padding_side,
        })
    }

    /// Which files it was read from.
    pub fn form(&self) -> TokenizerForm {
        self.form
    }

    /// The padding token's id.
    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }

    /// Where padding goes.
    pub fn padding_side(&self) -> PaddingSide {
        self.padding_side
    }

    /// Pads on the other side from now on (transformers' `tokenizer.padding_side = ...`).
    pub fn with_padding_side(mut self, side: PaddingSide) -> Self {
        self.padding_side = side;
        self
    }

    /// The vocabulary size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// The id of a token, if it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// The ids of one text (added tokens such as `<|im_start|>` recognised in it).
    ///
    /// # Errors
    /// [`QwenImageError::Tokenizer`] if the tokenizer fails on the text.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, QwenImageError> {
        let enc = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| tokenizer_error(&self.dir, format!("encoding {text:?}: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// A padded batch (transformers' `padding=True`): each text truncated to its first
    /// `max_length` tokens when given (`truncation=True`), then every row padded to the longest.
    ///
    /// # Errors
    /// [`QwenImageError::Input`] for an empty batch or `max_length = 0`;
    /// [`QwenImageError::Tokenizer`] if a text fails to encode.
    pub fn encode_batch<S: AsRef<str>>(
        &self,
        texts: &[S],
        max_length: Option<usize>,
    ) -> Result<TokenBatch, QwenImageError> {
        if texts.is_empty() {
            return Err(QwenImageError::input("texts", "an empty batch"));
        }
        if max_length == Some(0) {
            return Err(QwenImageError::input(
                "max_length",
                "0: no token could be kept",
            ));
        }
        let mut rows = texts
            .iter()
            .map(|t| self.encode(t.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(max) = max_length {
            rows.iter_mut().for_each(|r| r.truncate(max));
        }
        let longest = rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut batch = TokenBatch {
            ids: Vec::with_capacity(rows.len()),
            mask: Vec::with_capacity(rows.len()),
        };
        for row in rows {
            let pad = longest - row.len();
            let (ids, mask) = match self.padding_side {
                PaddingSide::Right => (
                    row.iter()
                        .copied()
                        .chain(std::iter::repeat_n(self.pad_id, pad))
                        .collect(),
                    std::iter::repeat_n(1, row.len())
                        .chain(std::iter::repeat_n(0, pad))
                        .collect(),
                ),
                PaddingSide::Left => (
                    std::iter::repeat_n(self.pad_id, pad)
                        .chain(row.iter().copied())
                        .collect(),
                    std::iter::repeat_n(0, pad)
                        .chain(std::iter::repeat_n(1, row.len()))
                        .collect(),
                ),
            };
            batch.ids.push(ids);
            batch.mask.push(mask);
        }
        Ok(batch)
    }
}
