//! End to end on a tiny burn model: roll out with Flow-SDE, store the groups as sidecars, read
//! them back, replay with the same model (ratio exactly 1, clipped loss exactly 0 with
//! group-centred advantages), take one AdamW step, and watch the ratio move and the 1e-4 clip
//! engage on the second update.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::{Tensor, TensorData, backend::Backend};
use flow_grpo::{
    AdvantageConfig, AnchorRecorder, ClipRange, PolicyAnchor, ReplayStep, ReplayedSteps,
    RewardComponent, RewardGroup, StdEstimator, StdMode, compute_advantages, grpo_clip_loss,
    log_prob_parity, plan_updates, replay_log_probs,
};
use sde_math::{Kernel, StepSigmas, StorageDtype, euler_step};
use trajectory::{
    ArtifactLayout, Candidate, Common, Conditions, Digest, Retention, Split, StoredTensor, Tracks,
    Trajectory, read_sidecar, sampling_fingerprint, write_sidecar,
};

type AD = Autodiff<Flex>;
type Dev = <AD as burn::tensor::backend::BackendTypes>::Device;

const TOKENS: usize = 4;
const CHANNELS: usize = 4;
const GROUP: usize = 4;
const GROUPS: usize = 2;
const STORAGE: StorageDtype = StorageDtype::Bf16;

/// A velocity model small enough for a unit test: per token, `[x, sigma] -> tanh -> v`.
#[derive(Module, Debug)]
struct TinyVelocity<B: Backend> {
    hidden: Linear<B>,
    out: Linear<B>,
}

impl<B: Backend> TinyVelocity<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            hidden: LinearConfig::new(CHANNELS + 1, 16).init(device),
            out: LinearConfig::new(16, CHANNELS).init(device),
        }
    }

    /// `x`: `[batch, tokens, channels]`.
    fn forward(&self, x: Tensor<B, 3>, sigma: f32) -> Tensor<B, 3> {
        let [n, t, _] = x.dims();
        let s = Tensor::<B, 3>::full([n, t, 1], sigma, &x.device());
        self.out
            .forward(self.hidden.forward(Tensor::cat(vec![x, s], 2)).tanh())
    }
}

/// Seeded host normals (Box-Muller over SplitMix64).
fn normals<B: Backend>(seed: u64, shape: [usize; 3], dev: &B::Device) -> Tensor<B, 3> {
    let mut rng = keyed_rng::SplitMix64::new(seed);
    let mut next = || rng.unit_f64() + 1e-12;
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|_| ((-2.0 * next().ln()).sqrt() * (std::f64::consts::TAU * next()).cos()) as f32)
        .collect();
    Tensor::from_data(TensorData::new(v, shape), dev)
}

fn sigmas() -> Vec<f32> {
    vec![1.0, 0.85, 0.7, 0.55, 0.4, 0.25, 0.0]
}

const SDE_INDICES: [usize; 3] = [1, 2, 4];

