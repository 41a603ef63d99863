//! Fuzzing the two decoders of OpenShell's sandbox policy (`policy::openshell`):
//!
//! - any bytes: neither `from_yaml`, `decode_policy` nor `decode_config_response` panics, and
//!   the proto decoders never accept what prost itself refuses;
//! - generated policies: YAML and proto both round-trip them exactly;
//! - unknown-key detection is exact: an unknown YAML key at any struct level is refused naming
//!   that key, and unknown proto field numbers injected at any message level are reported
//!   exactly, with number, message and path, and nothing else.
//!
//! Bounded by case count, or by `OSB_FUZZ_SECONDS` (see tests/fuzz_support). Seeds:
//! fuzz/corpus/openshell_yaml (`ok-*` must parse, `bad-*` must not), fuzz/corpus/openshell_proto
//! (`ok-*` must decode, `unknown-*` must report unknown fields).

mod support;

use std::collections::BTreeMap;

use openshell_sandbox::policy::openshell::{
    FilesystemPolicy, LandlockPolicy, NetworkBinary, NetworkEndpoint, NetworkPolicyRule,
    ProcessPolicy, ProtoError, SandboxPolicy, UnknownField, decode_config_response, decode_policy,
    encode_policy, from_yaml, to_yaml,
};
use openshell_sandbox::proto::sandbox::v1 as pb;
use proptest::prelude::*;
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint};

// ---- generated policies --------------------------------------------------------------------

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z/_.*-]{0,12}",
        1 => "\\PC{0,10}",
        1 => prop::sample::select(vec![
            "", "~", "null", "true", "1", "0x10", "- a", "a: b", "'", "\"", "#x", " x ", "*a", "&a",
        ])
        .prop_map(String::from),
    ]
}

fn endpoint() -> impl Strategy<Value = NetworkEndpoint> {
    (
        text(),
        prop_oneof![Just(None), any::<u16>().prop_map(Some)],
        prop::collection::vec(any::<u16>(), 0..3),
        text(),
        text(),
        prop::collection::vec(text(), 0..2),
    )
        .prop_map(|(host, port, ports, protocol, tls, allowed_ips)| {
            // `port` and `ports` are exclusive in the model (YAML refuses both).
            let (port, ports) = match port {
                Some(p) if ports.is_empty() => (p, ports),
                _ => (0, ports),
            };
            NetworkEndpoint {
                host,
                port,
                ports,
                protocol,
                tls,
                allowed_ips,
                ..Default::default()
            }
        })
}

fn rule() -> impl Strategy<Value = NetworkPolicyRule> {
    (
        text(),
        prop::collection::vec(endpoint(), 0..3),
        prop::collection::vec(text(), 0..2),
    )
        .prop_map(|(name, endpoints, bins)| NetworkPolicyRule {
            name,
            endpoints,
            binaries: bins
                .into_iter()
                .map(|path| NetworkBinary {
                    path,
                    ..Default::default()
                })
                .collect(),
        })
}

fn model() -> impl Strategy<Value = SandboxPolicy> {
    (
        any::<u32>(),
        prop::option::of((
            any::<bool>(),
            prop::collection::vec(text(), 0..4),
            prop::collection::vec(text(), 0..4),
        )),
        prop::option::of(text()),
        prop::option::of((text(), text())),
        prop::collection::btree_map(text(), rule(), 0..3),
    )
        .prop_map(
            |(version, fs, landlock, process, network_policies)| SandboxPolicy {
                version,
                filesystem: fs.map(
                    |(include_workdir, read_only, read_write)| FilesystemPolicy {
                        include_workdir,
                        read_only,
                        read_write,
                    },
                ),
                landlock: landlock.map(|compatibility| LandlockPolicy { compatibility }),
                process: process.map(|(run_as_user, run_as_group)| ProcessPolicy {
                    run_as_user,
                    run_as_group,
                }),
                network_policies,
                network_middlewares: None,
            },
        )
}

// ---- YAML ----------------------------------------------------------------------------------

