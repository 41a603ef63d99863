//! `openshell-sandbox run`: one command under the full sandbox, output streamed live, an exit
//! code that mirrors the child's, and an exit report.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use tokio::signal::unix::{SignalKind, signal};

use super::report::{self, Context, EffectiveLimits, ExitReport, Reason};
use super::report_file::ReportFile;
use super::stream::{self, Event, StreamStats};
use super::{RunError, Sandbox, workdir};
use crate::cli::RunArgs;
use crate::exit::Exit;
use crate::policy::openshell::{self, MapWarning};
use crate::policy::{Identity, Policy, PolicyFlags};
use crate::sandbox::identity::{self, UidLease};

mod implicit_workdir;
mod scratch;
pub(crate) mod stdio;
mod streams;
mod timeline;
use scratch::Scratch;
use stdio::*;
use timeline::Timeline;

pub use super::report::TIMEOUT_EXIT;
/// Exit code when processes of the run could not be killed: the sandbox failed its promise.
pub const CONTAINMENT_FAILED_EXIT: i32 = Exit::Ours.code() as i32;
/// How long to wait for the output pipes to close after the tree was killed.
const PUMP_DRAIN: Duration = Duration::from_secs(5);
/// After our reader went away (and the child's pipe was closed), how long the command may go
/// on before its tree is stopped: a command that ignores SIGPIPE and EPIPE would otherwise run
/// to its timeout with nobody reading.
const READER_GONE_GRACE: Duration = Duration::from_secs(1);

/// A policy and what came with it.
pub struct LoadedPolicy {
    pub policy: Policy,
    /// best_effort skips and ignored keys of the policy file, for the log.
    pub warnings: Vec<MapWarning>,
    /// The policy file names the identity itself (a numeric `run_as_user`/`run_as_group`, or
    /// `sandbox` where the image has such a user): a per-run uid must not replace it.
    pub file_sets_identity: bool,
    /// The network rules (the file's `network_policies` and `--allow-net`): the sandbox's
    /// egress proxy keeps them. `None`: no rules, no proxy.
    pub network: Option<crate::policy::network::NetworkRules>,
}

/// The policy of `run` and `check`: the flags alone, or `--policy FILE` with the explicitly
/// given flags on top (docs/policy.md). A file that asks for what we cannot enforce is an
/// error naming the key.
pub fn load_policy(
    flags: &PolicyFlags,
    file: Option<&Path>,
    default_workdir: &Path,
    allow_net: &[String],
) -> Result<LoadedPolicy, RunError> {
    let Some(path) = file else {
        let policy = Policy::from_args(flags.clone(), default_workdir, Vec::new())?;
        return Ok(LoadedPolicy {
            network: super::egress::rules_for(&policy, None, allow_net)?,
            policy,
            warnings: Vec::new(),
            file_sets_identity: false,
        });
    };
    let file_err = |source| RunError::PolicyFile {
        path: path.to_path_buf(),
        source,
    };
    let text =
        std::fs::read_to_string(path).map_err(|e| file_err(openshell::YamlError::Read(e)))?;
    let model = openshell::from_yaml(&text).map_err(file_err)?;
    let host = openshell::Host::current();
    // Network rules are the egress proxy's: the mapped policy keeps the sandbox's own network
    // namespace for them (an explicit --network replaces the file's network section).
    let resolved = openshell::resolve(&model, flags, default_workdir, Vec::new(), &host).map_err(
        |source| RunError::PolicyMap {
            path: path.to_path_buf(),
            source,
        },
    )?;
    let network =
        super::egress::rules_for(&resolved.policy, resolved.proxy_rules(&model), allow_net)
            .map_err(|e| e.in_file(path))?;
    let (policy, warnings) = (resolved.policy, resolved.warnings);
    let names = |v: &str| {
        (!v.is_empty() && v != "sandbox") || (v == "sandbox" && host.sandbox_user.is_some())
    };
    let file_sets_identity = model
        .process
        .as_ref()
        .is_some_and(|p| names(&p.run_as_user) || names(&p.run_as_group));
    Ok(LoadedPolicy {
        policy,
        warnings,
        file_sets_identity,
        network,
    })
}

