//! The Qwen-Image transformer behind the velocity-model interface (`velocity-model`) that
//! samplers and trainers take, instead of a concrete DiT.

use std::ops::Range;

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor};
pub use velocity_model::{Conditioning, VelocityModel};

use crate::layers::Adapters;
use crate::model::{QwenImageInput, QwenImageTransformer2DModel};
use crate::rope::ImageShape;

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

/// Rows are samples: the states and the mask are sliced, concatenated and tiled together;
/// the token grids (one per image geometry, shared by the batch) stay as they are.
impl<B: Backend> Conditioning for QwenImageConditioning<B> {
    fn rows(&self) -> usize {
        self.encoder_hidden_states.dims()[0]
    }

    fn slice_rows(&self, range: Range<usize>) -> Self {
        Self {
            encoder_hidden_states: self.encoder_hidden_states.clone().slice([range.clone()]),
            encoder_hidden_states_mask: self
                .encoder_hidden_states_mask
                .clone()
                .map(|m| m.slice([range])),
            img_shapes: self.img_shapes.clone(),
        }
    }

    fn cat_rows(parts: Vec<Self>) -> Self {
        assert!(!parts.is_empty(), "no conditioning rows to concatenate");
        let img_shapes = parts[0].img_shapes.clone();
        assert!(
            parts.iter().all(|p| p.img_shapes == img_shapes),
            "conditionings of different image geometries cannot share a batch"
        );
        let with_mask = parts[0].encoder_hidden_states_mask.is_some();
        assert!(
            parts
                .iter()
                .all(|p| p.encoder_hidden_states_mask.is_some() == with_mask),
            "conditionings with and without a text mask cannot share a batch"
        );
        let masks: Option<Vec<Tensor<B, 2, Bool>>> = parts
            .iter()
            .map(|p| p.encoder_hidden_states_mask.clone())
            .collect();
        Self {
            encoder_hidden_states: Tensor::cat(
                parts.into_iter().map(|p| p.encoder_hidden_states).collect(),
                0,
            ),
            encoder_hidden_states_mask: masks.map(|m| Tensor::cat(m, 0)),
            img_shapes,
        }
    }

    fn repeat_rows(&self, times: usize) -> Self {
        Self {
            encoder_hidden_states: self.encoder_hidden_states.clone().repeat_dim(0, times),
            encoder_hidden_states_mask: self
                .encoder_hidden_states_mask
                .clone()
                .map(|m| m.repeat_dim(0, times)),
            img_shapes: self.img_shapes.clone(),
        }
    }
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
