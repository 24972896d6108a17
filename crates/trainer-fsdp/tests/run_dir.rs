//! A run directory that nothing can destroy, each guarantee written as the scenario that used
//! to lose data: a fresh run into a finished run's directory, a second run on a locked
//! directory, a resume with a changed experiment, a damaged metrics log, a resume with nothing
//! committed and one whose latest checkpoint is damaged. Every refusal leaves every byte as it
//! was. Then the endings: a stop request in the middle of a rollout, and a checkpoint write
//! that fails. The runs are the analytic Gaussian world's (milliseconds each).

mod crash_harness;
mod gaussian_world;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gaussian_world::{
    GaussianRun, delta, start, try_start, try_start_in, try_start_stopping,
    try_start_stopping_in_training,
};
use trainer_fsdp::run_dir::{CONFIG_CHANGES_FILE, LOCK_FILE, LockHolder, RunLock};
use trainer_fsdp::{CheckpointStore, StopFlag, TrainerError, names, read_jsonl};

/// Every file under `root` with its bytes, and every directory (as an empty entry).
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, Option<Vec<u8>>>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries {
            let p = e.unwrap().path();
            if p.is_dir() {
                out.insert(p.clone(), None);
                walk(&p, out);
            } else {
                out.insert(p.clone(), Some(std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, &mut out);
    out
}

/// A finished Gaussian run of `rollouts` rollouts (a checkpoint after each) under `root`.
fn finished_run(root: &Path, rollouts: u64) {
    let mut run = start(root, rollouts, &["eval.interval=0"]);
    run.run(&StopFlag::new()).unwrap();
}

fn run_dir(root: &Path) -> PathBuf {
    root.join("run")
}

#[test]
fn a_fresh_run_into_a_finished_runs_directory_leaves_every_byte_unchanged() {
    let root = tempfile::tempdir().unwrap();
    finished_run(root.path(), 2);
    let before = snapshot(root.path());
    let Err(err) = try_start(root.path(), 2, &["eval.interval=0"]) else {
        panic!("a fresh run into a finished run's directory started");
    };
    let TrainerError::RunDirNotEmpty { found, .. } = &err else {
        panic!("unexpected error: {err}");
    };
    for f in ["metrics.jsonl", "config.resolved.toml"] {
        assert!(found.contains(&run_dir(root.path()).join(f)), "{err}");
    }
    assert!(
        found
            .iter()
            .any(|p| p.starts_with(root.path().join("ckpt"))),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("--resume") && msg.contains("--overwrite"),
        "{msg}"
    );
    assert!(
        snapshot(root.path()) == before,
        "a refused fresh run changed the directory"
    );
}

#[test]
fn overwrite_moves_the_old_run_aside_and_deletes_nothing() {
    let root = tempfile::tempdir().unwrap();
    finished_run(root.path(), 2);
    let old_metrics = std::fs::read(run_dir(root.path()).join("metrics.jsonl")).unwrap();
    let old_ckpt = snapshot(&root.path().join("ckpt").join("t2i"));
    let mut run = start(
        root.path(),
        1,
        &["eval.interval=0", "checkpoint.overwrite=true"],
    );
    run.run(&StopFlag::new()).unwrap();
    let previous: Vec<PathBuf> = std::fs::read_dir(run_dir(root.path()))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("previous-")
        })
        .collect();
    assert_eq!(previous.len(), 1, "{previous:?}");
    assert_eq!(
        std::fs::read(previous[0].join("metrics.jsonl")).unwrap(),
        old_metrics
    );
    // the checkpoint directory lies outside the run directory: moved aside beside itself
    let moved: Vec<PathBuf> = std::fs::read_dir(root.path().join("ckpt"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains(".previous-"))
        .collect();
    assert_eq!(moved.len(), 1, "{moved:?}");
    let old_files = old_ckpt.values().filter(|v| v.is_some()).count();
    let moved_files = snapshot(&moved[0]).values().filter(|v| v.is_some()).count();
    assert_eq!(old_files, moved_files);
}

#[test]
fn a_second_run_on_a_locked_directory_is_refused_and_changes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let first = start(root.path(), 2, &["eval.interval=0"]);
    let before = snapshot(root.path());
    for extra in [
        &["eval.interval=0"][..],
        &[
            "eval.interval=0",
            "checkpoint.resume=true",
            "checkpoint.allow_fresh=true",
        ][..],
        &["eval.interval=0", "checkpoint.overwrite=true"][..],
    ] {
        let Err(err) = try_start(root.path(), 2, extra) else {
            panic!("a second run on a locked directory started ({extra:?})");
        };
        assert!(
            matches!(err, TrainerError::RunDirLocked { .. }),
            "unexpected error: {err}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "the error names the holder: {msg}"
        );
        assert!(
            snapshot(root.path()) == before,
            "a refused run changed the directory"
        );
    }
    drop(first);
    // released: the lock file is empty and the directory can be resumed
    assert_eq!(
        std::fs::read(run_dir(root.path()).join(LOCK_FILE)).unwrap(),
        b""
    );
}

