//! The fail-closed matrix of [`prepare_with`], against a fake kernel: which layer is
//! refused, which is degraded with what reason, without root or any particular kernel.

use super::prepare_with;
use crate::policy::{FsPolicy, Identity, Limits, NOBODY, NetworkMode, Policy};
use crate::sandbox::cgroup;
use crate::sandbox::kernel::Kernel;
use crate::sandbox::landlock::Support;
use crate::sandbox::layer::{Enforcement, PrepareError};
use crate::sandbox::namespaces::{
    Kind, Outcome, ProcMount, UserNs, View, ViewError, ViewMade, ViewPlan,
};
use crate::sandbox::rlimits::{CoreDumps, CorePattern};
use crate::sandbox::step::{ChildError, Step};

struct Fake {
    euid: u32,
    landlock_abi: i32,
    seccomp: bool,
    user_ns: UserNs,
    /// Per kind, in `Kind::ALL` order.
    view: [Outcome; 6],
    proc: ProcMount,
    core: CoreDumps,
    /// Why the IPC limits could not be set, if they could not.
    ipc_limits: Option<ChildError>,
    /// A fake cgroup v2 tree (pids, memory) standing in for /sys/fs/cgroup; `None`: no
    /// writable cgroup.
    cgroups: Option<tempfile::TempDir>,
    remount_note: Option<String>,
    groups: Vec<(libc::gid_t, Option<String>)>,
}

/// A cgroup v2 tree offering pids and memory in the supervisor's group `/pod` (v2 accounts
/// CPU time in every group). Without cpu: on plain files, enabling it would overwrite what
/// enabled memory.
fn cgroup_tree() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("pod")).unwrap();
    for f in ["cgroup.controllers", "pod/cgroup.controllers"] {
        std::fs::write(t.path().join(f), "memory pids").unwrap();
    }
    t
}

impl Fake {
    fn system(&self) -> Option<cgroup::System> {
        self.cgroups.as_ref().map(|t| cgroup::System {
            mount: t.path().to_path_buf(),
            self_cgroup: "0::/pod\n".into(),
        })
    }
}

impl Default for Fake {
    fn default() -> Self {
        Fake {
            euid: 0,
            landlock_abi: 6,
            seccomp: true,
            user_ns: UserNs::Root,
            view: [
                Outcome::NotRequested,
                Outcome::Made,
                Outcome::Made,
                Outcome::Made,
                Outcome::Made,
                Outcome::Made,
            ],
            proc: ProcMount::Full,
            core: CoreDumps {
                hard_limit: u64::MAX,
                can_raise: true,
                pattern: CorePattern::Pipe,
                contents_filtered: true,
            },
            ipc_limits: None,
            cgroups: None,
            remount_note: None,
            groups: Vec::new(),
        }
    }
}

impl Kernel for Fake {
    fn euid(&self) -> u32 {
        self.euid
    }
    fn landlock(&self) -> Result<Support, String> {
        let abi = self.landlock_abi;
        if abi == 0 {
            return Err("landlock_create_ruleset: ENOSYS".into());
        }
        Ok(Support {
            abi,
            filesystem: abi >= 1,
            network: abi >= 4,
            scopes: abi >= 6,
        })
    }
    fn seccomp_available(&self) -> bool {
        self.seccomp
    }
    fn cgroups(&self, want: cgroup::Want) -> Option<cgroup::Root> {
        cgroup::detect_in(&self.system()?, want)
    }
    fn cgroup_offer(&self) -> Option<cgroup::Offer> {
        cgroup::probe(&self.system()?)
    }
    fn remount_note(&self) -> Option<String> {
        self.remount_note.clone()
    }
    fn supplementary_groups(&self) -> Vec<(libc::gid_t, Option<String>)> {
        self.groups.clone()
    }
    fn getpid(&self) -> libc::pid_t {
        4242
    }
    fn user_ns(&self) -> UserNs {
        self.user_ns
    }
    fn core_dumps(&self) -> CoreDumps {
        self.core
    }
    fn idmap_userns(
        &self,
        _swap: &crate::sandbox::idmap::IdSwap,
    ) -> std::io::Result<crate::sandbox::idmap::UserNs> {
        Err(std::io::Error::from_raw_os_error(libc::ENOSYS))
    }
    fn make_view(&self, _plan: &ViewPlan) -> Result<ViewMade, ViewError> {
        let pid = self.view[Kind::Pid as usize];
        Ok(ViewMade {
            outcomes: self.view,
            view: View {
                pid: matches!(pid, Outcome::Made)
                    || matches!(pid, Outcome::Failed(e) if e.step == Step::MountProc),
                proc: self.proc,
                ..View::default()
            },
            ipc_limits: self.ipc_limits,
        })
    }
}

