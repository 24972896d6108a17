//! The velocity-model interface that samplers and trainers take, instead of a concrete DiT.

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor};

use crate::layers::Adapters;
use crate::model::{QwenImageInput, QwenImageTransformer2DModel};
use crate::rope::ImageShape;

/// A flow-matching velocity model: `v = f(x_sigma, sigma, conditioning)`.
///
/// Sampling and training code is written against this trait; the concrete transformer, its
/// adapters and its conditioning format stay behind it. `x` is the packed latent sequence
/// `[batch, tokens, channels]`, `sigma` the per-sample noise level in `[0, 1]`, and the
/// output has the shape of `x`'s token grid with the model's output channels.
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

/// The conditioning of [`QwenImageTransformer2DModel`].
#[derive(Clone, Debug)]
pub struct QwenImageConditioning<B: Backend> {
    /// Text-encoder states, `[batch, text_tokens, joint_attention_dim]`.
    pub encoder_hidden_states: Tensor<B, 3>,
    /// `[batch, text_tokens]`, `true` for real tokens; `None` attends to all.
    pub encoder_hidden_states_mask: Option<Tensor<B, 2, Bool>>,
    /// Token grids of the latent images.
    pub img_shapes: Vec<ImageShape>,
}

impl<B: Backend> QwenImageConditioning<B> {
    fn input(&self, x: Tensor<B, 3>, sigma: Tensor<B, 1>) -> QwenImageInput<B> {
        QwenImageInput {
            hidden_states: x,
            encoder_hidden_states: self.encoder_hidden_states.clone(),
            encoder_hidden_states_mask: self.encoder_hidden_states_mask.clone(),
            timestep: sigma,
            img_shapes: self.img_shapes.clone(),
        }
    }
}

/// Qwen-Image's transformer takes `timestep = sigma` (its pipeline divides by 1000).
impl<B: Backend> VelocityModel<B> for QwenImageTransformer2DModel<B> {
    type Conditioning = QwenImageConditioning<B>;

    fn velocity(
        &self,
        x: Tensor<B, 3>,
        sigma: Tensor<B, 1>,
        cond: &Self::Conditioning,
    ) -> Tensor<B, 3> {
        self.forward_with(cond.input(x, sigma), Adapters::Enabled)
    }
}

/// A borrowed view of a model with its LoRA adapters switched off: the frozen base policy
/// (e.g. the KL reference) at no copy and no weight change. See
/// [`QwenImageTransformer2DModel::without_adapters`].
#[derive(Clone, Copy, Debug)]
pub struct WithoutAdapters<'a, M>(pub &'a M);

impl<B: Backend> VelocityModel<B> for WithoutAdapters<'_, QwenImageTransformer2DModel<B>> {
    type Conditioning = QwenImageConditioning<B>;

    fn velocity(
        &self,
        x: Tensor<B, 3>,
        sigma: Tensor<B, 1>,
        cond: &Self::Conditioning,
    ) -> Tensor<B, 3> {
        self.0
            .forward_with(cond.input(x, sigma), Adapters::Disabled)
    }
}

impl<B: Backend> QwenImageTransformer2DModel<B> {
    /// This model with its adapters disabled, as a [`VelocityModel`].
    pub fn without_adapters(&self) -> WithoutAdapters<'_, Self> {
        WithoutAdapters(self)
    }
}
