//! Crash safety end to end, with real processes.
//!
//! This test binary is also the child: run with `TRAINER_FSDP_CHILD_DIR` set, it trains the
//! tiny FlowGRPO world of `common` for `ROLLOUTS` rollouts, resuming from the last committed
//! checkpoint in that directory if there is one, writing a checkpoint and a metrics record after
//! every rollout, and sleeping `TRAINER_FSDP_CHILD_SLOW_MS` after each durable step of a
//! checkpoint write (so a kill can land inside the write window). SIGINT makes it stop after
//! the current rollout's committed checkpoint.
//!
//! The parent runs the child once uninterrupted (the reference), then kills it with SIGKILL at
//! random times and right after chosen write phases (at least 10 trials), and after each kill
//! checks that every committed checkpoint is complete and identical to the reference's at the
//! same iteration, that a resumed child starts right after the last committed iteration, and
//! that it ends with parameters and metrics identical to the reference. A last trial sends
//! SIGINT and checks the clean stop.

mod common;
mod crash_harness;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use burn::module::AutodiffModule;
use common::*;
use crash_harness::{Harness, say};
use trainer_fsdp::{
    CheckpointStore, Metrics, Monitor, Resume, StopFlag, TrainerRng, TrainerState, WritePhase,
    checkpoint, read_jsonl,
};

const ROLLOUTS: u64 = 5;
const TASK: &str = "t2i";
/// Committed checkpoints the child keeps (`all` for the reference run, which the trials'
/// checkpoints are compared against).
const CHILD_KEEP: &str = "TRAINER_FSDP_CHILD_KEEP";
/// What the trials keep: rotation runs (and is crashed into) too.
const TRIAL_KEEP: usize = 3;
const FINAL: &str = "final_params.bin";

/// The child keeps every checkpoint in the reference run, and rotates in the trials.
const HARNESS: Harness = Harness {
    dir_var: "TRAINER_FSDP_CHILD_DIR",
    slow_var: "TRAINER_FSDP_CHILD_SLOW_MS",
    extra_env: |dir| {
        let keep = if dir.ends_with("reference") {
            "all"
        } else {
            "rotate"
        };
        vec![(CHILD_KEEP, keep)]
    },
    show_stderr: true,
};

fn main() {
    match HARNESS.child_dir() {
        Some(dir) => child(&dir),
        None => parent(),
    }
}

// ---------------------------------------------------------------- child

fn child(dir: &Path) {
    let slow = HARNESS.slow();
    let stop = StopFlag::install().unwrap();
    let dev = Default::default();
    let keep = match std::env::var(CHILD_KEEP).as_deref() {
        Ok("all") => None,
        _ => Some(TRIAL_KEEP),
    };
    let store = CheckpointStore::new(dir.join("ckpt"), TASK, keep)
        .unwrap()
        .with_write_hook(Arc::new(move |it, phase| {
            say(&format!("PHASE {it} {phase:?}"));
            std::thread::sleep(slow);
        }));
    let mut opt = optimizer();
    let model = Policy::<AD>::init(21, &dev);
    let (mut model, mut rng, first, cursor) = match store
        .resume(model, opt.optimizer().clone(), None, &dev)
        .unwrap()
    {
        Resume::Fresh { model, .. } => {
            say("FRESH");
            (model, TrainerRng::seeded(7), 0, None)
        }
        Resume::Resumed(r) => {
            say(&format!("RESUMED {}", r.checkpoint.iteration));
            opt.set_optimizer(r.optimizer);
            opt.restore(&r.state);
            (
                r.model,
                r.rng,
                r.state.next_rollout_id(),
                Some(r.state.metrics_cursor),
            )
        }
    };
    let mut monitor = Monitor::open(dir, cursor, true, true).unwrap();
    for id in first..ROLLOUTS {
        let reports;
        (model, reports) = run_rollout(model, &mut opt, &mut rng);
        let mut metrics: Metrics = reports[1].metrics();
        metrics.remove(trainer_fsdp::names::PERF_TRAIN_TRANSITIONS_PER_S);
        metrics.remove(trainer_fsdp::names::PERF_TRAIN_SAMPLES_PER_S);
        monitor.log(id, &metrics).unwrap();
        let mut state = TrainerState::new(TASK, id);
        opt.record_into(&mut state);
        state.metrics_cursor = monitor.cursor();
        store
            .save(&model, opt.optimizer(), &state, &rng, None)
            .unwrap();
        say(&format!("SAVED {id}"));
        if stop.is_set() {
            say(&format!("STOPPED {id}"));
            return;
        }
    }
    let bytes: Vec<u8> = param_bytes(&model.valid()).concat();
    trajectory::write_atomic(&dir.join(FINAL), &bytes).unwrap();
    say("DONE");
}

