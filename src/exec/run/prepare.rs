//! Everything `run` does before its command starts: the policy, the uid it runs as, the
//! scratch tree, the command's environment, the sandbox with its exec waiting in its init,
//! the egress proxy, and the workdir's write check.

use std::path::Path;

use super::env::child_env;
use super::implicit_workdir;
use super::policy_load::{load_policy, log_policy_warnings};
use super::scratch::{self, Scratch};
use super::streams::{self, Streams};
use super::timeline::Timeline;
use crate::cli::RunArgs;
use crate::exec::egress::RunEgress;
use crate::exec::one::Pending;
use crate::exec::{RunError, Sandbox, workdir};
use crate::policy::{Identity, Limits, Policy};
use crate::sandbox::identity::{self, UidLease};

/// What lives as long as the run. Dropped on an early return in field order (the proxy, the
/// sandbox and its cgroups, the scratch tree, the uid leases last); [`Prepared::cleanup`] is
/// the order of a run that got to its report.
pub(super) struct Prepared {
    pub egress: Option<RunEgress>,
    pub sandbox: Sandbox,
    pub scratch: Option<Scratch>,
    /// The uid named explicitly, held shared: no per-run run may get it meanwhile.
    explicit_lease: Option<UidLease>,
    /// The uid of our own for this run, held until after the last kill sweep.
    lease: Option<UidLease>,
    pub limits: Limits,
    /// Who the command runs as.
    pub uid: u32,
    pub gid: u32,
}

/// The exec waiting in its init, its streams, and the workdir check it makes first.
pub(super) struct Launch {
    pub pending: Pending,
    pub streams: Streams,
    pub check: Option<workdir::WritableCheck>,
}

impl Prepared {
    /// With the report out: the scratch tree first (on a deep or wide tree its removal can
    /// take far longer than the run's --timeout, 37 s was seen, and nothing of the run's
    /// outcome waits for it; std's remove_dir_all walks by fd and never follows a symlink),
    /// then the proxy, the sandbox (its cgroup root and the group made ahead for a next exec),
    /// the leases.
    pub fn cleanup(self) {
        let Prepared {
            egress,
            sandbox,
            scratch,
            explicit_lease,
            lease,
            ..
        } = self;
        crate::pause::point("scratch-remove");
        drop(scratch);
        drop(egress);
        drop(sandbox);
        drop(lease);
        drop(explicit_lease);
    }
}

/// A run with no `--workdir` takes the current directory, unless that is a home or a system
/// tree (implicit_workdir.rs).
pub(super) fn refuse_implicit_workdir(args: &RunArgs, cwd: &Path) -> Result<(), RunError> {
    if args.flags.workdir.is_some() {
        return Ok(());
    }
    let (home, owner_home) = (
        implicit_workdir::home_env(),
        implicit_workdir::owner_home(cwd),
    );
    match implicit_workdir::refusal(cwd, home.as_deref(), owner_home.as_deref()) {
        Some(why) => Err(RunError::Usage(why)),
        None => Ok(()),
    }
}

/// A uid of our own for this run (see [`leases`]).
fn take_lease(args: &RunArgs) -> Result<UidLease, RunError> {
    UidLease::take(args.uid_range.start, args.uid_range.end).map_err(RunError::Identity)
}

/// Whether and when a run takes a uid of its own ([`leases`] says why it does): decided once,
/// from the flags, before anything is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PerRunUid {
    /// Root, and nothing can name an identity (no `--uid`, no `--gid`, no policy file): taken
    /// before the policy is loaded, so that the policy is validated as the uid the sandbox is
    /// made for, and the sandbox's second validation finds every grant already walked for that
    /// uid (the memo answers per uid; as `nobody` first, each grant was walked twice, about
    /// ninety system calls each time).
    BeforePolicy,
    /// Root, no `--uid` or `--gid`, and a policy file: taken once it is loaded, unless it
    /// names an identity.
    UnlessTheFileNamesOne,
    /// Not root, or an identity given by flag: none.
    Never,
}

fn per_run_uid(args: &RunArgs, root: bool) -> PerRunUid {
    if !root || args.policy.uid.is_some() || args.policy.gid.is_some() {
        PerRunUid::Never
    } else if args.policy_file.is_none() {
        PerRunUid::BeforePolicy
    } else {
        PerRunUid::UnlessTheFileNamesOne
    }
}

