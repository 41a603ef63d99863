//! What the test keeps outside the sandbox to see whether an attempt got through: a witness
//! process that counts signals, sockets that record connections, the default secret
//! directory, and the search for processes that outlived a run.

use std::io::{BufRead, BufReader, Read};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::{PermissionsExt, chown};
use std::os::unix::net::{SocketAddr, UnixDatagram, UnixListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use super::Scene;

/// A process outside the sandbox, as the scene's uid and dumpable: only the sandbox keeps the
/// probe from signalling it, tracing it or reading its /proc files.
pub struct Witness {
    child: Child,
    pub pid: i32,
}

impl Witness {
    pub fn start(scene: &Scene, uid: u32) -> Witness {
        let mut child = Command::new(&scene.probe)
            .arg("witness")
            .uid(uid)
            .gid(uid)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the witness");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let pid = line
            .strip_prefix("ready ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("witness did not start: {line:?}"));
        Witness { child, pid }
    }

    /// Stop the witness; returns the signals it received, by number.
    pub fn finish(mut self) -> serde_json::Map<String, serde_json::Value> {
        // A successful ptrace attach (without the sandbox) can leave it stopped.
        // SAFETY: kill with integer arguments, to our own unreaped child.
        unsafe { libc::kill(self.pid, libc::SIGCONT) };
        drop(self.child.stdin.take());
        let mut out = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        self.child.wait().unwrap();
        let v: serde_json::Value = serde_json::from_str(out.trim())
            .unwrap_or_else(|e| panic!("witness output {out:?}: {e}"));
        v["signals"].as_object().cloned().unwrap_or_default()
    }
}

/// Sockets held outside the sandbox: an abstract stream listener, an abstract datagram socket,
/// and a pathname stream listener in the outside directory (mode 0777, so the uid could
/// connect if nothing else stopped it).
pub struct Listeners {
    pub abstract_name: String,
    pub dgram_name: String,
    pub path: PathBuf,
    stream: UnixListener,
    dgram: UnixDatagram,
    path_listener: UnixListener,
}

impl Listeners {
    pub fn new(scene: &Scene, tag: &str) -> Listeners {
        let abstract_name = format!("osb-adv-{}-{tag}", std::process::id());
        let dgram_name = format!("{abstract_name}-dgram");
        let stream =
            UnixListener::bind_addr(&SocketAddr::from_abstract_name(&abstract_name).unwrap())
                .unwrap();
        let dgram =
            UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(&dgram_name).unwrap()).unwrap();
        let path = scene.outside.join("listener.sock");
        let path_listener = UnixListener::bind(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
        for s in [&stream, &path_listener] {
            s.set_nonblocking(true).unwrap();
        }
        dgram.set_nonblocking(true).unwrap();
        Listeners {
            abstract_name,
            dgram_name,
            path,
            stream,
            dgram,
            path_listener,
        }
    }

    pub fn params(&self) -> Vec<String> {
        vec![
            format!("abstract={}", self.abstract_name),
            format!("abstract_dgram={}", self.dgram_name),
            format!("unix_path={}", self.path.display()),
        ]
    }

    /// A connection that completed sits in the backlog whether or not anyone accepted it.
    pub fn abstract_connected(&self) -> bool {
        self.stream.accept().is_ok()
    }

    pub fn dgram_received(&self) -> bool {
        self.dgram.recv(&mut [0u8; 16]).is_ok()
    }

    pub fn path_connected(&self) -> bool {
        self.path_listener.accept().is_ok()
    }
}

/// Serialises creating and removing the stand-in file in /etc/openshell-tls between the tests
/// of one binary, so one test's cleanup never removes the directory under another's run.
static TLS_DIR: Mutex<bool> = Mutex::new(false);
pub const TLS_DIR_PATH: &str = "/etc/openshell-tls";

/// A stand-in key in /etc/openshell-tls, one of the default secret directories, below /etc,
/// which the default policy grants: it stays unreadable only because the grant on /etc is split
/// around it. The directory is removed again if this process created it and it is empty.
pub struct TlsStandIn {
    pub path: PathBuf,
}

impl TlsStandIn {
    pub fn create(owner: u32, tag: &str) -> TlsStandIn {
        let mut created = TLS_DIR.lock().unwrap_or_else(|p| p.into_inner());
        let dir = Path::new(TLS_DIR_PATH);
        if !dir.exists() {
            std::fs::create_dir(dir).unwrap();
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
            *created = true;
        }
        let path = dir.join(format!("osb-adv-{}-{tag}.key", std::process::id()));
        std::fs::write(&path, "-----BEGIN STAND-IN KEY-----\n").unwrap();
        chown(&path, Some(owner), Some(owner)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        TlsStandIn { path }
    }
}

impl Drop for TlsStandIn {
    fn drop(&mut self) {
        let created = TLS_DIR.lock().unwrap_or_else(|p| p.into_inner());
        let _ = std::fs::remove_file(&self.path);
        if *created {
            // Fails while another test's file is still there; the last one removes it.
            let _ = std::fs::remove_dir(TLS_DIR_PATH);
        }
    }
}

/// Kernel files some attempts aim at, with whether they exist on this machine: an attempt on
/// an absent one can only give ENOENT, and the table says so.
pub fn kernel_targets() -> Vec<(&'static str, PathBuf)> {
    let first = |cands: &[&str]| {
        cands
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .unwrap_or_else(|| PathBuf::from(cands[cands.len() - 1]))
    };
    let release_agent = std::fs::read_dir("/sys/fs/cgroup")
        .ok()
        .and_then(|d| {
            d.flatten()
                .map(|e| e.path().join("release_agent"))
                .find(|p| p.exists())
        })
        .unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup/release_agent"));
    vec![
        ("sysrq", PathBuf::from("/proc/sysrq-trigger")),
        ("kmsg", PathBuf::from("/dev/kmsg")),
        (
            "raw_disk",
            first(&[
                "/dev/vda",
                "/dev/sda",
                "/dev/nvme0n1",
                "/dev/xvda",
                "/dev/mem",
            ]),
        ),
        ("release_agent", release_agent),
        (
            "root_cgroup_procs",
            first(&[
                "/sys/fs/cgroup/cgroup.procs",
                "/sys/fs/cgroup/pids/cgroup.procs",
            ]),
        ),
    ]
}

/// Live (not zombie) processes of `uid`, as "pid comm" strings.
pub fn live_processes(uid: u32) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().to_owned())
                .unwrap_or_default()
        };
        let real_uid = field("Uid:").split_whitespace().next().map(str::to_owned);
        if real_uid.as_deref() == Some(uid.to_string().as_str())
            && !field("State:").starts_with('Z')
        {
            out.push(format!("{pid} {}", field("Name:")));
        }
    }
    out
}

