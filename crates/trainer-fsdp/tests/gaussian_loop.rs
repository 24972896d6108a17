//! The generic run in a second world, from outside the crate: the analytic Gaussian world
//! (`gaussian_world/`) goes through rollout, score, advantages, train, evaluate and
//! checkpoint in the same code as the shapes world, its held-out reward rises, and a run
//! killed by SIGKILL at any point — at random times, inside the checkpoint write window, and
//! before every one of its durable steps — resumes to the same end, bit for bit.
//!
//! This test binary is also the child: with `GAUSSIAN_CHILD_DIR` set it runs the loop for
//! `ROLLOUTS` rollouts (`DURABLE_ROLLOUTS` under a `durable/` directory), a checkpoint after
//! each, resuming from the last committed one, printing `PHASE <iteration> <phase>` after each
//! durable step of a checkpoint write and sleeping `GAUSSIAN_CHILD_SLOW_MS`, and finally
//! writing the policy's parameters to a file.

mod crash_harness;
mod gaussian_world;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crash_harness::{Harness, say};
use gaussian_world::*;
use trainer_fsdp::{
    EvalSummary, StopFlag, TrainerError, TrainerRng, WritePhase, names, read_jsonl,
};

const ROLLOUTS: u64 = 8;
/// Rollouts of the child runs under a `durable/` directory (the kill-before-every-step trials:
/// three rollouts cover every kind of durable step — config, sidecars, evaluation grids, metric
/// appends, every checkpoint file, markers and a rotation — in a few hundred steps).
const DURABLE_ROLLOUTS: &str = "3";
const ROLLOUTS_VAR: &str = "GAUSSIAN_CHILD_ROLLOUTS";
const FINAL: &str = "final_policy.bin";

const HARNESS: Harness = Harness {
    dir_var: "GAUSSIAN_CHILD_DIR",
    slow_var: "GAUSSIAN_CHILD_SLOW_MS",
    extra_env: |dir| {
        if dir.components().any(|c| c.as_os_str() == "durable") {
            vec![(ROLLOUTS_VAR, DURABLE_ROLLOUTS)]
        } else {
            Vec::new()
        }
    },
    show_stderr: false,
};

fn main() {
    if let Ok(node) = std::env::var(NODE_VAR) {
        return node_child(node.parse().expect("a node index"));
    }
    match HARNESS.child_dir() {
        Some(dir) => child(&dir),
        None => parent(),
    }
}

fn child(dir: &Path) {
    let slow = HARNESS.slow();
    let rollouts = std::env::var(ROLLOUTS_VAR)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ROLLOUTS);
    let run = start(
        dir,
        rollouts,
        &[
            "checkpoint.resume=true",
            "checkpoint.allow_fresh=true",
            "checkpoint.max_to_keep=2",
        ],
    );
    say(&format!("START {}", run.next_rollout()));
    let mut run = run.with_checkpoint_hook(Arc::new(move |it, phase| {
        say(&format!("PHASE {it} {phase:?}"));
        std::thread::sleep(slow);
    }));
    run.run(&StopFlag::new()).unwrap();
    say(&format!("STEPS {}", durable::fault::steps()));
    let bits: Vec<u8> = delta(&run)
        .into_iter()
        .flat_map(|v| v.to_bits().to_le_bytes())
        .collect();
    trajectory::write_atomic(&dir.join(FINAL), &bits).unwrap();
    say("DONE");
}

/// The reward rises: the held-out classes, never trained on, score better after training,
/// and the learned offset moved toward the reward's shift.
fn the_reward_rises() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = start(dir.path(), ROLLOUTS, &[]);
    let summary = run.run(&StopFlag::new()).unwrap();
    let (a, b) = (summary.initial_eval.unwrap(), summary.final_eval.unwrap());
    // the base policy samples N(m, s^2): closeness about -(SHIFT^2 + STD^2)
    let base = -f64::from(SHIFT * SHIFT + STD * STD);
    assert!(
        (a.reward - base).abs() < 5.0 * a.stderr + 0.05,
        "base policy: {a:?}, expected about {base}"
    );
    assert_rose("", &a, &b, 0.3, 10.0);
    let d = delta(&run);
    let mean = d.iter().sum::<f32>() / d.len() as f32;
    assert!(
        mean > 0.3,
        "the offset did not move toward the shift: {d:?}"
    );
    // the run logged its evaluations, their standard errors and categories
    let records = read_jsonl(&dir.path().join("run").join("metrics.jsonl")).unwrap();
    let last = records.last().unwrap();
    for key in ["eval/reward", "eval/reward_se", "eval/category/odd"] {
        assert!(last.metrics.get(key).is_some_and(Option::is_some), "{key}");
    }
    assert_eq!(last.metrics[names::TRAIN_OPTIMIZER_STEPS], Some(2.0));
    println!(
        "test the_reward_rises ... ok (held-out closeness {:.3} ± {:.3} -> {:.3} ± {:.3}, offset mean {mean:.3})",
        a.reward, a.stderr, b.reward, b.stderr
    );
}

/// A rollout whose every group scored alike has nothing to learn: its updates are skipped,
/// and nothing is replayed for it either (an anchor it never differentiates would only hold
/// an autodiff graph that no backward pass releases: a collapsed run grew by hundreds of MB a
/// rollout until it was killed). The same run with the closed-form reward replays the anchor
/// and both updates' micro-batches.
fn degenerate_rollouts_replay_nothing() {
    let cfg = ["eval.interval=0"];
    let dir = tempfile::tempdir().unwrap();
    let mut run = start_scoring_alike(dir.path(), 3, &cfg, -1.0);
    let summary = run.run(&StopFlag::new()).unwrap();
    assert_eq!(summary.last_rollout, Some(2));
    assert_eq!(
        run.world().restores(),
        0,
        "a degenerate rollout was replayed"
    );
    assert!(delta(&run).iter().all(|d| *d == 0.0), "{:?}", delta(&run));
    let records = read_jsonl(&dir.path().join("run").join("metrics.jsonl")).unwrap();
    for r in &records {
        assert_eq!(r.metrics[names::TRAIN_OPTIMIZER_STEPS], Some(0.0));
        assert_eq!(r.metrics[names::TRAIN_OPTIMIZER_SKIPS], Some(2.0));
    }

    let dir = tempfile::tempdir().unwrap();
    let mut run = start(dir.path(), 3, &cfg);
    run.run(&StopFlag::new()).unwrap();
    assert!(run.world().restores() > 0);
    assert!(delta(&run).iter().any(|d| *d != 0.0));
    println!(
        "test degenerate_rollouts_replay_nothing ... ok ({} restores with the closed-form reward, 0 when every sample scores alike)",
        run.world().restores()
    );
}

/// With the sampler's log-probs as pi_old (`algorithm.anchor = "rollout"`) nothing is
/// replayed before the updates, the first update's ratios stay at 1 to float rounding (the
/// parity it reports), and the reward rises as with the replayed anchor.
fn the_rollout_anchor_trains_too() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = start(dir.path(), ROLLOUTS, &["algorithm.anchor=\"rollout\""]);
    let summary = run.run(&StopFlag::new()).unwrap();
    let (a, b) = (summary.initial_eval.unwrap(), summary.final_eval.unwrap());
    assert_rose("", &a, &b, 0.3, 10.0);
    let resolved =
        std::fs::read_to_string(dir.path().join("run").join("config.resolved.toml")).unwrap();
    assert!(resolved.contains("anchor = \"rollout\""), "{resolved}");
    let parities = logged(dir.path(), names::TRAIN_LOGP_PARITY_MAX_ABS);
    assert_eq!(parities.len(), ROLLOUTS as usize, "one parity per rollout");
    let worst = parities.iter().fold(0.0f64, |acc, p| {
        assert!(p.is_finite(), "parity {p}");
        acc.max(*p)
    });
    assert!(
        worst < 1e-4,
        "the first update's ratios left 1 by {worst:e}"
    );
    println!(
        "test the_rollout_anchor_trains_too ... ok (held-out closeness {:.3} -> {:.3}, parity at most {worst:.1e})",
        a.reward, b.reward
    );
}

