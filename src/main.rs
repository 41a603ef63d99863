//! Entry point: pick the subcommand, run it, and turn errors into one readable line and an exit
//! code. This is the only place that formats errors for humans.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use openshell_sandbox::{certs, check, cli, exec, gateway, install, logging, manual};

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    // Subcommands are recognised by the first word only. A flag first is the supervisor, as
    // the pod starts it: `openshell-sandbox [--workdir /sandbox] [MAIN...]`; no word at all is
    // too, once serve has something to do. `copy-self` is matched on the raw argv before any
    // flag parsing (OpenShell's contract).
    let first = argv.get(1).map(|a| a.to_string_lossy().into_owned());
    let sub = first.as_deref();
    // A supervisor that is not root enters a user namespace of its own, which will own the
    // sandbox view (sandbox/namespaces.rs). unshare(CLONE_NEWUSER) needs a single-threaded
    // process, so this comes before anything starts a thread.
    if !matches!(
        sub,
        Some(
            "copy-self"
                | "install"
                | "certs"
                | "completions"
                | "man"
                | "help"
                | "--help"
                | "-h"
                | "--version"
                | "-V"
        )
    ) {
        openshell_sandbox::sandbox::namespaces::enter_user_ns();
        // A root supervisor in a pod finds /sys/fs/cgroup read-only (containerd mounts it so);
        // it works through a private read-write copy (sandbox/cgroup_remount.rs).
        openshell_sandbox::sandbox::cgroup_remount::make_writable();
    }
    let result = match sub {
        Some("copy-self") => install::copy_self_main(&argv[2..]),
        Some("run") => exec::run::main(cli::parsed_or_exit(
            cli::RunArgs::parse_argv(&argv[1..]),
            &argv,
        )),
        // `check --gateway` takes serve's flags and env, so it is parsed by its own module.
        Some("check") if argv[2..].iter().any(|a| a == "--gateway") => {
            gateway::doctor::main(&argv[1..]).map_err(Into::into)
        }
        Some("check") => check::main(cli::parsed_or_exit(
            cli::CheckArgs::parse_argv(&argv[1..]),
            &argv,
        )),
        Some("install") => install::main(&argv[1..]),
        Some("certs") => certs::main(&argv[1..]),
        Some("serve") => gateway::main(&argv[1..]),
        Some("completions") => manual::completions(&cli::parsed_or_exit(
            cli::CompletionsArgs::try_parse_from(&argv[1..]),
            &argv,
        )),
        Some("man") => manual::man(&cli::parsed_or_exit(
            cli::ManArgs::try_parse_from(&argv[1..]),
            &argv,
        )),
        // Hidden: what the `sftp` subsystem runs, inside the sandbox (gateway/ssh/sftp.rs).
        Some(gateway::ssh::sftp::MODE) => return gateway::ssh::sftp::serve_stdio(),
        Some("help") => help(argv.get(2).map(|a| a.to_string_lossy().into_owned())),
        Some("-h" | "--help") => help(None),
        Some("-V" | "--version") => {
            println!("openshell-sandbox {}", cli::VERSION);
            Ok(ExitCode::SUCCESS)
        }
        // Nothing for the supervisor to do: a person trying the binary.
        None if !serve_configured() => {
            eprintln!("{}", cli::SHORT_USAGE);
            Ok(ExitCode::from(cli::USAGE_EXIT))
        }
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

/// Whether a gateway is configured the way the pod configures it: a non-empty
/// OPENSHELL_ENDPOINT (or its fallback, OPENSHELL_GATEWAY_ENDPOINT).
fn gateway_configured() -> bool {
    env_set("OPENSHELL_ENDPOINT") || env_set("OPENSHELL_GATEWAY_ENDPOINT")
}

/// Whether a bare `openshell-sandbox` has something to serve: a gateway, or a main process
/// given by the environment (serve runs one without a gateway).
fn serve_configured() -> bool {
    gateway_configured()
        || env_set("OPENSHELL_MAIN_PROCESS_SPEC")
        || env_set("OPENSHELL_SANDBOX_COMMAND")
}

fn env_set(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty())
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
        Some("completions") => {
            let _ = cli::CompletionsArgs::command().print_long_help();
            Ok(ExitCode::SUCCESS)
        }
        Some("man") => {
            let _ = cli::ManArgs::command().print_long_help();
            Ok(ExitCode::SUCCESS)
        }
        Some(w) => Err(unknown_subcommand(w)),
    }
}

/// Exit codes follow docker's and the shell's conventions for a launcher: 127 when the command
/// is not found, 126 when it cannot be executed, 125 for a usage error or when the sandbox
/// itself failed or refused (`RunError::exit_code`); 1 for the other subcommands' failures.
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
