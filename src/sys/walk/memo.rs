//! The answers of one sandbox's preparation, kept while it lasts (see [`Memo`]).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::file::{Meta, Resolved};

/// Within the preparation of one sandbox, every path is resolved once (and every path made
/// canonical once, [`canonical`]) on the thread that prepares it: `run` asks for the same
/// fifty-odd paths three times (validation, the view's request, the Landlock grants), and each
/// answer holds as long as the preparation does anyway (the view binds, and Landlock grants,
/// the inodes of the first answer). Answers are kept only while a [`Memo`] lives. Of the
/// errors only "no such entry" is kept (the grants a system lacks, `/lib32`, and the deny paths
/// that are not there were asked three times a run): like any answer it is the first one's
/// for the whole preparation, and the checks that a denied path is still absent when the
/// sandbox is made stat it afresh. Any other error may pass (a descriptor limit, a signal)
/// and is asked again.
#[derive(Default)]
struct MemoTable {
    resolved: std::collections::HashMap<(u32, u32, PathBuf), Resolved>,
    /// Paths whose walk found no such entry, with the component the error names.
    missing: std::collections::HashMap<(u32, u32, PathBuf), PathBuf>,
    canonical: std::collections::HashMap<PathBuf, PathBuf>,
    /// Real prefixes that are not there (ENOENT of their `readlink`).
    canonical_missing: std::collections::HashSet<PathBuf>,
    overflow_uid: Option<Option<u32>>,
}

thread_local! {
    static MEMO: std::cell::RefCell<Option<MemoTable>> = const { std::cell::RefCell::new(None) };
}

/// While this lives, [`Walker::resolve`], [`canonical`] and [`Walker::new`] on this thread
/// answer each question once (see [`MemoTable`]). Nested scopes share the outermost one's
/// answers.
#[must_use]
pub struct Memo {
    outermost: bool,
}

impl Memo {
    pub fn begin() -> Memo {
        MEMO.with(|m| {
            let mut m = m.borrow_mut();
            let outermost = m.is_none();
            if outermost {
                *m = Some(MemoTable::default());
            }
            Memo { outermost }
        })
    }
}

impl Memo {
    /// Drop every answer kept so far on this thread, keeping the memo on: a preparation given
    /// up because something changed prepares again from fresh answers, also inside an outer
    /// memo.
    pub fn forget(&self) {
        MEMO.with(|m| {
            if let Some(t) = m.borrow_mut().as_mut() {
                *t = MemoTable::default();
            }
        });
    }
}

impl Drop for Memo {
    fn drop(&mut self) {
        if self.outermost {
            MEMO.with(|m| *m.borrow_mut() = None);
        }
    }
}

/// Another descriptor of the same open file, close-on-exec.
fn dup(fd: BorrowedFd<'_>) -> Option<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC on a live descriptor; the new one is ours.
    let raw = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    // SAFETY: a fresh descriptor that nothing else owns.
    (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw) })
}

impl Resolved {
    /// The same answer, with a descriptor of its own.
    pub(super) fn try_clone(&self) -> Option<Resolved> {
        Some(Resolved {
            fd: dup(self.fd.as_fd())?,
            path: self.path.clone(),
            meta: self.meta,
        })
    }
}

/// `std::fs::canonicalize`, answered once per path within a [`Memo`]. Within one, every
/// prefix's answer is kept too, so that a path costs one `readlink` for each component no
/// earlier path shared with it (realpath asks again for every component of every path:
/// `/run` twenty times a run, `/etc` ten). Errors are not kept (see [`MemoTable`]).
pub fn canonical(path: &Path) -> io::Result<PathBuf> {
    let in_memo = MEMO.with(|m| m.borrow().is_some());
    if !in_memo || !path.is_absolute() {
        return path.canonicalize();
    }
    let mut links = 0;
    let c = resolve_canonical(path, &mut links)?;
    // As realpath: a trailing slash asks for a directory.
    if path.as_os_str().as_encoded_bytes().ends_with(b"/") && !c.is_dir() {
        return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
    }
    Ok(c)
}

