//! seccomp layer: a deny-list compiled once per sandbox, installed in the child as the very
//! last step before exec.
//!
//! The program is one filter, so installing it costs one `seccomp(2)` call:
//!
//! 1. the architecture check (any other is killed), then the syscall number loaded once;
//! 2. a hand-written binary search over the *runs* of numbers that share a fate (a run of
//!    consecutive denied numbers, such as io_uring and the new mount API, is one range; the
//!    x32 table is one range, killed; every number outside a run is allowed): each leaf
//!    returns EPERM (ENOSYS for openat2 and clone3) at once, allows, or jumps to
//! 3. the hand-written argument checks (`Block`), some shared by several syscalls (the
//!    CLONE_NEW* flags of clone and unshare; socket families; scheduling, I/O priority and
//!    prlimit64 only on the caller; no set-uid or set-gid bit in a mode; the terminal
//!    ioctls; the default persona).
//!
//! seccompiler builds no instruction of it (its chain spent 28 instructions on the five
//! comparisons of ioctl and personality, against 7 here); its types stay. Every instruction
//! costs at install, in every exec: the kernel converts the program to eBPF, JIT-compiles it
//! in several passes, and runs it for every syscall number to build its allow cache, all
//! linear in the length (112 instructions for a sandbox with a network namespace; a search
//! over single numbers behind a prefix of its own took 168, and 13 µs more to install).
//!
//! Default-allow is deliberate: the filter removes kernel attack surface and escape routes;
//! what files and sockets a child may use is Landlock's and the identity layer's job. Each
//! entry below says why it is denied and why the errno is the one callers expect.

use seccompiler::{BpfProgram, sock_filter};

use crate::policy::NetworkMode;

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("the seccomp dispatch tree needs a jump longer than BPF allows")]
    TooFar,
    #[error("a hand-written seccomp check jumps backwards, which BPF cannot")]
    BadBlockOrder,
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
const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
/// Syscall numbers at or above this have the x32 ABI bit set.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// The end of the x32 table. The kernel runs `nr` as x32 only when `nr - X32_SYSCALL_BIT` is
/// below the length of its x32 table (548 entries in Linux 6.18: the shared numbers, then the
/// x32-only 512..547); every other number with bit 30 set, -1 (0xffffffff) among them, is no
/// syscall on any ABI and gets ENOSYS. 1024 leaves room for the table to grow.
const X32_SYSCALL_END: u32 = X32_SYSCALL_BIT + 1024;

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

/// The instructions that run before the search: any other architecture (int 0x80 enters as
/// AUDIT_ARCH_I386) has different syscall numbers, so the whole deny-list would be
/// meaningless there: kill (the jump's false branch is patched to the program's kill return
/// by [`build`]).
fn prefix() -> Vec<sock_filter> {
    vec![
        stmt(BPF_LD_W_ABS, SECCOMP_DATA_ARCH),
        jump(BPF_JMP_JEQ_K, AUDIT_ARCH_X86_64, 0, 0),
    ]
}

/// The x32 table: x32 syscalls share AUDIT_ARCH_X86_64 but set bit 30 of the number, and every
/// rule here compares x86_64 numbers, so it would allow them all: the whole range is killed.
/// Above it (syscall(-1) is 0xffffffff) nothing runs on any ABI: allowed, so the kernel itself
/// answers ENOSYS, as it does without the filter.
const X32_TABLE: (u32, u32) = (X32_SYSCALL_BIT, X32_SYSCALL_END - 1);

