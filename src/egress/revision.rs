//! The policy the proxy decides with, swapped whole.
//!
//! A [`PolicyHandle`] holds the current [`Revision`]: its network rules (or a quarantine) and
//! a generation number. Every connection is decided against the revision current when its
//! request arrives and pins that generation; publishing a revision with different rules, or a
//! quarantine, moves the generation on, and every open connection pinned to an older one is
//! closed at once, as OpenShell closes every tunnel of the previous generation. A new
//! connection is decided against the new rules.

use std::sync::Arc;

use tokio::sync::watch;

use crate::policy::network::NetworkRules;

/// What the proxy decides with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyState {
    Rules(Arc<NetworkRules>),
    /// A candidate revision was invalid and the failure mode is fail-closed: every connection
    /// is denied with this reason.
    Quarantined {
        reason: String,
    },
}

/// One generation of the policy.
#[derive(Debug, Clone)]
pub struct Revision {
    pub generation: u64,
    pub state: PolicyState,
}

/// The shared, swappable policy of one proxy. Cheap to clone.
#[derive(Clone)]
pub struct PolicyHandle {
    tx: Arc<watch::Sender<Arc<Revision>>>,
}

impl PolicyHandle {
    /// Start at generation 1 with `rules`.
    pub fn new(rules: NetworkRules) -> PolicyHandle {
        let rev = Revision {
            generation: 1,
            state: PolicyState::Rules(Arc::new(rules)),
        };
        PolicyHandle {
            tx: Arc::new(watch::channel(Arc::new(rev)).0),
        }
    }

    /// Start quarantined (fail-closed with no valid policy yet).
    pub fn quarantined(reason: String) -> PolicyHandle {
        let h = PolicyHandle::new(NetworkRules::default());
        h.set(PolicyState::Quarantined { reason });
        h
    }

    /// The current revision.
    pub fn current(&self) -> Arc<Revision> {
        self.tx.borrow().clone()
    }

    /// A receiver that sees every later revision; relays wait on it.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Revision>> {
        self.tx.subscribe()
    }

    /// Apply new rules. Returns the generation now current: unchanged when the rules equal the
    /// current ones (a revision that changed only the filesystem part, say), so open tunnels
    /// stay; otherwise one more, and every open connection of older generations closes.
    pub fn publish(&self, rules: NetworkRules) -> u64 {
        self.set(PolicyState::Rules(Arc::new(rules)))
    }

    /// Enter the fail-closed quarantine after an invalid candidate (`version` is its number,
    /// `error` why it was refused): every open connection closes and every new one is denied.
    pub fn quarantine(&self, version: u32, error: &str) -> u64 {
        self.set(PolicyState::Quarantined {
            reason: format!(
                "policy validation failed; fail-closed quarantine is active; candidate version {version} rejected: {error}"
            ),
        })
    }

    fn set(&self, state: PolicyState) -> u64 {
        let mut generation = 0;
        self.tx.send_if_modified(|cur| {
            if cur.state == state {
                generation = cur.generation;
                return false;
            }
            generation = cur.generation + 1;
            *cur = Arc::new(Revision { generation, state });
            true
        });
        generation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_move_only_on_change() {
        let h = PolicyHandle::new(NetworkRules::default());
        assert_eq!(h.current().generation, 1);
        assert_eq!(h.publish(NetworkRules::default()), 1);
        let q = h.quarantine(3, "bad");
        assert_eq!(q, 2);
        match &h.current().state {
            PolicyState::Quarantined { reason } => assert_eq!(
                reason,
                "policy validation failed; fail-closed quarantine is active; candidate version 3 rejected: bad"
            ),
            s => panic!("{s:?}"),
        }
        assert_eq!(h.publish(NetworkRules::default()), 3);
    }
}
