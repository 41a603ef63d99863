//! What the process manager (`manager.rs`) shares with the rest of `exec`: the status of a
//! reaped child, and the set of pids that are the main process of a running exec (so the
//! degraded kill sweep of `tree.rs` does not mistake another exec's leader for an orphan).
//!
//! Reaping itself happens only on the manager thread, which also forks: a child can never be
//! reaped before it is registered, because both happen on that one thread.

use std::collections::HashSet;
use std::sync::Mutex;

/// Status and resource usage of a reaped child.
#[derive(Debug, Clone, Copy)]
pub struct Reaped {
    pub status: i32,
    pub rusage: libc::rusage,
}

/// The pids of running execs' main processes. The manager owns it (and hands it to the thread
/// it runs on and to `tree.rs`'s sweeps); nothing reaches it through a global.
#[derive(Default)]
pub struct Registry {
    pids: Mutex<HashSet<libc::pid_t>>,
}

impl Registry {
    pub(super) fn insert(&self, pid: libc::pid_t) {
        self.pids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pid);
    }

    pub(super) fn remove(&self, pid: libc::pid_t) {
        self.pids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&pid);
    }

    /// Whether `pid` is the main process of a running exec (not an orphan).
    pub fn is_exec(&self, pid: libc::pid_t) -> bool {
        self.pids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&pid)
    }
}
