//! The two decoders (YAML, proto wire walk), their round trips, and the live-change rules.

use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint};

use super::*;

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

pub(super) fn full_model() -> SandboxPolicy {
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
                    path: "/repos/**".into(),
                    rules: Some(vec![L7Rule {
                        allow: L7Match {
                            method: "GET".into(),
                            path: "/**".into(),
                            ..Default::default()
                        },
                    }]),
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
                ..Default::default()
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
    // A second document would be a second policy nobody reads: refused, not ignored.
    assert!(from_yaml("version: 1\n---\nversion: 2\n").is_err());
    assert!(from_yaml("").is_err());
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
    // The middlewares have no value in the model to encode; the L7 rules and the endpoint
    // path do, and come back the same.
    m.network_middlewares = None;
    let deny = L7Match {
        method: "POST".into(),
        path: "/admin/**".into(),
        query: [(
            "tag".to_string(),
            QueryMatcher {
                any: vec!["a-*".into(), "b-*".into()],
                ..Default::default()
            },
        )]
        .into(),
        ..Default::default()
    };
    let e = &mut m.network_policies.get_mut("github").unwrap().endpoints[0];
    e.deny_rules = Some(vec![deny]);
    e.allow_encoded_slash = true;
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
    // Endpoint 12-14, 16, 17, 19-26 (GraphQL and credential extras), L7Allow 5-7 and 9;
    // policy field 6 (middlewares); response field 9.
    let mut ep = ld(1, b"h");
    for n in [12, 16, 26] {
        ep.extend(ld(n, b"\x0a\x01x"));
    }
    ep.extend(varint_field(11, 1));
    let allow = [ld(1, b"GET"), ld(5, b"query"), ld(7, b"f")].concat();
    ep.extend(ld(7, &ld(1, &allow)));
    let policy = [
        ld(5, &[ld(1, b"r"), ld(2, &ld(2, &ep))].concat()),
        ld(6, &[ld(1, b"m"), ld(2, b"")].concat()),
    ]
    .concat();
    let p = decode_policy(&policy).unwrap();
    let e = &p.network_policies["r"].endpoints[0];
    assert_eq!(e.host, "h");
    assert!(e.allow_encoded_slash);
    assert_eq!(e.rules.as_ref().unwrap()[0].allow.method, "GET");
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
fn to_proto_embeds_in_a_response_that_decodes_back() {
    let m = default_policy();
    let resp = pb::GetSandboxConfigResponse {
        policy: Some(m.to_proto()),
        version: 3,
        ..Default::default()
    };
    let r = decode_config_response(&resp.encode_to_vec()).unwrap();
    assert_eq!(r.version, 3);
    assert_eq!(r.failure_mode, FailureMode::FailClosed);
    assert_eq!(r.policy.unwrap(), Some(m));
}
