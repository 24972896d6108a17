//! The FlowMatch sigma schedule policy: a validated (grid, shift, stretch) triple loaded once
//! per actor from the checkpoint's scheduler config, evaluated per request.

use std::path::Path;
use std::sync::Arc;

use crate::config::{SchedulerConfig, normalize_terminal};
use crate::error::{ConfigProblem, ScheduleError};
use crate::grid::{self, BaseGrid, Compat, ResolvedShift};
use crate::shift::{ComputeMu, Flux2KleinMu, LinearMu, MuInput, Shift, TimeShift};
use crate::sigmas::{Schedule, Sigmas};

/// How a model family's sigma schedule is made: a base grid, a time shift (static, or dynamic
/// with a per-model [`ComputeMu`]), an optional `shift_terminal` stretch and the training
/// timestep count `T`.
///
/// Built once (from a checkpoint config or a named preset), validated when built, and then a
/// pure function of `(height, width, steps)` through [`SchedulePolicy::sample_sigmas`]. Sigmas
/// are `f32`, end with an appended 0, and timesteps are `T * sigma` in `f32`.
///
/// ```
/// use schedule::SchedulePolicy;
/// let qwen = SchedulePolicy::qwen_image();
/// let s = qwen.sample_sigmas(384, 384, 12).unwrap();
/// assert_eq!(s.sigmas.num_steps(), 12);
/// assert_eq!(s.sigmas.as_slice()[0], 1.0);
/// // the shift_terminal stretch puts the last non-zero sigma at 0.02
/// assert!((s.sigmas.as_slice()[11] - 0.02).abs() < 1e-6);
/// assert_eq!(s.timesteps[0], 1000.0);
/// ```
#[derive(Debug, Clone)]
pub struct SchedulePolicy {
    grid: BaseGrid,
    shift: Shift,
    shift_terminal: Option<f64>,
    num_train_timesteps: u32,
    compat: Compat,
}

impl SchedulePolicy {
    /// Builds and validates a policy.
    ///
    /// `shift_terminal` follows diffusers' truthiness: `Some(0.0)` means disabled and is stored
    /// as `None`; otherwise it must lie in `(0, 1)`.
    ///
    /// # Errors
    /// [`ScheduleError::InvalidConfig`] listing every problem: a static shift that is not
    /// finite and `> 0`, a `shift_terminal` outside `(0, 1)`, `T = 0`, or a grid that cannot
    /// take the setting (DanceGRPO's has no stretch).
    ///
    /// ```
    /// use schedule::{BaseGrid, SchedulePolicy, Shift};
    /// let p = SchedulePolicy::new(BaseGrid::FlowMatch, Shift::Static { shift: 3.0 }, Some(0.0), 1000).unwrap();
    /// assert_eq!(p.shift_terminal(), None);
    /// let bad = SchedulePolicy::new(BaseGrid::Dance, Shift::Static { shift: -1.0 }, Some(0.5), 0);
    /// assert!(bad.unwrap_err().to_string().contains("3 problem(s)"));
    /// ```
    pub fn new(
        grid: BaseGrid,
        shift: Shift,
        shift_terminal: Option<f64>,
        num_train_timesteps: u32,
    ) -> Result<Self, ScheduleError> {
        let shift_terminal = normalize_terminal(shift_terminal);
        let mut problems = Vec::new();
        if let Shift::Static { shift } = shift
            && !(shift.is_finite() && shift > 0.0)
        {
            problems.push(ConfigProblem::OutOfRange {
                key: "shift",
                value: shift,
                expected: "a finite value > 0",
            });
        }
        if let Some(t) = shift_terminal
            && !(t > 0.0 && t < 1.0)
        {
            problems.push(ConfigProblem::OutOfRange {
                key: "shift_terminal",
                value: t,
                expected: "a value in (0, 1), or null / 0 to disable",
            });
        }
        if num_train_timesteps == 0 {
            problems.push(ConfigProblem::OutOfRange {
                key: "num_train_timesteps",
                value: 0.0,
                expected: "an integer >= 1",
            });
        }
        if shift_terminal.is_some() && grid == BaseGrid::Dance {
            problems.push(ConfigProblem::GridConflict {
                grid: grid.name(),
                setting: "shift_terminal",
                why: "DanceGRPO's grid already ends at 0 and has no terminal stretch",
            });
        }
        if problems.is_empty() {
            Ok(Self {
                grid,
                shift,
                shift_terminal,
                num_train_timesteps,
                compat: Compat::Current,
            })
        } else {
            Err(ScheduleError::InvalidConfig { problems })
        }
    }

