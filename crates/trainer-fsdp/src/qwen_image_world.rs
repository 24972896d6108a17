//! The Qwen-Image world: a diffusers Qwen-Image directory as a [`World`].
//!
//! * **Policy.** `transformer/`, `dit-models`' [`QwenImageTransformer2DModel`], with the run's
//!   LoRA (or every parameter, under full fine-tuning).
//! * **Prompt encoder.** `tokenizer/` and `text_encoder/` through
//!   [`qwen_image::PromptEncoder`] (diffusers' `encode_prompt`, at the pipeline's default
//!   `max_sequence_length` of 512), frozen on the plain backend. A batch is padded to its
//!   longest prompt and carries the mask; the stored conditioning of a row is the padded row
//!   with its mask, so the replay sees exactly what the sampler fed the model.
//! * **Decoder.** `vae/` through [`qwen_image::Vae::decode_packed`]: the packed tokens
//!   unpacked, the latent normalisation undone, decoded, mapped to `[0, 1]` and quantised as
//!   diffusers' `numpy_to_pil` does.
//! * **Prompts.** `[data] train` and `[data] eval`, text-to-image records of the unified JSONL
//!   schema (`prompt-data`); a record's `metadata.category`, when it is a string, names its
//!   evaluation category (otherwise `t2i`).
//! * **Scorers.** `[reward] scorers` (the recipe's: PickScore).
//! * **Schedule.** `[sampling] scheduler`, which must give the sigmas of the directory's own
//!   `scheduler/scheduler_config.json` at the run's size and step count (the recipe's built-in
//!   Qwen-Image policy is the published one); another is refused with the file form to use.

use std::path::{Path, PathBuf};

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, DType, Tensor, TensorData};
use dit_models::{
    ImageShape, QwenImageConditioning, QwenImageConfig, QwenImageTransformer2DModel, WeightDtype,
};
use qwen_image::{FrozenComponents, PipelineIndex};
use reward::{Components, PickScore, RgbImage};
use schedule::SchedulePolicy;
use trajectory::Conditions;

use crate::config::{DataSection, SamplingSection, ScorerSpec, Trainable};
use crate::error::TrainerError;
use crate::prompt_files::{draw_distinct, read_t2i_records, train_pool};
use crate::rng::TrainerRng;
use crate::scorers::{ScorerSet, SharedScorer};
use crate::transformer_policy::{
    load_transformer_policy_in, restore_text_conditioning, score_images, store_text_conditioning,
    transformer_checkpoint_files,
};
use crate::world::{HeldOutPrompt, LoadedPolicy, World};

/// `QwenImagePipeline.__call__`'s default `max_sequence_length`: prompts are cut to this
/// many tokens after the template's.
pub const MAX_SEQUENCE_LENGTH: usize = 512;

/// The evaluation category of a record without a `metadata.category`.
pub const DEFAULT_CATEGORY: &str = "t2i";

/// The prompts of a `[data]` prompt file for the Qwen-Image world, with their categories:
/// every record must be a text-to-image (`t2i`) record without media.
///
/// # Errors
/// [`TrainerError::PromptFile`] listing every record that is not (or the file's read error).
pub fn read_prompt_file(path: &Path) -> Result<Vec<(String, String)>, TrainerError> {
    read_t2i_records(path, "Qwen-Image world", |r| {
        if r.prompt.trim().is_empty() {
            return Err("an empty prompt".into());
        }
        Ok(match r.metadata.extra.get("category") {
            Some(serde_json::Value::String(c)) => c.clone(),
            _ => DEFAULT_CATEGORY.to_string(),
        })
    })
}

/// The Qwen-Image world (see the module docs).
pub struct QwenImageWorld<Bi: Backend> {
    dir: PathBuf,
    variant: Option<String>,
    /// The frozen weights' dtype: f32 or bf16.
    dtype: DType,
    frozen: FrozenComponents<Bi>,
    height: usize,
    width: usize,
    /// The packed token grid (latent sides / 2).
    grid: (usize, usize),
    channels: usize,
    held_out: Vec<HeldOutPrompt>,
    train_pool: Vec<String>,
    scorer: SharedScorer,
}

