//! Namespace layer: the sandbox view.
//!
//! A view is a set of namespaces plus the private mounts in them, made once per [`Prepared`]
//! (so once per `run`, once per `serve` sandbox) by a short-lived helper child (PID 1 of a
//! PID namespace of its own, so that it can try the execs' fresh /proc itself) and, for the
//! network namespace, a thread of the supervisor working beside it; kept alive afterwards only
//! by nsfs descriptors opened from the helper's `/proc/PID/ns/*` and the thread's:
//! - mount: every mount private (nothing we mount propagates back to the host), and a root of
//!   its own that holds only the granted paths (view_root.rs: paths outside the grants do not
//!   exist, which closes what Landlock ABI < 9 leaves open: pathname unix sockets, stat,
//!   inotify), with a fresh tmpfs on /tmp and on /dev/shm (mode 1777, sized by `--tmp-size` /
//!   `--shm-size`; a write past the size gets ENOSPC). Granted paths below those mount points
//!   are bind-mounted into them at the same path (read-only grants read-only), and denied
//!   paths inside a grant are covered by an empty mode-000 mount, because the Landlock rule
//!   that makes the new tmpfs writable covers every mount below it (see SECURITY.md). When
//!   the new root cannot be built, the tmpfs mounts are made in place on the supervisor's
//!   root, and the mount layer is reported degraded;
//! - IPC: private SysV IPC and POSIX message queues, destroyed with the view, with limits from
//!   the `--shm-size` budget (`policy::IpcLimits`) written into its `/proc/sys/kernel`: a
//!   new IPC namespace starts with the kernel's defaults, which bound nothing, and in serve
//!   mode what one exec leaves there stays for the sandbox's life. A non-root supervisor may
//!   not write them (they belong to the root of the IPC namespace's user namespace, unmapped
//!   in ours), so its IPC namespace is made in a user namespace of its own that maps root to
//!   our uid;
//! - UTS: hostname `--hostname` (default `sandbox`);
//! - network (`--network none` only): a namespace whose only interface is `lo`, up.
//!
//! Every exec then gets, in its forked child (see `sandbox/init.rs`): its own PID namespace,
//! whose PID 1 is our init, the view's namespaces by setns, and a child mount namespace with a
//! fresh /proc for its PID namespace. The tmpfs mounts are the view's, so in serve mode the
//! execs of one sandbox share /tmp, /dev/shm, IPC and loopback, as the processes of one
//! container do.
//!
//! A supervisor that is not root first enters a user namespace of its own ([`enter_user_ns`],
//! called by `main` while the process is still single-threaded, which unshare(CLONE_NEWUSER)
//! requires). Its uid and gid map to themselves, so files and the child's identity are
//! unchanged, but it gains the capabilities it needs over the namespaces it then creates.
//! Inside a non-initial user namespace the kernel refuses a full /proc when the visible /proc
//! has masked paths (mount_too_revealing); `subset=pid` (Linux >= 5.8) is then used.
//!
//! What cannot be made is found by trying, kind by kind, in the helper (an AppArmor `deny
//! mount` answers EACCES, a missing user namespace EPERM, ...) and becomes a degraded layer:
//! refused unless `--allow-degraded`, like every other layer.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::sandbox::step::{ChildError, Step};
use crate::sandbox::view_root::RootPlan;
use crate::sys::errno;

/// The supervisor's own user namespace, decided once at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserNs {
    /// Root in its namespace: no user namespace is needed.
    Root,
    /// Not root; entered a user namespace of its own that maps our uid and gid to themselves.
    Entered,
    /// Not root and no user namespace is allowed (the errno of unshare or of the map write).
    Unavailable(ChildError),
    /// [`enter_user_ns`] was not called (a library user, a test): treated like Unavailable.
    NotTried,
}

static USER_NS: OnceLock<UserNs> = OnceLock::new();

static GROUPS_BEFORE: OnceLock<Vec<libc::gid_t>> = OnceLock::new();

