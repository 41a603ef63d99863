//! The view's root holds only what the policy grants (SECURITY.md, "What Landlock ABI 7 leaves
//! open"): a path outside the grants does not exist inside, so a pathname unix socket there
//! cannot be connected to (Landlock before ABI 9 does not check connect), and `stat`, inotify
//! and listing cannot probe it either.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::support::{self, AuthMode, SupOpts};
use super::support::{BIN, PauseDir, Workdir, require_pause_points, require_root};
use super::{Background, PY_ATTEMPT, expect_out, py_as, supervisors, tagged, unique};

/// A directory outside every grant (not below /tmp, which the view replaces anyway), readable
/// and searchable by everyone, removed when dropped.
struct Outside(PathBuf);

impl Outside {
    fn new() -> Outside {
        let p = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("osb-outside-{}", unique()));
        std::fs::create_dir_all(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        Outside(p)
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Python: connect to `sock`, stat `dir`, inotify_add_watch on `dir`.
fn probe_code(dir: &Path, sock: &Path) -> String {
    format!(
        r#"{PY_ATTEMPT}
import ctypes, socket
libc = ctypes.CDLL(None, use_errno=True)
def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("{sock}")
def watch():
    fd = libc.inotify_init1(0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    if libc.inotify_add_watch(fd, b"{dir}", 0xfff) < 0:
        raise OSError(ctypes.get_errno(), "inotify_add_watch")
attempt("connect", connect)
attempt("stat-dir", lambda: os.stat("{dir}") and None)
attempt("stat-sock", lambda: os.stat("{sock}") and None)
attempt("inotify", watch)
"#,
        sock = sock.display(),
        dir = dir.display()
    )
}

/// A 0777 listening socket in a directory outside the grants: the sandbox's connect gets
/// ENOENT (it connected before the view had a root of its own), and stat and inotify of that
/// directory get ENOENT too. For a root and a non-root (user namespace) supervisor.
#[test]
fn unix_socket_stat_and_inotify_outside_the_grants_are_enoent() {
    if !require_root() {
        return;
    }
    let out = Outside::new();
    let sock = out.0.join("s.sock");
    let _listener = UnixListener::bind(&sock).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777)).unwrap();
    let wd = Workdir::new();
    for uid in supervisors() {
        let r = py_as(uid, &wd, &[], &probe_code(&out.0, &sock));
        expect_out(
            &r,
            "connect ENOENT\nstat-dir ENOENT\nstat-sock ENOENT\ninotify ENOENT\n",
        );
    }
}

/// Inside the view: the system directories (with their symlinks as symlinks), the workdir,
/// /tmp and the granted devices work; what no grant names does not exist.
#[test]
fn granted_paths_links_workdir_tmp_and_devices_work_and_nothing_else_exists() {
    if !require_root() {
        return;
    }
    let lib = std::fs::read_link("/lib")
        .map(|l| l.display().to_string())
        .unwrap_or_else(|_| "EINVAL".into());
    let code = r#"
attempt("python", lambda: os.stat(sys.executable) and None)
attempt("lib", lambda: os.readlink("/lib"))
attempt("libc-by-link", lambda: len(os.listdir("/lib")) > 0)
attempt("etc", lambda: os.stat("/etc/passwd") and None)
attempt("workdir", lambda: open("f", "w").write("x") and None)
attempt("tmp", lambda: open("/tmp/x", "w").write("x") and None)
attempt("dev-null", lambda: open("/dev/null", "w").write("x") and None)
attempt("dev-urandom", lambda: len(open("/dev/urandom", "rb").read(4)))
attempt("dev-fd", lambda: os.readlink("/dev/fd"))
for p in ("/home", "/root", "/var", "/sys", "/dev/ptmx", "/dev/kmsg", "/boot"):
    attempt(p, lambda: os.stat(p) and None)
"#;
    for uid in supervisors() {
        // A workdir per supervisor: the file the root run leaves is its leased uid's.
        let wd = Workdir::new();
        let r = py_as(uid, &wd, &[], code);
        expect_out(
            &r,
            &format!(
                "python OK\nlib {lib}\nlibc-by-link True\netc OK\nworkdir OK\ntmp OK\n\
                 dev-null OK\ndev-urandom 4\ndev-fd /proc/self/fd\n/home ENOENT\n/root ENOENT\n\
                 /var ENOENT\n/sys ENOENT\n/dev/ptmx ENOENT\n/dev/kmsg ENOENT\n/boot ENOENT\n"
            ),
        );
    }
}

/// The root of a running sandbox, read from the host through /proc/PID/root: its top level
/// holds only the granted system directories (symlinks kept as symlinks), /tmp (which holds the
/// workdir here), /dev and /proc; its /dev only the granted devices, /dev/shm, the terminal's
/// /dev/pts and the standard links (fd, stdin, stdout, stderr).
#[test]
fn the_views_root_lists_only_granted_top_level_entries() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let tag = format!("osb-root-{}", unique());
    let mut bg = Background::start(
        &wd,
        &[],
        &[
            "python3",
            "-c",
            "import sys, time; print('ready', flush=True); time.sleep(30)",
            &tag,
        ],
    );
    bg.expect_line("ready\n");
    let pid = tagged(&tag)
        .into_iter()
        .find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c.starts_with(b"python3\0"))
        })
        .expect("the sandboxed python");
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    let names = |d: &Path| -> BTreeSet<String> {
        std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    let mut want: BTreeSet<String> = [
        "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
    ]
    .iter()
    .filter(|p| std::fs::symlink_metadata(p).is_ok())
    .map(|p| p[1..].to_string())
    .collect();
    want.extend(["tmp", "dev", "proc"].map(String::from));
    assert_eq!(names(&root), want, "top level of the view");
    for l in ["/bin", "/lib", "/lib64", "/sbin"] {
        if let Ok(target) = std::fs::read_link(l) {
            assert_eq!(
                std::fs::read_link(root.join(&l[1..])).ok(),
                Some(target),
                "{l} is a symlink in the view as on the host"
            );
        }
    }
    let mut devs: BTreeSet<String> = ["null", "zero", "full", "random", "urandom", "tty"]
        .iter()
        .filter(|d| Path::new("/dev").join(d).exists())
        .map(|d| d.to_string())
        .collect();
    devs.extend(["shm", "fd", "stdin", "stdout", "stderr"].map(String::from));
    if Path::new("/dev/pts").is_dir() {
        devs.insert("pts".into());
    }
    assert_eq!(names(&root.join("dev")), devs, "/dev of the view");
    drop(bg);
}

