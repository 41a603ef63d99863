//! The egress proxy end to end, L4: real clients inside a sandbox network namespace, the
//! proxy's listener made there by the production code, upstream servers in a test-made outer
//! namespace with no route anywhere (tests/support/egress), under
//! the policy `P1` below: an endpoint of each form.

mod support;

use std::time::{Duration, Instant};

use openshell_sandbox::egress::{Outcome, ProxyConfig, Via};
use support::egress::*;

const P1: &str = r#"
  pub_http:
    name: public-http
    endpoints:
      - host: pub.test
        port: 8080
      - host: "*.wild.test"
        ports: [8080, 8443]
      - host: "**.deep.test"
        port: 8080
    binaries:
      - path: /t/bin/probe-a
  via_launcher:
    endpoints:
      - host: pub.test
        port: 8081
    binaries:
      - path: /t/bin/launch
        descendants: true
  via_glob:
    endpoints:
      - host: pub.test
        port: 8082
    binaries:
      - path: "/t/bin/*"
  corp_exact:
    endpoints:
      - host: db.corp.test
        port: 8080
      - host: k8s.corp.test
        port: 6443
      - host: localhost
        port: 8080
      - host: 127.0.0.1
        port: 8080
    binaries:
      - path: /t/bin/probe-a
  corp_ips:
    endpoints:
      - ports: [9090]
        allowed_ips: ["10.77.0.0/24"]
    binaries:
      - path: /t/bin/probe-a
"#;

fn connect(host_port: &str) -> String {
    format!("CONNECT {host_port} HTTP/1.1\\r\\nHost: {host_port}\\r\\n\\r\\n")
}

/// The `error` and the parsed body of a JSON refusal.
fn refusal(raw: &str, status: &str) -> serde_json::Value {
    let (line, head, _) = split_response(raw);
    assert_eq!(line, format!("HTTP/1.1 {status}"), "{raw}");
    assert!(head.contains("\r\nConnection: close"), "{raw}");
    assert!(head.contains("\r\nContent-Type: application/json"), "{raw}");
    json_body(raw)
}

#[test]
fn connect_allowed_relays_bytes_and_reports_the_rule() {
    if !require() {
        return;
    }
    World::run(|w| {
        w.start(P1, ProxyConfig::default());
        let out = w.probe("probe-a", &[&connect("PUB.TEST:8080"), "hello through"]);
        assert_eq!(
            out,
            "HTTP/1.1 200 Connection Established\r\n\r\nhello through"
        );
        assert_eq!(w.upstream.count(PUBLIC), 1);
        let e = w
            .events
            .wait_for("allowed", |e| e.outcome == Outcome::Allowed);
        assert_eq!(
            (e.rule.as_str(), e.dest.as_str(), e.via.clone()),
            ("pub_http", "pub.test:8080", Via::Connect)
        );
        assert_eq!(e.message(), "CONNECT allowed pub.test:8080");
        let c = e.caller.as_ref().unwrap();
        assert_eq!(c.exe, w.bin.join("probe-a").to_str().unwrap());
        assert!(
            e.shorthand().starts_with("NET:OPEN [INFO] ALLOWED "),
            "{}",
            e.shorthand()
        );
        assert!(
            e.shorthand()
                .ends_with("-> pub.test:8080 [policy:pub_http engine:opa]")
        );
        assert_eq!(w.proxy().counters().total().allowed, 1);
        assert_eq!(w.proxy().counters().exec(c.exec).allowed, 1);
    });
}

