//! The Qwen-Image VAE (`AutoencoderKLQwenImage`) on single images: configuration, model and
//! weight loading.

mod config;
mod model;
mod weights;

pub use config::{CLASS_NAME, INERT_KEYS, VaeConfig};
pub use model::{
    AttentionBlock, Conv, Decoder, DownStage, Encoder, LatentDistribution, MidBlock, ResidualBlock,
    RmsNorm, UpStage, Vae,
};
pub use weights::CONFIG_FILE;
