//! Provider environment: `GetSandboxProviderEnvironment`, fetched at start-up (before the
//! main process starts) and again whenever the gateway's `provider_env_revision` or the
//! policy revision changes.
//!
//! The gateway's reply holds real secret values. They stay in the supervisor, in the egress
//! proxy's credential store, each bound to the endpoints the reply's static credential
//! bindings name (the provider profile's endpoints; for a profile without any, the current
//! policy revision's endpoints whose `credential_binding` names its provider, see
//! [`ServeEgress::set_policy_bindings`]): children get OpenShell's placeholder
//! `openshell:resolve:env:KEY`, which the proxy replaces only in requests it admitted to a
//! bound endpoint. Keys the
//! gateway lists as non-secret (`non_secret_environment_keys`) reach children as values.
//! `OPENSHELL_EXPOSE_PROVIDER_SECRETS=1` asks for every value as plain text in every child
//! instead (docs/gateway.md says what that exposes).

use std::sync::Arc;
use std::time::Duration;

use super::auth;
use super::channel;
use super::config::GatewayConfig;
use super::egress::ServeEgress;
use super::exec_service::ExecContext;
use super::tokens::{self, TokenStore};
use crate::egress::credentials::{Binding, Credentials, MARKER};
use crate::proto::v1::{
    GetSandboxProviderEnvironmentRequest, GetSandboxProviderEnvironmentResponse,
};

/// The opt-in for real secret values.
pub const EXPOSE_SECRETS_ENV: &str = "OPENSHELL_EXPOSE_PROVIDER_SECRETS";

