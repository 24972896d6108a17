//! The Flex kernels against the generic compositions they replace: values and gradients, on
//! contiguous and strided inputs, and the generic route taken elsewhere.

use burn::backend::{Autodiff, Flex, NdArray};
use burn::tensor::Bool;
use burn::tensor::backend::Backend;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Tensor, TensorData};
use fused_ops::{
    LoraTerm, Order, attention, gated_residual, gelu_tanh, layer_norm_modulated, linear, reference,
    relayout, rms_norm, rope,
};
use proptest::prelude::*;

mod common;
use common::{random, worst_rel, worst_scaled};

type Ad = Autodiff<Flex>;

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

/// A `[batch, seq]` key mask (`true` = attend) that masks the last `pad[b]` keys of row `b`.
fn key_mask<B: Backend>(s: usize, pad: &[usize]) -> Tensor<B, 2, Bool> {
    let b = pad.len();
    let v: Vec<bool> = (0..b * s).map(|i| (i % s) < s - pad[i / s]).collect();
    Tensor::from_data(TensorData::new(v, [b, s]), &Default::default())
}

/// burn's own attention (its reference decomposition under autodiff) with the key mask
/// broadcast to `[batch, heads, seq_q, seq_kv]` in burn's convention.
fn burns_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    keep: Option<Tensor<B, 2, Bool>>,
) -> Tensor<B, 4> {
    let [b, h, sq, _] = q.dims();
    let skv = k.dims()[2];
    let mask = keep.map(|m| m.bool_not().reshape([b, 1, 1, skv]).expand([b, h, sq, skv]));
    burn::tensor::module::attention(q, k, v, mask, None, AttentionModuleOptions::default())
}

/// The fused attention against burn's own under autodiff: values and the gradients of q, k
/// and v, with and without a key mask, on heads-major views (as the transformer calls it),
/// for self-attention in one block of query rows, self-attention over several blocks (300
/// keys: blocks of 109 rows), and cross-attention with a value width of its own.
#[test]
fn attention_and_its_gradients_match_burns() {
    for (b, h, sq, skv, d, dv, pad) in [
        (2, 3, 13, 13, 8, 8, vec![3, 0]),
        (1, 2, 300, 300, 16, 16, vec![41]),
        (2, 2, 7, 19, 8, 12, vec![0, 18]),
    ] {
        let w = random::<Ad, 4>([b, h, sq, dv], 1.0);
        let heads_major = |s, d| random::<Ad, 4>([b, s, h, d], 1.0).swap_dims(1, 2);
        let (q0, k0, v0) = (
            heads_major(sq, d),
            heads_major(skv, d),
            heads_major(skv, dv),
        );
        for masked in [false, true] {
            let mask = masked.then(|| key_mask::<Ad>(skv, &pad));
            let run = |fused: bool| {
                let [q, k, v] = [&q0, &k0, &v0].map(|t| t.clone().require_grad());
                let y = if fused {
                    attention(q.clone(), k.clone(), v.clone(), mask.clone())
                } else {
                    burns_attention(q.clone(), k.clone(), v.clone(), mask.clone())
                };
                let g = (y.clone() * w.clone()).sum().backward();
                let grads = [&q, &k, &v].map(|t| t.grad(&g).expect("a gradient"));
                (y.inner(), grads)
            };
            let ((yf, gf), (yr, gr)) = (run(true), run(false));
            let at = format!("[{b}, {h}, {sq}, {skv}, {d}, {dv}] masked {masked}");
            let e = worst_rel(yf, yr);
            assert!(e < 1e-6, "{at}: values {e:.3e}");
            for (name, (a, b)) in ["q", "k", "v"].iter().zip(gf.into_iter().zip(gr)) {
                let e = worst_rel(a, b);
                assert!(e < 1e-5, "{at}: gradient of {name} {e:.3e}");
            }
        }
    }
    // untracked and on the plain backend: the forward alone, against the composition
    let (b, h, s, d) = (2, 3, 13, 8);
    let x = random::<Flex, 4>([b, h, s, d], 1.0);
    let m = key_mask::<Flex>(s, &[1, 2]);
    let e = worst_rel(
        attention(x.clone(), x.clone(), x.clone(), Some(m.clone())),
        reference_attention(x, m),
    );
    assert!(e < 1e-6, "Flex forward {e:.3e}");
}

