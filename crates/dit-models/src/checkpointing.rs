//! Forward + backward in one call, with optional per-block activation checkpointing.
//!
//! A plain backward keeps every activation of every block alive until the gradient reaches
//! it — including each block's full `[batch, heads, seq, seq]` attention score matrix, which
//! burn's attention backward keeps. With [`ActivationCheckpointing::PerBlock`] the forward runs
//! without a graph and keeps only the block boundaries (`img`, `txt`: `[batch, tokens, dim]`
//! per block); the backward then walks the blocks from last to first, re-running one block at
//! a time with a graph, and pulls the incoming gradient through it. Peak activation memory is
//! one block's activations plus the boundaries, for the price of one extra forward per block.
//!
//! burn 0.21 has no user-level checkpoint primitive (its `BalancedCheckpointing` strategy
//! recomputes individual memory-bound ops, not blocks, and a backward cannot run a nested
//! autodiff graph), so the segments are separate backward passes chained by hand: segment `k`
//! is differentiated through `<output_k, grad_k>` (a vector-Jacobian product) with its inputs
//! as fresh leaves, whose gradients become `grad_{k-1}`. The result equals the plain backward
//! up to floating-point summation order.

use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Bool, Tensor};

use model_weights::in_dtype;

use crate::layers::Adapters;
use crate::model::{QwenImageInput, QwenImageTransformer2DModel};

/// How activations are kept for the backward pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ActivationCheckpointing {
    /// Keep everything (fastest, most memory).
    #[default]
    None,
    /// Keep block boundaries only; recompute each block during backward.
    PerBlock,
}

/// The loss and the gradients of one forward + backward.
pub struct BackwardOutput<B: AutodiffBackend> {
    /// The loss value (no graph).
    pub loss: Tensor<B::InnerBackend, 1>,
    /// Gradients of every parameter that requires one (only the adapters when a LoRA adapter
    /// is attached), keyed by parameter id, ready for an optimizer step.
    pub grads: GradientsParams,
}

/// Copies the gradient of every parameter of a module into `out`.
struct Collect<'a, B: AutodiffBackend> {
    grads: &'a B::Gradients,
    out: &'a mut GradientsParams,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = param.grad(self.grads) {
            self.out.register::<B::InnerBackend, D>(param.id, g);
        }
    }
}

fn collect<B: AutodiffBackend, M: Module<B>>(
    module: &M,
    grads: &B::Gradients,
    out: &mut GradientsParams,
) {
    module.visit(&mut Collect { grads, out });
}

/// A fresh leaf that requires a gradient, holding the value of `x`.
fn leaf<B: AutodiffBackend, const D: usize>(x: &Tensor<B::InnerBackend, D>) -> Tensor<B, D> {
    Tensor::from_inner(x.clone()).require_grad()
}

/// `sum(x * g)`, a scalar whose gradient with respect to `x` is `g`.
fn dot<B: AutodiffBackend, const D: usize>(
    x: Tensor<B, D>,
    g: &Tensor<B::InnerBackend, D>,
) -> Tensor<B, 1> {
    (x * Tensor::from_inner(g.clone())).sum()
}

fn grad_or_zeros<B: AutodiffBackend, const D: usize>(
    x: &Tensor<B, D>,
    grads: &B::Gradients,
) -> Tensor<B::InnerBackend, D> {
    x.grad(grads)
        .unwrap_or_else(|| Tensor::zeros(x.dims(), &x.device().clone()))
}

impl<B: AutodiffBackend> QwenImageTransformer2DModel<B> {
    /// Runs `loss(forward_with(input, adapters))` and its backward, returning the loss and
    /// the parameter gradients, with or without per-block activation checkpointing (same
    /// gradients either way, up to summation order).
    ///
    /// `loss` maps the model output `[batch, image_tokens, channels]` to a one-element tensor.
    /// Gradients flow to parameters only (the inputs are treated as data).
    pub fn forward_backward(
        &self,
        input: QwenImageInput<B>,
        adapters: Adapters,
        checkpointing: ActivationCheckpointing,
        loss: impl FnOnce(Tensor<B, 3>) -> Tensor<B, 1>,
    ) -> BackwardOutput<B> {
        match checkpointing {
            ActivationCheckpointing::None => {
                let l = loss(self.forward_with(input, adapters));
                let value = l.clone().inner();
                let grads = l.backward();
                BackwardOutput {
                    loss: value,
                    grads: GradientsParams::from_grads(grads, self),
                }
            }
            ActivationCheckpointing::PerBlock => {
                self.forward_backward_per_block(input, adapters, loss)
            }
        }
    }

