//! The `sftp` subsystem through the real binary, with OpenSSH's `sftp` in batch mode over a
//! relay of the test gateway: served by our own binary as a sandboxed exec, so it needs
//! nothing in the image and is confined like any exec.

mod support;

use std::path::Path;
use std::process::{Output, Stdio};

use support::ssh_bridge::{SshBridge, have_openssh};
use support::text;
use support::*;

/// Run `sftp -b batch sandbox`.
async fn sftp_batch(bridge: SshBridge, batch: String) -> (Output, SshBridge) {
    tokio::task::spawn_blocking(move || {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("batch");
        std::fs::write(&file, batch).unwrap();
        let out = bridge
            .command("sftp")
            .arg("-b")
            .arg(&file)
            .arg("sandbox")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (out, bridge)
    })
    .await
    .unwrap()
}

fn pseudo_random(n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sftp_put_get_ls_rename() {
    if !require(have_openssh(), "OpenSSH client (sftp) and busybox") {
        return;
    }
    let (gw, sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let bridge = SshBridge::start(gw.state.clone()).await;
    let local = tempfile::tempdir().unwrap();
    let data = pseudo_random(3 * 1024 * 1024 + 17, 7);
    let src = local.path().join("in.bin");
    std::fs::write(&src, &data).unwrap();
    let back = local.path().join("back.bin");
    let batch = format!(
        "put {} in.bin\nget in.bin {}\nls -1\nrename in.bin moved.bin\nls -1\nmkdir sub\nrmdir sub\n",
        path_str(&src),
        path_str(&back)
    );
    let (out, _bridge) = sftp_batch(bridge, batch).await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}\nsupervisor:\n{}",
        sup.log()
    );
    assert!(
        std::fs::read(&back).unwrap() == data,
        "get returned different bytes"
    );
    assert!(std::fs::read(sup.workdir.join("moved.bin")).unwrap() == data);
    assert!(!sup.workdir.join("in.bin").exists());
    // The first listing shows in.bin, the second moved.bin.
    let first = stdout.find("in.bin").expect(&stdout);
    let second = stdout.find("moved.bin").expect(&stdout);
    assert!(first < second, "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sftp_outside_the_grants_is_refused() {
    if !require(have_openssh(), "OpenSSH client (sftp) and busybox")
        || !require(
            is_root(),
            "root (Landlock is enforced only without --allow-degraded)",
        )
    {
        return;
    }
    let (gw, sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let mut bridge = SshBridge::start(gw.state.clone()).await;
    let local = tempfile::tempdir().unwrap();
    let src = local.path().join("x");
    std::fs::write(&src, b"x").unwrap();
    let target = format!("/etc/osb-sftp-{}", rand_suffix());
    // Our own binary, outside every grant: not readable by path from the sandbox, which
    // is why the sftp server is exec'd from an fd.
    let bin = Path::new(BIN).canonicalize().unwrap();
    // In the view /etc is a read-only mount (EROFS, which sftp reports as "Failure", as
    // OpenSSH's server does), and the binary and the key lie outside every grant, so they do
    // not exist there.
    for (cmd, want) in [
        (format!("put {} {target}", path_str(&src)), "Failure"),
        (
            format!(
                "get {} {}",
                path_str(&bin),
                path_str(&local.path().join("bin"))
            ),
            "not found",
        ),
        (
            format!(
                "get {} {}",
                path_str(&gw.client.key),
                path_str(&local.path().join("key"))
            ),
            "not found",
        ),
    ] {
        let (out, b) = sftp_batch(bridge, format!("{cmd}\n")).await;
        bridge = b;
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{cmd}: {err}");
        assert!(err.contains(want), "{cmd}: {err}\n{}", sup.log());
    }
    assert!(!Path::new(&target).exists());
    assert!(
        !local.path().join("bin").exists()
            || std::fs::metadata(local.path().join("bin")).unwrap().len() == 0
    );
    // And from an ordinary exec, the same.
    let r = gw.exec(&["head", "-c", "4", &path_str(&bin)]).await;
    assert_eq!(r.exit, Some(1), "{r:?}");
    assert!(r.err().contains("No such file"), "{r:?}");
}

/// `ssh -T -o RequestTTY=no sandbox CMD` as the CLI's upload and download run it
///, with `stdin` as the command's stdin.
async fn ssh_exec(bridge: SshBridge, cmd: String, stdin: Vec<u8>) -> (Output, SshBridge) {
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = bridge
            .command("ssh")
            .args(["-T", "-o", "RequestTTY=no", "sandbox"])
            .arg(&cmd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut w = child.stdin.take().unwrap();
        let feeder = std::thread::spawn(move || {
            let _ = w.write_all(&stdin);
        });
        let out = child.wait_with_output().unwrap();
        feeder.join().unwrap();
        (out, bridge)
    })
    .await
    .unwrap()
}

/// Single-quote for sh, as the CLI's shell_escape does.
fn q(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Every entry under `root`: relative path, then the file's bytes, `->target` for a
/// symlink, or `/` for a directory; sorted.
fn tree(root: &Path) -> Vec<(String, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.file_type().is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.push((rel, format!("->{}", t.display()).into_bytes()));
            } else if m.is_dir() {
                out.push((rel, b"/".to_vec()));
                walk(root, &p, out);
            } else {
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

fn local_tar(args: &[&str], stdin: Option<&[u8]>) -> Vec<u8> {
    use std::io::Write;
    let mut c = std::process::Command::new("tar")
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(b) = stdin {
        c.stdin.take().unwrap().write_all(b).unwrap();
    }
    let out = c.wait_with_output().unwrap();
    assert!(out.status.success(), "tar {args:?}");
    out.stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tar_upload_and_download_are_byte_exact() {
    if !require(have_openssh(), "OpenSSH client (ssh) and busybox") {
        return;
    }
    let (gw, sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let mut bridge = SshBridge::start(gw.state.clone()).await;
    // A tree with binary files (every byte value, NULs, no trailing newline), an empty
    // file, a nested directory, a name with a space and a quote, and a symlink.
    let local = tempfile::tempdir().unwrap();
    let src = local.path().join("proj");
    std::fs::create_dir_all(src.join("sub dir/deeper")).unwrap();
    std::fs::write(
        src.join("all-bytes.bin"),
        (0..=255u8).cycle().take(70_000).collect::<Vec<_>>(),
    )
    .unwrap();
    std::fs::write(
        src.join("sub dir/big.bin"),
        pseudo_random(2 * 1024 * 1024 + 3, 11),
    )
    .unwrap();
    std::fs::write(src.join("sub dir/deeper/it's.txt"), b"no newline").unwrap();
    std::fs::write(src.join("empty"), b"").unwrap();
    std::os::unix::fs::symlink("sub dir/big.bin", src.join("link")).unwrap();
    let want = tree(&src);

    // Upload: the directory wrapped under its basename, streamed on stdin, then EOF.
    let dest = "up load";
    let tarball = local_tar(&["cf", "-", "-C", &path_str(local.path()), "proj"], None);
    let cmd = format!("mkdir -p {} && cat | tar xf - -C {}", q(dest), q(dest));
    let (out, b) = ssh_exec(bridge, cmd, tarball).await;
    bridge = b;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        text(&out.stderr),
        sup.log()
    );
    assert_eq!(tree(&sup.workdir.join(dest).join("proj")), want);

    // Download step 1: the workspace root, then the resolved source under it.
    let path = format!("{dest}/proj");
    let (out, b) = ssh_exec(
        bridge,
        format!("pwd -P && realpath -e -- {}", q(&path)),
        vec![],
    )
    .await;
    bridge = b;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let root = sup.workdir.canonicalize().unwrap();
    let resolved = root.join(&path);
    assert_eq!(
        text(&out.stdout),
        format!("{}\n{}\n", path_str(&root), path_str(&resolved))
    );
    // A missing source: realpath -e fails, and nothing but its complaint comes back.
    let (out, b) = ssh_exec(
        bridge,
        format!("pwd -P && realpath -e -- {}", q("nope")),
        vec![],
    )
    .await;
    bridge = b;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stdout), format!("{}\n", path_str(&root)));

    // Step 2: the probe.
    for (p, kind) in [
        (resolved.clone(), "dir"),
        (resolved.join("all-bytes.bin"), "file"),
        (resolved.join("missing"), "missing"),
    ] {
        let p = q(&path_str(&p));
        let probe = format!(
            "if [ -d {p} ]; then printf dir; elif [ -e {p} ]; then printf file; else printf missing; fi"
        );
        let (out, b) = ssh_exec(bridge, probe, vec![]).await;
        bridge = b;
        assert_eq!(
            (out.status.code(), text(&out.stdout)),
            (Some(0), kind.to_string())
        );
    }

    // Step 3, a directory: `tar cf - -C <path> .`, untarred locally.
    let (out, b) = ssh_exec(
        bridge,
        format!("tar cf - -C {} .", q(&path_str(&resolved))),
        vec![],
    )
    .await;
    bridge = b;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let got = local.path().join("down");
    std::fs::create_dir(&got).unwrap();
    local_tar(&["xf", "-", "-C", &path_str(&got)], Some(&out.stdout));
    assert_eq!(tree(&got), want);

    // Step 3, a file: `tar cf - -C <parent> -- <name>`.
    let parent = resolved.join("sub dir");
    let (out, _b) = ssh_exec(
        bridge,
        format!("tar cf - -C {} -- {}", q(&path_str(&parent)), q("big.bin")),
        vec![],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let one = local.path().join("one");
    std::fs::create_dir(&one).unwrap();
    local_tar(&["xf", "-", "-C", &path_str(&one)], Some(&out.stdout));
    assert!(std::fs::read(one.join("big.bin")).unwrap() == pseudo_random(2 * 1024 * 1024 + 3, 11));
}

// Child environment (.3-): what every SSH child, sftp and tar
// included, is started with.

/// The child environment of an exec, once `ready` says the provider environment has arrived
/// (it is fetched in the background after start-up).
async fn child_env(gw: &TestGateway, ready: &str) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let r = gw.exec(&["env"]).await;
        assert_eq!(r.exit, Some(0), "{r:?}");
        if r.out().lines().any(|l| l.starts_with(ready)) {
            return r.out();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {ready} in:\n{}",
            r.out()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

async fn with_provider_env(opts: SupOpts) -> (TestGateway, Supervisor) {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    *gw.state.provider_env.lock().unwrap() = gateway::ProviderEnv {
        environment: [
            ("API_URL", "https://api.example"),
            ("API_KEY", "sk-secret-value"),
            ("STATIC_TOKEN", "static-secret"),
            ("HOME", "/provider-home"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        non_secret: vec!["API_URL".into(), "HOME".into()],
        static_keys: vec!["STATIC_TOKEN".into()],
        ..Default::default()
    };
    let mut sup = Supervisor::start(&gw, opts);
    gw.wait_ready(&mut sup).await;
    (gw, sup)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_env_gives_children_placeholders_for_secrets() {
    let user_env = r#"{"FOO":"bar","HOME":"/user-home","OPENSHELL_INTERNAL":"no"}"#;
    let opts = SupOpts {
        env: vec![("OPENSHELL_USER_ENVIRONMENT".into(), user_env.into())],
        ..Default::default()
    };
    let (gw, _sup) = with_provider_env(opts).await;
    let env = child_env(&gw, "API_URL=").await;
    let has = |l: &str| env.lines().any(|x| x == l);
    assert!(has("API_URL=https://api.example"), "{env}");
    assert!(has("FOO=bar"), "{env}");
    assert!(has("OPENSHELL_SANDBOX=1"), "{env}");
    // Provider env is the last step, over the user environment, over the defaults.
    assert!(has("HOME=/provider-home"), "{env}");
    // Secrets stay in the supervisor's proxy: children hold OpenShell's placeholders.
    assert!(has("API_KEY=openshell:resolve:env:API_KEY"), "{env}");
    assert!(
        has("STATIC_TOKEN=openshell:resolve:env:STATIC_TOKEN"),
        "{env}"
    );
    assert!(
        !env.contains("sk-secret-value") && !env.contains("static-secret"),
        "{env}"
    );
    assert!(!env.contains("OPENSHELL_INTERNAL"), "{env}");
    let req = gw.state.seen().provider_env_requests;
    assert!(!req.is_empty());
    assert!(
        req.iter()
            .all(|r| r.sandbox_id == SANDBOX_ID && r.supports_static_credential_bindings)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_secrets_only_with_the_opt_in() {
    let opts = SupOpts {
        env: vec![("OPENSHELL_EXPOSE_PROVIDER_SECRETS".into(), "1".into())],
        ..Default::default()
    };
    let (gw, sup) = with_provider_env(opts).await;
    let env = child_env(&gw, "API_URL=").await;
    let has = |l: &str| env.lines().any(|x| x == l);
    assert!(has("API_KEY=sk-secret-value"), "{env}");
    assert!(has("STATIC_TOKEN=static-secret"), "{env}");
    assert!(
        sup.log()
            .contains("provider secrets are passed to children"),
        "{}",
        sup.log()
    );
    assert!(
        gw.state
            .seen()
            .provider_env_requests
            .iter()
            .all(|r| r.supports_static_credential_bindings)
    );
}
