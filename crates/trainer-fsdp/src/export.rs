//! A committed checkpoint's policy in the forms the ecosystem loads, read-only on the run.
//!
//! [`export`] takes a run directory (its newest committed checkpoint, or `iteration`) or a
//! checkpoint's own `iter_*` directory, rebuilds the run's policy from its
//! `config.resolved.toml` (the world's base model, the adapter the config names; in f32
//! whatever `model.param_dtype` the run held its frozen weights in), loads the
//! checkpoint's trainable weights into it ([`CheckpointStore::load_weights`]: every file's hash
//! verified, nothing written; a run with `[ema]` exports its EMA copy,
//! [`CheckpointStore::load_copy`]) and hands it to the world ([`World::export_policy`]), which writes
//! one of the [`ExportForm`]s:
//!
//! * [`ExportForm::Peft`]: a PEFT adapter directory (`adapter_config.json`,
//!   `adapter_model.safetensors`), for `PeftModel.from_pretrained`;
//! * [`ExportForm::DiffusersLora`]: `pytorch_lora_weights.safetensors` with its LoRA config in
//!   the header, for `QwenImagePipeline.load_lora_weights` at the trained scale;
//! * [`ExportForm::Merged`]: a diffusers transformer directory with the adapter folded in (f32
//!   or bf16, sharded with an index above a size), for `from_pretrained`.
//!
//! With `verify`, the world reloads what it wrote the way a user would and compares its
//! forward with the checkpoint's own on a fixed probe; a difference above the form's tolerance
//! is an error and nothing is published.
//!
//! The output is written into a fresh sibling directory (`<out>.partial-<pid>`) and renamed
//! into place only once complete (and verified): an interrupted export leaves no half-written
//! `out`, and an export never mixes with files of an earlier one (a stale shard index, say).
//! An existing non-empty `out` is refused unless `overwrite`, which replaces it whole (the
//! earlier export is moved aside, the new one renamed into place, and only then is the earlier
//! one deleted).
//!
//! Once the run's config is read, before any checkpoint or model is and before anything is
//! written, an `out` that is, holds or lies inside the source directory named, the run
//! directory, the run's checkpoint directory or artifacts, the base model directory, or any
//! other model or file the export reads (reward models, `lora.init_from`, prompt files, a
//! scheduler file, the config itself) is refused ([`TrainerError::ExportOverlap`]): replacing
//! it would delete what the export reads, and writing into it would mix the export with the
//! run. Paths are compared resolved (symlinks followed, `..` folded; a not yet existing `out`
//! through its nearest existing ancestor).

use std::path::{Path, PathBuf};

use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use dit_models::{
    ExportDtype, ExportOptions, ImportDropout, LoadOptions, QwenImageConditioning,
    QwenImageTransformer2DModel, VelocityModel, WeightDtype,
};

use crate::checkpoint::{COMMITTED_FILE, CheckpointStore, CommittedCheckpoint};
use crate::config::{
    GeneratorSource, RESOLVED_CONFIG_FILE, SchedulerSource, ScorerSpec, TrainConfig,
};
use crate::dispatch::{WorldJob, with_world};
use crate::error::{TrainerError, io_err};
use crate::world::World;

/// An export form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportForm {
    /// A PEFT adapter directory.
    Peft,
    /// A diffusers LoRA file (`pytorch_lora_weights.safetensors`).
    DiffusersLora,
    /// A diffusers transformer directory, adapter merged.
    Merged,
}

impl ExportForm {
    /// Every form, in the order of [`ExportForm::as_str`]'s names.
    pub const ALL: [ExportForm; 3] = [
        ExportForm::Peft,
        ExportForm::DiffusersLora,
        ExportForm::Merged,
    ];

    /// The form's name on the command line: `peft`, `diffusers-lora`, `merged`.
    pub fn as_str(self) -> &'static str {
        match self {
            ExportForm::Peft => "peft",
            ExportForm::DiffusersLora => "diffusers-lora",
            ExportForm::Merged => "merged",
        }
    }

    /// The form named `name`.
    ///
    /// # Errors
    /// [`TrainerError::ExportRequest`] naming the forms there are.
    pub fn parse(name: &str) -> Result<Self, TrainerError> {
        Self::ALL
            .into_iter()
            .find(|f| f.as_str() == name)
            .ok_or_else(|| TrainerError::ExportRequest {
                problem: format!(
                    "unknown form {name:?}: expected one of {}",
                    Self::ALL.map(|f| f.as_str()).join(", ")
                ),
            })
    }

    /// Whether the form holds an adapter (as opposed to full weights).
    pub fn is_adapter(self) -> bool {
        !matches!(self, ExportForm::Merged)
    }
}

