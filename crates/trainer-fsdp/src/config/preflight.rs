//! Preflight validation: everything that can be checked before a model is loaded, every
//! problem reported at once, and the typed products the loop runs with.

use std::fmt;

use super::*;

impl TrainConfig {
    /// Preflight validation (seed 002, "Preflight validation"): checks everything that can be
    /// checked before any model is loaded and reports **every** violation at once, each naming
    /// the value given and what is allowed. On success returns the typed products the loop
    /// runs with, and the warnings.
    ///
    /// Errors: unknown task; trainable mode vs LoRA rank; LoRA dropout != 0 and other invalid
    /// LoRA settings; a trained SDE step 0 under Flow-SDE on any route (through the schedule
    /// crate's validation) and every other trained-step problem; guidance scale != 1 (the
    /// replay is a single positive-conditioned forward); a non-positive eta; required reward
    /// components without weights, or no required component; a group size below 2; a rollout
    /// batch (`prompts x group`) not divisible by `num_updates_per_batch`, or an update chunk
    /// not divisible by `micro_batch_size`; clip ranges, `clip_grad`, the learning-rate
    /// schedule and AdamW's hyperparameters out of range; a nonzero KL coefficient (not
    /// supported yet); zero save interval or `max_to_keep`.
    ///
    /// Warnings: `num_updates_per_batch = 1` (the loss is 0 by construction); LoRA without fp32
    /// masters; unbounded artifact retention;
    /// a trainable last step; evaluation switched off.
    ///
    /// # Errors
    /// [`TrainerError::Preflight`] with every problem.
    pub fn preflight(&self) -> Result<Preflight, TrainerError> {
        let mut p: Vec<PreflightProblem> = Vec::new();
        let mut warnings: Vec<PreflightWarning> = Vec::new();

        // task
        if !GENERATION_TASKS.contains(&self.run.task.as_str()) {
            p.push(PreflightProblem::UnknownTask {
                given: self.run.task.clone(),
            });
        }

        // trainable mode, LoRA
        let trainable = self.check_trainable(&mut p, &mut warnings);

        if self.run.host_threads == Some(0) {
            p.push(PreflightProblem::OutOfRange {
                key: "run.host_threads",
                given: "0".into(),
                allowed: "at least 1, or unset for the machine's cores",
            });
        }

        // sampling
        let s = &self.sampling;
        if s.guidance_scale != 1.0 {
            p.push(PreflightProblem::GuidanceWithSingleForwardReplay {
                given: s.guidance_scale,
            });
        }
        let ode_rollouts = self.algorithm.ode_rollouts();
        let stochastic_eta = s.eta.is_finite() && s.eta > 0.0;
        if ode_rollouts && s.eta != 0.0 {
            p.push(PreflightProblem::OutOfRange {
                key: "sampling.eta",
                given: s.eta.to_string(),
                allowed: "0 with algorithm.kind = \"nft\", \"dpo\" or \"raft\" (their rollouts are deterministic: every step \
                          runs sampling.solver, and the trained steps are their training timesteps)",
            });
        } else if !ode_rollouts && !stochastic_eta {
            p.push(PreflightProblem::OutOfRange {
                key: "sampling.eta",
                given: s.eta.to_string(),
                allowed: "a finite value > 0 (the trained steps need a stochastic transition)",
            });
        }
        let sde = s.sde_type.sde_type();
        if ode_rollouts && s.sde_type != SdeKind::FlowSde {
            p.push(PreflightProblem::OutOfRange {
                key: "sampling.sde_type",
                given: match s.sde_type {
                    SdeKind::FlowSde => "\"sde\"",
                    SdeKind::Dance => "\"dance\"",
                    SdeKind::Cps => "\"cps\"",
                    SdeKind::Churn => "\"churn\"",
                }
                .into(),
                allowed: "\"sde\" (the recipes' value) with algorithm.kind = \"nft\", \"dpo\" or \"raft\": their \
                          rollouts are deterministic and take no SDE",
            });
        }
        if s.sde_window.is_none() {
            self.check_unused_step_keys(&mut p);
        }
        // the sampling schedule policy at `steps` (the rollouts', and the evaluations' own)
        let schedule_at = |steps: usize| {
            s.schedule_policy()
                .and_then(|policy| policy.sample_sigmas(s.height, s.width, steps))
        };
        let mut schedule_and_plan = None;
        match schedule_at(s.num_inference_steps) {
            Err(e) => p.push(PreflightProblem::Schedule { source: e }),
            Ok(schedule) => {
                let built = match &s.sde_window {
                    // deterministic rollouts: the trained steps are training timesteps, no
                    // transition is taken at them, so no SDE's check applies
                    None if ode_rollouts => self
                        .sampling
                        .trained_steps()
                        .build_timesteps(&schedule.sigmas)
                        .map(|plan| (TrainedPlan::Configured(plan), Default::default())),
                    None => self
                        .sampling
                        .trained_steps()
                        .build(sde, &schedule.sigmas)
                        .map(|(plan, report)| (TrainedPlan::Configured(plan), report)),
                    Some(w) => self.sliding_window(w, sde, &schedule.sigmas, &mut p),
                };
                match built {
                    Ok((plan, report)) => {
                        warnings.extend(
                            report
                                .warnings
                                .into_iter()
                                .map(PreflightWarning::TrainedSteps),
                        );
                        schedule_and_plan = Some((schedule, plan));
                    }
                    Err(ScheduleError::InvalidPlan { problems }) => {
                        p.extend(problems.into_iter().map(PreflightProblem::TrainedSteps));
                    }
                    Err(e) => p.push(PreflightProblem::Schedule { source: e }),
                }
            }
        }

        // the evaluation's own step count (Flow-GRPO's denoising reduction)
        let eval_schedule = match self.eval.num_inference_steps {
            None => None,
            Some(0) => {
                p.push(PreflightProblem::OutOfRange {
                    key: "eval.num_inference_steps",
                    given: "0".into(),
                    allowed: "an integer >= 1, or no key to evaluate at sampling.num_inference_steps",
                });
                None
            }
            Some(n) => match schedule_at(n) {
                Ok(schedule) => Some(schedule),
                Err(e) => {
                    p.push(PreflightProblem::Schedule { source: e });
                    None
                }
            },
        };

        // the evaluation's stochastic steps (`eval.sampling = "sde"`: the plan's answer to a
        // query without a rollout, seed 002's evaluation fallback), and those of the SDE
        // pictures `eval.sde_gap` samples beside the deterministic ones
        let mut eval_sde_steps = SdeSteps::new([]);
        let mut eval_gap_steps = None;
        let sde_eval = self.eval.sampling == EvalSampling::Sde;
        if self.eval.sde_gap && sde_eval {
            p.push(PreflightProblem::OutOfRange {
                key: "eval.sde_gap",
                given: "true".into(),
                allowed: "false with eval.sampling = \"sde\" (its pictures are the SDE's \
                          already), or eval.sampling = \"ode\"",
            });
        }
        let (key, given) = if sde_eval {
            ("eval.sampling", "\"sde\"")
        } else {
            ("eval.sde_gap", "true")
        };
        if sde_eval || self.eval.sde_gap {
            if ode_rollouts {
                p.push(PreflightProblem::OutOfRange {
                    key,
                    given: given.into(),
                    allowed: if sde_eval {
                        "\"ode\" with algorithm.kind = \"nft\", \"dpo\" or \"raft\" (their rollouts take no \
                         SDE transition, so there is none to evaluate with)"
                    } else {
                        "false with algorithm.kind = \"nft\", \"dpo\" or \"raft\" (their rollouts take no \
                         SDE transition, so there is none to compare with)"
                    },
                });
            }
            if self
                .eval
                .num_inference_steps
                .is_some_and(|n| n != s.num_inference_steps)
            {
                p.push(PreflightProblem::OutOfRange {
                    key,
                    given: given.into(),
                    allowed: if sde_eval {
                        "\"ode\" with eval.num_inference_steps other than \
                         sampling.num_inference_steps (the plan's evaluation steps index the \
                         rollouts' schedule)"
                    } else {
                        "false with eval.num_inference_steps other than \
                         sampling.num_inference_steps (the plan's evaluation steps index the \
                         rollouts' schedule)"
                    },
                });
            }
            if let Some((_, plan)) = &schedule_and_plan
                && !ode_rollouts
            {
                match plan.steps(PlanQuery::evaluation()) {
                    Ok(steps) if sde_eval => eval_sde_steps = steps,
                    Ok(steps) => eval_gap_steps = Some(steps),
                    Err(_) => p.push(PreflightProblem::OutOfRange {
                        key,
                        given: given.into(),
                        allowed: if sde_eval {
                            "\"ode\" with sampling.sde_window (a sliding window's steps move \
                             with the rollouts: it has no fixed evaluation steps)"
                        } else {
                            "false with sampling.sde_window (a sliding window's steps move \
                             with the rollouts: it has no fixed evaluation steps)"
                        },
                    }),
                }
            }
        }

        // reward
        let r = &self.reward;
        if r.required_components.is_empty() {
            p.push(PreflightProblem::NoRequiredRewardComponent);
        }
        for name in &r.required_components {
            if !r.component_weights.contains_key(name) {
                p.push(PreflightProblem::RequiredComponentWithoutWeight {
                    component: name.clone(),
                });
            }
        }
        for (name, &weight) in &r.component_weights {
            if !weight.is_finite() {
                p.push(PreflightProblem::RewardWeight {
                    component: name.clone(),
                    weight,
                });
            }
        }
        self.check_scorers(&mut p);
        let std_mode = self.algorithm.advantage_std_mode().std_mode();
        let advantages = if p.iter().any(PreflightProblem::is_reward) {
            None
        } else {
            match AdvantageConfig::flow_grpo(std_mode, self.reward_components()) {
                Ok(a) => Some(a),
                Err(source) => {
                    p.push(PreflightProblem::Advantages { source });
                    None
                }
            }
        };

        // group geometry
        let batch = self.check_batch(&mut p, &mut warnings);

        // objective
        let algorithm = check_algorithm(&self.algorithm, self.run.seed, &mut p);
        if let (
            Some(AlgorithmPlan::FlowGrpo {
                timestep_subset: Some(t),
                ..
            }),
            Some((_, plan)),
        ) = (&algorithm, &schedule_and_plan)
            && let Ok(steps) = plan.steps(PlanQuery::rollout(0))
            && (steps.len() as f64 * t.fraction).floor() < 1.0
        {
            p.push(PreflightProblem::OutOfRange {
                key: "algorithm.timestep_fraction",
                given: t.fraction.to_string(),
                allowed: "a fraction that keeps at least one of the rollout's trained steps (floor(fraction * trained steps) >= 1)",
            });
        }
        // a full fine-tune holding its trained weights in bf16 (no f32 master)
        let narrow_trainable = self.model.trainable_mode == TrainableMode::Full
            && self.model.param_dtype == Some(ParamDtype::Bf16)
            && self.model.master_dtype != Some(MasterDtype::Fp32);
        let ema = self
            .ema
            .as_ref()
            .and_then(|e| check_ema(e, narrow_trainable, &mut p));
        if let Some(budget) = self.run.cpu_budget_seconds
            && !(budget.is_finite() && budget > 0.0)
        {
            p.push(PreflightProblem::OutOfRange {
                key: "run.cpu_budget_seconds",
                given: budget.to_string(),
                allowed: "a finite value > 0 (CPU seconds of rollouts, scoring and updates), or absent",
            });
        }
        if let AlgorithmSection::Raft(raft) = &self.algorithm
            && raft.top_k >= self.rollout.group_size
            && self.rollout.group_size >= 2
        {
            p.push(PreflightProblem::OutOfRange {
                key: "algorithm.top_k",
                given: raft.top_k.to_string(),
                allowed: "below rollout.group_size with algorithm.kind = \"raft\" (a group's best \
                          are chosen from it: the whole group would be plain fine-tuning on \
                          every sample)",
            });
        }
        if let AlgorithmSection::Fdfo(_) = &self.algorithm {
            let r = &self.rollout;
            let need = "with algorithm.kind = \"fdfo\" (a pair is two rollouts from one x_T that churn noise makes differ)";
            if r.group_size != 2 {
                p.push(PreflightProblem::OutOfRange {
                    key: "rollout.group_size",
                    given: r.group_size.to_string(),
                    allowed: "2 with algorithm.kind = \"fdfo\" (a group is the pair)",
                });
            }
            if !r.shared_initial_noise {
                p.push(PreflightProblem::OutOfRange {
                    key: "rollout.shared_initial_noise",
                    given: "false".into(),
                    allowed: need,
                });
            }
            if self.sampling.sde_type != SdeKind::Churn {
                p.push(PreflightProblem::OutOfRange {
                    key: "sampling.sde_type",
                    given: format!("{:?}", self.sampling.sde_type),
                    allowed: "\"churn\" with algorithm.kind = \"fdfo\" (the pair's difference is churn noise)",
                });
            }
            if !r.micro_batch_size.is_multiple_of(2) {
                p.push(PreflightProblem::OutOfRange {
                    key: "rollout.micro_batch_size",
                    given: r.micro_batch_size.to_string(),
                    allowed: "even with algorithm.kind = \"fdfo\" (a micro-batch holds whole pairs)",
                });
            }
        }
        if let AlgorithmSection::Dpo(_) = &self.algorithm {
            let r = &self.rollout;
            // a group below 2 is every algorithm's problem, reported once with the geometry
            if r.group_size >= 2
                && (r.micro_batch_size == 0 || !r.micro_batch_size.is_multiple_of(r.group_size))
            {
                p.push(PreflightProblem::OutOfRange {
                    key: "rollout.micro_batch_size",
                    given: r.micro_batch_size.to_string(),
                    allowed: "a multiple of rollout.group_size with algorithm.kind = \"dpo\" (a micro-batch holds \
                              whole groups, whose best and worst samples pair up)",
                });
            }
        }
        if let AlgorithmSection::Awm(w) = &self.algorithm
            && w.ema_kl_coef != 0.0
            && self.ema.is_none()
        {
            p.push(PreflightProblem::OutOfRange {
                key: "algorithm.ema_kl_coef",
                given: w.ema_kl_coef.to_string(),
                allowed: "0 without an [ema] section (the term measures the policy against its EMA copy)",
            });
        }

        // optimizer
        let o = &self.optimizer;
        if !(o.clip_grad.is_finite() && o.clip_grad > 0.0) {
            p.push(PreflightProblem::OutOfRange {
                key: "optimizer.clip_grad",
                given: o.clip_grad.to_string(),
                allowed: "a finite value > 0 (the global-norm bound)",
            });
        }
        let decay = LrSchedule::check(
            o.lr,
            o.lr_warmup_iters,
            o.lr_scheduler,
            o.min_lr,
            o.lr_decay_iters,
            &mut p,
        );
        // a constant rate reads neither decay key: one set beside it is refused, not dropped
        if o.lr_scheduler == LrSchedulerKind::Constant {
            let unused = "absent (or min_lr 0) with optimizer.lr_scheduler = \"constant\", which \
                          stays at lr after the warmup: set \"linear\" or \"cosine\" to decay";
            if o.min_lr != 0.0 {
                p.push(PreflightProblem::OutOfRange {
                    key: "optimizer.min_lr",
                    given: o.min_lr.to_string(),
                    allowed: unused,
                });
            }
            if let Some(d) = o.lr_decay_iters {
                p.push(PreflightProblem::OutOfRange {
                    key: "optimizer.lr_decay_iters",
                    given: d.to_string(),
                    allowed: unused,
                });
            }
        }
        let adamw = self.check_adamw(&mut p);

        // checkpoints, artifacts, eval
        if self.checkpoint.save_interval == 0 {
            p.push(PreflightProblem::OutOfRange {
                key: "checkpoint.save_interval",
                given: "0".into(),
                allowed: "an integer >= 1 (rollouts between checkpoints)",
            });
        }
        if self.checkpoint.max_to_keep == Some(0) {
            p.push(PreflightProblem::OutOfRange {
                key: "checkpoint.max_to_keep",
                given: "0".into(),
                allowed: "an integer >= 1, or absent to keep every checkpoint",
            });
        }
        // the keys of a resume are read only when resuming, and overwrite only when not: a
        // combination that would drop one is refused (resume_from with overwrite but without
        // resume would move the run aside and start afresh)
        let c = &self.checkpoint;
        if !c.resume {
            let without_resume = "absent or false unless checkpoint.resume = true (--resume): it is \
                                  read only when resuming";
            for (key, given) in [
                (
                    "checkpoint.resume_from",
                    c.resume_from.map(|i| i.to_string()),
                ),
                (
                    "checkpoint.allow_fresh",
                    c.allow_fresh.then(|| "true".into()),
                ),
                (
                    "checkpoint.allow_config_changes",
                    c.allow_config_changes.then(|| "true".into()),
                ),
            ] {
                if let Some(given) = given {
                    p.push(PreflightProblem::OutOfRange {
                        key,
                        given,
                        allowed: without_resume,
                    });
                }
            }
        } else if c.overwrite {
            p.push(PreflightProblem::OutOfRange {
                key: "checkpoint.overwrite",
                given: "true".into(),
                allowed: "false with checkpoint.resume = true (--resume continues the run in the \
                          directory; --overwrite moves it aside to start again: choose one)",
            });
        }
        if self.artifacts.retention_rollouts <= 0 {
            warnings.push(PreflightWarning::UnboundedArtifacts {
                retention_rollouts: self.artifacts.retention_rollouts,
            });
        }
        if self.eval.interval == 0 {
            warnings.push(PreflightWarning::EvaluationOff);
        } else if self.eval.samples_per_prompt == 0 {
            p.push(PreflightProblem::OutOfRange {
                key: "eval.samples_per_prompt",
                given: "0".into(),
                allowed: "an integer >= 1 when eval.interval > 0",
            });
        } else if self.eval.samples_per_prompt > MAX_EVAL_SAMPLES_PER_PROMPT {
            p.push(PreflightProblem::OutOfRange {
                key: "eval.samples_per_prompt",
                given: self.eval.samples_per_prompt.to_string(),
                allowed: "at most 4096 (an evaluation holds every sample and its picture in \
                          memory; 48 already gives a standard error below 0.01 in the shapes world)",
            });
        }
        if let Some(g) = &self.eval.guidance
            && !(g.scale.is_finite() && g.scale > 1.0)
        {
            p.push(PreflightProblem::OutOfRange {
                key: "eval.guidance.scale",
                given: g.scale.to_string(),
                allowed: "a finite value > 1 (at 1 guidance changes nothing but doubles the \
                          evaluation's forwards: remove eval.guidance)",
            });
        }
        let rollout_samples = self
            .rollout
            .prompts_per_rollout
            .saturating_mul(self.rollout.group_size);
        if rollout_samples > MAX_ROLLOUT_SAMPLES {
            p.push(PreflightProblem::OutOfRange {
                key: "rollout.prompts_per_rollout",
                given: format!(
                    "{} (x group_size {} = {rollout_samples} samples)",
                    self.rollout.prompts_per_rollout, self.rollout.group_size
                ),
                allowed: "at most 65536 samples per rollout (a rollout holds every sample's \
                          trajectory in memory)",
            });
        }
        if let GeneratorSource::ShapesWorld { .. } = &self.model.generator {
            if let Some(d @ ParamDtype::Bf16) = self.model.param_dtype {
                p.push(PreflightProblem::OutOfRange {
                    key: "model.param_dtype",
                    given: format!("{d:?}"),
                    allowed: "fp32 (or absent) in the shapes world: bf16 frozen weights are \
                              implemented for the Qwen-Image world",
                });
            }
            let side = reward::shapes::IMAGE_SIZE as u32;
            for (key, given) in [
                ("sampling.height", self.sampling.height),
                ("sampling.width", self.sampling.width),
            ] {
                if given != side {
                    p.push(PreflightProblem::OutOfRange {
                        key,
                        given: given.to_string(),
                        allowed: "32 in the shapes world (its generator draws 32x32 pictures; \
                                  another value would only change the schedule's shift and the \
                                  recorded image size)",
                    });
                }
            }
            if let Some(available) = mem_available() {
                p.extend(shapes_memory_problems(self, available));
            }
            // each prompt file read once: its problems, and the training pool's size
            let train_pool =
                match read_data_files(&self.data, &mut p, crate::shapes_world::read_prompt_file) {
                    None => Some(crate::shapes_world::train_pool_size()),
                    Some(prompts) => prompts.map(|v| v.len()),
                };
            let pool = train_pool;
            if let Some(pool) = pool
                && self.rollout.prompts_per_rollout > pool
            {
                p.push(PreflightProblem::OutOfRange {
                    key: "rollout.prompts_per_rollout",
                    given: self.rollout.prompts_per_rollout.to_string(),
                    allowed: "at most the distinct training prompts (the shapes world's \
                              shapes_world::train_pool_size, or the records of data.train)",
                });
            }
        }
        if let GeneratorSource::QwenImage { .. } = &self.model.generator {
            // each prompt file read once (the world refuses to load without both)
            let read = crate::qwen_image_world::read_prompt_file;
            let train_pool =
                read_data_files(&self.data, &mut p, read)
                    .flatten()
                    .map(|mut prompts| {
                        prompts.sort();
                        prompts.dedup();
                        prompts.len()
                    });
            if let Some(pool) = train_pool
                && self.rollout.prompts_per_rollout > pool
            {
                p.push(PreflightProblem::OutOfRange {
                    key: "rollout.prompts_per_rollout",
                    given: self.rollout.prompts_per_rollout.to_string(),
                    allowed: "at most the distinct prompts of data.train",
                });
            }
        }
        if self.run.num_rollouts == 0 {
            p.push(PreflightProblem::OutOfRange {
                key: "run.num_rollouts",
                given: "0".into(),
                allowed: "an integer >= 1",
            });
        }

        match (
            p.is_empty(),
            trainable,
            schedule_and_plan,
            batch,
            algorithm,
            advantages,
            decay,
            adamw,
        ) {
            (
                true,
                Some(trainable),
                Some((schedule, plan)),
                Some((batch, update_plan)),
                Some(algorithm),
                Some(advantages),
                Some(_),
                Some(adamw),
            ) => Ok(Preflight {
                warnings,
                trainable,
                eval_schedule: eval_schedule.unwrap_or_else(|| schedule.clone()),
                eval_sde_steps,
                eval_gap_steps,
                schedule,
                plan,
                sde,
                batch,
                update_plan,
                algorithm,
                advantages,
                lr: LrSchedule::new(
                    o.lr,
                    o.lr_warmup_iters,
                    o.lr_scheduler,
                    o.min_lr,
                    o.lr_decay_iters,
                )?,
                adamw,
                ema,
                ranks: 1,
            }),
            _ => {
                debug_assert!(!p.is_empty(), "a failed check reports its problem");
                Err(TrainerError::Preflight { problems: p })
            }
        }
    }

