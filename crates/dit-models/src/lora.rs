//! LoRA adapters on the model's `Linear` layers: attach, freeze the base, enable/disable per
//! call, merge/unmerge, Hugging Face PEFT import/export, and the adapter contract.
//!
//! An adapted layer computes `x·W + b + s·(x·A)·B` (`s = alpha / r`, or `alpha / sqrt(r)` with
//! rsLoRA), never the full-size `W + s·A·B`. Layers are selected as PEFT does with a list of
//! `target_modules`: a layer whose diffusers module name equals a target or ends with
//! `"." + target`. The default targets are the eight attention projections of every block.

use std::collections::BTreeMap;
use std::path::Path;

use burn::config::Config;
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor, TensorData};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use model_weights::transpose;

use crate::adapter_files::ImportDropout;
use crate::error::{ConfigProblem, ContractMismatch, DitError};
use crate::layers::{Linear, LoraAdapter};
use crate::model::{LayerMut, LayerRef, QwenImageTransformer2DModel, checkpoint_name};
use crate::weights::{
    Checkpoint, WeightDtype, device_tensor, safetensors_bytes, set_param, write_json,
};

/// The domain of [`QwenImageTransformer2DModel::attach_lora_keyed`]'s draws.
const LORA_A_DOMAIN: u64 = keyed_rng::fnv1a64(b"flowrl/dit-models/lora-a/v1");

/// The default LoRA targets: the eight attention projections of each block, image stream
/// (`attn.to_q/to_k/to_v/to_out.0`) and text stream
/// (`attn.add_q_proj/add_k_proj/add_v_proj/to_add_out`) — the reference recipe's
/// `lora_target_modules`.
pub const DEFAULT_TARGET_MODULES: [&str; 8] = [
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
];

/// PEFT's file of adapter weights.
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// PEFT's adapter configuration file.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// The adapter contract written next to every saved adapter.
pub const CONTRACT_FILE: &str = "adapter_contract.json";
/// Prefix of PEFT's saved keys (`PeftModel.save_pretrained` on a bare model).
pub const PEFT_KEY_PREFIX: &str = "base_model.model.";

/// A LoRA configuration (PEFT's `LoraConfig` fields: `r`, `lora_alpha`, `lora_dropout`,
/// `target_modules`, `use_rslora`).
///
/// ```
/// use dit_models::{DitError, LoraConfig};
///
/// let c = LoraConfig::new(64, 128.0);
/// assert_eq!(c.scale(), 2.0);
/// assert_eq!(c.target_modules.len(), 8);
/// assert!(c.validate().is_ok());
/// let err = LoraConfig::new(64, 128.0).with_dropout(0.1).validate().unwrap_err();
/// assert!(matches!(err, DitError::LoraDropout { given } if given == 0.1));
/// ```
#[derive(Config, Debug, PartialEq)]
pub struct LoraConfig {
    /// Rank `r` (PEFT `r`).
    pub rank: usize,
    /// `lora_alpha`; the adapter's scale is `alpha / r` (or `alpha / sqrt(r)` with rsLoRA).
    /// It cannot be recovered from the weights, which is why the contract records it.
    pub alpha: f64,
    /// Must be `0` (see [`DitError::LoraDropout`]).
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Module-name suffixes selecting the adapted `Linear` layers.
    #[config(default = "DEFAULT_TARGET_MODULES.iter().map(|s| s.to_string()).collect()")]
    pub target_modules: Vec<String>,
    /// rsLoRA scaling `alpha / sqrt(r)`.
    #[config(default = false)]
    pub use_rslora: bool,
}

impl LoraConfig {
    /// The adapter scale `s`.
    pub fn scale(&self) -> f64 {
        if self.use_rslora {
            self.alpha / (self.rank as f64).sqrt()
        } else {
            self.alpha / self.rank as f64
        }
    }

