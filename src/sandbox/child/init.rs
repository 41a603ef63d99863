//! The exec's own processes, from fork to exec: the init (PID 1 of the exec's PID
//! namespace) and the command.
//!
//! [`fork_exec`] runs on the process-manager thread (`exec/manager.rs`), the only thread that
//! forks. Everything the children need is built before the clone ([`ExecPlan`], the
//! [`Prepared`] layers); after it, both children make raw syscalls only (the supervisor is
//! multi-threaded: no allocation, locks or logging).
//!
//! With a PID namespace (the normal case), the manager clones the init straight into a new
//! PID namespace, holding it by pidfd:
//! 1. init: parent-death signal (then check, through the supervisor's pidfd, that the
//!    supervisor did not die before it was armed), join the exec's cgroup (so every process of
//!    the exec is born in it), setns into the view's mount, IPC, UTS and network namespaces
//!    (setns into a mount namespace needs a single-threaded caller, which only a forked child
//!    is), unshare a child mount namespace and mount a fresh /proc for the new PID namespace;
//!    then fork the command;
//! 2. the command: stdio, cwd, then the layers ([`super::enforce_in_child`]; child/mod.rs lists the order),
//!    then execve of each candidate of the program in turn (the PATH search happens here, in
//!    the view); when none starts, the error on the pipe, then the command's own examination
//!    of why (`diagnose.rs`), as the sandbox identity inside the view;
//! 3. init: close every descriptor but its status pipe (it must hold no pipe, socket or tty of
//!    the supervisor or of the exec), relay signals ([`FORWARDED`]: the supervisor's own to
//!    every process of the namespace, those `run` forwards for its caller to the command's
//!    process group), reap every orphan, and when the command exits, write its wait status on
//!    the status pipe and exit. The kernel then kills whatever else is left in the namespace
//!    before our waitid sees the init exit, so a reaped init means an empty exec.
//!
//! Without a PID namespace (degraded), the manager clones the command directly, which joins
//! the view and the cgroup itself.