    /// What trains, checked on its own (the `[model]` trainable mode and the `[lora]` section)
    /// — for tools that rebuild a run's policy without running it, such as export.
    ///
    /// # Errors
    /// [`TrainerError::Preflight`] with the trainable-mode and LoRA problems.
    pub fn trainable(&self) -> Result<Trainable, TrainerError> {
        let mut p = Vec::new();
        self.check_trainable(&mut p, &mut Vec::new())
            .ok_or(TrainerError::Preflight { problems: p })
    }

    fn check_trainable(
        &self,
        p: &mut Vec<PreflightProblem>,
        warnings: &mut Vec<PreflightWarning>,
    ) -> Option<Trainable> {
        let rank = self.lora_rank();
        match (self.model.trainable_mode, &self.lora) {
            (TrainableMode::Full, _) if rank > 0 => {
                p.push(PreflightProblem::TrainableModeRank {
                    mode: TrainableMode::Full,
                    lora_rank: rank,
                });
                None
            }
            (TrainableMode::Full, lora) => {
                // a [lora] section of rank 0 beside a full fine-tune trains no adapter: what
                // would shape or seed one is refused rather than dropped
                if let Some(l) = lora {
                    let unused = "absent with model.trainable_mode = \"full\" (every weight is \
                                  trained; no adapter is built)";
                    for (key, given) in [
                        (
                            "lora.init_from",
                            l.init_from.as_ref().map(|p| p.display().to_string()),
                        ),
                        (
                            "lora.target_modules",
                            l.target_modules.as_ref().map(|t| format!("{t:?}")),
                        ),
                        ("lora.use_rslora", l.use_rslora.then(|| "true".to_string())),
                        (
                            "lora.init_dropout",
                            (!l.init_dropout.is_refuse()).then(|| "\"zero\"".to_string()),
                        ),
                    ] {
                        if let Some(given) = given {
                            p.push(PreflightProblem::OutOfRange {
                                key,
                                given,
                                allowed: unused,
                            });
                        }
                    }
                }
                Some(Trainable::Full)
            }
            (TrainableMode::Lora, None)
            | (TrainableMode::Lora, Some(LoraSection { rank: 0, .. })) => {
                p.push(PreflightProblem::TrainableModeRank {
                    mode: TrainableMode::Lora,
                    lora_rank: 0,
                });
                None
            }
            (TrainableMode::Lora, Some(l)) => {
                if self.model.master_dtype != Some(MasterDtype::Fp32) {
                    warnings.push(PreflightWarning::LoraWithoutFp32Master {
                        master_dtype: self.model.master_dtype,
                    });
                }
                let mut cfg = LoraConfig::new(l.rank, l.alpha)
                    .with_dropout(l.dropout)
                    .with_use_rslora(l.use_rslora);
                if let Some(t) = &l.target_modules {
                    cfg = cfg.with_target_modules(t.clone());
                }
                match cfg.validate() {
                    Ok(()) => match &l.init_from {
                        None if !l.init_dropout.is_refuse() => {
                            p.push(PreflightProblem::OutOfRange {
                                key: "lora.init_dropout",
                                given: "\"zero\"".into(),
                                allowed: "\"refuse\" (the default) without lora.init_from: it says what \
                                          to do with a starting adapter's dropout, and there is none",
                            });
                            None
                        }
                        None => Some(Trainable::Lora(cfg)),
                        Some(path) => check_lora_init(l, cfg, path, p, warnings),
                    },
                    Err(dit_models::DitError::LoraDropout { given }) => {
                        p.push(PreflightProblem::LoraDropout { given });
                        None
                    }
                    Err(dit_models::DitError::InvalidLora { problems }) => {
                        for problem in problems {
                            if problem.field == "dropout" {
                                p.push(PreflightProblem::LoraDropout { given: l.dropout });
                            } else {
                                p.push(PreflightProblem::Lora { problem });
                            }
                        }
                        None
                    }
                    Err(other) => {
                        p.push(PreflightProblem::Lora {
                            problem: dit_models::ConfigProblem {
                                field: "lora",
                                given: format!("{l:?}"),
                                allowed: other.to_string(),
                            },
                        });
                        None
                    }
                }
            }
        }
    }

