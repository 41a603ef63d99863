//! Mapping the model onto our policy: every key, best_effort and hard_requirement, what is
//! refused, flags on top, identity, the default policy and the local fallback.

use std::path::PathBuf;

use super::tests::full_model;
use super::*;
use crate::policy::{Identity, NetworkMode, PolicyFlags};

struct Tree {
    _t: tempfile::TempDir,
    root: PathBuf,
}

impl Tree {
    fn new() -> Tree {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap();
        for d in ["work", "ro", "rw", "secret"] {
            std::fs::create_dir(root.join(d)).unwrap();
        }
        Tree { _t: t, root }
    }
    fn p(&self, rel: &str) -> String {
        self.root.join(rel).to_string_lossy().into_owned()
    }
}

const ROOT_HOST: Host = Host {
    euid: 0,
    egid: 0,
    sandbox_user: None,
};
const USER_HOST: Host = Host {
    euid: 1000,
    egid: 1000,
    sandbox_user: None,
};

fn fs_policy(ro: &[String], rw: &[String], compat: &str) -> SandboxPolicy {
    SandboxPolicy {
        version: 1,
        filesystem: Some(FilesystemPolicy {
            include_workdir: true,
            read_only: ro.to_vec(),
            read_write: rw.to_vec(),
        }),
        landlock: Some(LandlockPolicy {
            compatibility: compat.into(),
        }),
        ..Default::default()
    }
}

fn map(t: &Tree, p: &SandboxPolicy, flags: &PolicyFlags) -> Result<Resolved, MapError> {
    resolve(
        p,
        flags,
        &t.root.join("work"),
        vec![t.root.join("secret")],
        &ROOT_HOST,
    )
}

#[test]
fn map_filesystem_lists_are_the_whole_grant_set() {
    let t = Tree::new();
    let p = fs_policy(
        &[t.p("ro"), "/proc".into(), "/dev/urandom".into()],
        &[t.p("rw"), "/dev/null".into()],
        "",
    );
    let r = map(&t, &p, &PolicyFlags::default()).unwrap();
    let fs = &r.policy.fs;
    assert_eq!(fs.workdir, t.root.join("work"));
    assert!(
        fs.system.is_empty(),
        "our built-in system list is not added"
    );
    assert_eq!(
        fs.read_only,
        [t.root.join("ro"), PathBuf::from("/dev/urandom")]
    );
    assert_eq!(fs.read_write, [t.root.join("rw")]);
    assert_eq!(fs.devices, [PathBuf::from("/dev/null")]);
    assert!(fs.proc_read);
    assert!(fs.deny.contains(&t.root.join("secret")));
    assert!(fs.deny.contains(&PathBuf::from("/etc/openshell-tls")));
    assert_eq!(r.compatibility, Compatibility::BestEffort);
    assert_eq!(r.network, NetworkOutcome::Enforced);
    assert_eq!(r.policy.network, NetworkMode::None);
    assert!(r.warnings.is_empty());
    // Without /proc in the list, /proc is not granted.
    let r = map(
        &t,
        &fs_policy(&[t.p("ro")], &[], ""),
        &PolicyFlags::default(),
    )
    .unwrap();
    assert!(!r.policy.fs.proc_read);
}

#[test]
fn map_best_effort_skips_a_missing_path_hard_requirement_refuses_it() {
    let t = Tree::new();
    let ro = [t.p("ro"), t.p("absent")];
    let r = map(
        &t,
        &fs_policy(&ro, &[], "best_effort"),
        &PolicyFlags::default(),
    )
    .unwrap();
    assert_eq!(r.policy.fs.read_only, [t.root.join("ro")]);
    assert_eq!(
        r.warnings,
        [MapWarning::SkippedPath {
            key: "filesystem_policy.read_only[1]".into(),
            path: t.root.join("absent"),
            kind: std::io::ErrorKind::NotFound,
        }]
    );
    assert!(r.warnings[0].to_string().contains("best_effort"));
    let e = map(
        &t,
        &fs_policy(&ro, &[], "hard_requirement"),
        &PolicyFlags::default(),
    )
    .unwrap_err();
    assert!(
        matches!(&e, MapError::Missing { key, source, .. }
            if key == "filesystem_policy.read_only[1]" && source.kind() == std::io::ErrorKind::NotFound),
        "{e}"
    );
}

