//! The child side: every kernel step between the supervisor's fork and the command's execve,
//! in one place. Nothing here may allocate, lock or log: the supervisor is multi-threaded, so
//! after fork only raw, async-signal-safe syscalls on data `prepare` built are allowed.
//!
//! The steps are named by [`Step`] (step.rs), whose declaration order is the order below; a
//! failing step travels back to the supervisor over the exec's error pipe with its errno.
//!
//! **The exec's init** (PID 1 of the exec's PID namespace; `init_main` in init.rs, or
//! `view_init_main` in view_init.rs for `run`, whose init makes the view itself: there step 3
//! is the view's build, then the Landlock rules of its private tmpfs roots, the report, and the
//! supervisor's go, in place of the setns):
//! 1. parent-death signal (SIGKILL), then the supervisor's pidfd polled: if the supervisor
//!    died before the signal was armed, it would never fire;
//! 2. join the exec's cgroup, so every process of the exec is born in it (writing
//!    cgroup.procs needs our root identity, which the command gives up below);
//! 3. setns into the view's mount, IPC, UTS and network namespaces (setns into a mount
//!    namespace needs a single-threaded caller, which only a forked child is), then a mount
//!    namespace of its own with a fresh /proc for the new PID namespace;
//! 4. block the forwarded signals and install their relaying handlers;
//! 5. clone the command (CLONE_VM|CLONE_VFORK) with our affinity narrowed to the CPU we run
//!    on, so that the command starts there at once while we sleep, then hold nothing of the
//!    supervisor's (its descriptors closed, its heaps and other threads' stacks dropped:
//!    sys/forget.rs) and reap until the command exits.
//!
//! **The command** (`command_main` in init.rs, then [`enforce_in_child`]):
//! 0. under an init, the init's affinity back on itself and on the init, before anything else
//!    (the init, suspended until our exec, cannot do its own);
//! 1. stdio onto 0..2, the view (only without an init), the working directory, and without
//!    an init the child-subreaper bit;
//! 2. a process group of its own: a new session (and, for a pty, the controlling terminal)
//!    where the exec asks for a pty or the supervisor has a terminal for it to lose, else
//!    only its own group (`group.rs` says why that is the same, less a scheduler autogroup);
//!    while we can still fail cheaply;
//! 3. join the exec's cgroup (only without an init, which joined it for the whole namespace);
//! 4. rlimits: lowering needs no privilege, but comes before anything the child could race;
//! 5. identity: ambient set cleared, securebits and the bounding set (they need CAP_SETPCAP,
//!    so before setuid), then groups, gid, uid (each needs a capability the next removes),
//!    verified, every capability set emptied, no_new_privs (Landlock and seccomp require it
//!    of an unprivileged caller); then, where `run` asks, whether the command may write its
//!    workdir, asked of the kernel as the command itself, in its view;
//! 6. parent-death signal: here, after the identity switch, because the kernel clears it
//!    whenever the effective uid or gid changes; then `getppid()` checked against the parent
//!    read before fork;
//! 7. Landlock (after the capability drop), with the rules for the exec's own /proc and for
//!    listing the view's root first;
//! 8. every fd above 2 close-on-exec, after Landlock used its ruleset fd;
//! 9. signal dispositions and mask reset (SIGPIPE ignored by the Rust runtime, the init's
//!    relaying handlers), unblocking last so a SIGTERM of the spawn reaches the command;
//! 10. seccomp, last and as close to exec as possible, so the filter need not allow the steps
//!     above; execve itself stays allowed;
//! 11. execve of each candidate of the program in turn (the PATH search, inside the view).

pub mod group;
pub mod init;
pub mod process;
mod signals;
pub mod timeline;
pub mod view_init;

use super::prepared::Prepared;
use super::step::{ChildError, Step};
use super::{cgroup, identity, namespaces, rlimits, seccomp};
use timeline::{Mark, mark};

/// Apply every layer to the calling command process, steps 2 to 10 of the module's list, in
/// that order. `own`: the exec's own copy of the Landlock ruleset, enforced in place of the
/// shared one (`ExecPlan::with_ruleset`). `parent`: the pid `getppid()` must return once the parent-death signal is armed
/// (1 inside the exec's PID namespace, where our init is the parent; the supervisor's pid
/// otherwise). `join`: the cgroup to join here (only when there is no init, which joins it for
/// the whole namespace). `group`: how the command gets its own process group.
///
/// # Safety
/// Only in a forked, single-threaded child about to execve (the command): it changes the
/// calling process's session, identity, limits and filters for good, and between fork and
/// exec of a multi-threaded parent it may only make async-signal-safe calls, which it does
/// (raw syscalls on the data in `p`, no allocation).
pub unsafe fn enforce_in_child(
    p: &Prepared,
    own: Option<&super::landlock::PreparedRuleset>,
    join: Option<&cgroup::ExecCgroup>,
    group: group::CommandGroup,
    parent: libc::pid_t,
    workdir: Option<&std::ffi::CStr>,
) -> Result<(), ChildError> {
    process::enforce_session(group)?;
    mark(Mark::CommandSession);
    if let Some(cg) = join {
        cg.join()
            .map_err(|e| ChildError::new(Step::JoinCgroup, e))?;
    }
    rlimits::apply(&p.rlimits)?;
    mark(Mark::CommandRlimits);
    identity::enforce(&p.identity)?;
    if let Some(dir) = workdir {
        process::check_workdir(dir)?;
    }
    mark(Mark::CommandIdentity);
    process::enforce_parent_death(parent)?;
    mark(Mark::CommandParentDeath);
    if let Some(ll) = own.or(p.landlock.as_ref()) {
        if p.view.pid && p.view.proc != namespaces::ProcMount::None && p.proc_rule {
            ll.add_fresh_proc_rule()
                .map_err(|e| ChildError::new(Step::LandlockProcRule, e))?;
        }
        if p.view.root {
            ll.add_view_root_rule()
                .map_err(|e| ChildError::new(Step::LandlockRootRule, e))?;
        }
        ll.enforce()
            .map_err(|e| ChildError::new(Step::Landlock, e))?;
    }
    mark(Mark::CommandLandlock);
    process::enforce_fds()?;
    process::reset_signals()?;
    mark(Mark::CommandFds);
    if let Some(prog) = &p.seccomp {
        seccomp::install(prog).map_err(|e| ChildError::new(Step::Seccomp, e))?;
    }
    mark(Mark::CommandSeccomp);
    Ok(())
}