/// What realpath(3) does, one component at a time from `/`, each real prefix asked once per
/// [`Memo`]. `links` counts the links followed for the caller's path (the kernel's limit).
fn resolve_canonical(path: &Path, links: &mut usize) -> io::Result<PathBuf> {
    use std::path::Component;
    if let Some(c) = kept_canonical(path) {
        return Ok(c);
    }
    let mut cur = PathBuf::from("/");
    for comp in path.components() {
        match comp {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            // `cur` holds no link, so its `..` is its parent (as the kernel's lookup finds it).
            Component::ParentDir => {
                cur.pop();
            }
            Component::Normal(name) => {
                let next = cur.join(name);
                cur = match kept_canonical(&next) {
                    Some(c) => c,
                    None if known_missing(&next) => {
                        return Err(io::Error::from_raw_os_error(libc::ENOENT));
                    }
                    None => match real_entry(&next, links) {
                        Ok(c) => {
                            keep_canonical(&next, &c);
                            c
                        }
                        Err(e) => {
                            if e.raw_os_error() == Some(libc::ENOENT) {
                                keep_missing(&next);
                            }
                            return Err(e);
                        }
                    },
                };
            }
        }
    }
    keep_canonical(path, &cur);
    Ok(cur)
}

/// The real path of `p`, whose parent is real already: `p` itself unless it is a link.
fn real_entry(p: &Path, links: &mut usize) -> io::Result<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut buf = [0u8; libc::PATH_MAX as usize];
    // SAFETY: a NUL-terminated path and a buffer valid for its length.
    let n = unsafe { libc::readlink(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        let e = io::Error::last_os_error();
        // EINVAL: the entry exists and is not a link.
        return match e.raw_os_error() {
            Some(libc::EINVAL) => Ok(p.to_path_buf()),
            _ => Err(e),
        };
    }
    *links += 1;
    if *links > super::file::MAX_LINKS {
        return Err(io::Error::from_raw_os_error(libc::ELOOP));
    }
    let target = Path::new(std::ffi::OsStr::from_bytes(&buf[..n as usize]));
    let parent = p.parent().unwrap_or(Path::new("/"));
    resolve_canonical(&parent.join(target), links)
}

/// Whether the real prefix `path` was found missing within this [`Memo`].
fn known_missing(path: &Path) -> bool {
    MEMO.with(|m| {
        m.borrow()
            .as_ref()
            .is_some_and(|t| t.canonical_missing.contains(path))
    })
}

fn keep_missing(path: &Path) {
    MEMO.with(|m| {
        if let Some(t) = m.borrow_mut().as_mut() {
            t.canonical_missing.insert(path.to_path_buf());
        }
    });
}

fn kept_canonical(path: &Path) -> Option<PathBuf> {
    MEMO.with(|m| {
        m.borrow()
            .as_ref()
            .and_then(|t| t.canonical.get(path).cloned())
    })
}

fn keep_canonical(path: &Path, c: &Path) {
    MEMO.with(|m| {
        if let Some(t) = m.borrow_mut().as_mut() {
            t.canonical.insert(path.to_path_buf(), c.to_path_buf());
        }
    });
}

/// The kept answer for `path` as `uid`/`gid` resolve it, with a descriptor of its own.
pub(super) fn resolved(uid: u32, gid: u32, path: &Path) -> Option<Resolved> {
    MEMO.with(|m| {
        m.borrow()
            .as_ref()
            .and_then(|t| t.resolved.get(&(uid, gid, path.to_path_buf())))
            .and_then(Resolved::try_clone)
    })
}

/// The kept answer's path and metadata for `path` as `uid`/`gid` resolve it: no descriptor,
/// so none is duplicated for a caller that would only close it.
pub(super) fn found(uid: u32, gid: u32, path: &Path) -> Option<(PathBuf, Meta)> {
    MEMO.with(|m| {
        m.borrow()
            .as_ref()
            .and_then(|t| t.resolved.get(&(uid, gid, path.to_path_buf())))
            .map(|r| (r.path.clone(), r.meta))
    })
}

