//! Who is calling, under attack, through the real binary (`run --policy`): hostile children
//! that try to have the proxy take an allowed binary for the caller. The attacker's own
//! binary is allowed nowhere; an allowed one (`sleep`) holds an inherited copy of its socket.
//! The world is tests/support/egress's (upstreams in a test-made namespace with no route).

mod support;

use std::time::Duration;

use support::egress::binary::*;
use support::egress::identity::*;
use support::egress::*;

#[test]
fn a_thread_of_an_exited_leader_is_a_holder_of_its_socket() {
    if !ready() {
        return;
    }
    World::run(|w| {
        let work = workdir(w, &policy(&format!("      - path: {SLEEP}\n")));
        let hostile = work.join("hostile");
        let (stdout, stderr) = run(
            w,
            &work,
            &[hostile.to_str().unwrap(), "zombie", SLEEP, "pub.test:8080"],
        );
        let a = answers(&stdout);
        assert_eq!(a.len(), 1, "{stdout}\n{stderr}");
        let r = reason(&a[0]);
        assert!(
            r.starts_with(&format!(
                "binary '{}' not allowed in policy 'holder'",
                hostile.display()
            )),
            "{r}\n{stderr}"
        );
        assert_eq!(w.upstream.total(), 0, "nothing reached an upstream");
        assert!(!stderr.contains("without a frozen sandbox"), "{stderr}");
    });
}

/// The parked socket is refused either way the race with the proxy's scan goes: seen in
/// flight, or (when the scan came first) seen in the attacker's own table.
fn parked_refusal(r: &str, attacker: &str) {
    eprintln!("refused: {r}");
    assert!(
        r.contains("file descriptors are in flight between the sandbox's processes")
            || r.starts_with(&format!(
                "binary '{attacker}' not allowed in policy 'holder'"
            )),
        "{r}"
    );
}

#[test]
fn a_socket_parked_in_flight_is_not_decided_on_the_visible_holder() {
    if !ready() {
        return;
    }
    World::run(|w| {
        let work = workdir(w, &policy(&format!("      - path: {SLEEP}\n")));
        let hostile = work.join("hostile");
        let (stdout, stderr) = run(
            w,
            &work,
            &[hostile.to_str().unwrap(), "park", SLEEP, "pub.test:8080"],
        );
        let a = answers(&stdout);
        assert_eq!(a.len(), 1, "{stdout}\n{stderr}");
        parked_refusal(&reason(&a[0]), hostile.to_str().unwrap());
        assert!(stderr.contains("DENIED"), "the refusal is logged: {stderr}");
        assert_eq!(w.upstream.total(), 0);
    });
}

const PARK_PY: &str = r#"
import os, socket, sys, time
s = socket.socket()
os.set_inheritable(s.fileno(), True)
if os.fork() == 0:
    os.execv(sys.argv[1], [sys.argv[1], "5"])
time.sleep(0.2)
a, b = socket.socketpair()
s.connect(("10.200.0.1", 3128))
socket.send_fds(a, [b"x"], [s.fileno()])
s.close()
time.sleep(0.5)
_, fds, _, _ = socket.recv_fds(b, 1, 1)
t = socket.socket(fileno=fds[0])
t.sendall(b"CONNECT pub.test:8080 HTTP/1.1\r\nHost: pub.test:8080\r\n\r\nhello")
t.settimeout(5)
data = b""
while not data.endswith(b"hello"):
    try:
        chunk = t.recv(8192)
    except OSError:
        break
    if not chunk:
        break
    data += chunk
head, _, body = data.decode(errors="replace").partition("\r\n\r\n")
print(head.split("\r\n")[0])
print("BODY " + body.replace("\n", " "))
"#;

