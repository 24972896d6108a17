//! `key=value` overrides with dotted key paths, applied to the config's TOML tree.

use std::fmt;

use crate::error::TrainerError;

/// One `key=value` override with a dotted key path, e.g. `algorithm.eps_clip=1e-4`,
/// `sampling.sde_pool=[1, 2, 3]` or `checkpoint.dir=runs/x`.
///
/// The value is read as a TOML value; text that is not one (an unquoted path, a bare word) is
/// taken as a string. Nothing after the `=` removes the key: an optional key goes back to
/// absent (`sampling.sde_pool=`).
///
/// ```
/// use trainer_fsdp::Override;
/// let o = Override::parse("sampling.sde_pool=[1, 2, 3]").unwrap();
/// assert_eq!(o.path, vec!["sampling", "sde_pool"]);
/// assert_eq!(o.value, toml::Value::Array(vec![1.into(), 2.into(), 3.into()]));
/// assert_eq!(Override::parse("checkpoint.dir=runs/a b").unwrap().value, toml::Value::from("runs/a b"));
/// assert!(Override::parse("no-equals-sign").is_err());
/// assert!(Override::parse("sampling.sde_pool=").unwrap().unset);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// The key path.
    pub path: Vec<String>,
    /// The value (empty when `unset`).
    pub value: toml::Value,
    /// The override removes the key instead of setting it (`key=` with no value).
    pub unset: bool,
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
        let path: Vec<String> = key
            .trim()
            .split('.')
            .map(|s| s.trim().to_string())
            .collect();
        if path.iter().any(String::is_empty) {
            return Err(err(OverrideProblem::EmptyKey));
        }
        let raw = raw.trim();
        if raw.is_empty() {
            return Ok(Self {
                path,
                value: toml::Value::String(String::new()),
                unset: true,
            });
        }
        let value = toml::from_str::<toml::Table>(&format!("v = {raw}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(raw.to_string()));
        Ok(Self {
            path,
            value,
            unset: false,
        })
    }

    /// Parses every override of a list (e.g. the trailing arguments of a command line).
    ///
    /// # Errors
    /// The first [`TrainerError::Override`].
    pub fn parse_all<S: AsRef<str>>(items: &[S]) -> Result<Vec<Self>, TrainerError> {
        items.iter().map(|s| Self::parse(s.as_ref())).collect()
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
                        given: format!("{}={}", self.path.join("."), self.value),
                        problem: OverrideProblem::NotATable {
                            prefix: self.path[..=i].join("."),
                        },
                    });
                }
            };
        }
        if self.unset {
            t.remove(last);
        } else {
            t.insert(last.clone(), self.value.clone());
        }
        Ok(())
    }
}
