//! Loading the VAE from a diffusers checkpoint through the shared loader [`model_weights`].
//!
//! Causal 3D convolutions are stored `[out, in, t, k, k]`; on a single frame only their last
//! temporal slice meets the image (the others meet the zero frames before it), so that slice
//! is what is read. The temporal convolutions of the 3D resamplers (`time_conv`) never run on
//! the first frame and are skipped by name.

use std::path::Path;

use burn::module::Param;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};
use model_weights::{Checkpoint, DIFFUSERS};

use super::config::VaeConfig;
use super::model::{
    AttentionBlock, Conv, Decoder, DownStage, Encoder, MidBlock, ResidualBlock, RmsNorm, UpStage,
    Vae,
};
use crate::error::QwenImageError;

/// File name of a diffusers model configuration.
pub const CONFIG_FILE: &str = "config.json";

/// How a convolution is stored.
#[derive(Clone, Copy)]
enum Kind {
    /// `QwenImageCausalConv3d`, `[out, in, t, k, k]`.
    Causal { t: usize },
    /// `nn.Conv2d`, `[out, in, k, k]`.
    Plain,
}

/// A convolution's kernel side, storage, stride and padding.
#[derive(Clone, Copy)]
struct Spec {
    k: usize,
    kind: Kind,
    stride: usize,
    padding: usize,
}

impl Spec {
    /// A causal `k`×`k`×`k` convolution with the padding that keeps the size.
    fn causal(k: usize) -> Self {
        Self {
            k,
            kind: Kind::Causal { t: k },
            stride: 1,
            padding: k / 2,
        }
    }

    /// A 2D convolution.
    fn plain(k: usize, stride: usize, padding: usize) -> Self {
        Self {
            k,
            kind: Kind::Plain,
            stride,
            padding,
        }
    }
}

/// Every tensor the model reads: key, stored shape, and (for convolutions) how to lay it out.
struct Plan {
    keys: Vec<(String, Vec<usize>)>,
}

impl Plan {
    fn conv(&mut self, key: &str, d_in: usize, d_out: usize, k: usize, kind: Kind) {
        let shape = match kind {
            Kind::Causal { t } => vec![d_out, d_in, t, k, k],
            Kind::Plain => vec![d_out, d_in, k, k],
        };
        self.keys.push((format!("{key}.weight"), shape));
        self.keys.push((format!("{key}.bias"), vec![d_out]));
    }

    fn norm(&mut self, key: &str, dim: usize, image: bool) {
        let shape = if image {
            vec![dim, 1, 1]
        } else {
            vec![dim, 1, 1, 1]
        };
        self.keys.push((format!("{key}.gamma"), shape));
    }
}

struct Reader<'a, B: Backend> {
    ckpt: &'a Checkpoint,
    /// The dtype the tensors are made in (converted on the host, each value rounded to the
    /// nearest).
    dtype: DType,
    device: &'a B::Device,
    plan: Option<&'a mut Plan>,
}

