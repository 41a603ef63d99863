//! The ConnectSupervisor session: hello, SessionAccepted, heartbeats, RelayOpen
//! dispatch, and reconnecting with backoff (`backoff::Reconnect` decides the delays). Gateway errors are logged with what they mean and
//! retried; nothing the gateway does makes the supervisor exit.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::auth;
use super::backoff::{Attempt, Reconnect, STABLE_SESSION};
use super::channel::{self, ChannelSlot, ConnectError};
use super::config::{GatewayConfig, TokenSource};
use super::tokens::{TokenError, TokenStore};
use crate::proto::v1::open_shell_client::OpenShellClient;
use crate::proto::v1::{
    GatewayMessage, HealthRequest, RelayOpen, ServiceStatus, SupervisorHeartbeat, SupervisorHello,
    SupervisorMessage, gateway_message, supervisor_message,
};

/// Where the session hands each RelayOpen. The relay layer, which sits above the session,
/// implements it, so the session never imports it.
pub trait RelayOpener: Send + Sync {
    /// Start serving one relay; returns at once (the relay runs on its own task).
    fn open_relay(
        self: Arc<Self>,
        open: RelayOpen,
        client: channel::Client,
        results: mpsc::Sender<SupervisorMessage>,
    );
}

/// Shared state of the control loop.
pub struct Session {
    pub cfg: GatewayConfig,
    pub tokens: Arc<TokenStore>,
    pub channels: Arc<ChannelSlot>,
    /// One per main process: the same on every reconnect (HEAD semantics).
    pub instance_id: String,
    pub relays: Arc<dyn RelayOpener>,
    /// How long to wait for response headers and SessionAccepted before giving up on an attempt.
    pub hello_timeout: Duration,
    /// Reconnect backoff: first delay and cap (`--reconnect-base-ms`, `--reconnect-max-ms`).
    pub reconnect: (Duration, Duration),
}

#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error("{}", describe_status(.0, .1))]
    Status(Status, bool),
    /// An error on the response stream after the gateway answered the call.
    #[error("{}", describe_stream_error(.0, .1))]
    Stream(Status, bool),
    #[error("the gateway did not answer the hello within {0:?}")]
    HelloTimeout(Duration),
    #[error("the gateway's first message was not SessionAccepted")]
    NotAccepted,
    #[error("the gateway rejected the session: {0}")]
    Rejected(String),
    #[error("the gateway ended the session stream")]
    Ended,
}

/// What a gRPC status on ConnectSupervisor means, in words an operator can act on.
fn describe_status(s: &Status, has_token: &bool) -> String {
    let meaning = match s.code() {
        Code::Unauthenticated if !has_token => {
            "the gateway requires a bearer token and none is configured: set OPENSHELL_K8S_SA_TOKEN_FILE, OPENSHELL_SANDBOX_TOKEN_FILE or OPENSHELL_SANDBOX_TOKEN (v0.0.47+ gateways need a sandbox JWT)"
        }
        Code::Unauthenticated => "the gateway did not accept the bearer token",
        Code::PermissionDenied if !has_token => {
            "the gateway wants a sandbox principal, i.e. a sandbox JWT, and no token source is configured: set OPENSHELL_K8S_SA_TOKEN_FILE, OPENSHELL_SANDBOX_TOKEN_FILE or OPENSHELL_SANDBOX_TOKEN"
        }
        Code::PermissionDenied => {
            "the token is not for this sandbox (its sandbox_id must equal OPENSHELL_SANDBOX_ID)"
        }
        Code::NotFound => "the gateway does not know this sandbox id (OPENSHELL_SANDBOX_ID)",
        Code::InvalidArgument => "the gateway rejected the hello",
        Code::Unavailable => "the gateway is unavailable or restarting",
        Code::Unimplemented => {
            "the endpoint does not serve ConnectSupervisor (not an OpenShell gateway?)"
        }
        Code::ResourceExhausted => "the gateway is rate limiting",
        _ => "the gateway refused the session",
    };
    let cause = std::error::Error::source(s)
        .map(|e| format!(": {}", channel::chain(e)))
        .unwrap_or_default();
    // With TLS 1.3 a refused client certificate shows up as an alert on the first read, after
    // the handshake looked fine to us.
    let hint = if cause.contains("alert") {
        "; the gateway refused the TLS client certificate: check OPENSHELL_TLS_CERT / OPENSHELL_TLS_KEY are signed by the CA the gateway trusts and not expired"
    } else {
        ""
    };
    format!("{meaning} [{:?}: {}{cause}]{hint}", s.code(), s.message())
}