/// The supplementary groups the process held before [`enter_user_ns`] (the same groups, but
/// readable: inside, unmapped groups all read as the overflow gid).
pub fn groups_before_user_ns() -> Option<Vec<libc::gid_t>> {
    GROUPS_BEFORE.get().cloned()
}

/// The outcome of [`enter_user_ns`] (or `NotTried`).
pub fn user_ns() -> UserNs {
    USER_NS.get().copied().unwrap_or_else(|| {
        if crate::sys::process::euid() == 0 {
            UserNs::Root
        } else {
            UserNs::NotTried
        }
    })
}

/// For a supervisor that is not root: enter a user namespace of our own, mapping our uid and
/// gid to themselves. Must be called while the process is single-threaded (the kernel answers
/// EINVAL otherwise). Idempotent; the outcome is recorded for [`user_ns`].
pub fn enter_user_ns() -> UserNs {
    *USER_NS.get_or_init(|| {
        let (uid, gid) = (crate::sys::process::euid(), crate::sys::process::egid());
        if uid == 0 {
            return UserNs::Root;
        }
        // In the namespace, groups that are not mapped read as the overflow gid: keep the
        // real ones for the identity layer's check and message.
        let _ = GROUPS_BEFORE.set(crate::sys::process::groups());
        // SAFETY: unshare with a flag; it changes only this (single-threaded) process.
        if unsafe { libc::unshare(libc::CLONE_NEWUSER) } != 0 {
            return UserNs::Unavailable(ChildError::last(Step::UnshareUser));
        }
        // An unprivileged writer may map only its own ids, and must give up setgroups(2)
        // before it may write the gid map.
        let maps = [
            ("/proc/self/setgroups", "deny".to_string()),
            ("/proc/self/uid_map", format!("{uid} {uid} 1")),
            ("/proc/self/gid_map", format!("{gid} {gid} 1")),
        ];
        for (path, text) in maps {
            if let Err(e) = std::fs::write(path, text) {
                return UserNs::Unavailable(ChildError::new(
                    Step::WriteIdMap,
                    e.raw_os_error().unwrap_or(libc::EIO),
                ));
            }
        }
        UserNs::Entered
    })
}

pub use super::grant::{Grant, Idmap};

/// A built view: the namespaces, held by descriptor.
#[derive(Debug, Default)]
pub struct View {
    pub mnt: Option<OwnedFd>,
    pub ipc: Option<OwnedFd>,
    pub uts: Option<OwnedFd>,
    pub net: Option<OwnedFd>,
    /// Each exec gets a PID namespace of its own.
    pub pid: bool,
    pub proc: ProcMount,
    /// The mount namespace's root holds only the granted paths (see view_root.rs).
    pub root: bool,
    /// That root, when it was entered with chroot rather than pivot_root: every process that
    /// joins the mount namespace must chroot into it.
    pub chroot: Option<OwnedFd>,
    /// The private tmpfs mount points that were made, with an O_PATH descriptor of each root
    /// (for the Landlock rule that makes it writable; dropped after prepare). No descriptor
    /// where the exec's init made the view and added that rule itself (`run`).
    pub tmpfs: Vec<(PathBuf, Option<OwnedFd>)>,
    /// Only one exec will ever join this view (`run`): it mounts its /proc in the view's mount
    /// namespace itself instead of in a child mount namespace of its own, which would copy the
    /// view's mount tree and tear it down again for nobody else's sake.
    pub one_exec: std::sync::atomic::AtomicBool,
    /// Per idmapped bind of the root's plan (`RootPlan::idmap_slot`): 0 idmapped, an errno
    /// where the kernel refused (the bind was made without the mapping), -1 never bound.
    pub idmap: Vec<i32>,
    /// The directory of the view's own files, when the root holds it, with an O_PATH
    /// descriptor of its tmpfs (for its Landlock read rule; dropped after prepare). No
    /// descriptor where the exec's init made the view and added that rule itself (`run`).
    pub files: Option<(PathBuf, Option<OwnedFd>)>,
    /// The bind overlaid to give the files' directory a mount point the host lacks
    /// (`RootPlan::overlay_dir`), with an O_PATH descriptor of the overlay's root (for the
    /// grant's Landlock rule given again there: the overlay's inodes are its own; dropped
    /// after prepare; none where the exec's init added that rule itself).
    pub overlay: Option<(PathBuf, Option<OwnedFd>)>,
    /// The user namespaces those binds were idmapped with (idmap.rs), held as long as the
    /// view.
    pub idmap_userns: Vec<super::idmap::UserNs>,
}

