//! One SSH session channel: collect `pty-req` / `env`, start the child on `exec` or `shell`,
//! stream its output with backpressure, feed its stdin, and finish with `eof`, `exit-status`
//! (plus `exit-signal` for a signal death) and `close`.
//!
//! If the channel or the connection goes away before the child ends (the gateway timed out or
//! vanished), the child's whole tree is killed: nothing of an exec outlives its channel.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use russh::server::{Handle, Msg};
use russh::{Channel, ChannelId, ChannelMsg, ChannelReadHalf, ChannelWriteHalf, Sig};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::{main_subsystem, sftp};
use crate::exec::pty;
use crate::exec::{Child, ExitInfo, SpawnSpec, Stdio};
use crate::gateway::ended::Ended;
use crate::gateway::exec_service::{ExecContext, parse_command, stop_child};
use crate::gateway::stop::stopped;

/// Output is read in pieces of this size; the SSH window bounds what is in flight.
const CHUNK: usize = 64 * 1024;
/// Most stdin bytes queued per channel between the SSH channel and the child. russh extends
/// the peer's window as soon as data arrives, not as it is consumed, so the window bounds
/// nothing here: past this, the channel task stops reading the channel, russh's bounded
/// per-channel queue fills, and the session loop stops reading the relay, which stops the
/// gateway through HTTP/2 flow control.
pub const STDIN_QUEUE: usize = 1 << 20;
/// The window we grant the peer for channel data. russh re-grants it on receipt, so it does
/// not bound memory, but it bounds how much stdin can be in flight while we are not reading:
/// it must stay below what the relay path buffers (the gateway's 64 KiB duplex and 16-frame
/// queue), or a peer whose SSH loop blocks on writing (russh's does) could no
/// longer read our output while we pause its input, and both ends would wait on each other.
/// It also bounds the stdin ahead of a message the session loop must reach (STDIN_HARD_CAP).
pub const STDIN_WINDOW: u32 = 128 * 1024;
/// The one exception to [`STDIN_QUEUE`]. Blocking the session loop also stops our *output* on
/// this connection: a filter (`cat`) whose input waits for its output to drain would deadlock
/// against its own full queue, because the peer's window adjustment for our output sits in the
/// stream behind up to [`STDIN_WINDOW`] bytes of its stdin. So while the queue is full and an
/// output write is stuck although the peer has granted window for it (what it waits for is
/// the session loop, not the peer), one more message is read every [`UNSTICK`], up to this
/// many bytes queued. A peer that stops reading our output grants no window and gets no
/// exception.
const STDIN_HARD_CAP: usize = STDIN_QUEUE + 2 * STDIN_WINDOW as usize;
const UNSTICK: Duration = Duration::from_millis(5);
/// Exit status for a request we refuse (bad command string, no shell, no pty).
const REFUSED: u32 = 2;

/// Serve `channel` in its own task; `done` runs when it is finished.
pub fn spawn(
    channel: Channel<Msg>,
    handle: Handle,
    ctx: Arc<ExecContext>,
    done: impl FnOnce() + Send + 'static,
) {
    tokio::spawn(async move {
        let id = channel.id();
        serve(channel, handle, ctx).await;
        done();
        tracing::trace!(?id, "ssh channel done");
    });
}

struct PtyReq {
    term: String,
    cols: u32,
    rows: u32,
}

enum Start {
    Exec(Vec<u8>),
    Shell,
    /// The `sftp` subsystem: our own binary in its `sftp-server` mode (sftp.rs).
    Sftp,
}

/// Input that arrived before the child existed (requests and data are ordered, but the
/// gateway does not wait for the exec reply before sending stdin).
#[derive(Default)]
struct Early {
    data: Vec<Bytes>,
    eof: bool,
}

