//! Command-line definitions.
//!
//! Every flag that OpenShell's own supervisor reads from an environment variable reads the same
//! variable here (see `shared/spec/gateway-protocol.md` §5.1), so the pod command line and env
//! that the OpenShell Kubernetes driver builds work unchanged.
//!
//! Dispatch is by the first word (see `main.rs`): `run`, `check`, `serve`, `install`,
//! `copy-self`, `certs`, `help`. No arguments at all, or a flag first, is the supervisor
//! (`serve`), because that is how a sandbox pod starts us: `openshell-sandbox --workdir /sandbox`.
//! Any other first word is OpenShell's main-process command when a gateway is configured, and a
//! typo otherwise.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

use crate::policy::{NetworkMode, ParseSizeError, PolicyFlags, parse_size};

/// The default of `--uid-range`: above systemd's container range, below 2^31 (README).
pub const DEFAULT_UID_RANGE: &str = "1900000000-1900000999";

/// `openshell-sandbox run [OPTIONS] -- CMD [ARGS...]`
#[derive(Debug, Parser)]
#[command(
    name = "openshell-sandbox run",
    bin_name = "openshell-sandbox run",
    about = "Run one command under the full sandbox and stream its output",
    version
)]
pub struct RunArgs {
    #[command(flatten)]
    pub policy: PolicyArgs,

    /// OpenShell sandbox-policy YAML (filesystem_policy, landlock, process, network_policies;
    /// docs/policy.md). Flags given explicitly override it; --ro, --rw and --deny add to its
    /// lists.
    #[arg(long = "policy", value_name = "FILE")]
    pub policy_file: Option<PathBuf>,

    /// Make a fresh, empty read-write scratch directory, export it as TMPDIR, remove it afterwards.
    #[arg(long)]
    pub scratch: bool,

    /// Set a variable in the child's environment (repeatable).
    #[arg(long = "env", value_name = "K=V", value_parser = parse_env_pair)]
    pub env: Vec<(String, String)>,

    /// Copy a variable from our environment into the child's (repeatable). Supervisor-internal
    /// variables (OPENSHELL_*, TLS and token paths) are refused.
    #[arg(long = "inherit-env", value_name = "NAME")]
    pub inherit_env: Vec<String>,

    /// Wall-clock limit in seconds: SIGTERM to the whole tree, a short grace, then SIGKILL.
    #[arg(long, value_name = "SECS", allow_negative_numbers = true, value_parser = parse_positive_secs)]
    pub timeout: Option<f64>,

    /// Grace between SIGTERM and SIGKILL when the wall-clock limit fires, in seconds.
    #[arg(long, value_name = "SECS", allow_negative_numbers = true, default_value = "1", value_parser = parse_nonneg_secs)]
    pub kill_grace: f64,

    /// Cap on each of stdout and stderr; past it output is drained and discarded, then a
    /// truncation marker line ends the stream. Bytes; accepts suffixes (K, KiB, KB, M, MiB,
    /// MB, G, GiB, GB, T, TiB, TB).
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true, value_parser = parse_size_arg)]
    pub max_output: Option<u64>,

    // ---- output limits and streams (issue 12) ----
    /// What happens when a stream passes --max-output: `truncate` drains and discards the
    /// rest; `kill` stops the whole tree at once (reason output_limit).
    #[arg(long, value_enum, value_name = "MODE", default_value_t = OnOutputLimit::Truncate)]
    pub on_output_limit: OnOutputLimit,

    /// Give the child one pipe for both stdout and stderr (it all goes to our stdout), so
    /// their order is kept. Automatic when our stdout and stderr are the same open file.
    #[arg(long)]
    pub merge_output: bool,
    // ---- end of output limits and streams ----
    /// Write the exit report as JSON to this path.
    #[arg(long, value_name = "PATH")]
    pub report_json: Option<PathBuf>,

    /// Do not print the one-line summary on stderr.
    #[arg(long, short = 'q')]
    pub quiet: bool,

    /// Give the child a fresh pseudo-terminal (stdin, stdout and stderr, its controlling
    /// terminal) instead of pipes. When our stdin is a terminal it is put in raw mode for the
    /// run and restored on every exit (normal, signal, timeout). Without --tty the child's
    /// stdin is always a pipe we feed, never our own terminal.
    #[arg(long)]
    pub tty: bool,

    /// When we are root and no --uid is given: the uids that concurrent runs take one each
    /// (held by a lock in --uid-lease-dir for the run's lifetime), so one run cannot drain the
    /// per-uid kernel budgets (inotify instances, queued signals, ...) of another. The default
    /// lies above systemd's container range and below 2^31; see the README.
    #[arg(long, value_name = "START-END", default_value = DEFAULT_UID_RANGE, value_parser = parse_uid_range)]
    pub uid_range: UidRange,

    /// Where runs hold their uids (a lock file per uid, root's directory): every run that may
    /// share uids with this one must use the same directory, e.g. a node-wide hostPath for
    /// runs in several pods of one node. Default /run/openshell-sandbox-uids.
    #[arg(long, env = "OPENSHELL_SANDBOX_UID_LEASE_DIR", value_name = "DIR")]
    pub uid_lease_dir: Option<PathBuf>,

    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
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
        Ok(a)
    }
}

