//! L7 inspection end to end: the REST rules over plain HTTP (inside CONNECT tunnels and on
//! the forward path) and over intercepted TLS, the canonical path that goes upstream, the
//! authority check, credential placeholders, with real clients (curl, python, git, node)
//! inside the sandbox namespace (tests/support/egress). The REST rules of
//! `support::egress::l7::RULES`, on the hyper upstreams of `support::egress::l7_servers`
//! (plain 8180, TLS 9443).

// The upstream's test CA is trusted through a knob compiled into test builds only.
#![cfg(feature = "test-pause-points")]

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use openshell_sandbox::egress::L7Decision;
use support::egress::l7::*;
use support::egress::tools::*;
use support::egress::*;

/// One tunnel: a request, three quiet seconds, a second request, then a head that stalls
/// half-way; prints both status lines and how long the stalled head was held.
const KEEP_ALIVE: &str = r#"
import socket, time
s = socket.create_connection(("10.200.0.1", 3128))
s.sendall(b"CONNECT api.test:8180 HTTP/1.1\r\nHost: api.test:8180\r\n\r\n")
f = s.makefile("rb")
assert f.readline().startswith(b"HTTP/1.1 200"); f.readline()
def get(path):
    s.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: api.test:8180\r\n\r\n")
    line = f.readline().decode().strip()
    n = 0
    while True:
        h = f.readline()
        if h in (b"\r\n", b""): break
        if h.lower().startswith(b"content-length:"): n = int(h.split(b":")[1])
    f.read(n)
    print(line, flush=True)
get(b"/c")
time.sleep(3)
get(b"/d")
s.sendall(b"GET /e HTTP/1.1\r\nHo")
t = time.time()
s.settimeout(20)
try:
    gone = s.recv(1) == b""
except OSError:
    gone = True
print("closed" if gone else "data", round(time.time() - t, 2), flush=True)
"#;

#[test]
fn rest_in_a_connect_tunnel_keep_alive_allow_deny_and_deny_rules() {
    let Some(curl) = curl_or_skip() else { return };
    World::run(move |w| {
        let l = start(w, &curl);
        // Two requests on one tunnel (keep-alive), then a HEAD.
        let (out, code) = l.curl(
            w,
            &[
                "-p",
                "http://api.test:8180/any",
                "http://api.test:8180/any?x=1",
            ],
        );
        assert_eq!(code, 0, "{out}");
        assert_eq!(out.matches("HTTP/1.1 200 OK").count(), 2, "{out}");
        assert_eq!(
            l.up.requests(),
            ["GET /any HTTP/1.1", "GET /any?x=1 HTTP/1.1"]
        );
        let opened = w
            .events
            .all()
            .iter()
            .filter(|e| e.message().starts_with("CONNECT allowed api.test:8180"))
            .count();
        assert_eq!(opened, 1, "both requests rode one tunnel");
        let allowed: Vec<_> = w.events.1.lock().unwrap().clone();
        assert_eq!(allowed.len(), 2);
        assert_eq!(allowed[0].decision, L7Decision::Allow);
        assert_eq!(allowed[0].rule, "api_ro");
        assert_eq!(
            allowed[0].message(),
            "L7_REQUEST allow GET api.test:8180/any"
        );

        for (method, path, reason) in [
            ("POST", "/x", "POST /x not permitted by policy"),
            ("DELETE", "/x", "DELETE /x not permitted by policy"),
            (
                "GET",
                "/admin/users",
                "GET /admin/users blocked by deny rule",
            ),
        ] {
            let before = l.up.requests().len();
            let (out, _) = l.curl(
                w,
                &["-p", "-X", method, &format!("http://api.test:8180{path}")],
            );
            let (line, head, body) = last_response(&out);
            assert_eq!(line, "HTTP/1.1 403 Forbidden", "{out}");
            assert_eq!(header(&head, "x-openshell-policy"), Some("api_ro"), "{out}");
            assert_eq!(header(&head, "connection"), Some("close"), "{out}");
            assert_eq!(header(&head, "content-type"), Some("application/json"));
            let j: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(j["error"], "policy_denied");
            assert_eq!(j["policy"], "api_ro");
            assert_eq!(j["detail"], reason);
            assert_eq!(j["rule"], format!("{method} {path}"));
            assert_eq!(j["layer"], "l7");
            assert_eq!(j["protocol"], "rest");
            assert_eq!(
                (j["method"].as_str(), j["path"].as_str()),
                (Some(method), Some(path))
            );
            assert_eq!(
                (j["host"].as_str(), j["port"].as_u64()),
                (Some("api.test"), Some(8180))
            );
            assert_eq!(j["binary"], l.curl.display().to_string());
            assert_eq!(j["rule_missing"]["type"], "rest_allow");
            assert_eq!(
                l.up.requests().len(),
                before,
                "the upstream saw nothing of {method} {path}"
            );
        }
        let denies = w
            .events
            .1
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.decision == L7Decision::Deny)
            .count();
        assert_eq!(denies, 3);
        // Six requests over four tunnels of one revision: its rules were compiled once.
        assert_eq!(l.interceptor.compilations(), 1);
        let rules = w.rules(
            &RULES
                .replace("CURL", &l.curl.display().to_string())
                .replace("PYTHON", "/nonexistent")
                .replace("GIT_HTTP", "/nonexistent")
                .replace("NODE", "/nonexistent")
                .replace("ws.test", "ws2.test"),
        );
        w.policy().publish(rules);
        let (out, _) = l.curl(w, &["-p", "http://api.test:8180/again"]);
        assert_eq!(last_response(&out).0, "HTTP/1.1 200 OK", "{out}");
        assert_eq!(
            l.interceptor.compilations(),
            2,
            "and once more for the new revision"
        );
    });
}

