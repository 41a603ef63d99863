//! What each failure means and how to fix it: the rustls, TLS-file, token and gRPC errors of
//! `check --gateway`'s steps, each turned into a named cause and its fix.

use std::path::Path;

use base64::Engine;
use tonic::Code;

use super::step::Step;
use crate::gateway::config::{GatewayConfig, TokenSource};
use crate::gateway::tls::TlsError;
use crate::gateway::tokens::TokenError;

pub(super) fn tls_file_failure(e: TlsError) -> Step {
    let secret = "the client TLS Secret (openshell-client-tls: ca.crt, tls.crt, tls.key) must be in the sandbox namespace and mounted at /etc/openshell-tls/client: `kubectl -n NAMESPACE get secret openshell-client-tls`; rerun the cert Job to reissue it";
    let kind = match &e {
        TlsError::Read { .. } => "unreadable-file",
        TlsError::Empty { .. } => "not-pem",
        TlsError::BadCa { .. } => "bad-ca-file",
        TlsError::BadCert { .. } => "bad-client-cert",
        TlsError::CertNotValidNow { when, .. } if when.contains("expired") => "client-cert-expired",
        TlsError::CertNotValidNow { .. } => "client-cert-not-yet-valid",
        TlsError::CertKey { .. } => "cert-key-mismatch",
        TlsError::ServerName(_) => "bad-server-name",
    };
    let fix = match kind {
        "client-cert-expired" => format!("the client certificate must be reissued: {secret}"),
        "client-cert-not-yet-valid" => {
            "this node's clock is behind the certificate's start: fix the clock (NTP), or reissue the certificate".to_owned()
        }
        "cert-key-mismatch" => format!("tls.crt and tls.key must be one pair: {secret}"),
        "bad-server-name" => {
            "set OPENSHELL_GATEWAY_TLS_SERVER_NAME to a name in the gateway certificate".to_owned()
        }
        _ => secret.to_owned(),
    };
    Step::failed("tls", kind, e.to_string(), fix)
}

/// Name a failed handshake by the rustls error inside the I/O error.
pub(super) fn handshake_failure(e: &std::io::Error, name: &str, ca: &Path) -> Step {
    use rustls::CertificateError as C;
    let inner = e
        .get_ref()
        .and_then(|i| i.downcast_ref::<rustls::Error>())
        .cloned();
    match inner {
        Some(rustls::Error::InvalidCertificate(c)) => match c {
            C::UnknownIssuer | C::BadSignature => Step::failed(
                "tls",
                "wrong-ca",
                format!(
                    "the gateway's certificate is not signed by the CA in {} (OPENSHELL_TLS_CA): {c:?}",
                    ca.display()
                ),
                "ca.crt of the client Secret must be the CA that signed the gateway's server certificate: copy the Secret again from the gateway's namespace, or rerun the cert Job so both are from one CA",
            ),
            C::NotValidForName | C::NotValidForNameContext { .. } => Step::failed(
                "tls",
                "wrong-server-name",
                format!("the gateway's certificate does not carry the name `{name}`: {c:?}"),
                "dial the Service by a name the certificate lists (the cert Job's SANs), or set OPENSHELL_GATEWAY_TLS_SERVER_NAME to one of them",
            ),
            C::Expired | C::ExpiredContext { .. } => Step::failed(
                "tls",
                "server-cert-expired",
                format!("the gateway's certificate has expired: {c:?}"),
                "reissue the gateway's server certificate (rerun the cert Job) and restart the gateway",
            ),
            C::NotValidYet | C::NotValidYetContext { .. } => Step::failed(
                "tls",
                "server-cert-not-yet-valid",
                format!("the gateway's certificate is not valid yet: {c:?}"),
                "this node's clock is behind: fix the clock (NTP)",
            ),
            other => Step::failed(
                "tls",
                "server-cert-invalid",
                format!("the gateway's certificate was refused: {other:?}"),
                "reissue the gateway's server certificate with the cert Job",
            ),
        },
        Some(rustls::Error::AlertReceived(alert)) => client_cert_refused(
            &format!("the gateway sent the TLS alert {alert:?}"),
            Path::new(""),
        ),
        Some(other) => Step::failed(
            "tls",
            "tls-failed",
            format!("TLS handshake with `{name}` failed: {other}"),
            "if the gateway runs without TLS, use an http:// endpoint",
        ),
        None => Step::failed(
            "tls",
            "tls-failed",
            format!("TLS handshake with `{name}` failed: {e}"),
            "the peer closed or does not speak TLS; if the gateway runs without TLS, use an http:// endpoint",
        ),
    }
}

pub(super) fn client_cert_refused(what: &str, cert: &Path) -> Step {
    let file = if cert.as_os_str().is_empty() {
        String::new()
    } else {
        format!(" ({})", cert.display())
    };
    Step::failed(
        "tls",
        "client-cert-refused",
        format!("{what}: it refused our client certificate{file}"),
        "tls.crt must be signed by the CA the gateway trusts for clients (its OPENSHELL_TLS_CLIENT_CA), with clientAuth usage, and be in date: rerun the cert Job and copy openshell-client-tls into the sandbox namespace",
    )
}

