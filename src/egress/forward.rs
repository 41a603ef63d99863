//! Forwarding one absolute-form plain-HTTP request, after the decision, the address checks
//! and the dial.
//!
//! hyper carries it both ways, so that the request body is framed exactly as the head says
//! (`Content-Length` or chunked) and nothing the client sends after it reaches the upstream: a
//! second, pipelined request with another `Host` would otherwise ride along to an address
//! that was checked for the first one. One request per client connection
//! (`Connection: close` both ways). Upstream, the request is origin-form, `Host` is rebuilt
//! from the URI's authority (the client's `Host` is never an input), the hop-by-hop and
//! `Proxy-*` headers are removed and `Via: 1.1 openshell-sandbox` is added unless a `Via` is
//! there already.

use std::convert::Infallible;
use std::io;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use tokio::net::TcpStream;

use super::prefixed::Prefixed;
use super::relay::{End, Guard};
use super::response;

type Body = BoxBody<Bytes, hyper::Error>;

/// What the upstream request is built from.
pub struct Forward {
    /// The URI authority: the `Host` sent upstream.
    pub authority: String,
    pub path_and_query: String,
    /// `host:port` for the 502 detail.
    pub dest: String,
}

/// Serve the client's one request (its head is in `head`, already read) over `upstream`.
pub async fn serve(
    client: TcpStream,
    head: Vec<u8>,
    upstream: TcpStream,
    fwd: Forward,
    guard: &mut Guard,
) -> End {
    let upstream = Arc::new(Mutex::new(Some(upstream)));
    let fwd = Arc::new(fwd);
    let driver: Arc<Mutex<Option<tokio::task::AbortHandle>>> = Arc::default();
    let driver_slot = driver.clone();
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let upstream = upstream.clone();
        let fwd = fwd.clone();
        let driver = driver_slot.clone();
        async move {
            let taken = upstream.lock().unwrap_or_else(|p| p.into_inner()).take();
            let resp = match taken {
                Some(up) => send(req, up, &fwd, &driver).await,
                None => None,
            };
            Ok::<_, Infallible>(resp.unwrap_or_else(|| bad_gateway(&fwd.dest)))
        }
    });
    let io = TokioIo::new(Prefixed::new(head, client));
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .max_headers(128)
        .serve_connection(io, svc);
    let end = tokio::select! {
        r = conn => match r {
            Ok(()) => End::Done,
            Err(e) => End::Error(io::Error::other(e)),
        },
        e = guard.ended() => e,
    };
    // An upstream that ignores `Connection: close` must not keep its task and socket.
    if let Some(h) = driver.lock().unwrap_or_else(|p| p.into_inner()).take() {
        h.abort();
    }
    end
}

fn bad_gateway(dest: &str) -> Response<Body> {
    let raw = response::upstream_unreachable(dest);
    // The body is what follows the blank line of the prebuilt response.
    let at = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(0, |i| i + 4);
    Response::builder()
        .status(502)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONNECTION, "close")
        .body(full(Bytes::copy_from_slice(&raw[at..])))
        .expect("static response")
}

fn full(b: Bytes) -> Body {
    Full::new(b).map_err(|never| match never {}).boxed()
}

/// Remove the hop-by-hop headers, and those the `Connection` header names.
fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in [
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ] {
        h.remove(n);
    }
}

async fn send(
    req: Request<Incoming>,
    up: TcpStream,
    fwd: &Forward,
    driver: &Mutex<Option<tokio::task::AbortHandle>>,
) -> Option<Response<Body>> {
    let (parts, body) = req.into_parts();
    let mut headers = parts.headers;
    strip_hop_by_hop(&mut headers);
    headers.remove(header::HOST);
    headers.insert(header::HOST, HeaderValue::from_str(&fwd.authority).ok()?);
    if !headers.contains_key(header::VIA) {
        headers.insert(
            header::VIA,
            HeaderValue::from_static("1.1 openshell-sandbox"),
        );
    }
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    let mut out = Request::builder()
        .method(parts.method)
        .uri(fwd.path_and_query.as_str())
        .body(body.boxed())
        .ok()?;
    *out.headers_mut() = headers;
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .title_case_headers(true)
        .handshake::<_, Body>(TokioIo::new(up))
        .await
        .ok()?;
    // The connection task drives both the request body and the response body; it ends
    // when the upstream closes, which `Connection: close` asks it to.
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    *driver.lock().unwrap_or_else(|p| p.into_inner()) = Some(task.abort_handle());
    let resp = sender.send_request(out).await.ok()?;
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    parts
        .headers
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    Some(Response::from_parts(parts, body.boxed()))
}
