//! Throughput of the main job on one rank and on two (burn's collective runtime, CPU peers
//! in this process): samples per second of whole rollouts (rollout, scoring, advantages,
//! training, the collectives) and trained transitions per second of the training phase, the
//! median over the measured rollouts, for
//!
//! * 1 rank x 1 host thread,
//! * 1 rank x 2 host threads (the default on two cores),
//! * 2 ranks x 1 host thread each.
//!
//! The scaling figure is two ranks against one rank with one thread (the same per-rank work
//! on twice the cores) and against one rank with every thread (the same cores).
//!
//! `cargo bench --bench ranks [-- --rollouts N]` (the shapes-world recipe without evaluations;
//! the first rollout of each run is a warm-up and is not counted). A plain program, not
//! criterion: one measurement is a run of several seconds. docs/PERFORMANCE.md holds the
//! figures.

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::Path;

use burn::backend::{Autodiff, Flex};
use flowrl::trainer_fsdp::{
    Override, RecipeName, StopFlag, TrainConfig, dispatch::train_ranks, names, read_jsonl,
};

type B = Autodiff<Flex>;

struct Measured {
    samples_per_s: f64,
    transitions_per_s: f64,
    seconds_per_rollout: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    assert!(
        v.iter().all(|x| x.is_finite()),
        "a non-finite timing: {v:?}"
    );
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn measure(root: &Path, ranks: usize, threads: usize, rollouts: u64) -> Measured {
    let dir = root.join(format!("ranks{ranks}_threads{threads}"));
    let d = dir.display();
    let o = Override::parse_all(&[
        format!("run.num_rollouts={rollouts}"),
        "eval.interval=0".into(),
        format!("run.host_threads={threads}"),
        format!("checkpoint.dir={d}/checkpoints"),
        format!("artifacts.root={d}/artifacts"),
        format!("checkpoint.save_interval={rollouts}"),
        "monitor.progress=\"never\"".into(),
    ])
    .expect("overrides");
    let cfg = TrainConfig::from_recipe(RecipeName::ShapesWorldLora, &o).expect("recipe");
    let pre = cfg.preflight().expect("preflight");
    let devices = vec![Default::default(); ranks];
    // threads per rank: the run divides run.host_threads among its ranks
    let mut cfg = cfg;
    cfg.run.host_threads = Some(threads * ranks);
    train_ranks::<B>(&cfg, &pre, &dir, &devices, None, &StopFlag::new()).expect("run");
    let records = read_jsonl(&dir.join("metrics.jsonl")).expect("metrics");
    let samples = (cfg.rollout.prompts_per_rollout * cfg.rollout.group_size) as f64;
    // rollout i's record is written at its end: the interval from the previous record is its
    // whole wall time (rollout 0 is the warm-up)
    let walls: Vec<f64> = records
        .windows(2)
        .map(|w| w[1].wall_time - w[0].wall_time)
        .collect();
    let transitions: Vec<f64> = records[1..]
        .iter()
        .map(|r| {
            r.metrics
                .get(names::PERF_TRAIN_TRANSITIONS_PER_S)
                .copied()
                .flatten()
                .expect("perf/train_transitions_per_s")
        })
        .collect();
    let wall = median(walls);
    Measured {
        samples_per_s: samples / wall,
        transitions_per_s: median(transitions),
        seconds_per_rollout: wall,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rollouts = args
        .iter()
        .position(|a| a == "--rollouts")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(6u64);
    if args.iter().any(|a| a == "--list") {
        return;
    }
    let root = tempfile::tempdir().expect("temp dir");
    let configs = [(1, 1), (1, 2), (2, 1)];
    let mut results = Vec::new();
    for (ranks, threads) in configs {
        let m = measure(root.path(), ranks, threads, rollouts);
        println!(
            "ranks {ranks} x threads {threads}: {:.1} samples/s ({:.2} s per rollout of 64), {:.0} trained transitions/s",
            m.samples_per_s, m.seconds_per_rollout, m.transitions_per_s
        );
        results.push(m);
    }
    let (one_one, one_two, two_one) = (&results[0], &results[1], &results[2]);
    println!(
        "two ranks against one rank on one thread: {:.2}x samples/s, {:.2}x transitions/s (scaling efficiency {:.0}%)",
        two_one.samples_per_s / one_one.samples_per_s,
        two_one.transitions_per_s / one_one.transitions_per_s,
        50.0 * two_one.samples_per_s / one_one.samples_per_s
    );
    println!(
        "two ranks against one rank on both threads: {:.2}x samples/s, {:.2}x transitions/s",
        two_one.samples_per_s / one_two.samples_per_s,
        two_one.transitions_per_s / one_two.transitions_per_s
    );
}
