//! `serve` configuration: every environment variable OpenShell's Kubernetes driver sets on the
//! sandbox pod is also a flag, so the pod's command line and env
//! work unchanged. `ServeArgs::resolve` turns the raw flags into a checked [`Config`], naming
//! the variable behind every missing or contradictory setting.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use super::main_spec::{MainProcess, SpecError};
use super::tls::TlsPaths;

/// Where the pod mounts the workspace; the default `--workdir`.
pub const DEFAULT_WORKDIR: &str = "/sandbox";

/// Default location of the client TLS Secret in a sandbox pod.
pub const DEFAULT_TLS_DIR: &str = "/etc/openshell-tls/client";

/// `openshell-sandbox [serve] [OPTIONS] [MAIN COMMAND...]`
#[derive(Debug, Parser)]
#[command(
    name = "openshell-sandbox",
    about = "Sandbox supervisor: dial back to the OpenShell gateway and serve exec",
    version = crate::cli::VERSION,
    mut_arg("workdir", |a| a.help(format!(
        "Read-write working directory of the execs and the main process; created, owned by \
         the sandbox uid, when missing. Default: {}",
        DEFAULT_WORKDIR
    ))),
)]
pub struct ServeArgs {
    #[command(flatten)]
    pub policy: crate::cli::PolicyArgs,

    /// Gateway URL; `https://` is mTLS, `http://` is plaintext h2c.
    #[arg(long, env = "OPENSHELL_ENDPOINT", value_name = "URL")]
    pub endpoint: Option<String>,