/// What to export and how.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportRequest {
    /// The form.
    pub form: ExportForm,
    /// The dtype of a merged export's weights (adapters are written in f32).
    pub dtype: ExportDtype,
    /// A merged export's largest shard in bytes (diffusers' rule: a tensor starts a new shard
    /// when it would overflow the current one); `None`: one file.
    pub max_shard_bytes: Option<u64>,
    /// Reload what was written and compare its forward with the checkpoint's.
    pub verify: bool,
}

impl ExportRequest {
    /// A request for `form` in f32, one file, verified.
    pub fn new(form: ExportForm) -> Self {
        Self {
            form,
            dtype: ExportDtype::F32,
            max_shard_bytes: None,
            verify: true,
        }
    }

    /// Every problem of the request.
    ///
    /// # Errors
    /// [`TrainerError::ExportRequest`]: a dtype or sharding asked of an adapter form, a shard
    /// size of 0.
    pub fn validate(&self) -> Result<(), TrainerError> {
        let mut problems = Vec::new();
        if self.form.is_adapter() && self.dtype != ExportDtype::F32 {
            problems.push(format!(
                "--dtype {} applies to the merged form only ({} adapters are written in f32)",
                dtype_name(self.dtype),
                self.form.as_str()
            ));
        }
        if self.form.is_adapter() && self.max_shard_bytes.is_some() {
            problems.push(format!(
                "--max-shard-bytes applies to the merged form only (a {} export is one small file)",
                self.form.as_str()
            ));
        }
        if self.max_shard_bytes == Some(0) {
            problems.push("--max-shard-bytes must be positive".into());
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(TrainerError::ExportRequest {
                problem: problems.join("; "),
            })
        }
    }
}

/// A dtype's name on the command line.
pub fn dtype_name(d: ExportDtype) -> &'static str {
    match d {
        ExportDtype::F32 => "f32",
        ExportDtype::Bf16 => "bf16",
    }
}

/// How a reloaded export compared with the checkpoint's policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Verification {
    /// How it was reloaded (e.g. "the base plus the PEFT adapter directory").
    pub reloaded_as: String,
    /// The largest absolute difference of the velocities on the probe.
    pub max_abs: f64,
    /// The tolerance it was held to.
    pub tolerance: f64,
    /// The probe's size (values compared).
    pub values: usize,
}

/// What a world's export wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportedPolicy {
    /// The files written, relative to the output directory.
    pub files: Vec<PathBuf>,
    /// The base model the export applies to (a diffusers transformer directory).
    pub base_model: PathBuf,
    /// The verification, when asked for.
    pub verification: Option<Verification>,
}

/// What [`export`] did.
#[derive(Debug, Clone)]
pub struct ExportReport {
    /// The checkpoint exported.
    pub checkpoint: CommittedCheckpoint,
    /// The run's config it rebuilt the policy from.
    pub config: PathBuf,
    /// The form.
    pub form: ExportForm,
    /// Where the export now is.
    pub out: PathBuf,
    /// The world's account.
    pub exported: ExportedPolicy,
    /// The earlier export `overwrite` replaced, if any.
    pub replaced: bool,
}

/// Where an export reads from: the run config and the checkpoint.
#[derive(Debug, Clone)]
struct Source {
    config: PathBuf,
    /// A checkpoint named directly (`iter_*` directory).
    iteration: Option<u64>,
}

/// Finds the run config and the checkpoint `path` names: a run directory (holding
/// `config.resolved.toml`) or a committed `iter_*` directory below one.
fn locate(path: &Path, config: Option<&Path>) -> Result<Source, TrainerError> {
    let bad = |problem: String| TrainerError::ExportSource {
        path: path.to_path_buf(),
        problem,
    };
    if !path.is_dir() {
        return Err(bad("not a directory".into()));
    }
    let iteration = if path.join(COMMITTED_FILE).is_file() {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        Some(
            crate::checkpoint::parse_iteration(name)
                .ok_or_else(|| bad(format!("{name:?} is not an iter_<N> checkpoint directory")))?,
        )
    } else {
        None
    };
    let config = match config {
        Some(c) => c.to_path_buf(),
        None => path
            .ancestors()
            .take(5)
            .map(|d| d.join(RESOLVED_CONFIG_FILE))
            .find(|c| c.is_file())
            .ok_or_else(|| {
                bad(format!(
                    "no {RESOLVED_CONFIG_FILE} here or in the directories above: name a run \
                     directory, a committed iter_<N> directory inside one, or the run's config \
                     with --config"
                ))
            })?,
    };
    Ok(Source { config, iteration })
}

