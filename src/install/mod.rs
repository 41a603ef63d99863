//! Copy-to-hostPath: put this binary on the node for sandbox pods to mount read-only.
//!
//! `install --dest DIR` copies the running executable to `DIR/openshell-sandbox` the way
//! Firecracker's jailer copies its binary (see [`dest`]), then records what it installed in
//! `DIR/.openshell-sandbox.version`, written the same way. A rerun with the same binary
//! changes nothing. `--wait` keeps the process up afterwards as a DaemonSet's main container
//! (PID 1: SIGTERM ends it with 0, orphans are reaped), and `--verify` is its readiness check.
//!
//! `copy-self DEST` is OpenShell's init-container contract (v0.0.37+): same safe copy, no
//! marker, parents created, DEST may name a directory.

mod args;
mod copy_self;
mod dest;
mod error;
mod hostpath;
mod self_exe;
mod wait;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};

use args::{COPY_SELF_USAGE, InstallArgs};
pub use error::InstallError;
pub use hostpath::{BINARY_NAME, MARKER_NAME};
use self_exe::SelfExe;

/// `install`'s flags, for completions and man pages.
pub fn command() -> clap::Command {
    InstallArgs::command()
}

/// `copy-self`'s one argument, for completions and man pages (`copy_self_main` parses it by
/// hand: OpenShell's contract matches the raw argv).
pub fn copy_self_command() -> clap::Command {
    clap::Command::new("copy-self")
        .about("OpenShell's init-container contract: copy this binary to DEST")
        .long_about(
            COPY_SELF_USAGE
                .split_once('\n')
                .map(|(_, rest)| rest.trim().to_owned())
                .unwrap_or_default(),
        )
        .arg(
            clap::Arg::new("DEST")
                .required(true)
                .value_hint(clap::ValueHint::AnyPath),
        )
}

/// `openshell-sandbox install ...`; `argv[0]` is `install`.
pub fn main(argv: &[OsString]) -> Result<ExitCode, InstallError> {
    let args = match crate::cli::parsed(InstallArgs::try_parse_from(argv), argv) {
        Ok(a) => a,
        Err(code) => return Ok(code),
    };
    let me = SelfExe::open()?;
    if args.verify {
        hostpath::verify(&args.dest, &me)?;
        println!(
            "{} matches this binary (sha256 {})",
            args.dest.join(BINARY_NAME).display(),
            hex::encode(me.sha256)
        );
        return Ok(ExitCode::SUCCESS);
    }
    let report = hostpath::install(&args.dest, args.create_parents, &me).map_err(|source| {
        InstallError::Install {
            dest: args.dest.clone(),
            source: Box::new(source),
        }
    })?;
    println!("{report}");
    if args.wait {
        return wait::until_terminated();
    }
    Ok(ExitCode::SUCCESS)
}

/// `openshell-sandbox copy-self DEST`; `args` are the words after `copy-self`.
pub fn copy_self_main(args: &[OsString]) -> Result<ExitCode, InstallError> {
    let dest = match args {
        [d] if d != "-h" && d != "--help" && !d.is_empty() => PathBuf::from(d),
        [h] if h == "-h" || h == "--help" => {
            println!("{COPY_SELF_USAGE}");
            return Ok(ExitCode::SUCCESS);
        }
        _ => {
            eprintln!("openshell-sandbox copy-self: expected exactly one DEST\n{COPY_SELF_USAGE}");
            return Ok(ExitCode::from(crate::cli::USAGE_EXIT));
        }
    };
    let me = SelfExe::open()?;
    let target = copy_self::copy_self(&dest, &me).map_err(|source| InstallError::CopySelf {
        dest: dest.clone(),
        source: Box::new(source),
    })?;
    println!(
        "copied to {} (sha256 {})",
        target.display(),
        hex::encode(me.sha256)
    );
    Ok(ExitCode::SUCCESS)
}
