//! Logs and audit to the gateway: `PushSandboxLogs`.
//!
//! - [`PushLayer`] is a `tracing` layer: every event at or above `OPENSHELL_LOG_PUSH_LEVEL`
//!   (default INFO, independent of the console filter) becomes a `SandboxLogLine`, put on a
//!   bounded channel of 1024 lines with `try_send`, so logging never blocks; overflow is
//!   dropped.
//! - [`start`] runs the pusher: batches of 50 lines or every 500 ms on one client stream (at
//!   most 32 batches queued on it), its own channel, reconnecting after 1 s doubling to 30 s.
//!   It is woken by a full batch or the interval, never per line.
//!   While disconnected it keeps the first 200 lines (contiguous with what was delivered),
//!   drops the rest and says how many after reconnecting. UNAUTHENTICATED on the stream turns
//!   log push off for good.
//! - [`ocsf`] builds the audit records: exec launch and end (carrying the exit report), the
//!   supervisor's own refusals and policy state changes, each one line on target `ocsf` in
//!   OpenShell's shorthand. The pushed line has level `OCSF` and no fields.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

use super::backoff::Backoff;
use super::channel;
use super::config::GatewayConfig;
use super::ocsf;
use super::tokens::TokenStore;
use crate::proto::v1::{PushSandboxLogsRequest, SandboxLogLine};

/// The local buffer between the tracing layer and the pusher.
pub const CHANNEL_LINES: usize = 1024;
/// Lines per request.
pub const BATCH_LINES: usize = 50;
/// A partial batch is sent after this long.
pub const BATCH_INTERVAL: Duration = Duration::from_millis(500);
/// Requests queued on the open stream.
pub const QUEUED_BATCHES: usize = 32;
/// Lines kept while disconnected.
pub const KEPT_WHILE_DOWN: usize = 200;

/// Where the layer puts lines once [`start`] has run; unset before (and in other commands).
static SINK: OnceLock<Sink> = OnceLock::new();

struct Sink {
    tx: mpsc::Sender<SandboxLogLine>,
    /// Signalled once a full batch is waiting. The pusher does not wait on the channel
    /// itself: that would wake its task (a futex wake and a context switch when it is parked
    /// on the other worker) for every line, several times per exec, which was most of what
    /// log push cost per exec. It drains the channel when a batch is full or the interval
    /// ticks.
    batch_ready: tokio::sync::Notify,
    sandbox_id: String,
    /// Set for good on UNAUTHENTICATED.
    off: AtomicBool,
    /// Lines the full channel refused.
    overflow: AtomicU64,
}

/// `OPENSHELL_LOG_PUSH_LEVEL`, default INFO; an unreadable value is INFO too.
pub fn push_level_from_env() -> tracing::Level {
    std::env::var("OPENSHELL_LOG_PUSH_LEVEL")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(tracing::Level::INFO)
}

/// The tracing layer; install it with a `LevelFilter` of [`push_level_from_env`].
pub struct PushLayer;

/// [`PushLayer`] at `OPENSHELL_LOG_PUSH_LEVEL` (default INFO), for `logging::init_with_layer`.
/// It is inert until [`start`].
pub fn filtered_layer<S>() -> impl Layer<S> + Send + Sync
where
    S: Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    PushLayer.with_filter(tracing_subscriber::filter::LevelFilter::from_level(
        push_level_from_env(),
    ))
}

/// Targets never pushed: the transport's own chatter would describe (and feed) the push.
const QUIET_TARGETS: [&str; 6] = ["h2", "hyper", "tonic", "tower", "rustls", "russh"];

impl<S: Subscriber> Layer<S> for PushLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let Some(sink) = SINK.get() else { return };
        if sink.off.load(Ordering::Relaxed) {
            return;
        }
        let meta = event.metadata();
        let target = meta.target();
        if QUIET_TARGETS.iter().any(|q| {
            target
                .strip_prefix(q)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
        }) {
            return;
        }
        let mut v = Fields::default();
        event.record(&mut v);
        let ocsf = target == ocsf::TARGET;
        let line = SandboxLogLine {
            sandbox_id: sink.sandbox_id.clone(),
            timestamp_ms: now_ms(),
            level: if ocsf {
                "OCSF".into()
            } else {
                meta.level().to_string()
            },
            target: target.to_owned(),
            message: v.message,
            source: "sandbox".into(),
            fields: if ocsf { HashMap::new() } else { v.fields },
        };
        if sink.tx.try_send(line).is_err() {
            sink.overflow.fetch_add(1, Ordering::Relaxed);
        } else if sink.tx.max_capacity() - sink.tx.capacity() >= BATCH_LINES {
            // Stores a permit if the pusher is busy, so a full batch is never missed.
            sink.batch_ready.notify_one();
        }
    }
}

