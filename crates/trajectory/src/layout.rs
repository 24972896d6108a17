//! The artifact directory layout and rollout retention.
//!
//! ```text
//! <root>/<task>/rollout_0000007/group_00000003.safetensors          training rollouts
//! <root>/<task>/rollout_0000007/group_00000003_sample_0001.png
//! <root>/eval/<task>/rollout_0000002/...                             evaluation, same layout
//! ```

use std::fs;
use std::path::{Path, PathBuf};

use crate::TrajectoryError;
use crate::error::io_err;

/// Training rollouts or evaluation passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    /// `<root>/<task>/`.
    Train,
    /// `<root>/eval/<task>/`.
    Eval,
}

/// Where a task's artifacts live under an artifact root.
///
/// ```
/// use std::path::Path;
/// use trajectory::{ArtifactLayout, Split};
/// let layout = ArtifactLayout::new("/artifacts", "t2i").unwrap();
/// assert_eq!(
///     layout.sidecar_path(Split::Train, 7, 3),
///     Path::new("/artifacts/t2i/rollout_0000007/group_00000003.safetensors")
/// );
/// assert_eq!(
///     layout.sample_image_path(Split::Train, 7, 3, 1),
///     Path::new("/artifacts/t2i/rollout_0000007/group_00000003_sample_0001.png")
/// );
/// assert_eq!(
///     layout.rollout_dir(Split::Eval, 2),
///     Path::new("/artifacts/eval/t2i/rollout_0000002")
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactLayout {
    root: PathBuf,
    task: String,
}

/// The directory name reserved for evaluation passes, so no task may use it.
const EVAL_DIR: &str = "eval";
const ROLLOUT_PREFIX: &str = "rollout_";
const GROUP_PREFIX: &str = "group_";
const SIDECAR_EXT: &str = ".safetensors";

/// Checks that `task` can be one path component: non-empty, `[A-Za-z0-9_.-]`, not `.`/`..`,
/// and not `eval` (which holds the evaluation tree).
pub(crate) fn check_task(task: &str) -> Result<(), TrajectoryError> {
    let bad = |reason| {
        Err(TrajectoryError::InvalidTask {
            task: task.to_string(),
            reason,
        })
    };
    if task.is_empty() {
        return bad("it is empty");
    }
    if task == "." || task == ".." {
        return bad("it is a relative path component");
    }
    if task == EVAL_DIR {
        return bad("`eval` is reserved for the evaluation tree <root>/eval/<task>/");
    }
    if !task
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        return bad("only ASCII letters, digits, `_`, `-` and `.` are allowed");
    }
    Ok(())
}

/// One rollout directory found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutDir {
    /// The rollout id parsed from the name.
    pub id: u64,
    /// The directory.
    pub path: PathBuf,
}

/// How many rollout directories to keep (`--artifact-retention-rollouts`).
///
/// `keep_last <= 0` keeps everything — which grows without bound (one sidecar per group and
/// one image per candidate, every rollout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// The number of most recent rollouts to keep; `<= 0` keeps all.
    pub keep_last: i64,
}

impl Retention {
    /// Keep the last `n` rollouts (`n <= 0`: keep all).
    pub fn keep_last(n: i64) -> Self {
        Self { keep_last: n }
    }

    /// `Some(n)` when pruning keeps `n >= 1` rollouts, `None` when it keeps all.
    pub fn limit(self) -> Option<usize> {
        (self.keep_last > 0).then(|| usize::try_from(self.keep_last).unwrap_or(usize::MAX))
    }
}

/// What a prune did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PruneReport {
    /// Rollout ids kept, ascending.
    pub kept: Vec<u64>,
    /// Rollout ids whose directories were removed, ascending.
    pub removed: Vec<u64>,
}

/// What [`ArtifactLayout::begin_rollout`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BegunRollout {
    /// The new rollout's (empty) directory.
    pub dir: PathBuf,
    /// Older rollouts kept and removed (the new one is not listed).
    pub pruned: PruneReport,
    /// Whether a directory for this rollout id already existed and was emptied (a rollout
    /// restarted after a crash or a resume).
    pub cleared_existing: bool,
}

