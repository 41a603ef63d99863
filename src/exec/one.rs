//! `run`'s sandbox and its one exec, made together: the exec's own init makes the view
//! (sandbox/one.rs), and the sandbox is decided from what it made, before the command starts.
//! Where that path is not taken (or given up), the sandbox is prepared as every sandbox is and
//! the command spawned into it later, the same way to the caller.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use super::home::{self, HomeRequest};
use super::plan::Parts;
use super::{Child, Inner, RunError, Sandbox, SpawnSpec, Supervisor, manager, workdir};
use crate::policy::Policy;
use crate::sandbox::cgroup::ExecCgroup;
use crate::sandbox::child::view_init::ViewInit;
use crate::sandbox::init::SpawnError;
use crate::sandbox::{self, Step};

/// The one exec of a [`Sandbox::new_with_exec`], until [`Pending::start`].
pub struct Pending(Inside);

/// An init that made the view, its command's data, and the exec's cgroup.
struct Started {
    init: ViewInit,
    parts: Parts,
    cgroup: Option<ExecCgroup>,
}

enum Inside {
    /// Its init has made the view and waits to start the command.
    Init(Box<Started>),
    /// To be spawned into the sandbox's view, made ahead; our ends of its pipes where they
    /// were made already.
    Later {
        spec: SpawnSpec,
        parents: Option<[Option<OwnedFd>; 3]>,
    },
}

impl Sandbox {
    /// A sandbox for one command (`run`), and that command, not started yet. Everything that
    /// must hold before the command runs (the egress proxy in the view's network namespace,
    /// the workdir check, the report's directory) can be done in between; dropping the
    /// [`Pending`] ends its init.
    /// `home`: the command's HOME to make (exec/home.rs), where it was not given one.
    pub fn new_with_exec(
        supervisor: &Supervisor,
        policy: Policy,
        spec: SpawnSpec,
        home: Option<HomeRequest>,
    ) -> Result<(Sandbox, Pending), RunError> {
        // Each path is resolved once while the sandbox is prepared (sys::walk::Memo); not
        // across a fallback, which is there because something changed.
        let memo = crate::sys::walk::Memo::begin();
        policy.validate()?;
        crate::sandbox::run_timeline::stamp("sn-validate");
        let mut spec = spec;
        let mut parents = None;
        let given_home = spec.env.iter().find(|(k, _)| k == "HOME").cloned();
        if let Some(one) = sandbox::one::prepare(&policy)? {
            // The command's environment goes with its init: its HOME is named now, and made
            // in the view's /tmp once the init has made that.
            let in_view = home
                .as_ref()
                .filter(|_| one.private_tmp())
                .map(|_| home::name_in_view(&policy));
            match (&home, &in_view) {
                (Some(_), Some(name)) => home::set(&mut spec.env, Path::new("/tmp").join(name)),
                (
                    Some(HomeRequest {
                        scratch: Some(s), ..
                    }),
                    None,
                ) => home::set(&mut spec.env, s.clone()),
                _ => {}
            }
            let parts = Parts::new(supervisor, spec, &policy.fs.workdir, one.private_tmp())?;
            crate::sandbox::run_timeline::stamp("sn-exec-plan");
            match one.start(&policy, &parts.plan, supervisor.pidfd()) {
                Ok((prepared, init, cgroup)) => {
                    if let (Some(h), Some(name)) = (&home, &in_view) {
                        init.open_in_view(c"tmp")
                            .and_then(|tmp| home::make_named(tmp.as_fd(), name, h.owner))
                            .map_err(|source| RunError::Io {
                                what: "making the command's HOME on the view's /tmp",
                                source,
                            })?;
                    }
                    crate::sandbox::run_timeline::stamp("sn-home");
                    sandbox::process::harden_supervisor().map_err(|source| RunError::Io {
                        what: "becoming a child subreaper",
                        source,
                    })?;
                    let held = workdir::hold(&policy, &prepared).map_err(RunError::Hold)?;
                    crate::sandbox::run_timeline::stamp("sn-hold");
                    let sb = Sandbox {
                        inner: Arc::new(Inner {
                            policy,
                            prepared,
                            _held: held,
                            attached: Default::default(),
                        }),
                        supervisor: supervisor.clone(),
                    };
                    return Ok((
                        sb,
                        Pending(Inside::Init(Box::new(Started {
                            init,
                            parts,
                            cgroup,
                        }))),
                    ));
                }
                Err(sandbox::one::Start::Refused(e)) => return Err(e.into()),
                Err(sandbox::one::Start::Fallback(fallback)) => {
                    tracing::debug!(reason = %fallback.0, "the exec's init could not make the view: a view made ahead instead");
                    let (s, p) = parts.into_spec();
                    spec = s;
                    parents = Some(p);
                }
            }
        }
        // Also the answers of an outer memo (`run` holds one from its policy's validation on).
        memo.forget();
        drop(memo);
        let sb = Sandbox::new(supervisor, policy)?;
        sb.one_exec_only();
        if let Some(h) = &home {
            spec.env.retain(|(k, _)| k != "HOME");
            spec.env.extend(given_home);
            match (sb.private_tmp(), &h.scratch) {
                (Some(tmp), _) => {
                    let made =
                        home::make_first_free(tmp, h.owner).map_err(|source| RunError::Io {
                            what: "making the command's HOME on the view's /tmp",
                            source,
                        })?;
                    home::set(&mut spec.env, made);
                }
                (None, Some(s)) => home::set(&mut spec.env, s.clone()),
                (None, None) => {}
            }
        }
        Ok((sb, Pending(Inside::Later { spec, parents })))
    }
}

