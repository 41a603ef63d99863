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
pub struct Switch {
    /// Switch to this identity (we are root). `None`: keep ours (we are not root).
    pub target: Option<Identity>,
    /// Highest capability number this kernel knows (/proc/sys/kernel/cap_last_cap).
    pub last_cap: u32,
}

pub fn prepare(target: Option<Identity>) -> Switch {
    let last_cap = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63);
    Switch { target, last_cap }
}

use crate::sandbox::step::{ChildError, Step};

fn check(rc: libc::c_long, step: Step) -> Result<(), ChildError> {
    if rc < 0 {
        Err(ChildError::last(step))
    } else {
        Ok(())
    }
}

/// Drop to the target identity with no capabilities left in any set, then set no_new_privs.
/// Async-signal-safe.
pub fn enforce(p: &Switch) -> Result<(), ChildError> {
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
            // Each drop commits a new set of credentials (~2 us); a read commits nothing, and
            // `serve`'s execs inherit a set emptied ahead ([`drop_bounding_set_ahead`]), so
            // only what is still held is dropped. Whatever path got us here, every capability
            // is read back as absent or dropped now.
            for cap in 0..=p.last_cap {
                let held = libc::prctl(libc::PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0);
                if held == 0 {
                    continue;
                }
                if held < 0
                    || libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) != 0
                {
                    // EINVAL: past the kernel's last capability (cap_last_cap was unreadable,
                    // e.g. no /proc in a chroot, and we guessed high). Every real one is gone.
                    if crate::sys::errno() == libc::EINVAL && cap > 0 {
                        break;
                    }
                    return Err(ChildError {
                        step: Step::DropBounding,
                        detail: cap as u8,
                        errno: crate::sys::errno(),
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

/// Empty the bounding set of the calling *thread* (credentials are per thread, and a clone
/// copies the caller's): every process that thread clones from then on starts with an empty
/// bounding set, and [`enforce`] in it only reads each capability back instead of dropping it,
/// one credential commit each. For the process-manager thread, which clones every exec of
/// `serve`, and `run`'s exec init while it waits for the go: neither execs anything that needs
/// a capability (their effective sets stay whole). Best effort: without CAP_SETPCAP nothing
/// is dropped, and [`enforce`] drops what is left.
pub fn drop_bounding_set_ahead() {
    for cap in 0..=63 {
        // SAFETY: prctl with integer arguments; it changes only this thread's credentials.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } != 0 {
            // EINVAL past the kernel's last capability; EPERM without CAP_SETPCAP.
            return;
        }
    }
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

/// Supplementary groups of the calling process other than its own gids, each with its name
/// from /etc/group when it has one. A non-root process cannot drop these (setgroups needs
/// CAP_SETGID), so every child of a non-root supervisor inherits them.
pub fn supplementary_groups() -> Vec<(libc::gid_t, Option<String>)> {
    // In the supervisor's own user namespace, unmapped groups read as the overflow gid: use
    // the list taken before it was entered (the kernel still checks the real groups).
    let mut gids = crate::sandbox::namespaces::groups_before_user_ns()
        .unwrap_or_else(crate::sys::process::groups);
    let (gid, egid) = (crate::sys::process::gid(), crate::sys::process::egid());
    gids.retain(|&g| g != gid && g != egid);
    gids.sort_unstable();
    gids.dedup();
    // Plain /etc/group, no NSS: the names only make the error readable.
    let table = std::fs::read_to_string("/etc/group").unwrap_or_default();
    gids.into_iter()
        .map(|g| {
            let name = table.lines().find_map(|l| {
                let mut f = l.split(':');
                let name = f.next()?;
                let id: libc::gid_t = f.nth(1)?.parse().ok()?;
                (id == g).then(|| name.to_owned())
            });
            (g, name)
        })
        .collect()
}

/// `4 (adm), 6 (disk)`.
pub fn describe_groups(groups: &[(libc::gid_t, Option<String>)]) -> String {
    groups
        .iter()
        .map(|(g, n)| match n {
            Some(n) => format!("{g} ({n})"),
            None => g.to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where the per-uid lock files of [`UidLease`] live by default: root-only (0700), outside
/// every grant, and on tmpfs so a reboot frees every lease. Each pod has a `/run` of its own,
/// so runs in two pods of one node need a directory both see ([`set_lease_dir`]; the chart
/// mounts a node-wide hostPath there).
pub const UID_LOCK_DIR: &str = "/run/openshell-sandbox-uids";

static LEASE_DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// Keep the leases (and workdir locks) of this process in `dir` instead of [`UID_LOCK_DIR`]:
/// `run --uid-lease-dir`. Called once, before the first lease; a later call changes nothing.
pub fn set_lease_dir(dir: std::path::PathBuf) {
    let _ = LEASE_DIR.set(dir);
}

/// The lease directory in use.
pub fn lease_dir() -> &'static std::path::Path {
    LEASE_DIR
        .get()
        .map_or(std::path::Path::new(UID_LOCK_DIR), |p| p.as_path())
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("preparing the uid lease directory {dir}: {1}", dir = .0.display())]
    LockDir(std::path::PathBuf, std::io::Error),
    #[error(
        "the uid lease directory {} is not a directory of root's that only root can write (owner {owner}, mode {mode:04o}); refusing to trust its locks",
        path.display()
    )]
    UntrustedLockDir {
        path: std::path::PathBuf,
        owner: u32,
        mode: u32,
    },
    #[error("locking uid {uid}: {source}")]
    Lock { uid: u32, source: std::io::Error },
    #[error("every uid of --uid-range {start}-{end} is held by a running run")]
    Exhausted { start: u32, end: u32 },
    #[error(
        "uid {uid} is the per-run uid of a running run (its lease is in {}): two runs under one uid share its kernel budgets and can reach each other's files; pass another --uid, one outside --uid-range, or none",
        dir.display()
    )]
    UidInUse { uid: u32, dir: std::path::PathBuf },
}

/// One uid, held for as long as this value lives: a flock on `<lease dir>/<uid>`. A per-run
/// uid holds it exclusively ([`UidLease::take`]); a uid named explicitly (`--uid`, the policy
/// file's `run_as_user`) holds it shared ([`UidLease::share`]), so runs that name one uid
/// together may share it, and no per-run run gets a uid an explicit one is using, nor the
/// other way round. The kernel drops the lock when the holder dies, however it dies, so a
/// crashed run never leaks its uid.
#[derive(Debug)]
pub struct UidLease {
    pub uid: u32,
    _lock: std::os::fd::OwnedFd,
}

/// The lock directory, made if missing, refused unless it is root's and 0700. (The workdir
/// claims of exec/workdir keep their lock files here too.)
pub(crate) fn lock_dir() -> Result<std::os::fd::OwnedFd, LeaseError> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let dir = lease_dir();
    let err = |e: std::io::Error| LeaseError::LockDir(dir.to_path_buf(), e);
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| err(std::io::Error::from_raw_os_error(libc::EINVAL)))?;
    // SAFETY: mkdir with a NUL-terminated path.
    if unsafe { libc::mkdir(path.as_ptr(), 0o700) } != 0 && crate::sys::errno() != libc::EEXIST {
        return Err(err(std::io::Error::last_os_error()));
    }
    // SAFETY: open with a NUL-terminated path; O_NOFOLLOW so a planted link is never our
    // lock dir.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    // SAFETY: fd was just opened and is ours.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: fstat into a zeroed stack struct.
    let st = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd.as_raw_fd(), &mut st) != 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
        st
    };
    // Anyone else able to write here could hold our locks (or swap the files under us). A
    // group- or world-readable directory is fine (kubelet makes a hostPath 0755): the lock
    // files themselves are root's 0600, so nobody else can open one to hold it.
    if st.st_uid != 0 || st.st_mode & 0o022 != 0 {
        return Err(LeaseError::UntrustedLockDir {
            path: dir.to_path_buf(),
            owner: st.st_uid,
            mode: st.st_mode & 0o7777,
        });
    }
    Ok(fd)
}

