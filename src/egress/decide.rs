//! The decision for one connection: a pure function of the policy, the requested host and
//! port, and the caller. Computed once per connection; the response, the log event and the
//! counters all read the same [`Decision`].
//!
//! OpenShell's semantics (its Rego rules and the Rust around them), narrowed where they
//! admitted more than the rule names (`docs/egress.md`, "Who is calling"):
//! - a rule allows when one of its endpoints covers the host and port and its binaries admit
//!   every process holding the socket ([`admits`]); a rule without binaries allows nothing;
//! - when several rules allow, the lexicographically smallest key is the one reported;
//! - the settings of a connection (`allowed_ips`, `tls`, `protocol`) come from the first
//!   matching endpoint that has any of them, in key order then endpoint order;
//! - the address plan ([`AddressPlan`]) then says what the resolved addresses may be; an IP
//!   literal is taken as its own address only when a rule names that literal, so a glob that
//!   happens to match a literal (`*.*.*.*`) keeps the public-only plan.

use std::net::IpAddr;

use super::addr::{AddressPlan, is_always_blocked};
use super::identity::Caller;
use super::revision::PolicyState;
use crate::policy::network::{Binary, Endpoint, Enforcement, HostPattern, Protocol, Rule, TlsMode};

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
        match admission(rule, caller) {
            Ok(()) => allowed.push((rule, endpoints)),
            Err(miss) => binary_misses.push(miss.reason(&rule.key)),
        }
    }
    if allowed.is_empty() {
        if binary_misses.is_empty() {
            return deny(format!(
                "endpoint {host}:{port} is not allowed by any policy"
            ));
        }
        return deny(binary_misses.join("; "));
    }
    // Rules iterate in key order, so the first allowed one is the smallest key.
    let rule = allowed[0].0.key.clone();
    let settings = allowed.iter().find_map(|(r, eps)| {
        eps.iter()
            .find(|(_, e)| e.has_extended_config())
            .map(|(i, e)| (r.key.as_str(), *i, *e))
    });
    // Only a rule that names this host exactly (as a name or as the literal itself) widens
    // the plan past public addresses; a glob never does, whatever the host looks like.
    let exact_declared = allowed.iter().any(|(_, eps)| {
        eps.iter().any(|(_, e)| {
            !e.advisor_proposed && matches!(&e.host, Some(HostPattern::Exact(h)) if *h == host)
        })
    });
    let literal = host
        .parse::<IpAddr>()
        .ok()
        .filter(|ip| exact_declared && !is_always_blocked(*ip));
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

/// Whether `rule`'s binaries admit every process holding the caller's socket (the L7 rules
/// ask the same question of the rules whose endpoints they inspect).
pub fn admits(rule: &Rule, caller: &Caller) -> bool {
    admission(rule, caller).is_ok()
}

/// Why a rule's binaries did not admit a caller.
struct Miss<'a> {
    /// The holder no binary admitted.
    holder: &'a Caller,
    /// Whether it is one of the other holders (not the reported caller).
    other: bool,
    kind: MissKind<'a>,
}

enum MissKind<'a> {
    /// No binary names its executable or (with `descendants`) an ancestor's.
    NoMatch,
    /// A binary names an ancestor, but does not admit descendants.
    AncestorOnly(&'a str),
    /// A binary matched, but the matched process may run code the sandbox chose.
    Untrusted(&'a str, &'a str),
}

impl Miss<'_> {
    /// OpenShell's reason text, plus what narrowed it here.
    fn reason(&self, key: &str) -> String {
        let h = self.holder;
        let mut r = format!(
            "binary '{}' not allowed in policy '{key}' (ancestors: [{}], cmdline: [{}])",
            h.exe,
            h.ancestors.join(" -> "),
            h.cmdline_paths.join(", ")
        );
        if self.other {
            r.push_str(&format!(
                "; it is PID {}, which holds the same socket as the caller",
                h.pid
            ));
        }
        match self.kind {
            MissKind::NoMatch => {}
            MissKind::AncestorOnly(a) => r.push_str(&format!(
                "; its ancestor '{a}' is listed, but the rule admits that binary's descendants only with descendants: true"
            )),
            MissKind::Untrusted(exe, what) => r.push_str(&format!(
                "; '{exe}' may run code the sandbox could have written or chosen ({what}), which the rule admits only with allow_untrusted_code: true"
            )),
        }
        r
    }
}

fn admission<'a>(rule: &'a Rule, caller: &'a Caller) -> Result<(), Miss<'a>> {
    for (i, h) in caller.holders().enumerate() {
        let mut best = MissKind::NoMatch;
        let mut ok = false;
        for b in &rule.binaries {
            match admit_one(b, h) {
                Ok(()) => {
                    ok = true;
                    break;
                }
                // The most telling miss is reported: untrusted code, then an ancestor.
                Err(k @ MissKind::Untrusted(..)) => best = k,
                Err(k @ MissKind::AncestorOnly(_)) if matches!(best, MissKind::NoMatch) => best = k,
                Err(_) => {}
            }
        }
        if !ok {
            return Err(Miss {
                holder: h,
                other: i > 0,
                kind: best,
            });
        }
    }
    Ok(())
}

/// One binary against one holder: its executable, or (with `descendants`) an ancestor's; the
/// matched process must not run untrusted code unless the binary allows it.
fn admit_one<'a>(b: &Binary, h: &'a Caller) -> Result<(), MissKind<'a>> {
    let trusted = |depth: usize, exe: &'a str| match h.untrusted_at(depth) {
        Some(u) if !b.allow_untrusted_code && !b.is_catch_all() => {
            Err(MissKind::Untrusted(exe, u.what.as_str()))
        }
        _ => Ok(()),
    };
    if b.matches(&h.exe) {
        return trusted(0, &h.exe);
    }
    let mut miss = MissKind::NoMatch;
    for (i, a) in h.ancestors.iter().enumerate() {
        if !b.matches(a) {
            continue;
        }
        if !b.descendants {
            miss = MissKind::AncestorOnly(a);
            continue;
        }
        // What the ancestor runs below it is admitted whatever it is; only the ancestor's
        // own code decides.
        match trusted(i + 1, a) {
            Ok(()) => return Ok(()),
            Err(k) => miss = k,
        }
    }
    Err(miss)
}
