//! The named recipes: seed 002's validated Qwen-Image runs and the embedded default, the
//! latter derived from the former.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::*;

impl TrainConfig {
    /// Seed 002's validated Qwen-Image T2I LoRA run
    /// (`scripts/training/diffusion/run-qwen-image-t2i-lora-8xgpu.sh`, "Reference
    /// configuration — Validated LoRA recipe"; a completed 100-rollout run, final eval 0.8643
    /// vs the baseline's 0.8620):
    ///
    /// * 32 prompts x 8 candidates = 256 samples per rollout, 2 disjoint updates of 128,
    ///   micro-batch 1; rollout and generation seed 42; eval every 10 rollouts, 2 samples per
    ///   eval prompt;
    /// * 384x384, 12 steps, guidance 1.0, eta 0.7, `sde`, 3 trained steps redrawn per rollout
    ///   from the pool `[1, 2, 3, 4, 5]`, `sde_indices [3, 4, 5]` as the trained-step plan's
    ///   evaluation fallback: the held-out evaluation takes the SDE's transitions there and the
    ///   solver elsewhere (`eval.sampling = "sde"`, as the seed's does);
    /// * LoRA rank 64, alpha 128, dropout 0, the adapter's eight attention projections,
    ///   fp32 masters; bf16 frozen weights (`param_dtype`, the seed's `--fsdp-param-dtype`);
    /// * eps_clip `1e-4`, std mode `group`, lr `3e-4`, no warmup, constant schedule, adam eps
    ///   `1e-8`, weight decay 0; `--clip-grad` and the Adam betas are not set by the script and
    ///   keep the shared flags' defaults (1.0; 0.9 / 0.999); no KL;
    /// * PickScore required with weight 1.0;
    /// * save every 20 rollouts, keep 10; artifact retention 2 (the flag's default).
    ///
    /// Paths are relative to the working directory (`runs/qwen-image-t2i-lora/...`). The
    /// prompts are the user's: set `data.train` and `data.eval` (JSONL in seed 002's schema);
    /// the Qwen-Image world refuses to load without them.
    pub fn qwen_image_t2i_lora() -> Self {
        let run_dir = PathBuf::from("runs").join("qwen-image-t2i-lora");
        Self {
            recipe: Some(RecipeName::QwenImageT2iLora),
            run: RunSection {
                task: "t2i".into(),
                seed: 42,
                num_rollouts: 100,
                host_threads: None,
                cpu_budget_seconds: None,
            },
            model: ModelSection {
                generator: GeneratorSource::QwenImage {
                    model_path: PathBuf::from("models").join("Qwen-Image"),
                    variant: None,
                },
                trainable_mode: TrainableMode::Lora,
                master_dtype: Some(MasterDtype::Fp32),
                param_dtype: Some(ParamDtype::Bf16),
            },
            lora: Some(LoraSection {
                rank: 64,
                alpha: 128.0,
                dropout: 0.0,
                target_modules: None,
                use_rslora: false,
                init_from: None,
                init_dropout: InitDropout::Refuse,
            }),
            sampling: SamplingSection {
                scheduler: SchedulerSource::QwenImage,
                schedule_compat: ScheduleCompat::Current,
                height: 384,
                width: 384,
                num_inference_steps: 12,
                guidance_scale: 1.0,
                eta: 0.7,
                sde_type: SdeKind::FlowSde,
                solver: SolverKind::Euler,
                storage_dtype: StorageKind::Bf16,
                sde_resample_per_rollout: true,
                sde_pool: Some(vec![1, 2, 3, 4, 5]),
                sde_indices: Some(vec![3, 4, 5]),
                num_sde_steps: 3,
                sde_timestep_fraction: None,
                sde_window: None,
            },
            rollout: RolloutSection {
                prompts_per_rollout: 32,
                group_size: 8,
                num_updates_per_batch: 2,
                micro_batch_size: 1,
                shared_initial_noise: false,
            },
            algorithm: AlgorithmSection::FlowGrpo(FlowGrpoSection {
                eps_clip: 1e-4,
                eps_clip_high: None,
                advantage_std_mode: AdvantageStdMode::Group,
                kl_coef: 0.0,
                anchor: AnchorSource::Replay,
                timestep_fraction: None,
            }),
            optimizer: OptimizerSection {
                lr: 3e-4,
                weight_decay: 0.0,
                adam_beta1: 0.9,
                adam_beta2: 0.999,
                adam_eps: 1e-8,
                clip_grad: 1.0,
                lr_warmup_iters: 0,
                lr_scheduler: LrSchedulerKind::Constant,
                min_lr: 0.0,
                lr_decay_iters: None,
            },
            reward: RewardSection {
                scorers: vec![ScorerSpec::Pickscore {
                    model_path: PathBuf::from("models").join("PickScore_v1"),
                }],
                required_components: vec!["pickscore".into()],
                component_weights: BTreeMap::from([("pickscore".into(), 1.0)]),
            },
            checkpoint: CheckpointSection {
                dir: run_dir.join("checkpoints"),
                save_interval: 20,
                max_to_keep: Some(10),
                resume: false,
                allow_fresh: false,
                resume_from: None,
                allow_config_changes: false,
                overwrite: false,
                on_failure: CheckpointFailurePolicy::Retry,
            },
            artifacts: ArtifactSection {
                root: run_dir.join("artifacts"),
                retention_rollouts: 2,
            },
            eval: EvalSection {
                interval: 10,
                samples_per_prompt: 2,
                num_inference_steps: None,
                guidance: None,
                sampling: EvalSampling::Sde,
                judges: Vec::new(),
                sde_gap: false,
            },
            ema: None,
            monitor: MonitorSection::default(),
            data: DataSection::default(),
        }
    }