#[test]
fn openshell_yaml_seeds() {
    for (name, bytes) in support::fuzz::corpus("openshell_yaml") {
        let text = String::from_utf8(bytes).unwrap();
        let r = from_yaml(&text);
        if name.starts_with("ok-") {
            r.unwrap_or_else(|e| panic!("seed {name}: {e}"));
        } else {
            assert!(r.is_err(), "seed {name} parsed");
        }
    }
}

#[test]
fn openshell_yaml_any_text_never_panics() {
    let strategy = prop_oneof![
        "\\PC{0,200}",
        // Near-misses of the real format, so that the parser goes deep.
        prop::collection::vec(
            prop::sample::select(vec![
                "version: 1\n",
                "filesystem_policy:\n",
                "  read_only: [/usr]\n",
                "  read_write:\n  - /tmp\n",
                "landlock: {compatibility: best_effort}\n",
                "process:\n  run_as_user: sandbox\n",
                "network_policies:\n  r:\n",
                "    endpoints:\n    - host: a\n      port: 1\n",
                "&a [*a, *a]\n",
                "<<: *a\n",
                "  include_workdir: true\n",
                "!!binary x\n",
                "? a\n",
                "---\n",
                "\t",
                "{",
            ]),
            0..12,
        )
        .prop_map(|v| v.concat()),
    ];
    support::fuzz::run(
        "openshell_yaml_text",
        support::fuzz::config(2_000),
        &strategy,
        |text| {
            let _ = from_yaml(&text);
            Ok(())
        },
    );
}

#[test]
fn openshell_yaml_round_trips_and_names_every_unknown_key() {
    // Which struct-shaped object of the serialized tree gets the unknown key (see `visit`).
    let strategy = (model(), any::<prop::sample::Index>(), "zz[a-z_]{0,8}");
    support::fuzz::run(
        "openshell_yaml_structured",
        support::fuzz::config(600),
        &strategy,
        |(m, at, key)| {
            let yaml = to_yaml(&m).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let back = from_yaml(&yaml)
                .map_err(|e| TestCaseError::fail(format!("{e}\n--- yaml:\n{yaml}")))?;
            prop_assert_eq!(&back, &m, "yaml:\n{}", yaml);

            let mut tree = serde_json::to_value(&m).unwrap();
            let mut count = 0;
            visit(&mut tree, &mut |_| count += 1);
            let target = at.index(count);
            let mut n = 0;
            insert_at(&mut tree, target, &mut n, &key);
            let yaml = serde_saphyr::to_string(&tree).unwrap();
            match from_yaml(&yaml) {
                Ok(_) => prop_assert!(false, "unknown key {} accepted:\n{}", key, yaml),
                Err(e) => {
                    let want = format!("unknown field `{key}`");
                    prop_assert!(e.to_string().contains(&want), "{}\n{}", e, yaml);
                }
            }
            Ok(())
        },
    );
}

fn insert_at(v: &mut serde_json::Value, target: usize, n: &mut usize, key: &str) {
    visit(v, &mut |obj| {
        if *n == target {
            obj.insert(key.to_string(), serde_json::Value::from(1));
        }
        *n += 1;
    });
}

/// Visit every struct-shaped object of a serialized policy in a fixed order: each section,
/// endpoint, binary and rule, then the top level. (The map of rule keys is not a struct: a
/// new key there is a new rule.)
fn visit(
    v: &mut serde_json::Value,
    f: &mut dyn FnMut(&mut serde_json::Map<String, serde_json::Value>),
) {
    let top = v.as_object_mut().unwrap();
    for section in ["filesystem_policy", "landlock", "process"] {
        if let Some(serde_json::Value::Object(o)) = top.get_mut(section) {
            f(o);
        }
    }
    if let Some(serde_json::Value::Object(rules)) = top.get_mut("network_policies") {
        for rule in rules.values_mut() {
            let rule = rule.as_object_mut().unwrap();
            for list in ["endpoints", "binaries"] {
                if let Some(serde_json::Value::Array(items)) = rule.get_mut(list) {
                    for item in items {
                        f(item.as_object_mut().unwrap());
                    }
                }
            }
            f(rule);
        }
    }
    f(top);
}

