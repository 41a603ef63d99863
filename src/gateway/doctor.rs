//! `openshell-sandbox check --gateway`: walk the supervisor's dial-back path one step at a time
//! and name the first step that fails, with its fix.
//!
//! It reads exactly what `serve` reads (the same `ServeArgs`, so every flag and env var of the
//! pod), and goes: configuration and endpoint, DNS, TCP, TLS (files, handshake, and the
//! gateway's verdict on our client certificate), the token (source, exchange, claims), `Health`,
//! then `GetSandboxConfig` with the bearer. The main process the pod would start is checked on
//! the side, because a main process that ends at once ends the sandbox whatever the gateway
//! does.
//!
//! It never calls ConnectSupervisor: the gateway lets one session live per sandbox, so a second
//! hello would replace the running supervisor's session (protocol sheet §2.1). Everything it
//! calls is read-only; the service-account exchange only mints a token, as every supervisor
//! start does. It writes no file and signals no process.

use std::ffi::OsString;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use clap::Parser;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::Code;
use tonic::transport::Channel;

use super::auth::{self, TokenError, TokenStore};
use super::channel;
use super::config::{ALLOW_PLAINTEXT_TOKEN, ConfigError, GatewayConfig, ServeArgs, TokenSource};
use super::main_process::MainProcess;
use super::ssh::command::DEFAULT_PATH;
use super::tls::{self, TlsError};
use crate::proto::sandbox::v1::{GetSandboxConfigRequest, GetSandboxConfigResponse};
use crate::proto::v1::{HealthRequest, ServiceStatus, open_shell_client::OpenShellClient};

/// The method path of the read-only, authenticated probe (features sheet §11.1).
const GET_SANDBOX_CONFIG: &str = "/openshell.v1.OpenShell/GetSandboxConfig";

/// `openshell-sandbox check --gateway [--json] [SERVE FLAGS...]`
#[derive(Debug, Parser)]
#[command(
    name = "openshell-sandbox check --gateway",
    about = "Walk the dial-back path to the gateway with the pod's env and flags, and name the first failing step"
)]
pub struct DoctorArgs {
    /// Check the path to the gateway (this mode).
    #[arg(long)]
    pub gateway: bool,

    /// Print the steps as JSON.
    #[arg(long)]
    pub json: bool,

    /// Seconds each network step may take.
    #[arg(long = "step-timeout", value_name = "SECS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=300))]
    pub step_timeout: u64,

    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Failed,
    /// Not run, because an earlier step on the path failed (or it does not apply).
    Skipped,
}

