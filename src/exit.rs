//! The one exit-code table. Every subcommand's typed error says which kind of failure it is
//! (an [`Exit`]); only [`Exit::code`] turns a kind into a number. README.md ("Exit codes")
//! describes the same table.

/// What kind of failure ended a subcommand. The codes follow docker's and the shell's
/// conventions for a launcher, so that a script can tell them from a command's own codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// A subcommand whose answer is a verdict said no or could not finish (`check`, `check
    /// --gateway`, `install`, `certs`, `man`, a failure while serving, the hidden
    /// `sftp-server` mode that could not start serving).
    Failed,
    /// `run`'s `--timeout` ended the command (as coreutils' `timeout`).
    TimedOut,
    /// Ours: a usage error of any subcommand, a policy or a workdir we cannot keep, a sandbox
    /// that refused or failed to be set up, or processes of a run that survived the kill sweep
    /// (the sandbox failed its promise).
    Ours,
    /// The command was found but cannot be executed.
    NotExecutable,
    /// The command was not found (in the sandbox's view).
    NotFound,
}

impl Exit {
    /// The process's exit code for this kind.
    pub const fn code(self) -> u8 {
        match self {
            Exit::Failed => 1,
            Exit::TimedOut => 124,
            Exit::Ours => 125,
            Exit::NotExecutable => 126,
            Exit::NotFound => 127,
        }
    }
}
