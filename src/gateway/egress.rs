//! `serve`'s egress: one [`PolicyHandle`] for the supervisor, published by the policy plane
//! at each revision (or quarantined), and one proxy per sandbox (per revision's view), which
//! lives as long as that sandbox and keeps whatever revision is current. As in OpenShell the
//! proxy runs whatever the rules: a request no rule allows gets the 403 with its reason.
//! Each decision becomes an OCSF Network (4001) or HTTP (4002) Activity record in the log
//! push to the gateway; the same line is the local `NET:OPEN` shorthand.

use std::sync::Arc;

use super::ocsf;
use crate::egress::{self, EventSink, NetEvent, Outcome, PolicyHandle, ProxyHandle};
use crate::exec::Sandbox;
use crate::exec::egress::EgressError;
use crate::policy::network::NetworkRules;

const NETWORK_ACTIVITY: ocsf::Class = ocsf::Class {
    uid: egress::event::NETWORK_ACTIVITY,
    name: "Network Activity",
    short: "NET",
};
const HTTP_ACTIVITY: ocsf::Class = ocsf::Class {
    uid: egress::event::HTTP_ACTIVITY,
    name: "HTTP Activity",
    short: "HTTP",
};

/// The OCSF record of one proxy decision.
pub fn ocsf_event(e: &NetEvent) -> ocsf::Event {
    let (class, activity) = match (&e.via, e.class_uid()) {
        (egress::Via::Forward { method, .. }, egress::event::HTTP_ACTIVITY) => (
            HTTP_ACTIVITY,
            ocsf::Activity {
                id: e.activity_id(),
                // The shorthand names the method; OCSF's activity stays Other (99).
                name: http_method_name(method),
            },
        ),
        _ if e.outcome == Outcome::ClosedByReload => (
            NETWORK_ACTIVITY,
            ocsf::Activity {
                id: 2,
                name: "CLOSE",
            },
        ),
        _ => (
            NETWORK_ACTIVITY,
            ocsf::Activity {
                id: e.activity_id(),
                name: "OPEN",
            },
        ),
    };
    let severity = if e.severity_id() == 1 {
        ocsf::Severity::Informational
    } else {
        ocsf::Severity::Medium
    };
    let who = match &e.caller {
        Some(c) => format!("{}({})", c.exe, c.pid),
        None => format!("?({})", e.src),
    };
    let mut ev =
        ocsf::Event::new(class, activity, severity).subject(format!("{who} -> {}", e.dest));
    ev.action = Some(if e.action_id() == 1 {
        "ALLOWED"
    } else {
        "DENIED"
    });
    ev = ev
        .tag(format!("policy:{} engine:{}", e.rule, e.engine()))
        .detail("message", e.message());
    if let Some(r) = &e.reason {
        ev = ev.detail("reason", r.clone());
    }
    ev
}

/// Methods the shorthand names as they are; anything else is `OTHER` (the activity name is
/// static text, never the client's bytes).
fn http_method_name(m: &str) -> &'static str {
    const KNOWN: [&str; 9] = [
        "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT",
    ];
    KNOWN.into_iter().find(|k| *k == m).unwrap_or("OTHER")
}

/// Events to the `ocsf` target, which the log push carries to the gateway.
pub struct OcsfSink;

impl EventSink for OcsfSink {
    fn emit(&self, event: &NetEvent) {
        ocsf_event(event).emit();
    }
}

