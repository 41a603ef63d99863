//! The decision for one connection: a pure function of the policy, the requested host and
//! port, and the caller. Computed once per connection; the response, the log event and the
//! counters all read the same [`Decision`].
//!
//! OpenShell's semantics (its Rego rules and the Rust around them):
//! - a rule allows when one of its endpoints covers the host and port and one of its binaries
//!   is the caller's executable or an ancestor's; a rule without binaries allows nothing;
//! - when several rules allow, the lexicographically smallest key is the one reported;
//! - the settings of a connection (`allowed_ips`, `tls`, `protocol`) come from the first
//!   matching endpoint that has any of them, in key order then endpoint order;
//! - the address plan ([`AddressPlan`]) then says what the resolved addresses may be.

use std::net::IpAddr;

use super::addr::{AddressPlan, is_always_blocked};
use super::identity::Caller;
use super::revision::PolicyState;
use crate::policy::network::{Endpoint, Enforcement, HostPattern, Protocol, TlsMode};

/// What happens to one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow(Allow),
    Deny(Deny),
}

/// An allowed connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allow {
    /// The smallest matching rule key.
    pub rule: String,
    /// How a CONNECT tunnel is carried.
    pub mode: Mode,
    /// How the resolved addresses are checked.
    pub plan: AddressPlan,
    /// The endpoint whose settings apply (the first matching one with extended config), if
    /// any.
    pub settings: Option<Settings>,
}

/// The settings of the endpoint a connection was admitted under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub rule: String,
    /// Index into the rule's endpoints.
    pub endpoint: usize,
    pub protocol: Protocol,
    pub tls: TlsMode,
    pub enforcement: Enforcement,
}

/// How an allowed CONNECT is carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Bytes relayed as they are.
    Tunnel,
    /// The endpoint asks for L7 inspection (an L7 protocol without `tls: skip`). The inspecting
    /// relay (HTTP rules, TLS termination, credentials) plugs in here; without one the proxy
    /// refuses such connections rather than tunnel what the policy wants inspected.
    Inspect(Settings),
}

/// A denied connection, with OpenShell's reason text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deny {
    pub reason: String,
}

impl Allow {
    /// Whether a plain-HTTP forward to this endpoint needs inspection: L7 rules apply to
    /// forwarded requests whatever `tls` says.
    pub fn forward_needs_inspection(&self) -> bool {
        self.settings.as_ref().is_some_and(|s| s.protocol.is_l7())
    }
}

/// Decide one connection to `host` (any case; an IP literal without brackets) on `port`.
pub fn decide(policy: &PolicyState, host: &str, port: u16, caller: &Caller) -> Decision {
    let deny = |reason: String| Decision::Deny(Deny { reason });
    let rules = match policy {
        PolicyState::Quarantined { reason } => return deny(reason.clone()),
        PolicyState::Rules(r) => r,
    };
    if rules.is_empty() {
        return deny("network connections not allowed by policy".into());
    }
    let host = host.to_ascii_lowercase();
    let mut allowed = Vec::new();
    let mut binary_misses = Vec::new();
    for rule in rules.rules() {
        let endpoints: Vec<(usize, &Endpoint)> = rule
            .endpoints
            .iter()
            .enumerate()
            .filter(|(_, e)| e.matches(&host, port))
            .collect();
        if endpoints.is_empty() {
            continue;
        }
        let binary_ok = rule
            .binaries
            .iter()
            .any(|b| b.matches(&caller.exe) || caller.ancestors.iter().any(|a| b.matches(a)));
        if binary_ok {
            allowed.push((rule, endpoints));
        } else {
            binary_misses.push(rule.key.as_str());
        }
    }
    if allowed.is_empty() {
        if binary_misses.is_empty() {
            return deny(format!(
                "endpoint {host}:{port} is not allowed by any policy"
            ));
        }
        let reasons: Vec<String> = binary_misses
            .iter()
            .map(|key| {
                format!(
                    "binary '{}' not allowed in policy '{key}' (ancestors: [{}], cmdline: [{}])",
                    caller.exe,
                    caller.ancestors.join(" -> "),
                    caller.cmdline_paths.join(", ")
                )
            })
            .collect();
        return deny(reasons.join("; "));
    }
    // Rules iterate in key order, so the first allowed one is the smallest key.
    let rule = allowed[0].0.key.clone();
    let settings = allowed.iter().find_map(|(r, eps)| {
        eps.iter()
            .find(|(_, e)| e.has_extended_config())
            .map(|(i, e)| (r.key.as_str(), *i, *e))
    });
    let literal = host
        .parse::<IpAddr>()
        .ok()
        .filter(|ip| !is_always_blocked(*ip));
    let exact_declared = allowed.iter().any(|(_, eps)| {
        eps.iter().any(|(_, e)| {
            !e.advisor_proposed && matches!(&e.host, Some(HostPattern::Exact(h)) if *h == host)
        })
    });
    let plan = match (settings, literal) {
        (Some((_, _, e)), _) if !e.allowed_ips.is_empty() => {
            AddressPlan::AllowedIps(e.allowed_ips.clone())
        }
        (_, Some(ip)) => AddressPlan::IpLiteral(ip),
        _ if exact_declared => AddressPlan::ExactHost,
        _ => AddressPlan::PublicOnly,
    };
    let settings = settings.map(|(key, i, e)| Settings {
        rule: key.to_string(),
        endpoint: i,
        protocol: e.protocol,
        tls: e.tls,
        enforcement: e.enforcement,
    });
    let mode = match &settings {
        Some(s) if s.protocol.is_l7() && s.tls != TlsMode::Skip => Mode::Inspect(s.clone()),
        _ => Mode::Tunnel,
    };
    Decision::Allow(Allow {
        rule,
        mode,
        plan,
        settings,
    })
}
