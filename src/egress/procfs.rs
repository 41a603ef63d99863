//! Binary identity from the kernel: which processes of the sandbox hold the client end of a
//! proxied connection, what they run, and who their ancestors are.
//!
//! 1. The socket: the client end has the accepted connection's ends swapped. A
//!    `NETLINK_SOCK_DIAG` socket made inside the sandbox's namespace asks the kernel for
//!    exactly that 4-tuple ([`SockDiag::inode`]): one lookup, however many sockets the sandbox
//!    holds. Without sock_diag, the namespace's `/proc/<pid>/net/tcp{,6}` is scanned instead.
//! 2. Its holders: every process of the sandbox's network namespaces (every one this
//!    supervisor made a proxy for) with the socket in one of its fd tables, every thread's
//!    table included ([`super::holders`]), read with the sandbox frozen where it can be. A socket with references the scan cannot account for
//!    (descriptors in flight on a unix socket, a table that cannot be read) is refused, not
//!    guessed. One scan indexes every socket, and a lookup trusts only a scan made after its
//!    connection was accepted (an older one could name a process that has since passed the
//!    descriptor on), so a burst of connections costs one scan, not one each.
//! 3. For each holder: `/proc/<pid>/exe` (the kernel's path, in the sandbox's view; argv is
//!    never used), the ancestors up `PPid` while they are in the sandbox and are not the
//!    supervisor's own binary (the exec's init), at most 64; the absolute paths among their
//!    argv, for logs; the exec (PID namespace); and, for each process of that chain, whether
//!    it may run code the sandbox chose ([`super::loaded`]). Every holder is the caller: the
//!    decision admits the connection only when one rule admits each of them.
//! 4. Trust on first use: the SHA-256 of each executable's live image is pinned per path the
//!    first time it is seen; a different image behind the same path later is refused.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Read};
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::freeze::{Freezer, NotFrozen};
use super::holders::{self, Budget, Holder, Snapshot, Spent};
use super::identity::{Caller, ExecKey, Identify, IdentityError, UntrustedCode, ns_inode};
use super::loaded::CodeCheck;
use super::proctext;
pub use super::sockdiag::{SockDiag, tcp_table_inode};

/// Ancestors followed at most (OpenShell's bound).
const MAX_DEPTH: usize = 64;
/// The part of a cmdline read.
const MAX_CMDLINE: u64 = 64 * 1024;
/// Absolute argv paths kept per caller ([`cmdline_paths`]).
const MAX_CMDLINE_PATHS: usize = 32;
/// Pauses before scanning again while descriptors are in flight: a program passing one on
/// is done within them; a socket parked in flight is refused after them.
const IN_FLIGHT_RETRIES: [Duration; 3] = [
    Duration::from_millis(5),
    Duration::from_millis(20),
    Duration::from_millis(50),
];
/// Pauses before scanning again while the sandbox's own cgroups do not freeze (each attempt
/// also waits up to 100 ms for them): a task busy in the kernel (a long `fsync`) is done within
/// them; a sandbox that keeps one so is refused after them, rather than decided on a scan
/// that is not a snapshot.
const FREEZE_RETRIES: [Duration; 4] = [
    Duration::from_millis(20),
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(200),
];

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> IdentityError {
    let what = what.into();
    move |source| IdentityError::Io { what, source }
}

/// An `io::Error` again, for an error kept in a snapshot that several lookups report.
fn again(e: &io::Error) -> io::Error {
    e.raw_os_error()
        .map(io::Error::from_raw_os_error)
        .unwrap_or_else(|| io::Error::new(e.kind(), e.to_string()))
}

/// A pinned executable image.
struct Pin {
    fingerprint: (u64, i64, i64, u64, u64),
    sha256: String,
}

/// An executable image as a lookup checked it: (device, inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Image(u64, u64);

impl Image {
    fn pair(self) -> (u64, u64) {
        (self.0, self.1)
    }
}

/// One process of a caller's chain, and the image [`ProcIdentity::verify`] checked for it:
/// its mappings are read against that image (`loaded`: the executable's own mapping is the
/// one the integrity pin covers, so an image exec'd after the check is not taken for it).
#[derive(Debug, Clone, Copy)]
struct Link {
    pid: u32,
    image: Image,
}