async fn serve(channel: Channel<Msg>, handle: Handle, ctx: Arc<ExecContext>) {
    let id = channel.id();
    let (mut rd, wr) = channel.split();
    let mut pty: Option<PtyReq> = None;
    let mut login = true;
    let mut main_read_only = false;
    let mut early = Early::default();
    let mut early_bytes = 0usize;
    // A channel that never asks for anything would otherwise live (and buffer) forever.
    let deadline = tokio::time::Instant::now() + ctx.request_timeout;
    let start = loop {
        let msg = match tokio::time::timeout_at(deadline, rd.wait()).await {
            Ok(m) => m,
            Err(_) => {
                tracing::info!(
                    ?id,
                    "session channel sent no exec, shell or subsystem request within {:?}; closing it",
                    ctx.request_timeout
                );
                let _ = wr.close().await;
                return;
            }
        };
        match msg {
            None | Some(ChannelMsg::Close) => return,
            Some(ChannelMsg::RequestPty {
                term,
                col_width,
                row_height,
                ..
            }) => {
                pty = Some(PtyReq {
                    term,
                    cols: col_width,
                    rows: row_height,
                })
            }
            Some(ChannelMsg::SetEnv {
                variable_name,
                variable_value,
                ..
            }) => {
                if variable_name == "OPENSHELL_NO_LOGIN_SHELL" {
                    login = variable_value.trim() != "1";
                }
                if variable_name == main_subsystem::READ_ONLY_ENV {
                    main_read_only = variable_value == "1";
                }
            }
            Some(ChannelMsg::WindowChange {
                col_width,
                row_height,
                ..
            }) => match pty.as_mut() {
                Some(p) => (p.cols, p.rows) = (col_width, row_height),
                None => tracing::debug!("window-change on a channel without a pty; ignored"),
            },
            Some(ChannelMsg::Exec { command, .. }) => break Start::Exec(command),
            Some(ChannelMsg::RequestShell { .. }) => break Start::Shell,
            Some(ChannelMsg::RequestSubsystem { name, .. }) if name == main_subsystem::NAME => {
                let size = pty.as_ref().map(|p| (p.cols, p.rows));
                return main_subsystem::serve(&ctx, &mut rd, &wr, size, main_read_only).await;
            }
            Some(ChannelMsg::RequestSubsystem { name, .. }) if name == sftp::SUBSYSTEM => {
                break Start::Sftp;
            }
            Some(ChannelMsg::RequestSubsystem { name, .. }) => {
                // The handler has answered with a failure; end the channel too, so the
                // client (OpenSSH's sftp, `openshell sandbox connect`) sees it close and the
                // connection ends cleanly instead of with a channel left open.
                tracing::info!(?id, "subsystem `{name}` is not served; closing the channel");
                let _ = wr.close().await;
                return;
            }
            Some(ChannelMsg::Data { data }) => {
                // Stdin before any request is held until the child exists; the same bound
                // as a running exec's queue, but nothing can drain it, so past it the
                // channel is closed.
                early_bytes += data.len();
                if early_bytes > STDIN_QUEUE {
                    tracing::warn!(
                        ?id,
                        "session channel sent over {STDIN_QUEUE} bytes of data before any request; closing it"
                    );
                    let _ = wr.close().await;
                    return;
                }
                early.data.push(data)
            }
            Some(ChannelMsg::Eof) => early.eof = true,
            Some(_) => {}
        }
    };
    let mut program_fd = None;
    let argv = match start {
        Start::Exec(raw) => parse_command(&raw).and_then(|c| ctx.exec_argv(&c, login)),
        Start::Shell => ctx.shell_argv(pty.is_some()),
        Start::Sftp => match sftp::program_fd() {
            Ok(fd) => {
                program_fd = Some(fd);
                // SFTP is binary on stdin/stdout: never on a pty.
                pty = None;
                Ok(vec!["openshell-sandbox".into(), sftp::MODE.into()])
            }
            Err(e) => {
                tracing::warn!(?id, "sftp refused: {e}");
                return refuse(&wr, &format!("sftp refused: {e}"), REFUSED).await;
            }
        },
    };
    let argv = match argv {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(?id, "exec refused: {e}");
            return refuse(&wr, &format!("exec refused: {e}"), REFUSED).await;
        }
    };
    let term = match &pty {
        Some(p) if !p.term.is_empty() => p.term.clone(),
        Some(_) => "xterm-256color".into(),
        None => "dumb".into(),
    };
    let env = ctx.child_env(&term, Path::new(&argv[0]));
    // Held until the child is gone and its status sent.
    let _permit = match ctx.exec_permits.clone().try_acquire_owned() {
        Ok(p) => p,
        Err(_) => {
            let msg = format!(
                "too many concurrent execs: the limit is {} (--max-execs)",
                ctx.max_execs
            );
            tracing::warn!(?id, "exec refused: {msg}");
            return refuse(&wr, &msg, REFUSED).await;
        }
    };
    let _live = ctx.tracker.enter();
    let outcome = match pty {
        Some(p) => run_tty(&ctx, argv, env, p, &mut rd, &wr, early).await,
        None => run_piped(&ctx, (argv, program_fd), env, &mut rd, &wr, early).await,
    };
    match outcome {
        Outcome::Exited(e) => {
            tracing::debug!(code = ?e.info.code, signal = ?e.info.signal, "exec finished");
            finish(&wr, &handle, id, e).await
        }
        Outcome::Refused(msg, code) => refuse(&wr, &msg, code).await,
        Outcome::Gone => {}
    }
}

