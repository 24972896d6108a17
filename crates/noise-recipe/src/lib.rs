//! # noise-recipe
//!
//! Bit-stable noise for flow-matching RL: the initial latent x_T regenerated from a shipped
//! recipe, the per-step SDE noise policy, stable sample ids, and a PyTorch-compatible CPU
//! normal generator for interop with PyTorch engines.
//!
//! * [`NoiseRecipe`]: per-sample group ids, latent shape and base seed. Every engine
//!   regenerates x_T on the CPU in `f32` with one seeded generator per group (PCG-XSL-RR 128/64
//!   keyed by SplitMix64, `keyed_rng::PcgStream::keyed`), then moves it to its device
//!   ([`HostLatents::to_tensor`]). A sample's bits depend on its own group id only, never on the
//!   batch it is in. [`resolve_initial_noise`]: shipped `initial_latents` win over the recipe.
//! * [`StepNoise`]: engine-local per-step noise by default, or request-local, sample-unique
//!   [`DenoiseSeeds`] (duplicates refused).
//! * [`SampleId`]: `prompt:<prompt_id or sample_id>:sample:<slot>` ([`SampleIdMode::Metadata`])
//!   or `prompt:<group_index>:sample:<slot>` ([`SampleIdMode::Positional`]).
//! * [`TorchGenerator`]: `torch.randn(shape, generator=torch.Generator().manual_seed(s))` in
//!   `float32`, bit for bit, for both of PyTorch's CPU kernels ([`TorchCpuKernel`]).
//!
//! Why the crate's own normals are platform-independent: Box-Muller needs `log`, `sin` and
//! `cos`, and platform libms differ in the last bit. The native generator evaluates them with
//! fixed polynomials (the Cephes approximations PyTorch's vectorized CPU kernel uses), built
//! from correctly rounded operations only.
//!
//! ```
//! use burn::backend::Flex;
//! use noise_recipe::{NoiseAlgorithm, NoiseRecipe, PromptMeta, SampleId, SampleIdMode};
//!
//! let meta = PromptMeta { prompt_id: Some("a red bicycle"), sample_id: None };
//! let ids: Vec<SampleId> = (0..4).map(|slot| SampleId::new(SampleIdMode::Metadata, 0, meta, slot)).collect();
//! let recipe = NoiseRecipe::for_samples(1234, vec![16, 8, 8], &ids, NoiseAlgorithm::Pcg64BoxMuller).unwrap();
//! let x_t = recipe.generate();
//! assert_ne!(x_t.sample(0), x_t.sample(1)); // every candidate starts from its own noise
//! let on_device = x_t.to_tensor::<Flex, 4>(&Default::default()).unwrap();
//! assert_eq!(on_device.dims(), [4, 16, 8, 8]);
//! ```
#![deny(missing_docs)]

mod cephes;
mod error;
mod mt19937;
mod native;
mod recipe;
mod sample_id;
mod step_noise;
mod torch;

pub use error::NoiseError;
pub use native::fill_normals;
pub use recipe::{HostLatents, NoiseAlgorithm, NoiseRecipe, resolve_initial_noise};
pub use sample_id::{PromptMeta, SampleId, SampleIdMode};
pub use step_noise::{DenoiseSeeds, StepNoise, forward_noise};
pub use torch::{TorchCpuKernel, TorchGenerator};