#[test]
fn forward_rebuilds_host_from_the_uri_and_strips_proxy_headers() {
    if !require() {
        return;
    }
    World::run(|w| {
        w.start(P1, ProxyConfig::default());
        let req = "GET http://pub.test:8080/x?q=1 HTTP/1.1\\r\\nHost: evil.test\\r\\nProxy-Connection: keep-alive\\r\\nProxy-Authorization: Basic eA==\\r\\nX-Kept: yes\\r\\n\\r\\n";
        let out = w.probe("probe-a", &[req]);
        let (line, head, _) = split_response(&out);
        assert_eq!(line, "HTTP/1.1 200 OK", "{out}");
        assert!(
            head.to_ascii_lowercase().contains("\r\nconnection: close"),
            "{out}"
        );
        let got = json_body(&out);
        assert_eq!(got["request"], "GET /x?q=1 HTTP/1.1");
        let headers: Vec<(String, String)> =
            serde_json::from_value(got["headers"].clone()).unwrap();
        let find = |n: &str| {
            headers
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case(n))
                .map(|(_, v)| v.as_str())
                .collect::<Vec<_>>()
        };
        assert_eq!(find("host"), ["pub.test:8080"]);
        assert_eq!(find("via"), ["1.1 openshell-sandbox"]);
        assert_eq!(find("connection"), ["close"]);
        assert_eq!(find("x-kept"), ["yes"]);
        assert!(
            headers
                .iter()
                .all(|(k, _)| !k.to_ascii_lowercase().starts_with("proxy-")),
            "{headers:?}"
        );
        let e = w
            .events
            .wait_for("forward allowed", |e| e.outcome == Outcome::Allowed);
        assert_eq!(e.message(), "FORWARD allowed GET pub.test:8080/x");
        // A second request pipelined behind the first never reaches the upstream.
        let two = "GET http://pub.test:8080/one HTTP/1.1\\r\\nHost: a\\r\\n\\r\\nGET /two HTTP/1.1\\r\\nHost: evil.test\\r\\n\\r\\n";
        let out = w.probe("probe-a", &[two]);
        assert_eq!(out.matches("HTTP/1.1 200 OK").count(), 1, "{out}");
        assert!(!out.contains("/two"), "{out}");
    });
}

#[test]
fn denied_host_gets_403_policy_denied_and_the_upstream_sees_nothing() {
    if !require() {
        return;
    }
    World::run(|w| {
        w.start(P1, ProxyConfig::default());
        let out = w.probe("probe-a", &[&connect("other.test:8080")]);
        let b = refusal(&out, "403 Forbidden");
        assert_eq!(b["error"], "policy_denied");
        assert_eq!(
            b["detail"],
            "CONNECT other.test:8080 not permitted by policy"
        );
        assert_eq!(
            b["reason"],
            "endpoint other.test:8080 is not allowed by any policy"
        );
        // Wrong port.
        let b = json_body(&w.probe("probe-a", &[&connect("pub.test:8083")]));
        assert_eq!(
            b["reason"],
            "endpoint pub.test:8083 is not allowed by any policy"
        );
        // Forwarded too.
        let b = json_body(&w.probe(
            "probe-a",
            &["GET http://other.test:8080/a?secret=1 HTTP/1.1\\r\\n\\r\\n"],
        ));
        assert_eq!(b["detail"], "GET other.test:8080/a not permitted by policy");
        assert_eq!(w.upstream.total(), 0);
        let e = w
            .events
            .wait_for("denied", |e| e.outcome == Outcome::Denied);
        assert!(
            e.shorthand().starts_with("NET:OPEN [MED] DENIED "),
            "{}",
            e.shorthand()
        );
        assert!(
            e.shorthand()
                .contains("[policy:- engine:opa] [reason:endpoint other.test:8080"),
            "{}",
            e.shorthand()
        );
        assert_eq!(w.proxy().counters().total().denied, 3);
    });
}

#[test]
fn host_glob_edges() {
    if !require() {
        return;
    }
    World::run(|w| {
        w.start(P1, ProxyConfig::default());
        for (target, ok) in [
            ("a.wild.test:8443", true),
            ("wild.test:8080", false),
            ("b.c.wild.test:8080", false),
            ("x.y.deep.test:8080", true),
            ("x.deep.test:8080", true),
            ("deep.test:8080", false),
        ] {
            let out = w.probe("probe-a", &[&connect(target), "x"]);
            if ok {
                assert_eq!(
                    out, "HTTP/1.1 200 Connection Established\r\n\r\nx",
                    "{target}"
                );
            } else {
                assert_eq!(json_body(&out)["error"], "policy_denied", "{target}: {out}");
            }
        }
    });
}

