//! A fork of the supervisor forgets the supervisor's memory once it no longer needs it: its
//! copy of the supervisor's heaps and thread stacks holds whatever the supervisor held at the
//! fork, freed or not (in `serve`, the provider environment's reply and the buffers of
//! requests the proxy rewrote with credential values). Two such forks live on: the exec's init
//! (once the command has exec'd it only reaps and relays signals) and the helper that builds a
//! view (once it has reported it only waits to be let go). Each keeps its own stack, its thread
//! pointer and its statics: every other private anonymous mapping is dropped with
//! `MADV_DONTNEED` (its pages read as zeroes afterwards).
//!
//! Kept: the mapping holding our stack pointer, the one holding our thread pointer (glibc
//! keeps a thread's TLS at the top of its stack mapping; checked anyway), named mappings
//! (`[stack]`, `[vdso]`, files), and every anonymous mapping that directly follows a file
//! mapping (an ELF object's `.bss`, where our statics and libc's live). Async-signal-safe:
//! raw syscalls and a stack buffer; a failure leaves the memory as it was.

/// One `/proc/self/maps` line's fields that matter here.
struct Mapping {
    start: usize,
    end: usize,
    private_rw: bool,
    /// Neither a file (inode 0) nor a named region (`[heap]` counts as anonymous).
    anonymous: bool,
}

fn hex(s: &[u8]) -> Option<usize> {
    let mut v: usize = 0;
    if s.is_empty() {
        return None;
    }
    for &c in s {
        let d = (c as char).to_digit(16)? as usize;
        v = v.checked_mul(16)?.checked_add(d)?;
    }
    Some(v)
}

/// Parse `start-end perms offset dev inode [path]`.
fn parse(line: &[u8]) -> Option<Mapping> {
    let mut f = line.split(|b| *b == b' ').filter(|s| !s.is_empty());
    let range = f.next()?;
    let perms = f.next()?;
    let _offset = f.next()?;
    let _dev = f.next()?;
    let inode = f.next()?;
    let path = f.next().unwrap_or(b"");
    let dash = range.iter().position(|b| *b == b'-')?;
    Some(Mapping {
        start: hex(&range[..dash])?,
        end: hex(&range[dash + 1..])?,
        private_rw: perms.starts_with(b"rw") && perms.get(3) == Some(&b'p'),
        anonymous: inode == b"0" && (path.is_empty() || path == b"[heap]"),
    })
}

/// Whether `m` is dropped: private, writable, anonymous, holding neither `keep` address, and
/// not the `.bss` of the file mapping that ends where it starts.
fn dropped(m: &Mapping, prev_file_end: Option<usize>, keep: &[usize]) -> bool {
    m.private_rw
        && m.anonymous
        && prev_file_end != Some(m.start)
        && !keep.iter().any(|a| (m.start..m.end).contains(a))
}

fn thread_pointer() -> usize {
    let tp: usize;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: reads the fs base register, no memory access.
    unsafe {
        std::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags));
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: reads the thread pointer register, no memory access.
    unsafe {
        std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nomem, nostack, preserves_flags));
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        tp = 0;
    }
    tp
}