/// A caller worked out before: valid while every process of its chain is the same process
/// (start time), has the same parent and runs the same executable.
struct Known {
    /// (pid, start time, parent, executable), the caller first.
    chain: Vec<(u32, u64, u32, String)>,
    caller: Caller,
}

/// How long a lookup may run on the proxy's own thread ([`Identify::identify_now`]); one
/// usually takes 150–200 µs.
const QUICK_BUDGET: Duration = Duration::from_millis(1);
/// Connections that go straight to a blocking thread after a lookup ran out of that budget.
const QUICK_PAUSE: u32 = 64;

/// Callers remembered at most; the table is cleared when full.
const KNOWN_MAX: usize = 4096;
/// Executable images pinned at most ([`pin_or_check`]).
const PINS_MAX: usize = 16384;

/// The network namespaces this supervisor made a proxy for, one entry per live
/// [`ProcIdentity`]. Every scan reads the processes of all of them: a process of another one
/// (in `serve`, an exec of an older revision's sandbox, which shares the workdir) can be
/// handed a socket through a unix socket on a shared path, and hold it, or keep it in flight.
static SANDBOXES: Mutex<Vec<u64>> = Mutex::new(Vec::new());

/// One namespace's entry in [`SANDBOXES`], removed with its identity.
struct Registered(u64);

impl Registered {
    fn new(netns: u64) -> Registered {
        SANDBOXES
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(netns);
        Registered(netns)
    }

    /// Every registered namespace, this one first.
    fn all(&self) -> Vec<u64> {
        let mut v = vec![self.0];
        for ns in SANDBOXES.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            if !v.contains(ns) {
                v.push(*ns);
            }
        }
        v
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut v = SANDBOXES.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = v.iter().position(|n| *n == self.0) {
            v.swap_remove(i);
        }
    }
}

/// The real [`Identify`]: processes of one sandbox network namespace, read from `/proc`.
pub struct ProcIdentity {
    netns: u64,
    registered: Registered,
    diag: Option<Mutex<SockDiag>>,
    /// The supervisor's own executable (device, inode): a process running it is the exec's
    /// init or the supervisor, where the ancestor chain stops.
    own_exe: (u64, u64),
    index: Mutex<Snapshot>,
    freezer: Freezer,
    code: CodeCheck,
    pins: Mutex<HashMap<String, Pin>>,
    known: Mutex<HashMap<u32, Known>>,
    /// Connections whose lookup skips [`Identify::identify_now`] after one that ran out of
    /// its budget.
    quick_paused: AtomicU32,
}

impl ProcIdentity {
    /// `netns` is the sandbox's network namespace; `diag` the sock_diag socket made in it
    /// ([`super::netns::NetnsSockets::diag`]).
    pub fn new(netns: BorrowedFd<'_>, diag: Option<OwnedFd>) -> io::Result<ProcIdentity> {
        let ino = fs::File::from(netns.try_clone_to_owned()?)
            .metadata()?
            .ino();
        let me = fs::metadata("/proc/self/exe")?;
        Ok(ProcIdentity {
            netns: ino,
            registered: Registered::new(ino),
            diag: diag.map(|d| Mutex::new(SockDiag::new(d))),
            own_exe: (me.dev(), me.ino()),
            index: Mutex::new(Snapshot::default()),
            freezer: Freezer::new(),
            code: CodeCheck::default(),
            pins: Mutex::new(HashMap::new()),
            known: Mutex::new(HashMap::new()),
            quick_paused: AtomicU32::new(0),
        })
    }

    fn in_netns(&self, pid: u32) -> bool {
        ns_inode(pid, "net").is_ok_and(|i| i == self.netns)
    }

    /// A fresh snapshot of the namespace's socket references, unless `budget` runs out first.
    fn scan(&self, idx: &mut Snapshot, budget: Budget) -> Result<(), Spent> {
        *idx = holders::scan(self.netns, &self.registered.all(), &self.freezer, budget)?;
        match &idx.frozen {
            Ok(()) => {}
            Err(NotFrozen::Unavailable) => {
                tracing::debug!(target: "egress", "identity scan made without a frozen sandbox (no freezer cgroup of its own): best effort against descriptors moved while it ran")
            }
            Err(NotFrozen::Failed(why)) => {
                tracing::debug!(target: "egress", "identity scan not frozen: {why}")
            }
        }
        Ok(())
    }

