//! The view built by `run`'s exec init itself (child/view_init.rs), where one process makes
//! the view and then serves the exec as its PID 1: cloned straight into new mount, PID, IPC
//! and UTS namespaces, so no helper is forked, no namespace is unshared, and the view's mount
//! tree is copied once (the network namespace, `--network none`, is made by the supervisor
//! meanwhile and joined by the init when it is told to go). The same steps as the view
//! helper's (helper.rs), in the order this one process allows:
//! 1. every mount private (before anything is mounted);
//! 2. the root of granted paths only (view_root.rs), pivoted into; with no root (the policy
//!    grants `/`), the private tmpfs mounts in place;
//! 3. the exec's fresh /proc, at once the one its command sees: writable only while the IPC
//!    limits are written to its /proc/sys/kernel (a /proc is that of its mounter's PID
//!    namespace, and this process is PID 1 of the exec's), then read-only;
//! 4. the hostname.
//!
//! Only a root supervisor in the initial user namespace takes this path (`sandbox/one.rs`): a
//! user namespace's view needs the supervisor's /proc bound under the fresh one, and the IPC
//! namespace's owner of its own, which the helper handles. The report says per kind what was
//! made, as the helper's does; anything short of every kind makes the supervisor fall back to
//! the helper's path, which reports the exact degradation.

use super::helper::{PROC_FLAGS, check, mount_proc_flags, mount_tmpfs, write_ipc_limits};
use super::plan::{Kind, ProcMount, ViewPlan};
use super::report::HelperReport;
use crate::sandbox::run_timeline::{InitMark, init_mark};
use crate::sandbox::step::{ChildError, Step};
use crate::sandbox::view_root::{self, Built};

/// Build the view in the calling process, which is already in the namespaces it needs. With
/// a root of its own, the old root is left stacked on it, its descriptor in `old_root`
/// (else -1), for the caller to detach with [`view_root::detach_old_root`] once it has
/// reported: that unmount's wait for an RCU grace period then overlaps the supervisor's
/// reading of the report instead of delaying it.
///
/// # Safety
/// Only in `run`'s exec init, single-threaded, cloned into new mount, PID, IPC and UTS
/// namespaces as their first process: raw syscalls on `plan`, prepared before the clone.
pub(in crate::sandbox) unsafe fn build(
    plan: &ViewPlan,
    old_root: &mut libc::c_int,
) -> HelperReport {
    *old_root = -1;
    let mut rep = HelperReport::new();
    // SAFETY: raw syscalls on prepared data throughout.
    unsafe {
        // Without this, our mounts would propagate to the host when / is a shared mount, as
        // systemd makes it.
        let private = check(
            libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ),
            Step::MakeMountsPrivate,
        );
        if let Err(e) = private {
            rep.set(Kind::Mount, Err(e));
            return rep;
        }
        rep.mnt_usable = 1;
        init_mark(InitMark::Private);
        let mount = match &plan.root {
            Some(root) => {
                let mut targets: [(&std::ffi::CStr, &std::ffi::CStr); 2] = [(c"", c""); 2];
                let n = plan.tmpfs.len().min(2);
                for (i, t) in plan.tmpfs.iter().take(2).enumerate() {
                    targets[i] = (t.c_target.as_c_str(), t.data.as_c_str());
                }
                let built = view_root::build(
                    root,
                    &targets[..n],
                    true,
                    &mut rep.tmpfs_made,
                    &mut rep.idmap,
                    Some(old_root),
                );
                if !matches!(built, Built::Root) && *old_root >= 0 {
                    // Nothing to detach later: the run falls back or fails from this report.
                    libc::close(*old_root);
                    *old_root = -1;
                }
                match built {
                    Built::Root => {
                        rep.root = 1;
                        Ok(())
                    }
                    // The helper's path handles a root it can only chroot into.
                    Built::Chroot => Err(ChildError::new(Step::PivotRoot, libc::EPERM)),
                    Built::RolledBack(e) | Built::Broken(e) => Err(e),
                }
            }
            None => plan.tmpfs.iter().enumerate().try_for_each(|(i, t)| {
                mount_tmpfs(t)?;
                rep.tmpfs_made |= 1 << i;
                Ok(())
            }),
        };
        // On to the other kinds even when the root failed, as the helper does, so that the
        // report says of each what it says there (the supervisor refuses from it).
        rep.set(Kind::Mount, mount);
        init_mark(InitMark::Root);
        // The exec's /proc, mounted writable while the IPC limits go in.
        if mount_proc_flags(ProcMount::Full, 0) != 0 {
            rep.set(Kind::Pid, Err(ChildError::last(Step::MountProc)));
            return rep;
        }
        rep.proc = 1;
        rep.set(Kind::Ipc, Ok(()));
        rep.ipc_limits = HelperReport::encode(write_ipc_limits(plan));
        // Read-only as a whole (the superblock too, not only this mount, so a write is EROFS
        // before any permission check), as `mount_proc` mounts every other exec's /proc.
        let ro = check(
            libc::mount(
                std::ptr::null(),
                c"/proc".as_ptr(),
                std::ptr::null(),
                libc::MS_REMOUNT | PROC_FLAGS,
                std::ptr::null(),
            ),
            Step::MountProc,
        );
        rep.set(Kind::Pid, ro);
        let h = plan.hostname.as_bytes();
        rep.set(
            Kind::Uts,
            check(
                libc::sethostname(h.as_ptr().cast(), h.len()),
                Step::SetHostname,
            ),
        );
        init_mark(InitMark::ProcUts);
    }
    rep
}