#[test]
fn python_parking_its_socket_in_flight_is_refused() {
    if !ready() || !have_path("/usr/bin/python3") {
        return;
    }
    World::run(|w| {
        let work = workdir(w, &policy(&format!("      - path: {SLEEP}\n")));
        std::fs::write(work.join("park.py"), PARK_PY).unwrap();
        let script = work.join("park.py");
        let (stdout, stderr) = run(
            w,
            &work,
            &["/usr/bin/python3", script.to_str().unwrap(), SLEEP],
        );
        let a = answers(&stdout);
        assert_eq!(a.len(), 1, "{stdout}\n{stderr}");
        let python = std::fs::canonicalize("/usr/bin/python3").unwrap();
        parked_refusal(&reason(&a[0]), python.to_str().unwrap());
        assert_eq!(w.upstream.total(), 0);
    });
}

#[test]
fn a_socket_moved_in_and_out_of_flight_is_refused_every_time() {
    if !ready() {
        return;
    }
    World::run(|w| {
        let work = workdir(w, &policy(&format!("      - path: {SLEEP}\n")));
        let hostile = work.join("hostile");
        let (stdout, stderr) = run(
            w,
            &work,
            &[
                hostile.to_str().unwrap(),
                "flip",
                SLEEP,
                "pub.test:8080",
                "6",
            ],
        );
        let a = answers(&stdout);
        assert_eq!(a.len(), 6, "{stdout}\n{stderr}");
        for x in &a {
            parked_refusal(&reason(x), hostile.to_str().unwrap());
        }
        // As root, `run` gives the exec a freezer cgroup of its own: every scan was a
        // snapshot, which is what makes this deterministic.
        assert!(
            !stderr.contains("without a frozen sandbox"),
            "the scans were not frozen: {stderr}"
        );
        assert_eq!(w.upstream.total(), 0);
    });
}

#[test]
fn the_allowed_holder_alone_is_still_allowed() {
    if !ready() {
        return;
    }
    World::run(|w| {
        // The same world, with the attacker's binary allowed too: every holder is admitted
        // by the one rule, so the connection goes through (the refusals above are about the
        // holders, not the shape of the attack).
        let work = w.tmp.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let hostile = work.join("hostile");
        let yaml = policy(&format!(
            "      - path: {SLEEP}\n      - path: {}\n",
            hostile.display()
        ));
        let work = workdir(w, &yaml);
        let (stdout, stderr) = run(
            w,
            &work,
            &[hostile.to_str().unwrap(), "zombie", SLEEP, "pub.test:8080"],
        );
        let a = answers(&stdout);
        assert_eq!(
            a[0].0, "HTTP/1.1 200 Connection Established",
            "{stdout}\n{stderr}"
        );
        assert_eq!(w.upstream.total(), 1);
    });
}

