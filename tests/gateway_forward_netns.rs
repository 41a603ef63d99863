//! Port forwards against the supervisor's own network: a forward
//! is for the sandbox's loopback, where its execs and main process listen. The supervisor (PID
//! 1 of the pod, root) lives in another network namespace when the sandbox has its own
//! (`--network none`), and whatever listens on *its* loopback (the pod's sidecars, the node's
//! services in a host test) is no business of the sandbox's. Two ways reached it anyway: a
//! gateway `RelayOpen` with a TCP target, and `direct-tcpip` while the sandbox was quarantined.

mod support;

use std::time::Duration;

use openshell_sandbox::policy::openshell::{FilesystemPolicy, LandlockPolicy, SandboxPolicy};
use openshell_sandbox::proto::v1::*;
use support::exec::ssh_connect;
use support::gateway::bridge;
use support::require_pause_points;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An echo server on the host's (the supervisor's) loopback, as a pod sidecar's admin port
/// would be. Each connection gets its bytes back.
async fn host_echo() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

fn tcp_target(port: u16) -> Option<relay_open::Target> {
    Some(relay_open::Target::Tcp(TcpRelayTarget {
        host: "127.0.0.1".into(),
        port: u32::from(port),
    }))
}

/// Whether `ping` comes back through `d` within 5 s.
async fn echoes<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(d: &mut S) -> bool {
    if d.write_all(b"ping").await.is_err() {
        return false;
    }
    let mut buf = [0u8; 4];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), d.read_exact(&mut buf)).await,
        Ok(Ok(_)) if &buf == b"ping"
    )
}

fn need_root() -> bool {
    require(
        is_root(),
        "root: the sandbox has a network namespace of its own only as root",
    )
}

/// An echo server as the sandbox's main process, on `port` of the sandbox's own loopback.
fn sandbox_echo(port: u16) -> SupOpts {
    let server = format!(
        "import socket\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         s.bind(('127.0.0.1', {port})); s.listen(16)\nwhile True:\n    a, _ = s.accept()\n    \
         b = a.recv(64)\n    a.sendall(b); a.close()\n"
    );
    let spec = serde_json::json!({"version": 1, "command": ["python3", "-c", server]});
    SupOpts {
        env: vec![("OPENSHELL_MAIN_PROCESS_SPEC".into(), spec.to_string())],
        ..Default::default()
    }
}

/// A RelayOpen with a TCP target is connected in the sandbox's network namespace: the
/// sandbox's main process is reached, a server on the supervisor's loopback is not
/// (`Connection refused`: nothing listens on that port of the sandbox's loopback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_tcp_target_is_the_sandboxs_loopback_not_the_supervisors() {
    if !need_root() {
        return;
    }
    let host = host_echo().await;
    let inside = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (gw, sup) = up(AuthMode::Jwt, sandbox_echo(inside)).await;
    match gw.state.open_relay(tcp_target(host)).await {
        Ok(relay) => {
            let mut d = bridge(relay);
            panic!(
                "a relay reached the supervisor's loopback (echoed: {})",
                echoes(&mut d).await
            );
        }
        Err(e) => {
            assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
            assert!(e.message().contains("Connection refused"), "{e:?}");
        }
    }
    // The main process may still be starting: retry a while.
    let mut reached = false;
    for _ in 0..100 {
        if let Ok(relay) = gw.state.open_relay(tcp_target(inside)).await {
            let mut d = bridge(relay);
            if echoes(&mut d).await {
                reached = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        reached,
        "the sandbox's own server was never reached:\n{}",
        sup.log()
    );
}

/// A policy revision with a field this build does not know: FAILED, and under fail_closed
/// the sandbox is quarantined (every exec refused).
fn quarantining_policy() -> (SandboxPolicy, Vec<u8>) {
    let policy = SandboxPolicy {
        version: 1,
        filesystem: Some(FilesystemPolicy {
            include_workdir: true,
            read_only: vec!["/usr".into(), "/etc".into()],
            read_write: vec![],
        }),
        landlock: Some(LandlockPolicy {
            compatibility: "best_effort".into(),
        }),
        ..Default::default()
    };
    let mut extra = Vec::new();
    prost::encoding::encode_varint(42 << 3, &mut extra);
    prost::encoding::encode_varint(7, &mut extra);
    (policy, extra)
}

/// While quarantined there is no sandbox, hence no sandbox network namespace: a forward must
/// be refused like an exec, not connected from the supervisor's own namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantined_sandbox_forwards_nothing() {
    if !need_root() {
        return;
    }
    let host = host_echo().await;
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let (policy, extra) = quarantining_policy();
    gw.state.set_policy_with(&policy, extra).unwrap();
    let mut sup = Supervisor::start(&gw, SupOpts::default());
    gw.wait_ready(&mut sup).await;
    let r = gw.sh("true").await;
    assert_eq!(r.exit, Some(125), "{r:?}\n{}", sup.log());
    assert!(r.err().contains("quarantined"), "{r:?}");

    refuses_both_forwards(&gw, host, "while quarantined", "quarantined").await;
}

