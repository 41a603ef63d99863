//! `run`'s sandbox, whose view serves one exec: the view is made by that exec's own init
//! (child/view_init.rs) instead of a helper ahead of it, so the two cost one process, one copy
//! of the mount tree and one teardown (BENCHMARKS.md has the figures).
//!
//! The kernel forces this order on one process: everything the init and its command need must
//! exist before the clone (the init is a fork and sees nothing made after it), so the layers
//! are prepared first, as [`super::prepare`] prepares them, and only what the view itself
//! decides comes after its report:
//! 1. the view's request and plan, the idmap user namespaces, the deny paths missing before
//!    the clone (as `prepare`), then Landlock, seccomp, identity, the cgroup root and limits
//!    (`Layers`), with the view's network namespace and private tmpfs taken as made; the
//!    ruleset has no rule for the directories only the view holds yet (the private tmpfs
//!    roots, the view's own files and the overlay that gives them a mount point: they do not
//!    exist), the init adds them;
//! 2. the exec's cgroup, then the clone with every namespace flag but the network's: that one
//!    this thread makes meanwhile (the kernel's ~0.4 ms for it, beside the init's mounts on
//!    the other core), and the init joins it when told to go;
//! 3. the report: every kind must have been made, and the missing deny paths must still be
//!    missing now that the mount tree was copied (the ruleset did not split around them);
//! 4. the namespace rows and the ownership decision, from the report, as `prepare` makes them.
//!
//! Anything short of that (a refused clone, a kind not made, a layer refused, a deny path that
//! appeared) drops what was made, kills the init, and the caller prepares the sandbox the way
//! every sandbox is prepared, which then reports exactly what is degraded or refused. Only a
//! root supervisor in the initial user namespace takes this path (namespaces/in_init.rs says
//! why).

use std::collections::BTreeSet;
use std::os::fd::RawFd;
use std::path::PathBuf;

use super::cgroup::ExecCgroup;
use super::child::init::ExecPlan;
use super::child::view_init::{ViewInit, clone_view_init};
use super::kernel::{Kernel, Real};
use super::layer::{LayerStatus, PrepareError};
use super::namespaces::{self, Kind, Outcome, ProcMount, UserNs, View, ViewError, view_of_init};
use super::prepare::{Cgroups, Layers};
use super::prepared::Prepared;
use super::run_timeline::stamp;
use super::view_layer::{self, ViewRule};
use crate::policy::{PathAccess, Policy};
use std::os::unix::ffi::OsStrExt;

/// The layers of a `run` prepared for its exec's init to make the view (see the module docs).
pub struct One {
    planned: view_layer::Planned,
    absent_before: BTreeSet<PathBuf>,
    user_rows: Vec<LayerStatus>,
    layers: Layers,
}

/// Why the one-process path was given up (for the debug log): the caller prepares the sandbox
/// as every sandbox is prepared instead.
#[derive(Debug)]
pub struct Fallback(pub String);

/// How [`One::start`] did not start.
#[derive(Debug)]
pub enum Start {
    Fallback(Fallback),
    /// The view the init made is refused, as `prepare` refuses it.
    Refused(PrepareError),
}

impl From<Fallback> for Start {
    fn from(f: Fallback) -> Start {
        Start::Fallback(f)
    }
}

