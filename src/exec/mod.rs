//! The parent side of a sandboxed exec: spawn, stream, time out, kill the tree, report.

pub mod credential_flags;
pub mod egress;
mod egress_error;
mod error;
pub mod explain;
pub mod home;
mod inner;
pub mod interception;
pub mod manager;
mod missing_interpreter;
pub mod one;
mod plan;
pub mod pty;
pub mod reaper;
pub mod report;
pub mod report_file;
pub mod run;
mod spec;
pub mod stream;
mod supervisor;
mod tree;
mod usage;
pub mod workdir;

pub use error::RunError;
pub use plan::program_candidates;
pub use spec::{SpawnSpec, Stdio};
pub use supervisor::Supervisor;
pub use tree::SweepError;
pub use usage::ExitInfo;

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::unix::pipe;
use tokio::sync::oneshot;

use crate::policy::Policy;
use crate::sandbox::cgroup::ExecCgroup;
use crate::sandbox::init::{ExecPlan, SpawnError};
use crate::sandbox::{self, ChildError, LayerStatus, Prepared, Step};

use inner::Inner;

/// A prepared sandbox: every kernel object built once, cheap to clone, used for every exec.
#[derive(Clone)]
pub struct Sandbox {
    inner: Arc<Inner>,
    /// What spawns its execs and reaps them.
    supervisor: Supervisor,
}

/// A running sandboxed child. Dropping it while it runs kills its whole tree.
pub struct Child {
    pub stdin: Option<pipe::Sender>,
    pub stdout: Option<pipe::Receiver>,
    pub stderr: Option<pipe::Receiver>,
    pid: libc::pid_t,
    /// Held by descriptor: signals can never reach a recycled pid.
    pidfd: OwnedFd,
    /// `pid` is the exec's init, PID 1 of its own PID namespace: killing it kills the exec.
    init: bool,
    exit: Option<oneshot::Receiver<reaper::Reaped>>,
    done: Option<ExitInfo>,
    /// What the exec's processes had used when we sent SIGKILL (see [`usage::Usage`]).
    used_before_kill: Option<usage::Usage>,
    cgroup: Option<Arc<ExecCgroup>>,
    supervisor_pid: libc::pid_t,
    started: Instant,
    /// The tree was killed after the leader exited; never signal by these ids again, they
    /// may be reused.
    cleaned: bool,
    /// Whose manager holds this exec (kills, sweeps and reaps it).
    supervisor: Supervisor,
    /// The sandbox this exec runs in, kept for the exec's whole life: its view (namespaces
    /// and the helper that holds them) must outlive every exec that joined it, even when a
    /// new policy revision replaced the sandbox for the execs that come next.
    _sandbox: Arc<Inner>,
}

impl Sandbox {
    /// Validate the policy and build every kernel object. Fails closed: a layer that cannot be
    /// enforced is an error unless `policy.allow_degraded`.
    pub fn new(supervisor: &Supervisor, policy: Policy) -> Result<Sandbox, RunError> {
        // Each path is resolved once while the sandbox is prepared (sys::walk::Memo).
        let _memo = crate::sys::walk::Memo::begin();
        policy.validate()?;
        let prepared = sandbox::prepare(&policy)?;
        sandbox::process::harden_supervisor().map_err(|source| RunError::Io {
            what: "becoming a child subreaper",
            source,
        })?;
        // After prepare: nothing is claimed or handed over for a sandbox it refuses.
        let held = workdir::hold(&policy, &prepared).map_err(RunError::Hold)?;
        Ok(Sandbox {
            inner: Arc::new(Inner {
                policy,
                prepared,
                _held: held,
                attached: Default::default(),
            }),
            supervisor: supervisor.clone(),
        })
    }

    /// The root of the view's own /tmp (a private tmpfs, gone with the view), as an O_PATH
    /// descriptor; `None` when the view has none.
    pub fn private_tmp(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        let view = &self.inner.prepared.view;
        view.private_tmp()
            .then(|| view.tmpfs.iter().find(|(p, _)| p == Path::new("/tmp")))
            .flatten()
            .and_then(|(_, fd)| fd.as_ref())
            .map(|fd| fd.as_fd())
    }

