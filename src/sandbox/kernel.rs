//! Everything [`super::prepare`] asks the kernel before deciding which layers it can enforce,
//! behind one trait, so the fail-closed matrix is unit-tested with a fake kernel (no root, no
//! particular kernel). The real-binary tests stay for what only the kernel can show.

use super::cgroup;
use super::idmap::IdSwap;
use super::landlock::{self, Support};
use super::namespaces::{self, UserNs, ViewError, ViewMade, ViewPlan};
use super::rlimits::{self, CoreDumps};

pub trait Kernel {
    /// The supervisor's effective uid (in its own user namespace).
    fn euid(&self) -> u32;
    /// Landlock's ABI, or why it is unavailable.
    fn landlock(&self) -> Result<Support, String>;
    fn seccomp_available(&self) -> bool;
    /// Where per-exec cgroups can be created (only asked when root).
    fn cgroups(&self, want: cgroup::Want) -> Option<cgroup::Root>;
    /// The supervisor's own user namespace (see `namespaces::enter_user_ns`).
    fn user_ns(&self) -> UserNs;
    /// Build the view, or say per kind why not.
    fn make_view(&self, plan: &ViewPlan) -> Result<ViewMade, ViewError>;
    /// Make every later child dump no memory ([`rlimits::limit_core_contents`]), and say how
    /// the host handles core dumps.
    fn core_dumps(&self) -> CoreDumps;
    /// A user namespace carrying `swap`, for an idmapped bind (see idmap.rs).
    fn idmap_userns(&self, swap: &IdSwap) -> std::io::Result<super::idmap::UserNs>;
    /// What the cgroup system would offer, with no side effect (for `check`).
    fn cgroup_offer(&self) -> Option<cgroup::Offer>;
    /// What start-up did about read-only cgroup mounts (`cgroup_remount::note`).
    fn remount_note(&self) -> Option<String>;
    /// The supplementary groups a child of ours would keep if we cannot drop them
    /// (`identity::supplementary_groups`).
    fn supplementary_groups(&self) -> Vec<(libc::gid_t, Option<String>)>;
    /// The supervisor's pid.
    fn getpid(&self) -> libc::pid_t;
}

/// The running kernel.
pub struct Real;

impl Kernel for Real {
    fn euid(&self) -> u32 {
        crate::sys::process::euid()
    }

    fn landlock(&self) -> Result<Support, String> {
        landlock::probe().map_err(|e| e.to_string())
    }

    fn seccomp_available(&self) -> bool {
        super::seccomp::available()
    }

    fn cgroups(&self, want: cgroup::Want) -> Option<cgroup::Root> {
        // Test builds only: `OSB_TEST_DENY_CGROUP=1` makes per-exec cgroups unavailable, as a
        // pod with a read-only /sys/fs/cgroup does, so a test can reach the cgroup-less tree
        // kill on a machine that has cgroups.
        #[cfg(feature = "test-pause-points")]
        if std::env::var_os("OSB_TEST_DENY_CGROUP").is_some_and(|v| v == "1") {
            return None;
        }
        cgroup::detect_in(&cgroup::System::real()?, want)
    }

    fn user_ns(&self) -> UserNs {
        namespaces::user_ns()
    }

    fn core_dumps(&self) -> CoreDumps {
        let filtered = rlimits::limit_core_contents().is_ok();
        // CAP_SYS_RESOURCE counts only in the initial user namespace: root there, with the
        // identity map over every uid.
        let map = std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
        let initial = map.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"];
        rlimits::core_dumps(self.euid() == 0 && initial, filtered)
    }

    fn make_view(&self, plan: &ViewPlan) -> Result<ViewMade, ViewError> {
        #[allow(unused_mut)]
        let mut probe = namespaces::make_view(plan)?;
        // (`OSB_TEST_DENY_PIDNS=1` is read by `namespaces::make_view` itself: the view's
        // root depends on it.)
        // Test builds only: `OSB_TEST_DENY_NETNS=1` makes the network namespace unavailable
        // (degraded: `--network none` then rests on seccomp and Landlock alone), so a test can
        // reach the forwards' behaviour without a namespace of the sandbox's own.
        #[cfg(feature = "test-pause-points")]
        if std::env::var_os("OSB_TEST_DENY_NETNS").is_some_and(|v| v == "1") {
            use super::namespaces::{Kind, Outcome};
            probe.view.net = None;
            probe.outcomes[Kind::Net.index()] =
                Outcome::Failed(super::ChildError::new(super::Step::UnshareNet, libc::EPERM));
        }
        Ok(probe)
    }

    fn idmap_userns(&self, swap: &IdSwap) -> std::io::Result<super::idmap::UserNs> {
        super::idmap::userns(swap)
    }

    fn cgroup_offer(&self) -> Option<cgroup::Offer> {
        cgroup::System::real().and_then(|s| cgroup::probe(&s))
    }

    fn remount_note(&self) -> Option<String> {
        super::cgroup_remount::note()
    }

    fn supplementary_groups(&self) -> Vec<(libc::gid_t, Option<String>)> {
        super::identity::supplementary_groups()
    }

    fn getpid(&self) -> libc::pid_t {
        crate::sys::process::pid()
    }
}
