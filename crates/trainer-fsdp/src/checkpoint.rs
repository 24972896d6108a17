//! Crash-safe checkpoints (seed 002, "Checkpoints" and "Checkpoints and export").
//!
//! ```text
//! <root>/<task>/iter_0000020/
//! ├── model.mpk                 trainable parameters only (the adapter under LoRA), by module path
//! ├── adapter_model.safetensors the same, readable without burn, where the world writes it
//! ├── adapter_config.json         (the shapes world under LoRA: a PEFT adapter directory)
//! ├── ema.mpk                   with [ema]: the EMA copy's trainable parameters, as model.mpk
//! ├── sampler.mpk               DiffusionNFT: the sampling copy's trainable parameters
//! ├── optimizer.mpk             the optimizer's record (AdamW moments and step counts)
//! ├── rng_rank0.json            the trainer's random stream
//! ├── adapter_contract.json     LoRA only: rank, alpha, dropout, targets, rsLoRA, base hash
//! ├── trainer_state.json        rollout id, policy version, lr-scheduler steps, metrics cursor
//! └── COMMITTED                 written last: every file above with its length and xxh3-128
//! <root>/<task>/latest_checkpointed_iteration.txt
//! <root>/latest_checkpointed_iteration.txt
//! ```
//!
//! Every file is written `.tmp` → fsync → rename → directory fsync, in that fixed order, so a
//! crash at any point leaves either a checkpoint with a `COMMITTED` marker whose files are all
//! complete, or a directory without one, which resume never trusts. The iteration directory is
//! the rollout id of the last completed rollout; resume continues at `rollout_id + 1`.
//!
//! Weights and optimizer state go through burn's recorder machinery (`NamedMpkBytesRecorder`,
//! named MessagePack): the optimizer through its own `Optimizer::to_record` /
//! `load_record`, the weights as the trainable parameters' `TensorData` (exact bytes, any
//! dtype) keyed by module path together with their `ParamId`s. Restoring the ids on load is
//! what lets the optimizer record (keyed by `ParamId`) find its parameters in a freshly built
//! model. Frozen parameters (a LoRA base) are not saved: the base is reloaded from the model
//! path, and the adapter contract, which records its hash, is checked on resume.
//!
//! Rotation (`max_to_keep`) runs after a new checkpoint is committed, never before: with
//! `max_to_keep = 1` a crash mid-write still leaves the previous checkpoint. Removing a
//! checkpoint deletes its `COMMITTED` marker first.

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::Optimizer;
use burn::record::{
    DoublePrecisionSettings, FullPrecisionSettings, NamedMpkBytesRecorder, PrecisionSettings,
    Recorder,
};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Element, Tensor, TensorData};
use dit_models::AdapterContract;
use serde::{Deserialize, Serialize};

use crate::error::{CheckpointProblem, TrainerError, io_err};
use crate::monitor::MetricsCursor;
use crate::rng::TrainerRng;

/// The trainable weights.
pub const WEIGHTS_FILE: &str = "model.mpk";
/// The EMA copy of the trainable weights (with `[ema]`).
pub const EMA_FILE: &str = "ema.mpk";
/// The EMA's f32 average, where it is kept apart from [`EMA_FILE`]'s copy (trainable weights
/// below f32 under `ema.precision = "fp32"`).
pub const EMA_AVERAGE_FILE: &str = "ema_f32.mpk";
/// The sampling copy of the trainable weights (DiffusionNFT's `θ_old`).
pub const SAMPLER_FILE: &str = "sampler.mpk";
/// The optimizer state.
pub const OPTIMIZER_FILE: &str = "optimizer.mpk";
/// The trainer's random stream (rank 0).
pub const RNG_FILE: &str = "rng_rank0.json";
/// The adapter contract (LoRA only).
pub const CONTRACT_FILE: &str = dit_models::lora::CONTRACT_FILE;
/// The trainer state.
pub const TRAINER_STATE_FILE: &str = "trainer_state.json";
/// The commit marker, written last; the only marker resume trusts.
pub const COMMITTED_FILE: &str = "COMMITTED";
/// The latest-iteration marker (under the task directory and the root).
pub const LATEST_FILE: &str = "latest_checkpointed_iteration.txt";

const ITER_PREFIX: &str = "iter_";
const STATE_FORMAT: &str = "trainer-fsdp/trainer-state/1";
const COMMIT_FORMAT: &str = "trainer-fsdp/committed/1";
const WEIGHTS_FORMAT: &str = "trainer-fsdp/trainable-weights/1";

/// The trainer's progress, saved with every checkpoint (`trainer_state.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Format tag.
    pub format: String,
    /// The task (`<root>/<task>/`).
    pub task: String,
    /// The last completed rollout (the checkpoint's iteration); resume starts at the next one.
    pub rollout_id: u64,
    /// The policy version: optimizer steps that changed the weights (what rollouts record).
    pub policy_version: u64,
    /// Optimizer steps counted by the learning-rate schedule (`lr_scheduler_steps`).
    pub lr_scheduler_steps: u64,
    /// Optimizer steps taken (`train/optimizer_steps`, cumulative).
    pub optimizer_steps: u64,
    /// Optimizer steps skipped (degenerate advantages, non-finite gradients), cumulative.
    pub optimizer_skips: u64,
    /// Checkpoint writes that failed and were retried at the next save, cumulative
    /// (`checkpoint.on_failure = "retry"`).
    pub checkpoint_failures: u64,
    /// Where the metric files ended when this checkpoint was taken.
    pub metrics_cursor: MetricsCursor,
}