    fn inode(
        &self,
        peer: SocketAddr,
        local: SocketAddr,
        accepted: Instant,
    ) -> Result<u64, IdentityError> {
        // The client socket: local end = our peer, remote end = our local address.
        let found = match &self.diag {
            Some(d) => d
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .inode(peer, local)
                .map_err(io_err("sock_diag lookup"))?,
            None => {
                let mut idx = self.index.lock().unwrap_or_else(|p| p.into_inner());
                if idx.any_member.is_none() || idx.built.is_none_or(|b| b < accepted) {
                    let _ = self.scan(&mut idx, Budget::NONE);
                }
                match idx.any_member {
                    Some(pid) => tcp_table_inode(pid, peer, local)
                        .map_err(io_err(format!("reading /proc/{pid}/net/tcp")))?,
                    None => None,
                }
            }
        };
        found.ok_or(IdentityError::NoSocket { peer, local })
    }

    /// Every holder of `inode`, from a scan made after `accepted`; refused when the scan
    /// cannot account for the socket's references. While descriptors are in flight it scans
    /// again after each of [`IN_FLIGHT_RETRIES`]; while the sandbox could be frozen but was
    /// not, after each of [`FREEZE_RETRIES`].
    fn holders(&self, inode: u64, accepted: Instant) -> Result<Vec<Holder>, IdentityError> {
        let mut idx = self.index.lock().unwrap_or_else(|p| p.into_inner());
        let (mut flights, mut freezes) = (0, 0);
        let mut first = true;
        loop {
            if !first || idx.built.is_none_or(|b| b < accepted) {
                let _ = self.scan(&mut idx, Budget::NONE);
            }
            first = false;
            let pause = if matches!(idx.frozen, Err(NotFrozen::Failed(_))) {
                freezes += 1;
                FREEZE_RETRIES.get(freezes - 1)
            } else if !idx.in_flight.is_empty() {
                flights += 1;
                IN_FLIGHT_RETRIES.get(flights - 1)
            } else {
                break;
            };
            match pause {
                Some(p) => std::thread::sleep(*p),
                None => break,
            }
        }
        if let Err(NotFrozen::Failed(why)) = &idx.frozen {
            return Err(IdentityError::NotFrozen {
                inode,
                why: why.clone(),
            });
        }
        let (unreadable, flight) = idx.gaps();
        if let Some((what, e)) = unreadable {
            return Err(IdentityError::Unreadable {
                inode,
                what: what.clone(),
                source: again(e),
            });
        }
        if let Some(where_) = flight {
            return Err(IdentityError::InFlight { inode, where_ });
        }
        let mut v = idx.owners.get(&inode).cloned().unwrap_or_default();
        if v.is_empty() {
            return Err(IdentityError::NoOwner { inode });
        }
        v.sort_unstable();
        Ok(v)
    }

    fn exe(&self, pid: u32) -> Result<String, IdentityError> {
        let raw = fs::read_link(format!("/proc/{pid}/exe"))
            .map_err(io_err(format!("readlink /proc/{pid}/exe")))?;
        let s = raw.to_string_lossy().into_owned();
        // The kernel appends " (deleted)" to an unlinked image; a file really named so stays.
        if let Some(stripped) = s.strip_suffix(" (deleted)") {
            let in_root =
                PathBuf::from(format!("/proc/{pid}/root")).join(s.trim_start_matches('/'));
            if fs::symlink_metadata(&in_root).is_err() {
                return Ok(stripped.to_string());
            }
        }
        Ok(s)
    }

    fn is_own_binary(&self, pid: u32) -> bool {
        fs::metadata(format!("/proc/{pid}/exe")).is_ok_and(|m| (m.dev(), m.ino()) == self.own_exe)
    }