impl Pending {
    /// Remove `unset` from the command's environment and set `vars`, where it is still to be
    /// spawned; `false` where its init already holds its environment.
    pub fn set_env(&mut self, unset: &[&str], vars: &[(String, String)]) -> bool {
        match &mut self.0 {
            Inside::Later { spec, .. } => {
                spec.env
                    .retain(|(k, _)| !unset.iter().any(|u| k.as_os_str() == *u));
                super::egress::set_child_env(&mut spec.env, vars);
                true
            }
            Inside::Init(_) => false,
        }
    }

    /// Start the command in `sandbox` (the one it was made with) and wait until it has
    /// exec'd. With `check`, the command may not start unless it may write its workdir
    /// (asked of the kernel by the command itself, where its init made the view).
    pub async fn start(
        self,
        sandbox: &Sandbox,
        check: Option<workdir::WritableCheck>,
    ) -> Result<Child, RunError> {
        let workdir = &sandbox.inner.policy.fs.workdir;
        match self.0 {
            Inside::Later { spec, parents } => {
                if let Some(c) = check {
                    c.ask(workdir).map_err(RunError::Workdir)?;
                }
                let mut child = sandbox.spawn(spec).await?;
                if let Some([i, o, e]) = parents {
                    let io_err = |source| RunError::Io {
                        what: "registering the child's pipes",
                        source,
                    };
                    let recv = |fd: Option<OwnedFd>| {
                        fd.map(tokio::net::unix::pipe::Receiver::from_owned_fd)
                            .transpose()
                            .map_err(io_err)
                    };
                    child.stdin = i
                        .map(tokio::net::unix::pipe::Sender::from_owned_fd)
                        .transpose()
                        .map_err(io_err)?;
                    child.stdout = recv(o)?;
                    child.stderr = recv(e)?;
                }
                Ok(child)
            }
            Inside::Init(started) => {
                let Started {
                    init,
                    parts,
                    cgroup,
                } = *started;
                let Parts {
                    plan,
                    parents,
                    candidates,
                    cwd,
                    argv0,
                    ..
                } = parts;
                let cgroup = cgroup.map(Arc::new);
                let supervisor = &sandbox.supervisor;
                let started = if supervisor.manager_running() {
                    // Its reaping could see the init exit before it held the init: let it tell
                    // the init to go, as it forks every other exec.
                    supervisor
                        .manager()
                        .go(sandbox.inner.clone(), init, plan, cgroup, check.is_some())
                        .await
                } else {
                    // No thread to hand over to and wait for: go from here, then let the
                    // manager (started now) hold the exec.
                    let net = sandbox.inner.prepared.view.net.as_ref();
                    let spawned = init.go(check.is_some(), net.map(|f| f.as_raw_fd()));
                    // Our copies of the child's ends of its pipes.
                    drop(plan);
                    spawned
                        .map_err(manager::ManagerError::Spawn)
                        .and_then(|s| supervisor.manager().adopt(s, cgroup))
                };
                let started = started.map_err(|e| match (e, check) {
                    (manager::ManagerError::Spawn(SpawnError::Child(c)), Some(check))
                        if c.step == Step::WorkdirWritable =>
                    {
                        RunError::Workdir(
                            check.refused(workdir, std::io::Error::from_raw_os_error(c.errno)),
                        )
                    }
                    (e, _) => sandbox.spawn_error(e, &argv0, &candidates, &cwd),
                })?;
                sandbox.child(started, parents)
            }
        }
    }
}