/// What the helper reports, per kind and overall.
#[derive(Debug)]
pub struct ViewMade {
    pub outcomes: [Outcome; 6],
    pub view: View,
    /// Why the IPC namespace's limits could not be set, when it was made but they were not.
    pub ipc_limits: Option<ChildError>,
}

impl ViewMade {
    pub fn outcome(&self, k: Kind) -> Outcome {
        self.outcomes[k.index()]
    }
}

/// The raw descriptors an exec's init joins, valid while the [`View`] lives.
#[derive(Debug, Clone, Copy)]
pub struct ExecView {
    pub mnt: RawFd,
    /// The view's root to chroot into after joining `mnt` (-1: the namespace's root is it).
    pub root: RawFd,
    pub ipc: RawFd,
    pub uts: RawFd,
    pub net: RawFd,
    pub pid: bool,
    pub proc: ProcMount,
    /// The exec's /proc goes in a child mount namespace of its own (the view is shared).
    pub own_mnt: bool,
}

impl View {
    pub fn exec_view(&self) -> ExecView {
        let raw = |f: &Option<OwnedFd>| f.as_ref().map_or(-1, |f| f.as_raw_fd());
        ExecView {
            mnt: raw(&self.mnt),
            root: raw(&self.chroot),
            ipc: raw(&self.ipc),
            uts: raw(&self.uts),
            net: raw(&self.net),
            pid: self.pid,
            // A fresh /proc only inside the view's private mount namespace: in a shared one
            // the mount would propagate back to the host's /proc.
            proc: if self.mnt.is_some() {
                self.proc
            } else {
                ProcMount::None
            },
            own_mnt: !self.one_exec.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Whether /tmp is this view's private tmpfs (made only in its private mount namespace).
    pub fn private_tmp(&self) -> bool {
        self.tmpfs.iter().any(|(p, _)| p == Path::new("/tmp"))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error("creating a pipe for the view helper: {0}")]
    Pipe(io::Error),
    #[error("forking the view helper: {0}")]
    Fork(io::Error),
    #[error("the view helper died before reporting")]
    HelperDied,
    #[error("opening {what} of the view helper: {source}")]
    Open {
        what: &'static str,
        source: io::Error,
    },
}

fn pipe() -> Result<(OwnedFd, OwnedFd), ViewError> {
    crate::sys::pipe(0).map_err(ViewError::Pipe)
}

/// Build the view in a helper child and keep its namespaces by descriptor.
///
/// The helper is cloned with no exit signal, so the process manager's `waitid(P_ALL)` (which
/// only sees children that signal SIGCHLD) never reaps it; we reap it here with __WCLONE.
pub fn make_view(plan: &ViewPlan) -> Result<ViewMade, ViewError> {
    // Test builds only: `OSB_TEST_DENY_PIDNS=1` makes the PID namespace unavailable, as a
    // kernel or runtime that refuses it would (the helper then builds the view as for that
    // case: the supervisor's /proc in the view's root), so the race tests can reach the
    // degraded kill sweep. Read here, before the fork.
    #[cfg(feature = "test-pause-points")]
    let deny_pid = std::env::var_os("OSB_TEST_DENY_PIDNS").is_some_and(|v| v == "1");
    #[cfg(not(feature = "test-pause-points"))]
    let deny_pid = false;
    // The network namespace (~0.5 ms of the kernel's setup) is made on a thread of ours while
    // the helper builds the rest, on the other core: unshare(CLONE_NEWNET) changes only the
    // calling thread's namespaces, and the descriptor of its new namespace holds it once the
    // thread is gone. Only if no thread can be started does the helper make it itself.
    let net_thread = if plan.private_net {
        std::thread::Builder::new()
            .name("view-net".into())
            .spawn(make_net_ns)
            .ok()
    } else {
        None
    };
    let net_in_helper = plan.private_net && net_thread.is_none();
    let (rep_r, rep_w) = pipe()?;
    let (hold_r, hold_w) = pipe()?;
    // The helper is PID 1 of a PID namespace of its own: a fresh /proc is always that of the
    // mounter's PID namespace, so the helper can try the execs' /proc mount itself, where it
    // builds the view, instead of forking a probe child into a new PID namespace (which cost a
    // second fork, a second copy of the mount tree and its teardown: ~0.4 ms of every view).
    // The namespace holds nothing else and ends with the helper. Where the kernel refuses a
    // new PID namespace, the helper is a plain fork and the PID kind is reported failed.
    let clone = |flags: libc::c_int| {
        // SAFETY: a raw clone without CLONE_VM is a fork; the child runs only `helper_main`,
        // which makes raw syscalls on `plan`, prepared before, and never returns.
        unsafe { libc::syscall(libc::SYS_clone, flags as libc::c_ulong, 0, 0, 0, 0) }
    };
    let (mut pid, mut pid_ns) = (-1, Err(libc::EPERM));
    if !deny_pid {
        pid = clone(libc::CLONE_NEWPID);
        pid_ns = if pid < 0 { Err(errno()) } else { Ok(()) };
    }
    if pid < 0 {
        pid = clone(0);
    }
    if pid < 0 {
        return Err(ViewError::Fork(io::Error::last_os_error()));
    }
    if pid == 0 {
        // Our copies of the parent's ends would keep the hold pipe from ever reaching EOF.
        // SAFETY: closing descriptors in the forked child; they are not used here again.
        unsafe {
            libc::close(hold_w.as_raw_fd());
            libc::close(rep_r.as_raw_fd());
        }
        // SAFETY: we are the forked, single-threaded helper.
        unsafe {
            helper_main(
                plan,
                rep_w.as_raw_fd(),
                hold_r.as_raw_fd(),
                pid_ns,
                net_in_helper,
            )
        }
    }
    let pid = pid as libc::pid_t;
    drop(rep_w);
    drop(hold_r);
    let finish = |hold_w: OwnedFd| {
        drop(hold_w);
        let mut st = 0;
        // SAFETY: reaping our own clone child; __WCLONE because it has no exit signal.
        unsafe { libc::waitpid(pid, &mut st, libc::__WCLONE) };
    };
    let Some(rep) = HelperReport::receive(rep_r.as_raw_fd()) else {
        finish(hold_w);
        return Err(ViewError::HelperDied);
    };
    // Tests hold the supervisor here, while the helper has reported and waits to go.
    crate::pause::point("view-reported");
    let net = net_thread.map(|t| {
        t.join()
            .unwrap_or_else(|_| Err(ChildError::new(Step::UnshareNet, libc::EIO)))
    });
    let mut outcomes = rep.outcomes();
    let ipc_limits = rep.ipc_limits_error();
    let mut net_fd = None;
    match net {
        Some(Ok(fd)) => {
            outcomes[Kind::Net.index()] = Outcome::Made;
            net_fd = Some(fd);
        }
        Some(Err(e)) => outcomes[Kind::Net.index()] = Outcome::Failed(e),
        None => {}
    }
    let result = take_view(plan, pid, &rep, &outcomes, net_fd);
    finish(hold_w);
    Ok(ViewMade {
        outcomes,
        view: result?,
        ipc_limits,
    })
}

/// The view the helper `pid` reported made, opened by descriptor through its /proc entries
/// while it holds them (its namespaces, the private tmpfs roots, the view's own files and
/// overlay, the chroot); the network namespace made on our own thread, if any, is `net_fd`.
fn take_view(
    plan: &ViewPlan,
    pid: libc::pid_t,
    rep: &HelperReport,
    outcomes: &[Outcome],
    net_fd: Option<OwnedFd>,
) -> Result<View, ViewError> {
    let mut view = View::default();
    let ns = |name: &'static str| open(name, format!("/proc/{pid}/ns/{name}"), libc::O_RDONLY);
    let made = |k: Kind| outcomes[k.index()] == Outcome::Made;
    if rep.mnt_usable != 0 {
        view.mnt = Some(ns("mnt")?);
        for (i, t) in plan.tmpfs.iter().enumerate() {
            if rep.tmpfs_made & (1 << i) != 0 {
                let root = open(
                    "a private tmpfs root",
                    format!("/proc/{pid}/root{}", t.target.display()),
                    libc::O_PATH | libc::O_DIRECTORY,
                )?;
                view.tmpfs.push((t.target.clone(), Some(root)));
            }
        }
    }
    if let Some(dir) = plan.root.as_ref().and_then(RootPlan::files_dir)
        && rep.tmpfs_made & crate::sandbox::view_root::FILES_MADE != 0
        && rep.root != 0
    {
        let fd = open(
            "the view's own files",
            format!("/proc/{pid}/root{dir}"),
            libc::O_PATH | libc::O_DIRECTORY,
        )?;
        view.files = Some((PathBuf::from(dir), Some(fd)));
    }
    if let Some(dir) = plan.root.as_ref().and_then(RootPlan::overlay_dir)
        && rep.tmpfs_made & crate::sandbox::view_root::OVERLAY_MADE != 0
        && rep.root != 0
    {
        let fd = open(
            "the overlay of the view's files' parent",
            format!("/proc/{pid}/root{dir}"),
            libc::O_PATH | libc::O_DIRECTORY,
        )?;
        view.overlay = Some((PathBuf::from(dir), Some(fd)));
    }
    if made(Kind::Ipc) {
        view.ipc = Some(ns("ipc")?);
    }
    if made(Kind::Uts) {
        view.uts = Some(ns("uts")?);
    }
    if net_fd.is_some() {
        view.net = net_fd;
    } else if made(Kind::Net) {
        view.net = Some(ns("net")?);
    }
    view.pid = rep.kinds[Kind::Pid.index()][0] == 0
        || rep.kinds[Kind::Pid.index()][0] == i32::from(Step::MountProc as u8);
    view.root = rep.root != 0;
    if rep.root == 2 {
        view.chroot = Some(open(
            "the view's root",
            format!("/proc/{pid}/root"),
            libc::O_PATH | libc::O_DIRECTORY,
        )?);
    }
    view.proc = match rep.proc {
        1 => ProcMount::Full,
        2 => ProcMount::SubsetPid,
        _ => ProcMount::None,
    };
    let slots = plan.root.as_ref().map_or(0, RootPlan::idmap_slots);
    view.idmap = rep.idmap[..slots].to_vec();
    Ok(view)
}

/// Open `path` (under the builder's /proc/PID) with `flags`, close-on-exec.
fn open(what: &'static str, path: String, flags: i32) -> Result<OwnedFd, ViewError> {
    let c = CString::new(path).unwrap_or_default();
    // SAFETY: valid C string; the fd is ours.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(ViewError::Open {
            what,
            source: io::Error::last_os_error(),
        });
    }
    // SAFETY: just opened, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The view that `run`'s exec init `init` made itself (namespaces/in_init.rs), from its