/// Everything an export of `path` (located as `source`, its config `cfg`) reads or that
/// belongs to the run, each with what it is: its output must lie apart from all of them.
fn guarded_paths(path: &Path, source: &Source, cfg: &TrainConfig) -> Vec<(PathBuf, String)> {
    let mut guarded = vec![(
        path.to_path_buf(),
        if source.iteration.is_some() {
            "the checkpoint exported".to_string()
        } else {
            "the run directory exported".to_string()
        },
    )];
    // a run's own config sits in its run directory: that directory is the run's
    if source.config.file_name() == Some(RESOLVED_CONFIG_FILE.as_ref()) {
        let run_dir = match source.config.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        guarded.push((
            run_dir,
            format!("the run directory (holding its {RESOLVED_CONFIG_FILE})"),
        ));
    } else {
        guarded.push((source.config.clone(), "the run's config".into()));
    }
    guarded.push((
        cfg.checkpoint.dir.clone(),
        "the run's checkpoint directory (checkpoint.dir)".into(),
    ));
    guarded.push((
        cfg.artifacts.root.clone(),
        "the run's artifacts (artifacts.root)".into(),
    ));
    guarded.push(match &cfg.model.generator {
        GeneratorSource::ShapesWorld { dir } => (
            dir.clone(),
            "the base model directory (model.generator.shapes_world.dir)".into(),
        ),
        GeneratorSource::QwenImage { model_path, .. } => (
            model_path.clone(),
            "the base model directory (model.generator.qwen_image.model_path)".into(),
        ),
    });
    for scorer in &cfg.reward.scorers {
        if let ScorerSpec::Pickscore { model_path } = scorer {
            guarded.push((
                model_path.clone(),
                "a reward model directory (reward.scorers)".into(),
            ));
        }
    }
    if let Some(from) = cfg.lora.as_ref().and_then(|l| l.init_from.as_ref()) {
        guarded.push((
            from.clone(),
            "the adapter the run started from (lora.init_from)".into(),
        ));
    }
    if let SchedulerSource::File(file) = &cfg.sampling.scheduler {
        guarded.push((
            file.clone(),
            "the scheduler config (sampling.scheduler)".into(),
        ));
    }
    for (file, key) in [
        (&cfg.data.train, "data.train"),
        (&cfg.data.eval, "data.eval"),
    ] {
        if let Some(file) = file {
            guarded.push((file.clone(), format!("a prompt file ({key})")));
        }
    }
    guarded
}

