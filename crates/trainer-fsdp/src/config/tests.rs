use super::*;

fn flow_grpo(c: &TrainConfig) -> &FlowGrpoSection {
    let AlgorithmSection::FlowGrpo(a) = &c.algorithm else {
        panic!("a FlowGRPO config")
    };
    a
}

fn flow_grpo_mut(c: &mut TrainConfig) -> &mut FlowGrpoSection {
    let AlgorithmSection::FlowGrpo(a) = &mut c.algorithm else {
        panic!("a FlowGRPO config")
    };
    a
}

fn problems(cfg: &TrainConfig) -> Vec<String> {
    match cfg.preflight() {
        Ok(_) => Vec::new(),
        Err(TrainerError::Preflight { problems }) => {
            problems.iter().map(ToString::to_string).collect()
        }
        Err(other) => panic!("unexpected error {other}"),
    }
}

#[test]
fn the_recipes_pass_preflight_without_warnings() {
    for r in RecipeName::ALL {
        let p = r
            .config()
            .preflight()
            .unwrap_or_else(|e| panic!("{r:?}: {e}"));
        assert!(p.warnings.is_empty(), "{r:?}: {:?}", p.warnings);
    }
    let p = TrainConfig::qwen_image_t2i_lora().preflight().unwrap();
    assert_eq!(p.batch.global_batch_size, 256);
    assert_eq!(p.batch.update_size, 128);
    assert_eq!(p.update_plan.updates.len(), 2);
    assert_eq!(p.update_plan.updates[1].micro_batches.len(), 128);
    let Trainable::Lora(lora) = &p.trainable else {
        panic!("LoRA recipe");
    };
    assert_eq!((lora.rank, lora.alpha, lora.dropout), (64, 128.0, 0.0));
    assert_eq!(lora.target_modules.len(), 8);
    let AlgorithmPlan::FlowGrpo { clip_range, .. } = &p.algorithm else {
        panic!("a FlowGRPO plan")
    };
    assert_eq!(clip_range.low(), 1e-4);
    assert_eq!(p.lr.lr_at_step(0), 3e-4);
    assert_eq!(p.advantages.std_mode, StdMode::Group);
    use schedule::{PlanQuery, SdeStepPlan};
    assert_eq!(
        p.plan.steps(PlanQuery::evaluation()).unwrap().as_slice(),
        &[3, 4, 5]
    );
    let full = TrainConfig::qwen_image_t2i_full().preflight().unwrap();
    assert_eq!(full.trainable, Trainable::Full);
    assert_eq!(full.batch.global_batch_size, 64);
    assert_eq!(full.lr.lr_at_step(0), 3e-5 / 20.0);
}

#[test]
fn host_threads_default_to_the_cores_and_zero_is_rejected() {
    let mut c = TrainConfig::shapes_world_lora();
    assert_eq!(c.run.host_threads, None);
    assert!(c.run.threads() >= 1);
    c.run.host_threads = Some(3);
    assert_eq!(c.run.threads(), 3);
    assert!(c.preflight().is_ok());
    c.run.host_threads = Some(0);
    let text = problems(&c);
    assert_eq!(text.len(), 1, "{text:?}");
    assert!(text[0].contains("run.host_threads"), "{text:?}");
}

#[test]
fn a_bad_config_reports_every_violation_at_once() {
    let mut c = TrainConfig::qwen_image_t2i_lora();
    c.run.task = "i2v".into();
    c.model.trainable_mode = TrainableMode::Full; // with rank 64
    c.sampling.guidance_scale = 4.5;
    c.sampling.sde_pool = Some(vec![0, 1, 2, 3]);
    c.reward.required_components.push("aesthetic".into());
    c.rollout.prompts_per_rollout = 3;
    c.rollout.group_size = 3;
    c.rollout.num_updates_per_batch = 2;
    flow_grpo_mut(&mut c).kl_coef = -0.04;
    c.optimizer.lr_scheduler = LrSchedulerKind::Cosine;
    let text = problems(&c);
    let expect = [
        "run.task = \"i2v\"",
        "trainable_mode = \"full\" with lora.rank = 64",
        "guidance_scale = 4.5",
        "step(s) [0]",
        "\"aesthetic\" but reward.component_weights has no weight",
        "component \"aesthetic\" is required or weighted, but no scorer",
        "rollout.num_updates_per_batch = 2 does not divide the rollout batch of 3 prompts x 3 candidates = 9",
        "algorithm.kl_coef = -0.04",
        "needs optimizer.lr_decay_iters",
    ];
    assert_eq!(text.len(), expect.len(), "{text:#?}");
    for (t, e) in text.iter().zip(expect) {
        assert!(t.contains(e), "{t:?} should contain {e:?}");
    }
    // the error's own message lists them all too
    let msg = c.preflight().unwrap_err().to_string();
    assert!(msg.contains("9 problem(s)"), "{msg}");
}

#[test]
fn lora_specific_problems() {
    let mut c = TrainConfig::qwen_image_t2i_lora();
    let l = c.lora.as_mut().unwrap();
    l.dropout = 0.1;
    l.alpha = 0.0;
    l.target_modules = Some(vec![]);
    let text = problems(&c);
    assert_eq!(text.len(), 3, "{text:#?}");
    assert!(text.iter().any(|t| t.contains("lora.alpha = 0")));
    assert!(text.iter().any(|t| t.contains("lora.target_modules = []")));
    assert!(text.iter().any(|t| t.starts_with("lora.dropout = 0.1")));

    // dropout alone
    let mut c = TrainConfig::qwen_image_t2i_lora();
    c.lora.as_mut().unwrap().dropout = 0.05;
    assert_eq!(problems(&c).len(), 1);

    // lora mode without a rank
    let mut c = TrainConfig::qwen_image_t2i_lora();
    c.lora = None;
    let text = problems(&c);
    assert_eq!(text.len(), 1);
    assert!(text[0].contains("trainable_mode = \"lora\" with lora.rank = 0"));
}

#[test]
fn micro_batch_and_ranges() {
    let mut c = TrainConfig::qwen_image_t2i_lora();
    c.rollout.micro_batch_size = 3; // 128 % 3 != 0
    flow_grpo_mut(&mut c).eps_clip = 0.0;
    c.optimizer.clip_grad = f64::NAN;
    c.optimizer.adam_beta2 = 1.0;
    c.optimizer.adam_eps = 1e-50; // 0 in f32
    c.sampling.eta = 0.0;
    c.checkpoint.save_interval = 0;
    c.reward
        .component_weights
        .insert("extra".into(), f64::INFINITY);
    let text = problems(&c);
    let expect = [
        "sampling.eta = 0",
        "reward.component_weights.extra = inf",
        "component \"extra\" is required or weighted, but no scorer",
        "rollout.micro_batch_size = 3 does not divide the update of 128 samples",
        "algorithm.eps_clip = 0",
        "optimizer.clip_grad = NaN",
        "optimizer.adam_beta2 = 1",
        "optimizer.adam_eps = 0.00000000000000000000000000000000000000000000000001",
        "checkpoint.save_interval = 0",
    ];
    assert_eq!(text.len(), expect.len(), "{text:#?}");
    for (t, e) in text.iter().zip(expect) {
        assert!(t.contains(e), "{t:?} should contain {e:?}");
    }
}

#[test]
fn warnings_are_reported_without_failing() {
    let mut c = TrainConfig::qwen_image_t2i_lora();
    c.rollout.num_updates_per_batch = 1;
    c.model.master_dtype = None;
    c.artifacts.retention_rollouts = 0;
    c.eval.interval = 0;
    c.sampling.sde_pool = Some(vec![1, 2, 3, 11]); // 11 is the last of 12 steps
    let p = c.preflight().unwrap();
    let w: Vec<String> = p.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(p.warnings.len(), 5, "{w:#?}");
    assert!(p.warnings.contains(&PreflightWarning::SingleUpdatePerBatch));
    assert!(
        w.iter()
            .any(|s| s.contains("clipped loss is 0 by construction"))
    );
    assert!(
        p.warnings
            .contains(&PreflightWarning::LoraWithoutFp32Master { master_dtype: None })
    );
    assert!(w.iter().any(|s| s.contains("last step 11")), "{w:#?}");
}