/// AWM trains on the rollouts' clean endpoints through the forward process, in the same loop,
/// with either weighting: the sidecars carry the endpoints, the held-out reward rises and the
/// offset moves toward the reward's shift.
fn awm_trains_on_clean_endpoints() {
    for weighting in ["uniform", "huber"] {
        let dir = tempfile::tempdir().unwrap();
        let w = format!("algorithm.weighting=\"{weighting}\"");
        let mut run = start_awm(dir.path(), ROLLOUTS, &[&w]);
        let summary = run.run(&StopFlag::new()).unwrap();
        let (a, b) = (summary.initial_eval.unwrap(), summary.final_eval.unwrap());
        assert_rose(&format!("AWM ({weighting}): "), &a, &b, 0.3, 10.0);
        let d = delta(&run);
        let mean = d.iter().sum::<f32>() / d.len() as f32;
        assert!(
            mean > 0.3,
            "AWM ({weighting}): the offset did not move: {d:?}"
        );
        let records = read_jsonl(&dir.path().join("run").join("metrics.jsonl")).unwrap();
        let first = records
            .iter()
            .find(|r| r.metrics.contains_key(names::TRAIN_RATIO_MAX))
            .unwrap();
        assert!(first.metrics[names::TRAIN_OPTIMIZER_STEPS] == Some(2.0));
        let sidecars: Vec<_> = walk(&dir.path().join("artifacts"))
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .collect();
        assert!(!sidecars.is_empty());
        for p in &sidecars {
            let t = trajectory::read_sidecar(p).unwrap();
            assert!(
                t.tracks.endpoint.is_some(),
                "{} has no endpoints",
                p.display()
            );
        }
        println!(
            "test awm_trains_on_clean_endpoints ({weighting}) ... ok (held-out closeness {:.3} ± {:.3} -> {:.3} ± {:.3}, offset mean {mean:.3})",
            a.reward, a.stderr, b.reward, b.stderr
        );
    }
}

/// The KL to the reference policy (here the exact base model, `delta = 0`) holds the policy
/// near it: under FlowGRPO (flow_grpo's transition KL) and AWM (the velocity KL), a run with
/// the term learns a smaller offset than the same run without it, and logs the term's mean
/// as `train/kl_ref` every rollout.
fn kl_to_the_reference_holds_the_policy_near_the_base() {
    let offset = |d: Vec<f32>| d.iter().map(|v| f64::from(*v)).sum::<f64>() / d.len() as f64;
    for (algorithm, kl) in [("flow_grpo", "10.0"), ("awm", "0.3")] {
        let kl_key = format!("algorithm.kl_coef={kl}");
        let (free, held, records) = {
            let a = tempfile::tempdir().unwrap();
            let b = tempfile::tempdir().unwrap();
            let (free, held) = if algorithm == "awm" {
                let mut r = start_awm(a.path(), ROLLOUTS, &[]);
                r.run(&StopFlag::new()).unwrap();
                let free = offset(delta(&r));
                let mut r = start_awm(b.path(), ROLLOUTS, &[&kl_key]);
                r.run(&StopFlag::new()).unwrap();
                (free, offset(delta(&r)))
            } else {
                let mut r = start(a.path(), ROLLOUTS, &[]);
                r.run(&StopFlag::new()).unwrap();
                let free = offset(delta(&r));
                let mut r = start(b.path(), ROLLOUTS, &[&kl_key]);
                r.run(&StopFlag::new()).unwrap();
                (free, offset(delta(&r)))
            };
            let records = read_jsonl(&b.path().join("run").join("metrics.jsonl")).unwrap();
            (free, held, records)
        };
        let kls: Vec<f64> = records
            .iter()
            .filter_map(|r| r.metrics.get(names::TRAIN_KL_REF).copied().flatten())
            .collect();
        assert_eq!(
            kls.len() as u64,
            ROLLOUTS,
            "{algorithm}: train/kl_ref per rollout"
        );
        assert!(
            kls.iter().all(|k| k.is_finite() && *k >= 0.0) && kls.iter().any(|k| *k > 0.0),
            "{algorithm}: train/kl_ref {kls:?}"
        );
        assert!(
            held < 0.8 * free && held > 0.0,
            "{algorithm}: the offset with the KL term ({held:.3}) is not held below the free one ({free:.3})"
        );
        println!(
            "test kl_to_the_reference ({algorithm}, kl_coef {kl}) ... ok (offset {free:.3} without, {held:.3} with; train/kl_ref {:.2e} -> {:.2e})",
            kls[0],
            kls[kls.len() - 1]
        );
    }
}

/// `[ema]`: the EMA copy trails the live policy, evaluations sample with it (the logged
/// final evaluation is the EMA's), checkpoints hold it in `ema.mpk`, and a run resumed from a
/// checkpoint ends with the same live and EMA weights, bit for bit, as one that never stopped.
/// AWM's EMA KL term is logged as `train/kl_ema`.
fn the_ema_is_evaluated_checkpointed_and_resumed_exactly() {
    const EMA: &str = "ema={ decay = 0.6, warmup = \"flow_grpo\", update_interval = 1 }";
    let whole = tempfile::tempdir().unwrap();
    let mut run = start(whole.path(), 6, &[EMA]);
    let summary = run.run(&StopFlag::new()).unwrap();
    let (live, ema) = (delta(&run), ema_delta(&run));
    let mean = |d: &[f32]| d.iter().sum::<f32>() / d.len() as f32;
    assert!(
        mean(&ema) > 0.0 && mean(&ema) < mean(&live),
        "the EMA ({}) does not trail the live offset ({})",
        mean(&ema),
        mean(&live)
    );
    // the final evaluation is the EMA's
    let again = run.evaluate("again").unwrap();
    assert_eq!(
        again.reward.to_bits(),
        summary.final_eval.unwrap().reward.to_bits()
    );
    let ckpt = whole.path().join("ckpt");
    assert!(
        walk(&ckpt)
            .iter()
            .any(|p| p.file_name().is_some_and(|n| n == "ema.mpk")),
        "no ema.mpk under {}",
        ckpt.display()
    );
    // stopped after 3 rollouts, then resumed to 6
    let parts = tempfile::tempdir().unwrap();
    start(parts.path(), 3, &[EMA])
        .run(&StopFlag::new())
        .unwrap();
    let mut resumed = start(parts.path(), 6, &[EMA, "checkpoint.resume=true"]);
    assert_eq!(resumed.next_rollout(), 3);
    resumed.run(&StopFlag::new()).unwrap();
    let bits = |d: Vec<f32>| d.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    assert_eq!(bits(delta(&resumed)), bits(live.clone()));
    assert_eq!(bits(ema_delta(&resumed)), bits(ema.clone()));
    // AWM against the EMA
    let awm = tempfile::tempdir().unwrap();
    let mut run = start_awm(awm.path(), 3, &[EMA, "algorithm.ema_kl_coef=1.0"]);
    run.run(&StopFlag::new()).unwrap();
    let records = read_jsonl(&awm.path().join("run").join("metrics.jsonl")).unwrap();
    let kls: Vec<f64> = records
        .iter()
        .filter_map(|r| r.metrics.get(names::TRAIN_KL_EMA).copied().flatten())
        .collect();
    assert!(
        kls.len() == 3
            && kls.iter().all(|k| k.is_finite() && *k >= 0.0)
            && kls.iter().any(|k| *k > 0.0),
        "train/kl_ema {kls:?}"
    );
    // without [ema] the term is refused before anything runs
    let none = tempfile::tempdir().unwrap();
    let err = config(
        none.path(),
        1,
        &["algorithm={ kind = \"awm\", ema_kl_coef = 1.0 }"],
    )
    .preflight()
    .unwrap_err()
    .to_string();
    assert!(err.contains("algorithm.ema_kl_coef"), "{err}");
    println!(
        "test the_ema ... ok (offset {:.3} live, {:.3} EMA; resumed bit for bit; train/kl_ema {:.2e})",
        mean(&live),
        mean(&ema),
        kls[2]
    );
}

