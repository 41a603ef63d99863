//! Where `run --report-json PATH` puts its report, and how it gets there.
//!
//! The report is what a caller trusts about a run, so the sandboxed command must not be able
//! to forge it. A file opened before the run and written at the end was not enough: a child
//! that can write the report's directory renamed our file away and left its own at the path.
//! So nothing exists at the path during the run. Before it, we open the report's directory
//! (through the symlink-safe walk, `O_DIRECTORY|O_NOFOLLOW`) and refuse a directory the
//! sandbox could replace, and make an unnamed file in it (`O_TMPFILE`, where the filesystem
//! has them). After the tree is dead, we write the report into that file (or a new one), give
//! it a name of our own and rename it over the name (`renameat` on the directory's
//! descriptor), which replaces whatever the child left there (a file, a symlink, a FIFO)
//! without following or opening it.
//!
//! Which directories are refused: one strictly below a read-write grant of the run (the
//! workdir, `--rw`, the scratch directory). There the child can rename the directory itself,
//! or one above it, and put one of its own at the path, so what the path names after the run
//! would be the child's choice. A grant root itself (the workdir, the common
//! `--report-json report.json`) is accepted: its parent is outside the grants, so the child
//! can change entries in it but not replace it, and the rename replaces the one entry that
//! matters once no process of the run is left. Compared by device and inode, so a second
//! name of a grant (a bind mount) counts as the grant.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::sys::walk::{self, Meta, WalkError, Walker};

#[derive(Debug, thiserror::Error)]
pub enum ReportFileError {
    #[error(transparent)]
    Walk(#[from] WalkError),
    #[error("{0} does not name a file")]
    NoFileName(PathBuf),
    #[error("{0} is a directory")]
    IsDir(PathBuf),
    #[error(
        "{} lies below the read-write grant {}: the sandboxed command could replace that directory and leave its own report at the path; write the report into {} itself or outside the grants",
        dir.display(), grant.display(), grant.display()
    )]
    InsideGrant { dir: PathBuf, grant: PathBuf },
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

/// The report's directory, held open from before the run until the report is in it.
#[derive(Debug)]
pub struct ReportFile {
    dir: OwnedFd,
    /// An unnamed file in that directory (`O_TMPFILE`), made before the run where the
    /// filesystem has them: the report is written into it and given a name only at the end,
    /// so writing it needs no new descriptor then (a supervisor out of descriptors still
    /// reports why the run failed), and the command never sees it.
    unnamed: Option<OwnedFd>,
    name: CString,
    /// The path as the walk resolved it (for messages).
    path: PathBuf,
}

fn id(m: &Meta) -> (u64, u64) {
    (m.dev, m.ino)
}

