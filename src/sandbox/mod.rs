//! The isolation layers, and the one place that fixes their order.
//!
//! Two phases (style habit 3):
//! - [`prepare`] runs in the supervisor, privileged and multi-threaded: it checks what the kernel
//!   supports, refuses (fails closed) when the policy cannot be fully enforced unless degraded
//!   runs were allowed, and builds every kernel object: the Landlock ruleset fd, the seccomp
//!   program, the rlimit values, the identity, the cgroup.
//! - [`enforce_in_child`] runs in the forked child between fork and exec. The supervisor is a
//!   multi-threaded tokio process, so after fork only async-signal-safe work is allowed: no
//!   allocation, no locks, no logging. Every step here is a raw syscall on prepared data. We
//!   chose this over re-executing a single-threaded helper because it costs one exec instead
//!   of two (see BENCHMARKS.md).
//!
//! The order in the child, and why:
//! 1. session, parent-death signal, controlling tty — while we can still fail cheaply;
//! 2. join the exec's cgroup — writing cgroup.procs needs our root identity;
//! 3. rlimits — lowering needs no privilege, but do it before anything the child could race;
//! 4. identity — securebits and the bounding set need CAP_SETPCAP, so they go before setuid;
//!    groups before gid before uid, because each needs a capability the next step removes;
//!    then no_new_privs, which both Landlock and seccomp require of an unprivileged caller;
//! 5. Landlock — after the capability drop (style: "the capability drop before Landlock");
//! 6. every fd above 2 marked close-on-exec — after Landlock used its ruleset fd;
//! 7. seccomp — last, as close to exec as possible, so the filter does not have to allow the
//!    syscalls of the steps above. execve itself stays allowed.

pub mod cgroup;
pub mod identity;
pub mod landlock;
pub mod process;
pub mod rlimits;
pub mod seccomp;

use seccompiler::BpfProgram;

use crate::policy::{NetworkMode, Policy, expand_grants};

/// errno of the last failed libc call on this thread. Async-signal-safe.
pub fn errno() -> i32 {
    // SAFETY: __errno_location always returns a valid pointer to this thread's errno.
    unsafe { *libc::__errno_location() }
}

/// Whether one layer is fully in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Enforcement {
    /// Exactly what the policy asked for.
    Enforced,
    /// Weaker than asked; only allowed with `--allow-degraded`.
    Degraded,
    /// Not requested by the policy (e.g. Landlock TCP rules with `--network all`).
    NotRequested,
}

/// One row of the report: a layer and what was enforced.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LayerStatus {
    pub layer: &'static str,
    pub status: Enforcement,
    pub detail: String,
}

