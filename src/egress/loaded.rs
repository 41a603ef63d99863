//! Whether a process may run code the sandbox chose, besides its executable's own and the
//! system's: what makes an allowed binary speak for someone else (`docs/egress.md`, "Who is
//! calling").
//!
//! Two kinds of evidence, both read from the kernel:
//! - **its environment asks the dynamic loader to load more**: `LD_PRELOAD` or `LD_AUDIT`,
//!   not empty, in `/proc/<pid>/environ` (the block the process was started with, which is
//!   what the loader read);
//! - **an executable mapping of a file the sandbox could write** (`/proc/<pid>/maps`, the
//!   mappings with `x`; the executable's own image aside, which the binary rule names and the
//!   integrity pin covers). The file is opened through `/proc/<pid>/map_files/`, which gives
//!   the very mount it was mapped through, and is trusted when that mount is read-only
//!   (`fstatvfs`: the sandbox's view binds every read-only grant so), or when the file is
//!   root's and not writable by group or others, unless the process is a sandbox's running as
//!   root (a system library on a writable mount, without the view; a `--uid 0` sandbox owns
//!   what it writes, so for it only the read-only mount counts). Anything else (the sandbox's `/tmp`,
//!   the workdir, a memfd, a deleted file of the sandbox's) is untrusted. Where
//!   `map_files` is refused (it needs `CAP_SYS_ADMIN`), the path the maps show is looked up
//!   in the process's root and trusted only when it is the same inode and root's (and the
//!   process not root).
//!
//! Not seen: code the process makes itself in anonymous memory (an interpreter running a
//! script it was given, a JIT): a binary that runs whatever it is told is that code's voice,
//! which is why SECURITY.md says what a `binaries` rule is a guard against.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::sync::Mutex;
use std::time::Instant;

use sha2::{Digest, Sha256};

use super::identity::ns_inode;
use super::proctext;

/// Verdicts remembered at most; the table is cleared when full.
const VERDICTS_MAX: usize = 4096;
/// The part of an environment or a maps file read.
const MAX_READ: u64 = 4 << 20;

/// (mount namespace, device, inode, path, [`sandboxed_root`]): within one mount
/// namespace a path is one mount, and a file the sandbox could not write stays so.
type FileKey = (u64, u64, u64, String, bool);

/// The per-file verdicts (`None`: trusted; `Some(why)`), and each process's last maps with
/// the answer they gave.
#[derive(Default)]
pub struct CodeCheck {
    verdicts: Mutex<HashMap<FileKey, Option<String>>>,
    last: Mutex<HashMap<u32, LastMaps>>,
}

/// A process's maps as last read: the same text of the same executable in the same mount
/// namespace gives the same answer, without parsing it again (a process making a burst of
/// connections is checked once per connection). The text is kept as its SHA-256: it is up to
/// [`MAX_READ`] of the sandbox's choosing per process, which for every remembered process
/// would be gigabytes of the supervisor's memory.
struct LastMaps {
    key: (u64, u64, u64, bool),
    digest: [u8; 32],
    answer: Option<String>,
}

/// The environment variables that make the dynamic loader load code the caller chose.
const LOADER_VARS: [&str; 2] = ["LD_PRELOAD", "LD_AUDIT"];

impl CodeCheck {
    /// What in `pid`'s environment asks the loader for more code, if anything.
    pub fn environment(&self, pid: u32) -> io::Result<Option<String>> {
        let b = proctext::read_bytes(&format!("/proc/{pid}/environ"), MAX_READ + 1)?;
        // The loader reads all of it (a raised stack limit allows more than the cut).
        if b.len() as u64 > MAX_READ {
            return Ok(Some(format!(
                "its environment is more than {} MiB, past what is read",
                MAX_READ >> 20
            )));
        }
        for var in b.split(|c| *c == 0) {
            for name in LOADER_VARS {
                if let Some(v) = var
                    .strip_prefix(name.as_bytes())
                    .and_then(|r| r.strip_prefix(b"="))
                    && !v.iter().all(|c| c.is_ascii_whitespace() || *c == b':')
                {
                    return Ok(Some(format!("{name} in its environment")));
                }
            }
        }
        Ok(None)
    }

