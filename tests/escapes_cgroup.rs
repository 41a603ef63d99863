//! Escapes through cgroups (limits, membership, teardown), through the real binary.
//!
//! Most tests need a root supervisor (it alone creates cgroups); the race tests also need the
//! binary built with `--features test-pause-points`. Every process a test starts is killed by
//! the test, whatever the outcome.

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use support::{
    BIN, PauseDir, Workdir, kill, read_pid, require, require_pause_points, require_root, run,
    wait_until,
};

const PIDS_ROOT: &str = "/sys/fs/cgroup/pids";

fn which(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// The supervisor groups whose name carries `pid` (`openshell-owned-PID-...`), in the pids
/// hierarchy.
fn groups_of(pid: u32) -> Vec<PathBuf> {
    std::fs::read_dir(PIDS_ROOT)
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    // Only this version's prefix: a group of an older version
                    // (`openshell-sandbox-PID-...`, which nothing removes) may carry the same
                    // pid on a machine that ran one.
                    n.starts_with("openshell-owned-")
                        && n.split('-').nth(2) == Some(&pid.to_string())
                })
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// Remove what a supervisor whose containment failed had to leave behind (its groups could
/// not be emptied while the daemon lived), once the test has killed the daemon.
fn remove_groups_of(pid: u32) {
    let own_memory = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.split(':').nth(1) == Some("memory"))
                .and_then(|l| {
                    l.splitn(3, ':')
                        .nth(2)
                        .map(|p| p.trim_start_matches('/').to_string())
                })
        });
    let mut parents = vec![
        PathBuf::from(PIDS_ROOT),
        PathBuf::from("/sys/fs/cgroup/freezer"),
    ];
    if let Some(m) = own_memory {
        parents.push(Path::new("/sys/fs/cgroup/memory").join(m));
    }
    for parent in parents {
        let Ok(d) = std::fs::read_dir(&parent) else {
            continue;
        };
        for e in d.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with("openshell-owned-") && n.split('-').nth(2) == Some(&pid.to_string()) {
                wait_until(5, || {
                    if let Ok(kids) = std::fs::read_dir(e.path()) {
                        for k in kids.flatten() {
                            if k.file_type().is_ok_and(|t| t.is_dir()) {
                                let _ = std::fs::remove_dir(k.path());
                            }
                        }
                    }
                    std::fs::remove_dir(e.path()).is_ok()
                });
            }
        }
    }
}

/// Release `point` every time the supervisor reaches it, until `stop` is set.
fn auto_release(pause: &PauseDir, point: &'static str, stop: Arc<AtomicBool>) {
    let dir = pause.dir.path().to_path_buf();
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let go = dir.join(format!("{point}.go"));
            if !go.exists() {
                let _ = std::fs::write(&go, b"");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    });
}

fn sup_cmd(wd: &Workdir, report: &Path, extra: &[&str], cmd: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("run")
        .arg("--workdir")
        .arg(wd.path())
        .arg("--report-json")
        .arg(report)
        .args(extra)
        .arg("--")
        .args(cmd)
        .current_dir(wd.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn finish(child: Child, secs: u64) -> (i32, String) {
    let pid = child.id() as i32;
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    std::thread::spawn(move || {
        let end = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < end && !d2.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if !d2.load(Ordering::Relaxed) {
            kill(pid);
        }
    });
    let out = child
        .wait_with_output()
        .expect("waiting for the supervisor");
    done.store(true, Ordering::Relaxed);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn report(path: &Path) -> serde_json::Value {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null)
}

fn layer<'a>(report: &'a serde_json::Value, name: &str) -> &'a str {
    report["layers"]
        .as_array()
        .and_then(|ls| ls.iter().find(|l| l["layer"] == name))
        .and_then(|l| l["status"].as_str())
        .unwrap_or("")
}

/// `--pids` above PID_MAX_LIMIT is refused before anything is created, with an error naming
/// the kernel's maximum; before, the pids.max write failed with a raw EINVAL and left the
/// exec's group (and so the supervisor's base group) behind on every try.
#[test]
fn pids_above_pid_max_limit_is_refused_up_front_and_leaks_no_group() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let report_path = wd.path().join("r.json");
    let child = sup_cmd(&wd, &report_path, &["--pids", "4194305"], &["true"])
        .spawn()
        .unwrap();
    let pid = child.id();
    let (code, stderr) = finish(child, 60);
    let left = groups_of(pid);
    for g in &left {
        let _ = std::fs::remove_dir(g.join("exec-1"));
        let _ = std::fs::remove_dir(g);
    }
    assert_eq!(code, 125, "an invalid limit is a usage error: {stderr}");
    assert!(stderr.contains("4194304"), "{stderr}");
    assert!(left.is_empty(), "groups leaked: {left:?}");
    // The maximum itself is accepted by the kernel.
    let r = run(&wd, &["--pids", "4194304"], &["true"]);
    assert_eq!(r.code(), 0, "{}", r.stderr());
}

