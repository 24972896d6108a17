//! The VAE and the latent packing against diffusers (`fixtures/qwen_image/vae.json`, written by
//! `fixtures/generate/qwen_image_fixtures.py` from the tiny Qwen-Image directory's
//! `AutoencoderKLQwenImage`), and the errors of bad configurations.

use std::path::PathBuf;

use burn::backend::NdArray;
use burn::backend::flex::Flex;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use qwen_image::latents::{pack_latents, unpack_latents};
use qwen_image::{QwenImageError, Vae, VaeConfig};
use serde_json::Value;

mod support;

use support::{BF16_VS_PYTORCH, TOL, fixtures, max_abs_err, values};

fn fixture() -> Value {
    support::fixture("vae.json")
}

fn vae_dir() -> PathBuf {
    fixtures().join("tiny_pipeline").join("vae")
}

fn tensor<B: Backend, const D: usize>(v: &Value, device: &B::Device) -> Tensor<B, D> {
    let (shape, data) = values(v);
    Tensor::from_data(TensorData::new(data, shape), device)
}

fn check<B: Backend, const D: usize>(what: &str, got: Tensor<B, D>, want: &Value) {
    let (shape, data) = values(want);
    assert_eq!(got.dims().to_vec(), shape, "{what}: shape");
    let got: Vec<f32> = got.into_data().convert::<f32>().to_vec().unwrap();
    let err = max_abs_err(&got, &data);
    eprintln!("{what}: max abs error {err:.3e}");
    assert!(err <= TOL, "{what}: max abs error {err:e} > {TOL:e}");
}

fn vae_matches_diffusers<B: Backend>(device: &B::Device) {
    let f = fixture();
    let case = &f["vae"];
    let (vae, config) = Vae::<B>::from_dir(vae_dir(), device).unwrap();
    assert_eq!(
        (config.z_dim, config.scale_factor(), vae.scale_factor()),
        (4, 8, 8)
    );
    let z = tensor::<B, 4>(&case["latents"], device);
    check("decode", vae.decode(z.clone()), &case["decoded"]);
    check(
        "decode before the clamp",
        vae.decode_unclamped(z),
        &case["decoded_unclamped"],
    );
    let x = tensor::<B, 4>(&case["image"], device);
    check(
        "encode: moments",
        vae.encode_moments(x.clone()),
        &case["encoded"],
    );
    let dist = vae.encode(x);
    check("encode: mean", dist.mean, &case["mean"]);
    check("encode: log-variance", dist.logvar, &case["logvar"]);
    // The pipeline's last step.
    let p = &f["pipeline_decode"];
    let (height, width) = (
        p["height"].as_u64().unwrap() as usize,
        p["width"].as_u64().unwrap() as usize,
    );
    let unpacked = tensor::<B, 4>(&p["unpacked"], device);
    let [_, _, h, w] = unpacked.dims();
    let packed = pack_latents(unpacked.clone()).unwrap();
    check("pack", packed.clone(), &p["packed"]);
    check(
        "unpack",
        unpack_latents(packed.clone(), h, w).unwrap(),
        &p["unpacked"],
    );
    check(
        "decode to [0, 1] from packed tokens",
        vae.decode_packed(packed, height, width).unwrap(),
        &p["image"],
    );
}

#[test]
fn vae_matches_diffusers_on_flex() {
    vae_matches_diffusers::<Flex>(&Default::default());
}

#[test]
fn vae_matches_diffusers_on_ndarray() {
    vae_matches_diffusers::<NdArray<f32>>(&Default::default());
}

#[test]
fn normalize_inverts_denormalize() {
    let device = Default::default();
    let (vae, _) = Vae::<Flex>::from_dir(vae_dir(), &device).unwrap();
    let x = Tensor::<Flex, 4>::from_data(
        TensorData::new(
            (0..48).map(|i| i as f32 * 0.1 - 2.0).collect::<Vec<_>>(),
            [1, 4, 3, 4],
        ),
        &device,
    );
    let back = vae.normalize(vae.denormalize(x.clone()));
    let got: Vec<f32> = back.into_data().to_vec().unwrap();
    let want: Vec<f32> = x.into_data().to_vec().unwrap();
    assert!(max_abs_err(&got, &want) <= 1e-5);
}

#[test]
fn packing_refuses_sizes_that_do_not_fit() {
    let device = Default::default();
    let odd = Tensor::<Flex, 4>::zeros([1, 4, 3, 4], &device);
    assert!(pack_latents(odd).unwrap_err().to_string().contains("3x4"));
    let tokens = Tensor::<Flex, 3>::zeros([1, 6, 16], &device);
    let err = unpack_latents(tokens, 4, 4).unwrap_err().to_string();
    assert!(err.contains("6 tokens") && err.contains("4x4"), "{err}");
}

fn edited(edit: impl FnOnce(&mut Value)) -> Result<VaeConfig, QwenImageError> {
    let dir = tempfile::tempdir().unwrap();
    let mut v: Value =
        serde_json::from_str(&std::fs::read_to_string(vae_dir().join("config.json")).unwrap())
            .unwrap();
    edit(&mut v);
    let path = dir.path().join("config.json");
    std::fs::write(&path, serde_json::to_string(&v).unwrap()).unwrap();
    VaeConfig::from_json_file(&path)
}

