//! Weight IO: diffusers safetensors checkpoints (single-file and sharded) read through the
//! shared loader [`model_weights`] (memory-mapped, one tensor at a time, every problem
//! reported together, the base-model hash), dtype conversion to the device, and a streaming
//! safetensors writer whose files are written durably ([`durable`]). The one place this crate
//! touches files of tensors.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use burn::module::{Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};
use model_weights::{ContentHasher, DIFFUSERS};

use crate::error::DitError;
use crate::model::{LayerMut, LayerRef, QwenImageTransformer2DModel, checkpoint_name};
use crate::{QwenImageConfig, layers::Linear};

use model_weights::transpose;
pub use model_weights::{hash_tensors, tensor_digest};

/// File name of a single-file diffusers checkpoint.
pub const SINGLE_FILE: &str = DIFFUSERS.single;
/// File name of a sharded diffusers checkpoint's index.
pub const INDEX_FILE: &str = DIFFUSERS.index;
/// File name of a diffusers model configuration.
pub const CONFIG_FILE: &str = "config.json";

/// The dtype weights are given on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightDtype {
    /// `f32`, converted on the host (bf16 -> f32 is exact). The CPU choice.
    F32,
    /// `bf16` (f32 checkpoints are rounded to nearest even on the host; bf16 ones are kept
    /// as stored): half the memory, for GPU backends with bf16 kernels. The model computes in
    /// its weights' dtype ([`QwenImageTransformer2DModel::compute_dtype`]): inputs are cast
    /// to it and the output back to the input's dtype, its host tables (RoPE, timestep
    /// sinusoids) are made in it, and LoRA adapters stay f32. burn's CPU backend (Flex)
    /// computes bf16 too: the tiny model with bf16 weights and f32 adapters strays from
    /// diffusers' f32 output no further than diffusers' own bf16 forward does (`dit-models`'
    /// `checkpointing` tests).
    ///
    /// [`QwenImageTransformer2DModel::compute_dtype`]: crate::QwenImageTransformer2DModel::compute_dtype
    Bf16,
}

/// How to load a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// Device dtype of the weights.
    pub dtype: WeightDtype,
    /// Compute the base-model hash ([`hash_tensors`]) while loading. It reads every weight
    /// once more through sha256 (tens of seconds at 20B); adapter contracts need it.
    pub hash: bool,
    /// The checkpoint variant to read (`bf16` reads `diffusion_pytorch_model.bf16.safetensors`
    /// or its sharded index), as diffusers' `variant=`; `None` reads the plain files.
    pub variant: Option<String>,
}

impl Default for LoadOptions {
    /// `f32` weights, hash computed.
    fn default() -> Self {
        Self {
            dtype: WeightDtype::F32,
            hash: true,
            variant: None,
        }
    }
}

/// A memory-mapped diffusers checkpoint: one `.safetensors` file or the shards named by a
/// `diffusion_pytorch_model.safetensors.index.json`. Tensors are read (and converted) one at
/// a time from the mapping; nothing is copied up front.
///
/// A thin wrapper of the shared [`model_weights::Checkpoint`] ([`Checkpoint::weights`]) with
/// diffusers' file names and this crate's error type.
#[derive(Debug)]
pub struct Checkpoint {
    inner: model_weights::Checkpoint,
}

/// Name and shape of a stored tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredTensor {
    /// safetensors dtype name (`F32`, `BF16`, ...).
    pub dtype: String,
    /// Shape as stored.
    pub shape: Vec<usize>,
}

