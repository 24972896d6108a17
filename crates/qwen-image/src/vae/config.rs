//! The VAE's configuration: diffusers' `AutoencoderKLQwenImage` `config.json`, every key used,
//! refused or named as having no effect.

use std::path::Path;

use serde_json::Value;

use crate::error::{ConfigProblem, QwenImageError, parse_config_file, root_object};

/// The class name a diffusers VAE directory must record.
pub const CLASS_NAME: &str = "AutoencoderKLQwenImage";

/// An `AutoencoderKLQwenImage` (the Wan 2.1 VAE layout); absent keys take diffusers' defaults,
/// which are the published Qwen-Image VAE's values.
#[derive(Clone, Debug, PartialEq)]
pub struct VaeConfig {
    /// Channels of the first stage.
    pub base_dim: usize,
    /// Latent channels.
    pub z_dim: usize,
    /// Channel multipliers of the stages (one spatial halving between consecutive stages).
    pub dim_mult: Vec<usize>,
    /// Residual blocks per encoder stage (the decoder has one more per stage).
    pub num_res_blocks: usize,
    /// Which stage transitions also halve time. A single image is one frame, for which the
    /// temporal convolutions never run: the value only says which tensors the checkpoint holds.
    pub temperal_downsample: Vec<bool>,
    /// Image channels.
    pub input_channels: usize,
    /// Per-channel latent mean (the pipeline's normalisation).
    pub latents_mean: Vec<f64>,
    /// Per-channel latent standard deviation.
    pub latents_std: Vec<f64>,
}

/// Keys accepted with no effect on decoding or encoding an image, and why.
pub const INERT_KEYS: &[(&str, &str)] = &[
    ("_class_name", "checked to be AutoencoderKLQwenImage"),
    ("_diffusers_version", "the version that saved the file"),
    ("_name_or_path", "where the file came from"),
    ("dropout", "dropout, off in a frozen VAE"),
];

impl Default for VaeConfig {
    /// diffusers' defaults (the published Qwen-Image VAE).
    fn default() -> Self {
        Self {
            base_dim: 96,
            z_dim: 16,
            dim_mult: vec![1, 2, 4, 4],
            num_res_blocks: 2,
            temperal_downsample: vec![false, true, true],
            input_channels: 3,
            latents_mean: vec![
                -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134,
                -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
            ],
            latents_std: vec![
                2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526,
                2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
            ],
        }
    }
}

fn uint(v: &Value, key: &str, p: &mut Vec<ConfigProblem>) -> Option<usize> {
    let got = v.as_u64().map(|u| u as usize);
    if got.is_none() {
        p.push(ConfigProblem::new(key, v, "a non-negative integer"));
    }
    got
}

fn list<T>(
    v: &Value,
    key: &str,
    what: &str,
    item: impl Fn(&Value) -> Option<T>,
    p: &mut Vec<ConfigProblem>,
) -> Option<Vec<T>> {
    let got = v
        .as_array()
        .and_then(|xs| xs.iter().map(&item).collect::<Option<Vec<T>>>());
    if got.is_none() {
        p.push(ConfigProblem::new(key, v, format!("a list of {what}")));
    }
    got
}

impl VaeConfig {
    /// Reads a diffusers `config.json` of an `AutoencoderKLQwenImage` (a Qwen-Image
    /// directory's `vae/config.json`).
    ///
    /// Every key is used, one of [`INERT_KEYS`], or refused: `attn_scales` must be empty
    /// (diffusers 0.42.1 cannot run an encoder with attention blocks either: it passes them
    /// the convolution cache they do not take). Every problem is reported at once.
    ///
    /// # Errors
    /// [`QwenImageError::Io`] / [`QwenImageError::Json`] for an unreadable file,
    /// [`QwenImageError::Config`] listing every problem.
    pub fn from_json_file(path: impl AsRef<Path>) -> Result<Self, QwenImageError> {
        parse_config_file(path.as_ref(), Self::from_json)
    }

