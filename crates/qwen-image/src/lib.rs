//! # qwen-image
//!
//! The components of a diffusers Qwen-Image directory beside its transformer (which is
//! `dit-models`'), in burn, each loaded from the files a user downloads:
//!
//! * [`text_encoder`]: the text path of Qwen2.5-VL (`text_encoder/`): token embedding,
//!   grouped-query attention with RoPE, RMSNorm, SiLU-gated MLPs, the final norm; transformers 4
//!   and 5 config layouts and both weight-name layouts; every config key implemented, refused,
//!   or named as having no effect on the text path.
//! * [`tokenizer`]: the Qwen2 byte-level BPE (`tokenizer/`), from `tokenizer.json` or from
//!   `vocab.json` + `merges.txt` with the added tokens of `tokenizer_config.json`.
//! * [`prompt`]: Qwen-Image's prompt encoding, as `QwenImagePipeline.encode_prompt` does it.
//! * [`vae`]: `AutoencoderKLQwenImage` (`vae/`) on single images: decode, encode (mean and
//!   log-variance), the per-channel latent normalisation; [`latents`]: the 2×2 packing the
//!   transformer's tokens use.
//! * [`pipeline`]: a whole directory from its `model_index.json`, every component checked;
//!   the frozen components (tokenizer, text encoder, VAE) loaded, the transformer's folder
//!   handed to `dit-models`.
//!
//! Numerically equal to transformers / diffusers: `fixtures/generate/qwen_image_fixtures.py`
//! writes a tiny random Qwen-Image directory with `save_pretrained` and the reference outputs,
//! which `tests/text_encoder.rs` and `tests/vae.rs` compare against.
//!
//! Not here: video (more than one frame through the VAE) and sampling, which is RL code
//! (`sde-math`) that model crates do not know; the trainer's Qwen-Image world composes them.
#![deny(missing_docs)]

mod error;
pub mod latents;
pub mod pipeline;
pub mod prompt;
pub mod text_encoder;
pub mod tokenizer;
pub mod vae;

pub use error::{ConfigProblem, QwenImageError};
pub use pipeline::{FrozenComponents, PipelineIndex};
pub use prompt::{PromptEmbeds, PromptEncoder};
pub use text_encoder::{TextEncoder, TextEncoderConfig};
pub use tokenizer::{QwenTokenizer, TokenBatch};
pub use vae::{Vae, VaeConfig};
