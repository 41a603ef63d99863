//! The child-side steps, typed: what failed, and where, in the view helper, the exec's init or
//! the command before exec, as it travels back over the error pipe.

use crate::sys::errno;

/// Declares [`Step`] with its wire number (declaration order, from 1), [`Step::ALL`] and each
/// step's name, from one list.
macro_rules! steps {
    ($first:ident => $first_name:literal, $($step:ident => $name:literal,)*) => {
        /// Every step that can fail outside the supervisor: in the short-lived helper that
        /// builds the view, in the exec's init (PID 1 of its PID namespace) and in the command
        /// before exec. The failing side writes `[step, detail, 0, 0, errno (4 bytes)]` to the
        /// exec's error pipe, so the parent names the exact step ("setresuid failed: EPERM"),
        /// never an index into a table. 0 is no step.
        #[repr(u8)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Step {
            $first = 1,
            $($step,)*
        }

        impl Step {
            /// Every step, in declaration (wire) order.
            pub const ALL: &'static [Step] = &[Step::$first, $(Step::$step),*];

            /// What the step does, for error messages.
            pub fn name(self) -> &'static str {
                match self {
                    Step::$first => $first_name,
                    $(Step::$step => $name,)*
                }
            }
        }
    };
}

steps! {
    // The supervisor's own user namespace (namespaces::enter_user_ns).
    UnshareUser => "unshare the user namespace",
    WriteIdMap => "write the user namespace's id maps",
    // The view (namespaces::make_view's helper).
    UnshareMount => "unshare the mount namespace",
    MakeMountsPrivate => "make every mount private",
    OpenGrant => "open a granted path as the policy walk resolved it",
    MountTmpfs => "mount a private tmpfs",
    MakeMountpoint => "create a mount point in the view",
    BindGrant => "bind-mount a granted path into the view",
    RemountGrantReadOnly => "set a grant's mount flags (nosuid, nodev, read-only)",
    HideDenied => "hide a denied path",
    WriteViewFile => "write a file of the view's own (the egress proxy's CA) into its read-only tmpfs",
    MountRoot => "mount the tmpfs of the view's new root",
    MakeViewLink => "recreate a system symlink in the view's root",
    PivotRoot => "pivot_root into the view's new root",
    DetachOldRoot => "detach the old root",
    RemountRootReadOnly => "remount the view's root read-only",
    EnterViewRoot => "chroot into the view's root",
    UnshareIpc => "unshare the IPC namespace",
    IpcUserNamespace => "make the user namespace that owns the IPC namespace (not root: one that maps root to our uid, so we may set its limits)",
    SetIpcLimit => "write an IPC limit in /proc/sys/kernel",
    UnshareUts => "unshare the UTS namespace",
    SetHostname => "set the hostname",
    UnshareNet => "unshare the network namespace",
    LoopbackUp => "bring the loopback interface up",
    ClonePidNamespace => "clone into a new PID namespace",
    UnshareExecMount => "unshare the exec's mount namespace",
    MountProc => "mount /proc",
    UnmountProbeProc => "unmount the view helper's trial /proc",
    // The exec's init.
    InitParentDeath => "set the init's parent-death signal",
    SupervisorGone => "supervisor exited during spawn",
    JoinCgroup => "join cgroup",
    SetnsMount => "join the view's mount namespace",
    SetnsIpc => "join the view's IPC namespace",
    SetnsUts => "join the view's UTS namespace",
    SetnsNet => "join the view's network namespace",
    LandlockTmpfsRule => "grant a directory of the view's own (a private tmpfs, its files) in the Landlock ruleset",
    InitSignals => "install the init's signal handlers",
    ForkCommand => "fork the command",
    // The command, in the order of child/mod.rs.
    RestoreAffinity => "restore the CPU affinity the init narrowed for the command's clone",
    Stdio => "connect stdin, stdout and stderr",
    Chdir => "change to the working directory",
    Subreaper => "become the child subreaper of the exec",
    Setsid => "setsid",
    Setpgid => "setpgid (the command's own process group)",
    ControllingTty => "make the pty the controlling terminal",
    Rlimit => "setrlimit",
    ClearAmbient => "clear ambient capabilities",
    Securebits => "set securebits",
    DropBounding => "drop bounding capability",
    Setgroups => "setgroups",
    Setresgid => "setresgid",
    Setresuid => "setresuid",
    VerifyUid => "verify uid",
    VerifyGid => "verify gid",
    Capset => "capset",
    NoNewPrivs => "set no_new_privs",
    WorkdirWritable => "check that the sandbox may write its workdir",
    ParentDeath => "set parent-death signal",
    LandlockProcRule => "grant read on the exec's /proc",
    LandlockRootRule => "grant listing the view's root",
    Landlock => "landlock",
    CloseFds => "close fds",
    ResetSignals => "reset signal dispositions and mask",
    Seccomp => "seccomp",
    Exec => "execve",
}

impl Step {
    pub fn from_u8(b: u8) -> Option<Step> {
        Step::ALL.iter().copied().find(|s| *s as u8 == b)
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
            Step::Rlimit => write!(f, "setrlimit({})", rlimit_name(self.detail))?,
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

/// The name of an rlimit resource number, as [`ChildError`]'s message gives it.
fn rlimit_name(resource: u8) -> &'static str {
    match u32::from(resource) {
        libc::RLIMIT_CORE => "core",
        libc::RLIMIT_NPROC => "nproc",
        libc::RLIMIT_NOFILE => "nofile",
        libc::RLIMIT_CPU => "cpu",
        libc::RLIMIT_AS => "as",
        libc::RLIMIT_FSIZE => "fsize",
        _ => "unknown",
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