/// One step's outcome. `kind` names the cause in a stable, machine-readable word.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub step: &'static str,
    pub status: Status,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Step {
    fn ok(step: &'static str, detail: impl Into<String>) -> Step {
        Step {
            step,
            status: Status::Ok,
            detail: detail.into(),
            kind: None,
            fix: None,
        }
    }

    fn failed(
        step: &'static str,
        kind: &'static str,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Step {
        Step {
            step,
            status: Status::Failed,
            detail: detail.into(),
            kind: Some(kind),
            fix: Some(fix.into()),
        }
    }

    fn skipped(step: &'static str, detail: impl Into<String>) -> Step {
        Step {
            step,
            status: Status::Skipped,
            detail: detail.into(),
            kind: None,
            fix: None,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub ok: bool,
    /// The first failed step, if any.
    pub first_failure: Option<&'static str>,
    pub steps: Vec<Step>,
}

#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    #[error("starting the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("encoding the report as JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// The dial-back steps, in the order the supervisor takes them.
const PATH_STEPS: [&str; 7] = [
    "endpoint", "dns", "tcp", "tls", "token", "health", "config",
];

/// Entry point; `argv[0]` is `check`.
pub fn main(argv: &[OsString]) -> Result<ExitCode, DoctorError> {
    super::unset_empty_identity_env();
    let args = DoctorArgs::parse_from(argv);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(DoctorError::Runtime)?;
    let json = args.json;
    let report = rt.block_on(run(args));
    print(&report, json)?;
    Ok(if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn print(report: &Report, json: bool) -> Result<(), DoctorError> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        for s in &report.steps {
            println!("{}", line(s));
        }
        match report.first_failure {
            None => println!("gateway: every step passed"),
            Some(f) => println!("gateway: first failing step: {f}"),
        }
    }
    Ok(())
}

/// One human line: `step      ok: detail` or `step      FAILED: detail; fix: ...`.
pub fn line(s: &Step) -> String {
    match s.status {
        Status::Ok => format!("{:<13} ok: {}", s.step, s.detail),
        Status::Skipped => format!("{:<13} skipped: {}", s.step, s.detail),
        Status::Failed => format!(
            "{:<11} FAILED: {} [{}]; fix: {}",
            s.step,
            s.detail,
            s.kind.unwrap_or("failed"),
            s.fix.as_deref().unwrap_or("")
        ),
    }
}

/// Walk every step and build the report.
pub async fn run(args: DoctorArgs) -> Report {
    let timeout = Duration::from_secs(args.step_timeout);
    let mut serve = args.serve;
    let (cfg, early) = resolve(&mut serve);
    let mut steps = Vec::new();
    let main_step = main_process_step(&serve, early.main.clone());
    match cfg {
        Err(step) => {
            let name = step.step;
            steps.push(step);
            skip_after(&mut steps, name);
        }
        Ok(cfg) => {
            let mut walk = Walk {
                cfg,
                early,
                timeout,
                steps: Vec::new(),
                channel: None,
                token: None,
            };
            walk.go().await;
            steps = walk.steps;
        }
    }
    steps.push(main_step);
    let first_failure = steps
        .iter()
        .find(|s| s.status == Status::Failed)
        .map(|s| s.step);
    Report {
        ok: first_failure.is_none(),
        first_failure,
        steps,
    }
}

fn skip_after(steps: &mut Vec<Step>, failed: &str) {
    let after = PATH_STEPS.iter().position(|s| *s == failed).unwrap_or(0) + 1;
    for s in &PATH_STEPS[after..] {
        steps.push(Step::skipped(s, format!("the {failed} step failed")));
    }
}

/// Problems `ServeArgs::resolve` stops at that belong to a later step: they are taken out, the
/// configuration is resolved again, and the step reports them in its turn, so the steps before
/// it still run.
#[derive(Default)]
struct Early {
    tls: Option<Step>,
    token: Option<Step>,
    main: Option<Step>,
}

fn resolve(serve: &mut ServeArgs) -> (Result<GatewayConfig, Step>, Early) {
    let mut early = Early::default();
    // Each pass removes one cause; four causes at most, so this ends.
    for _ in 0..5 {
        match serve.resolve() {
            Ok(cfg) => {
                let gw = cfg.gateway.ok_or_else(|| {
                    Step::failed(
                        "endpoint",
                        "endpoint-missing",
                        "OPENSHELL_ENDPOINT (and OPENSHELL_GATEWAY_ENDPOINT, --endpoint) is not set: serve runs the main process only and never dials the gateway, so the sandbox never becomes READY",
                        "set OPENSHELL_ENDPOINT to the gateway Service URL, e.g. https://openshell.openshell.svc.cluster.local:8080 (the gateway's OPENSHELL_GRPC_ENDPOINT)",
                    )
                });
                return (gw, early);
            }
            Err(ConfigError::PlaintextToken(var, ep)) => {
                early.token = Some(Step::failed(
                    "token",
                    "plaintext-token",
                    format!("serve refuses to send the bearer token ({var}) over the plaintext endpoint {ep}"),
                    format!("use an https:// endpoint with the client TLS Secret mounted; only in a test setup set {ALLOW_PLAINTEXT_TOKEN}=1"),
                ));
                serve.allow_plaintext_token = Some("1".into());
            }
            Err(ConfigError::EmptyToken) => {
                early.token = Some(Step::failed(
                    "token",
                    "token-empty",
                    "OPENSHELL_SANDBOX_TOKEN is set but empty",
                    "unset OPENSHELL_SANDBOX_TOKEN, or give it the gateway JWT",
                ));
                serve.sandbox_token = None;
            }
            Err(ConfigError::BadServerName(name)) => {
                early.tls = Some(Step::failed(
                    "tls",
                    "bad-server-name",
                    format!("OPENSHELL_GATEWAY_TLS_SERVER_NAME `{name}` is not a DNS name or IP address"),
                    "set it to a name in the gateway certificate's subjectAltName, or unset it to use the endpoint host",
                ));
                serve.tls_server_name = None;
            }
            Err(e @ ConfigError::MainProcess(_)) => {
                early.main = Some(Step::failed(
                    "main-process",
                    "main-process-spec",
                    format!("{e}: serve exits 2 at start, before dialing"),
                    "fix the sandbox spec's command (OPENSHELL_MAIN_PROCESS_SPEC must be {\"version\":1,\"command\":[...],\"tty\":bool})",
                ));
                serve.command.clear();
                serve.main_process_spec = None;
                serve.sandbox_command = None;
            }
            Err(e) => return (Err(config_failure(e)), early),
        }
    }
    unreachable_config()
}

fn unreachable_config() -> (Result<GatewayConfig, Step>, Early) {
    (
        Err(Step::failed(
            "endpoint",
            "config",
            "the configuration could not be resolved",
            "run `openshell-sandbox serve` with the same env to see the error",
        )),
        Early::default(),
    )
}

fn config_failure(e: ConfigError) -> Step {
    match e {
        ConfigError::MissingSandboxId => Step::failed(
            "endpoint",
            "sandbox-id-missing",
            e.to_string(),
            "the pod's OPENSHELL_SANDBOX_ID comes from the gateway's driver; set it to the sandbox's UUID",
        ),
        ConfigError::BadEndpoint { .. } => Step::failed(
            "endpoint",
            "endpoint-invalid",
            e.to_string(),
            "OPENSHELL_ENDPOINT must be https://HOST:PORT (mTLS) or http://HOST:PORT (plaintext), no path",
        ),
        ConfigError::NothingToDo => Step::failed(
            "endpoint",
            "endpoint-missing",
            e.to_string(),
            "set OPENSHELL_ENDPOINT to the gateway Service URL, e.g. https://openshell.openshell.svc.cluster.local:8080",
        ),
        other => Step::failed(
            "endpoint",
            "config",
            other.to_string(),
            "fix the flag or variable named",
        ),
    }
}

/// The canonical main process serve would start: a spec it cannot parse, or a program that is
/// not there, ends the sandbox at once (the gateway marks it ERROR, `MainProcessExited`).
fn main_process_step(serve: &ServeArgs, early: Option<Step>) -> Step {
    if let Some(s) = early {
        return s;
    }
    let main = match MainProcess::from_sources(
        &serve.command,
        serve.main_process_spec.as_deref(),
        serve.sandbox_command.as_deref(),
    ) {
        Ok(m) => m,
        Err(e) => {
            return Step::failed(
                "main-process",
                "main-process-spec",
                e.to_string(),
                "fix the sandbox spec's command",
            );
        }
    };
    let Some(main) = main else {
        return Step::ok(
            "main-process",
            "none configured (no OPENSHELL_MAIN_PROCESS_SPEC, OPENSHELL_SANDBOX_COMMAND or command words)",
        );
    };
    let argv: Vec<String> = main
        .argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let prog = &argv[0];
    let path = std::env::var("PATH")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| DEFAULT_PATH.into());
    let shown = format!("{argv:?} (tty {})", main.tty);
    match find_program(prog, &path) {
        Ok(p) => Step::ok("main-process", format!("{shown}: {}", p.display())),
        Err(why) => Step::failed(
            "main-process",
            "main-process-not-runnable",
            format!(
                "{shown}: `{prog}` {why}: the main process cannot start, so the supervisor exits at once and the sandbox never becomes READY (or, once READY, is marked ERROR: MainProcessExited)"
            ),
            "give the sandbox a command that exists in the image and keeps running (exit 0 is terminal too), e.g. `sleep infinity`",
        ),
    }
}

/// Where `prog` resolves: a path is taken as is, a bare name searched in `path`.
fn find_program(prog: &str, path: &str) -> Result<PathBuf, &'static str> {
    let candidates: Vec<PathBuf> = if prog.contains('/') {
        vec![PathBuf::from(prog)]
    } else {
        path.split(':')
            .filter(|d| !d.is_empty())
            .map(|d| Path::new(d).join(prog))
            .collect()
    };
    let mut found_not_exec = false;
    for c in candidates {
        let Ok(meta) = std::fs::metadata(&c) else {
            continue;
        };
        use std::os::unix::fs::PermissionsExt;
        if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
            return Ok(c);
        }
        found_not_exec = true;
    }
    Err(if found_not_exec {
        "is not an executable file"
    } else if prog.contains('/') {
        "does not exist"
    } else {
        "is not found on PATH"
    })
}

