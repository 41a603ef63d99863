//! The network rules of a run: which socket rules seccomp and Landlock get per network mode.

use crate::policy::NetworkMode;

/// The network rules of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    /// The socket families seccomp allows and whether Landlock restricts TCP, spelt as the
    /// network mode whose rules they are.
    pub socket_rules: NetworkMode,
    /// `--network none` kept by a private network namespace that holds only `lo`.
    pub loopback_only: bool,
}

/// With `--network none` and a private network namespace (only `lo`), nothing can leave the
/// namespace: IP sockets, loopback bind and connect are allowed (so an exec can run a server,
/// and the next exec of the sandbox reach it), any other connect is ENETUNREACH. The socket
/// rules are then those of `--network all` (AF_UNIX, AF_INET, AF_INET6 and route netlink,
/// which sees only the private namespace). Without that namespace, `--network none` keeps its
/// AF_UNIX-only filter and Landlock's TCP denial.
pub fn network(mode: NetworkMode, private_net: bool) -> Network {
    let loopback_only = mode == NetworkMode::None && private_net;
    Network {
        socket_rules: if loopback_only {
            NetworkMode::All
        } else {
            mode
        },
        loopback_only,
    }
}
