//! The view's root: a fresh tmpfs that holds only what the policy grants, as bwrap builds one.
//!
//! Landlock (ABI < 9) does not check `connect()` to pathname unix sockets, nor `stat`, inotify
//! or fanotify marks, and a read-only mount stops none of them. So a path outside the grants
//! must not exist in the view at all. The helper that builds the view (namespaces.rs) makes a
//! small root-owned tmpfs, mode 0755, and fills it:
//! - every granted path bind-mounted (recursively) at its own path, its flags set on the
//!   detached tree before it is attached (`mount_setattr`, which only adds flags: what the
//!   source had stays, as a user namespace also requires): nosuid always; nodev unless the
//!   grant is a character device itself; read-only for read-only grants, for devices (a
//!   write to a device works on a read-only mount, a chmod or utimes of its node does not)
//!   and for the supervisor's /proc; and a grant of someone other than the sandbox identity
//!   idmapped to its owner on that detached tree too (idmap.rs; where the kernel refuses, the
//!   bind is made without the mapping and the refusal reported for the hand-over);
//! - a grant below another grant of the same kind and mapping is already visible through it:
//!   not bound again;
//! - the host's symlinks that lead into the view (`/lib64 -> usr/lib64` once `/usr` is
//!   granted, `/var/run -> /run` once `/run` is; chosen in view_links.rs) as symlinks with the
//!   same target;
//! - /tmp and /dev/shm as the view's private tmpfs, /dev holding only the granted devices,
//!   an empty /proc for each exec's fresh one (or the supervisor's /proc bound there when no
//!   fresh /proc can be mounted and the policy grants /proc);
//! - a denied path inside a grant covered by an empty mode-000 mount.
//!
//! Then `pivot_root(".", ".")` into it, the old root detached (MNT_DETACH), and the new root
//! remounted read-only.
//!
//! No path is looked up twice between the decision and the mount: the supervisor's
//! symlink-safe walk (policy/walk.rs) resolved each grant to one inode and recorded its device
//! and inode numbers. The helper, in its own mount namespace (whose mounts are copies, so the
//! supervisor's descriptors cannot be bound from), opens the walk's symlink-free path with
//! `openat2(RESOLVE_NO_SYMLINKS)` and binds that descriptor only if it is the same inode. A
//! grant swapped in between fails the view (fail closed) instead of binding something else.
//! Mount points are made and opened one component at a time, `O_NOFOLLOW`, from the new
//! root's descriptor, and never created inside a bound host tree.
//!
//! Everything here runs in the forked helper of a multi-threaded process: raw syscalls on the
//! [`RootPlan`] built before the fork, no allocation.

use std::ffi::{CStr, CString};
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use super::namespaces::{Grant, fd_path};
use crate::policy::walk::open_no_links;
use crate::sandbox::{ChildError, Step, errno};

pub(super) const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x04;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
pub(super) const MOUNT_ATTR_RDONLY: u64 = 0x01;
pub(super) const MOUNT_ATTR_NOSUID: u64 = 0x02;
const MOUNT_ATTR_NODEV: u64 = 0x04;
/// More binds than this fail the view with E2BIG (their sources are held open at once).
const MAX_BINDS: usize = 128;
/// Idmapped binds past this many are made without the mapping (reported as E2BIG).
pub(super) const MAX_IDMAP: usize = 16;

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
pub(super) struct MountAttr {
    pub(super) attr_set: u64,
    pub(super) attr_clr: u64,
    pub(super) propagation: u64,
    pub(super) userns_fd: u64,
}

/// One thing to make in the new root, at `comps` (its path relative to the root).
#[derive(Debug)]
struct Entry {
    comps: Vec<CString>,
    /// Missing parent directories may be created (the parent is one of our tmpfs mounts, never
    /// a bound host tree).
    create: bool,
    what: What,
}

#[derive(Debug)]
enum What {
    Dir,
    Link(CString),
    /// Index into [`RootPlan::binds`].
    Bind(usize),
    /// Index into the view's tmpfs plans (and its bit in the helper's report).
    Tmpfs(usize),
    HideDir,
    HideFile,
}

