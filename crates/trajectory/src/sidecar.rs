//! The safetensors sidecar: one file per group, written atomically, read back validated.
//!
//! # Format (version 1)
//!
//! A standard safetensors file. `__metadata__` holds:
//!
//! | key | value |
//! | --- | --- |
//! | `format` | `flowrl.trajectory` |
//! | `format_version` | `1` |
//! | `task`, `rollout_id`, `group_index` | the group's identity |
//! | `storage_dtype` | `f32`, `bf16` or `f16`: the latents' precision |
//! | `sample_ids` | JSON array of the candidates' sample ids |
//! | `sampling_fingerprint`, `weight_manifest_hash` | `sha256:<hex>` digests |
//! | `content_hash` | `xxh3-64:<16 hex>` over every other metadata entry and every tensor's name, dtype, shape and bytes |
//!
//! Tensors (`G` candidates, `S` trained steps, `L` stored latent steps, `T` text tokens):
//!
//! | key | dtype | shape |
//! | --- | --- | --- |
//! | `common.sigmas` | F32 | `[steps + 1]` |
//! | `common.sde_indices` | I64 | `[S]` |
//! | `common.latent_steps` | I64 | `[L]` |
//! | `common.image_size` | I64 | `[2]` (height, width) |
//! | `common.sample_indices`, `common.policy_versions`, `common.seed_hashes` | U64 | `[G]` |
//! | `conditions.text_embeddings` | F32 / BF16 / F16 | `[T, dim]` |
//! | `conditions.text_mask` | BOOL | `[T]` |
//! | `conditions.extra.<name>` | F32 / BF16 / F16 | any |
//! | `tracks.latents` | `storage_dtype` | `[G, L, ...latent]` |
//! | `tracks.log_probs` | F32 | `[G, S]` |
//! | `tracks.endpoint` (optional) | `storage_dtype` | `[G, ...latent]` |
//!
//! # Durability
//!
//! [`write_sidecar`] writes `<name>.tmp`, fsyncs it, renames it over `<name>` and fsyncs the
//! directory (the workspace's `durable` crate): a crash at any point leaves either the previous file or the new one, never a file
//! that reads as valid but is not. [`read_sidecar`] checks the length, the header, the version,
//! every key, dtype and shape, the content hash and the record's invariants, and returns a typed
//! error naming the file and the problem.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::Path;

use safetensors::tensor::{Dtype, Metadata, SafeTensorError, TensorInfo, View};
use sde_math::StorageDtype;
use xxhash_rust::xxh3::Xxh3;

use crate::error::{RecordProblem, io_err};
use crate::record::is_simple_name;
use crate::{
    Candidate, Common, Conditions, Digest, StoredTensor, Tracks, Trajectory, TrajectoryError,
};

/// The `format` metadata value.
pub const FORMAT: &str = "flowrl.trajectory";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// Tensor and metadata key names of the sidecar format.
pub mod keys {
    /// `common.sigmas`
    pub const SIGMAS: &str = "common.sigmas";
    /// `common.sde_indices`
    pub const SDE_INDICES: &str = "common.sde_indices";
    /// `common.latent_steps`
    pub const LATENT_STEPS: &str = "common.latent_steps";
    /// `common.image_size`
    pub const IMAGE_SIZE: &str = "common.image_size";
    /// `common.sample_indices`
    pub const SAMPLE_INDICES: &str = "common.sample_indices";
    /// `common.policy_versions`
    pub const POLICY_VERSIONS: &str = "common.policy_versions";
    /// `common.seed_hashes`
    pub const SEED_HASHES: &str = "common.seed_hashes";
    /// `conditions.text_embeddings`
    pub const TEXT_EMBEDDINGS: &str = "conditions.text_embeddings";
    /// `conditions.text_mask`
    pub const TEXT_MASK: &str = "conditions.text_mask";
    /// Prefix of `conditions.extra.<name>`.
    pub const EXTRA_PREFIX: &str = "conditions.extra.";
    /// `tracks.latents`
    pub const LATENTS: &str = "tracks.latents";
    /// `tracks.log_probs`
    pub const LOG_PROBS: &str = "tracks.log_probs";
    /// `tracks.endpoint` (optional: the candidates' clean endpoints)
    pub const ENDPOINT: &str = "tracks.endpoint";

