//! The L7 tests' upstreams on 192.88.99.10, built on hyper so that keep-alive, chunked bodies
//! and upgrades behave as real servers do:
//! - 8180: plain HTTP; every request's line, headers and body come back as JSON, keep-alive;
//!   `/stream?n=N` answers N bytes in 64 KiB chunks (chunked encoding);
//! - 9443: the same behind TLS, with a certificate of the tests' own CA for `secure.test`,
//!   `secure-api.test`, `raw.test`, `cred.test` and `pkgs.test`; the SNI and ALPN each
//!   handshake saw are recorded.
//! - On both, `/files/…` serves [`L7Upstream::files`] (pip's index, git's dumb HTTP), and a
//!   WebSocket upgrade gets its 101 and then echoes every text message as `echo:<text>`,
//!   recording each message it received.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::PUBLIC;

pub const HTTP_PORT: u16 = 8180;
pub const TLS_PORT: u16 = 9443;

#[derive(Default)]
pub struct L7Upstream {
    /// Every request line received, in order (both ports).
    pub requests: Mutex<Vec<String>>,
    /// Every raw header block received, as "name: value" lines.
    pub heads: Mutex<Vec<String>>,
    /// (SNI, ALPN) of each TLS handshake.
    pub handshakes: Mutex<Vec<(Option<String>, Option<String>)>>,
    /// The tests' CA, PEM (what the proxy's test trust knob is given).
    pub ca_pem: String,
    /// Where `/files/…` is served from.
    pub files: Mutex<Option<std::path::PathBuf>>,
    /// Every WebSocket text message received, and the close code of each closed session.
    pub ws_messages: Mutex<Vec<String>>,
    pub ws_closes: Mutex<Vec<u16>>,
    /// Every binary message received whole: (length, sum of its bytes mod 2^32), read in
    /// chunks so that large ones cost the tests little.
    pub ws_binary: Mutex<Vec<(u64, u32)>>,
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

async fn echo(req: Request<Incoming>, up: Arc<L7Upstream>) -> Result<Response<Body>, Infallible> {
    let line = format!("{} {} {:?}", req.method(), req.uri(), req.version());
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    up.requests.lock().unwrap().push(line.clone());
    up.heads.lock().unwrap().push(
        headers
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join("\n"),
    );
    if req.uri().path().starts_with("/files/") {
        let root = up.files.lock().unwrap().clone();
        let rel = req.uri().path().trim_start_matches("/files/").to_string();
        let body = root
            .filter(|_| !rel.split('/').any(|c| c == ".."))
            .map(|r| r.join(&rel))
            .map(|p| if p.is_dir() { p.join("index.html") } else { p })
            .and_then(|p| {
                Some((
                    std::fs::read(&p).ok()?,
                    p.extension().is_some_and(|e| e == "html"),
                ))
            });
        return Ok(match body {
            Some((b, html)) => Response::builder()
                .header(
                    "content-type",
                    if html {
                        "text/html"
                    } else {
                        "application/octet-stream"
                    },
                )
                .body(Full::new(Bytes::from(b)).boxed())
                .unwrap(),
            None => Response::builder()
                .status(404)
                .body(Full::new(Bytes::from_static(b"not found")).boxed())
                .unwrap(),
        });
    }
    if let Some(key) = req.headers().get("sec-websocket-key").cloned()
        && req
            .headers()
            .get("upgrade")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"))
    {
        return Ok(websocket_accept(req, key.as_bytes(), up));
    }
    if req.uri().path().starts_with("/quiet/") {
        // A server that does not reflect what it got (a real API does not echo tokens).
        return Ok(Response::new(
            Full::new(Bytes::from_static(b"quiet ok")).boxed(),
        ));
    }
    if req.uri().path() == "/stream" {
        let n: usize = req
            .uri()
            .query()
            .and_then(|q| q.strip_prefix("n="))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
        let frames = (0..n.div_ceil(64 * 1024)).map(move |i| {
            let len = (n - i * 64 * 1024).min(64 * 1024);
            Ok::<_, Infallible>(Frame::data(chunk.slice(..len)))
        });
        let body = StreamBody::new(futures::stream::iter(frames)).boxed();
        return Ok(Response::new(body));
    }
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let json = serde_json::json!({
        "request": line,
        "headers": headers,
        "body": String::from_utf8_lossy(&body),
    })
    .to_string();
    Ok(Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(json)).boxed())
        .unwrap())
}

fn tls_config(up: &mut L7Upstream) -> Arc<rustls::ServerConfig> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, "egress test upstream CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    up.ca_pem = ca_cert.pem();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec![
        "secure.test".to_string(),
        "secure-api.test".to_string(),
        "raw.test".to_string(),
        "cred.test".to_string(),
        "pkgs.test".to_string(),
        "body.test".to_string(),
    ])
    .unwrap()
    .signed_by(&key, &issuer)
    .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut c = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone(), ca_cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(c)
}

