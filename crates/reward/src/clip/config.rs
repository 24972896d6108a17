//! CLIP configurations: transformers' `CLIPConfig` layout, its defaults, presets, validation.

use std::path::Path;

use burn::config::Config;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{ConfigProblem, RewardError};

/// The MLP activation of a CLIP tower (transformers' `hidden_act`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HiddenAct {
    /// `"gelu"`: the exact, erf-based GELU (OpenCLIP / LAION models such as CLIP-H).
    Gelu,
    /// `"quick_gelu"`: `x * sigmoid(1.702 x)` (OpenAI's CLIP checkpoints; transformers'
    /// default).
    QuickGelu,
}

impl HiddenAct {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "gelu" => Some(HiddenAct::Gelu),
            "quick_gelu" => Some(HiddenAct::QuickGelu),
            _ => None,
        }
    }
}

/// The text tower (transformers' `CLIPTextConfig`; defaults are transformers' defaults).
#[derive(Config, Debug, PartialEq)]
pub struct ClipTextConfig {
    /// Token vocabulary size.
    #[config(default = 49408)]
    pub vocab_size: usize,
    /// Width of the tower.
    #[config(default = 512)]
    pub hidden_size: usize,
    /// MLP width.
    #[config(default = 2048)]
    pub intermediate_size: usize,
    /// Encoder layers.
    #[config(default = 12)]
    pub num_hidden_layers: usize,
    /// Attention heads.
    #[config(default = 8)]
    pub num_attention_heads: usize,
    /// Longest token sequence (77 for every CLIP).
    #[config(default = 77)]
    pub max_position_embeddings: usize,
    /// MLP activation.
    #[config(default = "HiddenAct::QuickGelu")]
    pub hidden_act: HiddenAct,
    /// Layer-norm epsilon.
    #[config(default = 1e-5)]
    pub layer_norm_eps: f64,
    /// The end-of-text token id, used for pooling: the first position holding it is the
    /// pooled token; the legacy value `2` (configs written before transformers 4.31) means
    /// "the position of the largest id", as transformers does.
    #[config(default = 49407)]
    pub eos_token_id: u32,
}

/// The vision tower (transformers' `CLIPVisionConfig`; defaults are transformers' defaults).
#[derive(Config, Debug, PartialEq)]
pub struct ClipVisionConfig {
    /// Width of the tower.
    #[config(default = 768)]
    pub hidden_size: usize,
    /// MLP width.
    #[config(default = 3072)]
    pub intermediate_size: usize,
    /// Encoder layers.
    #[config(default = 12)]
    pub num_hidden_layers: usize,
    /// Attention heads.
    #[config(default = 12)]
    pub num_attention_heads: usize,
    /// Input channels (3).
    #[config(default = 3)]
    pub num_channels: usize,
    /// Side of the square input image.
    #[config(default = 224)]
    pub image_size: usize,
    /// Side of a square patch.
    #[config(default = 32)]
    pub patch_size: usize,
    /// MLP activation.
    #[config(default = "HiddenAct::QuickGelu")]
    pub hidden_act: HiddenAct,
    /// Layer-norm epsilon.
    #[config(default = 1e-5)]
    pub layer_norm_eps: f64,
}

/// A CLIP model (transformers' `CLIPConfig`): two towers, the projection width and the initial
/// logit scale.
///
/// ```
/// use reward::clip::ClipConfig;
///
/// let h = ClipConfig::pickscore_v1();
/// assert_eq!(h.vision_config.patch_size, 14);
/// assert!(h.validate().is_ok());
/// let bad = ClipConfig::tiny().with_projection_dim(0);
/// assert!(bad.validate().unwrap_err().to_string().contains("projection_dim"));
/// ```
#[derive(Config, Debug, PartialEq)]
pub struct ClipConfig {
    /// The text tower.
    pub text_config: ClipTextConfig,
    /// The vision tower.
    pub vision_config: ClipVisionConfig,
    /// Width of the joint embedding space.
    #[config(default = 512)]
    pub projection_dim: usize,
    /// `logit_scale` before training (only used when no checkpoint is loaded).
    #[config(default = 2.6592)]
    pub logit_scale_init_value: f64,
}