#[test]
fn code_injected_into_an_allowed_binary_does_not_speak_as_it() {
    if !ready() || !have_path("/usr/bin/curl") || !have_path("/usr/bin/python3") {
        return;
    }
    World::run(|w| {
        // The attack, under a plain OpenShell rule.
        let strict = "  strict:
    endpoints:
      - {host: pub.test, port: 8080}
    binaries: [{path: /usr/bin/curl}, {path: /usr/bin/python3}]
";
        let work = workdir(w, &with_rules(strict));
        let so = evil_so(&work);
        let so = so.to_str().unwrap();
        // Python maps the object itself (no loader variable), from the workdir and from a
        // memfd: neither is a file the sandbox cannot write.
        let py = "import ctypes, os, sys, urllib.request
if sys.argv[1] == 'dlopen':
    ctypes.CDLL(sys.argv[2])
elif sys.argv[1] == 'memfd':
    fd = os.memfd_create('x')
    os.write(fd, open(sys.argv[2], 'rb').read())
    ctypes.CDLL(f'/proc/self/fd/{fd}')
try:
    print(urllib.request.urlopen('http://pub.test:' + sys.argv[3] + '/' + sys.argv[1]).read().decode())
except urllib.error.HTTPError as e:
    print(e.read().decode())
";
        std::fs::write(work.join("client.py"), py).unwrap();
        let script = format!(
            "LD_PRELOAD={so} curl -sS http://pub.test:8080/preload; echo
LD_AUDIT={so} curl -sS http://pub.test:8080/audit; echo
curl -sS http://pub.test:8080/clean; echo
/usr/bin/python3 client.py dlopen {so} 8080
/usr/bin/python3 client.py memfd {so} 8080
/usr/bin/python3 client.py plain {so} 8080"
        );
        let (stdout, stderr) = run(w, &work, &["sh", "-c", &script]);
        let j = json_lines(&stdout);
        assert_eq!(j.len(), 6, "{stdout}\n{stderr}");
        assert!(
            stderr.contains("injected"),
            "the object was loaded: {stderr}"
        );
        let refused = |v: &serde_json::Value, why: &str| {
            assert_eq!(v["error"], "policy_denied", "{v}");
            let r = v["reason"].as_str().unwrap();
            assert!(
                r.contains(why) && r.contains("allow_untrusted_code: true"),
                "{why}: {r}"
            );
        };
        refused(&j[0], "(LD_PRELOAD in its environment)");
        refused(&j[1], "(LD_AUDIT in its environment)");
        assert_eq!(j[2]["request"], "GET /clean HTTP/1.1");
        refused(
            &j[3],
            &format!("(maps {so}, a file the sandbox could write)"),
        );
        refused(
            &j[4],
            "(maps /memfd:x (deleted), a file the sandbox could write)",
        );
        assert_eq!(j[5]["request"], "GET /plain HTTP/1.1");
        assert_eq!(w.upstream.total(), 2);

        // The policy switch admits it.
        let lax = "  lax:
    endpoints:
      - {host: pub.test, port: 8081}
    binaries: [{path: /usr/bin/curl, allow_untrusted_code: true}, {path: /usr/bin/python3, allow_untrusted_code: true}]
";
        std::fs::write(work.join("policy.yaml"), with_rules(lax)).unwrap();
        let script = format!(
            "LD_PRELOAD={so} curl -sS http://pub.test:8081/allowed; echo
/usr/bin/python3 client.py memfd {so} 8081"
        );
        let (stdout, stderr) = run(w, &work, &["sh", "-c", &script]);
        let j = json_lines(&stdout);
        assert_eq!(j.len(), 2, "{stdout}\n{stderr}");
        assert_eq!(j[0]["request"], "GET /allowed HTTP/1.1");
        assert_eq!(j[1]["request"], "GET /memfd HTTP/1.1");
    });
}

#[test]
fn a_child_of_an_allowed_binary_is_admitted_only_where_the_rule_asks() {
    if !ready() || !have_path("/usr/bin/git") || !have_path("/usr/bin/python3") {
        return;
    }
    World::run(|w| {
        let py = "import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1]).read().decode())
except urllib.error.HTTPError as e:
    print(e.read().decode())
";
        // The attack, under a plain OpenShell rule: an allowed git runs a Python client as
        // an alias, which is git's descendant.
        let git_only = "  git_only:
    endpoints:
      - {host: pub.test, port: 8080}
    binaries: [{path: /usr/bin/git}]
";
        let work = workdir(w, &with_rules(git_only));
        std::fs::write(work.join("client.py"), py).unwrap();
        let alias = |port: u16, path: &str| {
            format!(
                "/usr/bin/git -c 'alias.x=!/usr/bin/python3 client.py http://pub.test:{port}/{path}' x"
            )
        };
        let (stdout, stderr) = run(w, &work, &["sh", "-c", &alias(8080, "as-git")]);
        let j = json_lines(&stdout);
        assert_eq!(j.len(), 1, "{stdout}\n{stderr}");
        assert_eq!(j[0]["error"], "policy_denied", "{}", j[0]);
        let r = j[0]["reason"].as_str().unwrap();
        let python = std::fs::canonicalize("/usr/bin/python3").unwrap();
        assert!(
            r.starts_with(&format!(
                "binary '{}' not allowed in policy 'git_only'",
                python.display()
            )) && r.ends_with(
                "; its ancestor '/usr/bin/git' is listed, but the rule admits that binary's descendants only with descendants: true"
            ),
            "{r}"
        );
        assert_eq!(w.upstream.total(), 0);

        // A rule that asks for OpenShell's ancestor rule admits git's whole tree.
        let git_tree = "  git_tree:
    endpoints:
      - {host: pub.test, port: 8081}
    binaries: [{path: /usr/bin/git, descendants: true}]
";
        std::fs::write(work.join("policy.yaml"), with_rules(git_tree)).unwrap();
        let (stdout, stderr) = run(w, &work, &["sh", "-c", &alias(8081, "tree")]);
        let j = json_lines(&stdout);
        assert_eq!(j.len(), 1, "{stdout}\n{stderr}");
        assert_eq!(j[0]["request"], "GET /tree HTTP/1.1");
        assert_eq!(w.upstream.total(), 1);
    });
}

