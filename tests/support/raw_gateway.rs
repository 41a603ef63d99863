//! A gRPC server written on h2 directly, over plaintext h2c, for tests that must put arbitrary
//! bytes on the response streams of ConnectSupervisor and RelayStream.
//!
//! The faithful test gateway (`gateway.rs`) is tonic-typed, so everything it sends is a
//! well-formed message in a well-formed frame. This one sends whatever the test hands it:
//! gRPC frames (1 flag byte, 4-byte big-endian length, body) or not, then any trailers, none,
//! RST_STREAM, GOAWAY, or a cut TCP connection. What the supervisor sends is parsed (it is our
//! own code under test, but the gateway side of the test must still see the hello, the
//! RelayOpenResult and the RelayStream `init`).
//!
//! Include it with `#[path = "support/raw_gateway.rs"] mod raw_gateway;`.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::{HeaderMap, HeaderValue, Response};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

pub const CONNECT_SUPERVISOR: &str = "/openshell.v1.OpenShell/ConnectSupervisor";
pub const RELAY_STREAM: &str = "/openshell.v1.OpenShell/RelayStream";

/// What our side accepts from the supervisor per message; it never sends more than a 16 KiB
/// relay chunk, so anything larger is a bug worth a clear error rather than an allocation.
const MAX_INBOUND: usize = 1 << 20;

/// The 5-byte gRPC frame header: compressed flag and declared body length.
pub fn header(flag: u8, len: u32) -> [u8; 5] {
    let mut h = [0u8; 5];
    h[0] = flag;
    h[1..].copy_from_slice(&len.to_be_bytes());
    h
}

/// A whole, uncompressed gRPC frame around `body`.
pub fn frame(body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(5 + body.len());
    v.extend_from_slice(&header(0, body.len() as u32));
    v.extend_from_slice(body);
    v
}

/// The server: every HTTP/2 stream opened on any connection becomes a [`Call`].
pub struct RawGateway {
    pub addr: SocketAddr,
    calls: mpsc::UnboundedReceiver<Call>,
    /// TCP connections accepted so far: the supervisor builds a new channel per session.
    pub connections: Arc<AtomicUsize>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl Drop for RawGateway {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

enum ConnCmd {
    Cut,
    GoAway(Reason),
}

impl RawGateway {
    pub async fn start() -> RawGateway {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, calls) = mpsc::unbounded_channel();
        let connections = Arc::new(AtomicUsize::new(0));
        let count = connections.clone();
        let accept_task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let _ = tcp.set_nodelay(true);
                let id = count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve_connection(tcp, id, tx.clone()));
            }
        });
        RawGateway {
            addr,
            calls,
            connections,
            accept_task,
        }
    }

    /// The endpoint for `OPENSHELL_ENDPOINT`: plaintext, which the supervisor accepts with a
    /// warning.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.addr.port())
    }

    /// The next stream the supervisor opened, or `None` after `limit`.
    pub async fn next_call(&mut self, limit: Duration) -> Option<Call> {
        tokio::time::timeout(limit, self.calls.recv())
            .await
            .ok()
            .flatten()
    }

    /// A call that has already arrived, without waiting.
    pub fn try_call(&mut self) -> Option<Call> {
        self.calls.try_recv().ok()
    }
}

/// The policy plane and log push: answered here, as a gateway with
/// no policy for the sandbox and a log sink, so tests see only the session and relay calls.
const PLANE_PATHS: [&str; 4] = [
    "/openshell.v1.OpenShell/GetSandboxConfig",
    "/openshell.v1.OpenShell/UpdateConfig",
    "/openshell.v1.OpenShell/ReportPolicyStatus",
    "/openshell.v1.OpenShell/PushSandboxLogs",
];