#[test]
fn rest_queries_globs_audit_and_the_canonical_path_upstream() {
    let Some(curl) = curl_or_skip() else { return };
    World::run(move |w| {
        let l = start(w, &curl);
        let status = |url: &str| {
            let (out, code) = l.curl(w, &["-p", "--path-as-is", url]);
            let rest = out.trim_start_matches("HTTP/1.1 200 Connection Established\r\n\r\n");
            if rest.is_empty() {
                return format!("closed({code})");
            }
            last_response(&out).0
        };
        let ok = "HTTP/1.1 200 OK";
        let no = "HTTP/1.1 403 Forbidden";
        for (url, want) in [
            ("http://rules.test:8180/repos/a/issues", ok),
            ("http://rules.test:8180/repos/a/b/issues", no),
            ("http://rules.test:8180/download?tag=v1.2", ok),
            ("http://rules.test:8180/download?tag=v1.2&tag=v2", no),
            ("http://rules.test:8180/download?tag=v1.0-rc1", no),
            ("http://rules.test:8180/download", no),
            ("http://audit.test:8180/anything", ok),
        ] {
            assert_eq!(status(url), want, "{url}");
        }
        let (out, _) = l.curl(w, &["-p", "-X", "POST", "http://audit.test:8180/x"]);
        assert_eq!(last_response(&out).0, ok, "audit forwards: {out}");
        assert!(w.events.1.lock().unwrap().iter().any(|e| e.decision == L7Decision::Audit
            && e.message() == "L7_REQUEST audit POST audit.test:8180/x reason=POST /x not permitted by policy"));
        // The canonical path is what goes upstream.
        let before = l.up.requests().len();
        assert_eq!(status("http://rules.test:8180/a/../repos/x/issues"), ok);
        assert_eq!(l.up.requests()[before], "GET /repos/x/issues HTTP/1.1");
        assert_eq!(status("http://rules.test:8180//repos/%78/./issues;p=1"), ok);
        assert_eq!(l.up.requests()[before + 1], "GET /repos/x/issues HTTP/1.1");
        // No canonical form: the tunnel closes with no answer (curl 52: empty reply).
        assert_eq!(status("http://rules.test:8180/../x"), "closed(52)");
        assert_eq!(
            status("http://rules.test:8180/repos/x%2Fy/issues"),
            "closed(52)"
        );
        assert_eq!(l.up.requests().len(), before + 2);
        // Kept as %2F where the endpoint allows it.
        assert_eq!(status("http://gitlab.test:8180/g/a%2fb"), ok);
        assert_eq!(l.up.requests()[before + 2], "GET /g/a%2Fb HTTP/1.1");
    });
}

