//! Resource limits and containment, through the real binary: what `--memory`,
//! `--address-space`, `--pids`, `--cpu`, `--cpus`, `--file-size` and `--timeout` mean and the
//! reason each puts in the report, bombs (forks, memory, a spinning CPU) that end where the
//! limit says, nothing of an exec outliving it, and a non-root supervisor without a cgroup
//! saying so.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use support::{BIN, Workdir, py, require, require_root, run};

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

const FORK_BOMB: &str = r#"
import os, errno
kids, failed = 0, None
for i in range(5000):
    try:
        pid = os.fork()
    except OSError as e:
        failed = errno.errorcode[e.errno]
        break
    if pid == 0:
        import time; time.sleep(30); os._exit(0)
    kids += 1
print("forks", kids, "then", failed, flush=True)
"#;

// ---- --memory is resident memory, --address-space is RLIMIT_AS ----

#[test]
fn memory_limit_lets_v8_reserve_address_space() {
    if !require_root() || !require(have("node"), "node is installed") {
        return;
    }
    let wd = Workdir::new();
    let r = run(
        &wd,
        &["--memory", "512M"],
        &["node", "-e", "console.log(1)"],
    );
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert_eq!(r.stdout().trim(), "1");
    assert_eq!(r.reason(), "exited");
}

#[test]
fn address_space_is_its_own_flag() {
    let wd = Workdir::new();
    let code = "import resource; print(*resource.getrlimit(resource.RLIMIT_AS))";
    let r = py(&wd, &["--allow-degraded", "--address-space", "1G"], code);
    assert_eq!(r.stdout().trim(), "1073741824 1073741824", "{}", r.stderr());
    if require_root() {
        let r = py(&wd, &["--memory", "256M"], code);
        assert_eq!(r.stdout().trim(), "-1 -1", "{}", r.stderr());
    }
}

#[test]
fn memory_limit_reason_is_the_oom_kill_counter() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    // Four children of 80 MB each, one after the other, under 128M: the limit is reached
    // (page reclaim), nothing is OOM-killed, and the run exits 0.
    let r = py(
        &wd,
        &["--memory", "128M"],
        "import subprocess, sys\n\
         for i in range(4):\n    \
             subprocess.run([sys.executable, '-c', 'b = bytearray(80 << 20); print(len(b))'], check=True)\n\
         f = open('f', 'wb')\n\
         for i in range(200):\n    f.write(bytes(1 << 20))",
    );
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert_eq!(r.reason(), "exited", "{:?}", r.report);
    // A real bomb is OOM-killed: memory_limit.
    let r = py(
        &wd,
        &["--memory", "128M"],
        "import os\nchunks = []\nwhile True:\n    chunks.append(os.urandom(1 << 20))",
    );
    assert_eq!(r.reason(), "memory_limit", "{:?}\n{}", r.report, r.stderr());
}

#[test]
fn memory_bomb_is_contained() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let r = py(
        &wd,
        &["--memory", "256MiB"],
        "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))",
    );
    assert_ne!(r.code(), 0);
    assert_eq!(r.reason(), "memory_limit", "{:?}\n{}", r.report, r.stderr());
    assert!(
        r.stderr().contains("MemoryError") || r.report["signal"].is_number(),
        "{}",
        r.stderr()
    );
}

// ---- --pids is the whole exec, and is reported ----

#[test]
fn pids_limit_is_reported() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    // Fork until the pids cgroup says no (EAGAIN), then clean up and exit 0.
    let r = py(
        &wd,
        &["--pids", "16"],
        "import os, errno, signal\nkids = []\ntry:\n    while True:\n        pid = os.fork()\n        if pid == 0:\n            signal.pause()\n        kids.append(pid)\nexcept OSError as e:\n    assert e.errno == errno.EAGAIN, e\n    print('held at', len(kids))\nfor k in kids:\n    os.kill(k, 9)\n    os.waitpid(k, 0)",
    );
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert!(r.stdout().contains("held at"), "{}", r.stdout());
    assert_eq!(r.reason(), "pids_limit", "{:?}", r.report);
}

