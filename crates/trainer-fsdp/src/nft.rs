//! DiffusionNFT ([`Nft`], seed 004): online RL on the forward process with no likelihood and
//! no ratio.
//!
//! * **Rollouts** are deterministic: every step runs `sampling.solver` (`sampling.eta = 0`),
//!   from the **sampling copy** of the policy, `θ_old`, which the run keeps beside the policy,
//!   checkpoints (`sampler.mpk`) and soft-updates after each rollout's updates,
//!   `θ_old <- η_i θ_old + (1 - η_i) θ` with `η_i` of [`SoftUpdate`] at rollout `i` (the
//!   paper's ramp `min(0.001 i, 0.5)`, or the release's flat-then-ramp). The rollout stores
//!   each candidate's clean endpoint `x0` alone ([`Recording::OdeEndpoints`]).
//! * **Training timesteps** are the noise levels of the configured trained steps (the release
//!   walks the sampler's own grid). For each sample and timestep a keyed `ε` gives
//!   `x_σ = (1 - σ) x0 + σ ε` (the same for every policy compared).
//! * **The loss** is [`flow_grpo::nft_loss`]: the implicit positive and negative policies
//!   `v± = (1 ∓ β) v_old ± β v_θ`, each scored through its `x0` prediction with the release's
//!   adaptive normalisation, weighted by the optimality probability
//!   `r = clamp(1/2 + 1/2 · A / limit, 0, 1)` ([`flow_grpo::nft_optimality`]) and `1 - r`,
//!   scaled by `5 / β`; plus `kl_coef · mean((v_θ - v_ref)^2)`, the release's unmentioned
//!   anchor on the pretrained model (1e-4).
//!
//! `v_old` is the sampling copy's velocity as it stood for the rollout, so the first update
//! of a rollout starts where the sampler was (at `η = 0` the copy is the policy itself).

use std::ops::Range;

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};
use flow_grpo::{NftDiagnostics, SoftUpdate, nft_loss, nft_optimality};
use velocity_model::VelocityModel;

use crate::algorithm::{Algorithm, Recording, scalar};
use crate::error::TrainerError;
use crate::forward::forward_rows;
use crate::monitor::{Metrics, names};
use crate::rollout::ReferenceFn;
use crate::run::TrainContext;
use crate::train::{MicroBatchLoss, UpdateReport};
use crate::world::World;

/// DiffusionNFT. See the module docs.
#[derive(Debug, Clone)]
pub struct Nft {
    /// The guidance strength `β` of the implicit policies (the release's 1.0; 0.1 for OCR and
    /// multi-reward runs).
    pub beta: f64,
    /// The advantages are clipped to `±limit` and mapped to `[0, 1]` over that range (5 in
    /// the release).
    pub advantage_limit: f64,
    /// The sampling copy's soft update.
    pub soft_update: SoftUpdate,
    /// The weight of the velocity anchor on the reference policy, `mean((v_θ - v_ref)^2)`
    /// (the release's 1e-4; 0: no term and no reference forward).
    pub kl_coef: f64,
}

/// One micro-batch's diagnostics under DiffusionNFT.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NftMicroBatch {
    /// The loss's own.
    pub nft: NftDiagnostics,
    /// The mean velocity KL to the reference, when the anchor is on.
    pub kl_ref: Option<f64>,
    /// (sample, timestep) rows.
    pub rows: usize,
}

impl<B: AutodiffBackend, W: World<B>> Algorithm<B, W> for Nft {
    type Frozen = ();
    type Diagnostics = NftMicroBatch;

