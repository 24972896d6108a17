//! The shapes world's generator: the embedded default's text-to-image model.
//!
//! A closed text-to-image task (`reward::shapes`: coloured shapes with counts and spatial
//! relations, GenEval's categories in miniature) needs a small, real generator that runs on a
//! CPU. It is the Qwen-Image architecture at a tiny configuration — the same
//! [`QwenImageTransformer2DModel`] code path as the 20B model — conditioned by a small text
//! encoder over the world's closed vocabulary:
//!
//! * **Codec.** No VAE: an exact, invertible space-to-depth stands in for it. A 32x32 RGB image
//!   in `[-1, 1]` becomes an `8x8x12` "latent" grid (space-to-depth by 2, like a VAE's 8x but
//!   lossless), which the transformer packs into `2x2` patches: 16 tokens... of the Qwen packing,
//!   here `(32/4)^2 = 64` tokens of `48` channels. [`pack`] and [`unpack`] are exact inverses.
//! * **Text encoder.** [`WordTokenizer`] maps the grammar's words to ids; [`TextEncoder`] is
//!   an embedding, a learned position embedding and a pre-norm transformer encoder, producing
//!   the `[batch, tokens, joint_attention_dim]` states the transformer attends to, with the
//!   padding mask.
//! * [`ShapesGenerator`] holds both and implements [`VelocityModel`] through its transformer
//!   (what pretraining trains).
//! * [`ShapesWorld`] is the world the RL run trains in ([`World`]): the transformer is the
//!   policy, the frozen text encoder the prompt encoder, the codec the decoder, the grammar's
//!   scenes the prompts ([`eval_prompts`] held out, [`train_prompts`] drawn per rollout).
//!
//! The base generator is trained by flow matching on rendered scenes ([`pretrain_loss`];
//! `cargo run --release --example pretrain_shapes`) and its weights are committed under
//! `fixtures/shapes_world/`.

use std::path::Path;

use burn::module::{AutodiffModule, Module, Param};
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput,
};
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig};
use burn::prelude::Config;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, Distribution, Int, Tensor, TensorData};
use dit_models::{
    ImageShape, QwenImageConditioning, QwenImageConfig, QwenImageTransformer2DModel, VelocityModel,
};
use reward::shapes::{Category, IMAGE_SIZE, SHAPES_COMPONENT, SceneSpec, ShapesScorer};
use reward::{Components, RgbImage};
use trajectory::Conditions;

use crate::config::{DataSection, ScorerSpec, Trainable};
use crate::error::{TrainerError, io_err};
use crate::prompt_files::{draw_distinct, read_t2i_records, train_pool};
use crate::rng::TrainerRng;
use crate::scorers::ScorerSet;
use crate::transformer_policy::{
    load_transformer_policy, score_images, transformer_checkpoint_files,
};
pub use crate::transformer_policy::{restore_text_conditioning, store_text_conditioning};
use crate::world::{HeldOutPrompt, LoadedPolicy, World};

/// Side of the latent token grid: `IMAGE_SIZE / 4` (space-to-depth 2, then 2x2 patches).
pub const TOKEN_GRID: usize = IMAGE_SIZE / 4;
/// Channels of one packed token: `3 * 4 * 4`.
pub const TOKEN_CHANNELS: usize = 48;
/// The text encoder's shape, saved next to its weights.
pub const TEXT_CONFIG_FILE: &str = "text_encoder.json";

/// The longest prompt in words (with padding to this length).
pub const MAX_PROMPT_WORDS: usize = 12;

/// The words of the shapes grammar, in id order; id 0 is padding.
pub const VOCABULARY: &[&str] = &[
    "<pad>",
    "a",
    "one",
    "two",
    "three",
    "four",
    "and",
    "left",
    "right",
    "of",
    "above",
    "below",
    "red",
    "green",
    "blue",
    "yellow",
    "purple",
    "square",
    "squares",
    "circle",
    "circles",
    "triangle",
    "triangles",
];

/// Word-level tokenizer over [`VOCABULARY`].
#[derive(Debug, Clone, Copy, Default)]
pub struct WordTokenizer;

