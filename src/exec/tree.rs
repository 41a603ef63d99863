//! Finding and signalling every process of one exec.
//!
//! The child leads a process group of its own (and, where it took a new session, that
//! session: `sandbox::child::group`), so its pid is its process group's id, and its session's
//! where it has one. Descendants are found three ways, strongest first:
//! 1. the exec's cgroup, when there is one: exact, including daemons that changed session,
//!    so nothing else is consulted; it is also signalled without a pid race (`cgroup.kill`,
//!    or frozen around the read and the kill, see `sandbox::cgroup`);
//! 2. otherwise, the process table: every process whose parent chain leads to the exec, or
//!    that is in its process group or its session;
//! 3. orphans re-parented to the supervisor (we are a child subreaper) that are not the main
//!    process of another exec. Without an init, the command is its exec's own subreaper
//!    (`sandbox/init.rs`), so a double-forked daemon stays below the command while the exec
//!    runs (found by 2.), and reaches the supervisor only once the command has exited: then its
//!    exec is over, and the sweep at that exec's end kills it. A running exec's daemons are
//!    therefore never taken for orphans by another exec's end.
//!
//! A member list that cannot be read (EMFILE after a prlimit on us, a vanished group) is a
//! [`SweepError`], never an empty list: nobody knows then what is still running.

use std::collections::HashMap;
use std::io;
use std::time::Duration;

use super::reaper::Registry;
use crate::sandbox::cgroup::{CgroupError, ExecCgroup};
use crate::sys::process;
use crate::sys::procstat::StatLine;

/// Why the sweep could not tell which processes belong to the exec. Containment has failed
/// then: an unreadable member list is never an empty one.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("the exec's cgroup: {0}")]
    Cgroup(#[from] CgroupError),
    #[error("reading the process table ({path}): {source}")]
    Proc { path: String, source: io::Error },
}

struct ProcInfo {
    ppid: i32,
    pgrp: i32,
    sid: i32,
}

fn process_table() -> Result<HashMap<i32, ProcInfo>, SweepError> {
    let mut out = HashMap::new();
    let proc_err = |path: &str, source| SweepError::Proc {
        path: path.to_string(),
        source,
    };
    let dir = std::fs::read_dir("/proc").map_err(|e| proc_err("/proc", e))?;
    for e in dir {
        let e = e.map_err(|e| proc_err("/proc", e))?;
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let path = format!("/proc/{pid}/stat");
        let stat = match std::fs::read_to_string(&path) {
            Ok(s) => s,
            // Gone since the directory was listed: it exited, nothing to kill.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)) => continue,
            Err(e) => return Err(proc_err(&path, e)),
        };
        // State, ppid, pgrp, session: fields 3 to 6.
        let Some(s) = StatLine::new(&stat) else {
            continue;
        };
        if s.field(3).is_none_or(|state| state == "Z") {
            continue;
        }
        let Some([ppid, pgrp, sid]) = s.nums(4) else {
            continue;
        };
        out.insert(pid, ProcInfo { ppid, pgrp, sid });
    }
    Ok(out)
}

/// Every live process of the exec rooted at `leader` (no cgroup), except the supervisor
/// itself: from one /proc snapshot, every descendant of the roots (the leader, the members of
/// its process group and of its session, and orphans re-parented to the supervisor that are
/// not another exec's main process), found in one breadth-first pass over a parent → children
/// map. (An upward walk per process would find only the top of a deep daemon chain per round.)
fn members(leader: i32, supervisor: i32, registered: &Registry) -> Result<Vec<i32>, SweepError> {
    let mut pids: Vec<i32> = Vec::new();
    let table = process_table()?;
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    let mut queue: Vec<i32> = Vec::new();
    for (&pid, info) in &table {
        if pid == supervisor {
            continue;
        }
        children.entry(info.ppid).or_default().push(pid);
        let orphan = info.ppid == supervisor && pid != leader && !registered.is_exec(pid);
        // A session is named by its leader's pid, and a group can be joined only from its
        // own session: the leader's, or without a new session (`CommandGroup::Group`) the
        // supervisor's, where only a process that could kill the exec's anyway (its caller's
        // uid, in a degraded run with no PID namespace) could join it, and is swept with it.
        if pid == leader || info.pgrp == leader || info.sid == leader || orphan {
            queue.push(pid);
        }
    }
    let mut seen = std::collections::HashSet::new();
    while let Some(pid) = queue.pop() {
        if pid == supervisor || !seen.insert(pid) {
            continue;
        }
        pids.push(pid);
        if let Some(kids) = children.get(&pid) {
            queue.extend(kids.iter().copied());
        }
    }
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}

