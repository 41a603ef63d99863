//! Relays: on RelayOpen, reach the target, report RelayOpenResult, then open a
//! RelayStream whose first frame is `init` and move bytes both ways in frames of ≤ 16 KiB.
//!
//! The SSH target is an in-process server whose byte stream is the relay itself ([`RelayIo`]):
//! its writes become data frames and the gateway's frames are what it reads. There is no socket
//! file that sandboxed code could connect to, so the relay (already authenticated by the
//! gateway) is the only way in. (A first version put a 64 KiB in-memory duplex and a copying
//! task between the two; that cost two copies of every byte and a task hop per frame, about a
//! quarter of the supervisor's CPU per GiB of output.)

use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use tokio::io::ReadBuf;
use tokio::sync::oneshot;
use tokio_stream::Stream;
use tokio_util::sync::PollSender;
use tonic::Streaming;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::channel::Client;
use super::ssh::SshServer;
use crate::proto::v1::{
    RelayFrame, RelayInit, RelayOpen, RelayOpenResult, SupervisorMessage, TcpRelayTarget,
    relay_frame, relay_open, supervisor_message,
};

/// The supervisor reads its target in chunks of this size and sends one frame per read.
pub const FRAME: usize = 16 * 1024;
/// How long the gateway may take to answer a RelayStream call.
const OPEN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// Frames queued towards the gateway per relay. A slow gateway fills it, which stops the SSH
/// server, which stops reading the child's pipes: memory stays bounded whatever the output.
const QUEUE: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("RelayOpen has an empty channel_id")]
    EmptyId,
    #[error("relay channel {0} is already open")]
    Duplicate(String),
    #[error("too many concurrent execs: the limit is {0} (--max-execs)")]
    TooMany(usize),
    #[error("tcp relay target {host}:{port} refused: {reason}")]
    TcpTarget {
        host: String,
        port: u32,
        reason: &'static str,
    },
    #[error("connecting to {addr}: {source}")]
    TcpConnect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the supervisor is shutting down")]
    ShuttingDown,
    #[error("tcp relay refused: {0}")]
    Forward(#[source] super::ssh::forward::ForwardError),
    #[error("RelayStream: {0}")]
    Stream(Status),
    #[error("the gateway sent a non-data frame after init")]
    UnexpectedFrame,
    #[error("relay target: {0}")]
    Io(#[from] std::io::Error),
}

/// All relays of this supervisor: ids in use and the concurrency bound.
pub struct Relays {
    active: Mutex<HashSet<String>>,
    permits: Arc<Semaphore>,
    max: usize,
    ssh: Arc<SshServer>,
    closing: std::sync::atomic::AtomicBool,
}

/// Removes the id from the active set when the relay ends, however it ends.
struct Claim {
    relays: Arc<Relays>,
    id: String,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.relays
            .active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

enum Target {
    Ssh,
    Tcp(SocketAddr),
}

impl super::session::RelayOpener for Relays {
    fn open_relay(
        self: Arc<Self>,
        open: RelayOpen,
        client: Client,
        results: mpsc::Sender<SupervisorMessage>,
    ) {
        Relays::open(&self, open, client, results);
    }
}

impl Relays {
    pub fn new(max: usize, ssh: Arc<SshServer>) -> Arc<Self> {
        Arc::new(Relays {
            active: Mutex::new(HashSet::new()),
            permits: Arc::new(Semaphore::new(max)),
            max,
            ssh,
            closing: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Refuse every later RelayOpen (shutdown).
    pub fn close(&self) {
        self.closing
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Wait until no relay is open.
    pub async fn idle(&self) {
        while !self
            .active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
        {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Handle one RelayOpen in the background. `results` is the control stream, for
    /// RelayOpenResult.
    pub fn open(
        self: &Arc<Self>,
        open: RelayOpen,
        client: Client,
        results: mpsc::Sender<SupervisorMessage>,
    ) {
        let relays = self.clone();
        tokio::spawn(async move {
            let id = open.channel_id.clone();
            let claimed = relays.claim(&open);
            let (claim, target) = match claimed {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(channel_id = %id, "relay refused: {e}");
                    send_result(&results, &id, Err(&e)).await;
                    return;
                }
            };
            // Reach the target before answering, so a failure is reported in RelayOpenResult.
            let outcome = match target {
                Target::Ssh => {
                    serve_ssh(&relays.ssh, client, &results, &id).await;
                    Ok(())
                }
                // In the sandbox's network view, as direct-tcpip: "loopback" is the
                // sandbox's, and with no sandbox (quarantined) there is nothing to reach.
                Target::Tcp(addr) => match super::ssh::forward::view(relays.ssh.slot()) {
                    Err(e) => {
                        let e = RelayError::Forward(e);
                        tracing::warn!(channel_id = %id, "relay refused: {e}");
                        send_result(&results, &id, Err(&e)).await;
                        Ok(())
                    }
                    Ok(sandbox) => match super::ssh::forward::connect(addr, sandbox).await {
                        Ok(tcp) => {
                            send_result(&results, &id, Ok(())).await;
                            bridge(tcp, client, &id).await
                        }
                        Err(source) => {
                            let e = RelayError::TcpConnect { addr, source };
                            tracing::warn!(channel_id = %id, "relay target unreachable: {e}");
                            send_result(&results, &id, Err(&e)).await;
                            Ok(())
                        }
                    },
                },
            };
            match outcome {
                Ok(()) => tracing::debug!(channel_id = %id, "relay finished"),
                Err(e) => tracing::warn!(channel_id = %id, "relay ended with an error: {e}"),
            }
            drop(claim);
        });
    }

    fn claim(self: &Arc<Self>, open: &RelayOpen) -> Result<(Claim, Target), RelayError> {
        if self.closing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(RelayError::ShuttingDown);
        }
        if open.channel_id.is_empty() {
            return Err(RelayError::EmptyId);
        }
        let target = match &open.target {
            None | Some(relay_open::Target::Ssh(_)) => Target::Ssh,
            Some(relay_open::Target::Tcp(t)) => Target::Tcp(tcp_target(t)?),
        };
        let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        if active.contains(&open.channel_id) {
            return Err(RelayError::Duplicate(open.channel_id.clone()));
        }
        let permit = self
            .permits
            .clone()
            .try_acquire_owned()
            .map_err(|_| RelayError::TooMany(self.max))?;
        active.insert(open.channel_id.clone());
        Ok((
            Claim {
                relays: self.clone(),
                id: open.channel_id.clone(),
                _permit: permit,
            },
            target,
        ))
    }
}

/// Only loopback targets; `localhost` is rewritten to 127.0.0.1 rather than resolved.
fn tcp_target(t: &TcpRelayTarget) -> Result<SocketAddr, RelayError> {
    let refuse = |reason| RelayError::TcpTarget {
        host: t.host.clone(),
        port: t.port,
        reason,
    };
    let port = u16::try_from(t.port)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| refuse("the port must be 1-65535"))?;
    let ip = match t.host.as_str() {
        "localhost" => IpAddr::V4(Ipv4Addr::LOCALHOST),
        h => h
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .map_err(|_| {
                refuse("only loopback addresses (127.0.0.1, ::1, localhost) are allowed")
            })?,
    };
    if !ip.is_loopback() {
        return Err(refuse(
            "only loopback addresses (127.0.0.1, ::1, localhost) are allowed",
        ));
    }
    Ok(SocketAddr::new(ip, port))
}

async fn send_result(
    results: &mpsc::Sender<SupervisorMessage>,
    id: &str,
    outcome: Result<(), &RelayError>,
) {
    let msg = SupervisorMessage {
        payload: Some(supervisor_message::Payload::RelayOpenResult(
            RelayOpenResult {
                channel_id: id.to_owned(),
                success: outcome.is_ok(),
                error: outcome.err().map(|e| e.to_string()).unwrap_or_default(),
            },
        )),
    };
    // If the control stream is gone the gateway will time the relay out on its own.
    let _ = results.send(msg).await;
}

fn init_frame(id: &str) -> RelayFrame {
    RelayFrame {
        payload: Some(relay_frame::Payload::Init(RelayInit {
            channel_id: id.to_owned(),
        })),
    }
}

/// Open the RelayStream (first frame `init`); the gateway answers once it has read `init`, and
/// one that never does must not hold a relay slot forever.
async fn open_stream(
    client: &mut Client,
    frames: mpsc::Receiver<RelayFrame>,
) -> Result<Streaming<RelayFrame>, RelayError> {
    Ok(tokio::time::timeout(
        OPEN_TIMEOUT,
        client.relay_stream(ReceiverStream::new(frames)),
    )
    .await
    .map_err(|_| {
        RelayError::Stream(Status::deadline_exceeded(
            "RelayStream was not answered in time",
        ))
    })?
    .map_err(RelayError::Stream)?
    .into_inner())
}

/// The SSH relay, in OpenShell's order: the SSH server is running on the relay's byte stream,
/// then RelayOpenResult, then RelayStream with `init` first (queued before the server can write
/// anything), then data until the SSH connection ends.
async fn serve_ssh(
    ssh: &Arc<SshServer>,
    mut client: Client,
    results: &mpsc::Sender<SupervisorMessage>,
    id: &str,
) {
    let (ftx, frx) = mpsc::channel::<RelayFrame>(QUEUE);
    // The receiver is alive and the queue empty; this cannot fail.
    let _ = ftx.try_send(init_frame(id));
    let (inbound_tx, inbound_rx) = oneshot::channel();
    let server = tokio::spawn(ssh.clone().run(RelayIo::new(ftx, inbound_rx)));
    send_result(results, id, Ok(())).await;
    match open_stream(&mut client, frx).await {
        Ok(inbound) => {
            let _ = inbound_tx.send(inbound);
        }
        Err(e) => {
            tracing::warn!(channel_id = %id, "relay ended with an error: {e}");
            // The SSH server is waiting for the stream to read from: without this drop it
            // would wait forever (we wait for it below) and the relay slot would never come
            // back. Dropping the sender reads as end-of-stream; the server stops.
            drop(inbound_tx);
        }
    }
    // The relay, and its slot, last as long as the SSH connection.
    let _ = server.await;
}

/// The SSH server's transport: writes become data frames of at most [`FRAME`] bytes on the
/// RelayStream request; reads come from the gateway's data frames. Shutdown ends the request
/// stream (half-close towards the gateway); the gateway's end of stream is read as EOF.
pub struct RelayIo {
    tx: PollSender<RelayFrame>,
    rx: Inbound,
    /// What is left of the last frame read.
    pending: Bytes,
}

enum Inbound {
    /// The RelayStream call is not answered yet.
    Waiting(oneshot::Receiver<Streaming<RelayFrame>>),
    Open(Box<Streaming<RelayFrame>>),
    Done,
}

impl RelayIo {
    fn new(
        tx: mpsc::Sender<RelayFrame>,
        inbound: oneshot::Receiver<Streaming<RelayFrame>>,
    ) -> Self {
        RelayIo {
            tx: PollSender::new(tx),
            rx: Inbound::Waiting(inbound),
            pending: Bytes::new(),
        }
    }
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the RelayStream call has ended")
}

impl AsyncWrite for RelayIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        ready!(self.tx.poll_reserve(cx)).map_err(|_| gone())?;
        let n = buf.len().min(FRAME);
        let frame = RelayFrame {
            payload: Some(relay_frame::Payload::Data(Bytes::copy_from_slice(
                &buf[..n],
            ))),
        };
        self.tx.send_item(frame).map_err(|_| gone())?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Frames are handed to the gRPC stream as they are written.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.tx.close();
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for RelayIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if !self.pending.is_empty() {
                let n = self.pending.len().min(buf.remaining());
                let chunk = self.pending.split_to(n);
                buf.put_slice(&chunk);
                return Poll::Ready(Ok(()));
            }
            match &mut self.rx {
                Inbound::Waiting(rx) => match ready!(Pin::new(rx).poll(cx)) {
                    Ok(stream) => self.rx = Inbound::Open(Box::new(stream)),
                    // The call failed (already logged): end of stream.
                    Err(_) => self.rx = Inbound::Done,
                },
                Inbound::Open(stream) => match ready!(Pin::new(stream.as_mut()).poll_next(cx)) {
                    Some(Ok(RelayFrame {
                        payload: Some(relay_frame::Payload::Data(d)),
                    })) => self.pending = d,
                    Some(Ok(_)) => {
                        self.rx = Inbound::Done;
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            RelayError::UnexpectedFrame,
                        )));
                    }
                    Some(Err(status)) => {
                        self.rx = Inbound::Done;
                        return Poll::Ready(Err(io::Error::other(RelayError::Stream(status))));
                    }
                    None => self.rx = Inbound::Done,
                },
                Inbound::Done => return Poll::Ready(Ok(())),
            }
        }
    }
}

