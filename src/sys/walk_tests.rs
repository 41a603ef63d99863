use super::*;
use std::os::unix::fs::{MetadataExt, symlink};

fn walker() -> Walker {
    Walker::new(65534, 65534)
}

/// A directory `a` in a fresh temporary `root` (canonical), for a test to swap behind the
/// walk's back; with its first inode number.
fn swappable_dir() -> (tempfile::TempDir, PathBuf, PathBuf, u64) {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().canonicalize().unwrap();
    let a = root.join("a");
    std::fs::create_dir(&a).unwrap();
    let ino = std::fs::metadata(&a).unwrap().ino();
    (t, root, a, ino)
}

#[test]
fn within_a_memo_a_path_is_resolved_once_and_after_it_again() {
    let (_t, root, a, first_ino) = swappable_dir();
    let w = walker();
    let memo = Memo::begin();
    let r1 = w.resolve(&a).unwrap();
    // Swapped behind the walk's back: within the memo the first answer holds (the view and
    // Landlock then agree on it), each with a descriptor of its own.
    std::fs::rename(&a, root.join("old")).unwrap();
    std::fs::create_dir(&a).unwrap();
    let r2 = w.resolve(&a).unwrap();
    assert_eq!((r1.meta.ino, r2.meta.ino), (first_ino, first_ino));
    assert_ne!(r1.fd.as_raw_fd(), r2.fd.as_raw_fd());
    assert_eq!(fstat(r2.fd.as_fd()).unwrap().ino, first_ino);
    assert_eq!(canonical(&a).unwrap(), a);
    drop(memo);
    // No memo: asked again.
    let r3 = w.resolve(&a).unwrap();
    assert_ne!(r3.meta.ino, first_ino);
    assert_eq!(r3.meta.ino, std::fs::metadata(&a).unwrap().ino());
}

/// `resolve_path` shares the memo with `resolve`: within one, the answer it keeps (its own
/// walk's descriptor, no copy) is the one a later `resolve` hands out, with a working
/// descriptor of its own, and it answers from what `resolve` kept; after the memo, asked again.
#[test]
fn resolve_path_keeps_and_reads_the_same_answers_as_resolve() {
    let (_t, root, a, first_ino) = swappable_dir();
    let w = walker();
    let memo = Memo::begin();
    let (p1, m1) = w.resolve_path(&a).unwrap();
    assert_eq!((p1.as_path(), m1.ino), (a.as_path(), first_ino));
    std::fs::rename(&a, root.join("old")).unwrap();
    std::fs::create_dir(&a).unwrap();
    let r = w.resolve(&a).unwrap();
    assert_eq!(r.meta.ino, first_ino);
    assert_eq!(fstat(r.fd.as_fd()).unwrap().ino, first_ino);
    let (p2, m2) = w.resolve_path(&a).unwrap();
    assert_eq!((p2, m2.ino), (a.clone(), first_ino));
    // Kept by `resolve` first, read by `resolve_path`.
    let b = root.join("b");
    std::fs::create_dir(&b).unwrap();
    let rb = w.resolve(&b).unwrap();
    assert_eq!(w.resolve_path(&b).unwrap().1.ino, rb.meta.ino);
    drop(memo);
    let (_, m3) = w.resolve_path(&a).unwrap();
    assert_eq!(m3.ino, std::fs::metadata(&a).unwrap().ino());
    assert_ne!(m3.ino, first_ino);
}