#[test]
fn two_run_directories_sharing_a_checkpoint_directory_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let first = start(root.path(), 2, &["eval.interval=0"]);
    let other = root.path().join("other-run");
    let Err(err) = try_start_in(root.path(), &other, 2, &["eval.interval=0"]) else {
        panic!("a second run started on a checkpoint directory in use");
    };
    let msg = err.to_string();
    assert!(
        matches!(err, TrainerError::RunDirLocked { .. }) && msg.contains("ckpt"),
        "unexpected error: {msg}"
    );
    drop(first);
    assert!(try_start_in(root.path(), &other, 2, &["eval.interval=0"]).is_ok());
}

#[test]
fn a_stale_lock_of_a_dead_run_is_reported_and_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(LOCK_FILE),
        "pid=4194303\nhost=elsewhere\nstarted=17\n",
    )
    .unwrap();
    let (lock, stale) = RunLock::acquire(dir.path()).unwrap();
    assert_eq!(
        stale,
        Some(LockHolder {
            pid: 4_194_303,
            host: "elsewhere".into(),
            started: 17,
        })
    );
    let now = LockHolder::parse(&std::fs::read_to_string(lock.path()).unwrap()).unwrap();
    assert_eq!(now.pid, std::process::id());
}

#[test]
fn a_resume_with_a_changed_experiment_is_refused_with_the_differences() {
    let root = tempfile::tempdir().unwrap();
    finished_run(root.path(), 2);
    let before = snapshot(root.path());
    let changed = [
        "eval.interval=0",
        "checkpoint.resume=true",
        "run.seed=4",
        "optimizer.lr=0.01",
    ];
    // run.num_rollouts (3 instead of 2) may change: it is progress, not the experiment
    let Err(err) = try_start(root.path(), 3, &changed) else {
        panic!("a resume with another seed and lr started");
    };
    let TrainerError::ConfigChanged { differences, .. } = &err else {
        panic!("unexpected error: {err}");
    };
    let keys: Vec<&str> = differences.iter().map(|d| d.key.as_str()).collect();
    assert_eq!(keys, ["optimizer.lr", "run.seed"], "{err}");
    let msg = err.to_string();
    assert!(msg.contains("run.seed: 3 -> 4"), "{msg}");
    assert!(msg.contains("--allow-config-changes"), "{msg}");
    assert!(
        snapshot(root.path()) == before,
        "a refused resume changed the directory"
    );

    // allowed explicitly: it resumes and records the differences
    let mut allowed = changed.to_vec();
    allowed.push("checkpoint.allow_config_changes=true");
    let mut run = try_start(root.path(), 3, &allowed).unwrap();
    assert_eq!(run.next_rollout(), 2);
    run.run(&StopFlag::new()).unwrap();
    let log = std::fs::read_to_string(run_dir(root.path()).join(CONFIG_CHANGES_FILE)).unwrap();
    assert!(log.contains("resumed from checkpoint 1"), "{log}");
    assert!(
        log.contains("run.seed: 3 -> 4") && log.contains("optimizer.lr"),
        "{log}"
    );
}

#[test]
fn an_unchanged_resume_passes_the_config_check() {
    let root = tempfile::tempdir().unwrap();
    finished_run(root.path(), 2);
    let run = try_start(
        root.path(),
        4,
        &["eval.interval=0", "checkpoint.resume=true"],
    )
    .unwrap();
    assert_eq!(run.next_rollout(), 2);
    assert!(!run_dir(root.path()).join(CONFIG_CHANGES_FILE).exists());
}

