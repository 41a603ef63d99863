//! The namespace layer of `prepare`: what the view must hold (the request, from the
//! filesystem policy), its plan, and once it was made (or not) a row per kind and whose ids
//! the writes to the read-write grants carry. Shared by the view made ahead (`prepare`, for
//! every sandbox) and the one an exec's own init makes (`one.rs`, for `run`).

use super::idmap::{self, IdSwap};
use super::kernel::Kernel;
use super::layer::{Enforcement, LayerStatus, PrepareError};
use super::namespaces::{Kind, Outcome, ProcMount, UserNs, View, ViewMade, ViewPlan, ViewRequest};
use super::ownership::{self, Ownership};
use super::step::Step;
use super::{decide, namespaces, view_links};
use crate::policy::{NetworkMode, Policy};

fn degrade_row(
    policy: &Policy,
    layer: &'static str,
    reason: String,
    layers: &mut Vec<LayerStatus>,
) -> Result<(), PrepareError> {
    decide::degrade(policy.allow_degraded, layer, reason, layers)
}

use decide::row;

/// The Landlock rule of a directory that exists only in the view, another inode than any the
/// supervisor can name: a private tmpfs root (every right), the view's own files and the
/// overlay that gives them a mount point (read, as the grant the overlay shows). Added here by
/// the descriptor the view opened on it, or, with no descriptor, by the exec's init that
/// mounts it (`one.rs`).
pub(crate) struct ViewRule<'a> {
    pub(crate) path: &'a std::path::Path,
    pub(crate) fd: Option<&'a std::os::fd::OwnedFd>,
    pub(crate) access: crate::policy::PathAccess,
}

impl<'a> ViewRule<'a> {
    /// The rules of the directories `view` made.
    pub(super) fn of(view: &'a super::namespaces::View) -> Vec<ViewRule<'a>> {
        let rule =
            |(path, fd): &'a (std::path::PathBuf, Option<std::os::fd::OwnedFd>), access| ViewRule {
                path,
                fd: fd.as_ref(),
                access,
            };
        view.tmpfs
            .iter()
            .map(|t| rule(t, crate::policy::PathAccess::ReadWrite))
            .chain(
                [&view.files, &view.overlay]
                    .into_iter()
                    .flatten()
                    .map(|t| rule(t, crate::policy::PathAccess::ReadExec)),
            )
            .collect()
    }
}

