//! Deterministic multistep ODE solvers for the steps that are not trained: DPM-Solver++ and
//! UniPC, in flow-prediction mode.
//!
//! They are stateful (a multistep method reuses earlier model outputs), and the state is an
//! explicit object the caller owns ([`SolverState`]). History is reused only across
//! *consecutive* step indices: a step whose index is not the previous one plus one — because a
//! stochastic step ran in between — clears the history first, and the solver warms up from
//! first order again. Stepping never returns a log-prob: a deterministic step has no density.
//!
//! Conventions (diffusers' flow mode): `alpha = 1 - sigma`, `lambda = ln(alpha) - ln(sigma)`,
//! the model predicts the velocity `v` and the data estimate is `x0 = x - sigma * v`. Scalar
//! coefficients are computed on the host in `f64` from the `f32` schedule.
//!
//! The final step into `sigma = 0` is always first order: the second-order terms divide by
//! `lambda(0) = +inf` and are not finite there (diffusers' `lower_order_final` with
//! `final_sigmas_type = "zero"`; flow_grpo's `dpm2` does the same).

use std::collections::VecDeque;

use burn::tensor::{Tensor, backend::Backend};

use crate::kernel::check_same_shape;
use crate::precision::to_compute;
use crate::{SdeError, StepSigmas};

/// `lambda(sigma) = ln(1 - sigma) - ln(sigma)`, the half log-SNR of the flow schedule
/// (`-inf` at `sigma = 1`, `+inf` at `sigma = 0`).
///
/// ```
/// assert_eq!(sde_math::solvers::lambda(0.5), 0.0);
/// assert_eq!(sde_math::solvers::lambda(1.0), f64::NEG_INFINITY);
/// ```
pub fn lambda(sigma: f32) -> f64 {
    let s = f64::from(sigma);
    (1.0 - s).ln() - s.ln()
}

/// How DPM-Solver++ forms its second-order term (diffusers' `solver_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DpmSecondOrder {
    /// `x_t = (s_t/s_0) x - a_t (e^{-h} - 1) D0 - 1/2 a_t (e^{-h} - 1) D1` (diffusers' default,
    /// and flow_grpo's `dpm2`).
    #[default]
    Midpoint,
    /// `x_t = (s_t/s_0) x - a_t (e^{-h} - 1) D0 + a_t ((e^{-h} - 1)/h + 1) D1`.
    Heun,
}

/// Multistep DPM-Solver++ (data prediction), order 1 or 2: diffusers'
/// `DPMSolverMultistepScheduler(algorithm_type="dpmsolver++", use_flow_sigmas=True,
/// prediction_type="flow_prediction")` and flow_grpo's `dpm2` solver, which is the same
/// DPM-Solver++(2M) with a DDIM first step.
///
/// With `h = lambda_t - lambda_s0`, `r0 = (lambda_s0 - lambda_s1) / h`, `D0 = m0`,
/// `D1 = (m0 - m1) / r0` and `m_i` the `x0` predictions:
///
/// ```text
/// order 1:  x_t = (sigma_t / sigma_s) x - alpha_t (e^{-h} - 1) m0
/// order 2:  see [`DpmSecondOrder`]
/// ```
///
/// The first step after a (re)start and the final step are first order. At `sigma_s = 1` the
/// first-order step is exactly the Euler/DDIM step (`e^{-h} = 0`), and a history point at
/// `sigma = 1` contributes `D1 = 0`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DpmSolverPP {
    order: usize,
    second_order: DpmSecondOrder,
}

impl DpmSolverPP {
    /// A solver of the given order (1 or 2).
    ///
    /// # Errors
    /// [`SdeError::InvalidParameter`] for any other order.
    pub fn new(order: usize, second_order: DpmSecondOrder) -> Result<Self, SdeError> {
        if !(1..=2).contains(&order) {
            return Err(SdeError::InvalidParameter {
                kernel: "DPM-Solver++",
                name: "order",
                value: order as f64,
                expected: "1 or 2",
            });
        }
        Ok(Self {
            order,
            second_order,
        })
    }

    /// DPM-Solver++(2M), midpoint: the solver diffusers and flow_grpo ship.
    pub fn two_m() -> Self {
        Self {
            order: 2,
            second_order: DpmSecondOrder::Midpoint,
        }
    }