fn parse_rollout_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(ROLLOUT_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn remove_dir(path: &Path) -> Result<(), TrajectoryError> {
    fs::remove_dir_all(path).map_err(io_err(path, "remove rollout directory"))
}

impl ArtifactLayout {
    /// A layout for `task` under `root`.
    ///
    /// # Errors
    /// [`TrajectoryError::InvalidTask`] when the task cannot be a directory name (or is `eval`).
    pub fn new(root: impl Into<PathBuf>, task: &str) -> Result<Self, TrajectoryError> {
        check_task(task)?;
        Ok(Self {
            root: root.into(),
            task: task.to_string(),
        })
    }

    /// The artifact root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The task.
    pub fn task(&self) -> &str {
        &self.task
    }

    /// `<root>/<task>` (train) or `<root>/eval/<task>` (eval).
    pub fn task_dir(&self, split: Split) -> PathBuf {
        match split {
            Split::Train => self.root.join(&self.task),
            Split::Eval => self.root.join(EVAL_DIR).join(&self.task),
        }
    }

    /// `<task dir>/rollout_<id, 7 digits>`.
    pub fn rollout_dir(&self, split: Split, rollout_id: u64) -> PathBuf {
        self.task_dir(split)
            .join(format!("{ROLLOUT_PREFIX}{rollout_id:07}"))
    }

    /// `<rollout dir>/group_<idx, 8 digits>.safetensors`.
    pub fn sidecar_path(&self, split: Split, rollout_id: u64, group: u64) -> PathBuf {
        self.rollout_dir(split, rollout_id)
            .join(format!("{GROUP_PREFIX}{group:08}{SIDECAR_EXT}"))
    }

    /// `<rollout dir>/group_<idx, 8 digits>_sample_<slot, 4 digits>.png`.
    pub fn sample_image_path(
        &self,
        split: Split,
        rollout_id: u64,
        group: u64,
        slot: u32,
    ) -> PathBuf {
        self.rollout_dir(split, rollout_id)
            .join(format!("{GROUP_PREFIX}{group:08}_sample_{slot:04}.png"))
    }

    /// The rollout directories present, ascending by id. Entries that are not real directories
    /// named `rollout_<digits>` are ignored (never touched by pruning).
    ///
    /// # Errors
    /// [`TrajectoryError::Io`]; a missing task directory is an empty list.
    pub fn rollouts(&self, split: Split) -> Result<Vec<RolloutDir>, TrajectoryError> {
        let dir = self.task_dir(split);
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err(&dir, "list artifact directory")(e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io_err(&dir, "list artifact directory"))?;
            let Some(id) = entry.file_name().to_str().and_then(parse_rollout_name) else {
                continue;
            };
            let path = entry.path();
            let meta = fs::symlink_metadata(&path).map_err(io_err(&path, "stat"))?;
            if meta.is_dir() {
                out.push(RolloutDir { id, path });
            }
        }
        out.sort_by_key(|r| r.id);
        Ok(out)
    }

    /// The sidecars of a rollout, as `(group index, path)` ascending. Staged `.tmp` files
    /// (a write that never committed) are not listed.
    ///
    /// # Errors
    /// [`TrajectoryError::Io`].
    pub fn sidecars(
        &self,
        split: Split,
        rollout_id: u64,
    ) -> Result<Vec<(u64, PathBuf)>, TrajectoryError> {
        let dir = self.rollout_dir(split, rollout_id);
        let mut out = Vec::new();
        for entry in fs::read_dir(&dir).map_err(io_err(&dir, "list rollout directory"))? {
            let entry = entry.map_err(io_err(&dir, "list rollout directory"))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some(digits) = name
                .strip_prefix(GROUP_PREFIX)
                .and_then(|n| n.strip_suffix(SIDECAR_EXT))
            else {
                continue;
            };
            if !digits.is_empty()
                && digits.bytes().all(|b| b.is_ascii_digit())
                && let Ok(group) = digits.parse()
            {
                out.push((group, entry.path()));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Keeps the `retention` most recent rollout directories (by id) and removes the others.
    /// `keep_last <= 0` removes nothing.
    ///
    /// # Errors
    /// [`TrajectoryError::Io`]; directories removed before the failure stay removed.
    pub fn prune(
        &self,
        split: Split,
        retention: Retention,
    ) -> Result<PruneReport, TrajectoryError> {
        let dirs = self.rollouts(split)?;
        let Some(keep) = retention.limit() else {
            return Ok(PruneReport {
                kept: dirs.iter().map(|d| d.id).collect(),
                removed: Vec::new(),
            });
        };
        let cut = dirs.len().saturating_sub(keep);
        let mut report = PruneReport::default();
        for (i, d) in dirs.iter().enumerate() {
            if i < cut {
                remove_dir(&d.path)?;
                report.removed.push(d.id);
            } else {
                report.kept.push(d.id);
            }
        }
        Ok(report)
    }

    /// Starts rollout `rollout_id`: reaps old rollout directories, then creates the rollout's
    /// directory, empty.
    ///
    /// With `keep_last = N > 0`, after this call at most `N` rollout directories exist: the new
    /// one and the `N - 1` most recent ones with a smaller id. Directories with a *larger* id
    /// belong to an abandoned timeline (a run resumed from an earlier checkpoint) and are
    /// removed, so their groups can never mix with the new run's. With `keep_last <= 0` no
    /// other directory is touched. In every case an existing directory for `rollout_id` itself
    /// (a rollout restarted after a crash) is emptied: its partial sidecars must not be read
    /// as this rollout's.
    ///
    /// # Errors
    /// [`TrajectoryError::Io`].
    pub fn begin_rollout(
        &self,
        split: Split,
        rollout_id: u64,
        retention: Retention,
    ) -> Result<BegunRollout, TrajectoryError> {
        let dirs = self.rollouts(split)?;
        let mut pruned = PruneReport::default();
        let mut cleared_existing = false;
        let older: Vec<&RolloutDir> = dirs.iter().filter(|d| d.id < rollout_id).collect();
        let keep_older = retention
            .limit()
            .map_or(older.len(), |n| n.saturating_sub(1));
        let cut = older.len().saturating_sub(keep_older);
        for d in &dirs {
            if d.id == rollout_id {
                remove_dir(&d.path)?;
                cleared_existing = true;
            } else if d.id > rollout_id {
                if retention.limit().is_some() {
                    remove_dir(&d.path)?;
                    pruned.removed.push(d.id);
                } else {
                    pruned.kept.push(d.id);
                }
            }
        }
        for (i, d) in older.iter().enumerate() {
            if i < cut {
                remove_dir(&d.path)?;
                pruned.removed.push(d.id);
            } else {
                pruned.kept.push(d.id);
            }
        }
        pruned.kept.sort_unstable();
        pruned.removed.sort_unstable();
        let dir = self.rollout_dir(split, rollout_id);
        fs::create_dir_all(&dir).map_err(io_err(&dir, "create rollout directory"))?;
        crate::sidecar::sync_dir(dir.parent().unwrap_or(&dir))?;
        Ok(BegunRollout {
            dir,
            pruned,
            cleared_existing,
        })
    }
}
