//! A second world for the generic run, written outside the crate against the public seams
//! only: an analytic Gaussian world whose velocity is exact and whose reward is closed-form.
//!
//! * Prompts are classes `"class 0"` .. `"class 7"`; classes 6 and 7 are held out.
//! * The base data of class `c` is `x0 ~ N(m_c, s^2 I)` over a `[TOKENS, CHANNELS]` latent,
//!   with fixed means `m_c`. For Gaussian data the flow-matching velocity is exact:
//!   with `x_sigma = (1 - sigma) x0 + sigma eps` and `V = (1 - sigma)^2 s^2 + sigma^2`,
//!   `v(x, sigma) = E[eps - x0 | x_sigma] = (sigma - (1 - sigma) s^2) / V * (x - (1 - sigma) m) - m`.
//! * The policy is that velocity with the means shifted by one learned offset `delta`, shared
//!   by every class (so what the training classes learn carries over to the held-out ones);
//!   it starts at 0, i.e. at the exact base model. Every parameter trains (`full` mode).
//! * The reward is closed-form: `closeness = -mean((x0 - (m_c + SHIFT))^2)`, highest when the
//!   policy has learned `delta = SHIFT`. The base policy scores about `-(SHIFT^2 + s^2)`.
//! * The conditioning is the class's one-hot vector, stored in the trajectory as a
//!   `[1, CLASSES]` "text" state.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use reward::{Components, RgbImage};
use trainer_fsdp::config::{ScorerSpec, TrainableMode};
use trainer_fsdp::{
    FlowGrpo, HeldOutPrompt, LoadedPolicy, LocalWorkers, Override, RecipeName, Run, TrainConfig,
    Trainable, TrainerError, TrainerRng, World,
};
use trajectory::{Conditions, Digest, StoredTensor};
use velocity_model::{TensorConditioning, VelocityModel};

/// Latent tokens.
pub const TOKENS: usize = 4;
/// Latent channels.
pub const CHANNELS: usize = 2;
/// Classes (prompts); the last two are held out.
pub const CLASSES: usize = 8;
/// Held-out classes.
pub const HELD_OUT: usize = 2;
/// The data's std per element.
pub const STD: f32 = 0.5;
/// What the reward wants added to every mean.
pub const SHIFT: f32 = 1.0;
/// The reward component.
pub const COMPONENT: &str = "closeness";

/// The training backend.
pub type Train = Autodiff<Flex>;

/// The Gaussian-world run on one process.
pub type GaussianRun = Run<Train, GaussianWorld, FlowGrpo, LocalWorkers>;

/// The Gaussian-world run under AWM.
pub type AwmRun = Run<Train, GaussianWorld, trainer_fsdp::Awm, LocalWorkers>;

/// Class `c`'s base mean, element `i`: fixed and distinct per class.
fn base_mean(c: usize, i: usize) -> f32 {
    ((c * 7 + i * 3) % 5) as f32 * 0.5 - 1.0
}

/// The velocity model: the exact base velocity with every mean shifted by `delta`.
///
/// (burn's `Module` derive maps a backend parameter named `B` to the inner backend.)
#[derive(Module, Debug)]
pub struct GaussianPolicy<B: Backend> {
    /// The learned shift of the means, `[TOKENS * CHANNELS]`.
    pub delta: Param<Tensor<B, 1>>,
}

impl<Bk: Backend> GaussianPolicy<Bk> {
    /// The base policy: `delta = 0`.
    pub fn base(device: &Bk::Device) -> Self {
        Self {
            delta: Param::from_tensor(Tensor::zeros([TOKENS * CHANNELS], device)),
        }
    }
}

/// The class means `[CLASSES, TOKENS * CHANNELS]`.
fn means<Bk: Backend>(device: &Bk::Device) -> Tensor<Bk, 2> {
    let v: Vec<f32> = (0..CLASSES)
        .flat_map(|c| (0..TOKENS * CHANNELS).map(move |i| base_mean(c, i)))
        .collect();
    Tensor::from_data(TensorData::new(v, [CLASSES, TOKENS * CHANNELS]), device)
}

impl<Bk: Backend> VelocityModel<Bk> for GaussianPolicy<Bk> {
    type Conditioning = TensorConditioning<Bk, 2>;

