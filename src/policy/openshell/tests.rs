use std::path::PathBuf;

use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint};

use super::*;
use crate::policy::{Identity, NetworkMode, PolicyFlags};
use crate::proto::sandbox::v1 as pb;

const FULL: &str = r#"
version: 1
filesystem_policy:
  include_workdir: true
  read_only: [/usr, /etc]
  read_write: [/tmp]
landlock:
  compatibility: hard_requirement
process:
  run_as_user: sandbox
  run_as_group: "1000"
network_policies:
  github:
    name: github
    endpoints:
      - host: api.github.com
        port: 443
        protocol: rest
        tls: skip
        enforcement: enforce
        access: read-only
        allowed_ips: [10.0.0.0/8]
        path: /repos/**
        rules:
          - allow: { method: GET, path: "/**" }
      - host: "*.example.com"
        ports: [80, 8080]
    binaries:
      - path: /usr/bin/curl
network_middlewares:
  m1: { middleware: x }
"#;

fn full_model() -> SandboxPolicy {
    let mut p = SandboxPolicy {
        version: 1,
        filesystem: Some(FilesystemPolicy {
            include_workdir: true,
            read_only: vec!["/usr".into(), "/etc".into()],
            read_write: vec!["/tmp".into()],
        }),
        landlock: Some(LandlockPolicy {
            compatibility: "hard_requirement".into(),
        }),
        process: Some(ProcessPolicy {
            run_as_user: "sandbox".into(),
            run_as_group: "1000".into(),
        }),
        network_middlewares: Some(Opaque),
        ..Default::default()
    };
    p.network_policies.insert(
        "github".into(),
        NetworkPolicyRule {
            name: "github".into(),
            endpoints: vec![
                NetworkEndpoint {
                    host: "api.github.com".into(),
                    port: 443,
                    protocol: "rest".into(),
                    tls: "skip".into(),
                    enforcement: "enforce".into(),
                    access: "read-only".into(),
                    allowed_ips: vec!["10.0.0.0/8".into()],
                    path: Some(Opaque),
                    rules: Some(Opaque),
                    ..Default::default()
                },
                NetworkEndpoint {
                    host: "*.example.com".into(),
                    ports: vec![80, 8080],
                    ..Default::default()
                },
            ],
            binaries: vec![NetworkBinary {
                path: "/usr/bin/curl".into(),
            }],
        },
    );
    p
}

// ---- YAML ----------------------------------------------------------------------------------

#[test]
fn yaml_every_key_parses_into_the_model() {
    assert_eq!(from_yaml(FULL).unwrap(), full_model());
}

#[test]
fn yaml_omitted_sections_are_not_set() {
    let p = from_yaml("version: 3\n").unwrap();
    assert_eq!(
        p,
        SandboxPolicy {
            version: 3,
            ..Default::default()
        }
    );
    let p = from_yaml("version: 1\nfilesystem_policy: {}\n").unwrap();
    assert_eq!(p.filesystem, Some(FilesystemPolicy::default()));
}

#[test]
fn yaml_unknown_keys_are_errors_naming_the_key_at_every_level() {
    let cases = [
        ("version: 1\nfilesystem: {}\n", "filesystem"),
        (
            "version: 1\nfilesystem_policy:\n  read_onyl: [/usr]\n",
            "read_onyl",
        ),
        ("version: 1\nlandlock:\n  mode: x\n", "mode"),
        ("version: 1\nprocess:\n  run_as: sandbox\n", "run_as"),
        (
            "version: 1\nnetwork_policies:\n  r:\n    hosts: []\n",
            "hosts",
        ),
        (
            "version: 1\nnetwork_policies:\n  r:\n    endpoints:\n      - hostname: a\n",
            "hostname",
        ),
        (
            "version: 1\nnetwork_policies:\n  r:\n    binaries:\n      - path: /x\n        sha: y\n",
            "sha",
        ),
    ];
    for (text, key) in cases {
        let e = from_yaml(text).unwrap_err().to_string();
        assert!(
            e.contains(&format!("unknown field `{key}`")),
            "{text:?} gave {e}"
        );
    }
}

#[test]
fn yaml_refuses_missing_version_duplicates_loose_booleans_and_port_with_ports() {
    let e = from_yaml("filesystem_policy: {}\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("version"), "{e}");
    let e = from_yaml("version: 1\nversion: 2\n")
        .unwrap_err()
        .to_string();
    assert!(e.to_lowercase().contains("duplicate"), "{e}");
    assert!(from_yaml("version: 1\nfilesystem_policy:\n  include_workdir: yes\n").is_err());
    let e = from_yaml(
        "version: 1\nnetwork_policies:\n  r:\n    endpoints:\n      - host: a\n        port: 1\n        ports: [2]\n",
    )
    .unwrap_err();
    assert!(
        matches!(&e, YamlError::PortAndPorts { key } if key == "network_policies.r.endpoints[0]"),
        "{e}"
    );
    assert!(
        from_yaml("version: 1\nnetwork_policies:\n  r:\n    endpoints:\n      - port: 70000\n")
            .is_err()
    );
}

// ---- proto ---------------------------------------------------------------------------------

/// One length-delimited field.
fn ld(number: u32, payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    encode_key(number, WireType::LengthDelimited, &mut b);
    encode_varint(payload.len() as u64, &mut b);
    b.extend_from_slice(payload);
    b
}

fn varint_field(number: u32, v: u64) -> Vec<u8> {
    let mut b = Vec::new();
    encode_key(number, WireType::Varint, &mut b);
    encode_varint(v, &mut b);
    b
}

fn response(policy: Option<&[u8]>, extra: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    if let Some(p) = policy {
        b.extend(ld(1, p));
    }
    b.extend(varint_field(2, 7));
    b.extend(ld(11, b"retain_last_valid"));
    b.extend_from_slice(extra);
    b
}

#[test]
fn proto_round_trips_the_model() {
    let mut m = full_model();
    // Neither the opaque keys nor the middlewares have a value in the model to encode.
    m.network_middlewares = None;
    for e in &mut m.network_policies.get_mut("github").unwrap().endpoints {
        e.path = None;
        e.rules = None;
    }
    assert_eq!(decode_policy(&encode_policy(&m)).unwrap(), m);
}

#[test]
fn proto_unknown_field_numbers_are_named_at_every_level() {
    let base = encode_policy(&full_model());
    // Append an unknown field inside each sub-message by re-encoding that level by hand.
    let fs = pb::FilesystemPolicy {
        include_workdir: true,
        ..Default::default()
    }
    .encode_to_vec();
    let mut fs_bad = fs.clone();
    fs_bad.extend(varint_field(9, 1));
    let cases: Vec<(Vec<u8>, &str, &str, u32)> = vec![
        (
            [base.clone(), varint_field(7, 1)].concat(),
            "",
            "SandboxPolicy",
            7,
        ),
        (ld(2, &fs_bad), "filesystem", "FilesystemPolicy", 9),
        (
            ld(3, &[ld(1, b"best_effort"), ld(2, b"x")].concat()),
            "landlock",
            "LandlockPolicy",
            2,
        ),
        (ld(4, &varint_field(3, 0)), "process", "ProcessPolicy", 3),
        (
            ld(
                5,
                &[ld(1, b"r"), ld(2, &ld(2, &varint_field(27, 1)))].concat(),
            ),
            "network_policies.value.endpoints",
            "NetworkEndpoint",
            27,
        ),
        (
            ld(
                5,
                &[ld(1, b"r"), ld(2, &ld(3, &varint_field(3, 1)))].concat(),
            ),
            "network_policies.value.binaries",
            "NetworkBinary",
            3,
        ),
        (
            ld(5, &[ld(1, b"r"), ld(2, &varint_field(4, 1))].concat()),
            "network_policies.value",
            "NetworkPolicyRule",
            4,
        ),
    ];
    for (bytes, path, message, number) in cases {
        match decode_policy(&bytes) {
            Err(ProtoError::UnknownFields(u)) => {
                assert_eq!(
                    u,
                    vec![UnknownField {
                        path: path.into(),
                        message,
                        number
                    }]
                );
                let text = ProtoError::UnknownFields(u).to_string();
                assert!(text.contains(&format!("unknown field {number} in {message}")));
            }
            other => panic!("{message}.{number}: {other:?}"),
        }
        // The same inside a GetSandboxConfigResponse: the envelope still decodes, the policy
        // carries the error, with the path from the response.
        let r = decode_config_response(&response(Some(&bytes), &[])).unwrap();
        assert_eq!(r.version, 7);
        match r.policy {
            Err(ProtoError::UnknownFields(u)) => {
                let want = if path.is_empty() {
                    "policy".to_string()
                } else {
                    format!("policy.{path}")
                };
                assert_eq!(u[0].path, want);
                assert_eq!(u[0].number, number);
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn proto_every_unknown_field_is_reported_with_its_wire_type_skipped() {
    let mut b = Vec::new();
    b.extend(varint_field(100, 5));
    encode_key(101, WireType::ThirtyTwoBit, &mut b);
    b.extend([0; 4]);
    encode_key(102, WireType::SixtyFourBit, &mut b);
    b.extend([0; 8]);
    b.extend(ld(103, b"abc"));
    encode_key(104, WireType::StartGroup, &mut b);
    b.extend(varint_field(1, 1));
    encode_key(104, WireType::EndGroup, &mut b);
    b.extend(varint_field(1, 2));
    let Err(ProtoError::UnknownFields(u)) = decode_policy(&b) else {
        panic!()
    };
    assert_eq!(
        u.iter().map(|f| f.number).collect::<Vec<_>>(),
        [100, 101, 102, 103, 104]
    );
}

#[test]
fn proto_known_but_opaque_fields_are_accepted() {
    // Endpoint 7 (L7 rules), 10, 11-26; policy field 6 (middlewares); response field 9.
    let mut ep = ld(1, b"h");
    for n in [7, 10, 15, 26] {
        ep.extend(ld(n, b"\x0a\x01x"));
    }
    ep.extend(varint_field(11, 1));
    let policy = [
        ld(5, &[ld(1, b"r"), ld(2, &ld(2, &ep))].concat()),
        ld(6, &[ld(1, b"m"), ld(2, b"")].concat()),
    ]
    .concat();
    let p = decode_policy(&policy).unwrap();
    assert_eq!(p.network_policies["r"].endpoints[0].host, "h");
    assert_eq!(p.network_middlewares, Some(Opaque));
    let r = decode_config_response(&response(Some(&policy), &ld(9, b"\x0a\x01s"))).unwrap();
    assert!(r.policy.unwrap().is_some());
}

#[test]
fn proto_envelope_fields_absent_policy_and_failure_mode() {
    let r = decode_config_response(&response(None, &[])).unwrap();
    assert!(matches!(r.policy, Ok(None)));
    assert_eq!(r.version, 7);
    assert_eq!(r.failure_mode, FailureMode::RetainLastValid);
    assert_eq!(FailureMode::from_wire(""), FailureMode::FailClosed);
    assert_eq!(FailureMode::from_wire("bogus"), FailureMode::FailClosed);
    // An unknown envelope field fails the policy (fail closed), not the version.
    let r = decode_config_response(&response(None, &varint_field(13, 1))).unwrap();
    assert_eq!(r.version, 7);
    let Err(ProtoError::UnknownFields(u)) = r.policy else {
        panic!()
    };
    assert_eq!(u[0].number, 13);
    assert_eq!(u[0].message, "GetSandboxConfigResponse");
    // Settings are walked too.
    let setting = ld(
        4,
        &[ld(1, b"k"), ld(2, &ld(1, &varint_field(5, 1)))].concat(),
    );
    let r = decode_config_response(&response(None, &setting)).unwrap();
    let Err(ProtoError::UnknownFields(u)) = r.policy else {
        panic!()
    };
    assert_eq!((u[0].message, u[0].number), ("SettingValue", 5));
}

#[test]
fn proto_repeated_policy_fields_merge_like_prost() {
    let a = ld(2, &ld(2, b"/usr"));
    let b = ld(3, &ld(1, b"best_effort"));
    let r = decode_config_response(&response(Some(&a), &ld(1, &b))).unwrap();
    let p = r.policy.unwrap().unwrap();
    assert_eq!(p.filesystem.unwrap().read_only, ["/usr"]);
    assert_eq!(p.landlock.unwrap().compatibility, "best_effort");
}

#[test]
fn proto_damage_and_out_of_range_values_are_errors() {
    assert!(matches!(
        decode_policy(&[0x0a, 0x05, 0x01]),
        Err(ProtoError::Malformed { .. })
    ));
    assert!(matches!(
        decode_policy(&[0x00, 0x01]),
        Err(ProtoError::Malformed { .. })
    ));
    assert!(matches!(
        decode_policy(&[0x80; 11]),
        Err(ProtoError::Malformed { .. })
    ));
    // filesystem sent as a varint.
    assert!(matches!(
        decode_policy(&varint_field(2, 1)),
        Err(ProtoError::WireType { number: 2, .. })
    ));
    let port = ld(
        5,
        &[ld(1, b"r"), ld(2, &ld(2, &varint_field(2, 70000)))].concat(),
    );
    assert!(matches!(
        decode_policy(&port),
        Err(ProtoError::Port { value: 70000, .. })
    ));
    // Invalid UTF-8 in a string: prost's own check.
    assert!(matches!(
        decode_policy(&ld(2, &ld(2, b"\xff"))),
        Err(ProtoError::Decode(_))
    ));
}

#[test]
fn yaml_and_proto_agree_on_the_same_policy() {
    let text = "version: 2\nfilesystem_policy:\n  include_workdir: true\n  read_only: [/usr]\n  read_write: [/tmp, /dev/null]\nlandlock:\n  compatibility: best_effort\nprocess:\n  run_as_user: \"1000\"\nnetwork_policies:\n  pypi:\n    endpoints:\n      - host: pypi.org\n        ports: [443]\n    binaries:\n      - path: /usr/bin/pip\n";
    let from_file = from_yaml(text).unwrap();
    let from_wire = decode_policy(&encode_policy(&from_file)).unwrap();
    assert_eq!(from_wire, from_file);
    assert_eq!(from_yaml(&to_yaml(&from_wire).unwrap()).unwrap(), from_file);
    // A lone `port` on the wire is kept; with `ports` beside it, `ports` wins.
    let both = ld(
        5,
        &[
            ld(1, b"r"),
            ld(
                2,
                &ld(2, &[varint_field(2, 1), varint_field(9, 2)].concat()),
            ),
        ]
        .concat(),
    );
    let ep = &decode_policy(&both).unwrap().network_policies["r"].endpoints[0];
    assert_eq!((ep.port, ep.ports.as_slice()), (0, &[2u16][..]));
}

// ---- mapping -------------------------------------------------------------------------------

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
    assert!(r.policy.fs.read_write.contains(&PathBuf::from("/tmp")));
    // The YAML form of the default reads back as itself.
    assert_eq!(from_yaml(&to_yaml(&d).unwrap()).unwrap(), d);
}

#[test]
fn load_local_takes_the_first_existing_file_else_the_default() {
    let t = Tree::new();
    let (a, b) = (t.root.join("a.yaml"), t.root.join("b.yaml"));
    let paths = [a.as_path(), b.as_path()];
    let (p, src) = load_local(&paths);
    assert!(matches!(src, LocalSource::Default));
    assert_eq!(p, default_policy());
    std::fs::write(&b, "version: 9\n").unwrap();
    let (p, src) = load_local(&paths);
    assert!(matches!(src, LocalSource::File(ref f) if f == &b));
    assert_eq!(p.version, 9);
    std::fs::write(&a, "version: 1\nbogus: 1\n").unwrap();
    let (p, src) = load_local(&paths);
    assert!(matches!(src, LocalSource::Unparsable { ref path, .. } if path == &a));
    assert_eq!(p, default_policy());
    assert_eq!(
        LOCAL_POLICY_PATHS,
        ["/etc/openshell/policy.yaml", "/etc/navigator/policy.yaml"]
    );
}

// ---- live change ---------------------------------------------------------------------------

#[test]
fn live_change_rules_of_11_7() {
    let old = from_yaml(FULL).unwrap();
    let ok = |f: &dyn Fn(&mut SandboxPolicy)| {
        let mut n = old.clone();
        f(&mut n);
        check_live_change(&old, &n)
    };
    assert_eq!(ok(&|_| {}), Ok(()));
    // The network side and the version are free.
    assert_eq!(
        ok(&|n| {
            n.network_policies.clear();
            n.version = 99;
        }),
        Ok(())
    );
    // Filesystem may gain paths.
    assert_eq!(
        ok(&|n| n.filesystem.as_mut().unwrap().read_only.push("/opt".into())),
        Ok(())
    );
    assert!(matches!(
        ok(&|n| {
            n.filesystem.as_mut().unwrap().read_only.remove(0);
        }),
        Err(LiveChangeError::PathRemoved {
            list: "read_only",
            ..
        })
    ));
    // Moving /tmp to read_only changes its access.
    assert!(matches!(
        ok(&|n| {
            let f = n.filesystem.as_mut().unwrap();
            f.read_write.clear();
            f.read_only.push("/tmp".into());
        }),
        Err(LiveChangeError::PathRemoved {
            list: "read_write",
            ..
        })
    ));
    assert_eq!(
        ok(&|n| n.filesystem.as_mut().unwrap().include_workdir = false),
        Err(LiveChangeError::WorkdirRemoved)
    );
    assert!(matches!(
        ok(&|n| n.filesystem = None),
        Err(LiveChangeError::WorkdirRemoved)
    ));
    assert!(matches!(
        ok(&|n| n.landlock.as_mut().unwrap().compatibility = "best_effort".into()),
        Err(LiveChangeError::Landlock { .. })
    ));
    assert!(matches!(
        ok(&|n| n.process = None),
        Err(LiveChangeError::Process { .. })
    ));
    // An absent section equals an empty one.
    let a = SandboxPolicy::default();
    let b = SandboxPolicy {
        landlock: Some(LandlockPolicy::default()),
        process: Some(ProcessPolicy::default()),
        filesystem: Some(FilesystemPolicy::default()),
        ..Default::default()
    };
    assert_eq!(check_live_change(&a, &b), Ok(()));
    assert_eq!(check_live_change(&b, &a), Ok(()));
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
