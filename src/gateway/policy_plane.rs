//! The policy plane: fetch the sandbox's policy from the gateway at start,
//! poll for new revisions, apply each one at the next exec, and report LOADED or FAILED.
//!
//! - GetSandboxConfig is called by path with [`RawCodec`], so the answer reaches
//!   `policy::openshell::decode_config_response` as bytes: a generated prost client would drop
//!   unknown fields (a newer gateway's restriction) silently, which fails open.
//! - Every exec spawns through [`PolicySlot`]. A new revision builds a new [`Sandbox`] and
//!   swaps it in; execs already running keep the one they started under.
//! - What a live sandbox may change the live-change rule (`check_live_change`), the same function
//!   the test gateway enforces. We go further than OpenShell: an allowed change (a path
//!   gained) is applied at the next exec instead of after a restart.
//! - A revision that cannot be applied is reported FAILED with the reason, and
//!   `policy_validation_failure_mode` decides: `fail_closed` refuses every exec until a valid
//!   revision arrives; `retain_last_valid` keeps the last sandbox that was built.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use http::uri::PathAndQuery;
use prost::Message;
use tokio::sync::{mpsc, watch};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

use super::auth;
use super::channel;
use super::config::GatewayConfig;
use super::tokens::{Bearer, TokenStore};
use crate::exec::Sandbox;
use crate::exec::egress::EgressError;
use crate::policy::PolicyFlags;
use crate::policy::openshell::{
    self, ConfigResponse, FailureMode, Host, LocalPolicyError, PolicySourceKind, ProtoError,
    SandboxPolicy,
};
use crate::proto::sandbox::v1::GetSandboxConfigRequest;
use crate::proto::v1::{PolicyStatus, ReportPolicyStatusRequest, UpdateConfigRequest};

use super::ocsf;
use super::policy_slot::Active;
pub use super::policy_slot::{PolicySlot, SpawnError};

/// The gRPC path of GetSandboxConfig (not declared in our proto on purpose, see above).
pub const GET_SANDBOX_CONFIG: &str = "/openshell.v1.OpenShell/GetSandboxConfig";

/// Poll interval when `OPENSHELL_POLICY_POLL_INTERVAL_SECS` is unset.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(10);

/// Startup fetch: 5 attempts, with these sleeps between them.
const STARTUP_BACKOFF: [Duration; 4] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(4),
];

/// Longest wait for one policy-plane call.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A tonic codec that moves message bodies as raw bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;

#[derive(Debug, Clone, Copy, Default)]
pub struct RawEncoder;

#[derive(Debug, Clone, Copy, Default)]
pub struct RawDecoder;

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

/// Call GetSandboxConfig and return the response body undecoded.
pub async fn get_sandbox_config(
    ch: Channel,
    tokens: &Arc<TokenStore>,
    sandbox_id: &str,
) -> Result<Bytes, Status> {
    let body = GetSandboxConfigRequest {
        sandbox_id: sandbox_id.to_owned(),
    }
    .encode_to_vec();
    let svc = InterceptedService::new(ch, Bearer::new(tokens.clone()));
    let mut grpc = tonic::client::Grpc::new(svc).max_decoding_message_size(4 << 20);
    let call = async {
        grpc.ready()
            .await
            .map_err(|e| Status::unavailable(format!("gateway channel: {e}")))?;
        grpc.unary(
            Request::new(Bytes::from(body)),
            PathAndQuery::from_static(GET_SANDBOX_CONFIG),
            RawCodec,
        )
        .await
    };
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(r) => r.map(|r| r.into_inner()),
        Err(_) => Err(Status::deadline_exceeded("GetSandboxConfig timed out")),
    }
}

/// Codes worth retrying (for GetSandboxConfig and for reports).
fn retryable(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::ResourceExhausted
            | Code::Aborted
            | Code::Internal
            | Code::Unknown
    )
}

