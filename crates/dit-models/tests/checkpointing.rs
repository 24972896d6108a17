//! Per-block activation checkpointing gives the gradients of the plain backward.

mod support;

use std::collections::BTreeMap;

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{DType, Tensor};
use dit_models::{ActivationCheckpointing, Adapters, LoadOptions, QwenImageTransformer2DModel};
use support::*;

type AD = Autodiff<Flex>;

/// Compares the gradients of every parameter in two `GradientsParams`.
struct Compare<'a> {
    a: &'a GradientsParams,
    b: &'a GradientsParams,
    present: usize,
    absent: usize,
    worst_rel: f64,
    path: Vec<String>,
}

impl ModuleVisitor<AD> for Compare<'_> {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.into());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AD, D>>) {
        let ga = self.a.get::<Flex, D>(param.id);
        let gb = self.b.get::<Flex, D>(param.id);
        match (ga, gb) {
            (Some(x), Some(y)) => {
                self.present += 1;
                let scale = y.clone().abs().max().into_scalar() as f64;
                let err = diff(x, y);
                let rel = err / scale.max(1e-12);
                if rel.is_nan() || rel > 1e-4 {
                    eprintln!("{}: relative error {rel:.2e}", self.path.join("."));
                }
                self.worst_rel = worse(self.worst_rel, rel);
            }
            (None, None) => self.absent += 1,
            (x, y) => panic!(
                "{}: gradient present in one mode only: checkpointed {} vs plain {}",
                self.path.join("."),
                x.is_some(),
                y.is_some()
            ),
        }
    }
}

fn compare(
    model: &QwenImageTransformer2DModel<AD>,
    case_name: &str,
    adapters: Adapters,
) -> (usize, usize, f64) {
    let dev = Default::default();
    let c = case(case_name);
    let target = tensor::<AD, 3>(&c["output"], &dev).mul_scalar(0.5);
    let loss = |v: Tensor<AD, 3>| (v - target.clone()).powi_scalar(2).mean().mul_scalar(1e3);
    let plain = model.forward_backward(
        input::<AD>(&c, &dev),
        adapters,
        ActivationCheckpointing::None,
        loss,
    );
    let ckpt = model.forward_backward(
        input::<AD>(&c, &dev),
        adapters,
        ActivationCheckpointing::PerBlock,
        loss,
    );
    let scale = plain.loss.clone().abs().into_scalar() as f64;
    assert!(scale > 1e-3, "a loss with a real gradient");
    assert!(
        diff(plain.loss.clone(), ckpt.loss.clone()) <= 1e-6 * scale,
        "losses differ"
    );
    let mut v = Compare {
        a: &ckpt.grads,
        b: &plain.grads,
        present: 0,
        absent: 0,
        worst_rel: 0.0,
        path: Vec::new(),
    };
    model.visit(&mut v);
    eprintln!(
        "{case_name}: {} gradients compared, {} absent, worst relative error {:.2e}",
        v.present, v.absent, v.worst_rel
    );
    (v.present, v.absent, v.worst_rel)
}

#[test]
fn per_block_checkpointing_matches_plain_backward_lora() {
    let model = QwenImageTransformer2DModel::<AD>::from_pretrained(
        fixtures().join("tiny_single"),
        &Default::default(),
        LoadOptions::default(),
    )
    .unwrap()
    .load_peft_adapter(fixtures().join("tiny_lora"), None)
    .unwrap();
    let (present, absent, rel) = compare(&model, "text_mask", Adapters::Enabled);
    // 16 adapters x (A, B), less the last block's `to_add_out`: the last block's text stream
    // feeds nothing, so (as in diffusers) that adapter gets no gradient.
    assert_eq!(present, 30, "exactly the adapter tensors get gradients");
    assert_eq!(absent, 77 + 2);
    assert!(rel < 1e-4, "relative gradient error {rel}");
}

#[test]
fn per_block_checkpointing_matches_plain_backward_full() {
    let model = QwenImageTransformer2DModel::<AD>::from_pretrained(
        fixtures().join("tiny_single"),
        &Default::default(),
        LoadOptions::default(),
    )
    .unwrap();
    let (present, absent, rel) = compare(&model, "square", Adapters::Enabled);
    // every base parameter but the last block's text-only output path (`to_add_out`,
    // `txt_mlp`: weight and bias each), which feeds nothing
    assert_eq!((present, absent), (71, 6));
    assert!(rel < 1e-4, "relative gradient error {rel}");
}

