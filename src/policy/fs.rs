//! Filesystem policy: which paths the child may read, execute or write, and which it must never
//! read. Landlock grants cover a whole subtree, so a denied path below a granted directory is
//! protected by granting that directory's other entries one by one instead of the directory
//! itself (`expand_grants`).

use std::collections::BTreeSet;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::PolicyError;
use super::shared::Identity;
use crate::sys::walk::{self, Resolved, Walker};

/// What a rule lets the child do below a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PathAccess {
    /// Read files, list directories, execute.
    ReadExec,
    /// Everything ReadExec allows, plus create, write, remove, rename, truncate.
    ReadWrite,
    /// Read and write an existing character device (no create or remove).
    Device,
}

/// One expanded rule, ready to be turned into a Landlock `path_beneath` rule. Rules compare
/// by path and access only.
#[derive(Debug, Clone)]
pub struct FsRule {
    /// The symlink-free path that reached `fd`; for messages and for comparing with denied
    /// paths.
    pub path: PathBuf,
    pub access: PathAccess,
    /// Whether `fd` is a directory (file rules may only carry file rights).
    pub is_dir: bool,
    /// An `O_PATH` descriptor of the file the rule was decided on. Landlock gets this one,
    /// never the path, so the file cannot be swapped between the decision and the rule.
    pub fd: Arc<OwnedFd>,
}

impl PartialEq for FsRule {
    fn eq(&self, other: &Self) -> bool {
        (&self.path, self.access) == (&other.path, other.access)
    }
}

impl Eq for FsRule {}

impl PartialOrd for FsRule {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for FsRule {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (&self.path, self.access).cmp(&(&other.path, other.access))
    }
}

/// The filesystem part of a policy. Paths are absolute.
#[derive(Debug, Clone, Default)]
pub struct FsPolicy {
    /// The child's working directory (read-write).
    pub workdir: PathBuf,
    /// System directories: read + execute (`/usr`, `/bin`, `/etc` ...). Missing ones are skipped.
    pub system: Vec<PathBuf>,
    /// Extra read + execute paths (`--ro`). They must exist.
    pub read_only: Vec<PathBuf>,
    /// Extra read-write paths (`--rw`, the scratch dir). They must exist.
    pub read_write: Vec<PathBuf>,
    /// Character devices the child may read and write.
    pub devices: Vec<PathBuf>,
    /// Grant read on /proc. The rule is on the /proc mount itself: a rule on /proc/self would
    /// bind to the launcher's own pid directory, not the child's.
    pub proc_read: bool,
    /// Paths that must never be readable, even below a granted directory.
    pub deny: Vec<PathBuf>,
    /// Who the child runs as (`None`: the supervisor's own euid and egid). A symlink in a
    /// grant root is followed only when this identity cannot have made or changed it.
    pub sandbox_identity: Option<Identity>,
    /// Whose ids the child's writes to the workdir and the `--rw` grants carry.
    pub write_as: WriteAs,
}

/// Whose ids the sandbox's writes to its read-write grants carry (sandbox/ownership.rs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum WriteAs {
    /// The sandbox identity's, as each grant's mode allows: OpenShell's semantics (`serve`,
    /// where the workdir belongs to the sandbox user anyway).
    #[default]
    Sandbox,
    /// Each grant's owner's, through an idmapped mount (`run`). Where the kernel refuses one,
    /// a workdir that belongs to 65534 or to a uid of `hand_over` is handed to the sandbox
    /// identity for the run (when that is one of them too), and back after it.
    Owner {
        hand_over: std::ops::RangeInclusive<u32>,
    },
}

/// Where the view puts its private tmpfs mounts: a workdir there would be shadowed by them,
/// or be the host's shared directory (see `FsPolicy::validate`).
pub const PRIVATE_TMPFS: &[&str] = &["/tmp", "/dev/shm"];

/// Directories a normal image needs to run programs (the walk trusts root's links there).
pub use crate::sys::walk::SYSTEM_DIRS;

/// Devices a normal program expects to open.
pub const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
];

