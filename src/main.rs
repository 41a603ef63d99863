//! Entry point: pick the subcommand, run it, and turn errors into one readable line and an exit
//! code. This is the only place that formats errors for humans; [`Failure::exit`] takes each
//! subcommand's typed error to its row of the one exit-code table (`openshell_sandbox::exit`).

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use openshell_sandbox::exit::Exit;
use openshell_sandbox::{certs, check, cli, exec, gateway, install, logging, manual};

/// The parsed flags, or return clap's exit code (help, version, a usage error) from `main`.
macro_rules! parsed {
    ($r:expr, $argv:expr) => {
        match cli::parsed($r, $argv) {
            Ok(a) => a,
            Err(code) => return code,
        }
    };
}

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    // Subcommands are recognised by the first word only. A flag first is the supervisor, as
    // the pod starts it: `openshell-sandbox [--workdir /sandbox] [MAIN...]`; no word at all is
    // too, once serve has something to do. `copy-self` is matched on the raw argv before any
    // flag parsing (OpenShell's contract).
    let first = argv.get(1).map(|a| a.to_string_lossy().into_owned());
    let sub = first.as_deref();
    let result = match sub {
        Some("copy-self") => install::copy_self_main(&argv[2..]).map_err(Failure::Install),
        Some("run") => {
            let args = parsed!(cli::RunArgs::parse_argv(&argv[1..]), &argv);
            host_setup();
            exec::run::main(args).map_err(Failure::Run)
        }
        // `check --gateway` takes serve's flags and env, so it is parsed by its own module.
        Some("check") if argv[2..].iter().any(|a| a == "--gateway") => {
            host_setup();
            gateway::doctor::main(&argv[1..]).map_err(Failure::Doctor)
        }
        Some("check") => {
            let args = parsed!(cli::CheckArgs::parse_argv(&argv[1..]), &argv);
            host_setup();
            check::main(args).map_err(Failure::Check)
        }
        Some("install") => install::main(&argv[1..]).map_err(Failure::Install),
        Some("certs") => certs::main(&argv[1..]).map_err(Failure::Certs),
        Some("serve") => {
            host_setup();
            serve(&argv[1..])
        }
        Some("completions") => manual::completions(&parsed!(
            cli::CompletionsArgs::try_parse_from(&argv[1..]),
            &argv
        ))
        .map_err(Failure::Manual),
        Some("man") => manual::man(&parsed!(cli::ManArgs::try_parse_from(&argv[1..]), &argv))
            .map_err(Failure::Manual),
        // Hidden: what the `sftp` subsystem runs, inside the sandbox (gateway/ssh/sftp.rs).
        Some(gateway::ssh::sftp::MODE) => {
            host_setup();
            return gateway::ssh::sftp::serve_stdio();
        }
        Some("help") => help(argv.get(2).map(|a| a.to_string_lossy().into_owned())),
        Some("-h" | "--help") => help(None),
        Some("-V" | "--version") => {
            println!("openshell-sandbox {}", cli::VERSION);
            Ok(ExitCode::SUCCESS)
        }
        // Nothing for the supervisor to do: a person trying the binary.
        None if !serve_configured() => {
            eprintln!("{}", cli::SHORT_USAGE);
            Ok(ExitCode::from(Exit::Ours.code()))
        }
        None => {
            host_setup();
            serve(&argv[..])
        }
        Some(w) if w.starts_with('-') => {
            host_setup();
            serve(&argv[..])
        }
        // OpenShell's own supervisor subcommands: the supervisor says what it makes of them.
        Some("validate-workspace" | "debug-rpc") => {
            host_setup();
            serve(&argv[..])
        }
        // With a gateway, OpenShell's meaning: the rest of argv is the main process's command.
        Some(_) if gateway_configured() => {
            host_setup();
            serve(&argv[..])
        }
        Some(w) => Err(unknown_subcommand(w)),
    };
    match result {
        Ok(code) => code,
        Err(failure) => {
            let code = failure.exit().code();
            let text = render(&anyhow::Error::new(failure));
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

/// Whether a bare `openshell-sandbox` is the supervisor: a gateway, or a main process given
/// by the environment (which serve refuses without a gateway, suggesting `run`, unless
/// `--no-gateway`).
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
fn unknown_subcommand(word: &str) -> Failure {
    let hint = match cli::nearest_subcommand(word) {
        Some(s) => format!("did you mean `{s}`?"),
        None => format!("the subcommands are {}", cli::Command::WORDS.join(", ")),
    };
    Failure::Run(exec::RunError::Usage(format!(
        "unknown subcommand `{word}`: {hint} (see `openshell-sandbox --help`; with \
         OPENSHELL_ENDPOINT set, a first word that is no subcommand is the main process's command)"
    )))
}

/// `openshell-sandbox help [SUB]` and `openshell-sandbox --help`.
fn help(sub: Option<String>) -> Result<ExitCode, Failure> {
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
        Some("serve") => serve(&help_of("serve")),
        Some("install") => install::main(&help_of("install")).map_err(Failure::Install),
        Some("certs") => certs::main(&help_of("certs")).map_err(Failure::Certs),
        Some("copy-self") => install::copy_self_main(&["--help".into()]).map_err(Failure::Install),
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

/// What a subcommand that builds sandboxes needs from the process first; only those call it
/// (never `help`, `install`, `certs`, `completions`, `man`, `--version` or a usage error).
///
/// A supervisor that is not root enters a user namespace of its own, which will own the
/// sandbox view (sandbox/namespaces.rs). unshare(CLONE_NEWUSER) needs a single-threaded
/// process, so this comes before anything starts a thread (argument parsing starts none).
/// A root supervisor in a pod finds /sys/fs/cgroup read-only (containerd mounts it so); it
/// works through a private read-write copy (sandbox/cgroup_remount.rs).
fn host_setup() {
    openshell_sandbox::sandbox::namespaces::enter_user_ns();
    openshell_sandbox::sandbox::cgroup_remount::make_writable();
}

fn serve(argv: &[OsString]) -> Result<ExitCode, Failure> {
    gateway::main(argv).map_err(|e| Failure::Serve(Box::new(e)))
}

/// Every subcommand's failure, by its own typed error. `anyhow` appears only for rendering the
/// chain below.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error(transparent)]
    Run(exec::RunError),
    #[error(transparent)]
    Check(check::CheckError),
    #[error(transparent)]
    Doctor(gateway::doctor::DoctorError),
    #[error(transparent)]
    Serve(Box<gateway::ServeError>),
    #[error(transparent)]
    Install(install::InstallError),
    #[error(transparent)]
    Certs(certs::CertsError),
    #[error(transparent)]
    Manual(manual::ManualError),
}

impl Failure {
    /// Each subcommand's error to its row of the one table (`openshell_sandbox::exit`,
    /// README.md's "Exit codes"): not found (127) and not executable (126) as a launcher says
    /// them, ours (125) for a usage error of any subcommand or when the sandbox itself failed
    /// or refused, failed (1) for the rest. A usage error that clap reports itself exits 125
    /// through `cli::parsed`, before any of this runs.
    fn exit(&self) -> Exit {
        match self {
            Failure::Run(e) => e.exit(),
            Failure::Check(e) => e.exit(),
            Failure::Serve(e) => e.exit(),
            Failure::Doctor(_) | Failure::Install(_) | Failure::Certs(_) | Failure::Manual(_) => {
                Exit::Failed
            }
        }
    }
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
