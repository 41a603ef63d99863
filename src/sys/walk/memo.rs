//! The answers of one sandbox's preparation, kept while it lasts (see [`Memo`]).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::file::Resolved;

/// Within the preparation of one sandbox, every path is resolved once (and every path made
/// canonical once, [`canonical`]) on the thread that prepares it: `run` asks for the same
/// fifty-odd paths three times (validation, the view's request, the Landlock grants), and each
/// answer holds as long as the preparation does anyway (the view binds, and Landlock grants,
/// the inodes of the first answer). Answers are kept only while a [`Memo`] lives; errors are
/// not kept.
#[derive(Default)]
struct MemoTable {
    resolved: std::collections::HashMap<(u32, u32, PathBuf), Resolved>,
    canonical: std::collections::HashMap<PathBuf, PathBuf>,
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

/// `std::fs::canonicalize`, answered once per path within a [`Memo`].
pub fn canonical(path: &Path) -> io::Result<PathBuf> {
    let hit = MEMO.with(|m| {
        m.borrow()
            .as_ref()
            .and_then(|t| t.canonical.get(path).cloned())
    });
    if let Some(c) = hit {
        return Ok(c);
    }
    let c = path.canonicalize()?;
    MEMO.with(|m| {
        if let Some(t) = m.borrow_mut().as_mut() {
            t.canonical.insert(path.to_path_buf(), c.clone());
        }
    });
    Ok(c)
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
