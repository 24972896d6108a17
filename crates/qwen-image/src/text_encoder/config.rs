//! The text encoder's configuration: transformers' `Qwen2_5_VLConfig` `config.json`, in either
//! layout, with every key implemented, refused, or named as having no effect on the text path.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{ConfigProblem, QwenImageError, parse_config_file, root_object};

/// Where a `config.json` keeps the text decoder's keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigLayout {
    /// transformers 4 before the nested configs (the layout of the published Qwen-Image
    /// `text_encoder/config.json`): the text keys at the root, `rope_theta` and `rope_scaling`.
    Flat,
    /// A `text_config` object (transformers 4.57 with `rope_scaling`, transformers 5 with
    /// `rope_parameters`).
    Nested,
}

/// The text path of a Qwen2.5-VL model (transformers' `Qwen2_5_VLTextConfig`); absent keys
/// take transformers' defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct TextEncoderConfig {
    /// Rows of the token embedding.
    pub vocab_size: usize,
    /// Width of the decoder.
    pub hidden_size: usize,
    /// Width of the SiLU-gated MLP.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key / value heads (grouped-query attention; `num_attention_heads` when absent).
    pub num_key_value_heads: usize,
    /// Epsilon of every RMSNorm.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// The multimodal RoPE sections (temporal, height, width) over `head_dim / 2`
    /// frequencies. Text-only prompts give all three the same position, so they do not change
    /// the result; they are validated as transformers does.
    pub mrope_section: Vec<usize>,
    /// The position count the model was trained for (recorded; RoPE has no table to outgrow).
    pub max_position_embeddings: usize,
    /// Which layout the file used.
    pub layout: ConfigLayout,
}

/// Keys accepted with no effect on the text encoder's last hidden state, and why.
pub const INERT_KEYS: &[(&str, &str)] = &[
    ("architectures", "names the Python class"),
    ("dtype", "the saved dtype; each tensor's own dtype is read"),
    (
        "torch_dtype",
        "the saved dtype; each tensor's own dtype is read",
    ),
    ("transformers_version", "the version that saved the file"),
    ("_name_or_path", "where the file came from"),
    ("use_cache", "generation's key / value cache"),
    ("initializer_range", "random initialisation"),
    ("attention_dropout", "dropout, off in a frozen encoder"),
    ("bos_token_id", "generation"),
    ("eos_token_id", "generation"),
    (
        "pad_token_id",
        "the embedding's gradient only; padded positions are masked",
    ),
    (
        "tie_word_embeddings",
        "the language-model head, which the last hidden state does not use",
    ),
    (
        "vision_config",
        "the vision tower, which text prompts never run",
    ),
    (
        "image_token_id",
        "image placeholders, absent from text prompts",
    ),
    (
        "video_token_id",
        "video placeholders, absent from text prompts",
    ),
    (
        "vision_start_token_id",
        "vision placeholders, absent from text prompts",
    ),
    (
        "vision_end_token_id",
        "vision placeholders, absent from text prompts",
    ),
    (
        "vision_token_id",
        "vision placeholders, absent from text prompts",
    ),
    (
        "max_position_embeddings",
        "recorded; RoPE has no table to outgrow",
    ),
];

/// Attributes every transformers `PretrainedConfig` carries (heads, generation defaults,
/// output flags) that older files wrote out in full; none of them changes the text encoder's
/// hidden states. `pruned_heads`, which would, is accepted only empty.
pub const GENERIC_KEYS: &[&str] = model_weights::PRETRAINED_CONFIG_KEYS;

/// Keys of the text decoder that may sit at the root of a flat file.
const TEXT_KEYS: &[&str] = &[
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_act",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "layer_types",
    "use_sliding_window",
    "sliding_window",
    "max_window_layers",
    "head_dim",
    "max_position_embeddings",
];

/// transformers' defaults for a Qwen2.5-VL text decoder.
mod defaults {
    pub const VOCAB_SIZE: usize = 152_064;
    pub const HIDDEN_SIZE: usize = 8192;
    pub const INTERMEDIATE_SIZE: usize = 29_568;
    pub const NUM_HIDDEN_LAYERS: usize = 80;
    pub const NUM_ATTENTION_HEADS: usize = 64;
    pub const NUM_KEY_VALUE_HEADS: usize = 8;
    pub const RMS_NORM_EPS: f64 = 1e-5;
    pub const ROPE_THETA: f64 = 1_000_000.0;
    pub const MROPE_SECTION: [usize; 3] = [16, 24, 24];
    pub const MAX_POSITION_EMBEDDINGS: usize = 32_768;
}

