//! Throughput of the per-step kernels at the Qwen-Image 384x384 latent size: a batch of 8
//! packed latents of 576 tokens x 64 channels (elements/s, device-synced).
//!
//! `cargo bench --bench sde_kernels` (CPU, burn's Flex backend). `benches/reference/sde_step_torch.py`
//! times the same steps in PyTorch; docs/PERFORMANCE.md holds both.

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "../examples/common/mod.rs"]
#[allow(dead_code)]
mod common;

use burn::tensor::{Tensor, TensorData, backend::Backend};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use flowrl::sde_math::solvers::{DpmSolverPP, OdeSolver, SolverState, UniPc};
use flowrl::sde_math::{Kernel, Sigmas, StepSigmas, StorageDtype};

const SHAPE: [usize; 3] = [8, 576, 64];

fn normals<B: Backend>(seed: u64, dev: &B::Device) -> Tensor<B, 3> {
    // a cheap deterministic fill (the kernels' cost does not depend on the values)
    let n: usize = SHAPE.iter().product();
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let data: Vec<f32> = (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.4
        })
        .collect();
    Tensor::from_data(TensorData::new(data, SHAPE), dev)
}

fn kernels<B: Backend>(c: &mut Criterion, backend: &str, dev: B::Device) {
    let elements: usize = SHAPE.iter().product();
    let x = normals::<B>(1, &dev);
    let v = normals::<B>(2, &dev);
    let noise = normals::<B>(3, &dev);
    let at: Sigmas = StepSigmas::new(0.8, 0.72).unwrap().into();

    let mut group = c.benchmark_group(format!("sde_step/{backend}"));
    group.throughput(Throughput::Elements(elements as u64));
    let kernels = [
        ("flow_sde", Kernel::flow_sde(0.7).unwrap()),
        ("dance", Kernel::dance(0.3).unwrap()),
        ("cps", Kernel::cps(0.7).unwrap()),
        ("churn", Kernel::churn(0.0025).unwrap()),
    ];
    for (name, k) in kernels {
        group.bench_function(BenchmarkId::new("sample", name), |b| {
            b.iter(|| {
                let out = k
                    .sample(&at, v.clone(), x.clone(), noise.clone(), StorageDtype::F32)
                    .unwrap();
                B::sync(&dev).unwrap();
                out
            })
        });
        let stored = k
            .sample(&at, v.clone(), x.clone(), noise.clone(), StorageDtype::Bf16)
            .unwrap()
            .prev_sample;
        group.bench_function(BenchmarkId::new("replay", name), |b| {
            b.iter(|| {
                let out = k
                    .replay(
                        &at,
                        v.clone(),
                        x.clone(),
                        stored.clone(),
                        StorageDtype::Bf16,
                    )
                    .unwrap();
                B::sync(&dev).unwrap();
                out
            })
        });
    }
    group.bench_function(BenchmarkId::new("sample_bf16_storage", "flow_sde"), |b| {
        let k = Kernel::flow_sde(0.7).unwrap();
        b.iter(|| {
            let out = k
                .sample(&at, v.clone(), x.clone(), noise.clone(), StorageDtype::Bf16)
                .unwrap();
            B::sync(&dev).unwrap();
            out
        })
    });
    let sigmas: Vec<f32> = (0..=12).map(|i| 1.0 - i as f32 / 12.0).collect();
    for (name, solver) in [
        ("euler", OdeSolver::Euler),
        ("dpm++2m", OdeSolver::DpmSolverPP(DpmSolverPP::two_m())),
        ("unipc_bh2", OdeSolver::UniPc(UniPc::bh2())),
    ] {
        group.bench_function(BenchmarkId::new("ode", name), |b| {
            // steady state: steps 4 and 5 after warming the history on steps 2 and 3
            b.iter_batched(
                || {
                    let mut st = SolverState::new();
                    for i in 2..4 {
                        solver
                            .step(&mut st, &sigmas, i, v.clone(), x.clone())
                            .unwrap();
                    }
                    st
                },
                |mut st| {
                    let out = solver
                        .step(&mut st, &sigmas, 4, v.clone(), x.clone())
                        .unwrap();
                    B::sync(&dev).unwrap();
                    out
                },
                // one state per iteration: a batch of them (and of their outputs, 1.2 MB
                // each) held at once would measure fresh memory, not the step
                criterion::BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

fn cpu(c: &mut Criterion) {
    // As the main job runs: freed pages stay with the process (docs/PERFORMANCE.md, "The
    // allocator"), so the figures are the kernels' and not the kernel's page zeroing.
    common::keep_freed_pages();
    kernels::<flowrl::backend::Cpu>(c, "flex", Default::default());
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).warm_up_time(std::time::Duration::from_secs(1)).measurement_time(std::time::Duration::from_secs(3));
    targets = cpu
}
criterion_main!(benches);
