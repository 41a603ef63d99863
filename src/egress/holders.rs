//! Every reference the sandbox's processes hold to a socket, or the reason it cannot be
//! known.
//!
//! What can hold a file (so what can keep using a socket) inside a sandbox, on Linux 6.x,
//! and how each is seen:
//! The sandbox is every network namespace this supervisor made a proxy for (in `serve`, the
//! sandboxes of older revisions too): their processes share the workdir, so a unix socket on
//! a path both see carries a descriptor from one namespace to another.
//!
//! - **A process's fd table**, `/proc/<pid>/fd`. That is the table of the thread-group
//!   leader only. A thread made without `CLONE_FILES` has a table of its own, and once the
//!   leader has exited (a zombie leader with live threads) `/proc/<pid>/fd` is empty, as are
//!   its `exe` and `ns/*` links, while a thread still holds everything. So every task is
//!   looked at: `/proc/<pid>/task/<tid>/fd`, skipping the tasks `kcmp(KCMP_FILES)` says
//!   share a table already read (one syscall per thread).
//! - **A descriptor in flight**: sent with `SCM_RIGHTS` on a unix socket and not yet
//!   received, it is in no fd table, and nothing reports the file's own reference count. The
//!   receiving socket does report how many descriptors are queued on it: the `scm_fds:` line
//!   of its `/proc/<pid>/fdinfo/<fd>` (Linux 5.8; a listener counts those of its not yet
//!   accepted connections). Any non-zero count anywhere in the sandbox means some reference
//!   may be in flight, and the scan cannot account for the socket: the connection is refused
//!   rather than decided on the holders that happened to be visible. (A unix socket itself
//!   in flight is inside another one, whose count shows it.)
//! - io_uring fixed files and `pidfd_getfd` are shut by the sandbox's seccomp filter; a
//!   memory mapping of a socket gives no way to use it.
//!
//! The scan reads the tables one after another, so a process that keeps moving a descriptor
//! in and out of flight can be caught at neither place unless the sandbox stands still: the
//! scan runs with the sandbox's cgroups frozen where they can be ([`super::freeze`]), which
//! makes it a snapshot. Without a freezer (no cgroup, or a cgroup shared with the
//! supervisor), it is best effort against such a process (SECURITY.md says so). A freeze that
//! could have held and did not (a task the freezer cannot stop yet, a group thawed meanwhile)
//! is reported as such, and the lookup does not decide on that scan.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::{self, BufRead};
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;
use std::time::Instant;

use super::freeze::{Freezer, Frozen, NotFrozen};
use super::identity::ns_inode;
use super::proctext;
use crate::sys::dirents;

/// How long a scan may run: unbounded on a blocking thread, until a deadline on the proxy's
/// own thread, where a scan past it gives up ([`Spent`]) and the lookup moves to a blocking
/// thread. The sandbox decides how long a scan takes (its processes, its descriptors), and
/// the proxy's thread carries every other connection.
#[derive(Debug, Clone, Copy)]
pub struct Budget(Option<Instant>);

impl Budget {
    /// No deadline.
    pub const NONE: Budget = Budget(None);

    pub fn until(deadline: Instant) -> Budget {
        Budget(Some(deadline))
    }

    /// Whether there is a deadline.
    pub fn limited(&self) -> bool {
        self.0.is_some()
    }

    pub fn deadline(&self) -> Option<Instant> {
        self.0
    }

    /// Whether the deadline has passed.
    pub fn spent(&self) -> bool {
        self.0.is_some_and(|d| Instant::now() >= d)
    }

    /// `Err(Spent)` once the deadline has passed.
    pub fn check(&self) -> Result<(), Spent> {
        if self.spent() { Err(Spent) } else { Ok(()) }
    }
}

/// A scan given up at its [`Budget`]'s deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spent;

/// One process holding a socket: its thread-group id, and a task whose fd table holds it
/// (the one to read the process through: a zombie leader has no `exe` of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Holder {
    pub pid: u32,
    pub tid: u32,
}

/// A view of every socket reference in one network namespace.
#[derive(Debug)]
pub struct Snapshot {
    pub built: Option<Instant>,
    /// socket inode -> its holders, one per process.
    pub owners: HashMap<u64, Vec<Holder>>,
    /// A process of the namespace, for the `/proc/<pid>/net/tcp` fallback.
    pub any_member: Option<u32>,
    /// Unix sockets with descriptors queued on them: (pid, fd, how many).
    pub in_flight: Vec<(u32, u32, u32)>,
    /// What could not be read, and why: the first such place.
    pub unreadable: Option<(String, io::Error)>,
    /// Whether every process of the namespaces stood still (frozen) while they were read:
    /// `Ok(())`, or why not.
    pub frozen: Result<(), NotFrozen>,
}

