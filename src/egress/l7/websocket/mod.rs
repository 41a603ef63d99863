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

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::Mutex;

use super::super::event::{EventSink, L7Decision, L7Event};
use super::super::identity::Caller;
use super::super::relay::{End, Guard};
use super::idle::{Clock, Stamped};
use super::rules::{CompiledRules, L7Scope, RequestView, Verdict};

mod client;
mod frame;
mod limits;

pub use frame::{Header, encode};
use frame::{ReadError, read_header, stream};
pub use limits::{Assemblies, Full, Limits, Slot};

/// Close codes.
pub const POLICY_VIOLATION: u16 = 1008;
pub const SERVICE_RESTART: u16 = 1012;
pub const TRY_AGAIN_LATER: u16 = 1013;
const GOING_AWAY: u16 = 1001;
const INVALID_PAYLOAD: u16 = 1007;
const PROTOCOL_ERROR: u16 = 1002;
const TOO_BIG: u16 = 1009;

const TEXT: u8 = 1;
const BINARY: u8 = 2;
const CONTINUATION: u8 = 0;
const CLOSE: u8 = 8;

fn close_payload(code: u16) -> Vec<u8> {
    code.to_be_bytes().to_vec()
}

/// What a text message is checked against: the upgrade's rules and request.
pub struct Context {
    pub rules: Arc<CompiledRules>,
    pub host: String,
    pub port: u16,
    /// `host:port`, for events.
    pub dest: String,
    pub caller: Caller,
    /// The upgrade's canonical path and query.
    pub path: String,
    pub query: Vec<(String, String)>,
    pub events: Arc<dyn EventSink>,
    pub generation: u64,
    /// The proxy's limits (its assembly slots among them).
    pub limits: Arc<Limits>,
    /// The relay closes after this without a byte either way.
    pub idle: Option<Duration>,
}

impl Context {
    /// `Ok(())` to forward the message (allowed or audited), `Err(())` to refuse it.
    fn check(&self) -> Result<(), ()> {
        let scope = L7Scope::of(&self.rules, &self.host, self.port, &self.caller);
        let verdict = scope.evaluate(&RequestView {
            method: "WEBSOCKET_TEXT",
            path: &self.path,
            query: &self.query,
        });
        let (decision, rule, reason, ok) = match verdict {
            Verdict::Allow { rule } => (L7Decision::Allow, rule, None, true),
            Verdict::Audit { rule, reason } => (L7Decision::Audit, rule, Some(reason), true),
            Verdict::Deny { rule, reason } => (L7Decision::Deny, rule, Some(reason), false),
        };
        self.events.emit_l7(&L7Event {
            decision,
            method: "WEBSOCKET_TEXT".into(),
            dest: self.dest.clone(),
            path: self.path.clone(),
            rule,
            reason,
            caller: self.caller.clone(),
            generation: self.generation,
            credentials_injected: false,
        });
        if ok { Ok(()) } else { Err(()) }
    }
}

/// One side's writer, and whether a frame is part-written to it (then no close frame of ours
/// may follow: it would land inside that frame).
pub(super) struct Out<W> {
    w: WriteHalf<W>,
    mid: bool,
}

type Shared<W> = Arc<Mutex<Out<W>>>;

impl<W: AsyncWrite> Out<W> {
    /// Pass one frame through from `r`, streamed.
    async fn pass<R: AsyncRead + Unpin>(&mut self, r: &mut R, h: &Header) -> bool {
        self.mid = true;
        let ok = stream(r, &mut self.w, h).await.is_ok();
        self.mid = !ok;
        ok
    }

    /// Write one whole frame.
    async fn send(&mut self, bytes: &[u8]) -> bool {
        self.mid = true;
        let ok = self.w.write_all(bytes).await.is_ok();
        self.mid = !ok;
        ok
    }

    /// Close with `code` (unless a frame is part-written), then shut the stream down.
    async fn close(&mut self, code: Option<u16>, mask: bool) {
        if let Some(code) = code
            && !self.mid
        {
            let _ = self
                .w
                .write_all(&encode(true, CLOSE, &close_payload(code), mask))
                .await;
        }
        let _ = self.w.shutdown().await;
    }
}

/// How one direction of the relay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// It passed a close frame on: the other direction may still carry the answer.
    Closed,
    /// Its stream ended or failed.
    Ended,
    /// Close both sides with this code.
    Code(u16),
}

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
    let cw = Arc::new(Mutex::new(Out { w: cw, mid: false }));
    let uw = Arc::new(Mutex::new(Out { w: uw, mid: false }));
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
