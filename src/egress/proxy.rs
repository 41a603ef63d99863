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
use super::decide::{Allow, Decision, Mode, Settings, decide};
use super::event::{Counters, EventSink, NetEvent, Outcome, Via};
use super::forward::{self, Forward};
use super::identity::{Caller, ExecKey, Identify, IdentityError};
use super::relay::{End, ForwardCheck, Guard, InspectedTunnel, Inspector, Refusal, tunnel};
use super::request::{HeadError, HostPort, MAX_HEAD, Target, head_end, parse_head};
use super::resolve::Resolve;
use super::response;
use super::revision::{PolicyHandle, Revision};
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
    // The permit goes with the blocking task, so an abandoned lookup still counts. A lookup
    // that is quick is made here, on this thread, at the first poll (`identify_now`).
    let identify = tokio::time::timeout(shared.config.head_timeout, async {
        if let Some(c) = shared.identity.identify_now(peer, local, accepted) {
            return Ok(c);
        }
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

/// How an allowed connection goes on, decided once against one revision.
struct Route {
    allow: Allow,
    /// CONNECT: `Some(settings)` goes to the inspector (`settings` is `None` for an L4
    /// endpoint whose TLS is intercepted); `None` is a raw tunnel.
    inspect: Option<Option<Settings>>,
    tls_skip: bool,
    /// A forward's authority and request-target (the inspector's canonical one).
    fwd: Option<(String, String)>,
}

/// Why a connection is turned away before it is carried; [`Conn::refuse`] answers each.
enum Refused {
    /// 403 `policy_denied`: the decision, or a caller that could not be identified.
    Policy(String),
    /// The inspector's own answer, under the rule that allowed the endpoint.
    Inspector { rule: String, refusal: Refusal },
    /// 403 `ssrf_denied`: the address checks, or a resolution that failed.
    Address { kind: String, detail: String },
    /// 403 `policy_denied`: the connection's generation is no longer current.
    PolicyChanged,
    /// No checked address answered: a CONNECT is closed without a response, a forward gets
    /// 502; no event (the dial's failure is the upstream's, not a decision).
    Unreachable {
        addrs: Vec<IpAddr>,
        error: io::Error,
    },
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

    /// Answer a refusal and record it: every way a connection is turned away, in one place.
    async fn refuse(
        &self,
        stream: &mut TcpStream,
        why: Refused,
        caller: Option<&Caller>,
        generation: u64,
    ) {
        let (response, outcome, rule, reason) = match why {
            Refused::Policy(reason) => {
                let detail = format!("{} not permitted by policy", self.what());
                let r = response::policy_denied(&detail, &reason);
                (r, Outcome::Denied, "-".to_string(), reason)
            }
            Refused::Inspector { rule, refusal } => {
                (refusal.response, Outcome::Denied, rule, refusal.reason)
            }
            Refused::Address { kind, detail } => {
                let d = match self.via {
                    Via::Connect => format!("CONNECT {} blocked: {kind}", self.dest.display()),
                    Via::Forward { method, .. } => {
                        format!("{method} {} blocked: {kind}", self.dest.display())
                    }
                };
                let r = response::ssrf_denied(&d);
                (r, Outcome::AddressDenied, "-".to_string(), detail)
            }
            Refused::PolicyChanged => {
                let detail = format!("{} not permitted because policy changed", self.what());
                let r = response::json(403, "policy_denied", &detail, None);
                let reason = "policy changed".to_string();
                (r, Outcome::Denied, "-".to_string(), reason)
            }
            Refused::Unreachable { addrs, error } => {
                tracing::warn!(target: "egress", "Proxy connection error: {} to {addrs:?}: {error}", self.what());
                if matches!(self.via, Via::Forward { .. }) {
                    let r = response::upstream_unreachable(&self.dest.display());
                    let _ = stream.write_all(&r).await;
                }
                return;
            }
        };
        let _ = stream.write_all(&response).await;
        self.event(outcome, &rule, Some(reason), caller, generation);
    }

    /// The connection from its decision to its end.
    async fn run(
        &self,
        mut stream: TcpStream,
        head: Vec<u8>,
        rest: Vec<u8>,
        caller: Result<Caller, String>,
        fwd: Option<(String, String)>,
    ) {
        let rev = self.shared.policy.current();
        let generation = rev.generation;
        let caller = match caller {
            Ok(c) => c,
            Err(reason) => {
                let why = Refused::Policy(reason);
                return self.refuse(&mut stream, why, None, generation).await;
            }
        };
        let opened = match self.verdict(&rev, &caller, &head, fwd) {
            Ok(route) => self.open(&route, generation).await.map(|up| (route, up)),
            Err(why) => Err(why),
        };
        let (route, upstream) = match opened {
            Ok(o) => o,
            Err(why) => {
                return self
                    .refuse(&mut stream, why, Some(&caller), generation)
                    .await;
            }
        };
        self.carry(stream, upstream, route, (head, rest), caller, rev)
            .await;
    }

    /// The verdict on one connection: the policy's decision, and the inspector's checks of
    /// what that decision admits.
    fn verdict(
        &self,
        rev: &Arc<Revision>,
        caller: &Caller,
        head: &[u8],
        mut fwd: Option<(String, String)>,
    ) -> Result<Route, Refused> {
        let (host, port) = (self.dest.policy_host(), self.dest.port);
        let allow = match decide(&rev.state, &host, port, caller) {
            Decision::Deny(d) => return Err(Refused::Policy(d.reason)),
            Decision::Allow(a) => a,
        };
        let inspector = self.shared.config.inspector.as_ref();
        let tls_skip = allow
            .settings
            .as_ref()
            .is_some_and(|s| s.tls == TlsMode::Skip);
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
            return Err(Refused::Policy(format!(
                "endpoint {host}:{port} of policy '{}' requires L7 inspection (protocol: {}), which this supervisor does not provide yet",
                s.rule,
                s.protocol.as_str()
            )));
        }
        if let Some(i) = inspector {
            let refused = match (&mut fwd, &inspect) {
                (Some((_, pq)), _) => {
                    let method = match self.via {
                        Via::Forward { method, .. } => method.as_str(),
                        Via::Connect => "",
                    };
                    let check = ForwardCheck {
                        dest: self.dest,
                        method,
                        path_and_query: pq,
                        head,
                        caller,
                        settings: allow.settings.as_ref(),
                        revision: rev,
                    };
                    match i.forward(&check) {
                        Ok(target) => {
                            *pq = target;
                            None
                        }
                        Err(r) => Some(r),
                    }
                }
                (None, None) => i.refuse_raw(self.dest),
                (None, Some(_)) => None,
            };
            if let Some(refusal) = refused {
                let rule = allow.rule.clone();
                return Err(Refused::Inspector { rule, refusal });
            }
        }
        Ok(Route {
            allow,
            inspect,
            tls_skip,
            fwd,
        })
    }

    /// One resolution, the address checks, and the dial to exactly the addresses checked,
    /// while the connection's generation is current.
    async fn open(&self, route: &Route, generation: u64) -> Result<(TcpStream, Guard), Refused> {
        let shared = self.shared;
        let port = self.dest.port;
        let resolved = tokio::time::timeout(
            shared.config.connect_timeout,
            shared.resolver.resolve(&self.dest.host, port),
        )
        .await;
        // A failed resolution keeps OpenShell's `ssrf_denied`, but the client is told the
        // real reason rather than an address-check kind that did not apply.
        let failed = |why: String| {
            let detail = format!("DNS resolution failed for {}: {why}", self.dest.display());
            let kind = detail.clone();
            Refused::Address { kind, detail }
        };
        let addrs: Vec<IpAddr> = match resolved {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => return Err(failed(e.to_string())),
            Err(_) => return Err(failed("timed out".to_string())),
        };
        let host = self.dest.policy_host();
        if let Err(d) = addr::check(&route.allow.plan, &host, port, &addrs) {
            let (kind, detail) = (d.kind.to_string(), d.detail);
            return Err(Refused::Address { kind, detail });
        }
        // No CA: a CONNECT is refused rather than tunnelled past the credential rewrite.
        let inspector = shared.config.inspector.as_ref();
        if route.fwd.is_none()
            && let Some(refusal) =
                inspector.and_then(|i| i.refuse_connect(self.dest, route.tls_skip))
        {
            let rule = route.allow.rule.clone();
            return Err(Refused::Inspector { rule, refusal });
        }
        let mut guard = Guard::new(shared.policy.subscribe(), generation, shared.cancel.clone());
        if guard.moved().is_some() {
            return Err(Refused::PolicyChanged);
        }
        let dialed = tokio::select! {
            d = dial(&addrs, port, shared.config.connect_timeout) => d,
            _ = guard.ended() => return Err(Refused::PolicyChanged),
        };
        match dialed {
            Ok(upstream) => Ok((upstream, guard)),
            Err(error) => Err(Refused::Unreachable { addrs, error }),
        }
    }

    /// Carry an opened connection: the `200` and the tunnel (raw, or through the inspector),
    /// or the forwarded request, until either end closes or the generation moves on.
    async fn carry(
        &self,
        mut stream: TcpStream,
        (upstream, mut guard): (TcpStream, Guard),
        route: Route,
        (head, rest): (Vec<u8>, Vec<u8>),
        caller: Caller,
        rev: Arc<Revision>,
    ) {
        let shared = self.shared;
        let rule = route.allow.rule;
        let generation = rev.generation;
        let end = match route.fwd {
            None => {
                if stream.write_all(response::CONNECT_OK).await.is_err() {
                    return;
                }
                self.event(Outcome::Allowed, &rule, None, Some(&caller), generation);
                match (route.inspect, &shared.config.inspector) {
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
                        let idle = shared.config.idle_timeout;
                        tunnel(stream, upstream, &rest, &mut guard, idle).await
                    }
                }
            }
            Some((authority, path_and_query)) => {
                self.event(Outcome::Allowed, &rule, None, Some(&caller), generation);
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
            let reason = Some(format!("current_generation:{now}"));
            let outcome = Outcome::ClosedByReload;
            self.event(outcome, &rule, reason, Some(&caller), generation);
        }
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