/// The report's reason for a command that could not be started, when that is why `e` ended
/// the run (not a failure of the sandbox itself, which writes no report).
fn not_started_reason(e: &RunError) -> Option<Reason> {
    // Read from the exit-code row, which says once which errors mean "could not start".
    match e.exit() {
        Exit::NotFound => Some(Reason::NotFound),
        Exit::NotExecutable => Some(Reason::NotExecutable),
        _ => None,
    }
}

/// Put the policy file's warnings in the log, naming the file.
pub fn log_policy_warnings(file: Option<&Path>, warnings: &[MapWarning]) {
    for w in warnings {
        let file = file.map(|p| p.display().to_string()).unwrap_or_default();
        tracing::warn!("--policy {file}: {w}");
    }
}

pub fn main(args: RunArgs) -> Result<ExitCode, RunError> {
    let mut tl = Timeline::from_env();
    tl.stamp("main");
    crate::logging::init(&args.policy.log_level, args.policy.log_format);
    tl.stamp("logging");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| RunError::Io {
            what: "starting the async runtime",
            source,
        })?;
    tl.stamp("runtime");
    let code = rt.block_on(run(args, &mut tl))?;
    drop(rt);
    tl.stamp("runtime-drop");
    tl.print();
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
        // A credential's value stays with the proxy; inheriting it would put it in the
        // command's environment (and, meanwhile, in our heap) next to its placeholder.
        if args
            .credential
            .iter()
            .any(|c| c.split_once('@').map_or(c.as_str(), |(n, _)| n) == name)
        {
            return Err(RunError::Usage(format!(
                "--inherit-env {name}: {name} is a --credential, whose value never enters the sandbox (the command gets its placeholder); drop --inherit-env {name}"
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

/// The signals `run` hands to the command's job instead of acting on them itself (docker
/// run's `--sig-proxy` set; SIGWINCH is a resize of the pty, with --tty).
const FORWARDED: [(SignalKind, &str); 6] = [
    (SignalKind::interrupt(), "installing the SIGINT handler"),
    (SignalKind::terminate(), "installing the SIGTERM handler"),
    (SignalKind::hangup(), "installing the SIGHUP handler"),
    (SignalKind::quit(), "installing the SIGQUIT handler"),
    (
        SignalKind::user_defined1(),
        "installing the SIGUSR1 handler",
    ),
    (
        SignalKind::user_defined2(),
        "installing the SIGUSR2 handler",
    ),
];

/// Our handlers of [`FORWARDED`]; [`Forwarded::next`] yields the number of each one received.
struct Forwarded(Vec<(i32, tokio::signal::unix::Signal)>);

impl Forwarded {
    fn install() -> Result<Forwarded, RunError> {
        let mut v = Vec::with_capacity(FORWARDED.len());
        for (kind, what) in FORWARDED {
            let s = signal(kind).map_err(|source| RunError::Io { what, source })?;
            v.push((kind.as_raw_value(), s));
        }
        Ok(Forwarded(v))
    }

    async fn next(&mut self) -> i32 {
        std::future::poll_fn(|cx| {
            for (sig, s) in &mut self.0 {
                if s.poll_recv(cx).is_ready() {
                    return std::task::Poll::Ready(*sig);
                }
            }
            std::task::Poll::Pending
        })
        .await
    }
}

async fn run(args: RunArgs, tl: &mut Timeline) -> Result<i32, RunError> {
    // The handlers first, before anything can be spawned: a signal that arrives between the
    // spawn and the wait must reach the command as a later one does, not kill us by its
    // default action (the tree would outlive us, and no report would be written). Tokio
    // queues a signal that arrives before the wait polls for it.
    let mut forwarded = Forwarded::install()?;
    let mut winch = if args.tty {
        Some(
            signal(SignalKind::window_change()).map_err(|source| RunError::Io {
                what: "installing the SIGWINCH handler",
                source,
            })?,
        )
    } else {
        None
    };
    let started = Instant::now();
    let started_at = std::time::SystemTime::now();
    let cwd = std::env::current_dir().map_err(|source| RunError::Io {
        what: "reading the current directory",
        source,
    })?;
    if args.flags.workdir.is_none() {
        let (home, owner_home) = (
            implicit_workdir::home_env(),
            implicit_workdir::owner_home(&cwd),
        );
        if let Some(why) = implicit_workdir::refusal(&cwd, home.as_deref(), owner_home.as_deref()) {
            return Err(RunError::Usage(why));
        }
    }
    let loaded = load_policy(
        &args.flags,
        args.policy_file.as_deref(),
        &cwd,
        &args.allow_net,
    )?;
    log_policy_warnings(args.policy_file.as_deref(), &loaded.warnings);
    let mut policy = loaded.policy;
    tl.stamp("policy");
    // Root with no --uid (or OPENSHELL_SANDBOX_UID): a uid of our own for this run. Per-uid
    // kernel budgets (inotify instances, fanotify groups, queued signals, POSIX timers,
    // RLIMIT_NPROC) are shared by every process of a uid, so with one fixed uid a run could
    // drain them for every concurrent run. Held until we return, after the last kill sweep.
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if let Some(dir) = &args.uid_lease_dir {
        identity::set_lease_dir(dir.clone());
    }
    let lease = if root
        && args.policy.uid.is_none()
        && args.policy.gid.is_none()
        && !loaded.file_sets_identity
    {
        let lease =
            UidLease::take(args.uid_range.start, args.uid_range.end).map_err(RunError::Identity)?;
        policy.set_identity(Identity {
            uid: lease.uid,
            gid: lease.uid,
        });
        Some(lease)
    } else {
        None
    };
    // What the run writes to its workdir and `--rw` grants belongs to each one's owner
    // (idmapped mounts); where they are refused, a workdir of the sandbox's uids is handed to
    // the run's uid for the run (sandbox/ownership.rs, exec/workdir).
    if root {
        policy.fs.write_as = crate::policy::WriteAs::Owner {
            hand_over: args.uid_range.start..=args.uid_range.end,
        };
    }
    // A uid named explicitly is held too, shared: no per-run run may get it meanwhile, and it
    // is refused while one has it (the same uid in two runs shares its kernel budgets).
    let _explicit_lease = match policy.identity {
        Some(id) if root && lease.is_none() => {
            UidLease::share(id.uid).map_err(RunError::Identity)?
        }
        _ => None,
    };
    let scratch = if args.scratch {
        Some(Scratch::create(policy.identity)?)
    } else {
        None
    };
    if let Some(s) = &scratch {
        policy.fs.read_write.push(s.path.clone());
    }
    let mut env = child_env(
        &args,
        &policy.fs.workdir,
        scratch.as_ref().map(|s| s.path.as_path()),
    )?;
    if loaded.network.is_some() {
        super::egress::add_child_env(&mut env);
    }
    // Credentials and the CA before the sandbox: its view shows the CA's public files.
    let plan = super::egress::plan(&args.credential, loaded.network.as_ref(), &mut policy)?;
    let limits = policy.limits.clone();
    // Who the child runs as: the switched identity when we are root, else our own.
    let (child_uid, child_gid) = match policy.identity {
        Some(id) if root => (id.uid, id.gid),
        // SAFETY: geteuid and getegid have no preconditions.
        _ => unsafe { (libc::geteuid(), libc::getegid()) },
    };
    tl.stamp("uid-scratch-env");
    // One run, one exec: its streams are made first, its init makes the view (exec/one.rs),
    // where the command gets a HOME of its own unless it was given one (scratch.rs).
    let home = scratch::home_request(&args, root, (child_uid, child_gid), scratch.as_ref());
    // The trust variables and placeholders go with the command's environment now (its init
    // may hold it from here on); where the view then shows less than planned, they are
    // replaced before the command is spawned.
    let planned_env = plan.as_ref().map(|p| p.child_env()).unwrap_or_default();
    super::egress::set_child_env(&mut env, &planned_env);
    let (spec, streams) = streams::make(&args, env)?;
    let (sandbox, mut pending) = Sandbox::new_with_exec(policy, spec, home)?;
    // The proxy listens in the sandbox's network namespace before anything runs there.
    let egress = match (loaded.network, plan) {
        (Some(rules), Some(plan)) => {
            let e = super::egress::RunEgress::start(&sandbox, rules, plan)?;
            if e.child_env() != planned_env.as_slice() {
                let unset: Vec<&str> = planned_env.iter().map(|(k, _)| k.as_str()).collect();
                if !pending.set_env(&unset, e.child_env()) {
                    return Err(RunError::Usage(
                        "the command's environment was handed to its init before the view \
                         could show the CA's files"
                            .into(),
                    ));
                }
            }
            Some(e)
        }
        _ => None,
    };
    tl.stamp("sandbox-new");
    // Every write of a run in a workdir it cannot write fails, while the report would say
    // "all layers enforced": asked as whom the kernel checks the command there (its owner
    // through an idmapped mount; after a hand-over, the run's uid), by the command itself
    // before anything of it runs.
    let check = sandbox
        .ownership()
        .workdir_writer()
        .map(|who| workdir::WritableCheck {
            who,
            chown_to: match lease {
                Some(_) => Identity {
                    uid: crate::policy::NOBODY,
                    gid: crate::policy::NOBODY,
                },
                None => who,
            },
            as_owner: Some(who) != sandbox.policy().identity,
        });
    for l in sandbox.layers() {
        tracing::info!(layer = l.layer, status = l.status.as_str(), detail = %l.detail, "sandbox layer");
    }
    tl.stamp("workdir");

    // The report's directory, opened before any sandboxed code runs, through the
    // symlink-safe walk; the report itself is written there only once the tree is dead, so
    // the child can neither forge it nor point it elsewhere (see report_file.rs).
    let report_file = match &args.report_json {
        Some(p) => {
            let fs = &sandbox.policy().fs;
            let rw: Vec<&Path> = std::iter::once(fs.workdir.as_path())
                .chain(fs.read_write.iter().map(PathBuf::as_path))
                .collect();
            Some(
                ReportFile::open(&fs.walker(), p, &rw).map_err(|source| RunError::ReportJson {
                    path: p.clone(),
                    source: Box::new(source),
                })?,
            )
        }
        None => None,
    };
    // What every report of this run says, however it ends.
    let report_of = |reason: Reason, exit_code: i32| ExitReport {
        reason,
        exit_code,
        status: None,
        signal: None,
        wall_ms: started.elapsed().as_millis() as u64,
        user_cpu_ms: 0,
        sys_cpu_ms: 0,
        peak_rss_kib: 0,
        stdout_bytes: 0,
        stderr_bytes: 0,
        stdout_truncated: false,
        stderr_truncated: false,
        cgroup_cpu_ms: None,
        contained: true,
        survivors: Vec::new(),
        containment_error: None,
        landlock_abi: sandbox.landlock_abi(),
        layers: sandbox.layers().to_vec(),
        command: args
            .command
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        uid: child_uid,
        gid: child_gid,
        limits: EffectiveLimits {
            policy: limits.clone(),
            timeout_secs: args.timeout,
            kill_grace_secs: args.kill_grace,
            max_output_bytes: args.max_output,
        },
        started_at: crate::logging::rfc3339(started_at),
        cgroup_version: report::host_cgroup_version(),
        egress: egress.as_ref().map(|e| e.counts().into()),
    };
    // A command that could not be started ends a run that got this far: it still has its
    // report. (Its child is already reaped: nothing of the run is left.)
    let not_started = |e: RunError| {
        if let (Some(file), Some(reason)) = (&report_file, not_started_reason(&e)) {
            let report = report_of(reason, i32::from(e.exit_code()));
            let json = serde_json::to_vec_pretty(&report).expect("the report serialises");
            if let Err(w) = file.write(&json) {
                tracing::warn!(error = %w, "--report-json");
            }
        }
        e
    };

    let cap = args.max_output;
    let (ev_tx, mut events) = tokio::sync::mpsc::unbounded_channel::<Event>();
    let opts = |name| stream::Options {
        cap,
        name,
        events: Some(ev_tx.clone()),
    };
    let mut child = pending.start(&sandbox, check).await.map_err(not_started)?;
    let streams::Running {
        out_task,
        err_task,
        raw_terminal,
        pty_master,
    } = streams.start(&mut child, opts)?;
    drop(ev_tx);

    tl.stamp("spawned");
    // A test sends SIGTERM here, between the spawn and the wait (see the handlers above).
    crate::pause::point("run-spawned");
    let grace = Duration::from_secs_f64(args.kill_grace);
    let timeout = args.timeout.map(Duration::from_secs_f64);
    let deadline = async {
        match timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let mut timed_out = false;
    // The tree was stopped by us for a reason the report has no name for (the reader went
    // away): the summary says so.
    let mut stopped_by_us = false;
    let kill_on_output_limit = args.on_output_limit == crate::cli::OnOutputLimit::Kill;
    let mut output_limit_kill = false;
    // (--cpu is kept by the exec cgroup's own watcher thread: see `cgroup::CpuWatch`.)
    // When the tree is stopped unless its leader exits first: after our reader went away.
    let mut stop_at: Option<tokio::time::Instant> = None;
    let far = || tokio::time::Instant::now() + Duration::from_secs(86400 * 365);
    let info = loop {
        let stop = tokio::time::sleep_until(stop_at.unwrap_or_else(far));
        tokio::select! {
            info = child.wait() => break info,
            _ = &mut deadline => {
                timed_out = true;
                break child.terminate_tree(grace).await;
            }
            // The command decides what a signal means (a Python KeyboardInterrupt handler that
            // exits 0 makes a run that exits 0); we only carry it.
            sig = forwarded.next() => {
                tracing::debug!(signal = %report::signal_name(sig), "forwarding to the command");
                child.forward_signal(sig);
            }
            Some(()) = async { winch.as_mut()?.recv().await }, if winch.is_some() => {
                if let Some(m) = &pty_master {
                    let (cols, rows) = our_winsize();
                    // The kernel sends SIGWINCH to the pty's foreground process group itself.
                    let _ = m.resize(cols, rows);
                }
            }
            Some(ev) = events.recv() => match ev {
                Event::OutputLimit if kill_on_output_limit => {
                    output_limit_kill = true;
                    child.signal_tree(libc::SIGKILL);
                    break child.wait().await;
                }
                Event::OutputLimit => {}
                // The pump closed its end of the child's pipe: the next write fails with
                // EPIPE or raises SIGPIPE. Give the command a moment to act on that.
                Event::ReaderGone => {
                    stop_at.get_or_insert_with(|| tokio::time::Instant::now() + READER_GONE_GRACE);
                }
            },
            _ = stop, if stop_at.is_some() => {
                stopped_by_us = true;
                break child.terminate_tree(grace).await;
            }
        }
    };
    tl.stamp("exited");
    // Whatever the command left behind dies with it; that also closes pipes held by
    // descendants, so the pumps below reach EOF.
    // A sweep that cannot list the exec's processes has not contained it: keep why.
    let mut containment_error = None;
    let mut survivors = match child.kill_tree().await {
        Ok(left) => left,
        Err(e) => {
            containment_error.get_or_insert(e.to_string());
            Vec::new()
        }
    };
    let cgroup_memory_hit = child.hit_memory_limit();
    let pids_limit_hit = child.cgroup().is_some_and(|c| c.pids_max_hits() > 0);
    let cpu_limit_hit = child.cgroup().is_some_and(|c| c.cpu_limit_hit());
    let cgroup_cpu_ms = child
        .cgroup()
        .and_then(|c| c.cpu_meter())
        .and_then(|m| m.usage().ok())
        .map(|d| d.as_millis() as u64);
    // The pipes close when the last holder dies. If a process outran the sweep it may hold
    // them forever: bound the wait, then stop reading and report the containment failure.
    let drained =
        tokio::time::timeout(PUMP_DRAIN, async { (out_task.await, err_task.await) }).await;
    let join = |r: Result<std::io::Result<StreamStats>, tokio::task::JoinError>| {
        r.ok().and_then(|r| r.ok()).unwrap_or_default()
    };
    let (out, err, summary_needs_newline) = match drained {
        Ok((o, e)) => {
            let (o, e) = (join(o), join(e));
            let open = e.open_line || (o.open_line && stdout_is_stderr());
            (o, e, open)
        }
        Err(_) => {
            match child.kill_tree().await {
                Ok(left) => survivors.extend(left),
                Err(e) => {
                    containment_error.get_or_insert(e.to_string());
                }
            }
            if survivors.is_empty() {
                survivors.push(-1); // unknown holder of the pipes
            }
            // We stopped reading mid-stream: we cannot know where the last line ended.
            (StreamStats::default(), StreamStats::default(), true)
        }
    };
    drop(child);
    tl.stamp("killed-drained");
    // Our terminal is itself again before we print anything of our own.
    drop(raw_terminal);

    let cx = Context {
        timed_out,
        // No CPU meter for this exec: --cpu fell back to RLIMIT_CPU (see sandbox::prepare).
        rlimit_cpu_secs: limits.cpu_secs.filter(|_| cgroup_cpu_ms.is_none()),
        cpu_limit_hit,
        cgroup_memory_hit,
        pids_limit_hit,
        output_limit_kill,
    };
    let reason = report::classify(&info, &cx, &out, &err);
    let contained = survivors.is_empty() && containment_error.is_none();
    let timed_out = reason == Reason::Timeout;
    let exit_code = if contained {
        report::exit_code(&info, timed_out)
    } else {
        CONTAINMENT_FAILED_EXIT
    };
    let report = ExitReport {
        status: info.code,
        signal: info.signal,
        user_cpu_ms: info.user_cpu.as_millis() as u64,
        sys_cpu_ms: info.sys_cpu.as_millis() as u64,
        peak_rss_kib: info.max_rss_kib,
        stdout_bytes: out.bytes,
        stderr_bytes: err.bytes,
        stdout_truncated: out.truncated,
        stderr_truncated: err.truncated,
        cgroup_cpu_ms,
        contained,
        survivors,
        containment_error,
        ..report_of(reason, exit_code)
    };
    // Like bwrap, a run whose command simply ended says nothing of its own: the summary is for
    // an end the sandbox decided (a timeout, a limit, the output cap, a kill of ours), a run
    // weaker than its policy (never silently) and a containment failure; -v asks for it always.
    let degraded = report
        .layers
        .iter()
        .any(|l| l.status == crate::sandbox::Enforcement::Degraded);
    let sandbox_said = !matches!(reason, Reason::Exited | Reason::Signaled)
        || stopped_by_us
        || !contained
        || degraded;
    if !args.quiet && (args.verbose || sandbox_said) {
        // The summary starts a line of its own, so that a child's unterminated last line
        // cannot pass for (part of) it. --report-json remains the machine-readable truth.
        // Not eprintln!: after SIGHUP our stderr may be a hung-up terminal, and a failed
        // write must not turn into a panic.
        let nl = if summary_needs_newline { "\n" } else { "" };
        if crate::logging::json_enabled() {
            let _ = write!(std::io::stderr(), "{nl}");
            let extra = serde_json::json!({ "report": &report });
            crate::logging::json_line("INFO", &report.summary(), Some(extra));
        } else {
            let _ = writeln!(std::io::stderr(), "{nl}{}", report.summary());
        }
    }
    if let Some(file) = &report_file {
        let json = serde_json::to_vec_pretty(&report).expect("the report serialises");
        file.write(&json).map_err(|source| RunError::ReportWrite {
            path: file.path().to_path_buf(),
            source: Box::new(source),
        })?;
    }
    // Only now, with the report out, remove the scratch tree: on a deep or wide tree that can
    // take far longer than the run's --timeout (37 s was seen), and nothing of the run's
    // outcome may wait for it. std's remove_dir_all walks by fd and never follows a symlink.
    tl.stamp("report");
    crate::pause::point("scratch-remove");
    drop(scratch);
    drop(egress);
    // The cgroup root (and the group made ahead for a next exec) is removed here.
    drop(sandbox);
    drop(lease);
    tl.stamp("cleanup");
    Ok(exit_code)
}
