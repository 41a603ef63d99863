//! Command-line definitions.
//!
//! Every flag that OpenShell's own supervisor reads from an environment variable reads the same
//! variable here (see `shared/spec/gateway-protocol.md` §5.1), so the pod command line and env
//! that the OpenShell Kubernetes driver builds work unchanged.
//!
//! Dispatch is by the first word (see `main.rs`): `run`, `check`, `serve`, `install`,
//! `copy-self`, `certs`. Anything else, including no arguments at all, is the supervisor
//! (`serve`), because that is how a sandbox pod starts us: `openshell-sandbox --workdir /sandbox`.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::policy::{NetworkMode, ParseSizeError, PolicyFlags, parse_size};

/// `openshell-sandbox run [OPTIONS] -- CMD [ARGS...]`
#[derive(Debug, Parser)]
#[command(
    name = "openshell-sandbox run",
    about = "Run one command under the full sandbox and stream its output",
    version
)]
pub struct RunArgs {
    #[command(flatten)]
    pub policy: PolicyArgs,

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
    /// truncation marker line ends the stream. Accepts suffixes (K, KiB, M, MiB, G, GiB).
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true, value_parser = parse_size_arg)]
    pub max_output: Option<u64>,

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
    /// (held by a lock under /run for the run's lifetime), so one run cannot drain the per-uid
    /// kernel budgets (inotify instances, queued signals, ...) of another. The default lies
    /// above systemd's container range and below 2^31; see the README.
    #[arg(long, value_name = "START-END", default_value = "1900000000-1900000999", value_parser = parse_uid_range)]
    pub uid_range: UidRange,

    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
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

    /// Network access of the child.
    #[arg(long, value_enum, default_value_t = NetworkArg::None)]
    pub network: NetworkArg,

    /// CPU-time limit in seconds (RLIMIT_CPU).
    #[arg(long, value_name = "SECS", allow_negative_numbers = true, value_parser = parse_count)]
    pub cpu: Option<u64>,

    /// Address-space limit in bytes (RLIMIT_AS), plus a memory cgroup limit when one is available.
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true, value_parser = parse_size_arg)]
    pub memory: Option<u64>,

    /// Process/thread limit (RLIMIT_NPROC, plus a pids cgroup when available).
    #[arg(long, value_name = "N", allow_negative_numbers = true, default_value = "512", value_parser = parse_count)]
    pub pids: u64,

    /// Largest file the child may write (RLIMIT_FSIZE, per file).
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

    /// Log level (error, warn, info, debug, trace). RUST_LOG, when set, wins.
    #[arg(long, env = "OPENSHELL_LOG_LEVEL", default_value = "warn")]
    pub log_level: String,

    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
}

/// Every flag as given or defaulted. A caller that knows clap's value source should leave
/// defaulted values `None` instead, so that they do not override a policy file.
impl From<&PolicyArgs> for PolicyFlags {
    fn from(a: &PolicyArgs) -> Self {
        PolicyFlags {
            workdir: a.workdir.clone(),
            ro: a.ro.clone(),
            rw: a.rw.clone(),
            deny: a.deny.clone(),
            network: Some(a.network.into()),
            cpu: a.cpu,
            memory: a.memory,
            pids: Some(a.pids),
            file_size: a.file_size,
            open_files: Some(a.open_files),
            uid: a.uid,
            gid: a.gid,
            allow_degraded: a.allow_degraded,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

/// `openshell-sandbox check [--json]`
#[derive(Debug, Parser)]
#[command(
    name = "openshell-sandbox check",
    about = "Report what this kernel supports and whether the default policy is fully enforceable",
    version
)]
pub struct CheckArgs {
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,

    /// Check the dial-back path to the gateway instead, with serve's env and flags (handled
    /// before this parser, in main.rs; see `check --gateway --help` and docs/gateway.md).
    #[arg(long)]
    pub gateway: bool,
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

/// Subcommands other than the default supervisor, for `--help` output.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one command under the sandbox (see `run --help`).
    Run,
    /// Report kernel support for each sandbox layer.
    Check,
    /// Run the supervisor (also the default when no subcommand is given).
    Serve,
    /// Copy this binary atomically into a hostPath directory.
    Install,
    /// OpenShell's init-container contract: copy this binary to DEST.
    CopySelf,
    /// Generate the mTLS CA, server and client certificates.
    Certs,
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
    fn run_requires_a_command_after_double_dash() {
        assert!(RunArgs::try_parse_from(["run"]).is_err());
        let a = RunArgs::try_parse_from(["run", "--timeout", "2", "--", "sh", "-c", "x"]).unwrap();
        assert_eq!(a.command.len(), 3);
        assert_eq!(a.timeout, Some(2.0));
    }
}
