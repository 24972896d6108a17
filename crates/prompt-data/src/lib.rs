//! # prompt-data
//!
//! Prompt datasets in seed 002's unified JSONL schema, one JSON object per line:
//!
//! ```json
//! {"prompt": "a red panda in a teacup", "metadata": {"task": "t2i", "sample_id": "pickapic_0000001"}}
//! ```
//!
//! `metadata` may carry more fields (kept as they are); a record of an image- or
//! video-conditioned task lists its files in a top-level `"media"` array, one per `<image>` /
//! `<video>` placeholder in the prompt.
//!
//! Three steps build and gate such a file, each deterministic (no RNG anywhere):
//!
//! * [`convert`]: a prompt source — a JSONL with a prompt field, plain text with one prompt
//!   per line, a parquet string column — into the schema, with sample ids
//!   `<prefix><line or row number>`;
//! * [`curate`]: dedup by a stable content hash (prompt + sorted media paths), a minimum word
//!   count, records with missing media dropped, and a train / eval split by a hash of the
//!   sample id (a fixed eval size with nested eval subsets, or a fraction): a rerun gives the
//!   identical partition;
//! * [`inspect`]: required keys, a known task, placeholders against media, and train / eval
//!   leakage (the same sample id or the same content in both), optionally every image decoded,
//!   every problem reported with its file and line.
//!
//! Files are written durably (temp file, fsync, rename): an interrupted run leaves no torn
//! output. [`convert`] and [`curate`] check every file they will write first
//! ([`check_outputs`]): one that exists is replaced only when asked (`overwrite`), and one
//! that is the input they read is refused.

#![deny(missing_docs)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The tasks a record may name (seed 002's generation tasks and their conditioned variants).
pub const TASKS: &[&str] = &["t2i", "i2i", "t2v", "i2v"];

/// The placeholders a prompt marks its media with.
pub const PLACEHOLDERS: &[&str] = &["<image>", "<video>"];

/// One record of the unified schema.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptRecord {
    /// The prompt.
    pub prompt: String,
    /// Its metadata: the task, the sample id and any other fields.
    pub metadata: Metadata,
    /// Media files, one per placeholder (image- and video-conditioned tasks).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub media: Vec<String>,
}

/// A record's `metadata`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    /// The generation task (one of [`TASKS`]).
    pub task: String,
    /// A stable id, unique in the dataset.
    pub sample_id: String,
    /// Every other field, kept.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl PromptRecord {
    /// A text-only record.
    pub fn new(
        prompt: impl Into<String>,
        task: impl Into<String>,
        sample_id: impl Into<String>,
    ) -> Self {
        Self {
            prompt: prompt.into(),
            metadata: Metadata {
                task: task.into(),
                sample_id: sample_id.into(),
                extra: BTreeMap::new(),
            },
            media: Vec::new(),
        }
    }

    /// The stable content hash dedup uses: SHA-256 over the prompt and the sorted media paths
    /// (NUL-separated), hex.
    pub fn content_hash(&self) -> String {
        let mut media = self.media.clone();
        media.sort();
        let mut h = Sha256::new();
        h.update(self.prompt.as_bytes());
        for m in &media {
            h.update([0u8]);
            h.update(m.as_bytes());
        }
        hex(&h.finalize())
    }

    /// The number of placeholders in the prompt.
    pub fn placeholders(&self) -> usize {
        PLACEHOLDERS
            .iter()
            .map(|p| self.prompt.matches(p).count())
            .sum()
    }

    /// Whitespace-separated words of the prompt.
    pub fn words(&self) -> usize {
        self.prompt.split_whitespace().count()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The split key of a sample id: the first 8 bytes of its SHA-256, big-endian.
pub fn split_key(sample_id: &str) -> u64 {
    let d = Sha256::digest(sample_id.as_bytes());
    u64::from_be_bytes(d[..8].try_into().expect("8 bytes"))
}

/// A problem of one line of an input file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineProblem {
    /// The file.
    pub path: PathBuf,
    /// The line, 1-based.
    pub line: usize,
    /// What is wrong.
    pub problem: String,
}