/// Without a memory cgroup (a non-root supervisor), `--memory` bounds each process's address
/// space only: SysV segments and memfds escape it. Asked for explicitly, that is degraded and
/// refused; not asked for, it is "not requested" and the run goes ahead.
#[test]
fn nonroot_memory_without_a_memory_cgroup_is_degraded() {
    use std::os::unix::process::CommandExt;
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let rp = wd.path().join("r.json");
    let go = |extra: &[&str]| {
        let mut c = sup_cmd(&wd, &rp, extra, &["true"]);
        c.uid(65534).gid(65534);
        let _ = std::fs::remove_file(&rp);
        let (code, stderr) = finish(c.spawn().unwrap(), 60);
        (code, stderr, report(&rp))
    };
    let (code, stderr, _) = go(&["--memory", "64MiB"]);
    assert_eq!(code, 125, "{stderr}");
    assert!(stderr.contains("memory"), "{stderr}");
    let (code, stderr, rep) = go(&["--memory", "64MiB", "--allow-degraded"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(layer(&rep, "memory"), "degraded", "{rep}");
    let (code, stderr, rep) = go(&[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(layer(&rep, "memory"), "not_requested", "{rep}");
}

/// Start a supervisor held before its first spawn; returns it and its base group.
fn held_supervisor(wd: &Workdir, pause: &PauseDir, report: &Path) -> (Child, PathBuf) {
    held_supervisor_with(wd, pause, report, &[])
}

fn held_supervisor_with(
    wd: &Workdir,
    pause: &PauseDir,
    report: &Path,
    extra: &[&str],
) -> (Child, PathBuf) {
    let mut c = sup_cmd(wd, report, extra, &["true"]);
    c.envs(pause.env("cgroup-take-exec"));
    let child = c.spawn().unwrap();
    assert!(
        pause.wait_reached("cgroup-take-exec", 60),
        "the supervisor never reached its first spawn"
    );
    let groups = groups_of(child.id());
    assert_eq!(groups.len(), 1, "{groups:?}");
    (child, groups[0].clone())
}

/// Another root process in the same parent cgroup (`check`, `run`) used to remove a live,
/// idle supervisor's base group because it was empty and older than a minute; the idle
/// supervisor's next spawn then failed for good. The base group is backdated here to stand
/// for "idle for an hour".
#[test]
fn check_and_run_leave_a_live_idle_supervisors_groups_alone() {
    if !require_root() || !require_pause_points() {
        return;
    }
    let wd = Workdir::new();
    let pause = PauseDir::new();
    let rp = wd.path().join("a.json");
    let (a, base) = held_supervisor(&wd, &pause, &rp);
    let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    let times = std::fs::FileTimes::new()
        .set_modified(hour_ago)
        .set_accessed(hour_ago);
    std::fs::File::open(&base)
        .and_then(|f| f.set_times(times))
        .unwrap();
    let check = Command::new(BIN).arg("check").output().unwrap();
    assert!(base.exists(), "`check` removed a live supervisor's group");
    let _ = check;
    let other = run(&Workdir::new(), &[], &["true"]);
    assert_eq!(other.code(), 0, "{}", other.stderr());
    assert!(base.exists(), "`run` removed a live supervisor's group");
    pause.release("cgroup-take-exec");
    let (code, stderr) = finish(a, 60);
    assert_eq!(code, 0, "the live supervisor could not spawn: {stderr}");
}

/// A group removed behind a live supervisor's back (by an older version, or by hand) is made
/// again at the next spawn, instead of failing every spawn from then on.
#[test]
fn a_supervisor_recreates_its_group_when_it_is_removed() {
    if !require_root() || !require_pause_points() {
        return;
    }
    let wd = Workdir::new();
    let pause = PauseDir::new();
    let rp = wd.path().join("a.json");
    let (a, base) = held_supervisor(&wd, &pause, &rp);
    std::fs::remove_dir(&base).expect("removing the idle supervisor's empty base group");
    pause.release("cgroup-take-exec");
    let (code, stderr) = finish(a, 60);
    assert_eq!(code, 0, "no spawn after the group was removed: {stderr}");
    assert!(!base.exists(), "base group left behind after the run");
}

/// The v1 hierarchies beside pids and freezer that a held supervisor (pid `pid`) has a group in.
fn limit_hierarchies_of(pid: u32) -> Vec<&'static str> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let parent = |ctrl: &str| {
        own.lines()
            .find(|l| l.split(':').nth(1) == Some(ctrl))
            .and_then(|l| l.splitn(3, ':').nth(2))
            .map(|p| {
                Path::new("/sys/fs/cgroup")
                    .join(ctrl)
                    .join(p.trim_start_matches('/'))
            })
    };
    ["memory", "cpuacct", "cpu"]
        .into_iter()
        .filter(|ctrl| {
            parent(ctrl)
                .and_then(|p| std::fs::read_dir(p).ok())
                .is_some_and(|d| {
                    d.flatten().any(|e| {
                        let n = e.file_name().to_string_lossy().into_owned();
                        n.starts_with("openshell-owned-")
                            && n.split('-').nth(2) == Some(&pid.to_string())
                    })
                })
        })
        .collect()
}

/// A run makes its cgroup root only where its limits need one: a memory group for --memory,
/// CPU groups for --cpu/--cpus (each costs a mkdir and an rmdir per run, and kernel teardown).
#[test]
fn a_run_makes_groups_only_in_the_hierarchies_its_limits_need() {
    if !require_root() || !require_pause_points() {
        return;
    }
    if std::fs::metadata("/sys/fs/cgroup/memory/memory.limit_in_bytes").is_err()
        && std::fs::read_to_string("/proc/self/cgroup").is_ok_and(|c| c.trim() == "0::/")
    {
        // Not a skip of the claim: on cgroup v2 one directory holds every controller.
        eprintln!("not applicable: cgroup v2 only, where a root is one directory");
        return;
    }
    for (extra, want) in [
        (&[][..], &[][..]),
        (&["--memory", "64M"][..], &["memory"][..]),
        (&["--cpu", "30"][..], &["cpuacct", "cpu"][..]),
    ] {
        let wd = Workdir::new();
        let pause = PauseDir::new();
        let rp = wd.path().join("r.json");
        let (child, _) = held_supervisor_with(&wd, &pause, &rp, extra);
        let made = limit_hierarchies_of(child.id());
        pause.release("cgroup-take-exec");
        let (code, stderr) = finish(child, 60);
        assert_eq!(code, 0, "{extra:?}: {stderr}");
        // cpu and cpuacct may be one co-mounted hierarchy: then only cpuacct is made.
        let want: Vec<&str> = want
            .iter()
            .copied()
            .filter(|c| *c != "cpu" || made.contains(&"cpu"))
            .collect();
        assert_eq!(made, want, "{extra:?}");
    }
}

/// The host pid of the process whose argv carries `mark` (pids inside a run are its own PID
/// namespace's, so the test finds its processes by a mark on their command line).
fn pid_by_mark(mark: &str) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        cmd.split(|&b| b == 0)
            .any(|a| a == mark.as_bytes())
            .then_some(pid)
    })
}

