//! The exit report: what happened to one run, as JSON and as a one-line summary.

use std::time::Duration;

use serde::Serialize;

use super::ExitInfo;
use super::stream::StreamStats;
use crate::policy::Limits;
use crate::sandbox::LayerStatus;

/// Why the run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    Exited,
    Signaled,
    Timeout,
    CpuLimit,
    MemoryLimit,
    OutputLimit,
    PidsLimit,
    /// The command could not be started: no such program (or its interpreter), exit 127.
    NotFound,
    /// The command could not be started: not executable, or refused by the sandbox, exit 126.
    NotExecutable,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Exited => "exited",
            Reason::Signaled => "signaled",
            Reason::Timeout => "timeout",
            Reason::CpuLimit => "cpu_limit",
            Reason::MemoryLimit => "memory_limit",
            Reason::OutputLimit => "output_limit",
            Reason::PidsLimit => "pids_limit",
            Reason::NotFound => "not_found",
            Reason::NotExecutable => "not_executable",
        }
    }
}

/// The exit report of one run. docs/report.md gives the meaning of every field.
#[derive(Debug, Clone, Serialize)]
pub struct ExitReport {
    pub reason: Reason,
    /// The exit code `run` itself returns: the child's code, 128+N for signal N, 124 on timeout.
    pub exit_code: i32,
    /// The child's own exit status, when it exited; `null` when it was killed by a signal
    /// (then `signal` is set): a killed process has no exit status.
    pub status: Option<i32>,
    /// The signal that killed the child, when one did; `null` when it exited.
    pub signal: Option<i32>,
    pub wall_ms: u64,
    pub user_cpu_ms: u64,
    pub sys_cpu_ms: u64,
    pub peak_rss_kib: u64,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// CPU time of the whole exec tree from the cgroup's accounting, when it was measured
    /// (`--cpu` or `--cpus` with a cgroup); `null` otherwise.
    pub cgroup_cpu_ms: Option<u64>,
    /// Every process of the run was gone when it ended.
    pub contained: bool,
    /// Pids that survived the kill sweep (-1: an unknown process kept the output pipes open).
    pub survivors: Vec<i32>,
    /// Why the kill sweep could not list the run's processes, when it could not (then
    /// `contained` is false: what is left is unknown).
    pub containment_error: Option<String>,
    pub landlock_abi: i32,
    pub layers: Vec<LayerStatus>,
    /// The command as given after `--` (non-UTF-8 bytes replaced).
    pub command: Vec<String>,
    /// The uid and gid the command ran as.
    pub uid: u32,
    pub gid: u32,
    /// The limits in force for this run, defaults included.
    pub limits: EffectiveLimits,
    /// When the run started (RFC 3339, UTC).
    pub started_at: String,
    /// The host's cgroup hierarchy: `v2`, `v1` (or hybrid), `null` with none mounted.
    pub cgroup_version: Option<&'static str>,
    /// Connections through the sandbox's egress proxy, when it has one (network rules).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressCounts>,
}

/// Every limit of one run: the policy's (per exec) and the run's own.
#[derive(Debug, Clone, Serialize)]
pub struct EffectiveLimits {
    #[serde(flatten)]
    pub policy: Limits,
    /// `--timeout`; `null`: no wall-clock limit.
    pub timeout_secs: Option<f64>,
    /// `--kill-grace`.
    pub kill_grace_secs: f64,
    /// `--max-output`, per stream; `null`: unlimited.
    pub max_output_bytes: Option<u64>,
}

/// Which cgroup hierarchy the host mounts at /sys/fs/cgroup, from the filesystem type.
pub fn host_cgroup_version() -> Option<&'static str> {
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    const CGROUP_SUPER_MAGIC: i64 = 0x0027_e0eb;
    let fs_type = |p: &std::ffi::CStr| {
        // SAFETY: statfs with a NUL-terminated path into a zeroed stack struct.
        unsafe {
            let mut st: libc::statfs = std::mem::zeroed();
            (libc::statfs(p.as_ptr(), &mut st) == 0).then_some(st.f_type as i64)
        }
    };
    match fs_type(c"/sys/fs/cgroup")? {
        CGROUP2_SUPER_MAGIC => Some("v2"),
        CGROUP_SUPER_MAGIC => Some("v1"),
        // v1 (and hybrid) mount a tmpfs there with one mount per controller below it.
        _ => std::fs::read_dir("/sys/fs/cgroup")
            .ok()?
            .flatten()
            .filter_map(|e| {
                std::ffi::CString::new(e.path().into_os_string().into_encoded_bytes()).ok()
            })
            .any(|p| fs_type(&p) == Some(CGROUP_SUPER_MAGIC))
            .then_some("v1"),
    }
}

