//! `OSB_RUN_TIMELINE`: when each stage of `run` ended, and the CPU spent up to then, for the
//! benches (benches/corpus.rs, benches/run.rs) to say where a run's time and CPU go.

use std::io::Write;

/// With `OSB_RUN_TIMELINE` set, `run` notes when each stage ended (CLOCK_MONOTONIC, the clock
/// std's `Instant` reads) and prints them on one stderr line at the end (`osb-timeline`),
/// then the CPU time up to each stamp (`osb-timeline-cpu`: this process's, all threads, and
/// that of its reaped children, in ns). The child never sees the variable: its environment is
/// built from scratch. Costs nothing when the variable is unset.
pub(super) struct Timeline {
    stamps: Option<Vec<Stamp>>,
}

struct Stamp {
    stage: &'static str,
    wall: u64,
    cpu_self: u64,
    cpu_children: u64,
}

impl Timeline {
    pub(super) fn from_env() -> Timeline {
        Timeline {
            stamps: std::env::var_os("OSB_RUN_TIMELINE").map(|_| Vec::with_capacity(16)),
        }
    }

    pub(super) fn stamp(&mut self, stage: &'static str) {
        if let Some(v) = &mut self.stamps {
            v.push(Stamp {
                stage,
                wall: clock_ns(libc::CLOCK_MONOTONIC),
                cpu_self: clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID),
                cpu_children: children_cpu_ns(),
            });
        }
    }

    pub(super) fn print(&self) {
        if let Some(v) = &self.stamps {
            let wall: Vec<String> = v
                .iter()
                .map(|s| format!("{}={}", s.stage, s.wall))
                .collect();
            let cpu: Vec<String> = v
                .iter()
                .map(|s| format!("{}={},{}", s.stage, s.cpu_self, s.cpu_children))
                .collect();
            let _ = writeln!(
                std::io::stderr(),
                "osb-timeline {}\nosb-timeline-cpu {}",
                wall.join(" "),
                cpu.join(" ")
            );
        }
    }
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec on our stack.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn children_cpu_ns() -> u64 {
    // SAFETY: getrusage fills a zeroed struct on our stack.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
        ru
    };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    ns(ru.ru_utime) + ns(ru.ru_stime)
}
