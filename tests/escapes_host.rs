//! What a run could leave on the host for after it, through the real binary: the hostile probe
//! (tests/support/probe/host.c) makes the attempt inside `openshell-sandbox run`, the test
//! asserts the exact errno, then looks at the target from the host.
//!
//! - Set-uid and set-gid files in the workdir, by every call that takes a mode (chmod, fchmod,
//!   fchmodat, fchmodat2, open, openat, creat with O_CREAT or O_TMPFILE, openat2, mkdir,
//!   mkdirat, mknod, mknodat), by copying a set-uid file with its mode, and by moving or
//!   linking one in from another grant: after the run no file of the workdir has either bit.
//! - The mode of a procfs entry (procfs keeps it in the kernel-wide entry, so it would apply
//!   to every later /proc), and the modes and times of the host's /dev/null and /dev/full,
//!   by name and through the stdin descriptor the supervisor opened: all EROFS, unchanged on
//!   the host; a write to /dev/null still works.
//! - The kernel log through syslog(2), with `kernel.dmesg_restrict=0` (where the kernel itself
//!   would allow it): EPERM.
//!
//! Each runs with the supervisor as root (the child a test uid), as a non-root user (the child
//! keeps its uid) and with `--uid 0` (root without capabilities, the owner of the device nodes
//! and the procfs entry). Uids 64280..64289 are this file's.

mod support;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use libc::{ENOSYS, EPERM, EROFS, EXDEV};
use support::probe::expect::{self, Expect};
use support::probe::machine::{Exclusive, Nodes, Sysctl};
use support::probe::{Mode, Outcome, Scene};

fn run_named(scene: &Scene, mode: Mode, names: &[&str], extra: &[String]) -> Outcome {
    let mut args = vec![names.join(",")];
    args.extend(scene.params());
    args.extend_from_slice(extra);
    let out = support::probe::launch(scene, mode, &[], &args);
    if scene.uid != 0 {
        support::probe::outside::kill_uid(scene, scene.uid);
    }
    assert!(!out.hung, "the run did not end; stderr:\n{}", out.stderr);
    assert!(
        out.status.success(),
        "supervisor ended with {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    out
}

fn assert_all(out: &Outcome, want: &[(&str, Expect)]) {
    let failures: Vec<String> = want
        .iter()
        .filter_map(|(name, e)| expect::check(out.attempt(name), e).err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} attempt(s) not as expected:\n  {}\n\nprobe output:\n{}\nstderr:\n{}",
        failures.len(),
        failures.join("\n  "),
        out.stdout,
        out.stderr
    );
}

// ---- set-uid and set-gid files --------------------------------------------------------------

/// (attempt, what the sandbox answers, the workdir file it makes).
const SETID: &[(&str, Expect, &str)] = &[
    ("chmod_setuid", Expect::Errno(EPERM), "chmod-setuid"),
    ("chmod_setgid", Expect::Errno(EPERM), "chmod-setgid"),
    (
        "chmod_setuid_high_bits",
        Expect::Errno(EPERM),
        "chmod-setuid-high",
    ),
    ("fchmod_setuid", Expect::Errno(EPERM), "fchmod-setuid"),
    ("fchmodat_setuid", Expect::Errno(EPERM), "fchmodat-setuid"),
    ("fchmodat2_setuid", Expect::Errno(EPERM), "fchmodat2-setuid"),
    (
        "open_creat_setuid",
        Expect::Errno(EPERM),
        "open-creat-setuid",
    ),
    (
        "openat_creat_setgid",
        Expect::Errno(EPERM),
        "openat-creat-setgid",
    ),
    ("creat_setuid", Expect::Errno(EPERM), "creat-setuid"),
    (
        "open_tmpfile_setuid",
        Expect::Errno(EPERM),
        "tmpfile-setuid",
    ),
    // Its mode is in a struct the filter cannot read: ENOSYS, so libc falls back to openat.
    (
        "openat2_creat_setuid",
        Expect::Errno(ENOSYS),
        "openat2-setuid",
    ),
    ("mkdir_setgid", Expect::Errno(EPERM), "mkdir-setgid"),
    ("mkdirat_setgid", Expect::Errno(EPERM), "mkdirat-setgid"),
    ("mknod_setuid", Expect::Errno(EPERM), "mknod-setuid"),
    ("mknodat_setuid", Expect::Errno(EPERM), "mknodat-setuid"),
    // `cp -p` and tar: the bytes are copied, the mode with the bit is refused.
    (
        "copy_setuid_preserving_mode",
        Expect::Errno(EPERM),
        "copied-setuid",
    ),
    // Each grant is a mount of its own in the view: nothing moves or links across.
    (
        "rename_setuid_into_workdir",
        Expect::Errno(EXDEV),
        "renamed-setuid",
    ),
    (
        "link_setuid_into_workdir",
        Expect::Errno(EXDEV),
        "linked-setuid",
    ),
    ("control_chmod_plain", Expect::Allowed, "control-chmod"),
    ("control_open_creat_plain", Expect::Allowed, "control-creat"),
    (
        "control_open_existing_with_setuid_mode",
        Expect::Allowed,
        "control-open-mode",
    ),
    ("control_mkdir_plain", Expect::Allowed, "control-mkdir"),
];