/// Where OpenShell keeps supervisor secrets in a pod (its client TLS material and tokens), plus the
/// install directory of the supervisor itself.
pub fn default_secret_paths() -> Vec<PathBuf> {
    [
        "/etc/openshell-tls",
        "/etc/openshell",
        "/var/run/secrets",
        "/run/secrets",
        "/run/openshell",
        "/opt/openshell",
    ]
    .iter()
    .map(PathBuf::from)
    .collect()
}

impl FsPolicy {
    /// The default filesystem policy around a workdir.
    pub fn with_defaults(workdir: PathBuf) -> Self {
        FsPolicy {
            workdir,
            system: SYSTEM_DIRS.iter().map(PathBuf::from).collect(),
            read_only: Vec::new(),
            read_write: Vec::new(),
            devices: DEVICES.iter().map(PathBuf::from).collect(),
            proc_read: true,
            deny: default_secret_paths(),
            sandbox_identity: None,
            write_as: WriteAs::Sandbox,
        }
    }

    /// Resolves paths for the uid and gid the child runs as.
    pub fn walker(&self) -> Walker {
        let id = self.sandbox_identity.unwrap_or_else(|| Identity {
            uid: crate::sys::process::euid(),
            gid: crate::sys::process::egid(),
        });
        Walker::new(id.uid, id.gid)
    }

    /// Resolve every user-given root (workdir, `--ro`, `--rw`) through the symlink-safe walk
    /// and refuse: a root reached through a link the sandbox could have planted; a root at or
    /// below a denied path; and, as a read-write root, `/`, a system directory or an ancestor
    /// of one (read-write there is the whole system, and a `--uid 0` child would own it).
    pub(super) fn validate(&self) -> Result<(), PolicyError> {
        let walker = self.walker();
        let resolve = |flag: &'static str, p: &PathBuf| {
            walker
                .resolve_path(p)
                .map_err(|source| PolicyError::GrantRoot {
                    flag,
                    path: p.clone(),
                    source: Box::new(source),
                })
        };
        let deny = canonical_set(&self.deny);
        // The system directories as written and as resolved (`/lib` is `/usr/lib` here).
        let mut system: Vec<PathBuf> = SYSTEM_DIRS.iter().map(PathBuf::from).collect();
        system.extend(
            SYSTEM_DIRS
                .iter()
                .filter_map(|s| walker.resolve_path(Path::new(s)).ok().map(|(p, _)| p)),
        );
        let check = |flag: &'static str, p: &PathBuf, real: &Path, write: bool| {
            if deny.iter().any(|d| real.starts_with(d)) {
                return Err(PolicyError::GrantedSecret {
                    flag,
                    path: p.clone(),
                });
            }
            if write && let Some(s) = system.iter().find(|s| s.starts_with(real)) {
                return Err(PolicyError::SystemWrite {
                    flag,
                    path: p.clone(),
                    resolved: real.to_path_buf(),
                    system: s.clone(),
                });
            }
            Ok(())
        };
        let (wd, wd_meta) = resolve("workdir", &self.workdir)?;
        if !wd_meta.is_dir() {
            return Err(PolicyError::WorkdirNotDir(self.workdir.clone()));
        }
        check("workdir", &self.workdir, &wd, true)?;
        // /tmp and /dev/shm are the view's own tmpfs mounts. A workdir there would be the
        // host's shared directory, every other process's files and sockets with it (where
        // Landlock ABI < 9 does not check connect), instead of the private one: refused, with
        // what to do instead.
        for t in PRIVATE_TMPFS {
            let real = walk::canonical(Path::new(t)).unwrap_or_else(|_| PathBuf::from(t));
            if real.starts_with(&wd) {
                return Err(PolicyError::WorkdirIsPrivateTmpfs {
                    path: self.workdir.clone(),
                    tmpfs: PathBuf::from(t),
                });
            }
        }
        for (flag, paths, write) in [
            ("ro", &self.read_only, false),
            ("rw", &self.read_write, true),
        ] {
            for p in paths {
                let (real, _) = resolve(flag, p)?;
                check(flag, p, &real, write)?;
            }
        }
        Ok(())
    }

    /// All grants, before splitting around denied paths, each with whether the user named it
    /// (workdir, `--ro`, `--rw`) rather than the built-in defaults.
    fn grants(&self) -> Vec<(PathBuf, PathAccess, bool)> {
        let mut g = Vec::new();
        let mut add = |paths: &[PathBuf], access, user| {
            g.extend(paths.iter().map(|p| (p.clone(), access, user)));
        };
        add(&self.system, PathAccess::ReadExec, false);
        add(&self.read_only, PathAccess::ReadExec, true);
        add(
            std::slice::from_ref(&self.workdir),
            PathAccess::ReadWrite,
            true,
        );
        add(&self.read_write, PathAccess::ReadWrite, true);
        add(&self.devices, PathAccess::Device, false);
        if self.proc_read {
            add(&[PathBuf::from("/proc")], PathAccess::ReadExec, false);
        }
        g
    }
}

