//! The parsed WebSocket relay of a `protocol: websocket` endpoint, after its upgrade was
//! allowed: every client text message is checked as the synthetic method `WEBSOCKET_TEXT`
//! against the upgrade's path and query; binary messages and control frames pass as they
//! are; server frames pass as they are. A denied message closes both sides with 1008, a new
//! policy generation with 1012, bad UTF-8 with 1007, a protocol error with 1002, a message
//! too big with 1009, no room for one more text message being assembled with 1013, a text
//! message whose assembly went quiet or took too long with 1008 (RFC 6455 codes, as OpenShell
//! uses them). A relay with no byte either way for the tunnel's idle timeout is closed (1001).
//!
//! Only client text messages are read whole (they are checked first), bounded by
//! [`Limits`]; binary messages, control frames and every server frame are streamed through in
//! chunks of [`frame::CHUNK`], so a hostile client cannot pin memory with large frames.
//!
//! The frame codec is ours rather than a WebSocket crate's: the relay needs frames one by one
//! from both sides, with the upgrade already done by hyper and both sides' bytes passed on
//! unchanged unless a message is refused, which the crates (built to be an endpoint) do not
//! offer. Compression is kept off by removing `Sec-WebSocket-Extensions` from the upgrade
//! request (`relay.rs`), so every text message can be read.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadHalf};

use super::super::relay::{End, Guard};
use super::idle::{Clock, Stamped};

mod client;
mod frame;
mod limits;
mod parts;

pub use frame::{Header, encode};
use frame::{ReadError, read_header};
pub use limits::{Assemblies, Full, Limits, Slot};
use parts::{CLOSE, GOING_AWAY, Out, PROTOCOL_ERROR, Shared, Side, TOO_BIG};
pub use parts::{Context, POLICY_VIOLATION, SERVICE_RESTART, TRY_AGAIN_LATER};

/// Upstream to client: frames streamed through as they are, one at a time (so that a close
/// frame of ours only ever lands between two of them).
async fn upstream_side<U, C>(mut r: ReadHalf<U>, w: Shared<C>, limits: &Limits) -> Side
where
    U: AsyncRead,
    C: AsyncWrite,
{
    loop {
        let h = match read_header(&mut r, limits.max_frame).await {
            Ok(Some(h)) => h,
            Ok(None) | Err(ReadError::Io | ReadError::Idle) => return Side::Ended,
            Err(ReadError::TooBig) => return Side::Code(TOO_BIG),
        };
        if h.masked {
            return Side::Code(PROTOCOL_ERROR);
        }
        if !w.lock().await.pass(&mut r, &h).await {
            return Side::Ended;
        }
        if h.opcode == CLOSE {
            return Side::Closed;
        }
    }
}

/// Relay an upgraded connection until either side ends, a message is refused, the guard
/// fires or nothing moves for the idle timeout.
pub async fn relay<C, U>(client: C, upstream: U, cx: Context, guard: &mut Guard) -> End
where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    U: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let clock = Clock::new();
    let (cr, cw) = tokio::io::split(Stamped::new(client, clock.clone()));
    let (ur, uw) = tokio::io::split(Stamped::new(upstream, clock.clone()));
    let (cw, uw) = (Out::new(cw), Out::new(uw));
    let limits = cx.limits.clone();
    let mut client = Box::pin(client::client_side(cr, uw.clone(), &cx));
    let mut upstream = Box::pin(upstream_side(ur, cw.clone(), &limits));
    // A close passed on one way waits (briefly) for the answer the other way.
    let answer = Duration::from_secs(5);
    let (end, side) = tokio::select! {
        c = &mut client => match c {
            Side::Closed => (End::Done, tokio::time::timeout(answer, &mut upstream).await.unwrap_or(Side::Ended)),
            c => (End::Done, c),
        },
        u = &mut upstream => match u {
            Side::Closed => (End::Done, tokio::time::timeout(answer, &mut client).await.unwrap_or(Side::Ended)),
            u => (End::Done, u),
        },
        e = guard.ended() => (e, Side::Code(SERVICE_RESTART)),
        _ = clock.silent(cx.idle) => (End::Idle, Side::Code(GOING_AWAY)),
    };
    // Both directions stop here: a frame one of them was streaming stays part-written, and
    // its writer says so.
    drop((client, upstream));
    let code = match side {
        Side::Code(c) => Some(c),
        Side::Closed | Side::Ended => None,
    };
    cw.lock().await.close(code, false).await;
    uw.lock().await.close(code, true).await;
    end
}