/// Rolls out one group; returns the trajectory and each candidate's final latent mean.
fn rollout(
    model: &TinyVelocity<AD>,
    kernel: &Kernel,
    group: u64,
    dev: &Dev,
) -> (Trajectory, Vec<f32>) {
    let sig = sigmas();
    let shape = [GROUP, TOKENS, CHANNELS];
    let mut common = Common {
        task: "t2i".into(),
        rollout_id: 0,
        group_index: group,
        height: 16,
        width: 16,
        sigmas: sig.clone(),
        sde_indices: SDE_INDICES.to_vec(),
        storage: STORAGE,
        sampling_fingerprint: sampling_fingerprint(&BTreeMap::from([("eta", 0.7)]), &sig).unwrap(),
        weight_manifest_hash: Digest::sha256(b"tiny velocity, policy version 0"),
        candidates: (0..GROUP)
            .map(|slot| Candidate {
                sample_id: format!("prompt:{group}:sample:{slot}"),
                sample_index: group * GROUP as u64 + slot as u64,
                policy_version: 0,
                seed_hash: 1000 * group + slot as u64,
            })
            .collect(),
    };
    let latent_steps: BTreeSet<usize> = common.latent_steps().into_iter().collect();
    let mut x = STORAGE.round_trip(normals::<AD>(group, shape, dev));
    let mut latents = Vec::new();
    let mut log_probs = Vec::new();
    for k in 0..sig.len() - 1 {
        if latent_steps.contains(&k) {
            latents.push(x.clone());
        }
        let at = StepSigmas::from_schedule(&sig, k).unwrap().into();
        let v = model.forward(x.clone(), sig[k]);
        x = if SDE_INDICES.contains(&k) {
            let noise = normals::<AD>(100 * group + k as u64 + 1, shape, dev);
            let t = kernel.sample(&at, v, x, noise, STORAGE).unwrap();
            log_probs.push(t.log_prob);
            t.prev_sample
        } else {
            STORAGE.round_trip(euler_step(&at, v, x).unwrap())
        };
    }
    if latent_steps.contains(&(sig.len() - 1)) {
        latents.push(x.clone());
    }
    let final_means: Vec<f32> = x
        .mean_dim(2)
        .mean_dim(1)
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    common.candidates.truncate(GROUP);
    let traj = Trajectory {
        common,
        conditions: Conditions {
            text_embeddings: StoredTensor::from_f32("text", &[0.0, 1.0], vec![1, 2], STORAGE)
                .unwrap(),
            text_mask: vec![true],
            extra: BTreeMap::new(),
        },
        tracks: Tracks::from_rollout(&latents, &log_probs, STORAGE).unwrap(),
    };
    (traj, final_means)
}

/// Replays every trained step of `slots` of a stored group under `model`.
fn replay(
    model: &TinyVelocity<AD>,
    kernel: &Kernel,
    traj: &Trajectory,
    slots: Range<usize>,
    dev: &Dev,
) -> ReplayedSteps<AD, 3> {
    let steps = (0..traj.num_trained_steps())
        .map(|s| {
            let inp = traj.replay_inputs::<AD, 3>(s, slots.clone(), dev).unwrap();
            let v = model.forward(inp.sample.clone(), inp.sigmas.sigma());
            ReplayStep {
                sigmas: inp.sigmas.into(),
                sample: inp.sample,
                prev_sample: inp.prev_sample,
                model_output: v,
            }
        })
        .collect();
    replay_log_probs(kernel, traj.common.storage, steps).unwrap()
}

