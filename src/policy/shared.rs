//! The plain types every part of a policy shares: the network mode, the limits, the view's
//! knobs, the identity. Read by the parts (`flags.rs`, `fs.rs`) and by `Policy` (mod.rs).

use std::path::PathBuf;
use std::time::Duration;

/// What the child may do on the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// Nothing leaves the sandbox: a network namespace of its own with only `lo` (loopback
    /// bind and connect work, any other connect is ENETUNREACH). Only a degraded sandbox
    /// without that namespace falls back to AF_UNIX sockets and Landlock's TCP denial.
    None,
    /// Normal networking, minus raw packet, vsock and non-route netlink sockets.
    All,
}

/// Resource limits applied to each exec. `None` means "not limited by us".
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Limits {
    /// CPU seconds (user + system) of the whole exec tree, from the cgroup's CPU accounting;
    /// RLIMIT_CPU (per process) without a cgroup.
    pub cpu_secs: Option<u64>,
    /// CPU bandwidth in thousandths of a CPU (`--cpus 1.5` is 1500): the cgroup's CFS quota.
    pub cpu_quota_millis: Option<u64>,
    /// Resident memory (swap included) of the whole exec: the memory cgroup's limit only.
    pub memory_bytes: Option<u64>,
    /// RLIMIT_AS in bytes: virtual address space per process (`--address-space`).
    pub address_space_bytes: Option<u64>,
    /// pids.max of the exec's cgroup; RLIMIT_NPROC (per real uid, system wide) without one.
    pub pids: u64,
    /// `pids` was asked for explicitly, not the default: without a pids cgroup that request
    /// cannot be kept as documented (RLIMIT_NPROC is shared by the uid), so it is degraded.
    #[serde(skip)]
    pub pids_requested: bool,
    /// RLIMIT_FSIZE in bytes: the size any single file may reach.
    pub file_size_bytes: Option<u64>,
    /// RLIMIT_NOFILE.
    pub open_files: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            cpu_secs: None,
            cpu_quota_millis: None,
            memory_bytes: None,
            address_space_bytes: None,
            pids: 512,
            pids_requested: false,
            file_size_bytes: None,
            open_files: 1024,
        }
    }
}

/// The sandbox view's knobs (see `sandbox/namespaces.rs`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NamespacePolicy {
    /// Size of the private tmpfs on /tmp, bytes.
    pub tmp_size: u64,
    /// Size of the private tmpfs on /dev/shm, bytes; also the budget of the IPC namespace's
    /// SysV objects ([`IpcLimits`]).
    pub shm_size: u64,
    /// Hostname in the view's UTS namespace.
    pub hostname: String,
    /// Files the view shows read-only in a directory of their own (the egress proxy's CA).
    #[serde(skip)]
    pub files: Option<ViewFiles>,
}

/// A directory the view shows with exactly these files (mode 0444) and nothing else: a small
/// read-only tmpfs the view's helper fills, over whatever the host has there (which stays
/// hidden). Nothing is written on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewFiles {
    /// Absolute. Inside a bound host tree (`/etc`) the host's directory is the mount point, or,
    /// where the host lacks it, one the view makes in an overlay of that tree
    /// (`sandbox::view_root`); nothing is made on the host.
    pub dir: PathBuf,
    /// (name, contents); a name is one path component.
    pub files: Vec<(String, Vec<u8>)>,
}

pub const DEFAULT_TMP_SIZE: u64 = 256 << 20;
pub const DEFAULT_SHM_SIZE: u64 = 64 << 20;

impl Default for NamespacePolicy {
    fn default() -> Self {
        NamespacePolicy {
            tmp_size: DEFAULT_TMP_SIZE,
            shm_size: DEFAULT_SHM_SIZE,
            hostname: "sandbox".into(),
            files: None,
        }
    }
}

/// Who the child runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
}

/// The kernel's largest pid count (include/linux/threads.h on 64-bit): the most pids.max
/// accepts.
pub const PID_MAX_LIMIT: u64 = 4 * 1024 * 1024;

/// Default unprivileged identity when we are root and nothing else is configured.
pub const NOBODY: u32 = 65534;

/// Wall-clock and output limits belong to one run, not to the policy of the supervisor.
#[derive(Debug, Clone, Default)]
pub struct RunLimits {
    pub timeout: Option<Duration>,
    pub kill_grace: Duration,
    pub max_output: Option<u64>,
}