/// Syscalls that answer ENOSYS, as a kernel without them does, because their arguments are in
/// memory the filter cannot read.
const ENOSYS_ALWAYS: &[(i64, &str)] = &[
    // clone3 passes its flags in memory, so the CLONE_NEW* check on clone() below could be
    // dodged through it. ENOSYS (not EPERM) makes glibc and musl fall back to clone(), whose
    // flags we can check.
    (
        libc::SYS_clone3,
        "its flags are in memory the filter cannot read; libc falls back to clone",
    ),
    // openat2 passes its flags and mode in a struct: the set-id check on open and openat
    // below could be dodged through it. glibc and musl never call it for open(3); programs
    // that do (for RESOLVE_*) fall back to openat on ENOSYS, as they must on kernels before
    // 5.6.
    (
        libc::SYS_openat2,
        "its mode is in a struct the filter cannot read; callers fall back to openat",
    ),
];

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
    // Landlock does not restrict fanotify marks, so a group (unprivileged since Linux 5.13)
    // could watch a denied directory; and groups count against a per-uid budget that
    // concurrent runs of one uid share. EPERM is what older kernels answer any unprivileged
    // caller; inotify stays (file watchers need it).
    (
        libc::SYS_fanotify_init,
        "fanotify (watches Landlock cannot restrict; a per-uid budget)",
    ),
    // The kernel log holds the host's messages (addresses, other tenants' devices and
    // programs). With kernel.dmesg_restrict=0 any process may read it; EPERM is the kernel's
    // own answer when it is 1, which `dmesg` reports as such. /dev/kmsg is not in the view,
    // and /proc/kmsg needs CAP_SYSLOG.
    (libc::SYS_syslog, "read or clear the kernel log"),
];

/// S_ISUID | S_ISGID.
const SETID_BITS: u32 = 0o6000;
/// The open flags that make open and openat read their mode: O_CREAT, and __O_TMPFILE (the
/// part of O_TMPFILE that is not O_DIRECTORY). Without either the kernel ignores the mode,
/// so a program that passes garbage there (a raw syscall without the third argument) is not
/// refused for it.
const OPEN_MODE_FLAGS: u32 = libc::O_CREAT as u32 | 0o20_000_000;

const TIOCSTI: u32 = 0x5412;
/// include/uapi/linux/ioprio.h
const IOPRIO_WHO_PROCESS: u32 = 1;
const TIOCLINUX: u32 = 0x541C;
/// Set a tty's line discipline (include/uapi/asm-generic/ioctls.h).
const TIOCSETD: u32 = 0x5423;
const PER_LINUX: u32 = 0;
const PERSONALITY_QUERY: u32 = 0xffff_ffff;

/// Hand-written argument checks that the dispatch tree jumps to. Each ends in allow or EPERM
/// (or jumps to a block further down, never back: classic BPF only jumps forward).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Block {
    /// clone(2): no CLONE_NEW* flag.
    Clone,
    /// unshare(2): no CLONE_NEW* flag, CLONE_NEWTIME included.
    Unshare,
    /// socket(2) and socketpair(2): the family allow-list of the network mode.
    Socket,
    /// setpriority(2): which must be PRIO_PROCESS, then [`Block::WhoZero`].
    Setpriority,
    /// ioprio_set(2): which must be IOPRIO_WHO_PROCESS, then [`Block::WhoZero`].
    IoprioSet,
    /// args[1] (who) must be 0.
    WhoZero,
    /// args[0] (pid) must be 0.
    PidZero,
    /// prlimit64(2): pid 0, or a pure read (new limit NULL).
    Prlimit,
    /// open(2): with O_CREAT or O_TMPFILE in args[1], then [`Block::Mode2`].
    OpenFlags,
    /// openat(2): with O_CREAT or O_TMPFILE in args[2], then [`Block::Mode3`].
    OpenatFlags,
    /// No set-uid or set-gid bit in the mode at args[1] (chmod, fchmod, creat, mkdir, mknod).
    Mode1,
    /// ... at args[2] (fchmodat, fchmodat2, mkdirat, mknodat, open).
    Mode2,
    /// ... at args[3] (openat).
    Mode3,
    /// ioctl(2): the terminal requests that inject input or change the line discipline.
    Ioctl,
    /// personality(2): the default persona, or the query.
    Personality,
}

/// Offset in `seccomp_data` of the low (`hi` false) or high 32 bits of args[i].
const fn arg(i: u32, hi: bool) -> u32 {
    16 + 8 * i + if hi { 4 } else { 0 }
}

fn ld(k: u32) -> Insn {
    Insn {
        code: BPF_LD_W_ABS,
        k,
        jt: Target::Rel(0),
        jf: Target::Rel(0),
    }
}

fn jeq(k: u32, jt: Target, jf: Target) -> Insn {
    Insn {
        code: BPF_JMP_JEQ_K,
        k,
        jt,
        jf,
    }
}

/// Jump to `jt` when any bit of `k` is set in the accumulator.
fn jset(k: u32, jt: Target, jf: Target) -> Insn {
    Insn {
        code: BPF_JMP_JSET_K,
        k,
        jt,
        jf,
    }
}

