//! The model configuration, its presets and its validation.

use std::path::Path;

use burn::config::Config;
use serde_json::Value;

use crate::error::{ConfigProblem, DitError, KeyProblem};

/// Keys of a transformer `config.json` that change nothing in the model, and why.
pub const INERT_CONFIG_KEYS: &[(&str, &str)] = &[
    ("_class_name", "checked to be QwenImageTransformer2DModel"),
    ("_diffusers_version", "the version that saved the file"),
    ("_name_or_path", "where the file came from"),
    (
        "pooled_projection_dim",
        "written by early Qwen-Image releases; diffusers does not read it",
    ),
];

/// diffusers' flags for the Qwen-Image variants this crate does not implement: accepted when
/// `false` (the base model), refused by name when `true`, with what each would change.
pub const UNIMPLEMENTED_FLAGS: &[(&str, &str)] = &[
    (
        "zero_cond_t",
        "a second, zero timestep embedding for the condition image tokens (Qwen-Image-Edit-2511)",
    ),
    (
        "use_additional_t_cond",
        "an extra learned timestep condition added to the timestep embedding",
    ),
    (
        "use_layer3d_rope",
        "the layered 3-D RoPE of Qwen-Image-Layered (a different frame axis)",
    ),
];

/// The keys [`QwenImageConfig::from_diffusers_json`] reads.
const READ_KEYS: &[&str] = &[
    "patch_size",
    "in_channels",
    "out_channels",
    "num_layers",
    "attention_head_dim",
    "num_attention_heads",
    "joint_attention_dim",
    "guidance_embeds",
    "axes_dims_rope",
];

