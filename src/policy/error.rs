//! [`PolicyError`]: what makes a policy invalid, returned by every part's validation.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("workdir {path}: {source}")]
    Workdir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("workdir {0} is not a directory")]
    WorkdirNotDir(PathBuf),
    #[error(
        "workdir {}: {} is where the sandbox gets a private tmpfs of its own, so it cannot be the workdir (that would be the host's shared {} instead); run in a directory of your own below it (`mkdir {}/work && cd {}/work`), or name one with --workdir DIR (--scratch does not change the workdir: it adds a private TMPDIR)",
        path.display(), tmpfs.display(), tmpfs.display(), tmpfs.display(), tmpfs.display()
    )]
    WorkdirIsPrivateTmpfs { path: PathBuf, tmpfs: PathBuf },
    #[error("--{flag} {path}: {source}")]
    GrantRoot {
        flag: &'static str,
        path: PathBuf,
        source: Box<crate::sys::walk::WalkError>,
    },
    #[error(
        "--{flag} {path}: read-write on {resolved} would cover the system directory {system}; refused"
    )]
    SystemWrite {
        flag: &'static str,
        path: PathBuf,
        resolved: PathBuf,
        system: PathBuf,
    },
    #[error("path {path} is both granted (--{flag}) and denied; a denied path cannot be granted")]
    GrantedSecret { flag: &'static str, path: PathBuf },
    #[error("--gid was given without --uid (OPENSHELL_SANDBOX_UID/GID must be supplied together)")]
    GidWithoutUid,
    #[error("--{0} 0 is not allowed: tmpfs reads size 0 as unlimited")]
    ZeroSize(&'static str),
    #[error("the limit {name} = {value} is too large for the kernel (max {max})")]
    LimitTooLarge {
        name: &'static str,
        value: u64,
        max: u64,
    },
}