impl TrainerState {
    /// The state of a run that has completed rollout `rollout_id`, with every counter at 0:
    /// fill them with `PolicyOptimizer::record_into` and set the metrics cursor.
    pub fn new(task: &str, rollout_id: u64) -> Self {
        Self {
            format: STATE_FORMAT.into(),
            task: task.into(),
            rollout_id,
            policy_version: 0,
            lr_scheduler_steps: 0,
            optimizer_steps: 0,
            optimizer_skips: 0,
            checkpoint_failures: 0,
            metrics_cursor: MetricsCursor::default(),
        }
    }

    /// The rollout a resumed run starts with.
    pub fn next_rollout_id(&self) -> u64 {
        self.rollout_id + 1
    }
}

/// One file of a committed checkpoint, as `COMMITTED` records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommittedFile {
    /// The file name inside the iteration directory.
    pub name: String,
    /// Its length in bytes.
    pub bytes: u64,
    /// Its xxh3-128 content hash, hex.
    pub xxh3_128: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct CommitManifest {
    format: String,
    iteration: u64,
    /// The float type of the optimizer record (`f32` or `f64`).
    record_float: String,
    files: Vec<CommittedFile>,
}

/// A checkpoint whose `COMMITTED` marker exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedCheckpoint {
    /// Its iteration (the rollout id).
    pub iteration: u64,
    /// Its directory.
    pub dir: PathBuf,
}

/// What one [`CheckpointStore::save`] wrote and removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedCheckpoint {
    /// The new checkpoint.
    pub checkpoint: CommittedCheckpoint,
    /// Its files, as `COMMITTED` records them.
    pub files: Vec<CommittedFile>,
    /// Committed iterations removed by rotation.
    pub rotated: Vec<u64>,
    /// Uncommitted (crashed) iteration directories removed.
    pub removed_partial: Vec<u64>,
}

/// A point of a checkpoint write, reported to the write hook after it is durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WritePhase {
    /// The iteration directory exists (empty).
    Started,
    /// `model.mpk` is written.
    Weights,
    /// `optimizer.mpk` is written.
    Optimizer,
    /// `rng_rank0.json` is written.
    Rng,
    /// `adapter_contract.json` is written (LoRA only).
    AdapterContract,
    /// `trainer_state.json` is written.
    TrainerState,
    /// `COMMITTED` is written: the checkpoint is trusted from here on.
    Committed,
    /// The latest-iteration markers are written.
    LatestMarker,
}

/// A callback invoked after each durable step of a write (monitoring, or a test that wants to
/// crash inside the write window).
pub type WriteHook = Arc<dyn Fn(u64, WritePhase) + Send + Sync>;

/// A resumed run: the model and optimizer with the checkpoint's state loaded, and the trainer's
/// state, exactly as saved.
pub struct Resumed<M, O> {
    /// The checkpoint it came from.
    pub checkpoint: CommittedCheckpoint,
    /// The model, trainable parameters (and their ids) restored.
    pub model: M,
    /// The optimizer with its record loaded.
    pub optimizer: O,
    /// The trainer state.
    pub state: TrainerState,
    /// The trainer's random stream.
    pub rng: TrainerRng,
    /// The adapter contract the checkpoint recorded (LoRA).
    pub contract: Option<AdapterContract>,
}

/// The outcome of [`CheckpointStore::resume`].
pub enum Resume<M, O> {
    /// No committed checkpoint: start from scratch with the model and optimizer given.
    Fresh {
        /// The model, untouched.
        model: M,
        /// The optimizer, untouched.
        optimizer: O,
    },
    /// Continue from the last committed checkpoint.
    Resumed(Box<Resumed<M, O>>),
}

/// The checkpoint directory of one task, with rotation and an optional write hook.
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::nn::LinearConfig;
/// use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
/// use burn::tensor::Tensor;
/// use trainer_fsdp::{CheckpointStore, Resume, TrainerRng, TrainerState};
///
/// type B = Autodiff<Flex>;
/// let dev = Default::default();
/// let mut model = LinearConfig::new(3, 2).init::<B>(&dev);
/// let mut optim = AdamWConfig::new().init::<B, burn::nn::Linear<B>>();
/// let x = Tensor::<B, 2>::ones([4, 3], &dev);
/// let loss = model.forward(x).powi_scalar(2).mean();
/// let grads = GradientsParams::from_grads::<B, _>(loss.backward(), &model);
/// model = optim.step(1e-2, model, grads);
///
/// let dir = tempfile::tempdir().unwrap();
/// let store = CheckpointStore::new(dir.path(), "t2i", Some(2)).unwrap();
/// let mut state = TrainerState::new("t2i", 0); // rollout 0 is done
/// state.lr_scheduler_steps = 1;
/// store.save(&model, &optim, &state, &TrainerRng::seeded(1), None).unwrap();
/// assert_eq!(store.latest_committed().unwrap().unwrap().iteration, 0);
///
/// // a new process: fresh model and optimizer, then the checkpoint's exact state
/// let fresh = LinearConfig::new(3, 2).init::<B>(&dev);
/// let Resume::Resumed(r) = store.resume(fresh, AdamWConfig::new().init(), None, &dev).unwrap() else {
///     panic!("there is a committed checkpoint");
/// };
/// assert_eq!(r.state.next_rollout_id(), 1);
/// assert_eq!(r.state.lr_scheduler_steps, 1);
/// assert_eq!(r.model.weight.val().into_data(), model.weight.val().into_data());
/// ```
#[derive(Clone)]
pub struct CheckpointStore {
    root: PathBuf,
    task: String,
    max_to_keep: Option<usize>,
    hook: Option<WriteHook>,
}

