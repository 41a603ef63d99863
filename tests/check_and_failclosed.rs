//! `check`, the fail-closed refusal, and the parent-death signal, through the real binary.

mod support;

use std::process::Command;
use std::time::Duration;

use support::*;

#[test]
fn check_reports_every_layer_and_full_enforcement_as_root() {
    if !require_root() {
        return;
    }
    let out = Command::new(BIN)
        .args(["check", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{v}");
    assert_eq!(v["fully_enforced"], true);
    assert!(v["landlock"]["abi"].as_i64().unwrap() >= 6, "{v}");
    assert_eq!(v["no_new_privs"], true);
    let layers: Vec<&str> = v["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["layer"].as_str().unwrap())
        .collect();
    for want in [
        "landlock-fs",
        "landlock-net",
        "landlock-scope",
        "seccomp",
        "identity",
        "cgroup",
        "rlimits",
    ] {
        assert!(layers.contains(&want), "{want} missing from {layers:?}");
    }
    let human = Command::new(BIN).arg("check").output().unwrap();
    assert!(String::from_utf8_lossy(&human.stdout).contains("default policy: fully enforced"));
}

/// A non-root supervisor cannot switch to another uid: without --allow-degraded that is a
/// refusal naming the layer; with it, the run happens and the report says what was weaker.
#[test]
fn an_unenforceable_layer_is_refused_unless_degraded_runs_are_allowed() {
    if !require_root()
        || !require(
            which("setpriv"),
            "setpriv (util-linux) to run as a non-root user",
        )
    {
        return;
    }
    let wd = Workdir::new();
    let as_nobody = |extra: &[&str]| {
        Command::new("setpriv")
            .args([
                "--reuid",
                "65534",
                "--regid",
                "65534",
                "--clear-groups",
                "--",
            ])
            .arg(BIN)
            .args(["run", "--uid", "1234", "--workdir"])
            .arg(wd.path())
            .args(extra)
            .args(["--", "true"])
            .env_remove("OPENSHELL_SANDBOX_UID")
            .output()
            .unwrap()
    };
    let out = as_nobody(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("layer `identity` cannot be enforced"), "{err}");
    assert!(err.contains("cannot switch to uid 1234"), "{err}");

    let out = as_nobody(&["--allow-degraded"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("DEGRADED: identity"), "{err}");
}

#[test]
fn the_child_dies_with_the_supervisor() {
    let wd = Workdir::new();
    let pidfile = wd.path().join("child.pid");
    let mut sup = Command::new(BIN)
        .args(["run", "--allow-degraded", "-q", "--workdir"])
        .arg(wd.path())
        .args(["--", "sh", "-c"])
        .arg(format!("echo $$ > {}; exec sleep 300", pidfile.display()))
        .spawn()
        .unwrap();
    let mut pid = None;
    for _ in 0..500 {
        if let Some(p) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            pid = Some(p);
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let ns_pid = pid.expect("the child wrote its pid");
    // `$$` is the command's pid inside its own PID namespace; find its pid out here among the
    // supervisor's descendants (its init's child).
    let pid = descendants(sup.id() as i32)
        .into_iter()
        .find(|&p| ns_pid_of(p) == Some(ns_pid))
        .expect("the command is a descendant of the supervisor");
    sup.kill().unwrap(); // SIGKILL: no chance to clean up; only PDEATHSIG can act.
    sup.wait().unwrap();
    let mut gone = false;
    for _ in 0..500 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat.is_empty()
            || stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        {
            gone = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(gone, "child {pid} survived the supervisor's SIGKILL");
}

/// Every descendant of `pid`, from /proc/PID/task/*/children.
fn descendants(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut queue = vec![pid];
    while let Some(p) = queue.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let kids = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            for k in kids.split_whitespace().filter_map(|k| k.parse().ok()) {
                out.push(k);
                queue.push(k);
            }
        }
    }
    out
}

/// The innermost pid of `pid` (the last field of NSpid).
fn ns_pid_of(pid: i32) -> Option<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}
