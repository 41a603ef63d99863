//! A real OCI runtime (runc, or crun with OSB_E2E_RUNTIME=crun), configured as kubelet and
//! containerd configure a container:
//! - namespaces: PID, mount, IPC, UTS, cgroup, and network (the pod's, shared by its containers,
//!   or a fresh empty one);
//! - containerd's default mounts: /proc, a /dev tmpfs (the runtime adds the usual device nodes),
//!   a private devpts, /dev/shm, /dev/mqueue, a read-only /sys and a read-only /sys/fs/cgroup;
//!   the pod's volumes as bind mounts;
//! - containerd's default masked paths (an empty read-only mount over each) and read-only paths
//!   under /proc and /sys;
//! - the capability set the pod asks for (containerd's default set, plus what the container's
//!   securityContext adds), in the bounding, effective and permitted sets;
//! - seccomp: none (Unconfined, the kubelet default) or a RuntimeDefault-like profile
//!   (`seccomp.rs`);
//! - a device cgroup that denies every device but the runtime's defaults, in a cgroup of its own.
//!
//! The container's entrypoint is its PID 1, a child of `runc run` in the foreground, which
//! passes on its exit status. Each container's state lives under one runtime root; [`Container`]'s
//! Drop kills and deletes it when a test fails half way. runc has no parent-death signal for the
//! container, so containers of a test process that was killed outright are deleted by the next
//! run (their ids carry the dead process's pid), like its network namespaces.

use std::fs::File;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::scenario::wait_for;
use super::seccomp;

/// A bind mount from the node into the container.
pub struct Volume {
    pub host: PathBuf,
    /// Absolute path inside the container.
    pub path: String,
    pub read_only: bool,
}

/// The container's seccomp profile (`securityContext.seccompProfile.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seccomp {
    Unconfined,
    RuntimeDefault,
}

/// containerd's default capability set.
pub const DEFAULT_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// What the sandbox pod's `agent` container adds.
pub const AGENT_ADDED_CAPS: &[&str] = &[
    "CAP_SYS_ADMIN",
    "CAP_NET_ADMIN",
    "CAP_SYS_PTRACE",
    "CAP_SYSLOG",
];

/// containerd's default masked paths.
pub const MASKED_PATHS: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// containerd's default read-only paths.
pub const READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

pub struct Spec {
    /// The container's hostname (a pod's hostname is the pod name).
    pub hostname: String,
    pub rootfs: PathBuf,
    /// `readOnlyRootFilesystem`.
    pub read_only_root: bool,
    pub volumes: Vec<Volume>,
    /// The pod's network namespace (`/run/netns/NAME`); `None` gives a fresh, empty one.
    pub netns: Option<PathBuf>,
    /// The complete environment of the entrypoint.
    pub env: Vec<(String, String)>,
    /// Entrypoint and arguments, resolved inside the rootfs.
    pub argv: Vec<String>,
    /// Where the container's stdout and stderr go (its `kubectl logs`). The bundle is made
    /// beside it.
    pub log: PathBuf,
    /// Capabilities added to containerd's default set.
    pub add_caps: Vec<&'static str>,
    pub seccomp: Seccomp,
}

pub struct Container {
    /// `runc run`, the parent of PID 1.
    child: Child,
    status: Option<ExitStatus>,
    pub id: String,
    pub log: PathBuf,
}

/// Find a host tool on the test's PATH (the container gets its own PATH).
pub fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The OCI runtime: runc unless OSB_E2E_RUNTIME names another (crun).
pub fn runtime_name() -> String {
    std::env::var("OSB_E2E_RUNTIME").unwrap_or_else(|_| "runc".into())
}

/// Where the runtime keeps container state (a tmpfs, as the runtimes want).
const RUNTIME_ROOT: &str = "/run/osb-e2e-runtime";
const ID_PREFIX: &str = "osb-e2e-";
static NEXT: AtomicU32 = AtomicU32::new(0);

