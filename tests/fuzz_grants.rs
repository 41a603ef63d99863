//! Fuzzing `policy::expand_grants` on random directory trees: directories, files, symlinks
//! (to anything in the tree, to the tree's parent, to a sibling outside it, dangling, to their
//! own parent), hard links; random grants of all three kinds and random denied paths (given
//! directly, through a symlink, or not existing yet).
//!
//! Invariants, for every tree:
//! 1. every rule is an existing, canonical path (Landlock opens it);
//! 2. no rule covers a denied path, and no rule lies below one (the secret stays unreadable);
//! 3. every rule lies inside a grant of the same access (splitting around a secret never
//!    grants more, or more widely, than the grant it splits);
//! 4. every regular file inside a grant and outside every denied path is still covered;
//! 5. a grant given through a symlink (every link here is in a directory the sandbox could
//!    write) is never followed: a read-write one (workdir, `--rw`) is an error naming the
//!    link, a built-in one (system, devices) is dropped, and neither counts in 3 and 4.
//!
//! Seeds: fuzz/corpus/expand_grants, one tree per file in the text form of `Tree::parse`.

mod support;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use openshell_sandbox::policy::{FsPolicy, FsRule, PathAccess, expand_grants};
use proptest::prelude::*;

/// One node, built in order; `parent` and `target` index earlier nodes (0 is the tree root).
#[derive(Debug, Clone)]
enum Node {
    Dir {
        parent: usize,
    },
    File {
        parent: usize,
    },
    /// To another node, by absolute path.
    LinkTo {
        parent: usize,
        target: usize,
    },
    /// To the directory that holds the tree (and so the tree and the sibling outside it).
    LinkAbove {
        parent: usize,
    },
    /// To a directory beside the tree, outside every grant.
    LinkOutside {
        parent: usize,
    },
    /// To `..` of its own directory.
    LinkParent {
        parent: usize,
    },
    Dangling {
        parent: usize,
    },
    HardLink {
        parent: usize,
        target: usize,
    },
}

#[derive(Debug, Clone)]
struct Tree {
    nodes: Vec<Node>,
    /// (node, access): the grants. The first ReadWrite one is the workdir.
    grants: Vec<(usize, PathAccess)>,
    /// Denied nodes; `missing_deny` adds a path that does not exist yet below a node.
    deny: Vec<usize>,
    missing_deny: Option<usize>,
}

impl Tree {
    /// `d P` dir, `f P` file, `l P T` link to node, `a P` link above, `o P` link outside,
    /// `p P` link to parent, `x P` dangling, `h P T` hard link; `g N ro|rw|dev` grant,
    /// `n N` deny, `m N` missing deny below N. Lines starting with `#` are comments.
    fn parse(text: &str) -> Tree {
        let mut t = Tree {
            nodes: Vec::new(),
            grants: Vec::new(),
            deny: Vec::new(),
            missing_deny: None,
        };
        for line in text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let w: Vec<&str> = line.split_whitespace().collect();
            let n = |i: usize| w[i].parse::<usize>().unwrap();
            match w[0] {
                "d" => t.nodes.push(Node::Dir { parent: n(1) }),
                "f" => t.nodes.push(Node::File { parent: n(1) }),
                "l" => t.nodes.push(Node::LinkTo {
                    parent: n(1),
                    target: n(2),
                }),
                "a" => t.nodes.push(Node::LinkAbove { parent: n(1) }),
                "o" => t.nodes.push(Node::LinkOutside { parent: n(1) }),
                "p" => t.nodes.push(Node::LinkParent { parent: n(1) }),
                "x" => t.nodes.push(Node::Dangling { parent: n(1) }),
                "h" => t.nodes.push(Node::HardLink {
                    parent: n(1),
                    target: n(2),
                }),
                "g" => t.grants.push((
                    n(1),
                    match w[2] {
                        "ro" => PathAccess::ReadExec,
                        "rw" => PathAccess::ReadWrite,
                        _ => PathAccess::Device,
                    },
                )),
                "n" => t.deny.push(n(1)),
                "m" => t.missing_deny = Some(n(1)),
                other => panic!("unknown tree line `{other}`"),
            }
        }
        t
    }
}

