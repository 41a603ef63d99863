//! The two clocks of an inspected keep-alive tunnel: a request head must arrive whole within
//! the head timeout of its first byte (a slow client cannot hold the tunnel with a trickle),
//! and a tunnel with no byte either way for the idle timeout is closed. Between requests only
//! the idle clock runs, as for a raw tunnel: a keep-alive connection a client pools between
//! calls is not cut after the head timeout.
//!
//! hyper's own header timeout cannot tell the two apart (it runs while hyper waits for the
//! next head, idle or not), so it is off and these clocks watch the client's socket instead:
//! bytes read while no request is in flight start the head clock, a request handed to the
//! service stops it.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

/// What the clocks read, shared by the client's stream and the service.
pub struct Activity {
    start: Instant,
    /// Milliseconds since `start` of the last byte either way.
    last: AtomicU64,
    /// Requests handed to the service whose response has not been sent yet.
    in_flight: AtomicUsize,
    /// Milliseconds since `start` plus one of the first byte of a head not yet complete; 0:
    /// none.
    head_since: AtomicU64,
    head_started: Notify,
}

/// Why [`Activity::expired`] resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    Head,
    Idle,
}

impl Activity {
    pub fn new() -> Arc<Activity> {
        Arc::new(Activity {
            start: Instant::now(),
            last: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            head_since: AtomicU64::new(0),
            head_started: Notify::new(),
        })
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn read(&self) {
        let now = self.now();
        self.last.store(now, Ordering::Relaxed);
        if self.in_flight.load(Ordering::Acquire) == 0
            && self
                .head_since
                .compare_exchange(0, now + 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            self.head_started.notify_one();
        }
    }

    fn wrote(&self) {
        self.last.store(self.now(), Ordering::Relaxed);
    }

    /// A request reached the service: its head is complete. Held until its response is sent.
    pub fn request(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.head_since.store(0, Ordering::Release);
        InFlight(self.clone())
    }

    /// Resolves when a head took longer than `head`, or nothing moved for `idle`.
    pub async fn expired(&self, head: Duration, idle: Option<Duration>) -> Expired {
        loop {
            let now = self.now();
            let since = self.head_since.load(Ordering::Acquire);
            let head_left =
                (since != 0).then(|| (since - 1 + head.as_millis() as u64).saturating_sub(now));
            if head_left == Some(0) {
                return Expired::Head;
            }
            let idle_left = idle.map(|i| {
                (self.last.load(Ordering::Relaxed) + i.as_millis() as u64).saturating_sub(now)
            });
            // Even with a request in flight: a request whose body and answer both stopped
            // moving for the idle timeout holds the tunnel for nothing.
            if idle_left == Some(0) {
                return Expired::Idle;
            }
            let wait = [head_left, idle_left.map(|l| l.max(1))]
                .into_iter()
                .flatten()
                .min()
                .map(Duration::from_millis);
            match wait {
                Some(w) => {
                    tokio::select! {
                        _ = tokio::time::sleep(w) => {}
                        _ = self.head_started.notified() => {}
                    }
                }
                None => self.head_started.notified().await,
            }
        }
    }
}

/// One request in flight; dropped when its response has been written (or abandoned).
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.wrote();
    }
}

/// The idle clock of an upgraded connection (raw after a `101`, or the WebSocket relay): the
/// time of the last byte either way, stamped by [`Stamped`] streams.
pub struct Clock {
    start: Instant,
    last: AtomicU64,
}

impl Clock {
    pub fn new() -> Arc<Clock> {
        Arc::new(Clock {
            start: Instant::now(),
            last: AtomicU64::new(0),
        })
    }

    fn stamp(&self) {
        self.last
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Resolves once nothing moved either way for `idle`; never when `None`.
    pub async fn silent(&self, idle: Option<Duration>) {
        let Some(idle) = idle else {
            return std::future::pending().await;
        };
        loop {
            let seen = Duration::from_millis(self.last.load(Ordering::Relaxed));
            let quiet = self.start.elapsed().saturating_sub(seen);
            if quiet >= idle {
                return;
            }
            tokio::time::sleep(idle - quiet).await;
        }
    }
}

/// What a [`Noted`] stream tells of each read and write that moved bytes.
pub trait Note {
    fn read(&self);
    fn wrote(&self);
}

impl Note for Activity {
    fn read(&self) {
        Activity::read(self)
    }
    fn wrote(&self) {
        Activity::wrote(self)
    }
}

impl Note for Clock {
    fn read(&self) {
        self.stamp()
    }
    fn wrote(&self) {
        self.stamp()
    }
}

/// A stream whose reads and writes that moved bytes are told to a [`Note`].
pub struct Noted<T, N> {
    inner: T,
    note: Arc<N>,
}

/// The client's stream, noting its reads and writes in an [`Activity`].
pub type Watched<T> = Noted<T, Activity>;
/// A stream whose reads and writes stamp a [`Clock`].
pub type Stamped<T> = Noted<T, Clock>;

impl<T, N> Noted<T, N> {
    pub fn new(inner: T, note: Arc<N>) -> Noted<T, N> {
        Noted { inner, note }
    }
}

impl<T: AsyncRead + Unpin, N: Note> AsyncRead for Noted<T, N> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.note.read();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin, N: Note> AsyncWrite for Noted<T, N> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.note.wrote();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
