//! A container runtime in miniature: what kubelet and runc do for one container, with nothing
//! but util-linux and the kernel.
//!
//! `unshare --mount --uts --pid --fork` gives the container its own mount, UTS and PID
//! namespaces (plus a network namespace: a fresh empty one, or the pod's, joined with
//! `nsenter --net`, the way every container of a pod shares the pod sandbox's). A setup script,
//! still running the host's tools as PID 1 of the new PID namespace, lays out the mounts a
//! runtime gives every container (/proc, a read-only /sys, a /dev tmpfs with the usual device
//! nodes and a private devpts) and the pod's volumes as bind mounts, sets the hostname, and
//! finally `exec`s `chroot ROOTFS ENTRYPOINT` with exactly the container's environment. So the
//! entrypoint is PID 1 of its namespace, as in a pod.
//!
//! Nothing leaks: the mount namespace is private (unshare's default propagation), so every
//! mount disappears with the namespace; `--kill-child` makes the kernel SIGKILL the container's
//! PID 1 if the unshare parent dies, and a dying PID 1 takes its whole namespace with it.
//! [`Container`]'s Drop kills and reaps everything when a test fails half way, and if the test
//! process itself is killed (a CI timeout), the parent-death signal set on unshare ends it, and
//! with it the container.

use std::fs::File;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

use super::scenario::wait_for;

/// A bind mount from the node into the container.
pub struct Volume {
    pub host: PathBuf,
    /// Absolute path inside the container.
    pub path: String,
    pub read_only: bool,
}

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
    /// Where the container's stdout and stderr go (its `kubectl logs`).
    pub log: PathBuf,
}

pub struct Container {
    /// `unshare` (exec'd by `nsenter` when joining a pod network): the parent of PID 1.
    child: Child,
    status: Option<ExitStatus>,
    pub log: PathBuf,
}

