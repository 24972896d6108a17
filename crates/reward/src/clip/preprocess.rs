//! CLIP image preprocessing exactly as transformers' `CLIPImageProcessor` with its PIL backend
//! (transformers 5 calls it `CLIPImageProcessorPil`; it is the `CLIPImageProcessor` of
//! transformers 4 that PickScore's reference code ran): shortest side to `shortest_edge` with
//! Pillow's resampling of 8-bit images, center crop, rescale by `1/255`, normalise with the CLIP
//! mean and standard deviation.
//!
//! Pillow's 8-bit resampling (`Resample.c`) is reproduced bit for bit: separable filtering,
//! horizontal pass first; for each output sample the filter support is scaled by the
//! downscaling factor (antialiasing), taps at `(x + xmin - center + 0.5) / filterscale`, weights
//! normalised to sum 1 and converted to fixed point with 22 fractional bits (rounded away from
//! zero), accumulated from `1 << 21` and clipped to `0..=255` after each pass.

use std::path::Path;

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use serde_json::Value;

use crate::error::{ConfigProblem, RewardError};
use crate::image::RgbImage;

/// `OPENAI_CLIP_MEAN` of transformers.
pub const CLIP_MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
/// `OPENAI_CLIP_STD` of transformers.
pub const CLIP_STD: [f32; 3] = [0.268_629_54, 0.261_302_6, 0.275_777_1];

/// File name of a transformers image-processor configuration.
pub const PREPROCESSOR_FILE: &str = "preprocessor_config.json";

/// Keys of a `preprocessor_config.json` accepted with no effect on the pixels, and why.
pub const PROCESSOR_INERT_KEYS: &[(&str, &str)] = &[
    (
        "do_convert_rgb",
        "the images scored are RGB already (no alpha, no palette)",
    ),
    (
        "image_processor_type",
        "names the Python class (checked to be a CLIP one)",
    ),
    (
        "feature_extractor_type",
        "names the Python class (checked to be a CLIP one)",
    ),
    ("processor_class", "names the Python class of the processor"),
    ("device", "where a fast processor computes, not what"),
    ("return_tensors", "the Python tensor type returned"),
    (
        "disable_grouping",
        "how a fast processor batches images of one size, not the pixels",
    ),
    (
        "pad_size",
        "read only when padding, which CLIP does not (do_pad is refused)",
    ),
];

/// The keys [`ClipImageProcessor::from_json`] reads.
const PROCESSOR_KEYS: &[&str] = &[
    "do_resize",
    "do_center_crop",
    "do_rescale",
    "do_normalize",
    "size",
    "crop_size",
    "resample",
    "rescale_factor",
    "image_mean",
    "image_std",
];

/// Lists every key of the processor settings `v` that is not read, not inert and not a fast
/// processor's key at CLIP's own value, and a class name that is not CLIP's.
fn check_processor_keys(v: &Value, problems: &mut Vec<ConfigProblem>) {
    let Some(map) = v.as_object() else {
        return;
    };
    for (key, value) in map {
        let k = key.as_str();
        let clip_class = |value: &Value| value.as_str().is_some_and(|c| c.starts_with("CLIP"));
        let ok = match k {
            "image_processor_type" | "feature_extractor_type" => clip_class(value),
            "default_to_square" => value == &Value::Bool(false),
            "data_format" => value.is_null() || value.as_str() == Some("channels_first"),
            "input_data_format" => value.is_null(),
            "do_pad" => value.is_null() || value == &Value::Bool(false),
            _ => PROCESSOR_KEYS.contains(&k) || PROCESSOR_INERT_KEYS.iter().any(|(i, _)| *i == k),
        };
        if !ok {
            let allowed = match k {
                "image_processor_type" | "feature_extractor_type" => "a CLIP class (\"CLIP…\")",
                "default_to_square" => "false (CLIP resizes the shortest side)",
                "data_format" => "\"channels_first\" or null",
                "input_data_format" => "null (the input layout is inferred)",
                "do_pad" => "false or null (CLIP does not pad)",
                _ => {
                    "no such key: not a CLIP image-processor key that flowrl implements or knows to have no effect"
                }
            };
            problems.push(ConfigProblem::new(k, value, allowed));
        }
    }
}