    /// Checks every field. A nonzero dropout alone is [`DitError::LoraDropout`]; together with
    /// other problems, all are listed in [`DitError::InvalidLora`].
    pub fn validate(&self) -> Result<(), DitError> {
        let mut problems = Vec::new();
        if self.rank == 0 {
            problems.push(ConfigProblem {
                field: "rank",
                given: "0".into(),
                allowed: "a positive integer".into(),
            });
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            problems.push(ConfigProblem {
                field: "alpha",
                given: self.alpha.to_string(),
                allowed: "a finite positive number".into(),
            });
        }
        if self.target_modules.is_empty() || self.target_modules.iter().any(|t| t.is_empty()) {
            problems.push(ConfigProblem {
                field: "target_modules",
                given: format!("{:?}", self.target_modules),
                allowed: "a non-empty list of non-empty module-name suffixes".into(),
            });
        }
        let dropout_bad = self.dropout != 0.0;
        match (problems.is_empty(), dropout_bad) {
            (true, false) => Ok(()),
            (true, true) => Err(DitError::LoraDropout {
                given: self.dropout,
            }),
            (false, _) => {
                if dropout_bad {
                    problems.push(ConfigProblem {
                        field: "dropout",
                        given: self.dropout.to_string(),
                        allowed: "0 (a stochastic forward breaks ratio == 1)".into(),
                    });
                }
                Err(DitError::InvalidLora { problems })
            }
        }
    }

    /// Whether the diffusers module `name` is selected: equal to a target or ending with
    /// `"." + target` (PEFT's rule for a list of targets).
    pub fn matches(&self, name: &str) -> bool {
        self.target_modules.iter().any(|t| matches_target(name, t))
    }
}

fn matches_target(name: &str, target: &str) -> bool {
    name == target
        || (name.len() > target.len()
            && name.ends_with(target)
            && name.as_bytes()[name.len() - target.len() - 1] == b'.')
}

/// What every saved adapter records, and every load checks (`adapter_contract.json`).
///
/// Alpha cannot be recovered from the weights: a wrong one silently rescales the policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdapterContract {
    /// Format tag, [`AdapterContract::FORMAT`].
    pub format: String,
    /// Rank `r`.
    pub rank: usize,
    /// `lora_alpha`.
    pub alpha: f64,
    /// Dropout (always 0 here).
    pub dropout: f64,
    /// Target-module suffixes, sorted.
    pub target_modules: Vec<String>,
    /// rsLoRA scaling.
    pub use_rslora: bool,
    /// The base model's hash ([`crate::weights::hash_tensors`]).
    pub base_model_hash: String,
}

impl AdapterContract {
    /// The current format tag.
    pub const FORMAT: &'static str = "dit-models/adapter-contract/1";

    /// The contract of `config` on the base with hash `base_model_hash`.
    pub fn new(config: &LoraConfig, base_model_hash: &str) -> Self {
        let mut targets = config.target_modules.clone();
        targets.sort();
        targets.dedup();
        Self {
            format: Self::FORMAT.into(),
            rank: config.rank,
            alpha: config.alpha,
            dropout: config.dropout,
            target_modules: targets,
            use_rslora: config.use_rslora,
            base_model_hash: base_model_hash.into(),
        }
    }

    /// Every field where `found` differs from `self` (the recorded / expected contract).
    pub fn mismatches(&self, found: &AdapterContract) -> Vec<ContractMismatch> {
        let mut out = Vec::new();
        let mut cmp = |field: &'static str, a: String, b: String| {
            if a != b {
                out.push(ContractMismatch {
                    field,
                    recorded: a,
                    found: b,
                });
            }
        };
        cmp("rank", self.rank.to_string(), found.rank.to_string());
        cmp("alpha", self.alpha.to_string(), found.alpha.to_string());
        cmp(
            "dropout",
            self.dropout.to_string(),
            found.dropout.to_string(),
        );
        cmp(
            "target_modules",
            format!("{:?}", self.target_modules),
            format!("{:?}", found.target_modules),
        );
        cmp(
            "use_rslora",
            self.use_rslora.to_string(),
            found.use_rslora.to_string(),
        );
        cmp(
            "base_model_hash",
            self.base_model_hash.clone(),
            found.base_model_hash.clone(),
        );
        out
    }
}

