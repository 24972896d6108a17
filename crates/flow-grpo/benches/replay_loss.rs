//! Throughput of the FlowGRPO objective at the Qwen-Image 384x384 latent size: a micro-batch of
//! 8 packed latents of 576 tokens x 64 channels, 3 trained steps — 24 transitions per
//! iteration (a "transition" is one replayed SDE step of one candidate, as in
//! `perf/train_transitions_per_s`). The model forward is not included: these are the costs the
//! objective adds on top of it.
//!
//! `cargo bench -p flow-grpo --bench replay_loss` (CPU, burn's Flex backend; device-synced).

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use burn::backend::{Autodiff, Flex};
use burn::tensor::{Tensor, TensorData, backend::Backend};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use flow_grpo::{ClipRange, ReplayStep, grpo_clip_loss, replay_log_probs};
use sde_math::{Kernel, StepSigmas, StorageDtype};

const SHAPE: [usize; 3] = [8, 576, 64];
const STEPS: [(f32, f32); 3] = [(0.9167, 0.8333), (0.75, 0.6667), (0.5833, 0.5)];

fn fill<B: Backend>(seed: u64, dev: &B::Device) -> Tensor<B, 3> {
    let n: usize = SHAPE.iter().product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.4
        })
        .collect();
    Tensor::from_data(TensorData::new(v, SHAPE), dev)
}

/// Per trained step: (sample, stored next sample, model output), next sample at bf16.
fn inputs<B: Backend>(dev: &B::Device) -> Vec<[Tensor<B, 3>; 3]> {
    (0..STEPS.len() as u64)
        .map(|i| {
            [
                fill::<B>(3 * i + 1, dev),
                StorageDtype::Bf16.round_trip(fill::<B>(3 * i + 2, dev)),
                fill::<B>(3 * i + 3, dev),
            ]
        })
        .collect()
}

fn steps<B: Backend>(inputs: &[[Tensor<B, 3>; 3]], grad: bool) -> Vec<ReplayStep<B, 3>> {
    inputs
        .iter()
        .zip(STEPS)
        .map(|([x, next, v], (s, n))| ReplayStep {
            sigmas: StepSigmas::new(s, n).unwrap().into(),
            sample: x.clone(),
            prev_sample: next.clone(),
            model_output: if grad {
                v.clone().require_grad()
            } else {
                v.clone()
            },
        })
        .collect()
}

fn objective(c: &mut Criterion) {
    let kernel = Kernel::flow_sde(0.7).unwrap();
    let clip = ClipRange::symmetric(1e-4).unwrap();
    let transitions = (SHAPE[0] * STEPS.len()) as u64;
    let mut group = c.benchmark_group("flow_grpo/flex");
    group.throughput(Throughput::Elements(transitions));
    group.sample_size(20);

    let dev = Default::default();
    let inp = inputs::<Flex>(&dev);
    let adv = Tensor::<Flex, 1>::from_floats([1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.5, -0.5], &dev);
    group.bench_function(BenchmarkId::new("replay_log_probs", "8x576x64x3"), |b| {
        b.iter(|| {
            let out = replay_log_probs(&kernel, StorageDtype::Bf16, steps(&inp, false)).unwrap();
            Flex::sync(&dev).unwrap();
            out.log_probs
        })
    });
    let anchor = replay_log_probs(&kernel, StorageDtype::Bf16, steps(&inp, false))
        .unwrap()
        .log_probs;
    group.bench_function(
        BenchmarkId::new("replay_and_clip_loss", "8x576x64x3"),
        |b| {
            b.iter(|| {
                let lp = replay_log_probs(&kernel, StorageDtype::Bf16, steps(&inp, false)).unwrap();
                let out = grpo_clip_loss(lp.log_probs, anchor.clone(), adv.clone(), clip).unwrap();
                Flex::sync(&dev).unwrap();
                out.diagnostics
            })
        },
    );

    type AD = Autodiff<Flex>;
    let inp_ad = inputs::<AD>(&dev);
    let adv_ad = Tensor::<AD, 1>::from_data(adv.clone().into_data(), &dev);
    let anchor_ad = Tensor::<AD, 2>::from_data(anchor.clone().into_data(), &dev);
    group.bench_function(
        BenchmarkId::new("replay_clip_loss_backward", "8x576x64x3"),
        |b| {
            b.iter(|| {
                let lp =
                    replay_log_probs(&kernel, StorageDtype::Bf16, steps(&inp_ad, true)).unwrap();
                let out =
                    grpo_clip_loss(lp.log_probs, anchor_ad.clone(), adv_ad.clone(), clip).unwrap();
                let grads = out.loss.backward();
                Flex::sync(&dev).unwrap();
                grads
            })
        },
    );
    group.finish();
}

criterion_group!(benches, objective);
criterion_main!(benches);
