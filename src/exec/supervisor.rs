//! [`Supervisor`]: what the supervisor process holds once and hands to every sandbox it makes
//! (its own pidfd, whether it has a controlling terminal, and the process manager), made by
//! the subcommand at its start.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, OnceLock};

use super::RunError;
use super::manager::Manager;
use crate::sandbox::child::group::{self, CommandGroup};
use crate::sys::process::ReapAll;

/// The supervisor's context, cheap to clone. One per process: [`Supervisor::new`] refuses a
/// second, because its process manager reaps every child of the process.
#[derive(Clone)]
pub struct Supervisor(Arc<Shared>);

struct Shared {
    /// The supervisor's own pidfd, inherited by every init so it can tell whether the
    /// supervisor died before the init's parent-death signal was armed. `None` where the
    /// kernel has no pidfds (the init then cannot tell).
    pidfd: Option<Arc<OwnedFd>>,
    /// Started on first use: `run`'s one exec usually needs none before its command runs.
    manager: OnceLock<Manager>,
    reap_all: ReapAll,
    /// The supervisor had a controlling terminal when it started, read once from the kernel
    /// (`group::has_controlling_terminal`). A process gets one later only as a session leader
    /// opening a terminal without O_NOCTTY; ours opens its ptys with O_NOCTTY (openpty).
    terminal: bool,
}

impl Supervisor {
    /// The process's supervisor context. An error when one was made already in this process.
    pub fn new() -> Result<Supervisor, RunError> {
        let reap_all = ReapAll::claim().ok_or_else(|| RunError::Io {
            what: "making the supervisor's context",
            source: io::Error::new(
                io::ErrorKind::AlreadyExists,
                "one exists already in this process",
            ),
        })?;
        let pidfd = crate::sys::process::pidfd_open(crate::sys::process::pid())
            .ok()
            .map(Arc::new);
        // Every fork that forgets the supervisor's memory (an exec's init, a view's helper) is
        // made through this context: where the main thread's first frame is, read before any.
        crate::sys::forget::note_main_stack();
        Ok(Supervisor(Arc::new(Shared {
            pidfd,
            manager: OnceLock::new(),
            reap_all,
            terminal: group::has_controlling_terminal(),
        })))
    }

    /// The supervisor's own pidfd, -1 without one.
    pub(super) fn pidfd(&self) -> RawFd {
        self.0.pidfd.as_ref().map_or(-1, |f| f.as_raw_fd())
    }

    /// The process manager, started on first use.
    pub fn manager(&self) -> &Manager {
        self.0
            .manager
            .get_or_init(|| Manager::start(&self.0.reap_all, self.0.pidfd.clone()))
    }

    /// How a command of ours gets its own process group: a new session when it asks for a
    /// controlling terminal (`controlling_tty`) or when we have one it must lose, else only a
    /// group (`CommandGroup::decide`).
    pub(super) fn command_group(&self, controlling_tty: bool) -> CommandGroup {
        CommandGroup::decide(controlling_tty, self.0.terminal)
    }

    /// Whether the process manager was started already (it reaps every child of ours).
    pub(super) fn manager_running(&self) -> bool {
        self.0.manager.get().is_some()
    }
}
