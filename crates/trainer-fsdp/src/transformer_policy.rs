//! What every world whose policy is the Qwen-Image transformer (`dit-models`) shares: loading
//! the policy with its adapter, the adapter's files in a checkpoint, the text conditioning's
//! stored form, and scoring decoded images.

use std::path::Path;

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, Tensor, TensorData};
use dit_models::{
    ImageShape, LoadOptions, QwenImageConditioning, QwenImageTransformer2DModel, WeightDtype,
};
use reward::{Batch, Components, RgbImage};
use sde_math::StorageDtype;
use trajectory::{Conditions, Digest, StoredTensor};

use crate::config::Trainable;
use crate::error::TrainerError;
use crate::scorers::SharedScorer;
use crate::world::LoadedPolicy;

/// Loads a Qwen-Image transformer directory as the policy `trainable` asks for: the base
/// weights (their hash is the trajectories' weight hash), then a fresh LoRA adapter (its `A`
/// a pure function of `seed` and the layer's name,
/// [`dit_models::QwenImageTransformer2DModel::attach_lora_keyed`]), an imported one, or none
/// (full fine-tuning).
///
/// # Errors
/// Loading and adapter errors; [`TrainerError::InitAdapterChanged`] when the imported adapter
/// is not what preflight read.
pub fn load_transformer_policy<B: AutodiffBackend>(
    transformer_dir: &Path,
    variant: Option<&str>,
    trainable: &Trainable,
    seed: u64,
    device: &B::Device,
) -> Result<LoadedPolicy<QwenImageTransformer2DModel<B>>, TrainerError> {
    load_transformer_policy_in::<B>(
        transformer_dir,
        variant,
        trainable,
        seed,
        WeightDtype::F32,
        device,
    )
}

/// [`load_transformer_policy`] with the base weights in `dtype` (bf16 converted on the host,
/// one tensor at a time). A LoRA adapter, fresh or imported, is f32 whatever the base's dtype;
/// the model takes and gives f32 tensors
/// ([`QwenImageTransformer2DModel::compute_dtype`]).
///
/// # Errors
/// As [`load_transformer_policy`].
pub fn load_transformer_policy_in<B: AutodiffBackend>(
    transformer_dir: &Path,
    variant: Option<&str>,
    trainable: &Trainable,
    seed: u64,
    dtype: WeightDtype,
    device: &B::Device,
) -> Result<LoadedPolicy<QwenImageTransformer2DModel<B>>, TrainerError> {
    let options = LoadOptions {
        dtype,
        hash: true,
        variant: variant.map(str::to_string),
    };
    let mut dit =
        QwenImageTransformer2DModel::<B>::from_pretrained(transformer_dir, device, options)?;
    let weight_hash = Digest::sha256(dit.base_model_hash().unwrap_or_default().as_bytes());
    let mut contract = None;
    match trainable {
        Trainable::Lora(lora) => {
            // the adapter is keyed; the backend's stream is seeded still, for any draw of
            // the run's own that might come after
            B::seed(device, seed);
            dit = dit.attach_lora_keyed(lora, seed)?;
            contract = Some(dit.adapter_contract()?);
        }
        Trainable::LoraFrom(init) => {
            let (model, import) = dit.load_adapter(&init.path, init.dropout, None)?;
            if import.config != init.config {
                return Err(TrainerError::InitAdapterChanged {
                    path: init.path.clone(),
                    found: import.describe(),
                });
            }
            dit = model;
            contract = Some(dit.adapter_contract()?);
        }
        Trainable::Full => {}
    }
    Ok(LoadedPolicy {
        model: dit,
        contract,
        weight_hash,
    })
}

