//! The process manager: one long-lived thread that owns fork, reaping, tree kill and cgroup
//! teardown. The async code talks to it over a channel and awaits oneshot replies, so no tokio
//! worker ever forks, waits for an exec, sleeps in a kill sweep or retries an rmdir.
//!
//! Why one dedicated thread, and not `spawn_blocking`: the kernel sends the parent-death signal
//! when the *thread* that forked a child exits, and pool threads exit when idle. This thread
//! never exits.
//!
//! Every child it starts is held by a pidfd (CLONE_PIDFD): the manager polls the pidfds to learn
//! of exits, and the [`super::Child`] signals through its own duplicate, so no signal can reach
//! a recycled pid. The supervisor is also a child subreaper: orphans re-parented to it (only
//! without a PID namespace, where they are not re-parented to the exec's init) are reaped here
//! too, on a 100 ms tick once such an exec has run.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::reaper::{Reaped, Registry};
use crate::sandbox::cgroup::ExecCgroup;
use crate::sandbox::child::timeline::{self, Mark};
use crate::sandbox::child::view_init::ViewInit;
use crate::sandbox::init::{ExecPlan, SpawnError, Spawned, fork_exec};
use crate::sys::process::ReapAll;

/// What the async side gets back for a started exec.
pub struct Started {
    pub pid: libc::pid_t,
    /// A duplicate of the manager's pidfd, for signals.
    pub pidfd: OwnedFd,
    /// `pid` is the exec's init (PID 1 of its own PID namespace).
    pub init: bool,
    pub exit: oneshot::Receiver<Reaped>,
    pub cgroup: Option<Arc<ExecCgroup>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error("creating the exec's cgroup: {0}")]
    Cgroup(crate::sandbox::cgroup::CgroupError),
    #[error("the process manager thread is gone")]
    Gone,
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: io::Error,
    },
}

enum Job {
    Spawn {
        sandbox: Arc<super::inner::Inner>,
        plan: ExecPlan,
        reply: oneshot::Sender<Result<Started, ManagerError>>,
    },
    /// `run`'s init that made its own view (one.rs), cloned already: told to go here, so that
    /// it is registered before this thread's reaping could see it exit.
    Go {
        sandbox: Arc<super::inner::Inner>,
        init: ViewInit,
        plan: ExecPlan,
        cgroup: Option<Arc<ExecCgroup>>,
        /// The command first checks it may write its workdir (`ViewInit::go`).
        check_workdir: bool,
        reply: oneshot::Sender<Result<Started, ManagerError>>,
    },
    /// An exec started on another thread ([`Manager::adopt`]): held here from now on.
    Adopt { pid: libc::pid_t, entry: Entry },
    /// The bench's baseline: a plain `std::process::Command`, spawned and reaped here too.
    Plain {
        cmd: Box<std::process::Command>,
        reply: oneshot::Sender<io::Result<oneshot::Receiver<Reaped>>>,
    },
    /// Kill an exec without a PID namespace (degraded): the /proc and cgroup sweep of
    /// `tree.rs`, which sleeps between rounds.
    Sweep {
        leader: libc::pid_t,
        cgroup: Option<Arc<ExecCgroup>>,
        supervisor: libc::pid_t,
        leader_alive: bool,
        reply: Option<oneshot::Sender<Result<Vec<i32>, super::SweepError>>>,
    },
    /// Remove the exec's cgroup once `pid` is reaped (at once if it already is).
    Release {
        pid: libc::pid_t,
        cgroup: Arc<ExecCgroup>,
    },
}

struct Entry {
    tx: oneshot::Sender<Reaped>,
    pidfd: OwnedFd,
    status: Option<OwnedFd>,
    release: Vec<Arc<ExecCgroup>>,
    /// The exec's own mount namespace, held open (see [`Teardown`]).
    mnt: Option<OwnedFd>,
}

