//! A tiny but real FlowGRPO world for the integration tests: a linear velocity model over
//! 2-dimensional latents, Flow-SDE rollouts through `sde-math`'s kernel with noise from the
//! trainer's RNG, a verifiable reward, group advantages, a frozen pi_old anchor, replay through
//! `flow_grpo::replay_log_probs` and the clipped loss, all driven by `train_step`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ops::Range;

use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, Module, Param, ParamId};
use burn::nn::Linear;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use flow_grpo::{
    AdvantageConfig, AnchorRecorder, ClipDiagnostics, ClipRange, PolicyAnchor, ReplayStep,
    RewardComponent, RewardGroup, StdMode, UpdatePlan, grpo_clip_loss, plan_updates,
    replay_log_probs,
};
use sde_math::{Kernel, Sigmas, StepSigmas, StorageDtype};
use trainer_fsdp::{
    AdamWOptimizer, AdamWSettings, LocalWorkers, LrSchedule, LrSchedulerKind, MicroBatchLoss,
    PolicyOptimizer, TrainerError, TrainerRng, UpdateReport, advantages, train_step,
};

/// The training backend.
pub type AD = Autodiff<Flex>;

/// The trained SDE steps: (sigma, sigma_next).
pub const STEPS: [(f32, f32); 2] = [(0.8, 0.6), (0.6, 0.4)];
/// Prompts per rollout.
pub const PROMPTS: usize = 2;
/// Candidates per prompt.
pub const GROUP: usize = 4;
/// Updates per rollout.
pub const UPDATES: usize = 2;
/// Micro-batch size.
pub const MICRO: usize = 2;

/// `v = W [x0, x1, sigma, prompt] + b`.
#[derive(Module, Debug)]
pub struct Policy<B: Backend> {
    pub lin: Linear<B>,
}

fn values(rng: &mut TrainerRng, n: usize, scale: f64) -> Vec<f32> {
    (0..n)
        .map(|_| ((rng.uniform() - 0.5) * scale) as f32)
        .collect()
}

impl<B: Backend> Policy<B> {
    /// Deterministic weights from `seed` (no backend RNG), and deterministic parameter ids,
    /// so two processes write byte-identical checkpoints (ids are keys of the optimizer state).
    pub fn init(seed: u64, device: &B::Device) -> Self {
        let mut rng = TrainerRng::seeded(seed);
        let w = values(&mut rng, 4 * 2, 1.0);
        let b = values(&mut rng, 2, 0.2);
        let id = |k: u64| ParamId::from(seed * 16 + k);
        let w = Tensor::<B, 2>::from_data(TensorData::new(w, [4, 2]), device).require_grad();
        let b = Tensor::<B, 1>::from_data(TensorData::new(b, [2]), device).require_grad();
        Self {
            lin: Linear {
                weight: Param::initialized(id(1), w),
                bias: Some(Param::initialized(id(2), b)),
            },
        }
    }

    /// The velocity at latents `x` `[n, 2]`, noise level `sigma`, prompts `prompt` `[n]`.
    pub fn velocity(&self, x: Tensor<B, 2>, sigma: f32, prompt: &[f32]) -> Tensor<B, 2> {
        let n = x.dims()[0];
        let dev = x.device();
        let s = Tensor::<B, 2>::full([n, 1], sigma, &dev);
        let p = Tensor::<B, 2>::from_data(TensorData::new(prompt.to_vec(), [n, 1]), &dev);
        self.lin.forward(Tensor::cat(vec![x, s, p], 1))
    }
}

/// Box-Muller normals from the trainer's stream.
pub fn normals(rng: &mut TrainerRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let u1 = rng.uniform().max(1e-12);
            let u2 = rng.uniform();
            ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
        })
        .collect()
}

/// One rollout batch: the stored trained transitions and the rewards.
pub struct Rollout {
    /// Prompt value of each sample.
    pub prompt: Vec<f32>,
    /// Per trained step: (x_k, x_{k+1}) as `[n * 2]` host values.
    pub steps: Vec<(Vec<f32>, Vec<f32>)>,
    /// Reward groups.
    pub groups: Vec<RewardGroup>,
}

pub fn kernel() -> Kernel {
    Kernel::flow_sde(0.7).unwrap()
}

fn sigmas(k: usize) -> Sigmas {
    StepSigmas::new(STEPS[k].0, STEPS[k].1).unwrap().into()
}

fn t2(v: &[f32], n: usize, dev: &burn::tensor::Device<Flex>) -> Tensor<Flex, 2> {
    Tensor::from_data(TensorData::new(v.to_vec(), [n, 2]), dev)
}

/// Samples `PROMPTS x GROUP` candidates with the current policy; the reward prefers final
/// latents near `(prompt, -prompt)`.
pub fn rollout(model: &Policy<Flex>, rng: &mut TrainerRng) -> Rollout {
    let dev = Default::default();
    let n = PROMPTS * GROUP;
    let prompt: Vec<f32> = (0..n).map(|i| (i / GROUP) as f32 - 0.5).collect();
    let mut x = normals(rng, n * 2);
    let k = kernel();
    let mut steps = Vec::new();
    for (s, &(sigma, _)) in STEPS.iter().enumerate() {
        let xt = t2(&x, n, &dev);
        let v = model.velocity(xt.clone(), sigma, &prompt);
        let noise = t2(&normals(rng, n * 2), n, &dev);
        let t = k
            .sample(&sigmas(s), v, xt, noise, StorageDtype::F32)
            .unwrap();
        let next: Vec<f32> = t.prev_sample.into_data().to_vec().unwrap();
        steps.push((x.clone(), next.clone()));
        x = next;
    }
    let groups = (0..PROMPTS)
        .map(|g| RewardGroup {
            prompt_key: format!("prompt{g}"),
            samples: (0..GROUP)
                .map(|j| {
                    let i = g * GROUP + j;
                    let p = prompt[i] as f64;
                    let (a, b) = (x[2 * i] as f64, x[2 * i + 1] as f64);
                    let r = -((a - p).powi(2) + (b + p).powi(2));
                    BTreeMap::from([("score".to_string(), r)])
                })
                .collect(),
        })
        .collect();
    Rollout {
        prompt,
        steps,
        groups,
    }
}