impl fmt::Debug for CheckpointStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckpointStore")
            .field("root", &self.root)
            .field("task", &self.task)
            .field("max_to_keep", &self.max_to_keep)
            .field("hook", &self.hook.is_some())
            .finish()
    }
}

fn hash(bytes: &[u8]) -> String {
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(bytes))
}

pub(crate) fn parse_iteration(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(ITER_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn record_float<B: Backend>() -> &'static str {
    if <B::FloatElem as Element>::dtype() == DType::F64 {
        "f64"
    } else {
        "f32"
    }
}

impl CheckpointStore {
    /// A store under `root` for `task`, keeping at most `max_to_keep` committed checkpoints
    /// (`None`: all).
    ///
    /// # Errors
    /// [`TrainerError::Checkpoint`] when the task cannot be a directory name or
    /// `max_to_keep == Some(0)`.
    pub fn new(
        root: impl Into<PathBuf>,
        task: &str,
        max_to_keep: Option<usize>,
    ) -> Result<Self, TrainerError> {
        let root = root.into();
        let ok = !task.is_empty()
            && task != "."
            && task != ".."
            && task
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !ok || max_to_keep == Some(0) {
            return Err(TrainerError::Checkpoint {
                dir: root,
                problem: CheckpointProblem::InvalidTask {
                    task: if ok {
                        format!("{task} (with max_to_keep = 0)")
                    } else {
                        task.into()
                    },
                },
            });
        }
        Ok(Self {
            root,
            task: task.into(),
            max_to_keep,
            hook: None,
        })
    }

    /// Calls `hook(iteration, phase)` after each durable step of every write.
    pub fn with_write_hook(mut self, hook: WriteHook) -> Self {
        self.hook = Some(hook);
        self
    }

    /// `<root>/<task>`.
    pub fn task_dir(&self) -> PathBuf {
        self.root.join(&self.task)
    }

    /// `<root>/<task>/iter_<iteration, 7 digits>`.
    pub fn iteration_dir(&self, iteration: u64) -> PathBuf {
        self.task_dir().join(format!("{ITER_PREFIX}{iteration:07}"))
    }

    fn phase(&self, iteration: u64, phase: WritePhase) {
        if let Some(h) = &self.hook {
            h(iteration, phase);
        }
    }

    /// Every iteration directory on disk, committed or not, ascending.
    fn iteration_dirs(&self) -> Result<Vec<(u64, PathBuf, bool)>, TrainerError> {
        let dir = self.task_dir();
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err(&dir, "list checkpoints in")(e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io_err(&dir, "list checkpoints in"))?;
            let Some(iteration) = entry.file_name().to_str().and_then(parse_iteration) else {
                continue;
            };
            let path = entry.path();
            if path.is_dir() {
                let committed = path.join(COMMITTED_FILE).is_file();
                out.push((iteration, path, committed));
            }
        }
        out.sort_by_key(|(i, _, _)| *i);
        Ok(out)
    }

    /// Every committed checkpoint, ascending by iteration.
    ///
    /// # Errors
    /// [`TrainerError::Io`] when the directory cannot be listed.
    pub fn committed(&self) -> Result<Vec<CommittedCheckpoint>, TrainerError> {
        Ok(self
            .iteration_dirs()?
            .into_iter()
            .filter(|(_, _, c)| *c)
            .map(|(iteration, dir, _)| CommittedCheckpoint { iteration, dir })
            .collect())
    }

    /// The newest checkpoint with a `COMMITTED` marker. Directories without one (a write that
    /// crashed) are skipped, whatever the latest-iteration marker says.
    ///
    /// # Errors
    /// [`TrainerError::Io`] when the directory cannot be listed.
    pub fn latest_committed(&self) -> Result<Option<CommittedCheckpoint>, TrainerError> {
        Ok(self.committed()?.pop())
    }

    /// The iteration the task's latest-iteration marker names (informational: it may lag one
    /// checkpoint behind after a crash between `COMMITTED` and the marker).
    ///
    /// # Errors
    /// [`TrainerError::Io`] for an unreadable marker.
    pub fn latest_marker(&self) -> Result<Option<u64>, TrainerError> {
        let path = self.task_dir().join(LATEST_FILE);
        match fs::read_to_string(&path) {
            Ok(text) => Ok(text.trim().parse().ok()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&path, "read")(e)),
        }
    }

    fn write_file(
        &self,
        dir: &Path,
        name: &str,
        bytes: &[u8],
        files: &mut Vec<CommittedFile>,
    ) -> Result<(), TrainerError> {
        durable::write_atomic(&dir.join(name), bytes)?;
        files.push(CommittedFile {
            name: name.into(),
            bytes: bytes.len() as u64,
            xxh3_128: hash(bytes),
        });
        Ok(())
    }

    /// Removes a checkpoint directory: its `COMMITTED` marker first (durably), then the rest.
    fn remove_checkpoint(&self, dir: &Path) -> Result<(), TrainerError> {
        let marker = dir.join(COMMITTED_FILE);
        if marker.exists() {
            durable::remove_file(&marker)?;
            durable::sync_dir(dir)?;
        }
        durable::remove_dir_all(dir)?;
        Ok(())
    }

    /// Writes checkpoint `iteration` (the rollout id just completed) in the fixed order
    /// weights → optimizer → RNG → adapter contract → trainer state → `COMMITTED` → markers,
    /// then rotates. An existing directory for the same iteration (a crashed write, or an
    /// earlier save of it) is removed first.
    ///
    /// `contract` is the run's adapter contract under LoRA, `None` for full fine-tuning.
    ///
    /// # Errors
    /// [`TrainerError::NoTrainableParameters`]; [`TrainerError::Checkpoint`] with
    /// [`CheckpointProblem::NewerCheckpointExists`] when a newer committed checkpoint exists or
    /// with [`CheckpointProblem::StateMismatch`] when `state` is for another rollout or task;
    /// IO and record errors. A failed write leaves no `COMMITTED` marker.
    pub fn save<B, M, O>(
        &self,
        model: &M,
        optimizer: &O,
        state: &TrainerState,
        rng: &TrainerRng,
        contract: Option<&AdapterContract>,
    ) -> Result<SavedCheckpoint, TrainerError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        self.save_with(model, optimizer, state, rng, contract, &[])
    }

    /// [`CheckpointStore::save`] with `readable` files beside the store's own (the world's
    /// copy of the trainable weights in its model family's format, e.g. a PEFT adapter's
    /// `adapter_model.safetensors` and `adapter_config.json`), written after the weights and
    /// listed in `COMMITTED` with their hashes like every other file. They are for readers
    /// outside flowrl: resume restores the exact bits and parameter ids from `model.mpk`, and
    /// the run then checks the readable copy against what the restored weights give.
    ///
    /// # Errors
    /// As [`CheckpointStore::save`]; [`TrainerError::Checkpoint`] with
    /// [`CheckpointProblem::ReservedName`] for a readable file named like one of the store's.
    pub fn save_with<B, M, O>(
        &self,
        model: &M,
        optimizer: &O,
        state: &TrainerState,
        rng: &TrainerRng,
        contract: Option<&AdapterContract>,
        readable: &[(&str, Vec<u8>)],
    ) -> Result<SavedCheckpoint, TrainerError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        self.save_all(model, &[], optimizer, state, rng, contract, readable)
    }

    /// [`CheckpointStore::save_with`], and the trainable weights of each of `copies` (the EMA
    /// copy in [`EMA_FILE`], the sampling copy in [`SAMPLER_FILE`]) in the model's format,
    /// written right after the model's, for [`CheckpointStore::load_copy`].
    ///
    /// # Errors
    /// As [`CheckpointStore::save_with`].
    #[allow(clippy::too_many_arguments)]
    pub fn save_all<B, M, O>(
        &self,
        model: &M,
        copies: &[(&'static str, &M)],
        optimizer: &O,
        state: &TrainerState,
        rng: &TrainerRng,
        contract: Option<&AdapterContract>,
        readable: &[(&str, Vec<u8>)],
    ) -> Result<SavedCheckpoint, TrainerError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let iteration = state.rollout_id;
        let dir = self.iteration_dir(iteration);
        if state.task != self.task {
            return Err(TrainerError::Checkpoint {
                dir,
                problem: CheckpointProblem::StateMismatch {
                    field: "task",
                    recorded: state.task.clone(),
                    expected: self.task.clone(),
                },
            });
        }
        if let Some(newer) = self.latest_committed()?
            && newer.iteration > iteration
        {
            return Err(TrainerError::Checkpoint {
                dir: self.task_dir(),
                problem: CheckpointProblem::NewerCheckpointExists {
                    writing: iteration,
                    newer: newer.iteration,
                },
            });
        }
        let reserved = [
            WEIGHTS_FILE,
            EMA_FILE,
            EMA_AVERAGE_FILE,
            SAMPLER_FILE,
            OPTIMIZER_FILE,
            RNG_FILE,
            CONTRACT_FILE,
            TRAINER_STATE_FILE,
            COMMITTED_FILE,
            LATEST_FILE,
        ];
        if let Some((name, _)) = readable
            .iter()
            .find(|(n, _)| reserved.contains(n) || n.contains('/') || n.is_empty())
        {
            return Err(TrainerError::Checkpoint {
                dir,
                problem: CheckpointProblem::ReservedName {
                    name: (*name).to_string(),
                },
            });
        }
        // encode before touching the disk: a failure here leaves every checkpoint as it was
        let weights = encode_weights::<B, M>(model, &dir)?;
        let copy_weights = copies
            .iter()
            .map(|(name, m)| Ok((*name, encode_weights::<B, M>(*m, &dir)?)))
            .collect::<Result<Vec<_>, TrainerError>>()?;
        let float = record_float::<B>();
        let optim = encode_optimizer::<B, M, O>(optimizer, float, &dir)?;
        let json = |value: &dyn erased::Json, what: &'static str| {
            value.to_json().map_err(|source| TrainerError::Json {
                path: dir.clone(),
                what,
                source,
            })
        };
        let rng_json = json(rng, "the trainer RNG")?;
        let state_json = json(state, "the trainer state")?;
        let contract_json = match contract {
            Some(c) => Some(json(c, "the adapter contract")?),
            None => None,
        };

        if dir.exists() {
            self.remove_checkpoint(&dir)?;
        }
        fs::create_dir_all(&dir).map_err(io_err(&dir, "create checkpoint directory"))?;
        durable::sync_dir(&self.task_dir())?;
        self.phase(iteration, WritePhase::Started);

        let mut files = Vec::new();
        self.write_file(&dir, WEIGHTS_FILE, &weights, &mut files)?;
        for (name, bytes) in &copy_weights {
            self.write_file(&dir, name, bytes, &mut files)?;
        }
        for (name, bytes) in readable {
            self.write_file(&dir, name, bytes, &mut files)?;
        }
        self.phase(iteration, WritePhase::Weights);
        self.write_file(&dir, OPTIMIZER_FILE, &optim, &mut files)?;
        self.phase(iteration, WritePhase::Optimizer);
        self.write_file(&dir, RNG_FILE, rng_json.as_bytes(), &mut files)?;
        self.phase(iteration, WritePhase::Rng);
        if let Some(c) = &contract_json {
            self.write_file(&dir, CONTRACT_FILE, c.as_bytes(), &mut files)?;
            self.phase(iteration, WritePhase::AdapterContract);
        }
        self.write_file(&dir, TRAINER_STATE_FILE, state_json.as_bytes(), &mut files)?;
        self.phase(iteration, WritePhase::TrainerState);

        let manifest = CommitManifest {
            format: COMMIT_FORMAT.into(),
            iteration,
            record_float: float.into(),
            files: files.clone(),
        };
        let manifest =
            serde_json::to_string_pretty(&manifest).map_err(|source| TrainerError::Json {
                path: dir.join(COMMITTED_FILE),
                what: "the commit manifest",
                source,
            })?;
        durable::write_atomic(&dir.join(COMMITTED_FILE), manifest.as_bytes())?;
        self.phase(iteration, WritePhase::Committed);

        let marker = format!("{iteration}\n");
        durable::write_atomic(&self.task_dir().join(LATEST_FILE), marker.as_bytes())?;
        durable::write_atomic(&self.root.join(LATEST_FILE), marker.as_bytes())?;
        self.phase(iteration, WritePhase::LatestMarker);

        let (rotated, removed_partial) = self.rotate()?;
        Ok(SavedCheckpoint {
            checkpoint: CommittedCheckpoint { iteration, dir },
            files,
            rotated,
            removed_partial,
        })
    }

    /// Removes every uncommitted iteration directory and all but the newest `max_to_keep`
    /// committed ones; returns (rotated committed iterations, removed partial iterations).
    fn rotate(&self) -> Result<(Vec<u64>, Vec<u64>), TrainerError> {
        let dirs = self.iteration_dirs()?;
        let mut partial = Vec::new();
        for (iteration, dir, committed) in &dirs {
            if !committed {
                self.remove_checkpoint(dir)?;
                partial.push(*iteration);
            }
        }
        let committed: Vec<&(u64, PathBuf, bool)> = dirs.iter().filter(|d| d.2).collect();
        let mut rotated = Vec::new();
        if let Some(keep) = self.max_to_keep
            && committed.len() > keep
        {
            for (iteration, dir, _) in &committed[..committed.len() - keep] {
                self.remove_checkpoint(dir)?;
                rotated.push(*iteration);
            }
        }
        if !partial.is_empty() || !rotated.is_empty() {
            durable::sync_dir(&self.task_dir())?;
        }
        Ok((rotated, partial))
    }

    fn read_verified(
        &self,
        ckpt: &CommittedCheckpoint,
    ) -> Result<(CommitManifest, HashMap<String, Vec<u8>>), TrainerError> {
        let bad = |problem| TrainerError::Checkpoint {
            dir: ckpt.dir.clone(),
            problem,
        };
        let marker = ckpt.dir.join(COMMITTED_FILE);
        let text = match fs::read_to_string(&marker) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(bad(CheckpointProblem::NotCommitted));
            }
            Err(e) => return Err(io_err(&marker, "read")(e)),
        };
        let manifest: CommitManifest =
            serde_json::from_str(&text).map_err(|source| TrainerError::Json {
                path: marker.clone(),
                what: "a commit manifest",
                source,
            })?;
        if manifest.format != COMMIT_FORMAT {
            return Err(bad(CheckpointProblem::Format {
                name: COMMITTED_FILE.into(),
                found: manifest.format,
                expected: COMMIT_FORMAT,
            }));
        }
        if manifest.iteration != ckpt.iteration {
            return Err(bad(CheckpointProblem::StateMismatch {
                field: "iteration",
                recorded: manifest.iteration.to_string(),
                expected: ckpt.iteration.to_string(),
            }));
        }
        let mut contents = HashMap::new();
        for f in &manifest.files {
            let path = ckpt.dir.join(&f.name);
            let bytes = match fs::read(&path) {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(bad(CheckpointProblem::MissingFile {
                        name: f.name.clone(),
                    }));
                }
                Err(e) => return Err(io_err(&path, "read")(e)),
            };
            if bytes.len() as u64 != f.bytes {
                return Err(bad(CheckpointProblem::SizeMismatch {
                    name: f.name.clone(),
                    recorded: f.bytes,
                    found: bytes.len() as u64,
                }));
            }
            let h = hash(&bytes);
            if h != f.xxh3_128 {
                return Err(bad(CheckpointProblem::HashMismatch {
                    name: f.name.clone(),
                    recorded: f.xxh3_128.clone(),
                    found: h,
                }));
            }
            contents.insert(f.name.clone(), bytes);
        }
        for required in [WEIGHTS_FILE, OPTIMIZER_FILE, RNG_FILE, TRAINER_STATE_FILE] {
            if !contents.contains_key(required) {
                return Err(bad(CheckpointProblem::MissingFile {
                    name: required.into(),
                }));
            }
        }
        Ok((manifest, contents))
    }

    /// Reads and checks a committed checkpoint's trainer state, RNG and adapter contract
    /// without touching a model (every file's length and hash is verified).
    ///
    /// # Errors
    /// [`TrainerError::Checkpoint`] for a checkpoint that cannot be trusted; JSON errors.
    pub fn read_state(
        &self,
        ckpt: &CommittedCheckpoint,
    ) -> Result<(TrainerState, TrainerRng, Option<AdapterContract>), TrainerError> {
        let (_, contents) = self.read_verified(ckpt)?;
        self.parse_state(ckpt, &contents)
    }

    fn parse_state(
        &self,
        ckpt: &CommittedCheckpoint,
        contents: &HashMap<String, Vec<u8>>,
    ) -> Result<(TrainerState, TrainerRng, Option<AdapterContract>), TrainerError> {
        let parse_err = |name: &str, what| {
            let path = ckpt.dir.join(name);
            move |source| TrainerError::Json { path, what, source }
        };
        let state: TrainerState = serde_json::from_slice(&contents[TRAINER_STATE_FILE])
            .map_err(parse_err(TRAINER_STATE_FILE, "a trainer state"))?;
        let bad = |problem| TrainerError::Checkpoint {
            dir: ckpt.dir.clone(),
            problem,
        };
        if state.format != STATE_FORMAT {
            return Err(bad(CheckpointProblem::Format {
                name: TRAINER_STATE_FILE.into(),
                found: state.format,
                expected: STATE_FORMAT,
            }));
        }
        if state.rollout_id != ckpt.iteration {
            return Err(bad(CheckpointProblem::StateMismatch {
                field: "iteration",
                recorded: state.rollout_id.to_string(),
                expected: ckpt.iteration.to_string(),
            }));
        }
        if state.task != self.task {
            return Err(bad(CheckpointProblem::StateMismatch {
                field: "task",
                recorded: state.task,
                expected: self.task.clone(),
            }));
        }
        let rng: TrainerRng = serde_json::from_slice(&contents[RNG_FILE])
            .map_err(parse_err(RNG_FILE, "the trainer RNG"))?;
        let contract = match contents.get(CONTRACT_FILE) {
            Some(bytes) => Some(
                serde_json::from_slice(bytes)
                    .map_err(parse_err(CONTRACT_FILE, "an adapter contract"))?,
            ),
            None => None,
        };
        Ok((state, rng, contract))
    }

    /// Loads a committed checkpoint into `model` and `optimizer`, after verifying every file
    /// and the adapter contract against `expected_contract` (the run's contract under LoRA,
    /// `None` for full fine-tuning): any mismatch is refused.
    ///
    /// # Errors
    /// [`TrainerError::Checkpoint`] (not committed, damaged, wrong iteration or task, LoRA vs
    /// full), [`TrainerError::ContractMismatch`], [`TrainerError::WeightsMismatch`], record
    /// and JSON errors.
    pub fn load<B, M, O>(
        &self,
        ckpt: &CommittedCheckpoint,
        model: M,
        optimizer: O,
        expected_contract: Option<&AdapterContract>,
        device: &B::Device,
    ) -> Result<Resumed<M, O>, TrainerError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let (manifest, contents) = self.read_verified(ckpt)?;
        let (state, rng, contract) = self.parse_state(ckpt, &contents)?;
        check_contract(ckpt, contract.as_ref(), expected_contract)?;
        let weights_path = ckpt.dir.join(WEIGHTS_FILE);
        let model = decode_weights::<B, M>(
            model,
            &contents[WEIGHTS_FILE],
            &weights_path,
            SavedDtype::Exact,
        )?;
        let optimizer = decode_optimizer::<B, M, O>(
            optimizer,
            contents[OPTIMIZER_FILE].clone(),
            &manifest.record_float,
            &ckpt.dir.join(OPTIMIZER_FILE),
            device,
        )?;
        Ok(Resumed {
            checkpoint: ckpt.clone(),
            model,
            optimizer,
            state,
            rng,
            contract,
        })
    }

    /// The trainable weights of a committed checkpoint loaded into `model`, with its trainer
    /// state, and nothing else: the optimizer record is verified (every file's hash is) but
    /// not decoded, and nothing is written — what an export reads. Weights saved in a
    /// narrower float dtype than `model`'s are widened exactly ([`SavedDtype::Widen`]: an
    /// export rebuilds the policy in `f32` whatever dtype the run trained it in).
    ///
    /// # Errors
    /// As [`CheckpointStore::load`].
    pub fn load_weights<B: Backend, M: Module<B>>(
        &self,
        ckpt: &CommittedCheckpoint,
        model: M,
        expected_contract: Option<&AdapterContract>,
    ) -> Result<(M, TrainerState), TrainerError> {
        let (_, contents) = self.read_verified(ckpt)?;
        let (state, _, contract) = self.parse_state(ckpt, &contents)?;
        check_contract(ckpt, contract.as_ref(), expected_contract)?;
        let model = decode_weights::<B, M>(
            model,
            &contents[WEIGHTS_FILE],
            &ckpt.dir.join(WEIGHTS_FILE),
            SavedDtype::Widen,
        )?;
        Ok((model, state))
    }

    /// The trainable weights of a copy of the policy that a committed checkpoint holds in
    /// `name` ([`EMA_FILE`], [`SAMPLER_FILE`]) loaded into `model` (a clone of the policy),
    /// every file's hash verified.
    ///
    /// # Errors
    /// [`TrainerError::Checkpoint`] with [`CheckpointProblem::MissingFile`] when the checkpoint
    /// has no such copy (it was written by a run without it); as
    /// [`CheckpointStore::load_weights`].
    pub fn load_copy<B: Backend, M: Module<B>>(
        &self,
        ckpt: &CommittedCheckpoint,
        name: &str,
        model: M,
        dtypes: SavedDtype,
    ) -> Result<M, TrainerError> {
        let (_, contents) = self.read_verified(ckpt)?;
        let bytes = contents.get(name).ok_or_else(|| TrainerError::Checkpoint {
            dir: ckpt.dir.clone(),
            problem: CheckpointProblem::MissingFile { name: name.into() },
        })?;
        decode_weights::<B, M>(model, bytes, &ckpt.dir.join(name), dtypes)
    }

    /// The bytes of the file `name` a committed checkpoint holds (e.g. one written beside the
    /// store's own through `readable`), every file's hash verified; `None` when it holds no
    /// such file.
    ///
    /// # Errors
    /// As [`CheckpointStore::load_weights`] for an uncommitted or damaged checkpoint.
    pub fn read_file(
        &self,
        ckpt: &CommittedCheckpoint,
        name: &str,
    ) -> Result<Option<Vec<u8>>, TrainerError> {
        let (_, mut contents) = self.read_verified(ckpt)?;
        Ok(contents.remove(name))
    }

    /// [`CheckpointStore::load`] of the latest committed checkpoint, or
    /// [`Resume::Fresh`] when there is none.
    ///
    /// # Errors
    /// As [`CheckpointStore::load`].
    pub fn resume<B, M, O>(
        &self,
        model: M,
        optimizer: O,
        expected_contract: Option<&AdapterContract>,
        device: &B::Device,
    ) -> Result<Resume<M, O>, TrainerError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        match self.latest_committed()? {
            None => Ok(Resume::Fresh { model, optimizer }),
            Some(ckpt) => Ok(Resume::Resumed(Box::new(self.load(
                &ckpt,
                model,
                optimizer,
                expected_contract,
                device,
            )?))),
        }
    }
}

