//! Rollout and replay of a flow-matching sampler on an analytic model, end to end.
//!
//! What exists of the training loop today, run the way the trainer will run it: the Qwen-Image
//! sigma schedule for the requested resolution, trained SDE steps redrawn for this rollout id
//! from a pool, `x_T` and per-step noise from a recipe, Flow-SDE on the trained steps and a
//! deterministic solver elsewhere, the trajectory kept at a storage precision, then a replay of
//! every trained step that must reproduce the rollout's log-probs bit for bit (ratio exactly 1).
//! The model is Gaussian data `x0 ~ N(mu, s^2)`, whose velocity is exact, so the deterministic
//! sampler's endpoint error is measured against the true ODE solution.
//!
//! ```sh
//! cargo run --release --example sde_replay               # CPU, the defaults below
//! cargo run --release --features wgpu --example sde_replay -- --backend wgpu
//! ```

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::tensor::{Tensor, TensorData, backend::Backend};
use clap::{Parser, ValueEnum};
use flowrl::backend::BackendKind;
use flowrl::sde_math::analytic::GaussianFlow;
use flowrl::sde_math::solvers::{DpmSolverPP, OdeSolver, SolverState, UniPc};
use flowrl::sde_math::{Kernel, StepSigmas, StorageDtype};
use noise_recipe::{DenoiseSeeds, NoiseAlgorithm, NoiseRecipe, PromptMeta, SampleId, SampleIdMode};
use schedule::{PlanQuery, SchedulePolicy, SdeStepPlan, SdeType, TrainedStepsConfig};

