//! The hand-over, where idmapped mounts are refused: `run`'s workdir is re-owned to the run's
//! uid before the run and back to its owner after it, under the exclusive claim of claim.rs.
//!
//! Everything is done on descriptors, never by path: the workdir is the descriptor the claim
//! reopened component by component (and checked against the walk's inode); below it each entry
//! is opened `O_PATH|O_NOFOLLOW` relative to its directory's descriptor, decided on by `fstat`
//! of that descriptor, re-owned through it (`fchownat(fd, "", AT_EMPTY_PATH)`, which for a
//! link re-owns the link) and, when it is a directory, entered through it. A name swapped for
//! a link between two steps is at worst a link re-owned as a link. A regular file with more
//! than one link is left alone: its other names may lie outside the tree.
//!
//! The walk is bounded ([`MAX_DEPTH`] directories deep, one descriptor per level). A tree
//! deeper than that is refused before the run: what was already re-owned is given back, and
//! the error says why.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use crate::policy::{Identity, NOBODY};

/// Deeper than this, a tree is not a workdir but an attack on our descriptors and stack.
pub const MAX_DEPTH: u32 = 256;

#[derive(Debug, thiserror::Error)]
pub enum HandOverError {
    #[error(
        "the workdir {} holds directories more than {MAX_DEPTH} levels deep, deeper than it can be handed over to uid {uid} (idmapped mounts are refused on its filesystem); nothing was re-owned. Remove the deep tree, or use a workdir on a filesystem with idmapped mounts",
        path.display()
    )]
    TooDeep { path: PathBuf, uid: u32 },
    #[error("handing {} over to uid {uid}: {source}", path.display())]
    Chown {
        path: PathBuf,
        uid: u32,
        source: io::Error,
    },
}

/// Which owners count as the sandbox's: 65534, the fixed uid of `serve` and of runs before
/// uid ranges, and the uids of `run`'s range.
#[derive(Debug, Clone)]
pub struct Owners(pub std::ops::RangeInclusive<u32>);

impl Owners {
    pub fn contains(&self, uid: u32) -> bool {
        uid == NOBODY || self.0.contains(&uid)
    }
}

/// A workdir handed over: given back to its owner when dropped (after the run's tree is dead;
/// the sandbox holds it until its last exec is gone).
#[derive(Debug)]
pub struct Handed {
    path: PathBuf,
    /// The workdir, `O_RDONLY|O_DIRECTORY`, opened from the claim's descriptor.
    root: OwnedFd,
    from: Identity,
    to: Identity,
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: fstat into a zeroed stack struct.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st)
    }
}

