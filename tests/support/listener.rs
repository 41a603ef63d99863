//! The test gateway's listening server: the OpenShell service, with GetSandboxConfig served
//! by path, over TLS or plain TCP, on connections it can cut from outside.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use openshell_sandbox::proto::v1::open_shell_server::OpenShellServer;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::gateway::{Service, State};

/// The OpenShell service plus GetSandboxConfig, which is served by path with raw bytes so a
/// revision can carry fields our proto does not declare (as a newer gateway's would).
#[derive(Clone)]
struct WithConfig {
    inner: OpenShellServer<Service>,
    state: Arc<State>,
}

type BoxFut<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl tower::Service<http::Request<tonic::body::Body>> for WithConfig {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFut<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        use openshell_sandbox::gateway::policy_plane::{GET_SANDBOX_CONFIG, RawCodec};
        if req.uri().path() == GET_SANDBOX_CONFIG {
            let svc = ConfigSvc(self.state.clone());
            return Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(RawCodec);
                Ok(grpc.unary(svc, req).await)
            });
        }
        let mut inner = self.inner.clone();
        Box::pin(async move { tower::Service::call(&mut inner, req).await })
    }
}

impl tonic::server::NamedService for WithConfig {
    const NAME: &'static str = "openshell.v1.OpenShell";
}

struct ConfigSvc(Arc<State>);

impl tonic::server::UnaryService<Bytes> for ConfigSvc {
    type Response = Bytes;
    type Future = BoxFut<Result<Response<Bytes>, Status>>;
    fn call(&mut self, req: Request<Bytes>) -> Self::Future {
        let st = self.0.clone();
        Box::pin(async move { st.get_sandbox_config(&req).map(Response::new) })
    }
}

/// A TLS (or plain) connection the server can cut from outside, to simulate a gateway dying.
pub struct Conn<S> {
    inner: S,
}

impl<S> tonic::transport::server::Connected for Conn<S> {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl<S: AsyncRead + Unpin> AsyncRead for Conn<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Conn<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The listening server. Dropping or `kill`ing it cuts every connection at the socket.
pub struct Server {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    sockets: Arc<Mutex<Vec<std::net::TcpStream>>>,
}

impl Server {
    pub async fn start(
        state: Arc<State>,
        tls: Option<Arc<rustls::ServerConfig>>,
        addr: SocketAddr,
    ) -> Server {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sockets = Arc::new(Mutex::new(Vec::new()));
        let socks = sockets.clone();
        type Io = Conn<Box<dyn IoStream>>;
        let (ctx, crx) = mpsc::channel::<Result<Io, std::io::Error>>(16);
        let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
        let accept = async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                if let Ok(fd) = std::os::fd::AsFd::as_fd(&tcp).try_clone_to_owned() {
                    socks.lock().unwrap().push(std::net::TcpStream::from(fd));
                }
                let acceptor = acceptor.clone();
                let ctx = ctx.clone();
                tokio::spawn(async move {
                    let io: Box<dyn IoStream> = match acceptor {
                        Some(a) => match a.accept(tcp).await {
                            Ok(s) => Box::new(s),
                            // A refused client certificate ends here, like the real server.
                            Err(_) => return,
                        },
                        None => Box::new(tcp),
                    };
                    let _ = ctx.send(Ok(Conn { inner: io })).await;
                });
            }
        };
        let svc = WithConfig {
            inner: OpenShellServer::new(Service(state.clone())).max_decoding_message_size(1 << 20),
            state,
        };
        let serve = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(20)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            .http2_adaptive_window(Some(true))
            .add_service(svc)
            .serve_with_incoming(ReceiverStream::new(crx));
        let task = tokio::spawn(async move {
            tokio::select! {
                _ = accept => {}
                _ = serve => {}
            }
        });
        Server {
            addr,
            task,
            sockets,
        }
    }

    /// Stop accepting and cut every connection, as a crashed gateway would.
    pub fn kill(&self) {
        self.task.abort();
        for s in self.sockets.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

pub trait IoStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> IoStream for T {}