impl Checkpoint {
    /// Opens a checkpoint: a `.safetensors` file, or a directory holding either
    /// `diffusion_pytorch_model.safetensors.index.json` (sharded) or
    /// `diffusion_pytorch_model.safetensors`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, DitError> {
        Ok(model_weights::Checkpoint::open(path, &[DIFFUSERS])?.into())
    }

    /// [`Checkpoint::open`] of a variant's files (`diffusion_pytorch_model.bf16.safetensors`,
    /// `diffusion_pytorch_model.safetensors.index.bf16.json`), or the plain ones with `None`.
    pub fn open_variant(path: impl AsRef<Path>, variant: Option<&str>) -> Result<Self, DitError> {
        Ok(model_weights::Checkpoint::open_variant(path, &[DIFFUSERS], variant)?.into())
    }

    /// Opens a sharded checkpoint from its index file.
    pub fn open_index(index: &Path) -> Result<Self, DitError> {
        Ok(model_weights::Checkpoint::open_index(index)?.into())
    }

    /// The shared loader's checkpoint underneath (dtypes, raw bytes, file metadata, reports).
    pub fn weights(&self) -> &model_weights::Checkpoint {
        &self.inner
    }

    /// The file or directory it was opened from.
    pub fn path(&self) -> &Path {
        self.inner.path()
    }

    /// Number of shard files (1 for a single file).
    pub fn num_shards(&self) -> usize {
        self.inner.num_shards()
    }

    /// All tensor names, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.inner.keys()
    }

    /// Dtype and shape of a tensor, if present.
    pub fn stored(&self, key: &str) -> Option<StoredTensor> {
        self.inner.meta(key).map(|m| StoredTensor {
            dtype: m.dtype_name(),
            shape: m.shape.to_vec(),
        })
    }

    /// A tensor's values converted to `f32` (from f64, f32, f16 or bf16), row-major in the
    /// stored shape; `None` if absent or of another dtype.
    pub fn read_f32(&self, key: &str) -> Option<Vec<f32>> {
        self.inner.read_f32(key).ok()
    }
}

impl From<model_weights::Checkpoint> for Checkpoint {
    fn from(inner: model_weights::Checkpoint) -> Self {
        Self { inner }
    }
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
    /// The shape in the checkpoint's layout.
    shape: Vec<usize>,
    kind: SlotKind<'a, B>,
}

enum SlotKind<'a, B: Backend> {
    /// A linear weight: stored `[out, in]`, held `[in, out]`.
    Matrix(&'a mut Param<Tensor<B, 2>>),
    Vector(&'a mut Param<Tensor<B, 1>>),
}

fn matrix_slot<'a, B: Backend>(key: String, p: &'a mut Param<Tensor<B, 2>>) -> Slot<'a, B> {
    let [i, o] = p.lazy_shape().dims::<2>();
    Slot {
        key,
        shape: vec![o, i],
        kind: SlotKind::Matrix(p),
    }
}

fn vector_slot<'a, B: Backend>(key: String, p: &'a mut Param<Tensor<B, 1>>) -> Slot<'a, B> {
    Slot {
        key,
        shape: p.lazy_shape().to_vec(),
        kind: SlotKind::Vector(p),
    }
}

