//! The egress proxy against a direct connection to the same upstream, side by side in one
//! run (as root): connect + first byte p50, a 256 MiB download's throughput, the proxy's CPU
//! per GiB carried, and the proxy's memory per 1000 idle tunnels.
//!
//! Run: `cargo bench --bench egress` (`make bench` runs it with the others).
//!
//! The world is the egress tests': an outer network namespace made by this process with the
//! upstream address 192.88.99.10 on its `lo` and no route anywhere (checked), and a sandbox
//! namespace with the proxy's listener at 10.200.0.1:3128, made by `egress::netns::open_in`.
//! The client is this binary re-executed (`--client`), joining the sandbox's namespace for the
//! proxied side and staying in the outer one for the direct side (what `--network all` gives),
//! so both sides run the same code; the proxied side pays the real identity lookup. The proxy
//! runs on a runtime of its own (threads named `egress-proxy`), so its CPU is read apart from
//! the upstream's.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openshell_sandbox::egress::{self, PolicyHandle, ProxyConfig};
use openshell_sandbox::policy::network::NetworkRules;
use openshell_sandbox::policy::openshell::from_yaml;

const UPSTREAM: Ipv4Addr = Ipv4Addr::new(192, 88, 99, 10);
const ECHO: u16 = 9000;
const BULK: u16 = 9001;
const IDLE: u16 = 9002;
const BULK_BYTES: usize = 256 << 20;

// ---- the client (re-executed) ---------------------------------------------------------------

fn dial(proxied: bool, port: u16) -> TcpStream {
    if !proxied {
        let s = TcpStream::connect(SocketAddr::new(UPSTREAM.into(), port)).unwrap();
        s.set_nodelay(true).unwrap();
        return s;
    }
    let mut s = TcpStream::connect("10.200.0.1:3128").unwrap();
    s.set_nodelay(true).unwrap();
    write!(
        s,
        "CONNECT up.test:{port} HTTP/1.1\r\nHost: up.test:{port}\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            s.read(&mut b).unwrap(),
            1,
            "proxy closed: {}",
            String::from_utf8_lossy(&head)
        );
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

fn client(args: &[String]) {
    let proxied = args.get(1).map(String::as_str) == Some("proxy");
    match args[0].as_str() {
        "lat" => {
            let n: usize = args[2].parse().unwrap();
            for _ in 0..n {
                let t = Instant::now();
                let mut s = dial(proxied, ECHO);
                s.write_all(b"x").unwrap();
                let mut b = [0u8; 1];
                s.read_exact(&mut b).unwrap();
                println!("{}", t.elapsed().as_nanos());
            }
        }
        "bulk" => {
            let mut s = dial(proxied, BULK);
            let t = Instant::now();
            let mut buf = vec![0u8; 1 << 16];
            let mut total = 0usize;
            loop {
                let n = s.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                total += n;
            }
            println!("{} {}", t.elapsed().as_nanos(), total);
        }
        "idle" => {
            let n: usize = args[2].parse().unwrap();
            let held: Vec<TcpStream> = (0..n).map(|_| dial(true, IDLE)).collect();
            println!("READY {}", held.len());
            std::io::stdout().flush().unwrap();
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
        }
        other => panic!("client mode {other}"),
    }
}

// ---- the world --------------------------------------------------------------------------------

fn ns_ino(path: &str) -> u64 {
    let l = std::fs::read_link(path).unwrap();
    l.to_string_lossy()
        .trim_start_matches("net:[")
        .trim_end_matches(']')
        .parse()
        .unwrap()
}

fn client_cmd(inner: Option<&OwnedFd>, args: &[&str]) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.arg("--client").args(args);
    if let Some(fd) = inner {
        let fd = fd.as_raw_fd();
        // SAFETY: setns is a raw syscall on a descriptor that stays open until exec.
        unsafe {
            c.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    c
}

fn run_client(inner: Option<&OwnedFd>, args: &[&str]) -> String {
    let out = client_cmd(inner, args)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "client {args:?} failed");
    String::from_utf8(out.stdout).unwrap()
}

/// CPU seconds of this process's threads named `name`.
fn thread_cpu(name: &str) -> f64 {
    let mut ticks = 0.0;
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        let f: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, r)| r)
            .unwrap_or("")
            .split_whitespace()
            .collect();
        ticks += f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
            + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    }
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

