//! `run`'s exec init that makes the view itself: one clone into new mount, PID, IPC and UTS
//! namespaces, whose child builds the view where it stands (namespaces/in_init.rs), reports
//! it, waits for the supervisor's go (which brings the network namespace the supervisor made
//! meanwhile, `--network none`), and then serves the exec as every init does (init.rs: relay
//! signals, clone the command, reap).
//!
//! Against a view made ahead (a helper forked to build it, kept by descriptor, then joined by
//! each exec's init with four setns and a fresh /proc), this is one process, one copy of the
//! mount tree and one teardown fewer, no namespace opened by path or joined, and no thread
//! for the network namespace: what a `run` needs, whose view serves one exec. A `serve`
//! sandbox's view must outlive each of its execs, so it keeps the helper's path.
//!
//! The order, in the init:
//! 1. the init's first steps (init.rs `init_prologue`): parent-death signal, checked against
//!    the supervisor's pidfd; the exec's cgroup;
//! 2. the view (in_init.rs), then the Landlock rules of its private tmpfs roots, its own
//!    files and their overlay on the shared ruleset (which exist only now, in this
//!    namespace), and the report to the supervisor; then, while the supervisor reads the
//!    report, the bounding set emptied for the command to inherit and the old root (stacked
//!    on the view's since the pivot) detached;
//! 3. the supervisor's go (one byte, with the network namespace's descriptor; EOF means it
//!    fell back to the helper's path or gave up: exit, and the namespaces go with us), after
//!    it has decided the layers from the report and handed the workdir over where idmapped
//!    mounts were refused; then that network namespace joined;
//! 4. the rest of an init's life (init.rs `serve_exec`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::init::{
    Cloned, ExecPlan, SpawnError, Spawned, args_area, await_exec, cloexec_pipe, fail,
    init_prologue, reap, scrub_identity, serve_exec,
};
use crate::sandbox::cgroup::ExecCgroup;
use crate::sandbox::namespaces::{HelperReport, ViewPlan, in_init};
use crate::sandbox::prepared::Prepared;
use crate::sandbox::run_timeline::{InitMark, init_mark};
use crate::sandbox::step::{ChildError, Step};
use crate::sys::errno;

/// An exec init that has been cloned and is building (or has built) the view, waiting for
/// [`ViewInit::go`]. Dropped without it, the init is killed and reaped.
pub struct ViewInit {
    cloned: Option<Cloned>,
    report_r: OwnedFd,
    go_w: Option<OwnedFd>,
}

/// Clone `run`'s exec init for `p` (whose view is still to be made), to build the view of
/// `view`, then, once told to go, start `plan`'s command in it. Runs on the thread that will
/// outlive the exec (the init's parent-death signal fires when that thread exits).
pub fn clone_view_init(
    p: &Prepared,
    view: &ViewPlan,
    plan: &ExecPlan,
    cg: Option<&ExecCgroup>,
    supervisor_pidfd: RawFd,
) -> Result<ViewInit, SpawnError> {
    let (err_r, err_w) = cloexec_pipe()?;
    let (st_r, st_w) = cloexec_pipe()?;
    let (report_r, report_w) = cloexec_pipe()?;
    let (go_r, go_w) = go_channel()?;
    // No CLONE_NEWNET: the supervisor makes the network namespace while we build the rest
    // (its ~0.4 ms of the kernel's setup on the other core), and hands it over with go.
    let flags = libc::CLONE_PIDFD
        | libc::SIGCHLD
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS;
    let area = args_area();
    // The command's stack (see init.rs `serve_exec`), allocated before the clone.
    let stack = vec![0u8; 256 << 10];
    let mut pidfd: libc::c_int = -1;
    // SAFETY: a raw clone without CLONE_VM and without a new stack is a fork (x86_64 order:
    // flags, stack, parent_tid, child_tid, tls; CLONE_PIDFD returns the pidfd in parent_tid).
    // The child runs only `view_init_main`, which never returns.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags as libc::c_ulong,
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
        // SAFETY: we are the forked, single-threaded child; the supervisor's ends of our two
        // pipes are closed first, so that its death or fallback reads as EOF here.
        unsafe {
            libc::close(report_r.as_raw_fd());
            libc::close(go_w.as_raw_fd());
            scrub_identity(area);
            view_init_main(
                p,
                view,
                plan,
                cg,
                Fds {
                    err_w: err_w.as_raw_fd(),
                    status_w: st_w.as_raw_fd(),
                    report_w: report_w.as_raw_fd(),
                    go_r: go_r.as_raw_fd(),
                    supervisor_pidfd,
                },
                &stack,
            )
        }
    }
    // SAFETY: CLONE_PIDFD stored a new descriptor that nobody else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    Ok(ViewInit {
        cloned: Some(Cloned {
            pid: pid as libc::pid_t,
            pidfd,
            err_r,
            status: Some(st_r),
            init: true,
        }),
        report_r,
        go_w: Some(go_w),
    })
}

