//! A supervisor invocation with no gateway configured (no OPENSHELL_ENDPOINT) runs nothing and
//! changes nothing: it exits 125 and suggests `openshell-sandbox run` with the same arguments,
//! the mistake of someone who forgot the word `run`. Through the real binary.

mod support;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use support::BIN;
use support::text;

/// The binary with `args` and `env` only (no gateway variables), in `cwd`.
fn bare(cwd: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = Command::new(BIN);
    c.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

#[test]
fn a_forgotten_run_word_runs_nothing_and_suggests_run() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let workdir = dir.path().join("not-yet");
    let cmd = format!("echo hi > {}", marker.display());
    let out = bare(
        dir.path(),
        &[],
        &[
            "--timeout",
            "5",
            "--workdir",
            workdir.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &cmd,
        ],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("no gateway is configured"), "{err}");
    assert!(err.contains("OPENSHELL_ENDPOINT"), "{err}");
    let suggested = format!(
        "`openshell-sandbox run --timeout 5 --workdir {} -- sh -c '{cmd}'`",
        workdir.display()
    );
    assert!(err.contains(&suggested), "{suggested}\n{err}");
    assert!(out.stdout.is_empty());
    assert!(!marker.exists(), "the command ran");
    assert!(!workdir.exists(), "the supervisor made its workdir");
    // The default workdir (/sandbox) is not made either.
    if !Path::new("/sandbox").exists() {
        let out = bare(dir.path(), &[], &["--", "true"]);
        assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
        assert!(!Path::new("/sandbox").exists(), "/sandbox was created");
    }
}

/// A main process given by the environment, as a pod gives it, is refused the same way; the
/// suggestion carries its command.
#[test]
fn a_main_process_from_the_environment_without_a_gateway_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (var, value) in [
        (
            "OPENSHELL_MAIN_PROCESS_SPEC",
            r#"{"version":1,"command":["sh","-c","echo hi there"]}"#,
        ),
        ("OPENSHELL_SANDBOX_COMMAND", "sleep 30"),
    ] {
        let out = bare(dir.path(), &[(var, value)], &[]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{var}: {err}");
        let want = if var == "OPENSHELL_SANDBOX_COMMAND" {
            "`openshell-sandbox run -- sleep 30`"
        } else {
            "`openshell-sandbox run -- sh -c 'echo hi there'`"
        };
        assert!(err.contains(want), "{var}: {err}");
        assert!(err.contains("--no-gateway"), "{err}");
    }
    // `serve` named explicitly, too.
    let out = bare(dir.path(), &[], &["serve", "true"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("`openshell-sandbox run true`"), "{err}");
}