/// serve: the view's root is made once per sandbox; two execs share its /tmp, and a path
/// outside the grants does not exist for either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_execs_share_tmp_in_a_root_of_granted_paths_only() {
    if !support::require(support::is_root(), "the serve view tests run as root") {
        return;
    }
    let out = Outside::new();
    let sock = out.0.join("s.sock");
    let _listener = UnixListener::bind(&sock).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (gw, _sup) = support::up(AuthMode::Jwt, SupOpts::default()).await;
    let tag = format!("osb-root-serve-{}", unique());
    let write = format!("open('/tmp/{tag}', 'w').write('from exec 1'); print('written')");
    let r = gw.exec(&["python3", "-c", &write]).await;
    assert_eq!(
        (r.out().as_str(), r.exit),
        ("written\n", Some(0)),
        "{}",
        r.err()
    );
    let read = format!(
        "{}\nprint(open('/tmp/{tag}').read())",
        probe_code(&out.0, &sock)
    );
    let r = tokio::time::timeout(Duration::from_secs(60), gw.exec(&["python3", "-c", &read]))
        .await
        .expect("exec 2");
    assert_eq!(
        (r.out().as_str(), r.exit),
        (
            "connect ENOENT\nstat-dir ENOENT\nstat-sock ENOENT\ninotify ENOENT\nfrom exec 1\n",
            Some(0)
        ),
        "{}",
        r.err()
    );
}

/// The view binds the inode the policy walk decided on, or nothing. The supervisor is held
/// after the walk resolved a `--ro` grant and before the helper binds it; the test then puts
/// another directory (holding a secret) in its place. The run must refuse, naming the stale
/// grant, and never show the secret (without the device/inode check the helper bound the
/// swapped directory, and the command read it).
#[test]
fn a_grant_swapped_between_the_walk_and_the_bind_is_refused() {
    if !require_root() || !require_pause_points() {
        return;
    }
    let out = Outside::new();
    let granted = out.0.join("granted");
    let other = out.0.join("other");
    for d in [&granted, &other] {
        std::fs::create_dir(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::write(granted.join("f"), "real\n").unwrap();
    std::fs::write(other.join("f"), "SECRET\n").unwrap();
    let wd = Workdir::new();
    let pause = PauseDir::new();
    let point = "view-plan";
    let child = std::process::Command::new(BIN)
        .args(["run", "--workdir"])
        .arg(wd.path())
        .arg("--ro")
        .arg(&granted)
        .args(["--", "cat"])
        .arg(granted.join("f"))
        .envs(pause.env(point))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        pause.wait_reached(point, 60),
        "the supervisor never reached {point}"
    );
    std::fs::rename(&granted, out.0.join("granted.old")).unwrap();
    std::fs::rename(&other, &granted).unwrap();
    pause.release(point);
    let r = child.wait_with_output().unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&r.stderr),
    );
    assert!(
        !so.contains("SECRET"),
        "the swapped directory was bound: {so}{se}"
    );
    assert_eq!(r.status.code(), Some(125), "{so}{se}");
    assert!(
        se.contains("open a granted path as the policy walk resolved it: Stale file handle"),
        "{se}"
    );
}
