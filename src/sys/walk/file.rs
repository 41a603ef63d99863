//! What the walk hands out about one file: its `fstat` answer and the resolved descriptor. A
//! leaf of its own so that `walk.rs` and its memo both read it without reading each other.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

/// As many links as the kernel follows in one lookup (MAXSYMLINKS).
pub(super) const MAX_LINKS: usize = 40;

/// What `fstat` said about a descriptor.
#[derive(Debug, Clone, Copy)]
pub struct Meta {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u64,
    pub dev: u64,
    pub ino: u64,
}

impl Meta {
    pub fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }
    pub fn is_symlink(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFLNK
    }
    pub fn is_file(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFREG
    }
}

/// One resolved file: an `O_PATH` descriptor, the symlink-free absolute path that reached it,
/// and its metadata, all of the same inode.
#[derive(Debug)]
pub struct Resolved {
    pub fd: OwnedFd,
    pub path: PathBuf,
    pub meta: Meta,
}

pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<Meta> {
    let mut st = MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes a whole struct stat to the pointer on success; the fd is borrowed.
    let rc = unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: rc == 0, so the kernel filled the struct.
    let st = unsafe { st.assume_init() };
    Ok(Meta {
        mode: st.st_mode,
        uid: st.st_uid,
        gid: st.st_gid,
        nlink: st.st_nlink,
        dev: st.st_dev,
        ino: st.st_ino,
    })
}
