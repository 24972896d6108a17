//! # model-weights
//!
//! (Being written: the one safetensors weight loader of the model crates.)
#![deny(missing_docs)]
