//! HTTPS egress through `run`, as OpenShell users write it, through the real binary: TLS
//! interception with the sandbox's own CA (its public files in the view, the trust variables
//! in the child), `protocol: rest` rules allowing what they allow, `--credential` values that
//! only ever exist in the supervisor, and the 503 when interception is unavailable.
//!
//! The supervisor runs in the test-made outer namespace (tests/support/egress: upstream
//! addresses on its `lo`, no route anywhere, checked before the first packet), in a private
//! mount namespace where the test's hosts file is `/etc/hosts` and a bundle holding the tests'
//! upstream CA is the system bundle, which the proxy trusts upstream as it would any.

mod support;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use support::egress::binary::finish;
use support::egress::l7_servers::L7Upstream;
use support::egress::memory::{descendants, memory_holding};
use support::egress::*;
use support::skip::have;
use support::text;

/// The world of one test: the L7 upstreams, a workdir, and the binds of the supervisor's
/// mount namespace.
struct Https {
    up: Arc<L7Upstream>,
    work: PathBuf,
    binds: Vec<(PathBuf, PathBuf)>,
}

fn setup(w: &mut World) -> Https {
    let up = w.rt.block_on(L7Upstream::start());
    let work = w.tmp.path().join("work");
    std::fs::create_dir(&work).unwrap();
    // Writable by the run's own uid, whichever it gets.
    std::fs::set_permissions(&work, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let bundle = bundle_with(w.tmp.path(), &up.ca_pem);
    let binds = vec![
        (w.hosts.clone(), PathBuf::from("/etc/hosts")),
        (bundle, PathBuf::from(SYSTEM_BUNDLE)),
    ];
    Https { up, work, binds }
}

impl Https {
    fn run(&self, args: &[&str], env: &[(&str, &str)], script: &str) -> Output {
        let mut c = osb_in(&self.binds, &self.work);
        c.args(["run", "--log-level", "warn,egress=info"])
            .args(args)
            .args(["--", "sh", "-c", script]);
        for (k, v) in env {
            c.env(k, v);
        }
        finish(c, Duration::from_secs(180))
    }
}

const FS: &str = "\
version: 1
filesystem_policy:
  include_workdir: true
  read_only: [/usr, /lib, /lib64, /bin, /etc]
  read_write: [/tmp]
";

#[test]
fn a_rest_policy_allows_what_it_allows_over_intercepted_https() {
    if !require() || !have("curl") || !have("python3") {
        return;
    }
    World::run(|w| {
        let h = setup(w);
        let policy = format!(
            "{FS}network_policies:
  api_ro:
    endpoints:
      - host: secure-api.test
        port: 9443
        protocol: rest
        enforcement: enforce
        access: read-only
    binaries: [{{path: /usr/bin/curl}}, {{path: \"/usr/bin/python3*\"}}]
"
        );
        std::fs::write(h.work.join("policy.yaml"), policy).unwrap();
        let script = r#"
stat -c '%a %U %n' /etc/openshell-tls/* | sed 's#/etc/openshell-tls/##'
ls -A /etc/openshell-tls | wc -l
grep -l 'PRIVATE KEY' /etc/openshell-tls/* || echo no-key
env | grep -E '^(SSL_CERT_FILE|REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE|GIT_SSL_CAINFO|NODE_EXTRA_CA_CERTS|DENO_CERT)=' | sort
echo ---
curl -sS --max-time 20 https://secure-api.test:9443/ok; echo
curl -sS --max-time 20 -I -o /tmp/head.out -w '%{http_code}\n' https://secure-api.test:9443/head
echo ---
curl -sS --max-time 20 -i -X POST https://secure-api.test:9443/x
echo; echo ---
python3 -c "import urllib.request;print(urllib.request.urlopen('https://secure-api.test:9443/py').read().decode())"
curl -sS --max-time 20 -v https://secure-api.test:9443/who 2>&1 | grep -o 'issuer:.*OpenShell Sandbox CA' | head -1
"#;
        let out = h.run(
            &["--policy", "policy.yaml", "--report-json", "report.json"],
            &[],
            script,
        );
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        let parts: Vec<&str> = stdout.split("---\n").collect();
        assert_eq!(parts.len(), 4, "{stdout}");
        // The two public files, 0444, nothing else there, and no key.
        let files: Vec<&str> = parts[0].lines().collect();
        assert_eq!(
            &files[..4],
            [
                "444 root ca-bundle.pem",
                "444 root openshell-ca.pem",
                "2",
                "no-key"
            ],
            "{stdout}"
        );
        assert_eq!(
            &files[4..],
            [
                "CURL_CA_BUNDLE=/etc/openshell-tls/ca-bundle.pem",
                "DENO_CERT=/etc/openshell-tls/openshell-ca.pem",
                "GIT_SSL_CAINFO=/etc/openshell-tls/ca-bundle.pem",
                "NODE_EXTRA_CA_CERTS=/etc/openshell-tls/openshell-ca.pem",
                "REQUESTS_CA_BUNDLE=/etc/openshell-tls/ca-bundle.pem",
                "SSL_CERT_FILE=/etc/openshell-tls/ca-bundle.pem",
            ],
            "{stdout}"
        );
        // read-only allows GET and HEAD.
        let ok: Vec<&str> = parts[1].lines().collect();
        let j: serde_json::Value =
            serde_json::from_str(ok[0]).unwrap_or_else(|e| panic!("{e}: {stdout}"));
        assert_eq!(j["request"], "GET /ok HTTP/1.1");
        assert_eq!(ok[1], "200", "{stdout}");
        // ... and denies POST: status, header and body, inside TLS.
        let denied = parts[2].trim_end();
        let (line, head, body) = split_response(&denied[denied.rfind("HTTP/1.1 ").unwrap()..]);
        assert_eq!(line, "HTTP/1.1 403 Forbidden", "{stdout}");
        let hv = |name: &str| {
            head.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
            })
        };
        assert_eq!(hv("x-openshell-policy").as_deref(), Some("api_ro"));
        assert_eq!(hv("content-type").as_deref(), Some("application/json"));
        assert_eq!(hv("connection").as_deref(), Some("close"));
        let j: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(j["error"], "policy_denied");
        assert_eq!(j["detail"], "POST /x not permitted by policy");
        assert_eq!(j["layer"], "l7");
        assert_eq!(j["protocol"], "rest");
        assert_eq!(j["binary"], "/usr/bin/curl");
        // Python's urllib, through the same interception.
        let py: Vec<&str> = parts[3].lines().collect();
        assert!(
            py[0].contains("\"request\":\"GET /py HTTP/1.1\""),
            "{stdout}"
        );
        assert!(py[1].contains("OpenShell Sandbox CA"), "{stdout}");
        // What the upstream received: the allowed requests only, its SNI the host.
        let reqs = h.up.requests();
        assert_eq!(
            reqs,
            [
                "GET /ok HTTP/1.1",
                "HEAD /head HTTP/1.1",
                "GET /py HTTP/1.1",
                "GET /who HTTP/1.1"
            ],
            "{stdout}"
        );
        assert!(
            h.up.handshakes
                .lock()
                .unwrap()
                .iter()
                .all(|(sni, _)| sni.as_deref() == Some("secure-api.test"))
        );
        // The report counts connections and requests.
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(h.work.join("report.json")).unwrap()).unwrap();
        assert_eq!(
            report["egress"]["requests"],
            serde_json::json!({"allowed": 4, "audited": 0, "denied": 1}),
            "{report}"
        );
        assert_eq!(report["egress"]["denied"], 0);
        // And the log says each decision.
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains("HTTP:POST [MED] DENIED /usr/bin/curl"),
            "{stderr}"
        );
    });
}

#[test]
fn a_credential_reaches_its_bound_endpoint_only_and_never_the_sandbox() {
    if !require() || !have("curl") {
        return;
    }
    const SECRET: &str = "rg-REAL-9c1d7e5a";
    World::run(|w| {
        let h = setup(w);
        let policy = format!(
            "{FS}network_policies:
  tls:
    endpoints:
      - {{host: cred.test, port: 9443}}
      - {{host: secure.test, port: 9443}}
    binaries: [{{path: /usr/bin/curl}}]
"
        );
        std::fs::write(h.work.join("policy.yaml"), policy).unwrap();
        let script = r#"
echo "token=$RG_TOKEN"
curl -sS --max-time 20 -H "Authorization: Bearer $RG_TOKEN" "https://cred.test:9443/quiet/$RG_TOKEN"; echo
curl -sS --max-time 20 -i -H "Authorization: Bearer $RG_TOKEN" https://secure.test:9443/steal; echo
echo ---
cat /proc/self/environ /proc/*/environ 2>/dev/null | tr '\0' '\n' | grep -c rg-REAL || true
grep -rs rg-REAL /tmp /etc/openshell-tls . | wc -l
"#;
        let out = h.run(
            &[
                "--policy",
                "policy.yaml",
                "--credential",
                "RG_TOKEN@cred.test:9443",
                "--report-json",
                "report.json",
            ],
            &[("RG_TOKEN", SECRET)],
            script,
        );
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines[0], "token=openshell:resolve:env:RG_TOKEN", "{stdout}");
        assert_eq!(lines[1], "quiet ok", "{stdout}");
        // To an endpoint it is not bound to: refused before it leaves.
        let at = stdout
            .find("HTTP/1.1 403")
            .unwrap_or_else(|| panic!("{stdout}"));
        let (line, _, body) = split_response(stdout[at..].split("\n---").next().unwrap());
        assert_eq!(line, "HTTP/1.1 403 Forbidden");
        let j: serde_json::Value = serde_json::from_str(body.trim()).unwrap();
        assert_eq!(j["error"], "credential_endpoint_mismatch", "{body}");
        // The upstream got the value where it was bound, no placeholder, and nothing at
        // secure.test.
        assert_eq!(h.up.requests(), [format!("GET /quiet/{SECRET} HTTP/1.1")]);
        let heads = h.up.heads().concat();
        assert!(
            heads.contains(&format!("authorization: Bearer {SECRET}")),
            "{heads}"
        );
        assert!(!heads.contains("openshell:resolve"), "{heads}");
        // Nowhere in the sandbox: its environment, /proc, files; nor the report or our log.
        let tail: Vec<&str> = stdout.split("---\n").nth(1).unwrap().lines().collect();
        assert_eq!(tail, ["0", "0"], "{stdout}");
        assert!(!stdout.contains(SECRET), "{stdout}");
        let report = std::fs::read_to_string(h.work.join("report.json")).unwrap();
        assert!(!report.contains(SECRET), "{report}");
        let stderr = text(&out.stderr);
        assert!(!stderr.contains(SECRET), "{stderr}");
        assert!(stderr.contains("/quiet/[CREDENTIAL]"), "{stderr}");
    });
}

#[test]
fn credential_flags_are_usage_errors_when_they_cannot_work() {
    let bin = env!("CARGO_BIN_EXE_openshell-sandbox");
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut c = std::process::Command::new(bin);
        c.arg("run")
            .args(args)
            .args(["--", "true"])
            .env_remove("NOPE");
        for (k, v) in env {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        (out.status.code(), text(&out.stderr))
    };
    for (args, env, why) in [
        (
            vec!["--allow-net", "api.test", "--credential", "NOPE@api.test"],
            vec![],
            "--credential NOPE@api.test: the variable NOPE is not set",
        ),
        (
            vec!["--allow-net", "api.test", "--credential", "E@api.test"],
            vec![("E", "")],
            "--credential E@api.test: the variable E is not set (or empty)",
        ),
        (
            vec!["--allow-net", "api.test", "--credential", "K@other.test"],
            vec![("K", "v")],
            "no network rule allows other.test:443",
        ),
        (
            vec!["--credential", "K@api.test"],
            vec![("K", "v")],
            "--credential needs network rules",
        ),
        (
            vec![
                "--allow-net",
                "api.test",
                "--credential",
                "bad-name@api.test",
            ],
            vec![],
            "NAME must be a variable name",
        ),
        (
            vec![
                "--allow-net",
                "api.test",
                "--credential",
                "K@api.test",
                "--inherit-env",
                "K",
            ],
            vec![("K", "v")],
            "--inherit-env K: K is a --credential, whose value never enters the sandbox",
        ),
    ] {
        let (code, err) = run(&args, &env);
        assert_eq!(code, Some(125), "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
        assert!(!err.contains("v\n"), "{err}");
    }
}

#[test]
fn check_explain_lists_credentials_and_bindings_never_values() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        format!(
            "{FS}network_policies:
  model:
    endpoints:
      - {{host: api.model.test, port: 443, protocol: rest, access: full, credential_binding: {{provider: MODEL_KEY}}}}
    binaries: [{{path: /usr/bin/python3}}]
"
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_openshell-sandbox"))
        .arg("check")
        .arg("--policy")
        .arg(&policy)
        .args(["--allow-net", "gh.test", "--credential", "GH@gh.test"])
        .args(["--credential", "MODEL_KEY", "--explain"])
        .env("GH", "ghp-secret-1")
        .env("MODEL_KEY", "sk-model-secret-2")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("  GH -> gh.test:443\n")
            && stdout.contains("  MODEL_KEY -> api.model.test:443\n"),
        "{stdout}"
    );
    assert!(stdout.contains("[rest]"), "{stdout}");
    let all = format!("{stdout}{}", text(&out.stderr));
    assert!(
        !all.contains("ghp-secret-1") && !all.contains("sk-model-secret-2"),
        "{all}"
    );
}

#[test]
fn a_host_without_the_ca_directory_is_left_without_it_and_the_child_sees_the_two_files() {
    if !require() || !have("curl") {
        return;
    }
    World::run(|w| {
        let h = setup(w);
        std::fs::write(h.work.join("policy.yaml"), FS).unwrap();
        // The supervisor's /etc: the machine's, through an overlay whose upper layer hides
        // any /etc/openshell-tls the machine has (a whiteout) and catches whatever the run
        // would write there.
        let upper = w.tmp.path().join("etc-upper");
        std::fs::create_dir_all(upper.join("up")).unwrap();
        let whiteout = std::ffi::CString::new(
            upper
                .join("up/openshell-tls")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .unwrap();
        // SAFETY: mknod of a 0/0 character device (an overlay whiteout) at a C string path.
        let rc = unsafe { libc::mknod(whiteout.as_ptr(), libc::S_IFCHR | 0o644, 0) };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        let script = "ls -A /etc/openshell-tls; stat -c '%a %U' /etc/openshell-tls/*; \
            stat -c '%a' /etc/openshell-tls; cat /etc/hosts | grep -c secure-api.test; \
            cmp -s /etc/openshell-tls/openshell-ca.pem /dev/null || echo ca-nonempty; \
            touch /etc/openshell-tls/x 2>&1 | grep -o 'Read-only file system'";
        let mut c = osb_in_etc_overlay(&upper, &h.binds, &h.work);
        c.args(["run", "--log-level", "warn,egress=info"])
            .args(["--policy", "policy.yaml", "--report-json", "report.json"])
            .args([
                "--allow-net",
                "secure-api.test:9443",
                "--",
                "sh",
                "-c",
                script,
            ]);
        let out = finish(c, Duration::from_secs(180));
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            stdout.lines().collect::<Vec<_>>(),
            [
                "ca-bundle.pem",
                "openshell-ca.pem",
                "444 root",
                "444 root",
                "755",
                "1",
                "ca-nonempty",
                "Read-only file system"
            ],
            "{out:?}"
        );
        // Nothing of the run is left in the supervisor's /etc: the whiteout is all there is.
        let left: Vec<String> = std::fs::read_dir(upper.join("up"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, ["openshell-tls"]);
        let meta = std::fs::symlink_metadata(upper.join("up/openshell-tls")).unwrap();
        assert!(
            std::os::unix::fs::FileTypeExt::is_char_device(&meta.file_type()),
            "{meta:?}"
        );
        // /etc stays one Landlock rule: not split around a directory the view made.
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(h.work.join("report.json")).unwrap()).unwrap();
        let landlock = report["layers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["layer"] == "landlock-fs")
            .unwrap();
        let rules: usize = landlock["detail"]
            .as_str()
            .unwrap()
            .split(", ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert!(rules < 40, "{landlock}");
        assert!(
            !text(&out.stderr).contains("TLS interception unavailable"),
            "{out:?}"
        );
    });
}

#[test]
fn without_a_view_root_for_the_ca_connects_get_503_not_a_raw_tunnel() {
    if !require() || !have("curl") {
        return;
    }
    World::run(|w| {
        let h = setup(w);
        // Granting / leaves the view without a root of its own: the CA cannot be shown.
        let script = r#"python3 -c "
import socket
s = socket.create_connection(('10.200.0.1', 3128))
s.sendall(b'CONNECT secure.test:9443 HTTP/1.1\r\nHost: secure.test:9443\r\n\r\n')
out = b''
while True:
    b = s.recv(4096)
    if not b: break
    out += b
print(out.decode())
"
env | grep -c '^SSL_CERT_FILE=' || true"#;
        let out = h.run(
            &["--ro", "/", "--allow-net", "secure.test:9443"],
            &[],
            script,
        );
        let stdout = text(&out.stdout);
        assert!(stdout.contains("HTTP/1.1 503"), "{out:?}");
        let at = stdout.find("HTTP/1.1 503").unwrap();
        let (_, _, body) = split_response(&stdout[at..]);
        let j: serde_json::Value = serde_json::from_str(body.lines().next().unwrap()).unwrap();
        assert_eq!(j["error"], "tls_termination_unavailable", "{stdout}");
        assert!(
            stdout.trim_end().ends_with('0'),
            "no trust variables: {stdout}"
        );
        assert!(h.up.requests().is_empty());
        let stderr = text(&out.stderr);
        assert!(stderr.contains("TLS interception unavailable"), "{stderr}");
    });
}

/// pip's index, a wheel, a bare git repository for dumb HTTP, and a file, under `files`.
fn tool_files(files: &Path) {
    std::fs::create_dir_all(files.join("simple/osbdemo")).unwrap();
    std::fs::create_dir_all(files.join("pkgs")).unwrap();
    std::fs::write(files.join("hello.txt"), "hello over intercepted tls\n").unwrap();
    std::fs::write(
        files.join("simple/osbdemo/index.html"),
        "<html><body><a href=\"../../pkgs/osbdemo-1.0-py3-none-any.whl\">osbdemo-1.0-py3-none-any.whl</a></body></html>\n",
    )
    .unwrap();
    let wheel = files.join("pkgs/osbdemo-1.0-py3-none-any.whl");
    let st = std::process::Command::new("python3")
        .args(["-c", "import sys,zipfile
z=zipfile.ZipFile(sys.argv[1],'w')
z.writestr('osbdemo/__init__.py','')
z.writestr('osbdemo-1.0.dist-info/METADATA','Metadata-Version: 2.1\\nName: osbdemo\\nVersion: 1.0\\n')
z.writestr('osbdemo-1.0.dist-info/WHEEL','Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')
z.writestr('osbdemo-1.0.dist-info/RECORD','')
z.close()"])
        .arg(&wheel)
        .status()
        .unwrap();
    assert!(st.success());
    let src = files.parent().unwrap().join("repo-src");
    let sh = format!(
        "set -e; git init -q {s}; cd {s}; echo tracked > f.txt; git add f.txt; git -c user.email=t@t -c user.name=t commit -qm one; git clone -q --bare {s} {b}; cd {b}; git update-server-info",
        s = src.display(),
        b = files.join("repo.git").display()
    );
    let st = std::process::Command::new("sh")
        .args(["-c", &sh])
        .status()
        .unwrap();
    assert!(st.success());
}

/// Node's own TLS client through an explicit CONNECT (Node before 22.21 has no proxy support
/// in fetch), trusting the CA through NODE_EXTRA_CA_CERTS; then fetch where Node honours
/// NODE_USE_ENV_PROXY.
const NODE: &str = r#"
const http=require('http'),tls=require('tls');
const [maj,min]=process.versions.node.split('.').map(Number);
const req=http.request({host:'10.200.0.1',port:3128,method:'CONNECT',path:'pkgs.test:9443'});
req.on('connect',(res,socket)=>{
  if(res.statusCode!==200){console.log('CONNECT '+res.statusCode);return;}
  const s=tls.connect({socket,servername:'pkgs.test'},()=>s.write('GET /files/hello.txt HTTP/1.1\r\nHost: pkgs.test:9443\r\nConnection: close\r\n\r\n'));
  let d='';s.on('data',c=>d+=c);s.on('error',e=>console.log('ERR '+e.message));
  s.on('end',()=>{console.log('tls: '+d.split('\r\n\r\n')[1].trim());
    if(maj>22||(maj===22&&min>=21)){fetch('https://pkgs.test:9443/files/hello.txt').then(r=>r.text()).then(t=>console.log('fetch: '+t.trim())).catch(e=>console.log('fetch ERR '+(e.cause||e)));}
    else console.log('fetch: node '+process.versions.node+' has no proxy support in fetch');});
});
req.end();
"#;

#[test]
fn real_clients_clone_download_and_fetch_over_intercepted_https() {
    if !require() || !have("curl") || !have("python3") || !have("git") {
        return;
    }
    let git_http = std::process::Command::new("git")
        .arg("--exec-path")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|p| PathBuf::from(p.trim()).join("git-remote-https"))
        .and_then(|p| std::fs::canonicalize(p).ok())
        .expect("git-remote-https");
    let node = have("node");
    World::run(move |w| {
        let h = setup(w);
        let files = w.tmp.path().join("l7files");
        tool_files(&files);
        *h.up.files.lock().unwrap() = Some(files);
        // OpenShell's shape for a package index: read-only REST, enforced.
        let policy = format!(
            "{FS}network_policies:
  pypi_like:
    endpoints:
      - {{host: pkgs.test, port: 9443, protocol: rest, enforcement: enforce, access: read-only}}
    binaries:
      - {{path: \"/usr/bin/python3*\"}}
      - {{path: {git}}}
      - {{path: /usr/bin/node}}
      - {{path: /usr/bin/curl}}
",
            git = git_http.display()
        );
        let policy = policy.replace("read_write: [/tmp]", "read_write: [/tmp, /dev/null]");
        std::fs::write(h.work.join("policy.yaml"), policy).unwrap();
        let script = format!(
            r#"
export GIT_TERMINAL_PROMPT=0 HOME=/tmp
git clone -q https://pkgs.test:9443/files/repo.git /tmp/repo 2>&1 && cat /tmp/repo/f.txt
python3 -m pip download -q --no-deps --no-cache-dir --disable-pip-version-check --index-url https://pkgs.test:9443/files/simple/ osbdemo -d /tmp/dl 2>&1; ls /tmp/dl
python3 -c "import urllib.request;print(urllib.request.urlopen('https://pkgs.test:9443/files/hello.txt').read().decode().strip())"
curl -sS --max-time 20 https://pkgs.test:9443/files/hello.txt
python3 -c "import requests" 2>/dev/null && python3 -c "import requests;print(requests.get('https://pkgs.test:9443/files/hello.txt').text.strip())" || echo "requests: absent"
{node}
"#,
            node = if node {
                format!("node -e '{}'", NODE.replace('\'', "'\\''"))
            } else {
                "echo 'tls: hello over intercepted tls'; echo 'fetch: no node'".into()
            }
        );
        let out = h.run(&["--policy", "policy.yaml"], &[], &script);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines[0], "tracked", "git clone over https: {stdout}");
        assert_eq!(
            lines[1], "osbdemo-1.0-py3-none-any.whl",
            "pip download: {stdout}"
        );
        assert_eq!(lines[2], "hello over intercepted tls", "urllib: {stdout}");
        assert_eq!(lines[3], "hello over intercepted tls", "curl: {stdout}");
        if lines[4] == "requests: absent" {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("python3-requests is required (scripts/install-test-deps.sh)");
            }
            eprintln!("SKIPPED: python requests is not installed");
        } else {
            assert_eq!(lines[4], "hello over intercepted tls", "requests: {stdout}");
        }
        assert_eq!(
            lines[5], "tls: hello over intercepted tls",
            "node: {stdout}"
        );
        assert!(lines[6].starts_with("fetch: "), "{stdout}");
        if !lines[6].contains("no proxy support") && !lines[6].contains("no node") {
            assert_eq!(lines[6], "fetch: hello over intercepted tls", "{stdout}");
        } else {
            eprintln!("NOTE: {}", lines[6]);
        }
        // Every request reached the upstream through interception, as GETs.
        let reqs = h.up.requests();
        assert!(
            reqs.iter()
                .any(|r| r.starts_with("GET /files/repo.git/info/refs")),
            "{reqs:?}"
        );
        assert!(
            reqs.iter()
                .any(|r| r.starts_with("GET /files/pkgs/osbdemo-1.0-py3-none-any.whl")),
            "{reqs:?}"
        );
        assert!(
            reqs.iter()
                .all(|r| r.starts_with("GET ") || r.starts_with("HEAD ")),
            "{reqs:?}"
        );
    });
}

/// The real value is in the memory of no process below `run` (the sandboxed code and the
/// exec's init, a root fork of `run`), after a request carrying it was made: read from outside
/// (as root) in every writable mapping.
#[test]
fn a_credential_is_in_no_memory_of_the_sandboxed_processes() {
    if !require() || !have("curl") {
        return;
    }
    const SECRET: &str = "rg-MEM-4f0b2c71";
    World::run(|w| {
        let h = setup(w);
        let policy = format!(
            "{FS}network_policies:
  tls:
    endpoints:
      - {{host: cred.test, port: 9443}}
    binaries: [{{path: /usr/bin/curl}}]
"
        );
        std::fs::write(h.work.join("policy.yaml"), policy).unwrap();
        let script = r#"curl -sS --max-time 20 -H "Authorization: Bearer $RG_TOKEN" https://cred.test:9443/quiet/mem; echo; touch ready; exec sleep 60"#;
        let mut c = osb_in(&h.binds, &h.work);
        c.args(["run", "--log-level", "warn", "--policy", "policy.yaml"])
            .args(["--credential", "RG_TOKEN@cred.test:9443"])
            .args(["--", "sh", "-c", script])
            .env("RG_TOKEN", SECRET)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let mut sup = c.spawn().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !h.work.join("ready").exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the run never got ready"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let (mut sandboxed, mut roots) = (0, 0);
        for pid in descendants(sup.id()) {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let uid = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().next())
                .unwrap_or("0")
                .to_string();
            // Every process below `run`, the exec's init (root, a fork of `run`) included:
            // the store's values are in wipe-on-fork memory and our own environment block is
            // zeroed before the fork.
            let hits = memory_holding(pid, SECRET.as_bytes());
            assert!(
                hits.is_empty(),
                "PID {pid} (uid {uid}) holds the value: {hits:?}"
            );
            if uid == "0" {
                roots += 1;
                continue;
            }
            sandboxed += 1;
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            assert!(
                !environ
                    .windows(SECRET.len())
                    .any(|w| w == SECRET.as_bytes()),
                "PID {pid}'s environment"
            );
        }
        assert!(sandboxed >= 1, "no process of the sandbox's uid was found");
        assert!(roots >= 1, "the exec's init (root) was not found");
        // SAFETY: kill of our own child.
        unsafe { libc::kill(sup.id() as i32, libc::SIGTERM) };
        sup.wait().unwrap();
        // The value did travel, from the proxy to the upstream.
        let heads = h.up.heads().concat();
        assert!(
            heads.contains(&format!("authorization: Bearer {SECRET}")),
            "{heads}"
        );
    });
}
