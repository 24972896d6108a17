//! Qwen-Image's 2×2 latent packing (`QwenImagePipeline._pack_latents` / `_unpack_latents`):
//! the transformer sees `[batch, (h/2)·(w/2), 4·channels]` tokens, the VAE `[batch, channels,
//! h, w]` latents.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::error::QwenImageError;

/// The latent sides of an image of `height` × `width` pixels: `2 · ⌊side / (2 · scale)⌋` each
/// (diffusers rounds down to whole 2×2 patches).
pub fn latent_size(height: usize, width: usize, vae_scale_factor: usize) -> (usize, usize) {
    let side = |s: usize| 2 * (s / (2 * vae_scale_factor));
    (side(height), side(width))
}

/// `[batch, c, h, w]` latents to `[batch, (h/2)·(w/2), 4c]` tokens; each token holds one 2×2
/// patch, channel-major (`c, dy, dx`).
///
/// # Errors
/// [`QwenImageError::Input`] when a side is odd.
pub fn pack_latents<B: Backend>(latents: Tensor<B, 4>) -> Result<Tensor<B, 3>, QwenImageError> {
    let [b, c, h, w] = latents.dims();
    if !h.is_multiple_of(2) || !w.is_multiple_of(2) {
        return Err(QwenImageError::input(
            "latents",
            format!("{h}x{w}: both sides must be even to pack 2x2 patches"),
        ));
    }
    Ok(latents
        .reshape([b, c, h / 2, 2, w / 2, 2])
        .permute([0, 2, 4, 1, 3, 5])
        .reshape([b, (h / 2) * (w / 2), c * 4]))
}

/// The inverse of [`pack_latents`] for latents of `h` × `w` positions.
///
/// # Errors
/// [`QwenImageError::Input`] when the token count or width does not fit `h` × `w`.
pub fn unpack_latents<B: Backend>(
    tokens: Tensor<B, 3>,
    h: usize,
    w: usize,
) -> Result<Tensor<B, 4>, QwenImageError> {
    let [b, n, cc] = tokens.dims();
    if !h.is_multiple_of(2)
        || !w.is_multiple_of(2)
        || n != (h / 2) * (w / 2)
        || !cc.is_multiple_of(4)
    {
        return Err(QwenImageError::input(
            "packed latents",
            format!(
                "{n} tokens of {cc} channels do not unpack to {h}x{w} latents (expected (h/2)*(w/2) tokens of 4*channels)"
            ),
        ));
    }
    let c = cc / 4;
    Ok(tokens
        .reshape([b, h / 2, w / 2, c, 2, 2])
        .permute([0, 3, 1, 4, 2, 5])
        .reshape([b, c, h, w]))
}
