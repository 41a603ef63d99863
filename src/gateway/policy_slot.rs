//! What every exec spawns through ([`PolicySlot`]): the sandbox of the current policy
//! revision, swapped by the policy plane, or a quarantine that refuses execs. It also writes
//! each exec's OCSF launch and end records, the end one carrying the exit report.

use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use super::ended::Ended;
use super::ocsf;
use crate::exec::{Child, RunError, Sandbox, SpawnSpec};

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
    /// As [`RunError::exit`]; a quarantine is the sandbox refusing (ours).
    pub fn exit(&self) -> crate::exit::Exit {
        match self {
            SpawnError::Quarantined(_) => crate::exit::Exit::Ours,
            SpawnError::Run(e) => e.exit(),
        }
    }

    /// [`Self::exit`]'s code.
    pub fn exit_code(&self) -> u8 {
        self.exit().code()
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

    /// The current sandbox, if the policy is not quarantined: for work that must happen in its
    /// view (a forwarded connection's connect).
    pub fn current(&self) -> Option<Sandbox> {
        match self.get() {
            Active::Ready(s) => Some(s),
            Active::Quarantined(_) => None,
        }
    }

    /// [`current`](Self::current), or why there is none: what a forward answers while
    /// quarantined, as an exec would.
    pub fn ready(&self) -> Result<Sandbox, SpawnError> {
        match self.get() {
            Active::Ready(s) => Ok(s),
            Active::Quarantined(why) => Err(SpawnError::Quarantined(why)),
        }
    }

    pub(super) fn set(&self, a: Active) {
        *self.active.write().unwrap_or_else(|p| p.into_inner()) = a;
    }

    pub(super) fn has_sandbox(&self) -> bool {
        matches!(self.get(), Active::Ready(_))
    }

    /// Start one command under the current revision's sandbox; one OCSF launch record.
    pub async fn spawn(&self, spec: SpawnSpec) -> Result<Child, SpawnError> {
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
        let mut spec = spec;
        super::egress::add_child_env(&sandbox, &mut spec.env);
        let child = match sandbox.spawn(spec).await {
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

    /// The exec's end record, carrying its exit report. `ended` is `None` when the client went
    /// away and the tree was killed; `bytes` are stdout and stderr as forwarded, `None` when
    /// the output did not pass through us (the main process writes to the pod's own).
    pub fn exec_ended(&self, child: &Child, ended: Option<&Ended>, bytes: Option<(u64, u64)>) {
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
        let Some(&Ended { info, timed_out }) = ended else {
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
        use crate::exec::report::{Context, classify, exit_code};
        use crate::exec::stream::StreamStats;
        let stats = |b| StreamStats {
            bytes: b,
            forwarded: b,
            ..Default::default()
        };
        let cx = Context {
            timed_out,
            rlimit_cpu_secs: st
                .limits
                .cpu_secs
                .filter(|_| child.cgroup().and_then(|c| c.cpu_meter()).is_none()),
            cpu_limit_hit: child.cgroup().is_some_and(|c| c.cpu_limit_hit()),
            cgroup_memory_hit: child.hit_memory_limit(),
            pids_limit_hit: child.cgroup().is_some_and(|c| c.pids_max_hits() > 0),
            output_limit_kill: false,
        };
        let (out, err) = bytes.unwrap_or_default();
        let reason = classify(&info, &cx, &stats(out), &stats(err));
        let limit_hit = matches!(
            reason,
            crate::exec::report::Reason::CpuLimit | crate::exec::report::Reason::MemoryLimit
        );
        let how = match (info.code, info.signal) {
            (None, Some(s)) => format!("signal:{s}"),
            _ => format!("exit:{}", exit_code(&info, false)),
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

/// The program an exec runs, for its launch record: for `sh -c CMD` the first word of CMD
/// after a leading `cd DIR &&` and `NAME=value` assignments (the gateway puts ExecSandbox's
/// environment there), never the arguments or the values. Both can carry secrets, and the
/// record goes to the gateway's log tail, where every reader of `openshell logs` sees it.
fn command_line(argv: &[std::ffi::OsString]) -> String {
    let first = match argv {
        [_, flag, cmd] if flag == "-c" || flag == "-lc" => {
            let words = shell_words(&cmd.to_string_lossy());
            let mut i = 0;
            if words.first().map(String::as_str) == Some("cd")
                && words.get(2).map(String::as_str) == Some("&&")
            {
                i = 3;
            }
            while words.get(i).is_some_and(|w| is_assignment(w)) {
                i += 1;
            }
            words.get(i).cloned().unwrap_or_default()
        }
        [a, ..] => a.to_string_lossy().into_owned(),
        [] => String::new(),
    };
    let mut s: String = first
        .chars()
        .filter(|c| !c.is_control())
        .take(128)
        .collect();
    if s.is_empty() {
        s.push('-');
    }
    s
}

fn is_assignment(w: &str) -> bool {
    match w.split_once('=') {
        Some((name, _)) => {
            !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        }
        None => false,
    }
}

/// Split a command string into shell words: whitespace outside quotes separates, `'...'` and
/// `"..."` quote, a backslash escapes the next character outside single quotes. Enough for
/// the gateway's own quoting (single quotes, `'"'"'` for an embedded quote).
fn shell_words(s: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    cur.push(q);
                }
            }
            '"' => {
                in_word = true;
                while let Some(q) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' => {
                            if let Some(e) = chars.next() {
                                cur.push(e);
                            }
                        }
                        _ => cur.push(q),
                    }
                }
            }
            '\\' => {
                in_word = true;
                if let Some(e) = chars.next() {
                    cur.push(e);
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    words
}

fn layer_list(s: &Sandbox) -> String {
    s.layers()
        .iter()
        .map(|l| format!("{}={}", l.layer, l.status.as_str()))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::command_line;

    fn argv(cmd: &str) -> Vec<std::ffi::OsString> {
        vec!["/bin/bash".into(), "-lc".into(), cmd.into()]
    }

    #[test]
    fn the_launch_record_names_the_program_and_never_a_value() {
        assert_eq!(command_line(&argv("echo hello; exit 3")), "echo");
        let c = command_line(&argv(
            "cd '/w d' && API_KEY='s3cret value'\"'\"'x' B= python3 -c 'print(1)' TOKEN=zzz",
        ));
        assert_eq!(c, "python3");
        assert_eq!(command_line(&argv("A=1 B=2")), "-");
        assert_eq!(
            command_line(&["/bin/sleep".into(), "5".into()]),
            "/bin/sleep"
        );
    }
}