enum Outcome {
    Exited(Ended),
    Refused(String, u32),
    /// The client closed the channel or the connection; the tree has been killed.
    Gone,
}

async fn spawn_child(ctx: &ExecContext, spec: SpawnSpec) -> Result<Child, Outcome> {
    let t0 = std::time::Instant::now();
    let child = ctx.sandbox.spawn(spec).await.map_err(|e| {
        tracing::warn!("exec failed to start: {e}");
        Outcome::Refused(e.to_string(), u32::from(e.exit_code()))
    })?;
    tracing::debug!(
        pid = child.pid(),
        spawn_us = t0.elapsed().as_micros() as u64,
        "exec started"
    );
    Ok(child)
}

/// Where the exec's stdin goes.
enum Sink {
    Pipe(tokio::net::unix::pipe::Sender),
    Pty(Arc<pty::Master>),
}

impl Sink {
    async fn write(&mut self, b: &[u8]) -> io::Result<()> {
        match self {
            Sink::Pipe(p) => p.write_all(b).await,
            Sink::Pty(m) => m.write_all(b).await,
        }
    }

    async fn close(self) {
        match self {
            Sink::Pipe(p) => drop(p),
            // A terminal has no half-close: end of input is the EOF character (VEOF, ^D).
            Sink::Pty(m) => {
                let _ = m.write_all(&[4]).await;
            }
        }
    }
}

/// Stdin on its way to the child: the bytes queued and a wakeup for the channel task when
/// the feeder has made room.
struct StdinQueue {
    tx: mpsc::UnboundedSender<Bytes>,
    queued: Arc<std::sync::atomic::AtomicUsize>,
    drained: Arc<tokio::sync::Notify>,
}

impl StdinQueue {
    fn push(&self, b: Bytes) {
        self.queued
            .fetch_add(b.len(), std::sync::atomic::Ordering::SeqCst);
        let _ = self.tx.send(b);
    }

    fn queued(&self) -> usize {
        self.queued.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn full(&self) -> bool {
        self.queued() >= STDIN_QUEUE
    }
}

/// Feed the child's stdin from a queue of at most [`STDIN_QUEUE`] bytes (the channel task
/// stops reading the channel while it is full). The queue itself never blocks the sender, so
/// the SSH session loop is never made to wait on a child.
fn stdin_feeder(sink: Option<Sink>, early: Early) -> Option<StdinQueue> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
    let q = StdinQueue {
        tx,
        queued: Arc::default(),
        drained: Arc::default(),
    };
    for d in early.data {
        q.push(d);
    }
    let (queued, drained) = (q.queued.clone(), q.drained.clone());
    tokio::spawn(async move {
        let mut sink = sink;
        while let Some(b) = rx.recv().await {
            if let Some(s) = sink.as_mut()
                && s.write(&b).await.is_err()
            {
                // The child closed its stdin: what else comes is dropped, still counted
                // out so the channel task never stops reading for a queue nobody drains.
                sink = None;
            }
            queued.fetch_sub(b.len(), std::sync::atomic::Ordering::SeqCst);
            drained.notify_one();
        }
        if let Some(s) = sink {
            s.close().await;
        }
    });
    (!early.eof).then_some(q)
}

/// An output writer that says whether its last write is still waiting (see STDIN_HARD_CAP).
struct Watched<W> {
    inner: W,
    stuck: Arc<std::sync::atomic::AtomicBool>,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Watched<W> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        self.stuck
            .store(r.is_pending(), std::sync::atomic::Ordering::SeqCst);
        r
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_shutdown(cx);
        self.stuck.store(false, std::sync::atomic::Ordering::SeqCst);
        r
    }
}

fn watched<W>(inner: W, stuck: &Arc<std::sync::atomic::AtomicBool>) -> Watched<W> {
    Watched {
        inner,
        stuck: stuck.clone(),
    }
}

/// Copy until EOF; `count` adds up what was forwarded, for the exec's end record.
async fn pump<R, W>(mut r: R, mut w: W, count: &AtomicU64) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return w.flush().await;
        }
        w.write_all(&buf[..n]).await?;
        count.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// The end record of an exec (policy_plane::PolicySlot::exec_ended).
fn audit_end(ctx: &ExecContext, child: &Child, o: &Outcome, bytes: &[AtomicU64; 2]) {
    let info = match o {
        Outcome::Exited(i) => Some(i),
        _ => None,
    };
    let b = (
        bytes[0].load(Ordering::Relaxed),
        bytes[1].load(Ordering::Relaxed),
    );
    ctx.sandbox.exec_ended(child, info, Some(b));
}

