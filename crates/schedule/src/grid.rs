//! The base grids used in the field and the exact floating-point arithmetic each reference
//! evaluates them with.
//!
//! Sigmas are compared across engines bit for bit (their timesteps, `1000 * sigma`, amplify a
//! one-ulp sigma difference 1000-fold), so each grid reproduces its reference's operations,
//! their order and their precision:
//!
//! * [`BaseGrid::FlowMatch`]: diffusers pipelines build `numpy.linspace(1, 1/N, N)` in `f64`,
//!   `FlowMatchEulerDiscreteScheduler.set_timesteps(sigmas=...)` casts it to `f32` and shifts it
//!   with `f32` numpy arithmetic (the terminal stretch's scalar scale follows numpy 2's
//!   promotion by default, numpy 1.x's under [`Compat::Diffusers035Numpy1`]; see
//!   [`flow_match`]).
//! * [`BaseGrid::Dance`]: DanceGRPO's `sd3_time_shift(shift, torch.linspace(1, 0, N + 1))`, all
//!   in `f32` torch arithmetic. `torch.linspace` on an AVX2/AVX512 CPU evaluates
//!   `start + step * i` with a fused multiply-add (a build without AVX2 does not, and differs by
//!   one ulp at some indices); this crate follows the AVX2 build.
//! * [`BaseGrid::UniPcFlow`]: `UniPCMultistepScheduler.set_timesteps` with `use_flow_sigmas`,
//!   in `f64` numpy arithmetic, rounded to `f32` once at the end; the grid of diffusers 0.37+
//!   by default, 0.35's and 0.36's under [`Compat::Diffusers035Numpy1`].

use crate::shift::TimeShift;

/// Which reference's arithmetic a schedule reproduces where diffusers and numpy releases
/// differ.
///
/// * The terminal stretch of the FlowMatch grid computes its scale
///   `(1 - t)[-1] / (1 - shift_terminal)` from a numpy `float32` scalar and a Python float:
///   numpy 2 (NEP 50) keeps that in `f32`, numpy 1.x promoted it to `f64`. The two differ by at
///   most one ulp in some sigmas.
/// * UniPC's flow grid: diffusers 0.37+ shifts `linspace(1, 1/T, N + 1)[:-1]` (and nudges a
///   first sigma of 1 down by `1e-6`), and can stretch it to `shift_terminal` or shift it
///   linearly; 0.35 and 0.36 shifted `1 - linspace(1, 1/T, N + 1)`, reversed, without its
///   final zero: another grid, with neither option.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Compat {
    /// The current diffusers release (0.42; UniPC's grid as built since 0.37) under numpy 2:
    /// what users install today.
    #[default]
    Current,
    /// diffusers 0.35 under numpy 1.x (UniPC's grid is also 0.36's).
    Diffusers035Numpy1,
}

impl Compat {
    /// The name the trainer's config uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Compat::Current => "current",
            Compat::Diffusers035Numpy1 => "diffusers_0_35",
        }
    }
}

/// The base grid `t_0 > t_1 > ...` that a time shift is applied to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaseGrid {
    /// diffusers' FlowMatch pipelines (FLUX.1, FLUX.2, Qwen-Image, SD3 with explicit sigmas):
    /// `t = linspace(1, 1/N, N)`, shifted, then `0` appended. Starts at `sigma = 1`.
    FlowMatch,
    /// UniPC's flow grid (`use_flow_sigmas`), then `0` appended; `T = num_train_timesteps`.
    /// diffusers 0.37+: `t = linspace(1, 1/T, N + 1)[:-1]`, shifted, optionally stretched to
    /// `shift_terminal`, a first value of 1 lowered by `1e-6`; diffusers 0.35 and 0.36:
    /// `t = 1 - linspace(1, 1/T, N + 1)` reversed, shifted,
    /// its final (zero) entry dropped, starting at `shift(1 - 1/T)` ([`Compat`]). Starts below 1
    /// either way.
    UniPcFlow,
    /// DanceGRPO: `t = linspace(1, 0, N + 1)`, shifted (its last value is already 0).
    Dance,
    /// diffusers' own `FlowMatchEulerDiscreteScheduler.set_timesteps(N)` without explicit
    /// sigmas (SD3's pipeline and reference sampler take this path): the grid runs between the
    /// end points the scheduler's constructor already shifted, `linspace(1, shift(1/T), N)`,
    /// and is shifted again, so a static shift applies twice at the low end (diffusers
    /// #13243), in `f64`, rounded to `f32` once. A named compatibility mode for trajectories
    /// sampled that way; [`BaseGrid::FlowMatch`] shifts once, as the seed asks.
    FlowMatchSchedulerDefault,
}

