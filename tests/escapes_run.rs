//! Escapes on the `run` side: signals that end the supervisor, the forged summary line,
//! supplementary groups of a non-root supervisor, scratch removal after the report, a uid per
//! concurrent run, and what one run leaves for the next in a shared workdir. Every test drives
//! the real binary. (The caller's terminal and stdin: escapes_terminal.rs.)

mod support;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// The default `--uid-range` of `run` (see README).
const RANGE: std::ops::RangeInclusive<u32> = 1_900_000_000..=1_900_000_999;

fn alive(pid: i32) -> bool {
    // A zombie is dead for our purpose; its parent (init, once we are gone) reaps it.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

fn report_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("osb-escapes-{tag}-{}.json", std::process::id()))
}

fn read_json(p: &Path) -> serde_json::Value {
    std::fs::read(p)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null)
}

// ---------------------------------------------------------------------------------------------
// SIGHUP and SIGQUIT reach the command (here a shell, which dies of them); the run
// ends with its code, kills what is left of the tree and writes the report.

fn signal_ends_tree_and_reports(sig: i32) {
    let wd = Workdir::new();
    let mark = format!("{}{sig}", std::process::id());
    let bg_alive = || {
        let want = format!("sleep\0300.{mark}\0");
        std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                return false;
            };
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want.as_bytes())
                && alive(pid)
        })
    };
    let report = report_path(&format!("sig{sig}"));
    let _ = std::fs::remove_file(&report);
    let mut c = Command::new(BIN)
        .args(["run", "-q", "--workdir"])
        .arg(wd.path())
        .arg("--report-json")
        .arg(&report)
        .args([
            "--",
            "/bin/sh",
            "-c",
            // A background process that only the tree kill can end (it has no PDEATHSIG).
            // Marked in its argv: pids inside the run are its PID namespace's.
            &format!("sleep 300.{mark} & echo $! > bg.tmp && mv bg.tmp bg; wait"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        wait_for_file(&wd.path().join("bg"), 20),
        "the child never started"
    );
    // The file can appear before the forked shell has exec'd sleep.
    let start = Instant::now() + Duration::from_secs(5);
    while !bg_alive() && Instant::now() < start {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(bg_alive(), "the background process is not running");
    // SAFETY: kill with a pid we spawned and a valid signal number.
    assert_eq!(unsafe { libc::kill(c.id() as i32, sig) }, 0);
    let st = wait_exit(&mut c, 20).expect("the supervisor did not exit after the signal");
    let mut err = String::new();
    c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        (st.code(), st.signal()),
        (Some(128 + sig), None),
        "signal {sig} reaches the shell, which dies of it: the supervisor exits 128+{sig}; stderr: {err}"
    );
    let r = read_json(&report);
    let _ = std::fs::remove_file(&report);
    assert_eq!(r["contained"], true, "report: {r}; stderr: {err}");
    assert_eq!(r["exit_code"], 128 + sig, "report: {r}");
    let end = Instant::now() + Duration::from_secs(5);
    while bg_alive() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        !bg_alive(),
        "the background process outlived the run after signal {sig}"
    );
}

#[test]
fn sighup_to_the_supervisor_ends_the_tree_and_reports() {
    signal_ends_tree_and_reports(libc::SIGHUP);
}

#[test]
fn sigquit_to_the_supervisor_ends_the_tree_and_reports() {
    signal_ends_tree_and_reports(libc::SIGQUIT);
}

// ---------------------------------------------------------------------------------------------
// The summary always starts on a line of its own.

#[test]
fn an_unterminated_stderr_line_cannot_forge_the_summary() {
    let wd = Workdir::new();
    let forged = "openshell-sandbox: exited 0 (reason exited, code 0) in 1 ms; all layers enforced";
    let r = run(
        &wd,
        &["-v"],
        &[
            "/bin/sh",
            "-c",
            &format!("printf '%s' '{forged}' >&2; exit 3"),
        ],
    );
    assert_eq!(r.code(), 3, "{}", r.stderr());
    let err = r.stderr();
    let lines: Vec<&str> = err.lines().collect();
    assert!(
        lines.len() >= 2,
        "expected the child's line, then the summary: {err:?}"
    );
    assert_eq!(lines[lines.len() - 2], forged, "{err:?}");
    assert!(
        lines[lines.len() - 1].starts_with("openshell-sandbox: exited 3 (reason exited, code 3)"),
        "the summary must start its own line: {err:?}"
    );

    // A terminated last line gets no extra blank line; no output at all, none either.
    let r = run(&wd, &["-v"], &["/bin/sh", "-c", "echo done >&2"]);
    assert!(
        r.stderr().starts_with("done\nopenshell-sandbox: exited 0"),
        "{:?}",
        r.stderr()
    );
    let r = run(&wd, &["-v"], &["/bin/true"]);
    assert!(
        r.stderr().starts_with("openshell-sandbox: exited 0"),
        "{:?}",
        r.stderr()
    );
}

