//! # sde-math
//!
//! Per-step transition math for flow-matching samplers, shared by rollout (sampling) and
//! training (replay), written once against burn's tensors so it runs the same on every
//! backend (CPU `Flex`/`NdArray`, CUDA, wgpu).
//!
//! Conventions: the forward process is `x_sigma = (1 - sigma) x0 + sigma eps`, the model
//! predicts the velocity `v = eps - x0`, and sampling runs from `sigma = 1` (noise) to
//! `sigma = 0` (data) with steps `dt = sigma_{k+1} - sigma_k < 0`.
//!
//! The crate is pure: sigmas, the model output, the current sample and either an explicit noise
//! tensor (sampling) or the stored next sample (replay) go in; a named record comes out. There
//! is no RNG, no model call and no step counter inside.
//!
//! * [`Kernel`]: the stochastic kernels (Flow-SDE, Dance, CPS, churn), each with
//!   [`Kernel::sample`], [`Kernel::replay`] and [`Kernel::transition_std`] built on one private
//!   transition function, returning a [`Transition`].
//! * [`euler_step`]: the deterministic `eta = 0` collapse.
//! * [`solvers`]: stateful deterministic multistep solvers (DPM-Solver++, UniPC).
//! * [`gaussian`]: log-densities and closed-form KLs.
//! * [`analytic`]: Gaussian data, a flow with a closed-form velocity, to measure samplers.
//! * [`StorageDtype`]: the storage-precision round trip that makes sampling-time and
//!   replay-time log-probs identical.
//!
//! ```
//! use burn::backend::Flex;
//! use burn::tensor::Tensor;
//! use sde_math::{Kernel, StepSigmas, StorageDtype};
//!
//! let dev = Default::default();
//! let kernel = Kernel::flow_sde(0.7).unwrap();
//! let at = StepSigmas::new(0.8, 0.7).unwrap().into();
//! let x = Tensor::<Flex, 3>::from_floats([[[0.1, -0.4], [0.3, 0.9]]], &dev);
//! let v = Tensor::<Flex, 3>::from_floats([[[0.5, 0.2], [-0.1, 0.4]]], &dev);
//! let noise = Tensor::<Flex, 3>::from_floats([[[1.0, -0.5], [0.25, 2.0]]], &dev);
//!
//! let rollout = kernel.sample(&at, v.clone(), x.clone(), noise, StorageDtype::Bf16).unwrap();
//! let replay = kernel
//!     .replay(&at, v, x, rollout.prev_sample.clone(), StorageDtype::Bf16)
//!     .unwrap();
//! // one transition function: the replayed log-prob is bit-identical to the sampled one
//! assert_eq!(rollout.log_prob.into_data(), replay.log_prob.into_data());
//! ```
#![deny(missing_docs)]

pub mod analytic;
mod error;
pub mod gaussian;
mod kernel;
mod output;
mod precision;
mod sigmas;
pub mod solvers;

pub use error::SdeError;
pub use kernel::{
    Churn, Cps, Dance, FlowSde, Kernel, Moments, ROUND_TRIP_MIN_NOISE, SigmaOnePolicy, euler_step,
};
pub use output::Transition;
pub use precision::StorageDtype;
pub use sigmas::{Sigmas, StepSigmas};