    /// Pin (or check) the image of `pid`'s executable, known as `path`; its (device, inode).
    /// On a budget, an image that would have to be hashed (a path not pinned yet, or a changed
    /// file) is [`IdentityError::Deferred`]: hashing reads the whole file.
    fn verify(&self, pid: u32, path: &str, budget: Budget) -> Result<Image, IdentityError> {
        let fingerprint = |m: fs::Metadata| (m.len(), m.mtime(), m.ctime(), m.dev(), m.ino());
        // The image the link leads to now, by one statx; the file is opened only to be hashed
        // (and the pin then takes the fingerprint of the file it hashed).
        let now = fs::metadata(format!("/proc/{pid}/exe"))
            .map_err(io_err(format!("stat of /proc/{pid}/exe")))?;
        let image = Image(now.dev(), now.ino());
        if let Some(pin) = self
            .pins
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(path)
            && pin.fingerprint == fingerprint(now)
        {
            return Ok(image);
        }
        if budget.limited() {
            return Err(IdentityError::Deferred);
        }
        let mut f = fs::File::open(format!("/proc/{pid}/exe"))
            .map_err(io_err(format!("opening /proc/{pid}/exe")))?;
        let fp = fingerprint(f.metadata().map_err(io_err("fstat of the executable"))?);
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = f
                .read(&mut buf)
                .map_err(io_err(format!("hashing {path}")))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        let sha256 = hex::encode(h.finalize());
        let mut pins = self.pins.lock().unwrap_or_else(|p| p.into_inner());
        pin_or_check(&mut pins, PINS_MAX, path, fp, sha256).map(|()| image)
    }

    /// A remembered caller, re-checked: a few reads per process of its chain instead of the
    /// whole walk (cmdlines, namespaces), which a burst of connections from one process
    /// would otherwise repeat for each.
    fn known(&self, pid: u32, budget: Budget) -> Option<(Caller, Vec<Link>)> {
        let (chain, caller) = {
            let k = self.known.lock().unwrap_or_else(|p| p.into_inner());
            let e = k.get(&pid)?;
            (e.chain.clone(), e.caller.clone())
        };
        let mut links = Vec::with_capacity(chain.len());
        for (p, start, parent, exe) in &chain {
            if stat(*p)? != (*parent, *start) || self.exe(*p).ok()? != *exe {
                return None;
            }
            // A changed image falls back to the whole walk, which reports it.
            let image = self.verify(*p, exe, budget).ok()?;
            links.push(Link { pid: *p, image });
        }
        Some((caller, links))
    }

    /// The whole walk from `pid` (a task id) up its ancestors: the caller, and its chain
    /// (itself first).
    fn walk(&self, pid: u32, budget: Budget) -> Result<(Caller, Vec<Link>), IdentityError> {
        let first = stat(pid);
        let exe = self.exe(pid)?;
        let image = self.verify(pid, &exe, budget)?;
        let mut ancestors = Vec::new();
        let mut links = vec![Link { pid, image }];
        let mut chain = vec![pid];
        let mut cur = pid;
        while ancestors.len() < MAX_DEPTH {
            if budget.spent() {
                return Err(IdentityError::Deferred);
            }
            let Some(ppid) = ppid(cur) else { break };
            if ppid <= 1 || !self.in_netns(ppid) || self.is_own_binary(ppid) {
                break;
            }
            crate::pause::point("identity-ancestor");
            let Ok(a) = self.exe(ppid) else { break };
            let image = self.verify(ppid, &a, budget).map_err(|e| match e {
                IdentityError::Integrity { .. } => IdentityError::Io {
                    what: format!("ancestor integrity check failed for {a}"),
                    source: io::Error::other(e.to_string()),
                },
                e => e,
            })?;
            if !is_parent(cur, ppid) {
                // The parent exited after its pid was read: the chain ends there, as the
                // kernel's reparenting ends it.
                break;
            }
            ancestors.push(a);
            chain.push(ppid);
            links.push(Link { pid: ppid, image });
            cur = ppid;
        }
        let cmdline_paths = cmdline_paths(&chain, &exe, &ancestors);
        let exec = ExecKey(ns_inode(pid, "pid").map_err(io_err(format!("/proc/{pid}/ns/pid")))?);
        let caller = Caller {
            pid,
            exe,
            ancestors,
            cmdline_paths,
            exec,
            ..Caller::default()
        };
        // Remembered only when every process of the chain could be pinned by its start time.
        let exes = std::iter::once(&caller.exe).chain(&caller.ancestors);
        let stats: Option<Vec<(u32, u64)>> = std::iter::once(first)
            .chain(chain[1..].iter().map(|p| stat(*p)))
            .collect();
        if let Some(stats) = stats {
            let chain = chain
                .iter()
                .zip(stats)
                .zip(exes)
                .map(|((p, (parent, start)), exe)| (*p, start, parent, exe.clone()))
                .collect();
            let mut k = self.known.lock().unwrap_or_else(|p| p.into_inner());
            if k.len() >= KNOWN_MAX {
                k.clear();
            }
            k.insert(
                pid,
                Known {
                    chain,
                    caller: caller.clone(),
                },
            );
        }
        Ok((caller, links))
    }
    /// The evidence of untrusted code for each process of a chain (index = depth). What
    /// cannot be read counts as evidence: a rule that cares refuses it.
    fn untrusted(
        &self,
        chain: &[Link],
        budget: Budget,
    ) -> Result<Vec<UntrustedCode>, IdentityError> {
        let mut out = Vec::new();
        for (depth, Link { pid, image }) in chain.iter().enumerate() {
            if budget.spent() {
                return Err(IdentityError::Deferred);
            }
            if depth > 0 {
                crate::pause::point("identity-code");
            }
            let mut what = match self.code.environment(*pid) {
                Ok(Some(w)) => Some(w),
                Err(e) => Some(format!("its environment could not be read: {e}")),
                Ok(None) => match self
                    .code
                    .mappings(*pid, Some(image.pair()), budget.deadline())
                {
                    Ok(w) => w,
                    Err(e) => Some(format!("its mappings could not be read: {e}")),
                },
            };
            // A read given up at the budget (`mappings`) is no evidence: the lookup moves to
            // a blocking thread, which reads it whole.
            if budget.spent() {
                return Err(IdentityError::Deferred);
            }
            // What was read is the ancestor's only if it was still the parent afterwards.
            if depth > 0 && !is_parent(chain[depth - 1].pid, *pid) {
                what = Some("it exited while its code was checked".to_string());
            }
            if let Some(what) = what {
                out.push(UntrustedCode { depth, what });
            }
        }
        Ok(out)
    }