impl<Bi: Backend> std::fmt::Debug for QwenImageWorld<Bi> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QwenImageWorld")
            .field("dir", &self.dir)
            .field("dtype", &self.dtype)
            .field("size", &(self.height, self.width))
            .field("held_out", &self.held_out.len())
            .field("train_pool", &self.train_pool.len())
            .finish()
    }
}

fn incompatible(
    key: &'static str,
    given: impl ToString,
    expected: impl Into<String>,
) -> TrainerError {
    TrainerError::Incompatible {
        key,
        given: given.to_string(),
        expected: expected.into(),
    }
}

impl<Bi: Backend> QwenImageWorld<Bi> {
    /// The world of the Qwen-Image directory `dir` at the image size of `sampling`: checks
    /// the directory's index, loads the tokenizer, the text encoder and the VAE (of `variant`'s
    /// weight files, when given), reads the transformer's configuration (the transformer itself
    /// is loaded by [`World::load_policy`]), reads the `[data]` prompt files and builds the
    /// scorers.
    ///
    /// # Errors
    /// The components' loading errors; [`TrainerError::Incompatible`] for an image size that
    /// is not a multiple of the VAE's scale factor times the transformer's patch, or components
    /// that do not fit together; [`TrainerError::PromptFile`] for missing or bad prompt files;
    /// scorer errors.
    pub fn load(
        dir: &Path,
        variant: Option<&str>,
        sampling: &SamplingSection,
        data: &DataSection,
        scorers: &[ScorerSpec],
        device: &Bi::Device,
    ) -> Result<Self, TrainerError>
    where
        PickScore<Bi>: Send + Sync,
    {
        Self::load_in(dir, variant, DType::F32, sampling, data, scorers, device)
    }

    /// [`QwenImageWorld::load`] with the frozen weights in `dtype` (`model.param_dtype`): the
    /// text encoder's and the VAE's here, the transformer's base by [`World::load_policy`].
    /// Conditioning is encoded in `dtype`; latents, velocities and images stay f32.
    ///
    /// # Errors
    /// As [`QwenImageWorld::load`].
    #[allow(clippy::too_many_arguments)]
    pub fn load_in(
        dir: &Path,
        variant: Option<&str>,
        dtype: DType,
        sampling: &SamplingSection,
        data: &DataSection,
        scorers: &[ScorerSpec],
        device: &Bi::Device,
    ) -> Result<Self, TrainerError>
    where
        PickScore<Bi>: Send + Sync,
    {
        if dtype != DType::F32 && dtype != DType::BF16 {
            return Err(incompatible(
                "model.param_dtype",
                format!("{dtype:?}"),
                "fp32 or bf16",
            ));
        }
        if !Bi::supports_dtype(device, dtype) {
            return Err(incompatible(
                "model.param_dtype",
                format!("{dtype:?}"),
                "a dtype this backend computes: it has no bf16 (burn's NdArray and wgpu do not; \
                 Flex and CUDA do); set model.param_dtype = \"fp32\"",
            ));
        }
        let index = PipelineIndex::open(dir)?;
        let dit =
            QwenImageConfig::from_diffusers_json(index.transformer_dir().join("config.json"))?;
        // the run samples with the configured schedule: it must be the directory's own
        let (h, w, n) = (
            sampling.height,
            sampling.width,
            sampling.num_inference_steps,
        );
        let configured = sampling.schedule_policy()?.sample_sigmas(h, w, n)?;
        let own = SchedulePolicy::load(index.scheduler_config())?
            .with_compat(sampling.schedule_compat.compat())
            .sample_sigmas(h, w, n)?;
        if configured.sigmas != own.sigmas {
            return Err(incompatible(
                "sampling.scheduler",
                format!(
                    "{:?} (sigmas {:?})",
                    sampling.scheduler,
                    configured.sigmas.as_slice()
                ),
                format!(
                    "the schedule of {} (sigmas {:?} at {w}x{h}, {n} steps): set sampling.scheduler = {{ file = \"{}\" }}",
                    index.scheduler_config().display(),
                    own.sigmas.as_slice(),
                    index.component("scheduler").display()
                ),
            ));
        }
        let frozen = FrozenComponents::<Bi>::load_in(index, variant, dtype, device)?;
        let z = frozen.vae_config.z_dim;
        let patch = dit.patch_size;
        if dit.in_channels != z * patch * patch {
            return Err(incompatible(
                "transformer in_channels",
                dit.in_channels,
                format!("the VAE's z_dim x patch_size^2 = {}", z * patch * patch),
            ));
        }
        if dit.joint_attention_dim != frozen.text_encoder_config.hidden_size {
            return Err(incompatible(
                "transformer joint_attention_dim",
                dit.joint_attention_dim,
                format!(
                    "the text encoder's hidden_size = {}",
                    frozen.text_encoder_config.hidden_size
                ),
            ));
        }
        let step = frozen.vae.scale_factor() * patch;
        let (height, width) = (sampling.height as usize, sampling.width as usize);
        for (key, side) in [("sampling.height", height), ("sampling.width", width)] {
            if side == 0 || !side.is_multiple_of(step) {
                return Err(incompatible(
                    key,
                    side,
                    format!(
                        "a positive multiple of {step} (the VAE's scale factor x the transformer's patch)"
                    ),
                ));
            }
        }
        let (Some(train_file), Some(eval_file)) = (&data.train, &data.eval) else {
            let absent: Vec<&str> = [("data.train", &data.train), ("data.eval", &data.eval)]
                .into_iter()
                .filter(|(_, p)| p.is_none())
                .map(|(k, _)| k)
                .collect();
            return Err(incompatible(
                "[data]",
                format!("{} absent", absent.join(" and ")),
                "data.train and data.eval, JSONL prompt files: the Qwen-Image world has no prompts of its own (the `prompts` example converts and curates them)",
            ));
        };
        let held_out: Vec<HeldOutPrompt> = read_prompt_file(eval_file)?
            .into_iter()
            .map(|(prompt, category)| HeldOutPrompt { prompt, category })
            .collect();
        let held_out_prompts: Vec<String> = held_out.iter().map(|h| h.prompt.clone()).collect();
        let train_pool = train_pool(
            train_file,
            read_prompt_file(train_file)?.into_iter().map(|(p, _)| p),
            &held_out_prompts,
        )?;
        let scorer = Box::new(ScorerSet::from_specs::<Bi>(scorers, None, device)?);
        Ok(Self {
            dir: dir.to_path_buf(),
            variant: variant.map(str::to_string),
            dtype,
            frozen,
            height,
            width,
            grid: (height / step, width / step),
            channels: dit.in_channels,
            held_out,
            train_pool,
            scorer,
        })
    }