#[derive(Debug)]
struct Bind {
    /// The walk's symlink-free absolute path.
    src: CString,
    dir: bool,
    read_only: bool,
    dev: u64,
    ino: u64,
    /// The supervisor's /proc: bound only where [`RootPlan::bind_proc`] says.
    proc_fallback: bool,
    /// Idmapped with this user namespace (-1: not), reported in this slot of the helper's
    /// report.
    userns: RawFd,
    slot: usize,
}

/// The new root, as the helper is to build it.
#[derive(Debug)]
pub struct RootPlan {
    entries: Vec<Entry>,
    binds: Vec<Bind>,
    proc_read: bool,
    /// The supervisor is in a non-initial user namespace.
    in_userns: bool,
    /// Test builds: every idmapped bind is refused as by a filesystem without them.
    deny_idmap: bool,
    /// How many binds are idmapped (slots of the report).
    idmap_slots: usize,
}

/// What the view's root holds, as plain data.
#[derive(Debug, Clone, Default)]
pub struct RootRequest {
    /// Every grant, devices included.
    pub grants: Vec<Grant>,
    /// The supervisor's /proc.
    pub proc: Option<Grant>,
    /// The policy grants read on /proc.
    pub proc_read: bool,
    /// Symlinks of the host the view reproduces (view_links.rs): (link, its target as written).
    pub links: Vec<(PathBuf, PathBuf)>,
    /// Denied paths (canonical).
    pub denied: Vec<PathBuf>,
    /// Test builds: refuse every idmapped bind (EINVAL).
    pub deny_idmap: bool,
}

/// Whether this process is in a non-initial user namespace (its uid map is not the identity
/// over the whole range).
fn in_user_namespace() -> bool {
    let map = std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
    map.split_whitespace().collect::<Vec<_>>() != ["0", "0", "4294967295"]
}

fn rel_comps(p: &Path) -> Vec<CString> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(CString::new(n.as_encoded_bytes()).unwrap_or_default()),
            _ => None,
        })
        .collect()
}

