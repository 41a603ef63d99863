//! Landlock layer: filesystem access, TCP bind/connect (ABI ≥ 4) and IPC scoping (ABI ≥ 6).
//!
//! The ruleset is built once in the supervisor with the `landlock` crate, at the best ABI the
//! kernel offers and with every feature a hard requirement, so the kernel object we hold is
//! exactly what the policy asks for. The child then only calls `landlock_restrict_self` on that
//! file descriptor: one raw syscall, safe between fork and exec.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, Ruleset,
    RulesetAttr, RulesetCreatedAttr, Scope,
};

use crate::policy::{FsRule, NetworkMode, PathAccess};

#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    #[error("Landlock is not available in this kernel (landlock_create_ruleset: {0})")]
    Unsupported(std::io::Error),
    #[error("creating the Landlock ruleset: {0}")]
    Ruleset(#[from] landlock::RulesetError),
    #[error("the Landlock ruleset has no file descriptor (kernel without Landlock)")]
    NoFd,
}

/// What this kernel's Landlock can do.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Support {
    /// The ABI version the kernel reports (0 = none).
    pub abi: i32,
    pub filesystem: bool,
    /// TCP bind/connect restriction (ABI ≥ 4).
    pub network: bool,
    /// Abstract unix socket and signal scoping (ABI ≥ 6).
    pub scopes: bool,
}

/// Ask the kernel for its Landlock ABI version.
pub fn probe() -> Result<Support, LandlockError> {
    // SAFETY: LANDLOCK_CREATE_RULESET_VERSION with a NULL attr and size 0 only returns a number.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    if abi < 0 {
        return Err(LandlockError::Unsupported(std::io::Error::last_os_error()));
    }
    let abi = abi as i32;
    Ok(Support {
        abi,
        filesystem: abi >= 1,
        network: abi >= 4,
        scopes: abi >= 6,
    })
}

fn crate_abi(abi: i32) -> ABI {
    match abi {
        i32::MIN..=0 => ABI::Unsupported,
        1 => ABI::V1,
        2 => ABI::V2,
        3 => ABI::V3,
        4 => ABI::V4,
        5 => ABI::V5,
        6 => ABI::V6,
        7 => ABI::V7,
        8 => ABI::V8,
        _ => ABI::V9,
    }
}

/// A built ruleset, ready to be enforced in a child.
#[derive(Debug)]
pub struct PreparedRuleset {
    fd: OwnedFd,
    pub support: Support,
    /// TCP was restricted (the policy asked for no network and the ABI allows it).
    pub network_restricted: bool,
    pub scoped: bool,
    /// The read-and-execute rights, as raw bits, for [`PreparedRuleset::add_fresh_proc_rule`].
    read_exec_bits: u64,
    /// Every filesystem right, as raw bits, for [`PreparedRuleset::add_tmpfs_rule`].
    all_bits: u64,
    /// What [`PreparedRuleset::copy`] needs: `struct landlock_ruleset_attr` as created
    /// (handled filesystem rights, handled network rights, scopes) and every rule added here,
    /// each by its rule's descriptor (shared with the rule, not copied: a `fcntl` and a
    /// `close` per grant) and its rights.
    attr: [u64; 3],
    rules: Vec<(std::sync::Arc<OwnedFd>, u64)>,
    /// The next exec's copy, made while the machine is idle ([`PreparedRuleset::make_spare`]).
    spare: std::sync::Mutex<Option<Box<PreparedRuleset>>>,
}

/// The right [`PreparedRuleset::add_view_root_rule`] grants: listing a directory.
const READ_DIR_BITS: u64 = 1 << 3; // LANDLOCK_ACCESS_FS_READ_DIR

