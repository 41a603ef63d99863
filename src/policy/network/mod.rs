//! OpenShell's `network_policies`, compiled: validated once when a policy is loaded, then read
//! by the egress proxy's decision for every connection (`crate::egress::decide`). Plain data
//! and pure functions; nothing here touches the system.
//!
//! [`NetworkRules::compile`] takes the model of `policy::openshell` (YAML or proto) and refuses,
//! naming the key, everything OpenShell refuses at load (host wildcards that match too much,
//! `port` with `ports`, contradictory L7 keys, `protocol: sql` with `enforcement: enforce`)
//! plus what this supervisor cannot enforce as written (`allowed_ips` overlapping the
//! always-blocked ranges, `protocol: tcp`, glob syntax other than `*`, `**`, `?`). What
//! OpenShell only warns about comes back as [`NetworkWarning`]s. `docs/egress.md` lists every
//! rule.

mod glob;
mod local;
mod rules;
mod validate;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

pub use glob::{Glob, GlobError};
pub use ipnet::IpNet;
pub use local::{always_blocked_nets, is_always_blocked, unreachable_host};
pub use rules::{
    AccessPreset, Binary, BinaryPattern, Endpoint, Enforcement, HostPattern, NetworkPolicyError,
    NetworkRules, NetworkWarning, Protocol, Rule, TlsMode,
};

use super::openshell::NetworkPolicyRule;

impl NetworkRules {
    /// Validate and compile OpenShell's `network_policies`.
    pub fn compile(
        rules: &BTreeMap<String, NetworkPolicyRule>,
    ) -> Result<NetworkRules, NetworkPolicyError> {
        validate::compile(rules)
    }
}
