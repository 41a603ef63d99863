//! One HTTP/2 channel to the gateway: TCP, then (for `https://`) rustls with the client
//! certificate, then tonic. The control stream and every relay of a session share it, as the
//! real supervisor does, so a relay costs no new handshake.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use super::config::GatewayConfig;
use super::tls::{self, TlsError};
use super::tokens::{Bearer, TokenStore};
use crate::proto::v1::open_shell_client::OpenShellClient;

/// The gRPC client every caller uses: one channel plus the bearer interceptor.
pub type Client = OpenShellClient<InterceptedService<Channel, Bearer>>;

/// Connect timeout, the same as the real supervisor's.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("connecting to the gateway {endpoint}: {}", chain(.source))]
    Transport {
        endpoint: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("invalid gateway endpoint {0}")]
    Endpoint(String),
}

/// An error and all its causes on one line; tonic's own message is only "transport error".
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(c) = cur {
        let s = c.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
        cur = c.source();
    }
    parts.join(": ")
}

/// Build a new channel. TLS files are read here, every time, so Secret rotation applies to the
/// next connection. The TLS configuration is checked before dialing so a bad file is reported
/// by name rather than as a transport failure.
pub async fn connect(cfg: &GatewayConfig) -> Result<Channel, ConnectError> {
    let tls = match &cfg.tls {
        Some(paths) => Some(Arc::new(tls::load(paths, &cfg.host)?)),
        None => None,
    };
    let endpoint = Endpoint::from_shared(cfg.endpoint.clone())
        .map_err(|_| ConnectError::Endpoint(cfg.endpoint.clone()))?
        .connect_timeout(CONNECT_TIMEOUT)
        // Liveness of the gateway comes from HTTP/2 PINGs, not heartbeats: a
        // gateway that vanished without a FIN (node lost, network partition) is noticed
        // within interval + timeout, and the session reconnects.
        .http2_keep_alive_interval(cfg.keepalive)
        .keep_alive_timeout(cfg.keepalive_timeout)
        .keep_alive_while_idle(true)
        .http2_adaptive_window(true)
        .tcp_nodelay(true);
    let host = cfg.host.clone();
    let port = cfg.port;
    let loopback_only = cfg.loopback_only;
    let connector = tower::service_fn(move |_uri: http::Uri| {
        let host = host.clone();
        let tls = tls.clone();
        async move {
            let tcp = if loopback_only {
                dial_loopback(&host, port).await?
            } else {
                TcpStream::connect((host.as_str(), port)).await?
            };
            tcp.set_nodelay(true)?;
            let io = match tls {
                None => Io::Plain(tcp),
                Some(t) => {
                    let stream = t
                        .connector
                        .connect(t.server_name.clone(), tcp)
                        .await
                        .map_err(|e| handshake_error(e, &t.server_name))?;
                    Io::Tls(Box::new(stream))
                }
            };
            Ok::<_, io::Error>(TokioIo::new(io))
        }
    });
    endpoint
        .connect_with_connector(connector)
        .await
        .map_err(|source| ConnectError::Transport {
            endpoint: cfg.endpoint.clone(),
            source,
        })
}

/// Resolve `host` and dial its addresses only if every one is loopback. A plaintext endpoint
/// carries the token without the opt-in only because it is loopback; a `localhost` that
/// resolves elsewhere (an edited /etc/hosts, a DNS answer) would send the token off the
/// machine, so it is refused before any address is dialed. The addresses dialed are the ones
/// checked: nothing is resolved twice.
async fn dial_loopback(host: &str, port: u16) -> io::Result<TcpStream> {
    let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host((host, port)).await?.collect();
    if let Some(bad) = addrs.iter().find(|a| !a.ip().to_canonical().is_loopback()) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "`{host}` resolves to {}, which is not a loopback address: the bearer token is not sent there over plaintext (fix the name's resolution, e.g. /etc/hosts, use https://, or accept the risk with {})",
                bad.ip(),
                super::config::ALLOW_PLAINTEXT_TOKEN
            ),
        ));
    }
    let mut last = io::Error::new(
        io::ErrorKind::NotFound,
        format!("`{host}` resolves to no address"),
    );
    for a in addrs {
        match TcpStream::connect(a).await {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Wrap a channel with the bearer interceptor.
pub fn client(channel: Channel, tokens: &Arc<TokenStore>) -> Client {
    OpenShellClient::with_interceptor(channel, Bearer::new(tokens.clone()))
        // Relay frames are ≤ 16 KiB; this only guards against a misbehaving peer.
        .max_decoding_message_size(4 << 20)
}

/// Turn a rustls failure into a sentence that says which setting to look at.
fn handshake_error(e: io::Error, name: &rustls_pki_types::ServerName<'_>) -> io::Error {
    let hint = match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)) => {
            "the gateway's certificate is not signed by the CA in OPENSHELL_TLS_CA"
        }
        Some(rustls::Error::InvalidCertificate(
            rustls::CertificateError::NotValidForName
            | rustls::CertificateError::NotValidForNameContext { .. },
        )) => {
            "the gateway's certificate does not carry the expected server name; check the endpoint host or OPENSHELL_GATEWAY_TLS_SERVER_NAME"
        }
        Some(rustls::Error::InvalidCertificate(_)) => "the gateway's certificate was refused",
        Some(rustls::Error::AlertReceived(_)) => {
            "the gateway refused the TLS handshake; check the client certificate and key (OPENSHELL_TLS_CERT / OPENSHELL_TLS_KEY)"
        }
        _ => "TLS handshake failed",
    };
    io::Error::new(
        e.kind(),
        format!("TLS with server name `{}`: {hint}: {e}", name.to_str()),
    )
}

/// A plaintext or TLS connection, so one connector type serves both schemes.
enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// The channel of the current session, shared with the token refresher.
pub struct ChannelSlot {
    cfg: GatewayConfig,
    current: Mutex<Option<Channel>>,
}

impl ChannelSlot {
    pub fn new(cfg: GatewayConfig) -> Arc<Self> {
        Arc::new(ChannelSlot {
            cfg,
            current: Mutex::new(None),
        })
    }

    pub async fn set(&self, ch: Channel) {
        *self.current.lock().await = Some(ch);
    }

    /// The current session's channel, or a new one when no session is up.
    pub async fn get_or_connect(&self) -> Result<Channel, ConnectError> {
        if let Some(ch) = self.current.lock().await.clone() {
            return Ok(ch);
        }
        connect(&self.cfg).await
    }
}