/// The `notAfter` of a DER certificate, for the ok line.
pub(super) fn not_after(der: &[u8]) -> Option<String> {
    let (_, c) = x509_parser::parse_x509_certificate(der).ok()?;
    Some(format!(
        "; the gateway's certificate is valid until {}",
        c.validity().not_after
    ))
}

pub(super) fn token_failure(e: TokenError, var: &'static str) -> Step {
    let (kind, fix) = match &e {
        TokenError::Read { .. } => (
            "token-file-unreadable",
            format!(
                "the file named by {var} must exist and be readable; for the service-account token, the pod needs the projected volume openshell-sa-token at /var/run/secrets/openshell (audience openshell-gateway)"
            ),
        ),
        TokenError::Empty { .. } => ("token-file-empty", format!("{var} must hold the token")),
        TokenError::Issue { status, .. } => (
            "token-exchange-failed",
            match status.code() {
                Code::Unauthenticated | Code::PermissionDenied => "the gateway refused the service-account token: it needs audience openshell-gateway, a pod annotated openshell.io/sandbox-id and owned by a Sandbox labelled openshell.ai/sandbox-id, and the gateway's RBAC for TokenReview".to_owned(),
                Code::Unavailable => "the gateway issues tokens only with a JWT issuer configured and when it runs in-cluster (KUBERNETES_SERVICE_HOST)".to_owned(),
                Code::NotFound => "the gateway does not know this sandbox: it may have been deleted".to_owned(),
                _ => "look at the gateway's log for IssueSandboxToken".to_owned(),
            },
        ),
        TokenError::EmptyIssued => (
            "token-exchange-empty",
            "the gateway answered IssueSandboxToken with an empty token: look at its log".to_owned(),
        ),
        TokenError::NotAHeader => (
            "token-not-header",
            format!("{var} must hold only the JWT"),
        ),
    };
    Step::failed("token", kind, e.to_string(), fix)
}

/// Name a gRPC failure of `Health` or `GetSandboxConfig`.
pub(super) fn status_failure(
    step: &'static str,
    method: &str,
    s: &tonic::Status,
    cfg: &GatewayConfig,
) -> Step {
    let detail = format!("{method}: {:?}: {}", s.code(), s.message());
    let no_token = cfg.token == TokenSource::None;
    match s.code() {
        Code::Unauthenticated if no_token => Step::failed(
            step,
            "no-token",
            format!(
                "{detail}: this gateway wants a bearer token and none is configured; ConnectSupervisor is refused the same way, so the sandbox never becomes READY"
            ),
            "mount the projected service-account token and set OPENSHELL_K8S_SA_TOKEN_FILE=/var/run/secrets/openshell/token (the gateway's driver does this), or OPENSHELL_SANDBOX_TOKEN_FILE",
        ),
        Code::Unauthenticated => Step::failed(
            step,
            "token-rejected",
            format!(
                "{detail}: the gateway does not accept the token (another gateway's key, expired, or not a gateway JWT); ConnectSupervisor is refused the same way"
            ),
            format!(
                "give the token of this gateway: {}",
                match cfg.token {
                    TokenSource::ServiceAccount(_) =>
                        "the exchange succeeded, so check that the gateway's signing key did not change between replicas",
                    _ => "prefer OPENSHELL_K8S_SA_TOKEN_FILE, which is exchanged at every start",
                }
            ),
        ),
        Code::PermissionDenied => Step::failed(
            step,
            "permission-denied",
            format!(
                "{detail}: the gateway knows the caller but not as sandbox {}: ConnectSupervisor is refused with PERMISSION_DENIED",
                cfg.sandbox_id
            ),
            "the token must be a sandbox token for OPENSHELL_SANDBOX_ID (not a user's token): use the service-account exchange (OPENSHELL_K8S_SA_TOKEN_FILE)",
        ),
        Code::NotFound => Step::failed(
            step,
            "sandbox-not-found",
            format!("{detail}: the gateway has no sandbox {}", cfg.sandbox_id),
            "OPENSHELL_SANDBOX_ID must be the UUID of an existing sandbox: `kubectl -n NAMESPACE get sandboxes`; a deleted sandbox's pod cannot come back",
        ),
        Code::Unimplemented => Step::failed(
            step,
            "not-implemented",
            format!("{detail}: the server does not implement it"),
            "the endpoint is not an OpenShell gateway of a supported version (v0.0.36 or v0.0.111)",
        ),
        Code::Unavailable => Step::failed(
            step,
            "unavailable",
            detail,
            "the connection broke or the gateway is shutting down: rerun; if it persists, read the gateway's log",
        ),
        _ => Step::failed(
            step,
            "call-failed",
            detail,
            "read the gateway's log for this call",
        ),
    }
}

/// The claims of a JWT, read without checking the signature (only the gateway can).
pub(super) fn jwt_claims(token: &str) -> Option<serde_json::Map<String, serde_json::Value>> {
    let mut parts = token.split('.');
    let (_, payload, _) = (parts.next()?, parts.next()?, parts.next()?);
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    match serde_json::from_slice(&bytes).ok()? {
        serde_json::Value::Object(m) => Some(m),
        _ => None,
    }
}
