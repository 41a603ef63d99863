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
//! - [`enforce_in_child`] runs in the forked child between fork and exec. The supervisor is a
//!   multi-threaded tokio process, so after fork only async-signal-safe work is allowed: no
//!   allocation, no locks, no logging. Every step here is a raw syscall on prepared data. We
//!   chose this over re-executing a single-threaded helper because it costs one exec instead
//!   of two (see BENCHMARKS.md).
//!
//! The order in the child, and why:
//! 1. session, parent-death signal, controlling tty — while we can still fail cheaply;
//! 2. join the exec's cgroup — writing cgroup.procs needs our root identity;
//! 3. rlimits — lowering needs no privilege, but do it before anything the child could race;
//! 4. identity — securebits and the bounding set need CAP_SETPCAP, so they go before setuid;
//!    groups before gid before uid, because each needs a capability the next step removes;
//!    then no_new_privs, which both Landlock and seccomp require of an unprivileged caller;
//! 5. Landlock — after the capability drop (style: "the capability drop before Landlock");
//! 6. every fd above 2 marked close-on-exec — after Landlock used its ruleset fd;
//! 7. seccomp — last, as close to exec as possible, so the filter does not have to allow the
//!    syscalls of the steps above. execve itself stays allowed.

pub mod cgroup;
pub mod cgroup_remount;
pub mod devnull;
pub mod diagnose;
pub mod identity;
pub mod idmap;
pub mod init;
pub mod kernel;
pub mod landlock;
pub mod namespaces;
pub mod ownership;
pub mod process;
pub mod rlimits;
pub mod seccomp;
mod step;
pub use step::{ChildError, Step};
mod view_links;
pub mod view_root;

use seccompiler::BpfProgram;

use crate::policy::{FsRule, NetworkMode, PathAccess, Policy, expand_grants_skipping};

