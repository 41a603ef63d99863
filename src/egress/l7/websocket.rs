//! The parsed WebSocket relay of a `protocol: websocket` endpoint, after its upgrade was
//! allowed: every client text message is checked as the synthetic method `WEBSOCKET_TEXT`
//! against the upgrade's path and query; binary messages and control frames pass as they
//! are; server frames pass as they are. A denied message closes both sides with 1008, a new
//! policy generation with 1012, bad UTF-8 with 1007, a protocol error with 1002, a message
//! too big with 1009 (RFC 6455 codes, as OpenShell uses them).
//!
//! The frame codec is ours rather than a WebSocket crate's: the relay needs frames one by one
//! from both sides, with the upgrade already done by hyper and both sides' bytes passed on
//! unchanged unless a message is refused, which the crates (built to be an endpoint) do not
//! offer. Compression is kept off by removing `Sec-WebSocket-Extensions` from the upgrade
//! request (`relay.rs`), so every text message can be read.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::Mutex;

use super::super::event::{EventSink, L7Decision, L7Event};
use super::super::identity::Caller;
use super::super::relay::{End, Guard};
use super::rules::{CompiledRules, L7Scope, RequestView, Verdict};

/// A client text message, assembled, at most this long (1009 past it).
pub const MAX_TEXT: usize = 4 << 20;
/// One frame's payload at most (1009 past it).
pub const MAX_FRAME: u64 = 16 << 20;
/// Fragments of one message at most (1009 past it).
pub const MAX_FRAGMENTS: usize = 4096;

/// Close codes.
pub const POLICY_VIOLATION: u16 = 1008;
pub const SERVICE_RESTART: u16 = 1012;
const INVALID_PAYLOAD: u16 = 1007;
const PROTOCOL_ERROR: u16 = 1002;
const TOO_BIG: u16 = 1009;

const TEXT: u8 = 1;
const BINARY: u8 = 2;
const CONTINUATION: u8 = 0;
const CLOSE: u8 = 8;

/// One frame, its payload unmasked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub fin: bool,
    pub rsv: u8,
    pub opcode: u8,
    pub masked: bool,
    pub payload: Vec<u8>,
}

/// Why a frame could not be read: the close code it calls for.
#[derive(Debug)]
enum ReadError {
    Io,
    TooBig,
}

/// Read one frame; `Ok(None)` at a clean end between frames.
async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Frame>, ReadError> {
    let mut h = [0u8; 2];
    match r.read(&mut h[..1]).await {
        Ok(0) => return Ok(None),
        Ok(_) => {}
        Err(_) => return Err(ReadError::Io),
    }
    r.read_exact(&mut h[1..]).await.map_err(|_| ReadError::Io)?;
    let masked = h[1] & 0x80 != 0;
    let len = match h[1] & 0x7f {
        126 => u64::from(r.read_u16().await.map_err(|_| ReadError::Io)?),
        127 => r.read_u64().await.map_err(|_| ReadError::Io)?,
        n => u64::from(n),
    };
    if len > MAX_FRAME {
        return Err(ReadError::TooBig);
    }
    let mut key = [0u8; 4];
    if masked {
        r.read_exact(&mut key).await.map_err(|_| ReadError::Io)?;
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload)
        .await
        .map_err(|_| ReadError::Io)?;
    if masked {
        apply_mask(&mut payload, key);
    }
    Ok(Some(Frame {
        fin: h[0] & 0x80 != 0,
        rsv: (h[0] >> 4) & 0x7,
        opcode: h[0] & 0x0f,
        masked,
        payload,
    }))
}

fn apply_mask(p: &mut [u8], key: [u8; 4]) {
    for (i, b) in p.iter_mut().enumerate() {
        *b ^= key[i % 4];
    }
}

