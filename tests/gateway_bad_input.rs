//! Bad input from the gateway side never crashes the supervisor: each case gets a clear error
//! and the next exec still works.

mod support;

use std::time::Duration;

use bytes::Bytes;
use openshell_sandbox::proto::v1::*;
use russh::ChannelMsg;
use support::exec::{AnyKey, ssh_connect};
use support::gateway::bridge;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LONG: Duration = Duration::from_secs(60);

fn ssh_target() -> Option<relay_open::Target> {
    Some(relay_open::Target::Ssh(SshRelayTarget {}))
}

async fn still_serving(gw: &TestGateway, sup: &mut Supervisor) {
    assert!(
        sup.try_status().is_none(),
        "supervisor died:\n{}",
        sup.log()
    );
    let r = gw.sh("echo alive").await;
    assert_eq!(
        (r.out(), r.exit),
        ("alive\n".to_string(), Some(0)),
        "{r:?}\n{}",
        sup.log()
    );
}

async fn raw_ssh(gw: &TestGateway) -> russh::client::Handle<AnyKey> {
    let relay = gw.state.open_relay(ssh_target()).await.unwrap();
    ssh_connect(bridge(relay)).await.unwrap()
}

/// Exec raw command bytes on a fresh channel; returns (stdout, stderr, exit-status).
async fn raw_exec(
    h: &russh::client::Handle<AnyKey>,
    cmd: &[u8],
) -> (Vec<u8>, Vec<u8>, Option<u32>) {
    let mut ch = h.channel_open_session().await.unwrap();
    ch.exec(true, cmd.to_vec()).await.unwrap();
    ch.eof().await.unwrap();
    let (mut out, mut err, mut code) = (Vec::new(), Vec::new(), None);
    while let Some(m) = ch.wait().await {
        match m {
            ChannelMsg::Data { data } => out.extend_from_slice(&data),
            ChannelMsg::ExtendedData { data, .. } => err.extend_from_slice(&data),
            ChannelMsg::ExitStatus { exit_status } => code = Some(exit_status),
            ChannelMsg::Close => break,
            _ => {}
        }
    }
    (out, err, code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_sends_init_instead_of_data() {
    let (gw, mut sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let mut relay = gw.state.open_relay(ssh_target()).await.unwrap();
    let init = RelayFrame {
        payload: Some(relay_frame::Payload::Init(RelayInit {
            channel_id: "x".into(),
        })),
    };
    relay.outbound.send(Ok(init)).await.unwrap();
    // The supervisor treats it as an error and ends its side of the relay.
    while let Ok(Some(_)) = tokio::time::timeout(LONG, relay.inbound.message())
        .await
        .expect("relay not ended")
    {}
    sup.wait_log("non-data frame", LONG).await;
    still_serving(&gw, &mut sup).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_open_for_an_unknown_channel_id() {
    // One relay slot: a refused claim must give it back, or nothing would ever run again.
    let (gw, mut sup) = up(
        AuthMode::Jwt,
        SupOpts {
            args: vec!["--max-execs".into(), "1".into()],
            ..Default::default()
        },
    )
    .await;
    for i in 0..3 {
        // Sent without registering it: the gateway answers the claim with NOT_FOUND.
        let _ = gw
            .state
            .open_relay_with_id(format!("never-registered-{i}"), ssh_target(), false)
            .await;
        sup.wait_log(&format!("never-registered-{i}"), LONG).await;
    }
    sup.wait_log("unknown or expired relay channel", LONG).await;
    // The slot comes back asynchronously, once the SSH server behind the relay has stopped.
    let deadline = std::time::Instant::now() + LONG;
    loop {
        let r = gw.sh("echo alive").await;
        if r.exit == Some(0) {
            assert_eq!(r.out(), "alive\n");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the relay slot never came back: {r:?}\n{}",
            sup.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        sup.try_status().is_none(),
        "supervisor died:\n{}",
        sup.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_bytes_on_the_relay() {
    let (gw, mut sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let relay = gw.state.open_relay(ssh_target()).await.unwrap();
    let mut d = bridge(relay);
    let mut junk = vec![0u8; 64 * 1024];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut junk).unwrap();
    let _ = d.write_all(b"SSH-2.0-junk\r\n").await;
    let _ = d.write_all(&junk).await;
    // The SSH server gives up and the relay ends.
    let mut sink = Vec::new();
    let _ = tokio::time::timeout(LONG, d.read_to_end(&mut sink))
        .await
        .expect("relay never ended");
    still_serving(&gw, &mut sup).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_that_ends_mid_ssh_packet() {
    let (gw, mut sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let relay = gw.state.open_relay(ssh_target()).await.unwrap();
    let mut d = bridge(relay);
    d.write_all(b"SSH-2.0-OpenSSH_9.6\r\n").await.unwrap();
    // A packet header announcing 256 bytes, then only a few of them, then EOF.
    d.write_all(&[0, 0, 1, 0, 4, 20, 1, 2, 3]).await.unwrap();
    d.shutdown().await.unwrap();
    let mut sink = Vec::new();
    let _ = tokio::time::timeout(LONG, d.read_to_end(&mut sink))
        .await
        .expect("relay never ended");
    still_serving(&gw, &mut sup).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_nul_and_invalid_utf8_commands() {
    let (gw, mut sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    // 300 KiB is over the SSH transport's 256 KiB packet limit: the connection is dropped
    // (the gateway reports UNAVAILABLE, no exit status) and the reason is logged.
    let h = raw_ssh(&gw).await;
    let big = vec![b'x'; 300 * 1024];
    let (_, _, code) = raw_exec(&h, &big).await;
    assert_eq!(code, None);
    sup.wait_log("Bad packet size", LONG).await;
    let mut req = gw.request(&["echo", &"y".repeat(30 * 1024)]);
    for i in 0..10 {
        req.command.push(format!("{i}{}", "z".repeat(30 * 1024)));
    }
    let r = exec_collect(gw.state.clone(), req).await;
    assert_eq!(
        r.status.as_ref().map(|s| s.code()),
        Some(tonic::Code::InvalidArgument),
        "the gateway refuses > 256 KiB itself"
    );

    let h = raw_ssh(&gw).await;
    let (_, err, code) = raw_exec(&h, b"echo a\0b").await;
    assert_eq!(code, Some(2));
    assert!(
        String::from_utf8_lossy(&err).contains("NUL byte at offset 6"),
        "{err:?}"
    );

    let (_, err, code) = raw_exec(&h, b"   \n ").await;
    assert_eq!(code, Some(2));
    assert!(String::from_utf8_lossy(&err).contains("empty"), "{err:?}");

    // Invalid UTF-8 is decoded lossily, as the real server does, and runs.
    let (out, _, code) = raw_exec(&h, b"  echo ok \xff\xfe  ").await;
    assert_eq!(code, Some(0));
    assert_eq!(String::from_utf8_lossy(&out), "ok \u{fffd}\u{fffd}\n");
    still_serving(&gw, &mut sup).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_channel_types_are_refused() {
    let (gw, mut sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let h = raw_ssh(&gw).await;
    assert!(
        // Forwarding is served to loopback only (tests/gateway_forward.rs).
        h.channel_open_direct_tcpip("10.0.0.1", 22, "10.0.0.1", 5)
            .await
            .is_err()
    );
    assert!(
        h.channel_open_direct_streamlocal("/run/x.sock")
            .await
            .is_err()
    );
    // The connection itself is still usable.
    let (out, _, code) = raw_exec(&h, b"echo still").await;
    assert_eq!((out, code), (b"still\n".to_vec(), Some(0)));
    still_serving(&gw, &mut sup).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_change_on_a_non_tty_channel_is_ignored() {
    let (gw, mut sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let h = raw_ssh(&gw).await;
    let mut ch = h.channel_open_session().await.unwrap();
    ch.exec(true, b"read x; echo got $x".to_vec())
        .await
        .unwrap();
    ch.window_change(120, 40, 0, 0).await.unwrap();
    ch.data(&b"line\n"[..]).await.unwrap();
    ch.eof().await.unwrap();
    let (mut out, mut code) = (Vec::new(), None);
    while let Some(m) = ch.wait().await {
        match m {
            ChannelMsg::Data { data } => out.extend_from_slice(&data),
            ChannelMsg::ExitStatus { exit_status } => code = Some(exit_status),
            ChannelMsg::Close => break,
            _ => {}
        }
    }
    assert_eq!(
        (String::from_utf8_lossy(&out).into_owned(), code),
        ("got line\n".into(), Some(0))
    );
    still_serving(&gw, &mut sup).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_relay_id_fails_clearly() {
    let (gw, mut sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let id = "dup-0001".to_string();
    let first = gw
        .state
        .open_relay_with_id(id.clone(), ssh_target(), true)
        .await
        .unwrap();
    let _held = bridge(first);
    let _ = gw
        .state
        .open_relay_with_id(id.clone(), ssh_target(), false)
        .await;
    let deadline = std::time::Instant::now() + LONG;
    loop {
        let results = gw.state.seen().relay_results;
        if let Some(r) = results.iter().find(|r| r.channel_id == id && !r.success) {
            assert!(r.error.contains("already open"), "{r:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no failure result: {results:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    still_serving(&gw, &mut sup).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_targets_are_loopback_only() {
    // A loopback target is the sandbox's loopback (gateway_forward_netns.rs): the echo server is the
    // sandbox's main process, one connection at a time.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = format!(
        "import socket\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         s.bind(('127.0.0.1', {port})); s.listen(16)\nwhile True:\n    a, _ = s.accept()\n    \
         b = a.recv(64)\n    a.sendall(b); a.close()\n"
    );
    let spec = serde_json::json!({"version": 1, "command": ["python3", "-c", server]});
    let opts = SupOpts {
        env: vec![("OPENSHELL_MAIN_PROCESS_SPEC".into(), spec.to_string())],
        ..Default::default()
    };
    let (gw, mut sup) = up(AuthMode::Jwt, opts).await;
    let far = Some(relay_open::Target::Tcp(TcpRelayTarget {
        host: "10.1.2.3".into(),
        port: 80,
    }));
    let err = gw.state.open_relay(far).await.err().expect("must fail");
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(err.message().contains("loopback"), "{err:?}");

    // A loopback target works (the main process may still be starting: retry a while).
    let near = || {
        Some(relay_open::Target::Tcp(TcpRelayTarget {
            host: "localhost".into(),
            port: u32::from(port),
        }))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let relay = loop {
        match gw.state.open_relay(near()).await {
            Ok(r) => break r,
            Err(e) => assert!(std::time::Instant::now() < deadline, "{e:?}\n{}", sup.log()),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut d = bridge(relay);
    d.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    d.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping");
    still_serving(&gw, &mut sup).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_max_execs_is_a_clear_failure() {
    let (gw, mut sup) = up(
        AuthMode::Jwt,
        SupOpts {
            args: vec!["--max-execs".into(), "2".into()],
            ..Default::default()
        },
    )
    .await;
    let a = bridge(gw.state.open_relay(ssh_target()).await.unwrap());
    let b = bridge(gw.state.open_relay(ssh_target()).await.unwrap());
    let err = gw
        .state
        .open_relay(ssh_target())
        .await
        .err()
        .expect("third relay must fail");
    assert!(
        err.message().contains("too many concurrent execs"),
        "{err:?}"
    );
    assert!(err.message().contains("--max-execs"), "{err:?}");
    drop((a, b));
    // Once the held relays end, execs work again.
    let deadline = std::time::Instant::now() + LONG;
    loop {
        let r = gw.sh("echo freed").await;
        if r.exit == Some(0) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{r:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    still_serving(&gw, &mut sup).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_data_frames_are_skipped() {
    let (gw, mut sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let relay = gw.state.open_relay(ssh_target()).await.unwrap();
    let empty = RelayFrame {
        payload: Some(relay_frame::Payload::Data(Bytes::new())),
    };
    relay.outbound.send(Ok(empty)).await.unwrap();
    let h = ssh_connect(bridge(relay)).await.unwrap();
    let (out, _, code) = raw_exec(&h, b"echo fine").await;
    assert_eq!((out, code), (b"fine\n".to_vec(), Some(0)));
    still_serving(&gw, &mut sup).await;
}
