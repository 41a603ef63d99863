//! Filesystem policy: which paths the child may read, execute or write, and which it must never
//! read. Landlock grants cover a whole subtree, so a denied path below a granted directory is
//! protected by granting that directory's other entries one by one instead of the directory
//! itself (`expand_grants`).

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};

use super::PolicyError;

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

/// One expanded rule, ready to be turned into a Landlock `path_beneath` rule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct FsRule {
    pub path: PathBuf,
    pub access: PathAccess,
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
}

/// Directories a normal image needs to run programs.
pub const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
];

/// Devices a normal program expects to open.
pub const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
];

/// Where OpenShell keeps supervisor secrets in a pod (§5.2 of the protocol sheet), plus the
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
        }
    }

    pub(super) fn validate(&self) -> Result<(), PolicyError> {
        let meta = std::fs::metadata(&self.workdir).map_err(|source| PolicyError::Workdir {
            path: self.workdir.clone(),
            source,
        })?;
        if !meta.is_dir() {
            return Err(PolicyError::WorkdirNotDir(self.workdir.clone()));
        }
        let deny = canonical_set(&self.deny);
        for (flag, paths) in [("ro", &self.read_only), ("rw", &self.read_write)] {
            for p in paths {
                let c = p.canonicalize().map_err(|source| PolicyError::ExtraPath {
                    flag,
                    path: p.clone(),
                    source,
                })?;
                if deny.iter().any(|d| c.starts_with(d)) {
                    return Err(PolicyError::GrantedSecret {
                        flag,
                        path: p.clone(),
                    });
                }
            }
        }
        let wd = self
            .workdir
            .canonicalize()
            .unwrap_or_else(|_| self.workdir.clone());
        if deny.iter().any(|d| wd.starts_with(d)) {
            return Err(PolicyError::GrantedSecret {
                flag: "workdir",
                path: self.workdir.clone(),
            });
        }
        Ok(())
    }

    /// All grants, before splitting around denied paths.
    fn grants(&self) -> Vec<(PathBuf, PathAccess)> {
        let mut g = Vec::new();
        g.extend(
            self.system
                .iter()
                .map(|p| (p.clone(), PathAccess::ReadExec)),
        );
        g.extend(
            self.read_only
                .iter()
                .map(|p| (p.clone(), PathAccess::ReadExec)),
        );
        g.push((self.workdir.clone(), PathAccess::ReadWrite));
        g.extend(
            self.read_write
                .iter()
                .map(|p| (p.clone(), PathAccess::ReadWrite)),
        );
        g.extend(self.devices.iter().map(|p| (p.clone(), PathAccess::Device)));
        if self.proc_read {
            g.push((PathBuf::from("/proc"), PathAccess::ReadExec));
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
        if let Ok(c) = p.canonicalize() {
            out.insert(c);
        } else if let (Some(parent), Some(name)) = (p.parent(), p.file_name())
            && let Ok(cp) = parent.canonicalize()
        {
            out.insert(cp.join(name));
        }
    }
    out
}

/// Expand the policy into concrete rules, splitting any grant that contains a denied path into
/// grants on its other entries (recursively). Entries that resolve (through symlinks) into a
/// denied path are dropped. Grants on paths that do not exist are dropped.
pub fn expand_grants(policy: &FsPolicy) -> io::Result<Vec<FsRule>> {
    let deny = canonical_set(&policy.deny);
    let mut rules = BTreeSet::new();
    for (path, access) in policy.grants() {
        let Ok(canon) = path.canonicalize() else {
            continue;
        };
        expand_one(&canon, access, &deny, &mut rules, 0)?;
    }
    Ok(rules.into_iter().collect())
}

fn expand_one(
    path: &Path,
    access: PathAccess,
    deny: &BTreeSet<PathBuf>,
    out: &mut BTreeSet<FsRule>,
    depth: usize,
) -> io::Result<()> {
    // A grant at or below a denied path is never emitted.
    if deny.iter().any(|d| path.starts_with(d)) {
        return Ok(());
    }
    // No denied path below this one (or it is not a directory, so nothing can be below it):
    // grant the whole subtree.
    if !deny.iter().any(|d| d.starts_with(path)) || !path.is_dir() {
        out.insert(FsRule {
            path: path.to_path_buf(),
            access,
        });
        return Ok(());
    }
    // A denied path lies below: grant each entry separately. The depth bound only guards
    // against pathological trees; secrets sit a few levels down.
    if depth > 16 {
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for entry in entries {
        // Symlinks are skipped, never followed. A rule on this directory would not have
        // granted a link's target (Landlock checks the resolved path), and whoever can write
        // here (the sandbox itself, in a workdir) would choose that target: `escape -> /`
        // would grant the whole filesystem, and `a -> .` loops make the walk exponential. A
        // target inside this directory is granted through its own entry.
        match std::fs::symlink_metadata(&entry) {
            Ok(m) if m.file_type().is_symlink() => continue,
            Ok(_) => expand_one(&entry, access, deny, out, depth + 1)?,
            Err(_) => continue,
        }
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
