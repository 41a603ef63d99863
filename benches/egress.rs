//! The egress proxy against a direct connection to the same upstream, side by side in one
//! run (as root): connect + first byte p50 (and through the least CONNECT relays one could
//! write, on tokio and on blocking threads, `egress_parts/yardstick.rs`: what any relay adds
//! here), a 256 MiB download's throughput (and through the
//! simplest relay one could write, as a yardstick), the proxy's CPU
//! per GiB carried, the whole machine's CPU per GiB on each side (and, when the direct side
//! keeps every core busy, the ratio the cores allow), and the proxy's memory per 1000 idle
//! tunnels. Then HTTPS through the
//! proxy's TLS interception against a `tls: skip` tunnel to the same TLS upstream
//! (`egress_parts/tls.rs`): a 256 MiB download, keep-alive request p50, the first request to
//! a host the proxy has no leaf for yet, and memory per 1000 open inspected tunnels.
//!
//! The proxy runs as `run` and `serve` run it: with the interceptor (a sandbox CA made at
//! start), so L4 CONNECTs are classified by their first bytes before they become raw tunnels.
//!
//! Run: `cargo bench --bench egress` (`make bench` runs it with the others); `-- --quick` for
//! fewer samples, `-- --latency-only` for the connect + first byte rounds alone,
//! `-- --download-only` for the 256 MiB downloads alone, `-- --lookup-only` for the identity
//! lookup alone (quick A/B of the lookup).
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

#[path = "egress_parts/tls.rs"]
mod tls;
#[path = "egress_parts/yardstick.rs"]
mod yardstick;
use openshell_sandbox::policy::network::NetworkRules;
use openshell_sandbox::policy::openshell::from_yaml;

const UPSTREAM: Ipv4Addr = Ipv4Addr::new(192, 88, 99, 10);
const ECHO: u16 = 9000;
const BULK: u16 = 9001;
const IDLE: u16 = 9002;
const BULK_BYTES: usize = 256 << 20;

// ---- the client (re-executed) ---------------------------------------------------------------

/// The second proxy, whose identity lookup is a given caller: the proxy's own cost apart.
const FIXED_PROXY: &str = "10.200.0.2:3128";

fn dial(proxied: bool, port: u16) -> TcpStream {
    dial_via(proxied.then_some("10.200.0.1:3128"), port)
}

