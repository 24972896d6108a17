//! The reference fixtures, run on the GPU backends compiled into this build: the sde-math
//! kernels, the Qwen-Image transformer (base, PEFT adapter, bf16 sharded checkpoint, LoRA
//! gradients), and the other Qwen-Image components (text encoder, prompt encoding, VAE).
//!
//! `cargo test --features wgpu --test backend_parity` runs them on wgpu (on a machine without a
//! GPU, Mesa's lavapipe software Vulkan driver serves); `--features cuda` on CUDA. Without either
//! feature this file tests nothing (the CPU backends are covered by `cargo test -p sde-math` and
//! `cargo test -p dit-models`).

#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[path = "../crates/sde-math/tests/support/parity.rs"]
mod parity;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[path = "../crates/dit-models/tests/support/mod.rs"]
mod dit;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[path = "../crates/qwen-image/tests/support/mod.rs"]
mod qwen;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn sde_math_fixtures<B: burn::tensor::backend::Backend>(name: &str, dev: &B::Device) {
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

/// Whether `err` should replace `worst` as the worst error seen: a NaN error always does (and,
/// once worst, is never replaced), so the final `worst <= tol` fails on it; `err > worst` alone
/// is false for a NaN and would drop it.
fn is_worse(err: f64, worst: f64) -> bool {
    !worst.is_nan() && (err.is_nan() || err > worst)
}

/// [`is_worse`] keeps the first NaN error as the worst, whatever comes before or after it.
#[test]
fn a_nan_error_is_the_worst_and_stays_so() {
    let mut worst = 0.0;
    for err in [1e-6, 3e-6, f64::NAN, 1.0, f64::NAN, 2e-6] {
        if is_worse(err, worst) {
            worst = err;
        }
    }
    assert!(worst.is_nan());
    let (mut worst, mut at) = (0.0, 0);
    for (i, err) in [1e-6, f64::NAN, 1.0, f64::NAN].into_iter().enumerate() {
        if is_worse(err, worst) {
            (worst, at) = (err, i);
        }
    }
    assert!(worst.is_nan() && at == 1, "the first NaN is named");
    assert!(is_worse(2.0, 1.0) && !is_worse(1.0, 2.0));
}

/// How close a GPU backend's transformer comes to the fixtures, relative to the largest output
/// (or gradient) magnitude.
///
/// wgpu computes f32 matrix products in f32: the CPU tests' tolerance (1e-4 absolute, on
/// outputs of magnitude ~2) holds. CUDA's matmul runs f32 inputs through the tensor cores in
/// TF32 (cubek-matmul picks TF32 stages whenever the device supports them, as PyTorch does
/// with `allow_tf32`), whose 10-bit mantissa has unit roundoff 2^-11: the bound is 4 of those.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[derive(Clone, Copy, Debug)]
// each GPU feature uses one of the two
#[cfg_attr(not(all(feature = "cuda", feature = "wgpu")), allow(dead_code))]
enum MatmulPrecision {
    F32,
    Tf32,
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
impl MatmulPrecision {
    fn relative_tolerance(self) -> f64 {
        match self {
            // the CPU tests' 1e-4 absolute on outputs of magnitude ~2
            Self::F32 => 5e-5,
            Self::Tf32 => 4.0 * 2f64.powi(-11),
        }
    }
}

/// The diffusers / PEFT forward fixtures on `B`: the f32 single-file checkpoint, the bf16
/// sharded one, and the PEFT adapter. Every error is printed before the worst is checked.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn transformer_fixtures<B: burn::tensor::backend::Backend>(
    name: &str,
    dev: &B::Device,
    precision: MatmulPrecision,
) {
    use dit_models::{Adapters, LoadOptions, QwenImageTransformer2DModel};
    let load = |layout: &str| {
        QwenImageTransformer2DModel::<B>::from_pretrained(
            dit::fixtures().join(layout),
            dev,
            LoadOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{layout}: {e}"))
    };
    let single = load("tiny_single");
    let sharded = load("tiny_sharded");
    let adapted = single
        .clone()
        .load_peft_adapter(dit::fixtures().join("tiny_lora"), None)
        .expect("PEFT adapter");
    let mut worst = (0.0, String::new());
    for c in dit::forward_cases() {
        let case = c["name"].as_str().unwrap();
        let input = || dit::input::<B>(&c, dev);
        for (what, out, want) in [
            ("single", single.forward(input()), &c["output"]),
            ("sharded_bf16", sharded.forward(input()), &c["output"]),
            ("adapted", adapted.forward(input()), &c["adapted_output"]),
            (
                "adapter_disabled",
                adapted.forward_with(input(), Adapters::Disabled),
                &c["output"],
            ),
        ] {
            let (shape, data) = dit::values(want);
            // both NaN-aware: a NaN output (or fixture value) makes `err` NaN
            let scale = dit::max_magnitude(&data);
            let err = dit::max_abs_diff(out, (&shape, &data)) / scale;
            println!("{name}/{what}/{case}: max abs error / max |output| = {err:.3e}");
            if is_worse(err, worst.0) {
                worst = (err, format!("{what}/{case}"));
            }
        }
    }
    let tol = precision.relative_tolerance();
    println!(
        "{name}: transformer forward, worst relative error {:.3e} ({}), tolerance {tol:.3e} ({precision:?})",
        worst.0, worst.1
    );
    assert!(
        worst.0 <= tol,
        "{name}: {}: relative error {:e} > {tol:e}",
        worst.1,
        worst.0
    );
}

/// LoRA gradients of a loss through the adapted transformer on `B`, against the same on the
/// CPU backend (whose forward matches PEFT): max abs difference relative to the largest gradient.
/// Every error is printed before the worst is checked.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn lora_gradients<B: burn::tensor::backend::AutodiffBackend>(
    name: &str,
    dev: &B::Device,
    precision: MatmulPrecision,
) {
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::backend::AutodiffBackend;
    use dit_models::{LoadOptions, QwenImageTransformer2DModel};

    fn grads<A: AutodiffBackend>(dev: &A::Device) -> Vec<(String, Vec<usize>, Vec<f32>)> {
        let model = QwenImageTransformer2DModel::<A>::from_pretrained(
            dit::fixtures().join("tiny_single"),
            dev,
            LoadOptions::default(),
        )
        .unwrap()
        .load_peft_adapter(dit::fixtures().join("tiny_lora"), None)
        .unwrap();
        let c = dit::case("text_mask");
        let out = model.forward(dit::input::<A>(&c, dev));
        let g = out.powi_scalar(2).mean().backward();
        let mut all = Vec::new();
        for (i, block) in model.transformer_blocks.iter().enumerate() {
            for (proj, lin) in [("to_q", &block.attn.to_q), ("to_out", &block.attn.to_out)] {
                let lora = lin.lora.as_ref().expect("adapted projection");
                for (ab, p) in [("a", &lora.lora_a), ("b", &lora.lora_b)] {
                    let t = p
                        .grad(&g)
                        .unwrap_or_else(|| panic!("block {i} {proj} lora_{ab}: no grad"));
                    let dims = t.dims().to_vec();
                    let v = t.into_data().convert::<f32>().to_vec().unwrap();
                    all.push((format!("blocks.{i}.{proj}.lora_{ab}"), dims, v));
                }
            }
        }
        all
    }

    let want = grads::<Autodiff<Flex>>(&Default::default());
    let got = grads::<B>(dev);
    assert_eq!(want.len(), got.len(), "LoRA gradient count");
    let scale = want
        .iter()
        .map(|(_, _, v)| dit::max_magnitude(v))
        .fold(0.0, dit::worse);
    assert!(!scale.is_nan(), "a CPU LoRA gradient is NaN");
    assert!(scale > 0.0, "all LoRA gradients are zero");
    let tol = precision.relative_tolerance();
    let mut worst = (0.0, "");
    for ((n, wd, w), (_, gd, g)) in want.iter().zip(&got) {
        assert_eq!(wd, gd, "{n}: gradient shape");
        // NaN-aware: a NaN gradient makes `err` NaN
        let err = dit::max_abs_err(g, w) / scale;
        println!("{name}: {n}: max abs error / max |gradient| = {err:.3e}");
        if is_worse(err, worst.0) {
            worst = (err, n);
        }
    }
    println!(
        "{name}: {} LoRA gradients against the CPU backend, worst relative error {:.3e} ({}), tolerance {tol:.3e} ({precision:?})",
        want.len(),
        worst.0,
        worst.1
    );
    assert!(
        worst.0 <= tol,
        "{name}: {}: relative gradient error {:e} > {tol:e}",
        worst.1,
        worst.0
    );
}

/// The Qwen-Image text encoder (`hidden_states[-1]` of a padded batch), `encode_prompt` and the
/// VAE (decode, encode) on `B` against transformers / diffusers (`fixtures/qwen_image`): max
/// abs error relative to the largest reference value. Every error is printed before the worst
/// is checked.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn qwen_image_components<B: burn::tensor::backend::Backend>(
    name: &str,
    dev: &B::Device,
    precision: MatmulPrecision,
) {
    use burn::tensor::{Tensor, TensorData};
    use qwen_image::{PromptEncoder, QwenTokenizer, TextEncoder, TokenBatch, Vae};
    let root = qwen::fixtures();
    let read = |file: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(root.join(file)).unwrap()).unwrap()
    };
    let tensor = |v: &serde_json::Value| -> Tensor<B, 4> {
        let (shape, data) = dit::values(v);
        Tensor::from_data(TensorData::new(data, shape), dev)
    };
    let mut worst = (0.0, String::new());
    let mut check = |what: &str, got: Tensor<B, 3>, want: &serde_json::Value| {
        let (shape, data) = dit::values(want);
        let err = dit::max_abs_diff(got, (&shape, &data)) / dit::max_magnitude(&data);
        println!("{name}/{what}: max abs error / max |output| = {err:.3e}");
        if is_worse(err, worst.0) {
            worst = (err, what.to_string());
        }
    };
    let te = read("text_encoder.json");
    let pipeline = root.join("tiny_pipeline");
    let (encoder, _) = TextEncoder::<B>::from_dir(pipeline.join("text_encoder"), dev).unwrap();
    let batch = TokenBatch {
        ids: qwen::rows(&te["hidden"]["input_ids"]),
        mask: qwen::rows(&te["hidden"]["attention_mask"]),
    };
    check(
        "text_encoder",
        encoder.forward(&batch, dev).unwrap(),
        &te["hidden"]["last_hidden_state"],
    );
    let prompts = PromptEncoder::new(
        QwenTokenizer::from_dir(pipeline.join("tokenizer")).unwrap(),
        encoder,
    );
    for case in te["encode_prompt"].as_array().unwrap() {
        let texts: Vec<&str> = qwen::strings(&case["prompts"]);
        let max = case["max_sequence_length"].as_u64().unwrap() as usize;
        let got = prompts.encode(&texts, max, dev).unwrap().embeds;
        check(&format!("encode_prompt_{max}"), got, &case["prompt_embeds"]);
    }
    let vae_case = &read("vae.json")["vae"];
    let (vae, _) = Vae::<B>::from_dir(pipeline.join("vae"), dev).unwrap();
    let flat = |t: Tensor<B, 4>| {
        let [b, c, h, w] = t.dims();
        t.reshape([b, c, h * w])
    };
    let flat_want = |v: &serde_json::Value| {
        let (shape, data) = dit::values(v);
        serde_json::json!({"shape": [shape[0], shape[1], shape[2] * shape[3]], "data": data})
    };
    let decoded = vae.decode_unclamped(tensor(&vae_case["latents"]));
    check(
        "vae_decode",
        flat(decoded),
        &flat_want(&vae_case["decoded_unclamped"]),
    );
    let moments = vae.encode_moments(tensor(&vae_case["image"]));
    check(
        "vae_encode",
        flat(moments),
        &flat_want(&vae_case["encoded"]),
    );
    let tol = precision.relative_tolerance();
    println!(
        "{name}: Qwen-Image components, worst relative error {:.3e} ({}), tolerance {tol:.3e} ({precision:?})",
        worst.0, worst.1
    );
    assert!(
        worst.0 <= tol,
        "{name}: {}: relative error {:e} > {tol:e}",
        worst.1,
        worst.0
    );
}

