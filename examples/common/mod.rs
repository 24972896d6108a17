//! What the examples that train share: mimalloc kept from handing freed pages back to the OS,
//! and the machine's description for their tables.

/// Keeps the memory mimalloc frees committed, unless `MIMALLOC_PURGE_DELAY` says otherwise.
///
/// By default mimalloc hands freed pages back to the OS after 10 ms; a training step frees
/// and re-allocates its autodiff graph's tensors every few milliseconds, so the kernel zeroed
/// the same pages over and over (a quarter of the CPU backend's training phase on the shapes
/// world). The process then keeps its peak memory until it exits.
pub fn keep_freed_pages() {
    // `mi_option_purge_delay` in mimalloc.h; options keep their numbers across versions
    // (retired ones stay as `deprecated_` placeholders).
    const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets a process-wide integer option; called first thing in `main`, before
        // any other thread exists (the call is not thread safe).
        #[allow(unsafe_code)]
        unsafe {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1);
        }
    }
}

/// The CPU model and core count, for the tables the examples write.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    format!("{cpu}, {cores} cores available, {}", std::env::consts::ARCH)
}