/// Sandbox policy knobs shared by `run` and `serve`.
#[derive(Debug, Clone, Args)]
pub struct PolicyArgs {
    /// Read-write working directory of the child (must exist). Default: the current directory.
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<PathBuf>,

    /// Extra read-only path (repeatable).
    #[arg(long = "ro", value_name = "PATH")]
    pub ro: Vec<PathBuf>,

    /// Extra read-write path (repeatable).
    #[arg(long = "rw", value_name = "PATH")]
    pub rw: Vec<PathBuf>,

    /// Extra path that must never be readable by the child, even below a granted directory
    /// (repeatable). The TLS, token and service-account paths are always added.
    #[arg(long = "deny", value_name = "PATH")]
    pub deny: Vec<PathBuf>,

    /// Network access of the child. With --policy, given explicitly, it replaces the file's
    /// network_policies.
    #[arg(long, value_enum, default_value_t = NetworkArg::None)]
    pub network: NetworkArg,

    // ---- resource limits (issue 12) ----
    /// CPU seconds (user + system) of the whole exec tree, from the cgroup's CPU accounting;
    /// the tree is killed at the limit (reason cpu_limit). Without a cgroup: RLIMIT_CPU per
    /// process, reported degraded.
    #[arg(long, value_name = "SECS", allow_negative_numbers = true, value_parser = parse_count)]
    pub cpu: Option<u64>,

    /// CPU bandwidth of the exec tree, in CPUs (e.g. 0.5, 2): the cgroup's CFS quota.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = parse_cpus)]
    pub cpus: Option<u64>,