/// The model with its weights cast to f64 (`model_weights::cast_float_params`; f64 is the other
/// float the CPU backend has, and bf16 on a GPU takes the same path): the forward builds its
/// tables in the activations' dtype, and the plain and the per-block backward both run in f64
/// and give the f32 gradients.
#[test]
fn a_model_cast_to_another_float_dtype_trains_in_it() {
    let dev = Default::default();
    let model = QwenImageTransformer2DModel::<AD>::from_pretrained(
        fixtures().join("tiny_single"),
        &dev,
        LoadOptions::default(),
    )
    .unwrap()
    .load_peft_adapter(fixtures().join("tiny_lora"), None)
    .unwrap();
    let c = case("text_mask");
    let target = tensor::<AD, 3>(&c["output"], &dev).mul_scalar(0.5);
    let loss = |v: Tensor<AD, 3>| {
        let t = target.clone().cast(v.dtype());
        (v - t).powi_scalar(2).mean().mul_scalar(1e3)
    };
    let want = model.forward_backward(
        input::<AD>(&c, &dev),
        Adapters::Enabled,
        ActivationCheckpointing::PerBlock,
        loss,
    );
    let wide = model_weights::cast_float_params(model, DType::F64);
    let wide_input = || {
        let mut i = input::<AD>(&c, &dev);
        i.hidden_states = i.hidden_states.cast(DType::F64);
        i.encoder_hidden_states = i.encoder_hidden_states.cast(DType::F64);
        i.timestep = i.timestep.cast(DType::F64);
        i
    };
    let out = wide.forward(wide_input());
    assert_eq!(
        out.dtype(),
        DType::F64,
        "the forward stays in the weights' dtype"
    );
    for mode in [
        ActivationCheckpointing::None,
        ActivationCheckpointing::PerBlock,
    ] {
        let got = wide.forward_backward(wide_input(), Adapters::Enabled, mode, loss);
        assert_eq!(got.loss.dtype(), DType::F64);
        let scale = want.loss.clone().abs().into_scalar() as f64;
        assert!(
            diff(got.loss.clone(), want.loss.clone()) <= 1e-5 * scale,
            "{mode:?}: losses differ"
        );
        let mut v = Compare {
            a: &got.grads,
            b: &want.grads,
            present: 0,
            absent: 0,
            worst_rel: 0.0,
            path: Vec::new(),
        };
        wide.visit(&mut v);
        eprintln!(
            "f64 {mode:?}: {} gradients, worst relative error {:.2e}",
            v.present, v.worst_rel
        );
        assert_eq!(
            v.present, 30,
            "{mode:?}: exactly the adapter tensors get gradients"
        );
        assert!(
            v.worst_rel < 1e-4,
            "{mode:?}: relative gradient error {}",
            v.worst_rel
        );
    }
}

/// Base weights in another dtype than the adapters and the inputs (an f64 base with f32
/// adapters and f32 inputs; bf16 base weights on a GPU take the same path): the model computes
/// in its base's dtype and answers in the input's, the adapters and their gradients stay f32,
/// and it agrees with the all-f32 model in the forward, in both backward modes and with the
/// adapters merged into the base.
#[test]
fn f32_adapters_on_a_base_of_another_dtype() {
    let dev = Default::default();
    let base = QwenImageTransformer2DModel::<AD>::from_pretrained(
        fixtures().join("tiny_single"),
        &dev,
        LoadOptions::default(),
    )
    .unwrap();
    let all_f32 = base
        .clone()
        .load_peft_adapter(fixtures().join("tiny_lora"), None)
        .unwrap();
    let mixed = model_weights::cast_float_params(base, DType::F64)
        .load_peft_adapter(fixtures().join("tiny_lora"), None)
        .unwrap();
    assert_eq!(mixed.compute_dtype(), DType::F64);
    let c = case("text_mask");
    let want = all_f32.forward(input::<AD>(&c, &dev));
    let got = mixed.forward(input::<AD>(&c, &dev));
    assert_eq!(
        got.dtype(),
        DType::F32,
        "the output comes back in the input's dtype"
    );
    let scale = want.clone().abs().max().into_scalar() as f64;
    let err = diff(got.clone(), want.clone());
    eprintln!("mixed forward: max abs difference {err:.2e} (scale {scale:.2e})");
    assert!(err <= 1e-5 * scale, "forward: {err:e}");
    let merged = mixed
        .clone()
        .merge_adapters()
        .forward(input::<AD>(&c, &dev));
    assert!(diff(merged, got) <= 1e-5 * scale, "merged forward");

    let target = tensor::<AD, 3>(&c["output"], &dev).mul_scalar(0.5);
    let loss = |v: Tensor<AD, 3>| (v - target.clone()).powi_scalar(2).mean().mul_scalar(1e3);
    let want = all_f32.forward_backward(
        input::<AD>(&c, &dev),
        Adapters::Enabled,
        ActivationCheckpointing::PerBlock,
        loss,
    );
    let want = by_path(&all_f32, &want.grads);
    assert_eq!(want.len(), 30, "exactly the adapter tensors get gradients");
    for mode in [
        ActivationCheckpointing::None,
        ActivationCheckpointing::PerBlock,
    ] {
        let got = mixed.forward_backward(input::<AD>(&c, &dev), Adapters::Enabled, mode, loss);
        let got = by_path(&mixed, &got.grads);
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "{mode:?}: the same parameters get gradients"
        );
        let mut worst = 0.0f64;
        for (path, (dtype, g)) in &got {
            assert_eq!(*dtype, DType::F32, "{mode:?}: {path}'s gradient");
            let w = &want[path].1;
            let scale = w.iter().fold(0.0f64, |m, v| worse(m, f64::from(v.abs())));
            worst = worse(worst, max_abs_err(g, w) / scale.max(1e-12));
        }
        eprintln!("mixed {mode:?}: worst relative gradient error {worst:.2e}");
        assert!(worst < 1e-4, "{mode:?}: relative gradient error {worst}");
    }
}