#[derive(Debug, thiserror::Error)]
pub enum PlaneError {
    #[error("GetSandboxConfig failed{}: {}", if *.attempts > 1 { format!(" after {} attempts", .attempts) } else { String::new() }, describe(.status))]
    Fetch { status: Status, attempts: usize },
    #[error("GetSandboxConfig answer cannot be read: {0}")]
    Decode(#[from] ProtoError),
    #[error(transparent)]
    Local(#[from] LocalPolicyError),
}

fn describe(s: &Status) -> String {
    let what = match s.code() {
        Code::Unimplemented => "the gateway does not serve the policy plane",
        Code::PermissionDenied => "the token is not for this sandbox",
        Code::NotFound => "the gateway does not know this sandbox id",
        Code::Unauthenticated => "the gateway did not accept the credentials",
        _ => "the gateway refused the call",
    };
    format!("{what} [{:?}: {}]", s.code(), s.message())
}

/// Everything the plane needs; built by `gateway::supervise`.
pub struct PlaneConfig {
    pub gateway: GatewayConfig,
    pub tokens: Arc<TokenStore>,
    /// `OPENSHELL_SANDBOX`, the name UpdateConfig addresses.
    pub sandbox_name: Option<String>,
    /// The explicitly given policy flags (see `docs/policy.md`, "Flags and the file").
    pub flags: PolicyFlags,
    pub default_workdir: PathBuf,
    pub secret_paths: Vec<PathBuf>,
    pub interval: Duration,
    /// Where the local fallback looks, in order.
    pub local_paths: Vec<PathBuf>,
    /// The supervisor's TLS interception and provider credentials.
    pub egress: Arc<super::egress::ServeEgress>,
    /// What every revision's sandbox spawns through.
    pub supervisor: crate::exec::Supervisor,
}

impl PlaneConfig {
    /// `OPENSHELL_POLICY_POLL_INTERVAL_SECS` (default 10; 0 or garbage means the default).
    pub fn poll_interval_from_env() -> Duration {
        std::env::var("OPENSHELL_POLICY_POLL_INTERVAL_SECS")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|v| *v > 0)
            .map(Duration::from_secs)
            .unwrap_or(DEFAULT_POLL_INTERVAL)
    }
}

/// The local fallback's paths: `OPENSHELL_LOCAL_POLICY_PATH` when set (one file, replacing
/// both; for tests and images that keep the policy elsewhere), else the two standard paths.
pub fn local_policy_paths() -> Vec<PathBuf> {
    match std::env::var_os("OPENSHELL_LOCAL_POLICY_PATH").filter(|v| !v.is_empty()) {
        Some(p) => vec![PathBuf::from(p)],
        None => openshell::LOCAL_POLICY_PATHS
            .iter()
            .map(PathBuf::from)
            .collect(),
    }
}

/// One ReportPolicyStatus to deliver.
struct Report {
    version: u32,
    status: PolicyStatus,
    load_error: String,
}

/// What the plane remembers between polls.
#[derive(Default)]
struct Tracked {
    /// The last policy that decoded and passed the live-change check, the local one at start included: what
    /// the next revision is compared against.
    baseline: Option<SandboxPolicy>,
    /// `(config_revision, policy_hash)` of the last answer acted on (change detection).
    seen: Option<(u64, String)>,
    version: u32,
    /// The workspace from GetSandboxConfig, kept for UpdateConfig.
    workspace: String,
}

pub struct Plane {
    cfg: PlaneConfig,
    /// The plane's own channel, made on first use; tonic reconnects it after a failure.
    channel: tokio::sync::Mutex<Option<Channel>>,
    slot: Arc<PolicySlot>,
    /// The revision every sandbox's egress proxy keeps.
    egress: super::egress::PlaneEgress,
    reports: mpsc::UnboundedSender<Report>,
    tracked: tokio::sync::Mutex<Tracked>,
}

impl Plane {
    /// The startup sequence: fetch (with the startup retries), fall back to a local
    /// policy when the gateway has none and sync it back, apply, report. Returns the plane,
    /// whose [`PolicySlot`] every exec spawns through.
    ///
    /// OpenShell exits when the fetch keeps failing. We fail closed instead: the slot stays
    /// quarantined (every exec refused, saying why), the session still comes up so its own
    /// errors are logged with what they mean, and the poll loop keeps fetching. Only a local
    /// policy file that exists and cannot be read is fatal.
    pub async fn start(cfg: PlaneConfig) -> Result<Arc<Plane>, PlaneError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let plane = Arc::new(Plane {
            channel: tokio::sync::Mutex::new(None),
            slot: PolicySlot::with(Active::Quarantined(
                "no policy could be fetched from the gateway yet".into(),
            )),
            egress: super::egress::PlaneEgress::new(cfg.egress.clone()),
            reports: tx,
            tracked: tokio::sync::Mutex::new(Tracked::default()),
            cfg,
        });
        tokio::spawn(report_loop(plane.clone(), rx));
        let resp = match plane.fetch_with_retry().await {
            Ok(raw) => openshell::decode_config_response(&raw).map_err(PlaneError::from),
            Err(e) => Err(e),
        };
        match resp {
            Ok(resp) => plane.load(resp).await?,
            Err(e) => {
                tracing::error!(
                    "no sandbox policy: {e}; every exec is refused until the policy can be fetched (retried every {:?})",
                    plane.cfg.interval
                );
                plane.slot.set(Active::Quarantined(format!(
                    "no policy could be fetched: {e}"
                )));
            }
        }
        Ok(plane)
    }

