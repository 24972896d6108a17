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

use std::sync::{Condvar, Mutex};

use burn::tensor::backend::Backend;

use crate::checkpoint::CommittedCheckpoint;
use crate::error::TrainerError;
use crate::workers::CollectiveWorkers;

/// Where the IO rank started (the committed checkpoint its [`crate::Run::new`] resumed from,
/// or none), handed to the other ranks, which start from the same place
/// ([`crate::Run::follow`]).
#[derive(Debug, Default)]
pub struct StartRelay {
    state: Mutex<Option<Result<Option<CommittedCheckpoint>, ()>>>,
    ready: Condvar,
}

impl StartRelay {
    /// The IO rank's start, for the others.
    pub fn publish(&self, start: Option<CommittedCheckpoint>) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.is_none() {
            *s = Some(Ok(start));
        }
        self.ready.notify_all();
    }

    /// The IO rank failed before it could publish: the waiting ranks stop waiting.
    pub fn fail(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.is_none() {
            *s = Some(Err(()));
        }
        self.ready.notify_all();
    }

    /// Waits for the IO rank's start.
    ///
    /// # Errors
    /// [`TrainerError::RankFailed`] (rank 0) when the launch failed before it published.
    pub fn wait(&self, world_size: usize) -> Result<Option<CommittedCheckpoint>, TrainerError> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while s.is_none() {
            s = self.ready.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        match s.as_ref().expect("set") {
            Ok(start) => Ok(start.clone()),
            Err(()) => Err(TrainerError::RankFailed {
                rank: 0,
                world_size,
                message: "the launch ended before the IO rank started the run".into(),
            }),
        }
    }
}

/// Runs `work(workers, relay)` on one rank per device of `devices` (rank `r` on
/// `devices[r]`, a thread each, `host_threads` host threads each), registered with burn's
/// collective runtime on the plain backend `B` (the inner backend of the training one), and
/// returns the ranks' results in rank order. See the module docs for failures.
///
/// # Errors
/// [`TrainerError::RankFailed`] naming the first rank that failed (an error or a panic),
/// with its message; registration errors.
pub fn launch_ranks<B, T, F>(
    devices: &[B::Device],
    host_threads: usize,
    work: F,
) -> Result<Vec<T>, TrainerError>
where
    B: Backend,
    T: Send,
    F: Fn(&CollectiveWorkers, &StartRelay) -> Result<T, TrainerError> + Sync,
{
    let n = devices.len();
    let relay = StartRelay::default();
    let first_failure: Mutex<Option<(usize, String)>> = Mutex::new(None);
    let results: Vec<Option<T>> = std::thread::scope(|s| {
        let handles: Vec<_> = devices
            .iter()
            .enumerate()
            .map(|(rank, device)| {
                let (relay, first_failure, work) = (&relay, &first_failure, &work);
                s.spawn(move || {
                    let body = || -> Result<T, TrainerError> {
                        let workers = CollectiveWorkers::register::<B>(
                            rank,
                            n,
                            device.clone(),
                            host_threads,
                            None,
                        )?;
                        let out = work(&workers, relay)?;
                        workers.finish()?;
                        Ok(out)
                    };
                    let result = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body))
                    {
                        Ok(r) => r,
                        Err(panic) => Err(TrainerError::RankFailed {
                            rank,
                            world_size: n,
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
                            // release the ranks waiting in a collective or for the start
                            burn_collective::reset_collective::<B>();
                            relay.fail();
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
            world_size: n,
            message,
        });
    }
    results
        .into_iter()
        .enumerate()
        .map(|(rank, r)| {
            r.ok_or_else(|| TrainerError::RankFailed {
                rank,
                world_size: n,
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

/// An error and its sources on one line (`a: b: c`).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}
