//! The view's new root as data: the request (the policy's part) and the plan built from it
//! in the supervisor, before any fork, which `build.rs` carries out in the helper.

use std::ffi::{CStr, CString};
use std::os::fd::RawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

use crate::policy::ViewFiles;
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
/// Bit of the same report that says the bind holding the files' directory was overlaid to
/// give it a mount point the host lacks ([`RootPlan::overlay_dir`]).
pub const OVERLAY_MADE: i32 = 1 << 9;

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
    /// The host lacks the view's files' directory, this bind's child `name`: the bound tree is
    /// shown through a read-only overlay whose upper lower layer holds only that empty
    /// directory, the files' mount point (nothing is made on the host).
    pub(super) overlay: Option<CString>,
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
    /// The directories that get a read rule once made (the files', the overlaid bind's), with
    /// their report bits, for the exec's init that adds the rules itself.
    pub(super) read_dirs: Vec<(i32, CString)>,
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
        let kept = one_bind_per_tree(&req.grants);
        // (path, is a bound host tree) of every mount in the new root, for `create`.
        let mounts: Vec<(&Path, bool)> = kept
            .iter()
            .map(|g| (g.path.as_path(), true))
            .chain(tmpfs.iter().map(|t| (t.as_path(), false)))
            .collect();
        let mut d = Draft::default();
        let idmap_slots = d.bind_grants(&kept);
        for (i, t) in tmpfs.iter().enumerate() {
            d.entries.push((t.clone(), What::Tmpfs(i)));
        }
        d.entries.push((PathBuf::from("/proc"), What::Dir));
        if let Some(p) = &req.proc {
            d.bind_proc(p);
        }
        d.links(&req.links, &mounts);
        let (files_dir, files) = d.view_files(req, &kept, &mounts);
        d.hide(&req.denied, files_dir, &mounts);
        let Draft { mut entries, binds } = d;
        // Parents before children; at one depth, mounts before what lies beside them.
        entries.sort_by_key(|(p, _)| p.components().count());
        let mut plan = RootPlan {
            entries: entries
                .into_iter()
                .map(|(p, what)| Entry {
                    create: !inside_bind(&mounts, &p),
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
            read_dirs: Vec::new(),
        };
        let c = |d: String| CString::new(d).unwrap_or_default();
        plan.read_dirs = [
            (FILES_MADE, plan.files_dir()),
            (OVERLAY_MADE, plan.overlay_dir()),
        ]
        .into_iter()
        .filter_map(|(b, d)| Some((b, c(d?))))
        .collect();
        Some(plan)
    }

    /// The directory of the view's own files, when the root will hold it.
    pub fn files_dir(&self) -> Option<String> {
        self.entries
            .iter()
            .position(|e| matches!(e.what, What::Files))
            .and_then(|i| self.entry_path((i + 1).min(255) as u8))
    }

    /// See [`RootPlan::read_dirs`](RootPlan).
    pub fn read_c_targets(&self) -> impl Iterator<Item = (i32, &CStr)> {
        self.read_dirs.iter().map(|(b, d)| (*b, d.as_c_str()))
    }

    /// The bind overlaid to give the files' directory its mount point, when there is one.
    pub fn overlay_dir(&self) -> Option<String> {
        let i = self.binds.iter().position(|b| b.overlay.is_some())?;
        let at = self
            .entries
            .iter()
            .position(|e| matches!(e.what, What::Bind(j) if j == i))?;
        self.entry_path((at + 1).min(255) as u8)
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

/// A host mount below an overlaid tree, to bind again on the overlay: (path, is a directory,
/// device, inode) as the supervisor sees it now.
type Submount = (PathBuf, bool, u64, u64);

/// The grants that need a bind of their own, shallowest first: one per path (read-write wins
/// where a path is granted both ways, with the read-write grant's mapping: Landlock still
/// decides what may be written), and none below another of the same kind and mapping, which
/// shows it already.
fn one_bind_per_tree(all: &[Grant]) -> Vec<Grant> {
    let mut grants: Vec<Grant> = Vec::new();
    for g in all {
        match grants.iter_mut().find(|x| x.path == g.path) {
            Some(x) if x.read_only && !g.read_only => *x = g.clone(),
            Some(_) => {}
            None => grants.push(g.clone()),
        }
    }
    grants.sort_by_key(|g| g.path.components().count());
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
    kept
}

/// Whether `p` lies strictly inside a bound host tree (its nearest mount above it is a bind,
/// not one of our tmpfs mounts): nothing may be created there.
fn inside_bind(mounts: &[(&Path, bool)], p: &Path) -> bool {
    mounts
        .iter()
        .filter(|(m, _)| p.starts_with(m) && p != *m)
        .max_by_key(|(m, _)| m.components().count())
        .is_some_and(|(_, bound)| *bound)
}

fn c_path(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).unwrap_or_default()
}

/// The root's entries by absolute path, and its binds, while the plan is drawn.
#[derive(Default)]
struct Draft {
    entries: Vec<(PathBuf, What)>,
    binds: Vec<Bind>,
}

impl Draft {
    fn bind(&mut self, path: PathBuf, b: Bind) {
        self.binds.push(b);
        self.entries.push((path, What::Bind(self.binds.len() - 1)));
    }

    /// One bind per kept grant; how many of them are idmapped (each its slot of the report).
    fn bind_grants(&mut self, kept: &[Grant]) -> usize {
        let mut idmap_slots = 0;
        for g in kept {
            let userns = g.idmap.map_or(-1, |m| m.userns);
            let slot = if userns >= 0 {
                idmap_slots += 1;
                idmap_slots - 1
            } else {
                0
            };
            let b = Bind {
                src: c_path(&g.path),
                dir: g.dir,
                read_only: g.read_only,
                dev: g.dev,
                ino: g.ino,
                proc_fallback: false,
                userns,
                slot,
                overlay: None,
            };
            self.bind(g.path.clone(), b);
        }
        idmap_slots
    }

    /// The supervisor's /proc, bound only where [`RootPlan::bind_proc`] says.
    fn bind_proc(&mut self, p: &Grant) {
        let b = Bind {
            src: c_path(&p.path),
            dir: true,
            // procfs keeps a chmod of a kernel-wide entry in the entry itself, for every
            // later /proc on the machine: read-only, as each exec's own /proc is.
            read_only: true,
            dev: p.dev,
            ino: p.ino,
            proc_fallback: true,
            userns: -1,
            slot: 0,
            overlay: None,
        };
        self.bind(p.path.clone(), b);
    }

    /// The host's links the view reproduces, and the links every program expects in /dev
    /// (bash's process substitution opens /dev/fd/N) once /dev holds anything; none where an
    /// entry already is or inside a bound tree (which shows the host's own).
    fn links(&mut self, host: &[(PathBuf, PathBuf)], mounts: &[(&Path, bool)]) {
        let dev = Path::new("/dev");
        let mut links = host.to_vec();
        if self.entries.iter().any(|(p, _)| p.starts_with(dev)) {
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
            let taken = self.entries.iter().any(|(p, _)| p == link);
            if !taken && !inside_bind(mounts, link) {
                self.entries
                    .push((link.clone(), What::Link(c_path(target))));
            }
        }
    }

    /// The view's own files: where the directory lies in a bound host tree it must exist
    /// there as a mount point, or be given one by an overlay of that bind ([`overlay_bind`]);
    /// otherwise it is made in the root. Returns the files' request when the root holds them,
    /// and the files as the helper writes them.
    fn view_files<'r>(
        &mut self,
        req: &'r RootRequest,
        kept: &[Grant],
        mounts: &[(&Path, bool)],
    ) -> (Option<&'r ViewFiles>, Vec<(CString, Vec<u8>)>) {
        let mut overlay = None;
        let files_dir = req.files.as_ref().filter(|f| {
            if kept.iter().any(|g| g.path.starts_with(&f.dir)) {
                return false;
            }
            if !inside_bind(mounts, &f.dir)
                || std::fs::symlink_metadata(&f.dir).is_ok_and(|m| m.is_dir())
            {
                return true;
            }
            overlay = overlay_bind(&f.dir, kept, mounts, &req.denied, &req.links);
            overlay.is_some()
        });
        if let (Some((i, below)), Some(f)) = (overlay, files_dir) {
            let name = f.dir.file_name().unwrap_or_default().as_encoded_bytes();
            self.binds[i].overlay = Some(CString::new(name).unwrap_or_default());
            // The host's mounts below the overlaid tree, bound again on the overlay (whose
            // layer shows what lies under them).
            let read_only = self.binds[i].read_only;
            for (path, dir, dev, ino) in below {
                let b = Bind {
                    src: c_path(&path),
                    dir,
                    read_only,
                    dev,
                    ino,
                    proc_fallback: false,
                    userns: -1,
                    slot: 0,
                    overlay: None,
                };
                self.bind(path, b);
            }
        }
        let Some(f) = files_dir else {
            return (None, Vec::new());
        };
        self.entries.push((f.dir.clone(), What::Files));
        let files = f
            .files
            .iter()
            .map(|(n, c)| (CString::new(n.as_bytes()).unwrap_or_default(), c.clone()))
            .collect();
        (Some(f), files)
    }

    /// A cover over each denied path that a bound tree would show, shallowest first; none
    /// below another cover (nothing is left to hide there, nor a way down to it), nor under
    /// the files' tmpfs, which covers whatever the host keeps there.
    fn hide(&mut self, denied: &[PathBuf], files: Option<&ViewFiles>, mounts: &[(&Path, bool)]) {
        let mut denied: Vec<&PathBuf> = denied
            .iter()
            .filter(|d| files.is_none_or(|f| !d.starts_with(&f.dir)))
            .collect();
        denied.sort_by_key(|d| d.components().count());
        let mut hidden: Vec<&Path> = Vec::new();
        for d in denied {
            if !inside_bind(mounts, d) || hidden.iter().any(|h| d.starts_with(h)) {
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
            self.entries.push((d.clone(), what));
        }
    }
}

/// The index in `kept` (and in the binds, which follow it) of the bind to overlay so that
/// `dir`, missing on the host, gets a mount point in the view, with the host's mounts below
/// that bind (an overlay's layer does not show the mounts of its tree: `/etc/hosts` bound in
/// by a container runtime is bound again on the overlay). `dir`'s parent is that bind's path,
/// and the overlay changes nothing else of what the view shows or how Landlock sees it: an
/// overlay's inodes are its own, so the bind's Landlock rule is given again on the overlay's
/// root (one rule, the grant's rights), which is the same rule only where nothing below the
/// grant has a rule or a cover of its own. So only a read-only, unmapped directory grant with
/// no other grant, private tmpfs, existing deny path or reproduced link below it.
fn overlay_bind(
    dir: &Path,
    kept: &[Grant],
    mounts: &[(&Path, bool)],
    denied: &[PathBuf],
    links: &[(PathBuf, PathBuf)],
) -> Option<(usize, Vec<Submount>)> {
    let parent = dir.parent()?;
    let i = kept.iter().position(|g| g.path == parent)?;
    let g = &kept[i];
    let below = |p: &Path| p.starts_with(parent) && p != parent;
    let eligible = g.read_only
        && g.dir
        && g.idmap.is_none()
        && !mounts.iter().any(|(m, _)| below(m))
        && !denied
            .iter()
            .any(|d| below(d) && d.symlink_metadata().is_ok())
        && !links.iter().any(|(l, _)| below(l));
    if !eligible {
        return None;
    }
    let mut subs: Vec<PathBuf> = host_mounts()?.into_iter().filter(|m| below(m)).collect();
    subs.sort_by_key(|m| m.components().count());
    let mut top: Vec<PathBuf> = Vec::new();
    for m in subs {
        // One below another is carried along by that one's (recursive) bind.
        if !top.iter().any(|t| m.starts_with(t)) {
            top.push(m);
        }
    }
    let mut out = Vec::new();
    for m in top {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::symlink_metadata(&m).ok()?;
        if meta.file_type().is_symlink() || m == dir {
            return None;
        }
        out.push((m, meta.is_dir(), meta.dev(), meta.ino()));
    }
    Some((i, out))
}

/// The mount points of the supervisor's mount namespace (mountinfo's fifth field, its octal
/// escapes decoded), or `None` when the table cannot be read.
fn host_mounts() -> Option<Vec<PathBuf>> {
    let table = crate::sandbox::mountinfo::read().ok()?;
    let mut out = Vec::new();
    for l in table.lines() {
        let field = l.split(' ').nth(4)?.as_bytes();
        let mut path = Vec::with_capacity(field.len());
        let mut i = 0;
        while i < field.len() {
            let esc = field
                .get(i + 1..i + 4)
                .filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
            match esc {
                Some(d) => {
                    let v = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                    path.push(v as u8);
                    i += 4;
                }
                None => {
                    path.push(field[i]);
                    i += 1;
                }
            }
        }
        out.push(PathBuf::from(std::ffi::OsString::from_vec(path)));
    }
    Some(out)
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
