//! Liveness under attack: while sandboxed execs misbehave, the supervisor keeps its
//! gateway session alive, serves new execs, and keeps its own memory bounded; and many
//! concurrent execs each get exactly their own bytes, in order.
//!
//! Every time bound here is about liveness (a gap between heartbeats, a deadline that stops a
//! hung supervisor from hanging the run), never about speed.

mod support;

use std::time::{Duration, Instant};

use openshell_sandbox::proto::v1::exec_sandbox_event::Payload;
use sha2::{Digest, Sha256};
use support::*;
use tokio::sync::mpsc;

/// What we offer in SessionAccepted. The supervisor uses `max(offered, 5)` s.
const HEARTBEAT_SECS: u64 = 5;

/// How long each attack runs: the gateway drops the exec after this many seconds, which kills
/// its process tree. Long enough for several heartbeats.
const ATTACK_SECS: u32 = 30;

struct Attack {
    name: &'static str,
    done: tokio::task::JoinHandle<(Result<i32, tonic::Status>, u64)>,
}

/// Start an exec that runs `script` for at most ATTACK_SECS; its output is counted and
/// dropped. `slow` makes the reader pause regularly so the producer must be held back.
async fn attack(gw: &TestGateway, name: &'static str, script: &str, slow: bool) -> Attack {
    let mut req = gw.request(&["sh", "-c", script]);
    req.timeout_seconds = ATTACK_SECS;
    let mut rx = exec::exec_stream(gw.state.clone(), req)
        .await
        .unwrap_or_else(|e| panic!("starting {name}: {e:?}"));
    let done = tokio::spawn(async move {
        let (mut bytes, mut n) = (0u64, 0u64);
        while let Some(ev) = rx.recv().await {
            match ev {
                Err(s) => return (Err(s), bytes),
                Ok(ev) => match ev.payload {
                    Some(Payload::Stdout(d)) => bytes += d.data.len() as u64,
                    Some(Payload::Exit(e)) => return (Ok(e.exit_code), bytes),
                    _ => {}
                },
            }
            n += 1;
            if slow && n % 8 == 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        (
            Err(tonic::Status::internal("stream ended without exit")),
            bytes,
        )
    });
    Attack { name, done }
}

/// The largest gap between consecutive heartbeats seen within [from, to], counting the edges.
fn max_gap(beats: &[Instant], from: Instant, to: Instant) -> (Duration, usize) {
    let inside: Vec<Instant> = beats
        .iter()
        .copied()
        .filter(|t| *t >= from && *t <= to)
        .collect();
    let mut prev = beats
        .iter()
        .copied()
        .filter(|t| *t < from)
        .max()
        .unwrap_or(from);
    let mut gap = Duration::ZERO;
    for t in inside.iter().copied().chain(std::iter::once(to)) {
        gap = gap.max(t - prev);
        prev = t;
    }
    (gap, inside.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supervisor_stays_live_under_bombs_spin_and_flood() {
    if !require(
        is_root(),
        "root: the bombs are contained by the per-exec pids and memory cgroups a root supervisor creates",
    ) {
        return;
    }
    let gw = TestGateway::start(AuthMode::Jwt).await;
    gw.state
        .heartbeat_secs
        .store(HEARTBEAT_SECS as u32, std::sync::atomic::Ordering::SeqCst);
    // uid 0 with every capability dropped: RLIMIT_NPROC does not count root, so the fork bomb
    // is stopped by its own exec's pids cgroup alone and cannot starve the other execs' forks.
    let mut sup = Supervisor::start(
        &gw,
        SupOpts {
            args: [
                "--uid", "0", "--gid", "0", "--pids", "64", "--memory", "128MiB", "--shell",
                "plain",
            ]
            .map(String::from)
            .to_vec(),
            ..Default::default()
        },
    );
    gw.wait_ready(&mut sup).await;
    let warm = gw.sh("echo warm").await;
    assert_eq!(warm.exit, Some(0), "{warm:?}\n{}", sup.log());
    let baseline = sup.rss_kib();

    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let start = Instant::now();
    let attacks = vec![
        attack(
            &gw,
            "fork bomb",
            // Every process forks forever and shrugs off EAGAIN (dash would exit on it).
            "exec perl -e 'while (1) { defined(fork) or select(undef, undef, undef, 0.01) }'",
            false,
        )
        .await,
        attack(
            &gw,
            "memory bomb",
            "while :; do sh -c 'x=a; while :; do x=$x$x; done'; done",
            false,
        )
        .await,
        attack(
            &gw,
            "cpu spin",
            &format!("for i in $(seq {cores}); do (while :; do :; done) & done; wait"),
            false,
        )
        .await,
        attack(&gw, "1 GiB flood", "head -c 1073741824 /dev/zero", true).await,
    ];

    // Meanwhile: new execs must complete correctly, and the supervisor's RSS is sampled.
    let (mut served, mut peak) = (0u32, baseline);
    let window = Duration::from_secs(u64::from(ATTACK_SECS) - 2);
    while start.elapsed() < window {
        let r = gw.sh("echo hello").await;
        assert_eq!(
            (r.out(), r.exit),
            ("hello\n".to_string(), Some(0)),
            "an exec during the attack failed: {r:?}\n{}",
            sup.log()
        );
        served += 1;
        peak = peak.max(sup.rss_kib());
        assert!(
            sup.try_status().is_none(),
            "supervisor died:\n{}",
            sup.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let end = Instant::now();

    let mut outcomes = Vec::new();
    for a in attacks {
        let (res, bytes) = a.done.await.unwrap();
        eprintln!("{}: {res:?}, {bytes} bytes of stdout", a.name);
        outcomes.push((a.name, res, bytes));
    }
    peak = peak.max(sup.rss_kib());

    let beats = gw.state.seen().heartbeats;
    let (gap, count) = max_gap(&beats, start, end);
    let growth = peak.saturating_sub(baseline);
    eprintln!(
        "attack window {:?}: {served} execs served, {count} heartbeats, max gap {gap:?} (interval {HEARTBEAT_SECS} s), RSS baseline {baseline} KiB, peak {peak} KiB",
        end - start
    );
    assert!(
        gap <= Duration::from_secs(2 * HEARTBEAT_SECS),
        "heartbeat gap {gap:?} above twice the {HEARTBEAT_SECS} s interval\n{}",
        sup.log()
    );
    assert!(served >= 1);
    assert!(
        growth < 64 * 1024,
        "supervisor RSS grew by {growth} KiB under attack"
    );
    for (name, res, bytes) in &outcomes {
        // Each attack ends with an exit code (its own, or 124 from the gateway's timeout),
        // never a broken relay.
        let code = res
            .as_ref()
            .unwrap_or_else(|e| panic!("{name} ended without an exit: {e:?}"));
        if *name != "1 GiB flood" {
            // Endless by design: only the gateway's timeout (124) may end them, so they
            // were running for the whole window.
            assert_eq!(*code, 124, "{name} ended early\n{}", sup.log());
        }
        if *name == "1 GiB flood" {
            assert!(*bytes > 0, "the flood produced nothing");
            if *code == 0 {
                assert_eq!(*bytes, 1 << 30, "the flood exited 0 with missing bytes");
            } else {
                assert_eq!(*code, 124, "the flood neither completed nor timed out");
                assert!(*bytes < 1 << 30);
            }
        }
    }
    // After the attacks the supervisor is still fully usable.
    let r = gw.sh("echo hello").await;
    assert_eq!((r.out(), r.exit), ("hello\n".to_string(), Some(0)), "{r:?}");
    assert!(
        sup.try_status().is_none(),
        "supervisor died:\n{}",
        sup.log()
    );
}

const CONCURRENT: usize = 64;
const LINES: u64 = 20_000;

/// Park–Miller minimal standard generator: every product stays below 2^53, so awk's doubles
/// compute it exactly and the client can reproduce the stream.
fn expected(seed: u64) -> Vec<u8> {
    let mut x = seed;
    let mut out = Vec::new();
    for i in 0..LINES {
        x = x * 16807 % 2_147_483_647;
        out.extend_from_slice(format!("{i} {x}\n").as_bytes());
    }
    out
}

fn seed(i: usize) -> u64 {
    1 + i as u64 * 7_919_113
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_streams_arrive_whole_and_in_order() {
    let (gw, mut sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let (tx, mut rx) = mpsc::channel(CONCURRENT);
    for i in 0..CONCURRENT {
        // Each exec first checks in and waits (bounded) until all 64 have, so they truly run
        // at the same time; then prints its own seeded stream.
        let script = format!(
            "touch ready.{i}; n=0; \
             while [ $(ls ready.* | wc -l) -lt {CONCURRENT} ]; do \
               n=$((n+1)); [ $n -gt 1200 ] && exit 3; sleep 0.05; done; \
             awk -v s={s} -v n={LINES} 'BEGIN {{ x = s; for (i = 0; i < n; i++) {{ x = (x * 16807) % 2147483647; printf \"%d %d\\n\", i, x }} }}'",
            s = seed(i)
        );
        // Started one after another (each waits for its relay to be claimed) so the gateway's
        // limit on pending relays is never hit; they all run concurrently once started.
        let mut events = exec::exec_stream(gw.state.clone(), gw.request(&["sh", "-c", &script]))
            .await
            .unwrap_or_else(|e| panic!("exec {i}: {e:?}\n{}", sup.log()));
        let tx = tx.clone();
        tokio::spawn(async move {
            let (mut out, mut err, mut code) = (Vec::new(), Vec::new(), None);
            while let Some(ev) = events.recv().await {
                match ev.map(|e| e.payload) {
                    Ok(Some(Payload::Stdout(d))) => out.extend_from_slice(&d.data),
                    Ok(Some(Payload::Stderr(d))) => err.extend_from_slice(&d.data),
                    Ok(Some(Payload::Exit(e))) => {
                        code = Some(e.exit_code);
                        break;
                    }
                    Ok(_) => {}
                    Err(s) => {
                        err.extend_from_slice(s.message().as_bytes());
                        break;
                    }
                }
            }
            let _ = tx.send((i, out, err, code)).await;
        });
    }
    drop(tx);
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut done = vec![false; CONCURRENT];
    let mut total = 0usize;
    while let Some((i, out, err, code)) = tokio::time::timeout_at(deadline.into(), rx.recv())
        .await
        .unwrap_or_else(|_| panic!("execs still running after 600 s\n{}", sup.log()))
    {
        let err = String::from_utf8_lossy(&err);
        assert_eq!(code, Some(0), "exec {i}: stderr {err}\n{}", sup.log());
        let want = expected(seed(i));
        if out != want {
            let at = out.iter().zip(&want).position(|(a, b)| a != b);
            panic!(
                "exec {i}: got {} bytes (sha256 {}), want {} (sha256 {}); first difference at {at:?}",
                out.len(),
                hex::encode(Sha256::digest(&out)),
                want.len(),
                hex::encode(Sha256::digest(&want)),
            );
        }
        assert!(!done[i], "exec {i} reported twice");
        done[i] = true;
        total += out.len();
    }
    assert!(done.iter().all(|d| *d), "missing execs: {done:?}");
    eprintln!("{CONCURRENT} concurrent execs, {total} bytes, every stream whole and in order");
    assert!(
        sup.try_status().is_none(),
        "supervisor died:\n{}",
        sup.log()
    );
}