/// A resampling filter of Pillow (`PIL.Image.Resampling`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resample {
    /// `BILINEAR` (2): the triangle filter, support 1.
    Bilinear,
    /// `BICUBIC` (3): cubic convolution with `a = -0.5`, support 2 (CLIP's).
    Bicubic,
}

impl Resample {
    fn support(self) -> f64 {
        match self {
            Resample::Bilinear => 1.0,
            Resample::Bicubic => 2.0,
        }
    }

    fn filter(self, x: f64) -> f64 {
        let x = x.abs();
        match self {
            Resample::Bilinear => {
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
            Resample::Bicubic => {
                const A: f64 = -0.5;
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
        }
    }
}

const PRECISION_BITS: u32 = 32 - 8 - 2;

/// Per output sample: first input index, tap count, fixed-point weights.
struct Coeffs {
    bounds: Vec<(usize, usize)>,
    weights: Vec<Vec<i32>>,
}

/// Pillow's `precompute_coeffs` followed by `normalize_coeffs_8bpc`.
fn coeffs(in_size: usize, out_size: usize, filter: Resample) -> Coeffs {
    let scale = in_size as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = filter.support() * filterscale;
    let mut bounds = Vec::with_capacity(out_size);
    let mut weights = Vec::with_capacity(out_size);
    for xx in 0..out_size {
        let center = (xx as f64 + 0.5) * scale;
        let ss = 1.0 / filterscale;
        let xmin = ((center - support + 0.5) as i64).max(0) as usize;
        let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
        let n = xmax - xmin;
        let mut k: Vec<f64> = (0..n)
            .map(|x| filter.filter((x as f64 + xmin as f64 - center + 0.5) * ss))
            .collect();
        let ww: f64 = k.iter().sum();
        if ww != 0.0 {
            for v in &mut k {
                *v /= ww;
            }
        }
        let one = (1u64 << PRECISION_BITS) as f64;
        weights.push(
            k.iter()
                .map(|&v| {
                    if v < 0.0 {
                        (-0.5 + v * one) as i32
                    } else {
                        (0.5 + v * one) as i32
                    }
                })
                .collect(),
        );
        bounds.push((xmin, n));
    }
    Coeffs { bounds, weights }
}

fn clip8(acc: i32) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Resizes an RGB image to `width x height` as Pillow's `Image.resize(..., resample)` does for
/// an 8-bit RGB image (no `reducing_gap`).
pub fn resize(image: &RgbImage, width: usize, height: usize, filter: Resample) -> RgbImage {
    assert!(width > 0 && height > 0, "resize to a zero side");
    let (iw, ih) = (image.width(), image.height());
    let mut cur_w = iw;
    let mut data = image.as_bytes().to_vec();
    if width != iw {
        let c = coeffs(iw, width, filter);
        let mut out = vec![0u8; width * ih * 3];
        for y in 0..ih {
            for (x, ((xmin, n), k)) in c.bounds.iter().zip(&c.weights).enumerate() {
                for ch in 0..3 {
                    let mut acc: i32 = 1 << (PRECISION_BITS - 1);
                    for t in 0..*n {
                        acc += data[(y * iw + xmin + t) * 3 + ch] as i32 * k[t];
                    }
                    out[(y * width + x) * 3 + ch] = clip8(acc);
                }
            }
        }
        data = out;
        cur_w = width;
    }
    if height != ih {
        let c = coeffs(ih, height, filter);
        let mut out = vec![0u8; cur_w * height * 3];
        for (y, ((ymin, n), k)) in c.bounds.iter().zip(&c.weights).enumerate() {
            for x in 0..cur_w {
                for ch in 0..3 {
                    let mut acc: i32 = 1 << (PRECISION_BITS - 1);
                    for t in 0..*n {
                        acc += data[((ymin + t) * cur_w + x) * 3 + ch] as i32 * k[t];
                    }
                    out[(y * cur_w + x) * 3 + ch] = clip8(acc);
                }
            }
        }
        data = out;
    }
    RgbImage::new(width, height, data).expect("sizes are consistent")
}

/// The image processor of a CLIP model directory (transformers' `CLIPImageProcessor`
/// settings, PIL backend).
///
/// ```
/// use reward::RgbImage;
/// use reward::clip::ClipImageProcessor;
///
/// let p = ClipImageProcessor::default();
/// let image = RgbImage::from_fn(300, 200, |x, y| [(x % 256) as u8, (y % 256) as u8, 128]);
/// let crop = p.resize_and_crop(&image);
/// assert_eq!((crop.width(), crop.height()), (224, 224)); // 200 -> 224, then the center
/// let v = p.pixel_values(&image);
/// assert_eq!(v.len(), 3 * 224 * 224);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ClipImageProcessor {
    /// Resize so that the shorter side is `shortest_edge` (the longer side becomes
    /// `floor(shortest_edge * long / short)`).
    pub do_resize: bool,
    /// Target of the shorter side.
    pub shortest_edge: usize,
    /// Resampling filter.
    pub resample: Resample,
    /// Cut the center `crop_height x crop_width` (zero-padded if the image is smaller).
    pub do_center_crop: bool,
    /// Crop height.
    pub crop_height: usize,
    /// Crop width.
    pub crop_width: usize,
    /// Multiply by `rescale_factor`.
    pub do_rescale: bool,
    /// The rescale factor (`1/255`).
    pub rescale_factor: f64,
    /// Subtract `image_mean` and divide by `image_std`, per channel.
    pub do_normalize: bool,
    /// Per-channel mean.
    pub image_mean: [f32; 3],
    /// Per-channel standard deviation.
    pub image_std: [f32; 3],
}

impl Default for ClipImageProcessor {
    /// CLIP's: shortest edge 224, bicubic, crop 224 x 224, rescale `1/255`, CLIP mean / std.
    fn default() -> Self {
        Self {
            do_resize: true,
            shortest_edge: 224,
            resample: Resample::Bicubic,
            do_center_crop: true,
            crop_height: 224,
            crop_width: 224,
            do_rescale: true,
            rescale_factor: 1.0 / 255.0,
            do_normalize: true,
            image_mean: CLIP_MEAN,
            image_std: CLIP_STD,
        }
    }
}

impl ClipImageProcessor {
    /// Reads a transformers `preprocessor_config.json`; missing keys take CLIP's defaults.
    /// `size` may be `{"shortest_edge": n}` or an integer, `crop_size` `{"height", "width"}`
    /// or an integer; `resample` must be 2 (bilinear) or 3 (bicubic). Every other key is one
    /// of [`PROCESSOR_INERT_KEYS`] or a fast processor's key at the value that is CLIP's own
    /// processing (`default_to_square = false`, `data_format = "channels_first"`, `do_pad =
    /// false`, no `input_data_format`); any other key or value is refused by name. Every
    /// problem is reported together.
    pub fn from_json(path: impl AsRef<Path>) -> Result<Self, RewardError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| RewardError::io(path, e))?;
        let v: Value = serde_json::from_str(&text).map_err(|source| RewardError::Json {
            path: path.into(),
            source,
        })?;
        let mut p = Self::default();
        let mut problems = Vec::new();
        let flag =
            |key: &str, target: &mut bool, problems: &mut Vec<ConfigProblem>| match v.get(key) {
                None | Some(Value::Null) => {}
                Some(Value::Bool(b)) => *target = *b,
                Some(x) => problems.push(ConfigProblem::new(key, x, "true or false")),
            };
        flag("do_resize", &mut p.do_resize, &mut problems);
        flag("do_center_crop", &mut p.do_center_crop, &mut problems);
        flag("do_rescale", &mut p.do_rescale, &mut problems);
        flag("do_normalize", &mut p.do_normalize, &mut problems);
        match v.get("size") {
            None | Some(Value::Null) => {}
            Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n > 0) => {
                p.shortest_edge = n.as_u64().unwrap_or(0) as usize
            }
            Some(Value::Object(m))
                if m.get("shortest_edge")
                    .and_then(Value::as_u64)
                    .is_some_and(|n| n > 0) =>
            {
                p.shortest_edge = m["shortest_edge"].as_u64().unwrap_or(0) as usize
            }
            Some(x) => problems.push(ConfigProblem::new(
                "size",
                x,
                "{\"shortest_edge\": n} or a positive integer (CLIP resizes the shortest side)",
            )),
        }
        match v.get("crop_size") {
            None | Some(Value::Null) => {}
            Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n > 0) => {
                let n = n.as_u64().unwrap_or(0) as usize;
                (p.crop_height, p.crop_width) = (n, n);
            }
            Some(Value::Object(m))
                if m.get("height")
                    .and_then(Value::as_u64)
                    .is_some_and(|n| n > 0)
                    && m.get("width")
                        .and_then(Value::as_u64)
                        .is_some_and(|n| n > 0) =>
            {
                p.crop_height = m["height"].as_u64().unwrap_or(0) as usize;
                p.crop_width = m["width"].as_u64().unwrap_or(0) as usize;
            }
            Some(x) => problems.push(ConfigProblem::new(
                "crop_size",
                x,
                "{\"height\": h, \"width\": w} or a positive integer",
            )),
        }
        match v.get("resample") {
            None | Some(Value::Null) => {}
            Some(x) if x.as_u64() == Some(3) => p.resample = Resample::Bicubic,
            Some(x) if x.as_u64() == Some(2) => p.resample = Resample::Bilinear,
            Some(x) => problems.push(ConfigProblem::new(
                "resample",
                x,
                "2 (bilinear) or 3 (bicubic)",
            )),
        }
        match v.get("rescale_factor") {
            None | Some(Value::Null) => {}
            Some(x) => match x.as_f64() {
                Some(f) if f.is_finite() && f > 0.0 => p.rescale_factor = f,
                _ => problems.push(ConfigProblem::new("rescale_factor", x, "a positive number")),
            },
        }
        for (key, target) in [
            ("image_mean", &mut p.image_mean),
            ("image_std", &mut p.image_std),
        ] {
            match v.get(key) {
                None | Some(Value::Null) => {}
                Some(x) => {
                    let vals: Option<Vec<f32>> = match x {
                        Value::Array(xs) => {
                            xs.iter().map(|e| e.as_f64().map(|f| f as f32)).collect()
                        }
                        Value::Number(n) => n.as_f64().map(|f| vec![f as f32; 3]),
                        _ => None,
                    };
                    match vals.as_deref() {
                        Some([a, b, c])
                            if key == "image_mean" || [a, b, c].iter().all(|s| **s > 0.0) =>
                        {
                            *target = [*a, *b, *c]
                        }
                        _ => problems.push(ConfigProblem::new(
                            key,
                            x,
                            "three numbers (standard deviations positive)",
                        )),
                    }
                }
            }
        }
        check_processor_keys(&v, &mut problems);
        RewardError::config_file(path, "CLIP preprocessor_config.json", problems)?;
        Ok(p)
    }

    /// The output side lengths `(height, width)` after resizing and cropping.
    pub fn output_size(&self, width: usize, height: usize) -> (usize, usize) {
        if self.do_center_crop {
            (self.crop_height, self.crop_width)
        } else if self.do_resize {
            let (w, h) = self.resized_size(width, height);
            (h, w)
        } else {
            (height, width)
        }
    }

    /// transformers' `get_resize_output_image_size(default_to_square=False)`: the shorter
    /// side becomes `shortest_edge`, the longer `floor(shortest_edge * long / short)`.
    /// Returns `(width, height)`.
    pub fn resized_size(&self, width: usize, height: usize) -> (usize, usize) {
        let (short, long) = if width <= height {
            (width, height)
        } else {
            (height, width)
        };
        let new_short = self.shortest_edge;
        let new_long = (new_short as f64 * long as f64 / short as f64) as usize;
        if width <= height {
            (new_short, new_long)
        } else {
            (new_long, new_short)
        }
    }

    /// Resize (if enabled) and center crop (if enabled): the 8-bit image the processor
    /// rescales and normalises.
    pub fn resize_and_crop(&self, image: &RgbImage) -> RgbImage {
        let resized = if self.do_resize {
            let (w, h) = self.resized_size(image.width(), image.height());
            resize(image, w, h, self.resample)
        } else {
            image.clone()
        };
        if self.do_center_crop {
            center_crop(&resized, self.crop_height, self.crop_width)
        } else {
            resized
        }
    }

    /// The processor's `pixel_values` for one image: `[3, H, W]` row-major `f32`
    /// (`(x * rescale_factor - mean) / std` with the rescale in `f64` rounded to `f32`, the
    /// normalisation in `f32`, as transformers' numpy code computes it).
    pub fn pixel_values(&self, image: &RgbImage) -> Vec<f32> {
        let im = self.resize_and_crop(image);
        let (w, h) = (im.width(), im.height());
        let px = im.as_bytes();
        let mut out = vec![0f32; 3 * w * h];
        for c in 0..3 {
            for i in 0..w * h {
                let mut x = if self.do_rescale {
                    (px[i * 3 + c] as f64 * self.rescale_factor) as f32
                } else {
                    px[i * 3 + c] as f32
                };
                if self.do_normalize {
                    x = (x - self.image_mean[c]) / self.image_std[c];
                }
                out[c * w * h + i] = x;
            }
        }
        out
    }

    /// `pixel_values` of a batch as a tensor `[batch, 3, H, W]` (every image must come out of
    /// the processor at one size: always the case with center crop).
    pub fn batch<B: Backend>(&self, images: &[RgbImage], device: &B::Device) -> Tensor<B, 4> {
        assert!(!images.is_empty(), "an empty image batch");
        let (h, w) = self.output_size(images[0].width(), images[0].height());
        let mut all = Vec::with_capacity(images.len() * 3 * h * w);
        for im in images {
            let v = self.pixel_values(im);
            assert_eq!(
                v.len(),
                3 * h * w,
                "images of one batch must preprocess to one size"
            );
            all.extend(v);
        }
        Tensor::from_data(TensorData::new(all, [images.len(), 3, h, w]), device)
    }
}