/// Token ids and the padding mask of a prompt batch.
#[derive(Debug, Clone)]
pub struct Tokens {
    /// `[batch * MAX_PROMPT_WORDS]` ids, row-major.
    pub ids: Vec<i64>,
    /// `[batch * MAX_PROMPT_WORDS]`, `true` for a real word.
    pub mask: Vec<bool>,
    /// Batch size.
    pub batch: usize,
}

impl WordTokenizer {
    /// Tokenizes prompts of the shapes grammar.
    ///
    /// # Errors
    /// [`TrainerError::PromptVocabulary`] naming a word outside the vocabulary or a prompt
    /// longer than [`MAX_PROMPT_WORDS`].
    ///
    /// ```
    /// use trainer_fsdp::shapes_world::{WordTokenizer, MAX_PROMPT_WORDS};
    /// let t = WordTokenizer.encode(&["two blue squares"]).unwrap();
    /// assert_eq!(&t.ids[..4], &[3, 14, 18, 0]); // "two" "blue" "squares" <pad>
    /// assert_eq!(t.mask.iter().filter(|m| **m).count(), 3);
    /// assert!(WordTokenizer.encode(&["a red hexagon"]).is_err());
    /// ```
    pub fn encode<S: AsRef<str>>(&self, prompts: &[S]) -> Result<Tokens, TrainerError> {
        let mut ids = Vec::with_capacity(prompts.len() * MAX_PROMPT_WORDS);
        let mut mask = Vec::with_capacity(prompts.len() * MAX_PROMPT_WORDS);
        for p in prompts {
            let words: Vec<String> = p
                .as_ref()
                .split_whitespace()
                .map(str::to_ascii_lowercase)
                .collect();
            if words.len() > MAX_PROMPT_WORDS {
                return Err(TrainerError::PromptVocabulary {
                    prompt: p.as_ref().to_string(),
                    problem: format!("{} words, at most {MAX_PROMPT_WORDS}", words.len()),
                });
            }
            for w in &words {
                let id = VOCABULARY.iter().position(|v| v == w).ok_or_else(|| {
                    TrainerError::PromptVocabulary {
                        prompt: p.as_ref().to_string(),
                        problem: format!("word {w:?} is not in the shapes vocabulary"),
                    }
                })?;
                ids.push(id as i64);
                mask.push(true);
            }
            for _ in words.len()..MAX_PROMPT_WORDS {
                ids.push(0);
                mask.push(false);
            }
        }
        Ok(Tokens {
            ids,
            mask,
            batch: prompts.len(),
        })
    }
}

/// The text encoder's shape.
#[derive(Config, Debug)]
pub struct TextEncoderConfig {
    /// Width of the states (the transformer's `joint_attention_dim`).
    #[config(default = 64)]
    pub d_model: usize,
    /// Encoder layers.
    #[config(default = 2)]
    pub layers: usize,
    /// Attention heads.
    #[config(default = 4)]
    pub heads: usize,
}

/// Embedding + learned positions + a pre-norm transformer encoder + a final LayerNorm.
#[derive(Module, Debug)]
pub struct TextEncoder<B: Backend> {
    embed: Embedding<B>,
    position: Param<Tensor<B, 2>>,
    encoder: TransformerEncoder<B>,
    norm: LayerNorm<B>,
}

impl TextEncoderConfig {
    /// A randomly initialised encoder.
    pub fn init<B: Backend>(&self, device: &B::Device) -> TextEncoder<B> {
        TextEncoder {
            embed: EmbeddingConfig::new(VOCABULARY.len(), self.d_model).init(device),
            position: Param::from_tensor(Tensor::random(
                [MAX_PROMPT_WORDS, self.d_model],
                Distribution::Normal(0.0, 0.02),
                device,
            )),
            encoder: TransformerEncoderConfig::new(
                self.d_model,
                4 * self.d_model,
                self.heads,
                self.layers,
            )
            .with_dropout(0.0)
            .with_norm_first(true)
            .init(device),
            norm: LayerNormConfig::new(self.d_model).init(device),
        }
    }
}