#[test]
fn authority_inside_a_tunnel_must_be_the_connect_target() {
    let Some(curl) = curl_or_skip() else { return };
    World::run(move |w| {
        let l = start(w, &curl);
        for host in ["other.test", "api.test", "api.test:8181"] {
            let (out, _) = l.curl(
                w,
                &[
                    "-p",
                    "-H",
                    &format!("Host: {host}"),
                    "http://api.test:8180/",
                ],
            );
            let (line, head, body) = last_response(&out);
            assert_eq!(line, "HTTP/1.1 403 Forbidden", "{host}: {out}");
            assert_eq!(header(&head, "connection"), Some("close"));
            let j: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(j["error"], "request_authority_mismatch", "{host}");
        }
        assert!(l.up.requests().is_empty());
        // The same with exact bytes, and the explicit default port of a plain tunnel.
        let out = w.probe(
            "probe-a",
            &[
                "CONNECT api.test:8180 HTTP/1.1\\r\\nHost: api.test:8180\\r\\n\\r\\n",
                "GET / HTTP/1.1\\r\\nHost: evil.test:8180\\r\\n\\r\\n",
            ],
        );
        assert!(out.contains("\"request_authority_mismatch\""), "{out}");
    });
}

#[test]
fn forward_requests_are_checked_by_the_rest_rules_and_canonicalised() {
    let Some(curl) = curl_or_skip() else { return };
    World::run(move |w| {
        let l = start(w, &curl);
        let (out, _) = l.curl(w, &["-X", "POST", "http://api.test:8180/x?q=1"]);
        let (line, head, body) = last_response(&out);
        assert_eq!(line, "HTTP/1.1 403 Forbidden", "{out}");
        assert_eq!(header(&head, "x-openshell-policy"), None);
        let j: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(j["error"], "policy_denied");
        assert_eq!(
            j["detail"],
            "POST api.test:8180/x denied by L7 policy: POST /x not permitted by policy"
        );
        assert!(l.up.requests().is_empty());
        let (out, _) = l.curl(w, &["--path-as-is", "http://api.test:8180/a/../b?q=1"]);
        assert_eq!(last_response(&out).0, "HTTP/1.1 200 OK", "{out}");
        assert_eq!(l.up.requests(), ["GET /b?q=1 HTTP/1.1"]);
        let (out, _) = l.curl(w, &["--path-as-is", "http://api.test:8180/../x"]);
        let (line, _, body) = last_response(&out);
        assert_eq!(line, "HTTP/1.1 400 Bad Request");
        let j: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(j["error"], "invalid_request_target");
        assert_eq!(j["detail"], "request-target must be canonical");
        let (out, _) = l.curl(w, &["http://api.test:8180/admin/x"]);
        let j: serde_json::Value = serde_json::from_str(&last_response(&out).2).unwrap();
        assert_eq!(
            j["detail"],
            "GET api.test:8180/admin/x denied by L7 policy: GET /admin/x blocked by deny rule"
        );
        assert_eq!(l.up.requests().len(), 1);
    });
}