    /// Resident memory (swap off) of the whole exec tree: the memory cgroup's limit (degraded
    /// without one). Bytes; accepts suffixes (K, KiB, KB, M, MiB, MB, G, GiB, GB, T, TiB, TB).
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true, value_parser = parse_size_arg)]
    pub memory: Option<u64>,

    /// Virtual address space per process (RLIMIT_AS). V8, Go, Java and Wasm runtimes reserve
    /// far more than they use: prefer --memory. Bytes; accepts suffixes (K, KiB, M, MiB, G, GiB).
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true, value_parser = parse_size_arg)]
    pub address_space: Option<u64>,

    /// Processes and threads of the exec (pids cgroup; reason pids_limit when it held).
    /// Default 512. Without a pids cgroup it is RLIMIT_NPROC, shared by every process of the
    /// uid: degraded when given explicitly.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = parse_count)]
    pub pids: Option<u64>,
    // ---- end of resource limits ----
    /// Largest file the child may write (RLIMIT_FSIZE, per file). Bytes; accepts suffixes
    /// (K, KiB, KB, M, MiB, MB, G, GiB, GB, T, TiB, TB).
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true, value_parser = parse_size_arg)]
    pub file_size: Option<u64>,

    /// Open-file limit (RLIMIT_NOFILE).
    #[arg(long, value_name = "N", allow_negative_numbers = true, default_value = "1024", value_parser = parse_count)]
    pub open_files: u64,

    /// User id the child runs as when we are root.
    #[arg(long, env = "OPENSHELL_SANDBOX_UID", value_name = "UID", allow_negative_numbers = true, value_parser = parse_id)]
    pub uid: Option<u32>,

    /// Group id the child runs as when we are root. Defaults to the uid.
    #[arg(long, env = "OPENSHELL_SANDBOX_GID", value_name = "GID", allow_negative_numbers = true, value_parser = parse_id)]
    pub gid: Option<u32>,

    /// Run even when a layer the policy asks for cannot be fully enforced; the report lists
    /// what was not.
    #[arg(long)]
    pub allow_degraded: bool,

    /// Size of the private tmpfs mounted on /tmp in the sandbox's view (ENOSPC past it).
    /// Bytes; accepts suffixes (K, KiB, M, MiB, G, GiB).
    #[arg(long, value_name = "BYTES", default_value = "256MiB", value_parser = parse_size_arg)]
    pub tmp_size: u64,

    /// Size of the private tmpfs mounted on /dev/shm in the sandbox's view, and the budget of
    /// its IPC namespace: SysV shared memory at most this much in all, message queues and
    /// semaphores a quarter each (docs/policy.md, "Shared memory").
    #[arg(long, value_name = "BYTES", default_value = "64MiB", value_parser = parse_size_arg)]
    pub shm_size: u64,

    /// Hostname inside the sandbox's view (its own UTS namespace).
    #[arg(long, value_name = "NAME", default_value = "sandbox", value_parser = parse_hostname)]
    pub hostname: String,

    /// Log level: off, error, warn, info, debug or trace, or directives such as
    /// `warn,openshell_sandbox=debug`. RUST_LOG, when set, wins.
    #[arg(long, env = "OPENSHELL_LOG_LEVEL", default_value = "warn", value_parser = parse_log_level)]
    pub log_level: String,

    /// Log format on stderr; `json` also covers run's summary line and the final error line.
    #[arg(long, value_enum, default_value_t = LogFormat::Human)]
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
    /// No sockets except AF_UNIX; no TCP bind or connect.
    None,
    /// Normal network access (still no raw packet, vsock or non-route netlink sockets).
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

/// `openshell-sandbox check [POLICY FLAGS] [--policy FILE] [--explain] [--json]`
#[derive(Debug, Parser)]
#[command(
    name = "openshell-sandbox check",
    bin_name = "openshell-sandbox check",
    about = "Report what this kernel supports and whether a policy (the default one, or the one the flags and --policy describe) is fully enforceable here; exit 1 if not. Changes nothing on the system",
    version
)]
pub struct CheckArgs {
    #[command(flatten)]
    pub policy: PolicyArgs,

    /// OpenShell sandbox-policy YAML, as for `run --policy`.
    #[arg(long = "policy", value_name = "FILE")]
    pub policy_file: Option<PathBuf>,

    /// As for `run`: when we are root and no --uid is given, a run takes its uid from here.
    #[arg(long, value_name = "START-END", default_value = DEFAULT_UID_RANGE, value_parser = parse_uid_range)]
    pub uid_range: UidRange,

    /// Also print the effective Landlock rules (path, access) and the seccomp rules
    /// (syscall, condition, action).
    #[arg(long)]
    pub explain: bool,

    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,

    /// Check the dial-back path to the gateway instead, with serve's env and flags (handled
    /// before this parser, in main.rs; see `check --gateway --help` and docs/gateway.md).
    #[arg(long)]
    pub gateway: bool,

    /// The policy flags that were given explicitly (see [`RunArgs::flags`]).
    #[arg(skip)]
    pub flags: PolicyFlags,
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
    /// Run the pod supervisor: dial the OpenShell gateway and serve exec (the default)
    Serve,
    /// Copy this binary atomically into a hostPath directory (node installer)
    Install,
    /// OpenShell's init-container contract: copy this binary to DEST
    CopySelf,
    /// Generate the mTLS CA, server and client certificates
    Certs,
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
        "help",
    ];
}