/// Look for survivors of `uid` a few times (a process that keeps forking and exiting has a
/// new pid at every look, and a single pass over /proc can step over it).
pub fn survivors(uid: u32) -> Vec<String> {
    let mut seen = Vec::new();
    for _ in 0..5 {
        seen.extend(live_processes(uid));
    }
    seen.sort();
    seen.dedup();
    seen
}

/// SIGKILL every process of `uid` (the probe's `killuid` mode, run as that uid). Returns
/// whether nothing of the uid is left. Never for uid 0: that would be the whole machine.
pub fn kill_uid(scene: &Scene, uid: u32) -> bool {
    assert_ne!(uid, 0, "kill_uid(0) would kill every root process");
    Command::new(&scene.probe)
        .arg("killuid")
        .uid(uid)
        .gid(uid)
        .status()
        .is_ok_and(|s| s.success())
}

/// Live processes whose name (comm) is `marker`, as "pid comm" strings.
pub fn named(marker: &str) -> Vec<String> {
    let mut seen = Vec::new();
    for _ in 0..5 {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            break;
        };
        for e in dir.flatten() {
            let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
                continue;
            };
            let name = status
                .lines()
                .find_map(|l| l.strip_prefix("Name:"))
                .map(str::trim);
            let zombie = status
                .lines()
                .find_map(|l| l.strip_prefix("State:"))
                .is_some_and(|s| s.trim().starts_with('Z'));
            if name == Some(marker) && !zombie {
                seen.push(format!("{} {marker}", e.file_name().to_string_lossy()));
            }
        }
    }
    seen.sort();
    seen.dedup();
    seen
}

/// SIGKILL processes named `marker` until none is left (bounded). For uid 0 runs, where
/// `kill_uid` cannot be used.
pub fn kill_named(marker: &str) -> bool {
    for _ in 0..1000 {
        let left = named(marker);
        if left.is_empty() {
            return true;
        }
        for p in left {
            if let Some(pid) = p
                .split_whitespace()
                .next()
                .and_then(|p| p.parse::<i32>().ok())
            {
                // SAFETY: kill with integer arguments.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
    false
}
