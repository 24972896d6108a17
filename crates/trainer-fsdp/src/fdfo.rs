//! Paired finite differences ([`Fdfo`], seed 004): two rollouts from one `x_T` that churn
//! noise makes differ, and the reward difference of their endpoints turned into a target for
//! every stored velocity of both.
//!
//! * **Pairs**: a prompt group is the pair (`rollout.group_size = 2`), both candidates start
//!   from one `x_T` (`rollout.shared_initial_noise = true`), and the trained steps run
//!   on-schedule churn (`sampling.sde_type = "churn"`, `γ = sampling.eta`; the paper's
//!   0.0025), the ODE elsewhere; preflight refuses anything else.
//! * **Targets**: for sample `i` with partner `j`, `Δx = x0_j - x0_i` and
//!   `ΔR = A_j - A_i` (the advantages' difference: the reward difference under
//!   `advantage_std_mode = "none"`, the default); `Δx̄ = Δx / (mean Δx² + 1e-6)`
//!   ([`flow_grpo::normalised_difference`]); at every stored point `(x_k, σ_k)` of the sample,
//!   `v_target = v_ref - Δx̄`, with `v_ref` the policy's velocity there before the rollout's
//!   updates (frozen once per rollout).
//! * **The loss** is SPO's ([`flow_grpo::spo_loss`]):
//!   `ρ = exp(mse(v_target, v_ref) - mse(v_target, v_θ))`,
//!   `-ΔR ρ + |ΔR| / (2ε) (ρ - 1)²`, `ε = 0.03`, over every (sample, stored step) row.

use std::ops::Range;

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};
use flow_grpo::{SpoDiagnostics, normalised_difference, spo_loss};
use velocity_model::VelocityModel;

use crate::algorithm::{Algorithm, Recording, nan_max};
use crate::error::TrainerError;
use crate::monitor::{Metrics, names};
use crate::rollout::{StepColumns, stored_points};
use crate::run::TrainContext;
use crate::train::{MicroBatchLoss, UpdateReport, autodiff_replicas};
use crate::world::World;

/// Paired finite differences. See the module docs.
#[derive(Debug, Clone)]
pub struct Fdfo {
    /// SPO's `ε` (the paper's 0.03).
    pub eps: f64,
}

/// The policy's velocities at every stored point of the rollout before its updates:
/// `[samples, trained steps, latent elements]`, row-major.
#[derive(Debug)]
pub struct FrozenVelocities {
    values: Vec<f32>,
    steps: usize,
    per: usize,
}

impl FrozenVelocities {
    /// The velocities of `samples` as step-major rows `[steps * n, per]`.
    fn rows<Bx: burn::tensor::backend::Backend>(
        &self,
        samples: Range<usize>,
        device: &Bx::Device,
    ) -> Tensor<Bx, 2> {
        let n = samples.len();
        let mut out = Vec::with_capacity(n * self.steps * self.per);
        for s in 0..self.steps {
            for i in samples.clone() {
                let at = (i * self.steps + s) * self.per;
                out.extend_from_slice(&self.values[at..at + self.per]);
            }
        }
        Tensor::from_data(TensorData::new(out, [n * self.steps, self.per]), device)
    }
}

/// The stored points' velocities `[rows, per]` (step-major) of `samples` under `model`, and
/// the points' count per sample.
fn velocities<B, W, M>(
    ctx: &TrainContext<'_, B, W>,
    model: &M,
    samples: Range<usize>,
) -> Result<Option<(Tensor<B, 2>, usize)>, TrainerError>
where
    B: AutodiffBackend,
    W: World<B>,
    M: VelocityModel<B, Conditioning = W::Cond<B>>,
{
    let points = stored_points::<B, W::Cond<B>, _>(
        &ctx.batch.trajectories,
        ctx.batch.group_size(),
        samples,
        StepColumns::All,
        |traj, rows| {
            ctx.world
                .restore_conditioning::<B>(&traj.conditions, rows, ctx.device)
        },
        ctx.device,
    )?;
    let Some(p) = points else {
        return Ok(None);
    };
    let [rows, t, c] = p.x.dims();
    let v = model.velocity(p.x, p.sigma, &p.cond).reshape([rows, t * c]);
    Ok(Some((v, p.steps)))
}

impl<B: AutodiffBackend, W: World<B>> Algorithm<B, W> for Fdfo {
    type Frozen = FrozenVelocities;
    type Diagnostics = SpoDiagnostics;

