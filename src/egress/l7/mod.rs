//! L7 inspection: what happens inside an admitted CONNECT, and the checks of a plain-HTTP
//! forward before its dial.
//!
//! Inside a CONNECT the first bytes decide ([`classify`]): a TLS ClientHello is terminated
//! with a leaf of the sandbox's CA and a second, verified TLS session goes upstream; plain
//! HTTP goes to the same relay without TLS; anything else is relayed raw on an L4 endpoint
//! and refused (403 `unsupported_l7_protocol`) on an L7 one. The relay ([`relay`]) parses every
//! request, canonicalises its path, checks its authority and the rules, and replaces the
//! credential placeholders of admitted requests.

pub mod body;
pub use super::event;
pub mod path;
pub mod relay;
pub mod rules;

#[cfg(test)]
mod tests;

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub use event::{L7Decision, L7Event};

use super::credentials::{self, Credentials};
use super::event::EventSink;
use super::prefixed::Prefixed;
use super::relay::{End, ForwardCheck, InspectedTunnel, Inspector, Refusal, tunnel};
use super::request::HostPort;
use super::response;
use super::revision::PolicyState;
use super::tls::{SandboxCa, Upstream};
use rules::{L7Scope, RequestView, Verdict};

/// How long the first bytes of a tunnel may still be a prefix of TLS or HTTP.
const CLASSIFY_WAIT: Duration = Duration::from_millis(100);

/// What the first bytes of a tunnel are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Tls,
    Http,
    Other,
    /// Still a prefix of TLS or HTTP: more bytes are needed.
    Undecided,
}

const METHODS: [&str; 9] = [
    "GET ", "HEAD ", "POST ", "PUT ", "DELETE ", "PATCH ", "OPTIONS ", "CONNECT ", "TRACE ",
];

/// Classify a tunnel's first bytes.
pub fn classify(b: &[u8]) -> Kind {
    if b.is_empty() {
        return Kind::Undecided;
    }
    if b[0] == 0x16 {
        return match b.get(1) {
            None => Kind::Undecided,
            Some(3) => match b.get(2) {
                None => Kind::Undecided,
                Some(0..=4) => Kind::Tls,
                Some(_) => Kind::Other,
            },
            Some(_) => Kind::Other,
        };
    }
    let mut prefix = false;
    for m in METHODS {
        let m = m.as_bytes();
        if b.starts_with(m) {
            return Kind::Http;
        }
        if m.starts_with(b) {
            prefix = true;
        }
    }
    if prefix { Kind::Undecided } else { Kind::Other }
}

/// The inspector: TLS interception with the sandbox's CA, the REST rules, credential
/// placeholders.
pub struct Interceptor {
    ca: Arc<SandboxCa>,
    upstream: Arc<Upstream>,
    credentials: Arc<Credentials>,
    events: Arc<dyn EventSink>,
    /// For the first bytes of a tunnel and each request head.
    pub head_timeout: Duration,
    /// A raw tunnel (non-HTTP on an L4 endpoint) idle this long is closed.
    pub idle_timeout: Option<Duration>,
}

impl Interceptor {
    pub fn new(
        ca: Arc<SandboxCa>,
        upstream: Arc<Upstream>,
        credentials: Arc<Credentials>,
        events: Arc<dyn EventSink>,
    ) -> Interceptor {
        Interceptor {
            ca,
            upstream,
            credentials,
            events,
            head_timeout: Duration::from_secs(10),
            idle_timeout: Some(Duration::from_secs(3600)),
        }
    }
}

/// Read until the first bytes are classified: at most `head_timeout` for the first byte, then
/// at most [`CLASSIFY_WAIT`] while they could still be a prefix.
async fn first_bytes(client: &mut TcpStream, mut got: Vec<u8>, wait: Duration) -> (Vec<u8>, Kind) {
    let mut deadline = tokio::time::Instant::now() + wait;
    let mut started = !got.is_empty();
    if started {
        deadline = tokio::time::Instant::now() + CLASSIFY_WAIT;
    }
    loop {
        let k = classify(&got);
        if k != Kind::Undecided || got.len() >= 24 {
            return (got, if k == Kind::Undecided { Kind::Other } else { k });
        }
        let mut b = [0u8; 24];
        match tokio::time::timeout_at(deadline, client.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (got, Kind::Other),
            Ok(Ok(n)) => {
                got.extend_from_slice(&b[..n]);
                if !started {
                    started = true;
                    deadline = tokio::time::Instant::now() + CLASSIFY_WAIT;
                }
            }
            Err(_) => {
                return (
                    got,
                    if started {
                        Kind::Other
                    } else {
                        Kind::Undecided
                    },
                );
            }
        }
    }
}

impl Inspector for Interceptor {
    fn intercepts_l4(&self) -> bool {
        true
    }

    fn refuse_raw(&self, dest: &HostPort) -> Option<Refusal> {
        self.credentials
            .is_credentialed(&dest.policy_host(), dest.port)
            .then(|| Refusal {
                response: response::json(
                    403,
                    "uninspected_credentials",
                    "credentialed endpoint requires L7 inspection; raw tunnel is not explicitly allowed",
                    None,
                ),
                reason: format!("credentials are bound to {}; a raw tunnel would bypass their rewrite", dest.display()),
            })
    }

