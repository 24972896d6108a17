//! Opening a checkpoint (one safetensors file, or the shards an index JSON names), memory-mapped;
//! listing its tensors; reading one tensor at a time; checking it against what a model expects.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::Dtype;
use safetensors::tensor::{Metadata, TensorInfo};

use crate::convert::{FloatDtype, FloatValues, decode, decode_f32, decode_f64};
use crate::error::WeightsError;
use crate::hash::ContentHasher;
use crate::report::{DtypeProblem, ShapeMismatch, WeightReport};

/// The file names a directory checkpoint of one library is stored under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The single-file checkpoint (`model.safetensors`).
    pub single: &'static str,
    /// The sharded checkpoint's index (`model.safetensors.index.json`).
    pub index: &'static str,
}

/// diffusers' layout (`diffusion_pytorch_model.safetensors`, `...safetensors.index.json`).
pub const DIFFUSERS: Layout = Layout {
    single: "diffusion_pytorch_model.safetensors",
    index: "diffusion_pytorch_model.safetensors.index.json",
};

/// transformers' layout (`model.safetensors`, `model.safetensors.index.json`).
pub const TRANSFORMERS: Layout = Layout {
    single: "model.safetensors",
    index: "model.safetensors.index.json",
};

/// The dtype and shape of a stored tensor, as its file's header gives them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorMeta<'a> {
    /// The stored dtype.
    pub dtype: Dtype,
    /// The stored shape.
    pub shape: &'a [usize],
}

impl TensorMeta<'_> {
    /// The dtype as safetensors names it (`F32`, `BF16`, `I64`, ...).
    pub fn dtype_name(&self) -> String {
        format!("{:?}", self.dtype)
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

struct Shard {
    path: PathBuf,
    mmap: Mmap,
    data_start: usize,
    tensors: HashMap<String, TensorInfo>,
    metadata: Option<HashMap<String, String>>,
}

fn open_shard(path: &Path) -> Result<Shard, WeightsError> {
    let file = File::open(path).map_err(|e| WeightsError::io(path, e))?;
    // SAFETY: the mapping is read-only and lives as long as `Shard`; a checkpoint modified
    // by another process while mapped is outside what any safetensors reader can guard.
    #[allow(unsafe_code)]
    let mmap = unsafe { Mmap::map(&file) }.map_err(|e| WeightsError::io(path, e))?;
    // `read_metadata` validates the header: offsets contiguous, each size = shape x dtype,
    // the data exactly covering the rest of the file; every slice below is in bounds.
    let (n, meta): (usize, Metadata) =
        safetensors::SafeTensors::read_metadata(&mmap).map_err(|source| {
            WeightsError::Safetensors {
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
        path: path.into(),
        metadata: meta.metadata().clone(),
        mmap,
        data_start: 8 + n,
        tensors,
    })
}

/// A memory-mapped safetensors checkpoint: one file, or the shards named by an index JSON
/// (`{"metadata": ..., "weight_map": {key: shard file}}`). Opening reads the headers only;
/// tensors are read (and converted) one at a time from the mapping.
///
/// ```
/// use model_weights::{Checkpoint, TRANSFORMERS};
/// use safetensors::tensor::{Dtype, TensorView};
///
/// let dir = tempfile::tempdir().unwrap();
/// let bytes: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0].iter().flat_map(|v| v.to_le_bytes()).collect();
/// let w = TensorView::new(Dtype::F32, vec![2, 3], &bytes).unwrap();
/// safetensors::serialize_to_file([("fc.weight", w)], None, &dir.path().join("model.safetensors")).unwrap();
///
/// let ckpt = Checkpoint::open(dir.path(), &[TRANSFORMERS]).unwrap();
/// assert_eq!(ckpt.keys().collect::<Vec<_>>(), ["fc.weight"]);
/// assert_eq!(ckpt.meta("fc.weight").unwrap().shape, [2, 3]);
/// assert_eq!(ckpt.read_f32("fc.weight").unwrap(), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
/// // a model expecting [3, 2] and a bias: both problems in one report
/// let report = ckpt.report([("fc.weight", &[3, 2][..]), ("fc.bias", &[3][..])], &[]);
/// assert_eq!(report.missing, ["fc.bias"]);
/// assert_eq!(report.mismatched[0].found, [2, 3]);
/// ```
pub struct Checkpoint {
    path: PathBuf,
    index: Option<PathBuf>,
    index_metadata: Option<serde_json::Value>,
    shards: Vec<Shard>,
    keys: BTreeMap<String, usize>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("path", &self.path)
            .field("index", &self.index)
            .field(
                "shards",
                &self.shards.iter().map(|s| &s.path).collect::<Vec<_>>(),
            )
            .field("tensors", &self.keys.len())
            .finish()
    }
}

fn read_json(path: &Path) -> Result<serde_json::Value, WeightsError> {
    let text = std::fs::read_to_string(path).map_err(|e| WeightsError::io(path, e))?;
    serde_json::from_str(&text).map_err(|source| WeightsError::Json {
        path: path.into(),
        source,
    })
}

/// A file name with a variant (`bf16`, `fp16`, ...) inserted before its last extension, as
/// diffusers and transformers name variant files: `diffusion_pytorch_model.safetensors` ->
/// `diffusion_pytorch_model.bf16.safetensors`, `model.safetensors.index.json` ->
/// `model.safetensors.index.bf16.json`.
///
/// ```
/// assert_eq!(
///     model_weights::variant_name("diffusion_pytorch_model.safetensors", "bf16"),
///     "diffusion_pytorch_model.bf16.safetensors"
/// );
/// assert_eq!(
///     model_weights::variant_name("model.safetensors.index.json", "fp16"),
///     "model.safetensors.index.fp16.json"
/// );
/// ```
pub fn variant_name(name: &str, variant: &str) -> String {
    match name.rsplit_once('.') {
        Some((stem, ext)) => format!("{stem}.{variant}.{ext}"),
        None => format!("{name}.{variant}"),
    }
}

/// The variants whose single file or index `dir` holds for `layouts`, sorted.
fn variants_present(dir: &Path, layouts: &[Layout]) -> Vec<String> {
    let mut found = BTreeSet::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        for layout in layouts {
            for base in [layout.single, layout.index] {
                let Some((stem, ext)) = base.rsplit_once('.') else {
                    continue;
                };
                if let Some(v) = name
                    .strip_prefix(&format!("{stem}."))
                    .and_then(|rest| rest.strip_suffix(&format!(".{ext}")))
                    && !v.is_empty()
                    && !v.contains('.')
                    && !v.contains('-')
                {
                    found.insert(v.to_string());
                }
            }
        }
    }
    found.into_iter().collect()
}

