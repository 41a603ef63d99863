//! Carrying an admitted connection: the raw tunnel, the guard that ends it when the policy
//! generation moves on, and the seam where an inspecting relay plugs in.
//!
//! Bytes of a raw tunnel move by `splice(2)` through a pipe, socket to socket, without a copy
//! into the supervisor's memory. An idle tunnel holds no pipe and no buffer: each direction
//! waits for readability and only then makes its pipe, closes it once the socket has nothing
//! more to read, so a thousand idle tunnels cost their sockets and two small futures each.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::decide::Settings;
use super::identity::Caller;
use super::request::HostPort;
use super::revision::Revision;

/// Bytes read per step while data flows.
const CHUNK: usize = 64 * 1024;

/// Why a relay ended.
#[derive(Debug)]
pub enum End {
    /// Both directions finished.
    Done,
    /// The policy moved to this generation.
    Stale(u64),
    Idle,
    /// The proxy is shutting down.
    Shutdown,
    Error(io::Error),
}

/// Held by every admitted connection: the generation it was admitted under.
pub struct Guard {
    rx: watch::Receiver<Arc<Revision>>,
    generation: u64,
    cancel: CancellationToken,
}

impl Guard {
    pub(super) fn new(
        rx: watch::Receiver<Arc<Revision>>,
        generation: u64,
        cancel: CancellationToken,
    ) -> Guard {
        Guard {
            rx,
            generation,
            cancel,
        }
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// A check of "has the generation moved on" for code that cannot hold the guard.
    pub fn probe(&self) -> impl Fn() -> bool + Send + Sync + 'static {
        let rx = self.rx.clone();
        let pinned = self.generation;
        move || rx.borrow().generation != pinned
    }

    /// The current generation, if it is no longer the pinned one.
    pub fn moved(&self) -> Option<u64> {
        let g = self.rx.borrow().generation;
        (g != self.generation).then_some(g)
    }

    /// Resolves when the connection must end: the generation moved, or the proxy stops.
    pub async fn ended(&mut self) -> End {
        loop {
            if let Some(g) = self.moved() {
                return End::Stale(g);
            }
            tokio::select! {
                r = self.rx.changed() => if r.is_err() {
                    return End::Shutdown;
                },
                _ = self.cancel.cancelled() => return End::Shutdown,
            }
        }
    }
}

/// An admitted CONNECT handed to the inspecting relay: the client after its `200`, the bytes
/// it sent early, the upstream already dialed to a checked address, the revision it was
/// admitted under and the guard to watch.
pub struct InspectedTunnel {
    pub client: TcpStream,
    pub early: Vec<u8>,
    pub upstream: TcpStream,
    pub dest: HostPort,
    pub caller: Caller,
    /// The L7 endpoint's settings; `None` for an L4 endpoint whose TLS is intercepted.
    pub settings: Option<Settings>,
    pub revision: Arc<Revision>,
    pub guard: Guard,
}

/// A plain-HTTP forward, for the inspector to check before the dial.
pub struct ForwardCheck<'a> {
    pub dest: &'a HostPort,
    pub method: &'a str,
    pub path_and_query: &'a str,
    /// The whole head as the client sent it.
    pub head: &'a [u8],
    pub caller: &'a Caller,
    pub settings: Option<&'a Settings>,
    pub revision: &'a Revision,
}

/// A refused forward: the response and the reason for the log.
pub struct Refusal {
    pub response: Vec<u8>,
    pub reason: String,
}

/// The seam for HTTP rules, TLS termination and credential placeholders. Without one, the
/// proxy refuses connections whose endpoint asks for inspection.
pub trait Inspector: Send + Sync + 'static {
    fn run(&self, t: InspectedTunnel) -> Pin<Box<dyn Future<Output = End> + Send>>;

    /// Whether CONNECTs to L4 endpoints (without `tls: skip`) come here too (TLS
    /// interception: a CA exists).
    fn intercepts_l4(&self) -> bool {
        false
    }

    /// Before any CONNECT's `200` (after the address checks): the refusal, if CONNECTs cannot
    /// be carried as the policy asks (`tls_skip`: the endpoint says `tls: skip`). The
    /// interceptor refuses every CONNECT but `tls: skip` when it has no CA.
    fn refuse_connect(&self, _dest: &HostPort, _tls_skip: bool) -> Option<Refusal> {
        None
    }

    /// Before a raw tunnel's `200`: the refusal, if this destination must not get one (an
    /// endpoint with credentials bound to it).
    fn refuse_raw(&self, _dest: &HostPort) -> Option<Refusal> {
        None
    }

    /// Before a forward's dial: the request-target to send upstream (canonical), or the
    /// refusal.
    fn forward(&self, f: &ForwardCheck<'_>) -> Result<String, Refusal> {
        Ok(f.path_and_query.to_string())
    }
}