#[test]
fn toml_round_trip_and_overrides() {
    let c = TrainConfig::qwen_image_t2i_lora();
    let text = c.to_toml_string().unwrap();
    let back = TrainConfig::from_toml_str(&text, None, &[]).unwrap();
    assert_eq!(back, c);

    let o = Override::parse_all(&[
        "algorithm.eps_clip=2e-4",
        "sampling.sde_indices=[1, 3, 5]",
        "checkpoint.dir=runs/elsewhere",
        "lora.target_modules=[\"attn.to_q\"]",
    ])
    .unwrap();
    let c2 = TrainConfig::from_toml_str("recipe = \"qwen_image_t2i_lora\"", None, &o).unwrap();
    assert_eq!(flow_grpo(&c2).eps_clip, 2e-4);
    assert_eq!(c2.sampling.sde_indices, Some(vec![1, 3, 5]));
    assert_eq!(c2.checkpoint.dir, PathBuf::from("runs/elsewhere"));
    assert_eq!(
        c2.lora.as_ref().unwrap().target_modules,
        Some(vec!["attn.to_q".to_string()])
    );
    assert!(c2.preflight().is_ok());

    // an override of the recipe picks the base; the file and other overrides apply on top
    let o = Override::parse_all(&["recipe=qwen_image_t2i_full", "rollout.group_size=4"]).unwrap();
    let c3 = TrainConfig::from_toml_str(
        "recipe = \"qwen_image_t2i_lora\"\n[optimizer]\nlr = 1e-5\n",
        None,
        &o,
    )
    .unwrap();
    assert_eq!(c3.recipe, Some(RecipeName::QwenImageT2iFull));
    assert_eq!(c3.rollout.prompts_per_rollout, 8);
    assert_eq!(c3.rollout.group_size, 4);
    assert_eq!(c3.optimizer.lr, 1e-5);
    assert_eq!(c3.lora, None);
}

#[test]
fn no_silent_defaults_and_no_unknown_keys() {
    let c = TrainConfig::qwen_image_t2i_lora();
    let mut table = toml::Table::try_from(&c).unwrap();
    table.remove("recipe");
    table["algorithm"]
        .as_table_mut()
        .unwrap()
        .remove("eps_clip");
    let text = toml::to_string(&table).unwrap();
    let err = TrainConfig::from_toml_str(&text, None, &[]).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("eps_clip"), "{msg}");

    let err = TrainConfig::from_toml_str(
        "recipe = \"qwen_image_t2i_lora\"\n[algorithm]\nepsclip = 0.1\n",
        Some(Path::new("my.toml")),
        &[],
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("my.toml") && msg.contains("epsclip"), "{msg}");

    let err = TrainConfig::from_toml_str("recipe = \"sd3\"", None, &[]).unwrap_err();
    assert!(err.to_string().contains("qwen_image_t2i_lora"), "{err}");

    let err = TrainConfig::qwen_image_t2i_lora()
        .with_overrides(&[Override::parse("algorithm.eps_clip.x=1").unwrap()])
        .unwrap_err();
    assert!(
        err.to_string().contains("algorithm.eps_clip is a value"),
        "{err}"
    );

    // an unknown algorithm kind names the known ones
    let err = TrainConfig::qwen_image_t2i_lora()
        .with_overrides(&[Override::parse("algorithm.kind=ppo").unwrap()])
        .unwrap_err();
    let msg = err.to_string();
    for kind in [
        "ppo",
        "grpo_guard",
        "flow_grpo",
        "awm",
        "nft",
        "dpo",
        "dpok",
        "fdfo",
        "raft",
    ] {
        assert!(msg.contains(kind), "{kind}: {msg}");
    }
}

#[test]
fn keys_of_the_former_grpo_section_name_their_new_place() {
    let err = TrainConfig::from_toml_str(
        "recipe = \"shapes_world_lora\"\n[grpo]\ngroup_size = 4\nclip_grad = 0.5\n",
        Some(Path::new("old.toml")),
        &[Override::parse("grpo.eps_clip=2e-4").unwrap()],
    )
    .unwrap_err();
    let TrainerError::MovedKeys { origin, moved } = &err else {
        panic!("{err}");
    };
    assert_eq!(origin, Path::new("old.toml"));
    let pairs: Vec<(&str, &str)> = moved
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    assert_eq!(pairs[0], ("grpo.clip_grad", "optimizer.clip_grad"));
    assert_eq!(pairs[1], ("grpo.group_size", "rollout.group_size"));
    assert!(pairs[2].0 == "grpo.eps_clip" && pairs[2].1.starts_with("algorithm.eps_clip"));
    let msg = err.to_string();
    assert!(
        msg.contains("grpo.group_size is now rollout.group_size"),
        "{msg}"
    );

    // an override alone, on a recipe
    let err = TrainConfig::shapes_world_lora()
        .with_overrides(&[Override::parse("grpo.micro_batch_size=8").unwrap()])
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("grpo.micro_batch_size is now rollout.micro_batch_size"),
        "{err}"
    );
    // every moved key has a home that parses
    for (_, new) in MOVED_KEYS {
        let key = new.split(' ').next().unwrap();
        let (section, field) = key.split_once('.').unwrap();
        let table = toml::Table::try_from(TrainConfig::qwen_image_t2i_lora()).unwrap();
        assert!(
            table[section].as_table().unwrap().contains_key(field) || field == "eps_clip_high",
            "{key}"
        );
    }
}

#[test]
fn scorers_must_produce_the_configured_components() {
    let mut c = TrainConfig::shapes_world_lora();
    c.reward.scorers = vec![ScorerSpec::JpegCompressibility];
    let text = problems(&c);
    assert_eq!(text.len(), 1, "{text:#?}");
    assert!(text[0].contains("component \"shapes\""), "{text:#?}");

    let mut c = TrainConfig::shapes_world_lora();
    c.reward.scorers = vec![ScorerSpec::Shapes, ScorerSpec::Shapes];
    let text = problems(&c);
    assert_eq!(text.len(), 1, "{text:#?}");
    assert!(
        text[0].contains("both produce component \"shapes\""),
        "{text:#?}"
    );

    let mut c = TrainConfig::shapes_world_lora();
    c.reward.scorers.clear();
    assert!(problems(&c)[0].contains("reward.scorers = []"));

    // the judge's graded shape credit is a scorer of its own, producing the same component,
    // so it replaces the default rather than joining it
    let o = Override::parse_all(&["reward.scorers=[\"shapes_graded\"]"]).unwrap();
    let c = TrainConfig::from_toml_str("recipe = \"shapes_world_lora\"", None, &o).unwrap();
    assert_eq!(c.reward.scorers, vec![ScorerSpec::ShapesGraded]);
    assert!(problems(&c).is_empty(), "{:#?}", problems(&c));
    let mut c = TrainConfig::shapes_world_lora();
    c.reward.scorers.push(ScorerSpec::ShapesGraded);
    let text = problems(&c);
    assert_eq!(text.len(), 1, "{text:#?}");
    assert!(
        text[0].contains("both produce component \"shapes\""),
        "{text:#?}"
    );

    // an optional component from a second scorer is fine
    let mut c = TrainConfig::shapes_world_lora();
    c.reward.scorers.push(ScorerSpec::JpegIncompressibility);
    c.reward
        .component_weights
        .insert("jpeg_incompressibility".into(), 0.1);
    assert!(problems(&c).is_empty());
}

#[test]
fn eval_judges_score_beside_the_reward_and_overlap_nothing() {
    // the shapes recipe judges its evaluations a second time, unweighted
    let c = TrainConfig::shapes_world_lora();
    assert_eq!(c.eval.judges, vec![ScorerSpec::ShapesRerender]);
    assert_eq!(
        c.all_scorers(),
        vec![ScorerSpec::Shapes, ScorerSpec::ShapesRerender]
    );
    assert!(problems(&c).is_empty(), "{:#?}", problems(&c));
    // a judge that is also a reward scorer scores once
    let mut c = TrainConfig::shapes_world_lora();
    c.eval.judges = vec![ScorerSpec::Shapes];
    assert_eq!(c.all_scorers(), vec![ScorerSpec::Shapes]);
    assert!(problems(&c).is_empty(), "{:#?}", problems(&c));
    // a judge producing a reward scorer's component is refused, naming both
    let o = Override::parse_all(&["eval.judges=[\"shapes_graded\"]"]).unwrap();
    let c = TrainConfig::from_toml_str("recipe = \"shapes_world_lora\"", None, &o).unwrap();
    let text = problems(&c);
    assert_eq!(text.len(), 1, "{text:#?}");
    assert!(
        text[0].contains("eval.judges") && text[0].contains("both produce component \"shapes\""),
        "{text:#?}"
    );
    // the JPEG rewards of the README keep the shapes judge's second judgement
    let o = Override::parse_all(&[
        "reward.scorers=[\"jpeg_incompressibility\"]",
        "reward.required_components=[\"jpeg_incompressibility\"]",
        "reward.component_weights={ jpeg_incompressibility = 1.0 }",
    ])
    .unwrap();
    let c = TrainConfig::from_toml_str("recipe = \"shapes_world_lora\"", None, &o).unwrap();
    assert!(problems(&c).is_empty(), "{:#?}", problems(&c));
    assert_eq!(c.all_scorers().len(), 2);
}

