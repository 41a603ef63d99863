//! A gateway that behaves like the real OpenShell gateway on everything a supervisor can see:
//! tonic over rustls requiring client certificates, the sandbox JWT,
//! ConnectSupervisor and RelayStream with the real ordering and error codes,
//! ReportMainProcessExit, and the token RPCs. Knobs let tests inject the failures they need.
//! Its listening server is `listener.rs`.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use openshell_sandbox::proto::v1::open_shell_server::OpenShell;
use openshell_sandbox::proto::v1::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status, Streaming};

use super::jwt::JwtIssuer;
pub use super::listener::Server;

pub type Outbound<T> = mpsc::Sender<Result<T, Status>>;

/// How the gateway authenticates supervisors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMode {
    /// HEAD (v0.0.47+): a sandbox JWT is mandatory on sandbox methods.
    Jwt,
    /// v0.0.36: the client certificate is the only authentication.
    CertOnly,
}

/// A claimed relay, before any bytes are moved: the supervisor's frames and our sender.
pub struct RawRelay {
    pub inbound: Streaming<RelayFrame>,
    pub outbound: Outbound<RelayFrame>,
}

struct Pending {
    created: Instant,
    open: RelayOpen,
    waiter: oneshot::Sender<Result<RawRelay, Status>>,
}

struct CurrentSession {
    id: String,
    tx: Outbound<GatewayMessage>,
    stop: Option<oneshot::Sender<()>>,
}

/// Things the tests look at afterwards.
#[derive(Default, Debug, Clone)]
pub struct Seen {
    pub hellos: Vec<SupervisorHello>,
    pub hello_auth: Vec<Option<String>>,
    pub heartbeats: Vec<Instant>,
    pub relay_results: Vec<RelayOpenResult>,
    pub reports: Vec<ReportMainProcessExitRequest>,
    pub report_attempts: u32,
    pub issued: u32,
    pub refreshed: u32,
    pub rejected_sessions: u32,
    pub config_calls: u32,
    pub provider_env_requests: Vec<GetSandboxProviderEnvironmentRequest>,
}

/// What GetSandboxProviderEnvironment answers.
#[derive(Default, Debug, Clone)]
pub struct ProviderEnv {
    pub environment: HashMap<String, String>,
    pub non_secret: Vec<String>,
    /// Static credential values: removed from the reply unless the supervisor says it
    /// supports static credential bindings, as the gateway does.
    pub static_keys: Vec<String>,
    /// Where each static credential may go (removed with the values).
    pub bindings: HashMap<String, StaticCredentialBinding>,
    /// `provider_env_revision`, in this reply and in GetSandboxConfig (0 means 1).
    pub revision: u64,
}

pub struct State {
    pub sandbox_id: String,
    pub auth: AuthMode,
    pub jwt: Arc<JwtIssuer>,
    /// The SA token IssueSandboxToken accepts.
    pub sa_token: String,
    /// Lifetime of tokens from Issue/Refresh, seconds.
    pub token_ttl: AtomicU32,
    pub heartbeat_secs: AtomicU32,
    current: Mutex<Option<CurrentSession>>,
    pending: Mutex<HashMap<String, Pending>>,
    ready: watch::Sender<bool>,
    pub seen: Mutex<Seen>,
    /// Reject this many ConnectSupervisor calls with `reject_code`.
    pub reject_sessions: AtomicU32,
    pub reject_code: Mutex<Code>,
    /// Never answer a hello.
    pub silent_hello: AtomicBool,
    /// Fail this many ReportMainProcessExit calls with FAILED_PRECONDITION.
    pub fail_reports: AtomicU32,
    /// Policy revisions, reports and config syncs (`plane.rs`).
    pub plane: Mutex<super::plane::PlaneState>,
    /// Pushed log lines (`plane.rs`).
    pub logs: Mutex<super::plane::LogState>,
    pub provider_env: Mutex<ProviderEnv>,
}

impl State {
    pub fn new(sandbox_id: &str, auth: AuthMode) -> Arc<State> {
        Self::with_jwt(sandbox_id, auth, Arc::new(JwtIssuer::new()))
    }