#[test]
fn map_refuses_what_it_cannot_enforce_naming_the_key() {
    let t = Tree::new();
    let none = PolicyFlags::default();
    let key_of = |e: MapError| e.to_string();
    let mut absent = fs_policy(&[], &[], "");
    absent.filesystem = None;
    assert!(key_of(map(&t, &absent, &none).unwrap_err()).starts_with("filesystem_policy:"));
    let mut empty = fs_policy(&[], &[], "");
    empty.filesystem.as_mut().unwrap().include_workdir = false;
    assert!(matches!(
        map(&t, &empty, &none),
        Err(MapError::NoFilesystem { .. })
    ));
    let mut all_missing = fs_policy(&[t.p("absent")], &[], "");
    all_missing.filesystem.as_mut().unwrap().include_workdir = false;
    assert!(matches!(
        map(&t, &all_missing, &none),
        Err(MapError::NoPathOpened)
    ));
    for (ro, want) in [
        (
            "usr",
            "filesystem_policy.read_only[0]: `usr` is not an absolute path",
        ),
        (
            "/usr/../etc",
            "filesystem_policy.read_only[0]: `/usr/../etc` has a `..`",
        ),
        (
            "/proc/self",
            "filesystem_policy.read_only[0]: /proc/self is below /proc",
        ),
    ] {
        let e = map(&t, &fs_policy(&[ro.into()], &[], ""), &none).unwrap_err();
        assert!(e.to_string().starts_with(want), "{e}");
    }
    let e = map(&t, &fs_policy(&[], &[t.p("secret")], ""), &none).unwrap_err();
    assert!(
        matches!(&e, MapError::Secret { key, .. } if key == "filesystem_policy.read_write[0]"),
        "{e}"
    );
    let e = map(&t, &fs_policy(&[t.p("ro")], &[], "strict"), &none).unwrap_err();
    assert_eq!(
        e.to_string(),
        "landlock.compatibility: `strict` is neither best_effort nor hard_requirement"
    );
    let degraded = PolicyFlags {
        allow_degraded: true,
        ..Default::default()
    };
    assert!(matches!(
        map(
            &t,
            &fs_policy(&[t.p("ro")], &[], "hard_requirement"),
            &degraded
        ),
        Err(MapError::HardRequirementDegraded)
    ));
}

#[test]
fn map_include_workdir_false_needs_the_workdir_listed_read_write() {
    let t = Tree::new();
    let mut p = fs_policy(&[t.p("ro")], &[], "");
    p.filesystem.as_mut().unwrap().include_workdir = false;
    assert!(matches!(
        map(&t, &p, &PolicyFlags::default()),
        Err(MapError::WorkdirNotListed(_))
    ));
    // Read-only is not enough: we would grant more than asked.
    p.filesystem.as_mut().unwrap().read_only.push(t.p("work"));
    assert!(map(&t, &p, &PolicyFlags::default()).is_err());
    p.filesystem
        .as_mut()
        .unwrap()
        .read_write
        .push(t.root.display().to_string());
    assert!(map(&t, &p, &PolicyFlags::default()).is_ok());
}

#[test]
fn map_network_policies_deny_all_egress_and_name_the_rule_keys() {
    let t = Tree::new();
    let mut p = fs_policy(&[t.p("ro")], &[], "");
    p.network_policies = full_model().network_policies;
    p.network_policies
        .insert("_provider_x".into(), NetworkPolicyRule::default());
    p.network_middlewares = Some(Opaque);
    let r = map(&t, &p, &PolicyFlags::default()).unwrap();
    assert_eq!(r.policy.network, NetworkMode::None);
    assert_eq!(
        r.network,
        NetworkOutcome::EgressDenied {
            rule_keys: vec!["_provider_x".into(), "github".into()]
        }
    );
    assert!(r.warnings.contains(&MapWarning::IgnoredMiddlewares));
    // The proxy keeps the file's rules, all of them.
    assert_eq!(r.proxy_rules(&p), Some(&p.network_policies));
    let e = r.into_enforceable().unwrap_err().to_string();
    assert!(
        e.contains("not enforceable until egress rules exist (rules: _provider_x, github)"),
        "{e}"
    );
    // An explicit --network replaces the file's network section.
    let all = PolicyFlags {
        network: Some(NetworkMode::All),
        ..Default::default()
    };
    let r = map(&t, &p, &all).unwrap();
    assert_eq!(r.policy.network, NetworkMode::All);
    assert_eq!(r.proxy_rules(&p), None);
    let none = PolicyFlags {
        network: Some(NetworkMode::None),
        ..Default::default()
    };
    assert_eq!(map(&t, &p, &none).unwrap().proxy_rules(&p), None);
    let mut bare = p.clone();
    bare.network_policies.clear();
    assert_eq!(
        map(&t, &bare, &PolicyFlags::default())
            .unwrap()
            .proxy_rules(&bare),
        None
    );
    assert!(r.into_enforceable().is_ok());
    let mut p2 = p.clone();
    assert!(strip_provider_rules(&mut p2));
    assert_eq!(p2.network_policies.keys().collect::<Vec<_>>(), ["github"]);
    assert!(!strip_provider_rules(&mut p2));
}

