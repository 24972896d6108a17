//! The run directory's guards, applied by [`Run::new`](crate::Run::new) before it writes a
//! byte:
//!
//! * **One run at a time.** An exclusive OS lock on `<run dir>/run.lock`, held for the run's
//!   life, with the holder's pid, host and start time in the file (and one on the checkpoint
//!   and artifact roots when they lie outside the run directory). A second process on the
//!   same directory is refused naming the holder. The kernel drops the lock of a process that
//!   dies, so a killed run never blocks the next; its leftover holder line is reported as
//!   stale when the next run takes the lock over.
//! * **A fresh run never writes over a run.** A directory that holds any run file (metrics,
//!   event file, resolved config, sample grids, checkpoints, rollout artifacts) is refused as
//!   it is, unless `checkpoint.overwrite` moves the old run aside first
//!   (into `<run dir>/previous-<Unix time>/`; nothing is deleted).
//! * **A resume continues the same experiment.** It needs a committed checkpoint (or
//!   `checkpoint.allow_fresh`), and the stored resolved config must agree with the new one on
//!   every key that changes results; only progress and bookkeeping keys
//!   ([`FREE_TO_CHANGE`]) may differ, unless `checkpoint.allow_config_changes` allows the rest,
//!   in which case the differences are appended to `<run dir>/config_changes.log`.
//! * **`checkpoint.resume_from`** resumes from an older committed checkpoint; the newer ones
//!   are moved aside (into `<checkpoint task dir>/set_aside-<Unix time>/`) once it has loaded.

use std::fmt;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use trajectory::{ArtifactLayout, Split};

use crate::checkpoint::{CheckpointStore, CommittedCheckpoint};
use crate::config::{RESOLVED_CONFIG_FILE, TrainConfig};
use crate::error::{TrainerError, io_err};
use crate::monitor::{EVENTS_FILE, JSONL_FILE};

/// The lock file in the run directory.
pub const LOCK_FILE: &str = "run.lock";
/// Where allowed config changes of resumed runs are recorded.
pub const CONFIG_CHANGES_FILE: &str = "config_changes.log";
/// The run's reward curve.
pub const REWARD_CURVE_FILE: &str = "reward_curve.png";
/// The directory of the held-out sample grids.
pub const SAMPLES_DIR: &str = "samples";
/// In [`SAMPLES_DIR`]: the initial evaluation's pictures above the latest evaluation's,
/// prompt by prompt.
pub const BEFORE_AFTER_FILE: &str = "before_after.png";
/// The prefix of the directory an overwritten run is moved into.
pub const PREVIOUS_PREFIX: &str = "previous-";
/// The prefix of the directory newer checkpoints are moved into by `checkpoint.resume_from`.
pub const SET_ASIDE_PREFIX: &str = "set_aside-";

/// Config keys a resume may change: progress, resources and bookkeeping, none of which change
/// what the run computes. A key ending in `.` covers its whole section.
pub const FREE_TO_CHANGE: &[&str] = &[
    "recipe",
    "run.num_rollouts",
    "run.host_threads",
    "run.cpu_budget_seconds",
    "checkpoint.",
    "artifacts.",
    "eval.interval",
    "eval.judges",
    "eval.sde_gap",
    "monitor.",
];

/// Config keys added after run directories were first written, with the value a resolved
/// config that predates each one ran with. A stored config without the key is compared as if
/// it had that value, so a resume of an older run is not refused for a key it could not have
/// written (and a change away from that value is still a difference). The fourth field limits
/// a key to sections whose `kind` is the one named (FlowGRPO's `anchor` is no key of the other
/// algorithms).
pub const ADDED_KEYS: &[(&str, &str, &str, Option<&str>)] = &[
    ("algorithm", "anchor", "replay", Some("flow_grpo")),
    ("sampling", "schedule_compat", "diffusers_0_35", None),
    ("eval", "sampling", "ode", None),
];

