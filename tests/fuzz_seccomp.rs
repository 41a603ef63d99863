//! Fuzzing the seccomp program builder (`sandbox::seccomp::build`) for both network modes:
//!
//! 1. the program is well formed the way the kernel's classic-BPF checker wants it (length,
//!    known opcodes, aligned loads inside `seccomp_data`, every jump in range, ends in RET),
//!    and the kernel itself accepts it (installed in a forked child);
//! 2. on random `seccomp_data` (architecture, syscall number with and without the x32 bit,
//!    arguments with random high words), a small classic-BPF interpreter running the program
//!    gives exactly the verdict of a reference policy written from the sandbox's spec; where
//!    the spec says nothing (a number that is no syscall, such as -1), the expectation is
//!    what the real kernel answers without any filter, asked in a forked child, never a model
//!    of ours: the old oracle shared the filter's "bit 30 set → kill" and so could not see
//!    that syscall(-1) was killed where a bare kernel answers ENOSYS;
//! 3. the interpreter agrees with the kernel on a few syscalls made for real under the filter,
//!    and numbers outside every ABI get the same answer under the filter as without it.
//!
//! Seeds: fuzz/corpus/seccomp, lines of `mode arch nr arg0 .. arg5` (hex, mode none|all).

mod support;

use openshell_sandbox::policy::NetworkMode;
use openshell_sandbox::sandbox::seccomp;
use proptest::prelude::*;
use seccompiler::sock_filter;

const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
const AUDIT_ARCH_I386: u32 = 0x4000_0003;
const X32_BIT: u32 = 0x4000_0000;
/// The spec: numbers X32_BIT + 0..1024 are the x32 table (548 entries in Linux 6.18, with
/// room to grow) and are killed. Every other number's fate is the kernel's.
const X32_END: u32 = X32_BIT + 1024;
/// An unused uid for the bare-kernel probes: what such a probe could reach is its own.
const PROBE_UID: u32 = 64267;
/// Above PID_MAX_LIMIT (4194304): no process has it, so a call that gets through says ESRCH.
const NO_SUCH_PID: u64 = 0x3fff_fff0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Allow,
    Errno(u16),
    KillProcess,
    /// Any other action: never expected from this filter.
    Other(u32),
}

#[derive(Debug, Clone, Copy)]
struct Data {
    nr: u32,
    arch: u32,
    args: [u64; 6],
}

impl Data {
    /// A 32-bit word of `struct seccomp_data` at byte offset `k` (little endian).
    fn word(&self, k: u32) -> u32 {
        match k {
            0 => self.nr,
            4 => self.arch,
            8 | 12 => 0, // instruction_pointer: not used by the filter
            16..=60 => {
                let a = self.args[((k - 16) / 8) as usize];
                if (k - 16) % 8 == 0 {
                    a as u32
                } else {
                    (a >> 32) as u32
                }
            }
            _ => panic!("load outside seccomp_data at {k}"),
        }
    }
}

/// Well-formedness, as the kernel's checker sees it: returns the first problem.
fn well_formed(p: &[sock_filter]) -> Result<(), String> {
    if p.is_empty() || p.len() > 4096 {
        return Err(format!("length {}", p.len()));
    }
    for (pc, i) in p.iter().enumerate() {
        let next = pc + 1;
        let in_range = |off: usize| next + off < p.len();
        match i.code {
            0x20 => {
                if i.k % 4 != 0 || i.k >= 64 {
                    return Err(format!("{pc}: load at {} outside seccomp_data", i.k));
                }
            }
            0x54 => {} // A &= k
            0x05 => {
                if !in_range(i.k as usize) {
                    return Err(format!("{pc}: ja {} out of range", i.k));
                }
            }
            0x15 | 0x25 | 0x35 | 0x45 => {
                if !in_range(i.jt as usize) || !in_range(i.jf as usize) {
                    return Err(format!("{pc}: jump {}/{} out of range", i.jt, i.jf));
                }
            }
            0x06 => {}
            c => return Err(format!("{pc}: opcode {c:#x} not expected here")),
        }
    }
    if p[p.len() - 1].code != 0x06 {
        return Err("the last instruction is not RET".into());
    }
    Ok(())
}

