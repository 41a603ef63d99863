//! The one place that waits for children.
//!
//! The supervisor is a child subreaper (and may be PID 1), so besides the execs it started it
//! inherits every orphan of their trees. A dedicated thread blocks in `waitid(P_ALL, WNOWAIT)`
//! to learn which child became a zombie without reaping it, then either delivers the status
//! and rusage to the exec that owns that pid or, for an orphan, simply reaps it.
//!
//! Registration and fork happen under the same lock, so a child that exits before its pid is
//! registered is still seen as an exec's child, never mistaken for an orphan.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use tokio::sync::oneshot;

/// Status and resource usage of a reaped child.
#[derive(Debug, Clone, Copy)]
pub struct Reaped {
    pub status: i32,
    pub rusage: libc::rusage,
}

#[derive(Default)]
struct State {
    waiting: HashMap<libc::pid_t, oneshot::Sender<Reaped>>,
    /// Children we started and have not reaped yet, so the thread knows when to block.
    live: usize,
}

pub struct Reaper {
    state: Mutex<State>,
    wake: Condvar,
}

static REAPER: OnceLock<Arc<Reaper>> = OnceLock::new();

/// The process-wide reaper, started on first use.
pub fn get() -> Arc<Reaper> {
    REAPER
        .get_or_init(|| {
            let r = Arc::new(Reaper {
                state: Mutex::new(State::default()),
                wake: Condvar::new(),
            });
            let thread_r = r.clone();
            std::thread::Builder::new()
                .name("reaper".into())
                .spawn(move || thread_r.run())
                .expect("spawning the reaper thread");
            r
        })
        .clone()
}

/// Held while forking: the reaper cannot look at the new pid before it is registered.
pub struct SpawnGuard<'a> {
    reaper: &'a Reaper,
    state: MutexGuard<'a, State>,
}

impl Reaper {
    pub fn lock(&self) -> SpawnGuard<'_> {
        SpawnGuard {
            reaper: self,
            state: self.state.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }

    fn run(&self) {
        loop {
            // Sleep while there is nothing to wait for: waitid would fail with ECHILD at once.
            // Orphans only exist while some exec's tree exists, so `live` covers them too.
            {
                let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                while st.live == 0 && !has_children() {
                    st = self.wake.wait(st).unwrap_or_else(|p| p.into_inner());
                }
            }
            // SAFETY: waitid fills a zeroed siginfo_t on our stack.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: valid pointer to `info`; WNOWAIT leaves the child a zombie.
            let rc =
                unsafe { libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOWAIT) };
            if rc != 0 {
                if crate::sandbox::errno() == libc::ECHILD {
                    let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                    if st.live == 0 {
                        st = self.wake.wait(st).unwrap_or_else(|p| p.into_inner());
                    }
                    drop(st);
                }
                continue;
            }
            // SAFETY: waitid succeeded with WEXITED, so si_pid is set.
            let pid = unsafe { info.si_pid() };
            if pid <= 0 {
                continue;
            }
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let mut status = 0;
            // SAFETY: rusage is plain data.
            let mut rusage: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: reaping the pid waitid just reported, with pointers to our stack.
            let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut rusage) };
            if r != pid {
                continue;
            }
            if let Some(tx) = st.waiting.remove(&pid) {
                st.live = st.live.saturating_sub(1);
                let _ = tx.send(Reaped { status, rusage });
            }
            // Otherwise an orphan re-parented to us: reaped, nothing else to do.
        }
    }
}

impl Reaper {
    /// Whether `pid` is the main process of a running exec (not an orphan).
    pub fn is_exec(&self, pid: libc::pid_t) -> bool {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .waiting
            .contains_key(&pid)
    }
}

impl SpawnGuard<'_> {
    /// Register a freshly forked child.
    pub fn register(mut self, pid: libc::pid_t) -> oneshot::Receiver<Reaped> {
        let (tx, rx) = oneshot::channel();
        self.state.waiting.insert(pid, tx);
        self.state.live += 1;
        drop(self.state);
        self.reaper.wake.notify_all();
        rx
    }
}

/// Whether any child of ours exists (zombie or alive), without reaping.
fn has_children() -> bool {
    // SAFETY: as above; WNOHANG makes this a poll.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer; WNOWAIT|WNOHANG neither reaps nor blocks.
    let rc = unsafe {
        libc::waitid(
            libc::P_ALL,
            0,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    rc == 0
}

/// Wake the reaper after an orphan may have appeared (e.g. after killing a tree).
pub fn nudge() {
    if let Some(r) = REAPER.get() {
        r.wake.notify_all();
    }
}