    fn check_batch(
        &self,
        p: &mut Vec<PreflightProblem>,
        warnings: &mut Vec<PreflightWarning>,
    ) -> Option<(BatchGeometry, UpdatePlan)> {
        let g = &self.rollout;
        let mut ok = true;
        for (key, value, allowed) in [
            (
                "rollout.prompts_per_rollout",
                g.prompts_per_rollout,
                "an integer >= 1",
            ),
            (
                "rollout.group_size",
                g.group_size,
                "an integer >= 2 (group-relative advantages of a single candidate are always 0)",
            ),
            (
                "rollout.num_updates_per_batch",
                g.num_updates_per_batch,
                "an integer >= 1",
            ),
            (
                "rollout.micro_batch_size",
                g.micro_batch_size,
                "an integer >= 1",
            ),
        ] {
            let min = if key == "rollout.group_size" { 2 } else { 1 };
            if value < min {
                p.push(PreflightProblem::OutOfRange {
                    key,
                    given: value.to_string(),
                    allowed,
                });
                ok = false;
            }
        }
        if !ok {
            return None;
        }
        let global = g.prompts_per_rollout * g.group_size;
        if !global.is_multiple_of(g.num_updates_per_batch) {
            p.push(PreflightProblem::UpdatesNotDivisible {
                prompts_per_rollout: g.prompts_per_rollout,
                group_size: g.group_size,
                num_updates_per_batch: g.num_updates_per_batch,
            });
            return None;
        }
        let chunk = global / g.num_updates_per_batch;
        if !chunk.is_multiple_of(g.micro_batch_size) {
            p.push(PreflightProblem::MicroBatchNotDivisible {
                chunk,
                micro_batch_size: g.micro_batch_size,
            });
            return None;
        }
        match plan_updates(global, g.num_updates_per_batch, g.micro_batch_size) {
            Ok(plan) => {
                for w in &plan.warnings {
                    if *w == UpdatePlanWarning::SingleUpdate {
                        warnings.push(PreflightWarning::SingleUpdatePerBatch);
                    }
                }
                Some((
                    BatchGeometry {
                        prompts_per_rollout: g.prompts_per_rollout,
                        group_size: g.group_size,
                        global_batch_size: global,
                        num_updates_per_batch: g.num_updates_per_batch,
                        update_size: chunk,
                        micro_batch_size: g.micro_batch_size,
                    },
                    plan,
                ))
            }
            Err(source) => {
                p.push(PreflightProblem::Advantages { source });
                None
            }
        }
    }

    /// Every required or weighted component must come from a configured scorer, and no two
    /// scorers may produce the same component.
    fn check_scorers(&self, p: &mut Vec<PreflightProblem>) {
        let r = &self.reward;
        if r.scorers.is_empty() {
            p.push(PreflightProblem::OutOfRange {
                key: "reward.scorers",
                given: "[]".into(),
                allowed: "at least one scorer (shapes, jpeg_compressibility, jpeg_incompressibility, pickscore, world)",
            });
            return;
        }
        let mut produced: BTreeMap<String, ScorerSpec> = BTreeMap::new();
        for spec in self.all_scorers() {
            for c in spec.components() {
                if let Some(first) = produced.insert(c.clone(), spec.clone()) {
                    p.push(PreflightProblem::ScorersOverlap {
                        component: c,
                        first: format!("{first:?}"),
                        second: format!("{spec:?}"),
                    });
                }
            }
        }
        let wanted = r
            .required_components
            .iter()
            .chain(r.component_weights.keys());
        let mut reported = Vec::new();
        for name in wanted {
            if !produced.contains_key(name.as_str()) && !reported.contains(name) {
                reported.push(name.clone());
                p.push(PreflightProblem::ComponentWithoutScorer {
                    component: name.clone(),
                    scorers: format!("{:?}", r.scorers),
                });
            }
        }
    }

