//! Crash safety of the real training loop (the generic `Run` in the shapes world, on a tiny
//! generator), with real processes killed by SIGKILL.
//!
//! This test binary is also the child: with `SHAPES_LOOP_CHILD_DIR` set it runs the loop for
//! `ROLLOUTS` rollouts with a checkpoint after every rollout, resuming from the last committed
//! one if there is one, printing `PHASE <iteration> <phase>` after each durable step of a
//! checkpoint write and then sleeping `SHAPES_LOOP_CHILD_SLOW_MS` (so a kill can land inside
//! the write window), and finally writing the adapter's parameters to a file.
//!
//! The parent runs the child once uninterrupted (the reference), then kills it at 10 points
//! (right after chosen write phases, at random times, and twice in a row), resumes it to the
//! end each time, and checks that it resumed right after the last committed iteration and ended
//! with parameters and metrics identical to the reference.

mod crash_harness;
#[path = "shapes_common/mod.rs"]
mod shapes_common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use burn::module::AutodiffModule;
use crash_harness::{Harness, say};
use shapes_common::*;
use trainer_fsdp::{StopFlag, TrainerRng, WritePhase};

const ROLLOUTS: u64 = 4;
const FINAL: &str = "final_adapter.bin";

const HARNESS: Harness = Harness {
    dir_var: "SHAPES_LOOP_CHILD_DIR",
    slow_var: "SHAPES_LOOP_CHILD_SLOW_MS",
    extra_env: |_| Vec::new(),
    show_stderr: false,
};

fn main() {
    match HARNESS.child_dir() {
        Some(dir) => child(&dir),
        None => parent(),
    }
}

fn child(dir: &Path) {
    let slow = HARNESS.slow();
    let run = start_in(
        dir,
        &dir.join("run"),
        ROLLOUTS,
        &[
            "eval.interval=0",
            "checkpoint.resume=true",
            "checkpoint.allow_fresh=true",
            "checkpoint.max_to_keep=2",
        ],
        Box::new(Brightness),
    );
    say(&format!("START {}", run.next_rollout()));
    let mut run = run.with_checkpoint_hook(Arc::new(move |it, phase| {
        say(&format!("PHASE {it} {phase:?}"));
        std::thread::sleep(slow);
    }));
    run.run(&StopFlag::new()).unwrap();
    let bits: Vec<u8> = param_bits(&run.model().clone().valid())
        .into_iter()
        .flat_map(u32::to_le_bytes)
        .collect();
    trajectory::write_atomic(&dir.join(FINAL), &bits).unwrap();
    say("DONE");
}

/// A fresh trial directory holding the (shared, read-only) generator.
fn prepare(dir: &Path, generator: &Path) {
    copy_dir(generator, &dir.join("generator"));
}

fn resume_and_check(dir: &Path, reference: &Path, trial: &str) {
    let ours = HARNESS.resume_and_check(dir, reference, trial, FINAL);
    assert_eq!(
        ours.iter().map(|r| r.0).collect::<Vec<_>>(),
        (0..ROLLOUTS).collect::<Vec<_>>(),
        "{trial}"
    );
}

fn parent() {
    let start = Instant::now();
    let root = tempfile::tempdir().unwrap();
    let generator = root.path().join("generator");
    tiny_generator(&generator);
    let reference = root.path().join("reference");
    prepare(&reference, &generator);
    let t0 = Instant::now();
    let lines = HARNESS.run_to_end(&reference);
    let full = t0.elapsed();
    assert_eq!(
        lines
            .iter()
            .find(|l| l.starts_with("START"))
            .map(String::as_str),
        Some("START 0")
    );

    let slow = 30u64;
    type Trial = Box<dyn Fn(&Path) + Send + Sync>;
    let mut trials: Vec<(String, Trial)> = Vec::new();
    for (it, phase) in [
        (0, WritePhase::Weights),
        (1, WritePhase::Optimizer),
        (1, WritePhase::Rng),
        (2, WritePhase::TrainerState),
        (2, WritePhase::Committed),
        (3, WritePhase::Started),
    ] {
        let marker = format!("PHASE {it} {phase:?}");
        trials.push((
            format!("SIGKILL after `{marker}`"),
            Box::new(move |dir: &Path| {
                assert!(
                    HARNESS.kill_at_marker(dir, slow, &marker),
                    "{marker} never printed"
                )
            }),
        ));
    }
    let mut rng = TrainerRng::seeded(7);
    let window = full.as_millis() as u64 + ROLLOUTS * 7 * slow;
    for _ in 0..3 {
        let ms = 100 + rng.below(window);
        trials.push((
            format!("SIGKILL after {ms} ms"),
            Box::new(move |dir: &Path| HARNESS.kill_after(dir, slow, Duration::from_millis(ms))),
        ));
    }
    trials.push((
        "SIGKILL twice".into(),
        Box::new(move |dir: &Path| {
            assert!(HARNESS.kill_at_marker(dir, slow, "PHASE 0 TrainerState"));
            assert!(HARNESS.kill_at_marker(dir, slow, "PHASE 2 Weights"));
        }),
    ));
    let n = trials.len();
    assert!(n >= 10);

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
                    prepare(&dir, &generator);
                    kill(&dir);
                    resume_and_check(&dir, &reference, name);
                    println!("test sigkill_loop trial {i:2} ({name}) ... ok");
                }
            });
        }
    });
    println!(
        "\n({n} SIGKILL trials of the real loop, reference run {:.2}s, total {:.1}s)",
        full.as_secs_f64(),
        start.elapsed().as_secs_f64()
    );
}
