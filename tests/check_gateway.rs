//! `openshell-sandbox check --gateway` through the real binary: every troubleshooting row the
//! binary can observe (installer/chart/README.md) is produced here against the test gateway,
//! with the supervisor itself showing the symptom, and then `check --gateway`, run with the same
//! env, must name the step and the cause.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use support::*;
use tonic::Code;

const OTHER_SANDBOX: &str = "0b7c5a61-0000-4000-8000-00000000beef";

/// The env `Supervisor::start` gives the supervisor, with the same override rules (an empty
/// value removes the variable), so the check sees exactly what the pod sees.
fn pod_env(gw: &TestGateway, overrides: &[(String, String)]) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    let mut set = |k: &str, v: String| {
        env.insert(k.to_owned(), v);
    };
    set("PATH", "/usr/local/bin:/usr/bin:/bin".into());
    set("OPENSHELL_ENDPOINT", gw.endpoint());
    set("OPENSHELL_SANDBOX_ID", SANDBOX_ID.into());
    set("OPENSHELL_TLS_CA", path_str(&gw.client.ca));
    set("OPENSHELL_TLS_CERT", path_str(&gw.client.cert));
    set("OPENSHELL_TLS_KEY", path_str(&gw.client.key));
    if gw.state.auth == AuthMode::Jwt {
        set(
            "OPENSHELL_SANDBOX_TOKEN",
            gw.state.jwt.mint(SANDBOX_ID, 3600),
        );
    }
    for (k, v) in overrides {
        if v.is_empty() {
            env.remove(k);
        } else {
            env.insert(k.clone(), v.clone());
        }
    }
    env
}