/// Another backend takes burn's attention with the mask broadcast: the same numbers.
#[test]
fn attention_elsewhere_is_burns_with_the_mask_broadcast() {
    let (b, h, s, d) = (2, 2, 11, 8);
    let x = random::<Flex, 4>([b, h, s, d], 1.0);
    let m = key_mask::<Flex>(s, &[4, 0]);
    let nd =
        |t: Tensor<Flex, 4>| Tensor::<NdArray, 4>::from_data(t.into_data(), &Default::default());
    let mn = key_mask::<NdArray>(s, &[4, 0]);
    let y = attention(nd(x.clone()), nd(x.clone()), nd(x.clone()), Some(mn));
    let want = attention(x.clone(), x.clone(), x, Some(m));
    let e = worst_rel(
        Tensor::<Flex, 4>::from_data(y.into_data(), &Default::default()),
        want,
    );
    assert!(e < 1e-6, "NdArray against Flex {e:.3e}");
}

#[test]
#[should_panic(expected = "attention: the key mask must be [batch, seq_kv] = [2, 5]")]
fn a_key_mask_of_the_wrong_shape_is_refused() {
    let x = random::<Flex, 4>([2, 1, 5, 4], 1.0);
    attention(x.clone(), x.clone(), x, Some(key_mask::<Flex>(4, &[0, 1])));
}

fn reference_attention(x: Tensor<Flex, 4>, keep: Tensor<Flex, 2, Bool>) -> Tensor<Flex, 4> {
    let [b, h, s, d] = x.dims();
    let m = keep.bool_not().reshape([b, 1, 1, s]).expand([b, h, s, s]);
    let scores = x
        .clone()
        .matmul(x.clone().swap_dims(2, 3))
        .div_scalar((d as f64).sqrt());
    let p = burn::tensor::activation::softmax(scores.mask_fill(m, f32::NEG_INFINITY), 3);
    p.matmul(x)
}

/// The adaptive layer norm against its composition: values, and the gradients of x, shift
/// and scale, on strided modulation rows (chunks of one `[batch, 1, 3 dim]` tensor, as the
/// transformer slices them), with and without the rows tracked; one shape large enough to
/// split over threads.
#[test]
fn the_modulated_layer_norm_and_its_gradients_match_the_composition() {
    for (b, t, d, rows_tracked) in [(3, 7, 24, true), (2, 5, 19, false), (4, 300, 256, true)] {
        let x0 = random::<Ad, 3>([b, t, d], 2.0).add_scalar(0.5);
        let m0 = random::<Ad, 3>([b, 1, 3 * d], 0.5);
        let w = random::<Ad, 3>([b, t, d], 1.0);
        let run = |fused: bool| {
            let x = x0.clone().require_grad();
            let m = if rows_tracked {
                m0.clone().require_grad()
            } else {
                m0.clone()
            };
            let [shift, scale, _]: [Tensor<Ad, 3>; 3] = m.clone().chunk(3, 2).try_into().unwrap();
            let y = if fused {
                layer_norm_modulated(x.clone(), shift, scale, 1e-6)
            } else {
                reference::layer_norm_modulated(x.clone(), shift, scale, 1e-6)
            };
            let g = (y.clone() * w.clone()).sum().backward();
            let gm = rows_tracked.then(|| m.grad(&g).expect("the rows' gradient"));
            (y.inner(), x.grad(&g).expect("x's gradient"), gm)
        };
        let ((yf, gxf, gmf), (yr, gxr, gmr)) = (run(true), run(false));
        let at = format!("[{b}, {t}, {d}]");
        let e = worst_rel(yf, yr);
        assert!(e < 2e-6, "{at}: values {e:.3e}");
        let e = worst_rel(gxf, gxr);
        assert!(e < 2e-5, "{at}: gradient of x {e:.3e}");
        if let (Some(a), Some(r)) = (gmf, gmr) {
            let e = worst_rel(a, r);
            assert!(e < 2e-5, "{at}: gradient of shift and scale {e:.3e}");
        }
    }
}

/// The gated residual against `x + r * gate`: the same bits forward, the gradients of x, r and
/// the gate (strided, from a chunk) within float rounding.
#[test]
fn the_gated_residual_and_its_gradients_match_the_composition() {
    for (b, t, d) in [(3, 7, 24), (4, 300, 256)] {
        let (x0, r0) = (
            random::<Ad, 3>([b, t, d], 1.0),
            random::<Ad, 3>([b, t, d], 1.0),
        );
        let m0 = random::<Ad, 3>([b, 1, 2 * d], 1.0);
        let w = random::<Ad, 3>([b, t, d], 1.0);
        let run = |fused: bool| {
            let (x, r, m) = (
                x0.clone().require_grad(),
                r0.clone().require_grad(),
                m0.clone().require_grad(),
            );
            let gate = m.clone().narrow(2, d, d);
            let y = if fused {
                gated_residual(x.clone(), r.clone(), gate)
            } else {
                reference::gated_residual(x.clone(), r.clone(), gate)
            };
            let g = (y.clone() * w.clone()).sum().backward();
            let grads = [x.grad(&g), r.grad(&g), m.grad(&g)].map(|t| t.expect("a gradient"));
            (y.inner(), grads)
        };
        let ((yf, gf), (yr, gr)) = (run(true), run(false));
        assert_eq!(yf.into_data(), yr.into_data(), "[{b}, {t}, {d}]: values");
        for (name, (a, r)) in ["x", "r", "gate"].iter().zip(gf.into_iter().zip(gr)) {
            let e = worst_rel(a, r);
            assert!(e < 1e-5, "[{b}, {t}, {d}]: gradient of {name} {e:.3e}");
        }
    }
}