impl<B: Backend> TextEncoder<B> {
    /// `[batch, MAX_PROMPT_WORDS, d_model]` states and the `[batch, MAX_PROMPT_WORDS]` mask
    /// (`true` = real word).
    pub fn forward(
        &self,
        tokens: &Tokens,
        device: &B::Device,
    ) -> (Tensor<B, 3>, Tensor<B, 2, Bool>) {
        let shape = [tokens.batch, MAX_PROMPT_WORDS];
        let ids =
            Tensor::<B, 2, Int>::from_data(TensorData::new(tokens.ids.clone(), shape), device);
        // through an integer tensor: burn-candle 0.21 builds no Bool tensor from bool data
        let flags: Vec<i32> = tokens.mask.iter().map(|&m| i32::from(m)).collect();
        let mask =
            Tensor::<B, 2, Int>::from_data(TensorData::new(flags, shape), device).equal_elem(1);
        let x = self.embed.forward(ids) + self.position.val().unsqueeze_dim(0);
        let x = self
            .encoder
            .forward(TransformerEncoderInput::new(x).mask_pad(mask.clone().bool_not()));
        (self.norm.forward(x), mask)
    }
}

/// The transformer's configuration for the shapes world: Qwen-Image's architecture at
/// 4 blocks of width 128 (4 heads of 32), 48-channel tokens, text width 64.
pub fn transformer_config() -> QwenImageConfig {
    QwenImageConfig::new()
        .with_in_channels(TOKEN_CHANNELS)
        .with_out_channels(TOKEN_CHANNELS / 4)
        .with_num_layers(4)
        .with_attention_head_dim(32)
        .with_num_attention_heads(4)
        .with_joint_attention_dim(64)
        .with_axes_dims_rope([8, 12, 12])
}

/// The shapes world's text-to-image generator.
#[derive(Module, Debug)]
pub struct ShapesGenerator<B: Backend> {
    /// The text encoder (frozen during RL).
    pub text: TextEncoder<B>,
    /// The transformer (the policy; LoRA attaches here).
    pub dit: QwenImageTransformer2DModel<B>,
    /// The text encoder's shape (saved next to its weights).
    #[module(skip)]
    pub text_config: TextEncoderConfig,
}

/// The token grid of the shapes world's images.
pub fn image_shapes() -> Vec<ImageShape> {
    vec![ImageShape::new(1, TOKEN_GRID, TOKEN_GRID)]
}

impl<B: Backend> ShapesGenerator<B> {
    /// A randomly initialised generator of the shapes world's shape.
    pub fn init(device: &B::Device) -> Self {
        Self::init_with(&TextEncoderConfig::new(), &transformer_config(), device)
    }

    /// A randomly initialised generator of another shape (tests use tiny ones).
    pub fn init_with(text: &TextEncoderConfig, dit: &QwenImageConfig, device: &B::Device) -> Self {
        Self {
            text: text.init(device),
            dit: dit.init(device),
            text_config: text.clone(),
        }
    }

    /// The transformer's conditioning for a batch of prompts.
    ///
    /// # Errors
    /// A prompt outside the vocabulary.
    pub fn conditioning<S: AsRef<str>>(
        &self,
        prompts: &[S],
        device: &B::Device,
    ) -> Result<QwenImageConditioning<B>, TrainerError> {
        text_conditioning(&self.text, prompts, device)
    }

    /// Saves the generator: the transformer as a diffusers directory (`transformer/`), the
    /// text encoder as a named MessagePack record (`text_encoder.mpk`) with its shape
    /// (`text_encoder.json`).
    ///
    /// # Errors
    /// IO and export errors.
    pub fn save(&self, dir: &Path) -> Result<(), TrainerError> {
        std::fs::create_dir_all(dir).map_err(io_err(dir, "create the generator directory"))?;
        self.dit.save_merged_diffusers(
            dir.join("transformer"),
            dit_models::ExportOptions {
                dtype: dit_models::ExportDtype::F32,
                max_shard_bytes: None,
            },
        )?;
        let cfg_path = dir.join(TEXT_CONFIG_FILE);
        durable::write_atomic(&cfg_path, self.text_config.to_string().as_bytes())?;
        self.text
            .clone()
            .save_file(
                dir.join("text_encoder"),
                &NamedMpkFileRecorder::<FullPrecisionSettings>::new(),
            )
            .map_err(|source| TrainerError::Record {
                path: dir.join("text_encoder.mpk"),
                op: "encode",
                what: "weights",
                source,
            })?;
        Ok(())
    }