fn runtime() -> anyhow::Result<Command> {
    let name = runtime_name();
    let bin = tool(&name)
        .with_context(|| format!("`{name}` is not installed (apt-get install {name})"))?;
    let mut c = Command::new(bin);
    c.arg("--root").arg(RUNTIME_ROOT);
    Ok(c)
}

/// Kill and delete a container, whatever state it is in.
fn destroy(id: &str) {
    if let Ok(mut c) = runtime() {
        let _ = c
            .args(["kill", "--all", id, "KILL"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    if let Ok(mut c) = runtime() {
        let _ = c
            .args(["delete", "--force", id])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Delete the containers of earlier test processes that no longer exist.
fn reap_stale() {
    let Ok(dir) = std::fs::read_dir(RUNTIME_ROOT) else {
        return;
    };
    for e in dir.flatten() {
        let id = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = id
            .strip_prefix(ID_PREFIX)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            destroy(&id);
        }
    }
}

fn bind(v: &Volume) -> Value {
    json!({
        "destination": v.path,
        "type": "bind",
        "source": v.host,
        "options": ["rbind", "rprivate", if v.read_only { "ro" } else { "rw" }],
    })
}

/// The OCI config.json of `spec`.
pub fn config(spec: &Spec, id: &str) -> Value {
    let caps: Vec<&str> = DEFAULT_CAPS
        .iter()
        .chain(spec.add_caps.iter())
        .copied()
        .collect();
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc",
               "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
               "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
               "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
        json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
               "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs",
               "options": ["nosuid", "noexec", "nodev", "ro"]}),
        json!({"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
               "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]}),
    ];
    mounts.extend(spec.volumes.iter().map(bind));
    let mut namespaces = vec![
        json!({"type": "pid"}),
        json!({"type": "ipc"}),
        json!({"type": "uts"}),
        json!({"type": "mount"}),
        json!({"type": "cgroup"}),
    ];
    namespaces.push(match &spec.netns {
        Some(p) => json!({"type": "network", "path": p}),
        None => json!({"type": "network"}),
    });
    let mut linux = json!({
        "namespaces": namespaces,
        // A top-level group per container, no shared parent: removing a parent that another
        // container's runtime is creating a child in raced (ENOENT in that runc).
        "cgroupsPath": format!("/{id}"),
        "resources": {"devices": [{"allow": false, "access": "rwm"}]},
        "maskedPaths": MASKED_PATHS,
        "readonlyPaths": READONLY_PATHS,
        "rootfsPropagation": "rprivate",
    });
    if spec.seccomp == Seccomp::RuntimeDefault {
        linux["seccomp"] = seccomp::runtime_default(&caps);
    }
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": spec.argv,
            "env": spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
            "cwd": "/",
            "capabilities": {
                "bounding": caps, "effective": caps, "permitted": caps,
                "inheritable": [], "ambient": [],
            },
            // allowPrivilegeEscalation defaults to true in Kubernetes.
            "noNewPrivileges": false,
        },
        "root": {"path": spec.rootfs, "readonly": spec.read_only_root},
        "hostname": spec.hostname,
        "mounts": mounts,
        "linux": linux,
    })
}

impl Container {
    pub fn start(spec: &Spec) -> anyhow::Result<Container> {
        reap_stale();
        let id = format!(
            "{ID_PREFIX}{}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst),
            spec.hostname
        );
        let bundle = spec.log.with_extension("bundle");
        std::fs::create_dir_all(&bundle)
            .with_context(|| format!("creating the bundle {}", bundle.display()))?;
        std::fs::write(
            bundle.join("config.json"),
            serde_json::to_vec_pretty(&config(spec, &id))?,
        )?;
        let log = File::create(&spec.log)
            .with_context(|| format!("creating the container log {}", spec.log.display()))?;
        let mut cmd = runtime()?;
        cmd.arg("run")
            .arg("--bundle")
            .arg(&bundle)
            .arg(&id)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // SAFETY: one raw prctl between fork and exec, on no shared data. If the test process
        // dies, the runtime's foreground process dies too; the container itself outlives it
        // until the next run deletes it (see the module comment).
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting `{} run`", runtime_name()))?;
        Ok(Container {
            child,
            status: None,
            id,
            log: spec.log.clone(),
        })
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The exit status of the container's PID 1 (the runtime passes it on), if it has ended.
    pub fn try_status(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = self.child.try_wait().context("waiting for the runtime")?;
        }
        Ok(self.status)
    }

