//! The workdir and the read-write grants on the supervisor's side: whether the sandbox can
//! write its workdir, asked of the kernel as the identity it writes as; the claim every
//! sandbox holds on its grants (claim.rs); and `run`'s hand-over where idmapped mounts are
//! refused (handover.rs).
//!
//! Guessing writability from the mode bits gets group membership, ACLs, read-only mounts and
//! uid 0 without capabilities wrong. So a throwaway child takes exactly the identity the exec
//! will have (no supplementary groups, the gid, the uid, every capability set empty) and asks
//! `faccessat2(AT_EACCESS)` for write and search. The supervisor's own credentials never
//! change. Through an idmapped mount the kernel checks the command as the directory's owner
//! (sandbox/idmap.rs), so that is whom the question is asked as then.

mod claim;
mod handover;

use std::ffi::CString;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

pub use claim::ClaimError;
pub use handover::{HandOverError, MAX_DEPTH};

use crate::policy::{Identity, Policy, WriteAs};
use crate::sandbox::Prepared;
use crate::sys::clone;

/// A workdir the sandbox cannot write.
#[derive(Debug, thiserror::Error)]
#[error(
    "the workdir {} is not writable by {} {} (gid {}): it is owned by {}:{} with mode {:04o} ({source}). {}",
    path.display(),
    if *as_owner { "its owner, as whom the sandbox writes there (an idmapped mount), uid" } else { "the sandbox uid" },
    who.uid, who.gid, owner, group, mode,
    if *as_owner {
        format!("Give its owner write permission (`chmod u+w {}`)", path.display())
    } else {
        format!(
            "Give it to the sandbox (`chown {}:{} {}`{}), or run as a uid that can write it (--uid)",
            chown_to.uid, chown_to.gid, path.display(),
            if chown_to == who { "" } else { "; run hands a workdir of 65534 to its per-run uid where it cannot map it" }
        )
    }
)]
pub struct NotWritable {
    pub path: PathBuf,
    /// Whom the kernel was asked as.
    pub who: Identity,
    /// `who` is the directory's owner, seen as the sandbox through an idmapped mount (or about
    /// to be handed to it).
    pub as_owner: bool,
    /// Whom to give it to: `who`, or 65534 for `run`'s per-run uid (which changes every run).
    pub chown_to: Identity,
    pub owner: u32,
    pub group: u32,
    pub mode: u32,
    /// What the kernel answered.
    pub source: io::Error,
}

/// Ask the kernel whether `who` may create entries in `dir` (write and search). `None` is the
/// caller's own identity (a non-root supervisor's child keeps it). Reads only: the answer comes
/// from a forked child that exits at once.
pub fn can_write(dir: &Path, who: Option<Identity>) -> io::Result<()> {
    can_access(dir, who, libc::W_OK | libc::X_OK)
}