impl L7Upstream {
    pub async fn start() -> Arc<L7Upstream> {
        let mut up = L7Upstream::default();
        let tls = tls_config(&mut up);
        let up = Arc::new(up);
        let plain = TcpListener::bind(SocketAddr::new(PUBLIC.into(), HTTP_PORT))
            .await
            .unwrap();
        let secure = TcpListener::bind(SocketAddr::new(PUBLIC.into(), TLS_PORT))
            .await
            .unwrap();
        let u = up.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = plain.accept().await {
                let u = u.clone();
                tokio::spawn(serve(TokioIo::new(s), u));
            }
        });
        let u = up.clone();
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        tokio::spawn(async move {
            while let Ok((s, _)) = secure.accept().await {
                let u = u.clone();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(t) = acceptor.accept(s).await else {
                        return;
                    };
                    let (_, c) = t.get_ref();
                    let seen = (
                        c.server_name().map(str::to_string),
                        c.alpn_protocol()
                            .map(|a| String::from_utf8_lossy(a).into_owned()),
                    );
                    u.handshakes.lock().unwrap().push(seen);
                    serve(TokioIo::new(t), u).await;
                });
            }
        });
        up
    }

    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    pub fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

async fn serve<I>(io: TokioIo<I>, up: Arc<L7Upstream>)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |r| echo(r, up.clone()));
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(io, svc)
        .with_upgrades()
        .await;
}

/// The 101 of a WebSocket upgrade, then an echo of the session on the upgraded stream.
fn websocket_accept(mut req: Request<Incoming>, key: &[u8], up: Arc<L7Upstream>) -> Response<Body> {
    use base64::Engine;
    let mut k = key.to_vec();
    k.extend_from_slice(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, &k);
    let accept = base64::engine::general_purpose::STANDARD.encode(digest.as_ref());
    let on = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        if let Ok(io) = on.await {
            ws_echo(TokioIo::new(io), up).await;
        }
    });
    Response::builder()
        .status(101)
        .header("upgrade", "websocket")
        .header("connection", "Upgrade")
        .header("sec-websocket-accept", accept)
        .body(Full::new(Bytes::new()).boxed())
        .unwrap()
}

/// A minimal server side of RFC 6455 (written here, not taken from the code under test):
/// unmask client frames, answer text with `echo:<text>`, a close with the same code.
async fn ws_echo<S>(mut s: S, up: Arc<L7Upstream>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // The binary message being received: its length and sum so far.
    let mut binary: Option<(u64, u32)> = None;
    loop {
        let mut h = [0u8; 2];
        if s.read_exact(&mut h).await.is_err() {
            return;
        }
        let mut len = u64::from(h[1] & 0x7f);
        if len == 126 {
            len = u64::from(s.read_u16().await.unwrap_or(0));
        } else if len == 127 {
            len = s.read_u64().await.unwrap_or(0);
        }
        let mut mask = [0u8; 4];
        if h[1] & 0x80 != 0 && s.read_exact(&mut mask).await.is_err() {
            return;
        }
        let op = h[0] & 0x0f;
        if op == 2 || (op == 0 && binary.is_some()) {
            let (total, sum) = binary.get_or_insert((0, 0));
            let mut buf = vec![0u8; 64 * 1024];
            let mut left = len;
            while left > 0 {
                let n = left.min(buf.len() as u64) as usize;
                if s.read_exact(&mut buf[..n]).await.is_err() {
                    return;
                }
                for (i, b) in buf[..n].iter().enumerate() {
                    let at = ((len - left) as usize + i) % 4;
                    *sum = sum.wrapping_add(u32::from(b ^ mask[at]));
                }
                *total += n as u64;
                left -= n as u64;
            }
            if h[0] & 0x80 != 0 {
                up.ws_binary.lock().unwrap().push(binary.take().unwrap());
            }
            continue;
        }
        let mut p = vec![0u8; len as usize];
        if s.read_exact(&mut p).await.is_err() {
            return;
        }
        for (i, b) in p.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
        match h[0] & 0x0f {
            1 => {
                let text = String::from_utf8_lossy(&p).into_owned();
                up.ws_messages.lock().unwrap().push(text.clone());
                let reply = format!("echo:{text}");
                let mut f = vec![0x81u8];
                match reply.len() {
                    n if n < 126 => f.push(n as u8),
                    n => {
                        f.push(126);
                        f.extend_from_slice(&(n as u16).to_be_bytes());
                    }
                }
                f.extend_from_slice(reply.as_bytes());
                if s.write_all(&f).await.is_err() {
                    return;
                }
            }
            8 => {
                let code = if p.len() >= 2 {
                    u16::from_be_bytes([p[0], p[1]])
                } else {
                    1005
                };
                up.ws_closes.lock().unwrap().push(code);
                let _ = s
                    .write_all(&[
                        0x88,
                        2,
                        p.first().copied().unwrap_or(3),
                        p.get(1).copied().unwrap_or(0xe8),
                    ])
                    .await;
                return;
            }
            _ => {}
        }
    }
}
