//! The model: the parts of OpenShell's `SandboxPolicy` tree (its proto messages and its policy
//! YAML) that a supervisor maps onto its own policy. Its serde form is OpenShell's policy YAML.
//! Read by every source (`yaml.rs`, `wire.rs`) and by the mapping (`map.rs`, `live.rs`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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
    /// validates them; [`resolve`](super::resolve) reports a non-empty map as
    /// [`NetworkOutcome::EgressDenied`](super::NetworkOutcome::EgressDenied), and
    /// [`Resolved::proxy_rules`](super::Resolved::proxy_rules) hands it to the proxy.
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