/// Who holds (or held) a run directory's lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockHolder {
    /// The process id.
    pub pid: u32,
    /// The host name.
    pub host: String,
    /// When it took the lock, in seconds since the Unix epoch.
    pub started: u64,
}

impl LockHolder {
    /// This process, now.
    pub fn current() -> Self {
        Self {
            pid: std::process::id(),
            host: host_name(),
            started: unix_now(),
        }
    }

    fn encode(&self) -> String {
        format!(
            "pid={}\nhost={}\nstarted={}\n",
            self.pid, self.host, self.started
        )
    }

    /// Parses a lock file's text; `None` for an empty (released) or unreadable one.
    pub fn parse(text: &str) -> Option<Self> {
        let mut pid = None;
        let mut host = None;
        let mut started = None;
        for line in text.lines() {
            match line.split_once('=') {
                Some(("pid", v)) => pid = v.trim().parse().ok(),
                Some(("host", v)) => host = Some(v.trim().to_string()),
                Some(("started", v)) => started = v.trim().parse().ok(),
                _ => {}
            }
        }
        Some(Self {
            pid: pid?,
            host: host?,
            started: started?,
        })
    }
}

impl fmt::Display for LockHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pid {} on host {} (started at Unix time {})",
            self.pid, self.host, self.started
        )
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into())
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The exclusive lock on a run directory, held until dropped. Dropping it empties the holder
/// line (a clean release); a process that dies keeps its line, which the next holder reports
/// as stale.
///
/// ```
/// use trainer_fsdp::run_dir::RunLock;
/// let dir = tempfile::tempdir().unwrap();
/// let (lock, stale) = RunLock::acquire(dir.path()).unwrap();
/// assert!(stale.is_none());
/// // a second holder is refused, naming the first
/// let err = RunLock::acquire(dir.path()).unwrap_err().to_string();
/// assert!(err.contains(&format!("pid {}", std::process::id())), "{err}");
/// drop(lock);
/// assert!(RunLock::acquire(dir.path()).is_ok());
/// ```
#[derive(Debug)]
pub struct RunLock {
    file: File,
    path: PathBuf,
}

impl RunLock {
    /// Creates `run_dir` if needed and takes its lock, writing this process into the lock
    /// file. Returns the lock and, when the file still named a holder (a run that ended
    /// without releasing it: killed, or its machine went down), that holder.
    ///
    /// # Errors
    /// [`TrainerError::RunDirLocked`] when another process (or another [`RunLock`] of this
    /// one) holds it; [`TrainerError::Io`].
    pub fn acquire(run_dir: &Path) -> Result<(Self, Option<LockHolder>), TrainerError> {
        std::fs::create_dir_all(run_dir).map_err(io_err(run_dir, "create the run directory"))?;
        let path = run_dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io_err(&path, "open the lock file"))?;
        let mut lock = Self::lock(file, path, run_dir)?;
        let stale = lock.read_holder()?;
        lock.write_holder(&LockHolder::current())?;
        Ok((lock, stale))
    }

    /// Takes the lock of an existing lock file without writing to it (released, unwritten,
    /// when the file closes); `None` when there is no lock file.
    fn existing(run_dir: &Path) -> Result<Option<File>, TrainerError> {
        let path = run_dir.join(LOCK_FILE);
        match OpenOptions::new().read(true).open(&path) {
            Ok(file) => Ok(Some(try_lock(file, &path, run_dir)?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&path, "open the lock file")(e)),
        }
    }

    fn lock(file: File, path: PathBuf, run_dir: &Path) -> Result<Self, TrainerError> {
        let file = try_lock(file, &path, run_dir)?;
        Ok(Self { file, path })
    }

    fn read_holder(&mut self) -> Result<Option<LockHolder>, TrainerError> {
        let mut text = String::new();
        self.file
            .seek(SeekFrom::Start(0))
            .and_then(|_| self.file.read_to_string(&mut text))
            .map_err(io_err(&self.path, "read the lock file"))?;
        Ok(LockHolder::parse(&text))
    }

    fn write_holder(&mut self, holder: &LockHolder) -> Result<(), TrainerError> {
        let text = holder.encode();
        self.file
            .set_len(0)
            .and_then(|_| self.file.seek(SeekFrom::Start(0)))
            .and_then(|_| self.file.write_all(text.as_bytes()))
            .and_then(|_| self.file.sync_data())
            .map_err(io_err(&self.path, "write the lock file"))
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        // a clean release: no holder line (the kernel drops the lock itself when the file
        // closes; a failure here only leaves a line the next run reports as stale)
        let _ = self.file.set_len(0);
    }
}

