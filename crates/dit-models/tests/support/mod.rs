//! Shared helpers of the `dit-models` tests: fixture paths, fixture cases as model inputs, and
//! the one comparison helper [`check`].

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor, TensorData};
use dit_models::{ImageShape, QwenImageInput};
use serde_json::Value;

/// Max-abs tolerance of every parity comparison against diffusers / PEFT (f32).
pub const TOL: f64 = 1e-4;

/// `fixtures/dit_models/` of the workspace.
pub fn fixtures() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .map(|d| d.join("fixtures").join("dit_models"))
        .find(|d| d.is_dir())
        .expect("fixtures/dit_models above the crate")
}

/// The forward fixture (`forward.json`), its recorded tolerance checked against [`TOL`].
pub fn forward_cases() -> Vec<Value> {
    let path = fixtures().join("forward.json");
    let text = std::fs::read_to_string(&path).expect("forward.json");
    let v: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(
        v["tolerance"]["f32_max_abs"].as_f64(),
        Some(TOL),
        "tolerance recorded in the fixture differs"
    );
    v["cases"].as_array().expect("cases").clone()
}

pub fn case(name: &str) -> Value {
    forward_cases()
        .into_iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no case {name}"))
}

/// A fixture tensor as (shape, values).
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

pub fn tensor<B: Backend, const D: usize>(v: &Value, dev: &B::Device) -> Tensor<B, D> {
    let (shape, data) = values(v);
    Tensor::from_data(TensorData::new(data, shape), dev)
}

/// The model input of a fixture case (with its mask, if any).
pub fn input<B: Backend>(c: &Value, dev: &B::Device) -> QwenImageInput<B> {
    let img_shapes = c["img_shapes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let s: Vec<usize> = s
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            ImageShape::new(s[0], s[1], s[2])
        })
        .collect();
    let mask = c["encoder_hidden_states_mask"].as_array().map(|rows| {
        let b = rows.len();
        let s = rows[0].as_array().unwrap().len();
        let flat: Vec<bool> = rows
            .iter()
            .flat_map(|r| {
                r.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_i64().unwrap() != 0)
                    .collect::<Vec<_>>()
            })
            .collect();
        Tensor::<B, 2, Bool>::from_data(TensorData::new(flat, [b, s]), dev)
    });
    QwenImageInput {
        hidden_states: tensor(&c["hidden_states"], dev),
        encoder_hidden_states: tensor(&c["encoder_hidden_states"], dev),
        encoder_hidden_states_mask: mask,
        timestep: tensor(&c["timestep"], dev),
        img_shapes,
    }
}

/// Max abs difference between a tensor and expected values of the same shape.
pub fn max_abs_diff<B: Backend, const D: usize>(
    got: Tensor<B, D>,
    want: (&[usize], &[f32]),
) -> f64 {
    assert_eq!(got.dims().to_vec(), want.0.to_vec(), "shape");
    let got: Vec<f32> = got.into_data().convert::<f32>().to_vec().unwrap();
    got.iter()
        .zip(want.1)
        .map(|(a, b)| (*a as f64 - *b as f64).abs())
        .fold(0.0, f64::max)
}

/// Compares `got` with the fixture tensor `want` to [`TOL`]; returns the max abs error.
pub fn check<B: Backend, const D: usize>(what: &str, got: Tensor<B, D>, want: &Value) -> f64 {
    let (shape, data) = values(want);
    let err = max_abs_diff(got, (&shape, &data));
    eprintln!("{what}: max abs error {err:.3e}");
    assert!(err <= TOL, "{what}: max abs error {err:e} > {TOL:e}");
    err
}

/// Max abs difference of two tensors.
pub fn diff<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> f64 {
    let dims = b.dims();
    let bv: Vec<f32> = b.into_data().convert::<f32>().to_vec().unwrap();
    max_abs_diff(a, (&dims, &bv))
}
