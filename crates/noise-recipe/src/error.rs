//! The one error type of `noise-recipe`.

use thiserror::Error;

/// Everything that can be wrong with a noise recipe, shipped latents, per-step noise seeds or
/// a sample id. Each variant names the value given and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NoiseError {
    /// A latent shape has no dimension or a zero-sized one.
    #[error("invalid latent shape {shape:?}; expected at least one dimension, all >= 1")]
    InvalidShape {
        /// The shape given.
        shape: Vec<usize>,
    },

    /// Data does not have the shape it should.
    #[error("{what} has shape {got:?}, expected {expected:?}")]
    ShapeMismatch {
        /// Which data.
        what: &'static str,
        /// Its shape.
        got: Vec<usize>,
        /// The expected shape.
        expected: Vec<usize>,
    },

    /// A count that must match the batch does not.
    #[error("{what}: {got} given for a batch of {expected}")]
    CountMismatch {
        /// Which count.
        what: &'static str,
        /// How many were given.
        got: usize,
        /// The batch size.
        expected: usize,
    },

    /// The tensor rank asked for is not `1 + latent rank` (batch first).
    #[error("a tensor of rank {asked} was asked for, but batch + latent shape {shape:?} has rank {}", shape.len())]
    RankMismatch {
        /// The rank asked for.
        asked: usize,
        /// The full shape, batch first.
        shape: Vec<usize>,
    },

    /// Two samples of one request were given the same per-step noise seed: they would draw the
    /// same per-step noise, which freezes exploration inside a GRPO group.
    #[error(
        "samples {first} and {second} share the per-step noise seed {seed}; request-local per-step noise must be sample-unique"
    )]
    DuplicateDenoiseSeed {
        /// The shared seed.
        seed: u64,
        /// The first sample with it.
        first: usize,
        /// The second sample with it.
        second: usize,
    },

    /// A string is not a stable sample id `prompt:<key>:sample:<slot>`.
    #[error("invalid sample id {given:?}: {reason}; expected \"prompt:<key>:sample:<slot>\"")]
    InvalidSampleId {
        /// The string given.
        given: String,
        /// What is wrong.
        reason: &'static str,
    },
}
