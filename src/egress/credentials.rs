//! Credential placeholders: children hold `openshell:resolve:env:KEY`; the proxy puts the
//! real value in its place only in a request that was admitted, and only when the request
//! goes to an endpoint the credential is bound to. Anything it cannot resolve fails closed:
//! a placeholder never reaches an upstream, and a real value never reaches the child.
//!
//! Forms: `openshell:resolve:env:KEY`, the revision form `openshell:resolve:env:v<rev>_KEY`
//! (this store's revision only) and the stable-handle form
//! `openshell:resolve:env:s<64 hex>_KEY` (this store's handle only). `KEY` is
//! `[A-Za-z0-9_]+`.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use base64::Engine;

use super::secret_mem::{self, SecretBytes};
use crate::policy::network::{Glob, HostPattern, NetworkRules};

/// What every placeholder starts with.
pub const MARKER: &str = "openshell:resolve:env:";

/// Where one credential may go: a host (exact and case-insensitive, or a glob of the policy's
/// host syntax such as `*.example.com`), a port, and optionally a path glob (`/v1/**`; empty:
/// any path), matched against the canonical request path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub host: String,
    pub port: u16,
    pub path: String,
}

impl Binding {
    /// Any path of `host:port`.
    pub fn new(host: impl Into<String>, port: u16) -> Binding {
        Binding {
            host: host.into(),
            port,
            path: String::new(),
        }
    }
}

/// A binding as the store matches it, its globs compiled once.
struct Bound {
    binding: Binding,
    host: Option<Glob>,
    path: Option<Glob>,
}

impl Bound {
    fn new(b: Binding) -> Bound {
        let host = b.host.to_ascii_lowercase();
        let glob = |s: &str, d| (s.contains('*')).then(|| Glob::new(s, d).ok()).flatten();
        Bound {
            host: glob(&host, b'.'),
            path: glob(&b.path, b'/'),
            binding: Binding { host, ..b },
        }
    }

    fn matches(&self, to: &Dest<'_>) -> bool {
        if self.binding.port != to.port {
            return false;
        }
        let host_ok = match &self.host {
            Some(g) => g.matches(to.host),
            None => self.binding.host == to.host,
        };
        let path_ok = match (self.binding.path.as_str(), to.path) {
            ("" | "**" | "/**", _) => true,
            (_, None) => false,
            (p, Some(path)) => match &self.path {
                Some(g) => g.matches(path),
                None => p == path,
            },
        };
        host_ok && path_ok
    }
}

/// Where a request goes, as the bindings are matched: the host (lower-case), the port and the
/// canonical path (`None`: not known, so only bindings without a path match).
#[derive(Debug, Clone, Copy)]
pub struct Dest<'a> {
    pub host: &'a str,
    pub port: u16,
    pub path: Option<&'a str>,
}

struct Secret {
    /// In memory no fork inherits (see [`secret_mem`]).
    value: SecretBytes,
    bound: Vec<Bound>,
    /// This key's own stable handle (64 hex), besides the store's.
    handle: Option<String>,
    /// The provider the value belongs to (the gateway's `credential_identity`): a policy
    /// endpoint's `credential_binding: {provider: NAME}` binds the provider's values.
    identity: String,
}

impl Secret {
    fn value(&self) -> &str {
        // Made from a `&str` in `insert`.
        std::str::from_utf8(self.value.as_bytes()).unwrap_or_default()
    }
}