    /// Every fixed tensor key.
    pub const TENSORS: [&str; 11] = [
        SIGMAS,
        SDE_INDICES,
        LATENT_STEPS,
        IMAGE_SIZE,
        SAMPLE_INDICES,
        POLICY_VERSIONS,
        SEED_HASHES,
        TEXT_EMBEDDINGS,
        TEXT_MASK,
        LATENTS,
        LOG_PROBS,
    ];

    /// Metadata: `format`.
    pub const META_FORMAT: &str = "format";
    /// Metadata: `format_version`.
    pub const META_VERSION: &str = "format_version";
    /// Metadata: `task`.
    pub const META_TASK: &str = "task";
    /// Metadata: `rollout_id`.
    pub const META_ROLLOUT: &str = "rollout_id";
    /// Metadata: `group_index`.
    pub const META_GROUP: &str = "group_index";
    /// Metadata: `storage_dtype`.
    pub const META_STORAGE: &str = "storage_dtype";
    /// Metadata: `sample_ids`.
    pub const META_SAMPLE_IDS: &str = "sample_ids";
    /// Metadata: `sampling_fingerprint`.
    pub const META_FINGERPRINT: &str = "sampling_fingerprint";
    /// Metadata: `weight_manifest_hash`.
    pub const META_WEIGHTS: &str = "weight_manifest_hash";
    /// Metadata: `content_hash`.
    pub const META_CONTENT_HASH: &str = "content_hash";

    /// Every metadata key.
    pub const METADATA: [&str; 10] = [
        META_FORMAT,
        META_VERSION,
        META_TASK,
        META_ROLLOUT,
        META_GROUP,
        META_STORAGE,
        META_SAMPLE_IDS,
        META_FINGERPRINT,
        META_WEIGHTS,
        META_CONTENT_HASH,
    ];
}

/// The safetensors header-size limit (the crate's own).
const MAX_HEADER: u64 = 100_000_000;

/// One tensor to serialise.
struct Entry<'a> {
    dtype: Dtype,
    shape: Vec<usize>,
    data: std::borrow::Cow<'a, [u8]>,
}

impl View for &Entry<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn storage_dtype(s: StorageDtype) -> Dtype {
    match s {
        StorageDtype::F32 | StorageDtype::Native => Dtype::F32,
        StorageDtype::Bf16 => Dtype::BF16,
        StorageDtype::F16 => Dtype::F16,
    }
}

fn storage_name(s: StorageDtype) -> &'static str {
    match s {
        StorageDtype::F32 | StorageDtype::Native => "f32",
        StorageDtype::Bf16 => "bf16",
        StorageDtype::F16 => "f16",
    }
}

fn storage_from_dtype(d: Dtype) -> Option<StorageDtype> {
    match d {
        Dtype::F32 => Some(StorageDtype::F32),
        Dtype::BF16 => Some(StorageDtype::Bf16),
        Dtype::F16 => Some(StorageDtype::F16),
        _ => None,
    }
}

/// A stable name for hashing and messages.
fn dtype_name(d: Dtype) -> String {
    format!("{d:?}")
}

fn u64s(v: impl IntoIterator<Item = u64>) -> Vec<u8> {
    v.into_iter().flat_map(u64::to_le_bytes).collect()
}

