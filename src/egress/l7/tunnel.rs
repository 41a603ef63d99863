//! What one inspected tunnel's requests share: the tunnel's facts, and what a request leaves
//! behind for the relay (an upgrade it won, or why it closed the tunnel).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::upgrade::OnUpgrade;

use super::super::credentials::{self, CredentialStore};
use super::super::event::{EventSink, L7Decision, L7Event};
use super::super::identity::Caller;
use super::super::request::HostPort;
use super::super::revision::Revision;
use super::rules::CompiledRules;
use super::websocket;

/// What one inspected tunnel's requests are checked against.
pub struct Tunnel {
    pub dest: HostPort,
    /// Inside TLS: the authority's default port is 443, else 80.
    pub tls: bool,
    pub caller: Caller,
    pub revision: Arc<Revision>,
    /// The revision's compiled L7 rules, when the connection was admitted under an L7
    /// endpoint (`None`: an L4 endpoint whose requests are only parsed and logged).
    pub compiled: Option<Arc<CompiledRules>>,
    pub credentials: CredentialStore,
    pub events: Arc<dyn EventSink>,
    /// A request head must arrive within this of its first byte.
    pub head_timeout: Duration,
    /// The tunnel closes after this without a byte either way (an upgraded one too).
    pub idle_timeout: Option<Duration>,
    /// The proxy's WebSocket limits.
    pub websocket: Arc<websocket::Limits>,
}

impl Tunnel {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn emit(
        &self,
        decision: L7Decision,
        method: &str,
        rule: &str,
        path: &str,
        reason: Option<String>,
        generation: u64,
        injected: bool,
    ) {
        self.events.emit_l7(&L7Event {
            decision,
            method: method.to_string(),
            dest: self.dest.display(),
            path: credentials::redact(path),
            rule: rule.to_string(),
            reason,
            caller: self.caller.clone(),
            generation,
            credentials_injected: injected,
        });
    }
}

/// An upgrade a request won: both sides' hand-overs, and for a `websocket` endpoint what its
/// messages are checked against.
pub(super) struct Upgrade {
    pub client: OnUpgrade,
    pub upstream: OnUpgrade,
    pub websocket: Option<websocket::Context>,
}

/// Where the service leaves an upgrade for [`serve`] to relay.
pub(super) type UpgradeSlot = Arc<Mutex<Option<Upgrade>>>;

/// Why a request ended its tunnel without a response.
#[derive(Debug, thiserror::Error)]
pub(super) enum Closed {
    #[error("{0}")]
    Path(super::path::PathError),
    #[error("policy changed")]
    Stale,
}