// ---- proto ---------------------------------------------------------------------------------

#[test]
fn openshell_proto_seeds() {
    for (name, bytes) in support::fuzz::corpus("openshell_proto") {
        let r = decode_policy(&bytes);
        if name.starts_with("ok-") {
            r.unwrap_or_else(|e| panic!("seed {name}: {e}"));
        } else if name.starts_with("unknown-") {
            assert!(
                matches!(r, Err(ProtoError::UnknownFields(_))),
                "seed {name}: {r:?}"
            );
        } else {
            assert!(
                matches!(r, Err(ProtoError::Malformed { .. })),
                "seed {name}: {r:?}"
            );
        }
        check_any_bytes(&bytes).unwrap_or_else(|e| panic!("seed {name}: {e}"));
    }
}

/// Never a panic; never accepted when prost refuses; accepted exactly as prost reads it.
fn check_any_bytes(bytes: &[u8]) -> Result<(), TestCaseError> {
    let ours = decode_policy(bytes);
    let prost = pb::SandboxPolicy::decode(bytes);
    if prost.is_err() {
        prop_assert!(ours.is_err(), "accepted bytes prost refuses: {:?}", ours);
    }
    if let Ok(p) = ours {
        // What we accepted re-encodes to what prost decoded (no field silently lost).
        let ours_pb = pb::SandboxPolicy::decode(encode_policy(&p).as_slice()).unwrap();
        let mut theirs = prost.unwrap();
        // The model normalises `port` away when `ports` is set (ports wins).
        for r in theirs.network_policies.values_mut() {
            for e in &mut r.endpoints {
                if !e.ports.is_empty() {
                    e.port = 0;
                }
            }
            for b in &mut r.binaries {
                b.harness = false;
            }
            // A rule without `allow` and one with an empty `allow` are one model value: a
            // clause without a method never matches (the L7 matcher's first test), so the
            // re-encoding writes the empty message.
            for e in &mut r.endpoints {
                for rule in &mut e.rules {
                    rule.allow.get_or_insert_with(Default::default);
                }
            }
        }
        prop_assert_eq!(ours_pb, theirs);
    }
    if let Ok(r) = decode_config_response(bytes) {
        let _ = r.policy;
    }
    Ok(())
}

#[test]
fn openshell_proto_any_bytes_never_panic() {
    // Raw bytes, and valid encodings with a few bytes flipped, so that most cases get deep.
    let strategy = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..64),
        (
            model(),
            prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4)
        )
            .prop_map(|(m, flips)| {
                let mut b = encode_policy(&m);
                if !b.is_empty() {
                    for (i, x) in flips {
                        let i = i.index(b.len());
                        b[i] ^= x;
                    }
                }
                b
            }),
    ];
    support::fuzz::run(
        "openshell_proto_bytes",
        support::fuzz::config(3_000),
        &strategy,
        |bytes| check_any_bytes(&bytes),
    );
}

/// One injected field: its number (an offset into the unknown numbers of its message), wire
/// type and payload.
#[derive(Debug, Clone)]
struct Inject {
    number: u32,
    wire: u8,
    payload: Vec<u8>,
}

fn inject() -> impl Strategy<Value = Inject> {
    (
        prop_oneof![27u32..200, 200u32..(1 << 29)],
        prop::sample::select(vec![0u8, 1, 2, 3, 5]),
        prop::collection::vec(any::<u8>(), 0..6),
    )
        .prop_map(|(number, wire, payload)| Inject {
            number,
            wire,
            payload,
        })
}

/// The field numbers each message declares (including the known-opaque ones).
fn known(message: &str) -> std::ops::RangeInclusive<u32> {
    match message {
        "GetSandboxConfigResponse" => 1..=12,
        "SandboxPolicy" => 1..=6,
        "FilesystemPolicy" | "NetworkPolicyRule" => 1..=3,
        "LandlockPolicy" => 1..=1,
        "ProcessPolicy" | "NetworkBinary" => 1..=2,
        "NetworkEndpoint" => 1..=26,
        other => panic!("{other}"),
    }
}

