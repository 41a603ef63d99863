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
mod wire;
mod yaml;

#[cfg(test)]
mod map_tests;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use live::{LiveChangeError, check_live_change};
pub use map::{
    Compatibility, Host, MapError, MapWarning, NetworkOutcome, Resolved, resolve, resolve_identity,
};
pub use wire::{
    ConfigResponse, FailureMode, PolicySourceKind, ProtoError, UnknownField,
    decode_config_response, decode_policy, encode_policy,
};
pub use yaml::{YamlError, from_yaml, to_yaml};

/// OpenShell's `SandboxPolicy` (proto `openshell.sandbox.v1.SandboxPolicy`; YAML top level).
/// Omitted sections are `None`: "not set", which is not the same as an empty section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxPolicy {
    /// Required in YAML; proto field 1.
    pub version: u32,
    /// YAML `filesystem_policy`, proto field 2 `filesystem`.
    #[serde(
        default,
        rename = "filesystem_policy",
        skip_serializing_if = "Option::is_none"
    )]
    pub filesystem: Option<FilesystemPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub landlock: Option<LandlockPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessPolicy>,
    /// Rule key -> egress allow rule. [`crate::policy::network::NetworkRules::compile`]
    /// validates them; [`resolve`] reports a non-empty map as
    /// [`NetworkOutcome::EgressDenied`], and [`Resolved::proxy_rules`] hands it to the proxy.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub network_policies: BTreeMap<String, NetworkPolicyRule>,
    /// HEAD-only middleware configs (proto field 6). A supervisor may ignore them; present only to
    /// accept the key. Never encoded.
    #[serde(default, skip_serializing)]
    pub network_middlewares: Option<Opaque>,
}

/// Proto `FilesystemPolicy`, YAML `filesystem_policy`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilesystemPolicy {
    /// Grant the workdir read-write.
    #[serde(default)]
    pub include_workdir: bool,
    #[serde(default)]
    pub read_only: Vec<String>,
    #[serde(default)]
    pub read_write: Vec<String>,
}

/// Proto `LandlockPolicy`. An empty `compatibility` is the same as an absent one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LandlockPolicy {
    /// `best_effort` or `hard_requirement`; anything else is refused by [`resolve`].
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub compatibility: String,
}

/// Proto `ProcessPolicy`. Empty strings are omitted fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessPolicy {
    /// `sandbox` or a number in 1 ..= 2^32-2.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub run_as_user: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub run_as_group: String,
}

/// One egress allow rule (proto `NetworkPolicyRule`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicyRule {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<NetworkEndpoint>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub binaries: Vec<NetworkBinary>,
}

/// Proto `NetworkBinary`: `path`; proto field 2 (`harness`) is deprecated and ignored by
/// OpenShell itself. The two switches are this supervisor's own YAML keys
/// (`docs/egress.md`, "Who is calling"); the proto has no field for them, so a policy from
/// the gateway always has them off, and encoding drops them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkBinary {
    pub path: String,
    /// Also admit a process whose ancestor is this binary (OpenShell's ancestor rule).
    #[serde(default, skip_serializing_if = "is_false")]
    pub descendants: bool,
    /// Admit the binary even when it may run code the sandbox could have written or chosen
    /// (the loader asked to preload or audit, or an executable mapping of a file the sandbox
    /// could write).
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_untrusted_code: bool,
}

