//! Unit tests of the seccomp program: its shape, and its answers in a forked child.

use super::*;

#[test]
fn program_is_small_and_starts_with_the_architecture_check() {
    for mode in [NetworkMode::None, NetworkMode::All] {
        let p = build(mode).unwrap();
        let pre = prefix();
        assert_eq!((p[0].code, p[0].k), (pre[0].code, pre[0].k));
        assert_eq!((p[1].code, p[1].k, p[1].jt), (pre[1].code, pre[1].k, 0));
        // Its false branch: kill.
        let kill = &p[2 + p[1].jf as usize];
        assert_eq!(
            (kill.code, kill.k),
            (BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
            "a foreign architecture is not killed"
        );
        assert_eq!((p[2].code, p[2].k), (BPF_LD_W_ABS, SECCOMP_DATA_NR));
        // Converting, JIT-compiling and running the program for every syscall number at
        // install cost linear time in the length, in every exec; keep an eye on it.
        assert!(p.len() <= 120, "filter grew to {} instructions", p.len());
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

/// The runs a leaf or a split tests: io_uring and the new mount API after it are one run.
#[test]
fn consecutive_numbers_with_one_fate_are_one_run() {
    let nrs: Vec<(u32, Target)> = (425..=433)
        .map(|n| (n, Target::Deny))
        .chain([
            (435, Target::Enosys),
            (437, Target::Enosys),
            (438, Target::Deny),
        ])
        .collect();
    let r = runs(&nrs);
    let got: Vec<(u32, u32, Target)> = r.iter().map(|r| (r.first, r.last, r.to)).collect();
    assert_eq!(
        got,
        [
            (425, 433, Target::Deny),
            (435, 435, Target::Enosys),
            (437, 437, Target::Enosys),
            (438, 438, Target::Deny),
        ]
    );
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
            if s != -1 || crate::sys::errno() != libc::EPERM {
                libc::_exit(11);
            }
            let u = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            if u < 0 {
                libc::_exit(12);
            }
            if libc::unshare(libc::CLONE_NEWUSER) != -1 || crate::sys::errno() != libc::EPERM {
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
            if libc::syscall(libc::SYS_clone3, 0, 0) != -1 || crate::sys::errno() != libc::ENOSYS {
                libc::_exit(13);
            }
            if libc::ioctl(0, (1u64 << 32 | TIOCSTI as u64) as _, c"x".as_ptr()) != -1
                || crate::sys::errno() != libc::EPERM
            {
                libc::_exit(14);
            }
            // Not a syscall on any ABI: the kernel's ENOSYS, and we are still alive.
            if libc::syscall(-1) != -1 || crate::sys::errno() != libc::ENOSYS {
                libc::_exit(17);
            }
            let mut sv = [0; 2];
            if libc::socketpair(libc::AF_INET, libc::SOCK_STREAM, 0, sv.as_mut_ptr()) != -1
                || crate::sys::errno() != libc::EPERM
            {
                libc::_exit(18);
            }
            // Our parent's limits: readable, not writable; our own: both.
            let mut lim: libc::rlimit64 = std::mem::zeroed();
            let parent = libc::getppid();
            if libc::prlimit64(parent, libc::RLIMIT_NOFILE, std::ptr::null(), &mut lim) != 0 {
                libc::_exit(19);
            }
            if libc::prlimit64(parent, libc::RLIMIT_NOFILE, &lim, std::ptr::null_mut()) != -1
                || crate::sys::errno() != libc::EPERM
            {
                libc::_exit(20);
            }
            if libc::prlimit64(0, libc::RLIMIT_NOFILE, &lim, std::ptr::null_mut()) != 0 {
                libc::_exit(21);
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

/// The set-id checks, openat2 and syslog in a forked child. The paths do not exist: a call the
/// filter lets through gets the kernel's ENOENT, one it refuses gets its errno first.
#[test]
fn refuses_setid_modes_openat2_and_syslog_in_a_forked_child() {
    let prog = build(NetworkMode::None).unwrap();
    let missing = c"/nonexistent-osb-seccomp/file";
    // (syscall, args, expected errno); each is one case, numbered by its exit status.
    let o_creat = libc::O_CREAT as u64;
    let path = missing.as_ptr() as u64;
    let at = libc::AT_FDCWD as u64;
    let how = [o_creat, 0o4755u64, 0u64];
    let cases: [(i64, [u64; 4], i32); 18] = [
        (libc::SYS_chmod, [path, 0o4755, 0, 0], libc::EPERM),
        (libc::SYS_chmod, [path, 0o2755, 0, 0], libc::EPERM),
        (libc::SYS_chmod, [path, 1 << 32 | 0o4755, 0, 0], libc::EPERM),
        (libc::SYS_chmod, [path, 0o1777, 0, 0], libc::ENOENT),
        (libc::SYS_fchmod, [u64::MAX, 0o4755, 0, 0], libc::EPERM),
        (libc::SYS_fchmodat, [at, path, 0o6755, 0], libc::EPERM),
        (libc::SYS_fchmodat2, [at, path, 0o4755, 0], libc::EPERM),
        (libc::SYS_creat, [path, 0o4755, 0, 0], libc::EPERM),
        (libc::SYS_open, [path, o_creat, 0o4755, 0], libc::EPERM),
        // Without O_CREAT or O_TMPFILE the mode is ignored, and so not checked.
        (libc::SYS_open, [path, 0, 0o4755, 0], libc::ENOENT),
        (
            libc::SYS_openat,
            [at, path, 0o20_000_000 | 0o200_000 | 2, 0o4755],
            libc::EPERM,
        ),
        (libc::SYS_openat, [at, path, o_creat, 0o755], libc::ENOENT),
        (libc::SYS_mkdir, [path, 0o2755, 0, 0], libc::EPERM),
        (libc::SYS_mkdirat, [at, path, 0o4755, 0], libc::EPERM),
        (libc::SYS_mknod, [path, 0o104755, 0, 0], libc::EPERM),
        (libc::SYS_mknodat, [at, path, 0o104755, 0], libc::EPERM),
        (
            libc::SYS_openat2,
            [at, path, how.as_ptr() as u64, 24],
            libc::ENOSYS,
        ),
        (libc::SYS_syslog, [10, 0, 0, 0], libc::EPERM),
    ];
    // SAFETY: the child only makes raw syscalls on memory prepared before fork, then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: plain prctl/syscalls in the child; no allocation.
        unsafe {
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
            if install(&prog).is_err() {
                libc::_exit(100);
            }
            for (i, (nr, a, want)) in cases.iter().enumerate() {
                let rc = libc::syscall(*nr, a[0], a[1], a[2], a[3]);
                if rc != -1 || crate::sys::errno() != *want {
                    libc::_exit(i as i32 + 1);
                }
            }
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status), "child died: {status:#x}");
    let code = libc::WEXITSTATUS(status);
    assert_eq!(
        code,
        0,
        "case {:?} answered otherwise",
        cases.get((code as usize).wrapping_sub(1))
    );
}
