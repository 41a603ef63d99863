//! The floor under `policy/`, `sandbox/` and `exec/`: thin, safe-to-call-after-fork helpers over raw
//! syscalls that several layers share. Nothing here imports from the rest of the crate.
//!
//! - [`walk`]: resolving paths by walking `O_PATH|O_NOFOLLOW` descriptors;
//! - [`mount`]: the constants and structs of the new mount API (open_tree, mount_setattr,
//!   move_mount), which libc does not carry;
//! - [`process`]: pidfds (open, signal) and the calling process's groups;
//! - [`clone`]: a clone child on a stack of its own with every signal blocked;
//! - [`dirents`]: a directory's numbered entries (`/proc`'s tasks and descriptors), listed
//!   on a descriptor the caller keeps;
//! - [`forget`]: a fork dropping its copy of the supervisor's heaps;
//! - [`procstat`]: the fields of a `/proc/PID/stat` line, past the command name, and a
//!   one-record `/proc` file read in one read;
//! - [`errno`] and [`proc_fd_path`]: async-signal-safe building blocks of the child side;
//! - [`pipe`]: a pipe whose ends close on exec;
//! - [`random_u64`]: a random number straight from the kernel;
//! - [`shared_page`]: one page of memory shared with the children cloned after it is made.

pub mod clone;
pub mod dirents;
pub mod forget;
pub mod mount;
pub mod process;
pub mod procstat;
pub mod walk;

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// errno of the last failed libc call on this thread. Async-signal-safe.
pub fn errno() -> i32 {
    // SAFETY: __errno_location always returns a valid pointer to this thread's errno.
    unsafe { *libc::__errno_location() }
}

/// A random number from one `getrandom(2)`, for names nobody may guess ahead and for where a
/// search starts. Not `rand::random`: its generator is seeded on first use per thread, and the
/// seeding asks the CPU's features (`std_detect`), a dozen CPUID instructions, each a trap to
/// the hypervisor in a VM (≈ 6 µs apiece on the development VM): ≈ 70 µs of every `run`'s
/// start for one number.
pub fn random_u64() -> u64 {
    // getrandom(2) fails only before the kernel's pool is ready at boot (it would block) or
    // on a kernel older than 3.17: the thread's generator then, as before.
    getrandom::u64().unwrap_or_else(|_| rand::random())
}

/// A pipe (read end, write end), both ends O_CLOEXEC so that no exec'd program inherits them
/// unless handed them on purpose, plus `flags` (O_NONBLOCK, say). Async-signal-safe: one
/// syscall, no allocation.
pub fn pipe(flags: libc::c_int) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1; 2];
    // SAFETY: pipe2 writes two fds into our two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Take the exclusive flock on `fd` without waiting: `Ok(true)` when it was free, `Ok(false)`
/// when someone else holds it. A lock lives on the open description, released when its last
/// descriptor closes: how a supervisor marks the directories it owns, so that one whose lock
/// anyone can take has no live owner.
pub fn try_lock_exclusive(fd: BorrowedFd<'_>) -> io::Result<bool> {
    // SAFETY: flock on a descriptor the caller keeps open through the call.
    if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Ok(false);
    }
    Err(e)
}

/// One zeroed page, read-write, shared with every child cloned after this call (a fork keeps
/// `MAP_SHARED` mappings shared): where the timelines' children stamp their steps for the
/// parent to read. Never unmapped: it lives as long as the process.
pub fn shared_page() -> io::Result<std::ptr::NonNull<u8>> {
    // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing; nothing else
    // is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    std::ptr::NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))
}

/// "/proc/self/fd/N\0" into `buf`, without allocating (so usable between fork and exec).
pub fn proc_fd_path(buf: &mut [u8; 32], fd: RawFd) {
    let prefix = b"/proc/self/fd/";
    buf[..prefix.len()].copy_from_slice(prefix);
    let mut digits = [0u8; 12];
    let mut n = fd.max(0) as u32;
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        buf[prefix.len() + i] = digits[len - 1 - i];
    }
    buf[prefix.len() + len] = 0;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn pipe_ends_close_on_exec_and_take_the_flags_asked_for() {
        let flags = |fd: &OwnedFd, cmd| {
            // SAFETY: fcntl F_GETFD/F_GETFL on a descriptor we own.
            unsafe { libc::fcntl(fd.as_raw_fd(), cmd) }
        };
        let (r, w) = pipe(0).unwrap();
        for end in [&r, &w] {
            assert_eq!(
                flags(end, libc::F_GETFD) & libc::FD_CLOEXEC,
                libc::FD_CLOEXEC
            );
            assert_eq!(flags(end, libc::F_GETFL) & libc::O_NONBLOCK, 0);
        }
        let (r, w) = pipe(libc::O_NONBLOCK).unwrap();
        for end in [&r, &w] {
            assert_eq!(
                flags(end, libc::F_GETFD) & libc::FD_CLOEXEC,
                libc::FD_CLOEXEC
            );
            assert_eq!(
                flags(end, libc::F_GETFL) & libc::O_NONBLOCK,
                libc::O_NONBLOCK
            );
        }
        assert_eq!(
            pipe(-1).unwrap_err().raw_os_error(),
            Some(libc::EINVAL),
            "unknown flags are refused by the kernel, not ignored"
        );
    }

    #[test]
    fn fd_paths_are_written_without_allocating() {
        let mut b = [0u8; 32];
        proc_fd_path(&mut b, 1234);
        assert_eq!(&b[..19], b"/proc/self/fd/1234\0");
        proc_fd_path(&mut b, 0);
        assert_eq!(&b[..16], b"/proc/self/fd/0\0");
    }
}
