//! `serve`: one view per sandbox, shared by the main process and every exec (its /tmp, IPC and
//! loopback), while each exec still has a PID namespace of its own. Through the test gateway,
//! as tests/gateway_exec.rs does.

use std::time::Duration;

use openshell_sandbox::proto::v1::exec_sandbox_event::Payload;

use super::support::{self, AuthMode, SupOpts, exec::exec_stream};
use super::{
    KillTagged, PY_ATTEMPT, PY_DAEMON, PY_SHM, RemoveShm, host_shm_exists, shm_key, tagged, unique,
    wait_file, wait_no_tagged,
};

fn show(r: &support::ExecResult) -> String {
    format!(
        "exit {:?}, status {:?}\nstdout: {}\nstderr: {}",
        r.exit,
        r.status,
        r.out(),
        r.err()
    )
}

fn require_root() -> bool {
    support::require(
        support::is_root(),
        "the sandbox view needs root (or a user namespace); the serve tests run as root",
    )
}

/// Exec 1 leaves a file in /tmp and a SysV segment; exec 2 sees both, while it is invisible to
/// the host. Then exec 1 runs a TCP listener on 127.0.0.1, exec 2 connects to it, and exec 2
/// cannot see exec 1's processes (its own PID namespace).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_execs_share_tmp_ipc_and_loopback_but_not_pids() {
    if !require_root() {
        return;
    }
    let (gw, sup) = support::up(AuthMode::Jwt, SupOpts::default()).await;
    let tag = format!("osb-ns-serve-{}", unique());
    let key = shm_key();
    let _cleanup = RemoveShm(key);
    let write = format!(
        r#"{PY_ATTEMPT}{PY_SHM}
open("/tmp/{tag}", "w").write("from exec 1")
i = shmget({key}, 4096, IPC_CREAT | 0o600)
p = libc.shmat(i, None, 0)
ctypes.memmove(p, b"segment of exec 1", 17)
libc.shmdt(ctypes.c_void_p(p))
print("written")
"#
    );
    let r = gw.exec(&["python3", "-c", &write]).await;
    assert_eq!(
        (r.out().as_str(), r.exit),
        ("written\n", Some(0)),
        "{}",
        show(&r)
    );
    let read = format!(
        r#"{PY_ATTEMPT}{PY_SHM}
print(open("/tmp/{tag}").read())
i = shmget({key}, 0, 0)
p = libc.shmat(i, None, 0)
print(ctypes.string_at(p, 17).decode())
"#
    );
    let r = gw.exec(&["python3", "-c", &read]).await;
    assert_eq!(
        (r.out().as_str(), r.exit),
        ("from exec 1\nsegment of exec 1\n", Some(0)),
        "{}",
        show(&r)
    );
    assert!(
        !std::path::Path::new("/tmp").join(&tag).exists(),
        "the sandbox's /tmp file is on the host"
    );
    assert!(
        !host_shm_exists(key),
        "the sandbox's segment is in the host's IPC namespace"
    );

    // A listener that stays up in exec 1 while exec 2 connects.
    let port_file = sup.workdir.join(format!("port-{tag}"));
    let listen = format!(
        r#"
import os, socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
open("{port}.tmp", "w").write(str(s.getsockname()[1])); os.rename("{port}.tmp", "{port}")
a, _ = s.accept(); a.sendall(b"pong"); a.close()
"#,
        port = port_file.display()
    );
    let mut rx = exec_stream(
        gw.state.clone(),
        gw.request(&["python3", "-c", &listen, &tag]),
    )
    .await
    .expect("starting exec 1");
    // Wait for the port, failing at once (with what exec 1 said) if it ends first.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut said = String::new();
    while !port_file.exists() {
        match tokio::time::timeout(Duration::from_millis(20), rx.recv()).await {
            Err(_) => {}
            Ok(Some(Ok(ev))) => match ev.payload {
                Some(Payload::Stdout(d)) => said.push_str(&String::from_utf8_lossy(&d.data)),
                Some(Payload::Stderr(d)) => said.push_str(&String::from_utf8_lossy(&d.data)),
                Some(Payload::Exit(e)) => {
                    panic!("exec 1 exited {} before listening: {said}", e.exit_code)
                }
                _ => {}
            },
            Ok(other) => panic!("exec 1's stream ended before it listened: {other:?} {said}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "exec 1 did not listen: {said}"
        );
    }
    let connect = format!(
        r#"{PY_ATTEMPT}
import socket
port = int(open("{port}").read())
c = socket.create_connection(("127.0.0.1", port), timeout=10)
print(c.recv(4).decode())
# This exec's own processes carry the tag in their command line too (this very text), and
# also the words below: what carries the tag but not them is exec 1's.
cmds = [open("/proc/%s/cmdline" % p, "rb").read() for p in os.listdir("/proc") if p.isdigit()]
seen = [c for c in cmds if b"{tag}" in c and b"exec 1 visible" not in c]
print("exec 1 visible", bool(seen))
"#,
        port = port_file.display()
    );
    let r = gw.exec(&["python3", "-c", &connect]).await;
    assert_eq!(
        (r.out().as_str(), r.exit),
        ("pong\nexec 1 visible False\n", Some(0)),
        "{}",
        show(&r)
    );
    let mut exit = None;
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("exec 1 did not end")
    {
        if let Ok(ev) = ev
            && let Some(Payload::Exit(e)) = ev.payload
        {
            exit = Some(e.exit_code);
        }
    }
    assert_eq!(exit, Some(0), "exec 1");
}

