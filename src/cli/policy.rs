//! The policy flags that `run`, `check` and `serve` share ([`PolicyArgs`]).

use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, ValueEnum};

use super::common::{IDENTITY, ISOLATION, LIMITS, REPORTING};
use super::values::{
    parse_count, parse_cpus, parse_hostname, parse_id, parse_log_level, parse_memory_arg,
    parse_size_arg,
};
use crate::logging::LogFormat;
use crate::policy::{NetworkMode, PolicyFlags};

/// Sandbox policy knobs shared by `run` and `serve`.
#[derive(Debug, Clone, Args)]
pub struct PolicyArgs {
    /// Read-write working directory of the child (must exist). Each command that flattens
    /// these flags states its own default (`mut_arg`).
    #[arg(long, value_name = "DIR", help_heading = ISOLATION)]
    pub workdir: Option<PathBuf>,

    /// Extra read-only path (repeatable).
    #[arg(long = "ro", value_name = "PATH", help_heading = ISOLATION)]
    pub ro: Vec<PathBuf>,

    /// Extra read-write path (repeatable).
    #[arg(long = "rw", value_name = "PATH", help_heading = ISOLATION)]
    pub rw: Vec<PathBuf>,

    /// Extra path that must never be readable by the child, even below a granted directory
    /// (repeatable). The TLS, token and service-account paths are always added.
    #[arg(long = "deny", value_name = "PATH", help_heading = ISOLATION)]
    pub deny: Vec<PathBuf>,

    /// Network access of the child. With --policy, given explicitly, it replaces the file's
    /// network_policies.
    #[arg(long, value_enum, default_value_t = NetworkArg::None, help_heading = ISOLATION)]
    pub network: NetworkArg,

    /// CPU seconds (user + system) of the whole exec tree, from the cgroup's CPU accounting;
    /// the tree is killed at the limit (reason cpu_limit). Without a cgroup: RLIMIT_CPU per
    /// process, reported degraded.
    #[arg(long, value_name = "SECS", allow_negative_numbers = true, value_parser = parse_count, help_heading = LIMITS)]
    pub cpu: Option<u64>,

    /// CPU bandwidth of the exec tree, in CPUs (e.g. 0.5, 2): the cgroup's CFS quota.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = parse_cpus, help_heading = LIMITS)]
    pub cpus: Option<u64>,

    /// Resident memory (swap off) of the whole exec tree: the memory cgroup's limit (degraded
    /// without one). Bytes; accepts suffixes (K, KiB, KB, M, MiB, MB, G, GiB, GB, T, TiB, TB).
    /// At least 1 MiB.
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true, value_parser = parse_memory_arg, help_heading = LIMITS)]
    pub memory: Option<u64>,

    /// Virtual address space per process (RLIMIT_AS). V8, Go, Java and Wasm runtimes reserve
    /// far more than they use: prefer --memory. Bytes; accepts suffixes (K, KiB, M, MiB, G,
    /// GiB). At least 1 MiB.
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true, value_parser = parse_memory_arg, help_heading = LIMITS)]
    pub address_space: Option<u64>,

    /// Processes and threads of the exec (pids cgroup; reason pids_limit when it held).
    /// Default 512. Without a pids cgroup it is RLIMIT_NPROC, shared by every process of the
    /// uid: degraded when given explicitly.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = parse_count, help_heading = LIMITS)]
    pub pids: Option<u64>,

    /// Largest file the child may write (RLIMIT_FSIZE, per file). Bytes; accepts suffixes
    /// (K, KiB, KB, M, MiB, MB, G, GiB, GB, T, TiB, TB).
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true, value_parser = parse_size_arg, help_heading = LIMITS)]
    pub file_size: Option<u64>,

    /// Open-file limit (RLIMIT_NOFILE).
    #[arg(long, value_name = "N", allow_negative_numbers = true, default_value = "1024", value_parser = parse_count, help_heading = LIMITS)]
    pub open_files: u64,

    /// User id the child runs as when we are root.
    #[arg(long, env = "OPENSHELL_SANDBOX_UID", value_name = "UID", allow_negative_numbers = true, value_parser = parse_id, help_heading = IDENTITY)]
    pub uid: Option<u32>,

    /// Group id the child runs as when we are root. Defaults to the uid.
    #[arg(long, env = "OPENSHELL_SANDBOX_GID", value_name = "GID", allow_negative_numbers = true, value_parser = parse_id, help_heading = IDENTITY)]
    pub gid: Option<u32>,

    /// Run even when a layer the policy asks for cannot be fully enforced; the report lists
    /// what was not.
    #[arg(long, help_heading = ISOLATION)]
    pub allow_degraded: bool,

    /// Size of the private tmpfs mounted on /tmp in the sandbox's view (ENOSPC past it).
    /// Bytes; accepts suffixes (K, KiB, M, MiB, G, GiB).
    #[arg(long, value_name = "BYTES", default_value = "256MiB", value_parser = parse_size_arg, help_heading = ISOLATION)]
    pub tmp_size: u64,

    /// Size of the private tmpfs mounted on /dev/shm in the sandbox's view, and the budget of
    /// its IPC namespace: SysV shared memory at most this much in all, message queues and
    /// semaphores a quarter each (docs/policy.md, "Shared memory").
    #[arg(long, value_name = "BYTES", default_value = "64MiB", value_parser = parse_size_arg, help_heading = ISOLATION)]
    pub shm_size: u64,

    /// Hostname inside the sandbox's view (its own UTS namespace).
    #[arg(long, value_name = "NAME", default_value = "sandbox", value_parser = parse_hostname, help_heading = ISOLATION)]
    pub hostname: String,

    /// Log level: off, error, warn, info, debug or trace, or directives such as
    /// `warn,openshell_sandbox=debug`. RUST_LOG, when set, wins.
    #[arg(long, env = "OPENSHELL_LOG_LEVEL", default_value = "warn", value_parser = parse_log_level, help_heading = REPORTING)]
    pub log_level: String,

    /// Format of our own lines on stderr: with `json` the log, run's summary line and the
    /// error lines are JSON. The command's stderr is the command's and passes through as it
    /// wrote it (--merge-output sends it to stdout).
    #[arg(long, value_enum, default_value_t = LogFormat::Human, help_heading = REPORTING)]
    pub log_format: LogFormat,
}

