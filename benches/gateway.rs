//! Supervisor benchmarks against the test gateway on loopback with mTLS (release build):
//! exec round trip of `true`, stdout throughput, idle RSS, process start → SessionAccepted,
//! attach latency to the `openshell-main` subsystem, policy change → applied at the next exec,
//! and the log-push overhead per exec (supervisor CPU with log push at INFO against ERROR).
//!
//! Run: `cargo bench --bench gateway` (add `-- --quick` for fewer iterations).
//!
//! Two narrower modes, for profiling (e.g. under `perf record -p <supervisor pid>`):
//! - `OSB_BENCH_THROUGHPUT=1`: only the 1 GiB stdout run, three times
//!   (`OSB_SUP_ENV=NAME=VALUE` adds one variable to the supervisor's environment);
//! - `OSB_BENCH_TIMELINE=1`: 30 execs of `true`, then the gateway's timestamps of the last one
//!   next to the supervisor's debug log of it (russh at debug), to see where the time goes;
//! - `OSB_BENCH_LOGPUSH=1`: only the log-push overhead (5 × 300 execs at each level).
//! - `OSB_BENCH_RSS=N`: only the supervisor's RSS after 100 execs and after N (10 000).

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use openshell_sandbox::proto::v1::PolicyStatus;
use openshell_sandbox::proto::v1::exec_sandbox_event::Payload;
use support::connect::Attacher;
use support::plane::SANDBOX_NAME;
use support::*;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn start_to_accepted(runs: usize) -> Vec<Duration> {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let mut out = Vec::new();
    for _ in 0..runs {
        let t0 = Instant::now();
        let mut sup = Supervisor::start(&gw, SupOpts::default());
        gw.wait_ready(&mut sup).await;
        out.push(t0.elapsed());
        drop(sup);
        // Let the gateway notice the session ended before the next start.
        while gw.state.is_ready() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    out.sort();
    out
}

async fn round_trips(gw: &TestGateway, n: usize, extra: &[&str]) -> Vec<Duration> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let mut argv = vec!["true"];
        argv.extend_from_slice(extra);
        let t0 = Instant::now();
        let r = gw.exec(&argv).await;
        v.push(t0.elapsed());
        assert_eq!(r.exit, Some(0), "{r:?}");
    }
    v.sort();
    v
}

/// CPU seconds (user + system) used so far by `pid`, from /proc.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the ")" that closes the command name: utime is the 12th, stime the 13th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no memory-safety preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

struct Throughput {
    mbps: f64,
    supervisor_cpu: f64,
    gateway_cpu: f64,
    wall: f64,
}

/// Where an exec's time goes: relay open (RelayOpen → RelayStream claimed), SSH handshake and
/// auth, then channel + exec of `true` + exit status.
async fn breakdown(gw: &TestGateway, n: usize) -> [Duration; 3] {
    use openshell_sandbox::proto::v1::{SshRelayTarget, relay_open};
    let (mut relay, mut ssh, mut run) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        let t0 = Instant::now();
        let r = gw
            .state
            .open_relay(Some(relay_open::Target::Ssh(SshRelayTarget {})))
            .await
            .unwrap();
        let t1 = Instant::now();
        let h = exec::ssh_connect(gateway::bridge(r)).await.unwrap();
        let t2 = Instant::now();
        let mut ch = h.channel_open_session().await.unwrap();
        ch.exec(true, &b"true"[..]).await.unwrap();
        ch.eof().await.unwrap();
        while let Some(m) = ch.wait().await {
            if matches!(m, russh::ChannelMsg::ExitStatus { .. }) {
                break;
            }
        }
        let t3 = Instant::now();
        relay.push(t1 - t0);
        ssh.push(t2 - t1);
        run.push(t3 - t2);
    }
    for v in [&mut relay, &mut ssh, &mut run] {
        v.sort();
    }
    [
        percentile(&relay, 0.5),
        percentile(&ssh, 0.5),
        percentile(&run, 0.5),
    ]
}