/// The blocks, in program order, with the syscalls that enter each. pids, `which` and `who`
/// are ints and socket families and protocols are ints: the kernel reads the low 32 bits.
fn blocks(network: NetworkMode) -> Vec<(Block, Vec<i64>, Vec<Insn>)> {
    use Target::{Allow, Deny, Rel};
    let next = Rel(0);
    // clone/unshare with any CLONE_NEW* bit: EPERM, as the kernel itself answers an
    // unprivileged caller. A new user namespace would bring a full capability set, a new
    // mount namespace could remount around Landlock. seccompiler compares
    // `arg & mask == value`, which needs one rule per flag; a single JSET tests them all.
    // The kernel reads only the low 32 bits of clone's flags, and unshare refuses unknown
    // high bits with EINVAL, so the low word is the whole story.
    let clone = vec![ld(arg(0, false)), jset(CLONE_NEW_MASK, Deny, Allow)];
    let unshare = vec![ld(arg(0, false)), jset(UNSHARE_NEW_MASK, Deny, Allow)];
    let socket = socket_check(network);
    // Other processes' scheduling, I/O priority and limits. The kernel lets a process change
    // these for any process of its own uid: a run could renice, pin, idle or rlimit another
    // run and, when it shares the supervisor's uid (a non-root
    // supervisor, or `--uid 0`), lower the supervisor's RLIMIT_NOFILE (the kill sweep could
    // then no longer open /proc) or RLIMIT_CPU (the supervisor would die). The filter is built
    // before fork and cannot know the caller's pid, so only 0, "the caller", is allowed. This
    // breaks aiming these calls at another thread or process: `pthread_setaffinity_np` and
    // `pthread_setschedparam` on another thread, `renice -p`, `taskset -p`, `chrt -p`,
    // `ionice -p` and `prlimit --pid` writes all get EPERM, which they already handle (it is
    // the kernel's answer for another uid's process).
    //
    // setpriority and ioprio_set also need the single process as `which`: who = 0 with
    // PRIO_USER or IOPRIO_WHO_USER is every process of the caller's uid, with PRIO_PGRP or
    // IOPRIO_WHO_PGRP its process group.
    let setpriority = vec![
        ld(arg(0, false)),
        jeq(libc::PRIO_PROCESS, Target::Block(Block::WhoZero), Deny),
    ];
    let ioprio_set = vec![
        ld(arg(0, false)),
        jeq(IOPRIO_WHO_PROCESS, Target::Block(Block::WhoZero), Deny),
    ];
    let who_zero = vec![ld(arg(1, false)), jeq(0, Allow, Deny)];
    let pid_zero = vec![ld(arg(0, false)), jeq(0, Allow, Deny)];
    // prlimit64(pid, resource, new, old): setting needs pid 0; a pure read (new NULL) may name
    // any pid, as `prlimit --pid` and ps-like tools do. The pointer is 64 bits: both halves.
    let prlimit = vec![
        ld(arg(0, false)),
        jeq(0, Allow, next),
        ld(arg(2, false)),
        jeq(0, next, Deny),
        ld(arg(2, true)),
        jeq(0, Allow, Deny),
    ];
    // Set-uid and set-gid bits: a file the sandbox marks set-uid stays on the host, and anyone
    // who runs it there becomes its owner: root under `--uid 0`, a uid a later run gets, or
    // the operator's account under a non-root supervisor. nosuid on the view's
    // mounts only covers exec through the view; the host sees the file through its own. So
    // every call that takes a mode is refused when the mode holds either bit. EPERM, as
    // chmod answers a caller who does not own the file; `cp -p` and tar report it and go on.
    // mkdir's mode never sets the bits (the kernel keeps only the permissions and the sticky
    // bit, and a set-gid parent hands its own down), but asking for a set-gid directory, one
    // whose group every file made in it inherits, is refused as chmod g+s is.
    // The kernel reads a umode_t and open flags as an int, so the low 32 bits decide: high
    // bits cannot dodge the check. One JSET tests both bits: seccompiler's MaskedEq is an
    // equality (`arg & mask == value`), so "either bit" would need a rule per bit per syscall.
    let mode_check = |i| vec![ld(arg(i, false)), jset(SETID_BITS, Deny, Allow)];
    let open_flags = vec![
        ld(arg(1, false)),
        jset(OPEN_MODE_FLAGS, Target::Block(Block::Mode2), Allow),
    ];
    let openat_flags = vec![
        ld(arg(2, false)),
        jset(OPEN_MODE_FLAGS, Target::Block(Block::Mode3), Allow),
    ];
    // Terminal injection: TIOCSTI pushes bytes into the input of whoever reads the terminal
    // (the supervisor's, after we exit), TIOCLINUX can do the same on a VT. TIOCSETD attaches
    // another line discipline to a tty the command holds (its pty): n_gsm, n_hdlc and the
    // rest are rarely used kernel code with a record of privilege escalations, and no program
    // a sandbox runs needs anything but the default N_TTY. The kernel only looks at the low 32
    // bits of the request, so those are compared: high bits cannot dodge it.
    let ioctl = vec![
        ld(arg(1, false)),
        jeq(TIOCSTI, Deny, next),
        jeq(TIOCLINUX, Deny, next),
        jeq(TIOCSETD, Deny, Allow),
    ];
    // personality(): READ_IMPLIES_EXEC and ADDR_NO_RANDOMIZE weaken exploit mitigations.
    // Allow only the default persona and the query value glibc uses; the kernel takes an
    // unsigned int, so the low 32 bits decide.
    let personality = vec![
        ld(arg(0, false)),
        jeq(PER_LINUX, Allow, next),
        jeq(PERSONALITY_QUERY, Allow, Deny),
    ];
    vec![
        (Block::Clone, vec![libc::SYS_clone], clone),
        (Block::Unshare, vec![libc::SYS_unshare], unshare),
        (
            Block::Socket,
            vec![libc::SYS_socket, libc::SYS_socketpair],
            socket,
        ),
        (Block::Setpriority, vec![libc::SYS_setpriority], setpriority),
        (Block::IoprioSet, vec![libc::SYS_ioprio_set], ioprio_set),
        (Block::WhoZero, vec![], who_zero),
        (
            Block::PidZero,
            vec![
                libc::SYS_sched_setaffinity,
                libc::SYS_sched_setscheduler,
                libc::SYS_sched_setparam,
                libc::SYS_sched_setattr,
            ],
            pid_zero,
        ),
        (Block::Prlimit, vec![libc::SYS_prlimit64], prlimit),
        (Block::OpenFlags, vec![libc::SYS_open], open_flags),
        (Block::OpenatFlags, vec![libc::SYS_openat], openat_flags),
        (
            Block::Mode1,
            vec![
                libc::SYS_chmod,
                libc::SYS_fchmod,
                libc::SYS_creat,
                libc::SYS_mkdir,
                libc::SYS_mknod,
            ],
            mode_check(1),
        ),
        (
            Block::Mode2,
            vec![
                libc::SYS_fchmodat,
                libc::SYS_fchmodat2,
                libc::SYS_mkdirat,
                libc::SYS_mknodat,
            ],
            mode_check(2),
        ),
        (Block::Mode3, vec![], mode_check(3)),
        (Block::Ioctl, vec![libc::SYS_ioctl], ioctl),
        (Block::Personality, vec![libc::SYS_personality], personality),
    ]
}