/// One frame on the wire; masked with a fresh key when `mask` (client to server).
pub fn encode(fin: bool, opcode: u8, payload: &[u8], mask: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 14);
    out.push(if fin { 0x80 } else { 0 } | (opcode & 0x0f));
    let m = if mask { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => out.push(m | n as u8),
        n if n <= 0xffff => {
            out.push(m | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(m | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    if mask {
        let key: [u8; 4] = rand::random();
        out.extend_from_slice(&key);
        let at = out.len();
        out.extend_from_slice(payload);
        apply_mask(&mut out[at..], key);
    } else {
        out.extend_from_slice(payload);
    }
    out
}

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

type Shared<W> = Arc<Mutex<W>>;

/// Close both sides with `code`.
async fn close_both<C, U>(client: &Shared<WriteHalf<C>>, upstream: &Shared<WriteHalf<U>>, code: u16)
where
    C: AsyncWrite,
    U: AsyncWrite,
{
    let p = close_payload(code);
    let _ = client
        .lock()
        .await
        .write_all(&encode(true, CLOSE, &p, false))
        .await;
    let _ = upstream
        .lock()
        .await
        .write_all(&encode(true, CLOSE, &p, true))
        .await;
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

/// Client to upstream: text messages assembled and checked.
async fn client_side<C, U>(mut r: ReadHalf<C>, w: Shared<WriteHalf<U>>, cx: &Context) -> Side
where
    C: AsyncRead,
    U: AsyncWrite,
{
    // The text message being assembled, and whether a binary one is open.
    let mut text: Option<(Vec<u8>, usize)> = None;
    let mut binary_open = false;
    loop {
        let f = match read_frame(&mut r).await {
            Ok(Some(f)) => f,
            Ok(None) | Err(ReadError::Io) => return Side::Ended,
            Err(ReadError::TooBig) => return Side::Code(TOO_BIG),
        };
        if !f.masked || f.rsv != 0 {
            return Side::Code(PROTOCOL_ERROR);
        }
        let whole = match (f.opcode, &mut text, binary_open) {
            (TEXT, None, false) if f.fin => Some(f.payload),
            (TEXT, None, false) if f.payload.len() > MAX_TEXT => return Side::Code(TOO_BIG),
            (TEXT, None, false) => {
                text = Some((f.payload, 1));
                None
            }
            (CONTINUATION, Some((buf, n)), _) => {
                // Checked before the buffer grows: it never holds more than the limit.
                *n += 1;
                if buf.len() + f.payload.len() > MAX_TEXT || *n > MAX_FRAGMENTS {
                    return Side::Code(TOO_BIG);
                }
                buf.extend_from_slice(&f.payload);
                if f.fin {
                    text.take().map(|(b, _)| b)
                } else {
                    None
                }
            }
            (BINARY, None, false) | (CONTINUATION, None, true) => {
                binary_open = !f.fin;
                let bytes = encode(f.fin, f.opcode, &f.payload, true);
                if w.lock().await.write_all(&bytes).await.is_err() {
                    return Side::Ended;
                }
                None
            }
            (op, _, _) if op >= CLOSE && f.fin && f.payload.len() <= 125 => {
                // Control frames (close, ping, pong) may come between fragments.
                let bytes = encode(true, op, &f.payload, true);
                if w.lock().await.write_all(&bytes).await.is_err() {
                    return Side::Ended;
                }
                if op == CLOSE {
                    return Side::Closed;
                }
                None
            }
            _ => return Side::Code(PROTOCOL_ERROR),
        };
        let Some(msg) = whole else { continue };
        if msg.len() > MAX_TEXT {
            return Side::Code(TOO_BIG);
        }
        if std::str::from_utf8(&msg).is_err() {
            return Side::Code(INVALID_PAYLOAD);
        }
        // Text messages are not rewritten: a placeholder in one would leave as it is.
        if super::super::credentials::has_marker(&msg) || cx.check().is_err() {
            return Side::Code(POLICY_VIOLATION);
        }
        if w.lock()
            .await
            .write_all(&encode(true, TEXT, &msg, true))
            .await
            .is_err()
        {
            return Side::Ended;
        }
    }
}

/// Upstream to client: frames passed as they are (re-encoded whole, so that a close frame of
/// ours only ever lands between two of them).
async fn upstream_side<U, C>(mut r: ReadHalf<U>, w: Shared<WriteHalf<C>>) -> Side
where
    U: AsyncRead,
    C: AsyncWrite,
{
    loop {
        let f = match read_frame(&mut r).await {
            Ok(Some(f)) => f,
            Ok(None) | Err(ReadError::Io) => return Side::Ended,
            Err(ReadError::TooBig) => return Side::Code(TOO_BIG),
        };
        if f.masked {
            return Side::Code(PROTOCOL_ERROR);
        }
        let bytes = encode(f.fin, f.opcode | (f.rsv << 4), &f.payload, false);
        if w.lock().await.write_all(&bytes).await.is_err() {
            return Side::Ended;
        }
        if f.opcode == CLOSE {
            return Side::Closed;
        }
    }
}

/// Relay an upgraded connection until either side ends, a message is refused, or the guard
/// fires.
pub async fn relay<C, U>(client: C, upstream: U, cx: Context, guard: &mut Guard) -> End
where
    C: AsyncRead + AsyncWrite + Send + 'static,
    U: AsyncRead + AsyncWrite + Send + 'static,
{
    let (cr, cw) = tokio::io::split(client);
    let (ur, uw) = tokio::io::split(upstream);
    let (cw, uw) = (Arc::new(Mutex::new(cw)), Arc::new(Mutex::new(uw)));
    // Some(code): close both sides with it. A close passed on one way waits (briefly) for
    // the answer the other way.
    let client = client_side(cr, uw.clone(), &cx);
    let upstream = upstream_side(ur, cw.clone());
    tokio::pin!(client, upstream);
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
    };
    let code = match side {
        Side::Code(c) => Some(c),
        Side::Closed | Side::Ended => None,
    };
    if let Some(code) = code {
        close_both(&cw, &uw, code).await;
    }
    let _ = cw.lock().await.shutdown().await;
    let _ = uw.lock().await.shutdown().await;
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_masked_and_unmasked() {
        for len in [0usize, 5, 125, 126, 65535, 65536, 100_000] {
            let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            for mask in [false, true] {
                let bytes = encode(true, TEXT, &payload, mask);
                let f = read_frame(&mut bytes.as_slice()).await.unwrap().unwrap();
                assert_eq!((f.fin, f.opcode, f.masked), (true, TEXT, mask));
                assert_eq!(f.payload, payload);
            }
        }
        let big = [0x82u8, 127, 0, 0, 0, 0, 2, 0, 0, 0];
        assert!(matches!(
            read_frame(&mut big.as_slice()).await,
            Err(ReadError::TooBig)
        ));
    }
}