/// `file` with its exclusive lock taken, or the holder named in the error.
fn try_lock(file: File, path: &Path, run_dir: &Path) -> Result<File, TrainerError> {
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(TryLockError::WouldBlock) => {
            let mut text = String::new();
            let holder = (&file)
                .read_to_string(&mut text)
                .ok()
                .and_then(|_| LockHolder::parse(&text));
            Err(TrainerError::RunDirLocked {
                dir: run_dir.to_path_buf(),
                holder: holder.map_or_else(|| "another process".into(), |h| h.to_string()),
            })
        }
        Err(TryLockError::Error(e)) => Err(io_err(path, "lock")(e)),
    }
}

/// One config key whose value differs between the stored and the new config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigDifference {
    /// The dotted key (`optimizer.lr`).
    pub key: String,
    /// Its value in the stored config (`(absent)` when it has none).
    pub stored: String,
    /// Its value in the new one.
    pub new: String,
}

impl fmt::Display for ConfigDifference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} -> {}", self.key, self.stored, self.new)
    }
}

/// Whether a resume may change `key` without being told to (see [`FREE_TO_CHANGE`]).
pub fn free_to_change(key: &str) -> bool {
    FREE_TO_CHANGE.iter().any(|p| {
        if p.ends_with('.') {
            key.starts_with(p)
        } else {
            key == *p
        }
    })
}

/// Every leaf of two TOML documents that differs, by dotted key, ascending.
///
/// ```
/// use trainer_fsdp::run_dir::config_differences;
/// let a: toml::Value = toml::from_str("[run]\nseed = 0\nnum_rollouts = 4").unwrap();
/// let b: toml::Value = toml::from_str("[run]\nseed = 1\nnum_rollouts = 4\ntask = 't'").unwrap();
/// let d = config_differences(&a, &b);
/// assert_eq!(d.len(), 2);
/// assert_eq!(d[0].to_string(), "run.seed: 0 -> 1");
/// assert_eq!(d[1].to_string(), "run.task: (absent) -> \"t\"");
/// ```
pub fn config_differences(stored: &toml::Value, new: &toml::Value) -> Vec<ConfigDifference> {
    let mut a = Vec::new();
    let mut b = Vec::new();
    flatten("", stored, &mut a);
    flatten("", new, &mut b);
    let a: std::collections::BTreeMap<_, _> = a.into_iter().collect();
    let b: std::collections::BTreeMap<_, _> = b.into_iter().collect();
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let show = |v: Option<&&toml::Value>| v.map_or_else(|| "(absent)".into(), |v| v.to_string());
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| ConfigDifference {
            key: k.clone(),
            stored: show(a.get(k)),
            new: show(b.get(k)),
        })
        .collect()
}

fn flatten<'a>(prefix: &str, v: &'a toml::Value, out: &mut Vec<(String, &'a toml::Value)>) {
    match v {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        leaf => out.push((prefix.to_string(), leaf)),
    }
}

