//! Filesystem escapes, each driven through the real binary:
//! symlinked grant roots, the check-then-use race in grant expansion, and relative program
//! paths resolved in the wrong directory. (`--report-json` written by path: report_json.rs.)
//!
//! As root, the sandbox uid is 65534 unless `--uid` says otherwise.

mod support;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::text;
use support::{BIN, PauseDir, Workdir, require_pause_points, require_root};

/// Exit code of a refused policy (RunError::Policy): ours, as every failure of the sandbox.
const POLICY_REFUSED: i32 = 125;

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A directory outside every grant that the sandbox uid could write if Landlock let it.
fn open_outside_dir() -> tempfile::TempDir {
    // Not below /tmp: the run's /tmp is its own tmpfs, where this directory would not exist
    // at all, and the Landlock answer these tests are about would never be asked.
    let d = tempfile::Builder::new()
        .prefix("osb-outside-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    chmod(d.path(), 0o777);
    d
}

fn sandbox(args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("run").args(args).stdin(Stdio::null());
    c
}

/// Wait for `child` at most `secs`; `None` if it is still running then (it is killed).
fn wait_bounded(mut child: Child, secs: u64) -> Option<Output> {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if child.try_wait().unwrap().is_some() {
            return Some(child.wait_with_output().unwrap());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

// ---- symlinked grant roots ----

/// Run 1 leaves `W/project -> /`; run 2 names `W/project` as its workdir. Before the fix the
/// workdir was canonicalised to `/` and run 2 wrote outside every grant.
#[test]
fn symlinked_workdir_left_by_a_run_is_refused_naming_the_link() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let r1 = support::run(&wd, &[], &["ln", "-s", "/", "project"]);
    assert_eq!(r1.code(), 0, "run 1: {}", r1.stderr());
    let outside = open_outside_dir();
    let pwned = outside.path().join("pwned");
    let link = wd.path().join("project");
    let out = sandbox(&["--workdir", link.to_str().unwrap(), "--"])
        .args(["sh", "-c", &format!("echo x > {}", pwned.display())])
        .output()
        .unwrap();
    assert!(
        !pwned.exists(),
        "run 2 wrote outside its grants through the link"
    );
    assert_eq!(
        out.status.code(),
        Some(POLICY_REFUSED),
        "{}",
        text(&out.stderr)
    );
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("symlink {}", link.display())),
        "the error must name the link: {err}"
    );
}

#[test]
fn symlinked_ro_and_rw_roots_are_refused_naming_the_link() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let outside = open_outside_dir();
    let link = wd.path().join("elsewhere");
    symlink(outside.path(), &link).unwrap();
    // Below the link too: a link in any component is refused, not only the last one.
    std::fs::create_dir(outside.path().join("sub")).unwrap();
    let below = link.join("sub");
    for (flag, p) in [("--ro", &link), ("--rw", &link), ("--rw", &below)] {
        let out = sandbox(&["--workdir", wd.path().to_str().unwrap(), flag])
            .arg(p)
            .args(["--", "true"])
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(POLICY_REFUSED),
            "{flag} {p:?}: {err}"
        );
        assert!(
            err.contains(&format!("symlink {}", link.display())),
            "{flag} {p:?}: the error must name the link: {err}"
        );
    }
}

/// serve (`openshell-sandbox --workdir DIR [MAIN...]`, here without a gateway: the main
/// process only) builds its policy the same way: a symlinked workdir is refused before the main
/// process starts.
#[test]
fn serve_symlinked_workdir_is_refused_naming_the_link() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let outside = open_outside_dir();
    let link = wd.path().join("project");
    symlink(outside.path(), &link).unwrap();
    std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
    let pwned = outside.path().join("pwned");
    let child = Command::new(BIN)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .args(["--no-gateway", "--workdir"])
        .arg(&link)
        .args(["sh", "-c", &format!("echo x > {}", pwned.display())])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_bounded(child, 30).expect("serve did not exit");
    assert!(
        !pwned.exists(),
        "serve's main process wrote through the link"
    );
    let err = text(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains(&format!("symlink {}", link.display())),
        "{err}"
    );
    assert!(err.contains("owned by uid 65534"), "{err}");
}

