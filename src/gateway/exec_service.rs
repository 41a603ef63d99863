//! The one exec service behind every way the gateway runs something in the sandbox: SSH
//! `exec` and `shell` channels, the `sftp` subsystem (our own binary as an exec), the
//! canonical main process, and `direct-tcpip` forwards (which connect inside the sandbox's
//! network view). `ssh/` only maps the protocol onto this.
//!
//! - What an exec runs: the command string check, the shell that runs it, and the child's
//!   environment (cleared, a safe base, then the user
//!   environment minus OPENSHELL_* keys; never a supervisor secret).
//! - [`ExecContext`]: what every exec needs from the supervisor, shared by all of them.
//! - [`Tracker`]: shutdown waits for live execs (`stop::stopped` tells them to stop).

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, watch};

use crate::exec::ExitInfo;
use crate::gateway::config::ShellMode;

/// The gateway refuses command strings above 256 KiB; so do we.
pub const MAX_COMMAND: usize = 256 * 1024;

/// PATH for children when the supervisor has none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CommandError {
    #[error("the command is {0} bytes; the limit is {MAX_COMMAND}")]
    TooLong(usize),
    #[error("the command contains a NUL byte at offset {0}")]
    Nul(usize),
    #[error("the command is empty")]
    Empty,
    #[error("no shell found: neither bash nor sh is on PATH ({0})")]
    NoShell(String),
}

/// Decode an exec request's command: lossy UTF-8 and trimmed, like the real server; NUL and
/// over-long strings are refused because they cannot be a valid shell command.
pub fn parse_command(raw: &[u8]) -> Result<String, CommandError> {
    if raw.len() > MAX_COMMAND {
        return Err(CommandError::TooLong(raw.len()));
    }
    if let Some(at) = raw.iter().position(|b| *b == 0) {
        return Err(CommandError::Nul(at));
    }
    let s = String::from_utf8_lossy(raw).trim().to_owned();
    if s.is_empty() {
        return Err(CommandError::Empty);
    }
    Ok(s)
}

/// The longest a pty exec is given between SIGHUP and SIGTERM at shutdown.
const HANGUP_WAIT: Duration = Duration::from_secs(1);

/// The signals that end an exec at shutdown, in order, each with how long to wait for it
/// before the next; SIGKILL follows the last, and the waits add up to `grace`. On a terminal
/// the first is SIGHUP, as a hang-up delivers it: an interactive shell ignores SIGTERM (so it
/// would sit out the whole grace) but exits on SIGHUP and passes it on to its jobs. What
/// survives the hang-up gets SIGTERM for the rest of the grace. Without a terminal, SIGTERM.
pub fn stop_signals(on_pty: bool, grace: Duration) -> Vec<(i32, Duration)> {
    if on_pty {
        let hup = HANGUP_WAIT.min(grace / 2);
        vec![(libc::SIGHUP, hup), (libc::SIGTERM, grace - hup)]
    } else {
        vec![(libc::SIGTERM, grace)]
    }
}

/// End an exec's whole tree at shutdown by [`stop_signals`], then SIGKILL; sweep what is left.
/// Returns how the child ended.
pub async fn stop_child(child: &mut crate::exec::Child, on_pty: bool, grace: Duration) -> ExitInfo {
    for (sig, wait) in stop_signals(on_pty, grace) {
        if child.exited().is_some() {
            break;
        }
        child.signal_tree(sig);
        if tokio::time::timeout(wait, child.wait()).await.is_ok() {
            break;
        }
    }
    if child.exited().is_none() {
        child.signal_tree(libc::SIGKILL);
    }
    let info = child.wait().await;
    // The rest of the tree; the caller's own kill_tree() reports a failure.
    let _ = child.kill_tree().await;
    info
}

/// Counts execs with a live child, so shutdown can wait for them to be terminated.
#[derive(Default)]
pub struct Tracker {
    live: AtomicUsize,
    idle: Notify,
}

pub struct TrackGuard(Arc<Tracker>);

impl Tracker {
    pub fn enter(self: &Arc<Self>) -> TrackGuard {
        self.live.fetch_add(1, Ordering::SeqCst);
        TrackGuard(self.clone())
    }

