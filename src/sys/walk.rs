//! Resolving paths by walking file descriptors, never by name twice.
//!
//! A grant root (`--workdir`, `--ro`, `--rw`, the system directories) used to be canonicalised,
//! which follows every symlink: a run that left `W/project -> /` made the next run with
//! `--workdir W/project` read-write on `/`. And an entry checked with lstat but opened later by
//! path could be exchanged for a link in between. So here every component is opened once,
//! `O_PATH|O_NOFOLLOW`, relative to the descriptor of its parent; what we decide is decided
//! from `fstat` of that descriptor, and the same descriptor is what the caller uses (Landlock
//! takes it as the rule's parent fd).
//!
//! A symlink met on the way is followed only when nothing the sandbox can run as could have
//! made or changed it: the link and every directory above it are root-owned and not writable
//! by the sandbox uid or gid ([`Walker::distrust`]). That keeps `/lib -> usr/lib` and
//! `/var/run -> /run` working. Any other link is refused with an error that names it. We chose
//! an `O_PATH` walk over `openat2(RESOLVE_NO_SYMLINKS)` because the trusted system links must
//! still be followed, one decision per link, which `openat2` cannot express.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Directories a normal image needs to run programs, and where root's links are the system's.
pub const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
];

mod file;
mod memo;
use file::MAX_LINKS;
pub use file::{Meta, Resolved, fstat};
pub use memo::{Memo, canonical};

/// `struct open_how` of openat2(2).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE_NO_MAGICLINKS: u64 = 0x02;

/// `openat2(AT_FDCWD, path, flags, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`: the fd, or -1
/// with errno set. A raw syscall on the caller's data only, so async-signal-safe (the view
/// helper uses it too).
pub(crate) fn open_no_links(path: &CStr, flags: i32) -> RawFd {
    let how = OpenHow {
        flags: flags as u64,
        mode: 0,
        resolve: RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: openat2 with a NUL-terminated path and a struct of the size passed.
    unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        ) as RawFd
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    #[error("{0} is not an absolute path")]
    NotAbsolute(PathBuf),
    #[error("opening {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("fstat of {path}: {source}")]
    Stat { path: PathBuf, source: io::Error },
    #[error("reading the symlink {path}: {source}")]
    ReadLink { path: PathBuf, source: io::Error },
    #[error("listing {path}: {source}")]
    List { path: PathBuf, source: io::Error },
    #[error(
        "refusing to follow the symlink {link} (-> {target}): {why}; name the real directory instead"
    )]
    UntrustedLink {
        link: PathBuf,
        target: PathBuf,
        why: String,
    },
    #[error("{0}: more than {MAX_LINKS} symlinks")]
    TooManyLinks(PathBuf),
    #[error("{0} is not a directory")]
    NotDir(PathBuf),
    #[error("{0} does not name a file")]
    NoFileName(PathBuf),
    #[error("{0} was replaced while it was being opened")]
    Replaced(PathBuf),
}

impl WalkError {
    /// The path (or a directory on it) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, WalkError::Open { source, .. }
            if matches!(source.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)))
    }
}

fn openat(dir: BorrowedFd<'_>, name: &OsStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let c =
        CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    open_in(dir, &c, flags, mode)
}

