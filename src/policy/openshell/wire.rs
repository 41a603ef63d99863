//! The proto source: GetSandboxConfig's answer and its `SandboxPolicy`.
//!
//! prost skips a field number it does not know, so a newer gateway's policy field (a new
//! restriction, say) would vanish without a trace and the sandbox would run without it. Before
//! prost sees the bytes, [`walk`] reads every tag against the field numbers of each message of
//! OpenShell's policy, recursively, and collects every number it does not know, with where it was.
//! Fields that we know and deliberately do not enforce (L7 endpoint parts, middleware) are
//! `Opaque`: known, skipped, not looked into.

use std::collections::HashMap;

use prost::Message;

use super::model::{
    FilesystemPolicy, L7Match, L7Rule, LandlockPolicy, NetworkBinary, NetworkEndpoint,
    NetworkPolicyRule, Opaque, ProcessPolicy, QueryMatcher, SandboxPolicy,
};
use crate::proto::sandbox::v1 as pb;

/// A field number that no message of our schema declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownField {
    /// Where, as a field path from the decoded message: `policy.filesystem`, or `` for the
    /// top level.
    pub path: String,
    /// The proto message the field was found in, e.g. `FilesystemPolicy`.
    pub message: &'static str,
    pub number: u32,
}

impl std::fmt::Display for UnknownField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unknown field {} in {}", self.number, self.message)?;
        if !self.path.is_empty() {
            write!(f, " (at {})", self.path)?;
        }
        Ok(())
    }
}

/// Why a GetSandboxConfig answer or a policy was refused.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    /// Field numbers we do not know: decoding would drop them silently. The message names
    /// each number, so a FAILED report can carry it.
    #[error("the policy has fields this supervisor does not know, refused rather than ignored: {}",
        .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    UnknownFields(Vec<UnknownField>),
    /// The bytes are not a well-formed protobuf message.
    #[error("malformed protobuf at {path}: {what}")]
    Malformed { path: String, what: &'static str },
    #[error("field {number} of {message} (at {path}) has wire type {got}, not the declared one")]
    WireType {
        path: String,
        message: &'static str,
        number: u32,
        got: u8,
    },
    #[error("protobuf decode: {0}")]
    Decode(#[from] prost::DecodeError),
    /// A value the model cannot hold (a port above 65535).
    #[error("{key}: {value} is not a TCP port")]
    Port { key: String, value: u32 },
}

/// `policy_validation_failure_mode` (GetSandboxConfigResponse field 11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailureMode {
    /// A policy that cannot be applied quarantines the sandbox (deny) until a valid one comes.
    #[default]
    FailClosed,
    /// Keep the last good policy.
    RetainLastValid,
}

impl FailureMode {
    /// Empty or unknown means `fail_closed`.
    pub fn from_wire(s: &str) -> Self {
        if s == "retain_last_valid" {
            FailureMode::RetainLastValid
        } else {
            FailureMode::FailClosed
        }
    }
}

/// `policy_source` (field 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicySourceKind {
    Unspecified,
    Sandbox,
    Global,
    /// A value this schema does not list; kept rather than guessed.
    Other(i32),
}

/// A decoded GetSandboxConfigResponse.
#[derive(Debug)]
pub struct ConfigResponse {
    /// `None`: the gateway has no policy for this sandbox (field 1 absent, version 0).
    /// `Err`: the policy, or the envelope, has something we cannot take (an unknown field, a
    /// value out of range); the caller reports FAILED for `version` with this error's text
    /// and applies `failure_mode`.
    pub policy: Result<Option<SandboxPolicy>, ProtoError>,
    pub version: u32,
    pub policy_hash: String,
    pub settings: HashMap<String, pb::EffectiveSetting>,
    pub config_revision: u64,
    pub policy_source: PolicySourceKind,
    pub global_policy_version: u32,
    pub provider_env_revision: u64,
    pub workspace: String,
    pub failure_mode: FailureMode,
    pub extension_authentication_enabled: bool,
}