    fn velocity(
        &self,
        x: Tensor<Bk, 3>,
        sigma: Tensor<Bk, 1>,
        cond: &TensorConditioning<Bk, 2>,
    ) -> Tensor<Bk, 3> {
        let [b, t, c] = x.dims();
        let device = x.device();
        // m = onehot @ means + delta, per row
        let m = cond.0.clone().matmul(means::<Bk>(&device)) + self.delta.val().unsqueeze_dim(0);
        let m = m.reshape([b, t, c]);
        let s = sigma.reshape([b, 1, 1]);
        let one_minus = s.clone().neg().add_scalar(1.0);
        let s2 = STD * STD;
        let var = one_minus.clone().powi_scalar(2).mul_scalar(s2) + s.clone().powi_scalar(2);
        let a = (s - one_minus.clone().mul_scalar(s2)) / var;
        a * (x - one_minus * m.clone()) - m
    }
}

/// One sample: its clean latent, flattened.
#[derive(Debug, Clone)]
pub struct GaussianSample {
    /// `x0`, `[TOKENS * CHANNELS]`.
    pub x0: Vec<f32>,
}

/// The analytic Gaussian world.
#[derive(Debug)]
pub struct GaussianWorld {
    held_out: Vec<HeldOutPrompt>,
    /// Requests a stop at the `n`-th call of `score` (1-based), for the stop tests.
    stop_at_score: Option<(trainer_fsdp::StopFlag, usize)>,
    scores: std::sync::atomic::AtomicUsize,
    /// Requests a stop at the `n`-th call of `restore_conditioning` (1-based): inside the
    /// training phase, whose replays restore the conditionings.
    stop_at_restore: Option<(trainer_fsdp::StopFlag, usize)>,
    restores: std::sync::atomic::AtomicUsize,
    /// Panics at the `n`-th call of `score` (1-based), for the failing-rank test.
    pub panic_at_score: Option<usize>,
    /// The offset the loaded policy starts at (0: the base), for the replica check.
    pub start_offset: f32,
    /// Every sample scores this instead of its closeness (`None`: the closed form), so that
    /// every group's rewards are equal and every rollout's advantages degenerate.
    pub constant_reward: Option<f64>,
}

