//! The compiled rules' types: what `validate.rs` builds and the egress proxy's decision reads.

use super::glob::Glob;
use crate::policy::openshell::L7Match;
use ipnet::IpNet;

/// The compiled network rules of one policy revision. Rules are kept in key order, which is
/// the order OpenShell reports a match in (the lexicographically smallest key).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NetworkRules {
    pub(super) rules: Vec<Rule>,
    pub(super) warnings: Vec<NetworkWarning>,
}

/// One rule: a key, its endpoints and the binaries it admits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub key: String,
    /// Display name only; matching and reports use [`Rule::key`].
    pub name: String,
    pub endpoints: Vec<Endpoint>,
    /// Empty: the rule matches nothing (OpenShell's strict binary identity).
    pub binaries: Vec<Binary>,
}

/// One endpoint of a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `None`: a hostless endpoint, matching any host on its ports whose addresses are all in
    /// `allowed_ips` (it matches nothing without them).
    pub host: Option<HostPattern>,
    /// Sorted, no duplicates; empty matches nothing.
    pub ports: Vec<u16>,
    pub allowed_ips: Vec<IpNet>,
    pub protocol: Protocol,
    pub tls: TlsMode,
    pub enforcement: Enforcement,
    /// `None` when absent, or when the preset is one OpenShell ignores (with a warning).
    pub access: Option<AccessPreset>,
    pub rules: Vec<L7Match>,
    pub deny_rules: Vec<L7Match>,
    /// The L7 path scope; empty = every path.
    pub path: String,
    pub allow_encoded_slash: bool,
    /// Advisor-proposed endpoints never count as an exact declared host for the address
    /// checks.
    pub advisor_proposed: bool,
    /// Placeholders in textual request bodies are replaced too (`rest` only).
    pub request_body_credential_rewrite: bool,
    /// `credential_binding.provider`: whose credentials may go here.
    pub credential_provider: Option<String>,
}

/// An endpoint host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// Lower-cased; compared byte for byte with the lower-cased request host, so a trailing
    /// dot matters.
    Exact(String),
    /// Lower-cased; labels split by `.`.
    Glob(Glob),
}

impl HostPattern {
    /// `host` must already be lower-case.
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Exact(h) => h == host,
            HostPattern::Glob(g) => g.matches(host),
        }
    }

    pub fn is_exact(&self) -> bool {
        matches!(self, HostPattern::Exact(_))
    }

    pub fn as_str(&self) -> &str {
        match self {
            HostPattern::Exact(h) => h,
            HostPattern::Glob(g) => g.as_str(),
        }
    }
}

/// A binary of a rule: its path or glob, and what it admits besides a process running it
/// (`crate::egress::decide` applies them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binary {
    pub pattern: BinaryPattern,
    /// Also admit a process one of whose ancestors matches (OpenShell's ancestor rule, here
    /// only where the policy asks for it).
    pub descendants: bool,
    /// Admit a matching process even when it may run code the sandbox could have written or
    /// chosen (dynamic-loader preload or audit, executable mappings of writable files).
    pub allow_untrusted_code: bool,
}

impl Binary {
    pub fn matches(&self, exe: &str) -> bool {
        self.pattern.matches(exe)
    }

    pub fn as_str(&self) -> &str {
        self.pattern.as_str()
    }

    /// A glob that admits every executable (`/**`, `**`): who is calling does not matter to
    /// it, so neither does what the caller loaded.
    pub fn is_catch_all(&self) -> bool {
        matches!(&self.pattern, BinaryPattern::Glob(g) if matches!(g.as_str(), "/**" | "**"))
    }
}

/// A binary path or glob, matched against an executable path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BinaryPattern {
    /// A path, plus the paths it leads to through symlinks inside the sandbox
    /// ([`NetworkRules::expand_binary_links`]): `/usr/bin/python3` also admits
    /// `/usr/bin/python3.11`, which is what the kernel reports as the executable.
    Exact { path: String, targets: Vec<String> },
    /// Segments split by `/`.
    Glob(Glob),
}

