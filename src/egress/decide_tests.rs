//! The decision table: the sheet's P1 policy against hosts, ports and callers.

use std::sync::Arc;

use super::addr::AddressPlan;
use super::decide::{Decision, Mode, decide};
use super::identity::{Caller, ExecKey};
use super::revision::PolicyState;
use crate::policy::network::{NetworkRules, Protocol};
use crate::policy::openshell::from_yaml;

const P1: &str = r#"
version: 1
filesystem_policy: {read_only: [/usr]}
network_policies:
  pub_http:
    endpoints:
      - {host: pub.test, port: 8080}
      - {host: "*.wild.test", ports: [8080, 8443]}
      - {host: "**.deep.test", port: 8080}
    binaries: [{path: /t/bin/probe-a}, {path: /usr/bin/curl}]
  via_launcher:
    endpoints: [{host: pub.test, port: 8081}]
    binaries: [{path: /t/bin/launch}]
  via_glob:
    endpoints: [{host: pub.test, port: 8082}]
    binaries: [{path: "/t/bin/*"}]
  corp_exact:
    endpoints:
      - {host: db.corp.test, port: 8080}
      - {host: k8s.corp.test, port: 6443}
      - {host: localhost, port: 8080}
      - {host: 10.77.0.10, port: 7070}
    binaries: [{path: /t/bin/probe-a}]
  corp_ips:
    endpoints: [{ports: [9090], allowed_ips: ["10.77.0.0/24"]}]
    binaries: [{path: /t/bin/probe-a}]
  z_also_pub:
    endpoints: [{host: pub.test, port: 8080}]
    binaries: [{path: /t/bin/probe-a}]
  api:
    endpoints:
      - {host: api.test, port: 8080, protocol: rest, access: read-only}
      - {host: raw.test, port: 443, protocol: rest, access: full, tls: skip}
    binaries: [{path: /t/bin/probe-a}]
"#;

fn policy() -> PolicyState {
    let p = from_yaml(P1).unwrap();
    PolicyState::Rules(Arc::new(
        NetworkRules::compile(&p.network_policies).unwrap(),
    ))
}

fn caller(exe: &str, ancestors: &[&str]) -> Caller {
    Caller {
        pid: 42,
        exe: exe.into(),
        ancestors: ancestors.iter().map(|s| s.to_string()).collect(),
        cmdline_paths: vec!["/t/data".into()],
        exec: ExecKey(1),
    }
}

fn probe_a() -> Caller {
    caller("/t/bin/probe-a", &[])
}

fn allowed(host: &str, port: u16, c: &Caller) -> (String, AddressPlan, Mode) {
    match decide(&policy(), host, port, c) {
        Decision::Allow(a) => (a.rule, a.plan, a.mode),
        Decision::Deny(d) => panic!("{host}:{port} denied: {}", d.reason),
    }
}

fn denied(host: &str, port: u16, c: &Caller) -> String {
    match decide(&policy(), host, port, c) {
        Decision::Deny(d) => d.reason,
        Decision::Allow(a) => panic!("{host}:{port} allowed by {}", a.rule),
    }
}

#[test]
fn exact_hosts_case_insensitive_and_the_smallest_key() {
    let (rule, plan, mode) = allowed("PUB.TEST", 8080, &probe_a());
    // pub_http and z_also_pub both allow: the smaller key is reported.
    assert_eq!(rule, "pub_http");
    assert_eq!(plan, AddressPlan::ExactHost);
    assert_eq!(mode, Mode::Tunnel);
    assert_eq!(
        allowed("pub.test", 8080, &caller("/usr/bin/curl", &[])).0,
        "pub_http"
    );
    // A trailing dot is another name.
    assert!(denied("pub.test.", 8080, &probe_a()).contains("is not allowed by any policy"));
}

#[test]
fn wrong_port_and_unknown_host() {
    assert_eq!(
        denied("pub.test", 8083, &probe_a()),
        "endpoint pub.test:8083 is not allowed by any policy"
    );
    assert_eq!(
        denied("other.test", 80, &probe_a()),
        "endpoint other.test:80 is not allowed by any policy"
    );
}

#[test]
fn glob_edges() {
    let a = probe_a();
    assert_eq!(allowed("a.wild.test", 8443, &a).1, AddressPlan::PublicOnly);
    denied("wild.test", 8080, &a);
    denied("b.c.wild.test", 8080, &a);
    allowed("x.y.deep.test", 8080, &a);
    allowed("x.deep.test", 8080, &a);
    denied("deep.test", 8080, &a);
    denied("a.wild.test", 9999, &a);
}

