//! `serve` with network rules from the test gateway, through the real binary: the supervisor
//! and the gateway run in the test-made outer namespace (tests/support/egress: upstream
//! addresses on its `lo`, no route anywhere, checked before the first packet); the
//! supervisor has a mount namespace of its own whose `/etc/hosts` is the test's hosts file.
//! A revision with rules is LOADED, the proxy answers with 403s and reasons, a new revision
//! closes an open tunnel, an invalid one quarantines.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use openshell_sandbox::policy::openshell::{
    NetworkBinary, NetworkEndpoint, NetworkPolicyRule, SandboxPolicy,
};
use openshell_sandbox::proto::v1::PolicyStatus;
use support::plane::{SANDBOX_NAME, base_policy, wait_report};
use support::skip::have;
use support::{AuthMode, SupOpts, Supervisor, TestGateway};

fn policy(rules: &[(&str, &str, u16)]) -> SandboxPolicy {
    SandboxPolicy {
        network_policies: rules
            .iter()
            .map(|(key, host, port)| {
                (
                    key.to_string(),
                    NetworkPolicyRule {
                        name: String::new(),
                        endpoints: vec![NetworkEndpoint {
                            host: host.to_string(),
                            port: *port,
                            ..Default::default()
                        }],
                        binaries: ["/usr/bin/curl", "/usr/bin/python3*"]
                            .iter()
                            .map(|p| NetworkBinary {
                                path: p.to_string(),
                                ..Default::default()
                            })
                            .collect(),
                    },
                )
            })
            .collect(),
        ..base_policy(&[])
    }
}

/// The current revision (with the baseline paths the supervisor synced) with these rules.
fn revise(gw: &TestGateway, rules: &[(&str, &str, u16)]) -> SandboxPolicy {
    let mut p = gw.state.current_revision().unwrap().policy;
    p.network_policies = policy(rules).network_policies;
    p
}