/// Tearing down a mount namespace waits for an RCU grace period (namespace_unlock's
/// synchronize_rcu_expedited), milliseconds on a busy node, and the last process to leave it
/// pays that in its exit path, before it becomes a zombie. So the manager holds each exec's
/// mount namespace by descriptor, and this thread closes it after the exec is reaped: the
/// teardown still happens, but off both the exit and the spawn path.
///
/// Owned by the manager thread, which alone reaps execs; the closing thread is started on the
/// first namespace to close.
#[derive(Default)]
struct Teardown(Option<mpsc::Sender<OwnedFd>>);

impl Teardown {
    fn drop_later(&mut self, fd: OwnedFd) {
        let tx = self.0.get_or_insert_with(|| {
            let (tx, rx) = mpsc::channel::<OwnedFd>();
            std::thread::Builder::new()
                .name("namespace-teardown".into())
                .spawn(move || {
                    for fd in rx {
                        drop(fd);
                    }
                })
                .expect("spawning the namespace-teardown thread");
            tx
        });
        let _ = tx.send(fd);
    }
}

/// The process manager: one per process (see [`super::Supervisor`], which holds it), started
/// by [`Manager::start`].
pub struct Manager {
    tx: Mutex<mpsc::Sender<Job>>,
    /// Shared with the manager thread, which polls it for as long as it runs (for ever).
    wake: Arc<OwnedFd>,
    /// The running execs' main processes, shared with the manager thread (which registers
    /// and reaps them) and read by the async side's signal sweeps.
    registry: Arc<Registry>,
}

