//! What the proxy reports: one [`NetEvent`] per decision and per tunnel closed by a policy
//! change, handed to an [`EventSink`], plus per-sandbox and per-exec counters.
//!
//! The event carries OpenShell's OCSF facts (class, activity, action, disposition, severity,
//! `firewall_rule`, message) so that the gateway side can turn it into its OCSF record without
//! deciding anything again; [`NetEvent::shorthand`] is the local `NET:OPEN …` line.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::identity::{Caller, ExecKey};

/// OCSF Network Activity.
pub const NETWORK_ACTIVITY: u32 = 4001;
/// OCSF HTTP Activity (the forward path).
pub const HTTP_ACTIVITY: u32 = 4002;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted and dialed.
    Allowed,
    /// Refused by the rules (or quarantine, or an unidentifiable caller): `engine:opa`.
    Denied,
    /// Refused by the address checks: `engine:ssrf`.
    AddressDenied,
    /// An open connection closed because the policy generation moved on.
    ClosedByReload,
}

/// CONNECT or an absolute-form forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    Connect,
    /// Method and origin-form path (without the query, which may carry secrets).
    Forward {
        method: String,
        path: String,
    },
}

/// One report.
#[derive(Debug, Clone)]
pub struct NetEvent {
    pub outcome: Outcome,
    pub via: Via,
    /// `host:port` as policy saw it.
    pub dest: String,
    /// The matched rule key (allows), or `-`.
    pub rule: String,
    /// Why it was denied, or the address-check detail.
    pub reason: Option<String>,
    pub caller: Option<Caller>,
    /// The client's address as the proxy saw it.
    pub src: SocketAddr,
    pub generation: u64,
}

impl NetEvent {
    pub fn class_uid(&self) -> u32 {
        match (&self.via, self.outcome) {
            (Via::Forward { .. }, Outcome::Allowed | Outcome::Denied | Outcome::AddressDenied) => {
                HTTP_ACTIVITY
            }
            _ => NETWORK_ACTIVITY,
        }
    }

    /// OCSF activity: Open (1) for CONNECT decisions and reload closes, Other (99) for HTTP.
    pub fn activity_id(&self) -> u8 {
        if self.class_uid() == HTTP_ACTIVITY {
            99
        } else {
            1
        }
    }

    /// OCSF action_id: 1 Allowed, 2 Denied.
    pub fn action_id(&self) -> u8 {
        if self.outcome == Outcome::Allowed {
            1
        } else {
            2
        }
    }

    /// OCSF disposition_id: 1 Allowed, 2 Blocked.
    pub fn disposition_id(&self) -> u8 {
        self.action_id()
    }

    /// OCSF severity_id: Informational (1) for allows, Medium (3) otherwise.
    pub fn severity_id(&self) -> u8 {
        if self.outcome == Outcome::Allowed {
            1
        } else {
            3
        }
    }

    /// `firewall_rule.type`.
    pub fn engine(&self) -> &'static str {
        match self.outcome {
            Outcome::AddressDenied => "ssrf",
            Outcome::ClosedByReload => "reload",
            _ => "opa",
        }
    }

    /// OCSF `message`, in OpenShell's words.
    pub fn message(&self) -> String {
        let d = &self.dest;
        match (&self.via, self.outcome) {
            (Via::Connect, Outcome::Allowed) => format!("CONNECT allowed {d}"),
            (Via::Connect, Outcome::Denied) => format!("CONNECT denied {d}"),
            (Via::Connect, Outcome::AddressDenied) => {
                format!("CONNECT blocked: internal address {d}")
            }
            (Via::Forward { method, path }, Outcome::Allowed) => {
                format!("FORWARD allowed {method} {d}{path}")
            }
            (Via::Forward { method, path }, Outcome::Denied) => {
                format!("FORWARD denied {method} {d}{path}")
            }
            (Via::Forward { method, path }, Outcome::AddressDenied) => {
                format!("FORWARD blocked: internal address {method} {d}{path}")
            }
            (_, Outcome::ClosedByReload) => format!(
                "tunnel closed after policy reload [{d} captured_generation:{}]",
                self.generation
            ),
        }
    }

    /// `NET:OPEN [INFO] ALLOWED /usr/bin/curl(42) -> pub.test:8080 [policy:pub_http engine:opa]`,
    /// with `[reason:…]` on denials.
    pub fn shorthand(&self) -> String {
        let class = match (&self.via, self.class_uid()) {
            (Via::Forward { method, .. }, HTTP_ACTIVITY) => format!("HTTP:{method}"),
            (_, _) if self.outcome == Outcome::ClosedByReload => "NET:CLOSE".to_string(),
            _ => "NET:OPEN".to_string(),
        };
        let sev = if self.severity_id() == 1 {
            "INFO"
        } else {
            "MED"
        };
        let action = if self.action_id() == 1 {
            "ALLOWED"
        } else {
            "DENIED"
        };
        let who = match &self.caller {
            Some(c) => format!("{}({})", c.exe, c.pid),
            None => format!("?({})", self.src),
        };
        let mut s = format!(
            "{class} [{sev}] {action} {who} -> {} [policy:{} engine:{}]",
            self.dest,
            self.rule,
            self.engine()
        );
        if let Some(r) = &self.reason {
            s.push_str(&format!(" [reason:{r}]"));
        }
        s
    }
}

