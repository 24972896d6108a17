//! The sampler's step kernels on Flex against their generic compositions: values, gradients,
//! the storage rounding bit for bit, and the generic route taken elsewhere.

use burn::backend::{Autodiff, Flex, NdArray};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};
use fused_ops::{
    GaussianStep, NextSample, combine, gaussian_step, mean_square_residual, reference,
    round_through,
};

mod common;
use common::{random, worst_rel};

type Ad = Autodiff<Flex>;

/// Equal as values (`-0 == 0`); fails on a NaN in either, or a shape mismatch.
fn assert_same_values<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>, what: &str) {
    assert_eq!(worst_rel(a, b), 0.0, "{what}");
}

fn bits<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<u32> {
    let v = t.into_data().into_vec::<f32>().unwrap();
    v.iter().map(|x| x.to_bits()).collect()
}

/// Coefficient sets: per sample, shared, and 1 on every sample.
fn coefficient_sets(batch: usize) -> Vec<(Vec<f64>, Vec<f64>)> {
    let per: Vec<f64> = (0..batch).map(|b| 0.9 - 0.07 * b as f64).collect();
    let dt: Vec<f64> = (0..batch).map(|b| -0.083 - 0.011 * b as f64).collect();
    vec![
        (per.clone(), dt.clone()),
        (vec![0.973; batch], vec![-0.0833; batch]),
        (vec![1.0; batch], dt),
    ]
}

#[test]
fn combine_gives_the_compositions_bits_small_large_and_strided() {
    // 8 x 576 x 64 is above the parallel split; 3 x 5 x 7 below it
    for shape in [[3, 5, 7], [8, 576, 64]] {
        let x = random::<Flex, 3>(shape, 1.0);
        let v = random::<Flex, 3>(shape, 1.0);
        for (a, c) in coefficient_sets(shape[0]) {
            let got = combine(x.clone(), &a, v.clone(), &c);
            let want = reference::combine(x.clone(), &a, v.clone(), &c);
            assert_eq!(bits(got), bits(want), "shape {shape:?}, a {a:?}");
        }
    }
    // a strided x (a transposed view) is read as the composition reads it
    let xt = random::<Flex, 3>([4, 7, 6], 1.0).swap_dims(1, 2);
    let v = random::<Flex, 3>([4, 6, 7], 1.0);
    let (a, c) = coefficient_sets(4).remove(0);
    let got = combine(xt.clone(), &a, v.clone(), &c);
    let want = reference::combine(xt, &a, v, &c);
    assert_eq!(bits(got), bits(want));
}

#[test]
fn combine_gradients_are_the_compositions() {
    for (a, c) in coefficient_sets(3) {
        let x0 = random::<Ad, 3>([3, 10, 6], 1.0);
        let v0 = random::<Ad, 3>([3, 10, 6], 1.0);
        let w = random::<Ad, 3>([3, 10, 6], 1.0);
        let run = |fused: bool| {
            let (x, v) = (x0.clone().require_grad(), v0.clone().require_grad());
            let y = if fused {
                combine(x.clone(), &a, v.clone(), &c)
            } else {
                reference::combine(x.clone(), &a, v.clone(), &c)
            };
            let g = (y * w.clone()).sum().backward();
            (x.grad(&g).unwrap(), v.grad(&g).unwrap())
        };
        let ((gx, gv), (rx, rv)) = (run(true), run(false));
        assert_same_values(gx, rx, "d/dx");
        assert_same_values(gv, rv, "d/dv");
    }
    // only the tracked input gets a gradient
    let x = random::<Ad, 2>([2, 5], 1.0);
    let v = random::<Ad, 2>([2, 5], 1.0).require_grad();
    let g = combine(x.clone(), &[0.5, 2.0], v.clone(), &[1.5, -1.0])
        .sum()
        .backward();
    assert!(x.grad(&g).is_none());
    assert_eq!(
        v.grad(&g).unwrap().into_data().into_vec::<f32>().unwrap(),
        [1.5f32, 1.5, 1.5, 1.5, 1.5, -1.0, -1.0, -1.0, -1.0, -1.0]
    );
}

/// `mean((p - m)^2)` per row, in f64 from the f32 differences.
fn mean_square_f64(p: &Tensor<Flex, 3>, m: &Tensor<Flex, 3>) -> Vec<f64> {
    let [b, ..] = p.dims();
    let p = p.clone().into_data().into_vec::<f32>().unwrap();
    let m = m.clone().into_data().into_vec::<f32>().unwrap();
    let n = p.len() / b;
    (0..b)
        .map(|r| {
            let s: f64 = (r * n..(r + 1) * n)
                .map(|i| f64::from(p[i] - m[i]).powi(2))
                .sum();
            s / n as f64
        })
        .collect()
}