#[test]
fn tls_is_intercepted_with_the_sandbox_ca_and_verified_upstream() {
    let Some(curl) = curl_or_skip() else { return };
    World::run(move |w| {
        let l = start(w, &curl);
        // curl trusts the bundle through CURL_CA_BUNDLE, as in production.
        let mut c = l.cmd(w, &curl);
        c.args([
            "-s",
            "-v",
            "--max-time",
            "20",
            "https://secure.test:9443/hello",
        ]);
        let out = c.output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{stderr}");
        assert!(
            stdout.contains("\"request\":\"GET /hello HTTP/1.1\""),
            "{stdout}"
        );
        assert!(
            stderr.contains("OpenShell Sandbox CA"),
            "the client saw the sandbox CA's leaf: {stderr}"
        );
        assert!(stderr.contains("secure.test"), "{stderr}");
        assert_eq!(
            l.up.handshakes.lock().unwrap().clone(),
            [(
                Some("secure.test".to_string()),
                Some("http/1.1".to_string())
            )],
            "upstream: SNI = the CONNECT host, ALPN http/1.1"
        );
        assert!(l.ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        // An L7 endpoint behind TLS: the 403 comes inside the TLS session.
        let (out, _) = l.curl(w, &["-X", "POST", "https://secure-api.test:9443/x"]);
        let (line, head, body) = last_response(&out);
        assert_eq!(line, "HTTP/1.1 403 Forbidden", "{out}");
        assert_eq!(header(&head, "x-openshell-policy"), Some("tls_l7"));
        let j: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(j["detail"], "POST /x not permitted by policy");
        assert_eq!(l.up.requests(), ["GET /hello HTTP/1.1"]);
        // tls: skip: the upstream's own certificate reaches the client (the sandbox CA
        // cannot verify it; the tests' CA can).
        let (out, code) = l.curl(w, &["https://raw.test:9443/raw"]);
        assert_eq!(
            (out.as_str(), code),
            ("HTTP/1.1 200 Connection Established\r\n\r\n", 60),
            "the sandbox CA does not vouch for raw.test's own certificate"
        );
        let upca = l.tls_dir.join("upstream-ca.pem");
        let (out, code) = l.curl(
            w,
            &[
                "--cacert",
                upca.to_str().unwrap(),
                "https://raw.test:9443/raw",
            ],
        );
        assert_eq!(code, 0, "{out}");
        assert_eq!(last_response(&out).0, "HTTP/1.1 200 OK");
    });
}

#[test]
fn credential_placeholders_are_replaced_only_for_their_endpoint() {
    let Some(curl) = curl_or_skip() else { return };
    World::run(move |w| {
        let l = start(w, &curl);
        let placeholder = "openshell:resolve:env:GITHUB_TOKEN";
        assert_eq!(
            l.creds_env,
            [("GITHUB_TOKEN".to_string(), placeholder.to_string())]
        );
        // The child sees only the placeholder, in its environment and in what it prints.
        let mut c = l.cmd(w, Path::new("/bin/sh"));
        c.args([
            "-c",
            &format!(
                "cat /proc/self/environ | tr '\\0' '\\n' | grep GITHUB_TOKEN; {c} -s -i --max-time 20 -H \"Authorization: Bearer $GITHUB_TOKEN\" \"https://cred.test:9443/quiet/$GITHUB_TOKEN?t=$GITHUB_TOKEN\"; {c} -s -i --max-time 20 -u \"x:$GITHUB_TOKEN\" https://cred.test:9443/quiet/basic",
                c = l.curl.display()
            ),
        ]);
        let out = output(c, Duration::from_secs(30));
        assert!(
            out.contains(&format!("GITHUB_TOKEN={placeholder}")),
            "{out}"
        );
        assert!(
            !out.contains(SECRET),
            "the real value reached the child: {out}"
        );
        // What the upstream received: the real value, no placeholder.
        assert_eq!(out.matches("quiet ok").count(), 2, "{out}");
        let reqs = l.up.requests();
        assert_eq!(
            reqs,
            [
                format!("GET /quiet/{SECRET}?t={SECRET} HTTP/1.1"),
                "GET /quiet/basic HTTP/1.1".to_string()
            ]
        );
        let heads = l.up.heads();
        assert!(
            heads[0].contains(&format!("authorization: Bearer {SECRET}")),
            "{heads:?}"
        );
        use base64::Engine;
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("x:{SECRET}"));
        assert!(
            heads[1].contains(&format!("authorization: Basic {basic}")),
            "{heads:?}"
        );
        assert!(!heads.concat().contains("openshell:resolve"), "{heads:?}");
        // The events name no value.
        let l7 = format!("{:?}{:?}", w.events.1.lock().unwrap(), w.events.all());
        assert!(!l7.contains(SECRET));
        assert!(l7.contains("/quiet/[CREDENTIAL]"), "{l7}");
        let first = w.events.1.lock().unwrap()[0].message();
        assert_eq!(
            first,
            "HTTP_REQUEST GET cred.test:9443/quiet/[CREDENTIAL] credentials_injected=true"
        );

        // Bound to cred.test only: secure.test gets 403 credential_endpoint_mismatch.
        let (out, _) = l.curl(
            w,
            &[
                "-H",
                &format!("Authorization: Bearer {placeholder}"),
                "https://secure.test:9443/x",
            ],
        );
        let (line, _, body) = last_response(&out);
        assert_eq!(line, "HTTP/1.1 403 Forbidden", "{out}");
        let j: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(j["error"], "credential_endpoint_mismatch");
        // An unknown key: 400 invalid_credential_placeholder.
        let (out, _) = l.curl(
            w,
            &[
                "-H",
                "X-Key: openshell:resolve:env:NOPE",
                "https://cred.test:9443/x",
            ],
        );
        let (line, _, body) = last_response(&out);
        assert_eq!(line, "HTTP/1.1 400 Bad Request", "{out}");
        let j: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(j["error"], "invalid_credential_placeholder");
        // A raw tunnel to a credentialed endpoint is refused before its 200.
        let out = w.probe(
            "probe-a",
            &["CONNECT rawcred.test:9443 HTTP/1.1\\r\\nHost: rawcred.test:9443\\r\\n\\r\\n"],
        );
        let (line, head, body) = split_response(&out);
        assert_eq!(line, "HTTP/1.1 403 Forbidden", "{out}");
        assert_eq!(header(&head, "connection"), Some("close"));
        let j: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(j["error"], "uninspected_credentials");
        assert_eq!(
            j["detail"],
            "credentialed endpoint requires L7 inspection; raw tunnel is not explicitly allowed"
        );
        // A placeholder in a body (no body rewriting): the upstream never gets it whole.
        let (_, _) = l.curl(
            w,
            &[
                "--data",
                &format!("token={placeholder}"),
                "https://cred.test:9443/quiet/b",
            ],
        );
        let heads = l.up.heads();
        assert!(!heads.concat().contains("openshell:resolve"), "{heads:?}");
    });
}

