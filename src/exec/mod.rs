//! The parent side of a sandboxed exec: spawn, stream, time out, kill the tree, report.

mod fdexec;
pub mod reaper;
pub mod report;
pub mod run;
pub mod stream;
mod tree;

pub use tree::SweepError;

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::unix::pipe;
use tokio::sync::oneshot;

use crate::policy::{Policy, PolicyError};
use crate::sandbox::{self, LayerStatus, PrepareError, Prepared, cgroup::ExecCgroup};

/// Why a run could not start (or the sandbox refused). Each maps to a launcher exit code.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}: command not found")]
    NotFound(String),
    #[error("{path}: cannot execute: {source}")]
    NotExecutable { path: PathBuf, source: io::Error },
    #[error("invalid policy: {0}")]
    Policy(#[from] PolicyError),
    #[error("sandbox refused: {0}")]
    Prepare(#[from] PrepareError),
    #[error("sandbox setup failed in the child at step `{step}`: {source}")]
    ChildSetup {
        step: &'static str,
        source: io::Error,
    },
    #[error("creating the exec's cgroup: {0}")]
    Cgroup(sandbox::cgroup::CgroupError),
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: io::Error,
    },
    #[error("{0}")]
    Usage(String),
    #[error("choosing the run's uid (pass --uid to name one): {0}")]
    Identity(crate::sandbox::identity::LeaseError),
    #[error("--report-json {path}: {source}")]
    ReportJson {
        path: PathBuf,
        source: Box<crate::policy::walk::WalkError>,
    },
}

impl RunError {
    /// The launcher's exit code: 127 not found, 126 not executable, 2 invalid input,
    /// 125 the sandbox itself failed or refused.
    pub fn exit_code(&self) -> u8 {
        match self {
            RunError::NotFound(_) => 127,
            RunError::NotExecutable { .. } => 126,
            RunError::Policy(_) | RunError::Usage(_) | RunError::ReportJson { .. } => 2,
            _ => 125,
        }
    }
}

/// A prepared sandbox: every kernel object built once, cheap to clone, used for every exec.
#[derive(Clone)]
pub struct Sandbox {
    inner: Arc<Inner>,
}

struct Inner {
    policy: Policy,
    prepared: Prepared,
}

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

/// How a child ended.
#[derive(Debug, Clone, Copy)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub user_cpu: Duration,
    pub sys_cpu: Duration,
    /// Peak resident set of the child and its reaped descendants, KiB.
    pub max_rss_kib: u64,
}

impl ExitInfo {
    /// The shell's convention: the exit code, or 128 + the signal number.
    pub fn shell_code(&self) -> i32 {
        match (self.code, self.signal) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            (None, None) => 255,
        }
    }

    fn from_reaped(r: reaper::Reaped) -> Self {
        let st = r.status;
        let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
        ExitInfo {
            code: libc::WIFEXITED(st).then(|| libc::WEXITSTATUS(st)),
            signal: libc::WIFSIGNALED(st).then(|| libc::WTERMSIG(st)),
            user_cpu: tv(r.rusage.ru_utime),
            sys_cpu: tv(r.rusage.ru_stime),
            max_rss_kib: r.rusage.ru_maxrss.max(0) as u64,
        }
    }
}

/// A running sandboxed child. Dropping it while it runs kills its whole tree.
pub struct Child {
    pub stdin: Option<pipe::Sender>,
    pub stdout: Option<pipe::Receiver>,
    pub stderr: Option<pipe::Receiver>,
    pid: libc::pid_t,
    exit: Option<oneshot::Receiver<reaper::Reaped>>,
    done: Option<ExitInfo>,
    cgroup: Option<ExecCgroup>,
    supervisor_pid: libc::pid_t,
    started: Instant,
    /// The tree was killed after the leader exited; never signal by these ids again, they
    /// may be reused.
    cleaned: bool,
}

