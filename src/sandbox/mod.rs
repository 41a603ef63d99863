//! The isolation layers, and the one place that fixes their order.
//!
//! Two phases (style habit 3):
//! - [`prepare`] runs in the supervisor, privileged and multi-threaded: it checks what the kernel
//!   supports, refuses (fails closed) when the policy cannot be fully enforced unless degraded
//!   runs were allowed, and builds every kernel object: the view (namespaces.rs; its mount
//!   namespace has a root of its own holding only the granted paths, view_root.rs, built
//!   first because Landlock then grants the view's private tmpfs roots), the Landlock
//!   ruleset fd, the seccomp program, the rlimit values, the identity, the cgroup.
//!   Landlock stays the access policy; the view's root is defence in depth and closes what
//!   Landlock ABI < 9 cannot see (connect to pathname unix sockets, stat, inotify).
//! - [`child::enforce_in_child`] runs in the forked child between fork and exec. The supervisor
//!   is a multi-threaded tokio process, so after fork only async-signal-safe work is allowed:
//!   no allocation, no locks, no logging. Every step there is a raw syscall on prepared data.
//!   We chose this over re-executing a single-threaded helper because it costs one exec
//!   instead of two (see BENCHMARKS.md).
//!
//! The order of the child's steps, and why each comes where it does, is written once, in
//! child/mod.rs.

pub mod cgroup;
pub mod cgroup_remount;
pub mod child;
pub mod decide;
pub mod devnull;
pub mod diagnose;
pub mod grant;
pub mod identity;
pub mod idmap;
pub mod kernel;
pub mod landlock;
pub mod namespaces;
pub mod ownership;
pub mod rlimits;
pub mod seccomp;
pub use child::{ChildError, Step, init, process};
mod view_links;
pub mod view_root;

use seccompiler::BpfProgram;

use crate::policy::{FsRule, NetworkMode, PathAccess, Policy, expand_grants_skipping};

pub use crate::sys::errno;

/// Whether one layer is fully in force. Spelt as [`Enforcement::as_str`] everywhere: the
/// report JSON, `check`, the log and the docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Enforcement {
    /// Exactly what the policy asked for.
    Enforced,
    /// Weaker than asked; only allowed with `--allow-degraded`.
    Degraded,
    /// Not requested by the policy (e.g. Landlock TCP rules with `--network all`).
    NotRequested,
}

impl Enforcement {
    /// `enforced`, `degraded` or `not_requested`, as the report JSON has it.
    pub fn as_str(self) -> &'static str {
        match self {
            Enforcement::Enforced => "enforced",
            Enforcement::Degraded => "degraded",
            Enforcement::NotRequested => "not_requested",
        }
    }
}

/// One row of the report: a layer and what was enforced.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LayerStatus {
    pub layer: &'static str,
    pub status: Enforcement,
    pub detail: String,
}

