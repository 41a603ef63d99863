//! The L7 tests' world (`tests/egress_l7.rs`, `tests/egress_l7_messages.rs`): the interceptor
//! with a sandbox CA, the test upstreams' CA trusted upstream through the test-only knob, a
//! credential store, and the REST rules (`RULES`) on the hyper upstreams of
//! `l7_servers` (plain 8180, TLS 9443).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use super::l7_servers::L7Upstream;
use super::tools::{git_http, need, python, real_path};
use super::{World, require, split_response};
use openshell_sandbox::egress::tls::{self, SandboxCa};
use openshell_sandbox::egress::{Binding, Credentials, Interceptor, ProxyConfig};

pub const RULES: &str = r#"
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
    binaries: [{path: CURL}, {path: PYTHON}]
  tls_raw:
    endpoints:
      - {host: raw.test, port: 9443, tls: skip}
      - {host: rawcred.test, port: 9443, tls: skip}
    binaries: [{path: CURL}, {path: /t/bin/probe-a}]
"#;

/// One world with the interceptor, the test upstreams and the CA files for the child.
pub struct L7 {
    pub up: Arc<L7Upstream>,
    pub interceptor: Arc<Interceptor>,
    pub ca: Arc<SandboxCa>,
    pub tls_dir: PathBuf,
    pub curl: PathBuf,
    pub creds_env: Vec<(String, String)>,
}

pub fn start(w: &mut World, curl: &Path) -> L7 {
    start_timed(w, curl, Duration::from_secs(10))
}

pub fn start_timed(w: &mut World, curl: &Path, head_timeout: Duration) -> L7 {
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
    pub fn cmd(&self, w: &World, program: &Path) -> Command {
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
    pub fn curl(&self, w: &World, args: &[&str]) -> (String, i32) {
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

pub fn curl_or_skip() -> Option<PathBuf> {
    if !require() {
        return None;
    }
    need("curl", real_path("curl"))
}

/// The last response of curl's `-i` output: (status line, head, body).
pub fn last_response(out: &str) -> (String, String, String) {
    let at = out
        .rfind("HTTP/1.1 ")
        .unwrap_or_else(|| panic!("no response: {out:?}"));
    split_response(&out[at..])
}

pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

pub const SECRET: &str = "ghp_REAL_VALUE_1f2e3d";