    /// The policy a diffusers scheduler config describes, with the default `compute_mu`
    /// (diffusers' linear `calculate_shift` over `(H/16) * (W/16)` packed tokens) when
    /// `use_dynamic_shifting` is on. `FlowMatchEulerDiscreteScheduler` gives the
    /// [`BaseGrid::FlowMatch`] grid, `UniPCMultistepScheduler` with `use_flow_sigmas` the
    /// [`BaseGrid::UniPcFlow`] grid.
    ///
    /// # Errors
    /// [`ScheduleError::InvalidConfig`] listing every problem, including diffusers options this
    /// crate does not reproduce (karras / exponential / beta sigmas, `invert_sigmas`, UniPC
    /// without flow sigmas or with `final_sigmas_type = "sigma_min"`).
    ///
    /// ```
    /// use schedule::{SchedulePolicy, SchedulerConfig};
    /// let cfg = SchedulerConfig::from_json_str(r#"{"_class_name": "FlowMatchEulerDiscreteScheduler",
    ///     "shift": 3.0, "use_karras_sigmas": true, "time_shift_type": "cubic"}"#).unwrap();
    /// let err = SchedulePolicy::from_config(&cfg).unwrap_err().to_string();
    /// assert!(err.contains("use_karras_sigmas") && err.contains("cubic"));
    /// ```
    pub fn from_config(cfg: &SchedulerConfig) -> Result<Self, ScheduleError> {
        let mut problems = Vec::new();
        let unsupported = |key: &'static str, on: bool, why: &'static str, out: &mut Vec<_>| {
            if on {
                out.push(ConfigProblem::Unsupported {
                    key,
                    value: "true".to_owned(),
                    why,
                });
            }
        };
        unsupported(
            "use_karras_sigmas",
            cfg.use_karras_sigmas,
            "no FlowGRPO-family recipe uses it",
            &mut problems,
        );
        unsupported(
            "use_exponential_sigmas",
            cfg.use_exponential_sigmas,
            "no FlowGRPO-family recipe uses it",
            &mut problems,
        );
        unsupported(
            "use_beta_sigmas",
            cfg.use_beta_sigmas,
            "no FlowGRPO-family recipe uses it",
            &mut problems,
        );
        unsupported(
            "invert_sigmas",
            cfg.invert_sigmas,
            "Mochi's inverted schedule runs from 0 to 1",
            &mut problems,
        );
        let kind = match cfg.time_shift_type.as_str() {
            "exponential" => TimeShift::Exponential,
            "linear" => TimeShift::Linear,
            other => {
                problems.push(ConfigProblem::UnknownTimeShift {
                    value: other.to_owned(),
                });
                TimeShift::Exponential
            }
        };
        let (grid, static_shift) = match cfg.class_name.as_str() {
            "FlowMatchEulerDiscreteScheduler" => {
                for (key, value) in &cfg.other {
                    match key.as_str() {
                        "_diffusers_version" | "_name_or_path" => {}
                        "stochastic_sampling" if value == false || value.is_null() => {}
                        "stochastic_sampling" => problems.push(ConfigProblem::UnknownKey {
                            key: key.clone(),
                            value: value.to_string(),
                            why: "diffusers' stochastic Euler step is not implemented; the trainer's kernels choose the stochastic steps",
                        }),
                        _ => problems.push(ConfigProblem::UnknownKey {
                            key: key.clone(),
                            value: value.to_string(),
                            why: "no such key in a FlowMatchEulerDiscreteScheduler this crate implements",
                        }),
                    }
                }
                foreign_keys(
                    cfg,
                    UNIPC_ONLY_KEYS,
                    "a UniPCMultistepScheduler key; FlowMatchEulerDiscreteScheduler has none",
                    &mut problems,
                );
                (BaseGrid::FlowMatch, cfg.shift)
            }
            "UniPCMultistepScheduler" => {
                unsupported(
                    "use_flow_sigmas",
                    !cfg.use_flow_sigmas,
                    "only UniPC's flow-matching grid is a sigma-in-[0, 1] schedule; set use_flow_sigmas",
                    &mut problems,
                );
                if cfg.final_sigmas_type != "zero" {
                    problems.push(ConfigProblem::Unsupported {
                        key: "final_sigmas_type",
                        value: format!("{:?}", cfg.final_sigmas_type),
                        why: "the schedule must end at sigma = 0 (\"zero\")",
                    });
                }
                unsupported(
                    "use_dynamic_shifting",
                    cfg.use_dynamic_shifting,
                    "UniPC takes mu from the pipeline; build the policy with SchedulePolicy::new and an explicit ComputeMu",
                    &mut problems,
                );
                for (key, value) in &cfg.other {
                    if let Some(problem) = unipc_key_problem(key, value) {
                        problems.push(problem);
                    }
                }
                foreign_keys(
                    cfg,
                    FLOW_MATCH_ONLY_KEYS,
                    "a FlowMatchEulerDiscreteScheduler key; UniPCMultistepScheduler has none",
                    &mut problems,
                );
                (BaseGrid::UniPcFlow, cfg.flow_shift)
            }
            other => {
                problems.push(ConfigProblem::UnknownScheduler {
                    value: other.to_owned(),
                });
                (BaseGrid::FlowMatch, cfg.shift)
            }
        };
        let shift = if cfg.use_dynamic_shifting {
            let mut need = |key: &'static str, present: bool| {
                if !present {
                    problems.push(ConfigProblem::Missing { key });
                }
            };
            need("base_shift", cfg.base_shift.is_some());
            need("max_shift", cfg.max_shift.is_some());
            need("base_image_seq_len", cfg.base_image_seq_len.is_some());
            need("max_image_seq_len", cfg.max_image_seq_len.is_some());
            let linear = LinearMu {
                base_shift: cfg.base_shift.unwrap_or(f64::NAN),
                max_shift: cfg.max_shift.unwrap_or(f64::NAN),
                base_seq_len: cfg.base_image_seq_len.unwrap_or(0),
                max_seq_len: cfg.max_image_seq_len.unwrap_or(0),
                pixels_per_token: 16,
            };
            if linear.base_seq_len == linear.max_seq_len && cfg.base_image_seq_len.is_some() {
                problems.push(ConfigProblem::OutOfRange {
                    key: "max_image_seq_len",
                    value: linear.max_seq_len as f64,
                    expected: "a token count different from base_image_seq_len",
                });
            }
            Shift::Dynamic {
                compute_mu: Arc::new(linear),
                kind,
            }
        } else {
            Shift::Static {
                shift: static_shift,
            }
        };
        match Self::new(grid, shift, cfg.shift_terminal, cfg.num_train_timesteps) {
            Ok(policy) if problems.is_empty() => Ok(policy),
            Ok(_) => Err(ScheduleError::InvalidConfig { problems }),
            Err(ScheduleError::InvalidConfig { problems: more }) => {
                problems.extend(more);
                Err(ScheduleError::InvalidConfig { problems })
            }
            Err(other) => Err(other),
        }
    }

    /// Reads a checkpoint's `scheduler/scheduler_config.json` (or that directory) and builds its
    /// policy; see [`SchedulePolicy::from_config`].
    ///
    /// # Errors
    /// IO, JSON and configuration errors, naming the file or listing every problem.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ScheduleError> {
        Self::from_config(&SchedulerConfig::load(path)?)
    }

    /// Replaces the `mu` rule of a dynamic policy: the per-model-family override point.
    ///
    /// # Errors
    /// [`ScheduleError::InvalidConfig`] when the policy has a static shift (it has no `mu`).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use schedule::{Flux2KleinMu, SchedulePolicy};
    /// let p = SchedulePolicy::flux_1().with_compute_mu(Arc::new(Flux2KleinMu)).unwrap();
    /// assert_ne!(p.sample_sigmas(512, 512, 4).unwrap().mu, SchedulePolicy::flux_1().sample_sigmas(512, 512, 4).unwrap().mu);
    /// assert!(SchedulePolicy::sd3_5().with_compute_mu(Arc::new(Flux2KleinMu)).is_err());
    /// ```
    pub fn with_compute_mu(mut self, rule: Arc<dyn ComputeMu>) -> Result<Self, ScheduleError> {
        match &mut self.shift {
            Shift::Dynamic { compute_mu, .. } => {
                *compute_mu = rule;
                Ok(self)
            }
            Shift::Static { .. } => Err(ScheduleError::InvalidConfig {
                problems: vec![ConfigProblem::Unsupported {
                    key: "use_dynamic_shifting",
                    value: "false".to_owned(),
                    why: "a compute_mu override needs a dynamic shift",
                }],
            }),
        }
    }

    /// The same policy with another reference's arithmetic where releases differ ([`Compat`];
    /// [`Compat::Current`] by default).
    pub fn with_compat(mut self, compat: Compat) -> Self {
        self.compat = compat;
        self
    }

    /// Which reference's arithmetic it reproduces.
    pub fn compat(&self) -> Compat {
        self.compat
    }

    /// The same shift and stretch on another base grid (validated again).
    ///
    /// # Errors
    /// As [`SchedulePolicy::new`].
    pub fn with_grid(self, grid: BaseGrid) -> Result<Self, ScheduleError> {
        Ok(Self::new(
            grid,
            self.shift,
            self.shift_terminal,
            self.num_train_timesteps,
        )?
        .with_compat(self.compat))
    }

    /// Stable Diffusion 3.5 (Large, Medium): static shift 3.0, `T = 1000`, on the FlowMatch grid
    /// `linspace(1, 1/N, N)`, shifted once. Source: the `scheduler/scheduler_config.json` of
    /// `stabilityai/stable-diffusion-3.5-large` (`FlowMatchEulerDiscreteScheduler`, `shift: 3.0`).
    ///
    /// Note: diffusers' own default `set_timesteps(N)` path (no explicit sigmas) shifts twice
    /// (diffusers #13243), and so do rollouts that use it; replay such trajectories with the
    /// sigmas they shipped, not with this preset.
    pub fn sd3_5() -> Self {
        Self {
            grid: BaseGrid::FlowMatch,
            shift: Shift::Static { shift: 3.0 },
            shift_terminal: None,
            num_train_timesteps: 1000,
            compat: Compat::Current,
        }
    }

    /// Qwen-Image: dynamic exponential shift, `mu` linear between `(256 tokens, 0.5)` and
    /// `(8192 tokens, 0.9)` over `(H/16) * (W/16)` packed tokens, stretched to
    /// `shift_terminal = 0.02`. Source: the `scheduler/scheduler_config.json` of `Qwen/Qwen-Image`
    /// and diffusers' `QwenImagePipeline` (`calculate_shift`, `linspace(1, 1/N, N)`).
    pub fn qwen_image() -> Self {
        Self {
            grid: BaseGrid::FlowMatch,
            shift: Shift::Dynamic {
                compute_mu: Arc::new(LinearMu {
                    base_shift: 0.5,
                    max_shift: 0.9,
                    base_seq_len: 256,
                    max_seq_len: 8192,
                    pixels_per_token: 16,
                }),
                kind: TimeShift::Exponential,
            },
            shift_terminal: Some(0.02),
            num_train_timesteps: 1000,
            compat: Compat::Current,
        }
    }

    /// FLUX.1 (dev, schnell-style configs with dynamic shifting): dynamic exponential shift,
    /// `mu` linear between `(256, 0.5)` and `(4096, 1.15)`. Source: the
    /// `scheduler/scheduler_config.json` of `black-forest-labs/FLUX.1-dev` and diffusers'
    /// `FluxPipeline`.
    pub fn flux_1() -> Self {
        Self {
            grid: BaseGrid::FlowMatch,
            shift: Shift::Dynamic {
                compute_mu: Arc::new(LinearMu {
                    base_shift: 0.5,
                    max_shift: 1.15,
                    base_seq_len: 256,
                    max_seq_len: 4096,
                    pixels_per_token: 16,
                }),
                kind: TimeShift::Exponential,
            },
            shift_terminal: None,
            num_train_timesteps: 1000,
            compat: Compat::Current,
        }
    }

    /// FLUX.2-klein: dynamic exponential shift with [`Flux2KleinMu`] (step-count dependent `mu`).
    /// Source: diffusers' `Flux2KleinPipeline` (`compute_empirical_mu`, `linspace(1, 1/N, N)`).
    pub fn flux_2_klein() -> Self {
        Self {
            grid: BaseGrid::FlowMatch,
            shift: Shift::Dynamic {
                compute_mu: Arc::new(Flux2KleinMu),
                kind: TimeShift::Exponential,
            },
            shift_terminal: None,
            num_train_timesteps: 1000,
            compat: Compat::Current,
        }
    }

    /// DanceGRPO's schedule: `sd3_time_shift(shift, linspace(1, 0, N + 1))`. The shift is a
    /// recipe value (DanceGRPO's `--shift`), so it has no default here. Source:
    /// `fastvideo/train_grpo_flux.py` of DanceGRPO.
    ///
    /// # Errors
    /// [`ScheduleError::InvalidConfig`] unless `shift` is finite and `> 0`.
    pub fn dance_grpo(shift: f64) -> Result<Self, ScheduleError> {
        Self::new(BaseGrid::Dance, Shift::Static { shift }, None, 1000)
    }

    /// The base grid.
    pub fn grid(&self) -> BaseGrid {
        self.grid
    }

    /// The shift.
    pub fn shift(&self) -> &Shift {
        &self.shift
    }

    /// The stretch target, `None` when disabled.
    pub fn shift_terminal(&self) -> Option<f64> {
        self.shift_terminal
    }

    /// `T`, the training timestep count.
    pub fn num_train_timesteps(&self) -> u32 {
        self.num_train_timesteps
    }

    /// The `mu` of a dynamic policy for this geometry (`None` when static).
    pub fn mu(&self, height: u32, width: u32, steps: usize) -> Option<f64> {
        match &self.shift {
            Shift::Static { .. } => None,
            Shift::Dynamic { compute_mu, .. } => Some(compute_mu.mu(MuInput {
                height,
                width,
                steps,
            })),
        }
    }

    /// diffusers 0.35 and 0.36 built UniPC's flow grid without a terminal stretch and with
    /// the exponential shift only: under [`Compat::Diffusers035Numpy1`] a policy asking for
    /// either has no reference to reproduce.
    fn check_unipc_compat(&self) -> Result<(), ScheduleError> {
        if self.compat != Compat::Diffusers035Numpy1 {
            return Ok(());
        }
        let mut problems = Vec::new();
        if self.shift_terminal.is_some() {
            problems.push(ConfigProblem::GridConflict {
                grid: self.grid.name(),
                setting: "shift_terminal under diffusers 0.35 compat",
                why: "UniPC's terminal stretch arrived in diffusers 0.37; use the current compat",
            });
        }
        if let Shift::Dynamic {
            kind: TimeShift::Linear,
            ..
        } = self.shift
        {
            problems.push(ConfigProblem::GridConflict {
                grid: self.grid.name(),
                setting: "time_shift_type = \"linear\" under diffusers 0.35 compat",
                why: "UniPC's dynamic shift was flow_shift = exp(mu) before diffusers 0.37; use the current compat",
            });
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ScheduleError::InvalidConfig { problems })
        }
    }

    /// The schedule for one request. All three arguments are required: a dynamic shift derives
    /// `mu` from them, and a silent default size would mis-derive it for every other size.
    ///
    /// A value that the `f32` shift rounds to at most `1e-6` above 1 (possible at `t = 1` for
    /// some static shifts; the references keep it) is clamped to exactly 1.
    ///
    /// # Errors
    /// [`ScheduleError::InvalidGeometry`] for a zero argument; [`ScheduleError::InvalidSigmas`]
    /// when the result is not a valid schedule (e.g. `steps = 1` with a `shift_terminal`
    /// stretch, which divides by zero in the reference too, or a non-positive linear `mu`);
    /// [`ScheduleError::InvalidConfig`] for UniPC's stretch or linear shift under
    /// [`Compat::Diffusers035Numpy1`], whose releases had neither.
    pub fn sample_sigmas(
        &self,
        height: u32,
        width: u32,
        steps: usize,
    ) -> Result<Schedule, ScheduleError> {
        if height == 0 || width == 0 || steps == 0 {
            return Err(ScheduleError::InvalidGeometry {
                height,
                width,
                steps,
            });
        }
        let mu = self.mu(height, width, steps);
        let resolved = match (&self.shift, mu) {
            (Shift::Static { shift }, _) => ResolvedShift::Static(*shift),
            (Shift::Dynamic { kind, .. }, Some(mu)) => ResolvedShift::Dynamic { mu, kind: *kind },
            (Shift::Dynamic { .. }, None) => unreachable!("a dynamic shift always has a mu"),
        };
        let mut raw = match self.grid {
            BaseGrid::FlowMatch => {
                grid::flow_match(steps, &resolved, self.shift_terminal, self.compat)
            }
            BaseGrid::Dance => grid::dance(steps, &resolved),
            BaseGrid::FlowMatchSchedulerDefault => grid::flow_match_scheduler_default(
                steps,
                self.num_train_timesteps,
                &resolved,
                self.shift_terminal,
            ),
            BaseGrid::UniPcFlow => {
                self.check_unipc_compat()?;
                grid::unipc_flow(
                    steps,
                    self.num_train_timesteps,
                    &resolved,
                    self.shift_terminal,
                    self.compat,
                )
            }
        };
        // t = 1 shifted in f32 can round one ulp above 1 (e.g. s / (1 + (s - 1)) for some s); the
        // reference keeps that value, a schedule in [0, 1] cannot: clamp it to exactly 1.
        for v in raw.iter_mut().filter(|v| **v > 1.0 && **v <= 1.0 + 1e-6) {
            *v = 1.0;
        }
        let sigmas = Sigmas::new(raw)?;
        let t = self.num_train_timesteps as f32;
        let timesteps = sigmas.as_slice()[..steps].iter().map(|s| s * t).collect();
        Ok(Schedule {
            sigmas,
            timesteps,
            mu,
        })
    }
}

