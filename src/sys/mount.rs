//! The new mount API's constants and `struct mount_attr` (linux/mount.h), which the libc
//! crate does not define. Used by the view's root, the cgroup remount and the read-only
//! /dev/null clone.

/// open_tree(2): clone the tree into a detached mount instead of opening the mount itself.
pub const OPEN_TREE_CLONE: libc::c_uint = 1;
/// move_mount(2): the source is the descriptor itself.
pub const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x04;
/// move_mount(2): the target is the descriptor itself.
pub const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
pub const MOUNT_ATTR_RDONLY: u64 = 0x01;
pub const MOUNT_ATTR_NOSUID: u64 = 0x02;
pub const MOUNT_ATTR_NODEV: u64 = 0x04;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x08;
/// The mount's ids are mapped through `userns_fd`.
pub const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
pub struct MountAttr {
    pub attr_set: u64,
    pub attr_clr: u64,
    pub propagation: u64,
    pub userns_fd: u64,
}
