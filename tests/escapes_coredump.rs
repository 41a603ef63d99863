//! A sandboxed crash must not hand its memory to the host's core dump handler, through the
//! real binary: the test points `kernel.core_pattern` at a recorder of its own (a pipe helper,
//! then a socket), crashes a child that holds a marker in its heap (tests/support/probe/crasher.c)
//! with SIGSEGV, and looks at what the recorder got.
//!
//! - A pipe helper (`|/path/helper`, as systemd-coredump and apport are installed) is never
//!   started: RLIMIT_CORE is 1, the value the kernel skips pipe helpers for, and the child
//!   cannot raise it.
//! - A socket (`@/path`, Linux 6.16 and later) ignores RLIMIT_CORE: the kernel connects and
//!   sends a dump anyway. The dump holds no memory of the child: every exec starts with
//!   coredump_filter 0, which its read-only /proc keeps it from raising.
//!
//! Each test first crashes the same program outside the sandbox (the control: the recorder
//! gets it, marker and all), and restores core_pattern when it ends, panics included
//! (tests/support/probe/machine.rs). Uids 64290..64299 are this file's.

mod support;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::probe::machine::{Exclusive, Sysctl};
use support::probe::{Mode, Scene};

/// 1 KiB of the crasher's heap pattern: only its anonymous memory holds this much of it.
fn marker() -> Vec<u8> {
    b"OSB-CORE-MARKER-".repeat(64)
}

fn holds_marker(dump: &[u8]) -> bool {
    let m = marker();
    dump.windows(16)
        .enumerate()
        .filter(|(_, w)| *w == &m[..16])
        .any(|(i, _)| dump.get(i..i + m.len()) == Some(&m[..]))
}

/// The scene plus the crasher in its root-owned `--ro` directory.
fn scene_with_crasher(uid: u32) -> (Scene, PathBuf) {
    let scene = Scene::new(uid);
    let crasher = scene.bin.join("osb-crasher");
    std::fs::copy(&support::probe::built().crasher, &crasher).unwrap();
    (scene, crasher)
}

