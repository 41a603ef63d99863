//! The harness around the escape probe (`tests/support/probe/*.c`): build it, lay out the files it
//! attacks, run it inside `openshell-sandbox run` with the supervisor as root or as a non-root
//! user, and parse its output, one JSON line per attempt.
//!
//! Everything here needs root: to give files to the test uids, to run the supervisor under
//! another uid, to create the default secret directory. Each test uses its own uid (see the
//! callers), so RLIMIT_NPROC, which counts processes per uid system wide, and the search for
//! survivors after a run never mix two tests, nor anything else on the machine.

pub mod expect;
pub mod machine;
pub mod outside;

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::{PermissionsExt, chown};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, mpsc};
use std::time::Duration;

use serde_json::Value;

pub use crate::support::BIN;
pub use crate::support::skip::{is_root, require};

/// Root (to run the supervisor as other uids and own files for them) and a C compiler (the
/// probe is C, for raw syscalls, int 0x80 and x32).
pub fn require_root_and_cc() -> bool {
    require(
        is_root(),
        "root: the escape suites run the supervisor as root and as a test uid",
    ) && require(
        Command::new("cc")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "a C compiler `cc` to build tests/support/probe",
    )
}

/// The probe, the setuid helper and the crasher, compiled once per test binary.
pub struct Built {
    pub probe: PathBuf,
    pub setuid_helper: PathBuf,
    /// tests/support/probe/crasher.c, named so that its comm says what it is.
    pub crasher: PathBuf,
}

pub fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/probe");
        let exe = std::env::current_exe().unwrap();
        let tag = exe.file_name().unwrap().to_string_lossy().into_owned();
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("probe-{tag}"));
        std::fs::create_dir_all(&out).unwrap();
        let cc = |output: &Path, files: &[&str]| {
            let tmp = output.with_extension("tmp");
            let st = Command::new("cc")
                .args(["-O1", "-Wall", "-Wextra", "-o"])
                .arg(&tmp)
                .args(files.iter().map(|f| src.join(f)))
                .status()
                .unwrap();
            assert!(st.success(), "compiling {files:?} failed");
            std::fs::rename(&tmp, output).unwrap();
        };
        let probe = out.join("probe");
        cc(
            &probe,
            &[
                "probe.c",
                "fs.c",
                "procs.c",
                "net.c",
                "kernel.c",
                "priv.c",
                "bombs.c",
                "sched.c",
                "witness.c",
                "host.c",
            ],
        );
        let setuid_helper = out.join("setuid-helper");
        cc(&setuid_helper, &["setuid_helper.c"]);
        let crasher = out.join("osb-crasher");
        cc(&crasher, &["crasher.c"]);
        Built {
            probe,
            setuid_helper,
            crasher,
        }
    })
}