impl GaussianWorld {
    /// Calls of `restore_conditioning` so far (the training phase's replays).
    pub fn restores(&self) -> usize {
        self.restores.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl GaussianWorld {
    /// The world, checking that the config asks for its closed-form reward.
    ///
    /// # Errors
    /// [`TrainerError::NoWorldReward`] for any other scorer.
    pub fn new(scorers: &[ScorerSpec]) -> Result<Self, TrainerError> {
        for s in scorers {
            match s {
                ScorerSpec::World { components } if components == &[COMPONENT] => {}
                other => {
                    return Err(TrainerError::NoWorldReward {
                        components: other.components(),
                    });
                }
            }
        }
        Ok(Self {
            stop_at_score: None,
            scores: Default::default(),
            stop_at_restore: None,
            restores: Default::default(),
            panic_at_score: None,
            start_offset: 0.0,
            constant_reward: None,
            held_out: (CLASSES - HELD_OUT..CLASSES)
                .map(|c| HeldOutPrompt {
                    prompt: format!("class {c}"),
                    category: if c % 2 == 0 { "even" } else { "odd" }.into(),
                })
                .collect(),
        })
    }
}

fn class_of(prompt: &str) -> Result<usize, TrainerError> {
    prompt
        .strip_prefix("class ")
        .and_then(|c| c.parse::<usize>().ok())
        .filter(|c| *c < CLASSES)
        .ok_or_else(|| TrainerError::PromptVocabulary {
            prompt: prompt.into(),
            problem: "not a class of the Gaussian world".into(),
        })
}

impl<Bk: AutodiffBackend> World<Bk> for GaussianWorld {
    type Cond<Bx: Backend> = TensorConditioning<Bx, 2>;
    type Policy = GaussianPolicy<Bk>;
    type Sample = GaussianSample;

    fn name(&self) -> String {
        "Gaussian world".into()
    }

    fn latent_shape(&self) -> [usize; 2] {
        [TOKENS, CHANNELS]
    }

    fn train_prompts(&self, rng: &mut TrainerRng, n: usize) -> Result<Vec<String>, TrainerError> {
        let mut classes: Vec<usize> = (0..CLASSES - HELD_OUT).collect();
        if n > classes.len() {
            return Err(TrainerError::PromptPoolExhausted {
                requested: n,
                available: classes.len(),
            });
        }
        rng.shuffle(&mut classes);
        Ok(classes[..n].iter().map(|c| format!("class {c}")).collect())
    }

    fn held_out(&self) -> &[HeldOutPrompt] {
        &self.held_out
    }

    fn load_policy(
        &self,
        trainable: &Trainable,
        _seed: u64,
        device: &Bk::Device,
    ) -> Result<LoadedPolicy<GaussianPolicy<Bk>>, TrainerError> {
        assert_eq!(
            trainable,
            &Trainable::Full,
            "the Gaussian policy trains in full"
        );
        let mut model = GaussianPolicy::base(device);
        if self.start_offset != 0.0 {
            model.delta = Param::from_tensor(
                Tensor::zeros([TOKENS * CHANNELS], device).add_scalar(self.start_offset),
            );
        }
        Ok(LoadedPolicy {
            model,
            contract: None,
            weight_hash: Digest::sha256(b"gaussian world base policy"),
        })
    }

    fn encode(
        &self,
        prompts: &[&str],
        device: &Bk::Device,
    ) -> Result<TensorConditioning<Bk::InnerBackend, 2>, TrainerError> {
        let mut v = vec![0.0f32; prompts.len() * CLASSES];
        for (row, p) in prompts.iter().enumerate() {
            v[row * CLASSES + class_of(p)?] = 1.0;
        }
        Ok(TensorConditioning(Tensor::from_data(
            TensorData::new(v, [prompts.len(), CLASSES]),
            device,
        )))
    }

    fn store_conditioning(
        &self,
        cond: &TensorConditioning<Bk::InnerBackend, 2>,
        rows: &[usize],
    ) -> Result<Vec<Conditions>, TrainerError> {
        let v: Vec<f32> = cond
            .0
            .clone()
            .into_data()
            .convert::<f32>()
            .to_vec()
            .unwrap();
        rows.iter()
            .map(|&r| {
                Ok(Conditions {
                    text_embeddings: StoredTensor::from_f32(
                        "conditions.text",
                        &v[r * CLASSES..(r + 1) * CLASSES],
                        vec![1, CLASSES],
                        sde_math::StorageDtype::F32,
                    )?,
                    text_mask: vec![true],
                    extra: BTreeMap::new(),
                })
            })
            .collect()
    }

    fn restore_conditioning<Bx: Backend>(
        &self,
        stored: &Conditions,
        rows: usize,
        device: &Bx::Device,
    ) -> Result<TensorConditioning<Bx, 2>, TrainerError> {
        let n = 1 + self
            .restores
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if let Some((flag, at)) = &self.stop_at_restore
            && n == *at
        {
            flag.request();
        }
        let v = stored.text_embeddings.to_f32();
        Ok(TensorConditioning(
            Tensor::<Bx, 2>::from_data(TensorData::new(v, [1, CLASSES]), device)
                .repeat_dim(0, rows),
        ))
    }

    /// The reference is the exact base model, `delta = 0`.
    fn has_reference(&self, _policy: &GaussianPolicy<Bk>) -> bool {
        true
    }

    fn reference_velocity(
        &self,
        _policy: &GaussianPolicy<Bk>,
        x: Tensor<Bk, 3>,
        sigma: Tensor<Bk, 1>,
        cond: &TensorConditioning<Bk, 2>,
    ) -> Result<Tensor<Bk, 3>, TrainerError> {
        Ok(GaussianPolicy::<Bk>::base(&x.device())
            .velocity(x, sigma, cond)
            .detach())
    }

    fn decode(
        &self,
        latents: Tensor<Bk::InnerBackend, 3>,
    ) -> Result<Vec<GaussianSample>, TrainerError> {
        let [b, t, c] = latents.dims();
        let v: Vec<f32> = latents.into_data().convert::<f32>().to_vec().unwrap();
        Ok((0..b)
            .map(|i| GaussianSample {
                x0: v[i * t * c..(i + 1) * t * c].to_vec(),
            })
            .collect())
    }

    fn score(
        &self,
        samples: &[GaussianSample],
        prompts: &[String],
    ) -> Result<Vec<Components>, TrainerError> {
        let n = 1 + self
            .scores
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if let Some((flag, at)) = &self.stop_at_score
            && n == *at
        {
            flag.request();
        }
        if self.panic_at_score == Some(n) {
            panic!("injected: the world panics at its scoring number {n}");
        }
        samples
            .iter()
            .zip(prompts)
            .map(|(s, p)| {
                let c = class_of(p)?;
                if let Some(r) = self.constant_reward {
                    return Ok(Components::new().with(COMPONENT, r));
                }
                let d = TOKENS * CHANNELS;
                let err = (0..d)
                    .map(|i| {
                        let e = f64::from(s.x0[i]) - f64::from(base_mean(c, i) + SHIFT);
                        e * e
                    })
                    .sum::<f64>()
                    / d as f64;
                Ok(Components::new().with(COMPONENT, -err))
            })
            .collect()
    }

    fn image(&self, _sample: &GaussianSample) -> Option<RgbImage> {
        None
    }
}

/// The Gaussian world's config: the shapes recipe's loop settings on the Gaussian world's
/// scale (6 steps, 4 classes x 4 candidates, full fine-tuning of the offset at a constant lr
/// 0.05), everything written under `root`. The kernel, the noise level and the KL are pinned
/// to the values the tests' thresholds were set with (Flow-SDE eta 1.2, no KL), so that
/// re-tuning the shapes recipe leaves them as they are.
pub fn config(root: &Path, rollouts: u64, extra: &[&str]) -> TrainConfig {
    let dir = |name: &str| root.join(name).display().to_string();
    let mut o = vec![
        format!("run.num_rollouts={rollouts}"),
        "run.seed=3".to_string(),
        "rollout.prompts_per_rollout=4".into(),
        "rollout.group_size=4".into(),
        "rollout.micro_batch_size=4".into(),
        "sampling.num_inference_steps=6".into(),
        "sampling.sde_pool=[1, 2, 3]".into(),
        "sampling.sde_indices=[1, 2]".into(),
        "sampling.num_sde_steps=2".into(),
        "optimizer.lr=0.05".into(),
        "optimizer.lr_scheduler=\"constant\"".into(),
        "optimizer.lr_decay_iters=".into(),
        "sampling.sde_type=\"sde\"".into(),
        "sampling.eta=1.2".into(),
        "algorithm.kl_coef=0.0".into(),
        "reward.scorers=[{ world = { components = [\"closeness\"] } }]".into(),
        "reward.required_components=[\"closeness\"]".into(),
        "reward.component_weights={ closeness = 1.0 }".into(),
        // the shapes recipe's second judge reads pictures, which this world has none of
        "eval.judges=[]".into(),
        "eval.interval=4".into(),
        "eval.samples_per_prompt=16".into(),
        "checkpoint.save_interval=1".into(),
        format!("checkpoint.dir={}", dir("ckpt")),
        format!("artifacts.root={}", dir("artifacts")),
        "monitor.progress=\"never\"".into(),
    ];
    o.extend(extra.iter().map(|s| s.to_string()));
    let mut cfg = TrainConfig::from_recipe(
        RecipeName::ShapesWorldLora,
        &Override::parse_all(&o).unwrap(),
    )
    .unwrap();
    cfg.model.trainable_mode = TrainableMode::Full;
    cfg.model.master_dtype = None;
    cfg.lora = None;
    cfg
}

/// A Gaussian-world run of `config(root, ..)` writing into `root/run`.
pub fn start(root: &Path, rollouts: u64, extra: &[&str]) -> GaussianRun {
    try_start(root, rollouts, extra).unwrap()
}

/// [`start`], returning [`Run::new`]'s error.
pub fn try_start(root: &Path, rollouts: u64, extra: &[&str]) -> Result<GaussianRun, TrainerError> {
    try_start_stopping(root, rollouts, extra, None)
}

/// [`try_start`] with a world that requests a stop on `stop.0` at its `stop.1`-th scoring
/// (1-based; rollouts and evaluations both score).
pub fn try_start_stopping(
    root: &Path,
    rollouts: u64,
    extra: &[&str],
    stop: Option<(trainer_fsdp::StopFlag, usize)>,
) -> Result<GaussianRun, TrainerError> {
    let cfg = config(root, rollouts, extra);
    let pre = cfg.preflight().unwrap();
    let mut world = GaussianWorld::new(&cfg.reward.scorers).unwrap();
    world.stop_at_score = stop;
    build(cfg, pre, root, world)
}

/// [`try_start`] with a world that requests a stop on `stop.0` at its `stop.1`-th restored
/// conditioning (1-based), i.e. inside a training phase.
pub fn try_start_stopping_in_training(
    root: &Path,
    rollouts: u64,
    extra: &[&str],
    stop: (trainer_fsdp::StopFlag, usize),
) -> Result<GaussianRun, TrainerError> {
    let cfg = config(root, rollouts, extra);
    let pre = cfg.preflight().unwrap();
    let mut world = GaussianWorld::new(&cfg.reward.scorers).unwrap();
    world.stop_at_restore = Some(stop);
    build(cfg, pre, root, world)
}

/// [`try_start`] with a world whose every sample scores `reward`: every group's advantages
/// are 0 and every rollout is degenerate.
pub fn start_scoring_alike(root: &Path, rollouts: u64, extra: &[&str], reward: f64) -> GaussianRun {
    let cfg = config(root, rollouts, extra);
    let pre = cfg.preflight().unwrap();
    let mut world = GaussianWorld::new(&cfg.reward.scorers).unwrap();
    world.constant_reward = Some(reward);
    build(cfg, pre, root, world).unwrap()
}

/// [`try_start`] writing its run files into `run_dir` instead of `root/run` (checkpoints and
/// artifacts still under `root`).
pub fn try_start_in(
    root: &Path,
    run_dir: &Path,
    rollouts: u64,
    extra: &[&str],
) -> Result<GaussianRun, TrainerError> {
    let cfg = config(root, rollouts, extra);
    let pre = cfg.preflight().unwrap();
    let world = GaussianWorld::new(&cfg.reward.scorers).unwrap();
    build_in(cfg, pre, run_dir, world)
}

fn build(
    cfg: TrainConfig,
    pre: trainer_fsdp::Preflight,
    root: &Path,
    world: GaussianWorld,
) -> Result<GaussianRun, TrainerError> {
    build_in(cfg, pre, &root.join("run"), world)
}

fn build_in(
    cfg: TrainConfig,
    pre: trainer_fsdp::Preflight,
    run_dir: &Path,
    world: GaussianWorld,
) -> Result<GaussianRun, TrainerError> {
    let algorithm = <FlowGrpo as trainer_fsdp::dispatch::FromPlan>::from_plan(&pre.algorithm)
        .expect("a FlowGRPO or DPOK plan");
    let workers = LocalWorkers::new(cfg.run.threads());
    Run::new(
        cfg,
        pre,
        run_dir,
        Default::default(),
        world,
        algorithm,
        workers,
    )
}

/// A run of `config(root, ..)` with the main example's `--algorithm name` preset
/// ([`trainer_fsdp::config::algorithm_overrides`]), then `extra`, writing into `root/run`.
pub fn start_with<A>(
    root: &Path,
    rollouts: u64,
    name: &str,
    extra: &[&str],
) -> Run<Train, GaussianWorld, A, LocalWorkers>
where
    A: trainer_fsdp::Algorithm<Train, GaussianWorld> + trainer_fsdp::dispatch::FromPlan,
{
    let mut cfg = config(root, rollouts, &[]);
    let mut o = trainer_fsdp::config::algorithm_overrides(name).unwrap();
    o.extend(Override::parse_all(extra).unwrap());
    cfg = cfg.with_overrides(&o).unwrap();
    let pre = cfg.preflight().unwrap();
    let algorithm = A::from_plan(&pre.algorithm).expect("the preset's plan");
    let world = GaussianWorld::new(&cfg.reward.scorers).unwrap();
    let workers = LocalWorkers::new(cfg.run.threads());
    Run::new(
        cfg,
        pre,
        &root.join("run"),
        Default::default(),
        world,
        algorithm,
        workers,
    )
    .unwrap()
}

/// An AWM run with its defaults, then `extra` (see [`start_with`]).
pub fn start_awm(root: &Path, rollouts: u64, extra: &[&str]) -> AwmRun {
    start_with(root, rollouts, "awm", extra)
}

/// The Gaussian-world run under DiffusionNFT.
pub type NftRun = Run<Train, GaussianWorld, trainer_fsdp::Nft, LocalWorkers>;

/// A DiffusionNFT run with its defaults and `sampling.eta = 0`, then `extra`.
pub fn start_nft(root: &Path, rollouts: u64, extra: &[&str]) -> NftRun {
    start_with(root, rollouts, "nft", extra)
}

/// The Gaussian-world run under online DPO.
pub type DpoRun = Run<Train, GaussianWorld, trainer_fsdp::Dpo, LocalWorkers>;

/// An online-DPO run with its defaults and `sampling.eta = 0`, then `extra`.
pub fn start_dpo(root: &Path, rollouts: u64, extra: &[&str]) -> DpoRun {
    start_with(root, rollouts, "dpo", extra)
}

/// The Gaussian-world run under RAFT.
pub type RaftRun = Run<Train, GaussianWorld, trainer_fsdp::Raft, LocalWorkers>;

/// A RAFT run with the `raft` preset (`sampling.eta = 0`), then `extra`.
pub fn start_raft(root: &Path, rollouts: u64, extra: &[&str]) -> RaftRun {
    start_with(root, rollouts, "raft", extra)
}

/// The Gaussian-world run under paired finite differences.
pub type FdfoRun = Run<Train, GaussianWorld, trainer_fsdp::Fdfo, LocalWorkers>;

/// An FDFO run with the `fdfo` preset, then `extra`.
pub fn start_fdfo(root: &Path, rollouts: u64, extra: &[&str]) -> FdfoRun {
    start_with(root, rollouts, "fdfo", extra)
}

/// The Gaussian-world run under GRPO-Guard.
pub type GuardRun = Run<Train, GaussianWorld, trainer_fsdp::GrpoGuard, LocalWorkers>;

/// A GRPO-Guard run with its defaults, then `extra`.
pub fn start_guard(root: &Path, rollouts: u64, extra: &[&str]) -> GuardRun {
    start_with(root, rollouts, "grpo_guard", extra)
}

/// The offset of a run's EMA copy (`[ema]`).
pub fn ema_delta<A: trainer_fsdp::Algorithm<Train, GaussianWorld>>(
    run: &Run<Train, GaussianWorld, A, LocalWorkers>,
) -> Vec<f32> {
    burn::module::AutodiffModule::<Train>::valid(run.ema_model().expect("an EMA"))
        .delta
        .val()
        .into_data()
        .to_vec::<f32>()
        .unwrap()
}

/// The learned offset of a run's policy.
pub fn delta<A: trainer_fsdp::Algorithm<Train, GaussianWorld>, K: trainer_fsdp::Workers>(
    run: &Run<Train, GaussianWorld, A, K>,
) -> Vec<f32> {
    burn::module::AutodiffModule::<Train>::valid(run.model())
        .delta
        .val()
        .into_data()
        .to_vec::<f32>()
        .unwrap()
}

/// A FlowGRPO run of `config(root, ..)` on `ranks` ranks of this process (CPU peers on burn's
/// collective runtime, one host thread each), writing into `root/run`; with `panic = (r, n)`
/// rank `r`'s world panics at its `n`-th scoring. Returns the IO rank's summary and every
/// rank's final offset.
pub fn run_ranks(
    root: &Path,
    rollouts: u64,
    extra: &[&str],
    ranks: usize,
    panic: Option<(usize, usize)>,
) -> Result<(trainer_fsdp::RunSummary, Vec<Vec<f32>>), TrainerError> {
    run_ranks_on(root, rollouts, extra, ranks, panic, None)
}

/// [`run_ranks`] on this machine's `local` ranks of a run over several machines (`node`), or
/// on one machine (`node` `None`).
pub fn run_ranks_on(
    root: &Path,
    rollouts: u64,
    extra: &[&str],
    local: usize,
    panic: Option<(usize, usize)>,
    node: Option<&trainer_fsdp::NodeSetup>,
) -> Result<(trainer_fsdp::RunSummary, Vec<Vec<f32>>), TrainerError> {
    use trainer_fsdp::Workers;
    let cfg = config(root, rollouts, extra);
    let ranks = local * node.map_or(1, |n| n.nodes);
    let pre = cfg.preflight().unwrap().for_ranks(ranks)?;
    let devices = vec![Default::default(); local];
    let out = trainer_fsdp::ranks::launch_ranks::<Flex, _, _>(&devices, 1, node, |workers| {
        let mut world = GaussianWorld::new(&cfg.reward.scorers).unwrap();
        if let Some((r, at)) = panic
            && r == workers.rank()
        {
            world.panic_at_score = Some(at);
        }
        // `panic = (r, 0)`: rank r's policy starts apart instead
        if let Some((r, 0)) = panic
            && r == workers.rank()
        {
            world.panic_at_score = None;
            world.start_offset = 0.25;
        }
        let algorithm = <FlowGrpo as trainer_fsdp::dispatch::FromPlan>::from_plan(&pre.algorithm)
            .expect("a FlowGRPO plan");
        let mut run = trainer_fsdp::ranks::start_rank(
            cfg.clone(),
            pre.clone(),
            &root.join("run"),
            Default::default(),
            world,
            algorithm,
            workers,
        )?;
        let summary = run.run(&trainer_fsdp::StopFlag::new())?;
        Ok((summary, delta(&run)))
    })?;
    let summary = out[0].0.clone();
    Ok((summary, out.into_iter().map(|(_, d)| d).collect()))
}