struct Walk {
    cfg: GatewayConfig,
    early: Early,
    timeout: Duration,
    steps: Vec<Step>,
    channel: Option<Channel>,
    token: Option<String>,
}

impl Walk {
    async fn go(&mut self) {
        let scheme = if self.cfg.tls.is_some() {
            "mTLS"
        } else {
            "plaintext h2c"
        };
        self.steps.push(Step::ok(
            "endpoint",
            format!(
                "{} ({scheme}), sandbox {}",
                self.cfg.endpoint, self.cfg.sandbox_id
            ),
        ));
        let addrs = match self.dns().await {
            Ok(a) => a,
            Err(s) => return self.fail(s),
        };
        let tcp = match self.tcp(&addrs).await {
            Ok(t) => t,
            Err(s) => return self.fail(s),
        };
        if let Err(s) = self.tls(tcp).await {
            return self.fail(s);
        }
        match self.token().await {
            Ok(s) => self.steps.push(s),
            Err(s) => return self.fail(s),
        }
        match self.health().await {
            Ok(s) => self.steps.push(s),
            Err(s) => return self.fail(s),
        }
        match self.config().await {
            Ok(s) => self.steps.push(s),
            Err(s) => self.fail(s),
        }
    }

    fn fail(&mut self, s: Step) {
        let name = s.step;
        self.steps.push(s);
        skip_after(&mut self.steps, name);
    }

