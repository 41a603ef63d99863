//! Egress by policy: OpenShell's `network_policies` enforced per sandbox by an HTTP proxy
//! whose listener lives in the sandbox's own network namespace (`docs/egress.md`).
//!
//! The sandbox's namespace has only `lo`; the proxy's address, 10.200.0.1:3128, is put on that
//! `lo` and the listener bound there ([`netns::open_in`]); the proxy accepts there and dials
//! from the supervisor's own namespace. Nothing else leaves the sandbox.
//!
//! Wiring it into a sandbox:
//! ```text
//! let socks  = egress::netns::open_in(view_netns_fd, egress::netns::PROXY_ADDR)?;
//! let policy = egress::PolicyHandle::new(NetworkRules::compile(&file.network_policies)?);
//! let ident  = Arc::new(egress::procfs::ProcIdentity::new(view_netns_fd, socks.diag)?);
//! let dns    = Arc::new(egress::SandboxResolver::new(Some(view_hosts_path), true));
//! let proxy  = egress::Proxy::start(socks.listener, policy.clone(), ident, dns,
//!                                   Arc::new(egress::LogSink), egress::ProxyConfig::default())?;
//! // children: egress::child_env(egress::netns::PROXY_ADDR)
//! // a new revision: policy.publish(rules) / policy.quarantine(version, &error)
//! ```
//!
//! Layers, lowest first: `policy::network` (the compiled rules, no syscalls) < [`addr`],
//! [`request`], [`response`], [`revision`], [`event`] (pure) < [`decide`] < [`identity`],
//! [`sockdiag`], [`freeze`], [`holders`], [`loaded`], [`procfs`], `proctext`, [`resolve`], [`netns`] (the
//! system) < [`relay`], [`forward`] < [`proxy`].
//! Nothing here imports `gateway`, `exec` or `sandbox`.

pub mod addr;
pub mod credentials;
pub mod decide;
pub mod event;
pub mod forward;
pub mod freeze;
pub mod holders;
pub mod identity;
pub mod l7;
pub mod loaded;
pub mod netns;
pub mod prefixed;
pub mod procfs;
mod proctext;
pub mod proxy;
pub mod relay;
pub mod request;
pub mod resolve;
pub mod response;
pub mod revision;
pub mod secret_mem;
pub mod sockdiag;
pub mod tls;

#[cfg(test)]
mod decide_tests;
#[cfg(test)]
mod request_tests;

pub use credentials::{Binding, CredentialStore, Credentials};
pub use decide::{Allow, Decision, Deny, Mode, decide};
pub use event::{Counted, Counters, Counts, EventSink, LogSink, NetEvent, Outcome, Via};
pub use identity::{Caller, ExecKey, FixedCaller, Identify, IdentityError};
pub use l7::{Interceptor, L7Decision, L7Event};
pub use proxy::{Proxy, ProxyConfig, ProxyHandle};
pub use relay::{End, ForwardCheck, Guard, InspectedTunnel, Inspector, Refusal};
pub use resolve::{Resolve, ResolveError, ResolveFuture, SandboxResolver};
pub use revision::{PolicyHandle, PolicyState, Revision};

/// OpenShell's proxy variables for every child: the proxy URL in `ALL_PROXY`, `HTTP_PROXY`,
/// `HTTPS_PROXY`, their lower-case forms and `grpc_proxy`; `NO_PROXY` (both cases) for the
/// sandbox's own loopback; `NODE_USE_ENV_PROXY=1`, without which Node's built-in `fetch`
/// ignores the others (Node 22.21 and 24 or later honour it; older Node ignores the proxy
/// altogether and gets ENETUNREACH).
pub fn child_env(proxy: std::net::SocketAddrV4) -> Vec<(&'static str, String)> {
    let url = format!("http://{proxy}");
    let mut v: Vec<(&'static str, String)> = [
        "ALL_PROXY",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "grpc_proxy",
    ]
    .into_iter()
    .map(|k| (k, url.clone()))
    .collect();
    for k in ["NO_PROXY", "no_proxy"] {
        v.push((k, "127.0.0.1,localhost,::1".to_string()));
    }
    v.push(("NODE_USE_ENV_PROXY", "1".to_string()));
    v
}
