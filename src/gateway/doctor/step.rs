//! What each step of the walk reports: its name, its outcome, and for a failure the cause and
//! its fix. The walk (`mod.rs`) and the helpers that judge a step (`causes`, `local`) all build
//! these.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Failed,
    /// Not run, because an earlier step on the path failed (or it does not apply).
    Skipped,
}

/// One step's outcome. `kind` names the cause in a stable, machine-readable word.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub step: &'static str,
    pub status: Status,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Step {
    pub(super) fn ok(step: &'static str, detail: impl Into<String>) -> Step {
        Step {
            step,
            status: Status::Ok,
            detail: detail.into(),
            kind: None,
            fix: None,
        }
    }

    pub(super) fn failed(
        step: &'static str,
        kind: &'static str,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Step {
        Step {
            step,
            status: Status::Failed,
            detail: detail.into(),
            kind: Some(kind),
            fix: Some(fix.into()),
        }
    }

    pub(super) fn skipped(step: &'static str, detail: impl Into<String>) -> Step {
        Step {
            step,
            status: Status::Skipped,
            detail: detail.into(),
            kind: None,
            fix: None,
        }
    }
}
