//! What the view is made of, as data: the namespace kinds and how each came out, the request
//! (the policy's part) and the plan built from it before any fork, which the view helper
//! (`helper.rs`), the exec's init (`in_init.rs`) and the report (`report.rs`) read.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::sandbox::grant::Grant;
use crate::sandbox::step::ChildError;
use crate::sandbox::view_root::{RootPlan, RootRequest};

/// One kind of namespace, as a layer of the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    User,
    Pid,
    Mount,
    Ipc,
    Uts,
    Net,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::User,
        Kind::Pid,
        Kind::Mount,
        Kind::Ipc,
        Kind::Uts,
        Kind::Net,
    ];

    /// The layer name in `check` and the report.
    pub fn layer(self) -> &'static str {
        match self {
            Kind::User => "namespace-user",
            Kind::Pid => "namespace-pid",
            Kind::Mount => "namespace-mount",
            Kind::Ipc => "namespace-ipc",
            Kind::Uts => "namespace-uts",
            Kind::Net => "namespace-net",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// How one kind came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Not asked for (e.g. the network namespace with `--network all`).
    NotRequested,
    Made,
    Failed(ChildError),
}

/// How the exec's /proc is mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProcMount {
    /// No fresh /proc: the exec sees the /proc of the supervisor's view.
    #[default]
    None,
    Full,
    /// `subset=pid`: only the process directories (a non-initial user namespace).
    SubsetPid,
}

/// What the view should hold, as plain data (the policy's part).
#[derive(Debug, Clone)]
pub struct ViewRequest {
    pub private_net: bool,
    pub hostname: String,
    pub tmp_size: u64,
    pub shm_size: u64,
    /// Every granted path (workdir, --ro, --rw, scratch, system directories, devices).
    pub grants: Vec<Grant>,
    /// Every denied path, canonical.
    pub denied: Vec<PathBuf>,
    /// The supervisor's /proc.
    pub proc: Option<Grant>,
    /// The policy grants read on /proc.
    pub proc_read: bool,
    /// Symlinks of the host the view reproduces (view_links.rs): (link, its target as written).
    pub links: Vec<(PathBuf, PathBuf)>,
    /// Which of `grants` is the workdir.
    pub workdir: Option<usize>,
    /// The IPC namespace's limits.
    pub ipc: crate::policy::IpcLimits,
    /// A non-root supervisor's uid and gid: the IPC namespace is made in a user namespace that
    /// maps root to them (see the module docs). `None` as root.
    pub ipc_userns: Option<(u32, u32)>,
    /// A directory of the view's own files (the egress proxy's CA).
    pub files: Option<crate::policy::ViewFiles>,
}

/// One private tmpfs, prepared for the helper: every string and list built before fork.
#[derive(Debug)]
pub(super) struct TmpfsPlan {
    pub(super) target: PathBuf,
    pub(super) c_target: CString,
    pub(super) data: CString,
    /// Directories to create inside the new tmpfs, parents first.
    pub(super) dirs: Vec<CString>,
    pub(super) binds: Vec<BindPlan>,
    pub(super) hides: Vec<(CString, bool)>,
    pub(super) hidden_src: CString,
}

#[derive(Debug)]
pub(super) struct BindPlan {
    pub(super) path: CString,
    pub(super) dir: bool,
    pub(super) read_only: bool,
    /// Flags of the source mount that a remount must keep (locked in a user namespace).
    pub(super) keep_flags: libc::c_ulong,
}

/// The view, as the helper is to build it.
#[derive(Debug)]
pub struct ViewPlan {
    pub(super) private_net: bool,
    pub(super) hostname: CString,
    pub(super) tmpfs: Vec<TmpfsPlan>,
    /// The new root of granted paths only (None when the policy grants `/`).
    pub(super) root: Option<RootPlan>,
    /// The IPC limits to write: (`/proc/sys/kernel/NAME`, value), in `IpcLimits::FILES` order.
    pub(super) ipc_limits: Vec<(CString, CString)>,
    /// `uid_map` and `gid_map` of the user namespace that owns the IPC namespace ("0 ID 1"),
    /// for a non-root supervisor.
    pub(super) ipc_userns: Option<[CString; 2]>,
}

pub(super) fn cstr(p: &Path) -> CString {
    // Paths from the policy are absolute and come from the OS: no NUL inside.
    CString::new(p.as_os_str().as_bytes()).unwrap_or_default()
}

