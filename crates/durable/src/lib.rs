//! # durable
//!
//! Files that nothing can half-write, for every crate of the workspace that writes one
//! (trajectory sidecars, checkpoints, the resolved config, PNGs, exported weights):
//!
//! ```text
//! <dest>.tmp  ──write──> fsync ──rename over <dest>──> fsync the directory
//! ```
//!
//! A crash at any point leaves either the old `<dest>` (or none) or the complete new one, never
//! a torn file; readers never look at `.tmp` files, and the next write of the same destination
//! replaces a leftover one. One writer per destination: two processes staging the same file
//! at once would share its `.tmp`.
//!
//! * [`write_atomic`]: a byte buffer, in one call.
//! * [`AtomicFile`]: a file written as a stream (a multi-gigabyte shard), committed at the end.
//! * [`stage`] / [`Staged::commit`]: a buffer written and fsynced now, made visible later (a
//!   caller that must write several files before any becomes visible).
//! * [`sync_dir`]: the directory fsync that makes a rename or a removal durable.
//! * [`resolved`]: a path with its symlinks and `..` resolved, so that a writer can refuse to
//!   replace what it reads.
//!
//! * [`remove_file`] / [`remove_dir_all`]: removals, each a crash point like the steps above.
//!
//! Every error names the file and the operation ([`DurableError`]).
//!
//! **Crash points.** Every step above (create, write, fsync, rename, directory fsync,
//! removal) and every [`crash_point`] another crate marks is numbered in order. Built with the
//! `fault-injection` feature (crash tests only), a process whose environment sets
//! `DURABLE_KILL_AT=<n>` sends itself SIGKILL just before step `n`, so a test can stop a run at
//! every step of its protocol deterministically; `fault::steps` (with the feature) counts the
//! steps taken.
//!
//! ```
//! let dir = tempfile::tempdir().unwrap();
//! let dest = dir.path().join("sub").join("config.toml");
//! let w = durable::write_atomic(&dest, b"seed = 0\n").unwrap();
//! assert_eq!((w.bytes, std::fs::read(&dest).unwrap()), (9, b"seed = 0\n".to_vec()));
//! assert!(!durable::tmp_path(&dest).exists());
//!
//! // a stream, committed at the end; dropped uncommitted it leaves nothing behind
//! use std::io::Write;
//! let mut f = durable::AtomicFile::create(&dest).unwrap();
//! f.write_all(b"seed = 1\n").unwrap();
//! drop(f);
//! assert_eq!(std::fs::read(&dest).unwrap(), b"seed = 0\n");
//! let mut f = durable::AtomicFile::create(&dest).unwrap();
//! f.write_all(b"seed = 1\n").unwrap();
//! f.commit().unwrap();
//! assert_eq!(std::fs::read(&dest).unwrap(), b"seed = 1\n");
//! ```
#![deny(missing_docs)]

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Component, Path, PathBuf};

use thiserror::Error;

/// A filesystem operation on one file failed.
#[derive(Debug, Error)]
#[error("cannot {op} {path}")]
pub struct DurableError {
    /// The file or directory.
    pub path: PathBuf,
    /// What was being done (`create`, `write`, `fsync`, `rename into place`, ...).
    pub op: &'static str,
    /// The OS error.
    #[source]
    pub source: std::io::Error,
}

/// Marks a step of a durable protocol that is not one of this crate's own (an append to a
/// log, say): a crash point under the `fault-injection` feature, nothing otherwise.
#[inline]
pub fn crash_point(op: &'static str, path: &Path) {
    #[cfg(feature = "fault-injection")]
    fault::hit(op, path);
    #[cfg(not(feature = "fault-injection"))]
    let _ = (op, path);
}

/// Deterministic crash injection (the `fault-injection` feature; never in a release build of
/// the trainer).
#[cfg(feature = "fault-injection")]
pub mod fault {
    use std::path::Path;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// The variable naming the step before which the process kills itself.
    pub const KILL_AT_VAR: &str = "DURABLE_KILL_AT";

    static STEPS: AtomicU64 = AtomicU64::new(0);
    static KILL_AT: OnceLock<Option<u64>> = OnceLock::new();

    /// Steps taken so far by this process.
    pub fn steps() -> u64 {
        STEPS.load(Ordering::SeqCst)
    }

    pub(crate) fn hit(op: &'static str, path: &Path) {
        let n = STEPS.fetch_add(1, Ordering::SeqCst) + 1;
        let kill_at = *KILL_AT.get_or_init(|| {
            std::env::var(KILL_AT_VAR)
                .ok()
                .and_then(|v| v.trim().parse().ok())
        });
        if kill_at == Some(n) {
            eprintln!("durable: SIGKILL before step {n} ({op} {})", path.display());
            // SAFETY: getpid and kill are async-signal-safe libc calls with no memory
            // arguments; the process ends here.
            #[allow(unsafe_code)]
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            unreachable!("SIGKILL returned");
        }
    }
}