impl Sandbox {
    /// Validate the policy and build every kernel object. Fails closed: a layer that cannot be
    /// enforced is an error unless `policy.allow_degraded`.
    pub fn new(policy: Policy) -> Result<Sandbox, RunError> {
        policy.validate()?;
        let prepared = sandbox::prepare(&policy)?;
        sandbox::process::harden_supervisor().map_err(|source| RunError::Io {
            what: "becoming a child subreaper",
            source,
        })?;
        Ok(Sandbox {
            inner: Arc::new(Inner { policy, prepared }),
        })
    }

    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// A sandbox from an already prepared (possibly hand-trimmed) set of layers. For the
    /// per-layer benchmark; it skips the fail-closed checks of [`Sandbox::new`].
    #[doc(hidden)]
    pub fn from_prepared(policy: Policy, prepared: Prepared) -> Sandbox {
        Sandbox {
            inner: Arc::new(Inner { policy, prepared }),
        }
    }

    /// What each layer enforces.
    pub fn layers(&self) -> &[LayerStatus] {
        &self.inner.prepared.layers
    }

    pub fn landlock_abi(&self) -> i32 {
        self.inner.prepared.landlock_abi
    }

    /// Start one command under the sandbox.
    ///
    /// The child gets SIGKILL when the *thread* that spawned it exits (that is how the kernel's
    /// parent-death signal works), so call this from a long-lived thread: a runtime worker or
    /// the main thread, never from `spawn_blocking`, whose threads exit when idle.
    pub fn spawn(&self, spec: SpawnSpec) -> Result<Child, RunError> {
        let Some(argv0) = spec.argv.first() else {
            return Err(RunError::Usage("empty command".into()));
        };
        let cwd = spec
            .cwd
            .clone()
            .unwrap_or_else(|| self.inner.policy.fs.workdir.clone());
        if !cwd.is_dir() {
            return Err(RunError::Usage(format!(
                "working directory {} does not exist or is not a directory",
                cwd.display()
            )));
        }
        let program = match &spec.program_fd {
            // Only a name for errors and for std, which never gets to exec it (see below).
            Some(_) => PathBuf::from("/proc/self/exe"),
            None => resolve_program(argv0, &spec.env, &cwd)?,
        };
        let by_fd = match &spec.program_fd {
            Some(fd) => Some((
                fd.clone(),
                fdexec::ExecImage::new(&spec.argv, &spec.env).map_err(|source| RunError::Io {
                    what: "preparing the exec by fd",
                    source,
                })?,
            )),
            None => None,
        };
        let prepared = &self.inner.prepared;
        let cgroup = match &prepared.cgroups {
            Some(root) => Some(
                root.take_exec(&self.inner.policy.limits)
                    .map_err(RunError::Cgroup)?,
            ),
            None => None,
        };

        // A CLOEXEC pipe on which the child reports which step failed; EOF means exec worked.
        let (err_r, err_w) = cloexec_pipe()?;
        let mut cmd = std::process::Command::new(&program);
        cmd.arg0(argv0)
            .args(&spec.argv[1..])
            .env_clear()
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&cwd);
        let (stdin, stdout, stderr) =
            (to_std(spec.stdin), to_std(spec.stdout), to_std(spec.stderr));
        cmd.stdin(stdin).stdout(stdout).stderr(stderr);
        let tty = spec.controlling_tty;
        let err_fd = err_w.as_raw_fd();
        let inner = self.inner.clone();
        let cg_addr = cgroup.as_ref().map(|c| c as *const ExecCgroup as usize);
        // Runs in the forked child of a multi-threaded process: it only reads data prepared
        // before fork (`inner` and the cgroup, alive in the child's copy of our memory) and
        // makes raw syscalls. No allocation, locks or logging; io::Error::from_raw_os_error
        // does not allocate.
        let in_child = move || {
            // SAFETY: the address is of `cgroup`, alive in the parent (and so in this copy of
            // its memory) for the whole spawn.
            let cg = cg_addr.map(|a| unsafe { &*(a as *const ExecCgroup) });
            match sandbox::enforce_in_child(&inner.prepared, cg, tty) {
                // std would execvp the path next; exec the fd instead, after every layer (and
                // after std set up stdio and the cwd). Returns only on failure.
                Ok(()) => match &by_fd {
                    Some((fd, image)) => Err(image.exec(fd.as_raw_fd())),
                    None => Ok(()),
                },
                Err((step, errno)) => {
                    let e = errno.to_ne_bytes();
                    let buf = [step, 0, 0, 0, e[0], e[1], e[2], e[3]];
                    // SAFETY: writing a stack buffer to our error pipe.
                    unsafe { libc::write(err_fd, buf.as_ptr().cast(), buf.len()) };
                    Err(io::Error::from_raw_os_error(errno))
                }
            }
        };
        // SAFETY: `in_child` is async-signal-safe, as described above.
        unsafe { cmd.pre_exec(in_child) };

