//! OpenShell's own policy shape on a usr-merged root (`/bin -> usr/bin`, `/lib64 -> usr/lib64`,
//! `/sbin -> usr/sbin`), through the real binary, in `run` and in `serve` with the policy from
//! the test gateway.
//!
//! OpenShell's typical policy grants `/usr` and `/lib` but not `/bin`, `/sbin` or `/lib64`: its
//! supervisor puts Landlock on the real root, where those links resolve into `/usr`. The view's
//! root holds only what is granted, so it must reproduce each symlink of the host's root (and of
//! every directory it makes on the way to a grant) whose target is in the view, as the same link,
//! and only links nothing the sandbox runs as could have planted. Where a program still cannot
//! start because its interpreter is outside the grants, `run`, `serve` and `check` name the
//! interpreter and the grant that would add it.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use openshell_sandbox::policy::openshell::{FilesystemPolicy, LandlockPolicy, SandboxPolicy};
use support::{AuthMode, ExecResult, SupOpts, Supervisor, TestGateway};
use support::{BIN, Run, Workdir, require, require_root};

const OPENSHELL_RO: &[&str] = &[
    "/usr",
    "/lib",
    "/proc",
    "/dev/urandom",
    "/app",
    "/etc",
    "/var/log",
];
const OPENSHELL_RW: &[&str] = &["/sandbox", "/tmp", "/dev/null"];
/// The same shape without the loader's directory: `/usr/lib64` (and `/lib64`, its link) is
/// missing, `/usr/bin` and the libraries in `/usr/lib` are there.
const NO_LOADER_RO: &[&str] = &["/usr/bin", "/usr/lib", "/lib", "/proc", "/etc"];

const HELLO_C: &str = "#include <stdio.h>\nint main(void) { puts(\"hello from C\"); return 0; }\n";

/// Root and a usr-merged root, the machine these tests are about.
fn require_usr_merged() -> bool {
    require_root()
        && require(
            std::fs::read_link("/lib64").is_ok() && std::fs::read_link("/bin").is_ok(),
            "a usr-merged root (/bin and /lib64 symlinks into /usr), as Debian 12 has",
        )
}

/// An OpenShell policy file, as `openshell policy set` takes it.
fn policy_file(dir: &Path, read_only: &[&str], read_write: &[&str]) -> PathBuf {
    let list = |v: &[&str]| v.iter().map(|p| format!("    - {p}\n")).collect::<String>();
    let text = format!(
        "version: 1\nfilesystem_policy:\n  include_workdir: true\n  read_only:\n{}  read_write:\n{}landlock:\n  compatibility: best_effort\n",
        list(read_only),
        list(read_write)
    );
    let p = dir.join(format!("policy-{}.yaml", std::process::id()));
    std::fs::write(&p, text).unwrap();
    p
}

fn run_policy(wd: &Workdir, policy: &Path, cmd: &[&str]) -> Run {
    support::run(wd, &["--policy", policy.to_str().unwrap()], cmd)
}

fn expect(r: &Run, what: &str, want: &str) {
    assert_eq!(
        (r.stdout().as_str(), r.code()),
        (want, 0),
        "{what}: stderr:\n{}",
        r.stderr()
    );
}

/// The ELF interpreter (PT_INTERP) of a 64-bit little-endian program, read on the host.
fn elf_interp(path: &Path) -> String {
    let b = std::fs::read(path).unwrap();
    let u16_at = |o: usize| u16::from_le_bytes(b[o..o + 2].try_into().unwrap()) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap()) as usize;
    assert_eq!(&b[..5], b"\x7fELF\x02", "{path:?} is a 64-bit ELF");
    let (phoff, phentsize, phnum) = (u64_at(32), u16_at(54), u16_at(56));
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        if u32::from_le_bytes(b[ph..ph + 4].try_into().unwrap()) == 3 {
            let (off, size) = (u64_at(ph + 8), u64_at(ph + 32));
            let s = &b[off..off + size];
            return String::from_utf8(s.split(|&c| c == 0).next().unwrap().to_vec()).unwrap();
        }
    }
    panic!("{path:?} has no PT_INTERP");
}

/// The top-level links of the host's root that point into /usr.
fn usr_links() -> Vec<(String, String)> {
    ["/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"]
        .iter()
        .filter_map(|l| {
            let t = std::fs::read_link(l).ok()?;
            let t = t.to_str()?.to_owned();
            t.trim_start_matches('/')
                .starts_with("usr/")
                .then(|| (l.to_string(), t))
        })
        .collect()
}

