//! Limits, containment, output capping, normal work and bad input, through the real binary.

mod common;

use std::time::Duration;

use common::*;

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
fn large_output_is_capped_and_the_child_not_blocked() {
    let wd = Workdir::new();
    // 100 MiB to stdout; the child must run to completion (exit 7) despite the cap.
    let r = run(
        &wd,
        &["--allow-degraded", "--max-output", "1MiB"],
        &["sh", "-c", "head -c 104857600 /dev/zero; exit 7"],
    );
    assert_eq!(r.code(), 7, "{}", r.stderr());
    assert_eq!(r.report["stdout_bytes"], 104_857_600u64);
    assert_eq!(r.report["stdout_truncated"], true);
    assert_eq!(r.reason(), "output_limit");
    let out = &r.out.stdout;
    assert!(out.len() < (1 << 20) + 200, "{} bytes forwarded", out.len());
    let tail = String::from_utf8_lossy(&out[1 << 20..]);
    assert!(
        tail.contains("stdout truncated: 1048576 of 104857600 bytes"),
        "{tail}"
    );
}

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
fn normal_work_succeeds() {
    let wd = Workdir::new();
    let degraded: &[&str] = if is_root() {
        &[]
    } else {
        &["--allow-degraded"]
    };
    let r = run(
        &wd,
        degraded,
        &[
            "python3",
            "-c",
            "import json,hashlib; print(json.dumps({'sum': sum(range(10**6)), 'h': hashlib.sha256(b'x').hexdigest()[:8]}))",
        ],
    );
    assert_eq!(
        r.stdout().trim(),
        r#"{"sum": 499999500000, "h": "2d711642"}"#,
        "{}",
        r.stderr()
    );
    assert_eq!(r.code(), 0);
    let r = run(
        &wd,
        degraded,
        &[
            "sh",
            "-c",
            "seq 1 1000 | grep 7 | wc -l > count.txt && cat count.txt",
        ],
    );
    assert_eq!(r.stdout().trim(), "271", "{}", r.stderr());
    assert_eq!(r.reason(), "exited");
    let r = run(&wd, degraded, &["sh", "-c", "echo err >&2; exit 3"]);
    assert_eq!(r.code(), 3);
    assert_eq!(r.stderr().lines().next(), Some("err"));
    // Scratch: a fresh TMPDIR the child can write, gone afterwards.
    let r = run(
        &wd,
        &[&["--scratch"], degraded].concat(),
        &[
            "sh",
            "-c",
            "echo hi > \"$TMPDIR/t\" && cat \"$TMPDIR/t\" && echo $TMPDIR",
        ],
    );
    let lines: Vec<String> = r.stdout().lines().map(String::from).collect();
    assert_eq!(lines[0], "hi", "{}", r.stderr());
    assert!(
        !std::path::Path::new(&lines[1]).exists(),
        "scratch dir left behind"
    );
}

#[test]
fn exit_codes_mirror_the_child() {
    let wd = Workdir::new();
    let r = run(&wd, &["--allow-degraded"], &["sh", "-c", "kill -TERM $$"]);
    assert_eq!(r.code(), 128 + libc::SIGTERM);
    assert_eq!(r.reason(), "signaled");
    assert_eq!(r.report["signal"], libc::SIGTERM);
}

#[test]
fn bad_input_gets_a_clear_error_and_a_defined_code() {
    let wd = Workdir::new();
    let r = run(&wd, &["--allow-degraded"], &["no-such-command-xyz"]);
    assert_eq!(r.code(), 127);
    assert!(
        r.stderr()
            .contains("no-such-command-xyz: command not found"),
        "{}",
        r.stderr()
    );

    let cases: &[(&[&str], &str)] = &[
        (&["--workdir", "/no/such/dir"], "/no/such/dir"),
        (&["--memory", "-5"], "negative"),
        (&["--memory", "99999999999999999999999"], "64 bits"),
        (&["--pids", "0"], "at least 1"),
        (&["--timeout", "abc"], "not a number"),
        (&["--network", "maybe"], "maybe"),
        (&["--gid", "5"], "--gid was given without --uid"),
        (&["--env", "NOEQUALS"], "missing `=`"),
        (
            &["--inherit-env", "OPENSHELL_SANDBOX_TOKEN"],
            "never reach the sandbox",
        ),
    ];
    for (flags, needle) in cases {
        let out = std::process::Command::new(BIN)
            .arg("run")
            .args(*flags)
            .args(["--", "true"])
            .env_remove("OPENSHELL_SANDBOX_UID")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{flags:?}: {err}");
        assert!(
            err.contains(needle),
            "{flags:?}: expected {needle:?} in: {err}"
        );
    }
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
