//! The sandbox policy: plain data plus validation. Nothing here makes a syscall that changes
//! state; turning a policy into kernel objects is `sandbox::prepare`, and enforcing them is the
//! last step, in the child (see `sandbox/mod.rs`).

mod flags;
mod fs;
mod ipc;
pub mod network;
pub mod openshell;
mod size;

use std::path::PathBuf;
use std::time::Duration;

pub use flags::PolicyFlags;
pub use fs::{
    FsPolicy, FsRule, PRIVATE_TMPFS, PathAccess, WriteAs, absent_root_only_denies,
    default_secret_paths, expand_grants, expand_grants_skipping,
};
pub use ipc::IpcLimits;
pub use size::{MIN_MEMORY, ParseSizeError, parse_memory, parse_size};

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
    /// Absolute. Inside a bound host tree (`/etc`) it must exist on the host as a mount point.
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

/// The complete policy for every exec run by one supervisor.
#[derive(Debug, Clone)]
pub struct Policy {
    pub fs: FsPolicy,
    pub network: NetworkMode,
    pub limits: Limits,
    /// `Some` when we are root and must switch identity; `None` keeps our own uid/gid.
    pub identity: Option<Identity>,
    /// Run even when a layer cannot be fully enforced (the report says which).
    pub allow_degraded: bool,
    pub namespaces: NamespacePolicy,
}

/// Wall-clock and output limits belong to one run, not to the policy of the supervisor.
#[derive(Debug, Clone, Default)]
pub struct RunLimits {
    pub timeout: Option<Duration>,
    pub kill_grace: Duration,
    pub max_output: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("workdir {path}: {source}")]
    Workdir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("workdir {0} is not a directory")]
    WorkdirNotDir(PathBuf),
    #[error(
        "workdir {}: {} is where the sandbox gets a private tmpfs of its own, so it cannot be the workdir (that would be the host's shared {} instead); run in a directory of your own below it (`mkdir {}/work && cd {}/work`), or name one with --workdir DIR (--scratch does not change the workdir: it adds a private TMPDIR)",
        path.display(), tmpfs.display(), tmpfs.display(), tmpfs.display(), tmpfs.display()
    )]
    WorkdirIsPrivateTmpfs { path: PathBuf, tmpfs: PathBuf },
    #[error("--{flag} {path}: {source}")]
    GrantRoot {
        flag: &'static str,
        path: PathBuf,
        source: Box<crate::sys::walk::WalkError>,
    },
    #[error(
        "--{flag} {path}: read-write on {resolved} would cover the system directory {system}; refused"
    )]
    SystemWrite {
        flag: &'static str,
        path: PathBuf,
        resolved: PathBuf,
        system: PathBuf,
    },
    #[error("path {path} is both granted (--{flag}) and denied; a denied path cannot be granted")]
    GrantedSecret { flag: &'static str, path: PathBuf },
    #[error("--gid was given without --uid (OPENSHELL_SANDBOX_UID/GID must be supplied together)")]
    GidWithoutUid,
    #[error("--{0} 0 is not allowed: tmpfs reads size 0 as unlimited")]
    ZeroSize(&'static str),
    #[error("the limit {name} = {value} is too large for the kernel (max {max})")]
    LimitTooLarge {
        name: &'static str,
        value: u64,
        max: u64,
    },
}

impl Policy {
    /// Change the sandbox identity after construction (e.g. `run`'s per-run uid). The
    /// filesystem policy keeps its own copy, for the symlink rule of the grant walk, so the two
    /// must always be set together.
    pub fn set_identity(&mut self, id: Identity) {
        self.identity = Some(id);
        self.fs.sandbox_identity = Some(id);
    }

    /// Check the policy for contradictions before anything is prepared.
    pub fn validate(&self) -> Result<(), PolicyError> {
        // RLIM_INFINITY is u64::MAX; a "limit" that large would silently mean "unlimited".
        let max = u64::MAX / 2;
        let l = &self.limits;
        for (name, v) in [
            ("cpu", l.cpu_secs),
            ("memory", l.memory_bytes),
            ("address-space", l.address_space_bytes),
            ("cpus", l.cpu_quota_millis),
            ("file-size", l.file_size_bytes),
            ("pids", Some(l.pids)),
            ("open-files", Some(l.open_files)),
        ] {
            if let Some(v) = v
                && v > max
            {
                return Err(PolicyError::LimitTooLarge {
                    name,
                    value: v,
                    max,
                });
            }
        }
        // pids.max takes at most PID_MAX_LIMIT (EINVAL above it): refuse here, with a clear
        // error, not in the middle of making the exec's cgroup.
        if l.pids > PID_MAX_LIMIT {
            return Err(PolicyError::LimitTooLarge {
                name: "pids",
                value: l.pids,
                max: PID_MAX_LIMIT,
            });
        }
        // NOFILE cannot exceed fs.nr_open (1 Mi by default); the kernel answers EPERM otherwise.
        if l.open_files > 1 << 20 {
            return Err(PolicyError::LimitTooLarge {
                name: "open-files",
                value: l.open_files,
                max: 1 << 20,
            });
        }
        for (name, v) in [
            ("tmp-size", self.namespaces.tmp_size),
            ("shm-size", self.namespaces.shm_size),
        ] {
            if v == 0 {
                return Err(PolicyError::ZeroSize(name));
            }
        }
        self.fs.validate()
    }
}

impl Policy {
    /// Build the policy from command-line flags alone (no policy file). `default_workdir`
    /// applies when `--workdir` is absent; `extra_deny` adds paths (TLS, tokens) that must
    /// never be readable. `cli::PolicyArgs` converts into [`PolicyFlags`].
    pub fn from_args(
        args: impl Into<PolicyFlags>,
        default_workdir: &std::path::Path,
        extra_deny: Vec<PathBuf>,
    ) -> Result<Policy, PolicyError> {
        let args: PolicyFlags = args.into();
        let workdir = args.workdir(default_workdir)?;
        let mut fs = FsPolicy::with_defaults(workdir);
        fs.read_only = args.ro.clone();
        fs.read_write = args.rw.clone();
        fs.deny.extend(args.deny.iter().cloned());
        fs.deny.extend(extra_deny);
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let identity = match (args.uid, args.gid) {
            (None, Some(_)) => return Err(PolicyError::GidWithoutUid),
            (Some(uid), gid) => Some(Identity {
                uid,
                gid: gid.unwrap_or(uid),
            }),
            (None, None) if root => Some(Identity {
                uid: NOBODY,
                gid: NOBODY,
            }),
            (None, None) => None,
        };
        // A non-root supervisor cannot switch: its child keeps our own uid and gid.
        fs.sandbox_identity = if root { identity } else { None };
        let policy = Policy {
            fs,
            network: args.network.unwrap_or(NetworkMode::None),
            limits: args.limits(),
            identity,
            allow_degraded: args.allow_degraded,
            namespaces: args.namespaces(),
        };
        policy.validate()?;
        Ok(policy)
    }
}
