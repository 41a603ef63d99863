//! The view's new root as data: the request (the policy's part) and the plan built from it
//! in the supervisor, before any fork, which `build.rs` carries out in the helper.

use std::ffi::CString;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::sandbox::grant::Grant;

/// More binds than this fail the view with E2BIG (their sources are held open at once).
pub(super) const MAX_BINDS: usize = 128;
/// Idmapped binds past this many are made without the mapping (reported as E2BIG).
pub(in crate::sandbox) const MAX_IDMAP: usize = 16;

/// One thing to make in the new root, at `comps` (its path relative to the root).
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) comps: Vec<CString>,
    /// Missing parent directories may be created (the parent is one of our tmpfs mounts, never
    /// a bound host tree).
    pub(super) create: bool,
    pub(super) what: What,
}

#[derive(Debug)]
pub(super) enum What {
    Dir,
    Link(CString),
    /// Index into [`RootPlan::binds`].
    Bind(usize),
    /// Index into the view's tmpfs plans (and its bit in the helper's report).
    Tmpfs(usize),
    HideDir,
    HideFile,
    /// The view's own files ([`RootPlan::files`]): a tmpfs filled and made read-only.
    Files,
}

/// Bit of the helper's `tmpfs_made` report that says the view's files were made (the low bits
/// are the private tmpfs mounts, one per plan entry).
pub const FILES_MADE: i32 = 1 << 8;

#[derive(Debug)]
pub(super) struct Bind {
    /// The walk's symlink-free absolute path.
    pub(super) src: CString,
    pub(super) dir: bool,
    pub(super) read_only: bool,
    pub(super) dev: u64,
    pub(super) ino: u64,
    /// The supervisor's /proc: bound only where [`RootPlan::bind_proc`] says.
    pub(super) proc_fallback: bool,
    /// Idmapped with this user namespace (-1: not), reported in this slot of the helper's
    /// report.
    pub(super) userns: RawFd,
    pub(super) slot: usize,
}

/// The new root, as the helper is to build it.
#[derive(Debug)]
pub struct RootPlan {
    pub(super) entries: Vec<Entry>,
    pub(super) binds: Vec<Bind>,
    pub(super) proc_read: bool,
    /// The supervisor is in a non-initial user namespace.
    pub(super) in_userns: bool,
    /// Test builds: every idmapped bind is refused as by a filesystem without them.
    pub(super) deny_idmap: bool,
    /// How many binds are idmapped (slots of the report).
    pub(super) idmap_slots: usize,
    /// The files of [`RootRequest::files`], as the helper writes them: (name, contents).
    pub(super) files: Vec<(CString, Vec<u8>)>,
}

/// What the view's root holds, as plain data.
#[derive(Debug, Clone, Default)]
pub struct RootRequest {
    /// Every grant, devices included.
    pub grants: Vec<Grant>,
    /// The supervisor's /proc.
    pub proc: Option<Grant>,
    /// The policy grants read on /proc.
    pub proc_read: bool,
    /// Symlinks of the host the view reproduces (view_links.rs): (link, its target as written).
    pub links: Vec<(PathBuf, PathBuf)>,
    /// Denied paths (canonical).
    pub denied: Vec<PathBuf>,
    /// Test builds: refuse every idmapped bind (EINVAL).
    pub deny_idmap: bool,
    /// A directory of the view's own files (see [`crate::policy::ViewFiles`]).
    pub files: Option<crate::policy::ViewFiles>,
}

/// Whether this process is in a non-initial user namespace (its uid map is not the identity
/// over the whole range).
pub(super) fn in_user_namespace() -> bool {
    let map = std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
    map.split_whitespace().collect::<Vec<_>>() != ["0", "0", "4294967295"]
}

pub(super) fn rel_comps(p: &Path) -> Vec<CString> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(CString::new(n.as_encoded_bytes()).unwrap_or_default()),
            _ => None,
        })
        .collect()
}