/// Proto `NetworkEndpoint`. The L4 keys and the L7 keys that a rule is made of (`protocol`,
/// `tls`, `enforcement`, `access`, `rules`, `deny_rules`, `path`, `allow_encoded_slash`) are
/// modelled; the GraphQL, JSON-RPC and credential extras are accepted (so a valid OpenShell
/// file parses) but opaque. `port` 0 means unset; `port` and `ports` are exclusive in YAML.
/// [`crate::policy::network::NetworkRules::compile`] validates all of it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkEndpoint {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub port: u16,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub protocol: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tls: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub enforcement: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub access: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_ips: Vec<String>,
    /// `None`: absent. YAML can say `rules: []`, which is refused at compile time; the proto
    /// cannot tell an empty list from an absent one, so it decodes as `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<Vec<L7Rule>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny_rules: Option<Vec<L7DenyRule>>,
    /// Proto 15: the HTTP path glob that scopes an L7 endpoint; empty = every path.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// Proto 11.
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_encoded_slash: bool,
    /// Proto 18: written by the policy advisor, never trusted as an exact declared host.
    #[serde(default, skip_serializing_if = "is_false")]
    pub advisor_proposed: bool,
    // The GraphQL, JSON-RPC, MCP and credential extras (proto fields 12-14, 16, 17 and 19-26):
    // accepted, never looked at.
    #[serde(default, skip_serializing)]
    pub persisted_queries: Option<Opaque>,
    #[serde(default, skip_serializing)]
    pub graphql_persisted_queries: Option<Opaque>,
    #[serde(default, skip_serializing)]
    pub graphql_max_body_bytes: Option<Opaque>,
    #[serde(default, skip_serializing)]
    pub websocket_credential_rewrite: Option<Opaque>,
    /// Proto 17: placeholders in textual request bodies of this `rest` endpoint are replaced
    /// too (JSON, form, `text/*`, at most 256 KiB).
    #[serde(default, skip_serializing_if = "is_false")]
    pub request_body_credential_rewrite: bool,
    /// YAML `credential_binding: {provider: NAME}` (proto field 24): the credentials of
    /// provider NAME whose profile names no endpoint may go to this endpoint (in `serve`, the
    /// provider environment's values of that `credential_identity`); in `run` NAME is a
    /// `--credential` variable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_binding: Option<CredentialBinding>,
    #[serde(default, skip_serializing)]
    pub credential_signing: Option<Opaque>,
    #[serde(default, skip_serializing)]
    pub signing_service: Option<Opaque>,
    #[serde(default, skip_serializing)]
    pub signing_region: Option<Opaque>,
    #[serde(default, skip_serializing)]
    pub json_rpc_max_body_bytes: Option<Opaque>,
    #[serde(default, skip_serializing)]
    pub mcp: Option<Opaque>,
    #[serde(default, skip_serializing)]
    pub allow_uninspected_credentials: Option<Opaque>,
    #[serde(default, skip_serializing)]
    pub provider_credentialed: Option<Opaque>,
}

/// An endpoint's `credential_binding`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialBinding {
    pub provider: String,
}

/// Proto `L7Rule`: one allow clause.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct L7Rule {
    pub allow: L7Match,
}

/// Proto `L7DenyRule`: the fields of an allow clause, without the `allow:` wrapper.
pub type L7DenyRule = L7Match;

/// Proto `L7Allow` and `L7DenyRule` (the same field numbers): what one L7 request must look
/// like. The REST and SQL keys are modelled; the GraphQL and MCP keys are accepted and opaque.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct L7Match {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub method: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub command: String,
    /// Decoded query parameter name -> matcher.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub query: BTreeMap<String, QueryMatcher>,
    #[serde(default, skip_serializing)]
    pub operation_type: Option<Opaque>,
    #[serde(default, skip_serializing)]
    pub operation_name: Option<Opaque>,
    #[serde(default, skip_serializing)]
    pub fields: Option<Opaque>,
    #[serde(default, skip_serializing)]
    pub tool: Option<Opaque>,
    #[serde(default, skip_serializing)]
    pub params: Option<Opaque>,
}

/// Proto `L7QueryMatcher`. YAML writes it as one glob string or as `{any: [globs]}`; the
/// proto also has `glob`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueryMatcher {
    pub glob: String,
    pub any: Vec<String>,
}

impl Serialize for QueryMatcher {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        if self.any.is_empty() {
            return s.serialize_str(&self.glob);
        }
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry("any", &self.any)?;
        m.end()
    }
}

impl<'de> Deserialize<'de> for QueryMatcher {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Any {
            any: Vec<String>,
        }
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = QueryMatcher;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a glob string or a map `{any: [globs]}`")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<QueryMatcher, E> {
                Ok(QueryMatcher {
                    glob: v.to_string(),
                    any: Vec::new(),
                })
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                m: A,
            ) -> Result<QueryMatcher, A::Error> {
                let a = Any::deserialize(serde::de::value::MapAccessDeserializer::new(m))?;
                Ok(QueryMatcher {
                    glob: String::new(),
                    any: a.any,
                })
            }
        }
        d.deserialize_any(V)
    }
}

fn is_false(v: &bool) -> bool {
    !*v
}

/// A value that was present and deliberately not looked at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Opaque;

impl<'de> Deserialize<'de> for Opaque {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d)?;
        Ok(Opaque)
    }
}

fn is_zero(v: &u16) -> bool {
    *v == 0
}

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