    fn check_adamw(&self, p: &mut Vec<PreflightProblem>) -> Option<AdamWSettings> {
        let o = &self.optimizer;
        let before = p.len();
        for (key, v) in [
            ("optimizer.adam_beta1", o.adam_beta1),
            ("optimizer.adam_beta2", o.adam_beta2),
        ] {
            if !(v.is_finite() && (0.0..1.0).contains(&v)) {
                p.push(PreflightProblem::OutOfRange {
                    key,
                    given: v.to_string(),
                    allowed: "a finite value in [0, 1)",
                });
            }
        }
        // AdamW keeps its hyperparameters in f32: eps must survive that.
        if !(o.adam_eps.is_finite() && o.adam_eps > 0.0 && (o.adam_eps as f32) > 0.0) {
            p.push(PreflightProblem::OutOfRange {
                key: "optimizer.adam_eps",
                given: o.adam_eps.to_string(),
                allowed: "a finite value > 0 representable in f32 (e.g. 1e-8, or 1e-15 for full FT)",
            });
        }
        if !(o.weight_decay.is_finite() && o.weight_decay >= 0.0) {
            p.push(PreflightProblem::OutOfRange {
                key: "optimizer.weight_decay",
                given: o.weight_decay.to_string(),
                allowed: "a finite value >= 0",
            });
        }
        (p.len() == before).then_some(AdamWSettings {
            beta1: o.adam_beta1,
            beta2: o.adam_beta2,
            eps: o.adam_eps,
            weight_decay: o.weight_decay,
        })
    }
}

/// FlowGRPO's trust region as its objectives share it (FlowGRPO, GRPO-Guard): the PPO clip
/// range and the KL coefficient, each validated (every problem pushed to `p`).
fn check_flow_grpo_trust(
    eps_clip: f64,
    eps_clip_high: Option<f64>,
    kl_coef: f64,
    p: &mut Vec<PreflightProblem>,
) -> (Option<ClipRange>, Option<f64>) {
    let clip_range = check_clip_range(
        eps_clip,
        eps_clip_high,
        false,
        "a finite value in (0, 1) (FlowGRPO uses 1e-4)",
        p,
    );
    let kl_coef = check_kl_coef(
        "algorithm.kl_coef",
        kl_coef,
        "a finite value >= 0 (flow_grpo uses 0.04 on GenEval, 0 on PickScore)",
        p,
    );
    (clip_range, kl_coef)
}

/// The objective of `[algorithm]`, validated (every problem pushed to `p`).
fn check_algorithm(
    a: &AlgorithmSection,
    seed: u64,
    p: &mut Vec<PreflightProblem>,
) -> Option<AlgorithmPlan> {
    match a {
        AlgorithmSection::FlowGrpo(g) => {
            let (clip_range, kl_coef) =
                check_flow_grpo_trust(g.eps_clip, g.eps_clip_high, g.kl_coef, p);
            let timestep_subset = match g.timestep_fraction {
                None => Some(None),
                Some(fraction) if fraction.is_finite() && fraction > 0.0 && fraction <= 1.0 => {
                    Some(Some(TimestepSubset { fraction, seed }))
                }
                Some(fraction) => {
                    p.push(PreflightProblem::OutOfRange {
                        key: "algorithm.timestep_fraction",
                        given: fraction.to_string(),
                        allowed: "a value in (0, 1] (DanceGRPO uses 0.6), or absent",
                    });
                    None
                }
            };
            Some(AlgorithmPlan::FlowGrpo {
                clip_range: clip_range?,
                anchor: g.anchor,
                kl_coef: kl_coef?,
                timestep_subset: timestep_subset?,
            })
        }
        AlgorithmSection::Awm(w) => {
            let clip_range = check_clip_range(
                w.eps_clip,
                w.eps_clip_high,
                true,
                "a finite value in (0, 1] (the AWM release uses 1: the band [0, 2])",
                p,
            );
            if !(w.advantage_limit.is_finite() && w.advantage_limit > 0.0) {
                p.push(PreflightProblem::OutOfRange {
                    key: "algorithm.advantage_limit",
                    given: w.advantage_limit.to_string(),
                    allowed: "a finite value > 0 (the AWM release uses 5)",
                });
            }
            let weighting = match (w.weighting, w.huber_power) {
                (AwmWeightingKind::Uniform, None) => Some(AwmWeighting::Uniform),
                (AwmWeightingKind::Uniform, Some(power)) => {
                    p.push(PreflightProblem::OutOfRange {
                        key: "algorithm.huber_power",
                        given: power.to_string(),
                        allowed: "absent with weighting = \"uniform\" (it only shapes the \"huber\" weighting)",
                    });
                    None
                }
                (AwmWeightingKind::Huber, power) => {
                    let power = power.unwrap_or(0.25);
                    if power.is_finite() && power > 0.0 && power <= 1.0 {
                        Some(AwmWeighting::GeneralisedHuber { power })
                    } else {
                        p.push(PreflightProblem::OutOfRange {
                            key: "algorithm.huber_power",
                            given: power.to_string(),
                            allowed: "a finite value in (0, 1] (the AWM release uses 0.25)",
                        });
                        None
                    }
                }
            };
            let kl_coef = check_kl_coef(
                "algorithm.kl_coef",
                w.kl_coef,
                "a finite value >= 0 (the AWM release uses 0.001)",
                p,
            );
            let ema_kl_coef = check_kl_coef(
                "algorithm.ema_kl_coef",
                w.ema_kl_coef,
                "a finite value >= 0 (the AWM release uses 1.0)",
                p,
            );
            Some(AlgorithmPlan::Awm {
                clip_range: clip_range?,
                weighting: weighting?,
                advantage_limit: w.advantage_limit,
                kl_coef: kl_coef?,
                ema_kl_coef: ema_kl_coef?,
            })
        }
        AlgorithmSection::Nft(n) => check_nft(n, p),
        AlgorithmSection::Raft(r) => {
            if r.top_k >= 1 {
                Some(AlgorithmPlan::Raft { top_k: r.top_k })
            } else {
                p.push(PreflightProblem::OutOfRange {
                    key: "algorithm.top_k",
                    given: r.top_k.to_string(),
                    allowed: "at least 1 (the best sample of each group; 1 is best-of-N)",
                });
                None
            }
        }
        AlgorithmSection::Fdfo(f) => {
            if f.eps.is_finite() && f.eps > 0.0 {
                Some(AlgorithmPlan::Fdfo { eps: f.eps })
            } else {
                p.push(PreflightProblem::OutOfRange {
                    key: "algorithm.eps",
                    given: f.eps.to_string(),
                    allowed: "a finite value > 0 (the paper's SPO uses 0.03)",
                });
                None
            }
        }
        AlgorithmSection::Dpok(d) => {
            let clip_range = check_clip_range(
                d.eps_clip,
                None,
                false,
                "a finite value in (0, 1) (the DPOK release uses 1e-4)",
                p,
            );
            let reward_weight = if d.reward_weight.is_finite() && d.reward_weight > 0.0 {
                Some(d.reward_weight)
            } else {
                p.push(PreflightProblem::OutOfRange {
                    key: "algorithm.reward_weight",
                    given: d.reward_weight.to_string(),
                    allowed: "a finite value > 0 (the DPOK release uses 100)",
                });
                None
            };
            let kl_coef = check_kl_coef(
                "algorithm.kl_coef",
                d.kl_coef,
                "a finite value >= 0 (the DPOK release uses 0.01)",
                p,
            );
            if d.kl_warmup_rollouts > 0 && d.kl_coef == 0.0 {
                p.push(PreflightProblem::OutOfRange {
                    key: "algorithm.kl_warmup_rollouts",
                    given: d.kl_warmup_rollouts.to_string(),
                    allowed: "0 when algorithm.kl_coef = 0 (a warm-up of a KL term that is off does nothing)",
                });
            }
            let value_baseline = match &d.value_baseline {
                None => Some(None),
                Some(v) => check_value_baseline(v, d.advantage_std_mode, p).map(Some),
            };
            Some(AlgorithmPlan::Dpok {
                clip_range: clip_range?,
                reward_weight: reward_weight?,
                kl_coef: kl_coef?,
                kl_warmup_rollouts: d.kl_warmup_rollouts,
                anchor: d.anchor,
                value_baseline: value_baseline?,
            })
        }
        AlgorithmSection::GrpoGuard(g) => {
            let (clip_range, kl_coef) =
                check_flow_grpo_trust(g.eps_clip, g.eps_clip_high, g.kl_coef, p);
            Some(AlgorithmPlan::GrpoGuard {
                clip_range: clip_range?,
                kl_coef: kl_coef?,
            })
        }
        AlgorithmSection::Dpo(d) => {
            if d.beta.is_finite() && d.beta > 0.0 {
                Some(AlgorithmPlan::Dpo { beta: d.beta })
            } else {
                p.push(PreflightProblem::OutOfRange {
                    key: "algorithm.beta",
                    given: d.beta.to_string(),
                    allowed: "a finite value > 0 (the DPO release uses 5000)",
                });
                None
            }
        }
    }
}

impl TrainConfig {
    /// Without a window: the trained-step keys the configured plan does not read are refused
    /// rather than dropped. With `sde_resample_per_rollout` the pool is drawn from (the
    /// fraction window only when there is no pool); without it the explicit list is trained
    /// as it stands (its length is the trained steps) or, with no list, the fraction window's
    /// picks are.
    fn check_unused_step_keys(&self, p: &mut Vec<PreflightProblem>) {
        let s = &self.sampling;
        let fraction = s
            .sde_timestep_fraction
            .map(|[lo, hi]| format!("[{lo}, {hi}]"));
        if s.sde_resample_per_rollout {
            if let (Some(_), Some(given)) = (&s.sde_pool, fraction) {
                p.push(PreflightProblem::OutOfRange {
                    key: "sampling.sde_timestep_fraction",
                    given,
                    allowed: "absent with sampling.sde_pool and sde_resample_per_rollout = true \
                              (each rollout draws its trained steps from the pool; the fraction \
                              window stands in for a missing pool only)",
                });
            }
            return;
        }
        if let Some(pool) = &s.sde_pool {
            p.push(PreflightProblem::OutOfRange {
                key: "sampling.sde_pool",
                given: format!("{pool:?}"),
                allowed: "absent with sampling.sde_resample_per_rollout = false (the pool is what \
                          a per-rollout draw picks from)",
            });
        }
        if let Some(ix) = &s.sde_indices {
            if s.num_sde_steps != ix.len() {
                p.push(PreflightProblem::OutOfRange {
                    key: "sampling.num_sde_steps",
                    given: format!(
                        "{} (sampling.sde_indices lists {})",
                        s.num_sde_steps,
                        ix.len()
                    ),
                    allowed: "the length of sampling.sde_indices (without a per-rollout draw the \
                              listed steps are the trained steps)",
                });
            }
            if let Some(given) = fraction {
                p.push(PreflightProblem::OutOfRange {
                    key: "sampling.sde_timestep_fraction",
                    given,
                    allowed: "absent with sampling.sde_indices and sde_resample_per_rollout = false \
                              (the listed steps are trained; the fraction window is not built)",
                });
            }
        }
    }

