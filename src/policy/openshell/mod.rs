//! OpenShell's sandbox policy: one model, two sources.
//!
//! - [`SandboxPolicy`] is the model: the parts of OpenShell's `SandboxPolicy` tree
//!   (its proto messages and its policy YAML) that a supervisor maps onto its own
//!   policy. Its serde form is OpenShell's policy YAML.
//! - [`from_yaml`] decodes a policy file (`run --policy FILE`, `/etc/openshell/policy.yaml`);
//!   every level rejects unknown keys, naming the key.
//! - [`decode_config_response`] / [`decode_policy`] decode the gateway's GetSandboxConfig
//!   answer. prost drops unknown fields silently, which would fail open, so the bytes are first
//!   walked against the field numbers of every message (`wire.rs`), and any field number we do
//!   not know is an error that names it.
//! - [`resolve`] maps the model, plus the command-line flags that were given explicitly, onto
//!   our [`Policy`](super::Policy); [`check_live_change`] holds the rules on what a live
//!   sandbox may change; [`default_policy`] is the policy used when there is none.
//!
//! `docs/policy.md` describes the mapping key by key.

mod live;
mod map;
mod model;
mod wire;
mod yaml;

#[cfg(test)]
mod map_tests;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use live::{LiveChangeError, check_live_change};
pub use map::{
    Compatibility, Host, MapError, MapWarning, NetworkOutcome, Resolved, resolve, resolve_identity,
};
pub use model::{
    CredentialBinding, FilesystemPolicy, L7Match, L7Rule, LandlockPolicy, NetworkBinary,
    NetworkEndpoint, NetworkPolicyRule, Opaque, ProcessPolicy, QueryMatcher, SandboxPolicy,
};
pub use wire::{
    ConfigResponse, FailureMode, PolicySourceKind, ProtoError, UnknownField,
    decode_config_response, decode_policy, encode_policy,
};
pub use yaml::{YamlError, from_yaml, to_yaml};

/// Where the supervisor looks for a policy when the gateway has none, in order.
pub const LOCAL_POLICY_PATHS: [&str; 2] =
    ["/etc/openshell/policy.yaml", "/etc/navigator/policy.yaml"];

/// Where a local policy came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalSource {
    /// The first of the paths that exists, parsed.
    File(PathBuf),
    /// No file exists: [`default_policy`].
    Default,
}

/// A local policy file exists and cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("local policy {}: {source}", path.display())]
pub struct LocalPolicyError {
    pub path: PathBuf,
    pub source: YamlError,
}

/// The local fallback: the first existing file of `paths` (normally
/// [`LOCAL_POLICY_PATHS`]), else [`default_policy`].
///
/// OpenShell also falls back to the default when the file cannot be parsed; we refuse
/// instead. The default may grant more than the file meant to (it lists /etc, /opt ...), and a
/// policy that was asked for and cannot be read must not be silently replaced by a wider one.
pub fn load_local(paths: &[&Path]) -> Result<(SandboxPolicy, LocalSource), LocalPolicyError> {
    for path in paths {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(LocalPolicyError {
                    path: path.to_path_buf(),
                    source: YamlError::Read(e),
                });
            }
        };
        return from_yaml(&text)
            .map(|p| (p, LocalSource::File(path.to_path_buf())))
            .map_err(|source| LocalPolicyError {
                path: path.to_path_buf(),
                source,
            });
    }
    Ok((default_policy(), LocalSource::Default))
}

/// Read-only paths of OpenShell's restrictive default, in its order.
pub const OPENSHELL_DEFAULT_READ_ONLY: &[&str] = &[
    "/usr",
    "/lib",
    "/proc",
    "/dev/urandom",
    "/app",
    "/etc",
    "/var/log",
];
/// Read-write paths of OpenShell's restrictive default.
pub const OPENSHELL_DEFAULT_READ_WRITE: &[&str] = &["/tmp", "/dev/null"];