/// DiffusionNFT end to end: deterministic rollouts from the sampling copy store endpoints
/// alone (no SDE step in the sidecars), the held-out reward rises, the checkpoints keep the
/// sampling copy (`sampler.mpk`), and a resumed run ends bit for bit where an uninterrupted
/// one does.
fn nft_trains_on_deterministic_rollouts() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = start_nft(dir.path(), ROLLOUTS, &[]);
    let summary = run.run(&StopFlag::new()).unwrap();
    let (a, b) = (summary.initial_eval.unwrap(), summary.final_eval.unwrap());
    assert_rose("NFT: ", &a, &b, 0.3, 5.0);
    let live = delta(&run);
    let mean = live.iter().sum::<f32>() / live.len() as f32;
    assert!(mean > 0.15, "NFT: the offset did not move: {live:?}");
    let records = read_jsonl(&dir.path().join("run").join("metrics.jsonl")).unwrap();
    let first = records
        .iter()
        .find(|r| r.metrics.contains_key(names::TRAIN_NFT_OPTIMALITY_MEAN))
        .expect("NFT metrics logged");
    for key in [
        names::TRAIN_NFT_POSITIVE_ERROR,
        names::TRAIN_NFT_NEGATIVE_ERROR,
        names::TRAIN_KL_REF,
        names::TRAIN_SAMPLER_DECAY,
    ] {
        assert!(
            first
                .metrics
                .get(key)
                .copied()
                .flatten()
                .is_some_and(f64::is_finite),
            "{key}: {:?}",
            first.metrics.get(key)
        );
    }
    let sidecars: Vec<_> = walk(&dir.path().join("artifacts"))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    assert!(!sidecars.is_empty());
    for p in &sidecars {
        let t = trajectory::read_sidecar(p).unwrap();
        assert!(t.common.sde_indices.is_empty() && t.tracks.log_probs.is_empty());
        assert!(t.tracks.endpoint.is_some(), "{}", p.display());
    }
    assert!(
        walk(&dir.path().join("ckpt"))
            .iter()
            .any(|p| p.file_name().is_some_and(|n| n == "sampler.mpk"))
    );
    // stopped after 3 rollouts, then resumed: the same end, bit for bit
    let parts = tempfile::tempdir().unwrap();
    start_nft(parts.path(), 3, &[])
        .run(&StopFlag::new())
        .unwrap();
    let mut resumed = start_nft(parts.path(), ROLLOUTS, &["checkpoint.resume=true"]);
    assert_eq!(resumed.next_rollout(), 3);
    resumed.run(&StopFlag::new()).unwrap();
    let bits = |d: Vec<f32>| d.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    assert_eq!(bits(delta(&resumed)), bits(live));
    println!(
        "test nft_trains_on_deterministic_rollouts ... ok (held-out closeness {:.3} ± {:.3} -> {:.3} ± {:.3}, offset mean {mean:.3}; resumed bit for bit)",
        a.reward, a.stderr, b.reward, b.stderr
    );
}

/// Online DPO end to end: each group's best and worst sample pair up, the held-out reward
/// rises, the implicit accuracy is logged, and a group size of 1 or micro-batches that split
/// groups are refused by preflight.
fn dpo_trains_on_each_groups_best_and_worst() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = start_dpo(dir.path(), ROLLOUTS, &[]);
    let summary = run.run(&StopFlag::new()).unwrap();
    let (a, b) = (summary.initial_eval.unwrap(), summary.final_eval.unwrap());
    assert_rose("DPO: ", &a, &b, 0.3, 5.0);
    let d = delta(&run);
    let mean = d.iter().sum::<f32>() / d.len() as f32;
    assert!(mean > 0.15, "DPO: the offset did not move: {d:?}");
    let accuracy = logged(dir.path(), names::TRAIN_DPO_IMPLICIT_ACCURACY);
    assert_eq!(accuracy.len() as u64, ROLLOUTS);
    assert!(
        accuracy.iter().all(|a| (0.0..=1.0).contains(a)),
        "{accuracy:?}"
    );
    let pairs = logged(dir.path(), names::TRAIN_DPO_PAIRS)[0];
    // 4 groups of 4 over 2 updates, 2 timesteps: 2 pairs x 2 timesteps per update
    assert_eq!(pairs, 4.0);
    let none = tempfile::tempdir().unwrap();
    for (extra, key) in [
        ("rollout.group_size=1", "rollout.group_size"),
        ("rollout.micro_batch_size=2", "rollout.micro_batch_size"),
    ] {
        let err = config(
            none.path(),
            1,
            &["algorithm={ kind = \"dpo\" }", "sampling.eta=0.0", extra],
        )
        .preflight()
        .unwrap_err()
        .to_string();
        assert!(err.contains(key), "{extra}: {err}");
    }
    println!(
        "test dpo_trains_on_each_groups_best_and_worst ... ok (held-out closeness {:.3} ± {:.3} -> {:.3} ± {:.3}, offset mean {mean:.3}, implicit accuracy {:.2} -> {:.2})",
        a.reward,
        a.stderr,
        b.reward,
        b.stderr,
        accuracy[0],
        accuracy[accuracy.len() - 1]
    );
}

/// RAFT end to end: each group's best sample is fine-tuned on, the held-out reward rises,
/// the samples selected are logged, and a `top_k` of the whole group is refused.
fn raft_fine_tunes_on_each_groups_best() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = start_raft(dir.path(), ROLLOUTS, &[]);
    let summary = run.run(&StopFlag::new()).unwrap();
    let (a, b) = (summary.initial_eval.unwrap(), summary.final_eval.unwrap());
    assert_rose("RAFT: ", &a, &b, 0.3, 5.0);
    let selected = logged(dir.path(), names::TRAIN_RAFT_SELECTED);
    assert_eq!(selected.len() as u64, ROLLOUTS);
    // 4 groups of 4 over 2 updates: the best of 2 groups per update
    assert_eq!(selected[0], 2.0);
    let error = logged(dir.path(), names::TRAIN_RAFT_ERROR);
    assert!(error.iter().all(|e| e.is_finite() && *e > 0.0), "{error:?}");
    let none = tempfile::tempdir().unwrap();
    let err = config(
        none.path(),
        1,
        &[
            "algorithm={ kind = \"raft\", top_k = 4 }",
            "sampling.eta=0.0",
        ],
    )
    .preflight()
    .unwrap_err()
    .to_string();
    assert!(err.contains("algorithm.top_k"), "{err}");
    let err = config(none.path(), 1, &["algorithm={ kind = \"raft\" }"])
        .preflight()
        .unwrap_err()
        .to_string();
    assert!(err.contains("sampling.eta"), "{err}");
    println!(
        "test raft_fine_tunes_on_each_groups_best ... ok (held-out closeness {:.3} ± {:.3} -> {:.3} ± {:.3}, flow-matching error {:.3} -> {:.3})",
        a.reward,
        a.stderr,
        b.reward,
        b.stderr,
        error[0],
        error[error.len() - 1]
    );
}

/// DPOK through FlowGRPO's replay and anchor: the clamped ratio with the release's reward
/// weight and KL to the reference; the held-out reward rises and the KL is logged.
fn dpok_trains_with_its_clamped_ratio() {
    let dir = tempfile::tempdir().unwrap();
    // the KL term is left out of the first 3 rollouts (the release's `--kl_warmup 2`)
    let warmup = 3;
    let mut run = start(
        dir.path(),
        ROLLOUTS,
        &["algorithm={ kind = \"dpok\", kl_warmup_rollouts = 3 }"],
    );
    assert_eq!(
        trainer_fsdp::Algorithm::<Train, GaussianWorld>::name(run.algorithm()),
        "DPOK"
    );
    let summary = run.run(&StopFlag::new()).unwrap();
    let (a, b) = (summary.initial_eval.unwrap(), summary.final_eval.unwrap());
    assert_rose("DPOK: ", &a, &b, 0.3, 5.0);
    let records = read_jsonl(&dir.path().join("run").join("metrics.jsonl")).unwrap();
    let kls: Vec<bool> = records
        .iter()
        // the rollouts' records (the first is the evaluation before training)
        .filter(|r| r.metrics.contains_key(names::TRAIN_OPTIMIZER_STEPS))
        .map(|r| {
            r.metrics
                .get(names::TRAIN_KL_REF)
                .copied()
                .flatten()
                .is_some_and(f64::is_finite)
        })
        .collect();
    let expected: Vec<bool> = (0..ROLLOUTS).map(|i| i >= warmup).collect();
    assert_eq!(kls, expected, "the rollouts with a KL term");
    println!(
        "test dpok_trains_with_its_clamped_ratio ... ok (held-out closeness {:.3} ± {:.3} -> {:.3} ± {:.3})",
        a.reward, a.stderr, b.reward, b.stderr
    );
}