    /// One holder, read through the task whose table holds the socket.
    fn holder(&self, h: Holder, budget: Budget) -> Result<Caller, IdentityError> {
        let (mut c, chain) = match self.known(h.tid, budget) {
            Some(k) => k,
            None => self.walk(h.tid, budget)?,
        };
        c.pid = h.pid;
        c.untrusted_code = self.untrusted(&chain, budget)?;
        Ok(c)
    }

    /// The lookup of [`Identify::identify_now`]: `None` wherever the blocking one would
    /// wait (a lock another lookup holds, a retry), hash, or refuse, and when `budget` runs
    /// out. What it finds is what [`Identify::identify`] finds from the same snapshot; the
    /// snapshot it makes is kept for that one to use.
    fn quick(
        &self,
        peer: SocketAddr,
        local: SocketAddr,
        accepted: Instant,
        budget: Budget,
    ) -> Option<Caller> {
        let inode = self
            .diag
            .as_ref()?
            .try_lock()
            .ok()?
            .inode(peer, local)
            .ok()??;
        let holders = {
            let mut idx = self.index.try_lock().ok()?;
            if idx.built.is_none_or(|b| b < accepted) {
                self.scan(&mut idx, budget).ok()?;
            }
            if matches!(idx.frozen, Err(NotFrozen::Failed(_))) {
                // Not kept: the blocking lookup would take it for its first try and sleep
                // before the next, where a freeze that needed more than this budget (a busy
                // machine) usually takes hold within the blocking one's own wait.
                idx.built = None;
                return None;
            }
            let (unreadable, flight) = idx.gaps();
            if unreadable.is_some() || flight.is_some() {
                return None;
            }
            let mut v = idx.owners.get(&inode).cloned().unwrap_or_default();
            if v.is_empty() {
                return None;
            }
            v.sort_unstable();
            v
        };
        caller_of(holders.into_iter().map(|h| self.holder(h, budget))).ok()
    }
}