    fn forward_backward_per_block(
        &self,
        input: QwenImageInput<B>,
        adapters: Adapters,
        loss: impl FnOnce(Tensor<B, 3>) -> Tensor<B, 1>,
    ) -> BackwardOutput<B> {
        let s_txt = self.check_input(&input);
        let out_dtype = input.hidden_states.dtype();
        let input = input.in_dtype(self.compute_dtype());
        let QwenImageInput {
            hidden_states,
            encoder_hidden_states,
            encoder_hidden_states_mask,
            timestep,
            img_shapes,
        } = input;
        let device = hidden_states.device();
        let hidden_dtype = hidden_states.dtype();
        let mut out = GradientsParams::new();

        // Pass 1: no graph, keep the block boundaries.
        let inner = self.valid();
        let inner_mask = encoder_hidden_states_mask
            .clone()
            .map(Tensor::<B, 2, Bool>::inner);
        let (img, txt, temb) = inner.prologue(
            hidden_states.clone().inner(),
            encoder_hidden_states.clone().inner(),
            timestep.clone().inner(),
            adapters,
        );
        let ctx = inner
            .block_context(
                &img_shapes,
                s_txt,
                inner_mask,
                (&img.device(), img.dtype()),
                adapters,
            )
            .with_temb(&temb);
        let mut boundaries = vec![(img, txt)];
        for block in &inner.transformer_blocks {
            let (img, txt) = boundaries.last().expect("boundary").clone();
            boundaries.push(block.forward(img, txt, &ctx));
        }

        // Head: norm_out, proj_out and the loss.
        let (img_last, txt_last) = boundaries.pop().expect("boundary");
        let img_leaf = leaf::<B, 3>(&img_last);
        let temb_leaf = leaf::<B, 2>(&temb);
        let l = loss(in_dtype(
            self.epilogue(img_leaf.clone(), temb_leaf.clone(), adapters),
            out_dtype,
        ));
        let value = l.clone().inner();
        let grads = l.backward();
        collect(&self.norm_out, &grads, &mut out);
        collect(&self.proj_out, &grads, &mut out);
        let mut g_img = grad_or_zeros(&img_leaf, &grads);
        // The last block's text stream feeds nothing: no gradient (as in the plain backward).
        drop(txt_last);
        let mut g_txt: Option<Tensor<B::InnerBackend, 3>> = None;
        let mut g_temb = grad_or_zeros(&temb_leaf, &grads);

        // Blocks, last to first, each re-run with a graph.
        let ctx = self.block_context(
            &img_shapes,
            s_txt,
            encoder_hidden_states_mask,
            (&device, hidden_dtype),
            adapters,
        );
        for (block, (img, txt)) in self.transformer_blocks.iter().zip(boundaries).rev() {
            let (img_leaf, txt_leaf, temb_leaf) =
                (leaf::<B, 3>(&img), leaf::<B, 3>(&txt), leaf::<B, 2>(&temb));
            let (img_out, txt_out) = block.forward(
                img_leaf.clone(),
                txt_leaf.clone(),
                &ctx.clone().with_temb(&temb_leaf),
            );
            let s = match &g_txt {
                Some(g) => dot(img_out, &g_img) + dot(txt_out, g),
                None => dot(img_out, &g_img),
            };
            let grads = s.backward();
            collect(block, &grads, &mut out);
            g_img = grad_or_zeros(&img_leaf, &grads);
            g_txt = Some(grad_or_zeros(&txt_leaf, &grads));
            g_temb = g_temb + grad_or_zeros(&temb_leaf, &grads);
        }

        // Input projections and the timestep embedding.
        let (img, txt, temb) =
            self.prologue(hidden_states, encoder_hidden_states, timestep, adapters);
        let mut s = dot(img, &g_img) + dot(temb, &g_temb);
        if let Some(g) = &g_txt {
            s = s + dot(txt, g);
        }
        let grads = s.backward();
        collect(&self.time_text_embed, &grads, &mut out);
        collect(&self.txt_norm, &grads, &mut out);
        collect(&self.img_in, &grads, &mut out);
        collect(&self.txt_in, &grads, &mut out);
        BackwardOutput {
            loss: value,
            grads: out,
        }
    }
}