/// Decode the raw bytes of a GetSandboxConfigResponse (the gRPC message body, without the
/// 5-byte frame header). `Err` only when the envelope itself cannot be read (then there is not
/// even a version to report against); every problem with the policy, and an unknown field in
/// the envelope, lands in [`ConfigResponse::policy`].
pub fn decode_config_response(bytes: &[u8]) -> Result<ConfigResponse, ProtoError> {
    let (envelope, policy_bytes) = split_field(bytes, 1).map_err(|w| malformed("", w))?;
    let msg = pb::GetSandboxConfigResponse::decode(envelope.as_slice())?;
    let mut unknown = Vec::new();
    let policy = walk(&envelope, &CONFIG_RESPONSE, "", &mut unknown).and_then(|()| {
        let Some(pb) = policy_bytes else {
            return if unknown.is_empty() {
                Ok(None)
            } else {
                Err(ProtoError::UnknownFields(std::mem::take(&mut unknown)))
            };
        };
        policy_from_bytes(&pb, "policy", unknown).map(Some)
    });
    let policy_source = match msg.policy_source {
        0 => PolicySourceKind::Unspecified,
        1 => PolicySourceKind::Sandbox,
        2 => PolicySourceKind::Global,
        n => PolicySourceKind::Other(n),
    };
    Ok(ConfigResponse {
        policy,
        version: msg.version,
        policy_hash: msg.policy_hash,
        settings: msg.settings,
        config_revision: msg.config_revision,
        policy_source,
        global_policy_version: msg.global_policy_version,
        provider_env_revision: msg.provider_env_revision,
        workspace: msg.workspace,
        failure_mode: FailureMode::from_wire(&msg.policy_validation_failure_mode),
        extension_authentication_enabled: msg.extension_authentication_enabled,
    })
}

/// Decode the raw bytes of one `SandboxPolicy` message (an `UpdateConfig` payload, a test
/// vector), with the same unknown-field check.
pub fn decode_policy(bytes: &[u8]) -> Result<SandboxPolicy, ProtoError> {
    policy_from_bytes(bytes, "", Vec::new())
}

/// Walk, then decode. `unknown` may already hold what the envelope had.
fn policy_from_bytes(
    bytes: &[u8],
    path: &str,
    mut unknown: Vec<UnknownField>,
) -> Result<SandboxPolicy, ProtoError> {
    walk(bytes, &SANDBOX_POLICY, path, &mut unknown)?;
    if !unknown.is_empty() {
        return Err(ProtoError::UnknownFields(unknown));
    }
    let mut p = from_proto(pb::SandboxPolicy::decode(bytes)?)?;
    // prost has no slot for field 6; whether it was there is all the model keeps.
    let (_, middlewares) = split_field(bytes, 6).map_err(|w| malformed(path, w))?;
    p.network_middlewares = middlewares.map(|_| Opaque);
    Ok(p)
}

/// Encode the model as a `SandboxPolicy` message (for `UpdateConfig`, and the test gateway).
pub fn encode_policy(policy: &SandboxPolicy) -> Vec<u8> {
    to_proto(policy).encode_to_vec()
}

impl SandboxPolicy {
    /// The prost form, for a message that embeds the policy (`UpdateConfigRequest`, the test
    /// gateway's `GetSandboxConfigResponse`). Decoding goes the other way only through
    /// [`decode_policy`] / [`decode_config_response`], which see unknown fields.
    pub fn to_proto(&self) -> pb::SandboxPolicy {
        to_proto(self)
    }
}

/// Split the top level of a message into everything except field `number`, and the payloads
/// of every occurrence of `number` (length-delimited) concatenated. For a message field that
/// is exactly protobuf's rule: repeated occurrences merge, and merging is concatenation.
fn split_field(mut buf: &[u8], number: u32) -> Result<(Vec<u8>, Option<Vec<u8>>), &'static str> {
    let mut rest = Vec::with_capacity(buf.len());
    let mut found: Option<Vec<u8>> = None;
    while !buf.is_empty() {
        let (key, n) = varint(buf)?;
        let wt = (key & 7) as u8;
        let len = value_len(&buf[n..], wt, 0)?;
        let (field, tail) = buf.split_at(n + len);
        if key >> 3 == u64::from(number) && wt == 2 {
            let (l, h) = varint(&field[n..])?;
            let payload = &field[n + h..n + h + l as usize];
            found
                .get_or_insert_with(Vec::new)
                .extend_from_slice(payload);
        } else {
            rest.extend_from_slice(field);
        }
        buf = tail;
    }
    Ok((rest, found))
}

