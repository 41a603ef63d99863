//! A sandbox pod as OpenShell v0.0.36's Kubernetes driver builds it:
//! container `agent` running `/opt/openshell/bin/openshell-sandbox` with no flags, as root, with
//! the node's hostPath `/opt/openshell/bin` mounted read-only, the `openshell-client-tls` Secret
//! at `/etc/openshell-tls/client`, the workspace at `/sandbox`, and the driver's environment.
//! Or as the v0.0.111 driver builds it ([`Contract::V00111`]): the same mounts plus the
//! projected service-account token, `--workdir /sandbox`, and the HEAD environment.
//! kubelet's part is here too: the pod's /etc/hosts (with a hostAliases entry naming the
//! gateway), /etc/resolv.conf and /etc/hostname, and the env it always adds.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use openshell_sandbox::proto::v1::ExecSandboxRequest;

use openshell_sandbox::policy::openshell::SandboxPolicy;

use crate::cluster::{Cluster, GATEWAY_DNS, GATEWAY_PORT, PodNet};
use crate::container::{self, AGENT_ADDED_CAPS, Container, Seccomp, Spec, Volume};
use crate::images::{BINARY, Node};
use crate::support::exec::{ExecResult, exec_collect};
use crate::support::gateway::{AuthMode, State};

/// The supervisor as the pod spec names it.
pub const SUPERVISOR: &str = "/opt/openshell/bin/openshell-sandbox";
pub const TLS_DIR: &str = "/etc/openshell-tls/client";

/// Field order is drop order: the container (and with it every process and mount of the pod)
/// goes first, then the gateway and the pod's network namespace and veth pair.
pub struct Pod {
    pub container: Container,
    pub net: PodNet,
    pub name: String,
    pub sandbox_id: String,
    /// Host pid of the pod's PID 1.
    pub init_pid: i32,
    pub handshake_secret: String,
    pub seccomp: Seccomp,
}

/// Where the v0.0.111 driver projects the service-account token.
pub const SA_TOKEN_DIR: &str = "/var/run/secrets/openshell";
/// The sandbox identity the v0.0.111 driver resolves by default.
pub const HEAD_SANDBOX_UID: u32 = 1000;

/// Which driver's pod contract the pod follows.
pub enum Contract {
    /// v0.0.36: no flags, `OPENSHELL_SANDBOX_COMMAND=sleep infinity`, the SSH handshake
    /// variables, and the client certificate as the only authentication.
    V0036,
    /// v0.0.111: `--workdir /sandbox`,
    /// `OPENSHELL_MAIN_PROCESS_SPEC`, the projected service-account token that the supervisor
    /// exchanges for a sandbox JWT (the gateway requires one), the resolved sandbox uid and gid
    /// with an empty `OPENSHELL_OCI_IMAGE_USER`, `OPENSHELL_USER_ENVIRONMENT`, and a gateway
    /// that already holds `policy` for the sandbox when the pod starts.
    V00111 {
        main_spec: String,
        user_env: String,
        policy: Box<SandboxPolicy>,
    },
}

pub struct PodOptions<'a> {
    pub name: &'a str,
    /// Builds the image's root filesystem into the given (empty) directory.
    pub image: &'a dyn Fn(&Path) -> anyhow::Result<()>,
    /// The agent container's `seccompProfile`.
    pub seccomp: Seccomp,
    pub contract: Contract,
}

