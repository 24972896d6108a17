//! A whole diffusers Qwen-Image directory, read from its `model_index.json`: the tokenizer,
//! the text encoder and the VAE loaded here; the transformer's and the scheduler's
//! directories checked and handed on (the transformer is `dit-models`', which the caller
//! loads with its adapters; the schedule is the `schedule` crate's).

use std::path::{Path, PathBuf};

use burn::tensor::DType;
use burn::tensor::backend::Backend;
use serde_json::Value;

use crate::error::{ConfigProblem, QwenImageError, read_json};
use crate::prompt::PromptEncoder;
use crate::text_encoder::{TextEncoder, TextEncoderConfig};
use crate::tokenizer::QwenTokenizer;
use crate::vae::{Vae, VaeConfig};

/// File name of a diffusers pipeline's component index.
pub const MODEL_INDEX_FILE: &str = "model_index.json";

/// The pipeline class a Qwen-Image directory must record.
pub const PIPELINE_CLASS: &str = "QwenImagePipeline";

/// The components of a text-to-image Qwen-Image directory: name, the library and the classes
/// accepted for it.
pub const COMPONENTS: &[(&str, &str, &[&str])] = &[
    (
        "scheduler",
        "diffusers",
        &["FlowMatchEulerDiscreteScheduler"],
    ),
    (
        "text_encoder",
        "transformers",
        &["Qwen2_5_VLForConditionalGeneration"],
    ),
    (
        "tokenizer",
        "transformers",
        &["Qwen2Tokenizer", "Qwen2TokenizerFast"],
    ),
    ("transformer", "diffusers", &["QwenImageTransformer2DModel"]),
    ("vae", "diffusers", &["AutoencoderKLQwenImage"]),
];

/// Keys of `model_index.json` that are not components.
const INDEX_INERT: &[&str] = &["_class_name", "_diffusers_version", "_name_or_path"];

/// A Qwen-Image directory whose `model_index.json` checked out: every component the
/// text-to-image pipeline needs is named with an accepted class and its folder exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelineIndex {
    /// The directory.
    pub dir: PathBuf,
    /// The diffusers version that saved it, if recorded.
    pub diffusers_version: Option<String>,
}

impl PipelineIndex {
    /// Reads and checks `dir/model_index.json`: `_class_name` must be
    /// [`PIPELINE_CLASS`]; each of [`COMPONENTS`] must be present as `[library, class]` with
    /// an accepted class and have its folder; a component set to `null` (diffusers' way of
    /// leaving one out) or any other key is an error naming it. Every problem is listed.
    ///
    /// # Errors
    /// [`QwenImageError::Io`] / [`QwenImageError::Json`] for an unreadable index,
    /// [`QwenImageError::Config`] listing every problem.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, QwenImageError> {
        let dir = dir.as_ref();
        let path = dir.join(MODEL_INDEX_FILE);
        if !path.is_file() {
            return Err(QwenImageError::io(
                &path,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "not a diffusers pipeline directory (no model_index.json)",
                ),
            ));
        }
        let root = read_json(&path)?;
        let mut p = Vec::new();
        let Some(map) = root.as_object() else {
            return Err(QwenImageError::Config {
                path,
                problems: vec![ConfigProblem::new("(root)", &root, "a JSON object")],
            });
        };
        match map.get("_class_name") {
            Some(v) if v == PIPELINE_CLASS => {}
            v => p.push(ConfigProblem::new(
                "_class_name",
                v.unwrap_or(&Value::Null),
                format!("\"{PIPELINE_CLASS}\" (only the text-to-image pipeline is implemented)"),
            )),
        }
        for (name, library, classes) in COMPONENTS {
            let entry = map.get(*name);
            let pair = entry
                .and_then(Value::as_array)
                .and_then(|xs| match xs.as_slice() {
                    [Value::String(l), Value::String(c)] => Some((l.as_str(), c.as_str())),
                    _ => None,
                });
            match pair {
                Some((l, c)) if l == *library && classes.contains(&c) => {
                    if !dir.join(name).is_dir() {
                        p.push(ConfigProblem::new(
                            *name,
                            entry.unwrap(),
                            format!("a folder {name}/ next to model_index.json (it is missing)"),
                        ));
                    }
                }
                _ => p.push(ConfigProblem::new(
                    *name,
                    entry.map_or_else(|| "(absent)".to_string(), Value::to_string),
                    format!("[\"{library}\", one of {classes:?}]"),
                )),
            }
        }
        for (key, value) in map {
            let known = INDEX_INERT.contains(&key.as_str())
                || COMPONENTS.iter().any(|(name, ..)| name == key);
            if !known {
                p.push(ConfigProblem::new(
                    key,
                    value,
                    "no such component in the text-to-image Qwen-Image pipeline",
                ));
            }
        }
        if !p.is_empty() {
            return Err(QwenImageError::Config { path, problems: p });
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            diffusers_version: map
                .get("_diffusers_version")
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }

    /// A component's folder.
    pub fn component(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `transformer/`, for `dit-models`.
    pub fn transformer_dir(&self) -> PathBuf {
        self.component("transformer")
    }

    /// `scheduler/scheduler_config.json`, for the `schedule` crate.
    pub fn scheduler_config(&self) -> PathBuf {
        self.component("scheduler").join("scheduler_config.json")
    }
}