    /// The first executable mapping of `pid` that comes from a file the sandbox could write,
    /// described, if any. `image` is the (device, inode) of the executable as the caller
    /// checked it, whose own mappings are left to its integrity pin (`None`: the one
    /// `/proc/<pid>/exe` leads to now; a process that has exec'd since the caller's check has
    /// none of that image's mappings, and its new image's are checked like any file's). With
    /// `until`, the check gives up at that instant (`ErrorKind::TimedOut`): a lookup on the
    /// proxy's own thread then moves to a blocking one, and never takes that error for
    /// evidence.
    pub fn mappings(
        &self,
        pid: u32,
        image: Option<(u64, u64)>,
        until: Option<Instant>,
    ) -> io::Result<Option<String>> {
        let image = match image {
            Some(i) => i,
            None => {
                let m = fs::metadata(format!("/proc/{pid}/exe"))?;
                (m.dev(), m.ino())
            }
        };
        let mntns = ns_inode(pid, "mnt")?;
        let root = sandboxed_root(pid)?;
        let text = proctext::read_bytes(&format!("/proc/{pid}/maps"), MAX_READ + 1)?;
        let text =
            String::from_utf8(text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        // The rest is not read, and the process chooses what lies there (maps are in address
        // order, and it can put mappings below its own): more than the cut is evidence.
        if text.len() as u64 > MAX_READ {
            return Ok(Some(format!(
                "its mappings are more than {} MiB of text, past what is read",
                MAX_READ >> 20
            )));
        }
        let key = (mntns, image.0, image.1, root);
        let digest: [u8; 32] = Sha256::digest(text.as_bytes()).into();
        if let Some(l) = self
            .last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&pid)
            && l.key == key
            && l.digest == digest
        {
            return Ok(l.answer.clone());
        }
        let answer = self
            .parse(pid, &text, mntns, image, root, until)
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::TimedOut, "the check of the mappings gave up")
            })?;
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.len() >= VERDICTS_MAX {
            last.clear();
        }
        last.insert(
            pid,
            LastMaps {
                key,
                digest,
                answer: answer.clone(),
            },
        );
        Ok(answer)
    }

    /// The first untrusted executable mapping of one maps text; `None` when `until` passed
    /// first (a file is looked at for each mapping not seen before, and the sandbox chooses
    /// how many there are).
    fn parse(
        &self,
        pid: u32,
        text: &str,
        mntns: u64,
        exe: (u64, u64),
        root: bool,
        until: Option<Instant>,
    ) -> Option<Option<String>> {
        for (i, line) in text.lines().enumerate() {
            if i % 64 == 63 && until.is_some_and(|u| Instant::now() >= u) {
                return None;
            }
            let Some(m) = Mapping::parse(line) else {
                continue;
            };
            if !m.exec || m.inode == 0 || (m.dev, m.inode) == exe {
                continue;
            }
            let key = (mntns, m.dev, m.inode, m.path.to_string(), root);
            let cached = self
                .verdicts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&key)
                .cloned();
            let verdict = match cached {
                Some(v) => v,
                None => {
                    let v = verdict(pid, &m, exe, root);
                    let mut t = self.verdicts.lock().unwrap_or_else(|p| p.into_inner());
                    if t.len() >= VERDICTS_MAX {
                        t.clear();
                    }
                    t.insert(key, v.clone());
                    v
                }
            };
            if verdict.is_some() {
                return Some(verdict);
            }
        }
        Some(None)
    }
}

/// One line of `/proc/<pid>/maps`.
struct Mapping<'a> {
    range: &'a str,
    exec: bool,
    dev: u64,
    inode: u64,
    path: &'a str,
}

