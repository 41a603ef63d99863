//! Escapes between the execs of one `serve`, through the real binary against the test gateway:
//! - where an exec has neither its own PID namespace nor a cgroup (degraded), the end of one
//!   exec must not kill another, still running, exec's double-forked daemon;
//! - the process manager thread owns fork and wait, so while it is held the async workers keep
//!   streaming the running execs' output;
//! - an exec holds no capability in any set, the bounding set included, though it inherits
//!   the process-manager thread's bounding set emptied ahead, and the supervisor's other
//!   threads keep theirs.
//!
//! The first two need root and a binary built with `test-pause-points` (the degraded shape is
//! forced with its `OSB_TEST_DENY_PIDNS` / `OSB_TEST_DENY_CGROUP` knobs, the hold with a pause
//! point); the last needs root.

mod support;

use std::time::{Duration, Instant};

use openshell_sandbox::proto::v1::exec_sandbox_event::Payload;
use support::exec::exec_stream;
use support::{AuthMode, SupOpts, TestGateway, is_root, require, up};
use support::{PauseDir, kill, read_pid, require_pause_points, wait_until};

fn pair(k: &str, v: &str) -> (String, String) {
    (k.to_string(), v.to_string())
}

/// Alive and not a zombie.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rfind(')')
            .and_then(|i| s[i + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z"),
        Err(_) => false,
    }
}

/// Without a PID namespace and without a cgroup, a double-forked daemon used to be
/// re-parented to the supervisor (a subreaper), and every exec's end swept all such orphans:
/// exec B's `true` killed exec A's daemon while A was still running. Now the command is its
/// own exec's subreaper, so A's daemon stays A's child until A ends; A's own end still kills
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_degraded_execs_end_spares_another_running_execs_daemon() {
    if !require(
        is_root(),
        "root (the per-exec namespaces and cgroups are root's)",
    ) || !require_pause_points()
    {
        return;
    }
    let opts = SupOpts {
        env: vec![
            pair("OSB_TEST_DENY_PIDNS", "1"),
            pair("OSB_TEST_DENY_CGROUP", "1"),
        ],
        args: vec!["--allow-degraded".into()],
        ..SupOpts::default()
    };
    let (gw, sup) = up(AuthMode::Jwt, opts).await;
    // The shape this test is about: the exec shares the supervisor's PID namespace and pids
    // cgroup. (Otherwise it would pass for the wrong reason.)
    let sup_pidns = std::fs::read_link(format!("/proc/{}/ns/pid", sup.pid())).unwrap();
    let sup_cg = std::fs::read_to_string(format!("/proc/{}/cgroup", sup.pid())).unwrap();
    let probe = gw
        .sh("readlink /proc/self/ns/pid; grep -E ':pids:|^0::' /proc/self/cgroup")
        .await;
    assert_eq!(probe.exit, Some(0), "{probe:?}");
    let out = probe.out();
    let mut lines = out.lines();
    assert_eq!(
        lines.next().unwrap_or(""),
        sup_pidns.to_str().unwrap(),
        "the exec has its own PID namespace: the degraded path was not reached"
    );
    let cg_line = lines.next().unwrap_or("").to_string();
    assert!(
        sup_cg.lines().any(|l| l == cg_line),
        "the exec is in a cgroup of its own ({cg_line}): the degraded path was not reached"
    );

    let w = sup.workdir.clone();
    let pid_file = w.join("a.pid");
    let done = w.join("a.done");
    let script_a = format!(
        "(setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > {pid}); \
         while [ ! -e {done} ]; do sleep 0.05; done; echo a-ends",
        pid = pid_file.display(),
        done = done.display()
    );
    let st = gw.state.clone();
    let req_a = gw.request(&["sh", "-c", &script_a]);
    let a = tokio::spawn(async move { support::exec_collect(st, req_a).await });
    let daemon = read_pid(&pid_file, 30).unwrap_or(-1);
    let outcome = async {
        if daemon <= 0 {
            return Err("exec A's daemon never started".to_string());
        }
        let b = gw.sh("true").await;
        if b.exit != Some(0) {
            return Err(format!("exec B: {b:?}"));
        }
        // B's end (its kill sweep included) is over when its exit status arrives; give a
        // detached sweep a moment too.
        tokio::time::sleep(Duration::from_millis(500)).await;
        if !alive(daemon) {
            return Err(format!(
                "exec B's end killed exec A's daemon {daemon} while A was running"
            ));
        }
        std::fs::write(&done, b"").unwrap();
        Ok(())
    }
    .await;
    let a_res = if outcome.is_ok() {
        Some(tokio::time::timeout(Duration::from_secs(60), a).await)
    } else {
        std::fs::write(&done, b"").ok();
        None
    };
    let gone = outcome.is_ok() && wait_until(10, || !alive(daemon));
    kill(daemon);
    drop(sup);
    outcome.unwrap();
    let a_res = a_res.unwrap().expect("exec A timed out").unwrap();
    assert_eq!(a_res.exit, Some(0), "{a_res:?}");
    assert!(a_res.out().contains("a-ends"), "{a_res:?}");
    assert!(gone, "exec A's daemon {daemon} outlived exec A");
}