/// `--network none` without a network namespace of the sandbox's own (degraded, allowed with
/// `--allow-degraded`): the sandbox has no TCP at all (seccomp refuses the socket), so no
/// server of its own can be on any loopback, and a forward could only reach the supervisor's
/// (here: the host's). It is refused instead, both kinds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_network_namespace_network_none_forwards_nothing() {
    if !need_root() || !require_pause_points() {
        return;
    }
    let host = host_echo().await;
    let opts = SupOpts {
        env: vec![("OSB_TEST_DENY_NETNS".into(), "1".into())],
        args: vec!["--allow-degraded".into()],
        ..SupOpts::default()
    };
    let (gw, sup) = up(AuthMode::Jwt, opts).await;
    // The shape this test is about: the exec shares the supervisor's network namespace, and
    // has no TCP of its own.
    let sup_netns = std::fs::read_link(format!("/proc/{}/ns/net", sup.pid())).unwrap();
    let r = gw
        .exec(&[
            "python3",
            "-c",
            "import os, socket\nprint(os.readlink('/proc/self/ns/net'))\ntry:\n    socket.socket()\nexcept OSError as e:\n    print(e.errno)",
        ])
        .await;
    assert_eq!(
        r.out(),
        format!("{}\n{}\n", sup_netns.display(), libc::EPERM),
        "{r:?}\n{}",
        sup.log()
    );

    refuses_both_forwards(
        &gw,
        host,
        "without the sandbox's network namespace",
        "no network namespace",
    )
    .await;
}

/// Both kinds of forward to `host` (a port on the supervisor's loopback) are refused:
/// `direct-tcpip` as administratively prohibited, a TCP relay UNAVAILABLE naming `why`.
async fn refuses_both_forwards(gw: &TestGateway, host: u16, ctx: &str, why: &str) {
    let relay = gw
        .state
        .open_relay(Some(relay_open::Target::Ssh(SshRelayTarget {})))
        .await
        .unwrap();
    let h = ssh_connect(bridge(relay)).await.unwrap();
    match h
        .channel_open_direct_tcpip("127.0.0.1", u32::from(host), "127.0.0.1", 40000)
        .await
    {
        Ok(ch) => {
            let mut s = ch.into_stream();
            panic!(
                "direct-tcpip opened {ctx} (echoed from the supervisor's loopback: {})",
                echoes(&mut s).await
            );
        }
        Err(russh::Error::ChannelOpenFailure(f)) => assert_eq!(
            f,
            russh::ChannelOpenFailure::AdministrativelyProhibited,
            "{f:?}"
        ),
        Err(e) => panic!("unexpected error: {e:?}"),
    }
    match gw.state.open_relay(tcp_target(host)).await {
        Ok(relay) => {
            let mut d = bridge(relay);
            panic!(
                "a TCP relay opened {ctx} (echoed: {})",
                echoes(&mut d).await
            );
        }
        Err(e) => {
            assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
            assert!(e.message().contains(why), "{e:?}");
        }
    }
}
