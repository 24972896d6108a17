//! # flowrl
//!
//! Reinforcement-learning post-training of flow-matching image generators — FlowGRPO and its
//! family — written on [burn](https://burn.dev). This facade crate re-exports the workspace's
//! library crates and owns the thin example binaries and the benches.
//!
//! | crate | what it holds |
//! | --- | --- |
//! | [`sde_math`] | per-step SDE/ODE kernels and log-probs, one code path for sampling and replay |
//!
//! The rest of the family (`schedule`, `noise-recipe`, `trajectory`, `flow-grpo`, `dit-models`,
//! `reward`, `trainer-fsdp`) joins as each crate gets real content; see `docs/ARCHITECTURE.md`.
#![deny(missing_docs)]

pub mod backend;

pub use sde_math;