/// report and the network namespace the supervisor made meanwhile ([`net_ns_here`]; `None`:
/// not asked for). Nothing to join; the Landlock rules of the tmpfs roots are the init's. The
/// view's mount namespace is torn down beside the supervisor's end of the run
/// ([`tear_down_beside`]).
pub(in crate::sandbox) fn view_of_init(
    rep: &HelperReport,
    plan: &ViewPlan,
    net: Option<Result<OwnedFd, ChildError>>,
    init: libc::pid_t,
) -> ViewMade {
    tear_down_beside(init);
    let mut outcomes = rep.outcomes();
    match &net {
        Some(Ok(_)) => outcomes[Kind::Net.index()] = Outcome::Made,
        Some(Err(e)) => outcomes[Kind::Net.index()] = Outcome::Failed(*e),
        None => {}
    }
    let made = |k: Kind| outcomes[k.index()] == Outcome::Made;
    let mut view = View {
        tmpfs: plan
            .tmpfs
            .iter()
            .enumerate()
            .filter(|(i, _)| rep.tmpfs_made & (1 << i) != 0)
            .map(|(_, t)| (t.target.clone(), None))
            .collect(),
        pid: made(Kind::Pid),
        proc: if rep.proc == 1 {
            ProcMount::Full
        } else {
            ProcMount::None
        },
        root: rep.root != 0,
        one_exec: true.into(),
        idmap: rep.idmap[..plan.root.as_ref().map_or(0, RootPlan::idmap_slots)].to_vec(),
        ..View::default()
    };
    view.net = net.and_then(Result::ok);
    // The init added their Landlock rules itself (child/view_init.rs).
    if let Some(root) = plan.root.as_ref().filter(|_| rep.root != 0) {
        let made = |bit: i32, dir: Option<String>| {
            dir.filter(|_| rep.tmpfs_made & bit != 0)
                .map(|d| (PathBuf::from(d), None))
        };
        view.files = made(crate::sandbox::view_root::FILES_MADE, root.files_dir());
        view.overlay = made(crate::sandbox::view_root::OVERLAY_MADE, root.overlay_dir());
    }
    ViewMade {
        outcomes,
        view,
        ipc_limits: rep.ipc_limits_error(),
    }
}