    /// Fallback for --endpoint.
    #[arg(
        long,
        env = "OPENSHELL_GATEWAY_ENDPOINT",
        value_name = "URL",
        hide = true
    )]
    pub gateway_endpoint: Option<String>,

    /// Sandbox object id (UUID) sent in the hello, relays and exit reports.
    #[arg(long, env = "OPENSHELL_SANDBOX_ID", value_name = "ID")]
    pub sandbox_id: Option<String>,

    /// Sandbox name, for logs only.
    #[arg(long = "sandbox-name", env = "OPENSHELL_SANDBOX", value_name = "NAME")]
    pub sandbox_name: Option<String>,

    /// CA certificate (PEM) that the gateway's certificate must chain to. Nothing else is trusted.
    #[arg(
        long,
        env = "OPENSHELL_TLS_CA",
        value_name = "PATH",
        default_value = "/etc/openshell-tls/client/ca.crt"
    )]
    pub tls_ca: PathBuf,

    /// Client certificate chain (PEM) presented to the gateway.
    #[arg(
        long,
        env = "OPENSHELL_TLS_CERT",
        value_name = "PATH",
        default_value = "/etc/openshell-tls/client/tls.crt"
    )]
    pub tls_cert: PathBuf,

    /// Private key (PEM) of the client certificate.
    #[arg(
        long,
        env = "OPENSHELL_TLS_KEY",
        value_name = "PATH",
        default_value = "/etc/openshell-tls/client/tls.key"
    )]
    pub tls_key: PathBuf,

    /// Name the gateway's certificate must carry, instead of the endpoint host.
    #[arg(long, env = "OPENSHELL_GATEWAY_TLS_SERVER_NAME", value_name = "NAME")]
    pub tls_server_name: Option<String>,

    /// A gateway JWT, used as the bearer as is (test harnesses). Anything on the command line
    /// is readable by every local user through /proc/PID/cmdline: prefer the
    /// OPENSHELL_SANDBOX_TOKEN variable or --sandbox-token-file.
    #[arg(
        long,
        env = "OPENSHELL_SANDBOX_TOKEN",
        value_name = "JWT",
        hide_env_values = true
    )]
    pub sandbox_token: Option<String>,

    /// File holding a gateway JWT (trimmed); read at start and again after the gateway
    /// answers UNAUTHENTICATED, so a rotated file is picked up.
    #[arg(long, env = "OPENSHELL_SANDBOX_TOKEN_FILE", value_name = "PATH")]
    pub sandbox_token_file: Option<PathBuf>,

    /// Projected Kubernetes service-account token, exchanged for a gateway JWT through
    /// IssueSandboxToken.
    #[arg(long, env = "OPENSHELL_K8S_SA_TOKEN_FILE", value_name = "PATH")]
    pub k8s_sa_token_file: Option<PathBuf>,

    /// The canonical main process: JSON `{"version":1,"command":[...],"tty":bool}` or
    /// `base64url:` followed by that JSON in URL-safe unpadded base64.
    #[arg(long, env = "OPENSHELL_MAIN_PROCESS_SPEC", value_name = "SPEC")]
    pub main_process_spec: Option<String>,

    /// v0.0.36 form of the main process, split on whitespace (e.g. `sleep infinity`).
    #[arg(long, env = "OPENSHELL_SANDBOX_COMMAND", value_name = "COMMAND")]
    pub sandbox_command: Option<String>,

    /// JSON object of variables given to every exec's environment (OPENSHELL_* keys dropped).
    #[arg(
        long,
        env = "OPENSHELL_USER_ENVIRONMENT",
        value_name = "JSON",
        hide_env_values = true
    )]
    pub user_environment: Option<String>,

    /// OpenShell's SSH socket. Accepted for compatibility and unused: our SSH server is only
    /// reachable through the relay, over an in-memory pipe, so there is no socket to protect.
    #[arg(
        long,
        env = "OPENSHELL_SSH_SOCKET_PATH",
        value_name = "PATH",
        hide = true
    )]
    pub ssh_socket_path: Option<PathBuf>,

    /// v0.0.36 handshake secret; accepted and ignored (the relay is already authenticated).
    #[arg(
        long,
        env = "OPENSHELL_SSH_HANDSHAKE_SECRET",
        hide = true,
        hide_env_values = true
    )]
    pub ssh_handshake_secret: Option<String>,

    /// v0.0.36 handshake clock skew; accepted and ignored.
    #[arg(long, env = "OPENSHELL_SSH_HANDSHAKE_SKEW_SECS", hide = true)]
    pub ssh_handshake_skew_secs: Option<String>,

    /// Upstream proxy for the sandbox (accepted for pod compatibility; not implemented).
    #[arg(long, value_name = "URL")]
    pub upstream_proxy: Option<String>,
    /// Accepted for pod compatibility; not implemented.
    #[arg(long, value_name = "LIST")]
    pub upstream_no_proxy: Option<String>,
    /// Accepted for pod compatibility; not implemented. The file is denied to sandboxed code.
    #[arg(long, value_name = "PATH")]
    pub upstream_proxy_auth_file: Option<PathBuf>,
    /// Accepted for pod compatibility; not implemented.
    #[arg(long)]
    pub upstream_proxy_auth_allow_insecure: bool,
    /// Accepted for pod compatibility; not implemented.
    #[arg(long)]
    pub upstream_proxy_connect_by_hostname: bool,

    /// Most execs (session channels running a command or shell) at once, and most relays
    /// open at once; past it the exec or the RelayOpen fails with a clear error.
    #[arg(long, value_name = "N", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_execs: u32,

    /// Supervisor topology. Only the combined one, `network,process` (the default), is
    /// supported; `network`, `process` and `network-init` (the sidecar topology) are refused.
    #[arg(long, value_name = "MODES", default_value = "network,process", value_parser = parse_mode)]
    pub mode: String,

    /// The post-HEAD launch style (`openshell-supervisor --role=...`, the Sandbox Protocol);
    /// refused.
    #[arg(long, value_name = "ROLE", hide = true, value_parser = refuse_role)]
    pub role: Option<String>,

    /// Send the bearer token over a plaintext (`http://`) endpoint that is not loopback, e.g.
    /// a local Docker or Podman gateway without TLS. Whoever can see that traffic can copy the
    /// token and act as this sandbox's supervisor. Loopback endpoints (127.0.0.0/8, ::1,
    /// `localhost`) never need it.
    #[arg(
        long,
        env = ALLOW_PLAINTEXT_TOKEN,
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_value = "false",
        default_missing_value = "true",
        value_parser = parse_opt_in
    )]
    pub allow_plaintext_token: bool,

    /// The image's USER (Docker/Podman drivers): `user`, `uid`, `user:group` or `uid:gid`. It
    /// fills whichever of the uid and gid is not given; empty means the uid/gid are
    /// authoritative (Kubernetes).
    #[arg(
        long,
        env = "OPENSHELL_OCI_IMAGE_USER",
        value_name = "USER[:GROUP]",
        hide = true
    )]
    pub oci_image_user: Option<String>,

    /// Milliseconds a session channel may stay open without an exec, shell or subsystem
    /// request before it is closed.
    #[arg(long, value_name = "MS", default_value_t = 30_000, hide = true,
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub channel_request_timeout_ms: u64,

    /// How exec command strings are run: `login` is OpenShell's `bash -lc` (or `sh -c` where
    /// there is no bash); `plain` is always a non-login `sh -c`.
    #[arg(long, value_enum, env = "OPENSHELL_EXEC_SHELL", default_value_t = ShellMode::Login)]
    pub shell: ShellMode,

    /// Seconds between the first signal and SIGKILL when execs and the main process are
    /// stopped at shutdown: SIGTERM, or on a pty SIGHUP (as a hang-up) then SIGTERM.
    #[arg(long, value_name = "SECS", default_value_t = 5)]
    pub shutdown_grace: u64,

    /// Wall-clock limit of the main process in seconds (exit code 124 when it fires).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,

    /// Seconds to wait for the gateway to answer the hello before retrying.
    #[arg(long, value_name = "SECS", default_value_t = 20, hide = true,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub hello_timeout: u64,

    /// Seconds between HTTP/2 PINGs to the gateway, sent also while idle.
    #[arg(long, value_name = "SECS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub keepalive_interval: u64,

    /// Seconds to wait for a PING's ack before the connection is declared dead and the
    /// session reconnects.
    #[arg(long, value_name = "SECS", default_value_t = 20,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub keepalive_timeout: u64,

    /// First reconnect delay in milliseconds; it doubles up to --reconnect-max-ms (5 s at
    /// most while the gateway answers Health), and starts over after a session that was up.
    #[arg(long, value_name = "MS", default_value_t = 250, hide = true,
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub reconnect_base_ms: u64,

    /// Longest reconnect delay in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 30_000, hide = true,
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub reconnect_max_ms: u64,

    /// Run the main process although no gateway is configured (no OPENSHELL_ENDPOINT): our
    /// stdin goes to it, its output to our stdout and stderr, and we exit with its code. Without
    /// it, a supervisor with no gateway runs nothing (`openshell-sandbox run` is the command for
    /// one sandboxed command).
    #[arg(long)]
    pub no_gateway: bool,

    /// The words after the program (and `serve`) as given, for the `run` command line that a
    /// supervisor with no gateway suggests instead. Filled by the caller, not by clap.
    #[arg(skip)]
    pub raw_args: Vec<OsString>,

    /// The main process and its arguments (wins over OPENSHELL_MAIN_PROCESS_SPEC). From its
    /// first word on, everything is the command's; a word before it that starts with `-` must
    /// be a flag of ours (a misspelt one is a usage error, never the command), so a command
    /// that itself starts with `-` comes after `--`.
    #[arg(trailing_var_arg = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ShellMode {
    /// `bash -lc CMD` when bash exists (OpenShell's behaviour), else `sh -c CMD`.
    Login,
    /// Always `sh -c CMD`; no profile scripts run.
    Plain,
}

