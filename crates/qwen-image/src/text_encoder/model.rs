//! The text path of Qwen2.5-VL in burn, numerically equal to transformers'
//! `Qwen2_5_VLForConditionalGeneration` run on text alone (`hidden_states[-1]`, the output of
//! the final RMSNorm).
//!
//! Field names follow the checkpoint keys (`model.layers.0.self_attn.q_proj`); linear weights
//! are held `[in, out]` (the checkpoint's `[out, in]` transposed).

use burn::module::{Module, Param};
use burn::tensor::activation::{silu, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::module::embedding;
use burn::tensor::{DType, Int, Tensor, TensorData};

use crate::error::QwenImageError;
use crate::tokenizer::TokenBatch;

/// A linear layer `y = x·W + b`, `W` held `[in, out]`.
#[derive(Module, Debug)]
pub struct Linear<B: Backend> {
    /// `[in, out]`.
    pub weight: Param<Tensor<B, 2>>,
    /// `[out]`, if the layer has a bias.
    pub bias: Option<Param<Tensor<B, 1>>>,
}

impl<B: Backend> Linear<B> {
    /// `x: [..., in]` to `[..., out]`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        burn::tensor::module::linear(x, self.weight.val(), self.bias.as_ref().map(|b| b.val()))
    }
}

/// RMSNorm (`Qwen2_5_VLRMSNorm`): `w · x / sqrt(mean(x²) + eps)` over the last axis.
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    /// `[dim]`.
    pub weight: Param<Tensor<B, 1>>,
    /// Epsilon inside the square root.
    pub eps: f64,
}

impl<B: Backend> RmsNorm<B> {
    /// Normalises `x: [..., dim]` over its last axis. Below f32 (bf16 weights on a GPU) the
    /// normalisation runs in f32 and its result is rounded back before the weight multiplies
    /// it, as transformers does.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let dtype = x.dtype();
        let x = if dtype == DType::F32 || dtype == DType::F64 {
            x
        } else {
            x.cast(DType::F32)
        };
        let inv = x
            .clone()
            .square()
            .mean_dim(D - 1)
            .add_scalar(self.eps)
            .sqrt()
            .recip();
        (x * inv).cast(dtype) * self.weight.val().unsqueeze::<D>()
    }
}

/// Grouped-query self-attention with RoPE (`Qwen2_5_VLAttention`): biased q / k / v
/// projections, an unbiased output projection.
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    /// Query projection, `hidden -> heads · head_dim`.
    pub q_proj: Linear<B>,
    /// Key projection, `hidden -> kv_heads · head_dim`.
    pub k_proj: Linear<B>,
    /// Value projection, `hidden -> kv_heads · head_dim`.
    pub v_proj: Linear<B>,
    /// Output projection.
    pub o_proj: Linear<B>,
    /// Query heads.
    pub num_heads: usize,
    /// Key / value heads.
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

/// Rotates half of the last axis: `(x1, x2) -> (-x2, x1)`.
fn rotate_half<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 4> {
    let d = x.dims()[3];
    let x1 = x.clone().narrow(3, 0, d / 2);
    let x2 = x.narrow(3, d / 2, d / 2);
    Tensor::cat(vec![x2.neg(), x1], 3)
}

impl<B: Backend> Attention<B> {
    /// `x: [batch, seq, hidden]`; `cos`, `sin`: `[seq, head_dim]`; `bias`: the additive mask
    /// `[batch, 1, seq, seq]`.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        cos: &Tensor<B, 2>,
        sin: &Tensor<B, 2>,
        bias: &Tensor<B, 4>,
    ) -> Tensor<B, 3> {
        let [b, s, _] = x.dims();
        let (h, kvh) = (self.num_heads, self.num_kv_heads);
        let hd = self.head_dim;
        let heads = |t: Tensor<B, 3>, n: usize| t.reshape([b, s, n, hd]).swap_dims(1, 2);
        let q = heads(self.q_proj.forward(x.clone()), h);
        let k = heads(self.k_proj.forward(x.clone()), kvh);
        let v = heads(self.v_proj.forward(x), kvh);
        let cos = cos.clone().unsqueeze::<4>();
        let sin = sin.clone().unsqueeze::<4>();
        let rope = |t: Tensor<B, 4>| t.clone() * cos.clone() + rotate_half(t) * sin.clone();
        let (q, k) = (rope(q), rope(k));
        let repeat = |t: Tensor<B, 4>| {
            if h == kvh {
                t
            } else {
                t.reshape([b, kvh, 1, s, hd])
                    .expand([b, kvh, h / kvh, s, hd])
                    .reshape([b, h, s, hd])
            }
        };
        let (k, v) = (repeat(k), repeat(v));
        let scores = q
            .matmul(k.swap_dims(2, 3))
            .mul_scalar((hd as f64).powf(-0.5))
            + bias.clone();
        // Below f32 the softmax runs in f32 (transformers' eager attention does the same).
        let dtype = scores.dtype();
        let probs = if dtype == DType::F32 || dtype == DType::F64 {
            softmax(scores, 3)
        } else {
            softmax(scores.cast(DType::F32), 3).cast(dtype)
        };
        let out = probs.matmul(v);
        self.o_proj
            .forward(out.swap_dims(1, 2).reshape([b, s, h * hd]))
    }
}

