//! `CLIPModel` in burn, numerically equal to transformers' (`modeling_clip.py`).
//!
//! Struct fields mirror the checkpoint keys (`text_model.encoder.layers.0.self_attn.q_proj`,
//! `vision_model.pre_layrnorm`, ...). What differs is one table, [`CHECKPOINT_REMAP`].

use burn::module::{Initializer, Module, Param};
use burn::tensor::activation;
use burn::tensor::backend::Backend;
use burn::tensor::module::{attention, embedding, linear};
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Int, Tensor, TensorData};

use super::config::{ClipConfig, ClipTextConfig, ClipVisionConfig, HiddenAct};
use crate::error::RewardError;

/// How a parameter is laid out here compared with the checkpoint, and which checkpoint keys
/// are ignored. Every other parameter is stored exactly as in the checkpoint under its key.
pub const CHECKPOINT_REMAP: &[(&str, &str)] = &[
    (
        "*.{q,k,v,out}_proj.weight, *.fc{1,2}.weight, {text,visual}_projection.weight",
        "PyTorch [out, in] -> burn [in, out] (transposed)",
    ),
    (
        "vision_model.embeddings.patch_embedding.weight",
        "Conv2d [width, 3, p, p] -> [3*p*p, width]: the patch embedding is a matmul over patches flattened in (channel, row, column) order",
    ),
    ("logit_scale", "a 0-d tensor -> [1]"),
    (
        "{text,vision}_model.embeddings.position_ids",
        "ignored: a non-trainable buffer older checkpoints store",
    ),
];

/// Checkpoint keys that are buffers, not parameters: accepted and ignored.
pub(crate) const IGNORED_KEYS: &[&str] = &[
    "text_model.embeddings.position_ids",
    "vision_model.embeddings.position_ids",
];

fn normal<B: Backend, const D: usize>(
    shape: [usize; D],
    std: f64,
    device: &B::Device,
) -> Param<Tensor<B, D>> {
    Initializer::Normal { mean: 0.0, std }.init(shape, device)
}

/// A linear layer `y = x·W + b`, `W` stored `[in, out]`.
#[derive(Module, Debug)]
pub struct Linear<B: Backend> {
    /// `[in, out]`.
    pub weight: Param<Tensor<B, 2>>,
    /// `[out]`, if the layer has a bias.
    pub bias: Option<Param<Tensor<B, 1>>>,
}

impl<B: Backend> Linear<B> {
    fn new(d_in: usize, d_out: usize, bias: bool, device: &B::Device) -> Self {
        Self {
            weight: normal([d_in, d_out], 0.02, device),
            bias: bias.then(|| Initializer::Zeros.init([d_out], device)),
        }
    }

    /// `x: [..., in]` to `[..., out]`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        linear(x, self.weight.val(), self.bias.as_ref().map(|b| b.val()))
    }
}

/// Layer norm with weight and bias (PyTorch `nn.LayerNorm`): biased variance over the last
/// axis.
#[derive(Module, Debug)]
pub struct LayerNorm<B: Backend> {
    /// `[dim]`.
    pub weight: Param<Tensor<B, 1>>,
    /// `[dim]`.
    pub bias: Param<Tensor<B, 1>>,
    /// Epsilon inside the square root.
    pub eps: f64,
}

impl<B: Backend> LayerNorm<B> {
    fn new(dim: usize, eps: f64, device: &B::Device) -> Self {
        Self {
            weight: Initializer::Ones.init([dim], device),
            bias: Initializer::Zeros.init([dim], device),
            eps,
        }
    }

    /// Normalises `x: [..., dim]` over its last axis.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let mean = x.clone().mean_dim(D - 1);
        let xc = x - mean;
        let var = xc.clone().square().mean_dim(D - 1);
        let y = xc / var.add_scalar(self.eps).sqrt();
        y * self.weight.val().unsqueeze::<D>() + self.bias.val().unsqueeze::<D>()
    }
}

/// Multi-head self-attention (`CLIPAttention`).
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    /// Query projection.
    pub q_proj: Linear<B>,
    /// Key projection.
    pub k_proj: Linear<B>,
    /// Value projection.
    pub v_proj: Linear<B>,
    /// Output projection.
    pub out_proj: Linear<B>,
    /// Number of heads.
    pub num_heads: usize,
}

