//! Command-line definitions.
//!
//! Every flag that OpenShell's own supervisor reads from an environment variable reads the same
//! variable here (docs/gateway.md), so the pod command line and env
//! that the OpenShell Kubernetes driver builds work unchanged.
//!
//! Dispatch is by the first word (see `main.rs`): `run`, `check`, `serve`, `install`,
//! `copy-self`, `certs`, `completions`, `man`, `help`. A flag first is the supervisor (`serve`),
//! because that is how a sandbox pod starts us: `openshell-sandbox --workdir /sandbox`; so is no
//! argument at all once a gateway or a main process is configured (else it prints a short
//! usage). Any other first word is OpenShell's main-process command when a gateway is
//! configured, and a typo otherwise.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

pub use crate::logging::LogFormat;
use crate::policy::{NetworkMode, ParseSizeError, PolicyFlags, parse_memory, parse_size};

/// The default of `--uid-range`: above systemd's container range, below 2^31 (README).
pub const DEFAULT_UID_RANGE: &str = "1900000000-1900000999";

/// What `--version` prints after the program name: the version, the commit and the build
/// profile (build.rs).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("OSB_GIT_COMMIT"),
    ", ",
    env!("OSB_BUILD_PROFILE"),
    " build)"
);

/// The exit code of every usage error and every failure of the sandbox itself (docker's
/// convention), so that a script can tell them from a command's own exit codes.
pub const USAGE_EXIT: u8 = crate::exit::Exit::Ours.code();

// The help headings of `run` (and of the policy flags that `check` and `serve` share).
const ISOLATION: &str = "Isolation";
const LIMITS: &str = "Limits";
const OUTPUT: &str = "Output";
const IDENTITY: &str = "Identity and environment";
const REPORTING: &str = "Reporting";

/// `openshell-sandbox run [OPTIONS] [--] CMD [ARGS...]`
#[derive(Debug, Parser)]
#[command(
    name = "openshell-sandbox run",
    bin_name = "openshell-sandbox run",
    about = "Run one command under the full sandbox and stream its output",
    override_usage = "openshell-sandbox run [OPTIONS] [--] CMD [ARGS]...",
    after_help = "The first word that is no flag of run's starts the command: flags after it are \
the command's. `--` before CMD is accepted, and needed when CMD itself starts with `-`.\n\n\
Exit code: the command's own; 128+N when signal N killed it; 124 on --timeout; 125 when \
openshell-sandbox failed or refused (bad flags or policy, unusable workdir, a layer that cannot \
be enforced, processes that survived); 126 when CMD cannot be executed; 127 when it is not found.",
    version = VERSION,
    mut_arg("workdir", |a| a.help(
        "Read-write working directory of the command (must exist). Default: the current \
         directory, unless that is a home directory (or one above it), / or in the system's \
         own trees: those only when named here"
    )),
)]
pub struct RunArgs {
    #[command(flatten)]
    pub policy: PolicyArgs,

    /// OpenShell sandbox-policy YAML (filesystem_policy, landlock, process, network_policies;
    /// docs/policy.md). Flags given explicitly override it; --ro, --rw and --deny add to its
    /// lists.
    #[arg(long = "policy", value_name = "FILE", help_heading = ISOLATION)]
    pub policy_file: Option<PathBuf>,

    /// Let the command reach HOST on PORT (default 443) through the sandbox's egress proxy
    /// (repeatable): a network rule added to the policy's, for BINARY only (an absolute path
    /// or glob; default `/**`, every program of the sandbox). The host may be a glob
    /// (`*.example.com`). Children get HTTP_PROXY and friends; docs/egress.md.
    #[arg(long = "allow-net", value_name = "HOST[:PORT][,BINARY]", help_heading = ISOLATION)]
    pub allow_net: Vec<String>,