/// The run files of a run directory and the configured checkpoint and artifact directories
/// that exist: what a fresh run would destroy.
///
/// # Errors
/// [`TrainerError::Io`] for a directory that cannot be listed.
pub fn existing_run_files(
    run_dir: &Path,
    store: &CheckpointStore,
    layout: &ArtifactLayout,
) -> Result<Vec<PathBuf>, TrainerError> {
    let mut found = Vec::new();
    for name in [
        RESOLVED_CONFIG_FILE,
        JSONL_FILE,
        EVENTS_FILE,
        REWARD_CURVE_FILE,
        CONFIG_CHANGES_FILE,
        SAMPLES_DIR,
    ] {
        let p = run_dir.join(name);
        if p.symlink_metadata().is_ok() {
            found.push(p);
        }
    }
    for dir in [
        store.task_dir(),
        layout.task_dir(Split::Train),
        layout.task_dir(Split::Eval),
    ] {
        if !found.contains(&dir) && non_empty_dir(&dir)? {
            found.push(dir);
        }
    }
    Ok(found)
}

fn non_empty_dir(dir: &Path) -> Result<bool, TrainerError> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_some()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => Ok(true),
        Err(e) => Err(io_err(dir, "list")(e)),
    }
}

/// Where a run continues from, as [`prepare`] decided.
#[derive(Debug)]
pub enum StartFrom {
    /// From scratch.
    Scratch,
    /// From a committed checkpoint.
    Checkpoint {
        /// The checkpoint to load.
        checkpoint: CommittedCheckpoint,
        /// The committed iterations older than it (the fallbacks if it cannot be loaded).
        older: Vec<u64>,
        /// The committed iterations newer than it (set aside once it has loaded).
        newer: Vec<u64>,
    },
}

/// The run directory, locked and checked.
#[derive(Debug)]
pub struct Prepared {
    /// The lock, held for the run's life.
    pub lock: RunLock,
    /// The locks of the checkpoint and artifact roots that lie outside the run directory
    /// (two runs in different directories must not share them either).
    pub shared_locks: Vec<RunLock>,
    /// A holder the lock file still named: a run that ended without releasing it.
    pub stale: Option<LockHolder>,
    /// Where the run starts.
    pub start: StartFrom,
    /// Result-changing config differences a resume was allowed to make (already recorded
    /// in [`CONFIG_CHANGES_FILE`]).
    pub changes: Vec<ConfigDifference>,
    /// Where an overwritten run was moved.
    pub moved_to: Option<PathBuf>,
}