/// Run the program on `d`. Jumps only go forward, so this always ends.
fn interpret(p: &[sock_filter], d: &Data) -> Verdict {
    let (mut pc, mut a) = (0usize, 0u32);
    loop {
        let i = &p[pc];
        pc += 1;
        match i.code {
            0x20 => a = d.word(i.k),
            0x54 => a &= i.k,
            0x05 => pc += i.k as usize,
            0x15 | 0x25 | 0x35 | 0x45 => {
                let taken = match i.code {
                    0x15 => a == i.k,
                    0x25 => a > i.k,
                    0x35 => a >= i.k,
                    _ => a & i.k != 0,
                };
                pc += if taken { i.jt } else { i.jf } as usize;
            }
            0x06 => {
                return match i.k & 0xffff_0000 {
                    0x7fff_0000 => Verdict::Allow,
                    0x0005_0000 => Verdict::Errno((i.k & 0xffff) as u16),
                    0x8000_0000 => Verdict::KillProcess,
                    _ => Verdict::Other(i.k),
                };
            }
            c => panic!("opcode {c:#x}"),
        }
    }
}

/// Denied outright with EPERM, from the sandbox's spec (seccomp.rs's
/// comments).
const DENIED: &[i64] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pidfd_getfd,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_mount_setattr,
    libc::SYS_setns,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_modify_ldt,
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_fanotify_init,
    libc::SYS_syslog,
];

/// A mode with either set-id bit is refused, at this argument (the kernel reads a umode_t).
const MODE_AT_1: &[i64] = &[
    libc::SYS_chmod,
    libc::SYS_fchmod,
    libc::SYS_creat,
    libc::SYS_mkdir,
    libc::SYS_mknod,
];
const MODE_AT_2: &[i64] = &[
    libc::SYS_fchmodat,
    libc::SYS_fchmodat2,
    libc::SYS_mkdirat,
    libc::SYS_mknodat,
];
const SETID: u32 = 0o6000;
/// O_CREAT | __O_TMPFILE: open and openat read their mode only with one of these.
const CREATES: u32 = 0o100 | 0o20_000_000;

/// Allowed only on the caller: pid (args[0]) 0.
const PID_ZERO_ONLY: &[i64] = &[
    libc::SYS_sched_setaffinity,
    libc::SYS_sched_setscheduler,
    libc::SYS_sched_setparam,
    libc::SYS_sched_setattr,
];

const CLONE_NEW: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u32;
const CLONE_NEWTIME: u32 = 0x80;
const TIOCSTI: u32 = 0x5412;
const TIOCLINUX: u32 = 0x541C;
const TIOCSETD: u32 = 0x5423;
const IOPRIO_WHO_PROCESS: u32 = 1;
const IOPRIO_WHO_USER: u32 = 3;

/// What the reference expects of one syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    /// The spec decides: exactly this verdict.
    Exactly(Verdict),
    /// The spec says nothing: the call must come out as on a bare kernel. Allowing it does
    /// that by definition; an errno must be the one the bare kernel gives.
    AsBareKernel,
}