/// The variable that allows a bearer token over a plaintext endpoint that is not loopback.
/// An env var, not only a flag, because the gateway's driver renders the pod's command line:
/// the env is what an operator can still set (the image's `ENV`, a pod spec they write).
pub const ALLOW_PLAINTEXT_TOKEN: &str = "OPENSHELL_ALLOW_PLAINTEXT_TOKEN";

/// `--mode`: a comma list meaning exactly {network, process}, in any order. The other topologies split the supervisor across containers; pretending to
/// be one of them would leave the pod unenforced, so each is refused by name.
fn parse_mode(s: &str) -> Result<String, String> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    let mut network = false;
    let mut process = false;
    for p in &parts {
        match *p {
            "network" => network = true,
            "process" => process = true,
            "network-init" => {
                return Err(
                    "the `network-init` topology (the sidecar's init container that installs the pod fence) is not supported: this supervisor runs only the combined topology, --mode network,process".into(),
                );
            }
            "" => return Err("an empty mode; the only supported value is network,process".into()),
            other => {
                return Err(format!(
                    "unknown mode `{other}`; the only supported value is network,process"
                ));
            }
        }
    }
    match (network, process) {
        (true, true) => Ok("network,process".into()),
        (true, false) => Err("the `network` topology (the sidecar's network supervisor) is not supported: this supervisor runs only the combined topology, --mode network,process".into()),
        _ => Err("the `process` topology (the sidecar's workload agent, without a network supervisor of its own) is not supported: this supervisor runs only the combined topology, --mode network,process".into()),
    }
}

