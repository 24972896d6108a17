//! `AutoencoderKLQwenImage` on single images, in burn, numerically equal to diffusers'.
//!
//! The VAE is Wan 2.1's video VAE: causal 3D convolutions over a frame axis. An image is one
//! frame, and diffusers encodes and decodes the first frame of a clip on its own, with zeros
//! before it: each causal 3×3×3 convolution then reduces to the 2D convolution of its last
//! temporal slice, and the temporal up- and down-sampling convolutions do not run. That is what
//! this model computes, on `[batch, channels, height, width]` tensors. Video (more than one
//! frame) is not implemented.

use burn::module::{Module, Param};
use burn::tensor::activation::{silu, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::module::conv2d;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, Tensor, TensorData};

use model_weights::in_dtype;

use crate::error::QwenImageError;
use crate::latents::{latent_size, unpack_latents};

/// A 2D convolution, weight `[out, in, k, k]` (PyTorch's layout).
#[derive(Module, Debug)]
pub struct Conv<B: Backend> {
    /// `[out, in, k, k]`.
    pub weight: Param<Tensor<B, 4>>,
    /// `[out]`.
    pub bias: Param<Tensor<B, 1>>,
    /// Stride on both axes.
    pub stride: usize,
    /// Zero padding on every side.
    pub padding: usize,
}

impl<B: Backend> Conv<B> {
    /// `x: [batch, in, h, w]`.
    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let options = ConvOptions::new(
            [self.stride, self.stride],
            [self.padding, self.padding],
            [1, 1],
            1,
        );
        conv2d(x, self.weight.val(), Some(self.bias.val()), options)
    }
}

/// diffusers' `QwenImageRMS_norm` over channels: `x / max(‖x‖₂, 1e-12) · √channels · γ`.
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    /// `[channels]`.
    pub gamma: Param<Tensor<B, 1>>,
}

impl<B: Backend> RmsNorm<B> {
    /// `x: [batch, channels, h, w]`.
    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let c = self.gamma.dims()[0];
        let norm = x.clone().square().sum_dim(1).sqrt().clamp_min(1e-12);
        let gamma = self.gamma.val().mul_scalar((c as f64).sqrt());
        x / norm * gamma.reshape([1, c, 1, 1])
    }
}

/// `QwenImageResidualBlock`: norm, SiLU, conv, norm, SiLU, conv, plus the (1×1 projected)
/// input.
#[derive(Module, Debug)]
pub struct ResidualBlock<B: Backend> {
    /// First norm.
    pub norm1: RmsNorm<B>,
    /// First 3×3 convolution.
    pub conv1: Conv<B>,
    /// Second norm.
    pub norm2: RmsNorm<B>,
    /// Second 3×3 convolution.
    pub conv2: Conv<B>,
    /// The 1×1 projection of the input when the channel count changes.
    pub conv_shortcut: Option<Conv<B>>,
}

impl<B: Backend> ResidualBlock<B> {
    /// `x: [batch, in, h, w]` to `[batch, out, h, w]`.
    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let skip = match &self.conv_shortcut {
            Some(c) => c.forward(x.clone()),
            None => x.clone(),
        };
        let h = self.conv1.forward(silu(self.norm1.forward(x)));
        let h = self.conv2.forward(silu(self.norm2.forward(h)));
        h + skip
    }
}

/// `QwenImageAttentionBlock`: single-head self-attention over the pixels of a frame, with 1×1
/// convolutions for q, k, v and the output.
#[derive(Module, Debug)]
pub struct AttentionBlock<B: Backend> {
    /// The norm before attention.
    pub norm: RmsNorm<B>,
    /// q, k and v in one 1×1 convolution.
    pub to_qkv: Conv<B>,
    /// The output 1×1 convolution.
    pub proj: Conv<B>,
}

