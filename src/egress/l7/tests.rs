use super::path::{PathError, canonicalize, query_params};
use super::rules::{CompiledRules, L7Scope, RequestView, Verdict, scope_matches};
use super::{Kind, classify};
use crate::egress::credentials::{Binding, CredentialError, Credentials, redact};
use crate::egress::identity::{Caller, ExecKey};
use crate::policy::network::NetworkRules;
use crate::policy::openshell::from_yaml;

fn canon(s: &str) -> Result<String, PathError> {
    canonicalize(s, false).map(|c| c.target())
}

#[test]
fn canonical_paths() {
    for (input, want) in [
        ("/a/../repos/x/issues", "/repos/x/issues"),
        ("/a//b", "/a/b"),
        ("/a/./b/", "/a/b/"),
        ("/a/b/..", "/a/"),
        ("/%61dmin", "/admin"),
        ("/a%2e%2e/x", "/a../x"),
        ("/%2e%2e/x", "ERR"),
        ("/admin;x=1/y", "/admin/y"),
        ("/a/..;x/b", "/b"),
        ("/x%c3%a9", "/x%C3%A9"),
        ("/x%3b", "/x%3B"),
        ("/q?a=%2F&b=..", "/q?a=%2F&b=.."),
        ("/", "/"),
        ("/.", "/"),
    ] {
        let got = canon(input).unwrap_or_else(|_| "ERR".into());
        assert_eq!(got, want, "{input}");
    }
}

#[test]
fn refused_targets_name_their_fault() {
    assert_eq!(canon("/../x"), Err(PathError::Escape));
    assert_eq!(canon("/a/%2e%2e/%2e%2e/x"), Err(PathError::Escape));
    assert_eq!(canon("/a%00"), Err(PathError::Control));
    assert_eq!(canon("/a%0a"), Err(PathError::Control));
    assert_eq!(canon("/a\x7f"), Err(PathError::Control));
    assert_eq!(canon("/a\u{e9}"), Err(PathError::NonAscii));
    assert_eq!(canon("/ "), Err(PathError::Space));
    assert_eq!(canon("/a#f"), Err(PathError::Fragment));
    assert_eq!(canon("/a%zz"), Err(PathError::BadEscape));
    assert_eq!(canon("/a%2"), Err(PathError::BadEscape));
    assert_eq!(canon("/repos/x%2Fy/issues"), Err(PathError::EncodedSlash));
    assert_eq!(canon("*"), Err(PathError::NotOriginForm));
    assert_eq!(canon("http://x/"), Err(PathError::NotOriginForm));
    assert_eq!(
        canon(&format!("/{}", "a".repeat(4096))),
        Err(PathError::TooLong)
    );
    assert_eq!(
        canonicalize("/g/a%2fb", true).unwrap().path,
        "/g/a%2Fb",
        "kept encoded where allowed"
    );
}

#[test]
fn query_decoding() {
    assert_eq!(
        query_params(Some("tag=v1.2&tag=v2&x=a+b%21&flag")),
        vec![
            ("tag".into(), "v1.2".into()),
            ("tag".into(), "v2".into()),
            ("x".into(), "a b!".into()),
            ("flag".into(), String::new())
        ]
    );
}

#[test]
fn classify_first_bytes() {
    assert_eq!(classify(&[0x16, 3, 1, 0]), Kind::Tls);
    assert_eq!(classify(&[0x16]), Kind::Undecided);
    assert_eq!(classify(&[0x16, 2]), Kind::Other);
    assert_eq!(classify(b"GET / HTTP/1.1"), Kind::Http);
    assert_eq!(classify(b"OPTI"), Kind::Undecided);
    assert_eq!(classify(b"PRI * HTTP/2.0"), Kind::Other);
    assert_eq!(classify(b"SSH-2.0"), Kind::Other);
}

