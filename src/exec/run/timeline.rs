//! `OSB_RUN_TIMELINE`: when each stage of `run` ended, and the CPU spent up to then, for the
//! benches (benches/corpus.rs, benches/run.rs) to say where a run's time and CPU go. The
//! stamps are kept by sandbox/run_timeline.rs, where the sandbox's own steps (inside
//! `sandbox-new`) and those of the exec's init stamp too.

use std::io::Write;

use crate::sandbox::child::timeline as spawn_timeline;
use crate::sandbox::run_timeline as rt;

/// With `OSB_RUN_TIMELINE` set, `run` notes when each stage ended (CLOCK_MONOTONIC, the clock
/// std's `Instant` reads) and prints them on one stderr line at the end (`osb-timeline`),
/// then the CPU time up to each stamp (`osb-timeline-cpu`: this process's, all threads, and
/// that of its reaped children, in ns), then the init's steps while it made the view
/// (`osb-timeline-init`: when each ended, and the init's own CPU time then, in ns), then the
/// command's steps between the go and its exec (`osb-spawn-timeline`, as `serve` prints them:
/// ns after the go, sandbox/child/timeline.rs). The child never sees the variable: its
/// environment is built from scratch. Costs nothing when the variable is unset.
pub(super) struct Timeline {
    on: bool,
    spawn: Option<spawn_timeline::Stages>,
}

impl Timeline {
    pub(super) fn from_env() -> Timeline {
        let on = std::env::var_os("OSB_RUN_TIMELINE").is_some();
        if on {
            rt::enable();
            spawn_timeline::enable();
        }
        Timeline { on, spawn: None }
    }

    /// The command is about to be started: its steps are stamped from here.
    pub(super) fn spawn_begins(&mut self) {
        if self.on {
            spawn_timeline::begin();
        }
    }

    /// The command runs: its steps are read before anything else can stamp.
    pub(super) fn spawn_ended(&mut self) {
        if self.on {
            self.spawn = spawn_timeline::take();
        }
    }

    pub(super) fn stamp(&mut self, stage: &'static str) {
        if self.on {
            rt::stamp(stage);
        }
    }

    pub(super) fn print(&self) {
        if !self.on {
            return;
        }
        let v = rt::stamps();
        let wall: Vec<String> = v
            .iter()
            .map(|s| format!("{}={}", s.stage, s.wall))
            .collect();
        let cpu: Vec<String> = v
            .iter()
            .map(|s| format!("{}={},{}", s.stage, s.cpu_self, s.cpu_children))
            .collect();
        let init: Vec<String> = rt::init_marks()
            .iter()
            .map(|(m, wall, cpu)| format!("{}={wall},{cpu}", m.name()))
            .collect();
        let spawn = spawn_timeline::line(self.spawn.as_deref().unwrap_or_default());
        let _ = writeln!(
            std::io::stderr(),
            "osb-timeline {}\nosb-timeline-cpu {}\nosb-timeline-init {}\n{spawn}",
            wall.join(" "),
            cpu.join(" "),
            init.join(" ")
        );
    }
}