impl<'a> Mapping<'a> {
    /// `start-end perms offset major:minor inode [path]`.
    fn parse(line: &'a str) -> Option<Mapping<'a>> {
        let mut f = line.splitn(6, ' ');
        let range = f.next()?;
        let perms = f.next()?;
        let _offset = f.next()?;
        let (maj, min) = f.next()?.split_once(':')?;
        let inode = f.next()?.parse().ok()?;
        let path = f.next().unwrap_or("").trim_start();
        let dev = libc::makedev(
            u32::from_str_radix(maj, 16).ok()?,
            u32::from_str_radix(min, 16).ok()?,
        );
        Some(Mapping {
            range,
            exec: perms.as_bytes().get(2) == Some(&b'x'),
            dev,
            inode,
            path,
        })
    }
}

impl Mapping<'_> {
    /// The entry of `/proc/<pid>/map_files/`: the range without the zero padding of `maps`.
    fn map_files_name(&self) -> String {
        let (a, b) = self.range.split_once('-').unwrap_or((self.range, ""));
        let strip = |x: &str| {
            let t = x.trim_start_matches('0');
            if t.is_empty() {
                "0".to_string()
            } else {
                t.to_string()
            }
        };
        format!("{}-{}", strip(a), strip(b))
    }
}

/// `None`: the sandbox could not have written the file. `Some(why)` otherwise. `root`: the
/// process is a sandbox's running as root ([`sandboxed_root`]), and root's files are no sign
/// of the system's.
fn verdict(pid: u32, m: &Mapping<'_>, exe: (u64, u64), root: bool) -> Option<String> {
    let roots_only = |meta: &fs::Metadata| !root && roots_only(meta);
    let untrusted = || Some(format!("maps {}, a file the sandbox could write", m.path));
    let via = fs::OpenOptions::new()
        .read(true)
        // O_PATH, following the magic link to the mapped file itself (O_NOFOLLOW would give
        // the link).
        .custom_flags(libc::O_PATH)
        .open(format!("/proc/{pid}/map_files/{}", m.map_files_name()));
    match via {
        Ok(f) => {
            let Ok(meta) = f.metadata() else {
                return untrusted();
            };
            if (meta.dev(), meta.ino()) == exe {
                return None;
            }
            // SAFETY: a zeroed statvfs, filled by fstatvfs on a descriptor we own.
            let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
            // SAFETY: fstatvfs writes into the struct it is given. Its flags are the mount's
            // and the superblock's: a read-only bind mount shows ST_RDONLY.
            let ro = unsafe { libc::fstatvfs(std::os::fd::AsRawFd::as_raw_fd(&f), &mut sv) } == 0
                && (sv.f_flag & libc::ST_RDONLY) != 0;
            if ro || roots_only(&meta) {
                None
            } else {
                untrusted()
            }
        }
        Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) => {
            // No CAP_SYS_ADMIN: the path as the process sees it, if it is still that file.
            let same = m.path.starts_with('/')
                && fs::metadata(format!("/proc/{pid}/root{}", m.path)).is_ok_and(|meta| {
                    (meta.dev(), meta.ino()) == (m.dev, m.inode) && roots_only(&meta)
                });
            if same { None } else { untrusted() }
        }
        Err(_) => untrusted(),
    }
}

/// Whether `pid` is a process of a sandbox that runs as root (`--uid 0`): a root uid (real,
/// effective, saved or filesystem) under no_new_privs, which the sandbox sets on every process
/// it starts and no process can clear. Such a process owns what it writes as root (without
/// capabilities, it cannot change uid). A root process without no_new_privs is none of a
/// sandbox's (a test's client, the supervisor's own), and keeps the plain rule.
fn sandboxed_root(pid: u32) -> io::Result<bool> {
    let status = proctext::read_record(&format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .ok_or_else(|| io::Error::other(format!("no {name} line in /proc/{pid}/status")))
    };
    let root = field("Uid:")?.split_whitespace().any(|u| u == "0");
    Ok(root && field("NoNewPrivs:")?.trim() == "1")
}

