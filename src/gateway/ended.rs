//! How a command the gateway started ended, and its exit code by the one rule.

use crate::exec::ExitInfo;

/// How an exec ended: the child's wait status, and whether our own timeout ended it.
#[derive(Debug, Clone, Copy)]
pub struct Ended {
    pub info: ExitInfo,
    pub timed_out: bool,
}

impl Ended {
    pub fn new(info: ExitInfo) -> Ended {
        Ended {
            info,
            timed_out: false,
        }
    }

    /// The exit code by the one rule ([`crate::exec::report::exit_code`]).
    pub fn code(&self) -> i32 {
        crate::exec::report::exit_code(&self.info, self.timed_out)
    }

    /// The code as an SSH `exit-status` (an unsigned number; no code the rule gives is
    /// negative, but a negative one must not wrap to a huge status).
    pub fn status(&self) -> u32 {
        self.code().max(0) as u32
    }
}
