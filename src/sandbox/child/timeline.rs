//! `OSB_SPAWN_TIMELINE`: when each stage of an exec's spawn ended, in the supervisor, the
//! exec's init and the command, for `benches/spawn.rs` and for a look at `serve` on a live
//! node (as `OSB_RUN_TIMELINE` does for `run`, exec/run/timeline.rs).
//!
//! The stamps go in one shared anonymous page, mapped only when the variable is set: the
//! children write theirs with plain stores after the clone (CLOCK_MONOTONIC through the vDSO:
//! async-signal-safe, no allocation), and the supervisor reads them once the command has
//! exec'd. Only the process-manager thread spawns, and it waits for each command's exec
//! before the next, so one page serves every spawn. Unset, each stamp is one relaxed load of a
//! null pointer.

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// The stages, in the order a spawn passes them; each stamp says when its stage ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Mark {
    /// The manager took the spawn job.
    Job,
    /// The exec's cgroup was taken (made ahead, or made now).
    Cgroup,
    /// The exec's own copy of the Landlock ruleset was made.
    Ruleset,
    /// The pipes and the command's stack were made: the clone follows.
    Pipes,
    /// The init's first instruction after the clone (the fork of the supervisor).
    InitStart,
    /// Parent-death signal, the supervisor's pidfd checked, the cgroup joined.
    InitPrologue,
    /// setns into the view's mount, IPC, UTS and network namespaces (and its root).
    InitSetns,
    /// The exec's own mount namespace and its fresh /proc.
    InitProc,
    /// The forwarded signals blocked and their handlers installed.
    InitSignals,
    /// The command's first instruction (the init's vfork-style clone).
    CommandStart,
    /// stdio, the view (without an init), the working directory.
    CommandStdio,
    /// Session, and the controlling terminal for a pty.
    CommandSession,
    /// The cgroup joined (without an init) and the rlimits set.
    CommandRlimits,
    /// The uid/gid switch, the capability drop, no_new_privs.
    CommandIdentity,
    /// The parent-death signal armed again and checked.
    CommandParentDeath,
    /// The Landlock ruleset's extra rules added and enforced.
    CommandLandlock,
    /// Every descriptor close-on-exec, signals reset.
    CommandFds,
    /// The seccomp filter installed: execve is next.
    CommandSeccomp,
    /// The init resumed: the command exec'd (or exited).
    InitResumed,
    /// The init dropped its copy of the supervisor's memory (child/forget.rs).
    InitForgot,
    /// The supervisor saw the error pipe's end: the command runs.
    ExecSeen,
}

impl Mark {
    pub const ALL: [Mark; 21] = [
        Mark::Job,
        Mark::Cgroup,
        Mark::Ruleset,
        Mark::Pipes,
        Mark::InitStart,
        Mark::InitPrologue,
        Mark::InitSetns,
        Mark::InitProc,
        Mark::InitSignals,
        Mark::CommandStart,
        Mark::CommandStdio,
        Mark::CommandSession,
        Mark::CommandRlimits,
        Mark::CommandIdentity,
        Mark::CommandParentDeath,
        Mark::CommandLandlock,
        Mark::CommandFds,
        Mark::CommandSeccomp,
        Mark::InitResumed,
        Mark::InitForgot,
        Mark::ExecSeen,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mark::Job => "job",
            Mark::Cgroup => "cgroup",
            Mark::Ruleset => "ruleset",
            Mark::Pipes => "pipes",
            Mark::InitStart => "init-start",
            Mark::InitPrologue => "init-prologue",
            Mark::InitSetns => "init-setns",
            Mark::InitProc => "init-proc",
            Mark::InitSignals => "init-signals",
            Mark::CommandStart => "cmd-start",
            Mark::CommandStdio => "cmd-stdio",
            Mark::CommandSession => "cmd-session",
            Mark::CommandRlimits => "cmd-rlimits",
            Mark::CommandIdentity => "cmd-identity",
            Mark::CommandParentDeath => "cmd-pdeath",
            Mark::CommandLandlock => "cmd-landlock",
            Mark::CommandFds => "cmd-fds",
            Mark::CommandSeccomp => "cmd-seccomp",
            Mark::InitResumed => "exec",
            Mark::InitForgot => "init-forget",
            Mark::ExecSeen => "exec-seen",
        }
    }
}

const SLOTS: usize = Mark::ALL.len();

/// One spawn's stages: each with when it ended, in ns after the job was taken.
pub type Stages = Vec<(Mark, u64)>;

/// The shared page, or null when the timeline is off.
static PAGE: AtomicPtr<AtomicU64> = AtomicPtr::new(std::ptr::null_mut());

/// Map the page when `OSB_SPAWN_TIMELINE` is set (once, before the first spawn).
pub fn init_from_env() {
    if std::env::var_os("OSB_SPAWN_TIMELINE").is_some() {
        enable();
    }
}

