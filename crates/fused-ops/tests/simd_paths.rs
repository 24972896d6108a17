//! Every instruction-set path of the CPU kernels gives the same bits: the portable loop, AVX2
//! and AVX-512F (each where this CPU has it), forward and backward. The results of a run must
//! not depend on which CPU of one architecture it ran on, beyond what burn's own kernels do.

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, DType, Tensor, TensorData};
use fused_ops::{
    LoraTerm, NextSample, attention, combine, gated_residual, gaussian_step, gelu_tanh,
    layer_norm_modulated, linear, mean_square_residual, rms_norm, rope, round_through,
    with_simd_cap,
};

mod common;

thread_local!(static KEY: std::cell::Cell<u64> = const { std::cell::Cell::new(0) });

/// The next tensor of a sequence that [`every_kernel`] restarts, so each of its runs gets the
/// same inputs.
fn random<B: Backend, const D: usize>(shape: [usize; D], scale: f64) -> Tensor<B, D> {
    let key = KEY.with(|k| k.replace(k.get() + 1));
    common::random_keyed(key, shape, scale)
}

type Ad = Autodiff<Flex>;

fn bits<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<u32> {
    t.into_data()
        .into_vec::<f32>()
        .expect("an f32 tensor")
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

/// Every kernel once, forward and backward on `Autodiff<Flex>`, at sizes that also take the
/// kernels' split paths (rows and chunks over the pool); every output's and gradient's bits.
fn every_kernel() -> Vec<(&'static str, Vec<u32>)> {
    KEY.with(|k| k.set(0));
    let mut out = Vec::new();
    let (b, s, h, d) = (2, 37, 3, 16);
    let dim = h * d;

    // GELU
    let x = random::<Ad, 3>([b, s, 65], 3.0).require_grad();
    let y = gelu_tanh(x.clone());
    let g = (y.clone() * random::<Ad, 3>([b, s, 65], 1.0))
        .sum()
        .backward();
    out.push(("gelu", bits(y.inner())));
    out.push(("gelu grad", bits(x.grad(&g).expect("x's gradient"))));

    // RoPE, then attention with a key mask
    let (cos, sin) = (random::<Ad, 2>([s, d], 1.0), random::<Ad, 2>([s, d], 1.0));
    let q = random::<Ad, 4>([b, s, h, d], 1.0).require_grad();
    let k = random::<Ad, 4>([b, s, h, d], 1.0).require_grad();
    let v = random::<Ad, 4>([b, h, s, d], 1.0).require_grad();
    let qr = rope(q.clone(), cos.clone(), sin.clone()).swap_dims(1, 2);
    let kr = rope(k.clone(), cos, sin).swap_dims(1, 2);
    let keep: Vec<bool> = (0..b * s).map(|i| i % s < s - 3 * (i / s)).collect();
    let mask = Tensor::<Ad, 2, Bool>::from_data(TensorData::new(keep, [b, s]), &q.device());
    let o = attention(qr, kr, v.clone(), Some(mask));
    let g = (o.clone() * random::<Ad, 4>([b, h, s, d], 1.0))
        .sum()
        .backward();
    out.push(("attention", bits(o.inner())));
    out.push((
        "attention + rope grad q",
        bits(q.grad(&g).expect("q's gradient")),
    ));
    out.push((
        "attention + rope grad k",
        bits(k.grad(&g).expect("k's gradient")),
    ));
    out.push(("attention grad v", bits(v.grad(&g).expect("v's gradient"))));

    // the modulated layer norm, the gated residual and the RMS norm
    let x = random::<Ad, 3>([b, s, dim], 2.0).require_grad();
    let shift = random::<Ad, 3>([b, 1, dim], 1.0).require_grad();
    let scale = random::<Ad, 3>([b, 1, dim], 1.0).require_grad();
    let r = random::<Ad, 3>([b, s, dim], 1.0).require_grad();
    let gate = random::<Ad, 3>([b, 1, dim], 1.0).require_grad();
    let w = random::<Ad, 1>([dim], 1.0).require_grad();
    let n = layer_norm_modulated(x.clone(), shift.clone(), scale.clone(), 1e-6);
    let res = gated_residual(n.clone(), r.clone(), gate.clone());
    let y = rms_norm(res.clone(), w.clone(), 1e-6);
    let g = (y.clone() * random::<Ad, 3>([b, s, dim], 1.0))
        .sum()
        .backward();
    out.push(("norms", bits(y.inner())));
    for (name, t) in [
        ("norms grad x", x),
        ("norms grad shift", shift),
        ("norms grad scale", scale),
        ("norms grad r", r),
        ("norms grad gate", gate),
    ] {
        out.push((name, bits(t.grad(&g).expect("a gradient"))));
    }
    out.push(("rms grad weight", bits(w.grad(&g).expect("w's gradient"))));

    // the linear layer with its LoRA term
    let x = random::<Ad, 3>([b, s, dim], 1.0).require_grad();
    let weight = random::<Ad, 2>([dim, 40], 0.2);
    let bias = random::<Ad, 1>([40], 0.2);
    let a = random::<Ad, 2>([dim, 4], 0.2).require_grad();
    let bb = random::<Ad, 2>([4, 40], 0.2).require_grad();
    let lora = LoraTerm {
        a: a.clone(),
        b: bb.clone(),
        scale: 2.0,
    };
    let y = linear(x.clone(), weight, Some(bias), Some(lora));
    let g = (y.clone() * random::<Ad, 3>([b, s, 40], 1.0))
        .sum()
        .backward();
    out.push(("linear", bits(y.inner())));
    out.push(("linear grad x", bits(x.grad(&g).expect("x's gradient"))));
    out.push(("linear grad A", bits(a.grad(&g).expect("A's gradient"))));
    out.push(("linear grad B", bits(bb.grad(&g).expect("B's gradient"))));

    // the sampler's step kernels, on rows large enough to split
    let rows = [3, 300, 1000];
    let x = random::<Flex, 3>(rows, 1.0);
    let v = random::<Flex, 3>(rows, 1.0);
    let (ca, cc) = ([0.9, 1.0, 1.1], [-0.1, -0.05, 0.2]);
    out.push(("combine", bits(combine(x.clone(), &ca, v.clone(), &cc))));
    let step = gaussian_step(
        x.clone(),
        &ca,
        v.clone(),
        &cc,
        NextSample::Draw {
            noise: random::<Flex, 3>(rows, 1.0),
            std: &[0.3, 0.2, 0.1],
        },
        Some(DType::BF16),
    );
    out.push(("step mean", bits(step.mean.clone())));
    out.push(("step sample", bits(step.next.clone())));
    out.push(("step mean square", bits(step.mean_sq)));
    out.push((
        "mean square residual",
        bits(mean_square_residual(step.next, step.mean)),
    ));
    out.push(("round to bf16", bits(round_through(x, DType::BF16))));
    out
}

#[test]
fn every_instruction_set_gives_the_same_bits() {
    #[cfg(target_arch = "x86_64")]
    eprintln!(
        "this CPU: AVX2 {}, AVX-512F {}",
        std::is_x86_feature_detected!("avx2"),
        std::is_x86_feature_detected!("avx512f")
    );
    // one thread, so that the kernels' split work runs where the cap is set
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a one-thread pool");
    let run = |cap: u8| pool.install(|| with_simd_cap(cap, every_kernel));
    let widest = run(2);
    for cap in [0, 1] {
        let got = run(cap);
        assert_eq!(got.len(), widest.len());
        for ((name, a), (_, b)) in got.iter().zip(&widest) {
            assert!(!a.is_empty(), "{name}: no output");
            let diff = a.iter().zip(b).filter(|(x, y)| x != y).count();
            assert_eq!(
                diff,
                0,
                "{name}: {diff} of {} elements differ between path {cap} and the widest",
                a.len()
            );
        }
    }
}
