//! `run --tty`: the command on a fresh pseudo-terminal whose size follows ours, fed from our
//! stdin (with the end of input passed on as the terminal's EOF character), its output one
//! stream capped as stdout.

use std::ffi::OsString;
use std::sync::Arc;

use super::stdio::{RawTerminal, copy_stdin, our_winsize};
use crate::exec::pty::Master;
use crate::exec::stream::{self, StreamStats, pump};
use crate::exec::{Child, RunError, Sandbox, SpawnSpec, Stdio};

/// The command, started on its pty.
pub(super) struct Spawned {
    pub child: Child,
    pub master: Arc<Master>,
    /// The pump of the pty's output (stdout and stderr together) to our stdout.
    pub out_task: tokio::task::JoinHandle<std::io::Result<StreamStats>>,
    /// Our terminal, raw while the command runs; restored on drop.
    pub raw: Option<RawTerminal>,
}

/// Why the command did not start on its pty: the spawn itself (the command's own failure, for
/// the report), or our setup around it.
pub(super) enum TtyError {
    Spawn(RunError),
    Setup(RunError),
}

pub(super) async fn spawn(
    sandbox: &Sandbox,
    argv: &[OsString],
    env: Vec<(OsString, OsString)>,
    out: stream::Options,
) -> Result<Spawned, TtyError> {
    let setup = |what, source| TtyError::Setup(RunError::Io { what, source });
    let (cols, rows) = our_winsize();
    let (master, slave) =
        crate::exec::pty::open(cols, rows).map_err(|e| setup("allocating a pty", e))?;
    let child = sandbox
        .spawn(SpawnSpec {
            argv: argv.to_vec(),
            env,
            cwd: None,
            stdin: Stdio::Fd(slave.stdin),
            stdout: Stdio::Fd(slave.stdout),
            stderr: Stdio::Fd(slave.stderr),
            controlling_tty: true,
            program_fd: None,
        })
        .await
        .map_err(TtyError::Spawn)?;
    // Raw mode only once the child runs, and undone by drop on every way out.
    let raw = RawTerminal::enter().map_err(TtyError::Setup)?;
    let writer = master
        .dup_fd()
        .map_err(|e| setup("duplicating the pty master", e))?;
    std::thread::Builder::new()
        .name("stdin-feeder".into())
        .spawn(move || copy_stdin(writer, true))
        .map_err(|e| setup("starting the stdin thread", e))?;
    // The pty carries stdout and stderr together: one stream, capped as stdout.
    let (mut w, r) = tokio::io::duplex(64 * 1024);
    let master = Arc::new(master);
    let reader = master.clone();
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = reader.read(&mut buf).await {
            if w.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    });
    let out_task = tokio::spawn(async move { pump(r, &mut tokio::io::stdout(), out).await });
    Ok(Spawned {
        child,
        master,
        out_task,
        raw,
    })
}
