//! # velocity-model
//!
//! The interface between RL code and model families, below both (ripgrep's `grep-matcher`):
//! samplers and trainers are written against [`VelocityModel`] and [`Conditioning`]; a model
//! family (the Qwen-Image transformer in `dit-models`, a test's analytic model) implements
//! them without the RL crates knowing its types, and without depending on another family.
//!
//! * [`VelocityModel`]: `v = f(x_sigma, sigma, conditioning)` on packed latents
//!   `[batch, tokens, channels]`.
//! * [`Conditioning`]: what a sampler or trainer does with a batch's conditioning without
//!   looking inside it — count its rows, take a contiguous range of them (a chunk of a batch
//!   sampled on its own thread), concatenate chunks, and tile the whole batch (one forward of
//!   several trained steps of the same samples).
//!
//! ```
//! use burn::backend::Flex;
//! use burn::tensor::Tensor;
//! use velocity_model::{Conditioning, TensorConditioning};
//!
//! let dev = Default::default();
//! let c = TensorConditioning(Tensor::<Flex, 2>::from_floats([[1.0, 2.0], [3.0, 4.0]], &dev));
//! assert_eq!(c.rows(), 2);
//! let tiled = c.repeat_rows(3); // rows 0, 1, 0, 1, 0, 1
//! assert_eq!(tiled.rows(), 6);
//! let back = TensorConditioning::cat_rows(vec![c.slice_rows(0..1), c.slice_rows(1..2)]);
//! assert_eq!(back.0.into_data(), c.0.into_data());
//! ```
#![deny(missing_docs)]

use std::ops::Range;

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// A flow-matching velocity model: `v = f(x_sigma, sigma, conditioning)`.
///
/// Sampling and training code is written against this trait; the concrete network, its
/// adapters and its conditioning format stay behind it. `x` is the packed latent sequence
/// `[batch, tokens, channels]`, `sigma` the per-sample noise level in `[0, 1]` (`[batch]`),
/// and the output has `x`'s shape: the velocity `d x_sigma / d sigma = eps - x_0` of the
/// forward process `x_sigma = (1 - sigma) x_0 + sigma eps`.
pub trait VelocityModel<B: Backend> {
    /// Everything besides `(x, sigma)` the model is conditioned on (text states, masks,
    /// token geometry), prepared once per prompt batch and reused across steps.
    type Conditioning: Clone;

    /// The predicted velocity for `x: [batch, tokens, channels]` at `sigma: [batch]`.
    fn velocity(
        &self,
        x: Tensor<B, 3>,
        sigma: Tensor<B, 1>,
        cond: &Self::Conditioning,
    ) -> Tensor<B, 3>;
}

/// The batch operations of a conditioning, along its first (row = sample) dimension.
///
/// Every operation must act on all of the conditioning's per-row parts alike and leave
/// per-batch parts (a token geometry shared by all rows) as they are, so that a model
/// conditioned on `cat_rows([c.slice_rows(a..b), c.slice_rows(b..n)])` computes exactly what
/// it computes on `c`.
pub trait Conditioning: Clone + Send + Sync + Sized {
    /// Rows (samples) in the batch.
    fn rows(&self) -> usize;

    /// Rows `range` of the batch.
    ///
    /// # Panics
    /// When `range` is not within `0..rows()` (a programming error).
    fn slice_rows(&self, range: Range<usize>) -> Self;

    /// The batches of `parts` one after another.
    ///
    /// # Panics
    /// When `parts` is empty or the parts' per-batch parts disagree (a programming error).
    fn cat_rows(parts: Vec<Self>) -> Self;

    /// The whole batch `times` times over: row `i` of the result is row `i % rows()`.
    fn repeat_rows(&self, times: usize) -> Self;
}

/// The simplest conditioning: one tensor whose first dimension is the batch (a class
/// embedding `[batch, dim]`, or states `[batch, tokens, dim]`).
#[derive(Clone, Debug)]
pub struct TensorConditioning<B: Backend, const D: usize>(pub Tensor<B, D>);

impl<B: Backend, const D: usize> Conditioning for TensorConditioning<B, D> {
    fn rows(&self) -> usize {
        self.0.dims()[0]
    }

    fn slice_rows(&self, range: Range<usize>) -> Self {
        Self(self.0.clone().narrow(0, range.start, range.len()))
    }

    fn cat_rows(parts: Vec<Self>) -> Self {
        assert!(!parts.is_empty(), "no conditioning rows to concatenate");
        Self(Tensor::cat(parts.into_iter().map(|p| p.0).collect(), 0))
    }

    fn repeat_rows(&self, times: usize) -> Self {
        Self(self.0.clone().repeat_dim(0, times))
    }
}

mod guidance;

pub use guidance::{Guided, TrueCfg, true_cfg};
