//! seccomp layer: a deny-list compiled once with seccompiler, installed in the child as the very
//! last step before exec.
//!
//! The program is one filter, so installing it costs one `seccomp(2)` call:
//!
//! 1. a hand-written prefix of six instructions for the three cases seccompiler cannot express
//!    (a foreign architecture, the x32 syscall bit, and clone3 answered with ENOSYS), then
//! 2. seccompiler's compiled rule chain, which returns EPERM for every matching rule and
//!    allows everything else.
//!
//! Default-allow is deliberate: the filter removes kernel attack surface and escape routes;
//! what files and sockets a child may use is Landlock's and the identity layer's job. Each
//! entry below says why it is denied and why the errno is the one callers expect.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch, sock_filter,
};

use crate::policy::NetworkMode;

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("building the seccomp rule for syscall {nr}: {source}")]
    Rule {
        nr: i64,
        source: seccompiler::BackendError,
    },
    #[error("compiling the seccomp filter: {0}")]
    Compile(seccompiler::BackendError),
    #[error("the seccomp dispatch tree needs a jump longer than BPF allows")]
    TooFar,
    #[error("seccomp is only built for x86_64 here")]
    UnsupportedArch,
}

// Classic BPF opcodes (linux/bpf_common.h) for the hand-written prefix.
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x15;
const BPF_JMP_JGE_K: u16 = 0x35;
const BPF_JMP_JSET_K: u16 = 0x45;
const BPF_JMP_JA: u16 = 0x05;
const BPF_RET_K: u16 = 0x06;
const SECCOMP_DATA_NR: u32 = 0;
const SECCOMP_DATA_ARCH: u32 = 4;
/// Low 32 bits of args[0] (little endian).
const SECCOMP_DATA_ARG0_LO: u32 = 16;
const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
/// Syscall numbers at or above this have the x32 ABI bit set.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;

const fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

const fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// Every CLONE_NEW* flag that clone(2) accepts. CLONE_NEWTIME is unshare-only: in clone(2)'s
/// flags that bit is part of the exit-signal byte.
const CLONE_NEW_MASK: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u32;
const CLONE_NEWTIME: u32 = 0x80;
const UNSHARE_NEW_MASK: u32 = CLONE_NEW_MASK | CLONE_NEWTIME;

