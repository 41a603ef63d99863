//! The policy knobs of the command line, as plain data. `cli` turns its clap values into
//! [`PolicyFlags`]; `policy` never sees a clap type (no cycle between the two).

use std::path::PathBuf;

use super::shared::{Limits, NamespacePolicy, NetworkMode};

/// What the command line asked for. `None` (and `false`, and an empty list) means "not given":
/// the default applies, or, with a policy file, the file's value. A caller that knows which
/// flags were given explicitly (clap's value source) leaves the others `None`, so that a
/// default never overrides the file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyFlags {
    /// `--workdir`.
    pub workdir: Option<PathBuf>,
    /// `--ro`, added to the file's read-only list.
    pub ro: Vec<PathBuf>,
    /// `--rw`, added to the file's read-write list.
    pub rw: Vec<PathBuf>,
    /// `--deny`, added to the supervisor's secret paths.
    pub deny: Vec<PathBuf>,
    /// `--network`; `None` is `NetworkMode::None` without a file.
    pub network: Option<NetworkMode>,
    /// `--cpu`.
    pub cpu: Option<u64>,
    /// `--cpus`, in thousandths of a CPU.
    pub cpus_millis: Option<u64>,
    /// `--memory`.
    pub memory: Option<u64>,
    /// `--address-space`.
    pub address_space: Option<u64>,
    /// `--pids`; `None` is the default of [`Limits`](Limits).
    pub pids: Option<u64>,
    /// `--file-size`.
    pub file_size: Option<u64>,
    /// `--open-files`; `None` is the default of [`Limits`](Limits).
    pub open_files: Option<u64>,
    /// `--uid` / `OPENSHELL_SANDBOX_UID`.
    pub uid: Option<u32>,
    /// `--gid` / `OPENSHELL_SANDBOX_GID`.
    pub gid: Option<u32>,
    /// `--allow-degraded`.
    pub allow_degraded: bool,
    /// `--tmp-size`.
    pub tmp_size: Option<u64>,
    /// `--shm-size`.
    pub shm_size: Option<u64>,
    /// `--hostname`.
    pub hostname: Option<String>,
}

impl PolicyFlags {
    /// The sandbox view these flags ask for, with the defaults where a flag was not given.
    pub fn namespaces(&self) -> NamespacePolicy {
        let d = NamespacePolicy::default();
        NamespacePolicy {
            tmp_size: self.tmp_size.unwrap_or(d.tmp_size),
            shm_size: self.shm_size.unwrap_or(d.shm_size),
            hostname: self.hostname.clone().unwrap_or(d.hostname),
            files: None,
        }
    }

    /// The sandbox's workdir: `--workdir`, else `default_workdir`, made absolute (the flags
    /// alone and a policy file resolve it alike).
    pub fn workdir(
        &self,
        default_workdir: &std::path::Path,
    ) -> Result<PathBuf, super::PolicyError> {
        let workdir = self
            .workdir
            .clone()
            .unwrap_or_else(|| default_workdir.to_path_buf());
        std::path::absolute(&workdir).map_err(|source| super::PolicyError::Workdir {
            path: workdir.clone(),
            source,
        })
    }

    /// The limits these flags ask for, with [`Limits::default`](Limits) where a flag
    /// was not given.
    pub fn limits(&self) -> Limits {
        let d = Limits::default();
        Limits {
            cpu_secs: self.cpu,
            cpu_quota_millis: self.cpus_millis,
            memory_bytes: self.memory,
            address_space_bytes: self.address_space,
            pids: self.pids.unwrap_or(d.pids),
            pids_requested: self.pids.is_some(),
            file_size_bytes: self.file_size,
            open_files: self.open_files.unwrap_or(d.open_files),
        }
    }
}
