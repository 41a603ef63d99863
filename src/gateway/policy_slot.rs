//! What every exec spawns through ([`PolicySlot`]): the sandbox of the current policy
//! revision, swapped by the policy plane, or a quarantine that refuses execs. It also writes
//! each exec's OCSF launch and end records, the end one carrying the exit report.

use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use super::logpush::ocsf;
use crate::exec::{Child, ExitInfo, RunError, Sandbox, SpawnSpec};

/// What every exec spawns through: the sandbox of the current revision, or a quarantine.
pub struct PolicySlot {
    active: RwLock<Active>,
    /// Start time, program and enforced layers of each running exec, for its end record.
    running: Mutex<std::collections::HashMap<u32, Started>>,
}

#[derive(Clone)]
pub(super) enum Active {
    Ready(Sandbox),
    /// `fail_closed` after a revision that cannot be applied: every exec is refused.
    Quarantined(String),
}

struct Started {
    at: Instant,
    program: String,
    layers: String,
    limits: crate::policy::Limits,
}

/// Why an exec was not started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("the sandbox policy is quarantined (policy_validation_failure_mode fail_closed): {0}")]
    Quarantined(String),
    #[error(transparent)]
    Run(#[from] RunError),
}

impl SpawnError {
    /// As [`RunError::exit_code`]; a quarantine is the sandbox refusing (125).
    pub fn exit_code(&self) -> u8 {
        match self {
            SpawnError::Quarantined(_) => 125,
            SpawnError::Run(e) => e.exit_code(),
        }
    }
}

impl PolicySlot {
    pub fn new(sandbox: Sandbox) -> Arc<Self> {
        Self::with(Active::Ready(sandbox))
    }

    pub(super) fn with(a: Active) -> Arc<Self> {
        Arc::new(PolicySlot {
            active: RwLock::new(a),
            running: Mutex::new(Default::default()),
        })
    }

    fn get(&self) -> Active {
        self.active
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(super) fn set(&self, a: Active) {
        *self.active.write().unwrap_or_else(|p| p.into_inner()) = a;
    }

    pub(super) fn has_sandbox(&self) -> bool {
        matches!(self.get(), Active::Ready(_))
    }

    /// Start one command under the current revision's sandbox; one OCSF launch record.
    pub fn spawn(&self, spec: SpawnSpec) -> Result<Child, SpawnError> {
        let program = spec
            .argv
            .first()
            .map(|a| {
                Path::new(a)
                    .file_name()
                    .unwrap_or(a)
                    .to_string_lossy()
                    .into_owned()
            })
            .unwrap_or_default();
        let command = command_line(&spec.argv);
        let sandbox = match self.get() {
            Active::Ready(s) => s,
            Active::Quarantined(reason) => {
                ocsf::Event::process(ocsf::Activity::LAUNCH, ocsf::Severity::Medium)
                    .denied()
                    .subject(format!("{program}(0)"))
                    .detail("reason", format!("policy quarantined: {reason}"))
                    .emit();
                return Err(SpawnError::Quarantined(reason));
            }
        };
        let child = match sandbox.spawn(spec) {
            Ok(c) => c,
            Err(e) => {
                ocsf::Event::process(ocsf::Activity::LAUNCH, ocsf::Severity::Medium)
                    .failed()
                    .subject(format!("{program}(0)"))
                    .detail("reason", e.to_string())
                    .emit();
                return Err(e.into());
            }
        };
        let layers = layer_list(&sandbox);
        ocsf::Event::process(ocsf::Activity::LAUNCH, ocsf::Severity::Informational)
            .subject(format!("{program}({})", child.pid()))
            .detail("cmd", command)
            .detail("layers", layers.clone())
            .emit();
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                child.pid(),
                Started {
                    at: Instant::now(),
                    program,
                    layers,
                    limits: sandbox.policy().limits.clone(),
                },
            );
        Ok(child)
    }

    /// The exec's end record, carrying its exit report. `info` is `None` when the client went
    /// away and the tree was killed; `bytes` are stdout and stderr as forwarded, `None` when
    /// the output did not pass through us (the main process writes to the pod's own).
    pub fn exec_ended(&self, child: &Child, info: Option<&ExitInfo>, bytes: Option<(u64, u64)>) {
        let Some(st) = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&child.pid())
        else {
            return;
        };
        let wall_ms = st.at.elapsed().as_millis() as u64;
        let subject = format!("{}({})", st.program, child.pid());
        let Some(info) = info else {
            ocsf::Event::process(ocsf::Activity::TERMINATE, ocsf::Severity::Low)
                .subject(subject)
                .detail(
                    "reason",
                    "channel_closed: the client went away, tree killed".into(),
                )
                .detail("wall_ms", wall_ms.to_string())
                .detail("layers", st.layers)
                .emit();
            return;
        };
        use crate::exec::report::{Context, classify};
        use crate::exec::stream::StreamStats;
        let stats = |b| StreamStats {
            bytes: b,
            forwarded: b,
            ..Default::default()
        };
        let cx = Context {
            timed_out: false,
            cpu_limit_secs: st.limits.cpu_secs,
            memory_limit_bytes: st.limits.memory_bytes,
            cgroup_memory_hit: child.hit_memory_limit(),
        };
        let (out, err) = bytes.unwrap_or_default();
        let reason = classify(info, &cx, &stats(out), &stats(err));
        let limit_hit = matches!(
            reason,
            crate::exec::report::Reason::CpuLimit | crate::exec::report::Reason::MemoryLimit
        );
        let how = match (info.code, info.signal) {
            (Some(c), _) => format!("exit:{c}"),
            (None, Some(s)) => format!("signal:{s}"),
            (None, None) => "exit:255".into(),
        };
        let sev = if limit_hit {
            ocsf::Severity::Medium
        } else {
            ocsf::Severity::Informational
        };
        let mut ev = ocsf::Event::process(ocsf::Activity::TERMINATE, sev)
            .subject(subject)
            .tag(how)
            .detail("reason", reason.as_str().into())
            .detail("wall_ms", wall_ms.to_string())
            .detail("user_cpu_ms", info.user_cpu.as_millis().to_string())
            .detail("sys_cpu_ms", info.sys_cpu.as_millis().to_string())
            .detail("peak_rss_kib", info.max_rss_kib.to_string());
        if bytes.is_some() {
            ev = ev
                .detail("stdout_bytes", out.to_string())
                .detail("stderr_bytes", err.to_string())
                // serve has no output cap: nothing is ever cut.
                .detail("truncated", "none".into());
        }
        ev = ev.detail("layers", st.layers);
        if limit_hit {
            ev = ev.denied();
        }
        ev.emit();
    }
}

fn command_line(argv: &[std::ffi::OsString]) -> String {
    // The command string of `sh -c CMD`, or the whole argv; bounded, one line.
    let s = match argv {
        [_, flag, cmd] if flag == "-c" || flag == "-lc" => cmd.to_string_lossy().into_owned(),
        _ => argv
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" "),
    };
    let mut s: String = s.chars().map(|c| if c == '\n' { ' ' } else { c }).collect();
    if s.len() > 256 {
        let mut cut = 256;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

fn layer_list(s: &Sandbox) -> String {
    use crate::sandbox::Enforcement;
    s.layers()
        .iter()
        .map(|l| {
            let st = match l.status {
                Enforcement::Enforced => "enforced",
                Enforcement::Degraded => "degraded",
                Enforcement::NotRequested => "not_requested",
            };
            format!("{}={st}", l.layer)
        })
        .collect::<Vec<_>>()
        .join(",")
}
