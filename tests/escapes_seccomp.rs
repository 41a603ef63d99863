//! Escapes the seccomp filter stops, through the real binary: the hostile probe
//! (tests/support/probe) runs the attack inside `openshell-sandbox run`, and the test checks the exact errno, and from
//! outside that the target is unchanged.
//!
//! - prlimit64 on the supervisor when the child shares its uid (non-root supervisor,
//!   `--uid 0`);
//! - renice, pinning, SCHED_IDLE, idle I/O and prlimit aimed at another process of the
//!   same uid, and at every process of the uid at once (PRIO_USER, IOPRIO_WHO_USER);
//! - socketpair, and the families outside `--network all`'s allow-list;
//! - syscall(-1) is ENOSYS, not a kill;
//! - fanotify_init is EPERM.
//!
//! Each test has a uid of its own (642xx, unused elsewhere), so its attempts on "every process
//! of the uid" can only reach the test's own processes.

mod support;

use support::probe::expect::{self, Expect};
use support::probe::outside::{self, Witness};
use support::probe::{Mode, Outcome, Scene};

use libc::{ENOSYS, EOPNOTSUPP, EPERM, SIGSYS};

/// Run the named attempts and check that the supervisor itself came through. `before_cleanup`
/// runs while the processes of the scene's uid outside the sandbox (a witness) still live;
/// then every process of that uid is killed.
fn run_named(
    scene: &Scene,
    mode: Mode,
    flags: &[&str],
    names: &[&str],
    extra: &[String],
    before_cleanup: impl FnOnce(),
) -> Outcome {
    let mut args = vec![names.join(",")];
    args.extend(scene.params());
    args.extend_from_slice(extra);
    let out = support::probe::launch(scene, mode, flags, &args);
    before_cleanup();
    if scene.uid != 0 {
        outside::kill_uid(scene, scene.uid);
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

/// With the exec in its own PID namespace, the supervisor and the witness have no pid there:
/// an attempt that first reads its target cannot even aim (the probe reports an error, ESRCH),
/// and a read-only control on them is ESRCH. Attempts the filter answers at syscall entry
/// (prlimit64 with a new limit, sched_setscheduler, sched_setparam) stay seccomp's EPERM.
fn in_view(out: &Outcome, name: &str, e: &Expect) -> Expect {
    if out.layer("namespace-pid") != "enforced" {
        return e.clone();
    }
    match name {
        "setpriority_witness"
        | "sched_setaffinity_witness"
        | "sched_setattr_witness"
        | "ioprio_set_witness" => Expect::OutOfView,
        "control_prlimit_read_witness" | "control_prlimit_read_supervisor" => {
            Expect::Errno(libc::ESRCH)
        }
        _ => e.clone(),
    }
}

fn assert_all(out: &Outcome, want: &[(&str, Expect)]) {
    let failures: Vec<String> = want
        .iter()
        .filter_map(|(name, e)| expect::check(out.attempt(name), &in_view(out, name, e)).err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} attempt(s) not as expected:\n  {}\n\nprobe output:\n{}",
        failures.len(),
        failures.join("\n  "),
        out.stdout
    );
}

// ---- prlimit64 against the supervisor -----------------------------------------------------------

fn prlimit_on_the_supervisor(uid: u32, mode: Mode) {
    if !support::probe::require_root_and_cc() {
        return;
    }
    let scene = Scene::new(uid);
    let out = run_named(
        &scene,
        mode,
        &[],
        &[
            "prlimit_supervisor_nofile",
            "prlimit_supervisor_cpu",
            "control_prlimit_read_supervisor",
            "control_prlimit_set_self",
        ],
        &[],
        || (),
    );
    assert_all(
        &out,
        &[
            ("prlimit_supervisor_nofile", Expect::Errno(EPERM)),
            ("prlimit_supervisor_cpu", Expect::Errno(EPERM)),
            // A read (new limit NULL) may name any pid: `prlimit -p` and ps-like tools work.
            ("control_prlimit_read_supervisor", Expect::Allowed),
            // setrlimit(3) is prlimit64(0, ...): the child's own limits stay its own to lower.
            ("control_prlimit_set_self", Expect::Allowed),
        ],
    );
    assert_eq!(out.layer("seccomp"), "enforced");
}

/// A non-root supervisor: the child has the supervisor's uid, so only the filter keeps it from
/// setting the supervisor's RLIMIT_NOFILE (the kill sweep could no longer open /proc) or
/// RLIMIT_CPU (the supervisor would be killed).
#[test]
fn nonroot_child_cannot_set_the_supervisors_rlimits() {
    prlimit_on_the_supervisor(64260, Mode::NonRoot);
}

/// `--uid 0`: root without capabilities matches the root supervisor's uid.
#[test]
fn uid0_child_cannot_set_the_supervisors_rlimits() {
    prlimit_on_the_supervisor(0, Mode::RootTargetUid0);
}

// ---- other processes of the same uid ------------------------------------------------------------

/// What the test can read about a process from outside.
#[derive(Debug, PartialEq, Eq)]
struct Sched {
    nice: i32,
    policy: i32,
    cpus: Vec<usize>,
    ioprio: i64,
    nofile: String,
}

fn sched_of(pid: i32) -> Sched {
    // SAFETY: plain syscalls with integer arguments and a stack buffer of the size passed.
    unsafe {
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, pid as libc::id_t);
        assert_eq!(*libc::__errno_location(), 0, "getpriority({pid})");
        let policy = libc::sched_getscheduler(pid);
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
            0
        );
        let cpus = (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect();
        let ioprio = libc::syscall(libc::SYS_ioprio_get, 1, pid);
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
        let nofile = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .unwrap_or_default()
            .to_string();
        Sched {
            nice,
            policy,
            cpus,
            ioprio,
            nofile,
        }
    }
}

