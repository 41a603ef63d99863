//! Unit tests of the cgroup decisions on a fake cgroup tree (a temporary directory standing in
//! for /sys/fs/cgroup): what is detected, what the report may claim, and that nothing leaks.

use super::*;

fn fake(self_cgroup: &str, dirs: &[&str], files: &[(&str, &str)]) -> (tempfile::TempDir, System) {
    let t = tempfile::tempdir().unwrap();
    for d in dirs {
        fs::create_dir_all(t.path().join(d)).unwrap();
    }
    for (f, text) in files {
        fs::write(t.path().join(f), text).unwrap();
    }
    let sys = System {
        mount: t.path().to_path_buf(),
        self_cgroup: self_cgroup.into(),
    };
    (t, sys)
}

/// v2 offering pids but not memory: the group is usable, but --memory is not enforced there.
#[test]
fn v2_without_the_memory_controller_reports_no_memory() {
    let files = [
        ("cgroup.controllers", "cpu pids"),
        ("pod/cgroup.controllers", "cpu pids"),
    ];
    let (_t, sys) = fake("0::/pod\n", &["pod"], &files);
    let p = probe(&sys).expect("pids is there");
    assert!(!p.memory, "{p:?}");
    let root = detect_in(&sys, Want::ALL).expect("a v2 root");
    assert!(root.memory().is_err());
}

#[test]
fn v2_with_the_memory_controller_reports_memory() {
    let files = [
        ("cgroup.controllers", "pids memory"),
        ("pod/cgroup.controllers", "pids memory"),
    ];
    let (_t, sys) = fake("0::/pod\n", &["pod"], &files);
    assert!(probe(&sys).unwrap().memory);
    let root = detect_in(&sys, Want::ALL).expect("a v2 root");
    assert_eq!(root.memory(), Ok(()));
}

/// v1 with a pids hierarchy and no memory hierarchy: no memory limit may be claimed.
#[test]
fn v1_without_a_memory_hierarchy_reports_no_memory() {
    let (_t, sys) = fake("5:pids:/\n4:freezer:/\n", &["pids", "freezer"], &[]);
    assert!(!probe(&sys).unwrap().memory);
    let root = detect_in(&sys, Want::ALL).expect("a v1 root");
    assert!(root.memory().is_err());
}

/// A memory hierarchy without memory.limit_in_bytes in our group bounds nothing.
#[test]
fn v1_memory_hierarchy_without_the_limit_file_reports_no_memory() {
    let (_t, sys) = fake("5:pids:/\n4:memory:/\n", &["pids", "memory"], &[]);
    let root = detect_in(&sys, Want::ALL).expect("a v1 root");
    assert!(root.memory().is_err());
}

/// `probe` makes nothing and sweeps nothing.
#[test]
fn probe_has_no_side_effects() {
    let (t, sys) = fake("5:pids:/\n", &["pids", "pids/openshell-owned-1-0-0"], &[]);
    let before = fs::read_dir(t.path().join("pids")).unwrap().count();
    assert!(probe(&sys).is_some());
    let after = fs::read_dir(t.path().join("pids")).unwrap().count();
    assert_eq!(before, after);
    assert!(t.path().join("pids/openshell-owned-1-0-0").is_dir());
}

