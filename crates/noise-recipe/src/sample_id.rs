//! Stable sample ids: the name of one candidate of one prompt, the same on every engine.

use std::fmt;
use std::str::FromStr;

use keyed_rng::fnv1a64;
use serde::{Deserialize, Serialize};

use crate::error::NoiseError;

/// How a candidate's stable id is built (seed 002's `sample_id_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SampleIdMode {
    /// `prompt:<prompt_id or sample_id>:sample:<slot>`, falling back to the group index when the
    /// prompt has neither (an empty string counts as absent, as in the Python original's `or`):
    /// the id follows the prompt wherever the data loader puts it.
    #[serde(rename = "metadata")]
    Metadata,
    /// `prompt:<group_index>:sample:<slot>`: the id follows the prompt's position in the batch.
    #[serde(rename = "positional", alias = "group_index")]
    Positional,
}

/// A prompt's identifying metadata, as far as it has any.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PromptMeta<'a> {
    /// The dataset's prompt id.
    pub prompt_id: Option<&'a str>,
    /// The dataset's sample id (used when there is no prompt id).
    pub sample_id: Option<&'a str>,
}

/// A stable sample id, `prompt:<key>:sample:<slot>`.
///
/// ```
/// use noise_recipe::{PromptMeta, SampleId, SampleIdMode};
/// let meta = PromptMeta { prompt_id: Some("p-17"), sample_id: Some("s-9") };
/// let id = SampleId::new(SampleIdMode::Metadata, 3, meta, 1);
/// assert_eq!(id.as_str(), "prompt:p-17:sample:1");
/// let pos = SampleId::new(SampleIdMode::Positional, 3, meta, 1);
/// assert_eq!(pos.as_str(), "prompt:3:sample:1");
/// let none = SampleId::new(SampleIdMode::Metadata, 3, PromptMeta::default(), 0);
/// assert_eq!(none.as_str(), "prompt:3:sample:0"); // falls back to the group index
/// assert_eq!("prompt:p-17:sample:1".parse::<SampleId>().unwrap(), id);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SampleId {
    text: String,
    slot: usize,
}

impl SampleId {
    /// The id of candidate `slot` of the prompt at `group_index`.
    pub fn new(mode: SampleIdMode, group_index: usize, meta: PromptMeta<'_>, slot: usize) -> Self {
        let key = match mode {
            SampleIdMode::Metadata => meta
                .prompt_id
                .filter(|k| !k.is_empty())
                .or(meta.sample_id.filter(|k| !k.is_empty()))
                .map(str::to_owned)
                .unwrap_or_else(|| group_index.to_string()),
            SampleIdMode::Positional => group_index.to_string(),
        };
        Self {
            text: format!("prompt:{key}:sample:{slot}"),
            slot,
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The candidate slot.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The prompt key (between `prompt:` and `:sample:`).
    pub fn prompt_key(&self) -> &str {
        let end = self.text.len() - ":sample:".len() - digits(self.slot);
        &self.text["prompt:".len()..end]
    }

    /// A 64-bit key of the id (FNV-1a 64 of its UTF-8 bytes), for seeding per-sample noise.
    /// Stable across platforms and releases (a golden test pins it).
    pub fn noise_key(&self) -> u64 {
        fnv1a64(self.text.as_bytes())
    }
}

fn digits(mut n: usize) -> usize {
    let mut d = 1;
    while n >= 10 {
        n /= 10;
        d += 1;
    }
    d
}

impl fmt::Display for SampleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for SampleId {
    type Err = NoiseError;

    fn from_str(s: &str) -> Result<Self, NoiseError> {
        let bad = |reason| NoiseError::InvalidSampleId {
            given: s.to_owned(),
            reason,
        };
        let rest = s
            .strip_prefix("prompt:")
            .ok_or_else(|| bad("missing the \"prompt:\" prefix"))?;
        let (key, slot) = rest
            .rsplit_once(":sample:")
            .ok_or_else(|| bad("missing \":sample:\""))?;
        if key.is_empty() {
            return Err(bad("empty prompt key"));
        }
        if slot.is_empty()
            || !slot.bytes().all(|b| b.is_ascii_digit())
            || (slot.len() > 1 && slot.starts_with('0'))
        {
            return Err(bad("the slot is not a canonical non-negative integer"));
        }
        let slot: usize = slot
            .parse()
            .map_err(|_| bad("the slot does not fit in usize"))?;
        Ok(Self {
            text: s.to_owned(),
            slot,
        })
    }
}

impl TryFrom<String> for SampleId {
    type Error = NoiseError;

    fn try_from(s: String) -> Result<Self, NoiseError> {
        s.parse()
    }
}

impl From<SampleId> for String {
    fn from(id: SampleId) -> String {
        id.text
    }
}
