//! `make demo` (scripts/demo.sh), as a new user runs it: it finds the binary where cargo says
//! it built it (any CARGO_TARGET_DIR), and it shows the sandbox at work: a write outside the
//! workdir refused, a listener on the machine's loopback answering outside the sandbox and
//! refused inside it, and (as root) one --allow-net host answering through the egress proxy in
//! a network namespace the demo makes, while another port and a direct connect are refused.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use support::text;
use support::{BIN, is_root, require, which};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/demo.sh");

fn demo(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new("bash");
    c.arg(SCRIPT).args(args).stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn line<'a>(out: &'a str, prefix: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no `{prefix}` line in:\n{out}"))
}

#[test]
fn the_demo_shows_refusals_that_would_succeed_outside() {
    if !require(which("python3"), "python3 (the demo's programs)") {
        return;
    }
    let out = demo(&[BIN], &[]);
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{o}\n{e}");
    assert!(
        line(&o, "outside the sandbox: http://127.0.0.1:").ends_with("/ answers"),
        "{o}"
    );
    assert!(line(&o, "workdir write:").contains("ok"), "{o}");
    assert!(
        line(&o, "outside write:").ends_with("refused, EROFS"),
        "{o}"
    );
    assert!(
        line(&o, "host loopback:").contains("refused, ECONNREFUSED"),
        "{o}"
    );
    assert!(!o.contains("ALLOWED"), "{o}");
    if !require(
        is_root() && which("unshare") && which("ip"),
        "root, unshare and ip (the demo's network namespace)",
    ) {
        return;
    }
    assert!(
        line(&o, "allowed host:").ends_with("-> 200 hello from 10.77.0.10"),
        "{o}\n{e}"
    );
    let other = line(&o, "other port:");
    assert!(
        other.contains("-> 403") && other.contains("policy_denied"),
        "{o}"
    );
    assert!(
        line(&o, "direct connect:").contains("refused, ENETUNREACH"),
        "{o}"
    );
}

/// Without a binary named, the demo builds the release binary and takes the executable cargo
/// names in its JSON messages: a stand-in cargo here reports one under a target directory of
/// its own choosing, as CARGO_TARGET_DIR makes the real one do.
#[test]
fn the_demo_finds_the_binary_where_cargo_put_it() {
    if !require(which("python3"), "python3 (the demo's programs)") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("elsewhere/release");
    std::fs::create_dir_all(&target).unwrap();
    let exe = target.join("openshell-sandbox");
    std::os::unix::fs::symlink(BIN, &exe).unwrap();
    let called = dir.path().join("called");
    let fake = dir.path().join("cargo");
    let msg = |name: &str, exe: &Path| {
        serde_json::json!({
            "reason": "compiler-artifact",
            "target": {"name": name},
            "executable": exe,
        })
        .to_string()
    };
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\necho \"$@\" > '{}'\necho 'Compiling openshell-sandbox' >&2\necho '{}'\necho '{}'\necho '{{\"reason\":\"build-finished\",\"success\":true}}'\n",
            called.display(),
            msg("build-script-build", Path::new("/nonexistent")),
            msg("openshell-sandbox", &exe),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = demo(&[], &[("CARGO", fake.to_str().unwrap())]);
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{o}\n{e}");
    let args = std::fs::read_to_string(&called).unwrap();
    assert!(args.contains("build --release"), "{args}");
    assert!(line(&o, "normal work:").contains("499999500000"), "{o}");
    // The Makefile's target is the script with no binary named.
    let make = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Makefile")).unwrap();
    let recipe = make
        .split("\ndemo:")
        .nth(1)
        .and_then(|r| r.lines().nth(1))
        .unwrap_or_default();
    assert!(
        recipe.contains("scripts/demo.sh") && !recipe.contains("target/"),
        "{recipe}"
    );
}