    /// Steps `sigmas[index] -> sigmas[index + 1]`. See [`SolverState`] for the history rules.
    ///
    /// # Errors
    /// Invalid schedule, out-of-range index, shape or dtype problems.
    pub fn step<B: Backend, const D: usize>(
        &self,
        state: &mut SolverState<B, D>,
        sigmas: &[f32],
        index: usize,
        model_output: Tensor<B, D>,
        sample: Tensor<B, D>,
    ) -> Result<Tensor<B, D>, SdeError> {
        let (model_output, sample) = prepare(sigmas, index, model_output, sample)?;
        state.begin(index);
        let sigma_s = sigmas[index];
        let sigma_t = sigmas[index + 1];
        let x0 = sample
            .clone()
            .sub(model_output.mul_scalar(f64::from(sigma_s)));
        state.push(index, x0.clone(), self.order);

        let last = index + 2 == sigmas.len();
        let order = if self.order == 1 || state.lower_order_nums < 1 || last {
            1
        } else {
            2
        };
        let (ls, lt) = (lambda(sigma_s), lambda(sigma_t));
        let h = lt - ls;
        let alpha_t = 1.0 - f64::from(sigma_t);
        let em1 = (-h).exp() - 1.0;
        let c_x = f64::from(sigma_t) / f64::from(sigma_s);
        let out = if order == 1 {
            sample.mul_scalar(c_x).sub(x0.mul_scalar(alpha_t * em1))
        } else {
            let m1 = state.history[state.history.len() - 2].1.clone();
            let h0 = ls - lambda(sigmas[index - 1]);
            let inv_r0 = h / h0; // 1 / r0; 0 when lambda_s1 = -inf
            // x_t = c_x x + c0 m0 + c1 (m0 - m1) / r0
            let c0 = -alpha_t * em1;
            let c1 = match self.second_order {
                DpmSecondOrder::Midpoint => -0.5 * alpha_t * em1,
                DpmSecondOrder::Heun => alpha_t * (em1 / h + 1.0),
            };
            let d1 = x0.clone().sub(m1).mul_scalar(inv_r0);
            sample
                .mul_scalar(c_x)
                .add(x0.mul_scalar(c0))
                .add(d1.mul_scalar(c1))
        };
        state.finish(index, None, order, self.order);
        Ok(out)
    }
}

/// Which UniPC variant (`B(h)` in the paper; diffusers' `solver_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UniPcVariant {
    /// `B(h) = h` (UniPC-bh1).
    Bh1,
    /// `B(h) = e^h - 1` (UniPC-bh2, diffusers' default).
    #[default]
    Bh2,
}

/// UniPC (unified predictor-corrector), data prediction, flow mode: diffusers'
/// `UniPCMultistepScheduler(use_flow_sigmas=True, prediction_type="flow_prediction",
/// predict_x0=True, lower_order_final=True)`.
///
/// Each step first *corrects* the incoming sample with the new model output (UniC, when the
/// previous step was a UniPC step of this state), then *predicts* the next sample (UniP).
/// Order `p` uses `p - 1` earlier model outputs; the order warms up from 1 after every
/// (re)start and drops to 1 for the final step. The model output is converted to `x0` with
/// the *uncorrected* sample, exactly as diffusers does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UniPc {
    order: usize,
    variant: UniPcVariant,
    corrector: bool,
}

impl UniPc {
    /// A UniPC solver of order 1 to 3, with or without the corrector.
    ///
    /// # Errors
    /// [`SdeError::InvalidParameter`] for an order outside `1..=3`.
    pub fn new(order: usize, variant: UniPcVariant, corrector: bool) -> Result<Self, SdeError> {
        if !(1..=3).contains(&order) {
            return Err(SdeError::InvalidParameter {
                kernel: "UniPC",
                name: "order",
                value: order as f64,
                expected: "1, 2 or 3",
            });
        }
        Ok(Self {
            order,
            variant,
            corrector,
        })
    }

    /// UniPC-bh2, order 2, with corrector: diffusers' default configuration.
    pub fn bh2() -> Self {
        Self {
            order: 2,
            variant: UniPcVariant::Bh2,
            corrector: true,
        }
    }