impl fmt::Display for LineProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.path.display(), self.line, self.problem)
    }
}

/// Errors of the data tools.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file cannot be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A file cannot be written.
    #[error(transparent)]
    Write(#[from] durable::DurableError),
    /// Lines that are not records; every one listed (at most the first 20 shown).
    #[error("{} bad line(s): {}{}", problems.len(), problems.iter().take(20).map(|p| p.to_string()).collect::<Vec<_>>().join("; "), if problems.len() > 20 { "; ..." } else { "" })]
    BadLines {
        /// Each bad line.
        problems: Vec<LineProblem>,
    },
    /// An option out of range.
    #[error("{option} = {given}: {expected}")]
    Option {
        /// The option.
        option: &'static str,
        /// The value given.
        given: String,
        /// What is allowed.
        expected: String,
    },
    /// A parquet file that cannot be read (its codec, say) or has no prompt column.
    #[error("{path}: parquet: {problem}")]
    Parquet {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// Outputs that exist, and replacing them was not asked for (`overwrite`); every one
    /// listed.
    #[error("{} output file(s) already exist: {}; nothing was written (pass --overwrite to replace them)", paths.len(), paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))]
    OutputExists {
        /// Each existing output.
        paths: Vec<PathBuf>,
    },
    /// An output (or its `<output>.tmp` staging file) that is the input it reads; refused even
    /// with `overwrite`.
    #[error(
        "output {output} is the input {input}: an output must not replace what it reads; nothing was written (name another output)"
    )]
    OutputIsInput {
        /// The output (or its staging file).
        output: PathBuf,
        /// The input.
        input: PathBuf,
    },
    /// A source format this build cannot read.
    #[error("{path}: {format} input is not supported: {hint}")]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// Its format.
        format: String,
        /// What to do instead.
        hint: &'static str,
    },
}

fn read_lines(path: &Path) -> Result<Vec<String>, DataError> {
    let io = |source| DataError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    BufReader::new(file)
        .lines()
        .collect::<Result<_, _>>()
        .map_err(io)
}

/// Writes records as JSONL, durably; an existing file at `path` is replaced (the guarded
/// writers, [`convert`] and [`curate`], call [`check_outputs`] first).
///
/// # Errors
/// [`DataError::Write`].
pub fn write_jsonl(path: &Path, records: &[PromptRecord]) -> Result<(), DataError> {
    let mut f = durable::AtomicFile::create(path)?;
    for r in records {
        let line = serde_json::to_string(r).expect("a record serialises");
        f.write_all(line.as_bytes())
            .and_then(|()| f.write_all(b"\n"))
            .map_err(|source| DataError::Io {
                path: path.to_path_buf(),
                source,
            })?;
    }
    f.commit()?;
    Ok(())
}

/// Reads a unified-schema JSONL file; blank lines are skipped, every bad line is reported.
///
/// # Errors
/// [`DataError::Io`], [`DataError::BadLines`].
pub fn read_jsonl(path: &Path) -> Result<NumberedRecords, DataError> {
    let (records, problems) = parse_jsonl(path)?;
    if problems.is_empty() {
        Ok(records)
    } else {
        Err(DataError::BadLines { problems })
    }
}

