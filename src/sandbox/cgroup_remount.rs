//! Read-only cgroups in a pod: containerd (and CRI-O, and runc's default spec) mount
//! `/sys/fs/cgroup` read-only in the container. The supervisor is root with CAP_SYS_ADMIN
//! there (OpenShell's sandbox pod grants it), so it may make per-exec cgroups, but not through a read-only
//! mount: every `--memory`, `--pids` and whole-tree `--cpu` would be degraded in exactly the
//! place they matter.
//!
//! The choice: a root supervisor that finds a cgroup mount read-only makes itself a private,
//! read-write copy of that mount that is attached nowhere (`open_tree(OPEN_TREE_CLONE)`, then
//! `mount_setattr` clearing MOUNT_ATTR_RDONLY on the copy), holds it by descriptor, and does
//! all its cgroup work below `/proc/self/fd/N`. Why that, and not "report degraded", and not a
//! plain remount:
//! - It adds no privilege. Whoever is root with CAP_SYS_ADMIN in the pod can do the same; the
//!   supervisor is that process already.
//! - It changes nothing for anyone else. The copy is in no mount namespace, so the pod's mounts
//!   stay read-only, for PID 1 too, and for whatever joins the pod later (`kubectl exec` joins
//!   PID 1's namespaces, so a remount in a namespace of PID 1's own would have reached it).
//! - The sandboxed commands cannot reach it: the descriptor is close-on-exec and every exec
//!   closes all descriptors before it runs the command; they run as an unprivileged uid with
//!   every capability dropped, under Landlock, which grants no write below /sys.
//! - The one real cost, on cgroup v1: the copy also makes the *container's own* limit files
//!   writable to the supervisor (v1 has no check against a cgroup namespace writing its own
//!   root's files; v2 with `nsdelegate` has). The supervisor only ever writes below its own
//!   `openshell-owned-*` groups, and nothing sandboxed can reach the copy.
//!
//! Where the copy is refused (a kernel before 5.12 has no mount_setattr, a user namespace locked
//! the mount read-only, an LSM refuses it), nothing changes and the cgroup layer reports why
//! ([`note`]): refused without `--allow-degraded` when a limit was asked for.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// What happened at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Remount {
    /// Not root, or every cgroup mount was writable already.
    NotNeeded,
    /// These mount points were read-only; a read-write copy of each is used instead.
    Done(Vec<String>),
    /// They were read-only and stay so: why.
    Failed(String),
}

struct State {
    outcome: Remount,
    /// Hierarchy (the mount point relative to /sys/fs/cgroup: "pids", "cpu,cpuacct", or "" for
    /// a v2 mount at /sys/fs/cgroup itself) → its read-write copy, as /proc/self/fd/N.
    copies: Vec<(String, PathBuf)>,
    /// The copies' descriptors, held for the life of the process.
    _fds: Vec<OwnedFd>,
}

static STATE: OnceLock<State> = OnceLock::new();

/// The start-up outcome (NotNeeded when [`make_writable`] never ran).
pub fn outcome() -> &'static Remount {
    STATE.get().map_or(&Remount::NotNeeded, |s| &s.outcome)
}

/// The path to use for the hierarchy mounted at `/sys/fs/cgroup/NAME` ("" for the mount
/// itself): its read-write copy when start-up made one.
pub fn copy_of(name: &str) -> Option<&'static Path> {
    STATE
        .get()?
        .copies
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, p)| p.as_path())
}

/// Whether start-up made any read-write copy (else every hierarchy is used at its mount).
pub fn any_copy() -> bool {
    STATE.get().is_some_and(|s| !s.copies.is_empty())
}

/// `path` for people: a path below a copy is shown below the mount point it copies.
pub fn shown(path: &Path) -> String {
    if let Some(st) = STATE.get() {
        for (name, copy) in &st.copies {
            if let Ok(rest) = path.strip_prefix(copy) {
                let mut real = PathBuf::from("/sys/fs/cgroup");
                if !name.is_empty() {
                    real.push(name);
                }
                return real.join(rest).display().to_string();
            }
        }
    }
    path.display().to_string()
}

/// A sentence for the cgroup layer's detail, when there is something to say.
pub fn note() -> Option<String> {
    match outcome() {
        Remount::NotNeeded => None,
        Remount::Done(m) => Some(format!(
            "read-only cgroup mounts used through a private read-write copy: {}",
            m.join(", ")
        )),
        Remount::Failed(why) => Some(format!(
            "/sys/fs/cgroup is read-only and no read-write copy could be made: {why}"
        )),
    }
}

/// One cgroup mount of /proc/self/mountinfo.
#[derive(Debug, PartialEq, Eq)]
struct CgroupMount {
    point: String,
    read_only: bool,
    /// nosuid, nodev, noexec as they are (kept on the copy: mount_setattr clears only
    /// read-only).
    flags: libc::c_ulong,
}

