//! The sandbox policy: plain data plus validation. Nothing here makes a syscall that changes
//! state; turning a policy into kernel objects is `sandbox::prepare`, and enforcing them is the
//! last step, in the child (see `sandbox/mod.rs`).

mod error;
mod flags;
mod fs;
mod ipc;
pub mod network;
pub mod openshell;
mod shared;
mod size;

use std::path::PathBuf;

pub use error::PolicyError;
pub use flags::PolicyFlags;
pub use fs::{
    FsPolicy, FsRule, PRIVATE_TMPFS, PathAccess, WriteAs, absent_root_only_denies,
    default_secret_paths, expand_grants, expand_grants_skipping,
};
pub use ipc::IpcLimits;
pub use shared::{
    DEFAULT_SHM_SIZE, DEFAULT_TMP_SIZE, Identity, Limits, NOBODY, NamespacePolicy, NetworkMode,
    PID_MAX_LIMIT, RunLimits, ViewFiles,
};
pub use size::{MIN_MEMORY, ParseSizeError, parse_memory, parse_size};

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
        let root = crate::sys::process::euid() == 0;
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