impl ViewInit {
    /// The init's pid (in the supervisor's PID namespace).
    pub fn pid(&self) -> libc::pid_t {
        self.cloned.as_ref().map_or(-1, |c| c.pid)
    }

    /// A directory of the view this init made (`name`: one component below its root, as
    /// `tmp`), as an O_PATH descriptor opened through the init's root (`/proc/<pid>/root`; the
    /// init is our child, not reaped, so the pid is its). Before the go nothing sandboxed has
    /// run in the view, so nothing there can have been swapped; the last step follows no link.
    pub fn open_in_view(&self, name: &std::ffi::CStr) -> io::Result<OwnedFd> {
        let root = format!("/proc/{}/root", self.pid());
        let root = std::fs::File::open(&root)?;
        // SAFETY: openat on a live directory fd with a NUL-terminated name; the result is
        // owned below.
        let fd = unsafe {
            libc::openat(
                root.as_raw_fd(),
                name.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd that nobody else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Wait for the view's report. `Err`: the init ended before it reported, with the step
    /// that failed when it said which.
    pub(in crate::sandbox) fn report(&self) -> Result<HelperReport, Option<ChildError>> {
        if let Some(rep) = HelperReport::receive(self.report_r.as_raw_fd()) {
            return Ok(rep);
        }
        let mut buf = [0u8; ChildError::WIRE];
        let Some(c) = &self.cloned else {
            return Err(None);
        };
        // SAFETY: reading into a stack buffer; the init has exited or closed every pipe.
        let n = unsafe { libc::read(c.err_r.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        Err((n == buf.len() as isize)
            .then(|| ChildError::decode(&buf))
            .flatten())
    }

    /// Let the init start the command, and wait until it has exec'd (or a step failed).
    /// `check_workdir`: the command first asks whether it may write its workdir
    /// (`ExecPlan::with_workdir`, step [`Step::WorkdirWritable`]). `net`: the network
    /// namespace the init joins first (sandbox/one.rs made it meanwhile).
    pub fn go(mut self, check_workdir: bool, net: Option<RawFd>) -> Result<Spawned, SpawnError> {
        let go_w = self.go_w.take().expect("go is sent once");
        let c = self.cloned.take().expect("go is sent once");
        let b: u8 = if check_workdir { GO_CHECK } else { GO };
        let n = send_go(go_w.as_raw_fd(), b, net);
        if n != 1 {
            let e = io::Error::last_os_error();
            kill_and_reap(&c.pidfd);
            return Err(SpawnError::Clone(e));
        }
        drop(go_w);
        await_exec(c)
    }
}

impl Drop for ViewInit {
    fn drop(&mut self) {
        if let Some(c) = self.cloned.take() {
            kill_and_reap(&c.pidfd);
        }
    }
}

fn kill_and_reap(pidfd: &OwnedFd) {
    // SAFETY: a signal through our own pidfd of the child; ESRCH once it is gone is fine.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    reap(pidfd);
}

/// The go byte: start the command; start it, after its check of the workdir.
const GO: u8 = b'g';
const GO_CHECK: u8 = b'w';

/// The go channel: a unix socket pair (the go byte may carry a descriptor), close-on-exec.
fn go_channel() -> Result<(OwnedFd, OwnedFd), SpawnError> {
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two fds into our array.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    } != 0
    {
        return Err(SpawnError::Pipe(io::Error::last_os_error()));
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Room for one descriptor in a control message.
#[repr(C, align(8))]
struct OneFd([u8; 24]);

/// Send the go byte `b`, with `fd` attached when there is one. Returns what sendmsg does.
fn send_go(sock: RawFd, b: u8, fd: Option<RawFd>) -> isize {
    let mut byte = b;
    let mut iov = libc::iovec {
        iov_base: (&mut byte as *mut u8).cast(),
        iov_len: 1,
    };
    let mut cmsg = OneFd([0; 24]);
    // SAFETY: msghdr is plain data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        // SAFETY: CMSG_SPACE/CMSG_LEN of one int fit the 24 aligned bytes of `cmsg`, and
        // CMSG_FIRSTHDR of a msghdr pointing at them is that buffer.
        unsafe {
            msg.msg_control = cmsg.0.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(4) as usize;
            let h = libc::CMSG_FIRSTHDR(&msg);
            (*h).cmsg_level = libc::SOL_SOCKET;
            (*h).cmsg_type = libc::SCM_RIGHTS;
            (*h).cmsg_len = libc::CMSG_LEN(4) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(h).cast::<libc::c_int>(), fd);
        }
    }
    // SAFETY: sendmsg of a msghdr built above over our stack buffers.
    unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) }
}

/// Receive the go byte, and the descriptor with it if any (-1). Async-signal-safe.
///
/// # Safety
/// Raw syscalls on our stack only.
unsafe fn receive_go(sock: RawFd) -> Option<(u8, RawFd)> {
    let mut byte = 0u8;
    let mut iov = libc::iovec {
        iov_base: (&mut byte as *mut u8).cast(),
        iov_len: 1,
    };
    let mut cmsg = OneFd([0; 24]);
    // SAFETY: msghdr is plain data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.0.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of::<OneFd>();
    let n = loop {
        // SAFETY: recvmsg into the buffers above; descriptors arrive close-on-exec.
        let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 && errno() == libc::EINTR {
            continue;
        }
        break n;
    };
    if n != 1 {
        return None;
    }
    let mut fd = -1;
    // SAFETY: the kernel filled `msg`; CMSG_FIRSTHDR is null or points into `cmsg`.
    unsafe {
        let h = libc::CMSG_FIRSTHDR(&msg);
        if !h.is_null() && (*h).cmsg_level == libc::SOL_SOCKET && (*h).cmsg_type == libc::SCM_RIGHTS
        {
            fd = std::ptr::read_unaligned(libc::CMSG_DATA(h).cast::<libc::c_int>());
        }
    }
    Some((byte, fd))
}

/// The init's ends of its pipes, and the supervisor's pidfd.
struct Fds {
    err_w: RawFd,
    status_w: RawFd,
    report_w: RawFd,
    go_r: RawFd,
    supervisor_pidfd: RawFd,
}

/// # Safety
/// Only in the child cloned by [`clone_view_init`].
unsafe fn view_init_main(
    p: &Prepared,
    view: &ViewPlan,
    plan: &ExecPlan,
    cg: Option<&ExecCgroup>,
    fds: Fds,
    stack: &[u8],
) -> ! {
    // SAFETY: raw syscalls on prepared data throughout.
    unsafe {
        init_mark(InitMark::Start);
        init_prologue(cg, fds.supervisor_pidfd, fds.err_w);
        init_mark(InitMark::Prologue);
        // The network namespace is the supervisor's to make meanwhile (one.rs): joined below.
        let mut old_root = -1;
        let rep = in_init::build(view, &mut old_root);
        if let Some(ll) = &p.landlock {
            for (i, dir) in view.tmpfs_c_targets() {
                if rep.tmpfs_made(i)
                    && let Err(e) = ll.add_tmpfs_rule(dir)
                {
                    fail(
                        ChildError {
                            detail: i as u8,
                            ..ChildError::new(Step::LandlockTmpfsRule, e)
                        },
                        fds.err_w,
                    );
                }
            }
            for (bit, dir) in view.read_c_targets() {
                if rep.made_bit(bit)
                    && let Err(e) = ll.add_view_read_rule(dir)
                {
                    fail(ChildError::new(Step::LandlockTmpfsRule, e), fds.err_w);
                }
            }
        }
        init_mark(InitMark::Rules);
        rep.send(fds.report_w);
        libc::close(fds.report_w);
        init_mark(InitMark::Reported);
        // While the supervisor decides the layers from the report: the command inherits our
        // bounding set, so emptied here its identity step only reads each capability back
        // instead of committing new credentials once per capability (≈ 60 µs of the command's
        // start). We execute nothing, and the effective set we still need (setns below, the
        // clone) is not the bounding set.
        crate::sandbox::identity::drop_bounding_set_ahead();
        // The old root, stacked on the view's since the pivot, detached while the supervisor
        // reads the report (the unmount waits for an RCU grace period): before the go is even
        // read, so before anything of the command exists. A failure fails the exec.
        if old_root >= 0
            && let Err(e) = crate::sandbox::view_root::detach_old_root(old_root)
        {
            fail(e, fds.err_w);
        }
        let Some((b, net)) = receive_go(fds.go_r) else {
            libc::_exit(0);
        };
        if !matches!(b, GO | GO_CHECK) {
            libc::_exit(0);
        }
        libc::close(fds.go_r);
        if view.private_net() {
            if net < 0 || libc::setns(net, libc::CLONE_NEWNET) != 0 {
                fail(ChildError::last(Step::SetnsNet), fds.err_w);
            }
            libc::close(net);
        }
        init_mark(InitMark::Go);
        serve_exec(p, plan, fds.err_w, fds.status_w, stack, b == GO_CHECK)
    }
}
