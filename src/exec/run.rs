//! `openshell-sandbox run`: one command under the full sandbox, output streamed live, an exit
//! code that mirrors the child's, and an exit report.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use super::report::{self, EffectiveLimits, ExitReport, Reason};
use super::report_file::ReportFile;
use super::stream::{self, Event};
use super::{RunError, Sandbox};
use crate::cli::RunArgs;
use crate::exit::Exit;

mod env;
mod implicit_workdir;
mod policy_load;
mod prepare;
mod scratch;
pub(crate) mod stdio;
mod streams;
mod timeline;
mod wait;
use timeline::Timeline;

pub use policy_load::{LoadedPolicy, load_policy, log_policy_warnings};

pub use super::report::TIMEOUT_EXIT;
/// Exit code when processes of the run could not be killed: the sandbox failed its promise.
pub const CONTAINMENT_FAILED_EXIT: i32 = Exit::Ours.code() as i32;

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

async fn run(args: RunArgs, tl: &mut Timeline) -> Result<i32, RunError> {
    let mut signals = wait::Signals::install(args.tty)?;
    let started = Instant::now();
    let started_at = std::time::SystemTime::now();
    let cwd = std::env::current_dir().map_err(|source| RunError::Io {
        what: "reading the current directory",
        source,
    })?;
    prepare::refuse_implicit_workdir(&args, &cwd)?;
    let (prepared, launch) = prepare::prepare(&args, &cwd, tl)?;
    let report_file = open_report_file(&args, &prepared.sandbox)?;
    // `-q` without --report-json shows no report: what only the report says is not asked of
    // the system then (the host's cgroup version, a walk of /sys/fs/cgroup on v1).
    let shown = report_file.is_some() || !args.quiet;
    // What every report of this run says, however it ends.
    let report_of = |reason: Reason, exit_code: i32| {
        let at = (started, started_at);
        base_report(&args, &prepared, at, shown, reason, exit_code)
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
    tl.spawn_begins();
    let mut child = launch
        .pending
        .start(&prepared.sandbox, launch.check)
        .await
        .map_err(not_started)?;
    tl.spawn_ended();
    let streams::Running {
        out_task,
        err_task,
        raw_terminal,
        pty_master,
    } = launch.streams.start(&mut child, opts)?;
    drop(ev_tx);

    tl.stamp("spawned");
    // The command runs: clean up after dead supervisors beside it, not before it.
    prepared.sandbox.sweep_stale_cgroups();
    tl.stamp("stale-sweep");
    // A test sends SIGTERM here, between the spawn and the wait (see `Signals::install`).
    crate::pause::point("run-spawned");
    let waited = wait::wait(
        &args,
        &mut child,
        &mut signals,
        &mut events,
        pty_master.as_ref(),
    )
    .await;
    tl.stamp("exited");
    let pumps = wait::Pumps { out_task, err_task };
    let left = wait::sweep_and_drain(child, pumps, &waited, &prepared.limits).await;
    tl.stamp("killed-drained");
    // Our terminal is itself again before we print anything of our own.
    drop(raw_terminal);

    let reason = report::classify(&waited.info, &left.context, &left.out, &left.err);
    let contained = left.survivors.is_empty() && left.containment_error.is_none();
    let exit_code = if contained {
        report::exit_code(&waited.info, reason == Reason::Timeout)
    } else {
        CONTAINMENT_FAILED_EXIT
    };
    let info = &waited.info;
    let report = ExitReport {
        status: info.code,
        signal: info.signal,
        user_cpu_ms: info.user_cpu.as_millis() as u64,
        sys_cpu_ms: info.sys_cpu.as_millis() as u64,
        peak_rss_kib: info.max_rss_kib,
        stdout_bytes: left.out.bytes,
        stderr_bytes: left.err.bytes,
        stdout_truncated: left.out.truncated,
        stderr_truncated: left.err.truncated,
        cgroup_cpu_ms: left.cgroup_cpu_ms,
        contained,
        survivors: left.survivors,
        containment_error: left.containment_error,
        ..report_of(reason, exit_code)
    };
    summarize(
        &args,
        &report,
        waited.stopped_by_us,
        left.summary_needs_newline,
    );
    if let Some(file) = &report_file {
        let json = serde_json::to_vec_pretty(&report).expect("the report serialises");
        file.write(&json).map_err(|source| RunError::ReportWrite {
            path: file.path().to_path_buf(),
            source: Box::new(source),
        })?;
    }
    // Only now, with the report out, is the scratch tree removed (Prepared::cleanup).
    tl.stamp("report");
    prepared.cleanup();
    tl.stamp("cleanup");
    Ok(exit_code)
}

/// The report's directory, opened before any sandboxed code runs, through the symlink-safe
/// walk; the report itself is written there only once the tree is dead, so the child can
/// neither forge it nor point it elsewhere (see report_file.rs).
fn open_report_file(args: &RunArgs, sandbox: &Sandbox) -> Result<Option<ReportFile>, RunError> {
    let Some(p) = &args.report_json else {
        return Ok(None);
    };
    let fs = &sandbox.policy().fs;
    let rw: Vec<&Path> = std::iter::once(fs.workdir.as_path())
        .chain(fs.read_write.iter().map(PathBuf::as_path))
        .collect();
    ReportFile::open(&fs.walker(), p, &rw)
        .map(Some)
        .map_err(|source| RunError::ReportJson {
            path: p.clone(),
            source: Box::new(source),
        })
}

/// What every report of this run says, however it ends: `reason` and `exit_code`, the
/// sandbox's layers, who ran what under which limits, and the proxy's counts so far. The
/// host's cgroup version only where the report is `shown` (else `None`).
fn base_report(
    args: &RunArgs,
    prepared: &prepare::Prepared,
    (started, started_at): (Instant, std::time::SystemTime),
    shown: bool,
    reason: Reason,
    exit_code: i32,
) -> ExitReport {
    let sandbox = &prepared.sandbox;
    ExitReport {
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
        uid: prepared.uid,
        gid: prepared.gid,
        limits: EffectiveLimits {
            policy: prepared.limits.clone(),
            timeout_secs: args.timeout,
            kill_grace_secs: args.kill_grace,
            max_output_bytes: args.max_output,
        },
        started_at: crate::logging::rfc3339(started_at),
        cgroup_version: if shown {
            report::host_cgroup_version()
        } else {
            None
        },
        egress: prepared.egress.as_ref().map(|e| e.counts().into()),
    }
}

/// Like bwrap, a run whose command simply ended says nothing of its own: the summary is for an
/// end the sandbox decided (a timeout, a limit, the output cap, a kill of ours), a run weaker
/// than its policy (never silently) and a containment failure; -v asks for it always.
fn summarize(args: &RunArgs, report: &ExitReport, stopped_by_us: bool, needs_newline: bool) {
    let degraded = report
        .layers
        .iter()
        .any(|l| l.status == crate::sandbox::Enforcement::Degraded);
    let sandbox_said = !matches!(report.reason, Reason::Exited | Reason::Signaled)
        || stopped_by_us
        || !report.contained
        || degraded;
    if args.quiet || !(args.verbose || sandbox_said) {
        return;
    }
    // The summary starts a line of its own, so that a child's unterminated last line cannot
    // pass for (part of) it. --report-json remains the machine-readable truth. Not
    // eprintln!: after SIGHUP our stderr may be a hung-up terminal, and a failed write must
    // not turn into a panic.
    let nl = if needs_newline { "\n" } else { "" };
    if crate::logging::json_enabled() {
        let _ = write!(std::io::stderr(), "{nl}");
        let extra = serde_json::json!({ "report": report });
        crate::logging::json_line("INFO", &report.summary(), Some(extra));
    } else {
        let _ = writeln!(std::io::stderr(), "{nl}{}", report.summary());
    }
}
