//! Entry point: pick the subcommand, run it, and turn errors into one readable line and an exit
//! code. This is the only place that formats errors for humans.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;
use openshell_sandbox::{certs, check, cli, exec, gateway, install};

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    // Subcommands are recognised by the first word only. Everything else is the supervisor, as
    // the pod starts it: `openshell-sandbox [--workdir /sandbox] [MAIN COMMAND...]`.
    // `copy-self` is matched on the raw argv before any flag parsing (OpenShell's contract).
    let result = match argv.get(1).and_then(|a| a.to_str()) {
        Some("copy-self") => install::copy_self_main(&argv[2..]),
        Some("run") => exec::run::main(cli::RunArgs::parse_from(&argv[1..])),
        Some("check") => check::main(cli::CheckArgs::parse_from(&argv[1..])),
        Some("install") => install::main(&argv[1..]),
        Some("certs") => certs::main(&argv[1..]),
        Some("serve") => gateway::main(&argv[1..]),
        // Hidden: what the `sftp` subsystem runs, inside the sandbox (gateway/ssh/sftp.rs).
        Some(gateway::ssh::sftp::MODE) => return gateway::ssh::sftp::serve_stdio(),
        _ => gateway::main(&argv[..]),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("openshell-sandbox: error: {}", render(&err));
            ExitCode::from(exit_code_for(&err))
        }
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