impl<B: Backend> Attention<B> {
    /// `x: [batch, seq, width]`; `causal` masks keys after each query (the text tower).
    pub fn forward(&self, x: Tensor<B, 3>, causal: bool) -> Tensor<B, 3> {
        let [b, s, d] = x.dims();
        let h = self.num_heads;
        let split = |t: Tensor<B, 3>| t.reshape([b, s, h, d / h]).swap_dims(1, 2);
        let q = split(self.q_proj.forward(x.clone()));
        let k = split(self.k_proj.forward(x.clone()));
        let v = split(self.v_proj.forward(x));
        let options = AttentionModuleOptions {
            is_causal: causal,
            ..Default::default()
        };
        let out = attention(q, k, v, None, None, options);
        self.out_proj
            .forward(out.swap_dims(1, 2).reshape([b, s, d]))
    }
}

/// The MLP of an encoder layer (`CLIPMLP`): `fc2(act(fc1(x)))`.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    /// First projection.
    pub fc1: Linear<B>,
    /// Second projection.
    pub fc2: Linear<B>,
    /// `true` for quick-GELU, `false` for the exact GELU.
    pub quick_gelu: bool,
}

impl<B: Backend> Mlp<B> {
    /// `x: [..., width]`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let x = self.fc1.forward(x);
        let x = if self.quick_gelu {
            x.clone() * activation::sigmoid(x.mul_scalar(1.702))
        } else {
            activation::gelu(x)
        };
        self.fc2.forward(x)
    }
}

/// One pre-norm transformer layer (`CLIPEncoderLayer`).
#[derive(Module, Debug)]
pub struct EncoderLayer<B: Backend> {
    /// Norm before attention.
    pub layer_norm1: LayerNorm<B>,
    /// Self-attention.
    pub self_attn: Attention<B>,
    /// Norm before the MLP.
    pub layer_norm2: LayerNorm<B>,
    /// The MLP.
    pub mlp: Mlp<B>,
}

impl<B: Backend> EncoderLayer<B> {
    fn new(
        width: usize,
        mlp: usize,
        heads: usize,
        act: HiddenAct,
        eps: f64,
        device: &B::Device,
    ) -> Self {
        Self {
            layer_norm1: LayerNorm::new(width, eps, device),
            self_attn: Attention {
                q_proj: Linear::new(width, width, true, device),
                k_proj: Linear::new(width, width, true, device),
                v_proj: Linear::new(width, width, true, device),
                out_proj: Linear::new(width, width, true, device),
                num_heads: heads,
            },
            layer_norm2: LayerNorm::new(width, eps, device),
            mlp: Mlp {
                fc1: Linear::new(width, mlp, true, device),
                fc2: Linear::new(mlp, width, true, device),
                quick_gelu: act == HiddenAct::QuickGelu,
            },
        }
    }

    /// `x: [batch, seq, width]`.
    pub fn forward(&self, x: Tensor<B, 3>, causal: bool) -> Tensor<B, 3> {
        let x = x.clone() + self.self_attn.forward(self.layer_norm1.forward(x), causal);
        x.clone() + self.mlp.forward(self.layer_norm2.forward(x))
    }
}

/// The layer stack (`CLIPEncoder`).
#[derive(Module, Debug)]
pub struct Encoder<B: Backend> {
    /// The layers.
    pub layers: Vec<EncoderLayer<B>>,
}

impl<B: Backend> Encoder<B> {
    /// `x: [batch, seq, width]`.
    pub fn forward(&self, mut x: Tensor<B, 3>, causal: bool) -> Tensor<B, 3> {
        for layer in &self.layers {
            x = layer.forward(x, causal);
        }
        x
    }
}

/// Token and position embeddings (`CLIPTextEmbeddings`).
#[derive(Module, Debug)]
pub struct TextEmbeddings<B: Backend> {
    /// `[vocab, width]`.
    pub token_embedding: Param<Tensor<B, 2>>,
    /// `[max_positions, width]`.
    pub position_embedding: Param<Tensor<B, 2>>,
}

/// The text tower (`CLIPTextModel`).
#[derive(Module, Debug)]
pub struct TextModel<B: Backend> {
    /// Embeddings.
    pub embeddings: TextEmbeddings<B>,
    /// Causal encoder.
    pub encoder: Encoder<B>,
    /// Norm of the pooled token.
    pub final_layer_norm: LayerNorm<B>,
}

