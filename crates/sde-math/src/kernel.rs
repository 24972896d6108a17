//! Stochastic transition kernels and the one transition function they share.
//!
//! Every kernel here is a Gaussian transition
//! `x_{k+1} ~ N(mu_k, std_k^2 I)` with `mu_k = c_x * x_k + c_v * v_k`, where `x_k` is the
//! current sample, `v_k` the model's velocity (flow prediction, `v = eps - x0`) and the scalars
//! `c_x`, `c_v`, `std_k` depend only on the step's sigmas and the kernel's parameters.
//!
//! Sampling ([`Kernel::sample`]) and replay ([`Kernel::replay`]) both go through the private
//! `transition` function: sampling first draws `x_{k+1} = mu + std * noise` from an explicit
//! noise tensor, then scores it exactly as replay scores a stored `x_{k+1}`. Given the same
//! inputs the two produce bitwise-identical log-probs.

use burn::tensor::{Tensor, backend::Backend};

use crate::output::Transition;
use crate::precision::{StorageDtype, to_compute};
use crate::sigmas::{Sigmas, StepSigmas};
use crate::{SdeError, gaussian};

/// Below this noise level the storage round trip is skipped: the transition is then so narrow
/// that storage rounding would dominate it (seed `_finalize_logp` rule).
pub const ROUND_TRIP_MIN_NOISE: f64 = 1e-7;

/// What a Flow-SDE step does at `sigma == 1`, where `g(sigma) = a * sqrt(sigma / (1 - sigma))`
/// divides by zero.
///
/// The references disagree: flow_grpo substitutes the schedule's `sigmas[1]` for `sigma` in the
/// denominator (at step 0 that is `sigma_next`), while a replay-side implementation clamps the
/// denominator's sigma to `0.99` — at 12 steps the two give `g = 2.92` against `7.0`. Neither is
/// the density of an SDE at `sigma = 1`; the default refuses the step.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum SigmaOnePolicy {
    /// A stochastic step at `sigma == 1` is an error ([`SdeError::StochasticStepAtSigmaOne`]).
    /// Make step 0 deterministic; this is what a trainer wants, so a step 0 can never be
    /// trained by accident.
    #[default]
    Reject,
    /// flow_grpo's convention: `g = a * sqrt(1 / (1 - sigma_next))` at `sigma == 1`.
    SubstituteNext,
    /// Use `sigma_max` in the denominator at `sigma == 1`:
    /// `g = a * sqrt(1 / (1 - sigma_max))` (a replay-side reference uses `0.99`).
    Substitute(f32),
}

/// Flow-GRPO's Flow-SDE (its `sde_type = "sde"`).
///
/// `g(sigma) = a * sqrt(sigma / (1 - sigma))`, Euler–Maruyama on the equal-marginal reverse SDE
/// (seed 003 step 4):
///
/// ```text
/// mu  = x * (1 + g^2 / (2 sigma) * dt) + v * (1 + g^2 (1 - sigma) / (2 sigma)) * dt
/// std = g * sqrt(-dt)
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlowSde {
    /// The noise level `a` (Flow-GRPO's `noise_level`, 0.7 in its recipes). Finite, `> 0`.
    pub noise_level: f32,
    /// What to do at `sigma == 1`.
    pub at_sigma_one: SigmaOnePolicy,
}

/// DanceGRPO's `flux_step`: the same mean family with a constant diffusion coefficient.
///
/// ```text
/// mu  = x + v dt - (eta^2 / 2) * score * dt,  score = -(x + (1 - sigma) v) / sigma
///     = x * (1 + eta^2 / (2 sigma) * dt) + v * (1 + eta^2 (1 - sigma) / (2 sigma)) * dt
/// std = eta * sqrt(-dt)
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dance {
    /// `eta` (0.3 for FLUX and 0.25 for HunyuanVideo in DanceGRPO's scripts). Finite, `> 0`.
    pub eta: f32,
}

/// Coefficients-preserving sampling (flow_grpo's `sde_type = "cps"`).
///
/// With `x0 = x - sigma v` and `x1 = x + (1 - sigma) v` the model's data and noise estimates,
/// and `s = sigma_next * sin(a pi / 2)`:
///
/// ```text
/// mu  = x0 * (1 - sigma_next) + x1 * sqrt(sigma_next^2 - s^2)
/// std = s          (no sqrt(-dt) factor)
/// ```
///
/// The reference's CPS "log-prob" is `-(x_next - mu)^2` averaged: it drops the variance and
/// every constant. [`Transition::log_prob`](crate::Transition) here is the real Gaussian
/// log-density; the reference quantity is [`Transition::cps_reference_score`](crate::Transition::cps_reference_score).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cps {
    /// The noise level `a`, in `(0, 1]`.
    pub noise_level: f32,
}

