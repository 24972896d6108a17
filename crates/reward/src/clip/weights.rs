//! Weight IO: transformers safetensors checkpoints (`model.safetensors`, or shards named by
//! `model.safetensors.index.json`) read through the shared loader [`model_weights`]:
//! memory-mapped, converted to `f32` one tensor at a time, every missing / unexpected /
//! mis-shaped / unconvertible key reported together.

use std::path::Path;

use burn::module::{Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use model_weights::{TRANSFORMERS, transpose};

use super::config::ClipConfig;
use super::model::{ClipModel, EncoderLayer, IGNORED_KEYS, LayerNorm, Linear};
use crate::error::RewardError;

/// File name of a single-file transformers checkpoint.
pub const SINGLE_FILE: &str = TRANSFORMERS.single;
/// File name of a sharded transformers checkpoint's index.
pub const INDEX_FILE: &str = TRANSFORMERS.index;
/// File name of a transformers model configuration.
pub const CONFIG_FILE: &str = "config.json";

/// A memory-mapped transformers checkpoint (one file or shards).
///
/// A thin wrapper of the shared [`model_weights::Checkpoint`] ([`Checkpoint::weights`]) with
/// transformers' file names and this crate's error type.
#[derive(Debug)]
pub struct Checkpoint {
    inner: model_weights::Checkpoint,
}

impl Checkpoint {
    /// Opens `model.safetensors.index.json` (sharded) or `model.safetensors` in `dir`, or a
    /// `.safetensors` file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, RewardError> {
        Ok(Self {
            inner: model_weights::Checkpoint::open(path, &[TRANSFORMERS])?,
        })
    }

    /// The shared loader's checkpoint underneath (dtypes, shapes, reading, reports).
    pub fn weights(&self) -> &model_weights::Checkpoint {
        &self.inner
    }

    /// The file or directory it was opened from.
    pub fn path(&self) -> &Path {
        self.inner.path()
    }

    /// All tensor names, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.inner.keys()
    }
}

impl From<model_weights::Checkpoint> for Checkpoint {
    fn from(inner: model_weights::Checkpoint) -> Self {
        Self { inner }
    }
}

/// Where a checkpoint tensor goes and how it is laid out there.
enum Target<'a, B: Backend> {
    /// Stored `[out, in]`, held `[in, out]`.
    Transposed(&'a mut Param<Tensor<B, 2>>),
    /// Stored and held as the same 2-d shape.
    Same2(&'a mut Param<Tensor<B, 2>>),
    /// Stored and held as the same 1-d shape (or a 0-d scalar held as `[1]`).
    Same1(&'a mut Param<Tensor<B, 1>>),
    /// A conv weight `[out, c, p, p]` held as `[c*p*p, out]`.
    Patch(&'a mut Param<Tensor<B, 2>>),
}

struct Slot<'a, B: Backend> {
    key: String,
    shape: Vec<usize>,
    target: Target<'a, B>,
}

fn set<B: Backend, const D: usize>(param: &mut Param<Tensor<B, D>>, value: Tensor<B, D>) {
    let id: ParamId = param.id;
    *param = Param::initialized(id, value);
}

fn linear_slots<'a, B: Backend>(
    name: &str,
    l: &'a mut Linear<B>,
    d_in: usize,
    d_out: usize,
    out: &mut Vec<Slot<'a, B>>,
) {
    out.push(Slot {
        key: format!("{name}.weight"),
        shape: vec![d_out, d_in],
        target: Target::Transposed(&mut l.weight),
    });
    if let Some(b) = l.bias.as_mut() {
        out.push(Slot {
            key: format!("{name}.bias"),
            shape: vec![d_out],
            target: Target::Same1(b),
        });
    }
}

fn norm_slots<'a, B: Backend>(
    name: &str,
    n: &'a mut LayerNorm<B>,
    dim: usize,
    out: &mut Vec<Slot<'a, B>>,
) {
    out.push(Slot {
        key: format!("{name}.weight"),
        shape: vec![dim],
        target: Target::Same1(&mut n.weight),
    });
    out.push(Slot {
        key: format!("{name}.bias"),
        shape: vec![dim],
        target: Target::Same1(&mut n.bias),
    });
}

fn layer_slots<'a, B: Backend>(
    name: &str,
    l: &'a mut EncoderLayer<B>,
    width: usize,
    mlp: usize,
    out: &mut Vec<Slot<'a, B>>,
) {
    norm_slots(
        &format!("{name}.layer_norm1"),
        &mut l.layer_norm1,
        width,
        out,
    );
    let a = &mut l.self_attn;
    linear_slots(
        &format!("{name}.self_attn.q_proj"),
        &mut a.q_proj,
        width,
        width,
        out,
    );
    linear_slots(
        &format!("{name}.self_attn.k_proj"),
        &mut a.k_proj,
        width,
        width,
        out,
    );
    linear_slots(
        &format!("{name}.self_attn.v_proj"),
        &mut a.v_proj,
        width,
        width,
        out,
    );
    linear_slots(
        &format!("{name}.self_attn.out_proj"),
        &mut a.out_proj,
        width,
        width,
        out,
    );
    norm_slots(
        &format!("{name}.layer_norm2"),
        &mut l.layer_norm2,
        width,
        out,
    );
    linear_slots(&format!("{name}.mlp.fc1"), &mut l.mlp.fc1, width, mlp, out);
    linear_slots(&format!("{name}.mlp.fc2"), &mut l.mlp.fc2, mlp, width, out);
}