/// A stale (unlocked) group is removed by the root's sweep (which detection leaves for once
/// the first exec runs); a locked one (a live owner) is kept, and so is the root's own.
#[test]
fn the_sweep_removes_only_unlocked_groups() {
    let (t, sys) = fake(
        "5:pids:/\n",
        &[
            "pids",
            "pids/openshell-owned-1-0-0/exec-1",
            "pids/openshell-owned-2-0-0",
            "pids/openshell-sandbox-9-0-0",
        ],
        &[("pids/openshell-owned-1-0-0/exec-1/cgroup.procs", "")],
    );
    let live = File::open(t.path().join("pids/openshell-owned-2-0-0")).unwrap();
    // SAFETY: flock on an fd we own.
    let rc = unsafe { libc::flock(live.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(rc, 0);
    // A fake group dir holds a regular file, so rmdir fails there; remove it as the kernel
    // would once the group is empty.
    fs::remove_file(
        t.path()
            .join("pids/openshell-owned-1-0-0/exec-1/cgroup.procs"),
    )
    .unwrap();
    let root = detect_in(&sys, Want::ALL).expect("a v1 root");
    // Detection alone does not sweep: that waits for the command to run.
    assert!(t.path().join("pids/openshell-owned-1-0-0").is_dir());
    root.sweep_stale();
    assert!(!t.path().join("pids/openshell-owned-1-0-0").exists());
    assert!(t.path().join("pids/openshell-owned-2-0-0").is_dir());
    assert!(
        root.bases()[0].is_dir(),
        "the sweep removed its own root's group"
    );
    // Older versions' groups carry no lock: nothing proves them dead.
    assert!(t.path().join("pids/openshell-sandbox-9-0-0").is_dir());
}

/// A root whose exec never ran (a run that failed before its command started) still sweeps,
/// when it is dropped; in every hierarchy it was made in (the freezer's and memory's too).
#[test]
fn a_root_dropped_unswept_sweeps() {
    let (t, sys) = fake(
        "5:pids:/\n4:freezer:/\n3:memory:/\n",
        &[
            "pids",
            "freezer",
            "memory",
            "pids/openshell-owned-1-0-0",
            "freezer/openshell-owned-1-0-0",
            "memory/openshell-owned-1-0-0",
        ],
        &[],
    );
    let root = detect_in(&sys, Want::ALL).expect("a v1 root");
    drop(root);
    for h in ["pids", "freezer", "memory"] {
        assert_eq!(
            fs::read_dir(t.path().join(h)).unwrap().count(),
            0,
            "{h}: a stale group, or ours, left"
        );
    }
}

/// Co-mounted `cpu,cpuacct` (both names links to one directory) is told apart from separate
/// hierarchies by the directory's identity, without resolving either path: one CPU group is
/// made there, not two.
#[test]
fn co_mounted_cpu_and_cpuacct_are_one_directory() {
    let (t, sys) = fake("5:pids:/\n2:cpu,cpuacct:/\n", &["pids", "cpu,cpuacct"], &[]);
    std::os::unix::fs::symlink("cpu,cpuacct", t.path().join("cpu")).unwrap();
    std::os::unix::fs::symlink("cpu,cpuacct", t.path().join("cpuacct")).unwrap();
    let (cpu, acct) = (sys.v1_parent_id("cpu"), sys.v1_parent_id("cpuacct"));
    assert_eq!(cpu.as_ref().map(|c| c.1), acct.as_ref().map(|a| a.1));
    assert!(cpu.is_some());
    let (_t, sys) = fake("2:cpuacct:/\n1:cpu:/\n", &["cpu", "cpuacct"], &[]);
    let (cpu, acct) = (sys.v1_parent_id("cpu"), sys.v1_parent_id("cpuacct"));
    assert_ne!(cpu.unwrap().1, acct.unwrap().1);
}

/// A failure halfway through making an exec's group removes what was made.
#[test]
fn a_failed_exec_group_leaks_nothing() {
    let (t, sys) = fake("5:pids:/\n", &["pids"], &[]);
    let root = detect_in(&sys, Want::ALL).expect("a v1 root");
    let base = root.bases()[0].to_path_buf();
    // No pids.max in a fake directory: the write fails (ENOENT) after the mkdir.
    let err = ExecCgroup::create(&root, &Limits::default()).unwrap_err();
    assert!(matches!(err, CgroupError::Write { .. }), "{err}");
    assert_eq!(fs::read_dir(&base).unwrap().count(), 0, "exec group leaked");
    drop(root);
    assert_eq!(fs::read_dir(t.path().join("pids")).unwrap().count(), 0);
}

/// The counters behind `memory_limit`, `pids_limit` and `--cpu` are read by exact key:
/// `oom_kill_disable` is not `oom_kill`, and v1's failcnt is never consulted.
#[test]
fn counters_are_read_by_exact_key() {
    let oom_control = "oom_kill_disable 1\nunder_oom 0\noom_kill 3\n";
    assert_eq!(counter(oom_control, "oom_kill"), Some(3));
    assert_eq!(
        counter("oom_kill_disable 1\nunder_oom 0\n", "oom_kill"),
        None
    );
    assert_eq!(counter("max 0\n", "max"), Some(0));
    let stat = "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n";
    assert_eq!(counter(stat, "usage_usec"), Some(1500));
}

/// A v1 root is made only in the hierarchies its policy's limits need: pids and freezer
/// always, memory for `--memory`, cpuacct and cpu for `--cpu`/`--cpus`.
#[test]
fn v1_root_skips_the_hierarchies_no_limit_needs() {
    let self_cgroup = "5:pids:/\n4:freezer:/\n3:memory:/\n2:cpuacct:/\n1:cpu:/\n";
    let dirs = ["pids", "freezer", "memory", "cpuacct", "cpu"];
    let (t, sys) = fake(self_cgroup, &dirs, &[]);
    let groups = |h: &str| fs::read_dir(t.path().join(h)).unwrap().count();
    let none = Want {
        memory: false,
        cpu: false,
    };
    let root = detect_in(&sys, none).expect("a v1 root");
    // (The fake's freezer group has no freezer.state, so it is given up: only pids stays.)
    assert_eq!(groups("pids"), 1);
    assert_eq!(
        (groups("memory"), groups("cpuacct"), groups("cpu")),
        (0, 0, 0)
    );
    assert!(root.memory().is_err());
    let limits = crate::policy::Limits {
        memory_bytes: Some(1 << 20),
        ..Default::default()
    };
    assert_eq!(
        Want::for_limits(&limits),
        Want {
            memory: true,
            cpu: false
        }
    );
    let limits = crate::policy::Limits {
        cpu_quota_millis: Some(500),
        ..Default::default()
    };
    assert!(Want::for_limits(&limits).cpu);
}

/// On the real cgroup tree: a root dropped while the group of its (reaped, so empty) exec is
/// still held elsewhere, as the process manager holds it until it hears of the reap, removes
/// that group itself and then its own, instead of waiting for the holder (rmdir of a base with
/// a group inside is EBUSY; before, the drop slept and retried for 0.1 s, then left the base
/// behind); the group's own drop later finds it gone.
#[test]
fn a_root_dropped_before_its_empty_exec_group_removes_both() {
    // SAFETY: geteuid has no preconditions.
    let root_user = unsafe { libc::geteuid() } == 0;
    let ci = std::env::var("CI").as_deref() == Ok("true");
    if !root_user {
        assert!(!ci, "this test needs root (real cgroups); CI=true fails it");
        eprintln!("SKIPPED: this test needs root (real cgroups)");
        return;
    }
    let Some(root) = detect() else {
        assert!(!ci, "no usable cgroup hierarchy; CI=true fails it");
        eprintln!("SKIPPED: no usable cgroup hierarchy here");
        return;
    };
    root.one_exec_only();
    let cg = root.take_exec(&crate::policy::Limits::default()).unwrap();
    let bases: Vec<PathBuf> = root.bases().iter().map(|b| b.to_path_buf()).collect();
    let dirs = cg.dirs.clone();
    assert!(dirs.iter().all(|d| d.is_dir()), "{dirs:?}");
    drop(root);
    for d in bases.iter().chain(&dirs) {
        assert!(!d.exists(), "{} is left", d.display());
    }
    drop(cg);
}