const P2: &str = r#"
version: 1
network_policies:
  api_ro:
    endpoints:
      - host: api.test
        port: 8080
        protocol: rest
        enforcement: enforce
        access: read-only
        deny_rules:
          - method: GET
            path: "/admin/**"
    binaries: [{path: /bin/probe}]
  api_rules:
    endpoints:
      - host: rules.test
        port: 8080
        protocol: rest
        enforcement: enforce
        rules:
          - allow: {method: GET, path: "/repos/*/issues"}
          - allow: {method: GET, path: /download, query: {tag: "v1.*"}}
          - allow: {method: GET, path: /multi, query: {tag: {any: ["a-*", "b-*"]}}}
        deny_rules:
          - method: GET
            path: /download
            query: {tag: "*-rc*"}
    binaries: [{path: /bin/probe}]
  api_audit:
    endpoints:
      - {host: audit.test, port: 8080, protocol: rest, access: read-only}
    binaries: [{path: /bin/probe}]
  scoped:
    endpoints:
      - {host: s.test, port: 8080, protocol: rest, enforcement: enforce, access: read-only, path: "/v1/**"}
      - {host: s.test, port: 8080, protocol: rest, enforcement: enforce, access: full, path: "/v1/admin/**"}
    binaries: [{path: /bin/probe}]
  nomethod:
    endpoints:
      - host: nomethod.test
        port: 8080
        protocol: rest
        enforcement: enforce
        rules:
          - allow: {path: "/**"}
          - allow: {}
    binaries: [{path: /bin/probe}]
  rw:
    endpoints:
      - {host: rw.test, port: 8080, protocol: rest, enforcement: enforce, access: read-write}
    binaries: [{path: /bin/probe}]
"#;

fn caller() -> Caller {
    Caller {
        pid: 1,
        exe: "/bin/probe".into(),
        ancestors: vec![],
        cmdline_paths: vec![],
        exec: ExecKey(1),
        ..Default::default()
    }
}

fn verdict(rules: &NetworkRules, host: &str, method: &str, target: &str) -> Verdict {
    let c = canonicalize(target, false).unwrap();
    let q = query_params(c.query.as_deref());
    let compiled = CompiledRules::compile(rules);
    let scope = L7Scope::of(&compiled, host, 8080, &caller());
    assert!(!scope.is_empty());
    scope.evaluate(&RequestView {
        method,
        path: &c.path,
        query: &q,
    })
}

fn kind(v: &Verdict) -> &'static str {
    match v {
        Verdict::Allow { .. } => "allow",
        Verdict::Audit { .. } => "audit",
        Verdict::Deny { .. } => "deny",
    }
}

#[test]
fn rest_rules_presets_denies_queries_and_scopes() {
    let rules = NetworkRules::compile(&from_yaml(P2).unwrap().network_policies).unwrap();
    let cases = [
        ("api.test", "GET", "/any", "allow"),
        ("api.test", "HEAD", "/any", "allow"),
        ("api.test", "OPTIONS", "/any", "allow"),
        ("api.test", "POST", "/x", "deny"),
        ("api.test", "DELETE", "/x", "deny"),
        ("api.test", "GET", "/admin/users", "deny"),
        ("rules.test", "GET", "/repos/a/issues", "allow"),
        ("rules.test", "HEAD", "/repos/a/issues", "allow"),
        ("rules.test", "GET", "/repos/a/b/issues", "deny"),
        ("rules.test", "GET", "/download?tag=v1.2", "allow"),
        ("rules.test", "GET", "/download?tag=v1.2&tag=v2", "deny"),
        ("rules.test", "GET", "/download?tag=v1.0-rc1", "deny"),
        ("rules.test", "GET", "/download", "deny"),
        ("rules.test", "GET", "/multi?tag=b-x", "allow"),
        ("rules.test", "get", "/multi?tag=a-x", "allow"),
        ("audit.test", "POST", "/x", "audit"),
        ("audit.test", "GET", "/x", "allow"),
        ("s.test", "GET", "/v1/x", "allow"),
        ("s.test", "POST", "/v1/x", "deny"),
        ("s.test", "POST", "/v1/admin/x", "allow"),
        ("s.test", "GET", "/v2/x", "deny"),
        ("rw.test", "PATCH", "/x", "allow"),
        ("rw.test", "DELETE", "/x", "deny"),
        // A clause without a method never matches (and a proto rule without `allow` is one).
        ("nomethod.test", "GET", "/x", "deny"),
        ("nomethod.test", "POST", "/", "deny"),
    ];
    for (host, m, t, want) in cases {
        let v = verdict(&rules, host, m, t);
        assert_eq!(kind(&v), want, "{host} {m} {t}: {v:?}");
    }
    assert_eq!(
        verdict(&rules, "api.test", "GET", "/admin/users"),
        Verdict::Deny {
            rule: "api_ro".into(),
            reason: "GET /admin/users blocked by deny rule".into()
        }
    );
    assert_eq!(
        verdict(&rules, "api.test", "POST", "/x"),
        Verdict::Deny {
            rule: "api_ro".into(),
            reason: "POST /x not permitted by policy".into()
        }
    );
    assert_eq!(
        verdict(&rules, "s.test", "GET", "/v2/x"),
        Verdict::Deny {
            rule: "scoped".into(),
            reason: "no L7 endpoint path matched request".into()
        }
    );
}

