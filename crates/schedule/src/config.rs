//! A checkpoint's `scheduler/scheduler_config.json`, as diffusers writes it.
//!
//! The keys that shape the sigma schedule are read; every other key is kept in
//! [`SchedulerConfig::other`], and [`SchedulePolicy::from_config`](crate::SchedulePolicy::from_config)
//! refuses, by name, any key a `FlowMatchEulerDiscreteScheduler` config holds that it does not
//! implement. Of a `UniPCMultistepScheduler` config it accepts the keys that do not change the
//! flow grid ([`UNIPC_INERT_KEYS`](crate::UNIPC_INERT_KEYS)) and the sampler keys at the values
//! of flowrl's own UniPC (the trainer's `sampling.solver = "unipc_bh2"`), and refuses any
//! other by name. Missing keys take diffusers' constructor defaults, so a config means here
//! what it means to diffusers.

use std::path::Path;

use serde::Deserialize;

use crate::error::ScheduleError;

/// The schedule-relevant keys of a diffusers scheduler config, with diffusers' defaults.
///
/// ```
/// use schedule::SchedulerConfig;
/// let cfg = SchedulerConfig::from_json_str(r#"{"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0}"#).unwrap();
/// assert_eq!(cfg.shift, 3.0);
/// assert_eq!(cfg.num_train_timesteps, 1000); // diffusers' default
/// assert!(!cfg.use_dynamic_shifting);
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct SchedulerConfig {
    /// The diffusers scheduler class. `FlowMatchEulerDiscreteScheduler` when absent.
    #[serde(rename = "_class_name")]
    pub class_name: String,
    /// `T`, the training timestep count; timesteps are `T * sigma`.
    pub num_train_timesteps: u32,
    /// The static shift (FlowMatch). Ignored when `use_dynamic_shifting` is on.
    pub shift: f64,
    /// Derive the shift from the image size (`mu`) instead of `shift`.
    pub use_dynamic_shifting: bool,
    /// `mu` at `base_image_seq_len` tokens.
    pub base_shift: Option<f64>,
    /// `mu` at `max_image_seq_len` tokens.
    pub max_shift: Option<f64>,
    /// Token count of `base_shift`.
    pub base_image_seq_len: Option<u64>,
    /// Token count of `max_shift`.
    pub max_image_seq_len: Option<u64>,
    /// Stretch the schedule so its last non-zero sigma is this value. diffusers gates it on
    /// truthiness: `null`, `0` and `0.0` all mean "disabled".
    pub shift_terminal: Option<f64>,
    /// `"exponential"` or `"linear"`.
    pub time_shift_type: String,
    /// Mochi's inverted schedule (not supported).
    pub invert_sigmas: bool,
    /// Karras sigmas (not supported).
    pub use_karras_sigmas: bool,
    /// Exponential sigmas (not supported).
    pub use_exponential_sigmas: bool,
    /// Beta sigmas (not supported).
    pub use_beta_sigmas: bool,
    /// UniPC: use the flow-matching sigma grid.
    pub use_flow_sigmas: bool,
    /// UniPC: the static shift of the flow grid.
    pub flow_shift: f64,
    /// UniPC: the appended terminal sigma, `"zero"` (supported) or `"sigma_min"`.
    pub final_sigmas_type: String,
    /// Every other key of the file, as written.
    #[serde(flatten)]
    pub other: std::collections::BTreeMap<String, serde_json::Value>,
    /// Every key the text held, typed or not, with its value ([`SchedulerConfig::from_json_str`] and
    /// [`SchedulerConfig::load`] fill it; empty for a config built in code): a typed key
    /// that the scheduler class named does not have is refused by its presence, since its
    /// field alone cannot tell a written default from an absent key.
    #[serde(skip)]
    pub written: std::collections::BTreeMap<String, serde_json::Value>,
}

impl Default for SchedulerConfig {
    /// diffusers' constructor defaults of `FlowMatchEulerDiscreteScheduler` (and, for the
    /// UniPC-only keys, of `UniPCMultistepScheduler`).
    fn default() -> Self {
        Self {
            class_name: "FlowMatchEulerDiscreteScheduler".to_owned(),
            num_train_timesteps: 1000,
            shift: 1.0,
            use_dynamic_shifting: false,
            base_shift: Some(0.5),
            max_shift: Some(1.15),
            base_image_seq_len: Some(256),
            max_image_seq_len: Some(4096),
            shift_terminal: None,
            time_shift_type: "exponential".to_owned(),
            invert_sigmas: false,
            use_karras_sigmas: false,
            use_exponential_sigmas: false,
            use_beta_sigmas: false,
            use_flow_sigmas: false,
            flow_shift: 1.0,
            final_sigmas_type: "zero".to_owned(),
            other: std::collections::BTreeMap::new(),
            written: std::collections::BTreeMap::new(),
        }
    }
}

impl SchedulerConfig {
    /// Parses a config from JSON text.
    ///
    /// # Errors
    /// [`ScheduleError::Json`] when the text is not JSON or a key has the wrong type.
    pub fn from_json_str(text: &str) -> Result<Self, ScheduleError> {
        Self::parse(text).map_err(|source| ScheduleError::Json {
            path: "<memory>".into(),
            source,
        })
    }

    /// The config and the keys the text wrote.
    fn parse(text: &str) -> Result<Self, serde_json::Error> {
        let value: serde_json::Value = serde_json::from_str(text)?;
        let written = value
            .as_object()
            .map(|map| map.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        let mut cfg: Self = serde_json::from_value(value)?;
        cfg.written = written;
        Ok(cfg)
    }

    /// Reads `scheduler_config.json` (the file itself, or a directory holding it, e.g. a
    /// checkpoint's `scheduler/`). This is the crate's only IO.
    ///
    /// # Errors
    /// [`ScheduleError::Io`] or [`ScheduleError::Json`], naming the file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ScheduleError> {
        let path = path.as_ref();
        let file = if path.is_dir() {
            path.join("scheduler_config.json")
        } else {
            path.to_path_buf()
        };
        let text = std::fs::read_to_string(&file).map_err(|source| ScheduleError::Io {
            path: file.clone(),
            source,
        })?;
        Self::parse(&text).map_err(|source| ScheduleError::Json { path: file, source })
    }

    /// `shift_terminal` with diffusers' truthiness applied: `None` for `null` and `0.0`.
    ///
    /// ```
    /// use schedule::SchedulerConfig;
    /// let off = SchedulerConfig::from_json_str(r#"{"shift_terminal": 0}"#).unwrap();
    /// assert_eq!(off.normalized_shift_terminal(), None);
    /// let on = SchedulerConfig::from_json_str(r#"{"shift_terminal": 0.02}"#).unwrap();
    /// assert_eq!(on.normalized_shift_terminal(), Some(0.02));
    /// ```
    pub fn normalized_shift_terminal(&self) -> Option<f64> {
        normalize_terminal(self.shift_terminal)
    }
}

/// diffusers' `if self.config.shift_terminal:`: a falsy value disables the stretch.
pub(crate) fn normalize_terminal(v: Option<f64>) -> Option<f64> {
    v.filter(|t| *t != 0.0)
}
