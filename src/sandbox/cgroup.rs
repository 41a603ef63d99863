//! cgroup layer (when the supervisor may create cgroups): one cgroup per exec, so that
//! - pids.max contains a fork bomb even when the target uid is 0, where RLIMIT_NPROC is not
//!   enforced;
//! - memory.max bounds resident memory, not just address space (only when a memory
//!   controller is really there: [`Root::memory`] says so, decided when the root is made);
//! - "kill the whole tree" reaches every descendant, daemonised ones included, without ever
//!   signalling a recycled pid (`cgroup.kill` on v2; on v1 the group is frozen first).
//!
//! cgroup v2 is used when the supervisor's own cgroup is writable and offers the pids
//! controller; otherwise the v1 pids (and memory, and freezer) hierarchies. With neither, the
//! caller falls back to process groups plus the subreaper sweep, and reports the layer as
//! unavailable.
//!
//! Ownership. Every base group a supervisor makes is named `openshell-owned-...` (not
//! `openshell-sandbox-...`: older versions remove any empty group of that prefix older than a
//! minute, a live idle supervisor's included, and must not see ours) and
//! carries an exclusive flock on its directory, held for the supervisor's life. A group whose
//! lock anyone can take has no live owner: its supervisor was SIGKILLed. A supervisor kills the
//! members of such groups and removes them (never by age: an idle supervisor's empty groups are
//! as live as a busy one's), once per root, after its first exec is running
//! ([`Root::sweep_stale`]): that cleanup need not hold up the command, which runs beside it
//! instead. A root that never got that far sweeps when dropped. `check` only looks ([`probe`]).
//! Groups of older versions carry no lock, so nothing can prove them dead: they are left alone.

use std::fs::{self, File};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::policy::Limits;

#[derive(Debug, Clone)]
enum Layout {
    V2 {
        base: PathBuf,
        memory: bool,
    },
    V1 {
        pids: PathBuf,
        memory: Option<PathBuf>,
        freezer: Option<PathBuf>,
        /// The cpuacct hierarchy (whole-tree CPU time).
        cpuacct: Option<PathBuf>,
        /// The cpu hierarchy (CFS quota), when it is not the same directory as `cpuacct`.
        cpu: Option<PathBuf>,
    },
}

/// Where this supervisor creates per-exec cgroups. Removed again on drop.
#[derive(Debug)]
pub struct Root {
    layout: Layout,
    /// Why there is no memory controller, when there is none.
    no_memory: Option<String>,
    /// The ownership locks, one per base directory (see the module docs). Replaced when a
    /// base directory has to be made again.
    locks: Mutex<Vec<(PathBuf, File)>>,
    /// One exec group made ahead of time (see [`Root::take_exec`]).
    spare: Mutex<Option<ExecCgroup>>,
    /// Whether a group is made ahead for a next exec. A one-command `run` has no next exec:
    /// it turns this off ([`Root::one_exec_only`]) and saves a mkdir and rmdir per hierarchy.
    spare_wanted: AtomicBool,
    /// The parents still to be swept of dead supervisors' groups (with whether each is the
    /// freezer hierarchy), until [`Root::sweep_stale`] takes them.
    stale: Mutex<Vec<(PathBuf, bool)>>,
}

mod cpu;
mod group;
mod owner;
mod system;
use owner::{own_dir, sweep_stale};
pub use system::{CgroupError, System};
use system::{PREFIX, counter, remove_base, remove_dir_retrying, v2_controllers, write_file};
mod probe;
use cpu::CpuWatch;
pub use cpu::{CPU_KILL_AFTER, CPU_POLL, CpuMeter};
use group::{Group, Kill};
pub use probe::{CpuSupport, Offer, probe};
use probe::{no_memory_v1, no_memory_v2};

/// Find a place to create per-exec cgroups, creating our own base group there. The groups of
/// dead supervisors beside it are removed later, by [`Root::sweep_stale`].
pub fn detect() -> Option<Root> {
    detect_in(&System::real()?, Want::ALL)
}