fn policy(allow_degraded: bool, network: NetworkMode, root: bool) -> (Policy, tempfile::TempDir) {
    let wd = tempfile::tempdir().unwrap();
    let p = Policy {
        fs: FsPolicy::with_defaults(wd.path().to_path_buf()),
        network,
        limits: Limits::default(),
        identity: root.then_some(Identity {
            uid: NOBODY,
            gid: NOBODY,
        }),
        allow_degraded,
        namespaces: Default::default(),
    };
    (p, wd)
}

fn status(p: &super::Prepared, layer: &str) -> (Enforcement, String) {
    let l = p
        .layers
        .iter()
        .find(|l| l.layer == layer)
        .unwrap_or_else(|| panic!("no row {layer}: {:?}", p.layers));
    (l.status, l.detail.clone())
}

fn refused(k: &Fake, network: NetworkMode, root: bool) -> (&'static str, String) {
    let (pol, _wd) = policy(false, network, root);
    match prepare_with(k, &pol) {
        Err(PrepareError::NotEnforceable { layer, reason }) => (layer, reason),
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(p) => panic!("not refused: {:?}", p.layers),
    }
}

#[test]
fn everything_available_as_root_is_enforced_with_one_row_per_namespace() {
    let k = Fake::default();
    let (pol, _wd) = policy(false, NetworkMode::None, true);
    let p = prepare_with(&k, &pol).unwrap();
    for kind in [Kind::Pid, Kind::Mount, Kind::Ipc, Kind::Uts, Kind::Net] {
        assert_eq!(
            status(&p, kind.layer()).0,
            Enforcement::Enforced,
            "{kind:?}"
        );
    }
    assert_eq!(status(&p, "namespace-user").0, Enforcement::NotRequested);
    assert_eq!(status(&p, "namespace-uts").1, "hostname sandbox");
    assert!(p.view.pid);
}

#[test]
fn network_all_does_not_ask_for_a_network_namespace() {
    let mut k = Fake::default();
    k.view[Kind::Net as usize] = Outcome::NotRequested;
    let (pol, _wd) = policy(false, NetworkMode::All, true);
    let p = prepare_with(&k, &pol).unwrap();
    assert_eq!(status(&p, "namespace-net").0, Enforcement::NotRequested);
}

#[test]
fn a_mount_refused_by_apparmor_is_refused_then_degraded_with_its_reason() {
    let mut k = Fake::default();
    let e = ChildError::new(Step::MountTmpfs, libc::EACCES);
    k.view[Kind::Mount as usize] = Outcome::Failed(e);
    let (layer, reason) = refused(&k, NetworkMode::None, true);
    assert_eq!(layer, "namespace-mount");
    // The fake view has no root of its own: the reason names the gap that leaves open.
    assert_eq!(
        reason,
        "mount a private tmpfs: Permission denied (os error 13): no root of the granted paths only, so paths outside the grants stay visible (pathname unix sockets can be connected to, stat and inotify probe them)"
    );
    let (pol, _wd) = policy(true, NetworkMode::None, true);
    let p = prepare_with(&k, &pol).unwrap();
    assert_eq!(status(&p, "namespace-mount").0, Enforcement::Degraded);
    // The other kinds are unaffected.
    assert_eq!(status(&p, "namespace-ipc").0, Enforcement::Enforced);
}

