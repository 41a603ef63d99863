//! The command line through the real binary: `--policy FILE` for `run` and `check`, `check`'s
//! policy flags and `--explain`, the workdir the sandbox uid must be able to write, top-level
//! help and typos, `--log-level`/`--log-format`, the JSON report's fields, and the messages for
//! a program outside the grants and a script whose interpreter is missing.

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use support::text;
use support::*;

fn bin() -> Command {
    let mut c = Command::new(BIN);
    c.stdin(Stdio::null()).env_remove("OPENSHELL_ENDPOINT");
    c.env_remove("OPENSHELL_SANDBOX_UID")
        .env_remove("OPENSHELL_SANDBOX_GID")
        .env_remove("RUST_LOG");
    c
}

/// A policy file in `dir`: the system directories read-only (plus `extra_ro`), the workdir.
fn policy_file(dir: &Path, extra_ro: &[&Path], tail: &str) -> std::path::PathBuf {
    let mut ro = vec![
        "/usr".to_string(),
        "/lib".into(),
        "/lib64".into(),
        "/bin".into(),
        "/etc".into(),
    ];
    ro.extend(extra_ro.iter().map(|p| p.display().to_string()));
    let list: String = ro.iter().map(|p| format!("    - {p}\n")).collect();
    let yaml = format!(
        "version: 1\nfilesystem_policy:\n  include_workdir: true\n  read_only:\n{list}  read_write:\n    - /dev/null\n{tail}"
    );
    let path = dir.join(format!("policy-{}.yaml", rand_name()));
    std::fs::write(&path, yaml).unwrap();
    path
}

fn rand_name() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed) ^ u64::from(std::process::id()) << 20
}

/// A root-owned directory, mode 0755, readable by everyone, with `f` in it.
fn readable_dir() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("osb-ro-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(d.path().join("f"), "granted\n").unwrap();
    std::fs::set_permissions(d.path().join("f"), std::fs::Permissions::from_mode(0o644)).unwrap();
    d
}

fn run_in(wd: &Workdir, extra: &[&str], cmd: &[&str]) -> Output {
    bin()
        .arg("run")
        .arg("--workdir")
        .arg(wd.path())
        .args(extra)
        .arg("--")
        .args(cmd)
        .current_dir(wd.path())
        .output()
        .unwrap()
}

// --- --policy FILE --------------------------------------------------------------------------

/// The file's read-only list is the grant set; `--ro` adds to it.
#[test]
fn run_policy_file_grants_and_ro_adds_to_its_list() {
    let wd = Workdir::new();
    let in_file = readable_dir();
    let by_flag = readable_dir();
    let pol = policy_file(wd.path(), &[in_file.path()], "");
    let cat = |extra: &[&str], d: &Path| {
        let mut args = vec!["--policy", pol.to_str().unwrap()];
        args.extend_from_slice(extra);
        run_in(&wd, &args, &["/bin/cat", d.join("f").to_str().unwrap()])
    };
    let out = cat(&[], in_file.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "granted\n");
    // Not in the file: absent from the view's root (cat says No such file or directory,
    // exit 1).
    let out = cat(&[], by_flag.path());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("No such file or directory"),
        "{}",
        text(&out.stderr)
    );
    // --ro adds to the file's list: both are readable.
    let ro = by_flag.path().to_str().unwrap();
    for d in [in_file.path(), by_flag.path()] {
        let out = cat(&["--ro", ro], d);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    }
}

