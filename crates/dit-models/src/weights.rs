//! Weight IO: memory-mapped diffusers safetensors checkpoints (single-file and sharded),
//! dtype conversion, the base-model hash, and a streaming safetensors writer. The one place
//! this crate touches files of tensors.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use burn::module::{Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};
use memmap2::Mmap;
use safetensors::tensor::{Dtype, Metadata, TensorInfo};
use sha2::{Digest, Sha256};

use crate::error::{DitError, DtypeProblem, ShapeMismatch, WeightReport};
use crate::model::{LayerMut, LayerRef, QwenImageTransformer2DModel, checkpoint_name};
use crate::{QwenImageConfig, layers::Linear};

/// File name of a single-file diffusers checkpoint.
pub const SINGLE_FILE: &str = "diffusion_pytorch_model.safetensors";
/// File name of a sharded diffusers checkpoint's index.
pub const INDEX_FILE: &str = "diffusion_pytorch_model.safetensors.index.json";
/// File name of a diffusers model configuration.
pub const CONFIG_FILE: &str = "config.json";

/// The dtype weights are given on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightDtype {
    /// `f32`, converted on the host (bf16 -> f32 is exact). The CPU choice.
    F32,
    /// `bf16` (f32 checkpoints are rounded to nearest even on the host; bf16 ones are kept
    /// as stored): half the memory, for GPU backends with bf16 kernels. Feed bf16 activations;
    /// the model creates its host tables (RoPE, timestep sinusoids) in the activations' dtype.
    /// Not exercised by the tests: burn 0.21's CPU backends (Flex, NdArray) are f32/f64 only.
    Bf16,
}

/// How to load a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// Device dtype of the weights.
    pub dtype: WeightDtype,
    /// Compute the base-model hash ([`hash_tensors`]) while loading. It reads every weight
    /// once more through sha256 (tens of seconds at 20B); adapter contracts need it.
    pub hash: bool,
}

impl Default for LoadOptions {
    /// `f32` weights, hash computed.
    fn default() -> Self {
        Self {
            dtype: WeightDtype::F32,
            hash: true,
        }
    }
}

struct Shard {
    path: PathBuf,
    mmap: Mmap,
    data_start: usize,
    tensors: HashMap<String, TensorInfo>,
}

/// A memory-mapped diffusers checkpoint: one `.safetensors` file or the shards named by a
/// `diffusion_pytorch_model.safetensors.index.json`. Tensors are read (and converted) one at
/// a time from the mapping; nothing is copied up front.
pub struct Checkpoint {
    path: PathBuf,
    shards: Vec<Shard>,
    keys: BTreeMap<String, usize>,
}

/// Name and shape of a stored tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredTensor {
    /// safetensors dtype name (`F32`, `BF16`, ...).
    pub dtype: String,
    /// Shape as stored.
    pub shape: Vec<usize>,
}

fn open_shard(path: &Path) -> Result<Shard, DitError> {
    let file = File::open(path).map_err(|e| DitError::io(path, e))?;
    // SAFETY: the mapping is read-only and lives as long as `Shard`; a checkpoint modified
    // by another process while mapped is outside what any safetensors reader can guard.
    #[allow(unsafe_code)]
    let mmap = unsafe { Mmap::map(&file) }.map_err(|e| DitError::io(path, e))?;
    let (n, meta): (usize, Metadata) =
        safetensors::SafeTensors::read_metadata(&mmap).map_err(|source| DitError::Safetensors {
            path: path.into(),
            source,
        })?;
    let tensors = meta
        .tensors()
        .into_iter()
        .map(|(k, info)| (k, info.clone()))
        .collect();
    Ok(Shard {
        path: path.into(),
        mmap,
        data_start: 8 + n,
        tensors,
    })
}

fn read_json(path: &Path) -> Result<serde_json::Value, DitError> {
    let text = std::fs::read_to_string(path).map_err(|e| DitError::io(path, e))?;
    serde_json::from_str(&text).map_err(|source| DitError::Json {
        path: path.into(),
        source,
    })
}