/// Build the ruleset for these rules. `want_net_restriction` and `want_scopes` are requested
/// only when the kernel supports them; the caller decides (fail closed or degrade) when it does
/// not, from `support`.
pub fn prepare(
    rules: &[FsRule],
    network: NetworkMode,
    support: Support,
) -> Result<PreparedRuleset, LandlockError> {
    let abi = crate_abi(support.abi);
    let all = AccessFs::from_all(abi);
    let read_exec = AccessFs::from_read(abi);
    // Devices: read and write an existing file, including device ioctls (ABI ≥ 5) that
    // terminals need, but nothing that creates or removes entries.
    let device = (read_exec | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev)
        & AccessFs::from_file(abi);

    let restrict_net = network == NetworkMode::None && support.network;
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(all)?;
    if restrict_net {
        // Handling both rights with no net rule at all denies every TCP bind and connect.
        ruleset = ruleset.handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)?;
    }
    if support.scopes {
        // Without these, a sandboxed child could signal the supervisor (same uid when we are
        // not root) or connect to abstract unix sockets of processes outside the sandbox.
        ruleset = ruleset.scope(Scope::AbstractUnixSocket | Scope::Signal)?;
    }
    let attr = [
        all.bits(),
        if restrict_net {
            (AccessNet::BindTcp | AccessNet::ConnectTcp).bits()
        } else {
            0
        },
        if support.scopes {
            (Scope::AbstractUnixSocket | Scope::Signal).bits()
        } else {
            0
        },
    ];
    let mut kept = Vec::with_capacity(rules.len());
    let mut created = ruleset.create()?;
    // Race tests hold the supervisor here: the rules were decided, Landlock has not seen them.
    crate::pause::point("landlock-rules");
    for r in rules {
        let access: BitFlags<AccessFs> = match r.access {
            PathAccess::ReadExec => read_exec,
            PathAccess::ReadWrite => all,
            PathAccess::Device => device,
        };
        // A rule on a non-directory may only carry file rights; the kernel answers EINVAL
        // otherwise. Directory-only rights are dropped for files here.
        let access = if r.is_dir {
            access
        } else {
            access & AccessFs::from_file(abi)
        };
        // The descriptor the expansion decided on, never the path again: a path looked up
        // now would follow whatever link was swapped in since (finding: exchange race).
        created = created.add_rule(PathBeneath::new(r.fd.as_fd(), access))?;
        kept.push((r.fd.clone(), access.bits()));
    }
    let fd: Option<OwnedFd> = created.into();
    let fd = fd.ok_or(LandlockError::NoFd)?;
    Ok(PreparedRuleset {
        fd,
        support,
        network_restricted: restrict_net,
        scoped: support.scopes,
        read_exec_bits: read_exec.bits(),
        all_bits: all.bits(),
        attr,
        rules: kept,
        spare: Default::default(),
    })
}

/// struct landlock_path_beneath_attr (packed, as the UAPI declares it).
#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