/// `path` as [`durable::resolved`] gives it, or as it stands where the current directory
/// cannot be read.
fn resolved(path: &Path) -> PathBuf {
    durable::resolved(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Refuses an `out` that is, holds or lies inside any of `guarded` (compared [`resolved`]).
///
/// # Errors
/// [`TrainerError::ExportOverlap`] naming the first such path, what it is and how `out`
/// relates to it.
fn check_out_apart(out: &Path, guarded: &[(PathBuf, String)]) -> Result<(), TrainerError> {
    let o = resolved(out);
    for (input, what) in guarded {
        let i = resolved(input);
        let relation = if o == i {
            "is"
        } else if i.starts_with(&o) {
            "holds"
        } else if o.starts_with(&i) {
            "lies inside"
        } else {
            continue;
        };
        return Err(TrainerError::ExportOverlap {
            out: out.to_path_buf(),
            input: input.clone(),
            what: what.clone(),
            relation,
        });
    }
    Ok(())
}

/// Exports the policy of a committed checkpoint; see the module docs.
///
/// `path` is a run directory or a committed `iter_<N>` directory; `iteration` picks another
/// committed checkpoint of the run (the newest by default); `config` overrides where the
/// run's resolved config is looked for.
///
/// # Errors
/// [`TrainerError::ExportSource`] (no run config, no committed checkpoint, an iteration that
/// is not committed), [`TrainerError::ExportRequest`], [`TrainerError::ExportOverlap`] (an
/// `out` that is, holds or lies inside the run, its checkpoints or anything the export reads;
/// nothing is written), [`TrainerError::ExportTarget`] (an existing non-empty `out` without
/// `overwrite`), [`TrainerError::ExportUnsupported`] (a
/// world or trainable mode without that form), [`TrainerError::ExportVerify`], and the
/// checkpoint, model and IO errors underneath.
pub fn export<B: AutodiffBackend>(
    path: &Path,
    iteration: Option<u64>,
    config: Option<&Path>,
    out: &Path,
    request: &ExportRequest,
    overwrite: bool,
    device: &B::Device,
) -> Result<ExportReport, TrainerError> {
    request.validate()?;
    let source = locate(path, config)?;
    let mut cfg = TrainConfig::from_file(&source.config, &[])?;
    // Exports are made from f32 base weights whatever the run held them in
    // (`model.param_dtype`): an adapter's files do not depend on it, and a merged export then
    // merges into the checkpoint's f32 base, not a rounded one.
    cfg.model.param_dtype = None;
    // before anything is written: `overwrite` replaces `out` whole, and writing into the run
    // or what the export reads would not leave it read-only
    check_out_apart(out, &guarded_paths(path, &source, &cfg))?;
    let store = CheckpointStore::new(&cfg.checkpoint.dir, &cfg.run.task, None)?;
    let committed = store.committed()?;
    let wanted = match (source.iteration, iteration) {
        (Some(a), Some(b)) if a != b => {
            return Err(TrainerError::ExportSource {
                path: path.to_path_buf(),
                problem: format!("names checkpoint {a} and --iteration {b}"),
            });
        }
        (a, b) => a.or(b),
    };
    let checkpoint = match wanted {
        Some(i) => committed.iter().find(|c| c.iteration == i).cloned(),
        None => committed.last().cloned(),
    }
    .ok_or_else(|| TrainerError::ExportSource {
        path: path.to_path_buf(),
        problem: match wanted {
            Some(i) => format!(
                "checkpoint {i} is not committed in {} (committed: {:?})",
                store.task_dir().display(),
                committed.iter().map(|c| c.iteration).collect::<Vec<_>>()
            ),
            None => format!("no committed checkpoint in {}", store.task_dir().display()),
        },
    })?;
    if out.exists() && !overwrite && !is_empty_dir(out)? {
        return Err(TrainerError::ExportTarget {
            path: out.to_path_buf(),
            problem: "exists and is not empty (--overwrite replaces it)".into(),
        });
    }
    let staging = staging_dir(out)?;
    let job = ExportJob::<B> {
        cfg: &cfg,
        store: &store,
        checkpoint: &checkpoint,
        request,
        staging: &staging,
        device: device.clone(),
    };
    let exported = match with_world(&cfg, device, job) {
        Ok(e) => e,
        Err(e) => {
            // a failed (or unverified) export is not published
            let _ = std::fs::remove_dir_all(&staging);
            return Err(e);
        }
    };
    let replaced = publish(&staging, out)?;
    Ok(ExportReport {
        checkpoint,
        config: source.config,
        form: request.form,
        out: out.to_path_buf(),
        exported,
        replaced,
    })
}

fn is_empty_dir(path: &Path) -> Result<bool, TrainerError> {
    if !path.is_dir() {
        return Ok(false);
    }
    Ok(std::fs::read_dir(path)
        .map_err(io_err(path, "read the export directory"))?
        .next()
        .is_none())
}

/// A fresh directory beside `out` to write the export into.
fn staging_dir(out: &Path) -> Result<PathBuf, TrainerError> {
    let name = out
        .file_name()
        .ok_or_else(|| TrainerError::ExportTarget {
            path: out.to_path_buf(),
            problem: "has no final component to name the export directory".into(),
        })?
        .to_string_lossy()
        .into_owned();
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(io_err(&parent, "create"))?;
    let staging = parent.join(format!("{name}.partial-{}", std::process::id()));
    if staging.exists() {
        std::fs::remove_dir_all(&staging)
            .map_err(io_err(&staging, "remove a stale staging directory"))?;
    }
    std::fs::create_dir(&staging).map_err(io_err(&staging, "create"))?;
    Ok(staging)
}

/// Moves the complete export into place, replacing what was there; `true` when something was
/// replaced. The earlier export is moved aside (`<out>.replaced-<pid>`), the new one renamed
/// into place, and only then is the earlier one deleted; should the new one fail to move into
/// place, the earlier one is moved back.
fn publish(staging: &Path, out: &Path) -> Result<bool, TrainerError> {
    let replaced = out.exists();
    let mut old = out.as_os_str().to_owned();
    old.push(format!(".replaced-{}", std::process::id()));
    let old = PathBuf::from(old);
    if replaced {
        std::fs::rename(out, &old).map_err(io_err(out, "move the earlier export aside"))?;
    }
    if let Err(e) = std::fs::rename(staging, out) {
        if replaced {
            // best effort: the earlier export back where it was
            let _ = std::fs::rename(&old, out);
        }
        return Err(io_err(out, "publish the export")(e));
    }
    if let Some(parent) = out.parent() {
        let parent = if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        };
        durable::sync_dir(parent)?;
    }
    if replaced {
        std::fs::remove_dir_all(&old).map_err(io_err(&old, "remove the earlier export"))?;
    }
    Ok(replaced)
}

/// [`export`]'s world job: the run's policy, the checkpoint's weights, the world's export.
struct ExportJob<'a, B: AutodiffBackend> {
    cfg: &'a TrainConfig,
    store: &'a CheckpointStore,
    checkpoint: &'a CommittedCheckpoint,
    request: &'a ExportRequest,
    staging: &'a Path,
    device: B::Device,
}