impl ClipConfig {
    /// PickScore v1 (Kirstain et al. 2023), a fine-tuned CLIP-H/14: the architecture of
    /// `laion/CLIP-ViT-H-14-laion2B-s32B-b79K`, which `yuvalkirstain/PickScore_v1`'s
    /// `config.json` describes — text tower 1024 wide, 24 layers, 16 heads, MLP 4096; vision
    /// tower 1280 wide, 32 layers, 16 heads, MLP 5120, 224 px in 14 px patches; GELU (exact)
    /// in both; joint space 1024.
    pub fn pickscore_v1() -> Self {
        let text = ClipTextConfig::new()
            .with_hidden_size(1024)
            .with_intermediate_size(4096)
            .with_num_hidden_layers(24)
            .with_num_attention_heads(16)
            .with_hidden_act(HiddenAct::Gelu);
        let vision = ClipVisionConfig::new()
            .with_hidden_size(1280)
            .with_intermediate_size(5120)
            .with_num_hidden_layers(32)
            .with_num_attention_heads(16)
            .with_patch_size(14)
            .with_hidden_act(HiddenAct::Gelu);
        ClipConfig::new(text, vision).with_projection_dim(1024)
    }

    /// A tiny CLIP for CPU tests: the shape of the fixture model that
    /// `fixtures/generate/reward_fixtures.py` writes (text: vocabulary 640, width 32, 2 layers,
    /// 4 heads, MLP 64, quick-GELU; vision: 32 px images in 8 px patches, width 32, 2 layers,
    /// 4 heads, MLP 64, GELU; joint space 16).
    pub fn tiny() -> Self {
        let text = ClipTextConfig::new()
            .with_vocab_size(640)
            .with_hidden_size(32)
            .with_intermediate_size(64)
            .with_num_hidden_layers(2)
            .with_num_attention_heads(4)
            .with_hidden_act(HiddenAct::QuickGelu);
        let vision = ClipVisionConfig::new()
            .with_hidden_size(32)
            .with_intermediate_size(64)
            .with_num_hidden_layers(2)
            .with_num_attention_heads(4)
            .with_image_size(32)
            .with_patch_size(8)
            .with_hidden_act(HiddenAct::Gelu);
        ClipConfig::new(text, vision).with_projection_dim(16)
    }

    /// Checks every field, listing all problems at once.
    pub fn validate(&self) -> Result<(), RewardError> {
        let mut problems = Vec::new();
        let t = &self.text_config;
        let v = &self.vision_config;
        let positive = [
            ("text_config.vocab_size", t.vocab_size),
            ("text_config.hidden_size", t.hidden_size),
            ("text_config.intermediate_size", t.intermediate_size),
            ("text_config.num_attention_heads", t.num_attention_heads),
            (
                "text_config.max_position_embeddings",
                t.max_position_embeddings,
            ),
            ("vision_config.hidden_size", v.hidden_size),
            ("vision_config.intermediate_size", v.intermediate_size),
            ("vision_config.num_attention_heads", v.num_attention_heads),
            ("vision_config.image_size", v.image_size),
            ("vision_config.patch_size", v.patch_size),
            ("projection_dim", self.projection_dim),
        ];
        for (field, value) in positive {
            if value == 0 {
                problems.push(ConfigProblem::new(field, 0, "a positive integer"));
            }
        }
        for (field, hidden, heads) in [
            (
                "text_config.hidden_size",
                t.hidden_size,
                t.num_attention_heads,
            ),
            (
                "vision_config.hidden_size",
                v.hidden_size,
                v.num_attention_heads,
            ),
        ] {
            if heads > 0 && !hidden.is_multiple_of(heads) {
                problems.push(ConfigProblem::new(
                    field,
                    hidden,
                    format!("a multiple of num_attention_heads = {heads}"),
                ));
            }
        }
        if v.patch_size > 0 && !v.image_size.is_multiple_of(v.patch_size) {
            problems.push(ConfigProblem::new(
                "vision_config.image_size",
                v.image_size,
                format!("a multiple of patch_size = {}", v.patch_size),
            ));
        }
        if v.num_channels != 3 {
            problems.push(ConfigProblem::new(
                "vision_config.num_channels",
                v.num_channels,
                "3 (RGB)",
            ));
        }
        if (t.eos_token_id as usize) >= t.vocab_size && t.eos_token_id != 2 {
            problems.push(ConfigProblem::new(
                "text_config.eos_token_id",
                t.eos_token_id,
                format!("an id below vocab_size = {}", t.vocab_size),
            ));
        }
        RewardError::config("CLIP", problems)
    }