/// The paired-trajectory paper's on-schedule churn step (EDM-style): overshoot the Euler step
/// to a lower noise level, then add fresh noise back so the sample lands on `sigma_next`.
///
/// ```text
/// t~   = sigma_next / (1 - gamma sigma_next + gamma)
/// x~   = x + (t~ - sigma) v
/// x'   = (x~ + t~ sqrt(gamma^2 + 2 gamma) eps) / (gamma t~ + 1)
/// mu   = x~ / (gamma t~ + 1)
/// std  = t~ sqrt(gamma^2 + 2 gamma) / (gamma t~ + 1) = sigma_next sqrt(gamma^2 + 2 gamma) / (1 + gamma)
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Churn {
    /// `gamma`, the fraction of noise re-drawn (the paper uses 0.0025). Finite, `> 0`.
    pub gamma: f32,
}

/// A stochastic per-step kernel. Every variant has a Gaussian transition and a real log-prob.
///
/// The deterministic `eta = 0` collapse is [`euler_step`](crate::euler_step); the multistep
/// deterministic solvers live in [`solvers`](crate::solvers). Neither has a log-prob, by type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kernel {
    /// Flow-GRPO's Flow-SDE.
    FlowSde(FlowSde),
    /// DanceGRPO's constant-coefficient SDE.
    Dance(Dance),
    /// Coefficients-preserving sampling.
    Cps(Cps),
    /// On-schedule churn (paired-trajectory finite differences).
    Churn(Churn),
}

/// The scalar coefficients of one sample's Gaussian transition, computed in `f64`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Moments {
    /// Coefficient of the current sample in the mean.
    pub c_sample: f64,
    /// Coefficient of the model output in the mean.
    pub c_model: f64,
    /// The diffusion coefficient before the step-size factor (`g(sigma)` for Flow-SDE, `eta`
    /// for Dance; equal to `std` for CPS and churn, which have no `sqrt(-dt)` factor).
    pub std_dev_t: f64,
    /// The transition standard deviation.
    pub std: f64,
}

fn param(
    kernel: &'static str,
    name: &'static str,
    value: f32,
    ok: bool,
    expected: &'static str,
) -> Result<(), SdeError> {
    if ok && value.is_finite() {
        Ok(())
    } else {
        Err(SdeError::InvalidParameter {
            kernel,
            name,
            value: f64::from(value),
            expected,
        })
    }
}

impl Kernel {
    /// Flow-SDE with noise level `a` and the default (rejecting) `sigma == 1` policy.
    ///
    /// ```
    /// use sde_math::Kernel;
    /// assert!(Kernel::flow_sde(0.7).is_ok());
    /// assert!(Kernel::flow_sde(0.0).is_err());
    /// ```
    pub fn flow_sde(noise_level: f32) -> Result<Self, SdeError> {
        Self::FlowSde(FlowSde {
            noise_level,
            at_sigma_one: SigmaOnePolicy::Reject,
        })
        .validated()
    }

    /// DanceGRPO's kernel with coefficient `eta`.
    pub fn dance(eta: f32) -> Result<Self, SdeError> {
        Self::Dance(Dance { eta }).validated()
    }

    /// Coefficients-preserving sampling with noise level `a` in `(0, 1]`.
    pub fn cps(noise_level: f32) -> Result<Self, SdeError> {
        Self::Cps(Cps { noise_level }).validated()
    }

    /// On-schedule churn with noise fraction `gamma`.
    pub fn churn(gamma: f32) -> Result<Self, SdeError> {
        Self::Churn(Churn { gamma }).validated()
    }

