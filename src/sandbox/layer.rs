//! What every layer's row is made of ([`Enforcement`], [`LayerStatus`]), and the error that
//! refuses a sandbox ([`PrepareError`]): read by the decisions, `prepare`, `check` and the
//! report.

use super::{landlock, namespaces, seccomp};

/// Whether one layer is fully in force. Spelt as [`Enforcement::as_str`] everywhere: the
/// report JSON, `check`, the log and the docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Enforcement {
    /// Exactly what the policy asked for.
    Enforced,
    /// Weaker than asked; only allowed with `--allow-degraded`.
    Degraded,
    /// Not requested by the policy (e.g. Landlock TCP rules with `--network all`).
    NotRequested,
}

impl Enforcement {
    /// `enforced`, `degraded` or `not_requested`, as the report JSON has it.
    pub fn as_str(self) -> &'static str {
        match self {
            Enforcement::Enforced => "enforced",
            Enforcement::Degraded => "degraded",
            Enforcement::NotRequested => "not_requested",
        }
    }
}

/// One row of the report: a layer and what was enforced.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LayerStatus {
    pub layer: &'static str,
    pub status: Enforcement,
    pub detail: String,
}

#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("layer `{layer}` cannot be enforced: {reason} (pass --allow-degraded to run anyway)")]
    NotEnforceable { layer: &'static str, reason: String },
    #[error("preparing the Landlock ruleset: {0}")]
    Landlock(#[from] landlock::LandlockError),
    #[error("compiling the seccomp filter: {0}")]
    Seccomp(#[from] seccomp::SeccompError),
    #[error("expanding the filesystem rules: {0}")]
    FsRules(std::io::Error),
    #[error("building the sandbox view: {0}")]
    View(#[from] namespaces::ViewError),
}