#[test]
fn a_holder_in_another_sandbox_namespace_is_a_holder() {
    if !ready() {
        return;
    }
    World::run(|w| {
        use std::os::fd::{AsFd, AsRawFd};
        use std::os::unix::process::CommandExt;
        // Two sandboxes of one supervisor (as `serve`'s revisions are): the proxy of the first,
        // and the identity of a second namespace, which registers it.
        w.start(
            &format!("  holder:\n    endpoints: [{{host: pub.test, port: 8080}}]\n    binaries: [{{path: {SLEEP}}}]\n"),
            openshell_sandbox::egress::ProxyConfig::default(),
        );
        let other = new_netns();
        let _other_identity =
            openshell_sandbox::egress::procfs::ProcIdentity::new(other.as_fd(), None).unwrap();
        let hostile = w.tmp.path().join("hostile");
        cc(&support_file("hostile.c"), &hostile, &["-pthread"]);
        let path = w.tmp.path().join("handoff.sock");
        // The receiver, in the other namespace: it takes a socket of the first one over a unix
        // socket both see, and connects it to the first one's proxy.
        let mut rx = std::process::Command::new(&hostile);
        let fd = other.as_raw_fd();
        // SAFETY: setns on a descriptor that stays open until exec.
        unsafe {
            rx.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        rx.arg("receive")
            .arg(&path)
            .arg("pub.test:8080")
            .stdout(std::process::Stdio::piped())
            .stdin(std::process::Stdio::null());
        let rx = rx.spawn().unwrap();
        wait_until("the receiver listens", Duration::from_secs(10), || {
            path.exists()
        });
        // The sender, in the first namespace: `sleep` keeps a copy, the sender gives its own away.
        let mut tx = w.in_sandbox(&hostile);
        tx.args(["send", SLEEP]).arg(&path);
        assert_eq!(output(tx, Duration::from_secs(30)).trim(), "SENT");
        let out = rx.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let a = answers(&stdout);
        assert_eq!(a.len(), 1, "{stdout}");
        let r = reason(&a[0]);
        assert!(
            r.starts_with(&format!(
                "binary '{}' not allowed in policy 'holder'",
                hostile.display()
            )),
            "{r}"
        );
        assert_eq!(w.upstream.total(), 0);
    });
}

#[test]
fn an_allowed_binarys_image_from_elsewhere_does_not_speak_as_it() {
    if !ready() || !have_path("/usr/bin/curl") || !have_path("/usr/bin/python3") {
        return;
    }
    World::run(|w| {
        let strict = "  strict:
    endpoints:
      - {host: pub.test, port: 8080}
    binaries: [{path: /usr/bin/curl}]
";
        let work = workdir(w, &with_rules(strict));
        let libcurl = std::fs::canonicalize("/lib/x86_64-linux-gnu/libcurl.so.4")
            .or_else(|_| std::fs::canonicalize("/usr/lib/x86_64-linux-gnu/libcurl.so.4"))
            .unwrap();
        // The copies are made in the sandbox: the sandbox's own files.
        let memfd = "import os, sys
fd = os.memfd_create('curl')
os.write(fd, open('/usr/bin/curl', 'rb').read())
os.execv(f'/proc/self/fd/{fd}', ['curl', '-sS', 'http://pub.test:8080/memfd'])
";
        std::fs::write(work.join("memfd.py"), memfd).unwrap();
        let script = format!(
            "cp /usr/bin/curl ./curl && ./curl -sS http://pub.test:8080/copy; echo
mkdir -p usr/bin && cp /usr/bin/curl usr/bin/curl && ./usr/bin/curl -sS http://pub.test:8080/nested; echo
/usr/bin/python3 memfd.py; echo
mkdir -p lib && cp {} lib/libcurl.so.4 && LD_LIBRARY_PATH=$PWD/lib curl -sS http://pub.test:8080/library; echo
curl -sS http://pub.test:8080/real; echo",
            libcurl.display()
        );
        let (stdout, stderr) = run(w, &work, &["sh", "-c", &script]);
        let j = json_lines(&stdout);
        assert_eq!(j.len(), 5, "{stdout}\n{stderr}");
        let refused = |v: &serde_json::Value, start: &str, end: &str| {
            assert_eq!(v["error"], "policy_denied", "{v}");
            let r = v["reason"].as_str().unwrap();
            assert!(r.starts_with(start) && r.ends_with(end), "{start}: {r}");
        };
        let w_ = work.display();
        refused(&j[0], &format!("binary '{w_}/curl' not allowed"), "");
        refused(
            &j[1],
            &format!("binary '{w_}/usr/bin/curl' not allowed"),
            "",
        );
        refused(&j[2], "binary '/memfd:curl' not allowed", "");
        refused(
            &j[3],
            "binary '/usr/bin/curl' not allowed",
            &format!(
                "; '/usr/bin/curl' may run code the sandbox could have written or chosen (maps {w_}/lib/libcurl.so.4, a file the sandbox could write), which the rule admits only with allow_untrusted_code: true"
            ),
        );
        assert_eq!(j[4]["request"], "GET /real HTTP/1.1");
        assert_eq!(w.upstream.total(), 1);
    });
}

#[test]
fn code_a_root_sandbox_wrote_is_not_the_systems() {
    if !ready() || !have_path("/usr/bin/python3") {
        return;
    }
    World::run(|w| {
        // `--uid 0`: root without capabilities still owns what it writes, so a root-owned
        // file is no sign that the sandbox could not have written it.
        let rules = "  py:
    endpoints:
      - {host: pub.test, port: 8080}
    binaries: [{path: /usr/bin/python3}]
";
        let work = workdir(w, &with_rules(rules));
        let so = evil_so(&work);
        let py = "import ctypes, shutil, sys, urllib.request
if sys.argv[1] == 'evil':
    shutil.copy(sys.argv[2], '/tmp/evil.so')
    ctypes.CDLL('/tmp/evil.so')
try:
    print(urllib.request.urlopen('http://pub.test:8080/' + sys.argv[1]).read().decode())
except urllib.error.HTTPError as e:
    print(e.read().decode())
";
        std::fs::write(work.join("client.py"), py).unwrap();
        let c = run_command_with(
            w,
            &work,
            &["--uid", "0"],
            &[
                "sh",
                "-c",
                &format!(
                    "/usr/bin/python3 client.py evil {so}; /usr/bin/python3 client.py plain",
                    so = so.display()
                ),
            ],
        );
        let out = finish(c, Duration::from_secs(120));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("injected"),
            "the object was loaded: {stderr}"
        );
        let j = json_lines(&stdout);
        assert_eq!(j.len(), 2, "{stdout}\n{stderr}");
        assert_eq!(j[0]["error"], "policy_denied", "{}", j[0]);
        let r = j[0]["reason"].as_str().unwrap();
        assert!(
            r.contains("(maps /tmp/evil.so, a file the sandbox could write)"),
            "{r}"
        );
        // The system's libraries come through read-only mounts: still trusted.
        assert_eq!(j[1]["request"], "GET /plain HTTP/1.1");
        assert_eq!(w.upstream.total(), 1);
    });
}

