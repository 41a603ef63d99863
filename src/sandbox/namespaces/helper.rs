//! The view's helper: a forked child of a multi-threaded process, so raw syscalls only, on the
//! plan its parent prepared (namespaces.rs), plus the thread that makes the network namespace.
//! Moved out of namespaces.rs (only the visibility of its entry points changed).

use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd, RawFd};

use super::plan::{Kind, ProcMount, TmpfsPlan, ViewPlan};
use super::report::{HelperReport, NOT_TRIED};
use crate::sandbox::step::{ChildError, Step};
use crate::sandbox::view_root::RootPlan;
use crate::sandbox::view_root::{self, Built};
use crate::sys::{errno, proc_fd_path as fd_path};

pub(super) fn check(rc: libc::c_int, step: Step) -> Result<(), ChildError> {
    if rc != 0 {
        Err(ChildError::last(step))
    } else {
        Ok(())
    }
}

/// # Safety
/// Only in the forked helper: never returns.
pub(super) unsafe fn helper_main(
    plan: &ViewPlan,
    report_w: RawFd,
    hold_r: RawFd,
    pid_ns: Result<(), i32>,
    private_net: bool,
) -> ! {
    let mut rep = HelperReport::new();
    // Opened while the supervisor's /proc is still ours: the view's root has none of its own.
    let maps = crate::sys::forget::open_maps();
    // SAFETY: raw syscalls on prepared data throughout.
    unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        );
        let private = (|| {
            check(libc::unshare(libc::CLONE_NEWNS), Step::UnshareMount)?;
            // Without this, our mounts (and the execs' /proc) would propagate to the host
            // when / is a shared mount, as systemd makes it.
            check(
                libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ),
                Step::MakeMountsPrivate,
            )
        })();
        // Probed before the new root is built: that root binds the supervisor's /proc only
        // when no fresh one can be mounted per exec.
        // In the initial user namespace with a root of its own, the view leaves the old root,
        // and the trial /proc with it, behind (its detach pays the RCU grace period that an
        // umount of the trial mount alone would cost, ~0.25 ms); the root then has an empty
        // /proc for each exec's own. Elsewhere the view keeps the supervisor's /proc (bound
        // into a user namespace's root, or the old root itself), so the trial goes at once.
        let keep_trial = plan.root.as_ref().is_some_and(|r| !r.in_userns());
        // The IPC namespace is made here, while a /proc is there to write its limits in: the
        // trial /proc while it is mounted (a fresh procfs, whose /proc/sys is writable even
        // where the supervisor's is mounted read-only, as in a pod), else the supervisor's.
        // (A sysctl of the IPC namespace is that of the writer's own.)
        let mut ipc = None;
        let (pid, proc) = match (private, pid_ns) {
            (_, Err(e)) => (Err(ChildError::new(Step::ClonePidNamespace, e)), 0),
            // Mounting /proc in a mount namespace whose propagation is not private would
            // reach the host's /proc: do not even try.
            (Err(e), _) => (Err(ChildError::new(Step::MountProc, e.errno)), 0),
            (Ok(()), Ok(())) => probe_proc(keep_trial, &mut || ipc = Some(make_ipc(plan))),
        };
        let (ipc_made, ipc_limits) = ipc.unwrap_or_else(|| make_ipc(plan));
        rep.set(Kind::Ipc, ipc_made);
        rep.ipc_limits = ipc_limits;
        // Whether the trial /proc is still mounted over the supervisor's.
        let mut trial_mounted = keep_trial && proc != 0;
        rep.set(Kind::Pid, pid);
        rep.proc = proc;
        let mount = private.and_then(|()| {
            rep.mnt_usable = 1;
            let tmpfs = |rep: &mut HelperReport| {
                for (i, t) in plan.tmpfs.iter().enumerate() {
                    mount_tmpfs(t)?;
                    rep.tmpfs_made |= 1 << i;
                }
                Ok(())
            };
            let Some(root) = &plan.root else {
                return tmpfs(&mut rep);
            };
            let mut targets: [(&std::ffi::CStr, &std::ffi::CStr); 2] = [(c"", c""); 2];
            let n = plan.tmpfs.len().min(2);
            for (i, t) in plan.tmpfs.iter().take(2).enumerate() {
                targets[i] = (t.c_target.as_c_str(), t.data.as_c_str());
            }
            let built = view_root::build(
                root,
                &targets[..n],
                proc != 0,
                &mut rep.tmpfs_made,
                &mut rep.idmap,
                None,
            );
            match built {
                Built::Root => {
                    rep.root = 1;
                    trial_mounted = false;
                    Ok(())
                }
                Built::Chroot => {
                    rep.root = 2;
                    trial_mounted = false;
                    Ok(())
                }
                // The old root is untouched: keep what a view without its own root had
                // (private tmpfs mounts in place), and report the failure.
                // The root's failure is the one reported (its detail names the entry); the
                // fallback's own, if any, shows in which tmpfs mounts were made.
                Built::RolledBack(e) => {
                    let _ = tmpfs(&mut rep);
                    Err(e)
                }
                Built::Broken(e) => Err(e),
            }
        });
        rep.set(Kind::Mount, mount);
        if trial_mounted && libc::umount2(c"/proc".as_ptr(), 0) != 0 {
            // The old root stays (no root of its own could be built): it must not keep the
            // trial /proc, a PID namespace that ends with this helper, over the supervisor's.
            rep.set(Kind::Pid, Err(ChildError::last(Step::UnmountProbeProc)));
            rep.proc = 0;
        }
        if rep.root != 0 && pid_ns.is_ok() && plan.root.as_ref().is_some_and(RootPlan::in_userns) {
            // In a user namespace the kernel allows a fresh /proc only while another full one
            // is visible in the mount namespace (mount_too_revealing): probe again where the
            // execs will mount theirs, over the supervisor's /proc bound there. (In the
            // initial user namespace that check does not apply: the first probe holds.)
            let (pid, proc) = probe_proc(false, &mut || {});
            rep.set(Kind::Pid, pid);
            rep.proc = proc;
        }
        rep.set(Kind::Uts, make_uts(plan));
        if private_net {
            let net = (|| {
                check(libc::unshare(libc::CLONE_NEWNET), Step::UnshareNet)?;
                loopback_up()
            })();
            rep.set(Kind::Net, net);
        }
        // From here on only this stack is read (the report is a plain struct on it): our
        // copy of the supervisor's heaps may hold its secrets (a provider reply, a rewritten
        // request), and this helper lives until the supervisor has opened the namespaces
        // (sys/forget.rs). Forgotten before the report, so the supervisor never takes the
        // namespaces of a helper that still holds them.
        crate::sys::forget::forget_supervisor_memory(Some(maps), 0);
        rep.send(report_w);
        // Hold the namespaces until the supervisor has opened them, then go.
        let mut b = 0u8;
        while libc::read(hold_r, (&mut b as *mut u8).cast(), 1) < 0 && errno() == libc::EINTR {}
        libc::_exit(0)
    }
}

