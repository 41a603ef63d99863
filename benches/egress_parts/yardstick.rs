//! The simplest relay one could write, as a yardstick for the proxy's raw tunnel: a listener in
//! the sandbox's namespace like the proxy's, no policy, no identity lookup, no classification;
//! each connection's CONNECT head read and answered `200`, then one blocking thread per
//! direction moving bytes socket → pipe → socket with `splice(2)` through the largest pipe the
//! system allows. What it carries per second is what any user-space relay gets on this machine.
//!
//! And the same least relay on tokio ([`start_async`]), for connect + first byte: the head
//! read, the dial, the `200` and `copy_bidirectional`, on the proxy's own runtime, so that
//! what it adds to a direct connection is the least a relay of ours could add here.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Where the yardstick listens, beside the proxies.
pub const ADDR: &str = "10.200.0.3:3128";

/// Where the tokio yardstick listens.
pub const ASYNC_ADDR: &str = "10.200.0.4:3128";

/// Where the tokio yardstick with the proxy's hop listens: an empty task on a blocking
/// thread started at accept and awaited with the head, as the proxy's identity lookup is, so
/// that what the hop alone costs shows against [`ASYNC_ADDR`].
pub const HOP_ADDR: &str = "10.200.0.5:3128";

/// The thread name its relays run under.
const THREAD: &str = "yardstick";

/// Relay threads running, and the CPU (user, system; µs) of those that have ended: a thread's
/// own counters go with it, so each adds them up as it ends.
static LIVE: AtomicUsize = AtomicUsize::new(0);
static USER_US: AtomicU64 = AtomicU64::new(0);
static SYS_US: AtomicU64 = AtomicU64::new(0);

/// CPU seconds (user, system) of every relay thread so far, once the running ones have ended
/// (waits up to 2 s: a download's client sees EOF a moment before its threads finish).
pub fn cpu() -> (f64, f64) {
    let t = Instant::now();
    while LIVE.load(Ordering::SeqCst) > 0 && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(1));
    }
    (
        USER_US.load(Ordering::SeqCst) as f64 / 1e6,
        SYS_US.load(Ordering::SeqCst) as f64 / 1e6,
    )
}

/// Run `f` on a relay thread, its CPU counted into the totals when it ends.
fn counted(f: impl FnOnce() + Send + 'static) -> std::thread::JoinHandle<()> {
    LIVE.fetch_add(1, Ordering::SeqCst);
    std::thread::Builder::new()
        .name(THREAD.into())
        .spawn(move || {
            f();
            // SAFETY: getrusage fills the struct we pass.
            let mut u: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: as above; RUSAGE_THREAD reads this thread's own counters.
            unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
            let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
            USER_US.fetch_add(us(u.ru_utime), Ordering::SeqCst);
            SYS_US.fetch_add(us(u.ru_stime), Ordering::SeqCst);
            LIVE.fetch_sub(1, Ordering::SeqCst);
        })
        .unwrap()
}

/// Serve on `listener` (made in the sandbox's namespace) from a thread of the calling thread's
/// namespace, where `upstream` is reachable. Runs for the life of the process.
pub fn start(listener: TcpListener, upstream: SocketAddr) {
    std::thread::Builder::new()
        .name("yardstick-accept".into())
        .spawn(move || {
            for c in listener.incoming() {
                let Ok(c) = c else { continue };
                counted(move || connection(c, upstream));
            }
        })
        .unwrap();
}

fn connection(mut client: TcpStream, upstream: SocketAddr) {
    client.set_nodelay(true).unwrap();
    // The client sends the head and waits for the `200`: nothing follows it yet.
    let mut head = Vec::new();
    let mut b = [0u8; 1024];
    while !head.ends_with(b"\r\n\r\n") {
        let n = client.read(&mut b).unwrap();
        if n == 0 {
            return;
        }
        head.extend_from_slice(&b[..n]);
    }
    let port = connect_port(&head);
    let up = TcpStream::connect(SocketAddr::new(upstream.ip(), port)).unwrap();
    up.set_nodelay(true).unwrap();
    client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .unwrap();
    let (c2, u2) = (client.try_clone().unwrap(), up.try_clone().unwrap());
    let back = counted(move || carry(&u2, &c2));
    carry(&client, &up);
    back.join().unwrap();
}

/// One direction until EOF, then the write side shut down.
fn carry(from: &TcpStream, to: &TcpStream) {
    let mut fds = [-1; 2];
    // SAFETY: pipe2 writes two descriptors into the array; each is owned once, below.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors were just made and are owned by nothing else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let size = std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
        .ok()
        .and_then(|s| s.trim().parse::<libc::c_int>().ok())
        .unwrap_or(1 << 20);
    // SAFETY: fcntl on a pipe we own; on refusal the default size stays.
    let cap = unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, size) };
    let cap = if cap > 0 { cap as usize } else { 64 << 10 };
    let (fi, ti) = (from.as_fd().as_raw_fd(), to.as_fd().as_raw_fd());
    loop {
        // SAFETY: splice between descriptors this thread holds, null offsets.
        let n = unsafe {
            libc::splice(
                fi,
                std::ptr::null_mut(),
                w.as_raw_fd(),
                std::ptr::null_mut(),
                cap,
                0,
            )
        };
        if n <= 0 {
            break;
        }
        let mut left = n as usize;
        while left > 0 {
            // SAFETY: as above.
            let m = unsafe {
                libc::splice(
                    r.as_raw_fd(),
                    std::ptr::null_mut(),
                    ti,
                    std::ptr::null_mut(),
                    left,
                    0,
                )
            };
            if m <= 0 {
                let _ = to.shutdown(std::net::Shutdown::Write);
                return;
            }
            left -= m as usize;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// Serve the tokio yardstick on `listener` (made in the sandbox's namespace), its tasks on
/// `rt`, whose threads must be in a namespace where `upstream` is reachable; with `hop`, each
/// connection waits for a blocking thread too (see [`HOP_ADDR`]). Runs for the life of the
/// runtime.
pub fn start_async(
    listener: TcpListener,
    upstream: std::net::IpAddr,
    hop: bool,
    rt: &tokio::runtime::Handle,
) {
    listener.set_nonblocking(true).unwrap();
    rt.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        loop {
            let Ok((c, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(relay(c, upstream, hop));
        }
    });
}

async fn relay(mut client: tokio::net::TcpStream, upstream: std::net::IpAddr, hop: bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    client.set_nodelay(true).unwrap();
    let hop = hop.then(|| tokio::task::spawn_blocking(|| ()));
    let mut head = Vec::new();
    let mut b = [0u8; 1024];
    while !head.ends_with(b"\r\n\r\n") {
        match client.read(&mut b).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&b[..n]),
        }
    }
    if let Some(h) = hop {
        h.await.unwrap();
    }
    let port = connect_port(&head);
    let mut up = tokio::net::TcpStream::connect(SocketAddr::new(upstream, port))
        .await
        .unwrap();
    up.set_nodelay(true).unwrap();
    client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .unwrap();
    let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
}

/// The port of a `CONNECT host:port` head.
fn connect_port(head: &[u8]) -> u16 {
    std::str::from_utf8(head)
        .ok()
        .and_then(|h| {
            h.split_whitespace()
                .nth(1)?
                .rsplit_once(':')?
                .1
                .parse()
                .ok()
        })
        .expect("CONNECT host:port")
}