#[test]
fn binary_identity_exe_and_ancestors_never_argv() {
    if !require() {
        return;
    }
    World::run(|w| {
        w.start(P1, ProxyConfig::default());
        let b = w.bin.join("probe-b");
        let b = b.to_str().unwrap();
        let out = w.probe("probe-b", &[&connect("pub.test:8080")]);
        let reason = json_body(&out)["reason"].as_str().unwrap().to_string();
        assert!(
            reason.starts_with(&format!("binary '{b}' not allowed in policy 'pub_http'")),
            "{reason}"
        );
        // Launched by a forking `launch`: allowed as an ancestor; exec'd in place: not.
        let ok = w.probe("launch", &[b, &connect("pub.test:8081"), "z"]);
        assert_eq!(ok, "HTTP/1.1 200 Connection Established\r\n\r\nz");
        let no = w.probe("launch", &["--exec", b, &connect("pub.test:8081")]);
        assert_eq!(json_body(&no)["error"], "policy_denied", "{no}");
        // `*` does not cross `/`.
        assert!(
            w.probe("probe-b", &[&connect("pub.test:8082")])
                .starts_with("HTTP/1.1 200")
        );
        let c = w.probe("sub/probe-c", &[&connect("pub.test:8082")]);
        assert_eq!(json_body(&c)["error"], "policy_denied", "{c}");
        // argv[0] is never an identity.
        let mut cmd = w.in_sandbox(w.bin.join("probe-b"));
        cmd.arg0("/t/bin/probe-a").arg(connect("pub.test:8080"));
        let spoof = output(cmd, Duration::from_secs(30));
        let r = json_body(&spoof)["reason"].as_str().unwrap().to_string();
        assert!(r.contains(&format!("binary '{b}'")), "{r}");
    });
}

use std::os::unix::process::CommandExt;

#[test]
fn address_checks_after_resolution() {
    if !require() {
        return;
    }
    World::run(|w| {
        w.start(P1, ProxyConfig::default());
        let ssrf = |target: &str| {
            let out = w.probe("probe-a", &[&connect(target)]);
            let b = refusal(&out, "403 Forbidden");
            assert_eq!(b["error"], "ssrf_denied", "{target}: {out}");
            assert!(b.get("reason").is_none());
            b["detail"].as_str().unwrap().to_string()
        };
        // Wildcard host: public addresses only.
        assert_eq!(
            ssrf("priv.wild.test:8080"),
            "CONNECT priv.wild.test:8080 blocked: internal address"
        );
        assert_eq!(
            ssrf("cgnat.wild.test:8080"),
            "CONNECT cgnat.wild.test:8080 blocked: internal address"
        );
        // One private answer among public ones refuses the whole request.
        ssrf("mixed.wild.test:8080");
        // Unresolvable: an address denial, not a 502, that says why.
        assert_eq!(
            ssrf("nx.wild.test:8080"),
            "CONNECT nx.wild.test:8080 blocked: DNS resolution failed for nx.wild.test:8080: no address for nx.wild.test"
        );
        let e = w.events.wait_for("dns", |e| e.dest == "nx.wild.test:8080");
        assert!(
            e.reason
                .as_deref()
                .unwrap()
                .starts_with("DNS resolution failed for nx.wild.test:8080")
        );
        assert_eq!(e.engine(), "ssrf");
        // An exact declared host may use a private address; control-plane ports stay shut.
        assert!(
            w.probe("probe-a", &[&connect("db.corp.test:8080"), "p"])
                .ends_with("\r\n\r\np")
        );
        assert_eq!(
            ssrf("k8s.corp.test:6443"),
            "CONNECT k8s.corp.test:6443 blocked: declared endpoint check failed"
        );
        // Loopback is refused even declared exactly, by name or literal.
        ssrf("localhost:8080");
        ssrf("127.0.0.1:8080");
        let e = w
            .events
            .wait_for("loopback", |e| e.dest == "localhost:8080");
        assert!(
            e.reason
                .as_deref()
                .unwrap()
                .contains("resolves to always-blocked address 127.0.0.1")
        );
        // Hostless allowed_ips: any name that resolves inside the range.
        assert!(
            w.probe("probe-a", &[&connect("any1.test:9090"), "q"])
                .ends_with("\r\n\r\nq")
        );
        assert_eq!(
            ssrf("other.test:9090"),
            "CONNECT other.test:9090 blocked: allowed_ips check failed"
        );
        // A name that resolves to loopback gets nothing through allowed_ips either.
        ssrf("lo.test:9090");
        assert_eq!(
            w.upstream.count(std::net::Ipv4Addr::LOCALHOST),
            0,
            "the supervisor's loopback was reached"
        );
        assert_eq!(w.upstream.count(CGNAT), 0);
        assert_eq!(w.upstream.count(PRIVATE2), 0);
    });
}