    /// MixGRPO's window of `sampling.sde_window`, validated against the schedule; the other
    /// trained-step keys must be off (each one left on is a problem of its own).
    fn sliding_window(
        &self,
        w: &SdeWindowSection,
        sde: SdeType,
        sigmas: &schedule::Sigmas,
        p: &mut Vec<PreflightProblem>,
    ) -> Result<(TrainedPlan, schedule::PlanReport), ScheduleError> {
        let s = &self.sampling;
        let unused = "off with sampling.sde_window (the window chooses the trained steps)";
        if s.sde_resample_per_rollout {
            p.push(PreflightProblem::OutOfRange {
                key: "sampling.sde_resample_per_rollout",
                given: "true".into(),
                allowed: unused,
            });
        }
        for (key, set) in [
            ("sampling.sde_pool", s.sde_pool.is_some()),
            ("sampling.sde_indices", s.sde_indices.is_some()),
            (
                "sampling.sde_timestep_fraction",
                s.sde_timestep_fraction.is_some(),
            ),
        ] {
            if set {
                p.push(PreflightProblem::OutOfRange {
                    key,
                    given: "set".into(),
                    allowed: "absent with sampling.sde_window (the window chooses the trained steps)",
                });
            }
        }
        if s.num_sde_steps != w.size {
            p.push(PreflightProblem::OutOfRange {
                key: "sampling.num_sde_steps",
                given: s.num_sde_steps.to_string(),
                allowed: "sampling.sde_window.size (the trained steps per rollout)",
            });
        }
        let n = s.num_inference_steps;
        let span = match w.span {
            Some([a, b]) => a..b,
            None => 1..n.saturating_sub(1),
        };
        let used: [(&'static str, bool, bool); 3] = [
            (
                "sampling.sde_window.min_interval",
                w.min_interval.is_some(),
                w.strategy == WindowStrategyKind::Decay,
            ),
            (
                "sampling.sde_window.decay_k",
                w.decay_k.is_some(),
                w.strategy == WindowStrategyKind::ExpDecay,
            ),
            (
                "sampling.sde_window.decay_threshold",
                w.decay_threshold.is_some(),
                w.strategy == WindowStrategyKind::ExpDecay,
            ),
        ];
        for (key, set, uses) in used {
            if set && !uses {
                p.push(PreflightProblem::OutOfRange {
                    key,
                    given: "set".into(),
                    allowed: "absent: only its own strategy reads it (min_interval: \"decay\"; decay_k, decay_threshold: \"exp_decay\")",
                });
            }
        }
        // a random start is drawn over every start of the span: no walk, so no stride and
        // nothing at its end
        if w.strategy == WindowStrategyKind::Random {
            if w.stride != 1 {
                p.push(PreflightProblem::OutOfRange {
                    key: "sampling.sde_window.stride",
                    given: w.stride.to_string(),
                    allowed: "1 with strategy = \"random\" (each start is drawn over the whole span; \
                              the stride is the step of the other strategies' walk)",
                });
            }
            if w.at_end != WindowEndKind::Clip {
                p.push(PreflightProblem::OutOfRange {
                    key: "sampling.sde_window.at_end",
                    given: "\"roll_back\"".into(),
                    allowed: "\"clip\" (the default) with strategy = \"random\" (a random start has no \
                              walk to reach the end of)",
                });
            }
        }
        let strategy = match w.strategy {
            WindowStrategyKind::Progressive => WindowStrategy::Progressive {
                shift_interval: w.shift_interval,
            },
            WindowStrategyKind::Random => WindowStrategy::Random {
                shift_interval: w.shift_interval,
                seed: self.run.seed,
            },
            WindowStrategyKind::Decay => {
                if w.min_interval.is_none() {
                    p.push(PreflightProblem::OutOfRange {
                        key: "sampling.sde_window.min_interval",
                        given: "absent".into(),
                        allowed: "an integer in [1, shift_interval] with strategy = \"decay\" (the interval at the last window)",
                    });
                }
                WindowStrategy::Decay {
                    max_interval: w.shift_interval,
                    min_interval: w.min_interval.unwrap_or(1),
                }
            }
            WindowStrategyKind::ExpDecay => WindowStrategy::ExpDecay {
                shift_interval: w.shift_interval,
                k: w.decay_k.unwrap_or(WindowStrategy::EXP_DECAY_K),
                threshold: w
                    .decay_threshold
                    .unwrap_or(WindowStrategy::EXP_DECAY_THRESHOLD),
            },
        };
        let at_end = match w.at_end {
            WindowEndKind::Clip => WindowEnd::Clip,
            WindowEndKind::RollBack => WindowEnd::RollBack,
        };
        let window = SlidingWindow::new(n, span, w.size, w.stride, strategy, at_end)?;
        let report = validate_plan(&window, sde, sigmas)?;
        Ok((TrainedPlan::Sliding(window), report))
    }
}

/// The `[ema]` schedule, validated.
fn check_ema(
    e: &EmaSection,
    narrow_trainable: bool,
    p: &mut Vec<PreflightProblem>,
) -> Option<EmaSettings> {
    let before = p.len();
    let precision = match e.precision {
        Some(EmaPrecisionKind::Fp32) => EmaPrecision::Fp32,
        Some(EmaPrecisionKind::Param) => EmaPrecision::Param,
        None if narrow_trainable => {
            p.push(PreflightProblem::OutOfRange {
                key: "ema.precision",
                given: "absent".into(),
                allowed: "\"fp32\" (an f32 average of the bf16 weights) or \"param\" (a bf16 average, as diffusers and flow_grpo keep it, whose small moves round away): required when the trained weights are bf16",
            });
            EmaPrecision::Fp32
        }
        None => EmaPrecision::Fp32,
    };
    if !(e.decay.is_finite() && (0.0..1.0).contains(&e.decay)) {
        p.push(PreflightProblem::OutOfRange {
            key: "ema.decay",
            given: e.decay.to_string(),
            allowed: "a finite value in [0, 1) (flow_grpo uses 0.9, the AWM release 0.3)",
        });
    }
    if e.update_interval == 0 {
        p.push(PreflightProblem::OutOfRange {
            key: "ema.update_interval",
            given: "0".into(),
            allowed: "an integer >= 1 (optimizer steps between moves of the average; flow_grpo uses 8)",
        });
    }
    let warmup = match (e.warmup, e.ramp) {
        (EmaWarmupKind::None, None) => Some(EmaWarmup::None),
        (EmaWarmupKind::FlowGrpo, None) => Some(EmaWarmup::FlowGrpo),
        (EmaWarmupKind::Linear, Some(ramp)) if ramp.is_finite() && ramp > 0.0 => {
            Some(EmaWarmup::Linear { ramp })
        }
        (EmaWarmupKind::Linear, ramp) => {
            p.push(PreflightProblem::OutOfRange {
                key: "ema.ramp",
                given: ramp.map_or("absent".into(), |r| r.to_string()),
                allowed: "a finite value > 0 with warmup = \"linear\" (the AWM release uses 0.001)",
            });
            None
        }
        (_, Some(ramp)) => {
            p.push(PreflightProblem::OutOfRange {
                key: "ema.ramp",
                given: ramp.to_string(),
                allowed: "absent unless warmup = \"linear\" (it only shapes that warm-up)",
            });
            None
        }
    };
    (p.len() == before).then_some(EmaSettings {
        decay: e.decay,
        warmup: warmup?,
        interval: e.update_interval,
        precision,
    })
}

/// A KL coefficient: finite and `>= 0`.
fn check_kl_coef(
    key: &'static str,
    given: f64,
    allowed: &'static str,
    p: &mut Vec<PreflightProblem>,
) -> Option<f64> {
    if given.is_finite() && given >= 0.0 {
        Some(given)
    } else {
        p.push(PreflightProblem::OutOfRange {
            key,
            given: given.to_string(),
            allowed,
        });
        None
    }
}

/// DPOK's `algorithm.value_baseline`, validated: every size at least 1, a positive finite
/// learning rate, and the group-relative std mode left at its default (the baseline replaces
/// those advantages).
fn check_value_baseline(
    v: &ValueBaselineSection,
    std_mode: AdvantageStdMode,
    p: &mut Vec<PreflightProblem>,
) -> Option<ValueBaselineSettings> {
    let before = p.len();
    for (key, given, release) in [
        ("algorithm.value_baseline.hidden", v.hidden, 256),
        ("algorithm.value_baseline.layers", v.layers, 3),
        ("algorithm.value_baseline.batch_size", v.batch_size, 256),
        ("algorithm.value_baseline.minibatches", v.minibatches, 5),
        ("algorithm.value_baseline.buffer_size", v.buffer_size, 1000),
    ] {
        if given == 0 {
            p.push(PreflightProblem::OutOfRange {
                key,
                given: given.to_string(),
                allowed: match release {
                    256 => "an integer >= 1 (the DPOK release uses 256)",
                    3 => "an integer >= 1 (the DPOK release uses 3)",
                    5 => "an integer >= 1 (the DPOK release uses 5)",
                    _ => "an integer >= 1 (the DPOK release uses 1000)",
                },
            });
        }
    }
    if !(v.lr.is_finite() && v.lr > 0.0) {
        p.push(PreflightProblem::OutOfRange {
            key: "algorithm.value_baseline.lr",
            given: v.lr.to_string(),
            allowed: "a finite value > 0 (the DPOK release uses 1e-4)",
        });
    }
    if std_mode != AdvantageStdMode::Group {
        p.push(PreflightProblem::OutOfRange {
            key: "algorithm.advantage_std_mode",
            given: format!("{std_mode:?}").to_lowercase(),
            allowed: "left at its default with algorithm.value_baseline, whose advantages \
                      r - V(x_t, c, t) are not group-relative",
        });
    }
    (p.len() == before).then_some(ValueBaselineSettings {
        hidden: v.hidden,
        layers: v.layers,
        fit: crate::value::ValueFit {
            minibatches: v.minibatches,
            batch_size: v.batch_size,
            lr: v.lr,
        },
        buffer_size: v.buffer_size,
    })
}

/// DiffusionNFT's `[algorithm]`, validated.
fn check_nft(n: &NftSection, p: &mut Vec<PreflightProblem>) -> Option<AlgorithmPlan> {
    let before = p.len();
    if !(n.beta.is_finite() && n.beta > 0.0) {
        p.push(PreflightProblem::OutOfRange {
            key: "algorithm.beta",
            given: n.beta.to_string(),
            allowed: "a finite value > 0 (the DiffusionNFT release uses 1.0, or 0.1)",
        });
    }
    if !(n.advantage_limit.is_finite() && n.advantage_limit > 0.0) {
        p.push(PreflightProblem::OutOfRange {
            key: "algorithm.advantage_limit",
            given: n.advantage_limit.to_string(),
            allowed: "a finite value > 0 (the DiffusionNFT release uses 5)",
        });
    }
    let kl_coef = check_kl_coef(
        "algorithm.kl_coef",
        n.kl_coef,
        "a finite value >= 0 (the DiffusionNFT release uses 1e-4)",
        p,
    );
    (p.len() == before).then_some(AlgorithmPlan::Nft {
        beta: n.beta,
        advantage_limit: n.advantage_limit,
        soft_update: n.soft_update.schedule(),
        kl_coef: kl_coef?,
    })
}

/// A clip range from `eps_clip` (in `(0, 1)`, or `(0, 1]` with `low_may_be_one`) and the
/// optional upper `eps_clip_high`.
fn check_clip_range(
    eps_clip: f64,
    eps_clip_high: Option<f64>,
    low_may_be_one: bool,
    allowed: &'static str,
    p: &mut Vec<PreflightProblem>,
) -> Option<ClipRange> {
    let below_one = eps_clip < 1.0 || (low_may_be_one && eps_clip == 1.0);
    let low_ok = eps_clip.is_finite() && eps_clip > 0.0 && below_one;
    if !low_ok {
        p.push(PreflightProblem::OutOfRange {
            key: "algorithm.eps_clip",
            given: eps_clip.to_string(),
            allowed,
        });
    }
    let high = eps_clip_high.unwrap_or(eps_clip);
    if let Some(h) = eps_clip_high
        && !(h.is_finite() && h > 0.0)
    {
        p.push(PreflightProblem::OutOfRange {
            key: "algorithm.eps_clip_high",
            given: h.to_string(),
            allowed: "a finite value > 0, or absent for a symmetric clip",
        });
        return None;
    }
    if !low_ok {
        return None;
    }
    ClipRange::asymmetric(eps_clip, high).ok()
}

/// Which parameters train, as validated.
#[derive(Debug, Clone, PartialEq)]
pub enum Trainable {
    /// Every parameter.
    Full,
    /// A fresh LoRA adapter with this configuration; the base is frozen.
    Lora(LoraConfig),
    /// A LoRA adapter started from a file (`lora.init_from`); the base is frozen.
    LoraFrom(LoraInit),
}

impl Trainable {
    /// The adapter's configuration (`None` for full fine-tuning).
    pub fn lora_config(&self) -> Option<&LoraConfig> {
        match self {
            Trainable::Full => None,
            Trainable::Lora(c) | Trainable::LoraFrom(LoraInit { config: c, .. }) => Some(c),
        }
    }
}

/// A LoRA adapter started from a file (`lora.init_from`), its configuration checked against the
/// `[lora]` section.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraInit {
    /// The configuration it attaches with (the file's, equal to the section's).
    pub config: LoraConfig,
    /// The adapter file or directory.
    pub path: PathBuf,
    /// What its dropout does (`lora.init_dropout`).
    pub dropout: dit_models::ImportDropout,
}