    async fn dns(&mut self) -> Result<Vec<SocketAddr>, Step> {
        let (host, port) = (self.cfg.host.clone(), self.cfg.port);
        if let Ok(ip) = host.parse::<IpAddr>() {
            self.steps
                .push(Step::ok("dns", format!("{ip} is an address; no lookup")));
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let fix = format!(
            "check the Service name and namespace in OPENSHELL_ENDPOINT (`kubectl -n NAMESPACE get svc`; the form is SERVICE.NAMESPACE.svc.cluster.local) and the pod's DNS (/etc/resolv.conf, `kubectl -n kube-system get pods -l k8s-app=kube-dns`)"
        );
        let addrs: Vec<SocketAddr> = match tokio::time::timeout(
            self.timeout,
            tokio::net::lookup_host((host.as_str(), port)),
        )
        .await
        {
            Err(_) => {
                return Err(Step::failed(
                    "dns",
                    "dns-timeout",
                    format!("resolving `{host}` took over {:?}", self.timeout),
                    fix,
                ));
            }
            Ok(Err(e)) => {
                return Err(Step::failed(
                    "dns",
                    "dns-failed",
                    format!("`{host}` does not resolve: {e}"),
                    fix,
                ));
            }
            Ok(Ok(a)) => a.collect(),
        };
        if addrs.is_empty() {
            return Err(Step::failed(
                "dns",
                "dns-failed",
                format!("`{host}` resolves to no address"),
                fix,
            ));
        }
        let list: Vec<String> = addrs.iter().map(|a| a.ip().to_string()).collect();
        self.steps
            .push(Step::ok("dns", format!("{host} -> {}", list.join(", "))));
        Ok(addrs)
    }

    async fn tcp(&mut self, addrs: &[SocketAddr]) -> Result<TcpStream, Step> {
        let mut errors = Vec::new();
        let mut refused = false;
        for a in addrs {
            match tokio::time::timeout(self.timeout, TcpStream::connect(a)).await {
                Ok(Ok(s)) => {
                    self.steps.push(Step::ok("tcp", format!("connected to {a}")));
                    return Ok(s);
                }
                Ok(Err(e)) => {
                    refused |= e.kind() == std::io::ErrorKind::ConnectionRefused;
                    errors.push(format!("{a}: {e}"));
                }
                Err(_) => errors.push(format!("{a}: no answer within {:?}", self.timeout)),
            }
        }
        let detail = errors.join("; ");
        Err(if refused {
            Step::failed(
                "tcp",
                "connection-refused",
                detail,
                "nothing listens there: is the gateway pod running and Ready, and is the port the Service's gRPC port (8080)? `kubectl -n NAMESPACE get pods,endpoints`",
            )
        } else {
            Step::failed(
                "tcp",
                "connect-failed",
                detail,
                "the address does not answer: a NetworkPolicy or firewall between the sandbox namespace and the gateway drops the traffic, or the Service has no endpoints",
            )
        })
    }

    async fn tls(&mut self, tcp: TcpStream) -> Result<(), Step> {
        if let Some(s) = self.early.tls.take() {
            return Err(s);
        }
        let Some(paths) = self.cfg.tls.clone() else {
            self.steps.push(Step::ok(
                "tls",
                "plaintext endpoint (http://): no TLS, and the gateway cannot tell this sandbox by its certificate",
            ));
            return Ok(());
        };
        let setup = tls::load(&paths, &self.cfg.host).map_err(tls_file_failure)?;
        let name = setup.server_name.to_str().into_owned();
        let mut stream = match tokio::time::timeout(
            self.timeout,
            setup.connector.connect(setup.server_name.clone(), tcp),
        )
        .await
        {
            Err(_) => {
                return Err(Step::failed(
                    "tls",
                    "tls-timeout",
                    format!("no TLS handshake within {:?}", self.timeout),
                    "the port may not speak TLS; for a plaintext gateway use http://",
                ));
            }
            Ok(Err(e)) => return Err(handshake_failure(&e, &name, &paths.ca)),
            Ok(Ok(s)) => s,
        };
        if stream.get_ref().1.alpn_protocol() != Some(b"h2") {
            return Err(Step::failed(
                "tls",
                "no-h2",
                "the server did not agree to HTTP/2 (ALPN h2)",
                "the endpoint is not the gateway's gRPC port, or a proxy in between terminates TLS",
            ));
        }
        // In TLS 1.3 the server checks our certificate after our side of the handshake is
        // done, so its refusal arrives as an alert on the first read. Send the HTTP/2 preface
        // and an empty SETTINGS frame; a gateway that accepted us answers with its SETTINGS.
        let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
        let mut buf = [0u8; 64];
        let answer = tokio::time::timeout(self.timeout, async {
            stream.write_all(preface).await?;
            stream.flush().await?;
            stream.read(&mut buf).await
        })
        .await;
        match answer {
            Ok(Ok(n)) if n > 0 => {
                let peer = stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first().map(|c| c.as_ref().to_vec()));
                let until = peer.and_then(|der| not_after(&der)).unwrap_or_default();
                self.steps.push(Step::ok(
                    "tls",
                    format!(
                        "handshake with `{name}` against {}, client certificate accepted{until}",
                        paths.ca.display()
                    ),
                ));
                Ok(())
            }
            Ok(Ok(_)) => Err(client_cert_refused(
                "the gateway closed the connection right after the handshake",
                &paths.cert,
            )),
            Ok(Err(e)) => Err(handshake_failure(&e, &name, &paths.ca)),
            Err(_) => Err(Step::failed(
                "tls",
                "no-h2-answer",
                format!("no HTTP/2 answer within {:?} after the handshake", self.timeout),
                "the endpoint is not the gateway's gRPC port",
            )),
        }
    }