/// The tree on disk: `<tmp>/root/...` plus `<tmp>/outside/{a,b}/file`.
struct Built {
    _tmp: tempfile::TempDir,
    top: PathBuf,
    /// Path of every node; index 0 is the root.
    paths: Vec<PathBuf>,
}

fn build(t: &Tree) -> Built {
    let tmp = tempfile::Builder::new()
        .prefix("osb-fuzz-grants-")
        .tempdir()
        .unwrap();
    let top = tmp.path().canonicalize().unwrap();
    let root = top.join("root");
    std::fs::create_dir(&root).unwrap();
    for d in ["outside/a", "outside/b"] {
        std::fs::create_dir_all(top.join(d)).unwrap();
        std::fs::write(top.join(d).join("file"), "outside").unwrap();
    }
    let mut paths = vec![root];
    let mut is_dir = vec![true];
    for (i, node) in t.nodes.iter().enumerate() {
        // A parent that is not a directory (or a later index) falls back to the root.
        let parent_of = |p: usize| if p < paths.len() && is_dir[p] { p } else { 0 };
        let (parent, dir) = match node {
            Node::Dir { parent } => (parent_of(*parent), true),
            Node::File { parent }
            | Node::LinkTo { parent, .. }
            | Node::LinkAbove { parent }
            | Node::LinkOutside { parent }
            | Node::LinkParent { parent }
            | Node::Dangling { parent }
            | Node::HardLink { parent, .. } => (parent_of(*parent), false),
        };
        let path = paths[parent].join(format!("n{}", i + 1));
        let target = |t: usize| paths[t.min(paths.len() - 1)].clone();
        match node {
            Node::Dir { .. } => std::fs::create_dir(&path).unwrap(),
            Node::File { .. } => std::fs::write(&path, "x").unwrap(),
            Node::LinkTo { target: t, .. } => symlink(target(*t), &path).unwrap(),
            Node::LinkAbove { .. } => symlink(&top, &path).unwrap(),
            Node::LinkOutside { .. } => symlink(top.join("outside"), &path).unwrap(),
            Node::LinkParent { .. } => symlink("..", &path).unwrap(),
            Node::Dangling { .. } => symlink(top.join("nowhere"), &path).unwrap(),
            Node::HardLink { target: t, .. } => {
                let src = target(*t);
                if src.is_file() && !src.is_symlink() {
                    std::fs::hard_link(&src, &path).unwrap();
                } else {
                    std::fs::write(&path, "x").unwrap();
                }
            }
        }
        paths.push(path);
        is_dir.push(dir);
    }
    Built {
        _tmp: tmp,
        top,
        paths,
    }
}

fn policy(t: &Tree, b: &Built) -> FsPolicy {
    let node = |i: usize| b.paths[i.min(b.paths.len() - 1)].clone();
    let mut p = FsPolicy {
        workdir: b.top.join("no-workdir"),
        ..Default::default()
    };
    let mut workdir_set = false;
    for (i, access) in &t.grants {
        match access {
            PathAccess::ReadWrite if !workdir_set => {
                p.workdir = node(*i);
                workdir_set = true;
            }
            PathAccess::ReadWrite => p.read_write.push(node(*i)),
            PathAccess::ReadExec => p.system.push(node(*i)),
            PathAccess::Device => p.devices.push(node(*i)),
        }
    }
    p.deny = t.deny.iter().map(|&i| node(i)).collect();
    if let Some(i) = t.missing_deny {
        p.deny.push(node(i).join("not-yet"));
    }
    p
}