/// The real values, held by the proxy only. The values are shared (never copied) between a
/// store and the one [`Credentials::with_policy_bindings`] makes from it.
#[derive(Default)]
pub struct Credentials {
    secrets: BTreeMap<String, Arc<Secret>>,
    revision: u64,
    handle: String,
    /// Bindings a policy's endpoints add: (provider, where), the provider being a key or the
    /// identity of the values it binds.
    policy: Arc<Vec<(String, Bound)>>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the values.
        f.debug_struct("Credentials")
            .field("keys", &self.secrets.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// The store the proxy reads, swapped whole when the provider environment or the policy
/// changes: each request reads the store current when it is rewritten, so a refresh applies to
/// the next request of an open tunnel too.
#[derive(Clone, Default)]
pub struct CredentialStore(Arc<RwLock<Arc<Credentials>>>);

impl CredentialStore {
    pub fn new(c: Credentials) -> CredentialStore {
        CredentialStore(Arc::new(RwLock::new(Arc::new(c))))
    }

    pub fn current(&self) -> Arc<Credentials> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn replace(&self, c: Credentials) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(c);
    }
}

impl From<Arc<Credentials>> for CredentialStore {
    fn from(c: Arc<Credentials>) -> CredentialStore {
        CredentialStore(Arc::new(RwLock::new(c)))
    }
}

impl From<Credentials> for CredentialStore {
    fn from(c: Credentials) -> CredentialStore {
        CredentialStore::new(c)
    }
}

/// Why a request's placeholders could not be replaced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    /// 400 `invalid_credential_placeholder`.
    #[error("credential placeholder for '{0}' cannot be resolved")]
    Unresolvable(String),
    /// 403 `credential_endpoint_mismatch`.
    #[error("credential '{key}' is not bound to {dest}")]
    NotBound { key: String, dest: String },
}

fn is_key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Whether `s` holds the placeholder marker anywhere.
pub fn has_marker(s: &[u8]) -> bool {
    s.windows(MARKER.len()).any(|w| w == MARKER.as_bytes())
}

impl Credentials {
    /// An empty store for revision `revision`; `handle` is the stable handle (64 hex).
    pub fn new(revision: u64, handle: &str) -> Credentials {
        Credentials {
            secrets: BTreeMap::new(),
            revision,
            handle: handle.to_ascii_lowercase(),
            policy: Arc::default(),
        }
    }

    /// Add `key` with its real value and the endpoints it may go to. The value moves into
    /// memory no fork inherits, and `value`'s own buffer is zeroed.
    pub fn insert(&mut self, key: &str, mut value: String, bound: Vec<Binding>) {
        let bound = bound.into_iter().map(Bound::new).collect();
        let secret = SecretBytes::new(value.as_bytes());
        secret_mem::wipe_string(&mut value);
        self.secrets.insert(
            key.to_string(),
            Arc::new(Secret {
                value: secret,
                bound,
                handle: None,
                identity: String::new(),
            }),
        );
    }

    /// Give `key` a stable handle of its own (64 hex): its `s<handle>_KEY` form resolves too.
    pub fn set_handle(&mut self, key: &str, handle: &str) {
        if let Some(s) = self.secrets.get_mut(key).and_then(Arc::get_mut)
            && handle.len() == 64
            && handle.bytes().all(|b| b.is_ascii_hexdigit())
        {
            s.handle = Some(handle.to_ascii_lowercase());
        }
    }

    /// Name the provider `key`'s value belongs to (what a policy's `credential_binding`
    /// names).
    pub fn set_identity(&mut self, key: &str, identity: &str) {
        if let Some(s) = self.secrets.get_mut(key).and_then(Arc::get_mut) {
            s.identity = identity.to_string();
        }
    }

    /// This store's values, bound besides to `bindings` (provider, where) from a policy; the
    /// bindings of an earlier call are replaced.
    pub fn with_policy_bindings(&self, bindings: Vec<(String, Binding)>) -> Credentials {
        Credentials {
            secrets: self.secrets.clone(),
            revision: self.revision,
            handle: self.handle.clone(),
            policy: Arc::new(
                bindings
                    .into_iter()
                    .map(|(p, b)| (p, Bound::new(b)))
                    .collect(),
            ),
        }
    }