/// Locks the run directory and decides where the run starts, refusing before anything is
/// written (see the module docs): a locked directory, a fresh run into a directory holding a
/// run (without `checkpoint.overwrite`), a resume with nothing committed (without
/// `checkpoint.allow_fresh`) or from an iteration that is not committed, a resume whose
/// config changed a key that changes results (without `checkpoint.allow_config_changes`).
///
/// # Errors
/// [`TrainerError::RunDirLocked`], [`TrainerError::RunDirNotEmpty`],
/// [`TrainerError::NothingToResume`], [`TrainerError::ResumeFromMissing`],
/// [`TrainerError::ConfigChanged`], [`TrainerError::ResumeConfigMissing`],
/// [`TrainerError::Io`].
pub fn prepare(
    run_dir: &Path,
    cfg: &TrainConfig,
    store: &CheckpointStore,
    layout: &ArtifactLayout,
) -> Result<Prepared, TrainerError> {
    let ck = &cfg.checkpoint;
    // an existing lock file is locked without a write; a missing one is created only after
    // every check passed
    // the checkpoint and artifact roots outside the run directory are locked as well
    let shared: Vec<&Path> = [cfg.checkpoint.dir.as_path(), cfg.artifacts.root.as_path()]
        .into_iter()
        .filter(|d| !d.starts_with(run_dir))
        .collect();
    let early = RunLock::existing(run_dir)?;
    let early_shared = shared
        .iter()
        .map(|d| RunLock::existing(d))
        .collect::<Result<Vec<_>, _>>()?;
    let found = existing_run_files(run_dir, store, layout)?;
    let mut changes = Vec::new();
    let start = if !ck.resume {
        if !found.is_empty() && !ck.overwrite {
            return Err(TrainerError::RunDirNotEmpty {
                dir: run_dir.to_path_buf(),
                found,
            });
        }
        StartFrom::Scratch
    } else {
        let committed = store.committed()?;
        let iterations: Vec<u64> = committed.iter().map(|c| c.iteration).collect();
        let target = match ck.resume_from {
            Some(it) => Some(
                committed
                    .into_iter()
                    .find(|c| c.iteration == it)
                    .ok_or_else(|| TrainerError::ResumeFromMissing {
                        dir: store.task_dir(),
                        iteration: it,
                        committed: iterations.clone(),
                    })?,
            ),
            None => committed.into_iter().last(),
        };
        match target {
            None if ck.allow_fresh => StartFrom::Scratch,
            None => {
                return Err(TrainerError::NothingToResume {
                    dir: store.task_dir(),
                    found,
                });
            }
            Some(checkpoint) => {
                let path = run_dir.join(RESOLVED_CONFIG_FILE);
                let differences = stored_differences(&path, cfg)?;
                let refused: Vec<ConfigDifference> = differences
                    .into_iter()
                    .filter(|d| !free_to_change(&d.key))
                    .collect();
                if !refused.is_empty() && !ck.allow_config_changes {
                    return Err(TrainerError::ConfigChanged {
                        path,
                        differences: refused,
                    });
                }
                changes = refused;
                let it = checkpoint.iteration;
                StartFrom::Checkpoint {
                    checkpoint,
                    older: iterations.iter().copied().filter(|i| *i < it).collect(),
                    newer: iterations.iter().copied().filter(|i| *i > it).collect(),
                }
            }
        }
    };
    // every check passed: take the lock (writing our holder line), then look again in case
    // another run started between the look and the lock
    drop(early);
    drop(early_shared);
    let (lock, stale) = RunLock::acquire(run_dir)?;
    let mut shared_locks = Vec::with_capacity(shared.len());
    for d in &shared {
        if shared_locks
            .iter()
            .any(|l: &RunLock| l.path() == d.join(LOCK_FILE))
        {
            continue; // checkpoints and artifacts under one root
        }
        shared_locks.push(RunLock::acquire(d)?.0);
    }
    let mut moved_to = None;
    if !ck.resume {
        let found = existing_run_files(run_dir, store, layout)?;
        if !found.is_empty() {
            if !ck.overwrite {
                return Err(TrainerError::RunDirNotEmpty {
                    dir: run_dir.to_path_buf(),
                    found,
                });
            }
            moved_to = Some(move_aside(run_dir, &found)?);
        }
    }
    if !changes.is_empty() {
        let at = match &start {
            StartFrom::Checkpoint { checkpoint, .. } => checkpoint.iteration,
            StartFrom::Scratch => 0,
        };
        record_changes(run_dir, at, &changes)?;
    }
    Ok(Prepared {
        lock,
        shared_locks,
        stale,
        start,
        changes,
        moved_to,
    })
}

/// The differences between the resolved config stored in the run directory and `cfg`.
fn stored_differences(
    path: &Path,
    cfg: &TrainConfig,
) -> Result<Vec<ConfigDifference>, TrainerError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if cfg.checkpoint.allow_config_changes {
                return Ok(Vec::new());
            }
            return Err(TrainerError::ResumeConfigMissing {
                path: path.to_path_buf(),
            });
        }
        Err(e) => return Err(io_err(path, "read")(e)),
    };
    let mut stored: toml::Value =
        toml::from_str(&text).map_err(|source| TrainerError::ConfigParse {
            origin: path.to_path_buf(),
            source: Box::new(source),
        })?;
    for (section, key, value, kind) in ADDED_KEYS {
        if let Some(toml::Value::Table(t)) = stored.get_mut(*section) {
            let applies =
                kind.is_none_or(|k| t.get("kind").and_then(toml::Value::as_str) == Some(k));
            if applies {
                t.entry(*key)
                    .or_insert_with(|| toml::Value::String((*value).to_string()));
            }
        }
    }
    let new: toml::Value =
        toml::from_str(&cfg.to_toml_string()?).map_err(|source| TrainerError::ConfigParse {
            origin: PathBuf::from("<resolved config>"),
            source: Box::new(source),
        })?;
    Ok(config_differences(&stored, &new))
}