/// With `--uid 0` the child owns every root-owned directory it is granted: a link it leaves in
/// a root-owned workdir is root-owned too. Before the fix run 2 followed it and wrote a
/// root-owned file in the root-owned 0755 directory it pointed to.
#[test]
fn uid0_symlinked_workdir_in_a_root_owned_tree_is_refused() {
    if !require_root() {
        return;
    }
    // target/tmp: every directory above it is root-owned and not group or other writable, so
    // only the uid-0 rule can refuse the link.
    let base = tempfile::Builder::new()
        .prefix("osb-uid0-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    chmod(base.path(), 0o755);
    let trusted_chain = base.path().ancestors().all(|d| {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(d).unwrap();
        m.uid() == 0 && m.mode() & 0o022 == 0
    });
    if !support::require(
        trusted_chain,
        "CARGO_TARGET_TMPDIR below root-owned directories without group or other write",
    ) {
        return;
    }
    let work = base.path().join("work");
    let victim = base.path().join("victim");
    for d in [&work, &victim] {
        std::fs::create_dir(d).unwrap();
        chmod(d, 0o755);
    }
    let w = work.to_str().unwrap();
    let r1 = sandbox(&["--uid", "0", "--workdir", w, "--", "ln", "-s"])
        .arg(&victim)
        .arg("project")
        .output()
        .unwrap();
    assert_eq!(r1.status.code(), Some(0), "run 1: {}", text(&r1.stderr));
    let link = work.join("project");
    let pwned = victim.join("pwned");
    let out = sandbox(&["--uid", "0", "--workdir", link.to_str().unwrap(), "--"])
        .args(["touch", pwned.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!pwned.exists(), "uid-0 run 2 wrote through the link");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(POLICY_REFUSED), "{err}");
    assert!(
        err.contains(&format!("symlink {}", link.display())),
        "{err}"
    );
    // Refused for the owner-write rule (every run writes as root in a root-owned workdir:
    // tests/workdir_owner.rs has the same link planted by a per-run uid).
    assert!(err.contains("writable by the sandbox uid 0"), "{err}");
}

/// Root-owned links in root-owned, non-writable directories are still followed: `/lib ->
/// usr/lib`, `/var/run -> /run`. Under `--uid 0`, links directly in `/` still are (no run can
/// ever be granted write on `/`).
#[test]
fn system_links_still_work() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    // uid 0 runs without capabilities: its workdir must be its own, or `run` refuses it.
    let root_wd = Workdir::new();
    std::os::unix::fs::chown(root_wd.path(), Some(0), Some(0)).unwrap();
    for extra in [
        &["--ro", "/lib"][..],
        &["--ro", "/var/run"],
        &["--uid", "0", "--ro", "/lib"],
        &["--ro", "/lib/../lib64"],
    ] {
        let w = if extra[0] == "--uid" { &root_wd } else { &wd };
        let out = sandbox(&["--workdir", w.path().to_str().unwrap()])
            .args(extra)
            .args(["--", "ls", "/lib/"])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{extra:?}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn rw_grant_on_root_or_a_system_ancestor_is_refused() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let w = wd.path().to_str().unwrap();
    let outside = open_outside_dir();
    let pwned = outside.path().join("pwned");
    let write = format!("echo x > {}", pwned.display());
    for extra in [
        &["--workdir", w, "--rw", "/"][..],
        &["--workdir", "/"],
        &["--workdir", w, "--rw", "/usr"],
        &["--workdir", w, "--rw", "/lib"],
    ] {
        let out = sandbox(extra)
            .args(["--", "sh", "-c", &write])
            .output()
            .unwrap();
        assert!(!pwned.exists(), "{extra:?}: wrote outside");
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(POLICY_REFUSED), "{extra:?}: {err}");
        assert!(err.contains("system directory"), "{extra:?}: {err}");
    }
}

