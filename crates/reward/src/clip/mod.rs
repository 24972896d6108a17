//! CLIP in burn: configuration (transformers' `CLIPConfig` layout), the model
//! (`CLIPModel`: vision ViT, causal text transformer, projections, `logit_scale`), weight
//! loading from transformers safetensors checkpoints, the image processor and the tokenizer.
//!
//! Numerically equal to transformers 5.24 (`modeling_clip.py`, `CLIPImageProcessorPil`,
//! `CLIPTokenizer`): see `tests/clip_parity.rs` and the fixtures of
//! `fixtures/generate/reward_fixtures.py`.

mod config;
mod model;
mod preprocess;
mod tokenizer;
mod weights;

pub use config::{ClipConfig, ClipTextConfig, ClipVisionConfig, HiddenAct, INERT_KEYS};
pub use model::{
    Attention, CHECKPOINT_REMAP, ClipModel, Encoder, EncoderLayer, LayerNorm, Linear, Mlp,
    TextEmbeddings, TextModel, VisionEmbeddings, VisionModel, pooling_position,
};
pub use preprocess::{
    CLIP_MEAN, CLIP_STD, ClipImageProcessor, PREPROCESSOR_FILE, PROCESSOR_INERT_KEYS, Resample,
    center_crop, resize,
};
pub use tokenizer::{
    ClipTokenizer, Padding, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, TOKENIZER_INERT_KEYS,
};
pub use weights::{CONFIG_FILE, Checkpoint, INDEX_FILE, SINGLE_FILE};