/// A yes/no setting given as an env var or `--flag=VALUE`. Empty means no, as an unset
/// variable does (drivers and compose files write empty values).
fn parse_opt_in(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "" | "0" | "false" | "no" | "off" => Ok(false),
        "1" | "true" | "yes" | "on" => Ok(true),
        _ => Err(format!(
            "{ALLOW_PLAINTEXT_TOKEN} / --allow-plaintext-token takes 1, true, yes, on or 0, false, no, off"
        )),
    }
}

fn refuse_role(s: &str) -> Result<String, String> {
    Err(format!(
        "the `--role {s}` launch style (openshell-supervisor and the Sandbox Protocol, after OpenShell v0.0.111) is not supported: this supervisor serves the ConnectSupervisor contract, started as `openshell-sandbox [--workdir DIR]`"
    ))
}

/// Where the bearer token comes from (in priority order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// OPENSHELL_SANDBOX_TOKEN.
    Literal(String),
    /// OPENSHELL_SANDBOX_TOKEN_FILE.
    File(PathBuf),
    /// OPENSHELL_K8S_SA_TOKEN_FILE, exchanged through IssueSandboxToken.
    ServiceAccount(PathBuf),
    /// None: the v0.0.36 gateway authenticates the client certificate only.
    None,
}

impl TokenSource {
    /// The variable the token comes from, for messages.
    pub fn variable(&self) -> &'static str {
        match self {
            TokenSource::Literal(_) => "OPENSHELL_SANDBOX_TOKEN",
            TokenSource::File(_) => "OPENSHELL_SANDBOX_TOKEN_FILE",
            TokenSource::ServiceAccount(_) => "OPENSHELL_K8S_SA_TOKEN_FILE",
            TokenSource::None => "none",
        }
    }
}

/// The gateway side of the configuration.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// The endpoint URL as given.
    pub endpoint: String,
    pub host: String,
    pub port: u16,
    /// `None` means plaintext h2c.
    pub tls: Option<TlsPaths>,
    pub sandbox_id: String,
    pub token: TokenSource,
    /// HTTP/2 PING interval and ack timeout.
    pub keepalive: Duration,
    pub keepalive_timeout: Duration,
    /// A plaintext endpoint that carries a token without the opt-in: it was accepted only
    /// because its host is loopback, so every connection must dial loopback addresses only
    /// (`localhost` is resolved at each connect and refused if it names anything else).
    pub loopback_only: bool,
}