/// A SIGKILLed supervisor leaves nothing alive: its exec's PID namespace dies with the init
/// (PDEATHSIG), and a starting supervisor also kills the members of every group no live owner
/// holds, and only those: a live supervisor's running exec is untouched by the next `check`
/// and `run`.
#[test]
fn a_starting_supervisor_kills_what_a_killed_one_left_and_nothing_live() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let rp = wd.path().join("r.json");
    let tag = std::process::id();
    let (dmark, lmark) = (format!("1000.{tag}1"), format!("1000.{tag}2"));
    let script = format!("setsid sleep {dmark} </dev/null >/dev/null 2>&1 & exec sleep 1000");
    let dead = sup_cmd(&wd, &rp, &[], &["sh", "-c", &script])
        .spawn()
        .unwrap();
    // Runs with per-run uids need a workdir each (one is locked per run).
    let wd2 = Workdir::new();
    let rp2 = wd2.path().join("r2.json");
    let live = sup_cmd(&wd2, &rp2, &[], &["sleep", &lmark])
        .spawn()
        .unwrap();
    let mut daemon = None;
    let mut live_exec = None;
    wait_until(30, || {
        daemon = pid_by_mark(&dmark);
        live_exec = pid_by_mark(&lmark);
        daemon.is_some() && live_exec.is_some()
    });
    if daemon.is_none() || live_exec.is_none() {
        kill(dead.id() as i32);
        kill(live.id() as i32);
        let (c1, e1) = finish(dead, 30);
        let (c2, e2) = finish(live, 30);
        panic!(
            "the daemon ({daemon:?}) or the live exec ({live_exec:?}) never started: \
             first run {c1}: {e1}\nsecond run {c2}: {e2}"
        );
    }
    let (daemon, live_exec) = (daemon.unwrap(), live_exec.unwrap());
    kill(dead.id() as i32);
    let _ = finish(dead, 30);

    let check = Command::new(BIN).arg("check").output().unwrap();
    let _ = check;
    let r = run(&wd, &[], &["true"]);
    let gone = wait_until(5, || !alive(daemon));
    let live_ok = alive(live_exec);
    kill(daemon);
    let live_pid = live.id();
    kill(live_pid as i32);
    let _ = finish(live, 30);
    remove_groups_of(live_pid);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert!(gone, "the killed supervisor's daemon survived");
    assert!(live_ok, "a live supervisor's exec was killed");
}

