//! Supervisor benchmarks against the test gateway on loopback with mTLS (release build):
//! exec round trip of `true`, stdout throughput, idle RSS, and process start → SessionAccepted.
//!
//! Run: `cargo bench --bench gateway` (add `-- --quick` for fewer iterations).
//!
//! Two narrower modes, for profiling (e.g. under `perf record -p <supervisor pid>`):
//! - `OSB_BENCH_THROUGHPUT=1`: only the 1 GiB stdout run, three times
//!   (`OSB_SUP_ENV=NAME=VALUE` adds one variable to the supervisor's environment);
//! - `OSB_BENCH_TIMELINE=1`: 30 execs of `true`, then the gateway's timestamps of the last one
//!   next to the supervisor's debug log of it (russh at debug), to see where the time goes.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use openshell_sandbox::proto::v1::exec_sandbox_event::Payload;
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
    if std::env::var_os("OSB_BENCH_TIMELINE").is_some() {
        rt.block_on(timeline());
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
