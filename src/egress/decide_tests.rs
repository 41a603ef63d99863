//! The decision table: a policy of every endpoint form against hosts, ports and callers.

use std::sync::Arc;

use super::addr::AddressPlan;
use super::decide::{Decision, Mode, decide};
use super::identity::{Caller, ExecKey, UntrustedCode};
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
    binaries: [{path: /t/bin/launch, descendants: true}]
  launcher_only:
    endpoints: [{host: pub.test, port: 8084}]
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
        ..Default::default()
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
    // Launched by an allowed binary: the ancestor rule, where the binary asks for it.
    let launched = caller("/t/bin/probe-b", &["/t/bin/launch", "/bin/sh"]);
    assert_eq!(allowed("pub.test", 8081, &launched).0, "via_launcher");
    let r = denied("pub.test", 8081, &b);
    assert!(r.contains("policy 'via_launcher'"), "{r}");
    // Without `descendants`, only the binary itself.
    let r = denied("pub.test", 8084, &launched);
    assert!(
        r.ends_with("; its ancestor '/t/bin/launch' is listed, but the rule admits that binary's descendants only with descendants: true"),
        "{r}"
    );
    assert_eq!(
        allowed("pub.test", 8084, &caller("/t/bin/launch", &["/bin/sh"])).0,
        "launcher_only"
    );
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

fn rules(yaml: &str) -> PolicyState {
    let p = from_yaml(&format!("version: 1\nnetwork_policies:\n{yaml}")).unwrap();
    PolicyState::Rules(Arc::new(
        NetworkRules::compile(&p.network_policies).unwrap(),
    ))
}

fn verdict(
    p: &PolicyState,
    host: &str,
    port: u16,
    c: &Caller,
) -> Result<(String, AddressPlan), String> {
    match decide(p, host, port, c) {
        Decision::Allow(a) => Ok((a.rule, a.plan)),
        Decision::Deny(d) => Err(d.reason),
    }
}

#[test]
fn every_holder_of_the_socket_must_be_admitted_by_one_rule() {
    let mut both = probe_a();
    both.other_holders = vec![Caller {
        pid: 77,
        ..caller("/t/bin/probe-b", &["/bin/sh"])
    }];
    let r = denied("pub.test", 8080, &both);
    assert!(
        r.starts_with("binary '/t/bin/probe-b' not allowed in policy 'pub_http' (ancestors: [/bin/sh], cmdline: [/t/data]); it is PID 77, which holds the same socket as the caller"),
        "{r}"
    );
    // Two holders, each admitted by the same rule.
    let mut with_curl = probe_a();
    with_curl.other_holders = vec![caller("/usr/bin/curl", &[])];
    assert_eq!(allowed("pub.test", 8080, &with_curl).0, "pub_http");
    // Each admitted, but by different rules: no one rule admits the set.
    let p = rules(
        "  a:\n    endpoints: [{host: pub.test, port: 80}]\n    binaries: [{path: /bin/a}]\n  b:\n    endpoints: [{host: pub.test, port: 80}]\n    binaries: [{path: /bin/b}]\n",
    );
    let mut ab = caller("/bin/a", &[]);
    ab.other_holders = vec![caller("/bin/b", &[])];
    assert!(verdict(&p, "pub.test", 80, &ab).is_err());
}

#[test]
fn untrusted_code_is_refused_unless_the_binary_allows_it() {
    let p = rules(
        r#"  strict:
    endpoints: [{host: s.test, port: 80}]
    binaries: [{path: /usr/bin/curl}, {path: /usr/bin/git, descendants: true}]
  lax:
    endpoints: [{host: l.test, port: 80}]
    binaries: [{path: /usr/bin/curl, allow_untrusted_code: true}]
  any:
    endpoints: [{host: a.test, port: 80}]
    binaries: [{path: "/**"}]
"#,
    );
    let preload = |depth: usize| UntrustedCode {
        depth,
        what: "LD_PRELOAD in its environment".into(),
    };
    let mut curl = caller("/usr/bin/curl", &["/bin/sh"]);
    curl.untrusted_code = vec![preload(0)];
    let r = verdict(&p, "s.test", 80, &curl).unwrap_err();
    assert!(
        r.ends_with("; '/usr/bin/curl' may run code the sandbox could have written or chosen (LD_PRELOAD in its environment), which the rule admits only with allow_untrusted_code: true"),
        "{r}"
    );
    assert_eq!(verdict(&p, "l.test", 80, &curl).unwrap().0, "lax");
    // A rule that admits every executable does not ask who is calling.
    assert_eq!(verdict(&p, "a.test", 80, &curl).unwrap().0, "any");
    // An ancestor's evidence does not matter when the process itself is what matched.
    let mut clean = caller("/usr/bin/curl", &["/bin/sh"]);
    clean.untrusted_code = vec![preload(1)];
    assert!(verdict(&p, "s.test", 80, &clean).is_ok());
    // Matched through an ancestor: that ancestor's code decides, not what it runs.
    let mut helper = caller(
        "/usr/lib/git-core/git-remote-http",
        &["/usr/bin/git", "/bin/sh"],
    );
    helper.untrusted_code = vec![preload(0)];
    assert!(verdict(&p, "s.test", 80, &helper).is_ok());
    helper.untrusted_code = vec![preload(1)];
    let r = verdict(&p, "s.test", 80, &helper).unwrap_err();
    assert!(r.contains("'/usr/bin/git' may run code"), "{r}");
}

#[test]
fn a_glob_that_matches_an_ip_literal_keeps_the_public_only_plan() {
    let p = rules(
        r#"  wild:
    endpoints: [{host: "*.*.*.*", port: 8080}]
    binaries: [{path: /t/bin/probe-a}]
  literal:
    endpoints: [{host: 10.88.0.10, port: 8080}, {host: "::ffff:a58:a", port: 8080}]
    binaries: [{path: /t/bin/probe-a}]
  net:
    endpoints: [{host: "*.*.*.*", port: 9090, allowed_ips: ["10.77.0.0/24"]}]
    binaries: [{path: /t/bin/probe-a}]
"#,
    );
    let a = probe_a();
    for host in ["10.77.0.10", "192.88.99.10", "::ffff:10.77.0.10"] {
        assert_eq!(
            verdict(&p, host, 8080, &a).unwrap(),
            ("wild".into(), AddressPlan::PublicOnly),
            "{host}"
        );
    }
    // The rule that names the literal takes it as its address.
    assert_eq!(
        verdict(&p, "10.88.0.10", 8080, &a).unwrap().1,
        AddressPlan::IpLiteral("10.88.0.10".parse().unwrap())
    );
    assert_eq!(
        verdict(&p, "::ffff:a58:a", 8080, &a).unwrap().1,
        AddressPlan::IpLiteral("::ffff:a58:a".parse().unwrap())
    );
    // allowed_ips decides on its own, whatever matched.
    assert_eq!(
        verdict(&p, "10.77.0.10", 9090, &a).unwrap().1,
        AddressPlan::AllowedIps(vec!["10.77.0.0/24".parse().unwrap()])
    );
}
