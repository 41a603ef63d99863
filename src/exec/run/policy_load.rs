//! The policy of `run` and `check`: the flags, or a policy file with the flags on top, and the
//! network rules that come with it.

use std::path::Path;

use crate::exec::RunError;
use crate::policy::openshell::{self, MapWarning};
use crate::policy::{Policy, PolicyFlags};

/// A policy and what came with it.
pub struct LoadedPolicy {
    pub policy: Policy,
    /// best_effort skips and ignored keys of the policy file, for the log.
    pub warnings: Vec<MapWarning>,
    /// The policy file names the identity itself (a numeric `run_as_user`/`run_as_group`, or
    /// `sandbox` where the image has such a user): a per-run uid must not replace it.
    pub file_sets_identity: bool,
    /// The network rules (the file's `network_policies` and `--allow-net`): the sandbox's
    /// egress proxy keeps them. `None`: no rules, no proxy.
    pub network: Option<crate::policy::network::NetworkRules>,
}

/// The policy of `run` and `check`: the flags alone, or `--policy FILE` with the explicitly
/// given flags on top (docs/policy.md). A file that asks for what we cannot enforce is an
/// error naming the key.
pub fn load_policy(
    flags: &PolicyFlags,
    file: Option<&Path>,
    default_workdir: &Path,
    allow_net: &[String],
) -> Result<LoadedPolicy, RunError> {
    let Some(path) = file else {
        let policy = Policy::from_args(flags.clone(), default_workdir, Vec::new())?;
        return Ok(LoadedPolicy {
            network: crate::exec::egress::rules_for(&policy, None, allow_net)?,
            policy,
            warnings: Vec::new(),
            file_sets_identity: false,
        });
    };
    let file_err = |source| RunError::PolicyFile {
        path: path.to_path_buf(),
        source,
    };
    let text =
        std::fs::read_to_string(path).map_err(|e| file_err(openshell::YamlError::Read(e)))?;
    let model = openshell::from_yaml(&text).map_err(file_err)?;
    let host = openshell::Host::current();
    // Network rules are the egress proxy's: the mapped policy keeps the sandbox's own network
    // namespace for them (an explicit --network replaces the file's network section).
    let resolved = openshell::resolve(&model, flags, default_workdir, Vec::new(), &host).map_err(
        |source| RunError::PolicyMap {
            path: path.to_path_buf(),
            source,
        },
    )?;
    let network =
        crate::exec::egress::rules_for(&resolved.policy, resolved.proxy_rules(&model), allow_net)
            .map_err(|e| e.in_file(path))?;
    let (policy, warnings) = (resolved.policy, resolved.warnings);
    let names = |v: &str| {
        (!v.is_empty() && v != "sandbox") || (v == "sandbox" && host.sandbox_user.is_some())
    };
    let file_sets_identity = model
        .process
        .as_ref()
        .is_some_and(|p| names(&p.run_as_user) || names(&p.run_as_group));
    Ok(LoadedPolicy {
        policy,
        warnings,
        file_sets_identity,
        network,
    })
}

/// Put the policy file's warnings in the log, naming the file.
pub fn log_policy_warnings(file: Option<&Path>, warnings: &[MapWarning]) {
    for w in warnings {
        let file = file.map(|p| p.display().to_string()).unwrap_or_default();
        tracing::warn!("--policy {file}: {w}");
    }
}