impl RootPlan {
    /// `tmpfs`: the private tmpfs mount points, in the order of their report bits. `None` when
    /// the policy grants `/` itself: the root would be the host's anyway.
    pub fn new(req: &RootRequest, tmpfs: &[PathBuf]) -> Option<RootPlan> {
        if req.grants.iter().any(|g| g.path == Path::new("/")) {
            return None;
        }
        // One bind per path; read-write wins where a path is granted both ways (Landlock still
        // decides what may be written), with the read-write grant's mapping.
        let mut grants: Vec<Grant> = Vec::new();
        for g in &req.grants {
            match grants.iter_mut().find(|x| x.path == g.path) {
                Some(x) if x.read_only && !g.read_only => *x = g.clone(),
                Some(_) => {}
                None => grants.push(g.clone()),
            }
        }
        grants.sort_by_key(|g| g.path.components().count());
        // A grant below another of the same kind and mapping shows through it already.
        let swap = |g: &Grant| g.idmap.map(|m| m.swap);
        let mut kept: Vec<Grant> = Vec::new();
        for g in grants {
            let covered = kept
                .iter()
                .filter(|k| g.path.starts_with(&k.path))
                .max_by_key(|k| k.path.components().count())
                .is_some_and(|k| k.read_only == g.read_only && swap(k) == swap(&g));
            if !covered {
                kept.push(g);
            }
        }
        // (path, is a bound host tree) of every mount in the new root, for `create`.
        let mounts: Vec<(&Path, bool)> = kept
            .iter()
            .map(|g| (g.path.as_path(), true))
            .chain(tmpfs.iter().map(|t| (t.as_path(), false)))
            .collect();
        let inside_bind = |p: &Path| {
            mounts
                .iter()
                .filter(|(m, _)| p.starts_with(m) && p != *m)
                .max_by_key(|(m, _)| m.components().count())
                .is_some_and(|(_, bound)| *bound)
        };
        let mut entries: Vec<(PathBuf, What)> = Vec::new();
        let mut binds = Vec::new();
        let mut idmap_slots = 0;
        for g in &kept {
            let userns = g.idmap.map_or(-1, |m| m.userns);
            let slot = if userns >= 0 {
                idmap_slots += 1;
                idmap_slots - 1
            } else {
                0
            };
            binds.push(Bind {
                src: CString::new(g.path.as_os_str().as_encoded_bytes()).unwrap_or_default(),
                dir: g.dir,
                read_only: g.read_only,
                dev: g.dev,
                ino: g.ino,
                proc_fallback: false,
                userns,
                slot,
            });
            entries.push((g.path.clone(), What::Bind(binds.len() - 1)));
        }
        for (i, t) in tmpfs.iter().enumerate() {
            entries.push((t.clone(), What::Tmpfs(i)));
        }
        entries.push((PathBuf::from("/proc"), What::Dir));
        if let Some(p) = &req.proc {
            binds.push(Bind {
                src: CString::new(p.path.as_os_str().as_encoded_bytes()).unwrap_or_default(),
                dir: true,
                // procfs keeps a chmod of a kernel-wide entry in the entry itself, for every
                // later /proc on the machine: read-only, as each exec's own /proc is.
                read_only: true,
                dev: p.dev,
                ino: p.ino,
                proc_fallback: true,
                userns: -1,
                slot: 0,
            });
            entries.push((p.path.clone(), What::Bind(binds.len() - 1)));
        }
        // The links every program expects in /dev (bash's process substitution opens
        // /dev/fd/N), once /dev holds anything.
        let dev = Path::new("/dev");
        let mut links = req.links.clone();
        if entries.iter().any(|(p, _)| p.starts_with(dev)) {
            for (name, target) in [
                ("fd", "/proc/self/fd"),
                ("stdin", "/proc/self/fd/0"),
                ("stdout", "/proc/self/fd/1"),
                ("stderr", "/proc/self/fd/2"),
            ] {
                links.push((dev.join(name), PathBuf::from(target)));
            }
        }
        for (link, target) in &links {
            let taken = entries.iter().any(|(p, _)| p == link);
            if !taken && !inside_bind(link) {
                let t = CString::new(target.as_os_str().as_encoded_bytes()).unwrap_or_default();
                entries.push((link.clone(), What::Link(t)));
            }
        }
        let mut denied: Vec<&PathBuf> = req.denied.iter().collect();
        denied.sort_by_key(|d| d.components().count());
        let mut hidden: Vec<&Path> = Vec::new();
        for d in denied {
            // Below another cover there is nothing left to hide (nor a way down to it).
            if !inside_bind(d) || hidden.iter().any(|h| d.starts_with(h)) {
                continue;
            }
            hidden.push(d);
            let Ok(m) = std::fs::symlink_metadata(d) else {
                continue;
            };
            let what = if m.is_dir() {
                What::HideDir
            } else {
                What::HideFile
            };
            entries.push((d.clone(), what));
        }
        // Parents before children; at one depth, mounts before what lies beside them.
        entries.sort_by_key(|(p, _)| p.components().count());
        Some(RootPlan {
            entries: entries
                .into_iter()
                .map(|(p, what)| Entry {
                    create: !inside_bind(&p),
                    comps: rel_comps(&p),
                    what,
                })
                .collect(),
            binds,
            proc_read: req.proc_read,
            in_userns: in_user_namespace(),
            deny_idmap: req.deny_idmap,
            idmap_slots: idmap_slots.min(MAX_IDMAP),
        })
    }

    /// How many slots of the helper's report the idmapped binds use.
    pub fn idmap_slots(&self) -> usize {
        self.idmap_slots
    }

    /// The report slot of the bind through which `path` is seen (the innermost bind at or
    /// above it), when that bind is idmapped.
    pub fn idmap_slot(&self, path: &Path) -> Option<usize> {
        self.binds
            .iter()
            .filter(|b| !b.proc_fallback)
            .filter(|b| path.starts_with(Path::new(std::ffi::OsStr::from_bytes(b.src.as_bytes()))))
            .max_by_key(|b| b.src.as_bytes().len())
            .filter(|b| b.userns >= 0 && b.slot < MAX_IDMAP)
            .map(|b| b.slot)
    }