    /// Every binding of `key`: its own; a value without any (an endpointless provider profile)
    /// goes where the policy's endpoints naming its provider (or the key) say. As in
    /// OpenShell, a profile that names endpoints stays the value's only boundary: a policy
    /// cannot widen it.
    fn bindings_of<'a>(&'a self, key: &'a str, s: &'a Secret) -> impl Iterator<Item = &'a Bound> {
        let endpointless = s.bound.is_empty();
        s.bound.iter().chain(
            self.policy
                .iter()
                .filter(move |(p, _)| {
                    endpointless && (p == key || (!s.identity.is_empty() && *p == s.identity))
                })
                .map(|(_, b)| b),
        )
    }

    /// The keys and where each may go, for `check --explain` and the log: never a value.
    pub fn describe(&self) -> Vec<(String, Vec<Binding>)> {
        self.secrets
            .iter()
            .map(|(k, s)| {
                (
                    k.clone(),
                    self.bindings_of(k, s).map(|b| b.binding.clone()).collect(),
                )
            })
            .collect()
    }

    /// Whether `value` is one of the real values (for tests and leak checks).
    pub fn holds_value(&self, value: &str) -> bool {
        self.secrets.values().any(|s| s.value() == value)
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// What children get instead of the values: `KEY=openshell:resolve:env:KEY`.
    pub fn child_env(&self) -> Vec<(String, String)> {
        self.secrets
            .keys()
            .map(|k| (k.clone(), format!("{MARKER}{k}")))
            .collect()
    }

    /// Whether some credential is bound to `host:port`: such an endpoint must be inspected.
    pub fn is_credentialed(&self, host: &str, port: u16) -> bool {
        let host = host.to_ascii_lowercase();
        self.secrets.iter().any(|(k, s)| {
            self.bindings_of(k, s).any(|b| {
                b.binding.port == port
                    && match &b.host {
                        Some(g) => g.matches(&host),
                        None => b.binding.host == host,
                    }
            })
        })
    }

    /// The key a placeholder body (what follows [`MARKER`]) names, if it is one of this
    /// store's forms.
    fn key_of<'a>(&self, body: &'a str) -> Option<&'a str> {
        if let Some(rest) = body.strip_prefix('v')
            && let Some((rev, key)) = rest.split_once('_')
            && !rev.is_empty()
            && rev.bytes().all(|b| b.is_ascii_digit())
        {
            return (rev.parse::<u64>().ok() == Some(self.revision)).then_some(key);
        }
        if let Some(rest) = body.strip_prefix('s')
            && rest.len() > 65
            && rest.as_bytes()[64] == b'_'
            && rest[..64].bytes().all(|b| b.is_ascii_hexdigit())
        {
            let (handle, key) = (&rest[..64], &rest[65..]);
            let own = self
                .secrets
                .get(key)
                .and_then(|s| s.handle.as_deref())
                .is_some_and(|h| h.eq_ignore_ascii_case(handle));
            let store = !self.handle.is_empty() && handle.eq_ignore_ascii_case(&self.handle);
            return (own || store).then_some(key);
        }
        Some(body)
    }

    /// Replace every placeholder in `s` for a request to `host:port`. `Ok(None)`: there was
    /// none.
    pub fn rewrite(
        &self,
        s: &str,
        host: &str,
        port: u16,
    ) -> Result<Option<String>, CredentialError> {
        let host = host.to_ascii_lowercase();
        self.rewrite_to(
            s,
            &Dest {
                host: &host,
                port,
                path: None,
            },
        )
    }

    /// [`Credentials::rewrite`] for a request whose canonical path is known; `to.host` is
    /// lower-case.
    pub fn rewrite_to(&self, s: &str, to: &Dest<'_>) -> Result<Option<String>, CredentialError> {
        self.rewrite_noting(s, to, &mut Injected::default())
    }

    /// [`Credentials::rewrite_to`], noting in `noted` each value put in and the placeholder
    /// it replaced, so that the response can be searched for them.
    pub fn rewrite_noting(
        &self,
        s: &str,
        to: &Dest<'_>,
        noted: &mut Injected,
    ) -> Result<Option<String>, CredentialError> {
        if !s.contains(MARKER) {
            return Ok(None);
        }
        let mut out = String::with_capacity(s.len());
        let mut rest = s;
        while let Some(at) = rest.find(MARKER) {
            out.push_str(&rest[..at]);
            let after = &rest[at + MARKER.len()..];
            let len = after.bytes().take_while(|b| is_key_byte(*b)).count();
            let body = &after[..len];
            let key = self
                .key_of(body)
                .filter(|k| !k.is_empty())
                .ok_or_else(|| CredentialError::Unresolvable(body.to_string()))?;
            let secret = self
                .secrets
                .get(key)
                .ok_or_else(|| CredentialError::Unresolvable(key.to_string()))?;
            if !self.bindings_of(key, secret).any(|b| b.matches(to)) {
                return Err(CredentialError::NotBound {
                    key: key.to_string(),
                    dest: format!("{}:{}", to.host, to.port),
                });
            }
            out.push_str(secret.value());
            noted.note(secret.value(), &rest[at..at + MARKER.len() + len]);
            rest = &after[len..];
        }
        out.push_str(rest);
        Ok(Some(out))
    }

    /// Rewrite one header value: placeholders anywhere in it (the whole value, or after a
    /// scheme such as `Bearer`), and inside `Basic <base64>` whose decoded `user:pass` holds
    /// one.
    pub fn rewrite_header(
        &self,
        value: &str,
        host: &str,
        port: u16,
    ) -> Result<Option<String>, CredentialError> {
        let host = host.to_ascii_lowercase();
        self.rewrite_header_to(
            value,
            &Dest {
                host: &host,
                port,
                path: None,
            },
        )
    }

    /// [`Credentials::rewrite_header`] for a request whose canonical path is known.
    pub fn rewrite_header_to(
        &self,
        value: &str,
        to: &Dest<'_>,
    ) -> Result<Option<String>, CredentialError> {
        self.rewrite_header_noting(value, to, &mut Injected::default())
    }

    /// [`Credentials::rewrite_header_to`], noting what was put in (for `Basic`, the encoded
    /// pair too: an upstream repeating the header repeats it encoded).
    pub fn rewrite_header_noting(
        &self,
        value: &str,
        to: &Dest<'_>,
        noted: &mut Injected,
    ) -> Result<Option<String>, CredentialError> {
        if let Some(b64) = value
            .strip_prefix("Basic ")
            .or_else(|| value.strip_prefix("basic "))
        {
            let std = base64::engine::general_purpose::STANDARD;
            if let Ok(raw) = std.decode(b64.trim())
                && let Ok(text) = String::from_utf8(raw)
                && let Some(new) = self.rewrite_noting(&text, to, noted)?
            {
                let encoded = std.encode(new);
                noted.note(&encoded, b64.trim());
                return Ok(Some(format!("Basic {encoded}")));
            }
        }
        self.rewrite_noting(value, to, noted)
    }
}