fn i64s(v: impl IntoIterator<Item = usize>) -> Vec<u8> {
    v.into_iter()
        .flat_map(|x| (i64::try_from(x).expect("index fits in i64")).to_le_bytes())
        .collect()
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The content hash: xxh3-64 over the sorted metadata (without `content_hash`) and the sorted
/// tensors' names, dtypes, shapes and bytes.
fn content_hash(
    meta: &BTreeMap<&str, &str>,
    tensors: &BTreeMap<&str, (Dtype, &[usize], &[u8])>,
) -> String {
    let mut h = Xxh3::new();
    h.update(b"flowrl/trajectory/content/v1\0");
    for (k, v) in meta {
        if *k == keys::META_CONTENT_HASH {
            continue;
        }
        h.update(k.as_bytes());
        h.update(&[0]);
        h.update(v.as_bytes());
        h.update(&[0]);
    }
    for (name, (dtype, shape, data)) in tensors {
        h.update(name.as_bytes());
        h.update(&[0]);
        h.update(dtype_name(*dtype).as_bytes());
        h.update(&[0]);
        h.update(&(shape.len() as u64).to_le_bytes());
        for d in *shape {
            h.update(&(*d as u64).to_le_bytes());
        }
        h.update(&(data.len() as u64).to_le_bytes());
        h.update(data);
    }
    format!("xxh3-64:{:016x}", h.digest())
}

/// Serialises a trajectory to sidecar bytes (after [`Trajectory::validate`]).
///
/// The tensor data is laid out deterministically; the order of the `__metadata__` entries in
/// the JSON header is the safetensors crate's (hash-map order), so compare decoded records,
/// not files.
///
/// # Errors
/// Every error of [`Trajectory::validate`]; [`TrajectoryError::Serialize`].
pub fn encode(traj: &Trajectory) -> Result<Vec<u8>, TrajectoryError> {
    encode_for(traj, Path::new("<in memory>"))
}

fn encode_for(traj: &Trajectory, path: &Path) -> Result<Vec<u8>, TrajectoryError> {
    traj.validate().map_err(|e| with_path(e, path))?;
    let c = &traj.common;
    let mut entries: BTreeMap<String, Entry<'_>> = BTreeMap::new();
    let mut add = |key: String, dtype, shape, data| {
        entries.insert(key, Entry { dtype, shape, data });
    };
    let g = c.candidates.len();
    add(
        keys::SIGMAS.into(),
        Dtype::F32,
        vec![c.sigmas.len()],
        f32s(&c.sigmas).into(),
    );
    add(
        keys::SDE_INDICES.into(),
        Dtype::I64,
        vec![c.sde_indices.len()],
        i64s(c.sde_indices.iter().copied()).into(),
    );
    let latent_steps = c.latent_steps();
    add(
        keys::LATENT_STEPS.into(),
        Dtype::I64,
        vec![latent_steps.len()],
        i64s(latent_steps).into(),
    );
    add(
        keys::IMAGE_SIZE.into(),
        Dtype::I64,
        vec![2],
        i64s([c.height as usize, c.width as usize]).into(),
    );
    add(
        keys::SAMPLE_INDICES.into(),
        Dtype::U64,
        vec![g],
        u64s(c.candidates.iter().map(|x| x.sample_index)).into(),
    );
    add(
        keys::POLICY_VERSIONS.into(),
        Dtype::U64,
        vec![g],
        u64s(c.candidates.iter().map(|x| x.policy_version)).into(),
    );
    add(
        keys::SEED_HASHES.into(),
        Dtype::U64,
        vec![g],
        u64s(c.candidates.iter().map(|x| x.seed_hash)).into(),
    );
    let cond = &traj.conditions;
    add(
        keys::TEXT_EMBEDDINGS.into(),
        storage_dtype(cond.text_embeddings.storage()),
        cond.text_embeddings.shape().to_vec(),
        cond.text_embeddings.bytes().into(),
    );
    add(
        keys::TEXT_MASK.into(),
        Dtype::BOOL,
        vec![cond.text_mask.len()],
        cond.text_mask
            .iter()
            .map(|&b| u8::from(b))
            .collect::<Vec<u8>>()
            .into(),
    );
    for (name, t) in &cond.extra {
        add(
            format!("{}{name}", keys::EXTRA_PREFIX),
            storage_dtype(t.storage()),
            t.shape().to_vec(),
            t.bytes().into(),
        );
    }
    let tr = &traj.tracks;
    add(
        keys::LATENTS.into(),
        storage_dtype(tr.latents.storage()),
        tr.latents.shape().to_vec(),
        tr.latents.bytes().into(),
    );
    add(
        keys::LOG_PROBS.into(),
        Dtype::F32,
        vec![g, c.sde_indices.len()],
        f32s(&tr.log_probs).into(),
    );
    if let Some(e) = &tr.endpoint {
        add(
            keys::ENDPOINT.into(),
            storage_dtype(e.storage()),
            e.shape().to_vec(),
            e.bytes().into(),
        );
    }

    let sample_ids: Vec<&str> = c.candidates.iter().map(|x| x.sample_id.as_str()).collect();
    let sample_ids = serde_json::to_string(&sample_ids).expect("strings serialise");
    let version = FORMAT_VERSION.to_string();
    let rollout = c.rollout_id.to_string();
    let group = c.group_index.to_string();
    let mut meta: BTreeMap<&str, &str> = BTreeMap::new();
    meta.insert(keys::META_FORMAT, FORMAT);
    meta.insert(keys::META_VERSION, &version);
    meta.insert(keys::META_TASK, &c.task);
    meta.insert(keys::META_ROLLOUT, &rollout);
    meta.insert(keys::META_GROUP, &group);
    meta.insert(keys::META_STORAGE, storage_name(c.storage));
    meta.insert(keys::META_SAMPLE_IDS, &sample_ids);
    meta.insert(keys::META_FINGERPRINT, c.sampling_fingerprint.as_str());
    meta.insert(keys::META_WEIGHTS, c.weight_manifest_hash.as_str());
    let hash_view: BTreeMap<&str, (Dtype, &[usize], &[u8])> = entries
        .iter()
        .map(|(k, e)| (k.as_str(), (e.dtype, e.shape.as_slice(), e.data.as_ref())))
        .collect();
    let hash = content_hash(&meta, &hash_view);
    let mut metadata: HashMap<String, String> = meta
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    metadata.insert(keys::META_CONTENT_HASH.into(), hash);

    safetensors::serialize(entries.iter().map(|(k, e)| (k.as_str(), e)), Some(metadata)).map_err(
        |source| TrajectoryError::Serialize {
            path: path.to_path_buf(),
            source,
        },
    )
}

fn with_path(e: TrajectoryError, path: &Path) -> TrajectoryError {
    match e {
        TrajectoryError::InvalidRecord {
            path: None,
            problem,
        } => TrajectoryError::InvalidRecord {
            path: Some(path.to_path_buf()),
            problem,
        },
        other => other,
    }
}

/// Checks the file length against the length prefix and the header, and parses the header.
fn parse_header(bytes: &[u8], path: &Path) -> Result<(usize, Metadata), TrajectoryError> {
    let file_len = bytes.len() as u64;
    if bytes.len() < 8 {
        return Err(TrajectoryError::Truncated {
            path: path.to_path_buf(),
            file_len,
            needed: 8,
            part: "length prefix",
        });
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    if n <= MAX_HEADER && 8 + n > file_len {
        return Err(TrajectoryError::Truncated {
            path: path.to_path_buf(),
            file_len,
            needed: 8 + n,
            part: "header",
        });
    }
    match safetensors::SafeTensors::read_metadata(bytes) {
        Ok(ok) => Ok(ok),
        Err(SafeTensorError::MetadataIncompleteBuffer) => {
            // The header parsed; compare the data length it describes with the file's.
            let header = &bytes[8..8 + n as usize];
            let described = described_data_len(header).map(|d| 8 + n + d);
            match described {
                Some(described) if described > file_len => Err(TrajectoryError::Truncated {
                    path: path.to_path_buf(),
                    file_len,
                    needed: described,
                    part: "tensor data",
                }),
                Some(described) => Err(TrajectoryError::TrailingBytes {
                    path: path.to_path_buf(),
                    file_len,
                    described,
                }),
                None => Err(TrajectoryError::CorruptHeader {
                    path: path.to_path_buf(),
                    source: SafeTensorError::MetadataIncompleteBuffer,
                }),
            }
        }
        Err(source) => Err(TrajectoryError::CorruptHeader {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// The largest data end offset a (parseable) header describes.
fn described_data_len(header: &[u8]) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_slice(header).ok()?;
    let mut end = 0u64;
    for (k, info) in v.as_object()? {
        if k == "__metadata__" {
            continue;
        }
        let e = info.get("data_offsets")?.get(1)?.as_u64()?;
        end = end.max(e);
    }
    Some(end)
}

/// Decodes and validates sidecar bytes; `path` names the source in errors.
///
/// # Errors
/// Every read-side variant of [`TrajectoryError`]: `Truncated`, `TrailingBytes`,
/// `CorruptHeader`, `UnknownVersion`, `MissingMetadata`, `InvalidMetadata`,
/// `UnexpectedMetadata`, `MissingKey`, `UnexpectedKey`, `DtypeMismatch`, `ShapeMismatch`,
/// `ChecksumMismatch`, `NonFinite`, `InvalidRecord`.
pub fn decode(bytes: &[u8], path: &Path) -> Result<Trajectory, TrajectoryError> {
    let (n, header) = parse_header(bytes, path)?;
    let data = &bytes[8 + n..];
    let p = || path.to_path_buf();

    // Metadata: version first, then the rest.
    let empty = HashMap::new();
    let meta = header.metadata().as_ref().unwrap_or(&empty);
    let get = |key: &'static str| {
        meta.get(key)
            .map(String::as_str)
            .ok_or_else(|| TrajectoryError::MissingMetadata { path: p(), key })
    };
    let version = get(keys::META_VERSION)?;
    if version != FORMAT_VERSION.to_string() {
        return Err(TrajectoryError::UnknownVersion {
            path: p(),
            found: version.to_string(),
            supported: FORMAT_VERSION,
        });
    }
    let invalid =
        |key: &'static str, value: &str, expected: &'static str| TrajectoryError::InvalidMetadata {
            path: p(),
            key,
            value: value.to_string(),
            expected,
        };
    let format = get(keys::META_FORMAT)?;
    if format != FORMAT {
        return Err(invalid(keys::META_FORMAT, format, "\"flowrl.trajectory\""));
    }
    let mut meta_keys: Vec<&String> = meta.keys().collect();
    meta_keys.sort();
    if let Some(k) = meta_keys
        .iter()
        .find(|k| !keys::METADATA.contains(&k.as_str()))
    {
        return Err(TrajectoryError::UnexpectedMetadata {
            path: p(),
            key: (*k).clone(),
        });
    }
    let task = get(keys::META_TASK)?.to_string();
    let parse_u64 = |key: &'static str| -> Result<u64, TrajectoryError> {
        let v = get(key)?;
        if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid(key, v, "a decimal unsigned integer"));
        }
        v.parse()
            .map_err(|_| invalid(key, v, "a decimal unsigned integer"))
    };
    let rollout_id = parse_u64(keys::META_ROLLOUT)?;
    let group_index = parse_u64(keys::META_GROUP)?;
    let storage_str = get(keys::META_STORAGE)?;
    let storage = match storage_str {
        "f32" => StorageDtype::F32,
        "bf16" => StorageDtype::Bf16,
        "f16" => StorageDtype::F16,
        other => {
            return Err(invalid(
                keys::META_STORAGE,
                other,
                "\"f32\", \"bf16\" or \"f16\"",
            ));
        }
    };
    let ids_str = get(keys::META_SAMPLE_IDS)?;
    let sample_ids: Vec<String> = serde_json::from_str(ids_str)
        .map_err(|_| invalid(keys::META_SAMPLE_IDS, ids_str, "a JSON array of strings"))?;
    let digest = |key: &'static str| -> Result<Digest, TrajectoryError> {
        let v = get(key)?;
        Digest::parse(v).map_err(|_| invalid(key, v, "\"sha256:\" and 64 lowercase hex digits"))
    };
    let sampling_fingerprint = digest(keys::META_FINGERPRINT)?;
    let weight_manifest_hash = digest(keys::META_WEIGHTS)?;
    let recorded_hash = get(keys::META_CONTENT_HASH)?.to_string();

    // Tensor keys: nothing missing, nothing unknown.
    let infos = header.tensors();
    let mut names: Vec<&String> = infos.keys().collect();
    names.sort();
    for key in keys::TENSORS {
        if !infos.contains_key(key) {
            return Err(TrajectoryError::MissingKey {
                path: p(),
                key: key.to_string(),
            });
        }
    }
    for name in &names {
        let fixed = keys::TENSORS.contains(&name.as_str()) || name.as_str() == keys::ENDPOINT;
        let extra = name
            .strip_prefix(keys::EXTRA_PREFIX)
            .is_some_and(is_simple_name);
        if !fixed && !extra {
            return Err(TrajectoryError::UnexpectedKey {
                path: p(),
                key: (*name).clone(),
                version: FORMAT_VERSION,
            });
        }
    }

    let info = |key: &str| -> &TensorInfo { infos[key] };
    let check_dtype = |key: &str, allowed: &[Dtype]| -> Result<Dtype, TrajectoryError> {
        let d = info(key).dtype;
        if allowed.contains(&d) {
            Ok(d)
        } else {
            Err(TrajectoryError::DtypeMismatch {
                path: p(),
                key: key.to_string(),
                found: dtype_name(d),
                expected: allowed
                    .iter()
                    .map(|d| dtype_name(*d))
                    .collect::<Vec<_>>()
                    .join(" or "),
            })
        }
    };
    let shape_err = |key: &str, expected: String| TrajectoryError::ShapeMismatch {
        path: p(),
        key: key.to_string(),
        found: info(key).shape.clone(),
        expected,
    };
    let rank1 = |key: &str| -> Result<usize, TrajectoryError> {
        match info(key).shape.as_slice() {
            [n] => Ok(*n),
            _ => Err(shape_err(key, "[?]".into())),
        }
    };
    let exact = |key: &str, want: &[usize]| -> Result<(), TrajectoryError> {
        if info(key).shape == want {
            Ok(())
        } else {
            Err(shape_err(key, format!("{want:?}")))
        }
    };
    const FLOATS: [Dtype; 3] = [Dtype::F32, Dtype::BF16, Dtype::F16];

    check_dtype(keys::SIGMAS, &[Dtype::F32])?;
    rank1(keys::SIGMAS)?;
    check_dtype(keys::SDE_INDICES, &[Dtype::I64])?;
    let s = rank1(keys::SDE_INDICES)?;
    check_dtype(keys::LATENT_STEPS, &[Dtype::I64])?;
    let l = rank1(keys::LATENT_STEPS)?;
    check_dtype(keys::IMAGE_SIZE, &[Dtype::I64])?;
    exact(keys::IMAGE_SIZE, &[2])?;
    check_dtype(keys::SAMPLE_INDICES, &[Dtype::U64])?;
    let g = rank1(keys::SAMPLE_INDICES)?;
    for key in [keys::POLICY_VERSIONS, keys::SEED_HASHES] {
        check_dtype(key, &[Dtype::U64])?;
        exact(key, &[g])?;
    }
    check_dtype(keys::TEXT_EMBEDDINGS, &FLOATS)?;
    let tokens = match info(keys::TEXT_EMBEDDINGS).shape.as_slice() {
        [t, _] => *t,
        _ => return Err(shape_err(keys::TEXT_EMBEDDINGS, "[?, ?]".into())),
    };
    check_dtype(keys::TEXT_MASK, &[Dtype::BOOL])?;
    exact(keys::TEXT_MASK, &[tokens])?;
    check_dtype(keys::LATENTS, &[storage_dtype(storage)])?;
    {
        let shape = &info(keys::LATENTS).shape;
        if shape.len() < 3 || shape[0] != g || shape[1] != l {
            return Err(shape_err(keys::LATENTS, format!("[{g}, {l}, ?, ...]")));
        }
    }
    check_dtype(keys::LOG_PROBS, &[Dtype::F32])?;
    exact(keys::LOG_PROBS, &[g, s])?;
    if infos.contains_key(keys::ENDPOINT) {
        check_dtype(keys::ENDPOINT, &[storage_dtype(storage)])?;
    }
    let extra_names: Vec<&String> = names
        .iter()
        .copied()
        .filter(|n| n.starts_with(keys::EXTRA_PREFIX))
        .collect();
    for name in &extra_names {
        check_dtype(name, &FLOATS)?;
    }
    if sample_ids.len() != g {
        return Err(invalid(
            keys::META_SAMPLE_IDS,
            ids_str,
            "one sample id per candidate (common.sample_indices)",
        ));
    }

    // Content hash over everything read.
    let slice = |key: &str| -> &[u8] {
        let (a, b) = info(key).data_offsets;
        &data[a..b]
    };
    let hash_view: BTreeMap<&str, (Dtype, &[usize], &[u8])> = names
        .iter()
        .map(|k| {
            let i = info(k);
            (k.as_str(), (i.dtype, i.shape.as_slice(), slice(k)))
        })
        .collect();
    let meta_view: BTreeMap<&str, &str> =
        meta.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let computed = content_hash(&meta_view, &hash_view);
    if computed != recorded_hash {
        return Err(TrajectoryError::ChecksumMismatch {
            path: p(),
            recorded: recorded_hash,
            computed,
        });
    }

    // Decode the values.
    let read_u64 = |key: &str| -> Vec<u64> {
        slice(key)
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect()
    };
    let read_index = |key: &'static str| -> Result<Vec<usize>, TrajectoryError> {
        slice(key)
            .chunks_exact(8)
            .enumerate()
            .map(|(index, c)| {
                let value = i64::from_le_bytes(c.try_into().expect("8 bytes"));
                usize::try_from(value).map_err(|_| TrajectoryError::InvalidRecord {
                    path: Some(p()),
                    problem: RecordProblem::IndexValue {
                        field: key,
                        index,
                        value,
                    },
                })
            })
            .collect()
    };
    let read_f32 = |key: &str| -> Vec<f32> {
        slice(key)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect()
    };
    let stored = |key: &str| -> Result<StoredTensor, TrajectoryError> {
        let i = info(key);
        let st = storage_from_dtype(i.dtype).expect("dtype checked above");
        StoredTensor::from_bytes(key, slice(key).to_vec(), i.shape.clone(), st)
    };

    let sigmas = read_f32(keys::SIGMAS);
    let sde_indices = read_index(keys::SDE_INDICES)?;
    let latent_steps = read_index(keys::LATENT_STEPS)?;
    let image_size = read_index(keys::IMAGE_SIZE)?;
    let dim = |index: usize| -> Result<u32, TrajectoryError> {
        u32::try_from(image_size[index]).map_err(|_| TrajectoryError::InvalidRecord {
            path: Some(p()),
            problem: RecordProblem::IndexValue {
                field: keys::IMAGE_SIZE,
                index,
                value: image_size[index] as i64,
            },
        })
    };
    let (height, width) = (dim(0)?, dim(1)?);
    let sample_indices = read_u64(keys::SAMPLE_INDICES);
    let policy_versions = read_u64(keys::POLICY_VERSIONS);
    let seed_hashes = read_u64(keys::SEED_HASHES);
    let mut text_mask = Vec::with_capacity(tokens);
    for (index, &b) in slice(keys::TEXT_MASK).iter().enumerate() {
        match b {
            0 => text_mask.push(false),
            1 => text_mask.push(true),
            value => {
                return Err(TrajectoryError::InvalidRecord {
                    path: Some(p()),
                    problem: RecordProblem::MaskByte { index, value },
                });
            }
        }
    }
    let mut extra = BTreeMap::new();
    for name in extra_names {
        let short = name
            .strip_prefix(keys::EXTRA_PREFIX)
            .expect("filtered by prefix");
        extra.insert(short.to_string(), stored(name)?);
    }

    let candidates = sample_ids
        .into_iter()
        .enumerate()
        .map(|(i, sample_id)| Candidate {
            sample_id,
            sample_index: sample_indices[i],
            policy_version: policy_versions[i],
            seed_hash: seed_hashes[i],
        })
        .collect();
    let traj = Trajectory {
        common: Common {
            task,
            rollout_id,
            group_index,
            height,
            width,
            sigmas,
            sde_indices,
            storage,
            sampling_fingerprint,
            weight_manifest_hash,
            candidates,
        },
        conditions: Conditions {
            text_embeddings: stored(keys::TEXT_EMBEDDINGS)?,
            text_mask,
            extra,
        },
        tracks: Tracks {
            latents: stored(keys::LATENTS)?,
            log_probs: read_f32(keys::LOG_PROBS),
            endpoint: if infos.contains_key(keys::ENDPOINT) {
                Some(stored(keys::ENDPOINT)?)
            } else {
                None
            },
        },
    };
    let expected_steps = traj.common.latent_steps();
    if latent_steps != expected_steps {
        return Err(TrajectoryError::InvalidRecord {
            path: Some(p()),
            problem: RecordProblem::LatentSteps {
                found: latent_steps,
                expected: expected_steps,
            },
        });
    }
    traj.validate().map_err(|e| with_path(e, path))?;
    Ok(traj)
}

