//! Qwen-Image's 3-axis rotary position embedding, built from host-computed cos/sin tables
//! (burn has no complex dtype; diffusers multiplies by `torch.polar` complex numbers).
//!
//! Every head dimension `D = d_frame + d_height + d_width` (`axes_dims_rope`) is split into
//! `D / 2` interleaved pairs `(x[2p], x[2p+1])`; the first `d_frame / 2` pairs rotate with the
//! frame position, the next `d_height / 2` with the row, the last `d_width / 2` with the
//! column. Pair `k` of an axis of dimension `d` has frequency `theta^(-2k/d)`, `theta = 10000`.
//!
//! Positions (diffusers `QwenEmbedRope` with `scale_rope=True`):
//! * image `i` of `img_shapes` (frame count `f`, height `h`, width `w` in tokens): frame
//!   `i + t` for `t in 0..f`; rows centred, `-(h - h/2) ..= h/2 - 1`; columns likewise;
//! * text token `j`: position `m + j` on all three axes, with
//!   `m = max over images of max(h/2, w/2)` — the text sits after the image.
//!
//! The angle is computed as diffusers does it, in `f32` (`pos as f32 * inv_freq` with
//! `inv_freq = 1 / theta^(2k/d)` rounded to `f32`); cos and sin are then evaluated in `f64`
//! and rounded once.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};

use crate::config::ROPE_THETA;

/// The grid of one image (or video) in tokens: after patching, `height = H_latent / 2`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ImageShape {
    /// Frames (1 for an image).
    pub frames: usize,
    /// Rows of tokens.
    pub height: usize,
    /// Columns of tokens.
    pub width: usize,
}

impl ImageShape {
    /// `(frames, height, width)`.
    pub fn new(frames: usize, height: usize, width: usize) -> Self {
        Self {
            frames,
            height,
            width,
        }
    }

    /// Number of tokens, `frames * height * width`.
    pub fn tokens(&self) -> usize {
        self.frames * self.height * self.width
    }
}

/// Host cos/sin tables for a joint `[text, image]` sequence, `[seq_len, head_dim]` each,
/// row-major. `cos[s, 2p] = cos[s, 2p+1] = cos(angle)`, `sin[s, 2p] = -sin(angle)`,
/// `sin[s, 2p+1] = +sin(angle)`, so that `rope(x) = x * cos + swap_pairs(x) * sin`.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeTables {
    /// `[seq_len * head_dim]`.
    pub cos: Vec<f32>,
    /// `[seq_len * head_dim]`, signs folded in.
    pub sin: Vec<f32>,
    /// Text tokens followed by image tokens.
    pub seq_len: usize,
    /// Head dimension (sum of the axes' dimensions).
    pub head_dim: usize,
}

fn inv_freqs(dim: usize) -> Vec<f32> {
    (0..dim / 2)
        .map(|k| {
            let e = (2 * k) as f32 / dim as f32;
            let p = ROPE_THETA.powf(e as f64) as f32;
            1.0f32 / p
        })
        .collect()
}

