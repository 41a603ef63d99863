//! Who is calling, when the sandbox changes while the proxy looks: races between the proxy's
//! reads of `/proc` and a hostile child, through the real binary (`run --policy`), made
//! certain with the supervisor's pause points (src/pause.rs): the test does the attacker's
//! part at the worst moment, every time. The world is tests/support/egress's (upstreams in a
//! test-made namespace with no route).

mod support;

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::egress::binary::*;
use support::egress::identity::*;
use support::egress::*;
use support::{PauseDir, require_pause_points};

const CURL: &str = "/usr/bin/curl";

/// Run `c` (a `run`, with `pause`'s environment) to its end, calling `on_hit(run_pid, n)`
/// each time the supervisor is held at `point` (n counts from 0) before letting it go on.
fn held(
    mut c: Command,
    pause: &PauseDir,
    point: &str,
    mut on_hit: impl FnMut(u32, usize),
) -> (Output, usize) {
    c.envs(pause.env(point));
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = c.spawn().unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let reached = pause.dir.path().join(format!("{point}.reached"));
    let go = pause.dir.path().join(format!("{point}.go"));
    let end = Instant::now() + Duration::from_secs(120);
    let mut hits = 0;
    loop {
        if let Ok(out) = rx.try_recv() {
            return (out.unwrap(), hits);
        }
        if Instant::now() > end {
            // SAFETY: kill of our own child's pid.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("the run did not finish");
        }
        if reached.exists() && !go.exists() {
            on_hit(pid, hits);
            hits += 1;
            pause.release(point);
            // The supervisor removes `.go`, then `.reached`: a hit is counted once.
            let settle = Instant::now() + Duration::from_secs(1);
            while (go.exists() || reached.exists()) && Instant::now() < settle {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Every process below `root` (host pids).
fn descendants(root: u32) -> Vec<u32> {
    let mut parent = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<u32>().ok())
        else {
            continue;
        };
        parent.push((pid, ppid));
    }
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        out.extend(parent.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    out.remove(0);
    out
}

/// The processes of the run `run_pid` running `exe`.
fn running(run_pid: u32, exe: &Path) -> Vec<u32> {
    descendants(run_pid)
        .into_iter()
        .filter(|p| std::fs::read_link(format!("/proc/{p}/exe")).is_ok_and(|e| e == exe))
        .collect()
}

/// The file that freezes and thaws the cgroup of `pid`, and the value that thaws it: the v1
/// freezer where there is one (as the supervisor chooses), else v2.
fn freeze_control(pid: u32) -> Option<(PathBuf, &'static str)> {
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mount = |v1: bool| {
        info.lines().find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let r: Vec<&str> = right.split(' ').collect();
            let ok = if v1 {
                r[0] == "cgroup" && r.get(2)?.split(',').any(|o| o == "freezer")
            } else {
                r[0] == "cgroup2"
            };
            ok.then(|| PathBuf::from(left.split(' ').nth(4).unwrap()))
        })
    };
    for line in cg.lines() {
        let mut f = line.splitn(3, ':');
        let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
        if ctl.split(',').any(|c| c == "freezer") {
            let dir = mount(true)?.join(path.trim_start_matches('/'));
            return Some((dir.join("freezer.state"), "THAWED"));
        }
    }
    let path = cg.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = mount(false)?.join(path.trim_start_matches('/'));
    Some((dir.join("cgroup.freeze"), "0"))
}

#[test]
fn a_sandbox_that_does_not_freeze_is_not_decided_on() {
    if !ready() || !require_pause_points() || !have_path(CURL) {
        return;
    }
    World::run(|w| {
        let work = workdir(w, &policy(&format!("      - path: {CURL}\n")));
        let pause = PauseDir::new();
        let c = run_command(w, &work, &[CURL, "-sS", "http://pub.test:8080/held"]);
        let mut thawed = 0;
        // Each time the proxy has frozen the exec's group, it is thawed again: the sandbox
        // does not stand still, as when one of its tasks is busy in the kernel (a long fsync)
        // and the freezer cannot stop it.
        let (out, hits) = held(c, &pause, "identity-freeze", |run_pid, _| {
            for p in running(run_pid, Path::new(CURL)) {
                if let Some((file, value)) = freeze_control(p) {
                    std::fs::write(&file, value).unwrap();
                    thawed += 1;
                }
            }
        });
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(thawed > 0, "no group to thaw\n{stderr}");
        let j = json_lines(&stdout);
        assert_eq!(j.len(), 1, "{stdout}\n{stderr}");
        assert_eq!(j[0]["error"], "policy_denied", "{}", j[0]);
        let r = j[0]["reason"].as_str().unwrap();
        assert!(
            r.starts_with("failed to resolve peer binary: socket inode ")
                && r.ends_with(": the sandbox could not be held still while its holders were read (its cgroups did not freeze within 100ms), so they cannot be accounted for"),
            "{r}"
        );
        // The first scan, and one after each pause of the retries.
        assert_eq!(hits, 5, "{stderr}");
        assert_eq!(w.upstream.total(), 0);
    });
}

/// A FIFO in the workdir that the parent of the connecting process blocks on: written, the
/// parent exits.
fn fifo(work: &Path) -> PathBuf {
    let f = work.join("go-away");
    let c = std::ffi::CString::new(f.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo and chmod (past the umask: the sandbox's uid reads it) of a new path.
    unsafe {
        assert_eq!(libc::mkfifo(c.as_ptr(), 0o666), 0);
        assert_eq!(libc::chmod(c.as_ptr(), 0o666), 0);
    }
    f
}

/// The process of the run `run_pid` whose pid in its own namespace is `ns_pid`.
fn host_pid(run_pid: u32, ns_pid: u32) -> u32 {
    descendants(run_pid)
        .into_iter()
        .find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/status")).is_ok_and(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("NSpid:"))
                    .and_then(|v| v.split_whitespace().last()?.parse::<u32>().ok())
                    == Some(ns_pid)
            })
        })
        .unwrap_or_else(|| panic!("no process {ns_pid} in the run"))
}

