//! # flowrl
//!
//! Reinforcement-learning post-training of flow-matching image generators — FlowGRPO and its
//! family — written on [burn](https://burn.dev). This facade crate re-exports the workspace's
//! library crates and owns the thin example binaries and the benches.
//!
//! | crate | what it holds |
//! | --- | --- |
//! | [`sde_math`] | per-step SDE/ODE kernels and log-probs, one code path for sampling and replay |
//! | [`schedule`] | sigma schedules and the plans of which steps are stochastic and trained |
//! | [`noise_recipe`] | bit-stable initial noise, per-step noise policies, sample ids |
//!
//! The rest of the family (`trajectory`, `flow-grpo`, `dit-models`,
//! `reward`, `trainer-fsdp`) joins as each crate gets real content; see `docs/ARCHITECTURE.md`.
#![deny(missing_docs)]

pub mod backend;

pub use noise_recipe;
pub use schedule;
pub use sde_math;