/// `path` as [`durable::resolved`] gives it, for comparing files.
fn resolved(path: &Path) -> Result<PathBuf, DataError> {
    durable::resolved(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Checks the files a writer is about to write, all before any is written: an output that
/// is one of the `inputs` (the same file after resolving symlinks, `.` and `..`), or whose
/// `<output>.tmp` staging file is one, is refused even with `overwrite`; outputs that exist
/// (a dangling symlink counts) are refused, every one named, unless `overwrite`.
///
/// # Errors
/// [`DataError::OutputIsInput`], [`DataError::OutputExists`], [`DataError::Io`] when a path
/// cannot be made absolute.
pub fn check_outputs(
    inputs: &[&Path],
    outputs: &[PathBuf],
    overwrite: bool,
) -> Result<(), DataError> {
    let inputs: Vec<(&Path, PathBuf)> = inputs
        .iter()
        .map(|i| resolved(i).map(|r| (*i, r)))
        .collect::<Result<_, _>>()?;
    for output in outputs {
        for written in [output.clone(), durable::tmp_path(output)] {
            let w = resolved(&written)?;
            if let Some((input, _)) = inputs.iter().find(|(_, r)| *r == w) {
                return Err(DataError::OutputIsInput {
                    output: written,
                    input: input.to_path_buf(),
                });
            }
        }
    }
    let existing: Vec<PathBuf> = outputs
        .iter()
        .filter(|o| std::fs::symlink_metadata(o).is_ok())
        .cloned()
        .collect();
    if !overwrite && !existing.is_empty() {
        return Err(DataError::OutputExists { paths: existing });
    }
    Ok(())
}

/// Records with their 1-based line numbers.
pub type NumberedRecords = Vec<(usize, PromptRecord)>;

/// Every record that parses, with its line, and a problem for every line that does not.
fn parse_jsonl(path: &Path) -> Result<(NumberedRecords, Vec<LineProblem>), DataError> {
    let mut records = Vec::new();
    let mut problems = Vec::new();
    for (i, line) in read_lines(path)?.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let problem = |problem: String| LineProblem {
            path: path.to_path_buf(),
            line: i + 1,
            problem,
        };
        let v: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => {
                problems.push(problem(format!("not JSON: {e}")));
                continue;
            }
        };
        let missing: Vec<&str> = [("prompt", &v["prompt"]), ("metadata", &v["metadata"])]
            .into_iter()
            .chain([
                ("metadata.task", &v["metadata"]["task"]),
                ("metadata.sample_id", &v["metadata"]["sample_id"]),
            ])
            .filter(|(_, x)| x.is_null())
            .map(|(k, _)| k)
            .collect();
        if !missing.is_empty() {
            problems.push(problem(format!(
                "missing required key(s) {}",
                missing.join(", ")
            )));
            continue;
        }
        match serde_json::from_value::<PromptRecord>(v) {
            Ok(r) => records.push((i + 1, r)),
            Err(e) => problems.push(problem(format!("not a record: {e}"))),
        }
    }
    Ok((records, problems))
}

/// The format of a prompt source for [`convert`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceFormat {
    /// JSON lines, the prompt in `field` (or, without one, the first of `prompt`, `caption`,
    /// `text` present in the line).
    Jsonl {
        /// The prompt field.
        field: Option<String>,
    },
    /// Plain text, one prompt per line (blank lines skipped).
    Text,
    /// A parquet file, the prompt in the string column `column` (or, without one, the first
    /// of `prompt`, `caption`, `text` the file has); rows are numbered from 1 like lines.
    /// Uncompressed and snappy-compressed files are read (the datasets hub's default).
    Parquet {
        /// The prompt column.
        column: Option<String>,
    },
}

impl SourceFormat {
    /// The format of `path` by its extension (`.jsonl` / `.json` JSON lines, `.txt` text,
    /// `.parquet`); `field` names the JSONL field or parquet column of the prompt.
    ///
    /// # Errors
    /// [`DataError::Unsupported`] for unknown extensions; [`DataError::Option`] for a `field`
    /// with a `.txt` input, which has no fields.
    pub fn from_path(path: &Path, field: Option<String>) -> Result<Self, DataError> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl") | Some("json") => Ok(SourceFormat::Jsonl { field }),
            Some("txt") => match field {
                None => Ok(SourceFormat::Text),
                Some(f) => Err(DataError::Option {
                    option: "field",
                    given: format!("{f:?}"),
                    expected: format!(
                        "no field for {}: a .txt input is one prompt per line and has no \
                         fields (a field names a .jsonl key or a .parquet column)",
                        path.display()
                    ),
                }),
            },
            Some("parquet") => Ok(SourceFormat::Parquet { column: field }),
            other => Err(DataError::Unsupported {
                path: path.to_path_buf(),
                format: format!("{other:?} extension"),
                hint: "name a .jsonl (a prompt field per line), .txt (one prompt per line) or \
                       .parquet (a prompt column) file",
            }),
        }
    }
}

