//! `serve`: the supervisor as a sandbox pod runs it.
//!
//! The modules in layers, each using only those above it in this list (docs/architecture.md):
//! - base: `config` (flags and OpenShell's env vars, checked; the main process's spec in
//!   `main_spec`), `tls` (with its paths), `tokens` (the bearer token in memory), `backoff`
//!   (retry delays, and when a reconnect starts them over), `stop`, `ended`, `ocsf`, `identity`.
//! - rpc: `channel` (the mTLS HTTP/2 channel), `auth` (obtaining and renewing the token),
//!   `session` (ConnectSupervisor: hello, heartbeats, reconnect), `logpush` (PushSandboxLogs),
//!   `policy_plane` and `policy_slot` (GetSandboxConfig at start and every poll, applied at the
//!   next exec), `egress` (each sandbox's proxy, its revisions and its OCSF events).
//! - exec: `exec_service` (the one exec service: context, shutdown tracking, exit codes, that
//!   SSH execs, sftp, forwards and the main process share; every command runs through the
//!   sandbox core, `crate::exec`), `main_process` (the optional canonical main process, on a
//!   pty or pipes, and its exit report), `main_attach` (what its attachers see),
//!   `provider_env`.
//! - adapters: `ssh` (the SSH server, a protocol adapter onto `exec_service`) and `relay`
//!   (RelayOpen -> RelayStream, bridged to the SSH server or a loopback port).
//! - `doctor` (`check --gateway`) on top.
//!
//! Order at start: policy and sandbox first (fail closed before anything is reachable), then
//! the main process, then the session. Order at SIGTERM: refuse new relays, stop the session,
//! terminate execs and the main process (SIGTERM, or SIGHUP then SIGTERM on a pty; grace;
//! SIGKILL), report, exit 0.

// Base: plain data and helpers with no gateway I/O.
pub mod backoff;
pub mod config;
pub mod ended;
pub mod identity;
pub mod main_spec;
pub mod ocsf;
pub mod stop;
pub mod tls;
pub mod tokens;
// RPC: the channel and every call on it.
pub mod auth;
pub mod channel;
pub mod egress;
pub mod logpush;
pub mod policy_plane;
pub mod policy_slot;
pub mod session;
// Exec: what the gateway runs in the sandbox.
pub mod exec_service;
pub mod main_attach;
pub mod main_process;
pub mod provider_env;
// Protocol adapters onto exec.
pub mod relay;
pub mod ssh;
// On top: the diagnosis of all of the above.
pub mod doctor;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;

use self::config::{Config, ServeArgs};
use self::ended::Ended;
use self::exec_service::{DEFAULT_PATH, ExecContext, Tracker};
use crate::exec::{Sandbox, Supervisor};

pub use self::config::DEFAULT_WORKDIR;