impl<B: Backend> Reader<'_, B> {
    fn read(&self, key: &str) -> Result<Vec<f32>, QwenImageError> {
        Ok(self.ckpt.read_f32(key)?)
    }

    fn param<const D: usize>(&self, values: Vec<f32>, shape: [usize; D]) -> Param<Tensor<B, D>> {
        Param::from_tensor(Tensor::from_data(
            TensorData::new(values, shape),
            (self.device, self.dtype),
        ))
    }

    /// A convolution; in planning mode only its keys are recorded.
    fn conv(
        &mut self,
        key: &str,
        d_in: usize,
        d_out: usize,
        spec: Spec,
    ) -> Result<Option<Conv<B>>, QwenImageError> {
        let Spec {
            k,
            kind,
            stride,
            padding,
        } = spec;
        if let Some(plan) = self.plan.as_deref_mut() {
            plan.conv(key, d_in, d_out, k, kind);
            return Ok(None);
        }
        let stored = self.read(&format!("{key}.weight"))?;
        let weight = match kind {
            Kind::Plain => stored,
            Kind::Causal { t } => {
                // [out, in, t, k, k] -> the slice t - 1 as [out, in, k, k].
                let plane = k * k;
                let mut w = Vec::with_capacity(d_out * d_in * plane);
                for oi in 0..d_out * d_in {
                    let start = (oi * t + (t - 1)) * plane;
                    w.extend_from_slice(&stored[start..start + plane]);
                }
                w
            }
        };
        Ok(Some(Conv {
            weight: self.param(weight, [d_out, d_in, k, k]),
            bias: self.param(self.read(&format!("{key}.bias"))?, [d_out]),
            stride,
            padding,
        }))
    }

    /// A causal 3×3×3 (padding 1) or 1×1×1 convolution.
    fn causal(
        &mut self,
        key: &str,
        d_in: usize,
        d_out: usize,
        k: usize,
    ) -> Result<Option<Conv<B>>, QwenImageError> {
        self.conv(key, d_in, d_out, Spec::causal(k))
    }

    fn norm(
        &mut self,
        key: &str,
        dim: usize,
        image: bool,
    ) -> Result<Option<RmsNorm<B>>, QwenImageError> {
        if let Some(plan) = self.plan.as_deref_mut() {
            plan.norm(key, dim, image);
            return Ok(None);
        }
        Ok(Some(RmsNorm {
            gamma: self.param(self.read(&format!("{key}.gamma"))?, [dim]),
        }))
    }

    fn residual(
        &mut self,
        key: &str,
        d_in: usize,
        d_out: usize,
    ) -> Result<Option<ResidualBlock<B>>, QwenImageError> {
        let norm1 = self.norm(&format!("{key}.norm1"), d_in, false)?;
        let conv1 = self.causal(&format!("{key}.conv1"), d_in, d_out, 3)?;
        let norm2 = self.norm(&format!("{key}.norm2"), d_out, false)?;
        let conv2 = self.causal(&format!("{key}.conv2"), d_out, d_out, 3)?;
        let conv_shortcut = if d_in != d_out {
            self.causal(&format!("{key}.conv_shortcut"), d_in, d_out, 1)?
        } else {
            None
        };
        Ok(match (norm1, conv1, norm2, conv2) {
            (Some(norm1), Some(conv1), Some(norm2), Some(conv2)) => Some(ResidualBlock {
                norm1,
                conv1,
                norm2,
                conv2,
                conv_shortcut,
            }),
            _ => None,
        })
    }

    fn attention(
        &mut self,
        key: &str,
        dim: usize,
    ) -> Result<Option<AttentionBlock<B>>, QwenImageError> {
        let norm = self.norm(&format!("{key}.norm"), dim, true)?;
        let to_qkv = self.conv(&format!("{key}.to_qkv"), dim, 3 * dim, Spec::plain(1, 1, 0))?;
        let proj = self.conv(&format!("{key}.proj"), dim, dim, Spec::plain(1, 1, 0))?;
        Ok(match (norm, to_qkv, proj) {
            (Some(norm), Some(to_qkv), Some(proj)) => Some(AttentionBlock { norm, to_qkv, proj }),
            _ => None,
        })
    }

    fn mid(&mut self, key: &str, dim: usize) -> Result<Option<MidBlock<B>>, QwenImageError> {
        let r0 = self.residual(&format!("{key}.resnets.0"), dim, dim)?;
        let a0 = self.attention(&format!("{key}.attentions.0"), dim)?;
        let r1 = self.residual(&format!("{key}.resnets.1"), dim, dim)?;
        Ok(match (r0, a0, r1) {
            (Some(r0), Some(a0), Some(r1)) => Some(MidBlock {
                resnets: vec![r0, r1],
                attentions: vec![a0],
            }),
            _ => None,
        })
    }

    /// Reads (or plans) the whole VAE; `skipped` collects the `time_conv` keys.
    fn vae(
        &mut self,
        c: &VaeConfig,
        skipped: &mut Vec<String>,
    ) -> Result<Option<Vae<B>>, QwenImageError> {
        let base = c.base_dim;
        let n = c.dim_mult.len();
        // Encoder.
        let mut dims = vec![base];
        dims.extend(c.dim_mult.iter().map(|m| base * m));
        let conv_in = self.causal("encoder.conv_in", c.input_channels, dims[0], 3)?;
        let mut stages = Vec::new();
        let mut j = 0;
        for i in 0..n {
            let (mut d_in, d_out) = (dims[i], dims[i + 1]);
            let mut resnets = Vec::new();
            for _ in 0..c.num_res_blocks {
                resnets.extend(self.residual(&format!("encoder.down_blocks.{j}"), d_in, d_out)?);
                d_in = d_out;
                j += 1;
            }
            let mut downsample = None;
            if i != n - 1 {
                let key = format!("encoder.down_blocks.{j}");
                downsample = self.conv(
                    &format!("{key}.resample.1"),
                    d_out,
                    d_out,
                    Spec::plain(3, 2, 0),
                )?;
                if c.temperal_downsample[i] {
                    skipped.push(format!("{key}.time_conv.weight"));
                    skipped.push(format!("{key}.time_conv.bias"));
                }
                j += 1;
            }
            stages.push(DownStage {
                resnets,
                downsample,
            });
        }
        let top = dims[n];
        let mid = self.mid("encoder.mid_block", top)?;
        let norm_out = self.norm("encoder.norm_out", top, false)?;
        let conv_out = self.causal("encoder.conv_out", top, 2 * c.z_dim, 3)?;
        let quant_conv = self.causal("quant_conv", 2 * c.z_dim, 2 * c.z_dim, 1)?;
        let post_quant_conv = self.causal("post_quant_conv", c.z_dim, c.z_dim, 1)?;
        let encoder = match (conv_in, mid, norm_out, conv_out) {
            (Some(conv_in), Some(mid_block), Some(norm_out), Some(conv_out)) => Some(Encoder {
                conv_in,
                stages,
                mid_block,
                norm_out,
                conv_out,
            }),
            _ => None,
        };
        // Decoder.
        let mut dims = vec![base * c.dim_mult[n - 1]];
        dims.extend(c.dim_mult.iter().rev().map(|m| base * m));
        let d_conv_in = self.causal("decoder.conv_in", c.z_dim, dims[0], 3)?;
        let d_mid = self.mid("decoder.mid_block", dims[0])?;
        let mut up = Vec::new();
        let temperal_upsample: Vec<bool> = c.temperal_downsample.iter().rev().copied().collect();
        for i in 0..n {
            let (mut d_in, d_out) = (if i > 0 { dims[i] / 2 } else { dims[i] }, dims[i + 1]);
            let mut resnets = Vec::new();
            for k in 0..=c.num_res_blocks {
                resnets.extend(self.residual(
                    &format!("decoder.up_blocks.{i}.resnets.{k}"),
                    d_in,
                    d_out,
                )?);
                d_in = d_out;
            }
            let mut upsample = None;
            if i != n - 1 {
                let key = format!("decoder.up_blocks.{i}.upsamplers.0");
                upsample = self.conv(
                    &format!("{key}.resample.1"),
                    d_out,
                    d_out / 2,
                    Spec::plain(3, 1, 1),
                )?;
                if temperal_upsample[i] {
                    skipped.push(format!("{key}.time_conv.weight"));
                    skipped.push(format!("{key}.time_conv.bias"));
                }
            }
            up.push(UpStage { resnets, upsample });
        }
        let last = dims[n];
        let d_norm = self.norm("decoder.norm_out", last, false)?;
        let d_conv_out = self.causal("decoder.conv_out", last, c.input_channels, 3)?;
        let decoder = match (d_conv_in, d_mid, d_norm, d_conv_out) {
            (Some(conv_in), Some(mid_block), Some(norm_out), Some(conv_out)) => Some(Decoder {
                conv_in,
                mid_block,
                stages: up,
                norm_out,
                conv_out,
            }),
            _ => None,
        };
        Ok(match (encoder, quant_conv, post_quant_conv, decoder) {
            (Some(encoder), Some(quant_conv), Some(post_quant_conv), Some(decoder)) => Some(Vae {
                encoder,
                quant_conv,
                post_quant_conv,
                decoder,
                latents_mean: c.latents_mean.clone(),
                latents_std: c.latents_std.clone(),
            }),
            _ => None,
        })
    }
}

