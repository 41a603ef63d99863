//! The destination directory and the jailer-style atomic placement of one file in it.
//!
//! Every operation is relative to one open directory descriptor, so a rename of the directory
//! path half-way through cannot redirect a write. Files are never rewritten in place: a new
//! inode is written beside the target and renamed over it, so a process executing the old
//! binary keeps its inode (no ETXTBSY) and no reader ever sees a partial file.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, OFlag, openat, renameat};
use nix::sys::stat::{Mode, fchmod};
use nix::unistd::{UnlinkatFlags, fsync, unlinkat};
use sha2::{Digest, Sha256};

use super::error::InstallError;

/// Prefix of our temporary files. A crash can leave one behind; the next installer, holding
/// the directory lock, removes it (see [`DestDir::remove_stale_temps`]).
const TEMP_PREFIX: &str = ".openshell-sandbox.tmp.";

/// A SHA-256 digest.
pub type Digest256 = [u8; 32];

/// What a directory entry we are about to replace looks like.
#[derive(Debug, PartialEq, Eq)]
pub enum Existing {
    Absent,
    Regular { sha256: Digest256, mode: u32 },
}

/// An open, exclusively locked destination directory.
///
/// The lock (flock on the directory) serialises installers on one node, e.g. an old DaemonSet
/// pod still running while the new one starts, or an init container and a main container.
pub struct DestDir {
    fd: Flock<OwnedFd>,
    path: PathBuf,
}