    /// Wait until no exec has a live child.
    pub async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.live.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for TrackGuard {
    fn drop(&mut self) {
        if self.0.live.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Everything an exec needs from the supervisor.
pub struct ExecContext {
    /// The current policy revision's sandbox (swapped by the policy plane).
    pub sandbox: std::sync::Arc<crate::gateway::policy_plane::PolicySlot>,
    pub shell: ShellMode,
    /// OPENSHELL_USER_ENVIRONMENT, already without OPENSHELL_* keys.
    pub user_env: Vec<(String, String)>,
    pub workdir: PathBuf,
    /// PATH given to children.
    pub path: String,
    /// Turns true at shutdown: running execs are terminated.
    pub shutdown: watch::Receiver<bool>,
    /// SIGTERM to SIGKILL grace at shutdown.
    pub grace: Duration,
    pub tracker: Arc<Tracker>,
    /// One permit per session channel that runs something (exec or shell): `--max-execs`
    /// bounds execs, not relays, since one relay can carry many channels.
    pub exec_permits: Arc<tokio::sync::Semaphore>,
    pub max_execs: usize,
    /// A session channel that has sent no exec, shell or subsystem request by then is closed.
    pub request_timeout: Duration,
    /// The canonical main process once started: what the `openshell-main` subsystem attaches
    /// to. Empty when there is none.
    pub main: std::sync::OnceLock<Arc<crate::gateway::main_attach::MainSession>>,
    /// From GetSandboxProviderEnvironment, already filtered (gateway/provider_env.rs);
    /// empty until fetched.
    pub provider_env: std::sync::RwLock<Vec<(String, String)>>,
}

impl ExecContext {
    /// argv for an exec request. `login` is false when the client sent
    /// OPENSHELL_NO_LOGIN_SHELL=1.
    pub fn exec_argv(&self, command: &str, login: bool) -> Result<Vec<OsString>, CommandError> {
        let (shell, is_bash) = self.shell_path()?;
        let flag = if is_bash && login { "-lc" } else { "-c" };
        Ok(vec![shell.into_os_string(), flag.into(), command.into()])
    }

    /// argv for a `shell` request: interactive with a pty, else reading commands from stdin.
    pub fn shell_argv(&self, tty: bool) -> Result<Vec<OsString>, CommandError> {
        let (shell, is_bash) = self.shell_path()?;
        let mut argv = vec![shell.into_os_string()];
        if tty {
            argv.push("-i".into());
        }
        if is_bash && self.shell == ShellMode::Login && tty {
            argv.push("-l".into());
        }
        Ok(argv)
    }

    /// bash where the login mode wants it and it exists, else sh. Looking it up instead of
    /// hard-coding /bin/bash keeps images without bash working.
    fn shell_path(&self) -> Result<(PathBuf, bool), CommandError> {
        if self.shell == ShellMode::Login
            && let Some(p) = find_executable("bash", &self.path)
        {
            return Ok((p, true));
        }
        find_executable("sh", &self.path)
            .map(|p| (p, false))
            .ok_or_else(|| CommandError::NoShell(self.path.clone()))
    }

    /// The child's complete environment.
    pub fn child_env(&self, term: &str, shell: &Path) -> Vec<(OsString, OsString)> {
        let mut env: Vec<(String, String)> = vec![
            ("OPENSHELL_SANDBOX".into(), "1".into()),
            ("HOME".into(), self.workdir.display().to_string()),
            ("USER".into(), "sandbox".into()),
            ("SHELL".into(), shell.display().to_string()),
            ("PATH".into(), self.path.clone()),
            ("TERM".into(), term.into()),
        ];
        // the user environment (step 3), then the provider environment (step 6); a
        // later step overrides an earlier one.
        let provider = self.provider_env.read().unwrap_or_else(|e| e.into_inner());
        for (k, v) in self.user_env.iter().chain(provider.iter()) {
            if k.starts_with("OPENSHELL_") {
                continue;
            }
            env.retain(|(ek, _)| ek != k);
            env.push((k.clone(), v.clone()));
        }
        env.into_iter().map(|(k, v)| (k.into(), v.into())).collect()
    }
}

fn find_executable(name: &str, path: &str) -> Option<PathBuf> {
    path.split(':').filter(|d| !d.is_empty()).find_map(|dir| {
        let p = Path::new(dir).join(name);
        let meta = std::fs::metadata(&p).ok()?;
        (meta.is_file() && meta.permissions().mode() & 0o111 != 0).then_some(p)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminal_is_hung_up_before_sigterm_within_the_same_grace() {
        let grace = Duration::from_secs(5);
        assert_eq!(
            stop_signals(true, grace),
            vec![
                (libc::SIGHUP, Duration::from_secs(1)),
                (libc::SIGTERM, Duration::from_secs(4))
            ]
        );
        assert_eq!(stop_signals(false, grace), vec![(libc::SIGTERM, grace)]);
        // A short grace is split, never exceeded.
        let short = stop_signals(true, Duration::from_millis(600));
        assert_eq!(short[0].1 + short[1].1, Duration::from_millis(600));
        assert_eq!(stop_signals(true, Duration::ZERO)[0].1, Duration::ZERO);
    }

    #[test]
    fn commands_are_trimmed_and_checked() {
        assert_eq!(parse_command(b"  echo hi \n").unwrap(), "echo hi");
        assert_eq!(parse_command(b"echo \xff").unwrap(), "echo \u{fffd}");
        assert_eq!(parse_command(b"a\0b"), Err(CommandError::Nul(1)));
        assert_eq!(parse_command(b"   "), Err(CommandError::Empty));
        let long = vec![b'x'; MAX_COMMAND + 1];
        assert_eq!(
            parse_command(&long),
            Err(CommandError::TooLong(MAX_COMMAND + 1))
        );
        assert!(parse_command(&vec![b'x'; MAX_COMMAND]).is_ok());
    }

    #[test]
    fn executables_are_found_on_path() {
        assert!(find_executable("sh", DEFAULT_PATH).is_some());
        assert!(find_executable("no-such-program-here", DEFAULT_PATH).is_none());
        assert!(find_executable("sh", "").is_none());
    }
}
