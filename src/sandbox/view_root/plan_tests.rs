//! Unit tests of the view root's plan (no kernel: what would be mounted where).

use super::*;

fn g(path: &str, read_only: bool, dir: bool) -> Grant {
    Grant {
        path: path.into(),
        read_only,
        dir,
        dev: 1,
        ino: 2,
        owner: crate::policy::Identity { uid: 0, gid: 0 },
        mode: if dir { libc::S_IFDIR } else { libc::S_IFREG } | 0o755,
        idmap: None,
    }
}

fn names(p: &RootPlan) -> Vec<(String, String, bool)> {
    p.entries
        .iter()
        .map(|e| {
            let path = e
                .comps
                .iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            let what = match &e.what {
                What::Dir => "dir".to_string(),
                What::Link(t) => format!("link {}", t.to_string_lossy()),
                What::Bind(i) => format!("bind ro={}", p.binds[*i].read_only),
                What::Tmpfs(i) => format!("tmpfs {i}"),
                What::HideDir => "hide-dir".into(),
                What::HideFile => "hide-file".into(),
                What::Files => "files".into(),
            };
            (path, what, e.create)
        })
        .collect()
}

#[test]
fn the_root_binds_each_grant_once_links_links_and_hides_denied_paths_inside_binds() {
    let req = RootRequest {
        grants: vec![
            g("/usr", true, true),
            g("/usr/bin", true, true),
            g("/usr/local/rw", false, true),
            g("/tmp/work", false, true),
            g("/tmp/work", true, true),
            g("/dev/null", false, false),
        ],
        proc: None,
        proc_read: false,
        links: vec![
            ("/lib".into(), "usr/lib".into()),
            ("/usr/lib64".into(), "lib".into()),
        ],
        denied: vec!["/nonexistent-osb/secret".into(), "/etc/shadow".into()],
        deny_idmap: false,
        files: None,
    };
    // A denied path below another is not covered again (the outer cover hides it).
    let tmp = std::env::temp_dir().join(format!("osb-view-root-{}", std::process::id()));
    std::fs::create_dir_all(tmp.join("d/inner")).unwrap();
    let nested = RootRequest {
        grants: vec![g(tmp.to_str().unwrap(), true, true)],
        denied: vec![tmp.join("d/inner"), tmp.join("d")],
        ..req.clone()
    };
    let hides: Vec<_> = names(&RootPlan::new(&nested, &[]).unwrap())
        .into_iter()
        .filter(|(_, w, _)| w.starts_with("hide"))
        .collect();
    std::fs::remove_dir_all(&tmp).unwrap();
    assert_eq!(hides.len(), 1, "{hides:?}");
    assert!(hides[0].0.ends_with("/d"), "{hides:?}");
    let p = RootPlan::new(&req, &["/tmp".into(), "/dev/shm".into()]).unwrap();
    let s = |a: &str, b: &str, c| (a.to_string(), b.to_string(), c);
    assert_eq!(
        names(&p),
        vec![
            s("usr", "bind ro=true", true),
            s("tmp", "tmpfs 0", true),
            s("proc", "dir", true),
            s("lib", "link usr/lib", true),
            s("tmp/work", "bind ro=false", true),
            s("dev/null", "bind ro=false", true),
            s("dev/shm", "tmpfs 1", true),
            s("dev/fd", "link /proc/self/fd", true),
            s("dev/stdin", "link /proc/self/fd/0", true),
            s("dev/stdout", "link /proc/self/fd/1", true),
            s("dev/stderr", "link /proc/self/fd/2", true),
            s("usr/local/rw", "bind ro=false", false),
        ]
    );
    assert_eq!(p.bind_count(), 4);
    assert_eq!(p.top_level(), ["dev", "lib", "proc", "tmp", "usr"]);
    assert!(
        RootPlan::new(
            &RootRequest {
                grants: vec![g("/", true, true)],
                ..req
            },
            &[]
        )
        .is_none()
    );
}