/// The forms of a denied path the sandbox must keep unreadable: as written, and resolved; for
/// one that does not exist yet, its nearest existing ancestor resolved, with the rest of the
/// path below it. A path below a regular file can never exist (and a Landlock rule on the file
/// would not follow a directory put in its place), so it is left out.
fn deny_forms(deny: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for d in deny {
        if let Ok(c) = d.canonicalize() {
            out.extend([d.clone(), c]);
            continue;
        }
        let Some(ancestor) = d.ancestors().skip(1).find(|a| a.exists()) else {
            continue;
        };
        let Ok(resolved) = ancestor.canonicalize() else {
            continue;
        };
        if resolved.is_dir() {
            let rest = d.strip_prefix(ancestor).unwrap();
            out.extend([d.clone(), resolved.join(rest)]);
        }
    }
    out
}

/// Regular files reachable from `dir` through real directories only.
fn real_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let ft = e.file_type().unwrap();
        if ft.is_dir() {
            real_files(&e.path(), out);
        } else if ft.is_file() {
            out.push(e.path());
        }
    }
}

fn is_link(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink())
}

fn check(t: &Tree) -> Result<usize, TestCaseError> {
    let b = build(t);
    let p = policy(t, &b);
    // Node parents are always real directories, so only a node itself can be a link.
    let rw_link = std::iter::once(&p.workdir)
        .chain(&p.read_write)
        .find(|g| is_link(g));
    let result = expand_grants(&p);
    if let Some(link) = rw_link {
        let e = match result {
            Ok(rules) => {
                return Err(TestCaseError::fail(format!(
                    "read-write grant through the link {} was accepted: {rules:?}",
                    link.display()
                )));
            }
            Err(e) => e.to_string(),
        };
        // The first link met in policy order is the one named.
        prop_assert!(e.contains("refusing to follow the symlink"), "{}", e);
        return Ok(0);
    }
    let rules: Vec<FsRule> = match result {
        Ok(r) => r,
        Err(e) => return Err(TestCaseError::fail(format!("expand_grants failed: {e}"))),
    };
    let denied = deny_forms(&p.deny);
    let mut grants: Vec<(PathBuf, PathAccess)> = Vec::new();
    for (g, a) in p
        .system
        .iter()
        .map(|g| (g, PathAccess::ReadExec))
        .chain(std::iter::once((&p.workdir, PathAccess::ReadWrite)))
        .chain(p.read_write.iter().map(|g| (g, PathAccess::ReadWrite)))
        .chain(p.devices.iter().map(|g| (g, PathAccess::Device)))
    {
        if is_link(g) {
            continue;
        }
        if let Ok(c) = g.canonicalize() {
            grants.push((c, a));
        }
    }
    for r in &rules {
        let c = r.path.canonicalize().map_err(|e| {
            TestCaseError::fail(format!("rule {} does not resolve: {e}", r.path.display()))
        })?;
        prop_assert_eq!(&c, &r.path, "rule path is not canonical");
        for d in &denied {
            prop_assert!(
                !c.starts_with(d) && !d.starts_with(&c),
                "rule {:?} covers or lies in the denied {}",
                r,
                d.display()
            );
        }
        prop_assert!(
            grants
                .iter()
                .any(|(g, a)| c.starts_with(g) && *a == r.access),
            "rule {:?} lies outside every {:?} grant {:?}",
            r,
            r.access,
            grants
        );
    }
    let mut files = Vec::new();
    real_files(&b.top, &mut files);
    for f in files {
        let granted = grants.iter().any(|(g, _)| f.starts_with(g));
        let is_denied = denied.iter().any(|d| f.starts_with(d));
        if granted && !is_denied {
            prop_assert!(
                rules.iter().any(|r| f.starts_with(&r.path)),
                "{} is granted and not denied, but no rule covers it",
                f.display()
            );
        }
    }
    // How many rules came from splitting (more rules than grants): the caller counts these
    // so that the harness is known to exercise the split.
    Ok(rules.len().saturating_sub(grants.len()))
}

fn node() -> impl Strategy<Value = Node> {
    let p = 0usize..24;
    prop_oneof![
        4 => p.clone().prop_map(|parent| Node::Dir { parent }),
        3 => p.clone().prop_map(|parent| Node::File { parent }),
        2 => (p.clone(), 0usize..24).prop_map(|(parent, target)| Node::LinkTo { parent, target }),
        1 => p.clone().prop_map(|parent| Node::LinkAbove { parent }),
        1 => p.clone().prop_map(|parent| Node::LinkOutside { parent }),
        1 => p.clone().prop_map(|parent| Node::LinkParent { parent }),
        1 => p.clone().prop_map(|parent| Node::Dangling { parent }),
        1 => (p, 0usize..24).prop_map(|(parent, target)| Node::HardLink { parent, target }),
    ]
}

