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

use super::command::{ExecContext, parse_command};
use super::pty;
use crate::exec::{Child, ExitInfo, SpawnSpec, Stdio};

/// Output is read in pieces of this size; the SSH window bounds what is in flight.
const CHUNK: usize = 64 * 1024;
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
    let mut early = Early::default();
    let start = loop {
        match rd.wait().await {
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
            Some(ChannelMsg::Data { data }) => early.data.push(data),
            Some(ChannelMsg::Eof) => early.eof = true,
            Some(_) => {}
        }
    };
    let argv = match start {
        Start::Exec(raw) => parse_command(&raw).and_then(|c| ctx.exec_argv(&c, login)),
        Start::Shell => ctx.shell_argv(pty.is_some()),
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
    let _live = ctx.tracker.enter();
    let outcome = match pty {
        Some(p) => run_tty(&ctx, argv, env, p, &mut rd, &wr, early).await,
        None => run_piped(&ctx, argv, env, &mut rd, &wr, early).await,
    };
    match outcome {
        Outcome::Exited(info) => {
            tracing::debug!(code = ?info.code, signal = ?info.signal, "exec finished");
            finish(&wr, &handle, id, info).await
        }
        Outcome::Refused(msg, code) => refuse(&wr, &msg, code).await,
        Outcome::Gone => {}
    }
}

enum Outcome {
    Exited(ExitInfo),
    Refused(String, u32),
    /// The client closed the channel or the connection; the tree has been killed.
    Gone,
}

/// The exit code the shell would report: the code, or 128 + the signal number.
fn shell_code(info: &ExitInfo) -> u32 {
    match (info.code, info.signal) {
        (Some(c), _) => c as u32,
        (None, Some(s)) => 128 + s as u32,
        (None, None) => 255,
    }
}

fn spawn_child(ctx: &ExecContext, spec: SpawnSpec) -> Result<Child, Outcome> {
    let t0 = std::time::Instant::now();
    let child = ctx.sandbox.spawn(spec).map_err(|e| {
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

/// Feed the child's stdin from an unbounded queue. Unbounded so that a child that writes
/// before it reads can never deadlock the SSH session loop; what the peer can queue is bounded
/// by the SSH window (and ExecSandbox sends stdin once, from a bounded request).
fn stdin_feeder(sink: Option<Sink>, early: Early) -> Option<mpsc::UnboundedSender<Bytes>> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
    for d in early.data {
        let _ = tx.send(d);
    }
    tokio::spawn(async move {
        let Some(mut sink) = sink else { return };
        while let Some(b) = rx.recv().await {
            if sink.write(&b).await.is_err() {
                // The child closed its stdin; drop whatever else comes.
                return;
            }
        }
        sink.close().await;
    });
    (!early.eof).then_some(tx)
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
    argv: Vec<std::ffi::OsString>,
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
    };
    let mut child = match spawn_child(ctx, spec) {
        Ok(c) => c,
        Err(o) => return o,
    };
    let mut in_tx = stdin_feeder(child.stdin.take().map(Sink::Pipe), early);
    let out = child.stdout.take();
    let err = child.stderr.take();
    let (w_out, w_err) = (wr.make_writer(), wr.make_writer_ext(Some(1)));
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
    let o = drive(ctx, &mut child, rd, &mut in_tx, outputs, |_, _| {}).await;
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
    let spec = SpawnSpec {
        argv,
        env,
        cwd: None,
        stdin: Stdio::Fd(slave.stdin),
        stdout: Stdio::Fd(slave.stdout),
        stderr: Stdio::Fd(slave.stderr),
        controlling_tty: true,
    };
    let mut child = match spawn_child(ctx, spec) {
        Ok(c) => c,
        Err(o) => return o,
    };
    let master = Arc::new(master);
    let mut in_tx = stdin_feeder(Some(Sink::Pty(master.clone())), early);
    let reader = master.clone();
    let mut w = wr.make_writer();
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
    let o = drive(
        ctx,
        &mut child,
        rd,
        &mut in_tx,
        outputs,
        move |cols, rows| {
            if let Err(e) = master.resize(cols, rows) {
                tracing::debug!("resizing the pty: {e}");
            }
        },
    )
    .await;
    audit_end(ctx, &child, &o, &bytes);
    o
}

/// Run until the child has exited and its output is fully sent, serving channel messages
/// meanwhile.
async fn drive<O>(
    ctx: &ExecContext,
    child: &mut Child,
    rd: &mut ChannelReadHalf,
    in_tx: &mut Option<mpsc::UnboundedSender<Bytes>>,
    outputs: O,
    mut resize: impl FnMut(u32, u32),
) -> Outcome
where
    O: std::future::Future<Output = ()>,
{
    tokio::pin!(outputs);
    let mut shutdown = ctx.shutdown.clone();
    let mut exit: Option<ExitInfo> = None;
    let mut outputs_done = false;
    loop {
        if let (Some(info), true) = (&exit, outputs_done) {
            return Outcome::Exited(*info);
        }
        tokio::select! {
            msg = rd.wait() => match msg {
                None | Some(ChannelMsg::Close) => {
                    if exit.is_none() {
                        tracing::info!(pid = child.pid(), "exec channel closed before the command ended; killing its process tree");
                        child.terminate_tree(Duration::ZERO).await;
                    }
                    return Outcome::Gone;
                }
                Some(ChannelMsg::Data { data }) => {
                    if let Some(tx) = in_tx.as_ref() {
                        let _ = tx.send(data);
                    }
                }
                Some(ChannelMsg::Eof) => *in_tx = None,
                Some(ChannelMsg::WindowChange { col_width, row_height, .. }) => resize(col_width, row_height),
                Some(_) => {}
            },
            info = child.wait(), if exit.is_none() => {
                // Nothing of an exec outlives it (the core kills the rest of the tree when the
                // Child is dropped anyway). Doing it now also closes the pipes a background
                // process still holds, so the output reaches EOF and the exec can finish.
                child.kill_tree();
                exit = Some(info);
            }
            _ = &mut outputs, if !outputs_done => outputs_done = true,
            // An Err means the supervisor itself is being torn down: stop the child too.
            _ = stopped(&mut shutdown), if exit.is_none() => {
                tracing::info!(pid = child.pid(), "shutting down: terminating exec");
                exit = Some(child.terminate_tree(ctx.grace).await);
            }
        }
    }
}

/// Resolves once shutdown begins (or the supervisor is being torn down).
pub async fn stopped(rx: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
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
async fn finish(wr: &ChannelWriteHalf<Msg>, handle: &Handle, id: ChannelId, info: ExitInfo) {
    let _ = wr.eof().await;
    if let Some(sig) = info.signal {
        let _ = handle
            .exit_signal_request(id, signal_name(sig), false, String::new(), String::new())
            .await;
    }
    let _ = wr.exit_status(shell_code(&info)).await;
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
