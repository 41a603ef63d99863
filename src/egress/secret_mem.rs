//! Memory for credential values that a fork does not inherit: each value lives in an
//! anonymous mapping of its own marked `MADV_WIPEONFORK` (a child made by fork or clone
//! without `CLONE_VM` sees zeroes there) and `MADV_DONTDUMP` (no core dump holds it). The
//! supervisor forks the init of every exec; the init is root's process inside the sandbox's
//! namespaces and must hold no value. Dropping a value zeroes its pages before unmapping them.

use std::ptr::NonNull;

/// One value, in a wipe-on-fork mapping (or, where the kernel refuses one, on the heap: see
/// [`SecretBytes::wiped_on_fork`]).
pub struct SecretBytes {
    ptr: NonNull<u8>,
    len: usize,
    /// The mapping's length; 0: `ptr` is a leaked `Box<[u8]>` of `len` bytes.
    map_len: usize,
}

// SAFETY: the bytes are owned by this value alone, written once at creation and only read
// afterwards; the pointer is never shared mutably.
unsafe impl Send for SecretBytes {}
// SAFETY: as above: shared references only read.
unsafe impl Sync for SecretBytes {}

fn zero(p: *mut u8, len: usize) {
    for i in 0..len {
        // SAFETY: `p..p+len` is writable memory this module owns; a volatile write is not
        // elided even though the memory is freed right after.
        unsafe { std::ptr::write_volatile(p.add(i), 0) };
    }
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

/// Zero `bytes` in place (a transient copy of a value: the string read from the environment,
/// a decoded message).
pub fn wipe(bytes: &mut [u8]) {
    zero(bytes.as_mut_ptr(), bytes.len());
}

/// [`wipe`] for a `String`'s whole buffer, its spare capacity included.
pub fn wipe_string(s: &mut String) {
    let cap = s.capacity();
    // SAFETY: zero bytes are valid UTF-8; the whole allocation of `cap` bytes is ours.
    let v = unsafe { s.as_mut_vec() };
    zero(v.as_mut_ptr(), cap);
    v.clear();
}

unsafe extern "C" {
    static mut environ: *mut *mut libc::c_char;
}

/// Zero the value of `name` in this process's own environment block, in place: the strings
/// the kernel put on the initial stack, which every fork copies. The entry stays (`NAME=`,
/// empty): the environment array itself is not changed under a reader.
pub fn scrub_own_env(name: &str) {
    // SAFETY: `environ` is the C environment, a null-terminated array of NUL-terminated
    // strings; it is read entry by entry up to its terminator. Only the bytes of the value
    // after `NAME=` are written, never past their NUL: nothing in this process sets or
    // reads that variable again (its value now lives in the credential store).
    unsafe {
        let mut p = *std::ptr::addr_of!(environ);
        if p.is_null() {
            return;
        }
        while !(*p).is_null() {
            let e = (*p).cast::<u8>();
            let entry = std::ffi::CStr::from_ptr(e.cast()).to_bytes();
            if entry.len() > name.len()
                && entry.starts_with(name.as_bytes())
                && entry[name.len()] == b'='
            {
                let at = name.len() + 1;
                zero(e.add(at), entry.len() - at);
            }
            p = p.add(1);
        }
    }
}

impl SecretBytes {
    pub fn new(value: &[u8]) -> SecretBytes {
        let page = 4096;
        let map_len = value.len().max(1).div_ceil(page) * page;
        // SAFETY: an anonymous private mapping; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        // SAFETY: madvise on the mapping just made; its result is checked.
        if p != libc::MAP_FAILED && unsafe { libc::madvise(p, map_len, libc::MADV_WIPEONFORK) } == 0
        {
            // SAFETY: as above; a refusal only means a core dump could hold the value.
            unsafe { libc::madvise(p, map_len, libc::MADV_DONTDUMP) };
            let ptr = p.cast::<u8>();
            // SAFETY: the mapping is `map_len >= value.len()` writable bytes.
            unsafe { std::ptr::copy_nonoverlapping(value.as_ptr(), ptr, value.len()) };
            return SecretBytes {
                // SAFETY: mmap succeeded: not null.
                ptr: unsafe { NonNull::new_unchecked(ptr) },
                len: value.len(),
                map_len,
            };
        }
        if p != libc::MAP_FAILED {
            // SAFETY: the mapping made above, unused.
            unsafe { libc::munmap(p, map_len) };
        }
        tracing::warn!(
            "no wipe-on-fork memory for a credential (kernel before 4.14?): the inits of execs may inherit its value"
        );
        let b: Box<[u8]> = value.into();
        let len = b.len();
        SecretBytes {
            // SAFETY: Box::into_raw never returns null.
            ptr: unsafe { NonNull::new_unchecked(Box::into_raw(b).cast::<u8>()) },
            len,
            map_len: 0,
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `ptr` holds `len` initialised bytes for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Whether the value is in wipe-on-fork memory.
    pub fn wiped_on_fork(&self) -> bool {
        self.map_len != 0
    }
}

impl Drop for SecretBytes {
    fn drop(&mut self) {
        if self.map_len != 0 {
            zero(self.ptr.as_ptr(), self.map_len);
            // SAFETY: the mapping this value made; nothing refers to it after drop.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.map_len) };
        } else {
            zero(self.ptr.as_ptr(), self.len);
            // SAFETY: the box leaked in `new`, of `len` bytes, freed once.
            drop(unsafe {
                Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                    self.ptr.as_ptr(),
                    self.len,
                ))
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_sees_zeroes_where_the_value_was() {
        let s = SecretBytes::new(b"sekrit-value");
        assert_eq!(s.as_bytes(), b"sekrit-value");
        assert!(s.wiped_on_fork());
        let mut fds = [0; 2];
        // SAFETY: a pipe into a local array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child only reads memory and makes raw syscalls, then _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let b = s.as_bytes();
            let all_zero = b.iter().all(|c| *c == 0);
            let byte = [all_zero as u8];
            // SAFETY: write of a local byte, then _exit without unwinding.
            unsafe {
                libc::write(fds[1], byte.as_ptr().cast(), 1);
                libc::_exit(0);
            }
        }
        let mut byte = [9u8];
        // SAFETY: read into a local byte; waitpid on our own child.
        unsafe {
            libc::read(fds[0], byte.as_mut_ptr().cast(), 1);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        assert_eq!(byte[0], 1, "the fork saw the value");
        assert_eq!(s.as_bytes(), b"sekrit-value", "the parent keeps it");
        let mut t = String::from("transient");
        wipe_string(&mut t);
        assert!(t.is_empty());
    }
}
