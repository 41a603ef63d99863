//! What a live sandbox may change: the gateway refuses, with INVALID_ARGUMENT, a new
//! revision that changes `landlock` or `process`, or that takes a path away from
//! `filesystem`. The network side is free to change. One pure function, so that the
//! supervisor (which refuses such a revision too, whoever sent it) and the test gateway (which
//! must refuse what a real gateway refuses) cannot disagree.

use super::model::{FilesystemPolicy, LandlockPolicy, ProcessPolicy, SandboxPolicy};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LiveChangeError {
    #[error("landlock cannot change on a live sandbox (was {old:?}, now {new:?})")]
    Landlock {
        old: LandlockPolicy,
        new: LandlockPolicy,
    },
    #[error("process cannot change on a live sandbox (was {old:?}, now {new:?})")]
    Process {
        old: ProcessPolicy,
        new: ProcessPolicy,
    },
    #[error("filesystem_policy.{list} may only gain paths on a live sandbox; `{path}` was removed")]
    PathRemoved { list: &'static str, path: String },
    #[error("filesystem_policy.include_workdir cannot be turned off on a live sandbox")]
    WorkdirRemoved,
}

/// `Ok` when `new` may replace `old` on a running sandbox. An absent section equals an empty
/// one (prost cannot tell them apart on every path, and both mean the same to the mapping).
/// A path moving from read_only to read_write is a removal from read_only: the access changes.
pub fn check_live_change(old: &SandboxPolicy, new: &SandboxPolicy) -> Result<(), LiveChangeError> {
    let (ol, nl) = (
        old.landlock.clone().unwrap_or_default(),
        new.landlock.clone().unwrap_or_default(),
    );
    if ol != nl {
        return Err(LiveChangeError::Landlock { old: ol, new: nl });
    }
    let (op, np) = (
        old.process.clone().unwrap_or_default(),
        new.process.clone().unwrap_or_default(),
    );
    if op != np {
        return Err(LiveChangeError::Process { old: op, new: np });
    }
    let empty = FilesystemPolicy::default();
    let of = old.filesystem.as_ref().unwrap_or(&empty);
    let nf = new.filesystem.as_ref().unwrap_or(&empty);
    if of.include_workdir && !nf.include_workdir {
        return Err(LiveChangeError::WorkdirRemoved);
    }
    for (list, o, n) in [
        ("read_only", &of.read_only, &nf.read_only),
        ("read_write", &of.read_write, &nf.read_write),
    ] {
        if let Some(path) = o.iter().find(|p| !n.contains(p)) {
            return Err(LiveChangeError::PathRemoved {
                list,
                path: path.clone(),
            });
        }
    }
    Ok(())
}