    /// Whose ids the writes to the read-write grants carry, as `prepare` decided.
    pub fn ownership(&self) -> &sandbox::ownership::Ownership {
        &self.inner.prepared.ownership
    }

    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// A sandbox from an already prepared (possibly hand-trimmed) set of layers: for `check`'s
    /// probes, which prepared it as `run` would, and the per-layer benchmark. It skips the
    /// fail-closed checks of [`Sandbox::new`].
    pub fn from_prepared(supervisor: &Supervisor, policy: Policy, prepared: Prepared) -> Sandbox {
        Sandbox {
            inner: Arc::new(Inner {
                policy,
                prepared,
                _held: workdir::Held::default(),
                attached: Default::default(),
            }),
            supervisor: supervisor.clone(),
        }
    }

    /// This sandbox serves one exec (`run`): no cgroup is made ahead for a next one, and the
    /// exec mounts its /proc in the view's mount namespace, not in a copy of its own.
    pub fn one_exec_only(&self) {
        if let Some(root) = &self.inner.prepared.cgroups {
            root.one_exec_only();
        }
        self.inner
            .prepared
            .view
            .one_exec
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Remove the cgroups dead supervisors left beside this sandbox's (once; see
    /// `sandbox::cgroup::Root::sweep_stale`): for `run`, once its command is running.
    pub fn sweep_stale_cgroups(&self) {
        if let Some(root) = &self.inner.prepared.cgroups {
            root.sweep_stale();
        }
    }

    /// Keep `obj` until the sandbox's last clone (the last exec of an old revision included)
    /// is gone: a service of this sandbox such as its egress proxy.
    pub fn attach(&self, obj: Arc<dyn std::any::Any + Send + Sync>) {
        self.inner
            .attached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(obj);
    }

    /// The attached object of type `T`, if any.
    pub fn attached<T: std::any::Any + Send + Sync>(&self) -> Option<Arc<T>> {
        let v = self
            .inner
            .attached
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        v.iter().find_map(|o| o.clone().downcast::<T>().ok())
    }

    /// What each layer enforces.
    pub fn layers(&self) -> &[LayerStatus] {
        &self.inner.prepared.layers
    }

    /// The view's network namespace, when the sandbox has one of its own (`--network none`
    /// with the namespace enforced): where forwarded connections must be made.
    pub fn net_namespace(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.inner.prepared.view.net.as_ref().map(|f| f.as_fd())
    }

    /// The directory of the view's own files (`NamespacePolicy::files`), when the view shows
    /// them (its root was built and the files written).
    pub fn view_files(&self) -> Option<&std::path::Path> {
        self.inner
            .prepared
            .view
            .files
            .as_ref()
            .map(|(p, _)| p.as_path())
    }

    pub fn landlock_abi(&self) -> i32 {
        self.inner.prepared.landlock_abi
    }

    /// Whether `argv0` would start under this sandbox, found as `spawn` finds it (in the
    /// default PATH, from the workdir): `None` when its program and every interpreter it needs
    /// are in the view, else the error `spawn` would give. The examination runs inside the view
    /// as the sandbox identity, and nothing is executed (`check`). Blocks for at most a few
    /// seconds.
    pub fn probe(&self, argv0: &OsStr) -> Result<Option<RunError>, RunError> {
        let cwd = self.inner.policy.fs.workdir.clone();
        let candidates = program_candidates(argv0, &[], &cwd)?;
        let null = || {
            std::fs::File::open("/dev/null")
                .map(OwnedFd::from)
                .map_err(|source| RunError::Io {
                    what: "opening /dev/null",
                    source,
                })
        };
        let plan = ExecPlan::new(
            &candidates,
            &[argv0.to_owned()],
            &[],
            &cwd,
            [null()?, null()?, null()?],
            self.supervisor.command_group(false),
            None,
        )
        .map_err(|_| RunError::Usage("the command contains a NUL byte".into()))?
        .probe_only();
        let d = match sandbox::init::probe(&self.inner.prepared, &plan) {
            Ok(Some(d)) => *d,
            Ok(None) => {
                return Err(RunError::Io {
                    what: "examining the program in the sandbox (no answer in time)",
                    source: io::Error::from_raw_os_error(libc::ETIMEDOUT),
                });
            }
            Err(SpawnError::Child(c) | SpawnError::Exec { error: c, .. }) => {
                return Err(RunError::ChildSetup(c));
            }
            Err(e) => return Err(RunError::Manager(manager::ManagerError::Spawn(e))),
        };
        use crate::sandbox::diagnose::Finding;
        // Without an execve there is no errno: nothing in the way, unless a noexec mount is.
        let errno = match (d.errno, d.noexec) {
            (0, true) => libc::EACCES,
            (e, _) => e,
        };
        if d.finding == Finding::Startable || (d.finding == Finding::Unexplained && errno == 0) {
            return Ok(None);
        }
        let d = crate::sandbox::diagnose::Diagnosis { errno, ..d };
        let error = ChildError {
            detail: d.candidate.map_or(u8::MAX, |i| i as u8),
            ..ChildError::new(Step::Exec, errno)
        };
        Ok(Some(self.explain(error, Some(&d), argv0, &candidates)))
    }

    /// Start one command under the sandbox. The fork, and the wait until the command has
    /// exec'd, happen on the process-manager thread (`manager.rs`); this only builds the
    /// command's C data and awaits the reply.
    pub async fn spawn(&self, spec: SpawnSpec) -> Result<Child, RunError> {
        let parts = plan::Parts::new(
            &self.supervisor,
            spec,
            &self.inner.policy.fs.workdir,
            self.inner.prepared.view.private_tmp(),
        )?;
        let plan::Parts {
            plan,
            parents,
            candidates,
            cwd,
            argv0,
            ..
        } = parts;
        let started = self
            .supervisor
            .manager()
            .spawn(self.inner.clone(), plan)
            .await
            .map_err(|e| self.spawn_error(e, &argv0, &candidates, &cwd))?;
        self.child(started, parents)
    }

    /// The [`Child`] of a started exec, with our ends of its pipes.
    fn child(
        &self,
        started: manager::Started,
        [stdin_parent, stdout_parent, stderr_parent]: [Option<OwnedFd>; 3],
    ) -> Result<Child, RunError> {
        let io_err = |source| RunError::Io {
            what: "registering the child's pipes",
            source,
        };
        Ok(Child {
            stdin: stdin_parent
                .map(pipe::Sender::from_owned_fd)
                .transpose()
                .map_err(io_err)?,
            stdout: stdout_parent
                .map(pipe::Receiver::from_owned_fd)
                .transpose()
                .map_err(io_err)?,
            stderr: stderr_parent
                .map(pipe::Receiver::from_owned_fd)
                .transpose()
                .map_err(io_err)?,
            pid: started.pid,
            pidfd: started.pidfd,
            init: started.init,
            exit: Some(started.exit),
            done: None,
            used_before_kill: None,
            cgroup: started.cgroup,
            supervisor_pid: self.inner.prepared.supervisor_pid,
            started: Instant::now(),
            cleaned: false,
            supervisor: self.supervisor.clone(),
            _sandbox: self.inner.clone(),
        })
    }
}

impl Sandbox {
    /// Turn a failed spawn into a precise error: the failed execve as the command's own
    /// examination explains it (127/126, `explain.rs`), any other step by name.
    fn spawn_error(
        &self,
        e: manager::ManagerError,
        argv0: &OsStr,
        candidates: &[PathBuf],
        cwd: &Path,
    ) -> RunError {
        match e {
            manager::ManagerError::Spawn(SpawnError::Exec { error, diagnosis }) => {
                self.explain(error, diagnosis.as_deref(), argv0, candidates)
            }
            manager::ManagerError::Spawn(SpawnError::Child(c))
                if c.step == Step::Chdir && matches!(c.errno, libc::ENOENT | libc::ENOTDIR) =>
            {
                RunError::Usage(format!(
                    "working directory {} does not exist in the sandbox or is not a directory",
                    cwd.display()
                ))
            }
            manager::ManagerError::Spawn(SpawnError::Child(c)) if c.step == Step::Exec => {
                self.explain(c, None, argv0, candidates)
            }
            manager::ManagerError::Spawn(SpawnError::Child(c)) => RunError::ChildSetup(c),
            e => RunError::Manager(e),
        }
    }

