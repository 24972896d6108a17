//! Host-side conversion of stored tensor bytes (little-endian, row-major) to float values, and
//! the one layout helper every PyTorch-to-burn loader needs ([`transpose`]).

use half::{bf16, f16};
use safetensors::Dtype;

/// A float dtype a tensor can be read as ([`crate::Checkpoint::read_as`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FloatDtype {
    /// 64-bit IEEE float.
    F64,
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16.
    BF16,
}

impl FloatDtype {
    /// The float dtype of a stored safetensors dtype; `None` for integers, bool and fp8/fp4.
    pub fn of(dtype: Dtype) -> Option<Self> {
        Some(match dtype {
            Dtype::F64 => FloatDtype::F64,
            Dtype::F32 => FloatDtype::F32,
            Dtype::F16 => FloatDtype::F16,
            Dtype::BF16 => FloatDtype::BF16,
            _ => return None,
        })
    }

    /// The safetensors dtype.
    pub fn safetensors(self) -> Dtype {
        match self {
            FloatDtype::F64 => Dtype::F64,
            FloatDtype::F32 => Dtype::F32,
            FloatDtype::F16 => Dtype::F16,
            FloatDtype::BF16 => Dtype::BF16,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            FloatDtype::F64 => 8,
            FloatDtype::F32 => 4,
            FloatDtype::F16 | FloatDtype::BF16 => 2,
        }
    }
}

/// One tensor's values on the host, in one float dtype (row-major, in the stored shape).
#[derive(Clone, Debug, PartialEq)]
pub enum FloatValues {
    /// `f64` values.
    F64(Vec<f64>),
    /// `f32` values.
    F32(Vec<f32>),
    /// `f16` values.
    F16(Vec<f16>),
    /// `bf16` values.
    BF16(Vec<bf16>),
}

impl FloatValues {
    /// The dtype of the values.
    pub fn dtype(&self) -> FloatDtype {
        match self {
            FloatValues::F64(_) => FloatDtype::F64,
            FloatValues::F32(_) => FloatDtype::F32,
            FloatValues::F16(_) => FloatDtype::F16,
            FloatValues::BF16(_) => FloatDtype::BF16,
        }
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            FloatValues::F64(v) => v.len(),
            FloatValues::F32(v) => v.len(),
            FloatValues::F16(v) => v.len(),
            FloatValues::BF16(v) => v.len(),
        }
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn words<const N: usize>(bytes: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    bytes
        .chunks_exact(N)
        .map(|c| c.try_into().expect("chunks_exact"))
}

/// Stored bytes as `f32`: f32 as is, f16 and bf16 widened (exact), f64 rounded to nearest.
/// `None` for a dtype that is not a float.
pub fn decode_f32(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::F32 => words::<4>(bytes).map(f32::from_le_bytes).collect(),
        Dtype::BF16 => words::<2>(bytes)
            .map(|w| bf16::from_bits(u16::from_le_bytes(w)).to_f32())
            .collect(),
        Dtype::F16 => words::<2>(bytes)
            .map(|w| f16::from_bits(u16::from_le_bytes(w)).to_f32())
            .collect(),
        Dtype::F64 => words::<8>(bytes)
            .map(|w| f64::from_le_bytes(w) as f32)
            .collect(),
        _ => return None,
    })
}