/// Which v1 hierarchies besides pids and freezer a root is made in. A policy's limits are
/// fixed for the life of its sandbox (a new policy revision prepares a new one), so a root
/// needs a memory group only for `--memory` and CPU groups only for `--cpu`/`--cpus`: the
/// three cost ~0.18 ms of mkdir and rmdir per `run` here, plus the kernel's deferred teardown.
/// (v2 has one directory for every controller.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Want {
    pub memory: bool,
    pub cpu: bool,
}

impl Want {
    pub const ALL: Want = Want {
        memory: true,
        cpu: true,
    };

    pub fn for_limits(limits: &crate::policy::Limits) -> Want {
        Want {
            memory: limits.memory_bytes.is_some(),
            cpu: limits.cpu_secs.is_some() || limits.cpu_quota_millis.is_some(),
        }
    }
}

/// [`detect`] on a given system (a fake tree in unit tests), for `want`.
pub fn detect_in(sys: &System, want: Want) -> Option<Root> {
    // Unique per Root: two sandboxes in one process must not share (and remove) one group,
    // and the pid alone is not unique: it is 1 for every supervisor that is PID 1 of a pod.
    static ROOTS: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "{PREFIX}{}-{}-{:08x}",
        std::process::id(),
        ROOTS.fetch_add(1, Ordering::Relaxed),
        crate::sys::random_u64() as u32
    );
    // cgroup v2 (unified only): needs the pids controller delegated to our cgroup.
    if sys.is_v2()
        && let Some(own) = sys.own_path("")
        && let Some((base, memory, lock)) = setup_v2(&sys.hierarchy("").join(own), &name)
    {
        let parent = base.parent().unwrap_or(&base).to_path_buf();
        return Some(Root {
            no_memory: (!memory).then(|| no_memory_v2(&parent)),
            locks: Mutex::new(vec![(base.clone(), lock)]),
            layout: Layout::V2 { base, memory },
            spare: Default::default(),
            spare_wanted: AtomicBool::new(true),
            stale: Mutex::new(vec![(parent, false)]),
        });
    }
    let pids_parent = sys.v1_parent("pids")?;
    let freezer_parent = sys.v1_parent("freezer");
    let memory_parent = sys.v1_parent("memory");
    let cpuacct_parent = sys.v1_parent_id("cpuacct");
    // Co-mounted (cpu,cpuacct): one directory serves both.
    let cpu_parent = sys
        .v1_parent_id("cpu")
        .filter(|(_, c)| cpuacct_parent.as_ref().is_none_or(|(_, a)| a != c))
        .map(|(p, _)| p);
    let cpuacct_parent = cpuacct_parent.map(|(p, _)| p);
    // The freezer first: there the stale groups' members are killed without a pid race.
    let stale = [
        freezer_parent.clone().map(|f| (f, true)),
        Some((pids_parent.clone(), false)),
        memory_parent.clone().map(|m| (m, false)),
        cpuacct_parent.clone().map(|m| (m, false)),
        cpu_parent.clone().map(|m| (m, false)),
    ]
    .into_iter()
    .flatten()
    .collect();
    let pids = pids_parent.join(&name);
    let mut locks = vec![(pids.clone(), own_dir(&pids).ok()?)];
    let mut own = |parent: Option<PathBuf>, needs: Option<&str>| {
        let dir = parent?.join(&name);
        let lock = own_dir(&dir).ok()?;
        // The limit file must be there: a hierarchy without it cannot bound anything.
        if needs.is_some_and(|f| !dir.join(f).exists()) {
            let _ = fs::remove_dir(&dir);
            return None;
        }
        locks.push((dir.clone(), lock));
        Some(dir)
    };
    let freezer = own(freezer_parent, Some("freezer.state"));
    let memory = own(
        memory_parent.filter(|_| want.memory),
        Some("memory.limit_in_bytes"),
    );
    let cpuacct = own(cpuacct_parent.filter(|_| want.cpu), Some("cpuacct.usage"));
    let cpu = own(cpu_parent.filter(|_| want.cpu), Some("cpu.cfs_quota_us"));
    Some(Root {
        no_memory: memory.is_none().then(no_memory_v1),
        layout: Layout::V1 {
            pids,
            memory,
            freezer,
            cpuacct,
            cpu,
        },
        locks: Mutex::new(locks),
        spare: Default::default(),
        spare_wanted: AtomicBool::new(true),
        stale: Mutex::new(stale),
    })
}

