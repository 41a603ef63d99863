//! The rows of the limits layers (cgroup, memory, cpu, rlimits) and the rlimits to set, with
//! their fail-closed refusals.

use super::super::layer::{Enforcement, LayerStatus, PrepareError};
use super::super::{cgroup, rlimits};
use super::row::{degrade, row};
use crate::policy::Limits;

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
    cgroup_row(limits, allow_degraded, probe, &mut layers)?;
    memory_row(limits, allow_degraded, probe, &mut layers)?;
    let per_process_cpu = cpu_row(limits, allow_degraded, probe, &mut layers)?;
    let rl = rlimits_row(limits, allow_degraded, probe, per_process_cpu, &mut layers)?;
    Ok((layers, rl))
}

/// The cgroup row: pids.max per exec, or why RLIMIT_NPROC stands in for it.
fn cgroup_row(
    limits: &Limits,
    allow_degraded: bool,
    probe: &LimitsProbe,
    layers: &mut Vec<LayerStatus>,
) -> Result<(), PrepareError> {
    let note = |detail: String| match &probe.remount_note {
        Some(n) => format!("{detail} ({n})"),
        None => detail,
    };
    match &probe.cgroups {
        Some(facts) => row(
            layers,
            "cgroup",
            Enforcement::Enforced,
            note(format!(
                "pids.max {} per exec; {}",
                limits.pids, facts.describe
            )),
        ),
        None if probe.target_is_root => degrade(
            allow_degraded,
            "cgroup",
            note(
                "target uid is 0, where RLIMIT_NPROC is not enforced, and no pids cgroup can be created"
                    .into(),
            ),
            layers,
        )?,
        // An explicit --pids N promises N processes for this exec. RLIMIT_NPROC counts every
        // process of the uid on the machine: twenty runs with --pids 16 starve each other.
        None if limits.pids_requested => degrade(
            allow_degraded,
            "cgroup",
            note(format!(
                "no writable pids cgroup: --pids {} is RLIMIT_NPROC, shared by every process of the uid on this machine",
                limits.pids
            )),
            layers,
        )?,
        None => row(
            layers,
            "cgroup",
            Enforcement::NotRequested,
            note("no writable pids cgroup; RLIMIT_NPROC bounds processes per uid".into()),
        ),
    }
    Ok(())
}

/// The memory row. --memory is resident memory of the whole exec, swap included: only a
/// memory cgroup bounds that (and SysV shared memory and memfds with it). RLIMIT_AS is another
/// promise, about address space per process, and has its own flag. Nothing asked, nothing to
/// refuse.
fn memory_row(
    limits: &Limits,
    allow_degraded: bool,
    probe: &LimitsProbe,
    layers: &mut Vec<LayerStatus>,
) -> Result<(), PrepareError> {
    let no_cgroup = "no memory cgroup (the supervisor is not root, or no writable cgroup)";
    match (limits.memory_bytes, probe.cgroups.as_ref()) {
        (None, _) => row(
            layers,
            "memory",
            Enforcement::NotRequested,
            "no --memory".into(),
        ),
        (
            Some(m),
            Some(CgroupFacts {
                no_memory: None, ..
            }),
        ) => row(
            layers,
            "memory",
            Enforcement::Enforced,
            format!("{m} bytes resident per exec, swap off (memory cgroup)"),
        ),
        (Some(_), facts) => degrade(
            allow_degraded,
            "memory",
            format!(
                "{}: --memory is not enforced at all",
                facts
                    .and_then(|f| f.no_memory.as_deref())
                    .unwrap_or(no_cgroup)
            ),
            layers,
        )?,
    }
    Ok(())
}

/// The cpu row. --cpu is CPU time of the whole tree (a watcher in the supervisor reads the
/// cgroup's accounting and kills at the limit); --cpus a CFS bandwidth quota. True when
/// --cpu falls back to RLIMIT_CPU per process.
fn cpu_row(
    limits: &Limits,
    allow_degraded: bool,
    probe: &LimitsProbe,
    layers: &mut Vec<LayerStatus>,
) -> Result<bool, PrepareError> {
    let cpu = probe.cgroups.as_ref().map(|f| f.cpu).unwrap_or_default();
    let mut per_process_cpu = false;
    let mut cpu_detail = Vec::new();
    let mut degraded = false;
    if let Some(secs) = limits.cpu_secs {
        if cpu.accounting {
            cpu_detail.push(format!(
                "{secs} s of CPU for the whole exec tree (cgroup accounting)"
            ));
        } else {
            per_process_cpu = true;
            degraded = true;
            degrade(
                allow_degraded,
                "cpu",
                format!(
                    "no cgroup CPU accounting: --cpu {secs} is RLIMIT_CPU, {secs} s for each process of the tree"
                ),
                layers,
            )?;
        }
    }
    if let Some(m) = limits.cpu_quota_millis {
        let cpus = m as f64 / 1000.0;
        if cpu.quota {
            cpu_detail.push(format!("{cpus} CPUs of bandwidth (CFS quota)"));
        } else {
            degraded = true;
            degrade(
                allow_degraded,
                "cpu",
                format!("no cgroup CPU controller: --cpus {cpus} is not enforced"),
                layers,
            )?;
        }
    }
    match (cpu_detail.is_empty(), degraded) {
        (true, false) => row(
            layers,
            "cpu",
            Enforcement::NotRequested,
            "no --cpu, no --cpus".into(),
        ),
        (false, false) => row(layers, "cpu", Enforcement::Enforced, cpu_detail.join("; ")),
        _ => {}
    }
    Ok(per_process_cpu)
}

/// The rlimits to set and their row.
fn rlimits_row(
    limits: &Limits,
    allow_degraded: bool,
    probe: &LimitsProbe,
    per_process_cpu: bool,
    layers: &mut Vec<LayerStatus>,
) -> Result<Vec<rlimits::Rlimit>, PrepareError> {
    let mut rl = rlimits::prepare(limits);
    if !per_process_cpu {
        // The tree's budget is kept by the supervisor's watcher; a per-process RLIMIT_CPU of
        // the same size would only race it.
        rl.retain(|l| l.resource != libc::RLIMIT_CPU);
    }
    if probe.cgroups.is_some() {
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
        None => row(layers, "rlimits", Enforcement::Enforced, detail),
        Some(gap) => {
            detail.push_str(&format!("; core dumps: {gap}"));
            degrade(allow_degraded, "rlimits", detail, layers)?;
        }
    }
    Ok(rl)
}
