//! Per-run uids and explicit ones never meet, through the real binary: an explicit `--uid`
//! holds its uid (shared) so no per-run run gets it, and is refused while a per-run run holds
//! it; the lease directory is configurable (`--uid-lease-dir`,
//! `OPENSHELL_SANDBOX_UID_LEASE_DIR`) so that runs in two pods of one node (each with a
//! `/run` of its own) can share it; a lease directory anyone but root can write is refused.
//!
//! Every test names a single-uid `--uid-range` of its own, so that concurrent tests (and other
//! runs on the machine) never contend for the same uid.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use support::text;
use support::{BIN, Workdir, require, require_root, wait_until};

/// A uid for this test alone, far from the default range and from other tests' uids.
fn test_uid(n: u32) -> u32 {
    1_950_000_000 + (std::process::id() % 100_000) * 10 + n
}

/// A workdir `uid` can write.
fn workdir_of(uid: u32) -> Workdir {
    let wd = Workdir::new();
    std::os::unix::fs::chown(wd.path(), Some(uid), Some(uid)).unwrap();
    wd
}

/// A run that has started its command (it made `ready` in its workdir) and waits for
/// `release` there.
fn holding(wd: &Path, args: &[&str], env: &[(&str, &str)]) -> Child {
    let mut c = Command::new(BIN);
    c.arg("run").args(["-q", "--workdir"]).arg(wd).args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let child = c
        .args([
            "--",
            "sh",
            "-c",
            "touch ready; i=0; while [ ! -e release ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done",
        ])
        .current_dir(wd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        wait_until(30, || wd.join("ready").exists()),
        "the holding run never started its command"
    );
    child
}

fn release(wd: &Path, child: Child) -> Output {
    std::fs::write(wd.join("release"), b"").unwrap();
    child.wait_with_output().unwrap()
}

