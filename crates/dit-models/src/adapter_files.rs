//! Adapter files in the two forms the ecosystem writes: PEFT adapter directories
//! (`adapter_config.json` + `adapter_model.safetensors`) and diffusers LoRA files
//! (`pytorch_lora_weights.safetensors`, what `QwenImagePipeline.save_lora_weights` writes and
//! `load_lora_weights` reads).
//!
//! A diffusers LoRA file holds the factors under `transformer.{module}.lora_A.weight`
//! (`[r, d_in]`) and `...lora_B.weight` (`[d_out, r]`). Its LoRA configuration travels, when
//! it travels at all, as JSON in the safetensors header's `lora_adapter_metadata` entry, each
//! field prefixed with the component (`"transformer.r"`, `"transformer.lora_alpha"`, ...).
//! Without that entry diffusers takes the rank from the tensors and **alpha equal to the
//! rank** (scale 1): a file of an adapter trained with `alpha != r` loads at the wrong scale.
//! [`QwenImageTransformer2DModel::save_diffusers_lora`] therefore always writes the metadata,
//! and [`read_adapter`] says where the alpha it uses came from ([`AlphaSource`]).
//!
//! Importing for training: RL replays need a deterministic forward, so an adapter saved with
//! `lora_dropout != 0` (common for supervised LoRAs) is either refused or loaded with dropout
//! 0 ([`ImportDropout`]); the import reports which key it changed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use serde_json::Value;

use model_weights::transpose;

use crate::error::{ConfigProblem, DitError};
use crate::lora::{
    ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, AdapterContract, CONTRACT_FILE, LoraConfig,
    peft_config_from_json, peft_config_json,
};
use crate::model::{LayerRef, QwenImageTransformer2DModel, checkpoint_name};
use crate::weights::{Checkpoint, host_f32, write_json, write_safetensors};

/// diffusers' LoRA weights file (`LORA_WEIGHT_NAME_SAFE`).
pub const DIFFUSERS_LORA_FILE: &str = "pytorch_lora_weights.safetensors";
/// The component prefix of a diffusers pipeline LoRA's transformer keys and metadata fields.
pub const DIFFUSERS_TRANSFORMER_PREFIX: &str = "transformer.";
/// The safetensors header entry holding diffusers' adapter metadata (JSON).
pub const DIFFUSERS_METADATA_KEY: &str = "lora_adapter_metadata";

/// The two adapter file forms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdapterFormat {
    /// A PEFT adapter directory (`PeftModel.save_pretrained`).
    Peft,
    /// A diffusers LoRA file (`save_lora_weights`).
    Diffusers,
}

impl AdapterFormat {
    /// A short name for messages.
    pub fn as_str(self) -> &'static str {
        match self {
            AdapterFormat::Peft => "PEFT adapter",
            AdapterFormat::Diffusers => "diffusers LoRA",
        }
    }
}

/// What to do with an imported adapter's nonzero `lora_dropout`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ImportDropout {
    /// Refuse it ([`DitError::LoraDropout`]).
    #[default]
    Refuse,
    /// Load the adapter with dropout 0 and report the value dropped
    /// ([`AdapterImport::dropout_zeroed`]).
    Zero,
}

/// Where an imported adapter's `lora_alpha` came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlphaSource {
    /// The PEFT directory's `adapter_config.json`.
    AdapterConfig,
    /// The diffusers file's `lora_adapter_metadata`.
    Metadata,
    /// Neither: alpha = rank (scale 1), diffusers' own rule for a file without metadata.
    RankConvention,
}

/// An adapter file, read and checked, not yet attached to a model.
#[derive(Clone, Debug, PartialEq)]
pub struct AdapterImport {
    /// Its form.
    pub format: AdapterFormat,
    /// The safetensors file holding its factors.
    pub weights: PathBuf,
    /// The configuration it attaches with (dropout 0).
    pub config: LoraConfig,
    /// Where the alpha came from.
    pub alpha: AlphaSource,
    /// The nonzero `lora_dropout` the file gave, set to 0 under [`ImportDropout::Zero`].
    pub dropout_zeroed: Option<f64>,
    /// The `adapter_contract.json` found beside it, if any.
    pub contract: Option<AdapterContract>,
}