/// `openat(2)` of `name` relative to the directory `dir` (a descriptor the walk resolved), so
/// that no link on the path above it is followed again: the caller's `flags` say how the name
/// itself is opened (`O_NOFOLLOW`, `O_CREAT|O_EXCL`, `O_TMPFILE`, ...).
pub fn open_in(dir: BorrowedFd<'_>, name: &CStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated name relative to a live directory fd; the result is checked.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags, mode) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Open one entry of `dir` (at `dir_path`) without following it, and fstat it.
pub fn open_entry(
    dir: BorrowedFd<'_>,
    dir_path: &Path,
    name: &OsStr,
) -> Result<Resolved, WalkError> {
    let path = dir_path.join(name);
    let fd = openat(
        dir,
        name,
        libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        0,
    )
    .map_err(|source| WalkError::Open {
        path: path.clone(),
        source,
    })?;
    let meta = fstat(fd.as_fd()).map_err(|source| WalkError::Stat {
        path: path.clone(),
        source,
    })?;
    Ok(Resolved { fd, path, meta })
}

fn readlink(fd: BorrowedFd<'_>, path: &Path) -> Result<PathBuf, WalkError> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: an empty name with an O_PATH|O_NOFOLLOW fd of the link reads the link itself
    // (Linux ≥ 2.6.39); the buffer is valid for its length.
    let n = unsafe {
        libc::readlinkat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(WalkError::ReadLink {
            path: path.to_path_buf(),
            source: io::Error::last_os_error(),
        });
    }
    buf.truncate(n as usize);
    Ok(PathBuf::from(
        <OsString as std::os::unix::ffi::OsStringExt>::from_vec(buf),
    ))
}

/// The target of the link `e` (an entry [`open_entry`] opened), as written, read from its own
/// descriptor.
pub fn read_link(e: &Resolved) -> Result<PathBuf, WalkError> {
    readlink(e.fd.as_fd(), &e.path)
}

/// The names in a directory, sorted, without `.` and `..`.
pub fn list_dir(dir: BorrowedFd<'_>, path: &Path) -> Result<Vec<OsString>, WalkError> {
    list_where(dir, path, |_| true)
}

/// The names in a directory that may be symlinks, sorted: those readdir reports as links, and
/// those whose type it does not know (a filesystem without `d_type`). A hint only, to skip
/// opening every other entry: the caller still decides from [`open_entry`]'s fstat.
pub fn list_links(dir: BorrowedFd<'_>, path: &Path) -> Result<Vec<OsString>, WalkError> {
    list_where(dir, path, |t| t == libc::DT_LNK || t == libc::DT_UNKNOWN)
}

/// The names in a directory whose readdir type `keep` accepts, sorted, without `.` and `..`.
fn list_where(
    dir: BorrowedFd<'_>,
    path: &Path,
    keep: impl Fn(u8) -> bool,
) -> Result<Vec<OsString>, WalkError> {
    let err = |source| WalkError::List {
        path: path.to_path_buf(),
        source,
    };
    // An O_PATH descriptor cannot be listed; "." reopened relative to it is the same directory,
    // with no lookup by name that a rename could redirect.
    let rd = openat(
        dir,
        OsStr::new("."),
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        0,
    )
    .map_err(err)?;
    // SAFETY: fdopendir takes ownership of the descriptor only on success.
    let dirp = unsafe { libc::fdopendir(rd.as_raw_fd()) };
    if dirp.is_null() {
        return Err(err(io::Error::last_os_error()));
    }
    let _ = rd.into_raw_fd(); // owned by dirp now, closed by closedir
    let mut names = Vec::new();
    let result = loop {
        // SAFETY: errno is thread-local; readdir reports errors only through it.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: dirp is a live DIR stream owned by this function.
        let ent = unsafe { libc::readdir64(dirp) };
        if ent.is_null() {
            let e = super::errno();
            break if e == 0 {
                Ok(())
            } else {
                Err(io::Error::from_raw_os_error(e))
            };
        }
        // SAFETY: d_name is a NUL-terminated name inside the entry readdir returned.
        let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) }.to_bytes();
        // SAFETY: as above, a field of the entry readdir returned.
        let kind = unsafe { (*ent).d_type };
        if name != b"." && name != b".." && keep(kind) {
            names.push(OsStr::from_bytes(name).to_owned());
        }
    };
    // SAFETY: closes the stream (and its descriptor) exactly once.
    unsafe { libc::closedir(dirp) };
    result.map_err(err)?;
    names.sort();
    Ok(names)
}