/// The socket(2) and socketpair(2) check: the families (and for netlink, the protocol) each
/// network mode allows.
fn socket_check(network: NetworkMode) -> Vec<Insn> {
    use Target::{Allow, Deny, Rel};
    let next = Rel(0);
    // Sockets. EPERM is what socket(2) returns when a security module refuses the family, so
    // programs report "Operation not permitted" instead of misreading EAFNOSUPPORT.
    // socketpair(2) creates its sockets through the same per-family code, with the family and
    // protocol in the same argument slots, so it gets the same check.
    match network {
        // Only AF_UNIX: no IP, no netlink, no packet, no vsock.
        NetworkMode::None => vec![ld(arg(0, false)), jeq(libc::AF_UNIX as u32, Allow, Deny)],
        // AF_UNIX, IP and route netlink (what getaddrinfo and `ip addr` need); every other
        // family is kernel code an ordinary build or test never needs, and several have a
        // history of exploits (AF_ALG, TIPC, RDS, KCM, CAN, Bluetooth, XDP); packet sockets
        // sniff and forge the pod's traffic, vsock reaches the hypervisor host, the other
        // netlink families (audit, xfrm, netfilter, uevents) are more surface; and socket()
        // would autoload the module of a family not yet loaded.
        NetworkMode::All => vec![
            ld(arg(0, false)),
            jeq(libc::AF_UNIX as u32, Allow, next),
            jeq(libc::AF_INET as u32, Allow, next),
            jeq(libc::AF_INET6 as u32, Allow, next),
            jeq(libc::AF_NETLINK as u32, next, Deny),
            ld(arg(2, false)),
            jeq(libc::NETLINK_ROUTE as u32, Allow, Deny),
        ],
    }
}