    /// Loads a generator written by [`ShapesGenerator::save`].
    ///
    /// # Errors
    /// Missing files, mismatched weights.
    pub fn load(dir: &Path, device: &B::Device) -> Result<Self, TrainerError> {
        let dit = load_transformer::<B>(dir, device)?;
        let (text, text_config) = load_text_encoder::<B>(dir, device)?;
        Ok(Self {
            text,
            dit,
            text_config,
        })
    }
}

/// The transformer's conditioning of a batch of prompts through the text encoder.
fn text_conditioning<B: Backend, S: AsRef<str>>(
    text: &TextEncoder<B>,
    prompts: &[S],
    device: &B::Device,
) -> Result<QwenImageConditioning<B>, TrainerError> {
    let tokens = WordTokenizer.encode(prompts)?;
    let (states, mask) = text.forward(&tokens, device);
    Ok(QwenImageConditioning {
        encoder_hidden_states: states,
        encoder_hidden_states_mask: Some(mask),
        img_shapes: image_shapes(),
    })
}

/// The transformer of a generator directory (`transformer/`, a diffusers directory), with the
/// base-model hash computed.
fn load_transformer<B: Backend>(
    dir: &Path,
    device: &B::Device,
) -> Result<QwenImageTransformer2DModel<B>, TrainerError> {
    Ok(QwenImageTransformer2DModel::from_pretrained(
        dir.join("transformer"),
        device,
        dit_models::LoadOptions {
            dtype: dit_models::WeightDtype::F32,
            hash: true,
            variant: None,
        },
    )?)
}

/// The text encoder of a generator directory (`text_encoder.mpk` and its shape).
fn load_text_encoder<B: Backend>(
    dir: &Path,
    device: &B::Device,
) -> Result<(TextEncoder<B>, TextEncoderConfig), TrainerError> {
    let cfg_path = dir.join(TEXT_CONFIG_FILE);
    let text_config =
        TextEncoderConfig::load(&cfg_path).map_err(|source| TrainerError::ModelConfig {
            path: cfg_path.clone(),
            source,
        })?;
    let text = text_config
        .init::<B>(device)
        .load_file(
            dir.join("text_encoder"),
            &NamedMpkFileRecorder::<FullPrecisionSettings>::new(),
            device,
        )
        .map_err(|source| TrainerError::Record {
            path: dir.join("text_encoder.mpk"),
            op: "decode",
            what: "weights",
            source,
        })?;
    Ok((text, text_config))
}

impl<B: Backend> VelocityModel<B> for ShapesGenerator<B> {
    type Conditioning = QwenImageConditioning<B>;

    fn velocity(
        &self,
        x: Tensor<B, 3>,
        sigma: Tensor<B, 1>,
        cond: &Self::Conditioning,
    ) -> Tensor<B, 3> {
        self.dit.velocity(x, sigma, cond)
    }
}

/// `[batch, 3, 32, 32]` images in `[-1, 1]` to `[batch, 64, 48]` tokens: space-to-depth by 4,
/// channels ordered `(c, dy, dx)` like diffusers' 2x2 packing of a 2x space-to-depth.
pub fn pack<B: Backend>(images: Tensor<B, 4>) -> Tensor<B, 3> {
    let [b, c, h, w] = images.dims();
    let (gh, gw) = (h / 4, w / 4);
    images
        .reshape([b, c, gh, 4, gw, 4])
        .permute([0, 2, 4, 1, 3, 5])
        .reshape([b, gh * gw, c * 16])
}

/// The inverse of [`pack`]: `[batch, 64, 48]` tokens to `[batch, 3, 32, 32]` images.
pub fn unpack<B: Backend>(tokens: Tensor<B, 3>) -> Tensor<B, 4> {
    let [b, _, ch] = tokens.dims();
    let c = ch / 16;
    let g = TOKEN_GRID;
    tokens
        .reshape([b, g, g, c, 4, 4])
        .permute([0, 3, 1, 4, 2, 5])
        .reshape([b, c, g * 4, g * 4])
}