/// The instructions that run before seccompiler's chain: the cases seccompiler cannot
/// express in a few instructions.
fn prefix() -> Vec<sock_filter> {
    let eperm = SECCOMP_RET_ERRNO | libc::EPERM as u32;
    vec![
        // 0-2: any other architecture (int 0x80 enters as AUDIT_ARCH_I386) has different
        // syscall numbers, so the whole deny-list would be meaningless there: kill.
        stmt(BPF_LD_W_ABS, SECCOMP_DATA_ARCH),
        jump(BPF_JMP_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        stmt(BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
        // 3-5: x32 syscalls share AUDIT_ARCH_X86_64 but set bit 30 of the number; the rule
        // chain compares exact numbers and would allow them: kill.
        stmt(BPF_LD_W_ABS, SECCOMP_DATA_NR),
        jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, 0, 1),
        stmt(BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
        // 6-7: clone3 passes its flags in memory, which seccomp cannot read, so the CLONE_NEW*
        // check on clone() below could be dodged through it. ENOSYS (not EPERM) makes glibc
        // and musl fall back to clone(), whose flags we can check.
        jump(BPF_JMP_JEQ_K, libc::SYS_clone3 as u32, 0, 1),
        stmt(BPF_RET_K, SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        // 8-15: clone/unshare with any CLONE_NEW* bit: EPERM, as the kernel itself answers an
        // unprivileged caller. A new user namespace would bring a full capability set, a new
        // mount namespace could remount around Landlock. seccompiler compares
        // `arg & mask == value`, which needs one rule per flag; a single JSET tests them all.
        // The kernel reads only the low 32 bits of clone's flags, and unshare refuses unknown
        // high bits with EINVAL, so the low word is the whole story.
        jump(BPF_JMP_JEQ_K, libc::SYS_clone as u32, 2, 0),
        jump(BPF_JMP_JEQ_K, libc::SYS_unshare as u32, 3, 0),
        stmt(BPF_JMP_JA, 5),
        stmt(BPF_LD_W_ABS, SECCOMP_DATA_ARG0_LO),
        jump(BPF_JMP_JSET_K, CLONE_NEW_MASK, 2, 3),
        stmt(BPF_LD_W_ABS, SECCOMP_DATA_ARG0_LO),
        jump(BPF_JMP_JSET_K, UNSHARE_NEW_MASK, 0, 1),
        stmt(BPF_RET_K, eperm),
        // 16: seccompiler's chain follows; it reloads the syscall number itself.
    ]
}

/// Syscalls denied outright with EPERM. EPERM is what each of these returns to an
/// unprivileged caller anyway, so well-behaved programs already handle it.
const DENY_ALWAYS: &[(i64, &str)] = &[
    // Other processes' memory and debugging: the child could read the supervisor's secrets.
    (libc::SYS_ptrace, "debug or inspect another process"),
    (libc::SYS_process_vm_readv, "read another process's memory"),
    (
        libc::SYS_process_vm_writev,
        "write another process's memory",
    ),
    (
        libc::SYS_pidfd_getfd,
        "steal a file descriptor from another process",
    ),
    // Mounts: change what paths mean under Landlock's feet.
    (libc::SYS_mount, "mount filesystems"),
    (libc::SYS_umount2, "unmount filesystems"),
    (libc::SYS_pivot_root, "change the root mount"),
    (libc::SYS_chroot, "change the root directory"),
    (libc::SYS_fsopen, "new mount API"),
    (libc::SYS_fsconfig, "new mount API"),
    (libc::SYS_fsmount, "new mount API"),
    (libc::SYS_fspick, "new mount API"),
    (libc::SYS_move_mount, "new mount API"),
    (libc::SYS_open_tree, "new mount API: clone a mount tree"),
    (libc::SYS_mount_setattr, "new mount API: change mount flags"),
    // Namespaces: a new user namespace brings a full capability set with it.
    (libc::SYS_setns, "join another namespace"),
    // Kernel keyrings are shared state outside the sandbox.
    (libc::SYS_keyctl, "kernel keyrings"),
    (libc::SYS_add_key, "kernel keyrings"),
    (libc::SYS_request_key, "kernel keyrings"),
    // Large, frequently exploited kernel attack surface no sandboxed build or test needs.
    (libc::SYS_bpf, "eBPF programs"),
    (
        libc::SYS_perf_event_open,
        "performance counters (side channels, kernel bugs)",
    ),
    (
        libc::SYS_userfaultfd,
        "page-fault handling used to win kernel races",
    ),
    (
        libc::SYS_io_uring_setup,
        "io_uring bypasses seccomp for the operations it performs",
    ),
    (libc::SYS_io_uring_enter, "io_uring"),
    (libc::SYS_io_uring_register, "io_uring"),
    (libc::SYS_kexec_load, "load a new kernel"),
    (libc::SYS_kexec_file_load, "load a new kernel"),
    (libc::SYS_init_module, "load kernel modules"),
    (libc::SYS_finit_module, "load kernel modules"),
    (libc::SYS_delete_module, "unload kernel modules"),
    (
        libc::SYS_modify_ldt,
        "16-bit segments, old exploit primitive",
    ),
    (libc::SYS_iopl, "raw I/O port access"),
    (libc::SYS_ioperm, "raw I/O port access"),
];

const TIOCSTI: u64 = 0x5412;
const TIOCLINUX: u64 = 0x541C;
const PER_LINUX: u64 = 0;
const PERSONALITY_QUERY: u64 = 0xffff_ffff;

fn cond(arg: u8, len: Len, op: Op, val: u64, nr: i64) -> Result<SeccompCondition, SeccompError> {
    SeccompCondition::new(arg, len, op, val).map_err(|source| SeccompError::Rule { nr, source })
}

fn rule(nr: i64, conds: Vec<SeccompCondition>) -> Result<SeccompRule, SeccompError> {
    SeccompRule::new(conds).map_err(|source| SeccompError::Rule { nr, source })
}

/// The rule map for the syscalls denied only under conditions on their arguments. (The
/// syscalls of `DENY_ALWAYS` need no rule chain: the dispatch tree returns EPERM for them
/// directly, which keeps the program, and so its verification and JIT at install, short.)
fn rules(network: NetworkMode) -> Result<BTreeMap<i64, Vec<SeccompRule>>, SeccompError> {
    let mut map: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();

    // Terminal injection: TIOCSTI pushes bytes into the input of whoever reads the terminal
    // (the supervisor's, after we exit), TIOCLINUX can do the same on a VT. The kernel only
    // looks at the low 32 bits of the request, so compare a Dword: high bits cannot dodge it.
    let nr = libc::SYS_ioctl;
    map.insert(
        nr,
        vec![
            rule(nr, vec![cond(1, Len::Dword, Op::Eq, TIOCSTI, nr)?])?,
            rule(nr, vec![cond(1, Len::Dword, Op::Eq, TIOCLINUX, nr)?])?,
        ],
    );

    // personality(): READ_IMPLIES_EXEC and ADDR_NO_RANDOMIZE weaken exploit mitigations.
    // Allow only the default persona and the query value glibc uses.
    let nr = libc::SYS_personality;
    map.insert(
        nr,
        vec![rule(
            nr,
            vec![
                cond(0, Len::Dword, Op::Ne, PER_LINUX, nr)?,
                cond(0, Len::Dword, Op::Ne, PERSONALITY_QUERY, nr)?,
            ],
        )?],
    );

    // Sockets. EPERM is what socket(2) returns when a security module refuses the family, so
    // programs report "Operation not permitted" instead of misreading EAFNOSUPPORT.
    let nr = libc::SYS_socket;
    let af = |f: i32| cond(0, Len::Dword, Op::Eq, f as u64, nr);
    let socket_rules = match network {
        // Only AF_UNIX: no IP, no netlink, no packet, no vsock.
        NetworkMode::None => {
            vec![rule(
                nr,
                vec![cond(0, Len::Dword, Op::Ne, libc::AF_UNIX as u64, nr)?],
            )?]
        }
        NetworkMode::All => vec![
            // Raw link-layer access sniffs and forges traffic of the whole pod.
            rule(nr, vec![af(libc::AF_PACKET)?])?,
            // vsock reaches the hypervisor host directly.
            rule(nr, vec![af(libc::AF_VSOCK)?])?,
            // Netlink beyond NETLINK_ROUTE (audit, xfrm, netfilter, uevents) is kernel
            // attack surface; route is what getaddrinfo and `ip addr` need.
            rule(
                nr,
                vec![
                    af(libc::AF_NETLINK)?,
                    cond(2, Len::Dword, Op::Ne, libc::NETLINK_ROUTE as u64, nr)?,
                ],
            )?,
        ],
    };
    map.insert(nr, socket_rules);
    Ok(map)
}

/// Compile the whole program for one network mode.
pub fn build(network: NetworkMode) -> Result<BpfProgram, SeccompError> {
    let arch =
        TargetArch::try_from(std::env::consts::ARCH).map_err(|_| SeccompError::UnsupportedArch)?;
    if !matches!(arch, TargetArch::x86_64) {
        return Err(SeccompError::UnsupportedArch);
    }
    let rules = rules(network)?;
    let mut numbers: Vec<(u32, Target)> =
        rules.keys().map(|&nr| (nr as u32, Target::Chain)).collect();
    numbers.extend(DENY_ALWAYS.iter().map(|&(nr, _)| (nr as u32, Target::Deny)));
    numbers.sort_by_key(|&(nr, _)| nr);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(SeccompError::Compile)?;
    let compiled: BpfProgram = filter.try_into().map_err(SeccompError::Compile)?;
    // seccompiler starts with its own three-instruction architecture check (load arch, jeq,
    // kill); ours subsumes it. Check the shape rather than trusting it silently.
    debug_assert_eq!(compiled[0].k, SECCOMP_DATA_ARCH);
    debug_assert_eq!(compiled[2].k, SECCOMP_RET_KILL_PROCESS);
    let mut program = prefix();
    program.extend(dispatch(&numbers, program.len())?);
    program.extend_from_slice(&compiled[3..]);
    Ok(program)
}

/// A jump target while the dispatch tree is assembled.
#[derive(Clone, Copy)]
enum Target {
    Rel(usize),
    Allow,
    /// Return EPERM.
    Deny,
    /// Continue into seccompiler's rule chain.
    Chain,
}

struct Insn {
    code: u16,
    k: u32,
    jt: Target,
    jf: Target,
}

/// Binary search over the syscall numbers that have rules: every other syscall is allowed
/// after about log2(n) comparisons instead of walking seccompiler's linear chain. That matters
/// twice: at every syscall of the child, and at install time, when the kernel emulates the
/// filter for every syscall number to build its allow-cache, which for a linear chain costs
/// hundreds of microseconds per exec.
fn tree(nrs: &[(u32, Target)]) -> Vec<Insn> {
    if nrs.len() <= 3 {
        let mut v: Vec<Insn> = nrs
            .iter()
            .map(|&(n, to)| Insn {
                code: BPF_JMP_JEQ_K,
                k: n,
                jt: to,
                jf: Target::Rel(0),
            })
            .collect();
        v.push(Insn {
            code: BPF_JMP_JA,
            k: 0,
            jt: Target::Allow,
            jf: Target::Allow,
        });
        return v;
    }
    let mid = nrs.len() / 2;
    let left = tree(&nrs[..mid]);
    let right = tree(&nrs[mid..]);
    let mut v = vec![Insn {
        code: BPF_JMP_JGE_K,
        k: nrs[mid].0,
        jt: Target::Rel(left.len()),
        jf: Target::Rel(0),
    }];
    v.extend(left);
    v.extend(right);
    v
}

/// `ld nr`, the tree, `ret ALLOW`, `ret EPERM`; the rule chain follows right after. `base`
/// is the index of the first instruction emitted here.
fn dispatch(nrs: &[(u32, Target)], base: usize) -> Result<Vec<sock_filter>, SeccompError> {
    let body = tree(nrs);
    let first = base + 1;
    let allow = first + body.len();
    let deny = allow + 1;
    let chain = deny + 1;
    let mut out = vec![stmt(BPF_LD_W_ABS, SECCOMP_DATA_NR)];
    for (i, ins) in body.iter().enumerate() {
        let at = first + i;
        let resolve = |t: Target| match t {
            Target::Rel(r) => r,
            Target::Allow => allow - at - 1,
            Target::Deny => deny - at - 1,
            Target::Chain => chain - at - 1,
        };
        if ins.code == BPF_JMP_JA {
            out.push(stmt(BPF_JMP_JA, resolve(ins.jt) as u32));
            continue;
        }
        let (jt, jf) = (resolve(ins.jt), resolve(ins.jf));
        let (Ok(jt), Ok(jf)) = (u8::try_from(jt), u8::try_from(jf)) else {
            return Err(SeccompError::TooFar);
        };
        out.push(jump(ins.code, ins.k, jt, jf));
    }
    out.push(stmt(BPF_RET_K, SECCOMP_RET_ALLOW));
    out.push(stmt(BPF_RET_K, SECCOMP_RET_ERRNO | libc::EPERM as u32));
    Ok(out)
}

/// Install a program built by [`build`] on the calling thread.
///
/// Async-signal-safe: one raw syscall on prebuilt memory, for use between fork and exec.
/// The caller must already have set no_new_privs (or hold CAP_SYS_ADMIN); that is what lets an
/// unprivileged process install a filter at all.
pub fn install(program: &[sock_filter]) -> Result<(), i32> {
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        // seccompiler's sock_filter is #[repr(C)] with the same layout as the kernel's.
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `prog` points at `program`, which outlives the call; the kernel copies it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &prog as *const libc::sock_fprog,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(crate::sandbox::errno())
    }
}

/// Names of everything the filter denies, for `check` and the docs.
pub fn describe(network: NetworkMode) -> Vec<String> {
    let mut v: Vec<String> = DENY_ALWAYS
        .iter()
        .map(|(nr, why)| {
            let name = usize::try_from(*nr)
                .ok()
                .and_then(syscalls::Sysno::new)
                .map_or_else(|| format!("syscall {nr}"), |s| s.name().to_string());
            format!("{name}: any arguments: EPERM ({why})")
        })
        .collect();
    v.push("unshare/clone with CLONE_NEW*: EPERM".into());
    v.push("ioctl TIOCSTI/TIOCLINUX (low 32 bits): EPERM".into());
    v.push("personality other than PER_LINUX: EPERM".into());
    v.push("clone3: ENOSYS (libc falls back to clone)".into());
    v.push("x32 syscalls and foreign architectures: kill".into());
    v.push(match network {
        NetworkMode::None => "socket: every family except AF_UNIX: EPERM".into(),
        NetworkMode::All => "socket: AF_PACKET, AF_VSOCK, AF_NETLINK except ROUTE: EPERM".into(),
    });
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_is_small_and_starts_with_our_prefix() {
        for mode in [NetworkMode::None, NetworkMode::All] {
            let p = build(mode).unwrap();
            assert_eq!(&p[..16], &prefix()[..]);
            // Installing costs roughly linear time in the length; keep an eye on it.
            assert!(p.len() < 160, "filter grew to {} instructions", p.len());
            // Every jump stays inside the program.
            for (i, ins) in p.iter().enumerate() {
                if ins.code == BPF_JMP_JA {
                    assert!(i + 1 + (ins.k as usize) < p.len());
                } else if ins.code & 0x07 == 0x05 {
                    assert!(
                        i + 1 + (ins.jt.max(ins.jf) as usize) < p.len(),
                        "jump out at {i}"
                    );
                }
            }
        }
    }

    /// Run a filter in a forked child (never in the test runner) and report the errno of a
    /// syscall made under it.
    #[test]
    fn denies_in_a_forked_child() {
        let prog = build(NetworkMode::None).unwrap();
        // SAFETY: the child only makes raw syscalls on memory prepared before fork, then _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: plain prctl/syscalls in the child; no allocation.
            unsafe {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                if install(&prog).is_err() {
                    libc::_exit(10);
                }
                let s = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
                if s != -1 || crate::sandbox::errno() != libc::EPERM {
                    libc::_exit(11);
                }
                let u = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                if u < 0 {
                    libc::_exit(12);
                }
                if libc::unshare(libc::CLONE_NEWUSER) != -1
                    || crate::sandbox::errno() != libc::EPERM
                {
                    libc::_exit(15);
                }
                // A plain fork (clone without CLONE_NEW*) still works.
                let f = libc::fork();
                if f == 0 {
                    libc::_exit(0);
                }
                if f < 0 {
                    libc::_exit(16);
                }
                libc::waitpid(f, std::ptr::null_mut(), 0);
                if libc::syscall(libc::SYS_clone3, 0, 0) != -1
                    || crate::sandbox::errno() != libc::ENOSYS
                {
                    libc::_exit(13);
                }
                if libc::ioctl(0, (1u64 << 32 | TIOCSTI) as _, c"x".as_ptr()) != -1
                    || crate::sandbox::errno() != libc::EPERM
                {
                    libc::_exit(14);
                }
                libc::_exit(0);
            }
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status), "child died: {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 0);
    }
}