    /// A credential the egress proxy holds for the run (repeatable): its value is read from
    /// our variable NAME and never enters the sandbox; the command's NAME is a placeholder the
    /// proxy replaces only in requests to HOST:PORT (default 443), which a network rule must
    /// allow. Without @HOST, the policy's `credential_binding: {provider: NAME}` says where.
    #[arg(long = "credential", value_name = "NAME@HOST[:PORT]", help_heading = ISOLATION)]
    pub credential: Vec<String>,

    /// Make a fresh, empty read-write scratch directory, export it as TMPDIR, remove it afterwards.
    #[arg(long, help_heading = ISOLATION)]
    pub scratch: bool,

    /// Set a variable in the child's environment (repeatable).
    #[arg(long = "env", value_name = "K=V", value_parser = parse_env_pair, help_heading = IDENTITY)]
    pub env: Vec<(String, String)>,

    /// Copy a variable from our environment into the child's (repeatable). Supervisor-internal
    /// variables (OPENSHELL_*, TLS and token paths) are refused.
    #[arg(long = "inherit-env", value_name = "NAME", help_heading = IDENTITY)]
    pub inherit_env: Vec<String>,

    /// Wall-clock limit in seconds: SIGTERM to the whole tree, a short grace, then SIGKILL
    /// (exit code 124).
    #[arg(long, value_name = "SECS", allow_negative_numbers = true, value_parser = parse_positive_secs, help_heading = LIMITS)]
    pub timeout: Option<f64>,

    /// Grace between SIGTERM and SIGKILL when the wall-clock limit fires, in seconds.
    #[arg(long, value_name = "SECS", allow_negative_numbers = true, default_value = "1", value_parser = parse_nonneg_secs, help_heading = LIMITS)]
    pub kill_grace: f64,

    /// Cap on each of stdout and stderr; past it output is drained and discarded, then a
    /// truncation marker line ends the stream. Bytes; accepts suffixes (K, KiB, KB, M, MiB,
    /// MB, G, GiB, GB, T, TiB, TB).
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true, value_parser = parse_size_arg, help_heading = OUTPUT)]
    pub max_output: Option<u64>,

    /// What happens when a stream passes --max-output: `truncate` drains and discards the
    /// rest; `kill` stops the whole tree at once (reason output_limit).
    #[arg(long, value_enum, value_name = "MODE", default_value_t = OnOutputLimit::Truncate, help_heading = OUTPUT)]
    pub on_output_limit: OnOutputLimit,

    /// Give the child one pipe for both stdout and stderr (it all goes to our stdout), so
    /// their order is kept. Automatic when our stdout and stderr are the same open file.
    #[arg(long, help_heading = OUTPUT)]
    pub merge_output: bool,

    /// Write the exit report as JSON to this path.
    #[arg(long, value_name = "PATH", help_heading = REPORTING)]
    pub report_json: Option<PathBuf>,

    /// Never print the one-line summary on stderr, not even when the sandbox ended the run,
    /// nor warnings (a best_effort path of the policy file that is missing): only errors,
    /// unless --log-level is given.
    #[arg(long, short = 'q', conflicts_with = "verbose", help_heading = REPORTING)]
    pub quiet: bool,

    /// Print the one-line summary on stderr after every run. Without it the summary appears
    /// only when the sandbox decided the end (timeout, a limit, the output cap, a kill of
    /// ours), when the run was degraded or when containment failed.
    #[arg(long, short = 'v', help_heading = REPORTING)]
    pub verbose: bool,

    /// Give the child a fresh pseudo-terminal (stdin, stdout and stderr, its controlling
    /// terminal) instead of pipes. When our stdin is a terminal it is put in raw mode for the
    /// run and restored on every exit (normal, signal, timeout). Without --tty the child's
    /// stdin is always a pipe we feed, never our own terminal.
    #[arg(long, help_heading = OUTPUT)]
    pub tty: bool,

    /// When we are root and no --uid is given: the uids that concurrent runs take one each
    /// (held by a lock in --uid-lease-dir for the run's lifetime), so one run cannot drain the
    /// per-uid kernel budgets (inotify instances, queued signals, ...) of another. The default
    /// lies above systemd's container range and below 2^31; see the README.
    #[arg(long, value_name = "START-END", default_value = DEFAULT_UID_RANGE, value_parser = parse_uid_range, help_heading = IDENTITY)]
    pub uid_range: UidRange,

    /// Where runs hold their uids (a lock file per uid, root's directory): every run that may
    /// share uids with this one must use the same directory, e.g. a node-wide hostPath for
    /// runs in several pods of one node. Default /run/openshell-sandbox-uids.
    #[arg(long, env = "OPENSHELL_SANDBOX_UID_LEASE_DIR", value_name = "DIR")]
    pub uid_lease_dir: Option<PathBuf>,

    /// The command and its arguments.
    #[arg(trailing_var_arg = true, required = true, num_args = 1.., value_name = "CMD")]
    pub command: Vec<OsString>,

    /// The policy flags that were given explicitly (filled from clap's value sources by
    /// [`RunArgs::parse_argv`]).
    #[arg(skip)]
    pub flags: PolicyFlags,
}

