//! # flowrl
//!
//! Reinforcement-learning post-training of flow-matching image generators — FlowGRPO and its
//! family — written on [burn](https://burn.dev). This facade crate re-exports the workspace's
//! main library crates (the table below; not `velocity-model`, `keyed-rng`, `durable`,
//! `prompt-data` or `fused-ops`) and owns the thin example binaries and the benches.
//!
//! | crate | what it holds |
//! | --- | --- |
//! | [`sde_math`] | per-step SDE/ODE kernels and log-probs, one code path for sampling and replay |
//! | [`schedule`] | sigma schedules and the plans of which steps are stochastic and trained |
//! | [`noise_recipe`] | bit-stable initial noise, per-step noise policies, sample ids |
//! | [`trajectory`] | rollout records and their crash-safe safetensors sidecars |
//! | [`flow_grpo`] | advantages, the clipped objective, KL, replay log-probs, update plans |
//! | [`model_weights`] | the safetensors loader every model crate shares; casting a module's weights to another float dtype |
//! | [`dit_models`] | the Qwen-Image MMDiT with LoRA, diffusers-compatible weights |
//! | [`qwen_image`] | the Qwen2.5-VL text encoder, its tokenizer, Qwen-Image's prompt encoding, the VAE |
//! | [`reward`] | scorers (PickScore, JPEG, remote, the shapes world) and their combination |
//! | [`trainer_fsdp`] | the training loop: config and preflight, phases, checkpoints, monitoring |
//!
//! See `docs/ARCHITECTURE.md` for the layer map.
#![deny(missing_docs)]

pub mod backend;

pub use dit_models;
pub use flow_grpo;
pub use model_weights;
pub use noise_recipe;
pub use qwen_image;
pub use reward;
pub use schedule;
pub use sde_math;
pub use trainer_fsdp;
pub use trajectory;