fn dial_via(proxy: Option<&str>, port: u16) -> TcpStream {
    let Some(proxy) = proxy else {
        let s = TcpStream::connect(SocketAddr::new(UPSTREAM.into(), port)).unwrap();
        s.set_nodelay(true).unwrap();
        return s;
    };
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_nodelay(true).unwrap();
    // The head in one write, as curl sends it (the bench wrote it in five pieces, one segment
    // each with TCP_NODELAY, until session 11: BENCHMARKS.md).
    let head = format!("CONNECT up.test:{port} HTTP/1.1\r\nHost: up.test:{port}\r\n\r\n");
    s.write_all(head.as_bytes()).unwrap();
    // As a real client (curl) reads a response head: into a buffer, as much as has come
    // (the bench read it a byte at a time until session 9: BENCHMARKS.md). The upstreams
    // speak only after the client's first byte, so nothing follows the head.
    let mut head = Vec::new();
    let mut b = [0u8; 1024];
    while !head.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut b).unwrap();
        assert!(n > 0, "proxy closed: {}", String::from_utf8_lossy(&head));
        head.extend_from_slice(&b[..n]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

fn client(args: &[String]) {
    let via = match args.get(1).map(String::as_str) {
        Some("proxy") | Some("scan") | Some("frozen") => Some("10.200.0.1:3128"),
        Some("fixed") => Some(FIXED_PROXY),
        Some("yard") => Some(yardstick::ADDR),
        Some("tyard") => Some(yardstick::ASYNC_ADDR),
        Some("hyard") => Some(yardstick::HOP_ADDR),
        _ => None,
    };
    match args[0].as_str() {
        "lat" => {
            let n: usize = args[2].parse().unwrap();
            for _ in 0..n {
                let t = Instant::now();
                let mut s = dial_via(via, ECHO);
                s.write_all(b"x").unwrap();
                let mut b = [0u8; 1];
                s.read_exact(&mut b).unwrap();
                println!("{}", t.elapsed().as_nanos());
            }
        }
        "bulk" => {
            let mut s = dial_via(via, BULK);
            let t = Instant::now();
            // The client speaks first, as over any CONNECT the proxy classifies.
            s.write_all(b"x").unwrap();
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
            println!("READY {} {}", held.len(), held[0].local_addr().unwrap());
            std::io::stdout().flush().unwrap();
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
        }
        "tls" => tls::client(&args[1..]),
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
    run_client_in(inner, None, args)
}

/// [`run_client`], the client first moved into the v1 freezer group `group` if one is given
/// (as `run` and `serve` place an exec: each lookup then freezes and thaws it).
fn run_client_in(
    inner: Option<&OwnedFd>,
    group: Option<&std::path::Path>,
    args: &[&str],
) -> String {
    let mut c = client_cmd(inner, args);
    let procs = group.map(|g| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(g.join("cgroup.procs"))
            .unwrap()
    });
    if let Some(f) = &procs {
        let fd = f.as_raw_fd();
        // SAFETY: a raw write on a descriptor that stays open until the spawn returns; "0"
        // moves the writer, the child, into the group.
        unsafe {
            c.pre_exec(move || {
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let out = c.stderr(Stdio::inherit()).output().unwrap();
    assert!(out.status.success(), "client {args:?} failed");
    String::from_utf8(out.stdout).unwrap()
}

/// CPU seconds of this process's threads named `name`: (user, system).
fn thread_cpu_split(name: &str) -> (f64, f64) {
    let (mut user, mut sys) = (0.0, 0.0);
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
        user += f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        sys += f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    }
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (user / hz, sys / hz)
}

/// Busy CPU seconds of the whole machine since boot: every field of /proc/stat's `cpu` line
/// but idle and iowait (10 ms ticks: good to a few per cent over a download).
fn machine_busy() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let f: Vec<f64> = stat
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap())
        .collect();
    let busy: f64 = f.iter().take(8).sum::<f64>() - f[3] - f[4];
    // SAFETY: sysconf has no preconditions.
    busy / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// Events dropped: the bench measures the proxy, not the log.
struct Quiet;

impl egress::EventSink for Quiet {
    fn emit(&self, _: &egress::NetEvent) {}

    fn emit_l7(&self, _: &egress::L7Event) {}
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
                let mut b = [0u8; 1];
                if s.read_exact(&mut b).await.is_err() {
                    return;
                }
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
    let latency_only = args.iter().any(|a| a == "--latency-only");
    let download_only = args.iter().any(|a| a == "--download-only");
    set_subreaper(true);
    // The upstream's CA joins the system bundle, in a mount namespace of this process's own
    // (made while it has one thread), so that the proxy trusts it as it would any root.
    let (up_ca, up_tls) = tls::upstream_config();
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("bundle.pem");
    let mut b = std::fs::read_to_string(SYSTEM_BUNDLE).unwrap_or_default();
    b.push('\n');
    b.push_str(&up_ca);
    std::fs::write(&bundle, b).unwrap();
    std::fs::write(tmp.path().join("upstream-ca.pem"), &up_ca).unwrap();
    bind_over(&bundle, SYSTEM_BUNDLE);
    let dir = tmp.path().to_path_buf();
    std::thread::spawn(move || world(quick, (latency_only, download_only), &dir, up_tls))
        .join()
        .unwrap();
}

/// Make this process its orphans' subreaper, as `run` and `serve` make the supervisor (the
/// identity lookup then walks its descendants), or not (it reads all of /proc).
fn set_subreaper(on: bool) {
    // SAFETY: prctl with integer arguments.
    let r = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, on as libc::c_ulong, 0, 0, 0) };
    assert_eq!(r, 0);
}

const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Bind `src` over `dst` in a private mount namespace of this (still single-threaded) process.
fn bind_over(src: &std::path::Path, dst: &str) {
    use std::ffi::CString;
    let (s, d) = (
        CString::new(src.as_os_str().as_encoded_bytes()).unwrap(),
        CString::new(dst).unwrap(),
    );
    // SAFETY: raw syscalls on valid C strings; the process has one thread here.
    unsafe {
        assert_eq!(libc::unshare(libc::CLONE_NEWNS), 0);
        assert_eq!(
            libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null()
            ),
            0
        );
        assert_eq!(
            libc::mount(
                s.as_ptr(),
                d.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null()
            ),
            0,
            "{}",
            std::io::Error::last_os_error()
        );
    }
}