use std::ffi::{CString, NulError, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

use crate::sandbox::cgroup::ExecCgroup;
use crate::sandbox::diagnose::{self, Diagnosis, RECORD_MAX};
use crate::sandbox::namespaces::{ExecView, ProcMount, mount_proc};
use crate::sandbox::prepared::Prepared;
use crate::sandbox::step::{ChildError, Step};
use crate::sys::errno;

use super::signals::{COMMAND, forward};
pub use super::signals::{FORWARDED, forward_to_job};
use super::timeline::{Mark, mark};

/// How long the supervisor waits for the command's account of a failed execve (the
/// examination in `diagnose.rs`, a handful of lookups) before it kills the exec and reports the
/// bare errno: a lookup on a hung network filesystem must not hold the spawn.
const DIAGNOSIS_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// How long `check`'s examination of one program may take in all.
const PROBE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// One command, as C data ready for execve.
pub struct ExecPlan {
    /// Where the program may be, in the order tried: argv[0] itself when it names a path, else
    /// each PATH entry joined with it. The search happens in the child, inside the view (as
    /// execvp does), so that it finds what the view holds, and tells nothing of the host's
    /// paths outside it.
    candidates: Vec<CString>,
    /// Only examine the program, never exec it (`check`).
    probe: bool,
    _argv: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    _envp: Vec<CString>,
    envp: Vec<*const libc::c_char>,
    cwd: CString,
    /// The child's ends of stdin, stdout, stderr.
    stdio: [OwnedFd; 3],
    group: super::group::CommandGroup,
    /// Exec this open file (execveat, AT_EMPTY_PATH) instead of a candidate: our own binary for
    /// the sftp-server mode, which the sandbox may not open by name.
    program_fd: Option<std::sync::Arc<OwnedFd>>,
    /// The workdir, for the command's own check that it may write there (`run`, see
    /// `process::check_workdir`); empty when never asked.
    workdir: CString,
    /// The exec's own copy of the sandbox's Landlock ruleset ([`ExecPlan::with_ruleset`]).
    landlock: Option<crate::sandbox::landlock::PreparedRuleset>,
}

// SAFETY: the raw pointers point into the CStrings owned by the same struct, which are never
// mutated; moving the struct between threads moves them together.
unsafe impl Send for ExecPlan {}

impl ExecPlan {
    /// `candidates`: see [`ExecPlan`]; the caller refuses more than
    /// [`diagnose::MAX_CANDIDATES`] (so that each has an index on the error pipe).
    pub fn new(
        candidates: &[std::path::PathBuf],
        argv: &[OsString],
        env: &[(OsString, OsString)],
        cwd: &std::path::Path,
        stdio: [OwnedFd; 3],
        group: super::group::CommandGroup,
        program_fd: Option<std::sync::Arc<OwnedFd>>,
    ) -> Result<ExecPlan, NulError> {
        let owned_argv = argv
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<Vec<_>, _>>()?;
        let owned_envp = env
            .iter()
            .map(|(k, v)| {
                let mut b = k.as_bytes().to_vec();
                b.push(b'=');
                b.extend_from_slice(v.as_bytes());
                CString::new(b)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let ptrs = |v: &[CString]| {
            v.iter()
                .map(|c| c.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect()
        };
        let candidates = candidates
            .iter()
            .take(diagnose::MAX_CANDIDATES)
            .map(|c| CString::new(c.as_os_str().as_bytes()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ExecPlan {
            candidates,
            probe: false,
            argv: ptrs(&owned_argv),
            envp: ptrs(&owned_envp),
            _argv: owned_argv,
            _envp: owned_envp,
            cwd: CString::new(cwd.as_os_str().as_bytes())?,
            stdio,
            group,
            program_fd,
            workdir: CString::default(),
            landlock: None,
        })
    }

    /// The command enforces `r`, a copy of the sandbox's ruleset made for this exec
    /// (`PreparedRuleset::copy`), and adds its own rules there, not to the shared one.
    pub fn with_ruleset(mut self, r: crate::sandbox::landlock::PreparedRuleset) -> ExecPlan {
        self.landlock = Some(r);
        self
    }

    /// The workdir that `run`'s command may be asked to check it can write (see
    /// [`ExecPlan::workdir`]).
    pub fn with_workdir(mut self, dir: &std::path::Path) -> Result<ExecPlan, NulError> {
        self.workdir = CString::new(dir.as_os_str().as_bytes())?;
        Ok(self)
    }

    /// The child's ends of its standard streams, given back.
    pub fn into_stdio(self) -> [OwnedFd; 3] {
        self.stdio
    }

    /// Make this a plan for [`probe`]: the child examines the program and exits.
    pub fn probe_only(mut self) -> ExecPlan {
        self.probe = true;
        self
    }
}

/// A started exec, as the manager holds it.
#[derive(Debug)]
pub struct Spawned {
    pub pid: libc::pid_t,
    pub pidfd: OwnedFd,
    /// The read end of the init's status pipe (None without an init).
    pub status: Option<OwnedFd>,
    /// `pid` is our init, PID 1 of the exec's own PID namespace.
    pub init: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("creating a pipe: {0}")]
    Pipe(io::Error),
    #[error("clone: {0}")]
    Clone(io::Error),
    #[error("{0}")]
    Child(ChildError),
    /// execve failed; the command's examination of why, when it came in time.
    #[error("{error}")]
    Exec {
        error: ChildError,
        diagnosis: Option<Box<Diagnosis>>,
    },
}

pub(super) fn cloexec_pipe() -> Result<(OwnedFd, OwnedFd), SpawnError> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into our array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(SpawnError::Pipe(io::Error::last_os_error()));
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Fork the exec and wait until its command has exec'd (or a step failed). Runs on the
/// process-manager thread: the children's parent-death signal fires when *this thread* exits,
/// so it must be the long-lived manager, never a pool thread.
pub fn fork_exec(
    p: &Prepared,
    plan: &ExecPlan,
    cg: Option<&ExecCgroup>,
    supervisor_pidfd: RawFd,
) -> Result<Spawned, SpawnError> {
    await_exec(clone_exec(p, plan, cg, supervisor_pidfd)?)
}

/// Wait until the command of the exec just cloned has exec'd (or a step failed).
pub(super) fn await_exec(c: Cloned) -> Result<Spawned, SpawnError> {
    let mut buf = [0u8; ChildError::WIRE];
    let n = loop {
        // SAFETY: reading into a stack buffer. Our write end is closed; the init closes its
        // copy after forking the command, whose copy is close-on-exec: EOF means exec worked.
        let n = unsafe { libc::read(c.err_r.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 && errno() == libc::EINTR {
            continue;
        }
        break n;
    };
    if n == buf.len() as isize {
        let e = ChildError::decode(&buf).unwrap_or(ChildError::new(Step::Exec, libc::EIO));
        // After a failed execve the command examines why, then exits.
        let diagnosis = (e.step == Step::Exec).then(|| {
            let rec = read_until_eof(&c.err_r, DIAGNOSIS_WAIT, &c.pidfd);
            Diagnosis::decode(&rec).map(Box::new)
        });
        // The child (and, with an init, the whole namespace) exits at once: reap it here, so
        // the manager's bookkeeping never sees this pid.
        reap(&c.pidfd);
        return Err(match diagnosis {
            Some(diagnosis) => SpawnError::Exec {
                error: e,
                diagnosis,
            },
            None => SpawnError::Child(e),
        });
    }
    Ok(Spawned {
        pid: c.pid,
        pidfd: c.pidfd,
        status: c.status,
        init: c.init,
    })
}

/// Examine, inside the view and as the sandbox identity, whether `plan`'s program could start
/// (`check`): the exec's own children, up to where the command would exec. `None` when the
/// examination did not end in time.
pub fn probe(p: &Prepared, plan: &ExecPlan) -> Result<Option<Box<Diagnosis>>, SpawnError> {
    let c = clone_exec(p, plan, None, -1)?;
    let out = read_until_eof(&c.err_r, PROBE_WAIT, &c.pidfd);
    reap(&c.pidfd);
    // A step before the examination failed: its ChildError is all the pipe holds.
    if let Ok(b) = <&[u8; ChildError::WIRE]>::try_from(out.as_slice())
        && let Some(e) = ChildError::decode(b)
    {
        return Err(SpawnError::Child(e));
    }
    Ok(Diagnosis::decode(&out).map(Box::new))
}

/// Read `r` until EOF, at most [`RECORD_MAX`] bytes and at most `limit` long; past it, kill
/// the exec behind `pidfd` (its end closes the pipe) and return what came.
fn read_until_eof(r: &OwnedFd, limit: std::time::Duration, pidfd: &OwnedFd) -> Vec<u8> {
    let deadline = std::time::Instant::now() + limit;
    let mut out = vec![0u8; RECORD_MAX];
    let mut n = 0;
    while n < out.len() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut pfd = libc::pollfd {
            fd: r.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one descriptor we own.
        let ready = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(60_000) as i32) };
        if ready < 0 && errno() == libc::EINTR {
            continue;
        }
        if ready <= 0 {
            // Through our own pidfd of the child: it cannot reach another process.
            let _ = crate::sys::process::pidfd_send_signal(pidfd.as_raw_fd(), libc::SIGKILL);
            break;
        }
        // SAFETY: reading into our buffer, after its first `n` bytes.
        let got = unsafe { libc::read(r.as_raw_fd(), out[n..].as_mut_ptr().cast(), out.len() - n) };
        if got < 0 && errno() == libc::EINTR {
            continue;
        }
        if got <= 0 {
            break;
        }
        n += got as usize;
    }
    out.truncate(n);
    out
}

/// Wait for the child behind `pidfd` to exit.
pub(super) fn reap(pidfd: &OwnedFd) {
    // SAFETY: siginfo is plain data; waiting on our own pidfd.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        libc::waitid(
            libc::P_PIDFD,
            pidfd.as_raw_fd() as libc::id_t,
            &mut info,
            libc::WEXITED,
        );
    }
}

/// The children of one exec, just cloned.
pub(super) struct Cloned {
    pub(super) pid: libc::pid_t,
    pub(super) pidfd: OwnedFd,
    pub(super) err_r: OwnedFd,
    pub(super) status: Option<OwnedFd>,
    pub(super) init: bool,
}

fn clone_exec(
    p: &Prepared,
    plan: &ExecPlan,
    cg: Option<&ExecCgroup>,
    supervisor_pidfd: RawFd,
) -> Result<Cloned, SpawnError> {
    let view = p.view.exec_view();
    let init = view.pid;
    let (err_r, err_w) = cloexec_pipe()?;
    let (st_r, st_w) = if init {
        let (r, w) = cloexec_pipe()?;
        (Some(r), Some(w))
    } else {
        (None, None)
    };
    let mut flags = libc::CLONE_PIDFD as libc::c_ulong | libc::SIGCHLD as libc::c_ulong;
    if init {
        flags |= libc::CLONE_NEWPID as libc::c_ulong;
    }
    let area = args_area();
    // Where the init's forget keeps the main thread's stack from (sys/forget.rs), read before
    // the fork.
    crate::sys::forget::note_main_stack();
    let stack: &[u8] = if init { command_stack() } else { &[] };
    let mut pidfd: libc::c_int = -1;
    mark(Mark::Pipes);
    // SAFETY: a raw clone without CLONE_VM and without a new stack is a fork (x86_64 order:
    // flags, stack, parent_tid, child_tid, tls; CLONE_PIDFD returns the pidfd in parent_tid).
    // The child runs only `init_main` / `command_main`, which never return.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags,
            0usize,
            &mut pidfd as *mut libc::c_int,
            0usize,
            0usize,
        )
    };
    if pid < 0 {
        return Err(SpawnError::Clone(io::Error::last_os_error()));
    }
    if pid == 0 {
        mark(Mark::InitStart);
        let err = err_w.as_raw_fd();
        // SAFETY: we are the forked, single-threaded child.
        unsafe {
            match &st_w {
                Some(st) => {
                    scrub_identity(area);
                    let a = InitArgs {
                        view: &view,
                        err_w: err,
                        status_w: st.as_raw_fd(),
                        supervisor_pidfd,
                        stack,
                    };
                    init_main(p, plan, cg, a)
                }
                None => command_main(p, plan, cg, Some(&view), p.supervisor_pid, err, None),
            }
        }
    }
    // SAFETY: CLONE_PIDFD stored a new descriptor that nobody else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    drop(err_w);
    drop(st_w);
    Ok(Cloned {
        pid: pid as libc::pid_t,
        pidfd,
        err_r,
        status: st_r,
        init,
    })
}

