//! Shared by the `qwen-image` tests (and the trainer's Qwen-Image tests): the fixture folder,
//! fixture tensors, and the one comparison helper, which fails on NaN.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde_json::Value;

/// Max-abs tolerance of every comparison against transformers / diffusers (f32).
pub const TOL: f64 = 1e-4;

/// `fixtures/qwen_image/` of the workspace.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|d| d.join("fixtures").join("qwen_image"))
        .find(|d| d.is_dir())
        .expect("fixtures/qwen_image above the crate")
}

/// A fixture file, its recorded tolerance checked against [`TOL`].
pub fn fixture(file: &str) -> Value {
    let text = std::fs::read_to_string(fixtures().join(file)).expect(file);
    let v: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(
        v["tolerance"]["f32_max_abs"].as_f64(),
        Some(TOL),
        "tolerance recorded in {file} differs"
    );
    v
}

/// How much further than PyTorch's bf16 run of the same weights flowrl's bf16 run may stray
/// from the f32 reference.
pub const BF16_VS_PYTORCH: f64 = 1.5;

/// `bf16.json` (PyTorch's bf16 outputs, from `fixtures/generate/bf16_fixtures.py`), its
/// recorded factor checked against [`BF16_VS_PYTORCH`].
pub fn bf16_fixture() -> Value {
    let v = fixture("bf16.json");
    assert_eq!(
        v["tolerance"]["bf16_vs_pytorch"].as_f64(),
        Some(BF16_VS_PYTORCH),
        "bf16 factor recorded in bf16.json differs"
    );
    v
}

/// A fixture tensor (`{"shape", "data"}`) as (shape, values).
pub fn values(v: &Value) -> (Vec<usize>, Vec<f32>) {
    let shape = v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    let data = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    (shape, data)
}

/// A fixture's list of lists of non-negative integers (token ids, masks).
pub fn rows<T: TryFrom<u64>>(v: &Value) -> Vec<Vec<T>>
where
    T::Error: std::fmt::Debug,
{
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| T::try_from(x.as_u64().unwrap()).unwrap())
                .collect()
        })
        .collect()
}

/// A fixture's list of strings (prompts).
pub fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect()
}

/// NaN-propagating maximum: a NaN makes every `err <= tol` after it fail (`f64::max` would
/// drop it).
pub fn worse(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// Max abs difference of equally long slices over the positions where `keep` holds; NaN on
/// any NaN.
pub fn max_abs_err_where(got: &[f32], want: &[f32], keep: impl Fn(usize) -> bool) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths");
    got.iter()
        .zip(want)
        .enumerate()
        .filter(|(i, _)| keep(*i))
        .map(|(_, (a, b))| (*a as f64 - *b as f64).abs())
        .fold(0.0, worse)
}

/// Max abs difference of equally long slices; NaN on any NaN.
pub fn max_abs_err(got: &[f32], want: &[f32]) -> f64 {
    max_abs_err_where(got, want, |_| true)
}

#[test]
fn max_abs_err_fails_on_nan_in_either_input() {
    let passes = |err: f64| err <= TOL;
    let clean = [0.5f32, -2.0, 1.0];
    assert!(passes(max_abs_err(&clean, &clean)));
    for i in 0..clean.len() {
        let mut nan = clean;
        nan[i] = f32::NAN;
        for err in [max_abs_err(&nan, &clean), max_abs_err(&clean, &nan)] {
            assert!(err.is_nan() && !passes(err), "NaN at {i} read as {err}");
        }
    }
}
