//! Building blocks: a LoRA-capable [`Linear`], [`RmsNorm`], and the parameter-free
//! functions (layer norm, GELU-tanh, SiLU) — thin wrappers over burn's tensor ops.

use burn::config::Config;
use burn::module::{Initializer, Module, Param};
use burn::tensor::activation;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, module::linear};

/// Whether a forward pass runs the LoRA adapters.
///
/// `Disabled` is the frozen base model (the KL reference policy) at no extra cost: the
/// adapter branch is skipped, or, for a merged adapter, subtracted again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Adapters {
    /// Base weights plus the adapters.
    Enabled,
    /// Base weights only.
    Disabled,
}

/// Configuration of a [`Linear`] layer.
#[derive(Config, Debug)]
pub struct LinearConfig {
    /// Input features.
    pub d_input: usize,
    /// Output features.
    pub d_output: usize,
    /// Whether the layer has a bias.
    #[config(default = true)]
    pub bias: bool,
}

impl LinearConfig {
    /// A lazily initialised layer: PyTorch's `nn.Linear` initialisation
    /// (`U(-1/sqrt(d_in), 1/sqrt(d_in))` for weight and bias), materialised only if the
    /// parameter is read before weights are loaded into it.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Linear<B> {
        let k = 1.0 / (self.d_input as f64).sqrt();
        let init = Initializer::Uniform { min: -k, max: k };
        let weight = init.init_with(
            [self.d_input, self.d_output],
            Some(self.d_input),
            Some(self.d_output),
            device,
        );
        let bias = self
            .bias
            .then(|| init.init_with([self.d_output], Some(self.d_input), None, device));
        Linear {
            weight,
            bias,
            lora: None,
        }
    }
}

/// A linear layer `y = x·W + b` that can carry a LoRA adapter.
///
/// burn stores `W` as `[d_in, d_out]` (PyTorch's `nn.Linear.weight` is `[d_out, d_in]`; the
/// loaders and exporters transpose). With an adapter the layer computes
/// `x·W + b + s·(x·A)·B` with `A: [d_in, r]`, `B: [r, d_out]` and `s` the adapter's scale —
/// never materialising `W + s·A·B`, whose full-size gradient would be unaffordable at 20B.
#[derive(Module, Debug)]
pub struct Linear<B: Backend> {
    /// `[d_in, d_out]`.
    pub weight: Param<Tensor<B, 2>>,
    /// `[d_out]`.
    pub bias: Option<Param<Tensor<B, 1>>>,
    /// The LoRA adapter, if one is attached.
    pub lora: Option<LoraAdapter<B>>,
}

/// A LoRA adapter `s·A·B` on a [`Linear`] layer.
#[derive(Module, Debug)]
pub struct LoraAdapter<B: Backend> {
    /// `A: [d_in, r]` (PEFT's `lora_A.weight` is `[r, d_in]`).
    pub lora_a: Param<Tensor<B, 2>>,
    /// `B: [r, d_out]` (PEFT's `lora_B.weight` is `[d_out, r]`); zero at initialisation.
    pub lora_b: Param<Tensor<B, 2>>,
    /// `s = alpha / r` (or `alpha / sqrt(r)` with rsLoRA).
    pub scale: f64,
    /// Whether `s·A·B` has been added into the base weight.
    pub merged: bool,
}

impl<B: Backend> LoraAdapter<B> {
    /// `s·(x·A)·B` for `x: [..., d_in]`.
    pub fn delta<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let xa = linear(x, self.lora_a.val(), None);
        linear(xa, self.lora_b.val(), None).mul_scalar(self.scale)
    }

    /// The rank `r`.
    pub fn rank(&self) -> usize {
        self.lora_a.lazy_shape().dims::<2>()[1]
    }
}