/// What [`convert`] read and wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvertReport {
    /// Records written.
    pub written: usize,
    /// Blank lines skipped.
    pub blank: usize,
}

/// Converts a prompt source into the unified schema at `output`: every prompt (trimmed) with
/// `task` and the sample id `<id_prefix><line or row number, 7 digits>`. Lines (rows) whose
/// prompt is missing, null, not a string or empty are errors, all reported; nothing is
/// written then. An existing `output` is replaced only with `overwrite`, and never when it
/// is `input` ([`check_outputs`], before the input is read).
///
/// # Errors
/// [`DataError::Option`] for an unknown task, [`DataError::OutputIsInput`],
/// [`DataError::OutputExists`], [`DataError::BadLines`], IO errors.
pub fn convert(
    input: &Path,
    format: &SourceFormat,
    task: &str,
    id_prefix: &str,
    output: &Path,
    overwrite: bool,
) -> Result<ConvertReport, DataError> {
    if !TASKS.contains(&task) {
        return Err(DataError::Option {
            option: "task",
            given: task.into(),
            expected: format!("one of {TASKS:?}"),
        });
    }
    check_outputs(&[input], &[output.to_path_buf()], overwrite)?;
    let mut records = Vec::new();
    let mut problems = Vec::new();
    let mut blank = 0;
    for (n, prompt) in source_prompts(input, format)? {
        match prompt {
            Ok(None) => blank += 1,
            Ok(Some(p)) => records.push(PromptRecord::new(p, task, format!("{id_prefix}{n:07}"))),
            Err(problem) => problems.push(LineProblem {
                path: input.to_path_buf(),
                line: n,
                problem,
            }),
        }
    }
    if !problems.is_empty() {
        return Err(DataError::BadLines { problems });
    }
    write_jsonl(output, &records)?;
    Ok(ConvertReport {
        written: records.len(),
        blank,
    })
}

/// A source's prompts by line (or row) number: the prompt, `None` for a blank line, or what
/// is wrong with it.
type SourcePrompts = Vec<(usize, Result<Option<String>, String>)>;

fn source_prompts(input: &Path, format: &SourceFormat) -> Result<SourcePrompts, DataError> {
    let pick = |fields: &[&str], get: &dyn Fn(&str) -> Option<Value>| -> Result<String, String> {
        match fields.iter().find_map(|f| get(f)) {
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.trim().to_string()),
            Some(Value::String(_)) => Err("empty prompt".into()),
            Some(Value::Null) => Err("the prompt is null".into()),
            Some(other) => Err(format!("the prompt is not a string: {other}")),
            None => Err(format!("no {} field", fields.join(" / "))),
        }
    };
    let defaults = ["prompt", "caption", "text"];
    match format {
        SourceFormat::Text => Ok(read_lines(input)?
            .iter()
            .enumerate()
            .map(|(i, l)| {
                (
                    i + 1,
                    Ok((!l.trim().is_empty()).then(|| l.trim().to_string())),
                )
            })
            .collect()),
        SourceFormat::Jsonl { field } => {
            let fields: Vec<&str> = match field {
                Some(f) => vec![f.as_str()],
                None => defaults.to_vec(),
            };
            Ok(read_lines(input)?
                .iter()
                .enumerate()
                .map(|(i, line)| {
                    if line.trim().is_empty() {
                        return (i + 1, Ok(None));
                    }
                    let prompt = match serde_json::from_str::<Value>(line) {
                        Ok(v) => pick(&fields, &|f| v.get(f).cloned()).map(Some),
                        Err(e) => Err(format!("not JSON: {e}")),
                    };
                    (i + 1, prompt)
                })
                .collect())
        }
        SourceFormat::Parquet { column } => parquet_prompts(input, column.as_deref(), &defaults),
    }
}