fn world(
    quick: bool,
    (latency_only, download_only): (bool, bool),
    dir: &std::path::Path,
    up_tls: Arc<rustls::ServerConfig>,
) {
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
    up_rt.spawn(tls::upstream(UPSTREAM, up_tls));
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
    let hosts = dir.join("hosts");
    let mut names = "192.88.99.10 up.test secure.bench raw.bench\n".to_string();
    for i in 0..tls::NEW_HOSTS {
        names.push_str(&format!("192.88.99.10 n{i}.new.bench\n"));
    }
    std::fs::write(&hosts, names).unwrap();
    let me = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
    let p = tls::TLS_PORT;
    let yaml = format!(
        "version: 1\nnetwork_policies:\n  bench:\n    endpoints:\n      - {{host: up.test, ports: [{ECHO}, {BULK}, {IDLE}]}}\n      - {{host: secure.bench, port: {p}}}\n      - {{host: raw.bench, port: {p}, tls: skip}}\n      - {{host: \"*.new.bench\", port: {p}}}\n    binaries: [{{path: \"{}\"}}]\n",
        me.display()
    );
    let rules = NetworkRules::compile(&from_yaml(&yaml).unwrap().network_policies).unwrap();
    let socks = egress::netns::open_in(inner.as_fd(), egress::netns::PROXY_ADDR).unwrap();
    let identity = Arc::new(egress::procfs::ProcIdentity::new(inner.as_fd(), socks.diag).unwrap());
    let lookup = identity.clone();
    let resolver = Arc::new(egress::SandboxResolver::new(Some(hosts.clone()), false));
    let proxy = {
        let _g = proxy_rt.enter();
        // As run and serve start it: the sandbox CA, the system roots upstream.
        let ca = Arc::new(egress::tls::SandboxCa::generate().unwrap());
        std::fs::write(dir.join("sandbox-ca.pem"), ca.cert_pem()).unwrap();
        let up = Arc::new(egress::tls::Upstream::system().unwrap());
        let counters = Arc::new(egress::Counters::default());
        let interceptor =
            egress::Interceptor::new(ca, up, egress::Credentials::default(), Arc::new(Quiet))
                .counted(counters.clone());
        let cfg = ProxyConfig {
            max_connections: 4096,
            max_per_exec: 2048,
            inspector: Some(Arc::new(interceptor)),
            counters,
            ..ProxyConfig::default()
        };
        egress::Proxy::start(
            socks.listener,
            PolicyHandle::new(rules.clone()),
            identity,
            resolver,
            Arc::new(Quiet),
            cfg,
        )
        .unwrap()
    };
    // The same proxy with the caller given: what the identity lookup (a scan of /proc for the
    // socket's owners) costs shows as the difference.
    let fixed = {
        let _g = proxy_rt.enter();
        let socks = egress::netns::open_in(inner.as_fd(), FIXED_PROXY.parse().unwrap()).unwrap();
        let caller = egress::Caller {
            pid: 1,
            exe: me.display().to_string(),
            ancestors: Vec::new(),
            cmdline_paths: Vec::new(),
            exec: egress::ExecKey(1),
            ..Default::default()
        };
        let ca = Arc::new(egress::tls::SandboxCa::generate().unwrap());
        let up = Arc::new(egress::tls::Upstream::system().unwrap());
        let interceptor =
            egress::Interceptor::new(ca, up, egress::Credentials::default(), Arc::new(Quiet));
        egress::Proxy::start(
            socks.listener,
            PolicyHandle::new(rules.clone()),
            Arc::new(egress::FixedCaller(caller)),
            Arc::new(egress::SandboxResolver::new(Some(hosts.clone()), false)),
            Arc::new(Quiet),
            ProxyConfig {
                inspector: Some(Arc::new(interceptor)),
                ..ProxyConfig::default()
            },
        )
        .unwrap()
    };
    // The yardstick's listener in the sandbox's namespace; its relays dial from this thread's.
    let yard = egress::netns::open_in(inner.as_fd(), yardstick::ADDR.parse().unwrap()).unwrap();
    yardstick::start(yard.listener, SocketAddr::new(UPSTREAM.into(), BULK));
    let tyard =
        egress::netns::open_in(inner.as_fd(), yardstick::ASYNC_ADDR.parse().unwrap()).unwrap();
    yardstick::start_async(tyard.listener, UPSTREAM.into(), false, proxy_rt.handle());
    let hyard =
        egress::netns::open_in(inner.as_fd(), yardstick::HOP_ADDR.parse().unwrap()).unwrap();
    yardstick::start_async(hyard.listener, UPSTREAM.into(), true, proxy_rt.handle());
    std::thread::sleep(Duration::from_millis(200));

    if std::env::args().any(|a| a == "--lookup-only") {
        lookups(quick, &inner, &*lookup);
        proxy_rt.block_on(fixed.shutdown());
        proxy_rt.block_on(proxy.shutdown());
        return;
    }
    if !download_only {
        latency(quick, &inner, &*lookup);
    }
    if latency_only {
        proxy_rt.block_on(fixed.shutdown());
        proxy_rt.block_on(proxy.shutdown());
        return;
    }
    downloads(quick, &inner);
    if download_only {
        proxy_rt.block_on(fixed.shutdown());
        proxy_rt.block_on(proxy.shutdown());
        return;
    }
    // Idle tunnels.
    let n = 1000;
    let (open, mib) = held_memory(&proxy, || {
        let (holder, line) = hold_idle(&inner, n);
        assert!(line.starts_with(&format!("READY {n} ")), "{line}");
        holder
    });
    println!("{n} idle tunnels ({open} open at the proxy): supervisor RSS +{mib:.1} MiB");
    https(quick, dir, &inner, &proxy);
    proxy_rt.block_on(fixed.shutdown());
    proxy_rt.block_on(proxy.shutdown());
}

