//! cgroup layer (when the supervisor may create cgroups): one cgroup per exec, so that
//! - pids.max contains a fork bomb even when the target uid is 0, where RLIMIT_NPROC is not
//!   enforced;
//! - memory.max bounds resident memory, not just address space;
//! - "kill the whole tree" reaches every descendant, daemonised ones included.
//!
//! cgroup v2 is used when the supervisor's own cgroup is writable and offers the pids
//! controller; otherwise the v1 pids (and memory) hierarchies. With neither, the caller falls
//! back to process groups plus the subreaper sweep, and reports the layer as unavailable.

use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::policy::Limits;

#[derive(Debug, Clone)]
enum Layout {
    V2 {
        base: PathBuf,
    },
    V1 {
        pids: PathBuf,
        memory: Option<PathBuf>,
    },
}

/// Where this supervisor creates per-exec cgroups. Removed again on drop.
#[derive(Debug)]
pub struct Root {
    layout: Layout,
    /// One exec group made ahead of time (see [`Root::take_exec`]).
    spare: std::sync::Mutex<Option<ExecCgroup>>,
}

impl Root {
    /// The group for the next exec: the one made ahead of time when there is one, else a new
    /// one. Making a group (mkdir, limits, opening the join file) costs 0.15-0.25 ms here;
    /// [`Root::make_spare`], called once the child is running, keeps that off the spawn path.
    pub fn take_exec(&self, limits: &Limits) -> io::Result<ExecCgroup> {
        let spare = self.spare.lock().unwrap_or_else(|p| p.into_inner()).take();
        match spare {
            Some(cg) => Ok(cg),
            None => ExecCgroup::create(self, limits),
        }
    }

    /// Make the next exec's group now, if none is waiting. A failure is not an error here: the
    /// next spawn tries again and reports it.
    pub fn make_spare(&self, limits: &Limits) {
        let mut spare = self.spare.lock().unwrap_or_else(|p| p.into_inner());
        if spare.is_none() {
            *spare = ExecCgroup::create(self, limits).ok();
        }
    }

    pub fn describe(&self) -> String {
        match &self.layout {
            Layout::V2 { base } => format!("cgroup v2 at {}", base.display()),
            Layout::V1 { pids, memory } => format!(
                "cgroup v1 pids at {}{}",
                pids.display(),
                memory
                    .as_ref()
                    .map(|m| format!(", memory at {}", m.display()))
                    .unwrap_or_default()
            ),
        }
    }

    pub fn has_memory(&self) -> bool {
        match &self.layout {
            Layout::V2 { .. } => true,
            Layout::V1 { memory, .. } => memory.is_some(),
        }
    }
}

fn own_path(controller: &str) -> Option<PathBuf> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_id, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        let matches = if controller.is_empty() {
            ctrls.is_empty()
        } else {
            ctrls.split(',').any(|c| c == controller)
        };
        if matches {
            return Some(PathBuf::from(path.trim_start_matches('/')));
        }
    }
    None
}

/// Find a place to create per-exec cgroups, creating our own parent group there.
pub fn detect() -> Option<Root> {
    // Unique per Root: two sandboxes in one process must not share (and remove) one group,
    // and the pid alone is not unique: it is 1 for every supervisor that is PID 1 of a pod.
    static ROOTS: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "{PREFIX}{}-{}-{:08x}",
        std::process::id(),
        ROOTS.fetch_add(1, Ordering::Relaxed),
        rand::random::<u32>()
    );
    // cgroup v2 (unified only): needs the pids controller delegated to our cgroup.
    if let Some(own) = own_path("") {
        let mount = Path::new("/sys/fs/cgroup");
        if mount.join("cgroup.controllers").exists() {
            let cur = mount.join(&own);
            if let Some(base) = setup_v2(&cur, &name) {
                return Some(Root {
                    layout: Layout::V2 { base },
                    spare: Default::default(),
                });
            }
        }
    }
    let pids_parent = own_path("pids").map(|p| Path::new("/sys/fs/cgroup/pids").join(p))?;
    remove_stale(&pids_parent);
    let pids = pids_parent.join(&name);
    fs::create_dir_all(&pids).ok()?;
    let memory = own_path("memory")
        .map(|p| Path::new("/sys/fs/cgroup/memory").join(p))
        .inspect(|parent| remove_stale(parent))
        .map(|parent| parent.join(&name))
        .filter(|m| fs::create_dir_all(m).is_ok());
    Some(Root {
        layout: Layout::V1 { pids, memory },
        spare: Default::default(),
    })
}

