//! [`Prepared`]: every kernel object and row of one sandbox, built once by `prepare` and read
//! by the child (`child/`), `check` and the report.

use seccompiler::BpfProgram;

use super::layer::LayerStatus;
use super::{cgroup, decide, identity, landlock, namespaces, ownership, rlimits};
use crate::policy::PathAccess;

/// Everything the child needs, built once.
#[derive(Debug)]
pub struct Prepared {
    pub landlock: Option<landlock::PreparedRuleset>,
    pub seccomp: Option<BpfProgram>,
    pub rlimits: Vec<rlimits::Rlimit>,
    pub identity: identity::Switch,
    pub cgroups: Option<cgroup::Root>,
    /// The namespaces every exec joins (empty when none could be made).
    pub view: namespaces::View,
    /// Whose ids the writes to the workdir and the `--rw` grants carry, and whether `run` hands
    /// the workdir over (ownership.rs).
    pub ownership: ownership::Ownership,
    /// The policy grants read on /proc (so on the exec's fresh /proc too).
    pub proc_rule: bool,
    pub layers: Vec<LayerStatus>,
    pub landlock_abi: i32,
    /// The Landlock path rules as installed (path, access, is a directory), for
    /// `check --explain`: what the ruleset holds, not what the policy's lists expand to.
    pub fs_rules: Vec<(std::path::PathBuf, PathAccess, bool)>,
    /// The supervisor's pid, for the parent-death race check.
    pub supervisor_pid: libc::pid_t,
    /// The network rules the seccomp filter and the Landlock ruleset were built for.
    pub network: decide::Network,
    /// The rules installed in every command, in words (`check --explain`).
    pub installed: decide::Installed,
}