/// Collects `(burn path, requires grad)` of every float parameter.
struct GradVisitor {
    path: Vec<String>,
    out: Vec<(String, bool)>,
}

impl<B: Backend> ModuleVisitor<B> for GradVisitor {
    fn enter_module(&mut self, name: &str, _container: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.out
            .push((self.path.join("."), param.is_require_grad()));
    }
}

/// An adapter factor to load: its key, its stored shape `[rows, cols]` and the parameter that
/// holds it transposed, `[cols, rows]`.
type AdapterSlot<'a, B> = (String, [usize; 2], &'a mut Param<Tensor<B, 2>>);

fn freeze<B: Backend, const D: usize>(p: &mut Param<Tensor<B, D>>) {
    let v = p.val().detach();
    set_param(p, v, false);
}

impl<B: Backend> QwenImageTransformer2DModel<B> {
    /// Attaches a fresh adapter to every `Linear` layer `config` selects: `A` uniform in
    /// `±1/sqrt(d_in)` (PEFT's default, Kaiming-uniform with `a = sqrt(5)`), `B = 0`, so the
    /// adapted model starts equal to the base. Every base parameter is frozen (no gradient);
    /// only `lora_a` / `lora_b` require gradients.
    ///
    /// `A` is drawn from the backend's random stream (`Backend::seed`), which every thread of
    /// the process shares: a draw of another thread between a seed and this call changes it.
    /// [`QwenImageTransformer2DModel::attach_lora_keyed`] draws it from a key instead.
    ///
    /// Errors: an invalid configuration (dropout != 0 included), targets that match no layer,
    /// or an adapter already attached.
    pub fn attach_lora(self, config: &LoraConfig) -> Result<Self, DitError> {
        self.attach_lora_with(config, |_, shape, k, device| {
            Tensor::<B, 2>::random(shape, Distribution::Uniform(-k, k), device)
        })
    }

    /// [`QwenImageTransformer2DModel::attach_lora`] with each `A` a pure function of `seed`
    /// and the layer's diffusers module name: uniform in `±1/sqrt(d_in)` from
    /// [`keyed_rng::PcgStream`] keyed by `(seed, fnv1a64(name))`, row-major `[d_in, rank]`,
    /// computed on the host. The same on every backend, device, thread and rank, whatever else
    /// draws random numbers meanwhile; a layer's `A` does not depend on which other layers are
    /// adapted.
    ///
    /// Errors: as [`QwenImageTransformer2DModel::attach_lora`].
    pub fn attach_lora_keyed(self, config: &LoraConfig, seed: u64) -> Result<Self, DitError> {
        self.attach_lora_with(config, |name, [d_in, rank], k, device| {
            let mut g = keyed_rng::PcgStream::keyed(
                LORA_A_DOMAIN,
                &[seed, keyed_rng::fnv1a64(name.as_bytes())],
            );
            let values: Vec<f32> = (0..d_in * rank)
                .map(|_| ((2.0 * g.unit_f64() - 1.0) * k) as f32)
                .collect();
            Tensor::<B, 2>::from_data(TensorData::new(values, [d_in, rank]), device)
        })
    }