/// Where events go. The proxy calls it inline on its tasks: it must not block.
pub trait EventSink: Send + Sync + 'static {
    fn emit(&self, event: &NetEvent);

    /// One request inside an inspected tunnel; by default its shorthand on the log.
    fn emit_l7(&self, event: &L7Event) {
        let line = event.shorthand();
        if event.action_id() == 1 {
            tracing::info!(target: "egress", "{line}");
        } else {
            tracing::warn!(target: "egress", "{line}");
        }
    }
}

/// The default sink: the shorthand on the `egress` tracing target (denials at WARN).
pub struct LogSink;

impl EventSink for LogSink {
    fn emit(&self, event: &NetEvent) {
        let line = event.shorthand();
        if event.outcome == Outcome::Allowed {
            tracing::info!(target: "egress", "{line}");
        } else {
            tracing::warn!(target: "egress", "{line}");
        }
    }
}

/// Allowed and denied connection counts, and the decisions on HTTP requests inside
/// inspected tunnels and forwards.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub allowed: u64,
    pub denied: u64,
    /// Requests allowed by an L7 rule, or passed on an L4 endpoint whose TLS was intercepted.
    pub requests_allowed: u64,
    /// Requests an `audit` endpoint's rules would deny, forwarded.
    pub requests_audited: u64,
    /// Requests refused (rules, authority, placeholders, a target with no canonical form).
    pub requests_denied: u64,
}

/// The counters of one proxy (one sandbox), and of each exec in it.
#[derive(Default)]
pub struct Counters {
    allowed: AtomicU64,
    denied: AtomicU64,
    requests: [AtomicU64; 3],
    per_exec: Mutex<HashMap<ExecKey, Counts>>,
}

/// A sink that counts each request decision into [`Counters`] before passing it on.
pub struct Counted {
    pub counters: std::sync::Arc<Counters>,
    pub inner: std::sync::Arc<dyn EventSink>,
}

impl EventSink for Counted {
    fn emit(&self, event: &NetEvent) {
        self.inner.emit(event);
    }

    fn emit_l7(&self, event: &L7Event) {
        self.counters.record_l7(event.decision, event.caller.exec);
        self.inner.emit_l7(event);
    }
}

impl Counters {
    pub(super) fn record(&self, outcome: Outcome, exec: Option<ExecKey>) {
        let allowed = match outcome {
            Outcome::Allowed => true,
            Outcome::Denied | Outcome::AddressDenied => false,
            Outcome::ClosedByReload => return,
        };
        if allowed {
            self.allowed.fetch_add(1, Ordering::Relaxed);
        } else {
            self.denied.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(k) = exec {
            let mut m = self.per_exec.lock().unwrap_or_else(|p| p.into_inner());
            let c = m.entry(k).or_default();
            if allowed {
                c.allowed += 1;
            } else {
                c.denied += 1;
            }
        }
    }

    /// One request decision inside an inspected tunnel or a forward.
    pub fn record_l7(&self, decision: L7Decision, exec: ExecKey) {
        let i = match decision {
            L7Decision::Allow | L7Decision::Passthrough => 0,
            L7Decision::Audit => 1,
            L7Decision::Deny | L7Decision::ParseRejected => 2,
        };
        self.requests[i].fetch_add(1, Ordering::Relaxed);
        let mut m = self.per_exec.lock().unwrap_or_else(|p| p.into_inner());
        let c = m.entry(exec).or_default();
        match i {
            0 => c.requests_allowed += 1,
            1 => c.requests_audited += 1,
            _ => c.requests_denied += 1,
        }
    }

    /// The whole sandbox's counts.
    pub fn total(&self) -> Counts {
        Counts {
            allowed: self.allowed.load(Ordering::Relaxed),
            denied: self.denied.load(Ordering::Relaxed),
            requests_allowed: self.requests[0].load(Ordering::Relaxed),
            requests_audited: self.requests[1].load(Ordering::Relaxed),
            requests_denied: self.requests[2].load(Ordering::Relaxed),
        }
    }

    /// One exec's counts so far.
    pub fn exec(&self, key: ExecKey) -> Counts {
        let m = self.per_exec.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&key).copied().unwrap_or_default()
    }

