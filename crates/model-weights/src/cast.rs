//! Casting a loaded module's weights to another float dtype on its device.

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};

/// Casts every float parameter of `module` to `dtype` on its device (bf16 weights for a GPU
/// backend, say), keeping each parameter's id and whether it requires a gradient: a trainable
/// parameter becomes a fresh leaf of the new dtype, so an optimizer keyed by the ids carries
/// over. Parameters already in `dtype` are kept as they are. Lazily initialised parameters are
/// materialised and cast one at a time, so the peak is the module in `dtype` plus one
/// parameter in its old dtype.
///
/// On an autodiff backend a parameter is untracked before the cast: `Tensor::detach` keeps
/// the gradient flag, and a tracked cast is not a leaf (marking it would panic).
///
/// The rounding is the backend's own cast; burn-flex 0.21 does not always round f32 to the
/// nearest bf16. Loaders that can should make the weights in the target dtype on the host as
/// they read them (`dit_models::WeightDtype::Bf16`, `TextEncoder::from_dir_variant_in`).
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::module::Module;
/// use burn::nn::LinearConfig;
/// use burn::tensor::DType;
///
/// let device = Default::default();
/// let linear = LinearConfig::new(3, 2).init::<Autodiff<Flex>>(&device);
/// let linear = model_weights::cast_float_params(linear, DType::F64);
/// assert_eq!(linear.weight.val().dtype(), DType::F64);
/// assert!(linear.weight.val().is_require_grad());
/// ```
pub fn cast_float_params<B: Backend, M: Module<B>>(module: M, dtype: DType) -> M {
    module.map(&mut CastFloat(dtype))
}

/// `t` in `dtype`; `t` itself (no cast, no graph node) when it has that dtype already: the
/// boundary of a model that computes in its weights' dtype.
pub fn in_dtype<B: Backend, const D: usize>(t: Tensor<B, D>, dtype: DType) -> Tensor<B, D> {
    if t.dtype() == dtype { t } else { t.cast(dtype) }
}

struct CastFloat(DType);

impl<B: Backend> ModuleMapper<B> for CastFloat {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let dtype = self.0;
        param.map(|t| {
            if t.dtype() == dtype {
                return t;
            }
            let grad = t.is_require_grad();
            t.set_require_grad(false).cast(dtype).set_require_grad(grad)
        })
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::{DType, Distribution, Tensor};

    use super::cast_float_params;

    type A = Autodiff<Flex>;

    fn host(t: Tensor<A, 2>) -> Vec<f64> {
        t.into_data().convert::<f64>().to_vec().unwrap()
    }

    #[test]
    fn a_cast_keeps_ids_values_and_trainability_and_gradients_reach_the_new_leaves() {
        let device = Default::default();
        let mut linear: Linear<A> = LinearConfig::new(4, 3).init(&device);
        // One frozen parameter, one trainable.
        let bias = linear.bias.take().unwrap();
        linear.bias = Some(bias.map(|b| b.set_require_grad(false)));
        let before = host(linear.weight.val());
        let ids = (linear.weight.id, linear.bias.as_ref().unwrap().id);

        let cast = cast_float_params(linear, DType::F64);
        assert_eq!(cast.weight.val().dtype(), DType::F64);
        assert_eq!(cast.bias.as_ref().unwrap().val().dtype(), DType::F64);
        assert_eq!((cast.weight.id, cast.bias.as_ref().unwrap().id), ids);
        assert!(cast.weight.val().is_require_grad());
        assert!(!cast.bias.as_ref().unwrap().val().is_require_grad());
        // f32 -> f64 is exact.
        assert_eq!(host(cast.weight.val()), before);

        let x = Tensor::<A, 2>::random([5, 4], Distribution::Normal(0.0, 1.0), &device)
            .cast(DType::F64);
        let grads = cast.forward(x).powi_scalar(2).sum().backward();
        let g = cast
            .weight
            .grad(&grads)
            .expect("the cast weight is a leaf with a gradient");
        assert_eq!(g.dtype(), DType::F64);
        assert!(cast.bias.as_ref().unwrap().grad(&grads).is_none());

        // Casting to the dtype a parameter has already is the identity.
        let again = cast_float_params(cast.clone(), DType::F64);
        assert_eq!(host(again.weight.val()), host(cast.weight.val()));
    }
}