    async fn channel(&mut self) -> Result<Channel, Step> {
        if let Some(c) = &self.channel {
            return Ok(c.clone());
        }
        match tokio::time::timeout(self.timeout, channel::connect(&self.cfg)).await {
            Ok(Ok(c)) => {
                self.channel = Some(c.clone());
                Ok(c)
            }
            Ok(Err(e)) => Err(Step::failed(
                "health",
                "h2-connect-failed",
                e.to_string(),
                "the TLS and TCP steps passed, so the HTTP/2 layer failed: is this the gateway's gRPC port?",
            )),
            Err(_) => Err(Step::failed(
                "health",
                "h2-connect-timeout",
                format!("no HTTP/2 connection within {:?}", self.timeout),
                "is this the gateway's gRPC port?",
            )),
        }
    }

    async fn token(&mut self) -> Result<Step, Step> {
        if let Some(s) = self.early.token.take() {
            return Err(s);
        }
        let source = self.cfg.token.clone();
        if source == TokenSource::None {
            return Ok(Step::ok(
                "token",
                "no token source: only the client certificate identifies this sandbox (enough for a v0.0.36 gateway; a v0.0.47+ gateway refuses ConnectSupervisor without one, see the config step)",
            ));
        }
        let var = source.variable();
        let store = TokenStore::new(source.clone());
        // The exchange needs a channel; the other sources read a value or a file.
        let ch = match &source {
            TokenSource::ServiceAccount(_) => Some(self.channel().await.map_err(|mut s| {
                s.step = "token";
                s
            })?),
            _ => None,
        };
        let got = match &ch {
            Some(c) => tokio::time::timeout(self.timeout, auth::ensure_token(&store, c))
                .await
                .unwrap_or_else(|_| {
                    Err(TokenError::Issue {
                        path: PathBuf::new(),
                        status: tonic::Status::deadline_exceeded("no answer"),
                    })
                }),
            None => {
                // Only the exchange uses the channel; the other sources get a lazy one that
                // is never dialed.
                let unused = Channel::from_static("http://[::1]:1").connect_lazy();
                auth::ensure_token(&store, &unused).await
            }
        };
        if let Err(e) = got {
            return Err(token_failure(e, var));
        }
        let token = store.get().unwrap_or_default();
        self.token = Some(token.clone());
        let how = match &source {
            TokenSource::ServiceAccount(p) => format!(
                "exchanged the service-account token from {} (IssueSandboxToken) for a gateway JWT",
                p.display()
            ),
            TokenSource::File(p) => format!("{var} {}", p.display()),
            _ => var.to_owned(),
        };
        let Some(claims) = jwt_claims(&token) else {
            return Ok(Step::ok(
                "token",
                format!("{how}: not a JWT; the gateway decides"),
            ));
        };
        let sub = claims
            .get("sandbox_id")
            .and_then(|v| v.as_str())
            .unwrap_or("");
        if !sub.is_empty() && sub != self.cfg.sandbox_id {
            return Err(Step::failed(
                "token",
                "token-sandbox-mismatch",
                format!(
                    "{how}: the token is for sandbox {sub}, but OPENSHELL_SANDBOX_ID is {}: the gateway refuses ConnectSupervisor with PERMISSION_DENIED",
                    self.cfg.sandbox_id
                ),
                "the token and the sandbox id must come from the same sandbox: recreate the pod from its Sandbox (the driver sets both), or fix the one set by hand",
            ));
        }
        let exp = claims.get("exp").and_then(|v| v.as_u64()).unwrap_or(0);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        // The gateway allows 60 s of clock skew (sheet §3.1).
        if exp != 0 && exp + 60 < now {
            return Err(Step::failed(
                "token",
                "token-expired",
                format!("{how}: the JWT expired {} s ago", now - exp),
                match source {
                    TokenSource::ServiceAccount(_) => "the gateway minted an expired token: check the gateway's clock and server.sandboxJwt.ttlSecs",
                    _ => "give a fresh token (the file is re-read on UNAUTHENTICATED), or use the projected service-account token (OPENSHELL_K8S_SA_TOKEN_FILE)",
                },
            ));
        }
        let life = if exp == 0 {
            "never expires".to_owned()
        } else {
            format!("expires in {} s", exp.saturating_sub(now))
        };
        Ok(Step::ok(
            "token",
            format!("{how}: JWT for sandbox {sub}, {life}"),
        ))
    }

