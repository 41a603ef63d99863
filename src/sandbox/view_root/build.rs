//! In the helper: the root built from the [`RootPlan`] with raw syscalls only (a forked child
//! of a multi-threaded process: no allocation).

use std::ffi::{CStr, CString};
use std::os::fd::RawFd;

use crate::sandbox::step::{ChildError, Step};
use crate::sys::mount::{
    MOUNT_ATTR_IDMAP, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY,
    MOVE_MOUNT_F_EMPTY_PATH, MOVE_MOUNT_T_EMPTY_PATH, MountAttr, OPEN_TREE_CLONE,
};
use crate::sys::walk::open_no_links;
use crate::sys::{errno, proc_fd_path as fd_path};

use super::plan::*;

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

/// The parent directory of an entry: the root itself (the caller's, never closed here), or a
/// directory opened below it.
enum Parent {
    Root(RawFd),
    Opened(Fd),
}

impl Parent {
    fn fd(&self) -> RawFd {
        match self {
            Parent::Root(fd) => *fd,
            Parent::Opened(f) => f.0,
        }
    }
}

/// Open the parent directory of `comps` below `root`, one component at a time, never
/// following a symlink, creating missing directories when `create`. An entry right below the
/// root gets the root itself: no copy of its descriptor to make and close (the root's
/// entries are most of a view's, so that was two calls each on the init's way to the
/// command).
///
/// # Safety
/// In the helper only.
unsafe fn open_parent(root: RawFd, comps: &[CString], create: bool) -> Result<Parent, ChildError> {
    // SAFETY: raw syscalls on descriptors we own and prepared C strings.
    unsafe {
        let mut dir = Parent::Root(root);
        let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_DIRECTORY | libc::O_CLOEXEC;
        for c in &comps[..comps.len().saturating_sub(1)] {
            let at = dir.fd();
            let mut fd = libc::openat(at, c.as_ptr(), flags);
            if fd < 0 && errno() == libc::ENOENT && create {
                if libc::mkdirat(at, c.as_ptr(), 0o755) != 0 && errno() != libc::EEXIST {
                    return Err(fail(Step::MakeMountpoint));
                }
                fd = libc::openat(at, c.as_ptr(), flags);
            }
            if fd < 0 {
                return Err(fail(Step::MakeMountpoint));
            }
            dir = Parent::Opened(Fd(fd));
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
                set_attr(tree.0, attr_set | MOUNT_ATTR_IDMAP, userns)
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
/// The overlay's upper layer's mount point in the new root while the overlay is made.
const LAYER: &CStr = c".openshell-layer";

/// Show the bind just attached at `name` in `parent` through a read-only overlay whose upper
/// layer is a small tmpfs holding only the empty directory `dir` (mode 0755): the mount point
/// of the view's files, which the host's tree lacks (view_root.rs `overlay_bind`). The
/// layers are named by /proc/self/fd paths of descriptors opened here (no path is looked up
/// as written); the layer's own mount is detached again once the overlay holds it. Returns 0,
/// or the errno of the step that failed (the bind then stays as it was, without the
/// directory).
///
/// # Safety
/// In the helper only, `root` the new root's descriptor.
unsafe fn overlay(root: RawFd, parent: RawFd, name: &CStr, dir: &CStr) -> i32 {
    let mut a = [0u8; 32];
    let mut b = [0u8; 32];
    // SAFETY: raw syscalls on descriptors we own and prepared C strings and buffers.
    unsafe {
        if libc::mkdirat(root, LAYER.as_ptr(), 0o700) != 0 {
            return errno();
        }
        let e = (|| {
            let at = Fd(libc::openat(
                root,
                LAYER.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            ));
            if at.0 < 0 {
                return errno();
            }
            fd_path(&mut a, at.0);
            if libc::mount(
                c"tmpfs".as_ptr(),
                a.as_ptr().cast(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                c"mode=0755,size=16k,nr_inodes=8".as_ptr().cast(),
            ) != 0
            {
                return errno();
            }
            let e = (|| {
                let layer = Fd(libc::openat(
                    root,
                    LAYER.as_ptr(),
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                ));
                if layer.0 < 0 || libc::mkdirat(layer.0, dir.as_ptr(), 0o755) != 0 {
                    return errno();
                }
                // The bind's root, through its mount, and the overlay stacked on it.
                let lower = Fd(libc::openat(
                    parent,
                    name.as_ptr(),
                    libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                ));
                if lower.0 < 0 {
                    return errno();
                }
                let mut data = [0u8; 96];
                let mut n = 0;
                fd_path(&mut a, layer.0);
                fd_path(&mut b, lower.0);
                for part in [&b"lowerdir="[..], cstr(&a), b":", cstr(&b)] {
                    data[n..n + part.len()].copy_from_slice(part);
                    n += part.len();
                }
                if libc::mount(
                    c"overlay".as_ptr(),
                    b.as_ptr().cast(),
                    c"overlay".as_ptr(),
                    libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
                    data.as_ptr().cast(),
                ) != 0
                {
                    return errno();
                }
                0
            })();
            libc::umount2(a.as_ptr().cast(), libc::MNT_DETACH);
            e
        })();
        libc::unlinkat(root, LAYER.as_ptr(), libc::AT_REMOVEDIR);
        e
    }
}

/// The bytes of a NUL-terminated buffer before its NUL.
fn cstr(buf: &[u8; 32]) -> &[u8] {
    &buf[..buf.iter().position(|&c| c == 0).unwrap_or(buf.len())]
}

/// Mount a small tmpfs on `target` (an O_PATH descriptor of the mount point `name` in
/// `parent`), write the plan's files into it (mode 0444), then make it read-only. `buf` is
/// scratch for a descriptor's /proc path.
///
/// # Safety
/// In the helper only.
unsafe fn fill_files(
    plan: &RootPlan,
    parent: RawFd,
    name: &CStr,
    target: RawFd,
    buf: &mut [u8; 32],
) -> Result<(), ChildError> {
    let fail = |step| ChildError::last(step);
    // SAFETY: raw syscalls on descriptors we own and prepared C strings and buffers.
    unsafe {
        fd_path(buf, target);
        let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        if libc::mount(
            c"tmpfs".as_ptr(),
            buf.as_ptr().cast(),
            c"tmpfs".as_ptr(),
            flags,
            c"mode=0755,size=1m".as_ptr().cast(),
        ) != 0
        {
            return Err(fail(Step::MountTmpfs));
        }
        // The mount point's descriptor still names what lies under the new tmpfs: its root
        // is reached by name, through the mount.
        let dir = Fd(libc::openat(
            parent,
            name.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        ));
        if dir.0 < 0 {
            return Err(fail(Step::MountTmpfs));
        }
        for (name, contents) in &plan.files {
            let f = Fd(libc::openat(
                dir.0,
                name.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o444,
            ));
            if f.0 < 0 {
                return Err(fail(Step::WriteViewFile));
            }
            let mut off = 0;
            while off < contents.len() {
                let n = libc::write(f.0, contents[off..].as_ptr().cast(), contents.len() - off);
                if n < 0 && errno() == libc::EINTR {
                    continue;
                }
                if n <= 0 {
                    return Err(fail(Step::WriteViewFile));
                }
                off += n as usize;
            }
        }
        fd_path(buf, dir.0);
        if libc::mount(
            std::ptr::null(),
            buf.as_ptr().cast(),
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | flags,
            std::ptr::null(),
        ) != 0
        {
            return Err(fail(Step::WriteViewFile));
        }
        Ok(())
    }
}

/// An empty read-only mode-000 tmpfs over a denied directory; nothing when it is gone.
///
/// # Safety
/// In the helper only, `parent` the directory's parent in the new root.
unsafe fn hide_dir(parent: RawFd, name: &CStr, buf: &mut [u8; 32]) -> Result<(), ChildError> {
    // SAFETY: raw syscalls on descriptors we own and prepared C strings and buffers.
    unsafe {
        let t = match mount_point(parent, name, true, false) {
            Err(r) if r.errno == libc::ENOENT => return Ok(()),
            r => r?,
        };
        fd_path(buf, t.0);
        if libc::mount(
            c"tmpfs".as_ptr(),
            buf.as_ptr().cast(),
            c"tmpfs".as_ptr(),
            libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            c"mode=000,size=4k".as_ptr().cast(),
        ) != 0
        {
            return Err(fail(Step::HideDenied));
        }
        Ok(())
    }
}

/// [`HIDDEN`] bound over a denied file (made on the first one, held in `hidden`); nothing when
/// the file is gone.
///
/// # Safety
/// In the helper only, `root` the staging root and `parent` the file's parent in it.
unsafe fn hide_file(
    root: RawFd,
    hidden: &mut Fd,
    parent: RawFd,
    name: &CStr,
    [a, b]: [&mut [u8; 32]; 2],
) -> Result<(), ChildError> {
    // SAFETY: raw syscalls on descriptors we own and prepared C strings and buffers.
    unsafe {
        if hidden.0 < 0 {
            // An empty root-owned mode-000 file: opening it gives EACCES to a child without
            // CAP_DAC_OVERRIDE, whatever its uid.
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
            *hidden = Fd(libc::openat(
                root,
                HIDDEN.as_ptr(),
                libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            ));
            if hidden.0 < 0 {
                return Err(fail(Step::HideDenied));
            }
        }
        let t = match mount_point(parent, name, false, false) {
            Err(r) if r.errno == libc::ENOENT => return Ok(()),
            r => r?,
        };
        fd_path(a, hidden.0);
        fd_path(b, t.0);
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
        Ok(())
    }
}

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
    let mut files_unshown = false;
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
                        if libc::mkdirat(parent.fd(), name.as_ptr(), 0o755) != 0
                            && errno() != libc::EEXIST
                        {
                            return Err(fail(Step::MakeMountpoint));
                        }
                    }
                    What::Link(target) => {
                        if libc::symlinkat(target.as_ptr(), parent.fd(), name.as_ptr()) != 0
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
                        let t = mount_point(parent.fd(), name, bd.dir, e.create)?;
                        let tree = std::mem::replace(&mut fds[*i], -1);
                        let slot = (bd.userns >= 0).then(|| idmap.get_mut(bd.slot)).flatten();
                        bind(tree, t.0, bd.read_only, bd.userns, plan.deny_idmap, slot)?;
                        if let Some(dir) = &bd.overlay {
                            match overlay(root, parent.fd(), name, dir) {
                                0 => *tmpfs_made |= OVERLAY_MADE,
                                // The files are then not shown (their mount point is
                                // missing), and the supervisor says so.
                                _ => files_unshown = true,
                            }
                        }
                    }
                    What::Tmpfs(i) => {
                        let t = mount_point(parent.fd(), name, true, e.create)?;
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
                    What::Files if files_unshown => {}
                    What::Files => {
                        let t = mount_point(parent.fd(), name, true, e.create)?;
                        fill_files(plan, parent.fd(), name, t.0, &mut a)?;
                        *tmpfs_made |= FILES_MADE;
                    }
                    What::HideDir => hide_dir(parent.fd(), name, &mut a)?,
                    What::HideFile => {
                        hide_file(root, &mut hidden, parent.fd(), name, [&mut a, &mut b])?
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
pub(in crate::sandbox) enum Built {
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
/// tmpfs. `fresh_proc`: each exec can mount its own /proc. `old_root`: where to leave a
/// descriptor of the old root, still stacked on the new one after the pivot, for the caller
/// to detach later ([`detach_old_root`]); `None` detaches it here.
///
/// The old root's detach waits for an RCU grace period (the kernel's `namespace_unlock`
/// before it frees the unmounted tree, expedited: a few hundred microseconds on a 2-core VM,
/// most of building the root), which `run`'s init has better things to overlap with. Until
/// then the old root is on top of the new one at `/`, which nothing here reaches: a lookup
/// starts at the process's root, the new root's own top directory, and only a lookup coming
/// down from above (there is none above a root) or an unmount's would cross into what is
/// stacked on it.
///
/// # Safety
/// In the helper only, in its private mount namespace.
pub(in crate::sandbox) unsafe fn build(
    plan: &RootPlan,
    tmpfs: &[(&CStr, &CStr)],
    fresh_proc: bool,
    tmpfs_made: &mut i32,
    idmap: &mut [i32; MAX_IDMAP],
    old_root: Option<&mut RawFd>,
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
        // The old root, to detach once the caller has reported: opened before the pivot,
        // while `/` is still it.
        let keep_old = match old_root {
            Some(slot) => {
                let fd = libc::open(
                    c"/".as_ptr(),
                    libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                );
                if fd < 0 {
                    let e = fail(Step::DetachOldRoot);
                    drop(root);
                    libc::umount2(STAGING.as_ptr(), libc::MNT_DETACH);
                    *tmpfs_made = 0;
                    idmap.fill(-1);
                    return Built::RolledBack(e);
                }
                *slot = fd;
                true
            }
            None => false,
        };
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
            if !keep_old && libc::umount2(c".".as_ptr(), libc::MNT_DETACH) != 0 {
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

/// Detach the old root that [`build`] left stacked on the new one (`old_root`, its
/// descriptor, closed here): by its `/proc/self/fd` path, as an unmount takes a path and the
/// old root has none in the new root. Needs the fresh /proc of the caller's PID namespace.
///
/// # Safety
/// In the process that called [`build`] with `old_root`, after it.
pub(in crate::sandbox) unsafe fn detach_old_root(old_root: RawFd) -> Result<(), ChildError> {
    let mut a = [0u8; 32];
    fd_path(&mut a, old_root);
    // SAFETY: umount2 of a NUL-terminated path; close of the descriptor build left us.
    unsafe {
        let rc = libc::umount2(a.as_ptr().cast(), libc::MNT_DETACH);
        let e = fail(Step::DetachOldRoot);
        libc::close(old_root);
        if rc != 0 {
            return Err(e);
        }
    }
    Ok(())
}
