//! A hostile gateway against the policy plane of a live sandbox: the
//! gateway promises to refuse changes to `process`, `landlock` and removed paths once a
//! sandbox runs, and the supervisor must not rely on that promise, whichever policy the
//! sandbox started with.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use openshell_sandbox::policy::openshell::{ProcessPolicy, to_yaml};
use openshell_sandbox::proto::v1::PolicyStatus;
use support::plane::{base_policy, wait_report};
use support::*;

/// The sandbox starts on its local policy file because the gateway has none, and the sync
/// back (UpdateConfig) fails: a gateway may refuse it (here: the name is not the one it
/// knows), or `OPENSHELL_SANDBOX` may be unset. The gateway's first revision then has no
/// revision of its own to be compared with, so even an honest gateway lets it through; the
/// running sandbox still has a policy, the local one. A revision that switches the identity
/// (to uid 1000, the owner of a mode-0600 file in a granted directory) must be refused against
/// that policy, as any other change of `process`, and never reach an exec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_revision_after_the_local_policy_cannot_switch_the_identity() {
    if !require(
        is_root(),
        "root: the identity switch and Landlock are what the policy says only as root",
    ) {
        return;
    }
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let granted = gw.dir.path().join("granted");
    std::fs::create_dir(&granted).unwrap();
    std::fs::set_permissions(&granted, std::fs::Permissions::from_mode(0o755)).unwrap();
    let private = granted.join("private.txt");
    std::fs::write(&private, "uid 1000 only\n").unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&private, Some(1000), Some(1000)).unwrap();
    let file = gw.dir.path().join("policy.yaml");
    std::fs::write(&file, to_yaml(&base_policy(&[&granted])).unwrap()).unwrap();
    let opts = SupOpts {
        env: vec![
            ("OPENSHELL_SANDBOX".into(), "not-the-gateways-name".into()),
            ("OPENSHELL_POLICY_POLL_INTERVAL_SECS".into(), "1".into()),
            ("OPENSHELL_LOCAL_POLICY_PATH".into(), path_str(&file)),
        ],
        ..Default::default()
    };
    let mut sup = Supervisor::start(&gw, opts);
    gw.wait_ready(&mut sup).await;
    sup.wait_log("UpdateConfig (syncing", Duration::from_secs(20))
        .await;
    let probe = format!("id -u; cat {}", path_str(&private));
    let r = gw.sh(&probe).await;
    assert_eq!(r.out(), "65534\n", "{r:?}\n{}", sup.log());
    assert_eq!(r.exit, Some(1), "{r:?}");
    assert!(r.err().contains("Permission denied"), "{r:?}");

    let mut other = base_policy(&[&granted]);
    other.process = Some(ProcessPolicy {
        run_as_user: "1000".into(),
        run_as_group: "1000".into(),
    });
    // The test gateway has no revision yet, so it accepts this one, as OpenShell's would.
    let v = gw.state.set_policy(&other).unwrap();
    let rep = wait_report(&gw, v, &sup).await;
    assert_eq!(
        rep.status,
        PolicyStatus::Failed as i32,
        "{rep:?}\n{}",
        sup.log()
    );
    assert!(
        rep.load_error.contains("refused on a live sandbox"),
        "{rep:?}"
    );
    // fail_closed (the default): the sandbox is quarantined, nothing runs under another uid.
    let r = gw.sh(&probe).await;
    assert_eq!(r.out(), "", "{r:?}");
    assert_eq!(r.exit, Some(125), "{r:?}");
    assert!(r.err().contains("quarantined"), "{r:?}");
}

/// The usual start (the gateway's own revision, so a baseline of the gateway's), then a
/// gateway that skips its own check: the revision appears as if `policy set` had
/// accepted it. A changed identity and a path taken away are refused by the supervisor
/// itself, FAILED, and the sandbox is quarantined rather than widened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revision_the_gateway_did_not_check_is_refused_by_the_supervisor() {
    if !require(
        is_root(),
        "root: the identity switch and Landlock are what the policy says only as root",
    ) {
        return;
    }
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let granted = gw.dir.path().join("granted");
    std::fs::create_dir(&granted).unwrap();
    std::fs::set_permissions(&granted, std::fs::Permissions::from_mode(0o755)).unwrap();
    let v1 = gw.state.set_policy(&base_policy(&[&granted])).unwrap();
    let opts = SupOpts {
        env: vec![("OPENSHELL_POLICY_POLL_INTERVAL_SECS".into(), "1".into())],
        ..Default::default()
    };
    let mut sup = Supervisor::start(&gw, opts);
    gw.wait_ready(&mut sup).await;
    let rep = wait_report(&gw, v1, &sup).await;
    assert_eq!(rep.status, PolicyStatus::Loaded as i32, "{rep:?}");
    let r = gw.sh("id -u").await;
    assert_eq!(r.out(), "65534\n", "{r:?}");

    let mut hostile = base_policy(&[&granted]);
    hostile.process = Some(ProcessPolicy {
        run_as_user: "1000".into(),
        run_as_group: "1000".into(),
    });
    // Not through set_policy, which refuses it as a real gateway would.
    let v2 = {
        let mut p = gw.state.plane.lock().unwrap();
        let version = v1 + 1;
        p.revisions.push(support::plane::Revision {
            version,
            policy: hostile,
            extra: Vec::new(),
            hash: format!("hostile-{version}"),
        });
        version
    };
    let rep = wait_report(&gw, v2, &sup).await;
    assert_eq!(rep.status, PolicyStatus::Failed as i32, "{rep:?}");
    assert!(
        rep.load_error.contains("refused on a live sandbox") && rep.load_error.contains("process"),
        "{rep:?}"
    );
    let r = gw.sh("id -u").await;
    assert_eq!((r.out().as_str(), r.exit), ("", Some(125)), "{r:?}");
    assert!(r.err().contains("quarantined"), "{r:?}");
}