/// `network_policies` run behind the sandbox's egress proxy: the children get its address. The
/// default of `--network` (none) is no explicit flag and must not replace the file's network
/// section; an explicit `--network all` does (no proxy). A rule the proxy could not keep is
/// refused naming its key, exit 125.
#[test]
fn run_policy_file_network_rules_run_behind_the_proxy_unless_network_is_given() {
    let wd = Workdir::new();
    let pol = policy_file(
        wd.path(),
        &[],
        "network_policies:\n  pypi:\n    endpoints:\n      - host: pypi.org\n        port: 443\n",
    );
    let p = pol.to_str().unwrap();
    let out = run_in(&wd, &["--policy", p], &["/usr/bin/env"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("HTTPS_PROXY=http://10.200.0.1:3128\n"),
        "{}",
        text(&out.stdout)
    );
    let out = run_in(&wd, &["--policy", p, "--network", "all"], &["/usr/bin/env"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        !text(&out.stdout).contains("PROXY"),
        "{}",
        text(&out.stdout)
    );
    let bad = policy_file(
        wd.path(),
        &[],
        "network_policies:\n  pypi:\n    endpoints:\n      - host: \"*.com\"\n        port: 443\n",
    );
    let out = run_in(&wd, &["--policy", bad.to_str().unwrap()], &["/bin/true"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains(&format!(
            "--policy {}: network_policies.pypi.endpoints[0].host: ",
            bad.display()
        )),
        "{err}"
    );
}

#[test]
fn run_policy_file_unknown_key_is_an_error_naming_it() {
    let wd = Workdir::new();
    let pol = wd.path().join("bad.yaml");
    std::fs::write(
        &pol,
        "version: 1\nfilesystem_policy:\n  include_workdir: true\n  read_onyl: [/usr]\n",
    )
    .unwrap();
    let out = run_in(&wd, &["--policy", pol.to_str().unwrap()], &["/bin/true"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("read_onyl"), "{err}");
    assert!(err.contains(pol.to_str().unwrap()), "{err}");
}

/// best_effort: a missing path is skipped with a warning naming the key; hard_requirement:
/// the same path is an error naming the key.
#[test]
fn run_policy_file_missing_paths_warn_or_fail_by_compatibility() {
    let wd = Workdir::new();
    let missing = Path::new("/nonexistent-osb-path");
    let pol = policy_file(
        wd.path(),
        &[missing],
        "landlock:\n  compatibility: best_effort\n",
    );
    let out = run_in(&wd, &["--policy", pol.to_str().unwrap()], &["/bin/true"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("WARN"), "{err}");
    assert!(err.contains("filesystem_policy.read_only[5]"), "{err}");
    assert!(err.contains("/nonexistent-osb-path skipped"), "{err}");

    let pol = policy_file(
        wd.path(),
        &[missing],
        "landlock:\n  compatibility: hard_requirement\n",
    );
    let out = run_in(&wd, &["--policy", pol.to_str().unwrap()], &["/bin/true"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("filesystem_policy.read_only[5]"), "{err}");
    assert!(err.contains("hard_requirement"), "{err}");
}

// --- check ------------------------------------------------------------------------------------

#[test]
fn check_takes_the_policy_flags_and_the_policy_file() {
    let wd = Workdir::new();
    let out = bin()
        .args([
            "check",
            "--json",
            "--memory",
            "1G",
            "--network",
            "all",
            "--workdir",
        ])
        .arg(wd.path())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stderr)));
    assert_eq!(v["policy"]["limits"]["memory_bytes"], 1u64 << 30, "{v}");
    assert_eq!(v["policy"]["network"], "all", "{v}");
    assert_eq!(
        v["policy"]["workdir"],
        wd.path().display().to_string(),
        "{v}"
    );
    assert_eq!(v["workdir"]["writable"], true, "{v}");

    // A policy that cannot be enforced here: exit 1, naming the key.
    let pol = policy_file(
        wd.path(),
        &[],
        "network_policies:\n  pypi:\n    endpoints:\n      - host: \"*.org\"\n        port: 443\n",
    );
    let out = bin()
        .args(["check", "--policy", pol.to_str().unwrap(), "--workdir"])
        .arg(wd.path())
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("policy: NOT enforceable"), "{stdout}");
    assert!(stdout.contains("network_policies"), "{stdout}");
}

#[test]
fn check_explain_prints_the_landlock_and_seccomp_rules() {
    let wd = Workdir::new();
    let out = bin()
        .args(["check", "--explain", "--workdir"])
        .arg(wd.path())
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("landlock rules (path, access):"),
        "{stdout}"
    );
    let line = |needle: &str| {
        stdout
            .lines()
            .find(|l| l.trim_start().starts_with(needle))
            .unwrap_or_else(|| panic!("no rule for {needle} in:\n{stdout}"))
            .to_string()
    };
    assert!(line("/usr ").contains("read, list, execute"));
    assert!(line(&format!("{} ", wd.path().display())).contains("write, create, remove"));
    assert!(stdout.contains("seccomp rules (syscall"), "{stdout}");
    assert!(
        line("ptrace:").contains("EPERM"),
        "seccomp rules name syscalls and actions:\n{stdout}"
    );
    assert!(line("clone3:").contains("ENOSYS"));
}

/// `run` binds the workdir as an idmapped mount, so the kernel checks the sandbox there as
/// the directory's owner: a workdir whose owner may not write it is reported, one of root's
/// that root may write is writable, and one that only its group may write is not (the owner's
/// bits decide for the owner), which a guess from the group would get wrong.
#[test]
fn check_workdir_reports_whether_the_sandbox_can_write_it() {
    if !require_root() {
        return;
    }
    let d = tempfile::Builder::new()
        .prefix("osb-wd-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let check = |mode: u32, gid: u32| {
        std::os::unix::fs::chown(d.path(), Some(0), Some(gid)).unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        let out = bin()
            .args(["check", "--uid", "65534", "--workdir"])
            .arg(d.path())
            .output()
            .unwrap();
        (out.status.code(), text(&out.stdout))
    };
    let (code, stdout) = check(0o555, 0);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains(&format!("workdir {}: NOT writable", d.path().display())));
    assert!(stdout.contains("owned by 0:0 with mode 0555"), "{stdout}");
    assert!(stdout.contains("not writable by its owner"), "{stdout}");
    assert!(stdout.contains("chmod u+w"), "{stdout}");

    let (code, stdout) = check(0o755, 0);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains("writable by the sandbox, as its owner (an idmapped mount)"),
        "{stdout}"
    );

    let (code, stdout) = check(0o070, 65534);
    assert_eq!(
        code,
        Some(1),
        "the group's bits counted for the owner:\n{stdout}"
    );
    assert!(stdout.contains("NOT writable"), "{stdout}");
}