        let reaper = reaper::get();
        let guard = reaper.lock();
        let spawned = cmd.spawn();
        let std_child = match spawned {
            Ok(c) => c,
            Err(e) => {
                drop(guard);
                drop(err_w);
                return Err(child_error(&err_r, e, &program));
            }
        };
        let pid = std_child.id() as libc::pid_t;
        let exit = guard.register(pid);
        drop(err_w);
        drop(err_r);
        drop(cmd);
        // The child is running now; make the next exec's group while it does.
        if let Some(root) = &prepared.cgroups {
            root.make_spare(&self.inner.policy.limits);
        }

        let mut std_child = std_child;
        let stdin = std_child
            .stdin
            .take()
            .map(|s| pipe::Sender::from_owned_fd(OwnedFd::from(s)))
            .transpose();
        let stdout = std_child
            .stdout
            .take()
            .map(|s| pipe::Receiver::from_owned_fd(OwnedFd::from(s)))
            .transpose();
        let stderr = std_child
            .stderr
            .take()
            .map(|s| pipe::Receiver::from_owned_fd(OwnedFd::from(s)))
            .transpose();
        // std's Child is only a pid and pipes; dropping it neither waits nor kills.
        drop(std_child);
        let io_err = |source| RunError::Io {
            what: "registering the child's pipes",
            source,
        };
        Ok(Child {
            stdin: stdin.map_err(io_err)?,
            stdout: stdout.map_err(io_err)?,
            stderr: stderr.map_err(io_err)?,
            pid,
            exit: Some(exit),
            done: None,
            cgroup,
            supervisor_pid: prepared.supervisor_pid,
            started: Instant::now(),
            cleaned: false,
        })
    }
}

fn to_std(s: Stdio) -> std::process::Stdio {
    match s {
        Stdio::Null => std::process::Stdio::null(),
        Stdio::Piped => std::process::Stdio::piped(),
        Stdio::Fd(fd) => std::process::Stdio::from(fd),
    }
}

fn cloexec_pipe() -> Result<(OwnedFd, OwnedFd), RunError> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into our array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(RunError::Io {
            what: "creating the error pipe",
            source: io::Error::last_os_error(),
        });
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Turn a failed spawn into a precise error: a sandbox step that failed in the child (reported
/// on the error pipe), or execve's own errno.
fn child_error(err_r: &OwnedFd, e: io::Error, program: &Path) -> RunError {
    let mut buf = [0u8; 8];
    // SAFETY: reading into a stack buffer; the write end is closed, so this cannot block.
    let n = unsafe { libc::read(err_r.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n == 8 {
        let step = sandbox::STEPS
            .get(buf[0] as usize)
            .copied()
            .unwrap_or("unknown");
        let errno = i32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]);
        return RunError::ChildSetup {
            step,
            source: io::Error::from_raw_os_error(errno),
        };
    }
    match e.raw_os_error() {
        Some(libc::ENOENT) => RunError::NotFound(program.display().to_string()),
        _ => RunError::NotExecutable {
            path: program.to_path_buf(),
            source: e,
        },
    }
}

/// Find the program as the shell would: a name with a `/` is used as is, anything else is
/// searched in the child's PATH. Resolving here, before fork, gives a clear 127. A relative
/// name or PATH entry is relative to `cwd`, the directory the child will run in, not to ours:
/// `run --workdir W -- ./x.sh` means `W/x.sh` wherever `run` was started.
pub fn resolve_program(
    argv0: &OsStr,
    env: &[(OsString, OsString)],
    cwd: &Path,
) -> Result<PathBuf, RunError> {
    let name = argv0.as_bytes();
    if name.is_empty() {
        return Err(RunError::NotFound(String::new()));
    }
    if name.contains(&b'/') {
        // join keeps an absolute name as it is.
        let p = cwd.join(argv0);
        return match std::fs::metadata(&p) {
            Ok(m) if m.is_file() => Ok(p),
            Ok(_) => Err(RunError::NotExecutable {
                path: p,
                source: io::Error::from_raw_os_error(libc::EACCES),
            }),
            Err(_) => Err(RunError::NotFound(argv0.to_string_lossy().into_owned())),
        };
    }
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| OsString::from("/usr/local/bin:/usr/bin:/bin"));
    let mut found_not_exec = None;
    for dir in path.as_bytes().split(|&b| b == b':') {
        // An empty entry is the current directory, as in every shell.
        let dir = cwd.join(OsStr::from_bytes(dir));
        let cand = dir.join(argv0);
        if let Ok(m) = std::fs::metadata(&cand)
            && m.is_file()
        {
            if m.permissions().mode() & 0o111 != 0 {
                return Ok(cand);
            }
            found_not_exec.get_or_insert(cand);
        }
    }
    match found_not_exec {
        Some(p) => Err(RunError::NotExecutable {
            path: p,
            source: io::Error::from_raw_os_error(libc::EACCES),
        }),
        None => Err(RunError::NotFound(argv0.to_string_lossy().into_owned())),
    }
}

