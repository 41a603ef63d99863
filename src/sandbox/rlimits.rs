//! rlimits layer: per-exec resource limits, set in the child between fork and exec.
//!
//! What each one really guarantees (also in SECURITY.md):
//! - RLIMIT_CPU: CPU seconds of this process (user + system). SIGXCPU at the soft limit, SIGKILL
//!   one second later at the hard limit. Each process of the tree has its own budget, so it is
//!   only the fallback for `--cpu` when no cgroup accounts the whole tree (`sandbox::prepare`
//!   drops it otherwise, and reports the fallback degraded).
//! - RLIMIT_AS (`--address-space`, never `--memory`): virtual address space of each process,
//!   not resident memory. A process that maps more gets ENOMEM; V8, Go, JVMs and Wasm runtimes
//!   reserve far more than they touch.
//! - RLIMIT_NPROC: checked at fork against the number of processes of the *real uid* system
//!   wide, and never enforced for uid 0 or holders of CAP_SYS_RESOURCE/CAP_SYS_ADMIN. That is why
//!   the child runs as a non-root uid. When a per-exec pids cgroup exists it replaces this
//!   limit (see `sandbox::prepare`): exact per exec, and not a budget shared across execs.
//! - RLIMIT_FSIZE: the size one file may reach. SIGXFSZ is set to "ignore" in the child when
//!   this limit is set, so a write past it fails with EFBIG, which programs report, instead of
//!   killing them (a child may restore the signal). It does not bound the total written across
//!   files.
//! - RLIMIT_NOFILE: the highest fd number + 1 the process may open.
//! - RLIMIT_CORE = 1, soft and hard: no core dump leaves the sandbox with its memory. A core
//!   file needs at least a page (1 byte is below every format's minimum), and 1 is the value
//!   the kernel skips a `|helper` core_pattern for (its guard against a crashing helper
//!   recursing). 0 would not do: pipe helpers (systemd-coredump, apport) ignore the limit
//!   otherwise, so a crash sent the child's memory to a root process on the host. The hard
//!   limit is 1 too, so the command cannot raise it. A `@socket` core_pattern (Linux 6.16)
//!   ignores the limit altogether: for it, the supervisor's coredump_filter is 0 (see
//!   [`limit_core_contents`]), inherited by every child, and the command's read-only /proc
//!   keeps it from raising its own: such a dump holds registers and notes, no memory.

use crate::policy::Limits;

/// How the host handles core dumps, and what the supervisor could do about them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreDumps {
    /// The supervisor's hard RLIMIT_CORE: the child's can only be raised to 1 above it with
    /// CAP_SYS_RESOURCE.
    pub hard_limit: u64,
    /// The supervisor may raise a hard limit (root in the initial user namespace).
    pub can_raise: bool,
    pub pattern: CorePattern,
    /// The supervisor's coredump_filter is 0 (see [`limit_core_contents`]).
    pub contents_filtered: bool,
}

/// The kind of `kernel.core_pattern`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CorePattern {
    /// A file name (relative ones land in the crashing process's cwd).
    File,
    /// `|helper`: a program run as root in the initial namespaces, the dump on its stdin.
    Pipe,
    /// `@path` or `@@path`: a unix socket in the initial mount namespace.
    Socket,
}

impl CorePattern {
    pub fn of(pattern: &str) -> CorePattern {
        match pattern.trim_start().as_bytes().first() {
            Some(b'|') => CorePattern::Pipe,
            Some(b'@') => CorePattern::Socket,
            _ => CorePattern::File,
        }
    }
}

impl CoreDumps {
    /// Why a sandboxed crash could still hand memory or a dump to the host, if it can.
    pub fn gap(&self) -> Option<String> {
        let one = self.hard_limit >= 1 || self.can_raise;
        match self.pattern {
            CorePattern::Pipe if !one => Some(format!(
                "the supervisor's hard RLIMIT_CORE is 0 and it cannot raise it to 1, so a crash \
                 still starts the core_pattern helper{}",
                if self.contents_filtered {
                    " (with a dump of registers and notes only: coredump_filter 0)"
                } else {
                    ", memory and all"
                }
            )),
            CorePattern::Socket if !self.contents_filtered => Some(
                "the core_pattern socket ignores RLIMIT_CORE and the supervisor could not set \
                 its coredump_filter to 0: a crash sends its memory to the socket"
                    .into(),
            ),
            _ => None,
        }
    }
}