/// A finished run of 2 rollouts in `root` whose stored config lacks `line`, as a run
/// directory written before that key existed holds it.
fn finished_run_without(root: &Path, line: &str) {
    finished_run(root, 2);
    let resolved = run_dir(root).join("config.resolved.toml");
    let text = std::fs::read_to_string(&resolved).unwrap();
    let older = text.replace(line, "");
    assert_ne!(older, text, "the resolved config holds {line:?}");
    std::fs::write(&resolved, older).unwrap();
}

/// A resume of the run in `root` to 4 rollouts, with `extra` overrides.
fn resume(root: &Path, extra: &[&str]) -> Result<GaussianRun, TrainerError> {
    let mut o = vec!["eval.interval=0", "checkpoint.resume=true"];
    o.extend_from_slice(extra);
    try_start(root, 4, &o)
}

#[test]
fn a_resume_of_a_config_written_before_a_key_existed_compares_its_implied_value() {
    let root = tempfile::tempdir().unwrap();
    // a run directory from before `algorithm.anchor`: the key is absent from its config
    finished_run_without(root.path(), "anchor = \"replay\"\n");
    // it ran with the replayed anchor: resuming with it is no change ...
    let run = resume(root.path(), &[]).unwrap();
    assert_eq!(run.next_rollout(), 2);
    drop(run);
    // ... and resuming with the other one is
    let Err(err) = resume(root.path(), &["algorithm.anchor=\"rollout\""]) else {
        panic!("a resume that changed the anchor started");
    };
    assert!(
        err.to_string()
            .contains("algorithm.anchor: \"replay\" -> \"rollout\""),
        "{err}"
    );
}

/// A run directory from before `sampling.schedule_compat` ran with diffusers 0.35 / numpy 1
/// arithmetic: resuming it with the current default is a change, with the old value it is not.
#[test]
fn a_resume_of_a_config_written_before_schedule_compat_compares_it_as_diffusers_0_35() {
    let root = tempfile::tempdir().unwrap();
    finished_run_without(root.path(), "schedule_compat = \"current\"\n");
    let Err(err) = resume(root.path(), &[]) else {
        panic!("a resume that changed the schedule arithmetic started");
    };
    assert!(
        err.to_string()
            .contains("sampling.schedule_compat: \"diffusers_0_35\" -> \"current\""),
        "{err}"
    );
    let run = resume(
        root.path(),
        &["sampling.schedule_compat=\"diffusers_0_35\""],
    )
    .unwrap();
    assert_eq!(run.next_rollout(), 2);
}

/// A run directory from before `eval.sampling` evaluated deterministically: resuming it with
/// `"ode"` (the shapes recipe's) is no change, with `"sde"` it is.
#[test]
fn a_resume_of_a_config_written_before_eval_sampling_compares_it_as_ode() {
    let root = tempfile::tempdir().unwrap();
    finished_run_without(root.path(), "sampling = \"ode\"\n");
    let run = resume(root.path(), &[]).unwrap();
    assert_eq!(run.next_rollout(), 2);
    drop(run);
    let Err(err) = resume(root.path(), &["eval.sampling=\"sde\""]) else {
        panic!("a resume that changed the evaluation's sampling started");
    };
    assert!(
        err.to_string()
            .contains("eval.sampling: \"ode\" -> \"sde\""),
        "{err}"
    );
}

#[test]
fn a_bad_metrics_line_is_reported_before_the_first_rollout() {
    let root = tempfile::tempdir().unwrap();
    finished_run(root.path(), 2);
    let path = run_dir(root.path()).join("metrics.jsonl");
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.iter().position(|b| *b == b':').unwrap();
    bytes[at] = b'#';
    std::fs::write(&path, &bytes).unwrap();
    let before = snapshot(root.path());
    let Err(err) = try_start(
        root.path(),
        3,
        &["eval.interval=0", "checkpoint.resume=true"],
    ) else {
        panic!("a resume over a damaged metrics log started");
    };
    assert!(
        matches!(&err, TrainerError::MetricsLine { line: 1, .. }),
        "unexpected error: {err}"
    );
    assert!(
        snapshot(root.path()) == before,
        "a refused resume changed the directory"
    );

    // a log cut short of the checkpoint's cursor is refused too
    std::fs::write(&path, &bytes[..10]).unwrap();
    let Err(err) = try_start(
        root.path(),
        3,
        &["eval.interval=0", "checkpoint.resume=true"],
    ) else {
        panic!("a resume over a cut metrics log started");
    };
    assert!(
        matches!(&err, TrainerError::MetricsCursor { .. }),
        "unexpected error: {err}"
    );
}

