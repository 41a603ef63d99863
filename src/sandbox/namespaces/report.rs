//! What the process that builds a view (the view helper, or `run`'s exec init) writes back to
//! the supervisor: per kind whether it was made, and the facts the rows and the ownership
//! decision need. Plain integers, written and read whole over a pipe.

use super::plan::{Kind, Outcome};
use crate::sandbox::step::{ChildError, Step};
use crate::sys::errno;

/// Index of each field in the report.
pub(super) const N: usize = 6;
pub(super) const NOT_TRIED: i32 = -1;

/// Per kind [step, errno] (step 0 = made, -1 = not tried), the /proc mode, which tmpfs mounts
/// were made (bit per plan entry), and whether the mount namespace is usable (its propagation
/// is private).
#[repr(C)]
#[derive(Clone, Copy)]
pub(in crate::sandbox) struct HelperReport {
    pub(super) kinds: [[i32; 2]; N],
    pub(super) proc: i32,
    pub(super) tmpfs_made: i32,
    pub(super) mnt_usable: i32,
    /// 1 when the builder pivoted into the new root, 2 when it chrooted into it.
    pub(super) root: i32,
    /// Per idmapped bind: see [`super::View::idmap`].
    pub(super) idmap: [i32; crate::sandbox::view_root::MAX_IDMAP],
    /// The IPC limits: [step, errno] as per kind (step 0: written, -1: not tried).
    pub(super) ipc_limits: [i32; 2],
}

impl HelperReport {
    /// Nothing tried yet.
    pub(super) fn new() -> HelperReport {
        HelperReport {
            kinds: [[NOT_TRIED, 0]; N],
            proc: 0,
            tmpfs_made: 0,
            mnt_usable: 0,
            root: 0,
            idmap: [-1; crate::sandbox::view_root::MAX_IDMAP],
            ipc_limits: [NOT_TRIED, 0],
        }
    }

    pub(super) fn set(&mut self, k: Kind, r: Result<(), ChildError>) {
        self.kinds[k.index()] = Self::encode(r);
    }

    /// The step in the low byte, its detail (which entry of the view's root, which IPC limit)
    /// above it; and the errno.
    pub(super) fn encode(r: Result<(), ChildError>) -> [i32; 2] {
        match r {
            Ok(()) => [0, 0],
            Err(e) => [
                i32::from(e.step as u8) | (i32::from(e.detail) << 8),
                e.errno,
            ],
        }
    }

    pub(super) fn decode([step, e]: [i32; 2]) -> Option<ChildError> {
        (step > 0).then(|| ChildError {
            detail: (step >> 8) as u8,
            ..ChildError::new(Step::from_u8(step as u8).unwrap_or(Step::UnshareIpc), e)
        })
    }

    /// Whether the report's `tmpfs_made` has `bit` (view_root.rs `FILES_MADE`,
    /// `OVERLAY_MADE`).
    pub(in crate::sandbox) fn made_bit(&self, bit: i32) -> bool {
        self.tmpfs_made & bit != 0
    }

    /// Whether the private tmpfs of plan entry `i` was mounted.
    pub(in crate::sandbox) fn tmpfs_made(&self, i: usize) -> bool {
        self.tmpfs_made & (1 << i) != 0
    }

    /// How each kind came out.
    pub(super) fn outcomes(&self) -> [Outcome; N] {
        let mut outcomes = [Outcome::NotRequested; N];
        for k in Kind::ALL {
            let [step, e] = self.kinds[k.index()];
            outcomes[k.index()] = match step {
                NOT_TRIED => Outcome::NotRequested,
                0 => Outcome::Made,
                s => Outcome::Failed(ChildError {
                    detail: (s >> 8) as u8,
                    ..ChildError::new(Step::from_u8(s as u8).unwrap_or(Step::UnshareMount), e)
                }),
            };
        }
        outcomes
    }

    /// Why the IPC limits were not set, when they were not.
    pub(super) fn ipc_limits_error(&self) -> Option<ChildError> {
        match self.ipc_limits {
            [NOT_TRIED, _] => Some(ChildError::new(Step::SetIpcLimit, libc::ENOSYS)),
            r => Self::decode(r),
        }
    }

    /// Write the whole report to `fd`. Async-signal-safe.
    pub(in crate::sandbox) fn send(&self, fd: libc::c_int) {
        let size = std::mem::size_of::<HelperReport>();
        // SAFETY: writing our own plain-integer struct, its size.
        unsafe { libc::write(fd, (self as *const HelperReport).cast(), size) };
    }

    /// Read a whole report from `fd`: `None` when the writer died before it wrote one.
    pub(in crate::sandbox) fn receive(fd: libc::c_int) -> Option<HelperReport> {
        let mut rep = HelperReport::new();
        let want = std::mem::size_of::<HelperReport>();
        let n = loop {
            // SAFETY: reading into our own struct, at most its size.
            let n = unsafe { libc::read(fd, (&mut rep as *mut HelperReport).cast(), want) };
            if n < 0 && errno() == libc::EINTR {
                continue;
            }
            break n;
        };
        (n == want as isize).then_some(rep)
    }
}