#[test]
fn the_shapes_recipe_is_the_lora_recipe_scaled() {
    let (a, b) = (
        TrainConfig::qwen_image_t2i_lora(),
        TrainConfig::shapes_world_lora(),
    );
    // the same FlowGRPO section but for flow_grpo's GenEval KL
    let AlgorithmSection::FlowGrpo(mut kl) = a.algorithm.clone() else {
        panic!("the LoRA recipe trains with FlowGRPO")
    };
    kl.kl_coef = 0.04;
    assert_eq!(AlgorithmSection::FlowGrpo(kl), b.algorithm);
    assert_eq!(
        a.sampling.num_inference_steps,
        b.sampling.num_inference_steps
    );
    // the seed's early pool, shifted to the first step, which CPS trains and Flow-SDE cannot
    assert_eq!(a.sampling.sde_pool, Some(vec![1, 2, 3, 4, 5]));
    assert_eq!(
        (b.sampling.sde_type, b.sampling.sde_pool.clone()),
        (SdeKind::Cps, Some(vec![0, 1, 2, 3, 4]))
    );
    assert_eq!(a.sampling.num_sde_steps, b.sampling.num_sde_steps);
    assert_eq!(a.rollout.group_size, b.rollout.group_size);
    assert_eq!(a.optimizer.clip_grad, b.optimizer.clip_grad);
    // and the config text round-trips, solver and storage included
    let text = b.to_toml_string().unwrap();
    assert!(
        text.contains("solver = \"euler\"") && text.contains("kind = \"flow_grpo\""),
        "{text}"
    );
    assert_eq!(TrainConfig::from_toml_str(&text, None, &[]).unwrap(), b);
}

#[test]
fn the_resolved_config_is_written_into_the_run_directory() {
    let dir = tempfile::tempdir().unwrap();
    let c = TrainConfig::qwen_image_t2i_full();
    let path = c.save_resolved(dir.path()).unwrap();
    assert_eq!(path, dir.path().join(RESOLVED_CONFIG_FILE));
    assert_eq!(TrainConfig::from_file(&path, &[]).unwrap(), c);
}

#[test]
fn reward_components_required_first_then_optional() {
    let mut c = TrainConfig::qwen_image_t2i_lora();
    c.reward.component_weights.insert("aesthetic".into(), 0.5);
    let comps = c.reward_components();
    assert_eq!(comps[0], RewardComponent::required("pickscore", 1.0));
    assert_eq!(comps[1], RewardComponent::optional("aesthetic", 0.5));
}

#[test]
fn upper_bounds_and_keys_the_shapes_world_does_not_use() {
    let mut c = TrainConfig::shapes_world_lora();
    c.eval.samples_per_prompt = 1_000_000;
    c.sampling.height = 64;
    c.rollout.prompts_per_rollout = crate::shapes_world::train_pool_size() + 1;
    let p = problems(&c);
    for key in [
        "eval.samples_per_prompt",
        "sampling.height",
        "rollout.prompts_per_rollout",
    ] {
        assert!(
            p.iter().any(|m| m.contains(key)),
            "{key} not reported: {p:?}"
        );
    }
    assert!(!p.iter().any(|m| m.contains("sampling.width")), "{p:?}");

    let mut c = TrainConfig::shapes_world_lora();
    c.rollout.prompts_per_rollout = 8192;
    c.rollout.group_size = 16;
    assert!(
        problems(&c).iter().any(|m| m.contains("65536 samples")),
        "{:?}",
        problems(&c)
    );
    // the same sizes are the Qwen-Image recipe's own business
    let mut q = TrainConfig::qwen_image_t2i_lora();
    q.sampling.height = 512;
    assert!(q.preflight().is_ok());
}

#[test]
fn every_parse_problem_is_reported_at_once() {
    let text = "recipe = \"shapes_world_lora\"\n\
                colour = 1\n\
                [run]\nseed = \"zero\"\n\
                [optimizer]\nlrr = 0.1\nbetas = 2\n\
                [eval]\ninterval = -1\n";
    let err = TrainConfig::from_toml_str(text, Some(Path::new("bad.toml")), &[]).unwrap_err();
    let TrainerError::ConfigInvalid { problems, .. } = &err else {
        panic!("unexpected error: {err}");
    };
    let msg = err.to_string();
    for needle in [
        "`colour`", "[run]", "`lrr`", "`betas`", "[eval]", "bad.toml",
    ] {
        assert!(msg.contains(needle), "{needle} missing from: {msg}");
    }
    assert_eq!(problems.len(), 5, "{msg}");
}

#[test]
fn parse_problems_and_preflight_problems_come_together() {
    // [optimizer] does not parse; [sampling] parses but preflight refuses its eta
    let text = "recipe = \"shapes_world_lora\"\n\
                [optimizer]\nlrr = 0.1\n\
                [sampling]\neta = -1.0\n";
    let err = TrainConfig::from_toml_str(text, None, &[]).unwrap_err();
    let TrainerError::ConfigInvalid { problems, .. } = &err else {
        panic!("unexpected error: {err}");
    };
    assert!(problems.iter().any(|p| p.contains("`lrr`")), "{err}");
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("(preflight) sampling.eta")),
        "{err}"
    );
    assert!(
        !problems
            .iter()
            .any(|p| p.starts_with("(preflight) optimizer.")),
        "{err}"
    );
}

#[test]
fn memory_bounds_follow_the_machine() {
    use super::preflight::{shapes_memory_estimate, shapes_memory_problems};
    let c = TrainConfig::shapes_world_lora();
    let (rollout, eval) = shapes_memory_estimate(&c);
    // 64 samples x 13 steps of 64 x 48 f32 latents, twice, plus 64 pictures
    assert_eq!(rollout, 64 * (2 * 13 * 64 * 48 * 4 + 32 * 32 * 3 * 4));
    assert_eq!(eval, 24 * 48 * (64 * 48 * 4 + 32 * 32 * 3 * 4));
    assert!(shapes_memory_problems(&c, 1 << 34).is_empty());
    let p = shapes_memory_problems(&c, eval - 1);
    assert_eq!(p.len(), 1, "{p:?}");
    let msg = p[0].to_string();
    assert!(
        msg.contains("eval.samples_per_prompt") && msg.contains("GiB"),
        "{msg}"
    );
    assert_eq!(shapes_memory_problems(&c, rollout.min(eval) - 1).len(), 2);
}

#[test]
fn an_awm_section_takes_its_defaults_and_names_every_bad_key() {
    let awm = |extra: &[&str]| {
        let mut o = vec!["algorithm={ kind = \"awm\" }".to_string()];
        o.extend(extra.iter().map(|s| s.to_string()));
        TrainConfig::from_recipe(
            RecipeName::ShapesWorldLora,
            &Override::parse_all(&o).unwrap(),
        )
    };
    let c = awm(&[]).unwrap();
    assert_eq!(c.algorithm, AlgorithmSection::Awm(AwmSection::default()));
    // switching the kind alone starts the section afresh (FlowGRPO's keys do not carry over),
    // and so does a file's [algorithm] on top of a recipe
    let kind = TrainConfig::from_recipe(
        RecipeName::ShapesWorldLora,
        &Override::parse_all(&["algorithm.kind=\"awm\"", "algorithm.advantage_limit=3.0"]).unwrap(),
    )
    .unwrap();
    let AlgorithmSection::Awm(a) = &kind.algorithm else {
        panic!("AWM")
    };
    assert_eq!(a.advantage_limit, 3.0);
    let file = TrainConfig::from_toml_str(
        "recipe = \"shapes_world_lora\"\n[algorithm]\nkind = \"awm\"\nweighting = \"huber\"\n",
        None,
        &[],
    )
    .unwrap();
    let AlgorithmSection::Awm(a) = &file.algorithm else {
        panic!("AWM")
    };
    assert_eq!(a.weighting, AwmWeightingKind::Huber);
    let p = c.preflight().unwrap();
    let AlgorithmPlan::Awm {
        clip_range,
        weighting,
        advantage_limit,
        kl_coef,
        ema_kl_coef,
    } = p.algorithm
    else {
        panic!("an AWM plan")
    };
    assert_eq!((kl_coef, ema_kl_coef), (0.0, 0.0));
    assert_eq!(
        (clip_range.lower_bound(), clip_range.upper_bound()),
        (0.0, 2.0)
    );
    assert_eq!(weighting, AwmWeighting::Uniform);
    assert_eq!(advantage_limit, 5.0);
    assert_eq!(p.advantages.std_mode, StdMode::Batch);
    // the release's weighting: the power defaults to 0.25
    let p = awm(&["algorithm.weighting=\"huber\""])
        .unwrap()
        .preflight()
        .unwrap();
    assert!(matches!(
        p.algorithm,
        AlgorithmPlan::Awm {
            weighting: AwmWeighting::GeneralisedHuber { power: 0.25 },
            ..
        }
    ));
    // the text round trip keeps it
    let text = awm(&[]).unwrap().to_toml_string().unwrap();
    assert_eq!(
        TrainConfig::from_toml_str(&text, None, &[])
            .unwrap()
            .algorithm,
        AlgorithmSection::Awm(AwmSection::default())
    );
    // every problem at once, each naming its key
    let text = problems(
        &awm(&[
            "algorithm.eps_clip=1.5",
            "algorithm.advantage_limit=0.0",
            "algorithm.huber_power=0.5",
        ])
        .unwrap(),
    );
    for want in [
        "algorithm.eps_clip = 1.5",
        "algorithm.advantage_limit = 0",
        "algorithm.huber_power = 0.5",
    ] {
        assert!(text.iter().any(|p| p.contains(want)), "{want} in {text:?}");
    }
    let text =
        problems(&awm(&["algorithm.weighting=\"huber\"", "algorithm.huber_power=2.0"]).unwrap());
    assert!(
        text.iter().any(|p| p.contains("algorithm.huber_power = 2")),
        "{text:?}"
    );
    // FlowGRPO's keys are not AWM's
    let err = awm(&["algorithm.anchor=\"rollout\""])
        .unwrap_err()
        .to_string();
    assert!(err.contains("anchor"), "{err}");
    // the velocity KL to the reference: finite and >= 0
    let p = awm(&["algorithm.kl_coef=0.001"])
        .unwrap()
        .preflight()
        .unwrap();
    assert!(matches!(p.algorithm, AlgorithmPlan::Awm { kl_coef, .. } if kl_coef == 0.001));
    let text = problems(&awm(&["algorithm.kl_coef=-1.0"]).unwrap());
    assert!(
        text.iter().any(|p| p.contains("algorithm.kl_coef = -1")),
        "{text:?}"
    );
}

