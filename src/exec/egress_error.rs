//! [`EgressError`]: why a run's egress could not be set up, apart from the proxy's wiring
//! (`egress.rs`), so that [`RunError`](super::RunError) can wrap it without importing that.

use crate::policy::network::NetworkPolicyError;

/// Why the sandbox's egress could not be set up. Each names what failed.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("--allow-net {arg}: {why}")]
    AllowNet { arg: String, why: String },
    #[error("{0}")]
    Rules(NetworkPolicyError),
    #[error("--policy {}: {source}", path.display())]
    RulesInFile {
        path: std::path::PathBuf,
        source: NetworkPolicyError,
    },
    #[error(
        "the policy has network rules, but the sandbox has no network namespace of its own to put the proxy in (the network layer is degraded); they cannot be enforced"
    )]
    NoNamespace,
    #[error(
        "--allow-net and --network all cannot be combined: with the host's network there is no proxy to keep the rule"
    )]
    NetworkAll,
    #[error("starting the egress proxy in the sandbox's network namespace: {0}")]
    Listen(#[from] crate::egress::netns::NetnsError),
    #[error(transparent)]
    Credential(#[from] super::credential_flags::CredentialFlagError),
    #[error(
        "--credential needs network rules to bind to (--allow-net or the policy's network_policies)"
    )]
    CredentialWithoutRules,
    #[error("starting the egress proxy: {what}: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
}