/// The prompts of a parquet file's string column, by row (1-based).
fn parquet_prompts(
    input: &Path,
    column: Option<&str>,
    defaults: &[&str],
) -> Result<SourcePrompts, DataError> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::Field;

    let bad = |e: parquet::errors::ParquetError| DataError::Parquet {
        path: input.to_path_buf(),
        problem: e.to_string(),
    };
    let file = std::fs::File::open(input).map_err(|source| DataError::Io {
        path: input.to_path_buf(),
        source,
    })?;
    let reader = SerializedFileReader::new(file).map_err(bad)?;
    let names: Vec<String> = reader
        .metadata()
        .file_metadata()
        .schema_descr()
        .root_schema()
        .get_fields()
        .iter()
        .map(|f| f.name().to_string())
        .collect();
    let wanted: Vec<&str> = match column {
        Some(c) => vec![c],
        None => defaults.to_vec(),
    };
    let Some(col) = wanted.iter().find(|w| names.iter().any(|n| n == *w)) else {
        return Err(DataError::Parquet {
            path: input.to_path_buf(),
            problem: format!(
                "no {} column (the file has {names:?}; name one with --field)",
                wanted.join(" / ")
            ),
        });
    };
    let mut out = Vec::new();
    for (i, row) in reader.get_row_iter(None).map_err(bad)?.enumerate() {
        let row = row.map_err(bad)?;
        let field = row
            .get_column_iter()
            .find(|(n, _)| n.as_str() == *col)
            .map(|(_, f)| f.clone());
        let prompt = match field {
            Some(Field::Str(s)) if !s.trim().is_empty() => Ok(Some(s.trim().to_string())),
            Some(Field::Str(_)) => Err("empty prompt".into()),
            Some(Field::Null) | None => Err(format!("column {col} is null")),
            Some(other) => Err(format!("column {col} is not a string: {other}")),
        };
        out.push((i + 1, prompt));
    }
    Ok(out)
}

/// How [`curate`] splits.
#[derive(Debug, Clone, PartialEq)]
pub enum Split {
    /// The `size` records of smallest [`split_key`] are the eval set; `subsets` are its first
    /// `k` in that order (nested: every smaller subset is inside every larger one).
    EvalSize {
        /// The eval set's size.
        size: usize,
        /// Eval subset sizes.
        subsets: Vec<usize>,
    },
    /// A record is eval when its [`split_key`] falls in the lowest `fraction` of the key space.
    EvalFraction(f64),
}

/// [`curate`]'s options.
#[derive(Debug, Clone, PartialEq)]
pub struct CurateOptions {
    /// Records with fewer words are dropped.
    pub min_prompt_words: usize,
    /// Drop records whose media files do not exist (relative paths from the input's
    /// directory).
    pub check_media: bool,
    /// The split.
    pub split: Split,
    /// Output file prefix (`<prefix>train.jsonl`, `<prefix>eval.jsonl`,
    /// `<prefix>eval<k>.jsonl`).
    pub prefix: String,
    /// Replace output files that exist (never the input).
    pub overwrite: bool,
}

/// What [`curate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurateReport {
    /// Records read.
    pub read: usize,
    /// Dropped as duplicates of an earlier record's content.
    pub duplicates: usize,
    /// Dropped for too few words.
    pub too_short: usize,
    /// Dropped for missing media.
    pub missing_media: usize,
    /// Train records written.
    pub train: usize,
    /// Eval records written.
    pub eval: usize,
    /// The files written, in order.
    pub files: Vec<PathBuf>,
}