#[derive(Default)]
struct Fields {
    message: String,
    fields: HashMap<String, String>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_owned();
        } else {
            self.fields
                .insert(field.name().to_owned(), value.to_owned());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.fields
                .insert(field.name().to_owned(), format!("{value:?}"));
        }
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Turn log push on (only with a sandbox id and an endpoint, which `cfg` has) and run
/// the pusher until `stop`. Events before this call are not pushed.
pub fn start(
    cfg: GatewayConfig,
    tokens: Arc<TokenStore>,
    stop: watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<()>> {
    let (tx, rx) = mpsc::channel(CHANNEL_LINES);
    let sink = Sink {
        tx,
        batch_ready: tokio::sync::Notify::new(),
        sandbox_id: cfg.sandbox_id.clone(),
        off: AtomicBool::new(false),
        overflow: AtomicU64::new(0),
    };
    if SINK.set(sink).is_err() {
        return None;
    }
    Some(tokio::spawn(run(cfg, tokens, rx, stop)))
}

/// How one stream ended.
#[derive(Debug)]
enum StreamEnd {
    Unauthenticated,
    Broken,
    Stopped,
}

async fn run(
    cfg: GatewayConfig,
    tokens: Arc<TokenStore>,
    mut rx: mpsc::Receiver<SandboxLogLine>,
    mut stop: watch::Receiver<bool>,
) {
    let mut kept: VecDeque<SandboxLogLine> = VecDeque::new();
    let mut dropped = 0u64;
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    loop {
        let connected = async {
            // The token is obtained by the policy plane and the session; exchanging it here
            // too would race them into a second IssueSandboxToken.
            while tokens.has_source() && tokens.get().is_none() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            channel::connect(&cfg).await.map_err(|e| e.to_string())
        };
        let ch = tokio::select! {
            c = connected => c,
            _ = super::stop::stopped(&mut stop) => return,
        };
        match ch {
            Ok(ch) => {
                backoff.reset();
                match stream(
                    &cfg,
                    &tokens,
                    ch,
                    &mut rx,
                    &mut kept,
                    &mut dropped,
                    &mut stop,
                )
                .await
                {
                    StreamEnd::Stopped => return,
                    StreamEnd::Unauthenticated => {
                        if let Some(s) = SINK.get() {
                            s.off.store(true, Ordering::Relaxed);
                        }
                        tracing::warn!(
                            "PushSandboxLogs: the gateway answered UNAUTHENTICATED; log push is off for the rest of this process"
                        );
                        return;
                    }
                    StreamEnd::Broken => {}
                }
            }
            Err(e) => tracing::debug!("log push: connecting: {e}"),
        }
        // Disconnected: keep the first lines up to the bound until the next attempt.
        let delay = backoff.next_delay();
        let wait = tokio::time::sleep(delay);
        tokio::pin!(wait);
        loop {
            tokio::select! {
                _ = &mut wait => break,
                _ = super::stop::stopped(&mut stop) => return,
                line = rx.recv() => match line {
                    Some(l) if kept.len() < KEPT_WHILE_DOWN => kept.push_back(l),
                    Some(_) => dropped += 1,
                    None => return,
                },
            }
        }
    }
}

/// One PushSandboxLogs stream: the kept lines first, then batches, until it breaks.
async fn stream(
    cfg: &GatewayConfig,
    tokens: &Arc<TokenStore>,
    ch: tonic::transport::Channel,
    rx: &mut mpsc::Receiver<SandboxLogLine>,
    kept: &mut VecDeque<SandboxLogLine>,
    dropped: &mut u64,
    stop: &mut watch::Receiver<bool>,
) -> StreamEnd {
    let mut client = channel::client(ch, tokens);
    let (req_tx, req_rx) = mpsc::channel::<PushSandboxLogsRequest>(QUEUED_BATCHES);
    let call = client.push_sandbox_logs(ReceiverStream::new(req_rx));
    tokio::pin!(call);
    let batch = |logs: Vec<SandboxLogLine>| PushSandboxLogsRequest {
        sandbox_id: cfg.sandbox_id.clone(),
        logs,
    };
    if *dropped > 0 {
        // Said on the new stream, right after the kept lines, so the gap is visible where it is.
        kept.push_back(SandboxLogLine {
            sandbox_id: cfg.sandbox_id.clone(),
            timestamp_ms: now_ms(),
            level: "WARN".into(),
            target: module_path!().into(),
            message: format!(
                "{dropped} log lines dropped while the gateway was unreachable (at most {KEPT_WHILE_DOWN} are kept)"
            ),
            source: "sandbox".into(),
            fields: HashMap::new(),
        });
        *dropped = 0;
    }
    while !kept.is_empty() {
        let n = kept.len().min(BATCH_LINES);
        let logs: Vec<_> = kept.drain(..n).collect();
        if req_tx.try_send(batch(logs)).is_err() {
            break;
        }
    }
    let mut buf: Vec<SandboxLogLine> = Vec::with_capacity(BATCH_LINES);
    let mut flush = tokio::time::interval(BATCH_INTERVAL);
    flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let batch_ready = || async {
        match SINK.get() {
            Some(s) => s.batch_ready.notified().await,
            None => std::future::pending().await,
        }
    };
    loop {
        tokio::select! {
            res = &mut call => {
                // Whatever was still buffered goes first on the next stream.
                kept.extend(buf.drain(..).take(KEPT_WHILE_DOWN));
                return ended(Some(res.map(|_| ())));
            }
            _ = super::stop::stopped(stop) => {
                // Best effort: what is queued goes out before the stream is dropped.
                while let Ok(l) = rx.try_recv() {
                    buf.push(l);
                    if buf.len() >= BATCH_LINES {
                        let _ = req_tx.try_send(batch(std::mem::take(&mut buf)));
                    }
                }
                if !buf.is_empty() {
                    let _ = req_tx.try_send(batch(std::mem::take(&mut buf)));
                }
                drop(req_tx);
                let _ = tokio::time::timeout(Duration::from_secs(1), &mut call).await;
                return StreamEnd::Stopped;
            }
            _ = batch_ready() => {
                if let Err(end) = drain(rx, &mut buf, &req_tx, &batch, false).await {
                    return after_drain(end, &mut call, &mut buf, kept).await;
                }
            }
            _ = flush.tick() => {
                if let Err(end) = drain(rx, &mut buf, &req_tx, &batch, true).await {
                    return after_drain(end, &mut call, &mut buf, kept).await;
                }
            }
        }
    }
}

/// How long a stream whose requests can no longer be sent is given to say why it ended.
const END_STATUS_WAIT: Duration = Duration::from_secs(1);

/// The end of a stream whose batch could not be sent: the call has ended (or is ending), and
/// its status says whether to reconnect. The gateway answers while the request stream is still
/// open, so a send can be the first to see the end of a call that said UNAUTHENTICATED: taken
/// for a broken stream, that would be one more call after the gateway refused us.
async fn after_drain<F>(
    end: StreamEnd,
    call: &mut std::pin::Pin<&mut F>,
    buf: &mut Vec<SandboxLogLine>,
    kept: &mut VecDeque<SandboxLogLine>,
) -> StreamEnd
where
    F: std::future::Future<
            Output = Result<
                tonic::Response<crate::proto::v1::PushSandboxLogsResponse>,
                tonic::Status,
            >,
        >,
{
    if !matches!(end, StreamEnd::Broken) {
        return end;
    }
    kept.extend(buf.drain(..).take(KEPT_WHILE_DOWN));
    let res = tokio::time::timeout(END_STATUS_WAIT, call.as_mut())
        .await
        .ok();
    ended(res.map(|r| r.map(|_| ())))
}

/// What a stream's end means: its status when it gave one (`None`: none within
/// [`END_STATUS_WAIT`]). Every end but UNAUTHENTICATED is a broken stream, said once.
fn ended(res: Option<Result<(), tonic::Status>>) -> StreamEnd {
    match res {
        Some(Err(s)) if s.code() == Code::Unauthenticated => StreamEnd::Unauthenticated,
        Some(Err(s)) => {
            tracing::info!(
                "PushSandboxLogs stream ended: {:?}: {}; reconnecting",
                s.code(),
                s.message()
            );
            StreamEnd::Broken
        }
        Some(Ok(())) => {
            tracing::info!("PushSandboxLogs stream ended: the gateway closed it; reconnecting");
            StreamEnd::Broken
        }
        None => {
            tracing::info!(
                "PushSandboxLogs stream ended: its requests could not be sent and it gave no status; reconnecting"
            );
            StreamEnd::Broken
        }
    }
}

/// Send `buf` as one batch; a batch the ended stream did not take goes back to `buf`, for the
/// next stream.
async fn send(
    req_tx: &mpsc::Sender<PushSandboxLogsRequest>,
    batch: impl Fn(Vec<SandboxLogLine>) -> PushSandboxLogsRequest,
    buf: &mut Vec<SandboxLogLine>,
) -> Result<(), StreamEnd> {
    match req_tx.send(batch(std::mem::take(buf))).await {
        Ok(()) => Ok(()),
        Err(mpsc::error::SendError(req)) => {
            *buf = req.logs;
            Err(StreamEnd::Broken)
        }
    }
}

/// Move what the layer queued into batches of [`BATCH_LINES`] and send them; with `partial`
/// (the interval ticked) the rest goes too.
async fn drain(
    rx: &mut mpsc::Receiver<SandboxLogLine>,
    buf: &mut Vec<SandboxLogLine>,
    req_tx: &mpsc::Sender<PushSandboxLogsRequest>,
    batch: impl Fn(Vec<SandboxLogLine>) -> PushSandboxLogsRequest,
    partial: bool,
) -> Result<(), StreamEnd> {
    loop {
        match rx.try_recv() {
            Ok(l) => buf.push(l),
            Err(mpsc::error::TryRecvError::Empty) => break,
            Err(mpsc::error::TryRecvError::Disconnected) => return Err(StreamEnd::Stopped),
        }
        if buf.len() >= BATCH_LINES {
            send(req_tx, &batch, buf).await?;
        }
    }
    if partial && !buf.is_empty() {
        send(req_tx, &batch, buf).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(message: &str) -> SandboxLogLine {
        SandboxLogLine {
            message: message.into(),
            ..SandboxLogLine::default()
        }
    }

    fn batch(logs: Vec<SandboxLogLine>) -> PushSandboxLogsRequest {
        PushSandboxLogsRequest {
            sandbox_id: "s".into(),
            logs,
        }
    }

    /// A batch the ended stream did not take is kept for the next one, in order.
    #[tokio::test]
    async fn a_batch_that_could_not_be_sent_is_kept() {
        let (tx, rx) = mpsc::channel(1);
        drop(rx);
        let mut buf = vec![line("a"), line("b")];
        assert!(matches!(
            send(&tx, batch, &mut buf).await,
            Err(StreamEnd::Broken)
        ));
        let kept: Vec<&str> = buf.iter().map(|l| l.message.as_str()).collect();
        assert_eq!(kept, ["a", "b"]);

        let (tx, mut rx) = mpsc::channel(1);
        send(&tx, batch, &mut buf).await.unwrap();
        assert!(buf.is_empty());
        assert_eq!(rx.recv().await.unwrap().logs.len(), 2);
    }

    /// A stream whose send failed reads the call's status: UNAUTHENTICATED stops log push
    /// (no further call); anything else, or no status in time, is a broken stream.
    #[tokio::test]
    async fn a_failed_send_is_decided_by_the_calls_status() {
        async fn end_with(
            status: Option<Result<(), tonic::Status>>,
        ) -> (StreamEnd, VecDeque<SandboxLogLine>) {
            let call = async move {
                match status {
                    Some(Ok(())) => Ok(tonic::Response::new(
                        crate::proto::v1::PushSandboxLogsResponse::default(),
                    )),
                    Some(Err(s)) => Err(s),
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(call);
            let mut buf = vec![line("unsent")];
            let mut kept = VecDeque::new();
            let end = after_drain(StreamEnd::Broken, &mut call, &mut buf, &mut kept).await;
            assert!(buf.is_empty());
            (end, kept)
        }
        let (end, kept) = end_with(Some(Err(tonic::Status::unauthenticated("no")))).await;
        assert!(matches!(end, StreamEnd::Unauthenticated));
        assert_eq!(kept.len(), 1);
        let (end, _) = end_with(Some(Err(tonic::Status::unavailable("down")))).await;
        assert!(matches!(end, StreamEnd::Broken));
        let (end, _) = end_with(Some(Ok(()))).await;
        assert!(matches!(end, StreamEnd::Broken));
        // No status within the wait (a second of real time).
        let (end, kept) = end_with(None).await;
        assert!(matches!(end, StreamEnd::Broken));
        assert_eq!(kept[0].message, "unsent");
    }
}