impl Checkpoint {
    /// Opens a checkpoint: a `.safetensors` file, or a directory holding either
    /// `diffusion_pytorch_model.safetensors.index.json` (sharded) or
    /// `diffusion_pytorch_model.safetensors`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, DitError> {
        let path = path.as_ref();
        if path.is_file() {
            return Self::from_shards(path, vec![open_shard(path)?], None);
        }
        let index = path.join(INDEX_FILE);
        if index.is_file() {
            return Self::open_index(&index);
        }
        let single = path.join(SINGLE_FILE);
        if single.is_file() {
            return Self::from_shards(path, vec![open_shard(&single)?], None);
        }
        Err(DitError::NoCheckpoint { dir: path.into() })
    }

    /// Opens a sharded checkpoint from its index file.
    pub fn open_index(index: &Path) -> Result<Self, DitError> {
        let v = read_json(index)?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| DitError::JsonField {
                path: index.into(),
                field: "weight_map",
                expected: "an object of tensor name -> shard file",
            })?;
        let dir = index.parent().unwrap_or(Path::new("."));
        let mut files: Vec<String> = Vec::new();
        let mut wanted: Vec<(String, String)> = Vec::new();
        for (k, f) in map {
            let f = f.as_str().ok_or_else(|| DitError::JsonField {
                path: index.into(),
                field: "weight_map",
                expected: "shard file names as strings",
            })?;
            if !files.iter().any(|x| x == f) {
                files.push(f.to_string());
            }
            wanted.push((k.clone(), f.to_string()));
        }
        files.sort();
        let shards = files
            .iter()
            .map(|f| open_shard(&dir.join(f)))
            .collect::<Result<Vec<_>, _>>()?;
        let by_file: HashMap<&str, usize> = files
            .iter()
            .enumerate()
            .map(|(i, f)| (f.as_str(), i))
            .collect();
        for (k, f) in &wanted {
            if !shards[by_file[f.as_str()]].tensors.contains_key(k) {
                return Err(DitError::IndexMismatch {
                    path: index.into(),
                    key: k.clone(),
                    shard: f.clone(),
                });
            }
        }
        Self::from_shards(dir, shards, Some(index))
    }

    fn from_shards(
        path: &Path,
        shards: Vec<Shard>,
        index: Option<&Path>,
    ) -> Result<Self, DitError> {
        let mut keys = BTreeMap::new();
        for (i, s) in shards.iter().enumerate() {
            for k in s.tensors.keys() {
                if let Some(prev) = keys.insert(k.clone(), i) {
                    return Err(DitError::IndexMismatch {
                        path: index.unwrap_or(path).into(),
                        key: k.clone(),
                        shard: format!(
                            "{} (also in {})",
                            s.path.display(),
                            shards[prev].path.display()
                        ),
                    });
                }
            }
        }
        Ok(Self {
            path: path.into(),
            shards,
            keys,
        })
    }

    /// The file or directory it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of shard files (1 for a single file).
    pub fn num_shards(&self) -> usize {
        self.shards.len()
    }

    /// All tensor names, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    /// Dtype and shape of a tensor, if present.
    pub fn stored(&self, key: &str) -> Option<StoredTensor> {
        self.info(key).map(|i| StoredTensor {
            dtype: format!("{:?}", i.dtype),
            shape: i.shape.clone(),
        })
    }

    fn info(&self, key: &str) -> Option<&TensorInfo> {
        self.keys.get(key).map(|i| &self.shards[*i].tensors[key])
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

    /// A tensor's values converted to `f32` (from f64, f32, f16 or bf16), row-major in the
    /// stored shape; `None` if absent or of another dtype.
    pub fn read_f32(&self, key: &str) -> Option<Vec<f32>> {
        let (info, bytes) = self.bytes(key)?;
        to_f32(info.dtype, bytes)
    }
}

fn supported(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::F64 | Dtype::F32 | Dtype::F16 | Dtype::BF16)
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
pub(crate) fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; values.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = values[r * cols + c];
        }
    }
    out
}