/// `lora.init_from`: the adapter read (header and config only) and compared with the section.
fn check_lora_init(
    l: &LoraSection,
    section: LoraConfig,
    path: &Path,
    p: &mut Vec<PreflightProblem>,
    warnings: &mut Vec<PreflightWarning>,
) -> Option<Trainable> {
    let import = match dit_models::read_adapter(path, l.init_dropout.policy()) {
        Ok(i) => i,
        Err(dit_models::DitError::LoraDropout { given }) => {
            p.push(PreflightProblem::LoraInitDropout {
                path: path.to_path_buf(),
                given,
            });
            return None;
        }
        Err(e) => {
            p.push(PreflightProblem::LoraInit {
                path: path.to_path_buf(),
                problem: e.to_string(),
            });
            return None;
        }
    };
    let file = &import.config;
    let mut differences = Vec::new();
    let mut differ = |key: &'static str, section: String, file: String| {
        if section != file {
            differences.push((key, section, file));
        }
    };
    differ("lora.rank", section.rank.to_string(), file.rank.to_string());
    differ(
        "lora.alpha",
        section.alpha.to_string(),
        file.alpha.to_string(),
    );
    differ(
        "lora.use_rslora",
        section.use_rslora.to_string(),
        file.use_rslora.to_string(),
    );
    if l.target_modules.is_some() {
        let sorted = |v: &[String]| {
            let mut v = v.to_vec();
            v.sort();
            v.dedup();
            format!("{v:?}")
        };
        differ(
            "lora.target_modules",
            sorted(&section.target_modules),
            sorted(&file.target_modules),
        );
    }
    if !differences.is_empty() {
        p.push(PreflightProblem::LoraInitMismatch {
            path: path.to_path_buf(),
            describe: import.describe(),
            differences,
        });
        return None;
    }
    if let Some(given) = import.dropout_zeroed {
        warnings.push(PreflightWarning::LoraInitDropoutZeroed {
            path: path.to_path_buf(),
            given,
        });
    }
    Some(Trainable::LoraFrom(LoraInit {
        config: import.config,
        path: path.to_path_buf(),
        dropout: l.init_dropout.policy(),
    }))
}

/// The rollout batch and its split into updates and micro-batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchGeometry {
    /// Groups per rollout.
    pub prompts_per_rollout: usize,
    /// Candidates per group.
    pub group_size: usize,
    /// `prompts_per_rollout * group_size` (`--global-batch-size`).
    pub global_batch_size: usize,
    /// Disjoint optimizer updates per rollout.
    pub num_updates_per_batch: usize,
    /// Samples per update (the optimizer-step boundary).
    pub update_size: usize,
    /// Samples per micro-batch.
    pub micro_batch_size: usize,
}

/// AdamW's hyperparameters, validated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWSettings {
    /// `beta1`.
    pub beta1: f64,
    /// `beta2`.
    pub beta2: f64,
    /// `eps`.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
}

impl AdamWSettings {
    /// burn's AdamW configuration (no gradient clipping: the trainer clips by the global norm
    /// itself).
    pub fn adamw_config(&self) -> burn::optim::AdamWConfig {
        burn::optim::AdamWConfig::new()
            .with_beta_1(self.beta1 as f32)
            .with_beta_2(self.beta2 as f32)
            .with_epsilon(self.eps as f32)
            .with_weight_decay(self.weight_decay as f32)
    }
}

/// The algorithm of `[algorithm]`, validated.
#[derive(Debug, Clone, PartialEq)]
pub enum AlgorithmPlan {
    /// FlowGRPO with its clip range.
    FlowGrpo {
        /// The PPO clip range.
        clip_range: ClipRange,
        /// Where pi_old comes from.
        anchor: AnchorSource,
        /// The weight of the transitions' KL to the reference policy.
        kl_coef: f64,
        /// DanceGRPO's per-sample timestep subsets, when configured.
        timestep_subset: Option<TimestepSubset>,
    },
    /// AWM with its ratio band, weighting and advantage limit.
    Awm {
        /// The ratio band.
        clip_range: ClipRange,
        /// The log-likelihood surrogate's weighting.
        weighting: AwmWeighting,
        /// The advantage clip and rescale.
        advantage_limit: f64,
        /// The weight of the velocity KL to the reference policy.
        kl_coef: f64,
        /// The weight of the velocity KL to the EMA copy.
        ema_kl_coef: f64,
    },
    /// RAFT, best-of-N fine-tuning.
    Raft {
        /// Candidates of each group fine-tuned on.
        top_k: usize,
    },
    /// Paired finite differences.
    Fdfo {
        /// SPO's `ε`.
        eps: f64,
    },
    /// DPOK.
    Dpok {
        /// The clamp band.
        clip_range: ClipRange,
        /// The reward weight.
        reward_weight: f64,
        /// The weight of the transitions' KL to the reference policy.
        kl_coef: f64,
        /// Rollouts left without the KL term at the start.
        kl_warmup_rollouts: u64,
        /// Where pi_old comes from.
        anchor: AnchorSource,
        /// The learned value baseline, if any.
        value_baseline: Option<ValueBaselineSettings>,
    },
    /// GRPO-Guard.
    GrpoGuard {
        /// The PPO band of the regulated ratio.
        clip_range: ClipRange,
        /// The weight of the transitions' KL to the reference policy.
        kl_coef: f64,
    },
    /// Online Diffusion / Flow-DPO.
    Dpo {
        /// The inverse temperature.
        beta: f64,
    },
    /// DiffusionNFT.
    Nft {
        /// The implicit policies' guidance strength.
        beta: f64,
        /// The advantage clip of the optimality mapping.
        advantage_limit: f64,
        /// The sampling copy's soft update.
        soft_update: flow_grpo::SoftUpdate,
        /// The weight of the velocity anchor on the reference policy.
        kl_coef: f64,
    },
}

/// The plan of trained steps a config resolves to: the schedule crate's resolution of the
/// `sde_*` keys, or MixGRPO's sliding window (`sampling.sde_window`).
#[derive(Debug, Clone, PartialEq)]
pub enum TrainedPlan {
    /// Resample, explicit steps or fraction-window picks.
    Configured(ConfiguredPlan),
    /// MixGRPO's sliding window.
    Sliding(SlidingWindow),
}

impl TrainedPlan {
    fn inner(&self) -> &dyn SdeStepPlan {
        match self {
            TrainedPlan::Configured(p) => p,
            TrainedPlan::Sliding(p) => p,
        }
    }
}