/// The SiLU-gated MLP (`Qwen2MLP`): `down(silu(gate(x)) · up(x))`, no biases.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    /// Gate projection.
    pub gate_proj: Linear<B>,
    /// Up projection.
    pub up_proj: Linear<B>,
    /// Down projection.
    pub down_proj: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    /// `x: [..., hidden]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let gate = silu(self.gate_proj.forward(x.clone()));
        self.down_proj.forward(gate * self.up_proj.forward(x))
    }
}

/// One pre-norm decoder layer (`Qwen2_5_VLDecoderLayer`).
#[derive(Module, Debug)]
pub struct DecoderLayer<B: Backend> {
    /// Norm before attention.
    pub input_layernorm: RmsNorm<B>,
    /// Self-attention.
    pub self_attn: Attention<B>,
    /// Norm before the MLP.
    pub post_attention_layernorm: RmsNorm<B>,
    /// The MLP.
    pub mlp: Mlp<B>,
}

impl<B: Backend> DecoderLayer<B> {
    fn forward(
        &self,
        x: Tensor<B, 3>,
        cos: &Tensor<B, 2>,
        sin: &Tensor<B, 2>,
        bias: &Tensor<B, 4>,
    ) -> Tensor<B, 3> {
        let x = x.clone()
            + self
                .self_attn
                .forward(self.input_layernorm.forward(x), cos, sin, bias);
        x.clone() + self.mlp.forward(self.post_attention_layernorm.forward(x))
    }
}

/// The Qwen2.5-VL text decoder: token embedding, decoder layers, final RMSNorm.
///
/// Built from a checkpoint by [`TextEncoder::load`] (or [`TextEncoder::from_dir`]).
#[derive(Module, Debug)]
pub struct TextEncoder<B: Backend> {
    /// `[vocab, hidden]`.
    pub embed_tokens: Param<Tensor<B, 2>>,
    /// The decoder layers.
    pub layers: Vec<DecoderLayer<B>>,
    /// The final norm.
    pub norm: RmsNorm<B>,
    /// RoPE base.
    pub rope_theta: f64,
}

/// RoPE tables `[seq, head_dim]` for positions `0..seq`, computed as transformers does in
/// `float32`: `inv_freq = 1 / theta^(2i / d)`, `angle = position · inv_freq`, each half of the
/// head repeated (`cat(freqs, freqs)`). Text-only prompts give the three mrope sections the same
/// position, so the sections select among identical values.
pub fn rope_tables(seq: usize, head_dim: usize, theta: f64) -> (Vec<f32>, Vec<f32>) {
    let half = head_dim / 2;
    let inv: Vec<f32> = (0..half)
        .map(|i| {
            let exponent = (2 * i) as f32 / head_dim as f32;
            1.0f32 / (theta.powf(exponent as f64) as f32)
        })
        .collect();
    let mut cos = Vec::with_capacity(seq * head_dim);
    let mut sin = Vec::with_capacity(seq * head_dim);
    for pos in 0..seq {
        let angles: Vec<f32> = inv.iter().map(|f| pos as f32 * f).collect();
        for _ in 0..2 {
            cos.extend(angles.iter().map(|a| (*a as f64).cos() as f32));
            sin.extend(angles.iter().map(|a| (*a as f64).sin() as f32));
        }
    }
    (cos, sin)
}

