//! The egress tests' world, with no internet and nothing changed on the machine.
//!
//! - The **outer** network namespace stands for the supervisor's (the pod's): the test thread
//!   unshares one, puts the upstream addresses on its `lo` (one the classifier calls public,
//!   192.88.99.10; private 10.77.0.10 and 10.88.0.10; CGNAT 100.64.0.10), and checks, before
//!   any packet, that `lo` is its only interface and that it has no route. The tokio runtime
//!   is built on that thread afterwards, so its workers and blocking threads are in it too
//!   (checked), and so are the upstream servers and the proxy's dials.
//! - The **inner** namespace is the sandbox's: only `lo`, where the proxy's listener is made
//!   at 10.200.0.1:3128 by the production code (`egress::netns::open_in`). Clients are real
//!   processes that join it before exec.
//! - Names resolve through a hosts file, as the sandbox's `/etc/hosts`; the supervisor's own
//!   resolver step is off here, because getaddrinfo may ask a daemon outside the namespace.

pub mod binary;
pub mod identity;
#[cfg(feature = "test-pause-points")]
pub mod l7;
pub mod l7_servers;
pub mod memory;
pub mod servers;
pub mod tools;

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use openshell_sandbox::egress::{
    self, EventSink, NetEvent, PolicyHandle, ProxyConfig, ProxyHandle,
};
use openshell_sandbox::policy::network::NetworkRules;
use openshell_sandbox::policy::openshell::from_yaml;

pub use servers::Upstream;

pub const PUBLIC: Ipv4Addr = Ipv4Addr::new(192, 88, 99, 10);
pub const PRIVATE: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 10);
pub const PRIVATE2: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 10);
pub const CGNAT: Ipv4Addr = Ipv4Addr::new(100, 64, 0, 10);

/// The names the egress tests reach, plus a few for the tool tests.
pub const HOSTS: &str = "\
192.88.99.10  pub.test a.wild.test b.c.wild.test x.y.deep.test x.deep.test api.test pkgs.test git.test
192.88.99.10  rules.test audit.test gitlab.test s.test secure.test secure-api.test raw.test cred.test rawcred.test
192.88.99.10  ws.test body.test
10.77.0.10    db.corp.test k8s.corp.test priv.wild.test any1.test
10.88.0.10    other.test
100.64.0.10   cgnat.wild.test
192.88.99.10  mixed.wild.test
10.77.0.10    mixed.wild.test
127.0.0.1     localhost lo.test
";

/// True when the test may run (root, a C compiler); a skip fails under CI=true.
pub fn require() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let cc = Command::new("cc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    for (ok, what) in [
        (
            root,
            "root: the egress tests make network namespaces and put addresses on their lo",
        ),
        (cc, "a C compiler `cc` for tests/support/egress/probe.c"),
    ] {
        if !ok {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!(
                    "required for this test but absent: {what} (CI=true turns this skip into a failure)"
                );
            }
            eprintln!("SKIPPED: {what}");
            return false;
        }
    }
    true
}

fn ns_ino(path: &str) -> u64 {
    let l = std::fs::read_link(path).unwrap();
    let s = l.to_string_lossy();
    s.trim_start_matches("net:[")
        .trim_end_matches(']')
        .parse()
        .unwrap()
}

/// A fresh network namespace with `lo` up, held by its descriptor (made on a thread that ends).
pub fn new_netns() -> OwnedFd {
    std::thread::spawn(|| {
        // SAFETY: unshare affects only this thread, which ends right after.
        let r = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "{}", io::Error::last_os_error());
        egress::netns::loopback_up().unwrap();
        let f = std::fs::File::open("/proc/thread-self/ns/net").unwrap();
        OwnedFd::from(f)
    })
    .join()
    .unwrap()
}

/// The probe, built once per test binary.
fn probe_binary() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("osb-egress-probe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("probe");
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/egress/probe.c");
        let st = Command::new("cc")
            .args(["-O1", "-Wall", "-o"])
            .arg(&out)
            .arg(src)
            .status()
            .unwrap();
        assert!(st.success(), "building the probe");
        out
    })
}