/// The command's stack when an init clones it (see `serve_exec`): one region for every spawn,
/// mapped once, before the first fork. The supervisor never writes it; each init is a fork, so
/// the command writes only the init's private copy, and the next spawn can name the same
/// region at once. A zeroed 256 KiB allocated for each spawn cost a tenth of the spawn's time.
fn command_stack() -> &'static [u8] {
    static STACK: std::sync::OnceLock<Box<[u8]>> = std::sync::OnceLock::new();
    STACK.get_or_init(|| vec![0u8; 256 << 10].into_boxed_slice())
}

/// The supervisor's argv and environment areas (arg_start, arg_end, env_start, env_end of
/// /proc/self/stat), read once before any fork.
pub(super) fn args_area() -> [usize; 4] {
    static AREA: std::sync::OnceLock<[usize; 4]> = std::sync::OnceLock::new();
    *AREA.get_or_init(|| {
        let stat = crate::sys::procstat::read_record("/proc/self/stat").unwrap_or_default();
        // arg_start, arg_end, env_start, env_end: fields 48 to 51.
        match crate::sys::procstat::StatLine::new(&stat).and_then(|s| s.nums(48)) {
            Some([a, b, c, d]) if a < b && c <= d => [a, b, c, d],
            _ => [0; 4],
        }
    })
}

