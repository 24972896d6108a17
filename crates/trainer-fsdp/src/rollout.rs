//! The `rollout` phase's sampler: one batch of candidates from `x_T` to `x_0` with the
//! stochastic kernel on the resolved trained steps and a deterministic solver elsewhere,
//! keeping exactly what a replay of the trained steps needs.
//!
//! The latent that enters a trained step is rounded to the storage precision *before* the
//! model sees it, so the stored trajectory is bit for bit what the sampler fed the model; the
//! latent after a trained step comes out of `sde_math::Kernel::sample` already rounded. A
//! replay of the stored steps under the same weights therefore reproduces the rollout's
//! log-probs exactly (ratio 1 on the first update).
//!
//! Evaluation uses the same function with no trained steps (a deterministic ODE sample), or
//! with the plan's evaluation steps under `eval.sampling = "sde"`.
//!
//! [`replay`] scores stored trained steps under a model: the pi_old anchor and the updates of
//! a likelihood objective go through it.

use std::ops::Range;

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use schedule::SdeSteps;
use sde_math::solvers::{OdeSolver, SolverState};
use sde_math::{Kernel, StepSigmas, StorageDtype};
use trajectory::Trajectory;
use velocity_model::{Conditioning, VelocityModel};

use crate::error::TrainerError;

/// How a batch is sampled: the schedule, the stochastic kernel of the trained steps, the
/// deterministic solver of the others and the trajectory's storage precision.
#[derive(Debug, Clone)]
pub struct SamplerSpec {
    /// `steps + 1` sigmas ending at 0 (`schedule::Sigmas::as_slice`).
    pub sigmas: Vec<f32>,
    /// The kernel of the trained (stochastic) steps; `None` for deterministic rollouts, whose
    /// every step runs the solver (a trained step is then an error).
    pub kernel: Option<Kernel>,
    /// The solver of the other steps.
    pub solver: OdeSolver,
    /// The precision the trajectory stores latents at.
    pub storage: StorageDtype,
}

impl SamplerSpec {
    /// The kernel of the trained steps.
    ///
    /// # Errors
    /// [`TrainerError::NoKernel`] for a deterministic sampler.
    pub fn kernel(&self) -> Result<&Kernel, TrainerError> {
        self.kernel.as_ref().ok_or(TrainerError::NoKernel)
    }
}

/// What a rollout of one batch returns.
#[derive(Debug, Clone)]
pub struct BatchRollout<B: Backend> {
    /// `x_0`, `[batch, tokens, channels]`.
    pub final_latents: Tensor<B, 3>,
    /// The stored latents, one `[batch, tokens, channels]` tensor per schedule index in
    /// `latent_steps` order (`{k, k + 1 : k trained}`, sorted), each at the storage precision.
    pub latents: Vec<Tensor<B, 3>>,
    /// The schedule indices of `latents`.
    pub latent_steps: Vec<usize>,
    /// The sampler's log-prob of every trained step, `[batch]` each, in step order.
    pub log_probs: Vec<Tensor<B, 1>>,
}

