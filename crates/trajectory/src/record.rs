//! The typed per-group rollout record.

use std::collections::BTreeMap;
use std::ops::Range;

use burn::tensor::{Tensor, TensorData, backend::Backend};
use sde_math::{StepSigmas, StorageDtype};

use crate::error::RecordProblem;
use crate::layout::check_task;
use crate::{Digest, StoredTensor, TrajectoryError};

/// One candidate (sample) of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The stable sample id, e.g. `prompt:<prompt_id>:sample:<slot>`; it drives the candidate's
    /// initial latent and per-step noise.
    pub sample_id: String,
    /// The candidate's index in the rollout batch.
    pub sample_index: u64,
    /// The policy version the candidate was sampled with.
    pub policy_version: u64,
    /// A hash of the candidate's seeds (initial noise and per-step noise), for provenance.
    pub seed_hash: u64,
}

/// What every candidate of a group shares: the schedule, the trained steps, the image geometry,
/// provenance, and the candidates' identities.
#[derive(Debug, Clone, PartialEq)]
pub struct Common {
    /// The artifact task (`t2i`); also the artifact subdirectory.
    pub task: String,
    /// The rollout this group belongs to.
    pub rollout_id: u64,
    /// The group's index within the rollout.
    pub group_index: u64,
    /// Output height in pixels, as echoed by the engine: the only source of the true latent
    /// grid (a packed sequence length cannot recover a non-square one).
    pub height: u32,
    /// Output width in pixels, as echoed by the engine.
    pub width: u32,
    /// The full sigma schedule the sampler ran, `num_inference_steps + 1` values, strictly
    /// decreasing within `[0, 1]`, as `f32` (the exact values the kernels saw).
    pub sigmas: Vec<f32>,
    /// The trained (stochastic, replayed) step indices, strictly increasing; step `k` goes from
    /// `sigmas[k]` to `sigmas[k + 1]`.
    pub sde_indices: Vec<usize>,
    /// The precision the latents are stored at (never [`StorageDtype::Native`]); the sampler
    /// scored samples rounded to it.
    pub storage: StorageDtype,
    /// Hash over the sampling configuration and the sigmas
    /// ([`sampling_fingerprint`](crate::sampling_fingerprint)).
    pub sampling_fingerprint: Digest,
    /// Hash of the weight manifest the engine sampled with.
    pub weight_manifest_hash: Digest,
    /// The candidates, in slot order.
    pub candidates: Vec<Candidate>,
}

impl Common {
    /// The schedule indices whose latents a replay of `sde_indices` needs:
    /// `{k, k + 1 : k in sde_indices}`, sorted. Consecutive trained steps share a latent, so it
    /// is stored once.
    ///
    /// ```
    /// # use trajectory::Common;
    /// # fn common(sde_indices: Vec<usize>) -> Common { let d = trajectory::Digest::sha256(b""); Common {
    /// #   task: "t2i".into(), rollout_id: 0, group_index: 0, height: 8, width: 8,
    /// #   sigmas: vec![1.0, 0.75, 0.5, 0.25, 0.0], sde_indices,
    /// #   storage: sde_math::StorageDtype::Bf16, sampling_fingerprint: d.clone(),
    /// #   weight_manifest_hash: d, candidates: vec![] } }
    /// assert_eq!(common(vec![1, 2]).latent_steps(), vec![1, 2, 3]);
    /// assert_eq!(common(vec![0, 3]).latent_steps(), vec![0, 1, 3, 4]);
    /// ```
    pub fn latent_steps(&self) -> Vec<usize> {
        let mut steps: Vec<usize> = self.sde_indices.iter().flat_map(|&k| [k, k + 1]).collect();
        steps.sort_unstable();
        steps.dedup();
        steps
    }

    /// The number of denoising steps of the schedule (`sigmas.len() - 1`).
    pub fn num_steps(&self) -> usize {
        self.sigmas.len().saturating_sub(1)
    }

    /// The sigmas of trained step `trained` (a position in `sde_indices`).
    ///
    /// # Errors
    /// [`TrajectoryError::OutOfRange`], or [`TrajectoryError::InvalidRecord`] when the schedule
    /// does not give a valid step there.
    pub fn step_sigmas(&self, trained: usize) -> Result<StepSigmas, TrajectoryError> {
        let &k = self
            .sde_indices
            .get(trained)
            .ok_or(TrajectoryError::OutOfRange {
                what: "trained step",
                index: trained,
                len: self.sde_indices.len(),
            })?;
        StepSigmas::from_schedule(&self.sigmas, k).map_err(|_| TrajectoryError::InvalidRecord {
            path: None,
            problem: RecordProblem::SdeIndices {
                indices: self.sde_indices.clone(),
                steps: self.num_steps(),
            },
        })
    }
}