fn linear_slots<'a, B: Backend>(name: &str, l: &'a mut Linear<B>, out: &mut Vec<Slot<'a, B>>) {
    out.push(matrix_slot(format!("{name}.weight"), &mut l.weight));
    if let Some(b) = l.bias.as_mut() {
        out.push(vector_slot(format!("{name}.bias"), b));
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
        let checkpoint = Checkpoint::open_variant(dir, options.variant.as_deref())?;
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
        let ckpt = checkpoint.weights();
        let mut slots = Vec::new();
        for (path, layer) in self.layers_mut() {
            let name = checkpoint_name(&path);
            match layer {
                LayerMut::Linear(l) => linear_slots(&name, l, &mut slots),
                LayerMut::Norm(n) => {
                    slots.push(vector_slot(format!("{name}.weight"), &mut n.weight))
                }
            }
        }
        // Every problem, from the headers alone, before any tensor is read.
        ckpt.check(slots.iter().map(|s| (&s.key, &s.shape)), &[])?;
        let mut hasher = options.hash.then(ContentHasher::new);
        for slot in slots {
            let values = ckpt.read_f32(&slot.key)?;
            if let Some(h) = hasher.as_mut() {
                h.add(&slot.key, &slot.shape, &values);
            }
            match slot.kind {
                SlotKind::Matrix(p) => {
                    let (o, i) = (slot.shape[0], slot.shape[1]);
                    let t = device_tensor::<B, 2>(
                        transpose(&values, o, i),
                        [i, o],
                        options.dtype,
                        &device,
                    );
                    set_param(p, t, true);
                }
                SlotKind::Vector(p) => {
                    let t = device_tensor::<B, 1>(values, [slot.shape[0]], options.dtype, &device);
                    set_param(p, t, true);
                }
            }
        }
        self.base_model_hash = hasher.map(ContentHasher::finish);
        Ok(self)
    }

    /// The base-model hash recorded when the weights were loaded, if it was computed.
    pub fn base_model_hash(&self) -> Option<&str> {
        self.base_model_hash.as_deref()
    }

    /// Computes the base-model hash from the weights in memory ([`hash_tensors`]), records it
    /// and returns it. Refused while adapters are merged into the base weights.
    pub fn compute_base_model_hash(&mut self) -> Result<String, DitError> {
        let mut hasher = ContentHasher::new();
        for e in self.base_entries(false)? {
            hasher.add(&e.key, &e.shape, &(e.values)());
        }
        let h = hasher.finish();
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
    ///
    /// Every file is written durably (`<file>.tmp`, fsync, rename, directory fsync): an
    /// interrupted export leaves no torn file. The weights are written first, then the index,
    /// then `config.json`, so a directory an export was writing into for the first time holds
    /// a `config.json` only once the export is complete.
    pub fn save_merged_diffusers(
        &self,
        dir: impl AsRef<Path>,
        options: ExportOptions,
    ) -> Result<(), DitError> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|e| DitError::io(dir, e))?;
        let mut entries = self.base_entries(true)?;
        entries.sort_by(|a, b| a.key.cmp(&b.key));
        let mut meta = BTreeMap::new();
        meta.insert("format".to_string(), "pt".to_string());
        let width = options.dtype.bytes();
        if let Some(max) = options.max_shard_bytes {
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
                write_entry_refs(&dir.join(&file), shard, options.dtype, &meta)?;
            }
            let index =
                serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
            write_json(&dir.join(INDEX_FILE), &index)?;
        } else {
            write_entries(&dir.join(SINGLE_FILE), &entries, options.dtype, &meta)?;
        }
        write_json(&dir.join(CONFIG_FILE), &self.config().to_diffusers_json())
    }
}

/// Writes `value` as pretty JSON plus a newline, durably ([`durable::write_atomic`]).
pub(crate) fn write_json(path: &Path, value: &serde_json::Value) -> Result<(), DitError> {
    let text = serde_json::to_string_pretty(value).expect("json") + "\n";
    durable::write_atomic(path, text.as_bytes()).map_err(|e| DitError::write(path, e))?;
    Ok(())
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
    write_entries(path, &sorted_entries(tensors), ExportDtype::F32, metadata)
}

/// Host tensors as entries, sorted by key.
fn sorted_entries(tensors: Vec<(String, Vec<usize>, Vec<f32>)>) -> Vec<TensorEntry<'static>> {
    let mut entries: Vec<TensorEntry<'static>> = tensors
        .into_iter()
        .map(|(key, shape, values)| TensorEntry {
            key,
            shape,
            values: Box::new(move || values.clone()),
        })
        .collect();
    entries.sort_by(|a, b| a.key.cmp(&b.key));
    entries
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