#[test]
fn a_grant_inside_an_idmapped_one_is_bound_again_only_with_another_mapping() {
    use crate::policy::Identity;
    use crate::sandbox::idmap::IdSwap;
    use crate::sandbox::namespaces::Idmap;
    let sb = Identity { uid: 7, gid: 7 };
    let map = |uid: u32, userns| {
        Some(Idmap {
            swap: IdSwap {
                owner: Identity { uid, gid: uid },
                sandbox: sb,
            },
            userns,
        })
    };
    let with = |path: &str, read_only, idmap| Grant {
        idmap,
        ..g(path, read_only, true)
    };
    let req = RootRequest {
        grants: vec![
            with("/w", false, map(65534, 10)),
            with("/w/same", false, map(65534, 10)),
            with("/w/other", false, map(4242, 11)),
            with("/w/own", false, None),
            with("/w/ro", true, map(65534, 10)),
        ],
        ..RootRequest::default()
    };
    let p = RootPlan::new(&req, &[]).unwrap();
    let binds: Vec<_> = p
        .binds
        .iter()
        .map(|b| (b.src.to_str().unwrap().to_owned(), b.userns, b.slot))
        .collect();
    assert_eq!(
        binds,
        vec![
            ("/w".to_owned(), 10, 0),
            ("/w/other".to_owned(), 11, 1),
            ("/w/own".to_owned(), -1, 0),
            ("/w/ro".to_owned(), 10, 2),
        ]
    );
    assert_eq!(p.idmap_slots(), 3);
    assert_eq!(p.idmap_slot(Path::new("/w/same/x")), Some(0));
    assert_eq!(p.idmap_slot(Path::new("/w/other")), Some(1));
    assert_eq!(p.idmap_slot(Path::new("/w/own/deeper")), None);
    assert_eq!(p.idmap_slot(Path::new("/elsewhere")), None);
}

#[test]
fn the_views_own_files_cover_a_denied_directory_and_need_a_mount_point_inside_a_bind() {
    let tmp = std::env::temp_dir().join(format!("osb-view-files-{}", std::process::id()));
    std::fs::create_dir_all(tmp.join("tls/client")).unwrap();
    let files = |dir: std::path::PathBuf| {
        Some(crate::policy::ViewFiles {
            dir,
            files: vec![("ca.pem".into(), b"pem".to_vec())],
        })
    };
    let req = RootRequest {
        grants: vec![g(tmp.to_str().unwrap(), true, true)],
        denied: vec![tmp.join("tls"), tmp.join("tls/client")],
        files: files(tmp.join("tls")),
        ..RootRequest::default()
    };
    let p = RootPlan::new(&req, &[]).unwrap();
    let n = names(&p);
    // The files' tmpfs replaces the cover of the denied directory (and hides all below it).
    assert!(
        n.iter()
            .any(|(path, w, create)| path.ends_with("/tls") && w == "files" && !create),
        "{n:?}"
    );
    assert!(!n.iter().any(|(_, w, _)| w.starts_with("hide")), "{n:?}");
    assert_eq!(p.files_dir().as_deref(), tmp.join("tls").to_str());
    assert_eq!(p.files, vec![(c"ca.pem".to_owned(), b"pem".to_vec())]);
    // Inside a bind without a mount point on the host: left out, and the cover stays.
    let missing = RootRequest {
        files: files(tmp.join("nope")),
        ..req.clone()
    };
    let p = RootPlan::new(&missing, &[]).unwrap();
    assert_eq!(p.files_dir(), None);
    assert!(names(&p).iter().any(|(_, w, _)| w == "hide-dir"));
    // Outside every bind: made in the root.
    let own = RootRequest {
        files: files("/osb-nonexistent-root-dir/tls".into()),
        ..req
    };
    let p = RootPlan::new(&own, &[]).unwrap();
    assert!(names(&p).contains(&("osb-nonexistent-root-dir/tls".into(), "files".into(), true)));
    std::fs::remove_dir_all(&tmp).unwrap();
}