#[test]
fn real_clients_over_intercepted_https() {
    let Some(curl) = curl_or_skip() else { return };
    World::run(move |w| {
        let l = start(w, &curl);
        let mut seen = 0;
        if let Some(py) = need("python3", python()) {
            let mut c = l.cmd(w, &py);
            c.args(["-c", "import urllib.request;print(urllib.request.urlopen('https://secure.test:9443/py').read().decode())"]);
            let out = output(c, Duration::from_secs(30));
            assert!(
                out.contains("\"request\":\"GET /py HTTP/1.1\""),
                "urllib: {out}"
            );
            seen += 1;
            let has_requests = Command::new(&py)
                .args(["-c", "import requests"])
                .status()
                .is_ok_and(|s| s.success());
            if has_requests {
                let mut c = l.cmd(w, &py);
                c.args([
                    "-c",
                    "import requests;print(requests.get('https://secure.test:9443/rq').text)",
                ]);
                let out = output(c, Duration::from_secs(30));
                assert!(out.contains("GET /rq HTTP/1.1"), "requests: {out}");
                seen += 1;
            } else {
                eprintln!("SKIPPED: python requests is not installed");
            }
        }
        if let (Some(git), Some(_)) = (
            need("git", real_path("git")),
            need("git-remote-https", git_http()),
        ) {
            let mut c = l.cmd(w, &git);
            c.args(["ls-remote", "https://secure.test:9443/repo.git"]);
            c.env("GIT_TERMINAL_PROMPT", "0");
            let _ = output(c, Duration::from_secs(30));
            assert!(
                l.up.requests()
                    .iter()
                    .any(|r| r.starts_with("GET /repo.git/info/refs?service=git-upload-pack")),
                "git's request reached the upstream through interception: {:?}",
                l.up.requests()
            );
            seen += 1;
        }
        if let Some(node) = need("node", real_path("node")) {
            let mut c = l.cmd(w, &node);
            c.args(["-e", "fetch('https://secure.test:9443/node').then(r=>r.text()).then(t=>console.log(t)).catch(e=>{console.log('ERR',e.cause||e);process.exit(3)})"]);
            let out = output(c, Duration::from_secs(30));
            if out.contains("GET /node HTTP/1.1") {
                seen += 1;
            } else {
                // Node older than 22.21 ignores NODE_USE_ENV_PROXY (tests/egress_tools.rs).
                eprintln!("node fetch did not go through the proxy: {out}");
            }
        }
        assert!(seen >= 2, "at least two real clients besides curl");
    });
}

#[test]
fn streaming_responses_and_chunked_bodies_pass_through() {
    let Some(curl) = curl_or_skip() else { return };
    World::run(move |w| {
        let l = start(w, &curl);
        let n = 8 * 1024 * 1024 + 17;
        let mut c = l.cmd(w, &curl);
        c.args([
            "-s",
            "--max-time",
            "30",
            "-o",
            "/dev/null",
            "-w",
            "%{size_download}",
            &format!("https://secure.test:9443/stream?n={n}"),
        ]);
        assert_eq!(output(c, Duration::from_secs(40)), n.to_string());
        // A chunked upload.
        let body = w.tmp.path().join("body");
        std::fs::write(&body, "a".repeat(100_000)).unwrap();
        let mut c = l.cmd(w, &curl);
        c.args([
            "-s",
            "--max-time",
            "30",
            "-H",
            "Transfer-Encoding: chunked",
            "--data-binary",
            &format!("@{}", body.display()),
            "https://secure.test:9443/up",
        ]);
        let out = output(c, Duration::from_secs(40));
        let j: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(j["body"].as_str().map(str::len), Some(100_000));
        assert!(
            l.up.heads()
                .last()
                .unwrap()
                .contains("transfer-encoding: chunked")
        );
    });
}