/// In the init: our argv and environment are the supervisor's (the init is a fork of it, and
/// never execs). /proc/1/cmdline is readable by every process of the namespace, and the
/// supervisor's command line can hold a token (`--sandbox-token`): overwrite both areas in our
/// copy of the memory, and the thread name too. Async-signal-safe: plain stores.
///
/// # Safety
/// Only in the forked init; `area` is from [`args_area`] of the process it was forked from.
pub(super) unsafe fn scrub_identity(area: [usize; 4]) {
    const NAME: &[u8] = b"openshell-init\0";
    // SAFETY: the areas are mapped, writable stack memory of this process (our private copy
    // after fork); nothing reads them again in the init.
    unsafe {
        let [a, b, c, d] = area;
        if a != 0 && b > a {
            std::ptr::write_bytes(a as *mut u8, 0, b - a);
            let n = NAME.len().min(b - a);
            std::ptr::copy_nonoverlapping(NAME.as_ptr(), a as *mut u8, n);
        }
        if c != 0 && d > c {
            std::ptr::write_bytes(c as *mut u8, 0, d - c);
        }
        libc::prctl(libc::PR_SET_NAME, NAME.as_ptr(), 0, 0, 0);
    }
}

pub(super) fn fail(e: ChildError, err_w: RawFd) -> ! {
    e.send(err_w);
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(125) }
}

