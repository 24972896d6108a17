//! Loading the text encoder from a transformers checkpoint through the shared loader
//! [`model_weights`]: one file or shards, memory-mapped, every missing / unexpected /
//! mis-shaped key reported together before any tensor is read.

use std::path::Path;

use burn::module::Param;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};
use model_weights::{Checkpoint, TRANSFORMERS, transpose};

use super::config::TextEncoderConfig;
use super::model::{Attention, DecoderLayer, Linear, Mlp, RmsNorm, TextEncoder};
use crate::error::QwenImageError;

/// File name of a transformers model configuration.
pub const CONFIG_FILE: &str = "config.json";

/// Where the text decoder's tensors live in a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyLayout {
    /// `model.embed_tokens.weight`, `model.layers.N...`, `visual...`: what transformers 5
    /// saves (it writes the original names back) and what the published checkpoints hold.
    Legacy,
    /// `model.language_model.embed_tokens.weight`, `model.visual...`: transformers 4.52+'s
    /// module names, as some tools save them.
    LanguageModel,
}

impl KeyLayout {
    fn prefix(self) -> &'static str {
        match self {
            KeyLayout::Legacy => "model.",
            KeyLayout::LanguageModel => "model.language_model.",
        }
    }

    fn detect(ckpt: &Checkpoint) -> Self {
        if ckpt.contains("model.language_model.embed_tokens.weight") {
            KeyLayout::LanguageModel
        } else {
            KeyLayout::Legacy
        }
    }
}

/// Checkpoint keys read by no part of the text path: the vision tower and the language-model
/// head.
fn ignored(key: &str) -> bool {
    key == "lm_head.weight" || key.starts_with("visual.") || key.starts_with("model.visual.")
}

/// One tensor's destination.
enum Layout {
    /// Stored `[out, in]`, held `[in, out]`.
    Transposed,
    /// Stored and held alike.
    Same,
}

struct Reader<'a, B: Backend> {
    ckpt: &'a Checkpoint,
    prefix: &'static str,
    /// The dtype the tensors are made in (converted on the host).
    dtype: DType,
    device: &'a B::Device,
}

impl<B: Backend> Reader<'_, B> {
    fn values(&self, key: &str) -> Result<Vec<f32>, QwenImageError> {
        Ok(self.ckpt.read_f32(&format!("{}{key}", self.prefix))?)
    }

    fn tensor<const D: usize>(
        &self,
        key: &str,
        shape: [usize; D],
        layout: Layout,
    ) -> Result<Param<Tensor<B, D>>, QwenImageError> {
        let mut values = self.values(key)?;
        let mut shape = shape;
        if let Layout::Transposed = layout {
            // `shape` is the checkpoint's [out, in].
            values = transpose(&values, shape[0], shape[1]);
            shape.swap(0, 1);
        }
        Ok(Param::from_tensor(Tensor::from_data(
            TensorData::new(values, shape),
            (self.device, self.dtype),
        )))
    }

    fn linear(
        &self,
        key: &str,
        d_in: usize,
        d_out: usize,
        bias: bool,
    ) -> Result<Linear<B>, QwenImageError> {
        Ok(Linear {
            weight: self.tensor(&format!("{key}.weight"), [d_out, d_in], Layout::Transposed)?,
            bias: if bias {
                Some(self.tensor(&format!("{key}.bias"), [d_out], Layout::Same)?)
            } else {
                None
            },
        })
    }

    fn norm(&self, key: &str, dim: usize, eps: f64) -> Result<RmsNorm<B>, QwenImageError> {
        Ok(RmsNorm {
            weight: self.tensor(&format!("{key}.weight"), [dim], Layout::Same)?,
            eps,
        })
    }
}

/// The `(key, shape)` pairs the text path reads, in the checkpoint's layout and names
/// relative to the decoder's prefix.
pub fn expected_keys(c: &TextEncoderConfig) -> Vec<(String, Vec<usize>)> {
    let (d, m, hd) = (c.hidden_size, c.intermediate_size, c.head_dim());
    let (q, kv) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
    let mut keys = vec![("embed_tokens.weight".to_string(), vec![c.vocab_size, d])];
    for i in 0..c.num_hidden_layers {
        let l = format!("layers.{i}");
        for (name, shape) in [
            ("input_layernorm.weight", vec![d]),
            ("post_attention_layernorm.weight", vec![d]),
            ("self_attn.q_proj.weight", vec![q, d]),
            ("self_attn.q_proj.bias", vec![q]),
            ("self_attn.k_proj.weight", vec![kv, d]),
            ("self_attn.k_proj.bias", vec![kv]),
            ("self_attn.v_proj.weight", vec![kv, d]),
            ("self_attn.v_proj.bias", vec![kv]),
            ("self_attn.o_proj.weight", vec![d, q]),
            ("mlp.gate_proj.weight", vec![m, d]),
            ("mlp.up_proj.weight", vec![m, d]),
            ("mlp.down_proj.weight", vec![d, m]),
        ] {
            keys.push((format!("{l}.{name}"), shape));
        }
    }
    keys.push(("norm.weight".to_string(), vec![d]));
    keys
}

