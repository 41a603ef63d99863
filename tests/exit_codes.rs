//! The exit-code table of `main.rs` (README.md, "Exit codes"), through the real binary: every
//! subcommand's failure exits with the code its kind has, not a blanket 1; `run` mirrors the
//! command's own code (128 + N for a signal, 127 for a command not found), and its bad input
//! gets 125 with a message that names the problem.

mod support;

use std::process::Command;

use support::{Workdir, run};

const BIN: &str = env!("CARGO_BIN_EXE_openshell-sandbox");

fn code(env: &[(&str, &str)], args: &[&str]) -> (Option<i32>, String) {
    let mut cmd = Command::new(BIN);
    cmd.env_clear().env("PATH", "/usr/bin:/bin").args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn serve_configuration_it_cannot_keep_is_a_usage_error() {
    // An endpoint without the sandbox id: the env is bad input, as a bad flag of run's is.
    let (c, err) = code(
        &[("OPENSHELL_ENDPOINT", "https://gw:8080")],
        &["serve", "--workdir", "/tmp"],
    );
    assert_eq!(c, Some(125), "{err}");
    assert!(err.contains("OPENSHELL_SANDBOX_ID"), "{err}");
    // An unknown flag of serve's, with and without the word.
    for args in [
        &["serve", "--workdri", "/tmp"][..],
        &["--workdri", "/tmp"][..],
    ] {
        let (c, err) = code(&[], args);
        assert_eq!(c, Some(125), "{args:?}: {err}");
    }
}

#[test]
fn install_and_certs_failures_exit_1_and_their_usage_errors_125() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no/such/dir");
    let (c, err) = code(&[], &["install", "--dest", missing.to_str().unwrap()]);
    assert_eq!(c, Some(1), "{err}");
    assert!(err.contains("install into"), "{err}");
    assert!(err.contains("does not exist"), "{err}");
    let (c, err) = code(&[], &["install", "--no-such-flag"]);
    assert_eq!(c, Some(125), "{err}");
    let (c, err) = code(
        &[],
        &[
            "certs",
            "generate",
            "--namespace",
            "Not_A_Name!",
            "--out-dir",
            dir.path().to_str().unwrap(),
        ],
    );
    assert_eq!(c, Some(1), "{err}");
    let (c, err) = code(&[], &["certs", "--no-such-flag"]);
    assert_eq!(c, Some(125), "{err}");
}

#[test]
fn run_keeps_its_own_codes() {
    let (c, err) = code(&[], &["run", "--no-such-flag", "true"]);
    assert_eq!(c, Some(125), "{err}");
    let (c, err) = code(&[], &["nosuchword"]);
    assert_eq!(c, Some(125), "{err}");
}

#[test]
fn exit_codes_mirror_the_child() {
    let wd = Workdir::new();
    let r = run(&wd, &["--allow-degraded"], &["sh", "-c", "kill -TERM $$"]);
    assert_eq!(r.code(), 128 + libc::SIGTERM);
    assert_eq!(r.reason(), "signaled");
    assert_eq!(r.report["signal"], libc::SIGTERM);
}

#[test]
fn bad_input_gets_a_clear_error_and_a_defined_code() {
    let wd = Workdir::new();
    let r = run(&wd, &["--allow-degraded"], &["no-such-command-xyz"]);
    assert_eq!(r.code(), 127);
    assert!(
        r.stderr()
            .contains("no-such-command-xyz: command not found"),
        "{}",
        r.stderr()
    );

    let cases: &[(&[&str], &str)] = &[
        (&["--workdir", "/no/such/dir"], "/no/such/dir"),
        (&["--memory", "-5"], "negative"),
        (&["--memory", "99999999999999999999999"], "64 bits"),
        (&["--pids", "0"], "at least 1"),
        (&["--timeout", "abc"], "not a number"),
        (&["--network", "maybe"], "maybe"),
        (&["--gid", "5"], "--gid was given without --uid"),
        (&["--env", "NOEQUALS"], "missing `=`"),
        (
            &["--inherit-env", "OPENSHELL_SANDBOX_TOKEN"],
            "never reach the sandbox",
        ),
    ];
    for (flags, needle) in cases {
        let out = std::process::Command::new(BIN)
            .arg("run")
            .args(*flags)
            .args(["--", "true"])
            .env_remove("OPENSHELL_SANDBOX_UID")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{flags:?}: {err}");
        assert!(
            err.contains(needle),
            "{flags:?}: expected {needle:?} in: {err}"
        );
    }
}
