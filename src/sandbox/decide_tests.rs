//! The fail-closed matrix of the limits layers and the network rules, without root: every
//! combination of what the policy asks and what the cgroup system offers.

use super::*;
use crate::policy::Limits;
use crate::sandbox::layer::{Enforcement, LayerStatus, PrepareError};
use crate::sandbox::{cgroup, rlimits};

fn v2() -> CgroupFacts {
    CgroupFacts {
        describe: "cgroup v2 at /sys/fs/cgroup/x".into(),
        no_memory: None,
        cpu: cgroup::CpuSupport {
            accounting: true,
            quota: true,
        },
    }
}

fn probe(cgroups: Option<CgroupFacts>) -> LimitsProbe {
    LimitsProbe {
        cgroups,
        remount_note: None,
        core_gap: None,
        target_is_root: false,
    }
}

fn asked() -> Limits {
    Limits {
        cpu_secs: Some(5),
        cpu_quota_millis: Some(500),
        memory_bytes: Some(64 << 20),
        pids_requested: true,
        ..Limits::default()
    }
}

fn status(rows: &[LayerStatus], layer: &str) -> Enforcement {
    rows.iter()
        .find(|l| l.layer == layer)
        .unwrap_or_else(|| panic!("no {layer} row in {rows:?}"))
        .status
}