/// Check `sha256` against the pin of `path`, or pin it. A table of `max` pins takes no new
/// path: the sandbox chooses its executables' paths (links in `/tmp` cost it nothing), so an
/// unbounded table would be supervisor memory it could grow without end, and the pins already
/// taken (the images first seen, before any such flood) are the ones worth keeping.
fn pin_or_check(
    pins: &mut HashMap<String, Pin>,
    max: usize,
    path: &str,
    fingerprint: (u64, i64, i64, u64, u64),
    sha256: String,
) -> Result<(), IdentityError> {
    let full = pins.len() >= max;
    match pins.get_mut(path) {
        Some(pin) if pin.sha256 != sha256 => Err(IdentityError::Integrity {
            path: path.to_string(),
            cached: pin.sha256.clone(),
            current: sha256,
        }),
        Some(pin) => {
            pin.fingerprint = fingerprint;
            Ok(())
        }
        None if full => {
            tracing::debug!(target: "egress", "{max} executables pinned already: {path} is not pinned");
            Ok(())
        }
        None => {
            pins.insert(
                path.to_string(),
                Pin {
                    fingerprint,
                    sha256,
                },
            );
            Ok(())
        }
    }
}

/// `(ppid, starttime)` from `/proc/<pid>/stat`: the start time tells a process from a later
/// one with the same pid.
fn stat(pid: u32) -> Option<(u32, u64)> {
    let s = proctext::read_record(&format!("/proc/{pid}/stat")).ok()?;
    let line = crate::sys::procstat::StatLine::new(&s)?;
    Some((line.num(4)?, line.num(22)?))
}

/// Whether `parent` is still the parent of `child`. A process's parent changes only when the
/// parent exits (the child is reparented to a reaper), and a pid is free for another process
/// only after that: so `/proc/<parent>/...` read between an earlier look at `child`'s parent and
/// a true answer here was the parent's. Without this, a parent that exits while it is read can
/// hand its pid to a process the sandbox started meanwhile (it can cycle its pid space), and
/// the chain would name that process.
fn is_parent(child: u32, parent: u32) -> bool {
    ppid(child) == Some(parent)
}

/// `pid`'s parent, from `stat` (the kernel formats `status`, five times as long, for one
/// field of it).
fn ppid(pid: u32) -> Option<u32> {
    stat(pid).map(|(parent, _)| parent)
}

/// The absolute paths among the argv of `chain`, minus the executables: the first
/// [`MAX_CMDLINE_PATHS`], then `…` if there were more. They are for logs and hints only, and
/// the sandbox chooses them: 64 processes of 64 KiB of argv each would otherwise be a refusal
/// of megabytes, and a quadratic search for repeats.
fn cmdline_paths(chain: &[u32], exe: &str, ancestors: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in chain {
        for arg in cmdline(*p) {
            if !arg.starts_with('/') || arg == exe || ancestors.contains(&arg) || out.contains(&arg)
            {
                continue;
            }
            if out.len() == MAX_CMDLINE_PATHS {
                out.push("…".to_string());
                return out;
            }
            out.push(arg);
        }
    }
    out
}

