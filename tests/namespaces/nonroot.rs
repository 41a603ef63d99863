//! A non-root supervisor, with and without user namespaces; GPU devices through the view.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use super::support::{BIN, Run, Workdir, require, require_root};
use super::{
    KINDS, NOBODY, PY_ATTEMPT, PY_NET, PY_SHM, RemoveShm, expect_out, finish, host_shm_exists,
    layer, py, run_as, shm_key, unique,
};

/// The view for a non-root supervisor comes from a user namespace: the same outcomes, and the
/// report says namespace-user is enforced.
#[test]
fn non_root_supervisor_gets_the_same_view_through_a_user_namespace() {
    if !require_root() {
        return;
    }
    let max: u64 = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    if !require(max > 0, "user namespaces (user.max_user_namespaces > 0)") {
        return;
    }
    let wd = Workdir::new();
    let key = shm_key();
    let _cleanup = RemoveShm(key);
    let code = format!(
        r#"{PY_ATTEMPT}{PY_SHM}
import socket
me = os.getpid()
print("uid", os.getuid(), "me>=2", me >= 2)
print("others", [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)])
print("hostname", socket.gethostname())
for d in ("/tmp", "/dev/shm"):
    attempt(d, lambda: open(os.path.join(d, "w"), "w").write("x") and None)
print("shm", isinstance(shmget({key}, 4096, IPC_CREAT | 0o600), int))
"#
    );
    let r = run_as(Some(NOBODY), &wd, &[], &["python3", "-c", &code]);
    expect_out(
        &r,
        "uid 65534 me>=2 True\nothers []\nhostname sandbox\n/tmp OK\n/dev/shm OK\nshm True\n",
    );
    assert!(!host_shm_exists(key), "the segment is in the host's IPC ns");
    for k in KINDS.iter().chain(&["namespace-user"]) {
        let l = layer(&r.report, k);
        assert!(
            matches!(&l, Some((s, _)) if s == "enforced"),
            "non-root {k}: {l:?} in {}",
            r.report
        );
    }
    let net = run_as(
        Some(NOBODY),
        &wd,
        &[],
        &["python3", "-c", &format!("{PY_ATTEMPT}{PY_NET}")],
    );
    expect_out(
        &net,
        "ifaces ['lo']\nloopback pong\nconnect-v4 ENETUNREACH\nconnect-v4-private ENETUNREACH\nconnect-v6 ENETUNREACH\n",
    );
}

/// Run the binary as uid 65534 inside a throwaway user namespace whose own
/// user.max_user_namespaces is 0: no user namespace can be made below it. The global knob is
/// never touched (tests run in parallel).
fn run_without_user_namespaces(wd: &Workdir, extra: &[&str], cmd: &[&str]) -> Run {
    let report = std::env::temp_dir().join(format!("osb-ns-report-{}.json", unique()));
    let q = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let mut argv = vec![
        q(BIN),
        "run".into(),
        "--workdir".into(),
        q(&wd.path().display().to_string()),
        "--report-json".into(),
        q(&report.display().to_string()),
    ];
    argv.extend(extra.iter().map(|a| q(a)));
    argv.push("--".into());
    argv.extend(cmd.iter().map(|a| q(a)));
    let drop_to = format!("setpriv --reuid {NOBODY} --regid {NOBODY} --clear-groups --");
    // The control: as the dropped uid, a user namespace really cannot be made here.
    let inner = format!(
        "echo 0 > /proc/sys/user/max_user_namespaces || exit 90\n\
         {drop_to} unshare --user true 2>/dev/null && {{ echo 'a user namespace could still be made' >&2; exit 91; }}\n\
         exec {drop_to} {}",
        argv.join(" ")
    );
    // The first shell runs before the maps exist (so without capabilities in the namespace);
    // the exec after `read` starts afresh as uid 0 of the namespace, with them.
    let mut c = Command::new("/bin/sh");
    c.arg("-c")
        .arg(format!("read go; exec /bin/sh -c {}", q(&inner)))
        .current_dir(wd.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: one raw unshare(2) in the forked child before exec; no allocation or locks.
    unsafe {
        c.pre_exec(|| {
            if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = c.spawn().expect("starting the user-namespace wrapper");
    let pid = child.id();
    for f in ["uid_map", "gid_map"] {
        std::fs::write(
            format!("/proc/{pid}/{f}"),
            format!("0 0 1\n{NOBODY} {NOBODY} 1\n"),
        )
        .unwrap_or_else(|e| panic!("writing /proc/{pid}/{f}: {e}"));
    }
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let out = child.wait_with_output().unwrap();
    finish(out, &report)
}

/// With user namespaces unavailable, a non-root `run` refuses (125) and names the layer; with
/// --allow-degraded it runs and reports namespace-user degraded with a reason.
#[test]
fn non_root_without_user_namespaces_refuses_or_runs_degraded() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let r = run_without_user_namespaces(&wd, &[], &["echo", "ran"]);
    assert_eq!(
        r.code(),
        125,
        "stdout {:?} stderr {}",
        r.stdout(),
        r.stderr()
    );
    assert!(r.stderr().contains("namespace-user"), "{}", r.stderr());
    assert_eq!(r.stdout(), "");
    let r = run_without_user_namespaces(&wd, &["--allow-degraded"], &["echo", "ran"]);
    assert_eq!(
        (r.stdout().as_str(), r.code()),
        ("ran\n", 0),
        "{}",
        r.stderr()
    );
    let user = layer(&r.report, "namespace-user");
    assert!(
        matches!(&user, Some((s, d)) if s == "degraded" && !d.is_empty()),
        "namespace-user: {user:?} in {}",
        r.report
    );
}

// ---------------------------------------------------------------------------------------------
// GPU devices

/// The NVIDIA device nodes that exist on the host pass through the view as the policy grants
/// them (read-write). CI machines have no GPU by design, so without one this
/// prints SKIPPED and passes even under CI=true (a `require` skip would fail CI forever).
#[test]
fn gpu_devices_pass_through_the_view() {
    if !require_root() {
        return;
    }
    let devs: Vec<String> = std::fs::read_dir("/dev")
        .unwrap()
        .flatten()
        .map(|e| e.path().display().to_string())
        .filter(|p| p.starts_with("/dev/nvidia"))
        .collect();
    if devs.is_empty() {
        eprintln!("SKIPPED: no /dev/nvidia* on this machine (CI machines have no GPU by design)");
        return;
    }
    let mut extra = Vec::new();
    let mut code = String::new();
    for d in &devs {
        use std::os::unix::fs::MetadataExt;
        let rdev = std::fs::metadata(d).unwrap().rdev();
        extra.extend(["--rw".to_owned(), d.clone()]);
        code.push_str(&format!(
            "attempt('{d}', lambda: 'rdev-ok' if os.stat('{d}').st_rdev == {rdev} and os.close(os.open('{d}', os.O_RDWR)) is None else 'rdev-differs')\n"
        ));
    }
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let wd = Workdir::new();
    let r = py(&wd, &extra, &code);
    let want: String = devs.iter().map(|d| format!("{d} rdev-ok\n")).collect();
    expect_out(&r, &want);
}