/// The checkpoint's recorded adapter contract against the run's: equal, or both absent (full
/// fine-tuning).
fn check_contract(
    ckpt: &CommittedCheckpoint,
    recorded: Option<&AdapterContract>,
    expected: Option<&AdapterContract>,
) -> Result<(), TrainerError> {
    match (recorded, expected) {
        (Some(recorded), Some(expected)) => {
            let mismatches = recorded.mismatches(expected);
            if mismatches.is_empty() {
                Ok(())
            } else {
                Err(TrainerError::ContractMismatch {
                    dir: ckpt.dir.clone(),
                    mismatches,
                })
            }
        }
        (None, None) => Ok(()),
        (recorded, expected) => Err(TrainerError::Checkpoint {
            dir: ckpt.dir.clone(),
            problem: CheckpointProblem::TrainableModeMismatch {
                checkpoint_has_adapter: recorded.is_some(),
                run_has_adapter: expected.is_some(),
            },
        }),
    }
}

/// JSON encoding behind one object-safe call (the save path encodes several types).
mod erased {
    pub trait Json {
        fn to_json(&self) -> Result<String, serde_json::Error>;
    }
    impl<T: serde::Serialize> Json for T {
        fn to_json(&self) -> Result<String, serde_json::Error> {
            serde_json::to_string_pretty(self)
        }
    }
}

