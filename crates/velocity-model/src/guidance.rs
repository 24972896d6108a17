//! Classifier-free guidance as diffusers' `QwenImagePipeline` applies it ("true CFG"): two
//! forwards, one conditioned on the prompt and one on the negative prompt, combined as
//! `neg + s (pos - neg)` and rescaled token by token to the norm of the positive prediction.
//!
//! Guidance is for sampling alone: a likelihood objective replays the trained transitions with
//! one positive-conditioned forward, so a guided rollout would train against a policy it never
//! sampled from (the trainer's preflight refuses `sampling.guidance_scale != 1`).

use std::ops::Range;

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::{Conditioning, VelocityModel};

/// A batch's conditioning on its prompts and on their negative prompts, row for row.
#[derive(Clone, Debug)]
pub struct Guided<C> {
    /// The prompts' conditioning.
    pub positive: C,
    /// The negative prompts' (one per row, often the same text repeated).
    pub negative: C,
}

impl<C: Conditioning> Conditioning for Guided<C> {
    fn rows(&self) -> usize {
        self.positive.rows()
    }

    fn slice_rows(&self, range: Range<usize>) -> Self {
        Self {
            positive: self.positive.slice_rows(range.clone()),
            negative: self.negative.slice_rows(range),
        }
    }

    fn cat_rows(parts: Vec<Self>) -> Self {
        let (positive, negative) = parts.into_iter().map(|g| (g.positive, g.negative)).unzip();
        Self {
            positive: C::cat_rows(positive),
            negative: C::cat_rows(negative),
        }
    }

    fn repeat_rows(&self, times: usize) -> Self {
        Self {
            positive: self.positive.repeat_rows(times),
            negative: self.negative.repeat_rows(times),
        }
    }
}

/// `model` under true CFG of scale `scale`: a velocity model whose conditioning is
/// [`Guided`]. At `scale = 1` the combination is the positive prediction (up to the
/// rescale's rounding), still at the cost of two forwards.
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// use velocity_model::{Guided, TensorConditioning, TrueCfg, VelocityModel};
///
/// /// v = x + c (c broadcast over tokens and channels)
/// struct Shift;
/// impl VelocityModel<Flex> for Shift {
///     type Conditioning = TensorConditioning<Flex, 1>;
///     fn velocity(&self, x: Tensor<Flex, 3>, _: Tensor<Flex, 1>, c: &Self::Conditioning) -> Tensor<Flex, 3> {
///         x + c.0.clone().reshape([-1, 1, 1])
///     }
/// }
/// let dev = Default::default();
/// let x = Tensor::<Flex, 3>::zeros([1, 2, 2], &dev);
/// let cond = Guided {
///     positive: TensorConditioning(Tensor::from_floats([1.0], &dev)),
///     negative: TensorConditioning(Tensor::from_floats([0.5], &dev)),
/// };
/// // 0.5 + 4 (1 - 0.5) = 2.5 per channel, rescaled to the positive prediction's norm: 1
/// let v = TrueCfg::new(&Shift, 4.0).velocity(x, Tensor::from_floats([0.5], &dev), &cond);
/// assert_eq!(v.into_data().to_vec::<f32>().unwrap(), vec![1.0; 4]);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct TrueCfg<'a, M> {
    model: &'a M,
    scale: f64,
}

impl<'a, M> TrueCfg<'a, M> {
    /// `model` guided at `scale` (diffusers' `true_cfg_scale`; guidance is on above 1).
    pub fn new(model: &'a M, scale: f64) -> Self {
        Self { model, scale }
    }

    /// The guidance scale.
    pub fn scale(&self) -> f64 {
        self.scale
    }
}

impl<B: Backend, M: VelocityModel<B>> VelocityModel<B> for TrueCfg<'_, M> {
    type Conditioning = Guided<M::Conditioning>;

    fn velocity(
        &self,
        x: Tensor<B, 3>,
        sigma: Tensor<B, 1>,
        cond: &Self::Conditioning,
    ) -> Tensor<B, 3> {
        let positive = self
            .model
            .velocity(x.clone(), sigma.clone(), &cond.positive);
        let negative = self.model.velocity(x, sigma, &cond.negative);
        true_cfg(positive, negative, self.scale)
    }
}

/// diffusers' true-CFG combination of a positive and a negative prediction
/// (`[batch, tokens, channels]`): `comb = neg + scale (pos - neg)`, then
/// `comb * |pos| / |comb|` with the norms over the channels of each token.
pub fn true_cfg<B: Backend>(
    positive: Tensor<B, 3>,
    negative: Tensor<B, 3>,
    scale: f64,
) -> Tensor<B, 3> {
    let comb = negative.clone() + (positive.clone() - negative).mul_scalar(scale);
    let cond_norm = positive.powi_scalar(2).sum_dim(2).sqrt();
    let noise_norm = comb.clone().powi_scalar(2).sum_dim(2).sqrt();
    comb * (cond_norm / noise_norm)
}
