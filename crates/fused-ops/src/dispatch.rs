//! Which implementation a tensor takes: the concrete type of its primitive, read at run time.
//!
//! Rust has no specialisation, so a function generic over `B: Backend` cannot have a second
//! body for `B = Flex`. The primitive's type can be compared instead: `Any` moves a value into
//! a concrete type when (and only when) it is that type, which costs a type-id comparison and
//! no copy, and needs no `unsafe`.

use core::any::Any;

use burn::backend::Autodiff;
use burn::backend::flex::{Flex, FlexTensor};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorPrimitive};

/// The autodiff primitive of `Autodiff<Flex>` (burn names its type only through the backend).
pub(crate) type AutodiffFlexTensor = FloatTensor<Autodiff<Flex>>;

/// `t` as a `U` when `T` is `U`, or `t` back.
fn cast<T: 'static, U: 'static>(t: T) -> Result<U, T> {
    let mut slot = Some(t);
    match (&mut slot as &mut dyn Any).downcast_mut::<Option<U>>() {
        Some(u) => Ok(u.take().expect("the slot was filled above")),
        None => Err(slot.expect("the slot was not taken")),
    }
}

/// The route of a tensor, for checking that several take the same one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Flex,
    AutodiffFlex,
    Generic,
}

/// A tensor sorted by the implementation it takes.
pub(crate) enum Route<B: Backend, const D: usize> {
    /// A contiguous-or-not `f32` Flex tensor.
    Flex(FlexTensor),
    /// An `f32` `Autodiff<Flex>` tensor.
    AutodiffFlex(AutodiffFlexTensor),
    /// Anything else: another backend, another dtype, a quantized tensor.
    Generic(Tensor<B, D>),
}

impl<B: Backend, const D: usize> Route<B, D> {
    pub(crate) fn of(x: Tensor<B, D>) -> Self {
        if x.dtype() != DType::F32 {
            return Self::Generic(x);
        }
        let p = match x.into_primitive() {
            TensorPrimitive::Float(p) => p,
            q => return Self::Generic(Tensor::from_primitive(q)),
        };
        let p = match cast::<B::FloatTensorPrimitive, FlexTensor>(p) {
            Ok(t) => return Self::Flex(t),
            Err(p) => p,
        };
        match cast::<B::FloatTensorPrimitive, AutodiffFlexTensor>(p) {
            Ok(t) => Self::AutodiffFlex(t),
            Err(p) => Self::Generic(Tensor::from_primitive(TensorPrimitive::Float(p))),
        }
    }

    /// Which route the tensor took.
    pub(crate) fn kind(&self) -> Kind {
        match self {
            Self::Flex(_) => Kind::Flex,
            Self::AutodiffFlex(_) => Kind::AutodiffFlex,
            Self::Generic(_) => Kind::Generic,
        }
    }

    /// The Flex primitive; only for a tensor whose [`Self::kind`] is [`Kind::Flex`].
    pub(crate) fn into_flex(self) -> FlexTensor {
        match self {
            Self::Flex(t) => t,
            _ => unreachable!("into_flex on a tensor of another route"),
        }
    }

    /// The `Autodiff<Flex>` primitive; only for a tensor whose [`Self::kind`] is
    /// [`Kind::AutodiffFlex`].
    pub(crate) fn into_autodiff_flex(self) -> AutodiffFlexTensor {
        match self {
            Self::AutodiffFlex(t) => t,
            _ => unreachable!("into_autodiff_flex on a tensor of another route"),
        }
    }

    /// The tensor again, whichever route it took.
    pub(crate) fn into_tensor(self) -> Tensor<B, D> {
        match self {
            Self::Flex(t) => from_flex(t),
            Self::AutodiffFlex(t) => from_autodiff_flex(t),
            Self::Generic(x) => x,
        }
    }
}

/// A Flex result as the caller's tensor; only called on the Flex route, where `B`'s primitive
/// is `FlexTensor`.
pub(crate) fn from_flex<B: Backend, const D: usize>(t: FlexTensor) -> Tensor<B, D> {
    let p = cast::<FlexTensor, B::FloatTensorPrimitive>(t)
        .unwrap_or_else(|_| unreachable!("the Flex route is taken only by Flex primitives"));
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

/// An `Autodiff<Flex>` result as the caller's tensor; only called on that route.
pub(crate) fn from_autodiff_flex<B: Backend, const D: usize>(
    t: AutodiffFlexTensor,
) -> Tensor<B, D> {
    let p = cast::<AutodiffFlexTensor, B::FloatTensorPrimitive>(t).unwrap_or_else(|_| {
        unreachable!("the Autodiff<Flex> route is taken only by Autodiff<Flex> primitives")
    });
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex, NdArray};
    use burn::tensor::{DType, Tensor};

    use super::Route;

    #[test]
    fn each_backend_takes_its_route() {
        let dev = Default::default();
        let x = Tensor::<Flex, 2>::ones([2, 3], &dev);
        assert!(matches!(Route::of(x.clone()), Route::Flex(_)));
        assert!(matches!(
            Route::of(x.clone().cast(DType::F64)),
            Route::<Flex, 2>::Generic(_)
        ));
        let a = Tensor::<Autodiff<Flex>, 2>::ones([2, 3], &dev);
        assert!(matches!(Route::of(a), Route::AutodiffFlex(_)));
        let n = Tensor::<NdArray, 2>::ones([2, 3], &Default::default());
        assert!(matches!(Route::of(n.clone()), Route::Generic(_)));
        // and back without a change
        let back = Route::of(x.clone()).into_tensor();
        assert_eq!(back.into_data(), x.into_data());
    }
}
