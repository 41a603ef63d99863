//! The "cluster network": a network namespace for the gateway (its Service address lives there)
//! and one per pod (the pod sandbox's), joined by a veth pair the way a CNI plugin joins a pod
//! to the node. Both ends are created directly inside the test's own namespaces, so nothing is
//! added to the host's network namespace, and the addresses (TEST-NET-1, 192.0.2.0/24) exist only
//! there: a pod can reach the gateway across its link and nowhere else.
//!
//! The gateway is the faithful test gateway of `tests/support` (mTLS, client certificate
//! required, as v0.0.36 authenticates sandboxes), listening on the gateway end of the pod's link.
//! Its socket is created by a short-lived thread that has entered the gateway namespace; a
//! socket keeps the namespace it was created in, and the thread's change dies with the thread.

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, bail};

use crate::support::gateway::{AuthMode, Server, State};
use crate::support::pki;

/// The name the pods dial, resolved through their /etc/hosts (the Helm default Service name).
pub const GATEWAY_DNS: &str = "openshell.openshell.svc.cluster.local";
/// The gateway's gRPC port (statefulset `--port 8080`).
pub const GATEWAY_PORT: u16 = 8080;

static NEXT: AtomicU32 = AtomicU32::new(0);
const PREFIX: &str = "osb-e2e-";

/// Run `ip` with `cmd` split on whitespace (none of our names or addresses contains any).
fn ip(cmd: &str) -> anyhow::Result<String> {
    let ip = crate::container::tool("ip").context("`ip` (iproute2) is not installed")?;
    let out = Command::new(ip)
        .args(cmd.split_whitespace())
        .output()
        .context("running `ip` (iproute2)")?;
    if !out.status.success() {
        bail!(
            "`ip {cmd}` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A named network namespace (`ip netns add`), deleted on drop.
pub struct Netns {
    pub name: String,
    pub path: PathBuf,
    deleted: bool,
}

impl Netns {
    pub fn add(role: &str) -> anyhow::Result<Netns> {
        let name = format!(
            "{PREFIX}{}-{}-{role}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        ip(&format!("netns add {name}"))?;
        let ns = Netns {
            path: PathBuf::from("/run/netns").join(&name),
            name,
            deleted: false,
        };
        ip(&format!("-n {} link set lo up", ns.name))?;
        Ok(ns)
    }

    pub fn delete(&mut self) -> anyhow::Result<()> {
        if !self.deleted {
            ip(&format!("netns del {}", self.name))?;
            self.deleted = true;
        }
        Ok(())
    }

    /// Run `f` on a thread that has entered this namespace; nothing else changes namespace.
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
        let file =
            File::open(&self.path).with_context(|| format!("opening {}", self.path.display()))?;
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: setns on an fd we own; CLONE_NEWNET changes only this thread, which
                // ends when `f` returns.
                let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                if rc != 0 {
                    return Err(anyhow::Error::from(std::io::Error::last_os_error())
                        .context(format!("setns into {}", self.name)));
                }
                Ok(f())
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the thread inside {} panicked", self.name))?
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = self.delete();
    }
}

/// Remove namespaces left by earlier runs of this test that were killed before cleaning up
/// (their creating process no longer exists).
pub fn sweep_stale() {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&format!("netns del {name}"));
        }
    }
}

/// The cluster: the gateway's namespace, the CA, the gateway's server certificate, and the
/// client TLS Secret every sandbox pod mounts.
pub struct Cluster {
    pub gw_ns: Netns,
    server_tls: Arc<rustls::ServerConfig>,
    /// The `openshell-client-tls` Secret's files (ca.crt, tls.crt, tls.key).
    pub client_secret: pki::ClientFiles,
    links: u8,
}