impl RunArgs {
    /// Parse `argv` (`argv[0]` is `run`), recording which policy flags were given explicitly.
    pub fn parse_argv(argv: &[OsString]) -> Result<RunArgs, clap::Error> {
        let m = RunArgs::command().try_get_matches_from(argv)?;
        let mut a = RunArgs::from_arg_matches(&m)?;
        a.flags = a.policy.explicit(&m);
        // -q silences our warnings too; a level given explicitly still wins.
        if a.quiet
            && !matches!(
                m.value_source("log_level"),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        {
            a.policy.log_level = "error".into();
        }
        Ok(a)
    }
}

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

/// `--on-output-limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOutputLimit {
    /// Drain and discard past the cap; the command runs on.
    Truncate,
    /// Kill the whole tree when the cap is reached.
    Kill,
}

/// `--cpus N` (fractional) in thousandths of a CPU.
fn parse_cpus(s: &str) -> Result<u64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number of CPUs (e.g. 0.5, 2)"))?;
    if !v.is_finite() || v < 0.001 {
        return Err(format!("`{s}`: --cpus must be at least 0.001"));
    }
    if v > 65536.0 {
        return Err(format!("`{s}`: --cpus is at most 65536"));
    }
    Ok((v * 1000.0).round() as u64)
}

/// `openshell-sandbox check [POLICY FLAGS] [--policy FILE] [--explain] [--json] [-- COMMAND]`
#[derive(Debug, Parser)]
#[command(
    name = "openshell-sandbox check",
    bin_name = "openshell-sandbox check",
    about = "Report what this kernel supports, whether a policy (the default one, or the one the flags and --policy describe) is fully enforceable here, and whether programs would start under it; exit 1 if not. Changes nothing on the system",
    after_help = "Exit code: 0 when the policy is fully enforceable here and the programs checked would start, 1 when not, 125 for \
bad flags.",
    version = VERSION,
    mut_arg("workdir", |a| a.help(check_workdir_help())),
)]
pub struct CheckArgs {
    #[command(flatten)]
    pub policy: PolicyArgs,

    /// OpenShell sandbox-policy YAML, as for `run --policy`.
    #[arg(long = "policy", value_name = "FILE", help_heading = ISOLATION)]
    pub policy_file: Option<PathBuf>,

    /// A network rule, as for `run --allow-net` (repeatable).
    #[arg(long = "allow-net", value_name = "HOST[:PORT][,BINARY]", help_heading = ISOLATION)]
    pub allow_net: Vec<String>,

    /// A credential, as for `run --credential` (repeatable): `--explain` lists its bindings,
    /// never its value.
    #[arg(long = "credential", value_name = "NAME@HOST[:PORT]", help_heading = ISOLATION)]
    pub credential: Vec<String>,

    /// Answer whether the egress proxy would let a connection to HOST:PORT through, and why
    /// (exit 0 allowed, 1 denied), from the policy's network rules, without a run. The
    /// addresses the name resolves to are checked only at connect time.
    #[arg(long, value_name = "HOST:PORT")]
    pub egress: Option<String>,

