//! Decoded images as scorers see them: 8-bit RGB, and the one conversion from the generator's
//! float output to 8 bits.
//!
//! Every reference scorer (DDPO, Flow-GRPO, PickScore's users) receives decoded images as
//! floats in `[0, 1]` and turns them into bytes with `(x * 255).round().clamp(0, 255)` before
//! any preprocessing; [`quantize_unit`] is that expression (`f32` multiply, round half to even
//! as `torch.round` does, clamp).

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::error::RewardError;

/// An 8-bit RGB image, rows top to bottom, pixels interleaved (`[R, G, B, R, G, B, ...]`,
/// i.e. `[H, W, 3]` row-major, the layout of `numpy.asarray(PIL.Image)`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RgbImage {
    width: usize,
    height: usize,
    data: Vec<u8>,
}

/// `(x * 255).round().clamp(0, 255)` as a byte: the `f32` product, rounded half to even
/// (`torch.round`), clamped. `x` must be finite.
///
/// ```
/// use reward::quantize_unit;
/// assert_eq!(quantize_unit(0.0), 0);
/// assert_eq!(quantize_unit(1.0), 255);
/// assert_eq!(quantize_unit(1.5), 255);
/// assert_eq!(quantize_unit(-0.2), 0);
/// assert_eq!(quantize_unit(0.5), 128); // 127.5 rounds half to even
/// assert_eq!(quantize_unit(2.5 / 255.0), 2); // 2.5 rounds half to even
/// ```
pub fn quantize_unit(x: f32) -> u8 {
    (x * 255.0).round_ties_even().clamp(0.0, 255.0) as u8
}

impl RgbImage {
    /// An image from interleaved RGB bytes; `data.len()` must be `width * height * 3` and
    /// both sides positive.
    pub fn new(width: usize, height: usize, data: Vec<u8>) -> Result<Self, RewardError> {
        let expected = width * height * 3;
        if width == 0 || height == 0 || data.len() != expected {
            return Err(RewardError::ImageSize {
                index: 0,
                width,
                height,
                expected,
                found: data.len(),
            });
        }
        Ok(Self {
            width,
            height,
            data,
        })
    }

    /// An image whose pixel `(x, y)` is `f(x, y)`. Panics if a side is zero.
    pub fn from_fn(
        width: usize,
        height: usize,
        mut f: impl FnMut(usize, usize) -> [u8; 3],
    ) -> Self {
        assert!(width > 0 && height > 0, "image sides must be positive");
        let mut data = Vec::with_capacity(width * height * 3);
        for y in 0..height {
            for x in 0..width {
                data.extend_from_slice(&f(x, y));
            }
        }
        Self {
            width,
            height,
            data,
        }
    }

    /// A uniform image. Panics if a side is zero.
    pub fn filled(width: usize, height: usize, rgb: [u8; 3]) -> Self {
        Self::from_fn(width, height, |_, _| rgb)
    }

    /// An image from channel-first floats in `[0, 1]` (`[3, H, W]` row-major, the layout of a
    /// decoded image tensor), each value mapped by [`quantize_unit`]. A NaN or infinity is an
    /// error (it has no byte value).
    pub fn from_unit_chw(width: usize, height: usize, values: &[f32]) -> Result<Self, RewardError> {
        let plane = width * height;
        if width == 0 || height == 0 || values.len() != 3 * plane {
            return Err(RewardError::ImageSize {
                index: 0,
                width,
                height,
                expected: 3 * plane,
                found: values.len(),
            });
        }
        if let Some((element, value)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(RewardError::NonFiniteImage {
                index: 0,
                element,
                value: *value,
            });
        }
        let mut data = vec![0u8; 3 * plane];
        for c in 0..3 {
            for i in 0..plane {
                data[i * 3 + c] = quantize_unit(values[c * plane + i]);
            }
        }
        Ok(Self {
            width,
            height,
            data,
        })
    }