/// KNOWN GAP (SECURITY.md, "What a `binaries` rule is"): the evidence of injected code is
/// read from the process when it connects, and code that ran before can remove it. A
/// preloaded object that rewrites its `LD_PRELOAD=` in the environment block and unmaps its
/// own code (tests/support/egress/hide.c) leaves an allowed curl that is admitted. This
/// asserts what happens today.
#[test]
fn known_gap_a_preload_that_hides_before_the_connection_is_not_seen() {
    if !ready() || !have_path("/usr/bin/curl") {
        return;
    }
    World::run(|w| {
        let strict = "  strict:
    endpoints:
      - {host: pub.test, port: 8080}
    binaries: [{path: /usr/bin/curl}]
";
        let work = workdir(w, &with_rules(strict));
        let so = work.join("hide.so");
        cc(
            &support_file("hide.c"),
            &so,
            &["-O2", "-fno-stack-protector", "-shared", "-fPIC"],
        );
        let script = format!(
            "LD_PRELOAD={so} curl -sS http://pub.test:8080/hidden; echo",
            so = so.display()
        );
        let (stdout, stderr) = run(w, &work, &["sh", "-c", &script]);
        assert!(stderr.contains("injected"), "the object ran: {stderr}");
        let j = json_lines(&stdout);
        assert_eq!(j.len(), 1, "{stdout}\n{stderr}");
        assert_eq!(j[0]["request"], "GET /hidden HTTP/1.1", "{}", j[0]);
        assert_eq!(w.upstream.total(), 1);
        // Past the harness's capture: a known gap shows on every run.
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            b"KNOWN GAP [egress identity] a preloaded object that scrubbed its LD_PRELOAD and unmapped its code was not seen in an allowed curl\n",
        );
    });
}