/// One saved trainable parameter.
#[derive(Debug, Serialize, Deserialize)]
struct SavedParam {
    path: String,
    id: u64,
    data: TensorData,
}

#[derive(Debug, Serialize, Deserialize)]
struct WeightsRecord {
    format: String,
    params: Vec<SavedParam>,
}

fn path_of(stack: &[String]) -> String {
    stack
        .iter()
        .filter(|s| !s.is_empty())
        .cloned()
        .collect::<Vec<_>>()
        .join(".")
}

/// One trainable float parameter of a module.
struct TrainableParam {
    path: String,
    id: ParamId,
    shape: Vec<usize>,
    dtype: DType,
    /// Its value, when collected for saving.
    data: Option<TensorData>,
}

/// Collects every trainable float parameter, in module order.
struct CollectTrainable {
    stack: Vec<String>,
    with_data: bool,
    out: Vec<TrainableParam>,
}

impl<B: Backend> ModuleVisitor<B> for CollectTrainable {
    fn enter_module(&mut self, name: &str, _container: &str) {
        self.stack.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container: &str) {
        self.stack.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if param.is_require_grad() {
            let value = param.val();
            self.out.push(TrainableParam {
                path: path_of(&self.stack),
                id: param.id,
                shape: value.dims().to_vec(),
                dtype: value.dtype(),
                data: self.with_data.then(|| value.into_data()),
            });
        }
    }
}