    /// One exec's counts, forgetting them (call when the exec's report is written).
    pub fn take_exec(&self, key: ExecKey) -> Counts {
        let mut m = self.per_exec.lock().unwrap_or_else(|p| p.into_inner());
        m.remove(&key).unwrap_or_default()
    }
}

// What is reported per request inside an inspected tunnel: OpenShell's HTTP Activity (4002)
// `L7_REQUEST` events. Here, below `l7`, so that every sink sees one event module.

/// The decision on one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L7Decision {
    Allow,
    /// Would be denied; forwarded because the endpoint only audits.
    Audit,
    Deny,
    /// The request-target had no canonical form: the tunnel was closed without an answer.
    ParseRejected,
    /// A request inside an intercepted tunnel to an L4 endpoint (no rules apply).
    Passthrough,
}

impl L7Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            L7Decision::Allow => "allow",
            L7Decision::Audit => "audit",
            L7Decision::Deny => "deny",
            L7Decision::ParseRejected => "deny",
            L7Decision::Passthrough => "passthrough",
        }
    }
}

/// One request's event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct L7Event {
    pub decision: L7Decision,
    pub method: String,
    /// `host:port`.
    pub dest: String,
    /// Canonical, without the query, placeholders redacted.
    pub path: String,
    /// The rule key, or `-`.
    pub rule: String,
    pub reason: Option<String>,
    pub caller: Caller,
    pub generation: u64,
    /// Whether placeholders of this request were replaced.
    pub credentials_injected: bool,
}

impl L7Event {
    /// OCSF class: HTTP Activity.
    pub fn class_uid(&self) -> u32 {
        HTTP_ACTIVITY
    }

    /// Action: 1 Allowed, 2 Denied.
    pub fn action_id(&self) -> u8 {
        match self.decision {
            L7Decision::Allow | L7Decision::Audit | L7Decision::Passthrough => 1,
            L7Decision::Deny | L7Decision::ParseRejected => 2,
        }
    }

    /// Severity: 1 Informational, 3 Medium.
    pub fn severity_id(&self) -> u8 {
        match self.decision {
            L7Decision::Allow | L7Decision::Audit | L7Decision::Passthrough => 1,
            L7Decision::Deny | L7Decision::ParseRejected => 3,
        }
    }

    /// `L7_REQUEST allow GET api.test:8080/x reason=…`.
    pub fn message(&self) -> String {
        if self.decision == L7Decision::Passthrough {
            return format!(
                "HTTP_REQUEST {} {}{} credentials_injected={}",
                self.method, self.dest, self.path, self.credentials_injected
            );
        }
        let mut m = format!(
            "L7_REQUEST {} {} {}{}",
            self.decision.as_str(),
            self.method,
            self.dest,
            self.path
        );
        if let Some(r) = &self.reason {
            m.push_str(&format!(" reason={r}"));
        }
        m
    }

    /// The local line: `HTTP:GET [INFO] ALLOWED /usr/bin/curl(42) -> GET http://h:p/x [policy:k engine:l7]`.
    pub fn shorthand(&self) -> String {
        let (sev, act) = match self.decision {
            L7Decision::Allow | L7Decision::Audit | L7Decision::Passthrough => ("INFO", "ALLOWED"),
            L7Decision::Deny | L7Decision::ParseRejected => ("MED", "DENIED"),
        };
        let mut s = format!(
            "HTTP:{} [{sev}] {act} {}({}) -> {} http://{}{} [policy:{} engine:l7]",
            self.method,
            self.caller.exe,
            self.caller.pid,
            self.method,
            self.dest,
            self.path,
            self.rule
        );
        if let Some(r) = &self.reason {
            s.push_str(&format!(" [reason:{r}]"));
        }
        s
    }
}