/// Class token, patch and position embeddings (`CLIPVisionEmbeddings`).
#[derive(Module, Debug)]
pub struct VisionEmbeddings<B: Backend> {
    /// `[width]`.
    pub class_embedding: Param<Tensor<B, 1>>,
    /// `[3 * patch * patch, width]` (see [`CHECKPOINT_REMAP`]).
    pub patch_embedding: Param<Tensor<B, 2>>,
    /// `[patches + 1, width]`.
    pub position_embedding: Param<Tensor<B, 2>>,
    /// Side of a patch.
    pub patch_size: usize,
}

/// The vision tower (`CLIPVisionModel`).
#[derive(Module, Debug)]
pub struct VisionModel<B: Backend> {
    /// Embeddings.
    pub embeddings: VisionEmbeddings<B>,
    /// Norm before the encoder (transformers spells it `pre_layrnorm`).
    pub pre_layrnorm: LayerNorm<B>,
    /// Encoder.
    pub encoder: Encoder<B>,
    /// Norm of the class token.
    pub post_layernorm: LayerNorm<B>,
}

/// A CLIP model: both towers, their projections into the joint space and the logit scale.
#[derive(Module, Debug)]
pub struct ClipModel<B: Backend> {
    /// The text tower.
    pub text_model: TextModel<B>,
    /// The vision tower.
    pub vision_model: VisionModel<B>,
    /// `[vision width, projection_dim]`, no bias.
    pub visual_projection: Param<Tensor<B, 2>>,
    /// `[text width, projection_dim]`, no bias.
    pub text_projection: Param<Tensor<B, 2>>,
    /// `[1]`: the log of the temperature the cosine similarities are multiplied by.
    pub logit_scale: Param<Tensor<B, 1>>,
    /// The end-of-text id used for pooling (see [`ClipTextConfig::eos_token_id`]).
    pub eos_token_id: u32,
    /// Side of the square input image.
    pub image_size: usize,
}

fn encoder<B: Backend>(
    layers: usize,
    width: usize,
    mlp: usize,
    heads: usize,
    act: HiddenAct,
    eps: f64,
    device: &B::Device,
) -> Encoder<B> {
    Encoder {
        layers: (0..layers)
            .map(|_| EncoderLayer::new(width, mlp, heads, act, eps, device))
            .collect(),
    }
}

impl ClipConfig {
    /// A model with lazily initialised random weights (materialised only if read before
    /// weights are loaded into them). Panics on an invalid configuration (use
    /// [`ClipConfig::validate`] first for a `Result`).
    pub fn init<B: Backend>(&self, device: &B::Device) -> ClipModel<B> {
        if let Err(e) = self.validate() {
            panic!("{e}");
        }
        let t: &ClipTextConfig = &self.text_config;
        let v: &ClipVisionConfig = &self.vision_config;
        let patches = (v.image_size / v.patch_size).pow(2);
        ClipModel {
            text_model: TextModel {
                embeddings: TextEmbeddings {
                    token_embedding: normal([t.vocab_size, t.hidden_size], 0.02, device),
                    position_embedding: normal(
                        [t.max_position_embeddings, t.hidden_size],
                        0.01,
                        device,
                    ),
                },
                encoder: encoder(
                    t.num_hidden_layers,
                    t.hidden_size,
                    t.intermediate_size,
                    t.num_attention_heads,
                    t.hidden_act,
                    t.layer_norm_eps,
                    device,
                ),
                final_layer_norm: LayerNorm::new(t.hidden_size, t.layer_norm_eps, device),
            },
            vision_model: VisionModel {
                embeddings: VisionEmbeddings {
                    class_embedding: normal([v.hidden_size], 0.02, device),
                    patch_embedding: normal(
                        [3 * v.patch_size * v.patch_size, v.hidden_size],
                        0.02,
                        device,
                    ),
                    position_embedding: normal([patches + 1, v.hidden_size], 0.02, device),
                    patch_size: v.patch_size,
                },
                pre_layrnorm: LayerNorm::new(v.hidden_size, v.layer_norm_eps, device),
                encoder: encoder(
                    v.num_hidden_layers,
                    v.hidden_size,
                    v.intermediate_size,
                    v.num_attention_heads,
                    v.hidden_act,
                    v.layer_norm_eps,
                    device,
                ),
                post_layernorm: LayerNorm::new(v.hidden_size, v.layer_norm_eps, device),
            },
            visual_projection: normal([v.hidden_size, self.projection_dim], 0.02, device),
            text_projection: normal([t.hidden_size, self.projection_dim], 0.02, device),
            logit_scale: Param::from_tensor(Tensor::from_floats(
                [self.logit_scale_init_value as f32],
                device,
            )),
            eos_token_id: t.eos_token_id,
            image_size: v.image_size,
        }
    }
}