    /// Checks the parameters and returns the kernel.
    ///
    /// # Errors
    /// [`SdeError::InvalidParameter`] naming the parameter and its allowed range.
    pub fn validated(self) -> Result<Self, SdeError> {
        match self {
            Kernel::FlowSde(k) => {
                param(
                    "Flow-SDE",
                    "noise_level",
                    k.noise_level,
                    k.noise_level > 0.0,
                    "a finite value > 0",
                )?;
                if let SigmaOnePolicy::Substitute(s) = k.at_sigma_one {
                    param(
                        "Flow-SDE",
                        "sigma_max",
                        s,
                        s > 0.0 && s < 1.0,
                        "a value in (0, 1)",
                    )?;
                }
            }
            Kernel::Dance(k) => param("Dance", "eta", k.eta, k.eta > 0.0, "a finite value > 0")?,
            Kernel::Cps(k) => param(
                "CPS",
                "noise_level",
                k.noise_level,
                k.noise_level > 0.0 && k.noise_level <= 1.0,
                "a value in (0, 1]",
            )?,
            Kernel::Churn(k) => param(
                "churn",
                "gamma",
                k.gamma,
                k.gamma > 0.0,
                "a finite value > 0",
            )?,
        }
        Ok(self)
    }

    /// The kernel's name, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Kernel::FlowSde(_) => "Flow-SDE",
            Kernel::Dance(_) => "Dance",
            Kernel::Cps(_) => "CPS",
            Kernel::Churn(_) => "churn",
        }
    }

    /// The kernel's noise parameter (`a`, `eta` or `gamma`).
    pub fn noise_level(&self) -> f32 {
        match self {
            Kernel::FlowSde(k) => k.noise_level,
            Kernel::Dance(k) => k.eta,
            Kernel::Cps(k) => k.noise_level,
            Kernel::Churn(k) => k.gamma,
        }
    }

    /// The Gaussian transition's scalar coefficients for one step.
    ///
    /// This is the single source of the step's std: [`Kernel::transition_std`] and both
    /// [`Kernel::sample`] and [`Kernel::replay`] read it from here.
    ///
    /// # Errors
    /// [`SdeError::StochasticStepAtSigmaOne`] (Flow-SDE at `sigma == 1` under `Reject`),
    /// [`SdeError::DegenerateStd`] when the std is not finite and positive.
    ///
    /// ```
    /// use sde_math::{Kernel, StepSigmas};
    /// let k = Kernel::flow_sde(0.7).unwrap();
    /// let m = k.moments(&StepSigmas::new(0.5, 0.4).unwrap()).unwrap();
    /// // g = 0.7 * sqrt(0.5 / 0.5) = 0.7;  std = g * sqrt(0.1)
    /// assert!((m.std_dev_t - 0.7).abs() < 1e-6);
    /// assert!((m.std - 0.7 * 0.1f64.sqrt()).abs() < 1e-6);
    /// // c_model = (1 + g^2 (1 - sigma) / (2 sigma)) * dt
    /// assert!((m.c_model - (1.0 + 0.49 * 0.5 / 1.0) * -0.1).abs() < 1e-6);
    /// ```
    pub fn moments(&self, at: &StepSigmas) -> Result<Moments, SdeError> {
        let s = f64::from(at.sigma());
        let n = f64::from(at.sigma_next());
        let dt = at.dt();
        let m = match *self {
            Kernel::FlowSde(k) => {
                let a = f64::from(k.noise_level);
                let denom_sigma = if at.sigma() == 1.0 {
                    match k.at_sigma_one {
                        SigmaOnePolicy::Reject => {
                            return Err(SdeError::StochasticStepAtSigmaOne {
                                sigma_next: at.sigma_next(),
                            });
                        }
                        SigmaOnePolicy::SubstituteNext => n,
                        SigmaOnePolicy::Substitute(v) => f64::from(v),
                    }
                } else {
                    s
                };
                let g = (s / (1.0 - denom_sigma)).sqrt() * a;
                ito_moments(g, s, dt)
            }
            Kernel::Dance(k) => ito_moments(f64::from(k.eta), s, dt),
            Kernel::Cps(k) => {
                let std = n * (f64::from(k.noise_level) * std::f64::consts::FRAC_PI_2).sin();
                let c = (n * n - std * std).max(0.0).sqrt();
                Moments {
                    // x0 (1 - n) + x1 c,  x0 = x - s v,  x1 = x + (1 - s) v
                    c_sample: (1.0 - n) + c,
                    c_model: -s * (1.0 - n) + (1.0 - s) * c,
                    std_dev_t: std,
                    std,
                }
            }
            Kernel::Churn(k) => {
                let g = f64::from(k.gamma);
                let t_tilde = n / (1.0 - g * n + g);
                let denom = g * t_tilde + 1.0;
                let std = t_tilde * (g * g + 2.0 * g).sqrt() / denom;
                Moments {
                    c_sample: 1.0 / denom,
                    c_model: (t_tilde - s) / denom,
                    std_dev_t: std,
                    std,
                }
            }
        };
        if !(m.std.is_finite() && m.std > 0.0) {
            return Err(SdeError::DegenerateStd {
                kernel: self.name(),
                sigma: at.sigma(),
                sigma_next: at.sigma_next(),
                std: m.std,
            });
        }
        Ok(m)
    }

    /// The transition standard deviation of one step (the normaliser of the closed-form KL).
    ///
    /// Equal to the std the step samples with and scores against — both read
    /// [`Kernel::moments`].
    ///
    /// ```
    /// use sde_math::{Kernel, StepSigmas};
    /// let at = StepSigmas::new(0.5, 0.25).unwrap();
    /// let cps = Kernel::cps(0.5).unwrap();
    /// // CPS: sigma_next * sin(a pi / 2), no sqrt(-dt) factor
    /// let want = 0.25 * (0.25 * std::f64::consts::PI).sin();
    /// assert!((cps.transition_std(&at).unwrap() - want).abs() < 1e-12);
    /// ```
    pub fn transition_std(&self, at: &StepSigmas) -> Result<f64, SdeError> {
        Ok(self.moments(at)?.std)
    }

    /// Samples one step: `x_{k+1} = mu + std * noise`, rounded to `storage`, then scored.
    ///
    /// * `model_output`, `sample`, `noise`: `[batch, ...]`, same shape; any float dtype (the
    ///   math runs in `f32`, or `f64` on an `f64` backend).
    /// * `noise`: standard normal, supplied by the caller (no RNG in this crate).
    /// * `storage`: the precision the trajectory stores `x_{k+1}` at; the log-prob scores the
    ///   rounded value, exactly what replay will read back. Skipped when the kernel's noise
    ///   level is below [`ROUND_TRIP_MIN_NOISE`].
    ///
    /// # Errors
    /// Shape mismatches, per-sample sigma count, and every error of [`Kernel::moments`].
    pub fn sample<B: Backend, const D: usize>(
        &self,
        at: &Sigmas,
        model_output: Tensor<B, D>,
        sample: Tensor<B, D>,
        noise: Tensor<B, D>,
        storage: StorageDtype,
    ) -> Result<Transition<B, D>, SdeError> {
        check_same_shape("noise", &noise, &sample)?;
        let noise = to_compute(noise, "noise")?;
        self.transition(at, model_output, sample, Next::Draw(noise), storage)
    }

    /// Replays (scores) a stored step `sample -> prev_sample` under the current model output.
    ///
    /// Same inputs as [`Kernel::sample`] with the stored `x_{k+1}` in place of the noise. The
    /// stored sample is detached: the log-prob is differentiable in `model_output` through the
    /// mean only (`d log p / d v = ((x_{k+1} - mu) / std^2) * c_model`).
    ///
    /// # Errors
    /// As [`Kernel::sample`].
    pub fn replay<B: Backend, const D: usize>(
        &self,
        at: &Sigmas,
        model_output: Tensor<B, D>,
        sample: Tensor<B, D>,
        prev_sample: Tensor<B, D>,
        storage: StorageDtype,
    ) -> Result<Transition<B, D>, SdeError> {
        check_same_shape("prev_sample", &prev_sample, &sample)?;
        let prev_sample = to_compute(prev_sample.detach(), "prev_sample")?;
        self.transition(at, model_output, sample, Next::Stored(prev_sample), storage)
    }

    /// The shared transition: moments, then (sampling only) the draw, then the storage round
    /// trip, then the log-density. Sampling and replay differ only in where `x_{k+1}` comes from.
    fn transition<B: Backend, const D: usize>(
        &self,
        at: &Sigmas,
        model_output: Tensor<B, D>,
        sample: Tensor<B, D>,
        next: Next<B, D>,
        storage: StorageDtype,
    ) -> Result<Transition<B, D>, SdeError> {
        check_same_shape("model_output", &model_output, &sample)?;
        let model_output = to_compute(model_output, "model_output")?;
        let sample = to_compute(sample, "sample")?;
        let batch = sample.dims()[0];
        let per_sample = at
            .expand(batch)?
            .iter()
            .map(|s| self.moments(s))
            .collect::<Result<Vec<_>, _>>()?;

        let c_sample: Vec<f64> = per_sample.iter().map(|m| m.c_sample).collect();
        let c_model: Vec<f64> = per_sample.iter().map(|m| m.c_model).collect();
        let std: Vec<f64> = per_sample.iter().map(|m| m.std).collect();

        let storage = if f64::from(self.noise_level()) < ROUND_TRIP_MIN_NOISE {
            StorageDtype::Native
        } else {
            storage
        };
        let next = match next {
            Next::Draw(noise) => fused_ops::NextSample::Draw { noise, std: &std },
            Next::Stored(stored) => fused_ops::NextSample::Stored(stored),
        };
        // The mean `c_x x + c_v v`, the next sample rounded to storage, and
        // `mean_e (x' - mu)^2`: one pass on the CPU backend, the same bits as the composition
        // elsewhere. The log-density `-mean_sq / (2 s^2) - ln(s) - ln(sqrt(2 pi))` then needs
        // no per-element densities (`Transition::log_prob_elements` gives those on demand).
        let fused_ops::GaussianStep {
            mean,
            next: prev_sample,
            mean_sq,
        } = fused_ops::gaussian_step(
            sample,
            &c_sample,
            model_output,
            &c_model,
            next,
            storage.dtype(),
        );
        let log_prob = gaussian::log_density_from_mean_square(mean_sq, &std);
        let elements: usize = prev_sample.dims()[1..].iter().product();
        let log_density = log_prob.clone().mul_scalar(elements as f64);
        Ok(Transition {
            prev_sample,
            mean,
            std,
            std_dev_t: per_sample.iter().map(|m| m.std_dev_t).collect(),
            log_prob,
            log_density,
        })
    }
}