async fn run_piped(
    ctx: &ExecContext,
    (argv, program_fd): (Vec<std::ffi::OsString>, Option<Arc<std::os::fd::OwnedFd>>),
    env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    rd: &mut ChannelReadHalf,
    wr: &ChannelWriteHalf<Msg>,
    early: Early,
) -> Outcome {
    let spec = SpawnSpec {
        argv,
        env,
        cwd: None,
        stdin: Stdio::Piped,
        stdout: Stdio::Piped,
        stderr: Stdio::Piped,
        controlling_tty: false,
        program_fd,
    };
    let mut child = match spawn_child(ctx, spec).await {
        Ok(c) => c,
        Err(o) => return o,
    };
    let mut in_tx = stdin_feeder(child.stdin.take().map(Sink::Pipe), early);
    let out = child.stdout.take();
    let err = child.stderr.take();
    let stuck = Arc::default();
    let (w_out, w_err) = (
        watched(wr.make_writer(), &stuck),
        watched(wr.make_writer_ext(Some(1)), &stuck),
    );
    let bytes = [AtomicU64::new(0), AtomicU64::new(0)];
    let counts = &bytes;
    let outputs = async move {
        let a = async {
            if let Some(r) = out {
                let _ = pump(r, w_out, &counts[0]).await;
            }
        };
        let b = async {
            if let Some(r) = err {
                let _ = pump(r, w_err, &counts[1]).await;
            }
        };
        tokio::join!(a, b);
    };
    let io = ChannelIo {
        rd,
        wr,
        stuck: &stuck,
    };
    let o = drive(
        ctx,
        &mut child,
        io,
        &mut in_tx,
        outputs,
        None::<fn(u32, u32)>,
    )
    .await;
    audit_end(ctx, &child, &o, &bytes);
    o
}

async fn run_tty(
    ctx: &ExecContext,
    argv: Vec<std::ffi::OsString>,
    env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    req: PtyReq,
    rd: &mut ChannelReadHalf,
    wr: &ChannelWriteHalf<Msg>,
    early: Early,
) -> Outcome {
    let (master, slave) = match pty::open(req.cols, req.rows) {
        Ok(p) => p,
        Err(e) => return Outcome::Refused(format!("cannot allocate a pty: {e}"), REFUSED),
    };
    let spec = SpawnSpec::on_terminal(argv, env, [slave.stdin, slave.stdout, slave.stderr]);
    let mut child = match spawn_child(ctx, spec).await {
        Ok(c) => c,
        Err(o) => return o,
    };
    let master = Arc::new(master);
    let mut in_tx = stdin_feeder(Some(Sink::Pty(master.clone())), early);
    let reader = master.clone();
    let stuck = Arc::default();
    let mut w = watched(wr.make_writer(), &stuck);
    let bytes = [AtomicU64::new(0), AtomicU64::new(0)];
    let counts = &bytes;
    let outputs = async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if w.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    counts[0].fetch_add(n as u64, Ordering::Relaxed);
                }
            }
        }
        let _ = w.flush().await;
    };
    let io = ChannelIo {
        rd,
        wr,
        stuck: &stuck,
    };
    let o = drive(
        ctx,
        &mut child,
        io,
        &mut in_tx,
        outputs,
        Some(move |cols, rows| {
            if let Err(e) = master.resize(cols, rows) {
                tracing::debug!("resizing the pty: {e}");
            }
        }),
    )
    .await;
    audit_end(ctx, &child, &o, &bytes);
    o
}

/// The channel as `drive` uses it: both halves, and whether an output write is waiting.
struct ChannelIo<'a> {
    rd: &'a mut ChannelReadHalf,
    wr: &'a ChannelWriteHalf<Msg>,
    stuck: &'a std::sync::atomic::AtomicBool,
}

