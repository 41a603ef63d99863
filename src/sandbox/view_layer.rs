//! The namespace layer of `prepare`: what the view must hold (the request, from the
//! filesystem policy), its plan, and once it was made (or not) whose ids the writes to the
//! read-write grants carry and the facts its rows are decided on (`decide::view_rows`). Shared by the view made ahead (`prepare`, for
//! every sandbox) and the one an exec's own init makes (`one.rs`, for `run`).

use super::idmap::{self, IdSwap};
use super::kernel::Kernel;
use super::layer::{LayerStatus, PrepareError};
use super::namespaces::{Kind, Outcome, UserNs, View, ViewMade, ViewPlan, ViewRequest};
use super::ownership::{self, Ownership};
use super::step::{ChildError, Step};
use super::{decide, namespaces, view_links};
use crate::policy::{NetworkMode, Policy};

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
        walker
            .resolve_path(p)
            .ok()
            .map(|(path, meta)| namespaces::Grant {
                path,
                read_only,
                dir: meta.is_dir(),
                dev: meta.dev,
                ino: meta.ino,
                owner: crate::policy::Identity {
                    uid: meta.uid,
                    gid: meta.gid,
                },
                mode: meta.mode,
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
    decide::user_ns_row(policy.allow_degraded, &k.user_ns(), k.euid(), layers)
}

/// No user namespace to own a view: a degraded row per kind (or an error), no view.
fn without_namespaces(
    k: &dyn Kernel,
    policy: &Policy,
    layers: &mut Vec<LayerStatus>,
) -> Result<(View, Ownership), PrepareError> {
    decide::no_view_rows(policy.allow_degraded, policy.network, layers)?;
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
    super::run_timeline::stamp("sn-view-request");
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
        req.ipc_userns = Some((k.euid(), crate::sys::process::egid()));
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
    let root = plan.root();
    let facts = decide::ViewFacts {
        outcomes: probe.outcomes,
        ipc_limits: probe.ipc_limits,
        proc: view.proc,
        tmpfs: view
            .tmpfs
            .iter()
            .map(|(p, _)| {
                let size = if p == std::path::Path::new("/tmp") {
                    req.tmp_size
                } else {
                    req.shm_size
                };
                (p.clone(), size)
            })
            .collect(),
        tmpfs_granted: ["/tmp", "/dev/shm"]
            .into_iter()
            .filter(|t| {
                !plan
                    .tmpfs_targets()
                    .iter()
                    .any(|p| p == std::path::Path::new(t))
            })
            .collect(),
        root_made: view.root,
        root: root.filter(|_| view.root).map(|r| decide::RootFacts {
            binds: r.bind_count(),
            top_level: r.top_level(),
            chroot: view.chroot.is_some(),
        }),
        mount_failed_at: match (probe.outcomes[Kind::Mount.index()], root) {
            (
                Outcome::Failed(ChildError {
                    step:
                        Step::OpenGrant
                        | Step::MakeMountpoint
                        | Step::BindGrant
                        | Step::RemountGrantReadOnly
                        | Step::MountTmpfs
                        | Step::HideDenied
                        | Step::MakeViewLink,
                    detail,
                    ..
                }),
                Some(r),
            ) => r.entry_path(detail),
            _ => None,
        },
        ipc: req.ipc.describe(),
        hostname: req.hostname.clone(),
    };
    decide::view_rows(policy.allow_degraded, &facts, layers)?;
    Ok((view, ownership))
}
