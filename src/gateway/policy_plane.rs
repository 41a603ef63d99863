//! The policy plane (features sheet §11): fetch the sandbox's policy from the gateway at start,
//! poll for new revisions, apply each one at the next exec, and report LOADED or FAILED.
//!
//! - GetSandboxConfig is called by path with [`RawCodec`], so the answer reaches
//!   `policy::openshell::decode_config_response` as bytes: a generated prost client would drop
//!   unknown fields (a newer gateway's restriction) silently, which fails open.
//! - Every exec spawns through [`PolicySlot`]. A new revision builds a new [`Sandbox`] and
//!   swaps it in; execs already running keep the one they started under.
//! - What a live sandbox may change is §11.7's rule (`check_live_change`), the same function
//!   the test gateway enforces. We go further than OpenShell: an allowed change (a path
//!   gained) is applied at the next exec instead of after a restart.
//! - A revision that cannot be applied is reported FAILED with the reason, and
//!   `policy_validation_failure_mode` decides: `fail_closed` refuses every exec until a valid
//!   revision arrives; `retain_last_valid` keeps the last sandbox that was built.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes};
use http::uri::PathAndQuery;
use prost::Message;
use tokio::sync::{mpsc, watch};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

use super::auth::{self, Bearer, TokenError, TokenStore};
use super::channel::{self, ConnectError};
use super::config::GatewayConfig;
use crate::exec::{Child, ExitInfo, RunError, Sandbox, SpawnSpec};
use crate::policy::PolicyFlags;
use crate::policy::openshell::{
    self, ConfigResponse, FailureMode, Host, LocalPolicyError, NetworkOutcome, PolicySourceKind,
    ProtoError, SandboxPolicy,
};
use crate::proto::sandbox::v1::GetSandboxConfigRequest;
use crate::proto::v1::{PolicyStatus, ReportPolicyStatusRequest, UpdateConfigRequest};

use super::logpush::ocsf;

/// The gRPC path of GetSandboxConfig (not declared in our proto on purpose, see above).
pub const GET_SANDBOX_CONFIG: &str = "/openshell.v1.OpenShell/GetSandboxConfig";

/// Poll interval when `OPENSHELL_POLICY_POLL_INTERVAL_SECS` is unset (§11.7).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(10);

/// Startup fetch: 5 attempts, with these sleeps between them (§11.1).
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

/// Codes worth retrying (§11.1 for GetSandboxConfig, §11.8 for reports).
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
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error(transparent)]
    Token(#[from] TokenError),
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

/// What every exec spawns through: the sandbox of the current revision, or a quarantine.
pub struct PolicySlot {
    active: RwLock<Active>,
    /// Start time, program and enforced layers of each running exec, for its end record.
    running: Mutex<std::collections::HashMap<u32, Started>>,
}

#[derive(Clone)]
enum Active {
    Ready(Sandbox),
    /// `fail_closed` after a revision that cannot be applied: every exec is refused.
    Quarantined(String),
}

struct Started {
    at: Instant,
    program: String,
    layers: String,
    limits: crate::policy::Limits,
}

/// Why an exec was not started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error(
        "the sandbox policy is quarantined (policy_validation_failure_mode fail_closed): {0}"
    )]
    Quarantined(String),
    #[error(transparent)]
    Run(#[from] RunError),
}

impl SpawnError {
    /// As [`RunError::exit_code`]; a quarantine is the sandbox refusing (125).
    pub fn exit_code(&self) -> u8 {
        match self {
            SpawnError::Quarantined(_) => 125,
            SpawnError::Run(e) => e.exit_code(),
        }
    }
}

impl PolicySlot {
    pub fn new(sandbox: Sandbox) -> Arc<Self> {
        Self::with(Active::Ready(sandbox))
    }

    fn with(a: Active) -> Arc<Self> {
        Arc::new(PolicySlot {
            active: RwLock::new(a),
            running: Mutex::new(Default::default()),
        })
    }

    fn get(&self) -> Active {
        self.active.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, a: Active) {
        *self.active.write().unwrap_or_else(|p| p.into_inner()) = a;
    }

    fn has_sandbox(&self) -> bool {
        matches!(self.get(), Active::Ready(_))
    }

