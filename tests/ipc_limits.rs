//! The sandbox's IPC namespace is bounded by its `--shm-size` budget, through the real
//! binary: shared memory segments, message queues and semaphores past it are refused with the
//! kernel's own errno (EINVAL past `shmmax`, ENOSPC past `shmall` or `msgmni`), in `run`
//! (root and non-root) and in `serve`, where what one exec leaves stays for the next and is
//! charged to the sandbox's memory cgroup.

mod support;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::text;
use support::{AuthMode, SupOpts, up};
use support::{BIN, Workdir, require, require_root};

/// Python helpers for SysV IPC through libc: each call prints its result or `E<errno name>`.
const PY_IPC: &str = r#"
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
IPC_PRIVATE, IPC_CREAT = 0, 0o1000
def res(r):
    return "ok" if r >= 0 else "E" + errno.errorcode[ctypes.get_errno()]
def shm(mib, touch=True):
    ctypes.set_errno(0)
    i = libc.shmget(IPC_PRIVATE, ctypes.c_size_t(mib << 20), IPC_CREAT | 0o600)
    if i >= 0 and touch:
        a = libc.shmat(i, None, 0)
        ctypes.memset(a, 1, mib << 20)
        libc.shmdt(ctypes.c_void_p(a))
    return res(i)
def msgq():
    ctypes.set_errno(0)
    return res(libc.msgget(IPC_PRIVATE, IPC_CREAT | 0o600))
def sysctl(name):
    return open("/proc/sys/kernel/" + name).read().split()
"#;

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as u64 }
}

/// `run --shm-size 8MiB`, as `uid` (None: root): one 16 MiB segment is past shmmax (EINVAL);
/// of two 6 MiB segments the second is past shmall (ENOSPC); the namespace's sysctls are the
/// budget's; the third message queue is past msgmni (ENOSPC). Before the fix a new IPC
/// namespace kept the kernel's defaults (shmmax and shmall of 2^64, 32000 queues) and every
/// call succeeded.
fn budget_bounds_run(uid: Option<u32>) {
    let wd = Workdir::new();
    let code = format!(
        r#"{PY_IPC}
print("shmmax", sysctl("shmmax"), "shmall", sysctl("shmall"), "msgmni", sysctl("msgmni"))
print("16MiB", shm(16, touch=False))
print("6MiB", shm(6), "6MiB", shm(6))
print("msg", msgq(), msgq(), msgq())
"#
    );
    let mut c = Command::new(BIN);
    c.args(["run", "-q", "--shm-size", "8MiB", "--workdir"])
        .arg(wd.path())
        .args(["--", "python3", "-c", &code])
        .current_dir(wd.path());
    if let Some(u) = uid {
        c.uid(u).gid(u);
    }
    let out = c.output().unwrap();
    let (so, se) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{so}{se}");
    let pages = (8 << 20) / page_size();
    assert_eq!(
        so,
        format!(
            "shmmax ['8388608'] shmall ['{pages}'] msgmni ['2']\n16MiB EEINVAL\n6MiB ok 6MiB EENOSPC\nmsg ok ok EENOSPC\n"
        ),
        "{se}"
    );
}

#[test]
fn the_shm_budget_bounds_sysv_ipc_in_run() {
    if !require_root() {
        return;
    }
    budget_bounds_run(None);
}

/// A non-root supervisor may not write the limits of an IPC namespace its own user namespace
/// owns (root is unmapped there): it makes the IPC namespace in a user namespace of its own.
#[test]
fn the_shm_budget_bounds_sysv_ipc_under_a_non_root_supervisor() {
    if !require_root() {
        return;
    }
    let max: u64 = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    if !require(max > 0, "user namespaces (user.max_user_namespaces > 0)") {
        return;
    }
    budget_bounds_run(Some(65534));
}