#[test]
fn no_process_of_the_sandbox_can_write_into_or_take_from_an_allowed_one() {
    if !ready() || !have_path("/usr/bin/python3") {
        return;
    }
    World::run(|w| {
        // The ways to make an allowed binary's connection, or its memory, another process's:
        // each refused by the kernel with its exact errno (the view's /proc is read-only;
        // seccomp refuses the rest).
        let work = workdir(w, &policy(&format!("      - path: {SLEEP}\n")));
        let py = "import ctypes, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(nr, *a):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(x) for x in a])
    return r, ctypes.get_errno()
p = subprocess.Popen(['/usr/bin/sleep', '5'])
try:
    os.open(f'/proc/{p.pid}/mem', os.O_RDWR)
    print('mem opened')
except OSError as e:
    print('mem', e.errno)
print('ptrace', sc(101, 16, p.pid, 0, 0)[1])  # PTRACE_ATTACH
buf = ctypes.create_string_buffer(8)
iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)
print('process_vm_writev', sc(311, p.pid, ctypes.addressof(iov), 1, ctypes.addressof(iov), 1, 0)[1])
pidfd, e = sc(434, p.pid, 0)
print('pidfd_open', e)
print('pidfd_getfd', sc(438, pidfd, 0, 0)[1])
p.kill()
";
        std::fs::write(work.join("steal.py"), py).unwrap();
        let (stdout, stderr) = run(w, &work, &["/usr/bin/python3", "steal.py"]);
        assert_eq!(
            stdout.lines().collect::<Vec<_>>(),
            [
                format!("mem {}", libc::EROFS),
                format!("ptrace {}", libc::EPERM),
                format!("process_vm_writev {}", libc::EPERM),
                "pidfd_open 0".to_string(),
                format!("pidfd_getfd {}", libc::EPERM),
            ],
            "{stderr}"
        );
    });
}
