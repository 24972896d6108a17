//! The process's CPU time: what the algorithm comparison charges each method, whatever the
//! number of threads it keeps busy.

/// User plus system CPU seconds this process has used so far (all its threads), from
/// `getrusage(RUSAGE_SELF)`; NaN where the platform has no such call.
///
/// ```
/// let a = trainer_fsdp::monitor::process_cpu_seconds();
/// let mut x = 0u64;
/// for i in 0..5_000_000u64 {
///     x = x.wrapping_mul(31).wrapping_add(i);
/// }
/// std::hint::black_box(x);
/// let b = trainer_fsdp::monitor::process_cpu_seconds();
/// assert!(b >= a && a >= 0.0);
/// ```
#[cfg(unix)]
pub fn process_cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `getrusage` writes a `rusage` into the pointer it is given, which points to a
    // zeroed value of that type owned by this frame; it returns 0 on success.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return f64::NAN;
    }
    // SAFETY: initialised by the successful call above (and zeroed before it).
    let usage = unsafe { usage.assume_init() };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// User plus system CPU seconds this process has used so far; NaN on this platform.
#[cfg(not(unix))]
pub fn process_cpu_seconds() -> f64 {
    f64::NAN
}