/// The frozen conditioning the group was sampled with (one prompt per group, so it is stored
/// once).
#[derive(Debug, Clone, PartialEq)]
pub struct Conditions {
    /// Text-encoder hidden states, `[tokens, dim]`, at the precision the engine fed the model.
    pub text_embeddings: StoredTensor,
    /// Which tokens are real (`true`) or padding, `[tokens]`.
    pub text_mask: Vec<bool>,
    /// Model-specific extra conditioning (pooled embeddings, ...), by `[a-z0-9_]` name; stored
    /// under `conditions.extra.<name>`.
    pub extra: BTreeMap<String, StoredTensor>,
}

/// The per-candidate latents and rollout log-probs.
#[derive(Debug, Clone, PartialEq)]
pub struct Tracks {
    /// `[candidates, latent_steps, ...latent]` at the record's storage precision: candidate
    /// `c`'s latent at schedule index `Common::latent_steps()[j]` is `latents[c, j]`.
    pub latents: StoredTensor,
    /// The sampler's log-probs, `[candidates, trained steps]` row-major (`f32`, the references'
    /// mean-over-elements reduction).
    pub log_probs: Vec<f32>,
    /// The clean endpoint `x0` of every candidate, `[candidates, ...latent]` at the record's
    /// storage precision, for objectives that train on the forward process (AWM,
    /// DiffusionNFT); `None` when the trainer does not need it. Stored as `tracks.endpoint`.
    pub endpoint: Option<StoredTensor>,
}

impl Tracks {
    /// The per-candidate latent shape (`latents.shape()[2..]`, e.g. `[576, 64]` packed).
    pub fn latent_shape(&self) -> &[usize] {
        self.latents.shape().get(2..).unwrap_or(&[])
    }

    /// Builds tracks from rollout tensors: one `[candidates, ...latent]` tensor per latent step
    /// (in [`Common::latent_steps`] order) and one `[candidates]` log-prob tensor per trained
    /// step.
    ///
    /// The latents must already be rounded to `storage` (they are, when they come out of
    /// `sde_math::Kernel::sample` with that storage and the initial latent was rounded too).
    ///
    /// # Errors
    /// [`TrajectoryError::NotRepresentable`] for an unrounded latent,
    /// [`TrajectoryError::NonFinite`], [`TrajectoryError::InvalidRecord`] for mismatched shapes.
    pub fn from_rollout<B: Backend, const D: usize>(
        latents: &[Tensor<B, D>],
        log_probs: &[Tensor<B, 1>],
        storage: StorageDtype,
    ) -> Result<Self, TrajectoryError> {
        let shape_problem = |field: &'static str, shape: Vec<usize>, expected: String| {
            TrajectoryError::InvalidRecord {
                path: None,
                problem: RecordProblem::Shape {
                    field,
                    shape,
                    expected,
                },
            }
        };
        let first = latents.first().ok_or(TrajectoryError::InvalidRecord {
            path: None,
            problem: RecordProblem::NoTrainedSteps,
        })?;
        let dims = first.dims();
        let g = dims[0];
        let per: usize = dims[1..].iter().product();
        let mut flat = Vec::with_capacity(g * latents.len() * per);
        let mut by_step = Vec::with_capacity(latents.len());
        for t in latents {
            if t.dims() != dims {
                return Err(shape_problem(
                    "rollout latents",
                    t.dims().to_vec(),
                    format!("{dims:?}"),
                ));
            }
            by_step.push(
                t.clone()
                    .into_data()
                    .convert::<f32>()
                    .into_vec::<f32>()
                    .expect("converted to f32"),
            );
        }
        for c in 0..g {
            for step in &by_step {
                flat.extend_from_slice(&step[c * per..(c + 1) * per]);
            }
        }
        let mut shape = vec![g, latents.len()];
        shape.extend_from_slice(&dims[1..]);
        let latents = StoredTensor::from_f32("tracks.latents", &flat, shape, storage)?;