/// The schedule indices whose latents a replay of `trained` needs: `{k, k + 1}`, sorted.
pub fn latent_steps(trained: &[usize]) -> Vec<usize> {
    let mut v: Vec<usize> = trained.iter().flat_map(|&k| [k, k + 1]).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Samples one batch from `x_t` (at `sigmas[0]`) to `x_0`.
///
/// `noise(step)` returns the standard-normal noise of a trained step, `[batch, tokens,
/// channels]` (request-local per-sample generators make the whole rollout reproducible). The
/// model is called once per step with the batch's conditioning.
///
/// # Errors
/// A trained step outside the schedule, kernel errors (e.g. a Flow-SDE step at `sigma = 1`),
/// solver errors, and the errors of `noise`.
pub fn sample_batch<B, M, F>(
    model: &M,
    cond: &M::Conditioning,
    x_t: Tensor<B, 3>,
    spec: &SamplerSpec,
    trained: &SdeSteps,
    mut noise: F,
) -> Result<BatchRollout<B>, TrainerError>
where
    B: Backend,
    M: VelocityModel<B>,
    F: FnMut(usize) -> Result<Tensor<B, 3>, TrainerError>,
{
    let steps = spec.sigmas.len() - 1;
    if let Some(&bad) = trained.as_slice().iter().find(|&&k| k >= steps) {
        return Err(TrainerError::TrainedStepOutOfRange { step: bad, steps });
    }
    let keep = latent_steps(trained.as_slice());
    let batch = x_t.dims()[0];
    let device = x_t.device();
    let mut x = x_t;
    let mut state = SolverState::new();
    let mut latents: Vec<(usize, Tensor<B, 3>)> = Vec::with_capacity(keep.len());
    let mut log_probs = Vec::with_capacity(trained.len());
    for i in 0..steps {
        let sigma = spec.sigmas[i];
        let sigma_t =
            Tensor::<B, 1>::from_data(TensorData::new(vec![sigma; batch], [batch]), &device);
        if trained.contains(i) {
            x = spec.storage.round_trip(x);
            // consecutive trained steps share a latent: store x_i unless it is x_{k+1} of the
            // previous trained step, already stored
            if latents.last().is_none_or(|(k, _)| *k != i) {
                latents.push((i, x.clone()));
            }
            let v = model.velocity(x.clone(), sigma_t, cond);
            let at = StepSigmas::from_schedule(&spec.sigmas, i)?.into();
            let out = spec.kernel()?.sample(&at, v, x, noise(i)?, spec.storage)?;
            log_probs.push(out.log_prob);
            x = out.prev_sample;
            latents.push((i + 1, x.clone()));
        } else {
            let v = model.velocity(x.clone(), sigma_t, cond);
            x = spec.solver.step(&mut state, &spec.sigmas, i, v, x)?;
        }
    }
    let (latent_steps, latents): (Vec<usize>, Vec<Tensor<B, 3>>) = latents.into_iter().unzip();
    debug_assert_eq!(latent_steps, keep);
    Ok(BatchRollout {
        final_latents: x,
        latents,
        latent_steps,
        log_probs,
    })
}

/// Concatenates the rollouts of consecutive chunks of one batch (same schedule and trained
/// steps) along the batch dimension.
///
/// # Panics
/// When `parts` is empty or the parts kept different latent steps (a programming error:
/// chunks of one rollout share its trained steps).
pub fn concat_rollouts<B: Backend>(parts: Vec<BatchRollout<B>>) -> BatchRollout<B> {
    assert!(!parts.is_empty(), "no rollout chunks to concatenate");
    let latent_steps = parts[0].latent_steps.clone();
    assert!(
        parts.iter().all(|p| p.latent_steps == latent_steps),
        "chunks kept different latent steps"
    );
    if parts.len() == 1 {
        return parts.into_iter().next().expect("one part");
    }
    let steps = parts[0].log_probs.len();
    let n_latents = latent_steps.len();
    let final_latents = Tensor::cat(parts.iter().map(|p| p.final_latents.clone()).collect(), 0);
    let latents = (0..n_latents)
        .map(|j| Tensor::cat(parts.iter().map(|p| p.latents[j].clone()).collect(), 0))
        .collect();
    let log_probs = (0..steps)
        .map(|j| Tensor::cat(parts.iter().map(|p| p.log_probs[j].clone()).collect(), 0))
        .collect();
    BatchRollout {
        final_latents,
        latents,
        latent_steps,
        log_probs,
    }
}

/// `f` of every item, in item order, the items spread over rayon's pool (the loop's host
/// parallelism: one small forward keeps about one core of a CPU backend busy). The pool's
/// threads outlive the call, so their allocator heaps do too: a thread per item and call
/// made the allocator abandon each thread's pages when it ended, and the kernel zero fresh
/// ones for the next (`docs/PERFORMANCE.md`).
///
/// # Panics
/// Re-raises a worker's panic.
pub fn pool_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    use rayon::prelude::*;
    let f = &f;
    items.par_iter().with_max_len(1).map(f).collect()
}

/// Splits `0..n` into at most `parts` contiguous, nearly equal, non-empty ranges.
pub fn chunk_ranges(n: usize, parts: usize) -> Vec<std::ops::Range<usize>> {
    let parts = parts.clamp(1, n.max(1));
    let base = n / parts;
    let extra = n % parts;
    let mut out = Vec::with_capacity(parts);
    let mut start = 0;
    for i in 0..parts {
        let len = base + usize::from(i < extra);
        if len > 0 {
            out.push(start..start + len);
        }
        start += len;
    }
    out
}

