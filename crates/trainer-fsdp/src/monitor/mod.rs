//! Monitoring (seed 002, "Monitoring"): the metric names, a JSONL log and TensorBoard event
//! files written side by side, a reward-curve PNG, sample grids, and progress bars.
//!
//! Both metric files are append-only. Their byte lengths at a checkpoint are the
//! [`MetricsCursor`] saved in the trainer state; a resumed run truncates both files back to it,
//! so the records of rollouts that are about to be recomputed appear once, not twice.

mod cpu;
mod draw;
mod jsonl;
pub mod names;
mod progress;
mod tensorboard;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::TrainerError;

pub use cpu::process_cpu_seconds;
pub use draw::{
    Axes, Rgb, Series, before_after_grid, caption_height, grid_tile, plot_curves, sample_grid,
    upscale, write_png,
};
pub use jsonl::{JsonlWriter, MetricsRecord, parse_jsonl, read_jsonl, series};
pub use progress::Progress;
pub use tensorboard::{
    EVENTS_FILE, Event, EventWriter, crc32c, encode_event, masked_crc32c, parse_events, read_events,
};

/// The metric files' lengths when a checkpoint was taken.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetricsCursor {
    /// Bytes of `metrics.jsonl`.
    pub jsonl_bytes: u64,
    /// Bytes of the TensorBoard event file.
    pub events_bytes: u64,
}

/// The metrics of one step: name → value. Names are the seed's ([`names`]).
pub type Metrics = BTreeMap<String, f64>;

/// The JSONL file inside the run directory.
pub const JSONL_FILE: &str = "metrics.jsonl";

/// Seconds since the Unix epoch, as TensorBoard's `wall_time`.
pub fn wall_time() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The reward-curve PNG of the run directory.
pub const REWARD_CURVE_FILE: &str = "reward_curve.png";

/// Plots the metrics `names` from a JSONL metrics file against the logged step (the rollout)
/// and writes the PNG atomically, e.g. the training reward per rollout and the held-out
/// reward: a metric `<name>` with a `<name>_se` companion logged at the same steps (the
/// held-out reward's standard error) gets `±` bars. Metrics with no point yet are left out;
/// at least one must have one. The axes are titled `rollout` and `y_label`.
///
/// # Errors
/// [`TrainerError::Io`] / [`TrainerError::MetricsLine`] reading, [`TrainerError::Drawing`]
/// when no metric has a point, PNG and write errors.
///
/// ```
/// use trainer_fsdp::{Metrics, Monitor, write_reward_curve};
/// let dir = tempfile::tempdir().unwrap();
/// let mut m = Monitor::open(dir.path(), None, true, false).unwrap();
/// for step in 0..3 {
///     m.log(step, &Metrics::from([("reward/score_mean".to_string(), 0.5 + 0.1 * step as f64)])).unwrap();
/// }
/// let png = dir.path().join("reward_curve.png");
/// write_reward_curve(&m.jsonl_path().unwrap(), &["reward/score_mean", "eval/reward"], &png, "reward", "score").unwrap();
/// assert_eq!(image::open(&png).unwrap().width(), 640);
/// ```
pub fn write_reward_curve(
    jsonl: &Path,
    names: &[&str],
    png: &Path,
    title: &str,
    y_label: &str,
) -> Result<(), TrainerError> {
    let records = read_jsonl(jsonl)?;
    let curves: Vec<Series> = names
        .iter()
        .map(|n| {
            let points = series(&records, n);
            let se: std::collections::BTreeMap<u64, f64> =
                series(&records, &format!("{n}_se")).into_iter().collect();
            let errors: Vec<f64> = if se.is_empty() {
                Vec::new()
            } else {
                points
                    .iter()
                    .map(|(x, _)| se.get(x).copied().unwrap_or(f64::NAN))
                    .collect()
            };
            Series::new(n, points.into_iter().map(|(x, y)| (x as f64, y)).collect())
                .with_errors(errors)
        })
        .filter(|s| !s.points.is_empty())
        .collect();
    let axes = Axes {
        title,
        x_label: "rollout",
        y_label,
        integer_x: true,
    };
    let img = plot_curves(&curves, &axes, 640, 400)?;
    write_png(png, &img)
}

/// The JSONL log and the TensorBoard event file of one run directory.
///
/// ```
/// use trainer_fsdp::{Metrics, Monitor, names};
/// let dir = tempfile::tempdir().unwrap();
/// let mut m = Monitor::open(dir.path(), None, true, true).unwrap();
/// m.log(1, &Metrics::from([(names::TRAIN_LOSS.to_string(), 0.5)])).unwrap();
/// let cursor = m.cursor();
/// m.log(2, &Metrics::from([(names::TRAIN_LOSS.to_string(), 0.25)])).unwrap();
/// drop(m);
/// // resuming from the cursor forgets step 2, which the resumed run will log again
/// let m = Monitor::open(dir.path(), Some(cursor), true, true).unwrap();
/// let records = trainer_fsdp::read_jsonl(&m.jsonl_path().unwrap()).unwrap();
/// assert_eq!(records.len(), 1);
/// assert_eq!(records[0].step, 1);
/// ```
#[derive(Debug)]
pub struct Monitor {
    dir: PathBuf,
    jsonl: Option<JsonlWriter>,
    events: Option<EventWriter>,
}