impl BaseGrid {
    /// The grid's name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            BaseGrid::FlowMatch => "FlowMatch",
            BaseGrid::UniPcFlow => "UniPC flow",
            BaseGrid::Dance => "DanceGRPO",
            BaseGrid::FlowMatchSchedulerDefault => "FlowMatch scheduler default",
        }
    }
}

/// The shift to apply, with `mu` already derived.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ResolvedShift {
    Static(f64),
    Dynamic { mu: f64, kind: TimeShift },
}

/// `numpy.linspace(start, stop, num)` in `f64`, operation for operation: `i * step + start`,
/// the last value set to `stop`.
pub(crate) fn numpy_linspace(start: f64, stop: f64, num: usize) -> Vec<f64> {
    if num == 1 {
        return vec![start];
    }
    let step = (stop - start) / (num - 1) as f64;
    let mut y: Vec<f64> = (0..num).map(|i| i as f64 * step + start).collect();
    y[num - 1] = stop;
    y
}

/// `torch.linspace(start, end, steps)` in `f32` as an AVX2/AVX512 build evaluates it:
/// `start + step * i` (fused) below `steps / 2`, `end - step * (steps - 1 - i)` (fused) above.
pub(crate) fn torch_linspace_f32(start: f32, end: f32, steps: usize) -> Vec<f32> {
    if steps == 1 {
        return vec![start];
    }
    let step = (end - start) / (steps - 1) as f32;
    let half = steps / 2;
    (0..steps)
        .map(|i| {
            if i < half {
                step.mul_add(i as f32, start)
            } else {
                (-step).mul_add((steps - 1 - i) as f32, end)
            }
        })
        .collect()
}

/// One shift of an `f32` grid value with `f32` arithmetic, as numpy (FlowMatch) and torch
/// (Dance) evaluate it: the Python-float constants are rounded to `f32` first.
fn shift_f32(t: f32, shift: &ResolvedShift) -> f32 {
    match *shift {
        ResolvedShift::Static(s) => {
            let num = s as f32 * t;
            let den = 1.0f32 + (s - 1.0) as f32 * t;
            num / den
        }
        ResolvedShift::Dynamic { mu, kind } => {
            let c = match kind {
                TimeShift::Exponential => mu.exp() as f32,
                TimeShift::Linear => mu as f32,
            };
            c / (c + (1.0f32 / t - 1.0f32))
        }
    }
}

/// The FlowMatch grid, shifted, stretched to `shift_terminal` if given, with `0` appended.
///
/// diffusers' stretch computes `scale = (1 - t)[-1] / (1 - shift_terminal)` as a numpy scalar
/// operation, which numpy 2 evaluates in `f32` and numpy 1.x in `f64` ([`Compat`]), then
/// divides the `f32` array by it in `f32`.
pub(crate) fn flow_match(
    n: usize,
    shift: &ResolvedShift,
    shift_terminal: Option<f64>,
    compat: Compat,
) -> Vec<f32> {
    let mut t: Vec<f32> = numpy_linspace(1.0, 1.0 / n as f64, n)
        .into_iter()
        .map(|v| shift_f32(v as f32, shift))
        .collect();
    if let Some(term) = shift_terminal {
        let one_minus: Vec<f32> = t.iter().map(|v| 1.0f32 - v).collect();
        let scale = match compat {
            Compat::Current => one_minus[n - 1] / (1.0 - term) as f32,
            Compat::Diffusers035Numpy1 => (f64::from(one_minus[n - 1]) / (1.0 - term)) as f32,
        };
        t = one_minus.iter().map(|o| 1.0f32 - o / scale).collect();
    }
    t.push(0.0);
    t
}

/// diffusers' `set_timesteps(N)` path without sigmas ([`BaseGrid::FlowMatchSchedulerDefault`]):
/// the constructor's end points in `f32` torch arithmetic (`1/T` and `1`, shifted once when
/// the shift is static), `linspace` between them in `f64`, the shift (and stretch) again in
/// `f64`, rounded to `f32` once, `0` appended.
pub(crate) fn flow_match_scheduler_default(
    n: usize,
    num_train_timesteps: u32,
    shift: &ResolvedShift,
    shift_terminal: Option<f64>,
) -> Vec<f32> {
    let t_count = f64::from(num_train_timesteps);
    let first = 1.0f32 / num_train_timesteps as f32;
    let (low, high) = match *shift {
        ResolvedShift::Static(_) => (shift_f32(first, shift), shift_f32(1.0, shift)),
        ResolvedShift::Dynamic { .. } => (first, 1.0f32),
    };
    let mut x: Vec<f64> = numpy_linspace(f64::from(high) * t_count, f64::from(low) * t_count, n)
        .into_iter()
        .map(|t| t / t_count)
        .map(|x| match *shift {
            ResolvedShift::Static(s) => s * x / (1.0 + (s - 1.0) * x),
            ResolvedShift::Dynamic { mu, kind } => {
                let c = match kind {
                    TimeShift::Exponential => mu.exp(),
                    TimeShift::Linear => mu,
                };
                c / (c + (1.0 / x - 1.0))
            }
        })
        .collect();
    if let Some(term) = shift_terminal {
        let scale = (1.0 - x[n - 1]) / (1.0 - term);
        x = x.iter().map(|v| 1.0 - (1.0 - v) / scale).collect();
    }
    let mut out: Vec<f32> = x.into_iter().map(|v| v as f32).collect();
    out.push(0.0);
    out
}