/// The IPC namespace is made, but its limits could not be written (a read-only /proc/sys):
/// what an exec leaves there is unbounded, so the layer is refused, then degraded with the
/// file and errno; made and limited, its detail names the limits.
#[test]
fn ipc_limits_that_cannot_be_set_degrade_the_ipc_namespace() {
    let mut k = Fake::default();
    let (pol, _wd) = policy(false, NetworkMode::None, true);
    let p = prepare_with(&k, &pol).unwrap();
    let (st, detail) = status(&p, "namespace-ipc");
    assert_eq!(st, Enforcement::Enforced);
    assert!(
        detail.contains("SysV limits from --shm-size 64 MiB: shared memory 64 MiB in all"),
        "{detail}"
    );
    k.ipc_limits = Some(ChildError {
        detail: 1,
        ..ChildError::new(Step::SetIpcLimit, libc::EROFS)
    });
    let (layer, reason) = refused(&k, NetworkMode::None, true);
    assert_eq!(layer, "namespace-ipc");
    assert!(
        reason.contains("its limits could not be set (write /proc/sys/kernel/shmall: Read-only file system (os error 30))"),
        "{reason}"
    );
    let (pol, _wd) = policy(true, NetworkMode::None, true);
    let p = prepare_with(&k, &pol).unwrap();
    assert_eq!(status(&p, "namespace-ipc").0, Enforcement::Degraded);
}

#[test]
fn proc_that_cannot_be_mounted_degrades_the_pid_namespace_but_keeps_it() {
    let mut k = Fake::default();
    k.view[Kind::Pid as usize] = Outcome::Failed(ChildError::new(Step::MountProc, libc::EPERM));
    k.proc = ProcMount::None;
    assert_eq!(refused(&k, NetworkMode::None, true).0, "namespace-pid");
    let (pol, _wd) = policy(true, NetworkMode::None, true);
    let p = prepare_with(&k, &pol).unwrap();
    assert_eq!(status(&p, "namespace-pid").0, Enforcement::Degraded);
    assert!(
        p.view.pid,
        "the PID namespace itself still contains the tree"
    );
}

#[test]
fn non_root_without_a_user_namespace_refuses_and_names_the_layer() {
    let k = Fake {
        euid: 1000,
        user_ns: UserNs::Unavailable(ChildError::new(Step::UnshareUser, libc::EPERM)),
        ..Fake::default()
    };
    let (layer, reason) = refused(&k, NetworkMode::None, false);
    assert_eq!(layer, "namespace-user");
    assert!(
        reason.contains("unshare the user namespace: Operation not permitted"),
        "{reason}"
    );
    let (pol, _wd) = policy(true, NetworkMode::None, false);
    let p = prepare_with(&k, &pol).unwrap();
    for kind in Kind::ALL {
        assert_eq!(
            status(&p, kind.layer()).0,
            Enforcement::Degraded,
            "{kind:?}"
        );
    }
    assert!(!p.view.pid && p.view.mnt.is_none());
}

#[test]
fn non_root_in_its_own_user_namespace_is_enforced_with_subset_pid() {
    let k = Fake {
        euid: 1000,
        user_ns: UserNs::Entered,
        proc: ProcMount::SubsetPid,
        ..Fake::default()
    };
    let (pol, _wd) = policy(false, NetworkMode::None, false);
    let p = prepare_with(&k, &pol).unwrap();
    assert_eq!(status(&p, "namespace-user").0, Enforcement::Enforced);
    assert!(status(&p, "namespace-pid").1.contains("subset=pid"));
}