/// Keys of a `UniPCMultistepScheduler` config that do not change its flow grid, each with why
/// it is inert there.
pub const UNIPC_INERT_KEYS: &[(&str, &str)] = &[
    ("_diffusers_version", "the writer's version"),
    ("_name_or_path", "where the writer loaded it from"),
    ("beta_start", "the flow grid does not read the betas"),
    ("beta_end", "the flow grid does not read the betas"),
    ("beta_schedule", "the flow grid does not read the betas"),
    ("trained_betas", "the flow grid does not read the betas"),
    (
        "rescale_betas_zero_snr",
        "the flow grid does not read the betas",
    ),
    (
        "timestep_spacing",
        "the flow grid's timesteps are T * sigma",
    ),
    ("steps_offset", "the flow grid's timesteps are T * sigma"),
    (
        "sigma_min",
        "read only by the Karras / exponential / beta grids",
    ),
    (
        "sigma_max",
        "read only by the Karras / exponential / beta grids",
    ),
    (
        "dynamic_thresholding_ratio",
        "read only with thresholding, which must be off",
    ),
    (
        "sample_max_value",
        "read only with thresholding, which must be off",
    ),
];

/// Why a key of a `UniPCMultistepScheduler` config is refused, `None` when it is inert
/// ([`UNIPC_INERT_KEYS`]) or describes the sampler flowrl's UniPC is
/// (`sampling.solver = "unipc_bh2"`: flow prediction, data prediction, bh2, order 2 with the
/// corrector on every step, the last step at order 1, no thresholding). A file describing
/// another sampler is refused rather than replaced by that one without a word.
fn unipc_key_problem(key: &str, value: &serde_json::Value) -> Option<ConfigProblem> {
    if UNIPC_INERT_KEYS.iter().any(|(k, _)| *k == key) {
        return None;
    }
    let ours = match key {
        "prediction_type" => value == "flow_prediction",
        "solver_order" => value.as_u64() == Some(2),
        // diffusers registers these three as bh2
        "solver_type" => ["bh2", "midpoint", "heun", "logrho"]
            .iter()
            .any(|v| value == *v),
        "predict_x0" | "lower_order_final" => value == true,
        "thresholding" => value == false,
        "disable_corrector" => value.as_array().is_some_and(Vec::is_empty),
        "solver_p" => value.is_null(),
        _ => {
            return Some(ConfigProblem::UnknownKey {
                key: key.to_owned(),
                value: value.to_string(),
                why: "no such key in a UniPCMultistepScheduler this crate implements",
            });
        }
    };
    (!ours).then(|| ConfigProblem::UnknownKey {
        key: key.to_owned(),
        value: value.to_string(),
        why: "flowrl's UniPC (sampling.solver = \"unipc_bh2\") is flow_prediction, predict_x0, bh2, \
              solver_order 2 with the corrector on every step, lower_order_final, no thresholding; \
              a file describing another sampler is refused",
    })
}

/// Typed keys of [`SchedulerConfig`] that only `UniPCMultistepScheduler` has.
const UNIPC_ONLY_KEYS: &[&str] = &["use_flow_sigmas", "flow_shift", "final_sigmas_type"];

/// Typed keys of [`SchedulerConfig`] that only `FlowMatchEulerDiscreteScheduler` has.
const FLOW_MATCH_ONLY_KEYS: &[&str] = &[
    "shift",
    "base_shift",
    "max_shift",
    "base_image_seq_len",
    "max_image_seq_len",
    "invert_sigmas",
];

/// Refuses each of `keys` that the file wrote (diffusers would drop it with a warning).
fn foreign_keys(
    cfg: &SchedulerConfig,
    keys: &[&str],
    why: &'static str,
    problems: &mut Vec<ConfigProblem>,
) {
    for key in keys {
        if let Some(value) = cfg.written.get(*key) {
            problems.push(ConfigProblem::UnknownKey {
                key: (*key).to_owned(),
                value: value.to_string(),
                why,
            });
        }
    }
}
