//! [`Inner`]: what one prepared sandbox holds for as long as an exec of it lives; shared by
//! `Sandbox` (mod.rs) and the manager, which keeps it for each exec it started.

use std::sync::Arc;

use super::workdir;
use crate::policy::Policy;
use crate::sandbox::Prepared;

/// The state behind a [`Sandbox`](super::Sandbox).
pub(super) struct Inner {
    pub(super) policy: Policy,
    pub(super) prepared: Prepared,
    /// The claim on the read-write grants, and `run`'s hand-over: given back only once the
    /// last exec, which holds this, is gone.
    pub(super) _held: workdir::Held,
    /// What lives exactly as long as the sandbox (its egress proxy): see [`Sandbox::attach`].
    pub(super) attached: std::sync::Mutex<Vec<Arc<dyn std::any::Any + Send + Sync>>>,
}