    /// The adapter attachment, `A` of each adapted layer from `draw_a(module name, [d_in,
    /// rank], bound, device)`.
    fn attach_lora_with(
        mut self,
        config: &LoraConfig,
        mut draw_a: impl FnMut(&str, [usize; 2], f64, &B::Device) -> Tensor<B, 2>,
    ) -> Result<Self, DitError> {
        config.validate()?;
        if self.lora_config.is_some() {
            return Err(DitError::AdapterAlreadyAttached);
        }
        let names = self.linear_names();
        let unmatched: Vec<String> = config
            .target_modules
            .iter()
            .filter(|t| !names.iter().any(|n| matches_target(n, t)))
            .cloned()
            .collect();
        if !unmatched.is_empty() {
            return Err(DitError::LoraTargetsUnmatched { targets: unmatched });
        }
        let device = self.img_in.weight.lazy_device();
        let scale = config.scale();
        for (path, layer) in self.layers_mut() {
            match layer {
                LayerMut::Linear(l) => {
                    freeze(&mut l.weight);
                    if let Some(b) = l.bias.as_mut() {
                        freeze(b);
                    }
                    let name = checkpoint_name(&path);
                    if config.matches(&name) {
                        let (d_in, d_out) = l.dims();
                        let k = 1.0 / (d_in as f64).sqrt();
                        let a = draw_a(&name, [d_in, config.rank], k, &device);
                        let b = Tensor::<B, 2>::zeros([config.rank, d_out], &device);
                        l.lora = Some(LoraAdapter {
                            lora_a: Param::from_tensor(a),
                            lora_b: Param::from_tensor(b),
                            scale,
                            merged: false,
                        });
                    }
                }
                LayerMut::Norm(n) => freeze(&mut n.weight),
            }
        }
        self.lora_config = Some(config.clone());
        Ok(self)
    }

    /// The attached adapter's configuration.
    pub fn lora_config(&self) -> Option<&LoraConfig> {
        self.lora_config.as_ref()
    }

    /// The diffusers module names carrying an adapter, in model order.
    pub fn adapted_modules(&self) -> Vec<String> {
        self.layers()
            .into_iter()
            .filter_map(|(p, l)| match l {
                LayerRef::Linear(l) if l.lora.is_some() => Some(checkpoint_name(&p)),
                _ => None,
            })
            .collect()
    }

    /// `(burn parameter path, requires gradient)` for every float parameter.
    pub fn param_requires_grad(&self) -> Vec<(String, bool)> {
        let mut v = GradVisitor {
            path: Vec::new(),
            out: Vec::new(),
        };
        self.visit(&mut v);
        v.out
    }

    fn map_adapted(mut self, f: impl Fn(&mut Linear<B>)) -> Self {
        for (_, layer) in self.layers_mut() {
            if let LayerMut::Linear(l) = layer
                && l.lora.is_some()
            {
                f(l);
            }
        }
        self
    }

    /// Folds every adapter into its base weight: `W <- W + s·A·B` (the only place the
    /// full-size product is formed). The adapter stays attached and marked merged: an
    /// enabled forward uses the folded weight alone, a disabled one subtracts `s·(x·A)·B`.
    /// Merging a merged adapter does nothing.
    pub fn merge_adapters(self) -> Self {
        self.map_adapted(|l| {
            let a = l.lora.as_mut().expect("adapted");
            if !a.merged {
                let delta = a.lora_a.val().matmul(a.lora_b.val()).mul_scalar(a.scale);
                let w = l.weight.val();
                let w = (w.clone() + model_weights::in_dtype(delta, w.dtype())).detach();
                set_param(&mut l.weight, w, false);
                a.merged = true;
            }
        })
    }

    /// Undoes [`Self::merge_adapters`]: `W <- W - s·A·B` (equal to the original base up to
    /// floating-point rounding).
    pub fn unmerge_adapters(self) -> Self {
        self.map_adapted(|l| {
            let a = l.lora.as_mut().expect("adapted");
            if a.merged {
                let delta = a.lora_a.val().matmul(a.lora_b.val()).mul_scalar(a.scale);
                let w = l.weight.val();
                let w = (w.clone() - model_weights::in_dtype(delta, w.dtype())).detach();
                set_param(&mut l.weight, w, false);
                a.merged = false;
            }
        })
    }

    /// The adapter contract of the attached adapter on this base: rank, alpha, dropout,
    /// targets, rsLoRA and the base-model hash (computed now if it is not known).
    pub fn adapter_contract(&mut self) -> Result<AdapterContract, DitError> {
        let config = self.lora_config.clone().ok_or(DitError::NoAdapter)?;
        let hash = match self.base_model_hash() {
            Some(h) => h.to_string(),
            None => self.compute_base_model_hash()?,
        };
        Ok(AdapterContract::new(&config, &hash))
    }