fn to_proto(p: &SandboxPolicy) -> pb::SandboxPolicy {
    pb::SandboxPolicy {
        version: p.version,
        filesystem: p.filesystem.as_ref().map(|f| pb::FilesystemPolicy {
            include_workdir: f.include_workdir,
            read_only: f.read_only.clone(),
            read_write: f.read_write.clone(),
        }),
        landlock: p.landlock.as_ref().map(|l| pb::LandlockPolicy {
            compatibility: l.compatibility.clone(),
        }),
        process: p.process.as_ref().map(|pr| pb::ProcessPolicy {
            run_as_user: pr.run_as_user.clone(),
            run_as_group: pr.run_as_group.clone(),
        }),
        network_policies: p
            .network_policies
            .iter()
            .map(|(k, r)| {
                let rule = pb::NetworkPolicyRule {
                    name: r.name.clone(),
                    endpoints: r
                        .endpoints
                        .iter()
                        .map(|e| pb::NetworkEndpoint {
                            host: e.host.clone(),
                            port: u32::from(e.port),
                            protocol: e.protocol.clone(),
                            tls: e.tls.clone(),
                            enforcement: e.enforcement.clone(),
                            access: e.access.clone(),
                            allowed_ips: e.allowed_ips.clone(),
                            ports: e.ports.iter().map(|p| u32::from(*p)).collect(),
                            rules: e
                                .rules
                                .iter()
                                .flatten()
                                .map(|r| pb::L7Rule {
                                    allow: Some(l7_allow_to_proto(&r.allow)),
                                })
                                .collect(),
                            deny_rules: e
                                .deny_rules
                                .iter()
                                .flatten()
                                .map(l7_deny_to_proto)
                                .collect(),
                            allow_encoded_slash: e.allow_encoded_slash,
                            path: e.path.clone(),
                            advisor_proposed: e.advisor_proposed,
                            request_body_credential_rewrite: e.request_body_credential_rewrite,
                            credential_binding: e.credential_binding.as_ref().map(|b| {
                                pb::NetworkCredentialBinding {
                                    provider: b.provider.clone(),
                                }
                            }),
                        })
                        .collect(),
                    binaries: r
                        .binaries
                        .iter()
                        .map(|b| pb::NetworkBinary {
                            path: b.path.clone(),
                            harness: false,
                        })
                        .collect(),
                };
                (k.clone(), rule)
            })
            .collect(),
    }
}

fn query_to_proto(
    q: &std::collections::BTreeMap<String, QueryMatcher>,
) -> HashMap<String, pb::L7QueryMatcher> {
    q.iter()
        .map(|(k, m)| {
            (
                k.clone(),
                pb::L7QueryMatcher {
                    glob: m.glob.clone(),
                    any: m.any.clone(),
                },
            )
        })
        .collect()
}

fn l7_allow_to_proto(m: &L7Match) -> pb::L7Allow {
    pb::L7Allow {
        method: m.method.clone(),
        path: m.path.clone(),
        command: m.command.clone(),
        query: query_to_proto(&m.query),
    }
}

fn l7_deny_to_proto(m: &L7Match) -> pb::L7DenyRule {
    pb::L7DenyRule {
        method: m.method.clone(),
        path: m.path.clone(),
        command: m.command.clone(),
        query: query_to_proto(&m.query),
    }
}

/// A proto map has no order; the model's is by key.
fn query_from_proto(
    q: HashMap<String, pb::L7QueryMatcher>,
) -> std::collections::BTreeMap<String, QueryMatcher> {
    q.into_iter()
        .map(|(k, m)| {
            (
                k,
                QueryMatcher {
                    glob: m.glob,
                    any: m.any,
                },
            )
        })
        .collect()
}

fn port(key: impl FnOnce() -> String, value: u32) -> Result<u16, ProtoError> {
    u16::try_from(value).map_err(|_| ProtoError::Port { key: key(), value })
}