    /// A restarted gateway keeps its signing key, so tokens it issued stay valid.
    pub fn with_jwt(sandbox_id: &str, auth: AuthMode, jwt: Arc<JwtIssuer>) -> Arc<State> {
        Arc::new(State {
            sandbox_id: sandbox_id.into(),
            auth,
            jwt,
            sa_token: "k8s-service-account-token".into(),
            token_ttl: AtomicU32::new(3600),
            heartbeat_secs: AtomicU32::new(15),
            current: Mutex::new(None),
            pending: Mutex::new(HashMap::new()),
            ready: watch::channel(false).0,
            seen: Mutex::new(Seen::default()),
            reject_sessions: AtomicU32::new(0),
            reject_code: Mutex::new(Code::Unavailable),
            silent_hello: AtomicBool::new(false),
            fail_reports: AtomicU32::new(0),
            plane: Mutex::new(Default::default()),
            logs: Mutex::new(Default::default()),
            provider_env: Mutex::new(ProviderEnv::default()),
        })
    }

    pub fn seen(&self) -> Seen {
        self.seen.lock().unwrap().clone()
    }

    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Mark the sandbox READY without a session, as a gateway that crashed (so never demoted
    /// the phase) finds it in its store after a restart.
    pub fn set_ready(&self, ready: bool) {
        self.ready.send_replace(ready);
    }

    pub fn ready_rx(&self) -> watch::Receiver<bool> {
        self.ready.subscribe()
    }

    /// The principal's sandbox id, checking the bearer as the gateway's auth chain does.
    pub(super) fn principal<T>(&self, req: &Request<T>) -> Result<Option<String>, Status> {
        if self.auth == AuthMode::CertOnly {
            return Ok(None);
        }
        let token =
            bearer(req).ok_or_else(|| Status::unauthenticated("missing authorization header"))?;
        match self.jwt.verify(&token) {
            Ok(c) => Ok(Some(c.sandbox_id)),
            Err(e) => Err(Status::unauthenticated(format!("invalid token: {e}"))),
        }
    }

    pub(super) fn same_sandbox(&self, principal: &Option<String>, id: &str) -> Result<(), Status> {
        match principal {
            Some(p) if p != id => Err(Status::permission_denied("sandbox principal mismatch")),
            _ => Ok(()),
        }
    }

    /// Register a pending relay and send RelayOpen (in that order, like the gateway), then wait
    /// for the supervisor to claim it. Errors are the ones ExecSandbox returns.
    pub async fn open_relay(&self, target: Option<relay_open::Target>) -> Result<RawRelay, Status> {
        self.open_relay_with_id(uuid::Uuid::new_v4().to_string(), target, true)
            .await
    }

    pub async fn open_relay_with_id(
        &self,
        channel_id: String,
        target: Option<relay_open::Target>,
        register: bool,
    ) -> Result<RawRelay, Status> {
        self.open_relay_as(channel_id, target, String::new(), register)
            .await
    }

    /// [`State::open_relay_with_id`] with `RelayOpen.service_id` set, as ForwardTcp sets it
    /// for `ssh-proxy`.
    pub async fn open_relay_as(
        &self,
        channel_id: String,
        target: Option<relay_open::Target>,
        service_id: String,
        register: bool,
    ) -> Result<RawRelay, Status> {
        let tx = self.wait_session().await?;
        let open = RelayOpen {
            channel_id: channel_id.clone(),
            target,
            service_id,
        };
        let (wtx, wrx) = oneshot::channel();
        if register {
            let mut p = self.pending.lock().unwrap();
            if p.len() >= 32 {
                return Err(Status::resource_exhausted(
                    "too many pending relays for this sandbox",
                ));
            }
            p.insert(
                channel_id.clone(),
                Pending {
                    created: Instant::now(),
                    open: open.clone(),
                    waiter: wtx,
                },
            );
        }
        let msg = GatewayMessage {
            payload: Some(gateway_message::Payload::RelayOpen(open)),
        };
        if tx.send(Ok(msg)).await.is_err() {
            self.pending.lock().unwrap().remove(&channel_id);
            return Err(Status::unavailable("supervisor relay failed: session gone"));
        }
        if !register {
            return Err(Status::not_found("relay was not registered"));
        }
        match tokio::time::timeout(Duration::from_secs(10), wrx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(Status::unavailable("supervisor relay failed: dropped")),
            Err(_) => {
                self.pending.lock().unwrap().remove(&channel_id);
                Err(Status::deadline_exceeded("relay open timed out"))
            }
        }
    }

    /// Wait up to 15 s for a live session (100 ms doubling to 2 s).
    async fn wait_session(&self) -> Result<Outbound<GatewayMessage>, Status> {
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut delay = Duration::from_millis(100);
        loop {
            if let Some(s) = self.current.lock().unwrap().as_ref() {
                return Ok(s.tx.clone());
            }
            if Instant::now() >= deadline {
                return Err(Status::unavailable(
                    "supervisor relay failed: supervisor session not connected",
                ));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
        }
    }
}

fn bearer<T>(req: &Request<T>) -> Option<String> {
    let v = req.metadata().get("authorization")?.to_str().ok()?;
    v.strip_prefix("Bearer ").map(str::to_owned)
}

#[derive(Clone)]
pub struct Service(pub Arc<State>);

type BoxStream<T> = Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl OpenShell for Service {
    type ConnectSupervisorStream = BoxStream<GatewayMessage>;
    type RelayStreamStream = BoxStream<RelayFrame>;
    type ExecSandboxStream = BoxStream<ExecSandboxEvent>;

    async fn connect_supervisor(
        &self,
        req: Request<Streaming<SupervisorMessage>>,
    ) -> Result<Response<Self::ConnectSupervisorStream>, Status> {
        let st = self.0.clone();
        let auth = bearer(&req);
        if st.reject_sessions.load(Ordering::SeqCst) > 0 {
            st.reject_sessions.fetch_sub(1, Ordering::SeqCst);
            st.seen.lock().unwrap().rejected_sessions += 1;
            let code = *st.reject_code.lock().unwrap();
            return Err(Status::new(code, "injected rejection"));
        }
        let principal = st.principal(&req);
        let mut inbound = req.into_inner();
        // The gateway reads the hello before sending response headers.
        let first = inbound.message().await?;
        let hello = match first.and_then(|m| m.payload) {
            Some(supervisor_message::Payload::Hello(h)) => h,
            Some(_) => return Err(Status::invalid_argument("expected SupervisorHello")),
            None => return Err(Status::invalid_argument("stream closed before hello")),
        };
        {
            let mut seen = st.seen.lock().unwrap();
            seen.hellos.push(hello.clone());
            seen.hello_auth.push(auth);
        }
        if hello.sandbox_id.is_empty() {
            return Err(Status::invalid_argument("sandbox_id is required"));
        }
        let principal = principal?;
        if st.auth == AuthMode::Jwt && principal.is_none() {
            return Err(Status::permission_denied(
                "this method requires a sandbox principal",
            ));
        }
        st.same_sandbox(&principal, &hello.sandbox_id)?;
        if hello.sandbox_id != st.sandbox_id {
            return Err(Status::not_found("sandbox not found"));
        }
        if st.silent_hello.load(Ordering::SeqCst) {
            // Hold the call open without ever answering.
            std::future::pending::<()>().await;
        }
        let session_id = uuid::Uuid::new_v4().to_string();
        let (tx, rx) = mpsc::channel(64);
        let accepted = GatewayMessage {
            payload: Some(gateway_message::Payload::SessionAccepted(SessionAccepted {
                session_id: session_id.clone(),
                heartbeat_interval_secs: st.heartbeat_secs.load(Ordering::SeqCst),
            })),
        };
        let _ = tx.send(Ok(accepted)).await;
        let (stop_tx, stop_rx) = oneshot::channel();
        // A new session for the same sandbox replaces the old one; pending relays are replayed.
        let old = st.current.lock().unwrap().replace(CurrentSession {
            id: session_id.clone(),
            tx: tx.clone(),
            stop: Some(stop_tx),
        });
        if let Some(mut old) = old {
            if let Some(s) = old.stop.take() {
                let _ = s.send(());
            }
            let replay: Vec<RelayOpen> = st
                .pending
                .lock()
                .unwrap()
                .values()
                .map(|p| p.open.clone())
                .collect();
            for open in replay {
                let _ = tx
                    .send(Ok(GatewayMessage {
                        payload: Some(gateway_message::Payload::RelayOpen(open)),
                    }))
                    .await;
            }
        }
        st.ready.send_replace(true);
        // Heartbeats every interval, first one an interval after accept.
        let hb_tx = tx.clone();
        let every = Duration::from_secs(u64::from(st.heartbeat_secs.load(Ordering::SeqCst).max(1)));
        tokio::spawn(async move {
            let mut t = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            loop {
                t.tick().await;
                let hb = GatewayMessage {
                    payload: Some(gateway_message::Payload::Heartbeat(GatewayHeartbeat {})),
                };
                if hb_tx.send(Ok(hb)).await.is_err() {
                    return;
                }
            }
        });
        let st2 = st.clone();
        let sid = session_id.clone();
        tokio::spawn(async move {
            let mut stop_rx = stop_rx;
            loop {
                let msg = tokio::select! {
                    m = inbound.message() => m,
                    _ = &mut stop_rx => return,
                };
                match msg {
                    Ok(Some(m)) => match m.payload {
                        Some(supervisor_message::Payload::Heartbeat(_)) => {
                            st2.seen.lock().unwrap().heartbeats.push(Instant::now())
                        }
                        Some(supervisor_message::Payload::RelayOpenResult(r)) => {
                            st2.seen.lock().unwrap().relay_results.push(r.clone());
                            if !r.success
                                && let Some(p) = st2.pending.lock().unwrap().remove(&r.channel_id)
                            {
                                let _ = p.waiter.send(Err(Status::unavailable(r.error)));
                            }
                        }
                        _ => {}
                    },
                    Ok(None) | Err(_) => break,
                }
            }
            let mut cur = st2.current.lock().unwrap();
            if cur.as_ref().map(|c| c.id == sid).unwrap_or(false) {
                *cur = None;
                st2.ready.send_replace(false);
            }
        });
        // The old session's stream ends with OK when it is replaced: the stop signal above ends
        // its reader, and dropping its sender ends the stream.
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn relay_stream(
        &self,
        req: Request<Streaming<RelayFrame>>,
    ) -> Result<Response<Self::RelayStreamStream>, Status> {
        let st = self.0.clone();
        let principal = st.principal(&req)?;
        let mut inbound = req.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("empty relay stream"))?;
        let id = match first.payload {
            Some(relay_frame::Payload::Init(i)) if !i.channel_id.is_empty() => i.channel_id,
            _ => return Err(Status::invalid_argument("first relay frame must be init")),
        };
        st.same_sandbox(&principal, &st.sandbox_id)?;
        let pending = st
            .pending
            .lock()
            .unwrap()
            .remove(&id)
            .ok_or_else(|| Status::not_found("unknown or expired relay channel"))?;
        if pending.created.elapsed() > Duration::from_secs(10) {
            return Err(Status::deadline_exceeded("relay channel expired"));
        }
        let (tx, rx) = mpsc::channel(16);
        let _ = pending.waiter.send(Ok(RawRelay {
            inbound,
            outbound: tx,
        }));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn report_main_process_exit(
        &self,
        req: Request<ReportMainProcessExitRequest>,
    ) -> Result<Response<ReportMainProcessExitResponse>, Status> {
        let st = &self.0;
        st.seen.lock().unwrap().report_attempts += 1;
        let principal = st.principal(&req)?;
        let r = req.into_inner();
        if r.sandbox_id.is_empty() || r.instance_id.is_empty() {
            return Err(Status::invalid_argument(
                "sandbox_id and instance_id are required",
            ));
        }
        st.same_sandbox(&principal, &r.sandbox_id)?;
        if st.fail_reports.load(Ordering::SeqCst) > 0 {
            st.fail_reports.fetch_sub(1, Ordering::SeqCst);
            return Err(Status::failed_precondition("injected store failure"));
        }
        let mut seen = st.seen.lock().unwrap();
        // Idempotent: a duplicate is accepted without change.
        if !seen.reports.iter().any(|x| x.instance_id == r.instance_id) {
            seen.reports.push(r);
        }
        Ok(Response::new(ReportMainProcessExitResponse {}))
    }

    async fn issue_sandbox_token(
        &self,
        req: Request<IssueSandboxTokenRequest>,
    ) -> Result<Response<IssueSandboxTokenResponse>, Status> {
        let st = &self.0;
        let tok =
            bearer(&req).ok_or_else(|| Status::unauthenticated("missing authorization header"))?;
        if tok != st.sa_token {
            if st.jwt.verify(&tok).is_ok() {
                return Err(Status::permission_denied(
                    "gateway tokens cannot call IssueSandboxToken; use RefreshSandboxToken",
                ));
            }
            return Err(Status::unauthenticated("service-account token rejected"));
        }
        st.seen.lock().unwrap().issued += 1;
        Ok(Response::new(self.mint()))
    }

    async fn refresh_sandbox_token(
        &self,
        req: Request<RefreshSandboxTokenRequest>,
    ) -> Result<Response<RefreshSandboxTokenResponse>, Status> {
        let st = &self.0;
        let tok =
            bearer(&req).ok_or_else(|| Status::unauthenticated("missing authorization header"))?;
        if tok == st.sa_token {
            return Err(Status::permission_denied(
                "service-account tokens cannot refresh",
            ));
        }
        st.jwt
            .verify(&tok)
            .map_err(|e| Status::unauthenticated(format!("invalid token: {e}")))?;
        st.seen.lock().unwrap().refreshed += 1;
        let m = self.mint();
        Ok(Response::new(RefreshSandboxTokenResponse {
            token: m.token,
            expires_at_ms: m.expires_at_ms,
            extension_credentials: Vec::new(),
        }))
    }

    async fn update_config(
        &self,
        req: Request<UpdateConfigRequest>,
    ) -> Result<Response<UpdateConfigResponse>, Status> {
        self.0.update_config(req).map(Response::new)
    }

    async fn report_policy_status(
        &self,
        req: Request<ReportPolicyStatusRequest>,
    ) -> Result<Response<ReportPolicyStatusResponse>, Status> {
        self.0.report_policy_status(req).map(Response::new)
    }

    async fn push_sandbox_logs(
        &self,
        req: Request<Streaming<PushSandboxLogsRequest>>,
    ) -> Result<Response<PushSandboxLogsResponse>, Status> {
        self.0.push_sandbox_logs(req).await.map(Response::new)
    }

    async fn get_sandbox_provider_environment(
        &self,
        req: Request<GetSandboxProviderEnvironmentRequest>,
    ) -> Result<Response<GetSandboxProviderEnvironmentResponse>, Status> {
        let st = &self.0;
        let principal = st.principal(&req)?;
        let r = req.into_inner();
        st.same_sandbox(&principal, &r.sandbox_id)?;
        st.seen
            .lock()
            .unwrap()
            .provider_env_requests
            .push(r.clone());
        let p = st.provider_env.lock().unwrap().clone();
        let mut environment = p.environment;
        let mut bindings = p.bindings;
        if !r.supports_static_credential_bindings {
            environment.retain(|k, _| !p.static_keys.contains(k));
            bindings.clear();
        }
        Ok(Response::new(GetSandboxProviderEnvironmentResponse {
            environment,
            provider_env_revision: p.revision.max(1),
            non_secret_environment_keys: p.non_secret,
            static_credential_bindings: bindings,
        }))
    }

    async fn health(&self, _: Request<HealthRequest>) -> Result<Response<HealthResponse>, Status> {
        Ok(Response::new(HealthResponse {
            status: ServiceStatus::Healthy as i32,
            version: "test".into(),
        }))
    }

    async fn exec_sandbox(
        &self,
        req: Request<ExecSandboxRequest>,
    ) -> Result<Response<Self::ExecSandboxStream>, Status> {
        let rx = super::exec::exec_stream(self.0.clone(), req.into_inner()).await?;
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

impl Service {
    fn mint(&self) -> IssueSandboxTokenResponse {
        let ttl = self.0.token_ttl.load(Ordering::SeqCst);
        let token = self.0.jwt.mint(&self.0.sandbox_id, u64::from(ttl));
        let exp = super::jwt::now_ms() + i64::from(ttl) * 1000;
        IssueSandboxTokenResponse {
            token,
            expires_at_ms: if ttl == 0 { 0 } else { exp },
        }
    }
}

/// The largest data frame any supervisor sent to this process's gateways (the
/// supervisor sends at most 16 KiB per frame).
pub static LARGEST_FRAME: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Move bytes between a claimed relay and a duplex, as the gateway's bridge does: data frames
/// of at most 16 KiB, empty frames skipped, and a non-data frame after init ends reading.
pub fn bridge(relay: RawRelay) -> DuplexStream {
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    let (mut rd, mut wr) = tokio::io::split(ours);
    let RawRelay {
        mut inbound,
        outbound,
    } = relay;
    tokio::spawn(async move {
        while let Ok(Some(f)) = inbound.message().await {
            match f.payload {
                Some(relay_frame::Payload::Data(d)) if d.is_empty() => {}
                Some(relay_frame::Payload::Data(d)) => {
                    LARGEST_FRAME.fetch_max(d.len(), Ordering::Relaxed);
                    if wr.write_all(&d).await.is_err() {
                        break;
                    }
                }
                _ => break,
            }
        }
        let _ = wr.shutdown().await;
    });
    tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let f = RelayFrame {
                        payload: Some(relay_frame::Payload::Data(Bytes::copy_from_slice(
                            &buf[..n],
                        ))),
                    };
                    if outbound.send(Ok(f)).await.is_err() {
                        break;
                    }
                }
            }
        }
        // Dropping the sender ends the response stream with OK.
    });
    theirs
}