/// The layer's row names the limits, so `check` and the report say what bounds the IPC
/// namespace.
#[test]
fn the_report_names_the_ipc_limits() {
    if !require_root() {
        return;
    }
    let r = support::run(&Workdir::new(), &["--shm-size", "8MiB"], &["true"]);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    let ipc = r.report["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["layer"] == "namespace-ipc")
        .cloned()
        .unwrap();
    assert_eq!(ipc["status"], "enforced", "{ipc}");
    let detail = ipc["detail"].as_str().unwrap();
    assert!(
        detail.contains("SysV limits from --shm-size 8 MiB: shared memory 8 MiB in all"),
        "{detail}"
    );
}

/// The memory cgroup base group of the supervisor `pid` (its `openshell-owned-PID-*`), on v1
/// or v2, and the hierarchical shmem counter's name there.
fn sandbox_memory_group(pid: u32) -> Option<(PathBuf, &'static str)> {
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let (root, own, key) =
        if let Some(l) = cg.lines().find(|l| l.split(':').nth(1) == Some("memory")) {
            (
                "/sys/fs/cgroup/memory",
                l.splitn(3, ':').nth(2)?,
                "total_shmem",
            )
        } else {
            let l = cg.lines().find(|l| l.starts_with("0::"))?;
            ("/sys/fs/cgroup", &l[3..], "shmem")
        };
    // The supervisor moved itself into a leaf below its group (v2), or made its base beside.
    let mut dir = Path::new(root).join(own.trim_start_matches('/'));
    for _ in 0..2 {
        let prefix = format!("openshell-owned-{pid}-");
        if let Some(e) = std::fs::read_dir(&dir)
            .ok()?
            .flatten()
            .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        {
            return Some((e.path(), key));
        }
        dir = dir.parent()?.to_path_buf();
    }
    None
}

fn shmem_bytes(group: &Path, key: &str) -> Option<u64> {
    std::fs::read_to_string(group.join("memory.stat"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

/// serve: the execs of one sandbox share its IPC namespace, so a segment one exec leaves stays
/// for the next (as in one container). Four execs each leave a touched 6 MiB segment under
/// `--shm-size 16MiB`: two fit, the third and fourth get ENOSPC, and the two that are left are
/// charged to the sandbox's memory cgroup. Without the budget all four would be made, and
/// segments left this way by four execs under `--memory 256MiB` held 800 MiB after they ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segments_left_by_execs_in_serve_stay_within_the_budget() {
    if !require_root() {
        return;
    }
    let (gw, sup) = up(
        AuthMode::Jwt,
        SupOpts {
            args: ["--shm-size", "16MiB", "--memory", "64MiB"]
                .map(String::from)
                .to_vec(),
            ..SupOpts::default()
        },
    )
    .await;
    let code = format!("{PY_IPC}\nprint(shm(6))\n");
    let mut got = Vec::new();
    for _ in 0..4 {
        let r = gw.exec(&["python3", "-c", &code]).await;
        assert_eq!(r.exit, Some(0), "{r:?}");
        got.push(r.out().trim().to_string());
    }
    assert_eq!(got, ["ok", "ok", "EENOSPC", "EENOSPC"]);
    let r = gw
        .exec(&["sh", "-c", "tail -n +2 /proc/sysvipc/shm | wc -l"])
        .await;
    assert_eq!(r.out().trim(), "2", "the two segments stay: {r:?}");
    // What is left is the sandbox's: charged to its memory cgroup (the groups of the execs
    // that touched it are gone; the charge stays with the sandbox's base group above them).
    let pid = sup.child.id();
    let Some((group, key)) = sandbox_memory_group(pid) else {
        assert!(
            require(false, "a memory cgroup for the supervisor's execs"),
            "unreachable"
        );
        return;
    };
    let shmem = shmem_bytes(&group, key).unwrap_or_else(|| panic!("{group:?}/memory.stat"));
    assert!(
        (12 << 20..=16 << 20).contains(&shmem),
        "{key} of {group:?}: {shmem} bytes"
    );
}