/// How long the main process waits for the first provider environment.
pub const FIRST_FETCH_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ProviderEnvError {
    #[error(transparent)]
    Connect(#[from] channel::ConnectError),
    #[error(transparent)]
    Token(#[from] tokens::TokenError),
    #[error("GetSandboxProviderEnvironment: {0}")]
    Status(tonic::Status),
}

/// A key children may carry: never an OPENSHELL_* key (supervisor internals) or one execve
/// refuses.
fn usable(k: &str, v: &str) -> bool {
    !k.starts_with("OPENSHELL_") && !k.is_empty() && !k.contains(['=', '\0']) && !v.contains('\0')
}

/// What one reply becomes: the children's pairs (non-secret values, and placeholders for the
/// secrets, or the secrets themselves with `expose_secrets`) and the proxy's store.
pub fn apply(
    r: GetSandboxProviderEnvironmentResponse,
    expose_secrets: bool,
) -> (Vec<(String, String)>, Credentials) {
    let mut creds = Credentials::new(r.provider_env_revision, "");
    let mut env = Vec::new();
    for (k, v) in r.environment {
        if !usable(&k, &v) {
            continue;
        }
        if r.non_secret_environment_keys.contains(&k) || expose_secrets {
            env.push((k, v));
            continue;
        }
        let binding = r.static_credential_bindings.get(&k);
        let bound: Vec<Binding> = binding
            .map(|b| {
                b.endpoints
                    .iter()
                    .filter_map(|e| {
                        let port = u16::try_from(e.port).ok().filter(|p| *p != 0)?;
                        (!e.host.is_empty()).then(|| Binding {
                            host: e.host.clone(),
                            port,
                            path: e.path.clone(),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        if bound.is_empty() {
            tracing::warn!(
                key = %k,
                "provider credential bound to no endpoint by its provider profile: its placeholder resolves only where a policy endpoint's credential_binding names its provider"
            );
        }
        creds.insert(&k, v, bound);
        if let Some(b) = binding {
            creds.set_handle(&k, &b.workload_credential_handle);
            creds.set_identity(&k, &b.credential_identity);
        }
        env.push((k.clone(), format!("{MARKER}{k}")));
    }
    env.sort();
    (env, creds)
}

async fn fetch_once(
    cfg: &GatewayConfig,
    tokens: &Arc<TokenStore>,
) -> Result<GetSandboxProviderEnvironmentResponse, ProviderEnvError> {
    let ch = channel::connect(cfg).await?;
    auth::ensure_token(tokens, &ch).await?;
    let mut client = channel::client(ch, tokens);
    Ok(client
        .get_sandbox_provider_environment(GetSandboxProviderEnvironmentRequest {
            sandbox_id: cfg.sandbox_id.clone(),
            // The values stay in this process (the proxy's store): we can take the static
            // credentials and their bindings, as OpenShell's supervisor does.
            supports_static_credential_bindings: true,
        })
        .await
        .map_err(ProviderEnvError::Status)?
        .into_inner())
}

/// Fetch until it works (retrying transient failures with a capped backoff), then again at
/// each change [`ServeEgress::provider_changed`] announces. The first success is signalled on
/// `first`. A gateway without the method (v0.0.36: UNIMPLEMENTED) means no provider
/// environment. A refresh that fails revokes the credentials until one succeeds, as
/// OpenShell does.
pub async fn fetch(
    cfg: GatewayConfig,
    tokens: Arc<TokenStore>,
    ctx: Arc<ExecContext>,
    egress: Arc<ServeEgress>,
    first: tokio::sync::oneshot::Sender<()>,
) {
    let expose = std::env::var(EXPOSE_SECRETS_ENV).as_deref() == Ok("1");
    if expose {
        tracing::warn!(
            "{EXPOSE_SECRETS_ENV}=1: provider secrets are passed to children as plain environment variables"
        );
    }
    let mut first = Some(first);
    let mut loaded = false;
    loop {
        let mut delay = Duration::from_millis(200);
        loop {
            match fetch_once(&cfg, &tokens).await {
                Ok(r) => {
                    let (env, creds) = apply(r, expose);
                    tracing::info!(
                        keys = env.len(),
                        credentials = creds.describe().len(),
                        "provider environment loaded"
                    );
                    egress.set_provider_credentials(creds);
                    *ctx.provider_env.write().unwrap_or_else(|e| e.into_inner()) = env;
                    loaded = true;
                    break;
                }
                Err(ProviderEnvError::Status(s)) if s.code() == tonic::Code::Unimplemented => {
                    tracing::info!(
                        "the gateway has no GetSandboxProviderEnvironment; no provider environment"
                    );
                    if let Some(f) = first.take() {
                        let _ = f.send(());
                    }
                    return;
                }
                Err(e) => {
                    if loaded {
                        tracing::warn!(
                            "refreshing the provider environment: {e}; its credentials are revoked until a fetch succeeds"
                        );
                        egress.set_provider_credentials(Credentials::default());
                        loaded = false;
                    }
                    tracing::info!("fetching the provider environment: {e}; retrying in {delay:?}");
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(10));
        }
        if let Some(f) = first.take() {
            let _ = f.send(());
        }
        egress.provider_changed_wait().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::v1::{StaticCredentialBinding, StaticCredentialEndpointBinding};

    fn reply() -> GetSandboxProviderEnvironmentResponse {
        let env: std::collections::HashMap<String, String> = [
            ("API_URL", "https://api"),
            ("API_KEY", "sekrit"),
            ("OPENSHELL_SANDBOX_TOKEN", "x"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        GetSandboxProviderEnvironmentResponse {
            environment: env,
            provider_env_revision: 4,
            non_secret_environment_keys: vec!["API_URL".into(), "OPENSHELL_SANDBOX_TOKEN".into()],
            static_credential_bindings: [(
                "API_KEY".to_string(),
                StaticCredentialBinding {
                    endpoints: vec![StaticCredentialEndpointBinding {
                        host: "api.test".into(),
                        port: 443,
                        path: String::new(),
                    }],
                    credential_identity: "p".into(),
                    workload_credential_handle: String::new(),
                },
            )]
            .into_iter()
            .collect(),
        }
    }

    #[test]
    fn secrets_become_placeholders_bound_as_the_gateway_says() {
        let (env, creds) = apply(reply(), false);
        assert_eq!(
            env,
            vec![
                ("API_KEY".into(), "openshell:resolve:env:API_KEY".into()),
                ("API_URL".into(), "https://api".into())
            ]
        );
        assert!(creds.holds_value("sekrit"));
        assert_eq!(
            creds
                .rewrite("Bearer openshell:resolve:env:API_KEY", "api.test", 443)
                .unwrap()
                .as_deref(),
            Some("Bearer sekrit")
        );
        assert!(
            creds
                .rewrite("openshell:resolve:env:API_KEY", "x.test", 443)
                .is_err()
        );
        // The revision form of this reply's revision resolves too.
        assert!(
            creds
                .rewrite("openshell:resolve:env:v4_API_KEY", "api.test", 443)
                .is_ok()
        );
        let (env, _) = apply(reply(), true);
        assert!(env.contains(&("API_KEY".into(), "sekrit".into())));
    }
}