impl Cluster {
    pub fn new(dir: &Path) -> anyhow::Result<Cluster> {
        sweep_stale();
        let gw_ns = Netns::add("gw")?;
        let ca = pki::Ca::new("openshell-e2e-ca");
        let server_tls = server_tls(&ca, &[GATEWAY_DNS])?;
        let client_secret = pki::ClientFiles::write(
            &dir.join("secret-openshell-client-tls"),
            &ca.pem,
            &ca.client(),
        );
        // A Secret volume's default modes, whatever the umask: the files are readable by any
        // uid, so a denied read in a pod is the sandbox's doing.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&client_secret.dir, std::fs::Permissions::from_mode(0o755))?;
        for f in [&client_secret.ca, &client_secret.cert, &client_secret.key] {
            std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644))?;
        }
        Ok(Cluster {
            gw_ns,
            server_tls,
            client_secret,
            links: 0,
        })
    }

    /// A pod's network: its namespace with `eth0`, linked to `vethN` in the gateway namespace,
    /// and a gateway for this pod's sandbox listening on the gateway end, authenticating
    /// sandboxes as `auth` says (v0.0.36: the client certificate; HEAD: a sandbox JWT too).
    pub fn pod_network(&mut self, sandbox_id: &str, auth: AuthMode) -> anyhow::Result<PodNet> {
        let n = self.links;
        if n >= 63 {
            bail!("out of /30 blocks in 192.0.2.0/24");
        }
        self.links += 1;
        let ns = Netns::add("pod")?;
        let gw_if = format!("veth{n}");
        let gw_addr = Ipv4Addr::new(192, 0, 2, 4 * n + 1);
        let pod_addr = Ipv4Addr::new(192, 0, 2, 4 * n + 2);
        let (gw, pod) = (&self.gw_ns.name, &ns.name);
        ip(&format!(
            "link add name {gw_if} netns {gw} type veth peer name eth0 netns {pod}"
        ))?;
        ip(&format!("-n {gw} addr add {gw_addr}/30 dev {gw_if}"))?;
        ip(&format!("-n {gw} link set {gw_if} up"))?;
        ip(&format!("-n {pod} addr add {pod_addr}/30 dev eth0"))?;
        ip(&format!("-n {pod} link set eth0 up"))?;

        let state = State::new(sandbox_id, auth);
        let addr = SocketAddr::from((gw_addr, GATEWAY_PORT));
        let handle = tokio::runtime::Handle::current();
        let tls = self.server_tls.clone();
        let st = state.clone();
        // The listener is bound on a thread inside the gateway namespace; its accept loop runs
        // on the test's runtime like any other task.
        let server = self
            .gw_ns
            .enter(move || handle.block_on(Server::start(st, Some(tls), addr)))
            .with_context(|| format!("starting the gateway on {addr}"))?;
        Ok(PodNet {
            state,
            server,
            gw_addr,
            pod_addr,
            ns,
        })
    }
}

impl Cluster {
    /// Interface names in the gateway's namespace (each pod adds one end of its veth pair).
    pub fn gateway_interfaces(&self) -> anyhow::Result<Vec<String>> {
        interfaces(&self.gw_ns.name)
    }
}

fn interfaces(ns: &str) -> anyhow::Result<Vec<String>> {
    let out = ip(&format!("-n {ns} -o link show"))?;
    Ok(out
        .lines()
        .filter_map(|l| l.split(':').nth(1))
        .map(|n| n.trim().split('@').next().unwrap_or("").to_owned())
        .collect())
}

/// One pod's network and its gateway. Field order is drop order: gateway first, then the
/// namespace (which takes the veth pair with it).
pub struct PodNet {
    pub state: Arc<State>,
    pub server: Server,
    pub gw_addr: Ipv4Addr,
    pub pod_addr: Ipv4Addr,
    pub ns: Netns,
}

impl PodNet {
    pub fn gateway_addr(&self) -> SocketAddr {
        self.server.addr
    }

    /// Interface names in the pod's namespace.
    pub fn interfaces(&self) -> anyhow::Result<Vec<String>> {
        interfaces(&self.ns.name)
    }
}

/// The gateway's server TLS: the test CA's certificate for `names`, client certificates
/// required and verified against the same CA (a v0.0.36 gateway's only authentication).
fn server_tls(ca: &pki::Ca, names: &[&str]) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let leaf = ca.server(names);
    let certs = rustls_pemfile::certs(&mut leaf.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .context("parsing the server certificate")?;
    let key = rustls_pemfile::private_key(&mut leaf.key_pem.as_bytes())
        .context("parsing the server key")?
        .context("no server key")?;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut ca.pem.as_bytes()) {
        roots.add(c.context("parsing the CA")?)?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(cfg))
}