/// Receive stdout chunks of `rx` for `span`; returns how many arrived, and whether the exec
/// ended meanwhile.
async fn chunks_during(
    rx: &mut tokio::sync::mpsc::Receiver<
        Result<openshell_sandbox::proto::v1::ExecSandboxEvent, tonic::Status>,
    >,
    span: Duration,
) -> (usize, bool) {
    let end = tokio::time::Instant::now() + span;
    let mut n = 0;
    loop {
        match tokio::time::timeout_at(end, rx.recv()).await {
            Err(_) => return (n, false),
            Ok(None) => return (n, true),
            Ok(Some(ev)) => match ev.map(|e| e.payload) {
                Ok(Some(Payload::Stdout(_))) => n += 1,
                Ok(Some(Payload::Exit(_))) | Err(_) => return (n, true),
                Ok(_) => {}
            },
        }
    }
}

async fn held(pause: &PauseDir, point: &str, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if pause.dir.path().join(format!("{point}.reached")).exists() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

/// Release every pass of `point` until `stop` is set (the supervisor holds each pass).
fn auto_release(
    pause_dir: std::path::PathBuf,
    point: &'static str,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    std::thread::spawn(move || {
        let reached = pause_dir.join(format!("{point}.reached"));
        let go = pause_dir.join(format!("{point}.go"));
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            if reached.exists() && !go.exists() {
                let _ = std::fs::write(&go, b"");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    });
}

