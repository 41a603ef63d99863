//! Load-time validation of `network_policies`: one pass over the model, the first error wins
//! and names its key; what OpenShell only warns about becomes a [`NetworkWarning`].

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;

use super::glob::Glob;
use super::local::always_blocked_nets;
use super::rules::{
    AccessPreset, Binary, BinaryPattern, Endpoint, Enforcement, HostPattern, NetworkPolicyError,
    NetworkRules, NetworkWarning, Protocol, Rule, TlsMode,
};
use crate::policy::openshell::{NetworkEndpoint, NetworkPolicyRule};

struct Ctx {
    warnings: Vec<NetworkWarning>,
}

fn err(key: &str, message: impl Into<String>) -> NetworkPolicyError {
    NetworkPolicyError {
        key: key.to_string(),
        message: message.into(),
    }
}

impl Ctx {
    fn warn(&mut self, key: &str, message: impl Into<String>) {
        self.warnings.push(NetworkWarning {
            key: key.to_string(),
            message: message.into(),
        });
    }
}

pub(super) fn compile(
    rules: &BTreeMap<String, NetworkPolicyRule>,
) -> Result<NetworkRules, NetworkPolicyError> {
    let mut cx = Ctx {
        warnings: Vec::new(),
    };
    let mut out = Vec::with_capacity(rules.len());
    for (key, rule) in rules {
        let at = format!("network_policies.{key}");
        if key.is_empty() {
            return Err(err("network_policies", "a rule key is empty"));
        }
        let mut endpoints = Vec::with_capacity(rule.endpoints.len());
        for (i, e) in rule.endpoints.iter().enumerate() {
            endpoints.push(endpoint(&mut cx, &format!("{at}.endpoints[{i}]"), e)?);
        }
        let mut binaries = Vec::with_capacity(rule.binaries.len());
        for (i, b) in rule.binaries.iter().enumerate() {
            binaries.push(Binary {
                pattern: binary(&format!("{at}.binaries[{i}].path"), &b.path)?,
                descendants: b.descendants,
                allow_untrusted_code: b.allow_untrusted_code,
            });
        }
        if binaries.is_empty() {
            cx.warn(
                &at,
                "the rule lists no binaries, so it matches no connection",
            );
        }
        if endpoints.is_empty() {
            cx.warn(&at, "the rule lists no endpoints, so it matches nothing");
        }
        out.push(Rule {
            key: key.clone(),
            name: rule.name.clone(),
            endpoints,
            binaries,
        });
    }
    Ok(NetworkRules {
        rules: out,
        warnings: cx.warnings,
    })
}

fn binary(at: &str, path: &str) -> Result<BinaryPattern, NetworkPolicyError> {
    if path.is_empty() {
        return Err(err(at, "the binary path is empty"));
    }
    if path.contains('\0') {
        return Err(err(at, "the binary path contains a NUL byte"));
    }
    if !path.contains('*') {
        if !path.starts_with('/') {
            return Err(err(
                at,
                format!(
                    "binary path '{path}' is not absolute; the executable is matched by its full path (e.g. /usr/bin/curl)"
                ),
            ));
        }
        return Ok(BinaryPattern::Exact {
            path: path.to_string(),
            targets: Vec::new(),
        });
    }
    if !path.starts_with('/') && !path.starts_with('*') {
        return Err(err(
            at,
            format!("binary pattern '{path}' can never match an absolute executable path"),
        ));
    }
    Glob::new(path, b'/')
        .map(BinaryPattern::Glob)
        .map_err(|e| err(at, e.to_string()))
}

/// A host name or IP literal, lower-cased; brackets around an IPv6 literal are dropped.
fn host(at: &str, raw: &str) -> Result<HostPattern, NetworkPolicyError> {
    let lower = raw.to_ascii_lowercase();
    let unbracketed = lower
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(&lower);
    if unbracketed.parse::<IpAddr>().is_ok() {
        return Ok(HostPattern::Exact(unbracketed.to_string()));
    }
    if let Some(c) = lower
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '*' | '?')))
    {
        return Err(err(
            at,
            format!(
                "host '{raw}' has {c:?}, which no host name or glob has (give the name only: no scheme, port or path)"
            ),
        ));
    }
    if !lower.contains('*') {
        if lower.split('.').any(|l| l.len() > 63) || lower.len() > 253 {
            return Err(err(at, format!("host '{raw}' is longer than DNS allows")));
        }
        return Ok(HostPattern::Exact(lower));
    }
    // OpenShell's load-time wildcard rules, with its messages.
    if lower == "*" || lower == "**" {
        return Err(err(
            at,
            format!(
                "host wildcard '{raw}' matches all hosts; use specific patterns like '*.example.com'"
            ),
        ));
    }
    let labels: Vec<&str> = lower.split('.').collect();
    let first = labels[0];
    if first.contains("**") && first != "**" {
        return Err(err(
            at,
            format!(
                "recursive host wildcard '**' is only allowed as the entire first DNS label, got '{raw}'"
            ),
        ));
    }
    for label in &labels[1..] {
        if label.contains("**") {
            return Err(err(
                at,
                format!(
                    "recursive host wildcard '**' is only allowed as the entire first DNS label, got '{raw}'"
                ),
            ));
        }
        if label.contains('*') && *label != "*" {
            return Err(err(
                at,
                format!("middle DNS label wildcard must be the entire label '*', got '{raw}'"),
            ));
        }
    }
    if labels.len() <= 2 {
        return Err(err(
            at,
            format!(
                "TLD wildcard '{raw}' is not allowed; use subdomain wildcards like '*.example.com' instead"
            ),
        ));
    }
    Glob::new(&lower, b'.')
        .map(HostPattern::Glob)
        .map_err(|e| err(at, e.to_string()))
}