/// Every key of a transformer `config.json` is read, inert, or an unimplemented flag at
/// `false`; the others are listed together.
fn check_keys(path: &Path, v: &Value) -> Result<(), DitError> {
    let Some(map) = v.as_object() else {
        return Err(DitError::ConfigKeys {
            path: path.into(),
            problems: vec![KeyProblem {
                key: "(root)".into(),
                given: v.to_string(),
                expected: "a JSON object".into(),
            }],
        });
    };
    let mut problems = Vec::new();
    for (key, value) in map {
        let k = key.as_str();
        let problem = |expected: String| KeyProblem {
            key: key.clone(),
            given: value.to_string(),
            expected,
        };
        if let Some((_, what)) = UNIMPLEMENTED_FLAGS.iter().find(|(f, _)| *f == k) {
            if !matches!(value, Value::Bool(false) | Value::Null) {
                problems.push(problem(format!("false: not implemented ({what})")));
            }
        } else if k == "_class_name" {
            if value != "QwenImageTransformer2DModel" {
                problems.push(problem("\"QwenImageTransformer2DModel\"".into()));
            }
        } else if !READ_KEYS.contains(&k) && !INERT_CONFIG_KEYS.iter().any(|(i, _)| *i == k) {
            problems.push(problem(
                "no such key in a QwenImageTransformer2DModel this crate implements".into(),
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(DitError::ConfigKeys {
            path: path.into(),
            problems,
        })
    }
}

/// Configuration of [`QwenImageTransformer2DModel`](crate::QwenImageTransformer2DModel).
///
/// Field names are diffusers' `QwenImageTransformer2DModel.__init__` arguments (and the keys of
/// a hub `transformer/config.json`), so [`QwenImageConfig::from_diffusers_json`] reads a
/// downloaded checkpoint's config as it is. The inner width is
/// `num_attention_heads * attention_head_dim`; `axes_dims_rope` splits one head's dimension
/// between the frame, height and width axes of the 3-axis RoPE, so it must sum to
/// `attention_head_dim` with every entry even. RoPE's `theta = 10000` and `scale_rope = true`
/// are fixed in diffusers (not configuration) and fixed here too.
///
/// ```
/// use dit_models::QwenImageConfig;
///
/// let real = QwenImageConfig::qwen_image();
/// assert_eq!(real.inner_dim(), 3072);
/// assert!(real.validate().is_ok());
///
/// let bad = QwenImageConfig::tiny().with_axes_dims_rope([4, 6, 5]);
/// let err = bad.validate().unwrap_err().to_string();
/// assert!(err.contains("axes_dims_rope"), "{err}");
/// ```
#[derive(Config, Debug, PartialEq)]
pub struct QwenImageConfig {
    /// Side of the square latent patch packed into one token (`2`).
    #[config(default = 2)]
    pub patch_size: usize,
    /// Channels of one packed image token (`16 latent channels * 2 * 2 = 64`).
    #[config(default = 64)]
    pub in_channels: usize,
    /// Latent channels of the output before packing; the output token has
    /// `patch_size^2 * out_channels` channels.
    #[config(default = 16)]
    pub out_channels: usize,
    /// Number of dual-stream transformer blocks.
    #[config(default = 60)]
    pub num_layers: usize,
    /// Dimension of one attention head.
    #[config(default = 128)]
    pub attention_head_dim: usize,
    /// Number of attention heads.
    #[config(default = 24)]
    pub num_attention_heads: usize,
    /// Channels of the text-encoder hidden states (`encoder_hidden_states`).
    #[config(default = 3584)]
    pub joint_attention_dim: usize,
    /// Guidance-distilled variant. Must be `false`: diffusers 0.35.2 builds the same timestep
    /// embedding either way and its forward cannot take a guidance value, so no checkpoint
    /// exercises it.
    #[config(default = false)]
    pub guidance_embeds: bool,
    /// Per-axis RoPE dimensions (frame, height, width); they sum to `attention_head_dim`.
    #[config(default = "[16, 56, 56]")]
    pub axes_dims_rope: [usize; 3],
}

/// RoPE base of every axis (diffusers: `QwenEmbedRope(theta=10000, ...)`).
pub const ROPE_THETA: f64 = 10000.0;
/// Epsilon of every norm in the model (diffusers: `eps=1e-6` throughout).
pub const NORM_EPS: f64 = 1e-6;

impl QwenImageConfig {
    /// The real Qwen-Image transformer (about 20B parameters).
    ///
    /// Source: the hub's `Qwen/Qwen-Image` `transformer/config.json` — `patch_size 2`,
    /// `in_channels 64`, `out_channels 16`, `num_layers 60`, `attention_head_dim 128`,
    /// `num_attention_heads 24`, `joint_attention_dim 3584`, `guidance_embeds false`,
    /// `axes_dims_rope [16, 56, 56]` — which are also the defaults of diffusers 0.35.2's
    /// `QwenImageTransformer2DModel.__init__` (`out_channels` defaults to 16 there). Keys of
    /// that file diffusers does not read (e.g. `pooled_projection_dim`) are ignored.
    pub fn qwen_image() -> Self {
        Self::new()
    }

    /// A tiny shape for CPU tests: 2 blocks, 2 heads of 16, inner width 32, text width 24,
    /// RoPE axes `[4, 6, 6]`, 16 input channels, 4 output latent channels. It is the shape of
    /// the fixture model that `fixtures/generate/dit_models_fixtures.py` builds.
    pub fn tiny() -> Self {
        Self::new()
            .with_in_channels(16)
            .with_out_channels(4)
            .with_num_layers(2)
            .with_attention_head_dim(16)
            .with_num_attention_heads(2)
            .with_joint_attention_dim(24)
            .with_axes_dims_rope([4, 6, 6])
    }

    /// Inner (hidden) width: `num_attention_heads * attention_head_dim`.
    pub fn inner_dim(&self) -> usize {
        self.num_attention_heads * self.attention_head_dim
    }

    /// Channels of one output token: `patch_size^2 * out_channels`.
    pub fn out_token_channels(&self) -> usize {
        self.patch_size * self.patch_size * self.out_channels
    }

    /// Checks every field, listing all problems at once.
    pub fn validate(&self) -> Result<(), DitError> {
        let mut problems = Vec::new();
        let mut positive = |field: &'static str, v: usize| {
            if v == 0 {
                problems.push(ConfigProblem {
                    field,
                    given: "0".into(),
                    allowed: "a positive integer".into(),
                });
            }
        };
        positive("patch_size", self.patch_size);
        positive("in_channels", self.in_channels);
        positive("out_channels", self.out_channels);
        positive("attention_head_dim", self.attention_head_dim);
        positive("num_attention_heads", self.num_attention_heads);
        positive("joint_attention_dim", self.joint_attention_dim);
        let axes = self.axes_dims_rope;
        if axes.iter().any(|d| *d == 0 || !d.is_multiple_of(2))
            || axes.iter().sum::<usize>() != self.attention_head_dim
        {
            problems.push(ConfigProblem {
                field: "axes_dims_rope",
                given: format!("{axes:?}"),
                allowed: format!(
                    "three positive even dimensions summing to attention_head_dim = {}",
                    self.attention_head_dim
                ),
            });
        }
        if self.guidance_embeds {
            problems.push(ConfigProblem {
                field: "guidance_embeds",
                given: "true".into(),
                allowed:
                    "false (diffusers 0.35.2 has no working guidance embedding for Qwen-Image)"
                        .into(),
            });
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(DitError::InvalidConfig { problems })
        }
    }

    /// Reads a diffusers `config.json` (e.g. a hub checkpoint's `transformer/config.json`).
    ///
    /// Missing keys take diffusers' defaults (those of [`Self::qwen_image`]);
    /// `out_channels: null` means `in_channels`, as in diffusers. Every key present is either
    /// read, one of [`INERT_CONFIG_KEYS`], or one of diffusers' variant flags
    /// ([`UNIMPLEMENTED_FLAGS`]: accepted at `false`, refused by name when `true`); any other
    /// key is an error naming it ([`DitError::ConfigKeys`]). The result is validated.
    pub fn from_diffusers_json(path: impl AsRef<Path>) -> Result<Self, DitError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| DitError::io(path, e))?;
        let v: Value = serde_json::from_str(&text).map_err(|source| DitError::Json {
            path: path.into(),
            source,
        })?;
        check_keys(path, &v)?;
        let field_err = |field: &'static str, expected: &'static str| DitError::JsonField {
            path: path.into(),
            field,
            expected,
        };
        let mut c = Self::qwen_image();
        let uint = |field: &'static str, default: usize| -> Result<usize, DitError> {
            match v.get(field) {
                None => Ok(default),
                Some(x) => x
                    .as_u64()
                    .map(|u| u as usize)
                    .ok_or_else(|| field_err(field, "a non-negative integer")),
            }
        };
        c.patch_size = uint("patch_size", c.patch_size)?;
        c.in_channels = uint("in_channels", c.in_channels)?;
        c.out_channels = match v.get("out_channels") {
            Some(Value::Null) => c.in_channels,
            _ => uint("out_channels", c.out_channels)?,
        };
        c.num_layers = uint("num_layers", c.num_layers)?;
        c.attention_head_dim = uint("attention_head_dim", c.attention_head_dim)?;
        c.num_attention_heads = uint("num_attention_heads", c.num_attention_heads)?;
        c.joint_attention_dim = uint("joint_attention_dim", c.joint_attention_dim)?;
        if let Some(g) = v.get("guidance_embeds") {
            c.guidance_embeds = g
                .as_bool()
                .ok_or_else(|| field_err("guidance_embeds", "a boolean"))?;
        }
        if let Some(a) = v.get("axes_dims_rope") {
            let dims: Option<Vec<usize>> = a
                .as_array()
                .map(|xs| xs.iter().map(|x| x.as_u64().map(|u| u as usize)).collect())
                .and_then(|x| x);
            match dims.as_deref() {
                Some([f, h, w]) => c.axes_dims_rope = [*f, *h, *w],
                _ => return Err(field_err("axes_dims_rope", "three non-negative integers")),
            }
        }
        c.validate()?;
        Ok(c)
    }

    /// The diffusers `config.json` of this configuration (what a merged export writes).
    pub fn to_diffusers_json(&self) -> Value {
        serde_json::json!({
            "_class_name": "QwenImageTransformer2DModel",
            "_diffusers_version": "0.42.1",
            "patch_size": self.patch_size,
            "in_channels": self.in_channels,
            "out_channels": self.out_channels,
            "num_layers": self.num_layers,
            "attention_head_dim": self.attention_head_dim,
            "num_attention_heads": self.num_attention_heads,
            "joint_attention_dim": self.joint_attention_dim,
            "guidance_embeds": self.guidance_embeds,
            "axes_dims_rope": self.axes_dims_rope,
        })
    }
}
