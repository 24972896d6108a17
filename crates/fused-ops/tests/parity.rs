//! The Flex kernels against the generic compositions they replace: values and gradients, on
//! contiguous and strided inputs, and the generic route taken elsewhere.

use burn::backend::{Autodiff, Flex, NdArray};
use burn::tensor::Bool;
use burn::tensor::backend::Backend;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Distribution, Tensor, TensorData};
use fused_ops::{Order, attention, gelu_tanh, reference, relayout, rope};
use proptest::prelude::*;

type Ad = Autodiff<Flex>;

/// The largest `|a - b| / max(1, |b|)`; fails on a NaN in either, or a shape mismatch.
fn worst_rel<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> f64 {
    assert_eq!(a.dims(), b.dims());
    let a = a.into_data().into_vec::<f32>().unwrap();
    let b = b.into_data().into_vec::<f32>().unwrap();
    a.iter().zip(&b).fold(0.0, |worst, (&a, &b)| {
        assert!(
            !a.is_nan() && !b.is_nan(),
            "NaN in a comparison: {a} against {b}"
        );
        let e = (a as f64 - b as f64).abs() / (b as f64).abs().max(1.0);
        if e > worst { e } else { worst }
    })
}

fn random<B: Backend, const D: usize>(shape: [usize; D], scale: f64) -> Tensor<B, D> {
    Tensor::random(shape, Distribution::Normal(0.0, scale), &Default::default())
}

/// Qwen-Image-like tables: per pair `cos a, cos a` and `-sin a, sin a`.
fn tables<B: Backend>(s: usize, d: usize) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let (mut c, mut sn) = (Vec::new(), Vec::new());
    for t in 0..s {
        for p in 0..d / 2 {
            let a = (t as f64 + 0.5) * 10f64.powf(-(p as f64) / (d as f64 / 2.0));
            c.extend([a.cos() as f32; 2]);
            sn.extend([-(a.sin() as f32), a.sin() as f32]);
        }
    }
    let dev = Default::default();
    (
        Tensor::from_data(TensorData::new(c, [s, d]), &dev),
        Tensor::from_data(TensorData::new(sn, [s, d]), &dev),
    )
}

#[test]
fn gelu_matches_the_composition_from_the_tails_through_zero() {
    let xs: Vec<f32> = (-8000..=8000)
        .map(|i| i as f32 * 0.0025)
        .chain([-1e4, -90.0, -30.0, 30.0, 90.0, 1e4, -0.0, f32::MIN_POSITIVE])
        .collect();
    let n = xs.len();
    let x = Tensor::<Flex, 1>::from_data(TensorData::new(xs, [n]), &Default::default());
    let e = worst_rel(gelu_tanh(x.clone()), reference::gelu_tanh(x));
    assert!(e < 1e-6, "gelu kernel against the composition: {e:.3e}");
}

#[test]
fn gelu_keeps_a_nan() {
    let x = Tensor::<Flex, 1>::from_data(
        TensorData::new(vec![1.0f32, f32::NAN, -2.0], [3]),
        &Default::default(),
    );
    let y = gelu_tanh(x).into_data().into_vec::<f32>().unwrap();
    assert!(y[1].is_nan() && !y[0].is_nan() && !y[2].is_nan(), "{y:?}");
}

#[test]
fn gelu_gradient_matches_the_composition() {
    let x0 = random::<Ad, 3>([3, 37, 65], 2.0);
    let w = random::<Ad, 3>([3, 37, 65], 1.0);
    let grad = |fused: bool| {
        let x = x0.clone().require_grad();
        let y = if fused {
            gelu_tanh(x.clone())
        } else {
            reference::gelu_tanh(x.clone())
        };
        let g = (y.clone() * w.clone()).sum().backward();
        (y.inner(), x.grad(&g).expect("x has a gradient"))
    };
    let ((yf, gf), (yr, gr)) = (grad(true), grad(false));
    let (ey, eg) = (worst_rel(yf, yr), worst_rel(gf, gr));
    assert!(
        ey < 1e-6 && eg < 2e-6,
        "values {ey:.3e}, gradients {eg:.3e}"
    );
}

#[test]
fn a_large_gelu_runs_in_parallel_chunks_and_gives_the_same_values() {
    // past the kernel's parallel threshold (2 Mi elements)
    let x = random::<Flex, 2>([2049, 1024], 3.0);
    let e = worst_rel(gelu_tanh(x.clone()), reference::gelu_tanh(x));
    assert!(e < 1e-6, "{e:.3e}");
}

