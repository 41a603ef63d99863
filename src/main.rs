//! Entry point: pick the subcommand, run it, and turn errors into one readable line and an exit
//! code. This is the only place that formats errors for humans.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::CommandFactory;
use openshell_sandbox::{certs, check, cli, exec, gateway, install, logging};

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    // Subcommands are recognised by the first word only. No word, or a flag first, is the
    // supervisor, as the pod starts it: `openshell-sandbox [--workdir /sandbox] [MAIN...]`.
    // `copy-self` is matched on the raw argv before any flag parsing (OpenShell's contract).
    let first = argv.get(1).map(|a| a.to_string_lossy().into_owned());
    let sub = first.as_deref();
    // A supervisor that is not root enters a user namespace of its own, which will own the
    // sandbox view (sandbox/namespaces.rs). unshare(CLONE_NEWUSER) needs a single-threaded
    // process, so this comes before anything starts a thread.
    if !matches!(
        sub,
        Some("copy-self" | "install" | "certs" | "--help" | "-h" | "--version" | "-V")
    ) {
        openshell_sandbox::sandbox::namespaces::enter_user_ns();
        // A root supervisor in a pod finds /sys/fs/cgroup read-only (containerd mounts it so);
        // it works through a private read-write copy (sandbox/cgroup_remount.rs).
        openshell_sandbox::sandbox::cgroup_remount::make_writable();
    }
    let result = match sub {
        Some("copy-self") => install::copy_self_main(&argv[2..]),
        Some("run") => exec::run::main(parsed(cli::RunArgs::parse_argv(&argv[1..]), &argv)),
        // `check --gateway` takes serve's flags and env, so it is parsed by its own module.
        Some("check") if argv[2..].iter().any(|a| a == "--gateway") => {
            gateway::doctor::main(&argv[1..]).map_err(Into::into)
        }
        Some("check") => check::main(parsed(cli::CheckArgs::parse_argv(&argv[1..]), &argv)),
        Some("install") => install::main(&argv[1..]),
        Some("certs") => certs::main(&argv[1..]),
        Some("serve") => gateway::main(&argv[1..]),
        // Hidden: what the `sftp` subsystem runs, inside the sandbox (gateway/ssh/sftp.rs).
        Some(gateway::ssh::sftp::MODE) => return gateway::ssh::sftp::serve_stdio(),
        Some("help") => help(argv.get(2).map(|a| a.to_string_lossy().into_owned())),
        Some("-h" | "--help") => help(None),
        None => gateway::main(&argv[..]),
        Some(w) if w.starts_with('-') => gateway::main(&argv[..]),
        // OpenShell's own supervisor subcommands: the supervisor says what it makes of them.
        Some("validate-workspace" | "debug-rpc") => gateway::main(&argv[..]),
        // With a gateway, OpenShell's meaning: the rest of argv is the main process's command.
        Some(_) if gateway_configured() => gateway::main(&argv[..]),
        Some(w) => Err(unknown_subcommand(w)),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            let code = exit_code_for(&err);
            let text = render(&err);
            if logging::json_enabled() {
                logging::json_line("ERROR", &format!("error: {text}"), None);
            } else {
                eprintln!("openshell-sandbox: error: {text}");
            }
            ExitCode::from(code)
        }
    }
}

/// The parsed flags, or clap's error and exit (2). With `--log-format json` on the command
/// line, the error is a JSON line too, so that stderr stays machine-readable.
fn parsed<T>(r: Result<T, clap::Error>, argv: &[OsString]) -> T {
    match r {
        Ok(a) => a,
        Err(e) if e.use_stderr() && json_requested(argv) => {
            let text = e.render().to_string();
            logging::json_line("ERROR", text.trim(), None);
            std::process::exit(e.exit_code())
        }
        Err(e) => e.exit(),
    }
}

/// `--log-format json` (or `=json`) among the flags, before `--`.
fn json_requested(argv: &[OsString]) -> bool {
    let flags: Vec<&str> = argv
        .iter()
        .map_while(|a| a.to_str().filter(|a| *a != "--"))
        .collect();
    flags.windows(2).any(|w| w == ["--log-format", "json"]) || flags.contains(&"--log-format=json")
}

/// Whether a gateway is configured the way the pod configures it: a non-empty
/// OPENSHELL_ENDPOINT.
fn gateway_configured() -> bool {
    std::env::var_os("OPENSHELL_ENDPOINT").is_some_and(|v| !v.is_empty())
}

/// A first word that is no subcommand, with no gateway configured: without a gateway there
/// is nobody to serve, so it is a typo rather than a main-process command.
fn unknown_subcommand(word: &str) -> anyhow::Error {
    let hint = match cli::nearest_subcommand(word) {
        Some(s) => format!("did you mean `{s}`?"),
        None => format!("the subcommands are {}", cli::Command::WORDS.join(", ")),
    };
    anyhow::Error::new(exec::RunError::Usage(format!(
        "unknown subcommand `{word}`: {hint} (see `openshell-sandbox --help`; with \
         OPENSHELL_ENDPOINT set, a first word that is no subcommand is the main process's command)"
    )))
}

/// `openshell-sandbox help [SUB]` and `openshell-sandbox --help`.
fn help(sub: Option<String>) -> anyhow::Result<ExitCode> {
    let help_of = |word: &str| -> Vec<OsString> { vec![word.into(), "--help".into()] };
    match sub.as_deref() {
        None | Some("help") => {
            // A closed pipe (`| head`) is no error of ours.
            let _ = cli::TopArgs::command().print_help();
            Ok(ExitCode::SUCCESS)
        }
        Some("run") => {
            let _ = cli::RunArgs::command().print_long_help();
            Ok(ExitCode::SUCCESS)
        }
        Some("check") => {
            let _ = cli::CheckArgs::command().print_long_help();
            Ok(ExitCode::SUCCESS)
        }
        Some("serve") => gateway::main(&help_of("serve")),
        Some("install") => install::main(&help_of("install")),
        Some("certs") => certs::main(&help_of("certs")),
        Some("copy-self") => install::copy_self_main(&["--help".into()]),
        Some(w) => Err(unknown_subcommand(w)),
    }
}

/// Exit codes follow the shell's conventions for a launcher: 127 when the command is not found,
/// 126 when it cannot be executed, 125 when the sandbox itself failed or refused, 2 for usage.
fn exit_code_for(err: &anyhow::Error) -> u8 {
    if let Some(e) = err.downcast_ref::<exec::RunError>() {
        return e.exit_code();
    }
    1
}

/// The error and its causes on one line, skipping a cause whose text the message before it
/// already includes (many errors name their cause in their own message).
fn render(err: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}
