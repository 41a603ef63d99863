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
//! - RLIMIT_CORE = 0: no core dumps, which could leak memory contents into the workdir.

use crate::policy::Limits;

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
            soft: 0,
            hard: 0,
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
/// own hard limit is lower, we keep ours (the child can never exceed it either).
pub fn apply(limits: &[Rlimit]) -> Result<(), crate::sandbox::ChildError> {
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
            return Err(crate::sandbox::ChildError {
                step: crate::sandbox::Step::Rlimit,
                detail: l.resource as u8,
                errno: crate::sandbox::errno(),
            });
        }
    }
    Ok(())
}

/// The name of an rlimit resource number, for error messages.
pub fn name_of(resource: u8) -> &'static str {
    match u32::from(resource) {
        libc::RLIMIT_CORE => "core",
        libc::RLIMIT_NPROC => "nproc",
        libc::RLIMIT_NOFILE => "nofile",
        libc::RLIMIT_CPU => "cpu",
        libc::RLIMIT_AS => "as",
        libc::RLIMIT_FSIZE => "fsize",
        _ => "unknown",
    }
}