/// The values a request carried out, each with the placeholder (as the client wrote it) it
/// replaced: what the response is searched for on its way back.
#[derive(Default, Clone)]
pub struct Injected(Vec<(Vec<u8>, Vec<u8>)>);

impl std::fmt::Debug for Injected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the values.
        write!(f, "Injected({})", self.0.len())
    }
}

impl Injected {
    fn note(&mut self, value: &str, placeholder: &str) {
        if value.is_empty() || self.0.iter().any(|(v, _)| v == value.as_bytes()) {
            return;
        }
        self.0
            .push((value.as_bytes().to_vec(), placeholder.as_bytes().to_vec()));
        // Longest first: a value that holds another is replaced whole.
        self.0.sort_by_key(|(v, _)| std::cmp::Reverse(v.len()));
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The longest value's length.
    pub fn longest(&self) -> usize {
        self.0.first().map_or(0, |(v, _)| v.len())
    }

    /// Replace every value in `data[..upto]` (a value may run past `upto` if it starts before)
    /// by its placeholder; returns the output and where it stopped in `data`.
    pub fn redact_prefix(&self, data: &[u8], upto: usize) -> (Vec<u8>, usize) {
        let mut out = Vec::with_capacity(data.len());
        let mut i = 0;
        'outer: while i < upto {
            for (v, p) in &self.0 {
                if data[i..].starts_with(v) {
                    out.extend_from_slice(p);
                    i += v.len();
                    continue 'outer;
                }
            }
            out.push(data[i]);
            i += 1;
        }
        (out, i)
    }