impl ReportFile {
    /// Before the run: resolve `path`'s directory through `walker`, open it, and refuse it
    /// when it lies below one of `rw_grants` (the run's read-write roots), when the name is a
    /// directory (a rename cannot replace one), or when we could not create a file there.
    /// Nothing is created.
    pub fn open(
        walker: &Walker,
        path: &Path,
        rw_grants: &[&Path],
    ) -> Result<ReportFile, ReportFileError> {
        let io_err = |what, path: &Path, source| ReportFileError::Io {
            what,
            path: path.to_path_buf(),
            source,
        };
        let abs = std::path::absolute(path).map_err(|e| io_err("resolving", path, e))?;
        let name = match abs.components().next_back() {
            Some(Component::Normal(n)) => n.to_owned(),
            _ => return Err(ReportFileError::NoFileName(abs)),
        };
        let parent = abs
            .parent()
            .ok_or_else(|| ReportFileError::NoFileName(abs.clone()))?;
        let resolved = walker.resolve(parent)?;
        if !resolved.meta.is_dir() {
            return Err(WalkError::NotDir(resolved.path).into());
        }
        let dir_path = resolved.path;
        let dir = walk::open_in(
            resolved.fd.as_fd(),
            c".",
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0,
        )
        .map_err(|e| io_err("opening", &dir_path, e))?;
        let dir_meta = walk::fstat(dir.as_fd()).map_err(|e| io_err("fstat of", &dir_path, e))?;
        if id(&dir_meta) != id(&resolved.meta) {
            return Err(WalkError::Replaced(dir_path).into());
        }
        let report_path = dir_path.join(&name);
        check_outside_grants(dir.as_fd(), &dir_path, walker, rw_grants)?;
        match walk::open_entry(dir.as_fd(), &dir_path, &name) {
            Ok(e) if e.meta.is_dir() => return Err(ReportFileError::IsDir(report_path)),
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
        // Whether we may create a file there at all (a read-only filesystem, a directory of
        // someone else's): said now, before the command runs, rather than after it.
        // SAFETY: faccessat on our directory fd with a static name.
        let rc = unsafe {
            libc::faccessat(
                dir.as_raw_fd(),
                c".".as_ptr(),
                libc::W_OK | libc::X_OK,
                libc::AT_EACCESS,
            )
        };
        if rc != 0 {
            return Err(io_err(
                "cannot create a file in",
                &dir_path,
                io::Error::last_os_error(),
            ));
        }
        let name = CString::new(name.as_bytes())
            .map_err(|_| ReportFileError::NoFileName(report_path.clone()))?;
        // EOPNOTSUPP (a filesystem without O_TMPFILE) and the rest: the report is then made
        // as a named file at the end.
        let unnamed = walk::open_in(
            dir.as_fd(),
            c".",
            libc::O_WRONLY | libc::O_TMPFILE | libc::O_CLOEXEC,
            0o666,
        )
        .ok();
        Ok(ReportFile {
            dir,
            unnamed,
            name,
            path: report_path,
        })
    }

    /// The report's path, symlink-free.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// After the tree is dead: put `bytes` at the path, as a new file renamed over whatever is
    /// there. On failure nothing is left at the path but a directory the child may have made
    /// there: an entry it left must not pass for our report.
    pub fn write(&self, bytes: &[u8]) -> Result<(), ReportFileError> {
        let io_err = |what, source| ReportFileError::Io {
            what,
            path: self.path.clone(),
            source,
        };
        let result = self.write_renamed(bytes);
        if let Err(e) = &result {
            tracing::warn!(path = %self.path.display(), error = %e, "the report could not be written; removing what is at its path");
            // SAFETY: unlinkat on our directory fd with a NUL-terminated name; flags 0 never
            // removes a directory.
            let rc = unsafe { libc::unlinkat(self.dir.as_raw_fd(), self.name.as_ptr(), 0) };
            let gone = rc == 0 || matches!(crate::sys::errno(), libc::ENOENT | libc::EISDIR);
            if !gone {
                return Err(io_err(
                    "removing what the run left at",
                    io::Error::last_os_error(),
                ));
            }
        }
        result
    }

    fn write_renamed(&self, bytes: &[u8]) -> Result<(), ReportFileError> {
        let io_err = |what, source| ReportFileError::Io {
            what,
            path: self.path.clone(),
            source,
        };
        if let Some(fd) = &self.unnamed {
            return self.write_unnamed(fd.as_fd(), bytes);
        }
        // A name of our own beside the target: O_EXCL, so a file or link already there (the
        // child could guess at names) is never opened; a short name keeps within NAME_MAX.
        let mut made = None;
        for _ in 0..16 {
            let tmp = fresh_name();
            match walk::open_in(
                self.dir.as_fd(),
                &tmp,
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o666,
            ) {
                Ok(fd) => {
                    made = Some((tmp, fd));
                    break;
                }
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
                Err(e) => return Err(io_err("creating a file beside", e)),
            }
        }
        let Some((tmp, fd)) = made else {
            return Err(io_err(
                "creating a file beside",
                io::Error::from_raw_os_error(libc::EEXIST),
            ));
        };
        let unlink_tmp = || {
            // SAFETY: unlinkat on our directory fd with the name we just created.
            unsafe { libc::unlinkat(self.dir.as_raw_fd(), tmp.as_ptr(), 0) };
        };
        // No fsync: the rename is what makes the report appear whole to a reader; surviving a
        // power cut is not a promise of a per-run report, and an fsync costs milliseconds.
        if let Err(e) = std::io::Write::write_all(&mut std::fs::File::from(fd), bytes) {
            unlink_tmp();
            return Err(io_err("writing", e));
        }
        self.rename_over(&tmp)
    }
}

impl ReportFile {
    /// Write into the unnamed file, link it into the directory under a name of our own and
    /// rename that over the target. No descriptor is opened here.
    fn write_unnamed(&self, fd: BorrowedFd<'_>, bytes: &[u8]) -> Result<(), ReportFileError> {
        let io_err = |what, source| ReportFileError::Io {
            what,
            path: self.path.clone(),
            source,
        };
        let mut off = 0;
        while off < bytes.len() {
            // SAFETY: write from a live slice to our own descriptor.
            let n = unsafe {
                libc::write(
                    fd.as_raw_fd(),
                    bytes[off..].as_ptr().cast(),
                    bytes.len() - off,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(io_err("writing", e));
            }
            off += n as usize;
        }
        let proc_path = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .expect("no NUL in a formatted path");
        let mut linked = None;
        for _ in 0..16 {
            let tmp = fresh_name();
            // SAFETY: linkat with NUL-terminated paths and our directory fd. Through /proc
            // (AT_SYMLINK_FOLLOW), which needs no capability, unlike AT_EMPTY_PATH.
            let rc = unsafe {
                libc::linkat(
                    libc::AT_FDCWD,
                    proc_path.as_ptr(),
                    self.dir.as_raw_fd(),
                    tmp.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            };
            if rc == 0 {
                linked = Some(tmp);
                break;
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(io_err("naming the report beside", e));
            }
        }
        let Some(tmp) = linked else {
            return Err(io_err(
                "naming the report beside",
                io::Error::from_raw_os_error(libc::EEXIST),
            ));
        };
        self.rename_over(&tmp)
    }

    /// Rename our file `tmp` over the report's name; on failure `tmp` is removed.
    fn rename_over(&self, tmp: &CStr) -> Result<(), ReportFileError> {
        // SAFETY: renameat within our directory fd, NUL-terminated names.
        let rc = unsafe {
            libc::renameat(
                self.dir.as_raw_fd(),
                tmp.as_ptr(),
                self.dir.as_raw_fd(),
                self.name.as_ptr(),
            )
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            // SAFETY: unlinkat on our directory fd with the name we made.
            unsafe { libc::unlinkat(self.dir.as_raw_fd(), tmp.as_ptr(), 0) };
            return Err(ReportFileError::Io {
                what: "renaming the report to",
                path: self.path.clone(),
                source: e,
            });
        }
        Ok(())
    }
}

/// A name of our own beside the report: short (within NAME_MAX) and random, made with
/// O_EXCL or its like by the caller, so an entry the child left under a guessed name is never
/// opened.
fn fresh_name() -> CString {
    CString::new(format!(".osb-report-{:016x}.tmp", crate::sys::random_u64()))
        .expect("no NUL in a formatted name")
}

/// Refuse a report directory strictly below one of `rw_grants`: walk up from `dir` by `..`
/// (the kernel's own parent, across mounts), comparing each ancestor with every grant root by
/// device and inode.
fn check_outside_grants(
    dir: BorrowedFd<'_>,
    dir_path: &Path,
    walker: &Walker,
    rw_grants: &[&Path],
) -> Result<(), ReportFileError> {
    let mut roots = Vec::new();
    for g in rw_grants {
        // Grants were resolved by the same walk when the policy was validated; one that no
        // longer resolves cannot hold the report's directory.
        if let Ok((path, meta)) = walker.resolve_path(g) {
            roots.push((id(&meta), path));
        }
    }
    let io_err = |source| ReportFileError::Io {
        what: "walking up from",
        path: dir_path.to_path_buf(),
        source,
    };
    let dotdot = c"..";
    let mut cur = walk::fstat(dir).map_err(io_err)?;
    let mut fd = walk::open_in(
        dir,
        dotdot,
        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        0,
    )
    .map_err(io_err)?;
    // PATH_MAX / 2 levels at most: a deeper chain is not a path the walk could resolve.
    for _ in 0..2048 {
        let meta = walk::fstat(fd.as_fd()).map_err(io_err)?;
        if id(&meta) == id(&cur) {
            return Ok(()); // the root: its `..` is itself
        }
        if let Some((_, grant)) = roots.iter().find(|(g, _)| *g == id(&meta)) {
            return Err(ReportFileError::InsideGrant {
                dir: dir_path.to_path_buf(),
                grant: grant.clone(),
            });
        }
        cur = meta;
        fd = walk::open_in(
            fd.as_fd(),
            dotdot,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            0,
        )
        .map_err(io_err)?;
    }
    Err(io_err(io::Error::from_raw_os_error(libc::ELOOP)))
}