/// Root's, and writable by nobody else: a sandbox that is not root cannot have written it.
fn roots_only(meta: &fs::Metadata) -> bool {
    meta.uid() == 0 && meta.mode() & 0o022 == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines() {
        let m = Mapping::parse(
            "7f1c2a000000-7f1c2a028000 r-xp 00028000 fd:01 1835147                    /usr/lib/x86_64-linux-gnu/libc.so.6",
        )
        .unwrap();
        assert!(m.exec);
        assert_eq!(
            (m.inode, m.path),
            (1835147, "/usr/lib/x86_64-linux-gnu/libc.so.6")
        );
        assert_eq!(m.dev, libc::makedev(0xfd, 1));
        let a = Mapping::parse(
            "7ffd1000-7ffd3000 rw-p 00000000 00:00 0                          [stack]",
        )
        .unwrap();
        assert!(!a.exec && a.inode == 0);
        let d = Mapping::parse("7f00-7f10 r-xp 00000000 00:01 42  /memfd:x (deleted)").unwrap();
        assert_eq!(d.path, "/memfd:x (deleted)");
    }

    #[test]
    fn this_process_runs_only_trusted_code_and_says_why_not_otherwise() {
        let c = CodeCheck::default();
        let me = std::process::id();
        let exe = fs::metadata("/proc/self/exe").unwrap();
        let exe = (exe.dev(), exe.ino());
        let mntns = ns_inode(me, "mnt").unwrap();
        let maps = fs::read_to_string("/proc/self/maps").unwrap();
        // The test binary itself is excluded; the system's libraries are root's, which is
        // enough for a process that is not root.
        if let Some(why) = c.parse(me, &maps, mntns, exe, false, None).unwrap() {
            panic!("the test runner maps untrusted code: {why}");
        }
        // For a root process, only a read-only mount vouches for them.
        let libc_ro = maps
            .lines()
            .filter_map(Mapping::parse)
            .find(|m| m.exec && m.path.contains("/libc.so"))
            .and_then(|m| {
                let f = fs::File::open(m.path).ok()?;
                // SAFETY: a zeroed statvfs, filled by fstatvfs on a descriptor we own.
                let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
                // SAFETY: fstatvfs writes into the struct it is given.
                let r = unsafe { libc::fstatvfs(std::os::fd::AsRawFd::as_raw_fd(&f), &mut sv) };
                (r == 0).then_some(sv.f_flag & libc::ST_RDONLY != 0)
            });
        if libc_ro == Some(false) {
            let why = c
                .parse(me, &maps, mntns, exe, true, None)
                .unwrap()
                .expect("untrusted as root");
            assert!(why.ends_with(", a file the sandbox could write"), "{why}");
        }
        assert_eq!(
            c.mappings(me, None, None).unwrap().is_some(),
            sandboxed_root(me).unwrap() && libc_ro == Some(false)
        );
        // The image given is the one `/proc/self/exe` leads to: the same answer.
        assert_eq!(
            c.mappings(me, Some(exe), None).unwrap(),
            c.mappings(me, None, None).unwrap()
        );
        // Past its deadline the check gives up (it looks every 64 lines); before it, the
        // same text gives the same answer.
        let long = maps.repeat(64 / maps.lines().count().max(1) + 1);
        assert_eq!(
            c.parse(me, &long, mntns, exe, false, Some(Instant::now())),
            None
        );
        let later = Instant::now() + std::time::Duration::from_secs(60);
        assert_eq!(
            c.parse(me, &long, mntns, exe, false, Some(later)),
            Some(None)
        );
        let env = c.environment(me).unwrap();
        assert_eq!(
            env.is_some(),
            std::env::var_os("LD_PRELOAD").is_some_and(|v| !v.is_empty())
                || std::env::var_os("LD_AUDIT").is_some_and(|v| !v.is_empty())
        );
    }
}
