//! Raw `libc` calls live in `sys/` (wrappers that return the errno as `io::Error`) and in
//! `sandbox/child/` (between fork and exec, on prepared data). Any other file that calls a
//! libc function is listed here with the reason it does; a new one fails the test until it
//! uses a `sys/` wrapper or is listed. An entry that no longer calls libc fails too: the list
//! only shrinks.

use std::collections::BTreeMap;
use std::path::Path;

use crate::graph::{self, Tree};
use crate::scan;

/// Files outside `sys/` and `sandbox/child/` that call libc functions, and why.
const LIBC_CALLS: &[(&str, &str)] = &[
    // The parent side, on descriptors and pids it owns.
    (
        "check.rs",
        "fork, prctl, waitpid: no_new_privs is probed in a throwaway child, so that it does not stick to `check` itself",
    ),
    (
        "exec/manager.rs",
        "eventfd, poll, read, write, waitid, wait4: the manager thread's wake-up and its reaping loop (subreaper, P_ALL orphans, rusage)",
    ),
    ("exec/pty.rs", "ioctl(TIOCSWINSZ): resizing the pty master"),
    (
        "exec/report.rs",
        "statfs: whether a path is on a cgroup file system",
    ),
    (
        "exec/report_file.rs",
        "faccessat, unlinkat, linkat, renameat, write: the report file is written beside its final name (opened with sys::walk::open_in) and renamed into place relative to a directory descriptor, never by a path that a link could redirect",
    ),
    (
        "exec/run/stdio.rs",
        "fstat, stat, poll, read, isatty, tcgetattr/tcsetattr, cfmakeraw, ioctl, fcntl, lseek, kcmp: what `run` inherits as stdio and how it hands it to the command (a terminal in raw mode, the same open file twice)",
    ),
    (
        "exec/usage.rs",
        "sysconf(_SC_CLK_TCK): the tick length of /proc's CPU times",
    ),
    (
        "exec/workdir.rs",
        "credential syscalls, access, open, fchmod, fchown, _exit: the writability check runs in a clone child as the sandbox identity; the workdir is made and re-owned by descriptor",
    ),
    (
        "exec/workdir/claim.rs",
        "fstat, open, openat, flock: the workdir claim is a lock held on a descriptor of the directory the walk decided on",
    ),
    (
        "exec/workdir/handover.rs",
        "fstat, fchownat, openat, fdopendir, readdir, closedir: the hand-over re-owns the tree by descriptors, never following a link",
    ),
    // The egress proxy.
    (
        "egress/holders.rs",
        "prctl(PR_GET_CHILD_SUBREAPER), kcmp, readlinkat, getxattr(system.sockprotoname): holders of a socket read from /proc with the sandbox frozen",
    ),
    (
        "egress/loaded.rs",
        "makedev, fstatvfs: the device and mount flags of what a holder may run",
    ),
    (
        "egress/netns.rs",
        "setns, socket, ioctl, listen, if_nametoindex, sendto, recv: the proxy's listener and lo made inside the sandbox's network namespace, from a thread that enters it",
    ),
    (
        "egress/relay.rs",
        "fcntl, splice: the zero-copy relay (its pipes from sys::pipe)",
    ),
    (
        "egress/secret_mem.rs",
        "mmap, madvise(MADV_WIPEONFORK, MADV_DONTDUMP), munmap: the memory that holds credential values, wiped in every fork and left out of core dumps",
    ),
    (
        "egress/sockdiag.rs",
        "socket, setsockopt, send, recv: the NETLINK_SOCK_DIAG query of a connection's socket",
    ),
    // serve.
    (
        "gateway/ssh/forward.rs",
        "setns: a forwarding connection made from a thread inside the sandbox's network namespace",
    ),
    (
        "gateway/ssh/sftp.rs",
        "memfd_create, fcntl(F_ADD_SEALS): the sealed copy of this binary that an sftp child execs",
    ),
    // The sandbox's layers, most between the supervisor and a helper child of its own.
    (
        "sandbox/cgroup.rs",
        "write: the child joins its cgroup between fork and exec (async-signal-safe)",
    ),
    (
        "sandbox/cgroup/system.rs",
        "access(W_OK): whether a cgroup hierarchy is writable",
    ),
    (
        "sandbox/cgroup_remount.rs",
        "open_tree, mount_setattr: the read-write copies of read-only cgroup mounts",
    ),
    (
        "sandbox/devnull.rs",
        "open_tree, mount_setattr, fstat, makedev: the read-only /dev/null clone",
    ),
    (
        "sandbox/diagnose.rs",
        "close, fstat, fcntl, openat, readlinkat, open, pread, write, fstatvfs, faccessat2: why an exec could not start, read from the view by descriptor",
    ),
    (
        "sandbox/identity.rs",
        "prctl, capset, setres*id, getres*id, and the uid lease's mkdir/open/openat/flock: the identity switch and its check (called from the child's list), the lease held on a descriptor",
    ),
    (
        "sandbox/idmap.rs",
        "close, read, _exit, open: the throwaway child whose user namespace an idmapped mount names",
    ),
    (
        "sandbox/landlock.rs",
        "landlock_* syscalls, open, close: the rules an exec adds to the prepared ruleset between fork and exec (its view's root and fresh /proc), async-signal-safe, and restrict_self",
    ),
    (
        "sandbox/namespaces.rs",
        "unshare, setns, clone, close, waitpid, open: the supervisor's user namespace and the view's helper child",
    ),
    (
        "sandbox/namespaces/helper.rs",
        "mount, umount2, unshare, setns, sethostname, open, read, write, close, mkdir, unlink, socket, ioctl, clone, _exit, waitpid: the view's helper child, between fork and its exit (raw calls on prepared data)",
    ),
    (
        "sandbox/namespaces/in_init.rs",
        "mount, sethostname: the view made by an exec's own init (raw calls on prepared data)",
    ),
    (
        "sandbox/namespaces/plan.rs",
        "statvfs: the mount flags a bind must keep",
    ),
    (
        "sandbox/namespaces/report.rs",
        "write, read: the helper's report over a pipe (async-signal-safe on the writer's side)",
    ),
    (
        "sandbox/rlimits.rs",
        "getrlimit, setrlimit, signal: rlimits set in the child (async-signal-safe) and read by the supervisor",
    ),
    (
        "sandbox/run_timeline.rs",
        "clock_gettime, getrusage: `run`'s timeline (OSB_RUN_TIMELINE) and its CPU clocks",
    ),
    (
        "sandbox/seccomp.rs",
        "prctl, seccomp: installing the filter (child side) and probing the kernel",
    ),
    (
        "sandbox/step.rs",
        "write: a failed step sent over the error pipe (async-signal-safe)",
    ),
    (
        "sandbox/view_layer.rs",
        "sysconf(_SC_PAGESIZE): the IPC limits are counted in pages",
    ),
    (
        "sandbox/view_root/build.rs",
        "openat, mkdirat, mount, umount2, unlinkat, symlinkat, fstat, fchdir, chdir, chroot, open_tree, move_mount, mount_setattr, pivot_root: the view's root built by descriptor in the helper child (raw calls on prepared data)",
    ),
];