/// DPOK with the release's learned value baseline (`algorithm.value_baseline`): each trained
/// step's advantage is `r - V(x_t, c, t)`; the held-out reward rises, the buffer fills by one row per (sample, trained
/// step), the fit's loss falls, the checkpoints hold the baseline's files, and a stop inside a
/// rollout's training (after its fit) followed by a resume ends bit for bit where an
/// uninterrupted run does: the baseline is rolled back with the policy and restored exactly.
fn dpok_fits_a_value_baseline_and_resumes_exactly() {
    const VALUE: &str = "algorithm={ kind = \"dpok\", value_baseline = { hidden = 16, batch_size = 32, lr = 0.01 } }";
    let dir = tempfile::tempdir().unwrap();
    let mut run = start(dir.path(), ROLLOUTS, &[VALUE]);
    assert!(run.algorithm().value_settings().is_some());
    let summary = run.run(&StopFlag::new()).unwrap();
    let (a, b) = (summary.initial_eval.unwrap(), summary.final_eval.unwrap());
    assert_rose("DPOK with a value baseline: ", &a, &b, 0.2, 5.0);
    let losses = logged(dir.path(), names::TRAIN_VALUE_LOSS);
    assert_eq!(losses.len() as u64, ROLLOUTS, "{losses:?}");
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    // 4 groups of 4 samples, 2 trained steps: 32 rows per rollout
    let rows = logged(dir.path(), names::TRAIN_VALUE_BUFFER_ROWS);
    let want: Vec<f64> = (1..=ROLLOUTS).map(|k| (32 * k) as f64).collect();
    assert_eq!(rows, want);
    let advantage = logged(dir.path(), names::TRAIN_VALUE_ADVANTAGE_MEAN);
    let last = losses.len() - 1;
    assert!(
        losses[last] < 0.5 * losses[0],
        "the value fit's loss did not fall: {losses:?}"
    );
    assert!(
        advantage[last].abs() < advantage[0].abs(),
        "the baseline did not move toward the rewards: {advantage:?}"
    );
    let files: Vec<String> = walk(&dir.path().join("ckpt"))
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    for f in trainer_fsdp::value::VALUE_FILES {
        assert!(files.iter().any(|n| n == f), "{f}: {files:?}");
    }
    let live = delta(&run);
    let per_rollout = run.world().restores() / ROLLOUTS as usize;
    drop(run);

    // a stop at the first micro-batch of rollout 4's first update (the anchor restores half
    // of a rollout's conditionings, the updates the other half), then a resume to the end
    let parts = tempfile::tempdir().unwrap();
    let stop = StopFlag::new();
    let at = 4 * per_rollout + per_rollout / 2 + 1;
    let mut stopped =
        try_start_stopping_in_training(parts.path(), ROLLOUTS, &[VALUE], (stop.clone(), at))
            .unwrap();
    let s = stopped.run(&stop).unwrap();
    assert!(s.stopped);
    assert_eq!(s.last_rollout, Some(3));
    drop(stopped);
    let mut resumed = start(parts.path(), ROLLOUTS, &[VALUE, "checkpoint.resume=true"]);
    assert_eq!(resumed.next_rollout(), 4);
    resumed.run(&StopFlag::new()).unwrap();
    let bits = |d: Vec<f32>| d.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    assert_eq!(bits(delta(&resumed)), bits(live));
    println!(
        "test dpok_fits_a_value_baseline_and_resumes_exactly ... ok (held-out closeness {:.3} ± {:.3} -> {:.3} ± {:.3}; value loss {:.3} -> {:.3}, mean r - V {:.3} -> {:.3}; resumed bit for bit)",
        a.reward,
        a.stderr,
        b.reward,
        b.stderr,
        losses[0],
        losses[last],
        advantage[0],
        advantage[last]
    );
}

/// GRPO-Guard through FlowGRPO's replay: the regulated ratio against the replayed anchor
/// (its log-probs and transition means); the held-out reward rises, and the anchor agrees
/// with the sampler's log-probs.
fn grpo_guard_trains_with_its_regulated_ratio() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = start_guard(dir.path(), ROLLOUTS, &[]);
    assert_eq!(
        trainer_fsdp::Algorithm::<Train, GaussianWorld>::name(run.algorithm()),
        "GRPO-Guard"
    );
    let summary = run.run(&StopFlag::new()).unwrap();
    let (a, b) = (summary.initial_eval.unwrap(), summary.final_eval.unwrap());
    assert_rose("GRPO-Guard: ", &a, &b, 0.3, 5.0);
    let parity = logged(dir.path(), names::TRAIN_LOGP_PARITY_MAX_ABS);
    assert_eq!(parity.len() as u64, ROLLOUTS);
    assert!(parity.iter().all(|p| *p < 1e-5), "{parity:?}");
    println!(
        "test grpo_guard_trains_with_its_regulated_ratio ... ok (held-out closeness {:.3} ± {:.3} -> {:.3} ± {:.3})",
        a.reward, a.stderr, b.reward, b.stderr
    );
}

/// A decaying rate that the run ends before `min_lr` is reported with the step count that
/// would finish it; one that ends on time is not.
fn an_unfinished_decay_is_reported() {
    let cosine = |decay: &str| {
        [
            "eval.interval=0".to_string(),
            "optimizer.lr_scheduler=\"cosine\"".to_string(),
            format!("optimizer.lr_decay_iters={decay}"),
        ]
    };
    let dir = tempfile::tempdir().unwrap();
    let long = cosine("100");
    let long: Vec<&str> = long.iter().map(String::as_str).collect();
    let summary = start(dir.path(), 2, &long).run(&StopFlag::new()).unwrap();
    let u = summary
        .unfinished_decay
        .expect("the cosine ends at step 100");
    assert_eq!((u.optimizer_steps, u.decay_iters), (4, 100), "{u:?}");
    assert!(u.lr > u.min_lr, "{u:?}");
    assert!(
        u.to_string()
            .contains("set optimizer.lr_decay_iters = 4 to decay over the whole run"),
        "{u}"
    );
    let dir = tempfile::tempdir().unwrap();
    let exact = cosine("4");
    let exact: Vec<&str> = exact.iter().map(String::as_str).collect();
    let summary = start(dir.path(), 2, &exact).run(&StopFlag::new()).unwrap();
    assert_eq!(summary.unfinished_decay, None);
    let dir = tempfile::tempdir().unwrap();
    let summary = start(dir.path(), 2, &["eval.interval=0"])
        .run(&StopFlag::new())
        .unwrap();
    assert_eq!(
        summary.unfinished_decay, None,
        "a constant rate has no decay"
    );
    println!("test an_unfinished_decay_is_reported ... ok");
}

/// `run.cpu_budget_seconds`: a run whose budget is spent after its first rollout stops
/// there, evaluated and checkpointed, and every rollout logs `perf/train_cpu_seconds`.
fn the_cpu_budget_ends_the_run_with_an_evaluation() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = start(dir.path(), ROLLOUTS, &["run.cpu_budget_seconds=1e-9"]);
    let summary = run.run(&StopFlag::new()).unwrap();
    assert_eq!(summary.last_rollout, Some(0));
    assert!(!summary.stopped && summary.final_eval.is_some());
    let records = read_jsonl(&dir.path().join("run").join("metrics.jsonl")).unwrap();
    let last = records.last().unwrap();
    let cpu = last.metrics[names::PERF_TRAIN_CPU_SECONDS].unwrap();
    assert!(cpu > 0.0, "{cpu}");
    assert!(last.metrics.contains_key(trainer_fsdp::run::EVAL_REWARD));
    assert!(
        walk(&dir.path().join("ckpt"))
            .iter()
            .any(|p| p.ends_with("COMMITTED"))
    );
    println!("test the_cpu_budget_ends_the_run_with_an_evaluation ... ok ({cpu:.3} CPU s)");
}

/// MixGRPO's sampling under FlowGRPO's objective (`mix_grpo`): the sliding window of 2
/// trained steps moves after 5 rollouts, DPM-Solver++(2M) runs the other steps, and the
/// reward rises.
fn mix_grpo_trains_on_its_sliding_window() {
    let dir = tempfile::tempdir().unwrap();
    let mut run: GaussianRun = start_with(dir.path(), ROLLOUTS, "mix_grpo", &[]);
    let summary = run.run(&StopFlag::new()).unwrap();
    let (a, b) = (summary.initial_eval.unwrap(), summary.final_eval.unwrap());
    assert_rose("MixGRPO: ", &a, &b, 0.3, 5.0);
    let mut seen: Vec<Vec<usize>> = stored_steps(dir.path());
    seen.sort();
    seen.dedup();
    // the last rollouts kept on disk are past the first shift (6 steps, span [1, 5))
    assert_eq!(seen, vec![vec![2, 3]], "{seen:?}");
    // the metrics follow the window: [1, 2] for rollouts 0-4, then [2, 3]
    let first = logged(dir.path(), names::ROLLOUT_FIRST_TRAINED_STEP);
    let last = logged(dir.path(), names::ROLLOUT_LAST_TRAINED_STEP);
    assert_eq!(first, [1., 1., 1., 1., 1., 2., 2., 2.], "{first:?}");
    assert_eq!(last, [2., 2., 2., 2., 2., 3., 3., 3.], "{last:?}");
    println!(
        "test mix_grpo_trains_on_its_sliding_window ... ok (held-out closeness {:.3} ± {:.3} -> {:.3} ± {:.3})",
        a.reward, a.stderr, b.reward, b.stderr
    );
}

