//! Holding the sandbox still while its socket references are read ([`super::holders`]).
//!
//! A scan of fd tables reads one table after another; a process that keeps moving a
//! descriptor in and out of flight (`SCM_RIGHTS`) can be at neither place when each is read.
//! The cgroup freezer stops every task of a group at a point outside any system call (a
//! `sendmsg` or `recvmsg` is either done or not begun), so a scan made while the groups of
//! all the namespace's processes are frozen is a snapshot.
//!
//! The groups are the ones the kernel shows for each process (`/proc/<pid>/cgroup`): the v1
//! `freezer` hierarchy, or v2 (`cgroup.freeze`) where there is no v1 freezer. A group is
//! frozen only when it is thawed now (one someone else froze is left to them, and must still
//! be frozen when the scan ends), and never the root group or one holding the supervisor
//! itself: then there is no snapshot, and the scan is best effort. Every group this froze is
//! thawed when the [`Frozen`] guard drops.
//!
//! Two things share these groups with us. The exec's kill (`sandbox::cgroup`) freezes a v1
//! group around reading and signalling its members: if it thaws the group during a scan, the
//! scan sees it no longer frozen and is not taken for a snapshot; if this thaws a group the
//! kill froze after us, a member may fork between its read and its signal, and the kill's
//! loop until the group is empty takes the child. A supervisor killed while a v1 group is
//! frozen leaves it frozen (v1 tasks do not die frozen); the next supervisor's sweep of stale
//! groups freezes, kills and thaws them. A freeze lasts one scan (a lookup of a caller in a
//! v1 group of its own takes ≈ 175 µs frozen against ≈ 150 µs not: the anchor, below).
//!
//! The anchor. In v1, the first group frozen anywhere on the machine switches the kernel's
//! freezer on (a static key: code patched on every CPU, which traps in a VM) and the last one
//! thawed switches it off again: so with nothing else frozen, each write of `FROZEN` and of
//! `THAWED` costs ≈ 100–125 µs here, against ≈ 13 µs while any group stays frozen. At its first
//! v1 freeze, a supervisor therefore makes an empty group of its own beside itself
//! (`openshell-freeze-anchor.<pid>.<n>`, [`Anchor`]) and keeps it frozen for its life: an empty
//! group has nothing to stop, and every later freeze and thaw of a scan is the cheap kind.
//! It carries an exclusive flock on its directory, as the exec groups' bases do: one whose
//! lock anyone can take belongs to a supervisor that was killed, and the next anchor's maker
//! removes it. The cost is the freezer's check, switched on machine-wide for the supervisor's
//! life: a test of a flag on paths that may stop a task (signal delivery, some sleeps).
//!
//! With the switch already on, a task asleep in a read is stopped ≈ 12 µs after the write of
//! `FROZEN` (it wakes, and stops on its way back to user space); a wait that slept 200 µs
//! before its second look at the state paid for that sleep in every scan. So the state is
//! looked at again at once for the first [`FREEZE_SPIN`], and only then between sleeps.
//! Measured (`benches/egress.rs --lookup-only`, the client in a freezer group of its own, as
//! `run` places an exec): a frozen lookup 450–690 µs without both, 500 µs with the anchor alone
//! (the sleep), 270 µs with both, against 150 µs unfrozen; ≈ 175 µs since each group's file
//! stays open ([`Held`]) and a scan freezes the last snapshot's groups before it lists
//! ([`Freezer::freeze_last`]); BENCHMARKS.md has the rounds.

use std::fs;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex, OnceLock};

use super::proctext;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long to wait for a group to report frozen before scanning without a snapshot.
const FREEZE_WAIT: Duration = Duration::from_millis(100);
/// How long a freeze is watched without sleeping between looks: a sleep costs at least the
/// timer slack (50 µs), several times what a task asleep takes to stop.
const FREEZE_SPIN: Duration = Duration::from_micros(100);

/// Where the freezer hierarchies are mounted, and the supervisor's own groups in them.
#[derive(Debug, Clone, Default)]
pub struct Freezer {
    v1: Option<Hierarchy>,
    v2: Option<Hierarchy>,
    /// Made at the first v1 freeze (see the module docs); `None` inside when it could not be
    /// (a read-only hierarchy): freezes then cost what they cost.
    anchor: Arc<OnceLock<Option<Anchor>>>,
    /// The groups of the last scan that was a snapshot, open: the next scan freezes them
    /// first ([`Freezer::freeze_last`]).
    last: Arc<Mutex<Vec<Arc<Held>>>>,
}