/// Drop every mapping [`dropped`] names (see the module's comment).
///
/// `/proc/self/maps`, opened ahead by a child that will not see a `/proc` where it forgets (the
/// view helper, once inside the view's root). -1 if it cannot be opened.
pub fn open_maps() -> i32 {
    // SAFETY: open of a constant C string.
    unsafe {
        libc::open(
            c"/proc/self/maps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    }
}

/// # Safety
/// Only in a forked, single-threaded child that from here on touches nothing but its own
/// stack, its thread-local storage and the statics of the loaded objects.
/// `maps`: a descriptor of [`open_maps`] made by this process (taken and closed here), or
/// `None` to open `/proc/self/maps` now. `also` names more addresses whose mappings stay (the
/// statics the signal handlers read).
pub unsafe fn forget_supervisor_memory(maps: Option<i32>, also: usize) {
    let here = 0u8;
    let keep = [std::ptr::addr_of!(here) as usize, thread_pointer(), also];
    // SAFETY: open/read/madvise/close on a stack buffer; the mappings dropped are ones this
    // process (a private copy of the supervisor) no longer reads, per the caller's contract.
    unsafe {
        let fd = maps.unwrap_or_else(open_maps);
        if fd < 0 {
            return;
        }
        let mut buf = [0u8; 8192];
        let mut have = 0usize;
        let mut prev_file_end: Option<usize> = None;
        loop {
            let n = libc::read(fd, buf[have..].as_mut_ptr().cast(), buf.len() - have);
            if n <= 0 {
                break;
            }
            have += n as usize;
            let mut used = 0;
            while let Some(nl) = buf[used..have].iter().position(|b| *b == b'\n') {
                let line = &buf[used..used + nl];
                if let Some(m) = parse(line) {
                    // Dropping a mapping does not change the list still to be read: the
                    // mapping stays, only its pages go.
                    if dropped(&m, prev_file_end, &keep) {
                        libc::madvise(
                            m.start as *mut libc::c_void,
                            m.end - m.start,
                            libc::MADV_DONTNEED,
                        );
                    }
                    prev_file_end = (!m.anonymous).then_some(m.end);
                }
                used += nl + 1;
            }
            buf.copy_within(used..have, 0);
            have -= used;
            if have == buf.len() {
                // A line longer than the buffer (a very long path): skip it.
                have = 0;
            }
        }
        libc::close(fd);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heaps_and_foreign_stacks_go_bss_and_our_own_stay() {
        let m = |l: &str| parse(l.as_bytes()).unwrap();
        let heap =
            m("55d0c0000000-55d0c0100000 rw-p 00000000 00:00 0                          [heap]");
        let arena = m("7f8d54000000-7f8d54021000 rw-p 00000000 00:00 0 ");
        let bss = m("7f8d60010000-7f8d60020000 rw-p 00000000 00:00 0 ");
        let file = m("7f8d60000000-7f8d60010000 rw-p 0001f000 08:01 1234 /usr/lib/libc.so.6");
        let stack =
            m("7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]");
        let ro = m("7f8d55000000-7f8d55001000 r--p 00000000 00:00 0 ");
        assert!(heap.anonymous && !file.anonymous && !stack.anonymous);
        assert!(dropped(&heap, None, &[]));
        assert!(dropped(&arena, Some(0x7f8d53000000), &[]));
        assert!(!dropped(&arena, None, &[0x7f8d54000100]), "holds our stack");
        assert!(!dropped(&bss, Some(file.end), &[]), "an object's .bss");
        assert!(!dropped(&file, None, &[]));
        assert!(!dropped(&stack, None, &[]));
        assert!(!dropped(&ro, None, &[]));
        assert!(parse(b"garbage").is_none());
    }

    #[test]
    fn a_forked_child_forgets_the_heap_and_keeps_working() {
        let secret = String::from("forget-me-0b1c2d");
        let ptr = secret.as_ptr() as usize;
        let mut fds = [0; 2];
        // SAFETY: a pipe into a local array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child makes raw syscalls and reads memory only, then _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: we are the forked child; after this it touches only its stack.
            unsafe {
                forget_supervisor_memory(None, 0);
                let first = *(ptr as *const u8);
                let byte = [first];
                libc::write(fds[1], byte.as_ptr().cast(), 1);
                libc::_exit(0);
            }
        }
        let mut byte = [9u8];
        let mut st = 0;
        // SAFETY: read into a local byte; waitpid on our own child.
        unsafe {
            libc::read(fds[0], byte.as_mut_ptr().cast(), 1);
            libc::waitpid(pid, &mut st, 0);
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0, "{st:#x}");
        assert_eq!(byte[0], 0, "the child still saw the heap's bytes");
        assert_eq!(secret, "forget-me-0b1c2d");
    }
}
