//! A plaintext (`http://`) gateway through the real binary: the bearer token goes only to a
//! loopback endpoint unless OPENSHELL_ALLOW_PLAINTEXT_TOKEN accepts the risk, a `localhost`
//! that resolves elsewhere is refused before any dial, and plaintext without a token (v0.0.36)
//! always works.
//!
//! `0.0.0.0` stands for an endpoint off the loopback interface: the supervisor classes it as
//! "not loopback" like any other address, while the kernel delivers a connection to it
//! locally, so the allowed case reaches the test gateway with no packet leaving the machine.

mod support;

use std::time::{Duration, Instant};

use support::*;

const LONG: Duration = Duration::from_secs(60);

fn endpoint(ep: &str) -> SupOpts {
    SupOpts {
        env: vec![("OPENSHELL_ENDPOINT".into(), ep.into())],
        ..Default::default()
    }
}

/// Wait (bounded) until the gateway has no session: the previous supervisor is gone.
async fn wait_demoted(gw: &TestGateway) {
    let deadline = Instant::now() + LONG;
    while gw.state.is_ready() {
        assert!(Instant::now() < deadline, "the old session never ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loopback_endpoint_carries_the_token_without_the_opt_in() {
    let gw = TestGateway::start_with(AuthMode::Jwt, Transport::Plaintext).await;
    let port = gw.server.addr.port();
    for ep in [
        format!("http://localhost:{port}"),
        format!("http://127.0.0.1:{port}"),
    ] {
        let mut sup = Supervisor::start(&gw, endpoint(&ep));
        gw.wait_ready(&mut sup).await;
        let r = gw.sh("echo over loopback").await;
        assert_eq!(r.out(), "over loopback\n", "{ep}: {r:?}\n{}", sup.log());
        let seen = gw.state.seen();
        // The gateway recorded the bearer it was sent with the hello.
        let auth = seen.hello_auth.last().cloned().flatten();
        assert!(
            auth.is_some_and(|t| t.split('.').count() == 3),
            "{ep}: the hello carried no token"
        );
        let log = sup.log();
        assert!(
            log.contains("plaintext gateway connection over loopback")
                && !log.contains("PLAINTEXT"),
            "{ep}: {log}"
        );
        drop(sup);
        wait_demoted(&gw).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_goes_off_loopback_only_when_the_risk_is_accepted() {
    let gw = TestGateway::start_with(AuthMode::Jwt, Transport::Plaintext).await;
    let ep = format!("http://0.0.0.0:{}", gw.server.addr.port());
    let mut sup = Supervisor::start(&gw, endpoint(&ep));
    let status = sup.wait_exit(LONG).await;
    let log = sup.log();
    assert_eq!(status.code(), Some(125), "{log}");
    for want in [
        "refusing to send the bearer token (OPENSHELL_SANDBOX_TOKEN)",
        ep.as_str(),
        "act as this sandbox's supervisor",
        "OPENSHELL_ALLOW_PLAINTEXT_TOKEN=1",
    ] {
        assert!(log.contains(want), "{want:?} missing:\n{log}");
    }
    assert!(gw.state.seen().hellos.is_empty(), "a hello was sent: {log}");

    // The same endpoint with the risk accepted: the session comes up, loudly.
    let mut opts = endpoint(&ep);
    opts.env
        .push(("OPENSHELL_ALLOW_PLAINTEXT_TOKEN".into(), "1".into()));
    let mut sup = Supervisor::start(&gw, opts);
    gw.wait_ready(&mut sup).await;
    assert_eq!(gw.sh("echo accepted").await.out(), "accepted\n");
    let log = sup.log();
    assert!(
        log.contains("PLAINTEXT gateway connection") && log.contains("bearer token included"),
        "{log}"
    );
    drop(sup);

    // v0.0.36 style: plaintext and no token at all needs nothing, wherever the gateway is.
    let gw = TestGateway::start_with(AuthMode::CertOnly, Transport::Plaintext).await;
    let ep = format!("http://0.0.0.0:{}", gw.server.addr.port());
    let mut sup = Supervisor::start(&gw, endpoint(&ep));
    gw.wait_ready(&mut sup).await;
    let r = gw.sh("echo plain").await;
    assert_eq!((r.out(), r.exit), ("plain\n".to_string(), Some(0)));
}

/// `localhost` counts as loopback only while it resolves to loopback: with an /etc/hosts that
/// maps it to 0.0.0.0 (in a private mount namespace), the supervisor refuses to dial, keeps
/// retrying with the reason, and the gateway (which 0.0.0.0 would reach) never sees a hello.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn localhost_that_resolves_off_loopback_is_never_dialed() {
    let have_unshare = std::path::Path::new("/usr/bin/unshare").exists();
    if !require(
        is_root() && have_unshare,
        "root and unshare(1) (a private mount namespace replaces /etc/hosts)",
    ) {
        return;
    }
    let gw = TestGateway::start_with(AuthMode::Jwt, Transport::Plaintext).await;
    let hosts = gw.dir.path().join("hosts");
    std::fs::write(&hosts, "0.0.0.0 localhost\n").unwrap();
    let swap = format!(
        "mount --bind {} /etc/hosts && exec \"$0\" \"$@\"",
        hosts.display()
    );
    let mut opts = endpoint(&gw.endpoint());
    opts.wrapper = ["unshare", "-m", "sh", "-c", &swap]
        .map(String::from)
        .to_vec();
    opts.args = ["--reconnect-base-ms", "50", "--reconnect-max-ms", "200"]
        .map(String::from)
        .to_vec();
    let mut sup = Supervisor::start(&gw, opts);
    let log = sup
        .wait_log("resolves to 0.0.0.0, which is not a loopback address", LONG)
        .await;
    assert!(log.contains("OPENSHELL_ALLOW_PLAINTEXT_TOKEN"), "{log}");
    // Several attempts later, still nothing reached the gateway.
    sup.wait_log("reconnecting to the gateway", LONG).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        sup.try_status().is_none(),
        "it must keep retrying: {}",
        sup.log()
    );
    assert!(
        gw.state.seen().hellos.is_empty() && !gw.state.is_ready(),
        "a connection was made: {}",
        sup.log()
    );
}

/// `check --gateway` with the pod's env, optionally under a wrapper command; its JSON report.
async fn check(gw: &TestGateway, wrapper: &[&str], extra: &[&str]) -> serde_json::Value {
    let mut cmd = match wrapper.split_first() {
        None => tokio::process::Command::new(BIN),
        Some((w, words)) => {
            let mut c = tokio::process::Command::new(w);
            c.args(words).arg(BIN);
            c
        }
    };
    let out = cmd
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("OPENSHELL_ENDPOINT", gw.endpoint())
        .env("OPENSHELL_SANDBOX_ID", SANDBOX_ID)
        .env(
            "OPENSHELL_SANDBOX_TOKEN",
            gw.state.jwt.mint(SANDBOX_ID, 3600),
        )
        .args(["check", "--gateway", "--json", "--step-timeout", "5"])
        .args(extra)
        .output()
        .await
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn failure(report: &serde_json::Value) -> (String, String) {
    let name = report["first_failure"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let step = report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["step"] == name.as_str())
        .unwrap_or_else(|| panic!("no failing step in {report:#}"));
    (name, step["kind"].as_str().unwrap_or_default().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_a_localhost_off_loopback_and_a_shared_network() {
    let gw = TestGateway::start_with(AuthMode::Jwt, Transport::Plaintext).await;
    // Loopback, the sandbox in its own network namespace: every step passes.
    let ok = check(&gw, &[], &[]).await;
    assert_eq!(ok["ok"], true, "{ok:#}");
    // Sandboxed commands on the supervisor's loopback could squat the gateway's port.
    let shared = check(&gw, &[], &["--network", "all"]).await;
    assert_eq!(
        failure(&shared),
        ("token".into(), "plaintext-token-shared-network".into()),
        "{shared:#}"
    );
    if !require(
        is_root() && std::path::Path::new("/usr/bin/unshare").exists(),
        "root and unshare(1) (a private mount namespace replaces /etc/hosts)",
    ) {
        return;
    }
    let hosts = gw.dir.path().join("hosts-check");
    std::fs::write(&hosts, "0.0.0.0 localhost\n").unwrap();
    let swap = format!(
        "mount --bind {} /etc/hosts && exec \"$0\" \"$@\"",
        hosts.display()
    );
    let off = check(&gw, &["unshare", "-m", "sh", "-c", &swap], &[]).await;
    assert_eq!(
        failure(&off),
        ("dns".into(), "not-loopback".into()),
        "{off:#}"
    );
    assert!(gw.state.seen().hellos.is_empty());
}
