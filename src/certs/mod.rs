//! `certs generate`: the mTLS CA, server and client certificates for the gateway.
//!
//! Two outputs:
//! - `--out-dir DIR`: PEM files laid out like the Secret mounts (`server/`, `client/`,
//!   `client-ca/`), for local use and tests.
//! - `--in-cluster`: Secrets created through the Kubernetes API as the pod's ServiceAccount,
//!   for the chart's pre-install hook Job. The client Secret and the client-CA Secret go into
//!   both the release namespace and the sandbox namespace.
//!
//! Both are idempotent as a set: when everything exists it is kept, when nothing exists all is
//! created, and a partial set is an error that says what exists and what is missing (mixing a
//! new CA with old certificates would break mTLS silently). A failed run removes what it made.

mod args;
mod error;
mod in_cluster;
mod kube;
mod out_dir;
mod pki;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};

use args::{CertsCli, CertsCommand, validate_names};
pub use error::CertsError;
pub use pki::server_names;

/// `certs`' flags, for completions and man pages.
pub fn command() -> clap::Command {
    CertsCli::command()
}

/// `openshell-sandbox certs ...`; `argv[0]` is `certs`.
pub fn main(argv: &[OsString]) -> Result<ExitCode, CertsError> {
    let cli = match crate::cli::parsed(CertsCli::try_parse_from(argv), argv) {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let CertsCommand::Generate(args) = cli.command;
    validate_names(&args)?;
    let sans = server_names(
        &args.service_name,
        &args.namespace,
        &args.cluster_domain,
        &args.extra_sans,
    );
    if let Some(dir) = &args.out_dir {
        let lines = out_dir::generate(dir, &sans, args.validity_days).map_err(|source| {
            CertsError::OutDir {
                dir: dir.clone(),
                source: Box::new(source),
            }
        })?;
        lines.iter().for_each(|l| println!("{l}"));
        return Ok(ExitCode::SUCCESS);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| CertsError::Runtime { source })?;
    let lines = rt
        .block_on(in_cluster::generate(&args, &sans))
        .map_err(|source| CertsError::InCluster {
            source: Box::new(source),
        })?;
    lines.iter().for_each(|l| println!("{l}"));
    Ok(ExitCode::SUCCESS)
}
