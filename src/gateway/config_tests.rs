//! Unit tests of `config.rs`: flags and env resolved into a checked `Config`.

use super::*;

fn args(extra: &[&str]) -> ServeArgs {
    let mut v = vec!["openshell-sandbox"];
    v.extend_from_slice(extra);
    ServeArgs::try_parse_from(v).unwrap()
}

#[test]
fn endpoint_forms() {
    assert_eq!(
        parse_endpoint("https://gw.example:8080").unwrap(),
        (true, "gw.example".into(), 8080)
    );
    assert_eq!(
        parse_endpoint("http://[::1]:9/").unwrap(),
        (false, "::1".into(), 9)
    );
    assert!(
        parse_endpoint("ftp://x")
            .unwrap_err()
            .to_string()
            .contains("scheme")
    );
    assert!(parse_endpoint("gw:80").is_err());
    assert!(
        parse_endpoint("http://gw:80/prefix")
            .unwrap_err()
            .to_string()
            .contains("path")
    );
}

#[test]
fn endpoint_without_sandbox_id_names_the_variable() {
    let err = args(&["--endpoint", "http://127.0.0.1:1"])
        .resolve()
        .unwrap_err();
    assert!(err.to_string().contains("OPENSHELL_SANDBOX_ID"), "{err}");
}

#[test]
fn token_sources_in_priority_order() {
    let a = args(&[
        "--endpoint",
        "https://h:1",
        "--sandbox-id",
        "s",
        "--sandbox-token-file",
        "/f",
        "--k8s-sa-token-file",
        "/sa",
    ]);
    assert_eq!(
        a.resolve().unwrap().gateway.unwrap().token,
        TokenSource::File("/f".into())
    );
    let a = args(&[
        "--endpoint",
        "https://h:1",
        "--sandbox-id",
        "s",
        "--k8s-sa-token-file",
        "/sa",
    ]);
    assert_eq!(
        a.resolve().unwrap().gateway.unwrap().token,
        TokenSource::ServiceAccount("/sa".into())
    );
}

#[test]
fn trailing_words_are_the_main_process() {
    let a = args(&["--no-gateway", "--workdir", "/tmp", "sleep", "infinity"]);
    assert_eq!(
        a.command,
        vec![OsString::from("sleep"), OsString::from("infinity")]
    );
    let cfg = a.resolve().unwrap();
    assert!(cfg.gateway.is_none());
    assert!(cfg.main.is_some());
}