/// Canonical forms of the given paths. A path that does not exist yet is kept as written and,
/// where its parent exists, also under its parent's canonical name, so that a secret mounted
/// later is still covered.
fn canonical_set(paths: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for p in paths {
        out.insert(p.clone());
        if let Ok(c) = walk::canonical(p) {
            out.insert(c);
        } else if let (Some(parent), Some(name)) = (p.parent(), p.file_name())
            && let Ok(cp) = walk::canonical(parent)
        {
            out.insert(cp.join(name));
        }
    }
    out
}

/// The deny paths of `policy` that need no split in a run whose mount namespace is private:
/// each does not exist now, and only root can create it (every existing ancestor, as written
/// and resolved, is owned by uid 0 and writable by nobody else; a symlink counts as its
/// directory). The caller takes this set before the view is made and again after, and skips
/// the split only for paths in both (see `sandbox::prepare_inner` and SECURITY.md, "A missing
/// deny path is not split around"). Why that is safe:
/// - a secret reaches such a path in a pod as a mount (a Secret volume). The view's mount
///   namespace has private propagation, so a mount made on the host after the view was copied
///   never appears in it; one made before the first check would have made the path exist;
/// - a mount needs its mount point to exist. Making the point, mounting and removing both
///   again between the two checks is the one window left, and it needs root on the host;
/// - a plain file that root creates there during the run is visible (same filesystem): it is
///   then guarded by its own mode against the sandbox uid, not by Landlock. OpenShell and this
///   supervisor never write files below the default deny paths; they are mount points.
///
/// A path that exists keeps the split: its entries are what must stay unreadable. Without root
/// (our user namespace shows root as the overflow uid) or with any doubt (an error other than
/// "not found"), the path is kept too.
pub fn absent_root_only_denies(policy: &FsPolicy) -> BTreeSet<PathBuf> {
    // One answer per ancestor within this call: the default deny paths share their parents
    // (/etc, /run, /) and each asked again costs a stat. Nothing is kept between calls: the
    // second call must see the filesystem afresh.
    let mut seen = Ancestors::default();
    policy
        .deny
        .iter()
        .filter(|d| only_root_can_create(d, &mut seen))
        .cloned()
        .collect()
}

/// What [`only_root_can_create`] asked of each ancestor, within one call of
/// [`absent_root_only_denies`]: lstat, stat, and the canonical path.
#[derive(Default)]
struct Ancestors {
    lstat: std::collections::HashMap<PathBuf, Option<std::fs::Metadata>>,
    stat: std::collections::HashMap<PathBuf, Option<std::fs::Metadata>>,
    real: std::collections::HashMap<PathBuf, Option<PathBuf>>,
}

impl Ancestors {
    fn lstat(&mut self, p: &Path) -> Option<&std::fs::Metadata> {
        self.lstat
            .entry(p.to_path_buf())
            .or_insert_with(|| p.symlink_metadata().ok())
            .as_ref()
    }

    fn stat(&mut self, p: &Path) -> Option<&std::fs::Metadata> {
        self.stat
            .entry(p.to_path_buf())
            .or_insert_with(|| p.metadata().ok())
            .as_ref()
    }