/// Every event the proxy reported (connections, then requests inside inspected tunnels).
#[derive(Default)]
pub struct Recorder(pub Mutex<Vec<NetEvent>>, pub Mutex<Vec<egress::L7Event>>);

impl EventSink for Recorder {
    fn emit(&self, e: &NetEvent) {
        self.0.lock().unwrap().push(e.clone());
    }

    fn emit_l7(&self, e: &egress::L7Event) {
        self.1.lock().unwrap().push(e.clone());
    }
}

impl Recorder {
    pub fn all(&self) -> Vec<NetEvent> {
        self.0.lock().unwrap().clone()
    }

    /// Wait until some event satisfies `f`.
    pub fn wait_for(&self, what: &str, f: impl Fn(&NetEvent) -> bool) -> NetEvent {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(e) = self.all().into_iter().find(&f) {
                return e;
            }
            assert!(
                Instant::now() < end,
                "no event {what}: {:?}",
                self.all().iter().map(|e| e.shorthand()).collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// One test's world. Build it with [`World::run`].
pub struct World {
    pub rt: tokio::runtime::Runtime,
    pub outer: OwnedFd,
    pub inner: OwnedFd,
    pub tmp: tempfile::TempDir,
    /// `$T/bin`: probe-a, probe-b, sub/probe-c, launch.
    pub bin: PathBuf,
    pub hosts: PathBuf,
    pub events: Arc<Recorder>,
    pub upstream: Arc<Upstream>,
    pub policy: Option<PolicyHandle>,
    pub proxy: Option<ProxyHandle>,
}

impl World {
    /// Run `f` in a fresh world, on a thread of its own (the thread's namespace is the outer
    /// one; nothing of the test runner's changes).
    pub fn run<R: Send + 'static>(f: impl FnOnce(&mut World) -> R + Send + 'static) -> R {
        std::thread::spawn(move || {
            let mut w = World::new();
            let r = f(&mut w);
            if let Some(p) = w.proxy.take() {
                w.rt.block_on(p.shutdown());
            }
            r
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    }

    fn new() -> World {
        let host_ns = ns_ino("/proc/self/ns/net");
        // SAFETY: unshare affects this thread only: it becomes the outer namespace's.
        let r = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "{}", io::Error::last_os_error());
        let outer_ino = ns_ino("/proc/thread-self/ns/net");
        assert_ne!(
            outer_ino, host_ns,
            "the test thread must be in a namespace of its own"
        );
        egress::netns::loopback_up().unwrap();
        for a in [PUBLIC, PRIVATE, PRIVATE2, CGNAT] {
            egress::netns::add_loopback_address(a).unwrap();
        }
        assert_nothing_routes_elsewhere();
        let outer = OwnedFd::from(std::fs::File::open("/proc/thread-self/ns/net").unwrap());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        // The runtime's threads inherited this thread's namespace: check, before any packet.
        let on_worker = rt.block_on(async {
            tokio::spawn(async { ns_ino("/proc/thread-self/ns/net") })
                .await
                .unwrap()
        });
        let on_blocking = rt.block_on(async {
            tokio::task::spawn_blocking(|| ns_ino("/proc/thread-self/ns/net"))
                .await
                .unwrap()
        });
        assert_eq!((on_worker, on_blocking), (outer_ino, outer_ino));
        let inner = new_netns();
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("bin");
        std::fs::create_dir_all(bin.join("sub")).unwrap();
        for name in ["probe-a", "probe-b", "sub/probe-c", "launch"] {
            std::fs::copy(probe_binary(), bin.join(name)).unwrap();
        }
        let hosts = tmp.path().join("hosts");
        std::fs::write(&hosts, HOSTS).unwrap();
        let upstream = rt.block_on(Upstream::start(tmp.path().join("files")));
        World {
            rt,
            outer,
            inner,
            tmp,
            bin,
            hosts,
            events: Arc::default(),
            upstream,
            policy: None,
            proxy: None,
        }
    }

    /// `network_policies` YAML (the rules only, indented by two), with `/t/bin/` standing for
    /// [`World::bin`].
    pub fn rules(&self, yaml: &str) -> NetworkRules {
        let text = format!(
            "version: 1\nnetwork_policies:\n{}",
            yaml.replace("/t/bin/", &format!("{}/", self.bin.display()))
        );
        let p = from_yaml(&text).unwrap();
        NetworkRules::compile(&p.network_policies).unwrap()
    }

    /// Start the proxy with these rules, the real identity and the hosts-file resolver.
    pub fn start(&mut self, yaml: &str, config: ProxyConfig) {
        let rules = self.rules(yaml);
        let resolver = Arc::new(egress::SandboxResolver::new(
            Some(self.hosts.clone()),
            false,
        ));
        self.start_with(rules, resolver, config);
    }

    pub fn start_with(
        &mut self,
        rules: NetworkRules,
        resolver: Arc<dyn egress::Resolve>,
        config: ProxyConfig,
    ) {
        let socks = egress::netns::open_in(self.inner.as_fd(), egress::netns::PROXY_ADDR).unwrap();
        assert!(
            socks.diag.is_some(),
            "sock_diag is available on this kernel"
        );
        let identity =
            Arc::new(egress::procfs::ProcIdentity::new(self.inner.as_fd(), socks.diag).unwrap());
        let policy = PolicyHandle::new(rules);
        let events: Arc<dyn EventSink> = self.events.clone();
        let _g = self.rt.enter();
        let proxy = egress::Proxy::start(
            socks.listener,
            policy.clone(),
            identity,
            resolver,
            events,
            config,
        )
        .unwrap();
        self.policy = Some(policy);
        self.proxy = Some(proxy);
    }

    pub fn policy(&self) -> &PolicyHandle {
        self.policy.as_ref().unwrap()
    }

    pub fn proxy(&self) -> &ProxyHandle {
        self.proxy.as_ref().unwrap()
    }

    /// A command that joins the sandbox's namespace before exec, with the proxy variables.
    pub fn in_sandbox(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        let fd = self.inner.as_raw_fd();
        // SAFETY: setns is a raw syscall on a descriptor that stays open until exec (O_CLOEXEC).
        unsafe {
            c.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        for (k, v) in egress::child_env(egress::netns::PROXY_ADDR) {
            c.env(k, v);
        }
        c.stdin(Stdio::null());
        c
    }

    /// Run `$T/bin/<name> args…` in the sandbox; its stdout.
    pub fn probe(&self, name: &str, args: &[&str]) -> String {
        let mut c = self.in_sandbox(self.bin.join(name));
        c.args(args);
        output(c, Duration::from_secs(60))
    }
}

/// Run a command to its end (killing it past `limit`); stdout, with stderr on failure.
pub fn output(mut c: Command, limit: Duration) -> String {
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = c.spawn().unwrap_or_else(|e| panic!("spawn {c:?}: {e}"));
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(limit) {
        Ok(o) => o.unwrap(),
        Err(_) => {
            // SAFETY: kill of our own child's pid.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("{c:?} did not finish in {limit:?}");
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        eprintln!(
            "{c:?}: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    stdout
}

/// The calling thread's namespace has `lo` only and no route: nothing can leave it.
pub fn assert_nothing_routes_elsewhere() {
    let dev = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap();
    let ifs: Vec<&str> = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    assert_eq!(ifs, ["lo"], "interfaces");
    let route = std::fs::read_to_string("/proc/thread-self/net/route").unwrap();
    assert_eq!(route.lines().count(), 1, "IPv4 routes: {route}");
    if let Ok(r6) = std::fs::read_to_string("/proc/thread-self/net/ipv6_route") {
        for l in r6.lines() {
            assert_eq!(
                l.split_whitespace().last(),
                Some("lo"),
                "IPv6 route off lo: {l}"
            );
        }
    }
}

/// Split a raw HTTP answer into (status line, the head, the body).
pub fn split_response(raw: &str) -> (String, String, String) {
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((raw, ""));
    (
        head.lines().next().unwrap_or("").to_string(),
        head.to_string(),
        body.to_string(),
    )
}

/// The JSON body of a raw answer.
pub fn json_body(raw: &str) -> serde_json::Value {
    let (_, _, body) = split_response(raw);
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {raw:?}"))
}

/// Wait for `f` to hold.
pub fn wait_until(what: &str, limit: Duration, f: impl Fn() -> bool) {
    let end = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn addr(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

/// The real binary, started from the calling thread (so in its network namespace, the outer
/// one) in a private mount namespace where each `(src, dst)` of `binds` is bound over `dst`
/// (the test's hosts file over `/etc/hosts`, a bundle with the tests' upstream CA over the
/// system bundle): the machine's own files stay as they are.
pub fn osb_in(binds: &[(PathBuf, PathBuf)], workdir: &Path) -> Command {
    osb_in_over(None, binds, workdir)
}

/// [`osb_in`], with `/etc` first made an overlay of the machine's whose upper layer is
/// `upper/up` (work directory `upper/work`; both made here): what the run writes to `/etc`
/// lands there, and what the test put in it (a whiteout, to hide a directory the machine has)
/// is what the run sees.
pub fn osb_in_etc_overlay(upper: &Path, binds: &[(PathBuf, PathBuf)], workdir: &Path) -> Command {
    std::fs::create_dir_all(upper.join("up")).unwrap();
    std::fs::create_dir_all(upper.join("work")).unwrap();
    let data = format!(
        "lowerdir=/etc,upperdir={},workdir={}",
        upper.join("up").display(),
        upper.join("work").display()
    );
    osb_in_over(Some(std::ffi::CString::new(data).unwrap()), binds, workdir)
}

fn osb_in_over(
    etc_overlay: Option<std::ffi::CString>,
    binds: &[(PathBuf, PathBuf)],
    workdir: &Path,
) -> Command {
    use std::ffi::CString;
    let mut c = Command::new(env!("CARGO_BIN_EXE_openshell-sandbox"));
    let pairs: Vec<(CString, CString)> = binds
        .iter()
        .map(|(s, d)| {
            (
                CString::new(s.as_os_str().as_encoded_bytes()).unwrap(),
                CString::new(d.as_os_str().as_encoded_bytes()).unwrap(),
            )
        })
        .collect();
    // SAFETY: raw syscalls only, on C strings made before the fork.
    unsafe {
        c.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWNS) != 0
                || libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            if let Some(data) = &etc_overlay
                && libc::mount(
                    c"overlay".as_ptr(),
                    c"/etc".as_ptr(),
                    c"overlay".as_ptr(),
                    0,
                    data.as_ptr().cast(),
                ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            for (s, d) in &pairs {
                if libc::mount(
                    s.as_ptr(),
                    d.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                ) != 0
                {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    c.current_dir(workdir).stdin(Stdio::null());
    c
}

/// The system bundle the proxy trusts upstream, with `extra_pem` (the tests' upstream CA)
/// appended: bound over it by [`osb_in`], so that the release binary trusts the tests'
/// upstreams through the system bundle, as it would a corporate CA.
pub const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

pub fn bundle_with(dir: &Path, extra_pem: &str) -> PathBuf {
    let mut b = std::fs::read_to_string(SYSTEM_BUNDLE).unwrap_or_default();
    if !b.is_empty() && !b.ends_with('\n') {
        b.push('\n');
    }
    b.push_str(extra_pem);
    let p = dir.join("bundle-with-test-ca.pem");
    std::fs::write(&p, b).unwrap();
    p
}