#[test]
fn binaries_exe_or_ancestor_never_argv() {
    let b = caller("/t/bin/probe-b", &[]);
    let r = denied("pub.test", 8080, &b);
    assert!(
        r.starts_with("binary '/t/bin/probe-b' not allowed in policy 'pub_http' (ancestors: [], cmdline: [/t/data])"),
        "{r}"
    );
    assert!(
        r.contains("; binary '/t/bin/probe-b' not allowed in policy 'z_also_pub'"),
        "{r}"
    );
    // Launched by an allowed binary: the ancestor rule.
    let launched = caller("/t/bin/probe-b", &["/t/bin/launch", "/bin/sh"]);
    assert_eq!(allowed("pub.test", 8081, &launched).0, "via_launcher");
    let r = denied("pub.test", 8081, &b);
    assert!(r.contains("policy 'via_launcher'"), "{r}");
    // Argv paths never match.
    let mut fake = caller("/t/bin/probe-b", &[]);
    fake.cmdline_paths = vec!["/usr/bin/curl".into()];
    assert!(denied("pub.test", 8080, &fake).contains("cmdline: [/usr/bin/curl]"));
    // `*` stays inside one path segment.
    allowed("pub.test", 8082, &b);
    denied("pub.test", 8082, &caller("/t/bin/sub/probe-c", &[]));
}

#[test]
fn a_rule_without_binaries_allows_nothing() {
    let p = from_yaml(
        "version: 1\nnetwork_policies:\n  open:\n    endpoints: [{host: pub.test, port: 80}]\n",
    )
    .unwrap();
    let s = PolicyState::Rules(Arc::new(
        NetworkRules::compile(&p.network_policies).unwrap(),
    ));
    match decide(&s, "pub.test", 80, &probe_a()) {
        Decision::Deny(d) => assert!(
            d.reason.contains("not allowed in policy 'open'"),
            "{}",
            d.reason
        ),
        a => panic!("{a:?}"),
    }
}

#[test]
fn address_plans() {
    let a = probe_a();
    assert_eq!(allowed("db.corp.test", 8080, &a).1, AddressPlan::ExactHost);
    assert_eq!(allowed("k8s.corp.test", 6443, &a).1, AddressPlan::ExactHost);
    assert_eq!(allowed("localhost", 8080, &a).1, AddressPlan::ExactHost);
    assert_eq!(
        allowed("10.77.0.10", 7070, &a).1,
        AddressPlan::IpLiteral("10.77.0.10".parse().unwrap())
    );
    let (rule, plan, _) = allowed("any1.test", 9090, &a);
    assert_eq!(rule, "corp_ips");
    assert_eq!(
        plan,
        AddressPlan::AllowedIps(vec!["10.77.0.0/24".parse().unwrap()])
    );
    // A hostless endpoint needs the binary too.
    denied("any1.test", 9090, &caller("/t/bin/probe-b", &[]));
}

#[test]
fn empty_policy_and_quarantine() {
    let empty = PolicyState::Rules(Arc::new(NetworkRules::default()));
    match decide(&empty, "pub.test", 8080, &probe_a()) {
        Decision::Deny(d) => assert_eq!(d.reason, "network connections not allowed by policy"),
        a => panic!("{a:?}"),
    }
    let q = PolicyState::Quarantined {
        reason: "policy validation failed; fail-closed quarantine is active; candidate version 4 rejected: x".into(),
    };
    match decide(&q, "pub.test", 8080, &probe_a()) {
        Decision::Deny(d) => assert!(d.reason.contains("fail-closed quarantine is active")),
        a => panic!("{a:?}"),
    }
}

#[test]
fn l7_endpoints_are_inspected_unless_tls_skip() {
    let a = probe_a();
    match allowed("api.test", 8080, &a).2 {
        Mode::Inspect(s) => {
            assert_eq!(
                (s.rule.as_str(), s.endpoint, s.protocol),
                ("api", 0, Protocol::Rest)
            );
        }
        m => panic!("{m:?}"),
    }
    assert_eq!(allowed("raw.test", 443, &a).2, Mode::Tunnel);
    match decide(&policy(), "raw.test", 443, &a) {
        Decision::Allow(al) => assert!(al.forward_needs_inspection()),
        d => panic!("{d:?}"),
    }
}