/// The name of an anchor group, before the supervisor's pid.
const ANCHOR_PREFIX: &str = "openshell-freeze-anchor.";

/// An empty v1 freezer group kept frozen while it lives (see the module docs), removed when
/// dropped.
#[derive(Debug)]
struct Anchor {
    dir: PathBuf,
    /// Held for the anchor's life: a free lock marks a dead supervisor's anchor.
    _lock: fs::File,
}

impl Anchor {
    /// Made in `h`'s own group, after removing the anchors there whose lock is free.
    fn make(h: &Hierarchy) -> Option<Anchor> {
        let rel = h.own.strip_prefix(h.root.trim_end_matches('/'))?;
        let parent = h.mount.join(rel.trim_start_matches('/'));
        sweep_anchors(&parent);
        // Between our mkdir and our lock, a new anchor looks like a dead supervisor's to
        // another one's sweep, which may take it: then a next name is tried.
        (0..3).find_map(|_| Anchor::make_in(&parent))
    }

    fn make_in(parent: &Path) -> Option<Anchor> {
        // One per freezer (each sandbox's proxy has its own), so that one's end never thaws
        // another's.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = parent.join(format!("{ANCHOR_PREFIX}{}.{n}", std::process::id()));
        // A dead supervisor's anchor of that name was just swept: one still here is a live
        // one's, or a race with another sweep; either way not ours to use.
        fs::create_dir(&dir).ok()?;
        let lock = match fs::File::open(&dir) {
            Ok(f) if lock_free(&f) => f,
            _ => {
                let _ = fs::remove_dir(&dir);
                return None;
            }
        };
        let anchor = Anchor { dir, _lock: lock };
        // If this fails (a sweep took the directory between the mkdir and the lock), the
        // anchor is dropped and removed.
        Group {
            dir: anchor.dir.clone(),
            v2: false,
        }
        .set(true)?;
        tracing::debug!(target: "egress", anchor = %anchor.dir.display(), "kept an empty freezer group frozen, so that each scan's freeze and thaw is cheap");
        Some(anchor)
    }
}

impl Drop for Anchor {
    fn drop(&mut self) {
        // An empty group is removed frozen or not; its lock goes with the file.
        let _ = fs::remove_dir(&self.dir);
    }
}

/// Take the exclusive lock without waiting: whether nobody else holds it.
fn lock_free(f: &fs::File) -> bool {
    matches!(crate::sys::try_lock_exclusive(f.as_fd()), Ok(true))
}

/// Remove the anchors in `parent` whose supervisor is gone (their lock is free). A group
/// with members, or one a live supervisor holds, stays.
fn sweep_anchors(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        if !e.file_name().to_string_lossy().starts_with(ANCHOR_PREFIX) {
            continue;
        }
        let dir = e.path();
        if fs::File::open(&dir).is_ok_and(|f| lock_free(&f)) {
            let _ = fs::remove_dir(&dir);
        }
    }
}

#[derive(Debug, Clone)]
struct Hierarchy {
    /// The mount point, and the group path its root is (`/` unless a sub-tree is mounted).
    mount: PathBuf,
    root: String,
    /// The supervisor's own group.
    own: String,
}

/// One group to freeze.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Group {
    dir: PathBuf,
    v2: bool,
}

impl Freezer {
    /// The supervisor's view: `/proc/self/mountinfo` and `/proc/self/cgroup`.
    pub fn new() -> Freezer {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        Freezer::from_texts(&mountinfo, &own)
    }

    /// The directory of the v1 freezer hierarchy's root group, for tests that make groups.
    #[cfg(test)]
    pub fn v1_mount(&self) -> Option<PathBuf> {
        self.v1.as_ref().map(|h| h.mount.clone())
    }

    /// The groups the next scan freezes first.
    #[cfg(test)]
    pub fn remembered(&self) -> Vec<PathBuf> {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.iter().map(|h| h.group.dir.clone()).collect()
    }

    /// No freezing: every scan is best effort.
    pub fn none() -> Freezer {
        Freezer::default()
    }

