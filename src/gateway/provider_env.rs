//! Provider environment for SSH children.
//!
//! The gateway's reply holds real secret values. OpenShell's own supervisor hands children
//! placeholders and swaps them for the real value in outbound HTTP, only towards the
//! endpoints a credential is bound to; we have no such proxy. So children get only the keys
//! the gateway lists as non-secret (`non_secret_environment_keys`), unless
//! `OPENSHELL_EXPOSE_PROVIDER_SECRETS=1` asks for every value, as plain text, visible to
//! every process in the sandbox (docs/gateway.md says what that exposes).

use std::sync::Arc;
use std::time::Duration;

use super::auth;
use super::channel;
use super::config::GatewayConfig;
use super::exec_service::ExecContext;
use super::tokens::{self, TokenStore};
use crate::proto::v1::GetSandboxProviderEnvironmentRequest;

/// The opt-in for real secret values.
pub const EXPOSE_SECRETS_ENV: &str = "OPENSHELL_EXPOSE_PROVIDER_SECRETS";

#[derive(Debug, thiserror::Error)]
pub enum ProviderEnvError {
    #[error(transparent)]
    Connect(#[from] channel::ConnectError),
    #[error(transparent)]
    Token(#[from] tokens::TokenError),
    #[error("GetSandboxProviderEnvironment: {0}")]
    Status(tonic::Status),
}

/// Which pairs of a reply children get: non-secret keys always, the rest only with
/// `expose_secrets`; never an OPENSHELL_* key (supervisor internals) or one execve refuses.
pub fn select(
    environment: std::collections::HashMap<String, String>,
    non_secret: &[String],
    expose_secrets: bool,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = environment
        .into_iter()
        .filter(|(k, _)| expose_secrets || non_secret.iter().any(|n| n == k))
        .filter(|(k, v)| {
            !k.starts_with("OPENSHELL_")
                && !k.is_empty()
                && !k.contains(['=', '\0'])
                && !v.contains('\0')
        })
        .collect();
    out.sort();
    out
}

/// Fetch once, retrying transient failures with a capped backoff; a gateway without the
/// method (v0.0.36: UNIMPLEMENTED) means no provider environment.
pub async fn fetch(cfg: GatewayConfig, tokens: Arc<TokenStore>, ctx: Arc<ExecContext>) {
    let expose = std::env::var(EXPOSE_SECRETS_ENV).as_deref() == Ok("1");
    if expose {
        tracing::warn!(
            "{EXPOSE_SECRETS_ENV}=1: provider secrets are passed to children as plain environment variables"
        );
    }
    // The session obtains the first token (a service-account exchange); exchanging a second
    // one here at the same time would be a wasted, and visible, extra IssueSandboxToken.
    while tokens.has_source() && tokens.get().is_none() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut delay = Duration::from_millis(200);
    loop {
        match fetch_once(&cfg, &tokens, expose).await {
            Ok(env) => {
                tracing::info!(keys = env.len(), "provider environment loaded");
                *ctx.provider_env.write().unwrap_or_else(|e| e.into_inner()) = env;
                return;
            }
            Err(ProviderEnvError::Status(s)) if s.code() == tonic::Code::Unimplemented => {
                tracing::info!(
                    "the gateway has no GetSandboxProviderEnvironment; no provider environment"
                );
                return;
            }
            Err(e) => {
                tracing::info!("fetching the provider environment: {e}; retrying in {delay:?}")
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(10));
    }
}

async fn fetch_once(
    cfg: &GatewayConfig,
    tokens: &Arc<TokenStore>,
    expose: bool,
) -> Result<Vec<(String, String)>, ProviderEnvError> {
    let ch = channel::connect(cfg).await?;
    auth::ensure_token(tokens, &ch).await?;
    let mut client = channel::client(ch, tokens);
    let r = client
        .get_sandbox_provider_environment(GetSandboxProviderEnvironmentRequest {
            sandbox_id: cfg.sandbox_id.clone(),
            // Without the opt-in we ask the gateway to leave static credential values out:
            // the fewer secrets that reach this process, the fewer can leak from it.
            supports_static_credential_bindings: expose,
        })
        .await
        .map_err(ProviderEnvError::Status)?
        .into_inner();
    Ok(select(
        r.environment,
        &r.non_secret_environment_keys,
        expose,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_non_secret_keys_without_the_opt_in() {
        let env: std::collections::HashMap<String, String> = [
            ("API_URL", "https://api"),
            ("API_KEY", "sekrit"),
            ("OPENSHELL_SANDBOX_TOKEN", "x"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let non_secret = vec!["API_URL".to_string(), "OPENSHELL_SANDBOX_TOKEN".to_string()];
        assert_eq!(
            select(env.clone(), &non_secret, false),
            vec![("API_URL".into(), "https://api".into())]
        );
        assert_eq!(
            select(env, &non_secret, true),
            vec![
                ("API_KEY".into(), "sekrit".into()),
                ("API_URL".into(), "https://api".into())
            ]
        );
    }
}
