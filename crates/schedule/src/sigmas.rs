//! The validated sigma schedule and the named record a policy returns.

use crate::error::{ScheduleError, SigmasDefect};

/// A validated noise schedule: `steps + 1` `f32` sigmas, strictly decreasing, `sigmas[0] <= 1`,
/// ending at exactly `0`.
///
/// Step `k` (`0 <= k < steps`) goes from `sigmas[k]` to `sigmas[k + 1]`. Steps are addressed by
/// their integer index, never by looking a float up. Most grids start at `sigma = 1` (pure
/// noise); UniPC's flow grid starts just below (`shift(1 - 1/T)`).
///
/// ```
/// use schedule::Sigmas;
/// let s = Sigmas::new(vec![1.0, 0.5, 0.0]).unwrap();
/// assert_eq!(s.num_steps(), 2);
/// assert_eq!(s.step(1), (0.5, 0.0));
/// assert!(Sigmas::new(vec![1.0, 1.0, 0.0]).is_err()); // not strictly decreasing
/// assert!(Sigmas::new(vec![1.0, 0.5]).is_err()); // does not end at 0
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Sigmas(Vec<f32>);

impl Sigmas {
    /// Validates a sequence.
    ///
    /// # Errors
    /// [`ScheduleError::InvalidSigmas`] naming the first defect.
    pub fn new(sigmas: Vec<f32>) -> Result<Self, ScheduleError> {
        match defect(&sigmas) {
            None => Ok(Self(sigmas)),
            Some(defect) => Err(ScheduleError::InvalidSigmas { defect, sigmas }),
        }
    }

    /// The sigmas, `steps + 1` values ending at 0.
    pub fn as_slice(&self) -> &[f32] {
        &self.0
    }

    /// The number of denoising steps, `len - 1`.
    pub fn num_steps(&self) -> usize {
        self.0.len() - 1
    }

    /// `(sigma_k, sigma_{k+1})` of step `k`.
    ///
    /// # Panics
    /// If `k >= num_steps()` (a programmer error: step indices come from a validated plan).
    pub fn step(&self, k: usize) -> (f32, f32) {
        assert!(
            k < self.num_steps(),
            "step {k} out of range for a schedule of {} steps",
            self.num_steps()
        );
        (self.0[k], self.0[k + 1])
    }

    /// Consumes the schedule and returns the values.
    pub fn into_vec(self) -> Vec<f32> {
        self.0
    }
}

fn defect(s: &[f32]) -> Option<SigmasDefect> {
    if s.len() < 2 {
        return Some(SigmasDefect::TooShort);
    }
    for (index, &v) in s.iter().enumerate() {
        if !v.is_finite() {
            return Some(SigmasDefect::NotFinite { index });
        }
        if !(0.0..=1.0).contains(&v) {
            return Some(SigmasDefect::OutOfRange { index });
        }
        if index > 0 && v >= s[index - 1] {
            return Some(SigmasDefect::NotDecreasing { index });
        }
    }
    // `to_bits` rejects -0.0 as well: the terminal value is written as +0.0 by every reference.
    if s[s.len() - 1].to_bits() != 0 {
        return Some(SigmasDefect::LastNotZero);
    }
    None
}

/// What [`SchedulePolicy::sample_sigmas`](crate::SchedulePolicy::sample_sigmas) returns: the
/// schedule and the values derived on the way.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// `steps + 1` sigmas ending at 0.
    pub sigmas: Sigmas,
    /// The model's timestep input per step, `sigmas[k] * num_train_timesteps` evaluated in
    /// `f32` (`steps` values; the terminal 0 has none), exactly as diffusers computes it.
    pub timesteps: Vec<f32>,
    /// The `mu` of a dynamic shift (`None` for a static shift).
    pub mu: Option<f64>,
}
