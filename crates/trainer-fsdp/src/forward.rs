//! The forward process on a rollout's clean endpoints, shared by the objectives that train on
//! it (AWM, DiffusionNFT): for each sample of a range and each training timestep `σ_k` (the
//! rollout's trained steps' noise levels), `x_σ = (1 - σ) x0 + σ ε` with a keyed `ε`
//! ([`noise_recipe::forward_noise`] of the candidate's seed and the step), so that every
//! policy a loss compares (live, frozen, old, reference, EMA) sees the same `x_σ`.

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use velocity_model::Conditioning;

use crate::error::TrainerError;
use crate::rollout::ReferenceFn;
use crate::run::TrainContext;
use crate::world::World;

/// The forward-process rows of a range of samples, step-major (row `s * n + i` is sample `i`
/// at training timestep `s`), on any backend.
pub(crate) struct ForwardRows<Bx: Backend, C> {
    /// Samples in the range.
    pub n: usize,
    /// Training timesteps.
    pub steps: usize,
    /// Latent elements per sample.
    pub per: usize,
    /// `x_σ`, `[rows, tokens, channels]`.
    pub x: Tensor<Bx, 3>,
    /// `σ` per row, `[rows]`.
    pub sigma: Tensor<Bx, 1>,
    /// The clean endpoint of each row, `[rows, per]`.
    pub x0: Tensor<Bx, 2>,
    /// The flow-matching target `ε - x0` of each row, `[rows, per]`.
    pub target: Tensor<Bx, 2>,
    /// The conditioning of each row.
    pub cond: C,
}

impl<Bx: Backend, C> ForwardRows<Bx, C> {
    /// A `[rows]` per-row value as `[samples, steps]`.
    pub fn per_sample(&self, rows: Tensor<Bx, 1>) -> Tensor<Bx, 2> {
        rows.reshape([self.steps, self.n]).swap_dims(0, 1)
    }

    /// `mean((v - v_other)^2)` over the latent of each row, `[samples, steps]`, for a
    /// velocity `v` of these rows (`[rows, tokens, channels]`) and `other`'s at the same
    /// inputs (detached): the velocity KL of AWM's and DiffusionNFT's trust-region terms.
    ///
    /// # Errors
    /// `other`'s own.
    pub fn velocity_kl(
        &self,
        v: &Tensor<Bx, 3>,
        other: &ReferenceFn<'_, Bx, C>,
    ) -> Result<Tensor<Bx, 2>, TrainerError> {
        let rows = self.n * self.steps;
        let v_other = other(self.x.clone(), self.sigma.clone(), &self.cond)?.detach();
        let d = (v.clone() - v_other).reshape([rows, self.per]);
        Ok(self.per_sample((d.clone() * d).mean_dim(1).reshape([rows])))
    }
}

/// [`forward_rows`]' result: the rows of a world's conditioning on `Bx`, if any.
type Rows<Bx, B, W> = Option<ForwardRows<Bx, <W as World<B>>::Cond<Bx>>>;

/// One sample of a forward-process batch and the key of its noise.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pick {
    /// The rollout sample (group-major index).
    pub sample: usize,
    /// The seed `ε` is drawn from (with the training step): the candidate's own, or one shared
    /// by the samples that must see the same noise (a DPO pair).
    pub noise_seed: u64,
}

/// The forward-process rows of rollout samples `samples` (group-major indices, a range or any
/// selection), each with its own candidate's noise; `None` when there are none or no
/// training timesteps.
///
/// # Errors
/// As [`forward_rows_of`].
pub(crate) fn forward_rows<B, W, Bx>(
    ctx: &TrainContext<'_, B, W>,
    samples: impl IntoIterator<Item = usize>,
) -> Result<Rows<Bx, B, W>, TrainerError>
where
    B: AutodiffBackend,
    W: World<B>,
    Bx: Backend<Device = B::Device>,
{
    let g = ctx.batch.group_size();
    let picks: Vec<Pick> = samples
        .into_iter()
        .map(|i| Pick {
            sample: i,
            noise_seed: ctx.batch.trajectories[i / g].common.candidates[i % g].seed_hash,
        })
        .collect();
    forward_rows_of(ctx, &picks)
}