/// Copy both ways until both directions end, the guard fires, or nothing moved for `idle`.
/// `early` goes upstream first (bytes the client sent right behind its CONNECT).
pub async fn tunnel(
    client: TcpStream,
    upstream: TcpStream,
    early: &[u8],
    guard: &mut Guard,
    idle: Option<Duration>,
) -> End {
    let (cr, cw) = client.into_split();
    let (ur, mut uw) = upstream.into_split();
    if !early.is_empty()
        && let Err(e) = uw.write_all(early).await
    {
        return End::Error(e);
    }
    let start = Instant::now();
    let last = AtomicU64::new(0);
    let both = async {
        let (a, b) = tokio::join!(pump(cr, uw, &last, start), pump(ur, cw, &last, start));
        a.and(b)
    };
    let idle_watch = async {
        let Some(limit) = idle else {
            return std::future::pending::<()>().await;
        };
        loop {
            let seen = Duration::from_millis(last.load(Ordering::Relaxed));
            let quiet = start.elapsed().saturating_sub(seen);
            if quiet >= limit {
                return;
            }
            tokio::time::sleep(limit - quiet).await;
        }
    };
    tokio::select! {
        r = both => match r {
            Ok(()) => End::Done,
            Err(e) => End::Error(e),
        },
        e = guard.ended() => e,
        _ = idle_watch => End::Idle,
    }
}

/// A pipe for `splice`, made while data flows and closed when the direction goes quiet, so
/// that an idle tunnel holds no descriptor beyond its two sockets.
struct Pipe {
    r: OwnedFd,
    w: OwnedFd,
}

impl Pipe {
    fn new() -> io::Result<Pipe> {
        let (r, w) = crate::sys::pipe(libc::O_NONBLOCK)?;
        // A larger pipe moves more per wake-up; the default (64 KiB) is kept if refused.
        // SAFETY: fcntl on a descriptor we own.
        unsafe {
            libc::fcntl(
                w.as_raw_fd(),
                libc::F_SETPIPE_SZ,
                SPLICE_PIPE as libc::c_int,
            )
        };
        Ok(Pipe { r, w })
    }
}

/// Bytes moved per splice.
const SPLICE_PIPE: usize = 256 * 1024;

/// `splice(2)` between two descriptors, non-blocking.
fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    // SAFETY: splice between descriptors we hold, with null offsets (pipes and sockets).
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// One direction, moved by the kernel (`splice` through a pipe, no copy into our memory).
/// `Ok(false)`: splice is not possible here, carry on with [`pump_copy`]. At EOF the write
/// side is shut down, so the peer sees the half-close.
async fn pump_splice(
    r: &OwnedReadHalf,
    w: &mut OwnedWriteHalf,
    last: &AtomicU64,
    start: Instant,
) -> io::Result<bool> {
    let (rfd, wfd) = (r.as_ref().as_raw_fd(), w.as_ref().as_raw_fd());
    loop {
        r.readable().await?;
        let pipe = Pipe::new()?;
        loop {
            let n = match r.as_ref().try_io(Interest::READABLE, || {
                splice(rfd, pipe.w.as_raw_fd(), SPLICE_PIPE)
            }) {
                Ok(0) => {
                    let _ = w.shutdown().await;
                    return Ok(true);
                }
                Ok(n) => n,
                // Quiet (the pipe is empty): give the pipe back until data comes again.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(false),
                Err(e) => return Err(e),
            };
            last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
            let mut left = n;
            while left > 0 {
                w.writable().await?;
                match w
                    .as_ref()
                    .try_io(Interest::WRITABLE, || splice(pipe.r.as_raw_fd(), wfd, left))
                {
                    Ok(m) => left -= m,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
}

/// One direction: spliced where the kernel can, copied otherwise.
async fn pump(
    r: OwnedReadHalf,
    mut w: OwnedWriteHalf,
    last: &AtomicU64,
    start: Instant,
) -> io::Result<()> {
    if pump_splice(&r, &mut w, last, start).await? {
        return Ok(());
    }
    pump_copy(r, w, last, start).await
}

/// One direction, through a buffer of ours. At EOF the write side is shut down, so the peer
/// sees the half-close.
async fn pump_copy(
    r: OwnedReadHalf,
    mut w: OwnedWriteHalf,
    last: &AtomicU64,
    start: Instant,
) -> io::Result<()> {
    loop {
        r.readable().await?;
        // Taken only now that there is something to read, and not zeroed.
        let mut buf = Vec::with_capacity(CHUNK);
        loop {
            buf.clear();
            match r.try_read_buf(&mut buf) {
                Ok(0) => {
                    let _ = w.shutdown().await;
                    return Ok(());
                }
                Ok(_) => {
                    last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
                    w.write_all(&buf).await?;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
#[path = "relay_tests.rs"]
mod tests;