impl RootPlan {
    /// `tmpfs`: the private tmpfs mount points, in the order of their report bits. `None` when
    /// the policy grants `/` itself: the root would be the host's anyway.
    pub fn new(req: &RootRequest, tmpfs: &[PathBuf]) -> Option<RootPlan> {
        if req.grants.iter().any(|g| g.path == Path::new("/")) {
            return None;
        }
        // One bind per path; read-write wins where a path is granted both ways (Landlock still
        // decides what may be written), with the read-write grant's mapping.
        let mut grants: Vec<Grant> = Vec::new();
        for g in &req.grants {
            match grants.iter_mut().find(|x| x.path == g.path) {
                Some(x) if x.read_only && !g.read_only => *x = g.clone(),
                Some(_) => {}
                None => grants.push(g.clone()),
            }
        }
        grants.sort_by_key(|g| g.path.components().count());
        // A grant below another of the same kind and mapping shows through it already.
        let swap = |g: &Grant| g.idmap.map(|m| m.swap);
        let mut kept: Vec<Grant> = Vec::new();
        for g in grants {
            let covered = kept
                .iter()
                .filter(|k| g.path.starts_with(&k.path))
                .max_by_key(|k| k.path.components().count())
                .is_some_and(|k| k.read_only == g.read_only && swap(k) == swap(&g));
            if !covered {
                kept.push(g);
            }
        }
        // (path, is a bound host tree) of every mount in the new root, for `create`.
        let mounts: Vec<(&Path, bool)> = kept
            .iter()
            .map(|g| (g.path.as_path(), true))
            .chain(tmpfs.iter().map(|t| (t.as_path(), false)))
            .collect();
        let inside_bind = |p: &Path| {
            mounts
                .iter()
                .filter(|(m, _)| p.starts_with(m) && p != *m)
                .max_by_key(|(m, _)| m.components().count())
                .is_some_and(|(_, bound)| *bound)
        };
        let mut entries: Vec<(PathBuf, What)> = Vec::new();
        let mut binds = Vec::new();
        let mut idmap_slots = 0;
        for g in &kept {
            let userns = g.idmap.map_or(-1, |m| m.userns);
            let slot = if userns >= 0 {
                idmap_slots += 1;
                idmap_slots - 1
            } else {
                0
            };
            binds.push(Bind {
                src: CString::new(g.path.as_os_str().as_encoded_bytes()).unwrap_or_default(),
                dir: g.dir,
                read_only: g.read_only,
                dev: g.dev,
                ino: g.ino,
                proc_fallback: false,
                userns,
                slot,
            });
            entries.push((g.path.clone(), What::Bind(binds.len() - 1)));
        }
        for (i, t) in tmpfs.iter().enumerate() {
            entries.push((t.clone(), What::Tmpfs(i)));
        }
        entries.push((PathBuf::from("/proc"), What::Dir));
        if let Some(p) = &req.proc {
            binds.push(Bind {
                src: CString::new(p.path.as_os_str().as_encoded_bytes()).unwrap_or_default(),
                dir: true,
                // procfs keeps a chmod of a kernel-wide entry in the entry itself, for every
                // later /proc on the machine: read-only, as each exec's own /proc is.
                read_only: true,
                dev: p.dev,
                ino: p.ino,
                proc_fallback: true,
                userns: -1,
                slot: 0,
            });
            entries.push((p.path.clone(), What::Bind(binds.len() - 1)));
        }
        // The links every program expects in /dev (bash's process substitution opens
        // /dev/fd/N), once /dev holds anything.
        let dev = Path::new("/dev");
        let mut links = req.links.clone();
        if entries.iter().any(|(p, _)| p.starts_with(dev)) {
            for (name, target) in [
                ("fd", "/proc/self/fd"),
                ("stdin", "/proc/self/fd/0"),
                ("stdout", "/proc/self/fd/1"),
                ("stderr", "/proc/self/fd/2"),
            ] {
                links.push((dev.join(name), PathBuf::from(target)));
            }
        }
        for (link, target) in &links {
            let taken = entries.iter().any(|(p, _)| p == link);
            if !taken && !inside_bind(link) {
                let t = CString::new(target.as_os_str().as_encoded_bytes()).unwrap_or_default();
                entries.push((link.clone(), What::Link(t)));
            }
        }
        // The view's own files: where the directory lies in a bound host tree it must exist
        // there as a mount point (the caller made it); otherwise it is made in the root.
        let mut files = Vec::new();
        let files_dir = req.files.as_ref().filter(|f| {
            (!inside_bind(&f.dir) || std::fs::symlink_metadata(&f.dir).is_ok_and(|m| m.is_dir()))
                && !kept.iter().any(|g| g.path.starts_with(&f.dir))
        });
        if let Some(f) = files_dir {
            entries.push((f.dir.clone(), What::Files));
            files = f
                .files
                .iter()
                .map(|(n, c)| (CString::new(n.as_bytes()).unwrap_or_default(), c.clone()))
                .collect();
        }
        let mut denied: Vec<&PathBuf> = req
            .denied
            .iter()
            // The files' tmpfs covers whatever the host keeps there.
            .filter(|d| files_dir.is_none_or(|f| !d.starts_with(&f.dir)))
            .collect();
        denied.sort_by_key(|d| d.components().count());
        let mut hidden: Vec<&Path> = Vec::new();
        for d in denied {
            // Below another cover there is nothing left to hide (nor a way down to it).
            if !inside_bind(d) || hidden.iter().any(|h| d.starts_with(h)) {
                continue;
            }
            hidden.push(d);
            let Ok(m) = std::fs::symlink_metadata(d) else {
                continue;
            };
            let what = if m.is_dir() {
                What::HideDir
            } else {
                What::HideFile
            };
            entries.push((d.clone(), what));
        }
        // Parents before children; at one depth, mounts before what lies beside them.
        entries.sort_by_key(|(p, _)| p.components().count());
        Some(RootPlan {
            entries: entries
                .into_iter()
                .map(|(p, what)| Entry {
                    create: !inside_bind(&p),
                    comps: rel_comps(&p),
                    what,
                })
                .collect(),
            binds,
            proc_read: req.proc_read,
            in_userns: in_user_namespace(),
            deny_idmap: req.deny_idmap,
            idmap_slots: idmap_slots.min(MAX_IDMAP),
            files,
        })
    }

