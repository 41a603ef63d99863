//! The ConnectSupervisor session through the real binary: reconnects, refusals, TLS and token
//! problems, heartbeats, the main-process exit report and SIGTERM.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use support::*;

const LONG: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_restart_mid_session_then_exec_succeeds() {
    let (mut gw, mut sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    assert_eq!(gw.sh("echo before").await.out(), "before\n");
    let first_instance = gw.state.seen().hellos[0].instance_id.clone();
    gw.restart().await;
    gw.wait_ready(&mut sup).await;
    let r = gw.sh("echo after").await;
    assert_eq!((r.out(), r.exit), ("after\n".to_string(), Some(0)), "{r:?}");
    // One instance id per main process: the same on every reconnect.
    assert_eq!(gw.state.seen().hellos[0].instance_id, first_instance);
    assert!(
        sup.try_status().is_none(),
        "the supervisor must survive a gateway restart"
    );
}

/// The reconnect delays the supervisor logged ("reconnecting to the gateway in 243.1ms (why)")
/// whose reason contains `why`.
fn logged_delays(log: &str, why: &str) -> Vec<Duration> {
    log.lines()
        .filter(|l| l.contains(why))
        .filter_map(|l| l.split("reconnecting to the gateway in ").nth(1))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(|d| {
            let (num, unit) = d.split_at(d.find(|c: char| c.is_alphabetic() || c == 'µ').unwrap());
            let n: f64 = num.parse().unwrap_or_else(|_| panic!("a delay {d:?}"));
            Duration::from_secs_f64(match unit {
                "s" => n,
                "ms" => n / 1e3,
                "µs" => n / 1e6,
                "ns" => n / 1e9,
                _ => panic!("a delay {d:?}"),
            })
        })
        .collect()
}

/// Three gateway restarts in a row, each after a session of a second and a half: every outage
/// (kill to the new session) stays short, because each session the gateway accepted and kept
/// starts the delays over. Before, only a 60 s session did, so these outages grew 1, 2, 4 s
/// (6.8, 14.4, 28.8 s against a real gateway that takes seconds to come back). The delays are
/// read from the log, which does not depend on the machine's speed; the outage bound is only
/// generous.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_gateway_restarts_each_cost_a_short_outage() {
    let (mut gw, mut sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let mut outages = Vec::new();
    for _ in 0..3 {
        // Longer than a session must live to count as healthy (1 s).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let t = std::time::Instant::now();
        gw.restart().await;
        gw.wait_ready(&mut sup).await;
        outages.push(t.elapsed());
    }
    let log = sup.log();
    let delays = logged_delays(&log, "(the session was up)");
    eprintln!("outages {outages:?}, delays {delays:?}");
    assert_eq!(
        delays.len(),
        3,
        "{delays:?}
{log}"
    );
    // The base delay, 250 ms, with its ±20 % jitter.
    assert!(
        delays.iter().all(|d| *d <= Duration::from_millis(300)),
        "{delays:?}
{log}"
    );
    assert!(
        outages.iter().all(|o| *o < Duration::from_secs(3)),
        "outages {outages:?}
{log}"
    );
    assert_eq!(gw.sh("echo after").await.out(), "after\n");
}

/// A gateway that is up (it answers Health) but refuses the session keeps being retried at
/// least every 5 s, instead of backing off to 30 s as for a gateway that is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_gateway_that_answers_health_is_retried_within_5s() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    // 0.25 + 0.5 + 1 + 2 + 4 + 5 s: the sixth delay is where the cap shows (8 s without it).
    gw.state.reject_sessions.store(6, Ordering::SeqCst);
    let mut sup = Supervisor::start(&gw, SupOpts::default());
    gw.wait_ready(&mut sup).await;
    assert_eq!(gw.state.seen().rejected_sessions, 6);
    let log = sup.log();
    let delays = logged_delays(&log, "(the gateway answers Health)");
    assert_eq!(
        delays.len(),
        6,
        "{delays:?}
{log}"
    );
    assert!(
        delays.iter().all(|d| *d <= Duration::from_secs(6)),
        "{delays:?}
{log}"
    );
    assert!(delays[5] >= Duration::from_secs(4), "{delays:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_session_is_retried_with_its_meaning_logged() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    gw.state.reject_sessions.store(2, Ordering::SeqCst);
    *gw.state.reject_code.lock().unwrap() = tonic::Code::NotFound;
    let mut sup = Supervisor::start(&gw, SupOpts::default());
    gw.wait_ready(&mut sup).await;
    assert_eq!(gw.state.seen().rejected_sessions, 2);
    let log = sup.log();
    assert!(log.contains("does not know this sandbox id"), "{log}");
    assert_eq!(gw.sh("echo ok").await.out(), "ok\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_follow_the_offered_interval_with_a_5s_floor() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    // Offer 1 s; the supervisor must use max(1, 5) = 5 s.
    gw.state.heartbeat_secs.store(1, Ordering::SeqCst);
    let mut sup = Supervisor::start(&gw, SupOpts::default());
    gw.wait_ready(&mut sup).await;
    let deadline = std::time::Instant::now() + LONG;
    while gw.state.seen().heartbeats.len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "no heartbeats:\n{}",
            sup.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let hb = gw.state.seen().heartbeats;
    let gap = hb[1] - hb[0];
    // A floor, not a speed claim: a gap under 5 s would mean the 5 s minimum was ignored.
    assert!(
        gap >= Duration::from_millis(4500),
        "heartbeats {gap:?} apart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_ca_is_refused_with_a_clear_message() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let other = pki::Ca::new("some-other-ca");
    let bad_ca = gw.dir.path().join("other-ca.crt");
    std::fs::write(&bad_ca, &other.pem).unwrap();
    let mut sup = Supervisor::start(
        &gw,
        SupOpts {
            env: vec![("OPENSHELL_TLS_CA".into(), bad_ca.display().to_string())],
            ..Default::default()
        },
    );
    let log = sup
        .wait_log("not signed by the CA in OPENSHELL_TLS_CA", LONG)
        .await;
    assert!(!gw.state.is_ready(), "{log}");
    assert!(sup.try_status().is_none(), "must keep retrying, not exit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_server_name_is_refused_with_a_clear_message() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let mut sup = Supervisor::start(
        &gw,
        SupOpts {
            env: vec![(
                "OPENSHELL_GATEWAY_TLS_SERVER_NAME".into(),
                "wrong.example".into(),
            )],
            ..Default::default()
        },
    );
    let log = sup
        .wait_log("OPENSHELL_GATEWAY_TLS_SERVER_NAME", LONG)
        .await;
    assert!(log.contains("wrong.example"), "{log}");
    assert!(!gw.state.is_ready());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_expired_client_cert_is_named() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let mut sup = Supervisor::start(
        &gw,
        SupOpts {
            env: vec![("OPENSHELL_TLS_CERT".into(), "/nonexistent/tls.crt".into())],
            ..Default::default()
        },
    );
    sup.wait_log("/nonexistent/tls.crt (OPENSHELL_TLS_CERT)", LONG)
        .await;
    drop(sup);

    let expired = gw.ca.expired_client();
    let files = pki::ClientFiles::write(&gw.dir.path().join("expired"), &gw.ca.pem, &expired);
    let mut sup = Supervisor::start(
        &gw,
        SupOpts {
            env: vec![
                (
                    "OPENSHELL_TLS_CERT".into(),
                    files.cert.display().to_string(),
                ),
                ("OPENSHELL_TLS_KEY".into(), files.key.display().to_string()),
            ],
            ..Default::default()
        },
    );
    sup.wait_log("has expired", LONG).await;

    // A certificate from a CA the gateway does not trust: the gateway refuses the handshake.
    let stranger = pki::Ca::new("untrusted-client-ca");
    let files = pki::ClientFiles::write(
        &gw.dir.path().join("stranger"),
        &gw.ca.pem,
        &stranger.client(),
    );
    let mut sup = Supervisor::start(
        &gw,
        SupOpts {
            env: vec![
                (
                    "OPENSHELL_TLS_CERT".into(),
                    files.cert.display().to_string(),
                ),
                ("OPENSHELL_TLS_KEY".into(), files.key.display().to_string()),
            ],
            ..Default::default()
        },
    );
    sup.wait_log("the gateway refused the TLS client certificate", LONG)
        .await;
    assert!(!gw.state.is_ready());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_client_cert_is_used_on_the_next_connection() {
    let (mut gw, mut sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    // Rotate the Secret in place: a new CA signs both a new server and client certificate.
    let new_ca = pki::Ca::new("rotated-ca");
    pki::ClientFiles::write(&gw.client.dir, &new_ca.pem, &new_ca.client());
    gw.rotate_ca(new_ca).await;
    gw.wait_ready(&mut sup).await;
    assert_eq!(gw.sh("echo rotated").await.out(), "rotated\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_source_connects_with_the_certificate_only() {
    // v0.0.36: the client certificate is the only authentication.
    let gw = TestGateway::start(AuthMode::CertOnly).await;
    let mut sup = Supervisor::start(
        &gw,
        SupOpts {
            env: vec![("OPENSHELL_SANDBOX_TOKEN".into(), String::new())],
            ..Default::default()
        },
    );
    gw.wait_ready(&mut sup).await;
    assert_eq!(gw.state.seen().hello_auth[0], None, "no bearer expected");
    assert_eq!(gw.sh("echo v36").await.out(), "v36\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_gateway_without_token_logs_what_is_missing() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let mut sup = Supervisor::start(
        &gw,
        SupOpts {
            env: vec![("OPENSHELL_SANDBOX_TOKEN".into(), String::new())],
            ..Default::default()
        },
    );
    let log = sup.wait_log("OPENSHELL_K8S_SA_TOKEN_FILE", LONG).await;
    assert!(
        log.contains("none is configured") || log.contains("no token source"),
        "{log}"
    );
    assert!(sup.try_status().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_for_another_sandbox_is_explained() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let other = gw.state.jwt.mint("another-sandbox", 3600);
    let mut sup = Supervisor::start(
        &gw,
        SupOpts {
            env: vec![("OPENSHELL_SANDBOX_TOKEN".into(), other)],
            ..Default::default()
        },
    );
    sup.wait_log("must equal OPENSHELL_SANDBOX_ID", LONG).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_gateway_hello_is_bounded_then_retried() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    gw.state.silent_hello.store(true, Ordering::SeqCst);
    let mut sup = Supervisor::start(
        &gw,
        SupOpts {
            args: vec!["--hello-timeout".into(), "1".into()],
            ..Default::default()
        },
    );
    sup.wait_log("did not answer the hello", LONG).await;
    gw.state.silent_hello.store(false, Ordering::SeqCst);
    gw.wait_ready(&mut sup).await;
    assert_eq!(gw.sh("echo answered").await.out(), "answered\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_account_token_is_exchanged_and_refreshed() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    gw.state.token_ttl.store(3, Ordering::SeqCst);
    let sa = gw.dir.path().join("sa-token");
    std::fs::write(&sa, format!("{}\n", gw.state.sa_token)).unwrap();
    let mut sup = Supervisor::start(
        &gw,
        SupOpts {
            env: vec![
                ("OPENSHELL_SANDBOX_TOKEN".into(), String::new()),
                (
                    "OPENSHELL_K8S_SA_TOKEN_FILE".into(),
                    sa.display().to_string(),
                ),
            ],
            ..Default::default()
        },
    );
    gw.wait_ready(&mut sup).await;
    let seen = gw.state.seen();
    assert_eq!(seen.issued, 1);
    let bearer = seen.hello_auth[0].clone().unwrap();
    assert_ne!(
        bearer, gw.state.sa_token,
        "the SA token must be exchanged, not used"
    );
    assert_eq!(gw.state.jwt.verify(&bearer).unwrap().sandbox_id, SANDBOX_ID);
    let deadline = std::time::Instant::now() + LONG;
    while gw.state.seen().refreshed < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "no refresh:\n{}",
            sup.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Relays carry the refreshed token.
    assert_eq!(gw.sh("echo fresh").await.out(), "fresh\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn main_process_exit_is_reported_after_error_statuses() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    gw.state.fail_reports.store(2, Ordering::SeqCst);
    let mut sup = Supervisor::start(
        &gw,
        SupOpts {
            args: vec!["sh".into(), "-c".into(), "sleep 2; exit 3".into()],
            ..Default::default()
        },
    );
    gw.wait_ready(&mut sup).await;
    let status = sup.wait_exit(LONG).await;
    assert_eq!(status.code(), Some(3), "{}", sup.log());
    let seen = gw.state.seen();
    assert_eq!(seen.report_attempts, 3, "{}", sup.log());
    assert_eq!(seen.reports.len(), 1);
    assert_eq!(seen.reports[0].exit_code, 3);
    assert_eq!(seen.reports[0].sandbox_id, SANDBOX_ID);
    assert_eq!(seen.reports[0].instance_id, seen.hellos[0].instance_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_command_v36_is_the_main_process() {
    let gw = TestGateway::start(AuthMode::CertOnly).await;
    let mut sup = Supervisor::start(
        &gw,
        SupOpts {
            env: vec![
                ("OPENSHELL_SANDBOX_TOKEN".into(), String::new()),
                ("OPENSHELL_SANDBOX_COMMAND".into(), "sh -c exit\t5".into()),
                ("OPENSHELL_SSH_HANDSHAKE_SECRET".into(), "deadbeef".into()),
                ("OPENSHELL_SSH_HANDSHAKE_SKEW_SECS".into(), "300".into()),
            ],
            ..Default::default()
        },
    );
    // `sh -c exit 5` runs `exit` with $0=5: status 0. Split on whitespace, like v0.0.36.
    let status = sup.wait_exit(LONG).await;
    assert_eq!(status.code(), Some(0), "{}", sup.log());
}

/// Wait (bounded) for the file an exec creates once it is running.
async fn wait_started(marker: &std::path::Path, sup: &Supervisor) {
    let deadline = std::time::Instant::now() + LONG;
    while !marker.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "exec never started:\n{}",
            sup.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_execs_and_the_main_process() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let mut sup = Supervisor::start(
        &gw,
        SupOpts {
            args: vec![
                "--shutdown-grace".into(),
                "2".into(),
                "sleep".into(),
                "1000".into(),
            ],
            ..Default::default()
        },
    );
    gw.wait_ready(&mut sup).await;
    let marker = sup.workdir.join("started");
    let st = gw.state.clone();
    let req = gw.request(&[
        "sh",
        "-c",
        &format!("touch {}; sleep 1000", marker.display()),
    ]);
    let running = tokio::spawn(async move { exec_collect(st, req).await });
    wait_started(&marker, &sup).await;
    sup.signal(libc::SIGTERM);
    let r = running.await.unwrap();
    // The exec was terminated (SIGTERM → 128+15) and still reported its status.
    assert_eq!(r.exit, Some(143), "{r:?}\n{}", sup.log());
    let status = sup.wait_exit(LONG).await;
    assert_eq!(status.code(), Some(0), "{}", sup.log());
    let seen = gw.state.seen();
    assert_eq!(seen.reports.len(), 1, "{}", sup.log());
    assert_eq!(seen.reports[0].exit_code, 143);
}

/// An interactive shell exec on a pty (as `openshell sandbox connect` opens one) is hung up at
/// shutdown like a pty main process: bash ignores SIGTERM, so it used to sit out the whole
/// grace and be killed (137); it ends by SIGHUP (129) now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hangs_up_an_interactive_exec_on_a_pty() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let mut sup = Supervisor::start(
        &gw,
        SupOpts {
            args: vec![
                "--shutdown-grace".into(),
                "30".into(),
                "sleep".into(),
                "1000".into(),
            ],
            ..Default::default()
        },
    );
    gw.wait_ready(&mut sup).await;
    let marker = sup.workdir.join("interactive");
    let mut req = gw.request(&["exec", "bash", "-i"]);
    req.tty = true;
    // Read from the terminal by the interactive shell: it marks that it runs, then waits.
    req.stdin = format!("case $- in *i*) touch {};; esac\n", marker.display()).into_bytes();
    let st = gw.state.clone();
    let running = tokio::spawn(async move { exec_collect(st, req).await });
    wait_started(&marker, &sup).await;
    let t = std::time::Instant::now();
    sup.signal(libc::SIGTERM);
    let r = running.await.unwrap();
    assert_eq!(r.exit, Some(128 + libc::SIGHUP), "{r:?}\n{}", sup.log());
    assert_eq!(sup.wait_exit(LONG).await.code(), Some(0), "{}", sup.log());
    // Not a timing claim, only far from the 30 s grace.
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_supervisor_ends_its_session() {
    let (gw, sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    drop(sup); // SIGKILL
    // Like the real gateway, the test gateway demotes the sandbox when the stream ends.
    let deadline = std::time::Instant::now() + LONG;
    while gw.state.is_ready() {
        assert!(std::time::Instant::now() < deadline, "session never ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_without_exit_status_is_unavailable() {
    let (gw, mut sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let marker = sup.workdir.join("running");
    let st = gw.state.clone();
    // `exec`, so the sleeper is the shell process itself and its pid is in the marker: the
    // test kills it at the end (a supervisor killed with SIGKILL cannot; in a pod the PID
    // namespace dies with it).
    let req = gw.request(&[
        "sh",
        "-c",
        &format!("echo $$ > {}; exec sleep 1000", marker.display()),
    ]);
    let running = tokio::spawn(async move { exec_collect(st, req).await });
    wait_started(&marker, &sup).await;
    // The supervisor dies mid-exec: the gateway sees the relay end with no exit status.
    sup.signal(libc::SIGKILL);
    let r = running.await.unwrap();
    let status = r
        .status
        .expect("no exit status means an error, not an exit code");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("exit status"), "{status:?}");
    let _ = sup.wait_exit(LONG).await;
    if let Some(pid) = std::fs::read_to_string(&marker)
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
    {
        // SAFETY: kill(2) with integer arguments; at worst the pid is already gone.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn main_process_timeout_is_124_and_reported() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let mut sup = Supervisor::start(
        &gw,
        SupOpts {
            args: vec![
                "--timeout".into(),
                "2".into(),
                "sleep".into(),
                "1000".into(),
            ],
            ..Default::default()
        },
    );
    gw.wait_ready(&mut sup).await;
    let status = sup.wait_exit(LONG).await;
    assert_eq!(status.code(), Some(124), "{}", sup.log());
    assert_eq!(gw.state.seen().reports[0].exit_code, 124);
}

/// A TCP proxy whose connections can be frozen: bytes stop flowing both ways while both
/// sockets stay open, as when a gateway node vanishes without a FIN or RST. Connections
/// accepted after `freeze` flow normally.
struct FreezeProxy {
    port: u16,
    frozen_below: std::sync::Arc<std::sync::atomic::AtomicU64>,
    next: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl FreezeProxy {
    async fn start(target: u16) -> FreezeProxy {
        use std::sync::Arc;
        use std::sync::atomic::AtomicU64;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let frozen_below = Arc::new(AtomicU64::new(0));
        let next = Arc::new(AtomicU64::new(0));
        let (fb, nx) = (frozen_below.clone(), next.clone());
        tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let id = nx.fetch_add(1, Ordering::SeqCst);
                let Ok(up) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else {
                    continue;
                };
                let (dr, dw) = down.into_split();
                let (ur, uw) = up.into_split();
                tokio::spawn(pipe(dr, uw, id, fb.clone()));
                tokio::spawn(pipe(ur, dw, id, fb.clone()));
            }
        });
        FreezeProxy {
            port,
            frozen_below,
            next,
        }
    }

    /// Freeze every connection accepted so far.
    fn freeze(&self) {
        self.frozen_below
            .store(self.next.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

async fn pipe(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    id: u64,
    frozen_below: std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if id < frozen_below.load(Ordering::SeqCst) {
            // Swallow this and everything after it; both sockets stay open (borrowed here)
            // for as long as the test runs.
            let _keep = (&r, &w);
            std::future::pending::<()>().await;
        }
        if w.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_pings_detect_a_silent_gateway_and_the_session_moves_on() {
    // A gateway that stops answering without closing anything gives the supervisor no error
    // to react to: heartbeats go into the socket buffer and nobody is told. Only the HTTP/2
    // PING, unanswered past its timeout, shows the connection is dead.
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let proxy = FreezeProxy::start(gw.server.addr.port()).await;
    let mut sup = Supervisor::start(
        &gw,
        SupOpts {
            env: vec![(
                "OPENSHELL_ENDPOINT".into(),
                format!("https://localhost:{}", proxy.port),
            )],
            args: ["--keepalive-interval", "1", "--keepalive-timeout", "2"]
                .map(String::from)
                .to_vec(),
            ..Default::default()
        },
    );
    gw.wait_ready(&mut sup).await;
    assert_eq!(gw.sh("echo before").await.out(), "before\n");
    assert_eq!(gw.state.seen().hellos.len(), 1);

    proxy.freeze();
    let frozen_at = std::time::Instant::now();
    // The gateway still holds the old session (its socket is open), so the sign of detection
    // is a second hello, on a new connection, replacing it.
    let deadline = frozen_at + LONG;
    while gw.state.seen().hellos.len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "no reconnect within {LONG:?} of the gateway going silent; log:\n{}",
            sup.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let detected = frozen_at.elapsed();
    let log = sup.log();
    assert!(
        log.contains("the session stream broke (gateway restarted, connection lost, or HTTP/2 PINGs unanswered)")
            && log.contains("reconnecting to the gateway"),
        "{log}"
    );
    // The token is valid for an hour: nothing refreshes it this early (a refresh issued at
    // start-up used to hang on the frozen connection here).
    assert_eq!(gw.state.seen().refreshed, 0, "{log}");
    // With a 1 s interval and a 2 s timeout the dead connection is noticed after about 3 s,
    // never before the first unanswered PING could have timed out.
    assert!(
        detected >= Duration::from_secs(2),
        "reconnected after {detected:?}, before any PING could have timed out; log:\n{log}"
    );
    eprintln!("silent gateway detected and replaced after {detected:?}");
    let r = gw.sh("echo after").await;
    assert_eq!((r.out(), r.exit), ("after\n".to_string(), Some(0)), "{r:?}");
    assert!(sup.try_status().is_none(), "the supervisor must stay up");
}
