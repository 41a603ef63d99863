//! `OSB_RUN_TIMELINE`'s stamps: when each step of a `run` ended, in the supervisor (with the
//! CPU spent up to then) and in the exec's init while it builds the view (child/view_init.rs),
//! for exec/run/timeline.rs to print and the benches to read. The sandbox's own steps stamp
//! here, below the exec layer that prints them.
//!
//! The supervisor's stamps go in a list behind a lock (only `run`'s one thread prepares). The
//! init's go in one shared anonymous page, mapped only when the timeline is on: the init is a
//! fork, and writes each mark with plain stores (CLOCK_MONOTONIC through the vDSO and its own
//! CPU clock: async-signal-safe, no allocation). Off, each stamp is one relaxed load.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

/// One step of the supervisor: when it ended, and the CPU spent up to then (this process's,
/// all threads, and that of its reaped children), in ns.
#[derive(Debug, Clone, Copy)]
pub struct Stamp {
    pub stage: &'static str,
    pub wall: u64,
    pub cpu_self: u64,
    pub cpu_children: u64,
}

/// The init's steps while it makes `run`'s view, in the order it passes them; each mark says
/// when its step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum InitMark {
    /// The init's first instruction after the clone (a fork of the supervisor).
    Start,
    /// Parent-death signal, the supervisor's pidfd checked, the exec's cgroup joined.
    Prologue,
    /// The mount tree made private (its copy of the supervisor's was made by the clone).
    Private,
    /// The view's root: the grants bound, the private tmpfs mounted, pivot_root.
    Root,
    /// The exec's /proc, the IPC limits, /proc read-only, the hostname.
    ProcUts,
    /// The Landlock rules of the directories only the view holds.
    Rules,
    /// The report sent: the init waits for the go from here.
    Reported,
    /// The go received (and the network namespace joined).
    Go,
}

impl InitMark {
    pub const ALL: [InitMark; 8] = [
        InitMark::Start,
        InitMark::Prologue,
        InitMark::Private,
        InitMark::Root,
        InitMark::ProcUts,
        InitMark::Rules,
        InitMark::Reported,
        InitMark::Go,
    ];

    pub fn name(self) -> &'static str {
        match self {
            InitMark::Start => "init-start",
            InitMark::Prologue => "init-prologue",
            InitMark::Private => "init-private",
            InitMark::Root => "init-root",
            InitMark::ProcUts => "init-proc-uts",
            InitMark::Rules => "init-rules",
            InitMark::Reported => "init-reported",
            InitMark::Go => "init-go",
        }
    }
}

/// Two slots per mark: the wall clock, then the init's CPU time.
const SLOTS: usize = InitMark::ALL.len() * 2;

/// The supervisor's stamps; `None` while the timeline is off.
static STAMPS: Mutex<Option<Vec<Stamp>>> = Mutex::new(None);
/// Whether the timeline is on: read before the lock, so that a stamp with it off is one
/// relaxed load and no lock.
static ON: AtomicBool = AtomicBool::new(false);
/// The init's page, or null while the timeline is off.
static PAGE: AtomicPtr<AtomicU64> = AtomicPtr::new(std::ptr::null_mut());

/// Turn the timeline on (once, before the init is cloned).
pub fn enable() {
    let mut s = STAMPS.lock().unwrap_or_else(|p| p.into_inner());
    if s.is_some() {
        return;
    }
    *s = Some(Vec::with_capacity(48));
    ON.store(true, Ordering::Release);
    if let Ok(p) = crate::sys::shared_page() {
        PAGE.store(p.as_ptr().cast(), Ordering::Release);
    }
}

/// Note that the supervisor's step `stage` ended now.
pub fn stamp(stage: &'static str) {
    if !ON.load(Ordering::Relaxed) {
        return;
    }
    let mut s = STAMPS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(v) = s.as_mut() {
        v.push(Stamp {
            stage,
            wall: clock_ns(libc::CLOCK_MONOTONIC),
            cpu_self: clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID),
            cpu_children: children_cpu_ns(),
        });
    }
}

/// The supervisor's stamps so far (empty while the timeline is off).
pub fn stamps() -> Vec<Stamp> {
    let s = STAMPS.lock().unwrap_or_else(|p| p.into_inner());
    s.clone().unwrap_or_default()
}

/// Note, in the init, that its step `m` ended now. Async-signal-safe: a load, two
/// `clock_gettime` and two stores.
#[inline]
pub fn init_mark(m: InitMark) {
    let p = PAGE.load(Ordering::Relaxed);
    if p.is_null() {
        return;
    }
    let (wall, cpu) = (
        clock_ns(libc::CLOCK_MONOTONIC),
        clock_ns(libc::CLOCK_THREAD_CPUTIME_ID),
    );
    // SAFETY: the page has SLOTS slots and is never unmapped.
    unsafe {
        (*p.add(m as usize * 2)).store(wall, Ordering::Relaxed);
        (*p.add(m as usize * 2 + 1)).store(cpu, Ordering::Relaxed);
    }
}

/// The init's marks: (mark, when, its CPU time then), for the marks it reached.
pub fn init_marks() -> Vec<(InitMark, u64, u64)> {
    let p = PAGE.load(Ordering::Acquire);
    if p.is_null() {
        return Vec::new();
    }
    InitMark::ALL
        .into_iter()
        .filter_map(|m| {
            // SAFETY: slots of the page mapped in `enable`.
            let (w, c) = unsafe {
                (
                    (*p.add(m as usize * 2)).load(Ordering::Relaxed),
                    (*p.add(m as usize * 2 + 1)).load(Ordering::Relaxed),
                )
            };
            (w != 0).then_some((m, w, c))
        })
        .collect()
}

const _: () = assert!(SLOTS * 8 <= 4096);

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
