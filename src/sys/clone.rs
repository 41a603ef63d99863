//! A clone child that shares our memory and runs one function on a stack of its own, with
//! every signal blocked: the idiom of `exec/workdir.rs` (a question asked as another uid) and
//! `sandbox/idmap.rs` (a user namespace with given maps), which a vfork-like child of a
//! multi-threaded process needs.

use std::io;

/// The stack of a clone child. It must outlive the child: keep it until the child is reaped.
pub struct Stack(Vec<u8>);

impl Stack {
    pub fn new(size: usize) -> Stack {
        Stack(vec![0u8; size])
    }

    /// The 16-byte-aligned top, where a stack growing down starts.
    fn top(&mut self) -> *mut libc::c_void {
        ((self.0.as_mut_ptr() as usize + self.0.len()) & !15) as *mut libc::c_void
    }
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stack({} bytes)", self.0.len())
    }
}

/// `clone(entry, stack, flags, arg)` with every signal blocked in the child: the mask is
/// inherited, and ours is restored as soon as the call returns. A handler of ours must never
/// run on the child's stack, in our memory. Returns the child's pid.
///
/// # Safety
/// `entry` may only make raw syscalls on what `arg` points at; `arg` and `stack` must stay
/// alive until the child has exited (with `CLONE_VFORK` that is when this returns) and the
/// child must be reaped by the caller (with `__WCLONE` when `flags` has no exit signal).
pub unsafe fn clone_signals_blocked(
    entry: extern "C" fn(*mut libc::c_void) -> libc::c_int,
    stack: &mut Stack,
    flags: libc::c_int,
    arg: *mut libc::c_void,
) -> io::Result<libc::pid_t> {
    let top = stack.top();
    // SAFETY: sigset operations on stack values; the clone's safety is the caller's (above).
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(entry, top, flags, arg);
        let e = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid < 0 { Err(e) } else { Ok(pid) }
    }
}

/// Wait for the clone child `pid` (no exit signal: `__WCLONE`), through EINTR; its status.
pub fn wait_clone(pid: libc::pid_t) -> io::Result<i32> {
    let mut status = 0;
    loop {
        // SAFETY: waitpid on our own child with a stack status.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::__WCLONE) };
        if r == pid {
            return Ok(status);
        }
        let e = io::Error::last_os_error();
        if r < 0 && e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vfork_clone_runs_its_entry_and_its_status_comes_back() {
        extern "C" fn entry(arg: *mut libc::c_void) -> libc::c_int {
            // SAFETY: `arg` points at the i32 below, alive while we run (CLONE_VFORK).
            unsafe { libc::_exit(*(arg as *const i32)) }
        }
        let mut code = 7i32;
        let mut stack = Stack::new(16 * 1024);
        // SAFETY: `entry` only reads `code` and exits; both outlive the vfork child.
        let pid = unsafe {
            clone_signals_blocked(
                entry,
                &mut stack,
                libc::CLONE_VM | libc::CLONE_VFORK,
                (&mut code as *mut i32).cast(),
            )
        }
        .unwrap();
        let status = wait_clone(pid).unwrap();
        assert!(libc::WIFEXITED(status));
        assert_eq!(libc::WEXITSTATUS(status), 7);
    }
}
