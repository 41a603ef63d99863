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

mod build;
mod plan;
pub(super) use build::{Built, build, detach_old_root};
pub(super) use plan::MAX_IDMAP;
pub use plan::{FILES_MADE, OVERLAY_MADE, RootPlan, RootRequest};
