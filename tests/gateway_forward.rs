//! `direct-tcpip` (`ssh -L`, `openshell forward start`) through the real binary, with the
//! system OpenSSH client over a relay of the test gateway.

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use support::ssh_bridge::{SshBridge, have_openssh};
use support::*;

/// A loopback echo server (standing in for a service in the sandbox); each connection is
/// served until the peer closes it.
fn echo_server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 64 * 1024];
                loop {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if s.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    port
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Ssh(Child);

impl Drop for Ssh {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `ssh -N -L 127.0.0.1:<local>:<spec>` as `openshell forward start` runs it; returns once
/// the local listener accepts.
fn forward(bridge: &SshBridge, spec: &str) -> (Ssh, u16) {
    let local = free_port();
    let child = bridge
        .command("ssh")
        .args(["-N", "-o", "ExitOnForwardFailure=yes", "-L"])
        .arg(format!("127.0.0.1:{local}:{spec}"))
        .arg("sandbox")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut ssh = Ssh(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", local)).is_err() {
        if let Ok(Some(st)) = ssh.0.try_wait() {
            panic!("ssh -L exited early: {st}");
        }
        assert!(Instant::now() < deadline, "ssh -L never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    (ssh, local)
}

/// Send `data` through the forward and read it all back.
fn round_trip(port: u16, data: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut w = s.try_clone().unwrap();
    let data = data.to_vec();
    let n = data.len();
    let writer = std::thread::spawn(move || w.write_all(&data).unwrap());
    let mut got = vec![0u8; n];
    s.read_exact(&mut got).unwrap();
    writer.join().unwrap();
    got
}

/// What a forward to a refused target looks like to the local client: OpenSSH accepts the
/// local connection, the channel open fails, and it closes the socket without a byte.
fn refused(port: u16) -> bool {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let _ = s.write_all(b"ping");
    let mut b = [0u8; 16];
    match s.read(&mut b) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    }
}

fn openssh_present() -> bool {
    require(
        have_openssh(),
        "OpenSSH client (ssh, sftp) and busybox (apt-get install openssh-client busybox-static)",
    )
}

/// An echo server as the sandbox's main process, on `port` of the sandbox's own loopback.
fn sandbox_echo(port: u16) -> SupOpts {
    let server = format!(
        r#"
import socket, threading
def serve(a):
    while True:
        b = a.recv(65536)
        if not b:
            a.close(); return
        a.sendall(b)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", {port})); s.listen(16)
while True:
    a, _ = s.accept(); threading.Thread(target=serve, args=(a,), daemon=True).start()
"#
    );
    let spec = serde_json::json!({"version": 1, "command": ["python3", "-c", server]});
    SupOpts {
        env: vec![("OPENSHELL_MAIN_PROCESS_SPEC".into(), spec.to_string())],
        ..Default::default()
    }
}

/// A forward reaches the sandbox's loopback, where its main process listens, and never the
/// supervisor's: with the sandbox's own network namespace (root), a server on the host's
/// loopback is out of reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssh_local_forward_reaches_loopback_both_ways() {
    if !openssh_present() {
        return;
    }
    let echo = free_port();
    let (gw, _sup) = up(AuthMode::Jwt, sandbox_echo(echo)).await;
    let bridge = SshBridge::start(gw.state.clone()).await;
    let host_echo = echo_server();
    let spec = format!("127.0.0.1:{echo}");
    let data: Vec<u8> = (0..2 * 1024 * 1024u32)
        .map(|i| (i * 7 + i / 251) as u8)
        .collect();
    tokio::task::spawn_blocking(move || {
        let (_ssh, local) = forward(&bridge, &spec);
        // The main process may still be starting: retry the first round trip a while.
        let end = Instant::now() + Duration::from_secs(20);
        while !probe_echo(local) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(round_trip(local, b"hello") == b"hello");
        // 2 MiB of binary data through the forward and back, byte-exact.
        assert!(round_trip(local, &data) == data);
        // localhost (any case), bracketed IPv6 long form and IPv4-mapped loopback all work.
        for host in ["LocalHost", "[0:0:0:0:0:0:0:1]", "[::ffff:127.0.0.1]"] {
            let (_s, p) = forward(&bridge, &format!("{host}:{echo}"));
            if host.contains("0:0:0") {
                // Nothing listens on ::1 here: the channel opens, then the connect fails and
                // closes it.
                assert!(refused(p), "{host}");
            } else {
                assert_eq!(round_trip(p, b"x"), b"x", "{host}");
            }
        }
        if is_root() {
            // The supervisor's (here: the host's) loopback is another namespace's.
            let (_s, p) = forward(&bridge, &format!("127.0.0.1:{host_echo}"));
            assert!(
                refused(p),
                "a forward reached the supervisor's own loopback"
            );
        }
    })
    .await
    .unwrap();
}

/// Whether one byte comes back through the forward at `port`.
fn probe_echo(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut b = [0u8; 1];
    s.write_all(b"p").is_ok() && s.read(&mut b).map(|n| n == 1).unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssh_forward_to_a_non_loopback_host_is_refused() {
    if !openssh_present() {
        return;
    }
    let (gw, mut sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let bridge = SshBridge::start(gw.state.clone()).await;
    let echo = echo_server();
    tokio::task::spawn_blocking(move || {
        for host in [
            "10.255.255.1",
            "0.0.0.0",
            "[::ffff:10.0.0.1]",
            "example.invalid",
        ] {
            let (_ssh, local) = forward(&bridge, &format!("{host}:{echo}"));
            assert!(refused(local), "{host} was not refused");
        }
    })
    .await
    .unwrap();
    sup.wait_log(
        "direct-tcpip refused: `10.255.255.1` is not a loopback address",
        Duration::from_secs(10),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_64_forwarded_channels_per_connection() {
    if !openssh_present() {
        return;
    }
    let echo = free_port();
    let (gw, _sup) = up(AuthMode::Jwt, sandbox_echo(echo)).await;
    let bridge = SshBridge::start(gw.state.clone()).await;
    tokio::task::spawn_blocking(move || {
        let (_ssh, local) = forward(&bridge, &format!("127.0.0.1:{echo}"));
        let end = Instant::now() + Duration::from_secs(20);
        while !probe_echo(local) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(100));
        }
        // The probes' channels give their slots back once closed.
        std::thread::sleep(Duration::from_secs(1));
        let mut open = Vec::new();
        for i in 0..64u8 {
            let mut s = TcpStream::connect(("127.0.0.1", local)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            s.write_all(&[i]).unwrap();
            let mut b = [0u8; 1];
            s.read_exact(&mut b).unwrap();
            assert_eq!(b[0], i);
            open.push(s);
        }
        assert!(refused(local), "a 65th forwarded channel was opened");
        // Closing one frees its slot.
        drop(open.pop());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut s = TcpStream::connect(("127.0.0.1", local)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let _ = s.write_all(b"y");
            let mut b = [0u8; 1];
            if matches!(s.read(&mut b), Ok(1)) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the freed slot was never reusable"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssh_remote_forward_is_refused() {
    if !openssh_present() {
        return;
    }
    let (gw, _sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let bridge = SshBridge::start(gw.state.clone()).await;
    let echo = echo_server();
    let out = tokio::task::spawn_blocking(move || {
        bridge
            .command("ssh")
            .args([
                "-N",
                "-o",
                "ExitOnForwardFailure=yes",
                "-o",
                "LogLevel=INFO",
                "-R",
            ])
            .arg(format!("0:127.0.0.1:{echo}"))
            .arg("sandbox")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(255), "{err}");
    assert!(err.contains("remote port forwarding failed"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_administratively_prohibited() {
    use openshell_sandbox::proto::v1::{SshRelayTarget, relay_open};
    let echo = free_port();
    let (gw, _sup) = up(AuthMode::Jwt, sandbox_echo(echo)).await;
    let relay = gw
        .state
        .open_relay(Some(relay_open::Target::Ssh(SshRelayTarget {})))
        .await
        .unwrap();
    let h = support::exec::ssh_connect(gateway::bridge(relay))
        .await
        .unwrap();
    // OpenSSH will not even send a port above 65535; the gateway's russh (and anyone) can.
    for (host, port) in [
        ("127.0.0.1", 70000u32),
        ("10.0.0.1", u32::from(echo)),
        ("::ffff:10.0.0.1", u32::from(echo)),
    ] {
        match h
            .channel_open_direct_tcpip(host, port, "127.0.0.1", 40000)
            .await
        {
            Err(russh::Error::ChannelOpenFailure(r)) => assert_eq!(
                r,
                russh::ChannelOpenFailure::AdministrativelyProhibited,
                "{host}:{port}"
            ),
            Err(e) => panic!("{host}:{port}: {e}"),
            Ok(_) => panic!("{host}:{port} was opened"),
        }
    }
    // The echo server is the sandbox's main process, maybe still starting: retry a while.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let ch = h
            .channel_open_direct_tcpip("127.0.0.1", u32::from(echo), "127.0.0.1", 40000)
            .await
            .unwrap();
        let mut s = ch.into_stream();
        s.write_all(b"through russh").await.unwrap();
        let mut b = [0u8; 13];
        match s.read_exact(&mut b).await {
            Ok(_) => {
                assert_eq!(&b, b"through russh");
                break;
            }
            Err(e) if Instant::now() < end => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("no echo through the forward: {e}"),
        }
    }
}