    fn name(&self) -> &'static str {
        "DiffusionNFT"
    }

    fn recording(&self) -> Recording {
        Recording::OdeEndpoints
    }

    fn reference_keys(&self) -> Option<String> {
        (self.kl_coef != 0.0).then(|| format!("algorithm.kl_coef = {}", self.kl_coef))
    }

    fn sampling_copy(&self) -> Option<SoftUpdate> {
        Some(self.soft_update)
    }

    /// Nothing: the sampling copy the loss compares against is the run's.
    fn freeze(
        &self,
        _ctx: &TrainContext<'_, B, W>,
        _policy: &W::Policy,
    ) -> Result<((), Metrics), TrainerError> {
        Ok(((), Metrics::new()))
    }

    fn micro_batch_loss(
        &self,
        ctx: &TrainContext<'_, B, W>,
        _frozen: &(),
        policy: &W::Policy,
        samples: Range<usize>,
    ) -> Result<MicroBatchLoss<B, NftMicroBatch>, TrainerError> {
        let old = ctx.sampling_copy.ok_or(TrainerError::NoSamplingCopy {
            algorithm: "DiffusionNFT",
        })?;
        let Some(rows) = forward_rows::<B, W, B>(ctx, samples.clone())? else {
            let empty = NftDiagnostics {
                positive_error: f64::NAN,
                negative_error: f64::NAN,
                mean_optimality: f64::NAN,
                samples: 0,
            };
            return Ok(MicroBatchLoss {
                loss: Tensor::zeros([1], ctx.device),
                elements: 0,
                diagnostics: NftMicroBatch {
                    nft: empty,
                    kl_ref: None,
                    rows: 0,
                },
            });
        };
        let n_rows = rows.n * rows.steps;
        let raw: Vec<f64> = samples.map(|i| ctx.advantages.values[i]).collect();
        let r = nft_optimality(&raw, self.advantage_limit)?;
        // step-major rows: sample i's value at every timestep
        let r_rows: Vec<f32> = (0..rows.steps)
            .flat_map(|_| r.iter().map(|v| *v as f32))
            .collect();
        let r_rows = Tensor::<B, 1>::from_data(TensorData::new(r_rows, [n_rows]), ctx.device);
        let v = policy.velocity(rows.x.clone(), rows.sigma.clone(), &rows.cond);
        let v_old = old
            .velocity(rows.x.clone(), rows.sigma.clone(), &rows.cond)
            .detach();
        let flat = |t: Tensor<B, 3>| t.reshape([n_rows, rows.per]);
        let out = nft_loss(
            flat(v.clone()),
            flat(v_old),
            flat(rows.x.clone()),
            rows.x0.clone(),
            rows.sigma.clone(),
            r_rows,
            self.beta,
            5.0 / self.beta,
        )?;
        let mut loss = out.loss;
        let mut kl_ref = None;
        if self.kl_coef != 0.0 {
            let reference = |x: Tensor<B, 3>, sigma: Tensor<B, 1>, cond: &W::Cond<B>| {
                ctx.reference_velocity(policy, x, sigma, cond)
            };
            let reference: &ReferenceFn<'_, B, W::Cond<B>> = &reference;
            let kl = rows.velocity_kl(&v, reference)?.mean();
            kl_ref = Some(scalar(kl.clone()));
            loss = loss + kl.mul_scalar(self.kl_coef);
        }
        Ok(MicroBatchLoss {
            loss,
            elements: n_rows,
            diagnostics: NftMicroBatch {
                nft: out.diagnostics,
                kl_ref,
                rows: n_rows,
            },
        })
    }

    /// `train/nft_positive_error`, `train/nft_negative_error`, `train/nft_optimality_mean`
    /// (row-weighted over every micro-batch), and `train/kl_ref` with the anchor.
    fn rollout_metrics(&self, updates: &[UpdateReport<NftMicroBatch>]) -> Metrics {
        let all: Vec<&NftMicroBatch> = updates.iter().flat_map(|u| &u.micro_batches).collect();
        let total: usize = all.iter().map(|d| d.rows).sum();
        let mean = |f: &dyn Fn(&NftMicroBatch) -> f64| {
            if total == 0 {
                return f64::NAN;
            }
            all.iter().map(|d| d.rows as f64 * f(d)).sum::<f64>() / total as f64
        };
        let mut m = Metrics::new();
        m.insert(
            names::TRAIN_NFT_POSITIVE_ERROR.into(),
            mean(&|d| d.nft.positive_error),
        );
        m.insert(
            names::TRAIN_NFT_NEGATIVE_ERROR.into(),
            mean(&|d| d.nft.negative_error),
        );
        m.insert(
            names::TRAIN_NFT_OPTIMALITY_MEAN.into(),
            mean(&|d| d.nft.mean_optimality),
        );
        if self.kl_coef != 0.0 {
            m.insert(
                names::TRAIN_KL_REF.into(),
                mean(&|d| d.kl_ref.unwrap_or(f64::NAN)),
            );
        }
        m
    }
}