    /// Writes the adapter as a Hugging Face PEFT directory — `adapter_model.safetensors`
    /// (keys `base_model.model.{module}.lora_A.weight` `[r, d_in]` and `...lora_B.weight`
    /// `[d_out, r]`, f32) and `adapter_config.json` — plus `adapter_contract.json`, and
    /// returns the contract. `PeftModel.from_pretrained(QwenImageTransformer2DModel, dir)`
    /// loads it.
    ///
    /// Every file is written durably (`<file>.tmp`, fsync, rename, directory fsync): an
    /// interrupted save leaves no torn file. `adapter_config.json`, the file that makes the
    /// directory loadable, is written last, after the weights and the contract.
    pub fn save_peft_adapter(
        &mut self,
        dir: impl AsRef<Path>,
    ) -> Result<AdapterContract, DitError> {
        self.save_peft_adapter_for(dir, None)
    }

    /// [`Self::save_peft_adapter`] with `base_model_name_or_path` recorded in
    /// `adapter_config.json` (a hub id or the base model's directory; PEFT's
    /// `AutoPeftModel` loads the base from it).
    pub fn save_peft_adapter_for(
        &mut self,
        dir: impl AsRef<Path>,
        base_model_name_or_path: Option<&str>,
    ) -> Result<AdapterContract, DitError> {
        let dir = dir.as_ref();
        let contract = self.adapter_contract()?;
        let files = self.peft_adapter_files(base_model_name_or_path)?;
        std::fs::create_dir_all(dir).map_err(|e| DitError::io(dir, e))?;
        let write = |name: &str, bytes: &[u8]| {
            let path = dir.join(name);
            durable::write_atomic(&path, bytes)
                .map(|_| ())
                .map_err(|e| DitError::write(&path, e))
        };
        let [(_, weights), (_, config)] = files;
        write(ADAPTER_WEIGHTS_FILE, &weights)?;
        write_json(
            &dir.join(CONTRACT_FILE),
            &serde_json::to_value(&contract).expect("json"),
        )?;
        write(ADAPTER_CONFIG_FILE, &config)?;
        Ok(contract)
    }