/// DanceGRPO (`dance_grpo`): the Dance kernel on every step but the last, one `x_T` per
/// group, and each sample replaying its own random 3 of the 5 trained steps; the replayed
/// anchor agrees with the sampler's log-probs at each sample's own steps (a position mixed
/// up between the replay and the rollout's record would show here), and the reward rises.
fn dance_grpo_trains_on_per_sample_subsets() {
    let dir = tempfile::tempdir().unwrap();
    let mut run: GaussianRun = start_with(
        dir.path(),
        ROLLOUTS,
        "dance_grpo",
        &[
            "sampling.sde_indices=[0, 1, 2, 3, 4]",
            "sampling.num_sde_steps=5",
        ],
    );
    let summary = run.run(&StopFlag::new()).unwrap();
    let (a, b) = (summary.initial_eval.unwrap(), summary.final_eval.unwrap());
    assert_rose("DanceGRPO: ", &a, &b, 0.3, 5.0);
    let parity = logged(dir.path(), names::TRAIN_LOGP_PARITY_MAX_ABS);
    assert_eq!(parity.len() as u64, ROLLOUTS);
    assert!(parity.iter().all(|p| *p < 1e-5), "{parity:?}");
    let seen: Vec<Vec<usize>> = stored_steps(dir.path());
    assert!(
        !seen.is_empty() && seen.iter().all(|s| s == &[0, 1, 2, 3, 4]),
        "{seen:?}"
    );
    // with the sampler's log-probs as pi_old, each sample's are picked at its own steps: the
    // first update's ratios stay at 1 to float rounding
    let dir = tempfile::tempdir().unwrap();
    let mut run: GaussianRun = start_with(
        dir.path(),
        2,
        "dance_grpo",
        &[
            "sampling.sde_indices=[0, 1, 2, 3, 4]",
            "sampling.num_sde_steps=5",
            "algorithm.anchor=\"rollout\"",
        ],
    );
    run.run(&StopFlag::new()).unwrap();
    let rollout_parity = logged(dir.path(), names::TRAIN_LOGP_PARITY_MAX_ABS);
    assert_eq!(rollout_parity.len(), 2);
    assert!(
        rollout_parity.iter().all(|p| p.is_finite() && *p < 1e-4),
        "{rollout_parity:?}"
    );
    println!(
        "test dance_grpo_trains_on_per_sample_subsets ... ok (held-out closeness {:.3} ± {:.3} -> {:.3} ± {:.3}; rollout anchor parity {:.1e})",
        a.reward,
        a.stderr,
        b.reward,
        b.stderr,
        rollout_parity.iter().fold(0.0f64, |m, p| m.max(*p))
    );
}

/// Flow-GRPO-Fast (`flow_grpo_fast`): a random window of 2 trained steps per rollout (here
/// within `[1, 5)` of the 6 steps), the ODE around it; the windows move, and the reward rises.
fn flow_grpo_fast_trains_on_a_random_window() {
    let dir = tempfile::tempdir().unwrap();
    let mut run: GaussianRun = start_with(
        dir.path(),
        ROLLOUTS,
        "flow_grpo_fast",
        &[
            "sampling.sde_window={ size = 2, stride = 1, shift_interval = 1, strategy = \"random\", span = [1, 5] }",
        ],
    );
    let summary = run.run(&StopFlag::new()).unwrap();
    let (a, b) = (summary.initial_eval.unwrap(), summary.final_eval.unwrap());
    assert_rose("Flow-GRPO-Fast: ", &a, &b, 0.3, 5.0);
    let mut seen: Vec<Vec<usize>> = stored_steps(dir.path());
    seen.sort();
    seen.dedup();
    assert!(
        seen.len() >= 2
            && seen
                .iter()
                .all(|s| s.len() == 2 && s[1] == s[0] + 1 && s[0] >= 1 && s[1] <= 4),
        "{seen:?}"
    );
    println!(
        "test flow_grpo_fast_trains_on_a_random_window ... ok (held-out closeness {:.3} ± {:.3} -> {:.3} ± {:.3}, windows {seen:?})",
        a.reward, a.stderr, b.reward, b.stderr
    );
}

/// `eval.guidance`: the evaluations sample under true CFG (here away from class 0), so the
/// same policy evaluates differently, while the rollouts stay unguided (the first rollout's
/// rewards are those of an unguided run).
fn guided_evaluation_samples_under_true_cfg() {
    let (a0, b0) = evaluations_beside_a_plain_run(&[
        "eval.guidance={ scale = 3.0, negative_prompt = \"class 0\" }",
    ]);
    assert!(
        (a0.reward - b0.reward).abs() > 1e-3,
        "guided {:.4} and unguided {:.4} evaluations agree",
        b0.reward,
        a0.reward
    );
    println!(
        "test guided_evaluation_samples_under_true_cfg ... ok (held-out closeness {:.3} unguided, {:.3} guided away from class 0)",
        a0.reward, b0.reward
    );
}

/// One rollout of a plain run and of one with `extra` (evaluation settings): asserts that
/// their first rollouts' rewards are equal (the setting leaves the rollouts alone) and returns
/// their first evaluations, plain first.
fn evaluations_beside_a_plain_run(extra: &[&str]) -> (EvalSummary, EvalSummary) {
    let plain_dir = tempfile::tempdir().unwrap();
    let other_dir = tempfile::tempdir().unwrap();
    let mut plain = start(plain_dir.path(), 1, &[]);
    let mut other = start(other_dir.path(), 1, extra);
    let a = plain.run(&StopFlag::new()).unwrap();
    let b = other.run(&StopFlag::new()).unwrap();
    let first = |dir: &Path| logged(dir, "reward/closeness_mean")[0];
    assert_eq!(first(plain_dir.path()), first(other_dir.path()));
    (a.initial_eval.unwrap(), b.initial_eval.unwrap())
}

/// `eval.num_inference_steps` (Flow-GRPO's denoising reduction): the evaluations sample the
/// schedule at their own step count, so the same policy evaluates differently, while the
/// rollouts keep the sampling steps (the first rollout's rewards are those of a plain run).
fn evaluations_sample_at_their_own_steps() {
    let (plain_dir, fine_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (plain, fine) = (
        start(plain_dir.path(), 1, &[]),
        start(fine_dir.path(), 1, &["eval.num_inference_steps=24"]),
    );
    assert_eq!(plain.eval_sampler().sigmas, plain.sampler().sigmas);
    assert_eq!(fine.sampler().sigmas, plain.sampler().sigmas);
    assert_eq!(fine.eval_sampler().sigmas.len(), 25);
    drop((plain, fine));
    let (a0, b0) = evaluations_beside_a_plain_run(&["eval.num_inference_steps=24"]);
    assert!(
        (a0.reward - b0.reward).abs() > 1e-4,
        "evaluations at 6 ({:.5}) and 24 ({:.5}) steps agree",
        a0.reward,
        b0.reward
    );
    println!(
        "test evaluations_sample_at_their_own_steps ... ok (held-out closeness {:.4} at 6 steps, {:.4} at 24)",
        a0.reward, b0.reward
    );
}

/// Paired finite differences: pairs from one `x_T` with churn noise, SPO on the stored
/// velocities bent toward the better endpoint; the reward rises, the SPO ratio is logged, and
/// preflight refuses pairs without churn or groups that are not pairs.
fn fdfo_trains_on_paired_differences() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = start_fdfo(dir.path(), ROLLOUTS, &[]);
    let summary = run.run(&StopFlag::new()).unwrap();
    let (a, b) = (summary.initial_eval.unwrap(), summary.final_eval.unwrap());
    assert_rose("FDFO: ", &a, &b, 0.1, 3.0);
    let ratios = logged(dir.path(), names::TRAIN_SPO_RATIO_MEAN);
    assert_eq!(ratios.len() as u64, ROLLOUTS);
    assert!(
        ratios.iter().all(|r| r.is_finite() && *r > 0.0),
        "{ratios:?}"
    );
    let none = tempfile::tempdir().unwrap();
    for (extra, key) in [
        ("sampling.sde_type=\"sde\"", "sampling.sde_type"),
        (
            "rollout.shared_initial_noise=false",
            "rollout.shared_initial_noise",
        ),
        ("rollout.group_size=4", "rollout.group_size"),
    ] {
        let mut o = trainer_fsdp::config::algorithm_overrides("fdfo").unwrap();
        o.push(trainer_fsdp::Override::parse(extra).unwrap());
        let err = config(none.path(), 1, &[])
            .with_overrides(&o)
            .and_then(|c| c.preflight())
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{extra}: {err}");
    }
    println!(
        "test fdfo_trains_on_paired_differences ... ok (held-out closeness {:.3} ± {:.3} -> {:.3} ± {:.3}, SPO ratio {:.3} -> {:.3})",
        a.reward,
        a.stderr,
        b.reward,
        b.stderr,
        ratios[0],
        ratios[ratios.len() - 1]
    );
}