impl BinaryPattern {
    pub fn matches(&self, exe: &str) -> bool {
        match self {
            BinaryPattern::Exact { path, targets } => {
                path == exe || targets.iter().any(|t| t == exe)
            }
            BinaryPattern::Glob(g) => g.matches(exe),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            BinaryPattern::Exact { path, .. } => path,
            BinaryPattern::Glob(g) => g.as_str(),
        }
    }
}

/// `protocol`. `tcp` (policy DNS and transparent capture) is refused at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// Absent or empty: host, port and binary are authorised; the payload is not inspected.
    L4,
    Rest,
    Websocket,
    Graphql,
    Sql,
    JsonRpc,
    Mcp,
}

impl Protocol {
    pub fn is_l7(self) -> bool {
        self != Protocol::L4
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::L4 => "",
            Protocol::Rest => "rest",
            Protocol::Websocket => "websocket",
            Protocol::Graphql => "graphql",
            Protocol::Sql => "sql",
            Protocol::JsonRpc => "json-rpc",
            Protocol::Mcp => "mcp",
        }
    }
}

/// `tls`: `skip` keeps a raw tunnel; anything else (empty, or the deprecated `terminate` and
/// `passthrough`) is automatic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    Auto,
    Skip,
}

/// `enforcement`: only L7 request decisions depend on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    /// The default: log and forward.
    Audit,
    Enforce,
}

/// `access`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessPreset {
    ReadOnly,
    ReadWrite,
    Full,
}

/// Something OpenShell accepts with a warning, or that matches nothing; for the log and for
/// `check --explain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkWarning {
    /// e.g. `network_policies.github.endpoints[0].allowed_ips[1]`.
    pub key: String,
    pub message: String,
}

impl std::fmt::Display for NetworkWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// Why `network_policies` was refused. The message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct NetworkPolicyError {
    pub key: String,
    pub message: String,
}

impl NetworkRules {
    /// No rules: every connection is denied.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// In key order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    pub fn warnings(&self) -> &[NetworkWarning] {
        &self.warnings
    }

    /// Every exact binary path of every rule, for [`Self::expand_binary_links`]'s caller.
    pub fn exact_binaries(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .rules
            .iter()
            .flat_map(|r| &r.binaries)
            .filter_map(|b| match &b.pattern {
                BinaryPattern::Exact { path, .. } => Some(path.clone()),
                BinaryPattern::Glob(_) => None,
            })
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Add, to every exact binary path, the paths `resolve` says it leads to through symlinks
    /// (OpenShell resolves them inside the sandbox's root; the caller does the resolving, so
    /// that this stays free of syscalls). Replaces earlier targets.
    pub fn expand_binary_links(&mut self, resolve: &dyn Fn(&str) -> Vec<String>) {
        for b in self.rules.iter_mut().flat_map(|r| r.binaries.iter_mut()) {
            if let BinaryPattern::Exact { path, targets } = &mut b.pattern {
                *targets = resolve(path).into_iter().filter(|t| t != path).collect();
            }
        }
    }

    /// Endpoints that need L7 inspection (for CONNECT: an L7 protocol without `tls: skip`), as
    /// (rule key, endpoint index). The proxy of this step denies connections to them; the
    /// caller may prefer to report the policy as not enforceable instead.
    pub fn inspected_endpoints(&self) -> Vec<(String, usize)> {
        self.rules
            .iter()
            .flat_map(|r| {
                r.endpoints
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| e.protocol.is_l7())
                    .map(|(i, _)| (r.key.clone(), i))
            })
            .collect()
    }
}

impl Endpoint {
    /// OpenShell's "extended config": what makes an endpoint's settings (allowed_ips, tls,
    /// protocol) the ones a connection uses.
    pub fn has_extended_config(&self) -> bool {
        self.protocol.is_l7() || !self.allowed_ips.is_empty() || self.tls == TlsMode::Skip
    }

    /// Whether this endpoint covers `host` (lower-case) on `port`.
    pub fn matches(&self, host: &str, port: u16) -> bool {
        if self.ports.binary_search(&port).is_err() {
            return false;
        }
        match &self.host {
            Some(h) => h.matches(host),
            None => !self.allowed_ips.is_empty(),
        }
    }
}