impl<B: AutodiffBackend> WorldJob<B> for ExportJob<'_, B> {
    type Output = ExportedPolicy;

    fn run<W: World<B>>(self, world: W) -> Result<ExportedPolicy, TrainerError> {
        let trainable = self.cfg.trainable()?;
        let loaded = world.load_policy(&trainable, self.cfg.run.seed, &self.device)?;
        let (policy, _) = self.store.load_weights::<B, _>(
            self.checkpoint,
            loaded.model,
            loaded.contract.as_ref(),
        )?;
        // a run with [ema] hands out its EMA copy (the weights its evaluations sampled with)
        let policy = if self.cfg.ema.is_some() {
            self.store.load_copy::<B, _>(
                self.checkpoint,
                crate::checkpoint::EMA_FILE,
                policy,
                crate::checkpoint::SavedDtype::Widen,
            )?
        } else {
            policy
        };
        world.export_policy(&policy, self.request, self.staging)
    }
}

/// The fixed probe an export's verification compares velocities on: two samples of
/// `[tokens, channels]` latents (`sin(0.618 i)`) at `sigma = 0.8` and `0.3`.
pub fn velocity_probe<Bi: burn::tensor::backend::Backend>(
    tokens: usize,
    channels: usize,
    device: &Bi::Device,
) -> (Tensor<Bi, 3>, Tensor<Bi, 1>) {
    let values: Vec<f32> = (0..2 * tokens * channels)
        .map(|i| (i as f32 * 0.618).sin())
        .collect();
    let x = Tensor::from_data(
        burn::tensor::TensorData::new(values, [2, tokens, channels]),
        device,
    );
    (x, Tensor::from_floats([0.8, 0.3], device))
}

/// The Qwen-Image transformer's export, for every world whose policy is a
/// [`QwenImageTransformer2DModel`]: `model` (the checkpoint's policy on a plain backend) in
/// `request.form` into `out`, against the base transformer directory `base`; with
/// `request.verify`, reloaded from `out` (the base plus the adapter file, or the merged
/// directory alone) and compared on the velocities of `probe` (`x`, `sigma`, conditioning).
///
/// Tolerances (max abs over the probe, relative to `max(1, max |v|)`): `1e-5` for the adapter
/// forms (an f32 round trip of the factors: expected exact), `1e-4` for the merged f32 form
/// (`W + s·A·B` folded once), `5e-2` for the merged bf16 form (every weight rounded to 8
/// significant bits).
///
/// # Errors
/// [`TrainerError::ExportUnsupported`] for an adapter form of a model without an adapter
/// (full fine-tuning exports the merged form), [`TrainerError::ExportVerify`], model and IO
/// errors.
pub fn export_qwen_image_transformer<Bi: burn::tensor::backend::Backend>(
    world: &str,
    mut model: QwenImageTransformer2DModel<Bi>,
    base: &Path,
    request: &ExportRequest,
    out: &Path,
    probe: (Tensor<Bi, 3>, Tensor<Bi, 1>, &QwenImageConditioning<Bi>),
) -> Result<ExportedPolicy, TrainerError> {
    if request.form.is_adapter() && model.lora_config().is_none() {
        return Err(TrainerError::ExportUnsupported {
            world: world.to_string(),
            form: request.form.as_str(),
            reason: "the run trains every parameter (no adapter): export the merged form".into(),
        });
    }
    let base_name = base.to_string_lossy().into_owned();
    let contract = match request.form {
        ExportForm::Peft => Some(model.save_peft_adapter_for(out, Some(&base_name))?),
        ExportForm::DiffusersLora => Some(model.save_diffusers_lora(out)?),
        ExportForm::Merged => {
            model.save_merged_diffusers(
                out,
                ExportOptions {
                    dtype: request.dtype,
                    max_shard_bytes: request.max_shard_bytes,
                },
            )?;
            None
        }
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(out)
        .map_err(io_err(out, "list the export"))?
        .map(|e| e.map(|e| PathBuf::from(e.file_name())))
        .collect::<Result<_, _>>()
        .map_err(io_err(out, "list the export"))?;
    files.sort();
    let verification = if request.verify {
        let device = model.img_in.weight.lazy_device();
        let load = |dir: &Path| {
            QwenImageTransformer2DModel::<Bi>::from_pretrained(
                dir,
                &device,
                LoadOptions {
                    dtype: WeightDtype::F32,
                    hash: contract.is_some(),
                    variant: None,
                },
            )
        };
        let (reloaded, reloaded_as, tolerance) = match request.form {
            ExportForm::Peft | ExportForm::DiffusersLora => {
                let (m, _) =
                    load(base)?.load_adapter(out, ImportDropout::Refuse, contract.as_ref())?;
                let what = format!(
                    "the base {} plus the {} in the export",
                    base.display(),
                    if request.form == ExportForm::Peft {
                        "PEFT adapter"
                    } else {
                        "diffusers LoRA file"
                    }
                );
                (m, what, 1e-5)
            }
            ExportForm::Merged => {
                let tol = match request.dtype {
                    ExportDtype::F32 => 1e-4,
                    ExportDtype::Bf16 => 5e-2,
                };
                (
                    load(out)?,
                    "the merged transformer directory".to_string(),
                    tol,
                )
            }
        };
        let (x, sigma, cond) = probe;
        let want = model
            .velocity(x.clone(), sigma.clone(), cond)
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .expect("f32");
        let got = reloaded
            .velocity(x, sigma, cond)
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .expect("f32");
        let (max_abs, tolerance, close) = reloaded_is_close(&want, &got, tolerance);
        if !close {
            return Err(TrainerError::ExportVerify {
                reloaded_as,
                max_abs,
                tolerance,
            });
        }
        Some(Verification {
            reloaded_as,
            max_abs,
            tolerance,
            values: want.len(),
        })
    } else {
        None
    };
    Ok(ExportedPolicy {
        files,
        base_model: base.to_path_buf(),
        verification,
    })
}

/// The largest absolute difference of two equally long slices; NaN when any value is NaN
/// (or the lengths differ), so that a NaN never reads as agreement.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::NAN;
    }
    a.iter().zip(b).fold(0.0f64, |m, (x, y)| {
        let d = (*x as f64 - *y as f64).abs();
        if m.is_nan() || d.is_nan() {
            f64::NAN
        } else {
            m.max(d)
        }
    })
}

