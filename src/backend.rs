//! Backend selection: the one place the binaries choose a burn backend and build its device.
//!
//! Library crates are generic over `B: burn::tensor::backend::Backend` and never name a
//! backend. Binaries pick one here, once. GPU backends exist only when the facade is built with
//! the matching cargo feature (`cuda`, `wgpu`); asking for one that is not compiled in is a
//! typed error that says which feature to enable.

use std::fmt;
use std::str::FromStr;

/// burn's pure-Rust CPU backend (f32), the default.
pub type Cpu = burn::backend::Flex;

/// NVIDIA CUDA (requires the `cuda` feature).
#[cfg(feature = "cuda")]
pub type Cuda = burn::backend::Cuda;

/// WebGPU / Vulkan through wgpu (requires the `wgpu` feature).
#[cfg(feature = "wgpu")]
pub type Wgpu = burn::backend::Wgpu;

/// A backend a binary can be asked to run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// [`Cpu`].
    Cpu,
    /// CUDA.
    Cuda,
    /// wgpu.
    Wgpu,
}

impl BackendKind {
    /// Every kind, in the order the CLI lists them.
    pub const ALL: [BackendKind; 3] = [BackendKind::Cpu, BackendKind::Cuda, BackendKind::Wgpu];

    /// The cargo feature that compiles this backend in (`None` for the CPU).
    pub fn feature(self) -> Option<&'static str> {
        match self {
            BackendKind::Cpu => None,
            BackendKind::Cuda => Some("cuda"),
            BackendKind::Wgpu => Some("wgpu"),
        }
    }

    /// Whether this build includes the backend.
    pub fn compiled_in(self) -> bool {
        match self {
            BackendKind::Cpu => true,
            BackendKind::Cuda => cfg!(feature = "cuda"),
            BackendKind::Wgpu => cfg!(feature = "wgpu"),
        }
    }

    /// Checks that the backend is compiled in.
    ///
    /// # Errors
    /// [`BackendError::NotCompiledIn`] naming the feature to enable.
    pub fn ensure_available(self) -> Result<Self, BackendError> {
        if self.compiled_in() {
            Ok(self)
        } else {
            Err(BackendError::NotCompiledIn {
                kind: self,
                feature: self.feature().unwrap_or_default(),
            })
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
            BackendKind::Wgpu => "wgpu",
        })
    }
}

impl FromStr for BackendKind {
    type Err = BackendError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        BackendKind::ALL
            .into_iter()
            .find(|k| k.to_string() == s.to_ascii_lowercase())
            .ok_or_else(|| BackendError::Unknown {
                given: s.to_string(),
            })
    }
}

/// Why a backend cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The name is not a backend.
    #[error("unknown backend {given:?}; expected one of: cpu, cuda, wgpu")]
    Unknown {
        /// The name given.
        given: String,
    },
    /// The backend exists but this binary was built without it.
    #[error("backend {kind} is not compiled into this binary; rebuild with `--features {feature}`")]
    NotCompiledIn {
        /// The backend asked for.
        kind: BackendKind,
        /// The cargo feature that enables it.
        feature: &'static str,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_explains_missing_backends() {
        assert_eq!("CPU".parse::<BackendKind>().unwrap(), BackendKind::Cpu);
        assert!(matches!(
            "tpu".parse::<BackendKind>(),
            Err(BackendError::Unknown { .. })
        ));
        assert!(BackendKind::Cpu.ensure_available().is_ok());
        if !cfg!(feature = "cuda") {
            let msg = BackendKind::Cuda
                .ensure_available()
                .unwrap_err()
                .to_string();
            assert!(msg.contains("--features cuda"), "{msg}");
        }
    }
}
