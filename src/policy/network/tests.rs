//! Load-time validation of `network_policies`, from OpenShell's YAML and proto forms.

use super::*;
use crate::policy::openshell::{decode_policy, encode_policy, from_yaml};

const HEAD: &str = "version: 1\nfilesystem_policy:\n  read_only: [/usr]\nnetwork_policies:\n";

fn compile_yaml(rules: &str) -> Result<NetworkRules, NetworkPolicyError> {
    let p = from_yaml(&format!("{HEAD}{rules}")).expect("the YAML parses");
    NetworkRules::compile(&p.network_policies)
}

fn refused(rules: &str) -> NetworkPolicyError {
    compile_yaml(rules).expect_err("refused")
}

/// A policy of every endpoint form: exact, `*.` and `**.` hosts, several ports, private
/// names, an `allowed_ips` range; binaries by path, by a launcher and by a glob.
pub(crate) const P1: &str = r#"
  pub_http:
    name: public-http
    endpoints:
      - host: pub.test
        port: 8080
      - host: "*.wild.test"
        ports: [8080, 8443]
      - host: "**.deep.test"
        port: 8080
    binaries:
      - path: /t/bin/probe-a
      - path: /usr/bin/curl
  via_launcher:
    endpoints:
      - host: pub.test
        port: 8081
    binaries:
      - path: /t/bin/launch
  via_glob:
    endpoints:
      - host: pub.test
        port: 8082
    binaries:
      - path: "/t/bin/*"
  corp_exact:
    endpoints:
      - host: db.corp.test
        port: 8080
      - host: k8s.corp.test
        port: 6443
      - host: localhost
        port: 8080
    binaries:
      - path: /t/bin/probe-a
  corp_ips:
    endpoints:
      - ports: [9090]
        allowed_ips: ["10.77.0.0/24"]
    binaries:
      - path: /t/bin/probe-a
"#;

#[test]
fn p1_compiles_in_key_order() {
    let r = compile_yaml(P1).unwrap();
    let keys: Vec<&str> = r.rules().iter().map(|r| r.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "corp_exact",
            "corp_ips",
            "pub_http",
            "via_glob",
            "via_launcher"
        ]
    );
    let pub_http = &r.rules()[2];
    assert_eq!(pub_http.name, "public-http");
    assert_eq!(pub_http.endpoints[1].ports, [8080, 8443]);
    assert!(matches!(
        &pub_http.endpoints[1].host,
        Some(HostPattern::Glob(_))
    ));
    let ips = &r.rules()[1].endpoints[0];
    assert!(ips.host.is_none());
    assert_eq!(ips.allowed_ips, ["10.77.0.0/24".parse::<IpNet>().unwrap()]);
    assert!(r.warnings().is_empty(), "{:?}", r.warnings());
}

#[test]
fn contradictory_or_too_broad_endpoints_are_refused_naming_the_key() {
    let cases = [
        (
            "  a:\n    endpoints:\n      - {host: x.test, port: 80, protocol: rest, access: read-only, rules: [{allow: {method: GET, path: /}}]}\n",
            "network_policies.a.endpoints[0]",
            "rules and access are mutually exclusive",
        ),
        (
            "  a:\n    endpoints:\n      - {host: x.test, port: 80, deny_rules: [{method: GET, path: /}]}\n",
            "network_policies.a.endpoints[0].deny_rules",
            "deny_rules require protocol",
        ),
        (
            "  a:\n    endpoints:\n      - {host: x.test, port: 80, protocol: rest, rules: []}\n",
            "network_policies.a.endpoints[0].rules",
            "rules would deny all traffic",
        ),
        (
            "  a:\n    endpoints:\n      - {host: \"*.com\", port: 80}\n",
            "network_policies.a.endpoints[0].host",
            "TLD wildcard '*.com' is not allowed",
        ),
        (
            "  a:\n    endpoints:\n      - {host: \"**\", port: 80}\n",
            "network_policies.a.endpoints[0].host",
            "matches all hosts",
        ),
        (
            "  a:\n    endpoints:\n      - {host: x.test, protocol: sql, enforcement: enforce, access: full, port: 5432}\n",
            "network_policies.a.endpoints[0].enforcement",
            "SQL enforcement requires full SQL parsing",
        ),
        (
            "  a:\n    endpoints:\n      - {port: 80, allowed_ips: [\"127.0.0.0/8\"]}\n",
            "network_policies.a.endpoints[0].allowed_ips[0]",
            "always blocked",
        ),
    ];
    for (yaml, key, msg) in cases {
        let e = refused(yaml);
        assert_eq!(e.key, key, "{yaml}");
        assert!(e.message.contains(msg), "{yaml}: {e}");
    }
    // `port` with `ports` is refused by the YAML decoder already, naming the endpoint.
    let y =
        format!("{HEAD}  a:\n    endpoints:\n      - {{host: x.test, port: 80, ports: [81]}}\n");
    let e = from_yaml(&y).unwrap_err().to_string();
    assert!(e.contains("network_policies.a.endpoints[0]"), "{e}");
}