    /// Reads a transformers `config.json` of a `CLIPModel` (e.g. PickScore_v1's).
    ///
    /// Missing keys take transformers' defaults; `text_config_dict` / `vision_config_dict`
    /// (older files) override `text_config` / `vision_config` as in transformers;
    /// `image_size` / `patch_size` may be an integer or a square `[h, w]` pair; only the
    /// activations `gelu` and `quick_gelu` are supported. Every key is read, one of
    /// [`INERT_KEYS`] or of the attributes every transformers config carries
    /// ([`model_weights::PRETRAINED_CONFIG_KEYS`]), or refused by name: a `model_type` other
    /// than CLIP's, a non-empty `pruned_heads` and any unknown key are problems. Every type
    /// error, invalid value and refused key is reported together.
    pub fn from_transformers_json(path: impl AsRef<Path>) -> Result<Self, RewardError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| RewardError::io(path, e))?;
        let root: Value = serde_json::from_str(&text).map_err(|source| RewardError::Json {
            path: path.into(),
            source,
        })?;
        let mut problems = Vec::new();
        let section = |name: &str| -> Value {
            let mut merged = root.get(name).cloned().unwrap_or(Value::Null);
            if !merged.is_object() {
                merged = Value::Object(Default::default());
            }
            if let Some(Value::Object(over)) = root.get(format!("{name}_dict")) {
                for (k, v) in over {
                    merged[k] = v.clone();
                }
            }
            merged
        };
        let tv = section("text_config");
        let vv = section("vision_config");
        let mut r = Reader {
            problems: &mut problems,
        };
        let dt = ClipTextConfig::new();
        let text = ClipTextConfig {
            vocab_size: r.uint(&tv, "text_config", "vocab_size", dt.vocab_size),
            hidden_size: r.uint(&tv, "text_config", "hidden_size", dt.hidden_size),
            intermediate_size: r.uint(
                &tv,
                "text_config",
                "intermediate_size",
                dt.intermediate_size,
            ),
            num_hidden_layers: r.uint(
                &tv,
                "text_config",
                "num_hidden_layers",
                dt.num_hidden_layers,
            ),
            num_attention_heads: r.uint(
                &tv,
                "text_config",
                "num_attention_heads",
                dt.num_attention_heads,
            ),
            max_position_embeddings: r.uint(
                &tv,
                "text_config",
                "max_position_embeddings",
                dt.max_position_embeddings,
            ),
            hidden_act: r.act(&tv, "text_config", dt.hidden_act),
            layer_norm_eps: r.float(&tv, "text_config", "layer_norm_eps", dt.layer_norm_eps),
            eos_token_id: r.uint(&tv, "text_config", "eos_token_id", dt.eos_token_id as usize)
                as u32,
        };
        let dv = ClipVisionConfig::new();
        let vision = ClipVisionConfig {
            hidden_size: r.uint(&vv, "vision_config", "hidden_size", dv.hidden_size),
            intermediate_size: r.uint(
                &vv,
                "vision_config",
                "intermediate_size",
                dv.intermediate_size,
            ),
            num_hidden_layers: r.uint(
                &vv,
                "vision_config",
                "num_hidden_layers",
                dv.num_hidden_layers,
            ),
            num_attention_heads: r.uint(
                &vv,
                "vision_config",
                "num_attention_heads",
                dv.num_attention_heads,
            ),
            num_channels: r.uint(&vv, "vision_config", "num_channels", dv.num_channels),
            image_size: r.side(&vv, "vision_config", "image_size", dv.image_size),
            patch_size: r.side(&vv, "vision_config", "patch_size", dv.patch_size),
            hidden_act: r.act(&vv, "vision_config", dv.hidden_act),
            layer_norm_eps: r.float(&vv, "vision_config", "layer_norm_eps", dv.layer_norm_eps),
        };
        check_keys(&root, "", ROOT_KEYS, Some("clip"), r.problems);
        check_keys(
            &tv,
            "text_config",
            TEXT_KEYS,
            Some("clip_text_model"),
            r.problems,
        );
        check_keys(
            &vv,
            "vision_config",
            VISION_KEYS,
            Some("clip_vision_model"),
            r.problems,
        );
        let d = ClipConfig::new(ClipTextConfig::new(), ClipVisionConfig::new());
        let config = ClipConfig {
            text_config: text,
            vision_config: vision,
            projection_dim: r.uint(&root, "", "projection_dim", d.projection_dim),
            logit_scale_init_value: r.float(
                &root,
                "",
                "logit_scale_init_value",
                d.logit_scale_init_value,
            ),
        };
        if let Err(RewardError::InvalidConfig { problems: more, .. }) = config.validate() {
            problems.extend(more);
        }
        RewardError::config_file(path, "CLIP config.json", problems)?;
        Ok(config)
    }
}