    async fn health(&mut self) -> Result<Step, Step> {
        let ch = self.channel().await?;
        // Health is unauthenticated: no bearer.
        let mut client = OpenShellClient::new(ch);
        match tokio::time::timeout(self.timeout, client.health(HealthRequest {})).await {
            Err(_) => Err(Step::failed(
                "health",
                "health-timeout",
                format!("no Health answer within {:?}", self.timeout),
                "the gateway is overloaded or stuck: `kubectl -n NAMESPACE logs deploy/openshell` (or the StatefulSet)",
            )),
            Ok(Err(status)) => Err(status_failure("health", "Health", &status, self)),
            Ok(Ok(r)) => {
                let r = r.into_inner();
                let st = ServiceStatus::try_from(r.status).unwrap_or(ServiceStatus::Unspecified);
                if st == ServiceStatus::Healthy {
                    Ok(Step::ok("health", format!("HEALTHY, version {}", r.version)))
                } else {
                    Err(Step::failed(
                        "health",
                        "gateway-unhealthy",
                        format!("the gateway says {}", st.as_str_name()),
                        "look at the gateway's logs and its database volume",
                    ))
                }
            }
        }
    }

    async fn config(&mut self) -> Result<Step, Step> {
        let ch = self.channel().await?;
        let mut grpc = tonic::client::Grpc::new(ch);
        let mut req = tonic::Request::new(GetSandboxConfigRequest {
            sandbox_id: self.cfg.sandbox_id.clone(),
        });
        if let Some(t) = &self.token {
            match tonic::metadata::MetadataValue::try_from(format!("Bearer {t}")) {
                Ok(mut v) => {
                    v.set_sensitive(true);
                    req.metadata_mut().insert("authorization", v);
                }
                Err(_) => {
                    return Err(Step::failed(
                        "config",
                        "token-not-header",
                        "the token holds characters an HTTP header cannot carry",
                        "the token file must hold only the JWT",
                    ));
                }
            }
        }
        let call = async {
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::unavailable(channel::chain(&e)))?;
            grpc.unary::<_, GetSandboxConfigResponse, _>(
                req,
                http::uri::PathAndQuery::from_static(GET_SANDBOX_CONFIG),
                tonic_prost::ProstCodec::default(),
            )
            .await
        };
        match tokio::time::timeout(self.timeout, call).await {
            Err(_) => Err(Step::failed(
                "config",
                "config-timeout",
                format!("no GetSandboxConfig answer within {:?}", self.timeout),
                "the gateway is overloaded or stuck: look at its logs",
            )),
            Ok(Err(status)) => Err(status_failure("config", "GetSandboxConfig", &status, self)),
            Ok(Ok(r)) => {
                let r = r.into_inner();
                let policy = if r.policy.is_some() {
                    format!("policy version {}", r.version)
                } else {
                    "no policy configured".to_owned()
                };
                Ok(Step::ok(
                    "config",
                    format!("GetSandboxConfig as sandbox {}: {policy}", self.cfg.sandbox_id),
                ))
            }
        }
    }
}

fn tls_file_failure(e: TlsError) -> Step {
    let secret = "the client TLS Secret (openshell-client-tls: ca.crt, tls.crt, tls.key) must be in the sandbox namespace and mounted at /etc/openshell-tls/client: `kubectl -n NAMESPACE get secret openshell-client-tls`; rerun the cert Job to reissue it";
    let kind = match &e {
        TlsError::Read { .. } => "unreadable-file",
        TlsError::Empty { .. } => "not-pem",
        TlsError::BadCa { .. } => "bad-ca-file",
        TlsError::BadCert { .. } => "bad-client-cert",
        TlsError::CertNotValidNow { when, .. } if when.contains("expired") => {
            "client-cert-expired"
        }
        TlsError::CertNotValidNow { .. } => "client-cert-not-yet-valid",
        TlsError::CertKey { .. } => "cert-key-mismatch",
        TlsError::ServerName(_) => "bad-server-name",
    };
    let fix = match kind {
        "client-cert-expired" => format!("the client certificate must be reissued: {secret}"),
        "client-cert-not-yet-valid" => {
            "this node's clock is behind the certificate's start: fix the clock (NTP), or reissue the certificate".to_owned()
        }
        "cert-key-mismatch" => format!("tls.crt and tls.key must be one pair: {secret}"),
        "bad-server-name" => {
            "set OPENSHELL_GATEWAY_TLS_SERVER_NAME to a name in the gateway certificate".to_owned()
        }
        _ => secret.to_owned(),
    };
    Step::failed("tls", kind, e.to_string(), fix)
}

