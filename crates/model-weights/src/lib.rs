//! # model-weights
//!
//! The one safetensors weight loader of the model crates (`dit-models`' Qwen-Image transformer,
//! `reward`'s CLIP, `qwen-image`'s text encoder and VAE). It knows files, not models:
//!
//! * [`Checkpoint`]: one `.safetensors` file, or the shards an index JSON names
//!   (`{"weight_map": {key: shard}}`), opened from a directory by the file names of a
//!   [`Layout`] ([`DIFFUSERS`], [`TRANSFORMERS`]); memory-mapped, headers validated on open,
//!   every key in exactly one shard; variant files (`diffusion_pytorch_model.bf16.safetensors`)
//!   by [`Checkpoint::open_variant`].
//! * Listing ([`Checkpoint::keys`], [`Checkpoint::meta`]: dtype and shape) and reading one
//!   tensor at a time from the mapping: [`Checkpoint::read_f32`], [`Checkpoint::read_f64`],
//!   [`Checkpoint::read_as`] a requested [`FloatDtype`] (f64, f32, f16, bf16 stored; bf16 ->
//!   f32 exact), the raw bytes ([`Checkpoint::bytes`]), the `__metadata__` of each file.
//! * The load report ([`Checkpoint::report`], [`Checkpoint::check`]): what a model expects,
//!   checked against the headers before any tensor is read; every missing, unexpected,
//!   mis-shaped and non-float key is listed in one [`WeightReport`] ([`WeightsError::Weights`]).
//! * The content hash ([`ContentHasher`], [`hash_tensors`], [`Checkpoint::content_hash`]) of a
//!   base model, independent of sharding and of the stored float dtype. Its bytes are recorded
//!   in adapter contracts and checkpoints and never change (pinned by the tests).
//!
//! A model crate maps its parameters to `(key, shape)` pairs, calls [`Checkpoint::check`], then
//! reads each tensor and lays it out itself (e.g. [`transpose`] of PyTorch's `[out, in]`).
//! [`PRETRAINED_CONFIG_KEYS`] lists the attributes every transformers config carries, for the
//! config readers of the model crates. Writing checkpoints is not here; this crate only reads.
//! Its one device-side helper is what every model needs once loaded: [`cast_float_params`]
//! casts a module's weights to another float dtype (bf16 for a GPU backend).
#![deny(missing_docs)]

mod cast;
mod checkpoint;
mod convert;
mod error;
mod hash;
mod report;
mod transformers_config;

pub use cast::{cast_float_params, in_dtype};
pub use checkpoint::{Checkpoint, DIFFUSERS, Layout, TRANSFORMERS, TensorMeta, variant_name};
pub use convert::{FloatDtype, FloatValues, decode, decode_f32, decode_f64, transpose};
pub use error::WeightsError;
pub use hash::{ContentHasher, hash_tensors, hex, tensor_digest};
pub use report::{DtypeProblem, ShapeMismatch, WeightReport};
/// The stored dtype of a tensor (safetensors' own).
pub use safetensors::Dtype;
pub use transformers_config::PRETRAINED_CONFIG_KEYS;

#[cfg(test)]
mod tests;
