//! The workers seam: how many processes (ranks) train one policy together, which one this is,
//! and the collectives between them.
//!
//! The generic run ([`crate::run::Run`]) is written against [`Workers`]: each rank rolls out
//! and scores its share of whole prompt groups ([`Workers::group_shard`], so group statistics
//! stay local), gradients are all-reduced before the global-norm clip
//! ([`Workers::all_reduce_grads`]), batch statistics go through scalar reductions
//! ([`Workers::reduce_scalars`]), and only the IO rank writes metrics, sample images and the
//! checkpoint manifest ([`Workers::is_io_rank`]).
//!
//! The shape follows burn 0.21's collective runtime (`burn-collective`, read in its 0.21.0
//! sources): collectives block, and every rank must issue the same ones in the same order (a
//! mismatch deadlocks: there is no timeout); gradients are all-reduced parameter by parameter
//! in `ParamId` order, so every rank must hold replicas with the same parameter ids and shapes
//! and a gradient for the same parameters; the only reductions are sum and mean over float
//! tensors (a min or max over ranks is computed from an all-gather made of a one-hot sum); the
//! collective runs on the plain (inner) backend, not on `Autodiff<_>`; and its summation order
//! is not fixed, so a multi-rank run is not bit-reproducible from run to run. [`LocalWorkers`],
//! the one-process implementation, is today's host threads: world size 1, every collective the
//! identity.

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;

use crate::error::TrainerError;

/// Rank `rank`'s share of `groups` prompt groups for `updates` updates over `world_size` ranks
/// ([`Workers::group_shard`]).
///
/// ```
/// use trainer_fsdp::workers::shard_of;
/// // 8 groups, 2 updates (groups 0..4 and 4..8), 2 ranks: each takes half of each update
/// assert_eq!(shard_of(8, 2, 2, 0).unwrap(), vec![0, 1, 4, 5]);
/// assert_eq!(shard_of(8, 2, 2, 1).unwrap(), vec![2, 3, 6, 7]);
/// assert!(shard_of(6, 2, 2, 0).is_err());
/// ```
///
/// # Errors
/// [`TrainerError::GroupsNotDivisible`] unless `groups` is a multiple of
/// `updates * world_size`.
pub fn shard_of(
    groups: usize,
    updates: usize,
    world_size: usize,
    rank: usize,
) -> Result<Vec<usize>, TrainerError> {
    let parts = updates.max(1) * world_size;
    if world_size == 0 || rank >= world_size || groups == 0 || !groups.is_multiple_of(parts) {
        return Err(TrainerError::GroupsNotDivisible {
            groups,
            updates,
            world_size,
        });
    }
    let per_update = groups / updates.max(1);
    let per_rank = per_update / world_size;
    Ok((0..updates.max(1))
        .flat_map(|u| {
            let start = u * per_update + rank * per_rank;
            start..start + per_rank
        })
        .collect())
}

/// How scalars are combined over ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScalarReduce {
    /// The sum over ranks.
    Sum,
    /// The smallest value (NaN if any rank's is NaN).
    Min,
    /// The largest value (NaN if any rank's is NaN).
    Max,
}

/// The ranks that train one policy together. See the module docs.
pub trait Workers: Sync {
    /// Ranks in the run (at least 1).
    fn world_size(&self) -> usize;

    /// This process's rank, `0..world_size()`.
    fn rank(&self) -> usize;

    /// Whether this rank writes the run's shared files (metrics, images, the checkpoint
    /// manifest): rank 0.
    fn is_io_rank(&self) -> bool {
        self.rank() == 0
    }

    /// Host threads this rank uses to sample, replay and train chunks of its batch side by
    /// side (the chunking changes no result).
    fn host_threads(&self) -> usize;

    /// This rank's share of a rollout's `groups` prompt groups (their indices, ascending),
    /// for a plan of `updates` equal updates: every update's groups are split into
    /// `world_size` equal runs and rank `r` takes the `r`-th run of each, so the union over
    /// ranks of their local update `u` is the one-rank run's update `u`, group for group, and
    /// their local micro-batches are its micro-batches. The all-reduced gradient of an update
    /// is then the one-rank gradient of the same samples.
    ///
    /// ```
    /// use trainer_fsdp::workers::{LocalWorkers, Workers};
    /// // one rank: every group
    /// assert_eq!(LocalWorkers::ONE.group_shard(4, 2).unwrap(), vec![0, 1, 2, 3]);
    /// ```
    ///
    /// # Errors
    /// [`TrainerError::GroupsNotDivisible`] unless `groups` is a multiple of
    /// `updates * world_size` (preflight checks this before a run starts).
    fn group_shard(&self, groups: usize, updates: usize) -> Result<Vec<usize>, TrainerError> {
        shard_of(groups, updates, self.world_size(), self.rank())
    }

    /// Waits until every rank reached this point.
    ///
    /// # Errors
    /// As [`Workers::all_gather`].
    fn barrier(&self) -> Result<(), TrainerError> {
        if self.world_size() > 1 {
            self.all_gather(&[])?;
        }
        Ok(())
    }

