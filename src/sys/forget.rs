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
//! (`[vdso]`, files), and every anonymous mapping that directly follows a file mapping (an ELF
//! object's `.bss`, where our statics and libc's live). The main thread's `[stack]`, when it
//! is not ours, keeps only what the kernel put there at exec, from the page of the main
//! thread's first frame up (argc, the argv and environment arrays and strings, the auxiliary
//! vector: the area /proc/1/cmdline reads, scrubbed by the init): the main thread's frames
//! below it are dropped like any other thread's stack, since `serve`'s main thread runs the
//! gateway's tasks and its old frames hold what they held. Where that page is not known
//! ([`note_main_stack`] never ran), the whole `[stack]` is kept. Async-signal-safe: raw
//! syscalls and a stack buffer; a failure leaves the memory as it was.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The page holding the main thread's first frame (`startstack` of /proc/self/stat, rounded
/// down to its page); 0 until [`note_main_stack`] has read it.
static MAIN_STACK_KEPT_FROM: AtomicUsize = AtomicUsize::new(0);

/// Read where the main thread's first frame is, once, before any fork that forgets (it
/// allocates, so never in a forked child).
pub fn note_main_stack() {
    if MAIN_STACK_KEPT_FROM.load(Ordering::Relaxed) != 0 {
        return;
    }
    let stat = super::procstat::read_record("/proc/self/stat").unwrap_or_default();
    if let Some(top) = start_stack(&stat) {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        MAIN_STACK_KEPT_FROM.store(top & !(page - 1), Ordering::Relaxed);
    }
}

/// Field 28 of a /proc/PID/stat line (`startstack`), read past the command name (which may
/// hold spaces or parentheses): the fields after its last `)` start with field 3.
fn start_stack(stat: &str) -> Option<usize> {
    crate::sys::procstat::StatLine::new(stat)?
        .num(28)
        .filter(|a| *a != 0)
}

/// One `/proc/self/maps` line's fields that matter here.
struct Mapping {
    start: usize,
    end: usize,
    private_rw: bool,
    /// Neither a file (inode 0) nor a named region (`[heap]` counts as anonymous).
    anonymous: bool,
    /// The main thread's stack.
    main_stack: bool,
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
        main_stack: path == b"[stack]",
    })
}

/// The part of `m` that is dropped, if any: all of a private, writable, anonymous mapping
/// holding neither `keep` address and not the `.bss` of the file mapping that ends where it
/// starts; of the main thread's stack, when it holds no `keep` address, what lies below
/// `stack_kept_from` (0: unknown, all kept).
fn dropped(
    m: &Mapping,
    prev_file_end: Option<usize>,
    keep: &[usize],
    stack_kept_from: usize,
) -> Option<(usize, usize)> {
    if !m.private_rw || keep.iter().any(|a| (m.start..m.end).contains(a)) {
        return None;
    }
    if m.main_stack {
        return (m.start < stack_kept_from && stack_kept_from <= m.end)
            .then_some((m.start, stack_kept_from));
    }
    (m.anonymous && prev_file_end != Some(m.start)).then_some((m.start, m.end))
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
    let stack_kept_from = MAIN_STACK_KEPT_FROM.load(Ordering::Relaxed);
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
                    if let Some((start, end)) = dropped(&m, prev_file_end, &keep, stack_kept_from) {
                        libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
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
        let all = |m: &Mapping| Some((m.start, m.end));
        assert_eq!(dropped(&heap, None, &[], 0), all(&heap));
        assert_eq!(dropped(&arena, Some(0x7f8d53000000), &[], 0), all(&arena));
        assert_eq!(
            dropped(&arena, None, &[0x7f8d54000100], 0),
            None,
            "holds our stack"
        );
        assert_eq!(
            dropped(&bss, Some(file.end), &[], 0),
            None,
            "an object's .bss"
        );
        assert_eq!(dropped(&file, None, &[], 0), None);
        assert_eq!(dropped(&ro, None, &[], 0), None);
        // The main thread's stack: below its first frame's page, unless it is ours or that
        // page is unknown.
        assert!(stack.main_stack && !heap.main_stack);
        let first = 0x7ffc00020000;
        assert_eq!(
            dropped(&stack, None, &[], first),
            Some((stack.start, first))
        );
        assert_eq!(dropped(&stack, None, &[], 0), None, "not known: kept");
        assert_eq!(
            dropped(&stack, None, &[0x7ffc00001000], first),
            None,
            "ours"
        );
        assert_eq!(
            dropped(&stack, None, &[], stack.end + 4096),
            None,
            "elsewhere"
        );
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

    #[test]
    fn start_stack_is_field_28_past_the_command_name() {
        let rest: Vec<String> = (3..=52).map(|f| f.to_string()).collect();
        let line = format!("4242 (a) b (c)) {}", rest.join(" "));
        assert_eq!(start_stack(&line), Some(28));
        assert_eq!(start_stack("4242 (x) S 1"), None);
    }

    /// The main thread's old frames go, what the kernel put above its first frame (the argv
    /// strings) stays. The child runs on this test thread's stack, never on `[stack]`.
    #[test]
    fn a_forked_child_forgets_the_main_threads_frames_and_keeps_its_arguments() {
        note_main_stack();
        let from = MAIN_STACK_KEPT_FROM.load(Ordering::Relaxed);
        assert_ne!(from, 0, "/proc/self/stat gave no startstack");
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line = maps.lines().find(|l| l.ends_with("[stack]")).unwrap();
        let stack = parse(line.as_bytes()).unwrap();
        let here = 0u8;
        if (stack.start..stack.end).contains(&(std::ptr::addr_of!(here) as usize)) {
            eprintln!("skipped: this test runs on the main thread, whose stack a fork keeps");
            return;
        }
        let low = stack.start;
        assert!(low < from, "{line} {from:#x}");
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let arg_start: usize = crate::sys::procstat::StatLine::new(&stat)
            .unwrap()
            .num(48)
            .unwrap();
        assert!(arg_start >= from);
        let mut fds = [0; 2];
        // SAFETY: a pipe into a local array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child makes raw syscalls and plain loads and stores only, then _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: we are the forked child, whose only thread is this one: nothing runs
            // on the main thread's stack here, so its lowest page is ours to write. After
            // forget it touches only its own stack.
            unsafe {
                let planted = low as *mut u8;
                std::ptr::write_volatile(planted, 0x5a);
                let arg = std::ptr::read_volatile(arg_start as *const u8);
                forget_supervisor_memory(None, 0);
                let out = [
                    std::ptr::read_volatile(planted),
                    std::ptr::read_volatile(arg_start as *const u8),
                    arg,
                ];
                libc::write(fds[1], out.as_ptr().cast(), out.len());
                libc::_exit(0);
            }
        }
        let mut out = [9u8; 3];
        let mut st = 0;
        // SAFETY: read into a local array; waitpid on our own child.
        unsafe {
            libc::read(fds[0], out.as_mut_ptr().cast(), out.len());
            libc::waitpid(pid, &mut st, 0);
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0, "{st:#x}");
        assert_eq!(
            out[0], 0,
            "the child still saw the main thread's old frames"
        );
        assert_ne!(out[2], 0, "argv[0] starts with a byte");
        assert_eq!(out[1], out[2], "the argument area was dropped");
    }
}
