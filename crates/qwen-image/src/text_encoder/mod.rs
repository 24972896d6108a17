//! The Qwen2.5-VL text encoder (its text path): configuration, model and weight loading.

mod config;
mod model;
mod weights;

pub use config::{ConfigLayout, GENERIC_KEYS, INERT_KEYS, TextEncoderConfig};
pub use model::{
    Attention, DecoderLayer, Linear, Mlp, RmsNorm, TextEncoder, causal_padding_bias, rope_tables,
};
pub use weights::{CONFIG_FILE, KeyLayout, expected_keys};
