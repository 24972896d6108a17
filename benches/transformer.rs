//! Throughput of the Qwen-Image transformer on burn's CPU backends, LoRA rank 8 on the eight
//! attention projections, at three configurations, each on Flex (the default CPU backend, with
//! `fused-ops`' kernels) and on NdArray (burn's generic compositions, no BLAS):
//!
//! * `shapes_transformer`: the shapes world's generator (`fixtures/shapes_world`: 4 blocks of
//!   width 128, 64 image + 12 text tokens), the model behind every rollout step and every
//!   replayed transition of the embedded default run. `forward/32` is one velocity
//!   evaluation of a batch of 32 (a rollout's row chunk per thread), `forward_backward/16`
//!   forward and backward of a training micro-batch of 16;
//! * `mid_transformer`: random weights at 4 blocks of 4 heads of 64 (width 256), 32 text
//!   tokens (two of the four rows padded), batch 4, at 256 and at 1024 image tokens: where
//!   attention's cost shows (`forward/256`, `forward_backward/256`, `forward/1024`,
//!   `forward_backward/1024`).
//!
//! Group names end in the backend (`shapes_transformer/flex`, `shapes_transformer/ndarray`);
//! `cargo bench --bench transformer -- /flex` runs one backend. With `--features
//! bench-openblas` NdArray's products go through the system's OpenBLAS (its groups end in
//! `ndarray_openblas`); with `--features bench-candle` every row also runs on burn's Candle
//! backend (`.../candle`).
//!
//! `cargo bench --bench transformer`; `benches/reference/transformer_torch.py` is the same
//! work in PyTorch (diffusers + peft) and `benches/reference/compare_transformer.py` runs both
//! alternately and prints the ratios (docs/PERFORMANCE.md holds the figures).

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "../examples/common/mod.rs"]
#[allow(dead_code)]
mod common;

use std::path::Path;

use burn::backend::{Autodiff, Flex, NdArray};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Int, Tensor, TensorData};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use flowrl::dit_models::{
    ImageShape, LoraConfig, QwenImageConfig, QwenImageInput, QwenImageTransformer2DModel,
    VelocityModel,
};
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
    <QwenImageTransformer2DModel<B> as VelocityModel<B>>::Conditioning,
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

fn shapes(c: &mut Criterion) {
    // As the main job runs: freed pages stay with the process (docs/PERFORMANCE.md, "The
    // allocator"), so the figures are the model's and not the kernel's page zeroing.
    common::keep_freed_pages();
    shapes_on::<Flex>(c, "flex");
    shapes_on::<NdArray>(c, NDARRAY);
    #[cfg(feature = "bench-candle")]
    shapes_on::<burn::backend::Candle>(c, "candle");
}

fn shapes_on<B: Backend>(c: &mut Criterion, backend: &str) {
    let device = Default::default();
    let mut group = c.benchmark_group(format!("shapes_transformer/{backend}"));

    let g = generator::<B>(&device);
    let batch = 32;
    let (x, sigma, cond) = inputs(&g, batch, &device);
    group.throughput(Throughput::Elements(batch as u64));
    group.bench_function("forward/32", |b| {
        b.iter(|| {
            let v = g.dit.velocity(x.clone(), sigma.clone(), &cond);
            B::sync(&device).unwrap();
            v
        })
    });

    let g = generator::<Autodiff<B>>(&device);
    let batch = 16;
    let (x, sigma, cond) = inputs(&g, batch, &device);
    group.throughput(Throughput::Elements(batch as u64));
    group.bench_function("forward_backward/16", |b| {
        b.iter(|| {
            let v = g.dit.velocity(x.clone(), sigma.clone(), &cond);
            let grads = (v.clone() * v).mean().backward();
            B::sync(&device).unwrap();
            grads
        })
    });
    group.finish();
}

/// The mid configuration (the same numbers as `transformer_torch.py`'s `MID`).
fn mid_config() -> QwenImageConfig {
    QwenImageConfig::new()
        .with_in_channels(64)
        .with_out_channels(16)
        .with_num_layers(4)
        .with_attention_head_dim(64)
        .with_num_attention_heads(4)
        .with_joint_attention_dim(256)
        .with_axes_dims_rope([16, 24, 24])
}

const MID_BATCH: usize = 4;
const MID_TEXT: usize = 32;
/// Real text tokens per row; the rest are padding (masked keys).
const MID_TEXT_LENGTHS: [usize; MID_BATCH] = [32, 20, 32, 9];

fn mid_model<B: Backend>(device: &B::Device) -> QwenImageTransformer2DModel<B> {
    mid_config()
        .init::<B>(device)
        .attach_lora(&LoraConfig::new(8, 16.0))
        .expect("attach LoRA")
}

/// The mid configuration's inputs at a `side x side` token grid.
fn mid_input<B: Backend>(side: usize, device: &B::Device) -> QwenImageInput<B> {
    // through an integer tensor: burn-candle 0.21 builds no Bool tensor from bool data
    let mask: Vec<i32> = MID_TEXT_LENGTHS
        .iter()
        .flat_map(|&n| (0..MID_TEXT).map(move |i| i32::from(i < n)))
        .collect();
    QwenImageInput {
        hidden_states: Tensor::random(
            [MID_BATCH, side * side, 64],
            Distribution::Normal(0.0, 1.0),
            device,
        ),
        encoder_hidden_states: Tensor::random(
            [MID_BATCH, MID_TEXT, 256],
            Distribution::Normal(0.0, 1.0),
            device,
        ),
        encoder_hidden_states_mask: Some(
            Tensor::<B, 2, Int>::from_data(TensorData::new(mask, [MID_BATCH, MID_TEXT]), device)
                .equal_elem(1),
        ),
        timestep: Tensor::random([MID_BATCH], Distribution::Uniform(0.2, 0.9), device),
        img_shapes: vec![ImageShape::new(1, side, side)],
    }
}

fn mid(c: &mut Criterion) {
    mid_on::<Flex>(c, "flex");
    mid_on::<NdArray>(c, NDARRAY);
    #[cfg(feature = "bench-candle")]
    mid_on::<burn::backend::Candle>(c, "candle");
}

/// NdArray's group name: whether its products run on OpenBLAS.
const NDARRAY: &str = if cfg!(feature = "bench-openblas") {
    "ndarray_openblas"
} else {
    "ndarray"
};

fn mid_on<B: Backend>(c: &mut Criterion, backend: &str) {
    let device = Default::default();
    let mut group = c.benchmark_group(format!("mid_transformer/{backend}"));
    group.throughput(Throughput::Elements(MID_BATCH as u64));
    let model = mid_model::<B>(&device);
    let trained = mid_model::<Autodiff<B>>(&device);
    for side in [16, 32] {
        let tokens = side * side;
        let input = mid_input::<B>(side, &device);
        group.bench_function(format!("forward/{tokens}"), |b| {
            b.iter(|| {
                let v = model.forward(input.clone());
                B::sync(&device).unwrap();
                v
            })
        });
        let input = mid_input::<Autodiff<B>>(side, &device);
        group.bench_function(format!("forward_backward/{tokens}"), |b| {
            b.iter(|| {
                let v = trained.forward(input.clone());
                let grads = (v.clone() * v).mean().backward();
                B::sync(&device).unwrap();
                grads
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = shapes, mid
}
criterion_main!(benches);