/// The reference: what the sandbox promises for one syscall. The kernel reads only the low 32
/// bits of clone's flags, ioctl's request, personality's persona, socket's family and
/// protocol, and the pids, `which` and `who` of the scheduling calls, so only those decide;
/// prlimit64's new-limit pointer is 64 bits.
fn reference(mode: NetworkMode, d: &Data) -> Want {
    let eperm = Want::Exactly(Verdict::Errno(libc::EPERM as u16));
    if d.arch != AUDIT_ARCH_X86_64 || (X32_BIT..X32_END).contains(&d.nr) {
        return Want::Exactly(Verdict::KillProcess);
    }
    let nr = i64::from(d.nr);
    let lo = |i: usize| d.args[i] as u32;
    if nr == libc::SYS_clone3 || nr == libc::SYS_openat2 {
        return Want::Exactly(Verdict::Errno(libc::ENOSYS as u16));
    }
    let family_refused = || match mode {
        NetworkMode::None => lo(0) != libc::AF_UNIX as u32,
        NetworkMode::All => {
            let allowed = [
                libc::AF_UNIX,
                libc::AF_INET,
                libc::AF_INET6,
                libc::AF_NETLINK,
            ]
            .iter()
            .any(|&f| lo(0) == f as u32);
            !allowed || (lo(0) == libc::AF_NETLINK as u32 && lo(2) != libc::NETLINK_ROUTE as u32)
        }
    };
    let denied = DENIED.contains(&nr)
        || (nr == libc::SYS_clone && lo(0) & CLONE_NEW != 0)
        || (nr == libc::SYS_unshare && lo(0) & (CLONE_NEW | CLONE_NEWTIME) != 0)
        || (nr == libc::SYS_ioctl && (lo(1) == TIOCSTI || lo(1) == TIOCLINUX || lo(1) == TIOCSETD))
        || (nr == libc::SYS_personality && lo(0) != 0 && lo(0) != 0xffff_ffff)
        || ((nr == libc::SYS_socket || nr == libc::SYS_socketpair) && family_refused())
        || (PID_ZERO_ONLY.contains(&nr) && lo(0) != 0)
        || (nr == libc::SYS_setpriority && (lo(0) != libc::PRIO_PROCESS || lo(1) != 0))
        || (nr == libc::SYS_ioprio_set && (lo(0) != IOPRIO_WHO_PROCESS || lo(1) != 0))
        || (nr == libc::SYS_prlimit64 && lo(0) != 0 && d.args[2] != 0)
        || (MODE_AT_1.contains(&nr) && lo(1) & SETID != 0)
        || (MODE_AT_2.contains(&nr) && lo(2) & SETID != 0)
        || (nr == libc::SYS_open && lo(1) & CREATES != 0 && lo(2) & SETID != 0)
        || (nr == libc::SYS_openat && lo(2) & CREATES != 0 && lo(3) & SETID != 0);
    if denied {
        return eperm;
    }
    let decided = [
        libc::SYS_clone,
        libc::SYS_unshare,
        libc::SYS_ioctl,
        libc::SYS_personality,
        libc::SYS_socket,
        libc::SYS_socketpair,
        libc::SYS_setpriority,
        libc::SYS_ioprio_set,
        libc::SYS_prlimit64,
        libc::SYS_open,
        libc::SYS_openat,
    ];
    if decided.contains(&nr)
        || PID_ZERO_ONLY.contains(&nr)
        || MODE_AT_1.contains(&nr)
        || MODE_AT_2.contains(&nr)
    {
        Want::Exactly(Verdict::Allow)
    } else {
        Want::AsBareKernel
    }
}

/// How a forked child's raw syscall ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Returned(i64),
    Errno(i32),
    Signal(i32),
    /// It ended the child itself (exit, exit_group) before it could answer.
    Exited(i32),
}

/// Make one raw syscall in a forked child and say how it ended; with `filter`, under it.
/// Without a filter, a root caller first becomes [`PROBE_UID`] (no capabilities, no
/// supplementary groups): a number the kernel does implement then reaches nothing but the
/// child itself. `alarm` bounds a call that would block.
fn call_in_child(filter: Option<&[sock_filter]>, nr: u32, args: [u64; 6]) -> Answer {
    let mut p = [0i32; 2];
    // SAFETY: pipe2 writes two descriptors into `p`.
    assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: the child makes only raw syscalls on data prepared before fork, then _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: raw syscalls with integer arguments or pointers to the child's own stack.
        unsafe {
            libc::close(p[0]);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            libc::setpgid(0, 0);
            if libc::geteuid() == 0 {
                let ok = libc::setgroups(0, std::ptr::null()) == 0
                    && libc::setresgid(PROBE_UID, PROBE_UID, PROBE_UID) == 0
                    && libc::setresuid(PROBE_UID, PROBE_UID, PROBE_UID) == 0;
                if !ok {
                    libc::_exit(120);
                }
            }
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
            if let Some(f) = filter {
                if seccomp::install(f).is_err() {
                    libc::_exit(121);
                }
            }
            libc::alarm(2);
            let rc = libc::syscall(
                i64::from(nr as i32),
                args[0],
                args[1],
                args[2],
                args[3],
                args[4],
                args[5],
            );
            let e = if rc == -1 {
                i64::from(*libc::__errno_location())
            } else {
                0
            };
            let msg = [rc, e];
            libc::write(p[1], msg.as_ptr().cast(), 16);
            libc::_exit(0);
        }
    }
    // SAFETY: closing our copy of the write end.
    unsafe { libc::close(p[1]) };
    let mut msg = [0i64; 2];
    // SAFETY: reading at most 16 bytes into `msg`.
    let n = unsafe { libc::read(p[0], msg.as_mut_ptr().cast(), 16) };
    let mut st = 0;
    // SAFETY: closing the read end; waiting for our own child.
    unsafe {
        libc::close(p[0]);
        libc::waitpid(pid, &mut st, 0);
    }
    if libc::WIFEXITED(st) && matches!(libc::WEXITSTATUS(st), 120 | 121) {
        panic!("probe child could not set itself up (status {st:#x})");
    }
    if n == 16 {
        if msg[0] == -1 {
            Answer::Errno(msg[1] as i32)
        } else {
            Answer::Returned(msg[0])
        }
    } else if libc::WIFSIGNALED(st) {
        Answer::Signal(libc::WTERMSIG(st))
    } else {
        Answer::Exited(libc::WEXITSTATUS(st))
    }
}