/// Run until the child has exited and its output is fully sent, serving channel messages
/// meanwhile. `resize` is the pty's, for a child on a terminal.
async fn drive<O>(
    ctx: &ExecContext,
    child: &mut Child,
    io: ChannelIo<'_>,
    in_tx: &mut Option<StdinQueue>,
    outputs: O,
    mut resize: Option<impl FnMut(u32, u32)>,
) -> Outcome
where
    O: std::future::Future<Output = ()>,
{
    tokio::pin!(outputs);
    let ChannelIo { rd, wr, stuck } = io;
    let mut shutdown = ctx.shutdown.clone();
    let mut exit: Option<ExitInfo> = None;
    let mut outputs_done = false;
    let mut unstick = false;
    loop {
        if let (Some(info), true) = (&exit, outputs_done) {
            return Outcome::Exited(Ended::new(*info));
        }
        // Backpressure: while the child has a full queue of stdin unread, leave the channel
        // unread too (see STDIN_QUEUE); a drained queue wakes us up.
        let grace = std::mem::take(&mut unstick);
        let paused = in_tx
            .as_ref()
            .filter(|q| q.full() && !grace)
            .map(|q| q.drained.clone());
        let may_unstick = in_tx.as_ref().is_some_and(|q| q.queued() < STDIN_HARD_CAP)
            && stuck.load(std::sync::atomic::Ordering::SeqCst);
        tokio::select! {
            _ = async { if let Some(d) = &paused { d.notified().await } }, if paused.is_some() => {}
            _ = tokio::time::sleep(UNSTICK), if paused.is_some() && may_unstick => {
                unstick = stuck.load(std::sync::atomic::Ordering::SeqCst)
                    && wr.writable_packet_size().await > 0;
            }
            msg = rd.wait(), if paused.is_none() => match msg {
                None | Some(ChannelMsg::Close) => {
                    if exit.is_none() {
                        tracing::info!(pid = child.pid(), "exec channel closed before the command ended; killing its process tree");
                        child.terminate_tree(Duration::ZERO).await;
                    }
                    return Outcome::Gone;
                }
                Some(ChannelMsg::Data { data }) => {
                    if let Some(q) = in_tx.as_ref() {
                        q.push(data);
                    }
                }
                Some(ChannelMsg::Eof) => *in_tx = None,
                Some(ChannelMsg::WindowChange { col_width, row_height, .. }) => {
                    if let Some(r) = resize.as_mut() {
                        r(col_width, row_height);
                    }
                }
                Some(_) => {}
            },
            info = child.wait(), if exit.is_none() => {
                // Nothing of an exec outlives it (the core kills the rest of the tree when the
                // Child is dropped anyway). Doing it now also closes the pipes a background
                // process still holds, so the output reaches EOF and the exec can finish.
                if let Err(e) = child.kill_tree().await {
                    tracing::error!(pid = child.pid(), error = %e, "containment failed: the exec's processes could not be listed");
                }
                exit = Some(info);
            }
            _ = &mut outputs, if !outputs_done => outputs_done = true,
            // An Err means the supervisor itself is being torn down: stop the child too.
            _ = stopped(&mut shutdown), if exit.is_none() => {
                tracing::info!(pid = child.pid(), "shutting down: terminating exec");
                exit = Some(stop_child(child, resize.is_some(), ctx.grace).await);
            }
        }
    }
}

fn signal_name(sig: i32) -> Sig {
    match nix::sys::signal::Signal::try_from(sig) {
        Ok(s) => match s.as_str().trim_start_matches("SIG") {
            "ABRT" => Sig::ABRT,
            "ALRM" => Sig::ALRM,
            "FPE" => Sig::FPE,
            "HUP" => Sig::HUP,
            "ILL" => Sig::ILL,
            "INT" => Sig::INT,
            "KILL" => Sig::KILL,
            "PIPE" => Sig::PIPE,
            "QUIT" => Sig::QUIT,
            "SEGV" => Sig::SEGV,
            "TERM" => Sig::TERM,
            "USR1" => Sig::USR1,
            other => Sig::Custom(other.to_owned()),
        },
        Err(_) => Sig::Custom(sig.to_string()),
    }
}

/// eof, then exit-signal for a signal death (for ordinary SSH clients), then exit-status
/// (the gateway reads only this one, so a signal is reported as 128+N), then close.
async fn finish(wr: &ChannelWriteHalf<Msg>, handle: &Handle, id: ChannelId, e: Ended) {
    let _ = wr.eof().await;
    if let Some(sig) = e.info.signal {
        let _ = handle
            .exit_signal_request(id, signal_name(sig), false, String::new(), String::new())
            .await;
    }
    let _ = wr.exit_status(e.status()).await;
    let _ = wr.close().await;
}

/// Report a refusal the way a shell would: the reason on stderr and a non-zero status. The
/// gateway does not look at the exec request's reply, so this is what its caller sees.
async fn refuse(wr: &ChannelWriteHalf<Msg>, msg: &str, code: u32) {
    let line = format!("openshell-sandbox: {msg}\n");
    let _ = wr.extended_data_bytes(1, Bytes::from(line)).await;
    let _ = wr.eof().await;
    let _ = wr.exit_status(code).await;
    let _ = wr.close().await;
}