/// Samples a batch in `threads` chunks side by side (on a CPU backend one small forward keeps
/// about one core busy). `noise(step, rows)` gives the noise of rows `rows` of the batch at a
/// trained step. Each sample's noise depends on its own rows only and the chunks take slices
/// of the one conditioning ([`Conditioning::slice_rows`]), so the result is the batch's
/// whatever the chunking.
///
/// # Errors
/// The first chunk's error.
pub fn sample_in_chunks<Bx, M, F>(
    model: &M,
    cond: &M::Conditioning,
    x_t: Tensor<Bx, 3>,
    spec: &SamplerSpec,
    trained: &SdeSteps,
    threads: usize,
    noise: F,
) -> Result<BatchRollout<Bx>, TrainerError>
where
    Bx: Backend,
    M: VelocityModel<Bx> + Sync,
    M::Conditioning: Conditioning,
    F: Fn(usize, Range<usize>) -> Result<Tensor<Bx, 3>, TrainerError> + Sync,
{
    let ranges = chunk_ranges(x_t.dims()[0], threads);
    let parts = pool_map(&ranges, |r| {
        let x = x_t.clone().slice([r.clone()]);
        let c = cond.slice_rows(r.clone());
        sample_batch(model, &c, x, spec, trained, |step| noise(step, r.clone()))
    });
    Ok(concat_rollouts(
        parts.into_iter().collect::<Result<Vec<_>, _>>()?,
    ))
}

/// A range of a rollout's samples (group-major indices, `group * group_size + slot`) split at
/// group boundaries: `(group, slots)` per group it touches, in order.
pub(crate) fn group_chunks(samples: Range<usize>, group_size: usize) -> Vec<(usize, Range<usize>)> {
    let g = group_size;
    let mut chunks = Vec::new();
    let mut i = samples.start;
    while i < samples.end {
        let gi = i / g;
        let end = samples.end.min((gi + 1) * g);
        chunks.push((gi, (i - gi * g)..(end - gi * g)));
        i = end;
    }
    chunks
}

/// The log-probs `[samples, trained steps]` of a range of a rollout's samples (group-major
/// indices, `group * group_size + slot`) under `model`, replayed from the stored trajectories
/// through the kernel. `restore(trajectory, rows)` rebuilds the conditioning of `rows`
/// candidates of one group from its sidecar (the world's
/// [`World::restore_conditioning`](crate::world::World::restore_conditioning)).
///
/// Every trained step of every sample in the range goes through the model in one forward of
/// `samples x trained steps` rows (step-major): at small model sizes one wide forward costs
/// far less than one per group and step. The log-probs do not depend on how rows are batched
/// beyond float rounding, and the anchor and the updates replay through this same function.
///
/// # Errors
/// Record and kernel errors; [`TrainerError::ReplaySigmas`] if the trajectories disagree on a
/// trained step's noise levels.
#[allow(clippy::too_many_arguments)]
pub fn replay<Bx, M, R>(
    model: &M,
    spec: &SamplerSpec,
    trajectories: &[Trajectory],
    group_size: usize,
    samples: Range<usize>,
    columns: StepColumns<'_>,
    restore: R,
    device: &Bx::Device,
) -> Result<Tensor<Bx, 2>, TrainerError>
where
    Bx: Backend,
    M: VelocityModel<Bx>,
    M::Conditioning: Conditioning,
    R: Fn(&Trajectory, usize) -> Result<M::Conditioning, TrainerError>,
{
    let no_reference: Option<&ReferenceFn<'_, Bx, M::Conditioning>> = None;
    let terms = replay_terms(
        model,
        no_reference,
        false,
        spec,
        trajectories,
        group_size,
        samples,
        columns,
        restore,
        device,
    )?;
    Ok(terms.log_probs)
}

/// Which of its stored trained steps a replay takes of each sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepColumns<'a> {
    /// Every stored trained step, in order: the replay is `[samples, trained steps]`.
    All,
    /// DanceGRPO's per-sample subsets: for each sample of the replayed range, in order, the
    /// positions (into the rollout's trained steps) it replays, the same number for every
    /// sample; the replay is `[samples, positions]`, column `j` holding each sample's `j`-th
    /// position.
    PerSample(&'a [Vec<usize>]),
}

/// The rows of one column of a replay that share one step's sigmas.
#[derive(Debug, Clone, PartialEq)]
pub struct RowBlock {
    /// The rows within the column (sample offsets in the range).
    pub rows: Range<usize>,
    /// The step's sigmas.
    pub sigmas: StepSigmas,
}