    /// The first policy: steps 2-5.
    async fn load(&self, resp: ConfigResponse) -> Result<(), PlaneError> {
        self.egress
            .shared()
            .provider_revision(resp.provider_env_revision);
        let resp = self.sync_if_needed(resp).await?;
        self.handle(resp).await;
        Ok(())
    }

    /// The channel, connected (and the first token obtained) on first use.
    async fn channel(&self) -> Result<Channel, Status> {
        let mut ch = self.channel.lock().await;
        if let Some(c) = ch.as_ref() {
            return Ok(c.clone());
        }
        let c = channel::connect(&self.cfg.gateway)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        auth::ensure_token(&self.cfg.tokens, &c)
            .await
            .map_err(|e| Status::unauthenticated(e.to_string()))?;
        *ch = Some(c.clone());
        Ok(c)
    }

    pub fn slot(&self) -> Arc<PolicySlot> {
        self.slot.clone()
    }

    /// Whether the slot holds a sandbox (false: quarantined).
    pub fn ready(&self) -> bool {
        self.slot.has_sandbox()
    }

    async fn fetch(&self) -> Result<Bytes, Status> {
        get_sandbox_config(
            self.channel().await?,
            &self.cfg.tokens,
            &self.cfg.gateway.sandbox_id,
        )
        .await
    }

    async fn fetch_with_retry(&self) -> Result<Bytes, PlaneError> {
        let mut attempt = 0;
        loop {
            match self.fetch().await {
                Ok(b) => return Ok(b),
                Err(status) if retryable(status.code()) && attempt < STARTUP_BACKOFF.len() => {
                    let delay = STARTUP_BACKOFF[attempt];
                    attempt += 1;
                    tracing::warn!(
                        "GetSandboxConfig attempt {attempt} failed ({:?}: {}); retrying in {delay:?}",
                        status.code(),
                        status.message()
                    );
                    tokio::time::sleep(delay).await;
                }
                Err(status) => {
                    return Err(PlaneError::Fetch {
                        status,
                        attempts: attempt + 1,
                    });
                }
            }
        }
    }

