//! The decisions a policy comes to on this kernel, as plain data: which socket rules the
//! seccomp filter and Landlock get for each network mode, which limits layer is enforced or
//! degraded, which rlimits are set, and the rules as installed in words. `prepare` computes
//! them once; `run` installs them, `check` reports their rows and `check --explain` prints
//! [`Installed`]: nobody derives them again.
//!
//! Everything here is a pure function of the policy and what the kernel was found to offer
//! (the probe), so the fail-closed matrix is tested without root (decide_tests.rs).

use std::path::PathBuf;

use serde::Serialize;

use super::layer::{Enforcement, LayerStatus, PrepareError};
use super::{cgroup, rlimits, seccomp};
use crate::policy::{Limits, NetworkMode, PathAccess};

/// The network rules of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    /// The socket families seccomp allows and whether Landlock restricts TCP, spelt as the
    /// network mode whose rules they are.
    pub socket_rules: NetworkMode,
    /// `--network none` kept by a private network namespace that holds only `lo`.
    pub loopback_only: bool,
}

/// With `--network none` and a private network namespace (only `lo`), nothing can leave the
/// namespace: IP sockets, loopback bind and connect are allowed (so an exec can run a server,
/// and the next exec of the sandbox reach it), any other connect is ENETUNREACH. The socket
/// rules are then those of `--network all` (AF_UNIX, AF_INET, AF_INET6 and route netlink,
/// which sees only the private namespace). Without that namespace, `--network none` keeps its
/// AF_UNIX-only filter and Landlock's TCP denial.
pub fn network(mode: NetworkMode, private_net: bool) -> Network {
    let loopback_only = mode == NetworkMode::None && private_net;
    Network {
        socket_rules: if loopback_only {
            NetworkMode::All
        } else {
            mode
        },
        loopback_only,
    }
}

/// A row for a layer that is weaker than asked: an error unless degraded runs are allowed.
pub(super) fn degrade(
    allow_degraded: bool,
    layer: &'static str,
    reason: String,
    layers: &mut Vec<LayerStatus>,
) -> Result<(), PrepareError> {
    if !allow_degraded {
        return Err(PrepareError::NotEnforceable { layer, reason });
    }
    row(layers, layer, Enforcement::Degraded, reason);
    Ok(())
}

pub(super) fn row(
    layers: &mut Vec<LayerStatus>,
    layer: &'static str,
    status: Enforcement,
    detail: String,
) {
    layers.push(LayerStatus {
        layer,
        status,
        detail,
    });
}

/// What the cgroup system offers the exec's groups (or would, for `check`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupFacts {
    /// Where and which version, for the row's detail.
    pub describe: String,
    /// Why there is no memory controller, when there is none.
    pub no_memory: Option<String>,
    pub cpu: cgroup::CpuSupport,
}

/// What the limits layers were found to have to work with.
#[derive(Debug, Clone)]
pub struct LimitsProbe {
    /// `None`: no writable cgroup (not root, or none usable).
    pub cgroups: Option<CgroupFacts>,
    /// What start-up did about read-only cgroup mounts (`cgroup_remount::note`).
    pub remount_note: Option<String>,
    /// Why a crash could hand the command's memory to the host's core dump handler.
    pub core_gap: Option<String>,
    /// The command runs as uid 0, where RLIMIT_NPROC is not enforced.
    pub target_is_root: bool,
}

