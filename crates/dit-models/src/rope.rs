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

/// Makes a table `[seq, head_dim]` ready to multiply `[batch, seq, heads, head_dim]`
/// activations, once per forward: written out to that shape when it is small
/// ([`crate::layers::write_out`]), otherwise `[1, seq, 1, head_dim]` (a broadcast).
///
/// The numbers are the same either way; burn's CPU backend walks a table broadcast over the
/// batch and head axes element by element, which made RoPE a tenth of a small model's forward.
pub fn expand_rope_table<B: Backend>(
    table: Tensor<B, 2>,
    batch: usize,
    heads: usize,
) -> Tensor<B, 4> {
    let [s, d] = table.dims();
    let table = table.reshape([1, s, 1, d]);
    if crate::layers::write_out([batch, s, heads, d]) {
        table.repeat_dim(2, heads).repeat_dim(0, batch)
    } else {
        table
    }
}

/// Rotates `x: [batch, seq, heads, head_dim]` by the tables `cos`, `sin` from
/// [`RopeTables::to_tensors`] and [`expand_rope_table`] (`[batch, seq, heads, head_dim]` or
/// `[1, seq, 1, head_dim]`) (diffusers `apply_rotary_emb_qwen(..., use_real=False)`):
/// `out[2p] = x[2p] cos - x[2p+1] sin`, `out[2p+1] = x[2p] sin + x[2p+1] cos`.
pub fn apply_rope<B: Backend>(
    x: Tensor<B, 4>,
    cos: &Tensor<B, 4>,
    sin: &Tensor<B, 4>,
) -> Tensor<B, 4> {
    let [b, s, h, d] = x.dims();
    for t in [cos, sin] {
        assert!(
            t.dims() == [b, s, h, d] || t.dims() == [1, s, 1, d],
            "RoPE table {:?} fits neither [batch, seq, heads, head_dim] = {:?} nor [1, seq, 1, head_dim]",
            t.dims(),
            [b, s, h, d]
        );
    }
    let swapped = x
        .clone()
        .reshape([b, s, h, d / 2, 2])
        .flip([4])
        .reshape([b, s, h, d]);
    x * cos.clone() + swapped * sin.clone()
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::tensor::{DType, Distribution, Tensor};

    use super::{ImageShape, apply_rope, expand_rope_table, rope_tables};

    /// The written-out tables and the broadcast ones rotate to the same bits.
    #[test]
    fn written_out_and_broadcast_tables_agree() {
        let dev = Default::default();
        let (b, h, d) = (3, 2, 8);
        let t = rope_tables([2, 2, 4], &[ImageShape::new(1, 4, 4)], 5);
        let (cos, sin) = t.to_tensors::<Flex>(&dev, DType::F32);
        let s = cos.dims()[0];
        let x = Tensor::<Flex, 4>::random([b, s, h, d], Distribution::Normal(0.0, 1.0), &dev);
        let (cos_w, sin_w) = (
            expand_rope_table(cos.clone(), b, h),
            expand_rope_table(sin.clone(), b, h),
        );
        assert_eq!(cos_w.dims(), [b, s, h, d]);
        let (cos_b, sin_b) = (cos.reshape([1, s, 1, d]), sin.reshape([1, s, 1, d]));
        let written = apply_rope(x.clone(), &cos_w, &sin_w).into_data();
        let broadcast = apply_rope(x, &cos_b, &sin_b).into_data();
        assert_eq!(written, broadcast);
    }
}
