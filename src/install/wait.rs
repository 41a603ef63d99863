//! `install --wait`: idle as a container's PID 1 until asked to stop.
//!
//! A PID 1 gets no default signal actions, so SIGTERM must be handled explicitly or the
//! kubelet waits out the grace period and kills us. Orphans in the pod's PID namespace are
//! reparented to PID 1, so we reap them too. Signals are taken synchronously with sigwait on
//! a single-threaded process: no handler, no async-signal-safety concerns.

use std::io::Write;
use std::process::ExitCode;

use nix::errno::Errno;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};

use super::error::InstallError;

pub fn until_terminated() -> Result<ExitCode, InstallError> {
    let mut set = SigSet::empty();
    for sig in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGCHLD,
        Signal::SIGHUP,
    ] {
        set.add(sig);
    }
    set.thread_block()
        .map_err(|e| InstallError::Signals { source: e.into() })?;
    println!("waiting for SIGTERM");
    let _ = std::io::stdout().flush();
    reap();
    loop {
        match set
            .wait()
            .map_err(|e| InstallError::Signals { source: e.into() })?
        {
            Signal::SIGTERM | Signal::SIGINT => return Ok(ExitCode::SUCCESS),
            Signal::SIGCHLD => reap(),
            // SIGHUP: nothing to reload; stay up.
            _ => {}
        }
    }
}

/// Collect every exited child without blocking. SIGCHLD coalesces, so loop until none is left.
fn reap() {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(_) => return,
        }
    }
}
