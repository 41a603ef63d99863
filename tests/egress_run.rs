//! `run` and `check` with network rules, through the real binary: the supervisor runs in the
//! test-made outer namespace (tests/support/egress: upstream addresses on its `lo`, no route
//! anywhere, checked before the first packet) with a mount namespace of its own whose
//! `/etc/hosts` is the test's hosts file, so that nothing on the machine changes.

mod support;

use std::process::Command;
use std::time::Duration;

use support::egress::binary::{BIN, finish, osb};
use support::egress::*;
use support::skip::have;
use support::text;

const POLICY: &str = "\
version: 1
filesystem_policy:
  include_workdir: true
  read_only: [/usr, /lib, /lib64, /bin, /etc]
  read_write: [/tmp]
network_policies:
  pub_curl:
    endpoints:
      - host: pub.test
        port: 8080
    binaries:
      - path: /usr/bin/curl
";

/// A client that ignores the proxy: the errno of a direct connect, by name.
const DIRECT: &str = "import socket,errno
s=socket.socket()
try:
    s.connect(('192.88.99.10',8080)); print('CONNECTED')
except OSError as e:
    print(errno.errorcode[e.errno])";

#[test]
fn run_with_network_policies_reaches_the_allowed_upstream_only() {
    if !require() || !have("curl") || !have("python3") {
        return;
    }
    World::run(|w| {
        let work = w.tmp.path().join("work");
        std::fs::create_dir(&work).unwrap();
        std::fs::write(work.join("policy.yaml"), POLICY).unwrap();
        let script = format!(
            "env | grep -c -e '^HTTP_PROXY=http://10.200.0.1:3128$' -e '^NODE_USE_ENV_PROXY=1$' -e '^NO_PROXY=127.0.0.1,localhost,::1$'
curl -sS --max-time 20 http://pub.test:8080/allowed; echo
curl -sS --max-time 20 http://other.test:8080/denied; echo
python3 -c \"{DIRECT}\""
        );
        let mut c = osb(&w.hosts, &work);
        c.args([
            "run",
            "--log-level",
            "warn,egress=info",
            "--policy",
            "policy.yaml",
            "--report-json",
        ])
        .arg(work.join("report.json"))
        .args(["--", "sh", "-c", &script]);
        let out = finish(c, Duration::from_secs(120));
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines[0], "3", "the proxy variables: {stdout}");
        let ok: serde_json::Value =
            serde_json::from_str(lines[1]).unwrap_or_else(|e| panic!("{e}: {stdout}"));
        assert_eq!(ok["request"], "GET /allowed HTTP/1.1");
        let denied: serde_json::Value =
            serde_json::from_str(lines[2]).unwrap_or_else(|e| panic!("{e}: {stdout}"));
        assert_eq!(denied["error"], "policy_denied");
        assert_eq!(
            denied["reason"],
            "endpoint other.test:8080 is not allowed by any policy"
        );
        assert_eq!(lines[3], "ENETUNREACH", "{stdout}");
        // The denied upstream saw nothing, the allowed one exactly the one request.
        assert_eq!(w.upstream.count(PRIVATE2), 0);
        assert_eq!(w.upstream.count(PUBLIC), 1);
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(work.join("report.json")).unwrap()).unwrap();
        assert_eq!(
            report["egress"],
            serde_json::json!({"allowed": 1, "denied": 1, "requests": {"allowed": 0, "audited": 0, "denied": 0}})
        );
        // The local shorthand of each decision.
        let stderr = text(&out.stderr);
        assert!(stderr.contains("ALLOWED /usr/bin/curl"), "{stderr}");
        assert!(stderr.contains("DENIED /usr/bin/curl"), "{stderr}");
    });
}

