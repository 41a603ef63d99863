//! `OSB_RUN_TIMELINE` (the benches' view of where a run's time goes): the supervisor's stages,
//! those inside the sandbox's making, and the exec's init's steps while it made the view, in
//! the order they happened. Through the real binary.

mod support;

use std::collections::HashMap;
use std::process::{Command, Stdio};

use support::{BIN, Workdir, require_root, text};

/// `stage=ns[,more]` pairs of the stderr line that starts with `prefix `, in order.
fn line(err: &str, prefix: &str) -> Vec<(String, u64)> {
    let l = err
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{prefix} ")))
        .unwrap_or_else(|| panic!("no {prefix} line in: {err}"));
    l.split(' ')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            let first = v.split(',').next().unwrap();
            (k.to_string(), first.parse().unwrap())
        })
        .collect()
}

/// `run -q -- /bin/true` in a workdir of its own, with `OSB_RUN_TIMELINE` set or not.
fn run_true(timeline: bool) -> std::process::Output {
    let wd = Workdir::new();
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "-q", "--workdir"])
        .arg(wd.path())
        .args(["--", "/bin/true"])
        .stdin(Stdio::null());
    if timeline {
        cmd.env("OSB_RUN_TIMELINE", "1");
    } else {
        cmd.env_remove("OSB_RUN_TIMELINE");
    }
    cmd.output().unwrap()
}

#[test]
fn the_timeline_shows_the_sandboxs_steps_and_the_inits() {
    if !require_root() {
        return;
    }
    let out = run_true(true);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let sup = line(&err, "osb-timeline");
    let names: Vec<&str> = sup.iter().map(|(k, _)| k.as_str()).collect();
    for want in [
        "main",
        "policy",
        "sn-validate",
        "sn-view-plan",
        "sn-cgroups",
        "sn-clone",
        "sn-netns",
        "sn-report",
        "sn-made",
        "sandbox-new",
        "spawned",
        "cleanup",
    ] {
        assert!(names.contains(&want), "{want} missing: {names:?}");
    }
    assert!(
        sup.windows(2).all(|w| w[0].1 <= w[1].1),
        "the supervisor's stamps are in time order: {sup:?}"
    );
    let cpu = line(&err, "osb-timeline-cpu");
    assert_eq!(cpu.len(), sup.len(), "a CPU figure for every stage");
    let init = line(&err, "osb-timeline-init");
    let init_names: Vec<&str> = init.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        init_names,
        [
            "init-start",
            "init-prologue",
            "init-private",
            "init-root",
            "init-proc-uts",
            "init-rules",
            "init-reported",
            "init-go",
        ],
        "{err}"
    );
    assert!(init.windows(2).all(|w| w[0].1 <= w[1].1), "{init:?}");
    // The init is cloned after its cgroup was made, and its report is read after its rules.
    let at: HashMap<&str, u64> = sup.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let init_at: HashMap<&str, u64> = init.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert!(at["sn-exec-cgroup"] <= init_at["init-start"], "{err}");
    assert!(init_at["init-rules"] <= at["sn-report"], "{err}");
    assert!(at["sandbox-new"] <= init_at["init-go"], "{err}");
    // The command's steps, stamped by the init and the command between the go and the exec,
    // in the order they take them (ns after the go).
    let cmd = line(&err, "osb-spawn-timeline");
    let mut cmd_names: Vec<&str> = cmd.iter().map(|(k, _)| k.as_str()).collect();
    // The init stamps its forget after the command's exec, while the supervisor, woken by that
    // exec, reads the stamps: it is there only when the init got there first.
    if cmd_names.last() == Some(&"init-forget") {
        cmd_names.pop();
    }
    assert_eq!(
        cmd_names,
        [
            "init-signals",
            "cmd-start",
            "cmd-stdio",
            "cmd-session",
            "cmd-rlimits",
            "cmd-identity",
            "cmd-pdeath",
            "cmd-landlock",
            "cmd-fds",
            "cmd-seccomp",
            "exec",
        ],
        "{err}"
    );
    assert!(cmd.windows(2).all(|w| w[0].1 <= w[1].1), "{cmd:?}");
}

#[test]
fn without_the_variable_nothing_is_printed() {
    if !require_root() {
        return;
    }
    let out = run_true(false);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "");
}