/// setns into each namespace of the view, then (when asked) a child mount namespace with a
/// fresh /proc for the caller's PID namespace. Async-signal-safe.
fn join_view(v: &ExecView, proc: bool) -> Result<(), ChildError> {
    for (fd, nstype, step) in [
        (v.mnt, libc::CLONE_NEWNS, Step::SetnsMount),
        (v.ipc, libc::CLONE_NEWIPC, Step::SetnsIpc),
        (v.uts, libc::CLONE_NEWUTS, Step::SetnsUts),
        (v.net, libc::CLONE_NEWNET, Step::SetnsNet),
    ] {
        // SAFETY: setns on a descriptor the view owns.
        if fd >= 0 && unsafe { libc::setns(fd, nstype) } != 0 {
            return Err(ChildError::last(step));
        }
    }
    mark(Mark::InitSetns);
    // setns put us at the namespace's root; where the view's root could only be entered with
    // chroot (view_root.rs), that is the old root under it: enter the view's.
    if v.mnt >= 0 && v.root >= 0 {
        // SAFETY: fchdir to a descriptor the view owns, then chroot to it; the caller is the
        // single-threaded child, still privileged.
        if unsafe { libc::fchdir(v.root) != 0 || libc::chroot(c".".as_ptr()) != 0 } {
            return Err(ChildError::last(Step::EnterViewRoot));
        }
    }
    if proc && v.proc != ProcMount::None {
        // SAFETY: unshare with a flag, in the single-threaded child.
        if v.own_mnt && unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
            return Err(ChildError::last(Step::UnshareExecMount));
        }
        if mount_proc(v.proc) != 0 {
            return Err(ChildError::last(Step::MountProc));
        }
        mark(Mark::InitProc);
    }
    Ok(())
}

/// The init's descriptors and the command's stack.
struct InitArgs<'a> {
    view: &'a ExecView,
    err_w: RawFd,
    status_w: RawFd,
    supervisor_pidfd: RawFd,
    stack: &'a [u8],
}

/// # Safety
/// Only in the child forked by [`fork_exec`] into a new PID namespace.
unsafe fn init_main(p: &Prepared, plan: &ExecPlan, cg: Option<&ExecCgroup>, a: InitArgs<'_>) -> ! {
    let InitArgs {
        view,
        err_w,
        status_w,
        supervisor_pidfd,
        stack,
    } = a;
    // SAFETY: raw syscalls on prepared data throughout.
    unsafe {
        init_prologue(cg, supervisor_pidfd, err_w);
        mark(Mark::InitPrologue);
        if let Err(e) = join_view(view, true) {
            fail(e, err_w);
        }
        serve_exec(p, plan, err_w, status_w, stack, false)
    }
}