        let mut lp = vec![0.0f32; g * log_probs.len()];
        for (s, t) in log_probs.iter().enumerate() {
            if t.dims() != [g] {
                return Err(shape_problem(
                    "rollout log-probs",
                    t.dims().to_vec(),
                    format!("[{g}]"),
                ));
            }
            let v = t
                .clone()
                .into_data()
                .convert::<f32>()
                .into_vec::<f32>()
                .expect("converted to f32");
            for (c, x) in v.into_iter().enumerate() {
                lp[c * log_probs.len() + s] = x;
            }
        }
        Ok(Self {
            latents,
            log_probs: lp,
            endpoint: None,
        })
    }

    /// The same tracks with the candidates' clean endpoints `x0`, `[candidates, ...latent]`,
    /// rounded to `storage` here (the endpoint is the sampler's output, not a stored input).
    ///
    /// # Errors
    /// [`TrajectoryError::NonFinite`], [`TrajectoryError::InvalidRecord`] for a shape that is
    /// not the latents' `[candidates, ...latent]`.
    pub fn with_endpoint<B: Backend, const D: usize>(
        self,
        endpoint: Tensor<B, D>,
        storage: StorageDtype,
    ) -> Result<Self, TrajectoryError> {
        let dims = endpoint.dims().to_vec();
        let mut expected = vec![self.latents.shape()[0]];
        expected.extend_from_slice(self.latent_shape());
        if dims != expected {
            return Err(TrajectoryError::InvalidRecord {
                path: None,
                problem: RecordProblem::Shape {
                    field: "tracks.endpoint",
                    shape: dims,
                    expected: format!("{expected:?}"),
                },
            });
        }
        let rounded = storage
            .round_trip(endpoint)
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .expect("converted to f32");
        let stored = StoredTensor::from_f32("tracks.endpoint", &rounded, dims, storage)?;
        Ok(Self {
            endpoint: Some(stored),
            ..self
        })
    }
}

impl Tracks {
    /// The tracks of a deterministic (ODE) rollout: no trained SDE step, so no latents
    /// (`[candidates, 0, ...latent]`) and no log-probs, and every candidate's clean endpoint
    /// `x0` (`[candidates, ...latent]`, rounded to `storage`) — what an objective on the
    /// forward process trains on (DiffusionNFT samples this way). The record's `sde_indices`
    /// must then be empty.
    ///
    /// # Errors
    /// [`TrajectoryError::NonFinite`]; [`TrajectoryError::InvalidRecord`] for an endpoint of
    /// rank < 2.
    pub fn endpoint_only<B: Backend, const D: usize>(
        endpoint: Tensor<B, D>,
        storage: StorageDtype,
    ) -> Result<Self, TrajectoryError> {
        let dims = endpoint.dims().to_vec();
        if dims.len() < 2 {
            return Err(TrajectoryError::InvalidRecord {
                path: None,
                problem: RecordProblem::Shape {
                    field: "tracks.endpoint",
                    shape: dims,
                    expected: "[candidates, ...latent] (latent rank >= 1)".into(),
                },
            });
        }
        let mut empty_shape = vec![dims[0], 0];
        empty_shape.extend_from_slice(&dims[1..]);
        let latents = StoredTensor::from_f32("tracks.latents", &[], empty_shape, storage)?;
        Self {
            latents,
            log_probs: Vec::new(),
            endpoint: None,
        }
        .with_endpoint(endpoint, storage)
    }
}

/// Everything needed to replay a group's trained steps: a per-group rollout record.
///
/// Written as one safetensors sidecar per group ([`write_sidecar`](crate::write_sidecar)) with
/// the `common.*`, `conditions.*` and `tracks.*` namespaces, read back validated
/// ([`read_sidecar`](crate::read_sidecar)). [`Trajectory::validate`] states the invariants.
#[derive(Debug, Clone, PartialEq)]
pub struct Trajectory {
    /// Shared by the whole group.
    pub common: Common,
    /// The frozen conditioning.
    pub conditions: Conditions,
    /// Per-candidate latents and log-probs.
    pub tracks: Tracks,
}

/// The tensors a replay of one trained step needs, for a range of candidates.
///
/// `D` is the rank of a batch of latents: `1 + latent rank` (3 for packed `[576, 64]` latents).
#[derive(Debug, Clone)]
pub struct ReplayInputs<B: Backend, const D: usize> {
    /// The schedule index `k` of the step.
    pub step_index: usize,
    /// `sigmas[k] -> sigmas[k + 1]`.
    pub sigmas: StepSigmas,
    /// `x_k`, `[candidates, ...latent]`, widened exactly from the storage precision.
    pub sample: Tensor<B, D>,
    /// `x_{k+1}` as stored, `[candidates, ...latent]`.
    pub prev_sample: Tensor<B, D>,
    /// The sampler's log-prob of this step, `[candidates]`.
    pub rollout_log_prob: Tensor<B, 1>,
}