/// Connect + first byte, the sides interleaved in rounds; then the identity lookup alone.
fn latency(quick: bool, inner: &OwnedFd, lookup: &dyn egress::Identify) {
    // Connect + first byte: interleaved rounds.
    let (rounds, per) = if quick { (3, 50) } else { (7, 200) };
    // "scan" is the same proxy as "proxy" with this process not a subreaper, so the lookup
    // reads all of /proc for the sandbox's processes instead of walking its descendants (as
    // before the walk). "tyard" and "yard" are the yardsticks (`egress_parts/yardstick.rs`):
    // the least relay on tokio (on the proxy's runtime) and on blocking threads; "hyard" the
    // tokio one with the proxy's hop to a blocking thread and back.
    // "frozen" is the same proxy as "proxy" with the client in a v1 freezer group of its own,
    // as `run` and `serve` place an exec: each lookup freezes and thaws it. In the bench's own
    // groups (the other sides) no freeze is possible and the scan is best effort.
    let group = freezer_group();
    let sides = [
        "direct", "proxy", "frozen", "fixed", "scan", "tyard", "hyard", "yard",
    ];
    let mut took: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
    let per_s = per.to_string();
    for _ in 0..rounds {
        for (side, v) in sides.iter().zip(took.iter_mut()) {
            let inner = (*side != "direct").then_some(inner);
            set_subreaper(*side != "scan");
            let out = match (*side, &group) {
                ("frozen", None) => continue,
                ("frozen", Some(g)) => run_client_in(inner, Some(g), &["lat", side, &per_s]),
                _ => run_client(inner, &["lat", side, &per_s]),
            };
            v.extend(out.lines().map(|l| l.parse::<f64>().unwrap() / 1000.0));
        }
    }
    set_subreaper(true);
    if let Some(g) = &group {
        let _ = std::fs::remove_dir(g);
    }
    let p50: Vec<f64> = took
        .iter_mut()
        .map(|v| if v.is_empty() { f64::NAN } else { median(v) })
        .collect();
    let [d50, p50, f50, g50, s50, t50, h50, y50] = p50[..] else {
        unreachable!()
    };
    if group.is_some() {
        println!(
            "connect + first byte p50 as `run` places the client (a freezer group of its own, frozen and thawed by each lookup): {f50:.0} µs, overhead {:.0} µs ({} samples)",
            f50 - d50,
            took[2].len()
        );
    } else {
        println!(
            "connect + first byte, frozen as `run` places the client: not measured (no v1 freezer hierarchy here)"
        );
    }
    println!(
        "connect + first byte p50: direct {d50:.0} µs, proxied {p50:.0} µs, overhead {:.0} µs; with the caller given (no lookup) {g50:.0} µs, overhead {:.0} µs; with the lookup reading all of /proc {s50:.0} µs, overhead {:.0} µs ({} samples each)",
        p50 - d50,
        g50 - d50,
        s50 - d50,
        took[0].len()
    );
    println!(
        "connect + first byte p50 through the yardsticks (no policy, no lookup): tokio {t50:.0} µs, overhead {:.0} µs; the same with a hop to a blocking thread {h50:.0} µs, overhead {:.0} µs; blocking threads {y50:.0} µs, overhead {:.0} µs; proxied against the tokio one +{:.0} µs, caller given against it +{:.0} µs",
        t50 - d50,
        h50 - d50,
        y50 - d50,
        p50 - t50,
        g50 - t50
    );

    lookups(quick, inner, lookup);
}