/// The rows of the cgroup, memory, cpu and rlimits layers, in that order, and the rlimits to
/// set; an error for the first layer that is weaker than asked unless `allow_degraded`.
pub fn limits(
    limits: &Limits,
    allow_degraded: bool,
    probe: &LimitsProbe,
) -> Result<(Vec<LayerStatus>, Vec<rlimits::Rlimit>), PrepareError> {
    let mut layers = Vec::new();
    let degrade = |layer, reason, layers: &mut Vec<LayerStatus>| {
        degrade(allow_degraded, layer, reason, layers)
    };
    let note = |detail: String| match &probe.remount_note {
        Some(n) => format!("{detail} ({n})"),
        None => detail,
    };
    let cg = probe.cgroups.as_ref();
    match cg {
        Some(facts) => layers.push(LayerStatus {
            layer: "cgroup",
            status: Enforcement::Enforced,
            detail: note(format!(
                "pids.max {} per exec; {}",
                limits.pids, facts.describe
            )),
        }),
        None if probe.target_is_root => degrade(
            "cgroup",
            note(
                "target uid is 0, where RLIMIT_NPROC is not enforced, and no pids cgroup can be created"
                    .into(),
            ),
            &mut layers,
        )?,
        // An explicit --pids N promises N processes for this exec. RLIMIT_NPROC counts every
        // process of the uid on the machine: twenty runs with --pids 16 starve each other.
        None if limits.pids_requested => degrade(
            "cgroup",
            note(format!(
                "no writable pids cgroup: --pids {} is RLIMIT_NPROC, shared by every process of the uid on this machine",
                limits.pids
            )),
            &mut layers,
        )?,
        None => layers.push(LayerStatus {
            layer: "cgroup",
            status: Enforcement::NotRequested,
            detail: note("no writable pids cgroup; RLIMIT_NPROC bounds processes per uid".into()),
        }),
    }
    // --memory is resident memory of the whole exec, swap included: only a memory cgroup
    // bounds that (and SysV shared memory and memfds with it). RLIMIT_AS is another promise,
    // about address space per process, and has its own flag. Nothing asked, nothing to refuse.
    let no_cgroup = "no memory cgroup (the supervisor is not root, or no writable cgroup)";
    match (limits.memory_bytes, cg) {
        (None, _) => layers.push(LayerStatus {
            layer: "memory",
            status: Enforcement::NotRequested,
            detail: "no --memory".into(),
        }),
        (
            Some(m),
            Some(CgroupFacts {
                no_memory: None, ..
            }),
        ) => layers.push(LayerStatus {
            layer: "memory",
            status: Enforcement::Enforced,
            detail: format!("{m} bytes resident per exec, swap off (memory cgroup)"),
        }),
        (Some(_), facts) => degrade(
            "memory",
            format!(
                "{}: --memory is not enforced at all",
                facts
                    .and_then(|f| f.no_memory.as_deref())
                    .unwrap_or(no_cgroup)
            ),
            &mut layers,
        )?,
    }

    // --cpu is CPU time of the whole tree (a watcher in the supervisor reads the cgroup's
    // accounting and kills at the limit); --cpus a CFS bandwidth quota.
    let cpu = cg.map(|f| f.cpu).unwrap_or_default();
    let mut per_process_cpu = false;
    let mut cpu_detail = Vec::new();
    if let Some(secs) = limits.cpu_secs {
        if cpu.accounting {
            cpu_detail.push(format!(
                "{secs} s of CPU for the whole exec tree (cgroup accounting)"
            ));
        } else {
            per_process_cpu = true;
            degrade(
                "cpu",
                format!(
                    "no cgroup CPU accounting: --cpu {secs} is RLIMIT_CPU, {secs} s for each process of the tree"
                ),
                &mut layers,
            )?;
        }
    }
    if let Some(m) = limits.cpu_quota_millis {
        let cpus = m as f64 / 1000.0;
        if cpu.quota {
            cpu_detail.push(format!("{cpus} CPUs of bandwidth (CFS quota)"));
        } else {
            degrade(
                "cpu",
                format!("no cgroup CPU controller: --cpus {cpus} is not enforced"),
                &mut layers,
            )?;
        }
    }
    let cpu_degraded = layers.iter().any(|l| l.layer == "cpu");
    match (cpu_detail.is_empty(), cpu_degraded) {
        (true, false) => layers.push(LayerStatus {
            layer: "cpu",
            status: Enforcement::NotRequested,
            detail: "no --cpu, no --cpus".into(),
        }),
        (false, false) => layers.push(LayerStatus {
            layer: "cpu",
            status: Enforcement::Enforced,
            detail: cpu_detail.join("; "),
        }),
        _ => {}
    }

    let mut rl = rlimits::prepare(limits);
    if !per_process_cpu {
        // The tree's budget is kept by the supervisor's watcher; a per-process RLIMIT_CPU of
        // the same size would only race it.
        rl.retain(|l| l.resource != libc::RLIMIT_CPU);
    }
    if cg.is_some() {
        // The per-exec pids.max bounds each exec exactly. RLIMIT_NPROC would add nothing but a
        // budget shared by every exec of the sandbox uid, so a fork bomb in one exec would stop
        // all the others from starting.
        rl.retain(|l| l.resource != libc::RLIMIT_NPROC);
    }
    let mut detail = rl
        .iter()
        .map(|l| format!("{}={}", l.name, l.hard))
        .collect::<Vec<_>>()
        .join(" ");
    // A crash must not hand the command's memory to the host's core dump handler (rlimits.rs
    // says what each core_pattern takes).
    match &probe.core_gap {
        None => layers.push(LayerStatus {
            layer: "rlimits",
            status: Enforcement::Enforced,
            detail,
        }),
        Some(gap) => {
            detail.push_str(&format!("; core dumps: {gap}"));
            degrade("rlimits", detail, &mut layers)?;
        }
    }
    Ok((layers, rl))
}