#[test]
fn the_other_layers_still_fail_closed() {
    // No seccomp.
    let k = Fake {
        seccomp: false,
        ..Fake::default()
    };
    assert_eq!(refused(&k, NetworkMode::None, true).0, "seccomp");
    // Landlock too old for TCP rules under --network none, but fine with --network all.
    let k = Fake {
        landlock_abi: 3,
        ..Fake::default()
    };
    assert_eq!(refused(&k, NetworkMode::None, true).0, "landlock-net");
    // No Landlock at all.
    let k = Fake {
        landlock_abi: 0,
        ..Fake::default()
    };
    assert_eq!(refused(&k, NetworkMode::None, true).0, "landlock-fs");
    // Root with target uid 0 and no pids cgroup (the fake has none): RLIMIT_NPROC would not
    // hold.
    let k = Fake::default();
    let (mut pol, _wd) = policy(false, NetworkMode::None, true);
    pol.identity = Some(Identity { uid: 0, gid: 0 });
    match prepare_with(&k, &pol) {
        Err(PrepareError::NotEnforceable { layer, .. }) => assert_eq!(layer, "cgroup"),
        other => panic!("{:?}", other.map(|p| p.layers)),
    }
}

/// RLIMIT_CORE 1 stops a pipe helper and a core file; a socket takes the dump whatever the
/// limit, so there only coredump_filter 0 keeps the memory out. A supervisor whose hard limit
/// is 0 and that cannot raise it leaves the pipe helper running: degraded, refused without
/// --allow-degraded.
#[test]
fn core_dumps_that_could_reach_a_host_helper_are_degraded() {
    let core = |hard_limit, can_raise, pattern, contents_filtered| Fake {
        core: CoreDumps {
            hard_limit,
            can_raise,
            pattern,
            contents_filtered,
        },
        ..Fake::default()
    };
    for (k, why) in [
        (
            core(0, false, CorePattern::Pipe, true),
            "hard RLIMIT_CORE is 0",
        ),
        (core(0, false, CorePattern::Pipe, false), "memory and all"),
        (
            core(u64::MAX, true, CorePattern::Socket, false),
            "coredump_filter",
        ),
    ] {
        let (layer, reason) = refused(&k, NetworkMode::None, true);
        assert_eq!(layer, "rlimits");
        assert!(reason.contains(why), "{reason}");
        let (pol, _wd) = policy(true, NetworkMode::None, true);
        let p = prepare_with(&k, &pol).unwrap();
        assert_eq!(status(&p, "rlimits").0, Enforcement::Degraded);
    }
    for k in [
        core(0, true, CorePattern::Pipe, true),
        core(1, false, CorePattern::Pipe, false),
        core(0, false, CorePattern::File, false),
        core(0, false, CorePattern::Socket, true),
    ] {
        let (pol, _wd) = policy(false, NetworkMode::None, true);
        let p = prepare_with(&k, &pol).unwrap();
        let (st, detail) = status(&p, "rlimits");
        assert_eq!(st, Enforcement::Enforced, "{:?}: {detail}", k.core);
        assert!(detail.contains("core=1"), "{detail}");
    }
}

#[test]
fn core_pattern_kinds() {
    assert_eq!(CorePattern::of("core"), CorePattern::File);
    assert_eq!(CorePattern::of("/var/crash/%e.%p"), CorePattern::File);
    assert_eq!(
        CorePattern::of("|/usr/lib/systemd/systemd-coredump %P"),
        CorePattern::Pipe
    );
    assert_eq!(
        CorePattern::of("@/run/coredump.socket"),
        CorePattern::Socket
    );
    assert_eq!(
        CorePattern::of("@@/run/coredump.socket"),
        CorePattern::Socket
    );
}

/// The report JSON, `check` and the log spell a layer's state the same way.
#[test]
fn layer_states_have_one_spelling() {
    for e in [
        Enforcement::Enforced,
        Enforcement::Degraded,
        Enforcement::NotRequested,
    ] {
        assert_eq!(serde_json::to_value(e).unwrap(), e.as_str());
    }
    assert_eq!(Enforcement::NotRequested.as_str(), "not_requested");
}

