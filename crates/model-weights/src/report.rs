//! The load report: every missing, unexpected, mis-shaped and unconvertible key of a
//! checkpoint against what a model expects, collected before anything fails.

use std::fmt;

/// A tensor whose stored shape differs from the one the model expects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeMismatch {
    /// The checkpoint key.
    pub key: String,
    /// The shape the model expects, in the checkpoint's layout (PyTorch `[out, in]` for
    /// linear weights).
    pub expected: Vec<usize>,
    /// The shape found in the file.
    pub found: Vec<usize>,
}

/// A tensor stored in a dtype the loader cannot convert to a float.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DtypeProblem {
    /// The checkpoint key.
    pub key: String,
    /// The stored dtype, as safetensors names it.
    pub dtype: String,
}

/// Everything that is wrong between a checkpoint and a model, collected before failing.
///
/// Loading never stops at the first bad key: every missing, unexpected, mis-shaped and
/// unconvertible tensor is listed by name. Each key lands in one list at most, checked in the
/// order presence, dtype, shape. [`crate::Checkpoint::report`] returns the lists sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WeightReport {
    /// Keys the model needs that the checkpoint lacks.
    pub missing: Vec<String>,
    /// Keys in the checkpoint that the model has no parameter for.
    pub unexpected: Vec<String>,
    /// Keys present on both sides with different shapes.
    pub mismatched: Vec<ShapeMismatch>,
    /// Keys stored in a dtype that is not a float the loader converts (f64, f32, f16, bf16).
    pub unsupported_dtype: Vec<DtypeProblem>,
}

impl WeightReport {
    /// `true` when nothing is wrong.
    pub fn is_clean(&self) -> bool {
        self.missing.is_empty()
            && self.unexpected.is_empty()
            && self.mismatched.is_empty()
            && self.unsupported_dtype.is_empty()
    }

    /// Sorts every list by key (the order reports are returned and printed in).
    pub fn sort(&mut self) {
        self.missing.sort();
        self.unexpected.sort();
        self.mismatched.sort_by(|a, b| a.key.cmp(&b.key));
        self.unsupported_dtype.sort_by(|a, b| a.key.cmp(&b.key));
    }
}

impl fmt::Display for WeightReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if !self.missing.is_empty() {
            parts.push(format!(
                "{} missing: [{}]",
                self.missing.len(),
                self.missing.join(", ")
            ));
        }
        if !self.unexpected.is_empty() {
            parts.push(format!(
                "{} unexpected: [{}]",
                self.unexpected.len(),
                self.unexpected.join(", ")
            ));
        }
        if !self.mismatched.is_empty() {
            let items: Vec<String> = self
                .mismatched
                .iter()
                .map(|m| format!("{} (expected {:?}, found {:?})", m.key, m.expected, m.found))
                .collect();
            parts.push(format!(
                "{} mis-shaped: [{}]",
                items.len(),
                items.join(", ")
            ));
        }
        if !self.unsupported_dtype.is_empty() {
            let items: Vec<String> = self
                .unsupported_dtype
                .iter()
                .map(|d| format!("{} ({})", d.key, d.dtype))
                .collect();
            parts.push(format!(
                "{} with unsupported dtype: [{}]",
                items.len(),
                items.join(", ")
            ));
        }
        if parts.is_empty() {
            write!(f, "no problems")
        } else {
            write!(f, "{}", parts.join("; "))
        }
    }
}
