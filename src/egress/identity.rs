//! Who is calling: the process behind a proxied connection, as the decision sees it.
//!
//! The proxy asks an [`Identify`] for the [`Caller`] of each accepted connection, given the
//! connection's two ends as the proxy's socket sees them. The real implementation
//! ([`super::procfs::ProcIdentity`]) finds the client socket in the sandbox's network namespace
//! and its owning processes; tests of the decision use a fixed table instead.

use std::net::SocketAddr;
use std::time::Instant;

/// The calling process, and what the decision matches binaries against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The lowest PID holding the socket.
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
}

/// Identifies one exec of a sandbox: the inode of its PID namespace (every exec of a sandbox
/// has one of its own; a fork or an orphan stays in it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
        "ambiguous shared socket ownership: inode {inode} is held by PIDs {pids:?} with different policy identities"
    )]
    Ambiguous { inode: u64, pids: Vec<u32> },
    #[error(
        "binary integrity check failed: Binary integrity violation: {path} hash changed (cached: {cached}, current: {current})"
    )]
    Integrity {
        path: String,
        cached: String,
        current: String,
    },
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
}

/// A fixed caller for every connection: for tests of the proxy without processes, and for a
/// proxy whose policy does not depend on binaries.
pub struct FixedCaller(pub Caller);

impl Identify for FixedCaller {
    fn identify(&self, _: SocketAddr, _: SocketAddr, _: Instant) -> Result<Caller, IdentityError> {
        Ok(self.0.clone())
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