    /// Whether the supervisor's /proc is bound at /proc, under each exec's fresh one:
    /// - when no fresh /proc can be mounted and the policy grants /proc (the execs then see
    ///   the supervisor's, as without a view);
    /// - in a non-initial user namespace, where the kernel mounts a fresh /proc only while
    ///   another full one is visible in the mount namespace (mount_too_revealing), even with
    ///   subset=pid. Each exec's own /proc covers it; the command has no capability to
    ///   unmount that.
    fn bind_proc(&self, fresh_proc: bool) -> bool {
        (!fresh_proc && self.proc_read) || self.in_userns
    }

    /// The supervisor is in a non-initial user namespace.
    pub fn in_userns(&self) -> bool {
        self.in_userns
    }

    /// How many mounts the root gets (binds, not counting the fallback /proc).
    pub fn bind_count(&self) -> usize {
        self.binds.iter().filter(|b| !b.proc_fallback).count()
    }

    /// The path of entry `i` (the detail byte of a failed step), for messages.
    /// (1-based, so that 0 names nothing).
    pub fn entry_path(&self, i: u8) -> Option<String> {
        let e = self.entries.get(usize::from(i).checked_sub(1)?)?;
        let names: Vec<String> = e
            .comps
            .iter()
            .map(|c| c.to_string_lossy().into_owned())
            .collect();
        Some(format!("/{}", names.join("/")))
    }

    /// The top-level names of the new root, for the report and tests.
    pub fn top_level(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .entries
            .iter()
            .filter_map(|e| e.comps.first())
            .map(|c| c.to_string_lossy().into_owned())
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

// ---- in the helper: raw syscalls only ----

fn fail(step: Step) -> ChildError {
    ChildError::last(step)
}

/// Closes a descriptor when dropped. Async-signal-safe.
struct Fd(RawFd);

impl Drop for Fd {
    fn drop(&mut self) {
        if self.0 >= 0 {
            // SAFETY: closing a descriptor this guard owns.
            unsafe { libc::close(self.0) };
        }
    }
}

/// Open the parent directory of `comps` below `root`, one component at a time, never
/// following a symlink, creating missing directories when `create`.
///
/// # Safety
/// In the helper only.
unsafe fn open_parent(root: RawFd, comps: &[CString], create: bool) -> Result<Fd, ChildError> {
    // SAFETY: raw syscalls on descriptors we own and prepared C strings.
    unsafe {
        let mut dir = Fd(libc::fcntl(root, libc::F_DUPFD_CLOEXEC, 3));
        if dir.0 < 0 {
            return Err(fail(Step::MakeMountpoint));
        }
        let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_DIRECTORY | libc::O_CLOEXEC;
        for c in &comps[..comps.len().saturating_sub(1)] {
            let mut fd = libc::openat(dir.0, c.as_ptr(), flags);
            if fd < 0 && errno() == libc::ENOENT && create {
                if libc::mkdirat(dir.0, c.as_ptr(), 0o755) != 0 && errno() != libc::EEXIST {
                    return Err(fail(Step::MakeMountpoint));
                }
                fd = libc::openat(dir.0, c.as_ptr(), flags);
            }
            if fd < 0 {
                return Err(fail(Step::MakeMountpoint));
            }
            dir = Fd(fd);
        }
        Ok(dir)
    }
}

/// Make (unless it exists) and open the mount point `name` in `parent`: a directory, or an
/// empty file for a file mount. A symlink there is refused.
///
/// # Safety
/// In the helper only.
unsafe fn mount_point(
    parent: RawFd,
    name: &CStr,
    dir: bool,
    create: bool,
) -> Result<Fd, ChildError> {
    // SAFETY: raw syscalls on descriptors we own and prepared C strings.
    unsafe {
        if create {
            let made = if dir {
                libc::mkdirat(parent, name.as_ptr(), 0o755)
            } else {
                let f = libc::openat(
                    parent,
                    name.as_ptr(),
                    libc::O_CREAT
                        | libc::O_EXCL
                        | libc::O_WRONLY
                        | libc::O_NOFOLLOW
                        | libc::O_CLOEXEC,
                    0o644,
                );
                if f >= 0 {
                    libc::close(f);
                    0
                } else {
                    -1
                }
            };
            if made != 0 && errno() != libc::EEXIST {
                return Err(fail(Step::MakeMountpoint));
            }
        }
        let mut flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        if dir {
            flags |= libc::O_DIRECTORY;
        }
        let fd = Fd(libc::openat(parent, name.as_ptr(), flags));
        if fd.0 < 0 {
            return Err(fail(Step::MakeMountpoint));
        }
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd.0, &mut st) != 0 {
            return Err(fail(Step::MakeMountpoint));
        }
        if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
            return Err(ChildError::new(Step::MakeMountpoint, libc::ELOOP));
        }
        Ok(fd)
    }
}

