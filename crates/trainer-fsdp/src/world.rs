//! The world seam: everything the generic run ([`crate::run::Run`]) needs to know about *what*
//! it trains on, behind one trait.
//!
//! A world is the prompt source (training draws and a fixed held-out set), the prompt encoder
//! that turns prompts into the policy's conditioning and how that conditioning is stored in
//! and restored from a trajectory, the latent geometry, the policy (a velocity model with its
//! adapters), the decoder from latents to samples (images, for a text-to-image world) and the
//! scorers chosen by the config. The run's phases are written once against this trait and
//! never name a world.
//!
//! Invariants a world must keep (the run's bit-for-bit guarantees rest on them):
//!
//! * [`World::encode`] is row-wise: row `i` of the conditioning depends only on prompt `i`, so
//!   a chunk of a batch sampled on its own thread sees what the whole batch would.
//! * [`World::restore_conditioning`] of what [`World::store_conditioning`] wrote gives the
//!   values the sampler fed the model, exactly (store at `f32`, or at the precision the
//!   sampler used).
//! * [`World::decode`] and [`World::score`] are deterministic functions of their inputs.
//!
//! The shapes world ([`crate::shapes_world::ShapesWorld`]) is the first implementation, the
//! Qwen-Image world ([`crate::qwen_image_world::QwenImageWorld`]) the second; a test
//! implements an analytic Gaussian world from outside the crate.

use std::path::Path;

use burn::module::AutodiffModule;
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use dit_models::AdapterContract;
use reward::{Components, RgbImage};
use trajectory::{Conditions, Digest};
use velocity_model::{Conditioning, VelocityModel};

use crate::config::Trainable;
use crate::error::TrainerError;
use crate::export::{ExportRequest, ExportedPolicy};
use crate::rng::TrainerRng;

/// One held-out evaluation prompt and the category its mean is reported under
/// (`eval/category/<category>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldOutPrompt {
    /// The prompt.
    pub prompt: String,
    /// Its category (e.g. a GenEval tag such as `counting`).
    pub category: String,
}

/// The policy a world loaded, with what the checkpoints and trajectories record about it.
#[derive(Debug)]
pub struct LoadedPolicy<M> {
    /// The policy, its adapters attached (LoRA) or every parameter trainable (full).
    pub model: M,
    /// The adapter contract under LoRA (checked on resume), `None` for full fine-tuning.
    pub contract: Option<AdapterContract>,
    /// The hash of the base weights the rollouts sample with (the trajectories' weight
    /// manifest hash).
    pub weight_hash: Digest,
}

/// The plain (non-autodiff) backend of a training backend `B`: sampling, encoding and
/// decoding run there.
pub type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// A world the generic run trains in. See the module docs for the invariants.
pub trait World<B: AutodiffBackend>: Sync {
    /// The policy's conditioning on any backend (the sampler uses the plain backend, the
    /// replay the autodiff one).
    type Cond<Bx: Backend>: Conditioning;

    /// The policy: an autodiff module that is a velocity model on the training backend and,
    /// as its inner module, on the plain backend.
    type Policy: AutodiffModule<
            B,
            InnerModule: VelocityModel<Inner<B>, Conditioning = Self::Cond<Inner<B>>> + Sync,
        > + VelocityModel<B, Conditioning = Self::Cond<B>>
        + Sync;

    /// What decoding a latent gives (an image, for a text-to-image world).
    type Sample: Send + Sync;

    /// A short name for messages and the run banner.
    fn name(&self) -> String;

    /// The packed latent shape of one sample, `[tokens, channels]` (the batch dimension
    /// comes first in every tensor).
    fn latent_shape(&self) -> [usize; 2];

    /// `n` distinct training prompts for one rollout, drawn from `rng` (the trainer's
    /// checkpointed stream), none of them held out.
    ///
    /// # Errors
    /// [`TrainerError::PromptPoolExhausted`] when fewer than `n` exist.
    fn train_prompts(&self, rng: &mut TrainerRng, n: usize) -> Result<Vec<String>, TrainerError>;

    /// The fixed held-out prompts of every evaluation.
    fn held_out(&self) -> &[HeldOutPrompt];

    /// Loads the policy to train: the base weights, then the adapter of `trainable`
    /// (a fresh one initialised as a pure function of `seed`, so that a run is reproducible
    /// whatever else draws random numbers meanwhile).
    ///
    /// # Errors
    /// Missing or mismatched weights, adapter problems.
    fn load_policy(
        &self,
        trainable: &Trainable,
        seed: u64,
        device: &B::Device,
    ) -> Result<LoadedPolicy<Self::Policy>, TrainerError>;