#[test]
fn the_mean_square_residual_is_the_f64_mean_rounded_once() {
    for shape in [[3, 5, 7], [8, 576, 64], [1, 300_000, 1]] {
        let p = random::<Flex, 3>(shape, 1.0);
        let m = random::<Flex, 3>(shape, 0.5);
        let got = mean_square_residual(p.clone(), m.clone())
            .into_data()
            .into_vec::<f32>()
            .unwrap();
        let exact = mean_square_f64(&p, &m);
        for (g, e) in got.iter().zip(&exact) {
            assert!(
                (f64::from(*g) - e).abs() <= 1e-6 * e,
                "shape {shape:?}: {g} against {e}"
            );
        }
        // burn's f32 mean agrees to its own rounding, which grows with the row's length
        // (7.5e-5 relative at 300 000 elements of these inputs)
        let comp = reference::mean_square_residual(p, m);
        let got = Tensor::<Flex, 1>::from_floats(got.as_slice(), &Default::default());
        let rel = worst_rel(got, comp);
        assert!(rel < 5e-4, "shape {shape:?}: burn's f32 mean {rel:e} away");
    }
}

#[test]
fn a_sample_gets_the_same_mean_square_residual_alone_or_in_a_batch() {
    let p = random::<Flex, 3>([8, 576, 64], 1.0);
    let m = random::<Flex, 3>([8, 576, 64], 1.0);
    let batch = bits(mean_square_residual(p.clone(), m.clone()));
    for b in [0, 5] {
        let alone = mean_square_residual(p.clone().narrow(0, b, 1), m.clone().narrow(0, b, 1));
        assert_eq!(bits(alone), vec![batch[b]], "sample {b}");
    }
}

#[test]
fn mean_square_residual_gradients_match_the_composition() {
    let p0 = random::<Ad, 3>([4, 9, 5], 1.0);
    let m0 = random::<Ad, 3>([4, 9, 5], 1.0);
    let w = Tensor::<Ad, 1>::from_floats([0.5, -2.0, 1.0, 3.0], &Default::default());
    let run = |fused: bool| {
        let (p, m) = (p0.clone().require_grad(), m0.clone().require_grad());
        let y = if fused {
            mean_square_residual(p.clone(), m.clone())
        } else {
            reference::mean_square_residual(p.clone(), m.clone())
        };
        let g = (y * w.clone()).sum().backward();
        (p.grad(&g).unwrap(), m.grad(&g).unwrap())
    };
    let ((gp, gm), (rp, rm)) = (run(true), run(false));
    assert!(worst_rel(gp, rp) < 1e-6);
    assert!(worst_rel(gm, rm) < 1e-6);
    // a detached p (a stored sample) takes no gradient
    let m = m0.require_grad();
    let g = mean_square_residual(p0.clone(), m.clone()).sum().backward();
    assert!(p0.grad(&g).is_none() && m.grad(&g).is_some());
}

fn specials_and_randoms(n: usize) -> Vec<f32> {
    let mut v = vec![
        0.0f32,
        -0.0,
        1.0 + 1.0 / 512.0,
        1.0 + 3.0 / 512.0,
        f32::MAX,
        f32::MIN,
        f32::MIN_POSITIVE,
        f32::MIN_POSITIVE / 3.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::from_bits(0x7F80_0001),
        f32::from_bits(0xFFC1_2345),
        f32::from_bits(0x3F80_8000),
        f32::from_bits(0x3F81_8000),
        f32::from_bits(0x7F7F_8000),
    ];
    let mut state = 0x2545_F491u32;
    while v.len() < n {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        v.push(f32::from_bits(state));
    }
    v
}

#[test]
fn rounding_through_bf16_is_the_host_conversion_bit_for_bit() {
    for n in [1000, 300_000] {
        let data = TensorData::new(specials_and_randoms(n), [n]);
        let t = Tensor::<Flex, 1>::from_data(data.clone(), &Default::default());
        let got = bits(round_through(t.clone(), DType::BF16));
        let want = bits(reference::round_through(t, DType::BF16));
        assert_eq!(got, want, "{n} values");
        // which is the `half` crate's conversion there and back
        let half: Vec<u32> = specials_and_randoms(n)
            .iter()
            .map(|x| half::bf16::from_f32(*x).to_f32().to_bits())
            .collect();
        assert_eq!(got, half, "{n} values against half");
        // on the autodiff backend too, as a fresh untracked tensor
        let a = Tensor::<Ad, 1>::from_data(data, &Default::default()).require_grad();
        let r = round_through(a.clone(), DType::BF16);
        assert!(!r.is_require_grad());
        assert_eq!(bits(r), want);
    }
}