/// v2's "no internal processes" rule: a cgroup that hands controllers to its children may not
/// hold processes itself. Move the supervisor into a leaf, then enable pids and memory below.
/// Returns the base, whether memory.max is really available in its children, and its lock.
fn setup_v2(cur: &Path, name: &str) -> Option<(PathBuf, bool, File)> {
    let ctrls = v2_controllers(cur)?;
    if !ctrls.iter().any(|c| c == "pids") {
        return None;
    }
    let leaf = cur.join("openshell-supervisor");
    fs::create_dir_all(&leaf).ok()?;
    fs::write(leaf.join("cgroup.procs"), std::process::id().to_string()).ok()?;
    let want: Vec<&str> = ["+pids", "+memory"]
        .into_iter()
        .filter(|c| ctrls.iter().any(|x| x == &c[1..]))
        .collect();
    fs::write(cur.join("cgroup.subtree_control"), want.join(" ")).ok()?;
    let base = cur.join(name);
    let lock = own_dir(&base).ok()?;
    fs::write(base.join("cgroup.subtree_control"), want.join(" ")).ok()?;
    // The cpu controller (cpu.max for --cpus) on its own and best effort: the kernel refuses
    // it while a realtime thread is in the subtree, and that must not cost us pids and memory.
    // Whether it took is read back by Root::cpu.
    if ctrls.iter().any(|c| c == "cpu") {
        let _ = fs::write(cur.join("cgroup.subtree_control"), "+cpu")
            .and_then(|()| fs::write(base.join("cgroup.subtree_control"), "+cpu"));
    }
    // What the kernel really enabled, not what we asked for. (The kernel lists bare names; a
    // fake tree in the unit tests echoes the request, hence the '+'.)
    let memory = fs::read_to_string(base.join("cgroup.subtree_control")).is_ok_and(|s| {
        s.split_whitespace()
            .any(|c| c.trim_start_matches('+') == "memory")
    });
    Some((base, memory, lock))
}

/// Whether `base`'s children get the v2 cpu controller (cpu.max).
fn v2_has(base: &Path, ctrl: &str) -> bool {
    fs::read_to_string(base.join("cgroup.subtree_control")).is_ok_and(|s| {
        s.split_whitespace()
            .any(|c| c.trim_start_matches('+') == ctrl)
    })
}

impl Root {
    /// The group for the next exec: the one made ahead of time when it is still there, else a
    /// new one. Making a group (mkdir, limits, opening the join file) costs 0.15-0.25 ms here;
    /// [`Root::make_spare`], called once the child is running, keeps that off the spawn path.
    pub fn take_exec(&self, limits: &Limits) -> Result<ExecCgroup, CgroupError> {
        crate::pause::point("cgroup-take-exec");
        let spare = self.spare.lock().unwrap_or_else(|p| p.into_inner()).take();
        // A spare removed behind our back would fail the child's join with ENODEV.
        let mut cg = match spare {
            Some(cg) if cg.dirs.iter().all(|d| d.is_dir()) => cg,
            _ => match ExecCgroup::create(self, limits) {
                Err(CgroupError::Create { source, .. })
                    if source.kind() == io::ErrorKind::NotFound =>
                {
                    // Our base group is gone: make it again and retry once.
                    self.restore_bases()?;
                    ExecCgroup::create(self, limits)?
                }
                r => r?,
            },
        };
        // Only a group handed to an exec is watched: the spare would be polled for nothing.
        if let (Some(secs), Some(meter)) = (limits.cpu_secs, cg.cpu_meter.clone()) {
            let w = CpuWatch::start(meter, cg.group.clone(), Duration::from_secs(secs)).map_err(
                |source| CgroupError::Create {
                    path: cg.pids_dir.clone(),
                    source,
                },
            )?;
            cg.cpu_watch = Some(w);
        }
        Ok(cg)
    }

    /// Make the next exec's group now, if none is waiting. A failure is not an error here: the
    /// next spawn tries again and reports it.
    pub fn make_spare(&self, limits: &Limits) {
        self.sweep_stale();
        if !self.spare_wanted.load(Ordering::Relaxed) {
            return;
        }
        let mut spare = self.spare.lock().unwrap_or_else(|p| p.into_inner());
        if spare.is_none() {
            *spare = ExecCgroup::create(self, limits).ok();
        }
    }