// ---------------------------------------------------------------- parent

/// A read-only view of a run's checkpoints (reading never rotates).
fn store(dir: &Path) -> CheckpointStore {
    CheckpointStore::new(dir.join("ckpt"), TASK, None).unwrap()
}

/// Iterations whose directory has a COMMITTED marker, found without the store's code.
fn committed_on_disk(dir: &Path) -> Vec<u64> {
    let task = dir.join("ckpt").join(TASK);
    let mut out: Vec<u64> = std::fs::read_dir(&task)
        .map(|rd| {
            rd.filter_map(|e| {
                let e = e.unwrap();
                let name = e.file_name().into_string().unwrap();
                let it: u64 = name.strip_prefix("iter_")?.parse().ok()?;
                e.path()
                    .join(checkpoint::COMMITTED_FILE)
                    .is_file()
                    .then_some(it)
            })
            .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

fn file(dir: &Path, it: u64, name: &str) -> Vec<u8> {
    std::fs::read(store(dir).iteration_dir(it).join(name)).unwrap()
}

/// Every committed checkpoint of `dir` is complete and equal to the reference's.
fn check_committed(dir: &Path, reference: &Path) {
    let s = store(dir);
    for c in s.committed().unwrap() {
        let (state, rng, contract) = s.read_state(&c).unwrap_or_else(|e| {
            panic!("committed checkpoint {} is not complete: {e}", c.iteration)
        });
        assert!(contract.is_none());
        let (ref_state, ref_rng, _) = store(reference)
            .read_state(&trainer_fsdp::CommittedCheckpoint {
                iteration: c.iteration,
                dir: store(reference).iteration_dir(c.iteration),
            })
            .unwrap();
        assert_eq!(rng, ref_rng, "rng at {}", c.iteration);
        let strip = |mut s: TrainerState| {
            s.metrics_cursor = Default::default();
            s
        };
        assert_eq!(strip(state), strip(ref_state), "state at {}", c.iteration);
        // the weights file lists parameters in module order: byte-identical
        assert_eq!(
            file(dir, c.iteration, checkpoint::WEIGHTS_FILE),
            file(reference, c.iteration, checkpoint::WEIGHTS_FILE),
            "weights at {}",
            c.iteration
        );
        // the optimizer record is a hash map whose serialised order varies between processes:
        // compare what it does instead, one more rollout from each checkpoint
        assert_eq!(
            continuation(dir, c.iteration),
            continuation(reference, c.iteration),
            "optimizer state at {}",
            c.iteration
        );
    }
}

/// The parameters after one more rollout from checkpoint `it` of `dir`.
fn continuation(dir: &Path, it: u64) -> Vec<Vec<u8>> {
    let dev = Default::default();
    let s = store(dir);
    let ckpt = trainer_fsdp::CommittedCheckpoint {
        iteration: it,
        dir: s.iteration_dir(it),
    };
    let mut opt = optimizer();
    let r = s
        .load(
            &ckpt,
            Policy::<AD>::init(0, &dev),
            opt.optimizer().clone(),
            None,
            &dev,
        )
        .unwrap();
    opt.set_optimizer(r.optimizer);
    opt.restore(&r.state);
    let mut rng = r.rng;
    let (model, _) = run_rollout(r.model, &mut opt, &mut rng);
    param_bytes(&model)
}

/// The metrics log has exactly one record per rollout, in order, equal to the reference's.
fn check_metrics(dir: &Path, reference: &Path) {
    let strip = |p: &Path| {
        read_jsonl(&p.join(trainer_fsdp::monitor::JSONL_FILE))
            .unwrap()
            .into_iter()
            .map(|r| (r.step, r.metrics))
            .collect::<Vec<_>>()
    };
    let ours = strip(dir);
    assert_eq!(
        ours.iter().map(|r| r.0).collect::<Vec<_>>(),
        (0..ROLLOUTS).collect::<Vec<_>>()
    );
    assert_eq!(ours, strip(reference));
    let events = trainer_fsdp::read_events(&dir.join(trainer_fsdp::monitor::EVENTS_FILE)).unwrap();
    let steps: Vec<i64> = events.iter().skip(1).map(|e| e.step).collect();
    assert_eq!(steps, (0..ROLLOUTS as i64).collect::<Vec<_>>());
}

/// Resumes a killed run to the end and checks where it resumed and where it ended.
fn resume_and_check(dir: &Path, reference: &Path, trial: &str) {
    check_committed(dir, reference);
    let last = committed_on_disk(dir).last().copied();
    let lines = HARNESS.run_to_end(dir);
    let expect = match last {
        Some(it) => format!("RESUMED {it}"),
        None => "FRESH".into(),
    };
    assert_eq!(lines.first(), Some(&expect), "{trial}: {lines:?}");
    assert_eq!(
        std::fs::read(dir.join(FINAL)).unwrap(),
        std::fs::read(reference.join(FINAL)).unwrap(),
        "{trial}: final parameters differ from the uninterrupted run"
    );
    check_committed(dir, reference);
    check_metrics(dir, reference);
}

fn parent() {
    let start = Instant::now();
    let root = tempfile::tempdir().unwrap();
    let reference = root.path().join("reference");
    let t0 = Instant::now();
    let lines = HARNESS.run_to_end(&reference);
    let full = t0.elapsed();
    assert_eq!(lines.first().map(String::as_str), Some("FRESH"));
    assert_eq!(lines.last().map(String::as_str), Some("DONE"));
    assert_eq!(
        committed_on_disk(&reference),
        (0..ROLLOUTS).collect::<Vec<_>>()
    );
    let slow = 10u64;
    let mut passed = 0usize;
    type Trial = Box<dyn Fn(&Path) + Send + Sync>;
    let mut trials: Vec<(String, Trial)> = Vec::new();
    // mid-checkpoint kills, right after each durable step of a write
    for (it, phase) in [
        (0, WritePhase::Started),
        (1, WritePhase::Weights),
        (2, WritePhase::Optimizer),
        (1, WritePhase::Rng),
        (3, WritePhase::TrainerState),
        (2, WritePhase::Committed),
        (4, WritePhase::Optimizer),
    ] {
        let marker = format!("PHASE {it} {phase:?}");
        trials.push((
            format!("SIGKILL after `{marker}`"),
            Box::new(move |dir: &Path| {
                assert!(HARNESS.kill_at_marker(dir, slow, &marker), "{marker}")
            }),
        ));
    }
    // kills at random times across a slowed-down run
    let mut rng = TrainerRng::seeded(2024);
    let window = full.as_millis() as u64 + 5 * 7 * slow + 50;
    for _ in 0..5 {
        let ms = 20 + rng.below(window);
        trials.push((
            format!("SIGKILL after {ms} ms"),
            Box::new(move |dir: &Path| HARNESS.kill_after(dir, slow, Duration::from_millis(ms))),
        ));
    }
    // a second kill while the resumed run is itself in a write window
    trials.push((
        "SIGKILL twice".into(),
        Box::new(move |dir: &Path| {
            assert!(HARNESS.kill_at_marker(dir, slow, "PHASE 1 TrainerState"));
            assert!(HARNESS.kill_at_marker(dir, slow, "PHASE 3 Weights"));
        }),
    ));

    // two trials at a time (each is a sequence of processes on its own directory)
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Some((name, kill)) = trials.get(i) else {
                        break;
                    };
                    let dir = root.path().join(format!("trial{i}"));
                    kill(&dir);
                    resume_and_check(&dir, &reference, name);
                    println!("test sigkill trial {i:2} ({name}) ... ok");
                }
            });
        }
    });
    passed += trials.len();

    // Ctrl-C: the child stops cleanly after a committed checkpoint
    let dir = root.path().join("sigint");
    let mut child = HARNESS.spawn(&dir, 2 * slow, Stdio::piped());
    let out = child.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    for line in lines.by_ref() {
        if line.unwrap() == "PHASE 1 Weights" {
            // the shell's builtin `kill`: no procps needed
            let ok = Command::new("sh")
                .args(["-c", &format!("kill -INT {}", child.id())])
                .status()
                .unwrap()
                .success();
            assert!(ok, "kill -INT");
            break;
        }
    }
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    let status = child.wait().unwrap();
    assert!(status.success(), "a Ctrl-C'd run exits cleanly: {status:?}");
    assert_eq!(
        rest.last().map(String::as_str),
        Some("STOPPED 1"),
        "{rest:?}"
    );
    assert_eq!(committed_on_disk(&dir).last(), Some(&1));
    assert!(!dir.join(FINAL).exists());
    resume_and_check(&dir, &reference, "SIGINT");
    println!("test sigint clean stop ... ok");
    passed += 1;

    println!(
        "({} trials with SIGKILL, reference run {:.2?}, total {:.2?})",
        trials.len(),
        full,
        start.elapsed()
    );
    println!("sigkill: {passed} passed, 0 failed");
}