    /// A batch of images from a decoded-image tensor `[batch, 3, H, W]` with values in
    /// `[0, 1]` (read back to the host once), each value mapped by [`quantize_unit`].
    ///
    /// # Errors
    /// [`RewardError::ImageChannels`] naming the shape when the tensor does not have 3
    /// channels; [`RewardError::ImageSize`] naming the image index when a side is 0;
    /// [`RewardError::NonFiniteImage`] naming the image index of a NaN or an infinity.
    pub fn batch_from_tensor<B: Backend>(images: Tensor<B, 4>) -> Result<Vec<Self>, RewardError> {
        let [b, c, h, w] = images.dims();
        if c != 3 {
            return Err(RewardError::ImageChannels {
                channels: c,
                shape: [b, c, h, w],
            });
        }
        let values: Vec<f32> = images
            .into_data()
            .convert::<f32>()
            .to_vec()
            .expect("f32 data after conversion");
        let per = 3 * h * w;
        (0..b)
            .map(|i| {
                Self::from_unit_chw(w, h, &values[i * per..(i + 1) * per]).map_err(|e| match e {
                    RewardError::NonFiniteImage { element, value, .. } => {
                        RewardError::NonFiniteImage {
                            index: i,
                            element,
                            value,
                        }
                    }
                    RewardError::ImageSize {
                        width,
                        height,
                        expected,
                        found,
                        ..
                    } => RewardError::ImageSize {
                        index: i,
                        width,
                        height,
                        expected,
                        found,
                    },
                    other => other,
                })
            })
            .collect()
    }

    /// Width in pixels.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Height in pixels.
    pub fn height(&self) -> usize {
        self.height
    }

    /// The interleaved RGB bytes, `width * height * 3` of them.
    pub fn as_bytes(&self) -> &[u8] {
        &self.data
    }

    /// The pixel at `(x, y)`. Panics outside the image.
    pub fn pixel(&self, x: usize, y: usize) -> [u8; 3] {
        assert!(
            x < self.width && y < self.height,
            "pixel ({x}, {y}) outside {}x{}",
            self.width,
            self.height
        );
        let i = (y * self.width + x) * 3;
        [self.data[i], self.data[i + 1], self.data[i + 2]]
    }

    /// Sets the pixel at `(x, y)`. Panics outside the image.
    pub fn set_pixel(&mut self, x: usize, y: usize, rgb: [u8; 3]) {
        assert!(
            x < self.width && y < self.height,
            "pixel ({x}, {y}) outside {}x{}",
            self.width,
            self.height
        );
        let i = (y * self.width + x) * 3;
        self.data[i..i + 3].copy_from_slice(&rgb);
    }

    /// The image as PNG bytes (8-bit RGB, default compression).
    pub fn to_png(&self) -> Result<Vec<u8>, RewardError> {
        let mut out = Vec::new();
        {
            let mut enc = png::Encoder::new(&mut out, self.width as u32, self.height as u32);
            enc.set_color(png::ColorType::Rgb);
            enc.set_depth(png::BitDepth::Eight);
            let mut w = enc
                .write_header()
                .map_err(|source| RewardError::Png { source })?;
            w.write_image_data(&self.data)
                .map_err(|source| RewardError::Png { source })?;
            w.finish().map_err(|source| RewardError::Png { source })?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::tensor::{Tensor, TensorData};

    use super::*;

    #[test]
    fn batch_from_tensor_refuses_a_tensor_without_three_channels() {
        let device = Default::default();
        let four = Tensor::<Flex, 4>::zeros([2, 4, 2, 3], &device);
        let err = RgbImage::batch_from_tensor(four).unwrap_err();
        assert!(
            matches!(
                err,
                RewardError::ImageChannels {
                    channels: 4,
                    shape: [2, 4, 2, 3]
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("[2, 4, 2, 3]"), "{err}");
        let three = Tensor::<Flex, 4>::ones([2, 3, 2, 3], &device);
        let images = RgbImage::batch_from_tensor(three).unwrap();
        assert_eq!(images.len(), 2);
        assert_eq!((images[1].width(), images[1].height()), (3, 2));
        assert_eq!(images[1].pixel(2, 1), [255, 255, 255]);
    }

    #[test]
    fn batch_from_tensor_names_the_image_that_fails() {
        let device = Default::default();
        let mut v = vec![0.5f32; 2 * 3 * 2 * 2];
        v[12 + 5] = f32::NAN; // image 1, element 5
        let t = Tensor::<Flex, 4>::from_data(TensorData::new(v, [2, 3, 2, 2]), &device);
        let err = RgbImage::batch_from_tensor(t).unwrap_err();
        assert!(
            matches!(
                err,
                RewardError::NonFiniteImage {
                    index: 1,
                    element: 5,
                    ..
                }
            ),
            "{err}"
        );
        let empty = Tensor::<Flex, 4>::zeros([2, 3, 0, 2], &device);
        let err = RgbImage::batch_from_tensor(empty).unwrap_err();
        assert!(
            matches!(
                err,
                RewardError::ImageSize {
                    index: 0,
                    height: 0,
                    ..
                }
            ),
            "{err}"
        );
    }
}