    /// Steps `sigmas[index] -> sigmas[index + 1]`. See [`SolverState`] for the history rules.
    ///
    /// # Errors
    /// Invalid schedule, out-of-range index, shape or dtype problems.
    pub fn step<B: Backend, const D: usize>(
        &self,
        state: &mut SolverState<B, D>,
        sigmas: &[f32],
        index: usize,
        model_output: Tensor<B, D>,
        sample: Tensor<B, D>,
    ) -> Result<Tensor<B, D>, SdeError> {
        let (model_output, sample) = prepare(sigmas, index, model_output, sample)?;
        state.begin(index);
        let sigma_s = sigmas[index];
        let x0 = sample
            .clone()
            .sub(model_output.mul_scalar(f64::from(sigma_s)));

        // UniC: correct this sample using the previous step's base sample and history.
        let sample = match (&state.last_sample, self.corrector) {
            (Some(last_sample), true) if index > 0 => {
                let order = state.this_order;
                self.correct(
                    sigmas,
                    index,
                    &state.history,
                    last_sample.clone(),
                    x0.clone(),
                    order,
                )
            }
            _ => sample,
        };

        state.push(index, x0, self.order);
        let remaining = sigmas.len() - 1 - index; // steps left including this one
        let order = self.order.min(remaining).min(state.lower_order_nums + 1);

        let out = self.predict(sigmas, index, &state.history, sample.clone(), order);
        state.finish(index, Some(sample), order, self.order);
        Ok(out)
    }

    /// `(h_phi_1, B_h, b)` for a step of size `h` and order `p` (diffusers' UniPC coefficients).
    fn coefficients(&self, h: f64, order: usize) -> (f64, f64, Vec<f64>) {
        let hh = -h; // data prediction
        let h_phi_1 = hh.exp_m1();
        let b_h = match self.variant {
            UniPcVariant::Bh1 => hh,
            UniPcVariant::Bh2 => hh.exp_m1(),
        };
        let mut h_phi_k = h_phi_1 / hh - 1.0;
        let mut factorial = 1.0;
        let mut b = Vec::with_capacity(order);
        for i in 1..=order {
            b.push(h_phi_k * factorial / b_h);
            factorial *= (i + 1) as f64;
            h_phi_k = h_phi_k / hh - 1.0 / factorial;
        }
        (h_phi_1, b_h, b)
    }

    /// UniP: predict `x_{index+1}` from `x_index` with order `order`.
    fn predict<B: Backend, const D: usize>(
        &self,
        sigmas: &[f32],
        index: usize,
        history: &VecDeque<(usize, Tensor<B, D>)>,
        x: Tensor<B, D>,
        order: usize,
    ) -> Tensor<B, D> {
        let (sigma_s0, sigma_t) = (sigmas[index], sigmas[index + 1]);
        let (l_s0, l_t) = (lambda(sigma_s0), lambda(sigma_t));
        let h = l_t - l_s0;
        let m0 = history[history.len() - 1].1.clone();
        // rk for the earlier points; a point at sigma = 1 (lambda = -inf) has D1 = 0 and is dropped.
        let points = usable_points(sigmas, index, order - 1, l_s0, h);
        let order = points.len() + 1;
        let (h_phi_1, b_h, b) = self.coefficients(h, order);
        let alpha_t = 1.0 - f64::from(sigma_t);
        let mut out = x
            .mul_scalar(f64::from(sigma_t) / f64::from(sigma_s0))
            .sub(m0.clone().mul_scalar(alpha_t * h_phi_1));
        if order >= 2 {
            let rks: Vec<f64> = points.iter().map(|p| p.1).collect();
            let rhos = if order == 2 {
                vec![0.5]
            } else {
                let r = vandermonde(&rks_with_one(&rks), order);
                solve(&principal(&r, order - 1), &b[..order - 1])
            };
            for ((k, rk), rho) in points.iter().zip(rhos) {
                let mk = history[history.len() - 1 - k].1.clone();
                let d1 = mk.sub(m0.clone()).mul_scalar(1.0 / rk);
                out = out.sub(d1.mul_scalar(alpha_t * b_h * rho));
            }
        }
        out
    }