/// `rollout.shared_initial_noise`: a group's candidates leave the deterministic steps before
/// the first trained one at the same latent (one `x_T` per group) and part at the first
/// trained step (their own noise); without it they start apart. Groups differ either way.
fn shared_initial_noise_starts_each_group_from_one_latent() {
    for shared in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let key = format!("rollout.shared_initial_noise={shared}");
        let mut run = start(dir.path(), 1, &[&key]);
        run.run(&StopFlag::new()).unwrap();
        let sidecars: Vec<_> = walk(&dir.path().join("artifacts"))
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .collect();
        assert_eq!(sidecars.len(), 4, "one sidecar per prompt group");
        let mut firsts = Vec::new();
        for p in &sidecars {
            let t = trajectory::read_sidecar(p).unwrap();
            let shape = t.tracks.latents.shape().to_vec();
            let (g, steps) = (shape[0], shape[1]);
            let per: usize = shape[2..].iter().product();
            let v = t.tracks.latents.to_f32();
            let at = |c: usize, j: usize| &v[(c * steps + j) * per..(c * steps + j + 1) * per];
            for c in 1..g {
                assert_eq!(
                    at(c, 0) == at(0, 0),
                    shared,
                    "{}: candidate {c}'s first trained input against candidate 0's (shared {shared})",
                    p.display()
                );
                assert_ne!(
                    at(c, 1),
                    at(0, 1),
                    "{}: candidate {c} left the first trained step where candidate 0 did",
                    p.display()
                );
            }
            firsts.push(at(0, 0).to_vec());
        }
        for (i, a) in firsts.iter().enumerate() {
            for b in &firsts[i + 1..] {
                assert_ne!(a, b, "two groups started from one latent (shared {shared})");
            }
        }
    }
    println!("test shared_initial_noise_starts_each_group_from_one_latent ... ok");
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// Fails unless the held-out reward rose from `a` to `b` by more than `by` and by more than
/// `k` standard errors of the noisier evaluation; `what` prefixes the message.
fn assert_rose(what: &str, a: &EvalSummary, b: &EvalSummary, by: f64, k: f64) {
    assert!(
        b.reward > a.reward + by && b.reward - a.reward > k * b.stderr.max(a.stderr),
        "{what}held-out closeness {:.3} ± {:.3} -> {:.3} ± {:.3} did not rise",
        a.reward,
        a.stderr,
        b.reward,
        b.stderr
    );
}

/// Every value of metric `name` the run under `dir` logged, in order.
fn logged(dir: &Path, name: &str) -> Vec<f64> {
    read_jsonl(&dir.join("run").join("metrics.jsonl"))
        .unwrap()
        .iter()
        .filter_map(|r| r.metrics.get(name).copied().flatten())
        .collect()
}

/// The trained steps of every trajectory sidecar kept under `dir/artifacts`.
fn stored_steps(dir: &Path) -> Vec<Vec<usize>> {
    walk(&dir.join("artifacts"))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .map(|p| trajectory::read_sidecar(&p).unwrap().common.sde_indices)
        .collect()
}

fn sigkill_and_resume() {
    let start = Instant::now();
    let root = tempfile::tempdir().unwrap();
    let reference = root.path().join("reference");
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
    let slow = 20u64;
    type Trial = Box<dyn Fn(&Path) + Send + Sync>;
    let mut trials: Vec<(String, Trial)> = Vec::new();
    for (it, phase) in [
        (0, WritePhase::Weights),
        (2, WritePhase::Optimizer),
        (3, WritePhase::Committed),
        (5, WritePhase::TrainerState),
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
    let mut rng = TrainerRng::seeded(11);
    let window = full.as_millis() as u64 + ROLLOUTS * 7 * slow;
    for _ in 0..2 {
        let ms = 50 + rng.below(window);
        trials.push((
            format!("SIGKILL after {ms} ms"),
            Box::new(move |dir: &Path| HARNESS.kill_after(dir, slow, Duration::from_millis(ms))),
        ));
    }
    let n = trials.len();
    for (i, (name, kill)) in trials.iter().enumerate() {
        let dir = root.path().join(format!("trial{i}"));
        kill(&dir);
        HARNESS.resume_and_check(&dir, &reference, name, FINAL);
        println!("test gaussian_loop trial {i} ({name}) ... ok");
    }
    println!(
        "({n} SIGKILL trials of the Gaussian world, reference run {:.2}s, total {:.1}s)",
        full.as_secs_f64(),
        start.elapsed().as_secs_f64()
    );
}

/// SIGKILL before every durable step of the run (each create, write, fsync, rename,
/// directory fsync and removal of its checkpoints, sidecars, markers, metric appends and
/// config, numbered by `durable`'s crash points), each followed by a resume that must end
/// exactly where the uninterrupted run ended.
fn kill_before_every_durable_step() {
    let start = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("durable");
    let reference = root.join("reference");
    let lines = HARNESS.run_to_end(&reference);
    let steps: u64 = lines
        .iter()
        .find_map(|l| l.strip_prefix("STEPS "))
        .expect("the child counts its durable steps")
        .parse()
        .unwrap();
    assert!(steps >= 100, "only {steps} durable steps");
    for step in 1..=steps {
        let dir = root.join(format!("step{step}"));
        assert!(
            HARNESS.kill_before_step(&dir, step),
            "the run ended before durable step {step} of {steps}"
        );
        HARNESS.resume_and_check(
            &dir,
            &reference,
            &format!("SIGKILL before durable step {step}"),
            FINAL,
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
    println!(
        "test gaussian_loop SIGKILL before each of {steps} durable steps ... ok ({steps} kill \
         points, 0 failures, {:.1}s)",
        start.elapsed().as_secs_f64()
    );
}

/// A second process on a run directory that a live run holds is refused, naming it.
fn a_second_process_on_a_locked_directory_is_refused() {
    use std::io::{BufRead, BufReader};
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("locked");
    // slow checkpoint writes keep the child's run alive while the parent tries
    let mut child = HARNESS.spawn(&dir, 300, std::process::Stdio::piped());
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(
        lines.any(|l| l.unwrap().starts_with("START")),
        "the child never started"
    );
    let result = try_start(&dir, ROLLOUTS, &["checkpoint.resume=true"]);
    child.kill().unwrap();
    child.wait().unwrap();
    let Err(err) = result else {
        panic!("a second process started on a locked run directory");
    };
    assert!(
        matches!(err, TrainerError::RunDirLocked { .. })
            && err.to_string().contains(&format!("pid {}", child.id())),
        "unexpected error: {err}"
    );
    println!("test gaussian_loop a second process on a locked run directory ... ok ({err})");
}

/// The largest absolute difference of two offsets (NaN fails).
fn offset_diff(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0.0, |acc: f64, (x, y)| {
        let d = (f64::from(*x) - f64::from(*y)).abs();
        assert!(!d.is_nan(), "a NaN offset");
        acc.max(d)
    })
}

/// Runs 4 rollouts with `extra` on one rank and on two (in fresh directories), checks that
/// the run trained and that both ranks end within 1e-5 of where the one rank does; returns
/// the two directories, the two summaries and the largest offset difference.
fn one_rank_and_two(
    extra: &[&str],
) -> (
    tempfile::TempDir,
    tempfile::TempDir,
    trainer_fsdp::RunSummary,
    trainer_fsdp::RunSummary,
    f64,
) {
    let one = tempfile::tempdir().unwrap();
    let mut run = start(one.path(), 4, extra);
    let a = run.run(&StopFlag::new()).unwrap();
    let d1 = delta(&run);
    drop(run);
    let two = tempfile::tempdir().unwrap();
    let (b, d2) = run_ranks(two.path(), 4, extra, 2, None).unwrap();
    let worst = d2.iter().map(|d| offset_diff(d, &d1)).fold(0.0, f64::max);
    assert!(
        worst <= 1e-5,
        "two ranks ended at {d2:?}, one rank at {d1:?}"
    );
    assert!(
        offset_diff(&d1, &[0.0; 8]) > 0.05,
        "the run trained: {d1:?}"
    );
    (one, two, a, b, worst)
}

/// Two ranks (CPU peers on burn's collective runtime) sharing each rollout train as one rank
/// does: the same samples (global sample ids), the same advantages (gathered), the same
/// updates (each rank an equal share of each, the gradients all-reduced): per-rollout rewards
/// equal, losses and the final offset equal to float rounding, and the IO rank alone writes
/// the run's files.
fn two_ranks_train_as_one() {
    let (one, two, a, b, worst) = one_rank_and_two(&[]);
    let (ea, eb) = (a.final_eval.unwrap(), b.final_eval.unwrap());
    assert!(
        (ea.reward - eb.reward).abs() <= 1e-4,
        "held-out {} vs {}",
        ea.reward,
        eb.reward
    );
    let la = read_jsonl(&one.path().join("run").join("metrics.jsonl")).unwrap();
    let lb = read_jsonl(&two.path().join("run").join("metrics.jsonl")).unwrap();
    let train = |l: &[trainer_fsdp::MetricsRecord]| -> Vec<(f64, f64)> {
        l.iter()
            .filter_map(|r| {
                let get = |k: &str| r.metrics.get(k).copied().flatten();
                Some((get("reward/closeness_mean")?, get(names::TRAIN_LOSS)?))
            })
            .collect()
    };
    let (ta, tb) = (train(&la), train(&lb));
    assert_eq!(ta.len(), 4);
    assert_eq!(tb.len(), 4, "the IO rank logged each rollout once");
    for (i, ((ra, la), (rb, lb))) in ta.iter().zip(&tb).enumerate() {
        assert!((ra - rb).abs() <= 1e-5, "rollout {i}: reward {ra} vs {rb}");
        assert!(
            (la - lb).abs() <= 1e-5 * la.abs().max(1e-3),
            "rollout {i}: loss {la} vs {lb}"
        );
    }
    println!(
        "test gaussian_loop two ranks train as one ... ok (offset within {worst:.1e} of one rank's; held-out {:.4} vs {:.4})",
        eb.reward, ea.reward
    );
}

/// DPOK's value baseline on two ranks: each rank gathers every rank's rows and fits the same
/// network one rank would, so the policy ends where one rank's does (to the all-reduce's
/// rounding) and the fit's losses agree rollout by rollout.
fn a_value_baseline_on_two_ranks_fits_as_one() {
    const VALUE: &str = "algorithm={ kind = \"dpok\", value_baseline = { hidden = 16, batch_size = 32, lr = 0.01 } }";
    let (one, two, _, _, worst) = one_rank_and_two(&[VALUE]);
    let (la, lb) = (
        logged(one.path(), names::TRAIN_VALUE_LOSS),
        logged(two.path(), names::TRAIN_VALUE_LOSS),
    );
    assert_eq!(la.len(), 4);
    assert_eq!(lb.len(), 4, "the IO rank logged each rollout once");
    for (i, (a, b)) in la.iter().zip(&lb).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * a.abs(),
            "rollout {i}: value loss {a} vs {b}"
        );
    }
    let rows = logged(two.path(), names::TRAIN_VALUE_BUFFER_ROWS);
    assert_eq!(
        rows,
        [32.0, 64.0, 96.0, 128.0],
        "every rank's rows are pushed"
    );
    println!(
        "test gaussian_loop a value baseline on two ranks fits as one ... ok (offset within {worst:.1e} of one rank's; value losses {la:.4?} vs {lb:.4?})"
    );
}

