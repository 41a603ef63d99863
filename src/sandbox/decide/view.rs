//! The rows of the view's namespaces: the supervisor's user namespace, then one row per kind
//! of the view, from what the view's helper (or the exec's init) reported it made.

use std::path::PathBuf;

use super::super::layer::{Enforcement, LayerStatus, PrepareError};
use super::super::namespaces::{Kind, Outcome, ProcMount, UserNs};
use super::super::step::ChildError;
use super::row::{degrade, row};
use crate::policy::NetworkMode;

/// The kinds of the view, in the rows' order.
pub const KINDS: [Kind; 5] = [Kind::Pid, Kind::Mount, Kind::Ipc, Kind::Uts, Kind::Net];

/// The row of the supervisor's own user namespace (`euid` is the supervisor's); true when a
/// view can be made at all.
pub fn user_ns_row(
    allow_degraded: bool,
    user_ns: &UserNs,
    euid: u32,
    layers: &mut Vec<LayerStatus>,
) -> Result<bool, PrepareError> {
    let layer = Kind::User.layer();
    match user_ns {
        UserNs::Root => {
            row(
                layers,
                layer,
                Enforcement::NotRequested,
                "the supervisor is root: the view is owned by its user namespace".into(),
            );
            Ok(true)
        }
        UserNs::Entered => {
            row(
                layers,
                layer,
                Enforcement::Enforced,
                format!(
                    "not root: the supervisor runs in a user namespace of its own (uid {euid} maps to itself), which owns the view"
                ),
            );
            Ok(true)
        }
        UserNs::Unavailable(e) => {
            degrade(
                allow_degraded,
                layer,
                format!("not root, and no user namespace is allowed here ({e})"),
                layers,
            )?;
            Ok(false)
        }
        UserNs::NotTried => {
            degrade(
                allow_degraded,
                layer,
                "not root, and the supervisor did not enter a user namespace".into(),
                layers,
            )?;
            Ok(false)
        }
    }
}

/// No user namespace to own a view: a degraded row per kind (or an error), but the network
/// namespace `--network all` does not ask for.
pub fn no_view_rows(
    allow_degraded: bool,
    network: NetworkMode,
    layers: &mut Vec<LayerStatus>,
) -> Result<(), PrepareError> {
    for kind in KINDS {
        if kind == Kind::Net && network == NetworkMode::All {
            row(
                layers,
                kind.layer(),
                Enforcement::NotRequested,
                "--network all".into(),
            );
            continue;
        }
        degrade(
            allow_degraded,
            kind.layer(),
            "needs a user namespace (see namespace-user)".into(),
            layers,
        )?;
    }
    Ok(())
}

/// The root of the granted paths only, as made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootFacts {
    pub binds: usize,
    /// The names at its top level.
    pub top_level: Vec<String>,
    /// Entered with chroot (pivot_root refused).
    pub chroot: bool,
}

/// What the view's maker reported, and what the view was to hold: the facts the namespace rows
/// are decided on.
#[derive(Debug, Clone)]
pub struct ViewFacts {
    /// Per kind, indexed by `Kind::index`.
    pub outcomes: [Outcome; 6],
    /// Why the IPC namespace's limits could not be set, when it was made but they were not.
    pub ipc_limits: Option<ChildError>,
    pub proc: ProcMount,
    /// The private tmpfs mounts made, with their sizes in bytes.
    pub tmpfs: Vec<(PathBuf, u64)>,
    /// Of /tmp and /dev/shm, those a grant covers (no tmpfs is planned there).
    pub tmpfs_granted: Vec<&'static str>,
    /// Whether the view's root holds the granted paths only.
    pub root_made: bool,
    /// That root, when it was made.
    pub root: Option<RootFacts>,
    /// Where the failed mount step was, when its step names an entry of the root.
    pub mount_failed_at: Option<String>,
    /// The IPC namespace's limits, in words.
    pub ipc: String,
    pub hostname: String,
}

/// One row per kind of the view, in [`KINDS`]' order; fail closed per kind.
pub fn view_rows(
    allow_degraded: bool,
    facts: &ViewFacts,
    layers: &mut Vec<LayerStatus>,
) -> Result<(), PrepareError> {
    let degrade = |layer, reason, layers: &mut Vec<LayerStatus>| {
        degrade(allow_degraded, layer, reason, layers)
    };
    for kind in KINDS {
        let layer = kind.layer();
        match facts.outcomes[kind.index()] {
            Outcome::Made if kind == Kind::Ipc && facts.ipc_limits.is_some() => {
                let e = facts.ipc_limits.expect("checked");
                degrade(
                    layer,
                    format!(
                        "private SysV IPC and POSIX message queues, but its limits could not be set ({e}): what an exec leaves there (shared memory segments, message queues, semaphores) is bounded only by the kernel's defaults"
                    ),
                    layers,
                )?
            }
            Outcome::Made => row(layers, layer, Enforcement::Enforced, made(kind, facts)),
            Outcome::NotRequested if kind == Kind::Net => row(
                layers,
                layer,
                Enforcement::NotRequested,
                "--network all: the supervisor's network namespace".into(),
            ),
            Outcome::NotRequested => degrade(layer, "not attempted".into(), layers)?,
            Outcome::Failed(e) if kind == Kind::Mount && !facts.root_made => {
                let at = facts
                    .mount_failed_at
                    .as_ref()
                    .map(|p| format!(" (at {p})"))
                    .unwrap_or_default();
                degrade(
                    layer,
                    format!(
                        "{e}{at}: no root of the granted paths only, so paths outside the grants stay visible (pathname unix sockets can be connected to, stat and inotify probe them)"
                    ),
                    layers,
                )?
            }
            Outcome::Failed(e) => degrade(layer, e.to_string(), layers)?,
        }
    }
    Ok(())
}

/// The detail of a kind that was made.
fn made(kind: Kind, facts: &ViewFacts) -> String {
    match kind {
        Kind::Pid => match facts.proc {
            ProcMount::SubsetPid => "a PID namespace per exec, PID 1 is its init; /proc mounted with subset=pid (non-initial user namespace)".to_string(),
            _ => "a PID namespace per exec, PID 1 is its init; a fresh /proc".to_string(),
        },
        Kind::Mount => {
            let tmpfs: Vec<String> = facts
                .tmpfs
                .iter()
                .map(|(p, size)| format!("{} ({} MiB)", p.display(), size >> 20))
                .collect();
            let skipped: Vec<String> = facts
                .tmpfs_granted
                .iter()
                .map(|t| format!("; {t} is itself granted and stays as it is"))
                .collect();
            let root = match &facts.root {
                Some(r) if facts.root_made => format!(
                    "a root of the granted paths only ({} binds; top level {}){}, nothing else exists; ",
                    r.binds,
                    r.top_level.join(" "),
                    if r.chroot {
                        ", entered with chroot (pivot_root is refused here: the old root stays below it in the namespace)"
                    } else {
                        ""
                    }
                ),
                _ => "the policy grants /: the view's root is the supervisor's; ".into(),
            };
            format!(
                "{root}private propagation; private tmpfs mode 1777 on {}{}",
                tmpfs.join(" and "),
                skipped.concat()
            )
        }
        Kind::Ipc => format!("private SysV IPC and POSIX message queues; {}", facts.ipc),
        Kind::Uts => format!("hostname {}", facts.hostname),
        Kind::Net => "a network namespace with only lo, up".to_string(),
        Kind::User => unreachable!("not in KINDS"),
    }
}