impl<B: Backend> Vae<B> {
    /// Loads a VAE directory (a diffusers directory's `vae/`): `config.json`
    /// ([`VaeConfig::from_json_file`]) and `diffusion_pytorch_model.safetensors` or its
    /// shards. Every missing, unexpected or mis-shaped key is reported together before any
    /// tensor is read; the temporal convolutions (`time_conv`, which never run on an image) are
    /// skipped by name. Tensors of any float dtype are converted to `f32`
    /// ([`Vae::from_dir_variant_in`] makes them in another dtype).
    ///
    /// # Errors
    /// [`QwenImageError::Config`] for the configuration, [`QwenImageError::Weights`] for the
    /// checkpoint.
    pub fn from_dir(
        dir: impl AsRef<Path>,
        device: &B::Device,
    ) -> Result<(Self, VaeConfig), QwenImageError> {
        Self::from_dir_variant(dir, None, device)
    }

    /// [`Vae::from_dir`] reading a variant's files
    /// (`diffusion_pytorch_model.bf16.safetensors` for `Some("bf16")`), as diffusers'
    /// `variant=`.
    ///
    /// # Errors
    /// As [`Vae::from_dir`]; a missing variant is an error, never a fall back.
    pub fn from_dir_variant(
        dir: impl AsRef<Path>,
        variant: Option<&str>,
        device: &B::Device,
    ) -> Result<(Self, VaeConfig), QwenImageError> {
        Self::from_dir_variant_in(dir, variant, DType::F32, device)
    }