    /// Start one command under the current revision's sandbox; one OCSF launch record.
    pub fn spawn(&self, spec: SpawnSpec) -> Result<Child, SpawnError> {
        let program = spec
            .argv
            .first()
            .map(|a| {
                Path::new(a)
                    .file_name()
                    .unwrap_or(a)
                    .to_string_lossy()
                    .into_owned()
            })
            .unwrap_or_default();
        let command = command_line(&spec.argv);
        let sandbox = match self.get() {
            Active::Ready(s) => s,
            Active::Quarantined(reason) => {
                ocsf::Event::process(ocsf::Activity::LAUNCH, ocsf::Severity::Medium)
                    .denied()
                    .subject(format!("{program}(0)"))
                    .detail("reason", format!("policy quarantined: {reason}"))
                    .emit();
                return Err(SpawnError::Quarantined(reason));
            }
        };
        let child = match sandbox.spawn(spec) {
            Ok(c) => c,
            Err(e) => {
                ocsf::Event::process(ocsf::Activity::LAUNCH, ocsf::Severity::Medium)
                    .failed()
                    .subject(format!("{program}(0)"))
                    .detail("reason", e.to_string())
                    .emit();
                return Err(e.into());
            }
        };
        let layers = layer_list(&sandbox);
        ocsf::Event::process(ocsf::Activity::LAUNCH, ocsf::Severity::Informational)
            .subject(format!("{program}({})", child.pid()))
            .detail("cmd", command)
            .detail("layers", layers.clone())
            .emit();
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                child.pid(),
                Started {
                    at: Instant::now(),
                    program,
                    layers,
                    limits: sandbox.policy().limits.clone(),
                },
            );
        Ok(child)
    }

    /// The exec's end record, carrying its exit report. `info` is `None` when the client went
    /// away and the tree was killed; `bytes` are stdout and stderr as forwarded.
    pub fn exec_ended(&self, child: &Child, info: Option<&ExitInfo>, bytes: (u64, u64)) {
        let Some(st) = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&child.pid())
        else {
            return;
        };
        let wall_ms = st.at.elapsed().as_millis() as u64;
        let subject = format!("{}({})", st.program, child.pid());
        let Some(info) = info else {
            ocsf::Event::process(ocsf::Activity::TERMINATE, ocsf::Severity::Low)
                .subject(subject)
                .detail("reason", "channel_closed: the client went away, tree killed".into())
                .detail("wall_ms", wall_ms.to_string())
                .detail("layers", st.layers)
                .emit();
            return;
        };
        use crate::exec::report::{Context, classify};
        use crate::exec::stream::StreamStats;
        let stats = |b| StreamStats {
            bytes: b,
            forwarded: b,
            ..Default::default()
        };
        let cx = Context {
            timed_out: false,
            cpu_limit_secs: st.limits.cpu_secs,
            memory_limit_bytes: st.limits.memory_bytes,
            cgroup_memory_hit: child.hit_memory_limit(),
        };
        let reason = classify(info, &cx, &stats(bytes.0), &stats(bytes.1));
        let limit_hit = matches!(
            reason,
            crate::exec::report::Reason::CpuLimit | crate::exec::report::Reason::MemoryLimit
        );
        let how = match (info.code, info.signal) {
            (Some(c), _) => format!("exit:{c}"),
            (None, Some(s)) => format!("signal:{s}"),
            (None, None) => "exit:255".into(),
        };
        let sev = if limit_hit {
            ocsf::Severity::Medium
        } else {
            ocsf::Severity::Informational
        };
        let mut ev = ocsf::Event::process(ocsf::Activity::TERMINATE, sev)
            .subject(subject)
            .tag(how)
            .detail("reason", reason.as_str().into())
            .detail("wall_ms", wall_ms.to_string())
            .detail("user_cpu_ms", info.user_cpu.as_millis().to_string())
            .detail("sys_cpu_ms", info.sys_cpu.as_millis().to_string())
            .detail("peak_rss_kib", info.max_rss_kib.to_string())
            .detail("stdout_bytes", bytes.0.to_string())
            .detail("stderr_bytes", bytes.1.to_string())
            // serve has no output cap: nothing is ever cut.
            .detail("truncated", "none".into())
            .detail("layers", st.layers);
        if limit_hit {
            ev = ev.denied();
        }
        ev.emit();
    }
}

