//! PickScore (Kirstain et al. 2023, "Pick-a-Pic"): a CLIP-H/14 fine-tuned on human preferences,
//! the reward of the validated text-to-image recipe.
//!
//! The reference (`PickScore`'s README, `calc_probs`) embeds the image and the prompt, divides
//! each embedding by its L2 norm and scores `model.logit_scale.exp() * (text_embs @
//! image_embs.T)`, i.e. `exp(logit_scale) * cos(image, text)` (about 20 for typical pairs; the
//! softmax over candidates it goes on to compute is not a per-sample reward). Some RL code
//! (Flow-GRPO's `PickScoreScorer`) divides that by 26 to bring it near `[0, 1]`:
//! [`PickScoreScale::LogitsOver26`] is that variant, chosen explicitly.
//!
//! Images enter as bytes (the references' `(x * 255).round().clamp(0, 255)`, see
//! [`crate::quantize_unit`]) and go through [`ClipImageProcessor`]; prompts go through
//! [`ClipTokenizer`] (truncated to the text tower's 77 positions, padded to the longest in the
//! chunk as the reference's `padding=True`).

use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;

use crate::clip::{
    CONFIG_FILE, Checkpoint, ClipConfig, ClipImageProcessor, ClipModel, ClipTokenizer,
    PREPROCESSOR_FILE, Padding,
};
use crate::error::{ConfigProblem, RewardError};
use crate::scorer::{Batch, Components, Input, Scorer};

/// The component PickScore produces.
pub const PICKSCORE_COMPONENT: &str = "pickscore";

/// The scale of the score.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PickScoreScale {
    /// `exp(logit_scale) * cos(image, text)`: PickScore's reference.
    Logits,
    /// `exp(logit_scale) * cos(image, text) / 26` (Flow-GRPO's normalisation).
    LogitsOver26,
}

/// How a PickScore directory is used.
#[derive(Clone, Debug, PartialEq)]
pub struct PickScoreOptions {
    /// The score's scale.
    pub scale: PickScoreScale,
    /// Samples per forward pass (bounds memory).
    pub chunk_size: usize,
    /// Where `tokenizer.json` (and optionally `tokenizer_config.json` and
    /// `preprocessor_config.json`) are, if not in the model directory — PickScore's reference
    /// takes its processor from `laion/CLIP-ViT-H-14-laion2B-s32B-b79K`.
    pub processor_dir: Option<PathBuf>,
}

impl Default for PickScoreOptions {
    /// Reference scale, chunks of 16, processor files in the model directory.
    fn default() -> Self {
        Self {
            scale: PickScoreScale::Logits,
            chunk_size: 16,
            processor_dir: None,
        }
    }
}

/// The PickScore reward as a [`Scorer`] (component [`PICKSCORE_COMPONENT`]; reads images and
/// prompts).
#[derive(Debug)]
pub struct PickScore<B: Backend> {
    model: ClipModel<B>,
    tokenizer: ClipTokenizer,
    processor: ClipImageProcessor,
    options: PickScoreOptions,
    device: B::Device,
}

impl<B: Backend> PickScore<B> {
    /// Loads a PickScore (or any transformers `CLIPModel`) directory: `config.json`,
    /// `model.safetensors` (or a sharded checkpoint), `tokenizer.json`, and optionally
    /// `tokenizer_config.json` and `preprocessor_config.json` (CLIP's defaults otherwise) —
    /// the last three from [`PickScoreOptions::processor_dir`] when it is set.
    pub fn from_dir(
        dir: impl AsRef<Path>,
        device: &B::Device,
        options: PickScoreOptions,
    ) -> Result<Self, RewardError> {
        let dir = dir.as_ref();
        if options.chunk_size == 0 {
            return Err(RewardError::InvalidConfig {
                what: "PickScore",
                problems: vec![ConfigProblem::new("chunk_size", 0, "a positive number")],
            });
        }
        let config = ClipConfig::from_transformers_json(dir.join(CONFIG_FILE))?;
        let proc_dir = options
            .processor_dir
            .clone()
            .unwrap_or_else(|| dir.to_path_buf());
        let tokenizer =
            ClipTokenizer::from_dir(&proc_dir, config.text_config.max_position_embeddings)?;
        let pre = proc_dir.join(PREPROCESSOR_FILE);
        let processor = if pre.is_file() {
            ClipImageProcessor::from_json(&pre)?
        } else {
            ClipImageProcessor::default()
        };
        let side = config.vision_config.image_size;
        if !processor.do_center_crop
            || processor.crop_height != side
            || processor.crop_width != side
        {
            return Err(RewardError::InvalidConfig {
                what: "PickScore",
                problems: vec![ConfigProblem::new(
                    "preprocessor crop_size",
                    format!(
                        "{}x{} (center crop {})",
                        processor.crop_height, processor.crop_width, processor.do_center_crop
                    ),
                    format!("a center crop of the vision tower's image_size = {side}"),
                )],
            });
        }
        let checkpoint = Checkpoint::open(dir)?;
        let model = config
            .init::<B>(device)
            .load_weights(&config, &checkpoint)?;
        Ok(Self {
            model,
            tokenizer,
            processor,
            options,
            device: device.clone(),
        })
    }

