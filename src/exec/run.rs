//! `openshell-sandbox run`: one command under the full sandbox, output streamed live, an exit
//! code that mirrors the child's, and an exit report.

use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use tokio::signal::unix::{SignalKind, signal};

use super::report::{self, Context, ExitReport, Reason};
use super::stream::{StreamStats, pump};
use super::{RunError, Sandbox, SpawnSpec, Stdio};
use crate::cli::RunArgs;
use crate::policy::{Identity, Policy};

/// Exit code when the wall-clock limit fired, as coreutils' `timeout` uses.
pub const TIMEOUT_EXIT: i32 = 124;
/// Exit code when processes of the run could not be killed: the sandbox failed its promise.
pub const CONTAINMENT_FAILED_EXIT: i32 = 125;
/// How long to wait for the output pipes to close after the tree was killed.
const PUMP_DRAIN: Duration = Duration::from_secs(5);

pub fn main(args: RunArgs) -> anyhow::Result<ExitCode> {
    crate::logging::init(&args.policy.log_level, args.policy.log_format);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| RunError::Io {
            what: "starting the async runtime",
            source,
        })?;
    let code = rt.block_on(run(args))?;
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// Variables that must never reach the child through `--env` or `--inherit-env`.
fn is_supervisor_secret(name: &str) -> bool {
    name.starts_with("OPENSHELL_") || name == "RUST_LOG"
}

/// The child's environment: a minimal base, then `--inherit-env`, then `--env`.
fn child_env(
    args: &RunArgs,
    home: &Path,
    tmpdir: Option<&Path>,
) -> Result<Vec<(OsString, OsString)>, RunError> {
    let mut env: Vec<(OsString, OsString)> = vec![
        ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
        ("HOME".into(), home.as_os_str().to_owned()),
        ("LANG".into(), "C.UTF-8".into()),
    ];
    if let Some(t) = tmpdir {
        env.push(("TMPDIR".into(), t.as_os_str().to_owned()));
    }
    let mut set = |k: OsString, v: OsString| {
        env.retain(|(ek, _)| *ek != k);
        env.push((k, v));
    };
    for name in &args.inherit_env {
        if is_supervisor_secret(name) {
            return Err(RunError::Usage(format!(
                "--inherit-env {name}: supervisor variables never reach the sandbox"
            )));
        }
        if let Some(v) = std::env::var_os(name) {
            set(name.into(), v);
        }
    }
    for (k, v) in &args.env {
        if is_supervisor_secret(k) {
            return Err(RunError::Usage(format!(
                "--env {k}: supervisor variables never reach the sandbox"
            )));
        }
        set(k.into(), v.into());
    }
    Ok(env)
}

/// A fresh scratch directory, owned by the sandbox identity, removed on drop.
struct Scratch {
    path: PathBuf,
}

impl Scratch {
    fn create(owner: Option<Identity>) -> Result<Scratch, RunError> {
        let base = std::env::temp_dir();
        let io = |what, source| RunError::Io { what, source };
        for _ in 0..16 {
            let name = format!(
                "openshell-scratch-{}-{:016x}",
                std::process::id(),
                rand::random::<u64>()
            );
            let path = base.join(name);
            match std::fs::create_dir(&path) {
                Ok(()) => {
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))
                        .map_err(|e| io("setting scratch dir permissions", e))?;
                    if let Some(id) = owner {
                        std::os::unix::fs::chown(&path, Some(id.uid), Some(id.gid))
                            .map_err(|e| io("giving the scratch dir to the sandbox uid", e))?;
                    }
                    return Ok(Scratch { path });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io("creating the scratch dir", e)),
            }
        }
        Err(io(
            "creating the scratch dir",
            std::io::Error::from_raw_os_error(libc::EEXIST),
        ))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "could not remove the scratch dir");
        }
    }
}

fn dup_stdin() -> Result<OwnedFd, RunError> {
    std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|source| RunError::Io {
            what: "duplicating stdin",
            source,
        })
}