/// Without a gateway and without --no-gateway nothing runs: the error carries the `run`
/// command line with the same words, each quoted for a shell where it needs it.
#[test]
fn a_main_process_without_a_gateway_suggests_run() {
    let words = ["--workdir", "/tmp", "--", "sh", "-c", "echo 'hi' $HOME"];
    let mut a = args(&words);
    a.raw_args = words.iter().map(OsString::from).collect();
    match a.resolve() {
        Err(ConfigError::NoGateway { run }) => assert_eq!(
            run,
            r#"openshell-sandbox run --workdir /tmp -- sh -c "echo 'hi' "'$HOME'"#
        ),
        other => panic!("{other:?}"),
    }
    // The main process from the environment's spec becomes the command.
    let mut a = args(&["--sandbox-command", "sleep infinity"]);
    a.raw_args = vec!["--sandbox-command".into(), "sleep infinity".into()];
    match a.resolve() {
        Err(ConfigError::NoGateway { run }) => assert_eq!(
            run,
            "openshell-sandbox run --sandbox-command 'sleep infinity' -- sleep infinity"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn secrets_are_denied() {
    let cfg = args(&["--no-gateway", "--sandbox-token-file", "/tok", "true"])
        .resolve()
        .unwrap();
    assert!(cfg.secret_paths.contains(&PathBuf::from("/tok")));
    assert!(
        cfg.secret_paths
            .contains(&PathBuf::from("/etc/openshell-tls/client/tls.key"))
    );
}

#[test]
fn only_the_combined_topology_is_accepted() {
    for ok in [
        "network,process",
        "process,network",
        " process , network ",
        "network,process,network",
    ] {
        assert_eq!(parse_mode(ok).unwrap(), "network,process", "{ok}");
    }
    for (bad, want) in [
        ("network", "`network` topology"),
        ("process", "`process` topology"),
        ("network-init", "`network-init` topology"),
        ("network-init,process", "`network-init` topology"),
        ("", "empty mode"),
        ("network,", "empty mode"),
        ("sidecar", "unknown mode `sidecar`"),
    ] {
        assert!(parse_mode(bad).unwrap_err().contains(want), "{bad}");
    }
    assert!(
        refuse_role("isolation-backend")
            .unwrap_err()
            .contains("--role isolation-backend")
    );
}

fn with_token(endpoint: &str, extra: &[&str]) -> Result<GatewayConfig, ConfigError> {
    let mut v = vec![
        "--endpoint",
        endpoint,
        "--sandbox-id",
        "s",
        "--sandbox-token-file",
        "/f",
    ];
    v.extend_from_slice(extra);
    args(&v).resolve().map(|c| c.gateway.unwrap())
}

#[test]
fn a_token_over_plaintext_names_the_variable_and_the_risk() {
    let err = with_token("http://h:1", &[]).unwrap_err().to_string();
    for want in [
        ALLOW_PLAINTEXT_TOKEN,
        "--allow-plaintext-token",
        "OPENSHELL_SANDBOX_TOKEN_FILE",
        "http://h:1",
        "act as this sandbox's supervisor",
        "loopback",
    ] {
        assert!(err.contains(want), "{want:?} missing: {err}");
    }
    assert!(!err.contains("tests only"), "{err}");
    let allowed = with_token("http://h:1", &["--allow-plaintext-token"]).unwrap();
    assert!(!allowed.loopback_only, "the opt-in dials any address");
    // No token, nothing to protect: the v0.0.36 plaintext setup.
    let none = args(&["--endpoint", "http://h:1", "--sandbox-id", "s"])
        .resolve()
        .unwrap();
    assert!(!none.gateway.unwrap().loopback_only);
    // TLS protects the token.
    assert!(!with_token("https://h:1", &[]).unwrap().loopback_only);
}

#[test]
fn a_loopback_plaintext_endpoint_needs_no_opt_in_and_dials_only_loopback() {
    for ep in [
        "http://127.0.0.1:8080",
        "http://127.1.2.3:8080",
        "http://[::1]:8080",
        "http://[::ffff:127.0.0.1]:8080",
        "http://localhost:8080",
        "http://LOCALHOST:8080",
    ] {
        let g = with_token(ep, &[]).unwrap_or_else(|e| panic!("{ep}: {e}"));
        assert!(g.loopback_only, "{ep}");
    }
    // Sandboxed commands on the supervisor's own loopback could squat the port.
    let err = with_token("http://127.0.0.1:8080", &["--network", "all"]).unwrap_err();
    assert!(
        matches!(err, ConfigError::LoopbackTokenSharedNetwork(..)),
        "{err}"
    );
    assert!(
        with_token(
            "http://127.0.0.1:8080",
            &["--network", "all", "--allow-plaintext-token"]
        )
        .is_ok()
    );
    for ep in [
        "http://10.0.0.1:8080",
        "http://[::2]:8080",
        "http://[::ffff:10.0.0.1]:8080",
        "http://0.0.0.0:8080",
        "http://localhost.example:8080",
        "http://127.0.0.1.nip.io:8080",
        "http://host.docker.internal:8080",
    ] {
        assert!(
            matches!(with_token(ep, &[]), Err(ConfigError::PlaintextToken(..))),
            "{ep}"
        );
    }
}

#[test]
fn the_opt_in_takes_the_usual_boolean_spellings_and_refuses_others() {
    let parse = |v: &str| {
        ServeArgs::try_parse_from(["openshell-sandbox", &format!("--allow-plaintext-token={v}")])
    };
    for yes in ["1", "true", "yes", "on"] {
        assert!(parse(yes).unwrap().allow_plaintext_token, "{yes}");
    }
    for no in ["0", "false", "no", "off", ""] {
        assert!(!parse(no).unwrap().allow_plaintext_token, "{no}");
    }
    let err = parse("maybe").unwrap_err().to_string();
    assert!(
        err.contains("maybe") && err.contains(ALLOW_PLAINTEXT_TOKEN),
        "{err}"
    );
    // A bare flag is "yes", and does not swallow the main command after it.
    let a = args(&["--allow-plaintext-token", "sleep", "1"]);
    assert!(a.allow_plaintext_token);
    assert_eq!(
        a.command,
        vec![OsString::from("sleep"), OsString::from("1")]
    );
}

#[test]
fn user_environment_drops_internal_keys() {
    let env = parse_user_env(Some(r#"{"A":"1","OPENSHELL_X":"2"}"#)).unwrap();
    assert_eq!(env, vec![("A".to_string(), "1".to_string())]);
    assert!(parse_user_env(Some("[1]")).is_err());
}