/// Turn the timeline on (the spawn bench, for its timeline rounds).
pub fn enable() {
    if !PAGE.load(Ordering::Acquire).is_null() {
        return;
    }
    if let Ok(p) = crate::sys::shared_page() {
        // A second caller racing here maps a page of its own and leaks it: harmless.
        let _ = PAGE.compare_exchange(
            std::ptr::null_mut(),
            p.as_ptr().cast(),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
}

/// Whether stamps are taken.
pub fn on() -> bool {
    !PAGE.load(Ordering::Relaxed).is_null()
}

/// A spawn begins: the slots cleared (stamps of a spawn that did not pass through here, such
/// as `run`'s init, must not count), then [`Mark::Job`] stamped.
pub fn begin() {
    let p = PAGE.load(Ordering::Relaxed);
    if p.is_null() {
        return;
    }
    for i in 0..SLOTS {
        // SAFETY: slot `i` of the page mapped in `enable`.
        unsafe { (*p.add(i)).store(0, Ordering::Relaxed) };
    }
    mark(Mark::Job);
}

/// Note that `m`'s stage ended now. Async-signal-safe: a load, `clock_gettime` and a store.
#[inline]
pub fn mark(m: Mark) {
    let p = PAGE.load(Ordering::Relaxed);
    if p.is_null() {
        return;
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec on our stack; the page has SLOTS slots and is
    // never unmapped.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
        (*p.add(m as usize)).store(
            ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64,
            Ordering::Relaxed,
        );
    }
}

/// The stamps of the spawn just finished, cleared for the next: when each stage ended, in ns
/// after [`Mark::Job`] (the children run beside the supervisor, so two stages can end in
/// either order); stages that did not happen are left out.
pub fn take() -> Option<Stages> {
    let p = PAGE.load(Ordering::Acquire);
    if p.is_null() {
        return None;
    }
    let mut out = Vec::with_capacity(SLOTS);
    let mut start = 0u64;
    for m in Mark::ALL {
        // SAFETY: slot `m` of the page mapped in `enable`.
        let t = unsafe { (*p.add(m as usize)).swap(0, Ordering::Relaxed) };
        if m == Mark::Job {
            start = t;
        } else if t != 0 && start != 0 {
            out.push((m, t.saturating_sub(start)));
        }
    }
    Some(out)
}

/// One line for stderr: `osb-spawn-timeline stage=ns ...` (ns after the job was taken).
pub fn line(stages: &[(Mark, u64)]) -> String {
    let parts: Vec<String> = stages
        .iter()
        .map(|(m, ns)| format!("{}={ns}", m.name()))
        .collect();
    format!("osb-spawn-timeline {}", parts.join(" "))
}

/// Where finished spawns' stages go: stderr, unless a bench asked to keep them.
static KEPT: std::sync::Mutex<Option<Vec<Stages>>> = std::sync::Mutex::new(None);

/// Keep each spawn's stages for [`kept`] instead of printing them (the spawn bench).
pub fn keep() {
    enable();
    let mut k = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    k.get_or_insert_with(Vec::new);
}

/// The stages kept since the last call.
pub fn kept() -> Vec<Stages> {
    let mut k = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    k.as_mut().map(std::mem::take).unwrap_or_default()
}

/// Called by the supervisor once a spawn's command exec'd: its stages to stderr (one line) or
/// to the bench. Nothing when the timeline is off.
pub fn finish() {
    let Some(stages) = take() else { return };
    let mut k = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    match k.as_mut() {
        Some(v) => v.push(stages),
        None => {
            drop(k);
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "{}", line(&stages));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stage a forked child stamps reaches the parent through the shared page, in order of
    /// the marks, and `take` leaves the page clear for the next spawn.
    #[test]
    fn a_forked_childs_stamp_reaches_the_parent() {
        enable();
        assert!(on());
        begin();
        // SAFETY: the child only stamps (clock_gettime and a store) and exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            mark(Mark::InitStart);
            // SAFETY: ends the forked child without running the parent's destructors.
            unsafe { libc::_exit(0) };
        }
        let mut st = 0;
        // SAFETY: waiting for our own child into a stack integer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
        mark(Mark::ExecSeen);
        let stages = take().unwrap();
        let marks: Vec<Mark> = stages.iter().map(|(m, _)| *m).collect();
        assert_eq!(marks, [Mark::InitStart, Mark::ExecSeen]);
        assert!(stages[0].1 <= stages[1].1, "{stages:?}");
        assert!(
            line(&stages).starts_with("osb-spawn-timeline init-start="),
            "{}",
            line(&stages)
        );
        assert_eq!(take().unwrap(), Vec::new(), "take clears the page");
    }
}