/// Fork, exec and wait happen on the one process-manager thread, never on the two
/// tokio workers. With that thread held at a spawn (and a second spawn queued behind it), a
/// running exec's output must keep streaming. Had the spawns run on the workers (as before),
/// the two held spawns would have stopped both workers and the stream with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_process_manager_leaves_running_execs_streaming() {
    if !require(is_root(), "root (the full sandbox)") || !require_pause_points() {
        return;
    }
    let pause = PauseDir::new();
    let opts = SupOpts {
        env: pause.env("manager-spawn"),
        ..SupOpts::default()
    };
    let gw: TestGateway;
    let sup;
    {
        // The supervisor's start-up spawns nothing, but the readiness wait may race a first
        // spawn: release any pass until the gateway sees it ready.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        auto_release(
            pause.dir.path().to_path_buf(),
            "manager-spawn",
            stop.clone(),
        );
        (gw, sup) = up(AuthMode::Jwt, opts).await;
        let warm = gw.sh("echo warm").await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(warm.exit, Some(0), "{warm:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _ = std::fs::remove_file(pause.dir.path().join("manager-spawn.go"));
    }
    // C prints a line every 50 ms for about 10 s.
    let mut c = exec_stream(
        gw.state.clone(),
        gw.request(&[
            "sh",
            "-c",
            "i=0; while [ $i -lt 200 ]; do echo $i; i=$((i+1)); sleep 0.05; done",
        ]),
    )
    .await
    .unwrap();
    assert!(
        held(&pause, "manager-spawn", Duration::from_secs(30)).await,
        "C's spawn never reached the manager"
    );
    pause.release("manager-spawn");
    let (first, ended) = chunks_during(&mut c, Duration::from_secs(5)).await;
    assert!(
        first > 0 && !ended,
        "C does not stream ({first}, ended {ended})"
    );

    // D's spawn holds the manager; E's waits behind it.
    let (st_d, st_e) = (gw.state.clone(), gw.state.clone());
    let (req_d, req_e) = (gw.request(&["true"]), gw.request(&["true"]));
    let d = tokio::spawn(async move { support::exec_collect(st_d, req_d).await });
    assert!(
        held(&pause, "manager-spawn", Duration::from_secs(30)).await,
        "D's spawn never reached the manager"
    );
    let e = tokio::spawn(async move { support::exec_collect(st_e, req_e).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (during, ended) = chunks_during(&mut c, Duration::from_millis(1500)).await;

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    auto_release(
        pause.dir.path().to_path_buf(),
        "manager-spawn",
        stop.clone(),
    );
    let d = tokio::time::timeout(Duration::from_secs(60), d).await;
    let e = tokio::time::timeout(Duration::from_secs(60), e).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    drop(sup);
    assert!(
        during >= 5 && !ended,
        "while the manager was held, C streamed {during} chunks in 1.5 s (ended {ended})"
    );
    let d = d.expect("D timed out").unwrap();
    let e = e.expect("E timed out").unwrap();
    assert_eq!(d.exit, Some(0), "{d:?}");
    assert_eq!(e.exit, Some(0), "{e:?}");
}

/// The `Cap*` and `NoNewPrivs` lines of a `/proc/.../status` text, as `key value`.
fn caps(status: &str) -> Vec<String> {
    status
        .lines()
        .filter(|l| l.starts_with("Cap") || l.starts_with("NoNewPrivs"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// Every exec's init is cloned from the process-manager thread, whose bounding set is emptied
/// once ahead (identity.rs `drop_bounding_set_ahead`), so the command's identity step only
/// reads each capability back. The command must still end with every set empty and
/// no_new_privs, and only that thread may have given its bounding set up: the supervisor's
/// main thread keeps the one it started with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_holds_no_capability_and_only_the_manager_thread_gave_its_bounding_set_up() {
    if !require(
        is_root(),
        "root (the identity switch and the bounding set are root's)",
    ) {
        return;
    }
    let (gw, sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    // Twice: the first exec starts the manager thread, the second is cloned from it as it
    // stands after its first jobs.
    for _ in 0..2 {
        let r = gw.sh("grep -E '^(Cap|NoNewPrivs)' /proc/self/status").await;
        assert_eq!(r.exit, Some(0), "{r:?}");
        assert_eq!(
            caps(&r.out()),
            [
                "CapInh: 0000000000000000",
                "CapPrm: 0000000000000000",
                "CapEff: 0000000000000000",
                "CapBnd: 0000000000000000",
                "CapAmb: 0000000000000000",
                "NoNewPrivs: 1",
            ],
            "{r:?}"
        );
    }
    let ours = caps(&std::fs::read_to_string("/proc/self/status").unwrap());
    let bnd = |c: &[String]| c.iter().find(|l| l.starts_with("CapBnd")).cloned();
    let main = caps(&std::fs::read_to_string(format!("/proc/{}/status", sup.pid())).unwrap());
    assert_eq!(
        bnd(&main),
        bnd(&ours),
        "the supervisor's main thread lost its bounding set"
    );
    let mut manager = None;
    for t in std::fs::read_dir(format!("/proc/{}/task", sup.pid())).unwrap() {
        let t = t.unwrap().path();
        let comm = std::fs::read_to_string(t.join("comm")).unwrap_or_default();
        if comm.trim() == "process-manager" {
            manager = Some(caps(&std::fs::read_to_string(t.join("status")).unwrap()));
        }
    }
    let manager = manager.expect("no process-manager thread in the supervisor");
    assert_eq!(
        bnd(&manager).as_deref(),
        Some("CapBnd: 0000000000000000"),
        "{manager:?}"
    );
    drop(sup);
}
