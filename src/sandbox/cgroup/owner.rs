//! Which base groups belong to a live supervisor: each holds an exclusive flock on its
//! directory for its supervisor's life; a group whose lock anyone can take is swept.

use std::fs::{self, File};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::group::Group;
use super::system::{CgroupError, PREFIX, remove_dir_retrying};

/// Make `dir` (or adopt it when it exists) and take its ownership lock. A sweeper may hold the
/// lock of a group it is removing, or remove the directory between our mkdir and our flock:
/// both are retried, and the lock counts only on the directory that is still at `dir`.
pub(super) fn own_dir(dir: &Path) -> Result<File, CgroupError> {
    let create = |source| CgroupError::Create {
        path: dir.to_path_buf(),
        source,
    };
    for _ in 0..100 {
        match fs::create_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(create(e)),
        }
        let f = match File::open(dir) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(create(e)),
        };
        match crate::sys::try_lock_exclusive(f.as_fd()) {
            Ok(true) => {}
            Ok(false) => {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            Err(source) => {
                return Err(CgroupError::Lock {
                    path: dir.to_path_buf(),
                    source,
                });
            }
        }
        let same = match (f.metadata(), fs::metadata(dir)) {
            (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
            _ => false,
        };
        if same {
            return Ok(f);
        }
    }
    Err(create(io::Error::from_raw_os_error(libc::EBUSY)))
}

/// Kill the members of, and remove, every group in `parent` that no live supervisor owns.
pub(super) fn sweep_stale(parent: &Path, freezer: bool) {
    let Ok(dir) = fs::read_dir(parent) else {
        return;
    };
    for e in dir.flatten() {
        if !e.file_name().to_string_lossy().starts_with(PREFIX) {
            continue;
        }
        let path = e.path();
        let Ok(f) = File::open(&path) else {
            continue;
        };
        if !matches!(crate::sys::try_lock_exclusive(f.as_fd()), Ok(true)) {
            continue; // a live owner holds it (or another sweeper does)
        }
        tracing::info!(group = %path.display(), "removing the group of a dead supervisor");
        let mut children: Vec<PathBuf> = fs::read_dir(&path)
            .map(|d| {
                d.flatten()
                    .filter(|c| c.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|c| c.path())
                    .collect()
            })
            .unwrap_or_default();
        children.push(path.clone());
        for c in &children {
            let g = Group::at(c, freezer);
            if let Err(e) = g.kill_until_empty() {
                tracing::warn!(group = %c.display(), error = %e, "could not empty a stale group");
            }
            remove_dir_retrying(c);
        }
        drop(f);
    }
}
