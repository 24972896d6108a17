//! The initial-noise (x_T) recipe: what the driver ships instead of a tensor.

use burn::tensor::{Tensor, TensorData, backend::Backend};
use keyed_rng::{PcgStream, fnv1a64};

use crate::error::NoiseError;
use crate::native;
use crate::sample_id::SampleId;
use crate::torch::{TorchCpuKernel, TorchGenerator};

const DOMAIN: u64 = fnv1a64(b"flowrl/noise-recipe/initial-noise/v1");

/// How a recipe turns `(base_seed, group_id)` into a sample's x_T.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoiseAlgorithm {
    /// flowrl's generator: PCG-XSL-RR 128/64 keyed by `(base_seed, group_id)` through
    /// SplitMix64, Box-Muller in `f32` with platform-independent polynomial `log`/`sincos`.
    /// Bit-identical on every platform, backend and run.
    Pcg64BoxMuller,
    /// PyTorch interop: the sample's x_T is
    /// `torch.randn(latent_shape, generator=torch.Generator().manual_seed(base_seed + group_id))`
    /// in `float32` (wrapping `u64` addition; PyTorch keeps the low 32 bits of the seed), as the
    /// given CPU kernel computes it. Lets a flowrl trainer replay rollouts made by a PyTorch
    /// engine that follows this convention, and the reverse.
    Torch(TorchCpuKernel),
}

/// A batch of latents on the host: `f32` values, row-major, batch first.
#[derive(Debug, Clone, PartialEq)]
pub struct HostLatents {
    shape: Vec<usize>,
    data: Vec<f32>,
}

impl HostLatents {
    /// Checks that `data` fills `shape` (batch first).
    ///
    /// # Errors
    /// [`NoiseError::InvalidShape`] for an empty or zero-sized shape,
    /// [`NoiseError::CountMismatch`] when the data length differs from the shape's size.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Result<Self, NoiseError> {
        check_shape(&shape)?;
        let numel: usize = shape.iter().product();
        if data.len() != numel {
            return Err(NoiseError::CountMismatch {
                what: "latent values",
                got: data.len(),
                expected: numel,
            });
        }
        Ok(Self { shape, data })
    }

    /// The shape, batch first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The values, row-major.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// The values of sample `i` of the batch.
    ///
    /// # Panics
    /// If `i` is not below the batch size.
    pub fn sample(&self, i: usize) -> &[f32] {
        let per = self.data.len() / self.shape[0];
        &self.data[i * per..(i + 1) * per]
    }

    /// Moves the latents to a device as a rank-`D` tensor (`D` = 1 + latent rank). The host
    /// values are `f32`; the tensor takes the device's default float type.
    ///
    /// # Errors
    /// [`NoiseError::RankMismatch`] when `D` is not the shape's rank.
    pub fn to_tensor<B: Backend, const D: usize>(
        &self,
        device: &B::Device,
    ) -> Result<Tensor<B, D>, NoiseError> {
        if D != self.shape.len() {
            return Err(NoiseError::RankMismatch {
                asked: D,
                shape: self.shape.clone(),
            });
        }
        let data = TensorData::new(self.data.clone(), self.shape.clone());
        Ok(Tensor::from_data(data, device))
    }
}

fn check_shape(shape: &[usize]) -> Result<(), NoiseError> {
    if shape.is_empty() || shape.contains(&0) {
        return Err(NoiseError::InvalidShape {
            shape: shape.to_vec(),
        });
    }
    Ok(())
}

/// The x_T recipe the driver ships: per-sample group ids, the latent shape and a base seed.
///
/// Each engine regenerates x_T from it on the CPU in `f32` with one seeded generator per group
/// id, then moves it to its device. A sample's x_T depends only on `(algorithm, base_seed,
/// group_id, latent_shape)`: the same bits whatever the batch composition, rank, backend or run.
/// Samples with equal group ids get identical x_T; give every GRPO candidate its own id (e.g.
/// [`SampleId::noise_key`]) so that a group has real intra-group variance.
///
/// ```
/// use noise_recipe::{NoiseAlgorithm, NoiseRecipe};
/// let a = NoiseRecipe::new(7, vec![4, 8, 8], vec![10, 11, 12], NoiseAlgorithm::Pcg64BoxMuller).unwrap();
/// let b = NoiseRecipe::new(7, vec![4, 8, 8], vec![12, 10], NoiseAlgorithm::Pcg64BoxMuller).unwrap();
/// let (xa, xb) = (a.generate(), b.generate());
/// assert_eq!(xa.shape(), &[3, 4, 8, 8]);
/// // group 12's noise is the same bits in either batch
/// assert_eq!(xa.sample(2), xb.sample(0));
/// assert_eq!(xa.sample(0), xb.sample(1));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoiseRecipe {
    base_seed: u64,
    latent_shape: Vec<usize>,
    group_ids: Vec<u64>,
    algorithm: NoiseAlgorithm,
}