fn encode_inject(i: &Inject, message: &str, out: &mut Vec<u8>) -> u32 {
    // Any number above the message's known range is unknown to it.
    let number = i.number.max(*known(message).end() + 1);
    match i.wire {
        0 => {
            encode_key(number, WireType::Varint, out);
            encode_varint(u64::from(i.payload.first().copied().unwrap_or(0)), out);
        }
        1 => {
            encode_key(number, WireType::SixtyFourBit, out);
            out.extend([7u8; 8]);
        }
        2 => {
            encode_key(number, WireType::LengthDelimited, out);
            encode_varint(i.payload.len() as u64, out);
            out.extend(&i.payload);
        }
        3 => {
            // A group holding one varint field.
            encode_key(number, WireType::StartGroup, out);
            encode_key(1, WireType::Varint, out);
            encode_varint(5, out);
            encode_key(number, WireType::EndGroup, out);
        }
        _ => {
            encode_key(number, WireType::ThirtyTwoBit, out);
            out.extend([9u8; 4]);
        }
    }
    number
}

fn ld(number: u32, payload: &[u8], out: &mut Vec<u8>) {
    encode_key(number, WireType::LengthDelimited, out);
    encode_varint(payload.len() as u64, out);
    out.extend_from_slice(payload);
}

/// Encodes the model by hand, one message at a time, appending injected unknown fields at
/// the levels the plan picks, and records what it injected.
struct Injector<'a> {
    plan: &'a [(prop::sample::Index, Inject)],
    /// Message instances visited so far; a plan entry lands on instance `index(total)`.
    total: usize,
    seen: usize,
    expected: Vec<UnknownField>,
}

impl Injector<'_> {
    fn extras(&mut self, message: &'static str, path: &str, out: &mut Vec<u8>) {
        let me = self.seen;
        self.seen += 1;
        for (at, i) in self.plan {
            if at.index(self.total) == me {
                let number = encode_inject(i, message, out);
                self.expected.push(UnknownField {
                    path: path.to_string(),
                    message,
                    number,
                });
            }
        }
    }

    fn policy(&mut self, m: &SandboxPolicy, path: &str) -> Vec<u8> {
        let sub = |name: &str| {
            if path.is_empty() {
                name.to_string()
            } else {
                format!("{path}.{name}")
            }
        };
        let p = pb::SandboxPolicy::decode(encode_policy(m).as_slice()).unwrap();
        let mut out = pb::SandboxPolicy {
            version: p.version,
            ..Default::default()
        }
        .encode_to_vec();
        if let Some(f) = &p.filesystem {
            let mut b = f.encode_to_vec();
            self.extras("FilesystemPolicy", &sub("filesystem"), &mut b);
            ld(2, &b, &mut out);
        }
        if let Some(l) = &p.landlock {
            let mut b = l.encode_to_vec();
            self.extras("LandlockPolicy", &sub("landlock"), &mut b);
            ld(3, &b, &mut out);
        }
        if let Some(pr) = &p.process {
            let mut b = pr.encode_to_vec();
            self.extras("ProcessPolicy", &sub("process"), &mut b);
            ld(4, &b, &mut out);
        }
        let rules: BTreeMap<_, _> = p.network_policies.iter().collect();
        for (key, rule) in rules {
            let mut r = pb::NetworkPolicyRule {
                name: rule.name.clone(),
                ..Default::default()
            }
            .encode_to_vec();
            let rpath = sub("network_policies.value");
            for e in &rule.endpoints {
                let mut b = e.encode_to_vec();
                self.extras("NetworkEndpoint", &format!("{rpath}.endpoints"), &mut b);
                ld(2, &b, &mut r);
            }
            for bin in &rule.binaries {
                let mut b = bin.encode_to_vec();
                self.extras("NetworkBinary", &format!("{rpath}.binaries"), &mut b);
                ld(3, &b, &mut r);
            }
            self.extras("NetworkPolicyRule", &rpath, &mut r);
            let mut entry = Vec::new();
            ld(1, key.as_bytes(), &mut entry);
            ld(2, &r, &mut entry);
            ld(5, &entry, &mut out);
        }
        self.extras("SandboxPolicy", path, &mut out);
        out
    }
}

