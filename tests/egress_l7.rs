//! L7 inspection end to end: the REST rules over plain HTTP (inside CONNECT tunnels and on
//! the forward path) and over intercepted TLS, the canonical path that goes upstream, the
//! authority check, credential placeholders, with real clients (curl, python, git, node)
//! inside the sandbox namespace (tests/egress_support). The sheet's P2 and P3 policies, on
//! the hyper upstreams of `egress_support::l7_servers` (plain 8180, TLS 9443).

// The upstream's test CA is trusted through a knob compiled into test builds only.
#![cfg(feature = "test-pause-points")]

mod egress_support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use egress_support::l7_servers::L7Upstream;
use egress_support::*;
use openshell_sandbox::egress::tls::{self, SandboxCa};
use openshell_sandbox::egress::{Binding, Credentials, Interceptor, L7Decision, ProxyConfig};

const RULES: &str = r#"
  api_ro:
    endpoints:
      - host: api.test
        port: 8180
        protocol: rest
        enforcement: enforce
        access: read-only
        deny_rules:
          - method: GET
            path: "/admin/**"
    binaries: [{path: /t/bin/probe-a}, {path: CURL}, {path: PYTHON}]
  api_rules:
    endpoints:
      - host: rules.test
        port: 8180
        protocol: rest
        enforcement: enforce
        rules:
          - allow: {method: GET, path: "/repos/*/issues"}
          - allow: {method: GET, path: /download, query: {tag: "v1.*"}}
        deny_rules:
          - {method: GET, path: /download, query: {tag: "*-rc*"}}
    binaries: [{path: CURL}, {path: /t/bin/probe-a}]
  api_audit:
    endpoints:
      - {host: audit.test, port: 8180, protocol: rest, access: read-only}
    binaries: [{path: CURL}]
  slashes:
    endpoints:
      - {host: gitlab.test, port: 8180, protocol: rest, enforcement: enforce, access: full, allow_encoded_slash: true}
    binaries: [{path: CURL}]
  tls_l4:
    endpoints:
      - {host: secure.test, port: 9443}
      - {host: cred.test, port: 9443}
    binaries: [{path: CURL}, {path: PYTHON}, {path: GIT_HTTP}, {path: NODE}]
  tls_l7:
    endpoints:
      - {host: secure-api.test, port: 9443, protocol: rest, enforcement: enforce, access: read-only}
    binaries: [{path: CURL}]
  realtime:
    endpoints:
      - host: ws.test
        port: 8180
        protocol: websocket
        enforcement: enforce
        rules:
          - allow: {method: GET, path: "/rt/**"}
          - allow: {method: WEBSOCKET_TEXT, path: "/rt/**"}
        deny_rules:
          - {method: WEBSOCKET_TEXT, path: "/rt/admin/**"}
    binaries: [{path: PYTHON}, {path: CURL}]
  body_rw:
    endpoints:
      - {host: body.test, port: 9443, protocol: rest, enforcement: enforce, access: full, request_body_credential_rewrite: true}
    binaries: [{path: CURL}]
  tls_raw:
    endpoints:
      - {host: raw.test, port: 9443, tls: skip}
      - {host: rawcred.test, port: 9443, tls: skip}
    binaries: [{path: CURL}, {path: /t/bin/probe-a}]
"#;

/// The kernel's path of a program found on PATH.
fn real_path(program: &str) -> Option<PathBuf> {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .ok()?;
    let p = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!p.is_empty())
        .then(|| std::fs::canonicalize(p).ok())
        .flatten()
}

fn python() -> Option<PathBuf> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys,os;print(os.path.realpath(sys.executable))",
        ])
        .output()
        .ok()?;
    let p = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    p.is_file().then_some(p)
}

/// git runs HTTPS through its `git-remote-https` helper, the process that connects.
fn git_http() -> Option<PathBuf> {
    let out = Command::new("git").arg("--exec-path").output().ok()?;
    let dir = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    std::fs::canonicalize(dir.join("git-remote-https")).ok()
}

fn need(name: &str, p: Option<PathBuf>) -> Option<PathBuf> {
    if p.is_none() {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!(
                "required for this test but absent: {name} (CI=true turns this skip into a failure)"
            );
        }
        eprintln!("SKIPPED: {name} is not installed");
    }
    p
}