/// 8-bit RGB images to a `[batch, 3, H, W]` tensor in `[-1, 1]` (`x / 127.5 - 1`).
pub fn images_to_tensor<B: Backend>(images: &[RgbImage], device: &B::Device) -> Tensor<B, 4> {
    let (h, w) = (images[0].height(), images[0].width());
    let mut data = Vec::with_capacity(images.len() * 3 * h * w);
    for img in images {
        for c in 0..3 {
            for y in 0..h {
                for x in 0..w {
                    data.push(f32::from(img.pixel(x, y)[c]) / 127.5 - 1.0);
                }
            }
        }
    }
    Tensor::from_data(TensorData::new(data, [images.len(), 3, h, w]), device)
}

/// Generated tokens to 8-bit images: unpack, map `[-1, 1]` to `[0, 1]`, quantize as the
/// references do (`(x * 255).round().clamp(0, 255)`).
///
/// # Errors
/// A non-finite pixel.
pub fn tokens_to_images<B: Backend>(tokens: Tensor<B, 3>) -> Result<Vec<RgbImage>, TrainerError> {
    let unit = unpack(tokens).add_scalar(1.0).mul_scalar(0.5);
    Ok(RgbImage::batch_from_tensor(unit)?)
}

/// The flow-matching pretraining loss of one batch: `x_sigma = (1 - sigma) x0 + sigma eps`,
/// target `v = eps - x0`, mean squared error; `sigma` per sample (the caller draws it).
pub fn pretrain_loss<B: Backend>(
    model: &ShapesGenerator<B>,
    cond: &QwenImageConditioning<B>,
    x0: Tensor<B, 3>,
    eps: Tensor<B, 3>,
    sigma: Tensor<B, 1>,
) -> Tensor<B, 1> {
    let s = sigma.clone().unsqueeze_dims::<3>(&[1, 2]);
    let x = x0.clone().mul(s.clone().neg().add_scalar(1.0)) + eps.clone().mul(s);
    let v = model.velocity(x, sigma, cond);
    let diff = v - (eps - x0);
    (diff.clone() * diff).mean()
}

/// The number of held-out prompts per category.
pub const EVAL_PROMPTS_PER_CATEGORY: u64 = 4;

/// The held-out evaluation prompts: 4 per GenEval category, fixed, never used for training
/// (here or in the base generator's pretraining).
pub fn eval_prompts() -> Vec<String> {
    Category::ALL
        .iter()
        .flat_map(|&c| {
            (0..EVAL_PROMPTS_PER_CATEGORY).map(move |i| SceneSpec::sample(c, 10_000 + i).prompt())
        })
        .collect()
}

/// The distinct training prompts of the shapes world: every scene of every category, the
/// held-out ones ([`eval_prompts`]) excepted. A rollout draws at most this many.
pub fn train_pool_size() -> usize {
    let held_out = eval_prompts();
    Category::ALL
        .iter()
        .map(|&c| {
            SceneSpec::all(c)
                .iter()
                .filter(|s| !held_out.contains(&s.prompt()))
                .count()
        })
        .sum()
}

/// `n` distinct training prompts for a rollout: categories in turn, scenes drawn from the
/// rollout's stream, held-out prompts excluded. A category whose scenes are all used (single
/// objects: three shapes, some of them held out) is passed over.
///
/// # Errors
/// [`TrainerError::PromptPoolExhausted`] when fewer than `n` distinct prompts exist outside
/// the held-out set.
pub fn train_prompts(
    rng: &mut TrainerRng,
    n: usize,
    held_out: &[String],
) -> Result<Vec<String>, TrainerError> {
    let pools: Vec<Vec<String>> = Category::ALL
        .iter()
        .map(|&c| {
            SceneSpec::all(c)
                .iter()
                .map(SceneSpec::prompt)
                .filter(|p| !held_out.contains(p))
                .collect()
        })
        .collect();
    let available: usize = pools.iter().map(Vec::len).sum();
    if n > available {
        return Err(TrainerError::PromptPoolExhausted {
            requested: n,
            available,
        });
    }
    let mut out: Vec<String> = Vec::with_capacity(n);
    let mut k = rng.below(Category::ALL.len() as u64) as usize;
    while out.len() < n {
        let c = k % Category::ALL.len();
        if pools[c].iter().all(|p| out.contains(p)) {
            k += 1;
            continue;
        }
        let p = SceneSpec::sample(Category::ALL[c], rng.next_u64()).prompt();
        if !held_out.contains(&p) && !out.contains(&p) {
            out.push(p);
            k += 1;
        }
    }
    Ok(out)
}