/// Step 1 of the module docs. `Ok(None)` when this path is not for this supervisor, or when a
/// layer would be refused or degraded: the caller prepares as every sandbox does, and that
/// names the refusal with every row in its place.
pub fn prepare(policy: &Policy) -> Result<Option<One>, PrepareError> {
    let k = &Real;
    if k.euid() != 0 || k.user_ns() != UserNs::Root || test_denies_a_kind() {
        return Ok(None);
    }
    let absent_before = crate::policy::absent_root_only_denies(&policy.fs);
    stamp("sn-absent-before");
    let mut user_rows = Vec::new();
    view_layer::user_row(k, policy, &mut user_rows)?;
    let planned = view_layer::plan(k, policy);
    stamp("sn-view-plan");
    // The command's environment goes to this init before the view is made, with the trust
    // variables of the view's own files (the egress proxy's CA) when they are asked for: a
    // view that will not show them is prepared as every sandbox is, whose command gets its
    // environment once what the view shows is known.
    let shows_files = planned
        .plan
        .read_c_targets()
        .any(|(bit, _)| bit == super::view_root::FILES_MADE);
    if policy.namespaces.files.is_some() && !shows_files {
        return Ok(None);
    }
    // The directories only the view will hold: the init adds their rules once it made them.
    let targets = planned.plan.tmpfs_targets();
    let read: Vec<PathBuf> = planned
        .plan
        .read_c_targets()
        .map(|(_, d)| PathBuf::from(std::ffi::OsStr::from_bytes(d.to_bytes())))
        .collect();
    let dirs: Vec<ViewRule<'_>> = targets
        .iter()
        .map(|path| (path, PathAccess::ReadWrite))
        .chain(read.iter().map(|path| (path, PathAccess::ReadExec)))
        .map(|(path, access)| ViewRule {
            path,
            fd: None,
            access,
        })
        .collect();
    let private_net = planned.plan.private_net();
    let Ok(layers) = Layers::prepare(
        k,
        policy,
        Cgroups::Create,
        private_net,
        &absent_before,
        &dirs,
    ) else {
        return Ok(None);
    };
    stamp("sn-layers");
    if layers
        .rows
        .iter()
        .chain(&layers.limit_rows)
        .any(|r| r.status == super::Enforcement::Degraded)
    {
        return Ok(None);
    }
    Ok(Some(One {
        planned,
        absent_before,
        user_rows,
        layers,
    }))
}

/// Test builds only: the variables that make a namespace kind unavailable (kernel.rs,
/// namespaces.rs) are the helper's to honour.
fn test_denies_a_kind() -> bool {
    #[cfg(feature = "test-pause-points")]
    {
        ["OSB_TEST_DENY_PIDNS", "OSB_TEST_DENY_NETNS"]
            .iter()
            .any(|v| std::env::var_os(v).is_some_and(|v| v == "1"))
    }
    #[cfg(not(feature = "test-pause-points"))]
    false
}

impl One {
    /// Whether the exec's /tmp will be the view's private tmpfs.
    pub fn private_tmp(&self) -> bool {
        self.planned
            .plan
            .tmpfs_targets()
            .iter()
            .any(|t| t == std::path::Path::new("/tmp"))
    }

