//! Whose ids the sandbox's writes to its read-write grants carry: which grants are bound as
//! idmapped mounts (idmap.rs), what came of each as the view's helper reported it, the
//! report's `ownership` row, and whether `run` hands its workdir over where the kernel refused
//! the mapping (exec/workdir). Decided once by `prepare`; everything else reads it.

use std::io;
use std::path::PathBuf;

use super::idmap::IdSwap;
use super::namespaces::Grant;
use super::view_root::{MAX_IDMAP, RootPlan};
use crate::policy::{Identity, NOBODY, Policy, WriteAs};

/// Whether a directory is shared by everyone (world-writable and sticky, as /tmp and
/// /var/tmp): its owner does not own what is in it, so it is never mapped to its owner
/// (through such a mapping the sandbox would own every root file there).
fn shared(mode: u32) -> bool {
    mode & libc::S_IFMT == libc::S_IFDIR && mode & 0o1002 == 0o1002
}

/// Which mapping each grant gets (index-aligned with `grants`): a read-write directory or
/// regular file that is not shared and not the sandbox identity's own is mapped to its owner;
/// a read-only grant inside a read-write one shows the owners that grant shows (the mapping of
/// the innermost read-write grant around it). Devices and other kinds are never mapped, and
/// nothing in the system's own trees (`/var`, `/opt/x`, ...) is mapped to root: the grant walk
/// trusts a root-owned link there as root's own (policy/walk.rs), and through such a mapping
/// the sandbox's links would be root-owned too.
pub fn wanted(grants: &[Grant], sandbox: Identity) -> Vec<Option<IdSwap>> {
    let own = |g: &Grant| -> Option<IdSwap> {
        let kind = g.mode & libc::S_IFMT;
        let mappable = kind == libc::S_IFDIR || kind == libc::S_IFREG;
        let system_root = g.owner.uid == 0 && crate::sys::walk::in_system_tree(&g.path);
        (!g.read_only && mappable && !shared(g.mode) && !system_root && g.owner != sandbox)
            .then_some(IdSwap {
                owner: g.owner,
                sandbox,
            })
    };
    grants
        .iter()
        .map(|g| {
            if !g.read_only {
                return own(g);
            }
            grants
                .iter()
                .filter(|w| !w.read_only && w.dir && g.path.starts_with(&w.path))
                .max_by_key(|w| w.path.components().count())
                .and_then(own)
        })
        .collect()
}

/// Which grants of `wanted` matter to the report: the read-write ones (a read-only grant only
/// repeats the mapping around it).
pub fn reported(grants: &[Grant], wanted: &[Option<IdSwap>]) -> Vec<(usize, IdSwap)> {
    grants
        .iter()
        .zip(wanted)
        .enumerate()
        .filter_map(|(i, (g, w))| w.filter(|_| !g.read_only).map(|w| (i, w)))
        .collect()
}

/// How the writes to one read-write grant are owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// Through an idmapped mount: stored as the owner's.
    Idmapped,
    /// No idmapped mount (why): written as the sandbox identity, as the modes allow, unless
    /// the grant is the workdir and it is handed over ([`HandOver`]).
    Refused(String),
}

/// One read-write grant that wanted a mapping, and what came of it.
#[derive(Debug, Clone)]
pub struct GrantOwner {
    /// Symlink-free, as the walk resolved it.
    pub path: PathBuf,
    pub owner: Identity,
    pub seen: Seen,
}

/// Where idmapped mounts are refused, `run` hands its workdir to the sandbox identity for the
/// run and back after it (exec/workdir): the directory the walk decided on, by device and
/// inode, and whose it is.
#[derive(Debug, Clone)]
pub struct HandOver {
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
    pub from: Identity,
    pub to: Identity,
}

/// Whose ids the writes to the read-write grants carry, decided once by `prepare` from the
/// policy, the walk and what the view's helper reported; read by the report row, by `run`'s
/// writability check and by the hand-over.
#[derive(Debug, Clone, Default)]
pub struct Ownership {
    /// The identity the command runs as, when the supervisor switches to one (root).
    pub sandbox: Option<Identity>,
    /// The policy asks for the owners' ids (`run`), not the sandbox's (`serve`).
    pub as_owner: bool,
    /// The grants that wanted a mapping, the workdir first when it is one of them.
    pub grants: Vec<GrantOwner>,
    /// Whether the workdir is among `grants`.
    pub workdir_mapped: bool,
    pub hand_over: Option<HandOver>,
    /// Every read-write directory or file grant (the workdir, `--rw`) as the walk decided on
    /// it: (path, device, inode), for the claim of exec/workdir.
    pub read_write: Vec<(PathBuf, u64, u64)>,
}

/// What a refused `mount_setattr(MOUNT_ATTR_IDMAP)` means here.
fn refusal(errno: i32) -> String {
    let why = match errno {
        libc::EINVAL => ": the filesystem has no idmapped mounts",
        libc::EPERM => {
            ": not allowed here (the supervisor is in a user namespace that does not own the filesystem, or the mount is idmapped already)"
        }
        libc::E2BIG => "",
        _ => "",
    };
    format!("{}{why}", io::Error::from_raw_os_error(errno))
}

