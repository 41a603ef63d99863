//! `openshell-sandbox check`'s flags.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{CommandFactory, FromArgMatches, Parser};

use super::common::{DEFAULT_UID_RANGE, IDENTITY, ISOLATION, VERSION};
use super::policy::PolicyArgs;
use super::values::{UidRange, parse_uid_range};
use crate::policy::PolicyFlags;

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
