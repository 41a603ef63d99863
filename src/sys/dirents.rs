//! Listing a directory's numbered entries (`/proc/<pid>/task`, `/proc/<pid>/fd`) with
//! `getdents64` on a descriptor the caller keeps.
//!
//! `std::fs::read_dir` goes through the C library's `opendir`, which opens the directory and
//! asks `fstat` for a buffer size before the first read, and keeps its descriptor to itself: a
//! caller that then reads the entries' links (`readlinkat` on `/proc/<pid>/fd`) opens the
//! directory a second time. An identity lookup lists several such directories for every
//! proxied connection; here a listing is one open, the reads, and the caller's own close.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// `path`, opened as a directory to list and to resolve names in (`readlinkat`).
pub fn open_dir(path: &str) -> io::Result<OwnedFd> {
    let c = std::ffi::CString::new(path).map_err(io::Error::other)?;
    // SAFETY: open(2) of a NUL-terminated path; the result is checked and owned.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The entries of the directory open at `dir` whose names are decimal numbers, in the
/// directory's order; `.`, `..` and any other name are left out. Reads from the descriptor's
/// current offset: a descriptor is listed once.
pub fn numbered(dir: BorrowedFd<'_>) -> io::Result<Vec<u32>> {
    let mut out = Vec::new();
    // Room for a few hundred entries of `/proc` per call; the kernel fills it with whole
    // records only.
    let mut buf = vec![0u8; 8192];
    loop {
        // SAFETY: getdents64 writes at most `buf.len()` bytes into our buffer.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                dir.as_raw_fd(),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Ok(out);
        }
        parse(&buf[..n as usize], &mut out)?;
    }
}

/// The numbered names of one `getdents64` batch. A record (`struct linux_dirent64`, `<dirent.h>`)
/// is an 8-byte inode, an 8-byte offset, a 2-byte record length, a 1-byte type, then the
/// NUL-terminated name, padded to the record length.
fn parse(batch: &[u8], out: &mut Vec<u32>) -> io::Result<()> {
    const NAME: usize = 19;
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed getdents64 record");
    let mut at = 0;
    while at < batch.len() {
        let rec = batch.get(at..).ok_or_else(bad)?;
        let len = u16::from_ne_bytes([*rec.get(16).ok_or_else(bad)?, *rec.get(17).ok_or_else(bad)?])
            as usize;
        if len <= NAME || len > rec.len() {
            return Err(bad());
        }
        let name = &rec[NAME..len];
        let name = &name[..name.iter().position(|b| *b == 0).ok_or_else(bad)?];
        if !name.is_empty()
            && name.iter().all(u8::is_ascii_digit)
            && let Some(v) = std::str::from_utf8(name).ok().and_then(|s| s.parse().ok())
        {
            out.push(v);
        }
        at += len;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// Every descriptor of a directory that takes more than one batch, and the tasks and
    /// processes known to be there (other tests of this binary open files and start threads
    /// meanwhile, so the listings are compared on what cannot change).
    #[test]
    fn lists_every_numbered_entry() {
        let files: Vec<std::fs::File> = (0..600)
            .map(|_| std::fs::File::open("/dev/null").unwrap())
            .collect();
        let fds = numbered(open_dir("/proc/self/fd").unwrap().as_fd()).unwrap();
        for f in &files {
            assert!(
                fds.contains(&(f.as_raw_fd() as u32)),
                "fd {}",
                f.as_raw_fd()
            );
        }
        let me = std::process::id();
        let tasks = numbered(open_dir("/proc/self/task").unwrap().as_fd()).unwrap();
        assert!(tasks.contains(&me));
        // SAFETY: gettid takes no arguments.
        let tid = unsafe { libc::gettid() } as u32;
        assert!(tasks.contains(&tid), "{tasks:?}");
        let pids = numbered(open_dir("/proc").unwrap().as_fd()).unwrap();
        assert!(pids.contains(&me) && pids.contains(&1));
        drop(files);
        assert_eq!(
            open_dir("/proc/self/no-such-dir")
                .unwrap_err()
                .raw_os_error(),
            Some(libc::ENOENT)
        );
    }

    #[test]
    fn a_malformed_batch_is_an_error() {
        let mut out = Vec::new();
        assert!(parse(&[0u8; 10], &mut out).is_err());
        // A record length that runs past the batch.
        let mut rec = vec![0u8; 24];
        rec[16..18].copy_from_slice(&64u16.to_ne_bytes());
        assert!(parse(&rec, &mut out).is_err());
        // One good record: "42".
        let mut rec = vec![0u8; 24];
        rec[16..18].copy_from_slice(&24u16.to_ne_bytes());
        rec[19..21].copy_from_slice(b"42");
        parse(&rec, &mut out).unwrap();
        assert_eq!(out, vec![42]);
    }
}