/// DPOK's section: the release's defaults, its value baseline's defaults and refusals, every
/// bad key named at once.
#[test]
fn a_dpok_section_takes_the_release_defaults_and_names_every_bad_key() {
    let dpok = |extra: &[&str]| {
        let mut o = vec!["algorithm={ kind = \"dpok\" }"];
        o.extend_from_slice(extra);
        shapes_recipe_with(&o)
    };
    let c = dpok(&[]);
    assert_eq!(c.algorithm, AlgorithmSection::Dpok(DpokSection::default()));
    let AlgorithmPlan::Dpok {
        clip_range,
        reward_weight,
        kl_coef,
        kl_warmup_rollouts,
        anchor,
        value_baseline,
    } = c.preflight().unwrap().algorithm
    else {
        panic!("a DPOK plan")
    };
    assert_eq!(value_baseline, None);
    assert_eq!(
        (clip_range.lower_bound(), clip_range.upper_bound()),
        (1.0 - 1e-4, 1.0 + 1e-4)
    );
    assert_eq!((reward_weight, kl_coef), (100.0, 0.01));
    assert_eq!(kl_warmup_rollouts, 0);
    assert_eq!(anchor, AnchorSource::Replay);

    let c = dpok(&["algorithm.kl_warmup_rollouts=5"]);
    let AlgorithmPlan::Dpok {
        kl_warmup_rollouts, ..
    } = c.preflight().unwrap().algorithm
    else {
        panic!("a DPOK plan")
    };
    assert_eq!(kl_warmup_rollouts, 5);

    // every bad key at once, and a warm-up of a KL term that is off
    let bad = dpok(&[
        "algorithm.eps_clip=1.5",
        "algorithm.reward_weight=0",
        "algorithm.kl_coef=0",
        "algorithm.kl_warmup_rollouts=3",
    ]);
    let p = problems(&bad);
    for key in [
        "algorithm.eps_clip",
        "algorithm.reward_weight",
        "algorithm.kl_warmup_rollouts",
    ] {
        assert!(p.iter().any(|m| m.contains(key)), "{key}: {p:?}");
    }
    assert_eq!(p.len(), 3, "{p:?}");
    // the value baseline: `{}` is the release's network and fit
    let c = dpok(&["algorithm.value_baseline={}"]);
    let AlgorithmPlan::Dpok { value_baseline, .. } = c.preflight().unwrap().algorithm else {
        panic!("a DPOK plan")
    };
    let v = value_baseline.expect("a value baseline");
    assert_eq!((v.hidden, v.layers, v.buffer_size), (256, 3, 1000));
    assert_eq!(
        (v.fit.minibatches, v.fit.batch_size, v.fit.lr),
        (5, 256, 1e-4)
    );
    let bad = dpok(&[
        "algorithm.value_baseline={ hidden = 0, minibatches = 0, lr = -1.0 }",
        "algorithm.advantage_std_mode=\"batch\"",
    ]);
    let p = problems(&bad);
    for key in [
        "algorithm.value_baseline.hidden",
        "algorithm.value_baseline.minibatches",
        "algorithm.value_baseline.lr",
        "algorithm.advantage_std_mode",
    ] {
        assert!(p.iter().any(|m| m.contains(key)), "{key}: {p:?}");
    }
    assert_eq!(p.len(), 4, "{p:?}");
    let unknown =
        Override::parse_all(&["algorithm={ kind = \"dpok\", value_baseline = { width = 8 } }"])
            .unwrap();
    let err = TrainConfig::from_recipe(RecipeName::ShapesWorldLora, &unknown)
        .unwrap_err()
        .to_string();
    assert!(err.contains("width"), "{err}");
    let negative = dpok(&["algorithm.kl_coef=-0.1"]);
    assert!(
        problems(&negative)
            .iter()
            .any(|m| m.contains("algorithm.kl_coef")),
        "{:?}",
        problems(&negative)
    );
}

/// `sampling.scheduler = "sd3_5_diffusers_default"` is SD3.5 on diffusers' own
/// `set_timesteps(N)` path (the shift applied twice at the low end); `schedule_compat` picks
/// the arithmetic, current diffusers under numpy 2 by default.
#[test]
fn the_schedule_sources_and_arithmetic_are_named_options() {
    let schedule = |extra: &[&str]| {
        let overrides = Override::parse_all(extra).unwrap();
        let c = TrainConfig::from_recipe(RecipeName::QwenImageT2iLora, &overrides).unwrap();
        c.preflight().unwrap().schedule
    };
    let once = schedule(&["sampling.scheduler=\"sd3_5\""]);
    let twice = schedule(&["sampling.scheduler=\"sd3_5_diffusers_default\""]);
    let last = |s: &Schedule| s.sigmas.as_slice()[s.sigmas.as_slice().len() - 2];
    // shift 3 applied to 1/T twice: 3 s / (1 + 2 s) of s = 3 / 1002
    let shifted = |s: f64| 3.0 * s / (1.0 + 2.0 * s);
    assert!((f64::from(last(&twice)) - shifted(shifted(1e-3))).abs() < 1e-6);
    assert!((f64::from(last(&once)) - shifted(1.0 / 12.0)).abs() < 1e-6);
    let default = TrainConfig::from_recipe(RecipeName::QwenImageT2iLora, &[]).unwrap();
    assert_eq!(default.sampling.schedule_compat, ScheduleCompat::Current);
    // the recipe's 384x384, 12 steps: numpy 1 and numpy 2 differ in the stretched sigmas
    let current = schedule(&[]);
    let legacy = schedule(&["sampling.schedule_compat=\"diffusers_0_35\""]);
    assert_ne!(current.sigmas, legacy.sigmas);
}