impl Manager {
    /// Start the manager thread, with the proof that the process's one right to reap every
    /// child is its caller's (the thread reaps orphans with `waitid(P_ALL)`). `supervisor` is
    /// the supervisor's own pidfd, inherited by every init it forks, kept open by the thread.
    pub(super) fn start(_reap_all: &ReapAll, supervisor: Option<Arc<OwnedFd>>) -> Manager {
        timeline::init_from_env();
        let (tx, rx) = mpsc::channel();
        // SAFETY: eventfd with flags; the fd is ours.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        assert!(wake >= 0, "eventfd: {}", io::Error::last_os_error());
        // SAFETY: just created, owned by nobody else.
        let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(wake) });
        let thread_wake = wake.clone();
        let registry = Arc::new(Registry::default());
        let thread_registry = registry.clone();
        std::thread::Builder::new()
            .name("process-manager".into())
            .spawn(move || {
                let sup = supervisor.as_ref().map_or(-1, |f| f.as_raw_fd());
                run(rx, thread_wake.as_raw_fd(), &thread_registry, sup)
            })
            .expect("spawning the process-manager thread");
        Manager {
            tx: Mutex::new(tx),
            wake,
            registry,
        }
    }

    fn send(&self, job: Job) -> Result<(), ManagerError> {
        self.tx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(job)
            .map_err(|_| ManagerError::Gone)?;
        self.nudge();
        Ok(())
    }

    /// Wake the manager thread (after an orphan may have appeared, or a job was queued).
    pub fn nudge(&self) {
        wake_up(self.wake.as_raw_fd());
    }

    /// The running execs' main processes (what a degraded sweep must not take for orphans).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub(super) async fn spawn(
        &self,
        sandbox: Arc<super::inner::Inner>,
        plan: ExecPlan,
    ) -> Result<Started, ManagerError> {
        let (reply, rx) = oneshot::channel();
        self.send(Job::Spawn {
            sandbox,
            plan,
            reply,
        })?;
        rx.await.map_err(|_| ManagerError::Gone)?
    }

    pub(super) async fn go(
        &self,
        sandbox: Arc<super::inner::Inner>,
        init: ViewInit,
        plan: ExecPlan,
        cgroup: Option<Arc<ExecCgroup>>,
        check_workdir: bool,
    ) -> Result<Started, ManagerError> {
        let (reply, rx) = oneshot::channel();
        self.send(Job::Go {
            sandbox,
            init,
            plan,
            cgroup,
            check_workdir,
            reply,
        })?;
        rx.await.map_err(|_| ManagerError::Gone)?
    }

    /// Hold an exec that was started on the calling thread (`run`'s init, told to go there):
    /// reaped here like the others. Only where the manager was not running when that exec
    /// was cloned ([`super::Supervisor::manager_running`]): this thread's first round takes the job before it reaps
    /// anything, so the exec cannot be reaped as an orphan first.
    pub(super) fn adopt(
        &self,
        s: Spawned,
        cgroup: Option<Arc<ExecCgroup>>,
    ) -> Result<Started, ManagerError> {
        let dup = s.pidfd.try_clone().map_err(|source| ManagerError::Io {
            what: "duplicating the exec's pidfd",
            source,
        })?;
        let (tx, rx) = oneshot::channel();
        self.registry.insert(s.pid);
        self.send(Job::Adopt {
            pid: s.pid,
            entry: Entry {
                tx,
                pidfd: s.pidfd,
                status: s.status,
                release: Vec::new(),
                mnt: None,
            },
        })?;
        Ok(Started {
            pid: s.pid,
            pidfd: dup,
            init: s.init,
            exit: rx,
            cgroup,
        })
    }

    /// Spawn a plain command on the manager thread and reap it there (the spawn benchmark's
    /// baseline, so both sides pay the same thread hop and wait path).
    #[doc(hidden)]
    pub async fn spawn_plain(
        &self,
        cmd: std::process::Command,
    ) -> io::Result<oneshot::Receiver<Reaped>> {
        let (reply, rx) = oneshot::channel();
        self.send(Job::Plain {
            cmd: Box::new(cmd),
            reply,
        })
        .map_err(|e| io::Error::other(e.to_string()))?;
        rx.await
            .map_err(|_| io::Error::other("the process manager thread is gone"))?
    }

    pub(super) async fn sweep(
        &self,
        leader: libc::pid_t,
        cgroup: Option<Arc<ExecCgroup>>,
        supervisor: libc::pid_t,
        leader_alive: bool,
    ) -> Result<Vec<i32>, super::SweepError> {
        let (reply, rx) = oneshot::channel();
        if self
            .send(Job::Sweep {
                leader,
                cgroup,
                supervisor,
                leader_alive,
                reply: Some(reply),
            })
            .is_err()
        {
            return Ok(vec![leader]);
        }
        rx.await.unwrap_or_else(|_| Ok(vec![leader]))
    }

    /// Fire-and-forget kill of a degraded exec (from `Drop`).
    pub(super) fn sweep_detached(
        &self,
        leader: libc::pid_t,
        cgroup: Option<Arc<ExecCgroup>>,
        supervisor: libc::pid_t,
        leader_alive: bool,
    ) {
        let _ = self.send(Job::Sweep {
            leader,
            cgroup,
            supervisor,
            leader_alive,
            reply: None,
        });
    }

    pub(super) fn release(&self, pid: libc::pid_t, cgroup: Arc<ExecCgroup>) {
        let _ = self.send(Job::Release { pid, cgroup });
    }
}

fn wake_up(wake: RawFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: an 8-byte write to our eventfd.
    unsafe { libc::write(wake, one.as_ptr().cast(), one.len()) };
}

