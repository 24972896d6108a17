//! Parity with the reference implementations (flow_grpo, DanceGRPO, diffusers) on two CPU
//! backends: burn's `Flex` and `NdArray<f32>`, an independent second implementation.

#[path = "support/parity.rs"]
mod parity;

use std::path::PathBuf;

use burn::backend::{Flex, NdArray};

fn fixtures() -> PathBuf {
    parity::fixtures_dir(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn flow_grpo_sde_step_matches_on_flex() {
    let r = parity::flow_grpo_sde_step::<Flex>(&fixtures(), &Default::default());
    assert_eq!(r.cases, 54);
    println!("{r:?}");
}

#[test]
fn flow_grpo_sde_step_matches_on_ndarray() {
    let r = parity::flow_grpo_sde_step::<NdArray<f32>>(&fixtures(), &Default::default());
    assert_eq!(r.cases, 54);
}

#[test]
fn dance_flux_step_matches_on_flex() {
    let r = parity::dance_flux_step::<Flex>(&fixtures(), &Default::default());
    assert_eq!(r.cases, 12);
    println!("{r:?}");
}

#[test]
fn dance_flux_step_matches_on_ndarray() {
    let r = parity::dance_flux_step::<NdArray<f32>>(&fixtures(), &Default::default());
    assert_eq!(r.cases, 12);
}

#[test]
fn ode_solvers_match_on_flex() {
    let r = parity::ode_solvers::<Flex>(&fixtures(), &Default::default());
    assert_eq!(r.cases, 14);
    println!("{r:?}");
}

#[test]
fn ode_solvers_match_on_ndarray() {
    let r = parity::ode_solvers::<NdArray<f32>>(&fixtures(), &Default::default());
    assert_eq!(r.cases, 14);
}

#[test]
fn storage_rounding_matches_torch_bitwise() {
    assert_eq!(
        parity::storage_rounding::<Flex>(&fixtures(), &Default::default()),
        146
    );
    assert_eq!(
        parity::storage_rounding::<NdArray<f32>>(&fixtures(), &Default::default()),
        146
    );
}