    fn real(&mut self, p: &Path) -> Option<PathBuf> {
        self.real
            .entry(p.to_path_buf())
            .or_insert_with(|| p.canonicalize().ok())
            .clone()
    }
}

fn only_root_can_create(path: &Path, seen: &mut Ancestors) -> bool {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        _ => return false,
    }
    // The nearest ancestor that exists, then every directory above it, as written (lstat: a
    // link there could be replaced by whoever may write its directory, which is checked one
    // step up) and as resolved.
    let Some(existing) = path.ancestors().skip(1).find(|a| seen.lstat(a).is_some()) else {
        return false;
    };
    let Some(real) = seen.real(existing) else {
        return false;
    };
    let root_only = |meta: &std::fs::Metadata| {
        use std::os::unix::fs::MetadataExt;
        meta.uid() == 0 && (meta.file_type().is_symlink() || meta.mode() & 0o022 == 0)
    };
    let written = existing
        .ancestors()
        .all(|a| seen.lstat(a).is_some_and(root_only));
    let resolved = real
        .ancestors()
        .all(|a| seen.stat(a).is_some_and(|m| m.is_dir() && root_only(m)));
    written && resolved
}

/// [`expand_grants`] with the deny paths in `skip` left out (those of
/// [`absent_root_only_denies`], in a run with a private mount namespace).
pub fn expand_grants_skipping(
    policy: &FsPolicy,
    skip: &BTreeSet<PathBuf>,
) -> io::Result<Vec<FsRule>> {
    if skip.is_empty() {
        return expand_grants(policy);
    }
    let mut p = policy.clone();
    p.deny.retain(|d| !skip.contains(d));
    expand_grants(&p)
}

/// Expand the policy into concrete rules, splitting any grant that contains a denied path into
/// grants on its other entries (recursively). Roots are resolved through the symlink-safe walk
/// ([`Walker::resolve`]); entries of a split directory are opened once, `O_PATH|O_NOFOLLOW`,
/// relative to their parent's descriptor, decided from fstat of that descriptor, and that same
/// descriptor is the rule's (Landlock never looks the path up again). Links in a split
/// directory are skipped. Grants on paths that do not exist are dropped. A user-given root that
/// resolves only through an untrusted link is an error; a built-in one (system directories,
/// devices) is dropped with a warning, as a missing one is.
pub fn expand_grants(policy: &FsPolicy) -> io::Result<Vec<FsRule>> {
    let walker = policy.walker();
    let deny = canonical_set(&policy.deny);
    let mut rules = BTreeSet::new();
    for (path, access, user) in policy.grants() {
        let root = match walker.resolve(&path) {
            Ok(r) => r,
            Err(e) if e.is_not_found() => continue,
            Err(e) if !user => {
                tracing::warn!(path = %path.display(), error = %e, "built-in grant skipped");
                continue;
            }
            Err(e) => return Err(io::Error::other(e)),
        };
        expand_one(root, access, &deny, &mut rules, 0)?;
    }
    Ok(rules.into_iter().collect())
}