impl Checkpoint {
    /// Opens a checkpoint: a safetensors file, or a directory holding, for the first of
    /// `layouts` that matches, its index (sharded; tried first) or its single file.
    ///
    /// # Errors
    /// [`WeightsError::NoCheckpoint`] listing the names looked for (and the variants the
    /// directory holds instead, if any); any error of [`Checkpoint::open_file`] or
    /// [`Checkpoint::open_index`].
    pub fn open(path: impl AsRef<Path>, layouts: &[Layout]) -> Result<Self, WeightsError> {
        Self::open_variant(path, layouts, None)
    }

    /// [`Checkpoint::open`] of a variant's files (`diffusion_pytorch_model.bf16.safetensors`,
    /// `...safetensors.index.bf16.json`; see [`variant_name`]), or of the plain files with
    /// `None`. Like diffusers, a requested variant that is absent is an error, never a silent
    /// fall back to the plain files.
    ///
    /// # Errors
    /// As [`Checkpoint::open`].
    pub fn open_variant(
        path: impl AsRef<Path>,
        layouts: &[Layout],
        variant: Option<&str>,
    ) -> Result<Self, WeightsError> {
        let path = path.as_ref();
        if path.is_file() {
            return Self::open_file(path);
        }
        let name = |n: &str| match variant {
            Some(v) => variant_name(n, v),
            None => n.to_string(),
        };
        for layout in layouts {
            let index = path.join(name(layout.index));
            if index.is_file() {
                return Self::open_index(&index);
            }
            let single = path.join(name(layout.single));
            if single.is_file() {
                return Self::from_shards(path, vec![open_shard(&single)?], None, None);
            }
        }
        Err(WeightsError::NoCheckpoint {
            dir: path.into(),
            expected: layouts
                .iter()
                .flat_map(|l| [name(l.index), name(l.single)])
                .collect(),
            variants: variants_present(path, layouts)
                .into_iter()
                .filter(|v| Some(v.as_str()) != variant)
                .collect(),
        })
    }

    /// Opens one safetensors file.
    ///
    /// # Errors
    /// [`WeightsError::Io`] or [`WeightsError::Safetensors`] naming the file.
    pub fn open_file(path: impl AsRef<Path>) -> Result<Self, WeightsError> {
        let path = path.as_ref();
        Self::from_shards(path, vec![open_shard(path)?], None, None)
    }