/// Open every bind source and check it is the inode the supervisor's walk decided on, then
/// clone its tree (`open_tree(OPEN_TREE_CLONE)`), all before the staging tmpfs is mounted on
/// /tmp: a clone made later of a grant of /tmp itself (or of a parent) would carry the
/// staging mount along, stacked on the grant, and the view's /tmp would be that empty
/// root-owned tmpfs (writes EACCES). `fds` then holds the detached trees.
///
/// # Safety
/// In the helper only.
unsafe fn open_sources(
    plan: &RootPlan,
    fresh_proc: bool,
    fds: &mut [RawFd; MAX_BINDS],
) -> Result<(), ChildError> {
    if plan.binds.len() > MAX_BINDS {
        return Err(ChildError::new(Step::OpenGrant, libc::E2BIG));
    }
    for (i, b) in plan.binds.iter().enumerate() {
        if b.proc_fallback && !plan.bind_proc(fresh_proc) {
            continue;
        }
        // Errors carry the bind's entry index, as in `fill`.
        let at = plan
            .entries
            .iter()
            .position(|e| matches!(e.what, What::Bind(j) if j == i))
            .map_or(0, |i| (i + 1).min(255)) as u8;
        let fail = |step| ChildError {
            detail: at,
            ..ChildError::last(step)
        };
        let fd = open_no_links(&b.src, libc::O_PATH | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(fail(Step::OpenGrant));
        }
        fds[i] = fd;
        // SAFETY: fstat into a zeroed struct on our stack.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return Err(fail(Step::OpenGrant));
        }
        if (st.st_dev, st.st_ino) != (b.dev, b.ino) {
            // Not the inode the policy was decided on: someone swapped it since the walk.
            return Err(ChildError {
                detail: at,
                ..ChildError::new(Step::OpenGrant, libc::ESTALE)
            });
        }
        // SAFETY: open_tree on the descriptor just checked; the O_PATH one is closed after.
        let tree = unsafe {
            libc::syscall(
                libc::SYS_open_tree,
                fd,
                c"".as_ptr(),
                OPEN_TREE_CLONE
                    | libc::O_CLOEXEC as libc::c_uint
                    | libc::AT_EMPTY_PATH as libc::c_uint
                    | libc::AT_RECURSIVE as libc::c_uint,
            ) as RawFd
        };
        let e = errno();
        // SAFETY: closing the O_PATH descriptor opened above.
        unsafe { libc::close(fd) };
        fds[i] = tree;
        if tree < 0 {
            return Err(ChildError {
                detail: at,
                ..ChildError::new(Step::BindGrant, e)
            });
        }
    }
    Ok(())
}

/// `mount_setattr` on the whole detached tree `tree`. Returns 0 or the errno.
///
/// # Safety
/// In the helper only.
unsafe fn set_attr(tree: RawFd, attr_set: u64, userns: RawFd) -> i32 {
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.max(0) as u64,
    };
    // SAFETY: mount_setattr on our descriptor with a struct of the size passed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree,
            c"".as_ptr(),
            (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc == 0 { 0 } else { errno() }
}