/// A file written to `<name>.tmp` and fsynced, not yet renamed into place (a
/// [`durable::Staged`] whose errors are [`TrajectoryError::Io`]).
///
/// [`StagedFile::commit`] renames it over the destination and fsyncs the directory. Dropping
/// it uncommitted removes the temporary file; a crash before the commit leaves the temporary
/// file behind and the destination untouched (readers never look at `.tmp` files, and the next
/// write of the same destination replaces it). One writer per destination: two processes
/// staging the same file at once would share its `.tmp`.
#[derive(Debug)]
#[must_use = "a staged file is not visible until committed"]
pub struct StagedFile(durable::Staged);

pub use durable::{WrittenFile, tmp_path};

/// fsyncs a directory so a rename inside it is durable (a no-op where directories cannot be
/// opened, i.e. outside Unix).
pub(crate) fn sync_dir(dir: &Path) -> Result<(), TrajectoryError> {
    Ok(durable::sync_dir(dir)?)
}

/// Writes `bytes` to `<dest>.tmp` and fsyncs it (creating the parent directory if needed).
///
/// # Errors
/// [`TrajectoryError::Io`] naming the operation.
pub fn stage_file(dest: &Path, bytes: &[u8]) -> Result<StagedFile, TrajectoryError> {
    Ok(StagedFile(durable::stage(dest, bytes)?))
}