impl<B: Backend> TextEncoder<B> {
    /// Loads a text encoder directory (a diffusers directory's `text_encoder/`):
    /// `config.json` ([`TextEncoderConfig::from_json_file`]) and `model.safetensors` or the
    /// shards of `model.safetensors.index.json`, in either [`KeyLayout`]. The vision tower and
    /// the language-model head are skipped; any other key the text path does not read is an
    /// error, as is a missing or mis-shaped one (all listed at once, before any tensor is
    /// read). Tensors of any float dtype are converted to `f32`
    /// ([`TextEncoder::from_dir_variant_in`] makes them in another dtype).
    ///
    /// # Errors
    /// [`QwenImageError::Config`] for the configuration, [`QwenImageError::Weights`] for the
    /// checkpoint (naming the file and every bad key).
    pub fn from_dir(
        dir: impl AsRef<Path>,
        device: &B::Device,
    ) -> Result<(Self, TextEncoderConfig), QwenImageError> {
        Self::from_dir_variant(dir, None, device)
    }

    /// [`TextEncoder::from_dir`] reading a variant's files (`model.bf16.safetensors` or
    /// `model.safetensors.index.bf16.json` for `Some("bf16")`), as transformers' `variant=`.
    ///
    /// # Errors
    /// As [`TextEncoder::from_dir`]; a missing variant is an error, never a fall back.
    pub fn from_dir_variant(
        dir: impl AsRef<Path>,
        variant: Option<&str>,
        device: &B::Device,
    ) -> Result<(Self, TextEncoderConfig), QwenImageError> {
        Self::from_dir_variant_in(dir, variant, DType::F32, device)
    }

    /// [`TextEncoder::from_dir_variant`] with the weights made in `dtype` (bf16: half the
    /// memory), each tensor converted on the host as it is read, so the device never holds an
    /// f32 copy. The encoder computes in its weights' dtype.
    ///
    /// # Errors
    /// As [`TextEncoder::from_dir`].
    pub fn from_dir_variant_in(
        dir: impl AsRef<Path>,
        variant: Option<&str>,
        dtype: DType,
        device: &B::Device,
    ) -> Result<(Self, TextEncoderConfig), QwenImageError> {
        let dir = dir.as_ref();
        let config = TextEncoderConfig::from_json_file(dir.join(CONFIG_FILE))?;
        let ckpt = Checkpoint::open_variant(dir, &[TRANSFORMERS], variant)?;
        let model = Self::load_in(&ckpt, &config, dtype, device)?;
        Ok((model, config))
    }

    /// Builds the text encoder of `config` from an open checkpoint (see
    /// [`TextEncoder::from_dir`]).
    ///
    /// # Errors
    /// [`QwenImageError::Weights`] naming every missing, unexpected or mis-shaped key.
    pub fn load(
        ckpt: &Checkpoint,
        config: &TextEncoderConfig,
        device: &B::Device,
    ) -> Result<Self, QwenImageError> {
        Self::load_in(ckpt, config, DType::F32, device)
    }

    /// [`TextEncoder::load`] with the weights made in `dtype` on the host.
    ///
    /// # Errors
    /// As [`TextEncoder::load`].
    pub fn load_in(
        ckpt: &Checkpoint,
        config: &TextEncoderConfig,
        dtype: DType,
        device: &B::Device,
    ) -> Result<Self, QwenImageError> {
        let layout = KeyLayout::detect(ckpt);
        let prefix = layout.prefix();
        let expected: Vec<(String, Vec<usize>)> = expected_keys(config)
            .into_iter()
            .map(|(k, s)| (format!("{prefix}{k}"), s))
            .collect();
        let skipped: Vec<&str> = ckpt.keys().filter(|k| ignored(k)).collect();
        ckpt.check(expected, &skipped)?;
        let r = Reader::<B> {
            ckpt,
            prefix,
            dtype,
            device,
        };
        let c = config;
        let (d, m, hd) = (c.hidden_size, c.intermediate_size, c.head_dim());
        let (q, kv) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let l = format!("layers.{i}");
            layers.push(DecoderLayer {
                input_layernorm: r.norm(&format!("{l}.input_layernorm"), d, c.rms_norm_eps)?,
                self_attn: Attention {
                    q_proj: r.linear(&format!("{l}.self_attn.q_proj"), d, q, true)?,
                    k_proj: r.linear(&format!("{l}.self_attn.k_proj"), d, kv, true)?,
                    v_proj: r.linear(&format!("{l}.self_attn.v_proj"), d, kv, true)?,
                    o_proj: r.linear(&format!("{l}.self_attn.o_proj"), q, d, false)?,
                    num_heads: c.num_attention_heads,
                    num_kv_heads: c.num_key_value_heads,
                    head_dim: hd,
                },
                post_attention_layernorm: r.norm(
                    &format!("{l}.post_attention_layernorm"),
                    d,
                    c.rms_norm_eps,
                )?,
                mlp: Mlp {
                    gate_proj: r.linear(&format!("{l}.mlp.gate_proj"), d, m, false)?,
                    up_proj: r.linear(&format!("{l}.mlp.up_proj"), d, m, false)?,
                    down_proj: r.linear(&format!("{l}.mlp.down_proj"), m, d, false)?,
                },
            });
        }
        Ok(TextEncoder {
            embed_tokens: r.tensor("embed_tokens.weight", [c.vocab_size, d], Layout::Same)?,
            layers,
            norm: r.norm("norm", d, c.rms_norm_eps)?,
            rope_theta: c.rope_theta,
        })
    }
}