/// The frozen components of a Qwen-Image directory that turn prompts into conditioning and
/// latents into images.
#[derive(Debug)]
pub struct FrozenComponents<B: Backend> {
    /// The directory's index.
    pub index: PipelineIndex,
    /// Tokenizer and text encoder.
    pub prompt_encoder: PromptEncoder<B>,
    /// The text encoder's configuration.
    pub text_encoder_config: TextEncoderConfig,
    /// The VAE.
    pub vae: Vae<B>,
    /// The VAE's configuration.
    pub vae_config: VaeConfig,
}

impl<B: Backend> FrozenComponents<B> {
    /// Loads the tokenizer, the text encoder and the VAE of a checked directory, reading the
    /// `variant`'s weight files when given (`model.bf16.safetensors`,
    /// `diffusion_pytorch_model.bf16.safetensors`).
    ///
    /// # Errors
    /// Each component's loading errors, naming its files.
    pub fn load(
        index: PipelineIndex,
        variant: Option<&str>,
        device: &B::Device,
    ) -> Result<Self, QwenImageError> {
        Self::load_in(index, variant, DType::F32, device)
    }

    /// [`FrozenComponents::load`] with the text encoder's and the VAE's weights in `dtype`
    /// (bf16 halves their memory). Both compute in their weights' dtype and take and give
    /// tensors of any float dtype: the prompt embeddings come out in `dtype`, decoded images in
    /// the latents' dtype. Both components' weights are converted on the host as they are
    /// read, each value rounded to the nearest of `dtype`: the device never holds an `f32`
    /// copy of either.
    ///
    /// # Errors
    /// Each component's loading errors, naming its files.
    pub fn load_in(
        index: PipelineIndex,
        variant: Option<&str>,
        dtype: DType,
        device: &B::Device,
    ) -> Result<Self, QwenImageError> {
        let tokenizer = QwenTokenizer::from_dir(index.component("tokenizer"))?;
        let (text_encoder, text_encoder_config) = TextEncoder::from_dir_variant_in(
            index.component("text_encoder"),
            variant,
            dtype,
            device,
        )?;
        if tokenizer.vocab_size() > text_encoder_config.vocab_size {
            return Err(QwenImageError::input(
                "tokenizer",
                format!(
                    "{} tokens, but the text encoder embeds {} (the directory's tokenizer and text encoder do not belong together)",
                    tokenizer.vocab_size(),
                    text_encoder_config.vocab_size
                ),
            ));
        }
        let (vae, vae_config) =
            Vae::from_dir_variant_in(index.component("vae"), variant, dtype, device)?;
        Ok(Self {
            index,
            prompt_encoder: PromptEncoder::new(tokenizer, text_encoder),
            text_encoder_config,
            vae,
            vae_config,
        })
    }
}