pub use crate::scorers::SharedScorer;

/// The shapes world as a [`World`]: the committed base generator's transformer as the policy,
/// its text encoder (frozen, on the plain backend) as the prompt encoder, the exact
/// space-to-depth codec as the decoder, the closed grammar's scenes as prompts (the
/// [`eval_prompts`] held out), and the scorers of `[reward] scorers` (the recipe's: the
/// `reward::shapes` composition judge).
pub struct ShapesWorld<Bi: Backend> {
    dir: std::path::PathBuf,
    text: TextEncoder<Bi>,
    held_out: Vec<HeldOutPrompt>,
    held_out_prompts: Vec<String>,
    /// `[data] train`'s prompts, replacing the grammar's pool.
    train_pool: Option<Vec<String>>,
    scorer: SharedScorer,
}

/// The prompts of a `[data]` prompt file (the unified JSONL schema) for the shapes world, with
/// their categories: every record must be a `t2i` scene of the world's grammar.
///
/// # Errors
/// [`TrainerError::PromptFile`] listing every line that is not (or the file's read error).
pub fn read_prompt_file(path: &Path) -> Result<Vec<(String, Category)>, TrainerError> {
    read_t2i_records(path, "shapes world", |r| {
        SceneSpec::parse(&r.prompt)
            .map(|scene| scene.category())
            .map_err(|e| {
                format!(
                    "{:?} is not a scene of the shapes world's grammar ({e})",
                    r.prompt
                )
            })
    })
}

impl<Bi: Backend> std::fmt::Debug for ShapesWorld<Bi> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShapesWorld")
            .field("dir", &self.dir)
            .field("held_out", &self.held_out.len())
            .field("scorer", &self.scorer.name())
            .finish()
    }
}

impl<Bi: Backend> ShapesWorld<Bi> {
    /// The world of the generator directory `dir` (written by [`ShapesGenerator::save`]),
    /// scored by `scorers`: loads the text encoder and builds the scorers; the transformer is
    /// loaded by [`World::load_policy`].
    ///
    /// # Errors
    /// Missing or mismatched text-encoder files, scorers that do not load.
    pub fn load(
        dir: &Path,
        scorers: &[ScorerSpec],
        device: &Bi::Device,
    ) -> Result<Self, TrainerError>
    where
        reward::PickScore<Bi>: Send + Sync,
    {
        let text = load_text_encoder::<Bi>(dir, device)?.0;
        // the world's own reward is the composition judge
        let judge = |components: &[String]| -> Result<SharedScorer, TrainerError> {
            if components == [SHAPES_COMPONENT] {
                Ok(Box::new(ShapesScorer::default()))
            } else {
                Err(TrainerError::NoWorldReward {
                    components: components.to_vec(),
                })
            }
        };
        let set = ScorerSet::from_specs::<Bi>(scorers, Some(&judge), device)?;
        Ok(Self::new(dir, text)?.with_scorer(Box::new(set)))
    }

    /// The world of a generator whose text encoder is already loaded (pretraining evaluates
    /// the generator it trains this way), scored by the composition judge;
    /// [`World::load_policy`] reads the transformer from `dir`.
    ///
    /// # Errors
    /// A held-out prompt outside the grammar (a programming error of this module).
    pub fn new(dir: &Path, text: TextEncoder<Bi>) -> Result<Self, TrainerError> {
        let held_out_prompts = eval_prompts();
        let held_out = held_out_prompts
            .iter()
            .map(|p| {
                Ok(HeldOutPrompt {
                    prompt: p.clone(),
                    category: SceneSpec::parse(p)?.category().tag().to_string(),
                })
            })
            .collect::<Result<Vec<_>, TrainerError>>()?;
        Ok(Self {
            dir: dir.to_path_buf(),
            text,
            held_out,
            held_out_prompts,
            train_pool: None,
            scorer: Box::new(ShapesScorer::default()),
        })
    }