/// A UTS namespace of the helper's own, with the view's hostname.
///
/// # Safety
/// Only in the forked helper.
unsafe fn make_uts(plan: &ViewPlan) -> Result<(), ChildError> {
    // SAFETY: unshare and sethostname on a prepared byte string.
    unsafe {
        check(libc::unshare(libc::CLONE_NEWUTS), Step::UnshareUts)?;
        let h = plan.hostname.as_bytes();
        check(
            libc::sethostname(h.as_ptr().cast(), h.len()),
            Step::SetHostname,
        )
    }
}

/// # Safety
/// Only in the forked helper, inside its own mount namespace.
pub(super) unsafe fn mount_tmpfs(t: &TmpfsPlan) -> Result<(), ChildError> {
    // SAFETY: raw syscalls on prepared C strings.
    unsafe {
        // Open the grants below the mount point before the tmpfs hides them.
        let mut fds = [-1; 64];
        for (i, b) in t.binds.iter().enumerate().take(fds.len()) {
            let fd = libc::open(b.path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(ChildError::last(Step::OpenGrant));
            }
            fds[i] = fd;
        }
        if t.binds.len() > fds.len() {
            return Err(ChildError::new(Step::OpenGrant, libc::E2BIG));
        }
        check(
            libc::mount(
                c"tmpfs".as_ptr(),
                t.c_target.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                t.data.as_ptr().cast(),
            ),
            Step::MountTmpfs,
        )?;
        for d in &t.dirs {
            if libc::mkdir(d.as_ptr(), 0o755) != 0 && errno() != libc::EEXIST {
                return Err(ChildError::last(Step::MakeMountpoint));
            }
        }
        let mut src = [0u8; 32];
        for (i, b) in t.binds.iter().enumerate() {
            if b.dir {
                if libc::mkdir(b.path.as_ptr(), 0o755) != 0 && errno() != libc::EEXIST {
                    return Err(ChildError::last(Step::MakeMountpoint));
                }
            } else {
                let f = libc::open(
                    b.path.as_ptr(),
                    libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                    0o644,
                );
                if f < 0 {
                    return Err(ChildError::last(Step::MakeMountpoint));
                }
                libc::close(f);
            }
            fd_path(&mut src, fds[i]);
            check(
                libc::mount(
                    src.as_ptr().cast(),
                    b.path.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ),
                Step::BindGrant,
            )?;
            libc::close(fds[i]);
            // nosuid and nodev as every grant of the view's own root gets them (view_root.rs
            // says what they cover); the source's locked flags kept, as a user namespace
            // requires of a remount.
            let ro = if b.read_only { libc::MS_RDONLY } else { 0 };
            check(
                libc::mount(
                    std::ptr::null(),
                    b.path.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND
                        | libc::MS_REMOUNT
                        | libc::MS_NOSUID
                        | libc::MS_NODEV
                        | ro
                        | b.keep_flags,
                    std::ptr::null(),
                ),
                Step::RemountGrantReadOnly,
            )?;
        }
        if !t.hides.is_empty() {
            // An empty root-owned mode-000 file to cover denied files: opening it gives
            // EACCES to a child without CAP_DAC_OVERRIDE, whatever its uid.
            let f = libc::open(
                t.hidden_src.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
                0,
            );
            if f < 0 {
                return Err(ChildError::last(Step::HideDenied));
            }
            libc::close(f);
            for (path, dir) in &t.hides {
                let rc = if *dir {
                    libc::mount(
                        c"tmpfs".as_ptr(),
                        path.as_ptr(),
                        c"tmpfs".as_ptr(),
                        libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                        c"mode=000,size=4k".as_ptr().cast(),
                    )
                } else {
                    libc::mount(
                        t.hidden_src.as_ptr(),
                        path.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND,
                        std::ptr::null(),
                    )
                };
                if rc != 0 {
                    return Err(ChildError::last(Step::HideDenied));
                }
            }
            libc::unlink(t.hidden_src.as_ptr());
        }
    }
    Ok(())
}