/// The position transformers pools the text tower at, for one sequence of ids: the first
/// position holding `eos_token_id`, or — with the legacy `eos_token_id == 2` — the position of
/// the largest id (first one on ties); 0 if the sequence lacks the id.
///
/// ```
/// use reward::clip::pooling_position;
/// assert_eq!(pooling_position(&[49406, 320, 1929, 49407, 49407], 49407), 3);
/// assert_eq!(pooling_position(&[49406, 320, 49407, 0, 0], 2), 2);
/// ```
pub fn pooling_position(ids: &[u32], eos_token_id: u32) -> usize {
    if eos_token_id == 2 {
        let max = ids.iter().copied().max().unwrap_or(0);
        ids.iter().position(|&i| i == max).unwrap_or(0)
    } else {
        ids.iter().position(|&i| i == eos_token_id).unwrap_or(0)
    }
}

impl<B: Backend> ClipModel<B> {
    /// Image features (`get_image_features`): `pixel_values: [batch, 3, S, S]` (preprocessed,
    /// `S` the configured image size) to `[batch, projection_dim]`, not normalised.
    pub fn image_embeds(&self, pixel_values: Tensor<B, 4>) -> Tensor<B, 2> {
        let [b, c, hh, ww] = pixel_values.dims();
        let s = self.image_size;
        assert!(
            c == 3 && hh == s && ww == s,
            "pixel values must be [batch, 3, {s}, {s}], got [{b}, {c}, {hh}, {ww}]"
        );
        let e = &self.vision_model.embeddings;
        let p = e.patch_size;
        let g = s / p;
        let patches = pixel_values
            .reshape([b, c, g, p, g, p])
            .permute([0, 2, 4, 1, 3, 5])
            .reshape([b, g * g, c * p * p]);
        let x = linear(patches, e.patch_embedding.val(), None);
        let width = x.dims()[2];
        let cls = e
            .class_embedding
            .val()
            .reshape([1, 1, width])
            .expand([b, 1, width]);
        let x = Tensor::cat(vec![cls, x], 1) + e.position_embedding.val().unsqueeze::<3>();
        let x = self.vision_model.pre_layrnorm.forward(x);
        let x = self.vision_model.encoder.forward(x, false);
        let pooled = x.narrow(1, 0, 1).reshape([b, width]);
        let pooled = self.vision_model.post_layernorm.forward(pooled);
        pooled.matmul(self.visual_projection.val())
    }