#[test]
fn host_wildcard_rules() {
    for bad in ["a.**.test", "a.b*.test", "x**.example.com", "*.*", "*"] {
        let y = format!("  a:\n    endpoints:\n      - {{host: \"{bad}\", port: 80}}\n");
        assert!(compile_yaml(&y).is_err(), "{bad} accepted");
    }
    for good in [
        "**.example.com",
        "*.example.com",
        "*-api.example.com",
        "api.*.example.com",
        "API.Example.COM",
    ] {
        let y = format!(
            "  a:\n    endpoints:\n      - {{host: \"{good}\", port: 80}}\n    binaries: [{{path: /x}}]\n"
        );
        compile_yaml(&y).unwrap_or_else(|e| panic!("{good}: {e}"));
    }
    let e = refused("  a:\n    endpoints:\n      - {host: \"https://x.test/\", port: 80}\n");
    assert!(e.message.contains("no scheme, port or path"), "{e}");
}

#[test]
fn allowed_ips_forms_and_blocked_overlaps() {
    let y = "  a:\n    endpoints:\n      - {port: 80, allowed_ips: [\"10.0.0.5\", \"fd00::/8\", \"10.1.0.0/16\"]}\n    binaries: [{path: /x}]\n";
    let r = compile_yaml(y).unwrap();
    let ips = &r.rules()[0].endpoints[0].allowed_ips;
    assert_eq!(ips[0], "10.0.0.5/32".parse::<IpNet>().unwrap());
    assert_eq!(ips.len(), 3);
    for bad in [
        "0.0.0.0/0",
        "::/0",
        "169.254.169.254",
        "::1",
        "fe80::1/64",
        "::ffff:127.0.0.1",
        "127.5.0.0/16",
        "nope",
    ] {
        let y = format!("  a:\n    endpoints:\n      - {{port: 80, allowed_ips: [\"{bad}\"]}}\n");
        assert!(compile_yaml(&y).is_err(), "{bad} accepted");
    }
    let r = compile_yaml("  a:\n    endpoints:\n      - {port: 80, allowed_ips: [\"10.0.0.0/8\"]}\n    binaries: [{path: /x}]\n").unwrap();
    assert!(
        r.warnings()[0].message.contains("broad"),
        "{:?}",
        r.warnings()
    );
}