/// Make the view's IPC namespace and set its limits: whether it was made, and how the limits
/// went (a [`HelperReport`] pair).
///
/// # Safety
/// Only in the forked helper, before it enters the view's root (a chrooted process may not
/// make a user namespace).
unsafe fn make_ipc(plan: &ViewPlan) -> (Result<(), ChildError>, [i32; 2]) {
    // SAFETY: raw syscalls on prepared data.
    unsafe {
        let Some(maps) = &plan.ipc_userns else {
            if let Err(e) = check(libc::unshare(libc::CLONE_NEWIPC), Step::UnshareIpc) {
                return (Err(e), [NOT_TRIED, 0]);
            }
            return (Ok(()), HelperReport::encode(write_ipc_limits(plan)));
        };
        match ipc_in_own_userns(plan, maps) {
            Ok(limits) => (Ok(()), limits),
            // No user namespace of its own: still a private IPC namespace, without limits
            // (the layer says so).
            Err(e) => (
                check(libc::unshare(libc::CLONE_NEWIPC), Step::UnshareIpc),
                HelperReport::encode(Err(e)),
            ),
        }
    }
}

/// Write every IPC limit of the plan into the caller's IPC namespace.
///
/// # Safety
/// Raw syscalls only; in the helper (or its IPC child).
pub(super) unsafe fn write_ipc_limits(plan: &ViewPlan) -> Result<(), ChildError> {
    for (i, (path, value)) in plan.ipc_limits.iter().enumerate() {
        let fail = |errno| ChildError {
            detail: i as u8,
            ..ChildError::new(Step::SetIpcLimit, errno)
        };
        // SAFETY: raw syscalls on prepared C strings.
        unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(fail(errno()));
            }
            let v = value.as_bytes();
            let n = libc::write(fd, v.as_ptr().cast(), v.len());
            let e = errno();
            libc::close(fd);
            if n != v.len() as isize {
                return Err(fail(if n < 0 { e } else { libc::EIO }));
            }
        }
    }
    Ok(())
}