/// Name a failed handshake by the rustls error inside the I/O error.
fn handshake_failure(e: &std::io::Error, name: &str, ca: &Path) -> Step {
    use rustls::CertificateError as C;
    let inner = e
        .get_ref()
        .and_then(|i| i.downcast_ref::<rustls::Error>())
        .cloned();
    match inner {
        Some(rustls::Error::InvalidCertificate(c)) => match c {
            C::UnknownIssuer | C::BadSignature => Step::failed(
                "tls",
                "wrong-ca",
                format!(
                    "the gateway's certificate is not signed by the CA in {} (OPENSHELL_TLS_CA): {c:?}",
                    ca.display()
                ),
                "ca.crt of the client Secret must be the CA that signed the gateway's server certificate: copy the Secret again from the gateway's namespace, or rerun the cert Job so both are from one CA",
            ),
            C::NotValidForName | C::NotValidForNameContext { .. } => Step::failed(
                "tls",
                "wrong-server-name",
                format!("the gateway's certificate does not carry the name `{name}`: {c:?}"),
                "dial the Service by a name the certificate lists (the cert Job's SANs), or set OPENSHELL_GATEWAY_TLS_SERVER_NAME to one of them",
            ),
            C::Expired | C::ExpiredContext { .. } => Step::failed(
                "tls",
                "server-cert-expired",
                format!("the gateway's certificate has expired: {c:?}"),
                "reissue the gateway's server certificate (rerun the cert Job) and restart the gateway",
            ),
            C::NotValidYet | C::NotValidYetContext { .. } => Step::failed(
                "tls",
                "server-cert-not-yet-valid",
                format!("the gateway's certificate is not valid yet: {c:?}"),
                "this node's clock is behind: fix the clock (NTP)",
            ),
            other => Step::failed(
                "tls",
                "server-cert-invalid",
                format!("the gateway's certificate was refused: {other:?}"),
                "reissue the gateway's server certificate with the cert Job",
            ),
        },
        Some(rustls::Error::AlertReceived(alert)) => {
            client_cert_refused(&format!("the gateway sent the TLS alert {alert:?}"), Path::new(""))
        }
        Some(other) => Step::failed(
            "tls",
            "tls-failed",
            format!("TLS handshake with `{name}` failed: {other}"),
            "if the gateway runs without TLS, use an http:// endpoint",
        ),
        None => Step::failed(
            "tls",
            "tls-failed",
            format!("TLS handshake with `{name}` failed: {e}"),
            "the peer closed or does not speak TLS; if the gateway runs without TLS, use an http:// endpoint",
        ),
    }
}

fn client_cert_refused(what: &str, cert: &Path) -> Step {
    let file = if cert.as_os_str().is_empty() {
        String::new()
    } else {
        format!(" ({})", cert.display())
    };
    Step::failed(
        "tls",
        "client-cert-refused",
        format!("{what}: it refused our client certificate{file}"),
        "tls.crt must be signed by the CA the gateway trusts for clients (its OPENSHELL_TLS_CLIENT_CA), with clientAuth usage, and be in date: rerun the cert Job and copy openshell-client-tls into the sandbox namespace",
    )
}

/// The `notAfter` of a DER certificate, for the ok line.
fn not_after(der: &[u8]) -> Option<String> {
    let (_, c) = x509_parser::parse_x509_certificate(der).ok()?;
    Some(format!(
        "; the gateway's certificate is valid until {}",
        c.validity().not_after
    ))
}

fn token_failure(e: TokenError, var: &'static str) -> Step {
    let (kind, fix) = match &e {
        TokenError::Read { .. } => (
            "token-file-unreadable",
            format!(
                "the file named by {var} must exist and be readable; for the service-account token, the pod needs the projected volume openshell-sa-token at /var/run/secrets/openshell (audience openshell-gateway)"
            ),
        ),
        TokenError::Empty { .. } => ("token-file-empty", format!("{var} must hold the token")),
        TokenError::Issue { status, .. } => (
            "token-exchange-failed",
            match status.code() {
                Code::Unauthenticated | Code::PermissionDenied => "the gateway refused the service-account token: it needs audience openshell-gateway, a pod annotated openshell.io/sandbox-id and owned by a Sandbox labelled openshell.ai/sandbox-id, and the gateway's RBAC for TokenReview".to_owned(),
                Code::Unavailable => "the gateway issues tokens only with a JWT issuer configured and when it runs in-cluster (KUBERNETES_SERVICE_HOST)".to_owned(),
                Code::NotFound => "the gateway does not know this sandbox: it may have been deleted".to_owned(),
                _ => "look at the gateway's log for IssueSandboxToken".to_owned(),
            },
        ),
        TokenError::EmptyIssued => (
            "token-exchange-empty",
            "the gateway answered IssueSandboxToken with an empty token: look at its log".to_owned(),
        ),
        TokenError::NotAHeader => (
            "token-not-header",
            format!("{var} must hold only the JWT"),
        ),
    };
    Step::failed("token", kind, e.to_string(), fix)
}

