//! Process layer: session, parent-death signal, file descriptors and the controlling tty in the
//! child; subreaper and non-dumpable in the supervisor.

/// Child side, first step: own session and process group (signals to the group reach the
/// whole tree, and the child loses the supervisor's controlling terminal), then the pty as
/// controlling terminal when asked. Async-signal-safe.
pub fn enforce_session(controlling_tty: bool) -> Result<(), (&'static str, i32)> {
    // SAFETY: raw syscalls with integer arguments.
    unsafe {
        if libc::setsid() < 0 {
            return Err(("setsid", crate::sandbox::errno()));
        }
        if controlling_tty && libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
            return Err((
                "make the pty the controlling terminal",
                crate::sandbox::errno(),
            ));
        }
    }
    Ok(())
}

/// Child side, after the identity switch: SIGKILL when the supervisor dies. It must come
/// after setresuid/setresgid, because the kernel clears the parent-death signal whenever the
/// effective uid or gid changes. `parent` is the supervisor's pid, read before fork: if it
/// already died before the prctl, the signal would never fire, so check and fail.
pub fn enforce_parent_death(parent: libc::pid_t) -> Result<(), (&'static str, i32)> {
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
            return Err(("set parent-death signal", crate::sandbox::errno()));
        }
        if libc::getppid() != parent {
            return Err(("supervisor exited during spawn", libc::ESRCH));
        }
    }
    Ok(())
}

/// Child side: every fd above 2 gets close-on-exec, so nothing of the supervisor (TLS
/// sockets, the Landlock ruleset, pipes of other execs) reaches the command. CLOEXEC rather
/// than closing, because the fork machinery still reports exec errors through a CLOEXEC pipe.
pub fn enforce_fds() -> Result<(), (&'static str, i32)> {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: raw syscall with integer arguments.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC) };
    if rc != 0 {
        return Err(("close_range", crate::sandbox::errno()));
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
