//! The one error type of `trajectory`.

use std::fmt;
use std::path::{Path, PathBuf};

use sde_math::StorageDtype;
use thiserror::Error;

/// Everything that can go wrong building, writing or reading a trajectory.
///
/// Errors about a file name the file (`path`) and the problem; a sidecar that fails any check is
/// rejected whole, never partially read.
#[derive(Debug, Error)]
pub enum TrajectoryError {
    /// The file ends before the data its own header promises (a crash during a non-atomic copy,
    /// a full disk, a partial transfer).
    #[error(
        "{}: sidecar is truncated: the file has {file_len} bytes but {needed} are needed ({part})",
        path.display()
    )]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Its length.
        file_len: u64,
        /// The length the header (or the length prefix) requires.
        needed: u64,
        /// Which part is cut: the length prefix, the header or the tensor data.
        part: &'static str,
    },

    /// The header is not a valid safetensors header (bad UTF-8 or JSON, inconsistent offsets,
    /// trailing bytes after the data).
    #[error("{}: sidecar header is corrupt: {source}", path.display())]
    CorruptHeader {
        /// The file.
        path: PathBuf,
        /// The safetensors parser's diagnosis.
        #[source]
        source: safetensors::SafeTensorError,
    },

    /// The file carries more bytes than its header describes.
    #[error(
        "{}: sidecar has {file_len} bytes but its header describes {described}: trailing bytes or a corrupt header",
        path.display()
    )]
    TrailingBytes {
        /// The file.
        path: PathBuf,
        /// Its length.
        file_len: u64,
        /// The length its header describes.
        described: u64,
    },

    /// The sidecar's `format_version` is not one this build reads.
    #[error(
        "{}: unknown sidecar format_version {found:?}; this build reads version {supported}",
        path.display()
    )]
    UnknownVersion {
        /// The file.
        path: PathBuf,
        /// The version string found.
        found: String,
        /// The version this build reads.
        supported: u32,
    },

    /// A required `__metadata__` entry is absent.
    #[error("{}: sidecar metadata has no {key:?} entry", path.display())]
    MissingMetadata {
        /// The file.
        path: PathBuf,
        /// The missing key.
        key: &'static str,
    },

    /// A `__metadata__` entry does not parse.
    #[error("{}: sidecar metadata {key:?} = {value:?} is invalid; expected {expected}", path.display())]
    InvalidMetadata {
        /// The file.
        path: PathBuf,
        /// The key.
        key: &'static str,
        /// The value found.
        value: String,
        /// What is allowed.
        expected: &'static str,
    },

    /// A `__metadata__` entry that this format version does not define.
    #[error("{}: sidecar metadata has an unexpected entry {key:?}", path.display())]
    UnexpectedMetadata {
        /// The file.
        path: PathBuf,
        /// The unexpected key.
        key: String,
    },

    /// A required tensor is absent.
    #[error("{}: sidecar has no tensor {key:?}", path.display())]
    MissingKey {
        /// The file.
        path: PathBuf,
        /// The missing tensor key.
        key: String,
    },

    /// A tensor key that this format version does not define.
    #[error("{}: sidecar has an unexpected tensor {key:?} (not part of format version {version})", path.display())]
    UnexpectedKey {
        /// The file.
        path: PathBuf,
        /// The unexpected key.
        key: String,
        /// The format version read.
        version: u32,
    },

    /// A tensor has the wrong dtype.
    #[error("{}: tensor {key:?} has dtype {found}, expected {expected}", path.display())]
    DtypeMismatch {
        /// The file.
        path: PathBuf,
        /// The tensor key.
        key: String,
        /// The dtype found (safetensors' name).
        found: String,
        /// The dtype(s) allowed.
        expected: String,
    },

    /// A tensor has the wrong shape.
    #[error("{}: tensor {key:?} has shape {found:?}, expected {expected}", path.display())]
    ShapeMismatch {
        /// The file.
        path: PathBuf,
        /// The tensor key.
        key: String,
        /// The shape found.
        found: Vec<usize>,
        /// The shape expected (`?` for a free dimension).
        expected: String,
    },

    /// The content hash recorded at write time does not match the content read back.
    #[error(
        "{}: sidecar content hash mismatch: recorded {recorded}, computed {computed} (corrupt header or data)",
        path.display()
    )]
    ChecksumMismatch {
        /// The file.
        path: PathBuf,
        /// The hash in the metadata.
        recorded: String,
        /// The hash of what was read.
        computed: String,
    },

    /// The record itself is inconsistent (before writing, or after decoding a file).
    #[error("{}: invalid trajectory: {problem}", Location(path.as_deref()))]
    InvalidRecord {
        /// The file, when the record came from (or was going to) one.
        path: Option<PathBuf>,
        /// What is wrong.
        problem: RecordProblem,
    },

    /// A value cannot be stored bit-exactly at the requested precision. Round it first with
    /// [`StorageDtype::round_trip`] — the same rounding the sampler scored.
    #[error(
        "{what}[{index}] = {value:e} is not exactly representable as {storage:?}; round it with StorageDtype::round_trip before storing \
         (replay must score exactly what the sampler scored)"
    )]
    NotRepresentable {
        /// Which tensor.
        what: String,
        /// The flat element index.
        index: usize,
        /// The value.
        value: f32,
        /// The storage precision.
        storage: StorageDtype,
    },

    /// A stored float is NaN or infinite: a broken rollout must not train.
    #[error("{what}[{index}] = {value} is not finite")]
    NonFinite {
        /// Which tensor.
        what: String,
        /// The flat element index.
        index: usize,
        /// The value.
        value: f32,
    },

    /// [`StorageDtype::Native`] names no on-disk precision.
    #[error("{what}: StorageDtype::Native has no on-disk format; choose F32, Bf16 or F16")]
    NativeStorage {
        /// Which tensor.
        what: String,
    },

    /// A byte buffer does not match its declared shape and dtype.
    #[error("{what}: {len} bytes cannot hold shape {shape:?} at {storage:?} ({expected} bytes)")]
    ByteLength {
        /// Which tensor.
        what: String,
        /// The bytes given.
        len: usize,
        /// The declared shape.
        shape: Vec<usize>,
        /// The declared precision.
        storage: StorageDtype,
        /// The bytes the shape needs.
        expected: usize,
    },

    /// A tensor was asked for at a rank that does not match the stored data.
    #[error(
        "{what}: asked for a rank-{asked} tensor, but the data has shape {shape:?} (rank {rank})"
    )]
    Rank {
        /// Which tensor.
        what: String,
        /// The rank asked for.
        asked: usize,
        /// The shape of the data.
        shape: Vec<usize>,
        /// The rank it implies.
        rank: usize,
    },

    /// An index into the record is out of range.
    #[error("{what} {index} is out of range (there are {len})")]
    OutOfRange {
        /// What was indexed (candidate slot, trained step, ...).
        what: &'static str,
        /// The index asked for.
        index: usize,
        /// How many there are.
        len: usize,
    },

    /// A filesystem operation failed.
    #[error("{}: {op} failed: {source}", path.display())]
    Io {
        /// The path operated on.
        path: PathBuf,
        /// The operation (`"create"`, `"fsync"`, `"rename"`, ...).
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// Serialising the sidecar failed (a tensor too large for the format, ...).
    #[error("{}: cannot serialise sidecar: {source}", path.display())]
    Serialize {
        /// The destination.
        path: PathBuf,
        /// The serialiser's error.
        #[source]
        source: safetensors::SafeTensorError,
    },

    /// An artifact task name cannot be used as a directory name.
    #[error("invalid artifact task name {task:?}: {reason}")]
    InvalidTask {
        /// The name given.
        task: String,
        /// Why it is refused.
        reason: &'static str,
    },

    /// A candidate manifest is not valid JSON of the expected schema.
    #[error("invalid candidate manifest JSON: {source}")]
    ManifestJson {
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },

    /// A candidate manifest has a format or version this build does not read.
    #[error(
        "candidate manifest has format {format:?} version {version}; this build reads {expected:?} version {supported}"
    )]
    ManifestVersion {
        /// The format found.
        format: String,
        /// The version found.
        version: u32,
        /// The format expected.
        expected: &'static str,
        /// The version this build reads.
        supported: u32,
    },

    /// A candidate manifest disagrees with the sidecar it points at.
    #[error(
        "candidate manifest disagrees with its sidecar on {field}: manifest {manifest}, sidecar {sidecar}"
    )]
    ManifestMismatch {
        /// The field that differs.
        field: &'static str,
        /// The manifest's value.
        manifest: String,
        /// The sidecar's value.
        sidecar: String,
    },

    /// A digest string is malformed.
    #[error("invalid digest {value:?}: expected \"sha256:\" followed by 64 lowercase hex digits")]
    InvalidDigest {
        /// The string given.
        value: String,
    },

    /// The sampling configuration cannot be serialised for fingerprinting.
    #[error("cannot fingerprint the sampling configuration: {source}")]
    FingerprintConfig {
        /// The serialisation error.
        #[source]
        source: serde_json::Error,
    },

    /// A sampling schedule contains a non-finite sigma, which has no stable fingerprint.
    #[error("cannot fingerprint sigmas: sigmas[{index}] = {value} is not finite")]
    FingerprintSigma {
        /// The index.
        index: usize,
        /// The value.
        value: f32,
    },
}