#[test]
fn map_explicit_flags_override_and_list_flags_add() {
    let t = Tree::new();
    std::fs::create_dir(t.root.join("other")).unwrap();
    let p = fs_policy(&[t.p("ro")], &[t.p("rw")], "");
    let flags = PolicyFlags {
        workdir: Some(t.root.join("other")),
        ro: vec![t.root.join("work")],
        rw: vec![t.root.join("secret").join("..").join("ro")],
        deny: vec![t.root.join("rw").join("x")],
        memory: Some(1 << 20),
        pids: Some(7),
        ..Default::default()
    };
    let r = map(&t, &p, &flags).unwrap();
    let fs = &r.policy.fs;
    assert_eq!(fs.workdir, t.root.join("other"));
    assert_eq!(fs.read_only, [t.root.join("ro"), t.root.join("work")]);
    assert_eq!(fs.read_write.len(), 2);
    assert!(fs.deny.contains(&t.root.join("rw").join("x")));
    assert_eq!(r.policy.limits.memory_bytes, Some(1 << 20));
    assert_eq!(r.policy.limits.pids, 7);
    assert_eq!(
        r.policy.limits.open_files, 1024,
        "unset flag keeps the default"
    );
    // A flag path still goes through the usual validation.
    let bad = PolicyFlags {
        ro: vec![t.root.join("absent")],
        ..Default::default()
    };
    assert!(matches!(map(&t, &p, &bad), Err(MapError::Policy(_))));
}

fn process(user: &str, group: &str) -> ProcessPolicy {
    ProcessPolicy {
        run_as_user: user.into(),
        run_as_group: group.into(),
    }
}

#[test]
fn identity_from_process_section_flags_and_host() {
    let none = PolicyFlags::default();
    let id = |uid, gid| Ok(Some(Identity { uid, gid }));
    let r = |p: Option<&ProcessPolicy>, f: &PolicyFlags, h: &Host| {
        resolve_identity(p, f, h).map_err(|e| e.to_string())
    };
    // Root: omitted and `sandbox` are the image's sandbox user, else nobody.
    assert_eq!(r(None, &none, &ROOT_HOST), id(65534, 65534));
    let with_sandbox = Host {
        sandbox_user: Some(Identity {
            uid: 1500,
            gid: 1501,
        }),
        ..ROOT_HOST
    };
    assert_eq!(
        r(Some(&process("sandbox", "")), &none, &with_sandbox),
        id(1500, 1501)
    );
    assert_eq!(
        r(Some(&process("1000", "")), &none, &ROOT_HOST),
        id(1000, 1000)
    );
    assert_eq!(
        r(Some(&process("1000", "2000")), &none, &ROOT_HOST),
        id(1000, 2000)
    );
    assert_eq!(
        r(Some(&process("", "2000")), &none, &with_sandbox),
        id(1500, 2000)
    );
    // --uid/--gid (OPENSHELL_SANDBOX_UID/GID) replace both fields.
    let uid = PolicyFlags {
        uid: Some(42),
        ..Default::default()
    };
    assert_eq!(
        r(Some(&process("1000", "2000")), &uid, &ROOT_HOST),
        id(42, 42)
    );
    let gid_only = PolicyFlags {
        gid: Some(42),
        ..Default::default()
    };
    assert!(r(None, &gid_only, &ROOT_HOST).is_err());
    // Not root: our own identity, or an error naming the key.
    assert_eq!(
        r(Some(&process("sandbox", "")), &none, &USER_HOST),
        Ok(None)
    );
    assert_eq!(
        r(Some(&process("1000", "1000")), &none, &USER_HOST),
        Ok(None)
    );
    assert_eq!(
        r(Some(&process("1001", "")), &none, &USER_HOST).unwrap_err(),
        "process.run_as_user: running as 1001 needs root; this supervisor runs as 1000 and cannot switch"
    );
    assert!(
        r(Some(&process("", "7")), &none, &USER_HOST)
            .unwrap_err()
            .starts_with("process.run_as_group:")
    );
    for bad in ["0", "root", "-1", "+5", "4294967295", "99999999999", " 1"] {
        assert!(
            r(Some(&process(bad, "")), &none, &ROOT_HOST)
                .unwrap_err()
                .starts_with("process.run_as_user: `"),
            "{bad}"
        );
    }
    assert_eq!(
        super::map::passwd_lookup("root:x:0:0::/root:/bin/sh\nsandbox:x:7:8::/:\n", "sandbox"),
        Some(Identity { uid: 7, gid: 8 })
    );
}