    /// [`explain::exec_failed`] with this sandbox's policy.
    pub fn explain(
        &self,
        error: ChildError,
        diagnosis: Option<&crate::sandbox::diagnose::Diagnosis>,
        argv0: &OsStr,
        candidates: &[PathBuf],
    ) -> RunError {
        explain::exec_failed(
            error,
            diagnosis,
            &explain::Context {
                argv0,
                candidates,
                fs: &self.inner.policy.fs,
                rules: &self.inner.prepared.fs_rules,
                uid: self
                    .inner
                    .policy
                    .identity
                    .map_or_else(crate::sys::process::euid, |id| id.uid),
            },
        )
    }
}

impl Child {
    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// How long ago the child was started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Wait for the child itself to exit. Cancel-safe. Its descendants may still run; see
    /// [`Child::kill_tree`].
    pub async fn wait(&mut self) -> ExitInfo {
        if let Some(d) = self.done {
            return d;
        }
        let rx = self
            .exit
            .as_mut()
            .expect("exit receiver present until done");
        let info = match rx.await {
            Ok(r) => ExitInfo::from_reaped(r).at_least(self.used_before_kill),
            // The reaper never drops a sender; treat it as a kill if it somehow did.
            Err(_) => ExitInfo {
                code: None,
                signal: Some(libc::SIGKILL),
                user_cpu: Duration::ZERO,
                sys_cpu: Duration::ZERO,
                max_rss_kib: 0,
            },
        };
        self.exit = None;
        self.done = Some(info);
        info
    }

