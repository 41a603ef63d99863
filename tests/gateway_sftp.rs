//! The `sftp` subsystem through the real binary, with OpenSSH's `sftp` in batch mode over a
//! relay of the test gateway: served by our own binary as a sandboxed exec, so it needs
//! nothing in the image and is confined like any exec.

mod support;

use std::path::Path;
use std::process::{Output, Stdio};

use support::ssh_bridge::{SshBridge, have_openssh};
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

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
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
    for cmd in [
        format!("put {} {target}", path_str(&src)),
        format!(
            "get {} {}",
            path_str(&bin),
            path_str(&local.path().join("bin"))
        ),
        format!(
            "get {} {}",
            path_str(&gw.client.key),
            path_str(&local.path().join("key"))
        ),
    ] {
        let (out, b) = sftp_batch(bridge, format!("{cmd}\n")).await;
        bridge = b;
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{cmd}: {err}");
        assert!(
            err.contains("Permission denied"),
            "{cmd}: {err}\n{}",
            sup.log()
        );
    }
    assert!(!Path::new(&target).exists());
    assert!(
        !local.path().join("bin").exists()
            || std::fs::metadata(local.path().join("bin")).unwrap().len() == 0
    );
    // And from an ordinary exec, the same.
    let r = gw.exec(&["head", "-c", "4", &path_str(&bin)]).await;
    assert_eq!(r.exit, Some(1), "{r:?}");
    assert!(r.err().contains("Permission denied"), "{r:?}");
}
