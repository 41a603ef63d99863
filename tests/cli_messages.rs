//! What the command line says to a new user, through the real binary: `-q` is quiet, `check`
//! says each policy warning once and names the network a run gets, a script without its
//! execute bit is told so, a memory size without a unit is refused, `man --dir` makes its
//! directory.

mod support;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use support::text;
use support::{BIN, Workdir};

fn bin(cwd: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(cwd)
        .env_remove("RUST_LOG")
        .env_remove("OPENSHELL_LOG_LEVEL")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// A typical OpenShell policy: paths of an OpenShell image (`/app`, `/sandbox`) that this host
/// lacks, under best_effort, and two network rules.
fn openshell_policy(dir: &Path) -> std::path::PathBuf {
    let missing = dir.join("no-such-app");
    let yaml = format!(
        "version: 1\n\
         filesystem_policy:\n  include_workdir: true\n  read_only: [/usr, /lib, /lib64, /bin, /etc, {m}]\n  read_write: [{m}-rw, /tmp]\n\
         landlock:\n  compatibility: best_effort\n\
         network_policies:\n\
         \x20 github:\n    endpoints:\n      - host: github.com\n        port: 443\n    binaries:\n      - path: /usr/bin/git\n\
         \x20 pypi:\n    endpoints:\n      - host: pypi.org\n        port: 443\n    binaries:\n      - path: /usr/bin/python3\n",
        m = missing.display()
    );
    let p = dir.join("policy.yaml");
    std::fs::write(&p, yaml).unwrap();
    p
}

#[test]
fn quiet_silences_the_policy_warnings_and_check_says_each_once() {
    let wd = Workdir::new();
    let dir = tempfile::tempdir().unwrap();
    let policy = openshell_policy(dir.path());
    let (w, p) = (wd.path().to_str().unwrap(), policy.to_str().unwrap());
    let base = ["run", "--workdir", w, "--policy", p];
    // Without -q the skips are warned about, once each.
    let out = bin(wd.path(), &[&base[..], &["--", "true"]].concat());
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(err.matches("no-such-app skipped").count(), 1, "{err}");
    assert_eq!(err.matches("no-such-app-rw skipped").count(), 1, "{err}");
    let out = bin(wd.path(), &[&base[..], &["-q", "--", "true"]].concat());
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stderr), "", "-q printed something");
    // An explicit level still wins over -q.
    let out = bin(
        wd.path(),
        &[&base[..], &["-q", "--log-level", "warn", "--", "true"]].concat(),
    );
    assert!(
        text(&out.stderr).contains("skipped"),
        "{}",
        text(&out.stderr)
    );

    let out = bin(wd.path(), &["check", "--workdir", w, "--policy", p]);
    let all = text(&out.stdout) + &text(&out.stderr);
    for path in ["no-such-app skipped", "no-such-app-rw skipped"] {
        assert_eq!(all.matches(path).count(), 1, "{path}:\n{all}");
    }
}

/// `check --policy` without `--explain` says what the run gets on the network.
#[test]
fn check_names_the_network_a_run_gets() {
    let wd = Workdir::new();
    let dir = tempfile::tempdir().unwrap();
    let policy = openshell_policy(dir.path());
    let (w, p) = (wd.path().to_str().unwrap(), policy.to_str().unwrap());
    let out = bin(wd.path(), &["check", "--workdir", w, "--policy", p]);
    let o = text(&out.stdout);
    assert!(o.contains("network: proxy, 2 rules: github, pypi"), "{o}");
    assert!(
        !o.lines().any(|l| l.starts_with("network: none")),
        "the header says no network for a policy with rules:\n{o}"
    );
    let out = bin(wd.path(), &["check", "--workdir", w]);
    assert!(
        text(&out.stdout).contains("network: none"),
        "{}",
        text(&out.stdout)
    );
    let out = bin(
        wd.path(),
        &["check", "--workdir", w, "--policy", p, "--network", "all"],
    );
    assert!(
        text(&out.stdout).contains("network: all"),
        "{}",
        text(&out.stdout)
    );
    let out = bin(
        wd.path(),
        &["check", "--workdir", w, "--policy", p, "--json"],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["policy"]["proxy_rules"],
        serde_json::json!(["github", "pypi"])
    );
}

/// `run ./io.py` with mode 0644: the missing execute bit is named with both fixes, and the
/// first one works.
#[test]
fn a_script_without_the_execute_bit_is_told_so() {
    use std::os::unix::fs::PermissionsExt;
    let wd = Workdir::new();
    let script = wd.path().join("io.py");
    std::fs::write(&script, "#!/usr/bin/env python3\nprint('ran')\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let w = wd.path().to_str().unwrap();
    let out = bin(wd.path(), &["run", "--workdir", w, "--", "./io.py"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(126), "{err}");
    assert!(err.contains("no execute bit (mode 0644)"), "{err}");
    assert!(err.contains("`chmod +x ./io.py`"), "{err}");
    assert!(err.contains("`python3 ./io.py`"), "{err}");
    assert!(!err.contains("pick --uid"), "{err}");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = bin(wd.path(), &["run", "--workdir", w, "--", "./io.py"]);
    assert_eq!(text(&out.stdout), "ran\n", "{}", text(&out.stderr));
}

/// `--memory 10` is ten bytes: nothing runs in that, so it is refused naming the units.
#[test]
fn a_memory_size_that_runs_nothing_is_refused() {
    let wd = Workdir::new();
    let w = wd.path().to_str().unwrap();
    for flag in ["--memory", "--address-space"] {
        let out = bin(
            wd.path(),
            &["run", "--workdir", w, flag, "10", "--", "true"],
        );
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{flag}: {err}");
        assert!(err.contains("10 bytes"), "{err}");
        assert!(err.contains("MiB") && err.contains("512M"), "{err}");
    }
    let out = bin(wd.path(), &["check", "--workdir", w, "--memory", "100K"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
}

#[test]
fn man_dir_makes_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("share/man/man1");
    let out = bin(dir.path(), &["man", "--dir", target.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(target.join("openshell-sandbox.1").is_file());
    assert!(target.join("openshell-sandbox-run.1").is_file());
}
