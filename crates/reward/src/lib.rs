//! # reward
//!
//! Reward scorers for RL post-training of image generators, behind one trait: decoded images
//! (with prompts and metadata) in, named reward components per sample out. A model crate: it
//! knows nothing about RL (no schedules, noise, trajectories or objectives).
//!
//! * [`Scorer`]: the interface — declared required [`Input`]s, chunked scoring
//!   ([`Scorer::chunk_size`] bounds memory), typed errors; a [`Batch`] borrows parallel images,
//!   prompts and metadata; each sample's result is a [`Components`] map.
//! * [`RgbImage`] and [`quantize_unit`]: images enter as 8-bit RGB, converted from the
//!   generator's floats by `(x * 255).round().clamp(0, 255)` as every reference does
//!   ([`RgbImage::batch_from_tensor`] reads a `[batch, 3, H, W]` tensor).
//! * [`PickScore`] (component `"pickscore"`): CLIP in burn ([`clip`]) loading a transformers
//!   directory (`config.json`, safetensors, `tokenizer.json`, `preprocessor_config.json`),
//!   `exp(logit_scale) * cos(image, text)` as PickScore's reference, or `/ 26` on request
//!   ([`PickScoreScale`]).
//! * [`JpegScorer`] ([`jpeg`]): DDPO's JPEG compressibility / incompressibility — the size in
//!   kB of the image saved as JPEG at quality 95, by an encoder that writes Pillow's bytes.
//! * [`shapes`]: the shapes world (closed vocabulary, scene specs, prompt grammar and parser,
//!   procedural renderer) and its verifiable composition reward ([`shapes::ShapesScorer`],
//!   component `"shapes"`, partial credit per constraint).
//! * [`RemoteScorer`] ([`remote`]): HTTP POST of a batch to a scorer service, with timeouts,
//!   bounded retries and a typed error for every way an answer can be wrong.
//! * [`Combination`] ([`combine`]): required components and weights; a group with a missing
//!   or non-finite required component comes back as [`GroupOutcome::Failed`], which carries no
//!   rewards to train on.
//!
//! ```
//! use reward::shapes::{render, RenderOptions, SceneSpec, ShapesScorer};
//! use reward::{Batch, Combination, GroupOutcome, JpegReward, JpegScorer, Scorer};
//!
//! let prompts: Vec<String> = vec!["a red circle".into(), "a red circle".into()];
//! let images = vec![
//!     render(&SceneSpec::parse("a red circle").unwrap(), 1, &RenderOptions::default()).unwrap().image,
//!     render(&SceneSpec::parse("a blue circle").unwrap(), 2, &RenderOptions::default()).unwrap().image,
//! ];
//! let batch = Batch::images_and_prompts(&images, &prompts).unwrap();
//! let mut scores = ShapesScorer::default().score(batch).unwrap();
//! let jpeg = JpegScorer::ddpo(JpegReward::Compressibility).score(batch).unwrap();
//! for (s, j) in scores.iter_mut().zip(&jpeg) {
//!     s.insert("jpeg_compressibility", j.get("jpeg_compressibility").unwrap());
//! }
//! let combination = Combination::new(["shapes"], [("shapes", 1.0)]).unwrap();
//! match &combination.apply(&scores, &[0, 0]).unwrap().outcomes()[0] {
//!     // a blue circle for "a red circle": the circle is there, the colour wrong (what was asked
//!     // scores (1 + 0) / 2), nothing else drawn (times 1)
//!     GroupOutcome::Scored(g) => assert_eq!(g.combined, vec![1.0, 0.5]),
//!     GroupOutcome::Failed(f) => panic!("{f}"),
//! }
//! ```
#![deny(missing_docs)]

pub mod clip;
pub mod combine;
mod error;
mod image;
pub mod jpeg;
pub mod pickscore;
pub mod remote;
mod scorer;
pub mod shapes;

pub use combine::{
    Combination, CombinedRewards, ComponentIssue, ComponentProblem, FailedGroup, GroupOutcome,
    ScoredGroup,
};
pub use error::{
    ConfigProblem, DtypeProblem, GroupFailureSummary, RewardError, ShapeMismatch, WeightReport,
};
pub use image::{RgbImage, quantize_unit};
pub use jpeg::{JpegReward, JpegScorer};
pub use pickscore::{PICKSCORE_COMPONENT, PickScore, PickScoreOptions, PickScoreScale};
pub use remote::{RemoteConfig, RemoteScorer};
pub use scorer::{Batch, Components, Input, Scorer};
