//! `openshell-sandbox run`'s flags.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};

use super::common::{DEFAULT_UID_RANGE, IDENTITY, ISOLATION, LIMITS, OUTPUT, REPORTING, VERSION};
use super::policy::PolicyArgs;
use super::values::{
    UidRange, parse_env_pair, parse_nonneg_secs, parse_positive_secs, parse_size_arg,
    parse_uid_range,
};
use crate::policy::PolicyFlags;

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

/// `--on-output-limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOutputLimit {
    /// Drain and discard past the cap; the command runs on.
    Truncate,
    /// Kill the whole tree when the cap is reached.
    Kill,
}