/// transformers' `center_crop`: `top = (H - h) // 2`, `left = (W - w) // 2` (floor
/// division); an image smaller than the crop is first zero-padded to at least the crop size,
/// centred with `ceil` of half the padding before it.
pub fn center_crop(image: &RgbImage, height: usize, width: usize) -> RgbImage {
    let (ih, iw) = (image.height() as i64, image.width() as i64);
    let (ch, cw) = (height as i64, width as i64);
    let mut top = (ih - ch).div_euclid(2);
    let mut left = (iw - cw).div_euclid(2);
    let (mut nh, mut nw, mut top_pad, mut left_pad) = (ih, iw, 0, 0);
    if top < 0 || left < 0 || top + ch > ih || left + cw > iw {
        nh = ch.max(ih);
        nw = cw.max(iw);
        top_pad = (nh - ih + 1) / 2;
        left_pad = (nw - iw + 1) / 2;
        top += top_pad;
        left += left_pad;
    }
    let (y0, y1) = (top.max(0), (top + ch).min(nh));
    let (x0, x1) = (left.max(0), (left + cw).min(nw));
    RgbImage::from_fn((x1 - x0) as usize, (y1 - y0) as usize, |x, y| {
        let sy = y as i64 + y0 - top_pad;
        let sx = x as i64 + x0 - left_pad;
        if sy >= 0 && sy < ih && sx >= 0 && sx < iw {
            image.pixel(sx as usize, sy as usize)
        } else {
            [0, 0, 0]
        }
    })
}
