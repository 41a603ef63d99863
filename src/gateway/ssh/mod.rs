//! The SSH exec server behind every relay, on russh.
//!
//! Authentication `none` (and `publickey`) is accepted for any user: the only way to reach this
//! server is a relay the gateway opened on an authenticated session, over an in-memory pipe.
//! Each session channel is served by its own task (`channel.rs`); this file holds the russh
//! handler, which only answers requests, so the russh session loop never waits on a child.

mod channel;
pub mod forward;
mod main_subsystem;
pub mod sftp;

use std::sync::Arc;
use std::time::Duration;

use russh::keys::PrivateKey;
use russh::keys::ssh_key::private::Ed25519Keypair;
use russh::server::{Auth, ChannelOpenHandle, Msg, Session};
use russh::{Channel, ChannelId, MethodKind, MethodSet};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::gateway::exec_service::ExecContext;

#[derive(Debug, thiserror::Error)]
pub enum SshError {
    #[error("generating the SSH host key: {0}")]
    HostKey(String),
}

/// Shared by every relay: the russh configuration (with this process's host key) and what
/// execs need.
pub struct SshServer {
    config: Arc<russh::server::Config>,
    ctx: Arc<ExecContext>,
}

impl SshServer {
    /// The policy slot the sandbox's work goes through (the relay's TCP targets connect in
    /// its view).
    pub fn slot(&self) -> &crate::gateway::policy_plane::PolicySlot {
        &self.ctx.sandbox
    }

    pub fn new(ctx: Arc<ExecContext>) -> Result<Arc<Self>, SshError> {
        // A fresh Ed25519 host key per start, like the real supervisor; the gateway does not
        // check host keys.
        let mut seed = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut seed)
            .map_err(|_| SshError::HostKey("the system random source failed".into()))?;
        let key = PrivateKey::from(Ed25519Keypair::from_seed(&seed));
        let config = russh::server::Config {
            methods: MethodSet::from(&[MethodKind::None, MethodKind::PublicKey][..]),
            keys: vec![key],
            // Nothing is ever rejected, so the constant-time delay would only slow execs down.
            auth_rejection_time: Duration::from_millis(10),
            auth_rejection_time_initial: Some(Duration::ZERO),
            // A quiet long-running exec is legitimate; the gateway's keepalives and HTTP/2
            // pings detect a dead peer.
            inactivity_timeout: None,
            window_size: channel::STDIN_WINDOW,
            nodelay: true,
            // Clients pick the first of their ciphers that we offer; leaving ChaCha20 out makes
            // every client (the gateway's russh included) use AES-GCM, which ring runs with
            // AES-NI at several times ChaCha20's speed. Output throughput depends on it.
            preferred: russh::Preferred {
                cipher: std::borrow::Cow::Borrowed(&[
                    russh::cipher::AES_256_GCM,
                    russh::cipher::AES_256_CTR,
                    russh::cipher::AES_192_CTR,
                    russh::cipher::AES_128_CTR,
                ]),
                // Plain curve25519 key exchange, not russh's default hybrid ML-KEM: this SSH
                // layer runs inside the gateway's mTLS channel and lives for one exec, and
                // the hybrid exchange cost ~0.4 ms of the ~1.5 ms handshake on every exec.
                // The gateway's russh client offers curve25519-sha256, so it is chosen.
                kex: std::borrow::Cow::Borrowed(&[
                    russh::kex::CURVE25519,
                    russh::kex::CURVE25519_PRE_RFC_8731,
                    russh::kex::EXTENSION_SUPPORT_AS_SERVER,
                    russh::kex::EXTENSION_OPENSSH_STRICT_KEX_AS_SERVER,
                ]),
                ..Default::default()
            },
            ..Default::default()
        };
        Ok(Arc::new(SshServer {
            config: Arc::new(config),
            ctx,
        }))
    }

    /// Serve one SSH connection over `stream` until it ends.
    pub async fn run<S>(self: Arc<Self>, stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let channels = Arc::new(ChannelCount::default());
        let handler = Handler {
            ctx: self.ctx.clone(),
            channels: channels.clone(),
            forwards: Arc::default(),
        };
        match russh::server::run_stream(self.config.clone(), stream, handler).await {
            Ok(running) => {
                match running.await {
                    Ok(()) => tracing::debug!("ssh connection closed"),
                    // The gateway ends the relay once it has the exit status, and an SSH
                    // client (OpenSSH behind `openshell sandbox connect`) just closes its
                    // socket when it is done: an end of stream is how a connection normally
                    // ends, never a warning. If channels were still open their tasks see the
                    // close and kill what they ran (logged there).
                    Err(russh::Error::IO(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                        if channels.all_closed() {
                            tracing::debug!("ssh connection closed by the gateway")
                        } else {
                            tracing::info!(
                                "ssh connection closed by the gateway with session channels still open"
                            )
                        }
                    }
                    // Garbage, a truncated stream, a relay error or a packet over russh's
                    // 256 KiB transport limit: the connection (and every exec on it) ends.
                    Err(e) => tracing::warn!("ssh connection over the relay ended: {e}"),
                }
            }
            Err(e) => tracing::warn!("ssh handshake over the relay failed: {e}"),
        }
    }
}