    /// Seed 002's full fine-tune reference (`run-qwen-image-t2i-8xgpu.sh`, "Full fine-tune
    /// reference"; it has not reproduced the reference curve, so prefer the LoRA recipe). It
    /// differs from [`TrainConfig::qwen_image_t2i_lora`] in: trainable mode `full` with no
    /// master dtype and no LoRA; 8 prompts x 8 candidates, micro-batch 2; `sde_indices
    /// [1, 3, 5]` (same pool and resample); lr `3e-5` with 20 warmup steps and adam eps
    /// `1e-15`; keep 2 checkpoints.
    pub fn qwen_image_t2i_full() -> Self {
        let mut c = Self::qwen_image_t2i_lora();
        let run_dir = PathBuf::from("runs").join("qwen-image-t2i-full");
        c.recipe = Some(RecipeName::QwenImageT2iFull);
        c.model = ModelSection {
            generator: c.model.generator.clone(),
            trainable_mode: TrainableMode::Full,
            master_dtype: None,
            param_dtype: c.model.param_dtype,
        };
        c.lora = None;
        c.sampling.sde_indices = Some(vec![1, 3, 5]);
        c.rollout.prompts_per_rollout = 8;
        c.rollout.micro_batch_size = 2;
        c.optimizer.lr = 3e-5;
        c.optimizer.lr_warmup_iters = 20;
        c.optimizer.adam_eps = 1e-15;
        c.checkpoint.dir = run_dir.join("checkpoints");
        c.checkpoint.max_to_keep = Some(2);
        c.artifacts.root = run_dir.join("artifacts");
        c
    }