async fn run(args: RunArgs) -> Result<i32, RunError> {
    let started = Instant::now();
    let cwd = std::env::current_dir().map_err(|source| RunError::Io {
        what: "reading the current directory",
        source,
    })?;
    let mut policy = Policy::from_args(&args.policy, &cwd, Vec::new())?;
    let scratch = if args.scratch {
        Some(Scratch::create(policy.identity)?)
    } else {
        None
    };
    if let Some(s) = &scratch {
        policy.fs.read_write.push(s.path.clone());
    }
    let env = child_env(
        &args,
        &policy.fs.workdir,
        scratch.as_ref().map(|s| s.path.as_path()),
    )?;
    let limits = policy.limits.clone();
    let sandbox = Sandbox::new(policy)?;
    for l in sandbox.layers() {
        tracing::info!(layer = l.layer, status = ?l.status, detail = %l.detail, "sandbox layer");
    }

    let mut child = sandbox
        .spawn(SpawnSpec {
            argv: args.command.clone(),
            env,
            cwd: None,
            stdin: Stdio::Fd(dup_stdin()?),
            stdout: Stdio::Piped,
            stderr: Stdio::Piped,
            controlling_tty: false,
        })
        .await?;

    let cap = args.max_output;
    let out_r = child.stdout.take().expect("stdout is piped");
    let err_r = child.stderr.take().expect("stderr is piped");
    let out_task =
        tokio::spawn(async move { pump(out_r, &mut tokio::io::stdout(), cap, "stdout").await });
    let err_task =
        tokio::spawn(async move { pump(err_r, &mut tokio::io::stderr(), cap, "stderr").await });

    let grace = Duration::from_secs_f64(args.kill_grace);
    let timeout = args.timeout.map(Duration::from_secs_f64);
    let mut sigterm = signal(SignalKind::terminate()).map_err(|source| RunError::Io {
        what: "installing the SIGTERM handler",
        source,
    })?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|source| RunError::Io {
        what: "installing the SIGINT handler",
        source,
    })?;
    let deadline = async {
        match timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    let mut timed_out = false;
    let mut forwarded_signal = None;
    let info = tokio::select! {
        info = child.wait() => info,
        _ = deadline => {
            timed_out = true;
            child.terminate_tree(grace).await
        }
        _ = sigterm.recv() => {
            forwarded_signal = Some(libc::SIGTERM);
            child.terminate_tree(grace).await
        }
        _ = sigint.recv() => {
            forwarded_signal = Some(libc::SIGINT);
            child.terminate_tree(grace).await
        }
    };
    // Whatever the command left behind dies with it; that also closes pipes held by
    // descendants, so the pumps below reach EOF.
    let mut survivors = child.kill_tree().await;
    let cgroup_memory_hit = child.hit_memory_limit();
    // The pipes close when the last holder dies. If a process outran the sweep it may hold
    // them forever: bound the wait, then stop reading and report the containment failure.
    let drained =
        tokio::time::timeout(PUMP_DRAIN, async { (out_task.await, err_task.await) }).await;
    let join = |r: Result<std::io::Result<StreamStats>, tokio::task::JoinError>| {
        r.ok().and_then(|r| r.ok()).unwrap_or_default()
    };
    let (out, err) = match drained {
        Ok((o, e)) => (join(o), join(e)),
        Err(_) => {
            survivors.extend(child.kill_tree().await);
            if survivors.is_empty() {
                survivors.push(-1); // unknown holder of the pipes
            }
            (StreamStats::default(), StreamStats::default())
        }
    };
    drop(child);
    drop(scratch);

    let cx = Context {
        timed_out,
        cpu_limit_secs: limits.cpu_secs,
        memory_limit_bytes: limits.memory_bytes,
        cgroup_memory_hit,
    };
    let reason = report::classify(&info, &cx, &out, &err);
    let contained = survivors.is_empty();
    let exit_code = match (reason, forwarded_signal) {
        _ if !contained => CONTAINMENT_FAILED_EXIT,
        (Reason::Timeout, _) => TIMEOUT_EXIT,
        (_, Some(sig)) => 128 + sig,
        _ => info.shell_code(),
    };
    let report = ExitReport {
        reason,
        exit_code,
        status: info.code,
        signal: info.signal,
        wall_ms: started.elapsed().as_millis() as u64,
        user_cpu_ms: info.user_cpu.as_millis() as u64,
        sys_cpu_ms: info.sys_cpu.as_millis() as u64,
        peak_rss_kib: info.max_rss_kib,
        stdout_bytes: out.bytes,
        stderr_bytes: err.bytes,
        stdout_truncated: out.truncated,
        stderr_truncated: err.truncated,
        contained,
        survivors,
        landlock_abi: sandbox.landlock_abi(),
        layers: sandbox.layers().to_vec(),
    };
    if !args.quiet {
        eprintln!("{}", report.summary());
    }
    if let Some(path) = &args.report_json {
        let json = serde_json::to_vec_pretty(&report).expect("the report serialises");
        std::fs::write(path, json).map_err(|source| RunError::Io {
            what: "writing --report-json",
            source,
        })?;
    }
    Ok(exit_code)
}
