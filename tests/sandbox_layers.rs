//! Every isolation layer, proven by a hostile child run through the real binary.
//! Each test asserts the exact errno or outcome, never just "non-zero".

mod support;

use support::*;

/// Run `body` (python, after the syscall prelude) and return its stdout.
fn probe(extra: &[&str], body: &str) -> Run {
    let wd = Workdir::new();
    py(&wd, extra, &format!("{PY_SYSCALL}\n{body}"))
}

fn expect_line(r: &Run, line: &str) {
    assert!(
        r.stdout().lines().any(|l| l.trim() == line),
        "expected line {line:?}\nstdout:\n{}\nstderr:\n{}",
        r.stdout(),
        r.stderr()
    );
}

#[test]
fn write_outside_the_workdir_is_eacces_inside_works() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let r = py(
        &wd,
        &[],
        r#"
import errno
open("inside.txt", "w").write("ok")
print("inside", open("inside.txt").read())
for p in ["/var/tmp/osb-outside", "/etc/osb-outside", "/usr/osb-outside", "/tmp/osb-outside"]:
    try:
        open(p, "w")
        print("WROTE", p)
    except OSError as e:
        print(p, errno.errorcode[e.errno])
"#,
    );
    expect_line(&r, "inside ok");
    // The view's root holds only the granted paths: /var is not there at all, and the
    // read-only system grants are read-only mounts (Landlock's EACCES is behind both).
    expect_line(&r, "/var/tmp/osb-outside ENOENT");
    expect_line(&r, "/etc/osb-outside EROFS");
    // /tmp is the run's own private tmpfs: writable inside, and nothing reaches the host's.
    expect_line(&r, "WROTE /tmp/osb-outside");
    expect_line(&r, "/usr/osb-outside EROFS");
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert!(!std::path::Path::new("/tmp/osb-outside").exists());
}

#[test]
fn secret_below_a_granted_directory_is_unreadable() {
    if !require_root() {
        return;
    }
    // A stand-in for /etc/openshell-tls/client/tls.key: inside /etc, which is granted, and
    // world-readable, so only Landlock stands in the way.
    let dir = format!("/etc/osb-test-secret-{}", std::process::id());
    std::fs::create_dir_all(format!("{dir}/client")).unwrap();
    std::fs::write(format!("{dir}/client/tls.key"), "PRIVATE KEY").unwrap();
    let wd = Workdir::new();
    let r = py(
        &wd,
        &["--deny", &dir],
        &format!(
            r#"
import errno
print("hostname", len(open("/etc/hostname").read()) > 0)
for p in ["{dir}/client/tls.key", "{dir}/client", "{dir}"]:
    try:
        open(p).read() if p.endswith(".key") else __import__("os").listdir(p)
        print("READ", p)
    except OSError as e:
        print(p, errno.errorcode[e.errno])
"#
        ),
    );
    std::fs::remove_dir_all(&dir).unwrap();
    expect_line(&r, "hostname True");
    expect_line(&r, &format!("{dir}/client/tls.key EACCES"));
    expect_line(&r, &format!("{dir}/client EACCES"));
    expect_line(&r, &format!("{dir} EACCES"));
}

#[test]
fn default_secret_dir_under_etc_is_unreadable() {
    if !require_root() || !require(which("unshare"), "unshare (util-linux)") {
        return;
    }
    // The real path OpenShell mounts the client key at; denied by default, no flag needed. It
    // is made in a mount namespace of this run's own, in an overlay of /etc: on the host it
    // would change every later run there (the default deny path splits the /etc grant).
    let layer = tempfile::tempdir().unwrap();
    let key = "/etc/openshell-tls/client/osb-test.key";
    let script = format!(
        "set -e\n\
         mount -t tmpfs tmpfs '{l}'\n\
         mkdir '{l}/up' '{l}/work'\n\
         mount -t overlay -o lowerdir=/etc,upperdir='{l}/up',workdir='{l}/work' overlay /etc\n\
         mkdir -p /etc/openshell-tls/client\n\
         printf 'PRIVATE KEY' > {key}\n\
         exec \"$@\"\n",
        l = layer.path().display()
    );
    let wd = Workdir::new();
    let body = format!(
        r#"{PY_SYSCALL}
import errno
try:
    open("{key}").read(); print("READ")
except OSError as e:
    print("key", errno.errorcode[e.errno])
"#
    );
    let out = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(&script)
        .arg("sh")
        .arg(BIN)
        .arg("run")
        .arg("--workdir")
        .arg(wd.path())
        .args(["--", "python3", "-c", &body])
        .current_dir(wd.path())
        .output()
        .expect("unshare");
    let r = Run {
        out,
        report: serde_json::Value::Null,
    };
    expect_line(&r, "key EACCES");
    assert!(
        !std::path::Path::new(key).exists(),
        "the key was made on the host"
    );
}

