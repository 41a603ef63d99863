//! Command-line definitions.
//!
//! Every flag that OpenShell's own supervisor reads from an environment variable reads the same
//! variable here (docs/gateway.md), so the pod command line and env
//! that the OpenShell Kubernetes driver builds work unchanged.
//!
//! Dispatch is by the first word (see `main.rs`): `run`, `check`, `serve`, `install`,
//! `copy-self`, `certs`, `completions`, `man`, `help`. A flag first is the supervisor (`serve`),
//! because that is how a sandbox pod starts us: `openshell-sandbox --workdir /sandbox`; so is no
//! argument at all once a gateway or a main process is configured (else it prints a short
//! usage). Any other first word is OpenShell's main-process command when a gateway is
//! configured, and a typo otherwise.

mod check;
mod common;
mod manual;
mod policy;
mod run;
mod top;
mod values;

pub use self::check::CheckArgs;
pub use self::common::{DEFAULT_UID_RANGE, USAGE_EXIT, VERSION, parsed};
pub use self::manual::{CompletionsArgs, ManArgs};
pub use self::policy::{NetworkArg, PolicyArgs};
pub use self::run::{OnOutputLimit, RunArgs};
pub use self::top::{Command, SHORT_USAGE, TopArgs, nearest_subcommand};
pub use self::values::UidRange;
pub use crate::logging::LogFormat;

#[cfg(test)]
mod tests;