/// Removes a file (a crash point first).
///
/// # Errors
/// [`DurableError`] naming the file.
pub fn remove_file(path: &Path) -> Result<(), DurableError> {
    crash_point("remove", path);
    fs::remove_file(path).map_err(err(path, "remove"))
}

/// Removes a directory and everything in it (a crash point first).
///
/// # Errors
/// [`DurableError`] naming the directory.
pub fn remove_dir_all(path: &Path) -> Result<(), DurableError> {
    crash_point("remove directory", path);
    fs::remove_dir_all(path).map_err(err(path, "remove"))
}

fn err(path: &Path, op: &'static str) -> impl FnOnce(std::io::Error) -> DurableError {
    let path = path.to_path_buf();
    move |source| DurableError { path, op, source }
}

/// A file that was committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenFile {
    /// Where it lives.
    pub path: PathBuf,
    /// Its length in bytes.
    pub bytes: u64,
}

/// `<dest>.tmp`.
pub fn tmp_path(dest: &Path) -> PathBuf {
    let mut name = dest
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".tmp");
    dest.with_file_name(name)
}

fn parent_of(dest: &Path) -> &Path {
    dest.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// `path` absolute, with every symlink of its existing part resolved and `.` and `..` folded,
/// so that two spellings of one file or directory compare equal whether or not it exists yet
/// (a writer refusing to replace what it reads): each component is resolved through the file
/// system while it exists and appended as it is once it does not (a `..` then takes back the
/// last one, as the file system will).
///
/// # Errors
/// The current directory cannot be read (a relative `path`).
pub fn resolved(path: &Path) -> std::io::Result<PathBuf> {
    let absolute = std::path::absolute(path)?;
    let mut out = PathBuf::new();
    for c in absolute.components() {
        match c {
            Component::Prefix(_) | Component::RootDir => out.push(c),
            Component::CurDir => {}
            Component::ParentDir => {
                // `out` holds no symlink (each existing step was canonicalized), so its
                // parent is the directory's real parent
                out.pop();
            }
            Component::Normal(name) => {
                out.push(name);
                if let Ok(real) = out.canonicalize() {
                    out = real;
                }
            }
        }
    }
    Ok(out)
}

/// fsyncs a directory so that a rename or removal inside it is durable (a no-op where
/// directories cannot be opened, i.e. outside Unix).
///
/// # Errors
/// [`DurableError`] naming the directory.
pub fn sync_dir(dir: &Path) -> Result<(), DurableError> {
    crash_point("fsync directory", dir);
    #[cfg(unix)]
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(err(dir, "fsync directory"))?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// Renames `tmp` over `dest` and fsyncs `dest`'s directory.
fn rename_into_place(tmp: &Path, dest: &Path) -> Result<(), DurableError> {
    crash_point("rename into place", dest);
    fs::rename(tmp, dest).map_err(err(dest, "rename into place"))?;
    sync_dir(parent_of(dest))
}

/// A file written to `<dest>.tmp` and fsynced, not yet renamed into place.
///
/// [`Staged::commit`] renames it over the destination and fsyncs the directory. Dropping it
/// uncommitted removes the temporary file.
#[derive(Debug)]
#[must_use = "a staged file is not visible until committed"]
pub struct Staged {
    tmp: PathBuf,
    dest: PathBuf,
    len: u64,
    committed: bool,
}

/// Writes `bytes` to `<dest>.tmp` and fsyncs it (creating the parent directory if needed).
///
/// # Errors
/// [`DurableError`] naming the file and the operation.
pub fn stage(dest: &Path, bytes: &[u8]) -> Result<Staged, DurableError> {
    let mut f = AtomicFile::create(dest)?;
    f.write_all(bytes).map_err(err(&f.tmp, "write"))?;
    f.finish_staged()
}

impl Staged {
    /// The temporary file.
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    /// The destination.
    pub fn destination(&self) -> &Path {
        &self.dest
    }

    /// Renames the temporary file over the destination (atomic on POSIX filesystems) and
    /// fsyncs the directory.
    ///
    /// # Errors
    /// [`DurableError`]; the temporary file is removed when the rename fails.
    pub fn commit(mut self) -> Result<WrittenFile, DurableError> {
        rename_into_place(&self.tmp, &self.dest)?;
        self.committed = true;
        Ok(WrittenFile {
            path: self.dest.clone(),
            bytes: self.len,
        })
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// Writes `bytes` to `dest` atomically: `.tmp`, fsync, rename, directory fsync.
///
/// # Errors
/// [`DurableError`] naming the file and the operation.
pub fn write_atomic(dest: &Path, bytes: &[u8]) -> Result<WrittenFile, DurableError> {
    stage(dest, bytes)?.commit()
}

/// A file written as a stream to `<dest>.tmp` ([`Write`], buffered) and made visible by
/// [`AtomicFile::commit`]: flush, fsync, rename, directory fsync. Dropped uncommitted, it
/// removes the temporary file and leaves `dest` as it was.
#[derive(Debug)]
#[must_use = "the file is not visible until committed"]
pub struct AtomicFile {
    tmp: PathBuf,
    dest: PathBuf,
    out: Option<BufWriter<File>>,
    len: u64,
}

impl AtomicFile {
    /// Creates `<dest>.tmp` (and `dest`'s directory if needed).
    ///
    /// # Errors
    /// [`DurableError`] naming the directory or the file.
    pub fn create(dest: &Path) -> Result<Self, DurableError> {
        let parent = parent_of(dest);
        fs::create_dir_all(parent).map_err(err(parent, "create directory"))?;
        let tmp = tmp_path(dest);
        crash_point("create", &tmp);
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(err(&tmp, "create"))?;
        Ok(Self {
            tmp,
            dest: dest.to_path_buf(),
            out: Some(BufWriter::with_capacity(1 << 20, f)),
            len: 0,
        })
    }

    /// The destination.
    pub fn destination(&self) -> &Path {
        &self.dest
    }

    /// Bytes written so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing was written yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Flushes and fsyncs the temporary file, keeping it staged.
    fn finish_staged(mut self) -> Result<Staged, DurableError> {
        let out = self.out.take().expect("an open file");
        // from here the `Staged` owns the temporary file: on a failed flush or fsync it is
        // dropped (after the file is closed) and removes it
        let staged = Staged {
            tmp: std::mem::take(&mut self.tmp),
            dest: std::mem::take(&mut self.dest),
            len: self.len,
            committed: false,
        };
        crash_point("write", &staged.tmp);
        let f = out.into_inner().map_err(|e| DurableError {
            path: staged.tmp.clone(),
            op: "write",
            source: e.into_error(),
        })?;
        crash_point("fsync", &staged.tmp);
        f.sync_all().map_err(err(&staged.tmp, "fsync"))?;
        drop(f);
        Ok(staged)
    }

    /// Flushes, fsyncs and renames the file into place, then fsyncs the directory.
    ///
    /// # Errors
    /// [`DurableError`] naming the file and the operation; the temporary file is removed.
    pub fn commit(self) -> Result<WrittenFile, DurableError> {
        self.finish_staged()?.commit()
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.as_mut().expect("an open file").write(buf)?;
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.as_mut().expect("an open file").flush()
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.out.take().is_some() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_staged_file_is_invisible_until_committed_and_gone_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("a.bin");
        std::fs::write(&dest, b"old").unwrap();
        let s = stage(&dest, b"new").unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"old");
        assert!(s.tmp_path().exists());
        let tmp = s.tmp_path().to_path_buf();
        drop(s);
        assert!(!tmp.exists());
        assert_eq!(std::fs::read(&dest).unwrap(), b"old");
        let w = stage(&dest, b"newer").unwrap().commit().unwrap();
        assert_eq!(w.bytes, 5);
        assert_eq!(std::fs::read(&dest).unwrap(), b"newer");
    }

    #[test]
    fn errors_name_the_file_and_the_operation() {
        let dir = tempfile::tempdir().unwrap();
        // a directory where the file's parent should be
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, b"x").unwrap();
        let e = write_atomic(&blocker.join("child.txt"), b"y").unwrap_err();
        assert_eq!(e.op, "create directory");
        assert_eq!(e.path, blocker);
        assert!(e.to_string().contains("file"), "{e}");
        // renaming over a directory fails, and the temporary file goes away
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join("inner"), b"z").unwrap();
        let e = write_atomic(&sub, b"w").unwrap_err();
        assert_eq!(e.op, "rename into place");
        assert!(!tmp_path(&sub).exists());
    }

    #[test]
    fn a_stream_counts_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("s.bin");
        let mut f = AtomicFile::create(&dest).unwrap();
        assert!(f.is_empty());
        for _ in 0..1000 {
            f.write_all(&[7u8; 1000]).unwrap();
        }
        assert_eq!(f.len(), 1_000_000);
        assert!(!dest.exists());
        let w = f.commit().unwrap();
        assert_eq!(w.bytes, 1_000_000);
        assert_eq!(std::fs::metadata(&dest).unwrap().len(), 1_000_000);
    }
}
