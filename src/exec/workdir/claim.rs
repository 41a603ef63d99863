//! Which trees the runs on this machine are using, so that a run that must hand its workdir
//! over (idmapped mounts refused: handover.rs) never re-owns a tree another run is in.
//!
//! A hand-over re-owns a whole tree, so it conflicts with every run whose read-write grant lies
//! in that tree (below it or at it) and with every run whose grant holds the tree (above it);
//! runs with idmapped mounts do not conflict with each other at all. With flock's two modes
//! that takes three lock files per directory, keyed by device and inode, in the uid lease
//! directory (root's, 0700: nothing sandboxed can take or hold them):
//! - `p-KEY` ("a grant at or below"): shared by every run for each directory from `/` down to
//!   each of its grants; exclusive for a hand-over of that directory;
//! - `t-KEY` ("a grant here"): shared by every run for each of its grants. A hand-over tries it
//!   exclusively on each ancestor of its tree and lets it go at once: it only asks;
//! - `d-KEY` ("a hand-over below"): shared by a hand-over for each ancestor of its tree. Every
//!   other run tries it exclusively on each of its grants and lets it go at once.
//!
//! Every claim is made while holding `claims` exclusively, so that the asking and the taking
//! are one step for everyone. A run refuses, naming the conflict, rather than wait. The kernel
//! drops the locks when the holder dies, however it dies. The files stay (removing a lock file
//! races with its next user); they are empty and on tmpfs.
//!
//! Keys are of the directories as the walk resolved them, reopened here one component at a
//! time without following a link: a tree reached through another bind mount of the same
//! directory has other ancestors and is not seen (the lease directory, and so every claim, is
//! per machine only when `/run` is).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::sandbox::identity;

#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error(
        "{} changed since the policy walk resolved it ({what}): refusing to hand over or claim anything there",
        path.display()
    )]
    Changed { path: PathBuf, what: &'static str },
    #[error("opening {} for its claim: {source}", path.display())]
    Open { path: PathBuf, source: io::Error },
    #[error(
        "{} is in use by a run that hands {} over to its uid (idmapped mounts are refused there): wait for that run to end, or use a directory outside that tree",
        path.display(), tree.display()
    )]
    HandedOver { path: PathBuf, tree: PathBuf },
    #[error(
        "the workdir {} cannot be handed over to this run's uid (idmapped mounts are refused on its filesystem): {why}; wait for that run to end",
        path.display()
    )]
    InUse { path: PathBuf, why: String },
    #[error("the workdir lock directory: {0}")]
    LockDir(identity::LeaseError),
    #[error("locking {name}: {source}")]
    Lock { name: String, source: io::Error },
}

/// A directory as the walk resolved it, reopened one component at a time from `/` with
/// `O_PATH|O_NOFOLLOW`: the key of each directory on the way, and a descriptor of the last.
#[derive(Debug)]
pub struct Dir {
    pub path: PathBuf,
    /// (path, device, inode) from `/` down to `path` itself.
    chain: Vec<(PathBuf, u64, u64)>,
    pub fd: OwnedFd,
}

fn stat(fd: &OwnedFd) -> io::Result<libc::stat> {
    // SAFETY: fstat into a zeroed stack struct.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd.as_raw_fd(), &mut st) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st)
    }
}

impl Dir {
    /// Reopen `path` (symlink-free and absolute, from the walk) and check that it is still
    /// the inode `dev`/`ino` the walk decided on, and that no component on the way has become
    /// a link (a middle directory swapped for a symlink since the walk).
    pub fn open(path: &Path, dev: u64, ino: u64) -> Result<Dir, ClaimError> {
        let changed = |what| ClaimError::Changed {
            path: path.to_path_buf(),
            what,
        };
        let open_err = |source| ClaimError::Open {
            path: path.to_path_buf(),
            source,
        };
        // SAFETY: open of a constant path.
        let raw = unsafe {
            libc::open(
                c"/".as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(open_err(io::Error::last_os_error()));
        }
        // SAFETY: just opened, owned by nobody else.
        let mut fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let st = stat(&fd).map_err(open_err)?;
        let mut at = PathBuf::from("/");
        let mut chain = vec![(at.clone(), st.st_dev, st.st_ino)];
        let comps: Vec<&std::ffi::OsStr> = path
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n),
                _ => None,
            })
            .collect();
        for (i, name) in comps.iter().enumerate() {
            let last = i + 1 == comps.len();
            let c = CString::new(name.as_bytes()).map_err(|_| changed("a NUL in the path"))?;
            // SAFETY: openat relative to our directory descriptor with a NUL-terminated name;
            // O_NOFOLLOW: a link there is opened as the link, and refused below.
            let raw = unsafe {
                libc::openat(
                    fd.as_raw_fd(),
                    c.as_ptr(),
                    libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                )
            };
            if raw < 0 {
                let e = io::Error::last_os_error();
                return Err(match e.raw_os_error() {
                    Some(libc::ENOENT | libc::ENOTDIR) => changed("a component is gone"),
                    _ => open_err(e),
                });
            }
            // SAFETY: just opened, owned by nobody else.
            let next = unsafe { OwnedFd::from_raw_fd(raw) };
            let st = stat(&next).map_err(open_err)?;
            let kind = st.st_mode & libc::S_IFMT;
            if kind == libc::S_IFLNK {
                return Err(changed("a component is a symbolic link now"));
            }
            if !last && kind != libc::S_IFDIR {
                return Err(changed("a component is no longer a directory"));
            }
            at.push(name);
            chain.push((at.clone(), st.st_dev, st.st_ino));
            fd = next;
        }
        let &(_, d, i) = chain.last().expect("the chain holds `/` at least");
        if (d, i) != (dev, ino) {
            return Err(changed("another inode is there now"));
        }
        Ok(Dir {
            path: path.to_path_buf(),
            chain,
            fd,
        })
    }

    fn key(&self, i: usize) -> String {
        let (_, d, n) = &self.chain[i];
        format!("{d}-{n}")
    }

    fn ancestors(&self) -> std::ops::Range<usize> {
        0..self.chain.len() - 1
    }

    fn me(&self) -> usize {
        self.chain.len() - 1
    }
}