#[test]
fn on_policy_ratio_is_one_then_moves_after_one_step() {
    let dev = Default::default();
    AD::seed(&dev, 20);
    let mut model = TinyVelocity::<AD>::new(&dev);
    let kernel = Kernel::flow_sde(0.7).unwrap();

    // Rollout, then sidecars on disk and back.
    let dir = tempfile::tempdir().unwrap();
    let layout = ArtifactLayout::new(dir.path(), "t2i").unwrap();
    layout
        .begin_rollout(Split::Train, 0, Retention::keep_last(2))
        .unwrap();
    let mut groups = Vec::new();
    let mut rewards = Vec::new();
    for g in 0..GROUPS as u64 {
        let (traj, means) = rollout(&model, &kernel, g, &dev);
        let path = layout.sidecar_path(Split::Train, 0, g);
        write_sidecar(&path, &traj).unwrap();
        groups.push(read_sidecar(&path).unwrap());
        // a rule-based reward: 1 for the two candidates with the largest mean, else 0
        let mut order: Vec<usize> = (0..GROUP).collect();
        order.sort_by(|&a, &b| means[b].total_cmp(&means[a]));
        let samples = (0..GROUP)
            .map(|i| {
                let r = if order[..GROUP / 2].contains(&i) {
                    1.0
                } else {
                    0.0
                };
                BTreeMap::from([("top_half".to_string(), r)])
            })
            .collect();
        rewards.push(RewardGroup {
            prompt_key: format!("prompt {g}"),
            samples,
        });
    }
    assert_eq!(groups.len(), GROUPS);

    // Group-centred advantages: rewards {0, 0, 1, 1} -> exactly -1 / +1.
    let adv_cfg = AdvantageConfig {
        std_mode: StdMode::Group,
        std_estimator: StdEstimator::Population,
        std_epsilon: 0.0,
        components: vec![RewardComponent::required("top_half", 1.0)],
        clip: Some(5.0),
        filter_zero_std_groups: true,
        degenerate_variance: 1e-6,
    };
    let adv = compute_advantages(&adv_cfg, &rewards, None).unwrap();
    assert!(
        adv.values.iter().all(|a| *a == 1.0 || *a == -1.0),
        "{:?}",
        adv.values
    );
    assert!(!adv.degenerate);

    // Two disjoint updates of one group each; the anchor is recorded before any step.
    let plan = plan_updates(GROUPS * GROUP, 2, GROUP).unwrap();
    assert!(plan.warnings.is_empty());
    let mut recorder = AnchorRecorder::new(&plan);
    for mb in plan.micro_batches() {
        let g = mb.start / GROUP;
        let slots = mb.start % GROUP..mb.start % GROUP + mb.len();
        recorder
            .record(
                mb.clone(),
                replay(&model, &kernel, &groups[g], slots, &dev).log_probs,
            )
            .unwrap();
    }
    let anchor = recorder.freeze().unwrap();

    // The replay of the unchanged policy is the engine's own log-prob, bit for bit.
    let rollout_lp: Vec<f32> = groups
        .iter()
        .flat_map(|t| t.tracks.log_probs.clone())
        .collect();
    let engine =
        PolicyAnchor::from_rollout(&rollout_lp, GROUPS * GROUP, SDE_INDICES.len()).unwrap();
    let parity = log_prob_parity(
        anchor.log_probs::<AD>(0..8, &dev).unwrap(),
        engine.log_probs::<AD>(0..8, &dev).unwrap(),
    )
    .unwrap();
    assert_eq!(parity.bitwise_equal_fraction, 1.0, "{parity:?}");

    let clip = ClipRange::symmetric(1e-4).unwrap();
    let mut optim = AdamWConfig::new()
        .with_weight_decay(0.0)
        .init::<AD, TinyVelocity<AD>>();
    let mut diagnostics = Vec::new();
    for update in &plan.updates {
        let g = update.samples.start / GROUP;
        let idx: Vec<usize> = update.samples.clone().collect();
        let lp = replay(&model, &kernel, &groups[g], 0..GROUP, &dev);
        let out = grpo_clip_loss(
            lp.log_probs,
            anchor
                .log_probs::<AD>(update.samples.clone(), &dev)
                .unwrap(),
            adv.tensor::<AD>(&idx, &dev),
            clip,
        )
        .unwrap();
        let loss = out.loss.clone().into_data().to_vec::<f32>().unwrap()[0];
        diagnostics.push((out.diagnostics, loss));
        let grads = GradientsParams::from_grads(out.loss.backward(), &model);
        model = optim.step(1e-2, model, grads);
    }

    // First update: the policy has not moved yet.
    let (first, first_loss) = diagnostics[0];
    assert_eq!(first.ratio_min, 1.0);
    assert_eq!(first.ratio_max, 1.0);
    assert_eq!(first.clip_fraction, 0.0);
    assert_eq!(first_loss, 0.0, "ratio 1 with group-centred advantages");
    // Second update: one AdamW step later, the ratio moves and the 1e-4 band clips.
    let (second, second_loss) = diagnostics[1];
    assert!(
        second.ratio_min < 1.0 || second.ratio_max > 1.0,
        "{second:?}"
    );
    assert!(second.clip_fraction > 0.0, "{second:?}");
    assert!(second.approx_kl > 0.0);
    assert_ne!(second_loss, 0.0);
}
