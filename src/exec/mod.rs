//! The parent side of a sandboxed exec: spawn, stream, time out, kill the tree, report.
//! (API skeleton; the implementation lands next.)

pub mod run;

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Duration;

use crate::policy::Policy;

/// A prepared sandbox: every kernel object built once, cheap to clone, used for every exec.
#[derive(Clone)]
pub struct Sandbox {}

/// How one stdio stream of the child is connected.
pub enum Stdio {
    Null,
    Piped,
    Fd(OwnedFd),
}

/// One command to start under the sandbox.
pub struct SpawnSpec {
    /// argv; argv[0] is looked up in the PATH of `env` unless it contains a `/`.
    pub argv: Vec<OsString>,
    /// The complete environment of the child (nothing is inherited).
    pub env: Vec<(OsString, OsString)>,
    /// Working directory; the policy's workdir when `None`.
    pub cwd: Option<PathBuf>,
    pub stdin: Stdio,
    pub stdout: Stdio,
    pub stderr: Stdio,
    /// Make the child's stdin its controlling terminal (for a pty).
    pub controlling_tty: bool,
}

/// How a child ended.
#[derive(Debug, Clone)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

/// A running sandboxed child.
pub struct Child {
    pub stdin: Option<tokio::net::unix::pipe::Sender>,
    pub stdout: Option<tokio::net::unix::pipe::Receiver>,
    pub stderr: Option<tokio::net::unix::pipe::Receiver>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("placeholder")]
    Placeholder,
}

impl RunError {
    pub fn exit_code(&self) -> u8 {
        125
    }
}

impl Sandbox {
    pub fn new(_policy: Policy) -> Result<Sandbox, RunError> {
        todo!()
    }
    pub fn spawn(&self, _spec: SpawnSpec) -> Result<Child, RunError> {
        todo!()
    }
}

impl Child {
    pub fn pid(&self) -> u32 {
        todo!()
    }
    pub async fn wait(&mut self) -> ExitInfo {
        todo!()
    }
    pub async fn terminate_tree(&mut self, _grace: Duration) -> ExitInfo {
        todo!()
    }
}