    /// UniC: correct `x_index` (predicted from `last_sample` at `index - 1`) with the model's
    /// `x0` estimate at `index`.
    fn correct<B: Backend, const D: usize>(
        &self,
        sigmas: &[f32],
        index: usize,
        history: &VecDeque<(usize, Tensor<B, D>)>,
        last_sample: Tensor<B, D>,
        model_t: Tensor<B, D>,
        order: usize,
    ) -> Tensor<B, D> {
        let (sigma_s0, sigma_t) = (sigmas[index - 1], sigmas[index]);
        let (l_s0, l_t) = (lambda(sigma_s0), lambda(sigma_t));
        let h = l_t - l_s0;
        let m0 = history[history.len() - 1].1.clone();
        let points = usable_points(sigmas, index - 1, order - 1, l_s0, h);
        let dropped = points.len() + 1 < order;
        let order = points.len() + 1;
        let (h_phi_1, b_h, b) = self.coefficients(h, order);
        let rhos = if order == 1 && !dropped {
            vec![0.5]
        } else {
            let rks: Vec<f64> = points.iter().map(|p| p.1).collect();
            solve(&vandermonde(&rks_with_one(&rks), order), &b)
        };
        let alpha_t = 1.0 - f64::from(sigma_t);
        let mut out = last_sample
            .mul_scalar(f64::from(sigma_t) / f64::from(sigma_s0))
            .sub(m0.clone().mul_scalar(alpha_t * h_phi_1));
        for ((k, rk), rho) in points.iter().zip(&rhos) {
            let mk = history[history.len() - 1 - k].1.clone();
            let d1 = mk.sub(m0.clone()).mul_scalar(1.0 / rk);
            out = out.sub(d1.mul_scalar(alpha_t * b_h * rho));
        }
        let d1_t = model_t.sub(m0);
        out.sub(d1_t.mul_scalar(alpha_t * b_h * rhos[rhos.len() - 1]))
    }
}

/// The earlier history points `k = 1..=wanted` (at schedule index `base - k`) with their
/// `rk = (lambda_k - lambda_base) / h`, stopping at the first one with a non-finite `rk`
/// (a point at `sigma = 1`, whose contribution vanishes in the limit).
fn usable_points(
    sigmas: &[f32],
    base: usize,
    wanted: usize,
    l_base: f64,
    h: f64,
) -> Vec<(usize, f64)> {
    let mut points = Vec::with_capacity(wanted);
    for k in 1..=wanted {
        let rk = (lambda(sigmas[base - k]) - l_base) / h;
        if !rk.is_finite() {
            break;
        }
        points.push((k, rk));
    }
    points
}

fn rks_with_one(rks: &[f64]) -> Vec<f64> {
    let mut v = rks.to_vec();
    v.push(1.0);
    v
}

/// `R[i][j] = rks[j]^i` for `i < order` (diffusers' `R`).
fn vandermonde(rks: &[f64], order: usize) -> Vec<Vec<f64>> {
    (0..order)
        .map(|i| rks.iter().map(|r| r.powi(i as i32)).collect())
        .collect()
}

fn principal(m: &[Vec<f64>], n: usize) -> Vec<Vec<f64>> {
    m[..n].iter().map(|row| row[..n].to_vec()).collect()
}

/// Solves the small dense system `a x = b` by Gaussian elimination with partial pivoting.
fn solve(a: &[Vec<f64>], b: &[f64]) -> Vec<f64> {
    let n = b.len();
    let mut m: Vec<Vec<f64>> = a
        .iter()
        .zip(b)
        .map(|(row, &bi)| {
            let mut r = row[..n].to_vec();
            r.push(bi);
            r
        })
        .collect();
    for col in 0..n {
        let pivot = (col..n)
            .max_by(|&i, &j| m[i][col].abs().total_cmp(&m[j][col].abs()))
            .unwrap_or(col);
        m.swap(col, pivot);
        let (top, rest) = m.split_at_mut(col + 1);
        let pivot_row = &top[col];
        for row in rest.iter_mut() {
            let f = row[col] / pivot_row[col];
            for (r, p) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                *r -= f * p;
            }
        }
    }
    let mut x = vec![0.0; n];
    for i in (0..n).rev() {
        let s: f64 = (i + 1..n).map(|k| m[i][k] * x[k]).sum();
        x[i] = (m[i][n] - s) / m[i][i];
    }
    x
}

/// The mutable state of a multistep solver: earlier `x0` predictions and, for UniPC, the base
/// sample of the previous step (for its corrector).
///
/// Create one per trajectory batch with [`SolverState::new`]; it resets itself when a step's
/// index does not follow the previous one, and [`SolverState::reset`] clears it explicitly.
#[derive(Debug, Clone)]
pub struct SolverState<B: Backend, const D: usize> {
    history: VecDeque<(usize, Tensor<B, D>)>,
    last_sample: Option<Tensor<B, D>>,
    last_index: Option<usize>,
    lower_order_nums: usize,
    this_order: usize,
}

impl<B: Backend, const D: usize> Default for SolverState<B, D> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B: Backend, const D: usize> SolverState<B, D> {
    /// An empty state: the next step is first order.
    pub fn new() -> Self {
        Self {
            history: VecDeque::new(),
            last_sample: None,
            last_index: None,
            lower_order_nums: 0,
            this_order: 0,
        }
    }