/// A non-root supervisor's IPC namespace, with its limits: the limits may be written only by
/// the root of the user namespace that owns the IPC namespace, and root is not mapped in the
/// supervisor's. So a child of ours makes a user namespace that maps root to our uid (as
/// `unshare -r` does), the IPC namespace in it, writes the limits, and opens the namespace in
/// our shared descriptor table (CLONE_FILES); we join it (we own that user namespace, which is
/// enough) and the child is gone. The helper itself stays in the supervisor's user namespace:
/// the view's mounts need its capabilities there. Returns the limits' [`HelperReport`] pair.
///
/// # Safety
/// Only in the forked helper (single-threaded), before it enters the view's root.
unsafe fn ipc_in_own_userns(
    plan: &ViewPlan,
    maps: &[std::ffi::CString; 2],
) -> Result<[i32; 2], ChildError> {
    // SAFETY: raw syscalls on prepared data and our own stack.
    unsafe {
        // Raw ends from here: the clone below shares our descriptor table, and each side
        // closes what it holds by hand.
        let p = match crate::sys::pipe(0) {
            Ok((r, w)) => [r.into_raw_fd(), w.into_raw_fd()],
            Err(e) => {
                let errno = e.raw_os_error().unwrap_or(libc::EIO);
                return Err(ChildError::new(Step::IpcUserNamespace, errno));
            }
        };
        // No exit signal: reaped below with __WCLONE, never seen by anyone's SIGCHLD.
        let pid = libc::syscall(
            libc::SYS_clone,
            libc::CLONE_FILES as libc::c_ulong,
            0,
            0,
            0,
            0,
        );
        if pid < 0 {
            let e = ChildError::last(Step::IpcUserNamespace);
            libc::close(p[0]);
            libc::close(p[1]);
            return Err(e);
        }
        if pid == 0 {
            let write_file = |path: &std::ffi::CStr, text: &[u8]| {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(ChildError::last(Step::IpcUserNamespace));
                }
                let n = libc::write(fd, text.as_ptr().cast(), text.len());
                let e = ChildError::last(Step::IpcUserNamespace);
                libc::close(fd);
                if n != text.len() as isize {
                    Err(e)
                } else {
                    Ok(())
                }
            };
            let r = (|| {
                check(libc::unshare(libc::CLONE_NEWUSER), Step::IpcUserNamespace)?;
                // An unprivileged writer may map only its own ids, and must give up
                // setgroups(2) before it may write the gid map.
                write_file(c"/proc/self/setgroups", b"deny")?;
                write_file(c"/proc/self/uid_map", maps[0].as_bytes())?;
                write_file(c"/proc/self/gid_map", maps[1].as_bytes())?;
                check(libc::unshare(libc::CLONE_NEWIPC), Step::UnshareIpc)?;
                let limits = HelperReport::encode(write_ipc_limits(plan));
                let fd = libc::open(
                    c"/proc/self/ns/ipc".as_ptr(),
                    libc::O_RDONLY | libc::O_CLOEXEC,
                );
                if fd < 0 {
                    return Err(ChildError::last(Step::UnshareIpc));
                }
                Ok((fd, limits))
            })();
            let msg: [i32; 4] = match r {
                Ok((fd, [s, e])) => [0, fd, s, e],
                Err(e) => {
                    let [s, en] = HelperReport::encode(Err(e));
                    [s, en, 0, 0]
                }
            };
            libc::write(p[1], msg.as_ptr().cast(), std::mem::size_of_val(&msg));
            libc::_exit(0);
        }
        let mut st = 0;
        while libc::waitpid(pid as libc::pid_t, &mut st, libc::__WCLONE) < 0
            && errno() == libc::EINTR
        {}
        let mut msg = [0i32; 4];
        let n = libc::read(p[0], msg.as_mut_ptr().cast(), std::mem::size_of_val(&msg));
        libc::close(p[0]);
        libc::close(p[1]);
        if n != std::mem::size_of_val(&msg) as isize {
            return Err(ChildError::new(Step::IpcUserNamespace, libc::EIO));
        }
        if msg[0] != 0 {
            return Err(HelperReport::decode([msg[0], msg[1]])
                .unwrap_or(ChildError::new(Step::IpcUserNamespace, libc::EIO)));
        }
        let fd = msg[1];
        let joined = check(libc::setns(fd, libc::CLONE_NEWIPC), Step::UnshareIpc);
        libc::close(fd);
        joined?;
        Ok([msg[2], msg[3]])
    }
}