/// What an error on the open session stream means. Unlike a refusal of the call, these are
/// mostly our decoder rejecting what the gateway sent, and saying "refused" would send an
/// operator looking at credentials.
fn describe_stream_error(s: &Status, has_token: &bool) -> String {
    let meaning = match s.code() {
        // tonic reports a declared length over max_decoding_message_size (4 MiB, see
        // channel::client) as OUT_OF_RANGE, from the 5-byte header, before it reads or
        // allocates the body.
        Code::OutOfRange => {
            "the gateway sent a message over the 4 MiB limit; the session stream is dropped without reading it"
        }
        Code::Internal => {
            "the session stream broke: the gateway sent bytes that are not a valid gRPC message (bad frame, compression flag or protobuf), or ended the stream with INTERNAL"
        }
        // Credentials can be refused on the stream too (trailers-only answers).
        Code::Unauthenticated | Code::PermissionDenied | Code::NotFound => {
            return describe_status(s, has_token);
        }
        _ => {
            let cause = std::error::Error::source(s)
                .map(|e| format!(": {}", channel::chain(e)))
                .unwrap_or_default();
            return format!(
                "the session stream broke (gateway restarted, connection lost, or HTTP/2 PINGs unanswered) [{:?}: {}{cause}]",
                s.code(),
                s.message()
            );
        }
    };
    format!("{meaning} [{:?}: {}]", s.code(), s.message())
}

/// Keep a session up until `stop` turns true.
pub async fn run(session: Arc<Session>, mut stop: watch::Receiver<bool>) {
    let mut reconnect = Reconnect::new(session.reconnect.0, session.reconnect.1);
    loop {
        if *stop.borrow() {
            return;
        }
        let mut progress = Progress::default();
        let result = tokio::select! {
            r = one_session(&session, &mut progress) => r,
            _ = stop.changed() => return,
        };
        let stable = progress
            .accepted
            .is_some_and(|at| at.elapsed() >= STABLE_SESSION);
        if let Err(e) = &result {
            tracing::warn!(endpoint = %session.cfg.endpoint, "gateway session: {e}");
            if let SessionError::Status(s, _) | SessionError::Stream(s, _) = e
                && s.code() == Code::Unauthenticated
                && matches!(
                    session.tokens.source,
                    TokenSource::ServiceAccount(_) | TokenSource::File(_)
                )
            {
                // The token may be stale: read the token file again, or exchange the SA
                // token again, on the next attempt.
                session.tokens.reset();
            }
        }
        let last = if stable {
            Attempt::Healthy
        } else {
            let rate_limited = matches!(
                &result,
                Err(SessionError::Status(s, _) | SessionError::Stream(s, _))
                    if s.code() == Code::ResourceExhausted
            );
            let gateway_up = match progress.channel.take() {
                Some(ch) if !rate_limited => tokio::select! {
                    up = answers_health(ch, session.hello_timeout.min(HEALTH_PROBE)) => up,
                    _ = stop.changed() => return,
                },
                _ => false,
            };
            Attempt::Failed { gateway_up }
        };
        let delay = reconnect.next(last);
        let why = match last {
            Attempt::Healthy => "the session was up",
            Attempt::Failed { gateway_up: true } => "the gateway answers Health",
            Attempt::Failed { gateway_up: false } => "backing off",
        };
        tracing::info!("reconnecting to the gateway in {delay:?} ({why})");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.changed() => return,
        }
    }
}

/// How long the `Health` probe after a failed attempt may take.
const HEALTH_PROBE: Duration = Duration::from_secs(2);

/// How far one attempt got, kept even when it ends in an error.
#[derive(Default)]
struct Progress {
    /// The attempt's channel, once connected.
    channel: Option<Channel>,
    /// When SessionAccepted arrived.
    accepted: Option<Instant>,
}

/// Whether the gateway answers `Health` (unauthenticated) with HEALTHY. It tells a
/// gateway that is up but refusing or dropping the session from one that is gone, or from a
/// proxy in front of it answering for a gateway it cannot reach.
async fn answers_health(ch: Channel, limit: Duration) -> bool {
    let mut client = OpenShellClient::new(ch);
    matches!(
        tokio::time::timeout(limit, client.health(HealthRequest {})).await,
        Ok(Ok(r)) if r.get_ref().status == ServiceStatus::Healthy as i32
    )
}