#[test]
fn inet_socket_is_eperm_unix_socket_works() {
    if !require_root() {
        return;
    }
    // --network none inside the view's own network namespace (only lo): IP sockets work, on
    // loopback only; raw packet sockets stay EPERM.
    let r = probe(
        &[],
        r#"
import socket, errno
for fam in [socket.AF_INET, socket.AF_INET6, socket.AF_PACKET]:
    try:
        socket.socket(fam, socket.SOCK_RAW if fam == socket.AF_PACKET else socket.SOCK_DGRAM)
        print(int(fam), "ALLOWED")
    except OSError as e:
        print(int(fam), errno.errorcode[e.errno])
socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); print("unix ok")
"#,
    );
    expect_line(&r, &format!("{} ALLOWED", libc::AF_INET));
    expect_line(&r, &format!("{} ALLOWED", libc::AF_INET6));
    expect_line(&r, &format!("{} EPERM", libc::AF_PACKET));
    expect_line(&r, "unix ok");
}

#[test]
fn network_all_allows_inet_but_not_packet() {
    if !require_root() {
        return;
    }
    let r = probe(
        &["--network", "all"],
        r#"
import socket, errno
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM); print("inet ok")
try:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW); print("packet ALLOWED")
except OSError as e:
    print("packet", errno.errorcode[e.errno])
"#,
    );
    expect_line(&r, "inet ok");
    expect_line(&r, "packet EPERM");
}

#[test]
fn tcp_connect_is_denied_even_with_a_preexisting_socket_family() {
    if !require_root() {
        return;
    }
    // A listener on the host's loopback is not reachable: the child's 127.0.0.1 is the view's
    // own loopback, where nothing listens on that port (ECONNREFUSED); an address outside has
    // no route (ENETUNREACH). Its own listener on loopback works.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let r = probe(
        &[],
        &format!(
            r#"
import socket, errno
for addr in [("127.0.0.1", {port}), ("192.0.2.1", 80)]:
    try:
        socket.create_connection(addr, timeout=2); print("CONNECTED", addr[0])
    except OSError as e:
        print("connect", addr[0], errno.errorcode.get(e.errno, e.errno))
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
c = socket.create_connection(s.getsockname()); a, _ = s.accept(); c.send(b"hi")
print("own loopback", a.recv(2).decode())
"#
        ),
    );
    expect_line(&r, "connect 127.0.0.1 ECONNREFUSED");
    expect_line(&r, "connect 192.0.2.1 ENETUNREACH");
    expect_line(&r, "own loopback hi");
}

#[test]
fn other_processes_are_out_of_reach() {
    if !require_root() {
        return;
    }
    let r = probe(
        &[],
        r#"
import errno, signal
sup = os.getppid()
r, e = sc(101, 16, sup, 0, 0)            # ptrace(PTRACE_ATTACH, supervisor)
print("ptrace", errno.errorcode[e])
r, e = sc(101, 0, 0, 0, 0)               # ptrace(PTRACE_TRACEME)
print("traceme", errno.errorcode[e])
try:
    os.kill(sup, signal.SIGTERM); print("KILLED")
except OSError as ex:
    print("kill", errno.errorcode[ex.errno])
try:
    open("/proc/%d/environ" % sup).read(); print("ENVIRON READ")
except OSError as ex:
    print("environ", errno.errorcode[ex.errno])
r, e = sc(310, sup, 0, 0, 0, 0, 0)        # process_vm_readv
print("vm_readv", errno.errorcode[e])
"#,
    );
    expect_line(&r, "ptrace EPERM");
    expect_line(&r, "traceme EPERM");
    expect_line(&r, "kill EPERM");
    expect_line(&r, "environ EACCES");
    expect_line(&r, "vm_readv EPERM");
}

#[test]
fn namespaces_mounts_and_kernel_surface_are_eperm() {
    if !require_root() {
        return;
    }
    let r = probe(
        &[],
        r#"
import errno
def show(name, res):
    print(name, errno.errorcode.get(res[1], res[1]))
show("unshare_user", sc(272, 0x10000000))
show("unshare_net", sc(272, 0x40000000))
show("clone_newuser", sc(56, 0x10000000 | 17, 0, 0, 0, 0))
show("io_uring_setup", sc(425, 8, 0))
show("mount", sc(165, 0, 0, 0, 0, 0))
show("chroot", sc(161, 0))
show("keyctl", sc(250, 0))
show("bpf", sc(321, 0, 0, 0))
show("perf_event_open", sc(298, 0, 0, -1, -1, 0))
show("userfaultfd", sc(323, 0))
show("tiocsti_high_bits", sc(16, 0, (1 << 32) | 0x5412, 0))
show("personality", sc(135, 0x0400000))
show("clone3", sc(435, 0, 0))
"#,
    );
    for name in [
        "unshare_user",
        "unshare_net",
        "clone_newuser",
        "io_uring_setup",
        "mount",
        "chroot",
        "keyctl",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "tiocsti_high_bits",
        "personality",
    ] {
        expect_line(&r, &format!("{name} EPERM"));
    }
    expect_line(&r, "clone3 ENOSYS");
}

