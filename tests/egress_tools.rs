//! The egress proxy with real tools inside the sandbox namespace (curl, pip, git, node), each
//! allowed by a rule naming its own binary; and the identity and resolution cases that need a
//! process of their own: the rebinding name, the image pinned on first use, a policy path
//! that is a symlink, identity without sock_diag (tests/support/egress).

mod support;

use std::net::IpAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use openshell_sandbox::egress::{self, ProxyConfig, Resolve, ResolveError, ResolveFuture};
use support::egress::tools::{need as tool, python, real_path};
use support::egress::*;

fn rule(key: &str, host: &str, port: u16, binary: &Path) -> String {
    format!(
        "  {key}:\n    endpoints: [{{host: {host}, port: {port}}}]\n    binaries: [{{path: \"{}\"}}]\n",
        binary.display()
    )
}

#[test]
fn curl_via_connect_and_plain_http_and_a_403_when_denied() {
    if !require() {
        return;
    }
    let Some(curl) = tool("curl", real_path("curl")) else {
        return;
    };
    World::run(move |w| {
        w.start(
            &rule("curl_pub", "pub.test", 8080, &curl),
            ProxyConfig::default(),
        );
        let run = |args: &[&str]| {
            let mut c = w.in_sandbox(&curl);
            c.args(["-s", "-S", "--max-time", "20"]).args(args);
            output(c, Duration::from_secs(30))
        };
        // Plain HTTP: the absolute form through the proxy from the environment.
        let plain = run(&["http://pub.test:8080/plain?x=1"]);
        let v: serde_json::Value =
            serde_json::from_str(&plain).unwrap_or_else(|e| panic!("{e}: {plain}"));
        assert_eq!(v["request"], "GET /plain?x=1 HTTP/1.1");
        // CONNECT (any TCP): the same request through a tunnel.
        let tunnel = run(&["--proxytunnel", "http://pub.test:8080/tunnel"]);
        let v: serde_json::Value =
            serde_json::from_str(&tunnel).unwrap_or_else(|e| panic!("{e}: {tunnel}"));
        assert_eq!(v["request"], "GET /tunnel HTTP/1.1");
        // Denied: the 403 and its reason reach curl.
        let code = run(&[
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "http://other.test:8080/",
        ]);
        assert_eq!(code, "403");
        let mut c = w.in_sandbox(&curl);
        c.args(["-s", "-S", "--proxytunnel", "http://other.test:8080/"]);
        c.stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null());
        let e = c.output().unwrap();
        assert!(
            String::from_utf8_lossy(&e.stderr).contains("CONNECT tunnel failed, response 403"),
            "{e:?}"
        );
        assert_eq!(w.upstream.count(PRIVATE2), 0);
        assert_eq!(w.proxy().counters().total().allowed, 2);
    });
}