impl<B: Backend> AttentionBlock<B> {
    /// `x: [batch, channels, h, w]`.
    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let [b, c, h, w] = x.dims();
        let qkv = self.to_qkv.forward(self.norm.forward(x.clone()));
        // [b, 3c, h·w] -> [b, h·w, 3c]
        let qkv = qkv.reshape([b, 3 * c, h * w]).swap_dims(1, 2);
        let q = qkv.clone().narrow(2, 0, c);
        let k = qkv.clone().narrow(2, c, c);
        let v = qkv.narrow(2, 2 * c, c);
        let scores = q
            .matmul(k.swap_dims(1, 2))
            .mul_scalar((c as f64).powf(-0.5));
        let out = softmax(scores, 2).matmul(v);
        let out = out.swap_dims(1, 2).reshape([b, c, h, w]);
        self.proj.forward(out) + x
    }
}

/// `QwenImageMidBlock`: residual block, attention, residual block.
#[derive(Module, Debug)]
pub struct MidBlock<B: Backend> {
    /// The two residual blocks.
    pub resnets: Vec<ResidualBlock<B>>,
    /// The attention between them.
    pub attentions: Vec<AttentionBlock<B>>,
}

impl<B: Backend> MidBlock<B> {
    /// `x: [batch, channels, h, w]`.
    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let mut x = self.resnets[0].forward(x);
        for (attn, res) in self.attentions.iter().zip(&self.resnets[1..]) {
            x = res.forward(attn.forward(x));
        }
        x
    }
}

/// One encoder stage: residual blocks, then (except the last stage) a stride-2 convolution
/// after padding the right and bottom edges by one.
#[derive(Module, Debug)]
pub struct DownStage<B: Backend> {
    /// The residual blocks.
    pub resnets: Vec<ResidualBlock<B>>,
    /// The downsampling convolution (3×3, stride 2, no padding of its own).
    pub downsample: Option<Conv<B>>,
}

/// One decoder stage: residual blocks, then (except the last stage) a nearest-neighbour 2×
/// upsampling followed by a 3×3 convolution that halves the channels.
#[derive(Module, Debug)]
pub struct UpStage<B: Backend> {
    /// The residual blocks.
    pub resnets: Vec<ResidualBlock<B>>,
    /// The convolution after the upsampling.
    pub upsample: Option<Conv<B>>,
}

/// Nearest-neighbour 2× upsampling (`nearest-exact` at an exact factor of 2: each pixel
/// repeated 2×2).
fn upsample2x<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 4> {
    let [b, c, h, w] = x.dims();
    x.reshape([b, c, h, 1, w, 1])
        .expand([b, c, h, 2, w, 2])
        .reshape([b, c, 2 * h, 2 * w])
}

/// One row of zeros below and one column right of `x: [batch, channels, h, w]` (the
/// downsampling's `ZeroPad2d((0, 1, 0, 1))`), in `x`'s dtype: burn 0.21's `pad` builds its
/// zeros in the default float dtype, which fails for any other.
fn pad_right_bottom<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 4> {
    let [b, c, h, w] = x.dims();
    let (device, dtype) = (x.device(), x.dtype());
    let x = Tensor::cat(vec![x, Tensor::zeros([b, c, h, 1], (&device, dtype))], 3);
    Tensor::cat(
        vec![x, Tensor::zeros([b, c, 1, w + 1], (&device, dtype))],
        2,
    )
}

/// The encoder (`QwenImageEncoder3d` on one frame).
#[derive(Module, Debug)]
pub struct Encoder<B: Backend> {
    /// Image to the first stage's channels.
    pub conv_in: Conv<B>,
    /// The stages.
    pub stages: Vec<DownStage<B>>,
    /// The middle block.
    pub mid_block: MidBlock<B>,
    /// Norm before the output convolution.
    pub norm_out: RmsNorm<B>,
    /// To `2 · z_dim` channels (mean and log-variance).
    pub conv_out: Conv<B>,
}