#[test]
fn x32_syscall_kills_the_process() {
    if !require_root() {
        return;
    }
    let r = probe(
        &[],
        "print('before', flush=True)\nsc(0x40000000 + 39)\nprint('SURVIVED')",
    );
    expect_line(&r, "before");
    assert!(!r.stdout().contains("SURVIVED"));
    assert_eq!(r.report["signal"], libc::SIGSYS, "{:?}", r.report);
    assert_eq!(r.code(), 128 + libc::SIGSYS);
}

#[test]
fn identity_and_capabilities_are_dropped() {
    if !require_root() {
        return;
    }
    // An explicit uid: without one, root gives each run its own uid of --uid-range
    // (tests/escapes_run.rs covers that).
    let r = probe(
        &["--uid", "65534"],
        r#"
st = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
for k in ["Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"]:
    print(k, st[k].split()[0] if st[k].split() else "-")
"#,
    );
    for line in [
        "Uid 65534",
        "Gid 65534",
        "Groups -",
        "CapInh 0000000000000000",
        "CapPrm 0000000000000000",
        "CapEff 0000000000000000",
        "CapBnd 0000000000000000",
        "CapAmb 0000000000000000",
        "NoNewPrivs 1",
        "Seccomp 2",
    ] {
        expect_line(&r, line);
    }
}

#[test]
fn no_fd_or_env_leaks() {
    let wd = Workdir::new();
    let out = std::process::Command::new(BIN)
        .args(["run", "--allow-degraded", "-q", "--workdir"])
        .arg(wd.path())
        .args(["--", "python3", "-c"])
        .arg("import os; print(sorted(os.listdir('/proc/self/fd'))); print(sorted(os.environ))")
        .env("OPENSHELL_SANDBOX_TOKEN", "s3cret")
        .env("OPENSHELL_TLS_KEY", "/etc/openshell-tls/client/tls.key")
        .env("AWS_SECRET_ACCESS_KEY", "leak")
        .current_dir(wd.path())
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    let mut lines = s.lines();
    // 0, 1, 2 and the directory fd listdir itself holds open.
    assert_eq!(lines.next(), Some("['0', '1', '2', '3']"), "{s}");
    // TMPDIR is the view's private /tmp.
    assert_eq!(
        lines.next(),
        Some("['HOME', 'LANG', 'PATH', 'TMPDIR']"),
        "{s}"
    );
}

/// TIOCSETD attaches a line discipline to a tty: rarely used kernel code (n_gsm, n_hdlc, ...)
/// with a record of privilege escalations, reachable from the pty the command is given
/// (`--tty`, a tty exec, the main process). It is refused whatever the discipline, high bits
/// of the request included, while reading the discipline (TIOCGETD) and the window size keep
/// working.
#[test]
fn a_line_discipline_cannot_be_set_on_a_pty() {
    let wd = Workdir::new();
    let code = format!(
        "{PY_SYSCALL}\n\
         import array\n\
         d = array.array('i', [0])\n\
         w = array.array('H', [0] * 4)\n\
         print('getd', *sc(16, 0, 0x5424, d.buffer_info()[0]))\n\
         print('setd', *sc(16, 0, 0x5423, d.buffer_info()[0]))\n\
         print('setd-high', *sc(16, 0, (1 << 32) | 0x5423, d.buffer_info()[0]))\n\
         print('winsz', *sc(16, 0, 0x5413, w.buffer_info()[0]))\n"
    );
    // --tty: a fresh pty of our own is the command's stdin and output.
    let r = run(&wd, &["--tty"], &["python3", "-c", &code]);
    assert_eq!(r.code(), 0, "{}\n{}", r.stdout(), r.stderr());
    let out = r.stdout().replace('\r', "");
    let eperm = libc::EPERM;
    assert!(out.contains("getd 0 0\n"), "{out}");
    assert!(out.contains(&format!("setd -1 {eperm}\n")), "{out}");
    assert!(out.contains(&format!("setd-high -1 {eperm}\n")), "{out}");
    assert!(out.contains("winsz 0 0\n"), "{out}");
}