#[test]
fn a_resume_with_nothing_committed_is_an_error_unless_allowed() {
    let root = tempfile::tempdir().unwrap();
    let Err(err) = try_start(root.path(), 2, &["checkpoint.resume=true"]) else {
        panic!("a resume with nothing committed started");
    };
    assert!(
        matches!(err, TrainerError::NothingToResume { .. }),
        "unexpected error: {err}"
    );
    assert!(err.to_string().contains("allow_fresh"), "{err}");
    assert!(
        !run_dir(root.path()).exists(),
        "a refused resume created the run directory"
    );
    let run = try_start(
        root.path(),
        2,
        &["checkpoint.resume=true", "checkpoint.allow_fresh=true"],
    )
    .unwrap();
    assert_eq!(run.next_rollout(), 0);
}

#[test]
fn a_damaged_latest_checkpoint_names_the_fallback_and_resume_from_uses_it() {
    let root = tempfile::tempdir().unwrap();
    finished_run(root.path(), 3);
    // damage the newest checkpoint's weights
    let task = std::fs::read_dir(root.path().join("ckpt"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let newest = task.join("iter_0000002");
    let weights = std::fs::read_dir(&newest)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("model")
        })
        .expect("a weights file");
    let mut bytes = std::fs::read(&weights).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xFF;
    std::fs::write(&weights, &bytes).unwrap();
    let before = snapshot(root.path());

    let resume = ["eval.interval=0", "checkpoint.resume=true"];
    let Err(err) = try_start(root.path(), 4, &resume) else {
        panic!("a resume from a damaged checkpoint started");
    };
    let msg = err.to_string();
    assert!(
        matches!(err, TrainerError::ResumeFailed { .. }),
        "unexpected error: {msg}"
    );
    assert!(msg.contains("iter_0000002"), "{msg}");
    assert!(msg.contains("older committed checkpoints: 0, 1"), "{msg}");
    assert!(msg.contains("--resume-from 1"), "{msg}");
    assert!(
        snapshot(root.path()) == before,
        "a refused resume changed the directory"
    );

    // an iteration that is not committed is refused, listing the committed ones
    let Err(err) = try_start(
        root.path(),
        4,
        &[
            "eval.interval=0",
            "checkpoint.resume=true",
            "checkpoint.resume_from=7",
        ],
    ) else {
        panic!("a resume from an absent iteration started");
    };
    assert!(err.to_string().contains("committed: 0, 1, 2"), "{err}");

    let mut run = try_start(
        root.path(),
        4,
        &[
            "eval.interval=0",
            "checkpoint.resume=true",
            "checkpoint.resume_from=1",
        ],
    )
    .unwrap();
    assert_eq!(run.next_rollout(), 2);
    assert!(!newest.exists(), "the newer checkpoint was not moved aside");
    let aside = std::fs::read_dir(&task)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("set_aside-")
        })
        .expect("a set-aside directory");
    assert!(aside.join("iter_0000002").is_dir());
    let summary = run.run(&StopFlag::new()).unwrap();
    assert_eq!(summary.last_rollout, Some(3));
}

/// Resumes the stopped 4-rollout run under `b` (its checkpoint after rollout 1) to its end
/// and checks it against the uninterrupted `straight` run under `a`, bit for bit.
fn resume_to_the_end(straight: &GaussianRun, a: &Path, b: &Path, cfg: &[&str]) {
    let mut resume = cfg.to_vec();
    resume.push("checkpoint.resume=true");
    let mut resumed = try_start(b, 4, &resume).unwrap();
    assert_eq!(resumed.next_rollout(), 2);
    resumed.run(&StopFlag::new()).unwrap();
    assert_eq!(delta(straight), delta(&resumed), "the resumed run diverged");
    assert_eq!(
        crash_harness::metrics(&run_dir(a)),
        crash_harness::metrics(&run_dir(b))
    );
}

fn committed(root: &Path) -> Vec<u64> {
    CheckpointStore::new(root.join("ckpt"), "t2i", None)
        .unwrap()
        .committed()
        .unwrap()
        .into_iter()
        .map(|c| c.iteration)
        .collect()
}