/// One Landlock rule as installed, in words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct InstalledRule {
    pub path: PathBuf,
    pub access: String,
}

/// The rules a prepared sandbox installs in every command, in words: what `check --explain`
/// prints, and what a run installs (built from the same values the ruleset and the BPF
/// program were built from).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Installed {
    /// Empty when no Landlock ruleset is installed.
    pub landlock: Vec<InstalledRule>,
    /// Empty when no seccomp filter is installed.
    pub seccomp: Vec<String>,
}

/// What the installed ruleset and filter hold. `fs_rules`: the path rules as the ruleset has
/// them; `landlock`: `(network restricted, scoped)` of the ruleset, `None` when there is none;
/// `seccomp`: whether a filter is installed, built for `socket_rules`.
pub fn installed(
    fs_rules: &[(PathBuf, PathAccess, bool)],
    landlock: Option<(bool, bool)>,
    socket_rules: NetworkMode,
    seccomp: bool,
) -> Installed {
    let mut ll = Vec::new();
    if let Some((network_restricted, scoped)) = landlock {
        ll.extend(fs_rules.iter().map(|(path, access, is_dir)| InstalledRule {
            path: path.clone(),
            access: access_words(*access, *is_dir).into(),
        }));
        if network_restricted {
            ll.push(InstalledRule {
                path: "(network)".into(),
                access: "TCP bind and connect denied (ABI >= 4)".into(),
            });
        }
        if scoped {
            ll.push(InstalledRule {
                path: "(scope)".into(),
                access: "signals and abstract unix sockets only within the sandbox (ABI >= 6)"
                    .into(),
            });
        }
    }
    Installed {
        landlock: ll,
        seccomp: if seccomp {
            seccomp::describe(socket_rules)
        } else {
            Vec::new()
        },
    }
}

/// What a Landlock rule of this kind allows (landlock.rs maps the same kinds).
pub fn access_words(access: PathAccess, is_dir: bool) -> &'static str {
    match (access, is_dir) {
        (PathAccess::ReadExec, true) => "read, list, execute",
        (PathAccess::ReadExec, false) => "read, execute",
        (PathAccess::ReadWrite, true) => {
            "read, list, execute, write, create, remove, rename, truncate (every right of the ABI)"
        }
        (PathAccess::ReadWrite, false) => "read, execute, write, truncate",
        (PathAccess::Device, _) => "read, write, truncate, ioctl (no create or remove)",
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
