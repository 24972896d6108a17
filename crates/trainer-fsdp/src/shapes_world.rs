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
//! `cargo run --release --example pretrain_shapes`); its weights are committed under
//! `fixtures/shapes_world/` (the first base), `fixtures/shapes_world_v2/` (continued from
//! it on corrupted captions) and `fixtures/shapes_world_v3/` (continued from v2 on larger
//! objects, true captions, then a short run on corrupted ones: the main job's default).

use std::path::Path;

use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput,
};
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig};
use burn::prelude::Config;
use burn::record::{
    BurnRecord, FullPrecisionSettings, NamedMpkBytesRecorder, NamedMpkFileRecorder, Record,
    Recorder,
};
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
/// The text encoder's weights: burn's named MessagePack record at full precision, as
/// `NamedMpkFileRecorder<FullPrecisionSettings>` writes it.
pub const TEXT_WEIGHTS_FILE: &str = "text_encoder.mpk";

/// The recorder whose format [`TEXT_WEIGHTS_FILE`] is in (its name is in the file's metadata).
type TextRecorder = NamedMpkFileRecorder<FullPrecisionSettings>;

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
    /// Checks that the encoder can be built and that its states fit a transformer whose
    /// `joint_attention_dim` is `joint_attention_dim` (`transformer` names where that was
    /// read); `path` is the file the shape was read from.
    ///
    /// # Errors
    /// [`TrainerError::TextEncoderShape`] naming the file, the field, its value and what would
    /// fit: `heads` must be positive, `d_model` a multiple of `heads` and equal to
    /// `joint_attention_dim`.
    pub fn check(
        &self,
        path: &Path,
        joint_attention_dim: usize,
        transformer: &str,
    ) -> Result<(), TrainerError> {
        let problem = |field, value, expected: String| TrainerError::TextEncoderShape {
            path: path.to_path_buf(),
            field,
            value,
            expected,
        };
        if self.heads == 0 {
            return Err(problem("heads", 0, "at least 1 attention head".into()));
        }
        if !self.d_model.is_multiple_of(self.heads) {
            return Err(problem(
                "d_model",
                self.d_model,
                format!(
                    "a multiple of heads = {} (each head gets d_model / heads channels)",
                    self.heads
                ),
            ));
        }
        if self.d_model != joint_attention_dim {
            return Err(problem(
                "d_model",
                self.d_model,
                format!(
                    "the transformer's joint_attention_dim = {joint_attention_dim} ({transformer})"
                ),
            ));
        }
        Ok(())
    }

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

    /// The generator with `n` more transformer blocks whose gates start closed (see
    /// [`QwenImageTransformer2DModel::grow`]): the same velocities until training opens them.
    ///
    /// # Errors
    /// The transformer carries an adapter.
    pub fn grow(self, n: usize, device: &B::Device) -> Result<Self, TrainerError> {
        Ok(Self {
            dit: self.dit.grow(n, device)?,
            ..self
        })
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
        let weights = dir.join(TEXT_WEIGHTS_FILE);
        durable::write_atomic(&weights, &text_encoder_bytes(&self.text, &weights)?)?;
        Ok(())
    }

    /// Loads a generator written by [`ShapesGenerator::save`].
    ///
    /// # Errors
    /// Missing files, mismatched weights; a text encoder whose shape cannot be built or does
    /// not fit the transformer ([`TrainerError::TextEncoderShape`]), or whose weights do not
    /// fit that shape ([`TrainerError::WeightsMismatch`]).
    pub fn load(dir: &Path, device: &B::Device) -> Result<Self, TrainerError> {
        let dit = load_transformer::<B>(dir, device)?;
        let transformer = dir
            .join("transformer")
            .join(dit_models::weights::CONFIG_FILE);
        let (text, text_config) = load_text_encoder::<B>(
            dir,
            dit.config().joint_attention_dim,
            &transformer.display().to_string(),
            device,
        )?;
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

/// The text encoder's weights as [`TEXT_WEIGHTS_FILE`] holds them, encoded in memory (so that
/// the file is written durably): byte for byte what
/// `save_file(_, &NamedMpkFileRecorder::<FullPrecisionSettings>::new())` writes, metadata
/// included. `path` names the file in errors.
fn text_encoder_bytes<B: Backend>(
    text: &TextEncoder<B>,
    path: &Path,
) -> Result<Vec<u8>, TrainerError> {
    // a clone of a parameter not yet read initialises on its own, to other random values:
    // read them first so that the file holds the encoder's own weights
    text.visit(&mut Materialise);
    let item = text
        .clone()
        .into_record()
        .into_item::<FullPrecisionSettings>();
    let record = BurnRecord::<_, B>::new::<TextRecorder>(item);
    // the bytes recorder serialises an item exactly as the file recorder does
    // (`rmp_serde`'s named encoding); the metadata above names the file recorder
    Recorder::<B>::save_item(
        &NamedMpkBytesRecorder::<FullPrecisionSettings>::new(),
        record,
        (),
    )
    .map_err(|source| TrainerError::Record {
        path: path.to_path_buf(),
        op: "encode",
        what: "weights",
        source,
    })
}

/// Reads every float parameter (initialising a lazily initialised one in place).
struct Materialise;

impl<B: Backend> ModuleVisitor<B> for Materialise {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let _ = param.val();
    }
}