/// At most one symlink to a directory per generated tree. Two or more in a directory that is
/// split can make the expansion exponential (finding 3 in SECURITY.md, kept as the seed
/// `symlink_loops.txt`); one keeps every random case fast while still exercising links that
/// leave the grant.
fn one_directory_link(mut t: Tree) -> Tree {
    let mut dir_link_seen = false;
    let mut is_dir = vec![true];
    for i in 0..t.nodes.len() {
        let dir = matches!(t.nodes[i], Node::Dir { .. });
        let to_dir = match t.nodes[i] {
            Node::LinkTo { target, .. } => is_dir.get(target).copied().unwrap_or(true),
            Node::LinkAbove { .. } | Node::LinkOutside { .. } | Node::LinkParent { .. } => true,
            _ => false,
        };
        if to_dir {
            if dir_link_seen {
                let parent = match t.nodes[i] {
                    Node::LinkTo { parent, .. }
                    | Node::LinkAbove { parent }
                    | Node::LinkOutside { parent }
                    | Node::LinkParent { parent } => parent,
                    _ => 0,
                };
                t.nodes[i] = Node::Dangling { parent };
            }
            dir_link_seen = true;
        }
        is_dir.push(dir);
    }
    t
}

fn tree() -> impl Strategy<Value = Tree> {
    let access = prop_oneof![
        Just(PathAccess::ReadExec),
        Just(PathAccess::ReadWrite),
        Just(PathAccess::Device)
    ];
    (
        proptest::collection::vec(node(), 1..24),
        // Grants near the root hold more of the tree, so more denied paths fall inside them.
        proptest::collection::vec(
            (prop_oneof![Just(0usize), 0usize..4, 0usize..25], access),
            1..5,
        ),
        proptest::collection::vec(0usize..25, 1..4),
        proptest::option::of(0usize..25),
    )
        .prop_map(|(nodes, grants, deny, missing_deny)| {
            one_directory_link(Tree {
                nodes,
                grants,
                deny,
                missing_deny,
            })
        })
}

/// A seed that has not finished after this long is reported as hung (the expansion is
/// exponential in symlink loops); every seed finishes in milliseconds otherwise. This detects
/// a hang, it does not measure speed.
const HANG: std::time::Duration = std::time::Duration::from_secs(30);

#[test]
fn expand_grants_seeds() {
    let mut failures = Vec::new();
    for (name, bytes) in support::fuzz::corpus("expand_grants") {
        let t = Tree::parse(&String::from_utf8_lossy(&bytes));
        let (tx, rx) = std::sync::mpsc::channel();
        let tree = t.clone();
        // A hung seed's thread is left behind; it ends with the test process.
        std::thread::spawn(move || {
            let _ = tx.send(check(&tree).map_err(|e| e.to_string()));
        });
        match rx.recv_timeout(HANG) {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => failures.push(format!("seed {name}: {e}")),
            Err(_) => failures.push(format!(
                "seed {name}: expand_grants did not finish within {HANG:?} (exponential in symlink loops?)"
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn expand_grants_never_covers_a_denied_path_nor_widens_a_grant() {
    let split = std::sync::atomic::AtomicU32::new(0);
    let mut config = support::fuzz::config(1_000);
    // Each case builds a tree on disk; keep shrinking short.
    config.max_shrink_iters = 512;
    let trees = support::fuzz::run("expand_grants", config, &tree(), |t| {
        if check(&t)? > 0 {
            split.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    });
    let split = split.into_inner();
    eprintln!("expand_grants: {split} of {trees} trees needed a split");
    assert!(
        u64::from(split) >= trees / 10,
        "too few trees exercised the split"
    );
}