/// Make the parent (blocked on `fifo`) exit, and start `/usr/bin/sleep` at its pids (in the
/// sandbox's namespaces, those of `witness`, and in ours, which the supervisor reads): the
/// process the proxy is reading is no longer the parent, and its pid names an allowed binary.
fn replace_parent(run_pid: u32, work: &Path, fifo: &Path, witness: u32) -> u32 {
    let ppid: u32 = std::fs::read_to_string(work.join("ppid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let host = host_pid(run_pid, ppid);
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(fifo)
        {
            Ok(mut f) => {
                f.write_all(b"x\n").unwrap();
                break;
            }
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) && Instant::now() < end => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("the parent never waited on the FIFO: {e}"),
        }
    }
    let helper = work.join("reuse_pid");
    let out = Command::new(&helper)
        .arg(format!("/proc/{witness}/ns/net"))
        .arg(format!("/proc/{witness}/ns/pid"))
        .arg(ppid.to_string())
        .arg(host.to_string())
        .args(["/usr/bin/sleep", "5"])
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    let reused: u32 = line
        .strip_prefix("REUSED ")
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("{line} {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(reused, host);
    eprintln!("pid {ppid} of the sandbox, {host} here, is now /usr/bin/sleep");
    reused
}

/// `hostile reap ENV… /bin/sh -c '…'`: a shell (the parent) that writes its pid, starts
/// `hostile conn pub.test:8080` (the connecting process) and blocks on the FIFO; the reaper
/// above it waits for both.
fn parent_and_child(work: &Path, fifo: &Path, env: &[&str]) -> Vec<String> {
    let hostile = work.join("hostile");
    let script = format!(
        "echo $$ > {}; {} conn pub.test:8080 & read x < {}",
        work.join("ppid").display(),
        hostile.display(),
        fifo.display()
    );
    let mut v = vec![hostile.display().to_string(), "reap".into(), "env".into()];
    v.extend(env.iter().map(|s| s.to_string()));
    v.extend(["/bin/sh".into(), "-c".into(), script]);
    v
}

#[test]
fn a_parent_that_exits_while_it_is_read_is_not_taken_for_what_reuses_its_pid() {
    if !ready() || !require_pause_points() {
        return;
    }
    World::run(|w| {
        // A rule that admits what `sleep` runs. The connecting process's parent is a shell;
        // the attacker lets it exit just after the proxy read its pid, and an allowed binary
        // gets that pid before the proxy reads what it runs.
        let work = workdir(
            w,
            &policy(&format!("      - {{path: {SLEEP}, descendants: true}}\n")),
        );
        cc(&support_file("reuse_pid.c"), &work.join("reuse_pid"), &[]);
        let fifo = fifo(&work);
        let args = parent_and_child(&work, &fifo, &[]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let pause = PauseDir::new();
        let hostile = work.join("hostile");
        let mut stray = 0;
        let (out, hits) = held(
            run_command(w, &work, &args),
            &pause,
            "identity-ancestor",
            |run_pid, n| {
                if n == 0 {
                    let witness = running(run_pid, &hostile)[0];
                    stray = replace_parent(run_pid, &work, &fifo, witness);
                }
            },
        );
        support::kill(stray as i32);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(hits >= 1, "{stderr}");
        let a = answers(&stdout);
        assert_eq!(a.len(), 1, "{stdout}\n{stderr}");
        let r = reason(&a[0]);
        assert!(
            r.starts_with(&format!(
                "binary '{}' not allowed in policy 'holder' (ancestors: [],",
                hostile.display()
            )),
            "{r}\n{stderr}"
        );
        assert_eq!(w.upstream.total(), 0);
    });
}

#[test]
fn an_ancestor_that_exits_while_its_code_is_checked_is_not_vouched_for() {
    if !ready() || !require_pause_points() {
        return;
    }
    World::run(|w| {
        // The shell is allowed with what it runs, but this one was started with a preload of
        // the sandbox's: refused. The attacker lets it exit just before the proxy reads its
        // environment, and a clean process gets its pid.
        let sh = std::fs::canonicalize("/bin/sh").unwrap();
        let work = workdir(
            w,
            &policy(&format!(
                "      - {{path: {}, descendants: true}}\n",
                sh.display()
            )),
        );
        cc(&support_file("reuse_pid.c"), &work.join("reuse_pid"), &[]);
        let so = evil_so(&work);
        let fifo = fifo(&work);
        let preload = format!("LD_PRELOAD={}", so.display());
        let args = parent_and_child(&work, &fifo, &[&preload]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let pause = PauseDir::new();
        let hostile = work.join("hostile");
        let mut stray = 0;
        let (out, hits) = held(
            run_command(w, &work, &args),
            &pause,
            "identity-code",
            |run_pid, n| {
                if n == 0 {
                    let witness = running(run_pid, &hostile)[0];
                    stray = replace_parent(run_pid, &work, &fifo, witness);
                }
            },
        );
        support::kill(stray as i32);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(hits >= 1, "{stderr}");
        assert!(stderr.contains("injected"), "the preload ran: {stderr}");
        let a = answers(&stdout);
        assert_eq!(a.len(), 1, "{stdout}\n{stderr}");
        let r = reason(&a[0]);
        assert!(
            r.ends_with(&format!(
                "; '{}' may run code the sandbox could have written or chosen (it exited while its code was checked), which the rule admits only with allow_untrusted_code: true",
                sh.display()
            )),
            "{r}\n{stderr}"
        );
        assert_eq!(w.upstream.total(), 0);
    });
}

/// KNOWN GAP (SECURITY.md, "What a `binaries` rule is"): the holders are read after the proxy
/// accepted the connection, and a client writes before that. One that writes its whole
/// request, then lets go of the socket, leaves it to whoever holds it when the proxy looks:
/// here `sleep`, which inherited it. The pause makes certain what the client wins anyway but
/// on a loaded machine (its write and close take microseconds, the proxy's look at least a
/// scan). This asserts what happens today; closing it needs the holders when the connection
/// is made (SECURITY.md says how).
#[test]
fn known_gap_a_request_written_before_the_proxy_looks_is_the_holders() {
    if !ready() || !require_pause_points() {
        return;
    }
    World::run(|w| {
        let work = workdir(w, &policy(&format!("      - path: {SLEEP}\n")));
        let hostile = work.join("hostile");
        for (n, mode) in ["get", "connect"].into_iter().enumerate() {
            let h = hostile.to_str().unwrap();
            let args = [h, "reap", h, "drop", SLEEP, "pub.test:8080", mode];
            let pause = PauseDir::new();
            let (out, _) = held(
                run_command(w, &work, &args),
                &pause,
                "identity-scan",
                |run_pid, _| {
                    // Until the writer has let go: only the reaper runs `hostile` then.
                    let end = Instant::now() + Duration::from_secs(10);
                    while running(run_pid, &hostile).len() > 1 {
                        assert!(Instant::now() < end, "the writer never let go");
                        std::thread::sleep(Duration::from_millis(5));
                    }
                },
            );
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(stdout.trim(), "DROPPED", "{stderr}");
            assert!(
                stderr.contains(&format!("ALLOWED {SLEEP}(")),
                "{mode}: {stderr}"
            );
            assert_eq!(w.upstream.total(), n + 1, "{mode}: {stderr}");
            // Past the harness's capture: a known gap shows on every run.
            let _ = writeln!(
                std::io::stderr(),
                "KNOWN GAP [egress identity] a {mode} request written before the proxy looked, by a process the policy does not admit, reached the upstream as {SLEEP}'s"
            );
        }
    });
}