fn command_line(argv: &[std::ffi::OsString]) -> String {
    // The command string of `sh -c CMD`, or the whole argv; bounded, one line.
    let s = match argv {
        [_, flag, cmd] if flag == "-c" || flag == "-lc" => cmd.to_string_lossy().into_owned(),
        _ => argv
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" "),
    };
    let mut s: String = s.chars().map(|c| if c == '\n' { ' ' } else { c }).collect();
    if s.len() > 256 {
        let mut cut = 256;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

fn layer_list(s: &Sandbox) -> String {
    use crate::sandbox::Enforcement;
    s.layers()
        .iter()
        .map(|l| {
            let st = match l.status {
                Enforcement::Enforced => "enforced",
                Enforcement::Degraded => "degraded",
                Enforcement::NotRequested => "not_requested",
            };
            format!("{}={st}", l.layer)
        })
        .collect::<Vec<_>>()
        .join(",")
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
    /// Where the local fallback looks, in order (§11.5 step 2).
    pub local_paths: Vec<PathBuf>,
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
/// both; for tests and images that keep the policy elsewhere), else §11.5's two.
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
    /// The last policy the gateway delivered that decoded: what §11.7 compares against.
    baseline: Option<SandboxPolicy>,
    /// `(config_revision, policy_hash)` of the last answer acted on (§11.7 change detection).
    seen: Option<(u64, String)>,
    version: u32,
    /// The workspace from GetSandboxConfig, kept for UpdateConfig.
    workspace: String,
}

pub struct Plane {
    cfg: PlaneConfig,
    channel: Channel,
    slot: Arc<PolicySlot>,
    reports: mpsc::UnboundedSender<Report>,
    tracked: tokio::sync::Mutex<Tracked>,
}

impl Plane {
    /// The startup sequence of §11.5: fetch (with retry), fall back to a local policy when
    /// the gateway has none and sync it back, apply, report. Returns the plane, whose
    /// [`PolicySlot`] every exec spawns through. Errors are fatal: the supervisor exits.
    pub async fn start(cfg: PlaneConfig) -> Result<Arc<Plane>, PlaneError> {
        let channel = channel::connect(&cfg.gateway).await?;
        auth::ensure_token(&cfg.tokens, &channel).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let plane = Arc::new(Plane {
            channel,
            slot: PolicySlot::with(Active::Quarantined("no policy loaded yet".into())),
            reports: tx,
            tracked: tokio::sync::Mutex::new(Tracked::default()),
            cfg,
        });
        tokio::spawn(report_loop(plane.clone(), rx));
        let raw = plane.fetch_with_retry().await?;
        let mut resp = openshell::decode_config_response(&raw)?;
        resp = plane.sync_if_needed(resp).await?;
        plane.handle(resp).await;
        Ok(plane)
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
            self.channel.clone(),
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

    /// §11.5 steps 2 and 3: no policy means the local fallback, enriched, synced back; a
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
        let mut client = channel::client(self.channel.clone(), &self.cfg.tokens);
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
    /// FAILED for sandbox-sourced revisions (§11.8).
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
            let network = r.network.clone();
            for w in &r.warnings {
                tracing::warn!(version, "policy: {w}");
            }
            tokio::task::block_in_place(|| Sandbox::new(r.policy))
                .map(|s| (s, network))
                .map_err(|e| e.to_string())
        });
        match built {
            Ok((sandbox, network)) => {
                self.slot.set(Active::Ready(sandbox));
                let (status, err) = match network {
                    NetworkOutcome::Enforced => (PolicyStatus::Loaded, String::new()),
                    NetworkOutcome::EgressDenied { rule_keys } => (
                        PolicyStatus::Failed,
                        openshell::MapError::NetworkRules(rule_keys).to_string(),
                    ),
                };
                ocsf::Event::config(ocsf::Severity::Informational, "LOADED")
                    .subject(format!("policy version {version}"))
                    .detail("applies", "at the next exec".into())
                    .emit();
                if status == PolicyStatus::Failed {
                    tracing::warn!(version, "policy applied with all egress denied: {err}");
                }
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

    /// One poll: keep the current policy on any failure to reach the gateway (§11.7).
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
        {
            let mut t = self.tracked.lock().await;
            let key = (resp.config_revision, resp.policy_hash.clone());
            if t.seen.as_ref() == Some(&key) {
                // The same policy under a newer revision number: acknowledge it (§11.8).
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

    /// Poll every interval until `stop`; the first poll runs at once (§11.7).
    pub async fn poll_loop(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.cfg.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = super::ssh::stopped(&mut stop) => return,
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

/// Deliver reports in order; retryable errors after 1, 2, 4 ... 32 s, others drop the report
/// (§11.8).
async fn report_loop(plane: Arc<Plane>, mut rx: mpsc::UnboundedReceiver<Report>) {
    let mut client = channel::client(plane.channel.clone(), &plane.cfg.tokens);
    while let Some(r) = rx.recv().await {
        let mut delay = Duration::from_secs(1);
        loop {
            let req = ReportPolicyStatusRequest {
                sandbox_id: plane.cfg.gateway.sandbox_id.clone(),
                version: r.version,
                status: r.status as i32,
                load_error: r.load_error.clone(),
            };
            let res = tokio::time::timeout(CALL_TIMEOUT, client.report_policy_status(req))
                .await
                .unwrap_or_else(|_| Err(Status::deadline_exceeded("timed out")));
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