/// A checkpoint does not depend on the number of ranks: two ranks' checkpoint resumes on one,
/// one rank's on two, and both end where an uninterrupted one-rank run ends.
fn a_checkpoint_resumes_on_another_number_of_ranks() {
    let whole = tempfile::tempdir().unwrap();
    let mut run = start(whole.path(), 4, &[]);
    run.run(&StopFlag::new()).unwrap();
    let reference = delta(&run);
    drop(run);

    let two_then_one = tempfile::tempdir().unwrap();
    run_ranks(two_then_one.path(), 2, &[], 2, None).unwrap();
    let mut run = start(two_then_one.path(), 4, &["checkpoint.resume=true"]);
    assert_eq!(run.next_rollout(), 2);
    run.run(&StopFlag::new()).unwrap();
    let a = offset_diff(&delta(&run), &reference);
    drop(run);

    let one_then_two = tempfile::tempdir().unwrap();
    start(one_then_two.path(), 2, &[])
        .run(&StopFlag::new())
        .unwrap();
    let (_, d) = run_ranks(one_then_two.path(), 4, &["checkpoint.resume=true"], 2, None).unwrap();
    let b = d
        .iter()
        .map(|d| offset_diff(d, &reference))
        .fold(0.0, f64::max);
    assert!(
        a <= 1e-5 && b <= 1e-5,
        "2 -> 1 ranks: {a}, 1 -> 2 ranks: {b}"
    );
    println!(
        "test gaussian_loop a checkpoint resumes on another number of ranks ... ok (2 -> 1: {a:.1e}, 1 -> 2: {b:.1e} from the uninterrupted run)"
    );
}

/// The iteration of the last committed checkpoint of a run of `config(root, ..)`.
fn last_committed(root: &Path) -> Option<u64> {
    let cfg = config(root, 1, &[]);
    trainer_fsdp::CheckpointStore::new(
        &cfg.checkpoint.dir,
        &cfg.run.task,
        cfg.checkpoint.max_to_keep,
    )
    .unwrap()
    .latest_committed()
    .unwrap()
    .map(|c| c.iteration)
}

/// A rank that panics ends every rank: the run returns the panic, naming the rank, and the
/// rollout it was in leaves no checkpoint (the previous one is the last committed).
fn a_rank_that_panics_ends_every_rank() {
    let dir = tempfile::tempdir().unwrap();
    // rank 1 scores once per rollout (the IO rank evaluates): its 3rd scoring is rollout 2's
    let err = run_ranks(dir.path(), 4, &[], 2, Some((1, 3))).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(
            err,
            TrainerError::RankFailed {
                rank: 1,
                world_size: 2,
                ..
            }
        ) && text.contains("panicked")
            && text.contains("injected"),
        "{text}"
    );
    let last = last_committed(dir.path());
    assert_eq!(last, Some(1), "rollout 2 left no checkpoint");
    // replicas that start apart are refused before the first rollout
    let apart = tempfile::tempdir().unwrap();
    let e = run_ranks(apart.path(), 2, &[], 2, Some((1, 0)))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rank 1 starts with other trainable weights than rank 0"),
        "{e}"
    );
    // and the collective is usable again: a fresh two-rank run in this process
    let again = tempfile::tempdir().unwrap();
    run_ranks(again.path(), 1, &["eval.interval=0"], 2, None).unwrap();
    println!("test gaussian_loop a rank that panics ends every rank ... ok ({text})");
}

/// The child of [`two_machines_on_loopback_train_as_one`]: node `NODE_VAR` of two.
const NODE_VAR: &str = "GAUSSIAN_NODE";
const NODE_ROOT_VAR: &str = "GAUSSIAN_NODE_ROOT";
const NODE_ORCHESTRATOR_VAR: &str = "GAUSSIAN_NODE_ORCHESTRATOR";
const NODE_PORT_VAR: &str = "GAUSSIAN_NODE_PORT";
/// `n`: the node's world panics at its `n`-th scoring.
const NODE_PANIC_VAR: &str = "GAUSSIAN_NODE_PANIC";
/// The exit code of a node whose run failed.
const NODE_FAILED: i32 = 3;

/// One machine of a two-machine run: one rank, reaching the orchestrator and the other node
/// on 127.0.0.1; writes its final offset to `node_<i>.bin` under the shared root.
fn node_child(node_rank: usize) {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is set"));
    let root = std::path::PathBuf::from(var(NODE_ROOT_VAR));
    let port: u16 = var(NODE_PORT_VAR).parse().unwrap();
    let setup = trainer_fsdp::NodeSetup {
        nodes: 2,
        node_rank,
        orchestrator: var(NODE_ORCHESTRATOR_VAR),
        node_address: format!("ws://127.0.0.1:{port}"),
        data_port: port,
    };
    let panic = std::env::var(NODE_PANIC_VAR)
        .ok()
        .map(|n| (node_rank, n.parse().unwrap()));
    let (_, d) = match run_ranks_on(&root, 3, &[], 1, panic, Some(&setup)) {
        Ok(done) => done,
        Err(e) => {
            eprintln!("NODE {node_rank} FAILED: {e}");
            std::process::exit(NODE_FAILED);
        }
    };
    let bits: Vec<u8> = d[0]
        .iter()
        .flat_map(|v| v.to_bits().to_le_bytes())
        .collect();
    trajectory::write_atomic(&root.join(format!("node_{node_rank}.bin")), &bits).unwrap();
}

