//! A granted path as the view binds it: what the policy walk decided on, by inode.

use std::os::fd::RawFd;
use std::path::PathBuf;

/// A granted path, as the supervisor's symlink-safe walk resolved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Symlink-free and absolute.
    pub path: PathBuf,
    pub read_only: bool,
    pub dir: bool,
    /// Device and inode of what the walk decided on: the helper binds that inode or nothing.
    pub dev: u64,
    pub ino: u64,
    /// Its owner and mode, as the walk saw them.
    pub owner: crate::policy::Identity,
    pub mode: u32,
    /// Bind it as an idmapped mount (see idmap.rs).
    pub idmap: Option<Idmap>,
}

/// An idmapped bind: the mapping, and the user namespace that carries it (a descriptor the
/// helper inherits; it stays open until the view is built).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Idmap {
    pub swap: super::idmap::IdSwap,
    pub userns: RawFd,
}