const PREFIX: &str = "openshell-sandbox-";

/// Remove groups that supervisors killed without cleaning up left behind. Only empty groups
/// can be removed (rmdir fails with EBUSY while a group holds processes or children), so a
/// live supervisor's groups are safe; groups younger than a minute are skipped so a supervisor
/// that is just starting is never raced.
fn remove_stale(parent: &Path) {
    let Ok(dir) = fs::read_dir(parent) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().starts_with(PREFIX) {
            continue;
        }
        let path = e.path();
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > std::time::Duration::from_secs(60));
        if !old {
            continue;
        }
        if let Ok(children) = fs::read_dir(&path) {
            for c in children.flatten() {
                if c.file_type().is_ok_and(|t| t.is_dir()) {
                    let _ = fs::remove_dir(c.path());
                }
            }
        }
        let _ = fs::remove_dir(&path);
    }
}

/// v2's "no internal processes" rule: a cgroup that hands controllers to its children may not
/// hold processes itself. Move the supervisor into a leaf, then enable pids and memory below.
fn setup_v2(cur: &Path, name: &str) -> Option<PathBuf> {
    let ctrls = fs::read_to_string(cur.join("cgroup.controllers")).ok()?;
    if !ctrls.split_whitespace().any(|c| c == "pids") {
        return None;
    }
    let leaf = cur.join("openshell-supervisor");
    fs::create_dir_all(&leaf).ok()?;
    fs::write(leaf.join("cgroup.procs"), std::process::id().to_string()).ok()?;
    let want: Vec<&str> = ["+pids", "+memory"]
        .into_iter()
        .filter(|c| ctrls.split_whitespace().any(|x| x == &c[1..]))
        .collect();
    fs::write(cur.join("cgroup.subtree_control"), want.join(" ")).ok()?;
    remove_stale(cur);
    let base = cur.join(name);
    fs::create_dir_all(&base).ok()?;
    fs::write(base.join("cgroup.subtree_control"), want.join(" ")).ok()?;
    Some(base)
}

static NEXT: AtomicU64 = AtomicU64::new(1);

/// The cgroup(s) of one exec. The child joins them by writing "0" to the open `tasks` (v1) or
/// `cgroup.procs` (v2) descriptors, a single write(2) each, before it drops privileges.
#[derive(Debug)]
pub struct ExecCgroup {
    dirs: Vec<PathBuf>,
    procs: Vec<OwnedFd>,
}