const SECRET: &str = "ghp_REAL_VALUE_1f2e3d";

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

/// One world with the interceptor, the test upstreams and the CA files for the child.
struct L7 {
    up: Arc<L7Upstream>,
    interceptor: Arc<Interceptor>,
    ca: Arc<SandboxCa>,
    tls_dir: PathBuf,
    curl: PathBuf,
    creds_env: Vec<(String, String)>,
}

fn start(w: &mut World, curl: &Path) -> L7 {
    start_timed(w, curl, Duration::from_secs(10))
}

fn start_timed(w: &mut World, curl: &Path, head_timeout: Duration) -> L7 {
    let up = w.rt.block_on(L7Upstream::start());
    let ca = Arc::new(SandboxCa::generate().unwrap());
    let tls_dir = w.tmp.path().join("openshell-tls");
    std::fs::create_dir_all(&tls_dir).unwrap();
    let files = ca.files(Path::new("/"));
    std::fs::write(tls_dir.join(tls::CA_FILE), &files.ca_pem).unwrap();
    std::fs::write(tls_dir.join(tls::BUNDLE_FILE), &files.bundle_pem).unwrap();
    std::fs::write(tls_dir.join("upstream-ca.pem"), &up.ca_pem).unwrap();
    let mut creds = Credentials::new(3, &"0f".repeat(32));
    creds.insert(
        "GITHUB_TOKEN",
        SECRET.to_string(),
        vec![
            Binding::new("cred.test", 9443),
            Binding::new("rawcred.test", 9443),
            Binding::new("body.test", 9443),
        ],
    );
    let creds_env = creds.child_env();
    let upstream = Arc::new(tls::Upstream::system_and_test_roots(&up.ca_pem).unwrap());
    let events: Arc<dyn openshell_sandbox::egress::EventSink> = w.events.clone();
    let mut interceptor = Interceptor::new(ca.clone(), upstream, Arc::new(creds), events);
    interceptor.head_timeout = head_timeout;
    let interceptor = Arc::new(interceptor);
    let config = ProxyConfig {
        inspector: Some(interceptor.clone()),
        ..ProxyConfig::default()
    };
    let opt =
        |p: Option<PathBuf>| p.map_or("/nonexistent".to_string(), |p| p.display().to_string());
    let rules = RULES
        .replace("CURL", &curl.display().to_string())
        .replace("PYTHON", &opt(python()))
        .replace("GIT_HTTP", &opt(git_http()))
        .replace("NODE", &opt(real_path("node")));
    w.start(&rules, config);
    L7 {
        up,
        interceptor,
        ca,
        tls_dir,
        curl: curl.to_path_buf(),
        creds_env,
    }
}

impl L7 {
    /// A command in the sandbox with the proxy, CA and credential variables a child gets.
    fn cmd(&self, w: &World, program: &Path) -> Command {
        let mut c = w.in_sandbox(program);
        for (k, v) in tls::ca_env(self.tls_dir.to_str().unwrap()) {
            c.env(k, v);
        }
        for (k, v) in &self.creds_env {
            c.env(k, v);
        }
        c
    }

    /// curl with `args`; stdout (`-i`: the head and the body), and its exit code.
    fn curl(&self, w: &World, args: &[&str]) -> (String, i32) {
        let mut c = self.cmd(w, &self.curl);
        c.args(["-s", "-i", "--max-time", "20"]).args(args);
        c.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let out = c.output().unwrap();
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            out.status.code().unwrap_or(-1),
        )
    }
}

fn curl_or_skip() -> Option<PathBuf> {
    if !require() {
        return None;
    }
    need("curl", real_path("curl"))
}

