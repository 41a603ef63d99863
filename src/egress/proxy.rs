//! The accept loop and the life of one connection.
//!
//! Per connection, in order (OpenShell's order, plus the limits it lacks):
//! 1. a slot of the sandbox's connection cap, or 503 and close;
//! 2. the caller's identity, looked up while the head is read (at most
//!    [`ProxyConfig::head_timeout`] for the whole head, at most [`super::request::MAX_HEAD`]
//!    bytes), then a slot of the caller's exec's cap;
//! 3. the decision ([`super::decide`]) against the current revision, whose generation the
//!    connection pins → 403 `policy_denied`;
//! 4. one resolution and the address checks → 403 `ssrf_denied`;
//! 5. the generation still current → else 403 "policy changed";
//! 6. the dial to the checked addresses, in order, first success wins (CONNECT: a failure
//!    closes without a response; forward: 502);
//! 7. `200 Connection Established` and the tunnel, or the forwarded request; either ends when
//!    the generation moves on.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::addr;
use super::decide::{Decision, Mode, decide};
use super::event::{Counters, EventSink, NetEvent, Outcome, Via};
use super::forward::{self, Forward};
use super::identity::{Caller, ExecKey, Identify, IdentityError};
use super::relay::{End, ForwardCheck, Guard, InspectedTunnel, Inspector, tunnel};
use super::request::{HeadError, HostPort, MAX_HEAD, Target, head_end, parse_head};
use super::resolve::Resolve;
use super::response;
use super::revision::PolicyHandle;
use crate::policy::network::TlsMode;

/// The proxy's limits.
#[derive(Clone)]
pub struct ProxyConfig {
    /// Open connections of the whole sandbox. At the limit the proxy stops accepting until
    /// one closes: further clients wait in the listen backlog, where the kernel keeps them in
    /// arrival order (an exec's flood is turned away by its own cap, below, as soon as it is
    /// identified, so the backlog drains).
    pub max_connections: usize,
    /// Open connections of one exec (one PID namespace), so that one exec's flood cannot take
    /// the others' share.
    pub max_per_exec: usize,
    /// For the whole first request head.
    pub head_timeout: Duration,
    /// For each upstream dial, and for the resolution.
    pub connect_timeout: Duration,
    /// A tunnel with no byte either way for this long is closed; `None` never.
    pub idle_timeout: Option<Duration>,
    /// Identity lookups running at once (each reads `/proc`).
    pub identify_concurrency: usize,
    /// Where L7-inspected endpoints go; `None` refuses them.
    pub inspector: Option<Arc<dyn Inspector>>,
    /// Where the proxy counts (shared with the inspector's [`super::Counted`] sink, so that
    /// request decisions land in the same counts).
    pub counters: Arc<Counters>,
}

impl Default for ProxyConfig {
    fn default() -> ProxyConfig {
        ProxyConfig {
            max_connections: 1024,
            max_per_exec: 256,
            head_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Some(Duration::from_secs(3600)),
            identify_concurrency: 4,
            inspector: None,
            counters: Arc::default(),
        }
    }
}

/// Everything the connections share.
struct Shared {
    policy: PolicyHandle,
    identity: Arc<dyn Identify>,
    resolver: Arc<dyn Resolve>,
    events: Arc<dyn EventSink>,
    config: ProxyConfig,
    counters: Arc<Counters>,
    open: Arc<AtomicUsize>,
    per_exec: Mutex<HashMap<ExecKey, usize>>,
    identify_slots: Arc<Semaphore>,
    cancel: CancellationToken,
}