/// errno of the last failed libc call on this thread. Async-signal-safe.
pub fn errno() -> i32 {
    // SAFETY: __errno_location always returns a valid pointer to this thread's errno.
    unsafe { *libc::__errno_location() }
}

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
    pub landlock: Option<landlock::Prepared>,
    pub seccomp: Option<BpfProgram>,
    pub rlimits: Vec<rlimits::Rlimit>,
    pub identity: identity::Prepared,
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
    prepare_inner(&kernel::Real, policy, Cgroups::Create)
}

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
        if !policy.allow_degraded {
            return Err(PrepareError::NotEnforceable { layer, reason });
        }
        layers.push(LayerStatus {
            layer,
            status: Enforcement::Degraded,
            detail: reason,
        });
        Ok(())
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

    // With --network none and a private network namespace (only `lo`), nothing can leave the
    // namespace: IP sockets, loopback bind and connect are allowed (so an exec can run a
    // server, and the next exec of the sandbox reach it), any other connect is ENETUNREACH.
    // The socket rules are then those of --network all (AF_UNIX, AF_INET, AF_INET6 and route
    // netlink, which sees only the private namespace). Without that namespace, --network none
    // keeps its AF_UNIX-only filter and Landlock's TCP denial.
    let loopback_only = policy.network == NetworkMode::None && view.net.is_some();
    let socket_rules = if loopback_only {
        NetworkMode::All
    } else {
        policy.network
    };

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
            let groups = identity::supplementary_groups();
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

    // cgroup (pids, memory, tree kill).
    // (description, why there is no memory controller, CPU support) of what is, or would be,
    // in force.
    let (cgroups, cg_info) = match (euid, cgroup_mode) {
        (0, Cgroups::Create) => {
            let root = k.cgroups(cgroup::Want::for_limits(&policy.limits));
            let info = root
                .as_ref()
                .map(|r| (r.describe(), r.memory().err().map(String::from), r.cpu()));
            (root, info)
        }
        (0, Cgroups::ProbeOnly) => (
            None,
            cgroup::System::real()
                .and_then(|s| cgroup::probe(&s))
                .map(|p| (p.describe, p.no_memory, p.cpu)),
        ),
        _ => (None, None),
    };
    let target_is_root = matches!(identity.target, Some(id) if id.uid == 0);
    match &cg_info {
        Some((describe, ..)) => layers.push(LayerStatus {
            layer: "cgroup",
            status: Enforcement::Enforced,
            detail: with_remount_note(format!(
                "pids.max {} per exec; {describe}",
                policy.limits.pids
            )),
        }),
        None if target_is_root => degrade(
            "cgroup",
            with_remount_note(
                "target uid is 0, where RLIMIT_NPROC is not enforced, and no pids cgroup can be created"
                    .into(),
            ),
            &mut layers,
        )?,
        // An explicit --pids N promises N processes for this exec. RLIMIT_NPROC counts every
        // process of the uid on the machine: twenty runs with --pids 16 starve each other.
        None if policy.limits.pids_requested => degrade(
            "cgroup",
            with_remount_note(format!(
                "no writable pids cgroup: --pids {} is RLIMIT_NPROC, shared by every process of the uid on this machine",
                policy.limits.pids
            )),
            &mut layers,
        )?,
        None => layers.push(LayerStatus {
            layer: "cgroup",
            status: Enforcement::NotRequested,
            detail: with_remount_note(
                "no writable pids cgroup; RLIMIT_NPROC bounds processes per uid".into(),
            ),
        }),
    }
    // --memory is resident memory of the whole exec, swap included: only a memory cgroup
    // bounds that (and SysV shared memory and memfds with it). RLIMIT_AS is another promise,
    // about address space per process, and has its own flag. Nothing asked, nothing to refuse.
    let no_cgroup = "no memory cgroup (the supervisor is not root, or no writable cgroup)";
    match (policy.limits.memory_bytes, &cg_info) {
        (None, _) => layers.push(LayerStatus {
            layer: "memory",
            status: Enforcement::NotRequested,
            detail: "no --memory".into(),
        }),
        (Some(m), Some((_, None, _))) => layers.push(LayerStatus {
            layer: "memory",
            status: Enforcement::Enforced,
            detail: format!("{m} bytes resident per exec, swap off (memory cgroup)"),
        }),
        (Some(_), info) => degrade(
            "memory",
            format!(
                "{}: --memory is not enforced at all",
                info.as_ref()
                    .and_then(|(_, why, _)| why.as_deref())
                    .unwrap_or(no_cgroup)
            ),
            &mut layers,
        )?,
    }

    // --cpu is CPU time of the whole tree (a watcher in the supervisor reads the cgroup's
    // accounting and kills at the limit); --cpus a CFS bandwidth quota.
    let cpu = cg_info.as_ref().map(|(_, _, c)| *c).unwrap_or_default();
    let mut per_process_cpu = false;
    let mut cpu_detail = Vec::new();
    if let Some(secs) = policy.limits.cpu_secs {
        if cpu.accounting {
            cpu_detail.push(format!(
                "{secs} s of CPU for the whole exec tree (cgroup accounting)"
            ));
        } else {
            per_process_cpu = true;
            degrade(
                "cpu",
                format!(
                    "no cgroup CPU accounting: --cpu {secs} is RLIMIT_CPU, {secs} s for each process of the tree"
                ),
                &mut layers,
            )?;
        }
    }
    if let Some(m) = policy.limits.cpu_quota_millis {
        let cpus = m as f64 / 1000.0;
        if cpu.quota {
            cpu_detail.push(format!("{cpus} CPUs of bandwidth (CFS quota)"));
        } else {
            degrade(
                "cpu",
                format!("no cgroup CPU controller: --cpus {cpus} is not enforced"),
                &mut layers,
            )?;
        }
    }
    let cpu_degraded = layers.iter().any(|l| l.layer == "cpu");
    match (cpu_detail.is_empty(), cpu_degraded) {
        (true, false) => layers.push(LayerStatus {
            layer: "cpu",
            status: Enforcement::NotRequested,
            detail: "no --cpu, no --cpus".into(),
        }),
        (false, false) => layers.push(LayerStatus {
            layer: "cpu",
            status: Enforcement::Enforced,
            detail: cpu_detail.join("; "),
        }),
        _ => {}
    }

    let mut rl = rlimits::prepare(&policy.limits);
    if !per_process_cpu {
        // The tree's budget is kept by the supervisor's watcher; a per-process RLIMIT_CPU of
        // the same size would only race it.
        rl.retain(|l| l.resource != libc::RLIMIT_CPU);
    }
    if cg_info.is_some() {
        // The per-exec pids.max bounds each exec exactly. RLIMIT_NPROC would add nothing but a
        // budget shared by every exec of the sandbox uid, so a fork bomb in one exec would stop
        // all the others from starting.
        rl.retain(|l| l.resource != libc::RLIMIT_NPROC);
    }
    let mut detail = rl
        .iter()
        .map(|l| format!("{}={}", l.name, l.hard))
        .collect::<Vec<_>>()
        .join(" ");
    // A crash must not hand the command's memory to the host's core dump handler (rlimits.rs
    // says what each core_pattern takes).
    match k.core_dumps().gap() {
        None => layers.push(LayerStatus {
            layer: "rlimits",
            status: Enforcement::Enforced,
            detail,
        }),
        Some(gap) => {
            detail.push_str(&format!("; core dumps: {gap}"));
            degrade("rlimits", detail, &mut layers)?;
        }
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
        // SAFETY: getpid has no preconditions.
        supervisor_pid: unsafe { libc::getpid() },
    })
}