/// Everything `serve` needs, checked.
#[derive(Debug)]
pub struct Config {
    /// `None`: no endpoint configured; only the main process runs.
    pub gateway: Option<GatewayConfig>,
    pub main: Option<MainProcess>,
    pub user_env: Vec<(String, String)>,
    pub max_execs: usize,
    /// How long a session channel may wait before its first request.
    pub channel_request_timeout: Duration,
    pub shell: ShellMode,
    pub shutdown_grace: Duration,
    pub main_timeout: Option<Duration>,
    pub hello_timeout: Duration,
    /// Reconnect backoff: first delay and cap.
    pub reconnect: (Duration, Duration),
    /// Files the sandboxed code must never read (TLS, tokens, proxy credentials).
    pub secret_paths: Vec<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "OPENSHELL_SANDBOX_ID (--sandbox-id) is not set, but an endpoint is; the hello needs the sandbox id"
    )]
    MissingSandboxId,
    #[error(
        "no gateway endpoint (OPENSHELL_ENDPOINT / OPENSHELL_GATEWAY_ENDPOINT / --endpoint) and no main process: nothing to do"
    )]
    NothingToDo,
    #[error(
        "no gateway is configured (OPENSHELL_ENDPOINT is not set), so the supervisor runs nothing: to run a command in a sandbox, use `{run}`; to run the main process with no gateway anyway, add --no-gateway"
    )]
    NoGateway {
        /// The `run` command line with the same arguments.
        run: String,
    },
    #[error(
        "--no-gateway with a gateway configured ({0}): unset OPENSHELL_ENDPOINT, or drop --no-gateway"
    )]
    NoGatewayWithEndpoint(String),
    #[error("OPENSHELL_ENDPOINT `{value}`: {reason}")]
    BadEndpoint { value: String, reason: String },
    #[error("OPENSHELL_GATEWAY_TLS_SERVER_NAME `{0}` is not a valid DNS name or IP address")]
    BadServerName(String),
    #[error("OPENSHELL_SANDBOX_TOKEN is set but empty")]
    EmptyToken,
    #[error(
        "refusing to send the bearer token ({0}) over the plaintext endpoint {1}: whoever can see this traffic (other pods or containers on the network, any hop to a remote host) can copy the token and act as this sandbox's supervisor, taking over its exec sessions and reading its provider credentials until the token expires. Use an https:// endpoint, or a loopback one (127.0.0.1, ::1, localhost); to accept the risk on a network you trust, set {ALLOW_PLAINTEXT_TOKEN}=1 (--allow-plaintext-token)"
    )]
    PlaintextToken(&'static str, String),
    #[error(
        "refusing to send the bearer token ({0}) over the plaintext loopback endpoint {1} while sandboxed commands share this network namespace (--network all): one of them could listen on that port while the gateway restarts and take the token. Use https://, drop --network all, or accept the risk with {ALLOW_PLAINTEXT_TOKEN}=1"
    )]
    LoopbackTokenSharedNetwork(&'static str, String),
    #[error("--reconnect-base-ms {0} is larger than --reconnect-max-ms {1}")]
    BadBackoff(u64, u64),
    #[error("OPENSHELL_USER_ENVIRONMENT is not a JSON object of strings: {0}")]
    BadUserEnvironment(String),
    #[error(transparent)]
    MainProcess(#[from] SpecError),
}

impl ServeArgs {
    /// Check and resolve the flags. Reads no files (TLS and token files are read when used).
    pub fn resolve(&self) -> Result<Config, ConfigError> {
        if self.reconnect_base_ms > self.reconnect_max_ms {
            return Err(ConfigError::BadBackoff(
                self.reconnect_base_ms,
                self.reconnect_max_ms,
            ));
        }
        let main = MainProcess::from_sources(
            &self.command,
            self.main_process_spec.as_deref(),
            self.sandbox_command.as_deref(),
        )?;
        let endpoint = non_empty(&self.endpoint).or_else(|| non_empty(&self.gateway_endpoint));
        let mut secret_paths = Vec::new();
        let gateway = match endpoint {
            None => match &main {
                None => return Err(ConfigError::NothingToDo),
                Some(m) if !self.no_gateway => {
                    return Err(ConfigError::NoGateway {
                        run: self.run_suggestion(m),
                    });
                }
                Some(_) => None,
            },
            Some(ep) if self.no_gateway => return Err(ConfigError::NoGatewayWithEndpoint(ep)),
            Some(ep) => {
                let sandbox_id =
                    non_empty(&self.sandbox_id).ok_or(ConfigError::MissingSandboxId)?;
                let (tls, host, port) = parse_endpoint(&ep)?;
                let tls = if tls {
                    let server_name = non_empty(&self.tls_server_name);
                    if let Some(name) = &server_name
                        && rustls_pki_types::ServerName::try_from(name.as_str()).is_err()
                    {
                        return Err(ConfigError::BadServerName(name.clone()));
                    }
                    Some(TlsPaths {
                        ca: self.tls_ca.clone(),
                        cert: self.tls_cert.clone(),
                        key: self.tls_key.clone(),
                        server_name,
                    })
                } else {
                    None
                };
                let token = self.token_source()?;
                let exposed = tls.is_none() && token != TokenSource::None;
                if exposed && !self.allow_plaintext_token {
                    if !is_loopback_host(&host) {
                        return Err(ConfigError::PlaintextToken(token.variable(), ep));
                    }
                    if self.policy.network == crate::cli::NetworkArg::All {
                        return Err(ConfigError::LoopbackTokenSharedNetwork(
                            token.variable(),
                            ep,
                        ));
                    }
                }
                Some(GatewayConfig {
                    endpoint: ep,
                    host,
                    port,
                    tls,
                    sandbox_id,
                    token,
                    keepalive: Duration::from_secs(self.keepalive_interval),
                    keepalive_timeout: Duration::from_secs(self.keepalive_timeout),
                    loopback_only: exposed && !self.allow_plaintext_token,
                })
            }
        };
        // Deny every secret we could be configured with, whether or not it is used, so a
        // sandboxed command can never read it.
        secret_paths.extend([&self.tls_ca, &self.tls_cert, &self.tls_key].map(|p| p.clone()));
        secret_paths.extend(
            [
                &self.sandbox_token_file,
                &self.k8s_sa_token_file,
                &self.upstream_proxy_auth_file,
            ]
            .into_iter()
            .flatten()
            .cloned(),
        );
        Ok(Config {
            gateway,
            main,
            user_env: parse_user_env(self.user_environment.as_deref())?,
            max_execs: self.max_execs as usize,
            channel_request_timeout: Duration::from_millis(self.channel_request_timeout_ms),
            shell: self.shell,
            shutdown_grace: Duration::from_secs(self.shutdown_grace),
            main_timeout: self.timeout.map(Duration::from_secs),
            hello_timeout: Duration::from_secs(self.hello_timeout),
            reconnect: (
                Duration::from_millis(self.reconnect_base_ms),
                Duration::from_millis(self.reconnect_max_ms),
            ),
            secret_paths,
        })
    }

    /// `openshell-sandbox run` with the words this supervisor was given, quoted for a shell;
    /// a main process from the environment (OPENSHELL_MAIN_PROCESS_SPEC, _SANDBOX_COMMAND)
    /// becomes the command after `--`.
    fn run_suggestion(&self, main: &MainProcess) -> String {
        let mut words: Vec<String> = self
            .raw_args
            .iter()
            .map(|w| w.to_string_lossy().into_owned())
            .collect();
        if self.command.is_empty() {
            words.push("--".into());
            words.extend(main.argv.iter().map(|w| w.to_string_lossy().into_owned()));
        }
        let quoted: Vec<String> = words
            .iter()
            .map(|w| shlex::try_quote(w).map_or_else(|_| w.replace('\0', ""), |q| q.into_owned()))
            .collect();
        let mut line = String::from("openshell-sandbox run");
        for q in quoted {
            line.push(' ');
            line.push_str(&q);
        }
        line
    }

    fn token_source(&self) -> Result<TokenSource, ConfigError> {
        if let Some(t) = &self.sandbox_token {
            let t = t.trim();
            if t.is_empty() {
                return Err(ConfigError::EmptyToken);
            }
            return Ok(TokenSource::Literal(t.to_owned()));
        }
        if let Some(p) = self
            .sandbox_token_file
            .as_ref()
            .filter(|p| !p.as_os_str().is_empty())
        {
            return Ok(TokenSource::File(p.clone()));
        }
        if let Some(p) = self
            .k8s_sa_token_file
            .as_ref()
            .filter(|p| !p.as_os_str().is_empty())
        {
            return Ok(TokenSource::ServiceAccount(p.clone()));
        }
        Ok(TokenSource::None)
    }
}

fn non_empty(v: &Option<String>) -> Option<String> {
    v.as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

/// Split `scheme://host[:port][/]` into (tls, host, port). Paths are refused: gRPC routes by
/// method path, and a prefix would silently break every call.
fn parse_endpoint(ep: &str) -> Result<(bool, String, u16), ConfigError> {
    let bad = |reason: &str| ConfigError::BadEndpoint {
        value: ep.to_owned(),
        reason: reason.to_owned(),
    };
    let uri: http::Uri = ep
        .parse()
        .map_err(|e: http::uri::InvalidUri| bad(&e.to_string()))?;
    let tls = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        Some(other) => return Err(bad(&format!("scheme `{other}` is not http or https"))),
        None => {
            return Err(bad(
                "missing scheme; use https://HOST:PORT or http://HOST:PORT",
            ));
        }
    };
    let host = uri.host().ok_or_else(|| bad("missing host"))?;
    if !matches!(uri.path(), "" | "/") {
        return Err(bad("a path is not allowed after the host and port"));
    }
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    Ok((tls, host, port))
}

/// A host whose traffic never leaves the machine's loopback interface: an address in
/// 127.0.0.0/8 or ::1 (also written as ::ffff:127.x.x.x), or the name `localhost`, which the
/// connector still resolves and refuses unless every address it names is loopback.
pub fn is_loopback_host(host: &str) -> bool {
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.to_canonical().is_loopback(),
        Err(_) => host.trim_end_matches('.').eq_ignore_ascii_case("localhost"),
    }
}

fn parse_user_env(raw: Option<&str>) -> Result<Vec<(String, String)>, ConfigError> {
    let Some(raw) = raw.map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok(Vec::new());
    };
    let map: std::collections::BTreeMap<String, String> =
        serde_json::from_str(raw).map_err(|e| ConfigError::BadUserEnvironment(e.to_string()))?;
    Ok(map
        .into_iter()
        // OPENSHELL_* keys are supervisor internals; a NUL cannot be passed to execve at all.
        .filter(|(k, v)| {
            !k.starts_with("OPENSHELL_")
                && !k.is_empty()
                && !k.contains(['=', '\0'])
                && !v.contains('\0')
        })
        .collect())
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