impl Default for Snapshot {
    fn default() -> Snapshot {
        Snapshot {
            built: None,
            owners: HashMap::new(),
            any_member: None,
            in_flight: Vec::new(),
            unreadable: None,
            frozen: Err(NotFrozen::Unavailable),
        }
    }
}

impl Snapshot {
    /// Why the holders of a socket cannot be accounted for from this snapshot, if they
    /// cannot: `Err((what, source))` for an unreadable place, `Ok(Some(where))` for
    /// descriptors in flight.
    pub fn gaps(&self) -> (Option<&(String, io::Error)>, Option<String>) {
        let flight = (!self.in_flight.is_empty()).then(|| {
            self.in_flight
                .iter()
                .map(|(pid, fd, n)| format!("{n} queued on fd {fd} of PID {pid}"))
                .collect::<Vec<_>>()
                .join(", ")
        });
        (self.unreadable.as_ref(), flight)
    }
}

/// The processes whose leader is in one of the network namespaces `netns`, or whose leader
/// has exited while a thread of theirs is there; each with its namespace.
///
/// Where they are looked for: among the supervisor's descendants when it is its orphans'
/// subreaper (`run` and `serve` make it one at startup), else in all of `/proc`. The
/// descendants hold every member, because:
/// - A process gets into a network namespace by being forked in it, or by `setns(2)` or
///   `unshare(2)`. The supervisor made the namespaces and puts only its own children in them;
///   a sandboxed process cannot `setns`, `unshare` or clone with `CLONE_NEW*` (its seccomp
///   filter answers EPERM), and anyone else needs `CAP_SYS_ADMIN` over the namespace's owning
///   user namespace (root's, or the supervisor's own): as privileged as the supervisor.
/// - A descendant stays one. An orphan goes to another thread of its parent's group, else to
///   its nearest subreaper ancestor (the supervisor at worst, and the command of an exec
///   without an init is one too), else to its PID namespace's init, which is an exec's init,
///   our child; never to a process outside the tree. `CLONE_PARENT` makes a sibling of its
///   maker, the child of a descendant or of us.
/// - A child is listed in the `children` file of the thread that forked it, so every task's
///   file is read, of processes outside the namespaces too (one that moved out could still
///   have children inside). [`scan`] reads the listing made while the sandbox is frozen
///   ([`listed_frozen`]); frozen, nothing forks, exits or is re-parented while it is read, so
///   that listing is as complete as a walk of all of `/proc`. Not frozen, it is best effort
///   against a process that forks or exits while it runs.
///
/// The walk reads the supervisor's threads and the sandbox's processes, where the scan of
/// `/proc` reads a namespace link of every process of the machine: that was most of the
/// proxy's time to first byte (BENCHMARKS.md).
pub fn members(netns: &[u64], budget: Budget) -> Result<Vec<Member>, Spent> {
    let candidates = if is_subreaper() {
        descendants_of_self(budget)?
    } else {
        None
    };
    let candidates = match candidates {
        Some(c) => c,
        // A namespace link of every process of the machine: never on a budget.
        None if budget.limited() => return Err(Spent),
        None => every_pid().into_iter().map(|p| (p, None)).collect(),
    };
    let mut out = Vec::new();
    for (pid, tasks) in candidates {
        budget.check()?;
        if let Some(ns) = netns_of(pid).filter(|ns| netns.contains(ns)) {
            out.push(Member { pid, ns, tasks });
        }
    }
    Ok(out)
}

/// A process of the namespaces, as [`members`] listed it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Member {
    pub pid: u32,
    /// Its network namespace.
    pub ns: u64,
    /// Its tasks, when the listing read them (the walk of the descendants does): a scan that
    /// is a snapshot reads their fd tables without listing them again, as nothing of a frozen
    /// process starts a thread.
    pub tasks: Option<Vec<u32>>,
}

/// Every process of `/proc`.
fn every_pid() -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .collect()
}

/// Whether orphans of our descendants come to us rather than to an init outside the tree.
fn is_subreaper() -> bool {
    let mut v: libc::c_int = 0;
    // SAFETY: prctl writes one int to the address given, which is ours.
    let r = unsafe { libc::prctl(libc::PR_GET_CHILD_SUBREAPER, &mut v as *mut libc::c_int) };
    r == 0 && v != 0
}

/// A process found by a listing, with its tasks when the listing read them.
type Found = (u32, Option<Vec<u32>>);