impl Child {
    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// How long ago the child was started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Wait for the child itself to exit. Cancel-safe. Its descendants may still run; see
    /// [`Child::kill_tree`].
    pub async fn wait(&mut self) -> ExitInfo {
        if let Some(d) = self.done {
            return d;
        }
        let rx = self
            .exit
            .as_mut()
            .expect("exit receiver present until done");
        let info = match rx.await {
            Ok(r) => ExitInfo::from_reaped(r),
            // The reaper never drops a sender; treat it as a kill if it somehow did.
            Err(_) => ExitInfo {
                code: None,
                signal: Some(libc::SIGKILL),
                user_cpu: Duration::ZERO,
                sys_cpu: Duration::ZERO,
                max_rss_kib: 0,
            },
        };
        self.exit = None;
        self.done = Some(info);
        info
    }

    /// Whether the child itself has exited (without waiting).
    pub fn exited(&self) -> Option<ExitInfo> {
        self.done
    }

    /// Send `sig` to every process of this exec: its process group, its cgroup when there is
    /// one, and orphans of its session re-parented to the supervisor.
    pub fn signal_tree(&self, sig: i32) {
        if self.cleaned {
            return;
        }
        // A failure here shows again in the kill sweep that follows, which reports it.
        if let Err(e) = tree::signal(
            self.pid,
            self.cgroup.as_ref(),
            self.supervisor_pid,
            sig,
            self.done.is_none(),
        ) {
            tracing::warn!(error = %e, "could not signal the exec's processes");
        }
    }

    /// SIGKILL everything of this exec that is still alive, repeatedly, until nothing is left.
    /// Returns the pids that survived about a second of that (normally none; see
    /// SECURITY.md for when a process that forks in a loop can outrun a /proc sweep), or an
    /// error when the exec's processes could not even be listed: containment failed then too.
    pub fn kill_tree(&mut self) -> Result<Vec<i32>, SweepError> {
        if self.cleaned {
            return Ok(Vec::new());
        }
        let left = tree::kill_all(
            self.pid,
            self.cgroup.as_ref(),
            self.supervisor_pid,
            self.done.is_none(),
        );
        match &left {
            Ok(l) if l.is_empty() => self.cleaned = self.done.is_some(),
            Ok(l) => tracing::warn!(pids = ?l, "processes of an exec survived the kill sweep"),
            Err(e) => {
                tracing::warn!(error = %e, "the kill sweep could not list the exec's processes")
            }
        }
        left
    }

    /// SIGTERM the whole tree, give it `grace` to exit, then SIGKILL it. Returns how the child
    /// ended.
    pub async fn terminate_tree(&mut self, grace: Duration) -> ExitInfo {
        if self.done.is_none() {
            self.signal_tree(libc::SIGTERM);
            if tokio::time::timeout(grace, self.wait()).await.is_err() {
                self.signal_tree(libc::SIGKILL);
            }
        }
        let info = self.wait().await;
        // The caller's own kill_tree() reports a failure; this one only logs it.
        let _ = self.kill_tree();
        info
    }

    /// The cgroup recorded the exec hitting its memory limit.
    pub fn hit_memory_limit(&self) -> bool {
        self.cgroup.as_ref().is_some_and(|c| c.hit_memory_limit())
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        // Nothing of an exec outlives it.
        if self.done.is_none() {
            self.signal_tree(libc::SIGKILL);
        }
        let _ = self.kill_tree();
    }
}