/// Send `sig` to the whole exec. `leader_alive`: the leader is not reaped yet, so its pid (and
/// process group id) cannot have been reused.
pub fn signal(
    leader: i32,
    cg: Option<&ExecCgroup>,
    supervisor: i32,
    sig: i32,
    leader_alive: bool,
    registered: &Registry,
) -> Result<(), SweepError> {
    if leader_alive {
        // The leader is not reaped yet: its group's id is still its own.
        let _ = process::kill(-leader, sig);
    }
    // With a cgroup the answer is exact: every descendant is born in the exec's group and the
    // sandbox uid cannot move itself out (cgroup.procs elsewhere is root's). The group also
    // signals without a pid race (cgroup.kill, or frozen around the read and the kill).
    if let Some(cg) = cg {
        cg.signal_all(sig)?;
        return Ok(());
    }
    for pid in members(leader, supervisor, registered)? {
        let _ = process::kill(pid, sig);
    }
    Ok(())
}

/// SIGKILL until nothing of the exec is left (bounded to about a second). Returns the pids
/// still alive after that: a process that forks faster than we can find it. An error when the
/// members could not be read: then nobody knows what is left.
///
/// `registered` tells another exec's main process from an orphan; `nudge` wakes the reaper
/// between rounds (killed orphans are its to reap).
pub fn kill_all(
    leader: i32,
    cg: Option<&ExecCgroup>,
    supervisor: i32,
    leader_alive: bool,
    registered: &Registry,
    nudge: &dyn Fn(),
) -> Result<Vec<i32>, SweepError> {
    crate::pause::point("tree-sweep");
    let mut alive = leader_alive;
    for round in 0..200 {
        if alive {
            let _ = process::kill(-leader, libc::SIGKILL);
            alive = false;
        }
        let found = match cg {
            Some(cg) => cg.signal_all(libc::SIGKILL)?,
            None => {
                let m = members(leader, supervisor, registered)?;
                crate::pause::point("tree-members-read");
                for &pid in &m {
                    let _ = process::kill(pid, libc::SIGKILL);
                }
                m.len()
            }
        };
        if found == 0 {
            return Ok(Vec::new());
        }
        nudge();
        std::thread::sleep(Duration::from_millis(if round < 10 { 1 } else { 5 }));
    }
    match cg {
        Some(cg) => {
            let mut m = cg.members()?;
            m.retain(|&p| p != supervisor);
            Ok(m)
        }
        None => members(leader, supervisor, registered),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::{Child, Command};

    fn sleeper(group: Option<i32>) -> Child {
        let mut c = Command::new("sleep");
        c.arg("30");
        if let Some(g) = group {
            c.process_group(g);
        }
        c.spawn().unwrap()
    }

    /// Without a cgroup, a process in the leader's process group is the exec's even when
    /// neither its parent chain nor its session leads to the leader: a command that took no
    /// new session (`CommandGroup::Group`) shares the supervisor's session.
    #[test]
    fn a_member_of_the_leaders_process_group_is_the_execs() {
        let mut leader = sleeper(Some(0));
        let lpid = leader.id() as i32;
        let mut member = sleeper(Some(lpid));
        let mut outsider = sleeper(None);
        // A "supervisor" with no children: no orphan of it to take.
        let mut supervisor = sleeper(None);
        let found = members(lpid, supervisor.id() as i32, &Registry::default());
        let mut all = [&mut leader, &mut member, &mut outsider, &mut supervisor];
        for c in all.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let found = found.unwrap();
        assert!(found.contains(&lpid), "{found:?}");
        assert!(found.contains(&(member.id() as i32)), "{found:?}");
        assert!(!found.contains(&(outsider.id() as i32)), "{found:?}");
        assert!(!found.contains(&(std::process::id() as i32)), "{found:?}");
    }
}
