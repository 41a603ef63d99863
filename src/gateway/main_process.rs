//! The optional canonical main process: running it (its spec is `main_spec`), on a pty of
//! 80x24 or on three pipes, its output only in the retained log of `main_attach`; and
//! reporting its exit to the gateway (retried with backoff until the gateway says OK).

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tonic::Code;

use super::auth;
use super::channel;
use super::config::GatewayConfig;
use super::ended::Ended;
use super::exec_service::{self, ExecContext};
use super::main_attach::{CHUNK, Event, MainSession, STDIN_QUEUE};
use super::main_spec::MainProcess;
use super::stop::stopped;
use super::tokens::{self, TokenStore};
use crate::exec::pty;
use crate::exec::{SpawnSpec, Stdio};
use crate::proto::v1::ReportMainProcessExitRequest;

/// The built-in default main process, and what the gateway puts in the spec when a sandbox is
/// created with no command.
pub const DEFAULT_COMMAND: [&str; 2] = ["/bin/bash", "-l"];

/// The pty size before any attacher sends one (OpenShell's `openpty` call).
const PTY_COLS: u32 = 80;
const PTY_ROWS: u32 = 24;
/// How long output readers get to reach EOF after the process ended.
const DRAIN: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("allocating the main process pty: {0}")]
    Pty(#[source] std::io::Error),
    #[error("connecting the main process to our stdin: {0}")]
    Stdin(#[source] crate::exec::RunError),
    #[error("starting the main process {argv:?}: {source}")]
    Spawn {
        argv: Vec<OsString>,
        #[source]
        source: Box<crate::gateway::policy_slot::SpawnError>,
    },
}

/// The login shell for the default command on this image, picked as OpenShell's own
/// supervisor picks it: `/bin/bash` when it is executable, else `$SHELL` (an absolute path) when it is,
/// else `bash` on `path`, else `/bin/sh`. `is_exec` is the check, passed in so the order is
/// testable without building images.
pub fn login_shell(
    shell_env: Option<&OsStr>,
    path: &str,
    is_exec: impl Fn(&Path) -> bool,
) -> PathBuf {
    let bash = Path::new(DEFAULT_COMMAND[0]);
    if is_exec(bash) {
        return bash.to_path_buf();
    }
    if let Some(s) = shell_env.map(Path::new)
        && s.is_absolute()
        && is_exec(s)
    {
        return s.to_path_buf();
    }
    path.split(':')
        .filter(|d| d.starts_with('/'))
        .map(|d| Path::new(d).join("bash"))
        .find(|p| is_exec(p))
        .unwrap_or_else(|| PathBuf::from("/bin/sh"))
}

/// The default command with its shell replaced by [`login_shell`] where `/bin/bash` is missing.
/// Any other command is returned as it is: only the default is ever rewritten. (A spec that
/// names `/bin/bash -l` is the default too: the gateway writes exactly that for a sandbox
/// created with no command, so the two cannot be told apart.)
pub fn remap_default(argv: &[OsString], shell: &Path) -> Vec<OsString> {
    let is_default = argv.len() == DEFAULT_COMMAND.len()
        && argv.iter().zip(DEFAULT_COMMAND).all(|(a, d)| a == d);
    if !is_default || shell == Path::new(DEFAULT_COMMAND[0]) {
        return argv.to_vec();
    }
    vec![shell.as_os_str().to_owned(), DEFAULT_COMMAND[1].into()]
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The started main process: what attachers use, and the task that ends with its exit.
pub struct Running {
    pub session: Arc<MainSession>,
    pub task: tokio::task::JoinHandle<Ended>,
}

/// Where the main process's stdin goes. It is never closed while the supervisor runs: an
/// attach, a detach or an eof leaves it open.
enum Sink {
    Pipe(tokio::net::unix::pipe::Sender),
    Pty(Arc<pty::Master>),
}

/// Start the main process in the sandbox: on a pty of 80x24 (the slave as fd 0, 1 and 2 and
/// its controlling terminal) when it asks for a tty, else on three pipes. Its output goes to
/// the session's retained log, and with `local` (`--no-gateway`: nobody can attach) also to
/// our stdout and stderr, with our stdin as its input (its end passed on). The task ends with
/// its exit: on its own, at the `--timeout` (exit 124), or terminated at shutdown; the exit
/// event is in the log before the task ends.
pub async fn start(
    ctx: &Arc<ExecContext>,
    m: &MainProcess,
    timeout: Option<Duration>,
    stop: watch::Receiver<bool>,
    local: bool,
) -> Result<Running, StartError> {
    let shell = login_shell(
        std::env::var_os("SHELL").as_deref(),
        &ctx.path,
        is_executable,
    );
    let argv = remap_default(&m.argv, &shell);
    if argv != m.argv {
        tracing::info!(
            "{} is not executable on this image; the default main process uses {}",
            DEFAULT_COMMAND[0],
            shell.display()
        );
    }
    let term = if m.tty { "xterm-256color" } else { "dumb" };
    let env = ctx.child_env(term, &shell);
    let (master, spec) = spawn_spec(m.tty, argv.clone(), env, local)?;
    let mut child = ctx
        .sandbox
        .spawn(spec)
        .await
        .map_err(|source| StartError::Spawn {
            argv: argv.clone(),
            source: Box::new(source),
        })?;
    tracing::info!(
        pid = child.pid(),
        ?argv,
        tty = m.tty,
        "main process started"
    );

    let (in_tx, in_rx) = mpsc::channel(STDIN_QUEUE);
    let (sig_tx, sig_rx) = mpsc::unbounded_channel();
    let session = MainSession::new(in_tx, master.clone(), sig_tx);
    let (readers, sink) = pump_output(&mut child, master.as_ref(), &session, local)?;
    tokio::spawn(feed_stdin(sink, in_rx));
    let watch = Watch {
        timeout,
        stop,
        grace: ctx.grace,
        on_pty: m.tty,
        readers,
        session: session.clone(),
        slot: ctx.sandbox.clone(),
    };
    let task = tokio::spawn(watch.run(child, sig_rx));
    Ok(Running { session, task })
}

/// The main process's spawn: on a pty whose slave is its fd 0, 1 and 2 and its controlling
/// terminal, or on pipes (with `local`, our own stdin is its input).
fn spawn_spec(
    tty: bool,
    argv: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    local: bool,
) -> Result<(Option<Arc<pty::Master>>, SpawnSpec), StartError> {
    if tty {
        let (master, slave) = pty::open(PTY_COLS, PTY_ROWS).map_err(StartError::Pty)?;
        let spec = SpawnSpec::on_terminal(argv, env, [slave.stdin, slave.stdout, slave.stderr]);
        return Ok((Some(Arc::new(master)), spec));
    }
    let stdin = match local {
        false => Stdio::Piped,
        true if crate::exec::run::stdio::stdin_is_dev_null() => Stdio::Null,
        true => Stdio::Fd(crate::exec::run::stdio::feed_stdin().map_err(StartError::Stdin)?),
    };
    let spec = SpawnSpec {
        argv,
        env,
        cwd: None,
        stdin,
        stdout: Stdio::Piped,
        stderr: Stdio::Piped,
        controlling_tty: false,
        program_fd: None,
    };
    Ok((None, spec))
}

/// The tasks that carry the main process's output to the session's log (and with `local` to
/// our own streams), and where its input goes.
fn pump_output(
    child: &mut crate::exec::Child,
    master: Option<&Arc<pty::Master>>,
    session: &Arc<MainSession>,
    local: bool,
) -> Result<(Vec<tokio::task::JoinHandle<()>>, Option<Sink>), StartError> {
    let mut readers = Vec::new();
    if let Some(m) = master {
        let (r, s) = (m.clone(), session.clone());
        readers.push(tokio::spawn(async move {
            let mut buf = vec![0u8; CHUNK];
            // Ok(0) is EIO: every slave descriptor is closed.
            while let Ok(n @ 1..) = r.read(&mut buf).await {
                if local {
                    echo(&mut tokio::io::stdout(), &buf[..n]).await;
                }
                s.push(Event::Stdout(Bytes::copy_from_slice(&buf[..n])));
            }
        }));
        if local {
            let writer = m.dup_fd().map_err(StartError::Pty)?;
            std::thread::Builder::new()
                .name("stdin-feeder".into())
                .spawn(move || crate::exec::run::stdio::copy_stdin(writer, true))
                .map_err(StartError::Pty)?;
        }
        return Ok((readers, Some(Sink::Pty(m.clone()))));
    }
    for (pipe, err) in [(child.stdout.take(), false), (child.stderr.take(), true)] {
        let (Some(mut pipe), s) = (pipe, session.clone()) else {
            continue;
        };
        readers.push(tokio::spawn(async move {
            let mut buf = vec![0u8; CHUNK];
            while let Ok(n @ 1..) = pipe.read(&mut buf).await {
                match (local, err) {
                    (true, false) => echo(&mut tokio::io::stdout(), &buf[..n]).await,
                    (true, true) => echo(&mut tokio::io::stderr(), &buf[..n]).await,
                    (false, _) => {}
                }
                let b = Bytes::copy_from_slice(&buf[..n]);
                s.push(if err {
                    Event::Stderr(b)
                } else {
                    Event::Stdout(b)
                });
            }
        }));
    }
    Ok((readers, child.stdin.take().map(Sink::Pipe)))
}

/// What watches the running main process until it ends.
struct Watch {
    timeout: Option<Duration>,
    stop: watch::Receiver<bool>,
    grace: Duration,
    on_pty: bool,
    readers: Vec<tokio::task::JoinHandle<()>>,
    session: Arc<MainSession>,
    slot: Arc<crate::gateway::policy_plane::PolicySlot>,
}

impl Watch {
    /// Until the main process exits, carrying the session's signals to it; at the
    /// `--timeout` or the supervisor's stop it is ended by us. Then its output is drained
    /// (bounded), its tree swept, and its exit published to attachers.
    async fn run(
        self,
        mut child: crate::exec::Child,
        mut sig_rx: mpsc::UnboundedReceiver<i32>,
    ) -> Ended {
        let Watch {
            timeout,
            mut stop,
            grace,
            on_pty,
            readers,
            session,
            slot,
        } = self;
        let deadline = async {
            match timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(deadline);
        let ended = loop {
            tokio::select! {
                // First, so a signal request is never taken for a child that has exited.
                biased;
                info = child.wait() => break Ended::new(info),
                // The sandbox core's signal for "this exec": the child leads its own process
                // group (and its own session on a pty), so that group is always included (and
                // it never signals ids it no longer owns).
                Some(sig) = sig_rx.recv() => child.signal_tree(sig),
                _ = &mut deadline => {
                    tracing::warn!("main process hit --timeout; terminating");
                    let info = child.terminate_tree(Duration::from_millis(100)).await;
                    break Ended { info, timed_out: true };
                }
                // On a pty, SIGHUP first: a login shell there ignores SIGTERM.
                _ = stopped(&mut stop) => break Ended::new(exec_service::stop_child(&mut child, on_pty, grace).await),
            }
        };
        // let the readers reach EOF (bounded), then publish the exit to attachers.
        let aborts: Vec<_> = readers.iter().map(|r| r.abort_handle()).collect();
        if tokio::time::timeout(DRAIN, futures::future::join_all(readers))
            .await
            .is_err()
        {
            tracing::debug!("main process output still open {DRAIN:?} after it exited");
        }
        if let Err(e) = child.kill_tree().await {
            tracing::error!(error = %e, "containment failed: the main process's tree could not be swept");
        }
        // The end record (OCSF process terminate); its output went to attachers, not counted.
        slot.exec_ended(&child, Some(&ended), None);
        aborts.iter().for_each(|a| a.abort());
        session.push(Event::Exit(ended.code()));
        ended
    }
}

/// A copy of the main process's output on our own stream (`--no-gateway`). A stream of ours
/// that fails (a closed pipe) is no reason to stop the main process: its output still goes to
/// the log.
async fn echo(w: &mut (impl tokio::io::AsyncWrite + Unpin), data: &[u8]) {
    if w.write_all(data).await.is_ok() {
        let _ = w.flush().await;
    }
}

async fn feed_stdin(mut sink: Option<Sink>, mut rx: mpsc::Receiver<Bytes>) {
    while let Some(b) = rx.recv().await {
        let ok = match sink.as_mut() {
            Some(Sink::Pipe(p)) => p.write_all(&b).await.is_ok(),
            Some(Sink::Pty(m)) => m.write_all(&b).await.is_ok(),
            None => true,
        };
        if !ok {
            // The process closed its stdin; later input is dropped.
            sink = None;
        }
    }
}

/// Report the main process's exit: a new channel per attempt, backoff 250 ms
/// doubling to 2 s, until the gateway answers OK. A gateway older than v0.0.111 has no such
/// method; that is logged and the report is dropped.
pub async fn report_exit(
    cfg: &GatewayConfig,
    tokens: &Arc<TokenStore>,
    instance_id: &str,
    exit_code: i32,
) {
    let mut delay = Duration::from_millis(250);
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        match report_once(cfg, tokens, instance_id, exit_code).await {
            Ok(()) => {
                tracing::info!(
                    exit_code,
                    attempt,
                    "main process exit reported to the gateway"
                );
                return;
            }
            Err(ReportError::Status(s)) if s.code() == Code::Unimplemented => {
                tracing::warn!(
                    "the gateway has no ReportMainProcessExit (it predates v0.0.111); exit {exit_code} not reported"
                );
                return;
            }
            Err(e) => {
                tracing::warn!(
                    attempt,
                    "reporting the main process exit failed, retrying in {delay:?}: {e}"
                )
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

#[derive(Debug, thiserror::Error)]
enum ReportError {
    #[error(transparent)]
    Connect(#[from] channel::ConnectError),
    #[error(transparent)]
    Token(#[from] tokens::TokenError),
    #[error("ReportMainProcessExit: {0}")]
    Status(tonic::Status),
}

async fn report_once(
    cfg: &GatewayConfig,
    tokens: &Arc<TokenStore>,
    instance_id: &str,
    exit_code: i32,
) -> Result<(), ReportError> {
    let ch = channel::connect(cfg).await?;
    auth::ensure_token(tokens, &ch).await?;
    let mut client = channel::client(ch, tokens);
    client
        .report_main_process_exit(ReportMainProcessExitRequest {
            sandbox_id: cfg.sandbox_id.clone(),
            instance_id: instance_id.to_owned(),
            exit_code,
        })
        .await
        .map_err(ReportError::Status)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn login_shell_falls_back_shell_then_bash_on_path_then_sh() {
        let only =
            |ok: &'static [&'static str]| move |p: &Path| ok.iter().any(|o| Path::new(o) == p);
        let sh = |env: Option<&str>, path: &str, ok: &'static [&'static str]| {
            login_shell(env.map(OsStr::new), path, only(ok))
        };
        let all = &["/bin/bash", "/bin/zsh", "/usr/local/bin/bash"][..];
        assert_eq!(
            sh(Some("/bin/zsh"), "/usr/local/bin", all),
            Path::new("/bin/bash")
        );
        let no_bin_bash = &["/bin/zsh", "/usr/local/bin/bash"][..];
        assert_eq!(
            sh(Some("/bin/zsh"), "/usr/local/bin", no_bin_bash),
            Path::new("/bin/zsh")
        );
        // A relative or missing $SHELL is skipped.
        assert_eq!(
            sh(Some("zsh"), "/usr/local/bin", no_bin_bash),
            Path::new("/usr/local/bin/bash")
        );
        assert_eq!(
            sh(Some("/bin/fish"), "/usr/local/bin", no_bin_bash),
            Path::new("/usr/local/bin/bash")
        );
        assert_eq!(sh(None, "/usr/bin:/bin", &[]), Path::new("/bin/sh"));
    }

    #[test]
    fn only_the_default_command_is_remapped() {
        let os = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        let sh = Path::new("/bin/sh");
        assert_eq!(
            remap_default(&os(&DEFAULT_COMMAND), sh),
            os(&["/bin/sh", "-l"])
        );
        assert_eq!(
            remap_default(&os(&DEFAULT_COMMAND), Path::new("/bin/bash")),
            os(&DEFAULT_COMMAND)
        );
        assert_eq!(remap_default(&os(&["/bin/bash"]), sh), os(&["/bin/bash"]));
        assert_eq!(
            remap_default(&os(&["/bin/bash", "-c", "x"]), sh),
            os(&["/bin/bash", "-c", "x"])
        );
    }
}