/// Exit code when our own wall-clock limit fired, as coreutils' `timeout` uses.
pub const TIMEOUT_EXIT: i32 = crate::exit::Exit::TimedOut.code() as i32;

/// The one exit-code rule, for every place an exec's end becomes a number: `run`'s own exit
/// code, an SSH exec's `exit-status`, the main process's exit to attachers, to the gateway
/// (ReportMainProcessExit) and as the supervisor's exit code. [`TIMEOUT_EXIT`] when our
/// timeout ended it (the signal we sent is not the command's doing); else the exit status;
/// else 128+N for a death by signal N, as a shell reports it; else 255 (a wait status that is
/// neither cannot happen for a reaped child, and 255 is no code a shell gives).
pub fn exit_code(info: &ExitInfo, timed_out: bool) -> i32 {
    match (timed_out, info.code, info.signal) {
        (true, _, _) => TIMEOUT_EXIT,
        (false, Some(c), _) => c,
        (false, None, Some(s)) => 128 + s,
        (false, None, None) => 255,
    }
}

/// A signal's name as people know it (`SIGPIPE`, `SIGXCPU`, `SIGRTMIN+3`); `signal N` for a
/// number that is no signal.
pub fn signal_name(sig: i32) -> String {
    if let Ok(s) = nix::sys::signal::Signal::try_from(sig) {
        return s.as_str().to_owned();
    }
    // glibc keeps the first real-time signals for itself; SIGRTMIN is the first it hands out.
    let (min, max) = (libc::SIGRTMIN(), libc::SIGRTMAX());
    if (min..=max).contains(&sig) {
        return format!("SIGRTMIN+{}", sig - min);
    }
    format!("signal {sig}")
}

/// Facts the classifier needs beyond the exit status.
pub struct Context {
    pub timed_out: bool,
    /// The per-process fallback, RLIMIT_CPU, was set to this many seconds.
    pub rlimit_cpu_secs: Option<u64>,
    /// The supervisor's watcher stopped the tree at `--cpu`.
    pub cpu_limit_hit: bool,
    /// The memory cgroup's OOM-kill counter is above zero.
    pub cgroup_memory_hit: bool,
    /// A fork or clone failed at pids.max (pids.events `max`).
    pub pids_limit_hit: bool,
    /// `--on-output-limit kill` stopped the tree.
    pub output_limit_kill: bool,
}

/// Decide the reason. Order matters: our own timeout first (it caused the signal), then the
/// kernel limits that also end in a signal, then plain exits.
pub fn classify(info: &ExitInfo, cx: &Context, out: &StreamStats, err: &StreamStats) -> Reason {
    if cx.timed_out {
        return Reason::Timeout;
    }
    if cx.cpu_limit_hit {
        return Reason::CpuLimit;
    }
    let cpu = info.user_cpu + info.sys_cpu;
    if let Some(limit) = cx.rlimit_cpu_secs {
        // The per-process fallback: SIGXCPU at the soft limit, SIGKILL at the hard limit one
        // second later.
        let near = cpu + Duration::from_millis(300) >= Duration::from_secs(limit);
        if info.signal == Some(libc::SIGXCPU) || (info.signal == Some(libc::SIGKILL) && near) {
            return Reason::CpuLimit;
        }
    }
    // Only the kernel's OOM-kill counter: never a guess from the peak RSS or the exit code.
    if cx.cgroup_memory_hit {
        return Reason::MemoryLimit;
    }
    if cx.output_limit_kill || out.truncated || err.truncated {
        return Reason::OutputLimit;
    }
    if cx.pids_limit_hit {
        return Reason::PidsLimit;
    }
    if info.signal.is_some() {
        Reason::Signaled
    } else {
        Reason::Exited
    }
}