fn allowed_ip(cx: &mut Ctx, at: &str, raw: &str) -> Result<IpNet, NetworkPolicyError> {
    let s = raw.trim();
    let net = match s.parse::<IpNet>() {
        Ok(n) => n,
        Err(_) => match s.parse::<IpAddr>() {
            Ok(ip) => IpNet::from(ip),
            Err(_) => {
                return Err(err(
                    at,
                    format!("'{raw}' is neither an IP address nor a CIDR range"),
                ));
            }
        },
    };
    for blocked in always_blocked_nets() {
        if net.contains(&blocked.network()) || blocked.contains(&net.network()) {
            return Err(err(
                at,
                format!(
                    "'{raw}' overlaps {blocked}, which is always blocked (loopback, link-local or unspecified); allowed_ips cannot open it"
                ),
            ));
        }
    }
    if net.prefix_len() < 16 {
        cx.warn(
            at,
            format!("'{raw}' is a very broad range (shorter than /16)"),
        );
    }
    Ok(net)
}

fn endpoint(cx: &mut Ctx, at: &str, e: &NetworkEndpoint) -> Result<Endpoint, NetworkPolicyError> {
    if e.port != 0 && !e.ports.is_empty() {
        return Err(err(
            at,
            "port and ports are mutually exclusive; use ports for multiple ports",
        ));
    }
    let mut ports: Vec<u16> = if e.ports.is_empty() {
        vec![e.port]
    } else {
        e.ports.clone()
    };
    if ports.contains(&0) && !(e.ports.is_empty() && e.port == 0) {
        return Err(err(&format!("{at}.ports"), "port 0 is not a TCP port"));
    }
    ports.retain(|p| *p != 0);
    ports.sort_unstable();
    ports.dedup();
    if ports.is_empty() {
        cx.warn(at, "the endpoint has no port, so it matches nothing");
    }
    let host = if e.host.is_empty() {
        None
    } else {
        Some(host(&format!("{at}.host"), &e.host)?)
    };
    let mut allowed_ips = Vec::with_capacity(e.allowed_ips.len());
    for (i, ip) in e.allowed_ips.iter().enumerate() {
        allowed_ips.push(allowed_ip(cx, &format!("{at}.allowed_ips[{i}]"), ip)?);
    }
    if host.is_none() && allowed_ips.is_empty() {
        cx.warn(
            at,
            "the endpoint has neither host nor allowed_ips, so it matches nothing",
        );
    }
    let protocol = match e.protocol.as_str() {
        "" => Protocol::L4,
        "rest" => Protocol::Rest,
        "websocket" => Protocol::Websocket,
        "graphql" => Protocol::Graphql,
        "sql" => Protocol::Sql,
        "json-rpc" => Protocol::JsonRpc,
        "mcp" => Protocol::Mcp,
        "tcp" => {
            return Err(err(
                &format!("{at}.protocol"),
                "protocol 'tcp' needs policy DNS and transparent TCP capture, which this runtime does not provide (nor does OpenShell's Kubernetes driver); omit protocol to allow the endpoint through the proxy",
            ));
        }
        other => {
            return Err(err(
                &format!("{at}.protocol"),
                format!(
                    "unknown protocol '{other}' (expected tcp, rest, websocket, graphql, sql, json-rpc, or mcp)"
                ),
            ));
        }
    };
    let tls = match e.tls.as_str() {
        "skip" => TlsMode::Skip,
        "" => TlsMode::Auto,
        v @ ("terminate" | "passthrough") => {
            cx.warn(
                &format!("{at}.tls"),
                format!("'tls: {v}' is deprecated; TLS termination is now automatic. Use 'tls: skip' to disable."),
            );
            TlsMode::Auto
        }
        other => {
            cx.warn(
                &format!("{at}.tls"),
                format!(
                    "unknown tls mode '{other}' is treated as automatic (only 'skip' changes it)"
                ),
            );
            TlsMode::Auto
        }
    };
    if tls == TlsMode::Skip && protocol.is_l7() && ports.contains(&443) {
        cx.warn(
            at,
            "tls: skip with an L7 protocol on port 443: L7 inspection cannot work on encrypted traffic",
        );
    }
    // A typo must not turn an enforced endpoint into an audited one without a word.
    let enforcement = match e.enforcement.as_str() {
        "" | "audit" => Enforcement::Audit,
        "enforce" => Enforcement::Enforce,
        other => {
            return Err(err(
                &format!("{at}.enforcement"),
                format!("'{other}' is neither 'enforce' nor 'audit'"),
            ));
        }
    };
    let access = match e.access.as_str() {
        "" => None,
        "read-only" => Some(AccessPreset::ReadOnly),
        "read-write" => Some(AccessPreset::ReadWrite),
        "full" => Some(AccessPreset::Full),
        other => {
            cx.warn(
                &format!("{at}.access"),
                format!("unsupported L7 access preset '{other}' ignored; expected one of: read-only, read-write, full"),
            );
            None
        }
    };
    l7(cx, at, e, protocol, enforcement)?;
    Ok(Endpoint {
        host,
        ports,
        allowed_ips,
        protocol,
        tls,
        enforcement,
        access,
        rules: e.rules.iter().flatten().map(|r| r.allow.clone()).collect(),
        deny_rules: e.deny_rules.clone().unwrap_or_default(),
        path: e.path.clone(),
        allow_encoded_slash: e.allow_encoded_slash,
        advisor_proposed: e.advisor_proposed,
        request_body_credential_rewrite: e.request_body_credential_rewrite,
        credential_provider: e.credential_binding.as_ref().map(|b| b.provider.clone()),
    })
}