/// Attach the detached tree `tree` (from `open_sources`) onto `target`: nosuid, nodev unless
/// the tree is a character device, read-only if asked or a device (`--uid 0` owns the host's
/// nodes: a chmod or utimes would change them for everyone), idmapped with `userns` if it is
/// a namespace (`idmap` gets 0, or the errno of a refusal: the tree is then attached without
/// the mapping, for the supervisor to fall back). nosuid does not change a file for the host,
/// which sees it through its own mounts: no set-id bit is seccomp's job.
///
/// # Safety
/// In the helper only; `tree` is consumed.
unsafe fn bind(
    tree: RawFd,
    target: RawFd,
    read_only: bool,
    userns: RawFd,
    deny_idmap: bool,
    idmap: Option<&mut i32>,
) -> Result<(), ChildError> {
    let tree = Fd(tree);
    // SAFETY: raw mount API syscalls on descriptors we own; fstat into a zeroed struct.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(tree.0, &mut st) != 0 {
            return Err(fail(Step::BindGrant));
        }
        let device = st.st_mode & libc::S_IFMT == libc::S_IFCHR;
        let mut attr_set = MOUNT_ATTR_NOSUID;
        if !device {
            attr_set |= MOUNT_ATTR_NODEV;
        }
        if read_only || device {
            attr_set |= MOUNT_ATTR_RDONLY;
        }
        let mut flags_set = false;
        if let Some(out) = idmap {
            // One call with the mapping and the flags: it changes nothing when it fails.
            let e = if deny_idmap {
                libc::EINVAL
            } else {
                set_attr(tree.0, attr_set | super::idmap::MOUNT_ATTR_IDMAP, userns)
            };
            *out = e;
            flags_set = e == 0;
        }
        if !flags_set {
            let e = set_attr(tree.0, attr_set, -1);
            if e != 0 {
                return Err(ChildError::new(Step::RemountGrantReadOnly, e));
            }
        }
        if libc::syscall(
            libc::SYS_move_mount,
            tree.0,
            c"".as_ptr(),
            target,
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        ) != 0
        {
            return Err(fail(Step::BindGrant));
        }
        Ok(())
    }
}

const HIDDEN: &CStr = c".openshell-hidden";

