//! How an exec ended and what it used: the exit status and the rusage its leader's wait4
//! reports, and a reading of /proc taken just before a SIGKILL of ours.
//!
//! wait4 counts a process's own time and that of the children it reaped. A SIGKILL of the
//! exec's init (PID 1 of its PID namespace) ends it before it reaps the command, and the
//! kernel then reaps the rest of the namespace with SIGCHLD ignored, so none of their times
//! reach the init's rusage: a run stopped at its output cap reported `cpu 0+0 ms` and the
//! init's own few KiB of RSS. So before we send SIGKILL, we read what every process of the
//! exec has used so far (its own time and its reaped children's, and its peak RSS), and the
//! report takes the larger of the two.

use std::collections::HashMap;
use std::time::Duration;

use super::reaper;
use crate::sys::procstat::StatLine;

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
    pub(super) fn from_reaped(r: reaper::Reaped) -> Self {
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

/// What the processes of one tree had used when it was read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub user_cpu: Duration,
    pub sys_cpu: Duration,
    pub max_rss_kib: u64,
}

impl ExitInfo {
    /// Each figure at least what `used` says (a reading taken before a kill).
    pub(super) fn at_least(mut self, used: Option<Usage>) -> Self {
        if let Some(u) = used {
            self.user_cpu = self.user_cpu.max(u.user_cpu);
            self.sys_cpu = self.sys_cpu.max(u.sys_cpu);
            self.max_rss_kib = self.max_rss_kib.max(u.max_rss_kib);
        }
        self
    }
}

/// One process's line of /proc/PID/stat: (ppid, user ticks, system ticks), its own plus its
/// reaped children's (ppid is field 4, utime, stime, cutime, cstime fields 14 to 17).
fn parse_stat(stat: &str) -> Option<(i32, u64, u64)> {
    let s = StatLine::new(stat)?;
    let [utime, stime, cutime, cstime] = s.nums::<u64, 4>(14)?;
    Some((s.num(4)?, utime + cutime, stime + cstime))
}

/// The peak resident set in KiB from /proc/PID/status (`VmHWM`; absent for a zombie).
fn parse_hwm(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// What `root` and every process below it have used so far: CPU time summed (each one's own
/// and its reaped children's), the largest peak RSS. Processes that vanish meanwhile are
/// skipped; their time is in their parent's once reaped.
pub(super) fn snapshot(root: i32) -> Usage {
    // SAFETY: sysconf has no preconditions.
    let hz = match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        n if n > 0 => n as u64,
        _ => 100,
    };
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Usage::default();
    };
    let mut procs: HashMap<i32, (i32, u64, u64)> = HashMap::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Some(p) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .as_deref()
            .and_then(parse_stat)
        {
            procs.insert(pid, p);
        }
    }
    let below_root = |mut pid: i32| {
        for _ in 0..procs.len() {
            if pid == root {
                return true;
            }
            match procs.get(&pid) {
                Some(&(ppid, _, _)) if ppid > 0 => pid = ppid,
                _ => return false,
            }
        }
        false
    };
    let ticks = |t: u64| Duration::from_nanos(t.saturating_mul(1_000_000_000 / hz));
    let mut used = Usage::default();
    for (&pid, &(_, user, sys)) in procs.iter().filter(|(pid, _)| below_root(**pid)) {
        used.user_cpu += ticks(user);
        used.sys_cpu += ticks(sys);
        let hwm = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .as_deref()
            .and_then(parse_hwm)
            .unwrap_or(0);
        used.max_rss_kib = used.max_rss_kib.max(hwm);
    }
    used
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_past_odd_command_names() {
        let line = "42 (a b) c)) S 7 42 42 0 -1 4194560 100 0 0 0 25 5 3 1 20 0 1 0 100 1 1";
        assert_eq!(parse_stat(line), Some((7, 25 + 3, 5 + 1)));
        assert_eq!(parse_stat("garbage"), None);
        let status = "Name:\tpython3\nVmPeak:\t  9000 kB\nVmHWM:\t    8072 kB\n";
        assert_eq!(parse_hwm(status), Some(8072));
        assert_eq!(parse_hwm("Name:\tzombie\n"), None);
    }

    /// This process and a child that burns CPU: the reading covers the child's time.
    #[test]
    fn a_snapshot_counts_the_tree_below_the_root() {
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 30",
            ])
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut used = Usage::default();
        while std::time::Instant::now() < deadline {
            used = snapshot(pid);
            if used.user_cpu + used.sys_cpu >= Duration::from_millis(50) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            used.user_cpu + used.sys_cpu >= Duration::from_millis(50),
            "{used:?}"
        );
        assert!(used.max_rss_kib > 0, "{used:?}");
    }
}