fn run(wd: &Path, args: &[&str], env: &[(&str, &str)], cmd: &[&str]) -> Output {
    let mut c = Command::new(BIN);
    c.arg("run").args(["-q", "--workdir"]).arg(wd).args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.arg("--")
        .args(cmd)
        .current_dir(wd)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The per-run run holds uid U and has drained U's inotify instances (the budget the kernel
/// keeps per uid). Before the fix an explicit `--uid U` run took no lease: it ran as U, and its
/// `inotify_init1` failed with EMFILE. Now it is refused, naming the uid.
#[test]
fn an_explicit_uid_that_a_per_run_run_holds_is_refused() {
    if !require_root() {
        return;
    }
    let u = test_uid(0);
    let range = format!("{u}-{u}");
    let wa = Workdir::new();
    let hog = r#"
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
fds = []
while libc.inotify_init1(0) >= 0:
    fds.append(1)
open("ready", "w").close()
for _ in range(600):
    if os.path.exists("release"):
        break
    time.sleep(0.05)
"#;
    let a = Command::new(BIN)
        .args(["run", "-q", "--uid-range", &range, "--workdir"])
        .arg(wa.path())
        .args(["--", "python3", "-c", hog])
        .current_dir(wa.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_until(30, || wa.path().join("ready").exists()));
    let wb = workdir_of(u);
    let victim = "import ctypes; l = ctypes.CDLL(None, use_errno=True); fd = l.inotify_init1(0); print('inotify', fd >= 0, ctypes.get_errno())";
    let b = run(
        wb.path(),
        &["--uid", &u.to_string()],
        &[],
        &["python3", "-c", victim],
    );
    let a = release(wa.path(), a);
    assert_eq!(a.status.code(), Some(0), "{}", text(&a.stderr));
    let (so, se) = (text(&b.stdout), text(&b.stderr));
    assert!(
        !so.contains("inotify"),
        "the explicit run ran under the per-run run's uid {u}: {so}{se}"
    );
    assert_eq!(b.status.code(), Some(125), "{so}{se}");
    assert!(
        se.contains(&format!("uid {u} is the per-run uid of a running run")),
        "{se}"
    );
}

/// An explicit `--uid U` run is running: a per-run run whose range is just U finds no free
/// uid. Before the fix it got U.
#[test]
fn a_per_run_run_never_gets_a_uid_an_explicit_run_holds() {
    if !require_root() {
        return;
    }
    let u = test_uid(1);
    let wa = workdir_of(u);
    let a = holding(wa.path(), &["--uid", &u.to_string()], &[]);
    let wb = Workdir::new();
    let b = run(
        wb.path(),
        &["--uid-range", &format!("{u}-{u}")],
        &[],
        &["id", "-u"],
    );
    let a = release(wa.path(), a);
    assert_eq!(a.status.code(), Some(0), "{}", text(&a.stderr));
    let (so, se) = (text(&b.stdout), text(&b.stderr));
    assert_ne!(
        so.trim(),
        u.to_string(),
        "the per-run run got uid {u}: {se}"
    );
    assert_eq!(b.status.code(), Some(125), "{so}{se}");
    assert!(
        se.contains(&format!("every uid of --uid-range {u}-{u} is held")),
        "{se}"
    );
}

/// Runs that name the same uid may run together, as before.
#[test]
fn explicit_runs_share_their_uid() {
    if !require_root() {
        return;
    }
    let u = test_uid(2);
    let wa = workdir_of(u);
    let a = holding(wa.path(), &["--uid", &u.to_string()], &[]);
    let wb = workdir_of(u);
    let b = run(wb.path(), &["--uid", &u.to_string()], &[], &["id", "-u"]);
    let a = release(wa.path(), a);
    assert_eq!(a.status.code(), Some(0), "{}", text(&a.stderr));
    assert_eq!(b.status.code(), Some(0), "{}", text(&b.stderr));
    assert_eq!(text(&b.stdout).trim(), u.to_string());
}

/// Two "pods": each run in a mount namespace of its own with a fresh tmpfs on /run, as each
/// container has. With the default lease directory they cannot see each other's leases; with
/// the lease directory on a path both see (the chart's node-wide hostPath), the second run's
/// range of one uid is held by the first. Before the fix the flag and the variable did not
/// exist, and the second run got the same uid.
#[test]
fn runs_in_two_pods_share_leases_through_the_lease_dir() {
    if !require_root() || !require(support::which("unshare"), "unshare(1) (util-linux)") {
        return;
    }
    let u = test_uid(3);
    let range = format!("{u}-{u}");
    let shared = tempfile::Builder::new()
        .prefix("osb-leases-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let leases = shared.path().join("uids");
    let (wa, wb) = (Workdir::new(), Workdir::new());
    // Pod A: holds u until released; its lease directory named by the variable.
    let pod = |wd: &Path, how: &[&str], cmd: &str| {
        let mut c = Command::new("unshare");
        c.args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(r#"mount -t tmpfs osb-run /run || exit 99; d="$1"; shift; cd "$d" && exec "$@""#)
            .arg("sh")
            .arg(wd)
            .arg(BIN)
            .args(["run", "-q", "--uid-range", &range, "--workdir"])
            .arg(wd)
            .args(how)
            .args(["--", "sh", "-c", cmd])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    };
    let hold = "id -u > uid; touch ready; i=0; while [ ! -e release ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done";
    let leases_s = leases.to_str().unwrap();
    let a = pod(wa.path(), &[], hold)
        .env("OPENSHELL_SANDBOX_UID_LEASE_DIR", leases_s)
        .spawn()
        .unwrap();
    assert!(
        wait_until(30, || wa.path().join("ready").exists()),
        "pod A never started"
    );
    // Pod B, with the flag: the same directory, so u is taken.
    let b = pod(wb.path(), &["--uid-lease-dir", leases_s], "id -u")
        .output()
        .unwrap();
    // Pod C, with neither: its own /run, so it does not see A's lease and gets u as well (the
    // collision a node-wide directory prevents).
    let wc = Workdir::new();
    let c = pod(wc.path(), &[], "id -u").output().unwrap();
    let a = release(wa.path(), a);
    assert_eq!(a.status.code(), Some(0), "A: {}", text(&a.stderr));
    assert_eq!(
        std::fs::read_to_string(wa.path().join("uid"))
            .unwrap()
            .trim(),
        u.to_string()
    );
    let (so, se) = (text(&b.stdout), text(&b.stderr));
    assert_eq!(b.status.code(), Some(125), "B got a uid: {so}{se}");
    assert!(
        se.contains(&format!("every uid of --uid-range {range} is held")),
        "{se}"
    );
    assert!(leases.join(u.to_string()).exists());
    assert_eq!(
        (c.status.code(), text(&c.stdout).trim().to_string()),
        (Some(0), u.to_string()),
        "C: {}",
        text(&c.stderr)
    );
}

/// A lease directory that someone other than root could write (where they could hold or swap
/// our lock files) is refused before anything runs, naming it.
#[test]
fn a_lease_dir_others_can_write_is_refused() {
    if !require_root() {
        return;
    }
    let base = tempfile::Builder::new()
        .prefix("osb-leases-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let open = base.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let theirs = base.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let wd = Workdir::new();
    for (dir, owner, mode) in [(&open, 0, "0777"), (&theirs, 65534, "0700")] {
        let out = run(
            wd.path(),
            &["--uid-lease-dir", dir.to_str().unwrap()],
            &[],
            &["sh", "-c", "touch ran"],
        );
        let se = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{se}");
        assert!(
            se.contains(&format!(
                "the uid lease directory {} is not a directory of root's that only root can write (owner {owner}, mode {mode})",
                dir.display()
            )),
            "{se}"
        );
        assert!(!wd.path().join("ran").exists());
    }
}

/// Where the lease directory cannot exist (its parent is missing, or `/run` is read-only), no
/// per-run run can hold a uid in it: a per-run run is refused, naming the directory, and an
/// explicit `--uid` runs without a lease, as before.
#[test]
fn an_explicit_uid_needs_no_lease_where_none_can_exist() {
    if !require_root() {
        return;
    }
    let base = tempfile::Builder::new()
        .prefix("osb-leases-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let nowhere = base.path().join("missing/uids");
    let nowhere_s = nowhere.to_str().unwrap();
    let u = test_uid(4);
    let explicit = run(
        workdir_of(u).path(),
        &["--uid", &u.to_string(), "--uid-lease-dir", nowhere_s],
        &[],
        &["id", "-u"],
    );
    assert_eq!(
        (
            explicit.status.code(),
            text(&explicit.stdout).trim().to_string()
        ),
        (Some(0), u.to_string()),
        "{}",
        text(&explicit.stderr)
    );
    let per_run = run(
        Workdir::new().path(),
        &[
            "--uid-range",
            &format!("{u}-{u}"),
            "--uid-lease-dir",
            nowhere_s,
        ],
        &[],
        &["id", "-u"],
    );
    let se = text(&per_run.stderr);
    assert_eq!(per_run.status.code(), Some(125), "{se}");
    assert!(
        se.contains(&format!("preparing the uid lease directory {nowhere_s}")),
        "{se}"
    );
}
