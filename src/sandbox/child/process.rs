//! Process layer: process group or session, parent-death signal, file descriptors, signal dispositions and the
//! controlling tty in the child; subreaper and non-dumpable in the supervisor.

use super::group::CommandGroup;
use crate::sandbox::step::{ChildError, Step};

/// Child side, first step: a process group of its own, in a new session or not as `group`
/// says (see [`CommandGroup`]: signals to the group reach the whole tree, and a new session
/// loses the supervisor's controlling terminal), then the pty as controlling terminal when
/// asked. Async-signal-safe.
pub fn enforce_session(group: CommandGroup) -> Result<(), ChildError> {
    // SAFETY: raw syscalls with integer arguments.
    unsafe {
        match group {
            CommandGroup::Group => {
                if libc::setpgid(0, 0) != 0 {
                    return Err(ChildError::last(Step::Setpgid));
                }
            }
            CommandGroup::Session { tty } => {
                if libc::setsid() < 0 {
                    return Err(ChildError::last(Step::Setsid));
                }
                if tty && libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                    return Err(ChildError::last(Step::ControllingTty));
                }
            }
        }
    }
    Ok(())
}

/// Child side, right after the identity switch, where `run` asks for it: whether the command
/// may create entries in its workdir `dir` (write and search), by the permissions alone
/// (faccessat2 with AT_EACCESS: the effective ids, no capability left), through the view's
/// mount of it (an idmapped one checks the command as the directory's owner). A run whose
/// command cannot write its workdir would fail every write while its report said "all layers
/// enforced". Async-signal-safe.
pub fn check_workdir(dir: &std::ffi::CStr) -> Result<(), ChildError> {
    // SAFETY: faccessat2 (access as a fallback) with a NUL-terminated path and integer flags.
    let rc = unsafe {
        let rc = libc::syscall(
            libc::SYS_faccessat2,
            libc::AT_FDCWD,
            dir.as_ptr(),
            libc::W_OK | libc::X_OK,
            libc::AT_EACCESS,
        );
        if rc != 0 && crate::sys::errno() == libc::ENOSYS {
            libc::access(dir.as_ptr(), libc::W_OK | libc::X_OK) as libc::c_long
        } else {
            rc
        }
    };
    if rc != 0 {
        return Err(ChildError::last(Step::WorkdirWritable));
    }
    Ok(())
}

/// Child side, after the identity switch: SIGKILL when the parent dies. It must come after
/// setresuid/setresgid, because the kernel clears the parent-death signal whenever the
/// effective uid or gid changes. `parent` is the pid `getppid()` must return (read before
/// fork): if the parent already died before the prctl, the signal would never fire, so check
/// and fail.
pub fn enforce_parent_death(parent: libc::pid_t) -> Result<(), ChildError> {
    // SAFETY: raw syscalls with integer arguments.
    unsafe {
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
        {
            return Err(ChildError::last(Step::ParentDeath));
        }
        if libc::getppid() != parent {
            return Err(ChildError::new(Step::SupervisorGone, libc::ESRCH));
        }
    }
    Ok(())
}

/// Child side: every fd above 2 gets close-on-exec, so nothing of the supervisor (TLS
/// sockets, the Landlock ruleset, pipes of other execs) reaches the command. CLOEXEC rather
/// than closing, because exec errors are still reported through a CLOEXEC pipe.
pub fn enforce_fds() -> Result<(), ChildError> {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: raw syscall with integer arguments.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC) };
    if rc != 0 {
        return Err(ChildError::last(Step::CloseFds));
    }
    Ok(())
}

/// Child side, just before seccomp: the dispositions and mask a fresh program expects. The
/// Rust runtime ignores SIGPIPE (ignored dispositions survive execve), the init's relaying
/// handlers are inherited until exec, and the forking thread may block signals. Unblocking
/// last delivers a SIGTERM that arrived during the spawn to the command, which then dies of
/// it, as it would have once running.
pub fn reset_signals() -> Result<(), ChildError> {
    // SAFETY: sigaction/sigprocmask on stack values; async-signal-safe.
    unsafe {
        for sig in std::iter::once(libc::SIGPIPE).chain(super::init::FORWARDED) {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = libc::SIG_DFL;
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                return Err(ChildError::last(Step::ResetSignals));
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        if libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()) != 0 {
            return Err(ChildError::last(Step::ResetSignals));
        }
    }
    Ok(())
}

/// Supervisor side, once at startup: orphans of any exec are re-parented to us (so we can
/// reap and kill them), and our memory cannot be read through /proc or ptrace by a process of
/// the same uid.
pub fn harden_supervisor() -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments.
    unsafe {
        if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
