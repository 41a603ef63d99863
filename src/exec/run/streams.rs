//! The command's standard streams around the sandbox: the command's ends are made first (the
//! exec's init is cloned holding them, `exec/one.rs`); what reads and writes ours starts once
//! the command has started.

use std::ffi::OsString;
use std::os::fd::OwnedFd;

use super::stdio::{
    RawTerminal, merged_pipe, our_winsize, same_open_file, start_feeding, stdin_is_dev_null,
    stdin_pipe,
};
use crate::cli::RunArgs;
use crate::exec::stream::{self, StreamStats, pump};
use crate::exec::{RunError, SpawnSpec, Stdio};

/// Our side of the command's streams, until it starts.
pub(super) struct Streams {
    ours: Ours,
    /// The write end of the command's stdin pipe, fed once it runs (none for /dev/null).
    stdin: Option<OwnedFd>,
}

enum Ours {
    /// `--tty`: the pty whose size follows our terminal's (SIGWINCH); it carries stdin,
    /// stdout and stderr.
    Tty(super::super::pty::Master),
    /// One pipe for stdout and stderr (`--merge-output`, or ours are one open file).
    Merged(OwnedFd),
    /// A pipe each (the spawn makes them).
    Piped,
}

/// What reads and writes our side while the command runs.
pub(super) struct Running {
    pub(super) out_task: tokio::task::JoinHandle<std::io::Result<StreamStats>>,
    pub(super) err_task: tokio::task::JoinHandle<std::io::Result<StreamStats>>,
    pub(super) raw_terminal: Option<RawTerminal>,
    pub(super) pty_master: Option<std::sync::Arc<super::super::pty::Master>>,
}

/// The command's spec (`argv`, `env`) with its streams, and our side of them.
pub(super) fn make(
    args: &RunArgs,
    env: Vec<(OsString, OsString)>,
) -> Result<(SpawnSpec, Streams), RunError> {
    let spec = |stdin, stdout, stderr, controlling_tty| SpawnSpec {
        argv: args.command.clone(),
        env,
        cwd: None,
        stdin,
        stdout,
        stderr,
        controlling_tty,
        program_fd: None,
    };
    let stdin = || -> Result<(Stdio, Option<OwnedFd>), RunError> {
        if stdin_is_dev_null() {
            return Ok((Stdio::Null, None));
        }
        let (r, w) = stdin_pipe()?;
        Ok((Stdio::Fd(r), Some(w)))
    };
    if args.tty {
        let (cols, rows) = our_winsize();
        let (master, slave) =
            super::super::pty::open(cols, rows).map_err(|source| RunError::Io {
                what: "allocating a pty",
                source,
            })?;
        let s = spec(
            Stdio::Fd(slave.stdin),
            Stdio::Fd(slave.stdout),
            Stdio::Fd(slave.stderr),
            true,
        );
        Ok((
            s,
            Streams {
                ours: Ours::Tty(master),
                stdin: None,
            },
        ))
    } else if args.merge_output || same_open_file(1, 2) {
        let (r, w, w2) = merged_pipe()?;
        let (i, feed) = stdin()?;
        let s = spec(i, Stdio::Fd(w), Stdio::Fd(w2), false);
        Ok((
            s,
            Streams {
                ours: Ours::Merged(r),
                stdin: feed,
            },
        ))
    } else {
        let (i, feed) = stdin()?;
        let s = spec(i, Stdio::Piped, Stdio::Piped, false);
        Ok((
            s,
            Streams {
                ours: Ours::Piped,
                stdin: feed,
            },
        ))
    }
}

impl Streams {
    /// The command runs: feed its stdin, pump its output (each pump with `opts(name)`).
    pub(super) fn start(
        self,
        child: &mut super::super::Child,
        opts: impl Fn(&'static str) -> stream::Options,
    ) -> Result<Running, RunError> {
        if let Some(w) = self.stdin {
            start_feeding(w, false)?;
        }
        match self.ours {
            Ours::Tty(master) => {
                // Raw mode only once the child runs, and undone by drop on every way out.
                let raw = RawTerminal::enter()?;
                let writer = master.dup_fd().map_err(|source| RunError::Io {
                    what: "duplicating the pty master",
                    source,
                })?;
                start_feeding(writer, true)?;
                // The pty carries stdout and stderr together: one stream, capped as stdout.
                let (mut w, r) = tokio::io::duplex(64 * 1024);
                let master = std::sync::Arc::new(master);
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
                let o = opts("stdout");
                Ok(Running {
                    out_task: tokio::spawn(
                        async move { pump(r, &mut tokio::io::stdout(), o).await },
                    ),
                    err_task: tokio::spawn(async { Ok(StreamStats::default()) }),
                    raw_terminal: raw,
                    pty_master: Some(master),
                })
            }
            Ours::Merged(r) => {
                let r = tokio::net::unix::pipe::Receiver::from_owned_fd(r).map_err(|source| {
                    RunError::Io {
                        what: "registering the merged output pipe",
                        source,
                    }
                })?;
                // One stream, capped as stdout.
                let o = opts("output");
                Ok(Running {
                    out_task: tokio::spawn(
                        async move { pump(r, &mut tokio::io::stdout(), o).await },
                    ),
                    err_task: tokio::spawn(async { Ok(StreamStats::default()) }),
                    raw_terminal: None,
                    pty_master: None,
                })
            }
            Ours::Piped => {
                let out_r = child.stdout.take().expect("stdout is piped");
                let err_r = child.stderr.take().expect("stderr is piped");
                let (o, e) = (opts("stdout"), opts("stderr"));
                Ok(Running {
                    out_task: tokio::spawn(async move {
                        pump(out_r, &mut tokio::io::stdout(), o).await
                    }),
                    err_task: tokio::spawn(async move {
                        pump(err_r, &mut tokio::io::stderr(), e).await
                    }),
                    raw_terminal: None,
                    pty_master: None,
                })
            }
        }
    }
}