#[test]
fn openshell_policy_runs_python_sh_gcc_and_node_in_run() {
    if !require_usr_merged() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let policy = policy_file(dir.path(), OPENSHELL_RO, OPENSHELL_RW);
    let wd = Workdir::new();
    std::fs::write(wd.path().join("hello.c"), HELLO_C).unwrap();

    let r = run_policy(&wd, &policy, &["python3", "-c", "print(1)"]);
    expect(&r, "python3", "1\n");
    let r = run_policy(&wd, &policy, &["/bin/sh", "-c", "echo hi"]);
    expect(&r, "/bin/sh", "hi\n");
    let r = run_policy(&wd, &policy, &["sh", "-c", "echo hi"]);
    expect(&r, "sh from PATH", "hi\n");
    let r = run_policy(
        &wd,
        &policy,
        &["sh", "-c", "gcc -o hello hello.c && ./hello"],
    );
    expect(&r, "gcc", "hello from C\n");
    let r = run_policy(&wd, &policy, &["node", "-e", "console.log(6 * 7)"]);
    expect(&r, "node", "42\n");

    // Each link of the host's root into /usr is the same link in the view; /var is made for
    // /var/log, and its /var/run -> /run stays absent because /run is not granted.
    let links = usr_links();
    let code = format!(
        "import os\nfor l in {:?}: print(l, os.readlink(l))\nprint('/var/run', os.path.lexists('/var/run'))",
        links.iter().map(|(l, _)| l.as_str()).collect::<Vec<_>>()
    );
    let r = run_policy(&wd, &policy, &["python3", "-c", &code]);
    let mut want: String = links.iter().map(|(l, t)| format!("{l} {t}\n")).collect();
    want.push_str("/var/run False\n");
    expect(&r, "the root's links", &want);
}

