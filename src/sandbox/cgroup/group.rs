//! One cgroup's member list, and how to kill every member without hitting a recycled pid.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::system::{CgroupError, write_file};

/// How one group's members are signalled.
#[derive(Debug, Clone)]
pub(super) enum Kill {
    /// v2: `cgroup.kill` in the group itself.
    V2,
    /// v1: freeze this freezer group around the read and the kill.
    Freezer(PathBuf),
    /// v1 without a freezer: read and kill (a member reaped in between can be recycled).
    Plain,
}

/// One group's member list and how to kill it, without the join descriptors.
#[derive(Debug, Clone)]
pub(super) struct Group {
    pub(super) procs_dir: PathBuf,
    pub(super) kill: Kill,
}

/// How long to wait for a freezer group to report FROZEN.
pub(super) const FREEZE_WAIT: Duration = Duration::from_secs(1);

impl Group {
    pub(super) fn at(dir: &Path, freezer: bool) -> Group {
        let kill = if dir.join("cgroup.kill").exists() {
            Kill::V2
        } else if freezer {
            Kill::Freezer(dir.to_path_buf())
        } else {
            Kill::Plain
        };
        Group {
            procs_dir: dir.to_path_buf(),
            kill,
        }
    }

    pub(super) fn members(&self) -> Result<Vec<i32>, CgroupError> {
        let path = self.procs_dir.join("cgroup.procs");
        let text = fs::read_to_string(&path).map_err(|source| CgroupError::Read {
            path: path.clone(),
            source,
        })?;
        Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// Send `sig` to every member; returns how many there were. No member can be reaped (and
    /// its pid reused) between the read and the signal: v2 kills the group as one, v1 freezes
    /// it first.
    /// `exec`: this is a live exec's sweep (the race tests hold it between read and kill; the
    /// sweep of stale groups at start-up is never held).
    pub(super) fn signal(&self, sig: i32, exec: bool) -> Result<usize, CgroupError> {
        let pause = || {
            if exec {
                crate::pause::point("tree-members-read");
            }
        };
        match &self.kill {
            Kill::V2 if sig == libc::SIGKILL => {
                let n = self.members()?.len();
                if n > 0 {
                    write_file(&self.procs_dir.join("cgroup.kill"), "1")?;
                }
                Ok(n)
            }
            Kill::Freezer(dir) => {
                // An empty group stays empty (only a member can fork into it): the common end
                // of an exec needs no freeze.
                if self.members()?.is_empty() {
                    return Ok(0);
                }
                let state = dir.join("freezer.state");
                write_file(&state, "FROZEN")?;
                // Thaw on every path out, or the group's processes stay stopped for good.
                struct Thaw<'a>(&'a Path);
                impl Drop for Thaw<'_> {
                    fn drop(&mut self) {
                        let _ = write_file(self.0, "THAWED");
                    }
                }
                let _thaw = Thaw(&state);
                let start = Instant::now();
                loop {
                    let s = fs::read_to_string(&state).map_err(|source| CgroupError::Read {
                        path: state.clone(),
                        source,
                    })?;
                    if s.trim() == "FROZEN" {
                        break;
                    }
                    if start.elapsed() > FREEZE_WAIT {
                        // A task that will not freeze (stuck in the kernel): killing what we
                        // see is still better than leaving the exec alive.
                        tracing::warn!(group = %dir.display(), "the group did not freeze; killing it unfrozen");
                        break;
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
                let m = self.members()?;
                pause();
                // A frozen task cannot exit, so each pid is still the member we read. On v1 a
                // frozen task also does not die of SIGKILL until the group is thawed.
                for &pid in &m {
                    let _ = crate::sys::process::kill(pid, sig);
                }
                Ok(m.len())
            }
            _ => {
                let m = self.members()?;
                pause();
                for &pid in &m {
                    let _ = crate::sys::process::kill(pid, sig);
                }
                Ok(m.len())
            }
        }
    }

    /// SIGKILL until the group is empty, for about a second.
    pub(super) fn kill_until_empty(&self) -> Result<(), CgroupError> {
        for round in 0..200 {
            if self.signal(libc::SIGKILL, false)? == 0 {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(if round < 10 { 1 } else { 5 }));
        }
        Ok(())
    }
}