    /// The model.
    pub fn model(&self) -> &ClipModel<B> {
        &self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &ClipTokenizer {
        &self.tokenizer
    }

    /// The image processor.
    pub fn processor(&self) -> &ClipImageProcessor {
        &self.processor
    }

    /// The scores of aligned `(image_i, prompt_i)` pairs at the configured scale, one forward
    /// pass (no chunking: [`Scorer::score`] chunks).
    ///
    /// # Errors
    /// [`RewardError::BatchLength`] (input `prompt`) when there is not one prompt per image;
    /// the tokenizer's and the text model's errors ([`ClipModel::text_embeds`]).
    pub fn score_pairs(
        &self,
        images: &[crate::RgbImage],
        prompts: &[String],
    ) -> Result<Vec<f64>, RewardError> {
        if images.len() != prompts.len() {
            return Err(RewardError::BatchLength {
                input: Input::Prompt,
                expected: images.len(),
                found: prompts.len(),
            });
        }
        if images.is_empty() {
            return Ok(Vec::new());
        }
        let pixels = self.processor.batch::<B>(images, &self.device);
        let ids = self.tokenizer.encode_batch(prompts, Padding::Longest)?;
        let img = self.model.image_embeds(pixels);
        let txt = self.model.text_embeds(&ids)?;
        let scores: Vec<f32> = self
            .model
            .pair_scores(img, txt)
            .into_data()
            .convert::<f32>()
            .to_vec()
            .expect("f32");
        let div = match self.options.scale {
            PickScoreScale::Logits => 1.0,
            PickScoreScale::LogitsOver26 => 26.0,
        };
        Ok(scores.into_iter().map(|s| s as f64 / div).collect())
    }
}

impl<B: Backend> Scorer for PickScore<B> {
    fn name(&self) -> String {
        PICKSCORE_COMPONENT.into()
    }

    fn required_inputs(&self) -> &[Input] {
        &[Input::Image, Input::Prompt]
    }

    fn components(&self) -> Vec<String> {
        vec![PICKSCORE_COMPONENT.into()]
    }

    fn chunk_size(&self) -> usize {
        self.options.chunk_size
    }

    fn score_chunk(&self, batch: Batch<'_>) -> Result<Vec<Components>, RewardError> {
        let images = batch.images().expect("checked by score");
        let prompts = batch.prompts().expect("checked by score");
        Ok(self
            .score_pairs(images, prompts)?
            .into_iter()
            .map(|s| Components::new().with(PICKSCORE_COMPONENT, s))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;

    use super::*;
    use crate::RgbImage;

    fn tiny_clip() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/reward/tiny_clip")
    }

    #[test]
    fn score_pairs_refuses_images_and_prompts_of_different_counts() {
        let scorer =
            PickScore::<Flex>::from_dir(tiny_clip(), &Default::default(), Default::default())
                .unwrap();
        let images = vec![RgbImage::filled(32, 32, [200, 10, 10]); 2];
        let err = scorer
            .score_pairs(&images, &["a red square".to_string()])
            .unwrap_err();
        assert!(
            matches!(
                err,
                RewardError::BatchLength {
                    input: Input::Prompt,
                    expected: 2,
                    found: 1
                }
            ),
            "{err}"
        );
        let prompts = vec!["a red square".to_string(); 2];
        assert_eq!(scorer.score_pairs(&images, &prompts).unwrap().len(), 2);
    }
}