impl DestDir {
    /// Open `path` as a directory, creating it (and its parents, mode 0755) when asked.
    pub fn open(path: &Path, create_parents: bool) -> Result<Self, InstallError> {
        match std::fs::symlink_metadata(path) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if !create_parents {
                    return Err(InstallError::DestMissing { path: path.into() });
                }
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(path)
                    .map_err(|source| InstallError::CreateDest {
                        path: path.into(),
                        source,
                    })?;
            }
            Err(source) => {
                return Err(InstallError::OpenDest {
                    path: path.into(),
                    source,
                });
            }
        }
        let fd = nix::fcntl::open(
            path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|errno| match errno {
            Errno::ENOTDIR => InstallError::DestNotDirectory { path: path.into() },
            e => InstallError::OpenDest {
                path: path.into(),
                source: e.into(),
            },
        })?;
        let fd = Flock::lock(fd, FlockArg::LockExclusive).map_err(|(_, e)| InstallError::Lock {
            path: path.into(),
            source: e.into(),
        })?;
        Ok(Self {
            fd,
            path: path.into(),
        })
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Remove temporary files left by an installer that died mid-copy. Safe only because we
    /// hold the directory lock: every live installer takes it before creating a temp file.
    /// A read-only directory has nothing to clean, and errors here never fail the install.
    pub fn remove_stale_temps(&self) -> Vec<PathBuf> {
        let mut removed = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.path) else {
            return removed;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with(TEMP_PREFIX)
                && unlinkat(self.fd.as_fd(), name, UnlinkatFlags::NoRemoveDir).is_ok()
            {
                removed.push(self.path.join(name));
            }
        }
        removed
    }

    /// Look at `name` without following a symlink, and hash it when it is a regular file.
    /// A symlink, a file with more than one link, or anything but a regular file is refused:
    /// none of them is something an earlier install of ours could have left.
    pub fn inspect(&self, name: &str) -> Result<Existing, InstallError> {
        let path = self.join(name);
        // O_NONBLOCK: a FIFO planted under our name must not hang the open.
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
        let fd = match openat(self.fd.as_fd(), name, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(Existing::Absent),
            Err(Errno::ELOOP) => return Err(InstallError::TargetIsSymlink { path }),
            Err(e) => {
                return Err(InstallError::Inspect {
                    path,
                    source: e.into(),
                });
            }
        };
        let mut file = File::from(fd);
        let meta = file.metadata().map_err(|source| InstallError::Inspect {
            path: path.clone(),
            source,
        })?;
        if !meta.file_type().is_file() {
            return Err(InstallError::TargetNotRegular { path });
        }
        if meta.nlink() > 1 {
            return Err(InstallError::TargetHardLinked {
                path,
                nlink: meta.nlink(),
            });
        }
        let sha256 = sha256_of(&mut file).map_err(|source| InstallError::Inspect {
            path: path.clone(),
            source,
        })?;
        Ok(Existing::Regular {
            sha256,
            mode: meta.permissions().mode() & 0o7777,
        })
    }

    /// Atomically make `name` a regular file with `mode` holding everything `src` yields,
    /// which must hash to `expected`. On any failure the temporary file is removed and the
    /// old `name`, if any, is untouched.
    pub fn place(
        &self,
        name: &str,
        src: &mut dyn Read,
        expected: &Digest256,
        mode: u32,
    ) -> Result<(), InstallError> {
        let (tmp_name, fd) = self.create_temp()?;
        let tmp_path = self.join(&tmp_name);
        let guard = TempGuard {
            dir: self.fd.as_fd(),
            name: &tmp_name,
            armed: true,
        };
        let mut file = File::from(fd);

        let written = copy_hashing(src, &mut file).map_err(|e| match e {
            CopyError::Read(source) => InstallError::ReadSelf {
                path: PathBuf::from("/proc/self/exe"),
                source,
            },
            CopyError::Write(source) => InstallError::Write {
                path: tmp_path.clone(),
                source,
            },
        })?;
        file.sync_all().map_err(|source| InstallError::Sync {
            path: tmp_path.clone(),
            source,
        })?;
        fchmod(file.as_fd(), Mode::from_bits_truncate(mode)).map_err(|e| InstallError::Chmod {
            path: tmp_path.clone(),
            mode,
            source: e.into(),
        })?;
        // Read back what landed in the file, not what we meant to write.
        let on_disk = sha256_at(&file).map_err(|source| InstallError::Inspect {
            path: tmp_path.clone(),
            source,
        })?;
        for actual in [written, on_disk] {
            if &actual != expected {
                return Err(InstallError::Checksum {
                    path: tmp_path.clone(),
                    expected: hex::encode(expected),
                    actual: hex::encode(actual),
                });
            }
        }
        drop(file);
        renameat(self.fd.as_fd(), tmp_name.as_str(), self.fd.as_fd(), name).map_err(|e| {
            InstallError::Rename {
                from: tmp_path.clone(),
                to: self.join(name),
                source: e.into(),
            }
        })?;
        guard.disarm();
        self.sync()
    }

    /// Create a fresh temporary file beside the target (O_EXCL, never following a symlink).
    ///
    /// The name needs to be unique, not unpredictable: O_EXCL refuses anything already there,
    /// and we hold the directory lock. So no random source is involved, which matters for a
    /// static binary in a root file system without /dev/urandom.
    fn create_temp(&self) -> Result<(String, OwnedFd), InstallError> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let flags =
            OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let mut attempt = 0;
        loop {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let seq = SEQ.fetch_add(1, Ordering::Relaxed);
            let name = format!("{TEMP_PREFIX}{}.{nanos:08x}{seq:04x}", std::process::id());
            match openat(
                self.fd.as_fd(),
                name.as_str(),
                flags,
                Mode::from_bits_truncate(0o600),
            ) {
                Ok(fd) => return Ok((name, fd)),
                Err(Errno::EEXIST) if attempt < 16 => attempt += 1,
                Err(e) => {
                    return Err(InstallError::CreateTemp {
                        path: self.join(&name),
                        source: e.into(),
                    });
                }
            }
        }
    }

    /// Make the directory entries we changed durable.
    pub fn sync(&self) -> Result<(), InstallError> {
        fsync(self.fd.as_fd()).map_err(|e| InstallError::SyncDir {
            path: self.path.clone(),
            source: e.into(),
        })
    }
}

/// Removes a temporary file unless the rename that consumes it succeeded.
struct TempGuard<'a> {
    dir: std::os::fd::BorrowedFd<'a>,
    name: &'a str,
    armed: bool,
}

impl TempGuard<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for TempGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            // Best effort: the error that brought us here is the one worth reporting.
            let _ = unlinkat(self.dir, self.name, UnlinkatFlags::NoRemoveDir);
        }
    }
}

enum CopyError {
    Read(io::Error),
    Write(io::Error),
}

fn copy_hashing(src: &mut dyn Read, dst: &mut File) -> Result<Digest256, CopyError> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CopyError::Read(e)),
        };
        hasher.update(&buf[..n]);
        dst.write_all(&buf[..n]).map_err(CopyError::Write)?;
    }
    Ok(hasher.finalize().into())
}

/// SHA-256 of everything `r` yields.
pub fn sha256_of(r: &mut dyn Read) -> io::Result<Digest256> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        match r.read(&mut buf) {
            Ok(0) => return Ok(hasher.finalize().into()),
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// SHA-256 of a file's contents from offset 0, whatever its current position.
fn sha256_at(f: &File) -> io::Result<Digest256> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut off = 0u64;
    loop {
        match f.read_at(&mut buf, off) {
            Ok(0) => return Ok(hasher.finalize().into()),
            Ok(n) => {
                hasher.update(&buf[..n]);
                off += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}