#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("layer `{layer}` cannot be enforced: {reason} (pass --allow-degraded to run anyway)")]
    NotEnforceable { layer: &'static str, reason: String },
    #[error("preparing the Landlock ruleset: {0}")]
    Landlock(#[from] landlock::LandlockError),
    #[error("compiling the seccomp filter: {0}")]
    Seccomp(#[from] seccomp::SeccompError),
    #[error("expanding the filesystem rules: {0}")]
    FsRules(std::io::Error),
}

/// Everything the child needs, built once.
#[derive(Debug)]
pub struct Prepared {
    pub landlock: Option<landlock::Prepared>,
    pub seccomp: Option<BpfProgram>,
    pub rlimits: Vec<rlimits::Rlimit>,
    pub identity: identity::Prepared,
    pub cgroups: Option<cgroup::Root>,
    pub layers: Vec<LayerStatus>,
    pub landlock_abi: i32,
    /// The supervisor's pid, for the parent-death race check.
    pub supervisor_pid: libc::pid_t,
}

/// Whether this kernel can install seccomp filters.
pub fn seccomp_available() -> bool {
    // SAFETY: PR_GET_SECCOMP only returns a number; the action query reads a stack u32.
    unsafe {
        if libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) < 0 {
            return false;
        }
        let action: u32 = 0x8000_0000; // SECCOMP_RET_KILL_PROCESS
        libc::syscall(
            libc::SYS_seccomp,
            2u32, /* SECCOMP_GET_ACTION_AVAIL */
            0u32,
            &action,
        ) == 0
    }
}

/// Build every kernel object for `policy`, refusing when a requested layer cannot be enforced
/// and `policy.allow_degraded` is false.
pub fn prepare(policy: &Policy) -> Result<Prepared, PrepareError> {
    prepare_with(policy, Cgroups::Create)
}

/// [`prepare`] for `check`: the same decisions, but with no lasting side effect on the
/// system: no cgroup is made, no process moved, no other supervisor's group swept.
pub fn prepare_dry(policy: &Policy) -> Result<Prepared, PrepareError> {
    prepare_with(policy, Cgroups::ProbeOnly)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Cgroups {
    Create,
    ProbeOnly,
}

fn prepare_with(policy: &Policy, cgroup_mode: Cgroups) -> Result<Prepared, PrepareError> {
    let mut layers = Vec::new();
    let degrade = |layer: &'static str, reason: String, layers: &mut Vec<LayerStatus>| {
        if !policy.allow_degraded {
            return Err(PrepareError::NotEnforceable { layer, reason });
        }
        layers.push(LayerStatus {
            layer,
            status: Enforcement::Degraded,
            detail: reason,
        });
        Ok(())
    };

    // Landlock.
    let mut landlock_abi = 0;
    let landlock = match landlock::probe() {
        Ok(support) if support.filesystem => {
            landlock_abi = support.abi;
            let rules = expand_grants(&policy.fs).map_err(PrepareError::FsRules)?;
            let p = landlock::prepare(&rules, policy.network, support)?;
            layers.push(LayerStatus {
                layer: "landlock-fs",
                status: Enforcement::Enforced,
                detail: format!("ABI {}, {} path rules", support.abi, rules.len()),
            });
            match (policy.network, p.network_restricted) {
                (NetworkMode::None, true) => layers.push(LayerStatus {
                    layer: "landlock-net",
                    status: Enforcement::Enforced,
                    detail: "TCP bind and connect denied".into(),
                }),
                (NetworkMode::None, false) => degrade(
                    "landlock-net",
                    format!("Landlock ABI {} < 4 cannot restrict TCP", support.abi),
                    &mut layers,
                )?,
                (NetworkMode::All, _) => layers.push(LayerStatus {
                    layer: "landlock-net",
                    status: Enforcement::NotRequested,
                    detail: "--network all".into(),
                }),
            }
            if p.scoped {
                layers.push(LayerStatus {
                    layer: "landlock-scope",
                    status: Enforcement::Enforced,
                    detail: "signals and abstract unix sockets scoped to the sandbox".into(),
                });
            } else {
                degrade(
                    "landlock-scope",
                    format!(
                        "Landlock ABI {} < 6 cannot scope signals and abstract sockets",
                        support.abi
                    ),
                    &mut layers,
                )?;
            }
            Some(p)
        }
        Ok(_) => {
            degrade("landlock-fs", "Landlock reports ABI 0".into(), &mut layers)?;
            None
        }
        Err(e) => {
            degrade("landlock-fs", e.to_string(), &mut layers)?;
            None
        }
    };

    // seccomp.
    let seccomp = if seccomp_available() {
        let prog = seccomp::build(policy.network)?;
        layers.push(LayerStatus {
            layer: "seccomp",
            status: Enforcement::Enforced,
            detail: format!("{} BPF instructions", prog.len()),
        });
        Some(prog)
    } else {
        degrade(
            "seccomp",
            "the kernel cannot install seccomp filters".into(),
            &mut layers,
        )?;
        None
    };

    // Identity.
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let identity = identity::prepare(if euid == 0 { policy.identity } else { None });
    match (euid, policy.identity) {
        (0, Some(id)) => layers.push(LayerStatus {
            layer: "identity",
            status: Enforcement::Enforced,
            detail: format!(
                "uid {} gid {}, no supplementary groups, every capability set empty, no_new_privs",
                id.uid, id.gid
            ),
        }),
        (0, None) => degrade(
            "identity",
            "running as root with no target uid".into(),
            &mut layers,
        )?,
        (uid, Some(id)) if id.uid != uid => degrade(
            "identity",
            format!("not root (uid {uid}): cannot switch to uid {}", id.uid),
            &mut layers,
        )?,
        (uid, _) => {
            // Not root: setgroups needs CAP_SETGID, so the child inherits every supplementary
            // group we hold. Pathname unix sockets are not checked by Landlock ABI 7, so a
            // member of e.g. `docker` reaches /var/run/docker.sock: that is not "enforced".
            let groups = identity::supplementary_groups();
            if groups.is_empty() {
                layers.push(LayerStatus {
                    layer: "identity",
                    status: Enforcement::Enforced,
                    detail: format!(
                        "not root: child keeps uid {uid} (files of this uid are guarded by Landlock only), no supplementary groups; capabilities cleared, no_new_privs"
                    ),
                })
            } else {
                degrade(
                    "identity",
                    format!(
                        "not root (uid {uid}): the child would keep the supplementary groups {}, which only root can drop",
                        identity::describe_groups(&groups)
                    ),
                    &mut layers,
                )?
            }
        }
    }

    // cgroup (pids, memory, tree kill).
    // (description, why there is no memory controller, CPU support) of what is, or would be,
    // in force.
    let (cgroups, cg_info) = match (euid, cgroup_mode) {
        (0, Cgroups::Create) => {
            let root = cgroup::detect();
            let info = root
                .as_ref()
                .map(|r| (r.describe(), r.memory().err().map(String::from), r.cpu()));
            (root, info)
        }
        (0, Cgroups::ProbeOnly) => (
            None,
            cgroup::System::real()
                .and_then(|s| cgroup::probe(&s))
                .map(|p| (p.describe, p.no_memory, p.cpu)),
        ),
        _ => (None, None),
    };
    let target_is_root = matches!(identity.target, Some(id) if id.uid == 0);
    match &cg_info {
        Some((describe, ..)) => layers.push(LayerStatus {
            layer: "cgroup",
            status: Enforcement::Enforced,
            detail: format!("pids.max {} per exec; {describe}", policy.limits.pids),
        }),
        None if target_is_root => degrade(
            "cgroup",
            "target uid is 0, where RLIMIT_NPROC is not enforced, and no pids cgroup can be created".into(),
            &mut layers,
        )?,
        // An explicit --pids N promises N processes for this exec. RLIMIT_NPROC counts every
        // process of the uid on the machine: twenty runs with --pids 16 starve each other.
        None if policy.limits.pids_requested => degrade(
            "cgroup",
            format!(
                "no writable pids cgroup: --pids {} is RLIMIT_NPROC, shared by every process of the uid on this machine",
                policy.limits.pids
            ),
            &mut layers,
        )?,
        None => layers.push(LayerStatus {
            layer: "cgroup",
            status: Enforcement::NotRequested,
            detail: "no writable pids cgroup; RLIMIT_NPROC bounds processes per uid".into(),
        }),
    }
    // --memory is resident memory of the whole exec, swap included: only a memory cgroup
    // bounds that (and SysV shared memory and memfds with it). RLIMIT_AS is another promise,
    // about address space per process, and has its own flag. Nothing asked, nothing to refuse.
    let no_cgroup = "no memory cgroup (the supervisor is not root, or no writable cgroup)";
    match (policy.limits.memory_bytes, &cg_info) {
        (None, _) => layers.push(LayerStatus {
            layer: "memory",
            status: Enforcement::NotRequested,
            detail: "no --memory".into(),
        }),
        (Some(m), Some((_, None, _))) => layers.push(LayerStatus {
            layer: "memory",
            status: Enforcement::Enforced,
            detail: format!("{m} bytes resident per exec, swap off (memory cgroup)"),
        }),
        (Some(_), info) => degrade(
            "memory",
            format!(
                "{}: --memory is not enforced at all",
                info.as_ref()
                    .and_then(|(_, why, _)| why.as_deref())
                    .unwrap_or(no_cgroup)
            ),
            &mut layers,
        )?,
    }

    // --cpu is CPU time of the whole tree (a watcher in the supervisor reads the cgroup's
    // accounting and kills at the limit); --cpus a CFS bandwidth quota.
    let cpu = cg_info.as_ref().map(|(_, _, c)| *c).unwrap_or_default();
    let mut per_process_cpu = false;
    let mut cpu_detail = Vec::new();
    if let Some(secs) = policy.limits.cpu_secs {
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
    if let Some(m) = policy.limits.cpu_quota_millis {
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

    let mut rl = rlimits::prepare(&policy.limits);
    if !per_process_cpu {
        // The tree's budget is kept by the supervisor's watcher; a per-process RLIMIT_CPU of
        // the same size would only race it.
        rl.retain(|l| l.resource != libc::RLIMIT_CPU);
    }
    if cg_info.is_some() {
        // The per-exec pids.max bounds each exec exactly. RLIMIT_NPROC would add nothing but a
        // budget shared by every exec of the sandbox uid, so a fork bomb in one exec would stop
        // all the others from starting.
        rl.retain(|l| l.resource != libc::RLIMIT_NPROC);
    }
    layers.push(LayerStatus {
        layer: "rlimits",
        status: Enforcement::Enforced,
        detail: rl
            .iter()
            .map(|l| format!("{}={}", l.name, l.hard))
            .collect::<Vec<_>>()
            .join(" "),
    });

    Ok(Prepared {
        landlock,
        seccomp,
        rlimits: rl,
        identity,
        cgroups,
        layers,
        landlock_abi,
        // SAFETY: getpid has no preconditions.
        supervisor_pid: unsafe { libc::getpid() },
    })
}

/// The steps of [`enforce_in_child`], for error messages (sent to the parent as an index).
pub const STEPS: &[&str] = &[
    "session",
    "join cgroup",
    "rlimits",
    "identity",
    "parent-death signal",
    "landlock",
    "close fds",
    "seccomp",
];

/// A failed step: index into [`STEPS`] and errno.
pub type ChildError = (u8, i32);

/// Apply every layer to the calling (forked, single-threaded) child, in the documented order.
/// Async-signal-safe: only raw syscalls on data in `p` and `cg`.
pub fn enforce_in_child(
    p: &Prepared,
    cg: Option<&cgroup::ExecCgroup>,
    controlling_tty: bool,
) -> Result<(), ChildError> {
    process::enforce_session(controlling_tty).map_err(|(_, e)| (0, e))?;
    if let Some(cg) = cg {
        cg.join().map_err(|e| (1, e))?;
    }
    rlimits::apply(&p.rlimits).map_err(|(_, e)| (2, e))?;
    identity::enforce(&p.identity).map_err(|(_, e)| (3, e))?;
    process::enforce_parent_death(p.supervisor_pid).map_err(|(_, e)| (4, e))?;
    if let Some(ll) = &p.landlock {
        ll.enforce().map_err(|e| (5, e))?;
    }
    process::enforce_fds().map_err(|e| (6, e.1))?;
    if let Some(prog) = &p.seccomp {
        seccomp::install(prog).map_err(|e| (7, e))?;
    }
    Ok(())
}