fn mkdir(p: &Path, mode: u32, owner: Option<u32>) {
    std::fs::create_dir(p).unwrap();
    if let Some(u) = owner {
        chown(p, Some(u), Some(u)).unwrap();
    }
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn write_file(p: &Path, text: &str, mode: u32, owner: Option<u32>) {
    std::fs::write(p, text).unwrap();
    if let Some(u) = owner {
        chown(p, Some(u), Some(u)).unwrap();
    }
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The files one run attacks. Everything the probe should not reach is owned by the sandbox
/// uid and readable by it, so ownership never protects it: every refusal is the sandbox's.
pub struct Scene {
    _tmp: tempfile::TempDir,
    /// The uid the sandboxed child runs as (and, for a non-root supervisor, the supervisor).
    pub uid: u32,
    pub wd: PathBuf,
    /// Root-owned, `--ro`: the probe and the setuid-root helper.
    pub bin: PathBuf,
    pub probe: PathBuf,
    pub setuid: PathBuf,
    /// `--ro` directory holding a readable file and the `--deny` directory beside it.
    pub ro: PathBuf,
    pub public: PathBuf,
    pub secret_dir: PathBuf,
    pub secret: PathBuf,
    /// Outside every grant, mode 0777.
    pub outside: PathBuf,
    pub outside_file: PathBuf,
    /// Where the supervisor writes --report-json (owned by the uid, for a non-root supervisor).
    pub reports: PathBuf,
}

impl Scene {
    pub fn new(uid: u32) -> Scene {
        // Not below /tmp: there the run's view has its own tmpfs, so every path of the scene
        // outside the grants would not even exist, and the Landlock answers this suite is
        // about would never be asked.
        let tmp = tempfile::Builder::new()
            .prefix("osb-adv-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap();
        let base = tmp.path().to_path_buf();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        let wd = base.join("wd");
        mkdir(&wd, 0o755, Some(uid));
        let bin = base.join("bin");
        mkdir(&bin, 0o755, None);
        let b = built();
        let probe = bin.join("probe");
        std::fs::copy(&b.probe, &probe).unwrap();
        let setuid = bin.join("setuid-helper");
        std::fs::copy(&b.setuid_helper, &setuid).unwrap();
        chown(&setuid, Some(0), Some(0)).unwrap();
        // After chown, which clears the set-id bits.
        std::fs::set_permissions(&setuid, std::fs::Permissions::from_mode(0o4755)).unwrap();
        let ro = base.join("ro");
        mkdir(&ro, 0o755, None);
        let public = ro.join("public.txt");
        write_file(&public, "public\n", 0o644, None);
        let secret_dir = ro.join("tls");
        mkdir(&secret_dir, 0o700, Some(uid));
        let secret = secret_dir.join("tls.key");
        write_file(&secret, "-----BEGIN STAND-IN KEY-----\n", 0o600, Some(uid));
        let outside = base.join("outside");
        mkdir(&outside, 0o777, None);
        let outside_file = outside.join("readable.txt");
        write_file(&outside_file, "outside\n", 0o644, Some(uid));
        // Moved by the rename attempts (see fs.c).
        write_file(
            &outside.join("rename-me.txt"),
            "outside\n",
            0o644,
            Some(uid),
        );
        write_file(&secret_dir.join("rename-me.key"), "key\n", 0o600, Some(uid));
        let reports = base.join("reports");
        mkdir(&reports, 0o755, Some(uid));
        Scene {
            _tmp: tmp,
            uid,
            wd,
            bin,
            probe,
            setuid,
            ro,
            public,
            secret_dir,
            secret,
            outside,
            outside_file,
            reports,
        }
    }

    /// The parameters every probe mode understands.
    pub fn params(&self) -> Vec<String> {
        let p = |k: &str, v: &Path| format!("{k}={}", v.display());
        vec![
            p("wd", &self.wd),
            p("ro_public", &self.public),
            p("outside", &self.outside),
            p("outside_file", &self.outside_file),
            p("secret", &self.secret),
            p("secret_dir", &self.secret_dir),
            p("setuid", &self.setuid),
        ]
    }
}

/// Who runs the supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The supervisor is root and drops the child to `--uid <scene uid>`.
    Root,
    /// The supervisor itself runs as the scene uid; the child keeps that uid.
    NonRoot,
    /// The supervisor is root and the child stays uid 0 (`--uid 0`) with every capability
    /// dropped.
    RootTargetUid0,
}

/// One attempt as the probe reported it.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub name: String,
    pub group: String,
    pub outcome: String,
    pub errno: Option<i32>,
    pub errno_name: Option<String>,
    pub signal: Option<i32>,
    pub detail: String,
}

impl Attempt {
    fn parse(line: &str) -> Attempt {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("probe line is not JSON ({e}): {line}"));
        let s = |k: &str| v[k].as_str().map(str::to_owned);
        let n = |k: &str| v[k].as_i64().map(|x| x as i32);
        Attempt {
            name: s("name").expect("name"),
            group: s("group").expect("group"),
            outcome: s("outcome").expect("outcome"),
            errno: n("errno"),
            errno_name: s("errno_name"),
            signal: n("signal"),
            detail: s("detail").unwrap_or_default(),
        }
    }

    /// A number the probe put in its detail as `key=N`.
    pub fn num(&self, key: &str) -> i64 {
        let pat = format!("{key}=");
        let at = self.detail.find(&pat).unwrap_or_else(|| {
            panic!(
                "`{key}=` not in the detail of {}: {}",
                self.name, self.detail
            )
        });
        let rest = &self.detail[at + pat.len()..];
        let end = rest
            .find(|c: char| !c.is_ascii_digit() && c != '-')
            .unwrap_or(rest.len());
        rest[..end].parse().unwrap()
    }
}

/// What one supervised run produced.
pub struct Outcome {
    pub attempts: Vec<Attempt>,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub report: Option<Value>,
    /// The run did not end by itself; the watchdog killed the supervisor.
    pub hung: bool,
}

impl Outcome {
    pub fn attempt(&self, name: &str) -> &Attempt {
        self.attempts
            .iter()
            .find(|a| a.name == name)
            .unwrap_or_else(|| panic!("no result for `{name}`; probe output:\n{}", self.stdout))
    }

    pub fn landlock_abi(&self) -> i32 {
        self.report
            .as_ref()
            .and_then(|r| r["landlock_abi"].as_i64())
            .unwrap_or(0) as i32
    }

