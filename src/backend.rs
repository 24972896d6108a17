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

    /// Checks that the backend is compiled in and that its default device works: a GPU
    /// backend runs one small computation and checks its result (burn's GPU runtimes panic,
    /// often on a thread of their own, when a driver or library is missing; that becomes
    /// [`BackendError::Unavailable`] here, before any work starts).
    ///
    /// # Errors
    /// [`BackendError::NotCompiledIn`] naming the feature to enable;
    /// [`BackendError::Unavailable`] with what the runtime reported and what it needs.
    pub fn ensure_available(self) -> Result<Self, BackendError> {
        if !self.compiled_in() {
            return Err(BackendError::NotCompiledIn {
                kind: self,
                feature: self.feature().unwrap_or_default(),
            });
        }
        let probe = match self {
            BackendKind::Cpu => Ok(()),
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => probe_default_device::<Cuda>(),
            #[cfg(feature = "wgpu")]
            BackendKind::Wgpu => probe_default_device::<Wgpu>(),
            #[allow(unreachable_patterns)]
            _ => unreachable!("compiled_in checked above"),
        };
        probe
            .map(|()| self)
            .map_err(|reason| BackendError::Unavailable {
                kind: self,
                reason,
                needs: self.needs(),
            })
    }

    /// What a working device of this backend needs from the machine.
    fn needs(self) -> &'static str {
        match self {
            BackendKind::Cpu => "nothing",
            BackendKind::Cuda => {
                "an NVIDIA GPU and driver (libcuda.so.1), NVRTC (libnvrtc.so.13 or .12) on the \
                 library path (LD_LIBRARY_PATH; never the toolkit's lib64/stubs), and the CUDA \
                 headers under $CUDA_PATH/include (default /usr/local/cuda)"
            }
            BackendKind::Wgpu => {
                "a Vulkan, Metal or DX12 driver (on Linux without a GPU: Mesa's lavapipe, Debian \
                 package mesa-vulkan-drivers)"
            }
        }
    }
}