    fn name(&self) -> &'static str {
        "FDFO"
    }

    fn recording(&self) -> Recording {
        Recording::SdeTransitionsAndEndpoints
    }

    /// The policy's velocity at every stored point, before any optimizer step.
    fn freeze(
        &self,
        ctx: &TrainContext<'_, B, W>,
        policy: &W::Policy,
    ) -> Result<(FrozenVelocities, Metrics), TrainerError> {
        let [t, c] = ctx.world.latent_shape();
        let per = t * c;
        let n = ctx.plan.num_samples;
        let steps = ctx.batch.trained.len();
        let mut values = vec![0.0f32; n * steps * per];
        // A replica with fresh autodiff nodes, dropped with its graphs when this returns: a
        // forward through `policy` itself hangs each graph on the live parameters' nodes,
        // where nothing backwards or frees it (about 175 MB a rollout on the shapes world).
        let replica = autodiff_replicas(policy, 1)
            .pop()
            .expect("one replica of the policy");
        for mb in ctx.plan.micro_batches() {
            let Some((v, steps_here)) = velocities(ctx, &replica, mb.clone())? else {
                continue;
            };
            let host: Vec<f32> = v
                .detach()
                .into_data()
                .convert::<f32>()
                .into_vec()
                .expect("f32 velocities");
            let m = mb.len();
            for s in 0..steps_here {
                for (k, i) in mb.clone().enumerate() {
                    let from = (s * m + k) * per;
                    let to = (i * steps + s) * per;
                    values[to..to + per].copy_from_slice(&host[from..from + per]);
                }
            }
        }
        Ok((FrozenVelocities { values, steps, per }, Metrics::new()))
    }

    fn micro_batch_loss(
        &self,
        ctx: &TrainContext<'_, B, W>,
        frozen: &FrozenVelocities,
        policy: &W::Policy,
        samples: Range<usize>,
    ) -> Result<MicroBatchLoss<B, SpoDiagnostics>, TrainerError> {
        let empty = SpoDiagnostics {
            ratio_mean: f64::NAN,
            ratio_max_deviation: f64::NAN,
            samples: 0,
        };
        let Some((v, steps)) = velocities(ctx, policy, samples.clone())? else {
            return Ok(MicroBatchLoss {
                loss: Tensor::zeros([1], ctx.device),
                elements: 0,
                diagnostics: empty,
            });
        };
        let n = samples.len();
        let per = frozen.per;
        let g = ctx.batch.group_size();
        // each sample's partner is the other candidate of its group (pairs: g = 2); each
        // group's endpoints are decoded once
        let mut groups: Vec<(usize, Vec<f32>)> = Vec::new();
        for gi in samples.start / g..samples.end.div_ceil(g) {
            let e = ctx.batch.trajectories[gi].tracks.endpoint.as_ref().ok_or(
                TrainerError::MissingEndpoint {
                    rollout: ctx.batch.rollout_id,
                    group: gi,
                },
            )?;
            groups.push((gi, e.to_f32()));
        }
        let endpoint = |i: usize| -> &[f32] {
            let (gi, values) = &groups[i / g - samples.start / g];
            debug_assert_eq!(*gi, i / g);
            let slot = i % g;
            &values[slot * per..(slot + 1) * per]
        };
        let mut dx = Vec::with_capacity(n * per);
        let mut dr = Vec::with_capacity(n);
        for i in samples.clone() {
            let j = i ^ 1;
            let (xi, xj) = (endpoint(i), endpoint(j));
            dx.extend(xj.iter().zip(xi).map(|(b, a)| b - a));
            dr.push((ctx.advantages.values[j] - ctx.advantages.values[i]) as f32);
        }
        let dx_bar = normalised_difference(Tensor::<B, 2>::from_data(
            TensorData::new(dx, [n, per]),
            ctx.device,
        ))?;
        let rows = n * steps;
        let dx_rows = dx_bar.repeat_dim(0, steps);
        let dr_rows: Vec<f32> = (0..steps).flat_map(|_| dr.iter().copied()).collect();
        let v_ref = frozen.rows::<B>(samples, ctx.device);
        let target = v_ref.clone() - dx_rows;
        let out = spo_loss(
            v,
            v_ref,
            target,
            Tensor::from_data(TensorData::new(dr_rows, [rows]), ctx.device),
            self.eps,
        )?;
        Ok(MicroBatchLoss {
            loss: out.loss,
            elements: rows,
            diagnostics: out.diagnostics,
        })
    }

    /// `train/spo_ratio_mean` (row-weighted) and `train/spo_ratio_max_deviation`.
    fn rollout_metrics(&self, updates: &[UpdateReport<SpoDiagnostics>]) -> Metrics {
        let all: Vec<&SpoDiagnostics> = updates.iter().flat_map(|u| &u.micro_batches).collect();
        let total: usize = all.iter().map(|d| d.samples).sum();
        let mean = if total == 0 {
            f64::NAN
        } else {
            all.iter()
                .filter(|d| d.samples > 0)
                .map(|d| d.samples as f64 * d.ratio_mean)
                .sum::<f64>()
                / total as f64
        };
        let max = if total == 0 {
            f64::NAN
        } else {
            all.iter()
                .filter(|d| d.samples > 0)
                .fold(f64::NEG_INFINITY, |acc, d| {
                    nan_max(acc, d.ratio_max_deviation)
                })
        };
        Metrics::from([
            (names::TRAIN_SPO_RATIO_MEAN.to_string(), mean),
            (names::TRAIN_SPO_RATIO_MAX_DEVIATION.to_string(), max),
        ])
    }
}