async fn throughput(gw: &TestGateway, sup: &Supervisor, bytes: u64) -> Throughput {
    let (s0, g0) = (cpu_secs(sup.pid()), cpu_secs(std::process::id()));
    let req = gw.request(&["head", "-c", &bytes.to_string(), "/dev/zero"]);
    let t0 = Instant::now();
    let mut got = 0u64;
    let code = exec_each(gw.state.clone(), req, |p| {
        if let Payload::Stdout(d) = p {
            got += d.data.len() as u64;
        }
    })
    .await
    .unwrap();
    let secs = t0.elapsed().as_secs_f64();
    assert_eq!((code, got), (0, bytes));
    Throughput {
        mbps: bytes as f64 / secs / 1e6,
        supervisor_cpu: cpu_secs(sup.pid()) - s0,
        gateway_cpu: cpu_secs(std::process::id()) - g0,
        wall: secs,
    }
}

/// A tty main process that prints a marker once, then waits: each attach replays the marker.
const MAIN_MARKER: &str = "MAIN-READY";

/// Attach to `openshell-main` (ForwardTcp, SSH handshake, session channel, pty-req, subsystem
/// request) until the replayed marker arrives, `n` times; each attacher leaves again.
async fn attach_latency(n: usize) -> Vec<Duration> {
    let spec = serde_json::json!({
        "version": 1,
        "command": ["sh", "-c", format!("echo {MAIN_MARKER}; exec sleep 100000")],
        "tty": true,
    });
    let (gw, mut sup) = up(
        AuthMode::Jwt,
        SupOpts {
            env: vec![("OPENSHELL_MAIN_PROCESS_SPEC".into(), spec.to_string())],
            ..Default::default()
        },
    )
    .await;
    let mut v = Vec::with_capacity(n);
    for i in 0..n + 3 {
        let t0 = Instant::now();
        let mut a = Attacher::attach(&gw.state, Some((80, 24)), false)
            .await
            .unwrap();
        a.wait_out(MAIN_MARKER, Duration::from_secs(20)).await;
        let took = t0.elapsed();
        // Ctrl-P Ctrl-Q: a clean detach, so the next attacher gets the lease.
        a.send(b"\x10\x11").await;
        a.wait_closed(Duration::from_secs(20)).await;
        if i >= 3 {
            v.push(took);
        }
    }
    assert!(sup.try_status().is_none(), "{}", sup.log());
    v.sort();
    v
}

fn plane_opts(poll_secs: u32, push_level: &str) -> SupOpts {
    SupOpts {
        env: vec![
            ("OPENSHELL_SANDBOX".into(), SANDBOX_NAME.into()),
            (
                "OPENSHELL_POLICY_POLL_INTERVAL_SECS".into(),
                poll_secs.to_string(),
            ),
            (
                "OPENSHELL_LOCAL_POLICY_PATH".into(),
                "/nonexistent/openshell/policy.yaml".into(),
            ),
            ("OPENSHELL_LOG_PUSH_LEVEL".into(), push_level.into()),
        ],
        ..Default::default()
    }
}