impl PreparedRuleset {
    /// A new ruleset object holding the same rules, for one exec of a sandbox that serves many:
    /// the rules an exec adds for itself ([`PreparedRuleset::add_fresh_proc_rule`]: a new
    /// inode each time) must not pile up in the shared object, whose every rule each later
    /// exec's `landlock_restrict_self` copies into its domain (about 60 µs with 20 rules,
    /// 190 µs with 400, 720 µs with 2000). Raw syscalls on kept descriptors: the parent makes
    /// it before the clone.
    pub fn copy(&self) -> std::io::Result<PreparedRuleset> {
        const LANDLOCK_RULE_PATH_BENEATH: u32 = 1;
        // SAFETY: landlock_create_ruleset with a pointer to our 24-byte attr and its size; a
        // kernel whose struct is shorter accepts it when the bytes past its own are zero,
        // which they are for every feature it lacks (prepare asked only for those it has).
        let fd = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                self.attr.as_ptr(),
                std::mem::size_of_val(&self.attr),
                0u32,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this descriptor; nobody else owns it.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
        for (rule, bits) in &self.rules {
            let attr = PathBeneathAttr {
                allowed_access: *bits,
                parent_fd: rule.as_raw_fd(),
            };
            // SAFETY: both descriptors are live; `attr` is a packed attr on our stack.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_landlock_add_rule,
                    fd.as_raw_fd(),
                    LANDLOCK_RULE_PATH_BENEATH,
                    &attr as *const PathBeneathAttr,
                    0u32,
                )
            };
            if rc != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(PreparedRuleset {
            fd,
            support: self.support,
            network_restricted: self.network_restricted,
            scoped: self.scoped,
            read_exec_bits: self.read_exec_bits,
            all_bits: self.all_bits,
            attr: self.attr,
            rules: Vec::new(),
            spare: Default::default(),
        })
    }

    /// A copy for one exec ([`PreparedRuleset::copy`]): the one made ahead when there is one
    /// (each is handed out once), else a new one.
    pub fn take_copy(&self) -> std::io::Result<PreparedRuleset> {
        let ahead = self.spare.lock().unwrap_or_else(|p| p.into_inner()).take();
        match ahead {
            Some(c) => Ok(*c),
            None => self.copy(),
        }
    }

    /// Make the next exec's copy now (its create and add_rule calls, ~20 µs with 17 rules),
    /// while an exec runs, so that the next spawn only takes it. A copy replays the rules
    /// kept at `prepare`, which nothing changes later, so one made now holds what one made at
    /// the spawn would.
    pub fn make_spare(&self) {
        let mut spare = self.spare.lock().unwrap_or_else(|p| p.into_inner());
        if spare.is_none() {
            *spare = self.copy().ok().map(Box::new);
        }
    }

    /// Child side, before [`PreparedRuleset::enforce`]: grant read on the exec's own fresh /proc.
    /// Landlock skips mount points when it walks up a path, so the rule the supervisor put on
    /// its own /proc never covers a proc instance mounted later on top of it; the rule has to
    /// name the new instance's root, which exists only in this child. The rule stays in the
    /// ruleset object it is added to, so an exec of a sandbox that serves many adds it to a
    /// [`PreparedRuleset::copy`] of its own (exec/manager.rs), never to the shared one.
    /// Async-signal-safe: raw syscalls only.
    pub fn add_fresh_proc_rule(&self) -> Result<(), i32> {
        self.add_dir_rule(c"/proc", self.read_exec_bits)
    }

    /// In `run`'s exec init, once it has mounted the view's private tmpfs at `dir`: grant
    /// every right beneath it, as the supervisor grants the roots of a view made ahead (by
    /// their descriptors). Async-signal-safe: raw syscalls only.
    pub fn add_tmpfs_rule(&self, dir: &std::ffi::CStr) -> Result<(), i32> {
        self.add_dir_rule(dir, self.all_bits)
    }

    /// In `run`'s exec init, once it has made `dir`, a directory only the view holds (its own
    /// files, the overlay that gives them a mount point): grant read and execute beneath it,
    /// as the supervisor grants those of a view made ahead. Async-signal-safe.
    pub fn add_view_read_rule(&self, dir: &std::ffi::CStr) -> Result<(), i32> {
        self.add_dir_rule(dir, self.read_exec_bits)
    }

    /// Child side, in the view, before [`PreparedRuleset::enforce`]: allow listing the view's
    /// root (`ls /`, `find /`, shells and build tools that read it). The root is a tmpfs that
    /// holds only the grants (view_root.rs), so listing it shows nothing else; it exists only
    /// in the view, so the supervisor cannot name it. The right covers every directory below
    /// too, as Landlock rules do: there it adds nothing to a grant's own rights, the covers of
    /// denied paths are mode 000 to the sandbox (which holds no capability to override that),
    /// and what it newly lets be listed is the view's own scaffolding (`/dev` holding only the
    /// granted devices, the directories leading to a grant). Only where the view has that
    /// root: on the host's root this would list the whole filesystem. Async-signal-safe.
    pub fn add_view_root_rule(&self) -> Result<(), i32> {
        self.add_dir_rule(c"/", READ_DIR_BITS)
    }

    /// A path-beneath rule with `bits` on the directory `dir` as the caller sees it now.
    fn add_dir_rule(&self, dir: &std::ffi::CStr, bits: u64) -> Result<(), i32> {
        const LANDLOCK_RULE_PATH_BENEATH: u32 = 1;
        // SAFETY: open of a NUL-terminated path; the fd is closed below.
        let fd = unsafe {
            libc::open(
                dir.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(crate::sys::errno());
        }
        let attr = PathBeneathAttr {
            allowed_access: bits,
            parent_fd: fd,
        };
        // SAFETY: the ruleset fd is live; `attr` is a valid packed attr on our stack.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_landlock_add_rule,
                self.fd.as_raw_fd(),
                LANDLOCK_RULE_PATH_BENEATH,
                &attr as *const PathBeneathAttr,
                0u32,
            )
        };
        let e = crate::sys::errno();
        // SAFETY: closing the fd opened above.
        unsafe { libc::close(fd) };
        if rc != 0 {
            return Err(e);
        }
        Ok(())
    }

    /// Enforce the ruleset on the calling thread. Async-signal-safe: one raw syscall.
    /// no_new_privs must already be set (the identity layer does it first).
    pub fn enforce(&self) -> Result<(), i32> {
        // SAFETY: the fd is a live Landlock ruleset owned by `self`; flags 0.
        let rc =
            unsafe { libc::syscall(libc::SYS_landlock_restrict_self, self.fd.as_raw_fd(), 0u32) };
        if rc == 0 {
            Ok(())
        } else {
            Err(crate::sys::errno())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::sync::Arc;

    /// In a forked child: enforce `r`, then open each of `paths`; the errno of each (0: it
    /// opened), as the child's exit status's bits (bit i set: path i was refused).
    fn refused(r: &PreparedRuleset, paths: &[&CString]) -> i32 {
        // SAFETY: the child makes raw syscalls on prepared data only, then _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: we are the forked child; nothing here allocates.
            unsafe {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                if r.enforce().is_err() {
                    libc::_exit(255);
                }
                let mut bits = 0;
                for (i, p) in paths.iter().enumerate() {
                    let fd = libc::open(p.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY);
                    if fd < 0 && crate::sys::errno() == libc::EACCES {
                        bits |= 1 << i;
                    }
                }
                libc::_exit(bits);
            }
        }
        let mut st = 0;
        // SAFETY: waiting for our own child into a stack integer.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        assert!(libc::WIFEXITED(st), "{st:#x}");
        libc::WEXITSTATUS(st)
    }

    /// A ruleset granting one directory (`g`), and another directory it does not grant (`o`),
    /// for an exec to add its own rule on. None (skipped) on a kernel without Landlock.
    struct World {
        shared: PreparedRuleset,
        g: CString,
        o: CString,
        _dirs: [tempfile::TempDir; 2],
    }

    impl World {
        fn new() -> Option<World> {
            let Ok(support) = probe() else {
                if std::env::var("CI").as_deref() == Ok("true") {
                    panic!("Landlock is required (CI=true turns this skip into a failure)");
                }
                eprintln!("SKIPPED: this kernel has no Landlock");
                return None;
            };
            let (granted, own) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            let fd = std::fs::File::open(granted.path()).unwrap();
            let rules = vec![FsRule {
                path: granted.path().to_path_buf(),
                access: PathAccess::ReadExec,
                is_dir: true,
                fd: Arc::new(OwnedFd::from(fd)),
            }];
            let shared = prepare(&rules, NetworkMode::All, support).unwrap();
            let c = |p: &std::path::Path| CString::new(p.as_os_str().as_bytes()).unwrap();
            Some(World {
                shared,
                g: c(granted.path()),
                o: c(own.path()),
                _dirs: [granted, own],
            })
        }
    }

    /// An exec's own rules go to its copy: the shared ruleset, from which each later exec's
    /// copy is made, never holds them (they would pile up, one per exec, and every
    /// restrict_self copies them all).
    #[test]
    fn a_copy_holds_the_rules_and_takes_the_execs_own_alone() {
        let Some(w) = World::new() else { return };
        let (shared, g, o) = (&w.shared, w.g.clone(), w.o.clone());
        let copy = shared.copy().unwrap();
        copy.add_view_read_rule(&o).unwrap();
        assert_eq!(refused(&copy, &[&g, &o]), 0, "the copy allows both");
        assert_eq!(
            refused(shared, &[&g, &o]),
            0b10,
            "the shared one has no exec's rule"
        );
        assert_eq!(
            refused(&shared.copy().unwrap(), &[&g, &o]),
            0b10,
            "nor has the next copy"
        );
    }

    /// The copy made ahead is handed out once: the exec after takes a copy of its own, and
    /// the rule one exec adds to its copy reaches neither.
    #[test]
    fn a_copy_made_ahead_is_handed_out_once() {
        let Some(w) = World::new() else { return };
        let (shared, g, o) = (&w.shared, w.g.clone(), w.o.clone());
        shared.make_spare();
        let first = shared.take_copy().unwrap();
        first.add_view_read_rule(&o).unwrap();
        assert_eq!(
            refused(&first, &[&g, &o]),
            0,
            "the copy made ahead holds the rules"
        );
        shared.make_spare();
        let second = shared.take_copy().unwrap();
        let third = shared.take_copy().unwrap();
        for (n, r) in [("second", &second), ("third", &third)] {
            assert_eq!(
                refused(r, &[&g, &o]),
                0b10,
                "the {n} copy has the first's rule"
            );
        }
    }
}