#[test]
fn endpoint_path_scopes() {
    assert!(scope_matches("", "/x"));
    assert!(scope_matches("/**", "/x"));
    assert!(scope_matches("/v1/**", "/v1"));
    assert!(scope_matches("/v1/**", "/v1/a/b"));
    assert!(!scope_matches("/v1/**", "/v10"));
    assert!(
        scope_matches("/v1/*", "/v1/chat/messages"),
        "* crosses / in scopes"
    );
}

#[test]
fn other_l7_protocols_are_refused_naming_the_key() {
    let ws = "version: 1\nnetwork_policies:\n  k:\n    endpoints:\n      - {host: a.test, port: 80, protocol: websocket, access: read-write}\n    binaries: [{path: /bin/x}]\n";
    assert!(NetworkRules::compile(&from_yaml(ws).unwrap().network_policies).is_ok());
    for p in ["graphql", "json-rpc", "mcp", "sql"] {
        let y = format!(
            "version: 1\nnetwork_policies:\n  k:\n    endpoints:\n      - {{host: a.test, port: 80, protocol: {p}, rules: [{{allow: {{method: GET, path: /x}}}}]}}\n    binaries: [{{path: /bin/x}}]\n"
        );
        let e = NetworkRules::compile(&from_yaml(&y).unwrap().network_policies).unwrap_err();
        assert_eq!(
            e.key, "network_policies.k.endpoints[0].protocol",
            "{p}: {e}"
        );
        assert!(
            e.message
                .contains(&format!("protocol '{p}' is not supported")),
            "{e}"
        );
    }
}

fn store() -> Credentials {
    let mut c = Credentials::new(7, &"ab".repeat(32));
    c.insert(
        "GITHUB_TOKEN",
        "ghp_real".into(),
        vec![Binding::new("API.test", 443)],
    );
    c
}

#[test]
fn placeholders_resolve_only_for_their_endpoint() {
    let c = store();
    let p = "openshell:resolve:env:GITHUB_TOKEN";
    assert_eq!(
        c.rewrite(p, "api.test", 443).unwrap().as_deref(),
        Some("ghp_real")
    );
    assert_eq!(
        c.rewrite_header(&format!("Bearer {p}"), "api.test", 443)
            .unwrap()
            .as_deref(),
        Some("Bearer ghp_real")
    );
    for form in [
        "openshell:resolve:env:v7_GITHUB_TOKEN".to_string(),
        format!("openshell:resolve:env:s{}_GITHUB_TOKEN", "AB".repeat(32)),
    ] {
        assert_eq!(
            c.rewrite(&form, "api.test", 443).unwrap().as_deref(),
            Some("ghp_real")
        );
    }
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let basic = format!("Basic {}", b64.encode(format!("x:{p}")));
    assert_eq!(
        c.rewrite_header(&basic, "api.test", 443).unwrap(),
        Some(format!("Basic {}", b64.encode("x:ghp_real")))
    );
    assert_eq!(
        c.rewrite(p, "other.test", 443),
        Err(CredentialError::NotBound {
            key: "GITHUB_TOKEN".into(),
            dest: "other.test:443".into()
        })
    );
    assert_eq!(
        c.rewrite("openshell:resolve:env:NOPE", "api.test", 443),
        Err(CredentialError::Unresolvable("NOPE".into()))
    );
    assert!(
        c.rewrite("openshell:resolve:env:v8_GITHUB_TOKEN", "api.test", 443)
            .is_err()
    );
    assert!(
        c.rewrite("openshell:resolve:env:", "api.test", 443)
            .is_err()
    );
    assert_eq!(c.rewrite("plain", "api.test", 443), Ok(None));
    assert_eq!(redact(&format!("/u/{p}/x")), "/u/[CREDENTIAL]/x");
    assert!(!format!("{c:?}").contains("ghp_real"));
    assert_eq!(
        c.child_env(),
        vec![("GITHUB_TOKEN".to_string(), p.to_string())]
    );
    assert!(c.is_credentialed("api.test", 443));
    assert!(!c.is_credentialed("api.test", 80));
}

#[test]
fn body_scan_finds_a_marker_split_across_frames() {
    let mut tail = Vec::new();
    assert!(!super::body::scan(&mut tail, b"xx openshell:res"));
    assert!(super::body::scan(&mut tail, b"olve:env:K"));
    let mut tail = Vec::new();
    assert!(!super::body::scan(&mut tail, b"openshell:resolve:en"));
    assert!(!super::body::scan(&mut tail, b"x:K"));
}