impl Ownership {
    /// `workdir`: the index of the workdir's grant in `grants`. `failed`: the mappings that got
    /// no user namespace. `root`: the plan of the view's root, when the view has one.
    /// `slots`: the helper's per-bind outcomes (`View::idmap`).
    pub fn decide(
        policy: &Policy,
        euid: u32,
        grants: &[Grant],
        workdir: Option<usize>,
        failed: &[(IdSwap, io::Error)],
        root: Option<&RootPlan>,
        slots: &[i32],
    ) -> Ownership {
        let sandbox = policy.identity.filter(|_| euid == 0);
        let kind = |g: &Grant| g.mode & libc::S_IFMT;
        let mut out = Ownership {
            sandbox,
            read_write: grants
                .iter()
                .filter(|g| !g.read_only && matches!(kind(g), libc::S_IFDIR | libc::S_IFREG))
                .map(|g| (g.path.clone(), g.dev, g.ino))
                .collect(),
            ..Ownership::default()
        };
        let (Some(sb), WriteAs::Owner { hand_over }) = (sandbox, &policy.fs.write_as) else {
            return out;
        };
        out.as_owner = true;
        let wanted = wanted(grants, sb);
        let mut order = reported(grants, &wanted);
        // The workdir first: the row names it first, and the hand-over is about it.
        order.sort_by_key(|(i, _)| Some(*i) != workdir);
        for (i, swap) in order {
            let g = &grants[i];
            let seen = if let Some((_, e)) = failed.iter().find(|(s, _)| *s == swap) {
                Seen::Refused(format!("no user namespace for the mapping: {e}"))
            } else if let Some(r) = root {
                match r.idmap_slot(&g.path).and_then(|s| slots.get(s).copied()) {
                    Some(0) => Seen::Idmapped,
                    Some(-1) | None if r.idmap_slots() >= MAX_IDMAP => {
                        Seen::Refused(format!("more than {MAX_IDMAP} idmapped grants"))
                    }
                    Some(-1) | None => Seen::Refused("not bound into the view".into()),
                    Some(e) => Seen::Refused(refusal(e)),
                }
            } else {
                Seen::Refused("the view has no root of its own (see namespace-mount)".into())
            };
            out.workdir_mapped |= Some(i) == workdir;
            out.grants.push(GrantOwner {
                path: g.path.clone(),
                owner: g.owner,
                seen,
            });
        }
        let ours = |uid: u32| uid == NOBODY || hand_over.contains(&uid);
        if let (true, Some(w), Some(i)) = (out.workdir_mapped, out.grants.first(), workdir) {
            let g = &grants[i];
            if matches!(w.seen, Seen::Refused(_))
                && g.dir
                && ours(g.owner.uid)
                && ours(sb.uid)
                && g.owner.uid != sb.uid
            {
                out.hand_over = Some(HandOver {
                    path: g.path.clone(),
                    dev: g.dev,
                    ino: g.ino,
                    from: g.owner,
                    to: sb,
                });
            }
        }
        out
    }

