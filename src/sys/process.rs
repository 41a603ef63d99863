//! Processes by descriptor, and the calling process's groups: the raw calls that `exec/` and
//! `sandbox/` share. [`pidfd_send_signal`] is async-signal-safe (one syscall, no allocation),
//! so the child side may use it too. [`ReapAll`] is the one right per process to reap every
//! child.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// A pidfd of `pid`: signals sent through it can never reach a recycled pid.
pub fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open with integer arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just created, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Send `sig` to the process `pidfd` refers to, with no siginfo of ours. `Err` is the errno
/// (ESRCH once the process has been reaped). Async-signal-safe.
pub fn pidfd_send_signal(pidfd: RawFd, sig: i32) -> Result<(), i32> {
    // SAFETY: pidfd_send_signal with integer arguments and a null siginfo; a descriptor that is
    // not a pidfd only makes it fail (EBADF, EINVAL).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd,
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    if rc == 0 { Ok(()) } else { Err(super::errno()) }
}

/// `kill(pid, sig)`: a negative `pid` is a process group. By number, so only where the number
/// cannot name another process by now: a leader not yet reaped (and the group it leads), a
/// member of a frozen cgroup, a child of ours that only we reap. Elsewhere signal through a
/// pidfd ([`pidfd_send_signal`]). `Err` is the errno (ESRCH once it is gone).
pub fn kill(pid: libc::pid_t, sig: i32) -> io::Result<()> {
    // SAFETY: kill with integer arguments.
    if unsafe { libc::kill(pid, sig) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The calling process's effective uid. These four calls cannot fail and have no
/// preconditions: one wrapper each, so that no caller writes an `unsafe` block for them.
pub fn euid() -> libc::uid_t {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The calling process's effective gid.
pub fn egid() -> libc::gid_t {
    // SAFETY: getegid has no preconditions and cannot fail.
    unsafe { libc::getegid() }
}

/// The calling process's real gid.
pub fn gid() -> libc::gid_t {
    // SAFETY: getgid has no preconditions and cannot fail.
    unsafe { libc::getgid() }
}

/// The calling process's pid (in its own PID namespace).
pub fn pid() -> libc::pid_t {
    // SAFETY: getpid has no preconditions and cannot fail.
    unsafe { libc::getpid() }
}

/// The calling process's supplementary groups, as `getgroups` lists them (empty when it
/// cannot say).
pub fn groups() -> Vec<libc::gid_t> {
    // SAFETY: getgroups with size 0 only counts; the second call fills a buffer of that size.
    unsafe {
        let n = libc::getgroups(0, std::ptr::null_mut());
        if n <= 0 {
            return Vec::new();
        }
        let mut v = vec![0 as libc::gid_t; n as usize];
        let n = libc::getgroups(n, v.as_mut_ptr());
        v.truncate(n.max(0) as usize);
        v
    }
}

/// The right to reap every child of this process (`waitid(P_ALL)`, as a child subreaper), held
/// by one owner for the life of the process: a second reaper would take the first one's
/// children, orphans and execs alike. Never given back, because the owner (the process
/// manager's thread) never ends.
#[derive(Debug)]
pub struct ReapAll(());

impl ReapAll {
    /// The claim, the first time it is asked for in this process; `None` after that.
    pub fn claim() -> Option<ReapAll> {
        use std::sync::atomic::{AtomicBool, Ordering};
        static CLAIMED: AtomicBool = AtomicBool::new(false);
        (!CLAIMED.swap(true, Ordering::SeqCst)).then_some(ReapAll(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_pidfd_of_ourselves_takes_signal_zero_and_another_descriptor_is_refused() {
        // SAFETY: getpid has no preconditions.
        let fd = pidfd_open(unsafe { libc::getpid() }).unwrap();
        assert_eq!(pidfd_send_signal(fd.as_raw_fd(), 0), Ok(()));
        let file = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(pidfd_send_signal(file.as_raw_fd(), 0), Err(libc::EBADF));
        assert_eq!(
            pidfd_open(-1).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
    }

    #[test]
    fn groups_holds_what_getgroups_counts() {
        // SAFETY: getgroups with size 0 only counts.
        let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
        assert_eq!(groups().len(), n.max(0) as usize);
    }

    #[test]
    fn the_right_to_reap_every_child_is_given_once() {
        let first = ReapAll::claim();
        assert!(first.is_some());
        assert!(ReapAll::claim().is_none());
    }
}