/// A server in the main process (the place for long-lived servers: an exec's background
/// processes end with the exec) listens on loopback; an exec reaches it. The port is fixed: in a
/// private network namespace it cannot collide with anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_main_process_listener_is_reachable_from_an_exec() {
    if !require_root() {
        return;
    }
    let server = r#"
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8765)); s.listen(8)
while True:
    a, _ = s.accept(); a.sendall(b"main pong"); a.close()
"#;
    let spec = serde_json::json!({"version": 1, "command": ["python3", "-c", server]});
    let opts = SupOpts {
        env: vec![("OPENSHELL_MAIN_PROCESS_SPEC".into(), spec.to_string())],
        ..Default::default()
    };
    let (gw, mut sup) = support::up(AuthMode::Jwt, opts).await;
    let connect = r#"
import socket, time
for _ in range(200):
    try:
        c = socket.create_connection(("127.0.0.1", 8765), timeout=10)
        break
    except ConnectionRefusedError:
        time.sleep(0.05)
print(c.recv(9).decode())
"#;
    let r = gw.exec(&["python3", "-c", connect]).await;
    assert_eq!(
        (r.out().as_str(), r.exit),
        ("main pong\n", Some(0)),
        "{}\n{}",
        show(&r),
        sup.log()
    );
    assert!(sup.try_status().is_none(), "the supervisor ended");
}

/// SIGKILL of the serve supervisor while an exec runs a double-forked setsid daemon: within a
/// bounded wait no process of that exec remains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_sigkill_leaves_no_process_of_a_running_exec() {
    if !require_root() {
        return;
    }
    let (gw, mut sup) = support::up(AuthMode::Jwt, SupOpts::default()).await;
    let tag = format!("osb-ns-serve-daemon-{}", unique());
    let _cleanup = KillTagged(tag.clone());
    let wd = sup.workdir.display().to_string();
    let _rx = exec_stream(
        gw.state.clone(),
        gw.request(&["python3", "-c", PY_DAEMON, &tag, &wd]),
    )
    .await
    .expect("starting the exec");
    assert!(
        wait_file(&sup.workdir.join("daemon-up"), Duration::from_secs(30)),
        "the daemon did not start:\n{}",
        sup.log()
    );
    assert!(tagged(&tag).len() >= 2, "{:?}", tagged(&tag));
    sup.signal(libc::SIGKILL);
    sup.wait_exit(Duration::from_secs(10)).await;
    let left = wait_no_tagged(&tag, Duration::from_secs(10));
    assert!(
        left.is_empty(),
        "processes of the exec survived the supervisor's SIGKILL: {left:?}"
    );
}