#[test]
fn a_new_revision_closes_an_inspected_tunnel() {
    if !require() {
        return;
    }
    let curl = real_path("curl").unwrap_or_else(|| PathBuf::from("/usr/bin/curl"));
    World::run(move |w| {
        let _l = start(w, &curl);
        let bin = w.bin.clone();
        let inner = w.in_sandbox(bin.join("probe-a"));
        let mut c = inner;
        c.args([
            "--hold",
            "CONNECT api.test:8180 HTTP/1.1\\r\\nHost: api.test:8180\\r\\n\\r\\n",
            "GET /one HTTP/1.1\\r\\nHost: api.test:8180\\r\\n\\r\\n",
        ]);
        c.stdout(std::process::Stdio::piped());
        let child = c.spawn().unwrap();
        wait_until("the first request", Duration::from_secs(10), || {
            w.events.1.lock().unwrap().len() == 1
        });
        let rules = w.rules("  other:\n    endpoints: [{host: x.test, port: 1}]\n    binaries: [{path: /t/bin/probe-a}]\n");
        w.policy().publish(rules);
        let out = child.wait_with_output().unwrap();
        let out = String::from_utf8_lossy(&out.stdout);
        assert!(out.contains("GET /one HTTP/1.1"), "{out}");
        assert!(out.trim_end().ends_with("CLOSED eof"), "{out}");
        w.events.wait_for("closed by reload", |e| {
            e.outcome == openshell_sandbox::egress::Outcome::ClosedByReload
        });
    });
}

#[test]
fn relay_limits_a_16_kib_header_block_and_an_idle_keep_alive() {
    if !require() {
        return;
    }
    let curl = real_path("curl").unwrap_or_else(|| PathBuf::from("/usr/bin/curl"));
    World::run(move |w| {
        let l = start_timed(w, &curl, Duration::from_secs(1));
        let connect = "CONNECT api.test:8180 HTTP/1.1\\r\\nHost: api.test:8180\\r\\n\\r\\n";
        let fits = format!(
            "GET /a HTTP/1.1\\r\\nHost: api.test:8180\\r\\nX-Big: {}\\r\\n\\r\\n",
            "a".repeat(12_000)
        );
        let out = w.probe("probe-a", &[connect, &fits]);
        assert!(
            out.contains("HTTP/1.1 200 OK"),
            "12 KB of headers pass: {out:.200}"
        );
        let big = format!(
            "GET /b HTTP/1.1\\r\\nHost: api.test:8180\\r\\nX-Big: {}\\r\\n\\r\\n",
            "a".repeat(17_000)
        );
        let out = w.probe("probe-a", &[connect, &big]);
        assert!(
            out.contains("HTTP/1.1 431 Request Header Fields Too Large"),
            "{out:.300}"
        );
        assert_eq!(l.up.requests(), ["GET /a HTTP/1.1"]);
        // A keep-alive tunnel that goes quiet between requests stays open past the head
        // timeout (the idle timeout applies there, as to a raw tunnel); a head that stalls
        // half-way is closed after the head timeout.
        let py = python().expect("python3");
        let mut c = w.in_sandbox(&py);
        c.args(["-c", KEEP_ALIVE]);
        let out = output(c, Duration::from_secs(60));
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert_eq!(lines[0], "HTTP/1.1 200 OK", "{out}");
        assert_eq!(
            lines[1], "HTTP/1.1 200 OK",
            "the second request after 3 s: {out}"
        );
        let (what, secs) = lines[2].split_once(' ').unwrap();
        assert_eq!(what, "closed", "{out}");
        let secs: f64 = secs.parse().unwrap();
        assert!(
            (0.8..6.0).contains(&secs),
            "a stalled head closes after ~1 s: {out}"
        );
        assert_eq!(
            &l.up.requests()[1..],
            ["GET /c HTTP/1.1", "GET /d HTTP/1.1"],
            "the stalled head never reached the upstream"
        );
        // A tunnel that never sends its first byte is closed too.
        let start = std::time::Instant::now();
        let out = w.probe("probe-a", &["--hold", connect, ""]);
        assert!(out.trim_end().ends_with("CLOSED eof"), "{out}");
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{:?}",
            start.elapsed()
        );
    });
}