/// The RMS norm against its composition: values and the gradients of x and the weight, on a
/// strided input (a heads view of a projection, as the transformer calls it), with the weight
/// tracked and frozen; one shape large enough to split over threads.
#[test]
fn the_rms_norm_and_its_gradients_match_the_composition() {
    for (b, s, h, d, weight_tracked) in [
        (2, 7, 3, 16, true),
        (3, 5, 2, 12, false),
        (4, 300, 4, 64, true),
    ] {
        let x0 = random::<Ad, 4>([b, h, s, d], 1.5).swap_dims(1, 2);
        let w0 = random::<Ad, 1>([d], 1.0).add_scalar(1.0);
        let out = random::<Ad, 4>([b, s, h, d], 1.0);
        let run = |fused: bool| {
            let x = x0.clone().require_grad();
            let w = if weight_tracked {
                w0.clone().require_grad()
            } else {
                w0.clone()
            };
            let y = if fused {
                rms_norm(x.clone(), w.clone(), 1e-6)
            } else {
                reference::rms_norm(x.clone(), w.clone(), 1e-6)
            };
            let g = (y.clone() * out.clone()).sum().backward();
            let gw = weight_tracked.then(|| w.grad(&g).expect("the weight's gradient"));
            (y.inner(), x.grad(&g).expect("x's gradient"), gw)
        };
        let ((yf, gxf, gwf), (yr, gxr, gwr)) = (run(true), run(false));
        let at = format!("[{b}, {s}, {h}, {d}]");
        let e = worst_rel(yf, yr);
        assert!(e < 2e-6, "{at}: values {e:.3e}");
        let e = worst_rel(gxf, gxr);
        assert!(e < 2e-5, "{at}: gradient of x {e:.3e}");
        if let (Some(a), Some(r)) = (gwf, gwr) {
            // a sum over b * s * h rows: held to the f64 sum, where the composition's own
            // f32 sum may be further off than the kernel's
            let exact = rms_weight_grad_f64(x0.clone().inner(), out.clone().inner());
            let (ea, er) = (worst_rel(a, exact.clone()), worst_rel(r, exact));
            assert!(
                ea < 1e-5,
                "{at}: gradient of the weight {ea:.3e} (composition {er:.3e})"
            );
        }
    }
}

/// `dw[c] = sum over rows of g[c] x[c] / sqrt(mean(x^2) + 1e-6)`, in f64.
fn rms_weight_grad_f64(x: Tensor<Flex, 4>, g: Tensor<Flex, 4>) -> Tensor<Flex, 1> {
    let d = x.dims()[3];
    let x = x.into_data().into_vec::<f32>().unwrap();
    let g = g.into_data().into_vec::<f32>().unwrap();
    let mut dw = vec![0f64; d];
    for (x, g) in x.chunks(d).zip(g.chunks(d)) {
        let ms = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / d as f64;
        let rs = 1.0 / (ms + 1e-6).sqrt();
        for c in 0..d {
            dw[c] += g[c] as f64 * x[c] as f64 * rs;
        }
    }
    let dw: Vec<f32> = dw.into_iter().map(|v| v as f32).collect();
    Tensor::from_data(TensorData::new(dw, [d]), &Default::default())
}

