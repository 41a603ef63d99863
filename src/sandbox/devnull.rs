//! The /dev/null a child gets as stdin or output when it has none: opened by the supervisor,
//! so on the supervisor's mount of it, not the view's read-only bind. A `--uid 0` child owns
//! the host's node, and fchmod or futimens on its stdin would change it for everyone on the
//! machine. So the supervisor opens it through a detached clone of that mount made
//! read-only, nosuid and noexec once: the descriptor is the same device, and a write to it
//! still works (a device ignores its mount's read-only flag), but a change of its mode or
//! times is EROFS.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

use super::view_root::{MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY, MountAttr, OPEN_TREE_CLONE};

const MOUNT_ATTR_NOEXEC: u64 = 0x08;

/// An O_PATH descriptor of /dev/null on a read-only detached mount, or `None` where the mount
/// API is refused (no CAP_SYS_ADMIN over our mount namespace: a non-root supervisor, whose
/// child does not own the node anyway).
fn read_only_clone() -> Option<&'static OwnedFd> {
    static CLONE: OnceLock<Option<OwnedFd>> = OnceLock::new();
    CLONE
        .get_or_init(|| {
            // SAFETY: open_tree and mount_setattr on a NUL-terminated literal and a descriptor
            // we own; fstat into a zeroed struct.
            unsafe {
                let fd = libc::syscall(
                    libc::SYS_open_tree,
                    libc::AT_FDCWD,
                    c"/dev/null".as_ptr(),
                    OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
                );
                if fd < 0 {
                    return None;
                }
                let fd = OwnedFd::from_raw_fd(fd as i32);
                let attr = MountAttr {
                    attr_set: MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC,
                    attr_clr: 0,
                    propagation: 0,
                    userns_fd: 0,
                };
                if libc::syscall(
                    libc::SYS_mount_setattr,
                    fd.as_raw_fd(),
                    c"".as_ptr(),
                    libc::AT_EMPTY_PATH as libc::c_uint,
                    &attr as *const MountAttr,
                    std::mem::size_of::<MountAttr>(),
                ) != 0
                {
                    return None;
                }
                let mut st: libc::stat = std::mem::zeroed();
                let null = libc::makedev(1, 3);
                (libc::fstat(fd.as_raw_fd(), &mut st) == 0
                    && st.st_mode & libc::S_IFMT == libc::S_IFCHR
                    && st.st_rdev == null)
                    .then_some(fd)
            }
        })
        .as_ref()
}

/// /dev/null for reading (stdin) or writing (output), through the read-only clone when there
/// is one.
pub fn open(write: bool) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(!write).write(write);
    match read_only_clone() {
        // Reopening the O_PATH descriptor through /proc gives a file on the clone's mount.
        Some(fd) => o.open(format!("/proc/self/fd/{}", fd.as_raw_fd())),
        None => o.open("/dev/null"),
    }
}