/// A link in a directory the view makes is reproduced when its target is granted (`/var/run`
/// once `/run` is), and a link the sandbox uid could have planted is never reproduced, even
/// when its target is granted.
#[test]
fn links_on_the_way_to_a_grant_are_reproduced_only_when_trusted_and_granted() {
    if !require_usr_merged() {
        return;
    }
    if !require(
        std::fs::read_link("/var/run").is_ok_and(|t| t == Path::new("/run")),
        "/var/run -> /run on the host",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut ro = OPENSHELL_RO.to_vec();
    ro.push("/run");
    let policy = policy_file(dir.path(), &ro, OPENSHELL_RW);
    let wd = Workdir::new();
    let r = run_policy(
        &wd,
        &policy,
        &["python3", "-c", "import os; print(os.readlink('/var/run'))"],
    );
    expect(&r, "/var/run with /run granted", "/run\n");

    // A root-owned tree outside /tmp (whose mode 1777 makes every link below it untrusted):
    // `good` is root's link in root's directory; `w` belongs to the sandbox uid, so its
    // `bad` could have been planted by an earlier run; `owned` is a link of the sandbox uid.
    // In a system tree (/run) root's link is root's own and is reproduced; elsewhere a run
    // writing as root through an idmapped workdir could have planted it, so it is not.
    for (parent, good) in [
        ("/run", "good real"),
        (env!("CARGO_TARGET_TMPDIR"), "good absent"),
    ] {
        let base = tempfile::Builder::new()
            .prefix("osb-links-")
            .tempdir_in(parent)
            .unwrap();
        let b = base.path();
        std::fs::set_permissions(b, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir_all(b.join("real")).unwrap();
        std::fs::write(b.join("real/f"), "real\n").unwrap();
        std::os::unix::fs::symlink("real", b.join("good")).unwrap();
        std::os::unix::fs::symlink("real", b.join("owned")).unwrap();
        std::os::unix::fs::lchown(b.join("owned"), Some(65534), Some(65534)).unwrap();
        std::fs::create_dir_all(b.join("w/sub")).unwrap();
        std::os::unix::fs::symlink("../real", b.join("w/bad")).unwrap();
        std::os::unix::fs::chown(b.join("w"), Some(65534), Some(65534)).unwrap();
        let real = b.join("real");
        let sub = b.join("w/sub");
        let code = format!(
            "import os\nfor l in ('good', 'owned', 'w/bad'):\n    p = os.path.join({:?}, l)\n    print(l, os.readlink(p) if os.path.lexists(p) else 'absent')",
            b.display().to_string()
        );
        let r = support::run(
            &wd,
            &[
                "--uid",
                "65534",
                "--ro",
                real.to_str().unwrap(),
                "--ro",
                sub.to_str().unwrap(),
            ],
            &["python3", "-c", &code],
        );
        expect(
            &r,
            &format!("trusted and planted links below {parent}"),
            &format!("{good}\nowned absent\nw/bad absent\n"),
        );
    }
}

/// Without the loader's directory the program cannot start: the error names the interpreter and
/// the grant that adds it (not "command not found"), with the shell's exit code for it (127),
/// and `check` says the same before any run.
#[test]
fn a_policy_without_the_loader_names_the_interpreter_in_run_and_check() {
    if !require_usr_merged() {
        return;
    }
    let loader = elf_interp(Path::new("/usr/bin/python3"));
    let loader_dir = Path::new(&loader).parent().unwrap().display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let policy = policy_file(dir.path(), NO_LOADER_RO, &["/tmp", "/dev/null"]);
    let wd = Workdir::new();
    let r = run_policy(&wd, &policy, &["python3", "-c", "print(1)"]);
    let err = r.stderr();
    assert_eq!(r.code(), 127, "{err}");
    assert!(!err.contains("command not found"), "{err}");
    assert!(
        err.contains(&format!(
            "its ELF interpreter {loader} is not in the sandbox"
        )),
        "{err}"
    );
    assert!(err.contains(&format!("--ro {loader_dir}")), "{err}");
    assert!(err.contains("read_only"), "{err}");

    // check, before any run: the command given after `--`, and the system's programs.
    let out = Command::new(BIN)
        .args([
            "check",
            "--policy",
            policy.to_str().unwrap(),
            "--",
            "python3",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!(
            "its ELF interpreter {loader} is not in the sandbox"
        )),
        "{text}"
    );
    assert!(text.contains(&format!("--ro {loader_dir}")), "{text}");
    let out = Command::new(BIN)
        .args(["check", "--policy", policy.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!(
            "its ELF interpreter {loader} is not in the sandbox"
        )),
        "{text}"
    );
    assert!(!text.contains("policy: fully enforced\n"), "{text}");

    // The OpenShell shape itself: every probe starts, fully enforced.
    let good = policy_file(dir.path(), OPENSHELL_RO, OPENSHELL_RW);
    let out = Command::new(BIN)
        .args(["check", "--policy", good.to_str().unwrap(), "--", "python3"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("python3: starts"), "{text}");
    assert!(text.contains("policy: fully enforced"), "{text}");
}

// --- serve ------------------------------------------------------------------------------------

fn gateway_policy(read_only: &[&str], read_write: &[&str]) -> SandboxPolicy {
    let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
    SandboxPolicy {
        version: 1,
        filesystem: Some(FilesystemPolicy {
            include_workdir: true,
            read_only: own(read_only),
            read_write: own(read_write),
        }),
        landlock: Some(LandlockPolicy {
            compatibility: "best_effort".into(),
        }),
        ..Default::default()
    }
}

fn plane_opts() -> SupOpts {
    SupOpts {
        env: vec![
            (
                "OPENSHELL_SANDBOX".into(),
                support::plane::SANDBOX_NAME.into(),
            ),
            (
                "OPENSHELL_LOCAL_POLICY_PATH".into(),
                "/nonexistent/openshell/policy.yaml".into(),
            ),
        ],
        ..Default::default()
    }
}

fn show(r: &ExecResult, sup: &Supervisor) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}\nsupervisor log:\n{}",
        r.exit,
        r.out(),
        r.err(),
        sup.log()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openshell_policy_runs_python_sh_gcc_and_node_in_serve() {
    if !require_usr_merged() {
        return;
    }
    let gw = TestGateway::start(AuthMode::Jwt).await;
    gw.state
        .set_policy(&gateway_policy(OPENSHELL_RO, OPENSHELL_RW))
        .unwrap();
    let mut sup = Supervisor::start(&gw, plane_opts());
    gw.wait_ready(&mut sup).await;
    std::fs::write(sup.workdir.join("hello.c"), HELLO_C).unwrap();
    for (argv, want) in [
        (&["python3", "-c", "print(1)"][..], "1\n"),
        (&["/bin/sh", "-c", "echo hi"][..], "hi\n"),
        (&["sh", "-c", "echo hi"][..], "hi\n"),
        (
            &[
                "sh",
                "-c",
                "cd \"$HOME\" && gcc -o hello hello.c && ./hello",
            ][..],
            "hello from C\n",
        ),
        (&["node", "-e", "console.log(6 * 7)"][..], "42\n"),
    ] {
        let r = gw.exec(argv).await;
        assert_eq!(
            (r.out().as_str(), r.exit),
            (want, Some(0)),
            "{argv:?}: {}",
            show(&r, &sup)
        );
    }

    // And without the loader's directory, the exec's error names the interpreter.
    let loader = elf_interp(Path::new("/usr/bin/python3"));
    let gw2 = TestGateway::start(AuthMode::Jwt).await;
    gw2.state
        .set_policy(&gateway_policy(NO_LOADER_RO, &["/tmp", "/dev/null"]))
        .unwrap();
    let mut sup2 = Supervisor::start(&gw2, plane_opts());
    gw2.wait_ready(&mut sup2).await;
    let r = gw2.exec(&["python3", "-c", "print(1)"]).await;
    assert_eq!(r.exit, Some(127), "{}", show(&r, &sup2));
    assert!(
        r.err().contains(&format!(
            "its ELF interpreter {loader} is not in the sandbox"
        )),
        "{}",
        show(&r, &sup2)
    );
}
