//! The upstream servers of the outer namespace, and the log of every connection they took.
//!
//! - On each test address, ports 8080-8082, 8443, 9090, 6443 and 7070: if the first bytes are
//!   an HTTP request, its request line and headers come back as JSON (`Connection: close`);
//!   otherwise every byte is echoed.
//! - On 192.88.99.10:8090: a static file server for the tool tests (pip's index, git's dumb
//!   HTTP), one request per connection; the query string is ignored.
//! - On the outer namespace's own 127.0.0.1 (the supervisor's loopback): listeners that must
//!   never see a connection.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{CGNAT, PRIVATE, PRIVATE2, PUBLIC};

pub const ECHO_PORTS: [u16; 7] = [8080, 8081, 8082, 8443, 9090, 6443, 7070];
pub const FILES_PORT: u16 = 8090;

pub struct Upstream {
    /// The local address of every accepted connection, in order.
    pub seen: Mutex<Vec<SocketAddr>>,
    /// Static files served on 192.88.99.10:8090.
    pub files: PathBuf,
    /// Bytes served by the file server.
    pub served: Mutex<Vec<String>>,
}

impl Upstream {
    pub async fn start(files: PathBuf) -> Arc<Upstream> {
        std::fs::create_dir_all(&files).unwrap();
        let up = Arc::new(Upstream {
            seen: Mutex::default(),
            files,
            served: Mutex::default(),
        });
        for ip in [PUBLIC, PRIVATE, PRIVATE2, CGNAT, Ipv4Addr::LOCALHOST] {
            for port in ECHO_PORTS {
                let l = TcpListener::bind(SocketAddr::new(IpAddr::V4(ip), port))
                    .await
                    .unwrap();
                tokio::spawn(accept(l, up.clone(), false));
            }
        }
        let l = TcpListener::bind(SocketAddr::new(IpAddr::V4(PUBLIC), FILES_PORT))
            .await
            .unwrap();
        tokio::spawn(accept(l, up.clone(), true));
        up
    }

    /// Connections taken on `ip` (any port).
    pub fn count(&self, ip: Ipv4Addr) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|a| a.ip() == IpAddr::V4(ip))
            .count()
    }

    pub fn total(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

async fn accept(l: TcpListener, up: Arc<Upstream>, files: bool) {
    loop {
        let Ok((s, _)) = l.accept().await else { return };
        let Ok(local) = s.local_addr() else { continue };
        up.seen.lock().unwrap().push(local);
        let up = up.clone();
        tokio::spawn(async move {
            if files {
                let _ = serve_file(s, &up).await;
            } else {
                let _ = echo(s).await;
            }
        });
    }
}

fn is_http(b: &[u8]) -> bool {
    [
        "GET ", "HEAD ", "POST ", "PUT ", "DELETE ", "OPTIONS ", "PATCH ",
    ]
    .iter()
    .any(|m| b.starts_with(m.as_bytes()))
}

/// Read one request head (and up to `Content-Length` of body).
async fn read_request(
    s: &mut TcpStream,
    mut buf: Vec<u8>,
) -> std::io::Result<(String, Vec<(String, String)>, Vec<u8>)> {
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let mut slots = [httparse::EMPTY_HEADER; 64];
            let mut req = httparse::Request::new(&mut slots);
            req.parse(&buf[..i + 4]).map_err(std::io::Error::other)?;
            let line = format!(
                "{} {} HTTP/1.{}",
                req.method.unwrap_or(""),
                req.path.unwrap_or(""),
                req.version.unwrap_or(1)
            );
            let headers: Vec<(String, String)> = req
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_string(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect();
            let len: usize = headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(0);
            let mut body = buf[i + 4..].to_vec();
            while body.len() < len {
                let mut b = [0u8; 4096];
                let n = s.read(&mut b).await?;
                if n == 0 {
                    break;
                }
                body.extend_from_slice(&b[..n]);
            }
            return Ok((line, headers, body));
        }
        let mut b = [0u8; 4096];
        let n = s.read(&mut b).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&b[..n]);
    }
}

async fn echo(mut s: TcpStream) -> std::io::Result<()> {
    let mut first = vec![0u8; 8];
    let n = match tokio::time::timeout(Duration::from_millis(500), s.peek(&mut first)).await {
        Ok(r) => r?,
        // Silent client: wait for bytes without peeking further.
        Err(_) => 0,
    };
    if n > 0 && is_http(&first[..n]) {
        let (line, headers, body) = read_request(&mut s, Vec::new()).await?;
        let json = serde_json::json!({
            "request": line,
            "headers": headers,
            "body": String::from_utf8_lossy(&body),
        })
        .to_string();
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{json}",
            json.len()
        );
        s.write_all(resp.as_bytes()).await?;
        return s.shutdown().await;
    }
    let (mut r, mut w) = s.split();
    tokio::io::copy(&mut r, &mut w).await?;
    Ok(())
}

async fn serve_file(mut s: TcpStream, up: &Upstream) -> std::io::Result<()> {
    let (line, _, _) = read_request(&mut s, Vec::new()).await?;
    let mut parts = line.split(' ');
    let method = parts.next().unwrap_or("");
    let target = parts.next().unwrap_or("/");
    let path = target.split('?').next().unwrap_or("/");
    let rel: PathBuf = path
        .split('/')
        .filter(|c| !c.is_empty() && *c != "." && *c != "..")
        .collect();
    let mut file = up.files.join(rel);
    if file.is_dir() {
        file = file.join("index.html");
    }
    up.served.lock().unwrap().push(path.to_string());
    let resp = match std::fs::read(&file) {
        Ok(body) => {
            let ct = if file.extension().is_some_and(|e| e == "html") {
                "text/html"
            } else {
                "application/octet-stream"
            };
            let mut r = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {ct}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )
            .into_bytes();
            if method != "HEAD" {
                r.extend_from_slice(&body);
            }
            r
        }
        Err(_) => {
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec()
        }
    };
    s.write_all(&resp).await?;
    s.shutdown().await
}
