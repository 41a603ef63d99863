//! A supervisor removes the cgroups that dead supervisors left beside its own, and only those,
//! through the real binary: a group whose ownership lock anyone can take is emptied (its
//! members killed) and removed; a locked one (a live owner) is kept. `run` does it once its
//! command is running, or, when the command never started, as it ends.

mod support;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use support::{BIN, Workdir, require, require_root, run, wait_until};

/// Where a supervisor started by this test makes its base group in the pids hierarchy (the
/// test's own pids group on v1, its v2 group on v2), and the file that moves a process there.
fn pids_parent() -> Option<(PathBuf, &'static str)> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let own = |want: &dyn Fn(&str) -> bool| {
        text.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
            want(ctrls).then(|| path.trim_start_matches('/').to_string())
        })
    };
    if let Some(p) = own(&|c| c.split(',').any(|c| c == "pids")) {
        let dir = PathBuf::from("/sys/fs/cgroup/pids").join(p);
        return dir.is_dir().then_some((dir, "cgroup.procs"));
    }
    let p = own(&|c| c.is_empty())?;
    let dir = PathBuf::from("/sys/fs/cgroup").join(p);
    dir.join("cgroup.controllers")
        .exists()
        .then_some((dir, "cgroup.procs"))
}

/// A group named as a supervisor's, with a `sleep` in its exec group; `locked` holds its
/// ownership lock (as a live supervisor does) for as long as the returned file lives.
struct Planted {
    dir: PathBuf,
    sleeper: Child,
    lock: Option<File>,
}

fn plant(parent: &std::path::Path, join: &str, tag: &str, locked: bool) -> Planted {
    // A pid no live process has (above pid_max's ceiling), so the name points at no one.
    let dir = parent.join(format!(
        "openshell-owned-4194399-{tag}-{:08x}",
        std::process::id()
    ));
    let exec = dir.join("exec-1");
    std::fs::create_dir_all(&exec).unwrap();
    let lock = locked.then(|| {
        let f = File::open(&dir).unwrap();
        // SAFETY: flock on an fd we own.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(
            rc,
            0,
            "{}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        );
        f
    });
    let sleeper = Command::new("sleep")
        .arg("1000")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    std::fs::write(exec.join(join), sleeper.id().to_string()).unwrap();
    Planted { dir, sleeper, lock }
}

impl Planted {
    /// Whether its sleep was killed (and is now reaped), waiting up to `secs`.
    fn killed(&mut self, secs: u64) -> bool {
        let child = &mut self.sleeper;
        wait_until(secs, || child.try_wait().is_ok_and(|s| s.is_some()))
    }
}

impl Drop for Planted {
    fn drop(&mut self) {
        let _ = self.sleeper.kill();
        let _ = self.sleeper.wait();
        let _ = wait_until(5, || {
            let _ = std::fs::remove_dir(self.dir.join("exec-1"));
            std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists()
        });
        drop(self.lock.take());
    }
}

fn setup() -> Option<(PathBuf, &'static str)> {
    if !require_root() {
        return None;
    }
    let parent = pids_parent();
    require(
        parent.is_some(),
        "a pids cgroup hierarchy (v1 pids, or v2) for this test's process",
    )
    .then_some(parent?)
}

/// The group of a dead owner is emptied and removed by a run, and after its command started
/// (the timeline's `stale-sweep` comes after `spawned`); the group of a live owner, its member
/// included, is untouched.
#[test]
fn a_run_removes_a_dead_supervisors_group_and_keeps_a_live_ones() {
    let Some((parent, join)) = setup() else {
        return;
    };
    let mut dead = plant(&parent, join, "dead", false);
    let mut live = plant(&parent, join, "live", true);
    let wd = Workdir::new();
    let out = Command::new(BIN)
        .args(["run", "-q", "--workdir"])
        .arg(wd.path())
        .args(["--", "/bin/true"])
        .env("OSB_RUN_TIMELINE", "1")
        .current_dir(wd.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(dead.killed(5), "the dead owner's member survived the run");
    assert!(!dead.dir.exists(), "the dead owner's group is still there");
    assert!(live.dir.is_dir(), "a live owner's group was removed");
    assert!(!live.killed(0), "a live owner's member was killed");
    let stamps: Vec<&str> = err
        .lines()
        .find_map(|l| l.strip_prefix("osb-timeline "))
        .expect("the timeline")
        .split_whitespace()
        .map(|kv| kv.split('=').next().unwrap())
        .collect();
    let at = |s: &str| stamps.iter().position(|x| *x == s);
    assert!(
        at("spawned").is_some() && at("spawned") < at("stale-sweep"),
        "the sweep ran before the command: {stamps:?}"
    );
}

/// A run whose command could not be started (127) still removes a dead owner's group, as it
/// ends, and still keeps a live one's.
#[test]
fn a_run_whose_command_never_started_still_sweeps() {
    let Some((parent, join)) = setup() else {
        return;
    };
    let mut dead = plant(&parent, join, "dead2", false);
    let mut live = plant(&parent, join, "live2", true);
    let wd = Workdir::new();
    let r = run(&wd, &["-q"], &["/nonexistent/osb-no-such-command"]);
    assert_eq!(r.code(), 127, "{}", r.stderr());
    assert!(dead.killed(5), "the dead owner's member survived the run");
    assert!(!dead.dir.exists(), "the dead owner's group is still there");
    assert!(live.dir.is_dir(), "a live owner's group was removed");
    assert!(!live.killed(0), "a live owner's member was killed");
}