fn degrade_row(
    policy: &Policy,
    layer: &'static str,
    reason: String,
    layers: &mut Vec<LayerStatus>,
) -> Result<(), PrepareError> {
    if !policy.allow_degraded {
        return Err(PrepareError::NotEnforceable { layer, reason });
    }
    layers.push(LayerStatus {
        layer,
        status: Enforcement::Degraded,
        detail: reason,
    });
    Ok(())
}

fn row(layers: &mut Vec<LayerStatus>, layer: &'static str, status: Enforcement, detail: String) {
    layers.push(LayerStatus {
        layer,
        status,
        detail,
    });
}

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

/// Apply every layer to the calling (forked, single-threaded) command process, in the
/// documented order, then exec. `parent`: the pid `getppid()` must return once the
/// parent-death signal is armed (1 inside the exec's PID namespace, where our init is the
/// parent; the supervisor's pid otherwise). `join`: the cgroup to join here (only when there is
/// no init, which joins it for the whole namespace). Async-signal-safe: only raw syscalls on
/// data in `p`.
pub fn enforce_in_child(
    p: &Prepared,
    join: Option<&cgroup::ExecCgroup>,
    controlling_tty: bool,
    parent: libc::pid_t,
) -> Result<(), ChildError> {
    process::enforce_session(controlling_tty)?;
    if let Some(cg) = join {
        cg.join()
            .map_err(|e| ChildError::new(Step::JoinCgroup, e))?;
    }
    rlimits::apply(&p.rlimits)?;
    identity::enforce(&p.identity)?;
    process::enforce_parent_death(parent)?;
    if let Some(ll) = &p.landlock {
        if p.view.pid && p.view.proc != namespaces::ProcMount::None && p.proc_rule {
            ll.add_fresh_proc_rule()
                .map_err(|e| ChildError::new(Step::LandlockProcRule, e))?;
        }
        ll.enforce()
            .map_err(|e| ChildError::new(Step::Landlock, e))?;
    }
    process::enforce_fds()?;
    process::reset_signals()?;
    if let Some(prog) = &p.seccomp {
        seccomp::install(prog).map_err(|e| ChildError::new(Step::Seccomp, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod prepare_tests;

/// The cgroup layer's detail, with what start-up did about read-only cgroup mounts.
fn with_remount_note(detail: String) -> String {
    match cgroup_remount::note() {
        Some(n) => format!("{detail} ({n})"),
        None => detail,
    }
}