impl StagedFile {
    /// The temporary file.
    pub fn tmp_path(&self) -> &Path {
        self.0.tmp_path()
    }

    /// The destination.
    pub fn destination(&self) -> &Path {
        self.0.destination()
    }

    /// Renames the temporary file over the destination (atomic on POSIX filesystems) and
    /// fsyncs the directory.
    ///
    /// # Errors
    /// [`TrajectoryError::Io`]; the temporary file is removed on failure.
    pub fn commit(self) -> Result<WrittenFile, TrajectoryError> {
        Ok(self.0.commit()?)
    }
}

/// Writes `bytes` to `dest` atomically: `.tmp` → fsync → rename → directory fsync
/// ([`durable::write_atomic`]). Use it for every artifact (sidecars, sample PNGs) so no reader
/// ever sees a partial file.
///
/// # Errors
/// [`TrajectoryError::Io`].
pub fn write_atomic(dest: &Path, bytes: &[u8]) -> Result<WrittenFile, TrajectoryError> {
    Ok(durable::write_atomic(dest, bytes)?)
}

/// Encodes `traj` and stages it at `path` (not yet visible; see [`StagedFile`]).
///
/// # Errors
/// As [`encode`] and [`stage_file`].
pub fn stage_sidecar(path: &Path, traj: &Trajectory) -> Result<StagedFile, TrajectoryError> {
    let bytes = encode_for(traj, path)?;
    stage_file(path, &bytes)
}

/// Writes a trajectory sidecar atomically (see the module docs).
///
/// # Errors
/// As [`encode`] and [`write_atomic`].
///
/// The crate-level example writes and reads one back.
pub fn write_sidecar(path: &Path, traj: &Trajectory) -> Result<WrittenFile, TrajectoryError> {
    stage_sidecar(path, traj)?.commit()
}

/// Reads and validates a sidecar.
///
/// # Errors
/// [`TrajectoryError::Io`] and every error of [`decode`].
pub fn read_sidecar(path: &Path) -> Result<Trajectory, TrajectoryError> {
    let bytes = fs::read(path).map_err(io_err(path, "read"))?;
    decode(&bytes, path)
}
