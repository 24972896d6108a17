//! Throughput of the shapes world's generator (`fixtures/shapes_world`: the Qwen-Image
//! transformer at its tiny configuration, LoRA rank 8 on the eight attention projections), the
//! model behind every rollout step and every replayed transition of the embedded default run.
//!
//! * `forward`: one velocity evaluation of a batch of 32 (a rollout's row chunk per thread);
//! * `forward_backward`: forward and backward of a micro-batch of 16 under autodiff (a training
//!   micro-batch).
//!
//! `cargo bench --bench shapes_transformer` (CPU, burn's Flex backend); docs/PERFORMANCE.md
//! holds the figures.

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::Path;

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use flowrl::dit_models::{LoraConfig, VelocityModel};
use flowrl::trainer_fsdp::shapes_world::{ShapesGenerator, TOKEN_CHANNELS, TOKEN_GRID};

const PROMPTS: [&str; 4] = [
    "two blue squares",
    "a red circle left of a yellow triangle",
    "three green triangles",
    "a purple circle and a blue square",
];

fn generator<B: Backend>(device: &B::Device) -> ShapesGenerator<B> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/shapes_world");
    let mut g = ShapesGenerator::<B>::load(&dir, device).expect("load fixtures/shapes_world");
    g.dit = g
        .dit
        .attach_lora(&LoraConfig::new(8, 16.0))
        .expect("attach LoRA");
    g
}

fn inputs<B: Backend>(
    g: &ShapesGenerator<B>,
    batch: usize,
    device: &B::Device,
) -> (
    Tensor<B, 3>,
    Tensor<B, 1>,
    <flowrl::dit_models::QwenImageTransformer2DModel<B> as VelocityModel<B>>::Conditioning,
) {
    let prompts: Vec<&str> = (0..batch).map(|i| PROMPTS[i % PROMPTS.len()]).collect();
    let cond = g.conditioning(&prompts, device).expect("conditioning");
    let x = Tensor::random(
        [batch, TOKEN_GRID * TOKEN_GRID, TOKEN_CHANNELS],
        Distribution::Normal(0.0, 1.0),
        device,
    );
    let sigma = Tensor::random([batch], Distribution::Uniform(0.2, 0.9), device);
    (x, sigma, cond)
}

fn transformer(c: &mut Criterion) {
    let device = Default::default();
    let mut group = c.benchmark_group("shapes_transformer/flex");

    let g = generator::<Flex>(&device);
    let batch = 32;
    let (x, sigma, cond) = inputs(&g, batch, &device);
    group.throughput(Throughput::Elements(batch as u64));
    group.bench_function("forward/32", |b| {
        b.iter(|| {
            let v = g.dit.velocity(x.clone(), sigma.clone(), &cond);
            Flex::sync(&device).unwrap();
            v
        })
    });

    let g = generator::<Autodiff<Flex>>(&device);
    let batch = 16;
    let (x, sigma, cond) = inputs(&g, batch, &device);
    group.throughput(Throughput::Elements(batch as u64));
    group.bench_function("forward_backward/16", |b| {
        b.iter(|| {
            let v = g.dit.velocity(x.clone(), sigma.clone(), &cond);
            let grads = (v.clone() * v).mean().backward();
            Flex::sync(&device).unwrap();
            grads
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = transformer
}
criterion_main!(benches);
