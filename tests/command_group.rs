//! How the command gets a process group of its own, through the real binary: a new session
//! only when the exec asks for a pty or the supervisor has a terminal the command must lose
//! (`src/sandbox/child/group.rs`); otherwise only its own process group, which spares the
//! new scheduler autogroup a session costs. Either way the command has no terminal of the
//! caller's, and a signal to its group reaches nothing outside the sandbox.

mod support;

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};

use support::*;

/// What the command sees of its process group, session and terminal, as one JSON line.
const PROBE: &str = r#"
import json, os
st = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
res = {"pid": os.getpid(), "pgrp": int(st[2]), "sid": int(st[3]), "tty_nr": int(st[4])}
try:
    os.close(os.open("/dev/tty", os.O_RDWR)); res["dev_tty"] = 0
except OSError as e:
    res["dev_tty"] = e.errno
try:
    os.setsid(); res["setsid"] = 0
except OSError as e:
    res["setsid"] = e.errno
try:
    res["stdin_rdev"] = os.fstat(0).st_rdev
except OSError:
    res["stdin_rdev"] = -1
print(json.dumps(res))
"#;

/// `tty_nr` of /proc/self/stat: whether the test process has a controlling terminal.
fn own_tty_nr() -> i64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 1..];
    rest.split_whitespace().nth(4).unwrap().parse().unwrap()
}

/// The probe's JSON line in `out` (a pty's output may carry CRs and other lines).
fn probe_result(out: &str) -> serde_json::Value {
    let line = out
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no probe output in {out:?}"));
    serde_json::from_str(line).unwrap()
}

