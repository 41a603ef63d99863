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

use base64::Engine;

/// What every placeholder starts with.
pub const MARKER: &str = "openshell:resolve:env:";

/// Where one credential may go: a host (exact, case-insensitive) and a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub host: String,
    pub port: u16,
}

struct Secret {
    value: String,
    bound: Vec<Binding>,
}

/// The real values, held by the proxy only.
#[derive(Default)]
pub struct Credentials {
    secrets: BTreeMap<String, Secret>,
    revision: u64,
    handle: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the values.
        f.debug_struct("Credentials")
            .field("keys", &self.secrets.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
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
        }
    }

    /// Add `key` with its real value and the endpoints it may go to.
    pub fn insert(&mut self, key: &str, value: String, bound: Vec<Binding>) {
        let bound = bound
            .into_iter()
            .map(|b| Binding {
                host: b.host.to_ascii_lowercase(),
                port: b.port,
            })
            .collect();
        self.secrets
            .insert(key.to_string(), Secret { value, bound });
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
        self.secrets
            .values()
            .any(|s| s.bound.iter().any(|b| b.host == host && b.port == port))
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
            return (!self.handle.is_empty() && rest[..64].eq_ignore_ascii_case(&self.handle))
                .then(|| &rest[65..]);
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
        if !s.contains(MARKER) {
            return Ok(None);
        }
        let host = host.to_ascii_lowercase();
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
            if !secret
                .bound
                .iter()
                .any(|b| b.host == host && b.port == port)
            {
                return Err(CredentialError::NotBound {
                    key: key.to_string(),
                    dest: format!("{host}:{port}"),
                });
            }
            out.push_str(&secret.value);
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
        if let Some(b64) = value
            .strip_prefix("Basic ")
            .or_else(|| value.strip_prefix("basic "))
        {
            let std = base64::engine::general_purpose::STANDARD;
            if let Ok(raw) = std.decode(b64.trim())
                && let Ok(text) = String::from_utf8(raw)
                && let Some(new) = self.rewrite(&text, host, port)?
            {
                return Ok(Some(format!("Basic {}", std.encode(new))));
            }
        }
        self.rewrite(value, host, port)
    }
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