/// What is inconsistent in a [`Trajectory`](crate::Trajectory).
#[derive(Debug, Clone, PartialEq)]
pub enum RecordProblem {
    /// The group has no candidates.
    NoCandidates,
    /// No SDE step is trained and there is no endpoint: nothing to train on.
    NoTrainedSteps,
    /// The sigma schedule is not strictly decreasing, within `[0, 1]`, finite, with at least
    /// two entries.
    Schedule {
        /// The schedule.
        sigmas: Vec<f32>,
        /// Why it is refused.
        reason: &'static str,
    },
    /// The trained SDE step indices are not strictly increasing steps of the schedule.
    SdeIndices {
        /// The indices.
        indices: Vec<usize>,
        /// Number of steps in the schedule (`sigmas.len() - 1`).
        steps: usize,
    },
    /// The stored latent steps are not the ones the trained steps need.
    LatentSteps {
        /// The steps stored.
        found: Vec<usize>,
        /// `{k, k + 1 : k in sde_indices}`, sorted.
        expected: Vec<usize>,
    },
    /// A per-candidate or per-step field has the wrong length.
    Length {
        /// The field.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The length required.
        expected: usize,
    },
    /// A tensor has the wrong shape.
    Shape {
        /// The field.
        field: &'static str,
        /// Its shape.
        shape: Vec<usize>,
        /// The shape required (`?` for a free dimension).
        expected: String,
    },
    /// The latents are not stored at the record's storage precision.
    LatentPrecision {
        /// The record's storage precision.
        storage: StorageDtype,
        /// The latents' precision.
        latents: StorageDtype,
    },
    /// `height` or `width` is zero.
    ImageSize {
        /// Height in pixels.
        height: u32,
        /// Width in pixels.
        width: u32,
    },
    /// A name that must be a simple identifier is not.
    Name {
        /// The field.
        field: &'static str,
        /// The name.
        name: String,
    },
    /// A mask byte is neither 0 nor 1.
    MaskByte {
        /// The element index.
        index: usize,
        /// The byte.
        value: u8,
    },
    /// An index field holds a value that does not fit (negative, or beyond `usize`).
    IndexValue {
        /// The field.
        field: &'static str,
        /// The element index.
        index: usize,
        /// The raw value.
        value: i64,
    },
    /// A rollout log-prob is NaN or infinite.
    NonFiniteLogProb {
        /// Candidate slot.
        slot: usize,
        /// Trained-step position.
        step: usize,
        /// The value.
        value: f32,
    },
    /// A stored float is NaN or infinite.
    NonFinite {
        /// The field.
        field: String,
        /// The flat element index.
        index: usize,
    },
}