/// A relay's CPU seconds so far: (user, system).
type CpuSplit = dyn Fn() -> (f64, f64);

/// 256 MiB downloads.
fn downloads(quick: bool, inner: &OwnedFd) {
    // 256 MiB downloads, interleaved: direct, through the proxy, and through the yardstick
    // (`egress_parts/yardstick.rs`: the simplest relay, what any user-space relay gets here);
    // the relays' CPU read around their own runs.
    // Each side's machine-wide busy CPU too (/proc/stat: both ends, the relay, and the kernel's
    // network work wherever it ran), so the figure says what this machine's cores allow: when
    // the direct side already keeps every core busy, a proxied download can go no faster than
    // direct's CPU per byte over its own.
    let runs = if quick { 2 } else { 5 };
    let proxy_cpu = || thread_cpu_split("egress-proxy");
    let sides: [(&str, Option<&CpuSplit>); 3] = [
        ("direct", None),
        ("proxy", Some(&proxy_cpu)),
        ("yard", Some(&yardstick::cpu)),
    ];
    let mut took: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
    let mut busy: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
    let mut sys: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
    for _ in 0..runs {
        for (i, (side, threads)) in sides.iter().enumerate() {
            let ns = threads.is_some().then_some(inner);
            let c0 = threads.map(|f| f()).unwrap_or_default();
            let b0 = machine_busy();
            let out = run_client(ns, &["bulk", side]);
            busy[i].push(machine_busy() - b0);
            let c1 = threads.map(|f| f()).unwrap_or_default();
            cpu[i].push(c1.0 + c1.1 - c0.0 - c0.1);
            sys[i].push(c1.1 - c0.1);
            let f: Vec<f64> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
            assert_eq!(f[1] as usize, BULK_BYTES);
            took[i].push(f[0] / 1e9);
        }
    }
    let mib = (BULK_BYTES >> 20) as f64;
    let per_gib = |v: &mut Vec<f64>| median(v) * 1024.0 / mib;
    let t: Vec<f64> = took.iter_mut().map(|v| median(v)).collect();
    // Each round's own ratio too: on a shared machine the rounds move together.
    let spread = |i: usize| {
        let mut r: Vec<f64> = (0..runs).map(|k| took[0][k] / took[i][k]).collect();
        r.sort_by(|a, b| a.partial_cmp(b).unwrap());
        format!("{:.2}–{:.2}", r[0], r[runs - 1])
    };
    println!(
        "256 MiB download: direct {:.0} MiB/s, proxied {:.0} MiB/s, ratio {:.2} (rounds {}); proxy CPU {:.2} s per GiB ({:.2} of it in the kernel)",
        mib / t[0],
        mib / t[1],
        t[0] / t[1],
        spread(1),
        per_gib(&mut cpu[1]),
        per_gib(&mut sys[1])
    );
    println!(
        "256 MiB download through the yardstick (a blocking splice relay, no policy): {:.0} MiB/s, ratio {:.2} (rounds {}), proxied against it {:.2}; its CPU {:.2} s per GiB ({:.2} in the kernel)",
        mib / t[2],
        t[0] / t[2],
        spread(2),
        t[2] / t[1],
        per_gib(&mut cpu[2]),
        per_gib(&mut sys[2])
    );
    let (dm, pm) = (t[0], t[1]);
    let (db, pb, yb) = (
        median(&mut busy[0]),
        median(&mut busy[1]),
        median(&mut busy[2]),
    );
    // SAFETY: sysconf has no preconditions.
    let cores = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) } as f64;
    let direct_busy = db / (dm * cores);
    // Only a direct side that keeps every core busy bounds the proxied one by CPU per byte.
    let ceiling = if direct_busy >= 0.9 {
        format!("CPU-bound: the ratio can be at most {:.2}", db / pb)
    } else {
        "the direct side is not CPU-bound: no ceiling from CPU".to_string()
    };
    println!(
        "256 MiB download, machine CPU (all processes and the kernel, /proc/stat): direct {:.2} s per GiB with the {cores} cores {:.0} % busy, proxied {:.2} s per GiB ({:.0} % busy), yardstick {:.2} s per GiB ({:.0} % busy); {ceiling}",
        db * 1024.0 / mib,
        100.0 * direct_busy,
        pb * 1024.0 / mib,
        100.0 * pb / (pm * cores),
        yb * 1024.0 / mib,
        100.0 * yb / (t[2] * cores),
    );
}