fn trainable<B: Backend, M: Module<B>>(model: &M, with_data: bool) -> Vec<TrainableParam> {
    let mut v = CollectTrainable {
        stack: Vec::new(),
        with_data,
        out: Vec::new(),
    };
    model.visit(&mut v);
    v.out
}

fn recorder() -> NamedMpkBytesRecorder<FullPrecisionSettings> {
    NamedMpkBytesRecorder::default()
}

fn encode_weights<B: Backend, M: Module<B>>(
    model: &M,
    dir: &Path,
) -> Result<Vec<u8>, TrainerError> {
    let params: Vec<SavedParam> = trainable::<B, M>(model, true)
        .into_iter()
        .map(|t| SavedParam {
            path: t.path,
            id: t.id.val(),
            data: t.data.expect("collected with data"),
        })
        .collect();
    if params.is_empty() {
        return Err(TrainerError::NoTrainableParameters);
    }
    let record = WeightsRecord {
        format: WEIGHTS_FORMAT.into(),
        params,
    };
    Recorder::<B>::save_item(&recorder(), record, ()).map_err(|source| TrainerError::Record {
        path: dir.join(WEIGHTS_FILE),
        op: "encode",
        what: "weights",
        source,
    })
}

/// Replaces trainable parameters by their saved values and ids.
struct Apply {
    stack: Vec<String>,
    saved: HashMap<String, SavedParam>,
}