#[test]
fn rope_matches_the_composition_on_a_strided_input() {
    let (b, s, h, d) = (3, 19, 4, 16);
    let (cos, sin) = tables::<Flex>(s, d);
    let x = random::<Flex, 4>([b, s, h, d], 1.0);
    // the kernel runs: its output is a heads-major buffer seen token-major
    let out = rope(x.clone(), cos.clone(), sin.clone())
        .into_primitive()
        .tensor();
    assert!(!out.is_contiguous() && out.transpose(1, 2).is_contiguous());
    let e = worst_rel(
        rope(x.clone(), cos.clone(), sin.clone()),
        reference::rope(x, cos.clone(), sin.clone()),
    );
    assert!(e < 1e-6, "contiguous: {e:.3e}");
    // a heads-major tensor seen token-major: the kernel reads the strides
    let xt = random::<Flex, 4>([b, h, s, d], 1.0).swap_dims(1, 2);
    let e = worst_rel(
        rope(xt.clone(), cos.clone(), sin.clone()),
        reference::rope(xt, cos, sin),
    );
    assert!(e < 1e-6, "strided: {e:.3e}");
}

#[test]
fn rope_gradients_match_for_the_input_and_tracked_tables() {
    let (b, s, h, d) = (2, 11, 3, 8);
    let (cos0, sin0) = tables::<Ad>(s, d);
    let x0 = random::<Ad, 4>([b, s, h, d], 1.0);
    let w = random::<Ad, 4>([b, s, h, d], 1.0);
    let run = |fused: bool, track_tables: bool| {
        let x = x0.clone().require_grad();
        let (cos, sin) = if track_tables {
            (cos0.clone().require_grad(), sin0.clone().require_grad())
        } else {
            (cos0.clone(), sin0.clone())
        };
        let y = if fused {
            rope(x.clone(), cos.clone(), sin.clone())
        } else {
            reference::rope(x.clone(), cos.clone(), sin.clone())
        };
        // through a heads transpose and a matmul, as attention consumes it
        let z = y
            .clone()
            .swap_dims(1, 2)
            .matmul(w.clone().swap_dims(1, 2).swap_dims(2, 3));
        let g = z.sum().backward();
        (
            y.inner(),
            x.grad(&g).expect("x has a gradient"),
            cos.grad(&g),
            sin.grad(&g),
        )
    };
    for track in [false, true] {
        let (yf, gf, cf, sf) = run(true, track);
        let (yr, gr, cr, sr) = run(false, track);
        assert!(worst_rel(yf, yr) < 1e-6);
        let e = worst_rel(gf, gr);
        assert!(e < 2e-6, "input gradient: {e:.3e}");
        assert_eq!(cf.is_some(), track);
        if let (Some(cf), Some(cr), Some(sf), Some(sr)) = (cf, cr, sf, sr) {
            let (ec, es) = (worst_rel(cf, cr), worst_rel(sf, sr));
            assert!(ec < 1e-5 && es < 1e-5, "table gradients {ec:.3e}, {es:.3e}");
        }
    }
}

#[test]
fn other_backends_take_the_composition_bit_for_bit() {
    let x = random::<NdArray, 3>([2, 5, 8], 1.5);
    assert_eq!(
        gelu_tanh(x.clone()).into_data(),
        reference::gelu_tanh(x).into_data()
    );
    let (cos, sin) = tables::<NdArray>(5, 8);
    let x = random::<NdArray, 4>([2, 5, 3, 8], 1.0);
    assert_eq!(
        rope(x.clone(), cos.clone(), sin.clone()).into_data(),
        reference::rope(x, cos, sin).into_data()
    );
}

/// A relayout changes the memory order and nothing else, and passes the gradient through.
#[test]
fn a_relayout_keeps_values_and_gradients() {
    let (b, s, h, d) = (2, 7, 3, 6);
    let x0 = random::<Ad, 4>([b, s, h, d], 1.0);
    let w = random::<Ad, 4>([b, s, h, d], 1.0);
    for order in [Order::HeadsMajor, Order::TokenMajor] {
        for from_heads_major in [false, true] {
            let x = if from_heads_major {
                relayout(x0.clone(), Order::HeadsMajor)
            } else {
                x0.clone()
            }
            .require_grad();
            let y = relayout(x.clone(), order);
            let p = y.clone().inner().into_primitive().tensor();
            let heads_major = p.transpose(1, 2).is_contiguous();
            assert_eq!(heads_major, order == Order::HeadsMajor, "{order:?}");
            assert_eq!(y.clone().into_data(), x.clone().into_data());
            let g = (y * w.clone()).sum().backward();
            assert_eq!(
                x.grad(&g).unwrap().into_data(),
                w.clone().inner().into_data()
            );
        }
    }
    // heads-major to token-major, the attention output's way back
    let hm = random::<Flex, 4>([b, h, s, d], 1.0).swap_dims(1, 2);
    let tm = relayout(hm.clone(), Order::TokenMajor);
    assert!(tm.clone().into_primitive().tensor().is_contiguous());
    assert_eq!(tm.into_data(), hm.into_data());
}

/// A key mask `[batch, heads, seq, seq]` that masks the last `pad[b]` keys of row `b`.
fn key_mask<B: Backend>(b: usize, h: usize, s: usize, pad: &[usize]) -> Tensor<B, 4, Bool> {
    let v: Vec<bool> = (0..b * h * s * s)
        .map(|i| (i % s) >= s - pad[i / (h * s * s)])
        .collect();
    Tensor::from_data(TensorData::new(v, [b, h, s, s]), &Default::default())
}

