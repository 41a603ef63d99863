//! Every row of the report, decided in one place: the decisions a policy comes to on this
//! kernel, as plain data. For each layer, its row (layer, status, reason) and its fail-closed
//! refusal: the supervisor's user namespace and the view's namespaces (`view.rs`), Landlock,
//! seccomp and identity (`layers.rs`), the ownership of the writes (`ownership.rs`), the
//! cgroup, memory, cpu and rlimits (`limits.rs`); and which socket rules the seccomp filter
//! and Landlock get for each network mode (`network.rs`), and the rules as installed in words
//! ([`Installed`]). `prepare` builds the objects the rows name and takes the rows from here,
//! once; `run` installs them, `check` reports their rows and `check --explain` prints
//! [`Installed`]: nobody derives them again.
//!
//! Everything here is a pure function of the policy and what the kernel was found to offer
//! (the probe), so the fail-closed matrix is tested without root (decide_tests.rs).

mod layers;
mod limits;
mod network;
mod ownership;
mod row;
mod view;

use std::path::PathBuf;

use serde::Serialize;

use super::seccomp;
use crate::policy::{NetworkMode, PathAccess};

pub use layers::{IdentityProbe, identity_row, landlock_rows, seccomp_row};
pub use limits::{CgroupFacts, LimitsProbe, limits};
pub use network::{Network, network};
pub use ownership::ownership_row;
pub use view::{KINDS, RootFacts, ViewFacts, no_view_rows, user_ns_row, view_rows};

/// One Landlock rule as installed, in words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct InstalledRule {
    pub path: PathBuf,
    pub access: String,
}

/// The rules a prepared sandbox installs in every command, in words: what `check --explain`
/// prints, and what a run installs (built from the same values the ruleset and the BPF
/// program were built from).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Installed {
    /// Empty when no Landlock ruleset is installed.
    pub landlock: Vec<InstalledRule>,
    /// Empty when no seccomp filter is installed.
    pub seccomp: Vec<String>,
}

/// What the installed ruleset and filter hold. `fs_rules`: the path rules as the ruleset has
/// them; `landlock`: `(network restricted, scoped)` of the ruleset, `None` when there is none;
/// `seccomp`: whether a filter is installed, built for `socket_rules`.
pub fn installed(
    fs_rules: &[(PathBuf, PathAccess, bool)],
    landlock: Option<(bool, bool)>,
    socket_rules: NetworkMode,
    seccomp: bool,
) -> Installed {
    let mut ll = Vec::new();
    if let Some((network_restricted, scoped)) = landlock {
        ll.extend(fs_rules.iter().map(|(path, access, is_dir)| InstalledRule {
            path: path.clone(),
            access: access_words(*access, *is_dir).into(),
        }));
        if network_restricted {
            ll.push(InstalledRule {
                path: "(network)".into(),
                access: "TCP bind and connect denied (ABI >= 4)".into(),
            });
        }
        if scoped {
            ll.push(InstalledRule {
                path: "(scope)".into(),
                access: "signals and abstract unix sockets only within the sandbox (ABI >= 6)"
                    .into(),
            });
        }
    }
    Installed {
        landlock: ll,
        seccomp: if seccomp {
            seccomp::describe(socket_rules)
        } else {
            Vec::new()
        },
    }
}

/// What a Landlock rule of this kind allows (landlock.rs maps the same kinds).
pub fn access_words(access: PathAccess, is_dir: bool) -> &'static str {
    match (access, is_dir) {
        (PathAccess::ReadExec, true) => "read, list, execute",
        (PathAccess::ReadExec, false) => "read, execute",
        (PathAccess::ReadWrite, true) => {
            "read, list, execute, write, create, remove, rename, truncate (every right of the ABI)"
        }
        (PathAccess::ReadWrite, false) => "read, execute, write, truncate",
        (PathAccess::Device, _) => "read, write, truncate, ioctl (no create or remove)",
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;

#[cfg(test)]
mod rows_tests;