impl SdeStepPlan for TrainedPlan {
    fn name(&self) -> &'static str {
        self.inner().name()
    }

    fn num_steps(&self) -> usize {
        self.inner().num_steps()
    }

    fn steps(&self, query: PlanQuery) -> Result<SdeSteps, ScheduleError> {
        self.inner().steps(query)
    }

    fn reachable(&self) -> Vec<RouteSteps> {
        self.inner().reachable()
    }
}

/// What a successful preflight hands to the training loop.
#[derive(Debug, Clone)]
pub struct Preflight {
    /// Legal but suspicious settings, to log loudly.
    pub warnings: Vec<PreflightWarning>,
    /// Full or LoRA (with its validated configuration).
    pub trainable: Trainable,
    /// The sigma schedule of `sampling` (height, width, steps).
    pub schedule: Schedule,
    /// The evaluation's sigma schedule: `schedule`, or the same policy at
    /// `eval.num_inference_steps`.
    pub eval_schedule: Schedule,
    /// The steps at which the evaluation takes the rollouts' SDE transition: the plan's
    /// evaluation steps under `eval.sampling = "sde"`, none under `"ode"`.
    pub eval_sde_steps: SdeSteps,
    /// Under `eval.sde_gap`: the steps at which the evaluation's second sampling of the same
    /// pictures takes the rollouts' SDE transition (the plan's evaluation steps).
    pub eval_gap_steps: Option<SdeSteps>,
    /// The resolved plan of trained SDE steps.
    pub plan: TrainedPlan,
    /// The SDE of the trained steps.
    pub sde: SdeType,
    /// Batch geometry.
    pub batch: BatchGeometry,
    /// The update plan of one rollout batch.
    pub update_plan: UpdatePlan,
    /// The validated algorithm.
    pub algorithm: AlgorithmPlan,
    /// The EMA of the trained weights (`[ema]`), if any.
    pub ema: Option<EmaSettings>,
    /// The advantage configuration (flow-grpo's reference conventions with this config's std
    /// mode and components).
    pub advantages: AdvantageConfig,
    /// The learning-rate schedule.
    pub lr: LrSchedule,
    /// AdamW's hyperparameters.
    pub adamw: AdamWSettings,
    /// The ranks the run's rollout batch is shared by ([`Preflight::for_ranks`]); 1 unless
    /// set there.
    pub ranks: usize,
}

impl Preflight {
    /// This preflight for a run of `ranks` ranks that share each rollout batch
    /// ([`crate::workers::Workers::group_shard`]): every update's prompt groups split equally
    /// among the ranks, and `update_plan` becomes one rank's plan — its share of the batch in
    /// as many updates, with the same micro-batch size. The union over ranks of their update
    /// `u` is the one-rank update `u`.
    ///
    /// ```
    /// use trainer_fsdp::{RecipeName, TrainConfig};
    /// let cfg = TrainConfig::from_recipe(RecipeName::ShapesWorldLora, &[]).unwrap();
    /// let one = cfg.preflight().unwrap();
    /// let two = one.clone().for_ranks(2).unwrap();
    /// assert_eq!(two.update_plan.num_samples * 2, one.update_plan.num_samples);
    /// assert_eq!(two.update_plan.updates.len(), one.update_plan.updates.len());
    /// assert!(one.for_ranks(7).is_err());
    /// ```
    ///
    /// # Errors
    /// [`TrainerError::Preflight`] listing every problem: prompt groups that are not a
    /// multiple of updates x ranks, a micro-batch size that does not divide one rank's share
    /// of an update, no ranks.
    pub fn for_ranks(mut self, ranks: usize) -> Result<Self, TrainerError> {
        if ranks == self.ranks {
            return Ok(self);
        }
        let b = &self.batch;
        let updates = b.num_updates_per_batch;
        let mut problems = Vec::new();
        let parts = updates * ranks;
        if ranks == 0 || !b.prompts_per_rollout.is_multiple_of(parts) {
            problems.push(PreflightProblem::OutOfRange {
                key: "rollout.prompts_per_rollout",
                given: format!(
                    "{} (with {updates} updates per batch on {ranks} ranks)",
                    b.prompts_per_rollout
                ),
                allowed: "a multiple of num_updates_per_batch x ranks: each rank rolls out \
                          whole prompt groups, an equal share of every update",
            });
        } else {
            let share = b.update_size / ranks;
            if !share.is_multiple_of(b.micro_batch_size) {
                problems.push(PreflightProblem::MicroBatchNotDivisible {
                    chunk: share,
                    micro_batch_size: b.micro_batch_size,
                });
            }
        }
        if !problems.is_empty() {
            return Err(TrainerError::Preflight { problems });
        }
        let local = b.global_batch_size / ranks;
        self.update_plan = plan_updates(local, updates, b.micro_batch_size).map_err(|source| {
            TrainerError::Preflight {
                problems: vec![PreflightProblem::Advantages { source }],
            }
        })?;
        self.ranks = ranks;
        Ok(self)
    }
}

const GIB: f64 = (1u64 << 30) as f64;

/// `MemAvailable` of `/proc/meminfo` in bytes (`None` where there is no such file).
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The host memory a shapes-world run's two largest buffers need, estimated from the config:
/// a rollout's sampler output (every sample's latents at every step in f32, twice: the output
/// and its stored copy) and an evaluation's samples (final latents in f32 and the decoded
/// pictures as floats, for every held-out prompt and seed). Returns `(rollout, evaluation)`.
pub fn shapes_memory_estimate(cfg: &TrainConfig) -> (u64, u64) {
    use crate::shapes_world::{TOKEN_CHANNELS, TOKEN_GRID, eval_prompts};
    let latent = (TOKEN_GRID * TOKEN_GRID * TOKEN_CHANNELS * 4) as u64;
    let side = reward::shapes::IMAGE_SIZE as u64;
    let picture = side * side * 3 * 4;
    let steps = cfg.sampling.num_inference_steps as u64 + 1;
    let rollout_samples =
        (cfg.rollout.prompts_per_rollout as u64).saturating_mul(cfg.rollout.group_size as u64);
    let rollout = rollout_samples.saturating_mul(2 * steps * latent + picture);
    let held_out = match &cfg.data.eval {
        Some(path) => crate::shapes_world::read_prompt_file(path).map_or(0, |v| v.len()),
        None => eval_prompts().len(),
    };
    let eval_samples = (held_out as u64).saturating_mul(cfg.eval.samples_per_prompt as u64);
    let eval = eval_samples.saturating_mul(latent + picture);
    (rollout, eval)
}

/// The memory problems of a shapes-world config on a machine with `available` bytes free.
pub fn shapes_memory_problems(cfg: &TrainConfig, available: u64) -> Vec<PreflightProblem> {
    let (rollout, eval) = shapes_memory_estimate(cfg);
    let mut out = Vec::new();
    if rollout > available {
        out.push(PreflightProblem::Memory {
            what: "a rollout (rollout.prompts_per_rollout x rollout.group_size samples)",
            needs: rollout,
            available,
        });
    }
    if cfg.eval.interval > 0 && eval > available {
        out.push(PreflightProblem::Memory {
            what: "an evaluation (eval.samples_per_prompt for each held-out prompt)",
            needs: eval,
            available,
        });
    }
    out
}

/// The largest `eval.samples_per_prompt` preflight accepts.
pub const MAX_EVAL_SAMPLES_PER_PROMPT: usize = 4096;
/// The most samples per rollout (`prompts_per_rollout x group_size`) preflight accepts.
pub const MAX_ROLLOUT_SAMPLES: usize = 65536;