/// Another process of the run's uid, outside the sandbox (the witness stands in for a second
/// concurrent run): renicing it to 19, pinning it to CPU 0, SCHED_IDLE through each of the three
/// calls, idle I/O, and RLIMIT_NOFILE 4 are all EPERM, also when aimed at every process of the
/// uid (PRIO_USER, IOPRIO_WHO_USER) or the process group; the witness is unchanged afterwards;
/// the same calls on the caller itself (pid or who 0) work.
#[test]
fn another_process_of_the_same_uid_cannot_be_reniced_pinned_or_limited() {
    if !support::probe::require_root_and_cc() {
        return;
    }
    let uid = 64261;
    let scene = Scene::new(uid);
    let witness = Witness::start(&scene, uid);
    let before = sched_of(witness.pid);
    let attacks = [
        "setpriority_witness",
        "sched_setaffinity_witness",
        "sched_setscheduler_witness",
        "sched_setparam_witness",
        "sched_setattr_witness",
        "ioprio_set_witness",
        "prlimit_witness_nofile",
        "setpriority_prio_user",
        "setpriority_prio_pgrp",
        "ioprio_set_who_user",
        "ioprio_set_who_pgrp",
    ];
    let controls = [
        "control_prlimit_read_witness",
        "control_prlimit_set_self",
        "control_setpriority_self",
        "control_sched_setaffinity_self",
        "control_sched_setscheduler_self",
        "control_sched_setparam_self",
        "control_sched_setattr_self",
        "control_ioprio_set_self",
    ];
    let names: Vec<&str> = attacks.iter().chain(&controls).copied().collect();
    let extra = [format!("witness={}", witness.pid), "harm=1".to_string()];
    let mut after = None;
    let out = run_named(&scene, Mode::Root, &[], &names, &extra, || {
        after = Some(sched_of(witness.pid));
        witness.finish();
    });
    let after = after.unwrap();
    let mut want: Vec<(&str, Expect)> =
        attacks.iter().map(|&n| (n, Expect::Errno(EPERM))).collect();
    want.extend(controls.iter().map(|&n| (n, Expect::Allowed)));
    assert_all(&out, &want);
    assert_eq!(
        before, after,
        "the witness, another process of the run's uid, was changed from inside the sandbox"
    );
}

// ---- socket families ----------------------------------------------------------------------------

const FOREIGN_FAMILIES: &[&str] = &[
    "socket_alg",
    "socket_tipc",
    "socket_rds",
    "socket_xdp",
    "socket_kcm",
    "socket_can",
    "socket_bluetooth",
    "socket_packet",
    "socket_vsock",
    "socket_netlink_audit",
    "socketpair_alg",
    "socketpair_netlink_audit",
];