fn from_proto(p: pb::SandboxPolicy) -> Result<SandboxPolicy, ProtoError> {
    let mut network_policies = std::collections::BTreeMap::new();
    for (key, r) in p.network_policies {
        let mut endpoints = Vec::with_capacity(r.endpoints.len());
        for (i, e) in r.endpoints.into_iter().enumerate() {
            let at = |f: &str| format!("network_policies.{key}.endpoints[{i}].{f}");
            let ports = e
                .ports
                .iter()
                .map(|v| port(|| at("ports"), *v))
                .collect::<Result<Vec<_>, _>>()?;
            // "`ports` wins; a lone `port` becomes [port]" in OpenShell: with both set, `port` has
            // no meaning, and dropping it keeps the model valid YAML.
            let port = if ports.is_empty() {
                port(|| at("port"), e.port)?
            } else {
                0
            };
            endpoints.push(NetworkEndpoint {
                host: e.host,
                port,
                ports,
                protocol: e.protocol,
                tls: e.tls,
                enforcement: e.enforcement,
                access: e.access,
                allowed_ips: e.allowed_ips,
                // An empty repeated field and an absent one are the same bytes.
                rules: (!e.rules.is_empty()).then(|| {
                    e.rules
                        .into_iter()
                        .map(|r| {
                            let a = r.allow.unwrap_or_default();
                            L7Rule {
                                allow: L7Match {
                                    method: a.method,
                                    path: a.path,
                                    command: a.command,
                                    query: query_from_proto(a.query),
                                    ..Default::default()
                                },
                            }
                        })
                        .collect()
                }),
                deny_rules: (!e.deny_rules.is_empty()).then(|| {
                    e.deny_rules
                        .into_iter()
                        .map(|d| L7Match {
                            method: d.method,
                            path: d.path,
                            command: d.command,
                            query: query_from_proto(d.query),
                            ..Default::default()
                        })
                        .collect()
                }),
                path: e.path,
                allow_encoded_slash: e.allow_encoded_slash,
                advisor_proposed: e.advisor_proposed,
                request_body_credential_rewrite: e.request_body_credential_rewrite,
                credential_binding: e.credential_binding.map(|b| super::CredentialBinding {
                    provider: b.provider,
                }),
                ..Default::default()
            });
        }
        let binaries = r
            .binaries
            .into_iter()
            .map(|b| NetworkBinary {
                path: b.path,
                ..NetworkBinary::default()
            })
            .collect();
        network_policies.insert(
            key,
            NetworkPolicyRule {
                name: r.name,
                endpoints,
                binaries,
            },
        );
    }
    Ok(SandboxPolicy {
        version: p.version,
        filesystem: p.filesystem.map(|f| FilesystemPolicy {
            include_workdir: f.include_workdir,
            read_only: f.read_only,
            read_write: f.read_write,
        }),
        landlock: p.landlock.map(|l| LandlockPolicy {
            compatibility: l.compatibility,
        }),
        process: p.process.map(|pr| ProcessPolicy {
            run_as_user: pr.run_as_user,
            run_as_group: pr.run_as_group,
        }),
        network_policies,
        network_middlewares: None,
    })
}

// ---- the schema ----------------------------------------------------------------------------

/// How a declared field is encoded.
#[derive(Clone, Copy)]
enum Kind {
    /// int32, uint32, uint64, int64, bool, enum: wire type 0.
    Varint,
    /// A `repeated` varint scalar: wire type 0, or 2 when packed.
    RepeatedVarint,
    /// string, bytes: wire type 2.
    Bytes,
    /// A sub-message (or a map entry): wire type 2, walked with its own schema.
    Message(&'static Schema),
    /// Declared by OpenShell, deliberately not modelled: any wire type, not looked into.
    Opaque,
}

struct Schema {
    name: &'static str,
    fields: &'static [(u32, &'static str, Kind)],
}

impl Schema {
    fn field(&self, number: u32) -> Option<(&'static str, Kind)> {
        self.fields
            .iter()
            .find(|(n, _, _)| *n == number)
            .map(|(_, name, k)| (*name, *k))
    }
}

use Kind::{Bytes, Message as Msg, Opaque as Opq, RepeatedVarint, Varint};