/// Ask the kernel whether `who` has `mode` (`R_OK`, `W_OK`, `X_OK`) on `path` by its
/// permissions alone (DAC: Landlock is not in force in the asking child). As [`can_write`].
pub fn can_access(path: &Path, who: Option<Identity>, mode: i32) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let Some(id) = who else {
        return access(&c, mode).map_err(io::Error::from_raw_os_error);
    };
    // The child shares our memory until it exits (CLONE_VM|CLONE_VFORK, as posix_spawn does):
    // we are suspended meanwhile, and a full fork of the supervisor (its page tables, then the
    // copy-on-write faults on both sides) cost more than the question. It runs on a stack of
    // its own, makes raw syscalls only on `args` (prepared before; credentials are per task,
    // so its setresuid never reaches us), and _exits. Its exit signal is 0 rather than
    // SIGCHLD: a "clone child", which the reaper thread's waitid(P_ALL) without __WALL never
    // sees, so only the waitpid(__WCLONE) below reaps it. Every signal stays blocked in it
    // (the mask is inherited; ours is restored once it is gone): a handler of ours must not
    // run on its stack, in our memory.
    struct Args<'a> {
        path: &'a CString,
        id: Identity,
        mode: i32,
    }
    extern "C" fn entry(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` points at the `Args` below, alive while we run (the parent is
        // suspended until we exit); this is the single-threaded clone child.
        unsafe {
            let a = &*(arg as *const Args);
            libc::_exit(as_identity(a.path, a.id, a.mode))
        }
    }
    let args = Args { path: &c, id, mode };
    let mut stack = clone::Stack::new(64 * 1024);
    // SAFETY: the clone runs `entry` on `stack` with `args`, which both outlive it
    // (CLONE_VFORK: we resume after its exit), and is reaped below.
    let pid = unsafe {
        clone::clone_signals_blocked(
            entry,
            &mut stack,
            libc::CLONE_VM | libc::CLONE_VFORK,
            (&args as *const Args).cast_mut().cast(),
        )
    }?;
    let status = clone::wait_clone(pid)?;
    match (libc::WIFEXITED(status), libc::WEXITSTATUS(status)) {
        (true, 0) => Ok(()),
        (true, errno) => Err(io::Error::from_raw_os_error(errno)),
        _ => Err(io::Error::from_raw_os_error(libc::ECHILD)),
    }
}

/// The exec's identity change (the order of `sandbox::identity::enforce`: groups, gid, uid,
/// then every capability set emptied), then the access question. Returns 0 or the errno,
/// as the child's exit status (every errno fits in 8 bits).
///
/// # Safety
/// Only for a fresh clone child: it changes the calling task's credentials for good.
unsafe fn as_identity(path: &CString, id: Identity, mode: i32) -> i32 {
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    // SAFETY: raw credential syscalls with integer arguments or pointers to stack values.
    unsafe {
        if libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>()) != 0
            || libc::syscall(libc::SYS_setresgid, id.gid, id.gid, id.gid) != 0
            || libc::syscall(libc::SYS_setresuid, id.uid, id.uid, id.uid) != 0
        {
            return crate::sys::errno();
        }
        // For uid 0 the switch above keeps every capability; the exec has none (securebits
        // NOROOT), so neither may the question: CAP_DAC_OVERRIDE would answer yes to anything.
        let mut hdr = Header {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let data = [Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        if libc::syscall(libc::SYS_capset, &mut hdr as *mut Header, data.as_ptr()) != 0 {
            return crate::sys::errno();
        }
    }
    match access(path, mode) {
        Ok(()) => 0,
        Err(e) => e,
    }
}

/// faccessat2 with AT_EACCESS: the effective ids and capabilities, which is what open(2) and
/// mkdir(2) use. Plain access(2) would use the real ids; without faccessat2 (Linux < 5.8) that
/// is what we fall back to, which only the non-root case can tell apart (there the real and
/// effective ids of a supervisor are the same anyway).
fn access(path: &CString, mode: i32) -> Result<(), i32> {
    // SAFETY: faccessat2 with a NUL-terminated path and integer flags.
    let r = unsafe {
        libc::syscall(
            libc::SYS_faccessat2,
            libc::AT_FDCWD,
            path.as_ptr(),
            mode,
            libc::AT_EACCESS,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = crate::sys::errno();
    if e != libc::ENOSYS {
        return Err(e);
    }
    // SAFETY: access with a NUL-terminated path.
    if unsafe { libc::access(path.as_ptr(), mode) } == 0 {
        Ok(())
    } else {
        Err(crate::sys::errno())
    }
}

/// `run`'s question before its command runs: may the command write its workdir, and if not,
/// what to tell the user ([`NotWritable`]'s fields).
#[derive(Debug, Clone, Copy)]
pub struct WritableCheck {
    /// As whom the kernel checks the command there.
    pub who: Identity,
    pub chown_to: Identity,
    /// `who` is the directory's owner (an idmapped mount, or a hand-over).
    pub as_owner: bool,
}

impl WritableCheck {
    /// Ask here, in a child of ours with `who`'s identity ([`check_writable`]).
    pub fn ask(&self, dir: &Path) -> Result<(), Box<NotWritable>> {
        check_writable(dir, self.who, self.chown_to, self.as_owner)
    }

    /// The error for `dir` when the command itself was refused write or search there.
    pub fn refused(&self, dir: &Path, source: io::Error) -> Box<NotWritable> {
        not_writable(dir, self.who, self.chown_to, self.as_owner, source)
    }
}

/// [`can_write`], with the owner and mode of `dir` in the error for the message. `as_owner`:
/// `who` is the directory's owner, as whom the sandbox writes there.
pub fn check_writable(
    dir: &Path,
    who: Identity,
    chown_to: Identity,
    as_owner: bool,
) -> Result<(), Box<NotWritable>> {
    let Err(source) = can_write(dir, Some(who)) else {
        return Ok(());
    };
    Err(not_writable(dir, who, chown_to, as_owner, source))
}

fn not_writable(
    dir: &Path,
    who: Identity,
    chown_to: Identity,
    as_owner: bool,
    source: io::Error,
) -> Box<NotWritable> {
    let meta = std::fs::metadata(dir).ok();
    Box::new(NotWritable {
        path: dir.to_path_buf(),
        who,
        as_owner,
        chown_to,
        owner: meta.as_ref().map_or(u32::MAX, |m| m.uid()),
        group: meta.as_ref().map_or(u32::MAX, |m| m.gid()),
        mode: meta.as_ref().map_or(0, |m| m.mode() & 0o7777),
        source,
    })
}

/// `serve`: a workdir that does not exist is created (its missing parents too, root's, 0755),
/// the last component owned by the sandbox identity and of mode 0755, as OpenShell creates
/// the read-write paths of a policy. Returns whether it created it. An existing path is left
/// as it is.
pub fn create_missing(dir: &Path, owner: Option<Identity>) -> io::Result<bool> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    match std::fs::symlink_metadata(dir) {
        Ok(_) => return Ok(false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::DirBuilder::new().create(dir) {
        Ok(()) => {}
        // Made by someone else meanwhile: theirs, not ours to re-own.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(false),
        Err(e) => return Err(e),
    }
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: open with a NUL-terminated path; O_NOFOLLOW|O_DIRECTORY so what we re-own is the
    // directory just made, never something a link points to.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is ours.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: fchmod and fchown on our fd.
    unsafe {
        if libc::fchmod(fd.as_raw_fd(), 0o755) != 0 {
            return Err(io::Error::last_os_error());
        }
        if let Some(id) = owner
            && libc::fchown(fd.as_raw_fd(), id.uid, id.gid) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(true)
}

/// `serve`, before the policy is built: create a missing workdir for the sandbox identity
/// (`--uid`/`--gid`, else 65534, when we are root). A failure is logged; building the policy
/// then names the missing workdir.
pub fn serve_create(args: &crate::cli::PolicyArgs, default_workdir: &Path) {
    let dir = args
        .workdir
        .clone()
        .unwrap_or_else(|| default_workdir.to_path_buf());
    let root = crate::sys::process::euid() == 0;
    let owner = root.then(|| {
        let uid = args.uid.unwrap_or(crate::policy::NOBODY);
        Identity {
            uid,
            gid: args.gid.unwrap_or(if args.uid.is_some() {
                uid
            } else {
                crate::policy::NOBODY
            }),
        }
    });
    match create_missing(&dir, owner) {
        Ok(true) => tracing::info!(workdir = %dir.display(), owner = ?owner, "created the workdir"),
        Ok(false) => {}
        Err(e) => {
            tracing::error!(workdir = %dir.display(), error = %e, "cannot create the workdir")
        }
    }
}

/// `serve`, once the policy is built: a workdir the sandbox identity cannot write is a loud
/// error in the log. Not a refusal: a pod may mean its workdir to be read-only, and the
/// gateway would only see a crash loop.
pub fn serve_check(policy: &crate::policy::Policy) {
    let root = crate::sys::process::euid() == 0;
    if let (true, Some(id)) = (root, policy.identity)
        && let Err(e) = check_writable(&policy.fs.workdir, id, id, false)
    {
        tracing::error!("{e}; every write of the sandbox's commands there will fail");
    }
}

/// Why a sandbox cannot hold its grants.
#[derive(Debug, thiserror::Error)]
pub enum HoldError {
    #[error(transparent)]
    Claim(#[from] ClaimError),
    #[error(transparent)]
    HandOver(#[from] HandOverError),
    #[error("{0}")]
    NotWritable(Box<NotWritable>),
}

/// A sandbox's hold on its read-write grants, for as long as it lives: its claim and, where the
/// workdir was handed over, the hand-over (given back first when dropped, then the claim is let
/// go).
#[derive(Debug, Default)]
pub struct Held {
    _handed: Option<handover::Handed>,
    _claim: claim::Claim,
}

/// Claim the workdir and the `--rw` grants of a prepared sandbox and, when `prepare` decided
/// so (idmapped mounts refused, `run`), hand the workdir over. Only a root supervisor claims
/// (the lock directory is root's) and only it can hand over. Nothing is re-owned unless the
/// claim is held and the owner could write the workdir, as the run's uid then will.
pub fn hold(policy: &Policy, prepared: &Prepared) -> Result<Held, HoldError> {
    if crate::sys::process::euid() != 0 {
        return Ok(Held::default());
    }
    let hand_over = prepared.ownership.hand_over.as_ref();
    if hand_over.is_some() {
        // Race tests hold the supervisor here: the walk has decided the workdir's inode, the
        // hand-over has not opened it yet.
        crate::pause::point("workdir-handover");
    }
    // The grants as the walk decided on them (and the view bound them): one swapped since
    // is refused here rather than claimed wrongly.
    let mut uses = Vec::new();
    for (path, dev, ino) in &prepared.ownership.read_write {
        uses.push(claim::Dir::open(path, *dev, *ino)?);
    }
    let dir = match hand_over {
        Some(h) => Some(claim::Dir::open(&h.path, h.dev, h.ino)?),
        None => None,
    };
    let claim = claim::take(&uses, dir.as_ref())?;
    let (Some(h), Some(dir), WriteAs::Owner { hand_over: range }) =
        (hand_over, dir, &policy.fs.write_as)
    else {
        return Ok(Held {
            _handed: None,
            _claim: claim,
        });
    };
    // Asked of the very inode (through its descriptor), before anything is re-owned: once
    // handed over, the run's uid has what the owner has.
    let by_fd = PathBuf::from(format!("/proc/self/fd/{}", dir.fd.as_raw_fd()));
    if let Err(source) = can_write(&by_fd, Some(h.from)) {
        let st = std::fs::metadata(&by_fd).ok();
        return Err(HoldError::NotWritable(Box::new(NotWritable {
            path: h.path.clone(),
            who: h.from,
            as_owner: true,
            chown_to: h.from,
            owner: st.as_ref().map_or(u32::MAX, |m| m.uid()),
            group: st.as_ref().map_or(u32::MAX, |m| m.gid()),
            mode: st.as_ref().map_or(0, |m| m.mode() & 0o7777),
            source,
        })));
    }
    let owners = handover::Owners(range.clone());
    let handed = handover::hand_over(&h.path, &dir.fd, h.from, h.to, &owners)?;
    tracing::info!(
        workdir = %h.path.display(),
        from = h.from.uid,
        to = h.to.uid,
        "idmapped mounts are refused here: the workdir is handed to the run's uid until it ends"
    );
    Ok(Held {
        _handed: Some(handed),
        _claim: claim,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_identity_is_asked_without_a_fork() {
        let d = tempfile::tempdir().unwrap();
        can_write(d.path(), None).unwrap();
        let e = can_write(&d.path().join("missing"), None).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    }
}