/// A minimal pure-Python wheel, written with Python's zipfile.
fn make_wheel(dir: &Path) {
    let script = r#"
import base64, hashlib, sys, zipfile, os
out = sys.argv[1]
files = {
  "demo_pkg/__init__.py": b"VALUE = 42\n",
  "demo_pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n",
  "demo_pkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
rec = []
for n, b in files.items():
    h = base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()
    rec.append(f"{n},sha256={h},{len(b)}")
rec.append("demo_pkg-1.0.dist-info/RECORD,,")
files["demo_pkg-1.0.dist-info/RECORD"] = ("\n".join(rec) + "\n").encode()
with zipfile.ZipFile(out, "w") as z:
    for n, b in files.items():
        z.writestr(n, b)
"#;
    std::fs::create_dir_all(dir.join("files")).unwrap();
    let st = Command::new("python3")
        .args(["-c", script])
        .arg(dir.join("files/demo_pkg-1.0-py3-none-any.whl"))
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::create_dir_all(dir.join("simple/demo-pkg")).unwrap();
    std::fs::write(
        dir.join("simple/demo-pkg/index.html"),
        "<html><body><a href=\"../../files/demo_pkg-1.0-py3-none-any.whl\">demo_pkg-1.0-py3-none-any.whl</a></body></html>\n",
    )
    .unwrap();
}

#[test]
fn pip_downloads_from_an_allowed_index() {
    if !require() {
        return;
    }
    let pip_ok = Command::new("python3")
        .args(["-m", "pip", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    let Some(py) = tool("python3 with pip", python().filter(|_| pip_ok)) else {
        return;
    };
    World::run(move |w| {
        make_wheel(&w.upstream.files);
        w.start(
            &rule("pypi_mirror", "pkgs.test", 8090, &py),
            ProxyConfig::default(),
        );
        let dl = w.tmp.path().join("dl");
        let mut c = w.in_sandbox("python3");
        c.args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--index-url",
            "http://pkgs.test:8090/simple/",
            "--trusted-host",
            "pkgs.test",
            "demo-pkg==1.0",
            "-d",
        ])
        .arg(&dl)
        .env("HOME", w.tmp.path())
        .env("PIP_CONFIG_FILE", "/dev/null")
        .env_remove("PIP_FIND_LINKS");
        let out = output(c, Duration::from_secs(120));
        assert!(
            dl.join("demo_pkg-1.0-py3-none-any.whl").is_file(),
            "pip: {out}"
        );
        let served = w.upstream.served.lock().unwrap().clone();
        assert!(served.iter().any(|p| p.ends_with(".whl")), "{served:?}");
        // The same binary is refused anything else.
        let mut c = w.in_sandbox("python3");
        c.args(["-c", "import urllib.request as u\ntry:\n  u.urlopen('http://pub.test:8080/')\nexcept Exception as e: print(e)"]);
        assert!(
            output(c, Duration::from_secs(30)).contains("403"),
            "python reached pub.test"
        );
    });
}

#[test]
fn git_clones_over_http_through_the_proxy() {
    if !require() {
        return;
    }
    let Some(git) = tool("git", real_path("git")) else {
        return;
    };
    World::run(move |w| {
        let src = w.tmp.path().join("src");
        let sh = format!(
            "set -e; git init -q {s}; cd {s}; echo hello > a.txt; git add a.txt; git -c user.name=t -c user.email=t@t commit -qm first; git clone -q --bare {s} {f}/repo.git; git -C {f}/repo.git update-server-info",
            s = src.display(),
            f = w.upstream.files.display()
        );
        assert!(
            Command::new("sh")
                .args(["-c", &sh])
                .env("HOME", w.tmp.path())
                .status()
                .unwrap()
                .success()
        );
        // git runs its HTTP transport in a helper child (git-remote-http): admitted as git's
        // descendant, which the rule asks for.
        w.start(
            &format!(
                "  forge:\n    endpoints: [{{host: git.test, port: 8090}}]\n    binaries: [{{path: \"{}\", descendants: true}}]\n",
                git.display()
            ),
            ProxyConfig::default(),
        );
        let out_dir = w.tmp.path().join("clone");
        let mut c = w.in_sandbox(&git);
        c.args(["clone", "-q", "http://git.test:8090/repo.git"])
            .arg(&out_dir)
            .env("HOME", w.tmp.path())
            .env("GIT_TERMINAL_PROMPT", "0");
        let out = output(c, Duration::from_secs(60));
        assert_eq!(
            std::fs::read_to_string(out_dir.join("a.txt")).unwrap_or_else(|e| panic!("{e}: {out}")),
            "hello\n"
        );
        let e = w.events.wait_for("git's helper", |e| e.rule == "forge");
        let caller = e.caller.unwrap();
        assert!(
            caller.exe.ends_with("git-remote-http") || caller.exe == git.to_str().unwrap(),
            "{caller:?}"
        );
    });
}

#[test]
fn node_fetch_uses_the_proxy_where_node_honours_node_use_env_proxy() {
    if !require() {
        return;
    }
    let Some(node) = tool("node", real_path("node")) else {
        return;
    };
    World::run(move |w| {
        w.start(
            &rule("node_pub", "pub.test", 8080, &node),
            ProxyConfig::default(),
        );
        let fetch = "fetch('http://pub.test:8080/node').then(r=>r.json()).then(j=>console.log(j.request)).catch(e=>console.log('ERR', String(e.cause && e.cause.code || e)))";
        let mut c = w.in_sandbox(&node);
        c.args(["-e", fetch]);
        let out = output(c, Duration::from_secs(30));
        let version = String::from_utf8(
            Command::new(&node)
                .arg("--version")
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        let (major, minor): (u32, u32) = {
            let v: Vec<u32> = version
                .trim()
                .trim_start_matches('v')
                .split('.')
                .filter_map(|p| p.parse().ok())
                .collect();
            (v[0], v[1])
        };
        if major >= 24 || (major == 22 && minor >= 21) {
            assert_eq!(out.trim(), "GET /node HTTP/1.1", "{version}: {out}");
        } else {
            // This Node ignores the proxy variables: its own resolver has no DNS in the
            // sandbox, and nothing reached any upstream.
            assert!(out.starts_with("ERR"), "{version}: {out}");
            assert_eq!(w.upstream.total(), 0);
            // A proxy-aware Node program goes through.
            let aware = "const u=new URL(process.env.HTTP_PROXY);require('http').get({host:u.hostname,port:u.port,path:'http://pub.test:8080/aware'},r=>{let d='';r.on('data',c=>d+=c);r.on('end',()=>console.log(JSON.parse(d).request))}).on('error',e=>console.log('ERR',e.code))";
            let mut c = w.in_sandbox(&node);
            c.args(["-e", aware]);
            assert_eq!(
                output(c, Duration::from_secs(30)).trim(),
                "GET /aware HTTP/1.1"
            );
        }
    });
}

/// Resolves to the public address once, then to loopback: a name an attacker rebinds.
struct Rebinding(AtomicUsize);

impl Resolve for Rebinding {
    fn resolve<'a>(&'a self, _: &'a str, _: u16) -> ResolveFuture<'a> {
        let n = self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            let ip: IpAddr = if n == 0 {
                PUBLIC.into()
            } else {
                "127.0.0.1".parse().unwrap()
            };
            Ok::<_, ResolveError>(vec![ip])
        })
    }
}