/// Compile the whole program for one network mode.
pub fn build(network: NetworkMode) -> Result<BpfProgram, SeccompError> {
    if std::env::consts::ARCH != "x86_64" {
        return Err(SeccompError::UnsupportedArch);
    }
    let blocks = blocks(network);
    let mut numbers: Vec<(u32, Target)> = DENY_ALWAYS
        .iter()
        .map(|&(nr, _)| (nr as u32, Target::Deny))
        .collect();
    numbers.extend(
        ENOSYS_ALWAYS
            .iter()
            .map(|&(nr, _)| (nr as u32, Target::Enosys)),
    );
    for (b, nrs, _) in &blocks {
        numbers.extend(nrs.iter().map(|&nr| (nr as u32, Target::Block(*b))));
    }
    numbers.sort_by_key(|&(nr, _)| nr);
    debug_assert!(
        numbers.windows(2).all(|w| w[0].0 != w[1].0),
        "a syscall has two entries"
    );
    let mut runs = runs(&numbers);
    debug_assert!(runs.last().is_none_or(|r| r.last < X32_TABLE.0));
    runs.push(Run {
        first: X32_TABLE.0,
        last: X32_TABLE.1,
        to: Target::Kill,
    });
    let mut program = prefix();
    let blocks: Vec<(Block, Vec<Insn>)> = blocks.into_iter().map(|(b, _, c)| (b, c)).collect();
    program.extend(dispatch(&runs, &blocks, program.len())?);
    // The architecture check's false branch: the kill return, the program's last instruction.
    let kill = program.len() - 1;
    program[1].jf = u8::try_from(kill - 2).map_err(|_| SeccompError::TooFar)?;
    Ok(program)
}

/// A jump target while the program is assembled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    /// This many instructions further on.
    Rel(usize),
    Allow,
    /// Return EPERM.
    Deny,
    /// Return ENOSYS.
    Enosys,
    /// Kill the process.
    Kill,
    /// A hand-written argument check.
    Block(Block),
}

#[derive(Clone, Copy)]
struct Insn {
    code: u16,
    k: u32,
    jt: Target,
    jf: Target,
}

fn jge(k: u32, jt: Target, jf: Target) -> Insn {
    Insn {
        code: BPF_JMP_JGE_K,
        k,
        jt,
        jf,
    }
}

/// Consecutive syscall numbers `first..=last` with one fate.
#[derive(Clone, Copy, Debug)]
struct Run {
    first: u32,
    last: u32,
    to: Target,
}

/// The sorted numbers merged into runs: io_uring's three calls and the new mount API's six
/// that follow them are one run, tested by two comparisons instead of nine.
fn runs(numbers: &[(u32, Target)]) -> Vec<Run> {
    let mut v: Vec<Run> = Vec::new();
    for &(nr, to) in numbers {
        match v.last_mut() {
            Some(r) if r.to == to && r.last.checked_add(1) == Some(nr) => r.last = nr,
            _ => v.push(Run {
                first: nr,
                last: nr,
                to,
            }),
        }
    }
    v
}

/// A node of the search: a fate reached without an instruction (its whole range has one), or
/// instructions that begin with its test.
enum Node {
    To(Target),
    Code(Vec<Insn>),
}

/// A leaf of the search tests at most this many runs one after the other.
const LEAF_RUNS: usize = 3;