/// mountinfo escapes space, tab, newline and backslash as \ooo.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup and cgroup2 mounts at or below /sys/fs/cgroup.
fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let f: Vec<&str> = left.split(' ').collect();
        let fstype = right.split(' ').next().unwrap_or("");
        if f.len() < 6 || !matches!(fstype, "cgroup" | "cgroup2") {
            continue;
        }
        let point = unescape(f[4]);
        if point != "/sys/fs/cgroup" && !point.starts_with("/sys/fs/cgroup/") {
            continue;
        }
        let opts: Vec<&str> = f[5].split(',').collect();
        let mut flags = 0;
        for (name, bit) in [
            ("nosuid", libc::MS_NOSUID),
            ("nodev", libc::MS_NODEV),
            ("noexec", libc::MS_NOEXEC),
        ] {
            if opts.contains(&name) {
                flags |= bit;
            }
        }
        out.push(CgroupMount {
            point,
            read_only: opts.contains(&"ro"),
            flags,
        });
    }
    out
}

fn errno_text(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

use crate::sys::mount::{MOUNT_ATTR_RDONLY, MountAttr, OPEN_TREE_CLONE};

/// A detached, read-write copy of the mount at `point`.
fn rw_copy(point: &str) -> Result<OwnedFd, String> {
    let c = CString::new(point).map_err(|_| format!("{point}: NUL in the path"))?;
    // SAFETY: open_tree with a NUL-terminated path; the result is a new descriptor we own.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            c.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(errno_text(&format!("open_tree({point}, OPEN_TREE_CLONE)")));
    }
    // SAFETY: just created, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    let attr = MountAttr {
        attr_set: 0,
        attr_clr: MOUNT_ATTR_RDONLY,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: mount_setattr on our detached tree, with a mount_attr of the size we pass.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc != 0 {
        return Err(errno_text(&format!(
            "clearing read-only on the copy of {point}"
        )));
    }
    Ok(fd)
}

/// See the module docs. Called once, from `main`, before anything uses a cgroup.
pub fn make_writable() -> &'static Remount {
    &STATE
        .get_or_init(|| {
            let none = |outcome| State {
                outcome,
                copies: Vec::new(),
                _fds: Vec::new(),
            };
            if crate::sys::process::euid() != 0 {
                return none(Remount::NotNeeded);
            }
            let Ok(info) = super::mountinfo::read() else {
                return none(Remount::NotNeeded);
            };
            // The last mount at a point is the visible one.
            let mut ro: Vec<CgroupMount> = Vec::new();
            for m in cgroup_mounts(&info) {
                ro.retain(|o| o.point != m.point);
                ro.push(m);
            }
            ro.retain(|m| m.read_only);
            if ro.is_empty() {
                return none(Remount::NotNeeded);
            }
            let mut copies = Vec::new();
            let mut fds = Vec::new();
            for m in &ro {
                match rw_copy(&m.point) {
                    Ok(fd) => {
                        let name = m
                            .point
                            .strip_prefix("/sys/fs/cgroup")
                            .unwrap_or("")
                            .trim_start_matches('/')
                            .to_string();
                        copies.push((
                            name,
                            PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())),
                        ));
                        fds.push(fd);
                    }
                    // All or nothing: a half-writable set of hierarchies would enforce some
                    // limits and not others without saying which.
                    Err(why) => return none(Remount::Failed(why)),
                }
            }
            State {
                outcome: Remount::Done(ro.iter().map(|m| m.point.clone()).collect()),
                copies,
                _fds: fds,
            }
        })
        .outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUNC: &str = "\
1310 1309 0:95 / / rw,relatime - overlay overlay rw
1320 1310 0:99 / /sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs ro
1321 1320 0:100 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,mode=755
1322 1321 0:30 /osb-e2e/c1 /sys/fs/cgroup/pids ro,nosuid,nodev,noexec,relatime - cgroup cgroup rw,pids
1323 1321 0:31 /osb-e2e/c1 /sys/fs/cgroup/cpu,cpuacct ro,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpu,cpuacct
1324 1321 0:32 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,memory
1325 1310 0:33 / /mnt/cgroup\\040x ro,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn finds_cgroup_mounts_below_sys_fs_cgroup_with_their_flags() {
        let m = cgroup_mounts(RUNC);
        assert_eq!(m.len(), 3, "{m:?}");
        assert_eq!(m[0].point, "/sys/fs/cgroup/pids");
        assert!(m[0].read_only);
        assert_eq!(
            m[0].flags,
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC
        );
        assert_eq!(m[1].point, "/sys/fs/cgroup/cpu,cpuacct");
        assert!(!m[2].read_only, "memory is rw here");
    }

    #[test]
    fn cgroup2_at_the_top_counts_and_escapes_are_undone() {
        let v2 = "30 25 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate\n";
        let m = cgroup_mounts(v2);
        assert_eq!(m.len(), 1);
        assert!(m[0].read_only);
        assert_eq!(unescape("/a\\040b\\134c"), "/a b\\c");
        assert_eq!(unescape("/trailing\\04"), "/trailing\\04");
    }
}