#[test]
fn fork_bomb_is_contained_as_nobody() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let r = py(&wd, &["--pids", "64"], FORK_BOMB);
    let line = r.stdout();
    assert!(line.contains("then EAGAIN"), "{line}\n{}", r.stderr());
    let n: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(n < 64, "{n} forks with --pids 64");
}

#[test]
fn fork_bomb_is_contained_when_the_target_uid_is_root() {
    if !require_root() {
        return;
    }
    // RLIMIT_NPROC is not enforced for uid 0; the exec's pids cgroup is what stops this.
    let wd = Workdir::new();
    // uid 0 runs without capabilities: its workdir must be its own, or `run` refuses it.
    std::os::unix::fs::chown(wd.path(), Some(0), Some(0)).unwrap();
    let r = py(&wd, &["--pids", "64", "--uid", "0"], FORK_BOMB);
    assert!(
        r.stdout().contains("then EAGAIN"),
        "{}\n{}",
        r.stdout(),
        r.stderr()
    );
    let n: usize = r
        .stdout()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(n < 64, "{n} forks with --pids 64 as uid 0");
    // And it was really root without capabilities.
    let r = py(
        &wd,
        &["--uid", "0"],
        "import os; print(os.getuid(), open('/proc/self/status').read().split('CapEff:\\t')[1].split()[0])",
    );
    assert_eq!(r.stdout().trim(), "0 0000000000000000");
}

// ---- --cpu is the whole tree, --cpus is a quota ----

#[test]
fn cpu_limit_covers_the_whole_tree() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let spin = "python3 -c 'while 1: pass'";
    let r = run(
        &wd,
        &["--cpu", "1", "--timeout", "60"],
        &["sh", "-c", &format!("{spin} & {spin} & wait")],
    );
    assert_eq!(r.reason(), "cpu_limit", "{:?}\n{}", r.report, r.stderr());
    let used = r.report["cgroup_cpu_ms"].as_u64().unwrap_or(u64::MAX);
    // Per process (RLIMIT_CPU) the two would have used 2 s; the poll may overrun a little.
    assert!((1000..1800).contains(&used), "tree used {used} ms of CPU");
}

#[test]
fn cpus_is_a_bandwidth_quota() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    // Spin for 2 s of wall time; a 0.2-CPU quota allows about 0.4 s of CPU in that time.
    let r = py(
        &wd,
        &["--cpus", "0.2"],
        "import time\nt = time.time()\nwhile time.time() - t < 2: pass\nprint(time.process_time())",
    );
    let cpu: f64 = r.stdout().trim().parse().unwrap_or(99.0);
    assert!(
        cpu < 0.8,
        "used {cpu} s of CPU in 2 s under --cpus 0.2; {}",
        r.stderr()
    );
}

#[test]
fn cpu_spin_is_stopped_with_reason_cpu_limit() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let r = run(&wd, &["--cpu", "1"], &["sh", "-c", "while :; do :; done"]);
    assert_eq!(r.reason(), "cpu_limit", "{:?}", r.report);
    assert_eq!(r.report["signal"], libc::SIGXCPU);
    assert_eq!(r.code(), 128 + libc::SIGXCPU);
}

// ---- --file-size is per file, --timeout is wall time ----

#[test]
fn file_size_limit_is_per_file_efbig() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let r = py(
        &wd,
        &["--file-size", "1MiB"],
        r#"
import errno, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
f = open("big", "wb")
try:
    f.write(b"x" * (2 << 20)); f.flush(); print("WROTE")
except OSError as e:
    print("write", errno.errorcode[e.errno])
"#,
    );
    assert!(
        r.stdout().contains("write EFBIG"),
        "{}\n{}",
        r.stdout(),
        r.stderr()
    );
}

#[test]
fn wall_timeout_kills_sleep_with_124() {
    let wd = Workdir::new();
    let r = run(
        &wd,
        &["--allow-degraded", "--timeout", "1"],
        &["sleep", "1000"],
    );
    assert_eq!(r.code(), 124, "{}", r.stderr());
    assert_eq!(r.reason(), "timeout");
    assert!(r.report["wall_ms"].as_u64().unwrap() < 60_000);
}