fn cmdline(pid: u32) -> Vec<String> {
    let mut b = Vec::new();
    if let Ok(f) = fs::File::open(format!("/proc/{pid}/cmdline")) {
        let _ = f.take(MAX_CMDLINE).read_to_end(&mut b);
    }
    b.split(|c| *c == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// The caller of a socket from its holders (at least one, lowest PID first): the first,
/// with each later one the decision can tell from those before it as `other_holders`. The
/// first holder that cannot be read is the answer.
fn caller_of<E>(holders: impl Iterator<Item = Result<Caller, E>>) -> Result<Caller, E> {
    let mut callers: Vec<Caller> = Vec::new();
    for c in holders {
        let c = c?;
        if !callers.iter().any(|o| same_identity(o, &c)) {
            callers.push(c);
        }
    }
    let mut first = callers.remove(0);
    first.other_holders = callers;
    Ok(first)
}

/// Two holders the decision cannot tell apart.
fn same_identity(a: &Caller, b: &Caller) -> bool {
    (&a.exe, &a.ancestors, &a.cmdline_paths, &a.untrusted_code)
        == (&b.exe, &b.ancestors, &b.cmdline_paths, &b.untrusted_code)
}

impl Identify for ProcIdentity {
    fn identify(
        &self,
        peer: SocketAddr,
        local: SocketAddr,
        accepted: Instant,
    ) -> Result<Caller, IdentityError> {
        let inode = self.inode(peer, local, accepted)?;
        // A holder seen but not readable now (it exited, or exec'd away) is not skipped: it
        // may have passed the socket on after the scan.
        caller_of(self.holders(inode, accepted)?.into_iter().map(|h| {
            self.holder(h, Budget::NONE).map_err(|e| match e {
                IdentityError::Io { what, source } => IdentityError::Holder {
                    inode,
                    pid: h.pid,
                    what,
                    source,
                },
                e => e,
            })
        }))
    }

    fn identify_now(
        &self,
        peer: SocketAddr,
        local: SocketAddr,
        accepted: Instant,
    ) -> Option<Caller> {
        // A pause point held here would hold every connection of the proxy.
        if crate::pause::armed() {
            return None;
        }
        // After a lookup that ran out of its budget, the next ones go straight to a blocking
        // thread: a sandbox that makes every scan long costs the proxy's thread one budget
        // per QUICK_PAUSE connections, not one each.
        if self
            .quick_paused
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
        {
            return None;
        }
        let budget = Budget::until(Instant::now() + QUICK_BUDGET);
        let found = self.quick(peer, local, accepted, budget);
        if found.is_none() && budget.spent() {
            self.quick_paused.store(QUICK_PAUSE, Ordering::Relaxed);
        }
        found
    }
}

/// The paths `path` leads to through symlinks inside `root` (the sandbox's root as the
/// supervisor sees it, e.g. `/proc/<pid>/root`), for
/// [`crate::policy::network::NetworkRules::expand_binary_links`]: each whole path after a link
/// was followed, the last one with no link left in it. Links are read one component at a time
/// and never followed by the kernel, so an absolute target stays inside `root`. Nothing is
/// returned for a path with no link on it, or one that does not exist.
pub fn links_in_root(root: &Path, path: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending: Vec<String> = path
        .split('/')
        .filter(|c| !c.is_empty())
        .rev()
        .map(String::from)
        .collect();
    let mut done: Vec<String> = Vec::new();
    let mut hops = 0;
    while let Some(c) = pending.pop() {
        match c.as_str() {
            "." => continue,
            ".." => {
                done.pop();
                continue;
            }
            _ => {}
        }
        done.push(c);
        let at = root.join(done.join("/"));
        let Ok(m) = fs::symlink_metadata(&at) else {
            return Vec::new();
        };
        if !m.file_type().is_symlink() {
            continue;
        }
        hops += 1;
        let Ok(target) = fs::read_link(&at) else {
            return Vec::new();
        };
        if hops > 40 {
            return Vec::new();
        }
        done.pop();
        let t = target.to_string_lossy().into_owned();
        if t.starts_with('/') {
            done.clear();
        }
        for part in t.split('/').filter(|p| !p.is_empty()).rev() {
            pending.push(part.to_string());
        }
        let mut whole: Vec<String> = done.clone();
        whole.extend(pending.iter().rev().cloned());
        out.push(format!("/{}", whole.join("/")));
    }
    if !out.is_empty() {
        let last = format!("/{}", done.join("/"));
        if out.last() != Some(&last) {
            out.push(last);
        }
    }
    // A spelling with dot segments is no executable path the kernel reports.
    out.retain(|p| !p.split('/').any(|c| c == ".." || c == "."));
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_hold_their_first_image_and_the_table_is_bounded() {
        let mut pins = HashMap::new();
        let fp = (1, 2, 3, 4, 5);
        let pin = |pins: &mut HashMap<String, Pin>, path: &str, sha: &str| {
            pin_or_check(pins, 2, path, fp, sha.to_string())
        };
        pin(&mut pins, "/a", "aa").unwrap();
        pin(&mut pins, "/a", "aa").unwrap();
        let e = pin(&mut pins, "/a", "bb").unwrap_err();
        assert!(
            e.to_string()
                .ends_with("/a hash changed (cached: aa, current: bb)"),
            "{e}"
        );
        pin(&mut pins, "/b", "bb").unwrap();
        // Full: a new path is not pinned, and the pins taken stay.
        pin(&mut pins, "/c", "cc").unwrap();
        pin(&mut pins, "/c", "dd").unwrap();
        assert_eq!(pins.len(), 2);
        assert!(pin(&mut pins, "/a", "bb").is_err());
    }
}