impl fmt::Display for RecordProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordProblem::NoCandidates => write!(f, "the group has no candidates"),
            RecordProblem::NoTrainedSteps => {
                write!(
                    f,
                    "no SDE step is trained (sde_indices is empty) and there is no endpoint to train on"
                )
            }
            RecordProblem::Schedule { sigmas, reason } => {
                write!(f, "sigma schedule {sigmas:?} {reason}")
            }
            RecordProblem::SdeIndices { indices, steps } => write!(
                f,
                "sde_indices {indices:?} must be strictly increasing step indices of a {steps}-step schedule (each < {steps})"
            ),
            RecordProblem::LatentSteps { found, expected } => write!(
                f,
                "latent_steps {found:?} must be {expected:?} (each trained step k needs the latents at k and k + 1)"
            ),
            RecordProblem::Length {
                field,
                len,
                expected,
            } => write!(f, "{field} has length {len}, expected {expected}"),
            RecordProblem::Shape {
                field,
                shape,
                expected,
            } => write!(f, "{field} has shape {shape:?}, expected {expected}"),
            RecordProblem::LatentPrecision { storage, latents } => write!(
                f,
                "latents are stored as {latents:?} but the record's storage precision is {storage:?}"
            ),
            RecordProblem::ImageSize { height, width } => {
                write!(f, "image size {height}x{width} must be non-zero")
            }
            RecordProblem::Name { field, name } => write!(
                f,
                "{field} {name:?} must be non-empty and made of [a-z0-9_] only"
            ),
            RecordProblem::MaskByte { index, value } => {
                write!(f, "text mask byte {index} is {value}, expected 0 or 1")
            }
            RecordProblem::IndexValue {
                field,
                index,
                value,
            } => write!(
                f,
                "{field}[{index}] = {value} is not a valid non-negative index"
            ),
            RecordProblem::NonFiniteLogProb { slot, step, value } => write!(
                f,
                "rollout log-prob of candidate {slot} at trained step {step} is {value}"
            ),
            RecordProblem::NonFinite { field, index } => {
                write!(f, "{field}[{index}] is not finite")
            }
        }
    }
}

/// Displays an optional path (`<in memory>` when absent).
struct Location<'a>(Option<&'a Path>);

impl fmt::Display for Location<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(p) => write!(f, "{}", p.display()),
            None => write!(f, "<in memory>"),
        }
    }
}

/// A failed durable write names the file and the operation, as every other IO error does.
impl From<durable::DurableError> for TrajectoryError {
    fn from(e: durable::DurableError) -> Self {
        TrajectoryError::Io {
            path: e.path,
            op: e.op,
            source: e.source,
        }
    }
}

pub(crate) fn io_err(
    path: &Path,
    op: &'static str,
) -> impl FnOnce(std::io::Error) -> TrajectoryError {
    let path = path.to_path_buf();
    move |source| TrajectoryError::Io { path, op, source }
}