/// `[ema]`: absent by default; its keys checked together, each problem naming its key.
#[test]
fn the_ema_section_is_checked() {
    let c = TrainConfig::from_recipe(RecipeName::ShapesWorldLora, &[]).unwrap();
    assert!(c.ema.is_none() && c.preflight().unwrap().ema.is_none());
    let with = shapes_recipe_with;
    let p = with(&["ema={ decay = 0.3, warmup = \"linear\", ramp = 0.001, update_interval = 1 }"])
        .preflight()
        .unwrap();
    assert_eq!(
        p.ema,
        Some(crate::ema::EmaSettings {
            decay: 0.3,
            warmup: crate::ema::EmaWarmup::Linear { ramp: 0.001 },
            interval: 1,
            precision: crate::ema::EmaPrecision::Fp32,
        })
    );
    let text = problems(&with(&[
        "ema={ decay = 1.0, warmup = \"none\", ramp = 0.1, update_interval = 0 }",
    ]));
    for key in ["ema.decay = 1", "ema.update_interval = 0", "ema.ramp = 0.1"] {
        assert!(text.iter().any(|p| p.contains(key)), "{key}: {text:?}");
    }
    let text = problems(&with(&[
        "ema={ decay = 0.9, warmup = \"linear\", update_interval = 8 }",
    ]));
    assert!(
        text.iter().any(|p| p.contains("ema.ramp = absent")),
        "{text:?}"
    );
    // the average's dtype is required where the trained weights are bf16 (a full fine-tune
    // without an f32 master), and taken as given
    let full = |ema: &str| {
        let o = Override::parse_all(&[ema.to_string()]).unwrap();
        TrainConfig::from_recipe(RecipeName::QwenImageT2iFull, &o).unwrap()
    };
    let ema = "ema={ decay = 0.9, warmup = \"none\", update_interval = 1 }";
    let text = problems(&full(ema));
    assert!(
        text.iter().any(|p| p.contains("ema.precision = absent")),
        "{text:?}"
    );
    for (given, want) in [
        ("param", crate::ema::EmaPrecision::Param),
        ("fp32", crate::ema::EmaPrecision::Fp32),
    ] {
        let c = full(&format!(
            "ema={{ decay = 0.9, warmup = \"none\", update_interval = 1, precision = \"{given}\" }}"
        ));
        assert!(
            !problems(&c).iter().any(|p| p.contains("ema.precision")),
            "{given}"
        );
        assert_eq!(c.preflight().unwrap().ema.unwrap().precision, want);
    }
    // an unknown key is refused by name
    let err = TrainConfig::from_recipe(
        RecipeName::ShapesWorldLora,
        &Override::parse_all(&[
            "ema={ decay = 0.9, warmup = \"none\", update_interval = 1, beta = 2 }",
        ])
        .unwrap(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("beta"), "{err}");
}

/// `kind = "nft"`: a complete section with the release's defaults; its rollouts are
/// deterministic, so `sampling.eta` must be 0 under it and only under it; every problem is
/// listed with its key.
#[test]
fn the_nft_section_and_its_deterministic_rollouts() {
    let with = shapes_recipe_with;
    let c = with(&[
        "algorithm={ kind = \"nft\" }",
        "sampling.eta=0.0",
        "sampling.sde_type=\"sde\"",
    ]);
    assert_eq!(c.algorithm, AlgorithmSection::Nft(NftSection::default()));
    let p = c.preflight().unwrap();
    let AlgorithmPlan::Nft {
        beta,
        advantage_limit,
        soft_update,
        kl_coef,
    } = p.algorithm
    else {
        panic!("an NFT plan")
    };
    assert_eq!(
        (beta, advantage_limit, soft_update, kl_coef),
        (1.0, 5.0, flow_grpo::SoftUpdate::RAMP, 1e-4)
    );
    assert_eq!(p.advantages.std_mode, StdMode::Group);
    // the recipe's eta is refused under NFT, and eta 0 under the others
    let text = problems(&with(&["algorithm={ kind = \"nft\" }"]));
    assert!(
        text.iter()
            .any(|p| p.contains("sampling.eta = 0.7") && p.contains("deterministic")),
        "{text:?}"
    );
    let text = problems(&with(&["sampling.eta=0.0"]));
    assert!(
        text.iter().any(|p| p.contains("sampling.eta = 0")),
        "{text:?}"
    );
    // every problem at once
    let text = problems(&with(&[
        "algorithm={ kind = \"nft\", beta = 0.0, advantage_limit = -1.0, kl_coef = -1.0, soft_update = \"flat_then_ramp\" }",
        "sampling.eta=0.0",
    ]));
    for key in [
        "algorithm.beta = 0",
        "algorithm.advantage_limit = -1",
        "algorithm.kl_coef = -1",
    ] {
        assert!(text.iter().any(|p| p.contains(key)), "{key}: {text:?}");
    }
    // an AWM key is not NFT's
    let err = TrainConfig::from_recipe(
        RecipeName::ShapesWorldLora,
        &Override::parse_all(&["algorithm={ kind = \"nft\", weighting = \"huber\" }"]).unwrap(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("weighting"), "{err}");
}

/// Deterministic rollouts (NFT, DPO) train their steps as timesteps of the forward process,
/// with no transition taken at them: the whole grid, step 0 (`sigma = 1`) and the last step
/// included, is a valid plan (the DiffusionNFT release walks it all), where a likelihood
/// method under Flow-SDE is still refused its singular step 0 by name.
#[test]
fn deterministic_rollouts_may_train_every_step_of_the_grid() {
    use schedule::{PlanQuery, SdeStepPlan};
    let whole = [
        "sampling.sde_pool=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]",
        "sampling.num_sde_steps=12",
    ];
    for kind in ["nft", "dpo"] {
        let mut o = algorithm_overrides(kind).unwrap();
        o.extend(Override::parse_all(&whole).unwrap());
        let c = TrainConfig::from_recipe(RecipeName::ShapesWorldLora, &o).unwrap();
        let p = c
            .preflight()
            .unwrap_or_else(|e| panic!("{kind} over the whole grid: {e}"));
        let steps = p.plan.steps(PlanQuery::rollout(3)).unwrap();
        assert_eq!(steps.as_slice(), (0..12).collect::<Vec<_>>(), "{kind}");
        assert!(p.warnings.is_empty(), "{kind}: {:?}", p.warnings);
        // the plan's own problems are still reported
        let mut o = algorithm_overrides(kind).unwrap();
        o.extend(
            Override::parse_all(&["sampling.sde_pool=[1, 12]", "sampling.num_sde_steps=2"])
                .unwrap(),
        );
        let text = problems(&TrainConfig::from_recipe(RecipeName::ShapesWorldLora, &o).unwrap());
        assert!(text.iter().any(|p| p.contains("12")), "{kind}: {text:?}");
    }
    // FlowGRPO's SDE on the same grid: Flow-SDE cannot take the step at sigma = 1
    let mut o = Override::parse_all(&whole).unwrap();
    o.extend(Override::parse_all(&["sampling.sde_type=\"sde\""]).unwrap());
    let text = problems(&TrainConfig::from_recipe(RecipeName::ShapesWorldLora, &o).unwrap());
    assert!(
        text.iter()
            .any(|p| p.contains("[0]") && p.contains("singular")),
        "{text:?}"
    );
}

/// `sampling.sde_window`: MixGRPO's sliding window replaces the other trained-step keys, which
/// must be off; the `mix_grpo` preset turns them off (`key=` removes a key) and walks a window
/// of 2 steps over the schedule.
#[test]
fn the_sliding_window_and_the_mix_grpo_preset() {
    let c = TrainConfig::from_recipe(
        RecipeName::ShapesWorldLora,
        &algorithm_overrides("mix_grpo").unwrap(),
    )
    .unwrap();
    assert_eq!(c.sampling.sde_pool, None);
    assert_eq!(c.sampling.solver, SolverKind::DpmSolverPp2m);
    let p = c.preflight().unwrap();
    let at = |r: u64| {
        p.plan
            .steps(PlanQuery::rollout(r))
            .unwrap()
            .as_slice()
            .to_vec()
    };
    assert_eq!(at(0), [1, 2]);
    assert_eq!(at(4), [1, 2]);
    assert_eq!(at(5), [2, 3]);
    // 12 steps, span [1, 11): starts 1..=9, then back to 1
    assert_eq!(at(45), [1, 2]);
    // a window with the recipe's other trained-step keys still on: each one is named
    let text = problems(
        &TrainConfig::from_recipe(
            RecipeName::ShapesWorldLora,
            &Override::parse_all(&[
                "sampling.sde_window={ size = 3, stride = 1, shift_interval = 5, span = [0, 12] }",
            ])
            .unwrap(),
        )
        .unwrap(),
    );
    for key in [
        "sampling.sde_resample_per_rollout",
        "sampling.sde_pool",
        "sampling.sde_indices",
    ] {
        assert!(text.iter().any(|p| p.contains(key)), "{key}: {text:?}");
    }
    // Flow-SDE cannot train the step at sigma = 1, nor a window past the schedule
    let bad = |window: &str| {
        let mut o = algorithm_overrides("mix_grpo").unwrap();
        o.extend(Override::parse_all(&[format!("sampling.sde_window={window}")]).unwrap());
        problems(&TrainConfig::from_recipe(RecipeName::ShapesWorldLora, &o).unwrap())
    };
    let text = bad("{ size = 2, stride = 1, shift_interval = 5, span = [0, 11] }");
    assert!(text.iter().any(|p| p.contains("[0]")), "{text:?}");
    let text = bad("{ size = 2, stride = 1, shift_interval = 5, span = [1, 13] }");
    assert!(text.iter().any(|p| p.contains("span")), "{text:?}");
}

/// MixGRPO's shrinking intervals: `"decay"` (linear, to `min_interval`) and `"exp_decay"`
/// (past `decay_threshold`); a key another strategy reads is refused by name, and `"decay"`
/// without its `min_interval` too.
#[test]
fn the_sliding_window_decay_strategies() {
    let with = |window: &str| {
        let mut o = algorithm_overrides("mix_grpo").unwrap();
        o.extend(Override::parse_all(&[format!("sampling.sde_window={window}")]).unwrap());
        TrainConfig::from_recipe(RecipeName::ShapesWorldLora, &o).unwrap()
    };
    let starts = |window: &str, rollouts: u64| -> Vec<usize> {
        let p = with(window).preflight().unwrap();
        (0..rollouts)
            .map(|r| p.plan.steps(PlanQuery::rollout(r)).unwrap().as_slice()[0])
            .collect()
    };
    // 12 steps, span [1, 11), size 2: starts 1..=9; the interval falls from 4 to 1 linearly
    // (4, 3, 3, 2, 2, 2, 1, 1, 1 by floor(4 (1 - p) + p), p = (start - 1) / 8)
    let linear = starts(
        "{ size = 2, stride = 1, shift_interval = 4, strategy = \"decay\", min_interval = 1 }",
        19,
    );
    assert_eq!(
        linear,
        [1, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 5, 5, 6, 6, 7, 8, 9]
    );
    // exp_decay past start 4 with k = 1: intervals 4 up to start 4, then ceil(4 / e) = 2, 1, 1
    let exp = starts(
        "{ size = 2, stride = 1, shift_interval = 4, strategy = \"exp_decay\", decay_k = 1.0, decay_threshold = 4 }",
        20,
    );
    assert_eq!(
        exp,
        [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 6, 7]
    );
    // MixGRPO's own threshold (13) is never passed by a 12-step schedule: progressive's walk
    let default_exp = starts(
        "{ size = 2, stride = 1, shift_interval = 2, strategy = \"exp_decay\" }",
        10,
    );
    assert_eq!(default_exp, [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]);
    // keys of another strategy, and decay without its minimum
    let text = problems(&with(
        "{ size = 2, stride = 1, shift_interval = 4, min_interval = 2, decay_k = 0.1, decay_threshold = 3 }",
    ));
    for key in ["min_interval", "decay_k", "decay_threshold"] {
        assert!(
            text.iter()
                .any(|p| p.contains(&format!("sampling.sde_window.{key}"))),
            "{key}: {text:?}"
        );
    }
    let text = problems(&with(
        "{ size = 2, stride = 1, shift_interval = 4, strategy = \"decay\" }",
    ));
    assert!(
        text.iter()
            .any(|p| p.contains("min_interval") && p.contains("absent")),
        "{text:?}"
    );
    let text = problems(&with(
        "{ size = 2, stride = 1, shift_interval = 2, strategy = \"decay\", min_interval = 3 }",
    ));
    assert!(text.iter().any(|p| p.contains("max_interval")), "{text:?}");
}

/// The solver names of fingerprints and banners are the ones a config is written with.
#[test]
fn solver_names_are_the_config_spelling() {
    for kind in [
        SolverKind::Euler,
        SolverKind::DpmSolverPp2m,
        SolverKind::UnipcBh2,
    ] {
        let parsed: SolverKind =
            serde_json::from_value(serde_json::Value::String(kind.as_str().into())).unwrap();
        assert_eq!(parsed, kind);
    }
}

/// The `dance_grpo` preset: the Dance kernel on every step but the last, one `x_T` per group,
/// per-sample subsets of 60 % keyed by the run's seed; a fraction outside `(0, 1]` or one that
/// keeps no trained step is refused by name.
#[test]
fn the_dance_grpo_preset_and_its_timestep_fraction() {
    let c = TrainConfig::from_recipe(
        RecipeName::ShapesWorldLora,
        &algorithm_overrides("dance_grpo").unwrap(),
    )
    .unwrap();
    assert_eq!(c.sampling.sde_type, SdeKind::Dance);
    assert!(c.rollout.shared_initial_noise);
    let p = c.preflight().unwrap();
    let steps = p.plan.steps(PlanQuery::rollout(5)).unwrap();
    assert_eq!(steps.as_slice(), (0..11).collect::<Vec<_>>().as_slice());
    match &p.algorithm {
        AlgorithmPlan::FlowGrpo {
            timestep_subset: Some(t),
            ..
        } => {
            assert_eq!(t.fraction, 0.6);
            assert_eq!(t.seed, c.run.seed);
        }
        other => panic!("{other:?}"),
    }
    for (fraction, needle) in [("1.5", "1.5"), ("0.05", "keeps at least one")] {
        let mut o = algorithm_overrides("dance_grpo").unwrap();
        o.extend(
            Override::parse_all(&[format!("algorithm.timestep_fraction={fraction}")]).unwrap(),
        );
        let text = problems(&TrainConfig::from_recipe(RecipeName::ShapesWorldLora, &o).unwrap());
        assert!(
            text.iter()
                .any(|p| p.contains("algorithm.timestep_fraction") && p.contains(needle)),
            "{fraction}: {text:?}"
        );
    }
}

/// The `flow_grpo_fast` preset: one random window of 2 trained steps per rollout, starting in
/// `1..=4` (span `[1, 6)` of the 12 steps), the ODE elsewhere.
#[test]
fn the_flow_grpo_fast_preset_draws_an_early_window_per_rollout() {
    let c = TrainConfig::from_recipe(
        RecipeName::ShapesWorldLora,
        &algorithm_overrides("flow_grpo_fast").unwrap(),
    )
    .unwrap();
    let p = c.preflight().unwrap();
    let mut starts = std::collections::BTreeSet::new();
    for r in 0..64 {
        let steps = p.plan.steps(PlanQuery::rollout(r)).unwrap();
        let s = steps.as_slice();
        assert_eq!(s.len(), 2);
        assert_eq!(s[1], s[0] + 1);
        assert!((1..=4).contains(&s[0]), "{s:?}");
        starts.insert(s[0]);
    }
    assert_eq!(starts.into_iter().collect::<Vec<_>>(), [1, 2, 3, 4]);
}

/// `eval.guidance`: a scale above 1 is accepted and kept in the resolved config; 1 or less is
/// refused by name; the rollouts' `sampling.guidance_scale` stays refused.
#[test]
fn eval_guidance_is_checked() {
    let with = |g: &str| {
        TrainConfig::from_recipe(
            RecipeName::ShapesWorldLora,
            &Override::parse_all(&[format!("eval.guidance={g}")]).unwrap(),
        )
        .unwrap()
    };
    let c = with("{ scale = 4.0, negative_prompt = \" \" }");
    c.preflight().unwrap();
    assert!(c.to_toml_string().unwrap().contains("negative_prompt"));
    let text = problems(&with("{ scale = 1.0, negative_prompt = \" \" }"));
    assert!(
        text.iter().any(|p| p.contains("eval.guidance.scale")),
        "{text:?}"
    );
    assert!(
        TrainConfig::from_recipe(
            RecipeName::ShapesWorldLora,
            &Override::parse_all(&["eval.guidance={ scale = 4.0 }"]).unwrap(),
        )
        .is_err()
    );
}

/// `eval.num_inference_steps`: the evaluation's schedule is the sampling policy at its own
/// step count (the rollouts' stays as configured), kept in the resolved config; 0 is refused by
/// name; absent, the evaluation samples the rollouts' schedule.
#[test]
fn eval_steps_are_their_own_schedule() {
    let with = shapes_recipe_with;
    let plain = with(&[]).preflight().unwrap();
    assert_eq!(plain.eval_schedule, plain.schedule);
    let c = with(&[
        "sampling.num_inference_steps=8",
        "eval.num_inference_steps=24",
    ]);
    assert!(
        c.to_toml_string()
            .unwrap()
            .contains("num_inference_steps = 24")
    );
    let p = c.preflight().unwrap();
    assert_eq!(p.schedule.sigmas.as_slice().len(), 9);
    assert_eq!(p.eval_schedule.sigmas.as_slice().len(), 25);
    // the same policy: both start at sigma 1 and end at 0
    assert_eq!(p.eval_schedule.sigmas.as_slice()[0], 1.0);
    assert_eq!(*p.eval_schedule.sigmas.as_slice().last().unwrap(), 0.0);
    let text = problems(&with(&["eval.num_inference_steps=0"]));
    assert!(
        text.iter().any(|p| p.contains("eval.num_inference_steps")),
        "{text:?}"
    );
}

#[test]
fn the_frozen_weights_dtype_is_the_seeds_and_the_shapes_world_refuses_bf16() {
    // the Qwen-Image recipes hold the frozen weights in bf16 (`--fsdp-param-dtype bf16`)
    let c = TrainConfig::qwen_image_t2i_lora();
    assert_eq!(c.model.param_dtype, Some(ParamDtype::Bf16));
    assert_eq!(c.model.weight_dtype(), burn::tensor::DType::BF16);
    assert_eq!(
        TrainConfig::qwen_image_t2i_full().model.param_dtype,
        Some(ParamDtype::Bf16)
    );
    let text = c.to_toml_string().unwrap();
    assert!(text.contains("param_dtype = \"bf16\""), "{text}");
    // the shapes world's recipe keeps f32; bf16 there is refused by name
    let mut s = TrainConfig::shapes_world_lora();
    assert_eq!(s.model.param_dtype, None);
    assert_eq!(s.model.weight_dtype(), burn::tensor::DType::F32);
    s.model.param_dtype = Some(ParamDtype::Bf16);
    let err = s.preflight().unwrap_err().to_string();
    assert!(
        err.contains("model.param_dtype") && err.contains("Qwen-Image world"),
        "{err}"
    );
    s.model.param_dtype = Some(ParamDtype::Fp32);
    assert!(s.preflight().is_ok());
}

/// `key*=factor` scales the number the key holds at that point, in order with the other
/// overrides; it refuses a key without a number, a text factor and a whole number scaled by a
/// fraction, each named with the override as written.
#[test]
fn a_scale_override_multiplies_what_the_key_holds_at_that_point() {
    let c = shapes_recipe_with(&["optimizer.lr*=0.25"]);
    assert_eq!(c.optimizer.lr, 1e-3 * 0.25);
    // in order: set, then scale; scale, then set
    let c = shapes_recipe_with(&["optimizer.lr=1e-3", "optimizer.lr*=0.5"]);
    assert_eq!(c.optimizer.lr, 5e-4);
    let c = shapes_recipe_with(&["optimizer.lr*=0.5", "optimizer.lr=1e-3"]);
    assert_eq!(c.optimizer.lr, 1e-3);
    // a whole number by a whole factor stays whole; a float by a whole factor is a float
    let c = shapes_recipe_with(&["run.num_rollouts*=2", "optimizer.lr*=2"]);
    assert_eq!((c.run.num_rollouts, c.optimizer.lr), (400, 2e-3));
    let refused = |o: &str| {
        let err =
            TrainConfig::from_recipe(RecipeName::ShapesWorldLora, &[Override::parse(o).unwrap()])
                .unwrap_err();
        assert!(matches!(err, TrainerError::Override { .. }), "{o}: {err}");
        err.to_string()
    };
    let e = refused("run.num_rollouts*=0.5");
    assert!(
        e.contains("run.num_rollouts*=0.5") && e.contains("whole"),
        "{e}"
    );
    let e = refused("optimizer.no_such_key*=2");
    assert!(e.contains("absent"), "{e}");
    let e = refused("reward.scorers*=2");
    assert!(e.contains("holds [\"shapes\"]"), "{e}");
    let e = refused(&format!("run.num_rollouts*={}", i64::MAX));
    assert!(e.contains("in range"), "{e}");
    for bad in ["optimizer.lr*=fast", "optimizer.lr*=", "optimizer.lr*=nan"] {
        let err = Override::parse(bad).unwrap_err().to_string();
        assert!(err.contains("finite number"), "{bad}: {err}");
    }
}

/// `--algorithm dpok` runs DPOK at a quarter of the lr it is given (the recipe's, a file's or
/// an earlier override's); an `optimizer.lr` set after the preset is taken as it is.
#[test]
fn the_dpok_preset_takes_a_quarter_of_the_lr() {
    let preset = algorithm_overrides("dpok").unwrap();
    let c = TrainConfig::from_recipe(RecipeName::ShapesWorldLora, &preset).unwrap();
    assert_eq!(c.algorithm.kind(), "dpok");
    assert_eq!(c.optimizer.lr, 2.5e-4);
    let mut o = preset.clone();
    o.push(Override::parse("optimizer.lr=1e-3").unwrap());
    let c = TrainConfig::from_recipe(RecipeName::ShapesWorldLora, &o).unwrap();
    assert_eq!(c.optimizer.lr, 1e-3);
    let mut o = vec![Override::parse("optimizer.lr=2e-3").unwrap()];
    o.extend(preset);
    let c = TrainConfig::from_recipe(RecipeName::ShapesWorldLora, &o).unwrap();
    assert_eq!(c.optimizer.lr, 5e-4);
}

/// Keys that a combination of the others leaves unread are refused by name, every one at
/// once, and the presets and recipes set none of them.
#[test]
fn keys_another_key_leaves_unread_are_refused() {
    let refused = |c: &TrainConfig, keys: &[&str]| {
        let p = problems(c);
        for key in keys {
            assert!(
                p.iter().any(|m| m.starts_with(&format!("{key} = "))),
                "{key} not refused: {p:?}"
            );
        }
        p
    };
    // trained steps: resampling off leaves the pool unread; an explicit list is trained as it
    // stands, so its length is the step count and no fraction window is built
    let mut c = TrainConfig::shapes_world_lora();
    c.sampling.sde_resample_per_rollout = false;
    c.sampling.num_sde_steps = 2;
    c.sampling.sde_timestep_fraction = Some([0.0, 0.5]);
    let p = refused(
        &c,
        &[
            "sampling.sde_pool",
            "sampling.num_sde_steps",
            "sampling.sde_timestep_fraction",
        ],
    );
    assert!(
        p.iter()
            .any(|m| m.contains("2 (sampling.sde_indices lists 3)")),
        "{p:?}"
    );
    c.sampling.sde_pool = None;
    c.sampling.num_sde_steps = 3;
    c.sampling.sde_timestep_fraction = None;
    assert!(c.preflight().is_ok(), "{:?}", problems(&c));
    // a resample from a pool does not read the fraction window
    let mut c = TrainConfig::shapes_world_lora();
    c.sampling.sde_timestep_fraction = Some([0.1, 0.5]);
    refused(&c, &["sampling.sde_timestep_fraction"]);
    c.sampling.sde_pool = None;
    assert!(c.preflight().is_ok(), "{:?}", problems(&c));

    // deterministic rollouts take no SDE
    let mut c = TrainConfig::from_recipe(
        RecipeName::ShapesWorldLora,
        &algorithm_overrides("nft").unwrap(),
    )
    .unwrap();
    assert!(c.preflight().is_ok());
    c.sampling.sde_type = SdeKind::Dance;
    let p = refused(&c, &["sampling.sde_type"]);
    assert!(p.iter().any(|m| m.contains("\"dance\"")), "{p:?}");

    // a random window start reads neither the stride nor the end of a walk
    let mut c = TrainConfig::from_recipe(
        RecipeName::ShapesWorldLora,
        &algorithm_overrides("flow_grpo_fast").unwrap(),
    )
    .unwrap();
    let w = c.sampling.sde_window.as_mut().unwrap();
    w.stride = 2;
    w.at_end = WindowEndKind::RollBack;
    refused(
        &c,
        &["sampling.sde_window.stride", "sampling.sde_window.at_end"],
    );

    // a full fine-tune builds no adapter; a dropout rule without a starting adapter is moot
    let mut c = TrainConfig::shapes_world_lora();
    c.model.trainable_mode = TrainableMode::Full;
    let l = c.lora.as_mut().unwrap();
    l.rank = 0;
    assert!(c.preflight().is_ok(), "{:?}", problems(&c));
    let l = c.lora.as_mut().unwrap();
    l.init_from = Some(PathBuf::from("adapter"));
    l.use_rslora = true;
    l.target_modules = Some(vec!["to_q".into()]);
    l.init_dropout = InitDropout::Zero;
    refused(
        &c,
        &[
            "lora.init_from",
            "lora.use_rslora",
            "lora.target_modules",
            "lora.init_dropout",
        ],
    );
    let mut c = TrainConfig::shapes_world_lora();
    c.lora.as_mut().unwrap().init_dropout = InitDropout::Zero;
    refused(&c, &["lora.init_dropout"]);

    // a resume's keys without a resume, and a resume that would also overwrite
    let mut c = TrainConfig::shapes_world_lora();
    c.checkpoint.resume_from = Some(7);
    c.checkpoint.allow_fresh = true;
    c.checkpoint.allow_config_changes = true;
    c.checkpoint.overwrite = true;
    refused(
        &c,
        &[
            "checkpoint.resume_from",
            "checkpoint.allow_fresh",
            "checkpoint.allow_config_changes",
        ],
    );
    c.checkpoint.resume = true;
    let p = refused(&c, &["checkpoint.overwrite"]);
    assert!(!p.iter().any(|m| m.contains("resume_from")), "{p:?}");
    c.checkpoint.overwrite = false;
    assert!(c.preflight().is_ok(), "{:?}", problems(&c));
}

/// A constant learning rate reads neither decay key: each one set beside it is refused.
#[test]
fn decay_keys_under_a_constant_rate_are_refused() {
    let mut c = TrainConfig::shapes_world_lora();
    c.optimizer.lr_scheduler = LrSchedulerKind::Constant;
    c.optimizer.min_lr = 1e-5;
    c.optimizer.lr_decay_iters = Some(100);
    let p = problems(&c);
    for key in [
        "optimizer.min_lr = 0.00001",
        "optimizer.lr_decay_iters = 100",
    ] {
        assert!(p.iter().any(|m| m.starts_with(key)), "{key}: {p:?}");
    }
    c.optimizer.lr_scheduler = LrSchedulerKind::Cosine;
    assert!(c.preflight().is_ok(), "{:?}", problems(&c));
}

/// `eval.sampling`: the Qwen-Image recipes evaluate as seed 002 does, with the SDE's
/// transitions at the plan's evaluation fallback (`sde_indices`); the shapes recipe and a
/// config without the key evaluate deterministically. `"sde"` is refused, every reason at
/// once, where there is no SDE or no fixed step to evaluate with, and the presets without
/// either evaluate deterministically on every recipe.
#[test]
fn the_evaluations_sampling_follows_the_seed_where_it_can() {
    let p = TrainConfig::qwen_image_t2i_lora().preflight().unwrap();
    assert_eq!(p.eval_sde_steps.as_slice(), &[3, 4, 5]);
    let p = TrainConfig::qwen_image_t2i_full().preflight().unwrap();
    assert_eq!(p.eval_sde_steps.as_slice(), &[1, 3, 5]);
    let shapes = TrainConfig::shapes_world_lora();
    assert_eq!(shapes.eval.sampling, EvalSampling::Ode);
    assert!(shapes.preflight().unwrap().eval_sde_steps.is_empty());
    let c = shapes_recipe_with(&["eval.sampling=\"sde\""]);
    assert_eq!(c.preflight().unwrap().eval_sde_steps.as_slice(), &[3, 4, 5]);
    assert!(c.to_toml_string().unwrap().contains("sampling = \"sde\""));
    // a config written before the key evaluates as every build before it did
    let mut text = shapes.to_toml_string().unwrap();
    text = text.replace("sampling = \"ode\"\n", "");
    assert!(!text.contains("\"ode\""), "{text}");
    let back = TrainConfig::from_toml_str(&text, None, &[]).unwrap();
    assert_eq!(back.eval.sampling, EvalSampling::Ode);

    // deterministic rollouts have no SDE; another step count, other steps; every reason
    let mut o = algorithm_overrides("nft").unwrap();
    o.extend(
        Override::parse_all(&["eval.sampling=\"sde\"", "eval.num_inference_steps=24"]).unwrap(),
    );
    let c = TrainConfig::from_recipe(RecipeName::ShapesWorldLora, &o).unwrap();
    let text = problems(&c);
    assert_eq!(
        text.iter().filter(|m| m.contains("eval.sampling")).count(),
        2,
        "{text:?}"
    );
    assert!(text.iter().any(|m| m.contains("no SDE")), "{text:?}");
    assert!(
        text.iter().any(|m| m.contains("rollouts' schedule")),
        "{text:?}"
    );
    // a sliding window has no fixed steps to evaluate at
    let mut o = algorithm_overrides("mix_grpo").unwrap();
    o.push(Override::parse("eval.sampling=\"sde\"").unwrap());
    let c = TrainConfig::from_recipe(RecipeName::ShapesWorldLora, &o).unwrap();
    let text = problems(&c);
    assert_eq!(text.len(), 1, "{text:?}");
    assert!(text[0].contains("sliding window"), "{text:?}");
    // the presets without fixed SDE steps evaluate deterministically on the seed's recipes
    for name in ["nft", "dpo", "mix_grpo", "flow_grpo_fast"] {
        let c = TrainConfig::from_recipe(
            RecipeName::QwenImageT2iLora,
            &algorithm_overrides(name).unwrap(),
        )
        .unwrap();
        assert_eq!(c.eval.sampling, EvalSampling::Ode, "{name}");
        // (DPO on this recipe's micro-batches of one is refused for its pairs, not here)
        let text = problems(&c);
        assert!(
            !text.iter().any(|m| m.contains("eval.sampling")),
            "{name}: {text:?}"
        );
    }
    // DanceGRPO's explicit steps are the ones its evaluation noises
    let c = TrainConfig::from_recipe(
        RecipeName::QwenImageT2iLora,
        &algorithm_overrides("dance_grpo").unwrap(),
    )
    .unwrap();
    assert_eq!(
        c.preflight().unwrap().eval_sde_steps.as_slice(),
        &(0..11).collect::<Vec<_>>()[..]
    );
}

/// `eval.sde_gap`: the same pictures sampled a second time with the SDE's transitions at
/// the plan's evaluation steps, the evaluation itself staying deterministic; refused, every
/// reason at once, where there is no SDE, no fixed step, or the evaluation is the SDE's.
#[test]
fn the_sde_gap_samples_at_the_plans_evaluation_steps() {
    let shapes = TrainConfig::shapes_world_lora();
    assert!(!shapes.eval.sde_gap);
    assert_eq!(shapes.preflight().unwrap().eval_gap_steps, None);
    assert!(!shapes.to_toml_string().unwrap().contains("sde_gap"));
    let c = shapes_recipe_with(&["eval.sde_gap=true"]);
    let p = c.preflight().unwrap();
    assert_eq!(p.eval_gap_steps.as_ref().unwrap().as_slice(), &[3, 4, 5]);
    assert!(
        p.eval_sde_steps.is_empty(),
        "the evaluation stays deterministic"
    );
    assert!(c.to_toml_string().unwrap().contains("sde_gap = true"));

    let c = shapes_recipe_with(&["eval.sde_gap=true", "eval.sampling=\"sde\""]);
    let text = problems(&c);
    assert_eq!(text.len(), 1, "{text:?}");
    assert!(
        text[0].contains("eval.sde_gap") && text[0].contains("already"),
        "{text:?}"
    );
    let mut o = algorithm_overrides("nft").unwrap();
    o.extend(Override::parse_all(&["eval.sde_gap=true", "eval.num_inference_steps=24"]).unwrap());
    let c = TrainConfig::from_recipe(RecipeName::ShapesWorldLora, &o).unwrap();
    let text = problems(&c);
    assert_eq!(
        text.iter().filter(|m| m.contains("eval.sde_gap")).count(),
        2,
        "{text:?}"
    );
    assert!(text.iter().any(|m| m.contains("no SDE")), "{text:?}");
    let mut o = algorithm_overrides("mix_grpo").unwrap();
    o.push(Override::parse("eval.sde_gap=true").unwrap());
    let c = TrainConfig::from_recipe(RecipeName::ShapesWorldLora, &o).unwrap();
    let text = problems(&c);
    assert_eq!(text.len(), 1, "{text:?}");
    assert!(
        text[0].contains("eval.sde_gap") && text[0].contains("sliding window"),
        "{text:?}"
    );
}

/// FDFO's section: `kind` alone takes the paper's SPO `ε` 0.03 and the raw reward difference;
/// its preset passes preflight; without its churn pairs every missing piece is named at once;
/// a DPO group below 2 is named once, by the geometry every algorithm shares.
#[test]
fn fdfo_defaults_and_its_pairs_refused_all_at_once() {
    let c = shapes_recipe_with(&["algorithm={ kind = \"fdfo\" }"]);
    let AlgorithmSection::Fdfo(f) = &c.algorithm else {
        panic!("an FDFO section: {:?}", c.algorithm)
    };
    assert_eq!(f.eps, 0.03);
    assert_eq!(f.advantage_std_mode, AdvantageStdMode::None);
    let preset = TrainConfig::from_recipe(
        RecipeName::ShapesWorldLora,
        &algorithm_overrides("fdfo").unwrap(),
    )
    .unwrap();
    assert!(preset.preflight().is_ok(), "{:?}", problems(&preset));
    // the bare section on the recipe's groups of 8 from 8 x_T each, Flow-SDE, micro-batch 16
    let text = problems(&shapes_recipe_with(&[
        "algorithm={ kind = \"fdfo\" }",
        "rollout.micro_batch_size=1",
    ]));
    for key in [
        "rollout.group_size",
        "rollout.shared_initial_noise",
        "sampling.sde_type",
        "rollout.micro_batch_size",
    ] {
        assert!(text.iter().any(|m| m.starts_with(key)), "{key}: {text:?}");
    }
    let text = problems(&shapes_recipe_with(&[
        "algorithm={ kind = \"dpo\" }",
        "sampling.eta=0.0",
        "rollout.group_size=1",
    ]));
    assert_eq!(
        text.iter()
            .filter(|m| m.starts_with("rollout.group_size"))
            .count(),
        1,
        "{text:?}"
    );
}