#[test]
fn run_allow_net_adds_a_rule_for_its_host_and_port() {
    if !require() || !have("curl") {
        return;
    }
    World::run(|w| {
        let work = w.tmp.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let script = "curl -sS --max-time 20 http://pub.test:8080/quick; echo
curl -sS --max-time 20 -o /dev/null -w '%{http_code}' http://pub.test:8081/other-port; echo
curl -sS --max-time 20 -o /dev/null -w '%{http_code}' --proxytunnel http://pub.test:8080/tunnel; echo";
        let mut c = osb(&w.hosts, &work);
        c.args([
            "run",
            "--allow-net",
            "pub.test:8080",
            "--ro",
            "/etc",
            "--",
            "sh",
            "-c",
            script,
        ]);
        let out = finish(c, Duration::from_secs(120));
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        let lines: Vec<&str> = stdout.lines().collect();
        let ok: serde_json::Value =
            serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("{e}: {stdout}"));
        assert_eq!(ok["request"], "GET /quick HTTP/1.1");
        assert_eq!(lines[1], "403", "another port is not allowed: {stdout}");
        assert_eq!(lines[2], "200", "CONNECT to the allowed port: {stdout}");
        // Only the allowed port was dialled.
        let seen = w.upstream.seen.lock().unwrap().clone();
        assert!(seen.iter().all(|a| a.port() == 8080), "{seen:?}");
        assert_eq!(seen.len(), 2);
    });
}

#[test]
fn run_allow_net_bad_input_is_refused_naming_it() {
    for (arg, why) in [
        ("pub.test:0", "the port must be a number from 1 to 65535"),
        ("pub.test:http", "the port must be a number from 1 to 65535"),
        ("*.com", "*.com"),
        ("pub.test,curl", "not absolute"),
        (":443", "the host is empty"),
    ] {
        let out = Command::new(BIN)
            .args(["run", "--allow-net", arg, "--", "true"])
            .output()
            .unwrap();
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{arg}: {stderr}");
        assert!(
            stderr.contains(&format!("--allow-net {arg}: ")),
            "{arg}: {stderr}"
        );
        assert!(stderr.contains(why), "{arg}: {stderr}");
    }
    let out = Command::new(BIN)
        .args([
            "run",
            "--network",
            "all",
            "--allow-net",
            "a.test",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("--allow-net and --network all"),
        "{out:?}"
    );
}

#[test]
fn check_egress_answers_from_the_proxys_decision() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, POLICY).unwrap();
    let check = |args: &[&str]| {
        let out = Command::new(BIN)
            .arg("check")
            .arg("--policy")
            .arg(&policy)
            .args(args)
            .output()
            .unwrap();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let (code, out, err) = check(&["--egress", "PUB.test:8080", "--binary", "/usr/bin/curl"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(
        out.trim(),
        "egress PUB.test:8080 from /usr/bin/curl: allowed by rule 'pub_curl'"
    );
    let (code, out, _) = check(&["--egress", "pub.test:8080", "--binary", "/usr/bin/wget"]);
    assert_eq!(code, Some(1));
    assert!(
        out.contains("denied: binary '/usr/bin/wget' not allowed in policy 'pub_curl'"),
        "{out}"
    );
    let (code, out, _) = check(&["--egress", "pub.test:8081", "--json"]);
    assert_eq!(code, Some(1));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["allowed"], false);
    assert_eq!(
        v["reason"],
        "endpoint pub.test:8081 is not allowed by any policy"
    );
    let (code, out, _) = check(&["--egress", "pub.test:8080"]);
    assert_eq!(code, Some(0));
    assert!(
        out.contains("allowed by rule 'pub_curl' for /usr/bin/curl"),
        "{out}"
    );
    // --allow-net is one more rule for the same decision.
    let (code, out, _) = check(&[
        "--allow-net",
        "pkgs.test:8090",
        "--egress",
        "pkgs.test:8090",
        "--binary",
        "/usr/bin/python3",
    ]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("allowed by rule 'allow-net-1'"), "{out}");
    let (code, _, err) = check(&["--egress", "pub.test"]);
    assert_eq!(code, Some(125));
    assert!(err.contains("--egress pub.test: no port"), "{err}");
    // --explain lists the rules.
    let (_, out, _) = check(&["--explain"]);
    assert!(
        out.contains("  pub_curl: pub.test:8080 <- /usr/bin/curl"),
        "{out}"
    );
}