impl ViewPlan {
    pub fn new(req: &ViewRequest) -> ViewPlan {
        let mut tmpfs = Vec::new();
        for (mount_point, size) in [("/tmp", req.tmp_size), ("/dev/shm", req.shm_size)] {
            let target = crate::sys::walk::canonical(Path::new(mount_point))
                .unwrap_or_else(|_| PathBuf::from(mount_point));
            // A grant of the mount point itself (or of a parent) would be hidden by the
            // tmpfs; leave that mount point as it is.
            if req.grants.iter().any(|g| target.starts_with(&g.path)) {
                continue;
            }
            let mut dirs: Vec<PathBuf> = Vec::new();
            let mut binds = Vec::new();
            let mut bound: Vec<PathBuf> = Vec::new();
            let mut grants: Vec<&Grant> = req
                .grants
                .iter()
                .filter(|g| g.path.starts_with(&target) && g.path != target)
                .collect();
            // Outer grants first, so an inner grant is bound on top of its parent's bind.
            grants.sort_by_key(|g| g.path.components().count());
            for g in grants {
                let Ok(meta) = std::fs::metadata(&g.path) else {
                    continue;
                };
                for anc in g.path.ancestors().skip(1) {
                    if anc == target {
                        break;
                    }
                    if !dirs.iter().any(|d| d == anc) && !bound.iter().any(|b| anc.starts_with(b)) {
                        dirs.push(anc.to_path_buf());
                    }
                }
                bound.push(g.path.clone());
                binds.push(BindPlan {
                    path: cstr(&g.path),
                    dir: meta.is_dir(),
                    read_only: g.read_only,
                    keep_flags: mount_flags(&g.path),
                });
            }
            dirs.sort_by_key(|d| d.components().count());
            let hides = req
                .denied
                .iter()
                .filter(|d| bound.iter().any(|b| d.starts_with(b)))
                .filter_map(|d| std::fs::metadata(d).ok().map(|m| (cstr(d), m.is_dir())))
                .collect();
            tmpfs.push(TmpfsPlan {
                c_target: cstr(&target),
                data: CString::new(format!("mode=1777,size={size}")).unwrap_or_default(),
                dirs: dirs.iter().map(|d| cstr(d)).collect(),
                binds,
                hides,
                hidden_src: cstr(&target.join(".openshell-hidden")),
                target,
            });
        }
        let targets: Vec<PathBuf> = tmpfs.iter().map(|t| t.target.clone()).collect();
        // Test builds only: `OSB_TEST_DENY_IDMAP=1` makes every idmapped bind fail as on a
        // filesystem without idmapped mounts (EINVAL), so the tests reach the hand-over on a
        // filesystem that has them. Read here, before the fork.
        #[cfg(feature = "test-pause-points")]
        let deny_idmap = std::env::var_os("OSB_TEST_DENY_IDMAP").is_some_and(|v| v == "1");
        #[cfg(not(feature = "test-pause-points"))]
        let deny_idmap = false;
        let root = RootPlan::new(
            &RootRequest {
                grants: req.grants.clone(),
                proc: req.proc.clone(),
                proc_read: req.proc_read,
                links: req.links.clone(),
                denied: req.denied.clone(),
                deny_idmap,
                files: req.files.clone(),
            },
            &targets,
        );
        let values = req.ipc.values();
        let ipc_limits = crate::policy::IpcLimits::FILES
            .iter()
            .zip(values)
            .map(|(f, v)| {
                (
                    CString::new(format!("/proc/sys/kernel/{f}")).unwrap_or_default(),
                    CString::new(v).unwrap_or_default(),
                )
            })
            .collect();
        let ipc_userns = req.ipc_userns.map(|(uid, gid)| {
            [
                CString::new(format!("0 {uid} 1")).unwrap_or_default(),
                CString::new(format!("0 {gid} 1")).unwrap_or_default(),
            ]
        });
        ViewPlan {
            private_net: req.private_net,
            hostname: CString::new(req.hostname.as_bytes()).unwrap_or_default(),
            tmpfs,
            root,
            ipc_limits,
            ipc_userns,
        }
    }

    /// The new root's plan, when there is one.
    pub fn root(&self) -> Option<&RootPlan> {
        self.root.as_ref()
    }

    /// The mount points that get a private tmpfs.
    pub fn tmpfs_targets(&self) -> Vec<PathBuf> {
        self.tmpfs.iter().map(|t| t.target.clone()).collect()
    }
}

/// MS_* flags of the mount holding `path` that a bind remount must repeat.
fn mount_flags(path: &Path) -> libc::c_ulong {
    let c = cstr(path);
    // SAFETY: statvfs fills a zeroed struct on our stack.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return 0;
    }
    let mut f = 0;
    for (st_flag, ms_flag) in [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ] {
        if st.f_flag & st_flag != 0 {
            f |= ms_flag;
        }
    }
    f
}

impl ViewPlan {
    /// Each private tmpfs mount point, as a C string, with its bit in the report.
    pub(in crate::sandbox) fn tmpfs_c_targets(
        &self,
    ) -> impl Iterator<Item = (usize, &std::ffi::CStr)> {
        self.tmpfs
            .iter()
            .enumerate()
            .map(|(i, t)| (i, t.c_target.as_c_str()))
    }

    /// The directories of the root that only the view holds and that get a read rule
    /// (the view's own files, the overlay that gives them a mount point), as C strings, each
    /// with its bit in the report's `tmpfs_made`.
    pub(in crate::sandbox) fn read_c_targets(
        &self,
    ) -> impl Iterator<Item = (i32, &std::ffi::CStr)> {
        self.root.iter().flat_map(RootPlan::read_c_targets)
    }

    /// Whether a network namespace of the sandbox's own is asked for.
    pub(in crate::sandbox) fn private_net(&self) -> bool {
        self.private_net
    }
}