/// The top level, for `openshell-sandbox --help` only.
#[derive(Debug, Parser)]
#[command(
    name = "openshell-sandbox",
    bin_name = "openshell-sandbox",
    about = "Sandbox supervisor for OpenShell: run generated code under Landlock, seccomp, rlimits, cgroups and an unprivileged uid",
    version,
    disable_help_subcommand = true,
    after_help = "With no subcommand, or with flags only, the binary is the pod supervisor (`serve`), \
as a sandbox pod starts it. With a gateway configured (OPENSHELL_ENDPOINT), a first word that is no \
subcommand is the main process's command, as in OpenShell.\n\n\
`openshell-sandbox help SUBCOMMAND` or `openshell-sandbox SUBCOMMAND --help` shows its flags."
)]
pub struct TopArgs {
    #[command(subcommand)]
    pub command: Option<Command>,
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
mod tests {
    use super::*;

    #[test]
    fn env_pairs_are_validated() {
        assert_eq!(parse_env_pair("A=b=c").unwrap(), ("A".into(), "b=c".into()));
        assert!(
            parse_env_pair("noequals")
                .unwrap_err()
                .contains("missing `=`")
        );
        assert!(parse_env_pair("=x").unwrap_err().contains("empty"));
        assert!(parse_env_pair("1A=x").unwrap_err().contains("not a valid"));
    }

    #[test]
    fn counts_reject_negative_zero_and_overflow() {
        assert!(parse_count("-1").unwrap_err().contains("negative"));
        assert!(parse_count("0").is_err());
        assert!(
            parse_count("99999999999999999999999")
                .unwrap_err()
                .contains("64 bits")
        );
        assert_eq!(parse_count("12").unwrap(), 12);
    }

    #[test]
    fn ids_exclude_the_sentinel() {
        assert!(parse_id("4294967295").is_err());
        assert_eq!(parse_id("65534").unwrap(), 65534);
    }

    #[test]
    fn uid_ranges_are_validated() {
        assert_eq!(
            parse_uid_range("2000-2001").unwrap(),
            UidRange {
                start: 2000,
                end: 2001
            }
        );
        assert!(parse_uid_range("5000-3000").is_err());
        assert!(parse_uid_range("0-5000").is_err());
        assert!(parse_uid_range("5000").is_err());
        assert!(parse_uid_range("5000-4294967295").is_err());
    }

    #[test]
    fn typos_suggest_the_nearest_subcommand() {
        assert_eq!(nearest_subcommand("rnu"), Some("run"));
        assert_eq!(nearest_subcommand("chekc"), Some("check"));
        assert_eq!(nearest_subcommand("cert"), Some("certs"));
        assert_eq!(nearest_subcommand("copyself"), Some("copy-self"));
        assert_eq!(nearest_subcommand("python3"), None);
    }

    #[test]
    fn log_levels_are_validated() {
        assert!(parse_log_level("bogus").is_err());
        assert!(parse_log_level("info").is_ok());
        assert!(parse_log_level("warn,openshell_sandbox=debug").is_ok());
        assert!(parse_log_level("x=loud").is_err());
    }

    #[test]
    fn defaults_are_not_explicit_flags() {
        let v = |a: &[&str]| {
            a.iter()
                .map(|s| OsString::from(*s))
                .collect::<Vec<OsString>>()
        };
        let a = RunArgs::parse_argv(&v(&["run", "--", "true"])).unwrap();
        assert_eq!(a.flags.network, None);
        assert_eq!(a.flags.pids, None);
        assert_eq!(a.flags.open_files, None);
        let a = RunArgs::parse_argv(&v(&[
            "run",
            "--network",
            "none",
            "--pids",
            "512",
            "--",
            "true",
        ]))
        .unwrap();
        assert_eq!(a.flags.network, Some(NetworkMode::None));
        assert_eq!(a.flags.pids, Some(512));
    }

    #[test]
    fn run_requires_a_command_after_double_dash() {
        assert!(RunArgs::try_parse_from(["run"]).is_err());
        let a = RunArgs::try_parse_from(["run", "--timeout", "2", "--", "sh", "-c", "x"]).unwrap();
        assert_eq!(a.command.len(), 3);
        assert_eq!(a.timeout, Some(2.0));
    }
}
