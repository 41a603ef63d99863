//! Where the real tools the egress tests run live (curl, python3, git's HTTPS helper, node),
//! and the loud skip when one is absent.

use std::path::PathBuf;
use std::process::Command;

/// The kernel's path of a program found on PATH.
pub fn real_path(program: &str) -> Option<PathBuf> {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .ok()?;
    let p = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!p.is_empty())
        .then(|| std::fs::canonicalize(p).ok())
        .flatten()
}

pub fn python() -> Option<PathBuf> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys,os;print(os.path.realpath(sys.executable))",
        ])
        .output()
        .ok()?;
    let p = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    p.is_file().then_some(p)
}

/// git runs HTTPS through its `git-remote-https` helper, the process that connects.
pub fn git_http() -> Option<PathBuf> {
    let out = Command::new("git").arg("--exec-path").output().ok()?;
    let dir = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    std::fs::canonicalize(dir.join("git-remote-https")).ok()
}

pub fn need(name: &str, p: Option<PathBuf>) -> Option<PathBuf> {
    if p.is_none() {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!(
                "required for this test but absent: {name} (CI=true turns this skip into a failure)"
            );
        }
        eprintln!("SKIPPED: {name} is not installed");
    }
    p
}