/// Read the request to its end, then answer one empty message (for GetSandboxConfig: no
/// policy, version 0) and OK.
async fn answer_plane(mut body: RecvStream, mut respond: SendResponse<Bytes>) {
    while let Some(chunk) = body.data().await {
        match chunk {
            Ok(c) => {
                let _ = body.flow_control().release_capacity(c.len());
            }
            Err(_) => return,
        }
    }
    let Ok(resp) = Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .body(())
    else {
        return;
    };
    let Ok(mut stream) = respond.send_response(resp, false) else {
        return;
    };
    let _ = stream.send_data(Bytes::from(frame(&[]).to_vec()), false);
    let mut t = HeaderMap::new();
    t.insert("grpc-status", HeaderValue::from_static("0"));
    let _ = stream.send_trailers(t);
}

async fn serve_connection(
    tcp: tokio::net::TcpStream,
    conn_id: usize,
    calls: mpsc::UnboundedSender<Call>,
) {
    let Ok(mut conn) = h2::server::handshake(tcp).await else {
        return;
    };
    let (cmd_tx, mut cmds) = mpsc::unbounded_channel();
    loop {
        // accept() is also what drives the connection (PINGs, flow control, the bytes of
        // every open stream), so it is polled until the connection is gone.
        tokio::select! {
            next = conn.accept() => match next {
                Some(Ok((req, respond))) => {
                    if PLANE_PATHS.contains(&req.uri().path()) {
                        tokio::spawn(answer_plane(req.into_body(), respond));
                        continue;
                    }
                    let call = Call {
                        path: req.uri().path().to_owned(),
                        inbound: Inbound::new(req.into_body()),
                        responder: Responder { respond, conn: cmd_tx.clone() },
                        conn_id,
                    };
                    if calls.send(call).is_err() {
                        return;
                    }
                }
                _ => return,
            },
            cmd = cmds.recv() => match cmd {
                // Dropping the connection closes the socket without GOAWAY or RST_STREAM.
                Some(ConnCmd::Cut) | None => return,
                Some(ConnCmd::GoAway(r)) => conn.abrupt_shutdown(r),
            },
        }
    }
}

/// One request stream from the supervisor.
pub struct Call {
    pub path: String,
    pub inbound: Inbound,
    pub responder: Responder,
    pub conn_id: usize,
}

/// How the response starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Head {
    /// `:status 200`, `content-type: application/grpc`: what a gRPC server sends.
    Grpc,
    /// Another HTTP status, with the gRPC content type.
    HttpStatus(u16),
    /// Status 200 with a content type that is not gRPC.
    ContentType(String),
    /// A trailers-only response: HEADERS carrying `grpc-status` with END_STREAM, no body.
    TrailersOnly(u32, String),
}

/// The response side of a call before its headers are sent.
pub struct Responder {
    respond: SendResponse<Bytes>,
    conn: mpsc::UnboundedSender<ConnCmd>,
}

impl Responder {
    /// Send the response headers. `None` for a trailers-only head (the stream is over) or when
    /// the supervisor already reset the stream.
    pub fn start(mut self, head: &Head) -> Option<Outbound> {
        let (status, ctype, end) = match head {
            Head::Grpc => (200, "application/grpc".to_string(), false),
            Head::HttpStatus(s) => (*s, "application/grpc".to_string(), false),
            Head::ContentType(c) => (200, c.clone(), false),
            Head::TrailersOnly(..) => (200, "application/grpc".to_string(), true),
        };
        let mut resp = Response::builder().status(status);
        if let Ok(v) = HeaderValue::from_str(&ctype) {
            resp = resp.header("content-type", v);
        }
        if let Head::TrailersOnly(code, msg) = head {
            resp = resp.header("grpc-status", code.to_string());
            if let Ok(v) = HeaderValue::from_str(msg) {
                resp = resp.header("grpc-message", v);
            }
        }
        let stream = self.respond.send_response(resp.body(()).ok()?, end).ok()?;
        (!end).then_some(Outbound {
            stream,
            conn: self.conn,
        })
    }

    pub fn reset(mut self, reason: u32) {
        self.respond.send_reset(Reason::from(reason));
    }
}