/// One safetensors file in memory, `f32`, keys sorted — the bytes [`write_safetensors`] writes.
pub fn safetensors_bytes(
    tensors: Vec<(String, Vec<usize>, Vec<f32>)>,
    metadata: &BTreeMap<String, String>,
) -> Vec<u8> {
    let entries = sorted_entries(tensors);
    let refs: Vec<&TensorEntry<'_>> = entries.iter().collect();
    let mut out = Vec::new();
    encode_entries(&mut out, &refs, ExportDtype::F32, metadata).expect("writing to memory");
    out
}

/// The safetensors encoding of `entries` into `w`: the header from the shapes, then each
/// tensor's bytes as its producer yields them (one tensor in host memory at a time).
fn encode_entries(
    w: &mut impl Write,
    entries: &[&TensorEntry<'_>],
    dtype: ExportDtype,
    metadata: &BTreeMap<String, String>,
) -> std::io::Result<()> {
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
    w.write_all(&(h.len() as u64).to_le_bytes())?;
    w.write_all(&h)?;
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
            }?;
        }
    }
    Ok(())
}

/// Streams one safetensors file durably ([`encode_entries`] into a `durable::AtomicFile`).
fn write_entry_refs(
    path: &Path,
    entries: &[&TensorEntry<'_>],
    dtype: ExportDtype,
    metadata: &BTreeMap<String, String>,
) -> Result<(), DitError> {
    // Written to `<path>.tmp` and renamed into place by `commit`; dropped on an error (or a
    // panic of a producer) before that, it removes the temporary file and `path` is untouched.
    let mut w = durable::AtomicFile::create(path).map_err(|e| DitError::write(path, e))?;
    let tmp = durable::tmp_path(path);
    encode_entries(&mut w, entries, dtype, metadata).map_err(|source| {
        DitError::write(
            path,
            durable::DurableError {
                path: tmp.clone(),
                op: "write",
                source,
            },
        )
    })?;
    w.commit().map_err(|e| DitError::write(path, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, values: Vec<f32>) -> TensorEntry<'static> {
        TensorEntry {
            key: key.into(),
            shape: vec![values.len()],
            values: Box::new(move || values.clone()),
        }
    }

    /// A producer that panics half-way (a device error while exporting): the previous file is
    /// intact and no temporary file is left.
    #[test]
    fn an_interrupted_write_leaves_the_previous_file_and_no_tmp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SINGLE_FILE);
        let meta = BTreeMap::new();
        write_entries(
            &path,
            &[entry("a", vec![1.0, 2.0])],
            ExportDtype::F32,
            &meta,
        )
        .unwrap();
        let before = std::fs::read(&path).unwrap();
        let entries = vec![
            entry("a", vec![3.0, 4.0]),
            TensorEntry {
                key: "b".into(),
                shape: vec![1],
                values: Box::new(|| panic!("device lost")),
            },
        ];
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            write_entries(&path, &entries, ExportDtype::F32, &meta)
        }));
        assert!(r.is_err());
        assert_eq!(std::fs::read(&path).unwrap(), before);
        assert!(!durable::tmp_path(&path).exists());
        let c = Checkpoint::open(&path).unwrap();
        assert_eq!(c.read_f32("a").unwrap(), [1.0, 2.0]);
    }

    #[test]
    fn a_failed_write_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("adapter_model.safetensors");
        // the temporary file cannot be created: a directory is in its way
        std::fs::create_dir(durable::tmp_path(&path)).unwrap();
        let err = write_safetensors(
            &path,
            vec![("a".into(), vec![1], vec![0.5])],
            &BTreeMap::new(),
        )
        .unwrap_err();
        match &err {
            DitError::Write { path: p, source } => {
                assert_eq!(p, &path);
                assert_eq!(source.op, "create");
            }
            other => panic!("{other}"),
        }
        assert!(
            err.to_string().contains("adapter_model.safetensors"),
            "{err}"
        );
        assert!(!path.exists());
        let err = write_json(&path, &serde_json::json!({})).unwrap_err();
        assert!(matches!(err, DitError::Write { .. }), "{err}");
    }
}