/// Hold the mount namespace of `run`'s exec init `pid` (alive, and our unreaped child, so the
/// pid is its own) until the init has exited, then close it on a thread of its own.
///
/// The last holder of a mount namespace pays its teardown: every mount of the view unmounted,
/// and namespace_unlock's wait for an RCU grace period. The init, as that holder, paid it in
/// its exit, before it became a zombie, so before the supervisor could reap it and go on to
/// its report; held here, the teardown runs on the other core beside that end of the run (the
/// process still waits for the thread when it exits). Best effort: without the descriptor or
/// the thread, the init's exit pays it as before.
fn tear_down_beside(pid: libc::pid_t) {
    let Ok(mnt) = open(
        "the exec's mount namespace",
        format!("/proc/{pid}/ns/mnt"),
        libc::O_RDONLY,
    ) else {
        return;
    };
    let Ok(pidfd) = crate::sys::process::pidfd_open(pid) else {
        return;
    };
    let _ = std::thread::Builder::new()
        .name("view-teardown".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            let mut pfd = libc::pollfd {
                fd: pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // A pidfd reads ready once its process has exited.
            // SAFETY: poll on one pollfd on our stack.
            while unsafe { libc::poll(&mut pfd, 1, -1) } < 0 && errno() == libc::EINTR {}
            drop(mnt);
        });
}