fn refused_layer(
    r: Result<(Vec<LayerStatus>, Vec<rlimits::Rlimit>), PrepareError>,
) -> &'static str {
    match r {
        Err(PrepareError::NotEnforceable { layer, .. }) => layer,
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn with_cgroups_every_limit_is_enforced_and_no_shared_rlimit_is_set() {
    let (rows, rl) = limits(&asked(), false, &probe(Some(v2()))).unwrap();
    for l in ["cgroup", "memory", "cpu", "rlimits"] {
        assert_eq!(status(&rows, l), Enforcement::Enforced, "{l}: {rows:?}");
    }
    assert!(
        rl.iter().all(|l| l.resource != libc::RLIMIT_NPROC),
        "{rl:?}"
    );
    assert!(rl.iter().all(|l| l.resource != libc::RLIMIT_CPU), "{rl:?}");
}

#[test]
fn without_cgroups_each_asked_limit_is_refused_in_order() {
    let none = probe(None);
    assert_eq!(refused_layer(limits(&asked(), false, &none)), "cgroup");
    let l = Limits {
        pids_requested: false,
        ..asked()
    };
    assert_eq!(refused_layer(limits(&l, false, &none)), "memory");
    let l = Limits {
        memory_bytes: None,
        ..l
    };
    assert_eq!(refused_layer(limits(&l, false, &none)), "cpu");
    let l = Limits {
        cpu_secs: None,
        ..l
    };
    assert_eq!(refused_layer(limits(&l, false, &none)), "cpu");
    // Nothing asked: nothing to refuse, and RLIMIT_NPROC bounds processes.
    let (rows, rl) = limits(&Limits::default(), false, &none).unwrap();
    assert_eq!(status(&rows, "cgroup"), Enforcement::NotRequested);
    assert_eq!(status(&rows, "memory"), Enforcement::NotRequested);
    assert_eq!(status(&rows, "cpu"), Enforcement::NotRequested);
    assert!(
        rl.iter().any(|l| l.resource == libc::RLIMIT_NPROC),
        "{rl:?}"
    );
}

#[test]
fn without_cgroups_a_degraded_run_says_so_per_layer_and_falls_back_to_rlimits() {
    let (rows, rl) = limits(&asked(), true, &probe(None)).unwrap();
    for l in ["cgroup", "memory", "cpu"] {
        assert_eq!(status(&rows, l), Enforcement::Degraded, "{l}: {rows:?}");
    }
    // --cpu falls back to a per-process RLIMIT_CPU.
    assert!(rl.iter().any(|l| l.resource == libc::RLIMIT_CPU), "{rl:?}");
    assert!(
        rl.iter().any(|l| l.resource == libc::RLIMIT_NPROC),
        "{rl:?}"
    );
}

#[test]
fn a_root_target_without_cgroups_is_refused_even_with_no_limit_asked() {
    let p = LimitsProbe {
        target_is_root: true,
        ..probe(None)
    };
    assert_eq!(
        refused_layer(limits(&Limits::default(), false, &p)),
        "cgroup"
    );
    // With a cgroup, pids.max holds uid 0 too.
    let p = LimitsProbe {
        target_is_root: true,
        ..probe(Some(v2()))
    };
    assert!(limits(&Limits::default(), false, &p).is_ok());
}

#[test]
fn cgroups_without_memory_or_cpu_controllers_refuse_those_limits_only() {
    let v1 = CgroupFacts {
        describe: "cgroup v1".into(),
        no_memory: Some("no writable memory hierarchy".into()),
        cpu: cgroup::CpuSupport::default(),
    };
    let p = probe(Some(v1));
    let l = Limits {
        cpu_secs: None,
        cpu_quota_millis: None,
        ..asked()
    };
    match limits(&l, false, &p) {
        Err(PrepareError::NotEnforceable { layer, reason }) => {
            assert_eq!(layer, "memory");
            assert!(
                reason.starts_with("no writable memory hierarchy"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    let l = Limits {
        memory_bytes: None,
        ..asked()
    };
    assert_eq!(refused_layer(limits(&l, false, &p)), "cpu");
    let (rows, _) = limits(&Limits::default(), false, &p).unwrap();
    assert_eq!(status(&rows, "cgroup"), Enforcement::Enforced);
}

#[test]
fn a_core_dump_gap_degrades_the_rlimits_layer() {
    let p = LimitsProbe {
        core_gap: Some("core_pattern pipes to a handler".into()),
        ..probe(Some(v2()))
    };
    assert_eq!(
        refused_layer(limits(&Limits::default(), false, &p)),
        "rlimits"
    );
}

#[test]
fn the_remount_note_goes_into_the_cgroup_row() {
    let p = LimitsProbe {
        remount_note: Some("read-only cgroup mounts used through a copy".into()),
        ..probe(Some(v2()))
    };
    let (rows, _) = limits(&Limits::default(), false, &p).unwrap();
    let row = rows.iter().find(|l| l.layer == "cgroup").unwrap();
    assert!(
        row.detail
            .ends_with("(read-only cgroup mounts used through a copy)"),
        "{row:?}"
    );
}

#[test]
fn network_none_in_a_private_namespace_gets_the_loopback_socket_rules() {
    assert_eq!(
        network(NetworkMode::None, true),
        Network {
            socket_rules: NetworkMode::All,
            loopback_only: true
        }
    );
    assert_eq!(
        network(NetworkMode::None, false).socket_rules,
        NetworkMode::None
    );
    assert_eq!(
        network(NetworkMode::All, true).socket_rules,
        NetworkMode::All
    );
    assert!(!network(NetworkMode::All, true).loopback_only);
}

#[test]
fn the_installed_rules_follow_the_ruleset_and_the_filter() {
    let fs = vec![(PathBuf::from("/usr"), PathAccess::ReadExec, true)];
    let i = installed(&fs, Some((true, true)), NetworkMode::None, true);
    let paths: Vec<&str> = i
        .landlock
        .iter()
        .map(|r| r.path.to_str().unwrap())
        .collect();
    assert_eq!(paths, ["/usr", "(network)", "(scope)"]);
    assert_eq!(i.seccomp, seccomp::describe(NetworkMode::None));
    // No ruleset, no filter: nothing listed.
    let i = installed(&fs, None, NetworkMode::All, false);
    assert_eq!(i, Installed::default());
    let i = installed(&fs, Some((false, false)), NetworkMode::All, true);
    assert_eq!(i.landlock.len(), 1);
    assert_eq!(i.seccomp, seccomp::describe(NetworkMode::All));
}
