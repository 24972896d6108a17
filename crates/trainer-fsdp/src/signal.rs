//! Ctrl-C (SIGINT) and SIGTERM as a request to stop: the handler only sets a flag; the loop
//! checks it between phases, writes a committed checkpoint and returns. A second signal while
//! the flag is already set exits at once with status 130 (the shell's code for SIGINT), for a
//! user who does not want to wait for the checkpoint.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use signal_hook::consts::{SIGINT, SIGTERM};

use crate::error::TrainerError;

/// The exit status of a second Ctrl-C.
pub const SECOND_SIGNAL_EXIT: i32 = 130;

/// A stop request, set by a signal handler or by hand.
///
/// ```
/// use trainer_fsdp::StopFlag;
/// let stop = StopFlag::new();
/// assert!(!stop.is_set());
/// let from_elsewhere = stop.clone();
/// from_elsewhere.request();
/// assert!(stop.is_set());
/// ```
#[derive(Debug, Clone, Default)]
pub struct StopFlag {
    flag: Arc<AtomicBool>,
}

impl StopFlag {
    /// A flag no signal sets (tests, embedding).
    pub fn new() -> Self {
        Self::default()
    }

    /// A flag that SIGINT and SIGTERM set. Installing twice in one process registers the
    /// handlers twice (both flags are set); install once, at the start of a run.
    ///
    /// # Errors
    /// [`TrainerError::Signal`] when a handler cannot be registered.
    pub fn install() -> Result<Self, TrainerError> {
        let stop = Self::new();
        for (sig, name) in [(SIGINT, "SIGINT"), (SIGTERM, "SIGTERM")] {
            let err = |source| TrainerError::Signal {
                signal: name,
                source,
            };
            // order matters: the shutdown check runs first, so only a second signal exits
            signal_hook::flag::register_conditional_shutdown(
                sig,
                SECOND_SIGNAL_EXIT,
                Arc::clone(&stop.flag),
            )
            .map_err(err)?;
            signal_hook::flag::register(sig, Arc::clone(&stop.flag)).map_err(err)?;
        }
        Ok(stop)
    }

    /// Whether a stop was requested.
    pub fn is_set(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Requests a stop.
    pub fn request(&self) {
        self.flag.store(true, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigint_sets_the_flag_without_killing_the_process() {
        let stop = StopFlag::install().unwrap();
        assert!(!stop.is_set());
        signal_hook::low_level::raise(SIGINT).unwrap();
        // the handler runs synchronously in the raising thread
        assert!(stop.is_set());
        // still alive: the default action (terminate) was replaced
    }
}
