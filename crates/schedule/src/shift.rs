//! Time shifts: the static SD3 shift and the resolution-dependent (dynamic) shift with its one
//! per-model override point, [`ComputeMu`].

use std::fmt;
use std::sync::Arc;

/// The inputs a `mu` rule may depend on: the requested image size and step count.
///
/// There are no defaults: a silent 1024x1024 would mis-derive `mu` for any other size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MuInput {
    /// Image height in pixels.
    pub height: u32,
    /// Image width in pixels.
    pub width: u32,
    /// Number of denoising steps.
    pub steps: usize,
}

impl MuInput {
    /// The packed image-token count `(height / p) * (width / p)` (integer division), with `p`
    /// the pixels per token side: 16 for FLUX.1, FLUX.2 and Qwen-Image (8x VAE, 2x2 patches).
    ///
    /// ```
    /// use schedule::MuInput;
    /// let g = MuInput { height: 480, width: 832, steps: 12 };
    /// assert_eq!(g.packed_tokens(16), 30 * 52);
    /// ```
    pub fn packed_tokens(&self, pixels_per_token: u32) -> u64 {
        u64::from(self.height / pixels_per_token) * u64::from(self.width / pixels_per_token)
    }
}

/// The per-model-family rule that turns the sampling geometry into the dynamic shift `mu`.
///
/// This is the single override point of a dynamic schedule: a model family whose `mu` differs
/// from diffusers' linear rule implements this trait and nothing else ([`Flux2KleinMu`] is the
/// shipped example).
pub trait ComputeMu: fmt::Debug + Send + Sync {
    /// `mu` for this geometry, in `f64` (diffusers computes it with Python floats).
    fn mu(&self, input: MuInput) -> f64;
}

/// diffusers' `calculate_shift`: `mu` linear in the packed image-token count,
/// `mu = seq * m + b` with `m = (max_shift - base_shift) / (max_seq_len - base_seq_len)` and
/// `b = base_shift - m * base_seq_len` (FLUX.1, Qwen-Image, SD3 with dynamic shifting).
///
/// ```
/// use schedule::{ComputeMu, LinearMu, MuInput};
/// let flux = LinearMu { base_shift: 0.5, max_shift: 1.15, base_seq_len: 256, max_seq_len: 4096, pixels_per_token: 16 };
/// // 1024x1024 -> 4096 tokens -> max_shift
/// let mu = flux.mu(MuInput { height: 1024, width: 1024, steps: 28 });
/// assert!((mu - 1.15).abs() < 1e-12);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearMu {
    /// `mu` at `base_seq_len` tokens.
    pub base_shift: f64,
    /// `mu` at `max_seq_len` tokens.
    pub max_shift: f64,
    /// Token count of `base_shift`.
    pub base_seq_len: u64,
    /// Token count of `max_shift`.
    pub max_seq_len: u64,
    /// Pixels per token side (16 for the 8x-VAE, 2x2-patch DiTs).
    pub pixels_per_token: u32,
}

impl ComputeMu for LinearMu {
    fn mu(&self, input: MuInput) -> f64 {
        // Same operations, in the same order, as diffusers' calculate_shift (Python floats).
        let m = (self.max_shift - self.base_shift)
            / (self.max_seq_len as f64 - self.base_seq_len as f64);
        let b = self.base_shift - m * self.base_seq_len as f64;
        input.packed_tokens(self.pixels_per_token) as f64 * m + b
    }
}

/// FLUX.2-klein's empirical `mu` (diffusers `pipeline_flux2_klein.compute_empirical_mu`), which
/// depends on the step count as well as the packed token count `seq = (H/16) * (W/16)`:
///
/// * `seq > 4300`: `mu = a2 * seq + b2`, whatever the step count;
/// * otherwise `mu` is linear in `steps`, through `m_10 = a1 * seq + b1` at 10 steps and
///   `m_200 = a2 * seq + b2` at 200 steps,
///
/// with `a1 = 8.73809524e-05, b1 = 1.89833333, a2 = 0.00016927, b2 = 0.45666666`.
///
/// ```
/// use schedule::{ComputeMu, Flux2KleinMu, MuInput};
/// let klein = Flux2KleinMu;
/// let at = |steps| klein.mu(MuInput { height: 512, width: 512, steps });
/// assert!(at(4) != at(50)); // step-count dependent below 4300 tokens
/// let big = |steps| klein.mu(MuInput { height: 1600, width: 1600, steps });
/// assert_eq!(big(4), big(50)); // 10000 tokens: step-count independent
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Flux2KleinMu;

impl Flux2KleinMu {
    /// Slope of `mu` in the token count at 10 steps.
    pub const A1: f64 = 8.73809524e-05;
    /// Intercept at 10 steps.
    pub const B1: f64 = 1.89833333;
    /// Slope at 200 steps (and for every step count above 4300 tokens).
    pub const A2: f64 = 0.00016927;
    /// Intercept at 200 steps.
    pub const B2: f64 = 0.45666666;
    /// Token count above which `mu` no longer depends on the step count.
    pub const SEQ_THRESHOLD: u64 = 4300;
}

impl ComputeMu for Flux2KleinMu {
    fn mu(&self, input: MuInput) -> f64 {
        let seq = input.packed_tokens(16);
        let seq_f = seq as f64;
        if seq > Self::SEQ_THRESHOLD {
            return Self::A2 * seq_f + Self::B2;
        }
        let m_200 = Self::A2 * seq_f + Self::B2;
        let m_10 = Self::A1 * seq_f + Self::B1;
        let a = (m_200 - m_10) / 190.0;
        let b = m_200 - 200.0 * a;
        a * input.steps as f64 + b
    }
}

/// The shape of a dynamic time shift, diffusers' `time_shift_type` (with its `sigma = 1`):
///
/// * `Exponential`: `t -> e^mu / (e^mu + (1/t - 1))`;
/// * `Linear`: `t -> mu / (mu + (1/t - 1))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeShift {
    /// `e^mu / (e^mu + (1/t - 1))` (FLUX, Qwen-Image, the diffusers default).
    Exponential,
    /// `mu / (mu + (1/t - 1))`.
    Linear,
}

/// How the base grid is shifted.
#[derive(Debug, Clone)]
pub enum Shift {
    /// The SD3 time shift `t -> s t / (1 + (s - 1) t)`, applied exactly once (`s = 1` is the
    /// identity). diffusers' `set_timesteps(N)` default path applies it twice (#13243); this crate
    /// never does.
    Static {
        /// The shift `s > 0`.
        shift: f64,
    },
    /// A resolution-dependent shift: `mu` from the geometry through `compute_mu`, then `kind`.
    Dynamic {
        /// The per-model `mu` rule.
        compute_mu: Arc<dyn ComputeMu>,
        /// Exponential or linear.
        kind: TimeShift,
    },
}
