//! What every part of the cgroup layer reads: where the cgroup filesystems are ([`System`]),
//! the error of a cgroup operation, and the small file helpers.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A failed cgroup operation, with the file it was on.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("creating cgroup {path}: {source}")]
    Create { path: PathBuf, source: io::Error },
    #[error("locking cgroup {path}: {source}")]
    Lock { path: PathBuf, source: io::Error },
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
}

/// Where the cgroup filesystems are mounted and which groups we are in: the real system, or a
/// fake tree in unit tests.
#[derive(Debug, Clone)]
pub struct System {
    pub mount: PathBuf,
    /// The text of /proc/self/cgroup.
    pub self_cgroup: String,
}

impl System {
    pub fn real() -> Option<System> {
        Some(System {
            mount: PathBuf::from("/sys/fs/cgroup"),
            self_cgroup: read_small("/proc/self/cgroup").ok()?,
        })
    }

    /// Our group in the hierarchy of `controller` ("" = the v2 unified hierarchy), relative.
    pub(super) fn own_path(&self, controller: &str) -> Option<PathBuf> {
        for line in self.self_cgroup.lines() {
            let mut parts = line.splitn(3, ':');
            let (_id, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
            let matches = if controller.is_empty() {
                ctrls.is_empty()
            } else {
                ctrls.split(',').any(|c| c == controller)
            };
            if matches {
                return Some(PathBuf::from(path.trim_start_matches('/')));
            }
        }
        None
    }

    /// Where the hierarchy mounted at `mount/NAME` ("" = `mount` itself) is used: the mount, or
    /// the read-write copy start-up made of a read-only one (see `cgroup_remount`). v1's
    /// `cpu` and `cpuacct` are links to `cpu,cpuacct`: the copy is found by the link's target.
    pub(super) fn hierarchy(&self, name: &str) -> PathBuf {
        let real = self.mount.join(name);
        // Without a copy (no read-only mount at start-up) every name is its mount: no link
        // to read.
        if self.mount != Path::new("/sys/fs/cgroup") || !crate::sandbox::cgroup_remount::any_copy()
        {
            return real;
        }
        let target = match fs::read_link(&real) {
            Ok(t) if t.is_relative() && t.components().count() == 1 => {
                t.to_string_lossy().into_owned()
            }
            _ => name.to_string(),
        };
        crate::sandbox::cgroup_remount::copy_of(&target).map_or(real, Path::to_path_buf)
    }

    pub(super) fn is_v2(&self) -> bool {
        self.hierarchy("").join("cgroup.controllers").exists()
    }

    /// The v1 parent directory for `controller`, when that hierarchy is mounted and we are in it.
    pub(super) fn v1_parent(&self, controller: &str) -> Option<PathBuf> {
        self.v1_parent_id(controller).map(|(p, _)| p)
    }

    /// [`System::v1_parent`] with the directory's (device, inode): co-mounted controllers
    /// (`cpu,cpuacct`) answer the same directory, found without resolving either path.
    pub(super) fn v1_parent_id(&self, controller: &str) -> Option<(PathBuf, (u64, u64))> {
        use std::os::unix::fs::MetadataExt;
        let p = self.hierarchy(controller).join(self.own_path(controller)?);
        let m = fs::metadata(&p).ok().filter(|m| m.is_dir())?;
        Some((p, (m.dev(), m.ino())))
    }
}

/// A small procfs file in one read(2) and the EOF: procfs reports a size of 0, so
/// `read_to_string` starts from a 32-byte probe and reads /proc/self/cgroup in five steps.
fn read_small(path: &str) -> io::Result<String> {
    use std::io::Read;
    let mut f = fs::File::open(path)?;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    String::from_utf8(out).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

pub(super) const PREFIX: &str = "openshell-owned-";

pub(super) fn writable(p: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access reads a NUL-terminated path we own.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

pub(super) fn v2_controllers(dir: &Path) -> Option<Vec<String>> {
    let text = fs::read_to_string(dir.join("cgroup.controllers")).ok()?;
    Some(text.split_whitespace().map(String::from).collect())
}

/// The value of `key` in a flat-keyed cgroup file ("key value" per line).
pub(super) fn counter(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next() == Some(key)).then(|| it.next()?.parse().ok())?
    })
}

pub(super) fn remove_dir_retrying(d: &Path) {
    // Only empty cgroups can be removed; a straggler (still exiting) makes rmdir fail with
    // EBUSY: retry briefly, then leave it.
    for _ in 0..50 {
        match fs::remove_dir(d) {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(Duration::from_millis(2))
            }
            _ => break,
        }
    }
}

/// Remove one of our base groups. rmdir answers EBUSY while a group is left inside, and the
/// exec group of a `run` is removed by the process manager's thread once it hears that the
/// exec was reaped, which can come just after this (on a busy machine, often): rather than
/// sleep until then, remove the empty groups inside first. A group whose processes are still
/// exiting stays EBUSY and is waited for as before; the manager's own rmdir of a group removed
/// here finds it gone (ENOENT) and is done.
pub(super) fn remove_base(b: &Path) {
    match fs::remove_dir(b) {
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
        _ => return,
    }
    if let Ok(dir) = fs::read_dir(b) {
        for c in dir.flatten() {
            if c.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = fs::remove_dir(c.path());
            }
        }
    }
    remove_dir_retrying(b);
}

pub(super) fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    let err = |source| CgroupError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut f = fs::OpenOptions::new().write(true).open(path).map_err(err)?;
    f.write_all(value.as_bytes()).map_err(err)
}