impl PolicyArgs {
    /// The flags of `m` that were given explicitly (on the command line or through their
    /// environment variable); a flag left at its clap default is `None`, so that it never
    /// overrides a policy file.
    pub fn explicit(&self, m: &ArgMatches) -> PolicyFlags {
        let given = |id: &str| {
            matches!(
                m.value_source(id),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        };
        PolicyFlags {
            workdir: self.workdir.clone(),
            ro: self.ro.clone(),
            rw: self.rw.clone(),
            deny: self.deny.clone(),
            network: given("network").then(|| self.network.into()),
            cpu: self.cpu,
            cpus_millis: self.cpus,
            memory: self.memory,
            address_space: self.address_space,
            pids: self.pids,
            file_size: self.file_size,
            open_files: given("open_files").then_some(self.open_files),
            uid: self.uid,
            gid: self.gid,
            allow_degraded: self.allow_degraded,
            tmp_size: given("tmp_size").then_some(self.tmp_size),
            shm_size: given("shm_size").then_some(self.shm_size),
            hostname: given("hostname").then(|| self.hostname.clone()),
        }
    }
}

/// Every flag with clap's defaults filled in as if given. Only for a caller without a policy
/// file (`serve`), where a default and an absent flag mean the same; with a file, use
/// [`PolicyArgs::explicit`], or a default would override the file.
impl From<&PolicyArgs> for PolicyFlags {
    fn from(a: &PolicyArgs) -> Self {
        PolicyFlags {
            workdir: a.workdir.clone(),
            ro: a.ro.clone(),
            rw: a.rw.clone(),
            deny: a.deny.clone(),
            network: Some(a.network.into()),
            cpu: a.cpu,
            cpus_millis: a.cpus,
            memory: a.memory,
            address_space: a.address_space,
            pids: a.pids,
            file_size: a.file_size,
            open_files: Some(a.open_files),
            uid: a.uid,
            gid: a.gid,
            allow_degraded: a.allow_degraded,
            tmp_size: Some(a.tmp_size),
            shm_size: Some(a.shm_size),
            hostname: Some(a.hostname.clone()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NetworkArg {
    /// A network namespace of its own with only `lo`: loopback bind and connect work, any
    /// other connect fails with ENETUNREACH.
    None,
    /// The host's network (still no raw packet, vsock or non-route netlink sockets).
    All,
}

impl From<NetworkArg> for NetworkMode {
    fn from(n: NetworkArg) -> Self {
        match n {
            NetworkArg::None => NetworkMode::None,
            NetworkArg::All => NetworkMode::All,
        }
    }
}
