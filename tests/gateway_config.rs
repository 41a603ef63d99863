//! Startup configuration through the real binary: bad or missing settings are clear errors
//! naming the variable, and log formats work.

mod support;

use std::process::Command;

use support::*;

fn run(env: &[(&str, &str)], args: &[&str]) -> (i32, String) {
    let mut cmd = Command::new(BIN);
    cmd.env_clear().env("PATH", "/usr/bin:/bin").args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn endpoint_without_sandbox_id_names_the_variable() {
    let (code, err) = run(
        &[("OPENSHELL_ENDPOINT", "https://gw:8080")],
        &["--workdir", "/tmp"],
    );
    assert_ne!(code, 0);
    assert!(err.contains("OPENSHELL_SANDBOX_ID"), "{err}");
}

#[test]
fn bad_endpoint_names_the_variable() {
    let (code, err) = run(
        &[
            ("OPENSHELL_ENDPOINT", "ftp://gw"),
            ("OPENSHELL_SANDBOX_ID", "x"),
        ],
        &["--workdir", "/tmp"],
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("OPENSHELL_ENDPOINT") && err.contains("scheme"),
        "{err}"
    );
}

#[test]
fn bad_main_process_spec_names_the_variable() {
    let (code, err) = run(
        &[(
            "OPENSHELL_MAIN_PROCESS_SPEC",
            r#"{"version":9,"command":["x"]}"#,
        )],
        &["--workdir", "/tmp"],
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("OPENSHELL_MAIN_PROCESS_SPEC") && err.contains("version 9"),
        "{err}"
    );
}

#[test]
fn nothing_to_do_is_an_error() {
    let (code, err) = run(&[], &["--workdir", "/tmp"]);
    assert_ne!(code, 0);
    assert!(err.contains("OPENSHELL_ENDPOINT"), "{err}");
}

#[test]
fn bad_user_environment_names_the_variable() {
    let (code, err) = run(
        &[("OPENSHELL_USER_ENVIRONMENT", "[1,2]")],
        &["--no-gateway", "--workdir", "/tmp", "true"],
    );
    assert_ne!(code, 0);
    assert!(err.contains("OPENSHELL_USER_ENVIRONMENT"), "{err}");
}

/// `--no-gateway` runs the main process without an endpoint: its output on ours, our stdin its
/// input (its end passed on), and its exit code ours.
#[test]
fn main_process_only_runs_with_no_gateway_and_exits_with_its_code() {
    let wd = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        wd.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let mut args = vec!["--no-gateway", "--workdir", wd.path().to_str().unwrap()];
    if !is_root() {
        args.push("--allow-degraded");
    }
    args.extend(["sh", "-c", "echo out; echo err >&2; cat; exit 4"]);
    let mut child = Command::new(BIN)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .args(&args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"from stdin\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\nfrom stdin\n");
    assert!(err.lines().any(|l| l == "err"), "{err}");
    // With an endpoint as well, the flag contradicts the configuration.
    let (code, err) = run(
        &[("OPENSHELL_ENDPOINT", "https://gw:8080")],
        &["--no-gateway", "--workdir", "/tmp", "true"],
    );
    assert_eq!(code, 125, "{err}");
    assert!(err.contains("--no-gateway"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs() {
    let (gw, sup) = up(
        AuthMode::Jwt,
        SupOpts {
            args: vec!["--log-format".into(), "json".into()],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(gw.sh("echo j").await.out(), "j\n");
    let log = sup.log();
    let lines: Vec<_> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty());
    for l in lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        assert!(v.get("level").is_some(), "{l}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_bash_commands_run_under_sh() {
    let gw0 = TestGateway::start(AuthMode::Jwt).await;
    // A PATH holding only `sh`: no bash to be found, as in Alpine-style images.
    let bin = gw0.dir.path().join("nobash-bin");
    std::fs::create_dir(&bin).unwrap();
    let sh = ["/bin/sh", "/usr/bin/sh"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap();
    std::os::unix::fs::symlink(sh, bin.join("sh")).unwrap();
    let mut sup = Supervisor::start(
        &gw0,
        SupOpts {
            env: vec![("PATH".into(), bin.display().to_string())],
            // That PATH directory stands for the image's /bin: granted, as /bin is, so it
            // exists in the view's root.
            args: vec!["--ro".into(), bin.display().to_string()],
            ..Default::default()
        },
    );
    gw0.wait_ready(&mut sup).await;
    let r = gw0.exec(&["echo", "no bash here"]).await;
    assert_eq!(
        (r.out(), r.exit),
        ("no bash here\n".to_string(), Some(0)),
        "{r:?}\n{}",
        sup.log()
    );
    let r = gw0.exec(&["shopt", "-q", "login_shell"]).await;
    assert_eq!(r.exit, Some(127), "sh has no shopt: {r:?}");
}

/// Zombies of this host pid: children of `parent` in state Z.
fn zombie_children(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().to_string())
        };
        if field("PPid:").as_deref() == Some(&parent.to_string())
            && field("State:").is_some_and(|s| s.starts_with('Z'))
        {
            out.push(pid);
        }
    }
    out
}

#[test]
fn as_pid_1_orphaned_zombies_are_reaped() {
    if !require(is_root(), "a PID namespace (unshare --pid) needs root") {
        return;
    }
    remove_stale_pid1_cgroups();
    let wd = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        wd.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    // The main process leaves orphans that exit at once; as PID 1 they are ours to reap.
    let script = "for i in 1 2 3 4 5 6 7 8; do (sh -c 'exit 0' &); done; sleep 29.5";
    let mut child = Command::new("unshare")
        // SIGTERM, not SIGKILL, when unshare goes, so the supervisor cleans its cgroups up.
        .args(["--pid", "--fork", "--kill-child=SIGTERM"])
        .arg(BIN)
        .args(["--no-gateway", "--workdir", wd.path().to_str().unwrap()])
        .args(["sh", "-c", script])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The supervisor is unshare's child; find it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let sup = loop {
        let kids: Vec<u32> =
            std::fs::read_to_string(format!("/proc/{}/task/{}/children", child.id(), child.id()))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect();
        if let Some(p) = kids.first() {
            break *p;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "supervisor never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    // Wait for the orphans to have been created (the main process is then in `sleep`).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let cmdlines: Vec<String> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("cmdline")).ok())
            .collect();
        if cmdlines.iter().any(|c| c.starts_with("sleep\u{0}29.5")) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "main process never reached sleep"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Zombies may exist for an instant; they must not stay.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let z = zombie_children(sup);
        if z.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "zombies left unreaped under PID 1: {z:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::path::Path::new(&format!("/proc/{sup}")).exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "supervisor did not stop on SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The sandbox core names its cgroups after its pid, which is 1 in every PID namespace; a
/// supervisor that was SIGKILLed leaves `openshell-sandbox-1/exec-N` behind and the next one
/// fails with EEXIST (reported to the core's owner). Remove such leftovers; rmdir only
/// succeeds on empty cgroups, so nothing live is touched.
fn remove_stale_pid1_cgroups() {
    for root in [
        "/sys/fs/cgroup/pids",
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup",
    ] {
        let dir = std::path::Path::new(root).join("openshell-sandbox-1");
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with("exec-") {
                    let _ = std::fs::remove_dir(e.path());
                }
            }
        }
    }
}
