//! The decision for one HTTP request inside an admitted connection (OpenShell's REST rules):
//! the endpoint whose `path` scope fits, its allow rules (from `rules` or the `access`
//! preset), and every deny rule of the fitting endpoints, which wins over any allow.
//!
//! A pure function of the revision, the destination, the caller and the request.

use crate::policy::network::{AccessPreset, Endpoint, Enforcement, Glob, NetworkRules, Protocol};
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

/// The L7 endpoints a connection to `host:port` from `caller` is subject to.
#[derive(Debug, Clone, Default)]
pub struct L7Scope<'r> {
    /// (rule key, endpoint), in key order then endpoint order.
    pub endpoints: Vec<(&'r str, &'r Endpoint)>,
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
    pub fn of(rules: &'r NetworkRules, host: &str, port: u16, caller: &Caller) -> L7Scope<'r> {
        let mut endpoints = Vec::new();
        for rule in rules.rules() {
            if !crate::egress::decide::admits(rule, caller) {
                continue;
            }
            for e in &rule.endpoints {
                if e.protocol.is_l7() && e.matches(host, port) {
                    endpoints.push((rule.key.as_str(), e));
                }
            }
        }
        L7Scope { endpoints }
    }

    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// The endpoint whose `path` scope fits `path` best (the most characters that are not
    /// `*`), first in key order on a tie.
    pub fn select(&self, path: &str) -> Option<(&'r str, &'r Endpoint)> {
        let mut best: Option<(usize, (&'r str, &'r Endpoint))> = None;
        for &(k, e) in &self.endpoints {
            if !scope_matches(&e.path, path) {
                continue;
            }
            let score = e.path.chars().filter(|c| *c != '*').count();
            if best.is_none_or(|(s, _)| score > s) {
                best = Some((score, (k, e)));
            }
        }
        best.map(|(_, ke)| ke)
    }

    /// Decide one request.
    pub fn evaluate(&self, req: &RequestView<'_>) -> Verdict {
        let Some((key, endpoint)) = self.select(req.path) else {
            let (key, e) = self.endpoints[0];
            return finish(
                key,
                e.enforcement,
                "no L7 endpoint path matched request".to_string(),
            );
        };
        let denied = self
            .endpoints
            .iter()
            .filter(|(_, e)| scope_matches(&e.path, req.path))
            .any(|(_, e)| e.deny_rules.iter().any(|d| deny_matches(d, req)));
        let m = req.method;
        if denied {
            return finish(
                key,
                endpoint.enforcement,
                format!("{m} {} blocked by deny rule", req.path),
            );
        }
        if allow_rules(endpoint).iter().any(|a| allow_matches(a, req)) {
            return Verdict::Allow {
                rule: key.to_string(),
            };
        }
        finish(
            key,
            endpoint.enforcement,
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
    match scope {
        "" | "**" | "/**" => true,
        s => {
            if let Some(base) = s.strip_suffix("/**")
                && !base.contains('*')
            {
                return path == base || path.strip_prefix(base).is_some_and(|r| r.starts_with('/'));
            }
            Glob::new(s, 0).is_ok_and(|g| g.matches(path))
        }
    }
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

fn path_matches(rule: &str, path: &str) -> bool {
    match rule {
        "" => false,
        "**" => true,
        r => Glob::new(r, b'/').is_ok_and(|g| g.matches(path)),
    }
}

fn value_matches(m: &QueryMatcher, v: &str) -> bool {
    let one = |p: &str| Glob::new(p, 0).is_ok_and(|g| g.matches(v));
    if m.any.is_empty() {
        one(&m.glob)
    } else {
        m.any.iter().any(|p| one(p))
    }
}

fn allow_matches(a: &L7Match, req: &RequestView<'_>) -> bool {
    if a.method.is_empty() || !method_matches(&a.method, req.method) {
        return false;
    }
    if !path_matches(&a.path, req.path) {
        return false;
    }
    // Every configured key present, and every one of its values matching.
    a.query.iter().all(|(k, mt)| {
        let mut vals = req.query.iter().filter(|(n, _)| n == k).peekable();
        vals.peek().is_some() && vals.all(|(_, v)| value_matches(mt, v))
    })
}

fn deny_matches(d: &L7Match, req: &RequestView<'_>) -> bool {
    if d.method.is_empty() || !method_matches(&d.method, req.method) {
        return false;
    }
    if !path_matches(&d.path, req.path) {
        return false;
    }
    // A configured key that is missing: the deny rule does not apply; otherwise any value
    // that matches makes it apply.
    d.query.iter().all(|(k, mt)| {
        req.query
            .iter()
            .any(|(n, v)| n == k && value_matches(mt, v))
    })
}