    /// With --egress: the calling program's absolute path (matched as the proxy matches the
    /// executable). Without it: the binaries of the rule whose endpoint matches.
    #[arg(long, value_name = "PATH", requires = "egress")]
    pub binary: Option<String>,

    /// As for `run`: when we are root and no --uid is given, a run takes its uid from here.
    #[arg(long, value_name = "START-END", default_value = DEFAULT_UID_RANGE, value_parser = parse_uid_range, help_heading = IDENTITY)]
    pub uid_range: UidRange,

    /// Also print the effective Landlock rules (path, access) and the seccomp rules
    /// (syscall, condition, action).
    #[arg(long)]
    pub explain: bool,

    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,

    /// A command to check: whether it would start in the sandbox (the program, found as `run`
    /// finds it, and every interpreter it needs are in the view). Without one, `check` looks
    /// at /bin/sh, /usr/bin/env and the dynamic loader /bin/sh names, where the policy grants
    /// them.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,

    /// Check the dial-back path to the gateway instead, with serve's env and flags (handled
    /// before this parser, in main.rs; see `check --gateway --help` and docs/gateway.md).
    #[arg(long)]
    pub gateway: bool,

    /// The policy flags that were given explicitly (see [`RunArgs::flags`]).
    #[arg(skip)]
    pub flags: PolicyFlags,
}

/// `check`'s `--workdir` help, with the directory a bare `check` really uses.
fn check_workdir_help() -> String {
    format!(
        "The workdir of the policy checked, as for `run --workdir` (granted read-write, and \
         checked writable by the sandbox uid). Default: the temp directory ({}), so that a bare \
         `check` speaks about the kernel",
        std::env::temp_dir().display()
    )
}

impl CheckArgs {
    /// Parse `argv` (`argv[0]` is `check`), recording which policy flags were given.
    pub fn parse_argv(argv: &[OsString]) -> Result<CheckArgs, clap::Error> {
        let m = CheckArgs::command().try_get_matches_from(argv)?;
        let mut a = CheckArgs::from_arg_matches(&m)?;
        a.flags = a.policy.explicit(&m);
        Ok(a)
    }
}

/// Log levels `--log-level` accepts, alone or as the level of a `target=level` directive.
const LOG_LEVELS: &[&str] = &["off", "error", "warn", "info", "debug", "trace"];

/// A level name, or comma-separated directives (`warn,openshell_sandbox=debug`). A bare word
/// that is no level would be read by tracing as a target name at level trace, so that `bogus`
/// silently enables everything below a target that does not exist: refuse it.
fn parse_log_level(s: &str) -> Result<String, String> {
    let level_ok = |l: &str| LOG_LEVELS.contains(&l.trim().to_ascii_lowercase().as_str());
    for part in s.split(',') {
        let ok = match part.split_once('=') {
            Some((target, level)) => !target.trim().is_empty() && level_ok(level),
            None => level_ok(part),
        };
        if !ok {
            return Err(format!(
                "`{part}` is not a log level: use one of {} (or target=level directives)",
                LOG_LEVELS.join(", ")
            ));
        }
    }
    Ok(s.to_owned())
}

fn parse_env_pair(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not K=V: missing `=`"))?;
    if k.is_empty() {
        return Err(format!("`{s}` has an empty variable name"));
    }
    if !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        || k.as_bytes()[0].is_ascii_digit()
    {
        return Err(format!(
            "`{k}` is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)"
        ));
    }
    if v.contains('\0') {
        return Err(format!("the value of `{k}` contains a NUL byte"));
    }
    Ok((k.to_owned(), v.to_owned()))
}

fn parse_hostname(s: &str) -> Result<String, String> {
    // sethostname(2) takes at most HOST_NAME_MAX (64) bytes.
    if s.is_empty() || s.len() > 64 {
        return Err(format!("`{s}`: a hostname is 1 to 64 bytes"));
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    {
        return Err(format!(
            "`{s}`: only letters, digits, `-` and `.` are allowed"
        ));
    }
    Ok(s.to_owned())
}

fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e: ParseSizeError| e.to_string())
}

