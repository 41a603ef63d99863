//! Reading the small `/proc` files of an identity lookup (`stat`, `status`, `children`,
//! `cgroup`, `environ`, `maps`, `net/unix`), which runs for every proxied connection.
//!
//! `fs::read_to_string` asks a file for its size first (`statx`, then `lseek`) and, as a
//! `/proc` file reports 0, reads from 32 bytes up, doubling: six to twelve system calls for a
//! file of a few hundred bytes. These read into a buffer of [`FIRST_READ`] from the start, with
//! no size asked: an open, a read, the read that returns 0, a close. They read to the end like
//! `read_to_string` does (a `/proc` file built from records, as `maps` or `children` are, may
//! return less than asked before its end, so a short read is not taken for the end).

use std::fs;
use std::io::{self, Read};

/// Room for the whole of most of these files in one read.
const FIRST_READ: usize = crate::sys::procstat::FIRST_READ;

/// At most `max` bytes of `path`, read to its end or the limit.
pub fn read_bytes(path: &str, max: u64) -> io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(FIRST_READ);
    // `Take` reads with no size hint: no `statx` or `lseek` before the first read.
    fs::File::open(path)?.take(max).read_to_end(&mut buf)?;
    Ok(buf)
}

/// The whole of a `/proc` file made as one record (`stat`, `status`, `cgroup`) in one read:
/// [`crate::sys::procstat::read_record`].
pub use crate::sys::procstat::read_record;

/// The whole of `path` as text (up to 16 MiB; these files are a few KiB).
pub fn read_text(path: &str) -> io::Result<String> {
    let b = read_bytes(path, 16 << 20)?;
    String::from_utf8(b).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file is read whole, as `read_to_string` reads it, and the limit holds.
    #[test]
    fn reads_to_the_end_and_to_the_limit() {
        // Built from records (one per mount), often longer than one page.
        let path = "/proc/self/mountinfo";
        assert_eq!(read_text(path).unwrap(), fs::read_to_string(path).unwrap());
        let d = tempfile::tempdir().unwrap();
        let big = d.path().join("big");
        let text = "0123456789abcdef\n".repeat(1000);
        fs::write(&big, &text).unwrap();
        let p = big.to_str().unwrap();
        assert_eq!(read_text(p).unwrap(), text);
        assert_eq!(read_bytes(p, 100).unwrap(), text.as_bytes()[..100]);
        assert!(read_text("/proc/self/no-such-file").is_err());
    }
}