fn limits_policy(allow_degraded: bool, limits: Limits) -> (Policy, tempfile::TempDir) {
    let (mut p, wd) = policy(allow_degraded, NetworkMode::None, true);
    p.limits = limits;
    (p, wd)
}

fn every_limit() -> Limits {
    Limits {
        cpu_secs: Some(5),
        cpu_quota_millis: Some(500),
        memory_bytes: Some(64 << 20),
        pids_requested: true,
        ..Limits::default()
    }
}

/// With a cgroup system offering pids and memory, --pids, --memory and --cpu are in force,
/// through the group `prepare` made; --cpus, without the cpu controller, is refused.
#[test]
fn with_cgroups_the_cgroup_memory_and_cpu_layers_are_enforced() {
    let k = Fake {
        cgroups: Some(cgroup_tree()),
        remount_note: Some("a note from start-up".into()),
        ..Fake::default()
    };
    let (pol, _wd) = limits_policy(
        false,
        Limits {
            cpu_quota_millis: None,
            ..every_limit()
        },
    );
    let p = prepare_with(&k, &pol).unwrap();
    assert!(p.cgroups.is_some());
    for layer in ["cgroup", "memory", "cpu"] {
        assert_eq!(status(&p, layer).0, Enforcement::Enforced, "{layer}");
    }
    assert!(status(&p, "cgroup").1.ends_with("(a note from start-up)"));
    assert_eq!(p.supervisor_pid, 4242);
    let (pol, _wd) = limits_policy(false, every_limit());
    match prepare_with(&k, &pol) {
        Err(PrepareError::NotEnforceable { layer, .. }) => assert_eq!(layer, "cpu"),
        other => panic!("{other:?}"),
    }
}

/// Without one, each limit asked for is refused, the cgroup layer first; degraded, each says
/// what it is instead.
#[test]
fn without_cgroups_each_asked_limit_is_refused_then_degraded() {
    let k = Fake::default();
    let (pol, _wd) = limits_policy(false, every_limit());
    match prepare_with(&k, &pol) {
        Err(PrepareError::NotEnforceable { layer, .. }) => assert_eq!(layer, "cgroup"),
        other => panic!("{other:?}"),
    }
    let (pol, _wd) = limits_policy(
        false,
        Limits {
            pids_requested: false,
            ..every_limit()
        },
    );
    match prepare_with(&k, &pol) {
        Err(PrepareError::NotEnforceable { layer, .. }) => assert_eq!(layer, "memory"),
        other => panic!("{other:?}"),
    }
    let (pol, _wd) = limits_policy(true, every_limit());
    let p = prepare_with(&k, &pol).unwrap();
    assert!(p.cgroups.is_none());
    for layer in ["cgroup", "memory", "cpu"] {
        assert_eq!(status(&p, layer).0, Enforcement::Degraded, "{layer}");
    }
    // No limit asked: nothing to refuse.
    let (pol, _wd) = limits_policy(false, Limits::default());
    let p = prepare_with(&k, &pol).unwrap();
    assert_eq!(status(&p, "cgroup").0, Enforcement::NotRequested);
}

/// Not root: the supplementary groups we hold reach the child, so identity is not enforced.
#[test]
fn supplementary_groups_a_non_root_supervisor_cannot_drop_degrade_identity() {
    let k = Fake {
        euid: 1000,
        user_ns: UserNs::Entered,
        groups: vec![(998, Some("docker".into()))],
        ..Fake::default()
    };
    let (pol, _wd) = policy(false, NetworkMode::None, false);
    match prepare_with(&k, &pol) {
        Err(PrepareError::NotEnforceable { layer, reason }) => {
            assert_eq!(layer, "identity");
            assert!(reason.contains("docker"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let k = Fake {
        groups: Vec::new(),
        ..k
    };
    let p = prepare_with(&k, &pol).unwrap();
    assert_eq!(status(&p, "identity").0, Enforcement::Enforced);
}
