//! The bearer token in memory: the store every channel reads, the interceptor
//! that puts it on every call, and when it is due for renewal. No I/O here: obtaining and
//! renewing it is `auth`. Token files are never rewritten.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use tonic::metadata::MetadataValue;
use tonic::{Request, Status};

use super::config::TokenSource;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot read the token file {path} ({var}): {source}")]
    Read {
        var: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the token file {path} ({var}) is empty")]
    Empty { var: &'static str, path: PathBuf },
    #[error(
        "IssueSandboxToken (exchanging the service-account token from {path}) failed: {status}"
    )]
    Issue { path: PathBuf, status: Status },
    #[error("IssueSandboxToken returned an empty token")]
    EmptyIssued,
    #[error("the token contains characters that cannot go in an HTTP header")]
    NotAHeader,
}

/// The process-wide token, shared by every channel.
#[derive(Debug)]
pub struct TokenStore {
    pub source: TokenSource,
    token: RwLock<Option<String>>,
}

impl TokenStore {
    pub fn new(source: TokenSource) -> Arc<Self> {
        Arc::new(TokenStore {
            source,
            token: RwLock::new(None),
        })
    }

    pub fn get(&self) -> Option<String> {
        self.token.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set(&self, token: String) {
        *self.token.write().unwrap_or_else(|p| p.into_inner()) = Some(token);
    }

    /// Forget the token so the next session obtains a fresh one.
    pub fn reset(&self) {
        *self.token.write().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Whether a bearer is expected at all (false in v0.0.36 mode).
    pub fn has_source(&self) -> bool {
        self.source != TokenSource::None
    }
}

/// Adds `authorization: Bearer <token>` to every call when there is a token.
#[derive(Clone)]
pub struct Bearer {
    tokens: Arc<TokenStore>,
}

impl Bearer {
    pub fn new(tokens: Arc<TokenStore>) -> Self {
        Bearer { tokens }
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(t) = self.tokens.get() {
            let v = bearer_value(&t).map_err(|e| Status::unauthenticated(e.to_string()))?;
            req.metadata_mut().insert("authorization", v);
        }
        Ok(req)
    }
}

pub fn bearer_value(token: &str) -> Result<MetadataValue<tonic::metadata::Ascii>, TokenError> {
    let mut v =
        MetadataValue::try_from(format!("Bearer {token}")).map_err(|_| TokenError::NotAHeader)?;
    // Sensitive values are left out of Debug output and HPACK-encoded as never-indexed, so no
    // log line or intermediary's header table keeps the token.
    v.set_sensitive(true);
    Ok(v)
}
/// The `exp` claim of a JWT, read without verifying the signature (only to schedule renewal).
/// `None` when the token is not a JWT or has no `exp`; `Some(0)` means it never expires.
pub fn jwt_exp(token: &str) -> Option<u64> {
    let mut parts = token.split('.');
    let (_, payload, _) = (parts.next()?, parts.next()?, parts.next()?);
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    claims.get("exp")?.as_u64()
}

/// When to renew: 80 % of the remaining lifetime clamped to 1 s .. 12 h, plus a
/// jitter of (token length mod 10) %; 6 h when the token never expires or is not a JWT; 1 s when
/// it already has.
pub fn refresh_delay(token: &str, now: SystemTime) -> Duration {
    let now_s = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    match jwt_exp(token) {
        None | Some(0) => Duration::from_secs(6 * 3600),
        Some(exp) if exp <= now_s => Duration::from_secs(1),
        Some(exp) => {
            let remaining = Duration::from_secs(exp - now_s);
            let base = remaining
                .mul_f64(0.8)
                .clamp(Duration::from_secs(1), Duration::from_secs(12 * 3600));
            let jitter_pct = (token.len() % 10) as f64 / 100.0;
            base + base.mul_f64(jitter_pct)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: &str) -> String {
        let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        format!(
            "{}.{}.sig",
            e.encode(r#"{"alg":"EdDSA"}"#),
            e.encode(claims)
        )
    }

    #[test]
    fn exp_is_read_from_the_payload() {
        assert_eq!(jwt_exp(&jwt(r#"{"exp":123}"#)), Some(123));
        assert_eq!(jwt_exp("not-a-jwt"), None);
        assert_eq!(jwt_exp(&jwt(r#"{"sub":"x"}"#)), None);
    }

    #[test]
    fn renewal_is_due_at_80_percent_of_the_lifetime_clamped_with_jitter() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(refresh_delay("opaque", now), Duration::from_secs(6 * 3600));
        assert_eq!(
            refresh_delay(&jwt(r#"{"exp":0}"#), now),
            Duration::from_secs(6 * 3600)
        );
        assert_eq!(
            refresh_delay(&jwt(r#"{"exp":5}"#), now),
            Duration::from_secs(1)
        );
        let t = jwt(r#"{"exp":1001000}"#);
        let jitter = (t.len() % 10) as f64 / 100.0;
        let want = Duration::from_secs(800).mul_f64(1.0 + jitter);
        assert_eq!(refresh_delay(&t, now), want);
        // A very long lifetime is capped at 12 h (+ jitter).
        let t = jwt(r#"{"exp":9000000000}"#);
        assert!(refresh_delay(&t, now) <= Duration::from_secs(12 * 3600).mul_f64(1.1));
    }
}
