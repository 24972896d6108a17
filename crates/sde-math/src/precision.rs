//! Compute dtype and storage precision.
//!
//! Kernels compute in `f32` whatever the input dtype (`f16`/`bf16` model outputs are upcast
//! first, as diffusers does), or in `f64` when the backend's tensors are `f64` (the reference
//! evaluation used by the property tests).
//!
//! A rollout stores its trajectory at a storage precision (often `bf16`). Replay then scores the
//! *stored* sample, so a sampling step must score the same rounded value or the first on-policy
//! ratio is not 1. [`StorageDtype::round_trip`] simulates that storage: value -> storage dtype ->
//! compute dtype, rounding to nearest-even exactly like a framework cast
//! ([`fused_ops::round_through`]). It runs on the host (`TensorData` conversion), or for `f32`
//! to `bf16` on the CPU backend in one pass of the same bits, so its bits are identical on
//! every backend, including backends that have no `bf16` kernels (wgpu).

use burn::tensor::{DType, FloatDType, Tensor, backend::Backend};

use crate::SdeError;

/// The precision a trajectory tensor is stored at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StorageDtype {
    /// Stored at the compute dtype: no rounding.
    Native,
    /// IEEE binary32.
    F32,
    /// bfloat16 (8 exponent bits, 8 significant bits).
    Bf16,
    /// IEEE binary16.
    F16,
}

impl StorageDtype {
    /// The burn dtype, or `None` for [`StorageDtype::Native`].
    pub fn dtype(self) -> Option<DType> {
        match self {
            StorageDtype::Native => None,
            StorageDtype::F32 => Some(DType::F32),
            StorageDtype::Bf16 => Some(DType::BF16),
            StorageDtype::F16 => Some(DType::F16),
        }
    }

    /// Rounds `t` to this precision and back to `t`'s dtype (round to nearest, ties to even).
    ///
    /// The result is a fresh tensor on `t`'s device with no autodiff history: use it on samples,
    /// which are never differentiated. Identity for `Native`, and for `F32` on `f32` tensors.
    ///
    /// ```
    /// use burn::backend::Flex;
    /// use burn::tensor::Tensor;
    /// use sde_math::StorageDtype;
    /// let dev = Default::default();
    /// // 1 + 2^-9 is not representable in bf16 (8 significant bits): rounds to 1.
    /// let t = Tensor::<Flex, 1>::from_floats([1.0 + 1.0 / 512.0, 3.0], &dev);
    /// let r = StorageDtype::Bf16.round_trip(t).into_data().to_vec::<f32>().unwrap();
    /// assert_eq!(r, vec![1.0, 3.0]);
    /// ```
    pub fn round_trip<B: Backend, const D: usize>(self, t: Tensor<B, D>) -> Tensor<B, D> {
        let Some(storage) = self.dtype() else {
            return t;
        };
        let compute = t.dtype();
        if compute == storage {
            return t;
        }
        fused_ops::round_through(t, storage)
    }
}

/// Brings a tensor to the compute dtype: `f16`/`bf16` are upcast to `f32`; `f32` and `f64` stay.
pub(crate) fn to_compute<B: Backend, const D: usize>(
    t: Tensor<B, D>,
    what: &'static str,
) -> Result<Tensor<B, D>, SdeError> {
    match t.dtype() {
        DType::F32 | DType::F64 | DType::Flex32 => Ok(t),
        DType::F16 | DType::BF16 => Ok(t.cast(FloatDType::F32)),
        other => Err(SdeError::UnsupportedDtype {
            what,
            dtype: format!("{other:?}"),
        }),
    }
}