    /// The conditioning of a batch of prompts (one row per prompt, row-wise).
    ///
    /// # Errors
    /// A prompt the encoder cannot encode.
    fn encode(
        &self,
        prompts: &[&str],
        device: &B::Device,
    ) -> Result<Self::Cond<Inner<B>>, TrainerError>;

    /// The stored form of rows `rows` of a conditioning, one [`Conditions`] per row, for the
    /// trajectory sidecars.
    ///
    /// # Errors
    /// Non-finite or unstorable values.
    fn store_conditioning(
        &self,
        cond: &Self::Cond<Inner<B>>,
        rows: &[usize],
    ) -> Result<Vec<Conditions>, TrainerError>;

    /// The conditioning of `rows` samples that share one stored condition (the candidates of
    /// a group), on any backend.
    ///
    /// # Errors
    /// A stored condition of the wrong shape for this world.
    fn restore_conditioning<Bx: Backend>(
        &self,
        stored: &Conditions,
        rows: usize,
        device: &Bx::Device,
    ) -> Result<Self::Cond<Bx>, TrainerError>;

    /// Whether `policy` carries its own reference policy for [`World::reference_velocity`]:
    /// the pretrained model the KL terms measure drift from (for an adapted policy, the same
    /// model with its adapters off). Where it does not (a full fine-tune), a run whose
    /// algorithm uses a reference keeps a frozen copy of the policy as loaded, before any
    /// checkpoint is restored, and evaluates that instead
    /// ([`TrainContext::reference_velocity`](crate::run::TrainContext::reference_velocity)).
    fn has_reference(&self, policy: &Self::Policy) -> bool;

    /// The reference policy's velocity at `(x, sigma, cond)`, detached, on the training
    /// backend, for a policy that carries its reference ([`World::has_reference`]; no copy of
    /// the policy: e.g. the same LoRA model with its adapters off).
    ///
    /// # Errors
    /// [`TrainerError::NoReference`] when [`World::has_reference`] is false.
    fn reference_velocity(
        &self,
        policy: &Self::Policy,
        x: Tensor<B, 3>,
        sigma: Tensor<B, 1>,
        cond: &Self::Cond<B>,
    ) -> Result<Tensor<B, 3>, TrainerError>;

    /// Decodes final latents `[batch, ...latent_shape]` into samples.
    ///
    /// # Errors
    /// Non-finite outputs and decoder errors.
    fn decode(&self, latents: Tensor<Inner<B>, 3>) -> Result<Vec<Self::Sample>, TrainerError>;

    /// Scores samples with the scorers the config chose: one [`Components`] per sample, in
    /// order. A missing or non-finite component is not an error here (the advantages phase
    /// fails that group); an error is a problem with the whole batch.
    ///
    /// # Errors
    /// Scorer errors.
    fn score(
        &self,
        samples: &[Self::Sample],
        prompts: &[String],
    ) -> Result<Vec<Components>, TrainerError>;

    /// A picture of a sample for the run's PNGs and sample grids, if it has one.
    fn image(&self, sample: &Self::Sample) -> Option<RgbImage>;

    /// Files a checkpoint holds beside its own: `policy`'s trainable weights in the model
    /// family's format, readable without burn (name, bytes). The default: none.
    ///
    /// # Errors
    /// Model errors.
    fn checkpoint_files(
        &self,
        policy: &Self::Policy,
    ) -> Result<Vec<(&'static str, Vec<u8>)>, TrainerError> {
        let _ = policy;
        Ok(Vec::new())
    }

    /// Writes `policy` (a committed checkpoint's, rebuilt by [`crate::export::export`]) in
    /// `request.form` into the empty directory `out`; with `request.verify`, reloads what it
    /// wrote the way the form's users load it and compares the velocities with `policy`'s on
    /// a fixed probe ([`TrainerError::ExportVerify`] above the form's tolerance).
    ///
    /// The default: this world has no export formats.
    ///
    /// # Errors
    /// [`TrainerError::ExportUnsupported`], [`TrainerError::ExportVerify`], model and IO
    /// errors.
    fn export_policy(
        &self,
        policy: &Self::Policy,
        request: &ExportRequest,
        out: &Path,
    ) -> Result<ExportedPolicy, TrainerError> {
        let _ = (policy, out);
        Err(TrainerError::ExportUnsupported {
            world: self.name(),
            form: request.form.as_str(),
            reason: "the world defines no export formats".into(),
        })
    }
}