fn parse_memory_arg(s: &str) -> Result<u64, String> {
    parse_memory(s).map_err(|e: ParseSizeError| e.to_string())
}

fn parse_count(s: &str) -> Result<u64, String> {
    let s = s.trim();
    if s.starts_with('-') {
        return Err(format!(
            "`{s}` is negative; a count must be a positive whole number"
        ));
    }
    let n: u64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a whole number, or does not fit in 64 bits"))?;
    if n == 0 {
        return Err("0 is not allowed here; the limit must be at least 1".into());
    }
    Ok(n)
}

fn parse_id(s: &str) -> Result<u32, String> {
    let s = s.trim();
    let n: u64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a numeric id"))?;
    // 2^32-1 is (uid_t)-1, the "no change" sentinel of setresuid; it can never be an identity.
    if n >= u64::from(u32::MAX) {
        return Err(format!("`{s}` is out of range (0 ..= 4294967294)"));
    }
    Ok(n as u32)
}

/// An inclusive range of uids for `run --uid-range`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    pub start: u32,
    pub end: u32,
}

fn parse_uid_range(s: &str) -> Result<UidRange, String> {
    let (a, b) = s
        .split_once('-')
        .ok_or_else(|| format!("`{s}` is not START-END"))?;
    let (start, end) = (parse_id(a)?, parse_id(b)?);
    if start > end {
        return Err(format!("`{s}`: START is above END"));
    }
    // Uids below 1000 are system accounts (Debian policy 9.2.2): never hand one to a run.
    if start < 1000 {
        return Err(format!("`{s}` includes system uids (below 1000)"));
    }
    Ok(UidRange { start, end })
}

fn parse_secs(s: &str, allow_zero: bool) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!(
            "`{s}` must be a finite, non-negative number of seconds"
        ));
    }
    if !allow_zero && v == 0.0 {
        return Err("0 seconds is not a usable limit".into());
    }
    if v > 365.0 * 24.0 * 3600.0 {
        return Err(format!(
            "`{s}` seconds is more than a year; refusing an overflowing limit"
        ));
    }
    Ok(v)
}

fn parse_positive_secs(s: &str) -> Result<f64, String> {
    parse_secs(s, false)
}

fn parse_nonneg_secs(s: &str) -> Result<f64, String> {
    parse_secs(s, true)
}

/// The subcommands, for the top-level `--help` and `help`. Each parses its own flags (see
/// `main.rs`); this enum only names and describes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Subcommand)]
pub enum Command {
    /// Run one command under the full sandbox, streaming its output
    Run,
    /// Say whether a policy is enforceable on this kernel; --explain prints its rules
    Check,
    /// Run the pod supervisor: dial the OpenShell gateway and serve exec (also: a flag first)
    Serve,
    /// Copy this binary atomically into a hostPath directory (node installer)
    Install,
    /// OpenShell's init-container contract: copy this binary to DEST
    CopySelf,
    /// Generate the mTLS CA, server and client certificates
    Certs,
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    Completions,
    /// Print the man page, or write every page to a directory (--dir)
    Man,
    /// Print this help, or the help of one subcommand
    Help,
}

impl Command {
    /// Every subcommand word, in help order.
    pub const WORDS: &[&str] = &[
        "run",
        "check",
        "serve",
        "install",
        "copy-self",
        "certs",
        "completions",
        "man",
        "help",
    ];
}