#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("layer `{layer}` cannot be enforced: {reason} (pass --allow-degraded to run anyway)")]
    NotEnforceable { layer: &'static str, reason: String },
    #[error("preparing the Landlock ruleset: {0}")]
    Landlock(#[from] landlock::LandlockError),
    #[error("compiling the seccomp filter: {0}")]
    Seccomp(#[from] seccomp::SeccompError),
    #[error("expanding the filesystem rules: {0}")]
    FsRules(std::io::Error),
    #[error("building the sandbox view: {0}")]
    View(#[from] namespaces::ViewError),
}

/// Everything the child needs, built once.
#[derive(Debug)]
pub struct Prepared {
    pub landlock: Option<landlock::PreparedRuleset>,
    pub seccomp: Option<BpfProgram>,
    pub rlimits: Vec<rlimits::Rlimit>,
    pub identity: identity::Switch,
    pub cgroups: Option<cgroup::Root>,
    /// The namespaces every exec joins (empty when none could be made).
    pub view: namespaces::View,
    /// Whose ids the writes to the workdir and the `--rw` grants carry, and whether `run` hands
    /// the workdir over (ownership.rs).
    pub ownership: ownership::Ownership,
    /// The policy grants read on /proc (so on the exec's fresh /proc too).
    pub proc_rule: bool,
    pub layers: Vec<LayerStatus>,
    pub landlock_abi: i32,
    /// The Landlock path rules as installed (path, access, is a directory), for
    /// `check --explain`: what the ruleset holds, not what the policy's lists expand to.
    pub fs_rules: Vec<(std::path::PathBuf, PathAccess, bool)>,
    /// The supervisor's pid, for the parent-death race check.
    pub supervisor_pid: libc::pid_t,
    /// The network rules the seccomp filter and the Landlock ruleset were built for.
    pub network: decide::Network,
    /// The rules installed in every command, in words (`check --explain`).
    pub installed: decide::Installed,
}

/// Whether this kernel can install seccomp filters.
pub fn seccomp_available() -> bool {
    // SAFETY: PR_GET_SECCOMP only returns a number; the action query reads a stack u32.
    unsafe {
        if libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) < 0 {
            return false;
        }
        let action: u32 = 0x8000_0000; // SECCOMP_RET_KILL_PROCESS
        libc::syscall(
            libc::SYS_seccomp,
            2u32, /* SECCOMP_GET_ACTION_AVAIL */
            0u32,
            &action,
        ) == 0
    }
}

/// Build every kernel object for `policy`, refusing when a requested layer cannot be enforced
/// and `policy.allow_degraded` is false.
pub fn prepare(policy: &Policy) -> Result<Prepared, PrepareError> {
    let p = prepare_inner(&kernel::Real, policy, Cgroups::Create)?;
    dump_installed(&p);
    Ok(p)
}

/// For the tests that compare `check --explain` with a run: with `OSB_DUMP_INSTALLED=FILE`,
/// the rules a run's commands get, as JSON. Only with the `test-pause-points` feature.
#[cfg(feature = "test-pause-points")]
fn dump_installed(p: &Prepared) {
    if let Some(path) = std::env::var_os("OSB_DUMP_INSTALLED")
        && let Ok(json) = serde_json::to_vec(&p.installed)
    {
        let _ = std::fs::write(path, json);
    }
}

#[cfg(not(feature = "test-pause-points"))]
#[inline(always)]
fn dump_installed(_: &Prepared) {}

/// [`prepare`] for `check`: the same decisions, but with no lasting side effect on the
/// system: no cgroup is made, no process moved, no other supervisor's group swept. (The view
/// is made and dropped again: its namespaces die with their descriptors.)
pub fn prepare_dry(policy: &Policy) -> Result<Prepared, PrepareError> {
    prepare_inner(&kernel::Real, policy, Cgroups::ProbeOnly)
}

/// [`prepare`] against any [`kernel::Kernel`] (a fake one in the unit tests).
pub fn prepare_with(k: &dyn kernel::Kernel, policy: &Policy) -> Result<Prepared, PrepareError> {
    prepare_inner(k, policy, Cgroups::Create)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Cgroups {
    Create,
    ProbeOnly,
}

fn prepare_inner(
    k: &dyn kernel::Kernel,
    policy: &Policy,
    cgroup_mode: Cgroups,
) -> Result<Prepared, PrepareError> {
    let mut layers = Vec::new();
    let degrade = |layer: &'static str, reason: String, layers: &mut Vec<LayerStatus>| {
        decide::degrade(policy.allow_degraded, layer, reason, layers)
    };

    // Deny paths that are missing and that only root could create, before the view copies
    // the mount tree and again after (policy::absent_root_only_denies says why both).
    let absent_before = crate::policy::absent_root_only_denies(&policy.fs);
    // Namespaces first: the view's private tmpfs roots get Landlock rules below.
    let (view, ownership) = prepare_namespaces(k, policy, &mut layers)?;
    // With the view's mount namespace (private propagation), a secret mounted at a missing
    // deny path later never appears in it: nothing there to split a grant around, and /etc
    // stays one rule instead of one per entry. Without it (degraded), keep every split.
    let unsplit = if view.mnt.is_some() && !absent_before.is_empty() {
        let after = crate::policy::absent_root_only_denies(&policy.fs);
        absent_before.intersection(&after).cloned().collect()
    } else {
        Default::default()
    };

    let network = decide::network(policy.network, view.net.is_some());
    let decide::Network {
        socket_rules,
        loopback_only,
    } = network;

    // Landlock.
    let mut landlock_abi = 0;
    let mut fs_rules = Vec::new();
    let landlock = match k.landlock() {
        Ok(support) if support.filesystem => {
            landlock_abi = support.abi;
            let mut rules =
                expand_grants_skipping(&policy.fs, &unsplit).map_err(PrepareError::FsRules)?;
            // The view's tmpfs roots are other inodes than the supervisor's /tmp: grant them
            // by the descriptor the view opened on each root.
            for (path, fd) in &view.tmpfs {
                let fd = fd.try_clone().map_err(PrepareError::FsRules)?;
                rules.push(FsRule {
                    path: path.clone(),
                    access: PathAccess::ReadWrite,
                    is_dir: true,
                    fd: std::sync::Arc::new(fd),
                });
            }
            fs_rules = rules
                .iter()
                .map(|r| (r.path.clone(), r.access, r.is_dir))
                .collect();
            let p = landlock::prepare(&rules, socket_rules, support)?;
            layers.push(LayerStatus {
                layer: "landlock-fs",
                status: Enforcement::Enforced,
                detail: format!("ABI {}, {} path rules", support.abi, rules.len()),
            });
            match (socket_rules, p.network_restricted) {
                _ if loopback_only => layers.push(LayerStatus {
                    layer: "landlock-net",
                    status: Enforcement::NotRequested,
                    detail: "--network none in a private network namespace with only lo: loopback bind and connect allowed, any other connect is ENETUNREACH".into(),
                }),
                (NetworkMode::None, true) => layers.push(LayerStatus {
                    layer: "landlock-net",
                    status: Enforcement::Enforced,
                    detail: "TCP bind and connect denied".into(),
                }),
                (NetworkMode::None, false) => degrade(
                    "landlock-net",
                    format!("Landlock ABI {} < 4 cannot restrict TCP", support.abi),
                    &mut layers,
                )?,
                (NetworkMode::All, _) => layers.push(LayerStatus {
                    layer: "landlock-net",
                    status: Enforcement::NotRequested,
                    detail: "--network all".into(),
                }),
            }
            if p.scoped {
                layers.push(LayerStatus {
                    layer: "landlock-scope",
                    status: Enforcement::Enforced,
                    detail: "signals and abstract unix sockets scoped to the sandbox".into(),
                });
            } else {
                degrade(
                    "landlock-scope",
                    format!(
                        "Landlock ABI {} < 6 cannot scope signals and abstract sockets",
                        support.abi
                    ),
                    &mut layers,
                )?;
            }
            Some(p)
        }
        Ok(_) => {
            degrade("landlock-fs", "Landlock reports ABI 0".into(), &mut layers)?;
            None
        }
        Err(e) => {
            degrade("landlock-fs", e, &mut layers)?;
            None
        }
    };

    // seccomp.
    let seccomp = if k.seccomp_available() {
        let prog = seccomp::build(socket_rules)?;
        layers.push(LayerStatus {
            layer: "seccomp",
            status: Enforcement::Enforced,
            detail: format!("{} BPF instructions", prog.len()),
        });
        Some(prog)
    } else {
        degrade(
            "seccomp",
            "the kernel cannot install seccomp filters".into(),
            &mut layers,
        )?;
        None
    };

    // Identity.
    let euid = k.euid();
    let identity = identity::prepare(if euid == 0 { policy.identity } else { None });
    match (euid, policy.identity) {
        (0, Some(id)) => layers.push(LayerStatus {
            layer: "identity",
            status: Enforcement::Enforced,
            detail: format!(
                "uid {} gid {}, no supplementary groups, every capability set empty, no_new_privs",
                id.uid, id.gid
            ),
        }),
        (0, None) => degrade(
            "identity",
            "running as root with no target uid".into(),
            &mut layers,
        )?,
        (uid, Some(id)) if id.uid != uid => degrade(
            "identity",
            format!("not root (uid {uid}): cannot switch to uid {}", id.uid),
            &mut layers,
        )?,
        (uid, _) => {
            // Not root: setgroups needs CAP_SETGID, so the child inherits every supplementary
            // group we hold. Pathname unix sockets are not checked by Landlock ABI 7, so a
            // member of e.g. `docker` reaches /var/run/docker.sock: that is not "enforced".
            let groups = k.supplementary_groups();
            if groups.is_empty() {
                layers.push(LayerStatus {
                    layer: "identity",
                    status: Enforcement::Enforced,
                    detail: format!(
                        "not root: child keeps uid {uid} (files of this uid are guarded by Landlock only), no supplementary groups; capabilities cleared, no_new_privs"
                    ),
                })
            } else {
                degrade(
                    "identity",
                    format!(
                        "not root (uid {uid}): the child would keep the supplementary groups {}, which only root can drop",
                        identity::describe_groups(&groups)
                    ),
                    &mut layers,
                )?
            }
        }
    }

    layers.push(ownership.row());

    // cgroup (pids, memory, tree kill), memory, cpu, rlimits.
    let (cgroups, cg_facts) = match (euid, cgroup_mode) {
        (0, Cgroups::Create) => {
            let root = k.cgroups(cgroup::Want::for_limits(&policy.limits));
            let facts = root.as_ref().map(|r| decide::CgroupFacts {
                describe: r.describe(),
                no_memory: r.memory().err().map(String::from),
                cpu: r.cpu(),
            });
            (root, facts)
        }
        (0, Cgroups::ProbeOnly) => (
            None,
            k.cgroup_offer().map(|p| decide::CgroupFacts {
                describe: p.describe,
                no_memory: p.no_memory,
                cpu: p.cpu,
            }),
        ),
        _ => (None, None),
    };
    let (limit_rows, rl) = decide::limits(
        &policy.limits,
        policy.allow_degraded,
        &decide::LimitsProbe {
            cgroups: cg_facts,
            remount_note: k.remount_note(),
            core_gap: k.core_dumps().gap(),
            target_is_root: matches!(identity.target, Some(id) if id.uid == 0),
        },
    )?;
    layers.extend(limit_rows);

    let mut installed = decide::installed(
        &fs_rules,
        landlock.as_ref().map(|p| (p.network_restricted, p.scoped)),
        socket_rules,
        seccomp.is_some(),
    );
    // Added by each exec in the view (child/mod.rs), where only it can name that root; not
    // one of the path rules prepared here, so listed beside the network and scope rules.
    if view.root && landlock.is_some() {
        installed.landlock.push(decide::InstalledRule {
            path: "(view root)".into(),
            access: "list / in each exec's view (it holds only the grants)".into(),
        });
    }
    Ok(Prepared {
        landlock,
        seccomp,
        rlimits: rl,
        identity,
        cgroups,
        view,
        ownership,
        proc_rule: policy.fs.proc_read,
        layers,
        landlock_abi,
        fs_rules,
        supervisor_pid: k.getpid(),
        network,
        installed,
    })
}

fn degrade_row(
    policy: &Policy,
    layer: &'static str,
    reason: String,
    layers: &mut Vec<LayerStatus>,
) -> Result<(), PrepareError> {
    decide::degrade(policy.allow_degraded, layer, reason, layers)
}

use decide::row;

/// What the view must hold and hide, from the filesystem policy. Every grant is resolved by
/// the policy's symlink-safe walk (as Landlock's rules are): the view binds the inode that walk
/// decided on, by its device and inode numbers, or fails. A grant that does not resolve (a
/// missing system directory, a link the sandbox could have planted) is left out, as it is
/// from the Landlock rules.
fn view_request(policy: &Policy) -> namespaces::ViewRequest {
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
        .filter_map(|p| p.canonicalize().ok())
        .collect();
    // The links of the host's root (and of each directory made on the way to a grant) whose
    // target the view holds (view_links.rs). The private tmpfs mounts are where
    // `ViewPlan::new` puts them: /tmp and /dev/shm, unless a grant covers them.
    let tmpfs: Vec<std::path::PathBuf> = ["/tmp", "/dev/shm"]
        .iter()
        .filter_map(|t| std::path::Path::new(t).canonicalize().ok())
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
    }
}

/// The namespace layer: one row per kind, fail closed per kind.
fn prepare_namespaces(
    k: &dyn kernel::Kernel,
    policy: &Policy,
    layers: &mut Vec<LayerStatus>,
) -> Result<(namespaces::View, ownership::Ownership), PrepareError> {
    use namespaces::{Kind, Outcome, ProcMount, UserNs};
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
    let kinds = [Kind::Pid, Kind::Mount, Kind::Ipc, Kind::Uts, Kind::Net];
    if !usable {
        for kind in kinds {
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
        let ownership = ownership::Ownership::decide(
            policy,
            k.euid(),
            &req.grants,
            req.workdir,
            &[],
            None,
            &[],
        );
        return Ok((namespaces::View::default(), ownership));
    }
    let mut req = view_request(policy);
    // The user namespaces of the idmapped binds, one per mapping, held until the helper (which
    // inherits them) has built the view.
    let sandbox = policy.identity.filter(|_| k.euid() == 0);
    let mut userns: Vec<(idmap::IdSwap, std::io::Result<idmap::UserNs>)> = Vec::new();
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
    let plan = namespaces::ViewPlan::new(&req);
    // Race tests hold the supervisor here: the walk has decided each grant's inode, the
    // helper has not bound them yet.
    crate::pause::point("view-plan");
    let probe = k.make_view(&plan)?;
    let view = probe.view;
    let failed: Vec<(idmap::IdSwap, std::io::Error)> = userns
        .into_iter()
        .filter_map(|(s, r)| r.err().map(|e| (s, e)))
        .collect();
    let ownership = ownership::Ownership::decide(
        policy,
        k.euid(),
        &req.grants,
        req.workdir,
        &failed,
        plan.root().filter(|_| view.root),
        &view.idmap,
    );
    for kind in kinds {
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

#[cfg(test)]
mod prepare_tests;