#[test]
fn default_policy_is_openshells_plus_ours_and_maps_here() {
    let d = default_policy();
    let fs = d.filesystem.as_ref().unwrap();
    assert!(fs.include_workdir);
    assert!(fs.read_write.iter().any(|p| p == "/tmp"));
    for p in OPENSHELL_DEFAULT_READ_ONLY
        .iter()
        .chain(OPENSHELL_DEFAULT_READ_WRITE)
    {
        assert!(
            fs.read_only.contains(&p.to_string()) || fs.read_write.contains(&p.to_string()),
            "{p} of OpenShell's default is missing"
        );
    }
    assert!(d.network_policies.is_empty());
    assert_eq!(d.landlock.as_ref().unwrap().compatibility, "best_effort");
    let t = Tree::new();
    let r = map(&t, &d, &PolicyFlags::default()).unwrap();
    assert_eq!(r.network, NetworkOutcome::Enforced);
    assert!(r.policy.fs.proc_read);
    assert!(r.policy.fs.devices.contains(&PathBuf::from("/dev/null")));
    // `/tmp` of the file is the view's private tmpfs, never a grant of the host's /tmp.
    assert!(!r.policy.fs.read_write.contains(&PathBuf::from("/tmp")));
    // The YAML form of the default reads back as itself.
    assert_eq!(from_yaml(&to_yaml(&d).unwrap()).unwrap(), d);
}

#[test]
fn load_local_takes_the_first_existing_file_else_the_default() {
    let t = Tree::new();
    let (a, b) = (t.root.join("a.yaml"), t.root.join("b.yaml"));
    let paths = [a.as_path(), b.as_path()];
    let (p, src) = load_local(&paths).unwrap();
    assert_eq!(src, LocalSource::Default);
    assert_eq!(p, default_policy());
    std::fs::write(&b, "version: 9\n").unwrap();
    let (p, src) = load_local(&paths).unwrap();
    assert_eq!(src, LocalSource::File(b.clone()));
    assert_eq!(p.version, 9);
    // An unparsable first file is refused, never replaced by the (wider) default.
    std::fs::write(&a, "version: 1\nbogus: 1\n").unwrap();
    let e = load_local(&paths).unwrap_err();
    assert_eq!(e.path, a);
    assert!(e.to_string().contains("unknown field `bogus`"), "{e}");
    assert_eq!(
        LOCAL_POLICY_PATHS,
        ["/etc/openshell/policy.yaml", "/etc/navigator/policy.yaml"]
    );
}

#[test]
fn from_args_without_a_file_is_unchanged() {
    let t = Tree::new();
    let p =
        crate::policy::Policy::from_args(PolicyFlags::default(), &t.root.join("work"), Vec::new())
            .unwrap();
    assert_eq!(p.network, NetworkMode::None);
    assert_eq!(p.limits, crate::policy::Limits::default());
    assert!(!p.fs.system.is_empty());
}

#[test]
fn proxy_baseline_is_added_only_with_a_network_rule_and_only_where_it_exists() {
    let exists = |p: &std::path::Path| p != std::path::Path::new("/app");
    let mut none = fs_policy(&["/opt".into()], &[], "");
    assert!(!enrich_with_baseline(&mut none, &exists));
    assert_eq!(none, fs_policy(&["/opt".into()], &[], ""));

    let mut p = fs_policy(&["/opt".into()], &["/etc".into()], "");
    p.network_policies
        .insert("r".into(), NetworkPolicyRule::default());
    assert!(enrich_with_baseline(&mut p, &exists));
    let fs = p.filesystem.as_ref().unwrap();
    assert_eq!(
        fs.read_only,
        ["/opt", "/usr", "/lib", "/var/log", "/proc", "/dev/urandom"],
        "/etc stays read-write, /app does not exist"
    );
    assert_eq!(fs.read_write, ["/etc", "/tmp"]);
    // A second pass has nothing to add, and the enriched policy is a live-change gain.
    let before = p.clone();
    assert!(!enrich_with_baseline(&mut p, &exists));
    let mut orig = fs_policy(&["/opt".into()], &["/etc".into()], "");
    orig.network_policies = before.network_policies.clone();
    assert_eq!(check_live_change(&orig, &before), Ok(()));
    // A policy without a filesystem section gets one.
    let mut bare = SandboxPolicy {
        version: 1,
        network_policies: before.network_policies,
        ..Default::default()
    };
    assert!(enrich_with_baseline(&mut bare, &exists));
    assert!(
        bare.filesystem
            .unwrap()
            .read_write
            .contains(&"/tmp".to_string())
    );
}