/// The bare kernel's answer for a number, asked once per number. ENOSYS depends on the number
/// alone, never on the arguments, so zero arguments do.
fn bare_kernel(nr: u32) -> Answer {
    static SEEN: std::sync::Mutex<Vec<(u32, Answer)>> = std::sync::Mutex::new(Vec::new());
    if let Some(&(_, a)) = SEEN.lock().unwrap().iter().find(|(n, _)| *n == nr) {
        return a;
    }
    let a = call_in_child(None, nr, [0; 6]);
    SEEN.lock().unwrap().push((nr, a));
    a
}

fn program(mode: NetworkMode) -> &'static [sock_filter] {
    static NONE: std::sync::OnceLock<Vec<sock_filter>> = std::sync::OnceLock::new();
    static ALL: std::sync::OnceLock<Vec<sock_filter>> = std::sync::OnceLock::new();
    let cell = match mode {
        NetworkMode::None => &NONE,
        NetworkMode::All => &ALL,
    };
    cell.get_or_init(|| seccomp::build(mode).expect("the filter builds"))
}

fn check(mode: NetworkMode, d: &Data) -> Result<(), TestCaseError> {
    let got = interpret(program(mode), d);
    match reference(mode, d) {
        Want::Exactly(v) => prop_assert_eq!(got, v, "{:?} in mode {:?}", d, mode),
        Want::AsBareKernel => match got {
            Verdict::Allow => {}
            // The filter answers for the kernel: only right if the kernel has no such call.
            Verdict::Errno(e) if i32::from(e) == libc::ENOSYS => prop_assert_eq!(
                bare_kernel(d.nr),
                Answer::Errno(libc::ENOSYS),
                "{:?}: the filter says ENOSYS, the bare kernel does not",
                d
            ),
            v => prop_assert!(
                false,
                "{:?} in mode {:?}: the spec says nothing, so it must come out as on a bare \
                 kernel ({:?}), but the filter says {:?}",
                d,
                mode,
                bare_kernel(d.nr),
                v
            ),
        },
    }
    Ok(())
}

#[test]
fn programs_are_well_formed_and_the_kernel_accepts_them() {
    for mode in [NetworkMode::None, NetworkMode::All] {
        let p = program(mode);
        well_formed(p).unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        // SAFETY: the child only makes raw syscalls on `p`, built before fork, then _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: prctl with integer arguments; _exit never returns.
            unsafe {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                libc::_exit(if seccomp::install(p).is_ok() { 0 } else { 1 });
            }
        }
        let mut st = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "{mode:?}: the kernel refused the program ({st:#x})"
        );
    }
}

