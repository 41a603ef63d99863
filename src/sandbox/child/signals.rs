//! The exec's init relays signals: the supervisor's own to every process of its PID
//! namespace, those `run` forwards for its caller to the command's process group.

use std::io;
use std::os::fd::AsRawFd;

use crate::sys::errno;

/// The signals the init relays. The supervisor's own SIGTERM (a timeout, a shutdown) must
/// reach the whole tree; the rest are what `run` forwards for its caller (docker's
/// `--sig-proxy` set, less SIGWINCH, which a pty's resize delivers itself).
pub const FORWARDED: [libc::c_int; 6] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// The value that marks a signal as one forwarded for `run`'s caller (sent with SI_QUEUE by
/// [`forward_to_job`]): the init hands it to the command's process group, as a terminal's
/// Ctrl-C reaches its foreground job. An unmarked one (the supervisor's own, or kill(1) from
/// the host) goes to every process of the namespace.
const TO_JOB: u64 = 0x6f73_625f_6a6f_6221;

/// The command's pid in the namespace, which is its process group too (it made its own group
/// before anything of it ran, `group.rs`; a command that later moves to a group of its own
/// processes only misses what `run` forwards). Set by the init before it unblocks
/// [`FORWARDED`]; 0 before.
pub(super) static COMMAND: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// siginfo as the kernel lays it out for SI_QUEUE on 64-bit Linux (`_sifields._rt`): signo,
/// errno, code, padding to the 8-byte aligned union, then pid, uid and the value. libc keeps
/// the union private, so the two ends of [`TO_JOB`] read and write it through this.
#[repr(C)]
struct QueuedInfo {
    signo: i32,
    errno: i32,
    code: i32,
    _pad: i32,
    pid: i32,
    uid: u32,
    value: u64,
    _rest: [u64; 12],
}
const _: () = assert!(std::mem::size_of::<QueuedInfo>() == std::mem::size_of::<libc::siginfo_t>());

/// Send `sig` through the init held by `pidfd` to its command's process group (see
/// [`TO_JOB`]). pidfd_send_signal takes a caller's siginfo only with a negative si_code
/// (SI_QUEUE); the kernel zeroes si_pid, which the init cannot see from its namespace, and
/// keeps the value.
pub fn forward_to_job(pidfd: std::os::fd::BorrowedFd<'_>, sig: libc::c_int) -> io::Result<()> {
    let info = QueuedInfo {
        signo: sig,
        errno: 0,
        code: libc::SI_QUEUE,
        _pad: 0,
        // SAFETY: getpid has no preconditions.
        pid: unsafe { libc::getpid() },
        // SAFETY: getuid has no preconditions.
        uid: unsafe { libc::getuid() },
        value: TO_JOB,
        _rest: [0; 12],
    };
    // SAFETY: pidfd_send_signal with a pidfd we hold and a siginfo-sized struct on our stack.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            &info as *const QueuedInfo,
            0u32,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The init's relaying handler: a signal marked [`TO_JOB`] goes to the command's process
/// group; any other to every process of the namespace (kill(-1) from PID 1 reaches all of them
/// but the init itself), as SIGTERM reached the whole tree before there was an init.
pub(super) extern "C" fn forward(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    _: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler, laid out as
    // QueuedInfo for SI_QUEUE; kill, an atomic load and the errno location are
    // async-signal-safe; errno is restored so the interrupted wait4 sees its own.
    unsafe {
        let saved = errno();
        let q = &*(info as *const QueuedInfo);
        let job = COMMAND.load(std::sync::atomic::Ordering::Relaxed);
        if q.code == libc::SI_QUEUE && q.value == TO_JOB && job > 0 {
            libc::kill(-job, sig);
        } else {
            libc::kill(-1, sig);
        }
        *libc::__errno_location() = saved;
    }
}