impl Pod {
    /// Create the pod's network and gateway, lay out its files, start it, and wait until its
    /// supervisor has a session with the gateway.
    pub async fn start(
        cluster: &mut Cluster,
        node: &Node,
        dir: &Path,
        opts: PodOptions<'_>,
        on_log: impl FnOnce(&Path),
    ) -> anyhow::Result<Pod> {
        let name = opts.name.to_owned();
        let sandbox_id = uuid::Uuid::new_v4().to_string();
        let dir = dir.join(&name);
        let rootfs = dir.join("rootfs");
        std::fs::create_dir_all(&rootfs)?;
        (opts.image)(&rootfs).context("building the pod's image")?;

        let auth = match opts.contract {
            Contract::V0036 => AuthMode::CertOnly,
            Contract::V00111 { .. } => AuthMode::Jwt,
        };
        let net = cluster.pod_network(&sandbox_id, auth)?;
        if let Contract::V00111 { policy, .. } = &opts.contract {
            net.state
                .set_policy(policy)
                .map_err(|e| anyhow::anyhow!("the gateway refused the pod's policy: {e}"))?;
        }

        // kubelet-managed files. The gateway is named through a hostAliases entry, so the
        // supervisor's own name resolution (static glibc, files backend) has to find it.
        let etc = dir.join("kubelet");
        std::fs::create_dir_all(&etc)?;
        std::fs::write(
            etc.join("hosts"),
            format!(
                "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{}\t{name}\n\n# Entries added by HostAliases.\n{}\t{GATEWAY_DNS}\n",
                net.pod_addr, net.gw_addr
            ),
        )?;
        // Cluster DNS does not exist here; the nameserver is kubelet's usual ClusterIP, which
        // is unroutable from the pod, so only /etc/hosts can answer.
        std::fs::write(
            etc.join("resolv.conf"),
            "search openshell.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n",
        )?;
        std::fs::write(etc.join("hostname"), format!("{name}\n"))?;
        for f in ["hosts", "resolv.conf", "hostname"] {
            std::fs::set_permissions(
                etc.join(f),
                std::os::unix::fs::PermissionsExt::from_mode(0o644),
            )?;
        }
        let workspace = dir.join("volumes/workspace");
        std::fs::create_dir_all(&workspace)?;
        // An emptyDir is created 0777.
        std::fs::set_permissions(
            &workspace,
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )?;

        let handshake_secret = hex::encode(rand::random::<[u8; 32]>());
        let log = dir.join("agent.log");
        on_log(&log);
        let mut env: Vec<(String, String)> = [
            // The image's PATH and what the runtime and kubelet always add.
            (
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
            ),
            ("HOSTNAME", name.clone()),
            ("HOME", "/root".to_owned()),
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1".to_owned()),
            ("KUBERNETES_SERVICE_PORT", "443".to_owned()),
            // The v0.0.36 driver's environment.
            ("OPENSHELL_SANDBOX_ID", sandbox_id.clone()),
            ("OPENSHELL_SANDBOX", name.clone()),
            (
                "OPENSHELL_ENDPOINT",
                format!("https://{GATEWAY_DNS}:{GATEWAY_PORT}"),
            ),
            ("OPENSHELL_SANDBOX_COMMAND", "sleep infinity".to_owned()),
            (
                "OPENSHELL_SSH_SOCKET_PATH",
                "/run/openshell/ssh.sock".to_owned(),
            ),
            ("OPENSHELL_SSH_HANDSHAKE_SECRET", handshake_secret.clone()),
            ("OPENSHELL_SSH_HANDSHAKE_SKEW_SECS", "300".to_owned()),
            ("OPENSHELL_TLS_CA", format!("{TLS_DIR}/ca.crt")),
            ("OPENSHELL_TLS_CERT", format!("{TLS_DIR}/tls.crt")),
            ("OPENSHELL_TLS_KEY", format!("{TLS_DIR}/tls.key")),
            // Not set by the driver (its default is warn): info makes a failure's log tell
            // the supervisor's side of the story.
            ("OPENSHELL_LOG_LEVEL", "info".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let vol = |host: &Path, path: &str, read_only: bool| Volume {
            host: host.to_owned(),
            path: path.to_owned(),
            read_only,
        };
        let mut argv = vec![SUPERVISOR.to_owned()];
        let mut extra_volumes = Vec::new();
        if let Contract::V00111 {
            main_spec,
            user_env,
            ..
        } = &opts.contract
        {
            // The v0.0.111 driver renders neither the v0.0.36 command nor the handshake.
            env.retain(|(k, _)| {
                !matches!(
                    k.as_str(),
                    "OPENSHELL_SANDBOX_COMMAND"
                        | "OPENSHELL_SSH_HANDSHAKE_SECRET"
                        | "OPENSHELL_SSH_HANDSHAKE_SKEW_SECS"
                )
            });
            let uid = HEAD_SANDBOX_UID.to_string();
            env.extend(
                [
                    (
                        "OPENSHELL_K8S_SA_TOKEN_FILE",
                        format!("{SA_TOKEN_DIR}/token"),
                    ),
                    ("OPENSHELL_MAIN_PROCESS_SPEC", main_spec.clone()),
                    ("OPENSHELL_SANDBOX_UID", uid.clone()),
                    ("OPENSHELL_SANDBOX_GID", uid),
                    ("OPENSHELL_OCI_IMAGE_USER", String::new()),
                    ("OPENSHELL_USER_ENVIRONMENT", user_env.clone()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v)),
            );
            // A projected token volume: the token file, mode 0400 (root reads it).
            let sa = dir.join("volumes/openshell-sa-token");
            std::fs::create_dir_all(&sa)?;
            std::fs::write(sa.join("token"), format!("{}\n", net.state.sa_token))?;
            std::fs::set_permissions(
                sa.join("token"),
                std::os::unix::fs::PermissionsExt::from_mode(0o400),
            )?;
            extra_volumes.push(vol(&sa, SA_TOKEN_DIR, true));
            argv.extend(["--workdir".to_owned(), "/sandbox".to_owned()]);
        }
        let spec = Spec {
            hostname: name.clone(),
            rootfs,
            read_only_root: false,
            volumes: vec![
                vol(&node.host_path, "/opt/openshell/bin", true),
                vol(&cluster.client_secret.dir, TLS_DIR, true),
                vol(&workspace, "/sandbox", false),
                vol(&etc.join("hosts"), "/etc/hosts", false),
                vol(&etc.join("resolv.conf"), "/etc/resolv.conf", false),
                vol(&etc.join("hostname"), "/etc/hostname", false),
            ]
            .into_iter()
            .chain(extra_volumes)
            .collect(),
            netns: Some(net.ns.path.clone()),
            env,
            argv,
            log,
            add_caps: AGENT_ADDED_CAPS.to_vec(),
            seccomp: opts.seccomp,
        };
        let mut container = Container::start(&spec)?;
        wait_session(&net.state, &mut container).await?;
        let init_pid = container.wait_init(BINARY, Duration::from_secs(30)).await?;
        Ok(Pod {
            container,
            net,
            name,
            sandbox_id,
            init_pid,
            handshake_secret,
            seccomp: opts.seccomp,
        })
    }

    pub fn state(&self) -> &Arc<State> {
        &self.net.state
    }

    pub fn request(&self, argv: &[&str]) -> ExecSandboxRequest {
        ExecSandboxRequest {
            sandbox_id: self.sandbox_id.clone(),
            command: argv.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    /// ExecSandbox through the gateway, as a client of the real gateway would call it.
    pub async fn exec(&self, argv: &[&str]) -> ExecResult {
        exec_collect(self.net.state.clone(), self.request(argv)).await
    }

    pub async fn sh(&self, script: &str) -> ExecResult {
        self.exec(&["sh", "-c", script]).await
    }

    /// Like `exec`, with `stdin` fed to the command.
    pub async fn exec_stdin(&self, argv: &[&str], stdin: &str) -> ExecResult {
        let mut req = self.request(argv);
        req.stdin = stdin.as_bytes().to_vec();
        exec_collect(self.net.state.clone(), req).await
    }

    /// The namespace inodes of PID 1 that must be gone after teardown.
    pub fn namespaces(&self) -> anyhow::Result<PodNamespaces> {
        let get = |kind: &str| {
            container::ns_inode(self.init_pid, kind)
                .with_context(|| format!("reading /proc/{}/ns/{kind}", self.init_pid))
        };
        Ok(PodNamespaces {
            pid: get("pid")?,
            mnt: get("mnt")?,
            uts: get("uts")?,
            net: get("net")?,
        })
    }
}

#[derive(Debug, Clone, Copy)]
pub struct PodNamespaces {
    pub pid: u64,
    pub mnt: u64,
    pub uts: u64,
    pub net: u64,
}

/// Wait until the gateway has a live session for the pod (READY), or the pod has died.
async fn wait_session(state: &Arc<State>, container: &mut Container) -> anyhow::Result<()> {
    let limit = Duration::from_secs(60);
    let deadline = tokio::time::Instant::now() + limit;
    let mut rx = state.ready_rx();
    while !*rx.borrow_and_update() {
        if let Some(st) = container.try_status()? {
            bail!(
                "the pod ended ({}) before its supervisor had a session with the gateway",
                container::describe(&st)
            );
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("no supervisor session with the gateway after {limit:?}");
        }
        let _ = tokio::time::timeout(Duration::from_millis(200), rx.changed()).await;
    }
    Ok(())
}
