//! Obtaining and renewing the bearer token: the first token from its source, the
//! service-account exchange, and the refresh loop. The token itself lives in `tokens`.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tonic::{Code, Request, Status};

use super::channel::ChannelSlot;
use super::config::TokenSource;
use super::tokens::{TokenError, TokenStore, bearer_value, refresh_delay};

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

/// Renew the token for as long as the process lives. Uses the session's current channel when
/// there is one, else builds one.
pub async fn refresh_loop(tokens: Arc<TokenStore>, channels: Arc<ChannelSlot>) {
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
    channels: &ChannelSlot,
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