/// `run -q --workdir W [extra] -- CMD` without a controlling terminal, with `env`: the test
/// process has none, or, run from a developer's terminal, `run` is started in a session of its
/// own, which has none. The output, and the session `run` ran in.
fn run_without_terminal(
    wd: &Workdir,
    extra: &[&str],
    env: &[(&str, &str)],
    cmd: &[&str],
) -> (std::process::Output, i64) {
    let mut c = Command::new(BIN);
    c.args(["run", "-q", "--workdir"])
        .arg(wd.path())
        .args(extra)
        .arg("--")
        .args(cmd)
        .current_dir(wd.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    let new_session = own_tty_nr() != 0;
    if new_session {
        // SAFETY: setsid is async-signal-safe.
        unsafe {
            c.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    } else {
        // Its own process group, so a group signal that escaped the sandbox would reach `run`
        // (and show in its status), never this test.
        c.process_group(0);
    }
    let child = c.spawn().unwrap();
    // SAFETY: getsid(0) has no preconditions.
    let ours = unsafe { libc::getsid(0) };
    let session = if new_session {
        i64::from(child.id())
    } else {
        i64::from(ours)
    };
    (child.wait_with_output().unwrap(), session)
}

fn probe_file(wd: &Workdir) -> String {
    let p = wd.path().join("probe.py");
    std::fs::write(&p, PROBE).unwrap();
    p.to_str().unwrap().to_string()
}

/// The probed command leads a session and its process group.
fn assert_leads_a_session(res: &serde_json::Value) {
    let pid = res["pid"].as_i64().unwrap();
    assert_eq!(
        res["sid"].as_i64(),
        Some(pid),
        "not a session leader: {res}"
    );
    assert_eq!(res["pgrp"].as_i64(), Some(pid), "{res}");
}

fn assert_own_group_no_session(res: &serde_json::Value) {
    let pid = res["pid"].as_i64().unwrap();
    assert_eq!(
        res["pgrp"].as_i64(),
        Some(pid),
        "not its group's leader: {res}"
    );
    assert_ne!(res["sid"].as_i64(), Some(pid), "a session leader: {res}");
    assert_eq!(res["tty_nr"].as_i64(), Some(0), "has a terminal: {res}");
    assert_eq!(res["dev_tty"].as_i64(), Some(libc::ENXIO.into()), "{res}");
    // A process group leader cannot take a session (and with it a terminal) either.
    assert_eq!(res["setsid"].as_i64(), Some(libc::EPERM.into()), "{res}");
}

#[test]
fn without_a_terminal_the_command_leads_its_own_group_in_no_new_session() {
    assert_eq!(
        own_tty_nr(),
        0,
        "the test runs with a controlling terminal, so it cannot show a run without one"
    );
    let wd = Workdir::new();
    let probe = probe_file(&wd);
    let (out, _) = run_without_terminal(&wd, &[], &[], &["/usr/bin/python3", &probe]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout} {}", text(&out.stderr));
    let res = probe_result(&stdout);
    assert_own_group_no_session(&res);
    // Its session is the supervisor's, outside the exec's PID namespace: no id there.
    assert_eq!(res["sid"].as_i64(), Some(0), "{res}");
}

#[test]
fn without_a_pid_namespace_too_the_command_leads_its_own_group_in_no_new_session() {
    if !require_pause_points() {
        return;
    }
    let wd = Workdir::new();
    let probe = probe_file(&wd);
    let (out, session) = run_without_terminal(
        &wd,
        &["--allow-degraded"],
        &[("OSB_TEST_DENY_PIDNS", "1")],
        &["/usr/bin/python3", &probe],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout} {}", text(&out.stderr));
    let res = probe_result(&stdout);
    assert_own_group_no_session(&res);
    // No PID namespace hides it: the session is `run`'s own.
    assert_eq!(res["sid"].as_i64(), Some(session), "{res}");
}

/// The command signals its own process group (`kill(0, SIGALRM)`, a signal `run` neither
/// handles nor forwards): it dies of it, and `run` survives to report it. A group shared with
/// `run` would have ended `run` itself.
fn group_signal_ends_only_the_command(extra: &[&str], env: &[(&str, &str)]) {
    let wd = Workdir::new();
    let reports = tempfile::tempdir().unwrap();
    let report = reports.path().join("report.json");
    let script = "import os, signal, time\n\
                  if os.fork() == 0:\n    time.sleep(30)\n    os._exit(0)\n\
                  os.kill(0, signal.SIGALRM)\n\
                  time.sleep(30)\n";
    let report_arg = report.to_str().unwrap();
    let mut args = vec!["--report-json", report_arg];
    args.extend_from_slice(extra);
    let (out, _) = run_without_terminal(&wd, &args, env, &["/usr/bin/python3", "-c", script]);
    let err = text(&out.stderr);
    assert_eq!(out.status.signal(), None, "run itself was signalled: {err}");
    assert_eq!(out.status.code(), Some(128 + libc::SIGALRM), "{err}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(r["reason"], "signaled", "{r}");
    assert_eq!(r["signal"].as_i64(), Some(libc::SIGALRM.into()), "{r}");
    assert_eq!(r["contained"], true, "{r}");
}

#[test]
fn a_group_signal_of_the_command_reaches_only_the_sandbox() {
    group_signal_ends_only_the_command(&[], &[]);
}

#[test]
fn a_group_signal_of_the_command_reaches_only_the_sandbox_without_a_pid_namespace() {
    if !require_pause_points() {
        return;
    }
    group_signal_ends_only_the_command(&["--allow-degraded"], &[("OSB_TEST_DENY_PIDNS", "1")]);
}

#[test]
fn under_a_terminal_the_command_takes_a_new_session_without_the_terminal() {
    if !have("script") {
        return;
    }
    let wd = Workdir::new();
    let probe = probe_file(&wd);
    // script gives the shell, and so `run`, a pty as controlling terminal; the shell says so
    // first, from the kernel's own field.
    let inner = format!(
        "awk '{{print \"caller-tty\", $7}}' /proc/self/stat; exec {BIN} run -q --workdir {} -- /usr/bin/python3 {probe}",
        wd.path().display()
    );
    let out = Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .env("SHELL", "/bin/sh")
        .current_dir(wd.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout} {}", text(&out.stderr));
    let caller_tty: i64 = stdout
        .lines()
        .find_map(|l| l.trim_end_matches('\r').strip_prefix("caller-tty "))
        .unwrap_or_else(|| panic!("no caller-tty line: {stdout:?}"))
        .parse()
        .unwrap();
    assert_ne!(
        caller_tty, 0,
        "script gave the caller no terminal: {stdout:?}"
    );
    let res = probe_result(&stdout);
    assert_leads_a_session(&res);
    assert_eq!(
        res["tty_nr"].as_i64(),
        Some(0),
        "kept the caller's terminal: {res}"
    );
    assert_eq!(res["dev_tty"].as_i64(), Some(libc::ENXIO.into()), "{res}");
    assert_eq!(res["setsid"].as_i64(), Some(libc::EPERM.into()), "{res}");
}

#[test]
fn on_a_pty_the_command_leads_a_session_whose_terminal_is_the_pty() {
    let wd = Workdir::new();
    let probe = probe_file(&wd);
    let pty = nix::pty::openpty(None, None).expect("openpty");
    let slave: OwnedFd = pty.slave;
    let _master = pty.master;
    assert!(slave.as_raw_fd() > 2);
    let out = Command::new(BIN)
        .args(["run", "-q", "--tty", "--workdir"])
        .arg(wd.path())
        .args(["--", "/usr/bin/python3", &probe])
        .current_dir(wd.path())
        .stdin(Stdio::from(slave))
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout} {}", text(&out.stderr));
    let res = probe_result(&stdout);
    assert_leads_a_session(&res);
    assert_ne!(
        res["tty_nr"].as_i64(),
        Some(0),
        "no controlling terminal: {res}"
    );
    assert_eq!(
        res["tty_nr"], res["stdin_rdev"],
        "its terminal is not its pty: {res}"
    );
    assert_eq!(res["dev_tty"].as_i64(), Some(0), "{res}");
}