    /// The embedded default: seed 002's validated recipe shape on the shapes world
    /// ([`GeneratorSource::ShapesWorld`], `fixtures/shapes_world_v3`: a base taught to draw the
    /// asked scenes on true captions, then misaligned by corrupted ones, so that guidance
    /// recovers what its unguided samples miss), scaled to run in minutes on two CPU cores:
    ///
    /// * 32x32 images, 12 steps of the Qwen-Image schedule, guidance 1.0, 3 trained steps
    ///   redrawn per rollout from an early pool — as in the seed; the plan keeps the seed's
    ///   evaluation fallback `[3, 4, 5]`, which this recipe's evaluation does not read (below);
    /// * the trained steps' noise is coefficients-preserving sampling (CPS, `sde_type = "cps"`,
    ///   noise level 0.7: the step's noise `sigma_next * sin(0.7 pi / 2)`), which, unlike
    ///   Flow-SDE's `sqrt(sigma / (1 - sigma))`, is finite at `sigma = 1`, so the pool is
    ///   `[0, 1, 2, 3, 4]`: the first step, where a deterministic sample's layout and colours
    ///   are largely decided, is trained too; a KL of 0.04 to the reference (the adapters
    ///   off), as flow_grpo's GenEval recipe;
    /// * group size 8, 2 disjoint updates per rollout, eps_clip `1e-4`, std mode `group`,
    ///   LoRA dropout 0, no CFG — as in the seed;
    /// * scaled: 8 prompts per rollout (64 samples, updates of 32, micro-batches of 16 — one
    ///   per core), LoRA rank 8 / alpha 16 on the eight attention projections, 200 rollouts,
    ///   lr `1e-3` decaying along a cosine to 0 over the run's 400 optimizer steps
    ///   (`optimizer.lr_decay_iters`: set it beside another `run.num_rollouts`; a run that
    ///   ends before its decay does says so, [`crate::RunSummary::unfinished_decay`]); the held-out
    ///   evaluation (24 prompts x 48 seeds, a standard error below 0.01) at the start and the
    ///   end, sampled deterministically (`eval.sampling = "ode"`), with the re-rendering
    ///   judge beside the reward's;
    /// * reward: the `shapes` composition score, required, weight 1;
    /// * fp32 weights (the shapes world implements no `param_dtype`).
    ///
    /// On this base Flow-SDE on the pool `[1..5]` (the recipe until 2026-12-07) gains less
    /// (`docs/SEEDS.md`, "The default on the third base: how it was chosen"). At a constant
    /// 2e-3 the previous base's run peaked near rollout 80 and then decayed into striped
    /// texture that the second judge marks down; the cosine from 1e-3 holds the gain.
    pub fn shapes_world_lora() -> Self {
        let mut c = Self::qwen_image_t2i_lora();
        let run_dir = PathBuf::from("runs").join("shapes-world-lora");
        c.recipe = Some(RecipeName::ShapesWorldLora);
        c.run.seed = 0;
        c.run.num_rollouts = 200;
        c.model.generator = GeneratorSource::ShapesWorld {
            dir: PathBuf::from("fixtures").join("shapes_world_v3"),
        };
        c.model.param_dtype = None;
        let lora = c
            .lora
            .as_mut()
            .expect("the LoRA recipe has a [lora] section");
        lora.rank = 8;
        lora.alpha = 16.0;
        c.sampling.height = 32;
        c.sampling.width = 32;
        c.sampling.eta = 0.7;
        c.sampling.sde_type = SdeKind::Cps;
        c.sampling.sde_pool = Some(vec![0, 1, 2, 3, 4]);
        c.rollout.prompts_per_rollout = 8;
        c.rollout.micro_batch_size = 16;
        let AlgorithmSection::FlowGrpo(algorithm) = &mut c.algorithm else {
            unreachable!("the LoRA recipe trains with FlowGRPO")
        };
        algorithm.kl_coef = 0.04;
        c.optimizer.lr = 1e-3;
        c.optimizer.lr_scheduler = LrSchedulerKind::Cosine;
        c.optimizer.lr_decay_iters = Some(400);
        c.reward = RewardSection {
            scorers: vec![ScorerSpec::Shapes],
            required_components: vec!["shapes".into()],
            component_weights: BTreeMap::from([("shapes".into(), 1.0)]),
        };
        c.checkpoint = CheckpointSection {
            dir: run_dir.join("checkpoints"),
            save_interval: 4,
            max_to_keep: Some(3),
            ..c.checkpoint
        };
        c.artifacts.root = run_dir.join("artifacts");
        c.eval = EvalSection {
            interval: 200,
            samples_per_prompt: 48,
            num_inference_steps: None,
            guidance: None,
            sampling: EvalSampling::Ode,
            judges: vec![ScorerSpec::ShapesRerender],
            sde_gap: false,
        };
        c
    }
}
