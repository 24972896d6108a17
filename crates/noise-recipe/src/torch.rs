//! A PyTorch-compatible CPU generator: `torch.randn(shape, generator=g)` in `float32`, bit for
//! bit, for `g = torch.Generator().manual_seed(seed)`.
//!
//! What PyTorch does (ATen `CPUGeneratorImpl`, `DistributionTemplates.h`):
//!
//! * the engine is MT19937 seeded with the low 32 bits of the seed; `random()` is one 32-bit
//!   output, `random64()` is two, the first in the high half;
//! * a `float` uniform in `[0, 1)` is `(random() & (2^24 - 1)) * 2^-24`, a `double` one
//!   `(random64() & (2^53 - 1)) * 2^-53`;
//! * **16 or more elements** (contiguous `float32`): `normal_fill` first draws a uniform for
//!   every element, then turns each block of 16 into normals by Box-Muller over the pairs
//!   `(j, j + 8)`: `radius = sqrt(-2 log(1 - u_j))`, `theta = 2 pi u_{j+8}`,
//!   `x_j = radius cos theta`, `x_{j+8} = radius sin theta`. When the size is not a multiple of
//!   16 the **last 16** elements are redrawn with 16 fresh uniforms and recomputed. How `log`,
//!   `sin` and `cos` are evaluated depends on the CPU kernel PyTorch dispatched to, see
//!   [`TorchCpuKernel`];
//! * **fewer than 16 elements**: each element is an `at::normal_distribution<double>` draw:
//!   two `double` uniforms `u1, u2`, `r = sqrt(-2 log1p(-u2))`, `theta = 2 pi u1`, the value
//!   `r cos theta` rounded to `float`; `r sin theta` is cached in the generator and returned by
//!   the next such draw (also across calls, until the generator is re-seeded).

use crate::cephes;
use crate::mt19937::Mt19937;

/// Which of PyTorch's CPU kernels produced the numbers to match. PyTorch compiles its CPU
/// kernels once per instruction set and picks one at run time
/// (`torch.backends.cpu.get_cpu_capability()`, capped by the `ATEN_CPU_CAPABILITY` variable).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TorchCpuKernel {
    /// The `AVX2` and `AVX512` kernels (any x86-64 CPU since about 2013): Box-Muller with
    /// Cephes `log`/`sincos` polynomials in `f32` (`avx_mathfun.h`), `theta` computed in `f32`.
    /// Reproduced with pure arithmetic: identical on every platform.
    Vectorized,
    /// The `DEFAULT` kernel (`ATEN_CPU_CAPABILITY=default`, CPUs without AVX2, and builds for
    /// other architectures that use the scalar path): `std::log`, `std::cos`, `std::sin` on
    /// `float`, `theta = float(2 pi (double) u)`. Reproduced with this platform's libm `logf`,
    /// `cosf`, `sinf` (Rust's `f32::ln`, `cos`, `sin`): bit-identical to PyTorch when both use
    /// the same libm (e.g. glibc on Linux).
    Scalar,
}

/// PyTorch's CPU generator state: the MT19937 engine and the cached second Box-Muller value of
/// the `double` normal path.
///
/// ```
/// use noise_recipe::{TorchCpuKernel, TorchGenerator};
/// let mut g = TorchGenerator::manual_seed(0);
/// let x = g.randn(5, TorchCpuKernel::Vectorized); // < 16 elements: the double path
/// assert_eq!(x.len(), 5);
/// // torch.randn(5, generator=torch.Generator().manual_seed(0))[0] == 1.5409961
/// assert_eq!(x[0], 1.540_996_1_f32);
/// ```
#[derive(Clone)]
pub struct TorchGenerator {
    engine: Mt19937,
    next_double_normal: Option<f64>,
}

impl std::fmt::Debug for TorchGenerator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TorchGenerator")
            .field("cached_normal", &self.next_double_normal.is_some())
            .finish_non_exhaustive()
    }
}

impl TorchGenerator {
    /// `torch.Generator().manual_seed(seed)`: only the low 32 bits of `seed` reach the engine.
    /// (A negative Python seed `s` is `s mod 2^64` here.)
    pub fn manual_seed(seed: u64) -> Self {
        Self {
            engine: Mt19937::new(seed),
            next_double_normal: None,
        }
    }

    /// One 32-bit engine output (`random()`).
    pub fn random(&mut self) -> u32 {
        self.engine.next_u32()
    }

    /// Two 32-bit outputs, the first in the high half (`random64()`).
    pub fn random64(&mut self) -> u64 {
        let hi = u64::from(self.engine.next_u32());
        let lo = u64::from(self.engine.next_u32());
        (hi << 32) | lo
    }

    fn uniform_f32(&mut self) -> f32 {
        (self.random() & 0x00ff_ffff) as f32 * (1.0 / 16_777_216.0)
    }

    fn uniform_f64(&mut self) -> f64 {
        (self.random64() & ((1u64 << 53) - 1)) as f64 * (1.0 / 9_007_199_254_740_992.0)
    }

    /// One `at::normal_distribution<double>` draw with mean 0 and std 1, using (and refilling)
    /// the cached second value.
    fn normal_f64(&mut self) -> f64 {
        if let Some(v) = self.next_double_normal.take() {
            return v;
        }
        let u1 = self.uniform_f64();
        let u2 = self.uniform_f64();
        let r = (-2.0 * (-u2).ln_1p()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * u1;
        self.next_double_normal = Some(r * theta.sin());
        r * theta.cos()
    }

    /// `torch.randn(numel, generator=self)` in `float32` (any shape with `numel` elements, since
    /// the values fill a contiguous tensor in order), advancing the generator exactly as PyTorch
    /// does.
    pub fn randn(&mut self, numel: usize, kernel: TorchCpuKernel) -> Vec<f32> {
        if numel < 16 {
            return (0..numel).map(|_| self.normal_f64() as f32).collect();
        }
        let mut data: Vec<f32> = (0..numel).map(|_| self.uniform_f32()).collect();
        for block in data.chunks_exact_mut(16) {
            normal_fill_16(block, kernel);
        }
        if !numel.is_multiple_of(16) {
            let tail = &mut data[numel - 16..];
            for v in tail.iter_mut() {
                *v = self.uniform_f32();
            }
            normal_fill_16(tail, kernel);
        }
        data
    }
}

/// Box-Muller over the pairs `(j, j + 8)` of a block of 16 uniforms, in place.
fn normal_fill_16(d: &mut [f32], kernel: TorchCpuKernel) {
    for j in 0..8 {
        let u1 = 1.0f32 - d[j];
        let u2 = d[j + 8];
        let (radius, sin, cos) = match kernel {
            TorchCpuKernel::Vectorized => {
                let radius = (-2.0f32 * cephes::log(u1)).sqrt();
                let (s, c) = cephes::sincos(cephes::TWO_PI * u2);
                (radius, s, c)
            }
            TorchCpuKernel::Scalar => {
                let radius = (-2.0f32 * u1.ln()).sqrt();
                let theta = (2.0 * std::f64::consts::PI * f64::from(u2)) as f32;
                (radius, theta.sin(), theta.cos())
            }
        };
        d[j] = radius * cos;
        d[j + 8] = radius * sin;
    }
}