/// Rollout and replay of a flow-matching sampler on an analytic model.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Backend: cpu, cuda or wgpu (GPU backends need the matching cargo feature).
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// Image height in pixels (the schedule's mu and the latent grid derive from it).
    #[arg(long, default_value_t = 384)]
    height: u32,
    /// Image width in pixels.
    #[arg(long, default_value_t = 384)]
    width: u32,
    /// Denoising steps.
    #[arg(long, default_value_t = 12)]
    steps: usize,
    /// Flow-SDE noise level `a`.
    #[arg(long, default_value_t = 0.7)]
    eta: f32,
    /// Candidate steps of the per-rollout draw of trained steps.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,5")]
    sde_pool: Vec<usize>,
    /// Trained SDE steps per rollout.
    #[arg(long, default_value_t = 3)]
    num_sde_steps: usize,
    /// Rollout id (selects the trained steps and nothing else).
    #[arg(long, default_value_t = 0)]
    rollout_id: u64,
    /// Candidates per prompt (the GRPO group size).
    #[arg(long, default_value_t = 8)]
    group_size: usize,
    /// Precision the trajectory is stored at.
    #[arg(long, value_enum, default_value_t = Storage::Bf16)]
    storage: Storage,
    /// Deterministic solver on the steps that are not trained.
    #[arg(long, value_enum, default_value_t = Solver::Unipc)]
    solver: Solver,
    /// Base seed of the noise recipe.
    #[arg(long, default_value_t = 1234)]
    seed: u64,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Storage {
    F32,
    Bf16,
    F16,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Solver {
    Euler,
    Dpm,
    Unipc,
}

impl Storage {
    fn dtype(self) -> StorageDtype {
        match self {
            Storage::F32 => StorageDtype::F32,
            Storage::Bf16 => StorageDtype::Bf16,
            Storage::F16 => StorageDtype::F16,
        }
    }
}

impl Solver {
    fn solver(self) -> OdeSolver {
        match self {
            Solver::Euler => OdeSolver::Euler,
            Solver::Dpm => OdeSolver::DpmSolverPP(DpmSolverPP::two_m()),
            Solver::Unipc => OdeSolver::UniPc(UniPc::bh2()),
        }
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let kind: BackendKind = args.backend.parse()?;
    kind.ensure_available()?;
    match kind {
        BackendKind::Cpu => run::<flowrl::backend::Cpu>(&args, &Default::default()),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => run::<flowrl::backend::Cuda>(&args, &Default::default()),
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => run::<flowrl::backend::Wgpu>(&args, &Default::default()),
        #[allow(unreachable_patterns)]
        other => bail!("backend {other} is not compiled in"),
    }
}

/// One stored stochastic transition of the rollout.
struct Stored<B: Backend> {
    step: usize,
    sample: Tensor<B, 3>,
    next: Tensor<B, 3>,
    log_prob: Tensor<B, 1>,
}

fn host_tensor<B: Backend>(data: Vec<f32>, shape: [usize; 3], dev: &B::Device) -> Tensor<B, 3> {
    Tensor::from_data(TensorData::new(data, shape), dev)
}

/// Root mean square of a tensor.
fn rms<B: Backend>(t: Tensor<B, 3>) -> f64 {
    let sq = t.clone().mul(t).mean();
    sq.into_data().convert::<f64>().to_vec::<f64>().unwrap()[0].sqrt()
}

fn run<B: Backend>(args: &Args, dev: &B::Device) -> Result<()> {
    let t0 = Instant::now();
    // Schedule and trained steps, resolved once for the rollout.
    let schedule = SchedulePolicy::qwen_image()
        .sample_sigmas(args.height, args.width, args.steps)
        .context("sigma schedule")?;
    let sigmas = schedule.sigmas.as_slice().to_vec();
    let cfg = TrainedStepsConfig {
        num_inference_steps: args.steps,
        sde_resample_per_rollout: true,
        sde_pool: Some(args.sde_pool.clone()),
        sde_indices: Some(
            args.sde_pool
                .iter()
                .copied()
                .take(args.num_sde_steps)
                .collect(),
        ),
        num_sde_steps: args.num_sde_steps,
        sde_timestep_fraction: [0.0, 1.0],
    };
    let (plan, report) = cfg
        .build(SdeType::FlowSde, &schedule.sigmas)
        .context("trained steps")?;
    for w in &report.warnings {
        println!("warning: {w}");
    }
    let trained = plan.steps(PlanQuery::rollout(args.rollout_id))?;
    let kernel = Kernel::flow_sde(args.eta)?;
    let storage = args.storage.dtype();
    let solver = args.solver.solver();

    // Latents: Qwen-Image packs a (H/8, W/8, 16) VAE latent into (H/16 * W/16) tokens of 64.
    let tokens = (args.height as usize / 16) * (args.width as usize / 16);
    let shape = [args.group_size, tokens, 64];
    let sample_ids: Vec<SampleId> = (0..args.group_size)
        .map(|slot| {
            SampleId::new(
                SampleIdMode::Metadata,
                0,
                PromptMeta {
                    prompt_id: Some("analytic"),
                    sample_id: None,
                },
                slot,
            )
        })
        .collect();
    let recipe = NoiseRecipe::for_samples(
        args.seed,
        vec![tokens, 64],
        &sample_ids,
        NoiseAlgorithm::Pcg64BoxMuller,
    )?;
    let x_t: Tensor<B, 3> = recipe.generate().to_tensor(dev)?;
    // Request-local, sample-unique per-step noise: the whole run is reproducible.
    let step_noise = DenoiseSeeds::for_samples(args.seed, &sample_ids)?;

    // The "model": Gaussian data with per-element mean and std drawn from the same recipe.
    let data = NoiseRecipe::new(
        args.seed ^ 0xDA7A,
        vec![tokens, 64],
        vec![1, 2],
        NoiseAlgorithm::Pcg64BoxMuller,
    )?
    .generate();
    let mu = host_tensor::<B>(
        data.sample(0).iter().map(|v| 0.5 * v).collect(),
        [1, tokens, 64],
        dev,
    );
    let s = host_tensor::<B>(
        data.sample(1).iter().map(|v| 0.2 + 0.3 * v.abs()).collect(),
        [1, tokens, 64],
        dev,
    );
    let flow = GaussianFlow {
        mu: mu.repeat_dim(0, args.group_size),
        s: s.repeat_dim(0, args.group_size),
    };

    println!(
        "flowrl sde_replay: {}x{} -> {} tokens x 64 channels, {} steps (mu = {:.4}), group of {}, Flow-SDE a = {} on steps {:?} (rollout {}), {} elsewhere, stored at {:?}",
        args.width,
        args.height,
        tokens,
        args.steps,
        schedule.mu.unwrap_or(f64::NAN),
        args.group_size,
        args.eta,
        trained.as_slice(),
        args.rollout_id,
        format!("{:?}", args.solver).to_lowercase(),
        args.storage
    );

    // Rollout.
    let t_rollout = Instant::now();
    let mut x = x_t.clone();
    let mut state = SolverState::new();
    let mut stored = Vec::new();
    println!("\n step   sigma    kind   mean log_prob   transition std");
    for i in 0..args.steps {
        if trained.contains(i) {
            // The sample entering a trained step is what the trajectory stores: round it first,
            // so replay feeds the model exactly what the rollout fed it.
            x = storage.round_trip(x);
            let v = flow.velocity(x.clone(), sigmas[i]);
            let noise: Vec<f32> = (0..args.group_size)
                .flat_map(|j| step_noise.noise(j, i, &[tokens, 64]))
                .collect();
            let noise = host_tensor::<B>(noise, shape, dev);
            let at = StepSigmas::from_schedule(&sigmas, i)?.into();
            let out = kernel.sample(&at, v, x.clone(), noise, storage)?;
            let lp = out
                .log_prob
                .clone()
                .mean()
                .into_data()
                .convert::<f64>()
                .to_vec::<f64>()
                .unwrap()[0];
            println!(
                " {i:>4}   {:.4}   SDE    {lp:>13.5}   {:.5}",
                sigmas[i], out.std[0]
            );
            stored.push(Stored {
                step: i,
                sample: x.clone(),
                next: out.prev_sample.clone(),
                log_prob: out.log_prob,
            });
            x = out.prev_sample;
        } else {
            let v = flow.velocity(x.clone(), sigmas[i]);
            x = solver.step(&mut state, &sigmas, i, v, x)?;
            println!(" {i:>4}   {:.4}   ODE", sigmas[i]);
        }
    }
    B::sync(dev)?;
    let rollout_time = t_rollout.elapsed();

    // Replay: every trained step rescored under the same (frozen) model.
    let t_replay = Instant::now();
    let (mut worst, mut identical) = (0.0f64, true);
    for st in &stored {
        let v = flow.velocity(st.sample.clone(), sigmas[st.step]);
        let at = StepSigmas::from_schedule(&sigmas, st.step)?.into();
        let out = kernel.replay(&at, v, st.sample.clone(), st.next.clone(), storage)?;
        let a = st.log_prob.clone().into_data();
        let b = out.log_prob.into_data();
        identical &= a == b;
        for (p, q) in a
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .zip(b.to_vec::<f32>().unwrap())
        {
            let d = ((f64::from(q) - f64::from(*p)).exp() - 1.0).abs();
            // a NaN log-prob makes the worst ratio NaN (`f64::max` would drop it)
            worst = if d.is_nan() || worst.is_nan() {
                f64::NAN
            } else {
                worst.max(d)
            };
        }
    }
    let replay_time = t_replay.elapsed();
    // equal NaN bits are not a replay that reproduced its log-probs
    let identical = identical && !worst.is_nan();

    // Deterministic runs from the same x_T against the exact endpoint.
    let exact = flow.solution(x_t.clone(), 0.0);
    let mut errors = Vec::new();
    for solver in [Solver::Euler, Solver::Dpm, Solver::Unipc] {
        let mut x = x_t.clone();
        let mut state = SolverState::new();
        for i in 0..args.steps {
            let v = flow.velocity(x.clone(), sigmas[i]);
            x = solver.solver().step(&mut state, &sigmas, i, v, x)?;
        }
        errors.push((solver, rms(x.sub(exact.clone()))));
    }
    let sde_gap = rms(x.sub(exact.clone()));
    let data_scale = rms(exact);

    println!(
        "\nrollout: {:.1} ms for {} samples x {} steps; replay of {} transitions: {:.1} ms",
        rollout_time.as_secs_f64() * 1e3,
        args.group_size,
        args.steps,
        stored.len() * args.group_size,
        replay_time.as_secs_f64() * 1e3
    );
    for (solver, err) in &errors {
        println!(
            "deterministic {:<6} endpoint: rms(x - exact) = {err:.3e}",
            format!("{solver:?}").to_lowercase()
        );
    }
    println!(
        "stochastic rollout endpoint: rms(x - exact ODE endpoint) = {sde_gap:.3} (data rms {data_scale:.3}): the exploration the SDE steps add"
    );
    println!(
        "on-policy replay: {} trained steps x {} samples, max |ratio - 1| = {worst:.1e}, log-probs bitwise identical: {}",
        stored.len(),
        args.group_size,
        if identical { "yes" } else { "NO" }
    );
    println!("total {:.2} s", t0.elapsed().as_secs_f64());
    if !identical {
        bail!("replay did not reproduce the rollout's log-probs bit for bit");
    }
    Ok(())
}
