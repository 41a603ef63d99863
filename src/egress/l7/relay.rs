//! The inspecting HTTP relay: every request of a tunnel (plain, or inside the client's TLS
//! session) is parsed, canonicalised, checked against the tunnel's authority and the L7
//! rules, its placeholders replaced, and only then sent upstream. hyper carries both sides,
//! so keep-alive, chunked bodies and streaming responses pass without being buffered. An
//! allowed upgrade is relayed once hyper hands both sides over: raw on a `rest` endpoint,
//! message by message on a `websocket` one (`websocket.rs`), either until the guard fires.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};

use super::super::relay::{End, Guard};
use super::handle::handle;
use super::idle::{Activity, Clock, Expired, InFlight, Stamped, Watched};
use super::respond::{Body, BoxError};
pub use super::tunnel::Tunnel;
use super::tunnel::{Closed, Upgrade, UpgradeSlot};
use super::websocket;

/// Header block of one request inside a relay.
pub const MAX_RELAY_HEAD: usize = 16 * 1024;

/// A response body that holds its request's [`InFlight`] until it has been written.
struct Held {
    inner: Body,
    _in_flight: InFlight,
}

impl hyper::body::Body for Held {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Serve the tunnel's requests until either side ends, the guard fires or a clock of
/// [`Activity`] runs out.
pub async fn serve<C, U>(client: C, upstream: U, t: Tunnel, guard: &mut Guard) -> End
where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    U: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let handshake = hyper::client::conn::http1::Builder::new()
        .preserve_header_case(true)
        .max_buf_size(1024 * 1024)
        .handshake::<_, Body>(TokioIo::new(upstream))
        .await;
    let (sender, conn) = match handshake {
        Ok(x) => x,
        Err(e) => return End::Error(io::Error::other(e)),
    };
    // Drives the request and response bodies; it ends when the upstream closes, or hands the
    // upstream over after a 101.
    let mut driver = tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let sender = Arc::new(tokio::sync::Mutex::new(sender));
    let t = Arc::new(t);
    let generation = guard.generation();
    let stale: Arc<dyn Fn() -> bool + Send + Sync> = Arc::new(guard.probe());
    let activity = Activity::new();
    let upgrade: UpgradeSlot = Arc::default();
    let svc = {
        let (t, stale, activity, upgrade) =
            (t.clone(), stale.clone(), activity.clone(), upgrade.clone());
        hyper::service::service_fn(move |req: Request<Incoming>| {
            let (t, sender, stale, upgrade) =
                (t.clone(), sender.clone(), stale.clone(), upgrade.clone());
            let in_flight = activity.request();
            async move {
                let r = handle(req, &t, &sender, &*stale, generation, &upgrade).await?;
                let (parts, body) = r.into_parts();
                let held = Held {
                    inner: body,
                    _in_flight: in_flight,
                };
                Ok::<_, Closed>(Response::from_parts(parts, held.boxed()))
            }
        })
    };
    let mut server = hyper::server::conn::http1::Builder::new();
    server
        .timer(TokioTimer::new())
        // The head and idle clocks are ours (idle.rs).
        .header_read_timeout(None)
        .max_buf_size(MAX_RELAY_HEAD)
        .max_headers(128)
        .preserve_header_case(true);
    let client = Watched::new(client, activity.clone());
    let conn = server
        .serve_connection(TokioIo::new(client), svc)
        .with_upgrades();
    let end = tokio::select! {
        r = conn => match r {
            Ok(()) => End::Done,
            Err(e) => End::Error(io::Error::other(e)),
        },
        e = guard.ended() => e,
        x = activity.expired(t.head_timeout, t.idle_timeout) => match x {
            Expired::Head | Expired::Idle => End::Idle,
        },
    };
    let won = upgrade.lock().unwrap_or_else(|p| p.into_inner()).take();
    let end = match (end, won) {
        (End::Done, Some(up)) => {
            // The upstream side is handed over once the driver has seen the 101 through.
            let _ = tokio::time::timeout(Duration::from_secs(5), &mut driver).await;
            relay_upgrade(up, guard, t.idle_timeout).await
        }
        (end, _) => end,
    };
    driver.abort();
    end
}

/// Relay an upgraded connection: message by message on a `websocket` endpoint, raw otherwise;
/// either closes after `idle` without a byte either way.
async fn relay_upgrade(up: Upgrade, guard: &mut Guard, idle: Option<Duration>) -> End {
    let (c, u) = match tokio::join!(up.client, up.upstream) {
        (Ok(c), Ok(u)) => (TokioIo::new(c), TokioIo::new(u)),
        (Err(e), _) | (_, Err(e)) => return End::Error(io::Error::other(e)),
    };
    match up.websocket {
        Some(cx) => websocket::relay(c, u, cx, guard).await,
        None => {
            let clock = Clock::new();
            let mut c = Stamped::new(c, clock.clone());
            let mut u = Stamped::new(u, clock.clone());
            tokio::select! {
                r = tokio::io::copy_bidirectional(&mut c, &mut u) => match r {
                    Ok(_) => End::Done,
                    Err(e) => End::Error(e),
                },
                e = guard.ended() => e,
                _ = clock.silent(idle) => End::Idle,
            }
        }
    }
}