/// The largest difference between the policy's output `want` and the reloaded one's `got`,
/// the tolerance `relative` scaled by the largest `|want|` (at least 1), and whether the
/// difference is within it. A non-finite value on either side fails: an infinity in `want`
/// would make the tolerance infinite and pass anything, so it makes the scale NaN instead.
fn reloaded_is_close(want: &[f32], got: &[f32], relative: f64) -> (f64, f64, bool) {
    let scale = want.iter().fold(1.0f64, |m, v| {
        if m.is_nan() || !v.is_finite() {
            f64::NAN
        } else {
            m.max(f64::from(v.abs()))
        }
    });
    let max_abs = max_abs_diff(want, got);
    let tolerance = relative * scale;
    let close = !max_abs.is_nan() && !tolerance.is_nan() && max_abs <= tolerance;
    (max_abs, tolerance, close)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use burn::backend::{Autodiff, Flex};

    use super::*;
    use crate::config::{Override, RecipeName};

    #[test]
    fn a_reload_is_close_only_where_both_sides_are_finite() {
        // within the tolerance scaled by the largest |want| (here 4)
        let (d, tol, ok) = reloaded_is_close(&[1.0, -4.0], &[1.0, -4.0 + 1e-6], 1e-6);
        assert!(ok && (tol - 4e-6).abs() < 1e-18 && d > 0.0, "{d} {tol}");
        assert!(!reloaded_is_close(&[1.0, -4.0], &[1.0, -3.9], 1e-6).2);
        // an infinity in the reference would make the tolerance infinite: refused
        let (_, tol, ok) = reloaded_is_close(&[f32::INFINITY, 1.0], &[f32::INFINITY, 1.0], 1e-6);
        assert!(!ok && tol.is_nan());
        assert!(!reloaded_is_close(&[f32::INFINITY, 1.0], &[0.0, 1.0], 1e-6).2);
        assert!(!reloaded_is_close(&[1.0], &[f32::NAN], 1e-6).2);
        assert!(!reloaded_is_close(&[1.0], &[1.0, 2.0], 1e-6).2);
    }

    /// Every file under `root` with its bytes, and every directory (`None`).
    fn snapshot(root: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
        fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, Option<Vec<u8>>>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() && !p.is_symlink() {
                    out.insert(p.clone(), None);
                    walk(&p, out);
                } else {
                    out.insert(p.clone(), std::fs::read(&p).ok());
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(root, &mut out);
        out
    }

    /// A shapes-world LoRA run laid out under `root` without training it: its run directory
    /// `root/run` (holding its `config.resolved.toml` and a log), its checkpoints under
    /// `root/ckpt` (one committed-looking `iter_0000000`), its artifacts under
    /// `root/artifacts`, its base model `root/generator` (a transformer config). Returns the
    /// run directory and the checkpoint's directory.
    fn laid_out_run(root: &Path) -> (PathBuf, PathBuf) {
        let dir = |name: &str| root.join(name).display().to_string();
        let overrides = Override::parse_all(&[
            format!("model.generator.shapes_world.dir={}", dir("generator")),
            format!("checkpoint.dir={}", dir("ckpt")),
            format!("artifacts.root={}", dir("artifacts")),
        ])
        .unwrap();
        let cfg = TrainConfig::from_recipe(RecipeName::ShapesWorldLora, &overrides).unwrap();
        let run_dir = root.join("run");
        std::fs::create_dir_all(&run_dir).unwrap();
        cfg.save_resolved(&run_dir).unwrap();
        std::fs::write(run_dir.join("metrics.jsonl"), b"{}\n").unwrap();
        let iter = root.join("ckpt").join(&cfg.run.task).join("iter_0000000");
        std::fs::create_dir_all(&iter).unwrap();
        std::fs::write(iter.join(COMMITTED_FILE), b"{}").unwrap();
        std::fs::write(iter.join("model.mpk"), b"weights").unwrap();
        std::fs::create_dir_all(root.join("artifacts/rollout_0")).unwrap();
        std::fs::create_dir_all(root.join("generator/transformer")).unwrap();
        std::fs::write(root.join("generator/transformer/config.json"), b"{}").unwrap();
        (run_dir, iter)
    }

    fn exp(
        source: &Path,
        config: Option<&Path>,
        iteration: Option<u64>,
        out: &Path,
    ) -> Result<ExportReport, TrainerError> {
        export::<Autodiff<Flex>>(
            source,
            iteration,
            config,
            out,
            &ExportRequest::new(ExportForm::Peft),
            true,
            &Default::default(),
        )
    }

    /// The overlap `export` refused `out` for: (what, relation).
    fn overlap(r: Result<ExportReport, TrainerError>) -> (String, &'static str) {
        match r {
            Err(TrainerError::ExportOverlap {
                what,
                relation,
                out,
                input,
            }) => {
                let msg = TrainerError::ExportOverlap {
                    out: out.clone(),
                    input: input.clone(),
                    what: what.clone(),
                    relation,
                }
                .to_string();
                assert!(
                    msg.contains(&out.display().to_string())
                        && msg.contains(&input.display().to_string()),
                    "{msg}"
                );
                (what, relation)
            }
            Err(e) => panic!("expected an overlap refusal, got: {e}"),
            Ok(r) => panic!(
                "expected an overlap refusal, exported to {}",
                r.out.display()
            ),
        }
    }

    #[test]
    fn an_out_overlapping_the_run_or_what_it_reads_is_refused_before_anything_is_written() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let (run_dir, iter) = laid_out_run(root);
        let config = run_dir.join(RESOLVED_CONFIG_FILE);
        let before = snapshot(root);
        let run = "the run directory exported";

        // the audit's cases: the run itself, its parent, a directory inside it
        assert_eq!(
            overlap(exp(&run_dir, None, None, &run_dir)),
            (run.into(), "is")
        );
        assert_eq!(
            overlap(exp(&run_dir, None, None, root)),
            (run.into(), "holds")
        );
        assert_eq!(
            overlap(exp(&run_dir, None, None, &run_dir.join("exports/peft"))),
            (run.into(), "lies inside")
        );
        // the same directory spelled through `..` (of a directory that does not exist), and
        // through a symlink
        assert_eq!(
            overlap(exp(&run_dir, None, None, &root.join("exports/../run"))),
            (run.into(), "is")
        );
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(&run_dir, root.join("link")).unwrap();
            assert_eq!(
                overlap(exp(&run_dir, None, None, &root.join("link"))),
                (run.into(), "is")
            );
            assert_eq!(
                overlap(exp(&run_dir, None, None, &root.join("link/x/../y"))),
                (run.into(), "lies inside")
            );
            std::fs::remove_file(root.join("link")).unwrap();
        }

        // the base model directory, and its transformer inside it
        let base = "the base model directory (model.generator.shapes_world.dir)";
        assert_eq!(
            overlap(exp(&run_dir, None, None, &root.join("generator"))),
            (base.into(), "is")
        );
        assert_eq!(
            overlap(exp(
                &run_dir,
                None,
                None,
                &root.join("generator/transformer")
            )),
            (base.into(), "lies inside")
        );

        // checkpoints and artifacts kept outside the run directory
        let ckpt = "the run's checkpoint directory (checkpoint.dir)";
        assert_eq!(
            overlap(exp(&run_dir, None, None, &root.join("ckpt"))),
            (ckpt.into(), "is")
        );
        assert_eq!(
            overlap(exp(&run_dir, None, None, &root.join("ckpt/t2i/exports"))),
            (ckpt.into(), "lies inside")
        );
        assert_eq!(
            overlap(exp(&run_dir, None, None, &root.join("artifacts"))),
            ("the run's artifacts (artifacts.root)".into(), "is")
        );

        // a checkpoint named directly (its config named): the checkpoint, and its run
        let one = "the checkpoint exported";
        assert_eq!(
            overlap(exp(&iter, Some(&config), None, &iter)),
            (one.into(), "is")
        );
        assert_eq!(
            overlap(exp(&iter, Some(&config), None, &root.join("ckpt/t2i"))),
            (one.into(), "holds")
        );
        assert_eq!(
            overlap(exp(&iter, Some(&config), None, &run_dir.join("peft"))),
            (
                "the run directory (holding its config.resolved.toml)".into(),
                "lies inside"
            )
        );

        // nothing was written or removed by any refusal
        assert_eq!(before, snapshot(root));

        // an `out` beside the run is not refused for overlap: this export goes on to look
        // for its checkpoint (before anything is written)
        let err = exp(&run_dir, None, Some(5), &root.join("exports/peft")).unwrap_err();
        assert!(matches!(err, TrainerError::ExportSource { .. }), "{err}");
        assert_eq!(before, snapshot(root));
    }

    #[test]
    fn every_model_and_file_the_export_reads_is_guarded() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let (run_dir, _) = laid_out_run(root);
        let source = locate(&run_dir, None).unwrap();
        let mut cfg = TrainConfig::from_file(&source.config, &[]).unwrap();
        cfg.reward.scorers.push(ScorerSpec::Pickscore {
            model_path: root.join("models/pickscore"),
        });
        cfg.lora.as_mut().unwrap().init_from = Some(root.join("adapters/start"));
        cfg.data.train = Some(root.join("prompts/train.jsonl"));
        cfg.sampling.scheduler = SchedulerSource::File(root.join("sched/scheduler_config.json"));
        let guarded = guarded_paths(&run_dir, &source, &cfg);
        let refused = |out: &str| match check_out_apart(&root.join(out), &guarded) {
            Err(TrainerError::ExportOverlap { what, relation, .. }) => (what, relation),
            other => panic!("{out}: {other:?}"),
        };
        assert_eq!(
            refused("models"),
            ("a reward model directory (reward.scorers)".into(), "holds")
        );
        assert_eq!(
            refused("adapters/start"),
            (
                "the adapter the run started from (lora.init_from)".into(),
                "is"
            )
        );
        assert_eq!(
            refused("prompts"),
            ("a prompt file (data.train)".into(), "holds")
        );
        assert_eq!(
            refused("sched"),
            ("the scheduler config (sampling.scheduler)".into(), "holds")
        );
        // beside all of them
        for out in ["exports/peft", "models2", "adapters/other", "run2"] {
            check_out_apart(&root.join(out), &guarded).unwrap();
        }
    }

    #[test]
    fn resolved_paths_follow_what_exists_and_fold_the_rest() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        assert_eq!(resolved(&root.join("a/./b")), root.join("a/b"));
        assert_eq!(resolved(&root.join("a/nope/../b")), root.join("a/b"));
        assert_eq!(
            resolved(&root.join("a/nope/x/../../b/c")),
            root.join("a/b/c")
        );
        assert_eq!(resolved(&root.join("a/b/../..")), root);
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(root.join("a/b"), root.join("l")).unwrap();
            // `..` of a symlink is the parent of what it points to, as the file system has it
            assert_eq!(resolved(&root.join("l/..")), root.join("a"));
            assert_eq!(resolved(&root.join("l/new/x")), root.join("a/b/new/x"));
        }
        // a relative path resolves against the working directory
        let cwd = std::env::current_dir().unwrap().canonicalize().unwrap();
        assert_eq!(resolved(Path::new("no-such-dir/../x")), cwd.join("x"));
    }

    #[test]
    fn publishing_replaces_the_earlier_export_only_once_the_new_one_is_in_place() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let out = root.join("out");
        std::fs::create_dir(&out).unwrap();
        std::fs::write(out.join("old.json"), b"old").unwrap();

        // a staging directory that cannot be moved into place: the earlier export is put back
        let err = publish(&root.join("missing.partial"), &out).unwrap_err();
        assert!(matches!(err, TrainerError::Io { .. }), "{err}");
        assert_eq!(std::fs::read(out.join("old.json")).unwrap(), b"old");
        let names = |d: &Path| {
            let mut v: Vec<String> = std::fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(root), ["out"]);

        let staging = staging_dir(&out).unwrap();
        std::fs::write(staging.join("new.json"), b"new").unwrap();
        assert!(publish(&staging, &out).unwrap());
        assert_eq!(names(&out), ["new.json"]);
        assert_eq!(
            names(root),
            ["out"],
            "no staging or replaced directory left"
        );
    }
}