// ---- the check-then-use race in grant expansion ----

fn exchange(a: &Path, b: &Path) {
    let ca = CString::new(a.as_os_str().as_bytes()).unwrap();
    let cb = CString::new(b.as_os_str().as_bytes()).unwrap();
    // SAFETY: two NUL-terminated paths; renameat2 only reads them.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(rc, 0, "renameat2: {}", std::io::Error::last_os_error());
}

/// The workdir is split around a denied entry, so each other entry becomes its own rule. The
/// supervisor is held after the entries were checked and before Landlock gets them; the
/// attacker then exchanges the subdirectory `sub` with a link to `/`. Before the fix the rule
/// for `sub` was opened by path, through the link: read-write on `/`.
#[test]
fn grant_expansion_exchange_race_never_widens_a_grant() {
    if !require_root() || !require_pause_points() {
        return;
    }
    let wd = Workdir::new();
    let sub = wd.path().join("sub");
    let lnk = wd.path().join("lnk");
    std::fs::create_dir(wd.path().join("private")).unwrap();
    std::fs::create_dir(&sub).unwrap();
    std::os::unix::fs::chown(&sub, Some(65534), Some(65534)).unwrap();
    symlink("/", &lnk).unwrap();
    let outside = open_outside_dir();
    let pwned = outside.path().join("pwned");
    let pause = PauseDir::new();
    let point = "landlock-rules";
    let script = format!(
        "echo ok > {}/lnk/ok && echo in-grant; echo x > {} && echo ESCAPED",
        wd.path().display(),
        pwned.display()
    );
    let child = sandbox(&["--workdir", wd.path().to_str().unwrap(), "--deny"])
        .arg(wd.path().join("private"))
        .args(["--", "sh", "-c", &script])
        .envs(pause.env(point))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        pause.wait_reached(point, 60),
        "the supervisor never reached {point}"
    );
    exchange(&sub, &lnk);
    pause.release(point);
    let out = wait_bounded(child, 60).expect("the run did not finish");
    let (so, se) = (text(&out.stdout), text(&out.stderr));
    assert!(
        !pwned.exists(),
        "the swapped link widened the grant to /: {so}{se}"
    );
    assert!(!so.contains("ESCAPED"), "{so}{se}");
    // Landlock's EACCES, or, with the view's own root, the outside directory is not there.
    assert!(
        se.contains("Permission denied") || se.contains("Directory nonexistent"),
        "{se}"
    );
    // The directory that was checked is still granted, under its new name.
    assert!(so.contains("in-grant"), "{so}{se}");
    assert!(wd.path().join("lnk/ok").exists());
}

// ---- --report-json written by path: see tests/report_json.rs ----

// ---- relative program paths ----

/// `run --workdir W -- ./x.sh` started from another directory: the child runs in W, so `./x.sh`
/// means W/x.sh. Before the fix it was looked up in the supervisor's cwd: a false 127. Relative
/// PATH entries likewise.
#[test]
fn relative_program_is_resolved_in_the_childs_cwd() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    std::fs::create_dir(wd.path().join("tools")).unwrap();
    for (p, word) in [("x.sh", "relative-ok"), ("tools/y", "path-entry-ok")] {
        let f = wd.path().join(p);
        std::fs::write(&f, format!("#!/bin/sh\necho {word}\n")).unwrap();
        chmod(&f, 0o755);
    }
    let w = wd.path().to_str().unwrap();
    for (cmd, extra, word) in [
        ("./x.sh", &[][..], "relative-ok"),
        (
            "y",
            &["--env", "PATH=tools:/usr/bin:/bin"][..],
            "path-entry-ok",
        ),
    ] {
        let out = sandbox(&["--workdir", w])
            .args(extra)
            .args(["--", cmd])
            .current_dir("/")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{cmd}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout).trim(), word);
    }
}