/// Reads the keys of one JSON object, remembering which were consulted.
struct Section<'a> {
    map: &'a Map<String, Value>,
    prefix: String,
    seen: BTreeSet<String>,
}

impl<'a> Section<'a> {
    fn new(map: &'a Map<String, Value>, prefix: &str) -> Self {
        Self {
            map,
            prefix: prefix.to_string(),
            seen: BTreeSet::new(),
        }
    }

    fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn get(&mut self, key: &str) -> Option<&'a Value> {
        self.seen.insert(key.to_string());
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn uint(&mut self, key: &str, default: usize, problems: &mut Vec<ConfigProblem>) -> usize {
        match self.get(key) {
            None => default,
            Some(v) => v.as_u64().map(|u| u as usize).unwrap_or_else(|| {
                problems.push(ConfigProblem::new(
                    self.name(key),
                    v,
                    "a non-negative integer",
                ));
                default
            }),
        }
    }

    fn float(&mut self, key: &str, default: f64, problems: &mut Vec<ConfigProblem>) -> f64 {
        match self.get(key) {
            None => default,
            Some(v) => v.as_f64().unwrap_or_else(|| {
                problems.push(ConfigProblem::new(self.name(key), v, "a number"));
                default
            }),
        }
    }

    /// Marks every key of [`INERT_KEYS`] and [`GENERIC_KEYS`] as seen (`pruned_heads` only
    /// when empty); reports every key never consulted.
    fn finish(mut self, problems: &mut Vec<ConfigProblem>) {
        for key in INERT_KEYS.iter().map(|(k, _)| k).chain(GENERIC_KEYS) {
            self.seen.insert((*key).to_string());
        }
        if let Some(v) = self.get("pruned_heads")
            && v.as_object().is_none_or(|m| !m.is_empty())
        {
            problems.push(ConfigProblem::new(
                self.name("pruned_heads"),
                v,
                "{} (pruned heads are not implemented)",
            ));
        }
        for (key, value) in self.map {
            if !self.seen.contains(key) {
                problems.push(ConfigProblem::new(
                    self.name(key),
                    value,
                    "no such key in a Qwen2.5-VL text encoder this crate implements",
                ));
            }
        }
    }
}

fn mrope_section(v: &Value, key: String, problems: &mut Vec<ConfigProblem>) -> Option<Vec<usize>> {
    let parsed = v.as_array().and_then(|xs| {
        xs.iter()
            .map(|x| x.as_u64().map(|u| u as usize))
            .collect::<Option<Vec<_>>>()
    });
    if parsed.is_none() {
        problems.push(ConfigProblem::new(
            key,
            v,
            "a list of non-negative integers",
        ));
    }
    parsed
}

impl TextEncoderConfig {
    /// Reads a transformers `config.json` of a `Qwen2_5_VLForConditionalGeneration` (a
    /// diffusers directory's `text_encoder/config.json`).
    ///
    /// Both layouts are read ([`ConfigLayout`]); both RoPE forms too (transformers 4's
    /// `rope_theta` + `rope_scaling`, transformers 5's `rope_parameters`). Every key is either
    /// used, checked against the one value implemented (`hidden_act = "silu"`, RoPE type
    /// `"default"` / `"mrope"`, full attention in every layer), or one of [`INERT_KEYS`]; any
    /// other key is an error naming it. Every problem is reported at once.
    ///
    /// # Errors
    /// [`QwenImageError::Io`] / [`QwenImageError::Json`] for an unreadable file,
    /// [`QwenImageError::Config`] listing every problem.
    pub fn from_json_file(path: impl AsRef<Path>) -> Result<Self, QwenImageError> {
        parse_config_file(path.as_ref(), Self::from_json)
    }