async fn one_session(s: &Arc<Session>, progress: &mut Progress) -> Result<(), SessionError> {
    let ch = channel::connect(&s.cfg).await?;
    progress.channel = Some(ch.clone());
    auth::ensure_token(&s.tokens, &ch).await?;
    s.channels.set(ch.clone()).await;
    let mut client = channel::client(ch, &s.tokens);

    let (tx, rx) = mpsc::channel::<SupervisorMessage>(64);
    // The gateway reads the hello before it sends response headers, so it must be queued
    // before the call is awaited.
    let hello = SupervisorMessage {
        payload: Some(supervisor_message::Payload::Hello(SupervisorHello {
            sandbox_id: s.cfg.sandbox_id.clone(),
            instance_id: s.instance_id.clone(),
        })),
    };
    // The receiver is alive; this cannot fail.
    let _ = tx.send(hello).await;
    let has_token = s.tokens.get().is_some();
    let status = |st| SessionError::Status(st, has_token);
    let resp = tokio::time::timeout(
        s.hello_timeout,
        client.connect_supervisor(ReceiverStream::new(rx)),
    )
    .await
    .map_err(|_| SessionError::HelloTimeout(s.hello_timeout))?
    .map_err(status)?;
    let mut inbound = resp.into_inner();
    let broken = |st| SessionError::Stream(st, has_token);
    let first = tokio::time::timeout(s.hello_timeout, inbound.message())
        .await
        .map_err(|_| SessionError::HelloTimeout(s.hello_timeout))?
        .map_err(broken)?;
    let accepted = match first.and_then(|m| m.payload) {
        Some(gateway_message::Payload::SessionAccepted(a)) => a,
        Some(gateway_message::Payload::SessionRejected(r)) => {
            return Err(SessionError::Rejected(r.reason));
        }
        _ => return Err(SessionError::NotAccepted),
    };
    progress.accepted = Some(Instant::now());
    let interval = Duration::from_secs(u64::from(accepted.heartbeat_interval_secs.max(5)));
    tracing::info!(
        session_id = %accepted.session_id,
        sandbox_id = %s.cfg.sandbox_id,
        heartbeat_secs = interval.as_secs(),
        "gateway session accepted"
    );
    let mut heartbeat = tokio::time::interval_at(Instant::now() + interval, interval);
    loop {
        tokio::select! {
            _ = heartbeat.tick() => {
                let hb = SupervisorMessage {
                    payload: Some(supervisor_message::Payload::Heartbeat(SupervisorHeartbeat {})),
                };
                if tx.send(hb).await.is_err() {
                    return Err(SessionError::Ended);
                }
            }
            msg = inbound.message() => {
                let msg: Option<GatewayMessage> = msg.map_err(broken)?;
                let Some(msg) = msg else { return Err(SessionError::Ended) };
                match msg.payload {
                    Some(gateway_message::Payload::RelayOpen(open)) => {
                        s.relays.clone().open_relay(open, client.clone(), tx.clone());
                    }
                    Some(gateway_message::Payload::Heartbeat(_)) => {
                        tracing::trace!("gateway heartbeat");
                    }
                    Some(gateway_message::Payload::RelayClose(c)) => {
                        // Neither side sends it in practice; closing is by stream end.
                        tracing::debug!(channel_id = %c.channel_id, reason = %c.reason, "gateway sent RelayClose; ignored");
                    }
                    Some(gateway_message::Payload::SessionRejected(r)) => {
                        return Err(SessionError::Rejected(r.reason));
                    }
                    Some(gateway_message::Payload::SessionAccepted(_)) => {
                        tracing::warn!("duplicate SessionAccepted ignored");
                    }
                    // A payload this build does not know (a newer gateway's addition decodes
                    // to None): skip it, as the gateway skips unknown supervisor messages.
                    // Ending the session would make every newer gateway unusable.
                    None => tracing::warn!("gateway sent a message kind this supervisor does not know; ignored"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_meanings_name_what_is_missing() {
        let m = describe_status(
            &Status::permission_denied("needs a sandbox principal"),
            &false,
        );
        assert!(m.contains("OPENSHELL_K8S_SA_TOKEN_FILE"), "{m}");
        let m = describe_status(&Status::not_found("x"), &true);
        assert!(m.contains("OPENSHELL_SANDBOX_ID"), "{m}");
    }

    #[test]
    fn stream_errors_say_what_the_gateway_sent() {
        let m = describe_stream_error(
            &Status::out_of_range("decoded message length too large: found 1073741824 bytes"),
            &true,
        );
        assert!(m.contains("over the 4 MiB limit"), "{m}");
        assert!(m.contains("1073741824") && !m.contains("refused"), "{m}");
        let m = describe_stream_error(
            &Status::internal("failed to decode Protobuf message"),
            &true,
        );
        assert!(
            m.contains("not a valid gRPC message") && !m.contains("refused"),
            "{m}"
        );
        // Other codes keep the token-aware meanings of a refusal.
        let m = describe_stream_error(&Status::permission_denied("x"), &false);
        assert!(m.contains("OPENSHELL_K8S_SA_TOKEN_FILE"), "{m}");
    }
}