/// Move bytes between `target` and a new RelayStream until both directions are done.
///
/// Half-close as OpenShell does it: when our request stream ends the gateway shuts its write side;
/// when the gateway's response stream ends, we shut the target's write side and keep copying
/// the other direction until the target is done.
async fn bridge<T>(target: T, mut client: Client, id: &str) -> Result<(), RelayError>
where
    T: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(target);
    // A small queue: a slow gateway stops us reading the target. Memory stays bounded.
    let (ftx, frx) = mpsc::channel::<RelayFrame>(QUEUE);
    let _ = ftx.send(init_frame(id)).await;
    let mut inbound = open_stream(&mut client, frx).await?;

    let up = async move {
        let mut buf = bytes::BytesMut::new();
        loop {
            // Read straight into the frame's buffer: one read of at most 16 KiB, one frame.
            buf.reserve(FRAME);
            let n = (&mut rd).take(FRAME as u64).read_buf(&mut buf).await?;
            if n == 0 {
                break;
            }
            let frame = RelayFrame {
                payload: Some(relay_frame::Payload::Data(buf.split().freeze())),
            };
            if ftx.send(frame).await.is_err() {
                // The call ended; nobody will read more.
                break;
            }
        }
        // Dropping the sender ends our request stream (half-close towards the gateway).
        drop(ftx);
        Ok::<_, RelayError>(())
    };
    let down = async move {
        loop {
            match inbound.message().await {
                Ok(Some(frame)) => match frame.payload {
                    Some(relay_frame::Payload::Data(d)) => {
                        if !d.is_empty() {
                            wr.write_all(&d).await?;
                        }
                    }
                    _ => return Err(RelayError::UnexpectedFrame),
                },
                Ok(None) => break,
                Err(status) => return Err(RelayError::Stream(status)),
            }
        }
        wr.shutdown().await?;
        Ok::<_, RelayError>(wr)
    };
    tokio::pin!(up);
    tokio::pin!(down);
    // When the gateway side fails, stop everything: dropping both halves closes the target,
    // which for SSH ends the connection and kills its execs.
    tokio::select! {
        r = &mut down => {
            let _wr = r?;
            up.await
        }
        r = &mut up => {
            r?;
            down.await.map(drop)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(host: &str, port: u32) -> Result<SocketAddr, RelayError> {
        tcp_target(&TcpRelayTarget {
            host: host.into(),
            port,
        })
    }

    #[test]
    fn only_loopback_tcp_targets() {
        assert_eq!(t("localhost", 80).unwrap(), "127.0.0.1:80".parse().unwrap());
        assert_eq!(t("::1", 22).unwrap(), "[::1]:22".parse().unwrap());
        assert!(
            t("10.0.0.1", 80)
                .unwrap_err()
                .to_string()
                .contains("loopback")
        );
        assert!(t("example.com", 80).is_err());
        assert!(
            t("127.0.0.1", 0)
                .unwrap_err()
                .to_string()
                .contains("1-65535")
        );
        assert!(t("127.0.0.1", 70000).is_err());
    }
}