/// The proxy of one sandbox, attached to it (see [`Sandbox::attach`]).
pub struct SandboxProxy(#[allow(dead_code)] ProxyHandle);

/// The supervisor's egress: the revision every proxy keeps.
pub struct PlaneEgress {
    policy: PolicyHandle,
}

impl Default for PlaneEgress {
    fn default() -> Self {
        PlaneEgress {
            policy: PolicyHandle::quarantined(
                "no policy could be fetched from the gateway yet".into(),
            ),
        }
    }
}

impl PlaneEgress {
    /// Compile a revision's `network_policies`: an error is the revision's load error.
    pub fn compile(
        rules: &std::collections::BTreeMap<String, crate::policy::openshell::NetworkPolicyRule>,
    ) -> Result<NetworkRules, String> {
        let mut r = NetworkRules::compile(rules).map_err(|e| format!("network_policies: {e}"))?;
        r.expand_binary_links(&|p| egress::procfs::links_in_root(std::path::Path::new("/"), p));
        for w in r.warnings() {
            tracing::warn!(target: "egress", "network_policies: {w}");
        }
        Ok(r)
    }

    /// A new revision applies: every proxy keeps `rules` for new connections at once, and the
    /// tunnels admitted under the old revision are closed. `sandbox` (the revision's) gets a
    /// proxy of its own when it has a network namespace and none yet.
    pub fn adopt(&self, sandbox: &Sandbox, rules: NetworkRules) -> Result<(), EgressError> {
        // Published only once the proxy stands: a failure leaves the last revision in force.
        // Nothing runs in the new sandbox before the slot holds it, after this.
        if sandbox.attached::<SandboxProxy>().is_none() && sandbox.net_namespace().is_some() {
            let proxy =
                crate::exec::egress::start(sandbox, self.policy.clone(), Arc::new(OcsfSink))?;
            sandbox.attach(Arc::new(SandboxProxy(proxy)));
        }
        self.policy.publish(rules);
        Ok(())
    }

    /// `fail_closed` after a revision that cannot be applied: every proxy denies all, saying
    /// why, and closes its open tunnels.
    pub fn quarantine(&self, version: u32, error: &str) {
        self.policy.quarantine(version, error);
    }
}

/// Whether `sandbox` has a proxy: its execs get the proxy variables.
pub fn has_proxy(sandbox: &Sandbox) -> bool {
    sandbox.attached::<SandboxProxy>().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::{Caller, ExecKey, Via};

    fn event(outcome: Outcome, via: Via) -> NetEvent {
        NetEvent {
            outcome,
            via,
            dest: "pub.test:8080".into(),
            rule: if outcome == Outcome::Allowed {
                "pub_http".into()
            } else {
                "-".into()
            },
            reason: (outcome != Outcome::Allowed)
                .then(|| "endpoint pub.test:8080 is not allowed by any policy".into()),
            caller: Some(Caller {
                pid: 42,
                exe: "/usr/bin/curl".into(),
                ancestors: Vec::new(),
                cmdline_paths: Vec::new(),
                exec: ExecKey(1),
                ..Default::default()
            }),
            src: "10.200.0.1:5000".parse().unwrap(),
            generation: 3,
        }
    }

    #[test]
    fn decisions_become_ocsf_network_and_http_activity() {
        let e = ocsf_event(&event(Outcome::Allowed, Via::Connect));
        assert_eq!((e.class.uid, e.type_uid()), (4001, 400101));
        assert_eq!(
            e.shorthand(),
            "NET:OPEN [INFO] ALLOWED /usr/bin/curl(42) -> pub.test:8080 [policy:pub_http engine:opa] [message:\"CONNECT allowed pub.test:8080\"]"
        );
        let d = ocsf_event(&event(
            Outcome::Denied,
            Via::Forward {
                method: "GET".into(),
                path: "/x".into(),
            },
        ));
        assert_eq!((d.class.uid, d.type_uid()), (4002, 400299));
        assert!(
            d.shorthand().starts_with(
                "HTTP:GET [MED] DENIED /usr/bin/curl(42) -> pub.test:8080 [policy:- engine:opa]"
            ),
            "{}",
            d.shorthand()
        );
        assert!(
            d.shorthand()
                .contains("reason:\"endpoint pub.test:8080 is not allowed by any policy\"")
        );
        let odd = ocsf_event(&event(
            Outcome::Denied,
            Via::Forward {
                method: "BREW".into(),
                path: "/".into(),
            },
        ));
        assert!(
            odd.shorthand().starts_with("HTTP:OTHER "),
            "{}",
            odd.shorthand()
        );
        let c = ocsf_event(&event(Outcome::ClosedByReload, Via::Connect));
        assert_eq!(c.type_uid(), 400102);
        assert!(
            c.shorthand().starts_with("NET:CLOSE [MED] DENIED "),
            "{}",
            c.shorthand()
        );
    }
}