/// The stored trained-step points of a range of a rollout's samples, column-major (row
/// `s * n + i` is sample `i` at its `s`-th replayed step: trained step `s` under
/// [`StepColumns::All`]): what a replay feeds the model.
pub struct StoredPoints<Bx: Backend, C> {
    /// Samples in the range.
    pub n: usize,
    /// Replayed steps per sample (the columns).
    pub steps: usize,
    /// `x_k`, `[rows, tokens, channels]`.
    pub x: Tensor<Bx, 3>,
    /// `x_{k+1}`, `[rows, tokens, channels]`.
    pub prev: Tensor<Bx, 3>,
    /// `σ_k` per row, `[rows]`.
    pub sigma: Tensor<Bx, 1>,
    /// The conditioning of each row.
    pub cond: C,
    /// Each column's runs of rows that share one step's sigmas (one block of all `n` rows per
    /// column under [`StepColumns::All`]).
    pub columns: Vec<Vec<RowBlock>>,
}

/// The stored points of samples `samples` (group-major), `None` when the range or the trained
/// steps are empty. `restore(trajectory, rows)` rebuilds a group's conditioning.
///
/// # Errors
/// Record errors; [`TrainerError::ReplaySigmas`] if the trajectories disagree on a trained
/// step's noise levels.
pub fn stored_points<Bx, C, R>(
    trajectories: &[Trajectory],
    group_size: usize,
    samples: Range<usize>,
    columns: StepColumns<'_>,
    restore: R,
    device: &Bx::Device,
) -> Result<Option<StoredPoints<Bx, C>>, TrainerError>
where
    Bx: Backend,
    C: Conditioning,
    R: Fn(&Trajectory, usize) -> Result<C, TrainerError>,
{
    let chunks = group_chunks(samples.clone(), group_size);
    let n = samples.len();
    let stored = trajectories
        .first()
        .map_or(0, |t| t.common.sde_indices.len());
    let steps = match columns {
        StepColumns::All => stored,
        StepColumns::PerSample(cols) => check_columns(cols, n, stored)?,
    };
    if n == 0 || steps == 0 {
        return Ok(None);
    }
    let conds = chunks
        .iter()
        .map(|(gi, slots)| restore(&trajectories[*gi], slots.len()))
        .collect::<Result<Vec<_>, _>>()?;
    let cond = C::cat_rows(conds).repeat_rows(steps);
    if let StepColumns::PerSample(cols) = columns {
        return per_sample_points(trajectories, group_size, samples, cols, cond, device).map(Some);
    }
    let mut step_sigmas = Vec::with_capacity(steps);
    let mut xs = Vec::with_capacity(steps * chunks.len());
    let mut prevs = Vec::with_capacity(steps * chunks.len());
    for s in 0..steps {
        let mut first: Option<StepSigmas> = None;
        for (gi, slots) in &chunks {
            let inputs = trajectories[*gi].replay_inputs::<Bx, 3>(s, slots.clone(), device)?;
            match first {
                None => first = Some(inputs.sigmas),
                Some(f) if f != inputs.sigmas => {
                    return Err(TrainerError::ReplaySigmas {
                        trained: s,
                        first: (f.sigma(), f.sigma_next()),
                        other: (inputs.sigmas.sigma(), inputs.sigmas.sigma_next()),
                        trajectory: *gi,
                    });
                }
                Some(_) => {}
            }
            xs.push(inputs.sample);
            prevs.push(inputs.prev_sample);
        }
        step_sigmas.push(first.expect("at least one chunk"));
    }
    let sigma_rows: Vec<f32> = step_sigmas
        .iter()
        .flat_map(|sg| std::iter::repeat_n(sg.sigma(), n))
        .collect();
    Ok(Some(StoredPoints {
        n,
        steps,
        x: Tensor::cat(xs, 0),
        prev: Tensor::cat(prevs, 0),
        sigma: Tensor::<Bx, 1>::from_data(TensorData::new(sigma_rows, [n * steps]), device),
        cond,
        columns: step_sigmas
            .into_iter()
            .map(|sigmas| vec![RowBlock { rows: 0..n, sigmas }])
            .collect(),
    }))
}

