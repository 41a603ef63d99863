//! What the tests of who is calling share: the hostile child built into a workdir, a policy
//! with one `holder` rule, `run --policy` through the real binary, and the answers the child
//! printed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::binary::*;
use super::{World, require};

pub const SLEEP: &str = "/usr/bin/sleep";

/// One rule, `holder`, for pub.test:8080 with these `binaries` entries.
pub fn policy(binaries: &str) -> String {
    with_rules(&format!(
        "  holder:\n    endpoints:\n      - host: pub.test\n        port: 8080\n    binaries:\n{binaries}"
    ))
}

/// The workdir of one run, with `policy.yaml` and the hostile child built into it.
pub fn workdir(w: &World, yaml: &str) -> PathBuf {
    let work = w.tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("policy.yaml"), yaml).unwrap();
    cc(
        &support_file("hostile.c"),
        &work.join("hostile"),
        &["-pthread"],
    );
    work
}

/// `run --policy policy.yaml -- ARGS` (not started), logging the egress decisions.
pub fn run_command(w: &World, work: &Path, args: &[&str]) -> Command {
    run_command_with(w, work, &[], args)
}

/// `run FLAGS --policy policy.yaml -- ARGS` (not started).
pub fn run_command_with(w: &World, work: &Path, flags: &[&str], args: &[&str]) -> Command {
    let mut c = osb(&w.hosts, work);
    c.args(["run", "--log-level", "warn,egress=debug"])
        .args(flags)
        .args(["--policy", "policy.yaml", "--"])
        .args(args);
    c
}

/// `run --policy policy.yaml -- ARGS`, its stdout and stderr.
pub fn run(w: &World, work: &Path, args: &[&str]) -> (String, String) {
    let out = finish(run_command(w, work, args), Duration::from_secs(120));
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Each answer the hostile child printed: (status line, the JSON body when refused).
pub fn answers(stdout: &str) -> Vec<(String, Option<serde_json::Value>)> {
    let mut out: Vec<(String, Option<serde_json::Value>)> = Vec::new();
    for l in stdout.lines() {
        if let Some(b) = l.strip_prefix("BODY ") {
            if let Some(last) = out.last_mut() {
                last.1 = serde_json::from_str(b).ok();
            }
        } else {
            out.push((l.to_string(), None));
        }
    }
    out
}

pub fn reason(a: &(String, Option<serde_json::Value>)) -> String {
    assert_eq!(a.0, "HTTP/1.1 403 Forbidden", "{a:?}");
    let b = a.1.as_ref().expect("a JSON refusal");
    assert_eq!(b["error"], "policy_denied", "{b}");
    b["reason"].as_str().unwrap_or_default().to_string()
}

pub fn ready() -> bool {
    require() && have_path(SLEEP)
}

/// A shared object whose constructor announces itself: code the sandbox wrote, loaded into
/// an allowed binary.
const EVIL_C: &str = "#include <stdio.h>\n__attribute__((constructor)) static void hi(void) { fputs(\"injected\\n\", stderr); }\n";

pub fn evil_so(work: &Path) -> PathBuf {
    let src = work.join("evil.c");
    std::fs::write(&src, EVIL_C).unwrap();
    let so = work.join("evil.so");
    cc(&src, &so, &["-shared", "-fPIC"]);
    so
}

/// The lines of `sh -c SCRIPT` run in the sandbox, each a JSON body (the upstream's echo of
/// the request, or the proxy's refusal).
pub fn json_lines(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// A policy of `rules` (the `network_policies` entries, indented by two).
pub fn with_rules(rules: &str) -> String {
    format!(
        "version: 1
filesystem_policy:
  include_workdir: true
  read_only: [/usr, /lib, /lib64, /bin, /etc]
  read_write: [/tmp, /dev/null]
network_policies:
{rules}"
    )
}