impl ExitReport {
    pub fn summary(&self) -> String {
        let how = match (self.reason, self.status, self.signal) {
            (Reason::Timeout, ..) => "timed out".to_string(),
            (_, Some(c), _) => format!("exited {c}"),
            (_, None, Some(s)) => format!("killed by {}", signal_name(s)),
            _ => "ended".to_string(),
        };
        let degraded: Vec<&str> = self
            .layers
            .iter()
            .filter(|l| l.status == crate::sandbox::Enforcement::Degraded)
            .map(|l| l.layer)
            .collect();
        format!(
            "openshell-sandbox: {how} (reason {}, code {}) in {} ms; cpu {}+{} ms; peak rss {} KiB; stdout {} B{}; stderr {} B{}; landlock ABI {}; {}",
            self.reason.as_str(),
            self.exit_code,
            self.wall_ms,
            self.user_cpu_ms,
            self.sys_cpu_ms,
            self.peak_rss_kib,
            self.stdout_bytes,
            if self.stdout_truncated {
                " (truncated)"
            } else {
                ""
            },
            self.stderr_bytes,
            if self.stderr_truncated {
                " (truncated)"
            } else {
                ""
            },
            self.landlock_abi,
            if let Some(e) = &self.containment_error {
                format!("CONTAINMENT FAILED: the run's processes could not be listed: {e}")
            } else if !self.contained {
                format!(
                    "CONTAINMENT FAILED: processes {:?} survived the run",
                    self.survivors
                )
            } else if degraded.is_empty() {
                "all layers enforced".to_string()
            } else {
                format!("DEGRADED: {}", degraded.join(", "))
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(code: Option<i32>, signal: Option<i32>) -> ExitInfo {
        ExitInfo {
            code,
            signal,
            user_cpu: Duration::ZERO,
            sys_cpu: Duration::ZERO,
            max_rss_kib: 0,
        }
    }

    #[test]
    fn the_exit_code_is_the_status_then_128_plus_the_signal() {
        assert_eq!(exit_code(&ended(Some(0), None), false), 0);
        assert_eq!(exit_code(&ended(Some(3), None), false), 3);
        assert_eq!(exit_code(&ended(Some(255), None), false), 255);
        assert_eq!(exit_code(&ended(None, Some(libc::SIGKILL)), false), 137);
        assert_eq!(exit_code(&ended(None, Some(libc::SIGTERM)), false), 143);
        assert_eq!(exit_code(&ended(None, None), false), 255);
    }

    #[test]
    fn signals_are_named() {
        assert_eq!(signal_name(libc::SIGPIPE), "SIGPIPE");
        assert_eq!(signal_name(libc::SIGXCPU), "SIGXCPU");
        assert_eq!(signal_name(libc::SIGKILL), "SIGKILL");
        assert_eq!(signal_name(libc::SIGRTMIN() + 2), "SIGRTMIN+2");
        assert_eq!(signal_name(0), "signal 0");
        assert_eq!(signal_name(99), "signal 99");
    }

    #[test]
    fn our_timeout_is_124_whatever_the_child_did() {
        assert_eq!(exit_code(&ended(None, Some(libc::SIGTERM)), true), 124);
        assert_eq!(exit_code(&ended(None, Some(libc::SIGKILL)), true), 124);
        assert_eq!(exit_code(&ended(Some(0), None), true), 124);
    }
}

/// The exec report's egress part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct EgressCounts {
    /// Connections the proxy let through (CONNECT tunnels and forwarded requests).
    pub allowed: u64,
    /// Connections it refused (403 `policy_denied` or `ssrf_denied`).
    pub denied: u64,
    /// The HTTP requests inside inspected tunnels and forwards, by decision.
    pub requests: RequestCounts,
}

/// Decisions on HTTP requests (L7 rules, or requests passed on an intercepted L4 endpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RequestCounts {
    pub allowed: u64,
    /// Would be denied, forwarded because the endpoint only audits.
    pub audited: u64,
    pub denied: u64,
}

impl From<crate::egress::Counts> for EgressCounts {
    fn from(c: crate::egress::Counts) -> EgressCounts {
        EgressCounts {
            allowed: c.allowed,
            denied: c.denied,
            requests: RequestCounts {
                allowed: c.requests_allowed,
                audited: c.requests_audited,
                denied: c.requests_denied,
            },
        }
    }
}