impl AdapterImport {
    /// One line for a log: form, file, rank, alpha and where it came from, and any dropout
    /// set to 0.
    pub fn describe(&self) -> String {
        let alpha = match self.alpha {
            AlphaSource::AdapterConfig => "from adapter_config.json",
            AlphaSource::Metadata => "from the file's lora_adapter_metadata",
            AlphaSource::RankConvention => {
                "= rank: the file has no lora_adapter_metadata (diffusers' rule, scale 1)"
            }
        };
        let mut s = format!(
            "{} {}: rank {}, alpha {} ({alpha}), {} target modules",
            self.format.as_str(),
            self.weights.display(),
            self.config.rank,
            self.config.alpha,
            self.config.target_modules.len(),
        );
        if let Some(d) = self.dropout_zeroed {
            s.push_str(&format!("; lora_dropout {d} set to 0 for RL"));
        }
        s
    }
}

/// Reads an adapter: a PEFT directory (one holding `adapter_config.json`), a directory
/// holding `pytorch_lora_weights.safetensors`, or a diffusers LoRA `.safetensors` file.
///
/// # Errors
/// [`DitError::NoAdapterFound`] for a path that is none of those; unsupported settings
/// ([`DitError::UnsupportedAdapter`], every one listed: DoRA, biases, per-module ranks,
/// non-diffusers key layouts, keys of other pipeline components); a nonzero dropout under
/// [`ImportDropout::Refuse`]; IO, JSON and safetensors errors.
pub fn read_adapter(path: &Path, dropout: ImportDropout) -> Result<AdapterImport, DitError> {
    let (format, dir, weights) = locate(path)?;
    let contract = read_contract(&dir.join(CONTRACT_FILE))?;
    match format {
        AdapterFormat::Peft => {
            let config_path = dir.join(ADAPTER_CONFIG_FILE);
            let text =
                std::fs::read_to_string(&config_path).map_err(|e| DitError::io(&config_path, e))?;
            let v: Value = serde_json::from_str(&text).map_err(|source| DitError::Json {
                path: config_path.clone(),
                source,
            })?;
            let (config, dropout_zeroed) = peft_config_from_json(&v, &config_path, dropout)?;
            Ok(AdapterImport {
                format,
                weights,
                config,
                alpha: AlphaSource::AdapterConfig,
                dropout_zeroed,
                contract,
            })
        }
        AdapterFormat::Diffusers => {
            let (config, alpha, dropout_zeroed) = diffusers_config(&weights, dropout)?;
            Ok(AdapterImport {
                format,
                weights,
                config,
                alpha,
                dropout_zeroed,
                contract,
            })
        }
    }
}

/// The form, the directory and the weights file of an adapter path.
fn locate(path: &Path) -> Result<(AdapterFormat, PathBuf, PathBuf), DitError> {
    let not_found = || DitError::NoAdapterFound { path: path.into() };
    if path.is_dir() {
        if path.join(ADAPTER_CONFIG_FILE).is_file() {
            return Ok((
                AdapterFormat::Peft,
                path.into(),
                path.join(ADAPTER_WEIGHTS_FILE),
            ));
        }
        if path.join(DIFFUSERS_LORA_FILE).is_file() {
            return Ok((
                AdapterFormat::Diffusers,
                path.into(),
                path.join(DIFFUSERS_LORA_FILE),
            ));
        }
        return Err(not_found());
    }
    if path.is_file() && path.extension().is_some_and(|e| e == "safetensors") {
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        // PEFT's own weights file, named directly: read its directory's config.
        if path.file_name().is_some_and(|n| n == ADAPTER_WEIGHTS_FILE)
            && dir.join(ADAPTER_CONFIG_FILE).is_file()
        {
            return Ok((AdapterFormat::Peft, dir, path.into()));
        }
        return Ok((AdapterFormat::Diffusers, dir, path.into()));
    }
    Err(not_found())
}

fn read_contract(path: &Path) -> Result<Option<AdapterContract>, DitError> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|e| DitError::io(path, e))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| DitError::Json {
            path: path.into(),
            source,
        })
}