    /// Host pid of the container's PID 1 once it runs a program whose file name is `exe_name`.
    pub async fn wait_init(&mut self, exe_name: &str, limit: Duration) -> anyhow::Result<i32> {
        let what = format!("the container's PID 1 running {exe_name}");
        let id = self.id.clone();
        wait_for(limit, &what, || {
            if let Some(st) = self.try_status()? {
                bail!("the container ended ({st}) before its PID 1 ran {exe_name}");
            }
            let Some(pid) = state_pid(&id) else {
                return Ok(None);
            };
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
            let name = exe.file_name().unwrap_or_default().to_string_lossy();
            Ok(name.starts_with(exe_name).then_some(pid))
        })
        .await
    }

    /// Wait for the container to end. The limit only guards against a hang.
    pub async fn wait(&mut self, limit: Duration) -> anyhow::Result<ExitStatus> {
        wait_for(limit, "the container's exit", || self.try_status()).await
    }

    /// Run to completion; the status and the log.
    pub async fn run(spec: &Spec, limit: Duration) -> anyhow::Result<(ExitStatus, String)> {
        let mut c = Container::start(spec)?;
        let st = c.wait(limit).await?;
        Ok((st, c.log_text()))
    }
}

impl Container {
    /// `runc exec`: `argv` as a new process of the running container, with the container's own
    /// configuration (namespaces, capabilities, seccomp, cgroup), as `kubectl exec` runs one.
    pub fn exec(&self, argv: &[&str]) -> anyhow::Result<std::process::Output> {
        runtime()?
            .arg("exec")
            .arg(&self.id)
            .args(argv)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("`{} exec {}`", runtime_name(), self.id))
    }

    /// The container's cgroup directories on the host (one per v1 hierarchy, or the v2 one).
    pub fn cgroup_dirs(&self) -> Vec<PathBuf> {
        cgroup_dirs(&self.id)
    }
}

pub fn cgroup_dirs(id: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/sys/fs/cgroup") else {
        return out;
    };
    for e in dir.flatten() {
        out.push(e.path().join(id));
    }
    out.push(PathBuf::from("/sys/fs/cgroup").join(id));
    out
}

/// PID 1's host pid from the runtime's state of a running container.
fn state_pid(id: &str) -> Option<i32> {
    let out = runtime().ok()?.args(["state", id]).output().ok()?;
    let state: Value = serde_json::from_slice(&out.stdout).ok()?;
    if state["status"] != "running" {
        return None;
    }
    state["pid"].as_i64().map(|p| p as i32).filter(|p| *p > 0)
}

impl Drop for Container {
    fn drop(&mut self) {
        if self.status.is_none() {
            // SIGKILL to every process of the container; its PID 1's death ends the PID
            // namespace, and the mount namespace goes with its last process.
            destroy(&self.id);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        destroy(&self.id);
    }
}

/// The pid as seen inside the process's innermost PID namespace (last field of NSpid).
pub fn ns_pid(pid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// Every host pid whose namespace of `kind` (e.g. "pid", "mnt", "net") is `inode`.
pub fn processes_in_ns(kind: &str, inode: u64) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if ns_inode(pid, kind) == Some(inode) {
            out.push(pid);
        }
    }
    out
}

/// Inode of a process's namespace of `kind`.
pub fn ns_inode(pid: i32, kind: &str) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/{kind}"))
        .ok()
        .map(|m| m.ino())
}

/// A readable summary of an exit status.
pub fn describe(st: &ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => format!("{st}"),
    }
}
