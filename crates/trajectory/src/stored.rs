//! Float tensors held at their storage precision, bit for bit.

use burn::tensor::{Tensor, TensorData, backend::Backend};
use half::{bf16, f16};
use sde_math::StorageDtype;

use crate::TrajectoryError;

/// A float tensor held as the exact little-endian bits of its storage precision
/// (`f32`, `bf16` or `f16`, row-major).
///
/// This is what a sidecar stores and what it reads back: equality is equality of bits, so a
/// write → read round trip can be checked bit-exactly. Values enter through
/// [`StoredTensor::from_f32`], which refuses anything the precision cannot hold exactly (the
/// sampler must have rounded with [`StorageDtype::round_trip`] before scoring, so that replay
/// scores exactly the value the sampler scored) and anything non-finite.
///
/// ```
/// use sde_math::StorageDtype;
/// use trajectory::StoredTensor;
/// // bf16 has 8 significant bits: 1 + 2^-7 is a bf16 value, 1 + 2^-8 is not
/// let t = StoredTensor::from_f32("x", &[1.0 + 1.0 / 128.0, -2.5], vec![2], StorageDtype::Bf16).unwrap();
/// assert_eq!(t.to_f32(), vec![1.0 + 1.0 / 128.0, -2.5]);
/// assert_eq!(t.bytes().len(), 4);
/// assert!(StoredTensor::from_f32("x", &[1.0 + 1.0 / 256.0], vec![1], StorageDtype::Bf16).is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredTensor {
    storage: StorageDtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

/// Bytes per element of an on-disk precision.
///
/// # Errors
/// [`TrajectoryError::NativeStorage`] for [`StorageDtype::Native`].
pub(crate) fn element_size(storage: StorageDtype, what: &str) -> Result<usize, TrajectoryError> {
    match storage {
        StorageDtype::F32 => Ok(4),
        StorageDtype::Bf16 | StorageDtype::F16 => Ok(2),
        StorageDtype::Native => Err(TrajectoryError::NativeStorage {
            what: what.to_string(),
        }),
    }
}

impl StoredTensor {
    /// Stores `values` (row-major, `shape`) at `storage`.
    ///
    /// `what` names the tensor in error messages.
    ///
    /// # Errors
    /// [`TrajectoryError::NativeStorage`], [`TrajectoryError::ByteLength`] when `values` does
    /// not fill `shape`, [`TrajectoryError::NonFinite`], and
    /// [`TrajectoryError::NotRepresentable`] when a value would be rounded.
    pub fn from_f32(
        what: &str,
        values: &[f32],
        shape: Vec<usize>,
        storage: StorageDtype,
    ) -> Result<Self, TrajectoryError> {
        let size = element_size(storage, what)?;
        let n: usize = shape.iter().product();
        if values.len() != n {
            return Err(TrajectoryError::ByteLength {
                what: what.to_string(),
                len: values.len() * size,
                shape,
                storage,
                expected: n * size,
            });
        }
        let mut bytes = Vec::with_capacity(n * size);
        for (index, &value) in values.iter().enumerate() {
            if !value.is_finite() {
                return Err(TrajectoryError::NonFinite {
                    what: what.to_string(),
                    index,
                    value,
                });
            }
            let exact = match storage {
                StorageDtype::F32 => {
                    bytes.extend_from_slice(&value.to_le_bytes());
                    true
                }
                StorageDtype::Bf16 => {
                    let h = bf16::from_f32(value);
                    bytes.extend_from_slice(&h.to_bits().to_le_bytes());
                    h.to_f32().to_bits() == value.to_bits()
                }
                StorageDtype::F16 => {
                    let h = f16::from_f32(value);
                    bytes.extend_from_slice(&h.to_bits().to_le_bytes());
                    h.to_f32().to_bits() == value.to_bits()
                }
                StorageDtype::Native => unreachable!("rejected by element_size"),
            };
            if !exact {
                return Err(TrajectoryError::NotRepresentable {
                    what: what.to_string(),
                    index,
                    value,
                    storage,
                });
            }
        }
        Ok(Self {
            storage,
            shape,
            bytes,
        })
    }

