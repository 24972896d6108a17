//! `metrics.jsonl`: one flat JSON object per logged step,
//! `{"step": 3, "wall_time": 1.7e9, "train/loss": 0.01, ...}`, appended with one write each.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{TrainerError, io_err};

/// One line of `metrics.jsonl`. A non-finite value is stored as `null`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricsRecord {
    /// The x-axis: the rollout (or optimizer) step.
    pub step: u64,
    /// Seconds since the Unix epoch.
    pub wall_time: f64,
    /// Metric name → value (`None` for NaN or infinity, which JSON cannot hold).
    #[serde(flatten)]
    pub metrics: BTreeMap<String, Option<f64>>,
}

/// An append-only JSONL file.
#[derive(Debug)]
pub struct JsonlWriter {
    path: PathBuf,
    file: File,
    len: u64,
}

impl JsonlWriter {
    /// Opens `path` for appending after truncating it to `keep_bytes` (0 for a fresh run; a
    /// checkpoint's cursor on resume). A file shorter than `keep_bytes` is kept whole.
    ///
    /// # Errors
    /// [`TrainerError::Io`].
    pub fn open(path: &Path, keep_bytes: u64) -> Result<Self, TrainerError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(io_err(parent, "create directory"))?;
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)
            .map_err(io_err(path, "open"))?;
        let len = file.metadata().map_err(io_err(path, "stat"))?.len();
        let len = len.min(keep_bytes);
        file.set_len(len).map_err(io_err(path, "truncate"))?;
        let mut w = Self {
            path: path.to_path_buf(),
            file,
            len,
        };
        use std::io::Seek;
        w.file
            .seek(std::io::SeekFrom::Start(len))
            .map_err(io_err(path, "seek"))?;
        Ok(w)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends one record as one line, with a single write.
    ///
    /// # Errors
    /// [`TrainerError::Io`].
    pub fn append(&mut self, record: &MetricsRecord) -> Result<(), TrainerError> {
        let mut clean = record.clone();
        for v in clean.metrics.values_mut() {
            if v.is_some_and(|x| !x.is_finite()) {
                *v = None;
            }
        }
        let mut line = serde_json::to_string(&clean).map_err(|source| TrainerError::Json {
            path: self.path.clone(),
            what: "a metrics record",
            source,
        })?;
        line.push('\n');
        durable::crash_point("append to", &self.path);
        self.file
            .write_all(line.as_bytes())
            .and_then(|()| self.file.flush())
            .map_err(io_err(&self.path, "append to"))?;
        self.len += line.len() as u64;
        Ok(())
    }
}

/// Reads every record of a JSONL metrics file.
///
/// # Errors
/// [`TrainerError::Io`], [`TrainerError::MetricsLine`] naming the line.
pub fn read_jsonl(path: &Path) -> Result<Vec<MetricsRecord>, TrainerError> {
    let text = std::fs::read_to_string(path).map_err(io_err(path, "read"))?;
    parse_jsonl(&text, path)
}

/// Parses the text of a metrics JSONL file (`path` names it in errors); blank lines are
/// skipped.
///
/// # Errors
/// [`TrainerError::MetricsLine`] naming the first bad line.
pub fn parse_jsonl(text: &str, path: &Path) -> Result<Vec<MetricsRecord>, TrainerError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|source| TrainerError::MetricsLine {
                path: path.to_path_buf(),
                line: i + 1,
                source,
            })
        })
        .collect()
}

/// The `(step, value)` points of one metric, skipping records without it (or with `null`).
///
/// ```
/// use std::collections::BTreeMap;
/// use trainer_fsdp::{MetricsRecord, series};
/// let r = |step, v: Option<f64>| MetricsRecord {
///     step,
///     wall_time: 0.0,
///     metrics: BTreeMap::from([("reward/score_mean".to_string(), v)]),
/// };
/// let pts = series(&[r(0, Some(0.5)), r(1, None), r(2, Some(0.7))], "reward/score_mean");
/// assert_eq!(pts, vec![(0, 0.5), (2, 0.7)]);
/// ```
pub fn series(records: &[MetricsRecord], name: &str) -> Vec<(u64, f64)> {
    records
        .iter()
        .filter_map(|r| r.metrics.get(name).copied().flatten().map(|v| (r.step, v)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(step: u64, loss: f64) -> MetricsRecord {
        MetricsRecord {
            step,
            wall_time: 1.5,
            metrics: BTreeMap::from([
                ("train/loss".to_string(), Some(loss)),
                ("train/lr".to_string(), Some(3e-4)),
            ]),
        }
    }

    #[test]
    fn lines_are_flat_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        let mut w = JsonlWriter::open(&path, 0).unwrap();
        w.append(&rec(0, 0.5)).unwrap();
        w.append(&rec(1, f64::NAN)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let first = text.lines().next().unwrap();
        assert_eq!(
            first,
            r#"{"step":0,"wall_time":1.5,"train/loss":0.5,"train/lr":0.0003}"#
        );
        assert_eq!(w.len(), text.len() as u64);
        let back = read_jsonl(&path).unwrap();
        assert_eq!(back[0], rec(0, 0.5));
        assert_eq!(back[1].metrics["train/loss"], None);
        assert_eq!(series(&back, "train/loss"), vec![(0, 0.5)]);
    }

    #[test]
    fn reopening_truncates_to_the_cursor_and_appends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        let mut w = JsonlWriter::open(&path, 0).unwrap();
        w.append(&rec(0, 0.5)).unwrap();
        let cursor = w.len();
        w.append(&rec(1, 0.4)).unwrap();
        w.append(&rec(2, 0.3)).unwrap();
        drop(w);
        let mut w = JsonlWriter::open(&path, cursor).unwrap();
        w.append(&rec(1, 0.45)).unwrap();
        let steps: Vec<(u64, f64)> = series(&read_jsonl(&path).unwrap(), "train/loss");
        assert_eq!(steps, vec![(0, 0.5), (1, 0.45)]);
        // a fresh run starts the file over
        drop(w);
        let w = JsonlWriter::open(&path, 0).unwrap();
        assert!(w.is_empty());
        assert!(read_jsonl(&path).unwrap().is_empty());
    }

    #[test]
    fn a_damaged_line_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        std::fs::write(&path, "{\"step\":0,\"wall_time\":0}\nnot json\n").unwrap();
        let err = read_jsonl(&path).unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
    }
}