/// Every float parameter of a module with its path (`encoder.layers.0.mha.query.weight`) and
/// shape, in module order.
#[derive(Default)]
struct ParamShapes {
    stack: Vec<String>,
    out: Vec<(String, Vec<usize>)>,
}

impl<B: Backend> ModuleVisitor<B> for ParamShapes {
    fn enter_module(&mut self, name: &str, _container: &str) {
        self.stack.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container: &str) {
        self.stack.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.out
            .push((self.stack.join("."), param.lazy_shape().to_vec()));
    }
}

fn param_shapes<B: Backend, M: Module<B>>(module: &M) -> Vec<(String, Vec<usize>)> {
    let mut v = ParamShapes::default();
    module.visit(&mut v);
    v.out
}

/// The text encoder of a generator directory ([`TEXT_WEIGHTS_FILE`] and its shape,
/// [`TEXT_CONFIG_FILE`]), checked against the transformer it conditions (whose
/// `joint_attention_dim` was read from `transformer`) and its weights against the shape.
///
/// # Errors
/// [`TrainerError::ModelConfig`] (the shape file), [`TrainerError::TextEncoderShape`],
/// [`TrainerError::Record`] (the weights file), [`TrainerError::WeightsMismatch`] naming every
/// layer or parameter of the file that the shape does not have, or has in another shape.
fn load_text_encoder<B: Backend>(
    dir: &Path,
    joint_attention_dim: usize,
    transformer: &str,
    device: &B::Device,
) -> Result<(TextEncoder<B>, TextEncoderConfig), TrainerError> {
    let cfg_path = dir.join(TEXT_CONFIG_FILE);
    let text_config =
        TextEncoderConfig::load(&cfg_path).map_err(|source| TrainerError::ModelConfig {
            path: cfg_path.clone(),
            source,
        })?;
    text_config.check(&cfg_path, joint_attention_dim, transformer)?;
    let path = dir.join(TEXT_WEIGHTS_FILE);
    let record: <TextEncoder<B> as Module<B>>::Record = TextRecorder::new()
        .load(path.clone(), device)
        .map_err(|source| TrainerError::Record {
            path: path.clone(),
            op: "decode",
            what: "weights",
            source,
        })?;
    let text = text_config.init::<B>(device);
    // burn loads a layer list of another length by panicking, and tensors of other shapes
    // without a word: both are checked here
    let (layers, saved) = (text_config.layers, record.encoder.layers.len());
    if saved != layers {
        let name = |i| format!("encoder.layers.{i}");
        return Err(TrainerError::WeightsMismatch {
            path,
            missing: (saved..layers).map(name).collect(),
            unexpected: (layers..saved).map(name).collect(),
            mismatched: Vec::new(),
        });
    }
    let expected = param_shapes::<B, _>(&text);
    let text = text.load_record(record);
    let found = param_shapes::<B, _>(&text);
    let missing: Vec<String> = expected
        .iter()
        .filter(|(p, _)| !found.iter().any(|(q, _)| q == p))
        .map(|(p, _)| p.clone())
        .collect();
    let unexpected: Vec<String> = found
        .iter()
        .filter(|(q, _)| !expected.iter().any(|(p, _)| p == q))
        .map(|(q, _)| q.clone())
        .collect();
    let mismatched: Vec<(String, String, String)> = found
        .iter()
        .filter_map(|(q, got)| {
            let (_, want) = expected.iter().find(|(p, _)| p == q)?;
            (got != want).then(|| (q.clone(), format!("{got:?}"), format!("{want:?}")))
        })
        .collect();
    if !missing.is_empty() || !unexpected.is_empty() || !mismatched.is_empty() {
        return Err(TrainerError::WeightsMismatch {
            path,
            missing,
            unexpected,
            mismatched,
        });
    }
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
    /// Missing or mismatched text-encoder files: a shape that cannot be built or does not fit
    /// the transformer's `transformer/config.json` ([`TrainerError::TextEncoderShape`]),
    /// weights that do not fit the shape ([`TrainerError::WeightsMismatch`]); scorers that do
    /// not load.
    pub fn load(
        dir: &Path,
        scorers: &[ScorerSpec],
        device: &Bi::Device,
    ) -> Result<Self, TrainerError>
    where
        reward::PickScore<Bi>: Send + Sync,
    {
        let transformer = dir
            .join("transformer")
            .join(dit_models::weights::CONFIG_FILE);
        let dit = QwenImageConfig::from_diffusers_json(&transformer)?;
        let text = load_text_encoder::<Bi>(
            dir,
            dit.joint_attention_dim,
            &transformer.display().to_string(),
            device,
        )?
        .0;
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use burn::backend::Flex;

    use super::*;

    type B = Flex;

    fn tiny_text() -> TextEncoderConfig {
        TextEncoderConfig::new()
            .with_d_model(16)
            .with_layers(1)
            .with_heads(2)
    }

    /// A tiny random generator (text width 16) saved in `dir`.
    fn tiny_generator(dir: &Path) -> ShapesGenerator<B> {
        let dit = transformer_config()
            .with_num_layers(1)
            .with_attention_head_dim(8)
            .with_num_attention_heads(2)
            .with_joint_attention_dim(16)
            .with_axes_dims_rope([2, 2, 4]);
        let g = ShapesGenerator::<B>::init_with(&tiny_text(), &dit, &Default::default());
        g.save(dir).unwrap();
        g
    }

    fn write_shape(dir: &Path, json: &str) {
        std::fs::write(dir.join(TEXT_CONFIG_FILE), json).unwrap();
    }

    fn shape_error(dir: &Path) -> (String, &'static str, usize, String) {
        let err = ShapesGenerator::<B>::load(dir, &Default::default()).unwrap_err();
        let msg = err.to_string();
        match err {
            TrainerError::TextEncoderShape {
                path,
                field,
                value,
                expected,
            } => {
                assert_eq!(path, dir.join(TEXT_CONFIG_FILE));
                (msg, field, value, expected)
            }
            other => panic!("expected TextEncoderShape, got {other}"),
        }
    }

    #[test]
    fn a_text_encoder_without_heads_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        tiny_generator(dir.path());
        write_shape(dir.path(), r#"{"d_model":16,"layers":1,"heads":0}"#);
        let (msg, field, value, expected) = shape_error(dir.path());
        assert_eq!((field, value), ("heads", 0), "{msg}");
        assert!(expected.contains("at least 1"), "{msg}");
        assert!(msg.contains(TEXT_CONFIG_FILE), "{msg}");
    }

    #[test]
    fn a_text_width_the_heads_do_not_divide_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        tiny_generator(dir.path());
        write_shape(dir.path(), r#"{"d_model":16,"layers":1,"heads":3}"#);
        let (msg, field, value, expected) = shape_error(dir.path());
        assert_eq!((field, value), ("d_model", 16), "{msg}");
        assert!(expected.contains("a multiple of heads = 3"), "{msg}");
    }

    #[test]
    fn a_text_width_other_than_the_transformers_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        tiny_generator(dir.path());
        write_shape(dir.path(), r#"{"d_model":8,"layers":1,"heads":2}"#);
        let (msg, field, value, expected) = shape_error(dir.path());
        assert_eq!((field, value), ("d_model", 8), "{msg}");
        assert!(
            expected.contains("joint_attention_dim = 16")
                && expected.contains(dit_models::weights::CONFIG_FILE),
            "{msg}"
        );
        // the world reads the transformer's width from its config.json
        let err = ShapesWorld::<B>::load(dir.path(), &[], &Default::default()).unwrap_err();
        assert!(
            matches!(
                err,
                TrainerError::TextEncoderShape {
                    field: "d_model",
                    value: 8,
                    ..
                }
            ),
            "{err}"
        );
    }

    /// `text_encoder.mpk` replaced by the record of an encoder of shape `other`.
    fn replace_weights(dir: &Path, other: &TextEncoderConfig) -> PathBuf {
        let path = dir.join(TEXT_WEIGHTS_FILE);
        let text = other.init::<B>(&Default::default());
        std::fs::write(&path, text_encoder_bytes(&text, &path).unwrap()).unwrap();
        path
    }

    /// `missing`, `unexpected` and `mismatched` of a [`TrainerError::WeightsMismatch`].
    type Mismatch = (Vec<String>, Vec<String>, Vec<(String, String, String)>);

    fn weights_mismatch(dir: &Path) -> Mismatch {
        let err = ShapesGenerator::<B>::load(dir, &Default::default()).unwrap_err();
        match err {
            TrainerError::WeightsMismatch {
                path,
                missing,
                unexpected,
                mismatched,
            } => {
                assert_eq!(path, dir.join(TEXT_WEIGHTS_FILE));
                (missing, unexpected, mismatched)
            }
            other => panic!("expected WeightsMismatch, got {other}"),
        }
    }

    #[test]
    fn text_weights_of_another_width_are_refused_naming_each_parameter() {
        let dir = tempfile::tempdir().unwrap();
        tiny_generator(dir.path());
        replace_weights(dir.path(), &tiny_text().with_d_model(8));
        let (missing, unexpected, mismatched) = weights_mismatch(dir.path());
        assert!(missing.is_empty() && unexpected.is_empty());
        let find = |name: &str| {
            mismatched
                .iter()
                .find(|(p, _, _)| p == name)
                .unwrap_or_else(|| panic!("{name} in {mismatched:?}"))
                .clone()
        };
        assert_eq!(
            find("embed.weight"),
            (
                "embed.weight".to_string(),
                format!("{:?}", [VOCABULARY.len(), 8]),
                format!("{:?}", [VOCABULARY.len(), 16])
            )
        );
        assert_eq!(find("position").1, format!("{:?}", [MAX_PROMPT_WORDS, 8]));
        assert_eq!(
            find("encoder.layers.0.mha.query.weight").2,
            format!("{:?}", [16, 16])
        );
    }

    #[test]
    fn text_weights_with_another_layer_count_are_refused_naming_the_layers() {
        let dir = tempfile::tempdir().unwrap();
        tiny_generator(dir.path());
        replace_weights(dir.path(), &tiny_text().with_layers(3));
        let (missing, unexpected, mismatched) = weights_mismatch(dir.path());
        assert!(missing.is_empty() && mismatched.is_empty());
        assert_eq!(unexpected, ["encoder.layers.1", "encoder.layers.2"]);

        write_shape(dir.path(), r#"{"d_model":16,"layers":2,"heads":2}"#);
        replace_weights(dir.path(), &tiny_text());
        let (missing, unexpected, _) = weights_mismatch(dir.path());
        assert_eq!(
            (missing, unexpected),
            (vec!["encoder.layers.1".to_string()], vec![])
        );
    }

    #[test]
    fn the_text_encoder_file_is_what_burns_file_recorder_writes() {
        let dir = tempfile::tempdir().unwrap();
        let g = tiny_generator(&dir.path().join("ours"));
        g.text
            .clone()
            .save_file(
                dir.path().join("burn").join("text_encoder"),
                &TextRecorder::new(),
            )
            .unwrap();
        let ours = std::fs::read(dir.path().join("ours").join(TEXT_WEIGHTS_FILE)).unwrap();
        let burns = std::fs::read(dir.path().join("burn").join(TEXT_WEIGHTS_FILE)).unwrap();
        // (the generator was never read before its save: the file holds its weights)
        assert!(
            ours == burns,
            "{} bytes vs burn's {}, first difference at byte {:?}",
            ours.len(),
            burns.len(),
            ours.iter().zip(&burns).position(|(a, b)| a != b)
        );
        assert!(!durable::tmp_path(&dir.path().join("ours").join(TEXT_WEIGHTS_FILE)).exists());
        let back =
            ShapesGenerator::<B>::load(&dir.path().join("ours"), &Default::default()).unwrap();
        assert_eq!(
            text_encoder_bytes(&back.text, Path::new("back")).unwrap(),
            ours
        );
    }

    #[test]
    fn the_committed_text_encoder_loads_and_encodes_to_its_own_bytes() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/shapes_world");
        let (text, config) = load_text_encoder::<B>(
            &dir,
            transformer_config().joint_attention_dim,
            "the shapes world's transformer",
            &Default::default(),
        )
        .unwrap();
        assert_eq!(config.d_model, transformer_config().joint_attention_dim);
        let file = std::fs::read(dir.join(TEXT_WEIGHTS_FILE)).unwrap();
        assert!(text_encoder_bytes(&text, Path::new("fixture")).unwrap() == file);
    }

    const SAVE_CHILD_DIR: &str = "FLOWRL_SHAPES_SAVE_CHILD_DIR";

    /// The child process of [`the_text_encoder_is_staged_then_renamed_into_place`]: saves a
    /// tiny generator into `$FLOWRL_SHAPES_SAVE_CHILD_DIR` and prints the durable steps taken.
    #[test]
    #[ignore = "the child process of the_text_encoder_is_staged_then_renamed_into_place"]
    fn save_child() {
        let dir = PathBuf::from(std::env::var_os(SAVE_CHILD_DIR).expect(SAVE_CHILD_DIR));
        tiny_generator(&dir);
        println!("STEPS {}", durable::fault::steps());
    }

    /// Runs [`save_child`] into `dir`, killed just before durable step `kill_at` if given;
    /// the steps it took when it ran to its end.
    #[cfg(unix)]
    fn run_save_child(dir: &Path, kill_at: Option<u64>) -> Option<u64> {
        use std::os::unix::process::ExitStatusExt;
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--exact",
            "shapes_world::tests::save_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(SAVE_CHILD_DIR, dir)
        .env_remove(durable::fault::KILL_AT_VAR);
        if let Some(n) = kill_at {
            cmd.env(durable::fault::KILL_AT_VAR, n.to_string());
        }
        let out = cmd.output().unwrap();
        if out.status.signal() == Some(9) {
            return None;
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "the child failed: {stdout}");
        // the harness prints the test's name on the same line
        let n = stdout.split("STEPS ").nth(1)?.split_whitespace().next()?;
        Some(n.parse().unwrap())
    }

    /// A crash while the text encoder's weights are written leaves no torn `text_encoder.mpk`:
    /// they are staged in `text_encoder.mpk.tmp`, fsynced, then renamed into place.
    #[cfg(unix)]
    #[test]
    fn the_text_encoder_is_staged_then_renamed_into_place() {
        let root = tempfile::tempdir().unwrap();
        let steps = run_save_child(&root.path().join("whole"), None).expect("STEPS");
        // the weights are the last file written: create, write, fsync, rename, fsync dir
        let dir = root.path().join("killed");
        assert_eq!(run_save_child(&dir, Some(steps - 1)), None, "killed");
        let weights = dir.join(TEXT_WEIGHTS_FILE);
        let staged = durable::tmp_path(&weights);
        assert!(!weights.exists(), "visible before its rename");
        assert!(staged.exists(), "the weights were not staged");
        // the staged file is complete: renamed by hand, the generator loads
        std::fs::rename(&staged, &weights).unwrap();
        ShapesGenerator::<B>::load(&dir, &Default::default()).unwrap();
    }
}