/// The LoRA configuration of a diffusers LoRA file: from its metadata, or from its tensors
/// with alpha = rank.
fn diffusers_config(
    file: &Path,
    dropout: ImportDropout,
) -> Result<(LoraConfig, AlphaSource, Option<f64>), DitError> {
    let ckpt = Checkpoint::open(file)?;
    let mut problems = Vec::new();
    let problem =
        |problems: &mut Vec<ConfigProblem>, field: &'static str, given: String, allowed: &str| {
            problems.push(ConfigProblem {
                field,
                given,
                allowed: allowed.into(),
            })
        };
    // diffusers' Qwen-Image loader converts these layouts first; we do not.
    let foreign: Vec<&str> = ckpt
        .keys()
        .filter(|k| {
            k.ends_with(".alpha")
                || k.starts_with("lora_unet_")
                || k.starts_with("diffusion_model.")
                || k.contains("default.")
        })
        .take(3)
        .collect();
    if !foreign.is_empty() {
        problem(
            &mut problems,
            "key layout",
            format!("{foreign:?}"),
            "diffusers' own layout (`transformer.<module>.lora_A.weight`); kohya / \
             `diffusion_model.` / `.alpha` files need converting first (diffusers' \
             `QwenImagePipeline.lora_state_dict` then `save_lora_weights` does it)",
        );
    }
    let other: Vec<&str> = ckpt
        .keys()
        .filter(|k| !k.starts_with(DIFFUSERS_TRANSFORMER_PREFIX))
        .take(3)
        .collect();
    if foreign.is_empty() && !other.is_empty() {
        problem(
            &mut problems,
            "keys",
            format!("{other:?}"),
            "only the transformer's (`transformer.` prefix): this is not a transformer LoRA",
        );
    }
    let mut dora = false;
    let mut bias = false;
    let mut ranks: BTreeMap<String, usize> = BTreeMap::new();
    for k in ckpt.keys() {
        let Some(rest) = k.strip_prefix(DIFFUSERS_TRANSFORMER_PREFIX) else {
            continue;
        };
        dora |= rest.contains("lora_magnitude_vector") || rest.contains("dora_scale");
        bias |= rest.contains(".lora_B.") && rest.ends_with(".bias");
        if let Some(module) = rest.strip_suffix(".lora_A.weight")
            && let Some(stored) = ckpt.stored(k)
            && stored.shape.len() == 2
        {
            ranks.insert(module.to_string(), stored.shape[0]);
        }
    }
    if dora {
        problem(&mut problems, "use_dora", "true".into(), "false");
    }
    if bias {
        problem(&mut problems, "lora_bias", "true".into(), "false");
    }
    let metadata = ckpt
        .weights()
        .file_metadata()
        .find_map(|(_, m)| m.and_then(|m| m.get(DIFFUSERS_METADATA_KEY).cloned()));
    if metadata.is_none() {
        let distinct: BTreeSet<usize> = ranks.values().copied().collect();
        if distinct.len() > 1 {
            problem(
                &mut problems,
                "rank",
                format!("{distinct:?} (per module)"),
                "one rank for every module",
            );
        }
    }
    if ranks.is_empty() && problems.is_empty() {
        problem(
            &mut problems,
            "keys",
            "no `transformer.<module>.lora_A.weight`".into(),
            "at least one adapted module",
        );
    }
    if !problems.is_empty() {
        return Err(DitError::UnsupportedAdapter { problems });
    }
    match metadata {
        Some(text) => {
            let v: Value = serde_json::from_str(&text).map_err(|source| DitError::Json {
                path: file.into(),
                source,
            })?;
            let Value::Object(fields) = v else {
                return Err(DitError::JsonField {
                    path: file.into(),
                    field: DIFFUSERS_METADATA_KEY,
                    expected: "a JSON object",
                });
            };
            let ours: serde_json::Map<String, Value> = fields
                .into_iter()
                .filter_map(|(k, v)| {
                    k.strip_prefix(DIFFUSERS_TRANSFORMER_PREFIX)
                        .map(|k| (k.to_string(), v))
                })
                .collect();
            let (config, zeroed) = peft_config_from_json(&Value::Object(ours), file, dropout)?;
            Ok((config, AlphaSource::Metadata, zeroed))
        }
        None => {
            let rank = *ranks.values().next().expect("checked non-empty");
            let config = LoraConfig::new(rank, rank as f64)
                .with_target_modules(ranks.keys().cloned().collect());
            config.validate()?;
            Ok((config, AlphaSource::RankConvention, None))
        }
    }
}