/// Set this process's coredump_filter to 0: from now on every process it forks, and what
/// those exec, dumps no memory segment at all (the filter is inherited on fork and kept across
/// execve), only registers and notes. That is what a `@socket` core_pattern gets from a
/// sandboxed crash, which RLIMIT_CORE does not stop. (The supervisor itself dumps nothing: it
/// is not dumpable, see `process::harden_supervisor`.) Idempotent: once the filter is 0 it is
/// only read, since a non-dumpable process may no longer write its own /proc files.
pub fn limit_core_contents() -> std::io::Result<()> {
    const FILTER: &str = "/proc/self/coredump_filter";
    let now = std::fs::read_to_string(FILTER)?;
    if u64::from_str_radix(now.trim(), 16) == Ok(0) {
        return Ok(());
    }
    std::fs::write(FILTER, "0")
}

/// The host's core dump setup as the supervisor sees it.
pub fn core_dumps(can_raise: bool, contents_filtered: bool) -> CoreDumps {
    let mut cur = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into our stack struct.
    unsafe { libc::getrlimit(libc::RLIMIT_CORE, &mut cur) };
    let pattern = std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap_or_default();
    CoreDumps {
        hard_limit: cur.rlim_max,
        can_raise,
        pattern: CorePattern::of(&pattern),
        contents_filtered,
    }
}

/// One prepared limit.
#[derive(Debug, Clone, Copy)]
pub struct Rlimit {
    pub resource: libc::__rlimit_resource_t,
    pub soft: u64,
    pub hard: u64,
    pub name: &'static str,
}

/// The limits to set, computed from the policy before fork.
pub fn prepare(limits: &Limits) -> Vec<Rlimit> {
    let mut v = vec![
        Rlimit {
            resource: libc::RLIMIT_CORE,
            soft: 1,
            hard: 1,
            name: "core",
        },
        Rlimit {
            resource: libc::RLIMIT_NPROC,
            soft: limits.pids,
            hard: limits.pids,
            name: "nproc",
        },
        Rlimit {
            resource: libc::RLIMIT_NOFILE,
            soft: limits.open_files,
            hard: limits.open_files,
            name: "nofile",
        },
    ];
    if let Some(cpu) = limits.cpu_secs {
        // The soft limit sends SIGXCPU, which a program may catch; the hard limit one second
        // later is SIGKILL, which it cannot.
        v.push(Rlimit {
            resource: libc::RLIMIT_CPU,
            soft: cpu,
            hard: cpu.saturating_add(1),
            name: "cpu",
        });
    }
    if let Some(mem) = limits.address_space_bytes {
        v.push(Rlimit {
            resource: libc::RLIMIT_AS,
            soft: mem,
            hard: mem,
            name: "as",
        });
    }
    if let Some(fsize) = limits.file_size_bytes {
        v.push(Rlimit {
            resource: libc::RLIMIT_FSIZE,
            soft: fsize,
            hard: fsize,
            name: "fsize",
        });
    }
    v
}

/// Apply prepared limits. Async-signal-safe. Lowering a limit needs no privilege; raising a
/// hard limit above the current one needs CAP_SYS_RESOURCE, so when we are not root and our
/// own hard limit is lower, we keep ours (the child can never exceed it either; for
/// RLIMIT_CORE, `CoreDumps::gap` says what a hard limit of 0 leaves open).
pub fn apply(limits: &[Rlimit]) -> Result<(), crate::sandbox::step::ChildError> {
    for l in limits {
        if l.resource == libc::RLIMIT_FSIZE {
            // SAFETY: sigaction-backed signal() is async-signal-safe; SIG_IGN survives execve.
            unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
        }
        let mut cur = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into our stack struct.
        unsafe { libc::getrlimit(l.resource, &mut cur) };
        let hard = l.hard.min(cur.rlim_max);
        let soft = l.soft.min(hard);
        let new = libc::rlimit {
            rlim_cur: soft,
            rlim_max: hard,
        };
        // SAFETY: setrlimit reads our stack struct.
        if unsafe { libc::setrlimit(l.resource, &new) } != 0 {
            return Err(crate::sandbox::step::ChildError {
                step: crate::sandbox::step::Step::Rlimit,
                detail: l.resource as u8,
                errno: crate::sys::errno(),
            });
        }
    }
    Ok(())
}
