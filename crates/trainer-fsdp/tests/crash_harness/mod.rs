//! The process harness of the SIGKILL tests. Each such test binary is also its own child: an
//! environment variable naming a working directory makes it the child, and a second one says
//! how long the child sleeps after each durable step of a checkpoint write, so that a kill can
//! land inside the write window. The child reports its progress one line at a time on stdout.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use trainer_fsdp::{CheckpointStore, names, read_jsonl};

/// One metrics record: its step and its non-timing values.
pub type Record = (u64, Vec<(String, Option<f64>)>);

/// The deterministic part of a run directory's metrics log (timings dropped).
pub fn metrics(run_dir: &Path) -> Vec<Record> {
    read_jsonl(&run_dir.join("metrics.jsonl"))
        .unwrap()
        .into_iter()
        .map(|r| {
            (
                r.step,
                r.metrics
                    .into_iter()
                    .filter(|(k, _)| !names::is_timing(k))
                    .collect(),
            )
        })
        .collect()
}

/// Prints one progress line and flushes it, so the parent reads it before the child goes on.
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

/// How one test binary runs itself as a child.
pub struct Harness {
    /// The variable holding the child's working directory; set, the binary is the child.
    pub dir_var: &'static str,
    /// The variable holding the child's sleep after each durable step, in milliseconds.
    pub slow_var: &'static str,
    /// More variables for a child working in a directory.
    pub extra_env: fn(&Path) -> Vec<(&'static str, &'static str)>,
    /// Whether the child's stderr shows (else it is discarded).
    pub show_stderr: bool,
}

impl Harness {
    /// The child's working directory, when this process is the child.
    pub fn child_dir(&self) -> Option<std::path::PathBuf> {
        std::env::var_os(self.dir_var).map(Into::into)
    }

    /// The child's sleep after each durable step (0 when unset).
    pub fn slow(&self) -> Duration {
        let ms = std::env::var(self.slow_var)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        Duration::from_millis(ms)
    }

    /// Starts a child working in `dir`.
    pub fn spawn(&self, dir: &Path, slow_ms: u64, stdout: Stdio) -> Child {
        self.spawn_with(dir, slow_ms, stdout, &[])
    }

    /// Starts a child working in `dir` with more environment variables.
    pub fn spawn_with(
        &self,
        dir: &Path,
        slow_ms: u64,
        stdout: Stdio,
        env: &[(&str, String)],
    ) -> Child {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        cmd.env(self.dir_var, dir)
            .env(self.slow_var, slow_ms.to_string())
            .envs((self.extra_env)(dir))
            .stdout(stdout)
            .stderr(if self.show_stderr {
                Stdio::inherit()
            } else {
                Stdio::null()
            });
        cmd.spawn().expect("spawn the child")
    }

    /// Runs a child to completion; returns its stdout lines.
    pub fn run_to_end(&self, dir: &Path) -> Vec<String> {
        let out = self
            .spawn(dir, 0, Stdio::piped())
            .wait_with_output()
            .unwrap();
        assert!(out.status.success(), "child failed: {:?}", out.status);
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(String::from)
            .collect()
    }

    /// Kills the child right after it reports `marker` (it then sleeps inside the write
    /// window); false if the child ended without reporting it.
    pub fn kill_at_marker(&self, dir: &Path, slow_ms: u64, marker: &str) -> bool {
        let mut child = self.spawn(dir, slow_ms, Stdio::piped());
        let out = child.stdout.take().unwrap();
        let mut hit = false;
        for line in BufReader::new(out).lines() {
            if line.unwrap() == marker {
                child.kill().unwrap();
                hit = true;
                break;
            }
        }
        let status = child.wait().unwrap();
        assert!(!hit || !status.success(), "the child was killed");
        hit
    }

    /// Runs a child that SIGKILLs itself just before its `step`-th durable step
    /// (`DURABLE_KILL_AT`, the `fault-injection` feature of `durable`); true when it died
    /// that way, false when it ended first.
    pub fn kill_before_step(&self, dir: &Path, step: u64) -> bool {
        use std::os::unix::process::ExitStatusExt;
        let env = [("DURABLE_KILL_AT", step.to_string())];
        let status = self.spawn_with(dir, 0, Stdio::null(), &env).wait().unwrap();
        match status.signal() {
            Some(9) => true,
            None if status.success() => false,
            _ => panic!("the child failed before step {step}: {status:?}"),
        }
    }

    /// Kills the child after `delay` (or lets it finish, if it is done by then).
    pub fn kill_after(&self, dir: &Path, slow_ms: u64, delay: Duration) {
        let mut child = self.spawn(dir, slow_ms, Stdio::null());
        std::thread::sleep(delay);
        let _ = child.kill();
        child.wait().unwrap();
    }

    /// Resumes the killed run in `dir` (checkpoints under `dir/ckpt`, metrics under
    /// `dir/run`, its final parameters written to `dir/<final_file>` by the child) to its end,
    /// and checks it against the uninterrupted `reference`: it restarts right after the last
    /// committed checkpoint, ends with the same parameters bit for bit and logs the same
    /// non-timing metrics. Returns those metrics.
    pub fn resume_and_check(
        &self,
        dir: &Path,
        reference: &Path,
        trial: &str,
        final_file: &str,
    ) -> Vec<Record> {
        let last = CheckpointStore::new(dir.join("ckpt"), "t2i", None)
            .unwrap()
            .latest_committed()
            .unwrap()
            .map(|c| c.iteration);
        let lines = self.run_to_end(dir);
        let expect = format!("START {}", last.map_or(0, |it| it + 1));
        assert_eq!(
            lines.iter().find(|l| l.starts_with("START")),
            Some(&expect),
            "{trial}: resumed at the wrong rollout: {lines:?}"
        );
        assert_eq!(lines.last().map(String::as_str), Some("DONE"), "{trial}");
        assert_eq!(
            std::fs::read(dir.join(final_file)).unwrap(),
            std::fs::read(reference.join(final_file)).unwrap(),
            "{trial}: final parameters differ from the uninterrupted run"
        );
        let ours = metrics(&dir.join("run"));
        assert_eq!(
            ours,
            metrics(&reference.join("run")),
            "{trial}: metrics differ"
        );
        ours
    }
}
