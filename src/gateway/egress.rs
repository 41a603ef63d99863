//! `serve`'s egress: one [`PolicyHandle`] for the supervisor, published by the policy plane
//! at each revision (or quarantined), and one proxy per sandbox (per revision's view), which
//! lives as long as that sandbox and keeps whatever revision is current. As in OpenShell the
//! proxy runs whatever the rules: a request no rule allows gets the 403 with its reason.
//! Each decision becomes an OCSF Network (4001) or HTTP (4002) Activity record in the log
//! push to the gateway; the same line is the local `NET:OPEN` shorthand.

use std::sync::Arc;

use super::ocsf;
use crate::egress::{
    self, Binding, CredentialStore, Credentials, EventSink, L7Event, NetEvent, Outcome,
    PolicyHandle, ProxyHandle,
};
use crate::exec::Sandbox;
use crate::exec::egress::EgressError;
use crate::exec::interception::Interception;
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

/// The OCSF record of one request decision inside an inspected tunnel or a forward: HTTP
/// Activity (4002), `firewall_rule{rule key, l7}`, OpenShell's `L7_REQUEST` / `HTTP_REQUEST`
/// message (placeholders already redacted, no query).
pub fn ocsf_l7_event(e: &L7Event) -> ocsf::Event {
    let severity = if e.severity_id() == 1 {
        ocsf::Severity::Informational
    } else {
        ocsf::Severity::Medium
    };
    let activity = ocsf::Activity {
        id: 99,
        name: http_method_name(&e.method),
    };
    let who = format!("{}({})", e.caller.exe, e.caller.pid);
    let mut ev = ocsf::Event::new(HTTP_ACTIVITY, activity, severity)
        .subject(format!("{who} -> {} http://{}{}", e.method, e.dest, e.path));
    ev.action = Some(if e.action_id() == 1 {
        "ALLOWED"
    } else {
        "DENIED"
    });
    ev = ev
        .tag(format!("policy:{} engine:l7", e.rule))
        .detail("message", e.message());
    if let Some(r) = &e.reason {
        ev = ev.detail("reason", r.clone());
    }
    ev
}

/// Events to the `ocsf` target, which the log push carries to the gateway.
pub struct OcsfSink;

impl EventSink for OcsfSink {
    fn emit(&self, event: &NetEvent) {
        ocsf_event(event).emit();
    }

    fn emit_l7(&self, event: &L7Event) {
        ocsf_l7_event(event).emit();
    }
}

/// The proxy of one sandbox, attached to it (see [`Sandbox::attach`]), and what its children
/// get besides the proxy variables: the CA's trust variables when the view shows its files.
pub struct SandboxProxy {
    _proxy: ProxyHandle,
    ca_env: Vec<(&'static str, String)>,
}

/// The supervisor's TLS interception and provider credentials, shared by every sandbox (every
/// policy revision's view): one CA made at start, in memory only; one credential store,
/// replaced at each provider refresh and at each policy revision (whose endpoints'
/// `credential_binding` bind the provider's values too).
pub struct ServeEgress {
    interception: Interception,
    pub credentials: CredentialStore,
    /// What the store is made of: the last provider environment's values with their own
    /// bindings, and the current revision's `credential_binding`s.
    parts: std::sync::Mutex<(Credentials, Vec<(String, Binding)>)>,
    refresh: tokio::sync::Notify,
    provider_revision: std::sync::Mutex<Option<u64>>,
}

impl ServeEgress {
    /// Make the CA (see [`Interception::prepare`]); a failure is reported (OCSF Config, High)
    /// and leaves every CONNECT but `tls: skip` refused.
    pub fn prepare() -> ServeEgress {
        let interception = Interception::prepare();
        if let Some(why) =
            interception.unavailable(Some(std::path::Path::new(crate::egress::tls::TLS_DIR)))
        {
            ocsf::Event::config(ocsf::Severity::High, "FAILED")
                .subject("TLS interception".into())
                .detail("reason", why)
                .detail(
                    "action",
                    "CONNECTs other than tls: skip are refused (503 tls_termination_unavailable)"
                        .into(),
                )
                .emit();
        }
        ServeEgress {
            interception,
            credentials: CredentialStore::default(),
            parts: Default::default(),
            refresh: tokio::sync::Notify::new(),
            provider_revision: std::sync::Mutex::new(None),
        }
    }