/// How many message instances `policy` visits for `m`: the counting pass of the injector.
fn instances(m: &SandboxPolicy) -> usize {
    let mut inj = Injector {
        plan: &[],
        total: 1,
        seen: 0,
        expected: Vec::new(),
    };
    inj.policy(m, "");
    inj.seen
}

fn sorted(mut v: Vec<UnknownField>) -> Vec<(String, &'static str, u32)> {
    let mut out: Vec<_> = v.drain(..).map(|u| (u.path, u.message, u.number)).collect();
    out.sort();
    out
}

#[test]
fn openshell_proto_unknown_field_detection_is_exact() {
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
    let (injected, total_cases) = (AtomicU32::new(0), AtomicU32::new(0));
    let strategy = (
        model(),
        prop::collection::vec((any::<prop::sample::Index>(), inject()), 0..4),
        prop::collection::vec(inject(), 0..2),
    );
    support::fuzz::run(
        "openshell_proto_unknown",
        support::fuzz::config(800),
        &strategy,
        |(m, plan, envelope)| {
            // Without injection both decoders give back the model exactly.
            prop_assert_eq!(&decode_policy(&encode_policy(&m)).unwrap(), &m);

            let total = instances(&m);
            let mut inj = Injector {
                plan: &plan,
                total,
                seen: 0,
                expected: Vec::new(),
            };
            let bytes = inj.policy(&m, "");
            let expected = sorted(inj.expected);
            total_cases.fetch_add(1, Relaxed);
            if !expected.is_empty() {
                injected.fetch_add(1, Relaxed);
            }
            match decode_policy(&bytes) {
                Ok(p) => {
                    prop_assert!(expected.is_empty(), "missed {:?}", expected);
                    prop_assert_eq!(&p, &m);
                }
                Err(ProtoError::UnknownFields(u)) => prop_assert_eq!(sorted(u), expected),
                Err(e) => prop_assert!(false, "{}", e),
            }

            // The same policy inside a GetSandboxConfigResponse, with envelope extras too.
            let mut inj = Injector {
                plan: &plan,
                total,
                seen: 0,
                expected: Vec::new(),
            };
            let policy = inj.policy(&m, "policy");
            let mut resp = pb::GetSandboxConfigResponse {
                version: 5,
                config_revision: 9,
                policy_validation_failure_mode: "retain_last_valid".into(),
                ..Default::default()
            }
            .encode_to_vec();
            ld(1, &policy, &mut resp);
            let mut expected = inj.expected;
            for i in &envelope {
                let number = encode_inject(i, "GetSandboxConfigResponse", &mut resp);
                expected.push(UnknownField {
                    path: String::new(),
                    message: "GetSandboxConfigResponse",
                    number,
                });
            }
            let r =
                decode_config_response(&resp).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(r.version, 5);
            prop_assert_eq!(r.config_revision, 9);
            let expected = sorted(expected);
            match r.policy {
                Ok(p) => {
                    prop_assert!(expected.is_empty(), "missed {:?}", expected);
                    prop_assert_eq!(p.as_ref(), Some(&m));
                }
                Err(ProtoError::UnknownFields(u)) => prop_assert_eq!(sorted(u), expected),
                Err(e) => prop_assert!(false, "{}", e),
            }
            Ok(())
        },
    );
    // Not vacuous: most cases must carry an injected field.
    let (injected, total) = (injected.into_inner(), total_cases.into_inner());
    eprintln!("openshell_proto_unknown: {injected} of {total} cases injected unknown fields");
    assert!(
        injected * 2 >= total,
        "only {injected} of {total} cases injected anything"
    );
}