    /// Replaces the scorer (tests inject one).
    pub fn with_scorer(mut self, scorer: SharedScorer) -> Self {
        self.scorer = scorer;
        self
    }

    fn image_shapes(&self) -> Vec<ImageShape> {
        vec![ImageShape::new(1, self.grid.0, self.grid.1)]
    }

    /// The conditioning of `prompts` on `device`.
    fn conditioning(
        &self,
        prompts: &[&str],
        device: &Bi::Device,
    ) -> Result<QwenImageConditioning<Bi>, TrainerError> {
        let embeds = self
            .frozen
            .prompt_encoder
            .encode(prompts, MAX_SEQUENCE_LENGTH, device)?;
        let [b, s, _] = embeds.embeds.dims();
        let mask: Vec<bool> = embeds.mask.iter().flatten().map(|&m| m != 0).collect();
        let mask = Tensor::<Bi, 2, Bool>::from_data(TensorData::new(mask, [b, s]), device);
        Ok(QwenImageConditioning {
            encoder_hidden_states: embeds.embeds,
            encoder_hidden_states_mask: Some(mask),
            img_shapes: self.image_shapes(),
        })
    }
}

impl<B: AutodiffBackend> World<B> for QwenImageWorld<B::InnerBackend> {
    type Cond<Bx: Backend> = QwenImageConditioning<Bx>;
    type Policy = QwenImageTransformer2DModel<B>;
    type Sample = RgbImage;

    fn name(&self) -> String {
        format!(
            "Qwen-Image world ({}, {}x{})",
            self.dir.display(),
            self.width,
            self.height
        )
    }

    fn latent_shape(&self) -> [usize; 2] {
        [self.grid.0 * self.grid.1, self.channels]
    }

