//! `--cpu` for the whole exec tree: the group's CPU time, and the watcher that keeps the limit.

use std::fs;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::group::Group;
use super::system::{CgroupError, counter};

/// A supervisor thread that keeps `--cpu` for the whole tree: it reads the group's CPU time
/// every [`CPU_POLL`] and at the limit sends SIGXCPU to every member, SIGKILL
/// [`CPU_KILL_AFTER`] later (RLIMIT_CPU's own soft-to-hard step, for the tree). A thread of
/// the group rather than of `run`, so that every caller of `Sandbox::spawn` (`run`, the
/// gateway's execs) gets the same limit. It ends when the group is dropped.
#[derive(Debug)]
pub(super) struct CpuWatch {
    pub(super) stop: Arc<AtomicBool>,
    pub(super) hit: Arc<AtomicBool>,
}

/// How often the `--cpu` watcher reads the tree's CPU time: the tree may overrun the limit by
/// up to this much per busy CPU.
pub const CPU_POLL: Duration = Duration::from_millis(50);
/// Between the SIGXCPU at `--cpu` and the SIGKILL.
pub const CPU_KILL_AFTER: Duration = Duration::from_secs(1);

impl CpuWatch {
    pub(super) fn start(meter: CpuMeter, group: Group, limit: Duration) -> io::Result<CpuWatch> {
        let stop = Arc::new(AtomicBool::new(false));
        let hit = Arc::new(AtomicBool::new(false));
        let (s, h) = (stop.clone(), hit.clone());
        std::thread::Builder::new()
            .name("cpu-watch".into())
            .spawn(move || {
                while !s.load(Ordering::Acquire) {
                    std::thread::sleep(CPU_POLL);
                    match meter.usage() {
                        Ok(u) if u >= limit => break,
                        Ok(_) => {}
                        Err(_) => return, // the group is gone
                    }
                }
                if s.load(Ordering::Acquire) {
                    return;
                }
                h.store(true, Ordering::Release);
                let _ = group.signal(libc::SIGXCPU, false);
                let until = Instant::now() + CPU_KILL_AFTER;
                while Instant::now() < until {
                    if s.load(Ordering::Acquire) || group.members().is_ok_and(|m| m.is_empty()) {
                        return;
                    }
                    std::thread::sleep(CPU_POLL);
                }
                let _ = group.kill_until_empty();
            })?;
        Ok(CpuWatch { stop, hit })
    }
}
/// Reads the whole exec tree's CPU time, independently of the [`ExecCgroup`] (so a watcher
/// can poll it while the child is being waited for).
#[derive(Debug, Clone)]
pub struct CpuMeter {
    pub(super) path: PathBuf,
    pub(super) v2: bool,
}

impl CpuMeter {
    /// User + system CPU time of every process that is or was in the group.
    pub fn usage(&self) -> Result<Duration, CgroupError> {
        let text = fs::read_to_string(&self.path).map_err(|source| CgroupError::Read {
            path: self.path.clone(),
            source,
        })?;
        let bad = || CgroupError::Read {
            path: self.path.clone(),
            source: io::Error::from(io::ErrorKind::InvalidData),
        };
        if self.v2 {
            let usec = counter(&text, "usage_usec").ok_or_else(bad)?;
            Ok(Duration::from_micros(usec))
        } else {
            // cpuacct.usage: nanoseconds, user and system together.
            let ns: u64 = text.trim().parse().map_err(|_| bad())?;
            Ok(Duration::from_nanos(ns))
        }
    }
}
