//! Every exec gets a private view (PID, mount, IPC, UTS and network namespaces), proven
//! through the real binary with exact outcomes.
//!
//! The contract under test: `run` and `serve` take `--tmp-size` (default 256 MiB),
//! `--shm-size` (default 64 MiB) and `--hostname` (default `sandbox`). Every exec has its own
//! PID namespace whose PID 1 is our minimal init (the command is pid 2 or more); init forwards
//! SIGTERM, SIGINT and SIGHUP and exits with the command's status; PDEATHSIG ends the namespace
//! when the supervisor dies. /proc is the exec's own; /tmp and /dev/shm are private tmpfs mounts
//! (mode 1777) of the flags' sizes, charged to the exec's memory cgroup; TMPDIR=/tmp. IPC is
//! private, the hostname is set, and `--network none` gives a network namespace with only `lo`,
//! where loopback works and any other connect gives ENETUNREACH. In `serve` one view per
//! sandbox is shared by every exec. The report names the layers `namespace-pid`,
//! `namespace-mount`, `namespace-ipc`, `namespace-uts`, `namespace-net` and, for a non-root
//! supervisor, `namespace-user`.
//!
//! Root tests skip loudly without root (a failure under CI=true), as the other layer tests do.

mod support;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{BIN, Run, Workdir, require_root};

const MIB: u64 = 1 << 20;

/// Python prelude: `attempt(what, f)` prints `what OK` (or f's result) or `what ERRNONAME`.
const PY_ATTEMPT: &str = r#"
import errno, os, sys
def attempt(what, f):
    try:
        r = f()
        print(what, "OK" if r is None else r)
    except OSError as e:
        print(what, errno.errorcode[e.errno])
"#;

/// Python prelude for SysV shared memory through ctypes.
const PY_SHM: &str = r#"
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
IPC_CREAT, IPC_EXCL = 0o1000, 0o2000
def shmget(key, size, flags):
    ctypes.set_errno(0)
    r = libc.shmget(ctypes.c_int(key), ctypes.c_size_t(size), ctypes.c_int(flags))
    return r if r >= 0 else "E" + errno.errorcode[ctypes.get_errno()]
"#;

fn unique() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        support::rand_suffix() ^ u64::from(rand::random::<u32>())
    )
}

/// `run` with `extra` flags as the current user, or as `uid` (a non-root supervisor).
fn run_as(uid: Option<u32>, wd: &Workdir, extra: &[&str], cmd: &[&str]) -> Run {
    let report = std::env::temp_dir().join(format!("osb-ns-report-{}.json", unique()));
    let mut c = Command::new(BIN);
    c.arg("run")
        .arg("--workdir")
        .arg(wd.path())
        .arg("--report-json")
        .arg(&report)
        .args(extra)
        .arg("--")
        .args(cmd)
        .current_dir(wd.path());
    if let Some(u) = uid {
        c.uid(u).gid(u);
    }
    let out = c.output().expect("running openshell-sandbox");
    finish(out, &report)
}

fn finish(out: std::process::Output, report: &Path) -> Run {
    let report_json = std::fs::read(report)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null);
    let _ = std::fs::remove_file(report);
    Run {
        out,
        report: report_json,
    }
}

fn run(wd: &Workdir, extra: &[&str], cmd: &[&str]) -> Run {
    run_as(None, wd, extra, cmd)
}

/// The supervisors a test runs under: root, and a non-root one (uid 65534, which gets its view
/// through a user namespace) where user namespaces are available.
fn supervisors() -> Vec<Option<u32>> {
    let max: u64 = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let mut v = vec![None];
    if support::require(
        max > 0,
        "user namespaces (user.max_user_namespaces > 0) for the non-root supervisor",
    ) {
        v.push(Some(NOBODY));
    }
    v
}

const NOBODY: u32 = 65534;

fn py_as(uid: Option<u32>, wd: &Workdir, extra: &[&str], code: &str) -> Run {
    eprintln!(
        "supervisor uid: {}",
        uid.map_or("0 (root)".into(), |u| u.to_string())
    );
    run_as(
        uid,
        wd,
        extra,
        &["python3", "-c", &format!("{PY_ATTEMPT}\n{code}")],
    )
}

fn py(wd: &Workdir, extra: &[&str], code: &str) -> Run {
    run(
        wd,
        extra,
        &["python3", "-c", &format!("{PY_ATTEMPT}\n{code}")],
    )
}