/// The number of columns of per-sample positions: one list per sample, all of one length,
/// every position a stored step.
fn check_columns(cols: &[Vec<usize>], n: usize, stored: usize) -> Result<usize, TrainerError> {
    let k = cols.first().map_or(0, Vec::len);
    if cols.len() != n {
        return Err(TrainerError::ReplayColumns {
            sample: cols.len().min(n),
            positions: Vec::new(),
            stored,
            expected: format!("one list of positions per replayed sample ({n})"),
        });
    }
    for (i, c) in cols.iter().enumerate() {
        if c.len() != k || c.iter().any(|&p| p >= stored) {
            return Err(TrainerError::ReplayColumns {
                sample: i,
                positions: c.clone(),
                stored,
                expected: format!("{k} positions, each below the {stored} stored trained steps"),
            });
        }
    }
    Ok(k)
}

/// [`stored_points`] of per-sample positions: row `j * n + i` is sample `i` at its `j`-th
/// position, each sample's point read from its own trajectory; consecutive rows of a column
/// at the same step form one block.
fn per_sample_points<Bx, C>(
    trajectories: &[Trajectory],
    group_size: usize,
    samples: Range<usize>,
    cols: &[Vec<usize>],
    cond: C,
    device: &Bx::Device,
) -> Result<StoredPoints<Bx, C>, TrainerError>
where
    Bx: Backend,
{
    let n = samples.len();
    let k = cols.first().map_or(0, Vec::len);
    let mut xs = Vec::with_capacity(n * k);
    let mut prevs = Vec::with_capacity(n * k);
    let mut sigma_rows = Vec::with_capacity(n * k);
    let mut columns = Vec::with_capacity(k);
    let by_column: Vec<Vec<usize>> = (0..k)
        .map(|j| cols.iter().map(|c| c[j]).collect())
        .collect();
    for positions in &by_column {
        let mut blocks: Vec<RowBlock> = Vec::new();
        for (offset, (i, &position)) in samples.clone().zip(positions).enumerate() {
            let (gi, slot) = (i / group_size, i % group_size);
            let inputs =
                trajectories[gi].replay_inputs::<Bx, 3>(position, slot..slot + 1, device)?;
            xs.push(inputs.sample);
            prevs.push(inputs.prev_sample);
            sigma_rows.push(inputs.sigmas.sigma());
            match blocks.last_mut() {
                Some(b) if b.sigmas == inputs.sigmas => b.rows.end = offset + 1,
                _ => blocks.push(RowBlock {
                    rows: offset..offset + 1,
                    sigmas: inputs.sigmas,
                }),
            }
        }
        columns.push(blocks);
    }
    Ok(StoredPoints {
        n,
        steps: k,
        x: Tensor::cat(xs, 0),
        prev: Tensor::cat(prevs, 0),
        sigma: Tensor::<Bx, 1>::from_data(TensorData::new(sigma_rows, [n * k]), device),
        cond,
        columns,
    })
}

/// The reference policy's velocity at the replay's inputs `(x, sigma, conditioning)`, detached
/// (the world's [`World::reference_velocity`](crate::world::World::reference_velocity)).
pub type ReferenceFn<'a, Bx, C> =
    dyn Fn(Tensor<Bx, 3>, Tensor<Bx, 1>, &C) -> Result<Tensor<Bx, 3>, TrainerError> + Sync + 'a;

/// What [`replay_terms`] gives.
pub struct ReplayTerms<Bx: Backend> {
    /// The log-probs, `[samples, trained steps]`, differentiable.
    pub log_probs: Tensor<Bx, 2>,
    /// With a reference: each transition's KL to the reference policy's, `[samples, steps]`.
    pub kl: Option<Tensor<Bx, 2>>,
    /// With `with_means`: every replayed transition's mean, step-major
    /// (`[steps * samples, tokens, channels]`, row `s * n + i` is sample `i` at trained step
    /// `s`), differentiable, and each transition's std, `[samples, steps]`.
    pub means: Option<(Tensor<Bx, 3>, Tensor<Bx, 2>)>,
}