/// Keys of a CLIP `config.json` (at its root or in a tower's section) accepted with no
/// effect on the embeddings or the scores, and why.
pub const INERT_KEYS: &[(&str, &str)] = &[
    ("architectures", "names the Python class"),
    ("_name_or_path", "where the file came from"),
    ("_commit_hash", "the Hub revision the file came from"),
    ("transformers_version", "the version that saved the file"),
    (
        "torch_dtype",
        "the saved dtype; each tensor's own dtype is read",
    ),
    ("dtype", "the saved dtype; each tensor's own dtype is read"),
    ("initializer_factor", "random initialisation"),
    ("initializer_range", "random initialisation"),
    ("attention_dropout", "dropout, off when scoring"),
    ("dropout", "dropout, off when scoring"),
    ("bos_token_id", "the tokenizer's; no tower reads it"),
    (
        "eos_token_id",
        "read in text_config, where it chooses the pooled token; the image tower has no tokens",
    ),
    (
        "pad_token_id",
        "padding, right of the end-of-text token whose state the causal text tower pools",
    ),
    (
        "tie_word_embeddings",
        "a language-model head, which CLIP has none of",
    ),
];

/// The keys read at the root (the towers' sections and their older `*_dict` overrides;
/// `model_type`, checked to be CLIP's).
const ROOT_KEYS: &[&str] = &[
    "text_config",
    "vision_config",
    "text_config_dict",
    "vision_config_dict",
    "projection_dim",
    "logit_scale_init_value",
    "model_type",
];

/// The keys read in `text_config`. A tower's own `projection_dim` is read by transformers'
/// single-tower `CLIPTextModelWithProjection` only; a `CLIPModel` projects both towers to
/// the root's, so it has no effect here.
const TEXT_KEYS: &[&str] = &[
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "max_position_embeddings",
    "hidden_act",
    "layer_norm_eps",
    "eos_token_id",
    "projection_dim",
    "model_type",
];