    fn train_prompts(&self, rng: &mut TrainerRng, n: usize) -> Result<Vec<String>, TrainerError> {
        draw_distinct(rng, n, &self.train_pool)
    }

    fn held_out(&self) -> &[HeldOutPrompt] {
        &self.held_out
    }

    fn load_policy(
        &self,
        trainable: &Trainable,
        seed: u64,
        device: &B::Device,
    ) -> Result<LoadedPolicy<Self::Policy>, TrainerError> {
        let dtype = match self.dtype {
            DType::BF16 => WeightDtype::Bf16,
            _ => WeightDtype::F32,
        };
        load_transformer_policy_in::<B>(
            &self.dir.join("transformer"),
            self.variant.as_deref(),
            trainable,
            seed,
            dtype,
            device,
        )
    }

    fn encode(
        &self,
        prompts: &[&str],
        device: &B::Device,
    ) -> Result<QwenImageConditioning<B::InnerBackend>, TrainerError> {
        self.conditioning(prompts, device)
    }

    fn store_conditioning(
        &self,
        cond: &QwenImageConditioning<B::InnerBackend>,
        rows: &[usize],
    ) -> Result<Vec<Conditions>, TrainerError> {
        store_text_conditioning(cond, rows)
    }

    fn restore_conditioning<Bx: Backend>(
        &self,
        stored: &Conditions,
        rows: usize,
        device: &Bx::Device,
    ) -> Result<QwenImageConditioning<Bx>, TrainerError> {
        Ok(restore_text_conditioning(
            stored,
            rows,
            self.image_shapes(),
            device,
        ))
    }

    fn has_reference(&self, policy: &Self::Policy) -> bool {
        policy.lora_config().is_some()
    }

    fn reference_velocity(
        &self,
        policy: &Self::Policy,
        x: Tensor<B, 3>,
        sigma: Tensor<B, 1>,
        cond: &Self::Cond<B>,
    ) -> Result<Tensor<B, 3>, TrainerError> {
        crate::transformer_policy::transformer_reference_velocity(
            &World::<B>::name(self),
            policy,
            x,
            sigma,
            cond,
        )
    }

    fn decode(&self, latents: Tensor<B::InnerBackend, 3>) -> Result<Vec<RgbImage>, TrainerError> {
        let images = self
            .frozen
            .vae
            .decode_packed(latents, self.height, self.width)?;
        Ok(RgbImage::batch_from_tensor(images)?)
    }

    fn score(
        &self,
        samples: &[RgbImage],
        prompts: &[String],
    ) -> Result<Vec<Components>, TrainerError> {
        score_images(&self.scorer, samples, prompts)
    }

    fn image(&self, sample: &RgbImage) -> Option<RgbImage> {
        Some(sample.clone())
    }

    /// Under LoRA, the adapter as a PEFT adapter directory's two files, against the base
    /// `<model_path>/transformer`.
    fn checkpoint_files(
        &self,
        policy: &QwenImageTransformer2DModel<B>,
    ) -> Result<Vec<(&'static str, Vec<u8>)>, TrainerError> {
        transformer_checkpoint_files(policy, &self.dir.join("transformer"))
    }

    /// Every [`ExportForm`](crate::export::ExportForm) of the transformer, against the base
    /// `<model_path>/transformer`; the probe is the first two held-out prompts (the first one
    /// twice when there is one) at `sigma = 0.8, 0.3` on a fixed latent.
    fn export_policy(
        &self,
        policy: &QwenImageTransformer2DModel<B>,
        request: &crate::export::ExportRequest,
        out: &Path,
    ) -> Result<crate::export::ExportedPolicy, TrainerError> {
        let model = burn::module::AutodiffModule::valid(policy);
        let device = model.img_in.weight.lazy_device();
        let first = &self.held_out[0].prompt;
        let second = self.held_out.get(1).map_or(first, |h| &h.prompt);
        let cond = self.conditioning(&[first.as_str(), second.as_str()], &device)?;
        let [tokens, channels] = <Self as World<B>>::latent_shape(self);
        let (x, sigma) = crate::export::velocity_probe(tokens, channels, &device);
        crate::export::export_qwen_image_transformer(
            &<Self as World<B>>::name(self),
            model,
            &self.dir.join("transformer"),
            request,
            out,
            (x, sigma, &cond),
        )
    }
}