/// A running proxy. Dropping it stops the accept loop and closes every connection.
pub struct ProxyHandle {
    local: SocketAddr,
    counters: Arc<Counters>,
    open: Arc<AtomicUsize>,
    cancel: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl ProxyHandle {
    /// The listening address (inside the sandbox's namespace).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Allowed and denied connections, for the sandbox and per exec.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// Connections open right now.
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Stop accepting, close every connection, and wait for the accept loop to end.
    pub async fn shutdown(mut self) {
        self.cancel.cancel();
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// The egress proxy of one sandbox.
pub struct Proxy;

impl Proxy {
    /// Serve on `listener` (made in the sandbox's namespace: [`super::netns::open_in`]) until
    /// the handle is shut down or dropped. Must be called inside a tokio runtime.
    pub fn start(
        listener: std::net::TcpListener,
        policy: PolicyHandle,
        identity: Arc<dyn Identify>,
        resolver: Arc<dyn Resolve>,
        events: Arc<dyn EventSink>,
        config: ProxyConfig,
    ) -> io::Result<ProxyHandle> {
        listener.set_nonblocking(true)?;
        let local = listener.local_addr()?;
        let listener = TcpListener::from_std(listener)?;
        let cancel = CancellationToken::new();
        let counters = config.counters.clone();
        let open = Arc::new(AtomicUsize::new(0));
        let shared = Arc::new(Shared {
            policy,
            identity,
            resolver,
            events,
            identify_slots: Arc::new(Semaphore::new(config.identify_concurrency.max(1))),
            config,
            counters: counters.clone(),
            open: open.clone(),
            per_exec: Mutex::new(HashMap::new()),
            cancel: cancel.clone(),
        });
        tracing::info!(target: "egress", "Proxy listening on {local}");
        let task = tokio::spawn(accept_loop(listener, shared));
        Ok(ProxyHandle {
            local,
            counters,
            open,
            cancel,
            task: Some(task),
        })
    }
}

/// A slot of the sandbox's cap, held by one open connection; it counts itself in
/// [`ProxyHandle::open_connections`].
struct Slot {
    _permit: tokio::sync::OwnedSemaphorePermit,
    open: Arc<AtomicUsize>,
}

impl Slot {
    fn new(permit: tokio::sync::OwnedSemaphorePermit, open: &Arc<AtomicUsize>) -> Slot {
        open.fetch_add(1, Ordering::Relaxed);
        Slot {
            _permit: permit,
            open: open.clone(),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A slot of one exec's cap.
struct ExecSlot {
    shared: Arc<Shared>,
    key: ExecKey,
}

impl Drop for ExecSlot {
    fn drop(&mut self) {
        let mut m = self
            .shared
            .per_exec
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.key);
            }
        }
    }
}

fn take_exec_slot(shared: &Arc<Shared>, key: ExecKey) -> Option<ExecSlot> {
    let mut m = shared.per_exec.lock().unwrap_or_else(|p| p.into_inner());
    let n = m.entry(key).or_insert(0);
    if *n >= shared.config.max_per_exec {
        return None;
    }
    *n += 1;
    Some(ExecSlot {
        shared: shared.clone(),
        key,
    })
}

/// Accept errors that pass (no descriptors or memory for now, an aborted handshake) are
/// retried after a pause that doubles to 5 s; EBADF, EINVAL and ENOTSOCK mean the listener is
/// gone; five unknown errors in a row end the loop too.
async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut pause = Duration::from_millis(100);
    let mut unknown = 0;
    let slots = Arc::new(Semaphore::new(shared.config.max_connections));
    loop {
        let permit = tokio::select! {
            _ = shared.cancel.cancelled() => return,
            s = slots.clone().acquire_owned() => match s {
                Ok(s) => s,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            _ = shared.cancel.cancelled() => return,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, peer)) => {
                pause = Duration::from_millis(100);
                unknown = 0;
                let slot = Slot::new(permit, &shared.open);
                tokio::spawn(connection(stream, peer, shared.clone(), slot));
            }
            Err(e) => {
                let transient = matches!(
                    e.raw_os_error(),
                    Some(
                        libc::EMFILE
                            | libc::ENFILE
                            | libc::ENOBUFS
                            | libc::ENOMEM
                            | libc::ECONNABORTED
                            | libc::EINTR
                            | libc::EAGAIN
                            | libc::EPROTO
                            | libc::EPERM
                    )
                );
                let terminal = matches!(
                    e.raw_os_error(),
                    Some(libc::EBADF | libc::EINVAL | libc::ENOTSOCK)
                );
                if terminal {
                    tracing::error!(target: "egress", "proxy accept failed, stopping: {e}");
                    return;
                }
                if !transient {
                    unknown += 1;
                    if unknown >= 5 {
                        tracing::error!(target: "egress", "proxy accept failed 5 times in a row, stopping: {e}");
                        return;
                    }
                }
                tracing::warn!(target: "egress", "proxy accept: {e}; retrying in {pause:?}");
                tokio::select! {
                    _ = shared.cancel.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Read the first head: up to and including its blank line, and whatever came behind it.
async fn read_head(stream: &mut TcpStream) -> Result<Option<(Vec<u8>, Vec<u8>)>, HeadError> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let room = MAX_HEAD - buf.len();
        if room == 0 {
            return Err(HeadError::TooLarge);
        }
        let n = match stream.read(&mut chunk[..room.min(2048)]).await {
            Ok(0) | Err(_) => return Ok(None),
            Ok(n) => n,
        };
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = head_end(&buf[from..]) {
            let end = from + end?;
            let rest = buf.split_off(end);
            return Ok(Some((buf, rest)));
        }
    }
}

fn reason_of(e: &IdentityError) -> String {
    match e {
        IdentityError::Integrity { .. } => e.to_string(),
        e => format!("failed to resolve peer binary: {e}"),
    }
}

/// One accepted connection, from its head to its end.
async fn connection(mut stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>, _slot: Slot) {
    let _ = stream.set_nodelay(true);
    let Ok(local) = stream.local_addr() else {
        return;
    };
    let accepted = std::time::Instant::now();
    // Bounded like the head: a connection does not wait for ever behind a queue of lookups.
    // The permit goes with the blocking task, so an abandoned lookup still counts.
    let identify = tokio::time::timeout(shared.config.head_timeout, async {
        let Ok(permit) = shared.identify_slots.clone().acquire_owned().await else {
            return Err(None);
        };
        let id = shared.identity.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            id.identify(peer, local, accepted)
        })
        .await
        .map_err(|_| None)?
        .map_err(Some)
    });
    let identify = async { identify.await.unwrap_or(Err(None)) };
    // The identity is looked up while the head arrives; as soon as it is known, the exec's
    // cap applies, so that one exec's flood of silent connections cannot hold the others'
    // share of the sandbox's cap until their head timeouts.
    let mut over_cap = false;
    let (caller, head, _exec_slot) = {
        let head = tokio::time::timeout(shared.config.head_timeout, read_head(&mut stream));
        tokio::pin!(head, identify);
        let (mut caller, mut got, mut slot) = (None, None, None);
        while got.is_none() || caller.is_none() {
            tokio::select! {
                c = &mut identify, if caller.is_none() => {
                    if let Ok(c) = &c {
                        slot = take_exec_slot(&shared, c.exec);
                        if slot.is_none() {
                            over_cap = true;
                            break;
                        }
                    }
                    caller = Some(c);
                }
                h = &mut head, if got.is_none() => got = Some(h),
            }
        }
        (caller, got, slot)
    };
    if over_cap {
        let _ = stream
            .write_all(&response::connection_limit(&format!(
                "this exec has {} connections open through the egress proxy, its limit",
                shared.config.max_per_exec
            )))
            .await;
        return;
    }
    let (Some(caller), Some(head)) = (caller, head) else {
        return;
    };
    let (head, rest) = match head {
        // Slow or silent client: closed without an answer.
        Err(_) | Ok(Ok(None)) => return,
        Ok(Err(e)) => {
            let _ = stream.write_all(&response::for_head_error(&e)).await;
            return;
        }
        Ok(Ok(Some(h))) => h,
    };
    let parsed = match parse_head(&head) {
        Ok(p) => p,
        Err(e) => {
            let _ = stream.write_all(&response::for_head_error(&e)).await;
            return;
        }
    };
    let caller = match caller {
        Ok(c) => Ok(c),
        Err(Some(e)) => Err(reason_of(&e)),
        Err(None) => Err("failed to resolve peer binary: the lookup did not finish".to_string()),
    };
    let (dest, via, fwd) = match parsed.target {
        Target::Connect(d) => (d, Via::Connect, None),
        Target::Forward {
            dest,
            authority,
            path_and_query,
        } => {
            let path = path_and_query.split('?').next().unwrap_or("/").to_string();
            let via = Via::Forward {
                method: parsed.method.clone(),
                path,
            };
            (dest, via, Some((authority, path_and_query)))
        }
    };
    let c = Conn {
        shared: &shared,
        peer,
        dest: &dest,
        via: &via,
    };
    c.run(stream, head, rest, caller, fwd).await;
}

/// What one connection's steps share.
struct Conn<'a> {
    shared: &'a Arc<Shared>,
    peer: SocketAddr,
    dest: &'a HostPort,
    via: &'a Via,
}

impl Conn<'_> {
    fn event(
        &self,
        outcome: Outcome,
        rule: &str,
        reason: Option<String>,
        caller: Option<&Caller>,
        generation: u64,
    ) {
        let ev = NetEvent {
            outcome,
            via: self.via.clone(),
            dest: self.dest.display(),
            rule: rule.to_string(),
            reason,
            caller: caller.cloned(),
            src: self.peer,
            generation,
        };
        self.shared.counters.record(outcome, caller.map(|c| c.exec));
        self.shared.events.emit(&ev);
    }