/// Curates a unified-schema JSONL into train / eval files under `out_dir`: dedup (the first
/// record of each content hash kept), filters, then the split; each output keeps the input
/// order. A sample id that appears twice in the input is an error (the split is keyed by it).
/// Every output file is checked before the input is read ([`check_outputs`]): none may be the
/// input, and existing ones are replaced only with `overwrite`.
///
/// # Errors
/// [`DataError::OutputIsInput`], [`DataError::OutputExists`], [`DataError::BadLines`]
/// (unparseable lines, repeated sample ids), [`DataError::Option`] (an eval size larger than
/// what remains, a subset larger than the eval set, a fraction outside `[0, 1]`), IO errors.
pub fn curate(
    input: &Path,
    out_dir: &Path,
    options: &CurateOptions,
) -> Result<CurateReport, DataError> {
    let p = &options.prefix;
    let subset_sizes: &[usize] = match &options.split {
        Split::EvalSize { subsets, .. } => subsets,
        Split::EvalFraction(_) => &[],
    };
    let outputs: Vec<PathBuf> = [format!("{p}train.jsonl"), format!("{p}eval.jsonl")]
        .into_iter()
        .chain(subset_sizes.iter().map(|k| format!("{p}eval{k}.jsonl")))
        .map(|name| out_dir.join(name))
        .collect();
    check_outputs(&[input], &outputs, options.overwrite)?;
    let records = read_jsonl(input)?;
    let mut seen_ids: HashMap<&str, usize> = HashMap::new();
    let mut repeated = Vec::new();
    for (line, r) in &records {
        if let Some(first) = seen_ids.insert(&r.metadata.sample_id, *line) {
            repeated.push(LineProblem {
                path: input.to_path_buf(),
                line: *line,
                problem: format!(
                    "sample_id {:?} already used on line {first}",
                    r.metadata.sample_id
                ),
            });
        }
    }
    if !repeated.is_empty() {
        return Err(DataError::BadLines { problems: repeated });
    }
    let base = input.parent().unwrap_or(Path::new("."));
    let mut hashes = BTreeSet::new();
    let (mut duplicates, mut too_short, mut missing_media) = (0, 0, 0);
    let mut kept = Vec::new();
    for (_, r) in &records {
        if !hashes.insert(r.content_hash()) {
            duplicates += 1;
        } else if r.words() < options.min_prompt_words {
            too_short += 1;
        } else if options.check_media && r.media.iter().any(|m| !base.join(m).is_file()) {
            missing_media += 1;
        } else {
            kept.push(r.clone());
        }
    }
    let mut by_key: Vec<(u64, &str, usize)> = kept
        .iter()
        .enumerate()
        .map(|(i, r)| {
            (
                split_key(&r.metadata.sample_id),
                r.metadata.sample_id.as_str(),
                i,
            )
        })
        .collect();
    by_key.sort();
    let (eval_order, subsets): (Vec<usize>, Vec<usize>) = match &options.split {
        Split::EvalSize { size, subsets } => {
            if *size > kept.len() {
                return Err(DataError::Option {
                    option: "eval_size",
                    given: size.to_string(),
                    expected: format!("at most the {} records left after curation", kept.len()),
                });
            }
            if let Some(k) = subsets.iter().find(|k| **k == 0 || **k > *size) {
                return Err(DataError::Option {
                    option: "eval_subset_sizes",
                    given: k.to_string(),
                    expected: format!("sizes in 1..={size} (the eval size)"),
                });
            }
            (
                by_key[..*size].iter().map(|x| x.2).collect(),
                subsets.clone(),
            )
        }
        Split::EvalFraction(f) => {
            if !(0.0..=1.0).contains(f) {
                return Err(DataError::Option {
                    option: "eval_fraction",
                    given: f.to_string(),
                    expected: "a fraction in [0, 1]".into(),
                });
            }
            let cut = (*f * u64::MAX as f64) as u64;
            (
                by_key.iter().filter(|x| x.0 < cut).map(|x| x.2).collect(),
                Vec::new(),
            )
        }
    };
    let eval_set: BTreeSet<usize> = eval_order.iter().copied().collect();
    let pick = |idx: &mut dyn Iterator<Item = usize>| -> Vec<PromptRecord> {
        let mut v: Vec<usize> = idx.collect();
        v.sort();
        v.into_iter().map(|i| kept[i].clone()).collect()
    };
    let train = pick(&mut (0..kept.len()).filter(|i| !eval_set.contains(i)));
    let eval = pick(&mut eval_set.iter().copied());
    std::fs::create_dir_all(out_dir).map_err(|source| DataError::Io {
        path: out_dir.to_path_buf(),
        source,
    })?;
    // the files in `outputs`' order: train, eval, then one per subset
    let mut files = Vec::new();
    let mut write = |path: &PathBuf, records: &[PromptRecord]| -> Result<(), DataError> {
        write_jsonl(path, records)?;
        files.push(path.clone());
        Ok(())
    };
    write(&outputs[0], &train)?;
    write(&outputs[1], &eval)?;
    for (k, path) in subsets.into_iter().zip(&outputs[2..]) {
        let sub = pick(&mut eval_order[..k].iter().copied());
        write(path, &sub)?;
    }
    Ok(CurateReport {
        read: records.len(),
        duplicates,
        too_short,
        missing_media,
        train: train.len(),
        eval: eval.len(),
        files,
    })
}