async fn wait_loaded(gw: &TestGateway, version: u32, sup: &Supervisor) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let reports = gw.state.policy_reports();
        if let Some(r) = reports.iter().rev().find(|r| r.version == version) {
            assert_eq!(r.status, PolicyStatus::Loaded as i32, "{r:?}");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no report of v{version}:\n{}",
            sup.log()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `policy set` of a revision that grants a directory → the first exec that reads a file in
/// it, with the poll at 1 s (the gateway has no push: the poll interval bounds the time).
/// Each run: (set → LOADED reported, set → applied at an exec). Needs root (Landlock as the
/// sandbox uid is what makes the grant visible).
async fn policy_to_next_exec(runs: usize) -> Vec<(Duration, Duration)> {
    let mut out = Vec::new();
    for _ in 0..runs {
        let gw = TestGateway::start(AuthMode::Jwt).await;
        let dir: PathBuf = gw.dir.path().join("granted");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("secret.txt"), "granted\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let secret = dir.join("secret.txt").display().to_string();
        let v1 = gw
            .state
            .set_policy(&support::plane::base_policy(&[]))
            .unwrap();
        let mut sup = Supervisor::start(&gw, plane_opts(1, "INFO"));
        gw.wait_ready(&mut sup).await;
        wait_loaded(&gw, v1, &sup).await;
        let r = gw.exec(&["cat", &secret]).await;
        assert_ne!(r.exit, Some(0), "readable before the grant: {r:?}");
        // Start at a random point of the poll cycle, as a user's `policy set` does.
        tokio::time::sleep(Duration::from_millis(rand::random::<u64>() % 1000)).await;
        let t0 = Instant::now();
        let v2 = gw
            .state
            .set_policy(&support::plane::base_policy(&[&dir]))
            .unwrap();
        let loaded = async {
            wait_loaded(&gw, v2, &sup).await;
            t0.elapsed()
        };
        let applied = async {
            loop {
                let r = gw.exec(&["cat", &secret]).await;
                if r.exit == Some(0) {
                    assert_eq!(r.out(), "granted\n");
                    return t0.elapsed();
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(30),
                    "never applied: {r:?}"
                );
            }
        };
        out.push(tokio::join!(loaded, applied));
    }
    out
}

/// Supervisor CPU per exec of `true`, with log push at `push_level` (INFO: the launch and
/// end OCSF records and the exec's INFO events are pushed; ERROR: nothing of an ordinary exec).
async fn cpu_per_exec_with_push(push_level: &str, n: usize) -> f64 {
    let (gw, sup) = up(AuthMode::Jwt, plane_opts(10, push_level)).await;
    for _ in 0..10 {
        gw.exec(&["true"]).await;
    }
    let c0 = cpu_secs(sup.pid());
    for _ in 0..n {
        let r = gw.exec(&["true"]).await;
        assert_eq!(r.exit, Some(0), "{r:?}");
    }
    // The last batch goes out within the push interval; its cost belongs to these execs.
    tokio::time::sleep(Duration::from_millis(700)).await;
    (cpu_secs(sup.pid()) - c0) / n as f64
}

/// INFO and ERROR interleaved, `rounds` of each, so a change in machine load hits both alike.
async fn log_push_overhead(rounds: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        off.push(cpu_per_exec_with_push("ERROR", n).await);
        on.push(cpu_per_exec_with_push("INFO", n).await);
    }
    on.sort_by(f64::total_cmp);
    off.sort_by(f64::total_cmp);
    (on, off)
}

