//! `install`, `install --verify`, `install --wait` and `copy-self`, driven through the real
//! binary. Tests that need root (mount namespaces, dropping to another user) skip loudly when
//! not root, and fail instead under CI=true.

mod support;

use support::require;
use support::{assert_fails_with, assert_ok, text};

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

const BIN: &str = env!("CARGO_BIN_EXE_openshell-sandbox");
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn have(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
}

fn run(bin: &str, args: &[&str]) -> Output {
    Command::new(bin).args(args).output().expect("spawn binary")
}

fn sha_hex(path: &Path) -> String {
    hex::encode(Sha256::digest(fs::read(path).unwrap()))
}

fn install(dest: &Path) -> Output {
    run(BIN, &["install", "--dest", dest.to_str().unwrap()])
}

/// Entries of `dir` whose name starts with our temp prefix.
fn temps(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(".openshell-sandbox.tmp."))
        .collect()
}

#[test]
fn fresh_install_copies_the_binary_and_writes_a_matching_marker() {
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("opt/openshell/bin");
    let out = run(
        BIN,
        &[
            "install",
            "--dest",
            dest.to_str().unwrap(),
            "--create-parents",
        ],
    );
    assert_ok(&out);
    assert!(text(&out.stdout).starts_with("installed "));

    let installed = dest.join("openshell-sandbox");
    assert_eq!(fs::read(&installed).unwrap(), fs::read(BIN).unwrap());
    let meta = fs::symlink_metadata(&installed).unwrap();
    assert!(meta.file_type().is_file());
    assert_eq!(meta.permissions().mode() & 0o7777, 0o755);
    assert_eq!(meta.nlink(), 1);

    let marker = fs::read_to_string(dest.join(".openshell-sandbox.version")).unwrap();
    assert_eq!(
        marker,
        format!("version={VERSION}\nsha256={}\n", sha_hex(Path::new(BIN)))
    );
    assert_eq!(
        fs::metadata(dest.join(".openshell-sandbox.version"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o644
    );
    assert!(
        temps(&dest).is_empty(),
        "temp files left: {:?}",
        temps(&dest)
    );

    // The installed copy is a working binary in its own right.
    assert_ok(&run(
        installed.to_str().unwrap(),
        &["install", "--verify", "--dest", dest.to_str().unwrap()],
    ));
}

#[test]
fn rerun_with_the_same_binary_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    assert_ok(&install(tmp.path()));
    let bin_before = fs::metadata(tmp.path().join("openshell-sandbox")).unwrap();
    let marker_before = fs::metadata(tmp.path().join(".openshell-sandbox.version")).unwrap();

    let out = install(tmp.path());
    assert_ok(&out);
    assert!(
        text(&out.stdout).contains("nothing changed"),
        "{}",
        text(&out.stdout)
    );
    // Same inodes: nothing was renamed over them.
    let bin_after = fs::metadata(tmp.path().join("openshell-sandbox")).unwrap();
    let marker_after = fs::metadata(tmp.path().join(".openshell-sandbox.version")).unwrap();
    assert_eq!(bin_before.ino(), bin_after.ino());
    assert_eq!(marker_before.ino(), marker_after.ino());
    assert_eq!(bin_before.mtime_nsec(), bin_after.mtime_nsec());
}

#[test]
fn a_stale_marker_alone_is_repaired() {
    let tmp = tempfile::tempdir().unwrap();
    assert_ok(&install(tmp.path()));
    let marker = tmp.path().join(".openshell-sandbox.version");
    fs::write(&marker, "version=0.0.0\nsha256=00\n").unwrap();
    let ino = fs::metadata(tmp.path().join("openshell-sandbox"))
        .unwrap()
        .ino();

    let out = install(tmp.path());
    assert_ok(&out);
    assert!(text(&out.stdout).contains("marker rewritten"));
    assert_eq!(
        fs::metadata(tmp.path().join("openshell-sandbox"))
            .unwrap()
            .ino(),
        ino
    );
    assert!(
        fs::read_to_string(&marker)
            .unwrap()
            .contains(&sha_hex(Path::new(BIN)))
    );
}

/// A different build of the same program: an ELF runs fine with bytes appended, and they
/// change its sha256.
fn variant_binary(dir: &Path) -> PathBuf {
    let path = dir.join("openshell-sandbox");
    let mut bytes = fs::read(BIN).unwrap();
    bytes.extend_from_slice(b"\0openshell-sandbox upgrade test build\n");
    fs::write(&path, bytes).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// Start `bin install --dest DIR --wait` and return once it says it is waiting.
fn start_waiting(bin: &Path, dir: &Path) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(bin)
        .args(["install", "--wait", "--dest", dir.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn --wait");
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut saw_waiting = false;
    let mut line = String::new();
    while reader.read_line(&mut line).unwrap() > 0 {
        if line.trim() == "waiting for SIGTERM" {
            saw_waiting = true;
            break;
        }
        line.clear();
    }
    assert!(saw_waiting, "--wait ended before it was waiting");
    (child, reader)
}

fn sigterm(pid: u32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
}

#[test]
fn upgrade_replaces_the_binary_while_the_old_one_runs_from_dest() {
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("bin");
    let scratch = tmp.path().join("scratch");
    let build2 = tmp.path().join("build2");
    fs::create_dir_all(&build2).unwrap();
    assert_ok(&run(
        BIN,
        &[
            "install",
            "--create-parents",
            "--dest",
            dest.to_str().unwrap(),
        ],
    ));

    // A process executing DEST/openshell-sandbox, as sandbox pods do from the hostPath.
    let old = dest.join("openshell-sandbox");
    fs::create_dir_all(&scratch).unwrap();
    let (mut running, _out) = start_waiting(&old, &scratch);

    let new = variant_binary(&build2);
    let out = run(
        new.to_str().unwrap(),
        &["install", "--dest", dest.to_str().unwrap()],
    );
    assert_ok(&out);
    assert!(
        text(&out.stdout).starts_with("replaced "),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(sha_hex(&old), sha_hex(&new));
    let marker = fs::read_to_string(dest.join(".openshell-sandbox.version")).unwrap();
    assert!(marker.contains(&sha_hex(&new)));

    // The old process still runs its own (now unlinked) inode and still obeys SIGTERM.
    assert_eq!(running.try_wait().unwrap(), None, "old process died");
    let exe = fs::read_link(format!("/proc/{}/exe", running.id())).unwrap();
    assert!(exe.to_string_lossy().ends_with("(deleted)"), "{exe:?}");
    sigterm(running.id());
    assert_eq!(running.wait().unwrap().code(), Some(0));

    // Readiness: the new build verifies, the old one no longer does.
    assert_ok(&run(
        new.to_str().unwrap(),
        &["install", "--verify", "--dest", dest.to_str().unwrap()],
    ));
    assert_fails_with(
        &run(
            BIN,
            &["install", "--verify", "--dest", dest.to_str().unwrap()],
        ),
        "is a different binary",
    );
}

#[test]
fn a_symlinked_destination_is_refused_and_left_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let victim = tmp.path().join("victim");
    fs::write(&victim, b"do not overwrite").unwrap();
    let dest = tmp.path().join("bin");
    fs::create_dir(&dest).unwrap();
    symlink(&victim, dest.join("openshell-sandbox")).unwrap();

    assert_fails_with(&install(&dest), "is a symbolic link");
    assert_eq!(fs::read(&victim).unwrap(), b"do not overwrite");
    assert!(
        fs::symlink_metadata(dest.join("openshell-sandbox"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(temps(&dest).is_empty());

    // The marker gets the same treatment.
    fs::remove_file(dest.join("openshell-sandbox")).unwrap();
    symlink(&victim, dest.join(".openshell-sandbox.version")).unwrap();
    assert_fails_with(&install(&dest), "is a symbolic link");
    assert_eq!(fs::read(&victim).unwrap(), b"do not overwrite");
}

#[test]
fn a_hard_linked_destination_is_refused_and_left_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let other = tmp.path().join("other");
    fs::write(&other, b"shared inode").unwrap();
    let dest = tmp.path().join("bin");
    fs::create_dir(&dest).unwrap();
    fs::hard_link(&other, dest.join("openshell-sandbox")).unwrap();

    assert_fails_with(&install(&dest), "has 2 hard links");
    assert_eq!(fs::read(&other).unwrap(), b"shared inode");
    assert_eq!(
        fs::read(dest.join("openshell-sandbox")).unwrap(),
        b"shared inode"
    );
    assert!(temps(&dest).is_empty());
}

#[test]
fn a_directory_in_place_of_the_binary_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    fs::create_dir(tmp.path().join("openshell-sandbox")).unwrap();
    assert_fails_with(&install(tmp.path()), "is not a regular file");
}

#[test]
fn a_missing_destination_needs_create_parents() {
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("a/b");
    let out = install(&dest);
    assert_fails_with(&out, "does not exist (pass --create-parents to create it)");
    assert!(text(&out.stderr).contains(dest.to_str().unwrap()));
    assert!(!tmp.path().join("a").exists(), "nothing may be created");

    let file_dest = tmp.path().join("plainfile");
    fs::write(&file_dest, b"x").unwrap();
    assert_fails_with(&install(&file_dest), "is not a directory");
}

#[test]
fn stale_temp_files_from_a_crashed_install_are_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let stale = tmp
        .path()
        .join(".openshell-sandbox.tmp.4242.00000000deadbeef");
    fs::write(&stale, b"half a binary").unwrap();
    let out = install(tmp.path());
    assert_ok(&out);
    assert!(text(&out.stdout).contains("removed 1 stale temporary file"));
    assert!(!stale.exists());
}

#[test]
fn verify_passes_only_for_this_exact_binary_and_marker() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    assert_fails_with(
        &run(BIN, &["install", "--verify", "--dest", d]),
        "is not installed",
    );

    assert_ok(&install(tmp.path()));
    let out = run(BIN, &["install", "--verify", "--dest", d]);
    assert_ok(&out);
    assert!(text(&out.stdout).contains("matches this binary"));

    let marker = tmp.path().join(".openshell-sandbox.version");
    let good = fs::read(&marker).unwrap();
    fs::write(&marker, b"version=0.0.0\n").unwrap();
    assert_fails_with(
        &run(BIN, &["install", "--verify", "--dest", d]),
        "does not record this binary",
    );
    fs::write(&marker, good).unwrap();

    let installed = tmp.path().join("openshell-sandbox");
    fs::set_permissions(&installed, fs::Permissions::from_mode(0o700)).unwrap();
    assert_fails_with(
        &run(BIN, &["install", "--verify", "--dest", d]),
        "has mode 700",
    );
    fs::set_permissions(&installed, fs::Permissions::from_mode(0o755)).unwrap();

    fs::OpenOptions::new()
        .append(true)
        .open(&installed)
        .unwrap()
        .write_all(b"tampered")
        .unwrap();
    assert_fails_with(
        &run(BIN, &["install", "--verify", "--dest", d]),
        "is a different binary",
    );
    // --verify never repairs anything.
    assert!(fs::read(&installed).unwrap().ends_with(b"tampered"));
}

#[test]
fn verify_of_a_missing_directory_says_not_installed() {
    let out = run(
        BIN,
        &["install", "--verify", "--dest", "/nonexistent/openshell"],
    );
    assert_fails_with(
        &out,
        "/nonexistent/openshell/openshell-sandbox is not installed",
    );
}

#[test]
fn verify_and_wait_cannot_be_combined() {
    let out = run(
        BIN,
        &["install", "--verify", "--wait", "--dest", "/nonexistent"],
    );
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("cannot be used with"));
}

#[test]
fn copy_self_follows_the_openshell_contract() {
    let tmp = tempfile::tempdir().unwrap();
    // A file path whose parents do not exist yet.
    let target = tmp.path().join("emptydir/nested/openshell-sandbox");
    let out = run(BIN, &["copy-self", target.to_str().unwrap()]);
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), fs::read(BIN).unwrap());
    assert_eq!(
        fs::metadata(&target).unwrap().permissions().mode() & 0o7777,
        0o755
    );
    // No marker: that is `install`'s business.
    assert!(!target.with_file_name(".openshell-sandbox.version").exists());

    // An existing directory receives our own file name.
    let dir = tmp.path().join("dir");
    fs::create_dir(&dir).unwrap();
    assert_ok(&run(BIN, &["copy-self", dir.to_str().unwrap()]));
    assert_eq!(
        fs::read(dir.join("openshell-sandbox")).unwrap(),
        fs::read(BIN).unwrap()
    );

    // Usage errors.
    let none = run(BIN, &["copy-self"]);
    assert_eq!(none.status.code(), Some(125));
    assert!(text(&none.stderr).contains("usage: openshell-sandbox copy-self DEST"));
    let two = run(BIN, &["copy-self", "a", "b"]);
    assert_eq!(two.status.code(), Some(125));

    // A symlink at DEST is refused, as for `install`.
    let sym = tmp.path().join("link");
    symlink(tmp.path().join("elsewhere"), &sym).unwrap();
    assert_fails_with(
        &run(BIN, &["copy-self", sym.to_str().unwrap()]),
        "symbolic link",
    );
}