    /// steps 2 and 3: no policy means the local fallback, enriched, synced back; a
    /// policy missing baseline paths is enriched and synced. After a good sync the re-fetched
    /// answer is the one loaded; after a failed one we enforce what we have.
    async fn sync_if_needed(&self, resp: ConfigResponse) -> Result<ConfigResponse, PlaneError> {
        let exists = |p: &Path| p.exists();
        let (mut policy, why) = match &resp.policy {
            Ok(None) => {
                let paths: Vec<&Path> = self.cfg.local_paths.iter().map(PathBuf::as_path).collect();
                let (mut p, src) = openshell::load_local(&paths)?;
                openshell::enrich_with_baseline(&mut p, &exists);
                openshell::strip_provider_rules(&mut p);
                let from = match src {
                    openshell::LocalSource::File(f) => f.display().to_string(),
                    openshell::LocalSource::Default => "the restrictive default".into(),
                };
                tracing::info!("the gateway has no policy for this sandbox: using {from}");
                (p, from)
            }
            Ok(Some(p)) => {
                let mut p = p.clone();
                if !openshell::enrich_with_baseline(&mut p, &exists) {
                    return Ok(resp);
                }
                (p, "the gateway's policy with baseline paths added".into())
            }
            Err(_) => return Ok(resp),
        };
        let Some(name) = self.cfg.sandbox_name.clone().filter(|n| !n.is_empty()) else {
            // OpenShell refuses to start here; the sync only makes the policy visible to
            // `policy get`, it changes nothing we enforce, so we enforce and say so.
            tracing::warn!(
                "OPENSHELL_SANDBOX (the sandbox name) is not set: {why} is enforced but not synced to the gateway with UpdateConfig"
            );
            return Ok(local_answer(resp, policy));
        };
        openshell::strip_provider_rules(&mut policy);
        let req = UpdateConfigRequest {
            name,
            policy: Some(policy.to_proto()),
            workspace: resp.workspace.clone(),
        };
        let ch = self.channel().await.map_err(|status| PlaneError::Fetch {
            status,
            attempts: 1,
        })?;
        let mut client = channel::client(ch, &self.cfg.tokens);
        let synced = tokio::time::timeout(CALL_TIMEOUT, client.update_config(req)).await;
        match synced {
            Ok(Ok(_)) => {
                tracing::info!("synced {why} to the gateway (UpdateConfig)");
                match self.fetch().await.map_err(|status| PlaneError::Fetch {
                    status,
                    attempts: 1,
                }) {
                    Ok(raw) => {
                        let again = openshell::decode_config_response(&raw)?;
                        if matches!(again.policy, Ok(Some(_)) | Err(_)) {
                            return Ok(again);
                        }
                        Ok(local_answer(again, policy))
                    }
                    Err(e) => {
                        tracing::warn!("re-fetching after the sync: {e}; enforcing {why}");
                        Ok(local_answer(resp, policy))
                    }
                }
            }
            Ok(Err(s)) => {
                tracing::warn!(
                    "UpdateConfig (syncing {why}) failed: {:?}: {}; enforcing it anyway, the poll loop reconciles",
                    s.code(),
                    s.message()
                );
                Ok(local_answer(resp, policy))
            }
            Err(_) => {
                tracing::warn!("UpdateConfig timed out; enforcing {why} anyway");
                Ok(local_answer(resp, policy))
            }
        }
    }