/// The uid leases of a run as root. With no --uid (or OPENSHELL_SANDBOX_UID): a uid of our
/// own for this run. Per-uid kernel budgets (inotify instances, fanotify groups, queued
/// signals, POSIX timers, RLIMIT_NPROC) are shared by every process of a uid, so with one
/// fixed uid a run could drain them for every concurrent run. A uid named explicitly is held
/// too, shared: no per-run run may get it meanwhile, and it is refused while one has it.
/// `taken` is the lease [`PerRunUid::BeforePolicy`] took.
fn leases(
    args: &RunArgs,
    (when, taken): (PerRunUid, Option<UidLease>),
    file_sets_identity: bool,
    policy: &mut Policy,
    root: bool,
) -> Result<(Option<UidLease>, Option<UidLease>), RunError> {
    let lease = match (when, taken) {
        (_, Some(lease)) => Some(lease),
        (PerRunUid::UnlessTheFileNamesOne, None) if !file_sets_identity => {
            let lease = take_lease(args)?;
            policy.set_identity(Identity {
                uid: lease.uid,
                gid: lease.uid,
            });
            Some(lease)
        }
        _ => None,
    };
    // What the run writes to its workdir and `--rw` grants belongs to each one's owner
    // (idmapped mounts); where they are refused, a workdir of the sandbox's uids is handed to
    // the run's uid for the run (sandbox/ownership.rs, exec/workdir).
    if root {
        policy.fs.write_as = crate::policy::WriteAs::Owner {
            hand_over: args.uid_range.start..=args.uid_range.end,
        };
    }
    let explicit = match policy.identity {
        Some(id) if root && lease.is_none() => {
            UidLease::share(id.uid).map_err(RunError::Identity)?
        }
        _ => None,
    };
    Ok((lease, explicit))
}

/// Every write of a run in a workdir it cannot write fails, while the report would say "all
/// layers enforced": asked as whom the kernel checks the command there (its owner through an
/// idmapped mount; after a hand-over, the run's uid), by the command itself before anything
/// of it runs.
fn workdir_check(sandbox: &Sandbox, leased: bool) -> Option<workdir::WritableCheck> {
    sandbox
        .ownership()
        .workdir_writer()
        .map(|who| workdir::WritableCheck {
            who,
            chown_to: if leased {
                Identity {
                    uid: crate::policy::NOBODY,
                    gid: crate::policy::NOBODY,
                }
            } else {
                who
            },
            as_owner: Some(who) != sandbox.policy().identity,
        })
}