/// The fused attention against burn's own under autodiff (its reference decomposition):
/// values and the gradients of q, k and v, with and without a key mask, on heads-major views.
#[test]
fn attention_and_its_gradients_match_burns() {
    let (b, h, s, d) = (2, 3, 13, 8);
    let w = random::<Ad, 4>([b, h, s, d], 1.0);
    let [q0, k0, v0] = [0, 1, 2].map(|_| random::<Ad, 4>([b, s, h, d], 1.0).swap_dims(1, 2));
    for masked in [false, true] {
        let mask = masked.then(|| key_mask::<Ad>(b, h, s, &[3, 0]));
        let run = |fused: bool| {
            let [q, k, v] = [&q0, &k0, &v0].map(|t| t.clone().require_grad());
            let y = if fused {
                attention(q.clone(), k.clone(), v.clone(), mask.clone())
            } else {
                burn::tensor::module::attention(
                    q.clone(),
                    k.clone(),
                    v.clone(),
                    mask.clone(),
                    None,
                    AttentionModuleOptions::default(),
                )
            };
            let g = (y.clone() * w.clone()).sum().backward();
            let grads = [&q, &k, &v].map(|t| t.grad(&g).expect("a gradient"));
            (y.inner(), grads)
        };
        let ((yf, gf), (yr, gr)) = (run(true), run(false));
        let e = worst_rel(yf, yr);
        assert!(e < 1e-6, "masked {masked}: values {e:.3e}");
        for (name, (a, b)) in ["q", "k", "v"].iter().zip(gf.into_iter().zip(gr)) {
            let e = worst_rel(a, b);
            assert!(e < 1e-5, "masked {masked}: gradient of {name} {e:.3e}");
        }
    }
    // untracked and on the plain backend: the forward alone
    let x = random::<Flex, 4>([b, h, s, d], 1.0);
    let m = key_mask::<Flex>(b, h, s, &[1, 2]);
    let e = worst_rel(
        attention(x.clone(), x.clone(), x.clone(), Some(m.clone())),
        reference_attention(x, m),
    );
    assert!(e < 1e-6, "Flex forward {e:.3e}");
}

fn reference_attention(x: Tensor<Flex, 4>, m: Tensor<Flex, 4, Bool>) -> Tensor<Flex, 4> {
    let d = x.dims()[3] as f64;
    let s = x
        .clone()
        .matmul(x.clone().swap_dims(2, 3))
        .div_scalar(d.sqrt());
    let p = burn::tensor::activation::softmax(s.mask_fill(m, f32::NEG_INFINITY), 3);
    p.matmul(x)
}

#[test]
#[should_panic(expected = "RoPE table cos must be [seq, head_dim]")]
fn a_table_of_the_wrong_shape_is_refused() {
    let (cos, sin) = tables::<Flex>(4, 8);
    rope(random::<Flex, 4>([1, 5, 2, 8], 1.0), cos, sin);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Any shape, contiguous or heads-major, forward and input gradient.
    #[test]
    fn rope_agrees_on_any_shape(
        b in 1usize..4, s in 1usize..24, h in 1usize..5, half in 1usize..12, strided: bool,
    ) {
        let d = 2 * half;
        let (cos, sin) = tables::<Ad>(s, d);
        let x0 = if strided {
            random::<Ad, 4>([b, h, s, d], 1.0).swap_dims(1, 2)
        } else {
            random::<Ad, 4>([b, s, h, d], 1.0)
        };
        let w = random::<Ad, 4>([b, s, h, d], 1.0);
        let grad = |fused: bool| {
            let x = x0.clone().require_grad();
            let y = if fused { rope(x.clone(), cos.clone(), sin.clone()) }
                    else { reference::rope(x.clone(), cos.clone(), sin.clone()) };
            let g = (y.clone() * w.clone()).sum().backward();
            (y.inner(), x.grad(&g).unwrap())
        };
        let ((yf, gf), (yr, gr)) = (grad(true), grad(false));
        prop_assert!(worst_rel(yf, yr) < 1e-6);
        prop_assert!(worst_rel(gf, gr) < 2e-6);
    }

    /// Any shape and scale of GELU, forward and gradient.
    #[test]
    fn gelu_agrees_on_any_shape(n in 1usize..3000, scale in 0.01f64..20.0) {
        let x0 = random::<Ad, 1>([n], scale);
        let grad = |fused: bool| {
            let x = x0.clone().require_grad();
            let y = if fused { gelu_tanh(x.clone()) } else { reference::gelu_tanh(x.clone()) };
            let g = y.clone().sum().backward();
            (y.inner(), x.grad(&g).unwrap())
        };
        let ((yf, gf), (yr, gr)) = (grad(true), grad(false));
        prop_assert!(worst_rel(yf, yr) < 1e-6);
        prop_assert!(worst_rel(gf, gr) < 2e-6);
    }
}