    /// Act on one answer: apply its policy, or fail by the failure mode. Reports LOADED or
    /// FAILED for sandbox-sourced revisions.
    async fn handle(&self, resp: ConfigResponse) {
        let mut t = self.tracked.lock().await;
        let reportable = resp.policy_source == PolicySourceKind::Sandbox && resp.version > 0;
        let version = resp.version;
        t.seen = Some((resp.config_revision, resp.policy_hash.clone()));
        t.version = version;
        if !resp.workspace.is_empty() {
            t.workspace = resp.workspace.clone();
        }
        let policy = match resp.policy {
            Ok(Some(p)) => p,
            Ok(None) => {
                tracing::info!(
                    version,
                    "the gateway has no policy for this sandbox any more; keeping the current one"
                );
                return;
            }
            Err(e) => {
                return self.fail(reportable, version, resp.failure_mode, e.to_string());
            }
        };
        if let Some(base) = &t.baseline
            && let Err(e) = openshell::check_live_change(base, &policy)
        {
            return self.fail(
                reportable,
                version,
                resp.failure_mode,
                format!("refused on a live sandbox: {e}"),
            );
        }
        // The baseline is whatever the sandbox runs under, a local policy (version 0) included.
        // When the sync of a local policy failed (a gateway refusing UpdateConfig, or no
        // OPENSHELL_SANDBOX), the gateway's first revision has nothing of the gateway's own to
        // be compared with, so its live-change check lets anything through; without this, so would
        // we, and a live sandbox would switch its uid or its Landlock mode at the next exec.
        t.baseline = Some(policy.clone());
        drop(t);
        let host = Host::current();
        let built = openshell::resolve(
            &policy,
            &self.cfg.flags,
            &self.cfg.default_workdir,
            self.cfg.secret_paths.clone(),
            &host,
        )
        .map_err(|e| e.to_string())
        .and_then(|r| {
            // The rules go to the egress proxy, compiled as `run` compiles them; without any
            // (an explicit --network replaced them) the proxy denies every connection.
            let rules = crate::exec::egress::rules_for(&r.policy, r.proxy_rules(&policy), &[])
                .map_err(|e| match e {
                    EgressError::Rules(e) => format!("network_policies: {e}"),
                    e => e.to_string(),
                })?
                .unwrap_or_default();
            for w in &r.warnings {
                tracing::warn!(version, "policy: {w}");
            }
            // Each revision's view shows the one CA's public files.
            let mut p = r.policy;
            p.namespaces.files = self.egress.shared().view_files();
            let sandbox = tokio::task::block_in_place(|| Sandbox::new(&self.cfg.supervisor, p))
                .map_err(|e| e.to_string())?;
            self.egress
                .adopt(&sandbox, rules)
                .map_err(|e| e.to_string())?;
            Ok(sandbox)
        });
        match built {
            Ok(sandbox) => {
                self.slot.set(Active::Ready(sandbox));
                self.egress.shared().policy_loaded();
                let (status, err) = (PolicyStatus::Loaded, String::new());
                ocsf::Event::config(ocsf::Severity::Informational, "LOADED")
                    .subject(format!("policy version {version}"))
                    .detail("applies", "at the next exec".into())
                    .emit();
                if reportable {
                    self.report(version, status, err);
                }
            }
            Err(e) => self.fail(reportable, version, resp.failure_mode, e),
        }
    }

    fn fail(&self, reportable: bool, version: u32, mode: FailureMode, reason: String) {
        let keep = mode == FailureMode::RetainLastValid && self.slot.has_sandbox();
        ocsf::Event::config(ocsf::Severity::High, "FAILED")
            .subject(format!("policy version {version}"))
            .detail(
                "action",
                if keep {
                    "retain_last_valid: the last good policy stays".into()
                } else {
                    "fail_closed: every exec is refused until a valid policy arrives".into()
                },
            )
            .detail("reason", reason.clone())
            .emit();
        tracing::warn!(version, "policy cannot be applied: {reason}");
        if !keep {
            self.egress.quarantine(version, &reason);
            self.slot.set(Active::Quarantined(format!(
                "policy version {version}: {reason}"
            )));
        }
        if reportable {
            self.report(version, PolicyStatus::Failed, reason);
        }
    }

    fn report(&self, version: u32, status: PolicyStatus, load_error: String) {
        let _ = self.reports.send(Report {
            version,
            status,
            load_error,
        });
    }

