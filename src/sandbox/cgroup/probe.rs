//! What the cgroup system offers, found without creating anything (for `check`).

use std::path::Path;

use super::system::{System, v2_controllers, writable};

/// What [`probe`] found, without creating anything.
#[derive(Debug, Clone)]
pub struct Offer {
    pub describe: String,
    pub memory: bool,
    pub no_memory: Option<String>,
    pub cpu: CpuSupport,
}

/// What the exec's groups can do with CPU time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuSupport {
    /// Whole-tree CPU time can be read (v1 cpuacct.usage, v2 cpu.stat usage_usec).
    pub accounting: bool,
    /// A CFS bandwidth quota can be set (v1 cpu.cfs_quota_us, v2 cpu.max).
    pub quota: bool,
}

/// What [`detect`] would find, with no side effect at all: no group made, no process moved, no
/// stale group swept. For `check`.
pub fn probe(sys: &System) -> Option<Offer> {
    if sys.is_v2() {
        let cur = sys.hierarchy("").join(sys.own_path("")?);
        let ctrls = v2_controllers(&cur)?;
        if ctrls.iter().any(|c| c == "pids") && writable(&cur) {
            let memory = ctrls.iter().any(|c| c == "memory");
            return Some(Offer {
                describe: format!(
                    "cgroup v2 below {}",
                    crate::sandbox::cgroup_remount::shown(&cur)
                ),
                memory,
                no_memory: (!memory).then(|| no_memory_v2(&cur)),
                // cpu.stat's usage_usec is there in every v2 group; cpu.max needs the cpu
                // controller.
                cpu: CpuSupport {
                    accounting: true,
                    quota: ctrls.iter().any(|c| c == "cpu"),
                },
            });
        }
    }
    let pids = sys.v1_parent("pids").filter(|p| writable(p))?;
    let memory = sys.v1_parent("memory").filter(|p| writable(p));
    let cpu = CpuSupport {
        accounting: sys
            .v1_parent("cpuacct")
            .is_some_and(|p| writable(&p) && p.join("cpuacct.usage").exists()),
        quota: sys
            .v1_parent("cpu")
            .is_some_and(|p| writable(&p) && p.join("cpu.cfs_quota_us").exists()),
    };
    Some(Offer {
        describe: format!(
            "cgroup v1 pids below {}",
            crate::sandbox::cgroup_remount::shown(&pids)
        ),
        memory: memory.is_some(),
        no_memory: memory.is_none().then(no_memory_v1),
        cpu,
    })
}

pub(super) fn no_memory_v2(cur: &Path) -> String {
    format!(
        "the memory controller is not available in {}",
        cur.display()
    )
}

pub(super) fn no_memory_v1() -> String {
    "no writable cgroup v1 memory hierarchy".into()
}
