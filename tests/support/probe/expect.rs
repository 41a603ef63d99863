//! What each attempt of `probe all` must come to, and why that errno.
//!
//! Every attempt the probe makes is listed here, and every name listed must be reported: a
//! probe that crashed half-way, or an attempt added to the C side and forgotten here, fails.

use std::path::PathBuf;

use libc::{
    EACCES, ECONNREFUSED, EINVAL, ENOENT, ENOSYS, EOPNOTSUPP, EPERM, EROFS, ESRCH, ETXTBSY, EXDEV,
    SIGSYS,
};

use super::{Attempt, Mode};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// A control: the sandbox must let this through, or the refusals prove nothing.
    Allowed,
    /// Refused with exactly this errno.
    Errno(i32),
    /// Killed by exactly this signal.
    Signal(i32),
    /// Refused with nothing to show but the probe's own check (no capability held, the setuid
    /// helper ran unprivileged, no descriptor or variable leaked).
    Quiet,
    /// Only the test can judge, outside the sandbox (the witness, the sockets).
    Pending,
    /// Gets through, for a reason SECURITY.md documents; printed loudly on every run.
    KnownGap(&'static str),
    /// The probe could not even aim: its target is not in the sandbox's view.
    OutOfView,
}

/// Facts about this run that change an expectation.
pub struct Ctx {
    pub mode: Mode,
    pub network_all: bool,
    pub landlock_abi: i32,
    /// The kernel files of `outside::kernel_targets`, by parameter name.
    pub targets: Vec<(&'static str, PathBuf)>,
    /// The run's exec had its own PID namespace: no process outside it exists for the probe.
    pub pid_namespace: bool,
    /// The run's view has its own tmpfs on /tmp.
    pub private_tmp: bool,
    /// The run's view has its own network namespace (abstract sockets live in one).
    pub private_net: bool,
    /// The (non-root) supervisor runs in a user namespace of its own.
    pub user_namespace: bool,
    /// The view's root holds only the granted paths: nothing outside them exists.
    pub view_root: bool,
}

/// Landlock ABI 9 added LANDLOCK_ACCESS_FS_RESOLVE_UNIX; before it, connect(2) to a pathname
/// socket is checked only against the socket file's mode.
const PATHNAME_SOCKET_GAP: &str = "Landlock ABI < 9 cannot restrict connect() to pathname UNIX sockets; \
     only the socket file's permissions stand in the way";
const METADATA_GAP: &str = "Landlock does not restrict stat(): size, times and owner of a denied \
     file stay visible (its contents do not)";
const NOTIFY_GAP: &str = "Landlock does not restrict inotify: a child can watch a denied \
     directory and learn the names of files created or changed in it";
const UID0_OWNS_ROOT_FILES: &str = "the child is uid 0: files owned by root with owner-only modes \
     (/etc/shadow) are its own, and capabilities are not needed to read them";

const TABLE: &[(&str, Expect)] = &[
    // Filesystem: Landlock answers EACCES for a path outside every rule ...
    ("control_write_workdir", Expect::Allowed),
    ("control_read_ro_sibling", Expect::Allowed),
    ("write_outside_workdir", Expect::Errno(EACCES)),
    ("write_tmp", Expect::Errno(EACCES)),
    ("read_etc_shadow", Expect::Errno(EACCES)),
    ("read_denied_secret", Expect::Errno(EACCES)),
    ("list_denied_dir", Expect::Errno(EACCES)),
    ("read_default_tls_secret", Expect::Errno(EACCES)),
    ("read_via_proc1_root", Expect::Errno(EACCES)),
    ("read_secret_via_proc_self_root", Expect::Errno(EACCES)),
    ("symlink_read_escape", Expect::Errno(EACCES)),
    ("symlink_secret_escape", Expect::Errno(EACCES)),
    ("symlink_write_escape", Expect::Errno(EACCES)),
    // ... and EXDEV when a link would give a file more rights in its new place than it has
    // where it is (LANDLOCK_ACCESS_FS_REFER).
    ("hardlink_outside_in", Expect::Errno(EXDEV)),
    ("hardlink_secret_in", Expect::Errno(EXDEV)),
    ("hardlink_workdir_out", Expect::Errno(EACCES)),
    ("rename_out_of_workdir", Expect::Errno(EACCES)),
    ("rename_into_workdir", Expect::Errno(EACCES)),
    ("rename_secret_into_workdir", Expect::Errno(EACCES)),
    ("rename_denied_dir", Expect::Errno(EACCES)),
    ("write_proc_sys", Expect::Errno(EACCES)),
    ("write_sysrq_trigger", Expect::Errno(EACCES)),
    ("write_dev_kmsg", Expect::Errno(EACCES)),
    ("read_raw_disk", Expect::Errno(EACCES)),
    ("write_cgroup_release_agent", Expect::Errno(EACCES)),
    ("escape_to_root_cgroup", Expect::Errno(EACCES)),
    // The probe binary is root's: file mode refuses a non-root uid first. For uid 0 the kernel's
    // "text file busy" comes before Landlock's check (see `expected`).
    ("write_proc_self_exe", Expect::Errno(EACCES)),
    // No capability: CAP_MKNOD and CAP_DAC_READ_SEARCH are gone from every set.
    ("mknod_char_device", Expect::Errno(EPERM)),
    ("open_by_handle", Expect::Errno(EPERM)),
    // Landlock has no right for metadata or change notification.
    ("stat_denied_secret", Expect::KnownGap(METADATA_GAP)),
    ("inotify_watch_denied_dir", Expect::KnownGap(NOTIFY_GAP)),
    // Landlock does not restrict fanotify marks either, but fanotify_init is seccomp's EPERM.
    ("fanotify_watch_denied_dir", Expect::Errno(EPERM)),
    // Other processes: /proc files need ptrace access, which Landlock refuses for any process
    // outside the sandbox's domain (EACCES from procfs); the syscalls are seccomp's EPERM;
    // signals are Landlock's scope (EPERM).
    ("control_supervisor_is_parent", Expect::Allowed),
    ("read_supervisor_environ", Expect::Errno(EACCES)),
    ("open_supervisor_mem", Expect::Errno(EACCES)),
    ("read_witness_environ", Expect::Errno(EACCES)),
    ("open_witness_mem", Expect::Errno(EACCES)),
    ("read_via_witness_root", Expect::Errno(EACCES)),
    ("ptrace_attach_supervisor", Expect::Errno(EPERM)),
    ("ptrace_attach_witness", Expect::Errno(EPERM)),
    ("ptrace_traceme", Expect::Errno(EPERM)),
    ("process_vm_readv_supervisor", Expect::Errno(EPERM)),
    ("pidfd_getfd_supervisor", Expect::Errno(EPERM)),
    ("kill_witness", Expect::Errno(EPERM)),
    ("pidfd_send_signal_witness", Expect::Errno(EPERM)),
    ("sigio_to_witness", Expect::Pending),
    ("kill_init", Expect::Errno(EPERM)),
    ("kill_supervisor", Expect::Errno(EPERM)),
    // Network (--network none): seccomp's EPERM for every family but AF_UNIX; Landlock's
    // scope (EPERM) for abstract sockets outside.
    ("control_socket_unix", Expect::Allowed),
    ("socket_inet", Expect::Errno(EPERM)),
    ("socket_inet_udp", Expect::Errno(EPERM)),
    ("socket_inet6", Expect::Errno(EPERM)),
    ("socket_netlink_route", Expect::Errno(EPERM)),
    ("socket_netlink_audit", Expect::Errno(EPERM)),
    ("socket_packet", Expect::Errno(EPERM)),
    ("socket_vsock", Expect::Errno(EPERM)),
    // Outside `--network all`'s allow-list too: EPERM in both modes.
    ("socket_alg", Expect::Errno(EPERM)),
    ("socket_tipc", Expect::Errno(EPERM)),
    ("socket_rds", Expect::Errno(EPERM)),
    ("socket_xdp", Expect::Errno(EPERM)),
    ("socket_kcm", Expect::Errno(EPERM)),
    ("socket_can", Expect::Errno(EPERM)),
    ("socket_bluetooth", Expect::Errno(EPERM)),
    // socketpair follows socket's family rule (see `expected` for AF_INET with --network all).
    ("control_socketpair_unix", Expect::Allowed),
    ("socketpair_inet", Expect::Errno(EPERM)),
    ("socketpair_alg", Expect::Errno(EPERM)),
    ("socketpair_netlink_audit", Expect::Errno(EPERM)),
    ("connect_abstract_outside", Expect::Errno(EPERM)),
    ("sendto_abstract_dgram_outside", Expect::Errno(EPERM)),
    ("connect_pathname_unix_outside", Expect::Errno(EACCES)),
    ("io_uring_setup", Expect::Errno(EPERM)),
    // Namespaces and mounts: seccomp; clone3 is ENOSYS so that libc falls back to clone.
    ("unshare_user", Expect::Errno(EPERM)),
    ("unshare_net", Expect::Errno(EPERM)),
    ("unshare_mount", Expect::Errno(EPERM)),
    ("unshare_time", Expect::Errno(EPERM)),
    ("clone_newuser", Expect::Errno(EPERM)),
    ("clone_newuser_high_bits", Expect::Errno(EPERM)),
    ("clone_newpid", Expect::Errno(EPERM)),
    ("clone3_newuser", Expect::Errno(ENOSYS)),
    ("mount_tmpfs", Expect::Errno(EPERM)),
    ("umount_proc", Expect::Errno(EPERM)),
    ("chroot_workdir", Expect::Errno(EPERM)),
    ("pivot_root", Expect::Errno(EPERM)),
    ("setns", Expect::Errno(EPERM)),
    ("open_tree_clone", Expect::Errno(EPERM)),
    ("fsopen_tmpfs", Expect::Errno(EPERM)),
    // Kernel surface: seccomp.
    ("keyctl", Expect::Errno(EPERM)),
    ("add_key", Expect::Errno(EPERM)),
    ("request_key", Expect::Errno(EPERM)),
    ("bpf_map_create", Expect::Errno(EPERM)),
    ("perf_event_open_self", Expect::Errno(EPERM)),
    ("userfaultfd", Expect::Errno(EPERM)),
    ("tiocsti", Expect::Errno(EPERM)),
    ("tiocsti_high_bits", Expect::Errno(EPERM)),
    ("tioclinux", Expect::Errno(EPERM)),
    ("control_personality_query", Expect::Allowed),
    ("personality_read_implies_exec", Expect::Errno(EPERM)),
    ("personality_no_randomize", Expect::Errno(EPERM)),
    ("personality_high_bits", Expect::Errno(EPERM)),
    ("modify_ldt_read", Expect::Errno(EPERM)),
    ("iopl", Expect::Errno(EPERM)),
    ("ioperm", Expect::Errno(EPERM)),
    ("kexec_load", Expect::Errno(EPERM)),
    ("finit_module", Expect::Errno(EPERM)),
    ("delete_module", Expect::Errno(EPERM)),
    // Privilege: no CAP_SYS_RESOURCE / CAP_SYS_NICE (setpriority answers EACCES), no way back
    // to uid 0, no_new_privs cannot be cleared (EINVAL) and voids the setuid bit.
    ("raise_rlimit_as", Expect::Errno(EPERM)),
    ("raise_rlimit_nproc", Expect::Errno(EPERM)),
    ("raise_rlimit_nofile", Expect::Errno(EPERM)),
    ("setpriority_minus_20", Expect::Errno(EACCES)),
    ("setuid_root", Expect::Errno(EPERM)),
    ("capset_full", Expect::Errno(EPERM)),
    ("capabilities_held", Expect::Quiet),
    ("clear_no_new_privs", Expect::Errno(EINVAL)),
    ("exec_setuid_helper", Expect::Quiet),
    // Syscall ABI: the filter kills the whole process.
    ("x32_syscall", Expect::Signal(SIGSYS)),
    ("int80_syscall", Expect::Signal(SIGSYS)),
    // ... but a number that is a syscall on no ABI gets the kernel's own ENOSYS.
    ("syscall_minus_one", Expect::Errno(ENOSYS)),
    // Other processes of the same uid (and the supervisor, when it shares the uid): their
    // scheduling, I/O priority and limits are seccomp's EPERM; the caller's own still work,
    // and so do reads of another process's limits.
    ("prlimit_supervisor_nofile", Expect::Errno(EPERM)),
    ("prlimit_supervisor_cpu", Expect::Errno(EPERM)),
    ("control_prlimit_read_supervisor", Expect::Allowed),
    ("prlimit_witness_nofile", Expect::Errno(EPERM)),
    ("control_prlimit_read_witness", Expect::Allowed),
    ("control_prlimit_set_self", Expect::Allowed),
    ("setpriority_witness", Expect::Errno(EPERM)),
    ("control_setpriority_self", Expect::Allowed),
    ("sched_setaffinity_witness", Expect::Errno(EPERM)),
    ("control_sched_setaffinity_self", Expect::Allowed),
    ("sched_setscheduler_witness", Expect::Errno(EPERM)),
    ("control_sched_setscheduler_self", Expect::Allowed),
    ("sched_setparam_witness", Expect::Errno(EPERM)),
    ("control_sched_setparam_self", Expect::Allowed),
    ("sched_setattr_witness", Expect::Errno(EPERM)),
    ("control_sched_setattr_self", Expect::Allowed),
    ("ioprio_set_witness", Expect::Errno(EPERM)),
    ("control_ioprio_set_self", Expect::Allowed),
    // Leaks.
    ("leak_inherited_fds", Expect::Quiet),
    ("leak_environment", Expect::Quiet),
];

/// Every attempt name of `probe all`.
pub fn names() -> impl Iterator<Item = &'static str> {
    TABLE.iter().map(|(n, _)| *n)
}

