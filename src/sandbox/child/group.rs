//! How a command gets a process group of its own ([`CommandGroup`]): a new session only where
//! one buys something.
//!
//! `setsid` costs more than its name says. With `kernel.sched_autogroup_enabled=1` (Debian's
//! default) a new session is also a new scheduler autogroup, whose entity joins the run queue
//! with no lag and, on a busy machine, waits behind the running tasks' slices: about 4 ms of a
//! 30 ms `run` with two busy loops on two cores (BENCHMARKS.md, "The command's session").
//! `setpgid(0, 0)` stays in the caller's autogroup.

use std::io;

/// How the command leaves the supervisor's process group, first of its steps
/// (`process::enforce_session`). Either way its pid is its process group's id, so a signal to
/// the group (`kill(-pid)`, the command's own `kill(0)`, what `run` forwards to its job)
/// reaches the command and every descendant that stayed in its group, and nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandGroup {
    /// `setsid()`: a new session (and process group) with no controlling terminal, so the
    /// command loses the supervisor's; with `tty`, then the pty on its stdin as its controlling
    /// terminal (`TIOCSCTTY` needs a session leader).
    Session { tty: bool },
    /// `setpgid(0, 0)`: a process group of its own, in the supervisor's session, which has no
    /// controlling terminal for it to lose. Against [`CommandGroup::Session`] this leaves out
    /// only a new session id and a new scheduler autogroup:
    /// - the terminal: the command inherits none (the supervisor has none, so `/dev/tty` gives
    ///   ENXIO either way), and cannot acquire one: only a session leader does, by opening a
    ///   terminal or `TIOCSCTTY`, and a process group leader cannot `setsid`;
    /// - SIGHUP when a session leader exits goes to its terminal's foreground group only:
    ///   without a terminal, to nobody, in either session;
    /// - the job-control stops (SIGTSTP, SIGTTIN, SIGTTOU) are discarded by the kernel in an
    ///   orphaned process group, which a new session always is and this group is not (its
    ///   parent, the exec's init or the supervisor, is in the same session). Without a
    ///   terminal none of them is sent but by a process that may signal the command anyway,
    ///   which could stop it with SIGSTOP just as well;
    /// - the group is in the supervisor's session, so the command may move itself into
    ///   another group of that session that it can name: only its own processes' groups from
    ///   its PID namespace (the supervisor's are outside it, and `setpgid` finds no such id);
    ///   without one (degraded), also the caller's group, which gains it only the caller's
    ///   signals. Its descendants could always leave its group.
    ///
    /// What reads the session, the fallback sweep of an exec without a cgroup, takes "in the
    /// command's session or process group" as the exec's (`exec/tree.rs`).
    Group,
}

impl CommandGroup {
    /// A new session when the exec asks for a controlling terminal (`controlling_tty`), or
    /// when the supervisor has one (`supervisor_has_terminal`: a developer's `run` in a
    /// terminal, whose command must lose it); else a process group of its own.
    pub fn decide(controlling_tty: bool, supervisor_has_terminal: bool) -> CommandGroup {
        if controlling_tty || supervisor_has_terminal {
            CommandGroup::Session {
                tty: controlling_tty,
            }
        } else {
            CommandGroup::Group
        }
    }
}

/// Whether the calling process has a controlling terminal, as the kernel holds it (`tty_nr`,
/// field 7 of /proc/self/stat), not whether /dev/tty opens (a file of any name in a container).
/// A stat that cannot be read or parsed counts as a terminal: the command then takes a new
/// session, as it always did.
pub fn has_controlling_terminal() -> bool {
    crate::sys::procstat::read_record("/proc/self/stat")
        .and_then(|s| {
            tty_nr(&s).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no tty_nr"))
        })
        .map_or(true, |nr| nr != 0)
}

/// `tty_nr` of a /proc/PID/stat line: field 7.
fn tty_nr(stat: &str) -> Option<i64> {
    crate::sys::procstat::StatLine::new(stat)?.num(7)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_session_only_for_a_pty_or_a_supervisor_on_a_terminal() {
        use CommandGroup::*;
        assert_eq!(CommandGroup::decide(false, false), Group);
        assert_eq!(CommandGroup::decide(false, true), Session { tty: false });
        assert_eq!(CommandGroup::decide(true, false), Session { tty: true });
        assert_eq!(CommandGroup::decide(true, true), Session { tty: true });
    }

    #[test]
    fn tty_nr_is_read_after_the_last_parenthesis() {
        let line = "42 (a) b) (c) S 1 42 42 34816 42 4194560 0";
        assert_eq!(tty_nr(line), Some(34816));
        assert_eq!(tty_nr("7 (x) S 1 7 7 0 -1 0"), Some(0));
        assert_eq!(tty_nr("7 (x) S 1 7"), None);
        assert_eq!(tty_nr("no parenthesis"), None);
    }

    #[test]
    fn the_field_agrees_with_what_dev_tty_gives_us() {
        // /dev/tty opens exactly when the calling process has a controlling terminal (ENXIO
        // otherwise): the test runner's answer either way must be the field's.
        match std::fs::File::open("/dev/tty") {
            Ok(_) => assert!(has_controlling_terminal()),
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                assert!(!has_controlling_terminal())
            }
            Err(e) => panic!("/dev/tty: {e}"),
        }
    }
}