/// Open (creating it) the lock file `name` of the lock directory and try a flock on it
/// (`LOCK_EX` or `LOCK_SH`): `Ok(Some(fd))` held, `Ok(None)` held by someone else in a way
/// that excludes ours (EWOULDBLOCK).
fn try_lock(
    dir: &std::os::fd::OwnedFd,
    name: &str,
    how: libc::c_int,
) -> std::io::Result<Option<std::os::fd::OwnedFd>> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let name = std::ffi::CString::new(name)
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: openat relative to our directory fd with a NUL-terminated name.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is ours.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: flock on our fd.
    if unsafe { libc::flock(fd.as_raw_fd(), how | libc::LOCK_NB) } == 0 {
        return Ok(Some(fd));
    }
    match crate::sys::errno() {
        libc::EWOULDBLOCK => Ok(None),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

impl UidLease {
    /// Take a free uid of `start..=end` for this run alone, trying from a random point so
    /// that concurrent supervisors rarely contend for the same file. A uid that any other
    /// run holds, per-run or explicit, is skipped.
    pub fn take(start: u32, end: u32) -> Result<UidLease, LeaseError> {
        let dir = lock_dir()?;
        let n = u64::from(end - start) + 1;
        let first = crate::sys::random_u64() % n;
        for i in 0..n {
            let uid = start + ((first + i) % n) as u32;
            match try_lock(&dir, &uid.to_string(), libc::LOCK_EX) {
                Ok(Some(fd)) => return Ok(UidLease { uid, _lock: fd }),
                Ok(None) => continue,
                Err(source) => return Err(LeaseError::Lock { uid, source }),
            }
        }
        Err(LeaseError::Exhausted { start, end })
    }

    /// Hold `uid`, named explicitly, for this run: shared with other runs that name it, refused
    /// while a run holds it as its per-run uid. `None` where the lease directory neither
    /// exists nor can be made (a read-only `/run`): no per-run uid can be held there either.
    pub fn share(uid: u32) -> Result<Option<UidLease>, LeaseError> {
        let dir = match lock_dir() {
            Ok(d) => d,
            Err(LeaseError::LockDir(path, e))
                if matches!(e.raw_os_error(), Some(libc::EROFS | libc::ENOENT)) =>
            {
                tracing::debug!(dir = %path.display(), error = %e, "no uid lease directory: an explicit uid needs no lease here");
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        match try_lock(&dir, &uid.to_string(), libc::LOCK_SH) {
            Ok(Some(fd)) => Ok(Some(UidLease { uid, _lock: fd })),
            Ok(None) => Err(LeaseError::UidInUse {
                uid,
                dir: lease_dir().to_path_buf(),
            }),
            Err(source) => Err(LeaseError::Lock { uid, source }),
        }
    }
}