impl Monitor {
    /// Opens (creating) the metric files in `dir`; with a `cursor`, truncates them back to it.
    ///
    /// # Errors
    /// [`TrainerError::Io`].
    pub fn open(
        dir: &Path,
        cursor: Option<MetricsCursor>,
        jsonl: bool,
        tensorboard: bool,
    ) -> Result<Self, TrainerError> {
        let cursor = cursor.unwrap_or_default();
        let jsonl = if jsonl {
            Some(JsonlWriter::open(
                &dir.join(JSONL_FILE),
                cursor.jsonl_bytes,
            )?)
        } else {
            None
        };
        let events = if tensorboard {
            Some(EventWriter::open(
                &dir.join(EVENTS_FILE),
                cursor.events_bytes,
                wall_time(),
            )?)
        } else {
            None
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            jsonl,
            events,
        })
    }

    /// Checks, writing nothing, that the metric files in `dir` hold what a resume from
    /// `cursor` keeps: each file at least as long as the cursor says, the JSONL prefix whole
    /// lines of metrics records, the event-file prefix whole records with valid CRCs. A resumed
    /// run calls it before any work, so a damaged log is reported before the first rollout
    /// rather than after the last.
    ///
    /// # Errors
    /// [`TrainerError::MetricsCursor`], [`TrainerError::MetricsLine`],
    /// [`TrainerError::EventFile`], [`TrainerError::Io`].
    pub fn check_resume(
        dir: &Path,
        cursor: MetricsCursor,
        jsonl: bool,
        tensorboard: bool,
    ) -> Result<(), TrainerError> {
        if jsonl {
            let path = dir.join(JSONL_FILE);
            let bytes = read_prefix(&path, cursor.jsonl_bytes)?;
            if bytes.last().is_some_and(|b| *b != b'\n') {
                return Err(TrainerError::MetricsCursor {
                    path,
                    problem: format!(
                        "the checkpoint's metrics cursor ({} bytes) does not end a line",
                        cursor.jsonl_bytes
                    ),
                });
            }
            let text = std::str::from_utf8(&bytes).map_err(|e| TrainerError::MetricsCursor {
                path: path.clone(),
                problem: format!("not UTF-8 at byte {}", e.valid_up_to()),
            })?;
            parse_jsonl(text, &path)?;
        }
        if tensorboard {
            let path = dir.join(EVENTS_FILE);
            let bytes = read_prefix(&path, cursor.events_bytes)?;
            parse_events(&bytes, &path)?;
        }
        Ok(())
    }

    /// The run directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The JSONL file, when written.
    pub fn jsonl_path(&self) -> Option<PathBuf> {
        self.jsonl.as_ref().map(|j| j.path().to_path_buf())
    }

    /// The event file, when written.
    pub fn events_path(&self) -> Option<PathBuf> {
        self.events.as_ref().map(|e| e.path().to_path_buf())
    }

    /// Appends one step's metrics to both files (flushed). Non-finite values are written as
    /// JSON `null` and as TensorBoard's NaN/inf floats.
    ///
    /// # Errors
    /// [`TrainerError::Io`].
    pub fn log(&mut self, step: u64, metrics: &Metrics) -> Result<(), TrainerError> {
        let t = wall_time();
        if let Some(j) = &mut self.jsonl {
            j.append(&MetricsRecord {
                step,
                wall_time: t,
                metrics: metrics.iter().map(|(k, v)| (k.clone(), Some(*v))).collect(),
            })?;
        }
        if let Some(e) = &mut self.events {
            e.write_scalars(step, t, metrics.iter().map(|(k, v)| (k.as_str(), *v)))?;
        }
        Ok(())
    }

    /// Where both files end now (save it in the trainer state with a checkpoint).
    pub fn cursor(&self) -> MetricsCursor {
        MetricsCursor {
            jsonl_bytes: self.jsonl.as_ref().map_or(0, JsonlWriter::len),
            events_bytes: self.events.as_ref().map_or(0, EventWriter::len),
        }
    }
}

/// The first `keep` bytes of `path` (nothing for `keep == 0`, even when the file is absent).
fn read_prefix(path: &Path, keep: u64) -> Result<Vec<u8>, TrainerError> {
    if keep == 0 {
        return Ok(Vec::new());
    }
    let mut bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(crate::error::io_err(path, "read")(e)),
    };
    if (bytes.len() as u64) < keep {
        return Err(TrainerError::MetricsCursor {
            path: path.to_path_buf(),
            problem: format!(
                "{} bytes, but the checkpoint's metrics cursor keeps {keep}: records up to the \
                 checkpoint are missing (the file was cut or replaced)",
                bytes.len()
            ),
        });
    }
    bytes.truncate(keep as usize);
    Ok(bytes)
}