/// Stored bytes as `f64` (every float dtype widened exactly). `None` for a dtype that is not a
/// float.
pub fn decode_f64(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f64>> {
    Some(match dtype {
        Dtype::F64 => words::<8>(bytes).map(f64::from_le_bytes).collect(),
        Dtype::F32 => words::<4>(bytes)
            .map(|w| f64::from(f32::from_le_bytes(w)))
            .collect(),
        Dtype::BF16 => words::<2>(bytes)
            .map(|w| bf16::from_bits(u16::from_le_bytes(w)).to_f64())
            .collect(),
        Dtype::F16 => words::<2>(bytes)
            .map(|w| f16::from_bits(u16::from_le_bytes(w)).to_f64())
            .collect(),
        _ => return None,
    })
}

/// Stored bytes as values of `target`.
///
/// The same dtype is copied bit for bit; `F64` and `F32` targets are [`decode_f64`] and
/// [`decode_f32`]; a half-precision target from another dtype goes through [`decode_f32`] and
/// rounds to nearest even (so an `f64` tensor is rounded twice, as a loader that reads `f32`
/// first does). `None` for a stored dtype that is not a float.
pub fn decode(dtype: Dtype, bytes: &[u8], target: FloatDtype) -> Option<FloatValues> {
    let stored = FloatDtype::of(dtype)?;
    Some(match target {
        FloatDtype::F64 => FloatValues::F64(decode_f64(dtype, bytes)?),
        FloatDtype::F32 => FloatValues::F32(decode_f32(dtype, bytes)?),
        FloatDtype::F16 if stored == FloatDtype::F16 => FloatValues::F16(
            words::<2>(bytes)
                .map(|w| f16::from_bits(u16::from_le_bytes(w)))
                .collect(),
        ),
        FloatDtype::BF16 if stored == FloatDtype::BF16 => FloatValues::BF16(
            words::<2>(bytes)
                .map(|w| bf16::from_bits(u16::from_le_bytes(w)))
                .collect(),
        ),
        FloatDtype::F16 => FloatValues::F16(
            decode_f32(dtype, bytes)?
                .into_iter()
                .map(f16::from_f32)
                .collect(),
        ),
        FloatDtype::BF16 => FloatValues::BF16(
            decode_f32(dtype, bytes)?
                .into_iter()
                .map(bf16::from_f32)
                .collect(),
        ),
    })
}

/// Row-major `[rows, cols]` to `[cols, rows]` (PyTorch's `[out, in]` linear weight to burn's
/// `[in, out]`, and back).
///
/// ```
/// let t = model_weights::transpose(&[1, 2, 3, 4, 5, 6], 2, 3);
/// assert_eq!(t, [1, 4, 2, 5, 3, 6]);
/// ```
///
/// # Panics
/// When `values.len() != rows * cols`.
pub fn transpose<T: Copy + Default>(values: &[T], rows: usize, cols: usize) -> Vec<T> {
    assert_eq!(
        values.len(),
        rows * cols,
        "transpose of {} values as [{rows}, {cols}]",
        values.len()
    );
    let mut out = vec![T::default(); values.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = values[r * cols + c];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
        v.iter().flat_map(|x| f(*x)).collect()
    }

    #[test]
    fn every_float_dtype_decodes_and_converts() {
        let vals = [1.0f32, -2.5, 0.1, 65504.0, 1e-3];
        let f32b = le(&vals, f32::to_le_bytes);
        let f64b = le(&vals.map(f64::from), f64::to_le_bytes);
        let bf = vals.map(bf16::from_f32);
        let bfb = le(&bf, bf16::to_le_bytes);
        let h = vals.map(f16::from_f32);
        let hb = le(&h, f16::to_le_bytes);
        assert_eq!(decode_f32(Dtype::F32, &f32b).unwrap(), vals);
        assert_eq!(decode_f32(Dtype::F64, &f64b).unwrap(), vals);
        assert_eq!(decode_f32(Dtype::BF16, &bfb).unwrap(), bf.map(bf16::to_f32));
        assert_eq!(decode_f32(Dtype::F16, &hb).unwrap(), h.map(f16::to_f32));
        assert_eq!(decode_f64(Dtype::F32, &f32b).unwrap(), vals.map(f64::from));
        assert_eq!(decode_f64(Dtype::BF16, &bfb).unwrap(), bf.map(bf16::to_f64));
        // to half precision: rounded once from f32, copied when already stored so
        assert_eq!(
            decode(Dtype::F32, &f32b, FloatDtype::BF16),
            Some(FloatValues::BF16(bf.to_vec()))
        );
        assert_eq!(
            decode(Dtype::BF16, &bfb, FloatDtype::BF16),
            Some(FloatValues::BF16(bf.to_vec()))
        );
        assert_eq!(
            decode(Dtype::F32, &f32b, FloatDtype::F16),
            Some(FloatValues::F16(h.to_vec()))
        );
        assert_eq!(
            decode(Dtype::F16, &hb, FloatDtype::F16),
            Some(FloatValues::F16(h.to_vec()))
        );
        // integers are not floats
        assert_eq!(decode_f32(Dtype::I64, &[0; 8]), None);
        assert_eq!(decode(Dtype::U8, &[0], FloatDtype::F32), None);
        assert_eq!(FloatDtype::of(Dtype::BOOL), None);
        for d in [
            FloatDtype::F64,
            FloatDtype::F32,
            FloatDtype::F16,
            FloatDtype::BF16,
        ] {
            assert_eq!(FloatDtype::of(d.safetensors()), Some(d));
            assert_eq!(d.size(), d.safetensors().bitsize() / 8);
        }
    }

    #[test]
    fn transpose_round_trips() {
        let v: Vec<f32> = (0..12).map(|x| x as f32).collect();
        let t = transpose(&v, 3, 4);
        assert_eq!(t[..4], [0.0, 4.0, 8.0, 1.0]);
        assert_eq!(transpose(&t, 4, 3), v);
    }
}