/// The interpreter is only as good as its agreement with the kernel: make a few calls for real
/// under the filter (in a forked child) and compare the outcome with the interpreter's verdict.
/// Every call is harmless if it got through: the child is an unused uid (when we are root),
/// and the targets of the scheduling calls are a pid no process has, or a uid with no process.
#[test]
fn interpreter_agrees_with_the_kernel() {
    let none = libc::AF_UNIX as u64;
    let (inet, alg, netlink) = (
        libc::AF_INET as u64,
        libc::AF_ALG as u64,
        libc::AF_NETLINK as u64,
    );
    let idle = 3u64 << 13;
    // Valid in the forked child too: a static string of this process.
    let missing = c"/nonexistent-osb-fuzz/file".as_ptr() as u64;
    let at = libc::AT_FDCWD as u64;
    let calls: &[(NetworkMode, i64, [u64; 6])] = &[
        (NetworkMode::None, libc::SYS_socket, [inet, 1, 0, 0, 0, 0]),
        (
            NetworkMode::None,
            libc::SYS_socket,
            [(7 << 32) | none, 1, 0, 0, 0, 0],
        ),
        (
            NetworkMode::None,
            libc::SYS_socketpair,
            [inet, 1, 0, 0, 0, 0],
        ),
        (
            NetworkMode::All,
            libc::SYS_socketpair,
            [inet, 1, 0, 0, 0, 0],
        ),
        (NetworkMode::All, libc::SYS_socket, [alg, 5, 0, 0, 0, 0]),
        (NetworkMode::All, libc::SYS_socketpair, [alg, 5, 0, 0, 0, 0]),
        (NetworkMode::All, libc::SYS_socket, [netlink, 3, 9, 0, 0, 0]),
        (NetworkMode::All, libc::SYS_socket, [netlink, 3, 0, 0, 0, 0]),
        (
            NetworkMode::None,
            libc::SYS_personality,
            [0xffff_ffff, 0, 0, 0, 0, 0],
        ),
        (NetworkMode::None, libc::SYS_clone3, [0; 6]),
        (
            NetworkMode::None,
            libc::SYS_unshare,
            [libc::CLONE_NEWUSER as u64 | (1 << 40), 0, 0, 0, 0, 0],
        ),
        // Not a syscall on any ABI: the kernel's ENOSYS, and the child lives to say so.
        (NetworkMode::None, -1, [0; 6]),
        (NetworkMode::None, libc::SYS_fanotify_init, [0; 6]),
        // Another pid's limits: a set is refused, a read (new NULL) reaches the kernel (ESRCH).
        (
            NetworkMode::None,
            libc::SYS_prlimit64,
            [NO_SUCH_PID, 7, 1, 0, 0, 0],
        ),
        (
            NetworkMode::None,
            libc::SYS_prlimit64,
            [NO_SUCH_PID, 7, 1 << 32, 0, 0, 0],
        ),
        (
            NetworkMode::None,
            libc::SYS_prlimit64,
            [NO_SUCH_PID, 7, 0, 0, 0, 0],
        ),
        (
            NetworkMode::None,
            libc::SYS_setpriority,
            [0, NO_SUCH_PID, 19, 0, 0, 0],
        ),
        (
            NetworkMode::None,
            libc::SYS_setpriority,
            [
                libc::PRIO_USER as u64,
                u64::from(PROBE_UID + 1),
                19,
                0,
                0,
                0,
            ],
        ),
        (
            NetworkMode::None,
            libc::SYS_ioprio_set,
            [
                u64::from(IOPRIO_WHO_USER),
                u64::from(PROBE_UID + 1),
                idle,
                0,
                0,
                0,
            ],
        ),
        (
            NetworkMode::None,
            libc::SYS_sched_setaffinity,
            [NO_SUCH_PID, 8, 0, 0, 0, 0],
        ),
        (
            NetworkMode::None,
            libc::SYS_sched_setscheduler,
            [NO_SUCH_PID, 5, 0, 0, 0, 0],
        ),
        (
            NetworkMode::None,
            libc::SYS_sched_setparam,
            [NO_SUCH_PID, 0, 0, 0, 0, 0],
        ),
        (
            NetworkMode::None,
            libc::SYS_sched_setattr,
            [NO_SUCH_PID, 0, 0, 0, 0, 0],
        ),
        // Set-id bits in a mode: refused; without them (or without O_CREAT) through to the
        // kernel, which cannot find the path.
        (
            NetworkMode::None,
            libc::SYS_chmod,
            [missing, 0o4755, 0, 0, 0, 0],
        ),
        (
            NetworkMode::None,
            libc::SYS_chmod,
            [missing, 0o755, 0, 0, 0, 0],
        ),
        (
            NetworkMode::None,
            libc::SYS_fchmodat2,
            [at, missing, 0o2755, 0, 0, 0],
        ),
        (
            NetworkMode::None,
            libc::SYS_openat,
            [at, missing, 0o100, 0o4755, 0, 0],
        ),
        (
            NetworkMode::None,
            libc::SYS_openat,
            [at, missing, 0, 0o4755, 0, 0],
        ),
        (
            NetworkMode::None,
            libc::SYS_mkdir,
            [missing, 0o2755, 0, 0, 0, 0],
        ),
        (
            NetworkMode::None,
            libc::SYS_openat2,
            [at, missing, 0, 24, 0, 0],
        ),
        (NetworkMode::None, libc::SYS_syslog, [10, 0, 0, 0, 0, 0]),
        // The caller itself: through to the kernel.
        (
            NetworkMode::None,
            libc::SYS_setpriority,
            [0, 0, 19, 0, 0, 0],
        ),
        (
            NetworkMode::None,
            libc::SYS_ioprio_set,
            [1, 0, idle, 0, 0, 0],
        ),
    ];
    for &(mode, nr, args) in calls {
        let d = Data {
            nr: nr as u32,
            arch: AUDIT_ARCH_X86_64,
            args,
        };
        let want = interpret(program(mode), &d);
        let got = call_in_child(Some(program(mode)), nr as u32, args);
        match want {
            Verdict::Errno(e) => assert_eq!(
                got,
                Answer::Errno(i32::from(e)),
                "{mode:?} nr {nr} {args:x?}"
            ),
            // Allowed: the call reached the kernel, which may still refuse it on its own, but
            // not with the filter's EPERM or its kill.
            Verdict::Allow => assert!(
                matches!(got, Answer::Returned(_))
                    || matches!(got, Answer::Errno(e) if e != libc::EPERM),
                "{mode:?} nr {nr} {args:x?} was filtered: {got:?}"
            ),
            v => panic!("unexpected verdict {v:?} for nr {nr}"),
        }
    }
}