/// The additive attention mask `[batch, 1, seq, seq]`: 0 where query `i` may see key `j`
/// (`j <= i` and `j` is not padding), `f32::MIN` elsewhere (a finite value, as transformers
/// uses, so a row with every key masked averages instead of turning into NaN).
pub fn causal_padding_bias(mask: &[Vec<u8>]) -> Vec<f32> {
    let s = mask.first().map_or(0, Vec::len);
    let mut out = Vec::with_capacity(mask.len() * s * s);
    for row in mask {
        for i in 0..s {
            out.extend((0..s).map(|j| if j <= i && row[j] != 0 { 0.0 } else { f32::MIN }));
        }
    }
    out
}

/// The most negative finite value of a float dtype narrower than f32, as an f32 (`None` for
/// f32 and f64, whose masks keep `f32::MIN`).
fn finite_min(dtype: DType) -> Option<f32> {
    match dtype {
        // bf16's lowest finite value, -(2 - 2^-7) * 2^127.
        DType::BF16 => Some(f32::from_bits(0xFF7F_0000)),
        DType::F16 => Some(-65_504.0),
        _ => None,
    }
}

impl<B: Backend> TextEncoder<B> {
    /// The number of token rows of the embedding.
    pub fn vocab_size(&self) -> usize {
        self.embed_tokens.dims()[0]
    }

    /// The width of the hidden states.
    pub fn hidden_size(&self) -> usize {
        self.embed_tokens.dims()[1]
    }

    /// The last hidden state `[batch, seq, hidden]` of a padded token batch (after the final
    /// norm: transformers' `hidden_states[-1]`). Positions are `0..seq` for every row, as
    /// transformers 5 gives text-only input; padded positions are masked as keys.
    ///
    /// # Errors
    /// [`QwenImageError::Input`] for an empty batch, rows of different lengths, a mask of
    /// another shape, or a token id outside the vocabulary.
    pub fn forward(
        &self,
        batch: &TokenBatch,
        device: &B::Device,
    ) -> Result<Tensor<B, 3>, QwenImageError> {
        let b = batch.ids.len();
        let s = batch.ids.first().map_or(0, Vec::len);
        if b == 0 || s == 0 {
            return Err(QwenImageError::input(
                "token batch",
                format!("{b} rows of {s} tokens: nothing to encode"),
            ));
        }
        if batch.ids.iter().any(|r| r.len() != s)
            || batch.mask.len() != b
            || batch.mask.iter().any(|r| r.len() != s)
        {
            return Err(QwenImageError::input(
                "token batch",
                format!("ids and mask must both be {b} rows of {s} tokens"),
            ));
        }
        let vocab = self.vocab_size();
        if let Some(bad) = batch.ids.iter().flatten().find(|&&id| id as usize >= vocab) {
            return Err(QwenImageError::input(
                "token batch",
                format!("token id {bad} is outside the text encoder's vocabulary of {vocab}"),
            ));
        }
        let ids: Vec<i64> = batch.ids.iter().flatten().map(|&i| i as i64).collect();
        let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [b, s]), device);
        let head_dim = self.layers.first().map_or(0, |l| l.self_attn.head_dim);
        // The tables and the mask in the weights' dtype (f32 on the CPU; bf16 weights on a
        // GPU get bf16 tables, computed in f32 and rounded once, as transformers does).
        let dtype = self.embed_tokens.val().dtype();
        let (cos, sin) = rope_tables(s, head_dim, self.rope_theta);
        let cos = Tensor::<B, 2>::from_data(TensorData::new(cos, [s, head_dim]), (device, dtype));
        let sin = Tensor::<B, 2>::from_data(TensorData::new(sin, [s, head_dim]), (device, dtype));
        let mut bias = causal_padding_bias(&batch.mask);
        if let Some(min) = finite_min(dtype) {
            // f32::MIN would round to -inf in a narrower float.
            bias.iter_mut().for_each(|v| *v = v.max(min));
        }
        let bias = Tensor::<B, 4>::from_data(TensorData::new(bias, [b, 1, s, s]), (device, dtype));
        let mut x = embedding(self.embed_tokens.val(), ids);
        for layer in &self.layers {
            x = layer.forward(x, &cos, &sin, &bias);
        }
        Ok(self.norm.forward(x))
    }
}