#[test]
fn protocol_tls_enforcement_and_access_are_kept_as_data() {
    let y = r#"
  api:
    endpoints:
      - host: api.test
        port: 443
        protocol: rest
        enforcement: enforce
        access: read-only
        path: /v1/**
        deny_rules:
          - method: GET
            path: "/admin/**"
            query:
              tag: "*-rc*"
      - host: raw.test
        port: 443
        tls: skip
      - host: rules.test
        port: 80
        protocol: rest
        rules:
          - allow:
              method: GET
              path: /download
              query:
                tag:
                  any: ["a-*", "b-*"]
    binaries: [{path: /usr/bin/curl}]
"#;
    let r = compile_yaml(y).unwrap();
    let e = &r.rules()[0].endpoints;
    assert_eq!(e[0].protocol, Protocol::Rest);
    assert_eq!(e[0].enforcement, Enforcement::Enforce);
    assert_eq!(e[0].access, Some(AccessPreset::ReadOnly));
    assert_eq!(e[0].path, "/v1/**");
    assert_eq!(e[0].deny_rules[0].query["tag"].glob, "*-rc*");
    assert_eq!(e[1].tls, TlsMode::Skip);
    assert!(e[1].has_extended_config());
    assert_eq!(e[2].enforcement, Enforcement::Audit);
    assert_eq!(e[2].rules[0].query["tag"].any, ["a-*", "b-*"]);
    assert_eq!(
        r.inspected_endpoints(),
        [("api".to_string(), 0), ("api".to_string(), 2)]
    );
}

#[test]
fn what_openshell_only_warns_about_loads_with_a_warning() {
    let y = "  a:\n    endpoints:\n      - {host: x.test, port: 80, tls: terminate}\n      - {host: y.test, port: 80, protocol: rest, access: sideways}\n  b:\n    endpoints:\n      - {host: z.test, port: 80}\n";
    let r = compile_yaml(y).unwrap();
    let w: Vec<String> = r.warnings().iter().map(ToString::to_string).collect();
    assert!(w.iter().any(|w| w.contains("deprecated")), "{w:?}");
    assert!(
        w.iter()
            .any(|w| w.contains("unsupported L7 access preset 'sideways'")),
        "{w:?}"
    );
    assert!(
        w.iter()
            .any(|w| w.starts_with("network_policies.b: the rule lists no binaries")),
        "{w:?}"
    );
}

#[test]
fn refused_values_this_supervisor_cannot_enforce() {
    for (yaml, msg) in [
        (
            "      - {host: x.test, port: 80, protocol: tcp}\n",
            "policy DNS",
        ),
        (
            "      - {host: x.test, port: 80, protocol: ftp}\n",
            "unknown protocol 'ftp'",
        ),
        (
            "      - {host: x.test, port: 80, protocol: rest, access: full, enforcement: enforced}\n",
            "neither 'enforce' nor 'audit'",
        ),
        ("      - {host: x.test, ports: [80, 0]}\n", "port 0"),
    ] {
        let e = refused(&format!("  a:\n    endpoints:\n{yaml}"));
        assert!(e.message.contains(msg), "{yaml}: {e}");
    }
    for (path, msg) in [
        ("curl", "not absolute"),
        ("/usr/bin/[ab]*", "does not support"),
        ("bin/*", "never match"),
    ] {
        let e = refused(&format!(
            "  a:\n    endpoints: [{{host: x.test, port: 80}}]\n    binaries: [{{path: \"{path}\"}}]\n"
        ));
        assert_eq!(e.key, "network_policies.a.binaries[0].path");
        assert!(e.message.contains(msg), "{path}: {e}");
    }
}

#[test]
fn the_proto_form_compiles_to_the_same_rules() {
    let p = from_yaml(&format!("{HEAD}{P1}")).unwrap();
    let back = decode_policy(&encode_policy(&p)).unwrap();
    assert_eq!(
        NetworkRules::compile(&back.network_policies).unwrap(),
        NetworkRules::compile(&p.network_policies).unwrap()
    );
}

#[test]
fn binary_links_are_added_to_exact_paths() {
    let mut r = compile_yaml("  a:\n    endpoints: [{host: x.test, port: 80}]\n    binaries: [{path: /usr/bin/python3}, {path: \"/opt/*\"}]\n").unwrap();
    assert_eq!(r.exact_binaries(), ["/usr/bin/python3"]);
    r.expand_binary_links(&|p| vec![p.to_string(), format!("{p}.11")]);
    let b = &r.rules()[0].binaries;
    assert!(b[0].matches("/usr/bin/python3.11"));
    assert!(b[0].matches("/usr/bin/python3"));
    assert!(!b[0].matches("/usr/bin/python3.12"));
}

#[test]
fn always_blocked_covers_mapped_forms() {
    for ip in [
        "127.0.0.1",
        "127.255.0.1",
        "169.254.169.254",
        "0.0.0.0",
        "::1",
        "::",
        "fe80::1",
        "::ffff:127.0.0.1",
        "::ffff:169.254.1.1",
    ] {
        assert!(is_always_blocked(ip.parse().unwrap()), "{ip}");
    }
    for ip in ["10.0.0.1", "192.88.99.10", "::2", "fec0::1"] {
        assert!(!is_always_blocked(ip.parse().unwrap()), "{ip}");
    }
}

#[test]
fn binary_switches_are_kept_off_by_default_and_absent_from_the_proto() {
    let rules = "  a:\n    endpoints: [{host: x.test, port: 80}]\n    binaries: [{path: /usr/bin/git, descendants: true}, {path: /usr/bin/curl, allow_untrusted_code: true}, {path: \"/**\"}]\n";
    let r = compile_yaml(rules).unwrap();
    let b = &r.rules()[0].binaries;
    assert!(b[0].descendants && !b[0].allow_untrusted_code);
    assert!(!b[1].descendants && b[1].allow_untrusted_code);
    assert!(b[2].is_catch_all() && !b[0].is_catch_all() && !b[1].is_catch_all());
    // A policy from the gateway cannot carry them: off after a round trip through the proto.
    let p = from_yaml(&format!("{HEAD}{rules}")).unwrap();
    let back = decode_policy(&encode_policy(&p)).unwrap();
    let r = NetworkRules::compile(&back.network_policies).unwrap();
    assert!(
        r.rules()[0]
            .binaries
            .iter()
            .all(|b| !b.descendants && !b.allow_untrusted_code)
    );
    // A misspelt switch is refused by name, not taken as off.
    let e = from_yaml(&format!(
        "{HEAD}  a:\n    binaries: [{{path: /x, descendant: true}}]\n"
    ))
    .unwrap_err();
    assert!(e.to_string().contains("descendant"), "{e}");
}