/// Crash the crasher inside `openshell-sandbox run`; asserts it did die of SIGSEGV there.
fn crash_in_sandbox(scene: &Scene, crasher: &Path, mode: Mode) {
    let mut cmd = Command::new(support::probe::BIN);
    cmd.arg("run")
        .arg("--workdir")
        .arg(&scene.wd)
        .arg("--ro")
        .arg(&scene.bin);
    match mode {
        Mode::Root => {
            cmd.arg("--uid").arg(scene.uid.to_string());
        }
        Mode::RootTargetUid0 => {
            cmd.arg("--uid").arg("0");
        }
        Mode::NonRoot => {
            cmd.uid(scene.uid).gid(scene.uid);
        }
    }
    let out = cmd
        .arg("--")
        .arg(crasher)
        .current_dir(&scene.wd)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(128 + libc::SIGSEGV),
        "the sandboxed crasher did not die of SIGSEGV; stderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The same crash outside any sandbox, with the test's own limits.
fn crash_outside(crasher: &Path) -> u32 {
    let mut child = Command::new(crasher).spawn().unwrap();
    let pid = child.id();
    let st = child.wait().unwrap();
    assert_eq!(
        st.signal(),
        Some(libc::SIGSEGV),
        "the control crash: {st:?}"
    );
    pid
}

/// Poll until `f` holds or `limit` passes. Not a performance bound: the kernel hands a dump
/// over before the crashed process is reaped, and the margin is for a loaded machine.
fn within(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if f() {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How long to watch for a dump that must not come after the sandboxed run has ended.
const AFTER: Duration = Duration::from_secs(2);
const CONTROL: Duration = Duration::from_secs(20);

fn requirements() -> bool {
    support::probe::require_root_and_cc()
}

// ---- a pipe helper ----------------------------------------------------------------------------

fn pipe_helper_is_never_started(uid: u32, mode: Mode) {
    if !requirements() {
        return;
    }
    let (scene, crasher) = scene_with_crasher(uid);
    let dir = tempfile::Builder::new()
        .prefix("osb-core-pipe-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let log = dir.path().join("log");
    let helper = dir.path().join("record.sh");
    // Run by the kernel as root with each dump on stdin: keep it, then log pid and comm.
    std::fs::write(
        &helper,
        format!(
            "#!/bin/sh\ncat > '{d}/dump.'\"$1\"\necho \"$1 $2\" >> '{d}/log'\n",
            d = dir.path().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let lines = || std::fs::read_to_string(&log).unwrap_or_default();
    let crashes = || {
        lines()
            .lines()
            .filter(|l| l.ends_with(" osb-crasher"))
            .count()
    };

    let lock = Exclusive::take();
    let _pattern = Sysctl::set(
        &lock,
        "kernel.core_pattern",
        &format!("|{} %P %e", helper.display()),
    )
    .unwrap();

    let pid = crash_outside(&crasher);
    assert!(
        within(CONTROL, || lines().contains(&format!("{pid} osb-crasher"))),
        "the control: the helper never recorded the crash outside the sandbox (log: {:?})",
        lines()
    );
    let dump = std::fs::read(dir.path().join(format!("dump.{pid}"))).unwrap();
    assert!(holds_marker(&dump), "the control's dump lacks the marker");

    crash_in_sandbox(&scene, &crasher, mode);
    assert!(
        !within(AFTER, || crashes() > 1),
        "a core pattern helper was started for the sandboxed crash (log: {:?})",
        lines()
    );
}

#[test]
fn root_supervisor_child_crash_starts_no_pipe_helper() {
    pipe_helper_is_never_started(64290, Mode::Root);
}

#[test]
fn nonroot_child_crash_starts_no_pipe_helper() {
    pipe_helper_is_never_started(64291, Mode::NonRoot);
}

#[test]
fn uid0_child_crash_starts_no_pipe_helper() {
    pipe_helper_is_never_started(0, Mode::RootTargetUid0);
}

// ---- a socket -------------------------------------------------------------------------------

/// A listener that keeps every dump the kernel sends it, until dropped.
struct Recorder {
    dumps: Arc<Mutex<Vec<Vec<u8>>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Recorder {
    fn listen(path: &Path) -> Recorder {
        let listener = UnixListener::bind(path).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let dumps = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (dumps, stop) = (dumps.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((mut s, _)) => {
                            s.set_nonblocking(false).unwrap();
                            let mut b = Vec::new();
                            let _ = s.read_to_end(&mut b);
                            dumps.lock().unwrap().push(b);
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
            })
        };
        Recorder {
            dumps,
            stop,
            thread: Some(thread),
        }
    }

    fn count(&self) -> usize {
        self.dumps.lock().unwrap().len()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn socket_gets_no_memory(uid: u32, mode: Mode) {
    if !requirements() {
        return;
    }
    let (scene, crasher) = scene_with_crasher(uid);
    let dir = tempfile::Builder::new()
        .prefix("osb-core-sock-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sock = dir.path().join("core.sock");
    let recorder = Recorder::listen(&sock);

    let lock = Exclusive::take();
    let pattern = Sysctl::set(
        &lock,
        "kernel.core_pattern",
        &format!("@{}", sock.display()),
    );
    let Ok(_pattern) = pattern else {
        support::probe::require(
            false,
            "a kernel that dumps cores to a socket (core_pattern `@/path`, Linux 6.16)",
        );
        return;
    };

    crash_outside(&crasher);
    let with_marker = || {
        recorder
            .dumps
            .lock()
            .unwrap()
            .iter()
            .any(|d| holds_marker(d))
    };
    assert!(
        within(CONTROL, with_marker),
        "the control: no dump with the marker reached the socket from the crash outside"
    );
    let seen = recorder.count();

    crash_in_sandbox(&scene, &crasher, mode);
    // The dump (headers and notes only) may arrive: wait for it, then look into everything.
    within(AFTER, || recorder.count() > seen);
    let dumps = recorder.dumps.lock().unwrap();
    let sizes: Vec<usize> = dumps[seen..].iter().map(Vec::len).collect();
    assert!(
        !dumps[seen..].iter().any(|d| holds_marker(d)),
        "the sandboxed crash sent its memory to the core pattern socket (dump sizes {sizes:?})"
    );
    support::probe::loud(&format!(
        "core dump socket: the sandboxed crash sent {sizes:?} bytes (no memory)"
    ));
}

#[test]
fn root_supervisor_child_crash_sends_no_memory_to_a_core_socket() {
    socket_gets_no_memory(64292, Mode::Root);
}

#[test]
fn nonroot_child_crash_sends_no_memory_to_a_core_socket() {
    socket_gets_no_memory(64293, Mode::NonRoot);
}

#[test]
fn uid0_child_crash_sends_no_memory_to_a_core_socket() {
    socket_gets_no_memory(0, Mode::RootTargetUid0);
}
