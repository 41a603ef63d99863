//! The command line as people expect it, through the real binary: signals reach the command,
//! our own failures exit 125, a plain run is silent, `run CMD` needs no `--`, serve-mode typos
//! are usage errors, `--version`, completions and man pages, NO_COLOR, and policy-file errors
//! that name the file and line once.

mod support;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use support::text;
use support::*;

/// `openshell-sandbox ARGS` in `wd`, stdin closed.
fn bin(wd: &Workdir, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(wd.path())
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// `openshell-sandbox run --workdir WD ARGS`, exactly as given (no `--` added).
fn run_raw(wd: &Workdir, args: &[&str]) -> Output {
    let mut v = vec!["run", "--workdir", wd.path().to_str().unwrap()];
    v.extend_from_slice(args);
    bin(wd, &v)
}

fn run_raw_in(workdir: &std::path::Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(["run", "--workdir"])
        .arg(workdir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn wait_bounded(c: &mut Child, secs: u64) -> Option<ExitStatus> {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if let Some(st) = c.try_wait().unwrap() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = c.kill();
    None
}

/// Start `run -- python3 -c CODE`, wait until the child printed `ready`, send `sig` to the
/// supervisor (as a terminal's Ctrl-C or `kill` does), and return its exit status, stdout
/// after `ready`, and stderr.
fn signal_run(extra: &[&str], code: &str, sig: i32) -> (ExitStatus, String, String) {
    let wd = Workdir::new();
    let mut c = Reaped(
        Command::new(BIN)
            .args(["run", "--workdir"])
            .arg(wd.path())
            .args(extra)
            .args(["--", "python3", "-u", "-c", code])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n", "the child never got ready");
    // SAFETY: kill with the pid of the supervisor this test spawned and a valid signal.
    assert_eq!(unsafe { libc::kill(c.id() as i32, sig) }, 0);
    let Some(st) = wait_bounded(&mut c, 30) else {
        // wait_bounded killed it: say what the run and the command had said by then.
        let mut err = String::new();
        c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        panic!(
            "the run did not end within 30 s of signal {sig}; stdout after ready: {rest:?}; stderr: {err}"
        );
    };
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let mut err = String::new();
    c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    (st, rest, err)
}

// ---------------------------------------------------------------------------------------------
// Signals reach the command as the signal that was sent; the exit code is the command's.

#[test]
fn sigint_reaches_the_command_as_a_keyboard_interrupt() {
    // `ready` inside the try: a SIGINT right after it must land in the handler.
    let code = "import time, sys\n\
                try:\n    print('ready')\n    time.sleep(60)\n\
                except KeyboardInterrupt:\n    print('KeyboardInterrupt')\n    sys.exit(0)\n";
    let (st, out, err) = signal_run(&[], code, libc::SIGINT);
    assert_eq!(out, "KeyboardInterrupt\n", "stderr: {err}");
    assert_eq!(
        (st.code(), st.signal()),
        (Some(0), None),
        "the command exited 0, so does run: {err}"
    );
    // The command ended itself: nothing of ours on stderr.
    assert_eq!(err, "", "a plain end prints nothing");
}

#[test]
fn a_command_that_does_not_handle_sigint_dies_of_it() {
    let code = "import time\nprint('ready')\ntime.sleep(60)\n";
    let sig = libc::SIGINT;
    let (st, _, err) = signal_run(
        &["-v"],
        &format!("import signal\nsignal.signal(signal.SIGINT, signal.SIG_DFL)\n{code}"),
        sig,
    );
    assert_eq!(st.code(), Some(128 + sig), "{err}");
    assert!(
        err.contains("killed by SIGINT (reason signaled, code 130)"),
        "{err}"
    );
}

#[test]
fn every_proxied_signal_arrives_as_itself() {
    for (sig, name) in [
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGHUP, "SIGHUP"),
        (libc::SIGQUIT, "SIGQUIT"),
        (libc::SIGUSR1, "SIGUSR1"),
        (libc::SIGUSR2, "SIGUSR2"),
    ] {
        // The handler's exit code says which signal arrived.
        let code = format!(
            "import signal, sys, time\n\
             signal.signal(signal.{name}, lambda s, f: (print('got', s), sys.exit(40)))\n\
             print('ready')\ntime.sleep(60)\n"
        );
        let (st, out, err) = signal_run(&["--log-level", "debug"], &code, sig);
        assert_eq!(out, format!("got {sig}\n"), "{name}: {err}");
        assert_eq!(st.code(), Some(40), "{name}: {err}");
    }
}

/// The signal reaches the command's job (its process group), as a terminal's Ctrl-C does:
/// a shell's foreground child gets it too. bash waits for a child that handled SIGINT and
/// goes on ("wait and cooperative exit"), so its exit code is its own.
#[test]
fn sigint_reaches_the_whole_job_under_a_shell() {
    let wd = Workdir::new();
    let script = "python3 -u -c \"\nimport sys, time\ntry:\n    print('ready')\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    print('child got it')\n    sys.exit(3)\n\"; echo \"shell saw $?\"";
    let mut c = Reaped(
        Command::new(BIN)
            .args(["run", "--workdir"])
            .arg(wd.path())
            .args(["--", "bash", "-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(c.id() as i32, libc::SIGINT) }, 0);
    let st = wait_bounded(&mut c, 30).expect("the run did not end");
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "child got it\nshell saw 3\n");
    assert_eq!(st.code(), Some(0));
}

// ---------------------------------------------------------------------------------------------
// The summary line: silent by default, present when the sandbox decided the end or with -v.

#[test]
fn a_plain_run_prints_nothing_of_its_own() {
    let wd = Workdir::new();
    let out = run_raw(&wd, &["--", "sh", "-c", "echo out; echo err >&2; exit 3"]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(text(&out.stdout), "out\n");
    assert_eq!(text(&out.stderr), "err\n", "only the command's stderr");

    // A death by a signal the command chose is the command's end too; -v names the signal.
    let out = run_raw(&wd, &["--", "sh", "-c", "kill -PIPE $$"]);
    assert_eq!(out.status.code(), Some(128 + libc::SIGPIPE));
    assert_eq!(text(&out.stderr), "");
    let out = run_raw(&wd, &["-v", "--", "sh", "-c", "kill -PIPE $$"]);
    let err = text(&out.stderr);
    assert!(
        err.starts_with("openshell-sandbox: killed by SIGPIPE (reason signaled, code 141)"),
        "{err}"
    );
    let out = run_raw(&wd, &["--verbose", "--", "true"]);
    let err = text(&out.stderr);
    assert!(
        err.starts_with("openshell-sandbox: exited 0 (reason exited, code 0)"),
        "{err}"
    );
}

#[test]
fn the_summary_appears_when_the_sandbox_ended_the_run() {
    let wd = Workdir::new();
    let out = run_raw(&wd, &["--timeout", "0.3", "--", "sleep", "30"]);
    assert_eq!(out.status.code(), Some(124));
    let err = text(&out.stderr);
    assert!(
        err.contains("openshell-sandbox: timed out (reason timeout, code 124)"),
        "{err}"
    );

    let out = run_raw(&wd, &["--max-output", "4", "--", "echo", "0123456789"]);
    let err = text(&out.stderr);
    assert!(err.contains("(reason output_limit, code 0)"), "{err}");

    // -q silences even that.
    let out = run_raw(&wd, &["-q", "--timeout", "0.3", "--", "sleep", "30"]);
    assert_eq!(out.status.code(), Some(124));
    assert_eq!(text(&out.stderr), "");
}

// ---------------------------------------------------------------------------------------------
// `run CMD` without `--`.

#[test]
fn run_takes_the_command_without_double_dash() {
    let wd = Workdir::new();
    let out = run_raw(&wd, &["true"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "");
    // Flags after the command are the command's.
    let out = run_raw(
        &wd,
        &[
            "--timeout",
            "20",
            "sh",
            "-c",
            "echo \"$@\"",
            "x",
            "--timeout",
            "1",
        ],
    );
    assert_eq!(text(&out.stdout), "--timeout 1\n", "{}", text(&out.stderr));
    // `--` stays accepted, and is how a command that starts with `-` is given.
    let out = run_raw(&wd, &["--", "echo", "hi"]);
    assert_eq!(text(&out.stdout), "hi\n");
    let out = run_raw(&wd, &["--", "-x"]);
    assert_eq!(out.status.code(), Some(127), "{}", text(&out.stderr));
}

// ---------------------------------------------------------------------------------------------
// Exit codes: 125 for everything of ours, 126/127 for the command.

#[test]
fn our_own_failures_exit_125() {
    let wd = Workdir::new();
    let bad_yaml = wd.path().join("bad.yaml");
    std::fs::write(
        &bad_yaml,
        "version: 1\nfilesystem_policy:\n  read_only: [/usr\n  bad: x\n",
    )
    .unwrap();
    let bad_yaml = bad_yaml.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["run", "--bogus", "--", "true"],
            "unexpected argument '--bogus'",
        ),
        (&["run"], "required"),
        (&["run", "--timeout", "-1", "--", "true"], "--timeout"),
        (&["run", "--policy", bad_yaml, "--", "true"], "bad.yaml"),
        (
            &["run", "--workdir", "/nonexistent-osb", "--", "true"],
            "/nonexistent-osb",
        ),
        (
            &["run", "--env", "OPENSHELL_X=1", "--", "true"],
            "supervisor variables",
        ),
        (&["check", "--bogus"], "unexpected argument '--bogus'"),
        (&["install", "--bogus"], "unexpected argument '--bogus'"),
        (&["certs", "--bogus"], "unexpected argument"),
        (&["copy-self"], "expected exactly one DEST"),
        (&["completions", "tcsh"], "invalid value 'tcsh'"),
        (&["rnu", "true"], "did you mean `run`"),
    ];
    for (args, want) in cases {
        let out = Command::new(BIN)
            .args(*args)
            .current_dir(wd.path())
            .env_remove("OPENSHELL_ENDPOINT")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    // A workdir the command cannot write (as root: a 0555 directory of root's, which the
    // idmapped workdir shows as the command's own, without the write bit).
    if is_root() {
        let private = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            private.path(),
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o555),
        )
        .unwrap();
        let out = run_raw_in(private.path(), &["--", "true"]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{err}");
        assert!(err.contains("is not writable by"), "{err}");
    }
    // A refused layer is check_and_failclosed's (exit 125 there); a command's own codes
    // stay its own.
    let out = run_raw(&wd, &["--", "sh", "-c", "exit 2"]);
    assert_eq!(out.status.code(), Some(2));
    let out = run_raw(&wd, &["--", "/nonexistent-osb-cmd"]);
    assert_eq!(out.status.code(), Some(127));
    let script = wd.path().join("noexec.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    let out = run_raw(&wd, &["--", script.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(126), "{}", text(&out.stderr));
}

// ---------------------------------------------------------------------------------------------
// Serve mode: typos are usage errors, a bare binary prints a short usage.

fn serve_mode(env: &[(&str, &str)], args: &[&str]) -> (Option<i32>, String) {
    let mut c = Command::new(BIN);
    c.env_clear().env("PATH", "/usr/bin:/bin").args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.stdin(Stdio::null()).output().unwrap();
    (out.status.code(), text(&out.stderr))
}

#[test]
fn a_mistyped_serve_flag_is_a_usage_error_never_the_main_command() {
    let gw: &[(&str, &str)] = &[
        ("OPENSHELL_ENDPOINT", "https://gateway.invalid:8080"),
        ("OPENSHELL_SANDBOX_ID", "x"),
    ];
    for env in [&[][..], gw] {
        for args in [&["--workdri", "/tmp"][..], &["serve", "--workdri", "/tmp"]] {
            let (code, err) = serve_mode(env, args);
            assert_eq!(code, Some(125), "{env:?} {args:?}: {err}");
            assert!(err.contains("unexpected argument '--workdri'"), "{err}");
            assert!(
                err.contains("a similar argument exists: '--workdir'"),
                "{err}"
            );
            assert!(!err.contains("command not found"), "{err}");
            assert!(!err.contains("main process"), "{err}");
        }
        let (code, err) = serve_mode(env, &["serve", "--bogus"]);
        assert_eq!(code, Some(125), "{err}");
    }
    // The shapes a pod uses still parse: flags, then the main command with its own flags
    // (run here with no gateway, which takes --no-gateway).
    let wd = Workdir::new();
    let mut args = vec!["--no-gateway", "--workdir", wd.path().to_str().unwrap()];
    if !is_root() {
        args.push("--allow-degraded");
    }
    args.extend(["sh", "-c", "echo \"$@\"; exit 4", "x", "--workdri", "-v"]);
    let mut c = Command::new(BIN);
    let out = c
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .args(&args)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
}

#[test]
fn a_bare_binary_without_a_gateway_prints_a_short_usage() {
    let (code, err) = serve_mode(&[], &[]);
    assert_eq!(code, Some(125), "{err}");
    for want in ["openshell-sandbox run", "openshell-sandbox check", "--help"] {
        assert!(err.contains(want), "{want}: {err}");
    }
    assert!(err.lines().count() < 10, "short: {err}");
    // With a gateway configured, no arguments is the supervisor, as the pod starts it.
    let (code, err) = serve_mode(
        &[("OPENSHELL_ENDPOINT", "https://gateway.invalid:8080")],
        &[],
    );
    assert_ne!(code, Some(0));
    assert!(err.contains("OPENSHELL_SANDBOX_ID"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// --version, completions, man pages.

#[test]
fn version_names_the_commit_and_the_build_profile() {
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| text(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    let want = format!(
        "{} (commit {commit}, {profile} build)",
        env!("CARGO_PKG_VERSION")
    );
    for (args, name) in [
        (&["--version"][..], "openshell-sandbox"),
        (&["-V"], "openshell-sandbox"),
        (&["run", "--version"], "openshell-sandbox run"),
        (&["check", "--version"], "openshell-sandbox check"),
        (&["install", "--version"], "openshell-sandbox install"),
        (&["certs", "--version"], "openshell-sandbox certs"),
        (&["--workdir", "/tmp", "--version"], "openshell-sandbox"),
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert_eq!(text(&out.stdout), format!("{name} {want}\n"), "{args:?}");
    }
}

/// bash completes subcommands and each subcommand's own flags (the generated script is
/// sourced and its function called as bash's completion would).
#[test]
fn bash_completes_subcommands_and_their_flags() {
    let script = Command::new(BIN)
        .args(["completions", "bash"])
        .output()
        .unwrap();
    assert_eq!(script.status.code(), Some(0));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("osb.bash");
    std::fs::write(&path, &script.stdout).unwrap();
    let complete = |words: &[&str]| -> Vec<String> {
        let cword = words.len() - 1;
        let prev = if cword > 0 { words[cword - 1] } else { "" };
        let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
        let sh = format!(
            "source '{}'; COMP_WORDS=({}); COMP_CWORD={cword}; \
             _openshell__sandbox openshell-sandbox '{}' '{prev}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            path.display(),
            quoted.join(" "),
            words[cword],
        );
        let out = Command::new("bash").args(["-c", &sh]).output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout).lines().map(str::to_owned).collect()
    };
    assert_eq!(complete(&["openshell-sandbox", "ch"]), ["check"]);
    assert_eq!(
        complete(&["openshell-sandbox", "run", "--time"]),
        ["--timeout"]
    );
    assert_eq!(
        complete(&["openshell-sandbox", "check", "--expl"]),
        ["--explain"]
    );
    assert_eq!(
        complete(&["openshell-sandbox", "serve", "--endp"]),
        ["--endpoint"]
    );
    assert_eq!(
        complete(&["openshell-sandbox", "run", "--network", ""]),
        ["none", "all"]
    );
}

#[test]
fn zsh_and_fish_completions_cover_every_subcommand() {
    for shell in ["zsh", "fish"] {
        let out = Command::new(BIN)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let s = text(&out.stdout);
        for word in ["run", "check", "serve", "timeout", "explain", "endpoint"] {
            assert!(s.contains(word), "{shell}: {word} missing");
        }
        // A syntax check where the shell is installed.
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join(format!("c.{shell}"));
        std::fs::write(&f, &out.stdout).unwrap();
        if let Ok(o) = Command::new(shell).arg("-n").arg(&f).output() {
            assert!(o.status.success(), "{shell} -n: {}", text(&o.stderr));
        }
    }
}

#[test]
fn man_pages_and_make_install_files() {
    let out = Command::new(BIN).arg("man").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let page = text(&out.stdout);
    assert!(page.contains(".TH openshell-sandbox 1"), "{page}");
    assert!(page.contains("openshell\\-sandbox\\-run(1)"), "{page}");

    // The Makefile's install step, with this binary, into a staging directory.
    if !require(
        Command::new("make").arg("--version").output().is_ok(),
        "make is needed to test `make install`",
    ) {
        return;
    }
    let dest = tempfile::tempdir().unwrap();
    let out = Command::new("make")
        .args(["-s", "install-files", &format!("BIN={BIN}"), "PREFIX=/usr"])
        .arg(format!("DESTDIR={}", dest.path().display()))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let root = dest.path().join("usr");
    let run_page = std::fs::read_to_string(root.join("share/man/man1/openshell-sandbox-run.1"))
        .expect("run's man page");
    assert!(run_page.contains("\\-\\-timeout"), "{run_page}");
    assert!(run_page.contains("Exit code"), "{run_page}");
    for f in [
        "bin/openshell-sandbox",
        "share/man/man1/openshell-sandbox.1",
        "share/man/man1/openshell-sandbox-check.1",
        "share/bash-completion/completions/openshell-sandbox",
        "share/zsh/site-functions/_openshell-sandbox",
        "share/fish/vendor_completions.d/openshell-sandbox.fish",
    ] {
        let m = std::fs::metadata(root.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(m.len() > 0, "{f} is empty");
    }
}

// ---------------------------------------------------------------------------------------------
// Colour: NO_COLOR and a non-tty stderr turn it off.

/// stderr of `openshell-sandbox ARGS` when it is a terminal.
fn stderr_on_a_tty(args: &[&str], no_color: bool) -> String {
    let pty = nix::pty::openpty(None, None).unwrap();
    let mut c = Command::new(BIN);
    c.args(args)
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(pty.slave));
    if no_color {
        c.env("NO_COLOR", "1");
    }
    let mut child = Reaped(c.spawn().unwrap());
    // The Command holds our copy of the slave: without it, reading ends when the child's
    // copies close (EIO on a pty master).
    drop(c);
    let mut master = std::fs::File::from(pty.master);
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = master.read_to_end(&mut out);
        out
    });
    wait_bounded(&mut child, 60).expect("the binary did not exit");
    text(&reader.join().unwrap())
}

#[test]
fn no_color_and_a_non_tty_stderr_turn_colours_off() {
    let wd = Workdir::new();
    let w = wd.path().to_str().unwrap();
    let log = ["run", "--workdir", w, "--log-level", "info", "--", "true"];
    let usage = ["run", "--bogus", "--", "true"];
    for args in [&log[..], &usage[..]] {
        let coloured = stderr_on_a_tty(args, false);
        assert!(
            coloured.contains("\x1b["),
            "a terminal gets colour: {coloured:?}"
        );
        let plain = stderr_on_a_tty(args, true);
        assert!(!plain.contains("\x1b["), "NO_COLOR: {plain:?}");
        assert!(!plain.is_empty());
        // Not a terminal: no colour either.
        let out = Command::new(BIN)
            .args(args)
            .env_remove("NO_COLOR")
            .output()
            .unwrap();
        assert!(
            !text(&out.stderr).contains("\x1b["),
            "{}",
            text(&out.stderr)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Policy files: errors name the file and the line once; a bad network rule names its key.

#[test]
fn a_yaml_error_names_the_file_and_line_once() {
    let wd = Workdir::new();
    let pol = wd.path().join("p.yaml");
    std::fs::write(
        &pol,
        "version: 1\nfilesystem_policy:\n  read_only: [/usr\n  bad: x\n",
    )
    .unwrap();
    let p = pol.to_str().unwrap();
    let out = run_raw(&wd, &["--policy", p, "--", "true"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert_eq!(err.matches(p).count(), 1, "{err}");
    assert_eq!(err.matches("line 4").count(), 1, "{err}");
    assert_eq!(err.matches("illegal placement").count(), 1, "{err}");
    assert!(!err.contains("<input>"), "{err}");
}

#[test]
fn a_network_section_runs_and_a_bad_rule_names_its_key() {
    let wd = Workdir::new();
    let pol = wd.path().join("p.yaml");
    let yaml = |port: &str| {
        format!(
            "version: 1\nfilesystem_policy:\n  include_workdir: true\n  read_only: [/usr, /lib, /lib64, /bin, /etc]\n\
             network_policies:\n  pypi:\n    endpoints:\n      - host: pypi.org\n        {port}\n    binaries: [{{path: /usr/bin/pip}}]\n"
        )
    };
    std::fs::write(&pol, yaml("port: 443")).unwrap();
    let p = pol.to_str().unwrap();
    let out = run_raw(&wd, &["--policy", p, "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    std::fs::write(&pol, yaml("port: 443\n        allowed_ips: [127.0.0.0/8]")).unwrap();
    let out = run_raw(&wd, &["--policy", p, "--", "true"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.contains(&format!("--policy {p}: network_policies.pypi")),
        "{err}"
    );
}

/// `--log-format json`: our own lines are JSON; the command's stderr is its own.
#[test]
fn log_format_json_leaves_the_commands_stderr_alone() {
    let wd = Workdir::new();
    let out = run_raw(
        &wd,
        &[
            "--log-format",
            "json",
            "--timeout",
            "0.5",
            "--",
            "sh",
            "-c",
            "echo 'not json' >&2; sleep 30",
        ],
    );
    let err = text(&out.stderr);
    let (raw, ours): (Vec<&str>, Vec<&str>) = err.lines().partition(|l| *l == "not json");
    assert_eq!(raw.len(), 1, "{err}");
    assert!(!ours.is_empty(), "{err}");
    for l in ours {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        assert!(v["fields"]["message"].is_string(), "{l}");
    }
}

/// With --tty, a resize of our terminal (SIGWINCH to `run`) resizes the child's pty, and the
/// kernel tells the child's foreground job with a SIGWINCH of its own.
#[test]
fn sigwinch_resizes_the_childs_terminal() {
    let wd = Workdir::new();
    let ws = |cols, rows| libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(Some(&ws(80, 24)), None).unwrap();
    let code = "import os, signal, sys, time\n\
                def h(s, f):\n    c, l = os.get_terminal_size(1)\n    os.write(1, b'size %d %d\\n' % (c, l))\n    os._exit(0)\n\
                signal.signal(signal.SIGWINCH, h)\n\
                print('ready', os.get_terminal_size(1).columns, flush=True)\n\
                time.sleep(60)\n";
    let mut c = Command::new(BIN);
    c.args(["run", "--tty", "--workdir"])
        .arg(wd.path())
        .args(["--", "python3", "-c", code])
        .stdin(Stdio::null())
        .stdout(Stdio::from(pty.slave))
        .stderr(Stdio::null());
    let mut child = Reaped(c.spawn().unwrap());
    drop(c);
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let master = std::fs::File::from(pty.master);
    let fd = std::os::fd::AsRawFd::as_raw_fd(&master);
    std::thread::spawn(move || {
        let mut r = BufReader::new(master);
        let mut line = String::new();
        while r.read_line(&mut line).is_ok_and(|n| n > 0) {
            let _ = tx.send(line.trim_end().to_owned());
            line.clear();
        }
    });
    let next = || {
        rx.recv_timeout(Duration::from_secs(30))
            .expect("no line from the child")
    };
    assert_eq!(next(), "ready 80", "the child's pty starts at our size");
    let size = ws(120, 40);
    // SAFETY: TIOCSWINSZ with a winsize on our stack, on the master the reader holds open.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &size) };
    assert_eq!(rc, 0);
    // Our pty is not `run`'s controlling terminal: send the SIGWINCH a terminal would.
    // SAFETY: kill with the pid of the supervisor this test spawned.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGWINCH) }, 0);
    assert_eq!(next(), "size 120 40");
    let st = wait_bounded(&mut child, 30).expect("the run did not end");
    assert_eq!(st.code(), Some(0));
}