/// Moments of the Itô family `dx = [v + g^2/(2 sigma) (x + (1 - sigma) v)] dt + g dw`
/// (Flow-SDE with `g = a sqrt(sigma/(1-sigma))`, Dance with `g = eta`).
fn ito_moments(g: f64, s: f64, dt: f64) -> Moments {
    let g2 = g * g;
    Moments {
        c_sample: 1.0 + g2 / (2.0 * s) * dt,
        c_model: (1.0 + g2 * (1.0 - s) / (2.0 * s)) * dt,
        std_dev_t: g,
        std: g * (-dt).sqrt(),
    }
}

/// Where `x_{k+1}` comes from.
enum Next<B: Backend, const D: usize> {
    /// Sampling: draw with this standard-normal noise.
    Draw(Tensor<B, D>),
    /// Replay: the stored sample.
    Stored(Tensor<B, D>),
}

pub(crate) fn check_same_shape<B: Backend, const D: usize>(
    what: &'static str,
    t: &Tensor<B, D>,
    like: &Tensor<B, D>,
) -> Result<(), SdeError> {
    let (got, expected) = (t.dims(), like.dims());
    if got == expected {
        Ok(())
    } else {
        Err(SdeError::ShapeMismatch {
            what,
            got: got.to_vec(),
            expected: expected.to_vec(),
        })
    }
}