// ---- nothing of an exec outlives it; it runs in its own cgroups ----

#[test]
fn double_forked_daemon_does_not_survive() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    // Pids inside the run are its own PID namespace's: mark the daemon with a unique argv and
    // look for it in our /proc instead.
    let mark = format!("300.{}", std::process::id());
    let script = format!(
        "setsid sh -c 'sleep {mark} &' < /dev/null > /dev/null 2>&1 & sleep 0.3; echo started"
    );
    let r = run(&wd, &[], &["sh", "-c", &script]);
    assert_eq!(r.stdout().trim(), "started", "{}", r.stderr());
    let find = || {
        std::fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            (cmd == format!("sleep\0{mark}\0").as_bytes() && !is_zombie(pid)).then_some(pid)
        })
    };
    // The run has returned; give the kernel a moment to finish the kill it was sent.
    let mut alive = true;
    let mut pid = 0;
    for _ in 0..100 {
        match find() {
            Some(p) => pid = p,
            None => {
                alive = false;
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive, "daemon {pid} outlived its exec");
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(true)
}

#[test]
fn the_exec_joins_its_own_cgroups_as_a_whole_process() {
    if !require_root() {
        return;
    }
    // The child joins by moving its single thread (v1 `tasks`), which the kernel does without
    // the global threadgroup lock; check that the whole process, and what it forks, lands in
    // the per-exec group of every controller used.
    let wd = Workdir::new();
    let r = run(
        &wd,
        &["--pids", "64", "--memory", "256M"],
        &[
            "sh",
            "-c",
            "cat /proc/self/cgroup; sh -c 'cat /proc/self/cgroup'",
        ],
    );
    assert_eq!(r.code(), 0, "{}", r.stderr());
    let out = r.stdout();
    let lines: Vec<&str> = out.lines().collect();
    for ctrl in ["pids", "memory"] {
        // v1: the line of the hierarchy carrying the controller; v2: the unified `0::` line.
        let v1: Vec<&&str> = lines
            .iter()
            .filter(|l| {
                l.split(':')
                    .nth(1)
                    .is_some_and(|c| c.split(',').any(|x| x == ctrl))
            })
            .collect();
        let ours = if v1.is_empty() {
            lines.iter().filter(|l| l.starts_with("0::")).collect()
        } else {
            v1
        };
        assert!(!ours.is_empty(), "no {ctrl} line in\n{out}");
        for l in ours {
            assert!(
                l.contains("/openshell-owned-") && l.contains("/exec-"),
                "{ctrl}: not in a per-exec group: {l}\n{out}"
            );
        }
    }
}

// ---- without a cgroup, say so ----

fn run_as_nobody(wd: &Workdir, extra: &[&str], cmd: &[&str]) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    Command::new(BIN)
        .arg("run")
        .arg("--workdir")
        .arg(wd.path())
        .args(extra)
        .arg("--")
        .args(cmd)
        .current_dir(wd.path())
        .uid(65534)
        .gid(65534)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn non_root_defaults_run_and_explicit_limits_are_degraded() {
    if !require_root() {
        return; // root is needed to become the non-root caller
    }
    let wd = Workdir::new();
    let o = run_as_nobody(&wd, &["-v"], &["true"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("all layers enforced"), "{err}");
    for flag in [
        &["--pids", "16"][..],
        &["--memory", "64M"],
        &["--cpus", "0.5"],
        &["--cpu", "5"],
    ] {
        let o = run_as_nobody(&wd, flag, &["true"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{flag:?}: {err}");
        assert!(err.contains("--allow-degraded"), "{flag:?}: {err}");
        let mut with = flag.to_vec();
        with.push("--allow-degraded");
        let o = run_as_nobody(&wd, &with, &["true"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{flag:?}: {err}");
        assert!(err.contains("DEGRADED"), "{flag:?}: {err}");
    }
}