    /// Uses the `[data]` prompt files: `train` as the pool rollouts draw from, `eval` as the
    /// held-out set (each replaces the grammar's own; either may be absent). Refused: lines
    /// that are not scenes of the grammar, and train prompts that are also held out.
    ///
    /// # Errors
    /// [`TrainerError::PromptFile`].
    pub fn with_prompt_files(mut self, data: &DataSection) -> Result<Self, TrainerError> {
        if let Some(path) = &data.eval {
            let prompts = read_prompt_file(path)?;
            self.held_out = prompts
                .iter()
                .map(|(p, c)| HeldOutPrompt {
                    prompt: p.clone(),
                    category: c.tag().to_string(),
                })
                .collect();
            self.held_out_prompts = prompts.into_iter().map(|(p, _)| p).collect();
        }
        if let Some(path) = &data.train {
            let prompts = read_prompt_file(path)?.into_iter().map(|(p, _)| p);
            self.train_pool = Some(train_pool(path, prompts, &self.held_out_prompts)?);
        }
        Ok(self)
    }

    /// Replaces the scorer (tests inject scorers that fail or still vary on a random
    /// generator's images).
    pub fn with_scorer(mut self, scorer: SharedScorer) -> Self {
        self.scorer = scorer;
        self
    }
}

impl<B: AutodiffBackend> World<B> for ShapesWorld<B::InnerBackend> {
    type Cond<Bx: Backend> = QwenImageConditioning<Bx>;
    type Policy = QwenImageTransformer2DModel<B>;
    type Sample = RgbImage;

    fn name(&self) -> String {
        format!("shapes world ({})", self.dir.display())
    }

    fn latent_shape(&self) -> [usize; 2] {
        [TOKEN_GRID * TOKEN_GRID, TOKEN_CHANNELS]
    }

    fn train_prompts(&self, rng: &mut TrainerRng, n: usize) -> Result<Vec<String>, TrainerError> {
        match &self.train_pool {
            None => train_prompts(rng, n, &self.held_out_prompts),
            Some(pool) => draw_distinct(rng, n, pool),
        }
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
        load_transformer_policy::<B>(&self.dir.join("transformer"), None, trainable, seed, device)
    }

    fn encode(
        &self,
        prompts: &[&str],
        device: &B::Device,
    ) -> Result<QwenImageConditioning<B::InnerBackend>, TrainerError> {
        text_conditioning(&self.text, prompts, device)
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
            image_shapes(),
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
        tokens_to_images(latents)
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

    /// Under LoRA, the adapter as a PEFT adapter directory's two files (so that a checkpoint
    /// directory loads with `PeftModel.from_pretrained`); nothing under full fine-tuning (the
    /// merged export writes the whole transformer).
    fn checkpoint_files(
        &self,
        policy: &QwenImageTransformer2DModel<B>,
    ) -> Result<Vec<(&'static str, Vec<u8>)>, TrainerError> {
        transformer_checkpoint_files(policy, &self.dir.join("transformer"))
    }

    /// Every [`ExportForm`](crate::export::ExportForm) of the transformer, against the base
    /// `<generator dir>/transformer`; the probe is the first two held-out prompts at
    /// `sigma = 0.8, 0.3` on a fixed latent.
    fn export_policy(
        &self,
        policy: &QwenImageTransformer2DModel<B>,
        request: &crate::export::ExportRequest,
        out: &Path,
    ) -> Result<crate::export::ExportedPolicy, TrainerError> {
        let model = policy.valid();
        let device = model.img_in.weight.lazy_device();
        let prompts: Vec<&str> = self.held_out_prompts[..2]
            .iter()
            .map(String::as_str)
            .collect();
        let cond = text_conditioning(&self.text, &prompts, &device)?;
        let (x, sigma) =
            crate::export::velocity_probe(TOKEN_GRID * TOKEN_GRID, TOKEN_CHANNELS, &device);
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