async fn upstream() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let echo = tokio::net::TcpListener::bind((UPSTREAM, ECHO))
        .await
        .unwrap();
    let bulk = tokio::net::TcpListener::bind((UPSTREAM, BULK))
        .await
        .unwrap();
    let idle = tokio::net::TcpListener::bind((UPSTREAM, IDLE))
        .await
        .unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = echo.accept().await.unwrap();
            s.set_nodelay(true).unwrap();
            tokio::spawn(async move {
                let mut b = [0u8; 1];
                if s.read_exact(&mut b).await.is_ok() {
                    let _ = s.write_all(&b).await;
                }
            });
        }
    });
    tokio::spawn(async move {
        let chunk = vec![7u8; 1 << 20];
        loop {
            let (mut s, _) = bulk.accept().await.unwrap();
            let chunk = chunk.clone();
            tokio::spawn(async move {
                for _ in 0..BULK_BYTES / chunk.len() {
                    if s.write_all(&chunk).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    // Idle: held without a task or a buffer each, so that the memory measured is the proxy's.
    let mut held = Vec::new();
    loop {
        let (s, _) = idle.accept().await.unwrap();
        held.push(s);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--client") {
        return client(&args[1..]);
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: benches/egress.rs needs root (network namespaces)");
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    std::thread::spawn(move || world(quick)).join().unwrap();
}

fn world(quick: bool) {
    let host = ns_ino("/proc/self/ns/net");
    // SAFETY: unshare affects this thread only: the outer namespace.
    assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
    assert_ne!(ns_ino("/proc/thread-self/ns/net"), host);
    egress::netns::loopback_up().unwrap();
    egress::netns::add_loopback_address(UPSTREAM).unwrap();
    let route = std::fs::read_to_string("/proc/thread-self/net/route").unwrap();
    assert_eq!(
        route.lines().count(),
        1,
        "a route out of the bench's namespace: {route}"
    );
    let up_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("upstream")
        .enable_all()
        .build()
        .unwrap();
    up_rt.spawn(upstream());
    let proxy_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("egress-proxy")
        .enable_all()
        .build()
        .unwrap();
    let inner: OwnedFd = std::thread::spawn(|| {
        // SAFETY: unshare affects this short-lived thread only.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
        egress::netns::loopback_up().unwrap();
        OwnedFd::from(std::fs::File::open("/proc/thread-self/ns/net").unwrap())
    })
    .join()
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let hosts = tmp.path().join("hosts");
    std::fs::write(&hosts, "192.88.99.10 up.test\n").unwrap();
    let me = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
    let yaml = format!(
        "version: 1\nnetwork_policies:\n  bench:\n    endpoints: [{{host: up.test, ports: [{ECHO}, {BULK}, {IDLE}]}}]\n    binaries: [{{path: \"{}\"}}]\n",
        me.display()
    );
    let rules = NetworkRules::compile(&from_yaml(&yaml).unwrap().network_policies).unwrap();
    let socks = egress::netns::open_in(inner.as_fd(), egress::netns::PROXY_ADDR).unwrap();
    let identity = Arc::new(egress::procfs::ProcIdentity::new(inner.as_fd(), socks.diag).unwrap());
    let resolver = Arc::new(egress::SandboxResolver {
        hosts: Some(hosts),
        system: false,
    });
    let proxy = {
        let _g = proxy_rt.enter();
        struct Quiet;
        impl egress::EventSink for Quiet {
            fn emit(&self, _: &egress::NetEvent) {}
        }
        let cfg = ProxyConfig {
            max_connections: 4096,
            max_per_exec: 2048,
            ..ProxyConfig::default()
        };
        egress::Proxy::start(
            socks.listener,
            PolicyHandle::new(rules),
            identity,
            resolver,
            Arc::new(Quiet),
            cfg,
        )
        .unwrap()
    };
    std::thread::sleep(Duration::from_millis(200));

    // Connect + first byte: interleaved rounds.
    let (rounds, per) = if quick { (3, 50) } else { (7, 200) };
    let (mut direct, mut proxied) = (Vec::new(), Vec::new());
    let per_s = per.to_string();
    for _ in 0..rounds {
        for (side, v) in [("direct", &mut direct), ("proxy", &mut proxied)] {
            let inner = (side == "proxy").then_some(&inner);
            let out = run_client(inner, &["lat", side, &per_s]);
            v.extend(out.lines().map(|l| l.parse::<f64>().unwrap() / 1000.0));
        }
    }
    let (d50, p50) = (median(&mut direct), median(&mut proxied));
    println!(
        "connect + first byte p50: direct {d50:.0} µs, proxied {p50:.0} µs, overhead {:.0} µs ({} samples each)",
        p50 - d50,
        direct.len()
    );

    // 256 MiB downloads, interleaved; the proxy's CPU read around its own runs.
    let runs = if quick { 2 } else { 5 };
    let (mut dt, mut pt, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let out = run_client(None, &["bulk", "direct"]);
        let f: Vec<f64> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
        assert_eq!(f[1] as usize, BULK_BYTES);
        dt.push(f[0] / 1e9);
        let c0 = thread_cpu("egress-proxy");
        let out = run_client(Some(&inner), &["bulk", "proxy"]);
        cpu.push(thread_cpu("egress-proxy") - c0);
        let f: Vec<f64> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
        assert_eq!(f[1] as usize, BULK_BYTES);
        pt.push(f[0] / 1e9);
    }
    let mib = (BULK_BYTES >> 20) as f64;
    let (dm, pm) = (median(&mut dt), median(&mut pt));
    println!(
        "256 MiB download: direct {:.0} MiB/s, proxied {:.0} MiB/s, ratio {:.2}; proxy CPU {:.2} s per GiB",
        mib / dm,
        mib / pm,
        dm / pm,
        median(&mut cpu) * 1024.0 / mib
    );

    // Idle tunnels.
    let n = 1000;
    std::thread::sleep(Duration::from_millis(500));
    let before = rss_kib();
    let mut holder = client_cmd(Some(&inner), &["idle", "proxy", &n.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), format!("READY {n}"));
    std::thread::sleep(Duration::from_secs(1));
    let open = proxy.open_connections();
    let after = rss_kib();
    drop(holder.stdin.take());
    holder.wait().unwrap();
    println!(
        "{n} idle tunnels ({open} open at the proxy): supervisor RSS +{:.1} MiB",
        (after.saturating_sub(before)) as f64 / 1024.0
    );
    proxy_rt.block_on(proxy.shutdown());
}