    /// Wraps raw little-endian bits of `storage` (as read from a file).
    ///
    /// # Errors
    /// [`TrajectoryError::NativeStorage`], [`TrajectoryError::ByteLength`] when the length does
    /// not match the shape, [`TrajectoryError::NonFinite`] for a NaN or infinite element.
    pub fn from_bytes(
        what: &str,
        bytes: Vec<u8>,
        shape: Vec<usize>,
        storage: StorageDtype,
    ) -> Result<Self, TrajectoryError> {
        let size = element_size(storage, what)?;
        let n: usize = shape.iter().product();
        if bytes.len() != n * size {
            return Err(TrajectoryError::ByteLength {
                what: what.to_string(),
                len: bytes.len(),
                shape,
                storage,
                expected: n * size,
            });
        }
        let t = Self {
            storage,
            shape,
            bytes,
        };
        if let Some((index, value)) = t.first_non_finite() {
            return Err(TrajectoryError::NonFinite {
                what: what.to_string(),
                index,
                value,
            });
        }
        Ok(t)
    }

    /// Reads a burn tensor's data: `f32` data is checked for exact representability at
    /// `storage`; `bf16`/`f16` data whose dtype matches `storage` is taken bit for bit.
    ///
    /// # Errors
    /// As [`StoredTensor::from_f32`]; other source dtypes are converted to `f32` first.
    pub fn from_tensor_data(
        what: &str,
        data: TensorData,
        storage: StorageDtype,
    ) -> Result<Self, TrajectoryError> {
        let shape = data.shape.to_vec();
        let same = matches!(
            (data.dtype, storage),
            (burn::tensor::DType::BF16, StorageDtype::Bf16)
                | (burn::tensor::DType::F16, StorageDtype::F16)
        );
        if same {
            return Self::from_bytes(what, data.into_bytes().to_vec(), shape, storage);
        }
        let values = data
            .convert::<f32>()
            .into_vec::<f32>()
            .expect("TensorData::convert::<f32> yields f32 data");
        Self::from_f32(what, &values, shape, storage)
    }

    /// The storage precision.
    pub fn storage(&self) -> StorageDtype {
        self.storage
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The number of elements.
    pub fn num_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// The raw little-endian bits.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Every element widened to `f32` (exact: `bf16` and `f16` are subsets of `f32`).
    pub fn to_f32(&self) -> Vec<f32> {
        self.range_f32(0, self.num_elements())
    }

    /// Elements `start .. start + len` (flat, row-major) widened to `f32`.
    ///
    /// # Panics
    /// When the range exceeds the tensor (a programming error).
    pub fn range_f32(&self, start: usize, len: usize) -> Vec<f32> {
        assert!(
            start + len <= self.num_elements(),
            "element range {start}..{} exceeds a tensor of {} elements",
            start + len,
            self.num_elements()
        );
        match self.storage {
            StorageDtype::F32 => self.bytes[start * 4..(start + len) * 4]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            StorageDtype::Bf16 => self.bytes[start * 2..(start + len) * 2]
                .chunks_exact(2)
                .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
            StorageDtype::F16 => self.bytes[start * 2..(start + len) * 2]
                .chunks_exact(2)
                .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
            StorageDtype::Native => unreachable!("a StoredTensor is never Native"),
        }
    }

    /// The data as an `f32` [`TensorData`] of this shape (widened exactly).
    pub fn to_tensor_data(&self) -> TensorData {
        TensorData::new(self.to_f32(), self.shape.clone())
    }

    /// The data as a burn tensor on `device`, in the backend's float type (widened exactly from
    /// the storage precision).
    ///
    /// # Errors
    /// [`TrajectoryError::Rank`] when `D` is not the stored rank.
    pub fn to_tensor<B: Backend, const D: usize>(
        &self,
        what: &str,
        device: &B::Device,
    ) -> Result<Tensor<B, D>, TrajectoryError> {
        if self.shape.len() != D {
            return Err(TrajectoryError::Rank {
                what: what.to_string(),
                asked: D,
                shape: self.shape.clone(),
                rank: self.shape.len(),
            });
        }
        Ok(Tensor::from_data(self.to_tensor_data(), device))
    }

    /// The first NaN or infinite element, checked on the bits (all-ones exponent).
    fn first_non_finite(&self) -> Option<(usize, f32)> {
        let index = match self.storage {
            StorageDtype::F32 => self.bytes.chunks_exact(4).position(|c| {
                u32::from_le_bytes([c[0], c[1], c[2], c[3]]) & 0x7F80_0000 == 0x7F80_0000
            }),
            StorageDtype::Bf16 => self
                .bytes
                .chunks_exact(2)
                .position(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7F80 == 0x7F80),
            StorageDtype::F16 => self
                .bytes
                .chunks_exact(2)
                .position(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7C00 == 0x7C00),
            StorageDtype::Native => unreachable!("a StoredTensor is never Native"),
        }?;
        Some((index, self.range_f32(index, 1)[0]))
    }
}