/// Runs `[1, 2] * 2` on `B`'s default device and checks the result. A panic anywhere in it
/// (the runtime's own threads included) is caught and returned as its message; the panic hook
/// is silenced meanwhile and restored after.
#[cfg(any(feature = "cuda", feature = "wgpu"))]
fn probe_default_device<B: burn::tensor::backend::Backend>() -> Result<(), String>
where
    B::Device: Default,
{
    use std::sync::{Arc, Mutex};
    let messages = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = Arc::clone(&messages);
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let text = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| info.to_string());
        if let Ok(mut m) = sink.lock() {
            m.push(text);
        }
    }));
    let result = std::panic::catch_unwind(|| {
        let device = B::Device::default();
        let t = burn::tensor::Tensor::<B, 1>::from_floats([1.0, 2.0], &device);
        t.mul_scalar(2.0)
            .into_data()
            .convert::<f32>()
            .to_vec::<f32>()
    });
    std::panic::set_hook(previous);
    match result {
        Ok(Ok(v)) if v == [2.0, 4.0] => Ok(()),
        Ok(Ok(v)) => Err(format!("[1, 2] * 2 gave {v:?}")),
        Ok(Err(e)) => Err(format!("reading the result back failed: {e:?}")),
        Err(_) => {
            let m = messages.lock().map(|m| m.clone()).unwrap_or_default();
            // the runtime thread's panic comes first and names the cause; the caller's
            // (a closed channel) adds nothing
            let first = m
                .into_iter()
                .next()
                .unwrap_or_else(|| "the runtime panicked".into());
            // cudarc appends the ~30 file names it tried to "Unable to dynamically load ..."
            let reason = first.split(" - searched for library names").next();
            Err(reason.unwrap_or_default().to_string())
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

/// A device of a backend by its index on the machine (`cuda:1`): the devices of a multi-rank
/// run. The CPU backend has one device, which every CPU rank shares (`cpu:0`, `cpu:1` are
/// ranks, not separate hardware).
pub trait IndexedDevice: Sized {
    /// Device `index`.
    fn at(index: usize) -> Self;
}

impl IndexedDevice for burn::backend::flex::FlexDevice {
    fn at(_index: usize) -> Self {
        Self
    }
}

#[cfg(feature = "cuda")]
impl IndexedDevice for burn::backend::cuda::CudaDevice {
    fn at(index: usize) -> Self {
        Self { index }
    }
}

#[cfg(feature = "wgpu")]
impl IndexedDevice for burn::backend::wgpu::WgpuDevice {
    fn at(index: usize) -> Self {
        Self::DiscreteGpu(index)
    }
}

/// The devices of `--devices`: `kind:index` entries separated by commas (`cuda:0,cuda:1`,
/// `cpu:0,cpu:1`), one backend for all, no index twice (except on the CPU, whose ranks share
/// its one device: `cpu:0,cpu:0` is two ranks on it as well).
///
/// ```
/// use flowrl::backend::{BackendKind, parse_devices};
/// assert_eq!(parse_devices("cuda:0,cuda:1").unwrap(), (BackendKind::Cuda, vec![0, 1]));
/// assert!(parse_devices("cuda:0,cpu:1").is_err());
/// assert!(parse_devices("cuda:0,cuda:0").is_err());
/// assert!(parse_devices("gpu0").is_err());
/// ```
///
/// # Errors
/// [`BackendError::Devices`] naming the entry and what was expected.
pub fn parse_devices(list: &str) -> Result<(BackendKind, Vec<usize>), BackendError> {
    let bad = |why: String| BackendError::Devices {
        given: list.to_string(),
        why,
    };
    let mut kind = None;
    let mut indices = Vec::new();
    for entry in list.split(',').map(str::trim) {
        let (k, i) = entry
            .split_once(':')
            .ok_or_else(|| bad(format!("{entry:?} is not kind:index")))?;
        let k: BackendKind = k.parse()?;
        let i: usize = i
            .parse()
            .map_err(|_| bad(format!("{entry:?}: the index is not a number")))?;
        match kind {
            None => kind = Some(k),
            Some(first) if first != k => {
                return Err(bad(format!(
                    "{first} and {k} in one run: one backend for all"
                )));
            }
            Some(_) => {}
        }
        if k != BackendKind::Cpu && indices.contains(&i) {
            return Err(bad(format!("{entry} twice")));
        }
        indices.push(i);
    }
    Ok((kind.ok_or_else(|| bad("no device".into()))?, indices))
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
    /// A `--devices` list that cannot be used.
    #[error(
        "--devices {given}: {why}; expected kind:index entries separated by commas, e.g. cuda:0,cuda:1"
    )]
    Devices {
        /// The list given.
        given: String,
        /// What is wrong with it.
        why: String,
    },
    /// The backend exists but this binary was built without it.
    #[error("backend {kind} is not compiled into this binary; rebuild with `--features {feature}`")]
    NotCompiledIn {
        /// The backend asked for.
        kind: BackendKind,
        /// The cargo feature that enables it.
        feature: &'static str,
    },
    /// The backend is compiled in but its default device does not work on this machine.
    #[error("backend {kind} is compiled in but could not start ({reason}); it needs {needs}")]
    Unavailable {
        /// The backend asked for.
        kind: BackendKind,
        /// What the runtime reported.
        reason: String,
        /// What the backend needs from the machine.
        needs: &'static str,
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

    #[test]
    fn an_unavailable_backend_says_what_it_needs() {
        let msg = BackendError::Unavailable {
            kind: BackendKind::Cuda,
            reason: "no driver".into(),
            needs: BackendKind::Cuda.needs(),
        }
        .to_string();
        assert!(msg.starts_with("backend cuda is compiled in but could not start (no driver)"));
        assert!(msg.contains("libnvrtc"), "{msg}");
        assert!(BackendKind::Wgpu.needs().contains("lavapipe"));
    }
}