/// Binary search over the runs, for the numbers in `from..end` (`end` up to 2^32); every
/// number outside a run is allowed. Every syscall without a rule is allowed after about
/// log2(runs) comparisons instead of walking a linear chain. That matters twice: at every
/// syscall of the child the kernel's allow cache does not answer, and at install time, when
/// the kernel runs the filter for every syscall number to build that cache.
///
/// A run that starts or ends at its node's bound needs one comparison less, so each split
/// tries both places beside the middle run (its start, and just after the run before it)
/// and keeps the shorter code; 45 runs make a tree of about 60 instructions.
fn search(runs: &[Run], from: u64, end: u64) -> Node {
    match runs {
        [] => return Node::To(Target::Allow),
        [r] if u64::from(r.first) == from && u64::from(r.last) + 1 == end => {
            return Node::To(r.to);
        }
        _ if runs.len() <= LEAF_RUNS => return Node::Code(chain(runs, from, end)),
        _ => {}
    }
    let mid = runs.len() / 2;
    let at_start = split(runs, mid, u64::from(runs[mid].first), from, end);
    let after_previous = split(runs, mid, u64::from(runs[mid - 1].last) + 1, from, end);
    Node::Code(if after_previous.len() < at_start.len() {
        after_previous
    } else {
        at_start
    })
}

/// `nr >= pivot`: the runs from `mid` on, else those before it (which follow at once).
fn split(runs: &[Run], mid: usize, pivot: u64, from: u64, end: u64) -> Vec<Insn> {
    let (jf, left) = match search(&runs[..mid], from, pivot) {
        Node::To(t) => (t, Vec::new()),
        Node::Code(c) => (Target::Rel(0), c),
    };
    let (jt, right) = match search(&runs[mid..], pivot, end) {
        Node::To(t) => (t, Vec::new()),
        Node::Code(c) => (Target::Rel(left.len()), c),
    };
    // A pivot is the first number of a run or the one after a run below `end`: it fits.
    let mut v = vec![jge(pivot as u32, jt, jf)];
    v.extend(left);
    v.extend(right);
    v
}

/// A leaf: each run tested in turn (one comparison for a single number or a run that touches
/// the leaf's bound, two otherwise); what no run takes is allowed.
fn chain(runs: &[Run], from: u64, end: u64) -> Vec<Insn> {
    let mut v = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        let last = i + 1 == runs.len();
        // Not this run: the next run's test, `skip` instructions on, or allow after the last.
        let other = |skip| {
            if last {
                Target::Allow
            } else {
                Target::Rel(skip)
            }
        };
        let (first, after) = (u64::from(r.first), u64::from(r.last) + 1);
        if r.first == r.last {
            v.push(jeq(r.first, r.to, other(0)));
        } else if first == from {
            // Below `end`, since another run follows or the run does not fill the leaf.
            v.push(jge(after as u32, other(0), r.to));
        } else if after == end {
            v.push(jge(r.first, r.to, other(0)));
        } else {
            v.push(jge(r.first, Target::Rel(0), other(1)));
            v.push(jge(after as u32, other(0), r.to));
        }
    }
    v
}

/// `ld nr`, the search, the blocks, `ret ALLOW`, `ret EPERM`, `ret ENOSYS`, `ret KILL`.
/// `base` is the index of the first instruction emitted here.
fn dispatch(
    runs: &[Run],
    blocks: &[(Block, Vec<Insn>)],
    base: usize,
) -> Result<Vec<sock_filter>, SeccompError> {
    let mut body = match search(runs, 0, 1 << 32) {
        Node::Code(c) => c,
        Node::To(t) => vec![Insn {
            code: BPF_JMP_JA,
            k: 0,
            jt: t,
            jf: t,
        }],
    };
    let mut starts: Vec<(Block, usize)> = Vec::new();
    for (b, code) in blocks {
        starts.push((*b, body.len()));
        body.extend(code.iter().copied());
    }
    let first = base + 1;
    let allow = first + body.len();
    let deny = allow + 1;
    let enosys = deny + 1;
    let kill = enosys + 1;
    let mut out = vec![stmt(BPF_LD_W_ABS, SECCOMP_DATA_NR)];
    for (i, ins) in body.iter().enumerate() {
        let at = first + i;
        let resolve = |t: Target| -> Result<usize, SeccompError> {
            Ok(match t {
                Target::Rel(r) => r,
                Target::Allow => allow - at - 1,
                Target::Deny => deny - at - 1,
                Target::Enosys => enosys - at - 1,
                Target::Kill => kill - at - 1,
                Target::Block(b) => {
                    let start = starts.iter().find(|(s, _)| *s == b).map(|(_, i)| first + i);
                    // Classic BPF has no backward jumps: a block may only enter a later one.
                    match start {
                        Some(s) if s > at => s - at - 1,
                        _ => return Err(SeccompError::BadBlockOrder),
                    }
                }
            })
        };
        match ins.code {
            BPF_LD_W_ABS => out.push(stmt(BPF_LD_W_ABS, ins.k)),
            BPF_JMP_JA => out.push(stmt(BPF_JMP_JA, resolve(ins.jt)? as u32)),
            _ => {
                let (jt, jf) = (resolve(ins.jt)?, resolve(ins.jf)?);
                let (Ok(jt), Ok(jf)) = (u8::try_from(jt), u8::try_from(jf)) else {
                    return Err(SeccompError::TooFar);
                };
                out.push(jump(ins.code, ins.k, jt, jf));
            }
        }
    }
    out.push(stmt(BPF_RET_K, SECCOMP_RET_ALLOW));
    out.push(stmt(BPF_RET_K, SECCOMP_RET_ERRNO | libc::EPERM as u32));
    out.push(stmt(BPF_RET_K, SECCOMP_RET_ERRNO | libc::ENOSYS as u32));
    out.push(stmt(BPF_RET_K, SECCOMP_RET_KILL_PROCESS));
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
        Err(crate::sys::errno())
    }
}