impl<B: Backend> Encoder<B> {
    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let mut x = self.conv_in.forward(x);
        for stage in &self.stages {
            for res in &stage.resnets {
                x = res.forward(x);
            }
            if let Some(down) = &stage.downsample {
                x = down.forward(pad_right_bottom(x));
            }
        }
        let x = self.mid_block.forward(x);
        self.conv_out.forward(silu(self.norm_out.forward(x)))
    }
}

/// The decoder (`QwenImageDecoder3d` on one frame).
#[derive(Module, Debug)]
pub struct Decoder<B: Backend> {
    /// Latents to the widest channels.
    pub conv_in: Conv<B>,
    /// The middle block.
    pub mid_block: MidBlock<B>,
    /// The stages.
    pub stages: Vec<UpStage<B>>,
    /// Norm before the output convolution.
    pub norm_out: RmsNorm<B>,
    /// To image channels.
    pub conv_out: Conv<B>,
}

impl<B: Backend> Decoder<B> {
    fn forward(&self, z: Tensor<B, 4>) -> Tensor<B, 4> {
        let mut x = self.mid_block.forward(self.conv_in.forward(z));
        for stage in &self.stages {
            for res in &stage.resnets {
                x = res.forward(x);
            }
            if let Some(up) = &stage.upsample {
                x = up.forward(upsample2x(x));
            }
        }
        self.conv_out.forward(silu(self.norm_out.forward(x)))
    }
}

/// The encoder's output for a batch of images: the diagonal Gaussian's mean and its
/// log-variance clamped to `[-30, 20]` (diffusers' `DiagonalGaussianDistribution`).
#[derive(Clone, Debug)]
pub struct LatentDistribution<B: Backend> {
    /// `[batch, z_dim, h/8, w/8]`.
    pub mean: Tensor<B, 4>,
    /// `[batch, z_dim, h/8, w/8]`.
    pub logvar: Tensor<B, 4>,
}

/// The Qwen-Image VAE on single images. Built from a diffusers directory by
/// [`Vae::from_dir`].
#[derive(Module, Debug)]
pub struct Vae<B: Backend> {
    /// The encoder.
    pub encoder: Encoder<B>,
    /// 1×1 convolution on the encoder's moments.
    pub quant_conv: Conv<B>,
    /// 1×1 convolution on the latents before the decoder.
    pub post_quant_conv: Conv<B>,
    /// The decoder.
    pub decoder: Decoder<B>,
    /// Per-channel latent mean.
    pub latents_mean: Vec<f64>,
    /// Per-channel latent standard deviation.
    pub latents_std: Vec<f64>,
}

impl<B: Backend> Vae<B> {
    /// Latent channels.
    pub fn z_dim(&self) -> usize {
        self.latents_mean.len()
    }

    /// How many pixels one latent position spans on each side.
    pub fn scale_factor(&self) -> usize {
        1 << self
            .decoder
            .stages
            .iter()
            .filter(|s| s.upsample.is_some())
            .count()
    }

    /// The float dtype the VAE computes in: that of its weights. Inputs of another dtype are
    /// cast to it and outputs back to the input's dtype (bf16 weights on a GPU serve f32
    /// latents, as diffusers' pipeline casts its latents to `vae.dtype`).
    pub fn dtype(&self) -> DType {
        self.post_quant_conv.weight.val().dtype()
    }

    /// Latents `[batch, z_dim, h, w]` to images `[batch, channels, s·h, s·w]` in `[-1, 1]`
    /// (diffusers' `decode(...).sample` of a one-frame clip, clamped).
    pub fn decode(&self, z: Tensor<B, 4>) -> Tensor<B, 4> {
        self.decode_unclamped(z).clamp(-1.0, 1.0)
    }

    /// [`Vae::decode`] before its clamp to `[-1, 1]`.
    pub fn decode_unclamped(&self, z: Tensor<B, 4>) -> Tensor<B, 4> {
        let dtype = z.dtype();
        let z = in_dtype(z, self.dtype());
        in_dtype(self.decoder.forward(self.post_quant_conv.forward(z)), dtype)
    }