/// Replayed log-probs `[mb, steps]` of the samples `mb` under `model`.
pub fn replay<B: Backend>(
    model: &Policy<B>,
    r: &Rollout,
    mb: Range<usize>,
) -> Result<Tensor<B, 2>, TrainerError> {
    let dev: B::Device = model.lin.weight.val().device();
    let m = mb.len();
    let prompt = &r.prompt[mb.clone()];
    let steps = STEPS
        .iter()
        .enumerate()
        .map(|(s, &(sigma, _))| {
            let pick = |v: &Vec<f32>| {
                Tensor::<B, 2>::from_data(
                    TensorData::new(v[2 * mb.start..2 * mb.end].to_vec(), [m, 2]),
                    &dev,
                )
            };
            let sample = pick(&r.steps[s].0);
            ReplayStep {
                sigmas: sigmas(s),
                model_output: model.velocity(sample.clone(), sigma, prompt),
                sample,
                prev_sample: pick(&r.steps[s].1),
            }
        })
        .collect();
    Ok(replay_log_probs(&kernel(), StorageDtype::F32, steps)?.log_probs)
}

/// The frozen pi_old anchor of a plan, recorded before any optimizer step.
pub fn anchor(model: &Policy<AD>, r: &Rollout, plan: &UpdatePlan) -> PolicyAnchor {
    let inner = model.valid();
    let mut rec = AnchorRecorder::new(plan);
    for mb in plan.micro_batches() {
        rec.record(mb.clone(), replay(&inner, r, mb.clone()).unwrap())
            .unwrap();
    }
    rec.freeze().unwrap()
}

pub fn advantage_config() -> AdvantageConfig {
    AdvantageConfig::flow_grpo(
        StdMode::Group,
        vec![RewardComponent::required("score", 1.0)],
    )
    .unwrap()
}

pub fn clip_range() -> ClipRange {
    ClipRange::symmetric(0.2).unwrap()
}

/// The clipped loss of micro-batch `mb`.
pub fn loss(
    model: &Policy<AD>,
    r: &Rollout,
    anchor: &PolicyAnchor,
    adv: &flow_grpo::Advantages,
    mb: Range<usize>,
) -> Result<MicroBatchLoss<AD, ClipDiagnostics>, TrainerError> {
    let dev = Default::default();
    let idx: Vec<usize> = mb.clone().collect();
    let out = grpo_clip_loss(
        replay(model, r, mb.clone())?,
        anchor.log_probs::<AD>(mb, &dev)?,
        adv.tensor::<AD>(&idx, &dev),
        clip_range(),
    )?;
    Ok(MicroBatchLoss {
        loss: out.loss,
        elements: out.diagnostics.elements,
        diagnostics: out.diagnostics,
    })
}

pub type Opt = PolicyOptimizer<AD, Policy<AD>, AdamWOptimizer<AD, Policy<AD>>>;

/// AdamW, warmup 2 then cosine to step 12; clip 1.0.
pub fn optimizer() -> Opt {
    let settings = AdamWSettings {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    };
    let schedule = LrSchedule::new(5e-2, 2, LrSchedulerKind::Cosine, 5e-3, Some(12)).unwrap();
    PolicyOptimizer::adamw(
        &settings,
        schedule,
        1.0,
        Some(trainer_fsdp::MasterDtype::Fp32),
    )
    .unwrap()
}

pub fn plan() -> UpdatePlan {
    plan_updates(PROMPTS * GROUP, UPDATES, MICRO).unwrap()
}

/// One rollout and its updates.
pub fn run_rollout(
    model: Policy<AD>,
    opt: &mut Opt,
    rng: &mut TrainerRng,
) -> (Policy<AD>, Vec<UpdateReport<ClipDiagnostics>>) {
    let r = rollout(&model.valid(), rng);
    let adv = advantages(&advantage_config(), &r.groups, None).unwrap();
    let plan = plan();
    let anchor = anchor(&model, &r, &plan);
    let mut model = model;
    let mut reports = Vec::new();
    for update in &plan.updates {
        let (m, report) = train_step(
            model,
            opt,
            &LocalWorkers::new(1),
            update,
            adv.degenerate,
            |m, mb| loss(m, &r, &anchor, &adv, mb),
        )
        .unwrap();
        model = m;
        reports.push(report);
    }
    (model, reports)
}

/// Every parameter's exact bytes, by id-independent order (module order).
pub fn param_bytes<B: Backend>(model: &Policy<B>) -> Vec<Vec<u8>> {
    let mut out = vec![model.lin.weight.val().into_data().bytes.to_vec()];
    if let Some(b) = &model.lin.bias {
        out.push(b.val().into_data().bytes.to_vec());
    }
    out
}

/// A fresh parameter id for each parameter (as a new process would have).
pub fn with_fresh_ids(model: Policy<AD>) -> Policy<AD> {
    let w = model.lin.weight.val();
    let b = model.lin.bias.as_ref().map(|b| b.val());
    Policy {
        lin: Linear {
            weight: Param::initialized(ParamId::new(), w.detach().require_grad()),
            bias: b.map(|b| Param::initialized(ParamId::new(), b.detach().require_grad())),
        },
    }
}