/// Names of everything the filter denies, for `check` and the docs.
pub fn describe(network: NetworkMode) -> Vec<String> {
    let name = |nr: i64| {
        usize::try_from(nr)
            .ok()
            .and_then(syscalls::Sysno::new)
            .map_or_else(|| format!("syscall {nr}"), |s| s.name().to_string())
    };
    let mut v: Vec<String> = DENY_ALWAYS
        .iter()
        .map(|&(nr, why)| format!("{}: any arguments: EPERM ({why})", name(nr)))
        .chain(
            ENOSYS_ALWAYS
                .iter()
                .map(|&(nr, why)| format!("{}: any arguments: ENOSYS ({why})", name(nr))),
        )
        .collect();
    v.push("unshare/clone with CLONE_NEW*: EPERM".into());
    v.push("ioctl TIOCSTI/TIOCLINUX/TIOCSETD (low 32 bits): EPERM".into());
    v.push("personality other than PER_LINUX: EPERM".into());
    v.push(
        "x32 syscalls (0x40000000..0x400003ff) and foreign architectures: kill; \
         higher numbers (syscall(-1)): the kernel's own ENOSYS"
            .into(),
    );
    v.push(match network {
        NetworkMode::None => "socket, socketpair: every family except AF_UNIX: EPERM".into(),
        NetworkMode::All => "socket, socketpair: every family except AF_UNIX, AF_INET, \
                             AF_INET6 and NETLINK_ROUTE: EPERM"
            .into(),
    });
    v.push(
        "sched_setaffinity, sched_setscheduler, sched_setparam, sched_setattr: pid other \
         than 0 (another thread or process): EPERM"
            .into(),
    );
    v.push(
        "setpriority, ioprio_set: which other than the single process, or who other than 0: \
         EPERM"
            .into(),
    );
    v.push("prlimit64 setting a limit (new != NULL) of a pid other than 0: EPERM".into());
    v.push(
        "chmod, fchmod, fchmodat, fchmodat2, mkdir, mkdirat, mknod, mknodat, creat, and open, \
         openat with O_CREAT or O_TMPFILE: a mode with S_ISUID or S_ISGID (low 32 bits): EPERM \
         (a set-id file would outlive the run on the host)"
            .into(),
    );
    v
}

/// Whether this kernel can install seccomp filters.
pub fn available() -> bool {
    // SAFETY: PR_GET_SECCOMP only returns a number; the action query reads a stack u32.
    unsafe {
        if libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) < 0 {
            return false;
        }
        let action: u32 = 0x8000_0000; // SECCOMP_RET_KILL_PROCESS
        libc::syscall(
            libc::SYS_seccomp,
            2u32, /* SECCOMP_GET_ACTION_AVAIL */
            0u32,
            &action,
        ) == 0
    }
}

#[cfg(test)]
#[path = "seccomp_tests.rs"]
mod tests;