/// Appends the allowed differences of a resume after `iteration` to the run directory's
/// [`CONFIG_CHANGES_FILE`] (rewritten durably).
fn record_changes(
    run_dir: &Path,
    iteration: u64,
    changes: &[ConfigDifference],
) -> Result<(), TrainerError> {
    let path = run_dir.join(CONFIG_CHANGES_FILE);
    let mut text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(io_err(&path, "read")(e)),
    };
    text.push_str(&format!(
        "resumed from checkpoint {iteration} at Unix time {} with allowed changes:\n",
        unix_now()
    ));
    for c in changes {
        text.push_str(&format!("  {c}\n"));
    }
    durable::write_atomic(&path, text.as_bytes())?;
    Ok(())
}

/// A fresh directory name `<parent>/<prefix><Unix time>` (a counter added if it exists).
fn fresh_dir(parent: &Path, prefix: &str) -> PathBuf {
    let t = unix_now();
    let mut dir = parent.join(format!("{prefix}{t}"));
    let mut n = 2;
    while dir.symlink_metadata().is_ok() {
        dir = parent.join(format!("{prefix}{t}-{n}"));
        n += 1;
    }
    dir
}

/// Moves `found` (a run's files) aside: those under `run_dir` into
/// `<run_dir>/previous-<Unix time>/` at the same relative path, others beside themselves as
/// `<name>.previous-<Unix time>`. Returns the directory.
fn move_aside(run_dir: &Path, found: &[PathBuf]) -> Result<PathBuf, TrainerError> {
    let dest = fresh_dir(run_dir, PREVIOUS_PREFIX);
    let stamp = dest
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix(PREVIOUS_PREFIX))
        .unwrap_or_default()
        .to_string();
    for p in found {
        let to = match p.strip_prefix(run_dir) {
            Ok(rel) => dest.join(rel),
            Err(_) => {
                let mut name = p.file_name().unwrap_or_default().to_os_string();
                name.push(format!(".{PREVIOUS_PREFIX}{stamp}"));
                p.with_file_name(name)
            }
        };
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(io_err(parent, "create directory"))?;
        }
        std::fs::rename(p, &to).map_err(io_err(p, "move aside"))?;
        if let Some(parent) = p.parent() {
            durable::sync_dir(parent)?;
        }
        if let Some(parent) = to.parent() {
            durable::sync_dir(parent)?;
        }
    }
    Ok(dest)
}

/// Moves the committed checkpoints `newer` (iterations) of `store` into
/// `<task dir>/set_aside-<Unix time>/`, after a resume from an older one loaded. Returns the
/// directory, `None` when there was nothing to move.
///
/// # Errors
/// [`TrainerError::Io`].
pub fn set_aside_newer(
    store: &CheckpointStore,
    newer: &[u64],
) -> Result<Option<PathBuf>, TrainerError> {
    if newer.is_empty() {
        return Ok(None);
    }
    let task = store.task_dir();
    let dest = fresh_dir(&task, SET_ASIDE_PREFIX);
    std::fs::create_dir_all(&dest).map_err(io_err(&dest, "create directory"))?;
    for it in newer {
        let from = store.iteration_dir(*it);
        let to = dest.join(from.file_name().unwrap_or_default());
        std::fs::rename(&from, &to).map_err(io_err(&from, "move aside"))?;
    }
    durable::sync_dir(&dest)?;
    durable::sync_dir(&task)?;
    Ok(Some(dest))
}