fn problem(problem: RecordProblem) -> TrajectoryError {
    TrajectoryError::InvalidRecord {
        path: None,
        problem,
    }
}

/// Names used as keys (`conditions.extra.<name>`): non-empty `[a-z0-9_]`.
pub(crate) fn is_simple_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

impl Trajectory {
    /// The number of candidates in the group.
    pub fn num_candidates(&self) -> usize {
        self.common.candidates.len()
    }

    /// The number of trained steps.
    pub fn num_trained_steps(&self) -> usize {
        self.common.sde_indices.len()
    }

    /// Checks every invariant of the record:
    ///
    /// * at least one candidate and one trained step; a valid task name; non-zero image size;
    /// * `sigmas`: at least 2 finite values in `[0, 1]`, strictly decreasing;
    /// * `sde_indices`: strictly increasing, each `< sigmas.len() - 1`;
    /// * `storage` is not `Native` and the latents are stored at it, with shape
    ///   `[candidates, latent_steps().len(), ...]` (latent rank >= 1);
    /// * `log_probs` has `candidates * trained steps` finite values;
    /// * `text_embeddings` is `[tokens, dim]` and `text_mask` has `tokens` entries; extra
    ///   conditioning names are `[a-z0-9_]`.
    ///
    /// # Errors
    /// [`TrajectoryError::InvalidRecord`] naming the first problem found.
    pub fn validate(&self) -> Result<(), TrajectoryError> {
        let c = &self.common;
        check_task(&c.task)?;
        let g = c.candidates.len();
        if g == 0 {
            return Err(problem(RecordProblem::NoCandidates));
        }
        if c.height == 0 || c.width == 0 {
            return Err(problem(RecordProblem::ImageSize {
                height: c.height,
                width: c.width,
            }));
        }
        let schedule = |reason| {
            problem(RecordProblem::Schedule {
                sigmas: c.sigmas.clone(),
                reason,
            })
        };
        if c.sigmas.len() < 2 {
            return Err(schedule("has fewer than 2 values"));
        }
        if c.sigmas
            .iter()
            .any(|s| !s.is_finite() || !(0.0..=1.0).contains(s))
        {
            return Err(schedule("has a value outside [0, 1] or not finite"));
        }
        if c.sigmas.windows(2).any(|w| w[1] >= w[0]) {
            return Err(schedule("is not strictly decreasing"));
        }
        // a deterministic rollout trains on its endpoints alone
        if c.sde_indices.is_empty() && self.tracks.endpoint.is_none() {
            return Err(problem(RecordProblem::NoTrainedSteps));
        }
        let steps = c.num_steps();
        let increasing = c.sde_indices.windows(2).all(|w| w[0] < w[1]);
        if !increasing || c.sde_indices.iter().any(|&k| k >= steps) {
            return Err(problem(RecordProblem::SdeIndices {
                indices: c.sde_indices.clone(),
                steps,
            }));
        }
        if c.storage == StorageDtype::Native {
            return Err(TrajectoryError::NativeStorage {
                what: "common.storage".into(),
            });
        }
        for cand in &c.candidates {
            if cand.sample_id.is_empty() {
                return Err(problem(RecordProblem::Name {
                    field: "sample_id",
                    name: cand.sample_id.clone(),
                }));
            }
        }

        let t = &self.tracks;
        if t.latents.storage() != c.storage {
            return Err(problem(RecordProblem::LatentPrecision {
                storage: c.storage,
                latents: t.latents.storage(),
            }));
        }
        let l = c.latent_steps().len();
        let shape = t.latents.shape();
        if shape.len() < 3 || shape[0] != g || shape[1] != l {
            return Err(problem(RecordProblem::Shape {
                field: "tracks.latents",
                shape: shape.to_vec(),
                expected: format!("[{g}, {l}, ...latent] (latent rank >= 1)"),
            }));
        }
        let s = c.sde_indices.len();
        if t.log_probs.len() != g * s {
            return Err(problem(RecordProblem::Length {
                field: "tracks.log_probs",
                len: t.log_probs.len(),
                expected: g * s,
            }));
        }
        if let Some(i) = t.log_probs.iter().position(|v| !v.is_finite()) {
            return Err(problem(RecordProblem::NonFiniteLogProb {
                slot: i / s,
                step: i % s,
                value: t.log_probs[i],
            }));
        }
        if let Some(e) = &t.endpoint {
            let mut expected = vec![g];
            expected.extend_from_slice(t.latent_shape());
            if e.shape() != expected.as_slice() {
                return Err(problem(RecordProblem::Shape {
                    field: "tracks.endpoint",
                    shape: e.shape().to_vec(),
                    expected: format!("{expected:?}"),
                }));
            }
            if e.storage() != c.storage {
                return Err(problem(RecordProblem::LatentPrecision {
                    storage: c.storage,
                    latents: e.storage(),
                }));
            }
        }

        let cond = &self.conditions;
        let te = cond.text_embeddings.shape();
        if te.len() != 2 {
            return Err(problem(RecordProblem::Shape {
                field: "conditions.text_embeddings",
                shape: te.to_vec(),
                expected: "[tokens, dim]".into(),
            }));
        }
        if cond.text_mask.len() != te[0] {
            return Err(problem(RecordProblem::Length {
                field: "conditions.text_mask",
                len: cond.text_mask.len(),
                expected: te[0],
            }));
        }
        for name in cond.extra.keys() {
            if !is_simple_name(name) {
                return Err(problem(RecordProblem::Name {
                    field: "conditions.extra",
                    name: name.clone(),
                }));
            }
        }
        Ok(())
    }