/// Quote for a POSIX shell.
fn q(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Find a host tool on the test's PATH (the container gets its own PATH).
pub fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The devices a container runtime gives every container.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

fn setup_script(spec: &Spec) -> String {
    let root = spec.rootfs.display().to_string();
    // runc's default umask for the container; it also gives mount points runc-like modes.
    let mut s = String::from("set -eu\numask 022\n");
    s.push_str(&format!("R={}\n", q(&root)));
    // Mount points first: the root may be made read-only below. runc creates missing ones the
    // same way, in the container's writable layer.
    s.push_str("mkdir -p \"$R/proc\" \"$R/sys\" \"$R/dev\"\n");
    for v in &spec.volumes {
        if v.host.is_dir() {
            s.push_str(&format!("mkdir -p \"$R\"{}\n", q(&v.path)));
        } else {
            let parent = Path::new(&v.path).parent().unwrap().display().to_string();
            s.push_str(&format!(
                "mkdir -p \"$R\"{p}; [ -e \"$R\"{f} ] || : > \"$R\"{f}\n",
                p = q(&parent),
                f = q(&v.path)
            ));
        }
    }
    // A bind of the rootfs onto itself makes it a mount of its own, so it can be read-only.
    s.push_str("mount --bind \"$R\" \"$R\"\n");
    if spec.read_only_root {
        s.push_str("mount -o remount,bind,ro \"$R\"\n");
    }
    s.push_str("mount -t proc -o nosuid,nodev,noexec proc \"$R/proc\"\n");
    s.push_str("mount -t sysfs -o ro,nosuid,nodev,noexec sysfs \"$R/sys\"\n");
    s.push_str("mount -t tmpfs -o nosuid,noexec,mode=755,size=1024k tmpfs \"$R/dev\"\n");
    for d in DEVICES {
        s.push_str(&format!(
            ": > \"$R/dev/{d}\"; mount --bind /dev/{d} \"$R/dev/{d}\"\n"
        ));
    }
    s.push_str(
        "mkdir \"$R/dev/pts\" \"$R/dev/shm\"\n\
         mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts \"$R/dev/pts\"\n\
         ln -s pts/ptmx \"$R/dev/ptmx\"\n\
         mount -t tmpfs -o nosuid,nodev,mode=1777,size=65536k shm \"$R/dev/shm\"\n\
         ln -s /proc/self/fd \"$R/dev/fd\"\n\
         ln -s /proc/self/fd/0 \"$R/dev/stdin\"\n\
         ln -s /proc/self/fd/1 \"$R/dev/stdout\"\n\
         ln -s /proc/self/fd/2 \"$R/dev/stderr\"\n",
    );
    for v in &spec.volumes {
        s.push_str(&format!(
            "mount --bind {} \"$R\"{}\n",
            q(&v.host.display().to_string()),
            q(&v.path)
        ));
        if v.read_only {
            s.push_str(&format!("mount -o remount,bind,ro \"$R\"{}\n", q(&v.path)));
        }
    }
    // Our UTS namespace: this names the container, not the host.
    s.push_str(&format!(
        "printf %s {} > /proc/sys/kernel/hostname\n",
        q(&spec.hostname)
    ));
    s.push_str("exec env -i");
    for (k, v) in &spec.env {
        s.push(' ');
        s.push_str(&q(&format!("{k}={v}")));
    }
    s.push_str(" chroot \"$R\"");
    for a in &spec.argv {
        s.push(' ');
        s.push_str(&q(a));
    }
    s.push('\n');
    s
}

impl Container {
    pub fn start(spec: &Spec) -> anyhow::Result<Container> {
        let unshare = tool("unshare").context("unshare (util-linux) is not installed")?;
        let log = File::create(&spec.log)
            .with_context(|| format!("creating the container log {}", spec.log.display()))?;
        let mut cmd = match &spec.netns {
            Some(ns) => {
                let nsenter = tool("nsenter").context("nsenter (util-linux) is not installed")?;
                let mut c = Command::new(nsenter);
                // Entering only a network namespace, nsenter execs unshare without forking.
                c.arg(format!("--net={}", ns.display()))
                    .arg("--")
                    .arg(&unshare);
                c
            }
            None => {
                let mut c = Command::new(&unshare);
                c.arg("--net");
                c
            }
        };
        cmd.args([
            "--mount",
            "--uts",
            "--pid",
            "--fork",
            "--kill-child=SIGKILL",
            "--propagation",
            "private",
            "--",
            "/bin/sh",
            "-c",
        ])
        .arg(setup_script(spec))
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
        // SAFETY: one raw prctl between fork and exec, on no shared data. The signal follows the
        // spawning thread, which is the test's own thread: it outlives every container (they are
        // dropped before the test returns), and dies with the test process.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().context("starting unshare")?;
        Ok(Container {
            child,
            status: None,
            log: spec.log.clone(),
        })
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The exit status of the container's PID 1 (unshare passes it on), if it has ended.
    pub fn try_status(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = self.child.try_wait().context("waiting for unshare")?;
        }
        Ok(self.status)
    }

    /// Host pid of the container's PID 1 once it runs a program whose file name is `exe_name`
    /// (before that it is still the setup shell, then chroot).
    pub async fn wait_init(&mut self, exe_name: &str, limit: Duration) -> anyhow::Result<i32> {
        let parent = self.child.id() as i32;
        let what = format!("the container's PID 1 running {exe_name}");
        wait_for(limit, &what, || {
            if let Some(st) = self.try_status()? {
                bail!("the container ended ({st}) before its PID 1 ran {exe_name}");
            }
            let Some(pid) = child_of(parent) else {
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

impl Drop for Container {
    fn drop(&mut self) {
        if self.status.is_none() {
            // --kill-child turns unshare's death into SIGKILL for PID 1, which ends the whole
            // PID namespace; the mount namespace goes with its last process.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The (single) child of `parent`, by scanning /proc (no CONFIG_PROC_CHILDREN needed).
pub fn child_of(parent: i32) -> Option<i32> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let ppid = status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|v| v.trim().parse::<i32>().ok());
        if ppid == Some(parent) {
            return Some(pid);
        }
    }
    None
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
