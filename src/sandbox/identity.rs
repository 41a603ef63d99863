//! Identity layer: supplementary groups, gid, uid, every capability set, securebits and
//! no_new_privs. All of it runs in the child between fork and exec, as raw syscalls on values
//! computed before fork (glibc's setuid family would broadcast to other threads through a
//! signal; the forked child has one thread, but the raw calls make that explicit).

use crate::policy::Identity;

// linux/securebits.h
const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
const SECBIT_NO_SETUID_FIXUP_LOCKED: libc::c_ulong = 1 << 3;
const SECBIT_KEEP_CAPS_LOCKED: libc::c_ulong = 1 << 5;
const SECBIT_NO_CAP_AMBIENT_RAISE: libc::c_ulong = 1 << 6;
const SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED: libc::c_ulong = 1 << 7;

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Everything the child needs, computed before fork.
#[derive(Debug, Clone, Copy)]
pub struct Prepared {
    /// Switch to this identity (we are root). `None`: keep ours (we are not root).
    pub target: Option<Identity>,
    /// Highest capability number this kernel knows (/proc/sys/kernel/cap_last_cap).
    pub last_cap: u32,
}

pub fn prepare(target: Option<Identity>) -> Prepared {
    let last_cap = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63);
    Prepared { target, last_cap }
}

use crate::sandbox::{ChildError, Step};

fn check(rc: libc::c_long, step: Step) -> Result<(), ChildError> {
    if rc < 0 {
        Err(ChildError::last(step))
    } else {
        Ok(())
    }
}

/// Drop to the target identity with no capabilities left in any set, then set no_new_privs.
/// Async-signal-safe.
pub fn enforce(p: &Prepared) -> Result<(), ChildError> {
    // SAFETY: raw prctl/syscalls with integer arguments or pointers to
    // stack values that outlive the call.
    unsafe {
        // Ambient capabilities survive execve of unprivileged programs; clear them first.
        check(
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            )
            .into(),
            Step::ClearAmbient,
        )?;
        if let Some(id) = p.target {
            // While we still hold CAP_SETPCAP: lock in "root gets no capabilities on exec"
            // (matters when the target uid is 0) and forbid raising ambient capabilities.
            let bits = SECBIT_NOROOT
                | SECBIT_NOROOT_LOCKED
                | SECBIT_NO_SETUID_FIXUP_LOCKED
                | SECBIT_KEEP_CAPS_LOCKED
                | SECBIT_NO_CAP_AMBIENT_RAISE
                | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
            check(
                libc::prctl(libc::PR_SET_SECUREBITS, bits, 0, 0, 0).into(),
                Step::Securebits,
            )?;
            // The bounding set can only shrink with CAP_SETPCAP, so this comes before setuid.
            for cap in 0..=p.last_cap {
                if libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) != 0 {
                    // EINVAL: past the kernel's last capability (cap_last_cap was unreadable,
                    // e.g. no /proc in a chroot, and we guessed high). Every real one is gone.
                    if crate::sandbox::errno() == libc::EINVAL && cap > 0 {
                        break;
                    }
                    return Err(ChildError {
                        step: Step::DropBounding,
                        detail: cap as u8,
                        errno: crate::sandbox::errno(),
                    });
                }
            }
            // Groups before gid before uid: each needs a capability the next step removes.
            check(
                libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>()),
                Step::Setgroups,
            )?;
            check(
                libc::syscall(libc::SYS_setresgid, id.gid, id.gid, id.gid),
                Step::Setresgid,
            )?;
            check(
                libc::syscall(libc::SYS_setresuid, id.uid, id.uid, id.uid),
                Step::Setresuid,
            )?;
            // Verify rather than trust: a partial switch must never reach exec.
            let (mut r, mut e, mut s) = (0, 0, 0);
            libc::getresuid(&mut r, &mut e, &mut s);
            if r != id.uid || e != id.uid || s != id.uid {
                return Err(ChildError::new(Step::VerifyUid, libc::EPERM));
            }
            libc::getresgid(&mut r, &mut e, &mut s);
            if r != id.gid || e != id.gid || s != id.gid {
                return Err(ChildError::new(Step::VerifyGid, libc::EPERM));
            }
        }
        // Empty effective, permitted and inheritable sets. Lowering is always allowed.
        let mut hdr = CapHeader {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let data = [CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        check(
            libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()),
            Step::Capset,
        )?;
        // no_new_privs: setuid/setgid bits and file capabilities are ignored by every later
        // execve, and it is what allows an unprivileged process to install seccomp and
        // Landlock, so it must come before both.
        check(
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0).into(),
            Step::NoNewPrivs,
        )?;
    }
    Ok(())
}

/// Capabilities the calling process holds right now, by name (for `check`).
pub fn current_caps() -> Vec<String> {
    caps::read(None, caps::CapSet::Effective)
        .map(|set| {
            let mut v: Vec<String> = set.iter().map(|c| c.to_string()).collect();
            v.sort();
            v
        })
        .unwrap_or_default()
}