impl NoiseRecipe {
    /// Validates a recipe.
    ///
    /// # Errors
    /// [`NoiseError::InvalidShape`] for an empty or zero-sized latent shape,
    /// [`NoiseError::CountMismatch`] for an empty batch.
    pub fn new(
        base_seed: u64,
        latent_shape: Vec<usize>,
        group_ids: Vec<u64>,
        algorithm: NoiseAlgorithm,
    ) -> Result<Self, NoiseError> {
        check_shape(&latent_shape)?;
        if group_ids.is_empty() {
            return Err(NoiseError::CountMismatch {
                what: "group ids",
                got: 0,
                expected: 1,
            });
        }
        Ok(Self {
            base_seed,
            latent_shape,
            group_ids,
            algorithm,
        })
    }

    /// A recipe whose group id of each sample is its [`SampleId::noise_key`]: every candidate
    /// gets its own x_T.
    ///
    /// # Errors
    /// As [`NoiseRecipe::new`].
    pub fn for_samples(
        base_seed: u64,
        latent_shape: Vec<usize>,
        samples: &[SampleId],
        algorithm: NoiseAlgorithm,
    ) -> Result<Self, NoiseError> {
        Self::new(
            base_seed,
            latent_shape,
            samples.iter().map(SampleId::noise_key).collect(),
            algorithm,
        )
    }

    /// The base seed.
    pub fn base_seed(&self) -> u64 {
        self.base_seed
    }

    /// One sample's latent shape (no batch dimension).
    pub fn latent_shape(&self) -> &[usize] {
        &self.latent_shape
    }

    /// The per-sample group ids.
    pub fn group_ids(&self) -> &[u64] {
        &self.group_ids
    }

    /// The algorithm.
    pub fn algorithm(&self) -> NoiseAlgorithm {
        self.algorithm
    }

    /// The x_T of one group: `latent_shape.product()` `f32` values.
    pub fn group_noise(&self, group_id: u64) -> Vec<f32> {
        let numel: usize = self.latent_shape.iter().product();
        match self.algorithm {
            NoiseAlgorithm::Pcg64BoxMuller => {
                let mut rng = PcgStream::keyed(DOMAIN, &[self.base_seed, group_id]);
                let mut out = vec![0.0f32; numel];
                native::fill_normals(&mut rng, &mut out);
                out
            }
            NoiseAlgorithm::Torch(kernel) => {
                TorchGenerator::manual_seed(self.base_seed.wrapping_add(group_id))
                    .randn(numel, kernel)
            }
        }
    }

    /// The whole batch's x_T, shape `[batch, ...latent_shape]`.
    pub fn generate(&self) -> HostLatents {
        let mut shape = vec![self.group_ids.len()];
        shape.extend_from_slice(&self.latent_shape);
        let mut data = Vec::with_capacity(shape.iter().product());
        for &g in &self.group_ids {
            data.extend(self.group_noise(g));
        }
        HostLatents { shape, data }
    }
}

/// The x_T of a request: shipped `initial_latents` (img2img, the first frame of i2v) are used
/// verbatim and win over the recipe; otherwise the recipe is regenerated.
///
/// ```
/// use noise_recipe::{HostLatents, NoiseAlgorithm, NoiseRecipe, resolve_initial_noise};
/// let recipe = NoiseRecipe::new(1, vec![2], vec![5], NoiseAlgorithm::Pcg64BoxMuller).unwrap();
/// let shipped = HostLatents::new(vec![1, 2], vec![0.25, -0.5]).unwrap();
/// assert_eq!(resolve_initial_noise(&recipe, Some(shipped.clone())), shipped);
/// assert_eq!(resolve_initial_noise(&recipe, None), recipe.generate());
/// ```
pub fn resolve_initial_noise(
    recipe: &NoiseRecipe,
    initial_latents: Option<HostLatents>,
) -> HostLatents {
    initial_latents.unwrap_or_else(|| recipe.generate())
}