/// The init's first steps (child/mod.rs, 1 and 2): the parent-death signal, checked against the
/// supervisor's pidfd, then the exec's cgroup.
///
/// # Safety
/// Only in an exec's init, as its first steps.
pub(super) unsafe fn init_prologue(cg: Option<&ExecCgroup>, supervisor_pidfd: RawFd, err_w: RawFd) {
    // SAFETY: raw syscalls with integer arguments and a stack pollfd.
    unsafe {
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
        {
            fail(ChildError::last(Step::InitParentDeath), err_w);
        }
        // Our parent is outside our PID namespace, so getppid() is 0 whoever it is: ask the
        // supervisor's pidfd instead. Readable means it has exited, and the signal armed above
        // would never fire.
        let mut pfd = libc::pollfd {
            fd: supervisor_pidfd,
            events: libc::POLLIN,
            revents: 0,
        };
        if supervisor_pidfd >= 0 && libc::poll(&mut pfd, 1, 0) > 0 {
            fail(ChildError::new(Step::SupervisorGone, libc::ESRCH), err_w);
        }
        if let Some(cg) = cg
            && let Err(e) = cg.join()
        {
            fail(ChildError::new(Step::JoinCgroup, e), err_w);
        }
    }
}

/// The init's part once it stands in the view (child/mod.rs, 4 and 5): relay signals, clone
/// the command, then hold nothing of the supervisor's and reap until the command exits.
///
/// # Safety
/// Only in an exec's init, in the exec's view, with `stack` its own copy of the command's
/// stack.
pub(super) unsafe fn serve_exec(
    p: &Prepared,
    plan: &ExecPlan,
    err_w: RawFd,
    status_w: RawFd,
    stack: &[u8],
    check_workdir: bool,
) -> ! {
    // SAFETY: raw syscalls on prepared data throughout.
    unsafe {
        // Block the forwarded signals until the command exists to receive them; the command
        // unblocks them itself just before exec.
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in FORWARDED {
            libc::sigaddset(&mut set, s);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        for s in FORWARDED {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = forward as *const () as usize;
            sa.sa_flags = libc::SA_RESTART | libc::SA_SIGINFO;
            if libc::sigaction(s, &sa, std::ptr::null_mut()) != 0 {
                fail(ChildError::last(Step::InitSignals), err_w);
            }
        }
        mark(Mark::InitSignals);
        // The command shares our memory until it execs (CLONE_VM|CLONE_VFORK, as posix_spawn
        // does): copying the page tables of a second copy of the supervisor was the largest
        // single cost of the spawn. It runs on its own stack, prepared before the first fork;
        // we are suspended until its execve (or _exit) releases the memory.
        // We sleep from the clone until the command's exec, so the command is best run on our
        // CPU. The scheduler places a new task on the idlest CPU instead, and waking that one
        // (an interrupt to a halted CPU, through the hypervisor in a VM) delays the command's
        // first instruction by 30-40 µs. So our affinity is narrowed to the CPU we run on for
        // the clone, which the command inherits, and the command widens its own and ours back
        // to `wide` first thing, before anything it runs can see the narrow one.
        let mut wide: libc::cpu_set_t = std::mem::zeroed();
        let narrowed = narrow_affinity(&mut wide);
        let args = CommandArgs {
            p,
            plan,
            err_w,
            check_workdir,
            affinity: narrowed.then_some(&wide),
        };
        let top = (stack.as_ptr() as usize + stack.len()) & !15;
        let cmd = libc::clone(
            command_entry,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&args as *const CommandArgs).cast_mut().cast(),
        );
        if cmd < 0 {
            fail(ChildError::last(Step::ForkCommand), err_w);
        }
        mark(Mark::InitResumed);
        COMMAND.store(cmd, std::sync::atomic::Ordering::Relaxed);
        // The command has exec'd (or exited, its account of why written): our end of the error
        // pipe goes first, so that the supervisor learns it at once, not after the forgetting
        // below (a walk of our whole mapping list).
        libc::close(err_w);
        // Our copy of the supervisor's heaps and other threads' stacks is of no more use, and
        // may hold its secrets (sys/forget.rs).
        crate::sys::forget::forget_supervisor_memory(None, std::ptr::addr_of!(COMMAND) as usize);
        mark(Mark::InitForgot);
        // Hold nothing of the supervisor's or of the exec's: no pipe may stay open because of
        // us, and the error pipe must reach EOF when the command execs.
        libc::syscall(libc::SYS_close_range, 0u32, (status_w - 1) as u32, 0u32);
        libc::syscall(libc::SYS_close_range, (status_w + 1) as u32, u32::MAX, 0u32);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        loop {
            let mut st = 0;
            let r = libc::wait4(-1, &mut st, libc::__WALL, std::ptr::null_mut());
            if r == cmd {
                let b = st.to_ne_bytes();
                libc::write(status_w, b.as_ptr().cast(), b.len());
                let code = if libc::WIFEXITED(st) {
                    libc::WEXITSTATUS(st)
                } else {
                    128 + libc::WTERMSIG(st)
                };
                libc::_exit(code);
            }
            if r < 0 && errno() != libc::EINTR {
                libc::_exit(255);
            }
        }
    }
}