/// [`replay`], and with a `reference` also flow_grpo's KL of every replayed transition to the
/// reference policy's transition at the same stored step, `[samples, trained steps]`
/// ([`flow_grpo::KlForm::FlowGrpoReference`]: `mean((mu - mu_ref)^2) / (2 std_dev_t^2)`, the
/// released `kl_coef` scale), differentiable through the policy's mean; with `with_means`
/// also the transitions' means and stds ([`ReplayTerms::means`]).
///
/// # Errors
/// As [`replay`]; the reference's own errors; KL shape errors.
#[allow(clippy::too_many_arguments)]
pub fn replay_terms<Bx, M, R>(
    model: &M,
    reference: Option<&ReferenceFn<'_, Bx, M::Conditioning>>,
    with_means: bool,
    spec: &SamplerSpec,
    trajectories: &[Trajectory],
    group_size: usize,
    samples: Range<usize>,
    columns: StepColumns<'_>,
    restore: R,
    device: &Bx::Device,
) -> Result<ReplayTerms<Bx>, TrainerError>
where
    Bx: Backend,
    M: VelocityModel<Bx>,
    M::Conditioning: Conditioning,
    R: Fn(&Trajectory, usize) -> Result<M::Conditioning, TrainerError>,
{
    let Some(points) = stored_points(
        trajectories,
        group_size,
        samples.clone(),
        columns,
        restore,
        device,
    )?
    else {
        let (n, steps) = (
            samples.len(),
            match columns {
                StepColumns::All => trajectories
                    .first()
                    .map_or(0, |t| t.common.sde_indices.len()),
                StepColumns::PerSample(cols) => cols.first().map_or(0, Vec::len),
            },
        );
        let kl = reference.map(|_| Tensor::zeros([n, steps], device));
        let means = with_means.then(|| {
            (
                Tensor::zeros([n * steps, 1, 1], device),
                Tensor::zeros([n, steps], device),
            )
        });
        return Ok(ReplayTerms {
            log_probs: Tensor::zeros([n, steps], device),
            kl,
            means,
        });
    };
    let StoredPoints {
        n,
        steps,
        x,
        prev,
        sigma,
        cond,
        columns,
    } = points;
    let v = model.velocity(x.clone(), sigma.clone(), &cond);
    let v_ref = match reference {
        Some(f) => Some(f(x.clone(), sigma, &cond)?.detach()),
        None => None,
    };
    let mut cols = Vec::with_capacity(steps);
    let mut kl_cols = Vec::with_capacity(steps);
    let mut means = Vec::with_capacity(if with_means { steps } else { 0 });
    let mut stds = Vec::with_capacity(if with_means { steps * n } else { 0 });
    for (s, blocks) in columns.into_iter().enumerate() {
        let mut lps = Vec::with_capacity(blocks.len());
        let mut kls = Vec::with_capacity(blocks.len());
        for RowBlock { rows: r, sigmas } in blocks {
            let at = sigmas.into();
            let rows = |t: &Tensor<Bx, 3>| t.clone().narrow(0, s * n + r.start, r.len());
            // the stored latents are exact storage-precision values: no second round trip
            let out = spec.kernel()?.replay(
                &at,
                rows(&v),
                rows(&x),
                rows(&prev),
                StorageDtype::Native,
            )?;
            if let Some(v_ref) = &v_ref {
                let out_ref = spec.kernel()?.replay(
                    &at,
                    rows(v_ref),
                    rows(&x),
                    rows(&prev),
                    StorageDtype::Native,
                )?;
                let kl = flow_grpo::kl_to_reference(
                    &out,
                    &out_ref,
                    flow_grpo::KlForm::FlowGrpoReference,
                )?;
                kls.push(kl.per_sample);
            }
            if with_means {
                means.push(out.mean.clone());
                stds.extend(out.std.iter().copied());
            }
            lps.push(out.log_prob);
        }
        let column = |mut parts: Vec<Tensor<Bx, 1>>| {
            if parts.len() == 1 {
                parts.pop().expect("one part")
            } else {
                Tensor::cat(parts, 0)
            }
        };
        if !kls.is_empty() {
            kl_cols.push(column(kls).unsqueeze_dim(1));
        }
        cols.push(column(lps).unsqueeze_dim(1));
    }
    let kl = v_ref.map(|_| Tensor::cat(kl_cols, 1));
    let means = with_means.then(|| {
        // `stds` is step-major; the matrix is `[samples, steps]`
        let std = Tensor::<Bx, 2>::from_data(TensorData::new(stds, [steps, n]), device);
        (Tensor::cat(means, 0), std.swap_dims(0, 1))
    });
    Ok(ReplayTerms {
        log_probs: Tensor::cat(cols, 1),
        kl,
        means,
    })
}
