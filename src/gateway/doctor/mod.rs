//! `openshell-sandbox check --gateway`: walk the supervisor's dial-back path one step at a time
//! and name the first step that fails, with its fix.
//!
//! It reads exactly what `serve` reads (the same `ServeArgs`, so every flag and env var of the
//! pod), and goes: configuration and endpoint, DNS, TCP, TLS (files, handshake, and the
//! gateway's verdict on our client certificate), the token (source, exchange, claims), `Health`,
//! then `GetSandboxConfig` with the bearer. The main process the pod would start is checked on
//! the side, because a main process that ends at once ends the sandbox whatever the gateway
//! does.
//!
//! It never calls ConnectSupervisor: the gateway lets one session live per sandbox, so a second
//! hello would replace the running supervisor's session. Everything it
//! calls is read-only; the service-account exchange only mints a token, as every supervisor
//! start does. It writes no file and signals no process.

mod args;
mod causes;
mod local;
mod step;
mod walk;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;

pub use self::args::DoctorArgs;
pub use self::step::{Report, Status, Step, line};
pub use self::walk::run;

#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    #[error("starting the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("encoding the report as JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// Entry point; `argv[0]` is `check`.
pub fn main(argv: &[OsString]) -> Result<ExitCode, DoctorError> {
    super::unset_empty_identity_env();
    let args = match crate::cli::parsed(DoctorArgs::try_parse_from(argv), argv) {
        Ok(a) => a,
        Err(code) => return Ok(code),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(DoctorError::Runtime)?;
    let json = args.json;
    let report = rt.block_on(run(args));
    print(&report, json)?;
    Ok(if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::exit::Exit::Failed.code())
    })
}

fn print(report: &Report, json: bool) -> Result<(), DoctorError> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        for s in &report.steps {
            println!("{}", line(s));
        }
        match report.first_failure {
            None => println!("gateway: every step passed"),
            Some(f) => println!("gateway: first failing step: {f}"),
        }
    }
    Ok(())
}