    /// [`TextEncoderConfig::from_json_file`] on a parsed value; the problems on failure.
    pub fn from_json(root: &Value) -> Result<Self, Vec<ConfigProblem>> {
        let mut problems = Vec::new();
        let root = root_object(root)?;
        let mut top = Section::new(root, "");
        match top.get("model_type") {
            Some(Value::String(s)) if s == "qwen2_5_vl" => {}
            Some(v) => problems.push(ConfigProblem::new("model_type", v, "\"qwen2_5_vl\"")),
            None => {}
        }
        let nested = match top.get("text_config") {
            None => None,
            Some(Value::Object(m)) => Some(m),
            Some(v) => {
                problems.push(ConfigProblem::new("text_config", v, "an object"));
                None
            }
        };
        let layout = if nested.is_some() {
            ConfigLayout::Nested
        } else {
            ConfigLayout::Flat
        };
        let mut text = match nested {
            Some(m) => Section::new(m, "text_config."),
            None => Section::new(root, ""),
        };
        if let Some(m) = nested {
            match text.get("model_type") {
                Some(Value::String(s)) if s == "qwen2_5_vl_text" || s == "qwen2_5_vl" => {}
                Some(v) => problems.push(ConfigProblem::new(
                    "text_config.model_type",
                    v,
                    "\"qwen2_5_vl_text\"",
                )),
                None => {}
            }
            // A file may repeat text keys at its root; transformers reads text_config's.
            for key in TEXT_KEYS {
                if let (Some(outer), inner) = (root.get(*key), m.get(*key)) {
                    top.seen.insert((*key).to_string());
                    if inner.is_some_and(|i| i != outer) {
                        problems.push(ConfigProblem::new(
                            *key,
                            outer,
                            format!("the value of text_config.{key} ({})", inner.unwrap()),
                        ));
                    }
                }
            }
        }
        let p = &mut problems;
        let vocab_size = text.uint("vocab_size", defaults::VOCAB_SIZE, p);
        let hidden_size = text.uint("hidden_size", defaults::HIDDEN_SIZE, p);
        let intermediate_size = text.uint("intermediate_size", defaults::INTERMEDIATE_SIZE, p);
        let num_hidden_layers = text.uint("num_hidden_layers", defaults::NUM_HIDDEN_LAYERS, p);
        let num_attention_heads =
            text.uint("num_attention_heads", defaults::NUM_ATTENTION_HEADS, p);
        let num_key_value_heads = match text.get("num_key_value_heads") {
            None if text.map.contains_key("num_key_value_heads") => num_attention_heads,
            None => defaults::NUM_KEY_VALUE_HEADS,
            Some(_) => text.uint("num_key_value_heads", 0, p),
        };
        let rms_norm_eps = text.float("rms_norm_eps", defaults::RMS_NORM_EPS, p);
        let max_position_embeddings = text.uint(
            "max_position_embeddings",
            defaults::MAX_POSITION_EMBEDDINGS,
            p,
        );
        match text.get("hidden_act") {
            None => {}
            Some(Value::String(s)) if s == "silu" => {}
            Some(v) => p.push(ConfigProblem::new(text.name("hidden_act"), v, "\"silu\"")),
        }
        let (rope_theta, mrope) = rope(&mut text, p);
        let head_dim = hidden_size.checked_div(num_attention_heads).unwrap_or(0);
        if let Some(v) = text.get("head_dim")
            && v.as_u64() != Some(head_dim as u64)
        {
            p.push(ConfigProblem::new(
                text.name("head_dim"),
                v,
                format!("hidden_size / num_attention_heads = {head_dim} (Qwen2.5-VL derives it)"),
            ));
        }
        let sliding = match text.get("use_sliding_window") {
            None | Some(Value::Bool(false)) => false,
            Some(v) => {
                p.push(ConfigProblem::new(
                    text.name("use_sliding_window"),
                    v,
                    "false (sliding-window attention is not implemented)",
                ));
                true
            }
        };
        if !sliding {
            // Only read with a sliding window.
            text.get("sliding_window");
            text.get("max_window_layers");
        }
        if let Some(v) = text.get("layer_types") {
            let full = v.as_array().is_some_and(|xs| {
                xs.len() == num_hidden_layers && xs.iter().all(|x| x == "full_attention")
            });
            if !full {
                p.push(ConfigProblem::new(
                    text.name("layer_types"),
                    v,
                    format!("\"full_attention\" for each of the {num_hidden_layers} layers"),
                ));
            }
        }
        let mrope_section = mrope.unwrap_or_else(|| defaults::MROPE_SECTION.to_vec());
        let config = TextEncoderConfig {
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            rms_norm_eps,
            rope_theta,
            mrope_section,
            max_position_embeddings,
            layout,
        };
        config.check(&text.prefix, p);
        if nested.is_some() {
            text.finish(p);
        } else {
            top.seen.extend(std::mem::take(&mut text.seen));
        }
        top.finish(p);
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(problems)
        }
    }

    /// The width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    fn check(&self, prefix: &str, p: &mut Vec<ConfigProblem>) {
        for (key, value) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
        ] {
            if value == 0 {
                p.push(ConfigProblem::new(
                    format!("{prefix}{key}"),
                    0,
                    "a positive integer",
                ));
            }
        }
        if self.num_attention_heads == 0 || self.num_key_value_heads == 0 {
            return;
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            p.push(ConfigProblem::new(
                format!("{prefix}hidden_size"),
                self.hidden_size,
                format!(
                    "a multiple of num_attention_heads = {}",
                    self.num_attention_heads
                ),
            ));
        } else if !self.head_dim().is_multiple_of(2) {
            p.push(ConfigProblem::new(
                format!("{prefix}hidden_size"),
                self.hidden_size,
                "an even head width (hidden_size / num_attention_heads) for RoPE",
            ));
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            p.push(ConfigProblem::new(
                format!("{prefix}num_key_value_heads"),
                self.num_key_value_heads,
                format!(
                    "a divisor of num_attention_heads = {}",
                    self.num_attention_heads
                ),
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            p.push(ConfigProblem::new(
                format!("{prefix}rms_norm_eps"),
                self.rms_norm_eps,
                "a positive number",
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            p.push(ConfigProblem::new(
                format!("{prefix}rope_theta"),
                self.rope_theta,
                "a positive number",
            ));
        }
        let half = self.head_dim() / 2;
        if self.mrope_section.len() != 3 || self.mrope_section.iter().sum::<usize>() != half {
            p.push(ConfigProblem::new(
                format!("{prefix}mrope_section"),
                format!("{:?}", self.mrope_section),
                format!("three sections summing to head_dim / 2 = {half}"),
            ));
        }
    }
}

/// The RoPE base and the mrope sections, from `rope_parameters` (transformers 5) or
/// `rope_theta` + `rope_scaling` (transformers 4).
fn rope(text: &mut Section<'_>, p: &mut Vec<ConfigProblem>) -> (f64, Option<Vec<usize>>) {
    let params = text.get("rope_parameters");
    let scaling = text.get("rope_scaling");
    let theta_key = text.get("rope_theta");
    let mut theta = defaults::ROPE_THETA;
    let mut section = None;
    if let Some(v) = theta_key {
        match v.as_f64() {
            Some(t) => theta = t,
            None => p.push(ConfigProblem::new(text.name("rope_theta"), v, "a number")),
        }
    }
    match (params, scaling) {
        (Some(params), None) => {
            if let Some(v) = theta_key {
                p.push(ConfigProblem::new(
                    text.name("rope_theta"),
                    v,
                    "absent when rope_parameters holds rope_theta",
                ));
            }
            let allowed = ["rope_type", "rope_theta", "mrope_section"];
            rope_object(
                params,
                text.name("rope_parameters"),
                &allowed,
                p,
                &mut theta,
                &mut section,
            );
        }
        (None, Some(scaling)) => {
            let allowed = ["type", "rope_type", "mrope_section"];
            rope_object(
                scaling,
                text.name("rope_scaling"),
                &allowed,
                p,
                &mut theta,
                &mut section,
            );
        }
        (Some(params), Some(_)) => p.push(ConfigProblem::new(
            text.name("rope_parameters"),
            params,
            "either rope_parameters (transformers 5) or rope_scaling (transformers 4), not both",
        )),
        (None, None) => {}
    }
    (theta, section)
}

/// Reads one RoPE object (`rope_parameters` or `rope_scaling`): its type must be `"default"`
/// or `"mrope"`; `rope_theta` (where allowed) and `mrope_section` are taken; any other key is
/// a problem.
fn rope_object(
    obj: &Value,
    name: String,
    allowed: &[&str],
    p: &mut Vec<ConfigProblem>,
    theta: &mut f64,
    section: &mut Option<Vec<usize>>,
) {
    let Some(m) = obj.as_object() else {
        p.push(ConfigProblem::new(&name, obj, "an object"));
        return;
    };
    for (k, v) in m {
        let key = format!("{name}.{k}");
        match k.as_str() {
            "rope_type" | "type" if v == "default" || v == "mrope" => {}
            "rope_type" | "type" => p.push(ConfigProblem::new(
                key,
                v,
                "\"default\" or \"mrope\" (other RoPE scalings are not implemented)",
            )),
            "mrope_section" => *section = mrope_section(v, key, p),
            "rope_theta" if allowed.contains(&"rope_theta") => match v.as_f64() {
                Some(t) => *theta = t,
                None => p.push(ConfigProblem::new(key, v, "a number")),
            },
            _ => p.push(ConfigProblem::new(
                key,
                v,
                format!("one of {allowed:?} (other RoPE parameters are not implemented)"),
            )),
        }
    }
}
