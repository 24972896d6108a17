//! `[data]`: the shapes world trained and evaluated on prompt files in the unified JSONL
//! schema (what `prompts curate` writes), and the files it refuses.

mod shapes_common;

use std::path::{Path, PathBuf};

use prompt_data::{PromptRecord, write_jsonl};
use reward::shapes::{Category, SceneSpec};
use shapes_common::{Brightness, start_in, tiny_config, tiny_generator};
use trainer_fsdp::shapes_world::ShapesWorld;
use trainer_fsdp::{DataSection, StopFlag, TrainerError, TrainerRng, World};

type B = shapes_common::B;

fn scenes(category: Category, n: usize) -> Vec<String> {
    SceneSpec::all(category)
        .iter()
        .take(n)
        .map(SceneSpec::prompt)
        .collect()
}

fn file(dir: &Path, name: &str, prompts: &[String]) -> PathBuf {
    let records: Vec<PromptRecord> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| PromptRecord::new(p.clone(), "t2i", format!("{name}{i}")))
        .collect();
    let path = dir.join(format!("{name}.jsonl"));
    write_jsonl(&path, &records).unwrap();
    path
}

#[test]
fn a_run_draws_from_the_train_file_and_evaluates_the_eval_file() {
    let root = tempfile::tempdir().unwrap();
    tiny_generator(&root.path().join("generator"));
    let train: Vec<String> = scenes(Category::Counting, 5)
        .into_iter()
        .chain(scenes(Category::Colours, 3))
        .collect();
    let eval = scenes(Category::Position, 2);
    let train_path = file(root.path(), "train", &train);
    let eval_path = file(root.path(), "eval", &eval);

    // the world's own view: draws are distinct members of the file, deterministic per stream
    let data = DataSection {
        train: Some(train_path.clone()),
        eval: Some(eval_path.clone()),
    };
    let world = ShapesWorld::<burn::backend::Flex>::load(
        &root.path().join("generator"),
        &[trainer_fsdp::ScorerSpec::Shapes],
        &Default::default(),
    )
    .unwrap()
    .with_prompt_files(&data)
    .unwrap();
    let draw = |seed| {
        <ShapesWorld<burn::backend::Flex> as World<B>>::train_prompts(
            &world,
            &mut TrainerRng::seeded(seed),
            6,
        )
        .unwrap()
    };
    let a = draw(1);
    assert!(a.iter().all(|p| train.contains(p)), "{a:?}");
    let mut distinct = a.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 6);
    assert_eq!(a, draw(1));
    assert_ne!(a, draw(2));
    let held: Vec<String> = <ShapesWorld<burn::backend::Flex> as World<B>>::held_out(&world)
        .iter()
        .map(|h| h.prompt.clone())
        .collect();
    assert_eq!(held, eval);
    let err = <ShapesWorld<burn::backend::Flex> as World<B>>::train_prompts(
        &world,
        &mut TrainerRng::seeded(0),
        9,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            TrainerError::PromptPoolExhausted {
                requested: 9,
                available: 8
            }
        ),
        "{err}"
    );

    // a whole run on them: the evaluation covers the eval file's one category
    let extra = [
        format!("data.train={}", train_path.display()),
        format!("data.eval={}", eval_path.display()),
    ];
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let mut run = start_in(
        root.path(),
        &root.path().join("run"),
        1,
        &extra,
        Box::new(Brightness),
    );
    run.run(&StopFlag::new()).unwrap();
    let report = run.evaluate("check").unwrap();
    assert_eq!(report.by_category.keys().collect::<Vec<_>>(), ["position"]);
    assert_eq!(report.samples, 2, "2 eval prompts x 1 sample");
}

#[test]
fn files_the_world_cannot_use_are_refused_by_preflight_with_their_lines() {
    let root = tempfile::tempdir().unwrap();
    let good = scenes(Category::Counting, 3);
    let bad = file(
        root.path(),
        "bad",
        &[good[0].clone(), "a photo of a cat".into(), good[1].clone()],
    );
    let cfg = tiny_config(root.path(), 1, &[&format!("data.train={}", bad.display())]);
    let msg = cfg.preflight().unwrap_err().to_string();
    assert!(
        msg.contains("data.train") && msg.contains("line 2"),
        "{msg}"
    );
    assert!(
        msg.contains("not a scene of the shapes world's grammar"),
        "{msg}"
    );

    // fewer prompts than a rollout draws
    let small = file(root.path(), "small", &good[..1]);
    let cfg = tiny_config(
        root.path(),
        1,
        &[&format!("data.train={}", small.display())],
    );
    let msg = cfg.preflight().unwrap_err().to_string();
    assert!(msg.contains("rollout.prompts_per_rollout"), "{msg}");

    // a train prompt that is also held out
    tiny_generator(&root.path().join("generator"));
    let train = file(root.path(), "train", &good);
    let eval = file(root.path(), "eval", &good[2..]);
    let data = DataSection {
        train: Some(train),
        eval: Some(eval),
    };
    let err = ShapesWorld::<burn::backend::Flex>::load(
        &root.path().join("generator"),
        &[trainer_fsdp::ScorerSpec::Shapes],
        &Default::default(),
    )
    .unwrap()
    .with_prompt_files(&data)
    .unwrap_err();
    assert!(
        err.to_string().contains("also a held-out prompt (leakage)"),
        "{err}"
    );
}