// --- the workdir of run ---------------------------------------------------------------------

#[test]
fn run_refuses_a_workdir_the_sandbox_cannot_write() {
    if !require_root() {
        return;
    }
    let d = tempfile::Builder::new()
        .prefix("osb-wd-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o555)).unwrap();
    let run = |extra: &[&str]| {
        bin()
            .arg("run")
            .args(extra)
            .arg("--workdir")
            .arg(d.path())
            .args(["--", "/bin/sh", "-c", "echo x > out"])
            .output()
            .unwrap()
    };
    for extra in [&["--uid", "65534"][..], &[]] {
        let out = run(extra);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{extra:?}: {err}");
        assert!(err.contains(&d.path().display().to_string()), "{err}");
        assert!(err.contains("owned by 0:0 with mode 0555"), "{err}");
        // The sandbox writes as the owner there: the fix is the owner's write permission.
        assert!(
            err.contains(&format!("chmod u+w {}", d.path().display())),
            "{err}"
        );
    }
    // Root's own directory that root may write: the run writes there as root's.
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = run(&["--uid", "65534"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let m = std::fs::metadata(d.path().join("out")).unwrap();
    assert_eq!((m.uid(), m.gid()), (0, 0));
}

/// `serve` creates a missing workdir for the sandbox uid, and logs a loud error for one it
/// cannot write.
#[test]
fn serve_creates_a_missing_workdir_and_logs_an_unwritable_one() {
    if !require_root() {
        return;
    }
    let base = tempfile::Builder::new()
        .prefix("osb-serve-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let wd = base.path().join("sandbox");
    let serve = |wd: &Path| {
        bin()
            .args(["serve", "--no-gateway", "--uid", "65534", "--workdir"])
            .arg(wd)
            .args(["--", "/bin/sh", "-c", "echo made > f && cat f"])
            .output()
            .unwrap()
    };
    let out = serve(&wd);
    let err = text(&out.stderr);
    let m = std::fs::metadata(&wd).unwrap_or_else(|e| panic!("{e}: {err}"));
    assert_eq!((m.uid(), m.gid()), (65534, 65534), "{err}");
    assert_eq!(
        std::fs::read_to_string(wd.join("f")).unwrap(),
        "made\n",
        "{err}"
    );

    let locked = base.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = serve(&locked);
    let err = text(&out.stderr);
    assert!(err.contains("ERROR"), "{err}");
    assert!(err.contains(&locked.display().to_string()), "{err}");
    assert!(err.contains("owned by 0:0 with mode 0755"), "{err}");
}

// --- the CLI ----------------------------------------------------------------------------------

#[test]
fn top_level_help_lists_every_subcommand() {
    for args in [&["--help"][..], &["help"]] {
        let out = bin().args(args).output().unwrap();
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stdout}");
        for sub in [
            "run",
            "check",
            "serve",
            "install",
            "copy-self",
            "certs",
            "completions",
            "man",
        ] {
            assert!(
                stdout
                    .lines()
                    .any(|l| l.trim_start().starts_with(&format!("{sub} "))),
                "{sub} missing from {args:?}:\n{stdout}"
            );
        }
    }
    let out = bin().args(["help", "run"]).output().unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        stdout.contains("Usage: openshell-sandbox run [OPTIONS] [--] CMD [ARGS]..."),
        "{stdout}"
    );
    let out = bin().args(["help", "check"]).output().unwrap();
    assert!(text(&out.stdout).contains("Usage: openshell-sandbox check"));
    // Every size flag says it takes suffixes.
    for flag in ["--memory", "--file-size", "--max-output"] {
        let section: String = stdout
            .split("\n      --")
            .find(|s| s.starts_with(&flag[2..]))
            .unwrap_or_else(|| panic!("{flag} missing:\n{stdout}"))
            .to_string();
        assert!(section.contains("accepts suffixes"), "{flag}: {section}");
    }
}

#[test]
fn an_unknown_first_word_without_a_gateway_suggests_the_nearest_subcommand() {
    let out = bin().args(["rnu", "--", "true"]).output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("unknown subcommand `rnu`"), "{err}");
    assert!(err.contains("did you mean `run`?"), "{err}");
}

/// With a gateway configured, the first word keeps OpenShell's meaning: the main process's
/// command. The gateway here refuses the connection; what matters is that the word reached
/// the supervisor as a command rather than being refused as a typo.
#[test]
fn an_unknown_first_word_with_a_gateway_is_the_main_command() {
    let out = bin()
        .args(["rnu"])
        .env("OPENSHELL_ENDPOINT", "http://127.0.0.1:9")
        .env("OPENSHELL_SANDBOX_ID", "t")
        .env("OPENSHELL_SANDBOX_COMMAND", "")
        // Not a directory: the supervisor stops at once instead of dialling forever.
        .args(["--workdir", "/etc/hostname"])
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(!err.contains("unknown subcommand"), "{err}");
}

#[test]
fn log_level_is_validated() {
    let wd = Workdir::new();
    let out = run_in(&wd, &["--log-level", "bogus"], &["/bin/true"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("`bogus` is not a log level"), "{err}");
}

/// With `--log-format json`, our own lines on stderr are JSON: the summary (`-v`: a plain
/// exit prints none otherwise) and an error too.
#[test]
fn log_format_json_covers_the_summary_and_errors() {
    let wd = Workdir::new();
    let out = run_in(&wd, &["--log-format", "json", "-v"], &["/bin/true"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let lines: Vec<serde_json::Value> = err
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: not JSON: {l}")))
        .collect();
    let summary = lines.last().expect("a summary line");
    assert_eq!(summary["fields"]["report"]["reason"], "exited", "{summary}");

    // A usage error too.
    let out = run_in(
        &wd,
        &["--log-format", "json", "--timeout", "x"],
        &["/bin/true"],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    let line: serde_json::Value =
        serde_json::from_str(err.trim()).unwrap_or_else(|e| panic!("{e}: not JSON: {err}"));
    assert_eq!(line["level"], "ERROR");
    assert!(
        line["fields"]["message"]
            .as_str()
            .unwrap()
            .contains("--timeout")
    );

    let out = run_in(&wd, &["--log-format", "json"], &["/nonexistent-osb-cmd"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{err}");
    let last: serde_json::Value =
        serde_json::from_str(err.lines().last().unwrap()).unwrap_or_else(|e| panic!("{e}: {err}"));
    assert_eq!(last["level"], "ERROR");
    assert!(
        last["fields"]["message"]
            .as_str()
            .unwrap()
            .contains("command not found")
    );
}

#[test]
fn the_report_has_command_identity_limits_start_and_cgroup_version() {
    let wd = Workdir::new();
    let r = run(
        &wd,
        &["--memory", "512M", "--timeout", "30"],
        &["/bin/echo", "a b"],
    );
    assert_eq!(r.code(), 0, "{}", r.stderr());
    let v = &r.report;
    assert_eq!(v["command"], serde_json::json!(["/bin/echo", "a b"]), "{v}");
    let id = |f: &str| {
        std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find(|l| l.starts_with(f))
            .and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .map(|s| s.parse::<u64>().unwrap())
            })
            .unwrap()
    };
    if is_root() {
        // A per-run uid of --uid-range, gid = uid.
        let uid = v["uid"].as_u64().unwrap();
        assert!((1_900_000_000..=1_900_000_999).contains(&uid), "{v}");
        assert_eq!(v["gid"], uid);
    } else {
        assert_eq!(v["uid"].as_u64(), Some(id("Uid:")), "{v}");
        assert_eq!(v["gid"].as_u64(), Some(id("Gid:")), "{v}");
    }
    assert_eq!(v["limits"]["memory_bytes"], 512u64 << 20, "{v}");
    assert_eq!(v["limits"]["pids"], 512, "{v}");
    assert_eq!(v["limits"]["timeout_secs"], 30.0, "{v}");
    let started = v["started_at"].as_str().unwrap();
    assert!(
        started.len() == 27 && started.ends_with('Z') && &started[10..11] == "T",
        "{started}"
    );
    let cg = v["cgroup_version"].as_str();
    assert!(matches!(cg, Some("v1" | "v2")), "{v}");
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/report.md"))
        .expect("docs/report.md");
    for key in v.as_object().unwrap().keys() {
        assert!(
            docs.contains(&format!("`{key}`")),
            "docs/report.md lacks `{key}`"
        );
    }
}

// --- messages ---------------------------------------------------------------------------------

/// A program outside every grant is not in the view: the message says no grant covers it and
/// how to grant a directory (the same whether or not it exists on the host:
/// tests/exec_diagnosis.rs).
#[test]
fn a_program_outside_the_grants_is_named_as_not_in_the_view() {
    let wd = Workdir::new();
    let outside = readable_dir();
    let prog = outside.path().join("tool");
    std::fs::copy("/bin/true", &prog).unwrap();
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = run_in(&wd, &[], &[prog.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{err}");
    assert!(
        err.contains(&format!(
            "{}: command not found: the sandbox's view holds only the granted paths, and none covers it (`--ro DIR`",
            prog.display()
        )),
        "{err}"
    );
    // Granted, it runs.
    let out = run_in(
        &wd,
        &["--ro", outside.path().to_str().unwrap()],
        &[prog.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    // Granted, but in a 0700 directory of root: the sandbox uid may not search it, and the
    // message says so (its owner and mode, as the view shows them).
    if !is_root() {
        return;
    }
    std::fs::set_permissions(outside.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let out = run_in(
        &wd,
        &["--ro", outside.path().to_str().unwrap()],
        &[prog.to_str().unwrap()],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(126), "{err}");
    assert!(err.contains("cannot execute: Permission denied"), "{err}");
    assert!(
        err.contains(&format!(
            "may not search {} by its permissions (owner 0, mode 0700)",
            outside.path().display()
        )),
        "{err}"
    );
}

#[test]
fn a_script_whose_interpreter_is_missing_names_the_interpreter() {
    let wd = Workdir::new();
    let script = wd.path().join("s.py");
    std::fs::write(&script, "#!/nonexistent-osb/python3\nprint(1)\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = run_in(&wd, &[], &["./s.py"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{err}");
    assert!(err.contains("bad interpreter"), "{err}");
    assert!(err.contains("/nonexistent-osb/python3 not found"), "{err}");
}

/// The README's synopsis names every flag of `run` and `check`.
#[test]
fn readme_synopsis_lists_every_flag() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let start = readme
        .find("openshell-sandbox run [")
        .expect("run synopsis");
    let synopsis = &readme[start..start + readme[start..].find("```").unwrap()];
    for sub in ["run", "check"] {
        let out = bin().args([sub, "--help"]).output().unwrap();
        for line in text(&out.stdout).lines() {
            let line = line.trim_start();
            let Some(flag) = line
                .strip_prefix("-q, ")
                .or(Some(line))
                .filter(|l| l.starts_with("--"))
                .and_then(|l| l.split_whitespace().next())
            else {
                continue;
            };
            if flag == "--help" || flag == "--version" {
                continue;
            }
            assert!(
                synopsis.contains(flag),
                "the README synopsis lacks `{sub} {flag}`:\n{synopsis}"
            );
        }
    }
}

/// `check --explain` lists the Landlock path rules the prepared sandbox installs, one for one
/// (a missing deny path is not split around where the view is private; the view's tmpfs roots
/// are rules of their own), not the policy's lists expanded on their own.
#[test]
fn check_explain_lists_exactly_the_installed_rules() {
    let out = Command::new(BIN)
        .args(["check", "--explain", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stderr)));
    let paths = v["landlock_rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| !r["path"].as_str().unwrap_or("").starts_with('('))
        .count();
    let detail = v["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["layer"] == "landlock-fs")
        .and_then(|l| l["detail"].as_str())
        .unwrap_or("")
        .to_string();
    if !detail.contains("path rules") {
        // Landlock unavailable here: nothing is installed, and nothing is listed.
        assert_eq!(paths, 0, "{v}");
        return;
    }
    assert!(
        detail.contains(&format!(", {paths} path rules")),
        "explain lists {paths} path rules, the layer says: {detail}"
    );
}