/// The keys read in `vision_config` (its `projection_dim` as the text tower's).
const VISION_KEYS: &[&str] = &[
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_channels",
    "image_size",
    "patch_size",
    "hidden_act",
    "layer_norm_eps",
    "projection_dim",
    "model_type",
];

/// Lists as problems every key of the object `v` (the root, or a tower's section named
/// `section`) that is neither in `read` nor inert nor generic, a `model_type` other than
/// `model_type`, and a non-empty `pruned_heads`.
fn check_keys(
    v: &Value,
    section: &str,
    read: &[&str],
    model_type: Option<&str>,
    problems: &mut Vec<ConfigProblem>,
) {
    let Some(map) = v.as_object() else {
        return;
    };
    for (key, value) in map {
        let name = Reader::name(section, key);
        if key == "model_type" {
            if let Some(want) = model_type
                && value.as_str() != Some(want)
            {
                problems.push(ConfigProblem::new(name, value, format!("\"{want}\"")));
            }
        } else if key == "pruned_heads" {
            if value.as_object().is_none_or(|m| !m.is_empty()) {
                problems.push(ConfigProblem::new(
                    name,
                    value,
                    "{} (pruned heads are not implemented)",
                ));
            }
        } else if !(read.contains(&key.as_str())
            || INERT_KEYS.iter().any(|(k, _)| k == key)
            || model_weights::PRETRAINED_CONFIG_KEYS.contains(&key.as_str()))
        {
            problems.push(ConfigProblem::new(
                name,
                value,
                "no such key: not a CLIP config key that flowrl implements or knows to have no \
                 effect",
            ));
        }
    }
}

struct Reader<'a> {
    problems: &'a mut Vec<ConfigProblem>,
}

impl Reader<'_> {
    fn name(section: &str, key: &str) -> String {
        if section.is_empty() {
            key.to_string()
        } else {
            format!("{section}.{key}")
        }
    }

    fn uint(&mut self, v: &Value, section: &str, key: &str, default: usize) -> usize {
        match v.get(key) {
            None | Some(Value::Null) => default,
            Some(x) => x.as_u64().map(|u| u as usize).unwrap_or_else(|| {
                self.problems.push(ConfigProblem::new(
                    Self::name(section, key),
                    x,
                    "a non-negative integer",
                ));
                default
            }),
        }
    }

    fn float(&mut self, v: &Value, section: &str, key: &str, default: f64) -> f64 {
        match v.get(key) {
            None | Some(Value::Null) => default,
            Some(x) => x.as_f64().unwrap_or_else(|| {
                self.problems
                    .push(ConfigProblem::new(Self::name(section, key), x, "a number"));
                default
            }),
        }
    }

    fn side(&mut self, v: &Value, section: &str, key: &str, default: usize) -> usize {
        match v.get(key) {
            Some(Value::Array(xs)) => {
                let sides: Vec<Option<u64>> = xs.iter().map(Value::as_u64).collect();
                match sides.as_slice() {
                    [Some(a), Some(b)] if a == b => *a as usize,
                    _ => {
                        self.problems.push(ConfigProblem::new(
                            Self::name(section, key),
                            Value::Array(xs.clone()),
                            "an integer or a square [n, n] pair",
                        ));
                        default
                    }
                }
            }
            _ => self.uint(v, section, key, default),
        }
    }

    fn act(&mut self, v: &Value, section: &str, default: HiddenAct) -> HiddenAct {
        match v.get("hidden_act") {
            None | Some(Value::Null) => default,
            Some(x) => x.as_str().and_then(HiddenAct::parse).unwrap_or_else(|| {
                self.problems.push(ConfigProblem::new(
                    Self::name(section, "hidden_act"),
                    x,
                    "\"gelu\" or \"quick_gelu\"",
                ));
                default
            }),
        }
    }
}