/// What the view must hold and hide, from the filesystem policy. Every grant is resolved by
/// the policy's symlink-safe walk (as Landlock's rules are): the view binds the inode that walk
/// decided on, by its device and inode numbers, or fails. A grant that does not resolve (a
/// missing system directory, a link the sandbox could have planted) is left out, as it is
/// from the Landlock rules.
fn view_request(policy: &Policy) -> ViewRequest {
    let fs = &policy.fs;
    let walker = fs.walker();
    let resolve = |p: &std::path::Path, read_only: bool| {
        walker.resolve(p).ok().map(|r| namespaces::Grant {
            path: r.path,
            read_only,
            dir: r.meta.is_dir(),
            dev: r.meta.dev,
            ino: r.meta.ino,
            owner: crate::policy::Identity {
                uid: r.meta.uid,
                gid: r.meta.gid,
            },
            mode: r.meta.mode,
            idmap: None,
        })
    };
    let written: Vec<(&std::path::PathBuf, bool)> = std::iter::once(&fs.workdir)
        .chain(&fs.read_write)
        .chain(&fs.devices)
        .map(|p| (p, false))
        .chain(fs.read_only.iter().chain(&fs.system).map(|p| (p, true)))
        .collect();
    let mut grants = Vec::new();
    let mut links = Vec::new();
    let mut workdir = None;
    for (p, read_only) in written {
        let Some(g) = resolve(p, read_only) else {
            continue;
        };
        if std::ptr::eq(p, &fs.workdir) {
            workdir = Some(grants.len());
        }
        // The links met on the way, as the walk followed them (it trusted each one): the
        // first one below `/` is recreated in the view; what it leads to is a grant itself.
        if g.path != *p {
            for anc in p.ancestors().collect::<Vec<_>>().into_iter().rev().skip(1) {
                if let Ok(target) = std::fs::read_link(anc) {
                    links.push((anc.to_path_buf(), target));
                    break;
                }
            }
        }
        grants.push(g);
    }
    // The terminal's devpts, read-only and with no Landlock rule: a pty handed over as a
    // descriptor (the tty main process, a terminal `run`) keeps its name (`tty`, ttyname
    // stats /dev/pts/N). No other pty can be opened; /dev/ptmx stays absent unless granted.
    if let Some(pts) = resolve(std::path::Path::new("/dev/pts"), true) {
        grants.push(pts);
    }
    let proc = resolve(std::path::Path::new("/proc"), false);
    let denied: Vec<std::path::PathBuf> = fs
        .deny
        .iter()
        .filter_map(|p| crate::sys::walk::canonical(p).ok())
        .collect();
    // The links of the host's root (and of each directory made on the way to a grant) whose
    // target the view holds (view_links.rs). The private tmpfs mounts are where
    // `ViewPlan::new` puts them: /tmp and /dev/shm, unless a grant covers them.
    let tmpfs: Vec<std::path::PathBuf> = ["/tmp", "/dev/shm"]
        .iter()
        .filter_map(|t| crate::sys::walk::canonical(std::path::Path::new(t)).ok())
        .filter(|t| !grants.iter().any(|g| t.starts_with(&g.path)))
        .collect();
    for l in view_links::reproduced(&walker, &grants, &denied, &tmpfs) {
        if !links.contains(&l) {
            links.push(l);
        }
    }
    namespaces::ViewRequest {
        private_net: policy.network == NetworkMode::None,
        hostname: policy.namespaces.hostname.clone(),
        tmp_size: policy.namespaces.tmp_size,
        shm_size: policy.namespaces.shm_size,
        grants,
        denied,
        proc,
        proc_read: fs.proc_read,
        links,
        workdir,
        // SAFETY: sysconf has no preconditions.
        ipc: crate::policy::IpcLimits::for_budget(policy.namespaces.shm_size, unsafe {
            libc::sysconf(libc::_SC_PAGESIZE).max(1) as u64
        }),
        ipc_userns: None,
        files: policy.namespaces.files.clone(),
    }
}

/// The namespace layer: one row per kind, fail closed per kind.
pub(super) fn prepare_namespaces(
    k: &dyn Kernel,
    policy: &Policy,
    layers: &mut Vec<LayerStatus>,
) -> Result<(View, Ownership), PrepareError> {
    if !user_row(k, policy, layers)? {
        return without_namespaces(k, policy, layers);
    }
    let planned = plan(k, policy);
    // Race tests hold the supervisor here: the walk has decided each grant's inode, the
    // helper has not bound them yet.
    crate::pause::point("view-plan");
    let probe = k.make_view(&planned.plan)?;
    made(k, policy, planned, probe, layers)
}

/// The row of the supervisor's own user namespace: whether a view can be made at all.
pub(super) fn user_row(
    k: &dyn Kernel,
    policy: &Policy,
    layers: &mut Vec<LayerStatus>,
) -> Result<bool, PrepareError> {
    let usable = match k.user_ns() {
        UserNs::Root => {
            row(
                layers,
                Kind::User.layer(),
                Enforcement::NotRequested,
                "the supervisor is root: the view is owned by its user namespace".into(),
            );
            true
        }
        UserNs::Entered => {
            let euid = k.euid();
            row(
                layers,
                Kind::User.layer(),
                Enforcement::Enforced,
                format!(
                    "not root: the supervisor runs in a user namespace of its own (uid {euid} maps to itself), which owns the view"
                ),
            );
            true
        }
        UserNs::Unavailable(e) => {
            degrade_row(
                policy,
                Kind::User.layer(),
                format!("not root, and no user namespace is allowed here ({e})"),
                layers,
            )?;
            false
        }
        UserNs::NotTried => {
            degrade_row(
                policy,
                Kind::User.layer(),
                "not root, and the supervisor did not enter a user namespace".into(),
                layers,
            )?;
            false
        }
    };
    Ok(usable)
}