/// The deterministic Euler step of the flow ODE, `x_{k+1} = x_k + v_k dt` — the `eta = 0`
/// collapse of every kernel above. No log-prob: a deterministic step has no density.
///
/// # Errors
/// Shape mismatch, per-sample sigma count, or an unsupported dtype.
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// use sde_math::{euler_step, StepSigmas};
/// let dev = Default::default();
/// let x = Tensor::<Flex, 2>::from_floats([[1.0, 2.0]], &dev);
/// let v = Tensor::<Flex, 2>::from_floats([[0.5, -1.0]], &dev);
/// let at = StepSigmas::new(1.0, 0.75).unwrap().into();
/// let next = euler_step(&at, v, x).unwrap().into_data().to_vec::<f32>().unwrap();
/// assert_eq!(next, vec![1.0 - 0.125, 2.25]);
/// ```
pub fn euler_step<B: Backend, const D: usize>(
    at: &Sigmas,
    model_output: Tensor<B, D>,
    sample: Tensor<B, D>,
) -> Result<Tensor<B, D>, SdeError> {
    check_same_shape("model_output", &model_output, &sample)?;
    let model_output = to_compute(model_output, "model_output")?;
    let sample = to_compute(sample, "sample")?;
    let batch = sample.dims()[0];
    let dt: Vec<f64> = at.expand(batch)?.iter().map(StepSigmas::dt).collect();
    Ok(fused_ops::combine(
        sample,
        &vec![1.0; batch],
        model_output,
        &dt,
    ))
}