    /// Text features (`get_text_features`): token ids `[batch, seq]` (rows of equal length,
    /// `seq <= max_position_embeddings`, ids below the vocabulary size) to
    /// `[batch, projection_dim]`, not normalised. The tower is causal, so padding after the
    /// pooled token does not change the result.
    ///
    /// # Errors
    /// [`RewardError::EmptyTokenBatch`] for no rows, [`RewardError::RaggedTokenRows`] naming
    /// the first row whose length differs from row 0's, [`RewardError::TokenSequenceLength`]
    /// for rows of length 0 or above `max_position_embeddings`, and
    /// [`RewardError::TokenOutOfVocabulary`] naming an id at or above the vocabulary size.
    pub fn text_embeds(&self, ids: &[Vec<u32>]) -> Result<Tensor<B, 2>, RewardError> {
        let device = self.text_projection.val().device();
        let b = ids.len();
        if b == 0 {
            return Err(RewardError::EmptyTokenBatch);
        }
        let s = ids[0].len();
        if let Some((row, r)) = ids.iter().enumerate().find(|(_, r)| r.len() != s) {
            return Err(RewardError::RaggedTokenRows {
                row,
                expected: s,
                found: r.len(),
            });
        }
        let [vocab, width] = self.text_model.embeddings.token_embedding.val().dims();
        let max_pos = self.text_model.embeddings.position_embedding.val().dims()[0];
        if s == 0 || s > max_pos {
            return Err(RewardError::TokenSequenceLength {
                length: s,
                max: max_pos,
            });
        }
        if let Some(&id) = ids.iter().flatten().find(|&&i| i as usize >= vocab) {
            return Err(RewardError::TokenOutOfVocabulary {
                id,
                vocab_size: vocab,
            });
        }
        let flat: Vec<i64> = ids.iter().flatten().map(|&i| i as i64).collect();
        let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(flat, [b, s]), &device);
        let e = &self.text_model.embeddings;
        let x = embedding(e.token_embedding.val(), tokens)
            + e.position_embedding.val().narrow(0, 0, s).unsqueeze::<3>();
        let x = self.text_model.encoder.forward(x, true);
        let index: Vec<i64> = ids
            .iter()
            .enumerate()
            .map(|(i, r)| (i * s + pooling_position(r, self.eos_token_id)) as i64)
            .collect();
        let index = Tensor::<B, 1, Int>::from_data(TensorData::new(index, [b]), &device);
        let pooled = x.reshape([b * s, width]).select(0, index);
        let pooled = self.text_model.final_layer_norm.forward(pooled);
        Ok(pooled.matmul(self.text_projection.val()))
    }

    /// `exp(logit_scale)` on the host.
    pub fn logit_scale_exp(&self) -> f32 {
        let v: Vec<f32> = self
            .logit_scale
            .val()
            .into_data()
            .convert::<f32>()
            .to_vec()
            .expect("f32");
        v[0].exp()
    }

    /// PickScore's reference score of aligned pairs: `exp(logit_scale) * cos(image_i, text_i)`
    /// for `image_embeds, text_embeds: [batch, dim]`, as `[batch]`.
    pub fn pair_scores(
        &self,
        image_embeds: Tensor<B, 2>,
        text_embeds: Tensor<B, 2>,
    ) -> Tensor<B, 1> {
        let n = |t: Tensor<B, 2>| t.clone() / t.square().sum_dim(1).sqrt();
        let cos = (n(image_embeds) * n(text_embeds)).sum_dim(1);
        let b = cos.dims()[0];
        cos.reshape([b]) * self.logit_scale.val().exp()
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;

    use super::*;

    fn tiny() -> (ClipModel<Flex>, usize) {
        let mut config = ClipConfig::tiny();
        // the fixture's end-of-text id (the preset keeps CLIP's, outside the tiny vocabulary)
        config.text_config.eos_token_id = 587;
        let max = config.text_config.max_position_embeddings;
        (config.init::<Flex>(&Default::default()), max)
    }

    #[test]
    fn text_embeds_refuses_an_empty_batch() {
        let (model, _) = tiny();
        assert!(matches!(
            model.text_embeds(&[]),
            Err(RewardError::EmptyTokenBatch)
        ));
    }

    #[test]
    fn text_embeds_names_the_first_ragged_row() {
        let (model, _) = tiny();
        let ids = vec![vec![1, 2, 3], vec![4, 5, 6], vec![7, 8]];
        let err = model.text_embeds(&ids).unwrap_err();
        assert!(
            matches!(
                err,
                RewardError::RaggedTokenRows {
                    row: 2,
                    expected: 3,
                    found: 2
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("token row 2 has 2 ids"), "{err}");
    }

    #[test]
    fn text_embeds_refuses_sequences_of_no_token_or_beyond_the_positions() {
        let (model, max) = tiny();
        let err = model.text_embeds(&[vec![1; max + 1]]).unwrap_err();
        assert!(
            matches!(err, RewardError::TokenSequenceLength { length, max: m } if length == max + 1 && m == max),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains(&format!("length {} is outside 1..={max}", max + 1)),
            "{err}"
        );
        let err = model.text_embeds(&[vec![], vec![]]).unwrap_err();
        assert!(
            matches!(err, RewardError::TokenSequenceLength { length: 0, .. }),
            "{err}"
        );
        // the longest sequence the positions allow is embedded
        let ok = model.text_embeds(&[vec![1; max], vec![2; max]]).unwrap();
        assert_eq!(ok.dims(), [2, 16]);
    }
}
