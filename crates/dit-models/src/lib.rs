//! # dit-models
//!
//! The Qwen-Image MMDiT (`QwenImageTransformer2DModel`) in burn, numerically equivalent to
//! diffusers 0.35.2, with diffusers-compatible weight loading and LoRA:
//!
//! * [`QwenImageTransformer2DModel`] and its [`QwenImageConfig`] (`qwen_image()`, `tiny()`):
//!   image/text input projections, text RMSNorm, timestep embedding, per-block AdaLN
//!   modulation of both streams, joint attention over `[text, image]` with QK RMSNorm, the
//!   text padding mask and the 3-axis RoPE ([`rope`]), GELU-tanh MLPs, `norm_out` + `proj_out`.
//!   Struct fields mirror the diffusers checkpoint keys; the remaining differences are the one
//!   table [`model::CHECKPOINT_REMAP`].
//! * [`weights`]: single-file and sharded diffusers safetensors checkpoints through the shared
//!   loader `model-weights` (memory-mapped, converted per tensor, bf16 -> f32 on the CPU, every
//!   missing / unexpected / mis-shaped key reported together; the content hash of the base
//!   weights); merged diffusers export, written durably (no torn file on an interruption).
//! * [`lora`]: adapters on `Linear` layers selected by module-name suffix, `x·W + s·(x·A)·B`,
//!   frozen base, per-call disable ([`Adapters`]), merge/unmerge, PEFT directory import and
//!   export, and the [`AdapterContract`] recorded with every save and checked on load.
//! * [`adapter_files`]: the diffusers LoRA file (`pytorch_lora_weights.safetensors` with its
//!   `lora_adapter_metadata`) written and read, and one import of either form
//!   ([`read_adapter`]) that says where its alpha came from and what it did with a dropout.
//! * [`VelocityModel`]: the small trait samplers and trainers take instead of this type.
//! * [`checkpointing`]: forward + backward in one call, optionally with per-block activation
//!   checkpointing ([`ActivationCheckpointing::PerBlock`]).
//!
//! burn is kept behind three thin wrappers: [`attention`] (the attention op), [`rope`] (host
//! cos/sin tables; burn has no complex dtype) and [`weights`] (tensor files).
//!
//! This crate knows nothing about RL: no schedules, noise, trajectories or objectives.
//!
//! ```
//! use burn::backend::Flex;
//! use burn::tensor::{Distribution, Tensor};
//! use dit_models::{ImageShape, QwenImageConfig, QwenImageInput};
//!
//! let dev = Default::default();
//! let model = QwenImageConfig::tiny().init::<Flex>(&dev);
//! let grid = ImageShape::new(1, 2, 3); // 6 image tokens, a non-square grid
//! let out = model.forward(QwenImageInput {
//!     hidden_states: Tensor::random([1, 6, 16], Distribution::Default, &dev),
//!     encoder_hidden_states: Tensor::random([1, 4, 24], Distribution::Default, &dev),
//!     encoder_hidden_states_mask: None,
//!     timestep: Tensor::from_floats([0.5], &dev),
//!     img_shapes: vec![grid],
//! });
//! assert_eq!(out.dims(), [1, 6, 2 * 2 * 4]);
//! ```
#![deny(missing_docs)]

pub mod adapter_files;
pub mod attention;
pub mod checkpointing;
mod config;
mod error;
pub mod layers;
pub mod lora;
pub mod model;
pub mod rope;
mod velocity;
pub mod weights;

pub use adapter_files::{AdapterFormat, AdapterImport, AlphaSource, ImportDropout, read_adapter};
pub use checkpointing::{ActivationCheckpointing, BackwardOutput};
pub use config::{INERT_CONFIG_KEYS, NORM_EPS, QwenImageConfig, ROPE_THETA, UNIMPLEMENTED_FLAGS};
pub use error::{
    ConfigProblem, ContractMismatch, DitError, DtypeProblem, KeyProblem, ShapeMismatch,
    WeightReport,
};
pub use layers::Adapters;
pub use lora::{AdapterContract, DEFAULT_TARGET_MODULES, LoraConfig};
pub use model::{QwenImageInput, QwenImageTransformer2DModel};
pub use rope::ImageShape;
pub use velocity::{Conditioning, QwenImageConditioning, VelocityModel, WithoutAdapters};
pub use weights::{Checkpoint, ExportDtype, ExportOptions, LoadOptions, WeightDtype};