#[test]
fn wait_exits_zero_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut child, _out) = start_waiting(Path::new(BIN), tmp.path());
    assert_eq!(child.try_wait().unwrap(), None);
    sigterm(child.id());
    assert_eq!(child.wait().unwrap().code(), Some(0));
    // It installed before waiting.
    assert_ok(&run(
        BIN,
        &[
            "install",
            "--verify",
            "--dest",
            tmp.path().to_str().unwrap(),
        ],
    ));
}

#[test]
fn a_failed_install_under_wait_does_not_wait() {
    let out = run(
        BIN,
        &["install", "--wait", "--dest", "/nonexistent/openshell-x"],
    );
    assert_fails_with(&out, "does not exist");
    assert!(!text(&out.stdout).contains("waiting"));
}

/// Run a shell script in a private mount namespace (mounts vanish with it).
fn in_mount_namespace(script: &str) -> Output {
    Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", script])
        .output()
        .expect("spawn unshare")
}

#[test]
fn a_read_only_destination_fails_clearly() {
    if !require(
        is_root() && have("unshare"),
        "needs root and unshare(1) for a read-only tmpfs",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().display();
    let script = format!(
        "set -e; mount -t tmpfs none {d}; mount -o remount,ro {d}; \
         {BIN} install --dest {d} && echo UNEXPECTED-SUCCESS; true"
    );
    let out = in_mount_namespace(&script);
    let err = text(&out.stderr);
    assert!(!text(&out.stdout).contains("UNEXPECTED-SUCCESS"));
    assert!(
        err.contains("the destination is on a read-only file system")
            && err.contains("Read-only file system (os error 30)")
            && err.contains(&d.to_string()),
        "{err}"
    );
}

#[test]
fn an_unchanged_install_and_verify_work_on_a_read_only_mount() {
    // The DaemonSet's main container mounts the hostPath read-only and reruns `install`.
    if !require(
        is_root() && have("unshare"),
        "needs root and unshare(1) to remount read-only",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().display();
    let script = format!(
        "set -e; mount -t tmpfs none {d}; {BIN} install --dest {d}; \
         mount -o remount,ro {d}; {BIN} install --dest {d}; {BIN} install --verify --dest {d}"
    );
    let out = in_mount_namespace(&script);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let stdout = text(&out.stdout);
    assert!(stdout.contains("nothing changed"), "{stdout}");
    assert!(stdout.contains("matches this binary"), "{stdout}");
}

#[test]
fn a_full_destination_fails_clearly_and_leaves_nothing_behind() {
    if !require(
        is_root() && have("unshare"),
        "needs root and unshare(1) for a tiny tmpfs",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().display();
    // 1 MiB cannot hold the binary.
    let script = format!(
        "set -e; mount -t tmpfs -o size=1m none {d}; \
         {BIN} install --dest {d} && echo UNEXPECTED-SUCCESS; echo LEFT:$(ls -A {d})"
    );
    let out = in_mount_namespace(&script);
    let err = text(&out.stderr);
    let stdout = text(&out.stdout);
    assert!(!stdout.contains("UNEXPECTED-SUCCESS"));
    assert!(
        err.contains("the destination file system is full")
            && err.contains("No space left on device"),
        "{err}"
    );
    assert!(stdout.contains("LEFT:\n"), "leftovers: {stdout}");
}

#[test]
fn a_destination_we_may_not_write_fails_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("locked");
    fs::create_dir(&dest).unwrap();
    let out = if is_root() {
        if !require(have("setpriv"), "needs setpriv(1) to drop root") {
            return;
        }
        // Root ignores mode bits; run as nobody against a root-owned 0755 directory.
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        Command::new("setpriv")
            .args([
                "--reuid",
                "65534",
                "--regid",
                "65534",
                "--clear-groups",
                BIN,
            ])
            .args(["install", "--dest", dest.to_str().unwrap()])
            .output()
            .unwrap()
    } else {
        fs::set_permissions(&dest, fs::Permissions::from_mode(0o555)).unwrap();
        install(&dest)
    };
    assert_fails_with(&out, "permission denied for this user");
    assert!(text(&out.stderr).contains("Permission denied (os error 13)"));
    assert!(fs::read_dir(&dest).unwrap().next().is_none());
}

/// Processes whose parent is `ppid`, from /proc.
fn children_of(ppid: u32) -> Vec<(u32, char)> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the parenthesised command: state, ppid, ...
        let Some(rest) = stat.rsplit_once(") ").map(|(_, r)| r) else {
            continue;
        };
        let mut f = rest.split_whitespace();
        let state = f.next().and_then(|s| s.chars().next()).unwrap_or('?');
        if f.next().and_then(|p| p.parse::<u32>().ok()) == Some(ppid) {
            out.push((pid, state));
        }
    }
    out
}

