//! What each step of the walk reports: its name, its outcome, and for a failure the cause and
//! its fix; and the report of the whole walk. The walk (`walk.rs`) and the helpers that judge a
//! step (`causes`, `local`) build these; `mod.rs` prints them.

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

#[derive(Debug, Serialize)]
pub struct Report {
    pub ok: bool,
    /// The first failed step, if any.
    pub first_failure: Option<&'static str>,
    pub steps: Vec<Step>,
}

/// One human line: `step      ok: detail` or `step      FAILED: detail; fix: ...`.
pub fn line(s: &Step) -> String {
    match s.status {
        Status::Ok => format!("{:<13} ok: {}", s.step, s.detail),
        Status::Skipped => format!("{:<13} skipped: {}", s.step, s.detail),
        Status::Failed => format!(
            "{:<13} FAILED: {} [{}]; fix: {}",
            s.step,
            s.detail,
            s.kind.unwrap_or("failed"),
            s.fix.as_deref().unwrap_or("")
        ),
    }
}