struct Handler {
    ctx: Arc<ExecContext>,
    channels: Arc<ChannelCount>,
    /// Open `direct-tcpip` channels on this connection (capped at forward::MAX_FORWARDS).
    forwards: Arc<std::sync::atomic::AtomicUsize>,
}

/// Session channels opened, and finished (exit status sent, or the client went away), on one
/// connection.
#[derive(Default)]
struct ChannelCount {
    opened: std::sync::atomic::AtomicUsize,
    closed: std::sync::atomic::AtomicUsize,
}

impl ChannelCount {
    /// Every channel opened so far has finished (true when none was opened).
    fn all_closed(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        self.closed.load(SeqCst) == self.opened.load(SeqCst)
    }
}

impl russh::server::Handler for Handler {
    type Error = russh::Error;

    async fn auth_none(&mut self, _user: &str) -> Result<Auth, Self::Error> {
        Ok(Auth::Accept)
    }

    async fn auth_publickey(
        &mut self,
        _user: &str,
        _key: russh::server::VerifiedPublicKey<'_>,
    ) -> Result<Auth, Self::Error> {
        Ok(Auth::Accept)
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: ChannelOpenHandle,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        reply.accept().await;
        self.channels
            .opened
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let channels = self.channels.clone();
        channel::spawn(channel, session.handle(), self.ctx.clone(), move || {
            channels
                .closed
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        Ok(())
    }

    async fn channel_open_direct_tcpip(
        &mut self,
        channel: Channel<Msg>,
        host_to_connect: &str,
        port_to_connect: u32,
        _originator_address: &str,
        _originator_port: u32,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        let checked = forward::target(host_to_connect, port_to_connect)
            .and_then(|addr| Ok((addr, forward::view(&self.ctx.sandbox)?)));
        let (addr, sandbox) = match checked {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!("direct-tcpip refused: {e}");
                reply
                    .reject(russh::ChannelOpenFailure::AdministrativelyProhibited)
                    .await;
                return Ok(());
            }
        };
        let slot = match forward::take_slot(&self.forwards) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("direct-tcpip refused: {e}");
                reply
                    .reject(russh::ChannelOpenFailure::ResourceShortage)
                    .await;
                return Ok(());
            }
        };
        // Accepted before connecting, as upstream does: a refused connect closes the open
        // channel instead of failing the open.
        reply.accept().await;
        forward::spawn(channel, addr, slot, sandbox);
        Ok(())
    }

    // Other channel types (x11, streamlocal) are refused by dropping the open handle, which
    // russh turns into "administratively prohibited".

    async fn tcpip_forward(
        &mut self,
        address: &str,
        port: &mut u32,
        _session: &mut Session,
    ) -> Result<bool, Self::Error> {
        // Remote forwarding would listen in the sandbox's network on the client's behalf;
        // upstream does not support it either (REQUEST_FAILURE).
        tracing::info!(
            "tcpip-forward {address}:{port} refused: remote forwarding is not supported"
        );
        Ok(false)
    }

    async fn pty_request(
        &mut self,
        channel: ChannelId,
        _term: &str,
        _cols: u32,
        _rows: u32,
        _pw: u32,
        _ph: u32,
        _modes: &[(russh::Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)
    }

    async fn env_request(
        &mut self,
        channel: ChannelId,
        _name: &str,
        _value: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        // Only OPENSHELL_NO_LOGIN_SHELL has an effect (handled by the channel task); the rest
        // are acknowledged and ignored, as the real supervisor does.
        session.channel_success(channel)
    }

    async fn exec_request(
        &mut self,
        channel: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        // The same check runs in the channel task, which reports the reason on stderr.
        match crate::gateway::exec_service::parse_command(data) {
            Ok(_) => session.channel_success(channel),
            Err(_) => session.channel_failure(channel),
        }
    }

    async fn shell_request(
        &mut self,
        channel: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)
    }

    async fn subsystem_request(
        &mut self,
        channel: ChannelId,
        name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        // `openshell-main` is always answered success, and `sftp` is
        // served by our own binary; the channel task serves both.
        if name == main_subsystem::NAME || name == sftp::SUBSYSTEM {
            return session.channel_success(channel);
        }
        tracing::debug!("subsystem `{name}` refused");
        session.channel_failure(channel)
    }
}