fn opts(env: &[(&str, &str)]) -> SupOpts {
    SupOpts {
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

struct Checked {
    code: i32,
    json: Value,
}

impl Checked {
    fn step(&self, name: &str) -> &Value {
        self.json["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["step"] == name)
            .unwrap_or_else(|| panic!("no step {name} in {:#}", self.json))
    }

    /// The first failing step must be `step` with cause `kind`; returns its detail.
    fn first_failure(&self, step: &str, kind: &str) -> String {
        assert_eq!(self.code, 1, "{:#}", self.json);
        assert_eq!(self.json["ok"], false);
        assert_eq!(self.json["first_failure"], step, "{:#}", self.json);
        let s = self.step(step);
        assert_eq!(s["status"], "failed", "{s:#}");
        assert_eq!(s["kind"], kind, "{s:#}");
        assert!(
            !s["fix"].as_str().unwrap_or("").is_empty(),
            "a failure names its fix: {s:#}"
        );
        s["detail"].as_str().unwrap().to_owned()
    }
}

async fn check(env: &BTreeMap<String, String>, extra: &[&str]) -> Checked {
    let out = tokio::process::Command::new(BIN)
        .env_clear()
        .envs(env)
        .args(["check", "--gateway", "--json", "--step-timeout", "5"])
        .args(extra)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "check --gateway --json printed no JSON ({e}):\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    Checked {
        code: out.status.code().unwrap_or(-1),
        json,
    }
}

/// The supervisor never gets a session within `d` (the "never READY" symptom).
async fn never_ready(gw: &TestGateway, sup: &mut Supervisor, d: Duration) {
    tokio::time::sleep(d).await;
    assert!(!gw.state.is_ready(), "the session came up:\n{}", sup.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_pod_passes_every_step_and_the_live_session_is_untouched() {
    let (gw, _sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let hellos = gw.state.seen().hellos.len();
    let env = pod_env(&gw, &[]);
    let c = check(&env, &[]).await;
    assert_eq!(c.code, 0, "{:#}", c.json);
    for s in c.json["steps"].as_array().unwrap() {
        assert_eq!(s["status"], "ok", "{s:#}");
    }
    assert!(
        gw.state.seen().config_calls >= 1,
        "GetSandboxConfig was called"
    );
    // No hello: the live supervisor's session is the same one, and still serves execs.
    assert_eq!(gw.state.seen().hellos.len(), hellos);
    assert!(gw.state.is_ready());
    assert_eq!(gw.exec(&["true"]).await.exit, Some(0));

    // The human form: one line per step.
    let out = tokio::process::Command::new(BIN)
        .env_clear()
        .envs(&env)
        .args(["check", "--gateway"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    for step in ["endpoint", "dns", "tcp", "tls", "token", "health", "config"] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(step) && l.contains(" ok: ")),
            "{step}: {text}"
        );
    }
    assert_eq!(gw.state.seen().hellos.len(), hellos);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_endpoint_is_never_ready_and_named() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let mut o = opts(&[("OPENSHELL_ENDPOINT", "")]);
    o.args = vec!["sleep".into(), "30".into()];
    let mut sup = Supervisor::start(&gw, o.clone());
    never_ready(&gw, &mut sup, Duration::from_secs(2)).await;
    assert!(gw.state.seen().hellos.is_empty());
    let mut env = pod_env(&gw, &o.env);
    env.insert(
        "OPENSHELL_MAIN_PROCESS_SPEC".into(),
        r#"{"version":1,"command":["sleep","30"]}"#.into(),
    );
    let d = check(&env, &[])
        .await
        .first_failure("endpoint", "endpoint-missing");
    assert!(d.contains("OPENSHELL_ENDPOINT"), "{d}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_endpoint_is_named() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let o = opts(&[("OPENSHELL_ENDPOINT", "ftp://localhost:1")]);
    let mut sup = Supervisor::start(&gw, o.clone());
    let st = sup.wait_exit(Duration::from_secs(20)).await;
    assert!(!st.success(), "the supervisor refuses the endpoint");
    let d = check(&pod_env(&gw, &o.env), &[])
        .await
        .first_failure("endpoint", "endpoint-invalid");
    assert!(d.contains("scheme"), "{d}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolvable_service_name_is_named() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let ep = "https://openshell.no-such-namespace.invalid:8080";
    let env = pod_env(&gw, &[("OPENSHELL_ENDPOINT".into(), ep.into())]);
    let d = check(&env, &[]).await.first_failure("dns", "dns-failed");
    assert!(d.contains("openshell.no-such-namespace.invalid"), "{d}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_that_is_down_is_a_refused_connection() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let env = pod_env(&gw, &[]);
    gw.server.kill();
    // Nothing listens on the port once the listener task is gone.
    tokio::time::sleep(Duration::from_millis(200)).await;
    check(&env, &[])
        .await
        .first_failure("tcp", "connection-refused");
}

/// A wrong CA mounted: the supervisor never gets a session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_is_never_ready_and_named() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let other = pki::Ca::new("some-other-ca");
    let wrong = gw.dir.path().join("wrong-ca.crt");
    std::fs::write(&wrong, &other.pem).unwrap();
    let o = opts(&[("OPENSHELL_TLS_CA", &path_str(&wrong))]);
    let mut sup = Supervisor::start(&gw, o.clone());
    never_ready(&gw, &mut sup, Duration::from_secs(2)).await;
    assert!(gw.state.seen().hellos.is_empty());
    let d = check(&pod_env(&gw, &o.env), &[])
        .await
        .first_failure("tls", "wrong-ca");
    assert!(d.contains("OPENSHELL_TLS_CA"), "{d}");
}

/// The UNAVAILABLE row: the gateway's PKI was rotated and restarted, but the sandbox
/// namespace still holds the old client Secret. The gateway's store still says READY (it
/// crashed, so nothing demoted the phase), the supervisor cannot reconnect, and every exec
/// fails with UNAVAILABLE "supervisor session not connected". The check names the stale CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execs_unavailable_after_a_ca_rotation_are_named() {
    let (mut gw, _sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    assert_eq!(gw.exec(&["true"]).await.exit, Some(0));
    gw.rotate_ca(pki::Ca::new("rotated-ca")).await;
    gw.state.set_ready(true);
    let r = gw.exec(&["true"]).await;
    let status = r.status.expect("the exec fails");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("not connected"), "{status:?}");
    let d = check(&pod_env(&gw, &[]), &[])
        .await
        .first_failure("tls", "wrong-ca");
    assert!(d.contains("OPENSHELL_TLS_CA"), "{d}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_server_name_is_named() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let o = opts(&[("OPENSHELL_GATEWAY_TLS_SERVER_NAME", "gateway.wrong.example")]);
    let mut sup = Supervisor::start(&gw, o.clone());
    never_ready(&gw, &mut sup, Duration::from_secs(2)).await;
    let d = check(&pod_env(&gw, &o.env), &[])
        .await
        .first_failure("tls", "wrong-server-name");
    assert!(d.contains("gateway.wrong.example"), "{d}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_client_certificate_is_named() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let files = pki::ClientFiles::write(
        &gw.dir.path().join("expired"),
        &gw.ca.pem,
        &gw.ca.expired_client(),
    );
    let o = opts(&[
        ("OPENSHELL_TLS_CERT", &path_str(&files.cert)),
        ("OPENSHELL_TLS_KEY", &path_str(&files.key)),
    ]);
    let mut sup = Supervisor::start(&gw, o.clone());
    never_ready(&gw, &mut sup, Duration::from_secs(2)).await;
    let d = check(&pod_env(&gw, &o.env), &[])
        .await
        .first_failure("tls", "client-cert-expired");
    assert!(
        d.contains("expired") && d.contains("OPENSHELL_TLS_CERT"),
        "{d}"
    );
}

/// A client certificate the gateway does not trust passes every local check; only the gateway's
/// alert after the handshake shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_the_gateway_refuses_is_named() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let other = pki::Ca::new("not-the-client-ca");
    let files =
        pki::ClientFiles::write(&gw.dir.path().join("foreign"), &gw.ca.pem, &other.client());
    let o = opts(&[
        ("OPENSHELL_TLS_CERT", &path_str(&files.cert)),
        ("OPENSHELL_TLS_KEY", &path_str(&files.key)),
    ]);
    let mut sup = Supervisor::start(&gw, o.clone());
    never_ready(&gw, &mut sup, Duration::from_secs(2)).await;
    check(&pod_env(&gw, &o.env), &[])
        .await
        .first_failure("tls", "client-cert-refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_key_is_named() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let missing = gw.dir.path().join("no-such-dir/tls.key");
    let o = opts(&[("OPENSHELL_TLS_KEY", &path_str(&missing))]);
    let mut sup = Supervisor::start(&gw, o.clone());
    never_ready(&gw, &mut sup, Duration::from_secs(2)).await;
    let d = check(&pod_env(&gw, &o.env), &[])
        .await
        .first_failure("tls", "unreadable-file");
    assert!(
        d.contains("OPENSHELL_TLS_KEY") && d.contains("no-such-dir"),
        "{d}"
    );
}

/// The PERMISSION_DENIED row: a token for another sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_for_another_sandbox_is_permission_denied_and_named() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let tok = gw.state.jwt.mint(OTHER_SANDBOX, 3600);
    let o = opts(&[("OPENSHELL_SANDBOX_TOKEN", &tok)]);
    let mut sup = Supervisor::start(&gw, o.clone());
    sup.wait_log("PermissionDenied", Duration::from_secs(20))
        .await;
    never_ready(&gw, &mut sup, Duration::ZERO).await;
    let d = check(&pod_env(&gw, &o.env), &[])
        .await
        .first_failure("token", "token-sandbox-mismatch");
    assert!(
        d.contains(OTHER_SANDBOX) && d.contains("PERMISSION_DENIED"),
        "{d}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_from_another_gateway_is_rejected_and_named() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let tok = jwt::JwtIssuer::new().mint(SANDBOX_ID, 3600);
    let o = opts(&[("OPENSHELL_SANDBOX_TOKEN", &tok)]);
    let mut sup = Supervisor::start(&gw, o.clone());
    never_ready(&gw, &mut sup, Duration::from_secs(2)).await;
    let c = check(&pod_env(&gw, &o.env), &[]).await;
    let d = c.first_failure("config", "token-rejected");
    assert!(d.contains("Unauthenticated"), "{d}");
    assert_eq!(c.step("health")["status"], "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_against_a_token_gateway_is_named() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let o = opts(&[("OPENSHELL_SANDBOX_TOKEN", "")]);
    let mut sup = Supervisor::start(&gw, o.clone());
    never_ready(&gw, &mut sup, Duration::from_secs(2)).await;
    let c = check(&pod_env(&gw, &o.env), &[]).await;
    c.first_failure("config", "no-token");
    assert_eq!(c.step("token")["status"], "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_account_exchange_is_checked() {
    let (gw, _sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let sa = gw.dir.path().join("sa-token");
    std::fs::write(&sa, format!("{}\n", gw.state.sa_token)).unwrap();
    let env = pod_env(
        &gw,
        &[
            ("OPENSHELL_SANDBOX_TOKEN".into(), String::new()),
            ("OPENSHELL_K8S_SA_TOKEN_FILE".into(), path_str(&sa)),
        ],
    );
    let c = check(&env, &[]).await;
    assert_eq!(c.code, 0, "{:#}", c.json);
    let detail = c.step("token")["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("exchanged") && detail.contains(SANDBOX_ID),
        "{detail}"
    );

    // A service-account token the gateway does not accept.
    std::fs::write(&sa, "some-other-service-account").unwrap();
    let d = check(&env, &[])
        .await
        .first_failure("token", "token-exchange-failed");
    assert!(d.contains("IssueSandboxToken"), "{d}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_over_plaintext_is_refused_and_named() {
    let gw = TestGateway::start_with(AuthMode::Jwt, Transport::Plaintext).await;
    // Not loopback to the supervisor's check (tests/gateway_plaintext.rs says why 0.0.0.0),
    // yet delivered locally.
    let off_loopback = format!("http://0.0.0.0:{}", gw.server.addr.port());
    let o = opts(&[("OPENSHELL_ENDPOINT", &off_loopback)]);
    let mut sup = Supervisor::start(&gw, o.clone());
    let st = sup.wait_exit(Duration::from_secs(20)).await;
    assert!(!st.success());
    assert!(
        sup.log().contains("OPENSHELL_ALLOW_PLAINTEXT_TOKEN"),
        "{}",
        sup.log()
    );
    let c = check(&pod_env(&gw, &o.env), &[]).await;
    let d = c.first_failure("token", "plaintext-token");
    assert!(d.contains("OPENSHELL_SANDBOX_TOKEN"), "{d}");
    // The steps before it still ran.
    assert_eq!(c.step("tcp")["status"], "ok");
    // Allowed, every step passes.
    let allowed = opts(&[
        ("OPENSHELL_ENDPOINT", &off_loopback),
        ("OPENSHELL_ALLOW_PLAINTEXT_TOKEN", "1"),
    ]);
    let c = check(&pod_env(&gw, &allowed.env), &[]).await;
    assert_eq!(c.code, 0, "{:#}", c.json);
    // A loopback endpoint needs no opt-in.
    let c = check(&pod_env(&gw, &[]), &[]).await;
    assert_eq!(c.code, 0, "{:#}", c.json);
}

/// The "main process exits at once" row: the pod's main command is not in the image, the
/// supervisor exits at once without ever opening a session, and the check names the program.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_main_process_that_cannot_start_is_named() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let spec = r#"{"version":1,"command":["/nonexistent/agent","--serve"],"tty":false}"#;
    let o = opts(&[("OPENSHELL_MAIN_PROCESS_SPEC", spec)]);
    let mut sup = Supervisor::start(&gw, o.clone());
    let st = sup.wait_exit(Duration::from_secs(30)).await;
    assert!(!st.success());
    assert!(sup.log().contains("command not found"), "{}", sup.log());
    assert!(gw.state.seen().hellos.is_empty());
    let c = check(&pod_env(&gw, &o.env), &[]).await;
    let d = c.first_failure("main-process", "main-process-not-runnable");
    assert!(
        d.contains("/nonexistent/agent") && d.contains("does not exist"),
        "{d}"
    );
    // The dial-back path itself is fine.
    assert_eq!(c.step("config")["status"], "ok");
}
