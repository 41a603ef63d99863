//! `serve` under test: a faithful test gateway (`gateway`) and the real supervisor started
//! against it. Used by `tests/gateway_*.rs`, the egress tests of `serve` and
//! `benches/gateway.rs`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openshell_sandbox::proto::v1::ExecSandboxRequest;

#[allow(unused_imports)]
pub use super::exec::{ExecResult, exec_collect, exec_each};
pub use super::gateway::{AuthMode, State};
use super::skip::is_root;
use super::{BIN, gateway, pki};

pub const SANDBOX_ID: &str = "6f1c1f0e-3a1b-4c55-9d2e-0d2b5d1a7c11";

/// How the gateway listens.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    MutualTls,
    Plaintext,
}

pub struct TestGateway {
    pub state: Arc<State>,
    pub server: gateway::Server,
    pub dir: tempfile::TempDir,
    pub ca: pki::Ca,
    pub client: pki::ClientFiles,
    transport: Transport,
    tls: Option<Arc<rustls::ServerConfig>>,
}

fn server_tls(ca: &pki::Ca) -> Arc<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let leaf = ca.server(&["localhost", "127.0.0.1"]);
    let certs: Vec<_> = rustls_pemfile::certs(&mut leaf.cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .unwrap();
    let key = rustls_pemfile::private_key(&mut leaf.key_pem.as_bytes())
        .unwrap()
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut ca.pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    // Client certificates are required, as on a v0.0.36 gateway.
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .unwrap();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(cfg)
}

impl TestGateway {
    pub async fn start(auth: AuthMode) -> TestGateway {
        Self::start_with(auth, Transport::MutualTls).await
    }

