//! Compile `proto/openshell.proto` and `proto/sandbox.proto` with protox (a pure-Rust protobuf
//! compiler), so building needs no `protoc` on the machine; and record the commit and the
//! build profile for `--version`.

use std::process::Command;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/openshell.proto", "proto/sandbox.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    version_facts();
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Relay payloads are forwarded untouched; `Bytes` avoids a copy per frame.
        .bytes(".openshell.v1.RelayFrame")
        .bytes(".openshell.v1.ExecSandboxStdout")
        .bytes(".openshell.v1.ExecSandboxStderr")
        .compile_fds(fds)?;
    Ok(())
}

/// `OSB_GIT_COMMIT` (the short hash of HEAD, `unknown` outside a git checkout) and
/// `OSB_BUILD_PROFILE` (cargo's profile: `debug` or `release`).
fn version_facts() {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).output().ok()?;
        let s = String::from_utf8(out.stdout).ok()?.trim().to_owned();
        (out.status.success() && !s.is_empty()).then_some(s)
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=OSB_GIT_COMMIT={commit}");
    // Rebuild when HEAD moves: HEAD itself (a branch switch), the branch's ref (a commit) and
    // packed-refs. `--git-path` also finds them in a worktree, where `.git` is a file.
    let mut watch = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.push(branch);
    }
    for p in watch {
        // Only existing files: cargo reruns a build script on every build while a watched
        // path is missing (packed-refs often is).
        if let Some(path) = git(&["rev-parse", "--git-path", &p])
            && std::path::Path::new(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let profile = std::env::var("PROFILE").unwrap_or_else(|_| "unknown".into());
    println!("cargo:rustc-env=OSB_BUILD_PROFILE={profile}");
}