    /// `CONNECT h:p` or `GET h:p/path` for the details of the responses.
    fn what(&self) -> String {
        match self.via {
            Via::Connect => format!("CONNECT {}", self.dest.display()),
            Via::Forward { method, path } => format!("{method} {}{path}", self.dest.display()),
        }
    }

    async fn deny(
        &self,
        stream: &mut TcpStream,
        reason: String,
        caller: Option<&Caller>,
        generation: u64,
    ) {
        let detail = format!("{} not permitted by policy", self.what());
        let _ = stream
            .write_all(&response::policy_denied(&detail, &reason))
            .await;
        self.event(Outcome::Denied, "-", Some(reason), caller, generation);
    }

    async fn run(
        &self,
        mut stream: TcpStream,
        head: Vec<u8>,
        rest: Vec<u8>,
        caller: Result<Caller, String>,
        fwd: Option<(String, String)>,
    ) {
        let shared = self.shared;
        let rev = shared.policy.current();
        let caller = match caller {
            Ok(c) => c,
            Err(reason) => return self.deny(&mut stream, reason, None, rev.generation).await,
        };
        let host = self.dest.policy_host();
        let port = self.dest.port;
        let allow = match decide(&rev.state, &host, port, &caller) {
            Decision::Deny(d) => {
                return self
                    .deny(&mut stream, d.reason, Some(&caller), rev.generation)
                    .await;
            }
            Decision::Allow(a) => a,
        };
        let inspector = shared.config.inspector.as_ref();
        let tls_skip = allow
            .settings
            .as_ref()
            .is_some_and(|s| s.tls == TlsMode::Skip);
        // CONNECT: `Some(settings)` goes to the inspector (`settings` is `None` for an L4
        // endpoint whose TLS is intercepted); `None` is a raw tunnel.
        let inspect = match (&allow.mode, fwd.is_some()) {
            (_, true) => None,
            (Mode::Inspect(s), false) => Some(Some(s.clone())),
            (Mode::Tunnel, false) => inspector
                .filter(|i| i.intercepts_l4() && !tls_skip)
                .map(|_| None),
        };
        let needs_inspection = match (&allow.mode, fwd.is_some()) {
            (_, true) => allow.forward_needs_inspection(),
            (Mode::Inspect(_), false) => true,
            (Mode::Tunnel, false) => false,
        };
        if needs_inspection
            && inspector.is_none()
            && let Some(s) = &allow.settings
        {
            let reason = format!(
                "endpoint {host}:{port} of policy '{}' requires L7 inspection (protocol: {}), which this supervisor does not provide yet",
                s.rule,
                s.protocol.as_str()
            );
            return self
                .deny(&mut stream, reason, Some(&caller), rev.generation)
                .await;
        }
        let mut fwd = fwd;
        if let Some(i) = inspector {
            let refused = match (&fwd, &inspect) {
                (Some((_, pq)), _) => {
                    let method = match self.via {
                        Via::Forward { method, .. } => method.as_str(),
                        Via::Connect => "",
                    };
                    match i.forward(&ForwardCheck {
                        dest: self.dest,
                        method,
                        path_and_query: pq,
                        head: &head,
                        caller: &caller,
                        settings: allow.settings.as_ref(),
                        revision: &rev,
                    }) {
                        Ok(target) => {
                            if let Some((_, pq)) = fwd.as_mut() {
                                *pq = target;
                            }
                            None
                        }
                        Err(r) => Some(r),
                    }
                }
                (None, None) => i.refuse_raw(self.dest),
                (None, Some(_)) => None,
            };
            if let Some(r) = refused {
                let _ = stream.write_all(&r.response).await;
                return self.event(
                    Outcome::Denied,
                    &allow.rule,
                    Some(r.reason),
                    Some(&caller),
                    rev.generation,
                );
            }
        }
        // One resolution; the dial uses exactly the addresses checked here.
        let resolved = tokio::time::timeout(
            shared.config.connect_timeout,
            shared.resolver.resolve(&self.dest.host, port),
        )
        .await;
        // A failed resolution keeps OpenShell's `ssrf_denied`, but the client is told the
        // real reason rather than an address-check kind that did not apply.
        let addrs: Vec<IpAddr> = match resolved {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => {
                let detail = format!("DNS resolution failed for {}: {e}", self.dest.display());
                return self
                    .address_denied(
                        &mut stream,
                        &detail.clone(),
                        detail,
                        &caller,
                        rev.generation,
                    )
                    .await;
            }
            Err(_) => {
                let detail = format!(
                    "DNS resolution failed for {}: timed out",
                    self.dest.display()
                );
                return self
                    .address_denied(
                        &mut stream,
                        &detail.clone(),
                        detail,
                        &caller,
                        rev.generation,
                    )
                    .await;
            }
        };
        if let Err(d) = addr::check(&allow.plan, &host, port, &addrs) {
            return self
                .address_denied(&mut stream, d.kind, d.detail, &caller, rev.generation)
                .await;
        }
        // No CA: a CONNECT is refused rather than tunnelled past the credential rewrite.
        if fwd.is_none()
            && let Some(r) = inspector.and_then(|i| i.refuse_connect(self.dest, tls_skip))
        {
            let _ = stream.write_all(&r.response).await;
            return self.event(
                Outcome::Denied,
                &allow.rule,
                Some(r.reason),
                Some(&caller),
                rev.generation,
            );
        }
        let mut guard = Guard::new(
            shared.policy.subscribe(),
            rev.generation,
            shared.cancel.clone(),
        );
        if guard.moved().is_some() {
            let detail = format!("{} not permitted because policy changed", self.what());
            let _ = stream
                .write_all(&response::json(403, "policy_denied", &detail, None))
                .await;
            return self.event(
                Outcome::Denied,
                "-",
                Some("policy changed".into()),
                Some(&caller),
                rev.generation,
            );
        }
        let dialed = tokio::select! {
            d = dial(&addrs, port, shared.config.connect_timeout) => d,
            _ = guard.ended() => {
                let detail = format!("{} not permitted because policy changed", self.what());
                let _ = stream.write_all(&response::json(403, "policy_denied", &detail, None)).await;
                return self.event(Outcome::Denied, "-", Some("policy changed".into()), Some(&caller), rev.generation);
            }
        };
        let upstream = match dialed {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(target: "egress", "Proxy connection error: {} to {addrs:?}: {e}", self.what());
                if fwd.is_some() {
                    let _ = stream
                        .write_all(&response::upstream_unreachable(&self.dest.display()))
                        .await;
                }
                return;
            }
        };
        let end = match fwd {
            None => {
                if stream.write_all(response::CONNECT_OK).await.is_err() {
                    return;
                }
                self.event(
                    Outcome::Allowed,
                    &allow.rule,
                    None,
                    Some(&caller),
                    rev.generation,
                );
                match (inspect, &shared.config.inspector) {
                    (Some(settings), Some(i)) => {
                        i.run(InspectedTunnel {
                            client: stream,
                            early: rest,
                            upstream,
                            dest: self.dest.clone(),
                            caller: caller.clone(),
                            settings,
                            revision: rev.clone(),
                            guard,
                        })
                        .await
                    }
                    _ => {
                        tunnel(
                            stream,
                            upstream,
                            &rest,
                            &mut guard,
                            shared.config.idle_timeout,
                        )
                        .await
                    }
                }
            }
            Some((authority, path_and_query)) => {
                self.event(
                    Outcome::Allowed,
                    &allow.rule,
                    None,
                    Some(&caller),
                    rev.generation,
                );
                let mut head = head;
                head.extend_from_slice(&rest);
                let f = Forward {
                    authority,
                    path_and_query,
                    dest: self.dest.display(),
                };
                forward::serve(stream, head, upstream, f, &mut guard).await
            }
        };
        if let End::Stale(now) = end {
            self.event(
                Outcome::ClosedByReload,
                &allow.rule,
                Some(format!("current_generation:{now}")),
                Some(&caller),
                rev.generation,
            );
        }
    }

    async fn address_denied(
        &self,
        stream: &mut TcpStream,
        kind: &str,
        detail: String,
        caller: &Caller,
        generation: u64,
    ) {
        let d = match self.via {
            Via::Connect => format!("CONNECT {} blocked: {kind}", self.dest.display()),
            Via::Forward { method, .. } => {
                format!("{method} {} blocked: {kind}", self.dest.display())
            }
        };
        let _ = stream.write_all(&response::ssrf_denied(&d)).await;
        self.event(
            Outcome::AddressDenied,
            "-",
            Some(detail),
            Some(caller),
            generation,
        );
    }
}

/// Try each checked address in order; the first that connects wins.
async fn dial(addrs: &[IpAddr], port: u16, timeout: Duration) -> io::Result<TcpStream> {
    let mut last = io::Error::other("no address");
    for ip in addrs {
        match tokio::time::timeout(timeout, TcpStream::connect(SocketAddr::new(*ip, port))).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Ok(Err(e)) => last = e,
            Err(_) => last = io::Error::new(io::ErrorKind::TimedOut, "connect timed out"),
        }
    }
    Err(last)
}