    fn from_texts(mountinfo: &str, own_cgroup: &str) -> Freezer {
        let (own_v1, own_v2) = paths(own_cgroup);
        let mut f = Freezer::default();
        for line in mountinfo.lines() {
            // id parent maj:min root mountpoint options [optional...] - fstype source super
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let l: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            if l.len() < 5 || r.len() < 3 {
                continue;
            }
            let (root, mount) = (l[3].to_string(), PathBuf::from(unescape(l[4])));
            match r[0] {
                "cgroup" if r[2].split(',').any(|o| o == "freezer") && f.v1.is_none() => {
                    if let Some(own) = &own_v1 {
                        f.v1 = Some(Hierarchy {
                            mount,
                            root,
                            own: own.clone(),
                        });
                    }
                }
                "cgroup2" if f.v2.is_none() => {
                    if let Some(own) = &own_v2 {
                        f.v2 = Some(Hierarchy {
                            mount,
                            root,
                            own: own.clone(),
                        });
                    }
                }
                _ => {}
            }
        }
        f
    }

    /// The group of `pid` to freeze, or `None` when it cannot be (no hierarchy, the root
    /// group, the supervisor's own or one above it).
    fn group_of(&self, pid: u32) -> Option<Group> {
        let placed = |t: &String| {
            let (v1, v2) = paths(t);
            v1.or(v2).is_some_and(|p| p != "/")
        };
        let text = match proctext::read_record(&format!("/proc/{pid}/cgroup")).ok() {
            Some(t) if placed(&t) => t,
            // A zombie leader shows the root group: its live threads show where the process
            // is. A process whose threads all show the root is in the root (read once).
            own => fs::read_dir(format!("/proc/{pid}/task"))
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|t| {
                    let tid = t.file_name();
                    let tid = tid.to_string_lossy();
                    proctext::read_record(&format!("/proc/{pid}/task/{tid}/cgroup")).ok()
                })
                .find(placed)
                .or(own)?,
        };
        self.group_in(pid, &text)
    }

    fn group_in(&self, pid: u32, text: &str) -> Option<Group> {
        let (v1, v2) = paths(text);
        let (h, path, is_v2) = match (&self.v1, v1, &self.v2, v2) {
            (Some(h), Some(p), _, _) => (h, p, false),
            (None, _, Some(h), Some(p)) => (h, p, true),
            _ => return None,
        };
        if path == "/" || h.own == path || h.own.starts_with(&format!("{path}/")) {
            tracing::debug!(target: "egress", "PID {pid} is in cgroup {path}, which is the root or holds the supervisor ({}): not frozen", h.own);
            return None;
        }
        let rel = path.strip_prefix(h.root.trim_end_matches('/'))?;
        let dir = h.mount.join(rel.trim_start_matches('/'));
        Some(Group { dir, v2: is_v2 })
    }

    /// Freeze the groups of `pids`. [`NotFrozen::Unavailable`] when one of them is not ours to
    /// freeze (no hierarchy, the root group, the supervisor's own); [`NotFrozen::Failed`] when
    /// they are but did not freeze, which the sandbox can cause (a task the freezer cannot
    /// stop for a while): nothing is left frozen either way.
    ///
    /// With `until`, the wait for the groups to stop is a spin that gives up then (a lookup
    /// on the proxy's own thread, which never sleeps); without, it sleeps between looks for
    /// up to [`FREEZE_WAIT`].
    pub fn freeze(&self, pids: &[u32], until: Option<Instant>) -> Result<Frozen, NotFrozen> {
        if self.v1.is_none() && self.v2.is_none() {
            tracing::debug!(target: "egress", "no freezer hierarchy with a group of the supervisor's: scans are not frozen");
            return Err(NotFrozen::Unavailable);
        }
        let mut groups: Vec<Arc<Held>> = Vec::new();
        for &pid in pids {
            // A process that exited since it was listed holds nothing; asking only after a
            // read failed leaves no moment at which a process of the sandbox that exits makes
            // the whole scan unfrozen.
            let gone = || !Path::new(&format!("/proc/{pid}")).exists();
            match self.group_of(pid) {
                Some(g) if groups.iter().any(|h| h.group == g) => {}
                Some(g) => match self.held(g) {
                    Ok(h) => groups.push(h),
                    Err(_) if gone() => {}
                    // No freezer file: not a group this can freeze.
                    Err(_) => return Err(NotFrozen::Unavailable),
                },
                None if gone() => {}
                None => return Err(NotFrozen::Unavailable),
            }
        }
        self.freeze_groups(groups, until).map_err(|s| match s {
            Stopped::Unreadable(why) => NotFrozen::Failed(why),
            Stopped::Not(e) => e,
        })
    }

    /// Freeze the groups of the last scan that was a snapshot, before the namespaces are
    /// listed: when every process listed then is in one of them, that listing, made while
    /// they stand still, is the snapshot's, and the listing [`Freezer::freeze`] needs first
    /// (to know which groups to freeze) is saved. `None` when there is no such scan or one of
    /// its groups is gone (the caller then freezes by `pids`, as on a first scan).
    pub fn freeze_last(&self, until: Option<Instant>) -> Option<Result<Frozen, NotFrozen>> {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if last.is_empty() {
            return None;
        }
        match self.freeze_groups(last, until) {
            Ok(f) => Some(Ok(f)),
            Err(Stopped::Not(e)) => Some(Err(e)),
            // A removed group's descriptor reads ENODEV: forgotten, and opened anew next time
            // (what this froze before it is thawed as the freeze is dropped).
            Err(Stopped::Unreadable(_)) => {
                self.last.lock().unwrap_or_else(|p| p.into_inner()).clear();
                None
            }
        }
    }

    /// The group of `g`, open: the last snapshot's descriptor when it is one of those and
    /// still reads (a group removed and made again under the same name is a new group, and
    /// the old descriptor reads ENODEV).
    fn held(&self, g: Group) -> std::io::Result<Arc<Held>> {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        match last.iter().find(|h| h.group == g) {
            Some(h) if h.state().is_some() => Ok(h.clone()),
            _ => Held::open(g).map(Arc::new),
        }
    }

    /// Freeze `groups`, each state read once before it is changed; nothing is left frozen by
    /// this when it fails.
    fn freeze_groups(
        &self,
        groups: Vec<Arc<Held>>,
        until: Option<Instant>,
    ) -> Result<Frozen, Stopped> {
        if !groups.is_empty()
            && let Some(h) = &self.v1
        {
            self.anchor.get_or_init(|| Anchor::make(h));
        }
        let mut f = Frozen {
            freezer: self.clone(),
            ours: Vec::new(),
            all: groups,
        };
        for (i, g) in f.all.iter().enumerate() {
            match g.state() {
                Some(State::Thawed) => {
                    if g.set(true).is_none() {
                        return Err(Stopped::Not(NotFrozen::Failed(format!(
                            "{} could not be frozen",
                            g.group.dir.display()
                        ))));
                    }
                    f.ours.push(i);
                }
                // Someone else's freeze (the exec's kill): left to them.
                Some(State::Frozen | State::Freezing) => {}
                None => {
                    return Err(Stopped::Unreadable(format!(
                        "the state of {} could not be read",
                        g.group.dir.display()
                    )));
                }
            }
        }
        crate::pause::point("identity-freeze");
        let start = Instant::now();
        while !f.all.iter().all(|g| g.state() == Some(State::Frozen)) {
            if let Some(until) = until {
                if Instant::now() >= until {
                    return Err(Stopped::Not(NotFrozen::Failed(
                        "its cgroups did not freeze within the lookup's budget".to_string(),
                    )));
                }
                std::thread::yield_now();
                continue;
            }
            if start.elapsed() > FREEZE_WAIT {
                tracing::debug!(target: "egress", "the sandbox's cgroups did not freeze within {FREEZE_WAIT:?}");
                return Err(Stopped::Not(NotFrozen::Failed(format!(
                    "its cgroups did not freeze within {FREEZE_WAIT:?}"
                ))));
            }
            // A task stops at its next return to user space, usually within tens of
            // microseconds (≈ 12 µs for a task asleep in a read, with the anchor): look again at
            // once for the first FREEZE_SPIN, then less often.
            if start.elapsed() < FREEZE_SPIN {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        Ok(f)
    }
}

/// Why [`Freezer::freeze_groups`] stopped: a group whose state no longer reads (removed, for
/// [`Freezer::freeze_last`] to forget), or one of the reasons a scan is not frozen.
enum Stopped {
    Unreadable(String),
    Not(NotFrozen),
}

/// Why a scan was not made with the sandbox frozen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotFrozen {
    /// Nothing to freeze with: no freezer hierarchy, or a process in a group that is not the
    /// sandbox's own (the root group, the supervisor's). Scans are best effort, as SECURITY.md
    /// says.
    Unavailable,
    /// The sandbox's own groups did not stand still (see [`Freezer::freeze`]), or one was
    /// thawed, or a process was outside them, while the scan ran.
    Failed(String),
}

