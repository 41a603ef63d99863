//! `run` while its command runs, and right after: signals carried to it, its deadline, the
//! output cap, a reader that went away; then the sweep of what it left and the drain of its
//! pipes.

use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{Signal, SignalKind, signal};

use super::stdio::{our_winsize, stdout_is_stderr};
use crate::cli::RunArgs;
use crate::exec::pty::Master;
use crate::exec::report::{self, Context};
use crate::exec::stream::{Event, StreamStats};
use crate::exec::{Child, ExitInfo, RunError};
use crate::policy::Limits;

/// The signals `run` hands to the command's job instead of acting on them itself (docker
/// run's `--sig-proxy` set; SIGWINCH is a resize of the pty, with --tty).
const FORWARDED: [(SignalKind, &str); 6] = [
    (SignalKind::interrupt(), "installing the SIGINT handler"),
    (SignalKind::terminate(), "installing the SIGTERM handler"),
    (SignalKind::hangup(), "installing the SIGHUP handler"),
    (SignalKind::quit(), "installing the SIGQUIT handler"),
    (
        SignalKind::user_defined1(),
        "installing the SIGUSR1 handler",
    ),
    (
        SignalKind::user_defined2(),
        "installing the SIGUSR2 handler",
    ),
];

/// How long to wait for the output pipes to close after the tree was killed.
const PUMP_DRAIN: Duration = Duration::from_secs(5);
/// After our reader went away (and the child's pipe was closed), how long the command may go
/// on before its tree is stopped: a command that ignores SIGPIPE and EPIPE would otherwise run
/// to its timeout with nobody reading.
const READER_GONE_GRACE: Duration = Duration::from_secs(1);
/// Our handlers of [`FORWARDED`], and of SIGWINCH with --tty.
pub(super) struct Signals {
    forwarded: Forwarded,
    winch: Option<Signal>,
}

/// The handlers of [`FORWARDED`], with each one's signal number.
struct Forwarded(Vec<(i32, Signal)>);

impl Signals {
    /// Installed first, before anything can be spawned: a signal that arrives between the
    /// spawn and the wait must reach the command as a later one does, not kill us by its
    /// default action (the tree would outlive us, and no report would be written). Tokio
    /// queues a signal that arrives before the wait polls for it.
    pub fn install(tty: bool) -> Result<Signals, RunError> {
        let mut forwarded = Vec::with_capacity(FORWARDED.len());
        for (kind, what) in FORWARDED {
            let s = signal(kind).map_err(|source| RunError::Io { what, source })?;
            forwarded.push((kind.as_raw_value(), s));
        }
        let winch = if tty {
            Some(
                signal(SignalKind::window_change()).map_err(|source| RunError::Io {
                    what: "installing the SIGWINCH handler",
                    source,
                })?,
            )
        } else {
            None
        };
        Ok(Signals {
            forwarded: Forwarded(forwarded),
            winch,
        })
    }
}

impl Forwarded {
    /// The number of the next forwarded signal received.
    async fn next(&mut self) -> i32 {
        std::future::poll_fn(|cx| {
            for (sig, s) in &mut self.0 {
                if s.poll_recv(cx).is_ready() {
                    return std::task::Poll::Ready(*sig);
                }
            }
            std::task::Poll::Pending
        })
        .await
    }
}

/// How the command's wait ended.
pub(super) struct Waited {
    pub info: ExitInfo,
    pub timed_out: bool,
    /// The tree was stopped by us for a reason the report has no name for (the reader went
    /// away): the summary says so.
    pub stopped_by_us: bool,
    pub output_limit_kill: bool,
}