    /// The directory of the view's own files, when the root will hold it.
    pub fn files_dir(&self) -> Option<String> {
        self.entries
            .iter()
            .position(|e| matches!(e.what, What::Files))
            .and_then(|i| self.entry_path((i + 1).min(255) as u8))
    }

    /// How many slots of the helper's report the idmapped binds use.
    pub fn idmap_slots(&self) -> usize {
        self.idmap_slots
    }

    /// The report slot of the bind through which `path` is seen (the innermost bind at or
    /// above it), when that bind is idmapped.
    pub fn idmap_slot(&self, path: &Path) -> Option<usize> {
        self.binds
            .iter()
            .filter(|b| !b.proc_fallback)
            .filter(|b| path.starts_with(Path::new(std::ffi::OsStr::from_bytes(b.src.as_bytes()))))
            .max_by_key(|b| b.src.as_bytes().len())
            .filter(|b| b.userns >= 0 && b.slot < MAX_IDMAP)
            .map(|b| b.slot)
    }

    /// Whether the supervisor's /proc is bound at /proc, under each exec's fresh one:
    /// - when no fresh /proc can be mounted and the policy grants /proc (the execs then see
    ///   the supervisor's, as without a view);
    /// - in a non-initial user namespace, where the kernel mounts a fresh /proc only while
    ///   another full one is visible in the mount namespace (mount_too_revealing), even with
    ///   subset=pid. Each exec's own /proc covers it; the command has no capability to
    ///   unmount that.
    pub(super) fn bind_proc(&self, fresh_proc: bool) -> bool {
        (!fresh_proc && self.proc_read) || self.in_userns
    }

    /// The supervisor is in a non-initial user namespace.
    pub fn in_userns(&self) -> bool {
        self.in_userns
    }

    /// How many mounts the root gets (binds, not counting the fallback /proc).
    pub fn bind_count(&self) -> usize {
        self.binds.iter().filter(|b| !b.proc_fallback).count()
    }

    /// The path of entry `i` (the detail byte of a failed step), for messages.
    /// (1-based, so that 0 names nothing).
    pub fn entry_path(&self, i: u8) -> Option<String> {
        let e = self.entries.get(usize::from(i).checked_sub(1)?)?;
        let names: Vec<String> = e
            .comps
            .iter()
            .map(|c| c.to_string_lossy().into_owned())
            .collect();
        Some(format!("/{}", names.join("/")))
    }

    /// The top-level names of the new root, for the report and tests.
    pub fn top_level(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .entries
            .iter()
            .filter_map(|e| e.comps.first())
            .map(|c| c.to_string_lossy().into_owned())
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