    pub async fn start_with(auth: AuthMode, transport: Transport) -> TestGateway {
        // Outside /tmp: an exec's /tmp is the sandbox's private tmpfs, so files the test
        // grants or plants for the sandbox must live elsewhere.
        let dir = tempfile::Builder::new()
            .prefix("osb-gw-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let ca = pki::Ca::new("openshell-test-ca");
        let client = pki::ClientFiles::write(&dir.path().join("tls"), &ca.pem, &ca.client());
        let tls = (transport == Transport::MutualTls).then(|| server_tls(&ca));
        let state = State::new(SANDBOX_ID, auth);
        let server =
            gateway::Server::start(state.clone(), tls.clone(), "127.0.0.1:0".parse().unwrap())
                .await;
        TestGateway {
            state,
            server,
            dir,
            ca,
            client,
            transport,
            tls,
        }
    }

    pub fn endpoint(&self) -> String {
        let scheme = match self.transport {
            Transport::MutualTls => "https",
            Transport::Plaintext => "http",
        };
        // `localhost` so the server certificate's DNS name is what gets verified.
        format!("{scheme}://localhost:{}", self.server.addr.port())
    }

    /// Kill the gateway (every connection cut) and start a fresh one on the same port, with
    /// fresh state, as a restarted gateway pod would be.
    pub async fn restart(&mut self) {
        self.server.kill();
        let addr = self.server.addr;
        let state = State::with_jwt(SANDBOX_ID, self.state.auth, self.state.jwt.clone());
        let mut tries = 0;
        let server = loop {
            // The old listener may take a moment to be dropped by the aborted task.
            match tokio::net::TcpListener::bind(addr).await {
                Ok(l) => {
                    drop(l);
                    break gateway::Server::start(state.clone(), self.tls.clone(), addr).await;
                }
                Err(_) if tries < 100 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("rebinding {addr}: {e}"),
            }
        };
        self.state = state;
        self.server = server;
    }

    /// Rotate the PKI: the gateway restarts with a server certificate from `ca` and trusts
    /// only client certificates from `ca`.
    pub async fn rotate_ca(&mut self, ca: pki::Ca) {
        self.tls = Some(server_tls(&ca));
        self.ca = ca;
        self.restart().await;
    }

    /// Wait until a supervisor session is up (no timing assertion: the deadline only stops a
    /// broken supervisor from hanging the test run).
    pub async fn wait_ready(&self, sup: &mut Supervisor) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut rx = self.state.ready_rx();
        while !*rx.borrow_and_update() {
            if let Some(status) = sup.try_status() {
                panic!(
                    "supervisor exited ({status}) before the session came up:\n{}",
                    sup.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no supervisor session after 60 s; supervisor log:\n{}",
                sup.log()
            );
            let _ = tokio::time::timeout(Duration::from_millis(200), rx.changed()).await;
        }
    }

    pub fn request(&self, argv: &[&str]) -> ExecSandboxRequest {
        ExecSandboxRequest {
            sandbox_id: SANDBOX_ID.into(),
            command: argv.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    pub async fn exec(&self, argv: &[&str]) -> ExecResult {
        exec_collect(self.state.clone(), self.request(argv)).await
    }

    pub async fn sh(&self, script: &str) -> ExecResult {
        self.exec(&["sh", "-c", script]).await
    }
}

/// Options for starting the supervisor binary.
#[derive(Default, Clone)]
pub struct SupOpts {
    pub env: Vec<(String, String)>,
    pub args: Vec<String>,
    /// Leave out the TLS variables (to test their defaults or absence).
    pub no_tls_env: bool,
    /// Variables set to the empty string (an empty value in `env` removes the variable), as
    /// the Docker and Podman drivers set OPENSHELL_SANDBOX_UID/GID.
    pub empty_env: Vec<String>,
    /// Start the binary under this command: its words, then the binary's path and arguments
    /// (for a wrapper that ends in `exec "$0" "$@"`, so the pid stays the supervisor's).
    pub wrapper: Vec<String>,
}

pub struct Supervisor {
    pub child: Child,
    pub log_path: PathBuf,
    pub workdir: PathBuf,
}

impl Supervisor {
    /// Start `openshell-sandbox --workdir W` with the pod's environment, pointing at `gw`.
    pub fn start(gw: &TestGateway, opts: SupOpts) -> Supervisor {
        let workdir = gw.dir.path().join(format!("work-{}", rand_suffix()));
        std::fs::create_dir_all(&workdir).unwrap();
        std::fs::set_permissions(&workdir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let log_path = gw
            .dir
            .path()
            .join(format!("supervisor-{}.log", rand_suffix()));
        let log = std::fs::File::create(&log_path).unwrap();
        let mut cmd = match opts.wrapper.split_first() {
            None => Command::new(BIN),
            Some((w, words)) => {
                let mut c = Command::new(w);
                c.args(words).arg(BIN);
                c
            }
        };
        cmd.env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("OPENSHELL_ENDPOINT", gw.endpoint())
            .env("OPENSHELL_SANDBOX_ID", SANDBOX_ID)
            .env("OPENSHELL_LOG_LEVEL", "info")
            .arg("--workdir")
            .arg(&workdir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        if !opts.no_tls_env {
            cmd.env("OPENSHELL_TLS_CA", &gw.client.ca)
                .env("OPENSHELL_TLS_CERT", &gw.client.cert)
                .env("OPENSHELL_TLS_KEY", &gw.client.key);
        }
        if gw.state.auth == AuthMode::Jwt {
            // Over http:// too: the endpoint is loopback, which needs no opt-in.
            cmd.env(
                "OPENSHELL_SANDBOX_TOKEN",
                gw.state.jwt.mint(SANDBOX_ID, 3600),
            );
        }
        if !is_root() {
            eprintln!(
                "NOTE: not root, so the supervisor runs with --allow-degraded (this test is about the protocol; isolation is tested as root)"
            );
            cmd.arg("--allow-degraded");
        }
        for (k, v) in &opts.env {
            if v.is_empty() {
                cmd.env_remove(k);
            } else {
                cmd.env(k, v);
            }
        }
        for k in &opts.empty_env {
            cmd.env(k, "");
        }
        cmd.args(&opts.args);
        Supervisor {
            child: cmd.spawn().expect("starting the supervisor binary"),
            log_path,
            workdir,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    pub fn try_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Wait for the supervisor to exit (bounded, so a hang fails the test instead of the run).
    pub async fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.try_status() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "supervisor did not exit; log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Poll the log until it contains `needle`.
    pub async fn wait_log(&mut self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let log = self.log();
            if log.contains(needle) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "supervisor log never contained {needle:?}:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }

    /// Resident set size of the supervisor process, KiB.
    pub fn rss_kib(&self) -> u64 {
        rss_kib(self.child.id())
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

pub fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::SeqCst) * 1_000_000 + u64::from(std::process::id())
}

/// Start a gateway and a supervisor and wait for the session.
pub async fn up(auth: AuthMode, opts: SupOpts) -> (TestGateway, Supervisor) {
    let gw = TestGateway::start(auth).await;
    let mut sup = Supervisor::start(&gw, opts);
    gw.wait_ready(&mut sup).await;
    (gw, sup)
}

pub fn path_str(p: &Path) -> String {
    p.display().to_string()
}
