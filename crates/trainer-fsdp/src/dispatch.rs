//! From a config to concrete types: the world its `model.generator` names and the algorithm
//! its objective names, handed to a [`Job`] that is generic over both (the main example's job
//! builds a [`Run`](crate::run::Run) and runs it).
//!
//! ```no_run
//! use burn::backend::{Autodiff, Flex};
//! use trainer_fsdp::dispatch::{Job, dispatch};
//! use trainer_fsdp::{Algorithm, RecipeName, TrainConfig, TrainerError, World};
//!
//! type B = Autodiff<Flex>;
//! struct Describe;
//! impl Job<B> for Describe {
//!     type Output = String;
//!     fn run<W: World<B>, A: Algorithm<B, W>>(self, world: W, algorithm: A) -> Result<String, TrainerError> {
//!         Ok(format!("{} in the {}", algorithm.name(), world.name()))
//!     }
//! }
//! let cfg = TrainConfig::from_recipe(RecipeName::ShapesWorldLora, &[])?;
//! let pre = cfg.preflight()?;
//! println!("{}", dispatch::<B, _>(&cfg, &pre, &Default::default(), Describe)?);
//! # Ok::<(), TrainerError>(())
//! ```

use burn::tensor::backend::AutodiffBackend;

use crate::algorithm::{Algorithm, FlowGrpo};
use crate::config::{GeneratorSource, Preflight, TrainConfig};
use crate::error::TrainerError;
use crate::shapes_world::ShapesWorld;
use crate::world::World;

/// Work to do with whichever world and algorithm a config names.
pub trait Job<B: AutodiffBackend> {
    /// What the job returns.
    type Output;

    /// Does the work with the configured world and algorithm.
    ///
    /// # Errors
    /// The job's own.
    fn run<W: World<B>, A: Algorithm<B, W>>(
        self,
        world: W,
        algorithm: A,
    ) -> Result<Self::Output, TrainerError>;
}

/// Loads the world that `cfg.model.generator` names, builds the algorithm of the validated
/// config, and runs `job` with both.
///
/// # Errors
/// [`TrainerError::GeneratorUnsupported`] for a generator whose pipeline does not exist yet
/// (a diffusers Qwen-Image directory: the text encoder, tokenizer and VAE are missing), world
/// loading errors, and the job's errors.
pub fn dispatch<B: AutodiffBackend, J: Job<B>>(
    cfg: &TrainConfig,
    pre: &Preflight,
    device: &B::Device,
    job: J,
) -> Result<J::Output, TrainerError> {
    match &cfg.model.generator {
        GeneratorSource::ShapesWorld { dir } => {
            let world = ShapesWorld::<B::InnerBackend>::load(dir, device)?;
            job.run(world, FlowGrpo::new(pre.clip_range))
        }
        GeneratorSource::QwenImage { model_path, .. } => Err(TrainerError::GeneratorUnsupported {
            generator: format!(
                "a diffusers Qwen-Image directory ({})",
                model_path.display()
            ),
            missing: "the Qwen-Image pipeline around the transformer: the Qwen2.5-VL text encoder and its \
                          tokenizer, and the VAE decoder (dit-models loads and trains the transformer; PickScore \
                          scores images) — the shapes world is the world that trains until they exist",
        }),
    }
}
