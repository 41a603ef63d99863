//! The decision for one HTTP request inside an admitted connection (OpenShell's REST rules):
//! the endpoint whose `path` scope fits, its allow rules (from `rules` or the `access`
//! preset), and every deny rule of the fitting endpoints, which wins over any allow.
//!
//! The rules' globs (scopes, paths, query values) are compiled once per policy revision
//! ([`CompiledRules::compile`]); a request only matches against them. The decision is a pure
//! function of the compiled revision, the destination, the caller and the request.

use crate::policy::network::{
    AccessPreset, Endpoint, Enforcement, Glob, NetworkRules, Protocol, Rule,
};
use crate::policy::openshell::{L7Match, QueryMatcher};

use super::super::identity::Caller;

/// One parsed request, as the rules see it.
#[derive(Debug, Clone)]
pub struct RequestView<'a> {
    /// Upper-case.
    pub method: &'a str,
    /// Canonical (`super::path::canonicalize`).
    pub path: &'a str,
    pub query: &'a [(String, String)],
}

/// An endpoint's `path` scope, compiled.
#[derive(Debug, Clone)]
enum Scope {
    Any,
    /// `/x/**` without other stars: `/x` and below it.
    Subtree(String),
    /// Any other pattern: a glob whose `*` crosses `/`; `None` if it does not compile.
    Glob(Option<Glob>),
}

impl Scope {
    fn new(s: &str) -> Scope {
        match s {
            "" | "**" | "/**" => Scope::Any,
            s => match s.strip_suffix("/**") {
                Some(base) if !base.contains('*') => Scope::Subtree(base.to_string()),
                _ => Scope::Glob(Glob::new(s, 0).ok()),
            },
        }
    }

    fn matches(&self, path: &str) -> bool {
        match self {
            Scope::Any => true,
            Scope::Subtree(base) => {
                path == base || path.strip_prefix(base).is_some_and(|r| r.starts_with('/'))
            }
            Scope::Glob(g) => g.as_ref().is_some_and(|g| g.matches(path)),
        }
    }
}

/// A rule's `path`, compiled.
#[derive(Debug, Clone)]
enum PathMatch {
    /// Empty: matches nothing.
    Never,
    Any,
    /// `*` one segment, `**` any; `None` if it does not compile.
    Glob(Option<Glob>),
}

/// One allow or deny clause, compiled.
#[derive(Debug, Clone)]
struct Clause {
    method: String,
    path: PathMatch,
    /// Configured key -> the globs one of which each value must match.
    query: Vec<(String, Vec<Glob>)>,
}

impl Clause {
    fn new(m: &L7Match) -> Clause {
        let path = match m.path.as_str() {
            "" => PathMatch::Never,
            "**" => PathMatch::Any,
            p => PathMatch::Glob(Glob::new(p, b'/').ok()),
        };
        let query = m
            .query
            .iter()
            .map(|(k, q)| (k.clone(), query_globs(q)))
            .collect();
        Clause {
            method: m.method.clone(),
            path,
            query,
        }
    }

    fn head_matches(&self, req: &RequestView<'_>) -> bool {
        if self.method.is_empty() || !method_matches(&self.method, req.method) {
            return false;
        }
        match &self.path {
            PathMatch::Never => false,
            PathMatch::Any => true,
            PathMatch::Glob(g) => g.as_ref().is_some_and(|g| g.matches(req.path)),
        }
    }

    /// Every configured key present, and every one of its values matching.
    fn allows(&self, req: &RequestView<'_>) -> bool {
        self.head_matches(req)
            && self.query.iter().all(|(k, globs)| {
                let mut vals = req.query.iter().filter(|(n, _)| n == k).peekable();
                vals.peek().is_some() && vals.all(|(_, v)| any_glob(globs, v))
            })
    }

    /// A configured key that is missing: the deny rule does not apply; otherwise any value
    /// that matches makes it apply.
    fn denies(&self, req: &RequestView<'_>) -> bool {
        self.head_matches(req)
            && self
                .query
                .iter()
                .all(|(k, globs)| req.query.iter().any(|(n, v)| n == k && any_glob(globs, v)))
    }
}

fn query_globs(m: &QueryMatcher) -> Vec<Glob> {
    let pats: Vec<&str> = if m.any.is_empty() {
        vec![m.glob.as_str()]
    } else {
        m.any.iter().map(String::as_str).collect()
    };
    pats.into_iter()
        .filter_map(|p| Glob::new(p, 0).ok())
        .collect()
}

fn any_glob(globs: &[Glob], v: &str) -> bool {
    globs.iter().any(|g| g.matches(v))
}

/// One L7 endpoint of a rule, compiled.
#[derive(Debug, Clone)]
pub struct CompiledEndpoint {
    pub endpoint: Endpoint,
    scope: Scope,
    allow: Vec<Clause>,
    deny: Vec<Clause>,
}

#[derive(Debug, Clone)]
struct CompiledRule {
    /// The rule itself: whom it admits is decided as for the connection
    /// (`egress::decide::admits`).
    rule: Rule,
    endpoints: Vec<CompiledEndpoint>,
}

/// The L7 side of one revision's rules: every L7 endpoint with its globs compiled.
#[derive(Debug, Clone, Default)]
pub struct CompiledRules {
    rules: Vec<CompiledRule>,
}

