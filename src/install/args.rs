//! The flags of `install`, and the usage of `copy-self` (whose one argument is parsed by hand:
//! OpenShell's contract matches the raw argv).

use std::path::PathBuf;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "openshell-sandbox install",
    bin_name = "openshell-sandbox install",
    about = "Copy this binary atomically into a hostPath directory (the node installer)",
    version = crate::cli::VERSION
)]
pub(super) struct InstallArgs {
    /// Directory to install into; the binary lands at DEST/openshell-sandbox.
    #[arg(long, value_name = "DIR")]
    pub(super) dest: PathBuf,
    /// Create DEST and its missing parents (mode 0755).
    #[arg(long)]
    pub(super) create_parents: bool,
    /// After installing, stay running until SIGTERM (a DaemonSet main container; PID 1 safe).
    #[arg(long, conflicts_with = "verify")]
    pub(super) wait: bool,
    /// Change nothing; exit 0 only if DEST holds exactly this binary and a matching marker.
    #[arg(long)]
    pub(super) verify: bool,
}

pub(super) const COPY_SELF_USAGE: &str = "usage: openshell-sandbox copy-self DEST\n\
    Copies this executable to DEST (or DEST/openshell-sandbox when DEST is a directory),\n\
    creating parent directories, mode 0755.";