fn expand_one(
    node: Resolved,
    access: PathAccess,
    deny: &BTreeSet<PathBuf>,
    out: &mut BTreeSet<FsRule>,
    depth: usize,
) -> io::Result<()> {
    // A grant at or below a denied path is never emitted.
    if deny.iter().any(|d| node.path.starts_with(d)) {
        return Ok(());
    }
    // No denied path below this one (or it is not a directory, so nothing can be below it):
    // grant the whole subtree.
    let is_dir = node.meta.is_dir();
    if !is_dir || !deny.iter().any(|d| d.starts_with(&node.path)) {
        out.insert(FsRule {
            path: node.path,
            access,
            is_dir,
            fd: Arc::new(node.fd),
        });
        return Ok(());
    }
    // A denied path lies below: grant each entry separately. The depth bound only guards
    // against pathological trees; secrets sit a few levels down.
    if depth > 16 {
        return Ok(());
    }
    let names = walk::list_dir(node.fd.as_fd(), &node.path).map_err(io::Error::other)?;
    for name in names {
        let entry = match walk::open_entry(node.fd.as_fd(), &node.path, &name) {
            Ok(e) => e,
            // Removed since it was listed: nothing to grant.
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(io::Error::other(e)),
        };
        // Symlinks are skipped, never followed. A rule on this directory would not have
        // granted a link's target (Landlock checks the resolved path), and whoever can write
        // here (the sandbox itself, in a workdir) would choose that target: `escape -> /`
        // would grant the whole filesystem, and `a -> .` loops make the walk exponential. A
        // target inside this directory is granted through its own entry. The decision is
        // made on the descriptor that becomes the rule, so exchanging the entry for a link
        // after this check changes nothing.
        if entry.meta.is_symlink() {
            continue;
        }
        expand_one(entry, access, deny, out, depth + 1)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules_for(root: &Path, deny: Vec<PathBuf>) -> Vec<FsRule> {
        let p = FsPolicy {
            workdir: root.join("work"),
            system: vec![root.join("etc")],
            deny,
            ..Default::default()
        };
        expand_grants(&p).unwrap()
    }

    #[test]
    fn secret_below_a_granted_dir_is_split_out() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap();
        for d in ["etc/openshell-tls/client", "etc/ssl", "work"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("etc/passwd"), "x").unwrap();
        std::fs::write(root.join("etc/openshell-tls/client/tls.key"), "k").unwrap();
        let rules = rules_for(&root, vec![root.join("etc/openshell-tls")]);
        let paths: Vec<_> = rules.iter().map(|r| r.path.clone()).collect();
        assert!(paths.contains(&root.join("etc/passwd")));
        assert!(paths.contains(&root.join("etc/ssl")));
        assert!(
            !paths.contains(&root.join("etc")),
            "parent of a secret must not be granted"
        );
        assert!(
            paths
                .iter()
                .all(|p| !p.starts_with(root.join("etc/openshell-tls")))
        );
    }

    #[test]
    fn symlink_into_a_secret_is_not_granted() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("etc/openshell-tls")).unwrap();
        std::fs::create_dir_all(root.join("work")).unwrap();
        std::fs::write(root.join("etc/openshell-tls/tls.key"), "k").unwrap();
        std::os::unix::fs::symlink(
            root.join("etc/openshell-tls/tls.key"),
            root.join("etc/alias"),
        )
        .unwrap();
        std::os::unix::fs::symlink(root.join("etc/openshell-tls"), root.join("etc/dirlink"))
            .unwrap();
        let rules = rules_for(&root, vec![root.join("etc/openshell-tls")]);
        assert!(
            rules
                .iter()
                .all(|r| !r.path.starts_with(root.join("etc/openshell-tls")))
        );
    }

    #[test]
    fn links_in_a_split_directory_are_never_followed() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("work/private")).unwrap();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::os::unix::fs::symlink("/", root.join("work/escape")).unwrap();
        for l in ["a", "b", "c"] {
            std::os::unix::fs::symlink(".", root.join("work").join(l)).unwrap();
        }
        let rules = rules_for(&root, vec![root.join("work/private")]);
        // Only what really lies in the workdir, never `/` or the loops.
        for r in &rules {
            assert!(r.path.starts_with(&root), "granted {:?}", r.path);
        }
        assert!(
            rules
                .iter()
                .all(|r| !r.path.starts_with(root.join("work/private")))
        );
    }

    #[test]
    fn a_denied_path_below_a_file_grants_the_file() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("work")).unwrap();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::write(root.join("etc/hostname"), "h").unwrap();
        let rules = rules_for(&root, vec![root.join("etc/hostname/x")]);
        assert!(rules.iter().any(|r| r.path == root.join("etc/hostname")));
    }

    #[test]
    fn no_secret_means_one_rule_per_grant() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("etc/x")).unwrap();
        std::fs::create_dir_all(root.join("work")).unwrap();
        let rules = rules_for(&root, vec![PathBuf::from("/nonexistent/secret")]);
        assert_eq!(rules.len(), 2);
    }
}