/// The forward-process rows of `picks` in their order, `None` when there are no picks or no
/// training timesteps.
///
/// # Errors
/// [`TrainerError::MissingEndpoint`] / [`TrainerError::EndpointShape`] for a sidecar without
/// a usable endpoint; conditioning errors.
pub(crate) fn forward_rows_of<B, W, Bx>(
    ctx: &TrainContext<'_, B, W>,
    picks: &[Pick],
) -> Result<Rows<Bx, B, W>, TrainerError>
where
    B: AutodiffBackend,
    W: World<B>,
    Bx: Backend<Device = B::Device>,
{
    let batch = ctx.batch;
    let n = picks.len();
    let steps = batch.trained.len();
    if n == 0 || steps == 0 {
        return Ok(None);
    }
    let g = batch.group_size();
    let [t, c] = ctx.world.latent_shape();
    let latent_shape = [t, c];
    let per = t * c;
    let sigmas: Vec<f32> = batch
        .trained
        .iter()
        .map(|&k| batch.trajectories[picks[0].sample / g].common.sigmas[k])
        .collect();
    let mut conds = Vec::new();
    let mut x0 = Vec::with_capacity(n * per);
    // consecutive picks of one group share one restored conditioning
    let mut run_start = 0;
    while run_start < n {
        let gi = picks[run_start].sample / g;
        let run_end = (run_start..n)
            .find(|&j| picks[j].sample / g != gi)
            .unwrap_or(n);
        let traj = &batch.trajectories[gi];
        let endpoint = traj
            .tracks
            .endpoint
            .as_ref()
            .ok_or(TrainerError::MissingEndpoint {
                rollout: batch.rollout_id,
                group: gi,
            })?;
        if endpoint.shape().get(1..) != Some(latent_shape.as_slice()) {
            return Err(TrainerError::EndpointShape {
                rollout: batch.rollout_id,
                group: gi,
                found: endpoint.shape().to_vec(),
                expected: latent_shape.to_vec(),
            });
        }
        let values = endpoint.to_f32();
        for pick in &picks[run_start..run_end] {
            let slot = pick.sample % g;
            x0.extend_from_slice(&values[slot * per..(slot + 1) * per]);
        }
        conds.push(ctx.world.restore_conditioning::<Bx>(
            &traj.conditions,
            run_end - run_start,
            ctx.device,
        )?);
        run_start = run_end;
    }
    let cond = W::Cond::<Bx>::cat_rows(conds).repeat_rows(steps);
    // host-side forward process: the same bits for every policy and every call
    let rows = n * steps;
    let mut x_sigma = Vec::with_capacity(rows * per);
    let mut target = Vec::with_capacity(rows * per);
    let mut x0_rows = Vec::with_capacity(rows * per);
    let mut sigma_rows = Vec::with_capacity(rows);
    for (&k, &s) in batch.trained.iter().zip(&sigmas) {
        for (row, pick) in picks.iter().enumerate() {
            let eps = noise_recipe::forward_noise(pick.noise_seed, k as u64, &latent_shape);
            let x = &x0[row * per..(row + 1) * per];
            x_sigma.extend(x.iter().zip(&eps).map(|(x, e)| (1.0 - s) * x + s * e));
            target.extend(x.iter().zip(&eps).map(|(x, e)| e - x));
            x0_rows.extend_from_slice(x);
            sigma_rows.push(s);
        }
    }
    let dev = ctx.device;
    Ok(Some(ForwardRows {
        n,
        steps,
        per,
        x: Tensor::from_data(TensorData::new(x_sigma, [rows, t, c]), dev),
        sigma: Tensor::from_data(TensorData::new(sigma_rows, [rows]), dev),
        x0: Tensor::from_data(TensorData::new(x0_rows, [rows, per]), dev),
        target: Tensor::from_data(TensorData::new(target, [rows, per]), dev),
        cond,
    }))
}