/// Every file below `dir` with S_ISUID or S_ISGID, as the host sees it.
fn setid_files(dir: &Path) -> Vec<(PathBuf, u32)> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = e.metadata().unwrap();
            if m.mode() & 0o6000 != 0 {
                found.push((e.path(), m.mode() & 0o7777));
            }
            if m.is_dir() {
                todo.push(e.path());
            }
        }
    }
    found
}

fn setid_bits_never_reach_the_host(uid: u32, mode: Mode) {
    if !support::probe::require_root_and_cc() {
        return;
    }
    let scene = Scene::new(uid);
    let names: Vec<&str> = SETID.iter().map(|(n, _, _)| *n).collect();
    let out = run_named(&scene, mode, &names, &[]);
    let want: Vec<(&str, Expect)> = SETID.iter().map(|(n, e, _)| (*n, e.clone())).collect();
    assert_all(&out, &want);
    // From the host: each file the attempts made is there without the bits, and nothing else
    // in the workdir has them either.
    for (name, _, file) in SETID {
        if let Ok(m) = std::fs::symlink_metadata(scene.wd.join(file)) {
            assert_eq!(
                m.mode() & 0o6000,
                0,
                "{name}: {file} in the workdir is mode {:o} on the host",
                m.mode() & 0o7777
            );
        }
    }
    for control in ["control-chmod", "control-creat", "control-mkdir"] {
        assert!(
            scene.wd.join(control).exists(),
            "the control's {control} is missing from the workdir"
        );
    }
    assert_eq!(
        std::fs::metadata(scene.wd.join("control-chmod"))
            .unwrap()
            .mode()
            & 0o7777,
        0o1750,
        "a mode without set-id bits is the program's own"
    );
    let left = setid_files(&scene.wd);
    assert!(
        left.is_empty(),
        "set-id files left in the workdir: {left:?}"
    );
    assert_eq!(out.layer("seccomp"), "enforced");
}

#[test]
fn root_supervisor_child_cannot_leave_a_setid_file() {
    setid_bits_never_reach_the_host(64280, Mode::Root);
}

/// The child keeps the operator's uid: a set-uid file would run as the operator's account.
#[test]
fn nonroot_child_cannot_leave_a_setid_file() {
    setid_bits_never_reach_the_host(64281, Mode::NonRoot);
}

/// A set-uid file of uid 0 would make every local user root.
#[test]
fn uid0_child_cannot_leave_a_setid_file() {
    setid_bits_never_reach_the_host(0, Mode::RootTargetUid0);
}

// ---- procfs entries and device nodes --------------------------------------------------------

/// A root-owned procfs file whose mode lives in the kernel-wide entry.
fn proc_entry() -> Option<&'static Path> {
    ["/proc/kpageflags", "/proc/kpagecount", "/proc/kallsyms"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists())
}

