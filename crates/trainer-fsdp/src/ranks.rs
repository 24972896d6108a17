//! Several ranks in this process, one thread and one device each, on burn's collective
//! runtime: [`launch_ranks`] registers them, runs each rank's work, and turns one rank's
//! failure into the end of all of them.
//!
//! Why the launcher, and not each rank, handles failure: burn's collectives have no timeout, so
//! a rank that returns early (an error, a panic) leaves the others waiting for it forever in
//! their next collective. The launcher catches the failure on the failing rank's thread,
//! records it as the run's cause, and resets the collective
//! ([`CollectiveWorkers::abort`]), which releases every waiting peer with an error; the run
//! then ends with [`TrainerError::RankFailed`] naming the first rank that failed. Ranks
//! register before anything that can fail (a registration waits for every peer, and a reset
//! does not release it).

use std::path::Path;
use std::sync::Mutex;

use burn::tensor::backend::{AutodiffBackend, Backend};

use crate::algorithm::Algorithm;
use crate::config::{Preflight, TrainConfig};
use crate::run::Run;
use crate::world::World;

use crate::error::TrainerError;
use crate::run::error_chain;
use crate::workers::{CollectiveWorkers, NodeSetup, Workers};

/// Where the run starts, agreed by every rank: the IO rank passes `Some(its start)` (the
/// iteration of the committed checkpoint its [`crate::Run::new`] resumed from, `None` from
/// scratch), the others `None`; every rank returns the IO rank's start (the other ranks then
/// [`crate::Run::follow`] it). A collective, so it works across machines too.
///
/// # Errors
/// A failed collective.
pub fn agree_start<K: Workers>(
    workers: &K,
    io_start: Option<Option<u64>>,
) -> Result<Option<u64>, TrainerError> {
    let mine = match io_start {
        Some(Some(iteration)) => [1.0, iteration as f64],
        _ => [0.0, 0.0],
    };
    let all = workers.all_gather(&mine)?;
    Ok((all[0][0] != 0.0).then_some(all[0][1] as u64))
}

/// Runs `work(workers)` on one rank per device of `devices` (a thread each, `host_threads`
/// host threads each), registered with burn's collective runtime on the plain backend `B`
/// (the inner backend of the training one), and returns this machine's ranks' results in
/// order. On one machine (`node` `None`) rank `r` runs on `devices[r]`; on several, this
/// machine's ranks are `node_rank * devices.len() ..` and every machine launches as many. See
/// the module docs for failures.
///
/// # Errors
/// [`TrainerError::RankFailed`] naming the first rank that failed (an error or a panic),
/// with its message; registration errors.
pub fn launch_ranks<B, T, F>(
    devices: &[B::Device],
    host_threads: usize,
    node: Option<&NodeSetup>,
    work: F,
) -> Result<Vec<T>, TrainerError>
where
    B: Backend,
    T: Send,
    F: Fn(&CollectiveWorkers) -> Result<T, TrainerError> + Sync,
{
    let n = devices.len();
    let world_size = n * node.map_or(1, |s| s.nodes);
    let first_failure: Mutex<Option<(usize, String)>> = Mutex::new(None);
    let results: Vec<Option<T>> = std::thread::scope(|s| {
        let handles: Vec<_> = devices
            .iter()
            .enumerate()
            .map(|(local, device)| {
                let (first_failure, work) = (&first_failure, &work);
                let rank = node.map_or(0, |s| s.node_rank) * n + local;
                s.spawn(move || {
                    let body = || -> Result<T, TrainerError> {
                        let workers = CollectiveWorkers::register::<B>(
                            local,
                            n,
                            device.clone(),
                            host_threads,
                            node,
                        )?;
                        let out = work(&workers)?;
                        workers.finish()?;
                        Ok(out)
                    };
                    let result = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body))
                    {
                        Ok(r) => r,
                        Err(panic) => Err(TrainerError::RankFailed {
                            rank,
                            world_size,
                            message: format!("panicked: {}", panic_message(panic.as_ref())),
                        }),
                    };
                    match result {
                        Ok(out) => Some(out),
                        Err(e) => {
                            let mut first = first_failure.lock().unwrap_or_else(|p| p.into_inner());
                            if first.is_none() {
                                let message = match &e {
                                    TrainerError::RankFailed { message, .. } => message.clone(),
                                    other => error_chain(other),
                                };
                                *first = Some((rank, message));
                            }
                            drop(first);
                            // release this machine's ranks waiting in a collective
                            burn_collective::reset_collective::<B>();
                            None
                        }
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().ok().flatten())
            .collect()
    });
    if let Some((rank, message)) = first_failure
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
    {
        return Err(TrainerError::RankFailed {
            rank,
            world_size,
            message,
        });
    }
    results
        .into_iter()
        .enumerate()
        .map(|(local, r)| {
            r.ok_or_else(|| TrainerError::RankFailed {
                rank: node.map_or(0, |s| s.node_rank) * n + local,
                world_size,
                message: "its thread ended without a result".into(),
            })
        })
        .collect()
}

/// A panic's message.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// Starts burn's global orchestrator, which the machines of a multi-machine run reach
/// ([`NodeSetup::orchestrator`]), listening on `port` on every interface, on a thread of its
/// own; it serves until the process ends.
///
/// # Errors
/// [`TrainerError::Collective`] when its runtime cannot start.
pub fn start_orchestrator(port: u16) -> Result<std::thread::JoinHandle<()>, TrainerError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| TrainerError::Collective {
            rank: 0,
            world_size: 0,
            operation: "start the orchestrator".into(),
            cause: e.to_string(),
        })?;
    Ok(std::thread::spawn(move || {
        runtime.block_on(burn_collective::start_global_orchestrator(port));
    }))
}

/// This rank's run: the IO rank prepares the run directory ([`Run::new`]) and tells the
/// others where it starts ([`agree_start`]); the others start there ([`Run::follow`]). The
/// ranks of one process build their runs [`one_at_a_time`].
///
/// # Errors
/// As [`Run::new`] and [`Run::follow`]; failed collectives.
#[allow(clippy::too_many_arguments)]
pub fn start_rank<B, W, A, K>(
    cfg: TrainConfig,
    pre: Preflight,
    run_dir: &Path,
    device: B::Device,
    world: W,
    algorithm: A,
    workers: K,
) -> Result<Run<B, W, A, K>, TrainerError>
where
    B: AutodiffBackend,
    W: World<B>,
    A: Algorithm<B, W>,
    K: Workers,
{
    if workers.is_io_rank() {
        let run = one_at_a_time(|| Run::new(cfg, pre, run_dir, device, world, algorithm, workers))?;
        agree_start(run.workers(), Some(run.resumed_from().map(|c| c.iteration)))?;
        Ok(run)
    } else {
        let start = agree_start(&workers, None)?;
        one_at_a_time(|| Run::follow(cfg, pre, run_dir, device, world, algorithm, workers, start))
    }
}

/// Runs `f` while no other rank of this process runs a `one_at_a_time` closure: building a
/// rank's run may draw from the backend's random stream, which the ranks of one process share
/// (a world's modules initialised before their weights are loaded; a policy of the user's own
/// whose adapter draws there), so two ranks building at once could interleave their draws.
/// The transformer policy's fresh adapter is keyed and does not depend on it.
pub fn one_at_a_time<T>(f: impl FnOnce() -> T) -> T {
    static BUILDING: Mutex<()> = Mutex::new(());
    let _guard = BUILDING.lock().unwrap_or_else(|p| p.into_inner());
    f()
}