/// Open a tunnel to pub.test:8080 and prove it with an echo; print `open`, wait for the
/// proxy to close it (`closed`), then CONNECT again and print that answer's status line and
/// body.
const TUNNEL: &str = r#"
import socket, sys
def connect():
    s = socket.create_connection(("10.200.0.1", 3128))
    s.sendall(b"CONNECT pub.test:8080 HTTP/1.1\r\nHost: pub.test:8080\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        b = s.recv(1)
        if not b: break
        head += b
    return s, head.decode()
s, head = connect()
assert head.startswith("HTTP/1.1 200"), head
s.sendall(b"ping\n")
assert s.recv(5) == b"ping\n"
print("open", flush=True)
s.settimeout(60)
print("closed" if s.recv(1) == b"" else "data", flush=True)
s, head = connect()
body = b""
s.settimeout(10)
try:
    while True:
        b = s.recv(4096)
        if not b: break
        body += b
except OSError:
    pass
print(head.splitlines()[0], flush=True)
print(body.decode(), flush=True)
"#;

fn wrapper(hosts: &Path) -> Vec<String> {
    vec![
        "unshare".into(),
        "-m".into(),
        "--propagation".into(),
        "private".into(),
        "sh".into(),
        "-c".into(),
        format!(
            "mount --bind {} /etc/hosts && exec \"$0\" \"$@\"",
            hosts.display()
        ),
    ]
}

#[test]
fn serve_loads_network_rules_publishes_revisions_and_quarantines() {
    if !support::egress::require() || !have("curl") || !have("python3") || !have("unshare") {
        return;
    }
    support::egress::World::run(|w| {
        let hosts = w.hosts.clone();
        let upstream = w.upstream.clone();
        w.rt.block_on(async move {
            let gw = TestGateway::start(AuthMode::Jwt).await;
            gw.state
                .set_policy(&policy(&[("pub_http", "pub.test", 8080)]))
                .unwrap();
            let opts = SupOpts {
                env: vec![
                    ("OPENSHELL_SANDBOX".into(), SANDBOX_NAME.into()),
                    ("OPENSHELL_POLICY_POLL_INTERVAL_SECS".into(), "1".into()),
                    (
                        "OPENSHELL_LOCAL_POLICY_PATH".into(),
                        "/nonexistent/openshell/policy.yaml".into(),
                    ),
                ],
                wrapper: wrapper(&hosts),
                ..Default::default()
            };
            let mut sup = Supervisor::start(&gw, opts);
            gw.wait_ready(&mut sup).await;
            // The baseline paths are added and synced back; that revision is the one loaded.
            let v = gw.state.current_revision().unwrap().version;
            let r = wait_report(&gw, v, &sup).await;
            let (status, err) = (r.status, r.load_error);
            assert_eq!(status, PolicyStatus::Loaded as i32, "{err}");

            let r = gw
                .sh("curl -sS --max-time 20 http://pub.test:8080/ok; echo; curl -sS --max-time 20 http://other.test:8080/no")
                .await;
            let out = r.out();
            let lines: Vec<&str> = out.lines().collect();
            assert!(lines.len() >= 2, "{r:?}\n{}", sup.log());
            let ok: serde_json::Value = serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("{e}: {r:?}"));
            assert_eq!(ok["request"], "GET /ok HTTP/1.1");
            let no: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
            assert_eq!(no["error"], "policy_denied");
            assert_eq!(no["reason"], "endpoint other.test:8080 is not allowed by any policy");
            assert_eq!(upstream.count(support::egress::PRIVATE2), 0);

            // A new revision closes the open tunnel; a new CONNECT is admitted under it.
            let before = upstream.total();
            let tunnel = gw.exec(&["python3", "-c", TUNNEL]);
            let publish = async {
                let end = Instant::now() + Duration::from_secs(30);
                while upstream.total() == before {
                    assert!(Instant::now() < end, "the tunnel never reached upstream");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                let v2 = gw
                    .state
                    .set_policy(&revise(&gw, &[("pub_http", "pub.test", 8080), ("other", "other.test", 8080)]))
                    .unwrap();
                let r = wait_report(&gw, v2, &sup).await;
            let (status, err) = (r.status, r.load_error);
                assert_eq!(status, PolicyStatus::Loaded as i32, "{err}");
            };
            let (r, ()) = tokio::join!(tunnel, publish);
            let out = r.out();
            let lines: Vec<&str> = out.lines().collect();
            assert_eq!(&lines[..3], ["open", "closed", "HTTP/1.1 200 Connection Established"], "{r:?}\n{}", sup.log());

            // An invalid revision (fail_closed) quarantines: the open tunnel closes, a new
            // CONNECT gets the 403 saying why.
            let before = upstream.total();
            let tunnel = gw.exec(&["python3", "-c", TUNNEL]);
            let publish = async {
                let end = Instant::now() + Duration::from_secs(30);
                while upstream.total() == before {
                    assert!(Instant::now() < end, "the tunnel never reached upstream");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                let v3 = gw
                    .state
                    .set_policy(&revise(&gw, &[("pub_http", "pub.test", 8080), ("bad", "*.com", 443)]))
                    .unwrap();
                let r = wait_report(&gw, v3, &sup).await;
            let (status, err) = (r.status, r.load_error);
                assert_eq!(status, PolicyStatus::Failed as i32, "{err}");
                assert!(err.contains("network_policies.bad"), "{err}");
            };
            let (r, ()) = tokio::join!(tunnel, publish);
            let out = r.out();
            let lines: Vec<&str> = out.lines().collect();
            assert_eq!(&lines[..3], ["open", "closed", "HTTP/1.1 403 Forbidden"], "{r:?}\n{}", sup.log());
            let body: serde_json::Value = serde_json::from_str(lines[3]).unwrap_or_else(|e| panic!("{e}: {r:?}"));
            assert_eq!(body["error"], "policy_denied");
            assert!(
                body["reason"].as_str().unwrap().contains("fail-closed quarantine is active"),
                "{body}"
            );

            // Every decision went to the gateway's log as OCSF Network Activity.
            let end = Instant::now() + Duration::from_secs(20);
            loop {
                let lines = gw.state.log_lines();
                let net: Vec<&str> = lines
                    .iter()
                    .map(|l| l.message.as_str())
                    .filter(|m| m.starts_with("NET:") || m.starts_with("HTTP:"))
                    .collect();
                let found = net.iter().any(|m| m.starts_with("HTTP:GET [INFO] ALLOWED /usr/bin/curl("))
                    && net.iter().any(|m| m.starts_with("HTTP:GET [MED] DENIED /usr/bin/curl("))
                    && net.iter().any(|m| m.starts_with("NET:CLOSE "))
                    && net.iter().any(|m| m.starts_with("NET:OPEN [MED] DENIED ") && m.contains("quarantine"));
                if found {
                    break;
                }
                assert!(Instant::now() < end, "OCSF network events in the log push: {net:#?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            drop(sup);
        });
    });
}