#[test]
fn a_rebinding_name_is_resolved_once_and_dialed_as_checked() {
    if !require() {
        return;
    }
    World::run(|w| {
        let r = Arc::new(Rebinding(AtomicUsize::new(0)));
        let rules = w.rules("  wild:\n    endpoints: [{host: \"*.wild.test\", port: 8080}]\n    binaries: [{path: /t/bin/probe-a}]\n");
        w.start_with(rules, r.clone(), ProxyConfig::default());
        let c = "CONNECT re.wild.test:8080 HTTP/1.1\\r\\n\\r\\n";
        assert!(w.probe("probe-a", &[c, "once"]).ends_with("once"));
        assert_eq!(r.0.load(Ordering::SeqCst), 1, "one resolution per request");
        assert_eq!(w.upstream.count(PUBLIC), 1);
        // The next request resolves again, and its answer is checked again.
        let b = json_body(&w.probe("probe-a", &[c]));
        assert_eq!(b["error"], "ssrf_denied");
        assert_eq!(w.upstream.count(std::net::Ipv4Addr::LOCALHOST), 0);
    });
}

#[test]
fn an_executable_changed_after_first_use_is_refused() {
    if !require() {
        return;
    }
    World::run(|w| {
        w.start("  p:\n    endpoints: [{host: pub.test, port: 8080}]\n    binaries: [{path: /t/bin/probe-a}]\n", ProxyConfig::default());
        let c = "CONNECT pub.test:8080 HTTP/1.1\\r\\n\\r\\n";
        assert!(w.probe("probe-a", &[c, "1"]).ends_with('1'));
        let path = w.bin.join("probe-a");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(b"\0tampered");
        std::fs::write(&path, bytes).unwrap();
        let b = json_body(&w.probe("probe-a", &[c]));
        let r = b["reason"].as_str().unwrap();
        assert!(r.contains("Binary integrity violation"), "{r}");
    });
}

#[test]
fn a_policy_path_that_is_a_symlink_admits_its_target() {
    if !require() {
        return;
    }
    World::run(|w| {
        std::os::unix::fs::symlink("probe-a", w.bin.join("link-a")).unwrap();
        let mut rules = w.rules("  p:\n    endpoints: [{host: pub.test, port: 8080}]\n    binaries: [{path: /t/bin/link-a}]\n");
        let root = Path::new("/");
        rules.expand_binary_links(&|p| egress::procfs::links_in_root(root, p));
        let resolver = Arc::new(egress::SandboxResolver::new(Some(w.hosts.clone()), false));
        w.start_with(rules, resolver, ProxyConfig::default());
        let c = "CONNECT pub.test:8080 HTTP/1.1\\r\\n\\r\\n";
        assert!(w.probe("probe-a", &[c, "s"]).ends_with('s'));
        assert_eq!(
            json_body(&w.probe("probe-b", &[c]))["error"],
            "policy_denied"
        );
    });
}

#[test]
fn identity_without_sock_diag_reads_the_namespaces_tcp_table() {
    if !require() {
        return;
    }
    World::run(|w| {
        use std::os::fd::AsFd;
        let socks = egress::netns::open_in(w.inner.as_fd(), egress::netns::PROXY_ADDR).unwrap();
        let identity = Arc::new(egress::procfs::ProcIdentity::new(w.inner.as_fd(), None).unwrap());
        let rules = w.rules("  p:\n    endpoints: [{host: pub.test, port: 8080}]\n    binaries: [{path: /t/bin/probe-a}]\n");
        let policy = egress::PolicyHandle::new(rules);
        let resolver = Arc::new(egress::SandboxResolver::new(Some(w.hosts.clone()), false));
        let _g = w.rt.enter();
        let p = egress::Proxy::start(
            socks.listener,
            policy,
            identity,
            resolver,
            w.events.clone(),
            ProxyConfig::default(),
        )
        .unwrap();
        w.proxy = Some(p);
        let c = "CONNECT pub.test:8080 HTTP/1.1\\r\\n\\r\\n";
        assert!(w.probe("probe-a", &[c, "t"]).ends_with('t'));
        assert_eq!(
            json_body(&w.probe("probe-b", &[c]))["error"],
            "policy_denied"
        );
    });
}
