//! Weight IO: transformers safetensors checkpoints (`model.safetensors`, or shards named by
//! `model.safetensors.index.json`), memory-mapped, converted to `f32` one tensor at a time,
//! every missing / unexpected / mis-shaped / unconvertible key reported together.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use burn::module::{Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use memmap2::Mmap;
use safetensors::tensor::{Dtype, Metadata, TensorInfo};

use super::config::ClipConfig;
use super::model::{ClipModel, EncoderLayer, IGNORED_KEYS, LayerNorm, Linear};
use crate::error::{DtypeProblem, RewardError, ShapeMismatch, WeightReport};

/// File name of a single-file transformers checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// File name of a sharded transformers checkpoint's index.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// File name of a transformers model configuration.
pub const CONFIG_FILE: &str = "config.json";

struct Shard {
    mmap: Mmap,
    data_start: usize,
    tensors: HashMap<String, TensorInfo>,
}

/// A memory-mapped transformers checkpoint (one file or shards).
pub struct Checkpoint {
    path: PathBuf,
    shards: Vec<Shard>,
    keys: BTreeMap<String, usize>,
}

fn open_shard(path: &Path) -> Result<Shard, RewardError> {
    let file = File::open(path).map_err(|e| RewardError::io(path, e))?;
    // SAFETY: the mapping is read-only and lives as long as `Shard`; a checkpoint modified by
    // another process while mapped is outside what any safetensors reader can guard.
    #[allow(unsafe_code)]
    let mmap = unsafe { Mmap::map(&file) }.map_err(|e| RewardError::io(path, e))?;
    let (n, meta): (usize, Metadata) =
        safetensors::SafeTensors::read_metadata(&mmap).map_err(|source| {
            RewardError::Safetensors {
                path: path.into(),
                source,
            }
        })?;
    let tensors = meta
        .tensors()
        .into_iter()
        .map(|(k, info)| (k, info.clone()))
        .collect();
    Ok(Shard {
        mmap,
        data_start: 8 + n,
        tensors,
    })
}

impl Checkpoint {
    /// Opens `model.safetensors.index.json` (sharded) or `model.safetensors` in `dir`, or a
    /// `.safetensors` file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, RewardError> {
        let path = path.as_ref();
        if path.is_file() {
            return Self::from_shards(path, vec![(path.into(), open_shard(path)?)]);
        }
        let index = path.join(INDEX_FILE);
        if index.is_file() {
            let text = std::fs::read_to_string(&index).map_err(|e| RewardError::io(&index, e))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|source| RewardError::Json {
                    path: index.clone(),
                    source,
                })?;
            let Some(map) = v.get("weight_map").and_then(|m| m.as_object()) else {
                return Err(RewardError::JsonField {
                    path: index,
                    field: "weight_map".into(),
                    expected: "an object of tensor name -> shard file",
                });
            };
            let mut files: Vec<String> = Vec::new();
            for f in map.values() {
                let Some(f) = f.as_str() else {
                    return Err(RewardError::JsonField {
                        path: index,
                        field: "weight_map".into(),
                        expected: "shard file names as strings",
                    });
                };
                if !files.iter().any(|x| x == f) {
                    files.push(f.to_string());
                }
            }
            files.sort();
            let shards = files
                .iter()
                .map(|f| {
                    let p = path.join(f);
                    open_shard(&p).map(|s| (p, s))
                })
                .collect::<Result<Vec<_>, _>>()?;
            for (k, f) in map {
                let f = f.as_str().expect("checked");
                let i = files.iter().position(|x| x == f).expect("listed");
                if !shards[i].1.tensors.contains_key(k) {
                    return Err(RewardError::IndexMismatch {
                        path: index,
                        key: k.clone(),
                        shard: f.to_string(),
                    });
                }
            }
            return Self::from_shards(path, shards);
        }
        let single = path.join(SINGLE_FILE);
        if single.is_file() {
            return Self::from_shards(path, vec![(single.clone(), open_shard(&single)?)]);
        }
        Err(RewardError::NoCheckpoint { dir: path.into() })
    }

    fn from_shards(path: &Path, shards: Vec<(PathBuf, Shard)>) -> Result<Self, RewardError> {
        let mut keys = BTreeMap::new();
        for (i, (p, s)) in shards.iter().enumerate() {
            for k in s.tensors.keys() {
                if let Some(prev) = keys.insert(k.clone(), i) {
                    return Err(RewardError::IndexMismatch {
                        path: path.into(),
                        key: k.clone(),
                        shard: format!("{} (also in {})", p.display(), shards[prev].0.display()),
                    });
                }
            }
        }
        Ok(Self {
            path: path.into(),
            shards: shards.into_iter().map(|(_, s)| s).collect(),
            keys,
        })
    }

    /// The file or directory it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// All tensor names, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    fn bytes(&self, key: &str) -> Option<(&TensorInfo, &[u8])> {
        let shard = &self.shards[*self.keys.get(key)?];
        let info = &shard.tensors[key];
        let (a, b) = info.data_offsets;
        Some((
            info,
            &shard.mmap[shard.data_start + a..shard.data_start + b],
        ))
    }
}

fn to_f32(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        Dtype::F64 => bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32)
            .collect(),
        _ => return None,
    })
}

/// Row-major `[rows, cols]` to `[cols, rows]`.
fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; values.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = values[r * cols + c];
        }
    }
    out
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

        let mut report = WeightReport::default();
        let mut expected: HashSet<String> = IGNORED_KEYS.iter().map(|k| k.to_string()).collect();
        let mut ready = Vec::new();
        for slot in slots {
            expected.insert(slot.key.clone());
            let Some((info, bytes)) = checkpoint.bytes(&slot.key) else {
                report.missing.push(slot.key);
                continue;
            };
            if !matches!(
                info.dtype,
                Dtype::F64 | Dtype::F32 | Dtype::F16 | Dtype::BF16
            ) {
                report.unsupported_dtype.push(DtypeProblem {
                    key: slot.key,
                    dtype: format!("{:?}", info.dtype),
                });
                continue;
            }
            if info.shape != slot.shape {
                report.mismatched.push(ShapeMismatch {
                    key: slot.key,
                    expected: slot.shape,
                    found: info.shape.clone(),
                });
                continue;
            }
            ready.push((slot, info.dtype, bytes));
        }
        report.unexpected = checkpoint
            .keys()
            .filter(|k| !expected.contains(*k))
            .map(str::to_string)
            .collect();
        report.sort();
        if !report.is_clean() {
            return Err(RewardError::Weights {
                path: checkpoint.path().into(),
                report,
            });
        }
        for (slot, dtype, bytes) in ready {
            let values = to_f32(dtype, bytes).expect("supported dtype");
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