    /// The mean over ranks of every rank's gradients of `model`'s parameters, reduced in the
    /// order of the parameters' ids and issued by every rank at the same point of the update.
    /// Each rank's gradients are those of the mean loss of its share of the update; the shares
    /// are equal ([`Workers::group_shard`]), so the mean over ranks is the gradient of the
    /// whole update's mean loss.
    ///
    /// # Errors
    /// A collective that failed.
    fn all_reduce_grads<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        grads: GradientsParams,
        model: &M,
    ) -> Result<GradientsParams, TrainerError>;

    /// Every rank's `values`, in rank order (`result[r]` is rank `r`'s), bit for bit: every
    /// rank must pass as many values.
    ///
    /// # Errors
    /// [`TrainerError::Collective`] when the ranks passed different lengths or a collective
    /// failed.
    fn all_gather(&self, values: &[f64]) -> Result<Vec<Vec<f64>>, TrainerError>;

    /// `values` reduced element-wise over ranks with `op`, in place: the same result on every
    /// rank (a sum is taken in rank order, in `f64`; a NaN of any rank makes a min or max
    /// NaN).
    ///
    /// # Errors
    /// As [`Workers::all_gather`].
    fn reduce_scalars(&self, values: &mut [f64], op: ScalarReduce) -> Result<(), TrainerError> {
        if self.world_size() == 1 {
            return Ok(());
        }
        let all = self.all_gather(values)?;
        for (i, v) in values.iter_mut().enumerate() {
            let column = all.iter().map(|rank| rank[i]);
            *v = match op {
                ScalarReduce::Sum => column.sum(),
                ScalarReduce::Min => column.fold(f64::INFINITY, crate::algorithm::nan_min),
                ScalarReduce::Max => column.fold(f64::NEG_INFINITY, crate::algorithm::nan_max),
            };
        }
        Ok(())
    }
}

/// A borrowed rank is the rank (a launcher keeps the workers, the run borrows them).
impl<K: Workers> Workers for &K {
    fn world_size(&self) -> usize {
        (**self).world_size()
    }

    fn rank(&self) -> usize {
        (**self).rank()
    }

    fn is_io_rank(&self) -> bool {
        (**self).is_io_rank()
    }

    fn host_threads(&self) -> usize {
        (**self).host_threads()
    }

    fn group_shard(&self, groups: usize, updates: usize) -> Result<Vec<usize>, TrainerError> {
        (**self).group_shard(groups, updates)
    }

    fn barrier(&self) -> Result<(), TrainerError> {
        (**self).barrier()
    }

    fn all_reduce_grads<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        grads: GradientsParams,
        model: &M,
    ) -> Result<GradientsParams, TrainerError> {
        (**self).all_reduce_grads::<B, M>(grads, model)
    }

    fn all_gather(&self, values: &[f64]) -> Result<Vec<Vec<f64>>, TrainerError> {
        (**self).all_gather(values)
    }

    fn reduce_scalars(&self, values: &mut [f64], op: ScalarReduce) -> Result<(), TrainerError> {
        (**self).reduce_scalars(values, op)
    }
}

/// One process, one rank: the run's batch is this rank's whole batch, spread over host
/// threads; every collective is the identity.
///
/// ```
/// use trainer_fsdp::workers::{LocalWorkers, ScalarReduce, Workers};
/// let w = LocalWorkers::new(2);
/// assert_eq!((w.world_size(), w.rank(), w.is_io_rank()), (1, 0, true));
/// assert_eq!(w.group_shard(8, 2).unwrap(), (0..8).collect::<Vec<_>>());
/// let mut v = [1.0, f64::NAN];
/// w.reduce_scalars(&mut v, ScalarReduce::Max).unwrap();
/// assert!(v[1].is_nan());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalWorkers {
    host_threads: usize,
}

impl LocalWorkers {
    /// One rank, one host thread.
    pub const ONE: Self = Self { host_threads: 1 };

    /// One rank using `host_threads` threads (at least 1).
    pub fn new(host_threads: usize) -> Self {
        Self {
            host_threads: host_threads.max(1),
        }
    }
}

impl Workers for LocalWorkers {
    fn world_size(&self) -> usize {
        1
    }

    fn rank(&self) -> usize {
        0
    }

    fn host_threads(&self) -> usize {
        self.host_threads
    }

    fn all_reduce_grads<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        grads: GradientsParams,
        _model: &M,
    ) -> Result<GradientsParams, TrainerError> {
        Ok(grads)
    }

    fn all_gather(&self, values: &[f64]) -> Result<Vec<Vec<f64>>, TrainerError> {
        Ok(vec![values.to_vec()])
    }
}

#[cfg(feature = "collective")]
mod collective;
#[cfg(feature = "collective")]
pub use collective::{BUCKET, CollectiveWorkers, NodeSetup};