    fn forward(&self, f: &ForwardCheck<'_>) -> Result<String, Refusal> {
        let what = format!("{} {}", f.method, f.dest.display());
        let bad_target = || Refusal {
            response: response::json(
                400,
                "invalid_request_target",
                "request-target must be canonical",
                None,
            ),
            reason: "request-target must be canonical".into(),
        };
        // Forwarded requests get no rewriting: a placeholder would go upstream as it is.
        if credentials::has_marker(f.head) {
            return Err(Refusal {
                response: response::json(
                    400,
                    "invalid_credential_placeholder",
                    "request-target contains an invalid credential placeholder",
                    None,
                ),
                reason: "credential placeholders are replaced only inside CONNECT tunnels".into(),
            });
        }
        let scope = match (&f.revision.state, f.settings) {
            (PolicyState::Rules(r), Some(s)) if s.protocol.is_l7() => {
                L7Scope::of(r, &f.dest.policy_host(), f.dest.port, f.caller)
            }
            _ => L7Scope::default(),
        };
        let slash_ok = |c: &path::Canonical| {
            scope
                .select(&c.path)
                .is_some_and(|(_, e)| e.allow_encoded_slash)
        };
        let canon = match path::canonicalize(f.path_and_query, false) {
            Ok(c) => c,
            Err(path::PathError::EncodedSlash) => {
                match path::canonicalize(f.path_and_query, true) {
                    Ok(c) if slash_ok(&c) => c,
                    _ => return Err(bad_target()),
                }
            }
            Err(_) => return Err(bad_target()),
        };
        if scope.is_empty() {
            return Ok(canon.target());
        }
        let query = path::query_params(canon.query.as_deref());
        let view = RequestView {
            method: f.method,
            path: &canon.path,
            query: &query,
        };
        let verdict = scope.evaluate(&view);
        let emit = |decision, rule: &str, reason: Option<String>| {
            self.events.emit_l7(&L7Event {
                decision,
                method: f.method.to_string(),
                dest: f.dest.display(),
                path: canon.path.clone(),
                rule: rule.to_string(),
                reason,
                caller: f.caller.clone(),
                generation: f.revision.generation,
                credentials_injected: false,
            })
        };
        match verdict {
            Verdict::Allow { rule } => emit(L7Decision::Allow, &rule, None),
            Verdict::Audit { rule, reason } => emit(L7Decision::Audit, &rule, Some(reason)),
            Verdict::Deny { rule, reason } => {
                emit(L7Decision::Deny, &rule, Some(reason.clone()));
                let detail = if reason == "no L7 endpoint path matched request" {
                    format!("{what}{} did not match an L7 endpoint path", canon.path)
                } else {
                    format!("{what}{} denied by L7 policy: {reason}", canon.path)
                };
                return Err(Refusal {
                    response: response::json(403, "policy_denied", &detail, Some(&reason)),
                    reason,
                });
            }
        }
        Ok(canon.target())
    }

    fn run(&self, t: InspectedTunnel) -> Pin<Box<dyn Future<Output = End> + Send>> {
        let ca = self.ca.clone();
        let up_tls = self.upstream.clone();
        let credentials = self.credentials.clone();
        let events = self.events.clone();
        let head_timeout = self.head_timeout;
        let idle = self.idle_timeout;
        Box::pin(async move {
            let InspectedTunnel {
                mut client,
                early,
                upstream,
                dest,
                caller,
                settings,
                revision,
                mut guard,
            } = t;
            let (got, kind) = tokio::select! {
                r = first_bytes(&mut client, early, head_timeout) => r,
                e = guard.ended() => return e,
            };
            let l7 = settings.as_ref().is_some_and(|s| s.protocol.is_l7());
            let mk = |tls| relay::Tunnel {
                dest: dest.clone(),
                tls,
                caller: caller.clone(),
                revision: revision.clone(),
                settings: settings.clone(),
                credentials: credentials.clone(),
                events: events.clone(),
                head_timeout,
            };
            match kind {
                Kind::Tls => {
                    let host = dest.policy_host();
                    let Ok(config) = ca.server_config(&host) else {
                        return End::Error(io::Error::other("signing the leaf failed"));
                    };
                    let acceptor = tokio_rustls::TlsAcceptor::from(config);
                    let prefixed = Prefixed::new(got, client);
                    let hs = async {
                        let c = acceptor.accept(prefixed).await?;
                        let u = up_tls.connect(&host, upstream).await?;
                        Ok::<_, io::Error>((c, u))
                    };
                    let (c, u) = tokio::select! {
                        r = tokio::time::timeout(head_timeout, hs) => match r {
                            Ok(Ok(x)) => x,
                            Ok(Err(e)) => {
                                tracing::warn!(target: "egress", "TLS relay error: {} : {e}", dest.display());
                                return End::Error(e);
                            }
                            Err(_) => return End::Idle,
                        },
                        e = guard.ended() => return e,
                    };
                    relay::serve(c, u, mk(true), &mut guard).await
                }
                Kind::Http => {
                    relay::serve(Prefixed::new(got, client), upstream, mk(false), &mut guard).await
                }
                Kind::Undecided => End::Idle,
                Kind::Other if l7 => {
                    let _ = client
                        .write_all(&response::json(
                            403,
                            "unsupported_l7_protocol",
                            "Unsupported tunnel protocol for L7-inspected endpoint",
                            None,
                        ))
                        .await;
                    End::Done
                }
                Kind::Other => {
                    if credentials.is_credentialed(&dest.policy_host(), dest.port) {
                        // A credentialed endpoint is never carried uninspected.
                        return End::Done;
                    }
                    tunnel(client, upstream, &got, &mut guard, idle).await
                }
            }
        })
    }
}