/// The linear layer against burn's `linear` plus the adapter's composition: values and the
/// gradients of every tracked input, with and without bias and adapter, a frozen and a trained
/// base weight, a negative scale (a merged adapter switched off), a strided input, and one
/// shape whose products split over threads.
#[test]
fn the_linear_layer_and_its_gradients_match_the_composition() {
    // (batch, tokens, d_in, d_out, rank, bias, base trained, scale)
    let cases = [
        (2, 5, 12, 7, 3, true, false, 2.0),
        (3, 4, 9, 10, 0, true, true, 1.0),
        (1, 6, 8, 8, 2, false, true, -0.5),
        (4, 150, 128, 128, 8, true, false, 2.0),
    ];
    for (b, t, din, dout, rank, has_bias, base_trained, scale) in cases {
        // strided: a transposed view of [batch, d_in, tokens]
        let x0 = random::<Ad, 3>([b, din, t], 1.0).swap_dims(1, 2);
        let w0 = random::<Ad, 2>([din, dout], 0.3);
        let b0 = random::<Ad, 1>([dout], 0.5);
        let (a0, bb0) = (
            random::<Ad, 2>([din, rank], 0.3),
            random::<Ad, 2>([rank, dout], 0.3),
        );
        let out = random::<Ad, 3>([b, t, dout], 1.0);
        let run = |fused: bool| {
            let x = x0.clone().require_grad();
            let w = if base_trained {
                w0.clone().require_grad()
            } else {
                w0.clone()
            };
            let bias = has_bias.then(|| {
                if base_trained {
                    b0.clone().require_grad()
                } else {
                    b0.clone()
                }
            });
            let (a, bb) = (a0.clone().require_grad(), bb0.clone().require_grad());
            let lora = (rank > 0).then(|| LoraTerm {
                a: a.clone(),
                b: bb.clone(),
                scale,
            });
            let y = if fused {
                linear(x.clone(), w.clone(), bias.clone(), lora)
            } else {
                reference::linear(x.clone(), w.clone(), bias.clone(), lora)
            };
            let g = (y.clone() * out.clone()).sum().backward();
            let mut grads = vec![("x", x.grad(&g).expect("x's gradient").reshape([-1]))];
            if base_trained {
                grads.push(("weight", w.grad(&g).expect("a gradient").reshape([-1])));
                if let Some(bias) = &bias {
                    grads.push(("bias", bias.grad(&g).expect("a gradient")));
                }
            } else {
                assert!(w.grad(&g).is_none(), "a frozen weight got a gradient");
            }
            if rank > 0 {
                grads.push(("A", a.grad(&g).expect("a gradient").reshape([-1])));
                grads.push(("B", bb.grad(&g).expect("a gradient").reshape([-1])));
            }
            (y.inner(), grads)
        };
        let ((yf, gf), (yr, gr)) = (run(true), run(false));
        let at = format!(
            "[{b}, {t}, {din}] -> {dout}, rank {rank}, bias {has_bias}, base trained {base_trained}"
        );
        let e = worst_rel(yf, yr);
        assert!(e < 2e-6, "{at}: values {e:.3e}");
        // The gradients are sums over every row, with cancellation: both sides are held to
        // the f64 sums, the error measured against the gradient's largest element (an f32 sum
        // of 600 terms is off by about 1e-4 of its terms' size, whatever its own size).
        let data = |t: &Tensor<Ad, 3>| t.clone().inner().into_data().into_vec::<f32>().unwrap();
        let data2 = |t: &Tensor<Ad, 2>| t.clone().inner().into_data().into_vec::<f32>().unwrap();
        let exact = linear_grads_f64(
            [data(&x0), data(&out)],
            [data2(&w0), data2(&a0), data2(&bb0)],
            [din, dout, rank],
            scale,
        );
        assert_eq!(gf.len(), gr.len());
        for ((name, a), (_, r)) in gf.into_iter().zip(gr) {
            let want = Tensor::<Flex, 1>::from_data(
                TensorData::new(exact[name].clone(), [exact[name].len()]),
                &Default::default(),
            );
            let (ea, er) = (worst_scaled(a, want.clone()), worst_scaled(r, want));
            assert!(
                ea < 1e-5,
                "{at}: gradient of {name} {ea:.3e} (composition {er:.3e})"
            );
        }
    }
}