/// The digest of one tensor for [`hash_tensors`]: sha256 over the key's bytes, a `0` byte, the
/// shape as little-endian `u64`s (count first) and the values as little-endian `f32`, in the
/// checkpoint's layout (PyTorch `[out, in]` for linear weights).
pub fn tensor_digest(key: &str, shape: &[usize], values: &[f32]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(key.as_bytes());
    h.update([0u8]);
    h.update((shape.len() as u64).to_le_bytes());
    for d in shape {
        h.update((*d as u64).to_le_bytes());
    }
    for v in values {
        h.update(v.to_le_bytes());
    }
    h.finalize().into()
}

/// The base-model hash: `"sha256:" + hex(sha256(digest_1 || digest_2 || ...))` over the
/// [`tensor_digest`]s sorted by key. It depends on the weights' values (as `f32`), names and
/// shapes only — the same for a single-file and a sharded copy, and for f32 and bf16 files
/// holding the same (bf16-representable) numbers.
pub fn hash_tensors(mut digests: Vec<(String, [u8; 32])>) -> String {
    digests.sort_by(|a, b| a.0.cmp(&b.0));
    let mut h = Sha256::new();
    for (_, d) in &digests {
        h.update(d);
    }
    let out: [u8; 32] = h.finalize().into();
    format!("sha256:{}", hex(&out))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Makes a device tensor from host values in the requested dtype.
pub(crate) fn device_tensor<B: Backend, const D: usize>(
    values: Vec<f32>,
    shape: [usize; D],
    dtype: WeightDtype,
    device: &B::Device,
) -> Tensor<B, D> {
    match dtype {
        WeightDtype::F32 => Tensor::from_data(TensorData::new(values, shape), (device, DType::F32)),
        WeightDtype::Bf16 => {
            let v: Vec<half::bf16> = values.into_iter().map(half::bf16::from_f32).collect();
            Tensor::from_data(TensorData::new(v, shape), (device, DType::BF16))
        }
    }
}

/// A tensor's values on the host as `f32`.
pub(crate) fn host_f32<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .expect("f32 data after conversion")
}

/// Replaces a parameter's value, keeping its id (and so optimizer state keyed by it).
pub(crate) fn set_param<B: Backend, const D: usize>(
    param: &mut Param<Tensor<B, D>>,
    value: Tensor<B, D>,
    require_grad: bool,
) {
    let id: ParamId = param.id;
    *param = Param::initialized(id, value.set_require_grad(require_grad));
}

/// One parameter slot the loader fills.
struct Slot<'a, B: Backend> {
    key: String,
    kind: SlotKind<'a, B>,
}

enum SlotKind<'a, B: Backend> {
    /// A linear weight: stored `[out, in]`, held `[in, out]`.
    Matrix(&'a mut Param<Tensor<B, 2>>),
    Vector(&'a mut Param<Tensor<B, 1>>),
}

fn linear_slots<'a, B: Backend>(name: &str, l: &'a mut Linear<B>, out: &mut Vec<Slot<'a, B>>) {
    out.push(Slot {
        key: format!("{name}.weight"),
        kind: SlotKind::Matrix(&mut l.weight),
    });
    if let Some(b) = l.bias.as_mut() {
        out.push(Slot {
            key: format!("{name}.bias"),
            kind: SlotKind::Vector(b),
        });
    }
}

impl<B: Backend> QwenImageTransformer2DModel<B> {
    /// Loads a diffusers transformer directory (`config.json` plus a single-file or sharded
    /// safetensors checkpoint) onto `device`.
    ///
    /// All problems are reported together: an invalid config lists every bad field; a
    /// checkpoint that does not fit returns [`DitError::Weights`] naming every missing,
    /// unexpected, mis-shaped and unconvertible key.
    pub fn from_pretrained(
        dir: impl AsRef<Path>,
        device: &B::Device,
        options: LoadOptions,
    ) -> Result<Self, DitError> {
        let dir = dir.as_ref();
        let config = QwenImageConfig::from_diffusers_json(dir.join(CONFIG_FILE))?;
        let checkpoint = Checkpoint::open(dir)?;
        config.init::<B>(device).load_weights(&checkpoint, options)
    }