/// The kinds of the view, in the rows' order.
const KINDS: [Kind; 5] = [Kind::Pid, Kind::Mount, Kind::Ipc, Kind::Uts, Kind::Net];

/// No user namespace to own a view: a degraded row per kind (or an error), no view.
fn without_namespaces(
    k: &dyn Kernel,
    policy: &Policy,
    layers: &mut Vec<LayerStatus>,
) -> Result<(View, Ownership), PrepareError> {
    for kind in KINDS {
        if kind == Kind::Net && policy.network == NetworkMode::All {
            row(
                layers,
                kind.layer(),
                Enforcement::NotRequested,
                "--network all".into(),
            );
            continue;
        }
        degrade_row(
            policy,
            kind.layer(),
            "needs a user namespace (see namespace-user)".into(),
            layers,
        )?;
    }
    let req = view_request(policy);
    let ownership = Ownership::decide(policy, k.euid(), &req.grants, req.workdir, &[], None, &[]);
    Ok((View::default(), ownership))
}
/// What the view is to be, decided before it is made: the request, the user namespaces of
/// the idmapped binds (one per mapping, held until the process that builds the view, which
/// inherits them, has built it) and the plan.
pub(super) struct Planned {
    pub(super) req: ViewRequest,
    userns: Vec<(IdSwap, std::io::Result<idmap::UserNs>)>,
    pub(super) plan: ViewPlan,
}

/// The request, its idmap user namespaces and the plan (see [`Planned`]).
pub(super) fn plan(k: &dyn Kernel, policy: &Policy) -> Planned {
    let mut req = view_request(policy);
    let sandbox = policy.identity.filter(|_| k.euid() == 0);
    let mut userns: Vec<(IdSwap, std::io::Result<idmap::UserNs>)> = Vec::new();
    if let (Some(sb), crate::policy::WriteAs::Owner { .. }) = (sandbox, &policy.fs.write_as) {
        let wanted = ownership::wanted(&req.grants, sb);
        for (g, w) in req.grants.iter_mut().zip(wanted) {
            let Some(swap) = w else { continue };
            if !userns.iter().any(|(s, _)| *s == swap) {
                userns.push((swap, k.idmap_userns(&swap)));
            }
            if let Some((_, Ok(ns))) = userns.iter().find(|(s, _)| *s == swap) {
                use std::os::fd::AsRawFd;
                g.idmap = Some(namespaces::Idmap {
                    swap,
                    userns: ns.fd.as_raw_fd(),
                });
            }
        }
    }
    if k.user_ns() == UserNs::Entered {
        // SAFETY: getegid has no preconditions.
        req.ipc_userns = Some((k.euid(), unsafe { libc::getegid() }));
    }
    let plan = ViewPlan::new(&req);
    Planned { req, userns, plan }
}

