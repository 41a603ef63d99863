//! Fuzzing the seccomp program builder (`sandbox::seccomp::build`) for both network modes:
//!
//! 1. the program is well formed the way the kernel's classic-BPF checker wants it (length,
//!    known opcodes, aligned loads inside `seccomp_data`, every jump in range, ends in RET),
//!    and the kernel itself accepts it (installed in a forked child);
//! 2. on random `seccomp_data` (architecture, syscall number with and without the x32 bit,
//!    arguments with random high words), a small classic-BPF interpreter running the program
//!    gives exactly the verdict of a reference policy written from the sandbox's spec;
//! 3. the interpreter agrees with the kernel on a few syscalls made for real under the filter.
//!
//! Seeds: fuzz/corpus/seccomp, lines of `mode arch nr arg0 .. arg5` (hex, mode none|all).

mod fuzz_support;

use openshell_sandbox::policy::NetworkMode;
use openshell_sandbox::sandbox::seccomp;
use proptest::prelude::*;
use seccompiler::sock_filter;

const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
const AUDIT_ARCH_I386: u32 = 0x4000_0003;
const X32_BIT: u32 = 0x4000_0000;

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

/// Denied outright with EPERM, from the sandbox's spec (issue 2 and seccomp.rs's comments).
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

/// The reference: what the sandbox promises for one syscall. The kernel reads only the low 32
/// bits of clone's flags, ioctl's request, personality's persona and socket's family and
/// protocol, so only those decide.
fn reference(mode: NetworkMode, d: &Data) -> Verdict {
    let eperm = Verdict::Errno(libc::EPERM as u16);
    if d.arch != AUDIT_ARCH_X86_64 || d.nr >= X32_BIT {
        return Verdict::KillProcess;
    }
    let nr = i64::from(d.nr);
    let lo = |i: usize| d.args[i] as u32;
    if nr == libc::SYS_clone3 {
        return Verdict::Errno(libc::ENOSYS as u16);
    }
    let denied = DENIED.contains(&nr)
        || (nr == libc::SYS_clone && lo(0) & CLONE_NEW != 0)
        || (nr == libc::SYS_unshare && lo(0) & (CLONE_NEW | CLONE_NEWTIME) != 0)
        || (nr == libc::SYS_ioctl && (lo(1) == TIOCSTI || lo(1) == TIOCLINUX))
        || (nr == libc::SYS_personality && lo(0) != 0 && lo(0) != 0xffff_ffff)
        || (nr == libc::SYS_socket
            && match mode {
                NetworkMode::None => lo(0) != libc::AF_UNIX as u32,
                NetworkMode::All => {
                    lo(0) == libc::AF_PACKET as u32
                        || lo(0) == libc::AF_VSOCK as u32
                        || (lo(0) == libc::AF_NETLINK as u32 && lo(2) != libc::NETLINK_ROUTE as u32)
                }
            });
    if denied { eperm } else { Verdict::Allow }
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
    prop_assert_eq!(got, reference(mode, d), "{:?} in mode {:?}", d, mode);
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
/// under the filter (in a forked child) and compare errno with the interpreter's verdict.
#[test]
fn interpreter_agrees_with_the_kernel() {
    let p = program(NetworkMode::None);
    let calls: [(i64, [u64; 6]); 5] = [
        (libc::SYS_socket, [libc::AF_INET as u64, 1, 0, 0, 0, 0]),
        (
            libc::SYS_socket,
            [(7u64 << 32) | libc::AF_UNIX as u64, 1, 0, 0, 0, 0],
        ),
        (libc::SYS_personality, [0xffff_ffff, 0, 0, 0, 0, 0]),
        (libc::SYS_clone3, [0, 0, 0, 0, 0, 0]),
        (
            libc::SYS_unshare,
            [libc::CLONE_NEWUSER as u64 | (1 << 40), 0, 0, 0, 0, 0],
        ),
    ];
    for (nr, args) in calls {
        let d = Data {
            nr: nr as u32,
            arch: AUDIT_ARCH_X86_64,
            args,
        };
        let want = interpret(p, &d);
        // SAFETY: as above; the child makes one raw syscall and reports its errno.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: raw syscalls on prepared data; _exit never returns.
            unsafe {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                if seccomp::install(p).is_err() {
                    libc::_exit(255);
                }
                let rc = libc::syscall(nr, args[0], args[1], args[2], args[3], args[4], args[5]);
                let e = if rc == -1 {
                    *libc::__errno_location()
                } else {
                    0
                };
                libc::_exit(e);
            }
        }
        let mut st = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        let errno = libc::WEXITSTATUS(st);
        match want {
            Verdict::Errno(e) => assert_eq!(errno, i32::from(e), "nr {nr} {args:x?}"),
            // Allowed: the call reached the kernel, which may still refuse it on its own.
            Verdict::Allow => assert_ne!(errno, libc::EPERM, "nr {nr} {args:x?} was filtered"),
            v => panic!("unexpected verdict {v:?} for nr {nr}"),
        }
    }
}

#[test]
fn seccomp_seeds() {
    for (name, bytes) in fuzz_support::corpus("seccomp") {
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
        .chain([
            libc::SYS_clone,
            libc::SYS_clone3,
            libc::SYS_unshare,
            libc::SYS_ioctl,
            libc::SYS_personality,
            libc::SYS_socket,
            libc::SYS_read,
            libc::SYS_openat,
            libc::SYS_execve,
            libc::SYS_memfd_create,
            libc::SYS_landlock_restrict_self,
            libc::SYS_seccomp,
        ])
        .map(|n| n as u32)
        .collect();
    prop_oneof![
        6 => proptest::sample::select(interesting.clone()),
        1 => proptest::sample::select(interesting).prop_map(|n| n | X32_BIT),
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
            libc::NETLINK_ROUTE as u32,
            libc::NETLINK_AUDIT as u32,
            TIOCSTI,
            TIOCLINUX,
            libc::CLONE_NEWUSER as u32,
            CLONE_NEWTIME,
            libc::SIGCHLD as u32,
            (libc::CLONE_VM | libc::CLONE_FS | libc::CLONE_FILES | libc::CLONE_SIGHAND) as u32,
            0x0040_0000, // READ_IMPLIES_EXEC
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
    fuzz_support::run(
        "filter_matches_the_reference_policy",
        fuzz_support::config(50_000),
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