fn nodes_keep_their_modes_and_times(uid: u32, mode: Mode) {
    if !support::probe::require_root_and_cc() {
        return;
    }
    let Some(entry) = proc_entry() else {
        support::probe::require(
            false,
            "a procfs entry with a kernel-wide mode (/proc/kpageflags)",
        );
        return;
    };
    let lock = Exclusive::take();
    let nodes = Nodes::record(
        &lock,
        &[entry, Path::new("/dev/null"), Path::new("/dev/full")],
    );
    let scene = Scene::new(uid);
    // The stdin /dev/null is opened by the supervisor: a root one opens it through a
    // read-only mount of its own; a non-root one cannot make that mount, and its child does
    // not own the node (the kernel's EPERM).
    let stdin = if mode == Mode::NonRoot {
        Expect::Errno(EPERM)
    } else {
        Expect::Errno(EROFS)
    };
    let want = [
        ("chmod_proc_entry", Expect::Errno(EROFS)),
        ("chmod_dev_null", Expect::Errno(EROFS)),
        ("utimes_dev_full", Expect::Errno(EROFS)),
        ("fchmod_stdin_dev_null", stdin.clone()),
        ("futimens_stdin_dev_null", stdin),
        ("control_write_dev_null", Expect::Allowed),
    ];
    let names: Vec<&str> = want.iter().map(|(n, _)| *n).collect();
    let out = run_named(
        &scene,
        mode,
        &names,
        &[format!("proc_entry={}", entry.display())],
    );
    let changed = nodes.changed();
    // The guard puts back whatever changed before the assertions can fail.
    drop(nodes);
    assert!(
        changed.is_empty(),
        "host files changed by the run (path, before, after): {changed:?}"
    );
    assert_all(&out, &want);
}

#[test]
fn root_supervisor_child_cannot_change_procfs_or_device_nodes() {
    nodes_keep_their_modes_and_times(64282, Mode::Root);
}

#[test]
fn nonroot_child_cannot_change_procfs_or_device_nodes() {
    nodes_keep_their_modes_and_times(64283, Mode::NonRoot);
}

/// Root without capabilities owns the device nodes and the procfs entries: only the
/// read-only mounts stand in the way.
#[test]
fn uid0_child_cannot_change_procfs_or_device_nodes() {
    nodes_keep_their_modes_and_times(0, Mode::RootTargetUid0);
}

// ---- the kernel log ---------------------------------------------------------------------------

fn kernel_log_is_refused(uid: u32, mode: Mode) {
    if !support::probe::require_root_and_cc() {
        return;
    }
    let names = ["syslog_read_all", "syslog_size_buffer"];
    let lock = Exclusive::take();
    // Where the kernel itself lets any process read the log.
    let _open = Sysctl::set(&lock, "kernel.dmesg_restrict", "0").unwrap();
    let scene = Scene::new(uid);
    let mut args = vec![names.join(",")];
    args.extend(scene.params());
    // The control: without the sandbox, this uid reads the log.
    let bare = support::probe::launch_bare(&scene, &args);
    for n in names {
        assert_eq!(
            expect::check(bare.attempt(n), &Expect::Allowed),
            Ok(()),
            "without the sandbox"
        );
    }
    let out = run_named(&scene, mode, &names, &[]);
    assert_all(
        &out,
        &[
            ("syslog_read_all", Expect::Errno(EPERM)),
            ("syslog_size_buffer", Expect::Errno(EPERM)),
        ],
    );
}

#[test]
fn root_supervisor_child_cannot_read_the_kernel_log() {
    kernel_log_is_refused(64284, Mode::Root);
}

#[test]
fn nonroot_child_cannot_read_the_kernel_log() {
    kernel_log_is_refused(64285, Mode::NonRoot);
}

#[test]
fn uid0_child_cannot_read_the_kernel_log() {
    kernel_log_is_refused(0, Mode::RootTargetUid0);
}

// ---- the core limit -----------------------------------------------------------------------------

/// RLIMIT_CORE is 1, soft and hard: the kernel's "no dump to a pipe helper" value, and the child
/// cannot raise it (escapes_coredump.rs crashes a child under a recording helper).
fn core_limit_is_locked_at_one(uid: u32, mode: Mode) {
    if !support::probe::require_root_and_cc() {
        return;
    }
    let scene = Scene::new(uid);
    let out = run_named(&scene, mode, &["raise_rlimit_core"], &[]);
    assert_all(&out, &[("raise_rlimit_core", Expect::Errno(EPERM))]);
    let a = out.attempt("raise_rlimit_core");
    assert_eq!((a.num("soft"), a.num("hard")), (1, 1), "{}", a.detail);
}

#[test]
fn root_supervisor_child_core_limit_is_locked_at_one() {
    core_limit_is_locked_at_one(64286, Mode::Root);
}

#[test]
fn nonroot_child_core_limit_is_locked_at_one() {
    core_limit_is_locked_at_one(64287, Mode::NonRoot);
}

#[test]
fn uid0_child_core_limit_is_locked_at_one() {
    core_limit_is_locked_at_one(0, Mode::RootTargetUid0);
}
