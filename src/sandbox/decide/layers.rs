//! The rows of the Landlock, seccomp and identity layers, from what the kernel offers.

use super::super::identity;
use super::super::landlock::Support;
use super::super::layer::{Enforcement, LayerStatus, PrepareError};
use super::network::Network;
use super::row::{degrade, row};
use crate::policy::{Identity, NetworkMode};

/// The Landlock rows (`landlock-fs`, then `landlock-net` and `landlock-scope` when there is a
/// ruleset): `support` is what the probe found (or why there is no Landlock), `path_rules` how
/// many path rules the ruleset holds. The ruleset restricts TCP when `--network none` is not
/// kept by a private network namespace and the ABI can (>= 4); it scopes signals and abstract
/// sockets when the ABI can (>= 6): landlock.rs builds it from the same facts.
pub fn landlock_rows(
    allow_degraded: bool,
    support: &Result<Support, String>,
    path_rules: usize,
    network: Network,
    layers: &mut Vec<LayerStatus>,
) -> Result<(), PrepareError> {
    let support = match support {
        Ok(s) if s.filesystem => *s,
        Ok(_) => {
            return degrade(
                allow_degraded,
                "landlock-fs",
                "Landlock reports ABI 0".into(),
                layers,
            );
        }
        Err(e) => return degrade(allow_degraded, "landlock-fs", e.clone(), layers),
    };
    row(
        layers,
        "landlock-fs",
        Enforcement::Enforced,
        format!("ABI {}, {path_rules} path rules", support.abi),
    );
    let network_restricted = network.socket_rules == NetworkMode::None && support.network;
    match (network.socket_rules, network_restricted) {
        _ if network.loopback_only => row(
            layers,
            "landlock-net",
            Enforcement::NotRequested,
            "--network none in a private network namespace with only lo: loopback bind and connect allowed, any other connect is ENETUNREACH".into(),
        ),
        (NetworkMode::None, true) => row(
            layers,
            "landlock-net",
            Enforcement::Enforced,
            "TCP bind and connect denied".into(),
        ),
        (NetworkMode::None, false) => degrade(
            allow_degraded,
            "landlock-net",
            format!("Landlock ABI {} < 4 cannot restrict TCP", support.abi),
            layers,
        )?,
        (NetworkMode::All, _) => row(
            layers,
            "landlock-net",
            Enforcement::NotRequested,
            "--network all".into(),
        ),
    }
    if support.scopes {
        row(
            layers,
            "landlock-scope",
            Enforcement::Enforced,
            "signals and abstract unix sockets scoped to the sandbox".into(),
        );
    } else {
        degrade(
            allow_degraded,
            "landlock-scope",
            format!(
                "Landlock ABI {} < 6 cannot scope signals and abstract sockets",
                support.abi
            ),
            layers,
        )?;
    }
    Ok(())
}

/// The seccomp row: `instructions`, the length of the program built, `None` when the kernel
/// cannot install seccomp filters.
pub fn seccomp_row(
    allow_degraded: bool,
    instructions: Option<usize>,
    layers: &mut Vec<LayerStatus>,
) -> Result<(), PrepareError> {
    match instructions {
        Some(n) => {
            row(
                layers,
                "seccomp",
                Enforcement::Enforced,
                format!("{n} BPF instructions"),
            );
            Ok(())
        }
        None => degrade(
            allow_degraded,
            "seccomp",
            "the kernel cannot install seccomp filters".into(),
            layers,
        ),
    }
}

/// What the identity row is decided on.
#[derive(Debug, Clone)]
pub struct IdentityProbe {
    /// The supervisor's effective uid.
    pub euid: u32,
    /// The supplementary groups the supervisor holds (asked only when it is not root: only
    /// then does the child keep them).
    pub groups: Vec<(libc::gid_t, Option<String>)>,
}

/// The identity row: the switch to `target` as root, or what a supervisor that is not root
/// leaves the child.
pub fn identity_row(
    allow_degraded: bool,
    target: Option<Identity>,
    probe: &IdentityProbe,
    layers: &mut Vec<LayerStatus>,
) -> Result<(), PrepareError> {
    match (probe.euid, target) {
        (0, Some(id)) => row(
            layers,
            "identity",
            Enforcement::Enforced,
            format!(
                "uid {} gid {}, no supplementary groups, every capability set empty, no_new_privs",
                id.uid, id.gid
            ),
        ),
        (0, None) => degrade(
            allow_degraded,
            "identity",
            "running as root with no target uid".into(),
            layers,
        )?,
        (uid, Some(id)) if id.uid != uid => degrade(
            allow_degraded,
            "identity",
            format!("not root (uid {uid}): cannot switch to uid {}", id.uid),
            layers,
        )?,
        // Not root: setgroups needs CAP_SETGID, so the child inherits every supplementary
        // group we hold. Pathname unix sockets are not checked by Landlock ABI 7, so a member
        // of e.g. `docker` reaches /var/run/docker.sock: that is not "enforced".
        (uid, _) if probe.groups.is_empty() => row(
            layers,
            "identity",
            Enforcement::Enforced,
            format!(
                "not root: child keeps uid {uid} (files of this uid are guarded by Landlock only), no supplementary groups; capabilities cleared, no_new_privs"
            ),
        ),
        (uid, _) => degrade(
            allow_degraded,
            "identity",
            format!(
                "not root (uid {uid}): the child would keep the supplementary groups {}, which only root can drop",
                identity::describe_groups(&probe.groups)
            ),
            layers,
        )?,
    }
    Ok(())
}
