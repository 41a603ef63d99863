//! The flags of `check --gateway`: its own, and every flag and env var `serve` reads.

use clap::Parser;

use crate::gateway::config::ServeArgs;

/// `openshell-sandbox check --gateway [--json] [SERVE FLAGS...]`
#[derive(Debug, Parser)]
#[command(
    name = "openshell-sandbox check --gateway",
    about = "Walk the dial-back path to the gateway with the pod's env and flags, and name the first failing step"
)]
pub struct DoctorArgs {
    /// Check the path to the gateway (this mode).
    #[arg(long)]
    pub gateway: bool,

    /// Print the steps as JSON.
    #[arg(long)]
    pub json: bool,

    /// Seconds each network step may take.
    #[arg(long = "step-timeout", value_name = "SECS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=300))]
    pub step_timeout: u64,

    #[command(flatten)]
    pub serve: ServeArgs,
}