/// The manager thread's loop. `sup`: the supervisor's own pidfd (-1 without one), handed to
/// every init so it can tell whether the supervisor died before its parent-death signal was
/// armed.
fn run(rx: mpsc::Receiver<Job>, wake: RawFd, registry: &Registry, sup: RawFd) {
    let mut entries: HashMap<libc::pid_t, Entry> = HashMap::new();
    let mut teardown = Teardown::default();
    // Set once an exec without an init (or a plain child) ran: its orphans come to us, and
    // have no pidfd to wake us, so poll on a tick from then on.
    let mut orphans_possible = false;
    // Every exec's init is cloned here and inherits this thread's credentials: with the
    // bounding set emptied once, the command's identity step reads it back instead of
    // dropping each capability (identity.rs).
    crate::sandbox::identity::drop_bounding_set_ahead();
    loop {
        let mut fds: Vec<libc::pollfd> = std::iter::once(wake)
            .chain(entries.values().map(|e| e.pidfd.as_raw_fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let timeout = if orphans_possible { 100 } else { -1 };
        // SAFETY: poll on our own array.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        let mut buf = [0u8; 8];
        // SAFETY: draining the nonblocking eventfd into a stack buffer.
        unsafe { libc::read(wake, buf.as_mut_ptr().cast(), buf.len()) };
        while let Ok(job) = rx.try_recv() {
            match job {
                Job::Spawn {
                    sandbox,
                    plan,
                    reply,
                } => {
                    let r = spawn_one(&sandbox, plan, sup, &mut entries, registry);
                    if matches!(&r, Ok(s) if !s.init) {
                        orphans_possible = true;
                    }
                    let _ = reply.send(r);
                    // The child is running now; make the next exec's group and Landlock
                    // ruleset copy while it does.
                    if let Some(root) = &sandbox.prepared.cgroups {
                        root.make_spare(&sandbox.policy.limits);
                    }
                    if let Some(ll) = &sandbox.prepared.landlock {
                        ll.make_spare();
                    }
                }
                Job::Go {
                    sandbox,
                    init,
                    plan,
                    cgroup,
                    check_workdir,
                    reply,
                } => {
                    // The view's network namespace, held by the sandbox this job holds.
                    let net = sandbox.prepared.view.net.as_ref().map(|f| f.as_raw_fd());
                    let r = init.go(check_workdir, net).map_err(ManagerError::Spawn);
                    // The child-side stdio ends close here, in the parent.
                    drop(plan);
                    let r = r.and_then(|s| {
                        register(&sandbox.prepared, s, cgroup, &mut entries, registry)
                    });
                    let _ = reply.send(r);
                }
                Job::Adopt { pid, entry } => {
                    entries.insert(pid, entry);
                }
                Job::Plain { mut cmd, reply } => {
                    orphans_possible = true;
                    let r = cmd.spawn().and_then(|c| {
                        let pid = c.id() as libc::pid_t;
                        // Not reaped yet (only this thread reaps), so the pid is still ours.
                        let pidfd = crate::sys::process::pidfd_open(pid)?;
                        let (tx, rx) = oneshot::channel();
                        registry.insert(pid);
                        entries.insert(
                            pid,
                            Entry {
                                tx,
                                pidfd,
                                status: None,
                                release: Vec::new(),
                                mnt: None,
                            },
                        );
                        Ok(rx)
                    });
                    let _ = reply.send(r);
                }
                Job::Sweep {
                    leader,
                    cgroup,
                    supervisor,
                    leader_alive,
                    reply,
                } => {
                    let left = super::tree::kill_all(
                        leader,
                        cgroup.as_deref(),
                        supervisor,
                        leader_alive,
                        registry,
                        &|| wake_up(wake),
                    );
                    reap(&mut entries, registry, &mut teardown);
                    match (reply, &left) {
                        (Some(r), _) => {
                            let _ = r.send(left);
                        }
                        (None, Ok(l)) if !l.is_empty() => {
                            tracing::warn!(pids = ?l, "processes of an exec survived the kill sweep")
                        }
                        (None, Err(e)) => {
                            tracing::warn!(error = %e, "the kill sweep could not list the exec's processes")
                        }
                        (None, Ok(_)) => {}
                    }
                    drop(cgroup);
                }
                Job::Release { pid, cgroup } => {
                    if let Some(e) = entries.get_mut(&pid) {
                        e.release.push(cgroup);
                    }
                }
            }
        }
        reap(&mut entries, registry, &mut teardown);
    }
}

fn spawn_one(
    sandbox: &super::inner::Inner,
    plan: ExecPlan,
    sup: RawFd,
    entries: &mut HashMap<libc::pid_t, Entry>,
    registry: &Registry,
) -> Result<Started, ManagerError> {
    // A test holds the manager thread here: the async side must go on
    // serving the running execs meanwhile, because no fork, wait or sweep happens on it.
    crate::pause::point("manager-spawn");
    timeline::begin();
    let prepared = &sandbox.prepared;
    let cgroup = match &prepared.cgroups {
        Some(root) => Some(Arc::new(
            root.take_exec(&sandbox.policy.limits)
                .map_err(ManagerError::Cgroup)?,
        )),
        None => None,
    };
    timeline::mark(Mark::Cgroup);
    // The exec's own Landlock ruleset, to which its command adds the rule for its fresh /proc
    // (landlock.rs `copy`): in the shared one those rules would pile up, one per exec.
    let plan = match &prepared.landlock {
        Some(ll) => plan.with_ruleset(ll.take_copy().map_err(|source| ManagerError::Io {
            what: "copying the sandbox's Landlock ruleset for the exec",
            source,
        })?),
        None => plan,
    };
    timeline::mark(Mark::Ruleset);
    let s = fork_exec(prepared, &plan, cgroup.as_deref(), sup);
    timeline::mark(Mark::ExecSeen);
    timeline::finish();
    let s = s?;
    // The child-side stdio ends close here, in the parent.
    drop(plan);
    register(prepared, s, cgroup, entries, registry)
}

/// Hold a started exec: reaped here, its exit sent to the returned receiver.
fn register(
    prepared: &crate::sandbox::Prepared,
    s: Spawned,
    cgroup: Option<Arc<ExecCgroup>>,
    entries: &mut HashMap<libc::pid_t, Entry>,
    registry: &Registry,
) -> Result<Started, ManagerError> {
    let dup = s.pidfd.try_clone().map_err(|source| ManagerError::Io {
        what: "duplicating the exec's pidfd",
        source,
    })?;
    // The init is alive (it waits for the command), so its pid is still this exec's.
    let ev = prepared.view.exec_view();
    let mnt = if s.init && ev.own_mnt && ev.proc != crate::sandbox::namespaces::ProcMount::None {
        std::fs::File::open(format!("/proc/{}/ns/mnt", s.pid))
            .ok()
            .map(OwnedFd::from)
    } else {
        None
    };
    let (tx, rx) = oneshot::channel();
    registry.insert(s.pid);
    entries.insert(
        s.pid,
        Entry {
            tx,
            pidfd: s.pidfd,
            status: s.status,
            release: Vec::new(),
            mnt,
        },
    );
    Ok(Started {
        pid: s.pid,
        pidfd: dup,
        init: s.init,
        exit: rx,
        cgroup,
    })
}

/// Reap every zombie child: deliver an exec's status to its waiter, drop an orphan.
fn reap(entries: &mut HashMap<libc::pid_t, Entry>, registry: &Registry, teardown: &mut Teardown) {
    loop {
        // SAFETY: waitid fills a zeroed siginfo_t on our stack.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointer; WNOWAIT|WNOHANG learns of a zombie without reaping or
        // blocking. Children without an exit signal (the view helper) are not seen here.
        let rc = unsafe {
            libc::waitid(
                libc::P_ALL,
                0,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        // SAFETY: waitid succeeded, so si_pid is set (0 when no child is a zombie).
        if rc != 0 || unsafe { info.si_pid() } <= 0 {
            return;
        }
        // SAFETY: as above.
        let pid = unsafe { info.si_pid() };
        let mut status = 0;
        // SAFETY: rusage is plain data.
        let mut rusage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: reaping the pid waitid just reported, with pointers to our stack.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut rusage) };
        if r != pid {
            continue;
        }
        if let Some(e) = entries.remove(&pid) {
            registry.remove(pid);
            if let Some(st) = &e.status {
                // The init wrote the command's wait status before it exited; the pipe holds it
                // (or nothing, if the init itself was killed).
                let mut b = [0u8; 4];
                // SAFETY: reading into a stack buffer; the writer is dead, so no blocking.
                let n = unsafe { libc::read(st.as_raw_fd(), b.as_mut_ptr().cast(), b.len()) };
                if n == 4 {
                    status = i32::from_ne_bytes(b);
                }
            }
            let _ = e.tx.send(Reaped { status, rusage });
            if let Some(m) = e.mnt {
                teardown.drop_later(m);
            }
            // Every process of the exec is gone (an init is reaped only once its namespace is
            // empty), so its cgroup can go too.
            drop(e.release);
        }
    }
}
