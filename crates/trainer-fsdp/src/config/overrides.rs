//! `key=value` overrides with dotted key paths, applied to the config's TOML tree; `key*=factor`
//! scales a number already there.

use std::fmt;

use crate::error::TrainerError;

/// One `key=value` override with a dotted key path, e.g. `algorithm.eps_clip=1e-4`,
/// `sampling.sde_pool=[1, 2, 3]` or `checkpoint.dir=runs/x`.
///
/// The value is read as a TOML value; text that is not one (an unquoted path, a bare word) is
/// taken as a string. Nothing after the `=` removes the key: an optional key goes back to
/// absent (`sampling.sde_pool=`). `key*=factor` multiplies the number the key holds at that
/// point (`optimizer.lr*=0.25`: a quarter of whatever the recipe, file or an earlier override
/// set); the key must hold a number, and a whole number stays whole only under a whole factor.
/// (Quote it on a shell command line: `*` is a glob character.)
///
/// ```
/// use trainer_fsdp::Override;
/// let o = Override::parse("sampling.sde_pool=[1, 2, 3]").unwrap();
/// assert_eq!(o.path, vec!["sampling", "sde_pool"]);
/// assert_eq!(o.value, toml::Value::Array(vec![1.into(), 2.into(), 3.into()]));
/// assert_eq!(Override::parse("checkpoint.dir=runs/a b").unwrap().value, toml::Value::from("runs/a b"));
/// assert!(Override::parse("no-equals-sign").is_err());
/// assert!(Override::parse("sampling.sde_pool=").unwrap().unset);
/// let o = Override::parse("optimizer.lr*=0.25").unwrap();
/// assert!(o.scale && o.path == ["optimizer", "lr"] && o.value == toml::Value::Float(0.25));
/// assert!(Override::parse("optimizer.lr*=fast").is_err());
/// assert!(Override::parse("optimizer.lr*=").is_err());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// The key path.
    pub path: Vec<String>,
    /// The value (empty when `unset`).
    pub value: toml::Value,
    /// The override removes the key instead of setting it (`key=` with no value).
    pub unset: bool,
    /// The override multiplies the key's number by `value` instead of setting it
    /// (`key*=factor`).
    pub scale: bool,
}

/// What is wrong with an override.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OverrideProblem {
    /// No `=`.
    MissingEquals,
    /// An empty key or an empty path component.
    EmptyKey,
    /// A key path that goes through a value that is not a table.
    NotATable {
        /// The prefix that is not a table.
        prefix: String,
    },
    /// `key*=factor` with a factor that is not a finite number.
    FactorNotANumber,
    /// `key*=factor` on a key that holds no number at that point.
    NothingToScale {
        /// What the key holds (`absent`, or the TOML value).
        found: String,
    },
    /// `key*=factor` on a whole number with a factor that is not whole, or a product out of
    /// range.
    NotWhole,
}

impl fmt::Display for OverrideProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OverrideProblem::MissingEquals => {
                write!(
                    f,
                    "expected key=value with a dotted key, e.g. algorithm.eps_clip=1e-4"
                )
            }
            OverrideProblem::EmptyKey => write!(f, "the key or one of its dotted parts is empty"),
            OverrideProblem::NotATable { prefix } => {
                write!(f, "{prefix} is a value, not a section; it has no keys")
            }
            OverrideProblem::FactorNotANumber => {
                write!(
                    f,
                    "key*=factor expects a finite number after *=, e.g. optimizer.lr*=0.5"
                )
            }
            OverrideProblem::NothingToScale { found } => write!(
                f,
                "key*=factor scales a number the key already holds; it holds {found}"
            ),
            OverrideProblem::NotWhole => write!(
                f,
                "the key holds a whole number: expected a whole factor with a product in range"
            ),
        }
    }
}

impl Override {
    /// Parses `key=value`.
    ///
    /// # Errors
    /// [`TrainerError::Override`].
    pub fn parse(text: &str) -> Result<Self, TrainerError> {
        let err = |problem| TrainerError::Override {
            given: text.to_string(),
            problem,
        };
        let (key, raw) = text
            .split_once('=')
            .ok_or_else(|| err(OverrideProblem::MissingEquals))?;
        let (key, scale) = match key.trim_end().strip_suffix('*') {
            Some(k) => (k, true),
            None => (key, false),
        };
        let path: Vec<String> = key
            .trim()
            .split('.')
            .map(|s| s.trim().to_string())
            .collect();
        if path.iter().any(String::is_empty) {
            return Err(err(OverrideProblem::EmptyKey));
        }
        let raw = raw.trim();
        if raw.is_empty() && !scale {
            return Ok(Self {
                path,
                value: toml::Value::String(String::new()),
                unset: true,
                scale: false,
            });
        }
        let value = toml::from_str::<toml::Table>(&format!("v = {raw}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(raw.to_string()));
        if scale {
            let finite = match value {
                toml::Value::Integer(_) => true,
                toml::Value::Float(x) => x.is_finite(),
                _ => false,
            };
            if !finite {
                return Err(err(OverrideProblem::FactorNotANumber));
            }
        }
        Ok(Self {
            path,
            value,
            unset: false,
            scale,
        })
    }

    /// Parses every override of a list (e.g. the trailing arguments of a command line).
    ///
    /// # Errors
    /// The first [`TrainerError::Override`].
    pub fn parse_all<S: AsRef<str>>(items: &[S]) -> Result<Vec<Self>, TrainerError> {
        items.iter().map(|s| Self::parse(s.as_ref())).collect()
    }

    /// The override as written (`key=value`, `key=` or `key*=factor`).
    fn written(&self) -> String {
        let key = self.path.join(".");
        match (self.unset, self.scale) {
            (true, _) => format!("{key}="),
            (false, true) => format!("{key}*={}", self.value),
            (false, false) => format!("{key}={}", self.value),
        }
    }

    pub(super) fn apply(&self, table: &mut toml::Table) -> Result<(), TrainerError> {
        let (last, parents) = self.path.split_last().expect("a parsed path is not empty");
        let mut t = table;
        for (i, k) in parents.iter().enumerate() {
            let entry = t
                .entry(k.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            t = match entry {
                toml::Value::Table(inner) => inner,
                _ => {
                    return Err(TrainerError::Override {
                        given: self.written(),
                        problem: OverrideProblem::NotATable {
                            prefix: self.path[..=i].join("."),
                        },
                    });
                }
            };
        }
        if self.unset {
            t.remove(last);
        } else if self.scale {
            let err = |problem| TrainerError::Override {
                given: self.written(),
                problem,
            };
            let scaled = match (t.get(last), &self.value) {
                (Some(toml::Value::Float(x)), toml::Value::Float(f)) => toml::Value::Float(x * f),
                (Some(toml::Value::Float(x)), toml::Value::Integer(f)) => {
                    toml::Value::Float(x * *f as f64)
                }
                (Some(toml::Value::Integer(x)), toml::Value::Integer(f)) => toml::Value::Integer(
                    x.checked_mul(*f)
                        .ok_or_else(|| err(OverrideProblem::NotWhole))?,
                ),
                (Some(toml::Value::Integer(_)), _) => return Err(err(OverrideProblem::NotWhole)),
                (found, _) => {
                    return Err(err(OverrideProblem::NothingToScale {
                        found: found.map_or_else(|| "nothing (absent)".into(), |v| v.to_string()),
                    }));
                }
            };
            t.insert(last.clone(), scaled);
        } else {
            t.insert(last.clone(), self.value.clone());
        }
        Ok(())
    }
}