impl<B: Backend> ClipModel<B> {
    /// Loads a transformers `CLIPModel` directory (`config.json` plus `model.safetensors` or a
    /// sharded checkpoint) onto `device`, weights as `f32`.
    pub fn from_pretrained(dir: impl AsRef<Path>, device: &B::Device) -> Result<Self, RewardError> {
        let dir = dir.as_ref();
        let config = ClipConfig::from_transformers_json(dir.join(CONFIG_FILE))?;
        let checkpoint = Checkpoint::open(dir)?;
        config.init::<B>(device).load_weights(&config, &checkpoint)
    }

    /// Loads every weight of `config`'s model from `checkpoint`. All problems are reported
    /// together in [`RewardError::Weights`]; the buffers of [`super::model::CHECKPOINT_REMAP`]
    /// are ignored.
    pub fn load_weights(
        mut self,
        config: &ClipConfig,
        checkpoint: &Checkpoint,
    ) -> Result<Self, RewardError> {
        let device = self.text_projection.lazy_device();
        let t = &config.text_config;
        let v = &config.vision_config;
        let patches = (v.image_size / v.patch_size).pow(2);
        let mut slots: Vec<Slot<'_, B>> = Vec::new();
        {
            let tm = &mut self.text_model;
            slots.push(Slot {
                key: "text_model.embeddings.token_embedding.weight".into(),
                shape: vec![t.vocab_size, t.hidden_size],
                target: Target::Same2(&mut tm.embeddings.token_embedding),
            });
            slots.push(Slot {
                key: "text_model.embeddings.position_embedding.weight".into(),
                shape: vec![t.max_position_embeddings, t.hidden_size],
                target: Target::Same2(&mut tm.embeddings.position_embedding),
            });
            for (i, l) in tm.encoder.layers.iter_mut().enumerate() {
                layer_slots(
                    &format!("text_model.encoder.layers.{i}"),
                    l,
                    t.hidden_size,
                    t.intermediate_size,
                    &mut slots,
                );
            }
            norm_slots(
                "text_model.final_layer_norm",
                &mut tm.final_layer_norm,
                t.hidden_size,
                &mut slots,
            );
        }
        {
            let vm = &mut self.vision_model;
            slots.push(Slot {
                key: "vision_model.embeddings.class_embedding".into(),
                shape: vec![v.hidden_size],
                target: Target::Same1(&mut vm.embeddings.class_embedding),
            });
            slots.push(Slot {
                key: "vision_model.embeddings.patch_embedding.weight".into(),
                shape: vec![v.hidden_size, v.num_channels, v.patch_size, v.patch_size],
                target: Target::Patch(&mut vm.embeddings.patch_embedding),
            });
            slots.push(Slot {
                key: "vision_model.embeddings.position_embedding.weight".into(),
                shape: vec![patches + 1, v.hidden_size],
                target: Target::Same2(&mut vm.embeddings.position_embedding),
            });
            norm_slots(
                "vision_model.pre_layrnorm",
                &mut vm.pre_layrnorm,
                v.hidden_size,
                &mut slots,
            );
            for (i, l) in vm.encoder.layers.iter_mut().enumerate() {
                layer_slots(
                    &format!("vision_model.encoder.layers.{i}"),
                    l,
                    v.hidden_size,
                    v.intermediate_size,
                    &mut slots,
                );
            }
            norm_slots(
                "vision_model.post_layernorm",
                &mut vm.post_layernorm,
                v.hidden_size,
                &mut slots,
            );
        }
        slots.push(Slot {
            key: "visual_projection.weight".into(),
            shape: vec![config.projection_dim, v.hidden_size],
            target: Target::Transposed(&mut self.visual_projection),
        });
        slots.push(Slot {
            key: "text_projection.weight".into(),
            shape: vec![config.projection_dim, t.hidden_size],
            target: Target::Transposed(&mut self.text_projection),
        });
        slots.push(Slot {
            key: "logit_scale".into(),
            shape: vec![],
            target: Target::Same1(&mut self.logit_scale),
        });

        // Every problem, from the headers alone, before any tensor is read.
        let ckpt = checkpoint.weights();
        ckpt.check(slots.iter().map(|s| (&s.key, &s.shape)), IGNORED_KEYS)?;
        for slot in slots {
            let values = ckpt.read_f32(&slot.key)?;
            let s = &slot.shape;
            match slot.target {
                Target::Transposed(p) => {
                    let t = transpose(&values, s[0], s[1]);
                    set(
                        p,
                        Tensor::from_data(TensorData::new(t, [s[1], s[0]]), &device),
                    );
                }
                Target::Same2(p) => {
                    set(
                        p,
                        Tensor::from_data(TensorData::new(values, [s[0], s[1]]), &device),
                    );
                }
                Target::Same1(p) => {
                    let n = values.len();
                    set(p, Tensor::from_data(TensorData::new(values, [n]), &device));
                }
                Target::Patch(p) => {
                    let k = s[1] * s[2] * s[3];
                    let t = transpose(&values, s[0], k);
                    set(p, Tensor::from_data(TensorData::new(t, [k, s[0]]), &device));
                }
            }
        }
        Ok(self)
    }
}