    /// The status the report gives one layer (e.g. "cgroup" → "enforced").
    pub fn layer(&self, layer: &str) -> String {
        self.report
            .as_ref()
            .and_then(|r| r["layers"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .find(|l| l["layer"] == layer)
            .and_then(|l| l["status"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    /// Keep the raw results for SECURITY.md (target/tmp/probe-results/LABEL.jsonl).
    pub fn save(&self, label: &str) {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("probe-results");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{label}.jsonl")), &self.stdout).unwrap();
    }
}

/// How long a run may take before the harness calls it hung. Not a performance bound: every
/// run here ends in well under a second, and the margin is for a loaded two-core machine.
pub const HANG: Duration = Duration::from_secs(30);

/// Run `probe <probe_args> sup=<supervisor pid>` under `openshell-sandbox run`.
pub fn launch(scene: &Scene, mode: Mode, flags: &[&str], probe_args: &[String]) -> Outcome {
    let report = scene.reports.join("report.json");
    let _ = std::fs::remove_file(&report);
    // `exec` keeps the shell's pid, so `$$` is the supervisor's pid.
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c").arg(r#"exec "$@" "sup=$$""#).arg("sh");
    cmd.arg(BIN).arg("run").arg("--workdir").arg(&scene.wd);
    for ro in [&scene.bin, &scene.ro] {
        cmd.arg("--ro").arg(ro);
    }
    cmd.arg("--deny").arg(&scene.secret_dir);
    cmd.arg("--report-json").arg(&report);
    match mode {
        Mode::Root => {
            cmd.arg("--uid").arg(scene.uid.to_string());
        }
        Mode::RootTargetUid0 => {
            cmd.arg("--uid").arg("0");
        }
        Mode::NonRoot => {
            cmd.uid(scene.uid).gid(scene.uid);
            // Without a cgroup an explicit --memory is per process only, and --pids is
            // RLIMIT_NPROC, shared by the uid: both degraded (SECURITY.md).
            if flags.contains(&"--memory") || flags.contains(&"--pids") {
                cmd.arg("--allow-degraded");
            }
        }
    }
    cmd.args(flags).arg("--").arg(&scene.probe).args(probe_args);
    let mut out = supervise(scene, cmd);
    out.report = std::fs::read(&report)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    out
}

/// The same probe without any sandbox, as the scene's uid: what the kernel alone allows. The
/// test's own pid stands in for the supervisor.
pub fn launch_bare(scene: &Scene, probe_args: &[String]) -> Outcome {
    let mut cmd = Command::new(&scene.probe);
    cmd.args(probe_args)
        .arg(format!("sup={}", std::process::id()))
        .uid(scene.uid)
        .gid(scene.uid);
    supervise(scene, cmd)
}

/// Spawn `cmd` with secrets planted in its environment and a leaked descriptor on the stand-in
/// key, wait for it (killing it if it hangs), and parse the probe's lines.
fn supervise(scene: &Scene, mut cmd: Command) -> Outcome {
    cmd.env_remove("OPENSHELL_SANDBOX_UID")
        .env_remove("OPENSHELL_SANDBOX_GID")
        .env("OPENSHELL_SSH_HANDSHAKE_SECRET", "planted-handshake-secret")
        .env("OPENSHELL_TLS_KEY", &scene.secret)
        .env("AWS_SECRET_ACCESS_KEY", "planted-cloud-secret")
        .current_dir(&scene.wd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());

    // A descriptor on the stand-in key, without close-on-exec, so the supervisor inherits it:
    // the child must not.
    let path = std::ffi::CString::new(scene.secret.to_str().unwrap()).unwrap();
    // SAFETY: open with a valid C string; the result is checked before use.
    let raw = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY) };
    assert!(raw >= 0, "opening the stand-in key to leak it");
    // SAFETY: `raw` was just opened and is owned by nobody else.
    let leaked = unsafe { OwnedFd::from_raw_fd(raw) };
    let child = cmd.spawn().expect("spawning the supervisor");
    drop(leaked);

    let pid = child.id() as i32;
    let hung = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let watchdog = {
        let hung = hung.clone();
        std::thread::spawn(move || {
            if done_rx.recv_timeout(HANG).is_err() {
                hung.store(true, Ordering::SeqCst);
                // SAFETY: kill with integer arguments. `done` is sent right after the
                // supervisor is reaped, so only that instant could let its pid be reused.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        })
    };
    let out = child
        .wait_with_output()
        .expect("waiting for the supervisor");
    let _ = done_tx.send(());
    watchdog.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let attempts = stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(Attempt::parse)
        .collect();
    Outcome {
        attempts,
        status: out.status,
        stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        report: None,
        hung: hung.load(Ordering::SeqCst),
    }
}

/// Print past the test harness's output capture: known gaps must show on every run, not only
/// on failure.
pub fn loud(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}
