//! # trajectory
//!
//! Typed FlowGRPO rollout records and their on-disk sidecars.
//!
//! * [`Trajectory`]: everything a replay of one prompt group needs — the latents before and
//!   after every trained SDE step, the sigma schedule, the trained step indices, the sampler's
//!   per-step log-probs, the frozen text conditioning, the engine-echoed image size, and the
//!   candidates' sample ids, policy versions and seed hashes.
//! * [`write_sidecar`] / [`read_sidecar`]: one safetensors file per group (`common.*`,
//!   `conditions.*`, `tracks.*`, a `format_version`), written `.tmp` → fsync → rename →
//!   directory fsync, read back with every key, dtype, shape and a content hash checked
//!   ([`sidecar`] documents the format).
//! * [`StoredTensor`]: floats held as the exact bits of their storage precision (`f32`, `bf16`,
//!   `f16` — `sde_math::StorageDtype`), so replay scores exactly what the sampler scored.
//! * [`CandidateManifest`] and [`sampling_fingerprint`]: the small per-candidate JSON manifest
//!   (policy version, sampling fingerprint, weight-manifest hash).
//! * [`ArtifactLayout`]: `<root>/<task>/rollout_<id>/group_<idx>.safetensors` plus
//!   `..._sample_<slot>.png`, evaluation under `<root>/eval/<task>/`, and [`Retention`].
//!
//! The crate knows `sde-math`'s storage precision and nothing about models, rewards or the
//! optimizer.
//!
//! ```
//! use sde_math::StorageDtype;
//! use trajectory::*;
//!
//! # fn main() -> Result<(), TrajectoryError> {
//! let storage = StorageDtype::Bf16;
//! // 2 candidates, trained steps [1, 2] of a 4-step schedule -> latents at steps 1, 2, 3
//! let latents: Vec<f32> = (0..2 * 3 * 4).map(|i| i as f32 * 0.25).collect();
//! let traj = Trajectory {
//!     common: Common {
//!         task: "t2i".into(),
//!         rollout_id: 3,
//!         group_index: 0,
//!         height: 16,
//!         width: 32,
//!         sigmas: vec![1.0, 0.75, 0.5, 0.25, 0.0],
//!         sde_indices: vec![1, 2],
//!         storage,
//!         sampling_fingerprint: sampling_fingerprint(&[("eta", 0.7)], &[1.0, 0.75, 0.5, 0.25, 0.0])?,
//!         weight_manifest_hash: Digest::sha256(b"weights v3"),
//!         candidates: (0..2)
//!             .map(|slot| Candidate {
//!                 sample_id: format!("prompt:7:sample:{slot}"),
//!                 sample_index: slot,
//!                 policy_version: 3,
//!                 seed_hash: 0xfeed + slot,
//!             })
//!             .collect(),
//!     },
//!     conditions: Conditions {
//!         text_embeddings: StoredTensor::from_f32("text", &[0.5; 6], vec![3, 2], storage)?,
//!         text_mask: vec![true, true, false],
//!         extra: Default::default(),
//!     },
//!     tracks: Tracks {
//!         latents: StoredTensor::from_f32("latents", &latents, vec![2, 3, 4], storage)?,
//!         log_probs: vec![-1.25, -1.5, -0.75, -2.0],
//!         endpoint: None,
//!     },
//! };
//!
//! let dir = std::env::temp_dir().join(format!("trajectory-doc-{}", std::process::id()));
//! let layout = ArtifactLayout::new(&dir, "t2i")?;
//! let begun = layout.begin_rollout(Split::Train, 3, Retention::keep_last(2))?;
//! let path = layout.sidecar_path(Split::Train, 3, 0);
//! write_sidecar(&path, &traj)?;
//! let back = read_sidecar(&path)?;
//! assert_eq!(back, traj); // bit-exact
//! assert_eq!(back.latent(1, 2)?, latents[16..20].to_vec());
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # let _ = begun;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod error;
mod layout;
mod manifest;
mod record;
pub mod sidecar;
mod stored;

pub use error::{RecordProblem, TrajectoryError};
pub use layout::{ArtifactLayout, BegunRollout, PruneReport, Retention, RolloutDir, Split};
pub use manifest::{
    CandidateManifest, Digest, MANIFEST_FORMAT, MANIFEST_VERSION, sampling_fingerprint,
};
pub use record::{Candidate, Common, Conditions, ReplayInputs, Tracks, Trajectory};
pub use sidecar::{
    FORMAT_VERSION, StagedFile, WrittenFile, decode, encode, read_sidecar, stage_file,
    stage_sidecar, write_atomic, write_sidecar,
};
pub use stored::StoredTensor;