#[test]
fn a_client_that_ignores_the_proxy_reaches_nothing() {
    if !require() {
        return;
    }
    World::run(|w| {
        w.start(P1, ProxyConfig::default());
        assert_eq!(
            w.probe("probe-a", &["--direct", "192.88.99.10", "8080"]),
            "ENETUNREACH\n"
        );
        assert_eq!(
            w.probe("probe-a", &["--direct", "10.77.0.10", "8080"]),
            "ENETUNREACH\n"
        );
        assert_eq!(
            w.probe("probe-a", &["--direct", "10.200.0.1", "80"]),
            "ECONNREFUSED\n"
        );
        assert_eq!(w.upstream.total(), 0);
    });
}

#[test]
fn heads_past_8_kib_get_431_and_bad_heads_400() {
    if !require() {
        return;
    }
    World::run(|w| {
        w.start(P1, ProxyConfig::default());
        let big = format!(
            "CONNECT pub.test:8080 HTTP/1.1\\r\\nX-Pad: {}\\r\\n\\r\\n",
            "a".repeat(9 * 1024)
        );
        assert_eq!(
            w.probe("probe-a", &[&big]),
            "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let https = w.probe("probe-a", &["GET https://pub.test/ HTTP/1.1\\r\\n\\r\\n"]);
        assert!(
            https.starts_with("HTTP/1.1 400 Bad Request\r\n")
                && https.ends_with("\r\n\r\nUse CONNECT for HTTPS URLs"),
            "{https}"
        );
        let origin = w.probe(
            "probe-a",
            &["GET / HTTP/1.1\\r\\nHost: pub.test\\r\\n\\r\\n"],
        );
        assert_eq!(
            origin,
            "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let noport = w.probe("probe-a", &["CONNECT pub.test HTTP/1.1\\r\\n\\r\\n"]);
        assert_eq!(json_body(&noport)["error"], "invalid_connect_target");
        let smuggle = w.probe("probe-a", &["POST http://pub.test:8080/ HTTP/1.1\\r\\nContent-Length: 3\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n"]);
        assert!(smuggle.starts_with("HTTP/1.1 400 "), "{smuggle}");
        assert_eq!(w.upstream.total(), 0);
        // And the proxy still serves.
        assert!(
            w.probe("probe-a", &[&connect("pub.test:8080")])
                .starts_with("HTTP/1.1 200")
        );
    });
}

#[test]
fn a_slow_head_is_closed_on_time_and_others_pass_meanwhile() {
    if !require() {
        return;
    }
    World::run(|w| {
        let cfg = ProxyConfig {
            head_timeout: Duration::from_secs(2),
            ..ProxyConfig::default()
        };
        w.start(P1, cfg);
        // A slowloris client inside the sandbox: a byte every 300 ms, never a blank line.
        let py = "import socket,time,sys\ns=socket.create_connection(('10.200.0.1',3128))\nt=time.time()\ntry:\n  for c in b'CONNECT pub.test:8080 HTTP/1.1\\r\\nX: '+b'a'*100:\n    s.send(bytes([c])); time.sleep(0.3)\nexcept OSError: pass\ns.settimeout(10)\ntry:\n  d=s.recv(100)\nexcept OSError: d=b'err'\nprint(round(time.time()-t,1), d)\n";
        let mut slow = w.in_sandbox("python3");
        slow.args(["-c", py]).stdout(std::process::Stdio::piped());
        let slow = slow.spawn().unwrap();
        std::thread::sleep(Duration::from_millis(500));
        let t = Instant::now();
        assert!(
            w.probe("probe-a", &[&connect("pub.test:8080"), "k"])
                .ends_with("k")
        );
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "an honest client waited {:?}",
            t.elapsed()
        );
        let out = slow.wait_with_output().unwrap();
        let s = String::from_utf8_lossy(&out.stdout);
        let secs: f64 = s.split_whitespace().next().unwrap().parse().unwrap();
        assert!((1.8..4.0).contains(&secs), "closed after {secs} s: {s}");
        assert!(
            s.trim_end().ends_with("b''") || s.contains("err"),
            "no answer expected: {s}"
        );
    });
}

#[test]
fn ten_thousand_connections_from_one_exec_are_bounded_and_another_exec_passes() {
    if !require() {
        return;
    }
    World::run(|w| {
        w.start(P1, ProxyConfig::default());
        let probe_a = w.bin.join("probe-a");
        // The flood runs in a PID namespace of its own, as every exec does.
        let mut hog = w.in_sandbox("unshare");
        hog.args(["--pid", "--fork"])
            .arg(&probe_a)
            .args(["--flood", "10000", &connect("pub.test:8080")])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        let mut hog = hog.spawn().unwrap();
        let mut reader = std::io::BufReader::new(hog.stdout.take().unwrap());
        let mut summary = String::new();
        let started = Instant::now();
        // While the flood is on, another exec is served.
        let mut line = String::new();
        std::thread::sleep(Duration::from_millis(300));
        let t = Instant::now();
        let other = w.probe("probe-a", &[&connect("pub.test:8080"), "still here"]);
        assert!(other.ends_with("still here"), "{other}");
        let waited = t.elapsed();
        use std::io::BufRead;
        while !summary.contains("READY") {
            line.clear();
            assert!(
                reader.read_line(&mut line).unwrap() > 0,
                "flood ended early: {summary}"
            );
            summary.push_str(&line);
        }
        eprintln!(
            "flood: {summary} in {:?}; the other exec waited {waited:?}",
            started.elapsed()
        );
        let field = |k: &str| -> usize {
            summary
                .split_whitespace()
                .find_map(|f| f.strip_prefix(&format!("{k}=")))
                .unwrap()
                .parse()
                .unwrap()
        };
        assert!(field("ok") <= 256, "{summary}");
        assert!(field("ok") >= 200, "{summary}");
        assert!(w.proxy().open_connections() <= 1024);
        assert!(
            waited < Duration::from_secs(10),
            "the other exec waited {waited:?}"
        );
        drop(hog.stdin.take());
        hog.wait().unwrap();
        wait_until(
            "the flood's tunnels to close",
            Duration::from_secs(10),
            || w.proxy().open_connections() == 0,
        );
    });
}

#[test]
fn a_policy_change_closes_open_tunnels_and_quarantine_denies_all() {
    if !require() {
        return;
    }
    World::run(|w| {
        w.start(P1, ProxyConfig::default());
        let mut hold = w.in_sandbox(w.bin.join("probe-a"));
        hold.args(["--hold", &connect("pub.test:8080")])
            .stdout(std::process::Stdio::piped());
        let hold = hold.spawn().unwrap();
        w.events
            .wait_for("the held tunnel", |e| e.outcome == Outcome::Allowed);
        std::thread::sleep(Duration::from_millis(200));
        let t = Instant::now();
        let new_rules = w.rules(&format!("{P1}  unrelated:\n    endpoints: [{{host: x.test, port: 1}}]\n    binaries: [{{path: /t/bin/probe-b}}]\n"));
        assert_eq!(w.policy().publish(new_rules.clone()), 2);
        let out = hold.wait_with_output().unwrap();
        let s = String::from_utf8_lossy(&out.stdout);
        assert!(
            s.contains("ping\nCLOSED eof") || s.contains("CLOSED ECONNRESET"),
            "{s}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "closed after {:?}",
            t.elapsed()
        );
        let e = w
            .events
            .wait_for("reload close", |e| e.outcome == Outcome::ClosedByReload);
        assert_eq!((e.generation, e.rule.as_str()), (1, "pub_http"));
        // The same rules again change nothing; a new connection runs under generation 2.
        assert_eq!(w.policy().publish(new_rules), 2);
        assert!(
            w.probe("probe-a", &[&connect("pub.test:8080"), "g2"])
                .ends_with("g2")
        );
        // Quarantine: open tunnels close, every new connection is denied with the reason.
        w.policy().quarantine(7, "bad yaml");
        let b = json_body(&w.probe("probe-a", &[&connect("pub.test:8080")]));
        assert_eq!(b["error"], "policy_denied");
        assert_eq!(
            b["reason"],
            "policy validation failed; fail-closed quarantine is active; candidate version 7 rejected: bad yaml"
        );
    });
}