    /// A provider environment was fetched (or revoked: an empty store): requests from now on
    /// get its values, bound where its bindings and the current revision's say.
    pub fn set_provider_credentials(&self, c: Credentials) {
        let mut parts = self.parts.lock().unwrap_or_else(|p| p.into_inner());
        parts.0 = c;
        self.credentials
            .replace(parts.0.with_policy_bindings(parts.1.clone()));
    }

    /// A revision's `credential_binding`s (provider, where) replace the last one's.
    pub fn set_policy_bindings(&self, bindings: Vec<(String, Binding)>) {
        let mut parts = self.parts.lock().unwrap_or_else(|p| p.into_inner());
        if parts.1 == bindings {
            return;
        }
        parts.1 = bindings;
        self.credentials
            .replace(parts.0.with_policy_bindings(parts.1.clone()));
    }

    /// The files each revision's view shows (`NamespacePolicy::files`).
    pub fn view_files(&self) -> Option<crate::policy::ViewFiles> {
        self.interception.view_files()
    }

    /// The gateway's `provider_env_revision` seen in a config answer: a change refetches the
    /// provider environment.
    pub fn provider_revision(&self, rev: u64) {
        let mut seen = self
            .provider_revision
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if seen.is_some_and(|s| s != rev) {
            self.refresh.notify_one();
        }
        *seen = Some(rev);
    }

    /// A new policy revision was loaded: its credential bindings come with a fresh provider
    /// environment.
    pub fn policy_loaded(&self) {
        self.refresh.notify_one();
    }

    pub(super) async fn provider_changed_wait(&self) {
        self.refresh.notified().await;
    }
}

/// The supervisor's egress: the revision every proxy keeps.
pub struct PlaneEgress {
    policy: PolicyHandle,
    shared: Arc<ServeEgress>,
}

impl PlaneEgress {
    pub fn new(shared: Arc<ServeEgress>) -> PlaneEgress {
        PlaneEgress {
            policy: PolicyHandle::quarantined(
                "no policy could be fetched from the gateway yet".into(),
            ),
            shared,
        }
    }

    /// The shared part (CA, credentials).
    pub fn shared(&self) -> &Arc<ServeEgress> {
        &self.shared
    }

    /// A new revision applies: every proxy keeps `rules` for new connections at once, and the
    /// tunnels admitted under the old revision are closed. `sandbox` (the revision's) gets a
    /// proxy of its own when it has a network namespace and none yet.
    pub fn adopt(&self, sandbox: &Sandbox, rules: NetworkRules) -> Result<(), EgressError> {
        // Published only once the proxy stands: a failure leaves the last revision in force.
        // Nothing runs in the new sandbox before the slot holds it, after this.
        if sandbox.attached::<SandboxProxy>().is_none() && sandbox.net_namespace().is_some() {
            let events: Arc<dyn EventSink> = Arc::new(OcsfSink);
            let s = &self.shared;
            let config = crate::exec::egress::proxy_config(
                sandbox,
                &s.interception,
                s.credentials.clone(),
                events.clone(),
            );
            let proxy = crate::exec::egress::start(sandbox, self.policy.clone(), events, config)?;
            sandbox.attach(Arc::new(SandboxProxy {
                _proxy: proxy,
                ca_env: s.interception.child_env(sandbox.view_files()),
            }));
        }
        self.shared
            .set_policy_bindings(egress::credentials::policy_bindings(&rules));
        self.policy.publish(rules);
        Ok(())
    }

    /// `fail_closed` after a revision that cannot be applied: every proxy denies all, saying
    /// why, and closes its open tunnels.
    pub fn quarantine(&self, version: u32, error: &str) {
        self.policy.quarantine(version, error);
    }
}

/// What a child of `sandbox` gets for its proxy: the proxy variables and the CA's trust
/// variables; nothing when the sandbox has no proxy.
pub fn add_child_env(sandbox: &Sandbox, env: &mut Vec<(std::ffi::OsString, std::ffi::OsString)>) {
    if let Some(p) = sandbox.attached::<SandboxProxy>() {
        crate::exec::egress::add_child_env(env);
        crate::exec::egress::set_child_env(env, &p.ca_env);
    }
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
