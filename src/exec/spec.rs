//! [`SpawnSpec`]: one command to start under a sandbox, and how its stdio is connected.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

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
    /// Make the child's stdin (a pty slave) its controlling terminal.
    pub controlling_tty: bool,
    /// Exec this fd (execveat AT_EMPTY_PATH) instead of looking argv[0] up: for our own
    /// binary, which the sandbox may not open by path. argv[0] is then only the name.
    pub program_fd: Option<Arc<OwnedFd>>,
}

impl SpawnSpec {
    /// `argv` with `env` on a terminal: the slave's three descriptors as stdin, stdout and
    /// stderr, the slave its controlling terminal, in the policy's workdir.
    pub fn on_terminal(
        argv: Vec<OsString>,
        env: Vec<(OsString, OsString)>,
        [stdin, stdout, stderr]: [OwnedFd; 3],
    ) -> SpawnSpec {
        SpawnSpec {
            argv,
            env,
            cwd: None,
            stdin: Stdio::Fd(stdin),
            stdout: Stdio::Fd(stdout),
            stderr: Stdio::Fd(stderr),
            controlling_tty: true,
            program_fd: None,
        }
    }
}
