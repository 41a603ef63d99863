//! Idmapped mounts for the read-write grants: the sandbox's uid and gid seen as the owner's.
//!
//! A read-write grant (the workdir, `--rw`) that belongs to someone other than the sandbox
//! identity is bound into the view as an idmapped mount (`mount_setattr(MOUNT_ATTR_IDMAP)` on
//! the detached `open_tree` clone): through it the owner's uid and gid read as the sandbox's,
//! and the sandbox's as the owner's. It is a swap, every other id maps to itself, so root's
//! files in the tree stay root's and another user's stay theirs (with a one-line map they would
//! all read as the overflow uid, and `ls -l` would lie about who may write them). The command
//! runs as its own unprivileged uid; what it creates is stored as the owner's; nothing is
//! chowned; two runs in one tree (nested or not) each see the tree as their own.
//!
//! The kernel takes the mapping from a user namespace. [`userns`] makes a throwaway one: a
//! clone child that waits while we write its `uid_map` and `gid_map` and open its
//! `/proc/PID/ns/user`; the descriptor keeps the namespace (and so the mapping) alive after the
//! child is gone. The view's helper inherits it and hands it to `mount_setattr`.
//!
//! What the kernel requires, and so what falls back to the hand-over (exec/workdir):
//! - the filesystem must support idmapped mounts (ext4, xfs, btrfs, overlayfs, tmpfs since
//!   6.3; not ramfs, nfs, most FUSE): EINVAL otherwise;
//! - the caller needs CAP_SYS_ADMIN in the user namespace that owns the filesystem's
//!   superblock: a supervisor in a user namespace (non-root, or root in a pod with
//!   `hostUsers: false`) gets EPERM for every host filesystem. A non-root supervisor needs no
//!   mapping anyway: its child keeps its uid, which owns what it writes;
//! - a mount that is idmapped already (a volume the runtime idmapped) cannot be idmapped
//!   again: EPERM.
//!
//! Landlock still applies on top: its rules are on inodes, which the idmapped mount shares.
//! Which grants get a mapping, and what becomes of a refusal, is ownership.rs.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;

use crate::policy::Identity;
use crate::sys::clone;

/// The largest id a map may name: (uid_t)-1 is "no id".
const LAST_ID: u32 = u32::MAX - 1;

/// On disk `owner`, seen as `sandbox` (and the other way round); every other id unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdSwap {
    pub owner: Identity,
    pub sandbox: Identity,
}

impl IdSwap {
    /// The `uid_map` of the namespace: its ids (the left column) are the ids on disk, its
    /// parent's (the middle column) the ids the sandbox sees.
    pub fn uid_map(&self) -> String {
        swap_lines(self.owner.uid, self.sandbox.uid)
    }

    pub fn gid_map(&self) -> String {
        swap_lines(self.owner.gid, self.sandbox.gid)
    }
}

/// Map lines that swap `a` and `b` and map every other id to itself: at most five extents,
/// the limit of kernels before 4.15. Extents may not overlap on either side, hence the gaps.
fn swap_lines(a: u32, b: u32) -> String {
    let mut out = String::new();
    let mut line = |inside: u32, outside: u32, count: u32| {
        if count > 0 {
            out.push_str(&format!("{inside} {outside} {count}\n"));
        }
    };
    if a == b {
        line(0, 0, LAST_ID + 1);
        return out;
    }
    let (lo, hi) = (a.min(b), a.max(b));
    line(0, 0, lo);
    line(lo, hi, 1);
    line(lo + 1, lo + 1, hi - lo - 1);
    line(hi, lo, 1);
    if hi < LAST_ID {
        line(hi + 1, hi + 1, LAST_ID - hi);
    }
    out
}

/// A user namespace made by [`userns`]: `fd` holds it. Dropping this reaps the throwaway child
/// that made it (let go at once, it exits while the caller goes on).
#[derive(Debug)]
pub struct UserNs {
    pub fd: OwnedFd,
    _child: Child,
}

/// What the clone child of [`userns`] runs on: it reads `Args` and runs on `stack`, both ours,
/// so both live until it is reaped.
#[derive(Debug)]
struct Child {
    pid: libc::pid_t,
    _args: Box<Args>,
    _stack: clone::Stack,
}

#[derive(Debug)]
struct Args {
    r: i32,
    w: i32,
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = clone::wait_clone(self.pid);
    }
}

