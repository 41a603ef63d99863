//! Each layer's row, decided from the policy and the probe alone: no kernel object is built.

use std::path::PathBuf;

use super::*;
use crate::policy::Identity;
use crate::sandbox::landlock::Support;
use crate::sandbox::layer::{Enforcement, LayerStatus, PrepareError};
use crate::sandbox::namespaces::{Kind, Outcome, ProcMount, UserNs};
use crate::sandbox::ownership::Ownership;
use crate::sandbox::step::{ChildError, Step};

fn support(abi: i32) -> Support {
    Support {
        abi,
        filesystem: abi > 0,
        network: abi >= 4,
        scopes: abi >= 6,
    }
}

fn only(rows: &[LayerStatus], layer: &str) -> (Enforcement, String) {
    let mut found = rows.iter().filter(|l| l.layer == layer);
    let l = found
        .next()
        .unwrap_or_else(|| panic!("no {layer} row in {rows:?}"));
    assert!(found.next().is_none(), "two {layer} rows in {rows:?}");
    (l.status, l.detail.clone())
}

fn refused<T: std::fmt::Debug>(r: Result<T, PrepareError>) -> (&'static str, String) {
    match r {
        Err(PrepareError::NotEnforceable { layer, reason }) => (layer, reason),
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn landlock_rows_follow_the_abi_and_the_network_rules() {
    let mut rows = Vec::new();
    landlock_rows(
        false,
        &Ok(support(7)),
        17,
        network(NetworkMode::None, false),
        &mut rows,
    )
    .unwrap();
    assert_eq!(
        only(&rows, "landlock-fs"),
        (Enforcement::Enforced, "ABI 7, 17 path rules".into())
    );
    assert_eq!(
        only(&rows, "landlock-net"),
        (Enforcement::Enforced, "TCP bind and connect denied".into())
    );
    assert_eq!(only(&rows, "landlock-scope").0, Enforcement::Enforced);

    // --network none kept by a private namespace: Landlock leaves TCP alone.
    let mut rows = Vec::new();
    landlock_rows(
        false,
        &Ok(support(7)),
        3,
        network(NetworkMode::None, true),
        &mut rows,
    )
    .unwrap();
    let (status, detail) = only(&rows, "landlock-net");
    assert_eq!(status, Enforcement::NotRequested);
    assert!(detail.contains("private network namespace"), "{detail}");

    let mut rows = Vec::new();
    landlock_rows(
        false,
        &Ok(support(7)),
        3,
        network(NetworkMode::All, true),
        &mut rows,
    )
    .unwrap();
    assert_eq!(
        only(&rows, "landlock-net"),
        (Enforcement::NotRequested, "--network all".into())
    );
}

#[test]
fn landlock_rows_refuse_what_the_abi_cannot_do_then_degrade() {
    let net = network(NetworkMode::None, false);
    let (layer, reason) = refused(landlock_rows(
        false,
        &Ok(support(3)),
        1,
        net,
        &mut Vec::new(),
    ));
    assert_eq!(layer, "landlock-net");
    assert_eq!(reason, "Landlock ABI 3 < 4 cannot restrict TCP");
    let (layer, reason) = refused(landlock_rows(
        false,
        &Ok(support(5)),
        1,
        net,
        &mut Vec::new(),
    ));
    assert_eq!(layer, "landlock-scope");
    assert!(reason.contains("ABI 5 < 6"), "{reason}");

    let mut rows = Vec::new();
    landlock_rows(true, &Ok(support(3)), 1, net, &mut rows).unwrap();
    assert_eq!(only(&rows, "landlock-fs").0, Enforcement::Enforced);
    assert_eq!(only(&rows, "landlock-net").0, Enforcement::Degraded);
    assert_eq!(only(&rows, "landlock-scope").0, Enforcement::Degraded);

    // No Landlock at all: one row, no net or scope row.
    let (layer, reason) = refused(landlock_rows(
        false,
        &Err("not compiled in".into()),
        0,
        net,
        &mut Vec::new(),
    ));
    assert_eq!((layer, reason.as_str()), ("landlock-fs", "not compiled in"));
    let mut rows = Vec::new();
    landlock_rows(true, &Ok(support(0)), 0, net, &mut rows).unwrap();
    assert_eq!(
        rows.iter().map(|l| l.layer).collect::<Vec<_>>(),
        ["landlock-fs"]
    );
    assert_eq!(
        only(&rows, "landlock-fs"),
        (Enforcement::Degraded, "Landlock reports ABI 0".into())
    );
}

#[test]
fn the_seccomp_row_counts_the_program_or_refuses() {
    let mut rows = Vec::new();
    seccomp_row(false, Some(42), &mut rows).unwrap();
    assert_eq!(
        only(&rows, "seccomp"),
        (Enforcement::Enforced, "42 BPF instructions".into())
    );
    let (layer, reason) = refused(seccomp_row(false, None, &mut Vec::new()));
    assert_eq!(layer, "seccomp");
    assert_eq!(reason, "the kernel cannot install seccomp filters");
    let mut rows = Vec::new();
    seccomp_row(true, None, &mut rows).unwrap();
    assert_eq!(only(&rows, "seccomp").0, Enforcement::Degraded);
}

#[test]
fn the_identity_row_for_root_and_for_a_supervisor_that_is_not() {
    let id = Identity {
        uid: 1000,
        gid: 1000,
    };
    let probe = |euid, groups: Vec<(libc::gid_t, Option<String>)>| IdentityProbe { euid, groups };
    let mut rows = Vec::new();
    identity_row(false, Some(id), &probe(0, vec![]), &mut rows).unwrap();
    let (status, detail) = only(&rows, "identity");
    assert_eq!(status, Enforcement::Enforced);
    assert!(
        detail.starts_with("uid 1000 gid 1000, no supplementary groups"),
        "{detail}"
    );

    let (layer, reason) = refused(identity_row(
        false,
        None,
        &probe(0, vec![]),
        &mut Vec::new(),
    ));
    assert_eq!(
        (layer, reason.as_str()),
        ("identity", "running as root with no target uid")
    );
    let (_, reason) = refused(identity_row(
        false,
        Some(id),
        &probe(500, vec![]),
        &mut Vec::new(),
    ));
    assert_eq!(reason, "not root (uid 500): cannot switch to uid 1000");

    let mut rows = Vec::new();
    identity_row(false, None, &probe(500, vec![]), &mut rows).unwrap();
    let (status, detail) = only(&rows, "identity");
    assert_eq!(status, Enforcement::Enforced);
    assert!(
        detail.starts_with("not root: child keeps uid 500"),
        "{detail}"
    );

    // Groups a supervisor that is not root cannot drop: degraded, each one named.
    let groups = vec![(999, Some("docker".to_string()))];
    let (_, reason) = refused(identity_row(
        false,
        None,
        &probe(500, groups.clone()),
        &mut Vec::new(),
    ));
    assert!(reason.contains("docker"), "{reason}");
    let mut rows = Vec::new();
    identity_row(true, None, &probe(500, groups), &mut rows).unwrap();
    assert_eq!(only(&rows, "identity").0, Enforcement::Degraded);
}

#[test]
fn the_user_namespace_row_says_whether_a_view_can_be_made() {
    let mut rows = Vec::new();
    assert!(user_ns_row(false, &UserNs::Root, 0, &mut rows).unwrap());
    assert_eq!(only(&rows, "namespace-user").0, Enforcement::NotRequested);
    let mut rows = Vec::new();
    assert!(user_ns_row(false, &UserNs::Entered, 500, &mut rows).unwrap());
    let (status, detail) = only(&rows, "namespace-user");
    assert_eq!(status, Enforcement::Enforced);
    assert!(detail.contains("uid 500 maps to itself"), "{detail}");

    let (layer, _) = refused(user_ns_row(false, &UserNs::NotTried, 500, &mut Vec::new()));
    assert_eq!(layer, "namespace-user");
    let unavailable = UserNs::Unavailable(ChildError::new(Step::UnshareUser, libc::EPERM));
    let mut rows = Vec::new();
    assert!(!user_ns_row(true, &unavailable, 500, &mut rows).unwrap());
    let (status, detail) = only(&rows, "namespace-user");
    assert_eq!(status, Enforcement::Degraded);
    assert!(
        detail.starts_with("not root, and no user namespace is allowed here ("),
        "{detail}"
    );
}

#[test]
fn without_a_view_every_kind_is_refused_but_the_network_all_does_not_ask_for() {
    let (layer, reason) = refused(no_view_rows(false, NetworkMode::None, &mut Vec::new()));
    assert_eq!(layer, "namespace-pid");
    assert_eq!(reason, "needs a user namespace (see namespace-user)");
    let mut rows = Vec::new();
    no_view_rows(true, NetworkMode::All, &mut rows).unwrap();
    for kind in [Kind::Pid, Kind::Mount, Kind::Ipc, Kind::Uts] {
        assert_eq!(only(&rows, kind.layer()).0, Enforcement::Degraded);
    }
    assert_eq!(
        only(&rows, "namespace-net"),
        (Enforcement::NotRequested, "--network all".into())
    );
}

fn facts() -> ViewFacts {
    let mut outcomes = [Outcome::Made; 6];
    outcomes[Kind::User.index()] = Outcome::NotRequested;
    ViewFacts {
        outcomes,
        ipc_limits: None,
        proc: ProcMount::Full,
        tmpfs: vec![(PathBuf::from("/tmp"), 256 << 20)],
        tmpfs_granted: vec!["/dev/shm"],
        root_made: true,
        root: Some(RootFacts {
            binds: 3,
            top_level: vec!["bin".into(), "usr".into()],
            chroot: false,
        }),
        mount_failed_at: None,
        ipc: "IPC LIMITS".into(),
        hostname: "sandbox".into(),
    }
}

#[test]
fn a_view_made_whole_is_one_enforced_row_per_kind() {
    let mut rows = Vec::new();
    view_rows(false, &facts(), &mut rows).unwrap();
    assert_eq!(
        rows.iter().map(|l| l.layer).collect::<Vec<_>>(),
        KINDS.map(|k| k.layer())
    );
    assert!(
        rows.iter().all(|l| l.status == Enforcement::Enforced),
        "{rows:?}"
    );
    assert_eq!(
        only(&rows, "namespace-mount").1,
        "a root of the granted paths only (3 binds; top level bin usr), nothing else exists; private propagation; private tmpfs mode 1777 on /tmp (256 MiB); /dev/shm is itself granted and stays as it is"
    );
    assert_eq!(
        only(&rows, "namespace-ipc").1,
        "private SysV IPC and POSIX message queues; IPC LIMITS"
    );
    assert_eq!(only(&rows, "namespace-uts").1, "hostname sandbox");

    let mut f = facts();
    f.proc = ProcMount::SubsetPid;
    f.outcomes[Kind::Net.index()] = Outcome::NotRequested;
    let mut rows = Vec::new();
    view_rows(false, &f, &mut rows).unwrap();
    assert!(only(&rows, "namespace-pid").1.contains("subset=pid"));
    assert_eq!(only(&rows, "namespace-net").0, Enforcement::NotRequested);
}

#[test]
fn a_kind_the_view_could_not_make_is_refused_then_degraded_with_its_reason() {
    let mut f = facts();
    f.outcomes[Kind::Mount.index()] =
        Outcome::Failed(ChildError::new(Step::BindGrant, libc::EACCES));
    f.root_made = false;
    f.root = None;
    f.mount_failed_at = Some("/usr".into());
    let (layer, reason) = refused(view_rows(false, &f, &mut Vec::new()));
    assert_eq!(layer, "namespace-mount");
    assert!(
        reason.contains(" (at /usr): no root of the granted paths only"),
        "{reason}"
    );

    let mut f = facts();
    f.ipc_limits = Some(ChildError::new(Step::UnshareIpc, libc::EPERM));
    let (layer, reason) = refused(view_rows(false, &f, &mut Vec::new()));
    assert_eq!(layer, "namespace-ipc");
    assert!(reason.contains("its limits could not be set"), "{reason}");
    let mut rows = Vec::new();
    view_rows(true, &f, &mut rows).unwrap();
    assert_eq!(only(&rows, "namespace-ipc").0, Enforcement::Degraded);

    let mut f = facts();
    f.outcomes[Kind::Uts.index()] = Outcome::NotRequested;
    let (layer, reason) = refused(view_rows(false, &f, &mut Vec::new()));
    assert_eq!((layer, reason.as_str()), ("namespace-uts", "not attempted"));
}

#[test]
fn the_ownership_row_of_a_supervisor_that_keeps_its_uid() {
    let row = ownership_row(&Ownership::default());
    assert_eq!(row.layer, "ownership");
    assert_eq!(row.status, Enforcement::NotRequested);
    assert!(
        row.detail
            .starts_with("the command keeps the supervisor's uid"),
        "{}",
        row.detail
    );
    let sb = Ownership {
        sandbox: Some(Identity { uid: 7, gid: 8 }),
        ..Ownership::default()
    };
    assert_eq!(
        ownership_row(&sb).detail,
        "the grants are written as the sandbox identity 7:8, as their modes allow"
    );
}