    /// The encoder's raw moments `[batch, 2·z_dim, h/s, w/s]` of images in `[-1, 1]`.
    ///
    /// # Panics
    /// If the image sides are not multiples of [`Vae::scale_factor`] (diffusers would round
    /// them down instead).
    pub fn encode_moments(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let [_, _, h, w] = x.dims();
        let s = self.scale_factor();
        assert!(
            h % s == 0 && w % s == 0,
            "image of {h}x{w} pixels: both sides must be multiples of the VAE's scale factor {s}"
        );
        let dtype = x.dtype();
        let x = in_dtype(x, self.dtype());
        in_dtype(self.quant_conv.forward(self.encoder.forward(x)), dtype)
    }

    /// The latent distribution of images in `[-1, 1]` (see [`Vae::encode_moments`]).
    pub fn encode(&self, x: Tensor<B, 4>) -> LatentDistribution<B> {
        let h = self.encode_moments(x);
        let z = self.z_dim();
        LatentDistribution {
            mean: h.clone().narrow(1, 0, z),
            logvar: h.narrow(1, z, z).clamp(-30.0, 20.0),
        }
    }

    /// The per-channel `(mean, 1 / std)` of the latent normalisation, each `[1, z, 1, 1]`, the
    /// reciprocal rounded to `f32` as the pipeline computes it, then to `dtype` (that of the
    /// latents, as the pipeline's `.to(latents.device, latents.dtype)`).
    fn normalisation(&self, device: &B::Device, dtype: DType) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let z = self.z_dim();
        let channel = |values: Vec<f32>| {
            Tensor::from_data(TensorData::new(values, [1, z, 1, 1]), (device, dtype))
        };
        (
            channel(self.latents_mean.iter().map(|m| *m as f32).collect()),
            channel(
                self.latents_std
                    .iter()
                    .map(|s| 1.0f32 / *s as f32)
                    .collect(),
            ),
        )
    }

    /// Undoes the pipeline's latent normalisation: `latents / (1 / std) + mean` per channel,
    /// as `QwenImagePipeline` writes it (the reciprocal rounded to `f32` first).
    pub fn denormalize(&self, latents: Tensor<B, 4>) -> Tensor<B, 4> {
        let (mean, inv_std) = self.normalisation(&latents.device(), latents.dtype());
        latents / inv_std + mean
    }

    /// The pipeline's latent normalisation of encoded images: `(latents - mean) · (1 / std)`.
    pub fn normalize(&self, latents: Tensor<B, 4>) -> Tensor<B, 4> {
        let (mean, inv_std) = self.normalisation(&latents.device(), latents.dtype());
        (latents - mean) * inv_std
    }

    /// The pipeline's last step (`QwenImagePipeline.__call__` with `output_type="pt"`): the
    /// packed tokens of an image of `height` × `width` pixels unpacked, their normalisation
    /// undone ([`Vae::denormalize`]), decoded, and mapped from `[-1, 1]` to `[0, 1]`.
    ///
    /// # Errors
    /// [`QwenImageError::Input`] when the tokens do not fit the image size.
    pub fn decode_packed(
        &self,
        tokens: Tensor<B, 3>,
        height: usize,
        width: usize,
    ) -> Result<Tensor<B, 4>, QwenImageError> {
        let (h, w) = latent_size(height, width, self.scale_factor());
        // As the pipeline: the latents in the VAE's dtype before their normalisation is undone.
        let dtype = tokens.dtype();
        let latents = in_dtype(unpack_latents(tokens, h, w)?, self.dtype());
        let images = self.decode(self.denormalize(latents));
        Ok(in_dtype(
            images.mul_scalar(0.5).add_scalar(0.5).clamp(0.0, 1.0),
            dtype,
        ))
    }
}