/// Keep `r` itself as the answer for `path`, while a [`Memo`] lives (no copy of its
/// descriptor); without one it is dropped.
pub(super) fn keep_owned(uid: u32, gid: u32, path: &Path, r: Resolved) {
    MEMO.with(|m| {
        if let Some(t) = m.borrow_mut().as_mut() {
            t.resolved.insert((uid, gid, path.to_path_buf()), r);
        }
    });
}

/// Keep `r` as the answer for `path`, while a [`Memo`] lives.
pub(super) fn keep(uid: u32, gid: u32, path: &Path, r: &Resolved) {
    MEMO.with(|m| {
        if let Some(t) = m.borrow_mut().as_mut()
            && let Some(kept) = r.try_clone()
        {
            t.resolved.insert((uid, gid, path.to_path_buf()), kept);
        }
    });
}

/// The component a walk of `path` as `uid`/`gid` found missing, if one did within this
/// [`Memo`].
pub(super) fn missing(uid: u32, gid: u32, path: &Path) -> Option<PathBuf> {
    MEMO.with(|m| {
        m.borrow()
            .as_ref()
            .and_then(|t| t.missing.get(&(uid, gid, path.to_path_buf())).cloned())
    })
}

/// Keep that the walk of `path` found `component` missing, while a [`Memo`] lives.
pub(super) fn keep_missing_walk(uid: u32, gid: u32, path: &Path, component: &Path) {
    MEMO.with(|m| {
        if let Some(t) = m.borrow_mut().as_mut() {
            t.missing
                .insert((uid, gid, path.to_path_buf()), component.to_path_buf());
        }
    });
}

/// The overflow uid (`ask` finds it), asked once while a [`Memo`] lives.
pub(super) fn overflow_uid(ask: fn() -> Option<u32>) -> Option<u32> {
    if let Some(o) = MEMO.with(|m| m.borrow().as_ref().and_then(|t| t.overflow_uid)) {
        return o;
    }
    let o = ask();
    MEMO.with(|m| {
        if let Some(t) = m.borrow_mut().as_mut() {
            t.overflow_uid = Some(o);
        }
    });
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Within a memo, the answers (and the errors) are realpath's, for links relative and
    /// absolute, chains, `..` after a link, missing entries, loops and files used as
    /// directories; and a second ask gets the same answer.
    #[test]
    fn canonical_in_a_memo_answers_as_realpath() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap();
        let d = root.join("d");
        std::fs::create_dir_all(d.join("sub/deep")).unwrap();
        std::fs::write(d.join("file"), b"").unwrap();
        let link =
            |target: &str, at: &str| std::os::unix::fs::symlink(target, root.join(at)).unwrap();
        link("d/sub", "rel");
        link(d.join("sub").to_str().unwrap(), "abs");
        link("rel", "chain");
        link("d/sub/..", "dotdot");
        link("missing", "dangling");
        link("loop2", "loop1");
        link("loop1", "loop2");
        let asks = [
            "d",
            "d/",
            "d/sub/deep",
            "rel",
            "rel/deep",
            "rel/..",
            "rel/../file",
            "abs/deep",
            "chain/deep",
            "dotdot",
            "dotdot/sub",
            "dangling",
            "loop1",
            "missing",
            "missing/x",
            "d/file",
            "d/file/",
            "d/file/x",
            "d/./sub/../file",
            "rel/deep/../../sub",
        ];
        let _memo = Memo::begin();
        for round in 0..2 {
            for a in asks {
                let p = root.join(a);
                let want = p.canonicalize().map_err(|e| e.raw_os_error());
                let got = canonical(&p).map_err(|e| e.raw_os_error());
                assert_eq!(got, want, "{a} (round {round})");
            }
        }
    }
}