    /// As whom the kernel checks the sandbox's access to the workdir itself: its owner through
    /// an idmapped mount, else the sandbox identity (once handed over, its owner). `None`: the
    /// supervisor does not switch identity, the command is us.
    pub fn workdir_writer(&self) -> Option<Identity> {
        let sb = self.sandbox?;
        match self.grants.first() {
            Some(w) if self.workdir_mapped && w.seen == Seen::Idmapped => Some(w.owner),
            _ => Some(sb),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::decide::ownership_row;
    use crate::sandbox::layer::Enforcement;
    use std::path::Path;

    fn id(uid: u32, gid: u32) -> Identity {
        Identity { uid, gid }
    }

    fn g(path: &str, read_only: bool, mode: u32, owner: Identity) -> Grant {
        Grant {
            path: PathBuf::from(path),
            read_only,
            dir: mode & libc::S_IFMT == libc::S_IFDIR,
            dev: 1,
            ino: 2,
            owner,
            mode,
            idmap: None,
        }
    }

    #[test]
    fn read_write_grants_of_others_are_mapped_and_read_only_ones_inside_follow() {
        let sb = id(1_900_000_005, 1_900_000_005);
        let nobody = id(65534, 65534);
        let dir = libc::S_IFDIR | 0o755;
        let grants = vec![
            g("/w", false, dir, nobody),
            g("/w/own", false, dir, sb),
            g("/w/own/ro", true, dir, nobody),
            g("/w/ro", true, dir, id(0, 0)),
            g("/tmp", false, libc::S_IFDIR | 0o1777, id(0, 0)),
            g("/dev/null", false, libc::S_IFCHR | 0o666, id(0, 0)),
            g("/usr", true, dir, id(0, 0)),
            g("/f", false, libc::S_IFREG | 0o644, id(4242, 4243)),
            g("/w2", false, dir, id(sb.uid, 7)),
            g("/opt/x", false, dir, id(0, 0)),
            g("/srv/x", false, dir, id(0, 0)),
        ];
        let w = wanted(&grants, sb);
        let swap = |owner| Some(IdSwap { owner, sandbox: sb });
        assert_eq!(
            w,
            vec![
                swap(nobody),
                None,
                None,
                swap(nobody),
                None,
                None,
                None,
                swap(id(4242, 4243)),
                swap(id(sb.uid, 7)),
                None,
                swap(id(0, 0)),
            ]
        );
        let r: Vec<usize> = reported(&grants, &w).into_iter().map(|(i, _)| i).collect();
        assert_eq!(r, vec![0, 7, 8, 10]);
    }

    fn policy(wd: &str, sandbox: Identity, write_as: WriteAs) -> Policy {
        let mut fs = crate::policy::FsPolicy::with_defaults(PathBuf::from(wd));
        fs.write_as = write_as;
        let mut p = Policy {
            fs,
            network: crate::policy::NetworkMode::None,
            limits: Default::default(),
            identity: None,
            allow_degraded: false,
            namespaces: Default::default(),
        };
        p.set_identity(sandbox);
        p
    }

    #[test]
    fn ownership_is_decided_from_the_helpers_report_and_the_hand_over_only_for_our_uids() {
        use super::super::view_root::RootRequest;
        let sb = id(1_900_000_005, 1_900_000_005);
        let nobody = id(65534, 65534);
        let dir = libc::S_IFDIR | 0o755;
        let run = WriteAs::Owner {
            hand_over: 1_900_000_000..=1_900_000_999,
        };
        let with_map = |mut g: Grant, fd| {
            g.idmap = Some(super::super::namespaces::Idmap {
                swap: IdSwap {
                    owner: g.owner,
                    sandbox: sb,
                },
                userns: fd,
            });
            g
        };
        let grants = vec![
            g("/usr", true, dir, id(0, 0)),
            with_map(g("/w", false, dir, nobody), 10),
            with_map(g("/data", false, dir, id(4242, 4242)), 11),
        ];
        let plan = RootPlan::new(
            &RootRequest {
                grants: grants.clone(),
                ..Default::default()
            },
            &[],
        )
        .unwrap();
        let decide = |slots: &[i32], root: bool, write_as: WriteAs| {
            Ownership::decide(
                &policy("/w", sb, write_as),
                0,
                &grants,
                Some(1),
                &[],
                root.then_some(&plan),
                slots,
            )
        };
        // Both mapped.
        let o = decide(&[0, 0], true, run.clone());
        assert_eq!(o.workdir_writer(), Some(nobody));
        assert!(o.hand_over.is_none());
        let row = ownership_row(&o);
        assert_eq!(row.status, Enforcement::Enforced);
        assert!(
            row.detail
                .contains("/w (owner 65534:65534), /data (owner 4242:4242)")
        );
        // The filesystem refuses: the workdir of 65534 is handed over, the other grant is not.
        let o = decide(&[libc::EINVAL, libc::EINVAL], true, run.clone());
        let h = o.hand_over.as_ref().unwrap();
        assert_eq!(
            (h.from, h.to, h.path.as_path()),
            (nobody, sb, Path::new("/w"))
        );
        assert_eq!(o.workdir_writer(), Some(sb));
        let row = ownership_row(&o);
        assert!(
            row.detail.contains("refused for /w (Invalid argument (os error 22): the filesystem has no idmapped mounts): handed to 1900000005:1900000005 for the run and back to 65534:65534 after it"),
            "{}",
            row.detail
        );
        assert!(row.detail.contains("/data") && row.detail.contains("as its mode allows"));
        // No root of its own: nothing could be mapped.
        let o = decide(&[], false, run.clone());
        assert!(matches!(&o.grants[0].seen, Seen::Refused(w) if w.contains("no root")));
        assert!(o.hand_over.is_some());
        // An explicit uid outside the sandbox's own is never handed a workdir.
        let mut p = policy("/w", id(4242, 4242), run.clone());
        p.set_identity(id(4242, 4242));
        let o = Ownership::decide(&p, 0, &grants, Some(1), &[], None, &[]);
        assert!(o.hand_over.is_none());
        // serve: the sandbox's own ids, nothing mapped; not root: nothing at all.
        let o = decide(&[0, 0], true, WriteAs::Sandbox);
        assert!(o.grants.is_empty() && o.hand_over.is_none());
        assert_eq!(ownership_row(&o).status, Enforcement::NotRequested);
        assert_eq!(o.workdir_writer(), Some(sb));
        let o = Ownership::decide(
            &policy("/w", sb, run),
            1000,
            &grants,
            Some(1),
            &[],
            None,
            &[],
        );
        assert_eq!(o.workdir_writer(), None);
        assert_eq!(ownership_row(&o).status, Enforcement::NotRequested);
    }
}