/// When the sweep cannot read the exec's members (here: the supervisor's RLIMIT_NOFILE was
/// lowered at the start of the sweep, as a child of the same uid could with prlimit), the run
/// is not contained: exit 125, `contained: false` and the reason. Before, a failed read meant
/// "no processes", the run reported "all layers enforced" and the daemon lived on.
#[test]
fn a_sweep_that_cannot_read_the_cgroup_fails_closed() {
    if !require_root() || !require_pause_points() {
        return;
    }
    let wd = Workdir::new();
    let pause = PauseDir::new();
    let daemon_file = wd.path().join("daemon.pid");
    let rp = wd.path().join("r.json");
    let script = format!(
        "setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > {}",
        daemon_file.display()
    );
    // With its own PID namespace an exec is killed with its init and never swept by pid; the
    // sweep runs where that namespace is degraded, so that is where this test holds it.
    let mut c = sup_cmd(&wd, &rp, &["--allow-degraded"], &["sh", "-c", &script]);
    c.envs(pause.env("tree-sweep"))
        .env("OSB_TEST_DENY_PIDNS", "1");
    let child = c.spawn().unwrap();
    let sup = child.id();
    let reached = pause.wait_reached("tree-sweep", 60);
    let daemon = read_pid(&daemon_file, 10).unwrap_or(-1);
    if reached {
        let mut lim = libc::rlimit64 {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: prlimit64 on the supervisor: first a pure read into `lim`, then the new soft
        // limit with the hard limit unchanged.
        let rc = unsafe {
            libc::prlimit64(
                sup as libc::pid_t,
                libc::RLIMIT_NOFILE,
                std::ptr::null(),
                &mut lim,
            );
            // Soft limit 0: every new descriptor fails with EMFILE, whichever the supervisor
            // closes meanwhile (the lowest free fd of a moment ago could be reused).
            lim.rlim_cur = 0;
            libc::prlimit64(
                sup as libc::pid_t,
                libc::RLIMIT_NOFILE,
                &lim,
                std::ptr::null_mut(),
            )
        };
        assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
    }
    let stop = Arc::new(AtomicBool::new(false));
    auto_release(&pause, "tree-sweep", stop.clone());
    let (code, stderr) = finish(child, 60);
    stop.store(true, Ordering::Relaxed);
    kill(daemon);
    remove_groups_of(sup);
    assert!(reached, "the supervisor never reached the sweep");
    assert!(daemon > 0, "the daemon never started");
    assert_eq!(code, 125, "{stderr}");
    let rep = report(&rp);
    assert_eq!(rep["contained"], false, "{rep}\n{stderr}");
    let why = rep["containment_error"].as_str().unwrap_or("");
    assert!(why.contains("cgroup"), "{rep}");
    assert!(
        why.contains(&std::io::Error::from_raw_os_error(libc::EMFILE).to_string()),
        "{rep}"
    );
    assert!(stderr.contains("CONTAINMENT FAILED"), "{stderr}");
}

/// The in-namespace pids of `tool args` run inside the PID and mount namespace of `ns_pid`.
fn nsenter(ns_pid: i32, script: &str) -> Command {
    let mut c = Command::new("nsenter");
    c.arg("-t")
        .arg(ns_pid.to_string())
        .args(["-p", "-m", "--", "sh", "-c", script]);
    c
}

fn ns_alive(ns_pid: i32, pid: i32) -> bool {
    nsenter(ns_pid, &format!("test -e /proc/{pid}"))
        .status()
        .is_ok_and(|s| s.success())
}

fn first_child(pid: i32) -> Option<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The sweep reads the exec's members, then kills them. If one of them exits and is reaped in
/// between and its pid is handed to a new process, a pid-by-pid kill hits that process. The
/// test forces exactly that with `ns_last_pid` in a private PID namespace, at a pause point
/// between the read and the kill. With the group frozen (v1) or killed by `cgroup.kill`
/// (v2), the member cannot exit in between, so its pid cannot be reused.
#[test]
fn the_kill_sweep_never_hits_a_recycled_pid() {
    if !require_root()
        || !require_pause_points()
        || !require(which("unshare") && which("nsenter"), "unshare and nsenter")
    {
        return;
    }
    let wd = Workdir::new();
    let pause = PauseDir::new();
    let daemon_file = wd.path().join("daemon.pid");
    let rp = wd.path().join("r.json");
    let script = format!(
        "setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > {}",
        daemon_file.display()
    );
    // pid 1 of the namespace is a shell that outlives the supervisor, so that the namespace
    // (and the victim) survive the supervisor's own exit until the test has looked.
    let mut c = Command::new("unshare");
    c.args(["--pid", "--fork", "--mount-proc", "--", "sh", "-c"])
        .arg(r#""$@"; echo "rc=$?"; exec sleep 1000"#)
        .arg("sh")
        .arg(BIN)
        .arg("run")
        .arg("--workdir")
        .arg(wd.path())
        .arg("--report-json")
        .arg(&rp)
        // The pid sweep runs only where the exec's own PID namespace is degraded.
        .arg("--allow-degraded")
        .args(["--", "sh", "-c", &script])
        .envs(pause.env("tree-members-read"))
        .env("OSB_TEST_DENY_PIDNS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut ns = c.spawn().unwrap();
    let mut ns_out = BufReader::new(ns.stdout.take().unwrap());
    let mut victim: Option<Child> = None;
    let outcome = (|| {
        if !pause.wait_reached("tree-members-read", 60) {
            return Err("the supervisor never reached the sweep".to_string());
        }
        let init = first_child(ns.id() as i32).ok_or("no pid 1 in the namespace")?;
        let daemon = read_pid(&daemon_file, 10).ok_or("the daemon never started")?;
        // Kill the member the sweep just read; the supervisor (a subreaper) reaps it at once
        // unless the group is frozen.
        let _ = nsenter(init, &format!("kill -9 {daemon}")).status();
        wait_until(2, || !ns_alive(init, daemon));
        // The next pid handed out in the namespace is the daemon's.
        let mut v = nsenter(
            init,
            &format!(
                "echo {} > /proc/sys/kernel/ns_last_pid; sleep 1000 & echo $!; wait",
                daemon - 1
            ),
        );
        v.stdout(Stdio::piped());
        let mut vc = v.spawn().map_err(|e| e.to_string())?;
        let mut line = String::new();
        BufReader::new(vc.stdout.take().unwrap())
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        victim = Some(vc);
        let vpid: i32 = line.trim().parse().map_err(|_| format!("victim: {line}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        auto_release(&pause, "tree-members-read", stop.clone());
        let mut rc = String::new();
        let _ = ns_out.read_line(&mut rc);
        stop.store(true, Ordering::Relaxed);
        let victim_alive = ns_alive(init, vpid);
        Ok((vpid == daemon, victim_alive, rc))
    })();
    // pid 1 first: unshare does not pass SIGKILL on, and the namespace dies with its init.
    if let Some(init) = first_child(ns.id() as i32) {
        kill(init);
    }
    kill(ns.id() as i32);
    let _ = ns.wait();
    if let Some(mut v) = victim {
        let _ = v.kill();
        let _ = v.wait();
    }
    let (reused, victim_alive, rc) = outcome.unwrap();
    assert!(
        victim_alive,
        "the sweep killed an outside process (its pid was recycled: {reused})"
    );
    assert_eq!(rc.trim(), "rc=0", "report: {}", report(&rp));
    assert_eq!(report(&rp)["contained"], true);
}