/// The supervisor's RSS after the first 100 execs of `true` (`--shell plain`) and after `n`
/// (target: within 1 MiB), with its peak: a leak per exec shows as the difference.
async fn rss_over_execs(n: usize) {
    let (gw, sup) = up(
        AuthMode::Jwt,
        SupOpts {
            args: vec!["--shell".into(), "plain".into()],
            ..Default::default()
        },
    )
    .await;
    let t0 = Instant::now();
    let _ = round_trips(&gw, 100, &[]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after_100 = sup.rss_kib();
    let mut done = 100;
    while done < n {
        let k = (n - done).min(1000);
        let _ = round_trips(&gw, k, &[]).await;
        done += k;
        println!("  {done} execs: RSS {} KiB", sup.rss_kib());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after_n = sup.rss_kib();
    let peak = std::fs::read_to_string(format!("/proc/{}/status", sup.pid()))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .map_or_else(|| "?".into(), |v| v.trim().to_string());
    println!(
        "supervisor RSS after 100 execs {after_100} KiB, after {n} {after_n} KiB: {:+} KiB (target: within 1024 KiB); peak {peak}; {:.1} s",
        after_n as i64 - after_100 as i64,
        t0.elapsed().as_secs_f64()
    );
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if std::env::var_os("OSB_BENCH_THROUGHPUT").is_some() {
        rt.block_on(async {
            let env: Vec<(String, String)> = std::env::var("OSB_SUP_ENV")
                .ok()
                .and_then(|v| {
                    v.split_once('=')
                        .map(|(a, b)| (a.to_string(), b.to_string()))
                })
                .into_iter()
                .collect();
            let (gw, sup) = up(
                AuthMode::Jwt,
                SupOpts {
                    env,
                    ..Default::default()
                },
            )
            .await;
            for _ in 0..3 {
                let tp = throughput(&gw, &sup, 1 << 30).await;
                println!(
                    "{:.0} MB/s ({:.1} s wall; CPU: supervisor {:.2} s, test gateway {:.2} s)",
                    tp.mbps, tp.wall, tp.supervisor_cpu, tp.gateway_cpu
                );
            }
        });
        return;
    }
    if std::env::var_os("OSB_BENCH_LOGPUSH").is_some() {
        rt.block_on(async {
            let (on, off) = log_push_overhead(5, 300).await;
            let f = |v: &[f64]| {
                v.iter()
                    .map(|c| format!("{:.3}", c * 1e3))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            println!(
                "supervisor CPU per exec, ms: INFO {} / ERROR {}",
                f(&on),
                f(&off)
            );
            println!("median: {:+.1} %", (on[2] / off[2] - 1.0) * 100.0);
        });
        return;
    }
    if std::env::var_os("OSB_BENCH_TIMELINE").is_some() {
        rt.block_on(timeline());
        return;
    }
    if let Some(n) = std::env::var_os("OSB_BENCH_RSS") {
        let n: usize = n.to_str().and_then(|s| s.parse().ok()).unwrap_or(10_000);
        rt.block_on(rss_over_execs(n.max(200)));
        return;
    }
    rt.block_on(async {
        let starts = start_to_accepted(if quick { 3 } else { 10 }).await;

        let (gw, sup) = up(AuthMode::Jwt, SupOpts::default()).await;
        let n = if quick { 50 } else { 300 };
        let _ = round_trips(&gw, 10, &[]).await; // warm-up
        let rt_login = round_trips(&gw, n, &[]).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let idle_rss = sup.rss_kib();
        let gib = if quick { 256 << 20 } else { 1 << 30 };
        // Three transfers, reported by their median: the first one of a connection also pays
        // for HTTP/2's adaptive window growing and the allocator warming up.
        let mut tps = Vec::new();
        for _ in 0..3 {
            tps.push(throughput(&gw, &sup, gib).await);
        }
        let all: Vec<String> = tps.iter().map(|t| format!("{:.0}", t.mbps)).collect();
        tps.sort_by(|a, b| a.mbps.total_cmp(&b.mbps));
        let tp = &tps[1];
        drop(sup);

        let (gw2, _sup2) = up(
            AuthMode::Jwt,
            SupOpts { args: vec!["--shell".into(), "plain".into()], ..Default::default() },
        )
        .await;
        let _ = round_trips(&gw2, 10, &[]).await;
        let c0 = cpu_secs(_sup2.pid());
        let rt_plain = round_trips(&gw2, n, &[]).await;
        let cpu_per_exec = (cpu_secs(_sup2.pid()) - c0) / n as f64;
        let parts = breakdown(&gw2, n / 2).await;

        drop(gw2);
        drop(_sup2);

        let attach = attach_latency(if quick { 10 } else { 50 }).await;
        let plane = if is_root() {
            policy_to_next_exec(if quick { 2 } else { 5 }).await
        } else {
            Vec::new()
        };
        let (rounds, per) = if quick { (3, 50) } else { (5, 300) };
        let (push_on, push_off) = log_push_overhead(rounds, per).await;

        let root = if is_root() { "root, full sandbox" } else { "non-root, --allow-degraded" };
        println!();
        println!("openshell-sandbox gateway benchmark ({root}; test gateway on loopback, mTLS + JWT)");
        println!("| Measure | Result | Target |");
        println!("|---|---|---|");
        println!(
            "| exec round trip of `true` (bash -lc), p50 / p99 over {n} | {:.2} ms / {:.2} ms | p50 ≤ 5 ms |",
            ms(percentile(&rt_login, 0.5)),
            ms(percentile(&rt_login, 0.99))
        );
        println!(
            "| exec round trip of `true` (--shell plain, sh -c), p50 / p99 over {n} | {:.2} ms / {:.2} ms | p50 ≤ 5 ms |",
            ms(percentile(&rt_plain, 0.5)),
            ms(percentile(&rt_plain, 0.99))
        );
        println!(
            "| `true` (plain) split, p50: relay open / SSH handshake+auth / exec to exit-status; supervisor CPU per exec | {:.2} / {:.2} / {:.2} ms; {:.2} ms CPU | – |",
            ms(parts[0]),
            ms(parts[1]),
            ms(parts[2]),
            cpu_per_exec * 1000.0
        );
        println!(
            "| stdout throughput, {} MiB, median of 3 ({} MB/s) | {:.0} MB/s ({:.1} s wall; CPU: supervisor {:.1} s, test gateway {:.1} s) | ≥ 300 MB/s |",
            gib >> 20,
            all.join(", "),
            tp.mbps,
            tp.wall,
            tp.supervisor_cpu,
            tp.gateway_cpu
        );
        println!("| supervisor idle RSS | {:.1} MiB | ≤ 15 MiB |", idle_rss as f64 / 1024.0);
        println!(
            "| process start → SessionAccepted, median / max of {} | {:.1} ms / {:.1} ms | ≤ 100 ms |",
            starts.len(),
            ms(percentile(&starts, 0.5)),
            ms(*starts.last().unwrap())
        );
        println!(
            "| attach to `openshell-main` (ForwardTcp → replayed output), p50 / p99 over {} | {:.2} ms / {:.2} ms | – |",
            attach.len(),
            ms(percentile(&attach, 0.5)),
            ms(percentile(&attach, 0.99))
        );
        if plane.is_empty() {
            println!("| policy change → applied at the next exec | skipped: needs root | – |");
        } else {
            let f = |v: Vec<Duration>| {
                v.iter().map(|d| format!("{:.2}", d.as_secs_f64())).collect::<Vec<_>>().join(", ")
            };
            println!(
                "| policy change → LOADED reported / → applied at the next exec, poll 1 s, {} runs | {} s / {} s | within one poll interval |",
                plane.len(),
                f(plane.iter().map(|p| p.0).collect()),
                f(plane.iter().map(|p| p.1).collect())
            );
        }
        let mid = |v: &[f64]| v[v.len() / 2];
        let (on, off) = (mid(&push_on), mid(&push_off));
        println!(
            "| supervisor CPU per exec of `true`, log push INFO vs ERROR, median of {} × {per} interleaved | {:.2} ms vs {:.2} ms ({:+.1} %) | ≤ +10 % |",
            push_on.len(),
            on * 1e3,
            off * 1e3,
            (on / off - 1.0) * 100.0
        );
        drop(gw);
    });
}

fn stamp(label: &str) {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    println!(
        "GW {:>6}.{:06} {label}",
        t.as_secs() % 100_000,
        t.subsec_micros()
    );
}

async fn timeline() {
    use openshell_sandbox::proto::v1::{SshRelayTarget, relay_open};
    let (gw, sup) = up(
        AuthMode::Jwt,
        SupOpts {
            args: vec!["--shell".into(), "plain".into()],
            env: vec![(
                "RUST_LOG".into(),
                "openshell_sandbox=trace,russh=debug".into(),
            )],
            ..Default::default()
        },
    )
    .await;
    for i in 0..30 {
        let last = i == 29;
        if last {
            println!("--- last exec; supervisor log from here");
            std::fs::write(&sup.log_path, b"").unwrap();
            stamp("open_relay");
        }
        let r = gw
            .state
            .open_relay(Some(relay_open::Target::Ssh(SshRelayTarget {})))
            .await
            .unwrap();
        if last {
            stamp("relay claimed");
        }
        let h = exec::ssh_connect(gateway::bridge(r)).await.unwrap();
        if last {
            stamp("ssh connected + auth");
        }
        let mut ch = h.channel_open_session().await.unwrap();
        if last {
            stamp("channel open");
        }
        ch.exec(true, &b"true"[..]).await.unwrap();
        ch.eof().await.unwrap();
        if last {
            stamp("exec + eof sent");
        }
        while let Some(m) = ch.wait().await {
            if matches!(m, russh::ChannelMsg::ExitStatus { .. }) {
                break;
            }
        }
        if last {
            stamp("exit status");
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for l in sup.log().lines() {
        let t = l.get(17..26).unwrap_or("");
        println!(
            "SUP {t} {}",
            l.get(27..)
                .unwrap_or(l)
                .chars()
                .take(160)
                .collect::<String>()
        );
    }
}