/// Numbers that are no syscall on any ABI get, under the filter, exactly what a bare kernel
/// gives them: both asked for real, the bare one without any filter. -1 is the case the old
/// filter and its oracle got wrong together (killed as x32).
#[test]
fn numbers_outside_every_abi_answer_as_on_a_bare_kernel() {
    let mut nrs: Vec<u32> = vec![
        0xffff_ffff,
        0xffff_fffe,
        X32_END,
        X32_END + 1,
        0x7fff_ffff,
        0x8000_0000,
        0x8000_0000 | libc::SYS_getpid as u32,
        0xc000_0000 | libc::SYS_getpid as u32,
        0xbfff_ffff,
        0x3fff_ffff,
        1000,
    ];
    // A spread of others, from a fixed generator so that a failure repeats.
    let mut x: u32 = 0x9e37_79b9;
    while nrs.len() < 48 {
        x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        if !(X32_BIT..X32_END).contains(&x) {
            nrs.push(x);
        }
    }
    for mode in [NetworkMode::None, NetworkMode::All] {
        for &nr in &nrs {
            let bare = bare_kernel(nr);
            assert_eq!(
                bare,
                Answer::Errno(libc::ENOSYS),
                "{nr:#x} is a syscall here?"
            );
            let filtered = call_in_child(Some(program(mode)), nr, [0; 6]);
            assert_eq!(filtered, bare, "{mode:?}: nr {nr:#x} under the filter");
        }
    }
}

#[test]
fn seccomp_seeds() {
    for (name, bytes) in support::fuzz::corpus("seccomp") {
        for line in String::from_utf8_lossy(&bytes).lines() {
            let w: Vec<&str> = line.split('#').next().unwrap().split_whitespace().collect();
            if w.is_empty() {
                continue;
            }
            let mode = if w[0] == "all" {
                NetworkMode::All
            } else {
                NetworkMode::None
            };
            let h = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
            let mut args = [0u64; 6];
            for (i, a) in w[3..].iter().enumerate().take(6) {
                args[i] = h(a);
            }
            let d = Data {
                arch: h(w[1]) as u32,
                nr: h(w[2]) as u32,
                args,
            };
            check(mode, &d).unwrap_or_else(|e| panic!("seed {name}: {line}: {e}"));
        }
    }
}

