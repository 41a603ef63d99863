//! What `run` takes when the user names nothing: the workdir (the current directory, refused
//! where that would hand the command a home, `/` or the system's trees), the child's HOME (a
//! private one, gone after the run) and TMPDIR; and that ordinary work (Python, a pipeline, a
//! failing command, `--scratch`) runs as it would outside. Through the real binary.

mod support;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use support::text;
use support::{BIN, Workdir, is_root, require_root, run};

/// `openshell-sandbox run ARGS` in `cwd`, with `HOME` as given.
fn run_in(cwd: &Path, home: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("run")
        .args(args)
        .current_dir(cwd)
        .env("HOME", home)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn an_implicit_workdir_that_is_a_home_root_or_system_dir_is_refused() {
    let wd = Workdir::new();
    let home = wd.path();
    let out = run_in(home, home, &["--", "sh", "-c", "touch dotfile"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("is a home directory"), "{err}");
    let flag = format!("`--workdir {}` if you mean it", home.display());
    assert!(err.contains(&flag), "{err}");
    assert!(!home.join("dotfile").exists(), "the command ran");
    // Above the home: all of it, and every other user's.
    let parent = home.parent().unwrap();
    let inner = home.join("inner");
    let out = run_in(parent, &inner, &["--", "true"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("above the home directory"));
    for dir in ["/", "/usr", "/etc"] {
        let out = run_in(Path::new(dir), home, &["--", "true"]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{dir}: {err}");
        assert!(err.contains("--workdir DIR"), "{dir}: {err}");
    }
    // Named explicitly, the same home is the user's choice.
    let out = run_in(
        home,
        home,
        &[
            "--workdir",
            home.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "touch dotfile",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(home.join("dotfile").exists());
}

/// The child's HOME is its own, an empty directory on the view's private /tmp: writable, nothing of it lands in
/// the workdir, and the next run starts without it. `--env HOME=...` picks another.
#[test]
fn the_child_gets_a_private_home_gone_after_the_run() {
    let wd = Workdir::new();
    let project = wd.path().join("project");
    std::fs::create_dir(&project).unwrap();
    if support::is_root() {
        std::os::unix::fs::chown(&project, Some(65534), Some(65534)).unwrap();
    }
    let script = "echo \"home=$HOME tmp=$TMPDIR\"; \
                  ls -A ~ | grep -q . && echo 'home not empty'; \
                  echo 1 > ~/.python_history && mkdir -p ~/.cache/pip && echo wrote";
    for _ in 0..2 {
        let out = run_in(&project, wd.path(), &["--", "sh", "-c", script]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "home=/tmp/home tmp=/tmp\nwrote\n");
    }
    let left: Vec<_> = std::fs::read_dir(&project).unwrap().collect();
    assert!(left.is_empty(), "dotfiles in the workdir: {left:?}");
    // Asked for: HOME in the workdir.
    let h = format!("HOME={}", project.display());
    let out = run_in(
        &project,
        wd.path(),
        &["--env", &h, "--", "sh", "-c", "echo $HOME; touch ~/.kept"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), project.to_str().unwrap());
    assert!(project.join(".kept").exists());
}

/// TMPDIR is always set: the view's private /tmp, or with --scratch the scratch directory.
#[test]
fn tmpdir_is_the_private_tmp_or_the_scratch_directory() {
    let wd = Workdir::new();
    let w = wd.path().to_str().unwrap();
    let out = run_in(
        wd.path(),
        Path::new("/"),
        &["--workdir", w, "--", "sh", "-c", "echo $TMPDIR"],
    );
    assert_eq!(text(&out.stdout), "/tmp\n", "{}", text(&out.stderr));
    let out = run_in(
        wd.path(),
        Path::new("/"),
        &[
            "--workdir",
            w,
            "--scratch",
            "--",
            "sh",
            "-c",
            "echo $TMPDIR; touch $TMPDIR/f",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let tmpdir = text(&out.stdout);
    assert!(tmpdir.contains("openshell-scratch-"), "{tmpdir}");
    assert!(
        !Path::new(tmpdir.trim()).exists(),
        "the scratch directory was left"
    );
}

/// `/tmp` and `/dev/shm` are the view's own tmpfs mounts: as a workdir, named or implicit,
/// they are refused with the reason, and nothing is written there.
#[test]
fn a_workdir_of_tmp_or_dev_shm_is_refused_with_a_reason() {
    if !require_root() {
        return;
    }
    for dir in ["/tmp", "/dev/shm"] {
        let out = Command::new(BIN)
            .args([
                "run",
                "-q",
                "--workdir",
                dir,
                "--",
                "sh",
                "-c",
                "echo x > osb-x",
            ])
            .current_dir("/")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "--workdir {dir}: {err}");
        assert!(
            err.contains(dir) && err.contains("private tmpfs"),
            "--workdir {dir}: {err}"
        );
        assert!(!Path::new(dir).join("osb-x").exists());
    }
    // `run` started in /tmp: the same, with the same reason.
    let out = Command::new(BIN)
        .args(["run", "-q", "--", "sh", "-c", "echo x > osb-x"])
        .current_dir("/tmp")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("private tmpfs"), "{err}");
}

/// In /tmp the refusal names what works; `--scratch` does not change the workdir, and the
/// advice no longer says it would.
#[test]
fn the_tmp_refusal_names_a_fix_that_works() {
    let out = run_in(
        Path::new("/tmp"),
        Path::new("/"),
        &["--scratch", "--", "true"],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("private tmpfs"), "{err}");
    assert!(err.contains("--workdir DIR"), "{err}");
    assert!(!err.contains("pass --scratch"), "{err}");
    // The first fix it names works.
    let wd = Workdir::new();
    let out = run_in(wd.path(), Path::new("/"), &["--scratch", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn normal_work_succeeds() {
    let wd = Workdir::new();
    let degraded: &[&str] = if is_root() {
        &[]
    } else {
        &["--allow-degraded"]
    };
    let r = run(
        &wd,
        degraded,
        &[
            "python3",
            "-c",
            "import json,hashlib; print(json.dumps({'sum': sum(range(10**6)), 'h': hashlib.sha256(b'x').hexdigest()[:8]}))",
        ],
    );
    assert_eq!(
        r.stdout().trim(),
        r#"{"sum": 499999500000, "h": "2d711642"}"#,
        "{}",
        r.stderr()
    );
    assert_eq!(r.code(), 0);
    let r = run(
        &wd,
        degraded,
        &[
            "sh",
            "-c",
            "seq 1 1000 | grep 7 | wc -l > count.txt && cat count.txt",
        ],
    );
    assert_eq!(r.stdout().trim(), "271", "{}", r.stderr());
    assert_eq!(r.reason(), "exited");
    let r = run(&wd, degraded, &["sh", "-c", "echo err >&2; exit 3"]);
    assert_eq!(r.code(), 3);
    assert_eq!(r.stderr().lines().next(), Some("err"));
    // Scratch: a fresh TMPDIR the child can write, gone afterwards.
    let r = run(
        &wd,
        &[&["--scratch"], degraded].concat(),
        &[
            "sh",
            "-c",
            "echo hi > \"$TMPDIR/t\" && cat \"$TMPDIR/t\" && echo $TMPDIR",
        ],
    );
    let lines: Vec<String> = r.stdout().lines().map(String::from).collect();
    assert_eq!(lines[0], "hi", "{}", r.stderr());
    assert!(
        !std::path::Path::new(&lines[1]).exists(),
        "scratch dir left behind"
    );
}
