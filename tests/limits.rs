//! Issue 12: limits that mean what users think they mean, and streams that behave like a
//! pipeline. Every test drives the real binary.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{BIN, Workdir, py, require, require_root, run};

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Wait for `child` at most `secs`; kill it and fail otherwise.
fn wait_within(child: &mut std::process::Child, secs: u64, what: &str) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if start.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {secs} s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---- 1. --memory is resident memory, --address-space is RLIMIT_AS ----

#[test]
fn memory_limit_lets_v8_reserve_address_space() {
    if !require_root() || !require(have("node"), "node is installed") {
        return;
    }
    let wd = Workdir::new();
    let r = run(
        &wd,
        &["--memory", "512M"],
        &["node", "-e", "console.log(1)"],
    );
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert_eq!(r.stdout().trim(), "1");
    assert_eq!(r.reason(), "exited");
}

#[test]
fn address_space_is_its_own_flag() {
    let wd = Workdir::new();
    let code = "import resource; print(*resource.getrlimit(resource.RLIMIT_AS))";
    let r = py(&wd, &["--allow-degraded", "--address-space", "1G"], code);
    assert_eq!(r.stdout().trim(), "1073741824 1073741824", "{}", r.stderr());
    if require_root() {
        let r = py(&wd, &["--memory", "256M"], code);
        assert_eq!(r.stdout().trim(), "-1 -1", "{}", r.stderr());
    }
}

#[test]
fn memory_limit_reason_is_the_oom_kill_counter() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    // Four children of 80 MB each, one after the other, under 128M: the limit is reached
    // (page reclaim), nothing is OOM-killed, and the run exits 0.
    let r = py(
        &wd,
        &["--memory", "128M"],
        "import subprocess, sys\n\
         for i in range(4):\n    \
             subprocess.run([sys.executable, '-c', 'b = bytearray(80 << 20); print(len(b))'], check=True)\n\
         f = open('f', 'wb')\n\
         for i in range(200):\n    f.write(bytes(1 << 20))",
    );
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert_eq!(r.reason(), "exited", "{:?}", r.report);
    // A real bomb is OOM-killed: memory_limit.
    let r = py(
        &wd,
        &["--memory", "128M"],
        "import os\nchunks = []\nwhile True:\n    chunks.append(os.urandom(1 << 20))",
    );
    assert_eq!(r.reason(), "memory_limit", "{:?}\n{}", r.report, r.stderr());
}

// ---- 2. --pids is reported ----

#[test]
fn pids_limit_is_reported() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    // Fork until the pids cgroup says no (EAGAIN), then clean up and exit 0.
    let r = py(
        &wd,
        &["--pids", "16"],
        "import os, errno, signal\nkids = []\ntry:\n    while True:\n        pid = os.fork()\n        if pid == 0:\n            signal.pause()\n        kids.append(pid)\nexcept OSError as e:\n    assert e.errno == errno.EAGAIN, e\n    print('held at', len(kids))\nfor k in kids:\n    os.kill(k, 9)\n    os.waitpid(k, 0)",
    );
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert!(r.stdout().contains("held at"), "{}", r.stdout());
    assert_eq!(r.reason(), "pids_limit", "{:?}", r.report);
}

// ---- 3. --max-output ----

#[test]
fn output_limit_kill_ends_at_once() {
    let wd = Workdir::new();
    let start = Instant::now();
    let r = run(
        &wd,
        &[
            "--allow-degraded",
            "--timeout",
            "30",
            "--max-output",
            "1K",
            "--on-output-limit",
            "kill",
        ],
        &["yes"],
    );
    assert_eq!(r.reason(), "output_limit", "{:?}\n{}", r.report, r.stderr());
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(r.report["stdout_truncated"], true);
    assert_ne!(r.code(), 0);
}

#[test]
fn truncation_marker_is_on_a_fresh_line_and_never_splits_utf8() {
    let wd = Workdir::new();
    // a b é é: the 5-byte cap falls inside the second é.
    let r = run(
        &wd,
        &["--allow-degraded", "-q", "--max-output", "5"],
        &["printf", "ab\\303\\251\\303\\251"],
    );
    let out = r.stdout();
    assert!(
        out.starts_with("abé\n[openshell-sandbox: stdout truncated: 4 of 6 bytes"),
        "{out:?}"
    );
    // Cut right after a newline: no empty line before the marker.
    let r = run(
        &wd,
        &["--allow-degraded", "-q", "--max-output", "4"],
        &["printf", "abc\\ndef\\n"],
    );
    let out = r.stdout();
    assert!(out.starts_with("abc\n[openshell-sandbox:"), "{out:?}");
}

// ---- 4. pipelines ----

fn spawn_run(extra: &[&str], cmd: &[&str], wd: &Workdir) -> std::process::Child {
    Command::new(BIN)
        .arg("run")
        .arg("--workdir")
        .arg(wd.path())
        .args(["--allow-degraded", "-q", "--timeout", "60"])
        .args(extra)
        .arg("--")
        .args(cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn closed_stdout_reader_ends_yes_with_sigpipe() {
    let wd = Workdir::new();
    let mut child = spawn_run(&[], &["yes"], &wd);
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "y\n");
    // The reader is gone now (dropped above), as `| head -1` would be.
    let st = wait_within(&mut child, 15, "run -- yes | head -1");
    assert_eq!(st.code(), Some(128 + libc::SIGPIPE));
}

#[test]
fn seq_into_head_ends_fast() {
    let wd = Workdir::new();
    let start = Instant::now();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "'{BIN}' run --workdir '{}' --allow-degraded -q -- seq 1 1000000000 | head -2",
            wd.path().display()
        ))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "1\n2\n");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn a_command_ignoring_sigpipe_is_stopped() {
    let wd = Workdir::new();
    let mut child = spawn_run(
        &[],
        &[
            "sh",
            "-c",
            "trap '' PIPE; while :; do echo y 2>/dev/null; done",
        ],
        &wd,
    );
    let mut buf = [0u8; 2];
    child.stdout.take().unwrap().read_exact(&mut buf).unwrap();
    let st = wait_within(&mut child, 15, "a command that ignores SIGPIPE");
    // Stopped by our SIGTERM once the grace after the closed pipe ran out.
    assert_eq!(st.code(), Some(128 + libc::SIGTERM));
}