/// The policy, the leases, the scratch tree, the environment, the sandbox with its exec
/// waiting in its init, and the proxy listening in the sandbox's network namespace.
pub(super) fn prepare(
    args: &RunArgs,
    cwd: &Path,
    tl: &mut Timeline,
) -> Result<(Prepared, Launch), RunError> {
    // The policy is validated where it is loaded and again, with the run's identity and its
    // scratch grant, when the sandbox is made: one memo over both asks each path's canonical
    // form once (sys::walk::Memo; the sandbox forgets it where it falls back).
    let memo = crate::sys::walk::Memo::begin();
    let root = crate::sys::process::euid() == 0;
    if let Some(dir) = &args.uid_lease_dir {
        identity::set_lease_dir(dir.clone());
    }
    let when = per_run_uid(args, root);
    let taken = match when {
        PerRunUid::BeforePolicy => Some(take_lease(args)?),
        _ => None,
    };
    let leased_flags = taken.as_ref().map(|l| crate::policy::PolicyFlags {
        uid: Some(l.uid),
        gid: Some(l.uid),
        ..args.flags.clone()
    });
    let loaded = load_policy(
        leased_flags.as_ref().unwrap_or(&args.flags),
        args.policy_file.as_deref(),
        cwd,
        &args.allow_net,
    )?;
    log_policy_warnings(args.policy_file.as_deref(), &loaded.warnings);
    let mut policy = loaded.policy;
    tl.stamp("policy");
    let (lease, explicit_lease) = leases(
        args,
        (when, taken),
        loaded.file_sets_identity,
        &mut policy,
        root,
    )?;
    let scratch = if args.scratch {
        Some(Scratch::create(policy.identity)?)
    } else {
        None
    };
    if let Some(s) = &scratch {
        policy.fs.read_write.push(s.path.clone());
    }
    let mut env = child_env(
        args,
        &policy.fs.workdir,
        scratch.as_ref().map(|s| s.path.as_path()),
    )?;
    if loaded.network.is_some() {
        crate::exec::egress::add_child_env(&mut env);
    }
    // Credentials and the CA before the sandbox: its view shows the CA's public files.
    let plan = crate::exec::egress::plan(&args.credential, loaded.network.as_ref(), &mut policy)?;
    let limits = policy.limits.clone();
    // Who the child runs as: the switched identity when we are root, else our own.
    let (uid, gid) = match policy.identity {
        Some(id) if root => (id.uid, id.gid),
        _ => (crate::sys::process::euid(), crate::sys::process::egid()),
    };
    tl.stamp("uid-scratch-env");
    // One run, one exec: its streams are made first, its init makes the view (exec/one.rs),
    // where the command gets a HOME of its own unless it was given one (scratch.rs).
    let home = scratch::home_request(args, root, (uid, gid), scratch.as_ref());
    // The trust variables and placeholders go with the command's environment now (its init
    // may hold it from here on); where the view then shows less than planned, they are
    // replaced before the command is spawned.
    let planned_env = plan.as_ref().map(|p| p.child_env()).unwrap_or_default();
    crate::exec::egress::set_child_env(&mut env, &planned_env);
    let (spec, streams) = streams::make(args, env)?;
    tl.stamp("streams");
    // The process's one supervisor context: the exec's init gets its pidfd, and its manager
    // (started only where needed) reaps the exec.
    let supervisor = crate::exec::Supervisor::new()?;
    let (sandbox, mut pending) = Sandbox::new_with_exec(&supervisor, policy, spec, home)?;
    drop(memo);
    // The proxy listens in the sandbox's network namespace before anything runs there.
    let egress = match (loaded.network, plan) {
        (Some(rules), Some(plan)) => {
            let e = RunEgress::start(&sandbox, rules, plan)?;
            if e.child_env() != planned_env.as_slice() {
                let unset: Vec<&str> = planned_env.iter().map(|(k, _)| k.as_str()).collect();
                if !pending.set_env(&unset, e.child_env()) {
                    return Err(RunError::Usage(
                        "the command's environment was handed to its init before the view \
                         could show the CA's files"
                            .into(),
                    ));
                }
            }
            Some(e)
        }
        _ => None,
    };
    tl.stamp("sandbox-new");
    let check = workdir_check(&sandbox, lease.is_some());
    for l in sandbox.layers() {
        tracing::info!(layer = l.layer, status = l.status.as_str(), detail = %l.detail, "sandbox layer");
    }
    tl.stamp("workdir");
    let prepared = Prepared {
        egress,
        sandbox,
        scratch,
        explicit_lease,
        lease,
        limits,
        uid,
        gid,
    };
    Ok((
        prepared,
        Launch {
            pending,
            streams,
            check,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(flags: &[&str]) -> RunArgs {
        let mut argv: Vec<std::ffi::OsString> = vec!["run".into()];
        argv.extend(flags.iter().map(|f| f.into()));
        argv.extend(["--", "/bin/true"].map(Into::into));
        RunArgs::parse_argv(&argv).unwrap()
    }

    /// One place says whether a run takes a uid of its own, and when.
    #[test]
    fn a_per_run_uid_is_decided_from_the_flags_once() {
        // The variable is read as `--uid`'s default.
        if std::env::var_os("OPENSHELL_SANDBOX_UID").is_some() {
            eprintln!("SKIPPED: OPENSHELL_SANDBOX_UID is set in this environment");
            return;
        }
        use PerRunUid::*;
        assert_eq!(per_run_uid(&args(&[]), true), BeforePolicy);
        assert_eq!(per_run_uid(&args(&[]), false), Never);
        assert_eq!(per_run_uid(&args(&["--uid", "1234"]), true), Never);
        assert_eq!(per_run_uid(&args(&["--gid", "1234"]), true), Never);
        assert_eq!(
            per_run_uid(&args(&["--policy", "/nonexistent.yaml"]), true),
            UnlessTheFileNamesOne
        );
        assert_eq!(
            per_run_uid(
                &args(&["--policy", "/nonexistent.yaml", "--uid", "7"]),
                true
            ),
            Never
        );
    }
}
