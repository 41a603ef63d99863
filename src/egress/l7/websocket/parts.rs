//! What the two directions of a WebSocket relay share: the codes, what a text message is
//! checked against, each side's writer, and how a direction ended.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, WriteHalf};
use tokio::sync::Mutex;

use super::super::super::event::{EventSink, L7Decision, L7Event};
use super::super::super::identity::Caller;
use super::super::rules::{CompiledRules, L7Scope, RequestView, Verdict};
use super::frame::{Header, encode, stream};
use super::limits::Limits;

/// Close codes.
pub const POLICY_VIOLATION: u16 = 1008;
pub const SERVICE_RESTART: u16 = 1012;
pub const TRY_AGAIN_LATER: u16 = 1013;
pub const GOING_AWAY: u16 = 1001;
pub const INVALID_PAYLOAD: u16 = 1007;
pub const PROTOCOL_ERROR: u16 = 1002;
pub const TOO_BIG: u16 = 1009;

pub const TEXT: u8 = 1;
pub const BINARY: u8 = 2;
pub const CONTINUATION: u8 = 0;
pub const CLOSE: u8 = 8;

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
    pub(super) fn check(&self) -> Result<(), ()> {
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
pub struct Out<W> {
    w: WriteHalf<W>,
    mid: bool,
}

pub type Shared<W> = Arc<Mutex<Out<W>>>;

impl<W: AsyncWrite> Out<W> {
    pub fn new(w: WriteHalf<W>) -> Shared<W> {
        Arc::new(Mutex::new(Out { w, mid: false }))
    }

    /// Pass one frame through from `r`, streamed.
    pub async fn pass<R: AsyncRead + Unpin>(&mut self, r: &mut R, h: &Header) -> bool {
        self.mid = true;
        let ok = stream(r, &mut self.w, h).await.is_ok();
        self.mid = !ok;
        ok
    }

    /// Write one whole frame.
    pub async fn send(&mut self, head: &[u8], payload: &[u8]) -> bool {
        self.mid = true;
        let ok = self.w.write_all(head).await.is_ok() && self.w.write_all(payload).await.is_ok();
        self.mid = !ok;
        ok
    }

    /// Close with `code` (unless a frame is part-written), then shut the stream down.
    pub async fn close(&mut self, code: Option<u16>, mask: bool) {
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
pub enum Side {
    /// It passed a close frame on: the other direction may still carry the answer.
    Closed,
    /// Its stream ended or failed.
    Ended,
    /// Close both sides with this code.
    Code(u16),
}
