//! Per-step SDE noise: engine-local by default, request-local and sample-unique on request.

use std::collections::HashMap;

use keyed_rng::{PcgStream, fnv1a64, splitmix64};

use crate::error::NoiseError;
use crate::native;
use crate::sample_id::SampleId;

const DOMAIN_SEED: u64 = fnv1a64(b"flowrl/noise-recipe/denoise-seed/v1");
const DOMAIN_STEP: u64 = fnv1a64(b"flowrl/noise-recipe/step-noise/v1");
const DOMAIN_FORWARD: u64 = fnv1a64(b"flowrl/noise-recipe/forward-noise/v1");

/// Where the per-step SDE noise of a request comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepNoise {
    /// The engine's own generator (the default): only x_T is reproducible; replay re-scores the
    /// stored next sample instead of re-drawing the noise, so the ratio does not need it.
    EngineLocal,
    /// Request-local, sample-unique generators (`denoise_seeds`): the noise of every (sample,
    /// step) is a pure function of the sample's seed and the step index, for end-to-end
    /// reproducibility.
    RequestLocal(DenoiseSeeds),
}

impl Default for StepNoise {
    /// [`StepNoise::EngineLocal`], the historical behaviour: only x_T is reproducible.
    fn default() -> Self {
        StepNoise::EngineLocal
    }
}

impl StepNoise {
    /// Whether the per-step noise can be regenerated from the request.
    pub fn is_reproducible(&self) -> bool {
        matches!(self, StepNoise::RequestLocal(_))
    }
}

/// One per-step-noise seed per sample of a request, all distinct.
///
/// Distinctness is enforced: resetting one shared generator to the same seed for every sample
/// of a GRPO group would give the whole group the same noise and freeze exploration.
///
/// ```
/// use noise_recipe::{DenoiseSeeds, PromptMeta, SampleId, SampleIdMode};
/// let meta = PromptMeta { prompt_id: Some("cat"), sample_id: None };
/// let ids: Vec<SampleId> = (0..2).map(|slot| SampleId::new(SampleIdMode::Metadata, 0, meta, slot)).collect();
/// let seeds = DenoiseSeeds::for_samples(1234, &ids).unwrap();
/// let (a, b) = (seeds.noise(0, 3, &[4, 4]), seeds.noise(1, 3, &[4, 4]));
/// assert_ne!(a, b); // two samples of one group: different noise at the same step
/// assert_eq!(a, seeds.noise(0, 3, &[4, 4])); // reproducible
/// assert!(DenoiseSeeds::new(vec![9, 9]).is_err()); // a shared seed is refused
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DenoiseSeeds(Vec<u64>);

impl DenoiseSeeds {
    /// Uses the given seeds, one per sample.
    ///
    /// # Errors
    /// [`NoiseError::DuplicateDenoiseSeed`] naming the first repeated seed.
    pub fn new(seeds: Vec<u64>) -> Result<Self, NoiseError> {
        let mut seen: HashMap<u64, usize> = HashMap::with_capacity(seeds.len());
        for (i, &s) in seeds.iter().enumerate() {
            if let Some(&first) = seen.get(&s) {
                return Err(NoiseError::DuplicateDenoiseSeed {
                    seed: s,
                    first,
                    second: i,
                });
            }
            seen.insert(s, i);
        }
        Ok(Self(seeds))
    }

    /// Seeds derived from a base seed and each sample's stable id (SplitMix64 of both).
    ///
    /// # Errors
    /// [`NoiseError::DuplicateDenoiseSeed`] when two samples share an id (or, with negligible
    /// probability, a derived seed).
    pub fn for_samples(base_seed: u64, samples: &[SampleId]) -> Result<Self, NoiseError> {
        let seeds = samples
            .iter()
            .map(|id| {
                let h = splitmix64(DOMAIN_SEED ^ base_seed);
                splitmix64(h ^ id.noise_key())
            })
            .collect();
        Self::new(seeds)
    }

    /// The seeds, one per sample.
    pub fn seeds(&self) -> &[u64] {
        &self.0
    }

    /// The standard-normal noise of `sample` at denoising step `step`, for one latent of
    /// `latent_shape` (row-major `f32`).
    ///
    /// # Panics
    /// If `sample` is not below the number of seeds.
    pub fn noise(&self, sample: usize, step: usize, latent_shape: &[usize]) -> Vec<f32> {
        let numel: usize = latent_shape.iter().product();
        let mut rng = PcgStream::keyed(DOMAIN_STEP, &[self.0[sample], step as u64]);
        let mut out = vec![0.0f32; numel];
        native::fill_normals(&mut rng, &mut out);
        out
    }
}

/// The standard-normal noise an objective on the forward process noises candidate `seed`'s
/// clean endpoint with at training draw `index` (`x_σ = (1 - σ) x0 + σ ε`), for one latent of
/// `latent_shape` (row-major `f32`). `seed` is the candidate's per-step-noise seed
/// ([`DenoiseSeeds::seeds`], stored with its trajectory as the seed hash); the draw is
/// independent of the sampler's step noise (its own domain), the same for every replay of the
/// same `(seed, index)`, so the current and the frozen policy see one noise.
///
/// ```
/// use noise_recipe::forward_noise;
/// let a = forward_noise(7, 3, &[2, 4]);
/// assert_eq!(a.len(), 8);
/// assert_eq!(a, forward_noise(7, 3, &[2, 4]));
/// assert_ne!(a, forward_noise(7, 4, &[2, 4]));
/// assert_ne!(a, forward_noise(8, 3, &[2, 4]));
/// ```
pub fn forward_noise(seed: u64, index: u64, latent_shape: &[usize]) -> Vec<f32> {
    let numel: usize = latent_shape.iter().product();
    let mut rng = PcgStream::keyed(DOMAIN_FORWARD, &[seed, index]);
    let mut out = vec![0.0f32; numel];
    native::fill_normals(&mut rng, &mut out);
    out
}