/// The `lora_adapter_metadata` of a diffusers LoRA file for `config`: the PEFT config's fields
/// under the `transformer.` prefix, as JSON with sorted keys (diffusers' own
/// `json.dumps(..., indent=2, sort_keys=True)`).
fn diffusers_metadata(config: &LoraConfig) -> String {
    let Value::Object(fields) = peft_config_json(config) else {
        unreachable!("the PEFT config is an object")
    };
    let prefixed: serde_json::Map<String, Value> = fields
        .into_iter()
        .map(|(k, v)| (format!("{DIFFUSERS_TRANSFORMER_PREFIX}{k}"), v))
        .collect();
    serde_json::to_string_pretty(&Value::Object(prefixed)).expect("json")
}

impl<B: Backend> QwenImageTransformer2DModel<B> {
    /// Writes the adapter as a diffusers LoRA: `dir/pytorch_lora_weights.safetensors` (keys
    /// `transformer.{module}.lora_A.weight` `[r, d_in]` and `...lora_B.weight` `[d_out, r]`,
    /// f32, with the adapter's configuration in the header's `lora_adapter_metadata`, so that
    /// `QwenImagePipeline.load_lora_weights(dir)` applies it at the trained scale) plus
    /// `adapter_contract.json`; returns the contract. Every file is written durably.
    ///
    /// # Errors
    /// [`DitError::NoAdapter`] without an adapter; IO errors.
    pub fn save_diffusers_lora(
        &mut self,
        dir: impl AsRef<Path>,
    ) -> Result<AdapterContract, DitError> {
        let dir = dir.as_ref();
        let contract = self.adapter_contract()?;
        let config = self.lora_config().cloned().ok_or(DitError::NoAdapter)?;
        std::fs::create_dir_all(dir).map_err(|e| DitError::io(dir, e))?;
        let tensors = self.adapter_tensors(DIFFUSERS_TRANSFORMER_PREFIX);
        let mut meta = BTreeMap::new();
        meta.insert("format".to_string(), "pt".to_string());
        meta.insert(
            DIFFUSERS_METADATA_KEY.to_string(),
            diffusers_metadata(&config),
        );
        write_json(
            &dir.join(CONTRACT_FILE),
            &serde_json::to_value(&contract).expect("json"),
        )?;
        write_safetensors(&dir.join(DIFFUSERS_LORA_FILE), tensors, &meta)?;
        Ok(contract)
    }

    /// The adapter's factors in PyTorch layout under `prefix` (`lora_A` `[r, d_in]`,
    /// `lora_B` `[d_out, r]`, f32).
    pub(crate) fn adapter_tensors(&self, prefix: &str) -> Vec<(String, Vec<usize>, Vec<f32>)> {
        let mut tensors = Vec::new();
        for (path, layer) in self.layers() {
            if let LayerRef::Linear(l) = layer
                && let Some(a) = &l.lora
            {
                let name = checkpoint_name(&path);
                let (d_in, d_out) = l.dims();
                let r = a.rank();
                tensors.push((
                    format!("{prefix}{name}.lora_A.weight"),
                    vec![r, d_in],
                    transpose(&host_f32(a.lora_a.val()), d_in, r),
                ));
                tensors.push((
                    format!("{prefix}{name}.lora_B.weight"),
                    vec![d_out, r],
                    transpose(&host_f32(a.lora_b.val()), r, d_out),
                ));
            }
        }
        tensors
    }

    /// Loads an adapter in either form ([`read_adapter`]) onto this base model and returns it
    /// with what the import found. A contract beside the adapter (`adapter_contract.json`)
    /// must agree with the adapter and with this base's hash; with `expected`, the adapter's
    /// contract must equal it (a file without a contract is then refused).
    ///
    /// # Errors
    /// As [`read_adapter`]; [`DitError::ContractMismatch`]; missing, unexpected and mis-shaped
    /// factors, all listed.
    pub fn load_adapter(
        self,
        path: impl AsRef<Path>,
        dropout: ImportDropout,
        expected: Option<&AdapterContract>,
    ) -> Result<(Self, AdapterImport), DitError> {
        let import = read_adapter(path.as_ref(), dropout)?;
        let mut model = self.attach_lora(&import.config)?;
        model.check_contracts(import.contract.as_ref(), expected)?;
        let checkpoint = Checkpoint::open(&import.weights)?;
        model.load_adapter_tensors(&checkpoint)?;
        Ok((model, import))
    }
}
