//! Who is calling: the process behind a proxied connection, as the decision sees it.
//!
//! The proxy asks an [`Identify`] for the [`Caller`] of each accepted connection, given the
//! connection's two ends as the proxy's socket sees them. The real implementation
//! ([`super::procfs::ProcIdentity`]) finds the client socket in the sandbox's network namespace
//! and its owning processes; tests of the decision use a fixed table instead.

use std::net::SocketAddr;
use std::time::Instant;

/// The calling process, and what the decision matches binaries against.
///
/// The caller is every process holding the client socket: the one reported here (the lowest
/// PID) and [`Caller::other_holders`]. A rule allows the connection only when its binaries
/// admit each of them (`egress::decide`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Caller {
    /// The lowest PID holding the socket (a thread-group id).
    pub pid: u32,
    /// The kernel's path of its executable (`/proc/<pid>/exe`, in the sandbox's view).
    pub exe: String,
    /// The executables of its ancestors, nearest first, up to the exec's own first process.
    pub ancestors: Vec<String>,
    /// Absolute paths among the argv of the process and its ancestors, minus the executable
    /// paths: for logs and hints only, never matched.
    pub cmdline_paths: Vec<String>,
    /// Which exec the process belongs to, for the per-exec connection cap and counters.
    pub exec: ExecKey,
    /// Code the process, or one of its ancestors, may run besides its executable's own and
    /// the system's: what the sandbox could have written or chosen.
    pub untrusted_code: Vec<UntrustedCode>,
    /// The other processes holding the same socket, each described as a caller of its own
    /// (with no `other_holders`), lowest PID first.
    pub other_holders: Vec<Caller>,
}

/// Evidence that a process of the caller's chain may run code the sandbox chose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UntrustedCode {
    /// 0: the process itself; `n`: `ancestors[n - 1]`.
    pub depth: usize,
    /// What was seen, e.g. `LD_PRELOAD in its environment` or `maps /tmp/x.so, which the
    /// sandbox can write`.
    pub what: String,
}

impl Caller {
    /// The first evidence of untrusted code at `depth` of the chain.
    pub fn untrusted_at(&self, depth: usize) -> Option<&UntrustedCode> {
        self.untrusted_code.iter().find(|u| u.depth == depth)
    }

    /// This caller and every other holder of the socket.
    pub fn holders(&self) -> impl Iterator<Item = &Caller> {
        std::iter::once(self).chain(self.other_holders.iter())
    }
}

/// Identifies one exec of a sandbox: the inode of its PID namespace (every exec of a sandbox
/// has one of its own; a fork or an orphan stays in it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ExecKey(pub u64);

impl ExecKey {
    /// The key of the exec `pid` belongs to (a read of `/proc/<pid>/ns/pid`).
    pub fn of_pid(pid: u32) -> std::io::Result<ExecKey> {
        ns_inode(pid, "pid").map(ExecKey)
    }
}

/// Why the caller could not be identified; the connection is then denied with
/// `failed to resolve peer binary: <this>`.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("no socket from {peer} to {local} in the sandbox's network namespace")]
    NoSocket { peer: SocketAddr, local: SocketAddr },
    #[error("socket inode {inode} has no owner inside the sandbox (closed, or held outside it)")]
    NoOwner { inode: u64 },
    #[error(
        "socket inode {inode}: file descriptors are in flight between the sandbox's processes ({where_}), so the socket's holders cannot be accounted for"
    )]
    InFlight { inode: u64, where_: String },
    #[error(
        "socket inode {inode}: the sandbox could not be held still while its holders were read ({why}), so they cannot be accounted for"
    )]
    NotFrozen { inode: u64, why: String },
    #[error(
        "socket inode {inode}: {what}, so the socket's holders cannot be accounted for: {source}"
    )]
    Unreadable {
        inode: u64,
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "socket inode {inode} is held by PID {pid}, which could not be identified ({what}): {source}"
    )]
    Holder {
        inode: u64,
        pid: u32,
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "binary integrity check failed: Binary integrity violation: {path} hash changed (cached: {cached}, current: {current})"
    )]
    Integrity {
        path: String,
        cached: String,
        current: String,
    },
    /// Only from [`Identify::identify_now`]'s work, which then gives way to
    /// [`Identify::identify`]: never a connection's answer.
    #[error(
        "the lookup needs more time than the proxy's own thread gives one (it runs on a blocking thread instead)"
    )]
    Deferred,
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// Finds the caller of a connection. Blocking (it reads `/proc`); the proxy runs it off the
/// async workers, a few at a time.
pub trait Identify: Send + Sync + 'static {
    /// `peer` is the client's address and `local` the proxy's, as the accepted socket reports
    /// them (in the client's own socket they are the other way round); `accepted` is when the
    /// proxy accepted it: the client socket existed then, so a view of the sandbox's sockets
    /// taken later is good enough, and one taken earlier is not.
    fn identify(
        &self,
        peer: SocketAddr,
        local: SocketAddr,
        accepted: Instant,
    ) -> Result<Caller, IdentityError>;

    /// The caller, found on the proxy's own thread when that is quick: `None` when finding
    /// it would take longer than a short budget, wait, or end in a refusal; the proxy then
    /// calls [`Identify::identify`] on a blocking thread, whose answer is the connection's.
    /// Handing a lookup to a blocking thread and back costs two wake-ups across CPUs,
    /// ≈ 60 µs of a connection's first byte here (BENCHMARKS.md, egress).
    fn identify_now(
        &self,
        _peer: SocketAddr,
        _local: SocketAddr,
        _accepted: Instant,
    ) -> Option<Caller> {
        None
    }
}

/// A fixed caller for every connection: for tests of the proxy without processes, and for a
/// proxy whose policy does not depend on binaries.
pub struct FixedCaller(pub Caller);

impl Identify for FixedCaller {
    fn identify(&self, _: SocketAddr, _: SocketAddr, _: Instant) -> Result<Caller, IdentityError> {
        Ok(self.0.clone())
    }

    fn identify_now(&self, _: SocketAddr, _: SocketAddr, _: Instant) -> Option<Caller> {
        Some(self.0.clone())
    }
}

/// The inode of `/proc/<pid>/ns/<kind>`.
pub fn ns_inode(pid: u32, kind: &str) -> std::io::Result<u64> {
    let l = std::fs::read_link(format!("/proc/{pid}/ns/{kind}"))?;
    let s = l.to_string_lossy();
    s.rsplit_once('[')
        .and_then(|(_, r)| r.strip_suffix(']'))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("unexpected namespace link {s}")))
}
