//! The command's output, through the real binary: `--max-output` and its truncation marker, a
//! reader that goes away ending the command as in a shell pipeline (SIGPIPE), one open file as
//! both stdout and stderr keeping their order, `--merge-output`, and a writer that fails
//! without going away, which does not stop the command.

mod support;

use std::io::{BufRead, BufReader, Read};
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{BIN, Workdir, run};

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

// ---- --max-output ----

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

#[test]
fn large_output_is_capped_and_the_child_not_blocked() {
    let wd = Workdir::new();
    // 100 MiB to stdout; the child must run to completion (exit 7) despite the cap.
    let r = run(
        &wd,
        &["--allow-degraded", "--max-output", "1MiB"],
        &["sh", "-c", "head -c 104857600 /dev/zero; exit 7"],
    );
    assert_eq!(r.code(), 7, "{}", r.stderr());
    assert_eq!(r.report["stdout_bytes"], 104_857_600u64);
    assert_eq!(r.report["stdout_truncated"], true);
    assert_eq!(r.reason(), "output_limit");
    let out = &r.out.stdout;
    assert!(out.len() < (1 << 20) + 200, "{} bytes forwarded", out.len());
    let tail = String::from_utf8_lossy(&out[1 << 20..]);
    assert!(
        tail.contains("stdout truncated: 1048576 of 104857600 bytes"),
        "{tail}"
    );
}

// ---- pipelines ----

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