/// Opens and decodes one media file.
fn decode(path: &Path) -> Result<(), String> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    if !matches!(ext.as_str(), "png" | "jpg" | "jpeg") {
        return Err(format!(
            "cannot be decoded here (.{ext}: PNG and JPEG images only)"
        ));
    }
    let reader = image::ImageReader::open(path).map_err(|e| format!("cannot be opened: {e}"))?;
    let reader = reader
        .with_guessed_format()
        .map_err(|e| format!("cannot be read: {e}"))?;
    reader
        .decode()
        .map(|_| ())
        .map_err(|e| format!("does not decode: {e}"))
}

/// What [`inspect`] found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InspectReport {
    /// Records read per file, in the order given.
    pub records: Vec<(PathBuf, usize)>,
    /// Every problem found, with its file and line.
    pub problems: Vec<LineProblem>,
}

impl InspectReport {
    /// Whether nothing was found.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks a train file and eval files: every line a record with the required keys, a known
/// task, as many media files as placeholders, no sample id twice in a file, and no eval
/// record whose sample id or content is also in train (leakage); with `decode_media`, every
/// media file (relative paths from its JSONL's directory) is opened and decoded (PNG and
/// JPEG images; other media are reported as not checkable). Problems are collected, not
/// raised.
///
/// # Errors
/// IO errors of the JSONL files only.
pub fn inspect(
    train: &Path,
    evals: &[PathBuf],
    decode_media: bool,
) -> Result<InspectReport, DataError> {
    let mut report = InspectReport::default();
    let mut train_ids: HashMap<String, usize> = HashMap::new();
    let mut train_hashes: HashMap<String, usize> = HashMap::new();
    for (n, path) in std::iter::once(train)
        .chain(evals.iter().map(PathBuf::as_path))
        .enumerate()
    {
        let (records, problems) = parse_jsonl(path)?;
        report.problems.extend(problems);
        report.records.push((path.to_path_buf(), records.len()));
        let mut ids: HashMap<&str, usize> = HashMap::new();
        for (line, r) in &records {
            let mut problem = |problem: String| {
                report.problems.push(LineProblem {
                    path: path.to_path_buf(),
                    line: *line,
                    problem,
                })
            };
            if !TASKS.contains(&r.metadata.task.as_str()) {
                problem(format!(
                    "metadata.task {:?} is not one of {TASKS:?}",
                    r.metadata.task
                ));
            }
            if r.prompt.trim().is_empty() {
                problem("empty prompt".into());
            }
            if r.placeholders() != r.media.len() {
                problem(format!(
                    "{} placeholder(s) ({}) but {} media file(s)",
                    r.placeholders(),
                    PLACEHOLDERS.join(" / "),
                    r.media.len()
                ));
            }
            if let Some(first) = ids.insert(&r.metadata.sample_id, *line) {
                problem(format!(
                    "sample_id {:?} already on line {first}",
                    r.metadata.sample_id
                ));
            }
            if decode_media {
                let base = path.parent().unwrap_or(Path::new("."));
                for m in &r.media {
                    if let Err(e) = decode(&base.join(m)) {
                        problem(format!("media {m:?}: {e}"));
                    }
                }
            }
            if n == 0 {
                train_ids.insert(r.metadata.sample_id.clone(), *line);
                train_hashes.insert(r.content_hash(), *line);
            } else {
                if let Some(t) = train_ids.get(&r.metadata.sample_id) {
                    problem(format!(
                        "leakage: sample_id {:?} is also in {} (line {t})",
                        r.metadata.sample_id,
                        train.display()
                    ));
                } else if let Some(t) = train_hashes.get(&r.content_hash()) {
                    problem(format!(
                        "leakage: the same prompt and media are in {} (line {t})",
                        train.display()
                    ));
                }
            }
        }
    }
    Ok(report)
}