/// The last response of curl's `-i` output: (status line, head, body).
fn last_response(out: &str) -> (String, String, String) {
    let at = out
        .rfind("HTTP/1.1 ")
        .unwrap_or_else(|| panic!("no response: {out:?}"));
    split_response(&out[at..])
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

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

/// A WebSocket session through the proxy, raw (no library between the test and the wire):
/// CONNECT, the upgrade to PATH, then each text message in turn; prints the 101's status
/// line, each frame received as `text:<payload>` or `close:<code>`, and `eof`.
const WS_CLIENT: &str = r#"
import os, socket, struct, sys
path, msgs = sys.argv[1], sys.argv[2:]
s = socket.create_connection(("10.200.0.1", 3128))
s.sendall(b"CONNECT ws.test:8180 HTTP/1.1\r\nHost: ws.test:8180\r\n\r\n")
f = s.makefile("rb")
assert f.readline().startswith(b"HTTP/1.1 200"); f.readline()
s.sendall(("GET %s HTTP/1.1\r\nHost: ws.test:8180\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    "Sec-WebSocket-Extensions: permessage-deflate\r\n\r\n" % path).encode())
print(f.readline().decode().strip(), flush=True)
while f.readline() not in (b"\r\n", b""): pass
def frame():
    h = f.read(2)
    if len(h) < 2: return None
    n = h[1] & 0x7f
    if n == 126: n = struct.unpack(">H", f.read(2))[0]
    p = f.read(n)
    if h[0] & 0x0f == 8: return "close:%d" % struct.unpack(">H", p[:2])[0]
    return "text:" + p.decode()
for m in msgs:
    if m == "WAIT":
        print("open", flush=True)
    else:
        key = os.urandom(4)
        data = bytes(b ^ key[i % 4] for i, b in enumerate(m.encode()))
        s.sendall(bytes([0x81, 0x80 | len(data)]) + key + data)
    got = frame()
    print(got or "eof", flush=True)
    if got is None or got.startswith("close"): break
else:
    # Done: close as a client does, and see the close answered.
    key = os.urandom(4)
    s.sendall(bytes([0x88, 0x82]) + key + bytes(b ^ key[i] for i, b in enumerate(b"\x03\xe8")))
    print(frame() or "eof", flush=True)
print("eof" if f.read(1) == b"" else "more", flush=True)
"#;

#[test]
fn websocket_upgrades_and_text_messages_follow_the_rules() {
    let Some(curl) = curl_or_skip() else { return };
    let Some(py) = need("python3", python()) else {
        return;
    };
    World::run(move |w| {
        let l = start(w, &curl);
        let ws = |path: &str, msgs: &[&str]| {
            let mut c = w.in_sandbox(&py);
            c.args(["-c", WS_CLIENT, path]).args(msgs);
            output(c, Duration::from_secs(60))
        };
        let out = ws("/rt/chat?room=1", &["hi", "again"]);
        assert_eq!(
            out.lines().collect::<Vec<_>>(),
            [
                "HTTP/1.1 101 Switching Protocols",
                "text:echo:hi",
                "text:echo:again",
                "close:1000",
                "eof"
            ],
            "{out}"
        );
        // No compression was negotiated: the relay reads every text message.
        let heads = l.up.heads();
        assert!(
            !heads.last().unwrap().contains("sec-websocket-extensions"),
            "{heads:?}"
        );
        // A message the deny rules refuse: 1008 to the client, nothing upstream but the close.
        let out = ws("/rt/admin/x", &["drop tables"]);
        assert_eq!(
            out.lines().collect::<Vec<_>>(),
            ["HTTP/1.1 101 Switching Protocols", "close:1008", "eof"],
            "{out}"
        );
        assert_eq!(l.up.ws_messages.lock().unwrap().clone(), ["hi", "again"]);
        wait_until("the upstream's close", Duration::from_secs(10), || {
            l.up.ws_closes.lock().unwrap().contains(&1008)
        });
        let events = w.events.1.lock().unwrap().clone();
        assert!(events.iter().any(|e| e.decision == L7Decision::Deny
            && e.message() == "L7_REQUEST deny WEBSOCKET_TEXT ws.test:8180/rt/admin/x reason=WEBSOCKET_TEXT /rt/admin/x blocked by deny rule"), "{events:?}");
        // An upgrade outside the rules, and a plain request to a websocket endpoint: 403.
        let mut c = w.in_sandbox(&py);
        c.args(["-c", WS_CLIENT, "/other"]);
        assert_eq!(
            output(c, Duration::from_secs(30)).lines().next(),
            Some("HTTP/1.1 403 Forbidden")
        );
        let (out, _) = l.curl(w, &["-p", "http://ws.test:8180/rt/plain"]);
        let (line, head, body) = last_response(&out);
        assert_eq!(line, "HTTP/1.1 403 Forbidden", "{out}");
        assert_eq!(header(&head, "x-openshell-policy"), Some("realtime"));
        let j: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            j["detail"],
            "websocket endpoint requires a valid WebSocket upgrade request"
        );
        assert_eq!(j["protocol"], "websocket");
        // A new revision closes an open session with 1012.
        let mut c = w.in_sandbox(&py);
        c.args(["-c", WS_CLIENT, "/rt/live", "one", "WAIT"]);
        c.stdout(std::process::Stdio::piped());
        let child = c.spawn().unwrap();
        wait_until(
            "the session's first message",
            Duration::from_secs(20),
            || {
                l.up.ws_messages
                    .lock()
                    .unwrap()
                    .contains(&"one".to_string())
            },
        );
        std::thread::sleep(Duration::from_millis(300));
        let rules = w.rules("  other:\n    endpoints: [{host: x.test, port: 1}]\n    binaries: [{path: /t/bin/probe-a}]\n");
        w.policy().publish(rules);
        let out = String::from_utf8_lossy(&child.wait_with_output().unwrap().stdout).into_owned();
        assert_eq!(
            out.lines().collect::<Vec<_>>(),
            [
                "HTTP/1.1 101 Switching Protocols",
                "text:echo:one",
                "open",
                "close:1012",
                "eof"
            ],
            "{out}"
        );
    });
}

#[test]
fn request_bodies_are_rewritten_where_the_endpoint_asks() {
    let Some(curl) = curl_or_skip() else { return };
    World::run(move |w| {
        let l = start(w, &curl);
        let p = "openshell:resolve:env:GITHUB_TOKEN";
        let json = format!("{{\"token\":\"{p}\",\"n\":1}}");
        let (out, code) = l.curl(
            w,
            &[
                "-H",
                "Content-Type: application/json",
                "--data",
                &json,
                "https://body.test:9443/rw",
            ],
        );
        assert_eq!(code, 0, "{out}");
        let j: serde_json::Value = serde_json::from_str(&last_response(&out).2).unwrap();
        let want = format!("{{\"token\":\"{SECRET}\",\"n\":1}}");
        assert_eq!(j["body"], want.as_str(), "the upstream got the value");
        let heads = l.up.heads();
        assert!(
            heads[0].contains(&format!("content-length: {}", want.len())),
            "{heads:?}"
        );
        assert!(!heads.concat().contains("openshell:resolve"));
        // A chunked form body too.
        let (out, _) = l.curl(
            w,
            &[
                "-H",
                "Transfer-Encoding: chunked",
                "--data",
                &format!("t={p}"),
                "https://body.test:9443/form",
            ],
        );
        let j: serde_json::Value = serde_json::from_str(&last_response(&out).2).unwrap();
        assert_eq!(j["body"], format!("t={SECRET}").as_str(), "{out}");
        // Not a textual type: never rewritten, and the placeholder never reaches the upstream.
        let before = l.up.requests().len();
        let _ = l.curl(
            w,
            &[
                "-H",
                "Content-Type: application/octet-stream",
                "--data",
                &format!("x{p}"),
                "https://body.test:9443/bin",
            ],
        );
        assert!(!l.up.heads().concat().contains("openshell:resolve"));
        assert!(l.up.requests().len() <= before + 1);
        // Too big to buffer: 413, nothing sent.
        let big = w.tmp.path().join("big.json");
        std::fs::write(&big, format!("\"{p}{}\"", "a".repeat(300 * 1024))).unwrap();
        let before = l.up.requests().len();
        let (out, _) = l.curl(
            w,
            &[
                "-H",
                "Content-Type: application/json",
                "--data-binary",
                &format!("@{}", big.display()),
                "https://body.test:9443/big",
            ],
        );
        let (line, _, body) = last_response(&out);
        assert_eq!(line, "HTTP/1.1 413 Payload Too Large", "{out:.300}");
        let j: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(j["error"], "request_body_too_large");
        assert_eq!(l.up.requests().len(), before);
        // Where the endpoint does not ask (cred.test), a JSON body keeps failing closed.
        let _ = l.curl(
            w,
            &[
                "-H",
                "Content-Type: application/json",
                "--data",
                &json,
                "https://cred.test:9443/quiet/nobody",
            ],
        );
        assert!(!l.up.heads().concat().contains("openshell:resolve"));
    });
}