    /// Kill the members of, and remove, the groups beside ours that no live supervisor owns
    /// (see the module docs); the first call does, later ones find nothing left to do. Called
    /// once an exec is running (its cost then overlaps the command's), and on drop.
    pub fn sweep_stale(&self) {
        let parents = std::mem::take(&mut *self.stale.lock().unwrap_or_else(|p| p.into_inner()));
        for (parent, freezer) in parents {
            sweep_stale(&parent, freezer);
        }
    }

    /// No group is made ahead for a next exec: this root serves one exec (`run`).
    pub fn one_exec_only(&self) {
        self.spare_wanted.store(false, Ordering::Relaxed);
    }

    fn bases(&self) -> Vec<&Path> {
        match &self.layout {
            Layout::V2 { base, .. } => vec![base],
            Layout::V1 {
                pids,
                memory,
                freezer,
                cpuacct,
                cpu,
            } => [
                Some(pids),
                memory.as_ref(),
                freezer.as_ref(),
                cpuacct.as_ref(),
                cpu.as_ref(),
            ]
            .into_iter()
            .flatten()
            .map(|p| p.as_path())
            .collect(),
        }
    }

    /// Make every missing base directory again, with a fresh lock.
    fn restore_bases(&self) -> Result<(), CgroupError> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        for b in self.bases() {
            if b.is_dir() {
                continue; // still ours, and still locked by us
            }
            tracing::warn!(group = %b.display(), "our cgroup was removed; making it again");
            let lock = own_dir(b)?;
            locks.retain(|(p, _)| p != b);
            locks.push((b.to_path_buf(), lock));
            if let Layout::V2 { memory, .. } = &self.layout {
                let want = if *memory { "+pids +memory" } else { "+pids" };
                write_file(&b.join("cgroup.subtree_control"), want)?;
                // Best effort, as at start-up: cpu.max is reported only when it is there.
                let _ = write_file(&b.join("cgroup.subtree_control"), "+cpu");
            }
        }
        Ok(())
    }

    pub fn describe(&self) -> String {
        match &self.layout {
            Layout::V2 { base, .. } => {
                format!("cgroup v2 at {}", super::cgroup_remount::shown(base))
            }
            Layout::V1 {
                pids,
                memory,
                freezer,
                ..
            } => format!(
                "cgroup v1 pids at {}{}{}",
                super::cgroup_remount::shown(pids),
                memory
                    .as_ref()
                    .map(|m| format!(", memory at {}", super::cgroup_remount::shown(m)))
                    .unwrap_or_default(),
                freezer
                    .as_ref()
                    .map(|m| format!(", freezer at {}", super::cgroup_remount::shown(m)))
                    .unwrap_or_default()
            ),
        }
    }

    /// What each exec's group can do with CPU time.
    pub fn cpu(&self) -> CpuSupport {
        match &self.layout {
            Layout::V2 { base, .. } => CpuSupport {
                accounting: true,
                quota: v2_has(base, "cpu"),
            },
            Layout::V1 { cpuacct, cpu, .. } => CpuSupport {
                accounting: cpuacct.is_some(),
                quota: cpu
                    .as_ref()
                    .or(cpuacct.as_ref())
                    .is_some_and(|d| d.join("cpu.cfs_quota_us").exists()),
            },
        }
    }

    /// Whether each exec's group really gets a memory limit; otherwise why not.
    pub fn memory(&self) -> Result<(), &str> {
        match &self.no_memory {
            None => Ok(()),
            Some(why) => Err(why),
        }
    }
}

static NEXT: AtomicU64 = AtomicU64::new(1);

/// The cgroup(s) of one exec. The child joins them by writing "0" to the open `tasks` (v1) or
/// `cgroup.procs` (v2) descriptors, a single write(2) each, before it drops privileges.
#[derive(Debug)]
pub struct ExecCgroup {
    /// Every directory made so far, the pids (or v2) one first; all removed on drop, so a
    /// failure halfway through creating the group leaks nothing.
    dirs: Vec<PathBuf>,
    procs: Vec<OwnedFd>,
    group: Group,
    /// The directories that hold each counter (the same one on v2).
    pids_dir: PathBuf,
    memory_dir: Option<PathBuf>,
    cpu_meter: Option<CpuMeter>,
    /// The `--cpu` watcher of this exec, once it was handed out by [`Root::take_exec`].
    cpu_watch: Option<CpuWatch>,
}

