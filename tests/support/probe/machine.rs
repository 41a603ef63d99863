//! Machine-wide state a test changes for a while (a sysctl such as `kernel.core_pattern`), and
//! state an attempt might change if it got through (the modes and times of the host's device
//! nodes, a procfs entry's mode): both restored when the guard drops, on a panic too.
//!
//! Every guard holds [`Exclusive`], a lock on a file outside the worktree, so these tests
//! serialise with each other across test threads, test binaries and worktrees. A sysctl's
//! original value is also written beside the lock until it is restored: a test process killed
//! before its guard dropped leaves it there, and the next one to take the lock restores it.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Where the lock and the saved sysctl values live: root's, beside nothing else.
const STATE_DIR: &str = "/run/osb-test-machine-state";

/// The machine-wide lock.
pub struct Exclusive {
    _file: File,
}

impl Exclusive {
    pub fn take() -> Exclusive {
        std::fs::create_dir_all(STATE_DIR).unwrap();
        std::fs::set_permissions(STATE_DIR, std::fs::Permissions::from_mode(0o700)).unwrap();
        let file = File::create(Path::new(STATE_DIR).join("lock")).unwrap();
        // SAFETY: flock on a descriptor we own; it blocks until the lock is ours.
        assert_eq!(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) }, 0);
        // A test killed while it held a sysctl changed left the original here.
        for e in std::fs::read_dir(STATE_DIR).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(key) = name.strip_suffix(".orig") {
                let value = std::fs::read(e.path()).unwrap();
                std::fs::write(sysctl_path(key), value).unwrap();
                std::fs::remove_file(e.path()).unwrap();
            }
        }
        Exclusive { _file: file }
    }
}

fn sysctl_path(key: &str) -> PathBuf {
    Path::new("/proc/sys").join(key.replace('.', "/"))
}

/// A sysctl set for the guard's lifetime (`key` as `kernel.core_pattern`).
pub struct Sysctl {
    key: String,
    original: Vec<u8>,
}

impl Sysctl {
    /// Set `key` to `value`; `Err` when the kernel refuses the value (nothing changed).
    pub fn set(_lock: &Exclusive, key: &str, value: &str) -> std::io::Result<Sysctl> {
        let path = sysctl_path(key);
        let original = std::fs::read(&path)?;
        let saved = Path::new(STATE_DIR).join(format!("{key}.orig"));
        std::fs::write(&saved, &original)?;
        if let Err(e) = std::fs::write(&path, value) {
            std::fs::remove_file(&saved)?;
            return Err(e);
        }
        Ok(Sysctl {
            key: key.to_string(),
            original,
        })
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        // Panicking here would abort a test that is already unwinding: report instead.
        match std::fs::write(sysctl_path(&self.key), &self.original) {
            Ok(()) => {
                let _ =
                    std::fs::remove_file(Path::new(STATE_DIR).join(format!("{}.orig", self.key)));
            }
            Err(e) => super::loud(&format!(
                "RESTORING {} FAILED ({e}); it is kept in {STATE_DIR}",
                self.key
            )),
        }
    }
}

/// Mode and times of one host file, as the test reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeState {
    pub mode: u32,
    pub atime: (i64, i64),
    pub mtime: (i64, i64),
}

impl NodeState {
    /// For a procfs entry, the mode a fresh procfs mount gives it: the host's /proc keeps the
    /// inode it already had, while the kernel-wide entry (what every later /proc shows) is
    /// what a run could change. procfs keeps no times for such entries.
    pub fn of(path: &Path) -> NodeState {
        if let Ok(rel) = path.strip_prefix("/proc") {
            return NodeState {
                mode: fresh_proc_mode(rel),
                atime: (0, 0),
                mtime: (0, 0),
            };
        }
        let m = std::fs::metadata(path).unwrap();
        NodeState {
            mode: m.mode() & 0o7777,
            atime: (m.atime(), m.atime_nsec()),
            mtime: (m.mtime(), m.mtime_nsec()),
        }
    }
}

/// The mode of `/proc/<rel>` on a procfs mounted just now, in a mount namespace of its own.
fn fresh_proc_mode(rel: &Path) -> u32 {
    let out = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"d=$(mktemp -d) && mount -t proc proc "$d" && stat -c %a "$d/$1"; r=$?; umount "$d"; rmdir "$d"; exit $r"#)
        .arg("sh")
        .arg(rel)
        .output()
        .expect("running unshare to mount a fresh procfs");
    assert!(
        out.status.success(),
        "a fresh procfs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    u32::from_str_radix(String::from_utf8_lossy(&out.stdout).trim(), 8).unwrap()
}

/// Host files whose mode and times a run must not change: recorded now, put back on drop.
pub struct Nodes {
    pub before: Vec<(PathBuf, NodeState)>,
}

impl Nodes {
    pub fn record(_lock: &Exclusive, paths: &[&Path]) -> Nodes {
        Nodes {
            before: paths
                .iter()
                .map(|p| (p.to_path_buf(), NodeState::of(p)))
                .collect(),
        }
    }

    /// (path, before, now) of every file that changed.
    pub fn changed(&self) -> Vec<(PathBuf, NodeState, NodeState)> {
        self.before
            .iter()
            .filter_map(|(p, b)| {
                let now = NodeState::of(p);
                (now != *b).then(|| (p.clone(), *b, now))
            })
            .collect()
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for (p, b, now) in self.changed() {
            let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: chmod and utimensat with a NUL-terminated path and a stack array.
            let ok = unsafe {
                let ts = [
                    libc::timespec {
                        tv_sec: b.atime.0,
                        tv_nsec: b.atime.1,
                    },
                    libc::timespec {
                        tv_sec: b.mtime.0,
                        tv_nsec: b.mtime.1,
                    },
                ];
                // procfs keeps no times of its own: only the mode can (and must) go back,
                // and a chmod through any procfs mount sets the kernel-wide entry's.
                let times = now.atime == b.atime && now.mtime == b.mtime
                    || libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) == 0;
                libc::chmod(c.as_ptr(), b.mode) == 0 && times
            };
            if !ok {
                super::loud(&format!(
                    "RESTORING {} FAILED: it was {b:?}, it is {now:?}",
                    p.display()
                ));
            }
        }
    }
}
