//! The child-side steps, typed: what failed, and where, in the view helper, the exec's init or
//! the command before exec, as it travels back over the error pipe.

use super::{errno, rlimits};

/// Every step that can fail outside the supervisor: in the short-lived helper that builds the
/// view, in the exec's init (PID 1 of its PID namespace) and in the command before exec. The
/// failing side writes `[step, detail, 0, 0, errno (4 bytes)]` to the exec's error pipe, so the
/// parent names the exact step ("setresuid failed: EPERM"), never an index into a table.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    // The supervisor's own user namespace (namespaces::enter_user_ns).
    UnshareUser = 1,
    WriteIdMap,
    // The view (namespaces::make_view's helper).
    UnshareMount,
    MakeMountsPrivate,
    OpenGrant,
    MountTmpfs,
    MakeMountpoint,
    BindGrant,
    RemountGrantReadOnly,
    HideDenied,
    MountRoot,
    MakeViewLink,
    PivotRoot,
    DetachOldRoot,
    RemountRootReadOnly,
    EnterViewRoot,
    UnshareIpc,
    IpcUserNamespace,
    SetIpcLimit,
    UnshareUts,
    SetHostname,
    UnshareNet,
    LoopbackUp,
    ClonePidNamespace,
    UnshareExecMount,
    MountProc,
    UnmountProbeProc,
    // The exec's init.
    InitParentDeath,
    SupervisorGone,
    JoinCgroup,
    SetnsMount,
    SetnsIpc,
    SetnsUts,
    SetnsNet,
    InitSignals,
    ForkCommand,
    // The command, in the order of [`enforce_in_child`].
    Stdio,
    Chdir,
    Subreaper,
    Setsid,
    ControllingTty,
    Rlimit,
    ClearAmbient,
    Securebits,
    DropBounding,
    Setgroups,
    Setresgid,
    Setresuid,
    VerifyUid,
    VerifyGid,
    Capset,
    NoNewPrivs,
    ParentDeath,
    LandlockProcRule,
    Landlock,
    CloseFds,
    ResetSignals,
    Seccomp,
    Exec,
}

impl Step {
    const ALL: &'static [Step] = &[
        Step::UnshareUser,
        Step::WriteIdMap,
        Step::UnshareMount,
        Step::MakeMountsPrivate,
        Step::OpenGrant,
        Step::MountTmpfs,
        Step::MakeMountpoint,
        Step::BindGrant,
        Step::RemountGrantReadOnly,
        Step::HideDenied,
        Step::MountRoot,
        Step::MakeViewLink,
        Step::PivotRoot,
        Step::DetachOldRoot,
        Step::RemountRootReadOnly,
        Step::EnterViewRoot,
        Step::UnshareIpc,
        Step::IpcUserNamespace,
        Step::SetIpcLimit,
        Step::UnshareUts,
        Step::SetHostname,
        Step::UnshareNet,
        Step::LoopbackUp,
        Step::ClonePidNamespace,
        Step::UnshareExecMount,
        Step::MountProc,
        Step::UnmountProbeProc,
        Step::InitParentDeath,
        Step::SupervisorGone,
        Step::JoinCgroup,
        Step::SetnsMount,
        Step::SetnsIpc,
        Step::SetnsUts,
        Step::SetnsNet,
        Step::InitSignals,
        Step::ForkCommand,
        Step::Stdio,
        Step::Chdir,
        Step::Subreaper,
        Step::Setsid,
        Step::ControllingTty,
        Step::Rlimit,
        Step::ClearAmbient,
        Step::Securebits,
        Step::DropBounding,
        Step::Setgroups,
        Step::Setresgid,
        Step::Setresuid,
        Step::VerifyUid,
        Step::VerifyGid,
        Step::Capset,
        Step::NoNewPrivs,
        Step::ParentDeath,
        Step::LandlockProcRule,
        Step::Landlock,
        Step::CloseFds,
        Step::ResetSignals,
        Step::Seccomp,
        Step::Exec,
    ];

    pub fn from_u8(b: u8) -> Option<Step> {
        Step::ALL.iter().copied().find(|s| *s as u8 == b)
    }

    /// What the step does, for error messages.
    pub fn name(self) -> &'static str {
        match self {
            Step::UnshareUser => "unshare the user namespace",
            Step::WriteIdMap => "write the user namespace's id maps",
            Step::UnshareMount => "unshare the mount namespace",
            Step::MakeMountsPrivate => "make every mount private",
            Step::OpenGrant => "open a granted path as the policy walk resolved it",
            Step::MountTmpfs => "mount a private tmpfs",
            Step::MakeMountpoint => "create a mount point in the view",
            Step::BindGrant => "bind-mount a granted path into the view",
            Step::RemountGrantReadOnly => "set a grant's mount flags (nosuid, nodev, read-only)",
            Step::HideDenied => "hide a denied path",
            Step::MountRoot => "mount the tmpfs of the view's new root",
            Step::MakeViewLink => "recreate a system symlink in the view's root",
            Step::PivotRoot => "pivot_root into the view's new root",
            Step::DetachOldRoot => "detach the old root",
            Step::RemountRootReadOnly => "remount the view's root read-only",
            Step::EnterViewRoot => "chroot into the view's root",
            Step::UnshareIpc => "unshare the IPC namespace",
            Step::IpcUserNamespace => {
                "make the user namespace that owns the IPC namespace (not root: one that maps root to our uid, so we may set its limits)"
            }
            Step::SetIpcLimit => "write an IPC limit in /proc/sys/kernel",
            Step::UnshareUts => "unshare the UTS namespace",
            Step::SetHostname => "set the hostname",
            Step::UnshareNet => "unshare the network namespace",
            Step::LoopbackUp => "bring the loopback interface up",
            Step::ClonePidNamespace => "clone into a new PID namespace",
            Step::UnshareExecMount => "unshare the exec's mount namespace",
            Step::MountProc => "mount /proc",
            Step::UnmountProbeProc => "unmount the view helper's trial /proc",
            Step::InitParentDeath => "set the init's parent-death signal",
            Step::SupervisorGone => "supervisor exited during spawn",
            Step::JoinCgroup => "join cgroup",
            Step::SetnsMount => "join the view's mount namespace",
            Step::SetnsIpc => "join the view's IPC namespace",
            Step::SetnsUts => "join the view's UTS namespace",
            Step::SetnsNet => "join the view's network namespace",
            Step::InitSignals => "install the init's signal handlers",
            Step::ForkCommand => "fork the command",
            Step::Stdio => "connect stdin, stdout and stderr",
            Step::Chdir => "change to the working directory",
            Step::Subreaper => "become the child subreaper of the exec",
            Step::Setsid => "setsid",
            Step::ControllingTty => "make the pty the controlling terminal",
            Step::Rlimit => "setrlimit",
            Step::ClearAmbient => "clear ambient capabilities",
            Step::Securebits => "set securebits",
            Step::DropBounding => "drop bounding capability",
            Step::Setgroups => "setgroups",
            Step::Setresgid => "setresgid",
            Step::Setresuid => "setresuid",
            Step::VerifyUid => "verify uid",
            Step::VerifyGid => "verify gid",
            Step::Capset => "capset",
            Step::NoNewPrivs => "set no_new_privs",
            Step::ParentDeath => "set parent-death signal",
            Step::LandlockProcRule => "grant read on the exec's /proc",
            Step::Landlock => "landlock",
            Step::CloseFds => "close fds",
            Step::ResetSignals => "reset signal dispositions and mask",
            Step::Seccomp => "seccomp",
            Step::Exec => "execve",
        }
    }
}

