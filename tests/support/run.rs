//! The real binary's `run`: a workdir the sandbox uid can write, `run` and its report,
//! pause points, and waiting for what a run leaves behind.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use super::BIN;
use super::skip::is_root;

/// A workdir the sandbox uid (65534 when we are root) can write.
pub struct Workdir {
    pub dir: tempfile::TempDir,
}

impl Workdir {
    pub fn new() -> Workdir {
        let dir = tempfile::Builder::new()
            .prefix("osb-test-")
            .tempdir()
            .unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        if is_root() {
            std::os::unix::fs::chown(dir.path(), Some(65534), Some(65534)).unwrap();
        }
        Workdir { dir }
    }
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// `openshell-sandbox run --workdir W [extra...] -- cmd...`, with a JSON report.
pub struct Run {
    pub out: Output,
    pub report: serde_json::Value,
}

impl Run {
    pub fn code(&self) -> i32 {
        self.out.status.code().unwrap_or(-1)
    }
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
    pub fn reason(&self) -> &str {
        self.report["reason"].as_str().unwrap_or("")
    }
}

pub fn run(wd: &Workdir, extra: &[&str], cmd: &[&str]) -> Run {
    let report_path: PathBuf = std::env::temp_dir().join(format!(
        "osb-report-{}-{}.json",
        std::process::id(),
        rand_suffix()
    ));
    let out = Command::new(BIN)
        .arg("run")
        .arg("--workdir")
        .arg(wd.path())
        .arg("--report-json")
        .arg(&report_path)
        .args(extra)
        .arg("--")
        .args(cmd)
        .current_dir(wd.path())
        .output()
        .expect("running openshell-sandbox");
    let report = std::fs::read(&report_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null);
    let _ = std::fs::remove_file(&report_path);
    Run { out, report }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
        ^ (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64)
}

/// Run a python snippet under the sandbox.
pub fn py(wd: &Workdir, extra: &[&str], code: &str) -> Run {
    run(wd, extra, &["python3", "-c", code])
}

/// Python prelude exposing `sc(nr, *args) -> (ret, errno)` through ctypes.
pub const PY_SYSCALL: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return r, ctypes.get_errno()
"#;

/// A directory for the pause-point protocol of src/pause.rs.
pub struct PauseDir {
    pub dir: tempfile::TempDir,
}

impl PauseDir {
    pub fn new() -> PauseDir {
        PauseDir {
            dir: tempfile::tempdir().expect("pause dir"),
        }
    }

    /// The environment that makes the supervisor stop at `points` (comma-separated).
    pub fn env(&self, points: &str) -> Vec<(String, String)> {
        vec![
            ("OSB_PAUSE_AT".into(), points.into()),
            (
                "OSB_PAUSE_DIR".into(),
                self.dir.path().display().to_string(),
            ),
        ]
    }

    /// Wait (at most `secs`) until the supervisor is held at `point`.
    pub fn wait_reached(&self, point: &str, secs: u64) -> bool {
        let f = self.dir.path().join(format!("{point}.reached"));
        let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        while std::time::Instant::now() < end {
            if f.exists() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        false
    }

    /// Let the supervisor go on from `point`.
    pub fn release(&self, point: &str) {
        std::fs::write(self.dir.path().join(format!("{point}.go")), b"").expect("release");
    }
}

/// Poll `f` every 10 ms for at most `secs` seconds; its last answer.
pub fn wait_until(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    f()
}

/// The pid a sandboxed script wrote to `path`, waiting at most `secs` seconds for it.
pub fn read_pid(path: &Path, secs: u64) -> Option<i32> {
    let mut pid = None;
    wait_until(secs, || {
        pid = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        pid.is_some()
    });
    pid
}

/// SIGKILL `pid` when it is a real pid (cleanup after a test).
pub fn kill(pid: i32) {
    if pid > 0 {
        // SAFETY: kill with integer arguments.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// The cgroup and cgroup2 mount points at or below /sys/fs/cgroup, from our own mountinfo.
pub fn cgroup_mounts() -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let fstype = right.split(' ').next()?;
            let point = left.split(' ').nth(4)?;
            (matches!(fstype, "cgroup" | "cgroup2") && point.starts_with("/sys/fs/cgroup"))
                .then(|| point.to_string())
        })
        .collect()
}

/// Whether `p` appears within `secs`.
pub fn wait_for_file(p: &Path, secs: u64) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if p.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// A child that is killed and reaped when the test ends, passed or not: a failed assertion
/// must not leave a run (and the command inside it) behind.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

impl std::ops::Deref for Reaped {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

/// The exit status of `c` within `secs`; otherwise it is killed and reaped, and `None`.
pub fn wait_exit(c: &mut Child, secs: u64) -> Option<std::process::ExitStatus> {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if let Some(st) = c.try_wait().unwrap() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = c.kill();
    let _ = c.wait();
    None
}

/// Output as text (lossy), for messages and matching.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The command succeeded; its output otherwise.
#[track_caller]
pub fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// The command failed (exit 1) saying `needle` on stderr.
#[track_caller]
pub fn assert_fails_with(out: &Output, needle: &str) {
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected exit 1; stdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let err = text(&out.stderr);
    assert!(err.contains(needle), "stderr lacks {needle:?}: {err}");
}