/// Within a memo "no such entry" is an answer like any other: the same error, naming the
/// same component, until the memo ends, for the walk and for `canonical`. Other errors are
/// asked again.
#[test]
fn within_a_memo_a_missing_path_stays_missing_and_other_errors_are_asked_again() {
    let (_t, root, a, _) = swappable_dir();
    let w = walker();
    let memo = Memo::begin();
    let gone = root.join("gone/deeper");
    let first = w.resolve(&gone).unwrap_err().to_string();
    assert!(
        first.contains(&*root.join("gone").to_string_lossy()),
        "{first}"
    );
    assert_eq!(
        canonical(&gone).unwrap_err().raw_os_error(),
        Some(libc::ENOENT)
    );
    std::fs::create_dir_all(&gone).unwrap();
    assert_eq!(w.resolve(&gone).unwrap_err().to_string(), first);
    assert_eq!(
        canonical(&gone).unwrap_err().raw_os_error(),
        Some(libc::ENOENT)
    );
    // Not a directory: asked again once it is one.
    let file = a.join("f");
    std::fs::write(&file, b"").unwrap();
    let under = file.join("x");
    assert!(w.resolve(&under).is_err());
    assert!(canonical(&under).is_err());
    std::fs::remove_file(&file).unwrap();
    std::fs::create_dir_all(&under).unwrap();
    assert!(w.resolve(&under).is_ok());
    assert_eq!(canonical(&under).unwrap(), under);
    drop(memo);
    assert!(w.resolve(&gone).is_ok());
    assert_eq!(canonical(&gone).unwrap(), gone);
}

/// A preparation given up inside an outer memo (`run` holds one over its whole
/// preparation) asks again after `forget`: a swapped directory is seen as it is now.
#[test]
fn forget_drops_the_answers_of_an_outer_memo_too() {
    let (_t, root, a, first_ino) = swappable_dir();
    let w = walker();
    let outer = Memo::begin();
    let inner = Memo::begin();
    assert_eq!(w.resolve(&a).unwrap().meta.ino, first_ino);
    std::fs::rename(&a, root.join("old")).unwrap();
    std::fs::create_dir(&a).unwrap();
    let now = std::fs::metadata(&a).unwrap().ino();
    drop(inner);
    // Ending an inner memo keeps the outer one's answers ...
    assert_eq!(w.resolve(&a).unwrap().meta.ino, first_ino);
    // ... forgetting drops them, and the memo keeps answering afresh from there.
    Memo::begin().forget();
    assert_eq!(w.resolve(&a).unwrap().meta.ino, now);
    std::fs::rename(&a, root.join("newer")).unwrap();
    std::fs::create_dir(&a).unwrap();
    assert_eq!(w.resolve(&a).unwrap().meta.ino, now);
    drop(outer);
}

/// The one-lookup path and the walk agree on every path without a link, and leave every
/// path with one to the walk.
#[test]
fn the_linkless_fast_path_agrees_with_the_walk() {
    let w = walker();
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().canonicalize().unwrap();
    std::fs::create_dir(dir.join("d")).unwrap();
    std::fs::write(dir.join("d/f"), "x").unwrap();
    symlink("d", dir.join("l")).unwrap();
    for p in [
        PathBuf::from("/"),
        PathBuf::from("/usr"),
        PathBuf::from("/usr/bin"),
        PathBuf::from("/usr//bin/"),
        dir.join("d"),
        dir.join("d/f"),
    ] {
        let fast = resolve_linkless(&p).unwrap_or_else(|| panic!("{p:?} has no link"));
        let slow = w.walk(&p).unwrap();
        assert_eq!(
            (&fast.path, fast.meta.dev, fast.meta.ino),
            (&slow.path, slow.meta.dev, slow.meta.ino),
            "{p:?}"
        );
    }
    for p in [
        dir.join("l"),
        dir.join("l/f"),
        dir.join("d/../d"),
        dir.join("missing"),
        PathBuf::from("relative"),
    ] {
        assert!(
            resolve_linkless(&p).is_none(),
            "{p:?} must be left to the walk"
        );
    }
}

#[test]
fn a_real_path_resolves_to_itself() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().canonicalize().unwrap();
    std::fs::create_dir_all(root.join("a/b")).unwrap();
    let r = walker().resolve(&root.join("a/./b/../b")).unwrap();
    assert_eq!(r.path, root.join("a/b"));
    assert!(r.meta.is_dir());
}