/// The expectation for one attempt in this run.
pub fn expected(name: &str, ctx: &Ctx) -> Expect {
    let base = TABLE
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, e)| e.clone())
        .unwrap_or_else(|| panic!("the probe reported `{name}`, which expect.rs does not list"));
    let target = |key: &str| ctx.targets.iter().find(|(k, _)| *k == key).map(|(_, p)| p);
    let on_target = |key: &str| match target(key) {
        Some(p) if !p.exists() => Expect::Errno(ENOENT),
        _ => base.clone(),
    };
    match name {
        // The view's root holds only the granted paths: what lies outside them (the scene's
        // `outside` directory, /dev/kmsg, the raw disk, /sys) does not exist there.
        "write_outside_workdir"
        | "symlink_read_escape"
        | "symlink_write_escape"
        | "hardlink_outside_in"
        | "hardlink_workdir_out"
        | "rename_out_of_workdir"
        | "rename_into_workdir"
        | "write_dev_kmsg"
        | "read_raw_disk"
        | "write_cgroup_release_agent"
        | "escape_to_root_cgroup"
            if ctx.view_root =>
        {
            Expect::Errno(ENOENT)
        }
        // A denied path inside a grant is covered by an empty mode-000 mount in the view:
        // the search into it is refused by file mode before Landlock is asked, a link or a
        // stat of what was there finds nothing, inotify cannot watch it, and renaming the
        // cover (a mount point in a read-only bind) is EROFS.
        "hardlink_secret_in" | "stat_denied_secret" | "inotify_watch_denied_dir"
            if ctx.view_root =>
        {
            Expect::Errno(EACCES)
        }
        "rename_denied_dir" if ctx.view_root => Expect::Errno(EROFS),
        // Each exec's fresh /proc, and the supervisor's bound into the view's root, are
        // read-only mounts: the write is refused before file modes or Landlock are asked.
        "write_proc_sys" if ctx.pid_namespace || ctx.view_root => Expect::Errno(EROFS),
        // Its handle is taken of a file outside the grants, which the view does not hold.
        "open_by_handle" if ctx.view_root => Expect::OutOfView,
        // Absent on some kernels (no CONFIG_MAGIC_SYSRQ, cgroup v2 only ...): ENOENT is all
        // such an attempt can get, and the results table marks it.
        "write_sysrq_trigger" => on_target("sysrq"),
        "write_dev_kmsg" => on_target("kmsg"),
        "read_raw_disk" => on_target("raw_disk"),
        "write_cgroup_release_agent" => on_target("release_agent"),
        "escape_to_root_cgroup" => on_target("root_cgroup_procs"),
        // The listener lives outside every grant, so not in the view's root at all.
        "connect_pathname_unix_outside" if ctx.view_root => Expect::Errno(ENOENT),
        "connect_pathname_unix_outside" if ctx.landlock_abi < 9 => {
            Expect::KnownGap(PATHNAME_SOCKET_GAP)
        }
        "socket_inet" | "socket_inet_udp" | "socket_inet6" | "socket_netlink_route"
            if ctx.network_all || ctx.private_net =>
        {
            Expect::Allowed
        }
        // Allowed through to the kernel, which has no socketpair for IP.
        "socketpair_inet" if ctx.network_all || ctx.private_net => Expect::Errno(EOPNOTSUPP),
        // A root supervisor and a child of another uid: the kernel's own uid check refuses
        // even the read.
        "control_prlimit_read_supervisor" if ctx.mode == Mode::Root && !ctx.pid_namespace => {
            Expect::Errno(EPERM)
        }
        "read_etc_shadow" if ctx.mode == Mode::RootTargetUid0 => {
            Expect::KnownGap(UID0_OWNS_ROOT_FILES)
        }
        "write_proc_self_exe" if ctx.mode == Mode::RootTargetUid0 => Expect::Errno(ETXTBSY),
        // setresuid(0, 0, 0) as uid 0 changes nothing; the helper's euid 0 is the child's own.
        "setuid_root" if ctx.mode == Mode::RootTargetUid0 => Expect::Allowed,
        "exec_setuid_helper" if ctx.mode == Mode::RootTargetUid0 => Expect::Allowed,
        // The exec's own PID namespace: the supervisor and the witness have no pid in it, so
        // /proc has no entry for them (ENOENT) and signals find no process (ESRCH). The probe's
        // parent is the exec's init, PID 1. (ptrace and process_vm_readv stay seccomp's EPERM:
        // the filter answers before the pid is looked up.)
        "control_supervisor_is_parent" if ctx.pid_namespace => Expect::OutOfView,
        "read_supervisor_environ"
        | "open_supervisor_mem"
        | "read_witness_environ"
        | "open_witness_mem"
        | "read_via_witness_root"
            if ctx.pid_namespace =>
        {
            Expect::Errno(ENOENT)
        }
        // Attempts that read their target first cannot even aim; prlimit64 with a new limit,
        // sched_setscheduler and sched_setparam stay seccomp's EPERM (answered at entry).
        "setpriority_witness"
        | "sched_setaffinity_witness"
        | "sched_setattr_witness"
        | "ioprio_set_witness"
            if ctx.pid_namespace =>
        {
            Expect::OutOfView
        }
        "control_prlimit_read_supervisor" | "control_prlimit_read_witness" if ctx.pid_namespace => {
            Expect::Errno(ESRCH)
        }
        "pidfd_getfd_supervisor"
        | "kill_witness"
        | "pidfd_send_signal_witness"
        | "sigio_to_witness"
        | "kill_supervisor"
            if ctx.pid_namespace =>
        {
            Expect::Errno(ESRCH)
        }
        // Abstract unix sockets belong to a network namespace: the outside one does not exist
        // in the view's, so nothing listens at that name.
        "connect_abstract_outside" | "sendto_abstract_dgram_outside" if ctx.private_net => {
            Expect::Errno(ECONNREFUSED)
        }
        // In the supervisor's user namespace only its own uid is mapped: uid 0 does not exist
        // there, so setresuid(0) is EINVAL before any privilege check.
        "setuid_root" if ctx.mode == Mode::NonRoot && ctx.user_namespace => Expect::Errno(EINVAL),
        // /tmp is the run's own tmpfs, writable by design.
        "write_tmp" if ctx.private_tmp => Expect::Allowed,
        _ => base,
    }
}

/// Compare one attempt with its expectation; `Err` says how it differs.
pub fn check(a: &Attempt, want: &Expect) -> Result<(), String> {
    let got = format!(
        "{} errno={:?} ({}) signal={:?}: {}",
        a.outcome,
        a.errno,
        a.errno_name.as_deref().unwrap_or("-"),
        a.signal,
        a.detail
    );
    let ok = match want {
        Expect::Allowed => a.outcome == "allowed",
        Expect::Errno(e) => a.outcome == "blocked" && a.errno == Some(*e) && a.signal.is_none(),
        Expect::Signal(s) => a.outcome == "blocked" && a.signal == Some(*s),
        Expect::Quiet => a.outcome == "blocked" && a.errno.is_none() && a.signal.is_none(),
        Expect::Pending => a.outcome == "pending",
        Expect::KnownGap(_) => a.outcome == "allowed",
        Expect::OutOfView => a.outcome == "error" && a.signal.is_none(),
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{}: expected {want:?}, got {got}", a.name))
    }
}
