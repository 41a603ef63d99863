//! `run --report-json PATH`, through the real binary: every run that gets as far as its report
//! writes a complete one (a command that could not start included), one refused before that
//! leaves no file, and the sandboxed command can neither forge the report nor make the
//! supervisor write through what it left at the path (a symlink, a FIFO, a directory, a
//! directory swapped above it). A run we end with SIGKILL still reports what its command used.
//!
//! As root, the sandbox runs as a per-run uid of `--uid-range`.

mod support;

use std::os::unix::fs::{FileTypeExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::text;
use support::{BIN, Workdir, require, require_root};

/// Exit code of input the run refuses before it starts (RunError::ReportJson, ::Policy).
const REFUSED: i32 = 125;
/// Exit code of a run whose report could not be written at the end: the supervisor's own
/// failure (RunError::ReportWrite).
const REPORT_FAILED: i32 = 125;

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn sandbox(args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("run").args(args).stdin(Stdio::null());
    c
}

/// `run --workdir wd --report-json report -- cmd...`.
fn run_reporting(wd: &Path, report: &Path, cmd: &[&str]) -> Output {
    sandbox(&["--workdir", wd.to_str().unwrap(), "--report-json"])
        .arg(report)
        .arg("--")
        .args(cmd)
        .current_dir(wd)
        .output()
        .unwrap()
}

/// The report at `p`, which must be a regular file holding one JSON object.
fn report_at(p: &Path) -> serde_json::Value {
    let m = std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
    assert!(
        m.file_type().is_file(),
        "{p:?} is not a regular file: {m:?}"
    );
    let bytes = std::fs::read(p).unwrap();
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{p:?} is not a whole report ({e}): {:?}", text(&bytes)))
}

/// Wait for `child` at most `secs`; `None` if it is still running then (it is killed).
fn wait_bounded(mut child: Child, secs: u64) -> Option<Output> {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if child.try_wait().unwrap().is_some() {
            return Some(child.wait_with_output().unwrap());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// A root-owned 0600 file in a root-only directory: what the child must not overwrite.
fn precious() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::Builder::new()
        .prefix("osb-precious-")
        .tempdir()
        .unwrap();
    chmod(d.path(), 0o700);
    let f = d.path().join("secret");
    std::fs::write(&f, "precious").unwrap();
    chmod(&f, 0o600);
    (d, f)
}

// ---- a command that could not start ----

/// Before the fix the report file of a command that was not found was left empty (0 bytes):
/// the run ended with the spawn error before the report was written.
#[test]
fn a_command_not_found_gets_a_complete_report() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let report = wd.path().join("report.json");
    let out = run_reporting(wd.path(), &report, &["osb-no-such-command", "arg"]);
    assert_eq!(out.status.code(), Some(127), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("osb-no-such-command: command not found"),
        "{}",
        text(&out.stderr)
    );
    let v = report_at(&report);
    assert_eq!(v["reason"], "not_found", "{v}");
    assert_eq!(v["exit_code"], 127, "{v}");
    assert!(v["status"].is_null() && v["signal"].is_null(), "{v}");
    assert_eq!(v["contained"], true, "{v}");
    assert_eq!(
        v["command"],
        serde_json::json!(["osb-no-such-command", "arg"])
    );
    assert!(!v["layers"].as_array().unwrap().is_empty(), "{v}");
    assert!(v["started_at"].as_str().is_some_and(|s| s.ends_with('Z')));
}

/// A program that exists but may not be executed: 126, reason `not_executable`.
#[test]
fn a_command_that_cannot_execute_gets_a_complete_report() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let prog = wd.path().join("prog");
    std::fs::write(&prog, "#!/bin/sh\necho ran\n").unwrap();
    chmod(&prog, 0o644);
    let report = wd.path().join("report.json");
    let out = run_reporting(wd.path(), &report, &["./prog"]);
    assert_eq!(out.status.code(), Some(126), "{}", text(&out.stderr));
    let v = report_at(&report);
    assert_eq!(v["reason"], "not_executable", "{v}");
    assert_eq!(v["exit_code"], 126, "{v}");
}

/// A run refused before it starts (here: the workdir does not exist) writes no report and
/// leaves no file at the path.
#[test]
fn a_refused_run_leaves_no_report_file() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let report = wd.path().join("report.json");
    let missing = wd.path().join("no-such-dir");
    let out = sandbox(&["--workdir", missing.to_str().unwrap(), "--report-json"])
        .arg(&report)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        std::fs::symlink_metadata(&report).is_err(),
        "a refused run left {report:?}"
    );
}

// ---- what the child leaves at the path ----

/// The child moves the real report away and leaves a forged one at the path. Before the fix
/// the supervisor wrote into the file it had opened before the run, now under the child's
/// name, and the forged report stayed at the path.
#[test]
fn the_child_cannot_forge_the_report_in_its_workdir() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let report = wd.path().join("report.json");
    let script = r#"mv report.json real.json 2>/dev/null