    /// Loads every base weight from `checkpoint` (LoRA adapters, if any, are untouched).
    ///
    /// Loaded parameters require gradients (burn's default for parameters); attaching a LoRA
    /// adapter freezes them.
    pub fn load_weights(
        mut self,
        checkpoint: &Checkpoint,
        options: LoadOptions,
    ) -> Result<Self, DitError> {
        let device = self.img_in.weight.lazy_device();
        let mut report = WeightReport::default();
        let mut digests = Vec::new();
        let mut slots = Vec::new();
        for (path, layer) in self.layers_mut() {
            let name = checkpoint_name(&path);
            match layer {
                LayerMut::Linear(l) => linear_slots(&name, l, &mut slots),
                LayerMut::Norm(n) => slots.push(Slot {
                    key: format!("{name}.weight"),
                    kind: SlotKind::Vector(&mut n.weight),
                }),
            }
        }
        let mut expected = std::collections::HashSet::new();
        for slot in slots {
            expected.insert(slot.key.clone());
            let want: Vec<usize> = match &slot.kind {
                SlotKind::Matrix(p) => {
                    let d = p.lazy_shape().dims::<2>();
                    vec![d[1], d[0]]
                }
                SlotKind::Vector(p) => p.lazy_shape().to_vec(),
            };
            let Some((info, bytes)) = checkpoint.bytes(&slot.key) else {
                report.missing.push(slot.key);
                continue;
            };
            if !supported(info.dtype) {
                report.unsupported_dtype.push(DtypeProblem {
                    key: slot.key,
                    dtype: format!("{:?}", info.dtype),
                });
                continue;
            }
            if info.shape != want {
                report.mismatched.push(ShapeMismatch {
                    key: slot.key,
                    expected: want,
                    found: info.shape.clone(),
                });
                continue;
            }
            if !report.is_clean() {
                continue; // keep checking, stop converting
            }
            let values = to_f32(info.dtype, bytes).expect("supported dtype");
            if options.hash {
                digests.push((slot.key.clone(), tensor_digest(&slot.key, &want, &values)));
            }
            match slot.kind {
                SlotKind::Matrix(p) => {
                    let (o, i) = (want[0], want[1]);
                    let t = device_tensor::<B, 2>(
                        transpose(&values, o, i),
                        [i, o],
                        options.dtype,
                        &device,
                    );
                    set_param(p, t, true);
                }
                SlotKind::Vector(p) => {
                    let t = device_tensor::<B, 1>(values, [want[0]], options.dtype, &device);
                    set_param(p, t, true);
                }
            }
        }
        report.unexpected = checkpoint
            .keys()
            .filter(|k| !expected.contains(*k))
            .map(str::to_string)
            .collect();
        report.sort();
        if !report.is_clean() {
            return Err(DitError::Weights {
                path: checkpoint.path().into(),
                report,
            });
        }
        self.base_model_hash = options.hash.then(|| hash_tensors(digests));
        Ok(self)
    }

    /// The base-model hash recorded when the weights were loaded, if it was computed.
    pub fn base_model_hash(&self) -> Option<&str> {
        self.base_model_hash.as_deref()
    }

    /// Computes the base-model hash from the weights in memory ([`hash_tensors`]), records it
    /// and returns it. Refused while adapters are merged into the base weights.
    pub fn compute_base_model_hash(&mut self) -> Result<String, DitError> {
        let mut digests = Vec::new();
        for e in self.base_entries(false)? {
            let values = (e.values)();
            digests.push((e.key.clone(), tensor_digest(&e.key, &e.shape, &values)));
        }
        let h = hash_tensors(digests);
        self.base_model_hash = Some(h.clone());
        Ok(h)
    }