/// Why `serve` could not start or keep running. `main.rs` maps each variant to its exit code
/// ([`ServeError::exit`]).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Flags or values clap accepted but could not turn into the arguments.
    #[error("{0}")]
    Usage(#[source] clap::Error),
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    OciUser(identity::IdentityError),
    #[error("starting the async runtime")]
    Runtime(#[source] std::io::Error),
    #[error("the workdir")]
    Workdir(#[source] std::io::Error),
    #[error("loading the sandbox policy from the gateway")]
    Plane(#[source] policy_plane::PlaneError),
    #[error("building the sandbox policy")]
    Policy(#[source] crate::policy::PolicyError),
    #[error(transparent)]
    Sandbox(#[from] crate::exec::RunError),
    #[error(transparent)]
    Ssh(#[from] ssh::SshError),
    #[error("installing the {0} handler")]
    Signal(&'static str, #[source] std::io::Error),
    #[error(transparent)]
    MainProcess(#[from] main_process::StartError),
}

impl ServeError {
    /// Flags, env, a policy or a workdir we cannot keep are ours, as they are for `run`; a
    /// sandbox that cannot be built keeps run's row; a failure while serving (the gateway's
    /// policy cannot be loaded, a handler, the main process) failed.
    pub fn exit(&self) -> crate::exit::Exit {
        match self {
            ServeError::Usage(_)
            | ServeError::Config(_)
            | ServeError::OciUser(_)
            | ServeError::Policy(_)
            | ServeError::Workdir(_) => crate::exit::Exit::Ours,
            ServeError::Sandbox(e) => e.exit(),
            _ => crate::exit::Exit::Failed,
        }
    }
}

/// Entry point for `openshell-sandbox [serve] ...`. `argv[0]` is the program (or `serve`).
// Returned once per process, so the size of the error costs nothing.
#[allow(clippy::result_large_err)]
pub fn main(argv: &[OsString]) -> Result<ExitCode, ServeError> {
    // OpenShell's supervisor matches these on the raw argv; we
    // implement neither, and saying so beats treating the word as a main command (exit 127).
    if let Some(word @ ("validate-workspace" | "debug-rpc")) = argv.get(1).and_then(|a| a.to_str())
    {
        eprintln!(
            "openshell-sandbox: error: the `{word}` subcommand is not implemented by this supervisor"
        );
        return Ok(ExitCode::from(crate::cli::USAGE_EXIT));
    }
    unset_empty_identity_env();
    let matches = match crate::cli::parsed(ServeArgs::command().try_get_matches_from(argv), argv) {
        Ok(m) => m,
        Err(code) => return Ok(code),
    };
    let mut args = ServeArgs::from_arg_matches(&matches).map_err(ServeError::Usage)?;
    args.raw_args = argv.get(1..).unwrap_or_default().to_vec();
    // With a gateway policy only an explicit --network overrides its network section.
    let network_explicit =
        matches.value_source("network") == Some(clap::parser::ValueSource::CommandLine);
    crate::logging::init_with_layer(
        &args.policy.log_level,
        args.policy.log_format,
        logpush::filtered_layer(),
    );
    if let Some(spec) = args.oci_image_user.as_deref() {
        let (uid, gid) =
            identity::oci_user(spec, Path::new("/etc")).map_err(ServeError::OciUser)?;
        if args.policy.uid.is_none() && uid.is_some() {
            tracing::info!(uid, "sandbox uid from OPENSHELL_OCI_IMAGE_USER");
            args.policy.uid = uid;
        }
        if args.policy.gid.is_none() && gid.is_some() {
            tracing::info!(gid, "sandbox gid from OPENSHELL_OCI_IMAGE_USER");
            args.policy.gid = gid;
        }
    }
    let cfg = args.resolve()?;
    warn_ignored(&args);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    rt.block_on(supervise(args, cfg, network_explicit))
}

/// The Docker and Podman drivers set `OPENSHELL_SANDBOX_UID=""` and `_GID=""` and put the
/// identity in OPENSHELL_OCI_IMAGE_USER: an empty value means unset, but clap would parse it
/// as the id `""` and exit 2.
fn unset_empty_identity_env() {
    for var in ["OPENSHELL_SANDBOX_UID", "OPENSHELL_SANDBOX_GID"] {
        if std::env::var_os(var).is_some_and(|v| v.to_string_lossy().trim().is_empty()) {
            // SAFETY: called from main before the runtime, the logger or any other thread
            // exists, so nothing can read the environment concurrently.
            unsafe { std::env::remove_var(var) };
        }
    }
}

fn warn_ignored(args: &ServeArgs) {
    if args.upstream_proxy.is_some()
        || args.upstream_no_proxy.is_some()
        || args.upstream_proxy_auth_file.is_some()
        || args.upstream_proxy_auth_allow_insecure
        || args.upstream_proxy_connect_by_hostname
    {
        tracing::warn!(
            "--upstream-proxy* flags are accepted for compatibility but not implemented"
        );
    }
    if args.ssh_handshake_secret.is_some() || args.ssh_handshake_skew_secs.is_some() {
        tracing::info!(
            "OPENSHELL_SSH_HANDSHAKE_SECRET/_SKEW_SECS ignored: the SSH server is reachable only through the authenticated relay"
        );
    }
    if let Some(p) = &args.ssh_socket_path {
        tracing::info!(path = %p.display(), "OPENSHELL_SSH_SOCKET_PATH ignored: no SSH socket is created");
    }
}

/// Why the supervisor is stopping.
enum Stop {
    Signal(&'static str),
    MainExited(Ended),
}

/// Tasks that run until the supervisor stops, aborted then.
type Background = Vec<tokio::task::JoinHandle<()>>;

#[allow(clippy::result_large_err)]
async fn supervise(
    args: ServeArgs,
    cfg: Config,
    network_explicit: bool,
) -> Result<ExitCode, ServeError> {
    crate::exec::workdir::serve_create(&args.policy, Path::new(DEFAULT_WORKDIR));
    // Every sandbox of this supervisor spawns through its one process manager.
    let supervisor = Supervisor::new()?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let tokens = cfg
        .gateway
        .as_ref()
        .map(|g| tokens::TokenStore::new(g.token.clone()));
    let mut background = Background::new();
    // With a gateway: TLS interception and provider credentials for every sandbox (the CA is
    // made here, before the first view that shows it).
    let serve_egress = cfg
        .gateway
        .as_ref()
        .map(|_| Arc::new(egress::ServeEgress::prepare()));
    // With a gateway the policy comes from it; without one, from the flags.
    let (workdir, sandbox) = match (&cfg.gateway, &tokens, &serve_egress) {
        (Some(g), Some(tokens), Some(serve_egress)) => {
            background.extend(logpush::start(g.clone(), tokens.clone(), stop_rx.clone()));
            let from = PlaneFrom {
                args: &args,
                cfg: &cfg,
                tokens,
                egress: serve_egress,
                network_explicit,
                supervisor: &supervisor,
            };
            let (workdir, plane) = from.start(g).await?;
            background.push(tokio::spawn(plane.clone().poll_loop(stop_rx.clone())));
            (workdir, plane.slot())
        }
        _ => policy_from_flags(&args, &cfg, &supervisor)?,
    };
    let tracker = Arc::new(Tracker::default());
    let ctx = exec_context(&cfg, sandbox, workdir, stop_rx.clone(), tracker.clone());
    let ssh = ssh::SshServer::new(ctx.clone())?;
    let relays = relay::Relays::new(cfg.max_execs, ssh);
    // One instance id per main process, the same on every reconnect.
    let instance_id = uuid::Uuid::new_v4().to_string();
    let mut signals = Signals::install()?;

    // The provider environment before the main process, which gets its placeholders (not
    // for ever: a gateway that does not answer leaves it for the execs after it arrives).
    if let (Some(g), Some(tokens), Some(e)) = (&cfg.gateway, &tokens, &serve_egress) {
        background.push(first_provider_env(g, tokens, &ctx, e).await);
    }
    let mut main_task = match &cfg.main {
        Some(m) => {
            let local = cfg.gateway.is_none();
            let running =
                main_process::start(&ctx, m, cfg.main_timeout, stop_rx.clone(), local).await?;
            let _ = ctx.main.set(running.session);
            Some(running.task)
        }
        None => None,
    };

    if let (Some(g), Some(tokens)) = (&cfg.gateway, &tokens) {
        background.extend(connect(g, tokens, &cfg, &instance_id, &relays, &stop_rx));
    } else {
        tracing::info!(
            "--no-gateway: running the main process only, on our stdin, stdout and stderr"
        );
    }

    let stop = tokio::select! {
        name = signals.any() => Stop::Signal(name),
        Some(info) = async {
            match main_task.as_mut() {
                Some(t) => t.await.ok(),
                None => std::future::pending().await,
            }
        } => {
            main_task = None;
            Stop::MainExited(info)
        }
    };
    match &stop {
        Stop::Signal(name) => tracing::info!("{name}: shutting down"),
        Stop::MainExited(e) => {
            tracing::info!(code = ?e.info.code, signal = ?e.info.signal, timed_out = e.timed_out, "main process exited; shutting down")
        }
    }
    let signalled = matches!(stop, Stop::Signal(_));
    // Refuse new relays, end the session (the gateway demotes the sandbox), then terminate
    // every running exec and the main process.
    relays.close();
    let _ = stop_tx.send(true);
    for t in &background {
        t.abort();
    }
    let main_exit = match (stop, main_task) {
        (Stop::MainExited(info), _) => Some(info),
        (Stop::Signal(_), Some(t)) => t.await.ok(),
        (Stop::Signal(_), None) => None,
    };
    let drain = cfg.shutdown_grace + Duration::from_secs(5);
    if tokio::time::timeout(drain, tracker.idle()).await.is_err() {
        tracing::warn!("some execs did not end within {drain:?}");
    }
    // Let the last exit statuses reach the gateway before the connection goes away.
    let _ = tokio::time::timeout(Duration::from_secs(3), relays.idle()).await;

    if let (Some(info), Some(g), Some(tokens)) = (&main_exit, &cfg.gateway, &tokens) {
        let code = info.code();
        // Retried until the gateway says OK, as OpenShell's protocol asks; a (further) SIGTERM is the
        // operator saying not to wait any longer.
        tokio::select! {
            _ = main_process::report_exit(g, tokens, &instance_id, code) => {}
            _ = signals.term.recv() => tracing::warn!("SIGTERM while reporting the main process exit; exiting without a confirmed report"),
        }
    }
    // A signal means Kubernetes asked us to stop: exit 0. The main process ending on its own
    // ends the supervisor with its code.
    Ok(match main_exit {
        Some(info) if !signalled => ExitCode::from(info.code().clamp(0, 255) as u8),
        _ => ExitCode::SUCCESS,
    })
}

/// What the policy plane is started from, with a gateway.
struct PlaneFrom<'a> {
    args: &'a ServeArgs,
    cfg: &'a Config,
    tokens: &'a Arc<tokens::TokenStore>,
    egress: &'a Arc<egress::ServeEgress>,
    /// `--network` was given: the flag stands beside the gateway's policy.
    network_explicit: bool,
    supervisor: &'a Supervisor,
}

impl PlaneFrom<'_> {
    /// The workdir, and the plane with the gateway's first policy.
    #[allow(clippy::result_large_err)]
    async fn start(
        &self,
        g: &config::GatewayConfig,
    ) -> Result<(PathBuf, Arc<policy_plane::Plane>), ServeError> {
        let args = self.args;
        let mut flags = crate::policy::PolicyFlags::from(&args.policy);
        if !self.network_explicit {
            flags.network = None;
        }
        let workdir = std::path::absolute(
            args.policy
                .workdir
                .clone()
                .unwrap_or_else(|| DEFAULT_WORKDIR.into()),
        )
        .map_err(ServeError::Workdir)?;
        let plane = policy_plane::Plane::start(policy_plane::PlaneConfig {
            gateway: g.clone(),
            tokens: self.tokens.clone(),
            sandbox_name: args.sandbox_name.clone(),
            flags,
            default_workdir: DEFAULT_WORKDIR.into(),
            secret_paths: self.cfg.secret_paths.clone(),
            interval: policy_plane::PlaneConfig::poll_interval_from_env(),
            local_paths: policy_plane::local_policy_paths(),
            egress: self.egress.clone(),
            supervisor: self.supervisor.clone(),
        })
        .await
        .map_err(ServeError::Plane)?;
        Ok((workdir, plane))
    }
}

/// Without a gateway: the policy of the flags, checked, for the life of the supervisor.
#[allow(clippy::result_large_err)]
fn policy_from_flags(
    args: &ServeArgs,
    cfg: &Config,
    supervisor: &Supervisor,
) -> Result<(PathBuf, Arc<policy_plane::PolicySlot>), ServeError> {
    let policy = crate::policy::Policy::from_args(
        &args.policy,
        Path::new(DEFAULT_WORKDIR),
        cfg.secret_paths.clone(),
    )
    .map_err(ServeError::Policy)?;
    crate::exec::workdir::serve_check(&policy);
    let workdir = policy.fs.workdir.clone();
    Ok((
        workdir,
        policy_plane::PolicySlot::new(Sandbox::new(supervisor, policy)?),
    ))
}

/// What every exec of this supervisor shares.
fn exec_context(
    cfg: &Config,
    sandbox: Arc<policy_plane::PolicySlot>,
    workdir: PathBuf,
    shutdown: watch::Receiver<bool>,
    tracker: Arc<Tracker>,
) -> Arc<ExecContext> {
    Arc::new(ExecContext {
        sandbox,
        shell: cfg.shell,
        user_env: cfg.user_env.clone(),
        workdir,
        path: std::env::var("PATH")
            .ok()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| DEFAULT_PATH.into()),
        shutdown,
        grace: cfg.shutdown_grace,
        tracker,
        exec_permits: Arc::new(tokio::sync::Semaphore::new(cfg.max_execs)),
        max_execs: cfg.max_execs,
        request_timeout: cfg.channel_request_timeout,
        main: Default::default(),
        provider_env: Default::default(),
    })
}

/// The signals that stop the supervisor.
struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
    quit: Signal,
}

impl Signals {
    #[allow(clippy::result_large_err)]
    fn install() -> Result<Signals, ServeError> {
        let on = |kind: SignalKind, name| signal(kind).map_err(|e| ServeError::Signal(name, e));
        Ok(Signals {
            term: on(SignalKind::terminate(), "SIGTERM")?,
            int: on(SignalKind::interrupt(), "SIGINT")?,
            // SIGHUP and SIGQUIT stop us as SIGTERM does: their default action would kill the
            // supervisor and leave every exec's tree running (only leaders have a parent-death
            // signal).
            hup: on(SignalKind::hangup(), "SIGHUP")?,
            quit: on(SignalKind::quit(), "SIGQUIT")?,
        })
    }

    /// The name of the first of them to arrive.
    async fn any(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
            _ = self.hup.recv() => "SIGHUP",
            _ = self.quit.recv() => "SIGQUIT",
        }
    }
}

/// The task that fetches the provider environment (and keeps it current), once its first
/// answer has arrived or [`provider_env::FIRST_FETCH_WAIT`] has passed.
async fn first_provider_env(
    g: &config::GatewayConfig,
    tokens: &Arc<tokens::TokenStore>,
    ctx: &Arc<ExecContext>,
    e: &Arc<egress::ServeEgress>,
) -> tokio::task::JoinHandle<()> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(provider_env::fetch(
        g.clone(),
        tokens.clone(),
        ctx.clone(),
        e.clone(),
        tx,
    ));
    if tokio::time::timeout(provider_env::FIRST_FETCH_WAIT, rx)
        .await
        .is_err()
    {
        tracing::warn!(
            "the provider environment has not arrived within {:?}; the main process starts without it",
            provider_env::FIRST_FETCH_WAIT
        );
    }
    task
}

/// The session with the gateway and the token's renewal, after saying how the connection is
/// protected.
fn connect(
    g: &config::GatewayConfig,
    tokens: &Arc<tokens::TokenStore>,
    cfg: &Config,
    instance_id: &str,
    relays: &Arc<relay::Relays>,
    stop: &watch::Receiver<bool>,
) -> Background {
    if !tokens.has_source() {
        tracing::info!(
            "no token source (OPENSHELL_SANDBOX_TOKEN, _TOKEN_FILE, OPENSHELL_K8S_SA_TOKEN_FILE): connecting with the client certificate only, as v0.0.36 gateways expect"
        );
    }
    if g.tls.is_none() && g.loopback_only {
        tracing::info!(
            endpoint = %g.endpoint,
            "plaintext gateway connection over loopback (http://): the bearer token never leaves this network namespace"
        );
    } else if g.tls.is_none() {
        tracing::warn!(
            endpoint = %g.endpoint,
            "PLAINTEXT gateway connection (http://): no TLS, no server authentication; whoever can see this traffic can read it{}",
            if tokens.has_source() { ", the bearer token included (OPENSHELL_ALLOW_PLAINTEXT_TOKEN)" } else { "" }
        );
    }
    let channels = channel::ChannelSlot::new(g.clone());
    let s = Arc::new(session::Session {
        cfg: g.clone(),
        tokens: tokens.clone(),
        channels: channels.clone(),
        instance_id: instance_id.to_string(),
        relays: relays.clone(),
        hello_timeout: cfg.hello_timeout,
        reconnect: cfg.reconnect,
    });
    vec![
        tokio::spawn(session::run(s, stop.clone())),
        tokio::spawn(auth::refresh_loop(tokens.clone(), channels)),
    ]
}