/// OpenShell's L7 consistency rules (the L7 relay that enforces them comes later; the rules
/// already decide whether a policy loads).
fn l7(
    cx: &mut Ctx,
    at: &str,
    e: &NetworkEndpoint,
    protocol: Protocol,
    enforcement: Enforcement,
) -> Result<(), NetworkPolicyError> {
    let has_access = !e.access.is_empty();
    if has_access && e.rules.is_some() {
        return Err(err(at, "rules and access are mutually exclusive"));
    }
    if let Some(rules) = &e.rules {
        let allows = rules.iter().any(|r| {
            let a = &r.allow;
            !a.method.is_empty()
                || !a.path.is_empty()
                || !a.command.is_empty()
                || !a.query.is_empty()
        });
        if !allows {
            return Err(err(
                &format!("{at}.rules"),
                "rules would deny all traffic (no allow clause found); use access or add allow rules",
            ));
        }
    }
    if let Some(deny) = &e.deny_rules {
        if protocol == Protocol::L4 {
            return Err(err(
                &format!("{at}.deny_rules"),
                "deny_rules require protocol (L7 inspection must be enabled)",
            ));
        }
        if deny.is_empty() {
            return Err(err(
                &format!("{at}.deny_rules"),
                "deny_rules must not be empty; omit the key instead",
            ));
        }
        if protocol != Protocol::Mcp && !has_access && e.rules.is_none() {
            return Err(err(
                &format!("{at}.deny_rules"),
                "deny_rules require rules or access to define the base allow set",
            ));
        }
    }
    if protocol.is_l7() {
        if !has_access && e.rules.is_none() && protocol != Protocol::Mcp {
            return Err(err(
                at,
                "protocol requires rules or access to define allowed traffic",
            ));
        }
        if has_access && matches!(protocol, Protocol::Mcp | Protocol::JsonRpc) {
            return Err(err(
                &format!("{at}.access"),
                format!(
                    "access presets are not supported for protocol '{}'; use rules",
                    protocol.as_str()
                ),
            ));
        }
    } else if has_access || e.rules.is_some() || e.enforcement == "enforce" {
        cx.warn(
            at,
            "access, rules and enforcement apply only to L7 inspection, and this endpoint has no protocol: they have no effect",
        );
    }
    if protocol == Protocol::Sql && enforcement == Enforcement::Enforce {
        return Err(err(
            &format!("{at}.enforcement"),
            "SQL enforcement requires full SQL parsing, which is not available. Use `enforcement: audit`.",
        ));
    }
    // Only the REST and WebSocket relays exist: an endpoint whose rules could not be applied
    // must not load as if they were.
    if protocol.is_l7() && !matches!(protocol, Protocol::Rest | Protocol::Websocket) {
        return Err(err(
            &format!("{at}.protocol"),
            format!(
                "protocol '{}' is not supported by this supervisor yet (only 'rest' and 'websocket' are inspected); use protocol: rest, or omit protocol for an uninspected endpoint",
                protocol.as_str()
            ),
        ));
    }
    let clauses = e
        .rules
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, r)| (format!("rules[{i}].allow"), &r.allow))
        .chain(
            e.deny_rules
                .iter()
                .flatten()
                .enumerate()
                .map(|(i, d)| (format!("deny_rules[{i}]"), d)),
        );
    for (what, c) in clauses {
        let mut globs: Vec<&str> = vec![&c.path];
        for q in c.query.values() {
            globs.push(&q.glob);
            globs.extend(q.any.iter().map(String::as_str));
        }
        for g in globs {
            if let Err(ge) = Glob::new(g, b'/') {
                return Err(err(&format!("{at}.{what}"), ge.to_string()));
            }
        }
    }
    if !(e.path.is_empty() || e.path.starts_with('/') || e.path == "**") {
        return Err(err(
            &format!("{at}.path"),
            format!("'{}' must start with '/' or be '**'", e.path),
        ));
    }
    Ok(())
}