/// The locks of one sandbox's claim, held while it lives.
#[derive(Debug, Default)]
pub struct Claim {
    _held: Vec<OwnedFd>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Shared,
    Exclusive,
}

struct Locks {
    dir: OwnedFd,
}

impl Locks {
    /// Open (creating it) the lock file `name` and flock it: `Ok(None)` when someone else
    /// holds it in a conflicting mode (never waits, except for `claims`).
    fn lock(&self, name: &str, mode: Mode, wait: bool) -> Result<Option<OwnedFd>, ClaimError> {
        let err = |source| ClaimError::Lock {
            name: name.to_owned(),
            source,
        };
        let c = CString::new(name).map_err(|_| err(io::Error::from_raw_os_error(libc::EINVAL)))?;
        // SAFETY: openat relative to our directory descriptor with a NUL-terminated name.
        let raw = unsafe {
            libc::openat(
                self.dir.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600,
            )
        };
        if raw < 0 {
            return Err(err(io::Error::last_os_error()));
        }
        // SAFETY: just opened, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut op = match mode {
            Mode::Shared => libc::LOCK_SH,
            Mode::Exclusive => libc::LOCK_EX,
        };
        if !wait {
            op |= libc::LOCK_NB;
        }
        loop {
            // SAFETY: flock on our descriptor.
            if unsafe { libc::flock(fd.as_raw_fd(), op) } == 0 {
                return Ok(Some(fd));
            }
            match crate::sandbox::errno() {
                libc::EINTR => continue,
                libc::EWOULDBLOCK => return Ok(None),
                e => return Err(err(io::Error::from_raw_os_error(e))),
            }
        }
    }

    /// Whether nobody holds `name` in a mode that conflicts with an exclusive lock; asks only.
    fn free(&self, name: &str) -> Result<bool, ClaimError> {
        Ok(self.lock(name, Mode::Exclusive, false)?.is_some())
    }
}

/// Claim `uses` (every read-write grant of a sandbox) and, when the workdir is to be handed
/// over, `hand_over` exclusively. Where there is no lock directory (a chroot without /run)
/// and nothing is handed over, the claim is empty: no run here can hand anything over either.
pub fn take(uses: &[Dir], hand_over: Option<&Dir>) -> Result<Claim, ClaimError> {
    let dir = match identity::lock_dir() {
        Ok(d) => d,
        Err(identity::LeaseError::LockDir(_, e))
            if hand_over.is_none()
                && matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EROFS)) =>
        {
            tracing::debug!(error = %e, "no lock directory: the grants are not claimed");
            return Ok(Claim::default());
        }
        Err(e) => return Err(ClaimError::LockDir(e)),
    };
    let locks = Locks { dir };
    let _claims = locks.lock("claims", Mode::Exclusive, true)?;
    let mut held = Vec::new();
    let hold = |held: &mut Vec<OwnedFd>, fd: Option<OwnedFd>| fd.map(|f| held.push(f)).is_some();
    // A grant inside the tree handed over is covered by that claim (and a shared lock of ours
    // on the tree's `p-` file would conflict with our own exclusive one).
    let inside = |d: &Dir| hand_over.is_some_and(|h| d.path.starts_with(&h.path));
    for d in uses.iter().filter(|d| !inside(d)) {
        let me = d.key(d.me());
        if !locks.free(&format!("d-{me}"))? {
            return Err(ClaimError::HandedOver {
                path: d.path.clone(),
                tree: PathBuf::from("a directory below it"),
            });
        }
        for i in 0..=d.me() {
            let fd = locks.lock(&format!("p-{}", d.key(i)), Mode::Shared, false)?;
            if !hold(&mut held, fd) {
                return Err(ClaimError::HandedOver {
                    path: d.path.clone(),
                    tree: d.chain[i].0.clone(),
                });
            }
        }
        let fd = locks.lock(&format!("t-{me}"), Mode::Shared, false)?;
        hold(&mut held, fd);
    }
    if let Some(h) = hand_over {
        let fd = locks.lock(&format!("p-{}", h.key(h.me())), Mode::Exclusive, false)?;
        if !hold(&mut held, fd) {
            return Err(ClaimError::InUse {
                path: h.path.clone(),
                why: "a running sandbox (a run, or serve) uses it or a directory below it".into(),
            });
        }
        for i in h.ancestors() {
            let fd = locks.lock(&format!("p-{}", h.key(i)), Mode::Shared, false)?;
            if !hold(&mut held, fd) {
                return Err(ClaimError::HandedOver {
                    path: h.path.clone(),
                    tree: h.chain[i].0.clone(),
                });
            }
        }
        // Our own grants above the tree hold their `t-` files: those are no conflict.
        let ours = |i: usize| uses.iter().any(|u| u.key(u.me()) == h.key(i));
        for i in h.ancestors().filter(|&i| !ours(i)) {
            if !locks.free(&format!("t-{}", h.key(i)))? {
                return Err(ClaimError::InUse {
                    path: h.path.clone(),
                    why: format!(
                        "a running sandbox has {}, which holds it, as a grant",
                        h.chain[i].0.display()
                    ),
                });
            }
        }
        for i in h.ancestors() {
            let fd = locks.lock(&format!("d-{}", h.key(i)), Mode::Shared, false)?;
            hold(&mut held, fd);
        }
    }
    Ok(Claim { _held: held })
}