static FILESYSTEM: Schema = Schema {
    name: "FilesystemPolicy",
    fields: &[
        (1, "include_workdir", Varint),
        (2, "read_only", Bytes),
        (3, "read_write", Bytes),
    ],
};
static LANDLOCK: Schema = Schema {
    name: "LandlockPolicy",
    fields: &[(1, "compatibility", Bytes)],
};
static PROCESS: Schema = Schema {
    name: "ProcessPolicy",
    fields: &[(1, "run_as_user", Bytes), (2, "run_as_group", Bytes)],
};
static CREDENTIAL_BINDING: Schema = Schema {
    name: "NetworkCredentialBinding",
    fields: &[(1, "provider", Bytes)],
};
static BINARY: Schema = Schema {
    name: "NetworkBinary",
    fields: &[(1, "path", Bytes), (2, "harness", Varint)],
};
static QUERY_MATCHER: Schema = Schema {
    name: "L7QueryMatcher",
    fields: &[(1, "glob", Bytes), (2, "any", Bytes)],
};
static QUERY_ENTRY: Schema = Schema {
    name: "L7Allow.QueryEntry",
    fields: &[(1, "key", Bytes), (2, "value", Msg(&QUERY_MATCHER))],
};
/// L7Allow and L7DenyRule: method, path, command and query are modelled; 5-7 and 9 (GraphQL
/// and MCP matchers) are known but opaque; 8 is reserved, so unknown.
static L7_MATCH: Schema = Schema {
    name: "L7Allow",
    fields: &[
        (1, "method", Bytes),
        (2, "path", Bytes),
        (3, "command", Bytes),
        (4, "query", Msg(&QUERY_ENTRY)),
        (5, "extra", Opq),
        (6, "extra", Opq),
        (7, "extra", Opq),
        (9, "extra", Opq),
    ],
};
static L7_DENY: Schema = Schema {
    name: "L7DenyRule",
    fields: L7_MATCH.fields,
};
static L7_RULE: Schema = Schema {
    name: "L7Rule",
    fields: &[(1, "allow", Msg(&L7_MATCH))],
};
/// NetworkEndpoint: 1-10 as OpenShell's proto names them, plus 11, 15 and 18; the other L7 and
/// credential extras up to 26 are known but opaque.
static ENDPOINT: Schema = Schema {
    name: "NetworkEndpoint",
    fields: &[
        (1, "host", Bytes),
        (2, "port", Varint),
        (3, "protocol", Bytes),
        (4, "tls", Bytes),
        (5, "enforcement", Bytes),
        (6, "access", Bytes),
        (7, "rules", Msg(&L7_RULE)),
        (8, "allowed_ips", Bytes),
        (9, "ports", RepeatedVarint),
        (10, "deny_rules", Msg(&L7_DENY)),
        (11, "allow_encoded_slash", Varint),
        (12, "extra", Opq),
        (13, "extra", Opq),
        (14, "extra", Opq),
        (15, "path", Bytes),
        (16, "extra", Opq),
        (17, "request_body_credential_rewrite", Varint),
        (18, "advisor_proposed", Varint),
        (19, "extra", Opq),
        (20, "extra", Opq),
        (21, "extra", Opq),
        (22, "extra", Opq),
        (23, "extra", Opq),
        (24, "credential_binding", Msg(&CREDENTIAL_BINDING)),
        (25, "extra", Opq),
        (26, "extra", Opq),
    ],
};
static RULE: Schema = Schema {
    name: "NetworkPolicyRule",
    fields: &[
        (1, "name", Bytes),
        (2, "endpoints", Msg(&ENDPOINT)),
        (3, "binaries", Msg(&BINARY)),
    ],
};
static RULE_ENTRY: Schema = Schema {
    name: "SandboxPolicy.NetworkPoliciesEntry",
    fields: &[(1, "key", Bytes), (2, "value", Msg(&RULE))],
};
static SANDBOX_POLICY: Schema = Schema {
    name: "SandboxPolicy",
    fields: &[
        (1, "version", Varint),
        (2, "filesystem", Msg(&FILESYSTEM)),
        (3, "landlock", Msg(&LANDLOCK)),
        (4, "process", Msg(&PROCESS)),
        (5, "network_policies", Msg(&RULE_ENTRY)),
        (6, "network_middlewares", Opq),
    ],
};
static SETTING_VALUE: Schema = Schema {
    name: "SettingValue",
    fields: &[
        (1, "string_value", Bytes),
        (2, "bool_value", Varint),
        (3, "int_value", Varint),
        (4, "bytes_value", Bytes),
    ],
};
static EFFECTIVE_SETTING: Schema = Schema {
    name: "EffectiveSetting",
    fields: &[(1, "value", Msg(&SETTING_VALUE)), (2, "scope", Varint)],
};
static SETTINGS_ENTRY: Schema = Schema {
    name: "GetSandboxConfigResponse.SettingsEntry",
    fields: &[(1, "key", Bytes), (2, "value", Msg(&EFFECTIVE_SETTING))],
};
static CONFIG_RESPONSE: Schema = Schema {
    name: "GetSandboxConfigResponse",
    fields: &[
        (1, "policy", Msg(&SANDBOX_POLICY)),
        (2, "version", Varint),
        (3, "policy_hash", Bytes),
        (4, "settings", Msg(&SETTINGS_ENTRY)),
        (5, "config_revision", Varint),
        (6, "policy_source", Varint),
        (7, "global_policy_version", Varint),
        (8, "provider_env_revision", Varint),
        (9, "supervisor_middleware_services", Opq),
        (10, "workspace", Bytes),
        (11, "policy_validation_failure_mode", Bytes),
        (12, "extension_authentication_enabled", Varint),
    ],
};

// ---- the walk ------------------------------------------------------------------------------