#[test]
fn every_vae_config_key_is_implemented_or_refused_by_name() {
    assert_eq!(
        edited(|_| {}).unwrap().latents_std,
        vec![1.5, 0.8, 1.2, 2.0]
    );
    let err = edited(|v| {
        v["attn_scales"] = serde_json::json!([0.5]);
        v["latents_std"] = serde_json::json!([1.0, 2.0]);
        v["temperal_downsample"] = serde_json::json!([true]);
        v["use_tiling_by_default"] = true.into();
        v["_class_name"] = "AutoencoderKLWan".into();
    })
    .unwrap_err();
    let QwenImageError::Config { problems, .. } = &err else {
        panic!("{err}")
    };
    let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
    for key in [
        "attn_scales",
        "latents_std",
        "temperal_downsample",
        "use_tiling_by_default",
        "_class_name",
    ] {
        assert!(keys.contains(&key), "{key} not named in {err}");
    }
}

#[test]
fn a_vae_checkpoint_that_does_not_fit_is_named() {
    // The config asks for more residual blocks than the checkpoint holds.
    let dir = tempfile::tempdir().unwrap();
    let mut v: Value =
        serde_json::from_str(&std::fs::read_to_string(vae_dir().join("config.json")).unwrap())
            .unwrap();
    v["num_res_blocks"] = 2.into();
    std::fs::write(
        dir.path().join("config.json"),
        serde_json::to_string(&v).unwrap(),
    )
    .unwrap();
    std::fs::copy(
        vae_dir().join("diffusion_pytorch_model.safetensors"),
        dir.path().join("diffusion_pytorch_model.safetensors"),
    )
    .unwrap();
    let err = Vae::<Flex>::from_dir(dir.path(), &Default::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("decoder.up_blocks.0.resnets.2.conv1.weight") && err.contains("missing"),
        "{err}"
    );
}

/// The VAE with its weights in another float dtype (cast with
/// `model_weights::cast_float_params` to f64; read in bf16 as the pipeline reads it): f32
/// inputs are cast to the weights' dtype and the outputs come back in f32. In f64 it matches
/// diffusers' f32 output as closely as in f32; in bf16 (which Flex computes too, as a GPU
/// does) its pipeline decode strays from it no further than diffusers' own bf16 decode does
/// (times [`BF16_VS_PYTORCH`]).
#[test]
fn the_vae_runs_in_its_weights_dtype() {
    use burn::tensor::DType;
    let device = Default::default();
    let f = fixture();
    let p = &f["pipeline_decode"];
    let (height, width) = (
        p["height"].as_u64().unwrap() as usize,
        p["width"].as_u64().unwrap() as usize,
    );
    let packed = || pack_latents(tensor::<Flex, 4>(&p["unpacked"], &device)).unwrap();
    let (vae, _) = Vae::<Flex>::from_dir(vae_dir(), &device).unwrap();

    let wide = model_weights::cast_float_params(vae.clone(), DType::F64);
    assert_eq!(wide.dtype(), DType::F64);
    let image = wide.decode_packed(packed(), height, width).unwrap();
    assert_eq!(image.dtype(), DType::F32, "the output in the input's dtype");
    check(
        "f64: decode to [0, 1] from packed tokens",
        image,
        &p["image"],
    );
    let case = &f["vae"];
    let moments = wide.encode_moments(tensor::<Flex, 4>(&case["image"], &device));
    assert_eq!(moments.dtype(), DType::F32);
    check("f64: encode: moments", moments, &case["encoded"]);

    // The pipeline's path: the weights made in bf16 on the host as they are read.
    let (narrow, _) =
        Vae::<Flex>::from_dir_variant_in(vae_dir(), None, DType::BF16, &device).unwrap();
    assert_eq!(narrow.dtype(), DType::BF16);
    let image = narrow.decode_packed(packed(), height, width).unwrap();
    assert_eq!(image.dtype(), DType::F32);
    let (_, want) = values(&p["image"]);
    let (_, torch) = values(&support::bf16_fixture()["vae"]["image_bf16"]);
    let got: Vec<f32> = image.into_data().to_vec().unwrap();
    let ours = max_abs_err(&got, &want);
    let theirs = max_abs_err(&torch, &want);
    eprintln!("bf16 decode to [0, 1]: flowrl strays {ours:.3e}, diffusers {theirs:.3e}");
    assert!(
        ours <= BF16_VS_PYTORCH * theirs,
        "bf16 decode: {ours:e} against diffusers' {theirs:e}"
    );
}

/// Reading in bf16 rounds each weight to the nearest bf16 (checked with the `half` crate), as
/// PyTorch's `.to(torch.bfloat16)` does: the same weights as reading in f32 and rounding.
#[test]
fn reading_the_vae_in_bf16_rounds_each_weight_to_nearest() {
    use burn::module::{Module, ModuleVisitor, Param};
    use burn::tensor::DType;
    struct All(Vec<(DType, Vec<f32>)>);
    impl<B: Backend> ModuleVisitor<B> for All {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            let v = p.val();
            self.0
                .push((v.dtype(), v.into_data().convert::<f32>().to_vec().unwrap()));
        }
    }
    let device = Default::default();
    let (read, _) =
        Vae::<Flex>::from_dir_variant_in(vae_dir(), None, DType::BF16, &device).unwrap();
    let (wide, _) = Vae::<Flex>::from_dir(vae_dir(), &device).unwrap();
    let (mut got, mut want) = (All(Vec::new()), All(Vec::new()));
    read.visit(&mut got);
    wide.visit(&mut want);
    assert!(!got.0.is_empty());
    assert_eq!(got.0.len(), want.0.len());
    for ((dtype, g), (_, w)) in got.0.iter().zip(&want.0) {
        assert_eq!(*dtype, DType::BF16);
        let rounded: Vec<f32> = w
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_f32())
            .collect();
        assert_eq!(g, &rounded);
    }
}
