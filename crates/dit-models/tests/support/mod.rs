//! Shared helpers of the `dit-models` tests: fixture paths, fixture cases as model inputs, and
//! the one comparison helper [`check`] (over [`max_abs_err`], which is NaN on NaN).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor, TensorData};
use dit_models::{
    AdapterContract, ExportDtype, ExportOptions, ImageShape, LoadOptions, QwenImageInput,
    QwenImageTransformer2DModel,
};
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

/// The larger of two errors, NaN if either is (`f64::max` would drop the NaN).
pub fn worse(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// Max abs difference of two equally long slices; NaN when any difference is NaN (a NaN in
/// either slice, or `inf - inf`), so that every `err <= tol` after it fails. (`f64::max` drops a
/// NaN operand, so it must not be the fold.)
pub fn max_abs_err(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths");
    got.iter()
        .zip(want)
        .map(|(a, b)| (*a as f64 - *b as f64).abs())
        .fold(0.0, worse)
}

/// Largest `|x|` of a slice (a scale to divide errors by); NaN when any element is NaN.
pub fn max_magnitude(values: &[f32]) -> f64 {
    values.iter().map(|x| x.abs() as f64).fold(0.0, worse)
}

/// Max abs difference between a tensor and expected values of the same shape ([`max_abs_err`]:
/// NaN on NaN).
pub fn max_abs_diff<B: Backend, const D: usize>(
    got: Tensor<B, D>,
    want: (&[usize], &[f32]),
) -> f64 {
    assert_eq!(got.dims().to_vec(), want.0.to_vec(), "shape");
    let got: Vec<f32> = got.into_data().convert::<f32>().to_vec().unwrap();
    max_abs_err(&got, want.1)
}

/// Compares `got` with the fixture tensor `want` to [`TOL`]; returns the max abs error.
pub fn check<B: Backend, const D: usize>(what: &str, got: Tensor<B, D>, want: &Value) -> f64 {
    let (shape, data) = values(want);
    let err = max_abs_diff(got, (&shape, &data));
    eprintln!("{what}: max abs error {err:.3e}");
    assert!(err <= TOL, "{what}: max abs error {err:e} > {TOL:e}");
    err
}

/// Max abs difference of two tensors (NaN on NaN, see [`max_abs_err`]).
pub fn diff<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> f64 {
    let dims = b.dims();
    let bv: Vec<f32> = b.into_data().convert::<f32>().to_vec().unwrap();
    max_abs_diff(a, (&dims, &bv))
}

/// The comparison helpers themselves: a NaN in either input, at any position, makes
/// `err <= tol` fail; a NaN scale is NaN.
#[test]
fn max_abs_err_fails_on_nan_in_either_input() {
    let passes = |err: f64| err <= TOL;
    let clean = [0.25f32, -1.0, 3.0];
    assert!(passes(max_abs_err(&clean, &clean)));
    assert_eq!(max_magnitude(&clean), 3.0);
    for i in 0..clean.len() {
        let mut nan = clean;
        nan[i] = f32::NAN;
        for err in [max_abs_err(&nan, &clean), max_abs_err(&clean, &nan)] {
            assert!(err.is_nan(), "NaN at {i} read as error {err}");
            assert!(!passes(err));
        }
        assert!(
            max_magnitude(&nan).is_nan(),
            "NaN at {i} dropped from the scale"
        );
    }
    let inf = [f32::INFINITY; 3];
    assert!(!passes(max_abs_err(&inf, &inf)), "inf - inf must not pass");
    assert!(worse(0.5, f64::NAN).is_nan() && worse(f64::NAN, 0.5).is_nan());
}

/// The fixture's tiny base transformer (`tiny_single/`, saved by diffusers).
pub fn base<B: Backend>() -> QwenImageTransformer2DModel<B> {
    QwenImageTransformer2DModel::<B>::from_pretrained(
        fixtures().join("tiny_single"),
        &Default::default(),
        LoadOptions::default(),
    )
    .unwrap()
}

/// The base with the fixture's PEFT adapter (`tiny_lora/`, saved by PEFT).
pub fn adapted<B: Backend>() -> QwenImageTransformer2DModel<B> {
    base::<B>()
        .load_peft_adapter(fixtures().join("tiny_lora"), None)
        .unwrap()
}

/// Writes every export form of `model` under `dir`: `peft/` (the PEFT adapter),
/// `diffusers_lora/` (the diffusers LoRA file), `merged/` (diffusers, f32, one file) and
/// `merged_sharded_bf16/` (diffusers, bf16 shards of at most 40 kB plus the index) — what
/// `interop_fixtures.py --verify-export` loads. Returns the adapter contract.
pub fn export_all<B: Backend>(
    model: &mut QwenImageTransformer2DModel<B>,
    dir: &Path,
) -> AdapterContract {
    let contract = model.save_peft_adapter(dir.join("peft")).unwrap();
    model
        .save_diffusers_lora(dir.join("diffusers_lora"))
        .unwrap();
    model
        .save_merged_diffusers(dir.join("merged"), ExportOptions::default())
        .unwrap();
    let sharded = ExportOptions {
        dtype: ExportDtype::Bf16,
        max_shard_bytes: Some(40_000),
    };
    model
        .save_merged_diffusers(dir.join("merged_sharded_bf16"), sharded)
        .unwrap();
    contract
}