/// On a thread of the supervisor: a network namespace whose only interface is `lo`, up, held
/// by the descriptor returned. The thread ends in it and takes nothing else there.
pub(super) fn make_net_ns() -> Result<OwnedFd, ChildError> {
    // SAFETY: unshare with a flag (this thread's namespaces only), then raw syscalls.
    unsafe {
        check(libc::unshare(libc::CLONE_NEWNET), Step::UnshareNet)?;
        loopback_up()?;
        let fd = libc::open(
            c"/proc/thread-self/ns/net".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return Err(ChildError::last(Step::UnshareNet));
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// # Safety
/// Raw syscalls only; in the helper or a thread, inside its new network namespace.
pub(super) unsafe fn loopback_up() -> Result<(), ChildError> {
    // SAFETY: an ioctl on a socket we own with a zeroed ifreq on our stack.
    unsafe {
        let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if s < 0 {
            return Err(ChildError::last(Step::LoopbackUp));
        }
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo".iter().enumerate() {
            ifr.ifr_name[i] = *b as libc::c_char;
        }
        let r = (|| {
            if libc::ioctl(s, libc::SIOCGIFFLAGS, &mut ifr) != 0 {
                return Err(ChildError::last(Step::LoopbackUp));
            }
            ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            if libc::ioctl(s, libc::SIOCSIFFLAGS, &ifr) != 0 {
                return Err(ChildError::last(Step::LoopbackUp));
            }
            Ok(())
        })();
        libc::close(s);
        r
    }
}

/// Try the per-exec /proc once, where the helper stands (it is PID 1 of a PID namespace of
/// its own, in the view's mount namespace): full first, then `subset=pid`. `mounted` runs
/// while the trial /proc is mounted. Unless `keep`, the trial mount is unmounted again, so the
/// view keeps what it had at /proc. Returns the outcome and the /proc mode (0 none, 1 full,
/// 2 subset=pid).
///
/// # Safety
/// In the helper only.
unsafe fn probe_proc(keep: bool, mounted: &mut dyn FnMut()) -> (Result<(), ChildError>, i32) {
    // The full trial /proc is mounted writable for the IPC limits (`mounted` writes them in
    // its /proc/sys, which a read-only mount refuses with EROFS), and made read-only before
    // anything else can see it.
    let mode = if mount_proc_flags(ProcMount::Full, 0) == 0 {
        1
    } else {
        let first = errno();
        if mount_proc(ProcMount::SubsetPid) != 0 {
            return (Err(ChildError::new(Step::MountProc, first)), 0);
        }
        2
    };
    // subset=pid has no /proc/sys: the limits are then written through the old /proc.
    if mode == 1 {
        mounted();
        // SAFETY: static C string; a bind remount changes only this mount's flags.
        let rc = unsafe {
            libc::mount(
                std::ptr::null(),
                c"/proc".as_ptr(),
                std::ptr::null(),
                libc::MS_REMOUNT | libc::MS_BIND | PROC_FLAGS,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return (Err(ChildError::last(Step::MountProc)), 0);
        }
    }
    // SAFETY: a static C string. Not MNT_DETACH: nothing holds the trial mount, and a plain
    // umount that fails says so here rather than leaving it under the execs' /proc.
    if !keep && unsafe { libc::umount2(c"/proc".as_ptr(), 0) } != 0 {
        return (Err(ChildError::last(Step::UnmountProbeProc)), 0);
    }
    (Ok(()), mode)
}

/// Mount a fresh /proc for the caller's PID namespace, read-only. Returns 0 or -1 (errno set).
/// Async-signal-safe.
///
/// Read-only because procfs keeps a chmod of a kernel-wide entry (/proc/kpageflags) in the
/// entry itself, for every later procfs on the machine, and `--uid 0` owns those entries: a
/// chmod or utimes is EROFS. It also keeps the command from raising its coredump_filter (see
/// rlimits.rs). Writes through /proc/self/fd/N reopen the file on its own mount and still
/// work; writes to /proc files themselves (oom_score_adj, another thread's comm) are EROFS.
pub fn mount_proc(mode: ProcMount) -> libc::c_int {
    mount_proc_flags(mode, libc::MS_RDONLY)
}

/// The flags of every /proc of ours but the trial one while the IPC limits are written.
pub(super) const PROC_FLAGS: libc::c_ulong =
    libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;

pub(super) fn mount_proc_flags(mode: ProcMount, rdonly: libc::c_ulong) -> libc::c_int {
    let data: *const libc::c_void = match mode {
        ProcMount::SubsetPid => c"subset=pid".as_ptr().cast(),
        _ => std::ptr::null(),
    };
    // SAFETY: static C strings.
    unsafe {
        libc::mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            (PROC_FLAGS & !libc::MS_RDONLY) | rdonly,
            data,
        )
    }
}
