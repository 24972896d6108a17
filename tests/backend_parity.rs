//! The sde-math reference fixtures, run on the GPU backends compiled into this build.
//!
//! `cargo test --features wgpu --test backend_parity` runs them on wgpu (on a machine without a
//! GPU, Mesa's lavapipe software Vulkan driver serves); `--features cuda` on CUDA. Without either
//! feature this file tests nothing (the CPU backends are covered by `cargo test -p sde-math`).

#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[path = "../crates/sde-math/tests/support/parity.rs"]
mod parity;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn run<B: burn::tensor::backend::Backend>(name: &str, dev: &B::Device) {
    let fixtures = parity::fixtures_dir(env!("CARGO_MANIFEST_DIR"));
    let a = parity::flow_grpo_sde_step::<B>(&fixtures, dev);
    let b = parity::dance_flux_step::<B>(&fixtures, dev);
    let c = parity::ode_solvers::<B>(&fixtures, dev);
    let d = parity::storage_rounding::<B>(&fixtures, dev);
    assert_eq!((a.cases, b.cases, c.cases, d), (54, 12, 14, 146));
    println!(
        "{name}: flow_grpo {a:?}\n{name}: dance {b:?}\n{name}: solvers {c:?}\n{name}: {d} rounded values bitwise equal"
    );
}

#[cfg(feature = "wgpu")]
#[test]
fn sde_math_fixtures_match_on_wgpu() {
    run::<flowrl::backend::Wgpu>("wgpu", &Default::default());
}

#[cfg(feature = "cuda")]
#[test]
fn sde_math_fixtures_match_on_cuda() {
    run::<flowrl::backend::Cuda>("cuda", &Default::default());
}