    /// Forgets all history (call after anything but this solver moved the sample).
    pub fn reset(&mut self) {
        *self = Self::new();
    }

    /// How many earlier model outputs the state holds.
    pub fn history_len(&self) -> usize {
        self.history.len()
    }

    /// The index of the last step this state took, if any.
    pub fn last_index(&self) -> Option<usize> {
        self.last_index
    }

    fn begin(&mut self, index: usize) {
        if self.last_index.is_some_and(|last| index != last + 1) {
            self.reset();
        }
    }

    fn push(&mut self, index: usize, x0: Tensor<B, D>, order: usize) {
        self.history.push_back((index, x0));
        while self.history.len() > order {
            self.history.pop_front();
        }
    }

    fn finish(
        &mut self,
        index: usize,
        base: Option<Tensor<B, D>>,
        this_order: usize,
        order: usize,
    ) {
        self.last_sample = base;
        self.last_index = Some(index);
        self.this_order = this_order;
        if self.lower_order_nums < order {
            self.lower_order_nums += 1;
        }
    }
}

/// Validates the schedule and index and brings the tensors to the compute dtype.
fn prepare<B: Backend, const D: usize>(
    sigmas: &[f32],
    index: usize,
    model_output: Tensor<B, D>,
    sample: Tensor<B, D>,
) -> Result<(Tensor<B, D>, Tensor<B, D>), SdeError> {
    validate_schedule(sigmas)?;
    StepSigmas::from_schedule(sigmas, index)?;
    check_same_shape("model_output", &model_output, &sample)?;
    Ok((
        to_compute(model_output, "model_output")?,
        to_compute(sample, "sample")?,
    ))
}

/// Checks that a solver schedule is strictly decreasing, within `[0, 1]`, and ends at `0`.
///
/// # Errors
/// [`SdeError::InvalidSchedule`] naming the problem.
///
/// ```
/// use sde_math::solvers::validate_schedule;
/// assert!(validate_schedule(&[1.0, 0.5, 0.0]).is_ok());
/// assert!(validate_schedule(&[1.0, 0.5]).is_err()); // must end at 0
/// assert!(validate_schedule(&[0.5, 0.5, 0.0]).is_err()); // not strictly decreasing
/// ```
pub fn validate_schedule(sigmas: &[f32]) -> Result<(), SdeError> {
    let fail = |reason| {
        Err(SdeError::InvalidSchedule {
            reason,
            sigmas: sigmas.to_vec(),
        })
    };
    if sigmas.len() < 2 {
        return fail("fewer than two sigmas");
    }
    if sigmas
        .iter()
        .any(|s| !s.is_finite() || *s < 0.0 || *s > 1.0)
    {
        return fail("a sigma is outside [0, 1] or not finite");
    }
    if sigmas.windows(2).any(|w| w[1] >= w[0]) {
        return fail("not strictly decreasing");
    }
    if sigmas[sigmas.len() - 1] != 0.0 {
        return fail("the last sigma is not 0");
    }
    Ok(())
}

/// The deterministic solver used on the steps that are not stochastic.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OdeSolver {
    /// The Euler step `x + v dt` (the `eta = 0` collapse of the SDE kernels). Stateless.
    Euler,
    /// Multistep DPM-Solver++.
    DpmSolverPP(DpmSolverPP),
    /// UniPC predictor-corrector.
    UniPc(UniPc),
}

impl OdeSolver {
    /// Steps `sigmas[index] -> sigmas[index + 1]` with this solver.
    ///
    /// # Errors
    /// As the chosen solver's `step`.
    pub fn step<B: Backend, const D: usize>(
        &self,
        state: &mut SolverState<B, D>,
        sigmas: &[f32],
        index: usize,
        model_output: Tensor<B, D>,
        sample: Tensor<B, D>,
    ) -> Result<Tensor<B, D>, SdeError> {
        match self {
            OdeSolver::Euler => {
                validate_schedule(sigmas)?;
                let at = StepSigmas::from_schedule(sigmas, index)?;
                state.reset();
                crate::euler_step(&at.into(), model_output, sample)
            }
            OdeSolver::DpmSolverPP(s) => s.step(state, sigmas, index, model_output, sample),
            OdeSolver::UniPc(s) => s.step(state, sigmas, index, model_output, sample),
        }
    }
}
