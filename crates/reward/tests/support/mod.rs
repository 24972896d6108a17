//! Shared helpers of the `reward` tests: fixture paths and files, the generator's synthetic
//! images, and the one comparison helper [`check`] (over [`max_abs`], which is NaN on NaN).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use reward::RgbImage;
use serde_json::Value;

/// Max-abs tolerance of embeddings and scores against transformers (f32).
pub const TOL: f64 = 1e-4;

/// `fixtures/reward/` of the workspace.
pub fn fixtures() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .map(|d| d.join("fixtures").join("reward"))
        .find(|d| d.is_dir())
        .expect("fixtures/reward above the crate")
}

/// The tiny CLIP directory (PickScore's layout).
pub fn tiny_clip() -> PathBuf {
    fixtures().join("tiny_clip")
}

/// `clip.json`, its recorded tolerance checked against [`TOL`].
pub fn clip_json() -> Value {
    let text = std::fs::read_to_string(fixtures().join("clip.json")).expect("clip.json");
    let v: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(v["tolerance"]["embeddings_max_abs"].as_f64(), Some(TOL));
    assert_eq!(v["tolerance"]["scores_max_abs"].as_f64(), Some(TOL));
    v
}

/// The generator's `synthetic(width, height, k)`:
/// `(x*(3+k) + y*(5+2k) + 71c + 4*((x*y*(k+1)) % 23) + 60*((x/7 + y/5) % 2)) % 256`.
pub fn synthetic(width: usize, height: usize, k: usize) -> RgbImage {
    RgbImage::from_fn(width, height, |x, y| {
        std::array::from_fn(|c| {
            let v = x * (3 + k)
                + y * (5 + 2 * k)
                + 71 * c
                + 4 * ((x * y * (k + 1)) % 23)
                + 60 * ((x / 7 + y / 5) % 2);
            (v % 256) as u8
        })
    })
}

/// A fixture tensor `{"shape", "data"}` as (shape, values).
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

/// A tensor of `preprocess.safetensors` as (shape, bytes, dtype name).
pub fn stored(name: &str) -> (Vec<usize>, Vec<u8>, String) {
    let bytes = std::fs::read(fixtures().join("preprocess.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    (
        t.shape().to_vec(),
        t.data().to_vec(),
        format!("{:?}", t.dtype()),
    )
}

/// An F32 tensor of `preprocess.safetensors`.
pub fn stored_f32(name: &str) -> (Vec<usize>, Vec<f32>) {
    let (shape, data, dtype) = stored(name);
    assert_eq!(dtype, "F32", "{name}");
    let v = data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (shape, v)
}

/// Max abs difference of two equally long slices; NaN when any difference is NaN (a NaN in
/// either slice, or `inf - inf`), so that every `err <= tol` after it fails. (`f64::max` drops a
/// NaN operand, so it must not be the fold.)
pub fn max_abs(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths");
    got.iter()
        .zip(want)
        .map(|(a, b)| (*a as f64 - *b as f64).abs())
        .fold(0.0, worse)
}

/// The larger of two errors, NaN if either is (`f64::max` would drop the NaN).
pub fn worse(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// The comparison helper itself: a NaN in either slice, at any position, makes `err <= tol`
/// fail.
#[test]
fn max_abs_fails_on_nan_in_either_input() {
    let passes = |err: f64| err <= TOL;
    let clean = [0.25f32, -1.0, 3.0];
    assert!(passes(max_abs(&clean, &clean)));
    for i in 0..clean.len() {
        let mut nan = clean;
        nan[i] = f32::NAN;
        for err in [max_abs(&nan, &clean), max_abs(&clean, &nan)] {
            assert!(err.is_nan(), "NaN at {i} read as error {err}");
            assert!(!passes(err));
        }
    }
    let inf = [f32::INFINITY; 3];
    assert!(!passes(max_abs(&inf, &inf)), "inf - inf must not pass");
    assert!(worse(0.5, f64::NAN).is_nan() && worse(f64::NAN, 0.5).is_nan());
}

/// Compares a tensor with the fixture tensor `want` to `tol`; returns the max abs error.
pub fn check<B: Backend, const D: usize>(
    what: &str,
    got: Tensor<B, D>,
    want: &Value,
    tol: f64,
) -> f64 {
    let (shape, data) = values(want);
    assert_eq!(got.dims().to_vec(), shape, "{what}: shape");
    let got: Vec<f32> = got.into_data().convert::<f32>().to_vec().unwrap();
    let err = max_abs(&got, &data);
    eprintln!("{what}: max abs error {err:.3e} (tolerance {tol:e})");
    assert!(err <= tol, "{what}: max abs error {err:e} > {tol:e}");
    err
}