/// `run`'s network namespace, made by the calling thread while the exec's init builds the
/// rest of the view on the other core: a namespace whose only interface is `lo`, up, held by
/// the descriptor returned (the init joins it once told to go). The thread is back in its own
/// network namespace when this returns; `Err(None)` when it could not get back (it must not
/// go on: every connection of ours would be made from the sandbox's namespace).
pub(in crate::sandbox) fn net_ns_here() -> Result<Result<OwnedFd, ChildError>, ()> {
    let own = open(
        "the supervisor's network namespace",
        "/proc/thread-self/ns/net".into(),
        libc::O_RDONLY,
    );
    let Ok(own) = own else {
        return Ok(Err(ChildError::last(Step::UnshareNet)));
    };
    let made = make_net_ns();
    // SAFETY: setns with a descriptor of our own network namespace, opened above; it changes
    // only the calling thread.
    if unsafe { libc::setns(own.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(());
    }
    Ok(made)
}

mod helper;
pub(super) mod in_init;
mod plan;
mod report;
pub use helper::mount_proc;
use helper::{helper_main, make_net_ns};
pub use plan::{Kind, Outcome, ProcMount, ViewPlan, ViewRequest};
pub(in crate::sandbox) use report::HelperReport;

#[cfg(test)]
mod tests;