/// A failed step, with the errno it failed with and a step-specific detail byte (the rlimit
/// resource for [`Step::Rlimit`], the capability for [`Step::DropBounding`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildError {
    pub step: Step,
    pub detail: u8,
    pub errno: i32,
}

impl ChildError {
    pub const fn new(step: Step, errno: i32) -> ChildError {
        ChildError {
            step,
            detail: 0,
            errno,
        }
    }

    /// The failed step with the errno of the last libc call. Async-signal-safe.
    pub fn last(step: Step) -> ChildError {
        ChildError::new(step, errno())
    }

    pub const WIRE: usize = 8;

    pub fn encode(self) -> [u8; 8] {
        let e = self.errno.to_ne_bytes();
        [self.step as u8, self.detail, 0, 0, e[0], e[1], e[2], e[3]]
    }

    pub fn decode(b: &[u8; 8]) -> Option<ChildError> {
        Some(ChildError {
            step: Step::from_u8(b[0])?,
            detail: b[1],
            errno: i32::from_ne_bytes([b[4], b[5], b[6], b[7]]),
        })
    }

    /// Write to `fd` (the exec's error pipe). Async-signal-safe.
    pub fn send(self, fd: libc::c_int) {
        let buf = self.encode();
        // SAFETY: writing a stack buffer; 8 bytes is below PIPE_BUF, so the write is atomic.
        unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
    }
}

impl std::fmt::Display for ChildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.step {
            Step::Rlimit => write!(f, "setrlimit({})", rlimits::name_of(self.detail))?,
            Step::DropBounding => write!(f, "drop bounding capability {}", self.detail)?,
            Step::SetIpcLimit => write!(
                f,
                "write /proc/sys/kernel/{}",
                crate::policy::IpcLimits::FILES
                    .get(usize::from(self.detail))
                    .unwrap_or(&"?")
            )?,
            s => f.write_str(s.name())?,
        }
        write!(f, ": {}", std::io::Error::from_raw_os_error(self.errno))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_survives_the_wire_and_has_a_distinct_name() {
        let mut names = std::collections::HashSet::new();
        for &s in Step::ALL {
            let e = ChildError {
                step: s,
                detail: 7,
                errno: libc::EPERM,
            };
            assert_eq!(ChildError::decode(&e.encode()), Some(e));
            assert!(names.insert(s.name()), "duplicate name {}", s.name());
        }
        assert_eq!(Step::ALL.len(), Step::Exec as usize);
        assert_eq!(Step::from_u8(0), None);
        assert_eq!(Step::from_u8(Step::Exec as u8 + 1), None);
    }

    #[test]
    fn an_error_names_its_step_and_errno() {
        let e = ChildError::new(Step::Setresuid, libc::EPERM);
        assert_eq!(
            e.to_string(),
            "setresuid: Operation not permitted (os error 1)"
        );
        let r = ChildError {
            step: Step::Rlimit,
            detail: libc::RLIMIT_NOFILE as u8,
            errno: libc::EINVAL,
        };
        assert!(r.to_string().starts_with("setrlimit(nofile): "), "{r}");
    }
}