    /// Opens a sharded checkpoint from its index file. Every key the index maps must be in
    /// the shard it names; shards live next to the index.
    ///
    /// # Errors
    /// [`WeightsError::Json`] / [`WeightsError::JsonField`] for a bad index,
    /// [`WeightsError::IndexMismatch`] for a key its shard lacks,
    /// [`WeightsError::DuplicateKey`] for a key two shards hold, and the errors of opening
    /// each shard.
    pub fn open_index(index: impl AsRef<Path>) -> Result<Self, WeightsError> {
        let index = index.as_ref();
        let v = read_json(index)?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| WeightsError::JsonField {
                path: index.into(),
                field: "weight_map",
                expected: "an object of tensor name -> shard file",
            })?;
        let dir = index
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let mut files: Vec<&str> = Vec::new();
        let mut wanted: Vec<(&str, &str)> = Vec::new();
        for (k, f) in map {
            let f = f.as_str().ok_or_else(|| WeightsError::JsonField {
                path: index.into(),
                field: "weight_map",
                expected: "shard file names as strings",
            })?;
            if !files.contains(&f) {
                files.push(f);
            }
            wanted.push((k, f));
        }
        files.sort_unstable();
        let shards = files
            .iter()
            .map(|f| open_shard(&dir.join(f)))
            .collect::<Result<Vec<_>, _>>()?;
        let by_file: HashMap<&str, usize> =
            files.iter().enumerate().map(|(i, f)| (*f, i)).collect();
        for (k, f) in wanted {
            if !shards[by_file[f]].tensors.contains_key(k) {
                return Err(WeightsError::IndexMismatch {
                    path: index.into(),
                    key: k.to_string(),
                    shard: f.to_string(),
                });
            }
        }
        Self::from_shards(dir, shards, Some(index), v.get("metadata").cloned())
    }

    fn from_shards(
        path: &Path,
        shards: Vec<Shard>,
        index: Option<&Path>,
        index_metadata: Option<serde_json::Value>,
    ) -> Result<Self, WeightsError> {
        let mut keys = BTreeMap::new();
        for (i, s) in shards.iter().enumerate() {
            for k in s.tensors.keys() {
                if let Some(prev) = keys.insert(k.clone(), i) {
                    return Err(WeightsError::DuplicateKey {
                        path: index.unwrap_or(path).into(),
                        key: k.clone(),
                        first: shards[prev].path.clone(),
                        second: s.path.clone(),
                    });
                }
            }
        }
        Ok(Self {
            path: path.into(),
            index: index.map(Into::into),
            index_metadata,
            shards,
            keys,
        })
    }

    /// The file or directory it was opened from (the index's directory for
    /// [`Checkpoint::open_index`]).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The index file of a sharded checkpoint.
    pub fn index_path(&self) -> Option<&Path> {
        self.index.as_deref()
    }

    /// The index's `"metadata"` object (e.g. `{"total_size": ...}`), if it has one.
    pub fn index_metadata(&self) -> Option<&serde_json::Value> {
        self.index_metadata.as_ref()
    }

    /// Number of files (1 for a single file).
    pub fn num_shards(&self) -> usize {
        self.shards.len()
    }

    /// The files, sorted by name for a sharded checkpoint.
    pub fn shard_paths(&self) -> impl Iterator<Item = &Path> {
        self.shards.iter().map(|s| s.path.as_path())
    }

    /// Each file with the string map of its header's `__metadata__` (e.g. `{"format": "pt"}`),
    /// `None` where the file has none.
    pub fn file_metadata(&self) -> impl Iterator<Item = (&Path, Option<&HashMap<String, String>>)> {
        self.shards
            .iter()
            .map(|s| (s.path.as_path(), s.metadata.as_ref()))
    }

    /// All tensor names, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the checkpoint holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether the checkpoint holds `key`.
    pub fn contains(&self, key: &str) -> bool {
        self.keys.contains_key(key)
    }

    fn info(&self, key: &str) -> Option<(&Shard, &TensorInfo)> {
        let shard = &self.shards[*self.keys.get(key)?];
        Some((shard, &shard.tensors[key]))
    }

    /// Dtype and shape of a tensor, if present.
    pub fn meta(&self, key: &str) -> Option<TensorMeta<'_>> {
        self.info(key).map(|(_, i)| TensorMeta {
            dtype: i.dtype,
            shape: &i.shape,
        })
    }

    /// The stored bytes of a tensor (little-endian, row-major), straight from the mapping.
    pub fn bytes(&self, key: &str) -> Option<(TensorMeta<'_>, &[u8])> {
        let (shard, info) = self.info(key)?;
        let (a, b) = info.data_offsets;
        Some((
            TensorMeta {
                dtype: info.dtype,
                shape: &info.shape,
            },
            &shard.mmap[shard.data_start + a..shard.data_start + b],
        ))
    }

    fn float_bytes(&self, key: &str) -> Result<(TensorMeta<'_>, &[u8]), WeightsError> {
        let (meta, bytes) = self.bytes(key).ok_or_else(|| WeightsError::MissingTensor {
            path: self.path.clone(),
            key: key.into(),
        })?;
        if FloatDtype::of(meta.dtype).is_none() {
            return Err(WeightsError::UnsupportedDtype {
                path: self.path.clone(),
                key: key.into(),
                dtype: meta.dtype_name(),
            });
        }
        Ok((meta, bytes))
    }

    /// A tensor's values as `f32` (f16 and bf16 widened exactly, f64 rounded), row-major in
    /// the stored shape.
    ///
    /// # Errors
    /// [`WeightsError::MissingTensor`], or [`WeightsError::UnsupportedDtype`] for a tensor
    /// that is not stored as a float.
    pub fn read_f32(&self, key: &str) -> Result<Vec<f32>, WeightsError> {
        let (meta, bytes) = self.float_bytes(key)?;
        Ok(decode_f32(meta.dtype, bytes).expect("a float dtype"))
    }

    /// A tensor's values as `f64` (every float dtype widened exactly).
    ///
    /// # Errors
    /// As [`Checkpoint::read_f32`].
    pub fn read_f64(&self, key: &str) -> Result<Vec<f64>, WeightsError> {
        let (meta, bytes) = self.float_bytes(key)?;
        Ok(decode_f64(meta.dtype, bytes).expect("a float dtype"))
    }

    /// A tensor's values converted to `dtype` (see [`crate::decode`]: the stored dtype is
    /// copied bit for bit, half precision from wider dtypes rounds to nearest even).
    ///
    /// # Errors
    /// As [`Checkpoint::read_f32`].
    pub fn read_as(&self, key: &str, dtype: FloatDtype) -> Result<FloatValues, WeightsError> {
        let (meta, bytes) = self.float_bytes(key)?;
        Ok(decode(meta.dtype, bytes, dtype).expect("a float dtype"))
    }

    /// Checks what a model expects — `(key, shape in the checkpoint's layout)` pairs —
    /// against the headers, reading no tensor data. Every key is checked, in the order
    /// present, float dtype, shape; each lands in one list at most. Checkpoint keys that are
    /// neither expected nor in `ignored` (buffers a model recomputes) are unexpected; an
    /// `ignored` key may also be absent. The lists come back sorted.
    pub fn report<I, K, S>(&self, expected: I, ignored: &[&str]) -> WeightReport
    where
        I: IntoIterator<Item = (K, S)>,
        K: AsRef<str>,
        S: AsRef<[usize]>,
    {
        let mut report = WeightReport::default();
        let mut seen: HashSet<String> = ignored.iter().map(|k| k.to_string()).collect();
        for (key, shape) in expected {
            let (key, shape) = (key.as_ref(), shape.as_ref());
            seen.insert(key.to_string());
            let Some(meta) = self.meta(key) else {
                report.missing.push(key.into());
                continue;
            };
            if FloatDtype::of(meta.dtype).is_none() {
                report.unsupported_dtype.push(DtypeProblem {
                    key: key.into(),
                    dtype: meta.dtype_name(),
                });
                continue;
            }
            if meta.shape != shape {
                report.mismatched.push(ShapeMismatch {
                    key: key.into(),
                    expected: shape.to_vec(),
                    found: meta.shape.to_vec(),
                });
            }
        }
        report.unexpected = self
            .keys()
            .filter(|k| !seen.contains(*k))
            .map(str::to_string)
            .collect();
        report.sort();
        report
    }

    /// [`Checkpoint::report`], as an error unless it is clean.
    ///
    /// # Errors
    /// [`WeightsError::Weights`] carrying the whole report.
    pub fn check<I, K, S>(&self, expected: I, ignored: &[&str]) -> Result<(), WeightsError>
    where
        I: IntoIterator<Item = (K, S)>,
        K: AsRef<str>,
        S: AsRef<[usize]>,
    {
        let report = self.report(expected, ignored);
        if report.is_clean() {
            Ok(())
        } else {
            Err(WeightsError::Weights {
                path: self.path.clone(),
                report,
            })
        }
    }

    /// The content hash ([`crate::hash_tensors`]) of every tensor in the checkpoint, in its
    /// stored shape, values as `f32`. Equal to the hash a loader computes with
    /// [`ContentHasher`] over the same tensors — the same for a single-file and a sharded
    /// copy, and for f32 and bf16 files holding the same (bf16-representable) numbers.
    ///
    /// # Errors
    /// [`WeightsError::UnsupportedDtype`] for a tensor that is not stored as a float.
    pub fn content_hash(&self) -> Result<String, WeightsError> {
        let mut h = ContentHasher::new();
        for key in self.keys() {
            let values = self.read_f32(key)?;
            h.add(key, self.meta(key).expect("listed").shape, &values);
        }
        Ok(h.finish())
    }
}