/// Wait for the command, carrying signals and resizes to it, until it exits or we stop it.
pub(super) async fn wait(
    args: &RunArgs,
    child: &mut Child,
    signals: &mut Signals,
    events: &mut tokio::sync::mpsc::UnboundedReceiver<Event>,
    pty_master: Option<&Arc<Master>>,
) -> Waited {
    let grace = Duration::from_secs_f64(args.kill_grace);
    let timeout = args.timeout.map(Duration::from_secs_f64);
    let deadline = async {
        match timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let (mut timed_out, mut stopped_by_us, mut output_limit_kill) = (false, false, false);
    let kill_on_output_limit = args.on_output_limit == crate::cli::OnOutputLimit::Kill;
    // (--cpu is kept by the exec cgroup's own watcher thread: see `cgroup::CpuWatch`.)
    // When the tree is stopped unless its leader exits first: after our reader went away.
    let mut stop_at: Option<tokio::time::Instant> = None;
    let far = || tokio::time::Instant::now() + Duration::from_secs(86400 * 365);
    let Signals { forwarded, winch } = signals;
    let info = loop {
        let stop = tokio::time::sleep_until(stop_at.unwrap_or_else(far));
        tokio::select! {
            info = child.wait() => break info,
            _ = &mut deadline => {
                timed_out = true;
                break child.terminate_tree(grace).await;
            }
            // The command decides what a signal means (a Python KeyboardInterrupt handler that
            // exits 0 makes a run that exits 0); we only carry it.
            sig = forwarded.next() => {
                tracing::debug!(signal = %report::signal_name(sig), "forwarding to the command");
                child.forward_signal(sig);
            }
            Some(()) = async { winch.as_mut()?.recv().await }, if winch.is_some() => {
                if let Some(m) = pty_master {
                    let (cols, rows) = our_winsize();
                    // The kernel sends SIGWINCH to the pty's foreground process group itself.
                    let _ = m.resize(cols, rows);
                }
            }
            Some(ev) = events.recv() => match ev {
                Event::OutputLimit if kill_on_output_limit => {
                    output_limit_kill = true;
                    child.signal_tree(libc::SIGKILL);
                    break child.wait().await;
                }
                Event::OutputLimit => {}
                // The pump closed its end of the child's pipe: the next write fails with
                // EPIPE or raises SIGPIPE. Give the command a moment to act on that.
                Event::ReaderGone => {
                    stop_at.get_or_insert_with(|| tokio::time::Instant::now() + READER_GONE_GRACE);
                }
            },
            _ = stop, if stop_at.is_some() => {
                stopped_by_us = true;
                break child.terminate_tree(grace).await;
            }
        }
    };
    Waited {
        info,
        timed_out,
        stopped_by_us,
        output_limit_kill,
    }
}

/// What was left once the command had exited: its survivors, its cgroup's verdicts, its
/// output's totals.
pub(super) struct Left {
    pub survivors: Vec<i32>,
    /// A sweep that could not list the exec's processes has not contained it: why.
    pub containment_error: Option<String>,
    pub cgroup_cpu_ms: Option<u64>,
    pub context: Context,
    pub out: StreamStats,
    pub err: StreamStats,
    /// Our summary must start a line of its own.
    pub summary_needs_newline: bool,
}

/// Whatever the command left behind dies with it; that also closes pipes held by descendants,
/// so the pumps reach EOF. The pipes close when the last holder dies: if a process outran the
/// sweep it may hold them forever, so the wait is bounded, then reading stops and the
/// containment failure is reported.
pub(super) async fn sweep_and_drain(
    mut child: Child,
    pumps: Pumps,
    waited: &Waited,
    limits: &Limits,
) -> Left {
    let Pumps { out_task, err_task } = pumps;
    let mut containment_error = None;
    let mut survivors = match child.kill_tree().await {
        Ok(left) => left,
        Err(e) => {
            containment_error.get_or_insert(e.to_string());
            Vec::new()
        }
    };
    let cgroup_memory_hit = child.hit_memory_limit();
    let pids_limit_hit = child.cgroup().is_some_and(|c| c.pids_max_hits() > 0);
    let cpu_limit_hit = child.cgroup().is_some_and(|c| c.cpu_limit_hit());
    let cgroup_cpu_ms = child
        .cgroup()
        .and_then(|c| c.cpu_meter())
        .and_then(|m| m.usage().ok())
        .map(|d| d.as_millis() as u64);
    let drained =
        tokio::time::timeout(PUMP_DRAIN, async { (out_task.await, err_task.await) }).await;
    let join = |r: Result<std::io::Result<StreamStats>, tokio::task::JoinError>| {
        r.ok().and_then(|r| r.ok()).unwrap_or_default()
    };
    let (out, err, summary_needs_newline) = match drained {
        Ok((o, e)) => {
            let (o, e) = (join(o), join(e));
            let open = e.open_line || (o.open_line && stdout_is_stderr());
            (o, e, open)
        }
        Err(_) => {
            match child.kill_tree().await {
                Ok(left) => survivors.extend(left),
                Err(e) => {
                    containment_error.get_or_insert(e.to_string());
                }
            }
            if survivors.is_empty() {
                survivors.push(-1); // unknown holder of the pipes
            }
            // We stopped reading mid-stream: we cannot know where the last line ended.
            (StreamStats::default(), StreamStats::default(), true)
        }
    };
    let context = Context {
        timed_out: waited.timed_out,
        // No CPU meter for this exec: --cpu fell back to RLIMIT_CPU (see sandbox::prepare).
        rlimit_cpu_secs: limits.cpu_secs.filter(|_| cgroup_cpu_ms.is_none()),
        cpu_limit_hit,
        cgroup_memory_hit,
        pids_limit_hit,
        output_limit_kill: waited.output_limit_kill,
    };
    Left {
        survivors,
        containment_error,
        cgroup_cpu_ms,
        context,
        out,
        err,
        summary_needs_newline,
    }
}

/// The output pumps of a running command.
pub(super) struct Pumps {
    pub out_task: tokio::task::JoinHandle<std::io::Result<StreamStats>>,
    pub err_task: tokio::task::JoinHandle<std::io::Result<StreamStats>>,
}