/// A user namespace whose maps are `swap`'s.
pub fn userns(swap: &IdSwap) -> io::Result<UserNs> {
    let (r, w) = crate::sys::pipe(0)?;
    extern "C" fn entry(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` points at the boxed `Args` of our `Child`, alive until we are reaped;
        // only raw syscalls on two integers follow.
        unsafe {
            let a = &*(arg as *const Args);
            // Our copy of the write end would keep the read below from ever seeing EOF.
            libc::close(a.w);
            let mut b = 0u8;
            while libc::read(a.r, (&mut b as *mut u8).cast(), 1) < 0
                && crate::sys::errno() == libc::EINTR
            {}
            libc::_exit(0)
        }
    }
    let args = Box::new(Args {
        r: std::os::fd::AsRawFd::as_raw_fd(&r),
        w: std::os::fd::AsRawFd::as_raw_fd(&w),
    });
    let mut stack = clone::Stack::new(16 * 1024);
    // The child shares our memory (CLONE_VM: no copy of the supervisor's page tables) but not
    // our descriptors, and runs only `entry` on its own stack, with every signal blocked.
    // Exit signal 0: a "clone child" that the reaper thread's waitid(P_ALL) never sees; `Child`
    // reaps it with waitpid(__WCLONE). Not CLONE_VFORK: we must run while it waits, to write
    // its maps (only a writer in the parent namespace may map ids other than its own).
    // SAFETY: `stack` and `args` move into the `Child` that reaps the clone before it frees
    // them; `entry` makes raw syscalls on two integers only.
    let pid = unsafe {
        clone::clone_signals_blocked(
            entry,
            &mut stack,
            libc::CLONE_NEWUSER | libc::CLONE_VM,
            (&*args as *const Args).cast_mut().cast(),
        )
    }?;
    let child = Child {
        pid,
        _args: args,
        _stack: stack,
    };
    let fd = (|| {
        let proc = Path::new("/proc").join(pid.to_string());
        std::fs::write(proc.join("uid_map"), swap.uid_map())?;
        std::fs::write(proc.join("gid_map"), swap.gid_map())?;
        let c = std::ffi::CString::new(proc.join("ns/user").into_os_string().into_encoded_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: open with a NUL-terminated path.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: just opened, owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    })();
    // Let it go now: it exits while the view is built, and is reaped when `UserNs` is dropped
    // (waiting for it here cost a few milliseconds of scheduling on a loaded machine).
    drop(w);
    drop(r);
    Ok(UserNs {
        fd: fd?,
        _child: child,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(uid: u32, gid: u32) -> Identity {
        Identity { uid, gid }
    }

    /// Parse map lines and say what `id` on disk is seen as.
    fn seen(map: &str, id: u32) -> Option<u32> {
        map.lines().find_map(|l| {
            let v: Vec<u64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
            let (inside, outside, n) = (v[0], v[1], v[2]);
            (u64::from(id) >= inside && u64::from(id) < inside + n)
                .then(|| (outside + u64::from(id) - inside) as u32)
        })
    }

    #[test]
    fn a_swap_maps_the_pair_both_ways_and_everything_else_to_itself() {
        for (a, b) in [
            (65534, 1_900_000_005),
            (0, 1_900_000_005),
            (1000, 1001),
            (0, 1),
            (7, LAST_ID),
            (0, LAST_ID),
        ] {
            let m = swap_lines(a, b);
            assert!(m.lines().count() <= 5, "{m}");
            assert_eq!(seen(&m, a), Some(b), "{m}");
            assert_eq!(seen(&m, b), Some(a), "{m}");
            for other in [0, 1, 2, 1000, 65533, 65535, LAST_ID - 1, LAST_ID] {
                if other != a && other != b {
                    assert_eq!(seen(&m, other), Some(other), "{other} in {m}");
                }
            }
            // No extent overlaps another, on either side.
            let mut ext: Vec<(u64, u64, u64)> = m
                .lines()
                .map(|l| {
                    let v: Vec<u64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
                    (v[0], v[1], v[2])
                })
                .collect();
            for side in [0, 1] {
                ext.sort_by_key(|e| if side == 0 { e.0 } else { e.1 });
                for w in ext.windows(2) {
                    let (s0, s1) = if side == 0 {
                        (w[0].0, w[1].0)
                    } else {
                        (w[0].1, w[1].1)
                    };
                    assert!(s0 + w[0].2 <= s1, "{m}");
                }
            }
            assert_eq!(seen(&m, u32::MAX), None, "(uid_t)-1 is never mapped: {m}");
        }
        assert_eq!(swap_lines(5, 5), "0 0 4294967295\n");
    }

    #[test]
    fn a_user_namespace_with_a_swap_map_is_made_when_root() {
        if crate::sys::process::euid() != 0 {
            eprintln!("SKIPPED: writing another process's uid_map needs root");
            return;
        }
        let ns = userns(&IdSwap {
            owner: id(65534, 65534),
            sandbox: id(1_900_000_005, 1_900_000_006),
        })
        .unwrap();
        let fd = ns.fd;
        // The namespace outlives its only process: the descriptor holds it.
        let link = std::fs::read_link(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&fd)
        ))
        .unwrap();
        assert!(link.to_string_lossy().starts_with("user:["), "{link:?}");
    }
}
