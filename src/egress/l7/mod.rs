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
mod forward;
mod handle;
pub mod idle;
mod linger;
pub mod path;
mod redact;
pub mod relay;
mod respond;
pub mod rules;
mod tunnel;
pub mod websocket;

#[cfg(test)]
mod tests;

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub use event::{L7Decision, L7Event};

use super::credentials::CredentialStore;
use super::event::EventSink;
use super::prefixed::Prefixed;
use super::relay::{End, ForwardCheck, InspectedTunnel, Inspector, Refusal, tunnel};
use super::request::HostPort;
use super::response;
use super::revision::{PolicyState, Revision};
use super::tls::{SandboxCa, Upstream};
use rules::CompiledRules;

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

/// The inspector: TLS interception with the sandbox's CA, the REST and WebSocket rules,
/// credential placeholders.
pub struct Interceptor {
    /// The CA and the upstream trust, or why there is no CA: then every CONNECT that is not
    /// `tls: skip` is refused (503 `tls_termination_unavailable`) rather than tunnelled past
    /// the credential rewrite.
    tls: Result<(Arc<SandboxCa>, Arc<Upstream>), String>,
    credentials: CredentialStore,
    events: Arc<dyn EventSink>,
    /// For the first bytes of a tunnel and each request head.
    pub head_timeout: Duration,
    /// A tunnel (raw, an inspected keep-alive between requests, or an upgraded connection)
    /// idle this long is closed.
    pub idle_timeout: Option<Duration>,
    /// The WebSocket relays' limits, their assembly slots shared by the whole proxy.
    pub websocket: Arc<websocket::Limits>,
    /// The L7 rules of the current revision, compiled once: (generation, rules).
    compiled: Mutex<Option<(u64, Arc<CompiledRules>)>>,
    compilations: AtomicU64,
}

impl Interceptor {
    pub fn new(
        ca: Arc<SandboxCa>,
        upstream: Arc<Upstream>,
        credentials: impl Into<CredentialStore>,
        events: Arc<dyn EventSink>,
    ) -> Interceptor {
        Interceptor::with_tls(Ok((ca, upstream)), credentials.into(), events)
    }

    /// Without a CA (`why` it could not be made or shown to the sandbox): the REST rules of
    /// forwarded requests still apply; CONNECTs are refused unless `tls: skip`.
    pub fn without_ca(
        why: String,
        credentials: impl Into<CredentialStore>,
        events: Arc<dyn EventSink>,
    ) -> Interceptor {
        Interceptor::with_tls(Err(why), credentials.into(), events)
    }

    fn with_tls(
        tls: Result<(Arc<SandboxCa>, Arc<Upstream>), String>,
        credentials: CredentialStore,
        events: Arc<dyn EventSink>,
    ) -> Interceptor {
        #[cfg_attr(not(feature = "test-pause-points"), allow(unused_mut))]
        let mut i = Interceptor {
            tls,
            credentials,
            events,
            head_timeout: Duration::from_secs(10),
            idle_timeout: Some(Duration::from_secs(3600)),
            websocket: Arc::default(),
            compiled: Mutex::new(None),
            compilations: AtomicU64::new(0),
        };
        #[cfg(feature = "test-pause-points")]
        i.test_clocks();
        i
    }

    /// Test builds only (`SECURITY.md`, test knobs): `OSB_TEST_EGRESS_CLOCKS_MS=<idle>,<assembly
    /// idle>,<assembly total>` shortens the upgraded relays' idle timeout and the WebSocket
    /// assembly clocks, so that the real binary's tests of them take seconds, not an hour.
    #[cfg(feature = "test-pause-points")]
    fn test_clocks(&mut self) {
        let Ok(v) = std::env::var("OSB_TEST_EGRESS_CLOCKS_MS") else {
            return;
        };
        let ms: Vec<u64> = v.split(',').filter_map(|x| x.trim().parse().ok()).collect();
        let [idle, a_idle, a_total] = ms[..] else {
            return;
        };
        self.idle_timeout = Some(Duration::from_millis(idle));
        self.websocket = Arc::new(websocket::Limits {
            assembly_idle: Duration::from_millis(a_idle),
            assembly_total: Duration::from_millis(a_total),
            ..websocket::Limits::default()
        });
    }

    /// Count every request decision into `counters` (the proxy's, [`super::ProxyConfig`]).
    pub fn counted(mut self, counters: Arc<super::Counters>) -> Interceptor {
        self.events = Arc::new(super::Counted {
            counters,
            inner: self.events,
        });
        self
    }

    /// The credential store the tunnels read (swap it to refresh).
    pub fn credentials(&self) -> &CredentialStore {
        &self.credentials
    }

    /// How many times rules were compiled: once per revision that reached a tunnel.
    pub fn compilations(&self) -> u64 {
        self.compilations.load(Ordering::Relaxed)
    }

    /// The compiled L7 rules of `rev` (`None` in quarantine), compiled on first use.
    fn compiled(&self, rev: &Revision) -> Option<Arc<CompiledRules>> {
        let PolicyState::Rules(rules) = &rev.state else {
            return None;
        };
        let mut c = self.compiled.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((g, r)) = c.as_ref()
            && *g == rev.generation
        {
            return Some(r.clone());
        }
        let r = Arc::new(CompiledRules::compile(rules));
        self.compilations.fetch_add(1, Ordering::Relaxed);
        *c = Some((rev.generation, r.clone()));
        Some(r)
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

    fn refuse_connect(&self, _dest: &HostPort, tls_skip: bool) -> Option<Refusal> {
        let why = self.tls.as_ref().err()?;
        (!tls_skip).then(|| Refusal {
            response: response::json(
                503,
                "tls_termination_unavailable",
                "TLS termination unavailable (CA initialization failed); refusing to tunnel \u{2014} credential rewrite would be bypassed",
                None,
            ),
            reason: format!("TLS termination unavailable: {why}"),
        })
    }

    fn refuse_raw(&self, dest: &HostPort) -> Option<Refusal> {
        self.credentials
            .current()
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
        let compiled = self.compiled(f.revision);
        forward::check(f, compiled.as_deref(), &*self.events)
    }

    fn run(&self, t: InspectedTunnel) -> Pin<Box<dyn Future<Output = End> + Send>> {
        let tls = self.tls.clone();
        let compiled = self.compiled(&t.revision);
        let credentials = self.credentials.clone();
        let events = self.events.clone();
        let head_timeout = self.head_timeout;
        let idle = self.idle_timeout;
        let ws = self.websocket.clone();
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
            let hold = linger::Hold::of(&client);
            let mk = |tls| relay::Tunnel {
                dest: dest.clone(),
                tls,
                caller: caller.clone(),
                revision: revision.clone(),
                compiled: compiled.clone().filter(|_| settings.is_some()),
                credentials: credentials.clone(),
                events: events.clone(),
                head_timeout,
                idle_timeout: idle,
                websocket: ws.clone(),
            };
            match kind {
                Kind::Tls => {
                    let Ok((ca, up_tls)) = &tls else {
                        return End::Done;
                    };
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
                    hold.after(relay::serve(c, u, mk(true), &mut guard).await)
                        .await
                }
                Kind::Http => {
                    let client = Prefixed::new(got, client);
                    hold.after(relay::serve(client, upstream, mk(false), &mut guard).await)
                        .await
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
                    if credentials
                        .current()
                        .is_credentialed(&dest.policy_host(), dest.port)
                    {
                        // A credentialed endpoint is never carried uninspected.
                        return End::Done;
                    }
                    tunnel(client, upstream, &got, &mut guard, idle).await
                }
            }
        })
    }
}