#[cfg(feature = "wgpu")]
#[test]
fn qwen_image_components_match_on_wgpu() {
    qwen_image_components::<flowrl::backend::Wgpu>(
        "wgpu",
        &Default::default(),
        MatmulPrecision::F32,
    );
}

#[cfg(feature = "cuda")]
#[test]
fn qwen_image_components_match_on_cuda() {
    qwen_image_components::<flowrl::backend::Cuda>(
        "cuda",
        &Default::default(),
        MatmulPrecision::Tf32,
    );
}

#[cfg(feature = "wgpu")]
#[test]
fn sde_math_fixtures_match_on_wgpu() {
    sde_math_fixtures::<flowrl::backend::Wgpu>("wgpu", &Default::default());
}

#[cfg(feature = "wgpu")]
#[test]
fn transformer_fixtures_match_on_wgpu() {
    transformer_fixtures::<flowrl::backend::Wgpu>(
        "wgpu",
        &Default::default(),
        MatmulPrecision::F32,
    );
}

#[cfg(feature = "wgpu")]
#[test]
fn lora_gradients_match_on_wgpu() {
    lora_gradients::<burn::backend::Autodiff<flowrl::backend::Wgpu>>(
        "wgpu",
        &Default::default(),
        MatmulPrecision::F32,
    );
}

#[cfg(feature = "cuda")]
#[test]
fn sde_math_fixtures_match_on_cuda() {
    sde_math_fixtures::<flowrl::backend::Cuda>("cuda", &Default::default());
}

#[cfg(feature = "cuda")]
#[test]
fn transformer_fixtures_match_on_cuda() {
    transformer_fixtures::<flowrl::backend::Cuda>(
        "cuda",
        &Default::default(),
        MatmulPrecision::Tf32,
    );
}

#[cfg(feature = "cuda")]
#[test]
fn lora_gradients_match_on_cuda() {
    lora_gradients::<burn::backend::Autodiff<flowrl::backend::Cuda>>(
        "cuda",
        &Default::default(),
        MatmulPrecision::Tf32,
    );
}
