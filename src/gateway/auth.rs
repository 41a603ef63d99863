//! The bearer token (sheet §3.2): where it comes from, how it is put on every call, and when it
//! is renewed. It lives in memory only; token files are never rewritten.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use tonic::metadata::MetadataValue;
use tonic::{Code, Request, Status};

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

fn bearer_value(token: &str) -> Result<MetadataValue<tonic::metadata::Ascii>, TokenError> {
    let mut v =
        MetadataValue::try_from(format!("Bearer {token}")).map_err(|_| TokenError::NotAHeader)?;
    // Sensitive values are left out of Debug output and HPACK-encoded as never-indexed, so no
    // log line or intermediary's header table keeps the token.
    v.set_sensitive(true);
    Ok(v)
}

fn read_token_file(path: &Path, var: &'static str) -> Result<String, TokenError> {
    let raw = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
        var,
        path: path.to_owned(),
        source,
    })?;
    let t = raw.trim();
    if t.is_empty() {
        return Err(TokenError::Empty {
            var,
            path: path.to_owned(),
        });
    }
    Ok(t.to_owned())
}

/// Obtain the first token if there is none yet. `channel` is the freshly built channel: the
/// service-account exchange happens on it, with the SA token as the bearer of that one call.
pub async fn ensure_token(
    tokens: &TokenStore,
    channel: &tonic::transport::Channel,
) -> Result<(), TokenError> {
    if tokens.get().is_some() {
        return Ok(());
    }
    match &tokens.source {
        TokenSource::None => Ok(()),
        TokenSource::Literal(t) => {
            tokens.set(t.clone());
            Ok(())
        }
        TokenSource::File(p) => {
            tokens.set(read_token_file(p, "OPENSHELL_SANDBOX_TOKEN_FILE")?);
            Ok(())
        }
        TokenSource::ServiceAccount(p) => {
            tokens.set(issue_from_service_account(p, channel).await?);
            Ok(())
        }
    }
}

async fn issue_from_service_account(
    path: &Path,
    channel: &tonic::transport::Channel,
) -> Result<String, TokenError> {
    let sa = read_token_file(path, "OPENSHELL_K8S_SA_TOKEN_FILE")?;
    let value = bearer_value(&sa)?;
    let mut client = crate::proto::v1::open_shell_client::OpenShellClient::new(channel.clone());
    let mut req = Request::new(crate::proto::v1::IssueSandboxTokenRequest {});
    req.metadata_mut().insert("authorization", value);
    let resp = client
        .issue_sandbox_token(req)
        .await
        .map_err(|status| TokenError::Issue {
            path: path.to_owned(),
            status,
        })?
        .into_inner();
    if resp.token.trim().is_empty() {
        return Err(TokenError::EmptyIssued);
    }
    tracing::info!("exchanged the service-account token for a gateway token");
    Ok(resp.token.trim().to_owned())
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

/// When to renew (sheet §3.2): 80 % of the remaining lifetime clamped to 1 s .. 12 h, plus a
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

/// Renew the token for as long as the process lives. Uses the session's current channel when
/// there is one, else builds one.
pub async fn refresh_loop(tokens: Arc<TokenStore>, channels: Arc<super::session::ChannelSlot>) {
    if !tokens.has_source() {
        return;
    }
    loop {
        let Some(token) = tokens.get() else {
            // The session has not obtained a first token yet.
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        tokio::time::sleep(refresh_delay(&token, SystemTime::now())).await;
        if tokens.get().as_deref() != Some(token.as_str()) {
            // Replaced meanwhile (a new exchange after UNAUTHENTICATED): time the new one.
            continue;
        }
        loop {
            match refresh_once(&tokens, &channels).await {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!("token refresh failed, retrying in 10 s: {e}");
                    tokio::time::sleep(Duration::from_secs(10)).await;
                }
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum RefreshError {
    #[error(transparent)]
    Connect(#[from] super::channel::ConnectError),
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error("RefreshSandboxToken: {0}")]
    Status(Status),
    #[error("RefreshSandboxToken returned an empty token")]
    Empty,
}

async fn refresh_once(
    tokens: &Arc<TokenStore>,
    channels: &super::session::ChannelSlot,
) -> Result<(), RefreshError> {
    let channel = channels.get_or_connect().await?;
    let mut client = super::channel::client(channel.clone(), tokens);
    let req = crate::proto::v1::RefreshSandboxTokenRequest {
        extension_service_names: Vec::new(),
    };
    match client.refresh_sandbox_token(req).await {
        Ok(resp) => {
            let t = resp.into_inner().token;
            if t.trim().is_empty() {
                return Err(RefreshError::Empty);
            }
            tokens.set(t.trim().to_owned());
            tracing::info!("refreshed the gateway token");
            Ok(())
        }
        Err(status) if status.code() == Code::Unauthenticated => {
            if let TokenSource::File(p) = &tokens.source {
                // The file may have been rotated since we read it (a Secret update, an
                // operator's fix): read it again; the same token again cannot help.
                let fresh = read_token_file(p, "OPENSHELL_SANDBOX_TOKEN_FILE")?;
                if tokens.get().as_deref() == Some(fresh.as_str()) {
                    tracing::error!(
                        "RefreshSandboxToken: {status}; the token in OPENSHELL_SANDBOX_TOKEN_FILE ({}) is no longer accepted; write a fresh one there",
                        p.display()
                    );
                    return Err(RefreshError::Status(status));
                }
                tracing::warn!(
                    "RefreshSandboxToken says the token is no longer valid; using the new token in {}",
                    p.display()
                );
                tokens.set(fresh);
                Ok(())
            } else if let TokenSource::ServiceAccount(p) = &tokens.source {
                tracing::warn!(
                    "RefreshSandboxToken says the token is no longer valid; re-exchanging the service-account token"
                );
                let t = issue_from_service_account(p, &channel).await?;
                tokens.set(t);
                Ok(())
            } else {
                tracing::error!(
                    "RefreshSandboxToken: {status}; the token from OPENSHELL_SANDBOX_TOKEN cannot be renewed, restart with a fresh one"
                );
                Err(RefreshError::Status(status))
            }
        }
        Err(status) => Err(RefreshError::Status(status)),
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
    fn schedule_follows_the_sheet() {
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