/// Where raw calls belong without a reason.
fn exempt(file: &str) -> bool {
    file.starts_with("sys/")
        || file == "sys.rs"
        || file.starts_with("sandbox/child/")
        || file == "sandbox/child.rs"
}

/// (files calling libc that the table does not list, with their calls; entries that no longer
/// call libc).
fn check(tree: &Tree, table: &[(&str, &str)]) -> (BTreeMap<String, Vec<String>>, Vec<String>) {
    let found = scan::library(tree);
    let mut unlisted = BTreeMap::new();
    for (file, f) in &found {
        if exempt(file) || f.libc_calls.is_empty() || table.iter().any(|(t, _)| t == file) {
            continue;
        }
        unlisted.insert(
            file.clone(),
            f.libc_calls
                .iter()
                .map(|(line, name)| format!("{line}: libc::{name}"))
                .collect(),
        );
    }
    let stale = table
        .iter()
        .filter(|(t, _)| found.get(*t).is_none_or(|f| f.libc_calls.is_empty()))
        .map(|(t, _)| t.to_string())
        .collect();
    (unlisted, stale)
}

#[test]
fn libc_is_called_only_from_sys_the_child_and_listed_files() {
    let tree = graph::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let (unlisted, stale) = check(&tree, LIBC_CALLS);
    assert!(
        unlisted.is_empty(),
        "files outside sys/ and sandbox/child/ that call libc and are not in LIBC_CALLS \
         (tests/architecture/libc_calls.rs): use a sys/ wrapper, or list the file with its \
         reason:\n{}",
        unlisted
            .iter()
            .map(|(f, calls)| format!("src/{f}: {}", calls.join(", ")))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        stale.is_empty(),
        "LIBC_CALLS lists files that no longer call libc; remove them: {stale:?}"
    );
    for (file, reason) in LIBC_CALLS {
        assert!(!reason.trim().is_empty(), "{file} has no reason");
    }
}

fn planted() -> Tree {
    [
        (
            "lib.rs",
            "pub mod a; pub mod b; pub mod sys; pub mod sandbox;",
        ),
        (
            "a.rs",
            "pub fn f() -> i32 { // SAFETY: none needed.\n unsafe { libc::getpid() } }",
        ),
        (
            "b.rs",
            "pub fn g() { assert!(unsafe { libc::close(-1) } < 0); let _ = libc::O_CLOEXEC; }\n\
             #[cfg(test)] mod tests { fn t() { unsafe { libc::getppid(); } } }",
        ),
        (
            "sys.rs",
            "pub fn pid() -> i32 { unsafe { libc::getpid() } }",
        ),
        ("sandbox.rs", "pub mod child;"),
        (
            "sandbox/child.rs",
            "pub fn c() { unsafe { libc::_exit(0) } }",
        ),
    ]
    .iter()
    .map(|(p, t)| (p.to_string(), t.to_string()))
    .collect()
}

#[test]
fn a_planted_call_in_an_unlisted_file_is_caught() {
    let (unlisted, stale) = check(&planted(), &[("b.rs", "listed")]);
    assert_eq!(
        unlisted.into_iter().collect::<Vec<_>>(),
        [("a.rs".to_string(), vec!["2: libc::getpid".to_string()])]
    );
    assert!(stale.is_empty());
    // A call inside a macro is seen; a constant and a test module's call are not calls.
    let (unlisted, _) = check(&planted(), &[("a.rs", "listed")]);
    assert_eq!(
        unlisted.into_iter().collect::<Vec<_>>(),
        [("b.rs".to_string(), vec!["1: libc::close".to_string()])]
    );
    // An entry for a file with no call is stale.
    let (_, stale) = check(
        &planted(),
        &[("a.rs", "x"), ("b.rs", "x"), ("sandbox.rs", "x")],
    );
    assert_eq!(stale, ["sandbox.rs"]);
}