    /// [`VaeConfig::from_json_file`] on a parsed value; the problems on failure.
    pub fn from_json(root: &Value) -> Result<Self, Vec<ConfigProblem>> {
        let mut p = Vec::new();
        let map = root_object(root)?;
        let mut c = VaeConfig::default();
        let float = |x: &Value| x.as_f64();
        for (key, v) in map {
            if v.is_null() {
                continue;
            }
            let k = key.as_str();
            match k {
                "base_dim" => c.base_dim = uint(v, k, &mut p).unwrap_or(c.base_dim),
                "z_dim" => c.z_dim = uint(v, k, &mut p).unwrap_or(c.z_dim),
                "num_res_blocks" => {
                    c.num_res_blocks = uint(v, k, &mut p).unwrap_or(c.num_res_blocks)
                }
                "input_channels" => {
                    c.input_channels = uint(v, k, &mut p).unwrap_or(c.input_channels)
                }
                "dim_mult" => {
                    let item = |x: &Value| x.as_u64().map(|u| u as usize);
                    if let Some(xs) = list(v, k, "non-negative integers", item, &mut p) {
                        c.dim_mult = xs;
                    }
                }
                "temperal_downsample" => {
                    if let Some(xs) = list(v, k, "booleans", Value::as_bool, &mut p) {
                        c.temperal_downsample = xs;
                    }
                }
                "latents_mean" => {
                    if let Some(xs) = list(v, k, "numbers", float, &mut p) {
                        c.latents_mean = xs;
                    }
                }
                "latents_std" => {
                    if let Some(xs) = list(v, k, "numbers", float, &mut p) {
                        c.latents_std = xs;
                    }
                }
                "attn_scales" => {
                    if v.as_array().is_none_or(|xs| !xs.is_empty()) {
                        p.push(ConfigProblem::new(
                            k,
                            v,
                            "[] (encoder attention blocks are not implemented; diffusers 0.42.1 cannot run them either)",
                        ));
                    }
                }
                "_class_name" if v != CLASS_NAME => {
                    p.push(ConfigProblem::new(k, v, format!("\"{CLASS_NAME}\"")))
                }
                _ if INERT_KEYS.iter().any(|(name, _)| *name == k) => {}
                _ => p.push(ConfigProblem::new(
                    k,
                    v,
                    "no such key in an AutoencoderKLQwenImage this crate implements",
                )),
            }
        }
        c.check(&mut p);
        if p.is_empty() { Ok(c) } else { Err(p) }
    }

    fn check(&self, p: &mut Vec<ConfigProblem>) {
        for (key, value) in [
            ("base_dim", self.base_dim),
            ("z_dim", self.z_dim),
            ("num_res_blocks", self.num_res_blocks),
            ("input_channels", self.input_channels),
        ] {
            if value == 0 {
                p.push(ConfigProblem::new(key, 0, "a positive integer"));
            }
        }
        if self.dim_mult.is_empty() || self.dim_mult.contains(&0) {
            p.push(ConfigProblem::new(
                "dim_mult",
                format!("{:?}", self.dim_mult),
                "a non-empty list of positive multipliers",
            ));
        }
        let stages = self.dim_mult.len().saturating_sub(1);
        if self.temperal_downsample.len() != stages {
            p.push(ConfigProblem::new(
                "temperal_downsample",
                format!("{:?}", self.temperal_downsample),
                format!("one flag per stage transition ({stages})"),
            ));
        }
        for (key, xs) in [
            ("latents_mean", &self.latents_mean),
            ("latents_std", &self.latents_std),
        ] {
            if xs.len() != self.z_dim {
                p.push(ConfigProblem::new(
                    key,
                    format!("{} values", xs.len()),
                    format!("one per latent channel (z_dim = {})", self.z_dim),
                ));
            }
        }
        if self
            .latents_std
            .iter()
            .any(|s| !(s.is_finite() && *s > 0.0))
        {
            p.push(ConfigProblem::new(
                "latents_std",
                format!("{:?}", self.latents_std),
                "positive numbers",
            ));
        }
    }

    /// How many pixels one latent position spans on each side (8 for the published VAE).
    pub fn scale_factor(&self) -> usize {
        1 << self.dim_mult.len().saturating_sub(1)
    }
}