    /// The two files of a PEFT adapter directory in memory — `adapter_model.safetensors` and
    /// `adapter_config.json`, the bytes [`Self::save_peft_adapter_for`] writes — for writers
    /// that place them themselves (a training checkpoint holds them beside its own files).
    pub fn peft_adapter_files(
        &mut self,
        base_model_name_or_path: Option<&str>,
    ) -> Result<[(&'static str, Vec<u8>); 2], DitError> {
        let config = self.lora_config.clone().ok_or(DitError::NoAdapter)?;
        let tensors = self.adapter_tensors(PEFT_KEY_PREFIX);
        let mut meta = BTreeMap::new();
        meta.insert("format".to_string(), "pt".to_string());
        let weights = safetensors_bytes(tensors, &meta);
        let mut peft_config = peft_config_json(&config);
        if let Some(base) = base_model_name_or_path {
            peft_config["base_model_name_or_path"] = base.into();
        }
        let json = serde_json::to_string_pretty(&peft_config).expect("json") + "\n";
        Ok([
            (ADAPTER_WEIGHTS_FILE, weights),
            (ADAPTER_CONFIG_FILE, json.into_bytes()),
        ])
    }

    /// Loads a PEFT LoRA adapter directory (PEFT's own `save_pretrained` output or
    /// [`Self::save_peft_adapter`]'s) onto this base model.
    ///
    /// The adapter is attached with the directory's `adapter_config.json` (unsupported PEFT
    /// features — DoRA, biases, per-module rank/alpha patterns, regex targets,
    /// `fan_in_fan_out` — are listed in [`DitError::UnsupportedAdapter`]; dropout != 0 is
    /// [`DitError::LoraDropout`]); missing, unexpected and mis-shaped adapter tensors are
    /// reported together. If the directory holds an `adapter_contract.json`, it must agree
    /// with the adapter config and with this base model's hash. If `expected` is given, the
    /// directory must hold a contract equal to it.
    pub fn load_peft_adapter(
        self,
        dir: impl AsRef<Path>,
        expected: Option<&AdapterContract>,
    ) -> Result<Self, DitError> {
        let dir = dir.as_ref();
        if !dir.join(ADAPTER_CONFIG_FILE).is_file() {
            let path = dir.join(ADAPTER_CONFIG_FILE);
            return Err(DitError::io(
                &path,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no PEFT adapter_config.json"),
            ));
        }
        let (model, _) = self.load_adapter(dir, ImportDropout::Refuse, expected)?;
        Ok(model)
    }

    /// Checks the attached adapter's contract against the one recorded beside its file and
    /// against `expected`; every disagreement listed.
    pub(crate) fn check_contracts(
        &mut self,
        recorded: Option<&AdapterContract>,
        expected: Option<&AdapterContract>,
    ) -> Result<(), DitError> {
        if recorded.is_none() && expected.is_none() {
            return Ok(());
        }
        let found = self.adapter_contract()?;
        let mut mismatches = Vec::new();
        if let Some(r) = recorded {
            mismatches.extend(r.mismatches(&found));
        }
        match (expected, recorded) {
            (Some(e), Some(r)) => mismatches.extend(e.mismatches(r)),
            (Some(e), None) => mismatches.push(ContractMismatch {
                field: "adapter_contract.json",
                recorded: format!("{e:?}"),
                found: "absent".into(),
            }),
            _ => {}
        }
        if mismatches.is_empty() {
            Ok(())
        } else {
            mismatches.dedup();
            Err(DitError::ContractMismatch { mismatches })
        }
    }

    pub(crate) fn load_adapter_tensors(&mut self, checkpoint: &Checkpoint) -> Result<(), DitError> {
        let device = self.img_in.weight.lazy_device();
        let ckpt = checkpoint.weights();
        // Keys may carry PEFT's prefix (PeftModel) or diffusers' `transformer.` prefix.
        let prefix = [PEFT_KEY_PREFIX, "transformer.", ""]
            .into_iter()
            .find(|p| {
                ckpt.keys()
                    .any(|k| k.starts_with(p) && k.contains(".lora_"))
            })
            .unwrap_or(PEFT_KEY_PREFIX);
        let mut slots: Vec<AdapterSlot<'_, B>> = Vec::new();
        for (path, layer) in self.layers_mut() {
            let LayerMut::Linear(l) = layer else { continue };
            let (d_in, d_out) = l.dims();
            let Some(a) = l.lora.as_mut() else { continue };
            let name = checkpoint_name(&path);
            let r = a.rank();
            slots.push((
                format!("{prefix}{name}.lora_A.weight"),
                [r, d_in],
                &mut a.lora_a,
            ));
            slots.push((
                format!("{prefix}{name}.lora_B.weight"),
                [d_out, r],
                &mut a.lora_b,
            ));
        }
        // Every missing, unexpected, mis-shaped and non-float key, before any is read.
        ckpt.check(slots.iter().map(|(k, s, _)| (k, s)), &[])?;
        for (key, [rows, cols], slot) in slots {
            let values = ckpt.read_f32(&key)?;
            let t = device_tensor::<B, 2>(
                transpose(&values, rows, cols),
                [cols, rows],
                WeightDtype::F32,
                &device,
            );
            set_param(slot, t, true);
        }
        Ok(())
    }
}

/// The `adapter_config.json` PEFT writes for a plain LoRA (the fields PEFT 0.21 reads; the
/// rest take PEFT's defaults).
pub(crate) fn peft_config_json(c: &LoraConfig) -> Value {
    let mut targets = c.target_modules.clone();
    targets.sort();
    targets.dedup();
    serde_json::json!({
        "peft_type": "LORA",
        "task_type": null,
        "base_model_name_or_path": null,
        "revision": null,
        "inference_mode": true,
        "r": c.rank,
        "lora_alpha": c.alpha,
        "lora_dropout": c.dropout,
        "target_modules": targets,
        "exclude_modules": null,
        "fan_in_fan_out": false,
        "bias": "none",
        "use_rslora": c.use_rslora,
        "use_dora": false,
        "modules_to_save": null,
        "init_lora_weights": true,
        "layers_to_transform": null,
        "layers_pattern": null,
        "rank_pattern": {},
        "alpha_pattern": {},
        "lora_bias": false,
    })
}

/// A PEFT `adapter_config.json`'s fields (read from `path`) as a [`LoraConfig`], listing
/// unsupported features; a nonzero dropout is refused or, under [`ImportDropout::Zero`], set to
/// 0 and returned.
pub(crate) fn peft_config_from_json(
    v: &Value,
    path: &Path,
    dropout_policy: ImportDropout,
) -> Result<(LoraConfig, Option<f64>), DitError> {
    let field = |f: &'static str, expected: &'static str| DitError::JsonField {
        path: path.into(),
        field: f,
        expected,
    };
    let mut problems = Vec::new();
    let mut unsupported = |f: &'static str, given: &Value, allowed: &str| {
        problems.push(ConfigProblem {
            field: f,
            given: given.to_string(),
            allowed: allowed.into(),
        })
    };
    let get = |f: &str| v.get(f).unwrap_or(&Value::Null);
    if let Some(t) = v.get("peft_type")
        && t != "LORA"
    {
        unsupported("peft_type", t, "\"LORA\"");
    }
    for f in ["use_dora", "fan_in_fan_out", "lora_bias"] {
        let x = get(f);
        if !(x.is_null() || *x == Value::Bool(false)) {
            unsupported(f, x, "false");
        }
    }
    let bias = get("bias");
    if !(bias.is_null() || bias == "none") {
        unsupported("bias", bias, "\"none\"");
    }
    for f in ["rank_pattern", "alpha_pattern"] {
        let x = get(f);
        if !(x.is_null() || x.as_object().is_some_and(|o| o.is_empty())) {
            unsupported(f, x, "empty (one rank and alpha for every module)");
        }
    }
    for f in ["layers_to_transform", "modules_to_save", "exclude_modules"] {
        let x = get(f);
        if !(x.is_null() || x.as_array().is_some_and(|a| a.is_empty())) {
            unsupported(f, x, "null");
        }
    }
    let targets: Vec<String> = match get("target_modules") {
        Value::Array(a) => a
            .iter()
            .map(|x| x.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| field("target_modules", "a list of strings"))?,
        other => {
            unsupported(
                "target_modules",
                other,
                "a list of module-name suffixes (regex strings are not supported)",
            );
            Vec::new()
        }
    };
    if !problems.is_empty() {
        return Err(DitError::UnsupportedAdapter { problems });
    }
    let rank = get("r")
        .as_u64()
        .ok_or_else(|| field("r", "a positive integer"))? as usize;
    let alpha = get("lora_alpha")
        .as_f64()
        .ok_or_else(|| field("lora_alpha", "a number"))?;
    let dropout = match get("lora_dropout") {
        Value::Null => 0.0,
        x => x
            .as_f64()
            .ok_or_else(|| field("lora_dropout", "a number"))?,
    };
    let use_rslora = get("use_rslora").as_bool().unwrap_or(false);
    let zeroed = (dropout != 0.0 && dropout_policy == ImportDropout::Zero).then_some(dropout);
    let config = LoraConfig::new(rank, alpha)
        .with_dropout(if zeroed.is_some() { 0.0 } else { dropout })
        .with_target_modules(targets)
        .with_use_rslora(use_rslora);
    config.validate()?;
    Ok((config, zeroed))
}