printf '{"reason":"exited","exit_code":0,"status":0,"forged":true}' > report.json
exit 3"#;
    let out = run_reporting(wd.path(), &report, &["sh", "-c", script]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let v = report_at(&report);
    assert!(v.get("forged").is_none(), "the child's report stayed: {v}");
    assert_eq!(v["exit_code"], 3, "{v}");
    assert_eq!(v["status"], 3, "{v}");
    assert!(
        !wd.path().join("real.json").exists(),
        "nothing of ours was at the path during the run"
    );
}

/// The child replaces the report path with a symlink to a root-only file. The file stays as it
/// was, and the link is replaced by the report.
#[test]
fn a_link_the_child_leaves_at_the_report_path_is_replaced_not_followed() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let (_keep, secret) = precious();
    let report = wd.path().join("report.json");
    let script = format!("ln -s {} report.json", secret.display());
    let out = run_reporting(wd.path(), &report, &["sh", "-c", &script]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(&secret).unwrap(),
        "precious",
        "the supervisor wrote its report through the child's link"
    );
    assert_eq!(report_at(&report)["exit_code"], 0);
}

/// A symlink or a hard link at the path before the run: replaced by the report, never written
/// through (the file they name keeps its content).
#[test]
fn an_existing_link_or_hard_link_at_the_report_path_is_replaced() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let (_keep, secret) = precious();
    let link = wd.path().join("link.json");
    symlink(&secret, &link).unwrap();
    let hard = wd.path().join("hard.json");
    std::fs::write(wd.path().join("orig"), "x").unwrap();
    std::fs::hard_link(wd.path().join("orig"), &hard).unwrap();
    for p in [&link, &hard] {
        let out = run_reporting(wd.path(), p, &["true"]);
        assert_eq!(out.status.code(), Some(0), "{p:?}: {}", text(&out.stderr));
        assert_eq!(report_at(p)["exit_code"], 0);
    }
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "precious");
    assert_eq!(
        std::fs::read_to_string(wd.path().join("orig")).unwrap(),
        "x"
    );
}