    /// Every value in `s` replaced by its placeholder.
    pub fn redact(&self, s: &[u8]) -> Vec<u8> {
        self.redact_prefix(s, s.len()).0
    }
}

/// What a policy's endpoints bind: (provider, where) for every port of every endpoint with
/// `credential_binding: {provider: NAME}`.
pub fn policy_bindings(rules: &NetworkRules) -> Vec<(String, Binding)> {
    let mut out = Vec::new();
    for rule in rules.rules() {
        for e in &rule.endpoints {
            let (Some(provider), Some(host)) = (&e.credential_provider, &e.host) else {
                continue;
            };
            let host = match host {
                HostPattern::Exact(h) => h.clone(),
                HostPattern::Glob(g) => g.as_str().to_string(),
            };
            for port in &e.ports {
                out.push((
                    provider.clone(),
                    Binding {
                        host: host.clone(),
                        port: *port,
                        path: e.path.clone(),
                    },
                ));
            }
        }
    }
    out
}

/// Whether `s`, once percent-decoded, holds the marker in any case: a placeholder written
/// `openshell%3Aresolve%3Aenv%3AKEY` is not replaced, and must not leave either.
pub fn has_encoded_marker(s: &str) -> bool {
    if !s.contains('%') {
        return false;
    }
    let b = s.as_bytes();
    let mut decoded = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            decoded.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        decoded.push(b[i].to_ascii_lowercase());
        i += 1;
    }
    let lower: Vec<u8> = decoded.iter().map(u8::to_ascii_lowercase).collect();
    has_marker(&lower)
}

/// The placeholders in `s` shown as `[CREDENTIAL]`, for logs.
pub fn redact(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find(MARKER) {
        out.push_str(&rest[..at]);
        out.push_str("[CREDENTIAL]");
        let after = &rest[at + MARKER.len()..];
        let len = after.bytes().take_while(|b| is_key_byte(*b)).count();
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_binds_endpointless_values_of_its_provider_and_never_widens_a_profile() {
        let mut c = Credentials::new(1, "");
        c.insert("FREE", "free-v".into(), Vec::new());
        c.set_identity("FREE", "prov");
        c.insert(
            "PINNED",
            "pinned-v".into(),
            vec![Binding::new("a.test", 443)],
        );
        c.set_identity("PINNED", "prov");
        c.insert("OTHER", "other-v".into(), Vec::new());
        let bound = c.with_policy_bindings(vec![
            ("prov".into(), Binding::new("b.test", 443)),
            ("OTHER".into(), Binding::new("c.test", 8443)),
        ]);
        let put = |k: &str, host: &str, port| {
            bound
                .rewrite(&format!("{MARKER}{k}"), host, port)
                .map(|s| s.unwrap())
        };
        assert_eq!(put("FREE", "b.test", 443).unwrap(), "free-v");
        assert_eq!(put("OTHER", "c.test", 8443).unwrap(), "other-v");
        assert_eq!(put("PINNED", "a.test", 443).unwrap(), "pinned-v");
        for (k, host, port) in [("PINNED", "b.test", 443), ("FREE", "c.test", 8443)] {
            assert!(
                matches!(put(k, host, port), Err(CredentialError::NotBound { .. })),
                "{k} -> {host}:{port}"
            );
        }
        assert!(bound.is_credentialed("b.test", 443) && !c.is_credentialed("b.test", 443));
        // The store it was made from is unchanged, and shares the values.
        assert!(c.rewrite(&format!("{MARKER}FREE"), "b.test", 443).is_err());
        assert!(bound.holds_value("free-v") && c.holds_value("free-v"));
        let d = bound.describe();
        assert_eq!(d[0].0, "FREE");
        assert_eq!(d[0].1, [Binding::new("b.test", 443)]);
    }
}