/// Resolves paths for a sandbox that runs as `uid`/`gid`.
#[derive(Debug, Clone, Copy)]
pub struct Walker {
    uid: u32,
    gid: u32,
    /// In a user namespace of our own (a non-root supervisor), files of ids that are not
    /// mapped in it, root's among them, show as the kernel's overflow uid: that number, then.
    overflow_uid: Option<u32>,
}

/// The overflow uid when this process is in a non-initial user namespace (its uid_map is not
/// the identity over the whole range), else `None`.
fn userns_overflow_uid() -> Option<u32> {
    let map = std::fs::read_to_string("/proc/self/uid_map").ok()?;
    let initial = map.split_whitespace().collect::<Vec<_>>().as_slice() == ["0", "0", "4294967295"];
    if initial {
        return None;
    }
    std::fs::read_to_string("/proc/sys/kernel/overflowuid")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether we own the inode behind `fd` (an O_PATH descriptor of a directory), asked of the
/// kernel by a chmod to its current mode: only its owner (or CAP_FOWNER over it) may. Used
/// where the uid number alone cannot tell: inside our user namespace, an unmapped root and a
/// mapped overflow uid look the same.
fn we_own(fd: BorrowedFd<'_>, mode: u32) -> bool {
    let path = format!("/proc/self/fd/{}\0", fd.as_raw_fd());
    let p = std::ffi::OsStr::new(&path).as_bytes();
    // SAFETY: a NUL-terminated path; chmod to the mode the inode already has.
    unsafe { libc::chmod(p.as_ptr().cast(), mode & 0o7777) == 0 }
}

/// One real directory on the way down.
struct Step {
    fd: OwnedFd,
    path: PathBuf,
    meta: Meta,
}

impl Walker {
    pub fn new(uid: u32, gid: u32) -> Walker {
        let overflow_uid = memo::overflow_uid(userns_overflow_uid);
        Walker {
            uid,
            gid,
            overflow_uid,
        }
    }

    /// Whether `uid` is root's, or (in our user namespace) an unmapped id that stands for it.
    fn rootish(&self, uid: u32) -> bool {
        uid == 0 || self.overflow_uid == Some(uid)
    }

    /// Resolve an absolute path without following any symlink the sandbox could have planted.
    /// `..` goes up the directories actually walked, as the kernel's lookup would.
    pub fn resolve(&self, path: &Path) -> Result<Resolved, WalkError> {
        if let Some(r) = memo::resolved(self.uid, self.gid, path) {
            return Ok(r);
        }
        let r = self.resolve_afresh(path)?;
        memo::keep(self.uid, self.gid, path, &r);
        Ok(r)
    }

    /// [`Walker::resolve`] for a caller that needs only where the path leads and what is
    /// there (a validation, a plan): within a [`Memo`], no descriptor is duplicated for it to
    /// close (a `fcntl` and a `close` per question, dozens a run).
    pub fn resolve_path(&self, path: &Path) -> Result<(PathBuf, Meta), WalkError> {
        if let Some(found) = memo::found(self.uid, self.gid, path) {
            return Ok(found);
        }
        let r = self.resolve_afresh(path)?;
        let found = (r.path.clone(), r.meta);
        memo::keep_owned(self.uid, self.gid, path, r);
        Ok(found)
    }

    /// The walk behind [`Walker::resolve`], memo aside but for its "no such entry" answers.
    fn resolve_afresh(&self, path: &Path) -> Result<Resolved, WalkError> {
        if let Some(component) = memo::missing(self.uid, self.gid, path) {
            return Err(WalkError::Open {
                path: component,
                source: io::Error::from_raw_os_error(libc::ENOENT),
            });
        }
        if let Some(r) = resolve_linkless(path) {
            return Ok(r);
        }
        self.walk(path).inspect_err(|e| {
            if let WalkError::Open {
                path: component,
                source,
            } = e
                && source.raw_os_error() == Some(libc::ENOENT)
            {
                memo::keep_missing_walk(self.uid, self.gid, path, component);
            }
        })
    }

    /// [`Walker::resolve`] component by component.
    fn walk(&self, path: &Path) -> Result<Resolved, WalkError> {
        if !path.is_absolute() {
            return Err(WalkError::NotAbsolute(path.to_path_buf()));
        }
        // Components still to walk, last first. "/" restarts at the root (an absolute target).
        let mut pending: Vec<OsString> = Vec::new();
        push_components(&mut pending, path);
        let root_path = PathBuf::from("/");
        let c = c"/";
        // SAFETY: a NUL-terminated absolute path; the result is checked.
        let raw = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(WalkError::Open {
                path: root_path,
                source: io::Error::last_os_error(),
            });
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        let root = unsafe { OwnedFd::from_raw_fd(raw) };
        let meta = fstat(root.as_fd()).map_err(|source| WalkError::Stat {
            path: root_path.clone(),
            source,
        })?;
        let mut stack = vec![Step {
            fd: root,
            path: root_path,
            meta,
        }];
        let mut links = 0;
        while let Some(c) = pending.pop() {
            let top = stack.last().expect("the root stays on the stack");
            if c == "/" {
                stack.truncate(1);
                continue;
            }
            if !top.meta.is_dir() {
                return Err(WalkError::NotDir(top.path.clone()));
            }
            if c == ".." {
                if stack.len() > 1 {
                    stack.pop();
                }
                continue;
            }
            let e = open_entry(top.fd.as_fd(), &top.path, &c)?;
            if e.meta.is_symlink() {
                links += 1;
                if links > MAX_LINKS {
                    return Err(WalkError::TooManyLinks(path.to_path_buf()));
                }
                let target = readlink(e.fd.as_fd(), &e.path)?;
                if let Some(why) = self.distrust(&e.meta, &stack) {
                    return Err(WalkError::UntrustedLink {
                        link: e.path,
                        target,
                        why,
                    });
                }
                push_components(&mut pending, &target);
                continue;
            }
            stack.push(Step {
                fd: e.fd,
                path: e.path,
                meta: e.meta,
            });
        }
        let top = stack.pop().expect("the root stays on the stack");
        Ok(Resolved {
            fd: top.fd,
            path: top.path,
            meta: top.meta,
        })
    }

    /// Why a link (with metadata `link`, below the directories `above`) must not be followed,
    /// or `None` when it may be: the link and every directory above it are root-owned and
    /// none of those directories is writable by the sandbox.
    fn distrust(&self, link: &Meta, above: &[Step]) -> Option<String> {
        if !self.rootish(link.uid) {
            return Some(format!("the link is owned by uid {}, not root", link.uid));
        }
        for d in above {
            // The overflow uid is ambiguous when it is also the sandbox's own: ask the kernel
            // whether the directory is ours.
            let ours = self.overflow_uid == Some(d.meta.uid)
                && d.meta.uid == self.uid
                && we_own(d.fd.as_fd(), d.meta.mode);
            if !self.rootish(d.meta.uid) || ours {
                return Some(format!(
                    "{} above it is owned by uid {}, not root",
                    d.path.display(),
                    d.meta.uid
                ));
            }
            let m = d.meta.mode;
            let by_other = m & libc::S_IWOTH != 0;
            let by_group = m & libc::S_IWGRP != 0 && d.meta.gid == self.gid;
            // The owner is root. A `--uid 0` child is that owner: file modes do not stop it,
            // only Landlock does. The directories no policy can grant write to (`/`, the system
            // directories and their ancestors: `FsPolicy::validate` refuses them as read-write
            // roots) stay trusted, so `/lib -> usr/lib` still works under `--uid 0`.
            // Every other run is that owner too wherever a read-write grant of root's was
            // bound idmapped (sandbox/idmap.rs): its links there are root's on disk. That is
            // never in the system's own trees (no grant there is mapped to root), so a
            // root-owned link there is root's own (`/var/run -> /run`); anywhere else, a link
            // in a directory root may write may have been planted by an earlier run.
            let by_owner = m & libc::S_IWUSR != 0
                && if self.uid == 0 {
                    !never_writable(&d.path)
                } else {
                    !in_system_tree(&d.path)
                };
            if by_other || by_group {
                return Some(format!(
                    "{} above it is writable by the sandbox uid {} / gid {} (mode {:o}, group {})",
                    d.path.display(),
                    self.uid,
                    self.gid,
                    m & 0o7777,
                    d.meta.gid
                ));
            }
            if by_owner && self.uid == 0 {
                return Some(format!(
                    "{} above it is writable by the sandbox uid 0, its owner (mode {:o})",
                    d.path.display(),
                    m & 0o7777,
                ));
            }
            if by_owner {
                return Some(format!(
                    "{} above it is writable by its owner root (mode {:o}), as whom a sandbox writes in a root-owned workdir, so a link there may have been left by an earlier run",
                    d.path.display(),
                    m & 0o7777,
                ));
            }
        }
        None
    }
}

/// `/`, a system directory, or an ancestor of one: never a read-write root, so never below a
/// write grant of any run.
pub fn never_writable(dir: &Path) -> bool {
    SYSTEM_DIRS.iter().any(|s| Path::new(s).starts_with(dir))
}

/// Trees of the system's own besides the system directories: what lives there is root's by
/// the system's design, never a project's.
const OTHER_SYSTEM_TREES: &[&str] = &["/var", "/run", "/dev", "/sys", "/proc", "/boot"];

/// In the system's own trees: [`never_writable`], or at or below a system directory, `/var`,
/// `/run`, `/dev`, `/sys`, `/proc` or `/boot`. No read-write grant there is ever idmapped to
/// root (sandbox/ownership.rs), so no sandbox writes there as root unless it runs as uid 0.
pub fn in_system_tree(path: &Path) -> bool {
    never_writable(path)
        || SYSTEM_DIRS
            .iter()
            .chain(OTHER_SYSTEM_TREES)
            .any(|s| path.starts_with(s))
}

/// The common case in one lookup: an absolute path with no `..` and no symlink on it resolves
/// to itself, and `openat2(RESOLVE_NO_SYMLINKS)` says so in one syscall, where the walk makes
/// three per component (a `run` resolves some fifty paths while it prepares: ~0.2 ms). What
/// the walk decides is unchanged: with no link on the way there is no link to trust or
/// refuse, and the descriptor is of the same inode the walk would reach. Everything else is
/// left to the walk: a link on the way (ELOOP), a final component that is a link (O_NOFOLLOW
/// opens the link itself), a kernel without openat2 or a seccomp profile that refuses it, and
/// every error, whose message must name the failing component.
fn resolve_linkless(path: &Path) -> Option<Resolved> {
    let mut clean = PathBuf::new();
    for c in path.components() {
        match c {
            Component::RootDir => clean.push("/"),
            Component::Normal(n) => clean.push(n),
            _ => return None,
        }
    }
    if !clean.is_absolute() {
        return None;
    }
    let c = CString::new(clean.as_os_str().as_bytes()).ok()?;
    let fd = open_no_links(&c, libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC);
    if fd < 0 {
        return None;
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let meta = fstat(fd.as_fd()).ok()?;
    if meta.is_symlink() {
        return None;
    }
    Some(Resolved {
        fd,
        path: clean,
        meta,
    })
}

fn push_components(pending: &mut Vec<OsString>, path: &Path) {
    let mut comps = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir => comps.push(OsString::from("/")),
            Component::ParentDir => comps.push(OsString::from("..")),
            Component::Normal(n) => comps.push(n.to_owned()),
            Component::CurDir | Component::Prefix(_) => {}
        }
    }
    pending.extend(comps.into_iter().rev());
}

#[cfg(test)]
#[path = "walk_tests.rs"]
mod tests;