/// What we add to OpenShell's default, and why (docs/policy.md says the same):
/// - `/bin`, `/sbin`, `/lib32`, `/lib64`, `/libx32`: on images that are not usr-merged
///   (Alpine, busybox) the shell and the loader live there; OpenShell hit the same.
/// - `/opt`: where images install runtimes; `/opt/openshell` (us) stays denied.
const EXTRA_READ_ONLY: &[&str] = &["/bin", "/sbin", "/lib32", "/lib64", "/libx32", "/opt"];
/// The character devices programs expect to open read-write, as in our flag-only default.
/// `/dev/urandom` moves here from OpenShell's read-only list: writing to it only mixes in
/// entropy.
const EXTRA_DEVICES: &[&str] = &[
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
];

/// The policy used when neither the gateway nor a local file gives one: OpenShell's restrictive
/// default plus [`EXTRA_READ_ONLY`] and the devices of our own default; a writable
/// `/tmp` (private when the namespace layer gives one), the workdir, `best_effort`, the
/// `sandbox` identity, no network rules (all egress denied). Missing paths are skipped
/// (`best_effort`).
pub fn default_policy() -> SandboxPolicy {
    let read_only = OPENSHELL_DEFAULT_READ_ONLY
        .iter()
        .filter(|p| **p != "/dev/urandom")
        .chain(EXTRA_READ_ONLY)
        .map(|s| s.to_string())
        .collect();
    let read_write = OPENSHELL_DEFAULT_READ_WRITE
        .iter()
        .chain(EXTRA_DEVICES)
        .map(|s| s.to_string())
        .collect();
    SandboxPolicy {
        version: 1,
        filesystem: Some(FilesystemPolicy {
            include_workdir: true,
            read_only,
            read_write,
        }),
        landlock: Some(LandlockPolicy {
            compatibility: "best_effort".into(),
        }),
        process: None,
        network_policies: BTreeMap::new(),
        network_middlewares: None,
    }
}

/// OpenShell's proxy baseline: added to a policy that has at least one network rule.
pub const PROXY_BASELINE_READ_ONLY: &[&str] = &[
    "/usr",
    "/lib",
    "/etc",
    "/app",
    "/var/log",
    "/proc",
    "/dev/urandom",
];
/// The read-write part of the proxy baseline.
pub const PROXY_BASELINE_READ_WRITE: &[&str] = &["/tmp"];

/// Add the missing proxy-baseline paths, as the supervisor does before it loads a policy and
/// syncs it back. Only when the policy has a network rule; only paths
/// for which `exists` says yes; a path already in either list is left where it is (user paths
/// are never removed or moved). Returns whether the policy changed, i.e. whether to sync it.
///
/// The GPU baseline is not applied: this sandbox grants no GPU devices (docs/policy.md).
pub fn enrich_with_baseline(policy: &mut SandboxPolicy, exists: &dyn Fn(&Path) -> bool) -> bool {
    if policy.network_policies.is_empty() {
        return false;
    }
    let fs = policy
        .filesystem
        .get_or_insert_with(FilesystemPolicy::default);
    let mut changed = false;
    for (paths, write) in [
        (PROXY_BASELINE_READ_ONLY, false),
        (PROXY_BASELINE_READ_WRITE, true),
    ] {
        for p in paths {
            let listed = fs.read_only.iter().chain(&fs.read_write).any(|l| l == p);
            if listed || !exists(Path::new(p)) {
                continue;
            }
            if write {
                fs.read_write.push(p.to_string());
            } else {
                fs.read_only.push(p.to_string());
            }
            changed = true;
        }
    }
    changed
}

/// Remove the gateway-composed `_provider_` rules, as the supervisor does before it syncs a
/// local policy back with `UpdateConfig`. Returns whether anything was removed.
pub fn strip_provider_rules(policy: &mut SandboxPolicy) -> bool {
    let before = policy.network_policies.len();
    policy
        .network_policies
        .retain(|k, _| !k.starts_with("_provider_"));
    before != policy.network_policies.len()
}