/// Every descendant of this process, each once, with the tasks its children were read from;
/// `None` when a `children` file cannot be read for another reason than its task having
/// exited (a kernel without `CONFIG_PROC_CHILDREN`), and then the caller reads all of `/proc`.
fn descendants_of_self(budget: Budget) -> Result<Option<Vec<Found>>, Spent> {
    let me = std::process::id();
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let Ok(mut todo) = children(me, &tasks(me)) else {
        return Ok(None);
    };
    while let Some(pid) = todo.pop() {
        if pid == me || !seen.insert(pid) {
            continue;
        }
        budget.check()?;
        let threads = tasks(pid);
        match children(pid, &threads) {
            Ok(c) => todo.extend(c),
            Err(_) => return Ok(None),
        }
        out.push((pid, Some(threads)));
    }
    Ok(Some(out))
}

/// The children of the threads `tids` of `pid` (none for a process or thread that has
/// exited).
fn children(pid: u32, tids: &[u32]) -> io::Result<Vec<u32>> {
    let mut out = Vec::new();
    for &tid in tids {
        let path = format!("/proc/{pid}/task/{tid}/children");
        match proctext::read_text(&path) {
            Ok(text) => out.extend(
                text.split_ascii_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            ),
            Err(e) if gone(&e) && !Path::new(&format!("/proc/{pid}/task/{tid}")).exists() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// An error of a read in `/proc/<pid>/task/<tid>` that may mean the task has exited.
fn gone(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESRCH))
}

/// The network namespace of `pid`: its leader's, or, when the leader is a zombie (its
/// namespace links are gone), its first live thread's.
fn netns_of(pid: u32) -> Option<u64> {
    match ns_inode(pid, "net") {
        Ok(i) => Some(i),
        Err(e) if e.kind() == io::ErrorKind::NotFound => tasks(pid)
            .into_iter()
            .filter(|t| *t != pid)
            .find_map(|t| read_ns(&format!("/proc/{pid}/task/{t}/ns/net"))),
        // Not ours to read (another user's process, for a supervisor that is not root):
        // the sandbox's processes are always readable by the supervisor that made them.
        Err(_) => None,
    }
}

fn read_ns(path: &str) -> Option<u64> {
    let l = fs::read_link(path).ok()?;
    let s = l.to_string_lossy();
    s.rsplit_once('[')?.1.strip_suffix(']')?.parse().ok()
}

fn tasks(pid: u32) -> Vec<u32> {
    let Ok(dir) = dirents::open_dir(&format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut v = dirents::numbered(dir.as_fd()).unwrap_or_default();
    v.sort_unstable();
    v
}

/// Build a snapshot of every socket reference of the processes of the namespaces `netns`,
/// frozen where `freezer` can freeze them all. `own` (one of them) is the namespace whose
/// member the snapshot names for the `/proc/<pid>/net/tcp` fallback.
pub fn scan(own: u64, netns: &[u64], freezer: &Freezer, budget: Budget) -> Result<Snapshot, Spent> {
    crate::pause::point("identity-scan");
    let started = Instant::now();
    let Listed {
        frozen,
        members: now,
        covered,
    } = listed_frozen(netns, freezer, budget)?;
    let mut snap = Snapshot::default();
    let mut seen = Vec::new();
    // Which sockets' queues are read: the first few directly, then only the namespaces' unix
    // sockets, listed once after the freeze ([`Queues`]).
    let mut queues = Queues::new();
    // Frozen, the tasks listed with the processes are all there are; else they are listed
    // again, as late as can be.
    let listed_tasks = frozen.is_ok();
    for Member { pid, ns, tasks } in now {
        if ns == own {
            snap.any_member.get_or_insert(pid);
        }
        budget.check()?;
        let tasks = tasks.filter(|_| listed_tasks);
        scan_process(pid, ns, tasks, &mut queues, &mut snap, budget)?;
        seen.push(pid);
    }
    // A snapshot only if the processes read are the ones frozen, and stayed so throughout.
    snap.frozen = match &frozen {
        Ok(f) if !covered && !f.covers(&seen) => Err(NotFrozen::Failed(
            "a process joined the sandbox from outside its frozen cgroups while it was read".into(),
        )),
        Ok(f) if !f.still_frozen() => Err(NotFrozen::Failed(
            "its cgroups were thawed while it was read".into(),
        )),
        Ok(f) => {
            f.remember();
            Ok(())
        }
        Err(e) => Err(e.clone()),
    };
    drop(frozen);
    snap.built = Some(started);
    Ok(snap)
}

/// The namespaces' processes, listed while their cgroups are frozen where they can be; and
/// whether every one listed was seen in a frozen group after the listing (then nothing
/// listed can have moved out of one: the supervisor places a process once, as it starts).
///
/// Frozen, nothing forks, exits or is re-parented while the listing runs, so it holds every
/// process of the frozen groups ([`members`]). Which groups to freeze comes from the last
/// snapshot's when its groups still hold every process listed (one listing), else from a
/// listing made before the freeze: a child forked before the freeze took hold is in a frozen
/// group but not in that listing, so the namespaces are listed again once frozen. Not
/// frozen, nothing stands still anyway, and the first listing is the one read.
fn listed_frozen(netns: &[u64], freezer: &Freezer, budget: Budget) -> Result<Listed, Spent> {
    let pids = |l: &[Member]| l.iter().map(|m| m.pid).collect::<Vec<u32>>();
    let until = budget.deadline();
    let mut listed = None;
    match freezer.freeze_last(until) {
        Some(Ok(f)) => {
            let now = members(netns, budget)?;
            if f.covers(&pids(&now)) {
                return Ok(Listed {
                    frozen: Ok(f),
                    members: now,
                    covered: true,
                });
            }
            // A process of a group the last snapshot did not have (a new exec): its groups
            // are frozen with the others below, and the namespaces listed again.
            listed = Some(now);
        }
        // The same groups would not freeze again now.
        Some(Err(e)) => {
            return Ok(Listed {
                frozen: Err(e),
                members: members(netns, budget)?,
                covered: false,
            });
        }
        None => {}
    }
    let first = match listed {
        Some(l) => l,
        None => members(netns, budget)?,
    };
    let frozen = freezer.freeze(&pids(&first), until);
    let now = if frozen.is_ok() {
        members(netns, budget)?
    } else {
        first
    };
    Ok(Listed {
        frozen,
        members: now,
        covered: false,
    })
}

/// What [`listed_frozen`] gives: the freeze, the processes listed while it held (or without
/// one), and whether each of them was already seen in a frozen group.
struct Listed {
    frozen: Result<Frozen, NotFrozen>,
    members: Vec<Member>,
    covered: bool,
}

/// Sockets whose queue of descriptors in flight is read directly before the namespace's unix
/// sockets are listed: a fdinfo read costs a few microseconds, and most callers hold one to
/// three sockets, where the listing (`/proc/<pid>/net/unix`, a walk of the namespace's whole
/// unix socket table) costs several times that.
const DIRECT_QUEUES: usize = 4;

/// Which sockets of a scan have their fdinfo read for `scm_fds:`. Only a unix socket has a
/// queue; a sandbox may hold thousands of other sockets. The first [`DIRECT_QUEUES`] sockets
/// are read whatever they are (a non-unix one has no such line); after those, each
/// namespace's unix sockets are listed once, when its first further socket is met, and only
/// those are read. The listing is made during the scan, so after the freeze: a unix socket
/// made before the freeze took hold is in it.
struct Queues {
    direct: usize,
    /// netns -> the inodes of its unix sockets; `None` when the listing cannot be read, and
    /// then every socket of that namespace is read.
    listed: HashMap<u64, Option<HashSet<u64>>>,
}

impl Queues {
    fn new() -> Queues {
        Queues {
            direct: DIRECT_QUEUES,
            listed: HashMap::new(),
        }
    }

    /// Whether the queue of socket `ino`, held by `pid` of namespace `ns`, is to be read.
    fn wanted(&mut self, pid: u32, ns: u64, ino: u64) -> bool {
        if self.direct > 0 {
            self.direct -= 1;
            return true;
        }
        self.listed
            .entry(ns)
            .or_insert_with(|| unix_inodes(pid))
            .as_ref()
            .is_none_or(|u| u.contains(&ino))
    }
}

/// The inodes of every unix socket of `pid`'s network namespace (`/proc/<pid>/net/unix`, which
/// lists unbound and paired sockets too); `None` when it cannot be read.
fn unix_inodes(pid: u32) -> Option<HashSet<u64>> {
    let text = proctext::read_text(&format!("/proc/{pid}/net/unix")).ok()?;
    // Num RefCount Protocol Flags Type St Inode [Path]
    Some(
        text.lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().nth(6)?.parse::<u64>().ok())
            .collect(),
    )
}

/// Every distinct fd table of `pid`'s tasks (`tids`, or listed now).
fn scan_process(
    pid: u32,
    ns: u64,
    tids: Option<Vec<u32>>,
    queues: &mut Queues,
    snap: &mut Snapshot,
    budget: Budget,
) -> Result<(), Spent> {
    let mut read: Vec<u32> = Vec::new();
    for tid in tids.unwrap_or_else(|| tasks(pid)) {
        budget.check()?;
        if read.iter().any(|&r| same_table(r, tid)) {
            continue;
        }
        match scan_table(pid, tid, ns, queues, snap, budget) {
            Ok(Ok(())) => read.push(tid),
            Ok(Err(Spent)) => return Err(Spent),
            // The task exited.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => {
                if snap.unreadable.is_none() {
                    snap.unreadable = Some((
                        format!("the fd table of PID {pid} (task {tid}) cannot be read"),
                        e,
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The protocol name of the socket at `path` (a `/proc/.../fd/N` link, followed).
fn protocol(path: &str) -> io::Result<Vec<u8>> {
    let c = std::ffi::CString::new(path).map_err(io::Error::other)?;
    let mut buf = [0u8; 32];
    // SAFETY: getxattr into our buffer, its length given; both names NUL-terminated.
    let n = unsafe {
        libc::getxattr(
            c.as_ptr(),
            c"system.sockprotoname".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let name = &buf[..n as usize];
    Ok(name.strip_suffix(b"\0").unwrap_or(name).to_vec())
}

/// `include/uapi/linux/kcmp.h`.
const KCMP_FILES: libc::c_int = 2;

/// Whether two tasks share one fd table. An error (no kcmp, or a task gone) says no, so the
/// table is read again rather than skipped.
fn same_table(a: u32, b: u32) -> bool {
    // SAFETY: kcmp with integer arguments only; 0 means the same files_struct.
    unsafe { libc::syscall(libc::SYS_kcmp, a, b, KCMP_FILES, 0, 0) == 0 }
}

/// Add each socket of one task's fd table; note the unix sockets with descriptors queued.
/// readlinkat on the directory's descriptor with one buffer: this runs for every descriptor
/// of the sandbox on each scan.
fn scan_table(
    pid: u32,
    tid: u32,
    ns: u64,
    queues: &mut Queues,
    snap: &mut Snapshot,
    budget: Budget,
) -> io::Result<Result<(), Spent>> {
    let dirfd = dirents::open_dir(&format!("/proc/{pid}/task/{tid}/fd"))?;
    let mut buf = [0u8; 64];
    for (i, num) in dirents::numbered(dirfd.as_fd())?.into_iter().enumerate() {
        // A table may hold many thousands of descriptors.
        if i % 256 == 255 && budget.spent() {
            return Ok(Err(Spent));
        }
        let name = std::ffi::CString::new(num.to_string()).map_err(io::Error::other)?;
        // SAFETY: readlinkat into our buffer, its length given; the result is checked.
        let n = unsafe {
            libc::readlinkat(
                dirfd.as_raw_fd(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            // Closed since the listing.
            if err.raw_os_error() == Some(libc::ENOENT) {
                continue;
            }
            return Err(err);
        }
        let l = &buf[..n as usize];
        let Some(ino) = l
            .strip_prefix(b"socket:[")
            .and_then(|r| r.strip_suffix(b"]"))
            .and_then(|n| std::str::from_utf8(n).ok()?.parse::<u64>().ok())
        else {
            continue;
        };
        let v = snap.owners.entry(ino).or_default();
        if !v.iter().any(|h| h.pid == pid) {
            v.push(Holder { pid, tid });
        }
        if !queues.wanted(pid, ns, ino) {
            continue;
        }
        match queued_fds(pid, tid, num) {
            Ok(0) => {}
            Ok(q) => snap.in_flight.push((pid, num, q)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Ok(()))
}

/// The `scm_fds:` of a socket's fdinfo: descriptors queued on it (0 for any socket that is
/// not a unix one, which has no such line).
fn queued_fds(pid: u32, tid: u32, fd: u32) -> io::Result<u32> {
    // Only a unix socket queues descriptors. The socket's protocol (sockfs's
    // `system.sockprotoname`: `TCP`, `UNIX-STREAM`, ...) is one getxattr, where the fdinfo is
    // an open, two reads and a close: every other socket is answered with it. A name that
    // cannot be read (the descriptor is now something else) leaves it to the fdinfo.
    match protocol(&format!("/proc/{pid}/task/{tid}/fd/{fd}")) {
        Ok(p) if !p.starts_with(b"UNIX") => return Ok(0),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Err(e),
        _ => {}
    }
    let f = fs::File::open(format!("/proc/{pid}/task/{tid}/fdinfo/{fd}"))?;
    for line in io::BufReader::new(f).lines() {
        if let Some(v) = line?.strip_prefix("scm_fds:") {
            return Ok(v.trim().parse().unwrap_or(u32::MAX));
        }
    }
    Ok(0)
}

#[cfg(test)]
#[path = "holders_tests.rs"]
mod tests;