/// What holding tunnels costs the supervisor: its RSS growth while the holder `start` returns
/// (once it is ready) keeps them open, and the connections open at the proxy meanwhile (count,
/// MiB). The holder is let go and reaped before this returns.
fn held_memory(
    proxy: &egress::ProxyHandle,
    start: impl FnOnce() -> std::process::Child,
) -> (usize, f64) {
    std::thread::sleep(Duration::from_millis(500));
    let before = rss_kib();
    let mut holder = start();
    std::thread::sleep(Duration::from_secs(1));
    let open = proxy.open_connections();
    let after = rss_kib();
    drop(holder.stdin.take());
    holder.wait().unwrap();
    (open, after.saturating_sub(before) as f64 / 1024.0)
}

/// A client holding `n` idle tunnels through the proxy until its stdin closes, and its
/// `READY` line.
fn hold_idle(inner: &OwnedFd, n: usize) -> (std::process::Child, String) {
    hold(inner, &["idle", "proxy", &n.to_string()])
}

/// A client in the sandbox's namespace run with `args`, holding what it opened until its stdin
/// closes, and its first line (`READY ...`).
fn hold(inner: &OwnedFd, args: &[&str]) -> (std::process::Child, String) {
    let mut holder = client_cmd(Some(inner), args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (holder, line)
}

/// The identity lookup alone, on this thread (no hop, no proxy): one held tunnel's client
/// looked up again and again, as each new connection of a process is. Twice: with the client
/// in this process's cgroups (no group of its own to freeze: the scan is not a snapshot), and,
/// where there is a v1 freezer hierarchy, with the client in a freezer group of its own, as
/// `run` and `serve` place an exec (each lookup freezes and thaws it).
fn lookups(quick: bool, inner: &OwnedFd, lookup: &dyn egress::Identify) {
    let n = if quick { 300 } else { 1000 };
    let p50 = lookup_p50(n, inner, lookup, None);
    println!("identity lookup alone p50: {p50:.0} µs ({n} lookups of one connection)");
    let Some(group) = freezer_group() else {
        println!("identity lookup alone, frozen: not measured (no v1 freezer hierarchy here)");
        return;
    };
    let p50 = lookup_p50(n, inner, lookup, Some(&group));
    println!(
        "identity lookup alone p50, the client in a freezer group of its own (frozen and thawed by each lookup): {p50:.0} µs ({n} lookups)"
    );
    let _ = std::fs::remove_dir(&group);
}

/// A new v1 freezer group of the bench's own (removed by the caller), if the hierarchy is there.
fn freezer_group() -> Option<std::path::PathBuf> {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let group = std::path::PathBuf::from(format!(
        "/sys/fs/cgroup/freezer/osb-bench-{}.{n}",
        std::process::id()
    ));
    std::fs::create_dir(&group).ok().map(|()| group)
}

/// The p50 of `n` lookups of one held client's connection, the client moved into the freezer
/// group `group` first if one is given.
fn lookup_p50(
    n: usize,
    inner: &OwnedFd,
    lookup: &dyn egress::Identify,
    group: Option<&std::path::Path>,
) -> f64 {
    let (mut holder, line) = hold_idle(inner, 1);
    if let Some(g) = group {
        std::fs::write(g.join("cgroup.procs"), holder.id().to_string()).unwrap();
    }
    let peer: SocketAddr = line
        .trim()
        .strip_prefix("READY 1 ")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    let local: SocketAddr = "10.200.0.1:3128".parse().unwrap();
    let mut took: Vec<f64> = (0..n)
        .map(|_| {
            let t = Instant::now();
            lookup.identify(peer, local, Instant::now()).unwrap();
            t.elapsed().as_nanos() as f64 / 1000.0
        })
        .collect();
    drop(holder.stdin.take());
    holder.wait().unwrap();
    median(&mut took)
}

/// HTTPS through interception (`secure.bench`) against `tls: skip` (`raw.bench`).
fn https(quick: bool, dir: &std::path::Path, inner: &OwnedFd, proxy: &egress::ProxyHandle) {
    let sandbox_ca = dir.join("sandbox-ca.pem");
    let upstream_ca = dir.join("upstream-ca.pem");
    let (sca, uca) = (sandbox_ca.to_str().unwrap(), upstream_ca.to_str().unwrap());
    let sides = [("secure.bench", sca), ("raw.bench", uca)];
    let nums = |out: String| -> Vec<f64> {
        out.lines()
            .map(|l| l.split_whitespace().next().unwrap().parse::<f64>().unwrap())
            .collect()
    };

    // Keep-alive requests on one tunnel each, interleaved rounds.
    let (rounds, per) = if quick { (3, 100) } else { (7, 400) };
    let (mut ti, mut ts) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        for ((host, roots), v) in sides.iter().zip([&mut ti, &mut ts]) {
            let out = run_client(Some(inner), &["tls", "ka", host, roots, &per.to_string()]);
            v.extend(nums(out).into_iter().map(|n| n / 1000.0));
        }
    }
    let (i50, s50) = (median(&mut ti), median(&mut ts));
    println!(
        "HTTPS keep-alive request p50: tls: skip {s50:.0} µs, intercepted {i50:.0} µs, overhead {:.0} µs ({} samples each)",
        i50 - s50,
        ti.len()
    );

    // 256 MiB over HTTPS, interleaved.
    let runs = if quick { 2 } else { 5 };
    let (mut bi, mut bs) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        for ((host, roots), v) in sides.iter().zip([&mut bi, &mut bs]) {
            let out = run_client(Some(inner), &["tls", "bulk", host, roots]);
            let f: Vec<f64> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
            assert_eq!(f[1] as usize, tls::BULK_BYTES);
            v.push(f[0] / 1e9);
        }
    }
    let mib = (tls::BULK_BYTES >> 20) as f64;
    let (im, sm) = (median(&mut bi), median(&mut bs));
    println!(
        "HTTPS 256 MiB download: tls: skip {:.0} MiB/s, intercepted {:.0} MiB/s, ratio {:.2}",
        mib / sm,
        mib / im,
        sm / im
    );

    // The first request on a fresh tunnel: to a host with no leaf yet (signed now), to one
    // whose leaf is cached, and through tls: skip; interleaved in batches.
    let batches = if quick { 4 } else { 10 };
    let per = tls::NEW_HOSTS / batches;
    let (mut new, mut cached, mut skip) = (Vec::new(), Vec::new(), Vec::new());
    for b in 0..batches {
        let hosts: Vec<String> = (b * per..(b + 1) * per)
            .map(|i| format!("n{i}.new.bench"))
            .collect();
        let mut args = vec!["tls", "first", sca];
        args.extend(hosts.iter().map(String::as_str));
        new.extend(nums(run_client(Some(inner), &args)));
        let mut args = vec!["tls", "first", sca];
        args.extend(std::iter::repeat_n("secure.bench", per));
        cached.extend(nums(run_client(Some(inner), &args)));
        let mut args = vec!["tls", "first", uca];
        args.extend(std::iter::repeat_n("raw.bench", per));
        skip.extend(nums(run_client(Some(inner), &args)));
    }
    let ms = |v: &mut Vec<f64>| median(v) / 1e6;
    let (n50, c50, s50) = (ms(&mut new), ms(&mut cached), ms(&mut skip));
    println!(
        "HTTPS first request on a fresh tunnel p50: tls: skip {s50:.2} ms, intercepted (leaf cached) {c50:.2} ms, intercepted to a new host {n50:.2} ms: leaf signing {:.2} ms, new host over skip {:.2} ms ({} hosts)",
        n50 - c50,
        n50 - s50,
        new.len()
    );

    // Open inspected tunnels: one request each, then held (keep-alive, idle).
    let n = 1000;
    let (open, mib) = held_memory(proxy, || {
        let (holder, line) = hold(inner, &["tls", "hold", "secure.bench", sca, &n.to_string()]);
        assert_eq!(line.trim(), format!("READY {n}"));
        holder
    });
    println!("{n} open inspected tunnels ({open} open at the proxy): supervisor RSS +{mib:.1} MiB");
}