#[test]
fn other_backends_and_dtypes_take_the_composition_bit_for_bit() {
    let x = random::<NdArray, 3>([3, 4, 5], 1.0);
    let v = random::<NdArray, 3>([3, 4, 5], 1.0);
    let (a, c) = coefficient_sets(3).remove(0);
    assert_eq!(
        bits(combine(x.clone(), &a, v.clone(), &c)),
        bits(reference::combine(x.clone(), &a, v.clone(), &c))
    );
    assert_eq!(
        bits(mean_square_residual(x.clone(), v.clone())),
        bits(reference::mean_square_residual(x.clone(), v))
    );
    assert_eq!(
        bits(round_through(x.clone(), DType::BF16)),
        bits(reference::round_through(x, DType::BF16))
    );
    // f16 storage on Flex takes the host conversion
    let t = random::<Flex, 1>([64], 3.0);
    assert_eq!(
        bits(round_through(t.clone(), DType::F16)),
        bits(reference::round_through(t, DType::F16))
    );
}

/// The step as three calls: the composition `gaussian_step` must equal on every route.
fn three_calls<B: Backend>(
    x: Tensor<B, 3>,
    a: &[f64],
    v: Tensor<B, 3>,
    c: &[f64],
    next: NextSample<'_, B, 3>,
    storage: Option<DType>,
) -> GaussianStep<B, 3> {
    let mean = combine(x, a, v, c);
    let nx = match next {
        NextSample::Draw { noise, std } => {
            combine(mean.clone().detach(), &vec![1.0; std.len()], noise, std)
        }
        NextSample::Stored(p) => p,
    };
    let nx = storage.map_or(nx.clone(), |s| round_through(nx, s));
    let mean_sq = mean_square_residual(nx.clone(), mean.clone());
    GaussianStep {
        mean,
        next: nx,
        mean_sq,
    }
}

#[test]
fn the_one_pass_step_gives_the_bits_of_its_three_calls_and_of_the_autodiff_route() {
    for shape in [[3, 5, 7], [8, 576, 64], [2, 40_000, 1]] {
        let x = random::<Flex, 3>(shape, 1.0);
        let v = random::<Flex, 3>(shape, 1.0);
        let noise = random::<Flex, 3>(shape, 1.0);
        let std: Vec<f64> = (0..shape[0]).map(|b| 0.2 + 0.01 * b as f64).collect();
        for (a, c) in coefficient_sets(shape[0]) {
            for storage in [None, Some(DType::BF16), Some(DType::F32)] {
                // sampling on Flex
                let draw = || NextSample::Draw {
                    noise: noise.clone(),
                    std: &std,
                };
                let got = gaussian_step(x.clone(), &a, v.clone(), &c, draw(), storage);
                let want = three_calls(x.clone(), &a, v.clone(), &c, draw(), storage);
                let what = format!("{shape:?} storage {storage:?} a {:?}", &a[..1]);
                assert_eq!(bits(got.mean), bits(want.mean), "mean, {what}");
                assert_eq!(bits(got.next.clone()), bits(want.next), "drawn, {what}");
                let sampled = bits(got.mean_sq);
                assert_eq!(sampled, bits(want.mean_sq), "mean_sq, {what}");
                // replaying the drawn sample, on Flex and on Autodiff<Flex> with v tracked
                let stored = got.next;
                let replay = gaussian_step(
                    x.clone(),
                    &a,
                    v.clone(),
                    &c,
                    NextSample::Stored(stored.clone()),
                    storage,
                );
                assert_eq!(bits(replay.mean_sq), sampled, "replay, {what}");
                let ad = |t: &Tensor<Flex, 3>| Tensor::<Ad, 3>::from_inner(t.clone());
                let tracked = gaussian_step(
                    ad(&x),
                    &a,
                    ad(&v).require_grad(),
                    &c,
                    NextSample::Stored(ad(&stored)),
                    storage,
                );
                assert_eq!(bits(tracked.mean_sq), sampled, "autodiff replay, {what}");
            }
        }
    }
}

#[test]
fn the_steps_gradient_reaches_v_through_the_mean() {
    let x = random::<Ad, 3>([2, 6, 4], 1.0);
    let v = random::<Ad, 3>([2, 6, 4], 1.0).require_grad();
    let stored = random::<Ad, 3>([2, 6, 4], 1.0);
    let (a, c) = ([0.9, 0.8], [-0.1, -0.2]);
    let step = gaussian_step(
        x.clone(),
        &a,
        v.clone(),
        &c,
        NextSample::Stored(stored.clone()),
        Some(DType::BF16),
    );
    let g = step.mean_sq.sum().backward();
    let got = v.grad(&g).unwrap();
    // d/dv mean((p - mu)^2) = 2 (mu - p) c / n with p the rounded stored sample
    let p = round_through(stored.inner(), DType::BF16);
    let mu = reference::combine(x.inner(), &a, v.inner(), &c);
    let scale = Tensor::<Flex, 3>::from_data(
        TensorData::new(
            vec![2.0 * c[0] as f32 / 24.0, 2.0 * c[1] as f32 / 24.0],
            [2, 1, 1],
        ),
        &Default::default(),
    );
    let want = (mu - p) * scale;
    assert!(worst_rel(got, want) < 1e-6);
}