#[test]
fn a_link_in_a_writable_directory_is_refused_by_name() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().canonicalize().unwrap();
    symlink("/", root.join("l")).unwrap();
    let e = walker().resolve(&root.join("l/etc")).unwrap_err();
    match e {
        WalkError::UntrustedLink { link, target, .. } => {
            assert_eq!(link, root.join("l"));
            assert_eq!(target, PathBuf::from("/"));
        }
        other => panic!("{other}"),
    }
}

/// `list_links` keeps the links (and what readdir cannot type) and only those; `list_dir`
/// keeps everything.
#[test]
fn list_links_names_the_links_of_a_directory() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().canonicalize().unwrap();
    std::fs::create_dir(root.join("dir")).unwrap();
    std::fs::write(root.join("file"), b"").unwrap();
    std::os::unix::fs::symlink("dir", root.join("to-dir")).unwrap();
    std::os::unix::fs::symlink("gone", root.join("dangling")).unwrap();
    let d = Walker::new(0, 0).resolve(&root).unwrap();
    let links = list_links(d.fd.as_fd(), &d.path).unwrap();
    assert_eq!(links, ["dangling", "to-dir"].map(OsString::from));
    let all = list_dir(d.fd.as_fd(), &d.path).unwrap();
    assert_eq!(
        all,
        ["dangling", "dir", "file", "to-dir"].map(OsString::from)
    );
}

#[test]
fn a_missing_path_is_not_found() {
    let e = walker()
        .resolve(Path::new("/nonexistent-osb/x"))
        .unwrap_err();
    assert!(e.is_not_found(), "{e}");
}

#[test]
fn system_roots_are_never_writable_and_others_may_be() {
    assert!(never_writable(Path::new("/")));
    assert!(never_writable(Path::new("/usr")));
    assert!(!never_writable(Path::new("/usr/local")));
    assert!(!never_writable(Path::new("/var")));
    for p in [
        "/",
        "/usr/local/bin",
        "/var",
        "/var/lib/x",
        "/etc/alternatives",
        "/dev",
    ] {
        assert!(in_system_tree(Path::new(p)), "{p}");
    }
    for p in [
        "/srv",
        "/srv/proj",
        "/home",
        "/root",
        "/mnt/data",
        "/variable",
    ] {
        assert!(!in_system_tree(Path::new(p)), "{p}");
    }
}

/// A root-owned link in a root-owned directory that root may write, outside the system's
/// trees, may come from a run whose grant of root's was idmapped: not followed by anyone.
/// (Inside them, `/var/run -> /run` and its like stay trusted.)
#[test]
fn a_root_link_where_a_mapped_run_could_write_as_root_is_not_followed() {
    let fake = |path: &str, uid: u32, mode: u32| Step {
        fd: walker()
            .resolve(Path::new("/"))
            .map(|r| r.fd)
            .expect("/ opens"),
        path: PathBuf::from(path),
        meta: Meta {
            mode: libc::S_IFDIR | mode,
            uid,
            gid: 0,
            nlink: 2,
            dev: 0,
            ino: 0,
        },
    };
    let link = Meta {
        mode: libc::S_IFLNK | 0o777,
        uid: 0,
        gid: 0,
        nlink: 1,
        dev: 0,
        ino: 0,
    };
    let w = walker();
    let planted = [
        fake("/", 0, 0o755),
        fake("/srv", 0, 0o755),
        fake("/srv/p", 0, 0o755),
    ];
    assert!(w.distrust(&link, &planted).is_some());
    let var = [fake("/", 0, 0o755), fake("/var", 0, 0o755)];
    assert_eq!(w.distrust(&link, &var), None);
    let read_only = [fake("/", 0, 0o755), fake("/srv", 0, 0o555)];
    assert_eq!(w.distrust(&link, &read_only), None);
}