    /// Steps 2 to 4 of the module docs: the exec's cgroup, the init cloned (on the calling
    /// thread, which must outlive the exec) to build the view for `plan`'s command, and the
    /// sandbox decided from its report. The init then waits for [`ViewInit::go`].
    pub fn start(
        self,
        policy: &Policy,
        plan: &ExecPlan,
        supervisor_pidfd: RawFd,
    ) -> Result<(Prepared, ViewInit, Option<ExecCgroup>), Start> {
        let k = &Real;
        let One {
            planned,
            absent_before,
            user_rows,
            layers,
        } = self;
        let rows = layers.rows.clone();
        let limit_rows = layers.limit_rows.clone();
        // What the init will have made once it is told to go (anything short of it falls
        // back below): the command's steps read it, as the view-root listing rule.
        let placeholder = View {
            pid: true,
            proc: ProcMount::Full,
            root: planned.plan.root().is_some(),
            one_exec: true.into(),
            ..View::default()
        };
        let mut p = layers.into_prepared(k, policy, placeholder, Default::default(), Vec::new());
        stamp("sn-into-prepared");
        let cg = match &p.cgroups {
            Some(root) => {
                root.one_exec_only();
                let cg = root
                    .take_exec(&policy.limits)
                    .map_err(|e| Fallback(format!("the exec's cgroup: {e}")))?;
                Some(cg)
            }
            None => None,
        };
        stamp("sn-exec-cgroup");
        // Race tests hold the supervisor here: the walk has decided each grant's inode, the
        // init has not bound them yet.
        crate::pause::point("view-plan");
        let init = clone_view_init(&p, &planned.plan, plan, cg.as_ref(), supervisor_pidfd)
            .map_err(|e| Fallback(format!("cloning the exec's init: {e}")))?;
        stamp("sn-clone");
        // The network namespace, made here while the init builds the rest on the other core
        // (the init joins it when told to go). Not back in our own: refuse the run.
        let net = if planned.plan.private_net() {
            let back = namespaces::net_ns_here().map_err(|()| {
                Start::Refused(PrepareError::View(ViewError::Open {
                    what: "the supervisor's network namespace again",
                    source: std::io::Error::last_os_error(),
                }))
            })?;
            Some(back)
        } else {
            None
        };
        stamp("sn-netns");
        let rep = init.report().map_err(|e| {
            Fallback(match e {
                Some(e) => format!("the exec's init: {e}"),
                None => "the exec's init died before it reported".into(),
            })
        })?;
        stamp("sn-report");
        let after = crate::policy::absent_root_only_denies(&policy.fs);
        if !absent_before.is_subset(&after) {
            return Err(Fallback("a missing deny path appeared".into()).into());
        }
        stamp("sn-absent-after");
        let made = view_of_init(&rep, &planned.plan, net, init.pid());
        let private_net = planned.plan.private_net();
        let short: Vec<Kind> = Kind::ALL
            .into_iter()
            .filter(|&kind| {
                let want = match kind {
                    Kind::User => Outcome::NotRequested,
                    Kind::Net if !private_net => Outcome::NotRequested,
                    _ => Outcome::Made,
                };
                made.outcome(kind) != want
            })
            .collect();
        let why = short
            .iter()
            .map(|k| format!("{}: {:?}", k.layer(), made.outcome(*k)))
            .chain(made.ipc_limits.map(|e| format!("the IPC limits: {e}")))
            .collect::<Vec<_>>()
            .join("; ");
        // The view's root failed, and nothing else: built by the same steps as the helper's
        // (view_root.rs), so it is refused as `prepare` refuses it, from the same report. That
        // is final: another try would meet the same view, or one swapped since the walk, as
        // the race tests do. Anything else is made again by the helper's path, which also
        // builds what a degraded view still has.
        if short.as_slice() == [Kind::Mount] && made.ipc_limits.is_none() {
            let mut rows = Vec::new();
            view_layer::made(k, policy, planned, made, &mut rows).map_err(Start::Refused)?;
            return Err(Fallback(why).into());
        }
        if !why.is_empty() {
            return Err(Fallback(why).into());
        }
        // The ruleset counted on the view's own files (and their overlay): the helper's path
        // reports exactly what is not shown where they were not made.
        let planned_read = planned.plan.read_c_targets().count();
        let made_read = [&made.view.files, &made.view.overlay]
            .iter()
            .flat_map(|d| d.iter())
            .count();
        if made_read != planned_read {
            return Err(Fallback("the view's own files were not made".into()).into());
        }
        if made.view.root != p.view.root {
            return Err(Fallback("the view's root is not the one planned".into()).into());
        }
        let mut ns_rows = user_rows;
        let (view, ownership) =
            view_layer::made(k, policy, planned, made, &mut ns_rows).map_err(Start::Refused)?;
        ns_rows.extend(rows);
        ns_rows.push(super::decide::ownership_row(&ownership));
        ns_rows.extend(limit_rows);
        p.layers = ns_rows;
        p.view = view;
        p.ownership = ownership;
        super::prepare::dump_installed(&p);
        stamp("sn-made");
        Ok((p, init, cg))
    }
}
