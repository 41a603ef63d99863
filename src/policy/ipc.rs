//! The limits of the sandbox's IPC namespace, from one budget (`--shm-size`).
//!
//! A SysV object outlives the process that made it: a shared memory segment with no process
//! attached, a message queue, a semaphore set stay in their IPC namespace until it is gone.
//! In `run` that is the end of the run; in `serve` the view (and its IPC namespace) lives as
//! long as the sandbox, and a new IPC namespace starts with the kernel's defaults, which bound
//! nothing (shmall and shmmax of 2^64, 32000 queues). So every exec could leave up to its
//! `--memory` behind, and they added up. The budget bounds what all of them leave together:
//!
//! - shared memory segments: at most the budget in total (`shmall`, counted in pages of the
//!   segments' sizes, touched or not), none larger (`shmmax`);
//! - message queues: a quarter of the budget at their worst, counted as 1 MiB a queue (16384
//!   empty messages of 64 bytes each fill one `msgmnb` of 16 KiB);
//! - semaphores: a quarter of the budget at their worst (a set costs about 256 bytes, a
//!   semaphore 64, and allocation can round either up to twice that).
//!
//! The private /dev/shm tmpfs has the same size again, on its own: the kernel keeps the two
//! apart, so one budget covers both, each at most that much. Plain data: the caller writes
//! the values into the namespace's `/proc/sys/kernel`.

use serde::Serialize;

/// The kernel's defaults for a new IPC namespace, kept where they bound nothing by memory.
const MSGMAX: u64 = 8192;
const MSGMNB: u64 = 16384;
const SEMOPM: u64 = 500;
/// The kernel's ceiling on the number of objects of one kind (IPCMNI), and its defaults.
const SHMMNI: u64 = 4096;
const MSGMNI: u64 = 32000;
const SEMMNI: u64 = 32000;
const SEMMSL: u64 = 32000;
/// The worst memory of one message queue: `msgmnb` messages of no payload, 64 bytes each.
const MSG_QUEUE_WORST: u64 = 64 * MSGMNB;
/// Per semaphore set and per semaphore, at worst (see the module docs).
const SEM_SET_WORST: u64 = 1024;
const SEM_WORST: u64 = 256;

/// One IPC namespace's limits, each as the kernel's `/proc/sys/kernel` file takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct IpcLimits {
    /// The budget they come from, bytes.
    pub budget: u64,
    pub shmmax: u64,
    /// Pages.
    pub shmall: u64,
    pub shmmni: u64,
    pub msgmax: u64,
    pub msgmnb: u64,
    pub msgmni: u64,
    /// SEMMSL SEMMNS SEMOPM SEMMNI, the four fields of `kernel.sem`.
    pub sem: [u64; 4],
}

impl IpcLimits {
    /// The sysctl files in the order of [`IpcLimits::values`]: an index into this names the
    /// one that failed.
    pub const FILES: [&'static str; 7] = [
        "shmmax", "shmall", "shmmni", "msgmax", "msgmnb", "msgmni", "sem",
    ];

    /// The limits for `budget` bytes on a kernel with pages of `page_size` bytes. Every count
    /// is at least 1, so that a tiny budget still lets one small object be made.
    pub fn for_budget(budget: u64, page_size: u64) -> IpcLimits {
        let quarter = budget / 4;
        let shmall = (budget / page_size.max(1)).max(1);
        let semmns = (quarter / SEM_WORST).clamp(1, i32::MAX as u64);
        IpcLimits {
            budget,
            shmmax: budget,
            shmall,
            shmmni: shmall.min(SHMMNI),
            msgmax: MSGMAX,
            msgmnb: MSGMNB,
            msgmni: (quarter / MSG_QUEUE_WORST).clamp(1, MSGMNI),
            sem: [
                semmns.min(SEMMSL),
                semmns,
                SEMOPM,
                (quarter / SEM_SET_WORST).clamp(1, SEMMNI),
            ],
        }
    }

    /// What to write to each of [`IpcLimits::FILES`].
    pub fn values(&self) -> [String; 7] {
        let [msl, mns, opm, mni] = self.sem;
        [
            self.shmmax.to_string(),
            self.shmall.to_string(),
            self.shmmni.to_string(),
            self.msgmax.to_string(),
            self.msgmnb.to_string(),
            self.msgmni.to_string(),
            format!("{msl} {mns} {opm} {mni}"),
        ]
    }

    /// For the layer's detail: what the budget allows.
    pub fn describe(&self) -> String {
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        format!(
            "SysV limits from --shm-size {:.0} MiB: shared memory {:.0} MiB in all (shmall {} pages, shmmax {}, shmmni {}); {} message queues of {} bytes (msgmni, msgmnb); {} semaphores in at most {} sets (sem {} {} {} {})",
            mib(self.budget),
            mib(self.shmmax),
            self.shmall,
            self.shmmax,
            self.shmmni,
            self.msgmni,
            self.msgmnb,
            self.sem[1],
            self.sem[3],
            self.sem[0],
            self.sem[1],
            self.sem[2],
            self.sem[3],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_budget_bounds_every_kind() {
        let l = IpcLimits::for_budget(64 << 20, 4096);
        assert_eq!((l.shmmax, l.shmall, l.shmmni), (64 << 20, 16384, 4096));
        assert_eq!((l.msgmax, l.msgmnb, l.msgmni), (8192, 16384, 16));
        assert_eq!(l.sem, [32000, 65536, 500, 16384]);
        // The worst case of each kind stays within its share.
        assert!(l.msgmni * MSG_QUEUE_WORST <= l.budget / 4);
        assert!(l.sem[3] * 256 * 2 + l.sem[1] * 64 * 2 <= l.budget / 4);
        assert_eq!(
            l.values()[6],
            "32000 65536 500 16384",
            "kernel.sem takes its four fields in this order"
        );
    }

    #[test]
    fn a_tiny_budget_still_allows_one_object_of_each_kind() {
        let l = IpcLimits::for_budget(4096, 4096);
        assert_eq!((l.shmall, l.shmmni, l.msgmni), (1, 1, 1));
        assert_eq!(l.sem, [4, 4, 500, 1]);
        // Larger pages: shmall is counted in them.
        assert_eq!(IpcLimits::for_budget(1 << 20, 65536).shmall, 16);
    }

    #[test]
    fn a_huge_budget_stays_within_the_kernel_ceilings() {
        let l = IpcLimits::for_budget(1 << 50, 4096);
        assert_eq!((l.shmmni, l.msgmni, l.sem[3]), (4096, 32000, 32000));
        assert_eq!(l.sem[0], 32000);
        assert!(l.sem[1] <= i32::MAX as u64);
    }
}