fn lines(r: &Run) -> Vec<String> {
    r.stdout().lines().map(str::to_owned).collect()
}

/// Assert the exact stdout and exit 0, showing everything on failure.
fn expect_out(r: &Run, want: &str) {
    assert_eq!(
        (r.stdout().as_str(), r.code()),
        (want, 0),
        "stderr:\n{}\nreport: {}",
        r.stderr(),
        r.report
    );
}

/// (status, detail) of a report layer.
fn layer(report: &serde_json::Value, name: &str) -> Option<(String, String)> {
    report["layers"].as_array()?.iter().find_map(|l| {
        (l["layer"] == name).then(|| {
            (
                l["status"].as_str().unwrap_or("").to_owned(),
                l["detail"].as_str().unwrap_or("").to_owned(),
            )
        })
    })
}

const KINDS: [&str; 5] = [
    "namespace-pid",
    "namespace-mount",
    "namespace-ipc",
    "namespace-uts",
    "namespace-net",
];

/// A `run` started in the background, stdout piped line by line.
struct Background {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
    report: std::path::PathBuf,
}

impl Background {
    fn start(wd: &Workdir, extra: &[&str], cmd: &[&str]) -> Background {
        let report = std::env::temp_dir().join(format!("osb-ns-report-{}.json", unique()));
        let mut child = Command::new(BIN)
            .arg("run")
            .arg("--workdir")
            .arg(wd.path())
            .arg("--report-json")
            .arg(&report)
            .args(extra)
            .arg("--")
            .args(cmd)
            .current_dir(wd.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting openshell-sandbox");
        let out = BufReader::new(child.stdout.take().unwrap());
        Background { child, out, report }
    }

    /// The next line of stdout ("" at EOF).
    fn line(&mut self) -> String {
        let mut l = String::new();
        self.out.read_line(&mut l).unwrap();
        l
    }

    /// The next line must be `want`; otherwise fail with what the run said.
    fn expect_line(&mut self, want: &str) {
        let got = self.line();
        if got != want {
            let _ = self.child.kill();
            let mut err = String::new();
            let _ = std::io::Read::read_to_string(self.child.stderr.as_mut().unwrap(), &mut err);
            panic!("expected the line {want:?} from the run, got {got:?}; stderr:\n{err}");
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn wait(mut self) -> Run {
        let mut rest = Vec::new();
        std::io::Read::read_to_end(&mut self.out, &mut rest).unwrap();
        let mut err = Vec::new();
        std::io::Read::read_to_end(self.child.stderr.as_mut().unwrap(), &mut err).unwrap();
        let status = self.child.wait().unwrap();
        let report = self.report.clone();
        let out = std::process::Output {
            status,
            stdout: rest,
            stderr: err,
        };
        finish(out, &report)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Host pids whose command line contains `tag`.
fn tagged(tag: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmd).contains(tag) {
            out.push(pid);
        }
    }
    out
}

/// Kills every process carrying the tag when dropped, so a failing test leaves nothing behind.
struct KillTagged(String);

impl Drop for KillTagged {
    fn drop(&mut self) {
        for pid in tagged(&self.0) {
            // SAFETY: kill(2) on a pid whose command line carries this test's unique tag.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Wait (bounded) until no process carries `tag`; the survivors otherwise.
fn wait_no_tagged(tag: &str, limit: Duration) -> Vec<i32> {
    let end = Instant::now() + limit;
    loop {
        let left = tagged(tag);
        if left.is_empty() || Instant::now() > end {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_file(p: &Path, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if p.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// The host view of a SysV key: does a segment exist, and remove it (cleanup of a run that
/// leaked one, which is what today's shared IPC namespace does).
fn host_shm_exists(key: i32) -> bool {
    // SAFETY: shmget with size 0 and no flags only looks the key up.
    unsafe { libc::shmget(key, 0, 0) >= 0 }
}

struct RemoveShm(i32);

impl Drop for RemoveShm {
    fn drop(&mut self) {
        // SAFETY: look the key up and remove that segment; no memory is attached.
        unsafe {
            let id = libc::shmget(self.0, 0, 0);
            if id >= 0 {
                libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut());
            }
        }
    }
}

fn shm_key() -> i32 {
    0x1000_0000 | (rand::random::<i32>() & 0x0fff_ffff)
}

// ---------------------------------------------------------------------------------------------
// PID

/// Inside, /proc lists init and the command only, `ps` shows the exec's processes only, the
/// command's pid is 2 or more with PID 1 as its parent, and PID 1 is our init.
#[test]
fn pid_namespace_shows_only_the_execs_processes() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    for uid in supervisors() {
        let r = py_as(
            uid,
            &wd,
            &[],
            r#"
me = os.getpid()
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
print("others", [p for p in pids if p not in (1, me)])
print("me>=2", me >= 2, "ppid", os.getppid())
argv0 = open("/proc/1/cmdline", "rb").read().split(b"\0")[0].decode()
comm = open("/proc/1/comm").read().strip()
# Our init: a clone of the supervisor, which names itself openshell-init (a fork that kept the
# supervisor's name and command line would show openshell-sandbox).
print("init-is-ours", os.path.basename(argv0) in ("openshell-init", "openshell-sandbox") and comm in ("openshell-init", "openshell-sandb"))
"#,
        );
        expect_out(&r, "others []\nme>=2 True ppid 1\ninit-is-ours True\n");
    }

    // ps reads the same /proc: init, the shell and ps itself, nothing else.
    let r = run(&wd, &[], &["sh", "-c", "ps -e -o pid= -o comm=; true"]);
    let got: Vec<(i32, String)> = lines(&r)
        .iter()
        .map(|l| {
            let mut w = l.split_whitespace();
            (
                w.next().unwrap().parse().unwrap(),
                w.next().unwrap_or("").to_owned(),
            )
        })
        .collect();
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert_eq!(got.len(), 3, "ps -e inside the exec: {got:?}");
    assert_eq!(got[0].0, 1, "{got:?}");
    assert_eq!(
        got[1..].iter().map(|(_, c)| c.as_str()).collect::<Vec<_>>(),
        ["sh", "ps"],
        "{got:?}"
    );
}

/// A process outside, with a secret on its command line: its /proc entry does not exist in
/// the exec's view (ENOENT) and signalling it finds no such process (ESRCH).
#[test]
fn outside_processes_are_enoent_in_proc_and_esrch_to_kill() {
    if !require_root() {
        return;
    }
    let secret = format!("--api-key=sk-osb-{}", unique());
    let mut outside = Command::new("sh")
        .args(["-c", "sleep 60; :", "myserver", &secret])
        .spawn()
        .unwrap();
    let pid = outside.id();
    let me = std::process::id();
    let rev: String = secret.chars().rev().collect();
    let wd = Workdir::new();
    let code = format!(
        r#"
attempt("cmdline", lambda: open("/proc/{pid}/cmdline", "rb").read() and None)
attempt("kill", lambda: os.kill({pid}, 0))
attempt("kill-test", lambda: os.kill({me}, 0))
# Spelled backwards here: this program's own command line (and the supervisor's, which
# carries it) must not contain the secret itself.
secret = "{rev}"[::-1].encode()
leak = any(secret in open("/proc/%s/cmdline" % p, "rb").read()
           for p in os.listdir("/proc") if p.isdigit())
print("secret-visible", leak)
"#
    );
    let runs: Vec<Run> = supervisors()
        .into_iter()
        .map(|uid| py_as(uid, &wd, &[], &code))
        .collect();
    let _ = outside.kill();
    let _ = outside.wait();
    for r in &runs {
        expect_out(
            r,
            "cmdline ENOENT\nkill ESRCH\nkill-test ESRCH\nsecret-visible False\n",
        );
    }
}

/// Init hands every forwarded signal to the command and exits with the command's status, so
/// the exit code and report are the command's. The signal goes to init itself (found from the
/// host as the supervisor's descendant that is pid 1 of its namespace).
#[test]
fn init_forwards_sigterm_sigint_sighup_and_exits_with_the_commands_status() {
    if !require_root() {
        return;
    }
    for (name, sig) in [
        ("TERM", libc::SIGTERM),
        ("INT", libc::SIGINT),
        ("HUP", libc::SIGHUP),
    ] {
        let wd = Workdir::new();
        let script =
            format!("trap 'echo got {name}; exit 7' {name}; echo up; while :; do sleep 0.05; done");
        let mut bg = Background::start(&wd, &[], &["sh", "-c", &script]);
        bg.expect_line("up\n");
        let init = init_of(bg.pid()).unwrap_or_else(|| {
            panic!("no child of the supervisor is pid 1 of its own PID namespace")
        });
        // SAFETY: kill(2) on the init of the run this test started.
        assert_eq!(unsafe { libc::kill(init, sig) }, 0);
        let r = bg.wait();
        assert_eq!(r.stdout(), format!("got {name}\n"), "{}", r.stderr());
        assert_eq!(r.code(), 7, "SIG{name}: {}", r.report);
        assert_eq!(r.reason(), "exited", "SIG{name}: {}", r.report);
        assert_eq!(r.report["status"], 7, "SIG{name}: {}", r.report);
    }
    // Plain statuses pass through too: a code, and death by a signal.
    let wd = Workdir::new();
    let r = run(&wd, &[], &["sh", "-c", "exit 42"]);
    assert_eq!((r.code(), r.reason()), (42, "exited"), "{}", r.report);
    let r = run(&wd, &[], &["sh", "-c", "kill -KILL $$"]);
    assert_eq!((r.code(), r.reason()), (137, "signaled"), "{}", r.report);
    assert_eq!(r.report["signal"], 9, "{}", r.report);
}

/// Host pid of a descendant of `parent` that is pid 1 of a PID namespace of its own.
fn init_of(parent: i32) -> Option<i32> {
    let status =
        |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |st: &str, k: &str| -> Vec<String> {
        st.lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default()
    };
    let ppid = |pid: i32| -> Option<i32> { field(&status(pid), "PPid:").first()?.parse().ok() };
    let descends = |mut pid: i32| {
        for _ in 0..16 {
            match ppid(pid) {
                Some(p) if p == parent => return true,
                Some(p) if p > 1 => pid = p,
                _ => return false,
            }
        }
        false
    };
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        for e in std::fs::read_dir("/proc").ok()?.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let nspid = field(&status(pid), "NSpid:");
            if nspid.len() >= 2 && nspid.last().unwrap() == "1" && descends(pid) {
                return Some(pid);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

// ---------------------------------------------------------------------------------------------
// IPC

/// A SysV segment made in run A: absent in a concurrent run B, absent on the host, and absent
/// in a run C after A.
#[test]
fn sysv_segment_of_one_run_is_absent_in_another_and_after() {
    if !require_root() {
        return;
    }
    let key = shm_key();
    let _cleanup = RemoveShm(key);
    let wd_a = Workdir::new();
    let code_a = format!(
        "{PY_ATTEMPT}{PY_SHM}\nimport time\nprint('created', isinstance(shmget({key}, 4096, IPC_CREAT | IPC_EXCL | 0o666), int), flush=True)\nwhile not os.path.exists('go'):\n    time.sleep(0.01)\n"
    );
    let mut a = Background::start(&wd_a, &[], &["python3", "-c", &code_a]);
    a.expect_line("created True\n");
    let look = format!(
        "{PY_ATTEMPT}{PY_SHM}\nprint('lookup', shmget({key}, 0, 0))\nprint('listed', len(open('/proc/sysvipc/shm').read().splitlines()) - 1)\n"
    );
    let wd_b = Workdir::new();
    let b = run(&wd_b, &[], &["python3", "-c", &look]);
    let on_host = host_shm_exists(key);
    std::fs::write(wd_a.path().join("go"), "").unwrap();
    let a = a.wait();
    assert_eq!(a.code(), 0, "run A: {}", a.stderr());
    expect_out(&b, "lookup EENOENT\nlisted 0\n");
    assert!(!on_host, "run A's segment is in the host's IPC namespace");
    assert!(!host_shm_exists(key), "run A's segment outlived it");
    let c = run(&wd_b, &[], &["python3", "-c", &look]);
    expect_out(&c, "lookup EENOENT\nlisted 0\n");
}

// ---------------------------------------------------------------------------------------------
// Supervisor death

/// Double fork plus setsid: the daemon leaves the command's session and process group.
const PY_DAEMON: &str = r#"
import os, sys, time
tag, wd = sys.argv[1], sys.argv[2]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open(os.path.join(wd, "daemon-up"), "w").write(tag)
        time.sleep(300)
    os._exit(0)
time.sleep(300)
"#;

/// SIGKILL of the `run` supervisor while the exec has a double-forked setsid daemon: within a
/// bounded wait no process of that exec remains.
#[test]
fn sigkill_of_run_leaves_no_process_of_the_exec() {
    if !require_root() {
        return;
    }
    let tag = format!("osb-ns-daemon-{}", unique());
    let _cleanup = KillTagged(tag.clone());
    let wd = Workdir::new();
    let wd_s = wd.path().display().to_string();
    let mut bg = Background::start(&wd, &[], &["python3", "-c", PY_DAEMON, &tag, &wd_s]);
    assert!(
        wait_file(&wd.path().join("daemon-up"), Duration::from_secs(30)),
        "the daemon did not start"
    );
    // The supervisor, the command and the daemon at least (and init, when there is one).
    assert!(tagged(&tag).len() >= 3, "{:?}", tagged(&tag));
    bg.child.kill().unwrap();
    bg.child.wait().unwrap();
    let left = wait_no_tagged(&tag, Duration::from_secs(10));
    assert!(
        left.is_empty(),
        "processes of the exec survived the supervisor's SIGKILL: {left:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// UTS and network

#[test]
fn hostname_is_sandbox_by_default_and_set_by_the_flag() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let code = "import socket; print(socket.gethostname(), os.uname().nodename)";
    for uid in supervisors() {
        expect_out(&py_as(uid, &wd, &[], code), "sandbox sandbox\n");
        expect_out(
            &py_as(uid, &wd, &["--hostname", "build-7"], code),
            "build-7 build-7\n",
        );
    }
    // The host's name is untouched.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_ne!(host.trim(), "build-7");
}

const PY_NET: &str = r#"
import socket
print("ifaces", [l.split(":")[0].strip() for l in open("/proc/self/net/dev").readlines()[2:]])
def loop():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
    c = socket.create_connection(s.getsockname(), timeout=5)
    a, _ = s.accept(); a.sendall(b"pong")
    return c.recv(4).decode()
attempt("loopback", loop)
attempt("connect-v4", lambda: socket.create_connection(("192.0.2.1", 80), timeout=5) and None)
attempt("connect-v4-private", lambda: socket.create_connection(("10.255.255.1", 80), timeout=5) and None)
def v6():
    s = socket.socket(socket.AF_INET6)
    s.settimeout(5)
    s.connect(("2001:db8::1", 80))
attempt("connect-v6", v6)
"#;

/// `--network none`: a network namespace with only `lo`; loopback bind and connect work, any
/// other connect gives ENETUNREACH.
#[test]
fn network_none_has_only_lo_where_loopback_works() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let r = py(&wd, &["--network", "none"], PY_NET);
    expect_out(
        &r,
        "ifaces ['lo']\nloopback pong\nconnect-v4 ENETUNREACH\nconnect-v4-private ENETUNREACH\nconnect-v6 ENETUNREACH\n",
    );
}

// ---------------------------------------------------------------------------------------------
// The report and `check`

#[test]
fn report_and_check_name_every_namespace_layer() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let r = run(&wd, &[], &["true"]);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    for k in KINDS {
        let l = layer(&r.report, k);
        assert!(
            matches!(&l, Some((s, d)) if s == "enforced" && !d.is_empty()),
            "{k}: {l:?} in {}",
            r.report
        );
    }
    // Root needs no user namespace.
    let user = layer(&r.report, "namespace-user");
    assert!(
        user.as_ref().is_none_or(|(s, _)| s == "not_requested"),
        "namespace-user for root: {user:?}"
    );
    let r = run(&wd, &["--network", "all"], &["true"]);
    let net = layer(&r.report, "namespace-net");
    assert!(
        matches!(&net, Some((s, _)) if s == "not_requested"),
        "namespace-net with --network all: {net:?}"
    );
    let out = Command::new(BIN)
        .args(["check", "--json"])
        .output()
        .unwrap();
    let check: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for k in KINDS {
        let l = layer(&check, k);
        assert!(
            matches!(&l, Some((s, _)) if s == "enforced"),
            "check: {k}: {l:?}"
        );
    }
}

#[path = "namespaces/nonroot.rs"]
mod nonroot;
#[path = "namespaces/root.rs"]
mod root;
#[path = "namespaces/serve.rs"]
mod serve;
#[path = "namespaces/temp.rs"]
mod temp;
#[path = "namespaces/workloads.rs"]
mod workloads;