impl CompiledRules {
    /// Compile the L7 endpoints of `rules` (once per revision).
    pub fn compile(rules: &NetworkRules) -> CompiledRules {
        let rules = rules
            .rules()
            .iter()
            .map(|r| CompiledRule {
                rule: r.clone(),
                endpoints: r
                    .endpoints
                    .iter()
                    .filter(|e| e.protocol.is_l7())
                    .map(|e| CompiledEndpoint {
                        scope: Scope::new(&e.path),
                        allow: allow_rules(e).iter().map(Clause::new).collect(),
                        deny: e.deny_rules.iter().map(Clause::new).collect(),
                        endpoint: e.clone(),
                    })
                    .collect(),
            })
            .collect();
        CompiledRules { rules }
    }
}

/// The L7 endpoints a connection to `host:port` from `caller` is subject to.
#[derive(Debug, Clone, Default)]
pub struct L7Scope<'r> {
    /// (rule key, endpoint), in key order then endpoint order.
    pub endpoints: Vec<(&'r str, &'r CompiledEndpoint)>,
}

/// What happens to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Forward it.
    Allow { rule: String },
    /// The rules would deny it, but the endpoint only audits: forward it and log `audit`.
    Audit { rule: String, reason: String },
    /// Refuse it.
    Deny { rule: String, reason: String },
}

impl<'r> L7Scope<'r> {
    /// The L7 endpoints (protocol set) of the rules that admit `caller` to `host` (lower-case)
    /// on `port`.
    pub fn of(rules: &'r CompiledRules, host: &str, port: u16, caller: &Caller) -> L7Scope<'r> {
        let mut endpoints = Vec::new();
        for rule in &rules.rules {
            if !crate::egress::decide::admits(&rule.rule, caller) {
                continue;
            }
            for e in &rule.endpoints {
                if e.endpoint.matches(host, port) {
                    endpoints.push((rule.rule.key.as_str(), e));
                }
            }
        }
        L7Scope { endpoints }
    }

    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// The protocol the scope's endpoints speak (the first one's).
    pub fn protocol(&self) -> Option<Protocol> {
        self.endpoints.first().map(|(_, e)| e.endpoint.protocol)
    }

    /// The endpoint whose `path` scope fits `path` best (the most characters that are not
    /// `*`), first in key order on a tie.
    pub fn select(&self, path: &str) -> Option<(&'r str, &'r Endpoint)> {
        self.select_compiled(path).map(|(k, e)| (k, &e.endpoint))
    }

    fn select_compiled(&self, path: &str) -> Option<(&'r str, &'r CompiledEndpoint)> {
        let mut best: Option<(usize, (&'r str, &'r CompiledEndpoint))> = None;
        for &(k, e) in &self.endpoints {
            if !e.scope.matches(path) {
                continue;
            }
            let score = e.endpoint.path.chars().filter(|c| *c != '*').count();
            if best.is_none_or(|(s, _)| score > s) {
                best = Some((score, (k, e)));
            }
        }
        best.map(|(_, ke)| ke)
    }

    /// Decide one request.
    pub fn evaluate(&self, req: &RequestView<'_>) -> Verdict {
        let Some((key, endpoint)) = self.select_compiled(req.path) else {
            let (key, e) = self.endpoints[0];
            return finish(
                key,
                e.endpoint.enforcement,
                "no L7 endpoint path matched request".to_string(),
            );
        };
        let denied = self
            .endpoints
            .iter()
            .filter(|(_, e)| e.scope.matches(req.path))
            .any(|(_, e)| e.deny.iter().any(|d| d.denies(req)));
        let m = req.method;
        let enforcement = endpoint.endpoint.enforcement;
        if denied {
            return finish(
                key,
                enforcement,
                format!("{m} {} blocked by deny rule", req.path),
            );
        }
        if endpoint.allow.iter().any(|a| a.allows(req)) {
            return Verdict::Allow {
                rule: key.to_string(),
            };
        }
        finish(
            key,
            enforcement,
            format!("{m} {} not permitted by policy", req.path),
        )
    }
}

fn finish(key: &str, enforcement: Enforcement, reason: String) -> Verdict {
    let rule = key.to_string();
    match enforcement {
        Enforcement::Enforce => Verdict::Deny { rule, reason },
        Enforcement::Audit => Verdict::Audit { rule, reason },
    }
}

/// An endpoint's `path` scope: empty, `**` or `/**` any path; `/x/**` is `/x` and below it;
/// anything else a glob whose `*` crosses `/`.
pub fn scope_matches(scope: &str, path: &str) -> bool {
    Scope::new(scope).matches(path)
}

fn m(method: &str, path: &str) -> L7Match {
    L7Match {
        method: method.into(),
        path: path.into(),
        ..Default::default()
    }
}

/// The allow clauses of an endpoint: its `rules`, or its `access` preset expanded.
pub fn allow_rules(e: &Endpoint) -> Vec<L7Match> {
    let Some(preset) = e.access else {
        return e.rules.clone();
    };
    let ws = e.protocol == Protocol::Websocket;
    let mut v = match preset {
        AccessPreset::Full => return vec![m("*", "**")],
        AccessPreset::ReadOnly | AccessPreset::ReadWrite if ws => vec![m("GET", "**")],
        AccessPreset::ReadOnly | AccessPreset::ReadWrite => {
            vec![m("GET", "**"), m("HEAD", "**"), m("OPTIONS", "**")]
        }
    };
    if preset == AccessPreset::ReadWrite {
        if ws {
            v.push(m("WEBSOCKET_TEXT", "**"));
        } else {
            v.extend(["POST", "PUT", "PATCH"].map(|x| m(x, "**")));
        }
    }
    v
}

fn method_matches(rule: &str, method: &str) -> bool {
    rule == "*"
        || rule.eq_ignore_ascii_case(method)
        || (rule.eq_ignore_ascii_case("GET") && method == "HEAD")
}
