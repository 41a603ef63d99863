//! The HTTPS half of `benches/egress.rs`: an upstream behind TLS (a bench CA the proxy trusts
//! through the system bundle of the bench's own mount namespace), reached through the
//! proxy's interception (`secure.bench`, a leaf of the sandbox CA per host) and through a
//! `tls: skip` tunnel (`raw.bench`, the upstream's own certificate), side by side.
//!
//! The client is the bench binary re-executed (`--client tls …`): blocking rustls over a
//! CONNECT tunnel, HTTP/1.1 written and read by hand, so both sides run the same code.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

pub const TLS_PORT: u16 = 9443;
pub const BULK_BYTES: usize = 256 << 20;
/// Names that each need a leaf of their own (the new-host measurement).
pub const NEW_HOSTS: usize = 400;

/// The bench CA (PEM) and the upstream's server config, its leaf for every bench name.
pub fn upstream_config() -> (String, Arc<rustls::ServerConfig>) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, "egress bench upstream CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec![
        "secure.bench".to_string(),
        "raw.bench".to_string(),
        "*.new.bench".to_string(),
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
    (ca_cert.pem(), Arc::new(c))
}

type Body = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

async fn answer(
    req: hyper::Request<hyper::body::Incoming>,
) -> Result<hyper::Response<Body>, std::convert::Infallible> {
    if req.uri().path() == "/bulk" {
        let chunk = Bytes::from(vec![7u8; 1 << 20]);
        let frames = (0..BULK_BYTES / chunk.len()).map(move |_| Ok(Frame::data(chunk.clone())));
        let body = StreamBody::new(futures::stream::iter(frames)).boxed();
        return Ok(hyper::Response::builder()
            .header("content-length", BULK_BYTES)
            .body(body)
            .unwrap());
    }
    Ok(hyper::Response::new(
        Full::new(Bytes::from_static(b"ok")).boxed(),
    ))
}

/// The TLS upstream on `ip:9443`, HTTP/1.1 keep-alive behind it.
pub async fn upstream(ip: std::net::Ipv4Addr, config: Arc<rustls::ServerConfig>) {
    let l = tokio::net::TcpListener::bind((ip, TLS_PORT)).await.unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    loop {
        let (s, _) = l.accept().await.unwrap();
        s.set_nodelay(true).unwrap();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let Ok(t) = acceptor.accept(s).await else {
                return;
            };
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(
                    hyper_util::rt::TokioIo::new(t),
                    hyper::service::service_fn(answer),
                )
                .await;
        });
    }
}

// ---- the client (re-executed) ---------------------------------------------------------------

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

fn connect(host: &str, roots_pem: &str) -> Tls {
    let mut s = TcpStream::connect("10.200.0.1:3128").unwrap();
    s.set_nodelay(true).unwrap();
    write!(
        s,
        "CONNECT {host}:{TLS_PORT} HTTP/1.1\r\nHost: {host}:{TLS_PORT}\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).unwrap(), 1, "proxy closed");
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let mut roots = rustls::RootCertStore::empty();
    let certs: Vec<_> = rustls_pemfile::certs(&mut roots_pem.as_bytes())
        .filter_map(Result::ok)
        .collect();
    roots.add_parsable_certificates(certs);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
    let mut t = rustls::StreamOwned::new(conn, s);
    t.flush().unwrap();
    t
}

/// One GET on `t`; the body's length.
fn get(t: &mut Tls, host: &str, path: &str) -> usize {
    write!(t, "GET {path} HTTP/1.1\r\nHost: {host}:{TLS_PORT}\r\n\r\n").unwrap();
    t.flush().unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(t.read(&mut b).unwrap(), 1, "closed in the head");
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let mut left = len;
    while left > 0 {
        let n = t.read(&mut buf[..left.min(1 << 16)]).unwrap();
        assert!(n > 0, "closed in the body");
        left -= n;
    }
    len
}

/// `tls ka HOST ROOTS N`: one tunnel, a warm-up GET, then N timed GETs (ns each).
/// `tls bulk HOST ROOTS`: one GET of 256 MiB (ns, bytes).
/// `tls first ROOTS HOST...`: a fresh tunnel, handshake and GET per host (ns each).
/// `tls hold HOST ROOTS N`: N tunnels, one GET each, then held until stdin closes.
pub fn client(args: &[String]) {
    let roots = |p: &str| std::fs::read_to_string(p).unwrap();
    match args[0].as_str() {
        "ka" => {
            let (host, pem, n) = (&args[1], roots(&args[2]), args[3].parse::<usize>().unwrap());
            let mut t = connect(host, &pem);
            get(&mut t, host, "/ka");
            for _ in 0..n {
                let at = Instant::now();
                get(&mut t, host, "/ka");
                println!("{}", at.elapsed().as_nanos());
            }
        }
        "bulk" => {
            let (host, pem) = (&args[1], roots(&args[2]));
            let mut t = connect(host, &pem);
            let at = Instant::now();
            let n = get(&mut t, host, "/bulk");
            println!("{} {n}", at.elapsed().as_nanos());
        }
        "first" => {
            let pem = roots(&args[1]);
            for host in &args[2..] {
                let at = Instant::now();
                let mut t = connect(host, &pem);
                get(&mut t, host, "/ka");
                println!("{}", at.elapsed().as_nanos());
            }
        }
        "hold" => {
            let (host, pem, n) = (&args[1], roots(&args[2]), args[3].parse::<usize>().unwrap());
            let held: Vec<Tls> = (0..n)
                .map(|_| {
                    let mut t = connect(host, &pem);
                    get(&mut t, host, "/ka");
                    t
                })
                .collect();
            println!("READY {}", held.len());
            std::io::stdout().flush().unwrap();
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
        }
        other => panic!("tls client mode {other}"),
    }
}