struct CommandArgs<'a> {
    p: &'a Prepared,
    plan: &'a ExecPlan,
    err_w: RawFd,
    /// Ask whether the command may write its workdir ([`ExecPlan::with_workdir`]).
    check_workdir: bool,
    /// The init's affinity before it narrowed it for the clone ([`narrow_affinity`]): the
    /// command restores it on itself and on the init.
    affinity: Option<&'a libc::cpu_set_t>,
}

/// Narrow the caller's CPU affinity to the CPU it runs on, keeping the old mask in `wide`.
/// Whether it did: a failure here only costs the command its faster start.
///
/// # Safety
/// Async-signal-safe: raw syscalls on the caller's stack.
unsafe fn narrow_affinity(wide: &mut libc::cpu_set_t) -> bool {
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: the kernel writes at most `size` bytes into `wide` and `cpu`; the mask on the
    // stack lives through the call.
    unsafe {
        if libc::sched_getaffinity(0, size, wide) != 0 {
            return false;
        }
        let mut cpu: libc::c_uint = 0;
        let null = std::ptr::null_mut::<libc::c_void>();
        if libc::syscall(libc::SYS_getcpu, &mut cpu, null, null) != 0
            || cpu as usize >= libc::CPU_SETSIZE as usize
        {
            return false;
        }
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut one);
        libc::sched_setaffinity(0, size, &one) == 0
    }
}

/// The command's first step when the init narrowed its affinity for the clone: the init's old
/// mask back on the command and on the init (our parent, still suspended in vfork; we still
/// have its identity, so the kernel lets us). A command left on one CPU would be a different
/// sandbox (`nproc` would say 1), so a failure fails the exec.
///
/// # Safety
/// In the command child, before its identity changes.
unsafe fn restore_affinity(wide: &libc::cpu_set_t) -> Result<(), ChildError> {
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: raw syscalls reading a mask that the init keeps alive while it is suspended.
    unsafe {
        if libc::sched_setaffinity(0, size, wide) != 0
            || libc::sched_setaffinity(libc::getppid(), size, wide) != 0
        {
            return Err(ChildError::last(Step::RestoreAffinity));
        }
    }
    Ok(())
}