fn socket_families(uid: u32, network_all: bool) {
    if !support::probe::require_root_and_cc() {
        return;
    }
    let scene = Scene::new(uid);
    let mut names: Vec<&str> = FOREIGN_FAMILIES.to_vec();
    names.extend([
        "control_socket_unix",
        "control_socketpair_unix",
        "socketpair_inet",
        "socket_inet",
        "socket_inet6",
        "socket_netlink_route",
    ]);
    let flags: &[&str] = if network_all {
        &["--network", "all"]
    } else {
        &[]
    };
    let out = run_named(&scene, Mode::Root, flags, &names, &[], || ());
    // --network none in the view's own network namespace (only lo) gets the IP families too:
    // nothing can leave that namespace (see SECURITY.md, Namespaces).
    let network_all = network_all || out.layer("namespace-net") == "enforced";
    let mut want: Vec<(&str, Expect)> = FOREIGN_FAMILIES
        .iter()
        .map(|&n| (n, Expect::Errno(EPERM)))
        .collect();
    let open = |yes| {
        if yes {
            Expect::Allowed
        } else {
            Expect::Errno(EPERM)
        }
    };
    want.extend([
        ("control_socket_unix", Expect::Allowed),
        ("control_socketpair_unix", Expect::Allowed),
        ("socket_inet", open(network_all)),
        ("socket_inet6", open(network_all)),
        ("socket_netlink_route", open(network_all)),
        // The filter lets it through with --network all; the kernel has no IP socketpair.
        (
            "socketpair_inet",
            if network_all {
                Expect::Errno(EOPNOTSUPP)
            } else {
                Expect::Errno(EPERM)
            },
        ),
    ]);
    assert_all(&out, &want);
}

/// `--network none`: socketpair is filtered like socket (AF_INET was EOPNOTSUPP from the
/// kernel, AF_ALG's socket code ran).
#[test]
fn network_none_refuses_socketpair_and_every_family_but_unix() {
    socket_families(64262, false);
}

/// `--network all` is an allow-list: AF_UNIX, AF_INET, AF_INET6 and route netlink; AF_ALG,
/// TIPC, RDS, XDP, KCM, CAN, Bluetooth, packet, vsock and other netlink get EPERM, through
/// socket and socketpair alike.
#[test]
fn network_all_allows_only_unix_ip_and_route_netlink() {
    socket_families(64263, true);
}

// ---- syscall(-1) and fanotify_init -------------------------------------------------------------

/// syscall(-1) is nr 0xffffffff to seccomp, which has bit 30 set: the filter killed it as x32.
/// A bare kernel answers ENOSYS, and so must the sandbox, with the process alive to report it
/// (an x32 number is still killed).
#[test]
fn syscall_minus_one_is_enosys_and_the_caller_survives() {
    if !support::probe::require_root_and_cc() {
        return;
    }
    let scene = Scene::new(64264);
    let out = run_named(
        &scene,
        Mode::Root,
        &[],
        &["syscall_minus_one", "x32_syscall", "int80_syscall"],
        &[],
        || (),
    );
    assert_all(
        &out,
        &[
            ("syscall_minus_one", Expect::Errno(ENOSYS)),
            ("x32_syscall", Expect::Signal(SIGSYS)),
            ("int80_syscall", Expect::Signal(SIGSYS)),
        ],
    );
}

/// fanotify_init is EPERM: Landlock does not restrict fanotify marks, so an unprivileged
/// fanotify group (Linux >= 5.13) could watch a denied directory, and each group counts
/// against a per-uid budget that concurrent runs share.
#[test]
fn fanotify_init_is_refused() {
    if !support::probe::require_root_and_cc() {
        return;
    }
    let scene = Scene::new(64265);
    let out = run_named(
        &scene,
        Mode::Root,
        &[],
        &["fanotify_watch_denied_dir"],
        &[],
        || (),
    );
    let a = out.attempt("fanotify_watch_denied_dir");
    assert_eq!(expect::check(a, &Expect::Errno(EPERM)), Ok(()));
    assert_eq!(
        a.detail, "fanotify_init",
        "refused at fanotify_init, not later"
    );
}