/// The child replaces the report path with a FIFO and exits: the supervisor neither blocks on
/// it nor leaves it; the report replaces it.
#[test]
fn a_fifo_the_child_leaves_at_the_report_path_is_replaced() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let report = wd.path().join("report.json");
    let child = sandbox(&["--workdir", wd.path().to_str().unwrap(), "--report-json"])
        .arg(&report)
        .args(["--", "sh", "-c", "mkfifo report.json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_bounded(child, 20).expect("the supervisor blocked on the FIFO");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(report_at(&report)["exit_code"], 0);
}

/// The same FIFO while the run is ended by SIGTERM: the supervisor still exits (143), with
/// the report in the FIFO's place.
#[test]
fn a_fifo_at_the_report_path_then_sigterm_still_ends_the_run() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let report = wd.path().join("report.json");
    let child = sandbox(&["--workdir", wd.path().to_str().unwrap(), "--report-json"])
        .arg(&report)
        .args(["--", "sh", "-c", "mkfifo report.json; sleep 60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    while !std::fs::symlink_metadata(&report).is_ok_and(|m| m.file_type().is_fifo()) {
        assert!(Instant::now() < end, "the child never made the FIFO");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill on the pid of our own child process.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let out = wait_bounded(child, 20).expect("SIGTERM did not end the run (blocked on the FIFO)");
    assert_eq!(
        out.status.code(),
        Some(128 + libc::SIGTERM),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(report_at(&report)["exit_code"], 128 + libc::SIGTERM);
}

/// A directory the child makes at the path cannot be replaced by a file: the run says so and
/// exits with an error, and what is at the path is a directory, not a report.
#[test]
fn a_directory_the_child_leaves_at_the_report_path_fails_the_run() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let report = wd.path().join("report.json");
    let script = r#"mkdir report.json && printf '{"forged":true}' > report.json/x"#;
    let out = run_reporting(wd.path(), &report, &["sh", "-c", script]);
    let se = text(&out.stderr);
    assert_eq!(out.status.code(), Some(REPORT_FAILED), "{se}");
    assert!(
        se.contains("the run ended, but its report could not be written"),
        "{se}"
    );
    assert!(std::fs::symlink_metadata(&report).unwrap().is_dir());
}

// ---- a directory the child could replace ----

/// A report directory below the workdir: the child could rename it (or one above it) away and
/// make one of its own with a forged report at the path. Before the fix that run was accepted
/// and the child's `out/report.json` was what the path named afterwards; now it is refused
/// before the command runs, naming the grant.
#[test]
fn a_report_directory_below_a_read_write_grant_is_refused_before_the_run() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let out_dir = wd.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let rw = tempfile::Builder::new()
        .prefix("osb-rw-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    std::fs::create_dir(rw.path().join("deep")).unwrap();
    let script = r#"touch ran
mv out out.old && mkdir out && printf '{"forged":true}' > out/report.json"#;
    for (report, grant) in [
        (out_dir.join("report.json"), wd.path().to_path_buf()),
        (rw.path().join("deep/report.json"), rw.path().to_path_buf()),
    ] {
        let out = sandbox(&["--workdir", wd.path().to_str().unwrap(), "--rw"])
            .arg(rw.path())
            .arg("--report-json")
            .arg(&report)
            .args(["--", "sh", "-c", script])
            .current_dir(wd.path())
            .output()
            .unwrap();
        let se = text(&out.stderr);
        assert_eq!(out.status.code(), Some(REFUSED), "{report:?}: {se}");
        assert!(
            se.contains(&format!(
                "lies below the read-write grant {}",
                grant.display()
            )),
            "{se}"
        );
        assert!(!wd.path().join("ran").exists(), "the command ran: {se}");
        assert!(std::fs::symlink_metadata(&report).is_err());
    }
    // The grant's own directory, and a directory outside every grant, are fine.
    let beside = tempfile::Builder::new()
        .prefix("osb-report-")
        .tempdir()
        .unwrap();
    for report in [
        rw.path().join("report.json"),
        beside.path().join("report.json"),
    ] {
        let out = sandbox(&["--workdir", wd.path().to_str().unwrap(), "--rw"])
            .arg(rw.path())
            .arg("--report-json")
            .arg(&report)
            .args(["--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(report_at(&report)["exit_code"], 0);
    }
}

/// The report cannot be written (the child filled the workdir's filesystem) after the child
/// left a link to a forged report at the path: the run fails, and the link is gone, so that
/// nothing at the path passes for the report.
#[test]
fn a_report_that_cannot_be_written_leaves_nothing_of_the_child_at_the_path() {
    if !require_root() || !require(support::which("unshare"), "unshare(1) (util-linux)") {
        return;
    }
    let base = tempfile::Builder::new()
        .prefix("osb-full-")
        .tempdir()
        .unwrap();
    let wd = base.path().join("wd");
    std::fs::create_dir(&wd).unwrap();
    // A 1 MiB tmpfs as the workdir, in a mount namespace of the test's own; the child fills
    // it to the last inode and block, then exits 0.
    let child = r#"printf '{"forged":true}' > forged.json; ln -s forged.json report.json
dd if=/dev/zero of=fill bs=4k 2>/dev/null; i=0; while : > f$i 2>/dev/null; do i=$((i+1)); done"#;
    let script = r#"mount -t tmpfs -o size=1m,nr_inodes=64,mode=0755 osb-full "$1" && chown 65534:65534 "$1" || exit 99
"$2" run --workdir "$1" --report-json "$1/report.json" -- sh -c "$3"
echo "rc=$?"
if [ -e "$1/report.json" ] || [ -L "$1/report.json" ]; then echo LEFT; else echo NOTHING-AT-PATH; fi"#;
    let out = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .arg(&wd)
        .arg(BIN)
        .arg(child)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (so, se) = (text(&out.stdout), text(&out.stderr));
    assert!(so.contains(&format!("rc={REPORT_FAILED}")), "{so}{se}");
    assert!(
        se.contains("--report-json") && se.contains("No space left on device"),
        "not the failure this test is about: {se}"
    );
    assert!(
        so.contains("NOTHING-AT-PATH"),
        "the child's link stayed at the path: {so}{se}"
    );
}

/// A run we end with SIGKILL (the output cap with `kill`, a timeout whose grace runs out)
/// still reports what the command used: the init died before reaping it, so its rusage alone
/// would say `cpu 0+0 ms` and the init's own few KiB of RSS.
#[test]
fn a_killed_run_reports_the_commands_cpu_and_memory() {
    if !support::require(support::which("python3"), "python3") {
        return;
    }
    let wd = support::Workdir::new();
    // 64 MiB touched, a good 0.2 s of CPU, then a flood past the cap.
    let burn = "import sys, time\n\
                b = bytearray(64 << 20)\n\
                for i in range(0, len(b), 4096): b[i] = 1\n\
                t = time.process_time()\n\
                while time.process_time() - t < 0.3: pass\n";
    let flood = format!("{burn}sys.stdout.write('a' * (4 << 20))\n");
    let hang = format!(
        "{burn}import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: pass\n"
    );
    for (extra, code, reason) in [
        (
            &["--max-output", "1M", "--on-output-limit", "kill"][..],
            &flood,
            "output_limit",
        ),
        (
            &["--timeout", "3", "--kill-grace", "0.2"][..],
            &hang,
            "timeout",
        ),
    ] {
        let r = support::py(&wd, extra, code);
        assert_eq!(r.reason(), reason, "{}", r.stderr());
        let cpu =
            r.report["user_cpu_ms"].as_u64().unwrap() + r.report["sys_cpu_ms"].as_u64().unwrap();
        assert!(cpu >= 250, "{reason}: cpu {cpu} ms: {}", r.report);
        let rss = r.report["peak_rss_kib"].as_u64().unwrap();
        assert!(
            rss >= 64 * 1024,
            "{reason}: peak rss {rss} KiB: {}",
            r.report
        );
    }
}