    /// One poll: keep the current policy on any failure to reach the gateway.
    async fn poll_once(&self) {
        let raw = match self.fetch().await {
            Ok(r) => r,
            Err(s) => {
                tracing::info!(
                    "policy poll: GetSandboxConfig failed ({:?}: {}); keeping the current policy",
                    s.code(),
                    s.message()
                );
                return;
            }
        };
        let resp = match openshell::decode_config_response(&raw) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("policy poll: unreadable answer ({e}); keeping the current policy");
                return;
            }
        };
        self.egress
            .shared()
            .provider_revision(resp.provider_env_revision);
        if self.tracked.lock().await.seen.is_none() {
            // Nothing was loaded at start: this is the startup sequence, late.
            tracing::info!(version = resp.version, "policy poll: the first policy");
            if let Err(e) = self.load(resp).await {
                tracing::error!("loading the first policy: {e}");
            }
            return;
        }
        {
            let mut t = self.tracked.lock().await;
            let key = (resp.config_revision, resp.policy_hash.clone());
            if t.seen.as_ref() == Some(&key) {
                // The same policy under a newer revision number: acknowledge it.
                if resp.version > t.version
                    && resp.policy_source == PolicySourceKind::Sandbox
                    && self.slot.has_sandbox()
                {
                    t.version = resp.version;
                    self.report(resp.version, PolicyStatus::Loaded, String::new());
                }
                return;
            }
        }
        tracing::info!(version = resp.version, "policy poll: a new revision");
        self.handle(resp).await;
    }

    /// Poll every interval until `stop`; the first poll runs at once.
    ///
    /// While the sandbox is quarantined (no policy could be loaded, or `fail_closed` refused the
    /// last one) every exec is refused, so the poll runs every second until a usable policy
    /// arrives: a fetch that failed only because the token was being rotated must not keep
    /// the sandbox shut for a whole interval.
    pub async fn poll_loop(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut first = true;
        loop {
            let wait = if first {
                Duration::ZERO
            } else if self.slot.current().is_none() {
                self.cfg.interval.min(Duration::from_secs(1))
            } else {
                self.cfg.interval
            };
            first = false;
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = super::stop::stopped(&mut stop) => return,
            }
            self.poll_once().await;
        }
    }
}

/// A local policy standing in for the gateway's answer (version 0: nothing to report).
fn local_answer(mut resp: ConfigResponse, policy: SandboxPolicy) -> ConfigResponse {
    resp.policy = Ok(Some(policy));
    resp
}

/// Deliver reports in order; retryable errors after 1, 2, 4 ... 32 s, others drop the report.
async fn report_loop(plane: Arc<Plane>, mut rx: mpsc::UnboundedReceiver<Report>) {
    while let Some(r) = rx.recv().await {
        let mut delay = Duration::from_secs(1);
        loop {
            let req = ReportPolicyStatusRequest {
                sandbox_id: plane.cfg.gateway.sandbox_id.clone(),
                version: r.version,
                status: r.status as i32,
                load_error: r.load_error.clone(),
            };
            let res = match plane.channel().await {
                Ok(ch) => {
                    let mut client = channel::client(ch, &plane.cfg.tokens);
                    tokio::time::timeout(CALL_TIMEOUT, client.report_policy_status(req))
                        .await
                        .unwrap_or_else(|_| Err(Status::deadline_exceeded("timed out")))
                }
                Err(s) => Err(s),
            };
            match res {
                Ok(_) => {
                    tracing::info!(version = r.version, status = ?r.status, "policy status reported");
                    break;
                }
                Err(s) if retryable(s.code()) => {
                    tracing::info!(
                        version = r.version,
                        "ReportPolicyStatus failed ({:?}: {}); retrying in {delay:?}",
                        s.code(),
                        s.message()
                    );
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(32));
                }
                Err(s) => {
                    tracing::warn!(
                        version = r.version,
                        "ReportPolicyStatus refused ({:?}: {}); report dropped",
                        s.code(),
                        s.message()
                    );
                    break;
                }
            }
        }
    }
}