#[test]
fn a_stop_during_a_rollout_drops_it_and_commits_the_state_before_it() {
    let cfg = ["eval.interval=0", "checkpoint.save_interval=4"];
    let a = tempfile::tempdir().unwrap();
    let mut straight = start(a.path(), 4, &cfg);
    straight.run(&StopFlag::new()).unwrap();

    // a stop request while rollout 2 is scored (the third scoring)
    let b = tempfile::tempdir().unwrap();
    let stop = StopFlag::new();
    let mut run = try_start_stopping(b.path(), 4, &cfg, Some((stop.clone(), 3))).unwrap();
    let summary = run.run(&stop).unwrap();
    assert!(summary.stopped);
    assert_eq!(summary.last_rollout, Some(1));
    assert_eq!(
        committed(b.path()),
        [1],
        "the state after rollout 1 was committed"
    );
    drop(run);
    resume_to_the_end(&straight, a.path(), b.path(), &cfg);
}

#[test]
fn a_stop_inside_training_restores_the_state_before_the_rollout() {
    let cfg = ["eval.interval=0", "checkpoint.save_interval=4"];
    let a = tempfile::tempdir().unwrap();
    let mut straight = start(a.path(), 4, &cfg);
    straight.run(&StopFlag::new()).unwrap();
    // the conditionings one rollout's training restores (anchor and both updates)
    let per_rollout = straight.world().restores() / 4;
    assert!(per_rollout >= 4, "{per_rollout}");

    // half of them are the anchor's (one per group of the 16 samples), the other half the two
    // updates' micro-batches: a stop request at the first micro-batch of rollout 2's first
    // update, so that its second update (at least) finds the flag set
    assert_eq!(per_rollout % 2, 0, "{per_rollout}");
    let b = tempfile::tempdir().unwrap();
    let stop = StopFlag::new();
    let at = 2 * per_rollout + per_rollout / 2 + 1;
    let mut run = try_start_stopping_in_training(b.path(), 4, &cfg, (stop.clone(), at)).unwrap();
    let summary = run.run(&stop).unwrap();
    assert!(summary.stopped);
    assert_eq!(summary.last_rollout, Some(1));
    assert_eq!(committed(b.path()), [1]);
    drop(run);
    resume_to_the_end(&straight, a.path(), b.path(), &cfg);
}

#[test]
fn a_stop_during_the_first_rollout_commits_nothing() {
    let root = tempfile::tempdir().unwrap();
    let stop = StopFlag::new();
    let mut run = try_start_stopping(
        root.path(),
        4,
        &["eval.interval=0"],
        Some((stop.clone(), 1)),
    )
    .unwrap();
    let summary = run.run(&stop).unwrap();
    assert!(summary.stopped);
    assert_eq!(summary.last_rollout, None);
    assert!(committed(root.path()).is_empty());
}

#[test]
fn a_failed_checkpoint_write_is_counted_and_retried_or_fatal() {
    // a file where checkpoint 1's directory goes makes that one write fail with an IO error
    let block = |root: &Path| {
        let task = root.join("ckpt").join("t2i");
        std::fs::create_dir_all(&task).unwrap();
        std::fs::write(task.join("iter_0000001"), b"in the way").unwrap();
    };
    let root = tempfile::tempdir().unwrap();
    let mut run = start(root.path(), 3, &["eval.interval=0"]);
    block(root.path());
    let summary = run.run(&StopFlag::new()).unwrap();
    assert_eq!(summary.last_rollout, Some(2));
    assert_eq!(committed(root.path()), [0, 2]);
    let records = read_jsonl(&run_dir(root.path()).join("metrics.jsonl")).unwrap();
    let failures: Vec<Option<f64>> = records
        .iter()
        .map(|r| r.metrics[names::TRAIN_CHECKPOINT_FAILURES])
        .collect();
    assert_eq!(failures, [Some(0.0), Some(0.0), Some(1.0)]);

    let root = tempfile::tempdir().unwrap();
    let mut run = start(
        root.path(),
        3,
        &["eval.interval=0", "checkpoint.on_failure=\"fatal\""],
    );
    block(root.path());
    let err = run.run(&StopFlag::new()).unwrap_err();
    assert!(
        matches!(err, TrainerError::Io { .. }) && err.to_string().contains("iter_0000001"),
        "unexpected error: {err}"
    );
    assert_eq!(committed(root.path()), [0]);
}