/// DanceGRPO's grid: `N + 1` values, the last one 0.
pub(crate) fn dance(n: usize, shift: &ResolvedShift) -> Vec<f32> {
    torch_linspace_f32(1.0, 0.0, n + 1)
        .into_iter()
        .map(|v| shift_f32(v, shift))
        .collect()
}

/// UniPC's flow grid in `f64`, rounded to `f32` once, with `0` appended ([`Compat`] picks
/// the grid).
///
/// * Current diffusers (0.37+): `t = linspace(1, 1/T, N + 1)[:-1]`, shifted (static:
///   `s t / (1 + (s - 1) t)`; dynamic: `c / (c + 1/t - 1)` with `c = exp(mu)` exponential or
///   `c = mu` linear), stretched to `shift_terminal` if given (`scale = (1 - t)[-1] /
///   (1 - shift_terminal)`, then `t = 1 - (1 - t) / scale`, all in `f64`), a first value
///   within `1e-6` of 1 lowered by `1e-6`.
/// * diffusers 0.35 and 0.36: `t = 1 - linspace(1, 1/T, N + 1)` reversed without its final
///   zero, shifted statically by `s`, or by `exp(mu)` for a dynamic shift. Those releases
///   have neither the stretch nor the linear shift: the policy refuses both under that
///   compat before it gets here.
pub(crate) fn unipc_flow(
    n: usize,
    num_train_timesteps: u32,
    shift: &ResolvedShift,
    shift_terminal: Option<f64>,
    compat: Compat,
) -> Vec<f32> {
    let grid = numpy_linspace(1.0, 1.0 / f64::from(num_train_timesteps), n + 1);
    let static_shift = |s: f64, x: f64| s * x / (1.0 + (s - 1.0) * x);
    let mut out: Vec<f64> = match compat {
        Compat::Current => grid[..n]
            .iter()
            .map(|&x| match *shift {
                ResolvedShift::Static(s) => static_shift(s, x),
                ResolvedShift::Dynamic { mu, kind } => {
                    let c = match kind {
                        TimeShift::Exponential => mu.exp(),
                        TimeShift::Linear => mu,
                    };
                    c / (c + (1.0 / x - 1.0))
                }
            })
            .collect(),
        Compat::Diffusers035Numpy1 => {
            let s = match *shift {
                ResolvedShift::Static(s) => s,
                ResolvedShift::Dynamic { mu, .. } => mu.exp(),
            };
            (0..n).map(|i| static_shift(s, 1.0 - grid[n - i])).collect()
        }
    };
    if let (Compat::Current, Some(term)) = (compat, shift_terminal) {
        let scale = (1.0 - out[n - 1]) / (1.0 - term);
        out = out.iter().map(|v| 1.0 - (1.0 - v) / scale).collect();
    }
    if compat == Compat::Current && (out[0] - 1.0).abs() < 1e-6 {
        out[0] -= 1e-6;
    }
    let mut out: Vec<f32> = out.into_iter().map(|v| v as f32).collect();
    out.push(0.0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numpy_linspace_ends_exactly() {
        let y = numpy_linspace(1.0, 1.0 / 3.0, 3);
        assert_eq!(y[0], 1.0);
        assert_eq!(y[2], 1.0 / 3.0);
    }

    #[test]
    fn torch_linspace_is_symmetric_at_the_ends() {
        let y = torch_linspace_f32(1.0, 0.0, 11);
        assert_eq!(y[0], 1.0);
        assert_eq!(y[10], 0.0);
        assert_eq!(y.len(), 11);
    }

    #[test]
    fn dance_keeps_the_terminal_zero_unshifted() {
        let s = dance(
            4,
            &ResolvedShift::Dynamic {
                mu: 1.0,
                kind: TimeShift::Exponential,
            },
        );
        assert_eq!(*s.last().unwrap(), 0.0);
        assert_eq!(s[0], 1.0);
    }
}
