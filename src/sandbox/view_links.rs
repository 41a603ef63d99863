//! The host's symlinks that the view's root reproduces.
//!
//! The view's root holds only what the policy grants (view_root.rs). Policies written for a
//! supervisor that puts Landlock on the real root, as OpenShell's does (`read_only: [/usr, /lib,
//! /etc, ...]`), rely on the root's links into what they grant: on a usr-merged system `/bin ->
//! usr/bin`, `/sbin -> usr/sbin` and `/lib64 -> usr/lib64`, which every `#!/bin/sh` and the
//! dynamic loader's path (`/lib64/ld-linux-x86-64.so.2`) go through. So the view reproduces, as
//! the same link, each symlink of the host's root and of every directory the view makes on the
//! way to a grant (`/var` for `/var/log`, with its `/var/run -> /run`) when
//! - the policy's symlink-safe walk follows it: the link and every directory above it are
//!   root's and not writable by the sandbox (`Walker::distrust`), so a link an earlier run
//!   could have planted is never reproduced; and
//! - what it resolves to is in the view: inside a grant (and not denied), one of the
//!   directories the view makes, or a private tmpfs.
//!
//! Any other link stays absent. A reproduced link lives in the read-only root tmpfs: the
//! sandbox can neither change it nor reach through it anything the view does not hold.
//! `/dev` (only the granted devices and the standard fd links), `/proc` (each exec's own) and
//! the private tmpfs mounts are not looked into.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use super::namespaces::Grant;
use crate::sys::walk::{self, Walker};

/// The (link, target as written) pairs to reproduce. `tmpfs`: the view's private tmpfs mount
/// points.
pub(super) fn reproduced(
    walker: &Walker,
    grants: &[Grant],
    denied: &[PathBuf],
    tmpfs: &[PathBuf],
) -> Vec<(PathBuf, PathBuf)> {
    let in_grant = |p: &Path| grants.iter().any(|g| p.starts_with(&g.path));
    let below = |p: &Path, roots: &[PathBuf]| roots.iter().any(|r| p.starts_with(r));
    // The directories the view makes itself: the ancestors of each grant outside every
    // granted tree.
    let mut made: Vec<PathBuf> = vec![PathBuf::from("/")];
    for g in grants {
        for anc in g.path.ancestors().skip(1) {
            if !in_grant(anc) && !made.iter().any(|m| m == anc) {
                made.push(anc.to_path_buf());
            }
        }
    }
    let in_view = |p: &Path| {
        !below(p, denied) && (in_grant(p) || made.iter().any(|m| m == p) || below(p, tmpfs))
    };
    let scanned: Vec<&PathBuf> = made
        .iter()
        .filter(|d| !d.starts_with("/dev") && !d.starts_with("/proc") && !below(d, tmpfs))
        .collect();
    let mut links = Vec::new();
    for dir in scanned {
        // Each directory made is a real one on the way to a resolved grant: the walk reaches
        // it without a link.
        let Ok(d) = walker.resolve(dir) else {
            continue;
        };
        let Ok(names) = walk::list_links(d.fd.as_fd(), &d.path) else {
            continue;
        };
        for name in names {
            let Ok(e) = walk::open_entry(d.fd.as_fd(), &d.path, &name) else {
                continue;
            };
            if !e.meta.is_symlink() {
                continue;
            }
            let Ok(target) = walk::read_link(&e) else {
                continue;
            };
            // The decision is the walk's: it follows the link only when it trusts it (and every
            // link after it), and says where it leads.
            if walker.resolve_path(&e.path).is_ok_and(|(p, _)| in_view(&p)) {
                links.push((e.path, target));
            }
        }
    }
    links
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(p: &str) -> Grant {
        let r = Walker::new(65534, 65534).resolve(Path::new(p)).unwrap();
        Grant {
            path: r.path,
            read_only: true,
            dir: true,
            dev: r.meta.dev,
            ino: r.meta.ino,
            owner: crate::policy::Identity {
                uid: r.meta.uid,
                gid: r.meta.gid,
            },
            mode: r.meta.mode,
            idmap: None,
        }
    }

    /// On a usr-merged root, granting /usr brings the root's links into it, and only those.
    #[test]
    fn the_roots_links_into_a_grant_are_reproduced_and_no_others() {
        let usr_links: Vec<(PathBuf, PathBuf)> = ["/bin", "/sbin", "/lib", "/lib64"]
            .iter()
            .filter_map(|l| Some((PathBuf::from(l), std::fs::read_link(l).ok()?)))
            .filter(|(_, t)| t.starts_with("usr") || t.starts_with("/usr"))
            .collect();
        if usr_links.is_empty() {
            eprintln!("SKIPPED: not a usr-merged root");
            return;
        }
        let w = Walker::new(65534, 65534);
        let got = reproduced(&w, &[grant("/usr")], &[], &[]);
        for l in &usr_links {
            assert!(got.contains(l), "{l:?} missing from {got:?}");
        }
        assert!(
            got.iter().all(|(_, t)| {
                let abs = Path::new("/").join(t);
                abs.starts_with("/usr")
            }),
            "{got:?}"
        );
        // Nothing granted that the links lead to: nothing reproduced.
        let got = reproduced(&w, &[grant("/etc")], &[], &[]);
        assert!(
            !got.iter()
                .any(|(l, _)| usr_links.iter().any(|(u, _)| u == l)),
            "{got:?}"
        );
        // Denied: as if not granted.
        let got = reproduced(&w, &[grant("/usr")], &[PathBuf::from("/usr/lib64")], &[]);
        assert!(
            !got.iter().any(|(l, _)| l == Path::new("/lib64")),
            "{got:?}"
        );
    }
}