    /// Every base weight in checkpoint layout, each read from the device only when its
    /// producer is called. With `merge`, linear weights carry their adapter's `s·A·B`
    /// (already there if merged). Without it, merged adapters are an error (the pure base is
    /// not in memory).
    pub(crate) fn base_entries(&self, merge: bool) -> Result<Vec<TensorEntry<'_>>, DitError> {
        let mut out: Vec<TensorEntry<'_>> = Vec::new();
        for (path, layer) in self.layers() {
            let name = checkpoint_name(&path);
            match layer {
                LayerRef::Linear(l) => {
                    let add = match &l.lora {
                        Some(a) if a.merged && !merge => return Err(DitError::BaseHashUnavailable),
                        Some(a) if !a.merged && merge => Some(a),
                        _ => None,
                    };
                    let (i, o) = l.dims();
                    out.push(TensorEntry {
                        key: format!("{name}.weight"),
                        shape: vec![o, i],
                        values: Box::new(move || {
                            let mut w = l.weight.val();
                            if let Some(a) = add {
                                w = w + a.lora_a.val().matmul(a.lora_b.val()).mul_scalar(a.scale);
                            }
                            transpose(&host_f32(w), i, o)
                        }),
                    });
                    if let Some(b) = &l.bias {
                        out.push(TensorEntry {
                            key: format!("{name}.bias"),
                            shape: vec![o],
                            values: Box::new(move || host_f32(b.val())),
                        });
                    }
                }
                LayerRef::Norm(n) => out.push(TensorEntry {
                    key: format!("{name}.weight"),
                    shape: n.weight.lazy_shape().to_vec(),
                    values: Box::new(move || host_f32(n.weight.val())),
                }),
            }
        }
        Ok(out)
    }

    /// Writes the model — adapters merged in — as a diffusers transformer directory:
    /// `config.json` and the weights in PyTorch layout, as one
    /// `diffusion_pytorch_model.safetensors` or, with `max_shard_bytes`, as shards plus
    /// `diffusion_pytorch_model.safetensors.index.json` (diffusers' own layout). Loadable by
    /// diffusers' `QwenImageTransformer2DModel.from_pretrained` and by
    /// [`QwenImageTransformer2DModel::from_pretrained`]. Tensors are read from the device and
    /// written one at a time. The model itself is not changed.
    pub fn save_merged_diffusers(
        &self,
        dir: impl AsRef<Path>,
        options: ExportOptions,
    ) -> Result<(), DitError> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|e| DitError::io(dir, e))?;
        let cfg = dir.join(CONFIG_FILE);
        let text = serde_json::to_string_pretty(&self.config().to_diffusers_json()).expect("json");
        std::fs::write(&cfg, text + "\n").map_err(|e| DitError::io(&cfg, e))?;
        let mut entries = self.base_entries(true)?;
        entries.sort_by(|a, b| a.key.cmp(&b.key));
        let mut meta = BTreeMap::new();
        meta.insert("format".to_string(), "pt".to_string());
        let width = options.dtype.bytes();
        let Some(max) = options.max_shard_bytes else {
            return write_entries(&dir.join(SINGLE_FILE), &entries, options.dtype, &meta);
        };
        // diffusers' rule: a tensor starts a new shard when it would overflow the current one.
        let mut shards: Vec<Vec<&TensorEntry<'_>>> = vec![Vec::new()];
        let mut size = 0u64;
        for e in &entries {
            let bytes = (e.shape.iter().product::<usize>() * width) as u64;
            if size > 0 && size + bytes > max {
                shards.push(Vec::new());
                size = 0;
            }
            shards.last_mut().expect("shard").push(e);
            size += bytes;
        }
        let n = shards.len();
        let mut weight_map = serde_json::Map::new();
        let mut total = 0usize;
        for (i, shard) in shards.iter().enumerate() {
            let file = format!("diffusion_pytorch_model-{:05}-of-{n:05}.safetensors", i + 1);
            for e in shard {
                weight_map.insert(e.key.clone(), file.clone().into());
                total += e.shape.iter().product::<usize>() * width;
            }
            let owned: Vec<&TensorEntry<'_>> = shard.clone();
            write_entry_refs(&dir.join(&file), &owned, options.dtype, &meta)?;
        }
        let index =
            serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        let path = dir.join(INDEX_FILE);
        std::fs::write(
            &path,
            serde_json::to_string_pretty(&index).expect("json") + "\n",
        )
        .map_err(|e| DitError::io(&path, e))
    }
}