    /// Whether the child itself has exited (without waiting).
    pub fn exited(&self) -> Option<ExitInfo> {
        self.done
    }

    /// Send `sig` to every process of this exec. With a PID namespace, to its init, which
    /// forwards SIGTERM, SIGINT and SIGHUP to every process of the namespace (SIGKILL kills
    /// the namespace outright). Without one: its process group, its cgroup when there is one,
    /// and orphans of its session re-parented to the supervisor.
    pub fn signal_tree(&mut self, sig: i32) {
        if self.cleaned {
            return;
        }
        self.note_usage_before(sig);
        if self.init {
            if self.done.is_none() {
                pidfd_signal(&self.pidfd, sig);
            }
            return;
        }
        if self.done.is_none() {
            pidfd_signal(&self.pidfd, sig);
        }
        if let Err(e) = tree::signal(
            self.pid,
            self.cgroup.as_deref(),
            self.supervisor_pid,
            sig,
            self.done.is_none(),
            self.supervisor.manager().registry(),
        ) {
            tracing::warn!(error = %e, "could not signal the exec's processes");
        }
    }

    /// Before a SIGKILL of ours to a running exec: what its processes have used so far, which
    /// their leader's rusage will not show (`usage.rs`).
    fn note_usage_before(&mut self, sig: i32) {
        if sig == libc::SIGKILL && self.done.is_none() {
            self.used_before_kill = Some(usage::snapshot(self.pid));
        }
    }

    /// Hand a signal that `run` received to the command's job: its process group, as a
    /// terminal's Ctrl-C reaches the foreground job (docker run's `--sig-proxy`, with the
    /// terminal's reach). What the command makes of it is its own business: the run ends when
    /// the command does, with the command's exit code. With a PID namespace the group's id is
    /// the namespace's, so the init relays it (`sandbox::init::forward_to_job`).
    pub fn forward_signal(&self, sig: i32) {
        if self.cleaned || self.done.is_some() {
            return;
        }
        if self.init {
            if let Err(e) = sandbox::init::forward_to_job(self.pidfd.as_fd(), sig) {
                tracing::warn!(signal = sig, error = %e, "could not forward the signal");
            }
            return;
        }
        // The leader is not reaped yet, so its pid (and the id of the process group it leads)
        // cannot have been reused.
        let _ = crate::sys::process::kill(-self.pid, sig);
    }