/// The CFS period we use with a quota (the kernel's default).
const CFS_PERIOD_US: u64 = 100_000;

impl ExecCgroup {
    pub fn create(root: &Root, limits: &Limits) -> Result<ExecCgroup, CgroupError> {
        let name = format!("exec-{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let mut cg = ExecCgroup {
            dirs: Vec::new(),
            procs: Vec::new(),
            group: Group {
                procs_dir: PathBuf::new(),
                kill: Kill::Plain,
            },
            pids_dir: PathBuf::new(),
            memory_dir: None,
            cpu_meter: None,
            cpu_watch: None,
        };
        // A quota of `millis` thousandths of a CPU per period.
        let quota_us = limits
            .cpu_quota_millis
            .map(|m| (m * CFS_PERIOD_US / 1000).max(1000));
        let mkdir = |cg: &mut ExecCgroup, d: PathBuf| {
            fs::create_dir(&d).map_err(|source| CgroupError::Create {
                path: d.clone(),
                source,
            })?;
            cg.dirs.push(d.clone());
            Ok::<PathBuf, CgroupError>(d)
        };
        match &root.layout {
            Layout::V2 { base, memory } => {
                let d = mkdir(&mut cg, base.join(&name))?;
                write_file(&d.join("pids.max"), &limits.pids.to_string())?;
                if let (true, Some(m)) = (memory, limits.memory_bytes) {
                    write_file(&d.join("memory.max"), &m.to_string())?;
                    // --memory is resident memory: swapping past it would not bound it, and
                    // pushes the rest of the pod into swap first. No swap controller (swap
                    // off on this host), nothing to swap to.
                    match write_file(&d.join("memory.swap.max"), "0") {
                        Err(CgroupError::Write { source, .. })
                            if source.kind() == io::ErrorKind::NotFound => {}
                        r => r?,
                    }
                    cg.memory_dir = Some(d.clone());
                }
                if let Some(q) = quota_us {
                    write_file(&d.join("cpu.max"), &format!("{q} {CFS_PERIOD_US}"))?;
                }
                cg.cpu_meter = Some(CpuMeter {
                    path: d.join("cpu.stat"),
                    v2: true,
                });
                cg.pids_dir = d.clone();
                cg.group = Group::at(&d, false);
            }
            Layout::V1 {
                pids,
                memory,
                freezer,
                cpuacct,
                cpu,
            } => {
                let d = mkdir(&mut cg, pids.join(&name))?;
                write_file(&d.join("pids.max"), &limits.pids.to_string())?;
                cg.pids_dir = d.clone();
                cg.group = Group {
                    procs_dir: d,
                    kill: Kill::Plain,
                };
                if let (Some(mroot), Some(m)) = (memory, limits.memory_bytes) {
                    let md = mkdir(&mut cg, mroot.join(&name))?;
                    write_file(&md.join("memory.limit_in_bytes"), &m.to_string())?;
                    // memsw bounds memory + swap; it must not be below limit_in_bytes, which
                    // is why it is written second. Absent when swap accounting is off.
                    let memsw = md.join("memory.memsw.limit_in_bytes");
                    if memsw.exists() {
                        write_file(&memsw, &m.to_string())?;
                    }
                    cg.memory_dir = Some(md);
                }
                // Only when asked: each group costs a mkdir and a join on every exec.
                if limits.cpu_secs.is_some() || quota_us.is_some() {
                    if let Some(aroot) = cpuacct {
                        let ad = mkdir(&mut cg, aroot.join(&name))?;
                        cg.cpu_meter = Some(CpuMeter {
                            path: ad.join("cpuacct.usage"),
                            v2: false,
                        });
                        if let (None, Some(q)) = (cpu, quota_us) {
                            // co-mounted cpu,cpuacct
                            write_file(&ad.join("cpu.cfs_period_us"), &CFS_PERIOD_US.to_string())?;
                            write_file(&ad.join("cpu.cfs_quota_us"), &q.to_string())?;
                        }
                    }
                    if let (Some(croot), Some(q)) = (cpu, quota_us) {
                        let cd = mkdir(&mut cg, croot.join(&name))?;
                        write_file(&cd.join("cpu.cfs_period_us"), &CFS_PERIOD_US.to_string())?;
                        write_file(&cd.join("cpu.cfs_quota_us"), &q.to_string())?;
                    }
                }
                if let Some(froot) = freezer {
                    let fd = mkdir(&mut cg, froot.join(&name))?;
                    cg.group.kill = Kill::Freezer(fd);
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
        for d in cg.dirs.clone() {
            let path = d.join(join_file);
            let f = fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|source| CgroupError::Write { path, source })?;
            cg.procs.push(OwnedFd::from(f));
        }
        Ok(cg)
    }

    /// Child side: join. Async-signal-safe.
    pub fn join(&self) -> Result<(), i32> {
        for fd in &self.procs {
            // SAFETY: writing two bytes from a static buffer to an fd we own.
            let rc = unsafe { libc::write(fd.as_raw_fd(), b"0\n".as_ptr().cast(), 2) };
            if rc < 0 {
                return Err(crate::sys::errno());
            }
        }
        Ok(())
    }

    /// Pids currently in the exec's cgroup. A group that cannot be read is an error, never an
    /// empty group.
    pub fn members(&self) -> Result<Vec<i32>, CgroupError> {
        self.group.members()
    }

    /// Whether the memory cgroup OOM-killed a process of the exec. Only the kernel's OOM-kill
    /// counter says so: v2 memory.events and v1 memory.oom_control `oom_kill`. (v1's failcnt
    /// and v2's `max` count every time usage touched the limit, which page reclaim resolves
    /// without harm: a run that writes a large file hits them.)
    pub fn hit_memory_limit(&self) -> bool {
        let Some(d) = &self.memory_dir else {
            return false;
        };
        ["memory.events", "memory.oom_control"].iter().any(|f| {
            fs::read_to_string(d.join(f))
                .ok()
                .and_then(|t| counter(&t, "oom_kill"))
                .is_some_and(|n| n > 0)
        })
    }

    /// How many times a fork or clone in the exec failed at pids.max (pids.events `max`, on
    /// v1 and v2).
    pub fn pids_max_hits(&self) -> u64 {
        fs::read_to_string(self.pids_dir.join("pids.events"))
            .ok()
            .and_then(|t| counter(&t, "max"))
            .unwrap_or(0)
    }

    /// Whether the `--cpu` watcher found the tree at its limit (and signalled it).
    pub fn cpu_limit_hit(&self) -> bool {
        self.cpu_watch
            .as_ref()
            .is_some_and(|w| w.hit.load(Ordering::Acquire))
    }

    /// The exec tree's CPU time, when this group accounts it.
    pub fn cpu_meter(&self) -> Option<CpuMeter> {
        self.cpu_meter.clone()
    }

    /// Signal every member without a pid race (see [`Group::signal`]); returns how many there
    /// were.
    pub fn signal_all(&self, sig: i32) -> Result<usize, CgroupError> {
        self.group.signal(sig, true)
    }
}

impl Drop for ExecCgroup {
    fn drop(&mut self) {
        if let Some(w) = &self.cpu_watch {
            w.stop.store(true, Ordering::Release);
        }
        // The caller kills and reaps the tree first.
        for d in &self.dirs {
            remove_dir_retrying(d);
        }
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        // The spare group lives inside ours: remove it first. The locks are released after
        // the directories are gone (the field drops after this body).
        drop(self.spare.lock().unwrap_or_else(|p| p.into_inner()).take());
        // A root whose exec never ran still cleans up after dead supervisors (ours are
        // locked: a sweep passes them by).
        self.sweep_stale();
        // An exec group inside may still be there (the process manager removes it once the
        // exec is reaped, which can come just after this): see `remove_base`.
        for b in self.bases() {
            remove_base(b);
        }
    }
}

#[cfg(test)]
#[path = "cgroup_tests.rs"]
mod tests;