impl<B: Backend> ModuleMapper<B> for Apply {
    fn enter_module(&mut self, name: &str, _container: &str) {
        self.stack.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container: &str) {
        self.stack.pop();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if !param.is_require_grad() {
            return param;
        }
        match self.saved.remove(&path_of(&self.stack)) {
            Some(saved) => {
                let current = param.val();
                let tensor =
                    Tensor::<B, D>::from_data(saved.data, (&current.device(), current.dtype()));
                param.transform_for_load(tensor, ParamId::from(saved.id))
            }
            None => param,
        }
    }
}

/// How a saved weight's dtype must relate to the parameter it is loaded into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SavedDtype {
    /// The same dtype (a resume continues the run bit for bit).
    Exact,
    /// The same, or a narrower float dtype that converts exactly (bf16 or f16 into f32 or
    /// f64, f32 into f64): what an export does, which rebuilds the policy in `f32`.
    Widen,
}

impl SavedDtype {
    fn accepts(self, saved: DType, param: DType) -> bool {
        saved == param
            || (self == SavedDtype::Widen
                && matches!(
                    (saved, param),
                    (DType::BF16 | DType::F16, DType::F32 | DType::F64) | (DType::F32, DType::F64)
                ))
    }
}

fn decode_weights<B: Backend, M: Module<B>>(
    model: M,
    bytes: &[u8],
    path: &Path,
    dtypes: SavedDtype,
) -> Result<M, TrainerError> {
    let mut args = bytes.to_vec();
    let record: WeightsRecord =
        Recorder::<B>::load_item(&recorder(), &mut args).map_err(|source| {
            TrainerError::Record {
                path: path.to_path_buf(),
                op: "decode",
                what: "weights",
                source,
            }
        })?;
    if record.format != WEIGHTS_FORMAT {
        return Err(TrainerError::Checkpoint {
            dir: path.to_path_buf(),
            problem: CheckpointProblem::Format {
                name: WEIGHTS_FILE.into(),
                found: record.format,
                expected: WEIGHTS_FORMAT,
            },
        });
    }
    let model_params = trainable::<B, M>(&model, false);
    let mut saved: HashMap<String, SavedParam> = HashMap::new();
    for p in record.params {
        saved.insert(p.path.clone(), p);
    }
    let mut missing = Vec::new();
    let mut mismatched = Vec::new();
    for t in &model_params {
        match saved.get(&t.path) {
            None => missing.push(t.path.clone()),
            Some(s) => {
                if s.data.shape.as_slice() != t.shape.as_slice()
                    || !dtypes.accepts(s.data.dtype, t.dtype)
                {
                    mismatched.push((
                        t.path.clone(),
                        format!("{:?} {:?}", s.data.shape.as_slice(), s.data.dtype),
                        format!("{:?} {:?}", t.shape, t.dtype),
                    ));
                }
            }
        }
    }
    let mut unexpected: Vec<String> = saved
        .keys()
        .filter(|k| !model_params.iter().any(|t| &t.path == *k))
        .cloned()
        .collect();
    unexpected.sort();
    if !missing.is_empty() || !unexpected.is_empty() || !mismatched.is_empty() {
        return Err(TrainerError::WeightsMismatch {
            path: path.to_path_buf(),
            missing,
            unexpected,
            mismatched,
        });
    }
    let mut apply = Apply {
        stack: Vec::new(),
        saved,
    };
    let model = model.map(&mut apply);
    debug_assert!(apply.saved.is_empty(), "every saved parameter was applied");
    Ok(model)
}