/// One tensor to write: its key, its shape and a producer of its `f32` values, row-major.
pub struct TensorEntry<'a> {
    /// The key.
    pub key: String,
    /// The shape.
    pub shape: Vec<usize>,
    /// Produces the values when the writer reaches this tensor.
    pub values: Box<dyn Fn() -> Vec<f32> + 'a>,
}

/// The dtype of written tensors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExportDtype {
    /// 32-bit floats (exact).
    #[default]
    F32,
    /// bfloat16, rounded to nearest even (the hub's dtype; half the size).
    Bf16,
}

impl ExportDtype {
    fn bytes(self) -> usize {
        match self {
            ExportDtype::F32 => 4,
            ExportDtype::Bf16 => 2,
        }
    }

    fn name(self) -> &'static str {
        match self {
            ExportDtype::F32 => "F32",
            ExportDtype::Bf16 => "BF16",
        }
    }
}

/// How a merged transformer is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportOptions {
    /// Dtype of the written weights.
    pub dtype: ExportDtype,
    /// Split into shards of at most this many bytes (a larger single tensor gets a shard of
    /// its own); `None` writes one file.
    pub max_shard_bytes: Option<u64>,
}

/// Writes `(key, shape, f32 values)` as one f32 safetensors file, keys sorted.
pub fn write_safetensors(
    path: &Path,
    tensors: Vec<(String, Vec<usize>, Vec<f32>)>,
    metadata: &BTreeMap<String, String>,
) -> Result<(), DitError> {
    let mut entries: Vec<TensorEntry<'_>> = tensors
        .into_iter()
        .map(|(key, shape, values)| TensorEntry {
            key,
            shape,
            values: Box::new(move || values.clone()),
        })
        .collect();
    entries.sort_by(|a, b| a.key.cmp(&b.key));
    write_entries(path, &entries, ExportDtype::F32, metadata)
}

fn write_entries(
    path: &Path,
    entries: &[TensorEntry<'_>],
    dtype: ExportDtype,
    metadata: &BTreeMap<String, String>,
) -> Result<(), DitError> {
    let refs: Vec<&TensorEntry<'_>> = entries.iter().collect();
    write_entry_refs(path, &refs, dtype, metadata)
}

/// Streams one safetensors file: the header from the shapes, then each tensor's bytes as its
/// producer yields them (one tensor in host memory at a time).
fn write_entry_refs(
    path: &Path,
    entries: &[&TensorEntry<'_>],
    dtype: ExportDtype,
    metadata: &BTreeMap<String, String>,
) -> Result<(), DitError> {
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        header.insert(
            "__metadata__".into(),
            serde_json::to_value(metadata).expect("json"),
        );
    }
    let mut offset = 0usize;
    for e in entries {
        let end = offset + dtype.bytes() * e.shape.iter().product::<usize>();
        header.insert(
            e.key.clone(),
            serde_json::json!({"dtype": dtype.name(), "shape": e.shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut h = serde_json::to_string(&header).expect("json").into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let io = |e| DitError::io(path, e);
    let file = File::create(path).map_err(io)?;
    let mut w = BufWriter::new(file);
    w.write_all(&(h.len() as u64).to_le_bytes()).map_err(io)?;
    w.write_all(&h).map_err(io)?;
    for e in entries {
        let values = (e.values)();
        assert_eq!(
            values.len(),
            e.shape.iter().product::<usize>(),
            "{}: producer gave {} values for shape {:?}",
            e.key,
            values.len(),
            e.shape
        );
        for v in values {
            match dtype {
                ExportDtype::F32 => w.write_all(&v.to_le_bytes()),
                ExportDtype::Bf16 => w.write_all(&half::bf16::from_f32(v).to_bits().to_le_bytes()),
            }
            .map_err(io)?;
        }
    }
    w.flush().map_err(io)
}
