//! Read-only cgroup mounts, as containerd gives a pod (SECURITY.md, "Read-only cgroups"): the
//! supervisor works through a private read-write copy of each, so per-exec limits hold, and
//! the mounts stay read-only for everyone else. The pod itself is simulated under runc by the
//! e2e (tests/e2e.rs); these tests make the same shape on the host with `unshare --mount` and
//! a read-only bind remount of every cgroup mount, which needs no container runtime.

mod support;

use std::path::PathBuf;
use std::process::{Command, Output};

use support::{BIN, Workdir, cgroup_mounts, require, require_root, which};

/// Run `script` (then `exec "$@"`) in a private mount namespace where every cgroup mount has
/// been remounted read-only; `$@` is the supervisor with `args`.
fn under_read_only_cgroups(args: &[&str]) -> Output {
    let mounts = cgroup_mounts();
    assert!(!mounts.is_empty(), "no cgroup mounts on this machine");
    let mut script = String::new();
    for m in &mounts {
        script.push_str(&format!("mount -o remount,bind,ro '{m}' || exit 97\n"));
    }
    // The remounts really are read-only in there (a mkdir answers EROFS).
    script.push_str(&format!(
        "mkdir '{}/osb-ro-probe' 2>/dev/null && {{ rmdir '{}/osb-ro-probe'; exit 98; }}\n",
        mounts[0], mounts[0]
    ));
    script.push_str("exec \"$@\"\n");
    Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(&script)
        .arg("sh")
        .arg(BIN)
        .args(args)
        .output()
        .expect("unshare")
}

fn report_path(wd: &Workdir) -> PathBuf {
    wd.path().join("report.json")
}

fn layer(report: &serde_json::Value, name: &str) -> serde_json::Value {
    report["layers"]
        .as_array()
        .and_then(|ls| ls.iter().find(|l| l["layer"] == name))
        .cloned()
        .unwrap_or_default()
}

/// `--pids` holds in an exec's own group although every cgroup mount is read-only, and the
/// report says how: the private read-write copy.
#[test]
fn limits_hold_through_read_only_cgroup_mounts() {
    if !require_root() || !require(which("unshare"), "unshare (util-linux)") {
        return;
    }
    let wd = Workdir::new();
    let rp = report_path(&wd);
    let wd_s = wd.path().display().to_string();
    let rp_s = rp.display().to_string();
    let out = under_read_only_cgroups(&[
        "run",
        "--workdir",
        &wd_s,
        "--report-json",
        &rp_s,
        "--pids",
        "16",
        "--",
        "python3",
        "-c",
        "import os, errno, signal\n\
         print(open('/proc/self/cgroup').read())\n\
         kids = []\n\
         try:\n    while True:\n        pid = os.fork()\n        if pid == 0:\n            signal.pause()\n        kids.append(pid)\n\
         except OSError as e:\n    assert e.errno == errno.EAGAIN, e\n    print('held at', len(kids))\n\
         for k in kids:\n    os.kill(k, 9)\n    os.waitpid(k, 0)",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&rp).unwrap()).unwrap();
    let cg = layer(&report, "cgroup");
    assert_eq!(cg["status"], "enforced", "{cg}");
    let detail = cg["detail"].as_str().unwrap_or("");
    assert!(
        detail.contains("read-only cgroup mounts used through a private read-write copy"),
        "{cg}"
    );
    // Shown at the mount point it copies, not as the supervisor's descriptor.
    assert!(
        detail.contains("pids at /sys/fs/cgroup/pids") && !detail.contains("/proc/self/fd"),
        "{cg}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.contains(":pids:") && l.contains("/openshell-owned-")),
        "the exec is not in a pids group of its own:\n{stdout}"
    );
    let held: usize = stdout
        .lines()
        .find_map(|l| l.strip_prefix("held at ")?.trim().parse().ok())
        .unwrap_or(usize::MAX);
    assert!(
        held < 16,
        "the fork loop was not held by pids.max 16: {stdout}"
    );
    assert_eq!(report["reason"], "pids_limit", "{report}");
}

/// `check` says the same as `run` does there; and the supervisor's own mounts stay read-only
/// (the copy is attached nowhere): a process started after it in the same namespace still
/// gets EROFS.
#[test]
fn check_reports_the_copy_and_the_mounts_stay_read_only() {
    if !require_root() || !require(which("unshare"), "unshare (util-linux)") {
        return;
    }
    let out = under_read_only_cgroups(&["check", "--json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "check --json: {e}\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let cg = layer(&report, "cgroup");
    assert_eq!(cg["status"], "enforced", "{cg}");
    assert!(
        cg["detail"]
            .as_str()
            .is_some_and(|d| d.contains("private read-write copy")),
        "{cg}"
    );
    // The same namespace, after a supervisor ran in it: still read-only for the next process.
    let mounts = cgroup_mounts();
    let m = &mounts[0];
    let script = format!(
        "mount -o remount,bind,ro '{m}' || exit 97\n\
         \"$0\" check --json >/dev/null 2>&1\n\
         mkdir '{m}/osb-ro-after'; rc=$?; rmdir '{m}/osb-ro-after' 2>/dev/null; exit $rc"
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(&script)
        .arg(BIN)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(
        out.status.code(),
        Some(0),
        "the mkdir succeeded after the supervisor ran"
    );
    assert!(err.contains("Read-only file system"), "{err}");
}