    /// The sampler's log-prob of candidate `slot` at trained step `trained`.
    ///
    /// # Errors
    /// [`TrajectoryError::OutOfRange`] for an unknown slot or trained step, or when
    /// `tracks.log_probs` holds no entry there (a record built by hand that
    /// [`Trajectory::validate`] would refuse).
    pub fn rollout_log_prob(&self, slot: usize, trained: usize) -> Result<f32, TrajectoryError> {
        let (g, s) = (self.num_candidates(), self.num_trained_steps());
        if slot >= g {
            return Err(TrajectoryError::OutOfRange {
                what: "candidate slot",
                index: slot,
                len: g,
            });
        }
        if trained >= s {
            return Err(TrajectoryError::OutOfRange {
                what: "trained step",
                index: trained,
                len: s,
            });
        }
        let i = slot * s + trained;
        self.tracks
            .log_probs
            .get(i)
            .copied()
            .ok_or(TrajectoryError::OutOfRange {
                what: "tracks.log_probs entry",
                index: i,
                len: self.tracks.log_probs.len(),
            })
    }

    /// Candidate `slot`'s latent at schedule index `step` (which must be one of
    /// [`Common::latent_steps`]), widened exactly to `f32`.
    ///
    /// # Errors
    /// [`TrajectoryError::OutOfRange`] for an unknown slot, a step whose latent is not stored,
    /// or a hand-built record whose `tracks.latents` holds fewer values than its steps and
    /// candidates need.
    pub fn latent(&self, slot: usize, step: usize) -> Result<Vec<f32>, TrajectoryError> {
        let steps = self.common.latent_steps();
        let g = self.num_candidates();
        if slot >= g {
            return Err(TrajectoryError::OutOfRange {
                what: "candidate slot",
                index: slot,
                len: g,
            });
        }
        let j = steps
            .iter()
            .position(|&s| s == step)
            .ok_or(TrajectoryError::OutOfRange {
                what: "stored latent step",
                index: step,
                len: steps.len(),
            })?;
        let per: usize = self.tracks.latent_shape().iter().product();
        let start = (slot * steps.len() + j) * per;
        // a hand-built record (public fields) may hold fewer latents than its steps say
        let stored = self.tracks.latents.num_elements();
        if start + per > stored {
            return Err(TrajectoryError::OutOfRange {
                what: "tracks.latents element",
                index: start + per - 1,
                len: stored,
            });
        }
        Ok(self.tracks.latents.range_f32(start, per))
    }

