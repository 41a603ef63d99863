//! The raw tunnel on loopback sockets: order and completeness past the pipe's size with a slow
//! reader, the half-close carried each way, the idle limit and the generation guard.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::{End, Guard, tunnel};
use crate::egress::PolicyHandle;

/// Two connected loopback sockets.
async fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (b, _) = l.accept().await.unwrap();
    (a, b)
}

/// A tunnel between two fresh pairs: (the client's end, the upstream's end, the tunnel's end).
fn start(
    policy: &PolicyHandle,
    idle: Option<Duration>,
) -> impl std::future::Future<Output = (TcpStream, TcpStream, tokio::task::JoinHandle<End>)> {
    let rx = policy.subscribe();
    let generation = policy.current().generation;
    async move {
        let (client, proxy_side) = pair().await;
        let (proxy_up, upstream) = pair().await;
        let t = tokio::spawn(async move {
            let mut guard = Guard::new(rx, generation, CancellationToken::new());
            tunnel(proxy_side, proxy_up, b"", &mut guard, idle).await
        });
        (client, upstream, t)
    }
}

fn byte(i: usize) -> u8 {
    // Not a period of any pipe or buffer size, so a reordered or repeated chunk shows.
    (i % 251) as u8
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_than_the_pipe_holds_reaches_a_slow_reader_whole_in_order_then_half_closed() {
    const TOTAL: usize = 24 << 20;
    let policy = PolicyHandle::quarantined("test".into());
    let (mut client, mut upstream, t) = start(&policy, None).await;
    let sender = tokio::spawn(async move {
        let data: Vec<u8> = (0..TOTAL).map(byte).collect();
        upstream.write_all(&data).await.unwrap();
        // The upstream is done sending but still listens: the client's answer after EOF must
        // come through the tunnel's other direction.
        upstream.shutdown().await.unwrap();
        let mut answer = Vec::new();
        upstream.read_to_end(&mut answer).await.unwrap();
        answer
    });
    let check = async {
        let mut got = 0usize;
        let mut buf = vec![0u8; 4096];
        loop {
            // Slow at first, so the pipe and every socket buffer on the way fill up and the
            // relay waits on a full pipe with a burst still queued behind it.
            if got < (4 << 20) {
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            let n = client.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            for (k, b) in buf[..n].iter().enumerate() {
                assert_eq!(*b, byte(got + k), "byte {} out of order", got + k);
            }
            got += n;
        }
        assert_eq!(got, TOTAL);
        client.write_all(b"thanks").await.unwrap();
        client.shutdown().await.unwrap();
    };
    tokio::time::timeout(Duration::from_secs(60), check)
        .await
        .expect("the download stalled");
    let answer = tokio::time::timeout(Duration::from_secs(10), sender)
        .await
        .expect("the answer after EOF did not arrive")
        .unwrap();
    assert_eq!(answer, b"thanks");
    let end = tokio::time::timeout(Duration::from_secs(10), t)
        .await
        .expect("the tunnel did not end after both half-closes")
        .unwrap();
    assert!(matches!(end, End::Done), "{end:?}");
}

#[tokio::test]
async fn each_direction_carries_small_exchanges_both_ways() {
    let policy = PolicyHandle::quarantined("test".into());
    let (mut client, mut upstream, t) = start(&policy, None).await;
    for i in 0..50u8 {
        client.write_all(&[i; 3]).await.unwrap();
        let mut b = [0u8; 3];
        upstream.read_exact(&mut b).await.unwrap();
        assert_eq!(b, [i; 3]);
        upstream.write_all(&[i ^ 0xff]).await.unwrap();
        let mut b = [0u8; 1];
        client.read_exact(&mut b).await.unwrap();
        assert_eq!(b, [i ^ 0xff]);
    }
    // The client half-closes first: the upstream sees EOF and can still answer.
    client.shutdown().await.unwrap();
    let mut rest = Vec::new();
    upstream.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
    upstream.write_all(b"late").await.unwrap();
    upstream.shutdown().await.unwrap();
    let mut late = Vec::new();
    client.read_to_end(&mut late).await.unwrap();
    assert_eq!(late, b"late");
    assert!(matches!(t.await.unwrap(), End::Done));
}

#[tokio::test]
async fn a_quiet_tunnel_ends_at_the_idle_limit() {
    let policy = PolicyHandle::quarantined("test".into());
    let (mut client, _upstream, t) = start(&policy, Some(Duration::from_millis(200))).await;
    let end = tokio::time::timeout(Duration::from_secs(10), t)
        .await
        .expect("the idle limit did not end the tunnel")
        .unwrap();
    assert!(matches!(end, End::Idle), "{end:?}");
    let mut b = [0u8; 1];
    assert_eq!(client.read(&mut b).await.unwrap(), 0);
}

#[tokio::test]
async fn a_new_policy_generation_ends_a_busy_tunnel() {
    let policy = PolicyHandle::quarantined("test".into());
    let (mut client, mut upstream, t) = start(&policy, None).await;
    client.write_all(b"x").await.unwrap();
    let mut b = [0u8; 1];
    upstream.read_exact(&mut b).await.unwrap();
    let now = policy.quarantine(1, "changed");
    let end = tokio::time::timeout(Duration::from_secs(10), t)
        .await
        .expect("the generation guard did not end the tunnel")
        .unwrap();
    assert!(matches!(end, End::Stale(g) if g == now), "{end:?}");
}