impl ExecCgroup {
    pub fn create(root: &Root, limits: &Limits) -> io::Result<ExecCgroup> {
        let name = format!("exec-{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let mut dirs = Vec::new();
        match &root.layout {
            Layout::V2 { base } => {
                let d = base.join(&name);
                fs::create_dir(&d)?;
                write_file(&d.join("pids.max"), &limits.pids.to_string())?;
                if let Some(m) = limits.memory_bytes {
                    write_file(&d.join("memory.max"), &m.to_string())?;
                    // Without this, a memory bomb pushes the rest of the pod into swap first.
                    let _ = write_file(&d.join("memory.swap.max"), "0");
                }
                dirs.push(d);
            }
            Layout::V1 { pids, memory } => {
                let d = pids.join(&name);
                fs::create_dir(&d)?;
                write_file(&d.join("pids.max"), &limits.pids.to_string())?;
                dirs.push(d);
                if let (Some(mroot), Some(m)) = (memory, limits.memory_bytes) {
                    let md = mroot.join(&name);
                    fs::create_dir(&md)?;
                    write_file(&md.join("memory.limit_in_bytes"), &m.to_string())?;
                    dirs.push(md);
                }
            }
        }
        // Which file the child writes "0" to. Moving a whole thread group (cgroup.procs) takes
        // the kernel's global cgroup_threadgroup_rwsem for writing, which waits for an RCU
        // grace period: 0.1 ms when the system is quiet, 10 ms and more on a busy one, on every
        // exec. Moving only the calling thread ("0" in v1's `tasks`) skips that lock
        // (cgroup_procs_write_start: no pid and no threadgroup). The child is single-threaded
        // when it joins (fork copies one thread), so moving its thread moves the process.
        // v2 has no such file for non-threaded groups; there cgroup.procs it is.
        let join_file = match &root.layout {
            Layout::V1 { .. } => "tasks",
            Layout::V2 { .. } => "cgroup.procs",
        };
        let procs = dirs
            .iter()
            .map(|d| {
                fs::OpenOptions::new()
                    .write(true)
                    .open(d.join(join_file))
                    .map(OwnedFd::from)
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(ExecCgroup { dirs, procs })
    }

    /// Child side: join. Async-signal-safe.
    pub fn join(&self) -> Result<(), i32> {
        for fd in &self.procs {
            // SAFETY: writing two bytes from a static buffer to an fd we own.
            let rc = unsafe { libc::write(fd.as_raw_fd(), b"0\n".as_ptr().cast(), 2) };
            if rc < 0 {
                return Err(crate::sandbox::errno());
            }
        }
        Ok(())
    }

    /// Pids currently in the exec's cgroup.
    pub fn members(&self) -> Vec<i32> {
        fs::read_to_string(self.dirs[0].join("cgroup.procs"))
            .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Whether the memory controller recorded hitting the limit (an OOM kill is likely).
    pub fn hit_memory_limit(&self) -> bool {
        for d in &self.dirs {
            if let Ok(ev) = fs::read_to_string(d.join("memory.events")) {
                return ev.lines().any(|l| {
                    let mut it = l.split_whitespace();
                    matches!((it.next(), it.next()), (Some("oom_kill" | "max"), Some(n)) if n != "0")
                });
            }
            if let Ok(n) = fs::read_to_string(d.join("memory.failcnt")) {
                return n.trim() != "0";
            }
        }
        false
    }

    /// Signal every member; returns how many were signalled.
    pub fn signal_all(&self, sig: i32) -> usize {
        let m = self.members();
        for &pid in &m {
            // SAFETY: kill with integer arguments.
            unsafe { libc::kill(pid, sig) };
        }
        m.len()
    }
}

impl Drop for ExecCgroup {
    fn drop(&mut self) {
        // Only empty cgroups can be removed; the caller kills and reaps the tree first. A
        // straggler (still exiting) makes rmdir fail with EBUSY: retry briefly, then leave it.
        for d in &self.dirs {
            for _ in 0..50 {
                match fs::remove_dir(d) {
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        std::thread::sleep(std::time::Duration::from_millis(2))
                    }
                    _ => break,
                }
            }
        }
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        // The spare group lives inside ours: remove it first.
        drop(self.spare.lock().unwrap_or_else(|p| p.into_inner()).take());
        match &self.layout {
            Layout::V2 { base } => {
                let _ = fs::remove_dir(base);
            }
            Layout::V1 { pids, memory } => {
                let _ = fs::remove_dir(pids);
                if let Some(m) = memory {
                    let _ = fs::remove_dir(m);
                }
            }
        }
    }
}

fn write_file(path: &Path, value: &str) -> io::Result<()> {
    let mut f = fs::OpenOptions::new().write(true).open(path)?;
    f.write_all(value.as_bytes())
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}