/// A pipe whose write end is both stdout and stderr of the run, as `2>&1 |` makes.
fn run_with_shared_out(wd: &Workdir, extra: &[&str], script: &str) -> String {
    let mut fds = [0; 2];
    // SAFETY: pipe writes two fds into our array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both were just created and are owned by nobody else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let w2 = w.try_clone().unwrap();
    let mut child = Command::new(BIN)
        .arg("run")
        .arg("--workdir")
        .arg(wd.path())
        .args(["--allow-degraded", "-q"])
        .args(extra)
        .args(["--", "sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::from(w))
        .stderr(Stdio::from(w2))
        .spawn()
        .unwrap();
    let mut out = String::new();
    std::fs::File::from(r).read_to_string(&mut out).unwrap();
    child.wait().unwrap();
    out
}

#[test]
fn same_open_file_for_stdout_and_stderr_keeps_order() {
    let wd = Workdir::new();
    let script = "i=0; while [ $i -lt 300 ]; do echo out$i; echo err$i >&2; i=$((i+1)); done";
    let out = run_with_shared_out(&wd, &[], script);
    let want: String = (0..300).map(|i| format!("out{i}\nerr{i}\n")).collect();
    assert!(
        out == want,
        "stdout and stderr lines out of order:\n{}",
        &out[..out.len().min(400)]
    );
}

#[test]
fn merge_output_sends_stderr_to_stdout() {
    let wd = Workdir::new();
    let r = run(
        &wd,
        &["--allow-degraded", "-q", "--merge-output"],
        &["sh", "-c", "echo a; echo b >&2; echo c"],
    );
    assert_eq!(r.stdout(), "a\nb\nc\n");
    assert_eq!(r.stderr(), "");
}

// ---- 5. --cpu is the whole tree, --cpus is a quota ----

#[test]
fn cpu_limit_covers_the_whole_tree() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let spin = "python3 -c 'while 1: pass'";
    let r = run(
        &wd,
        &["--cpu", "1", "--timeout", "60"],
        &["sh", "-c", &format!("{spin} & {spin} & wait")],
    );
    assert_eq!(r.reason(), "cpu_limit", "{:?}\n{}", r.report, r.stderr());
    let used = r.report["cgroup_cpu_ms"].as_u64().unwrap_or(u64::MAX);
    // Per process (RLIMIT_CPU) the two would have used 2 s; the poll may overrun a little.
    assert!((1000..1800).contains(&used), "tree used {used} ms of CPU");
}

#[test]
fn cpus_is_a_bandwidth_quota() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    // Spin for 2 s of wall time; a 0.2-CPU quota allows about 0.4 s of CPU in that time.
    let r = py(
        &wd,
        &["--cpus", "0.2"],
        "import time\nt = time.time()\nwhile time.time() - t < 2: pass\nprint(time.process_time())",
    );
    let cpu: f64 = r.stdout().trim().parse().unwrap_or(99.0);
    assert!(
        cpu < 0.8,
        "used {cpu} s of CPU in 2 s under --cpus 0.2; {}",
        r.stderr()
    );
}

// ---- 6. without a cgroup, say so ----

fn run_as_nobody(wd: &Workdir, extra: &[&str], cmd: &[&str]) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    Command::new(BIN)
        .arg("run")
        .arg("--workdir")
        .arg(wd.path())
        .args(extra)
        .arg("--")
        .args(cmd)
        .current_dir(wd.path())
        .uid(65534)
        .gid(65534)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn non_root_defaults_run_and_explicit_limits_are_degraded() {
    if !require_root() {
        return; // root is needed to become the non-root caller
    }
    let wd = Workdir::new();
    let o = run_as_nobody(&wd, &["-v"], &["true"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("all layers enforced"), "{err}");
    for flag in [
        &["--pids", "16"][..],
        &["--memory", "64M"],
        &["--cpus", "0.5"],
        &["--cpu", "5"],
    ] {
        let o = run_as_nobody(&wd, flag, &["true"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{flag:?}: {err}");
        assert!(err.contains("--allow-degraded"), "{flag:?}: {err}");
        let mut with = flag.to_vec();
        with.push("--allow-degraded");
        let o = run_as_nobody(&wd, &with, &["true"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{flag:?}: {err}");
        assert!(err.contains("DEGRADED"), "{flag:?}: {err}");
    }
}

/// Only a reader that went away (EPIPE) closes the child's pipe: a stderr on /dev/full
/// (ENOSPC) is an error the command would see in a shell too, and it runs on.
#[test]
fn a_failing_but_present_writer_does_not_stop_the_command() {
    let wd = Workdir::new();
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = Command::new(BIN)
        .arg("run")
        .arg("--workdir")
        .arg(wd.path())
        .args(["--allow-degraded", "-q", "--timeout", "30", "--"])
        .args(["sh", "-c", "echo err >&2; sleep 2; echo done"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(full))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "done\n");
    assert_eq!(out.status.code(), Some(0));
}