impl<B: Backend> Linear<B> {
    /// `x: [..., d_in]` to `[..., d_out]`, with or without the adapter.
    ///
    /// [`fused_ops::linear`]: on the CPU backend the bias and the adapter's term accumulate
    /// into the product's output, and the backward computes only the tracked gradients.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>, adapters: Adapters) -> Tensor<B, D> {
        let term = |l: &LoraAdapter<B>, scale: f64| fused_ops::LoraTerm {
            a: l.lora_a.val(),
            b: l.lora_b.val(),
            scale,
        };
        let lora = match (&self.lora, adapters) {
            (Some(l), Adapters::Enabled) if !l.merged => Some(term(l, l.scale)),
            (Some(l), Adapters::Disabled) if l.merged => Some(term(l, -l.scale)),
            _ => None,
        };
        let bias = self.bias.as_ref().map(|b| b.val());
        match lora {
            // An adapter in another dtype than the activations (f32 adapters on bf16 base
            // weights): its term is computed in the adapter's dtype and added in the base's.
            Some(t) if t.a.dtype() != x.dtype() => {
                let dtype = x.dtype();
                let xa = linear(x.clone().cast(t.a.dtype()), t.a, None);
                let delta = linear(xa, t.b, None).mul_scalar(t.scale).cast(dtype);
                fused_ops::linear(x, self.weight.val(), bias, None) + delta
            }
            lora => fused_ops::linear(x, self.weight.val(), bias, lora),
        }
    }

    /// `(d_in, d_out)`, read without materialising a lazy weight.
    pub fn dims(&self) -> (usize, usize) {
        let d = self.weight.lazy_shape().dims::<2>();
        (d[0], d[1])
    }
}

/// Root-mean-square norm with a learned per-channel weight (diffusers `RMSNorm`,
/// `elementwise_affine=True`): `y = x / sqrt(mean(x^2) + eps) * weight`, over the last axis.
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    /// `[dim]`, ones at initialisation.
    pub weight: Param<Tensor<B, 1>>,
    /// Epsilon inside the square root.
    pub eps: f64,
}

/// Configuration of an [`RmsNorm`].
#[derive(Config, Debug)]
pub struct RmsNormConfig {
    /// Normalised dimension.
    pub dim: usize,
    /// Epsilon.
    #[config(default = 1e-6)]
    pub eps: f64,
}

impl RmsNormConfig {
    /// Weight initialised to ones (lazily).
    pub fn init<B: Backend>(&self, device: &B::Device) -> RmsNorm<B> {
        RmsNorm {
            weight: Initializer::Ones.init([self.dim], device),
            eps: self.eps,
        }
    }
}

impl<B: Backend> RmsNorm<B> {
    /// Normalises over the last axis of `x: [..., dim]`.
    ///
    /// [`fused_ops::rms_norm`]: one pass forward and one backward on the CPU backend.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        fused_ops::rms_norm(x, self.weight.val(), self.eps)
    }
}

/// Layer norm without affine parameters (`nn.LayerNorm(dim, elementwise_affine=False)`):
/// `(x - mean) / sqrt(var + eps)` over the last axis, biased variance.
pub fn layer_norm<B: Backend, const D: usize>(x: Tensor<B, D>, eps: f64) -> Tensor<B, D> {
    let mean = x.clone().mean_dim(D - 1);
    let xc = x - mean;
    let var = xc.clone().square().mean_dim(D - 1);
    xc * var.add_scalar(eps).sqrt().recip()
}

/// GELU with the tanh approximation (`gelu-approximate` / `approximate="tanh"`):
/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
///
/// [`fused_ops::gelu_tanh`]: one vectorised pass forward and one backward on the CPU backend,
/// the composition `x * sigmoid(x (c0 + c1 x^2))` (the identity `0.5 (1 + tanh(u)) =
/// sigmoid(2u)`, no `powf` or `tanh`) elsewhere. Either is the same function to float rounding.
pub fn gelu_tanh<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    fused_ops::gelu_tanh(x)
}

/// SiLU `x * sigmoid(x)`.
pub fn silu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    activation::silu(x)
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::tensor::{Tensor, TensorData};

    use super::gelu_tanh;

    /// The sigmoid form is the tanh form up to float rounding, from the saturated tails
    /// through zero.
    #[test]
    fn gelu_tanh_is_the_tanh_approximation() {
        let xs: Vec<f32> = (-4000..=4000)
            .map(|i| i as f32 * 0.005)
            .chain([-1e4, -90.0, -30.0, 30.0, 90.0, 1e4, -0.0])
            .collect();
        let n = xs.len();
        let y = gelu_tanh(Tensor::<Flex, 1>::from_data(
            TensorData::new(xs.clone(), [n]),
            &Default::default(),
        ))
        .into_data()
        .into_vec::<f32>()
        .unwrap();
        let c = (2.0 / std::f64::consts::PI).sqrt();
        let mut worst = 0.0f64;
        for (x, y) in xs.iter().map(|&x| x as f64).zip(y) {
            let want = 0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh());
            let err = (y as f64 - want).abs() / want.abs().max(1.0);
            worst = worst.max(err);
            assert!(err < 1e-6, "gelu_tanh({x}) = {y}, expected {want}");
        }
        println!("gelu_tanh: worst error {worst:.3e}");
    }
}