/// Builds the tables for `txt_len` text tokens followed by the tokens of `img_shapes`.
///
/// ```
/// use dit_models::rope::{ImageShape, rope_tables};
///
/// let t = rope_tables([2, 2, 2], &[ImageShape::new(1, 2, 2)], 1);
/// assert_eq!((t.seq_len, t.head_dim), (5, 6));
/// // the text token sits at position max(2/2, 2/2) = 1 on every axis
/// assert!((t.cos[0] - 1f32.cos()).abs() < 1e-7);
/// // the first image token is at (frame 0, row -1, column -1): its frame pair does not rotate
/// assert_eq!((t.cos[6], t.sin[6]), (1.0, 0.0));
/// ```
pub fn rope_tables(axes: [usize; 3], img_shapes: &[ImageShape], txt_len: usize) -> RopeTables {
    let head_dim: usize = axes.iter().sum();
    let freqs: Vec<Vec<f32>> = axes.iter().map(|d| inv_freqs(*d)).collect();
    let img_len: usize = img_shapes.iter().map(ImageShape::tokens).sum();
    let seq_len = txt_len + img_len;
    let mut cos = Vec::with_capacity(seq_len * head_dim);
    let mut sin = Vec::with_capacity(seq_len * head_dim);
    let mut push = |pos: [i64; 3]| {
        for (axis, fs) in freqs.iter().enumerate() {
            for f in fs {
                let angle = (pos[axis] as f32 * f) as f64;
                let (s, c) = (angle.sin() as f32, angle.cos() as f32);
                cos.extend_from_slice(&[c, c]);
                sin.extend_from_slice(&[-s, s]);
            }
        }
    };
    let max_vid = img_shapes
        .iter()
        .map(|s| (s.height / 2).max(s.width / 2))
        .max()
        .unwrap_or(0) as i64;
    for j in 0..txt_len as i64 {
        push([max_vid + j; 3]);
    }
    for (i, s) in img_shapes.iter().enumerate() {
        let (h0, w0) = (
            (s.height - s.height / 2) as i64,
            (s.width - s.width / 2) as i64,
        );
        for t in 0..s.frames as i64 {
            for r in 0..s.height as i64 {
                for c in 0..s.width as i64 {
                    push([i as i64 + t, r - h0, c - w0]);
                }
            }
        }
    }
    RopeTables {
        cos,
        sin,
        seq_len,
        head_dim,
    }
}

impl RopeTables {
    /// The tables as `[seq_len, head_dim]` tensors on `device`, in `dtype` (that of the
    /// activations they multiply).
    pub fn to_tensors<B: Backend>(
        &self,
        device: &B::Device,
        dtype: DType,
    ) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let shape = [self.seq_len, self.head_dim];
        let cos = Tensor::from_data(TensorData::new(self.cos.clone(), shape), (device, dtype));
        let sin = Tensor::from_data(TensorData::new(self.sin.clone(), shape), (device, dtype));
        (cos, sin)
    }
}

/// Rotates `x: [batch, seq, heads, head_dim]` by the tables `cos`, `sin: [seq, head_dim]` from
/// [`RopeTables::to_tensors`] (diffusers `apply_rotary_emb_qwen(..., use_real=False)`):
/// `out[2p] = x[2p] cos - x[2p+1] sin`, `out[2p+1] = x[2p] sin + x[2p+1] cos`.
///
/// [`fused_ops::rope`]: one pass on the CPU backend, whose output is laid out for attention's
/// heads transpose; the broadcast composition elsewhere.
pub fn apply_rope<B: Backend>(
    x: Tensor<B, 4>,
    cos: &Tensor<B, 2>,
    sin: &Tensor<B, 2>,
) -> Tensor<B, 4> {
    fused_ops::rope(x, cos.clone(), sin.clone())
}

#[cfg(test)]
mod tests {
    use burn::backend::{Flex, NdArray};
    use burn::tensor::backend::Backend;
    use burn::tensor::{DType, Tensor, TensorData};

    use super::{ImageShape, apply_rope, rope_tables};

    fn rotated<B: Backend>() -> Vec<f32> {
        let dev = Default::default();
        let t = rope_tables([2, 2, 4], &[ImageShape::new(1, 4, 4)], 5);
        let (cos, sin) = t.to_tensors::<B>(&dev, DType::F32);
        let x: Vec<f32> = (0..3 * 21 * 2 * 8)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let x = Tensor::<B, 4>::from_data(TensorData::new(x, [3, 21, 2, 8]), &dev);
        apply_rope(x, &cos, &sin).into_data().into_vec().unwrap()
    }

    /// The CPU backend's kernel and the generic composition rotate alike.
    #[test]
    fn the_kernel_and_the_composition_rotate_alike() {
        let (flex, nd) = (rotated::<Flex>(), rotated::<NdArray>());
        let worst = flex.iter().zip(&nd).fold(0f32, |w, (a, b)| {
            assert!(!a.is_nan() && !b.is_nan());
            w.max((a - b).abs())
        });
        assert!(worst < 1e-6, "{worst:e}");
    }
}