    /// The inputs of a replay of trained step `trained` for candidates `slots`, as tensors on
    /// `device`.
    ///
    /// # Errors
    /// [`TrajectoryError::OutOfRange`] for bad slots or step, [`TrajectoryError::Rank`] when
    /// `D != 1 + latent rank`, and invalid-record errors.
    pub fn replay_inputs<B: Backend, const D: usize>(
        &self,
        trained: usize,
        slots: Range<usize>,
        device: &B::Device,
    ) -> Result<ReplayInputs<B, D>, TrajectoryError> {
        let g = self.num_candidates();
        if slots.start >= slots.end || slots.end > g {
            return Err(TrajectoryError::OutOfRange {
                what: "candidate slot range end",
                index: slots.end,
                len: g,
            });
        }
        let sigmas = self.common.step_sigmas(trained)?;
        let k = self.common.sde_indices[trained];
        let latent_shape = self.tracks.latent_shape().to_vec();
        if latent_shape.len() + 1 != D {
            let mut shape = vec![slots.len()];
            shape.extend_from_slice(&latent_shape);
            return Err(TrajectoryError::Rank {
                what: "replay latents".into(),
                asked: D,
                rank: shape.len(),
                shape,
            });
        }
        let mut batch_shape = vec![slots.len()];
        batch_shape.extend_from_slice(&latent_shape);
        let gather = |step: usize| -> Result<Tensor<B, D>, TrajectoryError> {
            let mut v = Vec::new();
            for slot in slots.clone() {
                v.extend(self.latent(slot, step)?);
            }
            Ok(Tensor::from_data(
                TensorData::new(v, batch_shape.clone()),
                device,
            ))
        };
        let lp: Vec<f32> = slots
            .clone()
            .map(|slot| self.rollout_log_prob(slot, trained))
            .collect::<Result<_, _>>()?;
        Ok(ReplayInputs {
            step_index: k,
            sigmas,
            sample: gather(k)?,
            prev_sample: gather(k + 1)?,
            rollout_log_prob: Tensor::from_data(TensorData::new(lp, [slots.len()]), device),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-built record of two candidates and one trained step whose `tracks.log_probs`
    /// holds `log_probs` (two entries make it valid).
    fn hand_built(log_probs: Vec<f32>) -> Trajectory {
        let d = Digest::sha256(b"");
        let storage = StorageDtype::F32;
        let candidate = |slot: u64| Candidate {
            sample_id: format!("prompt:0:sample:{slot}"),
            sample_index: slot,
            policy_version: 0,
            seed_hash: slot,
        };
        Trajectory {
            common: Common {
                task: "t2i".into(),
                rollout_id: 0,
                group_index: 0,
                height: 8,
                width: 8,
                sigmas: vec![1.0, 0.0],
                sde_indices: vec![0],
                storage,
                sampling_fingerprint: d.clone(),
                weight_manifest_hash: d,
                candidates: vec![candidate(0), candidate(1)],
            },
            conditions: Conditions {
                text_embeddings: StoredTensor::from_f32("text", &[0.0], vec![1, 1], storage)
                    .unwrap(),
                text_mask: vec![true],
                extra: BTreeMap::new(),
            },
            tracks: Tracks {
                latents: StoredTensor::from_f32("latents", &[0.0; 4], vec![2, 2, 1], storage)
                    .unwrap(),
                log_probs,
                endpoint: None,
            },
        }
    }

    #[test]
    fn rollout_log_prob_of_a_short_hand_built_record_is_out_of_range() {
        let valid = hand_built(vec![-1.5, -2.5]);
        valid.validate().unwrap();
        assert_eq!(valid.rollout_log_prob(1, 0).unwrap(), -2.5);

        let short = hand_built(vec![-1.5]);
        assert!(short.validate().is_err());
        assert_eq!(short.rollout_log_prob(0, 0).unwrap(), -1.5);
        match short.rollout_log_prob(1, 0) {
            Err(TrajectoryError::OutOfRange { what, index, len }) => {
                assert_eq!((what, index, len), ("tracks.log_probs entry", 1, 1));
            }
            other => panic!("expected OutOfRange, got {other:?}"),
        }
        let err = short.rollout_log_prob(1, 0).unwrap_err().to_string();
        assert!(
            err.contains("tracks.log_probs entry 1 is out of range"),
            "{err}"
        );
    }

    #[test]
    fn latent_of_a_hand_built_record_with_too_few_latents_is_out_of_range() {
        let valid = hand_built(vec![-1.5, -2.5]);
        assert_eq!(valid.latent(1, 1).unwrap(), vec![0.0]);
        // two candidates, but latents for one
        let mut short = hand_built(vec![-1.5, -2.5]);
        short.tracks.latents =
            StoredTensor::from_f32("latents", &[0.5, 0.25], vec![1, 2, 1], StorageDtype::F32)
                .unwrap();
        assert_eq!(short.latent(0, 1).unwrap(), vec![0.25]);
        match short.latent(1, 0) {
            Err(TrajectoryError::OutOfRange { what, index, len }) => {
                assert_eq!((what, index, len), ("tracks.latents element", 2, 2));
            }
            other => panic!("expected OutOfRange, got {other:?}"),
        }
    }
}
