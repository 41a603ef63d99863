//! The error of `install`, `install --verify` and `copy-self`, which every part of them
//! returns.

use std::io;
use std::path::PathBuf;

/// Errors of `install`, `install --verify` and `copy-self`. Each names the path it concerns;
/// the underlying `io::Error` (with its errno) is kept as the source.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("install into {} failed", dest.display())]
    Install {
        dest: PathBuf,
        #[source]
        source: Box<InstallError>,
    },
    #[error("copy-self to {} failed", dest.display())]
    CopySelf {
        dest: PathBuf,
        #[source]
        source: Box<InstallError>,
    },
    #[error("cannot open the running executable {path}")]
    OpenSelf {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read the running executable {path}")]
    ReadSelf {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("destination directory {path} does not exist (pass --create-parents to create it)")]
    DestMissing { path: PathBuf },
    #[error("cannot create destination directory {path}{}", why(source))]
    CreateDest {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("destination {path} is not a directory")]
    DestNotDirectory { path: PathBuf },
    #[error("cannot open destination directory {path}{}", why(source))]
    OpenDest {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot lock destination directory {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("refusing to replace {path}: it is a symbolic link (remove it, then install again)")]
    TargetIsSymlink { path: PathBuf },
    #[error(
        "refusing to replace {path}: it has {nlink} hard links (remove it, then install again)"
    )]
    TargetHardLinked { path: PathBuf, nlink: u64 },
    #[error("refusing to replace {path}: it is not a regular file")]
    TargetNotRegular { path: PathBuf },
    #[error("cannot read {path}{}", why(source))]
    Inspect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot create temporary file {path}{}", why(source))]
    CreateTemp {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write {path}{}", why(source))]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot flush {path} to disk{}", why(source))]
    Sync {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot set mode {mode:o} on {path}")]
    Chmod {
        path: PathBuf,
        mode: u32,
        #[source]
        source: io::Error,
    },
    #[error("copy to {path} does not match the source: sha256 {actual}, expected {expected}")]
    Checksum {
        path: PathBuf,
        expected: String,
        actual: String,
    },
    #[error("cannot rename {from} to {to}{}", why(source))]
    Rename {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot flush directory {path} to disk")]
    SyncDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not installed")]
    NotInstalled { path: PathBuf },
    #[error("{path} is a different binary: sha256 {found}, this binary is {expected}")]
    Differs {
        path: PathBuf,
        found: String,
        expected: String,
    },
    #[error("{path} has mode {mode:o}, expected 755")]
    WrongMode { path: PathBuf, mode: u32 },
    #[error("marker {path} does not record this binary (found {found:?})")]
    MarkerMismatch { path: PathBuf, found: String },
    #[error("cannot wait for signals")]
    Signals {
        #[source]
        source: io::Error,
    },
}

/// A short, human reason for the errnos an operator can act on.
fn why(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EROFS) => " (the destination is on a read-only file system)",
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => " (the destination file system is full)",
        Some(libc::EACCES) | Some(libc::EPERM) => " (permission denied for this user)",
        _ => "",
    }
}