/// The groups of one scan, frozen; the ones this froze (indices into `all`) thaw on drop.
pub struct Frozen {
    freezer: Freezer,
    ours: Vec<usize>,
    all: Vec<Arc<Held>>,
}

impl Frozen {
    /// Whether every one of `pids` is in a frozen group (a process that joined the namespace
    /// from another group after the freeze was not standing still).
    pub fn covers(&self, pids: &[u32]) -> bool {
        // Whether a process has exited is asked only of one that is not in them.
        pids.iter().all(|p| {
            self.freezer
                .group_of(*p)
                .is_some_and(|g| self.all.iter().any(|h| h.group == g))
                || !Path::new(&format!("/proc/{p}")).exists()
        })
    }

    /// Whether no group was thawed meanwhile (by whoever froze it, when not this).
    pub fn still_frozen(&self) -> bool {
        self.all.iter().all(|g| g.state() == Some(State::Frozen))
    }

    /// These groups made a snapshot: the next scan freezes them first
    /// ([`Freezer::freeze_last`]).
    pub fn remember(&self) {
        *self.freezer.last.lock().unwrap_or_else(|p| p.into_inner()) = self.all.clone();
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for g in self.ours.iter().map(|i| &self.all[*i]) {
            if g.set(false).is_none() {
                tracing::error!(target: "egress", group = %g.group.dir.display(), "could not thaw a sandbox cgroup frozen for an identity scan");
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Thawed,
    Freezing,
    Frozen,
}

impl Group {
    #[cfg(test)]
    fn state(&self) -> Option<State> {
        Held::open(self.clone()).ok()?.state()
    }

    fn set(&self, frozen: bool) -> Option<()> {
        Held::open(self.clone()).ok()?.set(frozen)
    }
}

/// A group's freezer files, open for one freeze. A freeze reads the state at least three
/// times and writes it twice; through open descriptors each is one `pread` or `pwrite`, where
/// a read by path is an open, a size query, two reads and a close (a v1 frozen lookup paid
/// ≈ 25 system calls for them).
#[derive(Debug)]
struct Held {
    group: Group,
    /// v1: `freezer.state`; v2: `cgroup.freeze`. Open for reading and writing.
    control: fs::File,
    /// v2 only: `cgroup.events`, where the kernel says whether the group is frozen yet.
    events: Option<fs::File>,
}

impl Held {
    fn open(group: Group) -> std::io::Result<Held> {
        let file = |name: &str, write: bool| {
            fs::OpenOptions::new()
                .read(true)
                .write(write)
                .open(group.dir.join(name))
        };
        let (control, events) = if group.v2 {
            (
                file("cgroup.freeze", true)?,
                Some(file("cgroup.events", false)?),
            )
        } else {
            (file("freezer.state", true)?, None)
        };
        Ok(Held {
            group,
            control,
            events,
        })
    }

    fn state(&self) -> Option<State> {
        if self.group.v2 {
            let want = read_at_start(&self.control)?;
            let events = read_at_start(self.events.as_ref()?)?;
            let frozen = events.lines().any(|l| l.trim() == "frozen 1");
            Some(match (want.trim(), frozen) {
                (_, true) => State::Frozen,
                ("1", false) => State::Freezing,
                _ => State::Thawed,
            })
        } else {
            Some(match read_at_start(&self.control)?.trim() {
                "FROZEN" => State::Frozen,
                "FREEZING" => State::Freezing,
                _ => State::Thawed,
            })
        }
    }

    fn set(&self, frozen: bool) -> Option<()> {
        let value: &[u8] = match (self.group.v2, frozen) {
            (true, true) => b"1",
            (true, false) => b"0",
            (false, true) => b"FROZEN",
            (false, false) => b"THAWED",
        };
        // A cgroup file takes each write whole, whatever its offset.
        let n = self.control.write_at(value, 0).ok()?;
        (n == value.len()).then_some(())
    }
}

/// The whole of a small cgroup file, read again from its start: the kernel builds the text
/// anew for a read at offset 0. `freezer.state`, `cgroup.freeze` and `cgroup.events` are one
/// record each (at most a few dozen bytes), so a read shorter than the buffer is all of it.
fn read_at_start(f: &fs::File) -> Option<String> {
    let mut buf = [0u8; 128];
    let n = f.read_at(&mut buf, 0).ok()?;
    if n == buf.len() {
        return None;
    }
    String::from_utf8(buf[..n].to_vec()).ok()
}

/// The v1 freezer group and the v2 group of a `/proc/<pid>/cgroup` text.
fn paths(text: &str) -> (Option<String>, Option<String>) {
    let mut v1 = None;
    let mut v2 = None;
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(ctl), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if id == "0" && ctl.is_empty() {
            v2 = Some(path.to_string());
        } else if ctl.split(',').any(|c| c == "freezer") {
            v1 = Some(path.to_string());
        }
    }
    (v1, v2)
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
#[path = "freeze_tests.rs"]
mod tests;