// ---------------------------------------------------------------------------------------------
// A non-root supervisor holding supplementary groups would hand them to the child: it is refused.

/// Run the binary as uid/gid `id` with supplementary `groups` (the test is root and switches
/// in the forked child, before exec).
fn run_as(id: u32, groups: &'static [libc::gid_t], wd: &Path, extra: &[&str]) -> Run {
    let report = report_path(&format!("as{id}-{}", groups.len()));
    let _ = std::fs::remove_file(&report);
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "--workdir"])
        .arg(wd)
        .arg("--report-json")
        .arg(&report)
        .args(extra)
        .args([
            "--",
            "/bin/sh",
            "-c",
            "grep -E '^(Uid|Groups):' /proc/self/status",
        ])
        .current_dir(wd)
        .stdin(Stdio::null());
    // SAFETY: only raw syscalls on a static array and integers between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                || libc::setresgid(id, id, id) != 0
                || libc::setresuid(id, id, id) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    let out = cmd.output().unwrap();
    // The report file was created by the non-root supervisor in the shared temp dir.
    let r = read_json(&report);
    let _ = std::fs::remove_file(&report);
    Run { out, report: r }
}

#[test]
fn supplementary_groups_of_a_non_root_supervisor_are_refused() {
    if !require_root() {
        return;
    }
    let uid = 64230;
    let wd = tempfile::Builder::new()
        .prefix("osb-groups-")
        .tempdir()
        .unwrap();
    std::os::unix::fs::chown(wd.path(), Some(uid), Some(uid)).unwrap();
    static ADM_DISK: [libc::gid_t; 2] = [4, 6];
    static NONE: [libc::gid_t; 0] = [];

    let r = run_as(uid, &ADM_DISK, wd.path(), &[]);
    assert_eq!(
        r.code(),
        125,
        "stdout: {} stderr: {}",
        r.stdout(),
        r.stderr()
    );
    assert!(
        r.stderr().contains("identity") && r.stderr().contains("4 (adm)"),
        "the refusal must name the layer and the groups: {}",
        r.stderr()
    );
    assert!(r.stderr().contains("6 (disk)"), "{}", r.stderr());
    assert!(r.stdout().is_empty(), "the child ran: {}", r.stdout());

    // --allow-degraded runs, and says so.
    let r = run_as(uid, &ADM_DISK, wd.path(), &["--allow-degraded"]);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    // In the supervisor's own user namespace the kernel still checks groups 4 and 6, but
    // shows every unmapped group as the overflow gid.
    let groups = if r.report["layers"].as_array().is_some_and(|l| {
        l.iter()
            .any(|l| l["layer"] == "namespace-user" && l["status"] == "enforced")
    }) {
        "Groups:\t65534 65534"
    } else {
        "Groups:\t4 6"
    };
    assert!(r.stdout().contains(groups), "{}", r.stdout());
    let id = r.report["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["layer"] == "identity")
        .cloned()
        .unwrap();
    assert_eq!(id["status"], "degraded", "{id}");
    assert!(id["detail"].as_str().unwrap().contains("4 (adm)"), "{id}");
    assert!(r.stderr().contains("DEGRADED: identity"), "{}", r.stderr());

    // Without supplementary groups the same supervisor runs fully enforced.
    let r = run_as(uid, &NONE, wd.path(), &["-v"]);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert!(r.stderr().contains("all layers enforced"), "{}", r.stderr());
}

// ---------------------------------------------------------------------------------------------
// The report is out before the scratch directory is removed.

#[test]
fn the_report_is_written_before_scratch_removal() {
    if !require_pause_points() {
        return;
    }
    let wd = Workdir::new();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("keep"), b"precious").unwrap();
    let report = report_path("scratch");
    let _ = std::fs::remove_file(&report);
    let pause = PauseDir::new();
    let mut c = Command::new(BIN)
        .args(["run", "-q", "--scratch", "--workdir"])
        .arg(wd.path())
        .arg("--report-json")
        .arg(&report)
        .args(["--", "/bin/sh", "-c"])
        .arg(format!(
            "mkdir -p \"$TMPDIR/a/b/c\" && touch \"$TMPDIR/a/b/c/f\" && ln -s {} \"$TMPDIR/link\" && echo \"$TMPDIR\"",
            outside.path().display()
        ))
        .envs(pause.env("scratch-remove"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let reached = pause.wait_reached("scratch-remove", 30);
    let r = read_json(&report);
    pause.release("scratch-remove");
    let st = wait_exit(&mut c, 30).expect("run did not exit");
    let mut out = String::new();
    c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let _ = std::fs::remove_file(&report);
    assert!(reached, "the supervisor never reached scratch removal");
    assert_eq!(
        r["reason"], "exited",
        "the report must be out while the scratch removal is held: {r}"
    );
    assert_eq!(st.code(), Some(0));
    let scratch = PathBuf::from(out.trim());
    assert!(
        scratch.starts_with(std::env::temp_dir()),
        "scratch path {scratch:?}"
    );
    assert!(!scratch.exists(), "the scratch dir {scratch:?} was left");
    assert_eq!(
        std::fs::read(outside.path().join("keep")).unwrap(),
        b"precious",
        "the removal followed the symlink"
    );
}

// ---------------------------------------------------------------------------------------------
// A uid per concurrent run.

const HOG: &str = r#"
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
fds = []
while True:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    fds.append(fd)
print(os.getuid(), len(fds), ctypes.get_errno(), flush=True)
open("ready", "w").close()
for _ in range(3000):
    if os.path.exists("release"):
        break
    time.sleep(0.01)
"#;

const VICTIM: &str = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
print(os.getuid(), fd >= 0, 0 if fd >= 0 else ctypes.get_errno())
"#;

#[test]
fn concurrent_runs_get_their_own_uid_and_kernel_budgets() {
    if !require_root() {
        return;
    }
    let (wa, wb) = (Workdir::new(), Workdir::new());
    let a = Command::new(BIN)
        .args(["run", "-q", "--workdir"])
        .arg(wa.path())
        .args(["--", "/usr/bin/python3", "-c", HOG])
        .current_dir(wa.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ready = wait_for_file(&wa.path().join("ready"), 30);
    let b = run(&wb, &[], &["/usr/bin/python3", "-c", VICTIM]);
    std::fs::write(wa.path().join("release"), b"").unwrap();
    let a = a.wait_with_output().unwrap();
    let a_out = String::from_utf8_lossy(&a.stdout).into_owned();
    assert!(
        ready,
        "run A never exhausted its inotify instances: {a_out} {}",
        String::from_utf8_lossy(&a.stderr)
    );
    let a_fields: Vec<&str> = a_out.split_whitespace().collect();
    let b_out = b.stdout();
    let b_fields: Vec<&str> = b_out.split_whitespace().collect();
    assert_eq!(a_fields.len(), 3, "{a_out}");
    assert_eq!(a_fields[2], libc::EMFILE.to_string(), "A: {a_out}");
    assert_eq!(b_fields.len(), 3, "B: {b_out} {}", b.stderr());
    let (ua, ub): (u32, u32) = (a_fields[0].parse().unwrap(), b_fields[0].parse().unwrap());
    assert_ne!(ua, ub, "two concurrent runs shared uid {ua}");
    assert!(RANGE.contains(&ua) && RANGE.contains(&ub), "uids {ua} {ub}");
    assert_eq!(
        (b_fields[1], b_fields[2]),
        ("True", "0"),
        "run B's inotify_init1 failed while run A held its budget: {b_out}"
    );
    // The report names the run's own uid.
    let b_uid_in_report = b.report["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["layer"] == "identity")
        .and_then(|l| {
            l["detail"]
                .as_str()
                .map(|s| s.contains(&format!("uid {ub} ")))
        });
    assert_eq!(b_uid_in_report, Some(true), "{}", b.report);
}

#[test]
fn an_explicit_uid_keeps_its_identity() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let r = run(&wd, &["--uid", "65534"], &["/usr/bin/id", "-u"]);
    assert_eq!(r.stdout().trim(), "65534", "{}", r.stderr());
}

/// Runs with per-run uids and explicit uids take turns in one workdir: each writes what the
/// others wrote, and everything stays the workdir owner's on the host (idmapped mounts; an
/// explicit `--uid 65534` run used to be refused as "not writable by 65534" after a per-run
/// uid had been handed the tree, and another explicit uid still was).
#[test]
fn runs_with_per_run_and_explicit_uids_take_turns_in_one_workdir() {
    if !require_root() {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let wd = Workdir::new();
    let owner = |name: &str| {
        std::fs::symlink_metadata(wd.path().join(name))
            .unwrap()
            .uid()
    };
    let a = run(
        &wd,
        &[],
        &["/bin/sh", "-c", "mkdir d && echo a > d/a && id -u"],
    );
    assert_eq!(a.code(), 0, "{}", a.stderr());
    let ua: u32 = a.stdout().trim().parse().unwrap();
    assert!(RANGE.contains(&ua), "{ua}");
    assert_eq!(owner("d/a"), 65534);
    std::fs::write(wd.path().join("root-file"), "r").unwrap();
    let b = run(
        &wd,
        &["--uid", "65534"],
        &["/bin/sh", "-c", "echo b >> d/a && echo b > b && id -u"],
    );
    assert_eq!(b.code(), 0, "the --uid 65534 run: {}", b.stderr());
    assert_eq!(b.stdout().trim(), "65534");
    let c = run(&wd, &[], &["/bin/sh", "-c", "echo c >> d/a && id -u"]);
    assert_eq!(c.code(), 0, "{}", c.stderr());
    let d = run(
        &wd,
        &["--uid", "4242"],
        &["/bin/sh", "-c", "echo d >> d/a && id -u"],
    );
    assert_eq!(d.code(), 0, "the --uid 4242 run: {}", d.stderr());
    assert_eq!(d.stdout().trim(), "4242");
    assert_eq!(
        std::fs::read_to_string(wd.path().join("d/a")).unwrap(),
        "a\nb\nc\nd\n"
    );
    assert_eq!(
        (owner(""), owner("d"), owner("d/a"), owner("b")),
        (65534, 65534, 65534, 65534)
    );
    assert_eq!(owner("root-file"), 0, "a file of root's was re-owned");
}

#[test]
fn a_bad_uid_range_is_a_usage_error() {
    let wd = Workdir::new();
    for bad in ["5-3", "x-9", "0-10", "100"] {
        let r = run(&wd, &["--uid-range", bad], &["/bin/true"]);
        assert_eq!(r.code(), 125, "--uid-range {bad}: {}", r.stderr());
    }
}

/// A later run writes what an earlier run left, and nothing of anyone's changes owner: not
/// the tree, not root's directory a link of the run points to, not another user's file, not a
/// real user's workdir (written as that user's, through an idmapped mount).
#[test]
fn a_later_run_writes_what_an_earlier_run_left_and_nothing_changes_owner() {
    if !require_root() {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let wd = Workdir::new();
    // Root's own directory, reachable from the workdir only through a link the run plants.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("f"), b"root's").unwrap();
    let r = run(
        &wd,
        &[],
        &[
            "/bin/sh",
            "-c",
            &format!(
                "mkdir -p sub/deeper && echo one > sub/deeper/f && ln -s {} link",
                outside.path().display()
            ),
        ],
    );
    assert_eq!(r.code(), 0, "{}", r.stderr());
    // A file of someone else in the workdir keeps its owner.
    std::fs::write(wd.path().join("users"), b"x").unwrap();
    std::os::unix::fs::chown(wd.path().join("users"), Some(4242), Some(4242)).unwrap();

    let r = run(
        &wd,
        &[],
        &["/bin/sh", "-c", "echo two >> sub/deeper/f && id -u"],
    );
    assert_eq!(
        r.code(),
        0,
        "the second run could not write the first run's file: {}",
        r.stderr()
    );
    assert_eq!(
        std::fs::read_to_string(wd.path().join("sub/deeper/f")).unwrap(),
        "one\ntwo\n"
    );
    for p in ["", "sub", "sub/deeper", "sub/deeper/f", "link"] {
        let m = std::fs::symlink_metadata(wd.path().join(p)).unwrap();
        assert_eq!((m.uid(), m.gid()), (65534, 65534), "{p:?}");
    }
    let m = std::fs::metadata(outside.path()).unwrap();
    assert_eq!(m.uid(), 0, "the link's target was re-owned");
    assert_eq!(
        std::fs::metadata(outside.path().join("f")).unwrap().uid(),
        0
    );
    assert_eq!(
        std::fs::metadata(wd.path().join("users")).unwrap().uid(),
        4242
    );

    // A directory that belongs to a real user is never given away: the run writes there as
    // that user.
    let users = Workdir {
        dir: tempfile::tempdir().unwrap(),
    };
    std::os::unix::fs::chown(users.path(), Some(4242), Some(4242)).unwrap();
    let r = run(&users, &[], &["/bin/sh", "-c", "echo u > u"]);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert_eq!(std::fs::metadata(users.path()).unwrap().uid(), 4242);
    let m = std::fs::metadata(users.path().join("u")).unwrap();
    assert_eq!((m.uid(), m.gid()), (4242, 4242));
}

/// `serve`: SIGHUP stops the supervisor as SIGTERM does (terminate the exec, report its
/// status, exit 0), instead of killing it with the exec's tree left running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_handles_sighup_like_sigterm() {
    use support::{AuthMode, SupOpts, Supervisor, TestGateway, exec_collect};
    let long = Duration::from_secs(60);
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let mut sup = Supervisor::start(
        &gw,
        SupOpts {
            args: vec!["--shutdown-grace".into(), "2".into()],
            ..Default::default()
        },
    );
    gw.wait_ready(&mut sup).await;
    let marker = sup.workdir.join("started");
    let st = gw.state.clone();
    let req = gw.request(&[
        "sh",
        "-c",
        &format!("touch {}; sleep 1000", marker.display()),
    ]);
    let running = tokio::spawn(async move { exec_collect(st, req).await });
    let deadline = Instant::now() + long;
    while !marker.exists() {
        assert!(
            Instant::now() < deadline,
            "exec never started:\n{}",
            sup.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sup.signal(libc::SIGHUP);
    let r = running.await.unwrap();
    assert_eq!(r.exit, Some(143), "{r:?}\n{}", sup.log());
    let status = sup.wait_exit(long).await;
    assert_eq!(status.code(), Some(0), "{}", sup.log());
    assert!(sup.log().contains("SIGHUP: shutting down"), "{}", sup.log());
}

/// Two concurrent runs with per-run uids in one workdir: the second used to hand the tree over
/// to its own uid while the first was running, so the first run's next write failed with
/// EACCES mid-run (and then the second was refused outright). With idmapped mounts both run,
/// and the first goes on untouched.
#[test]
fn a_second_run_in_a_busy_workdir_runs_and_the_first_keeps_writing() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let a = Command::new(BIN)
        .args(["run", "-q", "--workdir"])
        .arg(wd.path())
        .args([
            "--",
            "sh",
            "-c",
            "echo one > a.txt; : > ready; while [ ! -e release ]; do sleep 0.05; done; echo two >> a.txt && cat a.txt",
        ])
        .current_dir(wd.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ready = wait_for_file(&wd.path().join("ready"), 30);
    let b = run(&wd, &[], &["sh", "-c", "echo b > b.txt && cat a.txt"]);
    std::fs::write(wd.path().join("release"), b"").unwrap();
    let a = a.wait_with_output().unwrap();
    assert!(
        ready,
        "run A never started: {}",
        String::from_utf8_lossy(&a.stderr)
    );
    assert_eq!(b.code(), 0, "run B: {}", b.stderr());
    assert_eq!(b.stdout(), "one\n");
    assert_eq!(
        a.status.code(),
        Some(0),
        "run A: {}",
        String::from_utf8_lossy(&a.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&a.stdout), "one\ntwo\n");
}

#[test]
fn a_sigterm_right_after_the_spawn_still_ends_the_run_with_a_report() {
    if !require_pause_points() {
        return;
    }
    let wd = Workdir::new();
    let pause = PauseDir::new();
    let report = report_path("sigterm-early");
    let _ = std::fs::remove_file(&report);
    let mut c = Command::new(BIN)
        .args(["run", "-q", "--workdir"])
        .arg(wd.path())
        .arg("--report-json")
        .arg(&report)
        .args(["--", "sleep", "300"])
        .envs(pause.env("run-spawned"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let reached = pause.wait_reached("run-spawned", 30);
    // SAFETY: kill with a pid we spawned.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    std::thread::sleep(Duration::from_millis(100));
    pause.release("run-spawned");
    let st = wait_exit(&mut c, 30);
    if st.is_none() {
        let _ = c.kill();
    }
    let mut err = String::new();
    c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(
        reached,
        "the supervisor never reached the point after the spawn: {err}"
    );
    use std::os::unix::process::ExitStatusExt;
    let st = st.expect("the supervisor did not exit after SIGTERM");
    assert_eq!((st.code(), st.signal()), (Some(143), None), "{err}");
    let r = read_json(&report);
    let _ = std::fs::remove_file(&report);
    assert_eq!(r["contained"], true, "report: {r}; stderr: {err}");
    assert_eq!(r["exit_code"], 143, "report: {r}");
}