/// Make every entry below `root`.
///
/// # Safety
/// In the helper only, with the staging tmpfs mounted and `root` its descriptor.
unsafe fn fill(
    plan: &RootPlan,
    tmpfs: &[(&CStr, &CStr)],
    root: RawFd,
    fds: &mut [RawFd; MAX_BINDS],
    fresh_proc: bool,
    tmpfs_made: &mut i32,
    idmap: &mut [i32; MAX_IDMAP],
) -> Result<(), ChildError> {
    let mut hidden = Fd(-1);
    let mut a = [0u8; 32];
    let mut b = [0u8; 32];
    // SAFETY: raw syscalls on descriptors we own and prepared C strings.
    unsafe {
        for (idx, e) in plan.entries.iter().enumerate() {
            let mut one = || -> Result<(), ChildError> {
                let Some(name) = e.comps.last() else {
                    return Ok(());
                };
                // A denied path gone since the plan was made leaves nothing to hide (and one
                // made since is still outside the Landlock rules, which were split around
                // what existed).
                let hide = matches!(e.what, What::HideDir | What::HideFile);
                let gone = |r: &ChildError| hide && r.errno == libc::ENOENT;
                let parent = match open_parent(root, &e.comps, e.create) {
                    Err(r) if gone(&r) => return Ok(()),
                    r => r?,
                };
                match &e.what {
                    What::Dir => {
                        if libc::mkdirat(parent.0, name.as_ptr(), 0o755) != 0
                            && errno() != libc::EEXIST
                        {
                            return Err(fail(Step::MakeMountpoint));
                        }
                    }
                    What::Link(target) => {
                        if libc::symlinkat(target.as_ptr(), parent.0, name.as_ptr()) != 0
                            && errno() != libc::EEXIST
                        {
                            return Err(fail(Step::MakeViewLink));
                        }
                    }
                    What::Bind(i) => {
                        let bd = &plan.binds[*i];
                        if bd.proc_fallback && !plan.bind_proc(fresh_proc) {
                            return Ok(());
                        }
                        let t = mount_point(parent.0, name, bd.dir, e.create)?;
                        let tree = std::mem::replace(&mut fds[*i], -1);
                        let slot = (bd.userns >= 0).then(|| idmap.get_mut(bd.slot)).flatten();
                        bind(tree, t.0, bd.read_only, bd.userns, plan.deny_idmap, slot)?;
                    }
                    What::Tmpfs(i) => {
                        let t = mount_point(parent.0, name, true, e.create)?;
                        fd_path(&mut a, t.0);
                        let (_, data) = tmpfs[*i];
                        if libc::mount(
                            c"tmpfs".as_ptr(),
                            a.as_ptr().cast(),
                            c"tmpfs".as_ptr(),
                            libc::MS_NOSUID | libc::MS_NODEV,
                            data.as_ptr().cast(),
                        ) != 0
                        {
                            return Err(fail(Step::MountTmpfs));
                        }
                        *tmpfs_made |= 1 << i;
                    }
                    What::HideDir => {
                        let t = match mount_point(parent.0, name, true, false) {
                            Err(r) if gone(&r) => return Ok(()),
                            r => r?,
                        };
                        fd_path(&mut a, t.0);
                        if libc::mount(
                            c"tmpfs".as_ptr(),
                            a.as_ptr().cast(),
                            c"tmpfs".as_ptr(),
                            libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                            c"mode=000,size=4k".as_ptr().cast(),
                        ) != 0
                        {
                            return Err(fail(Step::HideDenied));
                        }
                    }
                    What::HideFile => {
                        if hidden.0 < 0 {
                            // An empty root-owned mode-000 file: opening it gives EACCES to a
                            // child without CAP_DAC_OVERRIDE, whatever its uid.
                            let f = libc::openat(
                                root,
                                HIDDEN.as_ptr(),
                                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
                                0,
                            );
                            if f < 0 {
                                return Err(fail(Step::HideDenied));
                            }
                            libc::close(f);
                            hidden = Fd(libc::openat(
                                root,
                                HIDDEN.as_ptr(),
                                libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                            ));
                            if hidden.0 < 0 {
                                return Err(fail(Step::HideDenied));
                            }
                        }
                        let t = match mount_point(parent.0, name, false, false) {
                            Err(r) if gone(&r) => return Ok(()),
                            r => r?,
                        };
                        fd_path(&mut a, hidden.0);
                        fd_path(&mut b, t.0);
                        if libc::mount(
                            a.as_ptr().cast(),
                            b.as_ptr().cast(),
                            std::ptr::null(),
                            libc::MS_BIND,
                            std::ptr::null(),
                        ) != 0
                        {
                            return Err(fail(Step::HideDenied));
                        }
                    }
                }
                Ok(())
            };
            // The entry's index, so the supervisor can name the path that failed.
            one().map_err(|mut err| {
                err.detail = (idx + 1).min(255) as u8;
                err
            })?;
        }
        if hidden.0 >= 0 {
            libc::unlinkat(root, HIDDEN.as_ptr(), 0);
        }
    }
    Ok(())
}

/// Where the new root is put together before pivot_root: a directory every runtime provides.
const STAGING: &CStr = c"/tmp";

/// The outcome of [`build`].
pub(super) enum Built {
    /// The caller's root is now the new root, the old one detached.
    Root,
    /// pivot_root was refused (a container runtime's default seccomp profile does): the new
    /// root is moved onto `/` and entered with chroot. The old root stays in the namespace
    /// below it, so whoever joins the namespace must chroot into the view's root too
    /// (`ExecView::root`).
    Chroot,
    /// Nothing changed: the staging mount is gone again, the old root is still in place.
    RolledBack(ChildError),
    /// pivot_root happened but a later step failed.
    Broken(ChildError),
}