/// Once the view was made (or not): whose ids the writes carry, and a row per kind.
pub(super) fn made(
    k: &dyn Kernel,
    policy: &Policy,
    planned: Planned,
    probe: ViewMade,
    layers: &mut Vec<LayerStatus>,
) -> Result<(View, Ownership), PrepareError> {
    let Planned { req, userns, plan } = planned;
    let mut view = probe.view;
    let mut failed: Vec<(IdSwap, std::io::Error)> = Vec::new();
    for (s, r) in userns {
        match r {
            // Kept with the view: its throwaway child is reaped only when the view goes, long
            // after it exited, instead of waiting here for it to be scheduled at all.
            Ok(ns) => view.idmap_userns.push(ns),
            Err(e) => failed.push((s, e)),
        }
    }
    let ownership = Ownership::decide(
        policy,
        k.euid(),
        &req.grants,
        req.workdir,
        &failed,
        plan.root().filter(|_| view.root),
        &view.idmap,
    );
    for kind in KINDS {
        let outcome = probe.outcomes[kind as usize];
        let enforced = match kind {
            Kind::Pid => match view.proc {
                ProcMount::SubsetPid => "a PID namespace per exec, PID 1 is its init; /proc mounted with subset=pid (non-initial user namespace)".to_string(),
                _ => "a PID namespace per exec, PID 1 is its init; a fresh /proc".to_string(),
            },
            Kind::Mount => {
                let tmpfs: Vec<String> = view
                    .tmpfs
                    .iter()
                    .map(|(p, _)| {
                        let size = if p == std::path::Path::new("/tmp") {
                            req.tmp_size
                        } else {
                            req.shm_size
                        };
                        format!("{} ({} MiB)", p.display(), size >> 20)
                    })
                    .collect();
                let skipped: Vec<String> = ["/tmp", "/dev/shm"]
                    .iter()
                    .filter(|t| !plan.tmpfs_targets().iter().any(|p| p == std::path::Path::new(t)))
                    .map(|t| format!("; {t} is itself granted and stays as it is"))
                    .collect();
                let root = match plan.root() {
                    Some(r) if view.root => format!(
                        "a root of the granted paths only ({} binds; top level {}){}, nothing else exists; ",
                        r.bind_count(),
                        r.top_level().join(" "),
                        if view.chroot.is_some() {
                            ", entered with chroot (pivot_root is refused here: the old root stays below it in the namespace)"
                        } else {
                            ""
                        }
                    ),
                    _ => "the policy grants /: the view's root is the supervisor's; ".into(),
                };
                format!(
                    "{root}private propagation; private tmpfs mode 1777 on {}{}",
                    tmpfs.join(" and "),
                    skipped.concat()
                )
            }
            Kind::Ipc => format!(
                "private SysV IPC and POSIX message queues; {}",
                req.ipc.describe()
            ),
            Kind::Uts => format!("hostname {}", req.hostname),
            Kind::Net => "a network namespace with only lo, up".to_string(),
            Kind::User => unreachable!("not in `kinds`"),
        };
        match outcome {
            Outcome::Made if kind == Kind::Ipc && probe.ipc_limits.is_some() => {
                let e = probe.ipc_limits.expect("checked");
                degrade_row(
                    policy,
                    kind.layer(),
                    format!(
                        "private SysV IPC and POSIX message queues, but its limits could not be set ({e}): what an exec leaves there (shared memory segments, message queues, semaphores) is bounded only by the kernel's defaults"
                    ),
                    layers,
                )?
            }
            Outcome::Made => row(layers, kind.layer(), Enforcement::Enforced, enforced),
            Outcome::NotRequested if kind == Kind::Net => row(
                layers,
                kind.layer(),
                Enforcement::NotRequested,
                "--network all: the supervisor's network namespace".into(),
            ),
            Outcome::NotRequested => {
                degrade_row(policy, kind.layer(), "not attempted".into(), layers)?
            }
            Outcome::Failed(e) if kind == Kind::Mount && !view.root => {
                let at = match (e.step, plan.root()) {
                    (
                        Step::OpenGrant
                        | Step::MakeMountpoint
                        | Step::BindGrant
                        | Step::RemountGrantReadOnly
                        | Step::MountTmpfs
                        | Step::HideDenied
                        | Step::MakeViewLink,
                        Some(r),
                    ) => r
                        .entry_path(e.detail)
                        .map(|p| format!(" (at {p})"))
                        .unwrap_or_default(),
                    _ => String::new(),
                };
                degrade_row(
                    policy,
                    kind.layer(),
                    format!(
                        "{e}{at}: no root of the granted paths only, so paths outside the grants stay visible (pathname unix sockets can be connected to, stat and inotify probe them)"
                    ),
                    layers,
                )?
            }
            Outcome::Failed(e) => degrade_row(policy, kind.layer(), e.to_string(), layers)?,
        }
    }
    Ok((view, ownership))
}
