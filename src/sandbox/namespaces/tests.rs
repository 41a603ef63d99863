use super::plan::cstr;
use super::*;

fn grant(path: impl Into<PathBuf>, read_only: bool) -> Grant {
    Grant {
        path: path.into(),
        read_only,
        dir: true,
        dev: 0,
        ino: 0,
        owner: crate::policy::Identity { uid: 0, gid: 0 },
        mode: libc::S_IFDIR | 0o755,
        idmap: None,
    }
}

#[test]
fn grants_below_tmp_are_bound_back_and_their_denied_paths_hidden() {
    let wd = tempfile::Builder::new()
        .prefix("osb-view-")
        .tempdir_in("/tmp")
        .unwrap();
    let wd = wd.path().canonicalize().unwrap();
    let inner = wd.join("sub");
    std::fs::create_dir(&inner).unwrap();
    let secret = wd.join("secret");
    std::fs::write(&secret, "x").unwrap();
    let req = ViewRequest {
        private_net: true,
        hostname: "sandbox".into(),
        tmp_size: 1 << 20,
        shm_size: 1 << 20,
        grants: vec![
            grant(inner.clone(), true),
            grant(wd.clone(), false),
            grant("/usr", true),
        ],
        denied: vec![secret.clone(), "/etc/shadow".into()],
        proc: None,
        proc_read: true,
        links: Vec::new(),
        workdir: None,
        ipc: crate::policy::IpcLimits::for_budget(1 << 20, 4096),
        ipc_userns: Some((1000, 1001)),
        files: None,
    };
    let plan = ViewPlan::new(&req);
    // The IPC limits, each file with its value, and the id maps of their user namespace.
    let ipc: Vec<(&str, &str)> = plan
        .ipc_limits
        .iter()
        .map(|(f, v)| (f.to_str().unwrap(), v.to_str().unwrap()))
        .collect();
    assert_eq!(ipc[0], ("/proc/sys/kernel/shmmax", "1048576"));
    assert_eq!(ipc[1], ("/proc/sys/kernel/shmall", "256"));
    assert_eq!(ipc[6].0, "/proc/sys/kernel/sem");
    assert_eq!(
        plan.ipc_userns
            .as_ref()
            .map(|[u, g]| (u.to_str().unwrap(), g.to_str().unwrap())),
        Some(("0 1000 1", "0 1001 1"))
    );
    let tmp = plan
        .tmpfs
        .iter()
        .find(|t| t.target == Path::new("/tmp"))
        .unwrap();
    assert_eq!(tmp.data.to_str().unwrap(), "mode=1777,size=1048576");
    // The workdir is bound before the read-only grant inside it.
    let binds: Vec<_> = tmp
        .binds
        .iter()
        .map(|b| (b.path.clone(), b.read_only))
        .collect();
    assert_eq!(binds, vec![(cstr(&wd), false), (cstr(&inner), true)]);
    assert!(tmp.dirs.is_empty(), "{:?}", tmp.dirs);
    assert_eq!(tmp.hides, vec![(cstr(&secret), false)]);
    // A grant of /tmp itself leaves /tmp alone.
    let whole = ViewRequest {
        grants: vec![grant("/tmp", false)],
        ..req
    };
    assert!(
        !ViewPlan::new(&whole)
            .tmpfs_targets()
            .contains(&PathBuf::from("/tmp"))
    );
}