/// Numbers that decide something, with and without the x32 bit, plus anything at all.
fn nr() -> impl Strategy<Value = u32> {
    let interesting: Vec<u32> = DENIED
        .iter()
        .copied()
        .chain(MODE_AT_1.iter().chain(MODE_AT_2).copied())
        .chain([
            libc::SYS_clone,
            libc::SYS_clone3,
            libc::SYS_unshare,
            libc::SYS_ioctl,
            libc::SYS_personality,
            libc::SYS_socket,
            libc::SYS_socketpair,
            libc::SYS_setpriority,
            libc::SYS_ioprio_set,
            libc::SYS_prlimit64,
            libc::SYS_sched_setaffinity,
            libc::SYS_sched_setscheduler,
            libc::SYS_sched_setparam,
            libc::SYS_sched_setattr,
            libc::SYS_getpriority,
            libc::SYS_read,
            libc::SYS_openat,
            libc::SYS_open,
            libc::SYS_openat2,
            libc::SYS_execve,
            libc::SYS_memfd_create,
            libc::SYS_landlock_restrict_self,
            libc::SYS_seccomp,
        ])
        .map(|n| n as u32)
        .collect();
    // The edges of the x32 table, and numbers that are no syscall on any ABI.
    let edges = vec![
        X32_BIT - 1,
        X32_BIT,
        X32_END - 1,
        X32_END,
        0x7fff_ffff,
        0x8000_0000,
        0xffff_fffe,
        0xffff_ffff,
    ];
    prop_oneof![
        6 => proptest::sample::select(interesting.clone()),
        1 => proptest::sample::select(interesting).prop_map(|n| n | X32_BIT),
        1 => proptest::sample::select(edges),
        1 => 0u32..512,
        1 => any::<u32>(),
    ]
}

/// An argument whose low word is a value the filter compares against, under random high bits.
fn arg() -> impl Strategy<Value = u64> {
    let low = prop_oneof![
        proptest::sample::select(vec![
            0u32,
            0xffff_ffff,
            libc::AF_UNIX as u32,
            libc::AF_INET as u32,
            libc::AF_INET6 as u32,
            libc::AF_NETLINK as u32,
            libc::AF_PACKET as u32,
            libc::AF_VSOCK as u32,
            libc::AF_ALG as u32,
            libc::AF_TIPC as u32,
            libc::AF_RDS as u32,
            libc::AF_CAN as u32,
            libc::AF_BLUETOOTH as u32,
            44, // AF_XDP
            41, // AF_KCM
            libc::NETLINK_ROUTE as u32,
            libc::NETLINK_AUDIT as u32,
            TIOCSTI,
            TIOCLINUX,
            TIOCSETD,
            libc::CLONE_NEWUSER as u32,
            CLONE_NEWTIME,
            libc::SIGCHLD as u32,
            (libc::CLONE_VM | libc::CLONE_FS | libc::CLONE_FILES | libc::CLONE_SIGHAND) as u32,
            0x0040_0000, // READ_IMPLIES_EXEC
            libc::PRIO_USER,
            libc::PRIO_PGRP,
            IOPRIO_WHO_USER,
            0o4755,
            0o2755,
            0o755,
            0o100,        // O_CREAT
            0o20_200_002, // O_TMPFILE | O_RDWR
            0o100_4755,   // S_IFREG | 04755
        ]),
        any::<u32>(),
        (0u32..32).prop_map(|b| 1 << b),
    ];
    let high = prop_oneof![Just(0u32), any::<u32>(), Just(0xffff_ffff)];
    (low, high).prop_map(|(l, h)| (u64::from(h) << 32) | u64::from(l))
}

fn data() -> impl Strategy<Value = Data> {
    let arch = prop_oneof![
        8 => Just(AUDIT_ARCH_X86_64),
        1 => Just(AUDIT_ARCH_I386),
        1 => any::<u32>(),
    ];
    (arch, nr(), proptest::array::uniform6(arg())).prop_map(|(arch, nr, args)| Data {
        nr,
        arch,
        args,
    })
}

#[test]
fn filter_matches_the_reference_policy() {
    support::fuzz::run(
        "filter_matches_the_reference_policy",
        support::fuzz::config(50_000),
        &(data(), any::<bool>()),
        |(d, all)| {
            let mode = if all {
                NetworkMode::All
            } else {
                NetworkMode::None
            };
            check(mode, &d)
        },
    );
}