/// A free TCP port on 127.0.0.1 (the OS's choice, released for the caller to bind).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Two machines on loopback: two processes of one rank each and burn's global orchestrator
/// (on a thread of this process), all on 127.0.0.1, training `config(root, 3, ..)` in `root`
/// (the shared filesystem); with `panic = Some(n)` node 1's world panics at its `n`-th
/// scoring. Returns each node's exit code and its stderr.
fn two_machines(root: &Path, panic: Option<usize>) -> Vec<(i32, String)> {
    let orchestrator_port = free_port();
    trainer_fsdp::ranks::start_orchestrator(orchestrator_port).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<std::process::Child> = (0..2)
        .map(|node| {
            let log = std::fs::File::create(root.join(format!("node_{node}.log"))).unwrap();
            let mut cmd = std::process::Command::new(&exe);
            cmd.env(NODE_VAR, node.to_string())
                .env(NODE_ROOT_VAR, root)
                .env(
                    NODE_ORCHESTRATOR_VAR,
                    format!("ws://127.0.0.1:{orchestrator_port}"),
                )
                .env(NODE_PORT_VAR, free_port().to_string())
                .stdout(std::process::Stdio::null())
                .stderr(log);
            if let (Some(n), 1) = (panic, node) {
                cmd.env(NODE_PANIC_VAR, n.to_string());
            }
            cmd.spawn().unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut out = Vec::new();
    for (node, child) in children.iter_mut().enumerate() {
        let code = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status.code().unwrap_or(-1);
            }
            if Instant::now() > deadline {
                child.kill().ok();
                panic!("node {node} did not finish in 240 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let log = std::fs::read_to_string(root.join(format!("node_{node}.log"))).unwrap();
        out.push((code, log));
    }
    out
}

/// Two machines on loopback train as one rank does (see [`two_machines`]).
fn two_machines_on_loopback_train_as_one() {
    let one = tempfile::tempdir().unwrap();
    let mut run = start(one.path(), 3, &[]);
    run.run(&StopFlag::new()).unwrap();
    let reference = delta(&run);
    drop(run);

    let root = tempfile::tempdir().unwrap();
    for (node, (code, log)) in two_machines(root.path(), None).iter().enumerate() {
        assert_eq!(*code, 0, "node {node} failed: {log}");
    }
    let mut worst = 0.0f64;
    for node in 0..2 {
        let bytes = std::fs::read(root.path().join(format!("node_{node}.bin"))).unwrap();
        let d: Vec<f32> = bytes
            .chunks(4)
            .map(|c| f32::from_bits(u32::from_le_bytes(c.try_into().unwrap())))
            .collect();
        worst = worst.max(offset_diff(&d, &reference));
    }
    assert!(
        worst <= 1e-5,
        "two machines ended {worst} from one rank's offset"
    );
    println!(
        "test gaussian_loop two machines on loopback train as one ... ok (offset within {worst:.1e} of one rank's)"
    );
}

/// A machine whose rank panics ends the other machine's run too: its process exits, the
/// other's next collective fails on the lost peer, and the rollout they were in leaves no
/// checkpoint.
fn a_failing_machine_ends_the_other() {
    let root = tempfile::tempdir().unwrap();
    // node 1 scores once per rollout: its 2nd scoring is rollout 1's
    let out = two_machines(root.path(), Some(2));
    assert_eq!(out[1].0, NODE_FAILED, "node 1: {}", out[1].1);
    assert!(out[1].1.contains("injected"), "{}", out[1].1);
    assert_eq!(out[0].0, NODE_FAILED, "node 0 ended too: {}", out[0].1);
    let last = last_committed(root.path());
    assert_eq!(last, Some(0), "rollout 1 left no checkpoint");
    let line = |log: &str| {
        log.lines()
            .find(|l| l.starts_with("NODE"))
            .unwrap_or_default()
            .to_string()
    };
    println!(
        "test gaussian_loop a failing machine ends the other ... ok ({}; {})",
        line(&out[1].1),
        line(&out[0].1)
    );
}

/// Every test, in order; `GAUSSIAN_ONLY=<part of a name>` runs the matching ones alone.
fn parent() {
    let tests: [(&str, fn()); 30] = [
        ("the_reward_rises", the_reward_rises),
        (
            "degenerate_rollouts_replay_nothing",
            degenerate_rollouts_replay_nothing,
        ),
        ("two_ranks_train_as_one", two_ranks_train_as_one),
        (
            "a_value_baseline_on_two_ranks_fits_as_one",
            a_value_baseline_on_two_ranks_fits_as_one,
        ),
        (
            "a_checkpoint_resumes_on_another_number_of_ranks",
            a_checkpoint_resumes_on_another_number_of_ranks,
        ),
        (
            "a_rank_that_panics_ends_every_rank",
            a_rank_that_panics_ends_every_rank,
        ),
        (
            "two_machines_on_loopback_train_as_one",
            two_machines_on_loopback_train_as_one,
        ),
        (
            "a_failing_machine_ends_the_other",
            a_failing_machine_ends_the_other,
        ),
        (
            "the_rollout_anchor_trains_too",
            the_rollout_anchor_trains_too,
        ),
        (
            "awm_trains_on_clean_endpoints",
            awm_trains_on_clean_endpoints,
        ),
        (
            "kl_to_the_reference_holds_the_policy_near_the_base",
            kl_to_the_reference_holds_the_policy_near_the_base,
        ),
        (
            "the_ema_is_evaluated_checkpointed_and_resumed_exactly",
            the_ema_is_evaluated_checkpointed_and_resumed_exactly,
        ),
        (
            "dpok_fits_a_value_baseline_and_resumes_exactly",
            dpok_fits_a_value_baseline_and_resumes_exactly,
        ),
        (
            "nft_trains_on_deterministic_rollouts",
            nft_trains_on_deterministic_rollouts,
        ),
        (
            "dpok_trains_with_its_clamped_ratio",
            dpok_trains_with_its_clamped_ratio,
        ),
        (
            "grpo_guard_trains_with_its_regulated_ratio",
            grpo_guard_trains_with_its_regulated_ratio,
        ),
        (
            "dpo_trains_on_each_groups_best_and_worst",
            dpo_trains_on_each_groups_best_and_worst,
        ),
        (
            "raft_fine_tunes_on_each_groups_best",
            raft_fine_tunes_on_each_groups_best,
        ),
        (
            "fdfo_trains_on_paired_differences",
            fdfo_trains_on_paired_differences,
        ),
        (
            "mix_grpo_trains_on_its_sliding_window",
            mix_grpo_trains_on_its_sliding_window,
        ),
        (
            "dance_grpo_trains_on_per_sample_subsets",
            dance_grpo_trains_on_per_sample_subsets,
        ),
        (
            "flow_grpo_fast_trains_on_a_random_window",
            flow_grpo_fast_trains_on_a_random_window,
        ),
        (
            "guided_evaluation_samples_under_true_cfg",
            guided_evaluation_samples_under_true_cfg,
        ),
        (
            "evaluations_sample_at_their_own_steps",
            evaluations_sample_at_their_own_steps,
        ),
        (
            "the_cpu_budget_ends_the_run_with_an_evaluation",
            the_cpu_budget_ends_the_run_with_an_evaluation,
        ),
        (
            "an_unfinished_decay_is_reported",
            an_unfinished_decay_is_reported,
        ),
        (
            "shared_initial_noise_starts_each_group_from_one_latent",
            shared_initial_noise_starts_each_group_from_one_latent,
        ),
        ("sigkill_and_resume", sigkill_and_resume),
        (
            "a_second_process_on_a_locked_directory_is_refused",
            a_second_process_on_a_locked_directory_is_refused,
        ),
        (
            "kill_before_every_durable_step",
            kill_before_every_durable_step,
        ),
    ];
    let only = std::env::var("GAUSSIAN_ONLY").ok();
    for (name, test) in tests {
        if only.as_deref().is_none_or(|o| name.contains(o)) {
            test();
        }
    }
}