/// The command's entry point from the init's clone.
extern "C" fn command_entry(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` points at the init's CommandArgs, alive while the init is suspended in
    // vfork; we are the single-threaded command child.
    unsafe {
        mark(Mark::CommandStart);
        let a = &*(arg as *const CommandArgs<'_>);
        if let Some(wide) = a.affinity
            && let Err(e) = restore_affinity(wide)
        {
            fail(e, a.err_w);
        }
        let workdir = a.check_workdir.then_some(a.plan.workdir.as_c_str());
        command_main(a.p, a.plan, None, None, 1, a.err_w, workdir)
    }
}

/// # Safety
/// Only in a forked child: the command's side, ending in execve.
unsafe fn command_main(
    p: &Prepared,
    plan: &ExecPlan,
    join: Option<&ExecCgroup>,
    view: Option<&ExecView>,
    parent: libc::pid_t,
    err_w: RawFd,
    workdir: Option<&std::ffi::CStr>,
) -> ! {
    // SAFETY: raw syscalls on prepared data throughout.
    unsafe {
        // Move the three ends above 2 first, so that dup2 onto 0..2 cannot clobber one of
        // them (any of them may itself be 0, 1 or 2).
        let mut high = [-1; 3];
        for (i, fd) in plan.stdio.iter().enumerate() {
            high[i] = libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3);
            if high[i] < 0 {
                fail(ChildError::last(Step::Stdio), err_w);
            }
        }
        for (i, fd) in high.iter().enumerate() {
            if libc::dup2(*fd, i as libc::c_int) < 0 {
                fail(ChildError::last(Step::Stdio), err_w);
            }
        }
        if let Some(v) = view
            && let Err(e) = join_view(v, false)
        {
            fail(e, err_w);
        }
        if libc::chdir(plan.cwd.as_ptr()) != 0 {
            fail(ChildError::last(Step::Chdir), err_w);
        }
        mark(Mark::CommandStdio);
        // Without an init (no PID namespace), the command itself is its exec's child
        // subreaper: the attribute survives execve, and is not inherited by its children. A
        // double-forked daemon of this exec is then re-parented to the command while it runs,
        // not to the supervisor, where it could not be told apart from another exec's orphan:
        // the end of one exec used to sweep every unregistered orphan of the supervisor, so it
        // killed a running exec's daemons too. Once the command exits its
        // orphans do reach the supervisor, and its own sweep kills them. A command that clears
        // the attribute hands only its own daemons to that sweep.
        if view.is_some() && libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
            fail(ChildError::last(Step::Subreaper), err_w);
        }
        let own = plan.landlock.as_ref();
        if let Err(e) = super::enforce_in_child(p, own, join, plan.group, parent, workdir) {
            fail(e, err_w);
        }
        match &plan.program_fd {
            // The fd is close-on-exec by now (enforce_fds); execveat of an ELF binary through
            // it still works, the kernel has opened the file before it closes the fd.
            Some(fd) => {
                libc::syscall(
                    libc::SYS_execveat,
                    fd.as_raw_fd(),
                    c"".as_ptr(),
                    plan.argv.as_ptr(),
                    plan.envp.as_ptr(),
                    libc::AT_EMPTY_PATH,
                );
            }
            None if plan.probe => {
                diagnose::diagnose(&plan.candidates, None, 0, plan.cwd.as_bytes(), err_w);
                libc::_exit(0);
            }
            None => {
                let (decided, e) = exec_candidates(plan);
                let error = ChildError {
                    step: Step::Exec,
                    detail: decided.map_or(u8::MAX, |i| i as u8),
                    errno: e,
                };
                // The error first, so that the supervisor knows at once; then the account of
                // why, which it waits for only so long.
                error.send(err_w);
                diagnose::diagnose(&plan.candidates, decided, e, plan.cwd.as_bytes(), err_w);
                libc::_exit(125);
            }
        }
        fail(ChildError::last(Step::Exec), err_w)
    }
}

/// execve each candidate in turn, as execvp searches PATH: past one that is not there (ENOENT,
/// which is also what a missing interpreter gives) or may not be executed (EACCES, kept for the
/// end), stopping at any other error. The candidate that decided the failure, and its errno;
/// `None` when every one was not there.
///
/// # Safety
/// In the command child only, its layers applied.
unsafe fn exec_candidates(plan: &ExecPlan) -> (Option<usize>, i32) {
    let mut denied = None;
    for (i, c) in plan.candidates.iter().enumerate() {
        // SAFETY: prepared NUL-terminated strings and pointer arrays.
        unsafe { libc::execve(c.as_ptr(), plan.argv.as_ptr(), plan.envp.as_ptr()) };
        match errno() {
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
            libc::EACCES => {
                denied.get_or_insert(i);
            }
            e => return (Some(i), e),
        }
    }
    match denied {
        Some(i) => (Some(i), libc::EACCES),
        None => (None, libc::ENOENT),
    }
}