/// Name a gRPC failure of `Health` or `GetSandboxConfig`.
fn status_failure(step: &'static str, method: &str, s: &tonic::Status, w: &Walk) -> Step {
    let detail = format!("{method}: {:?}: {}", s.code(), s.message());
    let no_token = w.cfg.token == TokenSource::None;
    match s.code() {
        Code::Unauthenticated if no_token => Step::failed(
            step,
            "no-token",
            format!("{detail}: this gateway wants a bearer token and none is configured; ConnectSupervisor is refused the same way, so the sandbox never becomes READY"),
            "mount the projected service-account token and set OPENSHELL_K8S_SA_TOKEN_FILE=/var/run/secrets/openshell/token (the gateway's driver does this), or OPENSHELL_SANDBOX_TOKEN_FILE",
        ),
        Code::Unauthenticated => Step::failed(
            step,
            "token-rejected",
            format!("{detail}: the gateway does not accept the token (another gateway's key, expired, or not a gateway JWT); ConnectSupervisor is refused the same way"),
            format!("give the token of this gateway: {}", match w.cfg.token {
                TokenSource::ServiceAccount(_) => "the exchange succeeded, so check that the gateway's signing key did not change between replicas",
                _ => "prefer OPENSHELL_K8S_SA_TOKEN_FILE, which is exchanged at every start",
            }),
        ),
        Code::PermissionDenied => Step::failed(
            step,
            "permission-denied",
            format!("{detail}: the gateway knows the caller but not as sandbox {}: ConnectSupervisor is refused with PERMISSION_DENIED", w.cfg.sandbox_id),
            "the token must be a sandbox token for OPENSHELL_SANDBOX_ID (not a user's token): use the service-account exchange (OPENSHELL_K8S_SA_TOKEN_FILE)",
        ),
        Code::NotFound => Step::failed(
            step,
            "sandbox-not-found",
            format!("{detail}: the gateway has no sandbox {}", w.cfg.sandbox_id),
            "OPENSHELL_SANDBOX_ID must be the UUID of an existing sandbox: `kubectl -n NAMESPACE get sandboxes`; a deleted sandbox's pod cannot come back",
        ),
        Code::Unimplemented => Step::failed(
            step,
            "not-implemented",
            format!("{detail}: the server does not implement it"),
            "the endpoint is not an OpenShell gateway of a supported version (v0.0.36 or v0.0.111)",
        ),
        Code::Unavailable => Step::failed(
            step,
            "unavailable",
            detail,
            "the connection broke or the gateway is shutting down: rerun; if it persists, read the gateway's log",
        ),
        _ => Step::failed(step, "call-failed", detail, "read the gateway's log for this call"),
    }
}

/// The claims of a JWT, read without checking the signature (only the gateway can).
fn jwt_claims(token: &str) -> Option<serde_json::Map<String, serde_json::Value>> {
    let mut parts = token.split('.');
    let (_, payload, _) = (parts.next()?, parts.next()?, parts.next()?);
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    match serde_json::from_slice(&bytes).ok()? {
        serde_json::Value::Object(m) => Some(m),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_resolve_like_the_spawn() {
        assert!(find_program("sh", DEFAULT_PATH).is_ok());
        assert_eq!(
            find_program("/nonexistent/x", DEFAULT_PATH).unwrap_err(),
            "does not exist"
        );
        assert_eq!(
            find_program("no-such-program-xyz", DEFAULT_PATH).unwrap_err(),
            "is not found on PATH"
        );
        assert_eq!(
            find_program("/etc/hostname", DEFAULT_PATH).unwrap_err(),
            "is not an executable file"
        );
    }

    #[test]
    fn skipped_steps_follow_the_failure() {
        let mut v = vec![Step::failed("tcp", "x", "d", "f")];
        skip_after(&mut v, "tcp");
        let names: Vec<_> = v.iter().map(|s| s.step).collect();
        assert_eq!(names, ["tcp", "tls", "token", "health", "config"]);
        assert!(v[1..].iter().all(|s| s.status == Status::Skipped));
    }
}