/// Build the new root and pivot into it. `tmpfs`: (mount point, mount data) of each private
/// tmpfs. `fresh_proc`: each exec can mount its own /proc.
///
/// # Safety
/// In the helper only, in its private mount namespace.
pub(super) unsafe fn build(
    plan: &RootPlan,
    tmpfs: &[(&CStr, &CStr)],
    fresh_proc: bool,
    tmpfs_made: &mut i32,
    idmap: &mut [i32; MAX_IDMAP],
) -> Built {
    let mut fds = [-1; MAX_BINDS];
    let close_all = |fds: &[RawFd; MAX_BINDS]| {
        for &fd in fds.iter().filter(|&&fd| fd >= 0) {
            // SAFETY: closing descriptors opened by open_sources.
            unsafe { libc::close(fd) };
        }
    };
    // SAFETY: raw syscalls on prepared data.
    unsafe {
        if let Err(e) = open_sources(plan, fresh_proc, &mut fds) {
            close_all(&fds);
            return Built::RolledBack(e);
        }
        if libc::mount(
            c"tmpfs".as_ptr(),
            STAGING.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            c"mode=0755,size=1m".as_ptr().cast(),
        ) != 0
        {
            close_all(&fds);
            return Built::RolledBack(fail(Step::MountRoot));
        }
        let root = Fd(libc::open(
            STAGING.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        ));
        let filled = if root.0 < 0 {
            Err(fail(Step::MountRoot))
        } else {
            let mut made = 0;
            let r = fill(plan, tmpfs, root.0, &mut fds, fresh_proc, &mut made, idmap);
            if r.is_ok() {
                *tmpfs_made = made;
            }
            r
        };
        close_all(&fds);
        if let Err(e) = filled {
            // Nothing of the root is left: no bind was made, idmapped or not.
            idmap.fill(-1);
            drop(root);
            // Detaching the staging mount takes every bind and tmpfs made in it along.
            libc::umount2(STAGING.as_ptr(), libc::MNT_DETACH);
            return Built::RolledBack(e);
        }
        // pivot_root(".", "."): the old root ends up stacked on the new one, at ".", where
        // it can be detached without a directory to put it in.
        if libc::fchdir(root.0) != 0 {
            let e = fail(Step::PivotRoot);
            libc::umount2(STAGING.as_ptr(), libc::MNT_DETACH);
            *tmpfs_made = 0;
            idmap.fill(-1);
            return Built::RolledBack(e);
        }
        let built = if libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) == 0 {
            if libc::umount2(c".".as_ptr(), libc::MNT_DETACH) != 0 {
                return Built::Broken(fail(Step::DetachOldRoot));
            }
            Built::Root
        } else {
            // As switch_root does: the staging mount moved onto `/`, then chroot into it.
            let refused = fail(Step::PivotRoot);
            if libc::mount(
                c".".as_ptr(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_MOVE,
                std::ptr::null(),
            ) != 0
            {
                libc::chdir(c"/".as_ptr());
                drop(root);
                libc::umount2(STAGING.as_ptr(), libc::MNT_DETACH);
                *tmpfs_made = 0;
                idmap.fill(-1);
                return Built::RolledBack(refused);
            }
            if libc::chroot(c".".as_ptr()) != 0 {
                return Built::Broken(fail(Step::EnterViewRoot));
            }
            Built::Chroot
        };
        if libc::chdir(c"/".as_ptr()) != 0 {
            return Built::Broken(fail(Step::DetachOldRoot));
        }
        // Nothing is created in the root itself any more: read-only, as defence in depth
        // (in a user namespace the root tmpfs is owned by the supervisor's, so the child's,
        // uid).
        if libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
            std::ptr::null(),
        ) != 0
        {
            return Built::Broken(fail(Step::RemountRootReadOnly));
        }
        built
    }
}

#[cfg(test)]
#[path = "view_root_tests.rs"]
mod tests;