fn encode_optimizer<B, M, O>(
    optimizer: &O,
    float: &str,
    dir: &Path,
) -> Result<Vec<u8>, TrainerError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    fn with<S: PrecisionSettings, B: AutodiffBackend, M: AutodiffModule<B>, O: Optimizer<M, B>>(
        optimizer: &O,
    ) -> Result<Vec<u8>, burn::record::RecorderError> {
        NamedMpkBytesRecorder::<S>::default().record(optimizer.to_record(), ())
    }
    let out = if float == "f64" {
        with::<DoublePrecisionSettings, B, M, O>(optimizer)
    } else {
        with::<FullPrecisionSettings, B, M, O>(optimizer)
    };
    out.map_err(|source| TrainerError::Record {
        path: dir.join(OPTIMIZER_FILE),
        op: "encode",
        what: "optimizer",
        source,
    })
}

fn decode_optimizer<B, M, O>(
    optimizer: O,
    bytes: Vec<u8>,
    float: &str,
    path: &Path,
    device: &B::Device,
) -> Result<O, TrainerError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    let record = if float == "f64" {
        NamedMpkBytesRecorder::<DoublePrecisionSettings>::default().load(bytes, device)
    } else {
        NamedMpkBytesRecorder::<FullPrecisionSettings>::default().load(bytes, device)
    }
    .map_err(|source| TrainerError::Record {
        path: path.to_path_buf(),
        op: "decode",
        what: "optimizer",
        source,
    })?;
    Ok(optimizer.load_record(record))
}

#[cfg(test)]
mod tests {
    use super::SavedDtype;
    use burn::tensor::DType;

    #[test]
    fn only_an_exact_widening_is_accepted_and_only_where_asked() {
        use DType::{BF16, F16, F32, F64};
        for d in [BF16, F16, F32, F64] {
            assert!(SavedDtype::Exact.accepts(d, d) && SavedDtype::Widen.accepts(d, d));
        }
        for (saved, param) in [(BF16, F32), (F16, F32), (BF16, F64), (F32, F64)] {
            assert!(
                SavedDtype::Widen.accepts(saved, param),
                "{saved:?} -> {param:?}"
            );
            assert!(
                !SavedDtype::Exact.accepts(saved, param),
                "{saved:?} -> {param:?}"
            );
        }
        // narrowing rounds, and bf16 <-> f16 is no widening either way
        for (saved, param) in [(F32, BF16), (F64, F32), (F16, BF16), (BF16, F16)] {
            assert!(
                !SavedDtype::Widen.accepts(saved, param),
                "{saved:?} -> {param:?}"
            );
        }
    }
}