/// One preflight violation, naming the value given and what is allowed.
#[derive(Debug)]
pub enum PreflightProblem {
    /// `run.task` is not a known generation task.
    UnknownTask {
        /// The task given.
        given: String,
    },
    /// `model.trainable_mode` and `lora.rank` disagree.
    TrainableModeRank {
        /// The mode given.
        mode: TrainableMode,
        /// The LoRA rank given (0 without a `[lora]` section).
        lora_rank: usize,
    },
    /// LoRA dropout is not 0.
    LoraDropout {
        /// The dropout given.
        given: f64,
    },
    /// `lora.init_from` cannot be read as an adapter.
    LoraInit {
        /// The path given.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// The `lora.init_from` adapter was saved with dropout and `lora.init_dropout` refuses it.
    LoraInitDropout {
        /// The path given.
        path: PathBuf,
        /// Its dropout.
        given: f64,
    },
    /// The `lora.init_from` adapter's configuration differs from the `[lora]` section.
    LoraInitMismatch {
        /// The path given.
        path: PathBuf,
        /// The import's own account (form, rank, alpha and where alpha came from).
        describe: String,
        /// `(key, section's value, file's value)` of every difference.
        differences: Vec<(&'static str, String, String)>,
    },
    /// A `[data]` prompt file the world cannot use.
    Data {
        /// `data.train` or `data.eval`.
        key: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// Another invalid LoRA setting.
    Lora {
        /// dit-models' description of it.
        problem: dit_models::ConfigProblem,
    },
    /// `guidance_scale != 1` while the replay is a single positive-conditioned forward.
    GuidanceWithSingleForwardReplay {
        /// The guidance scale given.
        given: f64,
    },
    /// The schedule cannot be built (scheduler config, geometry, step count).
    Schedule {
        /// The schedule crate's error.
        source: ScheduleError,
    },
    /// A problem of the trained SDE steps (e.g. a trainable step 0 under Flow-SDE).
    TrainedSteps(PlanProblem),
    /// No required reward component.
    NoRequiredRewardComponent,
    /// A required reward component has no weight.
    RequiredComponentWithoutWeight {
        /// The component.
        component: String,
    },
    /// A reward weight is not finite.
    RewardWeight {
        /// The component.
        component: String,
        /// The weight.
        weight: f64,
    },
    /// flow-grpo rejected the advantage configuration or the update plan.
    Advantages {
        /// flow-grpo's error.
        source: flow_grpo::FlowGrpoError,
    },
    /// `prompts_per_rollout * group_size` is not divisible by `num_updates_per_batch`.
    UpdatesNotDivisible {
        /// Prompts per rollout.
        prompts_per_rollout: usize,
        /// Group size.
        group_size: usize,
        /// Updates per batch.
        num_updates_per_batch: usize,
    },
    /// The update chunk is not divisible by `micro_batch_size`.
    MicroBatchNotDivisible {
        /// Samples per update.
        chunk: usize,
        /// The micro-batch size.
        micro_batch_size: usize,
    },
    /// Two scorers produce the same component.
    ScorersOverlap {
        /// The component.
        component: String,
        /// The first scorer producing it.
        first: String,
        /// The second.
        second: String,
    },
    /// A required or weighted component no configured scorer produces.
    ComponentWithoutScorer {
        /// The component.
        component: String,
        /// The configured scorers.
        scorers: String,
    },
    /// A decaying learning-rate shape without `lr_decay_iters`.
    DecayItersMissing {
        /// The scheduler.
        scheduler: LrSchedulerKind,
    },
    /// `lr_decay_iters <= lr_warmup_iters` under a decaying shape.
    DecayWithinWarmup {
        /// The scheduler.
        scheduler: LrSchedulerKind,
        /// `lr_decay_iters`.
        decay_iters: u64,
        /// `lr_warmup_iters`.
        warmup_iters: u64,
    },
    /// A value outside its allowed range.
    OutOfRange {
        /// The dotted key.
        key: &'static str,
        /// The value given.
        given: String,
        /// What is allowed.
        allowed: &'static str,
    },
    /// The run's largest host buffers would not fit the memory available.
    Memory {
        /// What needs it (`a rollout`, `an evaluation`) and the keys that size it.
        what: &'static str,
        /// Bytes it needs (estimated).
        needs: u64,
        /// Bytes available (`MemAvailable`).
        available: u64,
    },
}

impl PreflightProblem {
    fn is_reward(&self) -> bool {
        matches!(
            self,
            PreflightProblem::NoRequiredRewardComponent
                | PreflightProblem::RequiredComponentWithoutWeight { .. }
                | PreflightProblem::RewardWeight { .. }
                | PreflightProblem::ScorersOverlap { .. }
                | PreflightProblem::ComponentWithoutScorer { .. }
        )
    }
}

impl fmt::Display for PreflightProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PreflightProblem::UnknownTask { given } => write!(
                f,
                "run.task = {given:?}; allowed: {GENERATION_TASKS:?} (a task needs a working rollout and replay path)"
            ),
            PreflightProblem::TrainableModeRank { mode, lora_rank } => match mode {
                TrainableMode::Full => write!(
                    f,
                    "model.trainable_mode = \"full\" with lora.rank = {lora_rank}; full fine-tuning requires rank 0 \
                     (remove [lora] or set model.trainable_mode = \"lora\")"
                ),
                TrainableMode::Lora => write!(
                    f,
                    "model.trainable_mode = \"lora\" with lora.rank = {lora_rank}; LoRA requires a [lora] section with rank > 0"
                ),
            },
            PreflightProblem::LoraDropout { given } => write!(
                f,
                "lora.dropout = {given}; allowed: 0 (the pi_old anchor is a replay through the live model, so a stochastic \
                 forward breaks ratio == 1 of the first update and at eps_clip 1e-4 clips essentially everything)"
            ),
            PreflightProblem::Data { key, problem } => write!(f, "{key}: {problem}"),
            PreflightProblem::LoraInit { path, problem } => {
                write!(f, "lora.init_from = {}: {problem}", path.display())
            }
            PreflightProblem::LoraInitDropout { path, given } => write!(
                f,
                "lora.init_from = {}: the adapter was saved with lora_dropout {given}; RL replays need \
                 dropout 0 — set lora.init_dropout = \"zero\" to start from it with dropout 0",
                path.display()
            ),
            PreflightProblem::LoraInitMismatch {
                path,
                describe,
                differences,
            } => write!(
                f,
                "lora.init_from = {}: the adapter differs from the [lora] section: {} ({describe}); \
                 set the section to the adapter's values",
                path.display(),
                differences
                    .iter()
                    .map(|(k, a, b)| format!("{k} = {a} but the adapter has {b}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            PreflightProblem::Lora { problem } => write!(
                f,
                "lora.{} = {}; allowed: {}",
                problem.field, problem.given, problem.allowed
            ),
            PreflightProblem::GuidanceWithSingleForwardReplay { given } => write!(
                f,
                "sampling.guidance_scale = {given}; allowed: 1.0 (the replay is a single positive-conditioned forward, so a \
                 CFG rollout would train against a policy it never sampled from; two-forward CFG replay is not implemented)"
            ),
            PreflightProblem::Schedule { source } => write!(f, "sampling: {source}"),
            PreflightProblem::TrainedSteps(problem) => write!(f, "sampling: {problem}"),
            PreflightProblem::NoRequiredRewardComponent => write!(
                f,
                "reward.required_components = []; allowed: at least one component (a sample scored by nothing would train on 0)"
            ),
            PreflightProblem::RequiredComponentWithoutWeight { component } => write!(
                f,
                "reward.required_components lists {component:?} but reward.component_weights has no weight for it"
            ),
            PreflightProblem::RewardWeight { component, weight } => write!(
                f,
                "reward.component_weights.{component} = {weight}; allowed: a finite value"
            ),
            PreflightProblem::Advantages { source } => write!(f, "{source}"),
            PreflightProblem::UpdatesNotDivisible {
                prompts_per_rollout,
                group_size,
                num_updates_per_batch,
            } => write!(
                f,
                "rollout.num_updates_per_batch = {num_updates_per_batch} does not divide the rollout batch of \
                 {prompts_per_rollout} prompts x {group_size} candidates = {}; every sample must fall in exactly one \
                 of {num_updates_per_batch} equal updates",
                prompts_per_rollout * group_size
            ),
            PreflightProblem::MicroBatchNotDivisible {
                chunk,
                micro_batch_size,
            } => write!(
                f,
                "rollout.micro_batch_size = {micro_batch_size} does not divide the update of {chunk} samples; allowed: a \
                 divisor of {chunk} (unequal micro-batches would reweight the mean)"
            ),
            PreflightProblem::ScorersOverlap {
                component,
                first,
                second,
            } => write!(
                f,
                "reward.scorers and eval.judges: {first} and {second} both produce component {component:?}; allowed: one scorer per component"
            ),
            PreflightProblem::ComponentWithoutScorer { component, scorers } => write!(
                f,
                "reward component {component:?} is required or weighted, but no scorer of reward.scorers = {scorers} produces it"
            ),
            PreflightProblem::DecayItersMissing { scheduler } => write!(
                f,
                "optimizer.lr_scheduler = {scheduler:?} needs optimizer.lr_decay_iters (the step at which the rate reaches min_lr)"
            ),
            PreflightProblem::DecayWithinWarmup {
                scheduler,
                decay_iters,
                warmup_iters,
            } => write!(
                f,
                "optimizer.lr_decay_iters = {decay_iters} under {scheduler:?}; allowed: > lr_warmup_iters = {warmup_iters} \
                 (both count optimizer steps from 0)"
            ),
            PreflightProblem::OutOfRange {
                key,
                given,
                allowed,
            } => write!(f, "{key} = {given}; allowed: {allowed}"),
            PreflightProblem::Memory {
                what,
                needs,
                available,
            } => write!(
                f,
                "{what} would hold about {:.1} GiB in host memory, more than the {:.1} GiB \
                 available: make it smaller",
                *needs as f64 / GIB,
                *available as f64 / GIB
            ),
        }
    }
}

/// Something legal but suspicious, reported without failing the preflight.
#[derive(Debug, Clone, PartialEq)]
pub enum PreflightWarning {
    /// `num_updates_per_batch = 1`: the ratio is always exactly 1.
    SingleUpdatePerBatch,
    /// LoRA without fp32 master weights.
    LoraWithoutFp32Master {
        /// The master dtype given.
        master_dtype: Option<MasterDtype>,
    },
    /// `artifacts.retention_rollouts <= 0` keeps every rollout.
    UnboundedArtifacts {
        /// The value given.
        retention_rollouts: i64,
    },
    /// A schedule-crate warning about the trained steps (a trainable last step).
    TrainedSteps(PlanWarning),
    /// `eval.interval = 0`.
    EvaluationOff,
    /// The `lora.init_from` adapter's dropout was set to 0 (`lora.init_dropout = "zero"`).
    LoraInitDropoutZeroed {
        /// The adapter.
        path: PathBuf,
        /// The dropout it was saved with.
        given: f64,
    },
}

impl fmt::Display for PreflightWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PreflightWarning::SingleUpdatePerBatch => {
                write!(f, "rollout.{}", UpdatePlanWarning::SingleUpdate)
            }
            PreflightWarning::LoraWithoutFp32Master { master_dtype } => write!(
                f,
                "model.master_dtype = {master_dtype:?} under LoRA; set \"fp32\": with bf16 masters the ~1e-4 relative RL \
                 updates round off, grad norm and loss stay healthy while the policy stops moving"
            ),
            PreflightWarning::UnboundedArtifacts { retention_rollouts } => write!(
                f,
                "artifacts.retention_rollouts = {retention_rollouts} keeps every rollout's sidecars and images; the \
                 artifact root grows without bound"
            ),
            PreflightWarning::TrainedSteps(w) => write!(f, "sampling: {w}"),
            PreflightWarning::EvaluationOff => {
                write!(f, "eval.interval = 0: no held-out evaluation will run")
            }
            PreflightWarning::LoraInitDropoutZeroed { path, given } => write!(
                f,
                "lora.init_from = {}: its lora_dropout {given} is set to 0 for RL (lora.init_dropout = \"zero\")",
                path.display()
            ),
        }
    }
}

/// Reads `[data] train` and `[data] eval` once each with the world's reader, adding each
/// file's problem to `p`; the training file's prompts: `None` without a training file,
/// `Some(None)` when it did not read.
fn read_data_files<T>(
    data: &DataSection,
    p: &mut Vec<PreflightProblem>,
    read: impl Fn(&Path) -> Result<Vec<(String, T)>, TrainerError>,
) -> Option<Option<Vec<String>>> {
    let mut train = None;
    for (key, path) in [("data.train", &data.train), ("data.eval", &data.eval)] {
        let Some(path) = path else { continue };
        let prompts = match read(path) {
            Ok(records) => Some(records.into_iter().map(|(prompt, _)| prompt).collect()),
            Err(e) => {
                p.push(PreflightProblem::Data {
                    key,
                    problem: e.to_string(),
                });
                None
            }
        };
        if key == "data.train" {
            train = Some(prompts);
        }
    }
    train
}