    /// Kill everything of this exec that is still alive, and return the pids that survived
    /// (normally none).
    ///
    /// With a PID namespace this is exact: SIGKILL to the init, whose exit the kernel holds
    /// back until every other process of the namespace is gone; once it is reaped, nothing is
    /// left. Without one (degraded), the process manager sweeps /proc and the cgroup for about
    /// a second (see SECURITY.md for when a process that forks in a loop can outrun it).
    ///
    /// An error when the exec's processes could not even be listed (degraded path only):
    /// containment failed then too.
    pub async fn kill_tree(&mut self) -> Result<Vec<i32>, SweepError> {
        if self.cleaned {
            return Ok(Vec::new());
        }
        if self.init {
            if self.done.is_none() {
                self.note_usage_before(libc::SIGKILL);
                pidfd_signal(&self.pidfd, libc::SIGKILL);
            }
            self.wait().await;
            self.cleaned = true;
            return Ok(Vec::new());
        }
        let alive = self.done.is_none();
        let left = self
            .supervisor
            .manager()
            .sweep(self.pid, self.cgroup.clone(), self.supervisor_pid, alive)
            .await;
        match &left {
            Ok(l) if l.is_empty() => self.cleaned = self.done.is_some(),
            Ok(l) => tracing::warn!(pids = ?l, "processes of an exec survived the kill sweep"),
            Err(e) => {
                tracing::warn!(error = %e, "the kill sweep could not list the exec's processes")
            }
        }
        left
    }

    /// SIGTERM the whole tree, give it `grace` to exit, then SIGKILL it. Returns how the child
    /// ended.
    pub async fn terminate_tree(&mut self, grace: Duration) -> ExitInfo {
        if self.done.is_none() {
            self.signal_tree(libc::SIGTERM);
            if tokio::time::timeout(grace, self.wait()).await.is_err() {
                self.signal_tree(libc::SIGKILL);
            }
        }
        let info = self.wait().await;
        // The caller's own kill_tree() reports a failure; this one only logs it.
        let _ = self.kill_tree().await;
        info
    }

    /// The exec's cgroup, when it has one (its limit counters and CPU meter).
    pub fn cgroup(&self) -> Option<&ExecCgroup> {
        self.cgroup.as_deref()
    }

    /// The cgroup recorded the exec hitting its memory limit.
    pub fn hit_memory_limit(&self) -> bool {
        self.cgroup.as_ref().is_some_and(|c| c.hit_memory_limit())
    }
}

fn pidfd_signal(pidfd: &OwnedFd, sig: i32) {
    // ESRCH once the process is gone is fine.
    let _ = crate::sys::process::pidfd_send_signal(pidfd.as_raw_fd(), sig);
}

impl Drop for Child {
    fn drop(&mut self) {
        // Nothing of an exec outlives it. Nothing here may block a runtime worker: the init
        // is killed by descriptor (the kernel empties the namespace), a degraded exec is swept
        // on the manager thread, and the cgroup is removed there once the exec is reaped.
        let m = self.supervisor.manager();
        if self.init {
            if !self.cleaned && self.done.is_none() {
                pidfd_signal(&self.pidfd, libc::SIGKILL);
            }
            if let Some(cg) = self.cgroup.take() {
                m.release(self.pid, cg);
            }
        } else if !self.cleaned {
            m.sweep_detached(
                self.pid,
                self.cgroup.take(),
                self.supervisor_pid,
                self.done.is_none(),
            );
        } else if let Some(cg) = self.cgroup.take() {
            m.release(self.pid, cg);
        }
    }
}