/// The gradients of `sum(g * (x W + b + s (x A) B))`, in f64, rounded once, by name; `x` and
/// `g` in their logical (token-major) order.
fn linear_grads_f64(
    [x, g]: [Vec<f32>; 2],
    [w, a, b]: [Vec<f32>; 3],
    [din, dout, rank]: [usize; 3],
    s: f64,
) -> std::collections::HashMap<&'static str, Vec<f32>> {
    let rows = x.len() / din;
    let mut dx = vec![0f64; rows * din];
    let (mut dw, mut db) = (vec![0f64; din * dout], vec![0f64; dout]);
    let (mut da, mut dbb) = (vec![0f64; din * rank], vec![0f64; rank * dout]);
    for r in 0..rows {
        let (xr, gr) = (&x[r * din..(r + 1) * din], &g[r * dout..(r + 1) * dout]);
        // x A and g Bᵀ of this row
        let xa: Vec<f64> = (0..rank)
            .map(|j| {
                (0..din)
                    .map(|i| xr[i] as f64 * a[i * rank + j] as f64)
                    .sum()
            })
            .collect();
        let gb: Vec<f64> = (0..rank)
            .map(|j| {
                (0..dout)
                    .map(|o| gr[o] as f64 * b[j * dout + o] as f64)
                    .sum()
            })
            .collect();
        for i in 0..din {
            let mut v = 0.0;
            for o in 0..dout {
                v += gr[o] as f64 * w[i * dout + o] as f64;
                dw[i * dout + o] += xr[i] as f64 * gr[o] as f64;
            }
            for j in 0..rank {
                v += s * gb[j] * a[i * rank + j] as f64;
                da[i * rank + j] += s * xr[i] as f64 * gb[j];
            }
            dx[r * din + i] = v;
        }
        for o in 0..dout {
            db[o] += gr[o] as f64;
            for j in 0..rank {
                dbb[j * dout + o] += s * xa[j] * gr[o] as f64;
            }
        }
    }
    let round = |v: Vec<f64>| v.into_iter().map(|v| v as f32).collect::<Vec<f32>>();
    [
        ("x", dx),
        ("weight", dw),
        ("bias", db),
        ("A", da),
        ("B", dbb),
    ]
    .into_iter()
    .map(|(n, v)| (n, round(v)))
    .collect()
}

/// A batch through the linear layer in two calls gives the bits of one call (the rollout
/// samples its rows in chunks and promises the bits of one batch), with and without the
/// products split over threads.
#[test]
fn the_linear_layer_gives_a_row_the_same_bits_in_any_batch() {
    for (t, din, dout) in [(76, 128, 128), (300, 256, 512)] {
        let x = random::<Flex, 3>([5, t, din], 1.0);
        let w = random::<Flex, 2>([din, dout], 0.1);
        let bias = Some(random::<Flex, 1>([dout], 0.1));
        let lora = Some(LoraTerm {
            a: random::<Flex, 2>([din, 8], 0.1),
            b: random::<Flex, 2>([8, dout], 0.1),
            scale: 2.0,
        });
        let run = |x| linear(x, w.clone(), bias.clone(), lora.clone());
        let whole = run(x.clone());
        // 2 + 3 matrices, and 1 + 4: a lone large matrix splits its own product over threads
        for first in [2, 1] {
            let parts = Tensor::cat(
                vec![
                    run(x.clone().narrow(0, 0, first)),
                    run(x.clone().narrow(0, first, 5 - first)),
                ],
                0,
            );
            assert_eq!(
                whole.clone().into_data(),
                parts.into_data(),
                "[5, {t}, {din}] -> {dout}, split after {first}"
            );
        }
    }
}

/// A modulation that is not one row per batch row takes the composition.
#[test]
fn a_per_token_modulation_takes_the_composition() {
    let x = random::<Flex, 3>([2, 5, 8], 1.0);
    let m = random::<Flex, 3>([2, 5, 8], 1.0);
    assert_eq!(
        layer_norm_modulated(x.clone(), m.clone(), m.clone(), 1e-6).into_data(),
        reference::layer_norm_modulated(x.clone(), m.clone(), m.clone(), 1e-6).into_data()
    );
    assert_eq!(
        gated_residual(x.clone(), x.clone(), m.clone()).into_data(),
        reference::gated_residual(x.clone(), x, m).into_data()
    );
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

/// The same for a `[rows, d_in]` input, down to a chunk of one row (gemm's single-row path
/// must not change a row's bits), with and without an adapter.
#[test]
fn the_linear_layer_gives_a_lone_row_the_bits_of_a_batch() {
    for (din, dout, rank) in [(256, 768, 0), (64, 128, 4)] {
        let x = random::<Flex, 2>([5, din], 1.0);
        let w = random::<Flex, 2>([din, dout], 0.1);
        let bias = Some(random::<Flex, 1>([dout], 0.1));
        let lora = (rank > 0).then(|| LoraTerm {
            a: random::<Flex, 2>([din, rank], 0.1),
            b: random::<Flex, 2>([rank, dout], 0.1),
            scale: 2.0,
        });
        let run = |x| linear(x, w.clone(), bias.clone(), lora.clone());
        let whole = run(x.clone());
        for first in 1..5 {
            let parts = Tensor::cat(
                vec![
                    run(x.clone().narrow(0, 0, first)),
                    run(x.clone().narrow(0, first, 5 - first)),
                ],
                0,
            );
            assert_eq!(
                whole.clone().into_data(),
                parts.into_data(),
                "[5, {din}] -> {dout}, rank {rank}, split after {first}"
            );
        }
    }
}