/// The velocity of a transformer policy's reference: the same model with its LoRA adapters
/// off, detached ([`TrainerError::NoReference`] without adapters: for a full fine-tune the run
/// keeps a frozen pretrained copy instead).
pub(crate) fn transformer_reference_velocity<B: Backend>(
    world: &str,
    policy: &QwenImageTransformer2DModel<B>,
    x: Tensor<B, 3>,
    sigma: Tensor<B, 1>,
    cond: &QwenImageConditioning<B>,
) -> Result<Tensor<B, 3>, TrainerError> {
    use velocity_model::VelocityModel;
    if policy.lora_config().is_none() {
        return Err(TrainerError::NoReference {
            world: world.to_string(),
            keys: "a reference term".into(),
        });
    }
    Ok(policy.without_adapters().velocity(x, sigma, cond).detach())
}

/// Scores decoded images with their prompts (no per-sample metadata).
///
/// # Errors
/// Scorer errors.
pub(crate) fn score_images(
    scorer: &SharedScorer,
    samples: &[RgbImage],
    prompts: &[String],
) -> Result<Vec<Components>, TrainerError> {
    let meta: Vec<serde_json::Value> = vec![serde_json::Value::Null; prompts.len()];
    Ok(scorer.score(Batch::new(Some(samples), Some(prompts), Some(&meta))?)?)
}

/// Under LoRA, the adapter as a PEFT adapter directory's two files against the base
/// `transformer_dir` (so that a checkpoint directory loads with `PeftModel.from_pretrained`);
/// nothing under full fine-tuning (the merged export writes the whole transformer).
///
/// # Errors
/// Model errors.
pub(crate) fn transformer_checkpoint_files<B: AutodiffBackend>(
    policy: &QwenImageTransformer2DModel<B>,
    transformer_dir: &Path,
) -> Result<Vec<(&'static str, Vec<u8>)>, TrainerError> {
    if policy.lora_config().is_none() {
        return Ok(Vec::new());
    }
    let base = transformer_dir.display().to_string();
    Ok(burn::module::AutodiffModule::valid(policy)
        .peft_adapter_files(Some(&base))?
        .into())
}

/// The stored text conditioning of rows `rows`: the states at `f32` (exactly what the
/// sampler fed the model) and the mask.
///
/// # Errors
/// Non-finite states.
pub fn store_text_conditioning<Bx: Backend>(
    cond: &QwenImageConditioning<Bx>,
    rows: &[usize],
) -> Result<Vec<Conditions>, TrainerError> {
    let states = cond
        .encoder_hidden_states
        .clone()
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("f32");
    let [_, t, d] = cond.encoder_hidden_states.dims();
    let mask: Vec<bool> = match &cond.encoder_hidden_states_mask {
        // through int: GPU backends store bools as u8, the CPU backend natively
        Some(m) => m
            .clone()
            .int()
            .into_data()
            .iter::<i64>()
            .map(|v| v != 0)
            .collect(),
        None => Vec::new(),
    };
    rows.iter()
        .map(|&r| {
            Ok(Conditions {
                text_embeddings: StoredTensor::from_f32(
                    "conditions.text",
                    &states[r * t * d..(r + 1) * t * d],
                    vec![t, d],
                    StorageDtype::F32,
                )?,
                text_mask: if mask.is_empty() {
                    vec![true; t]
                } else {
                    mask[r * t..(r + 1) * t].to_vec()
                },
                extra: std::collections::BTreeMap::new(),
            })
        })
        .collect()
}

/// The text conditioning of `rows` candidates sharing one stored condition, on any backend.
pub fn restore_text_conditioning<Bx: Backend>(
    stored: &Conditions,
    rows: usize,
    img_shapes: Vec<ImageShape>,
    device: &Bx::Device,
) -> QwenImageConditioning<Bx> {
    let shape = stored.text_embeddings.shape().to_vec();
    let values = stored.text_embeddings.to_f32();
    let states =
        Tensor::<Bx, 3>::from_data(TensorData::new(values, [1, shape[0], shape[1]]), device)
            .repeat_dim(0, rows);
    let mask = Tensor::<Bx, 2, Bool>::from_data(
        TensorData::new(stored.text_mask.clone(), [1, shape[0]]),
        device,
    )
    .repeat_dim(0, rows);
    QwenImageConditioning {
        encoder_hidden_states: states,
        encoder_hidden_states_mask: Some(mask),
        img_shapes,
    }
}