/// How a response stream ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// Trailers: `grpc-status` when given, `grpc-message` when given.
    Trailers {
        status: Option<String>,
        message: Option<String>,
    },
    /// END_STREAM on an empty DATA frame: no trailers at all.
    NoTrailers,
    /// RST_STREAM with this error code.
    Reset(u32),
    /// GOAWAY with this error code: every stream of the connection ends.
    GoAway(u32),
    /// The TCP connection closes without a word.
    Cut,
}

impl Ending {
    pub fn ok() -> Ending {
        Ending::Trailers {
            status: Some("0".into()),
            message: None,
        }
    }
}

/// The response body after the headers: any bytes, then an [`Ending`].
pub struct Outbound {
    stream: SendStream<Bytes>,
    conn: mpsc::UnboundedSender<ConnCmd>,
}

impl Outbound {
    /// Queue bytes on the stream. h2 buffers past the peer's window, so a test sends at most a
    /// few MiB this way. An error means the supervisor reset the stream or the connection died.
    pub fn raw(&mut self, bytes: impl Into<Bytes>) -> Result<(), h2::Error> {
        let b = bytes.into();
        if b.is_empty() {
            return Ok(());
        }
        self.stream.send_data(b, false)
    }

    /// One well-formed frame holding `m`.
    pub fn message(&mut self, m: &impl prost::Message) -> Result<(), h2::Error> {
        self.raw(frame(&m.encode_to_vec()))
    }

    pub fn end(mut self, how: &Ending) {
        // Errors mean the stream or connection is already gone, which ends it too.
        match how {
            Ending::Trailers { status, message } => {
                let mut t = HeaderMap::new();
                for (k, v) in [("grpc-status", status), ("grpc-message", message)] {
                    if let Some(v) = v.as_deref().and_then(|v| HeaderValue::from_str(v).ok()) {
                        t.insert(k, v);
                    }
                }
                let _ = self.stream.send_trailers(t);
            }
            Ending::NoTrailers => {
                let _ = self.stream.send_data(Bytes::new(), true);
            }
            Ending::Reset(r) => self.stream.send_reset(Reason::from(*r)),
            Ending::GoAway(r) => {
                let _ = self.conn.send(ConnCmd::GoAway(Reason::from(*r)));
            }
            Ending::Cut => {
                let _ = self.conn.send(ConnCmd::Cut);
            }
        }
    }
}

/// The supervisor's request stream, parsed into gRPC frames.
pub struct Inbound {
    body: RecvStream,
    buf: BytesMut,
}

impl Inbound {
    fn new(body: RecvStream) -> Inbound {
        Inbound {
            body,
            buf: BytesMut::new(),
        }
    }

    /// The next message; `Ok(None)` when the supervisor ended its stream between frames.
    /// `Err` for a reset stream or a frame our supervisor should never send.
    pub async fn next<M: prost::Message + Default>(&mut self) -> Result<Option<M>, String> {
        loop {
            if self.buf.len() >= 5 {
                let flag = self.buf[0];
                let len = u32::from_be_bytes(self.buf[1..5].try_into().unwrap()) as usize;
                if flag != 0 {
                    return Err(format!("the supervisor sent compressed-flag {flag}"));
                }
                if len > MAX_INBOUND {
                    return Err(format!("the supervisor sent a {len}-byte message"));
                }
                if self.buf.len() >= 5 + len {
                    self.buf.advance(5);
                    let body = self.buf.split_to(len).freeze();
                    return M::decode(body)
                        .map(Some)
                        .map_err(|e| format!("undecodable message from the supervisor: {e}"));
                }
            }
            match self.body.data().await {
                Some(Ok(chunk)) => {
                    // Without releasing, the window closes after 64 KiB and the supervisor
                    // stalls, which would look like a hang of the code under test.
                    let _ = self.body.flow_control().release_capacity(chunk.len());
                    self.buf.put(chunk);
                }
                Some(Err(e)) => return Err(format!("request stream: {e}")),
                None if self.buf.is_empty() => return Ok(None),
                None => return Err("request stream ended inside a frame".into()),
            }
        }
    }
}