/// Poll `cond` until it holds; panics with `what` if it never does. Not a timing assertion:
/// the deadline only bounds a hang.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn wait_as_pid1_reaps_orphans_and_exits_zero_on_sigterm() {
    if !require(
        is_root() && have("unshare") && have("mkfifo"),
        "needs root, unshare(1), mkfifo(1) for a PID namespace",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("fifo");
    let dest = tmp.path().join("bin");
    fs::create_dir(&dest).unwrap();
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    // The subshell leaves an orphan blocked on the FIFO, then PID 1 becomes our binary.
    let script = format!(
        "(read x < {f}) & exec {BIN} install --wait --dest {d}",
        f = fifo.display(),
        d = dest.display()
    );
    let mut unshare = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(unshare.stdout.take().unwrap());
    let mut line = String::new();
    while reader.read_line(&mut line).unwrap() > 0 && line.trim() != "waiting for SIGTERM" {
        line.clear();
    }
    assert_eq!(line.trim(), "waiting for SIGTERM");

    let pid1 = children_of(unshare.id());
    assert_eq!(pid1.len(), 1, "{pid1:?}");
    let pid1 = pid1[0].0;
    assert!(
        fs::read_link(format!("/proc/{pid1}/exe"))
            .unwrap()
            .ends_with("openshell-sandbox")
    );
    eventually("the orphan is a child of PID 1", || {
        !children_of(pid1).is_empty()
    });

    // Let the orphan exit; PID 1 must collect it rather than leave a zombie.
    fs::OpenOptions::new()
        .write(true)
        .open(&fifo)
        .unwrap()
        .write_all(b"go\n")
        .unwrap();
    eventually("PID 1 has reaped every child", || {
        children_of(pid1).is_empty()
    });

    sigterm(pid1);
    assert_eq!(unshare.wait().unwrap().code(), Some(0));
}