/// prost's own limit on nested groups; our schema nests only 5 deep, so only an unknown group
/// can go deeper.
const MAX_DEPTH: usize = 100;

fn malformed(path: &str, what: &'static str) -> ProtoError {
    ProtoError::Malformed {
        path: path.to_string(),
        what,
    }
}

/// Read a base-128 varint; returns it and its length. Ten bytes at most, and the tenth may
/// carry only the top bit of 64, as prost requires.
fn varint(buf: &[u8]) -> Result<(u64, usize), &'static str> {
    let mut v: u64 = 0;
    for (i, b) in buf.iter().take(10).enumerate() {
        if i == 9 && *b > 1 {
            return Err("varint overflows 64 bits");
        }
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok((v, i + 1));
        }
    }
    Err(if buf.len() < 10 {
        "truncated varint"
    } else {
        "varint longer than 10 bytes"
    })
}

/// The length in bytes of a value of wire type `wt` at the start of `buf` (including a length
/// prefix; for a group, everything up to and including its end tag).
fn value_len(buf: &[u8], wt: u8, depth: usize) -> Result<usize, &'static str> {
    let n = match wt {
        0 => varint(buf)?.1,
        1 => 8,
        5 => 4,
        2 => {
            let (len, h) = varint(buf)?;
            usize::try_from(len)
                .ok()
                .and_then(|l| l.checked_add(h))
                .ok_or("length does not fit")?
        }
        3 => group_len(buf, depth + 1)?,
        4 => return Err("end-group tag without a start"),
        _ => return Err("invalid wire type"),
    };
    if n > buf.len() {
        return Err("value runs past the end of the message");
    }
    Ok(n)
}

/// Length of a group's body plus its end tag. The start tag has been consumed already.
fn group_len(buf: &[u8], depth: usize) -> Result<usize, &'static str> {
    if depth > MAX_DEPTH {
        return Err("groups nested too deeply");
    }
    let mut pos = 0;
    loop {
        let (key, n) = varint(&buf[pos..])?;
        pos += n;
        let wt = (key & 7) as u8;
        if key >> 3 == 0 {
            return Err("field number 0");
        }
        if wt == 4 {
            return Ok(pos);
        }
        pos += value_len(&buf[pos..], wt, depth)?;
    }
}

/// Check every tag of `buf` against `schema`, recursing into declared sub-messages; push each
/// unknown field number (with its path) to `unknown`. Wire-level damage is an error.
fn walk(
    buf: &[u8],
    schema: &Schema,
    path: &str,
    unknown: &mut Vec<UnknownField>,
) -> Result<(), ProtoError> {
    let mut pos = 0;
    while pos < buf.len() {
        let (key, n) = varint(&buf[pos..]).map_err(|w| malformed(path, w))?;
        pos += n;
        let wt = (key & 7) as u8;
        let number = u32::try_from(key >> 3)
            .ok()
            .filter(|n| (1..=(1 << 29) - 1).contains(n))
            .ok_or_else(|| malformed(path, "field number out of range"))?;
        let len = value_len(&buf[pos..], wt, 0).map_err(|w| malformed(path, w))?;
        let value = &buf[pos..pos + len];
        pos += len;
        let Some((name, kind)) = schema.field(number) else {
            unknown.push(UnknownField {
                path: path.to_string(),
                message: schema.name,
                number,
            });
            continue;
        };
        let wrong = || ProtoError::WireType {
            path: path.to_string(),
            message: schema.name,
            number,
            got: wt,
        };
        match kind {
            Varint if wt != 0 => return Err(wrong()),
            RepeatedVarint if wt == 2 => {
                // Packed: a run of varints filling the payload exactly.
                let (l, h) = varint(value).map_err(|w| malformed(path, w))?;
                let mut body = &value[h..h + l as usize];
                while !body.is_empty() {
                    let (_, n) = varint(body).map_err(|w| malformed(path, w))?;
                    body = &body[n..];
                }
            }
            RepeatedVarint if wt != 0 => return Err(wrong()),
            Bytes if wt != 2 => return Err(wrong()),
            Msg(sub) => {
                if wt != 2 {
                    return Err(wrong());
                }
                let (l, h) = varint(value).map_err(|w| malformed(path, w))?;
                let sub_path = if path.is_empty() {
                    name.to_string()
                } else {
                    format!("{path}.{name}")
                };
                walk(&value[h..h + l as usize], sub, &sub_path, unknown)?;
            }
            _ => {}
        }
    }
    Ok(())
}
