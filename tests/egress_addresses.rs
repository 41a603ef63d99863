//! Which addresses a rule reaches, through the real binary: a host glob that also matches
//! IPv4 literals keeps the public-only plan; `--allow-net` refuses hosts that can only be the
//! sandbox's own; a name that does not resolve says so to the client. The world is
//! tests/support/egress's (upstreams in a test-made namespace with no route).

mod support;

use std::process::Command;
use std::time::Duration;

use support::egress::binary::*;
use support::egress::*;

fn have_curl() -> bool {
    have_path("/usr/bin/curl")
}

#[test]
fn a_glob_matching_ip_literals_reaches_public_addresses_only() {
    if !require() || !have_curl() {
        return;
    }
    World::run(|w| {
        let work = w.tmp.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let script = "curl -sS http://10.77.0.10:8080/private; echo
curl -sS -o /dev/null -w '%{http_connect}' --proxytunnel http://10.77.0.10:8080/tunnel 2>/dev/null; echo
curl -sS http://192.88.99.10:8080/public; echo
curl -sS http://[::ffff:10.77.0.10]:8080/mapped; echo";
        let mut c = osb(&w.hosts, &work);
        c.args([
            "run",
            "--allow-net",
            "*.*.*.*:8080",
            "--ro",
            "/etc",
            "--",
            "sh",
            "-c",
            script,
        ]);
        let out = finish(c, Duration::from_secs(120));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), 4, "{out:?}");
        let private: serde_json::Value =
            serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("{e}: {stdout}"));
        assert_eq!(private["error"], "ssrf_denied", "{private}");
        assert_eq!(
            private["detail"],
            "GET 10.77.0.10:8080 blocked: internal address"
        );
        assert_eq!(lines[1], "403", "CONNECT to the private literal: {stdout}");
        let public: serde_json::Value = serde_json::from_str(lines[2]).unwrap();
        assert_eq!(public["request"], "GET /public HTTP/1.1");
        let mapped: serde_json::Value = serde_json::from_str(lines[3]).unwrap();
        assert_eq!(mapped["error"], "ssrf_denied", "{mapped}");
        assert_eq!(
            w.upstream.count(PRIVATE),
            0,
            "the private upstream saw nothing"
        );
        assert_eq!(w.upstream.count(PUBLIC), 1);
    });
}

#[test]
fn a_rule_naming_the_private_literal_reaches_it() {
    if !require() || !have_curl() {
        return;
    }
    World::run(|w| {
        let work = w.tmp.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let mut c = osb(&w.hosts, &work);
        c.args([
            "run",
            "--allow-net",
            "10.77.0.10:8080",
            "--ro",
            "/etc",
            "--",
            "curl",
            "-sS",
            "http://10.77.0.10:8080/named",
        ]);
        let out = finish(c, Duration::from_secs(120));
        let body: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
        assert_eq!(body["request"], "GET /named HTTP/1.1");
        assert_eq!(w.upstream.count(PRIVATE), 1);
    });
}

#[test]
fn allow_net_refuses_hosts_that_can_only_be_the_sandboxs_own() {
    for (arg, why) in [
        ("localhost:8080", "localhost is loopback, the sandbox's own"),
        ("LOCALHOST", "LOCALHOST is loopback"),
        ("app.localhost:3000", "app.localhost is loopback"),
        ("127.0.0.1:8080", "127.0.0.1 is loopback"),
        ("127.1:80", "127.1 is loopback"),
        ("2130706433:80", "2130706433 is loopback"),
        ("[::1]:8080", "::1 is loopback"),
        ("[::ffff:127.0.0.1]:80", "::ffff:127.0.0.1 is loopback"),
        ("0.0.0.0:80", "0.0.0.0 is the unspecified address"),
        (
            "169.254.169.254:80",
            "169.254.169.254 is a link-local address",
        ),
    ] {
        let out = Command::new(BIN)
            .args(["run", "--allow-net", arg, "--", "true"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{arg}: {stderr}");
        assert!(
            stderr.contains(&format!("--allow-net {arg}: {why}")),
            "{arg}: {stderr}"
        );
        assert!(
            stderr.contains("the proxy never connects to"),
            "{arg}: {stderr}"
        );
    }
}

#[test]
fn a_name_that_does_not_resolve_is_reported_as_such() {
    if !require() || !have_curl() {
        return;
    }
    World::run(|w| {
        let work = w.tmp.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let mut c = osb(&w.hosts, &work);
        c.args([
            "run",
            "--allow-net",
            "nx.test:8080",
            "--ro",
            "/etc",
            "--",
            "curl",
            "-sS",
            "http://nx.test:8080/x",
        ]);
        let out = finish(c, Duration::from_secs(120));
        let body: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
        // OpenShell's code, and the real reason rather than an address-check kind.
        assert_eq!(body["error"], "ssrf_denied", "{body}");
        let d = body["detail"].as_str().unwrap();
        assert!(
            d.starts_with("GET nx.test:8080 blocked: DNS resolution failed for nx.test:8080: "),
            "{d}"
        );
        assert_eq!(w.upstream.total(), 0);
    });
}

#[test]
fn every_spelling_of_a_private_address_is_internal_to_a_glob() {
    if !require() {
        return;
    }
    World::run(|w| {
        // Host globs of three and four labels match numeric hosts that are not dotted quads
        // (inet_aton's hex, octal and short forms, which the supervisor's resolver reads as
        // IPv4) and IPv6 forms that embed an IPv4 address: each is the private upstream, and a
        // glob reaches public addresses only.
        let work = w.tmp.path().join("work");
        std::fs::create_dir(&work).unwrap();
        std::fs::write(
            work.join("policy.yaml"),
            "version: 1
filesystem_policy:
  include_workdir: true
  read_only: [/usr, /lib, /lib64, /bin, /etc]
network_policies:
  globs:
    endpoints:
      - {host: \"*.*.*\", port: 8080}
      - {host: \"*.*.*.*\", port: 8080}
    binaries: [{path: \"/**\"}]
",
        )
        .unwrap();
        let hostile = work.join("hostile");
        cc(&support_file("hostile.c"), &hostile, &["-pthread"]);
        let forms = [
            "0x0a.0x4d.0.0x0a",
            "012.0115.0.012",
            "10.77.10",
            "0x0a.0x4d.0x0a",
            "[::ffff:10.77.0.10]",
            "[::ffff:0:10.77.0.10]",
            "[64:ff9b::10.77.0.10]",
            "[::10.77.0.10]",
        ];
        let script: Vec<String> = forms
            .iter()
            .map(|f| format!("{} conn {f}:8080", hostile.display()))
            .collect();
        let mut c = osb(&w.hosts, &work);
        c.args(["run", "--policy", "policy.yaml", "--", "sh", "-c"])
            .arg(script.join("; "));
        let out = finish(c, Duration::from_secs(120));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let answers: Vec<&str> = stdout.lines().collect();
        assert_eq!(answers.len(), 2 * forms.len(), "{out:?}");
        for (i, form) in forms.iter().enumerate() {
            assert_eq!(answers[2 * i], "HTTP/1.1 403 Forbidden", "{form}: {stdout}");
            let body: serde_json::Value =
                serde_json::from_str(answers[2 * i + 1].strip_prefix("BODY ").unwrap()).unwrap();
            assert_eq!(body["error"], "ssrf_denied", "{form}: {body}");
            let d = body["detail"].as_str().unwrap();
            assert!(d.ends_with("blocked: internal address"), "{form}: {d}");
        }
        assert_eq!(w.upstream.count(PRIVATE), 0);
    });
}