/// Every gradient in `grads` of a parameter of `model`, by the parameter's path: its dtype and
/// values (models loaded apart have different parameter ids, not different paths).
fn by_path(
    model: &QwenImageTransformer2DModel<AD>,
    grads: &GradientsParams,
) -> BTreeMap<String, (DType, Vec<f32>)> {
    struct ByPath<'a> {
        grads: &'a GradientsParams,
        path: Vec<String>,
        out: BTreeMap<String, (DType, Vec<f32>)>,
    }
    impl ModuleVisitor<AD> for ByPath<'_> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.push(name.into());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AD, D>>) {
            if let Some(g) = self.grads.get::<Flex, D>(param.id) {
                let dtype = g.dtype();
                let values = g.into_data().convert::<f32>().to_vec().unwrap();
                self.out.insert(self.path.join("."), (dtype, values));
            }
        }
    }
    let mut v = ByPath {
        grads,
        path: Vec::new(),
        out: BTreeMap::new(),
    };
    model.visit(&mut v);
    v.out
}

/// How much further than PyTorch's bf16 forward of the same weights flowrl's may stray from
/// the f32 reference (`fixtures/dit_models/bf16.json`, from `fixtures/generate/bf16_fixtures.py`).
const BF16_VS_PYTORCH: f64 = 1.5;

/// bf16 base weights with f32 adapters (as a GPU run holds them; Flex computes bf16 too): the
/// adapted model's output strays from diffusers' f32 output no further than diffusers' own
/// bf16 forward with peft's f32 adapters does (times [`BF16_VS_PYTORCH`]).
#[test]
fn a_bf16_base_is_as_accurate_as_pytorchs() {
    let dev = Default::default();
    let text = std::fs::read_to_string(fixtures().join("bf16.json")).expect("bf16.json");
    let bf16: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(
        bf16["tolerance"]["bf16_vs_pytorch"].as_f64(),
        Some(BF16_VS_PYTORCH)
    );
    assert_eq!(bf16["case"], "text_mask");
    let base = QwenImageTransformer2DModel::<AD>::from_pretrained(
        fixtures().join("tiny_single"),
        &dev,
        LoadOptions::default(),
    )
    .unwrap();
    let model = model_weights::cast_float_params(base, DType::BF16)
        .load_peft_adapter(fixtures().join("tiny_lora"), None)
        .unwrap();
    let c = case("text_mask");
    let got = model.forward(input::<AD>(&c, &dev));
    assert_eq!(
        got.dtype(),
        DType::F32,
        "the output comes back in the input's dtype"
    );
    let got: Vec<f32> = got.into_data().to_vec().unwrap();
    let (_, want) = values(&c["adapted_output"]);
    let (_, torch) = values(&bf16["adapted_output_bf16"]);
    let ours = max_abs_err(&got, &want);
    let theirs = max_abs_err(&torch, &want);
    eprintln!("bf16 base, f32 adapters: flowrl strays {ours:.3e}, diffusers {theirs:.3e}");
    assert!(
        ours <= BF16_VS_PYTORCH * theirs,
        "bf16: {ours:e} against diffusers' {theirs:e}"
    );
}