fn chown_fd(fd: RawFd, to: Identity) -> io::Result<()> {
    // SAFETY: fchownat on our descriptor with an empty path: the file it refers to itself.
    let rc = unsafe { libc::fchownat(fd, c"".as_ptr(), to.uid, to.gid, libc::AT_EMPTY_PATH) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Open the directory an `O_PATH` descriptor refers to, for reading its entries.
fn enter(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: openat of "." relative to our descriptor: the directory itself.
    let raw = unsafe {
        libc::openat(
            fd,
            c".".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just opened, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

enum WalkError {
    TooDeep,
    Io(io::Error),
}

/// What to do with one entry: re-own it to this identity (or not), and whether to enter it
/// when it is a directory.
type Visit<'a> = dyn FnMut(&libc::stat) -> (Option<Identity>, bool) + 'a;

/// Visit every entry below the directory `dir` (an `O_RDONLY` descriptor, consumed).
fn walk(dir: OwnedFd, depth: u32, visit: &mut Visit<'_>) -> Result<(), WalkError> {
    // SAFETY: fdopendir takes over the descriptor; closedir below releases both.
    let dp = unsafe { libc::fdopendir(dir.into_raw_fd()) };
    if dp.is_null() {
        return Err(WalkError::Io(io::Error::last_os_error()));
    }
    // SAFETY: dp is an open directory stream.
    let dfd = unsafe { libc::dirfd(dp) };
    let mut result = Ok(());
    loop {
        // SAFETY: readdir on our stream; the entry is valid until the next readdir.
        let ent = unsafe { libc::readdir(dp) };
        if ent.is_null() {
            break;
        }
        // SAFETY: d_name is NUL-terminated within the entry.
        let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) };
        if name == c"." || name == c".." {
            continue;
        }
        // SAFETY: openat relative to the directory's descriptor; O_NOFOLLOW|O_PATH opens a
        // link as the link, and a FIFO or device without opening it.
        let raw = unsafe {
            libc::openat(
                dfd,
                name.as_ptr(),
                libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if raw < 0 {
            continue; // gone meanwhile
        }
        // SAFETY: just opened, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let Ok(st) = fstat(fd.as_raw_fd()) else {
            continue;
        };
        let kind = st.st_mode & libc::S_IFMT;
        let (to, descend) = visit(&st);
        if let Some(to) = to
            && !(kind == libc::S_IFREG && st.st_nlink > 1)
            && (st.st_uid, st.st_gid) != (to.uid, to.gid)
            && let Err(e) = chown_fd(fd.as_raw_fd(), to)
        {
            result = Err(WalkError::Io(e));
            break;
        }
        if kind == libc::S_IFDIR && descend {
            if depth + 1 >= MAX_DEPTH {
                result = Err(WalkError::TooDeep);
                break;
            }
            let Ok(sub) = enter(fd.as_raw_fd()) else {
                continue;
            };
            drop(fd);
            if let Err(e) = walk(sub, depth + 1, visit) {
                result = Err(e);
                break;
            }
        }
    }
    // SAFETY: closing the stream we opened (and its descriptor).
    unsafe { libc::closedir(dp) };
    result
}

/// Hand the workdir `dir` (the claim's `O_PATH` descriptor of it) from `from` to `to`: the
/// directory itself, and below it every entry that belongs to one of `owners` (entries of
/// anyone else, and everything below a directory of anyone else, keep their owner).
pub fn hand_over(
    path: &Path,
    dir: &OwnedFd,
    from: Identity,
    to: Identity,
    owners: &Owners,
) -> Result<Handed, HandOverError> {
    let err = |source| HandOverError::Chown {
        path: path.to_path_buf(),
        uid: to.uid,
        source,
    };
    let root = enter(dir.as_raw_fd()).map_err(err)?;
    let handed = Handed {
        path: path.to_path_buf(),
        root,
        from,
        to,
    };
    chown_fd(handed.root.as_raw_fd(), to).map_err(err)?;
    let below = enter(handed.root.as_raw_fd()).map_err(err)?;
    let mut visit = |st: &libc::stat| {
        let ours = owners.contains(st.st_uid);
        (ours.then_some(to), ours)
    };
    match walk(below, 0, &mut visit) {
        Ok(()) => Ok(handed),
        // Dropping `handed` gives back what was re-owned so far.
        Err(WalkError::TooDeep) => Err(HandOverError::TooDeep {
            path: path.to_path_buf(),
            uid: to.uid,
        }),
        Err(WalkError::Io(e)) => Err(err(e)),
    }
}

impl Drop for Handed {
    /// Give back: the workdir and everything below it that belongs to the run's uid goes to
    /// the workdir's owner. Every directory is entered (the run may have written into a
    /// directory of anyone else that its mode let it write).
    fn drop(&mut self) {
        let (from, to) = (self.from, self.to);
        if let Err(e) = chown_fd(self.root.as_raw_fd(), from) {
            tracing::warn!(workdir = %self.path.display(), error = %e, "could not give the workdir back to its owner");
        }
        let mut visit = |st: &libc::stat| ((st.st_uid == to.uid).then_some(from), true);
        let r = enter(self.root.as_raw_fd())
            .map_err(WalkError::Io)
            .and_then(|d| walk(d, 0, &mut visit));
        match r {
            Ok(()) => {}
            Err(WalkError::TooDeep) => tracing::warn!(
                workdir = %self.path.display(),
                "the run left directories more than {MAX_DEPTH} levels deep: what lies below them stays the run's uid's ({})",
                to.uid
            ),
            Err(WalkError::Io(e)) => tracing::warn!(
                workdir = %self.path.display(),
                error = %e,
                "could not give everything the run wrote back to the workdir's owner"
            ),
        }
    }
}
