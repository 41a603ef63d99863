//! What is reported per request inside an inspected tunnel: OpenShell's HTTP Activity
//! (4002) `L7_REQUEST` events.

use super::super::identity::Caller;

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
        super::super::event::HTTP_ACTIVITY
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