/// The top level, for `openshell-sandbox --help` only.
#[derive(Debug, Parser)]
#[command(
    name = "openshell-sandbox",
    bin_name = "openshell-sandbox",
    about = "Sandbox supervisor for OpenShell: run generated code under Landlock, seccomp, rlimits, cgroups and an unprivileged uid",
    version = VERSION,
    disable_help_subcommand = true,
    after_help = "With flags only, the binary is the pod supervisor (`serve`), as a sandbox pod \
starts it. With a gateway configured (OPENSHELL_ENDPOINT), no arguments at all is the supervisor \
too, and a first word that is no subcommand is the main process's command, as in OpenShell.\n\n\
`openshell-sandbox help SUBCOMMAND` or `openshell-sandbox SUBCOMMAND --help` shows its flags.\n\n\
Exit codes: 125 for a usage error or a failure of openshell-sandbox itself; `run` otherwise \
exits with its command's code (see `run --help`)."
)]
pub struct TopArgs {
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// What a bare `openshell-sandbox` prints when no gateway is configured: there is nothing to
/// supervise, so it is a person trying the binary.
pub const SHORT_USAGE: &str = "\
usage: openshell-sandbox run [OPTIONS] [--] CMD [ARGS]...   run one command in the sandbox
       openshell-sandbox check [OPTIONS]                   what this kernel can enforce
       openshell-sandbox --help                            every subcommand

As a sandbox pod's supervisor it needs a gateway: set OPENSHELL_ENDPOINT (see `serve --help`).";

/// `openshell-sandbox completions SHELL`
#[derive(Debug, Parser)]
#[command(
    name = "openshell-sandbox completions",
    bin_name = "openshell-sandbox completions",
    about = "Print a shell completion script on stdout",
    after_help = "bash: openshell-sandbox completions bash > /etc/bash_completion.d/openshell-sandbox\n\
zsh:  openshell-sandbox completions zsh > \"${fpath[1]}/_openshell-sandbox\"\n\
fish: openshell-sandbox completions fish > ~/.config/fish/completions/openshell-sandbox.fish",
    version = VERSION
)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `openshell-sandbox man [--dir DIR]`
#[derive(Debug, Parser)]
#[command(
    name = "openshell-sandbox man",
    bin_name = "openshell-sandbox man",
    about = "Print the man page (roff) on stdout, or write one page per subcommand to --dir",
    version = VERSION
)]
pub struct ManArgs {
    /// Write openshell-sandbox.1 and openshell-sandbox-SUBCOMMAND.1 into this directory
    /// (made when missing) instead.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// The parsed flags, or the exit code to return at once, after clap's own output: help and
/// `--version` on stdout with exit 0, a usage error on stderr with [`USAGE_EXIT`] (as a JSON
/// line when `--log-format json` is among the flags, so that stderr stays machine-readable).
/// Only before anything runs.
pub fn parsed<T>(r: Result<T, clap::Error>, argv: &[OsString]) -> Result<T, ExitCode> {
    match r {
        Ok(a) => Ok(a),
        Err(e) if !e.use_stderr() => {
            // A closed pipe (`--help | head`) is no error of ours.
            let _ = e.print();
            Err(ExitCode::SUCCESS)
        }
        Err(e) => {
            if json_requested(argv) {
                let text = e.render().to_string();
                crate::logging::json_line("ERROR", text.trim(), None);
            } else {
                let _ = e.print();
            }
            Err(ExitCode::from(USAGE_EXIT))
        }
    }
}

/// `--log-format json` (or `=json`) among the flags, before `--`.
fn json_requested(argv: &[OsString]) -> bool {
    let flags: Vec<&str> = argv
        .iter()
        .map_while(|a| a.to_str().filter(|a| *a != "--"))
        .collect();
    flags.windows(2).any(|w| w == ["--log-format", "json"]) || flags.contains(&"--log-format=json")
}

/// The subcommand word nearest to `word`, when it is near enough to be a typo of it.
pub fn nearest_subcommand(word: &str) -> Option<&'static str> {
    let (best, d) = Command::WORDS
        .iter()
        .map(|w| (*w, edit_distance(word, w)))
        .min_by_key(|(_, d)| *d)?;
    // A transposition (`rnu`) costs 2 here; allow up to a third of the word on top of that.
    (d <= 2.max(best.len() / 3)).then_some(best)
}

/// Levenshtein distance (insert, delete, substitute), by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
#[path = "cli_tests.rs"]
mod tests;