    /// [`Vae::from_dir_variant`] with the weights made in `dtype` on the host as they are
    /// read (each value rounded to the nearest of `dtype`), so that the device never holds
    /// an `f32` copy of a model it runs in bf16.
    ///
    /// # Errors
    /// As [`Vae::from_dir`].
    pub fn from_dir_variant_in(
        dir: impl AsRef<Path>,
        variant: Option<&str>,
        dtype: DType,
        device: &B::Device,
    ) -> Result<(Self, VaeConfig), QwenImageError> {
        let dir = dir.as_ref();
        let config = VaeConfig::from_json_file(dir.join(CONFIG_FILE))?;
        let ckpt = Checkpoint::open_variant(dir, &[DIFFUSERS], variant)?;
        Ok((Self::load_in(&ckpt, &config, dtype, device)?, config))
    }

    /// Builds the VAE of `config` from an open checkpoint (see [`Vae::from_dir`]).
    ///
    /// # Errors
    /// [`QwenImageError::Weights`] naming every missing, unexpected or mis-shaped key.
    pub fn load(
        ckpt: &Checkpoint,
        config: &VaeConfig,
        device: &B::Device,
    ) -> Result<Self, QwenImageError> {
        Self::load_in(ckpt, config, DType::F32, device)
    }

    /// [`Vae::load`] with the weights made in `dtype` on the host.
    ///
    /// # Errors
    /// As [`Vae::load`].
    pub fn load_in(
        ckpt: &Checkpoint,
        config: &VaeConfig,
        dtype: DType,
        device: &B::Device,
    ) -> Result<Self, QwenImageError> {
        let mut plan = Plan { keys: Vec::new() };
        let mut skipped = Vec::new();
        Reader::<B> {
            ckpt,
            dtype,
            device,
            plan: Some(&mut plan),
        }
        .vae(config, &mut skipped)?;
        let skipped: Vec<&str> = skipped.iter().map(String::as_str).collect();
        ckpt.check(plan.keys, &skipped)?;
        let vae = Reader::<B> {
            ckpt,
            dtype,
            device,
            plan: None,
        }
        .vae(config, &mut Vec::new())?;
        Ok(vae.expect("every tensor was read"))
    }
}
